/* Metrics: sharded relaxed-atomic cells, interned label names, Prometheus text rendering.
 *
 * Each shard is one flat array of cells (see struct sl_metrics for the layout), written with
 * relaxed fetch-adds. Relaxed is enough: every cell is an independent counter, and a scrape that
 * races with a recording may see it or not, never a torn value. A histogram keeps per-bucket
 * (not cumulative) counts and a sum; its _count is the total of its buckets, read once, so the
 * +Inf bucket and _count always agree even while observations land.
 */
#include "gateway_impl.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- histograms ---- */

enum hist_kind { H_TTFT, H_TPOT, H_ITL, H_E2E, H_QUEUE, N_HIST };

#define MAX_BOUNDS 22
/* Per histogram: MAX_BOUNDS + 1 bucket counts (the last is +Inf), then the sum in ns. */
#define HIST_CELLS (MAX_BOUNDS + 2)
#define HIST_SUM (MAX_BOUNDS + 1)

#define NS(seconds) ((uint64_t)((seconds)*1e9 + 0.5))

/* vLLM's buckets (vllm/v1/metrics/loggers.py), in nanoseconds. */
static const uint64_t ttft_bounds[] = {
    NS(0.001), NS(0.005), NS(0.01), NS(0.02),  NS(0.04),  NS(0.06),  NS(0.08), NS(0.1),
    NS(0.25),  NS(0.5),   NS(0.75), NS(1.0),   NS(2.5),   NS(5.0),   NS(7.5),  NS(10.0),
    NS(20.0),  NS(40.0),  NS(80.0), NS(160.0), NS(640.0), NS(2560.0)};
static const uint64_t token_bounds[] = {NS(0.01), NS(0.025), NS(0.05), NS(0.075), NS(0.1),
                                        NS(0.15), NS(0.2),   NS(0.3),  NS(0.4),   NS(0.5),
                                        NS(0.75), NS(1.0),   NS(2.5),  NS(5.0),   NS(7.5),
                                        NS(10.0), NS(20.0),  NS(40.0), NS(80.0)};
static const uint64_t request_bounds[] = {
    NS(0.3),  NS(0.5),   NS(0.8),   NS(1.0),   NS(1.5),   NS(2.0),    NS(2.5),
    NS(5.0),  NS(10.0),  NS(15.0),  NS(20.0),  NS(30.0),  NS(40.0),   NS(50.0),
    NS(60.0), NS(120.0), NS(240.0), NS(480.0), NS(960.0), NS(1920.0), NS(7680.0)};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define LIT(o, s) sl_str_append((o), (s), sizeof(s) - 1)

static const struct hist_spec {
    const char *name;
    const char *help;
    const uint64_t *bounds;
    int n_bounds;
} hists[N_HIST] = {
    [H_TTFT] = {"sluice:time_to_first_token_seconds",
                "Time from a request's arrival to its first generated token, by tier.", ttft_bounds,
                COUNT(ttft_bounds)},
    [H_TPOT] = {"sluice:time_per_output_token_seconds",
                "Per request: (end-to-end time - time to first token) / (completion tokens - 1), "
                "by tier.",
                token_bounds, COUNT(token_bounds)},
    [H_ITL] = {"sluice:inter_token_latency_seconds",
               "Gap between a request's successive texts as the gateway receives them, divided "
               "over the tokens each carries, one observation per token, by tier.",
               token_bounds, COUNT(token_bounds)},
    [H_E2E] = {"sluice:e2e_request_latency_seconds",
               "Time from arrival to the end of requests that finished (stop or length), by tier.",
               request_bounds, COUNT(request_bounds)},
    [H_QUEUE] = {"sluice:request_queue_time_seconds",
                 "Time from submission to the scheduler to the first step that ran the request, "
                 "by tier.",
                 request_bounds, COUNT(request_bounds)},
};

_Static_assert(COUNT(ttft_bounds) <= MAX_BOUNDS && COUNT(token_bounds) <= MAX_BOUNDS &&
                   COUNT(request_bounds) <= MAX_BOUNDS,
               "MAX_BOUNDS holds every histogram");

/* ---- labels ---- */

struct labels {
    pthread_mutex_t lock; /* serialises additions */
    atomic_int n;         /* names[0..n) are published and never change */
    atomic_bool other_used;
    int cap;
    char **names; /* (cap) */
};

static void labels_init(struct labels *t, int cap)
{
    pthread_mutex_init(&t->lock, NULL);
    atomic_init(&t->n, 0);
    atomic_init(&t->other_used, false);
    t->cap = cap;
    t->names = sl_xcalloc((size_t)cap, sizeof *t->names);
}

static void labels_dispose(struct labels *t)
{
    for (int i = 0; i < t->cap; i++)
        free(t->names[i]);
    free(t->names);
    pthread_mutex_destroy(&t->lock);
}

static int find(const struct labels *t, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(t->names[i], name) == 0)
            return i;
    return -1;
}

/* The name's index, or t->cap for "other". */
static int label_id(struct labels *t, const char *name)
{
    int n = atomic_load_explicit(&t->n, memory_order_acquire);
    int id = name ? find(t, n, name) : -1;
    if (id >= 0)
        return id;
    size_t len = name ? strnlen(name, SL_METRICS_MAX_NAME + 1) : 0;
    if (len == 0 || len > SL_METRICS_MAX_NAME || strcmp(name, SL_METRICS_OTHER) == 0)
        goto other;
    pthread_mutex_lock(&t->lock);
    n = atomic_load_explicit(&t->n, memory_order_relaxed);
    id = find(t, n, name);
    if (id < 0 && n < t->cap) {
        t->names[n] = sl_xstrdup(name);
        atomic_store_explicit(&t->n, n + 1, memory_order_release);
        id = n;
    }
    pthread_mutex_unlock(&t->lock);
    if (id >= 0)
        return id;
other:
    if (!atomic_load_explicit(&t->other_used, memory_order_relaxed))
        atomic_store_explicit(&t->other_used, true, memory_order_release);
    return t->cap;
}

/* Label ids to render: the published names, then "other" if it was used. Returns the count. */
static int labels_present(struct labels *t, int *ids)
{
    bool other = atomic_load_explicit(&t->other_used, memory_order_acquire);
    int n = atomic_load_explicit(&t->n, memory_order_acquire);
    for (int i = 0; i < n; i++)
        ids[i] = i;
    if (other)
        ids[n++] = t->cap;
    return n;
}

static const char *label_name(const struct labels *t, int id)
{
    return id == t->cap ? SL_METRICS_OTHER : t->names[id];
}

/* ---- the registry ---- */

