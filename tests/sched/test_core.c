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
#include <stdio.h>
#include <string.h>

#define VOCAB 64
#define STOP_NONE -1

struct fake {
    bool soft; /* logits spread over the vocabulary (for sampling) instead of one-hot */
    int n_blocks, block_size;
    int32_t *kv;        /* (n_blocks, block_size) token ids written, -1 when empty */
    int32_t stop_token; /* is_stop_token() says yes to this one */
    int fail_at_call;   /* forward fails on this call (1-based), 0 never */
    int calls;
    int max_seqs_seen, max_rows_seen;
    int last_rows;                 /* of the latest batch */
    int decode_steps_with_prefill; /* steps that mixed 1-row decodes and multi-row prefill */
    uint64_t ns_each;              /* what forward_ns reports for every forward */
    uint64_t ns_total;             /* the sum of what it reported */
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
    f->last_rows = b->n_tokens;
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
            uint32_t h = prefix_hash(prefix, pos + 1);
            for (int v = 0; v < VOCAB; v++)
                row[v] = f->soft ? (float)((h * (uint32_t)(2 * v + 1)) >> 24) / 64.f : 0.f;
            if (!f->soft)
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

#define MAX_REQS 64
struct record {
    struct sl_req *reqs[MAX_REQS];
    int32_t out[MAX_REQS][256];
    int n_out[MAX_REQS];
    enum sl_finish finish[MAX_REQS];
    int status[MAX_REQS];
    int n_generated[MAX_REQS];
    int done_calls[MAX_REQS];
    int preempted[MAX_REQS];
    int stop_after; /* sink asks to stop after this many tokens (0 never) */
    struct sl_token_logprobs lp[MAX_REQS][16]; /* the first 16 tokens' log probabilities */
    int n_lp[MAX_REQS];
    int lp_before_token; /* logprobs() calls that came right before the token() they describe */
};

static int index_of(struct record *rec, struct sl_req *r)
{
    for (int i = 0; i < MAX_REQS; i++)
        if (rec->reqs[i] == r)
            return i;
    cr_assert_fail("unknown request");
    return -1;
}

static void sink_logprobs(void *ctx, struct sl_req *r, const struct sl_token_logprobs *lp)
{
    struct record *rec = ctx;
    int i = index_of(rec, r);
    cr_assert_eq(rec->n_lp[i], rec->n_out[i], "one logprobs() per token, before its token()");
    if (rec->n_lp[i] < 16)
        rec->lp[i][rec->n_lp[i]] = *lp;
    rec->n_lp[i]++;
}

static bool sink_token(void *ctx, struct sl_req *r, int32_t token)
{
    struct record *rec = ctx;
    int i = index_of(rec, r);
    if (rec->n_lp[i] == rec->n_out[i] + 1 && rec->lp[i][rec->n_out[i] % 16].token == token)
        rec->lp_before_token++;
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

static void sink_preempted(void *ctx, struct sl_req *r)
{
    struct record *rec = ctx;
    rec->preempted[index_of(rec, r)]++;
}

struct env {
    struct fake fake;
    struct record rec;
    struct sl_sched_core *core;
    struct sl_sched_limits lim;
};

static const struct sl_sched_tier two_tiers[2] = {
    {.name = "interactive", .priority = 0, .weight = 4, .ttft_slo_ms = 1000, .tpot_slo_ms = 100},
    {.name = "batch", .priority = 1, .weight = 1, .ttft_slo_ms = 60000, .tpot_slo_ms = 1000},
};

/* (Re)creates e's core over e->lim on the fake worker, with `sample` as its forward_sample (NULL:
 * the core samples), reporting to e->rec. The model's stop token is e->fake.stop_token as set
 * now: the core lists it once. */
static uint64_t fake_forward_ns(void *ctx)
{
    struct fake *f = ctx;
    f->ns_total += f->ns_each;
    return f->ns_each;
}

static void env_core(struct env *e, int (*sample)(void *, const struct sl_batch *,
                                                  const struct sl_sample_row *, int32_t *))
{
    struct sl_sched_worker w = {.ctx = &e->fake,
                                .forward = fake_forward,
                                .forward_sample = sample,
                                .is_stop_token = fake_is_stop,
                                .forward_ns = fake_forward_ns};
    struct sl_sched_sink s = {.ctx = &e->rec,
                              .token = sink_token,
                              .logprobs = sink_logprobs,
                              .done = sink_done,
                              .preempted = sink_preempted};
    if (e->core)
        sl_sched_core_free(e->core);
    e->core = sl_sched_core_new(&e->lim, &w, &s);
    cr_assert_not_null(e->core);
}

static void env_init_tiers(struct env *e, int max_seqs, int max_batch_tokens, int n_blocks,
                           int block_size, const struct sl_sched_tier *tiers, int n_tiers)
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
                                      .block_size = block_size,
                                      .tiers = tiers,
                                      .n_tiers = n_tiers};
    env_core(e, NULL);
}

static void env_init(struct env *e, int max_seqs, int max_batch_tokens, int n_blocks,
                     int block_size)
{
    env_init_tiers(e, max_seqs, max_batch_tokens, n_blocks, block_size, NULL, 0);
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
    struct sl_req *r = sl_req_new(sl_req_prompt_copy(prompt, n_prompt), &p);
    e->rec.reqs[i] = r;
    return r;
}

/* The same in tier t of two_tiers, with that tier's priority and objectives. */
static struct sl_req *add_req_tier(struct env *e, int i, int n_prompt, int max_tokens, int t)
{
    int32_t prompt[512];
    prompt[0] = 1;
    for (int k = 1; k < n_prompt; k++)
        prompt[k] = 3 + (10 + i + k) % (VOCAB - 3);
    struct sl_req_params p = {.max_tokens = max_tokens,
                              .temperature = 0.f,
                              .top_p = 1.f,
                              .tier = t,
                              .sched_tier = two_tiers[t]};
    struct sl_req *r = sl_req_new(sl_req_prompt_copy(prompt, n_prompt), &p);
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

/* Blocks are taken as sequences grow, so both start; when the pool runs out the later arrival is
 * preempted, recomputes what it had, and still produces exactly the reference tokens, each
 * reported once. (Up-front reservation ran them one after the other.) */
Test(sched, later_sequence_is_preempted_and_resumes_losslessly_when_blocks_run_out)
{
    struct env e;
    /* 8 blocks of 4: each request ends at 24 positions (6 blocks); both start (3 + 3 blocks and
     * one spare) and cannot both finish. */
    env_init(&e, 4, 64, 8, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 10, 14), 0);
    sl_sched_core_submit(e.core, add_req(&e, 1, 12, 12), 0);
    sl_sched_core_step(e.core, 0);
    cr_assert_eq(sl_sched_core_running(e.core), 2, "both started on their prompts' blocks");
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 2);
    run_until_idle(&e, 200);
    cr_assert_eq(e.rec.preempted[0], 0, "the first arrival is never the victim");
    cr_assert_geq(e.rec.preempted[1], 1);
    assert_matches_reference(&e, 0, 10, 14);
    assert_matches_reference(&e, 1, 12, 12);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 8);
    struct sl_sched_stats st;
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.preemptions, (uint64_t)e.rec.preempted[1]);
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

