/* The scheduling core under a fake worker: every behaviour deterministic, no threads, no clock.
 *
 * The fake keeps a KV pool of token ids. Each row writes its token into its block slot, then
 * reads its whole prefix back through the block table and predicts a hash of it. So a sequence's
 * output equals the reference (a lone, sequential run) only if paging, batching and chunking
 * handed the worker exactly the right blocks and positions. */
#include <criterion/criterion.h>
#include <sluice/sched.h>

#include "sched_impl.h"

#include <math.h>
#include <string.h>

#define VOCAB 64
#define STOP_NONE -1

struct fake {
    int n_blocks, block_size;
    int32_t *kv;        /* (n_blocks, block_size) token ids written, -1 when empty */
    int32_t stop_token; /* is_stop_token() says yes to this one */
    int fail_at_call;   /* forward fails on this call (1-based), 0 never */
    int calls;
    int max_seqs_seen, max_rows_seen;
    int decode_steps_with_prefill; /* steps that mixed 1-row decodes and multi-row prefill */
};

static uint32_t prefix_hash(const int32_t *toks, int n)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint32_t)toks[i]) * 16777619u;
    return h;
}

/* The token that follows a prefix; never BOS/EOS-like small ids unless hashing says so. */
static int32_t next_of(const int32_t *toks, int n)
{
    return 3 + (int32_t)(prefix_hash(toks, n) % (VOCAB - 3));
}

static int fake_forward(void *ctx, const struct sl_batch *b, float *logits)
{
    struct fake *f = ctx;
    if (++f->calls == f->fail_at_call)
        return SL_EBACKEND;
    if (b->n_seqs > f->max_seqs_seen)
        f->max_seqs_seen = b->n_seqs;
    if (b->n_tokens > f->max_rows_seen)
        f->max_rows_seen = b->n_tokens;
    int *rows_of = calloc((size_t)b->n_seqs, sizeof *rows_of);
    int li = 0;
    for (int r = 0; r < b->n_tokens; r++) {
        int s = b->seq[r];
        cr_assert(s >= 0 && s < b->n_seqs);
        rows_of[s]++;
        if (r > 0 && b->seq[r - 1] == s)
            cr_assert_eq(b->pos[r], b->pos[r - 1] + 1, "rows of a sequence are in order");
        int pos = b->pos[r];
        cr_assert(pos < b->ctx_len[s]);
        int blk = b->block_tables[s][pos / f->block_size];
        cr_assert(blk >= 0 && blk < f->n_blocks);
        f->kv[blk * f->block_size + pos % f->block_size] = b->tokens[r];
        if (li < b->n_logits && b->logit_rows[li] == r) {
            int32_t prefix[1024];
            for (int p = 0; p <= pos; p++) {
                int pb = b->block_tables[s][p / f->block_size];
                prefix[p] = f->kv[pb * f->block_size + p % f->block_size];
            }
            float *row = logits + (size_t)li * VOCAB;
            for (int v = 0; v < VOCAB; v++)
                row[v] = 0.f;
            row[next_of(prefix, pos + 1)] = 1.f;
            li++;
        }
    }
    cr_assert_eq(li, b->n_logits, "logit rows are ascending rows of the batch");
    bool one = false, many = false;
    for (int s = 0; s < b->n_seqs; s++) {
        one |= rows_of[s] == 1;
        many |= rows_of[s] > 1;
    }
    f->decode_steps_with_prefill += one && many;
    free(rows_of);
    return SL_OK;
}

static bool fake_is_stop(void *ctx, int32_t token)
{
    return token == ((struct fake *)ctx)->stop_token;
}

#define MAX_REQS 8
struct record {
    struct sl_req *reqs[MAX_REQS];
    int32_t out[MAX_REQS][256];
    int n_out[MAX_REQS];
    enum sl_finish finish[MAX_REQS];
    int status[MAX_REQS];
    int n_generated[MAX_REQS];
    int done_calls[MAX_REQS];
    int stop_after; /* sink asks to stop after this many tokens (0 never) */
};

static int index_of(struct record *rec, struct sl_req *r)
{
    for (int i = 0; i < MAX_REQS; i++)
        if (rec->reqs[i] == r)
            return i;
    cr_assert_fail("unknown request");
    return -1;
}

static bool sink_token(void *ctx, struct sl_req *r, int32_t token)
{
    struct record *rec = ctx;
    int i = index_of(rec, r);
    rec->out[i][rec->n_out[i]++] = token;
    return rec->stop_after && rec->n_out[i] == rec->stop_after;
}