#define N_TIER (SL_METRICS_MAX_TIERS + 1) /* + "other" */
#define N_TENANT (SL_METRICS_MAX_TENANTS + 1)
#define N_ROUTE (SL_METRICS_MAX_ROUTES + 1)
#define N_MODEL (SL_METRICS_MAX_MODELS + 1)
#define N_CODE 501 /* 100..599, then one for anything else */

/* Offsets of each family's cells within a shard. */
#define OFF_HIST 0                                        /* (N_TIER, N_HIST, HIST_CELLS) */
#define OFF_REQ (OFF_HIST + N_TIER * N_HIST * HIST_CELLS) /* (N_TIER, N_TENANT, N_OUTCOMES) */
#define OFF_TOK (OFF_REQ + N_TIER * N_TENANT * SL_METRICS_N_OUTCOMES) /* (N_TENANT, 2) */
#define OFF_HTTP (OFF_TOK + N_TENANT * 2)                             /* (N_ROUTE, N_CODE) */
#define OFF_ADM                                                                                    \
    (OFF_HTTP + N_ROUTE * N_CODE) /* (N_TIER, SL_ADMIT_N_DECISIONS, SL_ADMIT_N_REASONS) */
#define OFF_COST (OFF_ADM + N_TIER * SL_ADMIT_N_DECISIONS * SL_ADMIT_N_REASONS)
/* (N_TENANT, N_MODEL) nano-units */
#define OFF_DEV (OFF_COST + N_TENANT * N_MODEL) /* (N_TENANT) ns */
#define OFF_SLO (OFF_DEV + N_TENANT) /* (N_TIER, N_TENANT, SL_SLO_N_OBJECTIVES, 2: missed, met) */
#define N_CELLS (OFF_SLO + N_TIER * N_TENANT * SL_SLO_N_OBJECTIVES * 2)

/* One (tier, tenant) pair's SLO windows. A mutex, not shards: an event is one per finished
 * request (thousands a second at most, each holding the lock for well under a microsecond; an
 * /admin/slo read holds it for tens), and a ring per I/O thread would multiply its 210 KiB by the
 * threads for nothing. */
struct slo_series {
    pthread_mutex_t lock;
    struct sl_slo_ring *ring;
};

struct sl_metrics {
    int n_shards;
    _Atomic uint64_t **shards; /* (n_shards) → (N_CELLS), each on its own cache lines */
    struct labels tiers, tenants, routes, models;
    /* SLO windows: the series of (tier, tenant) label ids at [tier * N_TENANT + tenant], made at
     * its first event (under slo_lock, which counts them in n_slo) and never freed before the
     * registry; read without the lock once published. */
    pthread_mutex_t slo_lock;
    int n_slo;
    struct slo_series *_Atomic *slo; /* (N_TIER * N_TENANT) */
};

struct sl_metrics *sl_metrics_new(int n_shards)
{
    struct sl_metrics *m = sl_xcalloc(1, sizeof *m);
    m->n_shards = n_shards < 1 ? 1 : n_shards;
    m->shards = sl_xcalloc((size_t)m->n_shards, sizeof *m->shards);
    size_t bytes = (sizeof(_Atomic uint64_t) * N_CELLS + 63) / 64 * 64;
    for (int s = 0; s < m->n_shards; s++) {
        m->shards[s] = aligned_alloc(64, bytes);
        if (!m->shards[s])
            abort();
        for (size_t i = 0; i < N_CELLS; i++)
            atomic_init(&m->shards[s][i], 0);
    }
    labels_init(&m->tiers, SL_METRICS_MAX_TIERS);
    labels_init(&m->tenants, SL_METRICS_MAX_TENANTS);
    labels_init(&m->routes, SL_METRICS_MAX_ROUTES);
    labels_init(&m->models, SL_METRICS_MAX_MODELS);
    pthread_mutex_init(&m->slo_lock, NULL);
    m->slo = sl_xcalloc((size_t)N_TIER * N_TENANT, sizeof *m->slo);
    for (size_t i = 0; i < (size_t)N_TIER * N_TENANT; i++)
        atomic_init(&m->slo[i], NULL);
    return m;
}

void sl_metrics_free(struct sl_metrics *m)
{
    if (!m)
        return;
    for (int s = 0; s < m->n_shards; s++)
        free(m->shards[s]);
    free(m->shards);
    labels_dispose(&m->tiers);
    labels_dispose(&m->tenants);
    labels_dispose(&m->routes);
    labels_dispose(&m->models);
    for (size_t i = 0; i < (size_t)N_TIER * N_TENANT; i++) {
        struct slo_series *sr = atomic_load_explicit(&m->slo[i], memory_order_relaxed);
        if (sr) {
            pthread_mutex_destroy(&sr->lock);
            sl_slo_ring_free(sr->ring);
            free(sr);
        }
    }
    free(m->slo);
    pthread_mutex_destroy(&m->slo_lock);
    free(m);
}

static _Atomic uint64_t *shard_of(struct sl_metrics *m, int shard)
{
    unsigned s = shard < 0 ? 0u : (unsigned)shard;
    return m->shards[s % (unsigned)m->n_shards];
}

static void add(_Atomic uint64_t *cell, uint64_t n)
{
    atomic_fetch_add_explicit(cell, n, memory_order_relaxed);
}

static uint64_t total(const struct sl_metrics *m, size_t i)
{
    uint64_t v = 0;
    for (int s = 0; s < m->n_shards; s++)
        v += atomic_load_explicit(&m->shards[s][i], memory_order_relaxed);
    return v;
}

static uint64_t to_ns(double seconds)
{
    if (!(seconds > 0)) /* negative, zero or NaN */
        return 0;
    if (seconds > 1e9) /* 31 years: beyond every bucket, and far from overflow */
        seconds = 1e9;
    return (uint64_t)llround(seconds * 1e9);
}

static size_t hist_base(int tier, enum hist_kind k)
{
    return OFF_HIST + ((size_t)tier * N_HIST + (size_t)k) * HIST_CELLS;
}

/* Adds n observations of v_ns each, whose sum is sum_ns. */
static void hist_observe(_Atomic uint64_t *sh, int tier, enum hist_kind k, uint64_t v_ns,
                         uint64_t n, uint64_t sum_ns)
{
    const struct hist_spec *h = &hists[k];
    int b = 0;
    while (b < h->n_bounds && v_ns > h->bounds[b])
        b++;
    size_t base = hist_base(tier, k);
    add(&sh[base + (size_t)b], n);
    add(&sh[base + HIST_SUM], sum_ns);
}

void sl_metrics_observe_ttft(struct sl_metrics *m, int shard, const char *tier, double seconds)
{
    uint64_t ns = to_ns(seconds);
    hist_observe(shard_of(m, shard), label_id(&m->tiers, tier), H_TTFT, ns, 1, ns);
}

