/* The CUDA backend against the CPU backend: the real models' greedy goldens, logits of mixed
 * batches, batch invariance within rounding, typed weights, graph replay, and sampling on the
 * device against sl_sample_with_coin. Every test that needs a device skips with "no CUDA device:
 * …" when there is none; the bounds below are stated where they are used.
 *
 * Why bounds and not bits: cuBLAS picks its kernels (and so its order of summation) by shape,
 * and the attention kernels sum in another order than the CPU's, so a row's logits depend on
 * its batch within rounding, not bit for bit as on the CPU. */
#include "worker_test.h"

#include <cuda_runtime_api.h>
#include <math.h>

#define REQUIRE_CUDA()                                                                             \
    do {                                                                                           \
        char why_[256];                                                                            \
        if (sl_cuda_device_probe(0, NULL, why_, sizeof why_) != SL_OK)                             \
            cr_skip_test("%s", why_);                                                              \
    } while (0)

#define NB 64
#define BS 4

static struct sl_worker *new_worker(const struct sl_model *m, const struct sl_backend_ops *ops,
                                    bool eager)
{
    struct sl_backend_opts o = {.n_kv_blocks = NB,
                                .block_size = BS,
                                .max_batch_tokens = 48,
                                .max_seqs = 4,
                                .threads = 1,
                                .eager = eager};
    struct sl_worker *w = NULL;
    cr_assert_eq(sl_worker_new(m, ops, &o, &w), SL_OK, "%s worker", ops->name);
    return w;
}

/* Rows of logits equal within rel · (1 + |b|), and with the same argmax unless the top two of b
 * are within that bound of each other. */
static void assert_rows_close(const float *a, const float *b, int vocab, double rel,
                              const char *what, int row)
{
    for (int i = 0; i < vocab; i++)
        cr_assert(fabs((double)a[i] - b[i]) <= rel * (1.0 + fabs((double)b[i])),
                  "%s row %d: logit %d %.7g vs %.7g", what, row, i, a[i], b[i]);
    int32_t ia = wt_argmax(a, vocab), ib = wt_argmax(b, vocab);
    if (ia != ib)
        cr_assert(fabs((double)b[ia] - b[ib]) <= 2 * rel * (1.0 + fabs((double)b[ib])),
                  "%s row %d: argmax %d vs %d", what, row, ia, ib);
}

/* Logits of every position of wt_seq_a, prefilled in one chunk on ops. */
static float *reference_a(const struct sl_model *m, const struct sl_backend_ops *ops)
{
    struct sl_worker *w = new_worker(m, ops, true);
    float *logits = wt_prefill_seq_a(w, sl_model_config(m)->vocab_size);
    sl_worker_free(w);
    return logits;
}

/* ---------------------------------------------------------------------------------------------
 * Runs here: sizing needs no device
 */

Test(worker, cuda_kv_blocks_hold_the_compute_type_when_sized_before_init)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    cr_assert_eq(sl_cuda_backend_ops.kv_block_bytes(m, 16, SL_KV_F32),
                 sl_model_kv_block_bytes(m, 16, SL_KV_F32), "an F32 model keeps an F32 cache");
    sl_model_free(m);
    m = wt_load("synthetic:tiny:bf16", NULL);
    cr_assert_eq(2 * sl_cuda_backend_ops.kv_block_bytes(m, 16, SL_KV_F32),
                 sl_model_kv_block_bytes(m, 16, SL_KV_F32), "a BF16 model's cache is BF16");
    cr_assert_gt(sl_cuda_backend_mem_need(m, 512, 32), (size_t)512 << 20, "margin included");
    sl_model_free(m);
}

