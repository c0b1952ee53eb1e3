/* Block-quantized weights (Q4_0 and the K-quants next to Q8_0): their layouts decoded 32 values
 * at a time, rows quantized into them, and the integer matmul of 8-bit activations (kernels.h,
 * "Integer matmul"): the scalar reference, which the AVX2 version (avx2q.c) matches bit for bit.
 */
#include "cpu_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint16_t rd16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static float h2f(const unsigned char *p)
{
    return sl_cpu_f16_to_f32(rd16(p));
}

static void wr16(unsigned char *p, uint16_t v)
{
    memcpy(p, &v, sizeof(v));
}

/* ---------------------------------------------------------------------------------------------
 * Layouts
 */

size_t sl_cpu_block_bytes(enum sl_dtype t)
{
    switch (t) {
    case SL_DTYPE_F32: return 4;
    case SL_DTYPE_F16:
    case SL_DTYPE_BF16: return 2;
    case SL_DTYPE_Q8_0: return SL_Q8_0_BYTES;
    case SL_DTYPE_Q4_0: return SL_Q4_0_BYTES;
    case SL_DTYPE_Q4_K: return SL_Q4_K_BYTES;
    case SL_DTYPE_Q5_K: return SL_Q5_K_BYTES;
    case SL_DTYPE_Q6_K: return SL_Q6_K_BYTES;
    }
    return 0;
}

void sl_cpu_k_scale_min(const unsigned char *scales, int s, int *sc, int *m)
{
    if (s < 4) {
        *sc = scales[s] & 63;
        *m = scales[s + 4] & 63;
    } else {
        *sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4;
        *m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4;
    }
}

/* The 32 quants of sub-block s (0..7) of a Q4_K or Q5_K super-block, unsigned (0..15, 0..31). */
static void k_quants32(enum sl_dtype t, const unsigned char *blk, int s, uint8_t *q)
{
    const unsigned char *qs = blk + (t == SL_DTYPE_Q4_K ? 16 : 48) + 32 * (s / 2);
    for (int l = 0; l < 32; l++)
        q[l] = s % 2 ? qs[l] >> 4 : qs[l] & 15;
    if (t == SL_DTYPE_Q5_K)
        for (int l = 0; l < 32; l++)
            q[l] |= (uint8_t)(((blk[16 + l] >> s) & 1) << 4);
}

/* The 32 quants of slice j (0..7, values 32j .. 32j + 32) of a Q6_K super-block, unsigned
 * (0..63; the value is q - 32). */
static void q6_quants32(const unsigned char *blk, int j, uint8_t *q)
{
    int h = j / 4, part = j % 4;
    const unsigned char *ql = blk + 64 * h + (part % 2) * 32, *qh = blk + 128 + 32 * h;
    for (int l = 0; l < 32; l++) {
        int lo = part < 2 ? ql[l] & 15 : ql[l] >> 4;
        q[l] = (uint8_t)(lo | ((qh[l] >> (2 * part)) & 3) << 4);
    }
}