void sl_metrics_observe_itl(struct sl_metrics *m, int shard, const char *tier, double gap_seconds,
                            int n_tokens)
{
    if (n_tokens < 1)
        return;
    uint64_t gap = to_ns(gap_seconds);
    hist_observe(shard_of(m, shard), label_id(&m->tiers, tier), H_ITL, gap / (uint64_t)n_tokens,
                 (uint64_t)n_tokens, gap);
}

/* ---- SLO attainment ---- */

static size_t slo_index(int tier, int tenant)
{
    return (size_t)tier * N_TENANT + (size_t)tenant;
}

/* The series of (tier, tenant), made now if it is the pair's first event. Past
 * SL_METRICS_MAX_SLO_SERIES pairs a new tenant's events go to its tier's "other" series. */
static struct slo_series *slo_series(struct sl_metrics *m, int tier, int tenant)
{
    size_t i = slo_index(tier, tenant);
    struct slo_series *sr = atomic_load_explicit(&m->slo[i], memory_order_acquire);
    if (sr)
        return sr;
    pthread_mutex_lock(&m->slo_lock);
    sr = atomic_load_explicit(&m->slo[i], memory_order_relaxed);
    bool full = !sr && tenant != m->tenants.cap && m->n_slo >= SL_METRICS_MAX_SLO_SERIES;
    if (!sr && !full) {
        sr = sl_xmalloc(sizeof *sr);
        pthread_mutex_init(&sr->lock, NULL);
        sr->ring = sl_slo_ring_new();
        m->n_slo += tenant != m->tenants.cap;
        atomic_store_explicit(&m->slo[i], sr, memory_order_release);
    }
    pthread_mutex_unlock(&m->slo_lock);
    return full ? slo_series(m, tier, m->tenants.cap) : sr;
}

static void slo_add(struct sl_metrics *m, int tier, int tenant, uint64_t now_ns,
                    const struct sl_slo_event *e)
{
    struct slo_series *sr = slo_series(m, tier, tenant);
    pthread_mutex_lock(&sr->lock);
    sl_slo_ring_add(sr->ring, now_ns, e);
    pthread_mutex_unlock(&sr->lock);
}

/* r's verdict in the counters and, with what admission did, in the windows: the verdict under the
 * tier it ran in, a refusal or degradation under the tier whose policy decided (the same tier
 * unless it was demoted). */
static void slo_record(struct sl_metrics *m, _Atomic uint64_t *sh, int tier, int tenant,
                       const struct sl_metrics_request *r)
{
    bool judged = false;
    for (int o = 0; o < SL_SLO_N_OBJECTIVES; o++) {
        enum sl_slo_mark k = r->slo.mark[o];
        if (k != SL_SLO_MARK_MISSED && k != SL_SLO_MARK_MET)
            continue;
        judged = true;
        add(&sh[OFF_SLO + (slo_index(tier, tenant) * SL_SLO_N_OBJECTIVES + (size_t)o) * 2 +
                (k == SL_SLO_MARK_MET)],
            1);
    }
    bool refused = (int)r->refused > SL_ADMIT_REASON_NONE && r->refused < SL_ADMIT_N_REASONS;
    struct sl_slo_event e = {.v = r->slo};
    if (!refused && !r->degraded) {
        if (judged)
            slo_add(m, tier, tenant, r->now_ns, &e);
        return;
    }
    int policy = r->policy_tier ? label_id(&m->tiers, r->policy_tier) : tier;
    if (policy != tier && judged) {
        slo_add(m, tier, tenant, r->now_ns, &e);
        e.v = (struct sl_slo_verdict){0};
    }
    e.refused = refused ? r->refused : SL_ADMIT_REASON_NONE;
    e.degraded = r->degraded;
    slo_add(m, policy, tenant, r->now_ns, &e);
}

void sl_metrics_request_done(struct sl_metrics *m, int shard, const struct sl_metrics_request *r)
{
    _Atomic uint64_t *sh = shard_of(m, shard);
    int tier = label_id(&m->tiers, r->tier);
    int tenant = label_id(&m->tenants, r->tenant);
    int o = (int)r->outcome >= 0 && (int)r->outcome < SL_METRICS_N_OUTCOMES
                ? (int)r->outcome
                : SL_METRICS_OUTCOME_ERROR;
    add(&sh[OFF_REQ + ((size_t)tier * N_TENANT + (size_t)tenant) * SL_METRICS_N_OUTCOMES +
            (size_t)o],
        1);
    slo_record(m, sh, tier, tenant, r);
    if (!r->engine)
        return;
    add(&sh[OFF_TOK + (size_t)tenant * 2], r->prompt_tokens > 0 ? (uint64_t)r->prompt_tokens : 0);
    add(&sh[OFF_TOK + (size_t)tenant * 2 + 1],
        r->completion_tokens > 0 ? (uint64_t)r->completion_tokens : 0);
    if (r->model) {
        int model = label_id(&m->models, r->model);
        add(&sh[OFF_COST + (size_t)tenant * N_MODEL + (size_t)model],
            r->cost > 0 ? (uint64_t)r->cost : 0);
        add(&sh[OFF_DEV + (size_t)tenant], r->device_ns > 0 ? (uint64_t)r->device_ns : 0);
    }
    if (r->queue_seconds >= 0) {
        uint64_t q = to_ns(r->queue_seconds);
        hist_observe(sh, tier, H_QUEUE, q, 1, q);
    }
    if (o != SL_METRICS_OUTCOME_STOP && o != SL_METRICS_OUTCOME_LENGTH)
        return;
    uint64_t e2e = to_ns(r->e2e_seconds);
    hist_observe(sh, tier, H_E2E, e2e, 1, e2e);
    if (r->completion_tokens > 1 && r->ttft_seconds >= 0 && r->e2e_seconds >= r->ttft_seconds) {
        uint64_t tpot =
            to_ns((r->e2e_seconds - r->ttft_seconds) / (double)(r->completion_tokens - 1));
        hist_observe(sh, tier, H_TPOT, tpot, 1, tpot);
    }
}

static const char *const decision_names[SL_ADMIT_N_DECISIONS] = {
    [SL_ADMIT_ADMITTED] = "admitted",
    [SL_ADMIT_DEGRADED] = "degraded",
    [SL_ADMIT_REJECTED] = "rejected",
};

void sl_metrics_admission(struct sl_metrics *m, int shard, const char *tier,
                          enum sl_admit_decision d, enum sl_admit_reason r)
{
    if ((int)d < 0 || d >= SL_ADMIT_N_DECISIONS || (int)r < 0 || r >= SL_ADMIT_N_REASONS)
        return;
    int t = label_id(&m->tiers, tier);
    add(&shard_of(
            m,
            shard)[OFF_ADM + ((size_t)t * SL_ADMIT_N_DECISIONS + (size_t)d) * SL_ADMIT_N_REASONS +
                   (size_t)r],
        1);
}