Test(worker, cuda_init_fails_cleanly_when_no_device_is_present)
{
    char why[256];
    if (sl_cuda_device_probe(0, NULL, why, sizeof why) == SL_OK)
        cr_skip_test("a CUDA device is present: nothing to check here");
    struct sl_model *m = wt_load("synthetic", NULL);
    struct sl_backend_opts o = {
        .n_kv_blocks = 8, .block_size = 4, .max_batch_tokens = 8, .max_seqs = 2};
    struct sl_worker *w = NULL;
    int st = sl_worker_new(m, &sl_cuda_backend_ops, &o, &w);
    cr_assert(st == SL_EBACKEND || st == SL_ENOMEM, "status %d", st);
    cr_assert_null(w);
    sl_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Goldens: the real models' greedy ids, through logits and through sampling on the device
 */

Test(worker, cuda_greedy_ids_match_llama2c_when_model_is_stories260k)
{
    REQUIRE_CUDA();
    wt_check_golden(&sl_cuda_backend_ops, false, "stories260K.bin", "tok512.bin",
                    "golden/stories260K.json", false, false);
    wt_check_golden(&sl_cuda_backend_ops, true, "stories260K.bin", "tok512.bin",
                    "golden/stories260K.json", true, false);
}

Test(worker, cuda_greedy_ids_match_llama2c_when_prompt_is_empty_for_200_steps)
{
    REQUIRE_CUDA();
    wt_check_golden(&sl_cuda_backend_ops, true, "stories260K.bin", "tok512.bin",
                    "golden/stories260K.testall.json", false, false);
}

Test(worker, cuda_greedy_ids_match_llama2c_when_model_is_tinystories656k)
{
    REQUIRE_CUDA();
    wt_check_golden(&sl_cuda_backend_ops, false, "tinystories-656K/llama2c/model.bin",
                    "tinystories-656K/llama2c/tokenizer.bin", "golden/tinystories-656K.json", true,
                    false);
    wt_check_golden(&sl_cuda_backend_ops, true, "tinystories-656K/hf", NULL,
                    "golden/tinystories-656K.json", true, true);
}

Test(worker, cuda_greedy_ids_match_llama2c_when_model_is_stories260k_gguf)
{
    REQUIRE_CUDA();
    wt_check_golden(&sl_cuda_backend_ops, true, "stories260K.gguf", NULL, "golden/stories260K.json",
                    true, true);
}

/* ---------------------------------------------------------------------------------------------
 * Logits against the CPU, and invariance over batches
 */

/* fp32 models: cuBLAS's fp32 GEMMs and the CPU's AVX2 kernels differ only in their order of
 * summation, ~1e-6 relative per product sum; through five layers the logits stay within 1e-3. */
#define F32_REL 1e-3

Test(worker, cuda_logits_match_cpu_when_prefill_and_decode_share_a_batch)
{
    REQUIRE_CUDA();
    struct sl_model *m = wt_load("synthetic", NULL);
    int V = sl_model_config(m)->vocab_size;
    float *cpu_ref = reference_a(m, &sl_cpu_backend_ops);
    float *ref = reference_a(m, &sl_cuda_backend_ops);
    for (int r = 0; r < 20; r++)
        assert_rows_close(ref + (size_t)r * V, cpu_ref + (size_t)r * V, V, F32_REL, "vs cpu", r);
    float *logits = malloc((size_t)48 * V * sizeof(float));

    /* test_forward.c's scenario on the CUDA worker: B prefills, then B decodes while A prefills
     * (one batch holding a decode row and a prefill chunk), then A's rest with B's decode. */
    struct sl_worker *w = new_worker(m, &sl_cuda_backend_ops, false);
    int32_t ta[8] = {9, 3, 17, 40, 22, 63, 5, 11}, tb[4] = {8, 33, 2, 50};
    const int32_t *tables[2] = {tb, ta};
    struct wt_step s = {0};
    int32_t ctx[2] = {6, 0};
    for (int i = 0; i < 6; i++)
        wt_step_add(&s, 0, wt_seq_b[i], i);
    wt_run_step(w, &s, 1, tables, ctx, logits);
    s.n = 0;
    wt_step_add(&s, 0, wt_seq_b[6], 6);
    for (int i = 0; i < 9; i++)
        wt_step_add(&s, 1, wt_seq_a[i], i);
    ctx[0] = 7;
    ctx[1] = 9;
    wt_run_step(w, &s, 2, tables, ctx, logits);
    for (int i = 0; i < 9; i++)
        assert_rows_close(logits + (size_t)(1 + i) * V, ref + (size_t)i * V, V, F32_REL,
                          "A chunk 1", i);
    float *b_dec = malloc((size_t)2 * V * sizeof(float));
    memcpy(b_dec, logits, (size_t)V * sizeof(float));
    s.n = 0;
    for (int i = 9; i < 20; i++)
        wt_step_add(&s, 1, wt_seq_a[i], i);
    wt_step_add(&s, 0, wt_seq_b[7], 7);
    ctx[0] = 8;
    ctx[1] = 20;
    wt_run_step(w, &s, 2, tables, ctx, logits);
    for (int i = 9; i < 20; i++)
        assert_rows_close(logits + (size_t)(i - 9) * V, ref + (size_t)i * V, V, F32_REL,
                          "A chunk 2", i);
    memcpy(b_dec + V, logits + (size_t)11 * V, (size_t)V * sizeof(float));
    sl_worker_free(w);

    /* B's decode rows equal B prefilled alone on the CPU. */
    w = new_worker(m, &sl_cpu_backend_ops, true);
    s.n = 0;
    for (int i = 0; i < 8; i++)
        wt_step_add(&s, 0, wt_seq_b[i], i);
    float *refb = malloc((size_t)8 * V * sizeof(float));
    ctx[0] = 8;
    wt_run_step(w, &s, 1, tables, ctx, refb);
    assert_rows_close(b_dec, refb + (size_t)6 * V, V, F32_REL, "B decode", 6);
    assert_rows_close(b_dec + V, refb + (size_t)7 * V, V, F32_REL, "B decode", 7);
    sl_worker_free(w);
    free(refb);
    free(b_dec);
    free(logits);
    free(ref);
    free(cpu_ref);
    sl_model_free(m);
}

/* The same sequence's rows, whether prefilled in one chunk, in chunks, or decoded one by one:
 * equal within rounding (cuBLAS's kernel for 1 row is not its kernel for 20). */
Test(worker, cuda_rows_agree_within_rounding_when_prefill_is_chunked_or_decoded_one_by_one)
{
    REQUIRE_CUDA();
    struct sl_model *m = wt_load("synthetic", NULL);
    int V = sl_model_config(m)->vocab_size;
    float *ref = reference_a(m, &sl_cuda_backend_ops);
    float *logits = malloc((size_t)48 * V * sizeof(float));
    int32_t table[8] = {7, 6, 5, 4, 3, 2, 1, 0};
    const int32_t *tables[1] = {table};
    int32_t ctx[1];
    struct sl_worker *w = new_worker(m, &sl_cuda_backend_ops, false);
    int chunks[] = {0, 7, 14, 20};
    for (int c = 0; c < 3; c++) {
        struct wt_step s = {0};
        for (int i = chunks[c]; i < chunks[c + 1]; i++)
            wt_step_add(&s, 0, wt_seq_a[i], i);
        ctx[0] = chunks[c + 1];
        wt_run_step(w, &s, 1, tables, ctx, logits);
        for (int i = chunks[c]; i < chunks[c + 1]; i++)
            assert_rows_close(logits + (size_t)(i - chunks[c]) * V, ref + (size_t)i * V, V, 1e-4,
                              "chunked", i);
    }
    sl_worker_free(w);
    w = new_worker(m, &sl_cuda_backend_ops, false);
    for (int i = 0; i < 20; i++) {
        struct wt_step s = {0};
        wt_step_add(&s, 0, wt_seq_a[i], i);
        ctx[0] = i + 1;
        wt_run_step(w, &s, 1, tables, ctx, logits);
        assert_rows_close(logits, ref + (size_t)i * V, V, 1e-4, "one by one", i);
    }
    sl_worker_free(w);
    free(logits);
    free(ref);
    sl_model_free(m);
}

/* The prefix cache's use of a backend: two sequences whose block tables share the four blocks
 * that hold wt_seq_a's first 16 positions (written once, by a third sequence) compute its last 4
 * in one batch, each into blocks of its own, reading the shared ones. Their rows equal the
 * reference's within rel (0: bit for bit). The CPU's case is tests/sched/test_engine.c's,
 * over the real models. */
static void shared_prefix_rows(const struct sl_backend_ops *ops, double rel)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    int V = sl_model_config(m)->vocab_size;
    float *ref = reference_a(m, ops);
    float *logits = malloc((size_t)48 * V * sizeof(float));
    struct sl_worker *w = new_worker(m, ops, true);
    int32_t owner[4] = {20, 21, 22, 23}, t1[5] = {20, 21, 22, 23, 30}, t2[5] = {20, 21, 22, 23, 40};
    const int32_t *tables[2] = {owner, NULL};
    int32_t ctx[2] = {16, 0};
    struct wt_step s = {0};
    for (int i = 0; i < 16; i++)
        wt_step_add(&s, 0, wt_seq_a[i], i);
    wt_run_step(w, &s, 1, tables, ctx, logits);
    tables[0] = t1;
    tables[1] = t2;
    ctx[0] = ctx[1] = 20;
    s = (struct wt_step){0};
    for (int q = 0; q < 2; q++)
        for (int i = 16; i < 20; i++)
            wt_step_add(&s, q, wt_seq_a[i], i);
    wt_run_step(w, &s, 2, tables, ctx, logits);
    for (int q = 0; q < 2; q++)
        for (int i = 16; i < 20; i++) {
            const float *row = logits + (size_t)(q * 4 + i - 16) * V, *want = ref + (size_t)i * V;
            if (rel == 0)
                cr_assert_arr_eq(row, want, sizeof(float) * (size_t)V, "%s: seq %d row %d",
                                 ops->name, q, i);
            else
                assert_rows_close(row, want, V, rel, "shared prefix", i);
        }
    sl_worker_free(w);
    free(logits);
    free(ref);
    sl_model_free(m);
}

