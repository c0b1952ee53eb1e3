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

/* The figures of u, after the row's names. cache_hit_ratio is the share of the prompt tokens the
 * prefix cache gave: how much a tenant's traffic gains from it (0 without prompt tokens). */
static void put_usage(struct sl_str *b, const struct sl_usage *u)
{
    double ratio = u->prompt_tokens > 0 ? (double)u->cached_tokens / (double)u->prompt_tokens : 0;
    sl_str_appendf(b,
                   "\"requests\":%lld,\"prompt_tokens\":%lld,\"cached_tokens\":%lld,"
                   "\"cache_hit_ratio\":%.6f,\"completion_tokens\":%lld,\"total_tokens\":%lld,"
                   "\"device_seconds\":%.9f,\"cost\":",
                   (long long)u->requests, (long long)u->prompt_tokens, (long long)u->cached_tokens,
                   ratio, (long long)u->completion_tokens,
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

/* A usage query, read from the URL, in the exchange's arena (a fleet read's argument). */
struct usage_query {
    struct api_exchange *a;
    const char *tenant; /* NULL: every tenant */
    bool own;           /* the caller's own: with its budget */
    int64_t from, to;
    unsigned group;
    bool has_budget;
    struct sl_admit_budget_state bs;
};

/* The caller's budget: its period, what is spent and what is left. */
static void put_budget(struct usage_query *q, struct sl_str *b)
{
    const struct sl_tenant *t = q->a->tenant;
    const struct sl_admit_budget_state *bs = &q->bs;
    bool total = t->budget_period == SL_USAGE_TOTAL;
    sl_str_append(b, ",\"budget\":{\"amount\":", 20);
    put_money(b, bs->amount);
    sl_str_appendf(b, ",\"period\":\"%s\",\"period_start\":",
                   sl_usage_period_name((enum sl_usage_period)t->budget_period));
    if (total)
        sl_str_append(b, "null", 4);
    else
        put_time(b, bs->start);
    sl_str_append(b, ",\"period_end\":", 14);
    if (total)
        sl_str_append(b, "null", 4);
    else
        put_time(b, bs->end);
    sl_str_append(b, ",\"spent\":", 9);
    put_money(b, bs->spent);
    sl_str_append(b, ",\"remaining\":", 13);
    put_money(b, bs->amount - bs->spent);
    sl_str_appendf(b, ",\"used\":%.6f,\"soft_pct\":%d}", (double)bs->spent / (double)bs->amount,
                   t->budget_soft_pct);
}

/* The answer from ledger l, this replica's or the fleet's (scope). spent: what the budget's
 * holder says is spent in its period, reservations in flight included (-1: it does not know:
 * the ledger's sum over the period). */
static void render(struct usage_query *q, struct sl_usage_ledger *l, const char *scope,
                   int64_t spent)
{
    struct api_exchange *a = q->a;
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    sl_str_append(b, "{\"object\":\"usage\",", 18);
    if (q->tenant)
        put_name(b, "tenant", q->tenant);
    put_name(b, "currency", sl_config_metering(a->cfg)->currency);
    put_name(b, "scope", scope);
    sl_str_append(b, "\"from\":", 7);
    if (q->from == INT64_MIN)
        sl_str_append(b, "null", 4);
    else
        put_time(b, q->from);
    sl_str_append(b, ",\"to\":", 6);
    if (q->to == INT64_MAX)
        sl_str_append(b, "null", 4);
    else
        put_time(b, q->to);
    sl_str_append(b, ",\"group_by\":[", 13);
    int n = 0;
    for (int i = 0; i < 4; i++)
        if (q->group & 1u << i)
            sl_str_appendf(b, "%s\"%s\"", n++ ? "," : "", sl_usage_group_name(i));
    sl_str_append(b, "],\"data\":[", 10);
    struct rows rows = {.b = b, .group = q->group};
    sl_usage_ledger_query(l, q->tenant, q->from, q->to, q->group, put_row, &rows);
    sl_str_append(b, "],\"total\":{", 11);
    put_usage(b, &rows.total);
    sl_str_append(b, "}", 1);
    if (q->own && q->has_budget) {
        if (spent < 0) {
            struct sl_usage u;
            sl_usage_ledger_sum(l, q->tenant, q->bs.start, q->bs.end, &u);
            spent = u.cost;
        }
        q->bs.spent = spent;
        put_budget(q, b);
    } else if (q->own) {
        sl_str_append(b, ",\"budget\":null", 14);
    }
    sl_str_append(b, "}", 1);
    api_send_json(a, 200, b, NULL);
}

/* The fleet's ledger has been read, or could not be. */
static void on_fleet_usage(void *arg, enum sl_status st, struct sl_usage_ledger *l, int64_t spent,
                           const char *err)
{
    struct usage_query *q = arg;
    struct api_exchange *a = q->a;
    a->usage_call = NULL;
    if (st == SL_OK) {
        render(q, l, "fleet", spent);
        return;
    }
    sl_log(SL_LOG_WARN, "usage: the fleet's ledger was not read: %s", err);
    struct sl_openai_error e;
    sl_openai_error_set(&e, 503, NULL, "fleet_unavailable",
                        "The fleet's usage ledger in Redis could not be read (%s); retry, or ask "
                        "for scope=replica, this replica's own.",
                        err);
    api_send_error(a, &e, "Retry-After: 1\r\n");
}

/* Serves the totals of tenant (NULL: all, grouped by tenant unless asked otherwise); own: the
 * caller's own, with its budget. With a fleet, from the fleet's ledger in Redis unless the
 * query asks for scope=replica. */
static void serve_usage(struct api_exchange *a, const char *tenant)
{
    struct usage_query *q = sl_arena_calloc(&a->x->arena, 1, sizeof *q);
    q->a = a;
    q->own = tenant != NULL;
    q->from = INT64_MIN;
    q->to = INT64_MAX;
    struct sl_openai_error err;
    if (!time_param(a, "from", &q->from) || !time_param(a, "to", &q->to))
        return;
    q->group = tenant ? SL_USAGE_BY_MODEL | SL_USAGE_BY_TIER
                      : SL_USAGE_BY_TENANT | SL_USAGE_BY_MODEL | SL_USAGE_BY_TIER;
    char g[64];
    int r = sl_exchange_query_param(a->x, "group_by", g, sizeof g);
    char bad[16];
    if (r < 0 || (r > 0 && !sl_usage_group_parse(g, &q->group, bad, sizeof bad))) {
        sl_openai_error_set(&err, 400, "group_by", "invalid_value",
                            "'group_by' is a comma-separated list of tenant, model, tier and "
                            "hour.");
        api_send_error(a, &err, NULL);
        return;
    }
    bool fleet = a->t->fleet != NULL;
    r = sl_exchange_query_param(a->x, "scope", g, sizeof g);
    if (r != 0) {
        bool ok = r > 0 && (strcmp(g, "replica") == 0 || (fleet && strcmp(g, "fleet") == 0));
        if (!ok) {
            sl_openai_error_set(&err, 400, "scope", "invalid_value",
                                fleet ? "'scope' is fleet (the default: every replica's usage, "
                                        "from Redis) or replica (this one's)."
                                      : "'scope' is replica: this server has no fleet (no "
                                        "redis in its configuration).");
            api_send_error(a, &err, NULL);
            return;
        }
        fleet = strcmp(g, "fleet") == 0;
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
    q->tenant = tenant;
    if (q->own)
        q->has_budget =
            sl_admit_budget_now(sl_config_tenancy(a->cfg), a->tenant, sl_clock_unix(), &q->bs);
    if (!fleet) {
        render(q, a->t->api->ledger, "replica", q->bs.spent);
        return;
    }
    /* The fleet's: the hours asked for, and the budget's period (its spend where the ledger has
     * no budget key for it). */
    int64_t from = q->from, to = q->to;
    char key[SL_ADMIT_FLEET_KEY_MAX];
    if (q->has_budget) {
        from = from < q->bs.start ? from : q->bs.start;
        to = to > q->bs.end ? to : q->bs.end;
        sl_admit_fleet_budget_key(key, sizeof key, a->t->api->fleet_prefix, a->tenant->name,
                                  q->bs.start);
    }
    a->usage_call = sl_fleet_usage_read(a->t->fleet, a->t->api->fleet_prefix,
                                        q->has_budget ? key : NULL, from, to, on_fleet_usage, q);
}

void api_serve_admin_usage(struct api_exchange *a)
{
    serve_usage(a, NULL);
}

void api_serve_own_usage(struct api_exchange *a)
{
    serve_usage(a, a->tenant ? a->tenant->name : sl_tenant_anonymous.name);
}
