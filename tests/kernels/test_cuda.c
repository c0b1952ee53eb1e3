/* CUDA kernels against the CPU kernels (kernels/cpu), over many shapes: odd sizes, long contexts,
 * grouped-query ratios, every element type, scattered block tables. The CUDA kernels sum in a
 * different order, so each comparison has an error bound, stated where it is made. Every test
 * skips with "no CUDA device: …" when this machine has no usable device. */
#include <sluice/kernels.h>

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEN(a) (int)(sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------------------------------------
 * Helpers
 */

static bool cuda_ready(char *why, size_t len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, len, "no CUDA device: cudaGetDeviceCount: %s", cudaGetErrorString(e));
        return false;
    }
    if (n < 1) {
        snprintf(why, len, "no CUDA device: cudaGetDeviceCount found none");
        return false;
    }
    struct cudaDeviceProp p;
    if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess) {
        snprintf(why, len, "no CUDA device: %s", cudaGetErrorString(e));
        return false;
    }
    if (p.major < 9) {
        snprintf(why, len, "no CUDA device this build can run (%.64s is compute %d.%d, needs 9.0)",
                 p.name, p.major, p.minor);
        return false;
    }
    return true;
}

#define REQUIRE_CUDA()                                                                             \
    do {                                                                                           \
        char why_[256];                                                                            \
        if (!cuda_ready(why_, sizeof why_))                                                        \
            cr_skip_test("%s", why_);                                                              \
    } while (0)

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                    \
    } while (0)

#define OK(call) cr_assert_eq((call), SL_OK, "%s: %s", #call, sl_cuda_last_error())

static uint64_t rs = 0x5eed;
static float frand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rand_vec(size_t n, float scale)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand() * scale;
    return p;
}

