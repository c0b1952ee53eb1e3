/* AVX2 integer matmul of quantized weights against 8-bit activations, and the activation
 * quantizer: quant.c's arithmetic (kernels.h, "Integer matmul"), bit for bit. Integer sums are
 * exact whatever their order, so the vector code may add them in any order; every float
 * operation is quant.c's, in its order.
 *
 * Products of unsigned weights by signed activations use vpmaddubsw directly (the K-quants'
 * quants are unsigned; Q6_K's offset of 32 is taken out through the activations' sums of 16).
 * Signed weights (Q8_0, Q4_0 after its offset of 8) move their sign onto the activation
 * (vpsignb) first. No intermediate can saturate: a pair of products is at most 2 · 128 · 127.
 */
#include "cpu_impl.h"

#if SL_CPU_HAVE_AVX2

#include <immintrin.h>
#include <string.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TARGET

INLINE float h2f(const unsigned char *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INLINE __m256i loadu(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

INLINE int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)), as quant.c's unit32 adds them. */
INLINE float tree8(__m256 p)
{
    __m256 a = _mm256_hadd_ps(p, p);
    a = _mm256_hadd_ps(a, a);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1)));
}

/* [total of v0, ..., total of v7]: eight vectors' lane sums in one (exact integers). */
INLINE __m256i totals8(const __m256i v[8])
{
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    /* ab: [v0 lo, v1 lo, v2 lo, v3 lo | v0 hi, v1 hi, v2 hi, v3 hi], cd likewise for v4..v7. */
    __m256i lo = _mm256_permute2x128_si256(ab, cd, 0x20),
            hi = _mm256_permute2x128_si256(ab, cd, 0x31);
    return _mm256_add_epi32(lo, hi);
}

/* ---------------------------------------------------------------------------------------------
 * Units
 */

/* 32 signed weights of block b of a Q8_0 or Q4_0 row. */
INLINE __m256i w32(const enum sl_dtype t, const unsigned char *blk)
{
    if (t == SL_DTYPE_Q8_0)
        return loadu(blk + 2);
    __m128i v = _mm_loadu_si128((const __m128i *)(blk + 2)), m4 = _mm_set1_epi8(15);
    __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
}

INLINE short rd16s(const unsigned char *p)
{
    short v;
    memcpy(&v, p, 2);
    return v;
}

/* The fp16 scales of blocks [b, b + nb) of a Q8_0 or Q4_0 row as 8 floats (0 past nb), and x's
 * scales of the same blocks. */
INLINE __m256 w_scales8(const unsigned char *row, size_t bytes, int b, int nb)
{
    const unsigned char *p = row + (size_t)b * bytes;
    if (nb == 8)
        return _mm256_cvtph_ps(_mm_setr_epi16(rd16s(p), rd16s(p + bytes), rd16s(p + 2 * bytes),
                                              rd16s(p + 3 * bytes), rd16s(p + 4 * bytes),
                                              rd16s(p + 5 * bytes), rd16s(p + 6 * bytes),
                                              rd16s(p + 7 * bytes)));
    _Alignas(16) short h[8] = {0};
    for (int i = 0; i < nb; i++)
        h[i] = rd16s(p + (size_t)i * bytes);
    return _mm256_cvtph_ps(_mm_load_si128((const __m128i *)h));
}

INLINE __m256 x_scales8(const float *d, int nb)
{
    if (nb == 8)
        return _mm256_loadu_ps(d);
    _Alignas(32) float v[8] = {0};
    for (int i = 0; i < nb; i++)
        v[i] = d[i];
    return _mm256_load_ps(v);
}

/* Blocks [b, b + nb) (nb <= 8) of a Q8_0 or Q4_0 row against x's. */
INLINE float unit32(const enum sl_dtype t, const unsigned char *row, struct sl_cpu_qrow x, int b,
                    int nb)
{
    const size_t bytes = t == SL_DTYPE_Q8_0 ? SL_Q8_0_BYTES : SL_Q4_0_BYTES;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i iv[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        if (i < nb) {
            const unsigned char *blk = row + (size_t)(b + i) * bytes;
            __m256i wv = w32(t, blk), xv = loadu(x.q + 32 * (size_t)(b + i));
            __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
            iv[i] = _mm256_madd_epi16(p, ones);
        } else {
            iv[i] = _mm256_setzero_si256();
        }
    }
    __m256 dd = _mm256_mul_ps(w_scales8(row, bytes, b, nb), x_scales8(x.d + b, nb));
    return tree8(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(totals8(iv))));
}

