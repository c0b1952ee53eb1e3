/* Admission control on the I/O threads: a tenant's budget, its tier's bucket and queue, the SLO
 * guard, and the tier's overload policy, decided before a request reaches a scheduler.
 *
 * Order: the tenant's requests and tokens per minute first (over budget is the client's doing,
 * refused as rate limited with the exact time to retry, and no overload policy applies); then
 * the tier: its token bucket, its queue caps (counted here, exactly, from admission to the first
 * token), and the SLO guard's prediction from the scheduler's published figures. A tier that
 * cannot take the request walks its overload policy in order: each step changes the request (a
 * cap, a demotion, a cheaper model) and the tier checks run again; "queue:MS" parks it (its
 * caller looks again at recheck_ns, on a timer that never blocks the thread) until its
 * deadline; "reject", or the end of the list, refuses it as overloaded, with a time to retry
 * from the predicted drain time.
 *
 * Everything a request takes it gives back in one place (sl_admit_end, once): the tokens it was
 * charged and did not use, its queue slot, its parking place; a request refused after its
 * tenant paid gets all of it back, since the server, not the client, said no.
 */
#include "admission_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS_PER_S 1000000000LL
#define NS_PER_MS 1000000LL
/* How often a parked request looks again when nothing says when room will come. */
#define RECHECK_NS (25 * NS_PER_MS)
/* Retry-After when nothing predicts a drain (a closed tier, a scheduler not measured yet). */
#define DEFAULT_RETRY_NS NS_PER_S

/* ---- cells: the state of one tenant or tier, shared across reloads by name ---- */

struct cell {
    atomic_int refs;
    char name[SL_TENANT_NAME_MAX + 1];
    struct sl_gcra_bucket requests; /* a tenant's rpm */
    struct sl_gcra_bucket tokens;   /* a tenant's tpm, a tier's token_rate */
    atomic_int queued[SL_ADMIT_MODELS_MAX];
    atomic_long queued_tokens[SL_ADMIT_MODELS_MAX];
    atomic_int parked;
    /* A tier's: guards its table by tenant (tq, n_tq) and its calibration (cal, cal_n). */
    pthread_mutex_t lock;
    /* A tier's queued prompt tokens by tenant, for the guard's prediction in a tier whose
     * tenants are served by virtual token counters: the tenants with requests counted in
     * queued_tokens (at most TQ_MAX; more share the last entry, named ""). Under lock. */
    struct tq_entry *tq; /* (TQ_MAX) made at the first use */
    int n_tq;
    /* A tier's calibration (sl_admit_first_token), under lock: actual ÷ predicted TTFT of its
     * recent requests, counted in CAL_BINS log-spaced bins from 1/4 to 4 (8 a doubling), halved
     * whenever they reach CAL_KEEP so that the recent count most. */
    int cal[32];
    int cal_n;
    /* A tenant's money budget: spent in the period that starts at period_start (unix seconds;
     * INT64_MAX until the first request reads it from the ledger), reservations of requests in
     * flight included; warned: the period whose soft threshold was logged. */
    _Atomic int64_t spent, period_start, warned;
};

struct sl_admit_state {
    int n_tenants, n_tiers;
    struct cell **tenants; /* (n_tenants) NULL for a tenant without limits */
    struct cell **tiers;   /* (n_tiers) */
};

#define TQ_MAX 64

struct tq_entry {
    char name[SL_TENANT_NAME_MAX + 1];
    float share;
    int requests[SL_ADMIT_MODELS_MAX];
    long tokens[SL_ADMIT_MODELS_MAX];
};

static struct cell *cell_new(const char *name, int64_t now)
{
    struct cell *c = sl_xcalloc(1, sizeof *c);
    atomic_init(&c->refs, 1);
    snprintf(c->name, sizeof c->name, "%s", name);
    sl_gcra_bucket_init(&c->requests, now);
    sl_gcra_bucket_init(&c->tokens, now);
    for (int m = 0; m < SL_ADMIT_MODELS_MAX; m++) {
        atomic_init(&c->queued[m], 0);
        atomic_init(&c->queued_tokens[m], 0);
    }
    atomic_init(&c->parked, 0);
    pthread_mutex_init(&c->lock, NULL);
    atomic_init(&c->spent, 0);
    atomic_init(&c->period_start, INT64_MAX);
    atomic_init(&c->warned, INT64_MIN);
    return c;
}

static struct cell *cell_ref(struct cell *c)
{
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
    return c;
}

static void cell_unref(struct cell *c)
{
    if (c && atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_destroy(&c->lock);
        free(c->tq);
        free(c);
    }
}

void sl_admit_state_free(struct sl_admit_state *adm)
{
    if (!adm)
        return;
    for (int i = 0; i < adm->n_tenants; i++)
        cell_unref(adm->tenants[i]);
    for (int i = 0; i < adm->n_tiers; i++)
        cell_unref(adm->tiers[i]);
    free(adm->tenants);
    free(adm->tiers);
    free(adm);
}

static struct sl_gcra_rate per_minute(long long n)
{
    return (struct sl_gcra_rate){.limit = n, .period_ns = 60 * NS_PER_S, .burst = n};
}

static struct sl_gcra_rate tier_rate(const struct sl_tier *t)
{
    return (struct sl_gcra_rate){.limit = t->token_rate, .period_ns = NS_PER_S, .burst = t->burst};
}

static bool has_limits(const struct sl_tenant *t)
{
    return t && (t->rpm > 0 || t->tpm > 0 || t->budget > 0);
}

/* The rate a request's bucket is charged at: the configured one, or, when the request was decided
 * locally because Redis did not answer, this replica's share of it: the same limit over
 * `replicas` times the period, and the burst divided likewise (rounded up). A local bucket set
 * to the fleet's state (sl_gcra_bucket_set) then holds the fleet's remaining tokens ÷ replicas.
 * A request larger than the share's burst may pass only when the share is full (the burst is
 * then its cost, never more than the whole burst), so it is not refused for ever. */
static struct sl_gcra_rate share(const struct sl_admit *a, struct sl_gcra_rate r, int64_t cost)
{
    if (!a->local || a->replicas <= 1)
        return r;
    int64_t n = a->replicas;
    int64_t part = (r.burst + n - 1) / n, whole = cost < r.burst ? cost : r.burst;
    r.period_ns *= n;
    r.burst = part > whole ? part : whole;
    return r;
}

/* Name → index of the previous configuration's tenants with cells: open addressing, so a reload
 * of 100,000 tenants does not compare every pair. */
struct name_map {
    int *slot; /* (cap) tenant index + 1, 0 = empty */
    size_t cap;
};

