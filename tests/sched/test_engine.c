/* The scheduling core over the real CPU worker and a real model (stories260K, llama2.c golden
 * outputs in ../shared/models): greedy outputs are llama2.c's token for token whether a request
 * runs alone, in a full batch, with its prompt chunked, or preempted and resumed. The CPU kernels
 * give a row the same bits whatever else is in the batch, so recomputing a preempted sequence's
 * prompt and generated tokens in one prefill reproduces its KV exactly; and every real model
 * gives the same tokens with the prefix cache on and off. Skips, saying so, when the models
 * folder is absent. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <sluice/sched.h>

#include "../models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_REQS 16
#define MAX_OUT 512

struct golden {
    int n;
    int32_t prompt[3][64];
    int n_prompt[3];
    int32_t want[3][MAX_OUT];
    int n_want[3];
};

struct engine {
    struct sl_model *model;
    struct sl_worker *worker;
    struct sl_sched_core *core;
    struct sl_req *reqs[MAX_REQS];
    int32_t out[MAX_REQS][MAX_OUT];
    int n_out[MAX_REQS];
    enum sl_finish finish[MAX_REQS];
    int preempted[MAX_REQS];
    int max_rows_seen;
};

static const char *models_dir(void)
{
    const char *d = getenv("SL_MODELS_DIR");
    struct stat st;
    if (!d || stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
        MODELS_MISSING("needs real models: ../shared/models not found (SL_MODELS_DIR=%s)",
                       d ? d : "(unset)");
    return d;
}

static void load_golden(const char *dir, struct golden *g)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/golden/stories260K.json", dir);
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    cr_assert_not_null(root, "%s: %s", path, e.text);
    g->n = (int)json_array_size(root);
    cr_assert(g->n >= 1 && g->n <= 3);
    for (int i = 0; i < g->n; i++) {
        json_t *c = json_array_get(root, (size_t)i);
        json_t *p = json_object_get(c, "prompt_token_ids"), *t = json_object_get(c, "token_ids");
        g->n_prompt[i] = (int)json_array_size(p);
        g->n_want[i] = (int)json_array_size(t);
        cr_assert(g->n_prompt[i] <= 64 && g->n_want[i] <= MAX_OUT);
        for (int k = 0; k < g->n_prompt[i]; k++)
            g->prompt[i][k] = (int32_t)json_integer_value(json_array_get(p, (size_t)k));
        for (int k = 0; k < g->n_want[i]; k++)
            g->want[i][k] = (int32_t)json_integer_value(json_array_get(t, (size_t)k));
    }
    json_decref(root);
}

static int forward(void *ctx, const struct sl_batch *b, float *logits)
{
    struct engine *e = ctx;
    if (b->n_tokens > e->max_rows_seen)
        e->max_rows_seen = b->n_tokens;
    return sl_worker_forward(e->worker, b, logits);
}

static bool is_stop(void *ctx, int32_t token)
{
    struct engine *e = ctx;
    return sl_model_is_stop_token(e->model, token);
}

static int index_of(struct engine *e, struct sl_req *r)
{
    for (int i = 0; i < MAX_REQS; i++)
        if (e->reqs[i] == r)
            return i;
    cr_assert_fail("unknown request");
    return -1;
}

static bool on_token(void *ctx, struct sl_req *r, int32_t token)
{
    struct engine *e = ctx;
    int i = index_of(e, r);
    cr_assert_lt(e->n_out[i], MAX_OUT);
    e->out[i][e->n_out[i]++] = token;
    return false;
}

static void on_done(void *ctx, struct sl_req *r, enum sl_finish why, int status, int n)
{
    struct engine *e = ctx;
    (void)status;
    (void)n;
    e->finish[index_of(e, r)] = why;
}

static void on_preempted(void *ctx, struct sl_req *r)
{
    struct engine *e = ctx;
    e->preempted[index_of(e, r)]++;
}

static const struct sl_sched_tier tiers[2] = {
    {.name = "interactive", .priority = 0, .weight = 4, .ttft_slo_ms = 1000, .tpot_slo_ms = 100},
    {.name = "batch", .priority = 1, .weight = 1, .ttft_slo_ms = 60000, .tpot_slo_ms = 1000},
};

/* An engine over the model spec (with tokenizer tok, NULL: in the file or folder). */
static void engine_init_model(struct engine *e, const char *spec, const char *tok, int max_seqs,
                              int max_batch_tokens, int n_blocks, int block_size)
{
    memset(e, 0, sizeof *e);
    char err[256];
    cr_assert_eq(sl_model_load(spec, tok, &e->model, err, sizeof err), SL_OK, "%s: %s", spec, err);
    const struct sl_model_config *mc = sl_model_config(e->model);
    struct sl_backend_opts bo = {.n_kv_blocks = n_blocks,
                                 .block_size = block_size,
                                 .max_batch_tokens = max_batch_tokens,
                                 .max_seqs = max_seqs,
                                 .threads = 1};
    cr_assert_eq(sl_worker_new(e->model, &sl_cpu_backend_ops, &bo, &e->worker), SL_OK);
    struct sl_sched_limits lim = {.vocab = mc->vocab_size,
                                  .max_ctx = mc->seq_len,
                                  .max_seqs = max_seqs,
                                  .max_batch_tokens = max_batch_tokens,
                                  .n_blocks = n_blocks,
                                  .block_size = block_size,
                                  .tiers = tiers,
                                  .n_tiers = 2,
                                  .cache_seed = {1, 2, 3, 4}};
    struct sl_sched_worker w = {.ctx = e, .forward = forward, .is_stop_token = is_stop};
    struct sl_sched_sink s = {
        .ctx = e, .token = on_token, .done = on_done, .preempted = on_preempted};
    e->core = sl_sched_core_new(&lim, &w, &s);
    cr_assert_not_null(e->core);
}