/* The core starts no threads: here the flag is set between two steps, as sl_sched_cancel sets it
 * from an I/O thread while the scheduler thread is between or inside steps (test_sched.c's
 * cancel_finishes_request_early_when_client_leaves runs that across threads). */
Test(sched, cancel_flag_is_honoured_at_next_step_when_set_between_steps)
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
    /* 8 blocks of 4. The first request starts on 3 blocks and grows to 6; the second needs 5
     * for its prompt plus one spare, so it waits until the first is done. */
    env_init(&e, 4, 64, 8, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 10, 14), 0);
    sl_sched_core_submit(e.core, add_req(&e, 1, 20, 4), 0);
    struct sl_sched_stats st;
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.n_tiers, 1);
    cr_assert_str_eq(st.tiers[0].name, "default");
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.queued_requests, 2);
    cr_assert_eq(st.queued_prompt_tokens, 30);
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.kv_blocks_total, 8);
    cr_assert_eq(st.block_size, 4, "the positions each of those blocks holds");
    cr_assert_eq(st.steps, 0);

    cr_assert_eq(sl_sched_core_step(e.core, 0), 10);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.running, 1);
    cr_assert_eq(st.queued_requests, 1);
    cr_assert_eq(st.queued_prompt_tokens, 20, "the first prompt is prefilled, the second waits");
    cr_assert_eq(st.tiers[0].running, st.running);
    cr_assert_eq(st.tiers[0].queued_requests, st.queued_requests);
    cr_assert_eq(st.tiers[0].queued_prompt_tokens, st.queued_prompt_tokens);
    cr_assert_eq(st.kv_blocks_used, 3, "the prompt's 10 positions, not its whole length");
    cr_assert_eq(st.last_step_rows, 10);
    cr_assert_eq(st.last_step_seqs, 1);
    cr_assert_eq(st.steps, 1);
    cr_assert_eq(st.last_step_seconds, 0.0, "the core measures no time");

    /* Decodes write positions 10, 11, then 12, which opens a fourth block. */
    cr_assert_eq(sl_sched_core_step(e.core, 1), 1);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.last_step_rows, 1, "a lone decode");
    cr_assert_eq(st.steps, 2);
    cr_assert_eq(st.kv_blocks_used, 3);
    sl_sched_core_step(e.core, 2);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.kv_blocks_used, 3);
    sl_sched_core_step(e.core, 3);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.kv_blocks_used, 4, "blocks grow with the sequence");
    cr_assert_eq(st.queued_requests, 1, "3 free blocks do not start a 5-block prompt");

    int steps = 4 + run_until_idle(&e, 200);
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.queued_requests, 0);
    cr_assert_eq(st.queued_prompt_tokens, 0);
    cr_assert_eq(st.kv_blocks_used, 0, "every block came back");
    cr_assert_eq(st.kv_blocks_total, 8);
    cr_assert_eq(st.preemptions, 0);
    /* 14 tokens one per step, then the second prompt and its 4 tokens. */
    cr_assert_eq(st.steps, (uint64_t)steps);
    cr_assert_eq(st.steps, 18);
    assert_matches_reference(&e, 0, 10, 14);
    assert_matches_reference(&e, 1, 20, 4);
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
    cr_assert_eq(st.kv_blocks_used, 10, "the prompt's 40 positions are taken when it starts");
    env_dispose(&e);
}