static void sink_done(void *ctx, struct sl_req *r, enum sl_finish why, int status, int n)
{
    struct record *rec = ctx;
    int i = index_of(rec, r);
    rec->finish[i] = why;
    rec->status[i] = status;
    rec->n_generated[i] = n;
    rec->done_calls[i]++;
}

struct env {
    struct fake fake;
    struct record rec;
    struct sl_sched_core *core;
    struct sl_sched_limits lim;
};

static void env_init(struct env *e, int max_seqs, int max_batch_tokens, int n_blocks,
                     int block_size)
{
    memset(e, 0, sizeof *e);
    e->fake.n_blocks = n_blocks;
    e->fake.block_size = block_size;
    e->fake.kv = malloc(sizeof(int32_t) * (size_t)(n_blocks * block_size));
    memset(e->fake.kv, 0xff, sizeof(int32_t) * (size_t)(n_blocks * block_size));
    e->fake.stop_token = STOP_NONE;
    e->lim = (struct sl_sched_limits){.vocab = VOCAB,
                                      .max_ctx = 256,
                                      .max_seqs = max_seqs,
                                      .max_batch_tokens = max_batch_tokens,
                                      .n_blocks = n_blocks,
                                      .block_size = block_size};
    struct sl_sched_worker w = {
        .ctx = &e->fake, .forward = fake_forward, .is_stop_token = fake_is_stop};
    struct sl_sched_sink s = {.ctx = &e->rec, .token = sink_token, .done = sink_done};
    e->core = sl_sched_core_new(&e->lim, &w, &s);
    cr_assert_not_null(e->core);
}

static void env_dispose(struct env *e)
{
    sl_sched_core_free(e->core);
    for (int i = 0; i < MAX_REQS; i++)
        if (e->rec.reqs[i])
            sl_req_unref(e->rec.reqs[i]);
    free(e->fake.kv);
}

/* A request whose prompt is 1, 10+i, 11+i, ... (n ids). */
static struct sl_req *add_req(struct env *e, int i, int n_prompt, int max_tokens)
{
    int32_t prompt[512];
    prompt[0] = 1;
    for (int k = 1; k < n_prompt; k++)
        prompt[k] = 3 + (10 + i + k) % (VOCAB - 3);
    struct sl_req_params p = {.max_tokens = max_tokens, .temperature = 0.f, .top_p = 1.f};
    struct sl_req *r = sl_req_new(prompt, n_prompt, &p);
    e->rec.reqs[i] = r;
    return r;
}

/* What a lone sequential run of request i produces. */
static void reference(int i, int n_prompt, int max_tokens, int32_t *out)
{
    int32_t toks[512];
    toks[0] = 1;
    for (int k = 1; k < n_prompt; k++)
        toks[k] = 3 + (10 + i + k) % (VOCAB - 3);
    for (int g = 0; g < max_tokens; g++) {
        toks[n_prompt + g] = next_of(toks, n_prompt + g);
        out[g] = toks[n_prompt + g];
    }
}

static int run_until_idle(struct env *e, int max_steps)
{
    int steps = 0;
    while (sl_sched_core_pending(e->core) > 0 && steps < max_steps) {
        cr_assert_geq(sl_sched_core_step(e->core, (uint64_t)steps), 0);
        steps++;
    }
    cr_assert_eq(sl_sched_core_pending(e->core), 0, "the core drained within %d steps", max_steps);
    return steps;
}

static void assert_matches_reference(struct env *e, int i, int n_prompt, int max_tokens)
{
    int32_t ref[256];
    reference(i, n_prompt, max_tokens, ref);
    cr_assert_eq(e->rec.n_out[i], max_tokens, "request %d produced %d tokens", i, e->rec.n_out[i]);
    for (int g = 0; g < max_tokens; g++)
        cr_assert_eq(e->rec.out[i][g], ref[g], "request %d token %d", i, g);
    cr_assert_eq(e->rec.finish[i], SL_FINISH_LENGTH);
    cr_assert_eq(e->rec.n_generated[i], max_tokens);
    cr_assert_eq(e->rec.done_calls[i], 1);
}

Test(sched, lone_request_generates_reference_tokens_when_greedy)
{
    struct env e;
    env_init(&e, 4, 64, 32, 4);
    cr_assert_eq(sl_sched_core_submit(e.core, add_req(&e, 0, 7, 12), 0), SL_OK);
    run_until_idle(&e, 100);
    assert_matches_reference(&e, 0, 7, 12);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 32, "every block comes back");
    env_dispose(&e);
}

