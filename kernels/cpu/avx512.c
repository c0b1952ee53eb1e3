/* AVX-512 kernels (AVX-512F + VL on top of the AVX2 set), compiled with per-function target
 * attributes like avx2.c; ops.c calls them only after checking the CPU (see cpu_impl.h).
 *
 * The fp32 matmul of three rows or more gives the same bits as avx2.c's. A dot product there is
 * eight lane chains (lane l sums x[j]·w[j] for j ≡ l mod 8, in j order, one FMA per step) reduced
 * by a fixed tree; here a 16-lane register holds the eight lanes of two activation rows at once:
 * x is packed per k block as row pairs, [k step][pair][2 rows × 8 columns], and each weight
 * vector of 8 columns is broadcast to both halves as it is loaded (one load µop, no shuffle). A
 * register tile of RMP row pairs × RN weight rows keeps RMP·RN accumulators: with 32 registers,
 * 4 pairs × 6 weight rows holds 24 of them (48 rows × weights in AVX2's terms, against 12), so
 * each k step issues 10 loads for 24 16-lane FMAs where AVX2 needs 7 for 12 8-lane ones. Each
 * chain still sees the same products in the same order, and the reduction is avx2.c's tree done
 * on both halves at once, so every weight type that does not take this path, every batch size and
 * both instruction sets agree bit for bit (tested).
 */
#include "cpu_impl.h"

#if SL_CPU_HAVE_AVX512

#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>

#ifndef RMP_MAX
#define RMP_MAX 4 /* row pairs in a register tile */
#endif
#define RN_MAX 8

#define TARGET __attribute__((target("avx512f,avx512vl,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline)) TARGET

/* Per 128-bit lane, [a0+a1, a2+a3, b0+b1, b2+b3]: _mm256_hadd_ps on all four lanes. */
INLINE __m512 hadd(__m512 a, __m512 b)
{
    return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
}

/* Four accumulators of (row r | row r + 1) × weights c .. c + 3 -> floats 0..3: row r's four
 * sums, floats 8..11: row r + 1's, each lane tree ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) as in
 * avx2.c's reduce4. */
INLINE __m512 reduce4(__m512 a, __m512 b, __m512 c, __m512 d)
{
    __m512 t = hadd(hadd(a, b), hadd(c, d));
    return _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, _MM_SHUFFLE(3, 3, 1, 1)));
}

/* Eight weights of a row at column j (a multiple of 8) in both halves, converted exactly to fp32.
 * fp32: vbroadcastf64x4, a load µop (f32x8 would need AVX-512DQ); fp16 and bf16: the 16 bytes
 * broadcast by the load, then widened. */
INLINE __m512 load_w(const enum sl_dtype t, const unsigned char *row, int j)
{
    switch (t) {
    case SL_DTYPE_F32:
        return _mm512_castpd_ps(
            _mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)((const float *)row + j))));
    case SL_DTYPE_F16:
        return _mm512_cvtph_ps(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)j))));
    case SL_DTYPE_BF16: {
        __m256i h =
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(row + 2 * (size_t)j)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default: break; /* Q8_0: block-wise in tile() */
    }
    return _mm512_setzero_ps();
}

/* One weight as fp32 for the k % 8 tail (never Q8_0, whose rows are whole blocks): the
 * conversions are exact, so these are avx2.c's values. */
INLINE float scalar_w(const enum sl_dtype t, const unsigned char *row, int j)
{
    if (t == SL_DTYPE_F32)
        return ((const float *)row)[j];
    uint16_t h;
    memcpy(&h, row + 2 * (size_t)j, 2);
    return t == SL_DTYPE_F16 ? sl_cpu_f16_to_f32(h) : sl_cpu_bf16_to_f32(h);
}

/* reduce4 of a pair's accumulators for weight rows c .. c + 3 (the first again past RN). */
INLINE __m512 reduce_cols(const int RN, const __m512 *a, int c)
{
    return reduce4(a[c], a[c + 1 < RN ? c + 1 : c], a[c + 2 < RN ? c + 2 : c],
                   a[c + 3 < RN ? c + 3 : c]);
}

/* acc[p][c] += xv[p] · wv for p < RMP. */
INLINE void fma_col(const int RMP, __m512 acc[][RN_MAX], int c, const __m512 *xv, __m512 wv)
{
#pragma GCC unroll 8
    for (int p = 0; p < RMP; p++)
        acc[p][c] = _mm512_fmadd_ps(xv[p], wv, acc[p][c]);
}

/* Weight rows to fetch while a weight tile is in use: `left` 64-byte lines from address p, `lines`
 * of them per row, then a jump of `skip` bytes to the next row's (signed; rows whose runs are
 * contiguous, a k block that is the whole row, count as one run of INT_MAX lines). Into L1 (t0)
 * or L2. Addresses are integers: past the last row the jump may point beyond the matrix. */
struct fetch {
    uintptr_t p;
    ptrdiff_t skip;
    int in_row, lines, left;
    bool t0;
};

/* One line of f, or nothing once f is done: a test, the fetch, two additions and a rarely taken
 * branch per k step, where a row index and a line index took twice the µops. FLAT: the lines are
 * one run (a tile of whole rows), so no row bookkeeping, and the compiler keeps the state in
 * registers beside the tile's rather than in memory. */
INLINE void fetch_one(struct fetch *f, const bool FLAT)
{
    if (f->left <= 0)
        return;
    if (f->t0)
        _mm_prefetch((const char *)f->p, _MM_HINT_T0);
    else
        _mm_prefetch((const char *)f->p, _MM_HINT_T1);
    f->p += 64;
    if (!FLAT && --f->in_row == 0) {
        f->p += (uintptr_t)f->skip;
        f->in_row = f->lines;
    }
    f->left--;
}