/* An engine over stories260K, the model of the llama2.c goldens. */
static void engine_init(struct engine *e, const char *dir, int max_seqs, int max_batch_tokens,
                        int n_blocks, int block_size)
{
    char model[1024], tok[1024];
    snprintf(model, sizeof model, "%s/stories260K.bin", dir);
    snprintf(tok, sizeof tok, "%s/tok512.bin", dir);
    engine_init_model(e, model, tok, max_seqs, max_batch_tokens, n_blocks, block_size);
}

static void engine_dispose(struct engine *e)
{
    sl_sched_core_free(e->core);
    for (int i = 0; i < MAX_REQS; i++)
        sl_req_unref(e->reqs[i]);
    sl_worker_free(e->worker);
    sl_model_free(e->model);
}

/* Request i: golden case c, greedy, as long as the golden, in tier t. */
static void submit(struct engine *e, const struct golden *g, int i, int c, int t, uint64_t now)
{
    struct sl_req_params p = {.max_tokens = g->n_want[c],
                              .temperature = 0.f,
                              .top_p = 1.f,
                              .tier = t,
                              .sched_tier = {.priority = tiers[t].priority,
                                             .tpot_slo_ms = tiers[t].tpot_slo_ms,
                                             .ttft_slo_ms = tiers[t].ttft_slo_ms}};
    e->reqs[i] = sl_req_new(sl_req_prompt_copy(g->prompt[c], g->n_prompt[c]), &p);
    cr_assert_eq(sl_sched_core_submit(e->core, e->reqs[i], now), SL_OK);
}

/* Steps with 20 ms between `now`s until idle. */
static void run(struct engine *e, uint64_t *now)
{
    for (int k = 0; sl_sched_core_pending(e->core) > 0; k++, *now += 20000000) {
        cr_assert_lt(k, 20000, "the core drained");
        cr_assert_geq(sl_sched_core_step(e->core, *now), 0);
    }
}

static void assert_golden(const struct engine *e, const struct golden *g, int i, int c,
                          const char *how)
{
    cr_assert_eq(e->finish[i], SL_FINISH_LENGTH, "%s: request %d", how, i);
    cr_assert_eq(e->n_out[i], g->n_want[c], "%s: request %d made %d tokens, llama2.c %d", how, i,
                 e->n_out[i], g->n_want[c]);
    for (int k = 0; k < g->n_want[c]; k++)
        cr_assert_eq(e->out[i][k], g->want[c][k], "%s: request %d token %d is %d, llama2.c %d", how,
                     i, k, e->out[i][k], g->want[c][k]);
}

Test(sched, real_model_greedy_output_is_llama2c_when_a_request_runs_alone)
{
    const char *dir = models_dir();
    struct golden g;
    load_golden(dir, &g);
    for (int c = 0; c < g.n; c++) {
        struct engine e;
        engine_init(&e, dir, 4, 64, 64, 16);
        uint64_t now = 0;
        submit(&e, &g, 0, c, 0, now);
        run(&e, &now);
        assert_golden(&e, &g, 0, c, "alone");
        engine_dispose(&e);
    }
}

