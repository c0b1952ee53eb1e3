/* CPU kernels: conversions, the portable scalar kernels, run-time dispatch to the AVX2 ones
 * (avx2.c), the thread pool and the split of matmuls over it. */
#include "cpu_impl.h"

#if SL_CPU_HAVE_AVX2
#include <cpuid.h>
#endif
#if SL_CPU_PAIRED
#include "cpu_impl_old.h" /* generated: the old side's names (kernels/cpu/meson.build) */
#endif

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Types and conversions
 */

int sl_dtype_block(enum sl_dtype t)
{
    switch (t) {
    case SL_DTYPE_Q8_0:
    case SL_DTYPE_Q4_0: return 32;
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K:
    case SL_DTYPE_Q6_K: return SL_QK_BLOCK;
    default: return 1;
    }
}

bool sl_dtype_quantized(enum sl_dtype t)
{
    return sl_dtype_block(t) > 1;
}

size_t sl_dtype_row_bytes(enum sl_dtype t, int cols)
{
    int blk = sl_dtype_block(t);
    if (cols < 1 || cols % blk || (unsigned)t >= SL_DTYPE_COUNT)
        return 0;
    return (size_t)(cols / blk) * sl_cpu_block_bytes(t);
}

const char *sl_dtype_name(enum sl_dtype t)
{
    switch (t) {
    case SL_DTYPE_F32: return "f32";
    case SL_DTYPE_F16: return "f16";
    case SL_DTYPE_BF16: return "bf16";
    case SL_DTYPE_Q8_0: return "q8_0";
    case SL_DTYPE_Q4_0: return "q4_0";
    case SL_DTYPE_Q4_K: return "q4_k";
    case SL_DTYPE_Q5_K: return "q5_k";
    case SL_DTYPE_Q6_K: return "q6_k";
    }
    return "?";
}

float sl_cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, x;
    if (e == 0) {
        /* Zero or subnormal: m · 2^-24 is exact in fp32. */
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else
        x = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

uint16_t sl_cpu_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf stays inf, NaN stays a (quiet) NaN */
        return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to inf */
        return sign | 0x7c00;
    if (ax < 0x38800000u) {
        /* Below the smallest normal half: a multiple of 2^-24, rounded to nearest even. */
        float v;
        memcpy(&v, &ax, sizeof(v));
        return sign | (uint16_t)lrintf(v * 16777216.0f);
    }
    uint32_t h = (ax - 0x38000000u) >> 13, rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;
    return sign | (uint16_t)h;
}

float sl_cpu_bf16_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

uint16_t sl_cpu_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

static uint16_t rd16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

void sl_cpu_quantize_row(enum sl_dtype t, void *dst, const float *src, int cols)
{
    unsigned char *d = dst;
    switch (t) {
    case SL_DTYPE_F32: memcpy(d, src, (size_t)cols * sizeof(float)); return;
    case SL_DTYPE_F16:
        for (int j = 0; j < cols; j++) {
            uint16_t h = sl_cpu_f32_to_f16(src[j]);
            memcpy(d + 2 * (size_t)j, &h, 2);
        }
        return;
    case SL_DTYPE_BF16:
        for (int j = 0; j < cols; j++) {
            uint16_t h = sl_cpu_f32_to_bf16(src[j]);
            memcpy(d + 2 * (size_t)j, &h, 2);
        }
        return;
    case SL_DTYPE_Q8_0:
        for (int b = 0; b < cols / SL_Q8_0_BLOCK; b++) {
            const float *s = src + (size_t)b * SL_Q8_0_BLOCK;
            unsigned char *o = d + (size_t)b * SL_Q8_0_BYTES;
            float amax = 0.0f;
            for (int j = 0; j < SL_Q8_0_BLOCK; j++)
                amax = fmaxf(amax, fabsf(s[j]));
            float scale = amax / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
            uint16_t h = sl_cpu_f32_to_f16(scale);
            memcpy(o, &h, 2);
            for (int j = 0; j < SL_Q8_0_BLOCK; j++)
                o[2 + j] = (unsigned char)(int8_t)lrintf(s[j] * inv);
        }
        return;
    default: sl_cpu_quantize_blocks(t, d, src, cols); return;
    }
}

/* Values [j0, j0 + len) of one typed row as fp32; for the quantized types j0 and len are
 * multiples of 32. */
static void dequant(enum sl_dtype t, float *out, const unsigned char *row, int j0, int len)
{
    switch (t) {
    case SL_DTYPE_F32: memcpy(out, row + 4 * (size_t)j0, (size_t)len * sizeof(float)); return;
    case SL_DTYPE_F16:
        for (int j = 0; j < len; j++)
            out[j] = sl_cpu_f16_to_f32(rd16(row + 2 * (size_t)(j0 + j)));
        return;
    case SL_DTYPE_BF16:
        for (int j = 0; j < len; j++)
            out[j] = sl_cpu_bf16_to_f32(rd16(row + 2 * (size_t)(j0 + j)));
        return;
    case SL_DTYPE_Q8_0:
        for (int b = 0; b < len / SL_Q8_0_BLOCK; b++) {
            const unsigned char *blk = row + (size_t)(j0 / SL_Q8_0_BLOCK + b) * SL_Q8_0_BYTES;
            float scale = sl_cpu_f16_to_f32(rd16(blk));
            for (int j = 0; j < SL_Q8_0_BLOCK; j++)
                out[b * SL_Q8_0_BLOCK + j] = scale * (float)(int8_t)blk[2 + j];
        }
        return;
    default:
        for (int j = 0; j < len; j += 32)
            sl_cpu_dequant32(t, row, j0 + j, out + j);
        return;
    }
}