/* Sub-block scales and mins of a Q4_K or Q5_K block: sc[s] and m[s], s < 8. */
INLINE void k_scales(const unsigned char *scales, uint8_t sc[8], uint8_t m[8])
{
    uint32_t u[3], o[4];
    memcpy(u, scales, 12);
    o[0] = u[0] & 0x3f3f3f3fu;                                             /* sc 0..3 */
    o[2] = u[1] & 0x3f3f3f3fu;                                             /* m 0..3 */
    o[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;        /* sc 4..7 */
    o[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4; /* m 4..7 */
    memcpy(sc, o, 8);
    memcpy(m, o + 2, 8);
}

/* A K-quant unit of one weight row, decoded. */
struct kdec {
    __m256i q[8];  /* the quants of slice s (32 values), unsigned */
    __m256i sc[8]; /* slice s's scales as 16 int16: its sub-block's, or (Q6_K) each half's */
    __m256i cv;    /* per group of 16 values: Q4_K, Q5_K its sub-block's min; Q6_K its scale */
};

INLINE void decode_k45(const enum sl_dtype t, const unsigned char *w, struct kdec *o)
{
    const unsigned char *qs = w + (t == SL_DTYPE_Q4_K ? 16 : 48);
    uint8_t sc[8], m[8];
    k_scales(w + 4, sc, m);
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256i qh = t == SL_DTYPE_Q5_K ? loadu(w + 16) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m256i q = loadu(qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (t == SL_DTYPE_Q5_K) {
            __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one);
            __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
        }
        o->q[2 * c] = lo;
        o->q[2 * c + 1] = hi;
        o->sc[2 * c] = _mm256_set1_epi16(sc[2 * c]);
        o->sc[2 * c + 1] = _mm256_set1_epi16(sc[2 * c + 1]);
    }
    /* [m0, m0, m1, m1, ..., m7, m7]: group g of 16 is half of sub-block g / 2. */
    __m128i mv = _mm_loadl_epi64((const __m128i *)m);
    o->cv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mv, mv));
}

INLINE void decode_q6k(const unsigned char *w, struct kdec *o)
{
    const int8_t *sc = (const int8_t *)(w + 192);
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m256i ql0 = loadu(w + 64 * h), ql1 = loadu(w + 64 * h + 32), qh = loadu(w + 128 + 32 * h);
        o->q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                      _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
        o->q[4 * h + 1] =
            _mm256_or_si256(_mm256_and_si256(ql1, m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
        o->q[4 * h + 2] =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
        o->q[4 * h + 3] =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
    }
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++)
        o->sc[s] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * s + 1]), _mm_set1_epi16(sc[2 * s]));
    o->cv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
}

/* Super-block b of a K-quant row against x's: I and M exact, then quant.c's float term. */
INLINE float unit_k(const enum sl_dtype t, const unsigned char *row, struct sl_cpu_qrow x, int b)
{
    const size_t bb = t == SL_DTYPE_Q4_K   ? SL_Q4_K_BYTES
                      : t == SL_DTYPE_Q5_K ? SL_Q5_K_BYTES
                                           : SL_Q6_K_BYTES;
    const unsigned char *w = row + (size_t)b * bb;
    const int8_t *xq = x.q + (size_t)b * SL_QK_BLOCK;
    struct kdec d;
    if (t == SL_DTYPE_Q6_K)
        decode_q6k(w, &d);
    else
        decode_k45(t, w, &d);
    __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++)
        acc = _mm256_add_epi32(
            acc, _mm256_madd_epi16(_mm256_maddubs_epi16(d.q[s], loadu(xq + 32 * s)), d.sc[s]));
    __m256i mv = _mm256_madd_epi16(d.cv, loadu(x.s + (size_t)b * 16));
    float dx = x.d[b];
    if (t == SL_DTYPE_Q6_K) /* the offset: I -= 32 · Σ_g sc_g · (sum of x's group g) */
        return (h2f(w + 208) * dx) *
               (float)hsum_i32(_mm256_sub_epi32(acc, _mm256_slli_epi32(mv, 5)));
    return (h2f(w) * dx) * (float)hsum_i32(acc) - (h2f(w + 2) * dx) * (float)hsum_i32(mv);
}

