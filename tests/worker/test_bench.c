#include "worker_test.h"

#include <math.h>

/* ---------------------------------------------------------------------------------------------
 * Benchmark hooks (worker.h): the batches bench/engine_bench.c runs, the work counts its
 * ceilings divide, and the phase timer.
 */

static struct sl_worker_bench *new_bench(const struct sl_model *m, int max_seqs, int ctx,
                                         int prompt, int block_size)
{
    struct sl_worker_bench *b = NULL;
    cr_assert_eq(sl_worker_bench_new(m, max_seqs, ctx, prompt, block_size, &b), SL_OK,
                 "layout %d seqs, ctx %d, prompt %d, blocks of %d", max_seqs, ctx, prompt,
                 block_size);
    return b;
}

Test(worker, bench_new_fails_when_layout_is_out_of_bounds)
{
    struct sl_model *m = wt_load("synthetic:tiny", NULL); /* seq_len 512 */
    struct sl_worker_bench *b = NULL;
    const int bad[][4] = {{0, 8, 8, 16},   {4, 0, 8, 16}, {4, 513, 8, 16}, {4, 8, 0, 16},
                          {4, 8, 513, 16}, {4, 8, 8, 0},  {-1, 8, 8, 16},  {4, -3, 8, 16}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(sl_worker_bench_new(m, bad[i][0], bad[i][1], bad[i][2], bad[i][3], &b),
                     SL_EINVAL, "case %zu", i);
    cr_assert_null(b);
    sl_model_free(m);
}

/* The layouts below: ctx a multiple of the block size or not, ctx of 1 (nothing to write),
 * ctx - 1 longer than both the prompt and max_seqs (one batch must still hold a context), a
 * prompt of 1. */
static const int layouts[][4] = {
    {4, 32, 64, 16},  {5, 33, 7, 16}, {3, 1, 20, 4},
    {2, 200, 10, 16}, {8, 17, 1, 1},  {1, 512, 512, 16},
};

Test(worker, bench_batches_pass_the_check_when_worker_has_bench_opts)
{
    struct sl_model *m = wt_load("synthetic:tiny", NULL);
    const struct sl_model_config *cfg = sl_model_config(m);
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
        int S = layouts[li][0], ctx = layouts[li][1], P = layouts[li][2];
        struct sl_worker_bench *b = new_bench(m, S, ctx, P, layouts[li][3]);
        struct sl_backend_opts o = {.threads = 3, .kv_dtype = SL_KV_F16};
        sl_worker_bench_opts(b, &o);
        cr_assert_eq(o.threads, 3, "other fields are left as they were");
        cr_assert_eq(o.kv_dtype, SL_KV_F16);
        cr_assert_eq(o.max_seqs, S);
        cr_assert_eq(o.block_size, layouts[li][3]);

        const struct sl_batch *pb = sl_worker_bench_prompt(b);
        cr_assert_eq(sl_worker_batch_check(pb, cfg, &o), SL_OK, "layout %zu: prompt", li);
        cr_assert_eq(pb->n_tokens, P);
        cr_assert_eq(pb->n_logits, 1);
        cr_assert_eq(pb->logit_rows[0], P - 1);

        int ns = -1;
        cr_assert_null(sl_worker_bench_context(b, -1, &ns));
        cr_assert_eq(ns, 0);
        cr_assert_null(sl_worker_bench_context(b, S, &ns));
        cr_assert_eq(ns, 0);
        for (int s0 = 0; s0 < S; s0 += ns) {
            const struct sl_batch *cb = sl_worker_bench_context(b, s0, &ns);
            if (ctx == 1) {
                cr_assert_null(cb, "layout %zu: a context of 1 has nothing to write", li);
                break;
            }
            cr_assert_not_null(cb);
            cr_assert(ns >= 1 && s0 + ns <= S, "layout %zu: %d sequences from %d", li, ns, s0);
            cr_assert_eq(cb->n_seqs, ns);
            cr_assert_eq(cb->n_tokens, ns * (ctx - 1));
            cr_assert_eq(cb->n_logits, 0);
            cr_assert_eq(sl_worker_batch_check(cb, cfg, &o), SL_OK, "layout %zu: context %d", li,
                         s0);
            for (int r = 0; r < cb->n_tokens; r++)
                cr_assert_eq(cb->pos[r], r % (ctx - 1));
        }

        cr_assert_null(sl_worker_bench_decode(b, 0));
        cr_assert_null(sl_worker_bench_decode(b, S + 1));
        for (int B = 1; B <= S; B++) {
            const struct sl_batch *db = sl_worker_bench_decode(b, B);
            cr_assert_not_null(db);
            cr_assert_eq(sl_worker_batch_check(db, cfg, &o), SL_OK, "layout %zu: decode %d", li, B);
            cr_assert_eq(db->n_tokens, B);
            cr_assert_eq(db->n_logits, B);
            for (int r = 0; r < B; r++) {
                cr_assert_eq(db->pos[r], ctx - 1);
                cr_assert_eq(db->seq[r], r);
                cr_assert_eq(db->ctx_len[r], ctx);
            }
        }
        sl_worker_bench_free(b);
    }
    sl_model_free(m);
}