void sl_cpu_mat_row(float *out, const struct sl_mat *w, int row)
{
    size_t rb = sl_dtype_row_bytes(w->type, w->cols);
    dequant(w->type, out, (const unsigned char *)w->data + (size_t)row * rb, 0, w->cols);
}

/* ---------------------------------------------------------------------------------------------
 * Instruction set selection
 */

static _Atomic int g_isa = -1; /* enum sl_cpu_isa once chosen */

enum sl_cpu_isa sl_cpu_isa_best(void)
{
#if SL_CPU_HAVE_AVX2
    /* F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c". */
    unsigned int eax, ebx, ecx = 0, edx;
    bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !f16c)
        return SL_CPU_ISA_SCALAR;
    /* __builtin_cpu_supports checks that the OS saves the registers (XCR0) too. */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl"))
        return SL_CPU_ISA_AVX512;
    return SL_CPU_ISA_AVX2;
#endif
    return SL_CPU_ISA_SCALAR;
}

enum sl_cpu_isa sl_cpu_isa(void)
{
    int v = atomic_load_explicit(&g_isa, memory_order_relaxed);
    if (v < 0) {
        v = (int)sl_cpu_isa_best();
        atomic_store_explicit(&g_isa, v, memory_order_relaxed);
    }
    return (enum sl_cpu_isa)v;
}

int sl_cpu_set_isa(enum sl_cpu_isa isa)
{
    if ((int)isa < (int)SL_CPU_ISA_SCALAR || (int)isa > (int)sl_cpu_isa_best())
        return SL_EINVAL;
    atomic_store_explicit(&g_isa, (int)isa, memory_order_relaxed);
    return SL_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Paired builds: the old side's AVX2 kernels in place of this tree's, where PAIRED() calls one.
 */

static _Atomic bool g_paired_old;

#if SL_CPU_PAIRED
#define PAIRED(fn)                                                                                 \
    (atomic_load_explicit(&g_paired_old, memory_order_relaxed) ? sl_cpu_old_avx2_##fn              \
                                                               : sl_cpu_avx2_##fn)
#else
#define PAIRED(fn) sl_cpu_avx2_##fn
#endif

bool sl_cpu_paired_built(void)
{
    return SL_CPU_PAIRED;
}

int sl_cpu_paired_use_old(bool old)
{
    if (!SL_CPU_PAIRED)
        return SL_EINVAL;
    atomic_store_explicit(&g_paired_old, old, memory_order_relaxed);
    return SL_OK;
}

const char *sl_cpu_isa_name(enum sl_cpu_isa isa)
{
    switch (isa) {
    case SL_CPU_ISA_AVX2: return "avx2";
    case SL_CPU_ISA_AVX512: return "avx512";
    default: return "scalar";
    }
}

/* AVX-512 includes the AVX2 set: kernels without an AVX-512 version take the AVX2 one. */
#if SL_CPU_HAVE_AVX2
#define AVX2() (sl_cpu_isa() >= SL_CPU_ISA_AVX2)
#define AVX512() (sl_cpu_isa() == SL_CPU_ISA_AVX512)
#else
#define AVX2() 0
#define AVX512() 0
#endif

/* ---------------------------------------------------------------------------------------------
 * Scalar kernels: llama2.c's plain loops and order of summation.
 */

static float dot_scalar(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void sl_cpu_f32_to_f16_row(uint16_t *dst, const float *src, int n)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2()) {
        sl_cpu_avx2_f32_to_f16_row(dst, src, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++)
        dst[i] = sl_cpu_f32_to_f16(src[i]);
}

float sl_cpu_dot(const float *a, const float *b, int n)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2())
        return sl_cpu_avx2_dot(a, b, n);
#endif
    return dot_scalar(a, b, n);
}

#define SCHUNK 64 /* columns of typed weights converted at a time (a multiple of 32) */

/* Four weight rows at a time: four independent accumulator chains hide the add latency that
 * bounds a single sequential dot, while each chain still sums in plain j order. Typed weights are
 * converted SCHUNK columns at a time into a stack buffer, reused for every row of x; the running
 * sums live in out between chunks (a float store and load is exact, so the order is unchanged). */
static void matmul_scalar(float *out, const float *x, const struct sl_mat *w, int n, int d0, int d1)
{
    int k = w->cols, d = w->rows;
    size_t rb = sl_dtype_row_bytes(w->type, k);
    const unsigned char *wd = w->data;
    float buf[4][SCHUNK]; /* (4 weight rows, SCHUNK columns) converted weights */
    for (int i = d0; i < d1; i += 4) {
        int nr = d1 - i < 4 ? d1 - i : 4;
        for (int j0 = 0; j0 < k; j0 += SCHUNK) {
            int jn = k - j0 < SCHUNK ? k - j0 : SCHUNK;
            const float *wr[4] = {0};
            for (int c = 0; c < nr; c++) {
                const unsigned char *row = wd + (size_t)(i + c) * rb;
                if (w->type == SL_DTYPE_F32) {
                    wr[c] = (const float *)row + j0;
                } else {
                    dequant(w->type, buf[c], row, j0, jn);
                    wr[c] = buf[c];
                }
            }
            for (int r = 0; r < n; r++) {
                const float *xr = x + (size_t)r * k + j0;
                float *o = out + (size_t)r * d + i;
                if (nr == 4) {
                    float s0 = j0 ? o[0] : 0.0f, s1 = j0 ? o[1] : 0.0f;
                    float s2 = j0 ? o[2] : 0.0f, s3 = j0 ? o[3] : 0.0f;
                    for (int j = 0; j < jn; j++) {
                        float xj = xr[j];
                        s0 += wr[0][j] * xj;
                        s1 += wr[1][j] * xj;
                        s2 += wr[2][j] * xj;
                        s3 += wr[3][j] * xj;
                    }
                    o[0] = s0;
                    o[1] = s1;
                    o[2] = s2;
                    o[3] = s3;
                } else {
                    for (int c = 0; c < nr; c++) {
                        float s = j0 ? o[c] : 0.0f;
                        for (int j = 0; j < jn; j++)
                            s += wr[c][j] * xr[j];
                        o[c] = s;
                    }
                }
            }
        }
    }
}

