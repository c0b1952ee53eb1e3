/* Admission policy: GCRA token buckets and the SLO guard's TTFT prediction.
 *
 * Buckets are GCRA rather than counters refilled by a timer: the whole state is one word (the
 * time the bucket is full again), a take is one compare-and-swap, and the answer to "when may I
 * retry" is exact arithmetic on that word instead of a guess about the next refill. Times are
 * integer nanoseconds and the per-token interval is never rounded down, so the bound in admission.h
 * holds exactly, not approximately.
 *
 * The guard models the scheduler as sched.h describes it (weighted prompt shares, FIFO within a
 * tier, a slot per running sequence) with only what the scheduler publishes once per step: it is
 * meant to be right where it matters, near a tier's objective under a backlog, not to replace
 * the simulator. tests/admission/test_gcra.c measures how far it is from the simulator on traces.
 */
#include <sluice/admission.h>

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ---- buckets ---- */

/* ceil(tokens * period / limit) in ns, saturating (a huge cost is simply never allowed). */
static int64_t interval(const struct sl_gcra_rate *r, int64_t tokens)
{
    if (tokens <= 0)
        return 0;
    unsigned __int128 num = (unsigned __int128)(uint64_t)tokens * (uint64_t)r->period_ns;
    unsigned __int128 q = (num + (uint64_t)r->limit - 1) / (uint64_t)r->limit;
    return q > (unsigned __int128)(INT64_MAX / 4) ? INT64_MAX / 4 : (int64_t)q;
}

/* Whole tokens in a span of ns (rounded down). */
static int64_t tokens_in(const struct sl_gcra_rate *r, int64_t ns)
{
    if (ns <= 0)
        return 0;
    return (int64_t)((unsigned __int128)(uint64_t)ns * (uint64_t)r->limit / (uint64_t)r->period_ns);
}

static void view_of(const struct sl_gcra_rate *r, int64_t tat, int64_t now, struct sl_gcra_view *v)
{
    int64_t debt = tat > now ? tat - now : 0;
    int64_t cap = interval(r, r->burst);
    v->remaining = cap > debt ? tokens_in(r, cap - debt) : 0;
    v->reset_ns = debt;
    v->retry_ns = 0;
}

void sl_gcra_bucket_init(struct sl_gcra_bucket *b, int64_t now_ns)
{
    atomic_init(&b->tat_ns, now_ns);
}

