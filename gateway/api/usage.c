/* GET /admin/usage (every tenant's, with the admin key) and GET /v1/usage (the caller's own, with
 * its key): the ledger's totals as JSON, over a time range, grouped as asked. Costs are written
 * as exact decimals of the configuration's currency, not as binary floating point. */
#include "api_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void put_time(struct sl_str *b, int64_t t)
{
    char s[32];
    sl_usage_time_format(t, s);
    sl_str_appendf(b, "\"%s\"", s);
}

static void put_money(struct sl_str *b, int64_t nano)
{
    char m[32];
    sl_usage_money_format(nano, m, sizeof m);
    sl_str_append(b, m, strlen(m));
}

static void put_name(struct sl_str *b, const char *key, const char *v)
{
    sl_str_appendf(b, "\"%s\":\"", key);
    sl_str_append_json(b, v, strlen(v));
    sl_str_append(b, "\",", 2);
}

/* The figures of u, after the row's names. */
static void put_usage(struct sl_str *b, const struct sl_usage *u)
{
    sl_str_appendf(b,
                   "\"requests\":%lld,\"prompt_tokens\":%lld,\"cached_tokens\":%lld,"
                   "\"completion_tokens\":%lld,\"total_tokens\":%lld,\"device_seconds\":%.9f,"
                   "\"cost\":",
                   (long long)u->requests, (long long)u->prompt_tokens, (long long)u->cached_tokens,
                   (long long)u->completion_tokens,
                   (long long)(u->prompt_tokens + u->completion_tokens),
                   (double)u->device_ns / 1e9);
    put_money(b, u->cost);
}

struct rows {
    struct sl_str *b;
    unsigned group;
    int n;
    struct sl_usage total;
};

static void put_row(void *arg, const struct sl_usage_key *k, const struct sl_usage *u)
{
    struct rows *r = arg;
    struct sl_str *b = r->b;
    if (r->n++)
        sl_str_append(b, ",", 1);
    sl_str_append(b, "{", 1);
    if (r->group & SL_USAGE_BY_TENANT)
        put_name(b, "tenant", k->tenant);
    if (r->group & SL_USAGE_BY_MODEL)
        put_name(b, "model", k->model);
    if (r->group & SL_USAGE_BY_TIER)
        put_name(b, "tier", k->tier);
    if (r->group & SL_USAGE_BY_HOUR) {
        sl_str_append(b, "\"hour\":", 7);
        put_time(b, k->hour);
        sl_str_append(b, ",", 1);
    }
    put_usage(b, u);
    sl_str_append(b, "}", 1);
    sl_usage_add(&r->total, u);
}

/* The query's parameter p as a time (or the default), or a 400 naming it. */
static bool time_param(struct api_exchange *a, const char *p, int64_t *out)
{
    char v[64];
    int r = sl_exchange_query_param(a->x, p, v, sizeof v);
    if (r == 0)
        return true;
    if (r > 0 && sl_usage_time_parse(v, out))
        return true;
    struct sl_openai_error err;
    sl_openai_error_set(&err, 400, p, "invalid_value",
                        "'%s' must be unix seconds, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ (UTC).", p);
    api_send_error(a, &err, NULL);
    return false;
}

/* The caller's budget: its period, what is spent (reservations in flight included) and left. */
static void put_budget(struct api_exchange *a, struct sl_str *b)
{
    const struct sl_tenant *t = a->tenant;
    struct sl_admit_budget_state bs;
    int64_t now = sl_clock_unix();
    if (!sl_admit_budget_now(sl_config_tenancy(a->cfg), t, now, &bs)) {
        sl_str_append(b, ",\"budget\":null", 14);
        return;
    }
    if (bs.spent < 0) { /* no request of this period here yet: the ledger's count */
        struct sl_usage u;
        sl_usage_ledger_sum(a->t->api->ledger, t->name, bs.start, bs.end, &u);
        bs.spent = u.cost;
    }
    bool total = t->budget_period == SL_USAGE_TOTAL;
    sl_str_append(b, ",\"budget\":{\"amount\":", 20);
    put_money(b, bs.amount);
    sl_str_appendf(b, ",\"period\":\"%s\",\"period_start\":",
                   sl_usage_period_name((enum sl_usage_period)t->budget_period));
    if (total)
        sl_str_append(b, "null", 4);
    else
        put_time(b, bs.start);
    sl_str_append(b, ",\"period_end\":", 14);
    if (total)
        sl_str_append(b, "null", 4);
    else
        put_time(b, bs.end);
    sl_str_append(b, ",\"spent\":", 9);
    put_money(b, bs.spent);
    sl_str_append(b, ",\"remaining\":", 13);
    put_money(b, bs.amount - bs.spent);
    sl_str_appendf(b, ",\"used\":%.6f,\"soft_pct\":%d}", (double)bs.spent / (double)bs.amount,
                   t->budget_soft_pct);
}

