#include "worker_test.h"

#include <math.h>

/* ---------------------------------------------------------------------------------------------
 * Forward over batches.
 */

#define NB 64 /* KV blocks in the pool */
#define BS 4  /* small blocks, so sequences span many of them */

/* How new_worker's workers store K and V; the f16 tests set it before they start. Likewise
 * whether quantized weights take the exact fp32 matmul (the default: 8-bit activations). */
static enum sl_kv_dtype kv_dtype = SL_KV_F32;
static bool float_act = false;

static struct sl_worker *new_worker(const struct sl_model *m, int threads)
{
    struct sl_backend_opts o = {.n_kv_blocks = NB,
                                .block_size = BS,
                                .max_batch_tokens = 48,
                                .max_seqs = 4,
                                .threads = threads,
                                .kv_dtype = kv_dtype,
                                .float_activations = float_act};
    struct sl_worker *w = NULL;
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w), SL_OK);
    return w;
}

const int32_t wt_seq_a[20] = {1,   300, 301, 302, 400, 17,  500, 260, 270, 280,
                              290, 310, 320, 330, 340, 350, 360, 370, 380, 390};
const int32_t wt_seq_b[10] = {1, 450, 451, 452, 453, 454, 455, 456, 457, 458};

static void assert_rows_close(const float *a, const float *b, int vocab, const char *what)
{
    for (int i = 0; i < vocab; i++)
        cr_assert(fabsf(a[i] - b[i]) <= 1e-4f * (1.0f + fabsf(b[i])), "%s: logit %d %g vs %g", what,
                  i, a[i], b[i]);
}

/* Logits of every position of wt_seq_a, prefilled alone in one chunk. */
static float *reference_a(const struct sl_model *m)
{
    struct sl_worker *w = new_worker(m, 1);
    float *logits = wt_prefill_seq_a(w, sl_model_config(m)->vocab_size);
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

static void shares_batch(void)
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
    struct wt_step s = {0};
    int32_t ctx[2] = {6, 0};
    for (int i = 0; i < 6; i++)
        wt_step_add(&s, 0, wt_seq_b[i], i);
    wt_run_step(w, &s, 1, tables, ctx, logits);
    /* Step 2: B decodes one token and A prefills its first 9 in the same batch. */
    s.n = 0;
    wt_step_add(&s, 0, wt_seq_b[6], 6);
    for (int i = 0; i < 9; i++)
        wt_step_add(&s, 1, wt_seq_a[i], i);
    ctx[0] = 7;
    ctx[1] = 9;
    wt_run_step(w, &s, 2, tables, ctx, logits);
    for (int i = 0; i < 9; i++)
        assert_rows_close(logits + (size_t)(1 + i) * V, ref + (size_t)i * V, V, "A chunk 1");
    float *b_dec = malloc((size_t)2 * V * sizeof(float));
    memcpy(b_dec, logits, (size_t)V * sizeof(float));
    /* Step 3: A's remaining prefill first, then B's decode after it. */
    s.n = 0;
    for (int i = 9; i < 20; i++)
        wt_step_add(&s, 1, wt_seq_a[i], i);
    wt_step_add(&s, 0, wt_seq_b[7], 7);
    ctx[0] = 8;
    ctx[1] = 20;
    wt_run_step(w, &s, 2, tables, ctx, logits);
    for (int i = 9; i < 20; i++)
        assert_rows_close(logits + (size_t)(i - 9) * V, ref + (size_t)i * V, V, "A chunk 2");
    memcpy(b_dec + V, logits + (size_t)11 * V, (size_t)V * sizeof(float));
    sl_worker_free(w);

    /* B's decode rows equal B prefilled alone. */
    w = new_worker(m, 1);
    s.n = 0;
    for (int i = 0; i < 8; i++)
        wt_step_add(&s, 0, wt_seq_b[i], i);
    float *refb = malloc((size_t)8 * V * sizeof(float));
    ctx[0] = 8;
    wt_run_step(w, &s, 1, tables, ctx, refb);
    assert_rows_close(b_dec, refb + (size_t)6 * V, V, "B decode 6");
    assert_rows_close(b_dec + V, refb + (size_t)7 * V, V, "B decode 7");
    sl_worker_free(w);
    free(refb);
    free(b_dec);
    free(logits);
    free(ref);
    sl_model_free(m);
}

