/* Admission policy: GCRA buckets (exactness, refunds, rescaling, many threads at once) and the
 * SLO guard's TTFT prediction against the simulator running the real scheduling core. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <sluice/admission.h>

#include "sim_trace.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEC 1000000000LL
#define MS 1000000LL

/* ---- GCRA ---- */

Test(admission, gcra_bucket_admits_exactly_its_burst_then_says_when_when_empty)
{
    /* 60 requests per minute, all of them at once. */
    struct sl_gcra_rate r = {.limit = 60, .period_ns = 60 * SEC, .burst = 60};
    struct sl_gcra_bucket b;
    sl_gcra_bucket_init(&b, 1000 * SEC);
    struct sl_gcra_view v;
    int64_t t0 = 1000 * SEC;
    for (int i = 0; i < 60; i++) {
        cr_assert(sl_gcra_bucket_take(&b, &r, t0, 1, &v), "take %d of the burst", i);
        cr_assert_eq(v.remaining, 59 - i);
        cr_assert_eq(v.reset_ns, (i + 1) * SEC, "one second per request to refill");
    }
    cr_assert_not(sl_gcra_bucket_take(&b, &r, t0, 1, &v));
    cr_assert_eq(v.retry_ns, SEC, "the next one in exactly 1 s");
    cr_assert_eq(v.remaining, 0);
    cr_assert_eq(v.reset_ns, 60 * SEC);
    cr_assert_not(sl_gcra_bucket_take(&b, &r, t0 + SEC - 1, 1, &v), "not a nanosecond early");
    cr_assert_eq(v.retry_ns, 1);
    cr_assert(sl_gcra_bucket_take(&b, &r, t0 + SEC, 1, &v), "and at that time");
    cr_assert_eq(v.remaining, 0);
    /* A minute later it is full again, and never fuller. */
    sl_gcra_bucket_peek(&b, &r, t0 + 61 * SEC, &v);
    cr_assert_eq(v.remaining, 60);
    cr_assert_eq(v.reset_ns, 0);
    sl_gcra_bucket_peek(&b, &r, t0 + 3600 * SEC, &v);
    cr_assert_eq(v.remaining, 60);
}

Test(admission, gcra_bucket_refuses_for_ever_when_the_cost_is_over_its_burst)
{
    struct sl_gcra_rate r = {.limit = 1000, .period_ns = 60 * SEC, .burst = 1000};
    struct sl_gcra_bucket b;
    sl_gcra_bucket_init(&b, 0);
    struct sl_gcra_view v;
    cr_assert_not(sl_gcra_bucket_take(&b, &r, 0, 1001, &v));
    cr_assert_eq(v.retry_ns, -1);
    cr_assert_eq(v.remaining, 1000, "nothing was taken");
    cr_assert(sl_gcra_bucket_take(&b, &r, 0, 1000, &v), "exactly the burst is fine");
    cr_assert_eq(v.remaining, 0);
    cr_assert_not(sl_gcra_bucket_take(&b, &r, 0, 600, &v));
    cr_assert_eq(v.retry_ns, 36 * SEC, "600 tokens at 1000 a minute");
}

Test(admission, gcra_bucket_gives_back_refunds_but_never_beyond_full)
{
    /* 1000 tokens a second, burst 1000: a request charged prompt + max_tokens = 700 that used
     * 300 of its 600 max_tokens gets 300 back. */
    struct sl_gcra_rate r = {.limit = 1000, .period_ns = SEC, .burst = 1000};
    struct sl_gcra_bucket b;
    sl_gcra_bucket_init(&b, 0);
    struct sl_gcra_view v;
    cr_assert(sl_gcra_bucket_take(&b, &r, 0, 700, &v));
    cr_assert_eq(v.remaining, 300);
    cr_assert_not(sl_gcra_bucket_take(&b, &r, 0, 600, &v));
    sl_gcra_bucket_refund(&b, &r, 0, 300);
    sl_gcra_bucket_peek(&b, &r, 0, &v);
    cr_assert_eq(v.remaining, 600);
    cr_assert(sl_gcra_bucket_take(&b, &r, 0, 600, &v), "the refund is usable at once");
    cr_assert_eq(v.remaining, 0);
    /* Refunding more than is owed fills the bucket, no more. */
    sl_gcra_bucket_refund(&b, &r, 500 * MS, 5000);
    sl_gcra_bucket_peek(&b, &r, 500 * MS, &v);
    cr_assert_eq(v.remaining, 1000);
    cr_assert_eq(v.reset_ns, 0);
    cr_assert(sl_gcra_bucket_take(&b, &r, 500 * MS, 1000, NULL));
    cr_assert_not(sl_gcra_bucket_take(&b, &r, 500 * MS, 1, NULL));
    /* A refund into a bucket that has refilled meanwhile changes nothing. */
    sl_gcra_bucket_refund(&b, &r, 10 * SEC, 1000);
    sl_gcra_bucket_peek(&b, &r, 10 * SEC, &v);
    cr_assert_eq(v.remaining, 1000);
}

