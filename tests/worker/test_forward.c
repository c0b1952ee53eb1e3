#include "worker_test.h"

#include <math.h>

/* ---------------------------------------------------------------------------------------------
 * Kernels against scalar double-precision references, over odd shapes.
 */

static uint64_t rs = 12345;
static float frand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rand_vec(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

static void assert_close(const float *got, const double *want, size_t n, double tol,
                         const char *what)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])),
                  "%s[%zu]: got %.9g want %.9g", what, i, got[i], want[i]);
}

static const int shapes[] = {1, 2, 3, 5, 7, 16, 17, 33, 64, 65};
#define NSHAPES (int)(sizeof(shapes) / sizeof(shapes[0]))

Test(worker, matmul_matches_reference_when_shapes_are_odd)
{
    struct sl_cpu_pool *pool = sl_cpu_pool_new(3);
    cr_assert_not_null(pool);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < NSHAPES; b++)
            for (int c = 0; c < NSHAPES; c++) {
                int n = shapes[a], d = shapes[b] * 9, k = shapes[c];
                float *x = rand_vec((size_t)n * k), *w = rand_vec((size_t)d * k);
                float *out = malloc((size_t)n * d * sizeof(float));
                float *out_mt = malloc((size_t)n * d * sizeof(float));
                double *ref = malloc((size_t)n * d * sizeof(double));
                for (int r = 0; r < n; r++)
                    for (int i = 0; i < d; i++) {
                        double s = 0;
                        for (int j = 0; j < k; j++)
                            s += (double)x[r * k + j] * w[(size_t)i * k + j];
                        ref[(size_t)r * d + i] = s;
                    }
                sl_cpu_matmul(out, x, w, n, d, k);
                assert_close(out, ref, (size_t)n * d, 1e-5 * k, "matmul");
                sl_cpu_matmul_mt(pool, out_mt, x, w, n, d, k);
                /* Splitting by output rows must not change a single bit. */
                cr_assert(memcmp(out, out_mt, (size_t)n * d * sizeof(float)) == 0,
                          "matmul_mt differs at n=%d d=%d k=%d", n, d, k);
                free(x);
                free(w);
                free(out);
                free(out_mt);
                free(ref);
            }
    sl_cpu_pool_free(pool);
}

Test(worker, rmsnorm_matches_reference_when_shapes_are_odd)
{
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < NSHAPES; b++) {
            int n = shapes[a], dim = shapes[b];
            float *x = rand_vec((size_t)n * dim), *w = rand_vec((size_t)dim);
            float *out = malloc((size_t)n * dim * sizeof(float));
            double *ref = malloc((size_t)n * dim * sizeof(double));
            for (int r = 0; r < n; r++) {
                double ss = 0;
                for (int j = 0; j < dim; j++)
                    ss += (double)x[r * dim + j] * x[r * dim + j];
                double inv = 1.0 / sqrt(ss / dim + 1e-5);
                for (int j = 0; j < dim; j++)
                    ref[r * dim + j] = w[j] * x[r * dim + j] * inv;
            }
            sl_cpu_rmsnorm(out, x, w, n, dim, 1e-5f);
            assert_close(out, ref, (size_t)n * dim, 1e-5, "rmsnorm");
            sl_cpu_rmsnorm(x, x, w, n, dim, 1e-5f); /* in place */
            assert_close(x, ref, (size_t)n * dim, 1e-5, "rmsnorm in place");
            free(x);
            free(w);
            free(out);
            free(ref);
        }
}

Test(worker, softmax_matches_reference_when_values_are_large)
{
    for (int b = 0; b < NSHAPES; b++) {
        int n = shapes[b];
        float *x = rand_vec((size_t)n);
        for (int i = 0; i < n; i++)
            x[i] = x[i] * 50.0f + (i % 2 ? 1000.0f : 0.0f);
        double *ref = malloc((size_t)n * sizeof(double));
        double max = x[0], sum = 0;
        for (int i = 1; i < n; i++)
            max = x[i] > max ? x[i] : max;
        for (int i = 0; i < n; i++)
            sum += ref[i] = exp(x[i] - max);
        for (int i = 0; i < n; i++)
            ref[i] /= sum;
        sl_cpu_softmax(x, n);
        assert_close(x, ref, (size_t)n, 1e-5, "softmax");
        free(x);
        free(ref);
    }
}