Test(worker, logits_match_when_sequence_shares_batch_with_prefill_and_decode)
{
    shares_batch();
}

static void chunked(void)
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
        struct wt_step s = {0};
        for (int i = chunks[c]; i < chunks[c + 1]; i++)
            wt_step_add(&s, 0, wt_seq_a[i], i);
        ctx[0] = chunks[c + 1];
        wt_run_step(w, &s, 1, tables, ctx, logits);
        for (int i = chunks[c]; i < chunks[c + 1]; i++)
            assert_rows_close(logits + (size_t)(i - chunks[c]) * V, ref + (size_t)i * V, V,
                              "chunked");
    }
    sl_worker_free(w);

    w = new_worker(m, 1);
    for (int i = 0; i < 20; i++) {
        struct wt_step s = {0};
        wt_step_add(&s, 0, wt_seq_a[i], i);
        ctx[0] = i + 1;
        wt_run_step(w, &s, 1, tables, ctx, logits);
        assert_rows_close(logits, ref + (size_t)i * V, V, "one by one");
    }
    sl_worker_free(w);
    free(logits);
    free(ref);
    sl_model_free(m);
}

Test(worker, logits_match_when_prefill_is_chunked_or_decoded_one_by_one)
{
    chunked();
}

/* With K and V stored as fp16 a row's logits still do not depend on its batch, its chunking or
 * its block ids: every value is rounded once, when written, the same way whatever the step. */
Test(worker, logits_match_when_kv_is_f16_and_batches_mix_or_prefill_is_chunked)
{
    kv_dtype = SL_KV_F16;
    shares_batch();
    chunked();
}

/* fp16 K and V move the logits by rounding only: close to fp32's, and not equal to them (the
 * store is really fp16), with half the bytes per block. */
Test(worker, logits_stay_close_to_f32_when_kv_is_f16)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    int V = sl_model_config(m)->vocab_size;
    float *ref = reference_a(m);
    kv_dtype = SL_KV_F16;
    float *half = reference_a(m);
    double worst = 0;
    for (size_t i = 0; i < (size_t)20 * V; i++) {
        double d = fabs((double)half[i] - ref[i]) / (1.0 + fabs((double)ref[i]));
        worst = d > worst ? d : worst;
    }
    cr_assert(worst > 0, "fp16 K and V gave the fp32 logits exactly");
    cr_assert(worst < 1e-2, "fp16 K and V moved a logit by %g (relative)", worst);
    struct sl_worker *w32 = NULL, *w16 = NULL;
    struct sl_backend_opts o = {
        .n_kv_blocks = NB, .block_size = BS, .max_batch_tokens = 48, .max_seqs = 4, .threads = 1};
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w32), SL_OK);
    o.kv_dtype = SL_KV_F16;
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w16), SL_OK);
    cr_assert_eq(2 * sl_worker_kv_bytes(w16), sl_worker_kv_bytes(w32));
    cr_assert_eq(sl_model_kv_block_bytes(m, BS, SL_KV_F16) * NB, sl_worker_kv_bytes(w16));
    sl_worker_free(w32);
    sl_worker_free(w16);
    free(half);
    free(ref);
    sl_model_free(m);
}

/* The last layer runs its attention, output projection and FFN only for the rows that sample,
 * gathered to the front: a chunk with no sampled row stops after that layer's K and V, and a
 * sampled row's logits are the bits it gets when every row samples, wherever it sits in a mixed
 * batch. */