void sl_metrics_http_done(struct sl_metrics *m, int shard, const char *route, int code)
{
    int rt = label_id(&m->routes, route);
    int c = code >= 100 && code <= 599 ? code - 100 : N_CODE - 1;
    add(&shard_of(m, shard)[OFF_HTTP + (size_t)rt * N_CODE + (size_t)c], 1);
}

/* ---- outcomes ---- */

static const char *const outcome_names[SL_METRICS_N_OUTCOMES] = {
    [SL_METRICS_OUTCOME_STOP] = "stop",           [SL_METRICS_OUTCOME_LENGTH] = "length",
    [SL_METRICS_OUTCOME_CANCELLED] = "cancelled", [SL_METRICS_OUTCOME_ERROR] = "error",
    [SL_METRICS_OUTCOME_INVALID] = "invalid",     [SL_METRICS_OUTCOME_REJECTED] = "rejected",
};

const char *sl_metrics_outcome_str(enum sl_metrics_outcome o)
{
    return (int)o >= 0 && (int)o < SL_METRICS_N_OUTCOMES ? outcome_names[o] : "error";
}

enum sl_metrics_outcome sl_metrics_outcome_of(const char *finish, int http_status)
{
    if (finish && strcmp(finish, "stop") == 0)
        return SL_METRICS_OUTCOME_STOP;
    if (finish && strcmp(finish, "length") == 0)
        return SL_METRICS_OUTCOME_LENGTH;
    if (finish && strcmp(finish, "cancelled") == 0)
        return SL_METRICS_OUTCOME_CANCELLED;
    if (http_status == 429 || http_status == 503)
        return SL_METRICS_OUTCOME_REJECTED;
    if (http_status >= 400 && http_status < 500)
        return SL_METRICS_OUTCOME_INVALID;
    return SL_METRICS_OUTCOME_ERROR;
}

/* ---- rendering ---- */

/* Label values: backslash, double quote and line feed are escaped (text format 0.0.4). */
static void append_value(struct sl_str *o, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            LIT(o, "\\\\");
        else if (*v == '"')
            LIT(o, "\\\"");
        else if (*v == '\n')
            LIT(o, "\\n");
        else
            sl_str_append(o, v, 1);
    }
}

/* HELP text: backslash and line feed are escaped. */
static void family(struct sl_str *o, const char *name, const char *type, const char *help)
{
    sl_str_appendf(o, "# HELP %s ", name);
    for (const char *h = help; *h; h++) {
        if (*h == '\\')
            LIT(o, "\\\\");
        else if (*h == '\n')
            LIT(o, "\\n");
        else
            sl_str_append(o, h, 1);
    }
    sl_str_appendf(o, "\n# TYPE %s %s\n", name, type);
}

/* Seconds from nanoseconds, exactly, without trailing zeros ("0.001", "2.5", "7680"). */
static void append_seconds(struct sl_str *o, uint64_t ns)
{
    char frac[16];
    snprintf(frac, sizeof frac, "%09" PRIu64, ns % 1000000000u);
    int n = 9;
    while (n > 0 && frac[n - 1] == '0')
        n--;
    sl_str_appendf(o, "%" PRIu64, ns / 1000000000u);
    if (n > 0)
        sl_str_appendf(o, ".%.*s", n, frac);
}

static void render_hist(struct sl_metrics *m, struct sl_str *o, enum hist_kind k, const int *tiers,
                        int n_tiers)
{
    const struct hist_spec *h = &hists[k];
    family(o, h->name, "histogram", h->help);
    for (int i = 0; i < n_tiers; i++) {
        size_t base = hist_base(tiers[i], k);
        const char *tier = label_name(&m->tiers, tiers[i]);
        uint64_t cum = 0;
        for (int b = 0; b <= h->n_bounds; b++) {
            cum += total(m, base + (size_t)b);
            sl_str_appendf(o, "%s_bucket{tier=\"", h->name);
            append_value(o, tier);
            LIT(o, "\",le=\"");
            if (b < h->n_bounds)
                append_seconds(o, h->bounds[b]);
            else
                LIT(o, "+Inf");
            sl_str_appendf(o, "\"} %" PRIu64 "\n", cum);
        }
        sl_str_appendf(o, "%s_sum{tier=\"", h->name);
        append_value(o, tier);
        LIT(o, "\"} ");
        append_seconds(o, total(m, base + HIST_SUM));
        sl_str_appendf(o, "\n%s_count{tier=\"", h->name);
        append_value(o, tier);
        sl_str_appendf(o, "\"} %" PRIu64 "\n", cum);
    }
}

/* The schedulers' gauges: one scheduler's samples carry no model label (as before models
 * came); several schedulers' samples each carry model="NAME". */
struct sched_src {
    const char *const *names;
    const int *replicas; /* NULL: one scheduler per model */
    const struct sl_sched_stats *st;
    int n;
};

static int tiers_of(const struct sl_sched_stats *st)
{
    return st->n_tiers < 0                    ? 0
           : st->n_tiers > SL_SCHED_MAX_TIERS ? SL_SCHED_MAX_TIERS
                                              : st->n_tiers;
}

/* A sample of scheduler k, labelled by its model (when several), its replica (when a model has
 * several) and by tier (when not NULL). */
static void sched_sample(struct sl_str *o, const struct sched_src *src, int k, const char *name,
                         const char *tier, const char *value)
{
    sl_str_appendf(o, "%s", name);
    bool model = src->n > 1;
    if (model || tier) {
        LIT(o, "{");
        if (model) {
            LIT(o, "model=\"");
            append_value(o, src->names[k] ? src->names[k] : SL_METRICS_OTHER);
            LIT(o, "\"");
        }
        if (src->replicas)
            sl_str_appendf(o, ",replica=\"%d\"", src->replicas[k]);
        if (tier) {
            if (model)
                LIT(o, ",");
            LIT(o, "tier=\"");
            append_value(o, tier);
            LIT(o, "\"");
        }
        LIT(o, "}");
    }
    sl_str_appendf(o, " %s\n", value);
}

enum sched_field {
    F_RUNNING,
    F_WAITING,
    F_PROMPT_WAITING,
    F_PREEMPTIONS,
    F_KV_USED,
    F_KV_TOTAL,
    F_KV_CACHED,
    F_PREFIX_QUERIES,
    F_PREFIX_HITS,
    F_PREFIX_EVICTIONS,
    F_STEP_TOKENS,
    F_STEP_SEQS,
    F_STEP_SECONDS,
    F_PREFILL_RATE,
    F_DECODE_STEP,
    F_STEPS,
    F_BUSY_RATIO,
    F_BUSY_SECONDS,
    N_SCHED_FIELDS,
};

