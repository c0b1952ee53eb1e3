/* AVX2 + FMA + F16C kernels, compiled with per-function target attributes so the build needs no
 * -march flag; ops.c calls them only after checking the CPU (see cpu_impl.h).
 *
 * The matmul is llamafile-tinyBLAS-shaped rather than BLIS-shaped: both x and W are read along
 * k in their natural row-major layout (W comes straight from an mmap'd file, and packing it per
 * call would cost a second pass over memory in decode). A register tile of RM rows of x and RN
 * rows of W keeps RM×RN 8-lane accumulators; each k step loads RN weight vectors (converted from
 * their type in registers) and RM activation vectors and issues RM×RN FMAs, so a weight vector
 * fetched from memory serves RM activation rows and vice versa. Every accumulator is reduced by
 * the same tree whatever the tile, which is what makes results independent of batch size.
 */
#include "cpu_impl.h"

#if SL_CPU_HAVE_AVX2

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define TARGET __attribute__((target("avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TARGET

/* [sum a, sum b, sum c, sum d], each as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): the same tree for
 * every lane, so a value does not depend on its neighbours or its position. */
INLINE __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d)
{
    __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    __m256 t = _mm256_hadd_ps(ab, cd);
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

INLINE float reduce1(__m256 a)
{
    return _mm_cvtss_f32(reduce4(a, a, a, a));
}

/* Eight weights of a row at column j (j a multiple of 8), converted exactly to fp32. */
INLINE __m256 load_w(const enum sl_dtype t, const unsigned char *row, int j)
{
    switch (t) {
    case SL_DTYPE_F32: return _mm256_loadu_ps((const float *)row + j);
    case SL_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)j)));
    case SL_DTYPE_BF16: {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)j)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    default: break; /* the quantized types: block-wise in tile() */
    }
    return _mm256_setzero_ps();
}

/* 32 weights of a Q4_0 or K-quant row from column j (a multiple of 32) as fp32, into w[0..3]:
 * the values sl_cpu_dequant32 gives, by the same operations. */
INLINE void load_w32(const enum sl_dtype t, const unsigned char *row, int j, __m256 w[4])
{
    __m256i q; /* 32 quants, as bytes */
    __m256 scale[2], min = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(15);
    uint16_t h;
    if (t == SL_DTYPE_Q4_0) {
        const unsigned char *b = row + (size_t)(j / 32) * SL_Q4_0_BYTES;
        __m128i v = _mm_loadu_si128((const __m128i *)(b + 2));
        q = _mm256_sub_epi8(
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4)),
            _mm256_set1_epi8(8));
        memcpy(&h, b, 2);
        scale[0] = scale[1] = _mm256_set1_ps(_cvtsh_ss(h));
    } else if (t == SL_DTYPE_Q6_K) {
        const unsigned char *b = row + (size_t)(j / SL_QK_BLOCK) * SL_Q6_K_BYTES;
        int sl = (j % SL_QK_BLOCK) / 32, hf = sl / 4, part = sl % 4;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(b + 64 * hf + (part % 2) * 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * hf));
        if (part >= 2)
            ql = _mm256_srli_epi16(ql, 4);
        qh = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * part));
        q = _mm256_or_si256(_mm256_and_si256(ql, _mm256_set1_epi8(15)),
                            _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(3)), 4));
        q = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
        memcpy(&h, b + 208, 2);
        float d = _cvtsh_ss(h);
        scale[0] = _mm256_set1_ps(d * (float)(int8_t)b[192 + 2 * sl]);
        scale[1] = _mm256_set1_ps(d * (float)(int8_t)b[193 + 2 * sl]);
    } else { /* Q4_K, Q5_K */
        const unsigned char *b =
            row + (size_t)(j / SL_QK_BLOCK) * (t == SL_DTYPE_Q4_K ? SL_Q4_K_BYTES : SL_Q5_K_BYTES);
        int s = (j % SL_QK_BLOCK) / 32, sc, m;
        sl_cpu_k_scale_min(b + 4, s, &sc, &m);
        __m256i v = _mm256_loadu_si256(
            (const __m256i *)(b + (t == SL_DTYPE_Q4_K ? 16 : 48) + 32 * (s / 2)));
        if (s % 2)
            v = _mm256_srli_epi16(v, 4);
        q = _mm256_and_si256(v, _mm256_set1_epi8(15));
        if (t == SL_DTYPE_Q5_K) {
            __m256i qh = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(b + 16)),
                                          _mm_cvtsi32_si128(s));
            q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(1)), 4));
        }
        memcpy(&h, b, 2);
        float d1 = _cvtsh_ss(h) * (float)sc;
        memcpy(&h, b + 2, 2);
        float m1 = _cvtsh_ss(h) * (float)m;
        scale[0] = scale[1] = _mm256_set1_ps(d1);
        min = _mm256_set1_ps(m1);
    }
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[i]));
        w[i] = _mm256_mul_ps(scale[i / 2], f);
        if (t == SL_DTYPE_Q4_K || t == SL_DTYPE_Q5_K)
            w[i] = _mm256_sub_ps(w[i], min);
    }
}

/* One weight as fp32 (the k % 8 tail; never Q8_0, whose rows are whole blocks). */
INLINE float scalar_w(const enum sl_dtype t, const unsigned char *row, int j)
{
    uint16_t h;
    switch (t) {
    case SL_DTYPE_F32: return ((const float *)row)[j];
    case SL_DTYPE_F16: memcpy(&h, row + 2 * (size_t)j, 2); return _cvtsh_ss(h);
    case SL_DTYPE_BF16: memcpy(&h, row + 2 * (size_t)j, 2); return sl_cpu_bf16_to_f32(h);
    default: break;
    }
    return 0.0f;
}

/* Two floats through the unaligned 64-bit moves: p need only be float-aligned (a double* cast
 * would promise 8-byte alignment, which callers do not give). */
INLINE __m128 load2(const float *p)
{
    return _mm_castsi128_ps(_mm_loadl_epi64((const __m128i_u *)p));
}

INLINE void store2(float *p, __m128 v)
{
    _mm_storel_epi64((__m128i_u *)p, _mm_castps_si128(v));
}

/* The first n (1..4) floats at p as a vector; the other lanes are 0. */
INLINE __m128 load_n(const int n, const float *p)
{
    switch (n) {
    case 1: return _mm_load_ss(p);
    case 2: return load2(p);
    case 3: return _mm_movelh_ps(load2(p), _mm_load_ss(p + 2));
    default: return _mm_loadu_ps(p);
    }
}

/* Stores the first n (1..4) lanes of v at p. */
INLINE void store_n(const int n, float *p, __m128 v)
{
    switch (n) {
    case 1: _mm_store_ss(p, v); break;
    case 2: store2(p, v); break;
    case 3:
        store2(p, v);
        _mm_store_ss(p + 2, _mm_movehl_ps(v, v));
        break;
    default: _mm_storeu_ps(p, v); break;
    }
}

/* A dot product of length k is defined block by block: k8 = k rounded down to 8 is cut into
 * nb = ceil(k8 / KC_MAX) blocks of equal length (rounded up to 32), each block's products go into
 * 8 lane sums reduced by the tree above, the block results are added left to right into one fp32
 * sum, and the k % 8 tail comes last. The blocks depend on k alone, never on the batch; they let
 * an activation block stay in L1 while weight tiles stream past it. */
#define KC_MAX SL_CPU_KC_MAX

/* acc[r][c] += x row r at column j · wv[c], for r < RM, c < RN. */
INLINE void fma_tile(const int RM, const int RN, __m256 acc[4][4], const __m256 *wv, const float *x,
                     size_t ldx, int j)
{
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++) {
        __m256 xv = _mm256_loadu_ps(x + (size_t)r * ldx + j);
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++)
            acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
}