Test(worker, logits_are_bitwise_equal_when_only_some_rows_sample)
{
    for (kv_dtype = SL_KV_F32; kv_dtype <= SL_KV_F16; kv_dtype++)
        for (int threads = 1; threads <= 2; threads++) {
            struct sl_model *m = wt_load("synthetic", NULL);
            int V = sl_model_config(m)->vocab_size;
            float *ref = reference_a(m);
            float *refb = malloc((size_t)6 * V * sizeof(float));
            float *logits = malloc((size_t)48 * V * sizeof(float));
            int32_t ta[8] = {9, 3, 17, 40, 22, 63, 5, 11}, tb[4] = {8, 33, 2, 50};
            const int32_t *tables[2] = {ta, tb};
            struct wt_step s = {0};
            int32_t ctx[2] = {6, 0};
            struct sl_worker *w = new_worker(m, threads);
            for (int i = 0; i < 6; i++)
                wt_step_add(&s, 0, wt_seq_b[i], i);
            wt_run_step(w, &s, 1, (const int32_t *const[]){tb}, ctx, refb); /* B alone */
            sl_worker_free(w);

            w = new_worker(m, threads);
            /* Step 1: A's first 9 rows, none sampled. */
            s.n = 0;
            for (int i = 0; i < 9; i++)
                wt_step_add(&s, 0, wt_seq_a[i], i);
            struct sl_batch b = wt_batch_of(&s, 1, tables, (int32_t[]){9});
            b.n_logits = 0;
            cr_assert_eq(sl_worker_forward(w, &b, NULL), SL_OK);
            /* Step 2: A's other 11 rows, then B's 6, rows 3, 10 and 16 of 17 sampled. */
            s.n = 0;
            for (int i = 9; i < 20; i++)
                wt_step_add(&s, 0, wt_seq_a[i], i);
            for (int i = 0; i < 6; i++)
                wt_step_add(&s, 1, wt_seq_b[i], i);
            ctx[0] = 20;
            ctx[1] = 6;
            b = wt_batch_of(&s, 2, tables, ctx);
            int32_t rows[3] = {3, 10, 16};
            b.n_logits = 3;
            b.logit_rows = rows;
            cr_assert_eq(sl_worker_forward(w, &b, logits), SL_OK);
            const char *kv = sl_kv_dtype_name(kv_dtype);
            cr_assert(memcmp(logits, ref + (size_t)12 * V, (size_t)V * sizeof(float)) == 0,
                      "%s KV, %d threads: A's position 12 differs", kv, threads);
            cr_assert(memcmp(logits + V, ref + (size_t)19 * V, (size_t)V * sizeof(float)) == 0,
                      "%s KV, %d threads: A's position 19 differs", kv, threads);
            cr_assert(memcmp(logits + (size_t)2 * V, refb + (size_t)5 * V,
                             (size_t)V * sizeof(float)) == 0,
                      "%s KV, %d threads: B's position 5 differs", kv, threads);
            sl_worker_free(w);
            free(logits);
            free(refb);
            free(ref);
            sl_model_free(m);
        }
}

/* A prefill chunk's rows attend in groups that share K and V reads, the grouped-query heads of a
 * KV head together ("synthetic" has 8 query heads over 4 KV heads); each query must still get
 * the bits it gets alone, so a whole-prompt prefill equals a one-token-at-a-time decode exactly. */
Test(worker, logits_are_bitwise_equal_when_rows_attend_in_groups_or_alone)
{
    for (kv_dtype = SL_KV_F32; kv_dtype <= SL_KV_F16; kv_dtype++) {
        struct sl_model *m = wt_load("synthetic", NULL);
        int V = sl_model_config(m)->vocab_size;
        float *ref = reference_a(m);
        float *logits = malloc((size_t)V * sizeof(float));
        int32_t table[8] = {3, 1, 4, 0, 5, 2, 7, 6};
        const int32_t *tables[1] = {table};
        int32_t ctx[1];
        struct sl_worker *w = new_worker(m, 2);
        for (int i = 0; i < 20; i++) {
            struct wt_step s = {0};
            wt_step_add(&s, 0, wt_seq_a[i], i);
            ctx[0] = i + 1;
            wt_run_step(w, &s, 1, tables, ctx, logits);
            cr_assert(memcmp(logits, ref + (size_t)i * V, (size_t)V * sizeof(float)) == 0,
                      "%s KV: position %d differs from the grouped prefill",
                      sl_kv_dtype_name(kv_dtype), i);
        }
        sl_worker_free(w);
        free(logits);
        free(ref);
        sl_model_free(m);
    }
}

