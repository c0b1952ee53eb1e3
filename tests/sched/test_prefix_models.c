/* The prefix cache over the real CPU worker and every real model of ../shared/models: greedy and
 * seeded outputs are identical, token for token, with the cache on and off, for requests that
 * share none, some and all of their full blocks, one after another, all at once (a prefix still
 * being prefilled by another request), and in a pool so small that cached blocks are evicted
 * and sequences preempted. The CPU kernels give a row the same bits whatever the batch, so a
 * block computed for one request is the block another would compute. Skips, saying so, when the
 * models folder is absent. */
#include <criterion/criterion.h>
#include <sluice/sched.h>

#include "../models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define N_REQS 8
#define MAX_OUT 24
#define BS 8

struct run {
    struct sl_model *model;
    struct sl_worker *worker;
    struct sl_sched_core *core;
    struct sl_req *reqs[N_REQS];
    int32_t out[N_REQS][MAX_OUT];
    int n_out[N_REQS];
    int preempted;
};

static int forward(void *ctx, const struct sl_batch *b, float *logits)
{
    struct run *r = ctx;
    return sl_worker_forward(r->worker, b, logits);
}

static int index_of(struct run *r, struct sl_req *q)
{
    for (int i = 0; i < N_REQS; i++)
        if (r->reqs[i] == q)
            return i;
    cr_assert_fail("unknown request");
    return -1;
}

static bool on_token(void *ctx, struct sl_req *q, int32_t token)
{
    struct run *r = ctx;
    int i = index_of(r, q);
    cr_assert_lt(r->n_out[i], MAX_OUT);
    r->out[i][r->n_out[i]++] = token;
    return false;
}

static void on_done(void *ctx, struct sl_req *q, enum sl_finish why, int status, int n)
{
    (void)ctx, (void)q, (void)n;
    cr_assert_eq(why, SL_FINISH_LENGTH, "status %d", status);
}

static void on_preempted(void *ctx, struct sl_req *q)
{
    struct run *r = ctx;
    (void)q;
    r->preempted++;
}

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