/* sl_cpu_matmul_cols; xp: x packed whole for the AVX-512 matmul (see cpu_impl.h), or NULL. */
static void matmul_cols_p(float *out, const float *x, const float *xp, const struct sl_mat *w,
                          int n, int d0, int d1)
{
    if (n < 1 || d0 >= d1)
        return;
#if SL_CPU_HAVE_AVX2
    /* The AVX-512 matmul and a paired build's old side know the types up to Q8_0. */
    if (AVX512() && w->type <= SL_DTYPE_Q8_0) {
        sl_cpu_avx512_matmul_cols(out, x, xp, w, n, d0, d1);
        return;
    }
    if (AVX2()) {
        if (w->type <= SL_DTYPE_Q8_0)
            PAIRED(matmul_cols)(out, x, w, n, d0, d1);
        else
            sl_cpu_avx2_matmul_cols(out, x, w, n, d0, d1);
        return;
    }
#endif
    (void)xp;
    matmul_scalar(out, x, w, n, d0, d1);
}

void sl_cpu_matmul_cols(float *out, const float *x, const struct sl_mat *w, int n, int d0, int d1)
{
    matmul_cols_p(out, x, NULL, w, n, d0, d1);
}

void sl_cpu_matmul(float *out, const float *x, const struct sl_mat *w, int n)
{
    sl_cpu_matmul_cols(out, x, w, n, 0, w->rows);
}

void sl_cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2()) {
        sl_cpu_avx2_rmsnorm(out, x, w, n, dim, eps);
        return;
    }
#endif
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        float ss = 0.0f;
        for (int j = 0; j < dim; j++)
            ss += xr[j] * xr[j];
        ss /= (float)dim;
        ss += eps;
        ss = 1.0f / sqrtf(ss);
        for (int j = 0; j < dim; j++)
            o[j] = w[j] * (ss * xr[j]);
    }
}

void sl_cpu_div(float *x, int n, float d)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2()) {
        sl_cpu_avx2_div(x, n, d);
        return;
    }
#endif
    for (int i = 0; i < n; i++)
        x[i] /= d;
}

static int32_t argmax_scalar(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i]))
            best = i; /* strict >: the lowest id wins ties; NaN never wins over a number */
    return best;
}

int32_t sl_cpu_argmax(const float *x, int n)
{
#if SL_CPU_HAVE_AVX2
    if (AVX512() || AVX2()) {
        int32_t i = AVX512() ? sl_cpu_avx512_argmax(x, n) : sl_cpu_avx2_argmax(x, n);
        if (i >= 0)
            return i;
    }
#endif
    return argmax_scalar(x, n);
}

void sl_cpu_softmax(float *x, int n)
{
#if SL_CPU_HAVE_AVX2
    if (AVX512()) {
        sl_cpu_avx512_softmax(x, n);
        return;
    }
    if (AVX2()) {
        sl_cpu_avx2_softmax(x, n);
        return;
    }
#endif
    float max = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > max)
            max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    for (int i = 0; i < n; i++)
        x[i] /= sum;
}

void sl_cpu_rope_table(float *cs, int head_size, int pos, float theta)
{
    for (int i = 0; i < head_size; i += 2) {
        /* Same float expression order as run.c, so angles (and the golden) match exactly. */
        float freq = 1.0f / powf(theta, (float)i / (float)head_size);
        float val = (float)pos * freq;
        cs[i] = cosf(val);
        cs[i + 1] = sinf(val);
    }
}

void sl_cpu_rope_apply(float *x, int n_heads, int head_size, const float *cs)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2()) {
        sl_cpu_avx2_rope_apply(x, n_heads, head_size, cs);
        return;
    }
#endif
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_size;
        for (int i = 0; i < head_size; i += 2) {
            float fcr = cs[i], fci = cs[i + 1], v0 = v[i], v1 = v[i + 1];
            v[i] = v0 * fcr - v1 * fci;
            v[i + 1] = v0 * fci + v1 * fcr;
        }
    }
}

void sl_cpu_rope(float *x, int n_heads, int head_size, int pos, float theta)
{
    for (int i = 0; i < head_size; i += 2) {
        float cs[2];
        float freq = 1.0f / powf(theta, (float)i / (float)head_size);
        float val = (float)pos * freq;
        cs[0] = cosf(val);
        cs[1] = sinf(val);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)h * head_size + i;
            float v0 = v[0], v1 = v[1];
            v[0] = v0 * cs[0] - v1 * cs[1];
            v[1] = v0 * cs[1] + v1 * cs[0];
        }
    }
}