static uint64_t hash_name(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static void map_build(struct name_map *m, const struct sl_tenancy *prev)
{
    m->cap = 16;
    while (m->cap < 2 * (size_t)prev->n_tenants)
        m->cap *= 2;
    m->slot = sl_xcalloc(m->cap, sizeof *m->slot);
    for (int i = 0; i < prev->n_tenants; i++) {
        if (!prev->state->tenants[i])
            continue;
        size_t k = hash_name(prev->tenants[i].name) & (m->cap - 1);
        while (m->slot[k])
            k = (k + 1) & (m->cap - 1);
        m->slot[k] = i + 1;
    }
}

static int map_find(const struct name_map *m, const struct sl_tenancy *prev, const char *name)
{
    size_t k = hash_name(name) & (m->cap - 1);
    for (; m->slot[k]; k = (k + 1) & (m->cap - 1))
        if (strcmp(prev->tenants[m->slot[k] - 1].name, name) == 0)
            return m->slot[k] - 1;
    return -1;
}

void sl_admit_adopt(struct sl_tenancy *next, const struct sl_tenancy *prev, int64_t now_ns)
{
    if (next->state)
        return;
    if (prev && !prev->state)
        prev = NULL;
    struct sl_admit_state *adm = sl_xcalloc(1, sizeof *adm);
    adm->n_tenants = next->n_tenants;
    adm->n_tiers = next->n_tiers;
    adm->tenants = sl_xcalloc((size_t)(next->n_tenants ? next->n_tenants : 1), sizeof(void *));
    adm->tiers = sl_xcalloc((size_t)next->n_tiers, sizeof(void *));
    struct name_map map = {0};
    if (prev)
        map_build(&map, prev);
    for (int i = 0; i < next->n_tenants; i++) {
        const struct sl_tenant *t = &next->tenants[i];
        if (!has_limits(t))
            continue;
        int o = prev ? map_find(&map, prev, t->name) : -1;
        if (o < 0) {
            adm->tenants[i] = cell_new(t->name, now_ns);
            continue;
        }
        struct cell *c = cell_ref(prev->state->tenants[o]);
        const struct sl_tenant *pt = &prev->tenants[o];
        /* A limit that appears starts full; one that changes keeps its debt in tokens. */
        struct sl_gcra_rate a, b;
        if (t->rpm && pt->rpm) {
            a = per_minute(pt->rpm), b = per_minute(t->rpm);
            sl_gcra_bucket_rescale(&c->requests, &a, &b, now_ns);
        } else if (t->rpm) {
            sl_gcra_bucket_init(&c->requests, now_ns);
        }
        if (t->tpm && pt->tpm) {
            a = per_minute(pt->tpm), b = per_minute(t->tpm);
            sl_gcra_bucket_rescale(&c->tokens, &a, &b, now_ns);
        } else if (t->tpm) {
            sl_gcra_bucket_init(&c->tokens, now_ns);
        }
        adm->tenants[i] = c;
    }
    free(map.slot);
    for (int i = 0; i < next->n_tiers; i++) {
        const struct sl_tier *t = &next->tiers[i];
        const struct sl_tier *pt = NULL;
        struct cell *c = NULL;
        for (int o = 0; prev && o < prev->n_tiers && !c; o++)
            if (strcmp(prev->tiers[o].sched.name, t->sched.name) == 0) {
                c = cell_ref(prev->state->tiers[o]);
                pt = &prev->tiers[o];
            }
        if (!c) {
            c = cell_new(t->sched.name, now_ns);
        } else if (t->token_rate && pt->token_rate) {
            struct sl_gcra_rate a = tier_rate(pt), b = tier_rate(t);
            sl_gcra_bucket_rescale(&c->tokens, &a, &b, now_ns);
        } else if (t->token_rate) {
            sl_gcra_bucket_init(&c->tokens, now_ns);
        }
        adm->tiers[i] = c;
    }
    next->state = adm;
}

void sl_admit_queue(const struct sl_tenancy *cfg, int tier, int model, int *requests, long *tokens)
{
    *requests = 0;
    *tokens = 0;
    if (!cfg->state || tier < 0 || tier >= cfg->state->n_tiers || model < 0 ||
        model >= SL_ADMIT_MODELS_MAX)
        return;
    struct cell *c = cfg->state->tiers[tier];
    *requests = atomic_load_explicit(&c->queued[model], memory_order_relaxed);
    *tokens = atomic_load_explicit(&c->queued_tokens[model], memory_order_relaxed);
}

/* ---- words ---- */

static const char *const reason_names[SL_ADMIT_N_REASONS] = {
    [SL_ADMIT_REASON_NONE] = "none",
    [SL_ADMIT_REASON_TENANT_REQUESTS] = "tenant_requests",
    [SL_ADMIT_REASON_TENANT_TOKENS] = "tenant_tokens",
    [SL_ADMIT_REASON_TIER_TOKEN_RATE] = "tier_token_rate",
    [SL_ADMIT_REASON_TIER_QUEUE_REQUESTS] = "tier_queue_requests",
    [SL_ADMIT_REASON_TIER_QUEUE_TOKENS] = "tier_queue_tokens",
    [SL_ADMIT_REASON_TIER_TTFT_SLO] = "tier_ttft_slo",
    [SL_ADMIT_REASON_TENANT_BUDGET] = "tenant_budget",
};

const char *sl_admit_reason_str(enum sl_admit_reason r)
{
    return (int)r >= 0 && r < SL_ADMIT_N_REASONS ? reason_names[r] : "none";
}

const char *sl_overload_kind_str(enum sl_overload_kind k)
{
    static const char *const names[SL_OVERLOAD_N_KINDS] = {
        [SL_OVERLOAD_CAP_MAX_TOKENS] = "cap_max_tokens",
        [SL_OVERLOAD_DEMOTE] = "demote",
        [SL_OVERLOAD_MODEL] = "model",
        [SL_OVERLOAD_QUEUE] = "queue",
        [SL_OVERLOAD_REJECT] = "reject",
    };
    return (int)k >= 0 && k < SL_OVERLOAD_N_KINDS ? names[k] : "reject";
}

static void note_add(struct sl_admit *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Appends "; what" to the degradation note ("degraded; cap_max_tokens=256; demote=batch"). */
static void note_add(struct sl_admit *a, const char *fmt, ...)
{
    size_t n = strlen(a->note);
    if (!a->degraded) {
        n = (size_t)snprintf(a->note, sizeof a->note, "degraded");
        a->degraded = true;
    }
    if (n + 2 >= sizeof a->note)
        return;
    a->note[n++] = ';';
    a->note[n++] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->note + n, sizeof a->note - n, fmt, ap);
    va_end(ap);
}

/* ---- the tier's checks ---- */

/* The scheduler's index of the tier named like cfg's tier i (the same index unless a reload is
 * on its way to the scheduler), or -1. */
static int stats_tier(const struct sl_sched_stats *st, const char *name, int hint)
{
    if (hint >= 0 && hint < st->n_tiers && strcmp(st->tiers[hint].name, name) == 0)
        return hint;
    for (int i = 0; i < st->n_tiers && i < SL_SCHED_MAX_TIERS; i++)
        if (strcmp(st->tiers[i].name, name) == 0)
            return i;
    return -1;
}

static int64_t choices(const struct sl_admit *a)
{
    return a->n > 1 ? a->n : 1;
}

/* Sequences per choice index: one per prompt. */
static int64_t prompts(const struct sl_admit *a)
{
    return a->prompts > 1 ? a->prompts : 1;
}

/* Tokens the request may use: every choice's prompt and max_tokens. */
static int64_t charge(const struct sl_admit *a)
{
    return choices(a) * ((int64_t)a->n_prompt + prompts(a) * a->max_tokens);
}

/* Prompt tokens it puts in the queue: each choice prefills the prompt, less what the prefix
 * cache is predicted to give it. The guard predicts a TTFT from this: a long prompt that is mostly
 * cached waits only for the part it computes. Choices of one prompt started together each compute
 * what was not cached before them (the scheduler shares only blocks already written). */
static long prompt_work(const struct sl_admit *a)
{
    int cached = a->n_cached < 0 ? 0 : a->n_cached > a->n_prompt ? a->n_prompt : a->n_cached;
    return (long)(choices(a) * (a->n_prompt - cached));
}

/* Counts (sign +1) or uncounts (-1) a request of tenant t with n prompt tokens for model m in
 * tier cell c's table by tenant. */
static void tq_count(struct cell *c, const struct sl_tenant *t, int m, long n, int sign)
{
    const char *name = t ? t->name : sl_tenant_anonymous.name;
    pthread_mutex_lock(&c->lock);
    if (!c->tq)
        c->tq = sl_xcalloc(TQ_MAX, sizeof *c->tq);
    int i = 0, others = -1;
    for (; i < c->n_tq && strcmp(c->tq[i].name, name) != 0; i++)
        if (!c->tq[i].name[0])
            others = i;
    if (i == c->n_tq && sign < 0) { /* counted among the others, if anywhere */
        if (others < 0) {
            pthread_mutex_unlock(&c->lock);
            return;
        }
        i = others;
    } else if (i == c->n_tq && c->n_tq == TQ_MAX) {
        /* The table is full: the last entry becomes the others' (its tenant's requests are
         * uncounted from there too). */
        i = others >= 0 ? others : TQ_MAX - 1;
        c->tq[i].name[0] = '\0';
    } else if (i == c->n_tq) {
        memset(&c->tq[i], 0, sizeof c->tq[i]);
        snprintf(c->tq[i].name, sizeof c->tq[i].name, "%s", name);
        c->n_tq++;
    }
    struct tq_entry *e = &c->tq[i];
    e->share = t && t->share > 0 ? t->share : 1;
    e->requests[m] += sign;
    e->tokens[m] += sign * n;
    bool empty = true;
    for (int k = 0; k < SL_ADMIT_MODELS_MAX; k++)
        empty &= e->requests[k] <= 0;
    if (empty) { /* its place goes to the last one */
        c->tq[i] = c->tq[c->n_tq - 1];
        c->n_tq--;
    }
    pthread_mutex_unlock(&c->lock);
}

/* The prompt tokens ahead of a request of tenant t (n of its own, counted in the table when
 * self) in tier cell c for model m, when the tier serves its tenants by virtual token counters:
 * its tenant's own queue, and of each other tenant's at most as much as t's share of the time
 * lets through while t's own work drains, min(Q_v, (Q_t + n) x share_v / share_t) (generalised
 * processor sharing between the tier's tenants). Returns the tokens counted in the table
 * altogether in *total. */
static long tq_ahead(struct cell *c, const struct sl_tenant *t, int m, long n, bool self,
                     long *total)
{
    const char *name = t ? t->name : sl_tenant_anonymous.name;
    double share = t && t->share > 0 ? t->share : 1;
    pthread_mutex_lock(&c->lock);
    long own = self ? -n : 0, all = 0;
    for (int i = 0; i < c->n_tq; i++) {
        all += c->tq[i].tokens[m];
        if (strcmp(c->tq[i].name, name) == 0)
            own += c->tq[i].tokens[m];
    }
    own = own > 0 ? own : 0;
    double ahead = (double)own;
    for (int i = 0; i < c->n_tq; i++)
        if (strcmp(c->tq[i].name, name) != 0)
            ahead += fmin((double)c->tq[i].tokens[m], (double)(own + n) * c->tq[i].share / share);
    pthread_mutex_unlock(&c->lock);
    *total = all - (self ? n : 0);
    return (long)ceil(ahead);
}

#define CAL_BINS 32
#define CAL_PER_DOUBLING 8
#define CAL_KEEP 1000

static void cal_observe(struct cell *c, double ratio)
{
    int b = (int)floor(log2(ratio) * CAL_PER_DOUBLING) + CAL_BINS / 2;
    b = b < 0 ? 0 : b >= CAL_BINS ? CAL_BINS - 1 : b;
    pthread_mutex_lock(&c->lock);
    c->cal[b]++;
    if (++c->cal_n >= CAL_KEEP) {
        c->cal_n = 0;
        for (int i = 0; i < CAL_BINS; i++)
            c->cal_n += c->cal[i] /= 2;
    }
    pthread_mutex_unlock(&c->lock);
}

/* The factor the tier's predictions are multiplied by: the upper edge of the bin holding the
 * SL_GUARD_CALIBRATION_Q quantile of actual ÷ predicted, at least 1; 1 until there are enough. */
static double cal_factor(struct cell *c)
{
    pthread_mutex_lock(&c->lock);
    double f = 1;
    if (c->cal_n >= SL_GUARD_CALIBRATION_MIN_OBS) {
        int want = (int)ceil(SL_GUARD_CALIBRATION_Q * c->cal_n), seen = 0, b = 0;
        while (b < CAL_BINS - 1 && (seen += c->cal[b]) < want)
            b++;
        f = fmax(1, exp2((double)(b + 1 - CAL_BINS / 2) / CAL_PER_DOUBLING));
    }
    pthread_mutex_unlock(&c->lock);
    return f;
}

void sl_admit_first_token(struct sl_admit *a, double ttft_s)
{
    struct cell *c = a->queue_cell;
    if (!c || a->raw_ttft_s < SL_GUARD_CALIBRATION_MIN_S || !(ttft_s >= 0))
        return;
    cal_observe(c, ttft_s / a->raw_ttft_s);
    a->raw_ttft_s = -1; /* once */
}

/* The guard's prediction for the request as it is now; false when there is none (no scheduler
 * figures yet). queued_self: its own prompt is already counted in its tier's queue here. */
static bool predict(struct sl_admit *a, const struct sl_admit_env *env, bool queued_self,
                    struct sl_guard_prediction *p)
{
    const struct sl_tenancy *cfg = a->tenancy;
    struct sl_sched_stats st;
    memset(&st, 0, sizeof st);
    env->stats(env->ctx, a->model, &st);
    int si = stats_tier(&st, cfg->tiers[a->tier].sched.name, a->tier);
    if (si < 0)
        return false;
    /* Prompts admitted here since the scheduler's latest publication are not in its figures
     * yet: a burst between two steps would otherwise all see the same empty queue. */
    long q[SL_SCHED_MAX_TIERS];
    for (int i = 0; i < st.n_tiers && i < SL_SCHED_MAX_TIERS; i++) {
        q[i] = st.tiers[i].queued_prompt_tokens;
        int ci =
            i < cfg->n_tiers && strcmp(cfg->tiers[i].sched.name, st.tiers[i].name) == 0 ? i : -1;
        for (int k = 0; ci < 0 && k < cfg->n_tiers; k++)
            if (strcmp(cfg->tiers[k].sched.name, st.tiers[i].name) == 0)
                ci = k;
        if (ci < 0)
            continue;
        struct cell *c = cfg->state->tiers[ci];
        long mine = atomic_load_explicit(&c->queued_tokens[a->model], memory_order_relaxed);
        if (i == si && queued_self)
            mine -= prompt_work(a);
        if (mine > q[i])
            q[i] = mine;
        if (i == si && cfg->tiers[ci].sched.fairness == SL_SCHED_VTC) {
            /* Its tenant waits for its own queue and a fair share of the others'; what the
             * table does not account for (prompts it never saw) counts as ahead, as in FCFS. */
            long total;
            long ahead = tq_ahead(c, a->tenant, a->model, prompt_work(a), queued_self, &total);
            q[i] = ahead + (q[i] > total ? q[i] - total : 0);
        }
    }
    if (sl_guard_predict_ttft(&st, q, si, prompt_work(a), p) != SL_OK)
        return false;
    /* As late as the tier's recent requests came against their predictions. */
    a->raw_ttft_s = p->ttft_s;
    double f = cal_factor(cfg->state->tiers[a->tier]);
    p->ttft_s *= f;
    p->prefill_s *= f;
    return true;
}

/* Counts the request in its tier's queue for its model, within the caps. */
static enum sl_admit_reason queue_reserve(struct cell *c, const struct sl_tier *t, int m, long n)
{
    if (t->max_queue_requests >= 0) {
        int q = atomic_load_explicit(&c->queued[m], memory_order_relaxed);
        do {
            if (q >= t->max_queue_requests)
                return SL_ADMIT_REASON_TIER_QUEUE_REQUESTS;
        } while (!atomic_compare_exchange_weak_explicit(
            &c->queued[m], &q, q + 1, memory_order_relaxed, memory_order_relaxed));
    } else {
        atomic_fetch_add_explicit(&c->queued[m], 1, memory_order_relaxed);
    }
    if (t->max_queue_tokens >= 0) {
        long q = atomic_load_explicit(&c->queued_tokens[m], memory_order_relaxed);
        do {
            /* An empty queue takes any one prompt, so a prompt over the cap is not refused for
             * ever. */
            if (q > 0 && q + n > t->max_queue_tokens) {
                atomic_fetch_sub_explicit(&c->queued[m], 1, memory_order_relaxed);
                return SL_ADMIT_REASON_TIER_QUEUE_TOKENS;
            }
        } while (!atomic_compare_exchange_weak_explicit(
            &c->queued_tokens[m], &q, q + n, memory_order_relaxed, memory_order_relaxed));
    } else {
        atomic_fetch_add_explicit(&c->queued_tokens[m], n, memory_order_relaxed);
    }
    return SL_ADMIT_REASON_NONE;
}

static void queue_release(struct cell *c, int m, long n)
{
    atomic_fetch_sub_explicit(&c->queued[m], 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&c->queued_tokens[m], n, memory_order_relaxed);
}

static int64_t secs_ns(double s)
{
    return s > 0 ? (int64_t)ceil(s * 1e9) : 0;
}

/* The tier's bucket had no room for cost tokens: when to retry (-1: never) and why. */
static enum sl_admit_reason tier_refused_why(struct sl_admit *a, int64_t retry_ns, int64_t cost)
{
    const struct sl_tier *t = &a->tenancy->tiers[a->tier];
    a->retry_ns = retry_ns;
    if (retry_ns < 0)
        snprintf(a->why, sizeof a->why,
                 "The request's %lld tokens (prompt plus max_tokens) are more than tier '%s' "
                 "admits at once (%lld); reduce the prompt or max_tokens.",
                 (long long)cost, t->sched.name, t->burst);
    else
        snprintf(a->why, sizeof a->why,
                 "Tier '%s' is at its token rate (%lld tokens/s) and is overloaded.", t->sched.name,
                 t->token_rate);
    return SL_ADMIT_REASON_TIER_TOKEN_RATE;
}

/* Whether the request, as it is now, fits its tier: the bucket, the queue caps, the guard. On
 * success it holds the tier's tokens and a queue slot; on failure nothing, and a->retry_ns and
 * a->why say when and why. */
static enum sl_admit_reason try_tier(struct sl_admit *a, const struct sl_admit_env *env,
                                     int64_t now)
{
    const struct sl_tenancy *cfg = a->tenancy;
    const struct sl_tier *t = &cfg->tiers[a->tier];
    struct cell *c = cfg->state->tiers[a->tier];
    int64_t cost = charge(a);
    struct sl_gcra_rate rate = share(a, tier_rate(t), cost);
    bool took = false;
    if (t->token_rate > 0 && (!a->fleet || a->local)) { /* else the fleet's take charges it */
        struct sl_gcra_view v;
        if (!sl_gcra_bucket_take(&c->tokens, &rate, now, cost, &v))
            return tier_refused_why(a, v.retry_ns, cost);
        took = true;
    }
    enum sl_admit_reason r = queue_reserve(c, t, a->model, prompt_work(a));
    if (r == SL_ADMIT_REASON_NONE)
        tq_count(c, a->tenant, a->model, prompt_work(a), 1);
    if (r != SL_ADMIT_REASON_NONE) {
        if (took)
            sl_gcra_bucket_refund(&c->tokens, &rate, now, cost);
        /* Room comes as the queue's first tokens come: about the time the queue ahead takes. */
        struct sl_guard_prediction p;
        a->retry_ns = DEFAULT_RETRY_NS;
        if (t->max_queue_requests != 0 && predict(a, env, false, &p) && p.prefill_s > 0)
            a->retry_ns = secs_ns(p.prefill_s);
        snprintf(a->why, sizeof a->why, "Tier '%s' has its queue full (%s) and is overloaded.",
                 t->sched.name,
                 r == SL_ADMIT_REASON_TIER_QUEUE_REQUESTS ? "max_queue_requests"
                                                          : "max_queue_tokens");
        return r;
    }
    struct sl_guard_prediction p;
    if (predict(a, env, true, &p)) {
        a->predicted_ttft_s = p.ttft_s;
        double slo = t->sched.ttft_slo_ms / 1e3, over = sl_guard_over_s(&p, slo);
        if (over > 0) {
            queue_release(c, a->model, prompt_work(a));
            tq_count(c, a->tenant, a->model, prompt_work(a), -1);
            if (took)
                sl_gcra_bucket_refund(&c->tokens, &rate, now, cost);
            a->retry_ns = secs_ns(over);
            snprintf(a->why, sizeof a->why,
                     "Tier '%s' is overloaded: the predicted time to first token, %.1f s, is over "
                     "its objective of %.1f s.",
                     t->sched.name, p.ttft_s, slo);
            return SL_ADMIT_REASON_TIER_TTFT_SLO;
        }
    }
    a->tier_cell = c;
    a->tier_tokens = took ? cost : 0;
    a->queue_cell = c;
    a->queue_model = a->model;
    a->queue_tokens = prompt_work(a);
    a->queued = true;
    a->active = true;
    return SL_ADMIT_REASON_NONE;
}

/* ---- money ---- */

/* The tenant's budget: the request's worst case (every prompt token uncached, max_tokens of
 * every choice generated, no device time) reserved against what its period has left. The first
 * request of a period reads what the ledger has recorded in it. False, with why and when the
 * period resets, when the worst case does not fit. */
/* The budget's period at env's clock and the request's worst case (every prompt token uncached,
 * max_tokens of every choice generated, no device time). False when the tenant has none (or the
 * caller gives no prices). */
static bool budget_plan(struct sl_admit *a, const struct sl_admit_env *env, int64_t *start,
                        int64_t *end, int64_t *worst)
{
    const struct sl_tenant *t = a->tenant;
    a->budget_used = -1;
    if (t->budget <= 0 || !env->price || !env->spent)
        return false;
    sl_usage_period_bounds((enum sl_usage_period)t->budget_period, t->budget_month_day, env->unix_s,
                           start, end);
    *worst = sl_usage_worst_case(env->price(env->ctx, a->model), choices(a) * a->n_prompt,
                                 choices(a) * prompts(a) * a->max_tokens);
    return true;
}

/* Refused: spent of budget is used, worst would not fit. */
static void budget_refuse(struct sl_admit *a, int64_t spent_now, int64_t budget, int64_t worst,
                          int64_t retry_ns)
{
    const struct sl_tenant *t = a->tenant;
    char spent[32], whole[32], most[32];
    sl_usage_money_format(spent_now, spent, sizeof spent);
    sl_usage_money_format(budget, whole, sizeof whole);
    sl_usage_money_format(worst, most, sizeof most);
    a->reason = SL_ADMIT_REASON_TENANT_BUDGET;
    a->budget_used = (double)spent_now / (double)t->budget;
    bool total = t->budget_period == SL_USAGE_TOTAL;
    a->retry_ns = total ? -1 : retry_ns;
    snprintf(a->why, sizeof a->why,
             "Tenant '%s' has used %s of its budget of %s%s%s, and this request may cost up to "
             "%s%s",
             t->name, spent, whole, total ? "" : " for this ",
             total ? "" : sl_usage_period_name((enum sl_usage_period)t->budget_period), most,
             total ? "; the budget does not reset."
                   : ". It resets with the next period (see "
                     "Retry-After).");
}

/* Reserved: the period's spend is now spent_after; the soft threshold's warning, and its first
 * crossing in the period on this replica (the log line, the webhook). */
static void budget_mark(struct sl_admit *a, struct cell *c, int64_t spent_after, int64_t start)
{
    const struct sl_tenant *t = a->tenant;
    if (a->budget_fleet) { /* the fleet's latest count, for /v1/usage and the gauges */
        atomic_store_explicit(&c->period_start, start, memory_order_release);
        atomic_store_explicit(&c->spent, spent_after, memory_order_relaxed);
    }
    a->budget_period_start = start;
    a->budget_spent = spent_after;
    a->budget_used = (double)spent_after / (double)t->budget;
    a->budget_warn = a->budget_used * 100.0 >= (double)t->budget_soft_pct;
    int64_t w = atomic_load_explicit(&c->warned, memory_order_relaxed);
    a->budget_crossed =
        a->budget_warn && w != start && atomic_compare_exchange_strong(&c->warned, &w, start);
    if (a->budget_crossed)
        sl_log(SL_LOG_WARN,
               "budget: tenant '%s' has used %.0f%% of its budget (soft_pct %d) for this %s",
               t->name, a->budget_used * 100.0, t->budget_soft_pct,
               sl_usage_period_name((enum sl_usage_period)t->budget_period));
}

/* The tenant's budget on this replica: the worst case reserved against what its period has
 * left (share: the budget divided by it, for a replica deciding alone while Redis is away). The
 * first request of a period reads what the ledger has recorded in it. False, with why and when
 * the period resets, when it does not fit. */
static bool budget_take(struct sl_admit *a, const struct sl_admit_env *env, int share)
{
    const struct sl_tenant *t = a->tenant;
    int64_t start, end, worst;
    if (!budget_plan(a, env, &start, &end, &worst))
        return true;
    struct cell *c = a->tenant_cell;
    int64_t seen = atomic_load_explicit(&c->period_start, memory_order_acquire);
    if (seen != start && atomic_compare_exchange_strong(&c->period_start, &seen, start))
        atomic_store(&c->spent, env->spent(env->ctx, t->name, start, end));
    int64_t budget = t->budget / (share > 1 ? share : 1);
    int64_t s = atomic_load_explicit(&c->spent, memory_order_relaxed);
    do {
        if (s > budget - worst) {
            /* A total budget ends at INT64_MAX: no retry time (nor any product to overflow). */
            budget_refuse(a, s, budget, worst,
                          end == INT64_MAX ? -1 : (end - env->unix_s) * NS_PER_S);
            return false;
        }
    } while (!atomic_compare_exchange_weak_explicit(&c->spent, &s, s + worst, memory_order_relaxed,
                                                    memory_order_relaxed));
    a->budget_held = true;
    a->budget_cell = c;
    a->budget_reserved = worst;
    budget_mark(a, c, s + worst, start);
    return true;
}

/* The request's end: its reservation becomes what it cost (in the period it was reserved in;
 * a request that ends in the next period adds its cost to that one, as the ledger does). */
static void budget_settle(struct sl_admit *a, int64_t cost)
{
    if (a->budget_fleet_held) { /* Redis holds it: the refund settles it there */
        a->budget_fleet_held = false;
        a->refund_budget = cost - a->budget_reserved;
        a->refund_budget_pending = true;
    }
    if (!a->budget_held)
        return;
    a->budget_held = false;
    struct cell *c = a->budget_cell;
    int64_t now_start = atomic_load_explicit(&c->period_start, memory_order_acquire);
    int64_t delta = now_start == a->budget_period_start ? cost - a->budget_reserved : cost;
    atomic_fetch_add_explicit(&c->spent, delta, memory_order_relaxed);
}

static enum sl_admit_verdict over_budget(struct sl_admit *a)
{
    a->tenant_cell = NULL;
    a->active = false;
    a->verdict = SL_ADMIT_OVER_BUDGET;
    snprintf(a->note, sizeof a->note, "rejected; reason=tenant_budget");
    return a->verdict;
}

/* ---- giving back ---- */

static void tenant_refund(struct sl_admit *a, int64_t tokens, bool request, int64_t now)
{
    struct cell *c = a->tenant_cell;
    if (!c)
        return;
    const struct sl_tenant *t = a->tenant;
    if (tokens > 0 && t->tpm > 0 && a->tenant_tokens > 0) {
        if (tokens > a->tenant_tokens)
            tokens = a->tenant_tokens;
        struct sl_gcra_rate r = share(a, per_minute(t->tpm), 0);
        sl_gcra_bucket_refund(&c->tokens, &r, now, tokens);
        a->tenant_tokens -= tokens;
    }
    if (request && a->took_request) {
        struct sl_gcra_rate r = share(a, per_minute(t->rpm), 0);
        sl_gcra_bucket_refund(&c->requests, &r, now, 1);
        a->took_request = false;
    }
}

static void unpark(struct sl_admit *a)
{
    struct cell *c = a->park_cell;
    if (c) {
        atomic_fetch_sub_explicit(&c->parked, 1, memory_order_relaxed);
        a->park_cell = NULL;
    }
}

void sl_admit_started(struct sl_admit *a)
{
    if (!a->queued)
        return;
    a->queued = false;
    queue_release(a->queue_cell, a->queue_model, a->queue_tokens);
    tq_count(a->queue_cell, a->tenant, a->queue_model, a->queue_tokens, -1);
}

void sl_admit_end(struct sl_admit *a, int n_generated, int64_t now_ns)
{
    /* A reservation is released whatever else the request held (a refusal holds nothing). */
    budget_settle(a, n_generated < 0 ? 0 : a->cost);
    if (!a->active)
        return;
    a->active = false;
    sl_admit_started(a);
    unpark(a);
    /* Tokens charged and not used; a request that never reached the engine used none and, the
     * server having held it, does not count against the tenant's requests either. */
    bool never_ran = n_generated < 0;
    int64_t used = never_ran ? 0 : choices(a) * a->n_prompt + n_generated;
    if (a->fleet_charged) {
        /* Held in Redis: the caller sends it back (sl_admit_fleet_refund). */
        a->refund_request = never_ran && a->took_request;
        a->refund_tenant_tokens = a->tenant_tokens > used ? a->tenant_tokens - used : 0;
        a->refund_tier_tokens = a->tier_tokens > used ? a->tier_tokens - used : 0;
        a->took_request = false;
        a->tenant_tokens = a->tier_tokens = 0;
        a->tier_cell = NULL;
        return;
    }
    if (a->tenant_tokens > used)
        tenant_refund(a, a->tenant_tokens - used, never_ran, now_ns);
    else if (never_ran)
        tenant_refund(a, 0, true, now_ns);
    struct cell *c = a->tier_cell;
    if (c && a->tier_tokens > used) {
        const struct sl_tier *t = &a->tenancy->tiers[a->tier];
        struct sl_gcra_rate r = share(a, tier_rate(t), 0);
        sl_gcra_bucket_refund(&c->tokens, &r, now_ns, a->tier_tokens - used);
    }
    a->tier_tokens = 0;
    a->tier_cell = NULL;
}

/* ---- decisions ---- */

void sl_admit_init(struct sl_admit *a)
{
    memset(a, 0, sizeof *a);
    a->predicted_ttft_s = -1;
    a->raw_ttft_s = -1;
}

static enum sl_admit_verdict admitted(struct sl_admit *a)
{
    a->verdict = SL_ADMIT_OK;
    if (!a->degraded) {
        snprintf(a->note, sizeof a->note, "admitted");
        a->reason = SL_ADMIT_REASON_NONE;
    }
    return a->verdict;
}

/* The fleet's buckets a request touches, in the order of its take. */
enum bucket_kind { BUCKET_REQUESTS, BUCKET_TOKENS, BUCKET_TIER, BUCKET_BUDGET };

static int fleet_kinds(const struct sl_admit *a, enum bucket_kind k[SL_FLEET_BUCKETS_MAX])
{
    int n = 0;
    if (a->tenant_cell && a->tenant->rpm > 0)
        k[n++] = BUCKET_REQUESTS;
    if (a->tenant_cell && a->tenant->tpm > 0)
        k[n++] = BUCKET_TOKENS;
    if (a->tenancy->tiers[a->tier].token_rate > 0)
        k[n++] = BUCKET_TIER;
    if (a->budget_fleet && a->tenant_cell)
        k[n++] = BUCKET_BUDGET;
    return n;
}

/* The request passed this replica's checks: admitted, unless the fleet's buckets are still to be
 * charged (SL_ADMIT_FLEET). A parked request leaves its place once admitted. */
static enum sl_admit_verdict passed(struct sl_admit *a, int64_t now)
{
    enum bucket_kind k[SL_FLEET_BUCKETS_MAX];
    if (a->fleet && !a->local && !a->fleet_charged && fleet_kinds(a, k) > 0) {
        a->verdict = SL_ADMIT_FLEET;
        return a->verdict;
    }
    if (a->park_cell) {
        unpark(a);
        a->degraded_by |= 1u << SL_OVERLOAD_QUEUE;
        note_add(a, "queued_ms=%lld", (long long)((now - a->park_start_ns) / NS_PER_MS));
    }
    return admitted(a);
}

/* The verdict, noted "; budget=local" when the request was decided on this replica's share. */
static enum sl_admit_verdict decided(struct sl_admit *a, enum sl_admit_verdict v)
{
    static const char mark[] = "; budget=local";
    size_t n = strlen(a->note);
    if (a->local && !strstr(a->note, mark) && n + sizeof mark <= sizeof a->note)
        memcpy(a->note + n, mark, sizeof mark);
    return v;
}

/* Refused on the tenant's budget: the client's doing, no overload policy applies. */
static enum sl_admit_verdict limited(struct sl_admit *a)
{
    a->tenant_cell = NULL;
    a->active = false;
    a->verdict = SL_ADMIT_RATE_LIMITED;
    snprintf(a->note, sizeof a->note, "rejected; reason=%s", sl_admit_reason_str(a->reason));
    return a->verdict;
}

/* The tenant's bucket `reason` names had no room for cost: when to retry and why. */
static enum sl_admit_reason tenant_refused(struct sl_admit *a, enum sl_admit_reason reason,
                                           const struct sl_gcra_view *v, int64_t cost)
{
    const struct sl_tenant *t = a->tenant;
    a->reason = reason;
    a->retry_ns = v->retry_ns;
    if (reason == SL_ADMIT_REASON_TENANT_REQUESTS)
        snprintf(a->why, sizeof a->why,
                 "Rate limit reached for tenant '%s' on requests per minute: limit %lld. Please "
                 "try again in %.3f s.",
                 t->name, t->rpm, (double)v->retry_ns / 1e9);
    else if (v->retry_ns < 0)
        snprintf(a->why, sizeof a->why,
                 "Request too large for tenant '%s' on tokens per minute: limit %lld, requested "
                 "%lld (prompt plus max_tokens). Reduce the prompt or max_tokens.",
                 t->name, t->tpm, (long long)cost);
    else
        snprintf(a->why, sizeof a->why,
                 "Rate limit reached for tenant '%s' on tokens per minute: limit %lld, remaining "
                 "%lld, requested %lld. Please try again in %.3f s.",
                 t->name, t->tpm, (long long)v->remaining, (long long)cost,
                 (double)v->retry_ns / 1e9);
    return reason;
}

/* Charges the tenant's local buckets (its share of them when decided locally): all or none. */
static enum sl_admit_reason tenant_take(struct sl_admit *a, int64_t now)
{
    const struct sl_tenant *t = a->tenant;
    struct cell *c = a->tenant_cell;
    struct sl_gcra_view v;
    if (t->rpm > 0) {
        struct sl_gcra_rate r = share(a, per_minute(t->rpm), 1);
        if (!sl_gcra_bucket_take(&c->requests, &r, now, 1, &v))
            return tenant_refused(a, SL_ADMIT_REASON_TENANT_REQUESTS, &v, 1);
        a->took_request = true;
    }
    if (t->tpm > 0) {
        int64_t cost = charge(a);
        struct sl_gcra_rate r = share(a, per_minute(t->tpm), cost);
        if (!sl_gcra_bucket_take(&c->tokens, &r, now, cost, &v)) {
            tenant_refund(a, 0, true, now);
            return tenant_refused(a, SL_ADMIT_REASON_TENANT_TOKENS, &v, cost);
        }
        a->tenant_tokens = cost;
    }
    return SL_ADMIT_REASON_NONE;
}

static enum sl_admit_verdict overloaded(struct sl_admit *a, int64_t now)
{
    /* The server said no: the tenant gets back everything the request was charged. */
    unpark(a);
    tenant_refund(a, a->tenant_tokens, true, now);
    a->active = false;
    a->verdict = SL_ADMIT_OVERLOADED;
    snprintf(a->note, sizeof a->note, "rejected; reason=%s", sl_admit_reason_str(a->reason));
    return a->verdict;
}

static int model_find(const struct sl_admit_env *env, const char *name)
{
    for (int i = 0; i < env->n_models; i++)
        if (env->model_names[i] && strcmp(env->model_names[i], name) == 0)
            return i;
    return -1;
}

/* Applies the policy's steps from a->step until one makes the request fit, parks it, or
 * rejects it. */
static enum sl_admit_verdict walk(struct sl_admit *a, const struct sl_admit_env *env, int64_t now)
{
    const struct sl_tenancy *cfg = a->tenancy;
    const struct sl_tier *policy = &cfg->tiers[a->policy_tier];
    while (a->step < policy->n_overload) {
        const struct sl_overload_step *s = &policy->overload[a->step++];
        switch (s->kind) {
        case SL_OVERLOAD_REJECT: return overloaded(a, now);
        case SL_OVERLOAD_CAP_MAX_TOKENS:
            if (a->max_tokens <= s->arg)
                continue; /* nothing to cap: the next step */
            tenant_refund(a, choices(a) * prompts(a) * (a->max_tokens - s->arg), false, now);
            a->max_tokens = s->arg;
            a->degraded_by |= 1u << SL_OVERLOAD_CAP_MAX_TOKENS;
            note_add(a, "cap_max_tokens=%d", s->arg);
            break;
        case SL_OVERLOAD_DEMOTE:
            if (s->arg == a->tier || s->arg < 0 || s->arg >= cfg->n_tiers)
                continue;
            a->tier = s->arg;
            a->degraded_by |= 1u << SL_OVERLOAD_DEMOTE;
            note_add(a, "demote=%s", cfg->tiers[s->arg].sched.name);
            break;
        case SL_OVERLOAD_MODEL: {
            int m = model_find(env, s->model);
            int n = 0, cached = 0;
            if (m < 0 || m == a->model || m >= SL_ADMIT_MODELS_MAX ||
                env->encode(env->ctx, m, a->max_tokens, &n, &cached) != SL_OK)
                continue; /* not served, or the prompt does not fit it */
            a->model = m;
            a->n_prompt = n;
            a->n_cached = cached; /* that model's cache, not the first's */
            a->degraded_by |= 1u << SL_OVERLOAD_MODEL;
            note_add(a, "model=%s", s->model);
            break;
        }
        case SL_OVERLOAD_QUEUE: {
            struct cell *c = cfg->state->tiers[a->policy_tier];
            int cap = policy->max_queue_requests;
            int p = atomic_load_explicit(&c->parked, memory_order_relaxed);
            bool room = true;
            do {
                if (cap >= 0 && p >= cap) {
                    room = false; /* the waiting room is full too: the next step */
                    break;
                }
            } while (!atomic_compare_exchange_weak_explicit(
                &c->parked, &p, p + 1, memory_order_relaxed, memory_order_relaxed));
            if (!room)
                continue;
            a->park_cell = c;
            a->active = true;
            a->park_start_ns = now;
            a->deadline_ns = now + (int64_t)s->arg * NS_PER_MS;
            int64_t wait = a->reason == SL_ADMIT_REASON_TIER_TOKEN_RATE && a->retry_ns > 0
                               ? a->retry_ns
                               : RECHECK_NS;
            a->recheck_ns = now + wait < a->deadline_ns ? now + wait : a->deadline_ns;
            a->verdict = SL_ADMIT_PARK;
            if (!a->degraded) /* what the access log says if its client leaves meanwhile */
                snprintf(a->note, sizeof a->note, "queued");
            return a->verdict;
        }
        }
        enum sl_admit_reason r = try_tier(a, env, now);
        if (r == SL_ADMIT_REASON_NONE)
            return passed(a, now);
        a->reason = r;
    }
    return overloaded(a, now);
}

/* The request a decision is about, as sl_admit_begin and sl_admit_precheck take it. */
static void admit_open(struct sl_admit *a, const struct sl_tenancy *cfg, const struct sl_tenant *t,
                       int tier, int model, int max_tokens)
{
    a->ran = true;
    a->tenancy = cfg;
    a->tenant = t;
    a->tier = a->policy_tier = tier;
    a->model = model;
    a->max_tokens = max_tokens;
}

enum sl_admit_verdict sl_admit_begin(struct sl_admit *a, const struct sl_admit_env *env,
                                     const struct sl_tenancy *cfg, const struct sl_tenant *t,
                                     int tier, int model, int n_prompt, int max_tokens,
                                     int64_t now_ns)
{
    admit_open(a, cfg, t, tier, model, max_tokens);
    a->n_prompt = n_prompt;
    a->retry_ns = 0;
    if (!cfg->admission || !cfg->state || model < 0 || model >= SL_ADMIT_MODELS_MAX)
        return admitted(a);
    if (has_limits(t) && t != &sl_tenant_anonymous) {
        a->tenant_cell = cfg->state->tenants[t - cfg->tenants];
        int64_t start, end, worst;
        if (a->fleet && budget_plan(a, env, &start, &end, &worst)) {
            /* The fleet's take reserves it, with the tenant's and tier's buckets. */
            a->budget_fleet = true;
            a->budget_reserved = worst;
            a->budget_period_start = start;
            a->budget_period_end = end;
            a->budget_now = env->unix_s;
        } else if (!a->fleet && !budget_take(a, env, 1)) {
            return over_budget(a);
        }
        if (!a->fleet) { /* else the fleet's take charges them with the tier's */
            if (tenant_take(a, now_ns) != SL_ADMIT_REASON_NONE)
                return limited(a);
            a->active = true;
        }
    }
    enum sl_admit_reason r = try_tier(a, env, now_ns);
    if (r == SL_ADMIT_REASON_NONE)
        return passed(a, now_ns);
    a->reason = r;
    return walk(a, env, now_ns);
}

enum sl_admit_verdict sl_admit_precheck(struct sl_admit *a, const struct sl_admit_env *env,
                                        const struct sl_tenancy *cfg, const struct sl_tenant *t,
                                        int tier, int model, int max_tokens, int64_t now_ns)
{
    if (!cfg->admission || !cfg->state || has_limits(t) || model < 0 ||
        model >= SL_ADMIT_MODELS_MAX)
        return SL_ADMIT_OK;
    const struct sl_tier *tr = &cfg->tiers[tier];
    if (tr->max_queue_requests < 0)
        return SL_ADMIT_OK;
    for (int i = 0; i < tr->n_overload; i++)
        if (tr->overload[i].kind != SL_OVERLOAD_CAP_MAX_TOKENS &&
            tr->overload[i].kind != SL_OVERLOAD_REJECT)
            return SL_ADMIT_OK; /* a step that may find room elsewhere: the full decision */
    const struct cell *c = cfg->state->tiers[tier];
    if (atomic_load_explicit(&c->queued[model], memory_order_relaxed) < tr->max_queue_requests)
        return SL_ADMIT_OK;
    /* What sl_admit_begin would answer: the queue is full, and capping max_tokens does not
     * empty it. */
    admit_open(a, cfg, t, tier, model, max_tokens);
    a->reason = SL_ADMIT_REASON_TIER_QUEUE_REQUESTS;
    struct sl_guard_prediction p;
    a->retry_ns = DEFAULT_RETRY_NS;
    if (tr->max_queue_requests != 0 && predict(a, env, false, &p) && p.prefill_s > 0)
        a->retry_ns = secs_ns(p.prefill_s);
    snprintf(a->why, sizeof a->why,
             "Tier '%s' has its queue full (max_queue_requests) and is overloaded.",
             tr->sched.name);
    return overloaded(a, now_ns);
}

/* A parked request whose tier still has no room (a->reason says why): parked again until its
 * deadline, then the rest of the policy. A request not parked goes straight on with the policy. */
static enum sl_admit_verdict still_parked(struct sl_admit *a, const struct sl_admit_env *env,
                                          int64_t now)
{
    if (a->park_cell && now < a->deadline_ns) {
        int64_t wait = a->reason == SL_ADMIT_REASON_TIER_TOKEN_RATE && a->retry_ns > 0 ? a->retry_ns
                                                                                       : RECHECK_NS;
        a->recheck_ns = now + wait < a->deadline_ns ? now + wait : a->deadline_ns;
        a->verdict = SL_ADMIT_PARK;
        return a->verdict;
    }
    /* Waited as long as the step allows: on with the policy. */
    unpark(a);
    return walk(a, env, now);
}

enum sl_admit_verdict sl_admit_resume(struct sl_admit *a, const struct sl_admit_env *env,
                                      int64_t now_ns)
{
    if (a->verdict != SL_ADMIT_PARK)
        return a->verdict;
    enum sl_admit_reason r = try_tier(a, env, now_ns);
    if (r == SL_ADMIT_REASON_NONE)
        return decided(a, passed(a, now_ns));
    a->reason = r;
    return decided(a, still_parked(a, env, now_ns));
}

/* ---- the fleet's buckets ---- */

static struct sl_gcra_bucket *bucket_of(const struct sl_admit *a, enum bucket_kind k)
{
    struct cell *c = k == BUCKET_TIER ? a->tenancy->state->tiers[a->tier] : a->tenant_cell;
    return k == BUCKET_REQUESTS ? &c->requests : &c->tokens;
}

void sl_admit_fleet_budget_key(char *out, size_t outlen, const char *prefix, const char *tenant,
                               int64_t period_start)
{
    snprintf(out, outlen, "%.*sbudget:%s:%lld", SL_FLEET_PREFIX_MAX, prefix, tenant,
             (long long)period_start);
}

static void fleet_bucket(const struct sl_admit *a, enum bucket_kind k, const char *prefix,
                         int64_t cost, struct sl_admit_fleet_call *out)
{
    int i = out->n++;
    char *key = out->key[i];
    if (k == BUCKET_BUDGET) {
        /* One key per period, so a new period starts from nothing: "…:budget:acme:1793491200". */
        sl_admit_fleet_budget_key(key, SL_ADMIT_FLEET_KEY_MAX, prefix, a->tenant->name,
                                  a->budget_period_start);
        out->b[i].key = key;
        int64_t left = a->budget_period_end == INT64_MAX ? 0 : a->budget_period_end - a->budget_now;
        out->b[i].rate = (struct sl_gcra_rate){
            .limit = 0, .period_ns = (left > 0 ? left : 1) * NS_PER_S, .burst = a->tenant->budget};
        if (a->budget_period_end == INT64_MAX)
            out->b[i].rate.period_ns = 0;
        out->b[i].cost = cost;
        return;
    }
    if (k == BUCKET_TIER)
        snprintf(key, SL_ADMIT_FLEET_KEY_MAX, "%.*stier:%s", SL_FLEET_PREFIX_MAX, prefix,
                 a->tenancy->tiers[a->tier].sched.name);
    else
        snprintf(key, SL_ADMIT_FLEET_KEY_MAX, "%.*stenant:%s:%s", SL_FLEET_PREFIX_MAX, prefix,
                 a->tenant->name, k == BUCKET_REQUESTS ? "rpm" : "tpm");
    out->b[i].key = key;
    out->b[i].rate = k == BUCKET_TIER       ? tier_rate(&a->tenancy->tiers[a->tier])
                     : k == BUCKET_REQUESTS ? per_minute(a->tenant->rpm)
                                            : per_minute(a->tenant->tpm);
    out->b[i].cost = cost;
}

int sl_admit_fleet_take(const struct sl_admit *a, const char *prefix,
                        struct sl_admit_fleet_call *out)
{
    enum bucket_kind k[SL_FLEET_BUCKETS_MAX];
    int n = a->verdict == SL_ADMIT_FLEET ? fleet_kinds(a, k) : 0;
    out->n = 0;
    for (int i = 0; i < n; i++)
        fleet_bucket(a, k[i], prefix,
                     k[i] == BUCKET_REQUESTS ? 1
                     : k[i] == BUCKET_BUDGET ? a->budget_reserved
                                             : charge(a),
                     out);
    return out->n;
}

int sl_admit_fleet_refund(struct sl_admit *a, const char *prefix, struct sl_admit_fleet_call *out)
{
    out->n = 0;
    if (a->refund_budget_pending && !a->active) {
        a->refund_budget_pending = false;
        if (a->refund_budget != 0)
            fleet_bucket(a, BUCKET_BUDGET, prefix, a->refund_budget, out);
    }
    if (!a->fleet_charged || a->active)
        return out->n;
    if (a->refund_request)
        fleet_bucket(a, BUCKET_REQUESTS, prefix, 1, out);
    if (a->refund_tenant_tokens > 0)
        fleet_bucket(a, BUCKET_TOKENS, prefix, a->refund_tenant_tokens, out);
    if (a->refund_tier_tokens > 0)
        fleet_bucket(a, BUCKET_TIER, prefix, a->refund_tier_tokens, out);
    a->refund_request = false;
    a->refund_tenant_tokens = a->refund_tier_tokens = 0;
    a->fleet_charged = false;
    return out->n;
}

/* What the tier's checks reserved for a take the fleet then refused: its queue slot. */
static void release_hold(struct sl_admit *a)
{
    sl_admit_started(a);
    a->tier_cell = NULL;
    a->tier_tokens = 0;
    a->active = a->park_cell != NULL || a->took_request || a->tenant_tokens > 0;
}

/* The tier's bucket refused: another look while parked, else the rest of the policy. */
static enum sl_admit_verdict tier_refused(struct sl_admit *a, const struct sl_admit_env *env,
                                          int64_t now)
{
    a->reason = SL_ADMIT_REASON_TIER_TOKEN_RATE;
    return still_parked(a, env, now);
}

enum sl_admit_verdict sl_admit_fleet_answer(struct sl_admit *a, const struct sl_admit_env *env,
                                            const struct sl_fleet_take *t, int replicas,
                                            int64_t now_ns)
{
    if (a->verdict != SL_ADMIT_FLEET)
        return a->verdict;
    enum bucket_kind k[SL_FLEET_BUCKETS_MAX];
    int n = fleet_kinds(a, k);
    int64_t cost = charge(a);
    if (!t) {
        /* No answer: this replica's share, from where the fleet stood at its last answer. */
        a->local = true;
        a->replicas = replicas > 1 ? replicas : 1;
        if (a->budget_fleet && !budget_take(a, env, a->replicas)) {
            release_hold(a);
            unpark(a);
            return decided(a, over_budget(a));
        }
        if (a->tenant_cell && tenant_take(a, now_ns) != SL_ADMIT_REASON_NONE) {
            release_hold(a);
            unpark(a);
            return decided(a, limited(a));
        }
        const struct sl_tier *tr = &a->tenancy->tiers[a->tier];
        if (tr->token_rate > 0) {
            struct sl_gcra_rate rate = share(a, tier_rate(tr), cost);
            struct sl_gcra_view v;
            if (!sl_gcra_bucket_take(bucket_of(a, BUCKET_TIER), &rate, now_ns, cost, &v)) {
                tier_refused_why(a, v.retry_ns, cost);
                release_hold(a);
                return decided(a, tier_refused(a, env, now_ns));
            }
            a->tier_tokens = cost;
        }
        a->active = true;
        return decided(a, passed(a, now_ns));
    }
    if (t->admitted) {
        for (int i = 0; i < n; i++) {
            if (k[i] == BUCKET_BUDGET) {
                a->budget_fleet_held = true;
                budget_mark(a, a->tenant_cell, a->tenant->budget - t->view[i].remaining,
                            a->budget_period_start);
                continue;
            }
            sl_gcra_bucket_set(bucket_of(a, k[i]), now_ns, t->view[i].reset_ns);
            if (k[i] == BUCKET_REQUESTS)
                a->took_request = true;
            else if (k[i] == BUCKET_TOKENS)
                a->tenant_tokens = cost;
            else
                a->tier_tokens = cost;
        }
        a->fleet_charged = true;
        a->active = true;
        return passed(a, now_ns);
    }
    int f = t->failed >= 0 && t->failed < n ? t->failed : n - 1;
    const struct sl_gcra_view *v = &t->view[f];
    if (k[f] == BUCKET_BUDGET) {
        release_hold(a);
        unpark(a);
        budget_refuse(a, a->tenant->budget - v->remaining, a->tenant->budget, a->budget_reserved,
                      v->retry_ns);
        return over_budget(a);
    }
    sl_gcra_bucket_set(bucket_of(a, k[f]), now_ns, v->reset_ns);
    release_hold(a);
    if (k[f] == BUCKET_TIER) {
        tier_refused_why(a, v->retry_ns, cost);
        return tier_refused(a, env, now_ns);
    }
    unpark(a);
    tenant_refused(a,
                   k[f] == BUCKET_REQUESTS ? SL_ADMIT_REASON_TENANT_REQUESTS
                                           : SL_ADMIT_REASON_TENANT_TOKENS,
                   v, k[f] == BUCKET_REQUESTS ? 1 : cost);
    return limited(a);
}

/* ---- what the gateway shows ---- */

static void budget_of(struct sl_admit_budget *out, long long limit, const struct sl_gcra_bucket *b,
                      int64_t now_ns)
{
    memset(out, 0, sizeof *out);
    if (limit <= 0)
        return;
    struct sl_gcra_rate r = per_minute(limit);
    struct sl_gcra_view v;
    sl_gcra_bucket_peek(b, &r, now_ns, &v);
    out->limit = limit;
    out->remaining = v.remaining;
    out->reset_ns = v.reset_ns;
}

bool sl_admit_budget_now(const struct sl_tenancy *cfg, const struct sl_tenant *t, int64_t unix_s,
                         struct sl_admit_budget_state *out)
{
    memset(out, 0, sizeof *out);
    if (!t || t->budget <= 0 || t == &sl_tenant_anonymous || !cfg->state)
        return false;
    out->amount = t->budget;
    sl_usage_period_bounds((enum sl_usage_period)t->budget_period, t->budget_month_day, unix_s,
                           &out->start, &out->end);
    const struct cell *c = cfg->state->tenants[t - cfg->tenants];
    out->spent = c && atomic_load_explicit(&c->period_start, memory_order_acquire) == out->start
                     ? atomic_load_explicit(&c->spent, memory_order_relaxed)
                     : -1;
    return true;
}

bool sl_admit_budgets(const struct sl_tenancy *cfg, const struct sl_tenant *t, int64_t now_ns,
                      struct sl_admit_budget *requests, struct sl_admit_budget *tokens)
{
    memset(requests, 0, sizeof *requests);
    memset(tokens, 0, sizeof *tokens);
    if (!has_limits(t) || t == &sl_tenant_anonymous || !cfg->state || !cfg->admission)
        return false;
    const struct cell *c = cfg->state->tenants[t - cfg->tenants];
    if (!c)
        return false;
    budget_of(requests, t->rpm, &c->requests, now_ns);
    budget_of(tokens, t->tpm, &c->tokens, now_ns);
    return true;
}

void sl_admit_render(const struct sl_tenancy *cfg, struct sl_str *out)
{
    static const char *const names[3] = {"sluice:admission_queued_requests",
                                         "sluice:admission_queued_prompt_tokens",
                                         "sluice:admission_parked_requests"};
    static const char *const help[3] = {
        "Requests admitted into a tier and not yet given their first token (what "
        "max_queue_requests caps), over the models, by tier.",
        "Prompt tokens of those requests (what max_queue_tokens caps), by tier.",
        "Requests a queue:MS step holds while they wait for room in their tier, by tier."};
    for (int k = 0; k < 3; k++) {
        sl_str_appendf(out, "# HELP %s %s\n# TYPE %s gauge\n", names[k], help[k], names[k]);
        for (int i = 0; cfg->state && i < cfg->state->n_tiers; i++) {
            const struct cell *c = cfg->state->tiers[i];
            long v = 0;
            if (k == 2) {
                v = atomic_load_explicit(&c->parked, memory_order_relaxed);
            } else {
                for (int m = 0; m < SL_ADMIT_MODELS_MAX; m++)
                    v += k == 0 ? atomic_load_explicit(&c->queued[m], memory_order_relaxed)
                                : atomic_load_explicit(&c->queued_tokens[m], memory_order_relaxed);
            }
            /* Tier names are [A-Za-z0-9_.-]: nothing to escape. */
            sl_str_appendf(out, "%s{tier=\"%s\"} %ld\n", names[k], cfg->tiers[i].sched.name, v);
        }
    }
    /* Budgets, as the tenants' cells stand: known from a tenant's first request of the period. */
    static const char *const bnames[2] = {"sluice:tenant_budget_used_ratio",
                                          "sluice:tenant_budget_remaining"};
    static const char *const bhelp[2] = {
        "What a tenant has spent of its money budget this period (requests in flight counted at "
        "their worst case), as a fraction.",
        "What is left of a tenant's money budget this period, in the configuration's currency."};
    for (int k = 0; k < 2; k++) {
        bool head = false;
        for (int i = 0; cfg->state && i < cfg->n_tenants; i++) {
            const struct sl_tenant *t = &cfg->tenants[i];
            const struct cell *c = cfg->state->tenants[i];
            if (t->budget <= 0 || !c ||
                atomic_load_explicit(&c->period_start, memory_order_relaxed) == INT64_MAX)
                continue;
            if (!head)
                sl_str_appendf(out, "# HELP %s %s\n# TYPE %s gauge\n", bnames[k], bhelp[k],
                               bnames[k]);
            head = true;
            int64_t spent = atomic_load_explicit(&c->spent, memory_order_relaxed);
            /* Tenant names have no '"' or '\\' (checked at load); the rest is printable. */
            sl_str_appendf(out, "%s{tenant=\"%s\"} ", bnames[k], t->name);
            if (k == 0) {
                sl_str_appendf(out, "%.6f\n", (double)spent / (double)t->budget);
            } else {
                char m[32];
                sl_usage_money_format(t->budget - spent, m, sizeof m);
                sl_str_appendf(out, "%s\n", m);
            }
        }
    }
}