Test(sched, queue_time_ends_at_the_first_step_that_runs_the_request_when_it_waited)
{
    struct env e;
    env_init(&e, 1, 64, 64, 4);
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
    cr_assert(!sl_req_queue_ns(b, &ns), "b waits for a's slot");
    sl_sched_core_cancel(e.core, c);
    /* a makes one token per step: its 14th, at the step of now = 113, frees its slot, so b first
     * runs at 114. */
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

/* ---------------------------------------------------------------------------------------------
 * Tiers: shares, priority, preemption.
 */

static long tier_queued_tokens(struct env *e, int t)
{
    struct sl_sched_stats st;
    sl_sched_core_stats(e->core, &st);
    return st.tiers[t].queued_prompt_tokens;
}

Test(sched, prompt_tokens_are_shared_by_weight_when_tiers_compete)
{
    struct env e;
    env_init_tiers(&e, 4, 16, 64, 4, two_tiers, 2);
    /* The batch prompt arrives first; weights 4:1 still give interactive 4/5 of every step. */
    sl_sched_core_submit(e.core, add_req_tier(&e, 0, 100, 4, 1), 0);
    sl_sched_core_submit(e.core, add_req_tier(&e, 1, 100, 4, 0), 1);
    for (int k = 0; k < 5; k++) {
        cr_assert_eq(sl_sched_core_step(e.core, (uint64_t)(2 + k)), 16, "the budget is used up");
        /* Fractions are carried: batch gets 3, 3, 3, 3 then 4 rows. */
        long batch_done = 100 - tier_queued_tokens(&e, 1);
        cr_assert_eq(batch_done, 3 * (k + 1) + (k == 4), "step %d: batch prefilled %ld", k,
                     batch_done);
    }
    cr_assert_eq(100 - tier_queued_tokens(&e, 0), 64, "interactive got 4/5 of 80 rows");
    run_until_idle(&e, 200);
    assert_matches_reference(&e, 0, 100, 4);
    assert_matches_reference(&e, 1, 100, 4);
    env_dispose(&e);
}

Test(sched, idle_tier_share_is_lent_and_taken_back_when_it_has_work)
{
    struct env e;
    env_init_tiers(&e, 4, 16, 64, 4, two_tiers, 2);
    sl_sched_core_submit(e.core, add_req_tier(&e, 0, 120, 4, 1), 0);
    for (int k = 0; k < 3; k++)
        sl_sched_core_step(e.core, (uint64_t)k);
    cr_assert_eq(120 - tier_queued_tokens(&e, 1), 48, "alone, batch borrows the whole budget");
    sl_sched_core_submit(e.core, add_req_tier(&e, 1, 60, 4, 0), 3);
    sl_sched_core_step(e.core, 3);
    cr_assert_eq(60 - tier_queued_tokens(&e, 0), 13, "interactive takes its share back at once");
    cr_assert_eq(120 - tier_queued_tokens(&e, 1), 51);
    run_until_idle(&e, 200);
    assert_matches_reference(&e, 0, 120, 4);
    assert_matches_reference(&e, 1, 60, 4);
    env_dispose(&e);
}

Test(sched, decodes_of_the_higher_tier_run_first_when_max_batch_tokens_is_short)
{
    struct env e;
    /* Two rows a step: with three decoding sequences, one waits each step, never interactive. */
    env_init_tiers(&e, 4, 2, 64, 4, two_tiers, 2);
    sl_sched_core_submit(e.core, add_req_tier(&e, 0, 2, 30, 1), 0);
    sl_sched_core_submit(e.core, add_req_tier(&e, 1, 2, 30, 1), 1);
    sl_sched_core_submit(e.core, add_req_tier(&e, 2, 2, 10, 0), 2);
    for (int k = 0; k < 4; k++)
        sl_sched_core_step(e.core, (uint64_t)k);
    int before = e.rec.n_out[2];
    for (int k = 4; k < 10; k++)
        sl_sched_core_step(e.core, (uint64_t)k);
    cr_assert_eq(e.rec.n_out[2] - before, 6, "interactive decoded in every step");
    run_until_idle(&e, 400);
    for (int i = 0; i < 3; i++)
        assert_matches_reference(&e, i, 2, i == 2 ? 10 : 30);
    env_dispose(&e);
}

#define MS 1000000ull /* steps of 20 ms: the core measures its decode step time from `now` */

/* vLLM's inversion: with every slot taken by batch sequences, an interactive arrival waited for
 * one to finish. Here, when none is about to, it preempts the latest batch sequences, down to
 * batch's guaranteed slot. */
Test(sched, interactive_arrival_preempts_batch_when_max_seqs_is_full)
{
    struct env e;
    env_init_tiers(&e, 4, 64, 128, 4, two_tiers, 2);
    for (int i = 0; i < 4; i++)
        sl_sched_core_submit(e.core, add_req_tier(&e, i, 6, 40, 1), (uint64_t)i);
    uint64_t now = 0;
    for (int k = 0; k < 4; k++, now += 20 * MS)
        sl_sched_core_step(e.core, now);
    cr_assert_eq(sl_sched_core_running(e.core), 4);
    for (int i = 4; i < 8; i++)
        sl_sched_core_submit(e.core, add_req_tier(&e, i, 6, 8, 0), now);
    /* Every batch sequence has 36 tokens left: 720 ms, beyond a quarter of the 1 s TTFT. */
    sl_sched_core_step(e.core, now);
    struct sl_sched_stats st;
    sl_sched_core_stats(e.core, &st);
    /* Batch keeps ceil(4 * 1/5) = 1 slot; interactive gets the other 3. */
    cr_assert_eq(st.tiers[0].running, 3);
    cr_assert_eq(st.tiers[1].running, 1);
    cr_assert_eq(st.tiers[0].queued_requests, 1);
    cr_assert_eq(e.rec.preempted[0], 0, "the earliest batch sequence keeps its slot");
    for (int i = 1; i < 4; i++)
        cr_assert_eq(e.rec.preempted[i], 1, "batch %d was preempted", i);
    cr_assert_eq(st.tiers[1].preemptions, 3);
    run_until_idle(&e, 400);
    for (int i = 0; i < 8; i++)
        assert_matches_reference(&e, i, 6, i < 4 ? 40 : 8);
    for (int i = 4; i < 8; i++)
        cr_assert_eq(e.rec.preempted[i], 0, "interactive is never preempted for batch");
    env_dispose(&e);
}

Test(sched, interactive_arrival_waits_for_a_slot_when_a_batch_sequence_is_about_to_end)
{
    struct env e;
    env_init_tiers(&e, 2, 64, 128, 4, two_tiers, 2);
    sl_sched_core_submit(e.core, add_req_tier(&e, 0, 6, 40, 1), 0);
    sl_sched_core_submit(e.core, add_req_tier(&e, 1, 6, 7, 1), 1);
    uint64_t now = 0;
    for (int k = 0; k < 4; k++, now += 20 * MS)
        sl_sched_core_step(e.core, now);
    /* Batch 1 has 3 tokens left (60 ms): cheaper to wait than to throw work away. */
    sl_sched_core_submit(e.core, add_req_tier(&e, 2, 6, 8, 0), now);
    for (int k = 0; k < 3; k++, now += 20 * MS) {
        sl_sched_core_step(e.core, now);
        cr_assert_eq(e.rec.n_out[2], 0);
    }
    cr_assert_eq(e.rec.done_calls[1], 1, "batch 1 ended");
    sl_sched_core_step(e.core, now);
    cr_assert_eq(e.rec.n_out[2], 1, "interactive took its slot at once");
    run_until_idle(&e, 400);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(e.rec.preempted[i], 0);
    assert_matches_reference(&e, 0, 6, 40);
    assert_matches_reference(&e, 2, 6, 8);
    env_dispose(&e);
}

Test(sched, growth_preempts_the_lower_tier_when_it_arrived_earlier)
{
    struct env e;
    /* 10 blocks of 4. Interactive grows to 9 blocks, batch to 7: one must give way, and it is
     * batch although it arrived first. */
    env_init_tiers(&e, 4, 64, 10, 4, two_tiers, 2);
    sl_sched_core_submit(e.core, add_req_tier(&e, 0, 8, 20, 1), 0);
    sl_sched_core_submit(e.core, add_req_tier(&e, 1, 20, 16, 0), 1);
    sl_sched_core_step(e.core, 2);
    cr_assert_eq(sl_sched_core_running(e.core), 2);
    run_until_idle(&e, 400);
    cr_assert_eq(e.rec.preempted[1], 0);
    cr_assert_geq(e.rec.preempted[0], 1);
    assert_matches_reference(&e, 0, 8, 20);
    assert_matches_reference(&e, 1, 20, 16);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 10);
    env_dispose(&e);
}