void sl_cpu_swiglu(float *h, const float *g, int n)
{
#if SL_CPU_HAVE_AVX2
    if (AVX512()) {
        sl_cpu_avx512_swiglu(h, g, n);
        return;
    }
    if (AVX2()) {
        sl_cpu_avx2_swiglu(h, g, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++) {
        float v = h[i];
        v *= 1.0f / (1.0f + expf(-v));
        h[i] = v * g[i];
    }
}

void sl_cpu_add(float *y, const float *x, int n)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2()) {
        sl_cpu_avx2_add(y, x, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++)
        y[i] += x[i];
}

void sl_cpu_axpy(float *y, float a, const float *x, int n)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2()) {
        sl_cpu_avx2_axpy(y, a, x, n);
        return;
    }
#endif
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* Element j of row t of paged K or V, as fp32. */
static float page_at(const struct sl_cpu_pages *p, int t, int j)
{
    size_t i = (size_t)p->pages[t / p->page_size] * p->page_stride +
               (size_t)(t % p->page_size) * p->row_stride + (size_t)j;
    if (p->type == SL_DTYPE_F16)
        return sl_cpu_f16_to_f32(((const uint16_t *)p->base)[i]);
    return ((const float *)p->base)[i];
}

void sl_cpu_attention(float *out, const float *q, const struct sl_cpu_pages *k,
                      const struct sl_cpu_pages *v, int n_ctx, int hs, float *att)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2()) {
        sl_cpu_avx2_attention(out, q, k, v, n_ctx, hs, att);
        return;
    }
#endif
    float scale = sqrtf((float)hs);
    for (int t = 0; t < n_ctx; t++) {
        float sum = 0.0f;
        for (int j = 0; j < hs; j++)
            sum += q[j] * page_at(k, t, j);
        att[t] = sum / scale;
    }
    sl_cpu_softmax(att, n_ctx);
    memset(out, 0, (size_t)hs * sizeof(float));
    for (int t = 0; t < n_ctx; t++)
        for (int j = 0; j < hs; j++)
            out[j] += att[t] * page_at(v, t, j);
}

void sl_cpu_attention_multi(int nq, float *const *outs, const float *const *qs, const int *n_ctx,
                            const struct sl_cpu_pages *k, const struct sl_cpu_pages *v, int hs,
                            float *att, size_t att_stride)
{
#if SL_CPU_HAVE_AVX2
    if (AVX512() && nq > 1 && hs % 2 == 0 && hs <= SL_CPU_AVX512_ATTN_HS) {
        sl_cpu_avx512_attention_multi(nq, outs, qs, n_ctx, k, v, hs, att, att_stride);
        return;
    }
    if (AVX2()) {
        sl_cpu_avx2_attention_multi(nq, outs, qs, n_ctx, k, v, hs, att, att_stride);
        return;
    }
#endif
    for (int i = 0; i < nq; i++)
        sl_cpu_attention(outs[i], qs[i], k, v, n_ctx[i], hs, att + (size_t)i * att_stride);
}

void sl_cpu_attention_row(float *out, const float *q, int n_heads, int n_kv_heads,
                          const struct sl_cpu_pages *k, const struct sl_cpu_pages *v, int n_ctx,
                          int hs, float *att, size_t att_stride)
{
#if SL_CPU_HAVE_AVX2
    if (AVX2() && hs % 8 == 0) {
        PAIRED(attention_row)(out, q, n_heads, n_kv_heads, k, v, n_ctx, hs, att, att_stride);
        return;
    }
#else
    (void)att_stride;
#endif
    /* Head by head: the same bits, each head's rows a page_size · hs block further in. */
    int kv_mul = n_heads / n_kv_heads;
    size_t head = (size_t)k->page_size * (size_t)hs * sl_dtype_row_bytes(k->type, 1);
    for (int h = 0; h < n_heads; h++) {
        struct sl_cpu_pages kh = *k, vh = *v;
        kh.base = (const char *)k->base + (size_t)(h / kv_mul) * head;
        vh.base = (const char *)v->base + (size_t)(h / kv_mul) * head;
        sl_cpu_attention(out + (size_t)h * hs, q + (size_t)h * hs, &kh, &vh, n_ctx, hs, att);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Thread pool: one job at a time. The caller publishes the job and bumps a generation counter;
 * workers spin on the counter for a while (jobs come every few microseconds during a forward),
 * then sleep on a condition variable. The caller runs part 0 itself and spins until the others
 * are done.
 */

#define SPIN_NS 300000 /* how long an idle worker spins before it sleeps */

struct sl_cpu_pool {
    int n_threads; /* including the caller */
    pthread_t *tids;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    _Atomic unsigned gen;
    _Atomic int pending;  /* workers still running the current job */
    _Atomic int sleepers; /* workers blocked on wake */
    _Atomic bool quit;
    int n_pinned; /* pool threads pinned to one CPU each */
    /* With pin: the CPU the calling thread is pinned to while it uses the pool (-1: none), the
     * thread last pinned so and the mask it had before. */
    int caller_cpu;
    bool caller_set, caller_home;
    pthread_t caller;
    cpu_set_t caller_old;
    void (*fn)(void *arg, int ith, int nth); /* the current job; read after gen is seen */
    void *arg;
    /* A matmul job's x packed whole (sl_cpu_pool_reserve): by all threads into pack when its
     * rows are many, by each thread into its own own[ith] when they are few. */
    float *pack, **own;
    size_t pack_floats, own_floats;
    /* Quantized weights with 8-bit activations (sl_cpu_pool_set_int8), and room for a job's x
     * quantized once, in up to two kinds of blocks (sl_cpu_pool_reserve). */
    bool int8;
    void *qbuf[2];
    size_t qbuf_bytes;
};

struct pool_arg {
    struct sl_cpu_pool *p;
    int ith;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *pool_main(void *arg)
{
    struct pool_arg *a = arg;
    struct sl_cpu_pool *p = a->p;
    int ith = a->ith;
    free(a);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        uint64_t t0 = 0;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&p->quit, memory_order_relaxed)) {
            cpu_relax();
            if (++spins % 256)
                continue;
            uint64_t now = sl_clock_ns();
            if (!t0) {
                t0 = now;
            } else if (now - t0 > SPIN_NS) {
                /* The caller bumps gen before it reads sleepers, and we count ourselves before
                 * we re-read gen (both seq_cst): one of us sees the other, so no wake-up is
                 * lost. */
                pthread_mutex_lock(&p->mu);
                atomic_fetch_add(&p->sleepers, 1);
                while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit))
                    pthread_cond_wait(&p->wake, &p->mu);
                atomic_fetch_sub(&p->sleepers, 1);
                pthread_mutex_unlock(&p->mu);
                t0 = 0;
            }
        }
        if (atomic_load(&p->quit))
            break;
        seen = g;
        p->fn(p->arg, ith, p->n_threads);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