/* One k step of a register tile: RN weight vectors at column j against RM rows of x. */
INLINE void kstep(const enum sl_dtype t, const int RM, const int RN, __m256 acc[4][4],
                  const float *x, size_t ldx, const unsigned char *w, size_t wrb, int j)
{
    __m256 wv[4];
#pragma GCC unroll 4
    for (int c = 0; c < RN; c++)
        wv[c] = load_w(t, w + (size_t)c * wrb, j);
    fma_tile(RM, RN, acc, wv, x, ldx, j);
}

/* For r < RM, c < RN: out[r * ldo + c] (=, or += when !first) the block [j0, j1) of x row r · W
 * row c, then the tail [k8, k) when j1 == k8. x rows are ldx floats apart, W rows wrb bytes.
 * RM, RN and t are constants after inlining, so the loops unroll and the accumulators live in
 * registers (RM·RN accumulators, RN weight vectors and an x vector: all 16 ymm for 4 × 3, one more
 * than AVX2 has for 3 × 4). */
INLINE void tile(const enum sl_dtype t, const int RM, const int RN, float *out, size_t ldo,
                 const float *x, size_t ldx, const unsigned char *w, size_t wrb, int j0, int j1,
                 int k8, int k)
{
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++)
#pragma GCC unroll 4
        for (int c = 0; c < RN; c++)
            acc[r][c] = _mm256_setzero_ps();
    if (t == SL_DTYPE_Q8_0) {
        for (int b = j0 / SL_Q8_0_BLOCK; b < j1 / SL_Q8_0_BLOCK; b++) {
            const unsigned char *blk[4];
            __m256 d[4];
#pragma GCC unroll 4
            for (int c = 0; c < RN; c++) {
                uint16_t h;
                blk[c] = w + (size_t)c * wrb + (size_t)b * SL_Q8_0_BYTES;
                memcpy(&h, blk[c], 2);
                d[c] = _mm256_set1_ps(_cvtsh_ss(h));
            }
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                int j = b * SL_Q8_0_BLOCK + s * 8;
                __m256 wv[4];
#pragma GCC unroll 4
                for (int c = 0; c < RN; c++) {
                    __m128i q = _mm_loadl_epi64((const __m128i *)(blk[c] + 2 + s * 8));
                    /* d·q is exact in fp32 (11-bit by 8-bit significands). */
                    wv[c] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d[c]);
                }
                fma_tile(RM, RN, acc, wv, x, ldx, j);
            }
        }
    } else if (t != SL_DTYPE_F32 && t != SL_DTYPE_F16 && t != SL_DTYPE_BF16) {
        /* Q4_0 and the K-quants: each 32 columns decoded (the values sl_cpu_mat_row gives),
         * then as Q8_0's. */
        for (int j = j0; j < j1; j += 32) {
            __m256 wv[4][4]; /* [column group][weight row] */
#pragma GCC unroll 4
            for (int c = 0; c < RN; c++) {
                __m256 v[4];
                load_w32(t, w + (size_t)c * wrb, j, v);
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++)
                    wv[s][c] = v[s];
            }
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++)
                fma_tile(RM, RN, acc, wv[s], x, ldx, j + 8 * s);
        }
    } else if (RM * RN + RN + 1 <= 16) {
        /* Unrolled four steps: a k block is only 36-48 steps, and the loop's own branches
         * cost 2-4 % of the matmuls' time in decode (paired against the plain loop: batch 32
         * 0.978-0.990, batch 16 0.969, batch 1 0.933-0.963). */
#pragma GCC unroll 4
        for (int j = j0; j < j1; j += 8)
            kstep(t, RM, RN, acc, x, ldx, w, wrb, j);
    } else {
        /* 3 × 4 has no register to spare: unrolled, a 256-token prompt took 32-45 % longer. */
        for (int j = j0; j < j1; j += 8)
            kstep(t, RM, RN, acc, x, ldx, w, wrb, j);
    }
#pragma GCC unroll 4
    for (int r = 0; r < RM; r++) {
        __m128 v = reduce4(acc[r][0], acc[r][RN > 1 ? 1 : 0], acc[r][RN > 2 ? 2 : 0],
                           acc[r][RN > 3 ? 3 : 0]);
        float *o = out + (size_t)r * ldo;
        if (j0 != 0)
            v = _mm_add_ps(v, load_n(RN, o));
        if (j1 == k8 && k8 < k) {
            float s[4];
            _mm_storeu_ps(s, v);
            const float *xr = x + (size_t)r * ldx;
#pragma GCC unroll 4
            for (int c = 0; c < RN; c++) {
                for (int j = k8; j < k; j++)
                    s[c] += xr[j] * scalar_w(t, w + (size_t)c * wrb, j);
                o[c] = s[c];
            }
        } else {
            store_n(RN, o, v);
        }
    }
}

/* Weight rows to fetch into L1 ahead of their first use: `left` prefetches of 16 columns each,
 * `lines` per row starting at `row` (the k block's first column), rows wrb bytes apart. */
struct fetch {
    const char *row;
    size_t wrb, pf16;
    int lines, line, left;
};

INLINE void fetch_some(struct fetch *f, int count)
{
    for (; count > 0 && f->left > 0; count--, f->left--) {
        _mm_prefetch(f->row + (size_t)f->line * f->pf16, _MM_HINT_T0);
        if (++f->line == f->lines && f->left > 1) { /* never past the last row */
            f->line = 0;
            f->row += f->wrb;
        }
    }
}

/* Rows [r0, r1) of x against RN weight rows: RM-row tiles, then the rest. f (or NULL): weights
 * to fetch meanwhile, an equal share before each tile. */
INLINE void tile_rows(const enum sl_dtype t, const int RM, const int RN, float *out, size_t ldo,
                      const float *x, size_t ldx, const unsigned char *w, size_t wrb, int r0,
                      int r1, int j0, int j1, int k8, int k, struct fetch *f)
{
    int r = r0, tiles = (r1 - r0 + RM - 1) / RM;
    int share = f && tiles > 0 ? (f->left + tiles - 1) / tiles : 0;
    for (; r + RM <= r1; r += RM) {
        if (f)
            fetch_some(f, share);
        tile(t, RM, RN, out + (size_t)r * ldo, ldo, x + (size_t)r * ldx, ldx, w, wrb, j0, j1, k8,
             k);
    }
    if (f)
        fetch_some(f, f->left);
    float *o = out + (size_t)r * ldo;
    const float *xr = x + (size_t)r * ldx;
    switch (r1 - r) {
    case 3: tile(t, 3, RN, o, ldo, xr, ldx, w, wrb, j0, j1, k8, k); break;
    case 2: tile(t, 2, RN, o, ldo, xr, ldx, w, wrb, j0, j1, k8, k); break;
    case 1: tile(t, 1, RN, o, ldo, xr, ldx, w, wrb, j0, j1, k8, k); break;
    default: break;
    }
}

/* Cache blocking for more than two rows, inside one thread's weight rows:
 *   weight slices of SLICE rows (SLICE · KC_MAX floats stay in L2 across all activation rows, so
 *   each weight is read from memory once per call),
 *     k blocks,
 *       activation blocks of ROWS = 3 · RM rows (at most 12 · KC_MAX floats, 18 KiB, in L1),
 *         RN-row weight tiles (from L2, each reused by the 3 register tiles of the block),
 *           RM-row activation tiles.
 * RM × RN is 3 × 4 or 4 × 3, 12 accumulators either way (see matmul_t). */