/* Many requests of both tiers, arriving over time, through a pool far too small for them: every
 * one finishes with exactly its reference tokens, reported once, and every block comes back. */
Test(sched, every_request_finishes_losslessly_when_the_kv_pool_is_exhausted)
{
    struct env e;
    env_init_tiers(&e, 8, 24, 16, 4, two_tiers, 2);
    uint32_t rng = 12345;
    int n_prompt[48], max_tokens[48], next = 0, steps = 0;
    for (int i = 0; i < 48; i++) {
        rng = rng * 1103515245u + 12345u;
        n_prompt[i] = 2 + (int)(rng >> 16) % 30;
        rng = rng * 1103515245u + 12345u;
        max_tokens[i] = 1 + (int)(rng >> 16) % (64 - n_prompt[i]);
    }
    while ((next < 48 || sl_sched_core_pending(e.core) > 0) && steps < 20000) {
        if (next < 48 && steps % 3 == 0) {
            struct sl_req *r =
                add_req_tier(&e, next, n_prompt[next], max_tokens[next], next % 3 == 0);
            cr_assert_eq(sl_sched_core_submit(e.core, r, (uint64_t)steps), SL_OK);
            next++;
        }
        cr_assert_geq(sl_sched_core_step(e.core, (uint64_t)steps), 0);
        steps++;
        cr_assert_leq(e.fake.max_rows_seen, 24);
    }
    cr_assert_eq(sl_sched_core_pending(e.core), 0, "drained in %d steps", steps);
    int preempted = 0;
    for (int i = 0; i < 48; i++) {
        assert_matches_reference(&e, i, n_prompt[i], max_tokens[i]);
        preempted += e.rec.preempted[i];
    }
    cr_assert_gt(preempted, 10, "the pool was really exhausted (%d preemptions)", preempted);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 16);
    env_dispose(&e);
}

Test(sched, queued_requests_move_by_tier_name_when_the_table_changes)
{
    struct env e;
    env_init_tiers(&e, 1, 64, 64, 4, two_tiers, 2);
    sl_sched_core_submit(e.core, add_req_tier(&e, 0, 5, 6, 1), 0);
    sl_sched_core_submit(e.core, add_req_tier(&e, 1, 7, 6, 1), 1);
    sl_sched_core_submit(e.core, add_req_tier(&e, 2, 9, 6, 0), 2);
    sl_sched_core_step(e.core, 3); /* interactive runs, the batch ones wait for the slot */
    /* The reload drops "interactive", adds "gold" at its priority and puts "batch" first. */
    struct sl_sched_tier next[2] = {
        {.name = "batch", .priority = 5, .weight = 2},
        {.name = "gold", .priority = 0, .weight = 3, .tpot_slo_ms = 50},
    };
    cr_assert_eq(sl_sched_core_set_tiers(e.core, next, 2), SL_OK);
    struct sl_sched_stats st;
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.n_tiers, 2);
    cr_assert_str_eq(st.tiers[0].name, "batch");
    cr_assert_str_eq(st.tiers[1].name, "gold");
    cr_assert_eq(st.tiers[0].queued_requests, 2);
    cr_assert_eq(st.tiers[0].queued_prompt_tokens, 12);
    cr_assert_eq(st.tiers[0].weight, 2);
    cr_assert_eq(st.tiers[1].running, 1,
                 "the interactive request went to the tier of its priority");
    cr_assert_eq(st.tiers[1].queued_requests, 0);
    cr_assert_eq(sl_sched_core_set_tiers(e.core, next, SL_SCHED_MAX_TIERS + 1), SL_EINVAL);
    run_until_idle(&e, 200);
    assert_matches_reference(&e, 0, 5, 6);
    assert_matches_reference(&e, 1, 7, 6);
    assert_matches_reference(&e, 2, 9, 6);
    env_dispose(&e);
}

Test(sched, request_without_a_known_tier_queues_by_priority_when_named_tier_is_missing)
{
    struct env e;
    env_init_tiers(&e, 4, 64, 64, 4, two_tiers, 2);
    int32_t prompt[3] = {1, 5, 6};
    struct sl_req_params p = {
        .max_tokens = 2, .top_p = 1.f, .sched_tier = {.name = "gone", .priority = 7}, .tier = 0};
    struct sl_req *r = sl_req_new(sl_req_prompt_copy(prompt, 3), &p);
    e.rec.reqs[0] = r;
    sl_sched_core_submit(e.core, r, 0);
    struct sl_sched_stats st;
    sl_sched_core_stats(e.core, &st);
    cr_assert_eq(st.tiers[1].queued_requests, 1, "priority 7 is below every tier: the lowest");
    cr_assert_eq(st.tiers[0].queued_requests, 0);
    run_until_idle(&e, 100);
    env_dispose(&e);
}

Test(sched, cost_fit_recovers_a_linear_step_time_when_features_vary)
{
    struct sl_sched_fit f;
    memset(&f, 0, sizeof f);
    const double truth[SL_SCHED_FIT_K] = {2000, 95, 330, 935, 106};
    double x[SL_SCHED_FIT_K] = {1, 0, 0, 0, 0};
    cr_assert_eq(sl_sched_fit_predict(&f, x), 0, "no prediction before any step");
    uint32_t rng = 7;
    for (int i = 0; i < 200; i++) {
        double u[4];
        for (int k = 0; k < 4; k++) {
            rng = rng * 1103515245u + 12345u;
            u[k] = (double)(rng >> 16 & 0x7fff) / 32768.0;
        }
        double d = floor(64 * u[0]), p = floor(512 * u[1]);
        x[1] = d + p;
        x[2] = d + (p > 0);
        x[3] = d * (100 + 1000 * u[2]) / 1000;
        x[4] = p * (p / 2 + 2000 * u[3]) / 1000;
        double y = 0;
        for (int k = 0; k < SL_SCHED_FIT_K; k++)
            y += truth[k] * x[k];
        sl_sched_fit_add(&f, x, y);
    }
    for (int k = 0; k < SL_SCHED_FIT_K; k++)
        cr_assert_float_eq(f.theta[k], truth[k], 0.02 * truth[k], "coefficient %d: %g", k,
                           f.theta[k]);
    double q[SL_SCHED_FIT_K] = {1, 300, 20, 10, 400};
    double want = 2000 + 95 * 300 + 330 * 20 + 935 * 10 + 106 * 400;
    cr_assert_float_eq(sl_sched_fit_predict(&f, q), want, 0.01 * want);
}