static const struct {
    const char *name, *type, *help;
    bool per_tier;
} sched_fields[N_SCHED_FIELDS] = {
    [F_RUNNING] = {"sluice:num_requests_running", "gauge",
                   "Sequences running in the scheduler (holding KV blocks), by tier.", true},
    [F_WAITING] = {"sluice:num_requests_waiting", "gauge",
                   "Requests queued in the scheduler, not yet running, by tier.", true},
    [F_PROMPT_WAITING] = {"sluice:num_prompt_tokens_waiting", "gauge",
                          "Prompt tokens not yet prefilled (queued and partly prefilled "
                          "requests), by tier.",
                          true},
    [F_PREEMPTIONS] = {"sluice:num_preemptions_total", "counter",
                       "Sequences preempted (their KV blocks freed, to be recomputed), by tier.",
                       true},
    [F_KV_USED] = {"sluice:kv_blocks_used", "gauge",
                   "KV cache blocks held by sequences (a block shared by several counts once).",
                   false},
    [F_KV_TOTAL] = {"sluice:kv_blocks_capacity", "gauge", "KV cache blocks in the worker's pool.",
                    false},
    [F_KV_CACHED] = {"sluice:kv_blocks_cached", "gauge",
                     "KV cache blocks no sequence holds that keep a prompt prefix for reuse: free "
                     "for allocation, evicted least recently used first when needed.",
                     false},
    [F_PREFIX_QUERIES] = {"sluice:prefix_cache_queries_total", "counter",
                          "Prompt tokens looked up in the prefix cache (requests with it on, at "
                          "their first start), as vLLM counts them.",
                          false},
    [F_PREFIX_HITS] = {"sluice:prefix_cache_hits_total", "counter",
                       "Prompt tokens found in the prefix cache (their KV reused, not computed); "
                       "over sluice:prefix_cache_queries_total, the hit rate.",
                       false},
    [F_PREFIX_EVICTIONS] = {"sluice:prefix_cache_evictions_total", "counter",
                            "Cached KV blocks evicted: reused for other content because no free "
                            "block was left.",
                            false},
    [F_STEP_TOKENS] = {"sluice:step_batch_tokens", "gauge",
                       "Tokens (decodes and prompt chunks) in the latest scheduler step.", false},
    [F_STEP_SEQS] = {"sluice:step_batch_sequences", "gauge",
                     "Sequences in the latest scheduler step.", false},
    [F_STEP_SECONDS] = {"sluice:step_duration_seconds", "gauge",
                        "Duration of the latest scheduler step: batching, forward pass and "
                        "sampling.",
                        false},
    [F_PREFILL_RATE] = {"sluice:prefill_tokens_per_second", "gauge",
                        "Prompt tokens per second of scheduler steps that prefilled, moving "
                        "average.",
                        false},
    [F_DECODE_STEP] = {"sluice:decode_step_seconds", "gauge",
                       "Duration of scheduler steps that decoded (the time between two tokens), "
                       "moving average.",
                       false},
    [F_STEPS] = {"sluice:scheduler_steps_total", "counter",
                 "Scheduler steps that ran the worker's forward pass.", false},
    [F_BUSY_RATIO] = {"sluice:worker_busy_ratio", "gauge",
                      "Share of wall time in the worker's forward pass, averaged exponentially "
                      "with a 10 s time constant.",
                      false},
    [F_BUSY_SECONDS] = {"sluice:worker_busy_seconds_total", "counter",
                        "Time spent in the worker's forward pass.", false},
};

static void field_value(const struct sl_sched_stats *st, enum sched_field f, int tier, char *v,
                        size_t n)
{
    const struct sl_sched_tier_stats *t = &st->tiers[tier];
    switch (f) {
    case F_RUNNING: snprintf(v, n, "%d", t->running); break;
    case F_WAITING: snprintf(v, n, "%d", t->queued_requests); break;
    case F_PROMPT_WAITING: snprintf(v, n, "%ld", t->queued_prompt_tokens); break;
    case F_PREEMPTIONS: snprintf(v, n, "%" PRIu64, t->preemptions); break;
    case F_KV_USED: snprintf(v, n, "%d", st->kv_blocks_used); break;
    case F_KV_TOTAL: snprintf(v, n, "%d", st->kv_blocks_total); break;
    case F_KV_CACHED: snprintf(v, n, "%d", st->kv_blocks_cached); break;
    case F_PREFIX_QUERIES: snprintf(v, n, "%" PRIu64, st->prefix_query_tokens); break;
    case F_PREFIX_HITS: snprintf(v, n, "%" PRIu64, st->prefix_hit_tokens); break;
    case F_PREFIX_EVICTIONS: snprintf(v, n, "%" PRIu64, st->prefix_evictions); break;
    case F_STEP_TOKENS: snprintf(v, n, "%d", st->last_step_rows); break;
    case F_STEP_SEQS: snprintf(v, n, "%d", st->last_step_seqs); break;
    case F_STEP_SECONDS: snprintf(v, n, "%.6f", st->last_step_seconds); break;
    case F_PREFILL_RATE: snprintf(v, n, "%.3f", st->prefill_tokens_per_s); break;
    case F_DECODE_STEP: snprintf(v, n, "%.6f", st->decode_step_seconds); break;
    case F_STEPS: snprintf(v, n, "%" PRIu64, st->steps); break;
    case F_BUSY_RATIO: snprintf(v, n, "%.6f", st->busy_ratio); break;
    case F_BUSY_SECONDS: snprintf(v, n, "%.6f", st->busy_seconds); break;
    case N_SCHED_FIELDS: v[0] = '\0'; break;
    }
}

static void render_sched(struct sl_str *o, const struct sched_src *src)
{
    char v[64];
    for (int f = 0; f < N_SCHED_FIELDS; f++) {
        family(o, sched_fields[f].name, sched_fields[f].type, sched_fields[f].help);
        for (int k = 0; k < src->n; k++) {
            const struct sl_sched_stats *st = &src->st[k];
            if (!sched_fields[f].per_tier) {
                field_value(st, (enum sched_field)f, 0, v, sizeof v);
                sched_sample(o, src, k, sched_fields[f].name, NULL, v);
                continue;
            }
            for (int i = 0; i < tiers_of(st); i++) {
                field_value(st, (enum sched_field)f, i, v, sizeof v);
                sched_sample(o, src, k, sched_fields[f].name, st->tiers[i].name, v);
            }
        }
    }
}

