/* Private to kernels/cpu: the AVX2 versions of the kernels in <sluice/kernels.h>, defined in
 * avx2.c with per-function target attributes. Callers go through the dispatch in ops.c, which
 * only calls these when the CPU supports AVX2, FMA and F16C. */
#ifndef SLUICE_KERNELS_CPU_IMPL_H
#define SLUICE_KERNELS_CPU_IMPL_H

#include <sluice/kernels.h>

/* quant.c: the block-quantized layouts (kernels.h). */
/* Bytes of one block of t (one value for F32, F16, BF16). */
size_t sl_cpu_block_bytes(enum sl_dtype t);
/* The 6-bit scale and min of sub-block s (0..7) from a Q4_K or Q5_K block's scales[12]. */
void sl_cpu_k_scale_min(const unsigned char *scales, int s, int *sc, int *m);
/* out (32) = values [j, j + 32) of a row of type t (any type), j a multiple of 32. */
void sl_cpu_dequant32(enum sl_dtype t, const unsigned char *row, int j, float *out);
/* dst = src (cols) in Q4_0 or a K-quant (sl_cpu_quantize_row's rules). */
void sl_cpu_quantize_blocks(enum sl_dtype t, unsigned char *dst, const float *src, int cols);
/* One quantized activation row: q (cols), d (one per block), s (SL_QACT_256: one sum per 16). */
struct sl_cpu_qrow {
    const int8_t *q;
    const float *d;
    const int16_t *s;
};
struct sl_cpu_qrow sl_cpu_qrow(enum sl_qact kind, const void *qa, int cols, int r);
/* The row whose bytes start at p: cols quants, then cols / block scales, then (SL_QACT_256) the
 * sums of 16. Inline, for kernels that find each row's start themselves. */
static inline struct sl_cpu_qrow sl_cpu_qrow_at(enum sl_qact kind, const unsigned char *p, int cols)
{
    struct sl_cpu_qrow q = {(const int8_t *)p, (const float *)(p + cols), NULL};
    if (kind == SL_QACT_256)
        q.s = (const int16_t *)(p + cols + sizeof(float) * (size_t)(cols / SL_QK_BLOCK));
    return q;
}
/* q (bs), d = one activation block quantized (kernels.h's rule). */
void sl_cpu_qact_block_scalar(const float *x, int bs, int8_t *q, float *d);
/* s (cols / 16) = the sums of each 16 of q (cols). */
void sl_cpu_qact_sums(const int8_t *q, int16_t *s, int cols);

/* SL_CPU_NO_AVX2: the scalar kernels only (the libFuzzer build, whose targets run no forward
 * pass, and where the sanitized compile of avx2.c alone takes about five minutes). */
#if (defined(__x86_64__) || defined(__i386__)) && !defined(SL_CPU_NO_AVX2)
#define SL_CPU_HAVE_AVX2 1

float sl_cpu_avx2_dot(const float *a, const float *b, int n);
void sl_cpu_avx2_matmul_cols(float *out, const float *x, const struct sl_mat *w, int n, int d0,
                             int d1);
void sl_cpu_avx2_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);
void sl_cpu_avx2_softmax(float *x, int n);
/* Softmax's pieces the AVX-512 version shares, for the same bits: the maximum of x (n) as
 * sl_cpu_avx2_softmax takes it, and its tree over an 8-lane sum. */
float sl_cpu_avx2_softmax_max(const float *x, int n);
float sl_cpu_avx2_sum_tree(const float *lanes);
int32_t sl_cpu_avx2_argmax(const float *x, int n);
void sl_cpu_avx2_div(float *x, int n, float d);
void sl_cpu_avx2_swiglu(float *h, const float *g, int n);
void sl_cpu_avx2_rope_apply(float *x, int n_heads, int head_size, const float *cs);
void sl_cpu_avx2_add(float *y, const float *x, int n);
void sl_cpu_avx2_axpy(float *y, float a, const float *x, int n);
void sl_cpu_avx2_attention(float *out, const float *q, const struct sl_cpu_pages *k,
                           const struct sl_cpu_pages *v, int n_ctx, int hs, float *att);
void sl_cpu_avx2_attention_multi(int nq, float *const *outs, const float *const *qs,
                                 const int *n_ctx, const struct sl_cpu_pages *k,
                                 const struct sl_cpu_pages *v, int hs, float *att,
                                 size_t att_stride);
