/* The scheduling policies under the simulator: the real core, a virtual clock and the
 * stories15M CPU cost model. Every figure here is deterministic (virtual time), so asserting on
 * it is asserting on the policy, not on the machine. Figures are logged (--verbose) for the
 * record. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <sluice/sched.h>

#include "sim_trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static struct sl_sim_report run(const struct sl_sim_config *c, const struct trace *t,
                                struct sl_sim_result *res)
{
    struct sl_sim_report rep;
    cr_assert_eq(sl_sim_run(c, t->r, t->n, res, &rep), SL_OK);
    cr_assert_eq(rep.mismatches, 0, "every output is what an uninterrupted run gives");
    return rep;
}

/* Requests of one shape per second the machine sustains: a backlog run to its end. */
static double capacity_rps(int tier, int p_lo, int p_hi, int o_lo, int o_hi)
{
    struct sl_sim_config c = sim_config();
    struct trace t = {.rng = 99};
    for (int i = 0; i < 400; i++)
        trace_add(&t, 0, tier, trace_between(&t, p_lo, p_hi), trace_between(&t, o_lo, o_hi));
    struct sl_sim_report rep = run(&c, &t, NULL);
    free(t.r);
    return rep.tiers[tier].completed / rep.makespan_s;
}

Test(sched, sim_run_is_deterministic_and_lossless_when_repeated)
{
    struct sl_sim_config c = sim_config();
    c.lim.n_blocks = 200; /* small enough to preempt */
    struct trace t = {.rng = 1};
    trace_poisson(&t, 0, 20, 6, INTERACTIVE, 8, 300, 4, 200);
    trace_poisson(&t, 0, 20, 3, BATCH, 100, 1000, 50, 400);
    struct sl_sim_result *a = calloc((size_t)t.n, sizeof *a), *b = calloc((size_t)t.n, sizeof *b);
    struct sl_sim_report ra = run(&c, &t, a), rb = run(&c, &t, b);
    cr_assert(memcmp(a, b, sizeof *a * (size_t)t.n) == 0, "same trace, same results");
    cr_assert(memcmp(&ra, &rb, sizeof ra) == 0);
    long preempted = 0;
    for (int i = 0; i < t.n; i++) {
        cr_assert_eq(a[i].finish, SL_FINISH_LENGTH);
        cr_assert_eq(a[i].n_out, t.r[i].output_tokens, "no token lost or sent twice");
        preempted += a[i].preemptions;
    }
    cr_assert_gt(preempted, 0, "the pool was small enough to preempt");
    cr_log_info("deterministic: %d requests, %ld preemptions, makespan %.2f s", t.n, preempted,
                ra.makespan_s);
    free(a);
    free(b);
    free(t.r);
}

Test(sched, sim_continuous_batching_beats_static_batching_when_lengths_are_mixed)
{
    struct sl_sim_config c = sim_config();
    struct trace t = {.rng = 2};
    /* Outputs as they come: mostly short, a few long (a static batch runs as long as its
     * longest member, with its slots emptying as the others finish). */
    trace_poisson(&t, 0, 30, 32, BATCH, 8, 128, 4, 32);
    trace_poisson(&t, 0, 30, 8, BATCH, 8, 128, 128, 512);
    struct sl_sim_report cont = run(&c, &t, NULL);
    c.static_batching = true;
    struct sl_sim_report stat = run(&c, &t, NULL);
    double tc = cont.output_tokens / cont.makespan_s, ts = stat.output_tokens / stat.makespan_s;
    cr_log_info("mixed lengths, %d requests: continuous %.0f tok/s (%.1f s), static %.0f tok/s "
                "(%.1f s): %.2fx",
                t.n, tc, cont.makespan_s, ts, stat.makespan_s, tc / ts);
    cr_assert_eq(cont.output_tokens, stat.output_tokens);
    cr_assert_gt(tc, 1.25 * ts, "continuous %.0f tok/s, static %.0f tok/s", tc, ts);
    free(t.r);
}

/* 16 interactive sequences decode; at 2 s a 4,096-token prompt arrives. Chunked prefill with
 * the TPOT guard keeps every gap between their tokens within the 100 ms objective. */