INLINE void fetch_some(struct fetch *f, int count)
{
    for (; count > 0 && f->left > 0; count--)
        fetch_one(f, false);
}

/* out[r * ldo + c] (=, or += when j0 != 0) for the block [j0, j1) of the 2·RMP rows in xp (np
 * pairs per k step) against RN weight rows of type t, wrb bytes apart, then the tail [k8, k) when
 * j1 == k8; `rows` (1 .. 2·RMP) of them are real. f (or NULL): one line of it fetched per k step
 * (FLAT: its lines are one run, see fetch_one).
 * Spread so, a tile's fetches cost a few µops among its 24 FMAs per step and never queue behind
 * each other; fetched in a burst of a quarter of the lines before each tile, the same rows made
 * a batch-32 step 5-10 % slower (engine-bench, binaries alternated). */
INLINE void tile(const enum sl_dtype t, const bool FLAT, const int RMP, const int RN, float *out,
                 size_t ldo, const float *xp, int np, const float *x, size_t ldx,
                 const unsigned char *w, size_t wrb, int rows, int j0, int j1, int k8, int k,
                 struct fetch *f)
{
    struct fetch fl = f ? *f : (struct fetch){.left = 0};
    __m512 acc[RMP_MAX][RN_MAX];
#pragma GCC unroll 8
    for (int p = 0; p < RMP; p++)
#pragma GCC unroll 8
        for (int c = 0; c < RN; c++)
            acc[p][c] = _mm512_setzero_ps();
    const float *xs = xp;
    __m512 xv[RMP_MAX];
    if (t == SL_DTYPE_Q8_0) {
        for (int b = j0 / SL_Q8_0_BLOCK; b < j1 / SL_Q8_0_BLOCK; b++) {
            const unsigned char *blk[RN_MAX];
            __m512 d[RN_MAX];
#pragma GCC unroll 8
            for (int c = 0; c < RN; c++) {
                uint16_t h;
                blk[c] = w + (size_t)c * wrb + (size_t)b * SL_Q8_0_BYTES;
                memcpy(&h, blk[c], 2);
                d[c] = _mm512_set1_ps(_cvtsh_ss(h));
            }
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++, xs += (size_t)np * 16) {
                fetch_one(&fl, false);
#pragma GCC unroll 8
                for (int p = 0; p < RMP; p++)
                    xv[p] = _mm512_loadu_ps(xs + (size_t)p * 16);
#pragma GCC unroll 8
                for (int c = 0; c < RN; c++) {
                    long long q8;
                    memcpy(&q8, blk[c] + 2 + s * 8, 8);
                    /* d·q is exact in fp32 (11-bit by 8-bit significands), as in avx2.c. */
                    __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_set1_epi64x(q8)));
                    fma_col(RMP, acc, c, xv, _mm512_mul_ps(q, d[c]));
                }
            }
        }
    } else {
        for (int j = j0; j < j1; j += 8, xs += (size_t)np * 16) {
            fetch_one(&fl, FLAT);
#pragma GCC unroll 8
            for (int p = 0; p < RMP; p++)
                xv[p] = _mm512_loadu_ps(xs + (size_t)p * 16);
#pragma GCC unroll 8
            for (int c = 0; c < RN; c++)
                fma_col(RMP, acc, c, xv, load_w(t, w + (size_t)c * wrb, j));
        }
    }
    if (f)
        *f = fl;
    /* Whole tiles of rows and no tail: the sums go out as vectors, RN columns (a multiple of 4,
     * or 1, 2, 3 under a mask) of both rows of a pair from each reduction. */
    if (rows == 2 * RMP && (j1 != k8 || k8 == k)) {
        /* Columns in fours, then (RN % 4 == 2) the last two of two pairs in one reduction:
         * reduce4 is four independent trees, so grouping does not change a sum (RN = 6: six
         * reductions for four pairs, not eight). */
        const int C4 = RN % 4 == 2 ? RN - 2 : RN;
#pragma GCC unroll 8
        for (int p = 0; p < RMP; p++)
#pragma GCC unroll 2
            for (int c = 0; c < C4; c += 4) {
                __m512 v = reduce_cols(RN, acc[p], c);
                const __mmask8 mk = (__mmask8)(C4 - c >= 4 ? 0xf : (1u << (C4 - c)) - 1);
                float *o0 = out + (size_t)2 * p * ldo + c, *o1 = o0 + ldo;
                __m128 a = _mm512_castps512_ps128(v), b = _mm512_extractf32x4_ps(v, 2);
                if (j0 != 0) {
                    a = _mm_add_ps(a, _mm_maskz_loadu_ps(mk, o0));
                    b = _mm_add_ps(b, _mm_maskz_loadu_ps(mk, o1));
                }
                _mm_mask_storeu_ps(o0, mk, a);
                _mm_mask_storeu_ps(o1, mk, b);
            }
        if (C4 == RN)
            return;
#pragma GCC unroll 4
        for (int p = 0; p < RMP; p += 2) {
            /* Floats 0, 1: row 2p's last two sums, 2, 3: row 2p + 2's, 8 .. 11 the odd rows'. */
            const int q = p + 1 < RMP ? p + 1 : p;
            __m512 v = reduce4(acc[p][C4], acc[p][C4 + 1], acc[q][C4], acc[q][C4 + 1]);
            float *o0 = out + (size_t)2 * p * ldo + C4, *o1 = o0 + ldo;
            float *o2 = out + (size_t)2 * q * ldo + C4, *o3 = o2 + ldo;
            __m128 a = _mm512_castps512_ps128(v), b = _mm512_extractf32x4_ps(v, 2);
            if (j0 != 0) {
                a = _mm_add_ps(a, _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)o0),
                                               (const __m64 *)o2));
                b = _mm_add_ps(b, _mm_loadh_pi(_mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)o1),
                                               (const __m64 *)o3));
            }
            _mm_storel_pi((__m64 *)o0, a);
            _mm_storel_pi((__m64 *)o1, b);
            if (q != p) {
                _mm_storeh_pi((__m64 *)o2, a);
                _mm_storeh_pi((__m64 *)o3, b);
            }
        }
        return;
    }
    float s[RMP_MAX][2][RN_MAX + 3];