Test(sched, late_request_joins_running_batch_when_submitted_between_steps)
{
    struct env e;
    env_init(&e, 4, 64, 64, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 5, 20), 0);
    for (int k = 0; k < 4; k++)
        sl_sched_core_step(e.core, (uint64_t)k);
    cr_assert_eq(e.fake.max_seqs_seen, 1);
    sl_sched_core_submit(e.core, add_req(&e, 1, 9, 6), 4);
    sl_sched_core_step(e.core, 5);
    cr_assert_eq(e.fake.max_seqs_seen, 2, "the new prompt ran in the same step as the decode");
    run_until_idle(&e, 100);
    assert_matches_reference(&e, 0, 5, 20);
    assert_matches_reference(&e, 1, 9, 6);
    env_dispose(&e);
}

Test(sched, long_prompt_is_chunked_while_decodes_continue_when_over_token_budget)
{
    struct env e;
    env_init(&e, 4, 8, 64, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 3, 30), 0);
    sl_sched_core_step(e.core, 0);
    sl_sched_core_submit(e.core, add_req(&e, 1, 40, 4), 1);
    run_until_idle(&e, 200);
    cr_assert_leq(e.fake.max_rows_seen, 8, "no step exceeds max_batch_tokens");
    /* 40 prompt tokens in chunks of at most 7 (one row goes to the decode) → several mixed steps.
     */
    cr_assert_geq(e.fake.decode_steps_with_prefill, 5);
    assert_matches_reference(&e, 0, 3, 30);
    assert_matches_reference(&e, 1, 40, 4);
    env_dispose(&e);
}

Test(sched, running_sequences_never_exceed_max_seqs_when_more_are_queued)
{
    struct env e;
    env_init(&e, 2, 64, 64, 4);
    for (int i = 0; i < 5; i++)
        sl_sched_core_submit(e.core, add_req(&e, i, 4 + i, 5 + i), 0);
    run_until_idle(&e, 200);
    cr_assert_eq(e.fake.max_seqs_seen, 2);
    for (int i = 0; i < 5; i++)
        assert_matches_reference(&e, i, 4 + i, 5 + i);
    env_dispose(&e);
}

Test(sched, waiting_sequence_runs_after_blocks_free_when_pool_is_small)
{
    struct env e;
    /* 8 blocks of 4: each request needs 6 (24 positions), so only one runs at a time. */
    env_init(&e, 4, 64, 8, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 10, 14), 0);
    sl_sched_core_submit(e.core, add_req(&e, 1, 12, 12), 0);
    sl_sched_core_step(e.core, 0);
    cr_assert_eq(sl_sched_core_running(e.core), 1);
    run_until_idle(&e, 200);
    assert_matches_reference(&e, 0, 10, 14);
    assert_matches_reference(&e, 1, 12, 12);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 8);
    env_dispose(&e);
}

Test(sched, submit_is_refused_when_request_can_never_fit)
{
    struct env e;
    env_init(&e, 4, 64, 8, 4);
    /* Over the context (256). */
    struct sl_req *r = add_req(&e, 0, 200, 100);
    cr_assert_eq(sl_sched_core_submit(e.core, r, 0), SL_ERANGE);
    /* Over the whole pool (32 positions). */
    r = add_req(&e, 1, 20, 20);
    cr_assert_eq(sl_sched_core_submit(e.core, r, 0), SL_ERANGE);
    cr_assert_eq(sl_sched_core_pending(e.core), 0);
    cr_assert_eq(e.rec.done_calls[0] + e.rec.done_calls[1], 0, "a refused submit reports nothing");
    env_dispose(&e);
}

Test(sched, cancel_frees_blocks_and_reports_when_sequence_is_running)
{
    struct env e;
    env_init(&e, 4, 64, 32, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 6, 50), 0);
    sl_sched_core_submit(e.core, add_req(&e, 1, 6, 5), 0);
    sl_sched_core_step(e.core, 0);
    sl_sched_core_step(e.core, 1);
    cr_assert_lt(sl_sched_core_free_blocks(e.core), 32);
    sl_sched_core_cancel(e.core, e.rec.reqs[0]);
    cr_assert_eq(e.rec.finish[0], SL_FINISH_CANCELLED);
    cr_assert_eq(e.rec.n_generated[0], 2);
    sl_sched_core_cancel(e.core, e.rec.reqs[0]); /* twice is harmless */
    cr_assert_eq(e.rec.done_calls[0], 1);
    run_until_idle(&e, 100);
    assert_matches_reference(&e, 1, 6, 5);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 32);
    env_dispose(&e);
}