Test(worker, cuda_rows_agree_within_rounding_when_sequences_share_prefix_blocks)
{
    REQUIRE_CUDA();
    shared_prefix_rows(&sl_cuda_backend_ops, 1e-4);
}

/* Decode steps of one shape: the first runs eagerly, the second is captured as a graph, the
 * rest replay it. Each equals an eager worker's step: a replay is the same kernels on new data
 * (1e-5 leaves room for cuBLAS choosing another algorithm under capture, nothing more). */
Test(worker, cuda_graph_replays_equal_eager_steps_when_decode_shape_repeats)
{
    REQUIRE_CUDA();
    struct sl_model *m = wt_load("synthetic:stories15M", NULL);
    int V = sl_model_config(m)->vocab_size;
    struct sl_worker *wg = new_worker(m, &sl_cuda_backend_ops, false);
    struct sl_worker *we = new_worker(m, &sl_cuda_backend_ops, true);
    int32_t t0[8] = {0, 1, 2, 3, 4, 5, 6, 7}, t1[8] = {8, 9, 10, 11, 12, 13, 14, 15};
    int32_t t2[8] = {16, 17, 18, 19, 20, 21, 22, 23};
    const int32_t *tables[3] = {t0, t1, t2};
    float *lg = malloc((size_t)3 * V * sizeof(float)), *le = malloc((size_t)3 * V * sizeof(float));
    /* Prompts of 3, 5 and 7 tokens, in one prefill step. */
    struct wt_step s = {0};
    int32_t ctx[3] = {3, 5, 7}, next[3];
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < ctx[q]; i++)
            wt_step_add(&s, q, wt_seq_a[i + q] * 37, i);
    float *pre = malloc((size_t)s.n * V * sizeof(float));
    wt_run_step(wg, &s, 3, tables, ctx, pre);
    wt_run_step(we, &s, 3, tables, ctx, pre);
    for (int q = 0; q < 3; q++)
        next[q] = wt_seq_b[q];
    for (int k = 0; k < 6; k++) {
        s.n = 0;
        for (int q = 0; q < 3; q++) {
            wt_step_add(&s, q, next[q], ctx[q]);
            ctx[q]++;
        }
        wt_run_step(wg, &s, 3, tables, ctx, lg);
        wt_run_step(we, &s, 3, tables, ctx, le);
        for (int q = 0; q < 3; q++) {
            assert_rows_close(lg + (size_t)q * V, le + (size_t)q * V, V, 1e-5, "graph step", k);
            next[q] = wt_argmax(le + (size_t)q * V, V);
        }
    }
    sl_worker_free(wg);
    sl_worker_free(we);
    free(pre);
    free(lg);
    free(le);
    sl_model_free(m);
}

