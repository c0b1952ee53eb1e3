/* Fairness between tenants inside a tier (virtual token counters, scheduler/core.c) under a fake
 * worker: deterministic, no clock.
 *
 * Service is measured from outside the counters: the prompt rows each tenant's sequences have in
 * the batches the worker is handed (w_in each) and the tokens the sink receives (w_out each).
 *
 * The bound. Take two tenants A and B of one VTC tier, share 1, both backlogged (each always has
 * a queued request that is not fully planned). Counters only grow by service, so over any
 * interval [t1, t2] the difference of their services is (c_A - c_B)(t2) - (c_A - c_B)(t1): it is
 * within 2D when |c_A - c_B| <= D at every step boundary. A tenant's prompt rows are planned
 * only on its turn, which comes when its counter is the smallest and lasts until it passes the
 * next smallest by at most one turn of rows, fewer than max_batch_tokens; its decodes (one token
 * per running sequence per step, in priority order, whatever the counters) add at most
 * w_out x max_seqs x max_tokens over the sequences it was admitted for while it was the smallest.
 * So D = w_in x max_batch_tokens + w_out x max_seqs x max_tokens: one step of prompt tokens and the
 * decodes of a full set of slots, VTC's 2 x (largest unit of service) in this scheduler's terms. */
#include <criterion/criterion.h>
#include <sluice/sched.h>

#include "sched_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 32
#define TOKEN 7 /* what the fake worker always predicts: never a stop token */
#define MAX_SEQS 4
#define MAX_BATCH 64
#define MAX_TOKENS 4
#define MAX_TENANTS 3
#define MAX_REQS 1024

struct world {
    struct sl_sched_core *core;
    struct sl_sched_tier tier;
    struct sl_req *reqs[MAX_REQS];
    int n_reqs;
    int done;
    /* Per tenant ("A", "B", "C"): service so far, and the step its first token came in. */
    double service[MAX_TENANTS];
    long prompt_rows[MAX_TENANTS];
    long tokens[MAX_TENANTS];
    int queued[MAX_TENANTS]; /* submitted and not finished */
    int first_token_step[MAX_REQS];
    int step;
    bool disposing; /* what is left is cancelled */
};

static struct world *W; /* the fake worker's and the sink's view */

static int tenant_index(const struct sl_req *r)
{
    return r->params.tenant[0] - 'A';
}

static int fake_forward(void *ctx, const struct sl_batch *b, float *logits)
{
    (void)ctx;
    const struct sl_sched_core *c = W->core;
    for (int r = 0; r < b->n_tokens; r++) {
        const struct sl_req *req = c->b_seqs[b->seq[r]]->req;
        if (b->pos[r] < req->n_prompt) {
            int t = tenant_index(req);
            W->service[t] += W->tier.w_in;
            W->prompt_rows[t]++;
        }
    }
    for (int i = 0; i < b->n_logits; i++) {
        float *row = logits + (size_t)i * VOCAB;
        memset(row, 0, sizeof(float) * VOCAB);
        row[TOKEN] = 1.f;
    }
    return SL_OK;
}

static bool fake_is_stop(void *ctx, int32_t token)
{
    (void)ctx;
    return token == 0;
}

static int req_index(const struct sl_req *r)
{
    for (int i = 0; i < W->n_reqs; i++)
        if (W->reqs[i] == r)
            return i;
    cr_assert_fail("unknown request");
    return -1;
}

static bool sink_token(void *ctx, struct sl_req *r, int32_t token)
{
    (void)ctx, (void)token;
    int t = tenant_index(r);
    W->service[t] += W->tier.w_out;
    W->tokens[t]++;
    int i = req_index(r);
    if (W->first_token_step[i] < 0)
        W->first_token_step[i] = W->step;
    return false;
}

static void sink_done(void *ctx, struct sl_req *r, enum sl_finish why, int status, int n)
{
    (void)ctx, (void)n;
    if (W->disposing)
        return;
    cr_assert_eq(why, SL_FINISH_LENGTH);
    cr_assert_eq(status, SL_OK);
    W->queued[tenant_index(r)]--;
    W->done++;
}

static void world_init(struct world *w, int fairness, int n_blocks, int block_size)
{
    memset(w, 0, sizeof *w);
    W = w;
    w->tier = (struct sl_sched_tier){
        .name = "batch", .priority = 1, .weight = 1, .fairness = fairness, .w_in = 1, .w_out = 2};
    struct sl_sched_limits lim = {.vocab = VOCAB,
                                  .max_ctx = 1024,
                                  .max_seqs = MAX_SEQS,
                                  .max_batch_tokens = MAX_BATCH,
                                  .n_blocks = n_blocks,
                                  .block_size = block_size,
                                  .tiers = &w->tier,
                                  .n_tiers = 1};
    struct sl_sched_worker wk = {.forward = fake_forward, .is_stop_token = fake_is_stop};
    struct sl_sched_sink sk = {.token = sink_token, .done = sink_done};
    w->core = sl_sched_core_new(&lim, &wk, &sk);
    cr_assert_not_null(w->core);
}