static double worst_decode_gap_ms(const struct sl_sched_tier *tt, int max_batch_tokens,
                                  double *long_ttft_ms)
{
    struct sl_sim_config c = sim_config();
    c.lim.tiers = tt;
    c.lim.max_batch_tokens = max_batch_tokens;
    struct trace t = {.rng = 3};
    for (int i = 0; i < 16; i++)
        trace_add(&t, 0.01 * i, INTERACTIVE, 64, 600);
    trace_add(&t, 2.0, INTERACTIVE, 4096, 16);
    struct sl_sim_result res[17];
    run(&c, &t, res);
    double worst = 0;
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(res[i].n_out, 600);
        cr_assert_lt(res[i].first_token_at_s, 2.0, "decoding when the long prompt arrives");
        cr_assert_gt(res[i].done_at_s, 4.0, "and still decoding well after it");
        worst = fmax(worst, res[i].max_itl_s * 1e3);
    }
    cr_assert_eq(res[16].n_out, 16);
    *long_ttft_ms = res[16].ttft_s * 1e3;
    free(t.r);
    return worst;
}

Test(sched, sim_long_prompt_keeps_decode_gaps_within_tpot_when_it_arrives_mid_run)
{
    double ttft;
    double guarded = worst_decode_gap_ms(sim_tiers, 512, &ttft);
    cr_log_info("4096-token prompt mid-run: worst decode gap %.1f ms (objective 100), its TTFT "
                "%.0f ms",
                guarded, ttft);
    cr_assert_leq(guarded, sim_tiers[INTERACTIVE].tpot_slo_ms);
    /* The guard cuts chunks by itself: a budget as large as the prompt changes nothing. */
    double unused, big = worst_decode_gap_ms(sim_tiers, 8192, &unused);
    cr_log_info("the same with max_batch_tokens 8192: worst gap %.1f ms", big);
    cr_assert_leq(big, sim_tiers[INTERACTIVE].tpot_slo_ms);
    /* The check has teeth: with no objective to guard, 512-token chunks late in the prompt (whose
     * rows attend to thousands of positions) stall the decodes, and unchunked far more. */
    struct sl_sched_tier free_tiers[2] = {sim_tiers[0], sim_tiers[1]};
    free_tiers[0].tpot_slo_ms = free_tiers[1].tpot_slo_ms = 0;
    double unguarded = worst_decode_gap_ms(free_tiers, 512, &unused);
    double whole = worst_decode_gap_ms(free_tiers, 8192, &unused);
    cr_log_info("unguarded: chunks of 512 %.0f ms, unchunked %.0f ms", unguarded, whole);
    cr_assert_gt(unguarded, 150);
    cr_assert_gt(whole, 500);
}

/* 48 batch sequences have decoded for 200 s, to contexts near 2,600 where a decode row costs
 * ~2.7 ms: decodes alone take ~135 ms a step. Four interactive requests arrive. Batch decodes
 * beyond batch's guaranteed slots pause while their own gaps allow (80 % of batch's 1 s
 * objective), which holds interactive TPOT within its 100 ms. */
static void tpot_guard_run(const struct sl_sched_tier *tt, double *i_tpot_ms, double *b_itl_ms)
{
    struct sl_sim_config c = sim_config();
    c.lim.tiers = tt;
    c.lim.max_seqs = 64;
    c.lim.n_blocks = 12000;
    struct trace t = {.rng = 8};
    for (int i = 0; i < 48; i++)
        trace_add(&t, 0, BATCH, 100, 3000);
    for (int i = 0; i < 4; i++)
        trace_add(&t, 200 + 0.1 * i, INTERACTIVE, 16, 150);
    struct sl_sim_result res[52];
    struct sl_sim_report rep = run(&c, &t, res);
    for (int i = 0; i < 48; i++)
        cr_assert_gt(res[i].done_at_s, res[51].done_at_s, "batch decodes alongside interactive");
    *i_tpot_ms = rep.tiers[INTERACTIVE].tpot_ms[2];
    *b_itl_ms = rep.tiers[BATCH].max_itl_ms;
    free(t.r);
}