/* ---------------------------------------------------------------------------------------------
 * The matmul
 */

/* One output: row `row` of W against activation row x, unit by unit from 0. */
INLINE float dot_row(const enum sl_dtype t, const unsigned char *row, struct sl_cpu_qrow x, int k)
{
    float acc = 0.0f;
    if (t == SL_DTYPE_Q8_0 || t == SL_DTYPE_Q4_0) {
        int nb = k / 32, b = 0;
        for (; b + 8 <= nb; b += 8)
            acc += unit32(t, row, x, b, 8); /* a constant 8: no tests, no spills */
        if (b < nb)
            acc += unit32(t, row, x, b, nb - b);
    } else {
        for (int b = 0; b < k / SL_QK_BLOCK; b++)
            acc += unit_k(t, row, x, b);
    }
    return acc;
}

/* ---------------------------------------------------------------------------------------------
 * Several activation rows: each unit of four weight rows is decoded once, into registers' worth
 * of vectors in L1, and every activation row then meets all four (the x vector loaded once for
 * them; K-quant rows are also interleaved, see struct kil). The integer sums are the units'
 * above; the four rows' float terms are computed side by side in the lanes of one vector, each
 * lane by the same operations as unit32 and unit_k, and added to the outputs in unit order: the
 * same bits as dot_row.
 *
 * On the 2-vCPU EPYC VM (CPUID family 23), the multiplies bound this: a thread, 64 activation
 * rows, a 256 x 2048 matrix in cache, Q4_K ran at 13.3 G multiply-adds/s with the rows one by one
 * and two multiplies (vpmaddubsw, vpmaddwd) each 32 products, 21.5 interleaved (Q6_K 12.9 ->
 * 18.2, Q5_K at 16 rows 13.5 -> 17.5).
 */

#define RN 4

/* [total of a, total of b, total of c, total of d] (exact integers). */
INLINE __m128i totals4(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    __m256i t = _mm256_hadd_epi32(ab, cd);
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* [((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)) of a, of b, of c, of d]: tree8's order, lane by lane. */
INLINE __m128 trees4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 t = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* Four K-quant weight rows' super-block, interleaved for the batched tile: v[s][j] holds bytes
 * [8j, 8j + 8) of slice s (values 32s + 8j ...) of rows 0, 1, 2, 3, one row per quarter, so that
 * one vpmaddubsw against x's 8 values broadcast to the four quarters gives four rows' products.
 * The products of one scale's values are then summed in 16 bits, which cannot overflow (at most
 * 8 products of 31 · 128 for Q5_K, 4 of 63 · 128 for Q6_K), and widened once by vpmaddwd against
 * the scales: sc[g] holds, per quarter, its row's scale of group g (Q4_K, Q5_K: the sub-block s
 * = g, all four chunks; Q6_K: the half g % 2 of slice g / 2, two chunks). That is 5 multiplies
 * for 4 rows' 32 values where the rows one by one need 8: the integers are the same. */
struct kil {
    __m256i v[8][4];
    __m256i sc[16];
};

INLINE void interleave(const enum sl_dtype t, const struct kdec dec[RN], struct kil *o)
{
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        /* q = [c0 c1 | c2 c3] (8 bytes each) for every row: unpack pairs of rows, then lanes. */
        __m256i a = _mm256_unpacklo_epi64(dec[0].q[s], dec[1].q[s]);
        __m256i b = _mm256_unpacklo_epi64(dec[2].q[s], dec[3].q[s]);
        __m256i c = _mm256_unpackhi_epi64(dec[0].q[s], dec[1].q[s]);
        __m256i d = _mm256_unpackhi_epi64(dec[2].q[s], dec[3].q[s]);
        o->v[s][0] = _mm256_permute2x128_si256(a, b, 0x20);
        o->v[s][1] = _mm256_permute2x128_si256(c, d, 0x20);
        o->v[s][2] = _mm256_permute2x128_si256(a, b, 0x31);
        o->v[s][3] = _mm256_permute2x128_si256(c, d, 0x31);
        /* dec's sc[s]: 16 int16, the low 8 the scale of values 0-15, the high 8 of 16-31. */
        __m256i e = _mm256_unpacklo_epi64(dec[0].sc[s], dec[1].sc[s]);
        __m256i f = _mm256_unpacklo_epi64(dec[2].sc[s], dec[3].sc[s]);
        if (t == SL_DTYPE_Q6_K) {
            o->sc[2 * s] = _mm256_permute2x128_si256(e, f, 0x20);
            o->sc[2 * s + 1] = _mm256_permute2x128_si256(e, f, 0x31);
        } else {
            o->sc[s] = _mm256_permute2x128_si256(e, f, 0x20);
        }
    }
}