Test(sched, real_model_greedy_output_is_llama2c_when_requests_fill_the_batch)
{
    const char *dir = models_dir();
    struct golden g;
    load_golden(dir, &g);
    struct engine e;
    engine_init(&e, dir, 8, 256, 256, 16);
    uint64_t now = 0;
    for (int i = 0; i < 8; i++)
        submit(&e, &g, i, i % g.n, i % 2, now);
    run(&e, &now);
    for (int i = 0; i < 8; i++)
        assert_golden(&e, &g, i, i % g.n, "full batch");
    engine_dispose(&e);
}

Test(sched, real_model_greedy_output_is_llama2c_when_prompts_are_chunked)
{
    const char *dir = models_dir();
    struct golden g;
    load_golden(dir, &g);
    struct engine e;
    /* Three rows a step: every prompt is cut into chunks that share steps with decodes. */
    engine_init(&e, dir, 4, 3, 128, 16);
    uint64_t now = 0;
    submit(&e, &g, 0, 0, 1, now);
    for (int k = 0; k < 5; k++, now += 20000000)
        sl_sched_core_step(e.core, now);
    for (int i = 1; i < 4; i++)
        submit(&e, &g, i, i % g.n, i % 2, now);
    run(&e, &now);
    cr_assert_eq(e.max_rows_seen, 3);
    for (int i = 0; i < 4; i++)
        assert_golden(&e, &g, i, i % g.n, "chunked");
    engine_dispose(&e);
}

Test(sched, real_model_greedy_output_is_llama2c_when_preempted_and_resumed)
{
    const char *dir = models_dir();
    struct golden g;
    load_golden(dir, &g);
    struct engine e;
    /* 20 blocks of 4 positions: each sequence grows to 64 (16 blocks), so of the six requests
     * at most one runs to its end without others giving way, again and again. */
    engine_init(&e, dir, 6, 64, 20, 4);
    uint64_t now = 0;
    for (int i = 0; i < 6; i++)
        submit(&e, &g, i, i % g.n, i < 3 ? 1 : 0, now + (uint64_t)i);
    run(&e, &now);
    int preempted = 0;
    for (int i = 0; i < 6; i++) {
        assert_golden(&e, &g, i, i % g.n, "preempted");
        preempted += e.preempted[i];
    }
    cr_assert_geq(preempted, 3, "the pool forced preemptions (%d)", preempted);
    cr_assert_eq(sl_sched_core_free_blocks(e.core), 20);
    cr_log_info("real model, 20-block pool: 6 requests, %d preemptions, all equal to llama2.c",
                preempted);
    engine_dispose(&e);
}

/* A sampled request keeps its random state across preemption: the same seed gives the same text
 * alone and when preempted again and again. */
Test(sched, real_model_sampled_output_is_unchanged_when_preempted_and_resumed)
{
    const char *dir = models_dir();
    struct golden g;
    load_golden(dir, &g);
    int32_t alone[MAX_OUT];
    int n_alone = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct engine e;
        engine_init(&e, dir, 6, 64, pass ? 20 : 64, 4);
        uint64_t now = 0;
        struct sl_req_params p = {.max_tokens = 50,
                                  .temperature = 0.9f,
                                  .top_p = 0.95f,
                                  .seed = 42,
                                  .tier = 1,
                                  .sched_tier = {.priority = 1}};
        e.reqs[0] = sl_req_new(sl_req_prompt_copy(g.prompt[0], g.n_prompt[0]), &p);
        cr_assert_eq(sl_sched_core_submit(e.core, e.reqs[0], now), SL_OK);
        if (pass)
            for (int i = 1; i < 6; i++)
                submit(&e, &g, i, i % g.n, 0, now + (uint64_t)i);
        run(&e, &now);
        if (pass == 0) {
            n_alone = e.n_out[0];
            memcpy(alone, e.out[0], sizeof(int32_t) * (size_t)n_alone);
        } else {
            cr_assert_geq(e.preempted[0], 1, "the sampled request was preempted");
            cr_assert_eq(e.n_out[0], n_alone);
            cr_assert(memcmp(e.out[0], alone, sizeof(int32_t) * (size_t)n_alone) == 0,
                      "same seed, same tokens, preempted or not");
        }
        engine_dispose(&e);
    }
    cr_assert_gt(n_alone, 0);
}