Test(admission, gcra_bucket_keeps_its_debt_in_tokens_when_the_rate_changes)
{
    struct sl_gcra_rate a = {.limit = 60, .period_ns = 60 * SEC, .burst = 60};
    struct sl_gcra_rate b2 = {.limit = 120, .period_ns = 60 * SEC, .burst = 120};
    struct sl_gcra_bucket b;
    sl_gcra_bucket_init(&b, 0);
    for (int i = 0; i < 30; i++)
        cr_assert(sl_gcra_bucket_take(&b, &a, 0, 1, NULL));
    struct sl_gcra_view v;
    sl_gcra_bucket_peek(&b, &a, 0, &v);
    cr_assert_eq(v.reset_ns, 30 * SEC);
    sl_gcra_bucket_rescale(&b, &a, &b2, 0);
    sl_gcra_bucket_peek(&b, &b2, 0, &v);
    cr_assert_eq(v.reset_ns, 15 * SEC, "30 tokens short at 2 a second");
    cr_assert_eq(v.remaining, 90);
}

/* Threads take one token at a time from one bucket while a shared virtual clock advances by a
 * fixed step per attempt, so demand is far above the rate the whole time. */
struct hammer {
    struct sl_gcra_bucket b;
    struct sl_gcra_rate r;
    _Atomic int64_t clock;
    atomic_long taken;
    atomic_long refunded;
    int attempts;
    bool refund_half;
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;
    for (int i = 0; i < h->attempts; i++) {
        int64_t now = atomic_fetch_add(&h->clock, 1000) + 1000;
        if (sl_gcra_bucket_take(&h->b, &h->r, now, 2, NULL)) {
            atomic_fetch_add(&h->taken, 2);
            if (h->refund_half && (i & 1)) {
                sl_gcra_bucket_refund(&h->b, &h->r, now, 1);
                atomic_fetch_add(&h->refunded, 1);
            }
        }
    }
    return NULL;
}

static void hammer_run(bool refund_half)
{
    enum { THREADS = 8, ATTEMPTS = 200000 };
    static struct hammer h;
    memset(&h, 0, sizeof h);
    /* 1,000 tokens a second against 1e6 attempts a second of virtual time, burst 500. */
    h.r = (struct sl_gcra_rate){.limit = 1000, .period_ns = SEC, .burst = 500};
    h.attempts = ATTEMPTS;
    h.refund_half = refund_half;
    sl_gcra_bucket_init(&h.b, 0);
    atomic_init(&h.clock, 0);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, hammer_main, &h), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    double elapsed_s = (double)atomic_load(&h.clock) / SEC;
    long net = atomic_load(&h.taken) - atomic_load(&h.refunded);
    double bound = 1000 * elapsed_s + 500;
    cr_log_info("%d threads, %.3f s of virtual time: %ld tokens taken, %ld refunded, bound %.0f",
                THREADS, elapsed_s, atomic_load(&h.taken), atomic_load(&h.refunded), bound);
    cr_assert_leq((double)net, bound, "rate x time + burst is never exceeded");
    /* Exactness the other way: a thread with an older `now` may lose a little, never much. */
    cr_assert_geq((double)net, bound - 2 * THREADS - 2, "and the bucket is not stingy");
}

Test(admission, gcra_bucket_never_admits_beyond_rate_times_time_plus_burst_when_hammered)
{
    hammer_run(false);
}

Test(admission, gcra_bucket_counts_refunds_exactly_when_hammered)
{
    hammer_run(true);
}

/* ---- the guard against the simulator ---- */

struct predictions {
    const struct trace *t;
    double *pred_s;
};

static void on_arrival(void *ctx, int idx, const struct sl_sched_stats *st)
{
    struct predictions *p = ctx;
    struct sl_guard_prediction pr;
    const struct sl_sim_request *r = &p->t->r[idx];
    p->pred_s[idx] =
        sl_guard_predict_ttft(st, NULL, r->tier, r->prompt_tokens, &pr) == SL_OK ? pr.ttft_s : -1;
}

/* The stated tolerance: a prediction agrees with the simulation when it is within 35 % of the
 * simulated TTFT or within 10 % of the tier's objective, whichever is larger. Each scenario runs
 * over eight traces (seeds) and the counts are pooled: at least AGREE_SHARE of a tier's
 * predictions must agree, and of the requests whose simulated TTFT is between half and twice the
 * objective (where the guard's decision is made), at least SIDE_SHARE must be predicted on the
 * same side of it. Requests count only when their first token came before the trace's arrivals
 * ended (`until_s`): after that the load the prediction measured is gone. Pooled, because one
 * trace can be an outlier: in the prefill-bound scenario one seed in twelve has an early burst of
 * interactive prompts that halves batch's measured drain for the 10 s the measurement remembers,
 * and batch is predicted at twice its real wait until it fades (the per-trace figures are logged
 * with --verbose). */