Test(sched, sim_batch_decodes_pause_when_interactive_tpot_is_at_risk)
{
    double paused, batch_gap;
    tpot_guard_run(sim_tiers, &paused, &batch_gap);
    cr_log_info("TPOT guard: interactive p99 TPOT %.1f ms (objective 100) with batch decodes "
                "pausing; batch's longest gap %.0f ms (objective 1000)",
                paused, batch_gap);
    cr_assert_leq(paused, sim_tiers[INTERACTIVE].tpot_slo_ms);
    cr_assert_leq(batch_gap, SL_SCHED_GUARD_FRACTION * sim_tiers[BATCH].tpot_slo_ms,
                  "a paused batch sequence still keeps its own objective");
    /* With batch's objective as tight as interactive's, nothing may pause: it is missed. */
    struct sl_sched_tier same[2] = {sim_tiers[0], sim_tiers[1]};
    same[BATCH].tpot_slo_ms = same[INTERACTIVE].tpot_slo_ms;
    double unpaused;
    tpot_guard_run(same, &unpaused, &batch_gap);
    cr_log_info("no looser tier to pause: interactive p99 TPOT %.1f ms", unpaused);
    cr_assert_gt(unpaused, sim_tiers[INTERACTIVE].tpot_slo_ms);
}

/* The interactive and batch shapes of bench/traces/flood.jsonl. */
#define I_SHAPE 32, 256, 16, 128
#define B_SHAPE 256, 1024, 64, 256

Test(sched, sim_interactive_p99_ttft_holds_when_batch_floods_at_three_times_capacity)
{
    double cap_b = capacity_rps(BATCH, B_SHAPE), cap_i = capacity_rps(INTERACTIVE, I_SHAPE);
    struct sl_sim_config c = sim_config();
    struct trace t = {.rng = 4};
    trace_poisson(&t, 0, 60, 3 * cap_b, BATCH, B_SHAPE);
    trace_poisson(&t, 0, 60, 0.3 * cap_i, INTERACTIVE, I_SHAPE);
    struct sl_sim_report rep = run(&c, &t, NULL);
    const struct sl_sim_tier_report *i = &rep.tiers[INTERACTIVE], *b = &rep.tiers[BATCH];
    cr_log_info("flood: capacity %.2f batch rps, %.2f interactive rps; %d batch + %d "
                "interactive requests",
                cap_b, cap_i, b->requests, i->requests);
    cr_log_info("flood: interactive TTFT p50/p99 %.0f/%.0f ms, TPOT p99 %.1f ms, SLO %.3f; "
                "batch TTFT p99 %.0f ms, SLO %.3f, %.2f rps; %ld preemptions",
                i->ttft_ms[0], i->ttft_ms[2], i->tpot_ms[2], i->slo_attainment, b->ttft_ms[2],
                b->slo_attainment, b->throughput_rps, b->preemptions + i->preemptions);
    cr_assert_gt(b->requests, 2.5 * 60 * cap_b, "the flood is there");
    cr_assert_leq(i->ttft_ms[2], sim_tiers[INTERACTIVE].ttft_slo_ms);
    cr_assert_leq(i->tpot_ms[2], sim_tiers[INTERACTIVE].tpot_slo_ms);
    cr_assert_eq(i->completed, i->requests);

    /* Without tiers (one queue, first come first served) the same traffic misses by far. */
    struct trace flat = t;
    flat.r = malloc(sizeof *flat.r * (size_t)t.n);
    int n_i = 0;
    for (int k = 0; k < t.n; k++) {
        flat.r[k] = t.r[k];
        flat.r[k].tier = 0;
    }
    c.lim.n_tiers = 1;
    struct sl_sim_result *res = calloc((size_t)t.n, sizeof *res);
    run(&c, &flat, res);
    double *ttft = malloc(sizeof *ttft * (size_t)t.n);
    for (int k = 0; k < t.n; k++)
        if (t.r[k].tier == INTERACTIVE)
            ttft[n_i++] = res[k].ttft_s * 1e3;
    qsort(ttft, (size_t)n_i, sizeof *ttft, cmp_double);
    double p99 = ttft[(int)ceil(0.99 * n_i) - 1];
    cr_log_info("flood, one FCFS queue: interactive TTFT p99 %.0f ms", p99);
    cr_assert_gt(p99, 10 * sim_tiers[INTERACTIVE].ttft_slo_ms);
    free(ttft);
    free(res);
    free(flat.r);
    free(t.r);
}