bool sl_gcra_bucket_take(struct sl_gcra_bucket *b, const struct sl_gcra_rate *r, int64_t now_ns,
                         int64_t cost, struct sl_gcra_view *v)
{
    struct sl_gcra_view scratch;
    if (!v)
        v = &scratch;
    int64_t inc = interval(r, cost), cap = interval(r, r->burst);
    int64_t tat = atomic_load_explicit(&b->tat_ns, memory_order_relaxed);
    for (;;) {
        int64_t base = tat > now_ns ? tat : now_ns;
        int64_t next = base + inc;
        if (next - now_ns > cap) {
            view_of(r, tat, now_ns, v);
            v->retry_ns = inc > cap ? -1 : next - now_ns - cap;
            return false;
        }
        if (atomic_compare_exchange_weak_explicit(&b->tat_ns, &tat, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            view_of(r, next, now_ns, v);
            return true;
        }
    }
}

void sl_gcra_bucket_refund(struct sl_gcra_bucket *b, const struct sl_gcra_rate *r, int64_t now_ns,
                           int64_t cost)
{
    int64_t dec = interval(r, cost);
    if (dec == 0)
        return;
    int64_t tat = atomic_load_explicit(&b->tat_ns, memory_order_relaxed);
    for (;;) {
        if (tat <= now_ns)
            return; /* full: nothing to give back */
        int64_t next = tat - dec > now_ns ? tat - dec : now_ns;
        if (atomic_compare_exchange_weak_explicit(&b->tat_ns, &tat, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return;
    }
}

void sl_gcra_bucket_peek(const struct sl_gcra_bucket *b, const struct sl_gcra_rate *r,
                         int64_t now_ns, struct sl_gcra_view *v)
{
    view_of(r, atomic_load_explicit(&b->tat_ns, memory_order_relaxed), now_ns, v);
}

void sl_gcra_bucket_set(struct sl_gcra_bucket *b, int64_t now_ns, int64_t reset_ns)
{
    atomic_store_explicit(&b->tat_ns, now_ns + (reset_ns > 0 ? reset_ns : 0), memory_order_relaxed);
}

void sl_gcra_bucket_rescale(struct sl_gcra_bucket *b, const struct sl_gcra_rate *from,
                            const struct sl_gcra_rate *to, int64_t now_ns)
{
    if (from->limit == to->limit && from->period_ns == to->period_ns)
        return;
    int64_t tat = atomic_load_explicit(&b->tat_ns, memory_order_relaxed);
    for (;;) {
        if (tat <= now_ns)
            return;
        /* Tokens short of full, rounded up (a reload forgives nothing). */
        int64_t debt = tat - now_ns;
        unsigned __int128 num = (unsigned __int128)(uint64_t)debt * (uint64_t)from->limit;
        int64_t short_by =
            (int64_t)((num + (uint64_t)from->period_ns - 1) / (uint64_t)from->period_ns);
        int64_t next = now_ns + interval(to, short_by);
        if (atomic_compare_exchange_weak_explicit(&b->tat_ns, &tat, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return;
    }
}

/* ---- the guard ---- */

/* Seconds until tier `me` has done `work[me]` prompt tokens when every tier i with work[i] > 0
 * is served at rate * w[i] / (sum of the weights of tiers with work left): generalised processor
 * sharing, what the scheduler's weighted prompt shares with work-conserving hand-over amount
 * to. work is consumed. */
static double gps_finish(double *work, const int *w, int n, int me, double rate)
{
    double t = 0;
    for (int round = 0; round <= n; round++) {
        double wsum = 0;
        for (int i = 0; i < n; i++)
            if (work[i] > 0)
                wsum += w[i];
        if (wsum <= 0 || work[me] <= 0)
            break;
        /* The next tier to run out, at the current shares. */
        double dt = INFINITY;
        for (int i = 0; i < n; i++)
            if (work[i] > 0)
                dt = fmin(dt, work[i] * wsum / (w[i] * rate));
        t += dt;
        for (int i = 0; i < n; i++)
            if (work[i] > 0) {
                work[i] -= dt * rate * w[i] / wsum;
                if (work[i] < 1e-6 * (1 + work[i]))
                    work[i] = 0;
            }
        if (work[me] <= 0)
            break;
    }
    return t;
}

int sl_guard_predict_ttft(const struct sl_sched_stats *st, const long *queued_tokens, int tier,
                          int n_prompt, struct sl_guard_prediction *out)
{
    memset(out, 0, sizeof *out);
    int n = st->n_tiers;
    if (n < 1 || n > SL_SCHED_MAX_TIERS || tier < 0 || tier >= n)
        return SL_EINVAL;
    double work[SL_SCHED_MAX_TIERS];
    int w[SL_SCHED_MAX_TIERS];
    for (int i = 0; i < n; i++) {
        long q = queued_tokens ? queued_tokens[i] : st->tiers[i].queued_prompt_tokens;
        work[i] = q > 0 ? (double)q : 0;
        w[i] = st->tiers[i].weight > 0 ? st->tiers[i].weight : 1;
        out->ahead_tokens += q > 0 ? q : 0;
    }
    work[tier] += n_prompt > 0 ? n_prompt : 0;
    double drain = st->tiers[tier].drain_tokens_per_s;
    if (drain > 0 && work[tier] - n_prompt >= st->max_batch_tokens) {
        /* Measured under load: the tier's backlog drains at that rate, whatever limits it. */
        out->rate = drain;
        out->prefill_s = work[tier] / drain;
    } else {
        /* No backlog to speak of (or none measured yet): weighted sharing of the step's capacity
         * with the other tiers' backlogs. */
        double rate = fmax(st->prefill_tokens_per_s, st->prefill_capacity_tokens_per_s);
        if (!(rate > 0))
            return SL_EAGAIN;
        out->rate = rate;
        out->prefill_s = gps_finish(work, w, n, tier, rate);
    }
    out->ttft_s = out->prefill_s + st->decode_step_seconds;
    return SL_OK;
}

double sl_guard_over_s(const struct sl_guard_prediction *p, double slo_s)
{
    /* With no prompt queued ahead of it in any tier the prediction is the request's own
     * prefill, which no wait would shorten: the engine is as free as it gets, and a rate
     * measured in a stall (the host taking the cores away for a step) would otherwise refuse
     * it on an idle engine, with a Retry-After that never comes true, until some other request
     * ran. Otherwise everything ahead of a request arriving later has had that much longer to
     * drain: its prediction falls by the time waited (new arrivals aside). */
    return p->ahead_tokens > 0 && p->ttft_s > slo_s ? p->ttft_s - slo_s : 0;
}

double sl_guard_drain_s(const struct sl_sched_stats *st, const long *queued_tokens, int tier,
                        int n_prompt, double slo_s)
{
    struct sl_guard_prediction p;
    if (sl_guard_predict_ttft(st, queued_tokens, tier, n_prompt, &p) != SL_OK)
        return 0;
    return sl_guard_over_s(&p, slo_s);
}