Test(sched, one_stalled_step_barely_moves_the_step_time_fit_when_steps_are_steady)
{
    struct env e;
    env_init(&e, 4, 64, 64, 4);
    sl_sched_core_submit(e.core, add_req(&e, 0, 5, 60), 0);
    uint64_t now = 0;
    for (int k = 0; k < 30; k++, now += 10 * MS)
        sl_sched_core_step(e.core, now);
    double before = sl_sched_fit_predict(&e.core->fit, e.core->prev.x);
    cr_assert_float_eq(before, 10000, 100, "learned 10 ms steps: %g us", before);
    /* The thread loses its core for two seconds in the middle of a step. */
    now += 2000 * MS;
    sl_sched_core_step(e.core, now);
    now += 10 * MS;
    sl_sched_core_step(e.core, now);
    double after = sl_sched_fit_predict(&e.core->fit, e.core->prev.x);
    cr_assert_lt(after, 15000, "one stall moved the prediction to %g us", after);
    struct sl_sched_stats st;
    sl_sched_core_stats(e.core, &st);
    cr_assert_gt(st.decode_step_seconds, 0.1, "the average sees the real time");
    run_until_idle(&e, 100);
    env_dispose(&e);
}

Test(sched, one_stalled_step_barely_moves_the_prefill_rate_the_guard_predicts_with)
{
    struct env e;
    env_init(&e, 4, 8, 64, 4);
    /* A 200-token prompt: chunks of 8 rows, every step a prefill step. */
    sl_sched_core_submit(e.core, add_req(&e, 0, 200, 1), 0);
    uint64_t now = 0;
    for (int k = 0; k < 15; k++, now += 10 * MS)
        sl_sched_core_step(e.core, now);
    struct sl_sched_stats st;
    sl_sched_core_stats(e.core, &st);
    double before = st.prefill_tokens_per_s;
    cr_assert_float_eq(before, 800, 8, "8 rows in 10 ms: %g tokens/s", before);
    /* The host takes the core away for two seconds in the middle of a step. */
    now += 2000 * MS;
    sl_sched_core_step(e.core, now);
    now += 10 * MS;
    sl_sched_core_step(e.core, now);
    sl_sched_core_stats(e.core, &st);
    cr_assert_gt(st.prefill_tokens_per_s, before / 2,
                 "one stall took the rate from %g to %g tokens/s", before, st.prefill_tokens_per_s);
    run_until_idle(&e, 100);
    env_dispose(&e);
}

/* ---------------------------------------------------------------------------------------------
 * A worker that samples where its logits are (the CUDA backend's forward_sample) gets each
 * sequence's parameters and the coin its rng would give sl_sample, so seeded output is the same
 * as when the core samples the logits itself.
 */

static struct sl_sampling seen_params;
static int sampled_rows;

static int fake_forward_sample(void *ctx, const struct sl_batch *b,
                               const struct sl_sample_row *rows, int32_t *ids)
{
    float *logits = malloc(sizeof(float) * VOCAB * (size_t)(b->n_logits ? b->n_logits : 1));
    int st = fake_forward(ctx, b, logits);
    void *scratch = malloc(sl_sample_scratch_size(VOCAB));
    for (int i = 0; st == SL_OK && i < b->n_logits; i++) {
        ids[i] = sl_sample_with_coin(logits + (size_t)i * VOCAB, VOCAB, &rows[i].p, rows[i].coin,
                                     scratch);
        seen_params = rows[i].p;
        sampled_rows++;
    }
    free(scratch);
    free(logits);
    return st;
}

/* Runs requests 0..n-1 (temperature sampling, seeds 100+i) to the end; on the sampling worker
 * when `sampling`. */
static void run_sampled(struct env *e, int n, bool sampling)
{
    memset(e, 0, sizeof *e);
    e->fake.n_blocks = 64;
    e->fake.block_size = 4;
    e->fake.soft = true;
    e->fake.kv = malloc(sizeof(int32_t) * 64 * 4);
    e->fake.stop_token = STOP_NONE;
    e->lim = (struct sl_sched_limits){.vocab = VOCAB,
                                      .max_ctx = 256,
                                      .max_seqs = 3,
                                      .max_batch_tokens = 16,
                                      .n_blocks = 64,
                                      .block_size = 4};
    env_core(e, sampling ? fake_forward_sample : NULL);
    for (int i = 0; i < n; i++) {
        int32_t prompt[8] = {1, 5 + i, 6, 7, 8, 9, 10, 11};
        struct sl_req_params p = {.max_tokens = 12,
                                  .temperature = 0.8f,
                                  .top_p = i % 2 ? 0.9f : 1.f,
                                  .top_k = i % 3 == 2 ? 7 : 0,
                                  .seed = 100 + (uint64_t)i};
        e->rec.reqs[i] = sl_req_new(sl_req_prompt_copy(prompt, 3 + i), &p);
        cr_assert_eq(sl_sched_core_submit(e->core, e->rec.reqs[i], 0), SL_OK);
    }
    run_until_idle(e, 200);
}

Test(sched, sampling_worker_gives_the_seeded_tokens_when_it_samples_on_its_device)
{
    enum { N = 5 };
    struct env a, b;
    sampled_rows = 0;
    run_sampled(&a, N, false);
    cr_assert_eq(sampled_rows, 0, "forward_sample is not called when the worker has none");
    run_sampled(&b, N, true);
    cr_assert_eq(sampled_rows, N * 12, "every token was sampled by the worker");
    cr_assert_float_eq(seen_params.temperature, 0.8f, 1e-6);
    bool varied = false;
    for (int i = 0; i < N; i++) {
        cr_assert_eq(b.rec.n_out[i], 12);
        cr_assert_eq(memcmp(a.rec.out[i], b.rec.out[i], 12 * sizeof(int32_t)), 0,
                     "request %d: the worker's samples differ from the core's", i);
        for (int g = 1; g < 12; g++)
            varied |= a.rec.out[i][g] != a.rec.out[i][0];
    }
    cr_assert(varied, "temperature sampling produced varied tokens");
    env_dispose(&a);
    env_dispose(&b);
}

/* ---------------------------------------------------------------------------------------------
 * Penalties and logit bias, applied by the core to the logits before it samples. On the one-hot
 * fake each row's logits are 1 for the reference's next token and 0 elsewhere, so a bias and a
 * penalty give outcomes that can be stated token by token.
 */

/* One greedy request (prompt 1, 20, 21, 22) with p's parameters, run to the end on the fake
 * worker, whose model stop token is `stop`; on the sampling one when `sampling`. Returns the
 * worker's forward_sample rows. */