/* Typed weights on the device: the GEMM inputs are rounded to the weights' type too (the CPU
 * keeps fp32 activations), so the bounds are wider than test_forward.c's typed ones. They are
 * estimates from the rounding units (2^-11 F16, 2^-8 BF16) through six layers, not measurements:
 * the first run on a device should confirm or tighten them. */
Test(worker, cuda_logits_match_cpu_when_weights_are_f16_bf16_or_q8_0)
{
    REQUIRE_CUDA();
    const struct {
        const char *spec;
        double max_rel;
    } cases[] = {{"synthetic:stories15M:f16", 0.02},
                 {"synthetic:stories15M:bf16", 0.15},
                 {"synthetic:stories15M:q8_0", 0.03}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct sl_model *m = wt_load(cases[c].spec, NULL);
        int V = sl_model_config(m)->vocab_size;
        int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        const int32_t *tables[1] = {table};
        int32_t ctx[1] = {12};
        struct wt_step s = {0};
        for (int i = 0; i < 12; i++)
            wt_step_add(&s, 0, wt_seq_a[i] * 37, i);
        float *lc = malloc((size_t)12 * V * sizeof(float)), *lg = malloc((size_t)12 * V * 4);
        struct sl_worker *w = new_worker(m, &sl_cpu_backend_ops, true);
        wt_run_step(w, &s, 1, tables, ctx, lc);
        sl_worker_free(w);
        w = new_worker(m, &sl_cuda_backend_ops, false);
        wt_run_step(w, &s, 1, tables, ctx, lg);
        sl_worker_free(w);
        double sum = 0, sq = 0, maxd = 0;
        int agree = 0;
        for (int r = 0; r < 12; r++) {
            for (int i = 0; i < V; i++) {
                size_t k = (size_t)r * V + i;
                sum += lc[k];
                sq += (double)lc[k] * lc[k];
                maxd = fmax(maxd, fabs((double)lg[k] - lc[k]));
            }
            agree += wt_argmax(lg + (size_t)r * V, V) == wt_argmax(lc + (size_t)r * V, V);
        }
        double n = 12.0 * V, sd = sqrt(sq / n - (sum / n) * (sum / n));
        cr_log_info("%s on cuda: max |logit diff| = %.4f sd, argmax agrees on %d of 12 rows",
                    cases[c].spec, maxd / sd, agree);
        cr_assert(maxd / sd < cases[c].max_rel, "%s: max logit error %.4f sd", cases[c].spec,
                  maxd / sd);
        cr_assert(agree >= 10, "%s: argmax agrees on %d of 12 rows", cases[c].spec, agree);
        free(lc);
        free(lg);
        sl_model_free(m);
    }
}