static void world_dispose(struct world *w)
{
    w->disposing = true;
    sl_sched_core_free(w->core);
    for (int i = 0; i < w->n_reqs; i++)
        sl_req_unref(w->reqs[i]);
}

/* Submits a request of tenant `name` (its first letter counts it: 'A' + t) with share
 * `share`. */
static void submit_as(struct world *w, const char *name, int n_prompt, int max_tokens, float share)
{
    cr_assert_lt(w->n_reqs, MAX_REQS);
    int32_t prompt[1024];
    prompt[0] = 1;
    for (int k = 1; k < n_prompt; k++)
        prompt[k] = 3 + k % (VOCAB - 3);
    struct sl_req_params p = {.max_tokens = max_tokens,
                              .top_p = 1.f,
                              .ignore_eos = true,
                              .sched_tier = w->tier,
                              .share = share};
    snprintf(p.tenant, sizeof p.tenant, "%s", name);
    struct sl_req *r = sl_req_new(sl_req_prompt_copy(prompt, n_prompt), &p);
    w->first_token_step[w->n_reqs] = -1;
    w->reqs[w->n_reqs++] = r;
    cr_assert_eq(sl_sched_core_submit(w->core, r, (uint64_t)w->step), SL_OK);
    w->queued[name[0] - 'A']++;
}

static void submit(struct world *w, int t, int n_prompt, int max_tokens, float share)
{
    char name[2] = {(char)('A' + t), '\0'};
    submit_as(w, name, n_prompt, max_tokens, share);
}

static void step(struct world *w)
{
    cr_assert_geq(sl_sched_core_step(w->core, (uint64_t)w->step), 0);
    w->step++;
}

/* Runs `steps` steps with A and B kept backlogged (a few requests queued each: A long prompts,
 * B short ones); returns the largest |(service_A - service_B) over [i, j]| over all steps i < j. */
static double backlogged_gap(struct world *w, int steps, double share_b)
{
    static double a[1024], b[1024];
    cr_assert_leq(steps, 1023);
    for (int i = 0; i < 3; i++) { /* A's flood arrives first */
        submit(w, 0, 200, MAX_TOKENS, 1);
        submit(w, 0, 200, MAX_TOKENS, 1);
    }
    for (int i = 0; i <= steps; i++) {
        while (w->queued[0] < 6)
            submit(w, 0, 200, MAX_TOKENS, 1);
        while (w->queued[1] < 6)
            submit(w, 1, 24, MAX_TOKENS, (float)share_b);
        a[i] = w->service[0];
        b[i] = w->service[1] / share_b;
        if (i < steps)
            step(w);
    }
    double worst = 0;
    for (int i = 0; i <= steps; i++)
        for (int j = i + 1; j <= steps; j++)
            worst = fmax(worst, fabs((a[j] - a[i]) - (b[j] - b[i])));
    return worst;
}

static const double D = 1.0 * MAX_BATCH + 2.0 * MAX_SEQS * MAX_TOKENS;

Test(vtc, two_backlogged_tenants_stay_within_the_derived_bound_over_every_interval)
{
    struct world w;
    world_init(&w, SL_SCHED_VTC, 4096, 16);
    double gap = backlogged_gap(&w, 400, 1);
    cr_log_info("vtc: largest service gap over an interval %.0f, bound 2D = %.0f", gap, 2 * D);
    cr_assert_leq(gap, 2 * D, "gap %.0f over 2D = %.0f", gap, 2 * D);
    cr_assert_gt(w.service[1], 0.4 * (w.service[0] + w.service[1]), "B got its half: %.0f of %.0f",
                 w.service[1], w.service[0] + w.service[1]);
    world_dispose(&w);
}

Test(vtc, first_come_first_served_breaks_the_bound_the_same_load_keeps_under_vtc)
{
    struct world w;
    world_init(&w, SL_SCHED_FCFS, 4096, 16);
    double gap = backlogged_gap(&w, 400, 1);
    cr_log_info("fcfs: largest service gap over an interval %.0f, bound 2D = %.0f", gap, 2 * D);
    cr_assert_gt(gap, 2 * D, "FCFS is not bounded: %.0f", gap);
    world_dispose(&w);
}

Test(vtc, a_share_of_two_gets_twice_the_service_within_the_bound)
{
    struct world w;
    world_init(&w, SL_SCHED_VTC, 4096, 16);
    double gap = backlogged_gap(&w, 400, 2);
    cr_assert_leq(gap, 2 * D, "counted per share: gap %.0f over 2D = %.0f", gap, 2 * D);
    double ratio = w.service[1] / w.service[0];
    cr_assert(ratio > 1.7 && ratio < 2.3, "B (share 2) over A: %.2f", ratio);
    world_dispose(&w);
}