static int run_greedy(struct env *e, struct sl_req_params p, bool sampling, int32_t stop)
{
    env_init(e, 2, 16, 32, 4);
    e->fake.stop_token = stop;
    env_core(e, sampling ? fake_forward_sample : NULL);
    const int32_t prompt[4] = {1, 20, 21, 22};
    p.temperature = 0.f;
    p.top_p = 1.f;
    e->rec.reqs[0] = sl_req_new(sl_req_prompt_copy(prompt, 4), &p);
    cr_assert_eq(sl_sched_core_submit(e->core, e->rec.reqs[0], 0), SL_OK);
    sampled_rows = 0;
    run_until_idle(e, 100);
    cr_assert_eq(e->rec.done_calls[0], 1);
    return sampled_rows;
}

/* The same with no stop token, run to max_tokens. */
static int run_penalized(struct env *e, struct sl_req_params p, bool sampling)
{
    int rows = run_greedy(e, p, sampling, STOP_NONE);
    cr_assert_eq(e->rec.n_out[0], p.max_tokens);
    return rows;
}

/* The token the one-hot fake makes most likely after the prompt and out[0..n). */
static int32_t fake_next_after(const int32_t *out, int n)
{
    int32_t toks[64] = {1, 20, 21, 22};
    if (n > 0)
        memcpy(toks + 4, out, sizeof(int32_t) * (size_t)n);
    return next_of(toks, 4 + n);
}

Test(sched, logit_bias_and_penalties_change_what_the_core_samples)
{
    struct env e;
    /* A bias above the fake's one-hot 1 wins every step. */
    const int32_t seven[1] = {7};
    const float plus3[1] = {3.0f}, minus10[1] = {-10.0f};
    run_penalized(
        &e, (struct sl_req_params){.max_tokens = 6, .n_bias = 1, .bias_ids = seven, .bias = plus3},
        false);
    for (int g = 0; g < 6; g++)
        cr_assert_eq(e.rec.out[0][g], 7, "token %d: %d", g, e.rec.out[0][g]);
    env_dispose(&e);

    /* A negative bias on the token the fake prefers leaves all others at 0: the lowest id wins. */
    int32_t first = fake_next_after(NULL, 0);
    run_penalized(
        &e,
        (struct sl_req_params){.max_tokens = 1, .n_bias = 1, .bias_ids = &first, .bias = minus10},
        false);
    cr_assert_eq(e.rec.out[0][0], 0);
    env_dispose(&e);

    /* Frequency 0.75 against a +3 bias: 7 scores 3, 2.25, 1.5, then 0.75 (+1 only where the fake
     * prefers it), so after three 7s the fake's token takes over. */
    run_penalized(&e,
                  (struct sl_req_params){.max_tokens = 4,
                                         .frequency_penalty = 0.75f,
                                         .n_bias = 1,
                                         .bias_ids = seven,
                                         .bias = plus3},
                  false);
    for (int g = 0; g < 3; g++)
        cr_assert_eq(e.rec.out[0][g], 7);
    int32_t fourth = fake_next_after(e.rec.out[0], 3);
    cr_assert_eq(e.rec.out[0][3], fourth == 7 ? 7 : fourth);
    env_dispose(&e);

    /* Presence 1 against a +1.5 bias: 7 once (1.5 > 1), then 0.5. */
    const float plus15[1] = {1.5f};
    run_penalized(&e,
                  (struct sl_req_params){.max_tokens = 2,
                                         .presence_penalty = 1.0f,
                                         .n_bias = 1,
                                         .bias_ids = seven,
                                         .bias = plus15},
                  false);
    cr_assert_eq(e.rec.out[0][0], 7);
    int32_t second = fake_next_after(e.rec.out[0], 1);
    cr_assert_eq(e.rec.out[0][1], second == 7 ? 7 : second);
    env_dispose(&e);

    /* Repetition 4 on the prompt's tokens: none of the prompt's ids is ever the fake's choice
     * with a positive logit left (1 / 4 < the bias of 0.5 on token 7). */
    const float half[1] = {0.5f};
    run_penalized(&e,
                  (struct sl_req_params){.max_tokens = 3,
                                         .repetition_penalty = 4.0f,
                                         .n_bias = 1,
                                         .bias_ids = seven,
                                         .bias = half},
                  false);
    for (int g = 0; g < 3; g++) {
        int32_t want = fake_next_after(e.rec.out[0], g);
        bool seen = want == 1 || want == 20 || want == 21 || want == 22 || want == 7;
        for (int h = 0; h < g; h++)
            seen |= e.rec.out[0][h] == want;
        cr_assert_eq(e.rec.out[0][g], seen ? 7 : want, "token %d", g);
    }
    env_dispose(&e);
}

Test(sched, a_sampling_worker_returns_logits_for_rows_with_penalties)
{
    const int32_t seven[1] = {7};
    const float plus3[1] = {3.0f};
    struct sl_req_params p = {
        .max_tokens = 5, .frequency_penalty = 0.75f, .n_bias = 1, .bias_ids = seven, .bias = plus3};
    struct env a, b;
    run_penalized(&a, p, false);
    int rows = run_penalized(&b, p, true);
    cr_assert_eq(rows, 0, "the worker sampled %d rows the core had to change first", rows);
    cr_assert_eq(memcmp(a.rec.out[0], b.rec.out[0], 5 * sizeof(int32_t)), 0);
    env_dispose(&a);
    env_dispose(&b);

    /* Without penalties the sampling worker samples as before. */
    rows = run_penalized(&b, (struct sl_req_params){.max_tokens = 5}, true);
    cr_assert_eq(rows, 5);
    env_dispose(&b);
}

/* Log probabilities: the core reports each token's, from the raw logits, right before the token;
 * a sampling worker gives back the logits of steps with such rows. */