Test(worker, cuda_forward_returns_einval_when_batch_is_out_of_range)
{
    REQUIRE_CUDA();
    struct sl_model *m = wt_load("synthetic", NULL);
    struct sl_worker *w = new_worker(m, &sl_cuda_backend_ops, false);
    float *logits = malloc((size_t)48 * 512 * sizeof(float));
    int32_t table[2] = {0, 1}, bad_table[2] = {0, NB};
    const int32_t *tables[1] = {table}, *bad_tables[1] = {bad_table};
    struct wt_step s = {0};
    wt_step_add(&s, 0, 1, 0);
    wt_step_add(&s, 0, 5, 1);
    wt_step_add(&s, 0, 6, 2);
    int32_t ctx[1] = {3};
    struct sl_batch ok = wt_batch_of(&s, 1, tables, ctx);
    cr_assert_eq(sl_worker_forward(w, &ok, logits), SL_OK);
    struct sl_batch b = ok;
    int32_t bad_tok[3] = {1, 512, 6};
    b.tokens = bad_tok;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "token == vocab");
    b = ok;
    b.block_tables = bad_tables;
    ctx[0] = 5;
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_EINVAL, "block id == n_kv_blocks");
    ctx[0] = 3;
    /* forward_sample takes at most max_seqs (4) sampled rows. */
    struct sl_sample_row rows[5] = {{{.temperature = 0, .top_p = 1}, 0}};
    int32_t ids[5];
    struct wt_step big = {0};
    for (int i = 0; i < 5; i++)
        wt_step_add(&big, 0, 7, i);
    int32_t big_ctx[1] = {5};
    struct sl_batch bb = wt_batch_of(&big, 1, tables, big_ctx);
    cr_assert_eq(sl_worker_forward_sample(w, &bb, rows, ids), SL_EINVAL);
    /* The worker still works after refusing. */
    cr_assert_eq(sl_worker_forward(w, &ok, logits), SL_OK);
    sl_worker_free(w);
    free(logits);
    sl_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Sampling on the device
 */