#define AGREE_REL 0.35
#define AGREE_SLO 0.10
#define N_SEEDS 8

struct agreement {
    int n, agree, near, same_side, cold;
    double worst;
};

static void check_guard(const char *what, const struct trace *t, double until_s,
                        struct agreement pooled[2])
{
    struct sl_sim_config c = sim_config();
    struct predictions p = {t, calloc((size_t)t->n, sizeof(double))};
    c.on_arrival = on_arrival;
    c.on_arrival_ctx = &p;
    struct sl_sim_result *res = calloc((size_t)t->n, sizeof *res);
    struct sl_sim_report rep;
    cr_assert_eq(sl_sim_run(&c, t->r, t->n, res, &rep), SL_OK);
    for (int tier = 0; tier < 2; tier++) {
        double slo = sim_tiers[tier].ttft_slo_ms / 1e3;
        struct agreement g = {0};
        for (int i = 0; i < t->n; i++) {
            if (t->r[i].tier != tier || res[i].ttft_s < 0 ||
                t->r[i].arrival_s + res[i].ttft_s > until_s)
                continue;
            if (p.pred_s[i] < 0) {
                g.cold++; /* before the first measured step: the guard admits */
                continue;
            }
            double a = res[i].ttft_s, e = p.pred_s[i];
            g.n++;
            g.agree += fabs(e - a) <= fmax(AGREE_REL * a, AGREE_SLO * slo);
            g.worst = fmax(g.worst, fabs(e - a));
            if (a > 0.5 * slo && a < 2 * slo) {
                g.near++;
                g.same_side += (a > slo) == (e > slo);
            }
        }
        cr_log_info("%s, %s: %d predictions (%d before any measurement), %.1f %% agree, worst "
                    "off by %.2f s; near the %.0f s objective %d, on the same side %d",
                    what, sim_tiers[tier].name, g.n, g.cold, 100.0 * g.agree / (g.n ? g.n : 1),
                    g.worst, slo, g.near, g.same_side);
        struct agreement *o = &pooled[tier];
        o->n += g.n;
        o->agree += g.agree;
        o->near += g.near;
        o->same_side += g.same_side;
        o->cold += g.cold;
        o->worst = fmax(o->worst, g.worst);
    }
    free(res);
    free(p.pred_s);
}

/* Asserts the pooled agreement of each tier: agree_share of predictions, side_share near the
 * objective. */
static void expect_agreement(const char *what, const struct agreement pooled[2],
                             const double agree_share[2], double side_share)
{
    for (int tier = 0; tier < 2; tier++) {
        const struct agreement *g = &pooled[tier];
        const char *name = sim_tiers[tier].name;
        cr_log_info("%s, %s, %d traces: %d predictions, %.1f %% agree; near the objective %d, "
                    "%.1f %% on the same side",
                    what, name, N_SEEDS, g->n, 100.0 * g->agree / (g->n ? g->n : 1), g->near,
                    100.0 * g->same_side / (g->near ? g->near : 1));
        cr_assert_gt(g->n, 20 * N_SEEDS, "%s %s: enough requests to judge", what, name);
        cr_assert_geq(g->agree, agree_share[tier] * g->n, "%s %s: %d of %d agree", what, name,
                      g->agree, g->n);
        cr_assert_geq(g->same_side, side_share * g->near, "%s %s: %d of %d on the same side", what,
                      name, g->same_side, g->near);
    }
}

/* One Poisson stream of a tier over the 60 s traces: rate per second, prompt and output lengths
 * uniform in [p_lo, p_hi] and [o_lo, o_hi]. */
struct stream {
    double rate;
    int p_lo, p_hi, o_lo, o_hi;
};

/* Runs the scenario (batch and interactive streams) over N_SEEDS traces and asserts the pooled
 * agreement. */
static void scenario(const char *what, uint64_t salt, struct stream batch, struct stream inter,
                     const double agree_share[2], double side_share)
{
    struct agreement pooled[2] = {{0}};
    for (int seed = 1; seed <= N_SEEDS; seed++) {
        struct trace t = {.rng = (uint64_t)seed * 1000 + salt};
        trace_poisson(&t, 0, 60, batch.rate, BATCH, batch.p_lo, batch.p_hi, batch.o_lo, batch.o_hi);
        trace_poisson(&t, 0, 60, inter.rate, INTERACTIVE, inter.p_lo, inter.p_hi, inter.o_lo,
                      inter.o_hi);
        check_guard(what, &t, 60, pooled);
        free(t.r);
    }
    expect_agreement(what, pooled, agree_share, side_share);
}