Test(worker, logits_are_bitwise_equal_when_thread_count_changes)
{
    struct sl_model *m = wt_load("synthetic:stories15M", NULL);
    int V = sl_model_config(m)->vocab_size;
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t *tables[1] = {table};
    int32_t ctx[1] = {12};
    struct wt_step s = {0};
    for (int i = 0; i < 12; i++)
        wt_step_add(&s, 0, wt_seq_a[i] * 37, i);
    float *l1 = malloc((size_t)12 * V * sizeof(float)),
          *l4 = malloc((size_t)12 * V * sizeof(float));
    struct sl_worker *w = new_worker(m, 1);
    wt_run_step(w, &s, 1, tables, ctx, l1);
    sl_worker_free(w);
    w = new_worker(m, 4);
    wt_run_step(w, &s, 1, tables, ctx, l4);
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
                         .tokens = wt_seq_a,
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

/* ---------------------------------------------------------------------------------------------
 * Typed weights: the same synthetic model stored as f16, bf16 or q8_0 (its fp32 values rounded)
 * gives nearly the fp32 model's logits.
 */

/* Logits of 12 prompt positions of a stories15M-shaped model given by spec. */
static float *typed_logits(const char *spec, int threads)
{
    struct sl_model *m = wt_load(spec, NULL);
    int V = sl_model_config(m)->vocab_size;
    struct sl_worker *w = new_worker(m, threads);
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t *tables[1] = {table};
    int32_t ctx[1] = {12};
    struct wt_step s = {0};
    for (int i = 0; i < 12; i++)
        wt_step_add(&s, 0, wt_seq_a[i] * 37 % V, i);
    float *l = malloc((size_t)12 * V * sizeof(float));
    wt_run_step(w, &s, 1, tables, ctx, l);
    sl_worker_free(w);
    sl_model_free(m);
    return l;
}

/* Largest |a - b| over all logits, in units of the reference logits' standard deviation, and
 * the fraction of rows whose argmax agrees. */
static void compare_logits(const float *a, const float *ref, int rows, int V, double *err,
                           double *agree)
{
    double sum = 0, sq = 0, maxd = 0;
    int same = 0;
    for (int r = 0; r < rows; r++) {
        int ia = 0, ib = 0;
        for (int i = 0; i < V; i++) {
            size_t k = (size_t)r * V + i;
            sum += ref[k];
            sq += (double)ref[k] * ref[k];
            maxd = fmax(maxd, fabs((double)a[k] - ref[k]));
            ia = a[k] > a[(size_t)r * V + ia] ? i : ia;
            ib = ref[k] > ref[(size_t)r * V + ib] ? i : ib;
        }
        same += ia == ib;
    }
    double n = (double)rows * V, sd = sqrt(sq / n - (sum / n) * (sum / n));
    *err = maxd / sd;
    *agree = (double)same / rows;
}

Test(worker, logits_match_f32_model_when_weights_are_f16_bf16_or_q8_0)
{
    float *ref = typed_logits("synthetic:stories15M", 2);
    /* Relative rounding of a weight: 2^-11 (f16), 2^-8 (bf16), up to 1/254 of its block's max
     * (q8_0, whose activations are rounded to 8 bits too: the default int8 path); through 6
     * layers the largest of 384,000 logits moves by a small fraction of their spread (measured:
     * 0.004, 0.03 and 0.11 sd; q8_0 with fp32 activations 0.08). */
    const struct {
        const char *spec;
        double max_err;
    } cases[] = {{"synthetic:stories15M:f16", 0.02},
                 {"synthetic:stories15M:bf16", 0.1},
                 {"synthetic:stories15M:q8_0", 0.15}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *got = typed_logits(cases[c].spec, 2);
        double err, agree;
        compare_logits(got, ref, 12, 32000, &err, &agree);
        cr_log_info("%s: max |logit diff| = %.4f sd, argmax agrees on %.0f%% of rows",
                    cases[c].spec, err, 100 * agree);
        cr_assert(err > 0 && err < cases[c].max_err, "%s: max logit error %.4f sd", cases[c].spec,
                  err);
        cr_assert(agree >= 0.9, "%s: argmax agrees on %.0f%% of rows", cases[c].spec, 100 * agree);
        free(got);
    }
    free(ref);
}

Test(worker, logits_match_f32_model_when_weights_are_k_quants_with_either_activations)
{
    float *ref = typed_logits("synthetic:tiny256", 2);
    const struct {
        const char *spec;
        double max_err;
    } cases[] = {{"synthetic:tiny256:q8_0", 0.15},
                 {"synthetic:tiny256:q6_k", 0.3},
                 {"synthetic:tiny256:q5_k", 0.6},
                 {"synthetic:tiny256:q4_k", 1.2},
                 {"synthetic:tiny256:q4_0", 1.2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double err[2], agree[2];
        float *got[2];
        for (int f = 0; f < 2; f++) {
            float_act = f == 1;
            got[f] = typed_logits(cases[c].spec, 2);
            compare_logits(got[f], ref, 12, 512, &err[f], &agree[f]);
            cr_log_info("%s, %s activations: max |logit diff| = %.4f sd from f32 weights, argmax "
                        "agrees on %.0f%% of rows",
                        cases[c].spec, f ? "fp32" : "int8", err[f], 100 * agree[f]);
            cr_assert(err[f] > 0 && err[f] < cases[c].max_err, "%s: max logit error %.4f sd",
                      cases[c].spec, err[f]);
            cr_assert(agree[f] >= 0.75, "%s: argmax agrees on %.0f%% of rows", cases[c].spec,
                      100 * agree[f]);
        }
        float_act = false;
        double between, same;
        compare_logits(got[0], got[1], 12, 512, &between, &same);
        cr_log_info("%s: int8 against fp32 activations: max |logit diff| = %.4f sd, argmax agrees "
                    "on %.0f%% of rows",
                    cases[c].spec, between, 100 * same);
        /* (measured: 0.05-0.08 sd, the argmax of every row the same) */
        cr_assert(between > 0 && between < 0.2, "%s: int8 and fp32 activations %.4f sd apart",
                  cases[c].spec, between);
        cr_assert(same >= 0.9, "%s: int8 and fp32 argmax agree on %.0f%% of rows", cases[c].spec,
                  100 * same);
        free(got[0]);
        free(got[1]);
    }
    free(ref);
}

Test(worker, logits_are_bitwise_equal_when_quantized_prefill_is_chunked_and_threads_change)
{
    const char *specs[] = {"synthetic:stories15M:q8_0", "synthetic:tiny256:q4_k",
                           "synthetic:tiny256:q6_k", "synthetic:tiny256:q4_0"};
    for (size_t sp = 0; sp < sizeof specs / sizeof specs[0]; sp++) {
        float *ref = typed_logits(specs[sp], 1);
        struct sl_model *m = wt_load(specs[sp], NULL);
        int V = sl_model_config(m)->vocab_size;
        struct sl_worker *w = new_worker(m, 3);
        int32_t table[8] = {5, 2, 7, 1, 0, 3, 4, 6};
        const int32_t *tables[1] = {table};
        int32_t ctx[1];
        float *l = malloc((size_t)12 * V * sizeof(float));
        int chunks[] = {0, 1, 6, 12};
        for (int c = 0; c < 3; c++) {
            struct wt_step s = {0};
            for (int i = chunks[c]; i < chunks[c + 1]; i++)
                wt_step_add(&s, 0, wt_seq_a[i] * 37 % V, i);
            ctx[0] = chunks[c + 1];
            wt_run_step(w, &s, 1, tables, ctx, l);
            cr_assert(memcmp(l, ref + (size_t)chunks[c] * V,
                             (size_t)(chunks[c + 1] - chunks[c]) * V * sizeof(float)) == 0,
                      "%s: chunk %d differs from one prefill on one thread", specs[sp], c);
        }
        sl_worker_free(w);
        sl_model_free(m);
        free(l);
        free(ref);
    }
}

Test(worker, synthetic_load_fails_when_weight_type_is_unknown_or_unfit)
{
    struct sl_model *m = NULL;
    char err[256];
    cr_assert_eq(sl_model_load("synthetic:tiny:q3_k", NULL, &m, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "unknown weight type"), "%s", err);
    /* stories15M's dim 288 is not a whole number of 256-value super-blocks. */
    cr_assert_eq(sl_model_load("synthetic:stories15M:q4_k", NULL, &m, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "q4_k needs dim and hidden_dim multiples of 256"), "%s", err);
    /* tiny's hidden_dim 172 is not a whole number of 32-value blocks. */
    cr_assert_eq(sl_model_load("synthetic:tiny:q8_0", NULL, &m, err, sizeof(err)), SL_EINVAL);
    cr_assert(strstr(err, "q8_0"), "%s", err);
    cr_assert_null(m);
    m = wt_load("synthetic:tiny:f16", NULL);
    cr_assert_str_eq(sl_model_id(m), "synthetic:tiny:f16");
    cr_assert_eq(m->w.layers[0].w2.type, SL_DTYPE_F16);
    cr_assert_eq(m->w.wcls.data, m->w.token_embedding.data);
    sl_model_free(m);
}

/* forward_sample on the CPU: each row's id is what sl_sample_with_coin picks from the logits the
 * same batch gives through forward, whichever pool thread samples it; 1 and 2 threads, 4 rows. */
Test(worker, cpu_forward_sample_picks_what_the_caller_would_from_forward_logits)
{
    struct sl_model *m = wt_load("synthetic:tiny", NULL);
    int V = sl_model_config(m)->vocab_size;
    for (int threads = 1; threads <= 2; threads++) {
        struct sl_worker *w = new_worker(m, threads);
        cr_assert(sl_worker_can_sample(w));
        int32_t t[4][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}};
        const int32_t *tables[4] = {t[0], t[1], t[2], t[3]};
        struct wt_step s = {0};
        int32_t ctx[4], rows_idx[4];
        for (int q = 0; q < 4; q++) {
            for (int i = 0; i < 3 + q; i++)
                wt_step_add(&s, q, wt_seq_a[i + q] + q, i);
            ctx[q] = 3 + q;
            rows_idx[q] = s.n - 1;
        }
        struct sl_batch b = wt_batch_of(&s, 4, tables, ctx);
        b.n_logits = 4;
        b.logit_rows = rows_idx;
        float *logits = malloc((size_t)4 * V * sizeof(float));
        float *work = malloc((size_t)V * sizeof(float));
        void *scratch = malloc(sl_sample_scratch_size(V));
        cr_assert_eq(sl_worker_forward(w, &b, logits), SL_OK);
        const struct sl_sampling ps[] = {{.temperature = 0.0f, .top_p = 1.0f},
                                         {.temperature = 1.0f, .top_p = 1.0f},
                                         {.temperature = 0.8f, .top_p = 0.9f, .min_p = 0.01f},
                                         {.temperature = 1.3f, .top_p = 1.0f, .top_k = 20}};
        int differ = 0;
        for (int k = 0; k < 8; k++) {
            struct sl_sample_row rows[4];
            for (int i = 0; i < 4; i++)
                rows[i] = (struct sl_sample_row){ps[(i + k) % 4],
                                                 (float)((k * 5 + i * 3) % 8) / 8.0f + 0.02f};
            int32_t ids[4];
            cr_assert_eq(sl_worker_forward_sample(w, &b, rows, ids), SL_OK);
            for (int i = 0; i < 4; i++) {
                memcpy(work, logits + (size_t)i * V, (size_t)V * sizeof(float));
                int32_t want = sl_sample_with_coin(work, V, &rows[i].p, rows[i].coin, scratch);
                cr_assert_eq(ids[i], want, "threads %d, round %d, row %d", threads, k, i);
                differ += ids[i] != ids[0];
            }
        }
        cr_assert_gt(differ, 0, "the rows' ids differ somewhere (the test can tell rows apart)");
        free(logits);
        free(work);
        free(scratch);
        sl_worker_free(w);
    }
    sl_model_free(m);
}