Test(worker, bench_sequences_own_disjoint_blocks_when_layout_is_made)
{
    struct sl_model *m = wt_load("synthetic:tiny", NULL);
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
        int S = layouts[li][0], ctx = layouts[li][1], P = layouts[li][2], bs = layouts[li][3];
        struct sl_worker_bench *b = new_bench(m, S, ctx, P, bs);
        struct sl_backend_opts o = {0};
        sl_worker_bench_opts(b, &o);
        int *owner = calloc((size_t)o.n_kv_blocks, sizeof(int));
        const struct sl_batch *db = sl_worker_bench_decode(b, S);
        for (int s = 0; s <= S; s++) { /* S: the prompt */
            const int32_t *t =
                s < S ? db->block_tables[s] : sl_worker_bench_prompt(b)->block_tables[0];
            int len = s < S ? ctx : P;
            for (int i = 0; i < (len + bs - 1) / bs; i++) {
                cr_assert(t[i] >= 0 && t[i] < o.n_kv_blocks, "layout %zu: block %d", li, t[i]);
                cr_assert_eq(owner[t[i]], 0, "layout %zu: block %d twice", li, t[i]);
                owner[t[i]] = s + 1;
            }
        }
        /* The context batches write into the tables the decode steps read. */
        int ns = 0;
        for (int s0 = 0; ctx > 1 && s0 < S; s0 += ns) {
            const struct sl_batch *cb = sl_worker_bench_context(b, s0, &ns);
            cr_assert_not_null(cb, "layout %zu: context %d", li, s0);
            for (int i = 0; i < ns; i++)
                cr_assert_eq(cb->block_tables[i][0], db->block_tables[s0 + i][0]);
        }
        free(owner);
        sl_worker_bench_free(b);
    }
    sl_model_free(m);
}

Test(worker, bench_decode_row_does_not_depend_on_batch_when_contexts_are_written)
{
    struct sl_model *m = wt_load("synthetic:tiny", NULL);
    int V = sl_model_config(m)->vocab_size, S = 4;
    struct sl_worker_bench *b = new_bench(m, S, 21, 40, 4);
    struct sl_backend_opts o = {.threads = 2};
    sl_worker_bench_opts(b, &o);
    struct sl_worker *w = NULL;
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w), SL_OK);
    float *logits = malloc((size_t)S * V * sizeof(float)), *one = malloc((size_t)V * sizeof(float));
    cr_assert_eq(sl_worker_forward(w, sl_worker_bench_prompt(b), logits), SL_OK);
    int ns = 0;
    for (int s0 = 0; s0 < S; s0 += ns) {
        const struct sl_batch *cb = sl_worker_bench_context(b, s0, &ns);
        cr_assert_not_null(cb);
        cr_assert_eq(sl_worker_forward(w, cb, NULL), SL_OK);
    }
    cr_assert_eq(sl_worker_forward(w, sl_worker_bench_decode(b, 1), one), SL_OK);
    cr_assert_eq(sl_worker_forward(w, sl_worker_bench_decode(b, S), logits), SL_OK);
    cr_assert_eq(memcmp(one, logits, (size_t)V * sizeof(float)), 0,
                 "sequence 0's row alone and in a batch of %d", S);
    for (size_t i = 0; i < (size_t)S * V; i++)
        cr_assert(isfinite(logits[i]));
    free(one);
    free(logits);
    sl_worker_free(w);
    sl_worker_bench_free(b);
    sl_model_free(m);
}

Test(worker, bench_work_counts_every_matrix_when_model_is_tiny)
{
    /* tiny: dim 64, hidden 172, 5 layers, 8 heads of 8, 4 KV heads, vocab 512 */
    double layer = 64 * 64 * 2 + 32 * 64 * 2 + 172 * 64 * 3, tail = 64 * 64 + 172 * 64 * 3;
    struct sl_model *m = wt_load("synthetic:tiny", NULL);
    struct sl_model_work wk;
    sl_model_bench_work(m, &wk);
    cr_assert_eq(wk.layer_params, 5 * layer);
    cr_assert_eq(wk.decode_params, 5 * layer + 512 * 64);
    cr_assert_eq(wk.weight_bytes, 4 * wk.decode_params);
    cr_assert_eq(wk.last_tail_params, tail);
    cr_assert_str_eq(wk.weight_type, "f32");
    sl_model_free(m);

    m = wt_load("synthetic:tiny:f16", NULL);
    struct sl_model_work wq;
    sl_model_bench_work(m, &wq);
    cr_assert_eq(wq.decode_params, wk.decode_params);
    cr_assert_eq(wq.layer_params, wk.layer_params);
    cr_assert(wq.weight_bytes >= 2 * wq.layer_params && wq.weight_bytes < wk.weight_bytes,
              "f16 bytes %.0f", wq.weight_bytes);
    cr_assert_str_eq(wq.weight_type, "f16");
    sl_model_free(m);
}