/* Batch at 3x its capacity with interactive at 30 % of its own (bench/traces/flood.jsonl's
 * shapes): batch waits on slots and its backlog grows by the minute; interactive goes ahead.
 * Batch's wait is set by slot turnover, which the drain measurement follows with a lag. */
Test(admission, guard_agrees_with_the_simulator_when_batch_floods)
{
    scenario("flood", 7, (struct stream){3 * 4.19, 256, 1024, 64, 256},
             (struct stream){0.3 * 20.1, 32, 256, 16, 128}, (const double[2]){0.78, 0.75}, 0.85);
}

/* Long prompts and short answers in both tiers: the prompt backlogs are the bottleneck and the
 * tiers share each step's prompt rows by weight. */
Test(admission, guard_agrees_with_the_simulator_when_prefill_is_the_bottleneck)
{
    scenario("prefill-bound", 9, (struct stream){8, 1000, 3000, 1, 4},
             (struct stream){4, 200, 1500, 1, 8}, (const double[2]){0.92, 0.85}, 0.80);
}

/* Both tiers well within capacity: predictions stay near one step or two. */
Test(admission, guard_agrees_with_the_simulator_when_load_is_steady)
{
    scenario("steady", 8, (struct stream){0.4 * 4.19, 256, 1024, 64, 256},
             (struct stream){0.4 * 20.1, 32, 256, 16, 128}, (const double[2]){0.95, 0.95}, 0.95);
}

Test(admission, guard_waits_for_measurements_when_the_scheduler_is_new)
{
    struct sl_sched_stats st = {.n_tiers = 2, .max_batch_tokens = 512};
    st.tiers[0].weight = 4;
    st.tiers[1].weight = 1;
    struct sl_guard_prediction pr;
    cr_assert_eq(sl_guard_predict_ttft(&st, NULL, 0, 100, &pr), SL_EAGAIN);
    cr_assert_eq(sl_guard_predict_ttft(&st, NULL, 2, 100, &pr), SL_EINVAL);
    cr_assert_eq(sl_guard_predict_ttft(&st, NULL, -1, 100, &pr), SL_EINVAL);
    cr_assert_eq(sl_guard_drain_s(&st, NULL, 0, 100, 1.0), 0);
}

Test(admission, guard_shares_prefill_by_weight_when_tiers_compete)
{
    /* 10,000 tokens/s; interactive (weight 4) has 2,000 queued, batch (weight 1) 50,000. */
    struct sl_sched_stats st = {
        .n_tiers = 2, .max_batch_tokens = 512, .prefill_capacity_tokens_per_s = 10000};
    st.tiers[0].weight = 4;
    st.tiers[0].queued_prompt_tokens = 2000;
    st.tiers[1].weight = 1;
    st.tiers[1].queued_prompt_tokens = 50000;
    struct sl_guard_prediction pr;
    cr_assert_eq(sl_guard_predict_ttft(&st, NULL, 0, 400, &pr), SL_OK);
    /* 2,400 tokens at 8,000/s. */
    cr_assert_float_eq(pr.prefill_s, 0.3, 1e-9);
    /* Batch: interactive's 2,000 take 0.25 s, in which batch gets 2,000/s (500 tokens), then
     * the rest (50,000 + 100 - 500) at 10,000/s. */
    cr_assert_eq(sl_guard_predict_ttft(&st, NULL, 1, 100, &pr), SL_OK);
    cr_assert_float_eq(pr.prefill_s, 0.25 + 49600.0 / 10000, 1e-9);
    /* The caller's own count of what is queued wins over the published one. */
    long mine[2] = {6000, 0}; /* and batch idle: interactive gets it all */
    cr_assert_eq(sl_guard_predict_ttft(&st, mine, 0, 2000, &pr), SL_OK);
    cr_assert_float_eq(pr.prefill_s, 0.8, 1e-9);
    /* A measured drain rate under a backlog wins over the model. */
    st.tiers[1].drain_tokens_per_s = 1000;
    cr_assert_eq(sl_guard_predict_ttft(&st, NULL, 1, 100, &pr), SL_OK);
    cr_assert_float_eq(pr.prefill_s, 50.1, 1e-9);
    st.decode_step_seconds = 0.05;
    cr_assert_eq(sl_guard_predict_ttft(&st, NULL, 1, 100, &pr), SL_OK);
    cr_assert_float_eq(pr.ttft_s, 50.15, 1e-9);
    cr_assert_float_eq(sl_guard_drain_s(&st, NULL, 1, 100, 30.0), 20.15, 1e-9);
    cr_assert_eq(sl_guard_drain_s(&st, NULL, 1, 100, 60.0), 0);
}