Test(worker, rope_matches_complex_rotation_when_heads_vary)
{
    int heads[] = {1, 3, 8}, sizes[] = {2, 8, 16, 48}, positions[] = {0, 1, 7, 255, 511};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 5; c++) {
                int nh = heads[a], hs = sizes[b], pos = positions[c];
                float *x = rand_vec((size_t)nh * hs);
                double *ref = malloc((size_t)nh * hs * sizeof(double));
                for (int h = 0; h < nh; h++)
                    for (int i = 0; i < hs; i += 2) {
                        double ang = pos * pow(10000.0, -(double)i / hs);
                        double re = x[h * hs + i], im = x[h * hs + i + 1];
                        ref[h * hs + i] = re * cos(ang) - im * sin(ang);
                        ref[h * hs + i + 1] = re * sin(ang) + im * cos(ang);
                    }
                sl_cpu_rope(x, nh, hs, pos, 10000.0f);
                /* fp32 angles at position 511 are only good to ~1e-4 radians. */
                assert_close(x, ref, (size_t)nh * hs, 2e-4, "rope");
                free(x);
                free(ref);
            }
}

Test(worker, elementwise_kernels_match_reference_when_shapes_are_odd)
{
    for (int b = 0; b < NSHAPES; b++) {
        int n = shapes[b];
        float *h = rand_vec((size_t)n), *g = rand_vec((size_t)n), *y = rand_vec((size_t)n);
        double *ref = malloc((size_t)n * sizeof(double));
        for (int i = 0; i < n; i++)
            ref[i] = h[i] / (1.0 + exp(-(double)h[i])) * g[i];
        sl_cpu_swiglu(h, g, n);
        assert_close(h, ref, (size_t)n, 1e-6, "swiglu");
        double dot = 0;
        for (int i = 0; i < n; i++) {
            dot += (double)g[i] * y[i];
            ref[i] = (double)y[i] + 0.5 * g[i];
        }
        cr_assert(fabs(sl_cpu_dot(g, y, n) - dot) <= 1e-5 * n, "dot");
        sl_cpu_axpy(y, 0.5f, g, n);
        assert_close(y, ref, (size_t)n, 1e-6, "axpy");
        for (int i = 0; i < n; i++)
            ref[i] = (double)y[i] + g[i];
        sl_cpu_add(y, g, n);
        assert_close(y, ref, (size_t)n, 1e-6, "add");
        free(h);
        free(g);
        free(y);
        free(ref);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Forward over batches.
 */

#define NB 64 /* KV blocks in the pool */
#define BS 4  /* small blocks, so sequences span many of them */

static struct sl_worker *new_worker(const struct sl_model *m, int threads)
{
    struct sl_backend_opts o = {.n_kv_blocks = NB,
                                .block_size = BS,
                                .max_batch_tokens = 48,
                                .max_seqs = 4,
                                .threads = threads};
    struct sl_worker *w = NULL;
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w), SL_OK);
    return w;
}

/* One row per token of a step: (seq, token, pos); every row gets logits. */
struct step {
    int n;
    int32_t tokens[48], pos[48], seq[48], rows[48];
};

static void step_add(struct step *s, int seq, int32_t token, int32_t pos)
{
    s->tokens[s->n] = token;
    s->pos[s->n] = pos;
    s->seq[s->n] = seq;
    s->rows[s->n] = s->n;
    s->n++;
}

