/* GET /admin/stats: one JSON document for the dashboard, built from the figures /metrics,
 * /admin/slo and /admin/usage already read (the SLO windows and admission counters of the metrics
 * registry, each scheduler's published statistics, admission's queue counts, the usage ledger and
 * the tenants' budgets), so that the page and the scrape never disagree about a number. Counters
 * stay counters: the page computes rates from two reads.
 */
#include "api_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOP_TENANTS 10

static void put_money(struct sl_str *b, int64_t nano)
{
    char m[32];
    sl_usage_money_format(nano, m, sizeof m);
    sl_str_append(b, m, strlen(m));
}

static void put_string(struct sl_str *b, const char *s)
{
    sl_str_append(b, "\"", 1);
    sl_str_append_json(b, s, strlen(s));
    sl_str_append(b, "\"", 1);
}

/* The scheduler figures of every model's replicas, read once for the whole answer. */
struct snapshot {
    struct sl_sched_stats st[SL_MODELS_MAX * SL_REPLICAS_MAX];
    int engine[SL_MODELS_MAX * SL_REPLICAS_MAX];
    int replica[SL_MODELS_MAX * SL_REPLICAS_MAX];
    int n;
};

static void snapshot_take(const struct sl_api *api, struct snapshot *s)
{
    s->n = 0;
    for (int i = 0; i < api->n_engines; i++)
        for (int r = 0; r < api->engines[i].n_replicas; r++) {
            if (!api->engines[i].sched[r])
                continue;
            sl_sched_stats(api->engines[i].sched[r], &s->st[s->n]);
            s->engine[s->n] = i;
            s->replica[s->n++] = r;
        }
}

static const struct sl_sched_tier_stats *sched_tier(const struct sl_sched_stats *st,
                                                    const char *name)
{
    int n = st->n_tiers < SL_SCHED_MAX_TIERS ? st->n_tiers : SL_SCHED_MAX_TIERS;
    for (int t = 0; t < n; t++)
        if (strcmp(st->tiers[t].name, name) == 0)
            return &st->tiers[t];
    return NULL;
}

/* Each tier of the configuration: its objectives, windows and decisions (the metrics registry's),
 * what admission holds queued for it, and what the schedulers run and queue of it. */
static void put_tiers(struct api_exchange *a, const struct snapshot *snap, uint64_t now_ns,
                      struct sl_str *b)
{
    const struct sl_api *api = a->t->api;
    const struct sl_tenancy *ten = sl_config_tenancy(a->cfg);
    sl_str_append(b, "\"tiers\":[", 9);
    for (int i = 0; i < ten->n_tiers; i++) {
        const struct sl_tier *tr = &ten->tiers[i];
        sl_str_appendf(b, "%s{\"tier\":", i ? "," : "");
        put_string(b, tr->sched.name);
        sl_str_append(b, ",", 1);
        sl_metrics_tier_json(api->metrics, tr, now_ns, b);
        int adm_req = 0;
        long adm_tok = 0;
        for (int m = 0; m < api->n_engines; m++) {
            int q = 0;
            long t = 0;
            sl_admit_queue(ten, i, m, &q, &t);
            adm_req += q;
            adm_tok += t;
        }
        long running = 0, queued = 0, queued_tokens = 0;
        for (int k = 0; k < snap->n; k++) {
            const struct sl_sched_tier_stats *ts = sched_tier(&snap->st[k], tr->sched.name);
            if (!ts)
                continue;
            running += ts->running;
            queued += ts->queued_requests;
            queued_tokens += ts->queued_prompt_tokens;
        }
        sl_str_appendf(b,
                       ",\"admission_queued_requests\":%d,\"admission_queued_prompt_tokens\":%ld,"
                       "\"running\":%ld,\"queued_requests\":%ld,\"queued_prompt_tokens\":%ld}",
                       adm_req, adm_tok, running, queued, queued_tokens);
    }
    sl_str_append(b, "]", 1);
}

/* Each model's replicas: the gauges of sluice:num_requests_*, kv_blocks_*, step_* and
 * worker_busy_ratio, from the same snapshot. */