/* x's 8 values at p in each quarter. */
INLINE __m256i bcast8(const unsigned char *p)
{
    long long v;
    memcpy(&v, p, 8);
    return _mm256_set1_epi64x(v);
}

/* [total of rows 0, 1, 2, 3] of an accumulator whose int32 pairs (0,1), (2,3), (4,5), (6,7) are
 * rows 0 to 3 (exact integers). */
INLINE __m128i totals_il(__m256i a)
{
    __m256i h = _mm256_hadd_epi32(a, a); /* [r0 r1 r0 r1 | r2 r3 r2 r3] */
    return _mm_unpacklo_epi64(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Super-block b of R activation rows (R <= 4; x's rows from xr, xb bytes apart) against the four
 * interleaved weight rows, then each row's float term as unit_k's, added to out[r][0 .. 4). */
INLINE void tile_k_rows(const enum sl_dtype t, const struct kil *il, const struct kdec dec[RN],
                        __m128 d4, __m128 dmin4, const int R, const unsigned char *xr, size_t xb,
                        int k, int b, float *out, size_t ldo)
{
    __m256i acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        const unsigned char *xs = xr + (size_t)b * SL_QK_BLOCK + 32 * (size_t)s;
        for (int g = 0; g < (t == SL_DTYPE_Q6_K ? 2 : 1); g++) { /* constant: unrolled */
            const int j0 = t == SL_DTYPE_Q6_K ? 2 * g : 0, nj = t == SL_DTYPE_Q6_K ? 2 : 4;
            const __m256i sc = il->sc[t == SL_DTYPE_Q6_K ? 2 * s + g : s];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const unsigned char *x = xs + (size_t)r * xb;
                __m256i p = _mm256_maddubs_epi16(il->v[s][j0], bcast8(x + 8 * j0));
#pragma GCC unroll 3
                for (int j = j0 + 1; j < j0 + nj; j++)
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(il->v[s][j], bcast8(x + 8 * j)));
                acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, sc));
            }
        }
        /* Keep the accumulators in registers, slice after slice: left free, GCC reassociates
         * the integer sums into a tree and spills every product first. */
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            __asm__("" : "+x"(acc[r]));
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const struct sl_cpu_qrow x = sl_cpu_qrow_at(SL_QACT_256, xr + (size_t)r * xb, k);
        const float dx = x.d[b];
        const __m256i xs = loadu(x.s + 16 * (size_t)b);
        __m128i m4 = totals4(_mm256_madd_epi16(dec[0].cv, xs), _mm256_madd_epi16(dec[1].cv, xs),
                             _mm256_madd_epi16(dec[2].cv, xs), _mm256_madd_epi16(dec[3].cv, xs));
        __m128i i4 = totals_il(acc[r]);
        __m128 dxv = _mm_set1_ps(dx), term;
        if (t == SL_DTYPE_Q6_K) { /* the offset: I -= 32 · Σ_g sc_g · (sum of x's group g) */
            term = _mm_mul_ps(_mm_mul_ps(d4, dxv),
                              _mm_cvtepi32_ps(_mm_sub_epi32(i4, _mm_slli_epi32(m4, 5))));
        } else {
            term = _mm_sub_ps(_mm_mul_ps(_mm_mul_ps(d4, dxv), _mm_cvtepi32_ps(i4)),
                              _mm_mul_ps(_mm_mul_ps(dmin4, dxv), _mm_cvtepi32_ps(m4)));
        }
        float *o = out + (size_t)r * ldo;
        __m128 prev = b ? _mm_loadu_ps(o) : _mm_setzero_ps();
        _mm_storeu_ps(o, _mm_add_ps(prev, term));
    }
}