#define SLICE 96
#ifndef PF_AHEAD
#define PF_AHEAD 8192
#endif

/* Columns [d0, d1) of n > 2 rows in k blocks of kc (nb of them); ahead: see matmul_t. */
INLINE void slices(const enum sl_dtype t, const int RM, const int RN, const bool ahead, float *out,
                   const float *x, const struct sl_mat *m, int n, int d0, int d1, int kc, int nb)
{
    int k = m->cols, k8 = k & ~7;
    size_t ldo = (size_t)m->rows, ldx = (size_t)k, wrb = sl_dtype_row_bytes(t, k);
    const unsigned char *w = m->data;
    /* Bytes of 16 columns: exact for every type (a Q8_0 row is whole 32-column blocks, and
     * kc is a multiple of 32), so prefetch addresses need no division. */
    size_t pf16 = wrb * 16 / (size_t)k;
    /* With `ahead` there are at least 3 passes of SLICE / RN tiles over a full slice: pf_rows
     * next-slice rows per tile cover the next slice. */
    const int pf_rows = (SLICE + 3 * (SLICE / RN) - 1) / (3 * (SLICE / RN));
    for (int s0 = d0; s0 < d1; s0 += SLICE) {
        int s1 = d1 - s0 < SLICE ? d1 : s0 + SLICE;
        for (int b = 0; b < nb; b++) {
            int j0 = b * kc, j1 = j0 + kc < k8 ? j0 + kc : k8;
            size_t pf0 = (size_t)j0 / 16 * pf16;
            int tiles = (s1 - s0 + RN - 1) / RN, n1 = d1 - s1 < SLICE ? d1 : s1 + SLICE;
            const int ROWS = 3 * RM;
            for (int r0 = 0, pass = 0; r0 < n; r0 += ROWS, pass++) {
                int r1 = n - r0 < ROWS ? n : r0 + ROWS;
                int i = s0;
                for (; i + RN <= s1; i += RN) {
                    if (ahead) {
                        int c = s1 + (pass * tiles + (i - s0) / RN) * pf_rows;
                        for (int q = 0; q < pf_rows && c + q < n1; q++) {
                            const char *pw = (const char *)(w + (size_t)(c + q) * wrb) + pf0;
                            for (int j = j0; j < j1; j += 16, pw += pf16)
                                _mm_prefetch(pw, _MM_HINT_T1);
                        }
                    }
                    /* First use of these weights: fetch the tile after next (past the slice's
                     * end too, where the next slice starts), a share before each register tile
                     * rather than all at once, which stalled the tile's own loads (a decode
                     * batch of 16 took 12 % less time, the layer matmuls of a batch of 32 5-8 %
                     * less); with `ahead`, only in the first slice, which no earlier slice
                     * fetched. */
                    struct fetch f, *fp = NULL;
                    int a = i + 2 * RN;
                    if (r0 == 0 && (!ahead || s0 == d0) && a < d1) {
                        f = (struct fetch){.row = (const char *)(w + (size_t)a * wrb) + pf0,
                                           .wrb = wrb,
                                           .pf16 = pf16,
                                           .lines = (j1 - j0 + 15) / 16};
                        f.left = f.lines * (d1 - a < RN ? d1 - a : RN);
                        fp = &f;
                    }
                    tile_rows(t, RM, RN, out + i, ldo, x, ldx, w + (size_t)i * wrb, wrb, r0, r1, j0,
                              j1, k8, k, fp);
                }
                for (; i < s1; i++)
                    tile_rows(t, RM, 1, out + i, ldo, x, ldx, w + (size_t)i * wrb, wrb, r0, r1, j0,
                              j1, k8, k, NULL);
            }
        }
    }
}

INLINE void matmul_t(const enum sl_dtype t, float *out, const float *x, const struct sl_mat *m,
                     int n, int d0, int d1)
{
    int k = m->cols, k8 = k & ~7;
    int nb = k8 ? (k8 + KC_MAX - 1) / KC_MAX : 1; /* k < 8: one empty block, then the tail */
    int kc = ((k8 + nb - 1) / nb + 31) & ~31;
    size_t ldo = (size_t)m->rows, ldx = (size_t)k, wrb = sl_dtype_row_bytes(t, k);
    const unsigned char *w = m->data;
    if (n <= 2) {
        /* Decode of one or two rows is bound by the weight stream: 4 weight rows per tile keep
         * four sequential streams and more loads in flight. */
        int i = d0;
        const unsigned char *end = w + (size_t)d1 * wrb;
        for (; i + 4 <= d1; i += 4) {
            /* The weights are read once, in address order: ask for them PF_AHEAD bytes early,
             * which covers memory latency better than the hardware prefetcher alone. */
            const unsigned char *pf = w + (size_t)i * wrb + PF_AHEAD;
            for (size_t o = 0; o < 4 * wrb && pf + o < end; o += 64)
                _mm_prefetch((const char *)(pf + o), _MM_HINT_T0);
            for (int b = 0; b < nb; b++) {
                int j0 = b * kc, j1 = j0 + kc < k8 ? j0 + kc : k8;
                if (n == 1)
                    tile(t, 1, 4, out + i, ldo, x, ldx, w + (size_t)i * wrb, wrb, j0, j1, k8, k);
                else
                    tile(t, 2, 4, out + i, ldo, x, ldx, w + (size_t)i * wrb, wrb, j0, j1, k8, k);
            }
        }
        for (; i < d1; i++)
            for (int b = 0; b < nb; b++) {
                int j0 = b * kc, j1 = j0 + kc < k8 ? j0 + kc : k8;
                if (n == 1)
                    tile(t, 1, 1, out + i, ldo, x, ldx, w + (size_t)i * wrb, wrb, j0, j1, k8, k);
                else
                    tile(t, 2, 1, out + i, ldo, x, ldx, w + (size_t)i * wrb, wrb, j0, j1, k8, k);
            }
        return;
    }
    /* A matrix far larger than the caches (the classifier) comes from memory at the rate the
     * first pass over a slice uses it, which is bandwidth-bound when only 12 activation rows
     * share it. With three passes or more (more than 24 rows in blocks of 12), spread the fetch
     * of the next slice over every pass of this one instead (into L2), a weight row per tile:
     * the 32-row classifier went from 64 % to 77 % of peak on one thread. A decode batch's
     * layer matrices are as cold: a step streams every weight once, the classifier's 37 MB and
     * the KV reads between two uses of a layer, so with at most 64 rows they take the same path
     * (their two-thread time in a batch-32 decode fell by a quarter). With fewer passes, or
     * more rows of a matrix that stays in cache (a prompt), the short-distance prefetch
     * measured as fast or faster. */
    bool ahead = n > 24 && (n <= 64 || (size_t)m->rows * wrb >= ((size_t)4 << 20));
    /* 3 activation rows × 4 weight rows fill all four lanes of each reduce4 where 4 × 3 fill
     * three, and at k = 288 the reduction is about a tenth of a tile: the prefill shapes went
     * from 87-88 % to 91-92 % of peak on one thread. Its activation blocks of 9 rows rather
     * than 12 leave L1 more room for the weight tiles passing through: w2 (k = 768, blocks of
     * 384) went from 81 % to 85 %. The streamed classifier keeps 4 × 3 in blocks of 12: its 3
     * weight loads per k step leave L2 room for the far prefetch (77 % against 69 %). So do
     * small decode batches: 4 or 16 rows are whole 4-row tiles, where 3-row tiles leave a 1-row
     * tile that loads every weight vector for a single FMA. */
    if (ahead)
        slices(t, 4, 3, true, out, x, m, n, d0, d1, kc, nb);
    else if (n <= 16)
        slices(t, 4, 3, false, out, x, m, n, d0, d1, kc, nb);
    else
        slices(t, 3, 4, false, out, x, m, n, d0, d1, kc, nb);
}