/* The mask a thread had before a pool pinned it as its caller: a pool it creates meanwhile sizes
 * itself by that and gives it to its unpinned threads, rather than the one CPU the thread is on. */
static _Thread_local struct {
    bool set;
    cpu_set_t mask;
} home;

struct sl_cpu_pool *sl_cpu_pool_new(int threads, bool pin)
{
    /* The CPUs this thread may run on, in order: its own mask, or the one it had before a pool
     * pinned it. */
    cpu_set_t allowed;
    int cpus[CPU_SETSIZE], n_cpus = 0;
    if (home.set)
        allowed = home.mask;
    else if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        CPU_ZERO(&allowed); /* unknown: no CPU to pin to, one thread per online CPU */
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed))
            cpus[n_cpus++] = c;
    if (threads <= 0) {
        long n = n_cpus > 0 ? n_cpus : sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    pin = pin && threads >= 2 && threads <= n_cpus;
    struct sl_cpu_pool *p = sl_xcalloc(1, sizeof(*p));
    p->n_threads = threads;
    p->caller_cpu = pin ? cpus[0] : -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->tids = sl_xcalloc((size_t)threads, sizeof(pthread_t));
    for (int i = 1; i < threads; i++) {
        struct pool_arg *a = sl_xmalloc(sizeof(*a));
        a->p = p;
        a->ith = i;
        /* Pinned: its CPU. Otherwise the caller's mask, which it would inherit anyway but for
         * a pin of the caller by another pool. */
        pthread_attr_t attr;
        bool pinned = false;
        int rc = pthread_attr_init(&attr);
        if (rc == 0 && pin) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[i], &one);
            pinned = pthread_attr_setaffinity_np(&attr, sizeof one, &one) == 0;
        } else if (rc == 0 && home.set) {
            pthread_attr_setaffinity_np(&attr, sizeof allowed, &allowed);
        }
        bool attr_ok = rc == 0;
        rc = attr_ok ? pthread_create(&p->tids[i], &attr, pool_main, a) : rc;
        if (rc != 0) /* a CPU the system would not give: start it as the caller's */
            rc = pthread_create(&p->tids[i], NULL, pool_main, a), pinned = false;
        if (attr_ok)
            pthread_attr_destroy(&attr);
        if (rc != 0) {
            free(a);
            p->n_threads = i; /* join only those started */
            sl_cpu_pool_free(p);
            return NULL;
        }
        p->n_pinned += pinned;
    }
    return p;
}

void sl_cpu_pool_free(struct sl_cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++)
        pthread_join(p->tids[i], NULL);
    /* The caller's own mask back, when it is the caller that frees the pool (another thread's
     * may have ended). */
    if (p->caller_set && pthread_equal(p->caller, pthread_self())) {
        pthread_setaffinity_np(pthread_self(), sizeof p->caller_old, &p->caller_old);
        if (p->caller_home)
            home.set = false;
    }
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->tids);
    free(p->pack);
    free(p->qbuf[0]);
    free(p->qbuf[1]);
    for (int i = 0; p->own && i < p->n_threads; i++)
        free(p->own[i]);
    free(p->own);
    free(p);
}

#if SL_CPU_HAVE_AVX512
/* *buf := room for `floats` (64-byte aligned) unless it has as much; false when out of memory. */
static bool grow(float **buf, size_t *have, size_t floats)
{
    if (floats <= *have)
        return true;
    void *m = NULL;
    if (floats > SIZE_MAX / sizeof(float) || posix_memalign(&m, 64, floats * sizeof(float)) != 0)
        return false;
    free(*buf);
    *buf = m;
    *have = floats;
    return true;
}
#endif

/* Bytes of rows quantized activations of cols values, enough for either kind. */
static size_t qbuf_need(int rows, int cols)
{
    size_t c = (size_t)cols;
    return (size_t)rows * (c + 4 * (c / 32 + 1) + 2 * (c / 16 + 1) + 32);
}

void sl_cpu_pool_set_int8(struct sl_cpu_pool *p, bool on)
{
    if (p)
        p->int8 = on;
}