/* ---- the prefix cache ----
 *
 * Every real model of ../shared/models gives the same greedy and seeded tokens with the cache on
 * and off, for requests that share none, some and all of their full blocks, one after another,
 * all at once (a prefix still being prefilled by another request), and in a pool so small that
 * cached blocks are evicted and sequences preempted: a block computed for one request is the
 * block another would compute, the CPU kernels giving a row the same bits whatever the batch. */

/* The model files: spec and tokenizer (NULL: in the file or folder). */
struct model_files {
    const char *spec, *tok;
};
static const struct model_files models[] = {
    {"stories260K.bin", "tok512.bin"},
    {"stories260K.gguf", NULL},
    {"tinystories-656K/hf", NULL},
    {"tinystories-656K/llama2c/model.bin", "tinystories-656K/llama2c/tokenizer.bin"},
};
#define N_MODELS (int)(sizeof models / sizeof models[0])
#define N_REQS 8 /* of the prefix cache test */
#define PREFIX_OUT 24
#define PREFIX_BS 8

/* An engine over model m of `models`, for the prefix cache test. */
static void prefix_engine(struct engine *e, const char *dir, int m, int max_seqs, int n_blocks)
{
    char spec[1024], tok[1024];
    snprintf(spec, sizeof spec, "%s/%s", dir, models[m].spec);
    if (models[m].tok)
        snprintf(tok, sizeof tok, "%s/%s", dir, models[m].tok);
    engine_init_model(e, spec, models[m].tok ? tok : NULL, max_seqs, 64, n_blocks, PREFIX_BS);
}

static int preempted_total(const struct engine *e)
{
    int n = 0;
    for (int i = 0; i < MAX_REQS; i++)
        n += e->preempted[i];
    return n;
}

/* The prompts: a shared 70-token head (8 full blocks and 6 tokens) that requests 0-2 and 4-5
 * continue differently or not at all, and 3 and 6-7 that share nothing. Ids from a fixed
 * sequence over the vocabulary, BOS first. */
struct prompts {
    int32_t ids[N_REQS][128];
    int n[N_REQS];
};

static void make_prompts(struct prompts *p, int vocab)
{
    uint64_t x = 12345;
    int32_t head[70], own[N_REQS][40];
    for (int k = 0; k < 70; k++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        head[k] = k == 0 ? 1 : 3 + (int32_t)((x >> 33) % (uint64_t)(vocab - 3));
    }
    for (int i = 0; i < N_REQS; i++)
        for (int k = 0; k < 40; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            own[i][k] =
                k == 0 && (i == 3 || i >= 6) ? 1 : 3 + (int32_t)((x >> 33) % (uint64_t)(vocab - 3));
        }
    /* 0, 1: the head and a question of their own; 2: 0's prompt again (all its full blocks);
     * 4: the head's first 64 tokens (all full blocks, all cached: the last is computed again);
     * 5: 0's prompt and more (a conversation that grows); 3, 6, 7: nothing shared. */
    static const int own_n[N_REQS] = {10, 17, 10, 30, 0, 25, 40, 21};
    for (int i = 0; i < N_REQS; i++) {
        int n = 0;
        if (i == 3 || i >= 6) {
            memcpy(p->ids[i], own[i], sizeof(int32_t) * (size_t)own_n[i]);
            n = own_n[i];
        } else if (i == 4) {
            memcpy(p->ids[i], head, sizeof(int32_t) * 64);
            n = 64;
        } else {
            memcpy(p->ids[i], head, sizeof head);
            n = 70;
            const int32_t *tail = own[i == 2 || i == 5 ? 0 : i];
            int m = i == 2 ? own_n[0] : own_n[i == 5 ? 0 : i];
            memcpy(p->ids[i] + n, tail, sizeof(int32_t) * (size_t)m);
            n += m;
            if (i == 5) {
                memcpy(p->ids[i] + n, own[5], sizeof(int32_t) * (size_t)own_n[5]);
                n += own_n[5];
            }
        }
        p->n[i] = n;
    }
}

/* Request i: greedy when even, sampled with a seed of its own when odd. */
static void prefix_submit(struct engine *r, const struct prompts *p, int i, bool cache,
                          uint64_t now)
{
    struct sl_req_params q = {.max_tokens = PREFIX_OUT,
                              .temperature = i % 2 ? 0.9f : 0.f,
                              .top_p = 0.95f,
                              .seed = 1000 + (uint64_t)i,
                              .ignore_eos = true,
                              .cache_prefix = cache,
                              .cache_key = 77};
    r->reqs[i] = sl_req_new(sl_req_prompt_copy(p->ids[i], p->n[i]), &q);
    cr_assert_eq(sl_sched_core_submit(r->core, r->reqs[i], now), SL_OK);
}