/* Output tokens of `tier` in requests finished by `by` seconds. */
static long tokens_by(const struct trace *t, const struct sl_sim_result *res, int tier, double by)
{
    long n = 0;
    for (int i = 0; i < t->n; i++)
        if (t->r[i].tier == tier && res[i].finish == SL_FINISH_LENGTH && res[i].done_at_s <= by)
            n += res[i].n_out;
    return n;
}

Test(sched, sim_batch_keeps_its_share_when_interactive_load_exceeds_capacity)
{
    double cap_i = capacity_rps(INTERACTIVE, I_SHAPE);
    struct sl_sim_config c = sim_config();
    /* A batch backlog, alone and then under interactive load from a third of capacity to four
     * times it. Its throughput: output tokens of batch requests done within the 60 s. */
    struct trace alone = {.rng = 5};
    for (int k = 0; k < 600; k++)
        trace_add(&alone, 0, BATCH, trace_between(&alone, 256, 1024),
                  trace_between(&alone, 64, 256));
    struct sl_sim_result *ra = calloc((size_t)alone.n, sizeof *ra);
    run(&c, &alone, ra);
    long solo = tokens_by(&alone, ra, BATCH, 60);
    double share =
        (double)sim_tiers[BATCH].weight / (sim_tiers[BATCH].weight + sim_tiers[INTERACTIVE].weight);
    static const double loads[] = {0.3, 1, 2, 4};
    for (int k = 0; k < 4; k++) {
        struct trace mixed = alone;
        mixed.r = malloc(sizeof *mixed.r * (size_t)alone.cap);
        memcpy(mixed.r, alone.r, sizeof *mixed.r * (size_t)alone.n);
        trace_poisson(&mixed, 0, 60, loads[k] * cap_i, INTERACTIVE, I_SHAPE);
        struct sl_sim_result *rm = calloc((size_t)mixed.n, sizeof *rm);
        run(&c, &mixed, rm);
        long shared = tokens_by(&mixed, rm, BATCH, 60);
        cr_log_info("batch under %.1fx interactive capacity: %ld tokens in 60 s vs %ld alone: "
                    "%.3f (share %.2f)",
                    loads[k], shared, solo, (double)shared / solo, share);
        cr_assert_geq((double)shared, share * (double)solo, "at %.1fx interactive load", loads[k]);
        free(mixed.r);
        free(rm);
    }
    free(alone.r);
    free(ra);
}

Test(sched, sim_kv_exhaustion_never_deadlocks_when_requests_outgrow_the_pool)
{
    struct sl_sim_config c = sim_config();
    c.lim.n_blocks = 64; /* 1,024 positions for everyone */
    struct trace t = {.rng = 6};
    trace_poisson(&t, 0, 30, 4, INTERACTIVE, 8, 200, 50, 700);
    trace_poisson(&t, 0, 30, 4, BATCH, 100, 500, 100, 500);
    struct sl_sim_result *res = calloc((size_t)t.n, sizeof *res);
    struct sl_sim_report rep = run(&c, &t, res);
    long preempted = 0;
    for (int i = 0; i < t.n; i++) {
        cr_assert_eq(res[i].finish, SL_FINISH_LENGTH, "request %d finished", i);
        cr_assert_eq(res[i].n_out, t.r[i].output_tokens);
        preempted += res[i].preemptions;
    }
    cr_log_info("KV pool of 64 blocks: %d requests done in %.1f s, %ld preemptions", t.n,
                rep.makespan_s, preempted);
    cr_assert_gt(preempted, 50);
    free(res);
    free(t.r);
}

Test(sched, sim_request_that_can_never_fit_is_refused_when_submitted)
{
    struct sl_sim_config c = sim_config();
    c.lim.n_blocks = 8; /* 128 positions */
    struct trace t = {.rng = 7};
    trace_add(&t, 0, BATCH, 100, 100);
    trace_add(&t, 0, BATCH, 50, 20);
    struct sl_sim_result res[2];
    struct sl_sim_report rep = run(&c, &t, res);
    cr_assert_eq(res[0].finish, SL_FINISH_ERROR);
    cr_assert_eq(res[0].status, SL_ERANGE);
    cr_assert_eq(res[1].finish, SL_FINISH_LENGTH);
    cr_assert_eq(rep.tiers[BATCH].refused, 1);
    cr_assert_eq(rep.tiers[BATCH].completed, 1);
    free(t.r);
}