/* out[r][i .. i + 4) for all n rows, K-quant weight rows i .. i + 4 from w0 (rb bytes apart). */
INLINE void tile_k(const enum sl_dtype t, float *out, size_t ldo, const void *qa, int n, int k,
                   const unsigned char *w0, size_t rb)
{
    const size_t bb = t == SL_DTYPE_Q4_K   ? SL_Q4_K_BYTES
                      : t == SL_DTYPE_Q5_K ? SL_Q5_K_BYTES
                                           : SL_Q6_K_BYTES;
    const size_t xb = sl_cpu_qact_row_bytes(SL_QACT_256, k);
    const unsigned char *xa = qa;
    struct kdec dec[RN];
    struct kil il;
    for (int b = 0; b < k / SL_QK_BLOCK; b++) {
        _Alignas(16) float d[RN], dmin[RN];
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) {
            const unsigned char *w = w0 + (size_t)c * rb + (size_t)b * bb;
            if (t == SL_DTYPE_Q6_K) {
                decode_q6k(w, &dec[c]);
                d[c] = h2f(w + 208);
                dmin[c] = 0.0f;
            } else {
                decode_k45(t, w, &dec[c]);
                d[c] = h2f(w);
                dmin[c] = h2f(w + 2);
            }
        }
        const __m128 d4 = _mm_load_ps(d), dmin4 = _mm_load_ps(dmin);
        interleave(t, dec, &il);
        int r = 0;
        for (; r + 4 <= n; r += 4)
            tile_k_rows(t, &il, dec, d4, dmin4, 4, xa + (size_t)r * xb, xb, k, b,
                        out + (size_t)r * ldo, ldo);
        if (n - r >= 2) {
            tile_k_rows(t, &il, dec, d4, dmin4, 2, xa + (size_t)r * xb, xb, k, b,
                        out + (size_t)r * ldo, ldo);
            r += 2;
        }
        if (r < n)
            tile_k_rows(t, &il, dec, d4, dmin4, 1, xa + (size_t)r * xb, xb, k, b,
                        out + (size_t)r * ldo, ldo);
    }
}

/* The same for Q8_0 and Q4_0 weight rows: unit32 for each of four rows. */
INLINE void tile_32(const enum sl_dtype t, float *out, size_t ldo, const void *qa, int n, int k,
                    const unsigned char *w0, size_t rb)
{
    const size_t bytes = t == SL_DTYPE_Q8_0 ? SL_Q8_0_BYTES : SL_Q4_0_BYTES;
    const size_t xb = sl_cpu_qact_row_bytes(SL_QACT_32, k);
    const __m256i ones = _mm256_set1_epi16(1);
    int nbk = k / 32;
    __m256i aw[RN][8], sw[RN][8];
    for (int b = 0; b < nbk; b += 8) {
        int nb = nbk - b < 8 ? nbk - b : 8;
        __m256 dw[RN];
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++) {
            for (int i = 0; i < 8; i++) {
                if (i < nb) {
                    const unsigned char *blk = w0 + (size_t)c * rb + (size_t)(b + i) * bytes;
                    sw[c][i] = w32(t, blk);
                    aw[c][i] = _mm256_sign_epi8(sw[c][i], sw[c][i]);
                } else {
                    sw[c][i] = aw[c][i] = _mm256_setzero_si256();
                }
            }
            dw[c] = w_scales8(w0 + (size_t)c * rb, bytes, b, nb);
        }
        for (int r = 0; r < n; r++) {
            const struct sl_cpu_qrow x =
                sl_cpu_qrow_at(SL_QACT_32, (const unsigned char *)qa + (size_t)r * xb, k);
            __m256 dxv = x_scales8(x.d + b, nb), p[RN];
#pragma GCC unroll 4
            for (int c = 0; c < RN; c++) {
                __m256i iv[8];
#pragma GCC unroll 8
                for (int i = 0; i < 8; i++) {
                    __m256i xv =
                        i < nb ? loadu(x.q + 32 * (size_t)(b + i)) : _mm256_setzero_si256();
                    iv[i] = _mm256_madd_epi16(
                        _mm256_maddubs_epi16(aw[c][i], _mm256_sign_epi8(xv, sw[c][i])), ones);
                }
                __m256 dd = _mm256_mul_ps(dw[c], dxv);
                p[c] = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(totals8(iv)));
            }
            float *o = out + (size_t)r * ldo;
            __m128 prev = b ? _mm_loadu_ps(o) : _mm_setzero_ps();
            _mm_storeu_ps(o, _mm_add_ps(prev, trees4(p[0], p[1], p[2], p[3])));
        }
    }
}