static const char *models_dir(void)
{
    const char *d = getenv("SL_MODELS_DIR");
    struct stat st;
    if (!d || stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
        MODELS_MISSING("needs real models: ../shared/models not found (SL_MODELS_DIR=%s)",
                       d ? d : "(unset)");
    return d;
}

static void run_init(struct run *r, const char *dir, int m, int max_seqs, int n_blocks)
{
    memset(r, 0, sizeof *r);
    char spec[1024], tok[1024], err[256];
    snprintf(spec, sizeof spec, "%s/%s", dir, models[m].spec);
    if (models[m].tok)
        snprintf(tok, sizeof tok, "%s/%s", dir, models[m].tok);
    cr_assert_eq(sl_model_load(spec, models[m].tok ? tok : NULL, &r->model, err, sizeof err), SL_OK,
                 "%s: %s", spec, err);
    const struct sl_model_config *mc = sl_model_config(r->model);
    struct sl_backend_opts bo = {.n_kv_blocks = n_blocks,
                                 .block_size = BS,
                                 .max_batch_tokens = 64,
                                 .max_seqs = max_seqs,
                                 .threads = 1};
    cr_assert_eq(sl_worker_new(r->model, &sl_cpu_backend_ops, &bo, &r->worker), SL_OK);
    struct sl_sched_limits lim = {.vocab = mc->vocab_size,
                                  .max_ctx = mc->seq_len,
                                  .max_seqs = max_seqs,
                                  .max_batch_tokens = 64,
                                  .n_blocks = n_blocks,
                                  .block_size = BS,
                                  .cache_seed = {1, 2, 3, 4}};
    struct sl_sched_worker w = {.ctx = r, .forward = forward};
    struct sl_sched_sink s = {
        .ctx = r, .token = on_token, .done = on_done, .preempted = on_preempted};
    r->core = sl_sched_core_new(&lim, &w, &s);
    cr_assert_not_null(r->core);
}

static void run_dispose(struct run *r)
{
    sl_sched_core_free(r->core);
    for (int i = 0; i < N_REQS; i++)
        sl_req_unref(r->reqs[i]);
    sl_worker_free(r->worker);
    sl_model_free(r->model);
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
static void submit(struct run *r, const struct prompts *p, int i, bool cache, uint64_t now)
{
    struct sl_req_params q = {.max_tokens = MAX_OUT,
                              .temperature = i % 2 ? 0.9f : 0.f,
                              .top_p = 0.95f,
                              .seed = 1000 + (uint64_t)i,
                              .ignore_eos = true,
                              .cache_prefix = cache,
                              .cache_key = 77};
    r->reqs[i] = sl_req_new(sl_req_prompt_copy(p->ids[i], p->n[i]), &q);
    cr_assert_eq(sl_sched_core_submit(r->core, r->reqs[i], now), SL_OK);
}

static void drain(struct run *r, uint64_t *now)
{
    for (int k = 0; sl_sched_core_pending(r->core) > 0; k++, *now += 20000000) {
        cr_assert_lt(k, 20000, "the core drained");
        cr_assert_geq(sl_sched_core_step(r->core, *now), 0);
    }
}

static void assert_same(const struct run *r, int32_t want[N_REQS][MAX_OUT], const char *model,
                        const char *how)
{
    for (int i = 0; i < N_REQS; i++) {
        cr_assert_eq(r->n_out[i], MAX_OUT, "%s, %s: request %d", model, how, i);
        for (int k = 0; k < MAX_OUT; k++)
            cr_assert_eq(r->out[i][k], want[i][k],
                         "%s, %s: request %d token %d is %d, uncached alone %d", model, how, i, k,
                         r->out[i][k], want[i][k]);
    }
}

static int cached_total(const struct run *r)
{
    int n = 0;
    for (int i = 0; i < N_REQS; i++)
        n += sl_req_cached_tokens(r->reqs[i]);
    return n;
}

Test(prefix_models, outputs_are_identical_with_the_cache_on_and_off)
{
    const char *dir = models_dir();
    for (int m = 0; m < N_MODELS; m++) {
        const char *name = models[m].spec;
        struct prompts p;
        int32_t want[N_REQS][MAX_OUT];
        uint64_t now = 0;
        /* The reference: each request alone, without the cache. */
        for (int i = 0; i < N_REQS; i++) {
            struct run r;
            run_init(&r, dir, m, 4, 64);
            if (i == 0)
                make_prompts(&p, sl_model_config(r.model)->vocab_size);
            submit(&r, &p, i, false, now);
            drain(&r, &now);
            memcpy(want[i], r.out[i], sizeof want[i]);
            run_dispose(&r);
        }
        /* One after another: each finds what the earlier ones left. */
        struct run r;
        run_init(&r, dir, m, 4, 64);
        for (int i = 0; i < N_REQS; i++) {
            submit(&r, &p, i, true, now);
            drain(&r, &now);
        }
        assert_same(&r, want, name, "one after another");
        cr_assert_eq(sl_req_cached_tokens(r.reqs[0]), 0);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[1]), 64, "%s: the head's 8 full blocks", name);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[2]), 72, "%s: all of 0's full blocks", name);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[3]), 0);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[4]), 56, "%s: the last block recomputed", name);
        cr_assert_eq(sl_req_cached_tokens(r.reqs[5]), 80, "%s: all of 0's prompt", name);
        run_dispose(&r);
        /* All at once: a prefix still being prefilled is computed again, not waited for. */
        run_init(&r, dir, m, N_REQS, 128);
        for (int i = 0; i < N_REQS; i++)
            submit(&r, &p, i, true, now);
        drain(&r, &now);
        assert_same(&r, want, name, "all at once");
        run_dispose(&r);
        /* A pool of 24 blocks: 8 sequences of up to 16 blocks each evict and preempt; then all
         * again, finding what survived. */
        run_init(&r, dir, m, N_REQS, 24);
        for (int i = 0; i < N_REQS; i++)
            submit(&r, &p, i, true, now + (uint64_t)i);
        drain(&r, &now);
        assert_same(&r, want, name, "a small pool");
        struct sl_sched_stats st;
        sl_sched_core_stats(r.core, &st);
        cr_assert_gt(r.preempted, 0, "%s: the small pool preempted", name);
        cr_assert_gt(st.prefix_evictions, 0, "%s: and evicted", name);
        int first = cached_total(&r);
        for (int i = 0; i < N_REQS; i++) {
            sl_req_unref(r.reqs[i]);
            r.reqs[i] = NULL;
            r.n_out[i] = 0;
        }
        for (int i = 0; i < N_REQS; i++)
            submit(&r, &p, i, true, now + (uint64_t)i);
        drain(&r, &now);
        assert_same(&r, want, name, "a small pool, again");
        cr_assert_gt(cached_total(&r), 0, "%s: the second wave found cached blocks", name);
        cr_log_info("%s: identical with the cache on and off; small pool: %d preemptions, %llu "
                    "evictions, %d then %d tokens cached",
                    name, r.preempted, (unsigned long long)st.prefix_evictions, first,
                    cached_total(&r));
        run_dispose(&r);
    }
}