static uint64_t rs = 77;
static float frand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 16777216.0));
}

struct cand {
    double p;
    int32_t id;
};

static int cand_order(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Where token `id` lies in the draw sl_sample_with_coin makes, in exact arithmetic: the
 * probability mass [*lo, *hi) it covers in the order tokens are drawn (id order without filters;
 * by probability, then id, among the candidates with them) and the point *r the coin selects.
 * False when id is not among the tokens drawn from. */
static bool draw_position(const float *logits, int V, const struct sl_sampling *p, float coin,
                          int32_t id, double *lo, double *hi, double *r)
{
    struct cand *c = malloc((size_t)V * sizeof *c);
    double max = -INFINITY, sum = 0, pmax = 0;
    for (int i = 0; i < V; i++)
        max = fmax(max, (double)(logits[i] / p->temperature));
    for (int i = 0; i < V; i++) {
        c[i] = (struct cand){exp((double)(logits[i] / p->temperature) - max), i};
        sum += c[i].p;
    }
    for (int i = 0; i < V; i++)
        pmax = fmax(pmax, c[i].p /= sum);
    bool found = false;
    if (!(p->top_p < 1.0f || p->top_k > 0 || p->min_p > 0.0f)) {
        double acc = 0;
        for (int i = 0; i < V; i++) {
            if (i == id) {
                *lo = acc;
                *hi = acc + c[i].p;
                found = true;
            }
            acc += c[i].p;
        }
        *r = coin * acc;
        free(c);
        return found;
    }
    double cutoff = p->min_p > 0 ? p->min_p * pmax : 0;
    if (p->top_p < 1.0f && p->top_k <= 0 && cutoff == 0 && V > 1)
        cutoff = (1.0 - p->top_p) / (V - 1);
    int k = 0;
    for (int i = 0; i < V; i++)
        if (c[i].p >= cutoff && c[i].p > 0)
            c[k++] = c[i];
    qsort(c, (size_t)k, sizeof *c, cand_order);
    int keep = p->top_k > 0 && p->top_k < k ? p->top_k : k, taken = keep;
    double mass = 0, acc = 0;
    for (int i = 0; i < keep; i++)
        mass += c[i].p;
    if (p->top_p < 1.0f)
        for (taken = 0; taken < keep && !(acc > p->top_p * mass);)
            acc += c[taken++].p;
    /* One more candidate than the exact cut: a rounded sum may take it. */
    int reach = taken < k ? taken + 1 : taken;
    acc = 0;
    for (int i = 0; i < reach; i++) {
        if (c[i].id == id) {
            *lo = acc;
            *hi = acc + c[i].p;
            found = true;
        }
        acc += c[i].p;
        if (i == taken - 1)
            *r = coin * acc;
    }
    free(c);
    return found;
}

/* The kernel against sl_sample_with_coin on the same logits and coins. Greedy rows must agree.
 * Others may differ only where the coin falls within rounding of a boundary between two tokens:
 * both sides sum the probabilities in fp32 in different orders, and over a flat distribution of
 * 128K tokens (each ~1e-5) that rounding is comparable to one token's mass, so neighbours in the
 * draw order are often swapped. A disagreement must therefore be a token whose exact interval
 * lies within 2e-4 of the point the coin selects; a wrong filter or order lands far away. */
Test(worker, cuda_sampler_picks_what_sl_sample_picks_when_parameters_vary)
{
    REQUIRE_CUDA();
    const struct sl_sampling ps[] = {
        {.temperature = 0.0f, .top_p = 1.0f},
        {.temperature = 1.0f, .top_p = 1.0f, .top_k = 1},
        {.temperature = 1.0f, .top_p = 0.0f},
        {.temperature = 0.7f, .top_p = 1.0f},
        {.temperature = 1.0f, .top_p = 0.9f},
        {.temperature = 1.3f, .top_p = 1.0f, .top_k = 40},
        {.temperature = 1.0f, .top_p = 0.5f, .top_k = 5},
        {.temperature = 0.9f, .top_p = 1.0f, .min_p = 0.05f},
        {.temperature = 1.1f, .top_p = 0.95f, .top_k = 100, .min_p = 0.01f},
    };
    const int vocabs[] = {2, 517, 32000, 128256};
    enum { ROWS = 24 };
    int mismatches = 0, total = 0;
    cudaStream_t st;
    cr_assert_eq(cudaStreamCreate(&st), cudaSuccess);
    for (int vi = 0; vi < 4; vi++) {
        int V = vocabs[vi];
        size_t ws_bytes = sl_cuda_sample_ws_bytes(ROWS, V);
        cr_assert_gt(ws_bytes, 0);
        void *ws = NULL, *d_rows = NULL;
        float *d_logits = NULL;
        int32_t *d_ids = NULL;
        cr_assert_eq(cudaMalloc(&ws, ws_bytes), cudaSuccess);
        cr_assert_eq(cudaMalloc((void **)&d_logits, (size_t)ROWS * V * 4), cudaSuccess);
        cr_assert_eq(cudaMalloc((void **)&d_ids, ROWS * 4), cudaSuccess);
        cr_assert_eq(cudaMalloc(&d_rows, ROWS * sizeof(struct sl_cuda_sample_row)), cudaSuccess);
        float *logits = malloc((size_t)ROWS * V * 4), *work = malloc((size_t)V * 4);
        void *scratch = malloc(sl_sample_scratch_size(V));
        for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
            struct sl_cuda_sample_row rows[ROWS];
            bool filtered = false;
            for (int r = 0; r < ROWS; r++) {
                /* Peaked rows (a few large logits) and flat ones, and exact ties. */
                float spread = r % 3 == 0 ? 12.0f : r % 3 == 1 ? 3.0f : 0.5f;
                for (int i = 0; i < V; i++)
                    logits[(size_t)r * V + i] = (frand() - 0.5f) * spread;
                if (r % 4 == 0 && V > 8)
                    logits[(size_t)r * V + 5] = logits[(size_t)r * V + 3] = 50.0f;
                rows[r] = (struct sl_cuda_sample_row){
                    ps[pi].temperature, ps[pi].top_p, ps[pi].min_p, frand(), ps[pi].top_k, 0};
            }
            filtered = ps[pi].temperature > 0 && ps[pi].top_p > 0 && ps[pi].top_k != 1 &&
                       (ps[pi].top_p < 1 || ps[pi].top_k > 0 || ps[pi].min_p > 0);
            cr_assert_eq(cudaMemcpy(d_logits, logits, (size_t)ROWS * V * 4, cudaMemcpyHostToDevice),
                         cudaSuccess);
            cr_assert_eq(cudaMemcpy(d_rows, rows, sizeof rows, cudaMemcpyHostToDevice),
                         cudaSuccess);
            cr_assert_eq(
                sl_cuda_sample(d_ids, d_logits, ROWS, V, d_rows, filtered, ws, ws_bytes, st), SL_OK,
                "%s", sl_cuda_last_error());
            int32_t ids[ROWS];
            cr_assert_eq(cudaStreamSynchronize(st), cudaSuccess);
            cr_assert_eq(cudaMemcpy(ids, d_ids, sizeof ids, cudaMemcpyDeviceToHost), cudaSuccess);
            bool greedy = !(ps[pi].temperature > 0) || !(ps[pi].top_p > 0) || ps[pi].top_k == 1;
            for (int r = 0; r < ROWS; r++) {
                memcpy(work, logits + (size_t)r * V, (size_t)V * 4);
                int32_t want = sl_sample_with_coin(work, V, &ps[pi], rows[r].coin, scratch);
                total++;
                if (ids[r] != want) {
                    double lo = 0, hi = 0, at = 0;
                    bool in = draw_position(logits + (size_t)r * V, V, &ps[pi], rows[r].coin,
                                            ids[r], &lo, &hi, &at);
                    cr_log_info("vocab %d params %zu row %d: device %d, cpu %d; the device's "
                                "token covers [%.7f, %.7f), the coin selects %.7f",
                                V, pi, r, ids[r], want, lo, hi, at);
                    cr_assert(!greedy, "greedy rows must agree");
                    cr_assert(in && lo - 2e-4 <= at && at <= hi + 2e-4,
                              "vocab %d params %zu row %d: device picked %d, far from the draw", V,
                              pi, r, ids[r]);
                    mismatches++;
                }
            }
        }
        cudaFree(ws);
        cudaFree(d_logits);
        cudaFree(d_ids);
        cudaFree(d_rows);
        free(logits);
        free(work);
        free(scratch);
    }
    cudaStreamDestroy(st);
    cr_log_info("device sampler: %d of %d picks are a neighbour of sl_sample_with_coin's",
                mismatches, total);
}