Test(vtc, a_tenant_that_wakes_is_served_in_its_first_step_and_banks_nothing_while_idle)
{
    struct world w;
    world_init(&w, SL_SCHED_VTC, 4096, 16);
    for (int i = 0; i < 40; i++)
        submit(&w, 0, 200, MAX_TOKENS, 1);
    for (int i = 0; i < 30; i++)
        step(&w);
    /* B was idle all along: it starts at A's counter, not at zero. */
    double a_before = w.service[0];
    int first = w.n_reqs;
    submit(&w, 1, 24, MAX_TOKENS, 1);
    step(&w);
    cr_assert_eq(w.prompt_rows[1], 24, "B's whole prompt was in the step after it arrived");
    cr_assert_eq(w.first_token_step[first], w.step - 1);
    cr_assert_leq(w.service[0] - a_before, D, "A got at most one step's worth meanwhile");
    const struct sl_vtc *a = NULL, *b = NULL;
    for (const struct sl_vtc *v = w.core->tiers[0].vtc; v; v = v->next)
        *(v->name[0] == 'A' ? &a : &b) = v;
    cr_assert(a && b);
    cr_assert_geq(b->counter, a_before - D, "B started near A's counter (%.0f), not at 0 (%.0f)",
                  a_before, b->counter);
    /* B goes idle again and comes back: A was served meanwhile, B is lifted to A again. */
    for (int i = 0; i < 20; i++)
        step(&w);
    cr_assert_eq(w.queued[1], 0);
    submit(&w, 1, 24, MAX_TOKENS, 1);
    cr_assert_geq(b->counter, a->counter - 1e-9, "lifted to the smallest active counter");
    world_dispose(&w);
}

Test(vtc, a_recompute_after_preemption_is_not_counted_twice)
{
    struct world w;
    /* 24 blocks of 4 positions: four running requests of 20 + 16 tokens (9 blocks each at the
     * end) do not fit together, so growth preempts and the victims recompute. */
    world_init(&w, SL_SCHED_VTC, 24, 4);
    for (int i = 0; i < 8; i++)
        submit(&w, i % 2, 20, 16, 1);
    while (sl_sched_core_pending(w.core) > 0 && w.step < 2000)
        step(&w);
    cr_assert_eq(w.done, 8);
    struct sl_sched_stats st;
    sl_sched_core_stats(w.core, &st);
    cr_assert_gt(st.preemptions, 0, "the pool was too small for all at once");
    for (const struct sl_vtc *v = w.core->tiers[0].vtc; v; v = v->next) {
        /* 4 requests, each 20 prompt tokens at 1 and 16 generated at 2. */
        cr_assert_eq(v->counter, 4 * (20 * 1.0 + 16 * 2.0), "tenant %s: %.0f", v->name, v->counter);
        cr_assert_eq(v->n_active, 0);
    }
    world_dispose(&w);
}

Test(vtc, a_new_tier_table_keeps_the_counters_of_tiers_that_keep_their_name)
{
    struct world w;
    world_init(&w, SL_SCHED_VTC, 4096, 16);
    for (int i = 0; i < 4; i++) {
        submit(&w, 0, 100, MAX_TOKENS, 1);
        submit(&w, 1, 30, MAX_TOKENS, 1);
    }
    for (int i = 0; i < 5; i++)
        step(&w);
    double before[2] = {0, 0};
    for (const struct sl_vtc *v = w.core->tiers[0].vtc; v; v = v->next)
        before[v->name[0] - 'A'] = v->counter;
    cr_assert(before[0] > 0 && before[1] > 0 && before[0] != before[1]);
    struct sl_sched_tier next[2] = {{.name = "interactive", .priority = 0, .weight = 4}, w.tier};
    cr_assert_eq(sl_sched_core_set_tiers(w.core, next, 2), SL_OK);
    int n = 0;
    for (const struct sl_vtc *v = w.core->tiers[1].vtc; v; v = v->next, n++)
        cr_assert_eq(v->counter, before[v->name[0] - 'A'], "%s kept its count", v->name);
    cr_assert_eq(n, 2);
    while (sl_sched_core_pending(w.core) > 0 && w.step < 2000)
        step(&w);
    cr_assert_eq(w.done, 8, "every request still finished");
    world_dispose(&w);
}

Test(vtc, idle_tenants_are_forgotten_past_the_limit_the_oldest_first)
{
    struct world w;
    world_init(&w, SL_SCHED_VTC, 4096, 16);
    /* Tenants with names of their own ("C0", "C1", ...), one request each, served one after
     * the other. */
    char name[8];
    for (int i = 0; i < SL_VTC_IDLE_MAX + 10; i++) {
        snprintf(name, sizeof name, "C%d", i);
        submit_as(&w, name, 2, 1, 1);
        step(&w);
        cr_assert_eq(sl_sched_core_pending(w.core), 0);
    }
    int n = 0;
    bool first_kept = false;
    for (const struct sl_vtc *v = w.core->tiers[0].vtc; v; v = v->next, n++)
        first_kept |= strcmp(v->name, "C0") == 0;
    cr_assert_eq(n, SL_VTC_IDLE_MAX, "memory is bounded: %d tenants kept", n);
    cr_assert_not(first_kept, "the longest idle went first");
    world_dispose(&w);
}