#pragma GCC unroll 8
    for (int p = 0; p < RMP; p++)
#pragma GCC unroll 2
        for (int c = 0; c < RN; c += 4) {
            __m512 v = reduce_cols(RN, acc[p], c);
            _mm_storeu_ps(&s[p][0][c], _mm512_castps512_ps128(v));
            _mm_storeu_ps(&s[p][1][c], _mm512_extractf32x4_ps(v, 2));
        }
    for (int r = 0; r < rows; r++) {
        float *o = out + (size_t)r * ldo, *sr = s[r / 2][r % 2];
        const float *xr = x + (size_t)r * ldx;
        for (int c = 0; c < RN; c++) {
            float v = sr[c];
            if (j0 != 0)
                v = v + o[c];
            if (j1 == k8)
                for (int j = k8; j < k; j++)
                    v += xr[j] * scalar_w(t, w + (size_t)c * wrb, j);
            o[c] = v;
        }
    }
}

#ifndef TILE_RN
#define TILE_RN 6 /* weight rows of a register tile in matmul_t */
#endif

/* What a tile() call reads besides its constants. */
struct tile_args {
    float *out;
    size_t ldo, ldx, wrb;
    const float *xp, *x;
    const unsigned char *w;
    int np, rows, j0, j1, k8, k;
    struct fetch *f;
};

/* tile() for the (t, FLAT, RMP, RN) of a call, each its own inlined copy in one function that
 * nothing else is inlined into. Inlined into the slice loops, the tile's weight row offsets did
 * not fit in the general registers left there and were reloaded from the stack each k step (six
 * loads among the 24 FMAs): on its own the 4 × 6 loop keeps them in registers, and a hot 32 × 288
 * × 864 product on one thread ran 167-178 GFLOPS against 143-164. */
#define TILE_KEY(T, F, M, N) ((((int)(T)*2 + (F)) * (RMP_MAX + 1) + (M)) * (RN_MAX + 1) + (N))
#define TILE_CASE(T, F, M, N)                                                                      \
    case TILE_KEY(T, F, M, N):                                                                     \
        tile(T, F, M, N, a->out, a->ldo, a->xp, a->np, a->x, a->ldx, a->w, a->wrb, a->rows, a->j0, \
             a->j1, a->k8, a->k, a->f);                                                            \
        return;
#define TILE_CASES_N(T, F, M) TILE_CASE(T, F, M, TILE_RN) TILE_CASE(T, F, M, 1)
#define TILE_CASES_M(T, F)                                                                         \
    TILE_CASES_N(T, F, 1) TILE_CASES_N(T, F, 2) TILE_CASES_N(T, F, 3) TILE_CASES_N(T, F, 4)
#define TILE_CASES(T) TILE_CASES_M(T, true) TILE_CASES_M(T, false)
_Static_assert(RMP_MAX == 4, "tile_call lists row-pair counts 1 to 4");

static __attribute__((noinline)) TARGET void tile_call(enum sl_dtype t, bool flat, int rmp, int rn,
                                                       const struct tile_args *a)
{
    switch (TILE_KEY(t, flat, rmp, rn)) {
        TILE_CASES(SL_DTYPE_F32)
        TILE_CASES(SL_DTYPE_F16)
        TILE_CASES(SL_DTYPE_BF16)
        TILE_CASES(SL_DTYPE_Q8_0)
    default: break;
    }
}

/* Pairs [0, np) of the packed block against rn weight rows, RMP_MAX pairs to a tile (the last
 * with fewer), flat as tile()'s FLAT. `rows` real rows from x's row 0. f (or NULL): lines to fetch
 * meanwhile, one per k step of the tiles (see tile()), what is left after them at once. */
INLINE void tile_pairs(enum sl_dtype t, bool flat, int rn, float *out, size_t ldo, const float *xp,
                       int np, const float *x, size_t ldx, const unsigned char *w, size_t wrb,
                       int rows, int j0, int j1, int k8, int k, struct fetch *f)
{
    struct tile_args a = {.ldo = ldo,
                          .ldx = ldx,
                          .wrb = wrb,
                          .w = w,
                          .np = np,
                          .j0 = j0,
                          .j1 = j1,
                          .k8 = k8,
                          .k = k,
                          .f = f};
    for (int p = 0; p < np; p += RMP_MAX) {
        int m = np - p < RMP_MAX ? np - p : RMP_MAX;
        a.out = out + (size_t)2 * p * ldo;
        a.xp = xp + (size_t)p * 16;
        a.x = x + (size_t)2 * p * ldx;
        a.rows = rows - 2 * p < 2 * m ? rows - 2 * p : 2 * m;
        tile_call(t, flat, m, rn, &a);
    }
    if (f)
        fetch_some(f, f->left);
}

/* Rows [0, rows) of x, columns [j0, j1), as (j1 − j0) / 8 k steps of np pairs of 16 floats
 * (a missing last row reads as zeros). */