static void put_models(const struct sl_api *api, const struct snapshot *snap, struct sl_str *b)
{
    sl_str_append(b, "\"models\":[", 10);
    for (int k = 0; k < snap->n; k++) {
        const struct sl_sched_stats *st = &snap->st[k];
        sl_str_appendf(b, "%s{\"model\":", k ? "," : "");
        put_string(b, api->engines[snap->engine[k]].name);
        sl_str_appendf(b,
                       ",\"replica\":%d,\"running\":%d,\"queued_requests\":%d,"
                       "\"queued_prompt_tokens\":%ld,\"kv_blocks_used\":%d,\"kv_blocks_cached\":%d,"
                       "\"kv_blocks_total\":%d,\"step_seconds\":%.6f,\"step_batch_tokens\":%d,"
                       "\"step_batch_sequences\":%d,\"decode_step_seconds\":%.6f,"
                       "\"prefill_tokens_per_second\":%.3f,\"busy_ratio\":%.6f,\"steps\":%llu,"
                       "\"preemptions\":%llu,\"tiers\":[",
                       snap->replica[k], st->running, st->queued_requests, st->queued_prompt_tokens,
                       st->kv_blocks_used, st->kv_blocks_cached, st->kv_blocks_total,
                       st->last_step_seconds, st->last_step_rows, st->last_step_seqs,
                       st->decode_step_seconds, st->prefill_tokens_per_s, st->busy_ratio,
                       (unsigned long long)st->steps, (unsigned long long)st->preemptions);
        int n = st->n_tiers < SL_SCHED_MAX_TIERS ? st->n_tiers : SL_SCHED_MAX_TIERS;
        for (int t = 0; t < n; t++) {
            const struct sl_sched_tier_stats *ts = &st->tiers[t];
            sl_str_appendf(b, "%s{\"tier\":", t ? "," : "");
            put_string(b, ts->name);
            sl_str_appendf(b,
                           ",\"running\":%d,\"queued_requests\":%d,\"queued_prompt_tokens\":%ld}",
                           ts->running, ts->queued_requests, ts->queued_prompt_tokens);
        }
        sl_str_append(b, "]}", 2);
    }
    sl_str_append(b, "]", 1);
}

/* ---- tenants ---- */

struct tenant_row {
    char name[SL_USAGE_TENANT_MAX + 1];
    struct sl_usage u;
};

struct tenant_rows {
    struct tenant_row *v;
    int n, cap;
};

static void add_row(void *arg, const struct sl_usage_key *k, const struct sl_usage *u)
{
    struct tenant_rows *r = arg;
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 16;
        r->v = sl_xrealloc(r->v, sizeof *r->v * (size_t)r->cap);
    }
    struct tenant_row *row = &r->v[r->n++];
    snprintf(row->name, sizeof row->name, "%s", k->tenant);
    row->u = *u;
}

static int64_t tokens_of(const struct tenant_row *r)
{
    return r->u.prompt_tokens + r->u.completion_tokens;
}

/* Larger first; ties by name, so that the order is stable between reads. */
static int by_tokens(const void *x, const void *y)
{
    const struct tenant_row *a = x, *b = y;
    if (tokens_of(a) != tokens_of(b))
        return tokens_of(a) > tokens_of(b) ? -1 : 1;
    return strcmp(a->name, b->name);
}

static int by_cost(const void *x, const void *y)
{
    const struct tenant_row *a = x, *b = y;
    if (a->u.cost != b->u.cost)
        return a->u.cost > b->u.cost ? -1 : 1;
    return strcmp(a->name, b->name);
}

static const struct sl_tenant *tenant_named(const struct sl_tenancy *ten, const char *name)
{
    for (int i = 0; i < ten->n_tenants; i++)
        if (strcmp(ten->tenants[i].name, name) == 0)
            return &ten->tenants[i];
    return NULL;
}

/* A tenant's row: its usage since the ledger began (this replica's), and its money budget this
 * period as /v1/usage shows it to the tenant (null without one). */