/* Runs a step where sequence i owns block_tables[i] and has ctx_len[i] positions after it. */
static void run_step(struct sl_worker *w, const struct step *s, int n_seqs,
                     const int32_t *const *tables, const int32_t *ctx, float *logits)
{
    struct sl_batch b = {.n_tokens = s->n,
                         .tokens = s->tokens,
                         .pos = s->pos,
                         .seq = s->seq,
                         .n_seqs = n_seqs,
                         .block_tables = tables,
                         .ctx_len = ctx,
                         .n_logits = s->n,
                         .logit_rows = s->rows};
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_OK);
}

static void assert_rows_close(const float *a, const float *b, int vocab, const char *what)
{
    for (int i = 0; i < vocab; i++)
        cr_assert(fabsf(a[i] - b[i]) <= 1e-4f * (1.0f + fabsf(b[i])), "%s: logit %d %g vs %g", what,
                  i, a[i], b[i]);
}

static const int32_t seq_a[20] = {1,   300, 301, 302, 400, 17,  500, 260, 270, 280,
                                  290, 310, 320, 330, 340, 350, 360, 370, 380, 390};
static const int32_t seq_b[10] = {1, 450, 451, 452, 453, 454, 455, 456, 457, 458};

/* Logits of every position of seq_a, prefilled alone in one chunk. */
static float *reference_a(const struct sl_model *m)
{
    int V = sl_model_config(m)->vocab_size;
    struct sl_worker *w = new_worker(m, 1);
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t *tables[1] = {table};
    int32_t ctx[1] = {20};
    struct step s = {0};
    for (int i = 0; i < 20; i++)
        step_add(&s, 0, seq_a[i], i);
    float *logits = malloc((size_t)20 * V * sizeof(float));
    run_step(w, &s, 1, tables, ctx, logits);
    sl_worker_free(w);
    return logits;
}

Test(worker, logits_are_sane_when_model_is_synthetic)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    int V = sl_model_config(m)->vocab_size;
    float *ref = reference_a(m);
    for (int r = 0; r < 20; r++) {
        double sum = 0, sq = 0;
        for (int i = 0; i < V; i++) {
            float v = ref[(size_t)r * V + i];
            cr_assert(isfinite(v));
            sum += v;
            sq += (double)v * v;
        }
        double sd = sqrt(sq / V - (sum / V) * (sum / V));
        cr_assert(sd > 0.1 && sd < 50.0, "row %d: logit sd %g", r, sd);
    }
    free(ref);
    sl_model_free(m);
}

Test(worker, logits_match_when_sequence_shares_batch_with_prefill_and_decode)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    int V = sl_model_config(m)->vocab_size;
    float *ref = reference_a(m);
    float *logits = malloc((size_t)48 * V * sizeof(float));

    /* Interleaved, non-contiguous block ids, different from the reference run's. */
    struct sl_worker *w = new_worker(m, 1);
    int32_t ta[8] = {9, 3, 17, 40, 22, 63, 5, 11}, tb[4] = {8, 33, 2, 50};
    const int32_t *tables[2] = {tb, ta};

    /* Step 1: B prefills 6 tokens alone. */
    struct step s = {0};
    int32_t ctx[2] = {6, 0};
    for (int i = 0; i < 6; i++)
        step_add(&s, 0, seq_b[i], i);
    run_step(w, &s, 1, tables, ctx, logits);
    /* Step 2: B decodes one token and A prefills its first 9 in the same batch. */
    s.n = 0;
    step_add(&s, 0, seq_b[6], 6);
    for (int i = 0; i < 9; i++)
        step_add(&s, 1, seq_a[i], i);
    ctx[0] = 7;
    ctx[1] = 9;
    run_step(w, &s, 2, tables, ctx, logits);
    for (int i = 0; i < 9; i++)
        assert_rows_close(logits + (size_t)(1 + i) * V, ref + (size_t)i * V, V, "A chunk 1");
    float *b_dec = malloc((size_t)2 * V * sizeof(float));
    memcpy(b_dec, logits, (size_t)V * sizeof(float));
    /* Step 3: A's remaining prefill first, then B's decode after it. */
    s.n = 0;
    for (int i = 9; i < 20; i++)
        step_add(&s, 1, seq_a[i], i);
    step_add(&s, 0, seq_b[7], 7);
    ctx[0] = 8;
    ctx[1] = 20;
    run_step(w, &s, 2, tables, ctx, logits);
    for (int i = 9; i < 20; i++)
        assert_rows_close(logits + (size_t)(i - 9) * V, ref + (size_t)i * V, V, "A chunk 2");
    memcpy(b_dec + V, logits + (size_t)11 * V, (size_t)V * sizeof(float));
    sl_worker_free(w);

    /* B's decode rows equal B prefilled alone. */
    w = new_worker(m, 1);
    s.n = 0;
    for (int i = 0; i < 8; i++)
        step_add(&s, 0, seq_b[i], i);
    float *refb = malloc((size_t)8 * V * sizeof(float));
    ctx[0] = 8;
    run_step(w, &s, 1, tables, ctx, refb);
    assert_rows_close(b_dec, refb + (size_t)6 * V, V, "B decode 6");
    assert_rows_close(b_dec + V, refb + (size_t)7 * V, V, "B decode 7");
    sl_worker_free(w);
    free(refb);
    free(b_dec);
    free(logits);
    free(ref);
    sl_model_free(m);
}