/* Serves the totals of tenant (NULL: all, grouped by tenant unless asked otherwise); own: the
 * caller's own, with its budget. */
static void serve_usage(struct api_exchange *a, const char *tenant)
{
    bool own = tenant != NULL;
    struct sl_openai_error err;
    int64_t from = INT64_MIN, to = INT64_MAX;
    if (!time_param(a, "from", &from) || !time_param(a, "to", &to))
        return;
    unsigned group = tenant ? SL_USAGE_BY_MODEL | SL_USAGE_BY_TIER
                            : SL_USAGE_BY_TENANT | SL_USAGE_BY_MODEL | SL_USAGE_BY_TIER;
    char g[64];
    int r = sl_exchange_query_param(a->x, "group_by", g, sizeof g);
    char bad[16];
    if (r < 0 || (r > 0 && !sl_usage_group_parse(g, &group, bad, sizeof bad))) {
        sl_openai_error_set(&err, 400, "group_by", "invalid_value",
                            "'group_by' is a comma-separated list of tenant, model, tier and "
                            "hour.");
        api_send_error(a, &err, NULL);
        return;
    }
    if (!tenant) {
        char t[SL_TENANT_NAME_MAX + 1];
        r = sl_exchange_query_param(a->x, "tenant", t, sizeof t);
        if (r < 0) {
            sl_openai_error_set(&err, 400, "tenant", "invalid_value",
                                "'tenant' is longer than a tenant's name can be.");
            api_send_error(a, &err, NULL);
            return;
        }
        tenant = r > 0 ? sl_arena_strndup(&a->x->arena, t, strlen(t)) : NULL;
    }
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    sl_str_append(b, "{\"object\":\"usage\",", 18);
    if (tenant)
        put_name(b, "tenant", tenant);
    put_name(b, "currency", sl_config_metering(a->cfg)->currency);
    sl_str_append(b, "\"from\":", 7);
    if (from == INT64_MIN)
        sl_str_append(b, "null", 4);
    else
        put_time(b, from);
    sl_str_append(b, ",\"to\":", 6);
    if (to == INT64_MAX)
        sl_str_append(b, "null", 4);
    else
        put_time(b, to);
    sl_str_append(b, ",\"group_by\":[", 13);
    int n = 0;
    for (int i = 0; i < 4; i++)
        if (group & 1u << i)
            sl_str_appendf(b, "%s\"%s\"", n++ ? "," : "", sl_usage_group_name(i));
    sl_str_append(b, "],\"data\":[", 10);
    struct rows rows = {.b = b, .group = group};
    sl_usage_ledger_query(a->t->api->ledger, tenant, from, to, group, put_row, &rows);
    sl_str_append(b, "],\"total\":{", 11);
    put_usage(b, &rows.total);
    sl_str_append(b, "}", 1);
    if (own)
        put_budget(a, b);
    sl_str_append(b, "}", 1);
    api_send_json(a, 200, b, NULL);
}

void api_serve_admin_usage(struct api_exchange *a)
{
    serve_usage(a, NULL);
}

void api_serve_own_usage(struct api_exchange *a)
{
    serve_usage(a, a->tenant ? a->tenant->name : sl_tenant_anonymous.name);
}