/* Weight rows are read once each, in address order; every activation row meets a weight row
 * while it is in L1. No software prefetch: on the 2-vCPU EPYC VM the hardware's did better
 * (a 1.1B Q8_0 decode step at batch 1: 12.2-12.9 tok/s without, 10.9-11.9 with rows fetched
 * 1-32 KiB ahead). */
INLINE void matmul_qt(const enum sl_dtype t, float *out, const void *qa, const struct sl_mat *w,
                      int n, int d0, int d1)
{
    int k = w->cols;
    enum sl_qact kind = sl_cpu_qact_kind(t);
    size_t rb = sl_dtype_row_bytes(t, k), ldo = (size_t)w->rows;
    const unsigned char *base = w->data;
    int i = d0;
    if (n > 1)
        for (; i + RN <= d1; i += RN) {
            const unsigned char *w0 = base + (size_t)i * rb;
            if (t == SL_DTYPE_Q8_0 || t == SL_DTYPE_Q4_0)
                tile_32(t, out + i, ldo, qa, n, k, w0, rb);
            else
                tile_k(t, out + i, ldo, qa, n, k, w0, rb);
        }
    if (i < d1 && n == 1) { /* decode: x's row looked up once */
        struct sl_cpu_qrow x = sl_cpu_qrow(kind, qa, k, 0);
        for (; i < d1; i++)
            out[i] = dot_row(t, base + (size_t)i * rb, x, k);
    }
    for (; i < d1; i++) {
        const unsigned char *row = base + (size_t)i * rb;
        for (int r = 0; r < n; r++)
            out[(size_t)r * ldo + i] = dot_row(t, row, sl_cpu_qrow(kind, qa, k, r), k);
    }
}

TARGET static void matmul_q8_0(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                               int d1)
{
    matmul_qt(SL_DTYPE_Q8_0, out, qa, w, n, d0, d1);
}

TARGET static void matmul_q4_0(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                               int d1)
{
    matmul_qt(SL_DTYPE_Q4_0, out, qa, w, n, d0, d1);
}

TARGET static void matmul_q4_k(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                               int d1)
{
    matmul_qt(SL_DTYPE_Q4_K, out, qa, w, n, d0, d1);
}

TARGET static void matmul_q5_k(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                               int d1)
{
    matmul_qt(SL_DTYPE_Q5_K, out, qa, w, n, d0, d1);
}

TARGET static void matmul_q6_k(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                               int d1)
{
    matmul_qt(SL_DTYPE_Q6_K, out, qa, w, n, d0, d1);
}

void sl_cpu_avx2_matmul_q_cols(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                               int d1)
{
    switch (w->type) {
    case SL_DTYPE_Q8_0: matmul_q8_0(out, qa, w, n, d0, d1); break;
    case SL_DTYPE_Q4_0: matmul_q4_0(out, qa, w, n, d0, d1); break;
    case SL_DTYPE_Q4_K: matmul_q4_k(out, qa, w, n, d0, d1); break;
    case SL_DTYPE_Q5_K: matmul_q5_k(out, qa, w, n, d0, d1); break;
    case SL_DTYPE_Q6_K: matmul_q6_k(out, qa, w, n, d0, d1); break;
    default: break;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Activations
 */

/* One block of bs (a multiple of 32) values: quant.c's sl_cpu_qact_block_scalar. */
TARGET static void qblock(const float *x, int bs, int8_t *q, float *d)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    /* max(|x|, mx) returns mx for a NaN x, as fmaxf ignores one. */
    for (int i = 0; i < bs; i += 8)
        mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), mx);
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    float amax = _mm_cvtss_f32(m);
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int i = 0; i < bs; i += 32) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vid));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vid));
        __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vid));
        __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vid));
        __m256i v = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(v, perm));
    }
}

void sl_cpu_avx2_qact_quantize(enum sl_qact kind, void *qa, const float *x, int n, int cols)
{
    int bs = kind == SL_QACT_256 ? SL_QK_BLOCK : 32;
    for (int r = 0; r < n; r++) {
        struct sl_cpu_qrow q = sl_cpu_qrow(kind, qa, cols, r);
        const float *xr = x + (size_t)r * cols;
        for (int b = 0; b < cols / bs; b++)
            qblock(xr + (size_t)b * bs, bs, (int8_t *)q.q + (size_t)b * bs, (float *)q.d + b);
        if (kind == SL_QACT_256)
            sl_cpu_qact_sums(q.q, (int16_t *)q.s, cols);
    }
}

#endif