TARGET static void matmul_f32(float *out, const float *x, const struct sl_mat *m, int n, int d0,
                              int d1)
{
    matmul_t(SL_DTYPE_F32, out, x, m, n, d0, d1);
}

TARGET static void matmul_f16(float *out, const float *x, const struct sl_mat *m, int n, int d0,
                              int d1)
{
    matmul_t(SL_DTYPE_F16, out, x, m, n, d0, d1);
}

TARGET static void matmul_bf16(float *out, const float *x, const struct sl_mat *m, int n, int d0,
                               int d1)
{
    matmul_t(SL_DTYPE_BF16, out, x, m, n, d0, d1);
}

TARGET static void matmul_q8_0(float *out, const float *x, const struct sl_mat *m, int n, int d0,
                               int d1)
{
    matmul_t(SL_DTYPE_Q8_0, out, x, m, n, d0, d1);
}

TARGET static void matmul_q4_0(float *out, const float *x, const struct sl_mat *m, int n, int d0,
                               int d1)
{
    matmul_t(SL_DTYPE_Q4_0, out, x, m, n, d0, d1);
}

TARGET static void matmul_q4_k(float *out, const float *x, const struct sl_mat *m, int n, int d0,
                               int d1)
{
    matmul_t(SL_DTYPE_Q4_K, out, x, m, n, d0, d1);
}

TARGET static void matmul_q5_k(float *out, const float *x, const struct sl_mat *m, int n, int d0,
                               int d1)
{
    matmul_t(SL_DTYPE_Q5_K, out, x, m, n, d0, d1);
}

TARGET static void matmul_q6_k(float *out, const float *x, const struct sl_mat *m, int n, int d0,
                               int d1)
{
    matmul_t(SL_DTYPE_Q6_K, out, x, m, n, d0, d1);
}

void sl_cpu_avx2_matmul_cols(float *out, const float *x, const struct sl_mat *w, int n, int d0,
                             int d1)
{
    switch (w->type) {
    case SL_DTYPE_F32: matmul_f32(out, x, w, n, d0, d1); break;
    case SL_DTYPE_F16: matmul_f16(out, x, w, n, d0, d1); break;
    case SL_DTYPE_BF16: matmul_bf16(out, x, w, n, d0, d1); break;
    case SL_DTYPE_Q8_0: matmul_q8_0(out, x, w, n, d0, d1); break;
    case SL_DTYPE_Q4_0: matmul_q4_0(out, x, w, n, d0, d1); break;
    case SL_DTYPE_Q4_K: matmul_q4_k(out, x, w, n, d0, d1); break;
    case SL_DTYPE_Q5_K: matmul_q5_k(out, x, w, n, d0, d1); break;
    case SL_DTYPE_Q6_K: matmul_q6_k(out, x, w, n, d0, d1); break;
    }
}

TARGET float sl_cpu_avx2_dot(const float *a, const float *b, int n)
{
    __m256 acc = _mm256_setzero_ps();
    int n8 = n & ~7;
    for (int j = 0; j < n8; j += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
    float s = reduce1(acc);
    for (int j = n8; j < n; j++)
        s += a[j] * b[j];
    return s;
}

/* e^x for fp32 lanes, Cephes' expf: x = n·ln2 + r with |r| <= ln2/2, a degree-6 polynomial for
 * e^r, then 2^n through the exponent bits. About 1 ulp; inputs below -87.3 give 0, above 88 are
 * clamped (e^88 ≈ 1.65e38), so softmax and SiLU never see inf or NaN from it. */
INLINE __m256 exp8(__m256 x)
{
    __m256 zero = _mm256_cmp_ps(x, _mm256_set1_ps(SL_CPU_EXP_MIN), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(SL_CPU_EXP_MIN)),
                      _mm256_set1_ps(SL_CPU_EXP_MAX));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(SL_CPU_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SL_CPU_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SL_CPU_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(SL_CPU_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_CPU_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_CPU_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_CPU_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_CPU_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(SL_CPU_EXP_P5));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(zero, y);
}

/* silu(h) * g for 8 lanes, llama2.c's expression order. */
INLINE __m256 swiglu8(__m256 h, __m256 g)
{
    __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), h));
    __m256 v = _mm256_mul_ps(h, _mm256_div_ps(one, _mm256_add_ps(one, e)));
    return _mm256_mul_ps(v, g);
}

TARGET void sl_cpu_avx2_swiglu(float *h, const float *g, int n)
{
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8)
        _mm256_storeu_ps(h + i, swiglu8(_mm256_loadu_ps(h + i), _mm256_loadu_ps(g + i)));
    if (n8 < n) {
        /* The tail goes through the same vector code (padded), so an element's value never
         * depends on where a row or a thread's share of it ends. */
        float hb[8] = {0}, gb[8] = {0};
        memcpy(hb, h + n8, (size_t)(n - n8) * sizeof(float));
        memcpy(gb, g + n8, (size_t)(n - n8) * sizeof(float));
        _mm256_storeu_ps(hb, swiglu8(_mm256_loadu_ps(hb), _mm256_loadu_ps(gb)));
        memcpy(h + n8, hb, (size_t)(n - n8) * sizeof(float));
    }
}

/* (v0, v1) -> (v0·c − v1·s, v0·s + v1·c) for each interleaved pair: the scalar kernel's
 * products and sums, unfused, so the bits are the same. */
TARGET void sl_cpu_avx2_rope_apply(float *x, int n_heads, int head_size, const float *cs)
{
    int h8 = head_size & ~7;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_size;
        for (int i = 0; i < h8; i += 8) {
            __m256 xv = _mm256_loadu_ps(v + i), t = _mm256_loadu_ps(cs + i);
            __m256 sw = _mm256_permute_ps(xv, 0xb1);             /* (v1, v0) in each pair */
            __m256 a = _mm256_mul_ps(xv, _mm256_moveldup_ps(t)); /* (v0·c, v1·c) */
            __m256 b = _mm256_mul_ps(sw, _mm256_movehdup_ps(t)); /* (v1·s, v0·s) */
            _mm256_storeu_ps(v + i, _mm256_addsub_ps(a, b));
        }
        for (int i = h8; i < head_size; i += 2) {
            float fcr = cs[i], fci = cs[i + 1], v0 = v[i], v1 = v[i + 1];
            v[i] = v0 * fcr - v1 * fci;
            v[i + 1] = v0 * fci + v1 * fcr;
        }
    }
}

TARGET float sl_cpu_avx2_softmax_max(const float *x, int n)
{
    int n8 = n & ~7;
    __m256 mv = _mm256_set1_ps(x[0]);
    for (int i = 0; i < n8; i += 8)
        mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
    float mb[8];
    _mm256_storeu_ps(mb, mv);
    float max = mb[0];
    for (int i = 1; i < 8; i++)
        max = mb[i] > max ? mb[i] : max;
    for (int i = n8; i < n; i++)
        max = x[i] > max ? x[i] : max;
    return max;
}

TARGET float sl_cpu_avx2_sum_tree(const float *lanes)
{
    return reduce1(_mm256_loadu_ps(lanes));
}