static void *to_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes)
        CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void *from_dev(const void *d, size_t bytes)
{
    void *h = malloc(bytes ? bytes : 1);
    CK(cudaDeviceSynchronize());
    if (bytes)
        CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

static size_t tsize(enum sl_dtype t)
{
    return t == SL_DTYPE_F32 ? 4 : 2;
}

/* n fp32 values stored as type t (F32, F16 or BF16). */
static void *typed(enum sl_dtype t, const float *v, size_t n)
{
    void *p = malloc(n * tsize(t) + 1);
    for (size_t i = 0; i < n; i++) {
        if (t == SL_DTYPE_F32) {
            ((float *)p)[i] = v[i];
        } else {
            uint16_t h = t == SL_DTYPE_F16 ? sl_cpu_f32_to_f16(v[i]) : sl_cpu_f32_to_bf16(v[i]);
            ((uint16_t *)p)[i] = h;
        }
    }
    return p;
}

/* The fp32 values n elements of type t hold. */
static float *untyped(enum sl_dtype t, const void *p, size_t n)
{
    float *v = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        v[i] = t == SL_DTYPE_F32   ? ((const float *)p)[i]
               : t == SL_DTYPE_F16 ? sl_cpu_f16_to_f32(((const uint16_t *)p)[i])
                                   : sl_cpu_bf16_to_f32(((const uint16_t *)p)[i]);
    return v;
}

/* v rounded to type t, as fp32. */
static float round_to(enum sl_dtype t, float v)
{
    void *p = typed(t, &v, 1);
    float *f = untyped(t, p, 1), r = *f;
    free(p);
    free(f);
    return r;
}

/* Relative rounding of a type: half an ulp at 1. */
static double unit(enum sl_dtype t)
{
    return t == SL_DTYPE_F32 ? 0x1p-24 : t == SL_DTYPE_F16 ? 0x1p-11 : 0x1p-8;
}

static const enum sl_dtype out_types[] = {SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16};

/* ---------------------------------------------------------------------------------------------
 * Conversions and gathers: exact
 */

Test(cuda, convert_equals_cpu_conversion_bit_for_bit_when_types_and_shapes_vary)
{
    REQUIRE_CUDA();
    const enum sl_dtype srcs[] = {SL_DTYPE_F32,  SL_DTYPE_F16,  SL_DTYPE_BF16, SL_DTYPE_Q8_0,
                                  SL_DTYPE_Q4_0, SL_DTYPE_Q4_K, SL_DTYPE_Q5_K, SL_DTYPE_Q6_K};
    const int shapes[][2] = {{1, 32}, {3, 64}, {7, 96}, {2, 33}, {5, 1}, {64, 288}, {9, 768}};
    for (int si = 0; si < LEN(srcs); si++)
        for (int di = 0; di < LEN(out_types); di++)
            for (int k = 0; k < LEN(shapes); k++) {
                enum sl_dtype st = srcs[si], dt = out_types[di];
                int rows = shapes[k][0], cols = shapes[k][1];
                size_t rb = sl_dtype_row_bytes(st, cols);
                if (rb == 0)
                    continue; /* the quantized types need whole blocks */
                float *v = rand_vec((size_t)rows * cols, 3.0f);
                unsigned char *src = malloc(rb * rows);
                for (int r = 0; r < rows; r++)
                    sl_cpu_quantize_row(st, src + rb * r, v + (size_t)r * cols, cols);
                float *want32 = malloc((size_t)rows * cols * sizeof(float));
                struct sl_mat m = {st, src, rows, cols};
                for (int r = 0; r < rows; r++)
                    sl_cpu_mat_row(want32 + (size_t)r * cols, &m, r);
                void *want = typed(dt, want32, (size_t)rows * cols);
                void *d_src = to_dev(src, rb * rows), *d_dst = NULL;
                CK(cudaMalloc(&d_dst, (size_t)rows * cols * tsize(dt)));
                OK(sl_cuda_convert(d_dst, dt, d_src, st, (size_t)rows, cols, NULL));
                void *got = from_dev(d_dst, (size_t)rows * cols * tsize(dt));
                cr_assert(memcmp(got, want, (size_t)rows * cols * tsize(dt)) == 0,
                          "convert %s → %s (%d, %d)", sl_dtype_name(st), sl_dtype_name(dt), rows,
                          cols);
                cudaFree(d_src);
                cudaFree(d_dst);
                free(v);
                free(src);
                free(want32);
                free(want);
                free(got);
            }
    cr_assert_eq(sl_cuda_convert((void *)8, SL_DTYPE_Q8_0, (void *)8, SL_DTYPE_F32, 1, 32, NULL),
                 SL_EINVAL, "Q8_0 is not a device type");
}

Test(cuda, embed_equals_table_rows_when_tokens_are_in_and_out_of_range)
{
    REQUIRE_CUDA();
    const int dims[] = {1, 19, 64, 4097};
    for (int ti = 0; ti < LEN(out_types); ti++)
        for (int di = 0; di < LEN(dims); di++) {
            enum sl_dtype t = out_types[ti];
            int vocab = 37, dim = dims[di], n = 6;
            float *v = rand_vec((size_t)vocab * dim, 2.0f);
            void *table = typed(t, v, (size_t)vocab * dim);
            float *rows = untyped(t, table, (size_t)vocab * dim);
            int32_t tokens[6] = {0, 36, 5, -1, 37, 5};
            void *d_table = to_dev(table, (size_t)vocab * dim * tsize(t));
            int32_t *d_tok = to_dev(tokens, sizeof tokens);
            float *d_x = NULL;
            CK(cudaMalloc((void **)&d_x, (size_t)n * dim * 4));
            OK(sl_cuda_embed(d_x, d_table, t, vocab, dim, d_tok, n, NULL));
            float *x = from_dev(d_x, (size_t)n * dim * 4);
            for (int r = 0; r < n; r++)
                for (int j = 0; j < dim; j++) {
                    bool in = tokens[r] >= 0 && tokens[r] < vocab;
                    float want = in ? rows[(size_t)tokens[r] * dim + j] : 0.0f;
                    cr_assert_eq(x[(size_t)r * dim + j], want, "embed %s dim %d row %d col %d",
                                 sl_dtype_name(t), dim, r, j);
                }
            cudaFree(d_table);
            cudaFree(d_tok);
            cudaFree(d_x);
            free(v);
            free(table);
            free(rows);
            free(x);
        }
}

/* ---------------------------------------------------------------------------------------------
 * Row-wise ops
 */

Test(cuda, add_rmsnorm_matches_cpu_add_then_rmsnorm_when_shapes_and_rows_vary)
{
    REQUIRE_CUDA();
    const int dims[] = {1, 7, 64, 173, 1000, 4096};
    const int ns[] = {1, 3, 17};
    for (int oi = 0; oi < LEN(out_types); oi++)
        for (int di = 0; di < LEN(dims); di++)
            for (int ni = 0; ni < LEN(ns); ni++)
                for (int variant = 0; variant < 3; variant++) {
                    /* 0: no residual; 1: residual, every row; 2: residual, a subset of rows */
                    enum sl_dtype ot = out_types[oi];
                    int dim = dims[di], rows = ns[ni], eps_i = variant;
                    float eps = eps_i == 1 ? 1e-6f : 1e-5f;
                    float *x = rand_vec((size_t)rows * dim, 4.0f),
                          *y = rand_vec((size_t)rows * dim, 4.0f);
                    float *w = rand_vec((size_t)dim, 1.5f);
                    int32_t idx[17];
                    int n = rows;
                    if (variant == 2) {
                        n = 0;
                        for (int r = rows - 1; r >= 0; r -= 2)
                            idx[n++] = r;
                    }
                    float *d_x = to_dev(x, (size_t)rows * dim * 4),
                          *d_y = to_dev(y, (size_t)rows * dim * 4);
                    float *d_w = to_dev(w, (size_t)dim * 4);
                    int32_t *d_idx = to_dev(idx, sizeof idx);
                    void *d_out = NULL;
                    CK(cudaMalloc(&d_out, (size_t)n * dim * tsize(ot)));
                    OK(sl_cuda_add_rmsnorm(d_out, ot, d_x, variant ? d_y : NULL, d_w,
                                           variant == 2 ? d_idx : NULL, n, dim, eps, NULL));
                    float *gx = from_dev(d_x, (size_t)rows * dim * 4);
                    void *gout = from_dev(d_out, (size_t)n * dim * tsize(ot));
                    float *out = untyped(ot, gout, (size_t)n * dim);
                    float *ref = malloc((size_t)dim * 4), *xr = malloc((size_t)dim * 4);
                    for (int i = 0; i < n; i++) {
                        int r = variant == 2 ? idx[i] : i;
                        memcpy(xr, x + (size_t)r * dim, (size_t)dim * 4);
                        if (variant)
                            sl_cpu_add(xr, y + (size_t)r * dim, dim);
                        /* The add is one fp32 rounding either way: exact. */
                        cr_assert(memcmp(gx + (size_t)r * dim, xr, (size_t)dim * 4) == 0,
                                  "residual of row %d (dim %d)", r, dim);
                        sl_cpu_rmsnorm(ref, xr, w, 1, dim, eps);
                        for (int j = 0; j < dim; j++) {
                            /* Sum of squares in another order (≈ dim·2^-24 relative), then the
                             * output type's rounding. */
                            double tol = (dim * 0x1p-24 + 2 * unit(ot)) * fabs(ref[j]) + 1e-6;
                            cr_assert(fabs(out[(size_t)i * dim + j] - ref[j]) <= tol,
                                      "rmsnorm %s dim %d n %d v%d [%d,%d]: %.9g vs %.9g",
                                      sl_dtype_name(ot), dim, n, variant, i, j,
                                      out[(size_t)i * dim + j], ref[j]);
                        }
                    }
                    /* Rows not listed are untouched. */
                    if (variant == 2)
                        for (int r = rows - 2; r >= 0; r -= 2)
                            cr_assert(memcmp(gx + (size_t)r * dim, x + (size_t)r * dim,
                                             (size_t)dim * 4) == 0,
                                      "row %d was not listed", r);
                    cudaFree(d_x);
                    cudaFree(d_y);
                    cudaFree(d_w);
                    cudaFree(d_idx);
                    cudaFree(d_out);
                    free(x);
                    free(y);
                    free(w);
                    free(gx);
                    free(gout);
                    free(out);
                    free(ref);
                    free(xr);
                }
}

Test(cuda, swiglu_matches_cpu_when_shapes_are_odd)
{
    REQUIRE_CUDA();
    const int hs[] = {1, 3, 172, 768, 14336};
    const int ns[] = {1, 2, 9};
    for (int oi = 0; oi < LEN(out_types); oi++)
        for (int a = 0; a < LEN(hs); a++)
            for (int b = 0; b < LEN(ns); b++) {
                enum sl_dtype ot = out_types[oi];
                int hid = hs[a], n = ns[b];
                float *h13 = rand_vec((size_t)n * 2 * hid, 6.0f);
                float *d_h = to_dev(h13, (size_t)n * 2 * hid * 4);
                void *d_out = NULL;
                CK(cudaMalloc(&d_out, (size_t)n * hid * tsize(ot)));
                OK(sl_cuda_swiglu(d_out, ot, d_h, n, hid, NULL));
                void *g = from_dev(d_out, (size_t)n * hid * tsize(ot));
                float *got = untyped(ot, g, (size_t)n * hid);
                float *ref = malloc((size_t)hid * 4);
                for (int r = 0; r < n; r++) {
                    memcpy(ref, h13 + (size_t)r * 2 * hid, (size_t)hid * 4);
                    sl_cpu_swiglu(ref, h13 + (size_t)r * 2 * hid + hid, hid);
                    for (int j = 0; j < hid; j++) {
                        /* expf within a few ulp on either side, then the output rounding. */
                        double tol = (8 * 0x1p-24 + 2 * unit(ot)) * fabs(ref[j]) + 1e-7;
                        cr_assert(fabs(got[(size_t)r * hid + j] - ref[j]) <= tol,
                                  "swiglu %s hid %d [%d,%d]: %.9g vs %.9g", sl_dtype_name(ot), hid,
                                  r, j, got[(size_t)r * hid + j], ref[j]);
                    }
                }
                cudaFree(d_h);
                cudaFree(d_out);
                free(h13);
                free(g);
                free(got);
                free(ref);
            }
}

/* ---------------------------------------------------------------------------------------------
 * The paged KV cache: a pool of blocks laid out (n_blocks, n_kv_heads, block_size, head_size),
 * filled with random values, and scrambled block tables.
 */

struct pool {
    enum sl_dtype t;
    int n_blocks, bs, nkv, hs;
    size_t elems;
    float *k, *v;    /* (elems) the fp32 values the typed cache holds */
    void *d_k, *d_v; /* device, typed */
    int n_seqs, max_blocks;
    int32_t *tables; /* (n_seqs, max_blocks) */
    int32_t *d_tables;
};

static void pool_init(struct pool *p, enum sl_dtype t, int n_seqs, int max_ctx, int bs, int nkv,
                      int hs)
{
    memset(p, 0, sizeof *p);
    p->t = t;
    p->bs = bs;
    p->nkv = nkv;
    p->hs = hs;
    p->n_seqs = n_seqs;
    p->max_blocks = (max_ctx + bs - 1) / bs;
    p->n_blocks = n_seqs * p->max_blocks + 3;
    p->elems = (size_t)p->n_blocks * nkv * bs * hs;
    float *k = rand_vec(p->elems, 1.0f), *v = rand_vec(p->elems, 1.0f);
    void *tk = typed(t, k, p->elems), *tv = typed(t, v, p->elems);
    p->k = untyped(t, tk, p->elems);
    p->v = untyped(t, tv, p->elems);
    p->d_k = to_dev(tk, p->elems * tsize(t));
    p->d_v = to_dev(tv, p->elems * tsize(t));
    free(k);
    free(v);
    free(tk);
    free(tv);
    /* Block i of sequence s: a bijection that scatters neighbours across the pool. */
    p->tables = malloc((size_t)n_seqs * p->max_blocks * sizeof(int32_t));
    int total = n_seqs * p->max_blocks;
    for (int s = 0; s < n_seqs; s++)
        for (int i = 0; i < p->max_blocks; i++)
            p->tables[(size_t)s * p->max_blocks + i] =
                (int32_t)(((long)(s * p->max_blocks + i) * 7919 + 13) % total) + 1;
    p->d_tables = to_dev(p->tables, (size_t)n_seqs * p->max_blocks * sizeof(int32_t));
}

static struct sl_cuda_kv pool_kv(const struct pool *p)
{
    return (struct sl_cuda_kv){p->d_k, p->d_v, p->t,        p->n_blocks,  p->bs,
                               p->nkv, p->hs,  p->d_tables, p->max_blocks};
}

static void pool_free(struct pool *p)
{
    cudaFree(p->d_k);
    cudaFree(p->d_v);
    cudaFree(p->d_tables);
    free(p->k);
    free(p->v);
    free(p->tables);
}

/* sl_cpu_attention of q over positions 0..n_ctx-1 of sequence s, KV head g. */
static void cpu_attend(float *out, const float *q, const struct pool *p, int s, int g, int n_ctx)
{
    size_t page = (size_t)p->nkv * p->bs * p->hs;
    const int32_t *pages = p->tables + (size_t)s * p->max_blocks;
    struct sl_cpu_pages kp = {
        p->k + (size_t)g * p->bs * p->hs, pages, page, (size_t)p->hs, p->bs, SL_DTYPE_F32};
    struct sl_cpu_pages vp = kp;
    vp.base = p->v + (size_t)g * p->bs * p->hs;
    float *att = malloc((size_t)n_ctx * sizeof(float));
    sl_cpu_attention(out, q, &kp, &vp, n_ctx, p->hs, att);
    free(att);
}

Test(cuda, rope_kv_matches_cpu_rope_and_writes_the_cache_when_positions_are_scattered)
{
    REQUIRE_CUDA();
    const struct {
        int n_heads, nkv, hs, bs;
        float theta;
    } cases[] = {{1, 1, 2, 1, 10000.0f},     {8, 4, 8, 16, 10000.0f},     {6, 6, 48, 7, 10000.0f},
                 {32, 8, 64, 16, 500000.0f}, {32, 8, 128, 16, 500000.0f}, {4, 1, 256, 5, 10000.0f}};
    for (int ti = 0; ti < LEN(out_types); ti++)
        for (int ci = 0; ci < LEN(cases); ci++) {
            enum sl_dtype t = out_types[ti];
            int nh = cases[ci].n_heads, nkv = cases[ci].nkv, hs = cases[ci].hs, bs = cases[ci].bs;
            int n = 9, n_seqs = 3, max_ctx = 5000, stride = (nh + 2 * nkv) * hs;
            struct pool p;
            pool_init(&p, t, n_seqs, max_ctx, bs, nkv, hs);
            int32_t pos[9] = {0, 1, 2, 4095, 17, 4999, 300, 301, 1};
            int32_t seq[9] = {0, 0, 0, 1, 2, 1, 2, 2, 1};
            float *qkv = rand_vec((size_t)n * stride, 2.0f);
            float *d_qkv = to_dev(qkv, (size_t)n * stride * 4);
            int32_t *d_pos = to_dev(pos, sizeof pos), *d_seq = to_dev(seq, sizeof seq);
            struct sl_cuda_kv kv = pool_kv(&p);
            OK(sl_cuda_rope_kv(d_qkv, n, nh, cases[ci].theta, d_pos, d_seq, &kv, NULL));
            float *got = from_dev(d_qkv, (size_t)n * stride * 4);
            void *gk = from_dev(p.d_k, p.elems * tsize(t)),
                 *gv = from_dev(p.d_v, p.elems * tsize(t));
            float *ck = untyped(t, gk, p.elems), *cv = untyped(t, gv, p.elems);
            float *cs = malloc((size_t)hs * 4), *ref = malloc((size_t)stride * 4);
            for (int r = 0; r < n; r++) {
                memcpy(ref, qkv + (size_t)r * stride, (size_t)stride * 4);
                sl_cpu_rope_table(cs, hs, pos[r], cases[ci].theta);
                sl_cpu_rope_apply(ref, nh + nkv, hs, cs);
                for (int j = 0; j < stride; j++) {
                    /* powf's last-ulp differences grow with the angle: pos · freq · 2^-22. */
                    double tol = 1e-6 + pos[r] * 0x1p-21 * 2.0;
                    cr_assert(fabs(got[(size_t)r * stride + j] - ref[j]) <= tol,
                              "rope %d heads hs %d row %d (pos %d) [%d]: %.9g vs %.9g", nh, hs, r,
                              pos[r], j, got[(size_t)r * stride + j], ref[j]);
                }
                /* Keys (rotated) and values land at the row's slot, rounded to the cache type. */
                int32_t b = p.tables[(size_t)seq[r] * p.max_blocks + pos[r] / bs];
                for (int g = 0; g < nkv; g++)
                    for (int d = 0; d < hs; d++) {
                        size_t off = (((size_t)b * nkv + g) * bs + pos[r] % bs) * hs + d;
                        float kw = got[(size_t)r * stride + (size_t)(nh + g) * hs + d];
                        float vw = qkv[(size_t)r * stride + (size_t)(nh + nkv + g) * hs + d];
                        cr_assert_eq(ck[off], round_to(t, kw), "key row %d head %d [%d]", r, g, d);
                        cr_assert_eq(cv[off], round_to(t, vw), "value row %d head %d [%d]", r, g,
                                     d);
                    }
            }
            cudaFree(d_qkv);
            cudaFree(d_pos);
            cudaFree(d_seq);
            pool_free(&p);
            free(qkv);
            free(got);
            free(gk);
            free(gv);
            free(ck);
            free(cv);
            free(cs);
            free(ref);
        }
}

/* Attention outputs against sl_cpu_attention: scores and the softmax are fp32 on both sides,
 * summed in other orders; the values are O(1), so an absolute bound plus the output type's
 * rounding. */
static void check_attention(const float *got, const float *ref, int hs, enum sl_dtype ot,
                            const char *what, int row, int head, int n_ctx)
{
    for (int d = 0; d < hs; d++) {
        double tol = 2e-5 + 2 * unit(ot) * fabs(ref[d]);
        cr_assert(fabs(got[d] - ref[d]) <= tol, "%s: row %d head %d ctx %d [%d]: %.9g vs %.9g",
                  what, row, head, n_ctx, d, got[d], ref[d]);
    }
}

struct attn_case {
    int n_heads, nkv, hs, bs;
    enum sl_dtype kv;
    enum sl_dtype out;
};

static const struct attn_case attn_cases[] = {
    {8, 4, 8, 16, SL_DTYPE_F32, SL_DTYPE_F32},     /* stories260K */
    {8, 4, 16, 16, SL_DTYPE_F32, SL_DTYPE_F32},    /* TinyStories-656K */
    {6, 6, 48, 7, SL_DTYPE_F32, SL_DTYPE_F16},     /* stories15M, no grouping, odd blocks */
    {32, 8, 64, 16, SL_DTYPE_BF16, SL_DTYPE_BF16}, /* llama-1b */
    {32, 8, 128, 16, SL_DTYPE_BF16, SL_DTYPE_F32}, /* llama-8b */
    {16, 1, 128, 32, SL_DTYPE_F16, SL_DTYPE_F16},  /* one KV head for all: kv_mul 16 */
    {4, 2, 256, 1, SL_DTYPE_F32, SL_DTYPE_F32},    /* the largest head, one-position blocks */
    {3, 3, 2, 3, SL_DTYPE_F32, SL_DTYPE_F32},      /* the smallest head */
};

Test(cuda, attention_decode_matches_cpu_attention_when_contexts_are_long_and_heads_grouped)
{
    REQUIRE_CUDA();
    /* Contexts around the split-K partitions (256 positions) and well beyond. */
    const int ctxs[] = {1, 2, 31, 255, 256, 257, 511, 512, 513, 1000, 4100};
    int max_ctx = 4100, n_rows = LEN(ctxs);
    for (int ci = 0; ci < LEN(attn_cases); ci++) {
        const struct attn_case *c = &attn_cases[ci];
        int nh = c->n_heads, nkv = c->nkv, hs = c->hs, stride = (nh + 2 * nkv) * hs;
        if (c->bs == 1 && hs == 256)
            max_ctx = 1000; /* keeps this case's pool small */
        else
            max_ctx = 4100;
        struct pool p;
        pool_init(&p, c->kv, n_rows, max_ctx, c->bs, nkv, hs);
        /* Row i is the decode of sequence i at position ctxs[i] - 1; rows listed out of order
         * and one row of the batch (row n_rows) is not listed at all. */
        int n = n_rows + 1;
        int32_t pos[16], seq[16], rows[16];
        for (int i = 0; i < n; i++) {
            int ctx = i < n_rows ? ctxs[i] : 1;
            pos[i] = (ctx < max_ctx ? ctx : max_ctx) - 1;
            seq[i] = i < n_rows ? i : 0;
        }
        for (int i = 0; i < n_rows; i++)
            rows[i] = n_rows - 1 - i;
        float *qkv = rand_vec((size_t)n * stride, 2.0f);
        float *d_qkv = to_dev(qkv, (size_t)n * stride * 4);
        int32_t *d_pos = to_dev(pos, sizeof pos), *d_seq = to_dev(seq, sizeof seq);
        int32_t *d_rows = to_dev(rows, sizeof rows);
        float *d_ws = NULL;
        CK(cudaMalloc((void **)&d_ws,
                      sl_cuda_attention_decode_ws(n_rows, nh, hs, max_ctx) * sizeof(float)));
        size_t out_elems = (size_t)n * nh * hs;
        float *sentinel = malloc(out_elems * 4);
        for (size_t i = 0; i < out_elems; i++)
            sentinel[i] = 12345.0f;
        void *st = typed(c->out, sentinel, out_elems);
        void *d_out = to_dev(st, out_elems * tsize(c->out));
        struct sl_cuda_kv kv = pool_kv(&p);
        OK(sl_cuda_attention_decode(d_out, c->out, d_qkv, d_rows, n_rows, d_pos, d_seq, &kv, nh,
                                    max_ctx, d_ws, NULL));
        void *g = from_dev(d_out, out_elems * tsize(c->out));
        float *got = untyped(c->out, g, out_elems);
        float *ref = malloc((size_t)hs * 4);
        for (int r = 0; r < n_rows; r++)
            for (int h = 0; h < nh; h++) {
                cpu_attend(ref, qkv + (size_t)r * stride + (size_t)h * hs, &p, seq[r],
                           h / (nh / nkv), pos[r] + 1);
                check_attention(got + ((size_t)r * nh + h) * hs, ref, hs, c->out, "decode", r, h,
                                pos[r] + 1);
            }
        for (int j = 0; j < nh * hs; j++)
            cr_assert_eq(got[(size_t)n_rows * nh * hs + j], round_to(c->out, 12345.0f),
                         "unlisted row written");
        cudaFree(d_qkv);
        cudaFree(d_pos);
        cudaFree(d_seq);
        cudaFree(d_rows);
        cudaFree(d_ws);
        cudaFree(d_out);
        pool_free(&p);
        free(qkv);
        free(sentinel);
        free(st);
        free(g);
        free(got);
        free(ref);
    }
}

Test(cuda, attention_prefill_matches_cpu_attention_when_chunks_follow_a_cached_prefix)
{
    REQUIRE_CUDA();
    /* (prefix already in the cache, chunk rows): a whole prompt, a chunk after a prefix, a chunk
     * of one row, chunks that end mid-tile and span several key tiles. */
    const int chunks[][2] = {{0, 20}, {37, 16}, {100, 1}, {5, 33}, {1000, 50}, {0, 70}};
    int n_seqs = LEN(chunks);
    for (int ci = 0; ci < LEN(attn_cases); ci++) {
        const struct attn_case *c = &attn_cases[ci];
        int nh = c->n_heads, nkv = c->nkv, hs = c->hs, stride = (nh + 2 * nkv) * hs;
        struct pool p;
        pool_init(&p, c->kv, n_seqs, 1050, c->bs, nkv, hs);
        int n = 0;
        int32_t pos[256], seq[256], tiles[512];
        int n_tiles = 0;
        for (int s = 0; s < n_seqs; s++) {
            int r0 = n;
            for (int i = 0; i < chunks[s][1]; i++) {
                pos[n] = chunks[s][0] + i;
                seq[n++] = s;
            }
            for (int t = r0; t < n; t += SL_CUDA_PREFILL_ROWS) {
                tiles[2 * n_tiles] = t;
                tiles[2 * n_tiles + 1] =
                    n - t < SL_CUDA_PREFILL_ROWS ? n - t : SL_CUDA_PREFILL_ROWS;
                n_tiles++;
            }
        }
        float *qkv = rand_vec((size_t)n * stride, 2.0f);
        float *d_qkv = to_dev(qkv, (size_t)n * stride * 4);
        int32_t *d_pos = to_dev(pos, (size_t)n * 4), *d_seq = to_dev(seq, (size_t)n * 4);
        int32_t *d_tiles = to_dev(tiles, (size_t)n_tiles * 8);
        size_t out_elems = (size_t)n * nh * hs;
        void *d_out = NULL;
        CK(cudaMalloc(&d_out, out_elems * tsize(c->out)));
        struct sl_cuda_kv kv = pool_kv(&p);
        OK(sl_cuda_attention_prefill(d_out, c->out, d_qkv, d_tiles, n_tiles, d_pos, d_seq, &kv, nh,
                                     NULL));
        void *g = from_dev(d_out, out_elems * tsize(c->out));
        float *got = untyped(c->out, g, out_elems);
        /* The same rows through the decode kernel, one at a time: the two kernels agree. */
        int32_t all[256];
        for (int r = 0; r < n; r++)
            all[r] = r;
        int32_t *d_all = to_dev(all, (size_t)n * 4);
        float *d_ws = NULL;
        CK(cudaMalloc((void **)&d_ws, sl_cuda_attention_decode_ws(n, nh, hs, 1050) * 4));
        void *d_out2 = NULL;
        CK(cudaMalloc(&d_out2, out_elems * tsize(c->out)));
        OK(sl_cuda_attention_decode(d_out2, c->out, d_qkv, d_all, n, d_pos, d_seq, &kv, nh, 1050,
                                    d_ws, NULL));
        void *g2 = from_dev(d_out2, out_elems * tsize(c->out));
        float *got2 = untyped(c->out, g2, out_elems);
        float *ref = malloc((size_t)hs * 4);
        for (int r = 0; r < n; r++)
            for (int h = 0; h < nh; h++) {
                cpu_attend(ref, qkv + (size_t)r * stride + (size_t)h * hs, &p, seq[r],
                           h / (nh / nkv), pos[r] + 1);
                check_attention(got + ((size_t)r * nh + h) * hs, ref, hs, c->out, "prefill", r, h,
                                pos[r] + 1);
                check_attention(got2 + ((size_t)r * nh + h) * hs, ref, hs, c->out,
                                "decode of prefill rows", r, h, pos[r] + 1);
            }
        cudaFree(d_qkv);
        cudaFree(d_pos);
        cudaFree(d_seq);
        cudaFree(d_tiles);
        cudaFree(d_out);
        cudaFree(d_all);
        cudaFree(d_ws);
        cudaFree(d_out2);
        pool_free(&p);
        free(qkv);
        free(g);
        free(got);
        free(g2);
        free(got2);
        free(ref);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Projections and the bandwidth probe
 */

Test(cuda, gemm_matches_cpu_matmul_when_types_and_shapes_vary)
{
    REQUIRE_CUDA();
    const int shapes[][3] = {{1, 1, 1},      {3, 5, 7},     {17, 33, 65},  {1, 2048, 2048},
                             {64, 256, 512}, {5, 4097, 96}, {300, 64, 172}};
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    struct sl_cuda_blas *b = NULL;
    OK(sl_cuda_blas_new(s, &b));
    for (int ti = 0; ti < LEN(out_types); ti++)
        for (int k = 0; k < LEN(shapes); k++) {
            enum sl_dtype t = out_types[ti];
            int n = shapes[k][0], rows = shapes[k][1], cols = shapes[k][2];
            float *x = rand_vec((size_t)n * cols, 1.0f), *w = rand_vec((size_t)rows * cols, 1.0f);
            void *tx = typed(t, x, (size_t)n * cols), *tw = typed(t, w, (size_t)rows * cols);
            float *xr = untyped(t, tx, (size_t)n * cols), *wr = untyped(t, tw, (size_t)rows * cols);
            void *d_x = to_dev(tx, (size_t)n * cols * tsize(t));
            void *d_w = to_dev(tw, (size_t)rows * cols * tsize(t));
            float *d_out = NULL;
            CK(cudaMalloc((void **)&d_out, (size_t)n * rows * 4));
            OK(sl_cuda_gemm(b, d_out, d_x, d_w, t, n, rows, cols));
            CK(cudaStreamSynchronize(s));
            float *got = from_dev(d_out, (size_t)n * rows * 4);
            /* The CPU kernel on the same (rounded) operands. */
            struct sl_mat m = {SL_DTYPE_F32, wr, rows, cols};
            float *ref = malloc((size_t)n * rows * 4);
            sl_cpu_matmul(ref, xr, &m, n);
            for (int r = 0; r < n; r++)
                for (int i = 0; i < rows; i++) {
                    double a = 0;
                    for (int j = 0; j < cols; j++)
                        a += fabs((double)xr[(size_t)r * cols + j] * wr[(size_t)i * cols + j]);
                    /* fp32 accumulation in any order on both sides: γ_k on each. */
                    double tol = 2 * (cols + 8) * 0x1p-24 * a + 1e-30;
                    float g = got[(size_t)r * rows + i], want = ref[(size_t)r * rows + i];
                    cr_assert(fabs(g - want) <= tol, "gemm %s (%d,%d,%d) [%d,%d]: %.9g vs %.9g",
                              sl_dtype_name(t), n, rows, cols, r, i, g, want);
                }
            cudaFree(d_x);
            cudaFree(d_w);
            cudaFree(d_out);
            free(x);
            free(w);
            free(tx);
            free(tw);
            free(xr);
            free(wr);
            free(got);
            free(ref);
        }
    cr_assert_eq(sl_cuda_gemm(b, (float *)8, (void *)8, (void *)8, SL_DTYPE_Q8_0, 1, 1, 32),
                 SL_EINVAL);
    sl_cuda_blas_free(b);
    cudaStreamDestroy(s);
}

Test(cuda, bench_copy_copies_every_byte_when_size_is_odd_in_vectors)
{
    REQUIRE_CUDA();
    size_t bytes = ((size_t)1 << 20) + 16 * 3;
    unsigned char *h = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        h[i] = (unsigned char)(i * 131 + 7);
    void *src = to_dev(h, bytes), *dst = NULL;
    CK(cudaMalloc(&dst, bytes));
    OK(sl_cuda_bench_copy(dst, src, bytes, NULL));
    unsigned char *got = from_dev(dst, bytes);
    cr_assert(memcmp(got, h, bytes) == 0);
    cr_assert_eq(sl_cuda_bench_copy(dst, src, 15, NULL), SL_EINVAL);
    cudaFree(src);
    cudaFree(dst);
    free(h);
    free(got);
}

/* Runs here too: without a device the kernels' argument checks still answer (nothing is
 * launched), so a caller's mistake is SL_EINVAL, never a crash. */
Test(cuda, launchers_refuse_bad_arguments_when_called_without_a_device)
{
    struct sl_cuda_kv bad = {0};
    cr_assert_eq(sl_cuda_rope_kv((float *)8, 1, 1, 1e4f, (int32_t *)8, (int32_t *)8, &bad, NULL),
                 SL_EINVAL);
    cr_assert(strstr(sl_cuda_last_error(), "rope_kv"), "%s", sl_cuda_last_error());
    cr_assert_eq(sl_cuda_add_rmsnorm(NULL, SL_DTYPE_F32, NULL, NULL, NULL, NULL, 1, 1, 1e-5f, NULL),
                 SL_EINVAL);
    cr_assert_eq(sl_cuda_swiglu((void *)8, SL_DTYPE_Q8_0, (float *)8, 1, 1, NULL), SL_EINVAL);
    cr_assert_eq(sl_cuda_sample(NULL, NULL, 1, 1, NULL, false, NULL, 0, NULL), SL_EINVAL);
    cr_assert_eq(sl_cuda_attention_decode_ws(1, 0, 8, 16), 0);
}