bool sl_cpu_pool_int8(const struct sl_cpu_pool *p)
{
    return p && p->int8;
}

enum sl_status sl_cpu_pool_reserve(struct sl_cpu_pool *p, int rows, int cols)
{
    if (!p || rows < 1 || cols < 1)
        return SL_EINVAL;
    size_t qneed = qbuf_need(rows, cols);
    if (qneed > p->qbuf_bytes) {
        for (int i = 0; i < 2; i++) {
            void *m = NULL;
            if (posix_memalign(&m, 64, qneed) != 0)
                return SL_ENOMEM; /* both still hold qbuf_bytes */
            free(p->qbuf[i]);
            p->qbuf[i] = m;
        }
        p->qbuf_bytes = qneed;
    }
#if SL_CPU_HAVE_AVX512
    int few = rows < SL_CPU_AVX512_ROWS ? rows : SL_CPU_AVX512_ROWS;
    size_t own = sl_cpu_avx512_pack_floats(few, cols);
    if (!p->own)
        p->own = sl_xcalloc((size_t)p->n_threads, sizeof(float *));
    for (int i = 0; i < p->n_threads; i++) {
        size_t have = p->own_floats;
        if (!grow(&p->own[i], &have, own))
            return SL_ENOMEM; /* every buffer still holds own_floats */
    }
    p->own_floats = own > p->own_floats ? own : p->own_floats;
    if (rows > SL_CPU_AVX512_ROWS &&
        !grow(&p->pack, &p->pack_floats, sl_cpu_avx512_pack_floats(rows, cols)))
        return SL_ENOMEM;
#endif
    return SL_OK;
}

int sl_cpu_pool_threads(const struct sl_cpu_pool *p)
{
    return p ? p->n_threads : 1;
}

int sl_cpu_pool_pinned(const struct sl_cpu_pool *p)
{
    return p ? p->n_pinned : 0;
}

/* The calling thread onto the pool's caller CPU, its mask kept for sl_cpu_pool_free (a thread
 * that takes over a pool from another leaves that one's mask as it is), and as its home while
 * none is (see home). */
static void pin_caller(struct sl_cpu_pool *p)
{
    cpu_set_t one, old;
    CPU_ZERO(&one);
    CPU_SET(p->caller_cpu, &one);
    if (pthread_getaffinity_np(pthread_self(), sizeof old, &old) != 0 ||
        pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) {
        p->caller_cpu = -1; /* refused: run unpinned from now on */
        return;
    }
    p->caller = pthread_self();
    p->caller_old = old;
    p->caller_set = true;
    p->caller_home = !home.set; /* this pool's pin is the thread's first: it keeps the home */
    if (p->caller_home) {
        home.mask = old;
        home.set = true;
    }
}

void sl_cpu_pool_run(struct sl_cpu_pool *p, void (*fn)(void *arg, int ith, int nth), void *arg)
{
    if (!p || p->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    if (p->caller_cpu >= 0 && !(p->caller_set && pthread_equal(p->caller, pthread_self())))
        pin_caller(p);
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* seq_cst: publishes fn, arg and pending */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    fn(arg, 0, p->n_threads);
    /* On a busy machine a worker may be descheduled; yield rather than burn its core. */
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        cpu_relax();
        if (spins > 20000)
            sched_yield();
    }
}

int sl_cpu_grab(_Atomic int *next, int total, int nth, int min_chunk, int *end)
{
    int cur = atomic_load_explicit(next, memory_order_relaxed), hi;
    do {
        if (cur >= total)
            return total;
        int chunk = (total - cur) / (2 * nth);
        chunk = chunk > min_chunk ? chunk : min_chunk;
        hi = total - cur < chunk ? total : cur + chunk;
    } while (!atomic_compare_exchange_weak_explicit(next, &cur, hi, memory_order_relaxed,
                                                    memory_order_relaxed));
    *end = hi;
    return cur;
}

/* ---------------------------------------------------------------------------------------------
 * Matmuls split by weight rows
 */

/* Work is handed out in chunks of whole 12-row units (3- and 4-row register tiles) from a shared
 * counter rather than split evenly up front: on a machine shared with other processes a thread
 * may lose its core for a time slice, and the others then take its chunks instead of waiting.
 * Chunks shrink as the job drains (sl_cpu_grab), so the threads finish within a unit of each
 * other. Which thread computes a row never changes its value. */
#define ROW_ALIGN 12

struct mm_job {
    int count;
    float *outs[4];
    struct sl_mat ws[4];
    const float *x;
    int n;
    float *gate_h; /* swiglu: h (n, rows) gated by outs[1] after both are computed */
    /* With int8 (the pool's choice), each quantized matrix m multiplies 8-bit activations: x
     * quantized once into qa[m] (shared by the matrices of one kind), or by each call for the
     * rows it uses where the pool has no room (qa[m] NULL). */
    bool int8;
    const void *qa[4];
    int total; /* rows to compute: all matrices end to end, or the gated width */
    /* x packed whole (AVX-512, see cpu_impl.h), in units: into xp by all threads together, or
     * (own, not NULL) by each thread into own[ith]; neither: each call packs what it uses. */
    float *xp, *const *own;
    int pack_units;
    _Atomic int pack_next, pack_done; /* units of xp claimed, and packed */
    _Atomic int next;                 /* next unit to hand out */
};

/* Integer matmul of rows [0, n) of x against columns [d0, d1) of w, quantizing each row here:
 * the same bits as quantizing x whole first (a row's quantization depends on the row alone). */