Test(sched, logprobs_of_each_token_come_from_the_raw_logits_when_asked)
{
    struct sl_req_params p = {.max_tokens = 6, .logprobs = true, .top_logprobs = 2};
    /* The one-hot fake: 1 for the preferred token, 0 for the other 63. */
    float lse = logf(expf(1.0f) + (float)(VOCAB - 1));
    for (int sampling = 0; sampling < 2; sampling++) {
        struct env e;
        int rows = run_penalized(&e, p, sampling);
        cr_assert_eq(rows, 0, "a sampling worker sampled rows that asked for log probabilities");
        cr_assert_eq(e.rec.n_lp[0], 6);
        cr_assert_eq(e.rec.lp_before_token, 6);
        for (int g = 0; g < 6; g++) {
            const struct sl_token_logprobs *lp = &e.rec.lp[0][g];
            cr_assert_eq(lp->token, e.rec.out[0][g]);
            cr_assert_eq(lp->prev, g ? e.rec.out[0][g - 1] : 22, "token %d's prev", g);
            cr_assert_float_eq(lp->logprob, 1.0f - lse, 1e-5f);
            cr_assert_eq(lp->n_top, 2);
            cr_assert_eq(lp->top_ids[0], lp->token);
            cr_assert_eq(lp->top_ids[1], lp->token == 0 ? 1 : 0, "the lowest id among the rest");
            cr_assert_float_eq(lp->top_logprobs[1], -lse, 1e-5f);
        }
        env_dispose(&e);
    }

    /* Before a bias changes them: the reported probability is the model's. */
    const int32_t seven[1] = {7};
    const float plus3[1] = {3.0f};
    p.n_bias = 1;
    p.bias_ids = seven;
    p.bias = plus3;
    p.max_tokens = 1;
    struct env e;
    run_penalized(&e, p, false);
    cr_assert_eq(e.rec.out[0][0], 7);
    cr_assert_float_eq(e.rec.lp[0][0].logprob, fake_next_after(NULL, 0) == 7 ? 1.0f - lse : -lse,
                       1e-5f);
    env_dispose(&e);
}

/* ---------------------------------------------------------------------------------------------
 * vLLM's stop controls: ignore_eos, min_tokens, stop_token_ids. On the one-hot fake a +3 bias
 * makes a token the greedy choice every step, so "the model wants to stop now" can be set up.
 */

Test(sched, ignore_eos_and_min_tokens_hold_off_the_models_stop_token)
{
    const int32_t stop[1] = {9};
    const float plus3[1] = {3.0f};
    struct sl_req_params p = {.max_tokens = 8, .n_bias = 1, .bias_ids = stop, .bias = plus3};
    for (int sampling = 0; sampling < 2; sampling++) {
        /* Plain: the stop token ends the sequence at once, unseen by the sink. */
        struct env e;
        run_greedy(&e, p, sampling, 9);
        cr_assert_eq(e.rec.finish[0], SL_FINISH_STOP);
        cr_assert_eq(e.rec.n_generated[0], 1);
        cr_assert_eq(e.rec.n_out[0], 0);
        env_dispose(&e);

        /* ignore_eos: it is sampled every step and generation runs to max_tokens. */
        struct sl_req_params q = p;
        q.ignore_eos = true;
        run_greedy(&e, q, sampling, 9);
        cr_assert_eq(e.rec.finish[0], SL_FINISH_LENGTH);
        cr_assert_eq(e.rec.n_out[0], 8);
        for (int g = 0; g < 8; g++)
            cr_assert_eq(e.rec.out[0][g], 9);
        env_dispose(&e);

        /* min_tokens 3: masked for three tokens (the fake's own choices, as without the bias),
         * then the fourth ends it. */
        q = p;
        q.min_tokens = 3;
        int rows = run_greedy(&e, q, sampling, 9);
        cr_assert_eq(e.rec.finish[0], SL_FINISH_STOP);
        cr_assert_eq(e.rec.n_generated[0], 4);
        cr_assert_eq(e.rec.n_out[0], 3);
        for (int g = 0; g < 3; g++) {
            int32_t want = fake_next_after(e.rec.out[0], g);
            cr_assert_eq(e.rec.out[0][g], want == 9 ? 0 : want, "token %d", g);
        }
        if (sampling)
            cr_assert_eq(rows, 0, "the worker sampled rows whose stop tokens needed masking");
        env_dispose(&e);
    }

    /* A sampling worker samples rows with nothing to mask: min_tokens without a stop token. */
    struct env e;
    int rows =
        run_greedy(&e, (struct sl_req_params){.max_tokens = 4, .min_tokens = 2}, true, STOP_NONE);
    cr_assert_eq(rows, 4);
    env_dispose(&e);
}

Test(sched, stop_token_ids_end_the_sequence_with_their_token_once_min_tokens_is_reached)
{
    const int32_t seven[1] = {7};
    const float plus3[1] = {3.0f};
    struct sl_req_params p = {.max_tokens = 8,
                              .n_bias = 1,
                              .bias_ids = seven,
                              .bias = plus3,
                              .n_stop_ids = 1,
                              .stop_ids = seven};
    for (int sampling = 0; sampling < 2; sampling++) {
        /* The stop id is sampled, handed to the sink (its text is part of the output), and ends
         * the sequence. */
        struct env e;
        run_greedy(&e, p, sampling, STOP_NONE);
        cr_assert_eq(e.rec.finish[0], SL_FINISH_STOP);
        cr_assert_eq(e.rec.n_out[0], 1);
        cr_assert_eq(e.rec.out[0][0], 7);
        env_dispose(&e);

        /* min_tokens 2: masked twice, then sampled and stopping. */
        struct sl_req_params q = p;
        q.min_tokens = 2;
        int rows = run_greedy(&e, q, sampling, STOP_NONE);
        cr_assert_eq(e.rec.finish[0], SL_FINISH_STOP);
        cr_assert_eq(e.rec.n_out[0], 3);
        for (int g = 0; g < 2; g++) {
            int32_t want = fake_next_after(e.rec.out[0], g);
            cr_assert_eq(e.rec.out[0][g], want == 7 ? 0 : want, "token %d", g);
        }
        cr_assert_eq(e.rec.out[0][2], 7);
        if (sampling)
            cr_assert_eq(rows, 0);
        env_dispose(&e);
    }

    /* ignore_eos leaves stop_token_ids in force (vLLM's rule). */
    struct env e;
    struct sl_req_params q = p;
    q.ignore_eos = true;
    run_greedy(&e, q, false, 7);
    cr_assert_eq(e.rec.finish[0], SL_FINISH_STOP);
    cr_assert_eq(e.rec.n_out[0], 1);
    env_dispose(&e);
}