Test(worker, logits_match_when_prefill_is_chunked_or_decoded_one_by_one)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    int V = sl_model_config(m)->vocab_size;
    float *ref = reference_a(m);
    float *logits = malloc((size_t)48 * V * sizeof(float));
    int32_t table[8] = {7, 6, 5, 4, 3, 2, 1, 0};
    const int32_t *tables[1] = {table};
    int32_t ctx[1];

    struct sl_worker *w = new_worker(m, 2);
    int chunks[] = {0, 7, 14, 20};
    for (int c = 0; c < 3; c++) {
        struct step s = {0};
        for (int i = chunks[c]; i < chunks[c + 1]; i++)
            step_add(&s, 0, seq_a[i], i);
        ctx[0] = chunks[c + 1];
        run_step(w, &s, 1, tables, ctx, logits);
        for (int i = chunks[c]; i < chunks[c + 1]; i++)
            assert_rows_close(logits + (size_t)(i - chunks[c]) * V, ref + (size_t)i * V, V,
                              "chunked");
    }
    sl_worker_free(w);

    w = new_worker(m, 1);
    for (int i = 0; i < 20; i++) {
        struct step s = {0};
        step_add(&s, 0, seq_a[i], i);
        ctx[0] = i + 1;
        run_step(w, &s, 1, tables, ctx, logits);
        assert_rows_close(logits, ref + (size_t)i * V, V, "one by one");
    }
    sl_worker_free(w);
    free(logits);
    free(ref);
    sl_model_free(m);
}

Test(worker, logits_are_bitwise_equal_when_thread_count_changes)
{
    struct sl_model *m = wt_load("synthetic:stories15M", NULL);
    int V = sl_model_config(m)->vocab_size;
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t *tables[1] = {table};
    int32_t ctx[1] = {12};
    struct step s = {0};
    for (int i = 0; i < 12; i++)
        step_add(&s, 0, seq_a[i] * 37, i);
    float *l1 = malloc((size_t)12 * V * sizeof(float)),
          *l4 = malloc((size_t)12 * V * sizeof(float));
    struct sl_worker *w = new_worker(m, 1);
    run_step(w, &s, 1, tables, ctx, l1);
    sl_worker_free(w);
    w = new_worker(m, 4);
    run_step(w, &s, 1, tables, ctx, l4);
    sl_worker_free(w);
    cr_assert(memcmp(l1, l4, (size_t)12 * V * sizeof(float)) == 0);
    free(l1);
    free(l4);
    sl_model_free(m);
}