INLINE void pack(float *xp, const float *x, size_t ldx, int rows, int j0, int j1)
{
    int np = (rows + 1) / 2;
    for (int j = j0; j < j1; j += 8, xp += (size_t)np * 16)
        for (int p = 0; p < np; p++) {
            const float *a = x + (size_t)2 * p * ldx + j;
            __m256 lo = _mm256_loadu_ps(a);
            __m256 hi = 2 * p + 1 < rows ? _mm256_loadu_ps(a + ldx) : _mm256_setzero_ps();
            __m512d v = _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)),
                                           _mm256_castps_pd(hi), 1);
            _mm512_storeu_ps(xp + (size_t)p * 16, _mm512_castpd_ps(v));
        }
}

/* Activation rows per packed block: 4 register tiles of 4 pairs (32 rows · kc floats, 36 KiB at
 * kc = 288, 48 KiB at KC_MAX: L1 and L2 share them with the weight slice). */
#define ROWS SL_CPU_AVX512_ROWS
#define SLICE 96

/* What matmul_t's passes share: the call's shape and where its weights are. */
struct mm {
    const unsigned char *w;
    size_t ldo, ldx, wrb;
    int d0, d1, kc, k8, k;
    bool ahead;
};

/* Weight rows [s0, s1) (a slice) over k block b for rows [r0, r0 + rows) of x, packed in xp. */
INLINE void slice_pass(const enum sl_dtype t, const struct mm *c, float *out, const float *x,
                       const float *xp, int s0, int s1, int b, int r0, int rows)
{
    int j0 = b * c->kc, j1 = j0 + c->kc < c->k8 ? j0 + c->kc : c->k8;
    /* Bytes of columns [0, j0) and [j0, j1) of a row: exact for Q8_0 too (kc is a multiple of
     * its 32-column blocks). */
    size_t at = sl_dtype_row_bytes(t, j0), run = sl_dtype_row_bytes(t, j1) - at, wrb = c->wrb;
    int lines = (int)((run + 63) / 64), np = (rows + 1) / 2, d1 = c->d1;
    bool flat = j0 == 0 && j1 == c->k8; /* one block: a tile's rows are one run of memory */
    const float *xr = x + (size_t)r0 * c->ldx;
    float *o = out + (size_t)r0 * c->ldo;
    int i = s0;
    for (; i + TILE_RN <= s1; i += TILE_RN) {
        /* In the first pass over a slice: with `ahead`, the same tile of the next slice into
         * L2, so that slice comes from L2 rather than memory; the tile after next into L1 where
         * nothing fetched it ahead. */
        struct fetch f[2];
        int nf = 0;
        for (int q = 0; q < 2 && r0 == 0; q++) {
            int a = q == 0 ? i + SLICE : i + 2 * TILE_RN;
            if (a >= d1 || (q == 0 && !c->ahead) || (q == 1 && c->ahead && s0 != c->d0))
                continue;
            int n_rows = d1 - a < TILE_RN ? d1 - a : TILE_RN;
            uintptr_t p = (uintptr_t)(c->w + (size_t)a * wrb + at);
            f[nf++] = flat ? (struct fetch){.p = p,
                                            .in_row = INT_MAX,
                                            .lines = INT_MAX,
                                            .left = (int)(((size_t)n_rows * wrb + 63) / 64),
                                            .t0 = q == 1}
                           : (struct fetch){.p = p,
                                            .skip = (ptrdiff_t)wrb - (ptrdiff_t)lines * 64,
                                            .in_row = lines,
                                            .lines = lines,
                                            .left = lines * n_rows,
                                            .t0 = q == 1};
        }
        if (nf == 2)
            fetch_some(&f[1], f[1].left);
        tile_pairs(t, flat, TILE_RN, o + i, c->ldo, xp, np, xr, c->ldx, c->w + (size_t)i * wrb, wrb,
                   rows, j0, j1, c->k8, c->k, nf ? &f[0] : NULL);
    }
    for (; i < s1; i++)
        tile_pairs(t, false, 1, o + i, c->ldo, xp, np, xr, c->ldx, c->w + (size_t)i * wrb, wrb,
                   rows, j0, j1, c->k8, c->k, NULL);
}

/* The k blocks of a row of k columns: nb blocks of kc columns (a multiple of 32), the last
 * shorter; k8 = k rounded down to 8 (see SL_CPU_KC_MAX). */
static inline void k_blocks(int k, int *k8, int *nb, int *kc)
{
    *k8 = k & ~7;
    *nb = *k8 ? (*k8 + SL_CPU_KC_MAX - 1) / SL_CPU_KC_MAX : 1;
    *kc = ((*k8 + *nb - 1) / *nb + 31) & ~31;
}

/* Where a whole pack (sl_cpu_avx512_pack_unit) keeps k block [j0, ·) of the row block from row
 * r0 (a multiple of ROWS) of n rows of k8 packed columns: each row block's blocks one after the
 * other, (kc / 8, np, 16) floats each. */
static inline size_t pack_at(int n, int k8, int r0, int j0)
{
    int rows = n - r0 < ROWS ? n - r0 : ROWS;
    return (size_t)r0 * (size_t)k8 + (size_t)j0 * (size_t)(2 * ((rows + 1) / 2));
}

size_t sl_cpu_avx512_pack_floats(int n, int k)
{
    return (size_t)(n + 1) * (size_t)(k & ~7);
}

int sl_cpu_avx512_pack_units(int n, int k)
{
    int k8, nb, kc;
    k_blocks(k, &k8, &nb, &kc);
    return (n + ROWS - 1) / ROWS * nb;
}