Test(sched, cancel_flag_is_honoured_at_next_step_when_set_from_another_thread)
{
    struct env e;
    env_init(&e, 4, 64, 32, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 6, 50), 0);
    sl_sched_core_step(e.core, 0);
    atomic_store(&e.rec.reqs[0]->cancelled, true);
    sl_sched_core_step(e.core, 1);
    cr_assert_eq(e.rec.finish[0], SL_FINISH_CANCELLED);
    cr_assert_eq(sl_sched_core_pending(e.core), 0);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 32);
    env_dispose(&e);
}

Test(sched, stop_token_ends_sequence_when_sampled)
{
    struct env e;
    env_init(&e, 4, 64, 32, 4);
    int32_t ref[20];
    reference(0, 5, 20, ref);
    e.fake.stop_token = ref[6];
    int first = 0;
    while (ref[first] != ref[6])
        first++;
    sl_sched_core_submit(e.core, add_req(&e, 0, 5, 20), 0);
    run_until_idle(&e, 100);
    cr_assert_eq(e.rec.finish[0], SL_FINISH_STOP);
    cr_assert_eq(e.rec.n_generated[0], first + 1, "the stop token counts as generated");
    cr_assert_eq(e.rec.n_out[0], first, "but is not handed to the sink as text");
    env_dispose(&e);
}

Test(sched, sink_stop_ends_sequence_when_stop_string_matches)
{
    struct env e;
    env_init(&e, 4, 64, 32, 4);
    e.rec.stop_after = 3;
    sl_sched_core_submit(e.core, add_req(&e, 0, 5, 20), 0);
    run_until_idle(&e, 100);
    cr_assert_eq(e.rec.finish[0], SL_FINISH_STOP);
    cr_assert_eq(e.rec.n_generated[0], 3);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 32);
    env_dispose(&e);
}

Test(sched, worker_failure_fails_the_step_sequences_when_forward_errors)
{
    struct env e;
    env_init(&e, 4, 64, 32, 4);
    e.fake.fail_at_call = 3;
    sl_sched_core_submit(e.core, add_req(&e, 0, 5, 20), 0);
    sl_sched_core_submit(e.core, add_req(&e, 1, 5, 20), 0);
    cr_assert_gt(sl_sched_core_step(e.core, 0), 0);
    cr_assert_gt(sl_sched_core_step(e.core, 1), 0);
    cr_assert_eq(sl_sched_core_step(e.core, 2), SL_EBACKEND);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(e.rec.finish[i], SL_FINISH_ERROR);
        cr_assert_eq(e.rec.status[i], SL_EBACKEND);
    }
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 32);
    env_dispose(&e);
}

Test(sched, free_reports_cancelled_when_requests_are_still_held)
{
    struct env e;
    env_init(&e, 1, 64, 32, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 5, 20), 0);
    sl_sched_core_submit(e.core, add_req(&e, 1, 5, 20), 0);
    sl_sched_core_step(e.core, 0);
    sl_sched_core_free(e.core);
    e.core = NULL;
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(e.rec.finish[i], SL_FINISH_CANCELLED);
        cr_assert_eq(e.rec.done_calls[i], 1);
    }
    env_dispose(&e);
}

Test(sched, stats_count_waiting_running_and_blocks_when_the_pool_is_small)
{
    struct env e;
    /* 8 blocks of 4: each request reserves 6 (24 positions), so only one runs at a time. */
    env_init(&e, 4, 64, 8, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 10, 14), 0);
    sl_sched_core_submit(e.core, add_req(&e, 1, 12, 12), 0);
    struct sl_sched_stats st;
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.n_tiers, 1);
    cr_assert_str_eq(st.tiers[0].name, "default");
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.queued_requests, 2);
    cr_assert_eq(st.queued_prompt_tokens, 22);
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.kv_blocks_total, 8);
    cr_assert_eq(st.steps, 0);

    cr_assert_eq(sl_sched_core_step(e.core, 0), 10);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.running, 1);
    cr_assert_eq(st.queued_requests, 1);
    cr_assert_eq(st.queued_prompt_tokens, 12, "the first prompt is prefilled, the second waits");
    cr_assert_eq(st.tiers[0].running, st.running);
    cr_assert_eq(st.tiers[0].queued_requests, st.queued_requests);
    cr_assert_eq(st.tiers[0].queued_prompt_tokens, st.queued_prompt_tokens);
    cr_assert_eq(st.kv_blocks_used, 6);
    cr_assert_eq(st.last_step_rows, 10);
    cr_assert_eq(st.last_step_seqs, 1);
    cr_assert_eq(st.steps, 1);
    cr_assert_eq(st.last_step_seconds, 0.0, "the core measures no time");

    cr_assert_eq(sl_sched_core_step(e.core, 1), 1);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.last_step_rows, 1, "a lone decode");
    cr_assert_eq(st.steps, 2);

    int steps = 2 + run_until_idle(&e, 200);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.queued_requests, 0);
    cr_assert_eq(st.queued_prompt_tokens, 0);
    cr_assert_eq(st.kv_blocks_used, 0, "every block came back");
    cr_assert_eq(st.kv_blocks_total, 8);
    /* 14 + 12 tokens, one per step, one sequence at a time. */
    cr_assert_eq(st.steps, (uint64_t)steps);
    cr_assert_eq(st.steps, 26);
    env_dispose(&e);
}