/* ---- vLLM's names, for the Gateway API Inference Extension's endpoint picker ----
 *
 * What the picker (EPP) scrapes from each model server of an InferencePool to route, under the
 * names vLLM gives it, so that a sluice replica can stand where a vLLM pod would (README,
 * Metrics, has the addresses). The model server protocol of kubernetes-sigs/
 * gateway-api-inference-extension (docs/proposals/003-model-server-protocol/README.md) asks for
 * three gauges, TotalQueuedRequests, TotalRunningRequests and KVCacheUtilization, named for vLLM
 * vllm:num_requests_waiting, vllm:num_requests_running and vllm:kv_cache_usage_perc, and
 * optionally BlockSize and NumGPUBlocks as the labels block_size and num_gpu_blocks of
 * vllm:cache_config_info. The picker's default "vllm" mapping (llm-d/llm-d-router, where the
 * EPP now lives: pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go) reads
 * exactly those, plus vllm:lora_requests_info, whose absence it takes as "no adapters" (sluice
 * serves none); any other family it misses counts as an extraction error on every poll, so
 * vllm:cache_config_info is given too. EPP releases up to v1.2 read the fraction as
 * vllm:gpu_cache_usage_perc, vLLM's older name for it, which is therefore given as well.
 *
 * vLLM (vllm/v1/metrics/loggers.py) labels them model_name (the served model name) and engine
 * (a data-parallel engine's index), and its usage is a fraction, "1 means 100 percent usage",
 * despite the name. The picker filters on no label: of a family's series it takes the one with
 * the latest timestamp, and with none in the exposition the first (spec.go getLatestMetric).
 * So here each model has one series, model_name="<its id>", summing its replicas (requests, and
 * blocks for the fraction: used over capacity), because the picker routes to the pod and must
 * see the whole pod's load, not one replica's; the series being the whole process's, no engine
 * label. With several models the picker's default reads the first model's. */