TARGET void sl_cpu_avx512_pack_unit(float *xp, const float *x, int n, int k, int u)
{
    int k8, nb, kc;
    k_blocks(k, &k8, &nb, &kc);
    int r0 = u / nb * ROWS, j0 = u % nb * kc, j1 = j0 + kc < k8 ? j0 + kc : k8;
    int rows = n - r0 < ROWS ? n - r0 : ROWS;
    pack(xp + pack_at(n, k8, r0, j0), x + (size_t)r0 * (size_t)k, (size_t)k, rows, j0, j1);
}

/* A thread's rows of x packed for one call, where the caller has no whole pack: in thread-local
 * storage rather than on the stack, which a worker thread's may not hold. */
static _Thread_local struct {
    _Alignas(64) float xp[ROWS * SL_CPU_KC_MAX]; /* (kc / 8, ROWS / 2, 16) packed rows */
} packed;

/* Rows [r0, r0 + rows) of x, columns [j0, j1), packed: in xall (a whole pack) or packed now. */
INLINE const float *pack_for(const float *xall, int n, int k8, const float *x, size_t ldx, int r0,
                             int rows, int j0, int j1)
{
    if (xall)
        return xall + pack_at(n, k8, r0, j0);
    pack(packed.xp, x + (size_t)r0 * ldx, ldx, rows, j0, j1);
    return packed.xp;
}

INLINE void matmul_t(const enum sl_dtype t, float *out, const float *x, const float *xall,
                     const struct sl_mat *m, int n, int d0, int d1)
{
    int k = m->cols, k8, nb, kc;
    k_blocks(k, &k8, &nb, &kc);
    size_t wrb = sl_dtype_row_bytes(t, k);
    /* As in avx2.c: fetching the next slice a whole slice ahead pays where the weights come from
     * memory and enough rows use them (a decode batch past 24, a matrix beyond the caches); a
     * small batch does better with the near fetch alone. */
    struct mm c = {.w = m->data,
                   .ldo = (size_t)m->rows,
                   .ldx = (size_t)k,
                   .wrb = wrb,
                   .d0 = d0,
                   .d1 = d1,
                   .kc = kc,
                   .k8 = k8,
                   .k = k,
                   .ahead = n > 24 && (n <= 64 || (size_t)m->rows * wrb >= ((size_t)4 << 20))};
    if (n <= ROWS && (nb == 1 || (size_t)(d1 - d0) * wrb <= ((size_t)1 << 20))) {
        /* One chunk of rows (a decode batch): each k block packed (when not packed already)
         * once for every slice rather than once per slice (a 32-row product 3-7 % faster
         * hot). Block by block, a slice's weights are read in nb passes: where they do not stay
         * in L2 between passes (past 1 MiB) that cost more than the packing (k = 8192:
         * 0.93-0.97). The blocks of an output are still added in k order, so the bits are the
         * same. */
        for (int b = 0; b < nb; b++) {
            int j0 = b * kc, j1 = j0 + kc < k8 ? j0 + kc : k8;
            const float *xp = pack_for(xall, n, k8, x, c.ldx, 0, n, j0, j1);
            for (int s0 = d0; s0 < d1; s0 += SLICE)
                slice_pass(t, &c, out, x, xp, s0, d1 - s0 < SLICE ? d1 : s0 + SLICE, b, 0, n);
        }
        return;
    }
    for (int s0 = d0; s0 < d1; s0 += SLICE) {
        int s1 = d1 - s0 < SLICE ? d1 : s0 + SLICE;
        for (int b = 0; b < nb; b++) {
            int j0 = b * kc, j1 = j0 + kc < k8 ? j0 + kc : k8;
            for (int r0 = 0; r0 < n; r0 += ROWS) {
                int rows = n - r0 < ROWS ? n - r0 : ROWS;
                const float *xp = pack_for(xall, n, k8, x, c.ldx, r0, rows, j0, j1);
                slice_pass(t, &c, out, x, xp, s0, s1, b, r0, rows);
            }
        }
    }
}

/* One or two rows (decode of a single sequence) are bound by the weight stream, not the FMAs:
 * they keep avx2.c's path. Each case is its own copy of matmul_t, for its constant type. */
TARGET void sl_cpu_avx512_matmul_cols(float *out, const float *x, const float *xp,
                                      const struct sl_mat *w, int n, int d0, int d1)
{
    if (n <= 2) {
        sl_cpu_avx2_matmul_cols(out, x, w, n, d0, d1);
        return;
    }
    switch (w->type) {
    case SL_DTYPE_F32: matmul_t(SL_DTYPE_F32, out, x, xp, w, n, d0, d1); break;
    case SL_DTYPE_F16: matmul_t(SL_DTYPE_F16, out, x, xp, w, n, d0, d1); break;
    case SL_DTYPE_BF16: matmul_t(SL_DTYPE_BF16, out, x, xp, w, n, d0, d1); break;
    case SL_DTYPE_Q8_0: matmul_t(SL_DTYPE_Q8_0, out, x, xp, w, n, d0, d1); break;
    default: sl_cpu_avx2_matmul_cols(out, x, w, n, d0, d1); break; /* ops.c sends none */
    }
}

/* ---------------------------------------------------------------------------------------------
 * Softmax and SwiGLU: avx2.c's arithmetic lane for lane on 16 lanes (its e^x, the same
 * operations in the same order), and softmax's sum in its order (8-lane chunks added in turn,
 * then its tree), so both give avx2.c's bits.
 */