static void matmul_q_rows(float *out, const float *x, const struct sl_mat *w, int n, int d0, int d1)
{
    enum sl_qact kind = sl_cpu_qact_kind(w->type);
    size_t rb = sl_cpu_qact_row_bytes(kind, w->cols);
    _Alignas(64) unsigned char buf[16384 + 4096];
    int per = rb <= sizeof buf ? (int)(sizeof buf / rb) : 0;
    if (per == 0) {
        /* A row longer than the stack buffer: the heap, once per call. */
        void *m = NULL;
        if (posix_memalign(&m, 64, rb) != 0)
            abort();
        for (int r = 0; r < n; r++) {
            sl_cpu_qact_quantize(kind, m, x + (size_t)r * w->cols, 1, w->cols);
            sl_cpu_matmul_q_cols(out + (size_t)r * w->rows, m, w, 1, d0, d1);
        }
        free(m);
        return;
    }
    for (int r = 0; r < n; r += per) {
        int c = n - r < per ? n - r : per;
        sl_cpu_qact_quantize(kind, buf, x + (size_t)r * w->cols, c, w->cols);
        sl_cpu_matmul_q_cols(out + (size_t)r * w->rows, buf, w, c, d0, d1);
    }
}

/* Columns [a, b) of matrix m of job j. */
static void mm_cols(const struct mm_job *j, const float *xp, int m, float *out, int a, int b)
{
    const struct sl_mat *w = &j->ws[m];
    if (j->int8 && sl_dtype_quantized(w->type)) {
        if (j->qa[m])
            sl_cpu_matmul_q_cols(out, j->qa[m], w, j->n, a, b);
        else
            matmul_q_rows(out, j->x, w, j->n, a, b);
        return;
    }
    matmul_cols_p(out, j->x, xp, w, j->n, a, b);
}

static void mm_range(const struct mm_job *j, const float *xp, int lo, int hi)
{
    if (j->gate_h) {
        /* Both matrices have the same rows: take the same columns of each, then gate them. */
        int hid = j->ws[0].rows;
        mm_cols(j, xp, 0, j->gate_h, lo, hi);
        mm_cols(j, xp, 1, j->outs[1], lo, hi);
        for (int r = 0; r < j->n; r++)
            sl_cpu_swiglu(j->gate_h + (size_t)r * hid + lo, j->outs[1] + (size_t)r * hid + lo,
                          hi - lo);
        return;
    }
    int off = 0;
    for (int m = 0; m < j->count; m++) {
        int rows = j->ws[m].rows;
        int a = lo > off ? lo - off : 0, b = hi - off < rows ? hi - off : rows;
        if (a < b)
            mm_cols(j, xp, m, j->outs[m], a, b);
        off += rows;
    }
}

/* Thread ith's packed x for job j, packed now: its own (all units), or its share of the common
 * one, returned once every unit is in; NULL where the job packs call by call. */
static const float *mm_pack(struct mm_job *j, int ith)
{
#if SL_CPU_HAVE_AVX512
    int k = j->ws[0].cols;
    if (j->own) {
        for (int u = 0; u < j->pack_units; u++)
            sl_cpu_avx512_pack_unit(j->own[ith], j->x, j->n, k, u);
        return j->own[ith];
    }
    if (!j->xp)
        return NULL;
    for (int u;
         (u = atomic_fetch_add_explicit(&j->pack_next, 1, memory_order_relaxed)) < j->pack_units;) {
        sl_cpu_avx512_pack_unit(j->xp, j->x, j->n, k, u);
        atomic_fetch_add_explicit(&j->pack_done, 1, memory_order_release);
    }
    while (atomic_load_explicit(&j->pack_done, memory_order_acquire) < j->pack_units)
        cpu_relax();
    return j->xp;
#else
    (void)j;
    (void)ith;
    return NULL;
#endif
}

static void mm_task(void *arg, int ith, int nth)
{
    struct mm_job *j = arg;
    int units = (j->total + ROW_ALIGN - 1) / ROW_ALIGN, end;
    const float *xp = mm_pack(j, ith);
    /* Chunks of at least 48 columns for the AVX-512 matmul: with x packed for the job, smaller
     * ones only add calls; without (a pool with no reserve), each call packs the rows it uses, a
     * cost against its columns (on one thread, a 12-column call of a 256-row prompt ran at 0.65
     * of a 96-column one, 48 columns at 0.92; 96 columns balanced worse). */
    int min_units = AVX512() && j->n > 2 ? 4 : 1;
    for (int u; (u = sl_cpu_grab(&j->next, units, nth, min_units, &end)) < units;) {
        int hi = end * ROW_ALIGN;
        mm_range(j, xp, u * ROW_ALIGN, hi < j->total ? hi : j->total);
    }
}

/* With the pool's int8: x quantized once for each kind of block the job's matrices take, into
 * the pool's room when it has enough. */
static void mm_quantize(struct sl_cpu_pool *p, struct mm_job *j)
{
    j->int8 = p && p->int8;
    if (!j->int8)
        return;
    int count = j->gate_h ? 2 : j->count, k = j->ws[0].cols, used = 0;
    enum sl_qact kinds[2] = {SL_QACT_NONE, SL_QACT_NONE};
    for (int m = 0; m < count; m++) {
        enum sl_qact kind = sl_cpu_qact_kind(j->ws[m].type);
        if (kind == SL_QACT_NONE)
            continue;
        int slot = 0;
        while (slot < used && kinds[slot] != kind)
            slot++;
        if (slot == used) {
            if (qbuf_need(j->n, k) > p->qbuf_bytes)
                continue; /* quantized call by call */
            kinds[used++] = kind;
            sl_cpu_qact_quantize(kind, p->qbuf[slot], j->x, j->n, k);
        }
        j->qa[m] = p->qbuf[slot];
    }
}