static void put_tenant(struct api_exchange *a, const struct tenant_row *r, int64_t unix_s,
                       struct sl_str *b)
{
    const struct sl_tenancy *ten = sl_config_tenancy(a->cfg);
    sl_str_append(b, "{\"tenant\":", 10);
    put_string(b, r->name);
    sl_str_appendf(b,
                   ",\"requests\":%lld,\"prompt_tokens\":%lld,\"completion_tokens\":%lld,"
                   "\"total_tokens\":%lld,\"cost\":",
                   (long long)r->u.requests, (long long)r->u.prompt_tokens,
                   (long long)r->u.completion_tokens, (long long)tokens_of(r));
    put_money(b, r->u.cost);
    sl_str_append(b, ",\"budget\":", 10);
    const struct sl_tenant *t = tenant_named(ten, r->name);
    struct sl_admit_budget_state bs;
    if (!t || !sl_admit_budget_now(ten, t, unix_s, &bs)) {
        sl_str_append(b, "null}", 5);
        return;
    }
    if (bs.spent < 0) { /* no request of this period here yet: the ledger's sum */
        struct sl_usage u;
        sl_usage_ledger_sum(a->t->api->ledger, t->name, bs.start, bs.end, &u);
        bs.spent = u.cost;
    }
    sl_str_append(b, "{\"amount\":", 10);
    put_money(b, bs.amount);
    sl_str_appendf(b, ",\"period\":\"%s\",\"spent\":",
                   sl_usage_period_name((enum sl_usage_period)t->budget_period));
    put_money(b, bs.spent);
    sl_str_appendf(b, ",\"used\":%.6f}}", (double)bs.spent / (double)bs.amount);
}

static void put_top(struct api_exchange *a, struct tenant_rows *rows, const char *key,
                    int (*cmp)(const void *, const void *), int64_t unix_s, struct sl_str *b)
{
    if (rows->n > 1)
        qsort(rows->v, (size_t)rows->n, sizeof *rows->v, cmp);
    sl_str_appendf(b, "\"%s\":[", key);
    for (int i = 0; i < rows->n && i < TOP_TENANTS; i++) {
        if (i)
            sl_str_append(b, ",", 1);
        put_tenant(a, &rows->v[i], unix_s, b);
    }
    sl_str_append(b, "]", 1);
}

void api_serve_admin_stats(struct api_exchange *a)
{
    const struct sl_api *api = a->t->api;
    struct sl_str *b = &a->t->out;
    uint64_t now_ns = sl_clock_ns();
    int64_t unix_s = sl_clock_unix();
    struct snapshot *snap = sl_xcalloc(1, sizeof *snap); /* a few hundred KiB: not the stack */
    snapshot_take(api, snap);
    sl_str_clear(b);
    bool draining =
        sl_exchange_draining(a->x) || (api->server && sl_http_server_draining(api->server));
    sl_str_appendf(b, "{\"object\":\"stats\",\"time\":%lld,\"windows\":[\"1m\",\"5m\"],",
                   (long long)unix_s);
    sl_str_appendf(b, "\"draining\":%s,\"fleet\":", draining ? "true" : "false");
    if (api->fleet) {
        int up = atomic_load_explicit(&api->fleet_up, memory_order_relaxed);
        sl_str_appendf(b,
                       "{\"redis_up\":%s,\"fallback\":%s,\"replicas\":%d,\"local_decisions\":%lld}",
                       up ? "true" : "false", up ? "false" : "true",
                       atomic_load_explicit(&api->fleet_replicas, memory_order_relaxed),
                       atomic_load_explicit(&api->fleet_local, memory_order_relaxed));
    } else {
        sl_str_append(b, "null", 4);
    }
    sl_str_append(b, ",\"currency\":", 12);
    put_string(b, sl_config_metering(a->cfg)->currency);
    sl_str_append(b, ",", 1);
    put_tiers(a, snap, now_ns, b);
    sl_str_append(b, ",", 1);
    put_models(api, snap, b);
    struct tenant_rows rows = {0};
    sl_usage_ledger_query(api->ledger, NULL, INT64_MIN, INT64_MAX, SL_USAGE_BY_TENANT, add_row,
                          &rows);
    sl_str_append(b, ",\"tenants\":{", 12);
    put_top(a, &rows, "by_tokens", by_tokens, unix_s, b);
    sl_str_append(b, ",", 1);
    put_top(a, &rows, "by_cost", by_cost, unix_s, b);
    sl_str_append(b, "}}", 2);
    free(rows.v);
    free(snap);
    /* Figures of now: no cache may keep them. */
    api_send_json(a, 200, b, "Cache-Control: no-store\r\n");
}