void sl_cpu_avx2_attention_row(float *out, const float *q, int n_heads, int n_kv_heads,
                               const struct sl_cpu_pages *k, const struct sl_cpu_pages *v,
                               int n_ctx, int hs, float *att, size_t att_stride);
void sl_cpu_avx2_f32_to_f16_row(uint16_t *dst, const float *src, int n);
float sl_cpu_avx2_bench_read(const float *buf, size_t n);
/* avx2q.c: the integer matmul and the activation quantizer, quant.c's bits. */
void sl_cpu_avx2_qact_quantize(enum sl_qact kind, void *qa, const float *x, int n, int cols);
void sl_cpu_avx2_matmul_q_cols(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                               int d1);
double sl_cpu_avx2_bench_fma(long iters);

/* The AVX-512 kernels (avx512.c): AVX-512F and VL on top of the AVX2 set. The matmul of three
 * rows or more packs x in row pairs: xp (or NULL) is x (n, k) packed whole beforehand, by
 * sl_cpu_avx512_pack_unit for each of its sl_cpu_avx512_pack_units(n, k) units (in any order,
 * on any threads) into sl_cpu_avx512_pack_floats(n, k) floats, so that the calls of a job that
 * share x do not each pack the rows they use; without it a call packs them itself. */
#define SL_CPU_HAVE_AVX512 1
#define SL_CPU_AVX512_ROWS 32 /* rows of x packed as one block (a unit has one k block of them) */
void sl_cpu_avx512_matmul_cols(float *out, const float *x, const float *xp, const struct sl_mat *w,
                               int n, int d0, int d1);
size_t sl_cpu_avx512_pack_floats(int n, int k);
int sl_cpu_avx512_pack_units(int n, int k);
void sl_cpu_avx512_pack_unit(float *xp, const float *x, int n, int k, int u);
void sl_cpu_avx512_softmax(float *x, int n);
int32_t sl_cpu_avx512_argmax(const float *x, int n);
void sl_cpu_avx512_swiglu(float *h, const float *g, int n);
/* sl_cpu_attention_multi for 1 .. 8 queries, the bits of sl_cpu_avx2_attention each; hs even
 * and at most SL_CPU_AVX512_ATTN_HS. */
#define SL_CPU_AVX512_ATTN_HS 256
void sl_cpu_avx512_attention_multi(int nq, float *const *outs, const float *const *qs,
                                   const int *n_ctx, const struct sl_cpu_pages *k,
                                   const struct sl_cpu_pages *v, int hs, float *att,
                                   size_t att_stride);
double sl_cpu_avx512_bench_fma(long iters);
#else
#define SL_CPU_HAVE_AVX2 0
#define SL_CPU_HAVE_AVX512 0
#endif

/* SL_CPU_PAIRED 1: a paired build (kernels.h), whose old side's avx2.c is compiled as
 * avx2_old.c with every sl_cpu_avx2_ name made sl_cpu_old_avx2_, declared in the generated
 * cpu_impl_old.h (kernels/cpu/meson.build). */
#ifndef SL_CPU_PAIRED
#define SL_CPU_PAIRED 0
#endif

/* e^x as avx2.c's exp8 and avx512.c's exp16 compute it (Cephes' expf), one set of constants so
 * the two stay bit for bit the same: inputs clamped to [MIN, MAX] (below MIN: 0), x = n·ln2 + r
 * with ln2 in two parts, and a degree-6 polynomial P0..P5 for e^r. */
#define SL_CPU_EXP_MIN -87.33654f
#define SL_CPU_EXP_MAX 88.0f
#define SL_CPU_EXP_LOG2E 1.44269504088896341f
#define SL_CPU_EXP_LN2_HI 0.693359375f
#define SL_CPU_EXP_LN2_LO -2.12194440e-4f
#define SL_CPU_EXP_P0 1.9875691500e-4f
#define SL_CPU_EXP_P1 1.3981999507e-3f
#define SL_CPU_EXP_P2 8.3334519073e-3f
#define SL_CPU_EXP_P3 4.1665795894e-2f
#define SL_CPU_EXP_P4 1.6666665459e-1f
#define SL_CPU_EXP_P5 5.0000001201e-1f

/* The k blocking of a vector dot product (avx2.c): k rounded down to 8 is cut into
 * ceil(k8 / SL_CPU_KC_MAX) blocks of equal length, rounded up to 32. avx512.c cuts the same
 * blocks, which is part of giving the same bits. */
#define SL_CPU_KC_MAX 384

#endif