/* (Stop strings before min_tokens are the detokenizer's to hold off: tests/worker/test_detok.c.) */
Test(sched, request_copies_its_stop_ids)
{
    int32_t ids[2] = {5, 6};
    struct sl_req_params p = {.max_tokens = 4, .n_stop_ids = 2, .stop_ids = ids, .min_tokens = -3};
    struct sl_req *r = sl_req_new(sl_req_prompt_copy(ids, 2), &p);
    ids[0] = 40;
    const struct sl_req_params *rp = sl_req_params(r);
    cr_assert_eq(rp->n_stop_ids, 2);
    cr_assert_neq(rp->stop_ids, ids);
    cr_assert_eq(rp->stop_ids[0], 5);
    cr_assert_eq(rp->stop_ids[1], 6);
    cr_assert_eq(rp->min_tokens, 0, "a negative min_tokens reads as none");
    sl_req_unref(r);
}

/* Device time: each forward's time divided over its batch by rows, adding up exactly. */
Test(sched, device_time_is_divided_by_rows_and_adds_up_to_the_forwards_when_batched)
{
    struct env e;
    env_init(&e, 4, 64, 32, 4);
    e.fake.ns_each = 1001; /* odd: the rounding has something to give */
    struct sl_req *a = add_req(&e, 0, 7, 4), *b = add_req(&e, 1, 3, 4);
    cr_assert_eq(sl_sched_core_submit(e.core, a, 0), SL_OK);
    cr_assert_eq(sl_sched_core_submit(e.core, b, 0), SL_OK);
    cr_assert_eq(sl_sched_core_step(e.core, 0), 10, "both prompts in one forward");
    cr_assert_eq(sl_req_device_ns(a), 701, "7 of 10 rows: 700.7, and the rounding's 1");
    cr_assert_eq(sl_req_device_ns(b), 300, "3 of 10 rows: 300.3");
    cr_assert_eq(sl_sched_core_step(e.core, 1), 2, "two decodes");
    cr_assert_eq(sl_req_device_ns(a), 701 + 501);
    cr_assert_eq(sl_req_device_ns(b), 300 + 500);
    /* A third joins, one is cancelled: whatever each got, the forwards are charged in full. */
    struct sl_req *c = add_req(&e, 2, 13, 3);
    cr_assert_eq(sl_sched_core_submit(e.core, c, 2), SL_OK);
    sl_sched_core_cancel(e.core, b);
    run_until_idle(&e, 100);
    cr_assert_gt(sl_req_device_ns(c), sl_req_device_ns(b));
    cr_assert_eq(sl_req_device_ns(a) + sl_req_device_ns(b) + sl_req_device_ns(c), e.fake.ns_total);
    cr_assert_eq(e.fake.ns_total, 1001ull * (uint64_t)e.fake.calls);
    env_dispose(&e);
}

/* Tier isolation: while interactive has a request (and for SL_SCHED_ISOLATION_HOLD_S after),
 * batch's prompt chunks add at most interactive's isolation_ms to a step as the fit predicts (at
 * least SL_SCHED_ISOLATION_MIN_ROWS rows), and batch leaves SL_SCHED_ISOLATION_SLOTS slots free.
 * Steps take 1 ms + 0.1 ms a row on the test's clock, which the fit learns. */
static const struct sl_sched_tier iso_tiers[2] = {
    {.name = "interactive", .priority = 0, .weight = 4, .ttft_slo_ms = 1000, .isolation_ms = 3},
    {.name = "batch", .priority = 1, .weight = 1, .ttft_slo_ms = 60000},
};

/* One step at *now, then the clock moves by the step's cost; returns batch's prompt rows. */
static long iso_step(struct env *e, uint64_t *now)
{
    long before = tier_queued_tokens(e, 1);
    cr_assert_geq(sl_sched_core_step(e->core, *now), 0);
    *now += (uint64_t)(1000 + 100 * e->fake.last_rows) * 1000;
    return before - tier_queued_tokens(e, 1);
}

Test(sched, a_busy_higher_tier_holds_lower_prompt_chunks_to_its_isolation_budget)
{
    struct env e;
    env_init_tiers(&e, 8, 256, 4096, 16, iso_tiers, 2);
    /* Batch alone, one prompt of a varied length a step: the fit learns the cost of a row. */
    uint64_t now = 1;
    for (int k = 0; k < 24; k++) {
        sl_sched_core_submit(e.core, add_req_tier(&e, k, 20 + 37 * k % 200, 4, 1), now);
        iso_step(&e, &now);
    }
    while (sl_sched_core_pending(e.core) > 0)
        iso_step(&e, &now);
    cr_assert_float_eq(e.core->fit.theta[1], 100, 1, "the fit learnt a row's cost");
    /* A backlog: alone, batch fills its steps. */
    for (int i = 24; i < 40; i++)
        sl_sched_core_submit(e.core, add_req_tier(&e, i, 200, 2, 1), now);
    long most = 0;
    for (int k = 0; k < 3; k++)
        most = fmax(most, iso_step(&e, &now));
    cr_assert_gt(most, 200, "batch alone fills its steps (%ld rows at most)", most);
    struct sl_sched_stats st;
    sl_sched_core_submit(e.core, add_req_tier(&e, 40, 8, 60, 0), now);
    long least = 1000;
    most = 0;
    for (int k = 0; k < 70; k++) {
        long rows = iso_step(&e, &now);
        most = fmax(most, rows);
        if (rows > 0)
            least = fmin(least, rows);
        sl_sched_core_stats(e.core, &st);
        cr_assert_leq(st.tiers[1].running, 8 - SL_SCHED_ISOLATION_SLOTS,
                      "batch leaves slots free (%d running)", st.tiers[1].running);
    }
    /* 3 ms at 0.1 ms a row: 30 rows, give or take the fit's rounding; never below the floor. */
    cr_assert_leq(most, 32, "batch took %ld rows in a step while interactive ran", most);
    cr_assert_geq(least, SL_SCHED_ISOLATION_MIN_ROWS, "batch kept moving (%ld rows)", least);
    cr_assert_eq(e.rec.n_out[40], 60, "interactive finished meanwhile");
    /* A second after interactive's last request, batch has whole steps again. */
    uint64_t quiet_from = now + (uint64_t)(SL_SCHED_ISOLATION_HOLD_S * 1e9);
    while (now <= quiet_from)
        iso_step(&e, &now);
    for (int i = 41; i < 45; i++)
        sl_sched_core_submit(e.core, add_req_tier(&e, i, 200, 2, 1), now);
    most = 0;
    for (int k = 0; k < 3; k++)
        most = fmax(most, iso_step(&e, &now));
    cr_assert_gt(most, 200, "isolation ended (%ld rows)", most);
    run_until_idle(&e, 2000);
    assert_matches_reference(&e, 40, 8, 60);
    env_dispose(&e);
}