static void assert_same(const struct engine *r, int32_t want[N_REQS][PREFIX_OUT], const char *model,
                        const char *how)
{
    for (int i = 0; i < N_REQS; i++) {
        cr_assert_eq(r->finish[i], SL_FINISH_LENGTH, "%s, %s: request %d", model, how, i);
        cr_assert_eq(r->n_out[i], PREFIX_OUT, "%s, %s: request %d", model, how, i);
        for (int k = 0; k < PREFIX_OUT; k++)
            cr_assert_eq(r->out[i][k], want[i][k],
                         "%s, %s: request %d token %d is %d, uncached alone %d", model, how, i, k,
                         r->out[i][k], want[i][k]);
    }
}

static int cached_total(const struct engine *r)
{
    int n = 0;
    for (int i = 0; i < N_REQS; i++)
        n += sl_req_cached_tokens(r->reqs[i]);
    return n;
}

Test(sched, real_models_give_the_same_tokens_with_the_prefix_cache_on_and_off)
{
    const char *dir = models_dir();
    for (int m = 0; m < N_MODELS; m++) {
        const char *name = models[m].spec;
        struct prompts p;
        int32_t want[N_REQS][PREFIX_OUT];
        uint64_t now = 0;
        /* The reference: each request alone, without the cache. */
        for (int i = 0; i < N_REQS; i++) {
            struct engine r;
            prefix_engine(&r, dir, m, 4, 64);
            if (i == 0)
                make_prompts(&p, sl_model_config(r.model)->vocab_size);
            prefix_submit(&r, &p, i, false, now);
            run(&r, &now);
            memcpy(want[i], r.out[i], sizeof want[i]);
            engine_dispose(&r);
        }
        /* One after another: each finds what the earlier ones left. */
        struct engine r;
        prefix_engine(&r, dir, m, 4, 64);
        for (int i = 0; i < N_REQS; i++) {
            prefix_submit(&r, &p, i, true, now);
            run(&r, &now);
        }
        assert_same(&r, want, name, "one after another");
        cr_assert_eq(sl_req_cached_tokens(r.reqs[0]), 0);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[1]), 64, "%s: the head's 8 full blocks", name);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[2]), 72, "%s: all of 0's full blocks", name);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[3]), 0);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[4]), 56, "%s: the last block recomputed", name);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[5]), 80, "%s: all of 0's prompt", name);
        engine_dispose(&r);
        /* All at once: a prefix still being prefilled is computed again, not waited for. */
        prefix_engine(&r, dir, m, N_REQS, 128);
        for (int i = 0; i < N_REQS; i++)
            prefix_submit(&r, &p, i, true, now);
        run(&r, &now);
        assert_same(&r, want, name, "all at once");
        engine_dispose(&r);
        /* A pool of 24 blocks: 8 sequences of up to 16 blocks each evict and preempt; then all
         * again, finding what survived. */
        prefix_engine(&r, dir, m, N_REQS, 24);
        for (int i = 0; i < N_REQS; i++)
            prefix_submit(&r, &p, i, true, now + (uint64_t)i);
        run(&r, &now);
        assert_same(&r, want, name, "a small pool");
        struct sl_sched_stats st;
        sl_sched_core_stats(r.core, &st);
        cr_assert_gt(preempted_total(&r), 0, "%s: the small pool preempted", name);
        cr_assert_gt(st.prefix_evictions, 0, "%s: and evicted", name);
        int first = cached_total(&r);
        for (int i = 0; i < N_REQS; i++) {
            sl_req_unref(r.reqs[i]);
            r.reqs[i] = NULL;
            r.n_out[i] = 0;
        }
        for (int i = 0; i < N_REQS; i++)
            prefix_submit(&r, &p, i, true, now + (uint64_t)i);
        run(&r, &now);
        assert_same(&r, want, name, "a small pool, again");
        cr_assert_gt(cached_total(&r), 0, "%s: the second wave found cached blocks", name);
        cr_log_info("%s: identical with the cache on and off; small pool: %d preemptions, %llu "
                    "evictions, %d then %d tokens cached",
                    name, preempted_total(&r), (unsigned long long)st.prefix_evictions, first,
                    cached_total(&r));
        engine_dispose(&r);
    }
}