static bool same_name(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

void sl_metrics_render_vllm(const char *const *names, const struct sl_sched_stats *st, int n,
                            bool prefix_caching, struct sl_str *out)
{
    enum { WAITING, RUNNING, KV_USAGE, GPU_USAGE, CACHE_INFO, N_FAMILIES };
    static const char *const fam[N_FAMILIES][2] = {
        [WAITING] = {"vllm:num_requests_waiting",
                     "Number of requests waiting to be processed: queued in the scheduler, not "
                     "yet running (sluice:num_requests_waiting over tiers and replicas)."},
        [RUNNING] = {"vllm:num_requests_running",
                     "Number of requests in model execution batches: sequences holding KV blocks "
                     "(sluice:num_requests_running over tiers and replicas)."},
        [KV_USAGE] = {"vllm:kv_cache_usage_perc",
                      "KV-cache usage. 1 means 100 percent usage: blocks owned by sequences over "
                      "the blocks in the pools, over replicas."},
        [GPU_USAGE] = {"vllm:gpu_cache_usage_perc",
                       "KV-cache usage. 1 means 100 percent usage. vLLM's former name of "
                       "vllm:kv_cache_usage_perc, which endpoint pickers up to v1.2 read."},
        [CACHE_INFO] = {"vllm:cache_config_info",
                        "Information of the KV cache: block_size in positions, num_gpu_blocks "
                        "in the pools over replicas (on whatever device), and whether new "
                        "requests use the prefix cache."},
    };
    for (int f = 0; f < N_FAMILIES; f++) {
        family(out, fam[f][0], "gauge", fam[f][1]);
        for (int k = 0; k < n; k++) {
            bool seen = false;
            for (int j = 0; j < k && !seen; j++)
                seen = same_name(names[j], names[k]);
            if (seen)
                continue; /* counted with the model's first replica */
            long waiting = 0, running = 0, used = 0, total = 0;
            for (int j = k; j < n; j++)
                if (same_name(names[j], names[k])) {
                    waiting += st[j].queued_requests;
                    running += st[j].running;
                    used += st[j].kv_blocks_used;
                    total += st[j].kv_blocks_total;
                }
            sl_str_appendf(out, "%s{model_name=\"", fam[f][0]);
            append_value(out, names[k] ? names[k] : SL_METRICS_OTHER);
            LIT(out, "\"");
            switch (f) {
            case WAITING: sl_str_appendf(out, "} %ld\n", waiting); break;
            case RUNNING: sl_str_appendf(out, "} %ld\n", running); break;
            case KV_USAGE:
            case GPU_USAGE:
                sl_str_appendf(out, "} %.6f\n", total > 0 ? (double)used / (double)total : 0.0);
                break;
            case CACHE_INFO:
                sl_str_appendf(out,
                               ",block_size=\"%d\",num_gpu_blocks=\"%ld\","
                               "enable_prefix_caching=\"%s\"} 1\n",
                               st[k].block_size, total, prefix_caching ? "True" : "False");
                break;
            }
        }
    }
}

static uint64_t slo_total(const struct sl_metrics *m, int tier, int tenant, enum sl_slo_objective o,
                          bool met)
{
    return total(m, OFF_SLO + (slo_index(tier, tenant) * SL_SLO_N_OBJECTIVES + (size_t)o) * 2 +
                        (size_t)met);
}

/* Both met="true" and met="false" of every (tier, tenant, objective) that counted a request, so
 * that attainment is one division of two series that both exist. */
static void render_slo(struct sl_metrics *m, struct sl_str *out, const int *tiers, int n_tiers,
                       const int *tenants, int n_tenants)
{
    family(out, "sluice:slo_requests_total", "counter",
           "Requests that reached an engine and finished or failed (not cancelled), by tier (the "
           "one it ran in), tenant, objective (ttft, tpot: only for requests with two completion "
           "tokens or more, both: every objective counted for it) and whether it was met; a "
           "failed request misses them all.");
    uint64_t goodput[N_TIER] = {0};
    bool counted[N_TIER] = {false};
    for (int t = 0; t < n_tiers; t++)
        for (int n = 0; n < n_tenants; n++)
            for (int o = 0; o < SL_SLO_N_OBJECTIVES; o++) {
                uint64_t yes = slo_total(m, tiers[t], tenants[n], (enum sl_slo_objective)o, true);
                uint64_t no = slo_total(m, tiers[t], tenants[n], (enum sl_slo_objective)o, false);
                if (yes + no == 0)
                    continue;
                if (o == SL_SLO_OBJECTIVE_BOTH) {
                    goodput[t] += yes;
                    counted[t] = true;
                }
                for (int met = 1; met >= 0; met--) {
                    LIT(out, "sluice:slo_requests_total{tier=\"");
                    append_value(out, label_name(&m->tiers, tiers[t]));
                    LIT(out, "\",tenant=\"");
                    append_value(out, label_name(&m->tenants, tenants[n]));
                    sl_str_appendf(out, "\",objective=\"%s\",met=\"%s\"} %" PRIu64 "\n",
                                   sl_slo_objective_str((enum sl_slo_objective)o),
                                   met ? "true" : "false", met ? yes : no);
                }
            }
    family(out, "sluice:goodput_requests_total", "counter",
           "Requests that met every objective of their tier (sluice:slo_requests_total with "
           "objective=\"both\" and met=\"true\", over tenants), by tier.");
    for (int t = 0; t < n_tiers; t++) {
        if (!counted[t])
            continue;
        LIT(out, "sluice:goodput_requests_total{tier=\"");
        append_value(out, label_name(&m->tiers, tiers[t]));
        sl_str_appendf(out, "\"} %" PRIu64 "\n", goodput[t]);
    }
}

/* One tier of /admin/slo: its objectives (null when the configuration no longer has it) and each
 * tenant with a series, its windows read at now_ns. */
static void slo_json_tier(struct sl_metrics *m, const char *name, int tier,
                          const struct sl_tier *cfg, const int *tenants, int n_tenants,
                          uint64_t now_ns, struct sl_str *out)
{
    LIT(out, "{\"tier\":\"");
    sl_str_append_json(out, name, strlen(name));
    if (cfg)
        sl_str_appendf(out, "\",\"ttft_slo_ms\":%d,\"tpot_slo_ms\":%d,\"tenants\":[",
                       cfg->sched.ttft_slo_ms, cfg->sched.tpot_slo_ms);
    else
        LIT(out, "\",\"ttft_slo_ms\":null,\"tpot_slo_ms\":null,\"tenants\":[");
    const char *sep = "";
    for (int n = 0; tier >= 0 && n < n_tenants; n++) {
        struct slo_series *sr =
            atomic_load_explicit(&m->slo[slo_index(tier, tenants[n])], memory_order_acquire);
        if (!sr)
            continue;
        struct sl_slo_summary w[SL_SLO_N_WINDOWS];
        pthread_mutex_lock(&sr->lock);
        for (int k = 0; k < SL_SLO_N_WINDOWS; k++)
            sl_slo_ring_read(sr->ring, now_ns, (enum sl_slo_window)k, &w[k]);
        pthread_mutex_unlock(&sr->lock);
        const char *tenant = label_name(&m->tenants, tenants[n]);
        sl_str_appendf(out, "%s{\"tenant\":\"", sep);
        sl_str_append_json(out, tenant, strlen(tenant));
        LIT(out, "\"");
        for (int k = 0; k < SL_SLO_N_WINDOWS; k++) {
            sl_str_appendf(out, ",\"%s\":", sl_slo_window_str((enum sl_slo_window)k));
            sl_slo_summary_json(out, &w[k]);
        }
        LIT(out, "}");
        sep = ",";
    }
    LIT(out, "]}");
}

void sl_metrics_slo_json(struct sl_metrics *m, const struct sl_tenancy *ten, uint64_t now_ns,
                         struct sl_str *out)
{
    int tiers[N_TIER], tenants[N_TENANT];
    int n_tiers = labels_present(&m->tiers, tiers);
    int n_tenants = labels_present(&m->tenants, tenants);
    int n_named = atomic_load_explicit(&m->tiers.n, memory_order_acquire);
    LIT(out, "{\"object\":\"slo\",\"windows\":[\"1m\",\"5m\",\"60m\"],\"tiers\":[");
    /* The configuration's tiers in its order, with or without traffic; then tiers it no longer
     * has (a reload renamed them) or "other", when they have series. */
    bool shown[N_TIER] = {false};
    const char *sep = "";
    for (int i = 0; ten && i < ten->n_tiers; i++) {
        const char *name = ten->tiers[i].sched.name;
        int id = find(&m->tiers, n_named, name);
        if (id >= 0)
            shown[id] = true;
        sl_str_appendf(out, "%s", sep);
        slo_json_tier(m, name, id, &ten->tiers[i], tenants, n_tenants, now_ns, out);
        sep = ",";
    }
    for (int t = 0; t < n_tiers; t++) {
        if (shown[tiers[t]])
            continue;
        bool any = false;
        for (int n = 0; n < n_tenants && !any; n++)
            any = atomic_load_explicit(&m->slo[slo_index(tiers[t], tenants[n])],
                                       memory_order_acquire) != NULL;
        if (!any)
            continue;
        sl_str_appendf(out, "%s", sep);
        slo_json_tier(m, label_name(&m->tiers, tiers[t]), tiers[t], NULL, tenants, n_tenants,
                      now_ns, out);
        sep = ",";
    }
    LIT(out, "]}");
}

void sl_metrics_render(struct sl_metrics *m, const struct sl_sched_stats *st, struct sl_str *out)
{
    sl_metrics_render_models(m, NULL, NULL, st, st ? 1 : 0, out);
}

void sl_metrics_render_models(struct sl_metrics *m, const char *const *names, const int *replicas,
                              const struct sl_sched_stats *st, int n, struct sl_str *out)
{
    int tiers[N_TIER], tenants[N_TENANT], routes[N_ROUTE], models[N_MODEL];
    /* Names first: a cell counted under a name is never seen before the name is. */
    int n_tiers = labels_present(&m->tiers, tiers);
    int n_tenants = labels_present(&m->tenants, tenants);
    int n_routes = labels_present(&m->routes, routes);
    int n_models = labels_present(&m->models, models);

    family(out, "sluice:requests_total", "counter",
           "Inference requests by tier, tenant and outcome, each counted once at its end.");
    for (int t = 0; t < n_tiers; t++)
        for (int n = 0; n < n_tenants; n++)
            for (int o = 0; o < SL_METRICS_N_OUTCOMES; o++) {
                uint64_t v = total(m, OFF_REQ +
                                          ((size_t)tiers[t] * N_TENANT + (size_t)tenants[n]) *
                                              SL_METRICS_N_OUTCOMES +
                                          (size_t)o);
                if (v == 0)
                    continue; /* only label sets that happened */
                LIT(out, "sluice:requests_total{tier=\"");
                append_value(out, label_name(&m->tiers, tiers[t]));
                LIT(out, "\",tenant=\"");
                append_value(out, label_name(&m->tenants, tenants[n]));
                sl_str_appendf(out, "\",outcome=\"%s\"} %" PRIu64 "\n", outcome_names[o], v);
            }
    render_slo(m, out, tiers, n_tiers, tenants, n_tenants);
    static const char *const tok_names[2] = {"sluice:prompt_tokens_total",
                                             "sluice:generation_tokens_total"};
    static const char *const tok_help[2] = {
        "Prompt tokens of requests handed to the engine, by tenant.",
        "Completion tokens generated, as reported in each response's usage, by tenant."};
    for (int k = 0; k < 2; k++) {
        family(out, tok_names[k], "counter", tok_help[k]);
        for (int n = 0; n < n_tenants; n++) {
            sl_str_appendf(out, "%s{tenant=\"", tok_names[k]);
            append_value(out, label_name(&m->tenants, tenants[n]));
            sl_str_appendf(out, "\"} %" PRIu64 "\n",
                           total(m, OFF_TOK + (size_t)tenants[n] * 2 + (size_t)k));
        }
    }
    family(out, "sluice:tenant_cost_total", "counter",
           "What requests handed to the engine cost, in the configuration's currency (prompt, "
           "cached and completion tokens and device time at the model's prices), by tenant and "
           "model.");
    for (int n = 0; n < n_tenants; n++)
        for (int k = 0; k < n_models; k++) {
            uint64_t v = total(m, OFF_COST + (size_t)tenants[n] * N_MODEL + (size_t)models[k]);
            if (v == 0)
                continue;
            char money[32];
            sl_usage_money_format((int64_t)v, money, sizeof money);
            LIT(out, "sluice:tenant_cost_total{tenant=\"");
            append_value(out, label_name(&m->tenants, tenants[n]));
            LIT(out, "\",model=\"");
            append_value(out, label_name(&m->models, models[k]));
            sl_str_appendf(out, "\"} %s\n", money);
        }
    family(out, "sluice:tenant_device_seconds_total", "counter",
           "Device time of requests handed to the engine (each forward's time divided over its "
           "requests by rows), by tenant.");
    for (int n = 0; n < n_tenants; n++) {
        LIT(out, "sluice:tenant_device_seconds_total{tenant=\"");
        append_value(out, label_name(&m->tenants, tenants[n]));
        sl_str_appendf(out, "\"} %.9f\n", (double)total(m, OFF_DEV + (size_t)tenants[n]) / 1e9);
    }
    for (int k = 0; k < N_HIST; k++)
        render_hist(m, out, (enum hist_kind)k, tiers, n_tiers);
    family(out, "sluice:http_requests_total", "counter",
           "HTTP requests by route and status code, each counted once when answered.");
    for (int r = 0; r < n_routes; r++)
        for (int c = 0; c < N_CODE; c++) {
            uint64_t v = total(m, OFF_HTTP + (size_t)routes[r] * N_CODE + (size_t)c);
            if (v == 0)
                continue;
            LIT(out, "sluice:http_requests_total{route=\"");
            append_value(out, label_name(&m->routes, routes[r]));
            if (c < N_CODE - 1)
                sl_str_appendf(out, "\",code=\"%d\"} %" PRIu64 "\n", c + 100, v);
            else
                sl_str_appendf(out, "\",code=\"" SL_METRICS_OTHER "\"} %" PRIu64 "\n", v);
        }
    family(out, "sluice:admission_decisions_total", "counter",
           "Admission decisions on inference requests by the tier they were classified into, "
           "decision (admitted, degraded, rejected) and reason (none, tenant_requests, "
           "tenant_tokens, tier_token_rate, tier_queue_requests, tier_queue_tokens, "
           "tier_ttft_slo).");
    for (int t = 0; t < n_tiers; t++)
        for (int d = 0; d < SL_ADMIT_N_DECISIONS; d++)
            for (int r = 0; r < SL_ADMIT_N_REASONS; r++) {
                uint64_t v = total(m, OFF_ADM +
                                          ((size_t)tiers[t] * SL_ADMIT_N_DECISIONS + (size_t)d) *
                                              SL_ADMIT_N_REASONS +
                                          (size_t)r);
                if (v == 0)
                    continue;
                LIT(out, "sluice:admission_decisions_total{tier=\"");
                append_value(out, label_name(&m->tiers, tiers[t]));
                sl_str_appendf(out, "\",decision=\"%s\",reason=\"%s\"} %" PRIu64 "\n",
                               decision_names[d], sl_admit_reason_str((enum sl_admit_reason)r), v);
            }
    if (n > 0) {
        struct sched_src src = {names, replicas, st, n};
        render_sched(out, &src);
    }
}

/* ---- /admin/stats ---- */

void sl_metrics_tier_json(struct sl_metrics *m, const struct sl_tier *cfg, uint64_t now_ns,
                          struct sl_str *out)
{
    const char *name = cfg->sched.name;
    int n_named = atomic_load_explicit(&m->tiers.n, memory_order_acquire);
    int tier = find(&m->tiers, n_named, name);
    int tenants[N_TENANT];
    int n_tenants = labels_present(&m->tenants, tenants);
    sl_str_appendf(out, "\"ttft_slo_ms\":%d,\"tpot_slo_ms\":%d,\"windows\":{",
                   cfg->sched.ttft_slo_ms, cfg->sched.tpot_slo_ms);
    /* Each window over the tier's tenants: their rings merged, one lock at a time. */
    for (int k = 0; k < SL_SLO_WINDOW_60M; k++) {
        struct sl_slo_acc acc;
        sl_slo_acc_init(&acc);
        for (int n = 0; tier >= 0 && n < n_tenants; n++) {
            struct slo_series *sr =
                atomic_load_explicit(&m->slo[slo_index(tier, tenants[n])], memory_order_acquire);
            if (!sr)
                continue;
            pthread_mutex_lock(&sr->lock);
            sl_slo_ring_accumulate(sr->ring, now_ns, (enum sl_slo_window)k, &acc);
            pthread_mutex_unlock(&sr->lock);
        }
        struct sl_slo_summary s;
        sl_slo_acc_summary(&acc, &s);
        sl_str_appendf(out, "%s\"%s\":", k ? "," : "", sl_slo_window_str((enum sl_slo_window)k));
        sl_slo_summary_json(out, &s);
    }
    LIT(out, "},\"decisions\":{");
    for (int d = 0; d < SL_ADMIT_N_DECISIONS; d++) {
        sl_str_appendf(out, "%s\"%s\":{", d ? "," : "", decision_names[d]);
        const char *sep = "";
        for (int r = 0; tier >= 0 && r < SL_ADMIT_N_REASONS; r++) {
            uint64_t v = total(m, OFF_ADM +
                                      ((size_t)tier * SL_ADMIT_N_DECISIONS + (size_t)d) *
                                          SL_ADMIT_N_REASONS +
                                      (size_t)r);
            if (v == 0)
                continue;
            sl_str_appendf(out, "%s\"%s\":%" PRIu64, sep,
                           sl_admit_reason_str((enum sl_admit_reason)r), v);
            sep = ",";
        }
        LIT(out, "}");
    }
    LIT(out, "}");
}