TARGET void sl_cpu_avx2_softmax(float *x, int n)
{
    int n8 = n & ~7;
    float max = sl_cpu_avx2_softmax_max(x, n);
    __m256 m = _mm256_set1_ps(max), sum = _mm256_setzero_ps();
    for (int i = 0; i < n8; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), m));
        _mm256_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (n8 < n) {
        /* Padding lanes are -inf and come out exactly 0. */
        float tb[8];
        for (int i = 0; i < 8; i++)
            tb[i] = n8 + i < n ? x[n8 + i] : -INFINITY;
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(tb), m));
        _mm256_storeu_ps(tb, e);
        sum = _mm256_add_ps(sum, e);
        memcpy(x + n8, tb, (size_t)(n - n8) * sizeof(float));
    }
    float s = reduce1(sum);
    __m256 sv = _mm256_set1_ps(s);
    for (int i = 0; i < n8; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), sv));
    for (int i = n8; i < n; i++)
        x[i] /= s;
}

TARGET void sl_cpu_avx2_div(float *x, int n, float d)
{
    int n8 = n & ~7;
    __m256 dv = _mm256_set1_ps(d);
    for (int i = 0; i < n8; i += 8)
        _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), dv));
    for (int i = n8; i < n; i++)
        x[i] /= d;
}

/* sl_cpu_argmax over the values above -inf, or -1 when there is none (all -inf or NaN: the
 * caller's scalar rule decides). Each lane keeps its first strict maximum (ordered compares, so
 * NaN never wins); across lanes the lowest index of the largest value. */
TARGET int32_t sl_cpu_avx2_argmax(const float *x, int n)
{
    int n8 = n & ~7;
    __m256 best = _mm256_set1_ps(-INFINITY);
    __m256 at = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i step = _mm256_set1_epi32(8);
    for (int i = 0; i < n8; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 gt = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
        best = _mm256_blendv_ps(best, v, gt);
        at = _mm256_blendv_ps(at, _mm256_castsi256_ps(idx), gt);
        idx = _mm256_add_epi32(idx, step);
    }
    float bv[8];
    int32_t bi[8];
    _mm256_storeu_ps(bv, best);
    _mm256_storeu_si256((__m256i *)bi, _mm256_castps_si256(at));
    float m = -INFINITY;
    int32_t where = -1;
    for (int l = 0; l < 8; l++)
        if (bi[l] >= 0 && (bv[l] > m || (bv[l] == m && bi[l] < where))) {
            m = bv[l];
            where = bi[l];
        }
    for (int i = n8; i < n; i++)
        if (x[i] > m) {
            m = x[i];
            where = i;
        }
    return where;
}

TARGET void sl_cpu_avx2_rmsnorm(float *out, const float *x, const float *w, int n, int dim,
                                float eps)
{
    int d8 = dim & ~7;
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < d8; j += 8) {
            __m256 v = _mm256_loadu_ps(xr + j);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = reduce1(acc);
        for (int j = d8; j < dim; j++)
            ss += xr[j] * xr[j];
        ss /= (float)dim;
        ss += eps;
        ss = 1.0f / sqrtf(ss);
        __m256 sv = _mm256_set1_ps(ss);
        for (int j = 0; j < d8; j += 8)
            _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(w + j),
                                                  _mm256_mul_ps(sv, _mm256_loadu_ps(xr + j))));
        for (int j = d8; j < dim; j++)
            o[j] = w[j] * (ss * xr[j]);
    }
}

TARGET void sl_cpu_avx2_add(float *y, const float *x, int n)
{
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (int i = n8; i < n; i++)
        y[i] += x[i];
}

TARGET void sl_cpu_avx2_axpy(float *y, float a, const float *x, int n)
{
    int n8 = n & ~7;
    __m256 av = _mm256_set1_ps(a);
    for (int i = 0; i < n8; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    /* Fused in the tail too, so every element is rounded the same way. */
    for (int i = n8; i < n; i++)
        y[i] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(x[i]), _mm_set_ss(y[i])));
}

/* Walks the rows of paged K or V in position order without a division per row. */
/* Rows are bytes here: K and V are stored as fp32 or fp16 (t), and load_w / scalar_w convert
 * them exactly to fp32 in registers, as they do weights. */
struct row_iter {
    const struct sl_cpu_pages *p;
    const unsigned char *row;
    size_t es; /* bytes per element */
    int page, slot;
};

INLINE size_t elem_bytes(const enum sl_dtype t)
{
    return t == SL_DTYPE_F16 ? 2 : 4;
}

INLINE const unsigned char *page_base(const enum sl_dtype t, const struct sl_cpu_pages *p, int page)
{
    return (const unsigned char *)p->base + (size_t)p->pages[page] * p->page_stride * elem_bytes(t);
}

INLINE struct row_iter rows_begin(const enum sl_dtype t, const struct sl_cpu_pages *p)
{
    struct row_iter it = {p, page_base(t, p, 0), elem_bytes(t), 0, 0};
    return it;
}

INLINE const unsigned char *rows_next(struct row_iter *it)
{
    const unsigned char *r = it->row;
    if (++it->slot == it->p->page_size) {
        it->slot = 0;
        it->page++;
        /* Only read the next page's id when a row of it will be asked for. */
        it->row = NULL;
    } else {
        it->row += it->p->row_stride * it->es;
    }
    return r;
}

INLINE const unsigned char *rows_get(struct row_iter *it)
{
    if (!it->row)
        it->row = (const unsigned char *)it->p->base +
                  (size_t)it->p->pages[it->page] * it->p->page_stride * it->es;
    return rows_next(it);
}