/* avx2.c's exp8 on 16 lanes. */
INLINE __m512 exp16(__m512 x)
{
    __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(SL_CPU_EXP_MIN), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(SL_CPU_EXP_MIN)),
                      _mm512_set1_ps(SL_CPU_EXP_MAX));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(SL_CPU_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SL_CPU_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SL_CPU_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(SL_CPU_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_CPU_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_CPU_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_CPU_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_CPU_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(SL_CPU_EXP_P5));
    __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
    y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
    __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    y = _mm512_mul_ps(y, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps((__mmask16)~zero, y);
}

INLINE __m256 hi256(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

TARGET void sl_cpu_avx512_softmax(float *x, int n)
{
    /* The maximum as avx2.c takes it (the same order, whatever NaN does). */
    __m512 m = _mm512_set1_ps(sl_cpu_avx2_softmax_max(x, n));
    __m256 sum = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        _mm512_storeu_ps(x + i, e);
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
        sum = _mm256_add_ps(sum, hi256(e));
    }
    if (i < n) {
        /* A whole 8-chunk and/or avx2.c's padded tail chunk: padding lanes are -inf, exactly 0. */
        _Alignas(64) float tb[16];
        for (int c = 0; c < 16; c++)
            tb[c] = i + c < n ? x[i + c] : -INFINITY;
        __m512 e = exp16(_mm512_sub_ps(_mm512_load_ps(tb), m));
        _mm512_store_ps(tb, e);
        sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
        if (n - i > 8)
            sum = _mm256_add_ps(sum, hi256(e));
        memcpy(x + i, tb, (size_t)(n - i) * sizeof(float));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    float s = sl_cpu_avx2_sum_tree(lanes);
    __m512 sv = _mm512_set1_ps(s);
    int n16 = n & ~15;
    for (i = 0; i < n16; i += 16)
        _mm512_storeu_ps(x + i, _mm512_div_ps(_mm512_loadu_ps(x + i), sv));
    for (; i < n; i++)
        x[i] /= s;
}

/* avx2.c's swiglu8 on 16 lanes: silu(h) * g, llama2.c's expression order. */
INLINE __m512 swiglu16(__m512 h, __m512 g)
{
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), h));
    __m512 v = _mm512_mul_ps(h, _mm512_div_ps(one, _mm512_add_ps(one, e)));
    return _mm512_mul_ps(v, g);
}

TARGET void sl_cpu_avx512_swiglu(float *h, const float *g, int n)
{
    int n16 = n & ~15;
    for (int i = 0; i < n16; i += 16)
        _mm512_storeu_ps(h + i, swiglu16(_mm512_loadu_ps(h + i), _mm512_loadu_ps(g + i)));
    if (n16 < n) {
        __mmask16 mk = (__mmask16)((1u << (n - n16)) - 1);
        _mm512_mask_storeu_ps(
            h + n16, mk,
            swiglu16(_mm512_maskz_loadu_ps(mk, h + n16), _mm512_maskz_loadu_ps(mk, g + n16)));
    }
}

/* sl_cpu_argmax over the values above -inf, or -1 when there is none, as avx2.c's: each lane
 * of four 16-lane accumulators keeps its first strict maximum (ordered compares: NaN never
 * wins), then the largest value at the lowest index across them; four chains, because one waits
 * on its compare every step. */
TARGET int32_t sl_cpu_avx512_argmax(const float *x, int n)
{
    enum { A = 4 };
    int n64 = n & ~(16 * A - 1);
    __m512 best[A];
    __m512i at[A], idx[A];
    for (int a = 0; a < A; a++) {
        best[a] = _mm512_set1_ps(-INFINITY);
        at[a] = _mm512_set1_epi32(-1);
        idx[a] = _mm512_add_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(16 * a));
    }
    const __m512i step = _mm512_set1_epi32(16 * A);
    for (int i = 0; i < n64; i += 16 * A)
#pragma GCC unroll 4
        for (int a = 0; a < A; a++) {
            __m512 v = _mm512_loadu_ps(x + i + 16 * a);
            __mmask16 gt = _mm512_cmp_ps_mask(v, best[a], _CMP_GT_OQ);
            best[a] = _mm512_mask_mov_ps(best[a], gt, v);
            at[a] = _mm512_mask_mov_epi32(at[a], gt, idx[a]);
            idx[a] = _mm512_add_epi32(idx[a], step);
        }
    float m = -INFINITY;
    int32_t where = -1;
    for (int a = 0; a < A; a++) {
        float bv[16];
        int32_t bi[16];
        _mm512_storeu_ps(bv, best[a]);
        _mm512_storeu_si512(bi, at[a]);
        for (int l = 0; l < 16; l++)
            if (bi[l] >= 0 && (bv[l] > m || (bv[l] == m && bi[l] < where))) {
                m = bv[l];
                where = bi[l];
            }
    }
    for (int i = n64; i < n; i++)
        if (x[i] > m) {
            m = x[i];
            where = i;
        }
    return where;
}

/* ---------------------------------------------------------------------------------------------
 * Attention of several queries over the same K and V (a prompt chunk's rows of one KV head),
 * with each query's bits those of avx2.c's sl_cpu_avx2_attention: its scores by the same lane
 * chains and tree (two queries to a register, as the matmul's row pairs, four positions to a
 * reduction), the same softmax, and each output lane's FMA chain over the positions in order
 * (16 lanes to a register, up to 8 queries × 48 lanes of accumulators at once).
 */

/* The rows of paged K or V from position t on, in order, without a division per row. */
struct kv_iter {
    const struct sl_cpu_pages *p;
    size_t es;
    int page, slot;
};