Test(sched, stats_count_unprefilled_prompt_tokens_when_a_prompt_is_chunked)
{
    struct env e;
    env_init(&e, 4, 8, 64, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 40, 4), 0);
    struct sl_sched_stats st;
    cr_assert_eq(sl_sched_core_step(e.core, 0), 8);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.running, 1);
    cr_assert_eq(st.queued_requests, 0);
    cr_assert_eq(st.queued_prompt_tokens, 32, "a running prompt's rest is still prefill ahead");
    cr_assert_eq(st.last_step_rows, 8);
    cr_assert_eq(st.kv_blocks_used, 11, "44 positions in blocks of 4");
    env_dispose(&e);
}

Test(sched, queue_time_ends_at_the_first_step_that_runs_the_request_when_it_waited)
{
    struct env e;
    env_init(&e, 4, 64, 8, 4);
    struct sl_req *a = add_req(&e, 0, 10, 14), *b = add_req(&e, 1, 12, 12),
                  *c = add_req(&e, 2, 4, 4);
    /* What the adapter stamps at sl_sched_submit. */
    atomic_store(&a->submit_ns, 50);
    atomic_store(&b->submit_ns, 60);
    atomic_store(&c->submit_ns, 70);
    sl_sched_core_submit(e.core, a, 50);
    sl_sched_core_submit(e.core, b, 60);
    sl_sched_core_submit(e.core, c, 70);
    uint64_t ns = 12345;
    cr_assert(!sl_req_queue_ns(a, &ns), "not run yet");
    cr_assert_eq(ns, 12345);
    sl_sched_core_step(e.core, 100);
    cr_assert(sl_req_queue_ns(a, &ns));
    cr_assert_eq(ns, 50);
    cr_assert(!sl_req_queue_ns(b, &ns), "b waits for a's blocks");
    sl_sched_core_cancel(e.core, c);
    /* a makes one token per step: its 14th, at the step of now = 113, frees its blocks, so b
     * first runs at 114. */
    for (uint64_t now = 101; sl_sched_core_pending(e.core) > 0; now++)
        sl_sched_core_step(e.core, now);
    cr_assert(sl_req_queue_ns(a, &ns));
    cr_assert_eq(ns, 50, "later steps do not move it");
    cr_assert(sl_req_queue_ns(b, &ns));
    cr_assert_eq(ns, 114 - 60);
    cr_assert(!sl_req_queue_ns(c, &ns), "cancelled before it ran");
    env_dispose(&e);
}

Test(sched, busy_ratio_averages_over_time_when_updated_in_any_cut)
{
    const uint64_t sec = 1000000000ull;
    /* Busy throughout: 1 - e^-1 of the way to 1 after one window. */
    double r = sl_sched_busy_update(0.0, 10 * sec, 10 * sec);
    cr_assert_float_eq(r, 1.0 - exp(-1.0), 1e-12);
    /* The same time cut into steps gives the same average. */
    double cut = 0.0;
    for (int i = 0; i < 1000; i++)
        cut = sl_sched_busy_update(cut, 10 * sec / 1000, 10 * sec / 1000);
    cr_assert_float_eq(cut, r, 1e-9);
    /* Half busy for long enough: 0.5, whatever the step size. */
    double half = 0.0;
    for (int i = 0; i < 200000; i++)
        half = sl_sched_busy_update(half, sec / 1000, sec / 2000);
    cr_assert_float_eq(half, 0.5, 1e-6);
    /* Idle decays it; an empty interval and busy beyond the interval are harmless. */
    cr_assert_float_eq(sl_sched_busy_update(0.8, 10 * sec, 0), 0.8 * exp(-1.0), 1e-12);
    cr_assert_eq(sl_sched_busy_update(0.3, 0, 0), 0.3);
    cr_assert_leq(sl_sched_busy_update(0.9, sec, 2 * sec), 1.0);
}