void sl_cpu_dequant32(enum sl_dtype t, const unsigned char *row, int j, float *out)
{
    switch (t) {
    case SL_DTYPE_F32: memcpy(out, row + 4 * (size_t)j, 32 * sizeof(float)); return;
    case SL_DTYPE_F16:
        for (int i = 0; i < 32; i++)
            out[i] = h2f(row + 2 * (size_t)(j + i));
        return;
    case SL_DTYPE_BF16:
        for (int i = 0; i < 32; i++)
            out[i] = sl_cpu_bf16_to_f32(rd16(row + 2 * (size_t)(j + i)));
        return;
    case SL_DTYPE_Q8_0: {
        const unsigned char *b = row + (size_t)(j / 32) * SL_Q8_0_BYTES;
        float d = h2f(b);
        for (int i = 0; i < 32; i++)
            out[i] = d * (float)(int8_t)b[2 + i];
        return;
    }
    case SL_DTYPE_Q4_0: {
        const unsigned char *b = row + (size_t)(j / 32) * SL_Q4_0_BYTES;
        float d = h2f(b);
        for (int i = 0; i < 16; i++) {
            out[i] = d * (float)((b[2 + i] & 15) - 8);
            out[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
        }
        return;
    }
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K: {
        const unsigned char *b = row + (size_t)(j / SL_QK_BLOCK) * sl_cpu_block_bytes(t);
        int s = (j % SL_QK_BLOCK) / 32, sc, m;
        sl_cpu_k_scale_min(b + 4, s, &sc, &m);
        float d1 = h2f(b) * (float)sc, m1 = h2f(b + 2) * (float)m;
        uint8_t q[32];
        k_quants32(t, b, s, q);
        for (int i = 0; i < 32; i++)
            out[i] = d1 * (float)q[i] - m1;
        return;
    }
    case SL_DTYPE_Q6_K: {
        const unsigned char *b = row + (size_t)(j / SL_QK_BLOCK) * SL_Q6_K_BYTES;
        int s = (j % SL_QK_BLOCK) / 32;
        float d = h2f(b + 208);
        float d0 = d * (float)(int8_t)b[192 + 2 * s], d1 = d * (float)(int8_t)b[193 + 2 * s];
        uint8_t q[32];
        q6_quants32(b, s, q);
        for (int i = 0; i < 32; i++)
            out[i] = (i < 16 ? d0 : d1) * (float)(q[i] - 32);
        return;
    }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Quantizing rows of weights (synthetic models, tests). Straightforward rules, not llama.cpp's
 * error-minimising searches: each block's scales from its extremes, rounded to nearest.
 */

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Q4_0: d = v / -8 for the value v of largest magnitude (so it maps to -8 exactly), q = round(v
 * / d) + 8 clamped to 0..15. */
static void quantize_q4_0(unsigned char *o, const float *s)
{
    float amax = 0.0f, vmax = 0.0f;
    for (int i = 0; i < 32; i++)
        if (fabsf(s[i]) > amax) {
            amax = fabsf(s[i]);
            vmax = s[i];
        }
    float d = vmax / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    wr16(o, sl_cpu_f32_to_f16(d));
    for (int i = 0; i < 16; i++) {
        int a = clampi((int)lrintf(s[i] * id) + 8, 0, 15);
        int b = clampi((int)lrintf(s[i + 16] * id) + 8, 0, 15);
        o[2 + i] = (unsigned char)(a | b << 4);
    }
}

/* Q4_K and Q5_K (levels 15 or 31): each sub-block of 32 spans [lo, hi] with lo <= 0, so
 * value = sc' · q - m' with sc' = (hi - lo) / levels and m' = -lo; the eight sc' and m' are
 * rounded to 6 bits against d = max sc' / 63 and dmin = max m' / 63, and the quants are taken
 * against the rounded ones. */
static void quantize_k45(enum sl_dtype t, unsigned char *o, const float *s)
{
    int levels = t == SL_DTYPE_Q4_K ? 15 : 31;
    float scale[8], min[8], smax = 0.0f, mmax = 0.0f;
    for (int b = 0; b < 8; b++) {
        float lo = 0.0f, hi = 0.0f;
        for (int i = 0; i < 32; i++) {
            lo = fminf(lo, s[32 * b + i]);
            hi = fmaxf(hi, s[32 * b + i]);
        }
        scale[b] = (hi - lo) / (float)levels;
        min[b] = -lo;
        smax = fmaxf(smax, scale[b]);
        mmax = fmaxf(mmax, min[b]);
    }
    float d = smax / 63.0f, dmin = mmax / 63.0f;
    uint16_t dh = sl_cpu_f32_to_f16(d), mh = sl_cpu_f32_to_f16(dmin);
    d = sl_cpu_f16_to_f32(dh);
    dmin = sl_cpu_f16_to_f32(mh);
    memset(o, 0, sl_cpu_block_bytes(t));
    wr16(o, dh);
    wr16(o + 2, mh);
    unsigned char *sc = o + 4;
    int isc[8], im[8];
    for (int b = 0; b < 8; b++) {
        isc[b] = d > 0.0f ? clampi((int)lrintf(scale[b] / d), 0, 63) : 0;
        im[b] = dmin > 0.0f ? clampi((int)lrintf(min[b] / dmin), 0, 63) : 0;
    }
    for (int b = 0; b < 4; b++) {
        sc[b] = (unsigned char)(isc[b] | (isc[b + 4] >> 4) << 6);
        sc[b + 4] = (unsigned char)(im[b] | (im[b + 4] >> 4) << 6);
        sc[b + 8] = (unsigned char)((isc[b + 4] & 15) | (im[b + 4] & 15) << 4);
    }
    unsigned char *qh = o + 16, *qs = o + (t == SL_DTYPE_Q4_K ? 16 : 48);
    for (int b = 0; b < 8; b++) {
        float d1 = d * (float)isc[b], m1 = dmin * (float)im[b];
        float id = d1 > 0.0f ? 1.0f / d1 : 0.0f;
        for (int i = 0; i < 32; i++) {
            int q = clampi((int)lrintf((s[32 * b + i] + m1) * id), 0, levels);
            qs[32 * (b / 2) + i] |= (unsigned char)((q & 15) << (b % 2 ? 4 : 0));
            if (t == SL_DTYPE_Q5_K)
                qh[i] |= (unsigned char)((q >> 4) << b);
        }
    }
}

/* Q6_K: each sub-block of 16 has scale v / -32 for its value v of largest magnitude; the
 * sixteen are rounded to int8 against d = (their largest magnitude) / 127. */
static void quantize_q6_k(unsigned char *o, const float *s)
{
    float scale[16], smax = 0.0f;
    for (int g = 0; g < 16; g++) {
        float amax = 0.0f, vmax = 0.0f;
        for (int i = 0; i < 16; i++)
            if (fabsf(s[16 * g + i]) > amax) {
                amax = fabsf(s[16 * g + i]);
                vmax = s[16 * g + i];
            }
        scale[g] = vmax / -32.0f;
        smax = fmaxf(smax, fabsf(scale[g]));
    }
    float d = smax / 127.0f;
    uint16_t dh = sl_cpu_f32_to_f16(d);
    d = sl_cpu_f16_to_f32(dh);
    memset(o, 0, SL_Q6_K_BYTES);
    wr16(o + 208, dh);
    int isc[16];
    for (int g = 0; g < 16; g++) {
        isc[g] = d > 0.0f ? clampi((int)lrintf(scale[g] / d), -127, 127) : 0;
        o[192 + g] = (unsigned char)(int8_t)isc[g];
    }
    for (int v = 0; v < 256; v++) {
        float dv = d * (float)isc[v / 16], id = dv != 0.0f ? 1.0f / dv : 0.0f;
        int q = clampi((int)lrintf(s[v] * id), -32, 31) + 32;
        int h = v / 128, part = (v % 128) / 32, l = v % 32;
        unsigned char *ql = o + 64 * h + (part % 2) * 32 + l, *qh = o + 128 + 32 * h + l;
        *ql |= (unsigned char)((q & 15) << (part < 2 ? 0 : 4));
        *qh |= (unsigned char)((q >> 4) << (2 * part));
    }
}

void sl_cpu_quantize_blocks(enum sl_dtype t, unsigned char *dst, const float *src, int cols)
{
    int blk = sl_dtype_block(t);
    size_t bb = sl_cpu_block_bytes(t);
    for (int b = 0; b < cols / blk; b++) {
        const float *s = src + (size_t)b * blk;
        unsigned char *o = dst + (size_t)b * bb;
        switch (t) {
        case SL_DTYPE_Q4_0: quantize_q4_0(o, s); break;
        case SL_DTYPE_Q4_K:
        case SL_DTYPE_Q5_K: quantize_k45(t, o, s); break;
        case SL_DTYPE_Q6_K: quantize_q6_k(o, s); break;
        default: break;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * 8-bit activations
 */

enum sl_qact sl_cpu_qact_kind(enum sl_dtype t)
{
    switch (t) {
    case SL_DTYPE_Q8_0:
    case SL_DTYPE_Q4_0: return SL_QACT_32;
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K:
    case SL_DTYPE_Q6_K: return SL_QACT_256;
    default: return SL_QACT_NONE;
    }
}

static int qact_block(enum sl_qact kind)
{
    return kind == SL_QACT_256 ? SL_QK_BLOCK : 32;
}

size_t sl_cpu_qact_row_bytes(enum sl_qact kind, int cols)
{
    if (kind == SL_QACT_NONE || cols < 1 || cols % qact_block(kind))
        return 0;
    size_t b = (size_t)cols + sizeof(float) * (size_t)(cols / qact_block(kind));
    if (kind == SL_QACT_256)
        b += sizeof(int16_t) * (size_t)(cols / 16);
    return (b + 31) & ~(size_t)31;
}

struct sl_cpu_qrow sl_cpu_qrow(enum sl_qact kind, const void *qa, int cols, int r)
{
    return sl_cpu_qrow_at(
        kind, (const unsigned char *)qa + (size_t)r * sl_cpu_qact_row_bytes(kind, cols), cols);
}

/* One block of bs values: d = max|v| / 127, q = round-half-even(v · (127 / max|v|)). */
void sl_cpu_qact_block_scalar(const float *x, int bs, int8_t *q, float *d)
{
    float amax = 0.0f;
    for (int i = 0; i < bs; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    for (int i = 0; i < bs; i++)
        q[i] = (int8_t)lrintf(x[i] * id);
}

void sl_cpu_qact_sums(const int8_t *q, int16_t *s, int cols)
{
    for (int g = 0; g < cols / 16; g++) {
        int sum = 0;
        for (int i = 0; i < 16; i++)
            sum += q[16 * g + i];
        s[g] = (int16_t)sum;
    }
}

void sl_cpu_qact_quantize(enum sl_qact kind, void *qa, const float *x, int n, int cols)
{
#if SL_CPU_HAVE_AVX2
    if (sl_cpu_isa() >= SL_CPU_ISA_AVX2) {
        sl_cpu_avx2_qact_quantize(kind, qa, x, n, cols);
        return;
    }
#endif
    int bs = qact_block(kind);
    for (int r = 0; r < n; r++) {
        struct sl_cpu_qrow q = sl_cpu_qrow(kind, qa, cols, r);
        const float *xr = x + (size_t)r * cols;
        for (int b = 0; b < cols / bs; b++)
            sl_cpu_qact_block_scalar(xr + (size_t)b * bs, bs, (int8_t *)q.q + (size_t)b * bs,
                                     (float *)q.d + b);
        if (kind == SL_QACT_256)
            sl_cpu_qact_sums(q.q, (int16_t *)q.s, cols);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Integer dot products, one unit at a time (kernels.h gives the arithmetic)
 */

/* Up to 8 blocks of 32 (Q8_0 or Q4_0) from block b of a weight row against x's blocks. */
static float unit32(enum sl_dtype t, const unsigned char *row, struct sl_cpu_qrow x, int b, int nb)
{
    float p[8] = {0};
    for (int i = 0; i < nb; i++) {
        int32_t s = 0;
        const int8_t *xq = x.q + 32 * (size_t)(b + i);
        if (t == SL_DTYPE_Q8_0) {
            const unsigned char *w = row + (size_t)(b + i) * SL_Q8_0_BYTES;
            for (int l = 0; l < 32; l++)
                s += (int8_t)w[2 + l] * xq[l];
            p[i] = (h2f(w) * x.d[b + i]) * (float)s;
        } else {
            const unsigned char *w = row + (size_t)(b + i) * SL_Q4_0_BYTES;
            for (int l = 0; l < 16; l++)
                s += ((w[2 + l] & 15) - 8) * xq[l] + ((w[2 + l] >> 4) - 8) * xq[l + 16];
            p[i] = (h2f(w) * x.d[b + i]) * (float)s;
        }
    }
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* Super-block b of a K-quant weight row against x's super-block b. */
static float unit_k(enum sl_dtype t, const unsigned char *row, struct sl_cpu_qrow x, int b)
{
    const unsigned char *w = row + (size_t)b * sl_cpu_block_bytes(t);
    const int8_t *xq = x.q + (size_t)b * SL_QK_BLOCK;
    const int16_t *xs = x.s + (size_t)b * 16;
    float dx = x.d[b];
    int32_t isum = 0, msum = 0;
    uint8_t q[32];
    if (t == SL_DTYPE_Q6_K) {
        for (int j = 0; j < 8; j++) {
            q6_quants32(w, j, q);
            for (int g = 0; g < 2; g++) {
                int32_t s = 0;
                for (int l = 0; l < 16; l++)
                    s += (q[16 * g + l] - 32) * xq[32 * j + 16 * g + l];
                isum += (int8_t)w[192 + 2 * j + g] * s;
            }
        }
        return (h2f(w + 208) * dx) * (float)isum;
    }
    for (int s = 0; s < 8; s++) {
        int sc, m;
        sl_cpu_k_scale_min(w + 4, s, &sc, &m);
        k_quants32(t, w, s, q);
        int32_t dot = 0;
        for (int l = 0; l < 32; l++)
            dot += q[l] * xq[32 * s + l];
        isum += sc * dot;
        msum += m * (xs[2 * s] + xs[2 * s + 1]);
    }
    return (h2f(w) * dx) * (float)isum - (h2f(w + 2) * dx) * (float)msum;
}

static void matmul_q_scalar(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                            int d1)
{
    int k = w->cols;
    enum sl_qact kind = sl_cpu_qact_kind(w->type);
    size_t rb = sl_dtype_row_bytes(w->type, k);
    for (int r = 0; r < n; r++) {
        struct sl_cpu_qrow x = sl_cpu_qrow(kind, qa, k, r);
        for (int i = d0; i < d1; i++) {
            const unsigned char *row = (const unsigned char *)w->data + (size_t)i * rb;
            float acc = 0.0f;
            if (kind == SL_QACT_32)
                for (int b = 0; b < k / 32; b += 8)
                    acc += unit32(w->type, row, x, b, k / 32 - b < 8 ? k / 32 - b : 8);
            else
                for (int b = 0; b < k / SL_QK_BLOCK; b++)
                    acc += unit_k(w->type, row, x, b);
            out[(size_t)r * w->rows + i] = acc;
        }
    }
}

void sl_cpu_matmul_q_cols(float *out, const void *qa, const struct sl_mat *w, int n, int d0, int d1)
{
    if (n < 1 || d0 >= d1)
        return;
#if SL_CPU_HAVE_AVX2
    if (sl_cpu_isa() >= SL_CPU_ISA_AVX2) {
        sl_cpu_avx2_matmul_q_cols(out, qa, w, n, d0, d1);
        return;
    }
#endif
    matmul_q_scalar(out, qa, w, n, d0, d1);
}