Test(worker, bench_phases_are_zero_when_timing_is_off)
{
    struct sl_model *m = wt_load("synthetic:tiny", NULL);
    struct sl_worker_bench *b = new_bench(m, 2, 9, 16, 4);
    struct sl_backend_opts o = {.threads = 1};
    sl_worker_bench_opts(b, &o);
    struct sl_worker *w = NULL;
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w), SL_OK);
    float *logits = malloc((size_t)2 * sl_model_config(m)->vocab_size * sizeof(float));
    uint64_t ns[SL_WORKER_PHASES];

    cr_assert_eq(sl_worker_forward(w, sl_worker_bench_decode(b, 2), logits), SL_OK);
    cr_assert_eq(sl_worker_bench_phases(w, ns), SL_OK);
    for (int p = 0; p < SL_WORKER_PHASES; p++)
        cr_assert_eq(ns[p], 0, "phase %s timed while off", sl_worker_phase_name(p));

    cr_assert_eq(sl_worker_bench_time_phases(w, true), SL_OK);
    uint64_t t0 = sl_clock_ns();
    cr_assert_eq(sl_worker_forward(w, sl_worker_bench_decode(b, 2), logits), SL_OK);
    uint64_t wall = sl_clock_ns() - t0, sum = 0;
    cr_assert_eq(sl_worker_bench_phases(w, ns), SL_OK);
    for (int p = 0; p < SL_WORKER_PHASES; p++)
        sum += ns[p];
    cr_assert(sum > 0 && sum <= wall, "phases %llu ns of a %llu ns forward",
              (unsigned long long)sum, (unsigned long long)wall);
    cr_assert_eq(sl_worker_bench_phases(w, ns), SL_OK);
    for (int p = 0; p < SL_WORKER_PHASES; p++)
        cr_assert_eq(ns[p], 0, "phase %s not started again from zero", sl_worker_phase_name(p));

    cr_assert_eq(sl_worker_bench_time_phases(w, false), SL_OK);
    cr_assert_eq(sl_worker_forward(w, sl_worker_bench_decode(b, 1), logits), SL_OK);
    cr_assert_eq(sl_worker_bench_phases(w, ns), SL_OK);
    for (int p = 0; p < SL_WORKER_PHASES; p++)
        cr_assert_eq(ns[p], 0);
    free(logits);
    sl_worker_free(w);
    sl_worker_bench_free(b);
    sl_model_free(m);
}

Test(worker, bench_phase_names_are_distinct_when_listed)
{
    for (int p = 0; p < SL_WORKER_PHASES; p++) {
        cr_assert_str_neq(sl_worker_phase_name(p), "?");
        for (int q = 0; q < p; q++)
            cr_assert_str_neq(sl_worker_phase_name(p), sl_worker_phase_name(q));
    }
    cr_assert_str_eq(sl_worker_phase_name(SL_WORKER_PHASES), "?");
    cr_assert_str_eq(sl_worker_phase_name(SL_WORKER_PHASE_QKV), "qkv");
    cr_assert_str_eq(sl_worker_phase_name(SL_WORKER_PHASE_CLASSIFIER), "classifier");
}

/* A backend that is not the CPU's: the CPU hooks refuse its workers. */
static int fake_init(const struct sl_model *m, const struct sl_backend_opts *o, void **ctx)
{
    (void)m;
    (void)o;
    *ctx = NULL;
    return SL_OK;
}
static int fake_forward(void *ctx, const struct sl_batch *b, float *logits)
{
    (void)ctx;
    (void)b;
    (void)logits;
    return SL_OK;
}
static void fake_free(void *ctx)
{
    (void)ctx;
}
static const struct sl_backend_ops fake_ops = {
    .name = "fake", .init = fake_init, .forward = fake_forward, .free = fake_free};

Test(worker, bench_hooks_fail_when_backend_is_not_theirs)
{
    struct sl_model *m = wt_load("synthetic:tiny", NULL);
    struct sl_backend_opts o = {
        .n_kv_blocks = 1, .block_size = 16, .max_batch_tokens = 1, .max_seqs = 1};
    struct sl_worker *w = NULL;
    cr_assert_eq(sl_worker_new(m, &fake_ops, &o, &w), SL_OK);
    uint64_t ns[SL_WORKER_PHASES];
    struct sl_worker_profile prof;
    cr_assert_eq(sl_worker_bench_time_phases(w, true), SL_EINVAL);
    cr_assert_eq(sl_worker_bench_phases(w, ns), SL_EINVAL);
    cr_assert_eq(sl_worker_bench_profile(w, &prof), SL_EINVAL);
    sl_worker_free(w);

    /* A CPU worker has no launch profile either. */
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w), SL_OK);
    cr_assert_eq(sl_worker_bench_profile(w, &prof), SL_EINVAL);
    sl_worker_free(w);
    sl_model_free(m);
}