INLINE struct kv_iter kv_at(const struct sl_cpu_pages *p, size_t es, int t)
{
    return (struct kv_iter){p, es, t / p->page_size, t % p->page_size};
}

INLINE const unsigned char *kv_next(struct kv_iter *it)
{
    const struct sl_cpu_pages *p = it->p;
    const unsigned char *r =
        (const unsigned char *)p->base +
        ((size_t)p->pages[it->page] * p->page_stride + (size_t)it->slot * p->row_stride) * it->es;
    if (++it->slot == p->page_size) {
        it->slot = 0;
        it->page++;
    }
    return r;
}

/* 16 elements of a K or V row from column j as fp32 (fp32 or fp16 storage), lanes past `left`
 * zero (left is even: the caller takes even head sizes only). */
INLINE __m512 load_kv16(const enum sl_dtype ty, const unsigned char *row, int j, int left)
{
    if (ty == SL_DTYPE_F16) {
        const __m256i *a = (const __m256i *)(row + 2 * (size_t)j);
        __m256i h = left >= 16 ? _mm256_loadu_si256(a)
                               : _mm256_maskz_loadu_epi32((__mmask8)((1u << (left / 2)) - 1), a);
        return _mm512_cvtph_ps(h);
    }
    const float *a = (const float *)row + j;
    return left >= 16 ? _mm512_loadu_ps(a)
                      : _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), a);
}

/* Scores of the nq queries packed in qp (NP pairs per 8-column step) against positions t .. t + 3
 * (rows kt, the last repeated where fewer than four are left): att[i][t + c] for the positions
 * below n_ctx[i]. */