/* Through the worker: forward_sample's ids are sl_sample_with_coin's picks from the logits the
 * same batch gives through forward (the forward is deterministic on one device). */
Test(worker, cuda_forward_sample_picks_from_forward_logits_when_rows_sample)
{
    REQUIRE_CUDA();
    struct sl_model *m = wt_load("synthetic:stories15M", NULL);
    int V = sl_model_config(m)->vocab_size;
    struct sl_worker *w = new_worker(m, &sl_cuda_backend_ops, true);
    int32_t t0[8] = {0, 1, 2, 3, 4, 5, 6, 7}, t1[8] = {8, 9, 10, 11, 12, 13, 14, 15};
    const int32_t *tables[2] = {t0, t1};
    struct wt_step s = {0};
    for (int i = 0; i < 6; i++)
        wt_step_add(&s, 0, wt_seq_a[i] * 37, i);
    for (int i = 0; i < 4; i++)
        wt_step_add(&s, 1, wt_seq_b[i] * 37, i);
    int32_t ctx[2] = {6, 4}, rows_idx[2] = {5, 9};
    struct sl_batch b = wt_batch_of(&s, 2, tables, ctx);
    b.n_logits = 2;
    b.logit_rows = rows_idx;
    float *logits = malloc((size_t)2 * V * 4);
    void *scratch = malloc(sl_sample_scratch_size(V));
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_OK);
    const struct sl_sampling ps[] = {{.temperature = 0.0f, .top_p = 1.0f},
                                     {.temperature = 0.8f, .top_p = 0.9f},
                                     {.temperature = 1.0f, .top_p = 1.0f, .top_k = 50}};
    for (size_t pi = 0; pi < 3; pi++)
        for (int k = 0; k < 8; k++) {
            struct sl_sample_row rows[2] = {{ps[pi], (float)k / 8.0f + 0.03f},
                                            {ps[pi], (float)(7 - k) / 8.0f + 0.01f}};
            int32_t ids[2];
            cr_assert_eq(sl_worker_forward_sample(w, &b, rows, ids), SL_OK);
            for (int i = 0; i < 2; i++) {
                float *work = malloc((size_t)V * 4);
                memcpy(work, logits + (size_t)i * V, (size_t)V * 4);
                int32_t want = sl_sample_with_coin(work, V, &rows[i].p, rows[i].coin, scratch);
                cr_assert_eq(ids[i], want, "params %zu coin %d row %d", pi, k, i);
                free(work);
            }
        }
    sl_worker_free(w);
    free(logits);
    free(scratch);
    sl_model_free(m);
}