/* out[0 .. 8·NV) = Σ_t att[t] · v_t[j0 .. j0 + 8·NV), each lane summed in t order with FMAs. */
INLINE void attn_values(const enum sl_dtype ty, const int NV, float *out, const float *att,
                        const struct sl_cpu_pages *v, int n_ctx, int j0)
{
    __m256 acc[8];
#pragma GCC unroll 8
    for (int c = 0; c < NV; c++)
        acc[c] = _mm256_setzero_ps();
    struct row_iter it = rows_begin(ty, v);
    for (int t = 0; t < n_ctx; t++) {
        const unsigned char *vt = rows_get(&it);
        __m256 a = _mm256_set1_ps(att[t]);
#pragma GCC unroll 8
        for (int c = 0; c < NV; c++)
            acc[c] = _mm256_fmadd_ps(a, load_w(ty, vt, j0 + 8 * c), acc[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NV; c++)
        _mm256_storeu_ps(out + 8 * c, acc[c]);
}

/* Row t of paged K or V (t < the sequence's length). */
INLINE struct row_iter rows_at(const enum sl_dtype ty, const struct sl_cpu_pages *p, int t)
{
    struct row_iter it = {p, NULL, elem_bytes(ty), t / p->page_size, t % p->page_size};
    it.row = page_base(ty, p, it.page) + (size_t)it.slot * p->row_stride * elem_bytes(ty);
    return it;
}

/* The k % 8 tail of the values: out[h8 .. hs) = Σ_t att[t] · v_t[h8 .. hs), fused in t order. */
INLINE void attn_values_tail(const enum sl_dtype ty, float *out, const float *att,
                             const struct sl_cpu_pages *v, int n_ctx, int h8, int hs)
{
    for (int j = h8; j < hs; j++)
        out[j] = 0.0f;
    struct row_iter vi = rows_begin(ty, v);
    for (int t = 0; t < n_ctx; t++) {
        const unsigned char *vt = rows_get(&vi);
        __m128 a = _mm_set_ss(att[t]);
        for (int j = h8; j < hs; j++)
            out[j] =
                _mm_cvtss_f32(_mm_fmadd_ss(a, _mm_set_ss(scalar_w(ty, vt, j)), _mm_set_ss(out[j])));
    }
}

INLINE void attention_t(const enum sl_dtype ty, float *out, const float *q,
                        const struct sl_cpu_pages *k, const struct sl_cpu_pages *v, int n_ctx,
                        int hs, float *att)
{
    float scale = sqrtf((float)hs);
    __m128 scale4 = _mm_set1_ps(scale);
    int h8 = hs & ~7, t = 0;
    struct row_iter it = rows_begin(ty, k);
    /* Scores four positions at a time (four independent FMA chains); each score is reduced by
     * the same tree as a lone one, so grouping does not change it. */
    for (; t + 4 <= n_ctx; t += 4) {
        const unsigned char *kt[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kt[c] = rows_get(&it);
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        for (int j = 0; j < h8; j += 8) {
            __m256 qv = _mm256_loadu_ps(q + j);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[c] = _mm256_fmadd_ps(qv, load_w(ty, kt[c], j), acc[c]);
        }
        __m128 s = reduce4(acc[0], acc[1], acc[2], acc[3]);
        if (h8 < hs) {
            float sv[4];
            _mm_storeu_ps(sv, s);
            for (int c = 0; c < 4; c++)
                for (int j = h8; j < hs; j++)
                    sv[c] += q[j] * scalar_w(ty, kt[c], j);
            s = _mm_loadu_ps(sv);
        }
        _mm_storeu_ps(att + t, _mm_div_ps(s, scale4));
    }
    for (; t < n_ctx; t++) {
        /* One position: sl_cpu_avx2_dot's order, on the converted row. */
        const unsigned char *kr = rows_get(&it);
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < h8; j += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), load_w(ty, kr, j), acc);
        float sc = reduce1(acc);
        for (int j = h8; j < hs; j++)
            sc += q[j] * scalar_w(ty, kr, j);
        att[t] = sc / scale;
    }
    sl_cpu_softmax(att, n_ctx);
    int j0 = 0;
    for (; j0 + 64 <= h8; j0 += 64)
        attn_values(ty, 8, out + j0, att, v, n_ctx, j0);
    switch ((h8 - j0) / 8) {
    case 7: attn_values(ty, 7, out + j0, att, v, n_ctx, j0); break;
    case 6: attn_values(ty, 6, out + j0, att, v, n_ctx, j0); break;
    case 5: attn_values(ty, 5, out + j0, att, v, n_ctx, j0); break;
    case 4: attn_values(ty, 4, out + j0, att, v, n_ctx, j0); break;
    case 3: attn_values(ty, 3, out + j0, att, v, n_ctx, j0); break;
    case 2: attn_values(ty, 2, out + j0, att, v, n_ctx, j0); break;
    case 1: attn_values(ty, 1, out + j0, att, v, n_ctx, j0); break;
    default: break;
    }
    if (h8 < hs)
        attn_values_tail(ty, out, att, v, n_ctx, h8, hs);
}

TARGET static void attention_f32(float *out, const float *q, const struct sl_cpu_pages *k,
                                 const struct sl_cpu_pages *v, int n_ctx, int hs, float *att)
{
    attention_t(SL_DTYPE_F32, out, q, k, v, n_ctx, hs, att);
}

TARGET static void attention_f16(float *out, const float *q, const struct sl_cpu_pages *k,
                                 const struct sl_cpu_pages *v, int n_ctx, int hs, float *att)
{
    attention_t(SL_DTYPE_F16, out, q, k, v, n_ctx, hs, att);
}

TARGET void sl_cpu_avx2_attention(float *out, const float *q, const struct sl_cpu_pages *k,
                                  const struct sl_cpu_pages *v, int n_ctx, int hs, float *att)
{
    if (k->type == SL_DTYPE_F16)
        attention_f16(out, q, k, v, n_ctx, hs, att);
    else
        attention_f32(out, q, k, v, n_ctx, hs, att);
}

/* Scores of NQ queries against positions [t0, t1) of K, four positions at a time, every score
 * computed exactly as sl_cpu_avx2_attention computes it (one tree per score, whatever the
 * grouping). A score is stored only where the position is below its query's n_ctx. */
INLINE void multi_scores(const enum sl_dtype ty, const int NQ, const float *const *qs,
                         const int *n_ctx, const struct sl_cpu_pages *k, int t0, int t1, int hs,
                         float *att, size_t stride)
{
    float scale = sqrtf((float)hs);
    __m128 scale4 = _mm_set1_ps(scale);
    int h8 = hs & ~7, t = t0;
    struct row_iter it = rows_at(ty, k, t0);
    for (; t + 4 <= t1; t += 4) {
        const unsigned char *kt[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kt[c] = rows_get(&it);
        __m256 acc[3][4];
#pragma GCC unroll 3
        for (int i = 0; i < NQ; i++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[i][c] = _mm256_setzero_ps();
        for (int j = 0; j < h8; j += 8) {
            __m256 kv[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                kv[c] = load_w(ty, kt[c], j);
#pragma GCC unroll 3
            for (int i = 0; i < NQ; i++) {
                __m256 qv = _mm256_loadu_ps(qs[i] + j);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
                    acc[i][c] = _mm256_fmadd_ps(qv, kv[c], acc[i][c]);
            }
        }
#pragma GCC unroll 3
        for (int i = 0; i < NQ; i++) {
            float sv[4];
            _mm_storeu_ps(sv, reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
            if (h8 < hs)
                for (int c = 0; c < 4; c++)
                    for (int j = h8; j < hs; j++)
                        sv[c] += qs[i][j] * scalar_w(ty, kt[c], j);
            float *a = att + (size_t)i * stride;
            if (t + 4 <= n_ctx[i]) {
                _mm_storeu_ps(a + t, _mm_div_ps(_mm_loadu_ps(sv), scale4));
            } else {
                for (int c = 0; c < 4 && t + c < n_ctx[i]; c++)
                    a[t + c] = sv[c] / scale;
            }
        }
    }
    for (; t < t1; t++) {
        const unsigned char *kr = rows_get(&it);
        for (int i = 0; i < NQ; i++)
            if (t < n_ctx[i]) {
                __m256 acc = _mm256_setzero_ps();
                for (int j = 0; j < h8; j += 8)
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(qs[i] + j), load_w(ty, kr, j), acc);
                float sc = reduce1(acc);
                for (int j = h8; j < hs; j++)
                    sc += qs[i][j] * scalar_w(ty, kr, j);
                att[(size_t)i * stride + t] = sc / scale;
            }
    }
}

/* outs[i][j0 .. j0 + 8·NV) (=, or += when !first) Σ_{t in [t0, t1)} att_i[t] · v_t, continuing
 * each lane's FMA chain in t order; NQ·NV <= 9 accumulators (with the NV value vectors and a
 * broadcast, at most 16 registers). */
INLINE void multi_values(const enum sl_dtype ty, const int NQ, const int NV, float *const *outs,
                         const float *att, size_t stride, const struct sl_cpu_pages *v, int t0,
                         int t1, int j0, bool first)
{
    __m256 acc[3][4];
#pragma GCC unroll 3
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            acc[i][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(outs[i] + j0 + 8 * c);
    struct row_iter it = rows_at(ty, v, t0);
    for (int t = t0; t < t1; t++) {
        const unsigned char *vt = rows_get(&it);
        __m256 vv[4];
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            vv[c] = load_w(ty, vt, j0 + 8 * c);
#pragma GCC unroll 3
        for (int i = 0; i < NQ; i++) {
            __m256 a = _mm256_set1_ps(att[(size_t)i * stride + t]);
#pragma GCC unroll 4
            for (int c = 0; c < NV; c++)
                acc[i][c] = _mm256_fmadd_ps(a, vv[c], acc[i][c]);
        }
    }
#pragma GCC unroll 3
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 4
        for (int c = 0; c < NV; c++)
            _mm256_storeu_ps(outs[i] + j0 + 8 * c, acc[i][c]);
}

/* The values of NQ queries over [0, n_min) together, then each query alone over the positions
 * only it sees: every lane's chain is the same as sl_cpu_avx2_attention's. */
INLINE void multi_values_all(const enum sl_dtype ty, const int NQ, const int NV, float *const *outs,
                             const float *att, size_t stride, const struct sl_cpu_pages *v,
                             const int *n_ctx, int n_min, int j0)
{
    multi_values(ty, NQ, NV, outs, att, stride, v, 0, n_min, j0, true);
    for (int i = 0; i < NQ; i++)
        if (n_ctx[i] > n_min)
            multi_values(ty, 1, NV, outs + i, att + (size_t)i * stride, stride, v, n_min, n_ctx[i],
                         j0, false);
}

INLINE void attention_multi_t(const enum sl_dtype ty, const int NQ, float *const *outs,
                              const float *const *qs, const int *n_ctx,
                              const struct sl_cpu_pages *k, const struct sl_cpu_pages *v, int hs,
                              float *att, size_t stride)
{
    int n_min = n_ctx[0], n_max = n_ctx[0];
    for (int i = 1; i < NQ; i++) {
        n_min = n_ctx[i] < n_min ? n_ctx[i] : n_min;
        n_max = n_ctx[i] > n_max ? n_ctx[i] : n_max;
    }
    multi_scores(ty, NQ, qs, n_ctx, k, 0, n_max, hs, att, stride);
    for (int i = 0; i < NQ; i++)
        sl_cpu_softmax(att + (size_t)i * stride, n_ctx[i]);
    /* 24 lanes at a time: 3 queries × 4 vectors plus the 4 value vectors and a broadcast are
     * 17 registers, and the accumulator that spilled put a store and a reload in every
     * position's FMA chain (a fifth of the kernel's time). */
    int h8 = hs & ~7, j0 = 0;
    for (; j0 + 24 <= h8; j0 += 24)
        multi_values_all(ty, NQ, 3, outs, att, stride, v, n_ctx, n_min, j0);
    switch ((h8 - j0) / 8) {
    case 2: multi_values_all(ty, NQ, 2, outs, att, stride, v, n_ctx, n_min, j0); break;
    case 1: multi_values_all(ty, NQ, 1, outs, att, stride, v, n_ctx, n_min, j0); break;
    default: break;
    }
    if (h8 < hs)
        for (int i = 0; i < NQ; i++)
            attn_values_tail(ty, outs[i], att + (size_t)i * stride, v, n_ctx[i], h8, hs);
}

TARGET static void attention_multi_f32(int nq, float *const *outs, const float *const *qs,
                                       const int *n_ctx, const struct sl_cpu_pages *k,
                                       const struct sl_cpu_pages *v, int hs, float *att,
                                       size_t att_stride)
{
    if (nq == 2)
        attention_multi_t(SL_DTYPE_F32, 2, outs, qs, n_ctx, k, v, hs, att, att_stride);
    else
        attention_multi_t(SL_DTYPE_F32, 3, outs, qs, n_ctx, k, v, hs, att, att_stride);
}

TARGET static void attention_multi_f16(int nq, float *const *outs, const float *const *qs,
                                       const int *n_ctx, const struct sl_cpu_pages *k,
                                       const struct sl_cpu_pages *v, int hs, float *att,
                                       size_t att_stride)
{
    if (nq == 2)
        attention_multi_t(SL_DTYPE_F16, 2, outs, qs, n_ctx, k, v, hs, att, att_stride);
    else
        attention_multi_t(SL_DTYPE_F16, 3, outs, qs, n_ctx, k, v, hs, att, att_stride);
}

TARGET void sl_cpu_avx2_attention_multi(int nq, float *const *outs, const float *const *qs,
                                        const int *n_ctx, const struct sl_cpu_pages *k,
                                        const struct sl_cpu_pages *v, int hs, float *att,
                                        size_t att_stride)
{
    /* Three queries at a time: the registers hold no more. */
    for (int i = 0; i < nq; i += 3) {
        int m = nq - i < 3 ? nq - i : 3;
        float *a = att + (size_t)i * att_stride;
        if (m == 1)
            sl_cpu_avx2_attention(outs[i], qs[i], k, v, n_ctx[i], hs, a);
        else if (k->type == SL_DTYPE_F16)
            attention_multi_f16(m, outs + i, qs + i, n_ctx + i, k, v, hs, a, att_stride);
        else
            attention_multi_f32(m, outs + i, qs + i, n_ctx + i, k, v, hs, a, att_stride);
    }
}

/* Fetches into L2 the lines of pf from offset o up to end (at most pf_bytes; none when pf is
 * NULL) and returns where it stopped: a share of the next page's run spread over a head's rows. */
INLINE size_t fetch_share(const unsigned char *pf, size_t o, size_t end, size_t pf_bytes)
{
    for (; pf && o < end && o < pf_bytes; o += 64)
        _mm_prefetch((const char *)(pf + o), _MM_HINT_T1);
    return o;
}

/* Scores of query head q against the n rows of one page's KV head starting at position t0
 * (rows hs elements apart), each computed as attention_t computes it; meanwhile the pf_bytes at
 * pf (or none) are fetched into L2, a share before each group of four rows. */
INLINE void row_scores(const enum sl_dtype ty, float *att, const float *q, const unsigned char *k,
                       int t0, int n, int hs, __m128 scale4, float scale, const unsigned char *pf,
                       size_t pf_bytes)
{
    size_t rb = (size_t)hs * elem_bytes(ty);
    int s = 0;
    size_t per = pf ? ((pf_bytes / 64 + 3) / 4) * 64 : 0, o = 0;
    for (; s + 4 <= n; s += 4) {
        o = fetch_share(pf, o, o + per, pf_bytes);
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                         _mm256_setzero_ps()};
        for (int j = 0; j < hs; j += 8) {
            __m256 qv = _mm256_loadu_ps(q + j);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[c] = _mm256_fmadd_ps(qv, load_w(ty, k + (size_t)(s + c) * rb, j), acc[c]);
        }
        _mm_storeu_ps(att + t0 + s, _mm_div_ps(reduce4(acc[0], acc[1], acc[2], acc[3]), scale4));
    }
    fetch_share(pf, o, pf_bytes, pf_bytes);
    for (; s < n; s++) {
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < hs; j += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), load_w(ty, k + (size_t)s * rb, j), acc);
        att[t0 + s] = reduce1(acc) / scale;
    }
}

/* out[j0 .. j0 + 8·NV) (=, or += continuing each lane's chain when !first) Σ att[t0 + s] · v_s
 * over the n rows of one page's KV head; meanwhile the pf_bytes at pf (or none) are fetched into
 * L2, a share before each row. */
INLINE void row_values(const enum sl_dtype ty, const int NV, float *out, const float *att,
                       const unsigned char *v, int t0, int n, int hs, int j0, bool first,
                       const unsigned char *pf, size_t pf_bytes)
{
    size_t rb = (size_t)hs * elem_bytes(ty);
    __m256 acc[8];
#pragma GCC unroll 8
    for (int c = 0; c < NV; c++)
        acc[c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(out + j0 + 8 * c);
    size_t per = pf && n > 0 ? (pf_bytes / 64 + (size_t)n - 1) / (size_t)n * 64 : 0, o = 0;
    for (int s = 0; s < n; s++) {
        o = fetch_share(pf, o, o + per, pf_bytes);
        __m256 a = _mm256_set1_ps(att[t0 + s]);
#pragma GCC unroll 8
        for (int c = 0; c < NV; c++)
            acc[c] = _mm256_fmadd_ps(a, load_w(ty, v + (size_t)s * rb, j0 + 8 * c), acc[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NV; c++)
        _mm256_storeu_ps(out + j0 + 8 * c, acc[c]);
}

/* One decode row over pages of (n_kv_heads, page_size, hs): every head's scores page by page,
 * each head's softmax, then every head's values page by page. A page's heads are one run of
 * memory, read in address order, and the next page's run is fetched while this one is used:
 * the same arithmetic as attention_t per head (scores by the same tree, each value lane's FMA
 * chain in position order, carried through out between pages), so the bits are the same. */
INLINE void attention_row_t(const enum sl_dtype ty, float *out, const float *q, int n_heads,
                            int n_kv_heads, const struct sl_cpu_pages *k,
                            const struct sl_cpu_pages *v, int n_ctx, int hs, float *att,
                            size_t stride)
{
    float scale = sqrtf((float)hs);
    __m128 scale4 = _mm_set1_ps(scale);
    int ps = k->page_size, kv_mul = n_heads / n_kv_heads, n_pages = (n_ctx + ps - 1) / ps;
    size_t es = elem_bytes(ty), head_bytes = (size_t)ps * (size_t)hs * es;
    size_t run = head_bytes * (size_t)n_kv_heads;
    /* The next page's run is fetched a part during each head's work on this page, spread over
     * its rows: the misses overlap the arithmetic, where a burst of them at the page's start
     * stalled it (attention 10-20 % faster in a batch-32 step; all of the next run at the page's
     * start 1.115 against a part before each head, and a part spread over each head's rows
     * against that 0.953-0.967). Into L2 rather than L1: an L1 fetch holds one of the core's few
     * L1 miss buffers until its line comes, and a page's run (18 KiB for stories15M) fetched
     * into L1 ran out of them (to L2: 0.916-0.937; one, two or three pages ahead the same). */
    size_t part = (run / (size_t)n_heads + 63) & ~(size_t)63;
    for (int p = 0; p < n_pages; p++) {
        const unsigned char *base = page_base(ty, k, p);
        const unsigned char *next = p + 1 < n_pages ? page_base(ty, k, p + 1) : page_base(ty, v, 0);
        int t0 = p * ps, n = n_ctx - t0 < ps ? n_ctx - t0 : ps;
        for (int h = 0; h < n_heads; h++) {
            size_t lo = (size_t)h * part, hi = lo + part < run ? lo + part : run;
            row_scores(ty, att + (size_t)h * stride, q + (size_t)h * hs,
                       base + (size_t)(h / kv_mul) * head_bytes, t0, n, hs, scale4, scale,
                       lo < run ? next + lo : NULL, lo < run ? hi - lo : 0);
        }
    }
    for (int h = 0; h < n_heads; h++)
        sl_cpu_softmax(att + (size_t)h * stride, n_ctx);
    for (int p = 0; p < n_pages; p++) {
        const unsigned char *base = page_base(ty, v, p);
        const unsigned char *next = p + 1 < n_pages ? page_base(ty, v, p + 1) : NULL;
        int t0 = p * ps, n = n_ctx - t0 < ps ? n_ctx - t0 : ps;
        for (int h = 0; h < n_heads; h++) {
            size_t lo = (size_t)h * part, hi = lo + part < run ? lo + part : run;
            const unsigned char *pf = next && lo < run ? next + lo : NULL;
            size_t pfb = pf ? hi - lo : 0;
            const unsigned char *vh = base + (size_t)(h / kv_mul) * head_bytes;
            const float *a = att + (size_t)h * stride;
            float *o = out + (size_t)h * hs;
            int j0 = 0;
            for (; j0 + 64 <= hs; j0 += 64, pf = NULL)
                row_values(ty, 8, o, a, vh, t0, n, hs, j0, p == 0, pf, pfb);
            switch ((hs - j0) / 8) {
            case 7: row_values(ty, 7, o, a, vh, t0, n, hs, j0, p == 0, pf, pfb); break;
            case 6: row_values(ty, 6, o, a, vh, t0, n, hs, j0, p == 0, pf, pfb); break;
            case 5: row_values(ty, 5, o, a, vh, t0, n, hs, j0, p == 0, pf, pfb); break;
            case 4: row_values(ty, 4, o, a, vh, t0, n, hs, j0, p == 0, pf, pfb); break;
            case 3: row_values(ty, 3, o, a, vh, t0, n, hs, j0, p == 0, pf, pfb); break;
            case 2: row_values(ty, 2, o, a, vh, t0, n, hs, j0, p == 0, pf, pfb); break;
            case 1: row_values(ty, 1, o, a, vh, t0, n, hs, j0, p == 0, pf, pfb); break;
            default: break;
            }
        }
    }
}

TARGET static void attention_row_f32(float *out, const float *q, int n_heads, int n_kv_heads,
                                     const struct sl_cpu_pages *k, const struct sl_cpu_pages *v,
                                     int n_ctx, int hs, float *att, size_t stride)
{
    attention_row_t(SL_DTYPE_F32, out, q, n_heads, n_kv_heads, k, v, n_ctx, hs, att, stride);
}

TARGET static void attention_row_f16(float *out, const float *q, int n_heads, int n_kv_heads,
                                     const struct sl_cpu_pages *k, const struct sl_cpu_pages *v,
                                     int n_ctx, int hs, float *att, size_t stride)
{
    attention_row_t(SL_DTYPE_F16, out, q, n_heads, n_kv_heads, k, v, n_ctx, hs, att, stride);
}

void sl_cpu_avx2_attention_row(float *out, const float *q, int n_heads, int n_kv_heads,
                               const struct sl_cpu_pages *k, const struct sl_cpu_pages *v,
                               int n_ctx, int hs, float *att, size_t att_stride)
{
    if (k->type == SL_DTYPE_F16)
        attention_row_f16(out, q, n_heads, n_kv_heads, k, v, n_ctx, hs, att, att_stride);
    else
        attention_row_f32(out, q, n_heads, n_kv_heads, k, v, n_ctx, hs, att, att_stride);
}

TARGET void sl_cpu_avx2_f32_to_f16_row(uint16_t *dst, const float *src, int n)
{
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (int i = n8; i < n; i++)
        dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

TARGET float sl_cpu_avx2_bench_read(const float *buf, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        /* Ahead as the decode matmul asks for its weights (PF_AHEAD bytes): the hardware
         * prefetcher alone streams about half the rate a core can draw, and a ceiling the
         * engine beats is no ceiling. */
        if (i + PF_AHEAD / 4 + 32 <= n) {
            _mm_prefetch((const char *)(buf + i + PF_AHEAD / 4), _MM_HINT_T0);
            _mm_prefetch((const char *)(buf + i + PF_AHEAD / 4 + 16), _MM_HINT_T0);
        }
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(buf + i));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(buf + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(buf + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(buf + i + 24));
    }
    return reduce1(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

TARGET double sl_cpu_avx2_bench_fma(long iters)
{
    /* Twelve independent chains cover the FMA latency (4 cycles) times two pipes with margin. */
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    __m256 a[12];
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_set1_ps(1.0f + (float)i);
    for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm256_fmadd_ps(a[i], m, c);
    }
    __m256 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_ps(s, a[i]);
    volatile float sink = reduce1(s);
    (void)sink;
    return (double)iters * 12 * 8 * 2;
}

#endif