INLINE void attn_scores4(const enum sl_dtype ty, const int NP, float *att, size_t stride,
                         const float *qp, const float *const *qs, const int *n_ctx, int nq,
                         const unsigned char *const *kt, int t, int hs, float scale)
{
    int h8 = hs & ~7;
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[p][c] = _mm512_setzero_ps();
    for (int j = 0; j < h8; j += 8, qp += NP * 16) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kv[c] = load_w(ty, kt[c], j);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            __m512 x = _mm512_loadu_ps(qp + p * 16);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[p][c] = _mm512_fmadd_ps(x, kv[c], acc[p][c]);
        }
    }
    __m128 scale4 = _mm_set1_ps(scale);
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) {
        __m512 v = reduce4(acc[p][0], acc[p][1], acc[p][2], acc[p][3]);
        for (int half = 0; half < 2; half++) {
            int i = 2 * p + half;
            if (i >= nq || t >= n_ctx[i])
                continue;
            float sv[4];
            _mm_storeu_ps(sv, half ? _mm512_extractf32x4_ps(v, 2) : _mm512_castps512_ps128(v));
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
}

/* Scores of every query over positions [0, max n_ctx). */
INLINE void attn_scores_all(const enum sl_dtype ty, const int NP, float *att, size_t stride,
                            const float *qp, const float *const *qs, const int *n_ctx, int nq,
                            const struct sl_cpu_pages *k, int n_max, int hs, float scale)
{
    struct kv_iter it = kv_at(k, ty == SL_DTYPE_F16 ? 2 : 4, 0);
    for (int t = 0; t < n_max; t += 4) {
        const unsigned char *kt[4];
        for (int c = 0; c < 4; c++)
            kt[c] = t + c < n_max ? kv_next(&it) : kt[c - 1];
        attn_scores4(ty, NP, att, stride, qp, qs, n_ctx, nq, kt, t, hs, scale);
    }
}

/* outs[i][j0 .. j0 + 16·NV) (lanes below hs; =, or += continuing each lane's chain when !first)
 * Σ_{t in [t0, t1)} att_i[t] · v_t for NQ queries. */
INLINE void attn_values16(const enum sl_dtype ty, const int NQ, const int NV, float *const *outs,
                          const float *att, size_t stride, const struct sl_cpu_pages *v, int t0,
                          int t1, int j0, int hs, bool first)
{
    size_t es = ty == SL_DTYPE_F16 ? 2 : 4;
    __m512 acc[8][3];
    __mmask16 mk[3];
#pragma GCC unroll 3
    for (int c = 0; c < NV; c++) {
        int left = hs - (j0 + 16 * c);
        mk[c] = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    }
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 3
        for (int c = 0; c < NV; c++)
            acc[i][c] =
                first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[c], outs[i] + j0 + 16 * c);
    struct kv_iter it = kv_at(v, es, t0);
    for (int t = t0; t < t1; t++) {
        const unsigned char *vt = kv_next(&it);
        __m512 vv[3];
#pragma GCC unroll 3
        for (int c = 0; c < NV; c++)
            vv[c] = load_kv16(ty, vt, j0 + 16 * c, hs - (j0 + 16 * c));
#pragma GCC unroll 8
        for (int i = 0; i < NQ; i++) {
            __m512 a = _mm512_set1_ps(att[(size_t)i * stride + t]);
#pragma GCC unroll 3
            for (int c = 0; c < NV; c++)
                acc[i][c] = _mm512_fmadd_ps(a, vv[c], acc[i][c]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NQ; i++)
#pragma GCC unroll 3
        for (int c = 0; c < NV; c++)
            _mm512_mask_storeu_ps(outs[i] + j0 + 16 * c, mk[c], acc[i][c]);
}

/* The values of NQ queries: positions [0, n_min) together, then each query alone over the ones
 * only it sees, 48 lanes a pass. */
INLINE void attn_values_q(const enum sl_dtype ty, const int NQ, float *const *outs,
                          const float *att, size_t stride, const struct sl_cpu_pages *v,
                          const int *n_ctx, int hs)
{
    int n_min = n_ctx[0];
    for (int i = 1; i < NQ; i++)
        n_min = n_ctx[i] < n_min ? n_ctx[i] : n_min;
    for (int j0 = 0; j0 < hs; j0 += 48) {
        int nv = (hs - j0 + 15) / 16;
        nv = nv < 3 ? nv : 3;
        switch (nv) {
        case 3: attn_values16(ty, NQ, 3, outs, att, stride, v, 0, n_min, j0, hs, true); break;
        case 2: attn_values16(ty, NQ, 2, outs, att, stride, v, 0, n_min, j0, hs, true); break;
        default: attn_values16(ty, NQ, 1, outs, att, stride, v, 0, n_min, j0, hs, true); break;
        }
        for (int i = 0; i < NQ; i++) {
            if (n_ctx[i] <= n_min)
                continue;
            const float *a = att + (size_t)i * stride;
            switch (nv) {
            case 3:
                attn_values16(ty, 1, 3, outs + i, a, stride, v, n_min, n_ctx[i], j0, hs, false);
                break;
            case 2:
                attn_values16(ty, 1, 2, outs + i, a, stride, v, n_min, n_ctx[i], j0, hs, false);
                break;
            default:
                attn_values16(ty, 1, 1, outs + i, a, stride, v, n_min, n_ctx[i], j0, hs, false);
                break;
            }
        }
    }
}

INLINE void attention_multi_t(const enum sl_dtype ty, int nq, float *const *outs,
                              const float *const *qs, const int *n_ctx,
                              const struct sl_cpu_pages *k, const struct sl_cpu_pages *v, int hs,
                              float *att, size_t stride)
{
    /* The queries in pairs, [8-column step][pair][2 × 8] (a missing last query reads as zeros). */
    _Alignas(64) float qp[SL_CPU_AVX512_ATTN_HS / 8 * 4 * 16];
    int h8 = hs & ~7, np = (nq + 1) / 2, n_max = 0;
    for (int j = 0; j < h8; j += 8)
        for (int p = 0; p < np; p++) {
            float *d = qp + ((size_t)(j / 8) * (size_t)np + (size_t)p) * 16;
            memcpy(d, qs[2 * p] + j, 8 * sizeof(float));
            if (2 * p + 1 < nq)
                memcpy(d + 8, qs[2 * p + 1] + j, 8 * sizeof(float));
            else
                memset(d + 8, 0, 8 * sizeof(float));
        }
    for (int i = 0; i < nq; i++)
        n_max = n_ctx[i] > n_max ? n_ctx[i] : n_max;
    float scale = sqrtf((float)hs);
    switch (np) {
    case 1: attn_scores_all(ty, 1, att, stride, qp, qs, n_ctx, nq, k, n_max, hs, scale); break;
    case 2: attn_scores_all(ty, 2, att, stride, qp, qs, n_ctx, nq, k, n_max, hs, scale); break;
    case 3: attn_scores_all(ty, 3, att, stride, qp, qs, n_ctx, nq, k, n_max, hs, scale); break;
    default: attn_scores_all(ty, 4, att, stride, qp, qs, n_ctx, nq, k, n_max, hs, scale); break;
    }
    for (int i = 0; i < nq; i++)
        sl_cpu_avx512_softmax(att + (size_t)i * stride, n_ctx[i]);
    /* Queries in groups of 8, 4, 2 and 1. */
    for (int i = 0; i < nq;) {
        int g = nq - i >= 8 ? 8 : nq - i >= 4 ? 4 : nq - i >= 2 ? 2 : 1;
        const float *a = att + (size_t)i * stride;
        switch (g) {
        case 8: attn_values_q(ty, 8, outs + i, a, stride, v, n_ctx + i, hs); break;
        case 4: attn_values_q(ty, 4, outs + i, a, stride, v, n_ctx + i, hs); break;
        case 2: attn_values_q(ty, 2, outs + i, a, stride, v, n_ctx + i, hs); break;
        default: attn_values_q(ty, 1, outs + i, a, stride, v, n_ctx + i, hs); break;
        }
        i += g;
    }
}

TARGET static void attention_multi_f32(int nq, float *const *outs, const float *const *qs,
                                       const int *n_ctx, const struct sl_cpu_pages *k,
                                       const struct sl_cpu_pages *v, int hs, float *att,
                                       size_t stride)
{
    attention_multi_t(SL_DTYPE_F32, nq, outs, qs, n_ctx, k, v, hs, att, stride);
}

TARGET static void attention_multi_f16(int nq, float *const *outs, const float *const *qs,
                                       const int *n_ctx, const struct sl_cpu_pages *k,
                                       const struct sl_cpu_pages *v, int hs, float *att,
                                       size_t stride)
{
    attention_multi_t(SL_DTYPE_F16, nq, outs, qs, n_ctx, k, v, hs, att, stride);
}

void sl_cpu_avx512_attention_multi(int nq, float *const *outs, const float *const *qs,
                                   const int *n_ctx, const struct sl_cpu_pages *k,
                                   const struct sl_cpu_pages *v, int hs, float *att,
                                   size_t att_stride)
{
    if (k->type == SL_DTYPE_F16)
        attention_multi_f16(nq, outs, qs, n_ctx, k, v, hs, att, att_stride);
    else
        attention_multi_f32(nq, outs, qs, n_ctx, k, v, hs, att, att_stride);
}

TARGET double sl_cpu_avx512_bench_fma(long iters)
{
    __m512 a[12];
    __m512 m = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, a[i]);
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 12 * 16 * 2;
}

#endif