Test(worker, forward_only_writes_requested_logit_rows_when_few_are_wanted)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    int V = sl_model_config(m)->vocab_size;
    float *ref = reference_a(m);
    struct sl_worker *w = new_worker(m, 1);
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t *tables[1] = {table};
    int32_t ctx[1] = {20}, pos[20], seq[20] = {0}, rows[2] = {4, 19};
    for (int i = 0; i < 20; i++)
        pos[i] = i;
    float *logits = malloc((size_t)3 * V * sizeof(float));
    for (int i = 0; i < 3 * V; i++)
        logits[i] = -12345.0f;
    struct sl_batch b = {.n_tokens = 20,
                         .tokens = seq_a,
                         .pos = pos,
                         .seq = seq,
                         .n_seqs = 1,
                         .block_tables = tables,
                         .ctx_len = ctx,
                         .n_logits = 2,
                         .logit_rows = rows};
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_OK);
    assert_rows_close(logits, ref + (size_t)4 * V, V, "row 4");
    assert_rows_close(logits + V, ref + (size_t)19 * V, V, "row 19");
    cr_assert_eq(logits[2 * V], -12345.0f);
    sl_worker_free(w);
    free(logits);
    free(ref);
    sl_model_free(m);
}

Test(worker, forward_returns_einval_when_batch_is_out_of_range)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    struct sl_worker *w = new_worker(m, 1);
    float *logits = malloc((size_t)48 * 512 * sizeof(float));
    int32_t table[2] = {0, 1}, bad_table[2] = {0, NB};
    const int32_t *tables[1] = {table}, *bad_tables[1] = {bad_table};
    int32_t tokens[3] = {1, 5, 6}, pos[3] = {0, 1, 2}, seq[3] = {0, 0, 0}, ctx[1] = {3};
    int32_t rows[2] = {0, 2}, desc[2] = {2, 0}, big[50] = {0}, big_pos[50], big_seq[50] = {0};
    for (int i = 0; i < 50; i++)
        big_pos[i] = i;
    struct sl_batch ok = {.n_tokens = 3,
                          .tokens = tokens,
                          .pos = pos,
                          .seq = seq,
                          .n_seqs = 1,
                          .block_tables = tables,
                          .ctx_len = ctx,
                          .n_logits = 2,
                          .logit_rows = rows};
    cr_assert_eq(sl_worker_forward(w, &ok, logits), SL_OK);

    struct sl_batch b = ok;
    int32_t bad_tok[3] = {1, 512, 6};
    b.tokens = bad_tok;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "token == vocab");
    b = ok;
    bad_tok[1] = -1;
    b.tokens = bad_tok;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "negative token");
    b = ok;
    b.block_tables = bad_tables;
    ctx[0] = 5; /* needs the second block, which is out of the pool */
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "block id == n_kv_blocks");
    ctx[0] = 3;
    b = ok;
    int32_t bad_pos[3] = {0, 1, 3};
    b.pos = bad_pos;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "pos >= ctx_len");
    b = ok;
    b.logit_rows = desc;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "logit rows not ascending");
    b = ok;
    int32_t bad_seq[3] = {0, 1, 0};
    b.seq = bad_seq;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "seq >= n_seqs");
    b = ok;
    b.n_seqs = 5;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "n_seqs > max_seqs");
    b = ok;
    b.tokens = big;
    b.pos = big_pos;
    b.seq = big_seq;
    b.n_tokens = 49;
    int32_t big_ctx[1] = {49};
    int32_t big_table[13] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const int32_t *big_tables[1] = {big_table};
    b.ctx_len = big_ctx;
    b.block_tables = big_tables;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "n_tokens > max_batch_tokens");
    b = ok;
    int32_t long_ctx[1] = {513};
    b.ctx_len = long_ctx;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "ctx_len > seq_len");
    b = ok;
    b.n_tokens = 0;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "empty batch");
    sl_worker_free(w);
    free(logits);
    sl_model_free(m);
}