static void mm_dispatch(struct sl_cpu_pool *p, struct mm_job *j, int rows_work, int k)
{
    int units = (j->total + ROW_ALIGN - 1) / ROW_ALIGN;
    int nth = sl_cpu_pool_threads(p);
    mm_quantize(p, j);
#if SL_CPU_HAVE_AVX512
    /* x packed once for the job rather than by each call (each chunk a thread takes, each
     * matrix) for the rows it uses. A decode batch (one row block) is packed by every thread
     * for itself: read from another core's cache, a common pack made a hot 32 × 288 × 864
     * product 7 % slower (58-60 against 63-65 µs, two threads); a prompt's rows are many, and
     * their units are shared out. */
    if (AVX512() && j->n > 2 && p) {
        size_t need = sl_cpu_avx512_pack_floats(j->n, k);
        if (j->n <= SL_CPU_AVX512_ROWS && p->own && need <= p->own_floats)
            j->own = p->own;
        else if (j->n > SL_CPU_AVX512_ROWS && p->pack && need <= p->pack_floats)
            j->xp = p->pack;
        j->pack_units = sl_cpu_avx512_pack_units(j->n, k);
        atomic_store_explicit(&j->pack_next, 0, memory_order_relaxed);
        atomic_store_explicit(&j->pack_done, 0, memory_order_relaxed);
    }
#endif
    /* Below about a hundred thousand multiply-adds a dispatch costs more than it saves. */
    if (nth == 1 || (int64_t)j->n * rows_work * k < 100000 || units < 2) {
        mm_range(j, mm_pack(j, 0), 0, j->total);
        return;
    }
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    sl_cpu_pool_run(p, mm_task, j);
}

void sl_cpu_matmul_multi_mt(struct sl_cpu_pool *p, int count, float *const *outs, const float *x,
                            const struct sl_mat *ws, int n)
{
    struct mm_job j = {.count = count, .x = x, .n = n};
    for (int m = 0; m < count && m < 4; m++) {
        j.outs[m] = outs[m];
        j.ws[m] = ws[m];
        j.total += ws[m].rows;
    }
    mm_dispatch(p, &j, j.total, ws[0].cols);
}

void sl_cpu_matmul_mt(struct sl_cpu_pool *p, float *out, const float *x, const struct sl_mat *w,
                      int n)
{
    sl_cpu_matmul_multi_mt(p, 1, &out, x, w, n);
}

void sl_cpu_matmul_swiglu_mt(struct sl_cpu_pool *p, float *h, float *g, const float *x,
                             const struct sl_mat *w1, const struct sl_mat *w3, int n)
{
    struct mm_job j = {.count = 2, .x = x, .n = n, .gate_h = h, .total = w1->rows};
    j.outs[0] = h;
    j.outs[1] = g;
    j.ws[0] = *w1;
    j.ws[1] = *w3;
    mm_dispatch(p, &j, 2 * w1->rows, w1->cols);
}

/* ---------------------------------------------------------------------------------------------
 * Machine figures
 */

struct read_job {
    const float *buf;
    size_t floats;
    float sums[64];
};

static void read_task(void *arg, int ith, int nth)
{
    struct read_job *j = arg;
    /* Whole 64-float (256-byte) pieces per thread. */
    size_t units = j->floats / 64;
    size_t a = units * (size_t)ith / (size_t)nth * 64, b = units * (size_t)(ith + 1) / nth * 64;
    float s = 0.0f;
#if SL_CPU_HAVE_AVX2
    if (AVX2()) {
        s = sl_cpu_avx2_bench_read(j->buf + a, b - a);
        j->sums[ith % 64] = s;
        return;
    }
#endif
    float s4[4] = {0};
    for (size_t i = a; i < b; i += 4)
        for (int l = 0; l < 4; l++)
            s4[l] += j->buf[i + (size_t)l];
    s = s4[0] + s4[1] + s4[2] + s4[3];
    j->sums[ith % 64] = s;
}

float sl_cpu_bench_read(struct sl_cpu_pool *p, const float *buf, size_t bytes)
{
    struct read_job j = {.buf = buf, .floats = bytes / sizeof(float)};
    sl_cpu_pool_run(p, read_task, &j);
    float s = 0.0f;
    for (int i = 0; i < 64; i++)
        s += j.sums[i];
    return s;
}

struct fma_job {
    long iters;
    double flops[64];
};

static void fma_task(void *arg, int ith, int nth)
{
    (void)nth;
    struct fma_job *j = arg;
#if SL_CPU_HAVE_AVX2
    if (AVX512()) {
        j->flops[ith % 64] = sl_cpu_avx512_bench_fma(j->iters);
        return;
    }
    if (AVX2()) {
        j->flops[ith % 64] = sl_cpu_avx2_bench_fma(j->iters);
        return;
    }
#endif
    j->flops[ith % 64] = 0;
}

double sl_cpu_bench_fma(struct sl_cpu_pool *p, long iters)
{
    struct fma_job j = {.iters = iters};
    sl_cpu_pool_run(p, fma_task, &j);
    double f = 0;
    for (int i = 0; i < 64; i++)
        f += j.flops[i];
    return f;
}
