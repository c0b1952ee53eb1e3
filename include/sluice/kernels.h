/* sluice — kernels: the math of a forward pass on the CPU.
 *
 * Pure functions over caller-owned buffers: no allocation, no logging, no knowledge of requests
 * or models. Shapes are given as (rows, cols), row-major; a weight matrix is stored (out, in) like
 * llama2.c, so out = x · Wᵀ reads one contiguous weight row per output feature. Activations are
 * always fp32; weights may be F32, F16, BF16 or Q8_0 and are converted inside the kernels, a few
 * values at a time, never expanded.
 *
 * Instruction sets: each kernel has a portable scalar version and, on x86-64, an AVX2+FMA+F16C
 * version chosen at run time (the build needs no -march flag; the binary runs on any x86-64).
 * sl_cpu_set_isa() lets tests force the scalar path.
 *
 * Summation order (what the goldens and the batch-invariance tests rely on):
 *  - Scalar path: every dot product sums left to right in plain fp32 (multiply, then add), the
 *    order of llama2.c's run.c, so its results match run.c bit for bit.
 *  - AVX2 path: a dot product of length k cuts k8 = k rounded down to 8 into ceil(k8 / 384)
 *    equal blocks (rounded up to 32 columns); in each block lane l of 8 accumulates
 *    j = l, l+8, … with fused multiply-adds and the lanes are added as
 *    ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); the block results are added left to right, then the
 *    k % 8 remaining products. The blocks depend on k alone. Results differ from run.c in the
 *    last bits; the greedy goldens (tests/worker/test_golden.c) still match token for token.
 *  - Either way, each output element is computed by the same sequence of operations whatever the
 *    number of rows in the batch, the tile it falls in, or the thread count: batching and
 *    threading never change a result, bit for bit. Typed weights are converted exactly (F16, BF16
 *    and Q8_0's d·q are all representable in fp32), so a typed matmul equals the fp32 matmul of
 *    the dequantized matrix bit for bit on the same path.
 *
 * Threads: every function is reentrant. The _mt functions split their work over a struct
 * sl_cpu_pool, which belongs to one calling thread at a time.
 */
#ifndef SLUICE_KERNELS_H
#define SLUICE_KERNELS_H

#include <sluice/common.h>

/* Element types of weight matrices. Activations are always fp32. */
enum sl_dtype {
    SL_DTYPE_F32,
    SL_DTYPE_F16,  /* IEEE half */
    SL_DTYPE_BF16, /* bfloat16 */
    SL_DTYPE_Q8_0, /* GGML Q8_0: blocks of 32 values, each an fp16 scale d then 32 int8 q;
                    * value = d * q. A row of `cols` values is cols / 32 blocks (34 bytes each). */
};

#define SL_Q8_0_BLOCK 32
#define SL_Q8_0_BYTES 34 /* 2-byte fp16 scale + 32 int8 */

/* A weight matrix (rows, cols), row-major, stored (out, in): row i holds the weights of output
 * feature i. Transparent value type; data is borrowed (mmap'd file or the model's buffers). */
struct sl_mat {
    enum sl_dtype type;
    const void *data;
    int rows;
    int cols; /* a multiple of SL_Q8_0_BLOCK for Q8_0 */
};

/* Bytes one row of `cols` values takes in type t (0 when cols is not valid for t). */
size_t sl_dtype_row_bytes(enum sl_dtype t, int cols);
/* "f32", "f16", "bf16", "q8_0". */
const char *sl_dtype_name(enum sl_dtype t);

/* ---------------------------------------------------------------------------------------------
 * Instruction set selection
 */

enum sl_cpu_isa {
    SL_CPU_ISA_SCALAR, /* portable C */
    SL_CPU_ISA_AVX2,   /* x86-64 AVX2 + FMA + F16C */
};

/* The best instruction set this CPU supports. */
enum sl_cpu_isa sl_cpu_isa_best(void);
/* The instruction set the kernels use now (sl_cpu_isa_best() unless forced). */
enum sl_cpu_isa sl_cpu_isa(void);
/* Forces the kernels onto `isa` process-wide (tests, benchmarks). Returns SL_EINVAL when this
 * CPU does not support it. Not to be called while another thread runs a kernel. */
int sl_cpu_set_isa(enum sl_cpu_isa isa);
/* "scalar", "avx2". */
const char *sl_cpu_isa_name(enum sl_cpu_isa isa);

/* ---------------------------------------------------------------------------------------------
 * Conversions
 */

float sl_cpu_f16_to_f32(uint16_t h);
uint16_t sl_cpu_f32_to_f16(float f); /* round to nearest even */
float sl_cpu_bf16_to_f32(uint16_t h);
uint16_t sl_cpu_f32_to_bf16(float f); /* round to nearest even */

/* dst (sl_dtype_row_bytes(t, cols) bytes) = src (cols) in type t. Q8_0 uses GGML's rule:
 * d = max|v| / 127 (stored fp16), q = round(v / d). cols must be valid for t. */
void sl_cpu_quantize_row(enum sl_dtype t, void *dst, const float *src, int cols);
/* out (w->cols) = row `row` of w as fp32 (token embedding lookup). */
void sl_cpu_mat_row(float *out, const struct sl_mat *w, int row);

/* ---------------------------------------------------------------------------------------------
 * Matrix products
 */

/* Dot product of a (n) and b (n): the order above with a single block, whatever n. */
float sl_cpu_dot(const float *a, const float *b, int n);

/* out (n, w->rows) = x (n, w->cols) · Wᵀ. out must not alias x. */
void sl_cpu_matmul(float *out, const float *x, const struct sl_mat *w, int n);

/* Only the output columns [d0, d1) of sl_cpu_matmul; out keeps its full (n, w->rows) layout. */
void sl_cpu_matmul_cols(float *out, const float *x, const struct sl_mat *w, int n, int d0, int d1);

/* ---------------------------------------------------------------------------------------------
 * Row-wise ops
 */

/* out (n, dim) = RMSNorm of each row of x (n, dim), scaled by w (dim):
 * out = w * x / sqrt(mean(x²) + eps). out may alias x. */
void sl_cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);

/* In-place softmax of x (n); n >= 1. Subtracts the max first, so large logits do not overflow. */
void sl_cpu_softmax(float *x, int n);

/* Rotary position embedding of one row x (n_heads * head_size) at position pos, in llama2.c's
 * interleaved-pair layout: within each head, the pair (2i, 2i+1) rotates by angle
 * pos * theta^(-2i / head_size). head_size must be even. */
void sl_cpu_rope(float *x, int n_heads, int head_size, int pos, float theta);

/* The (cos, sin) pairs sl_cpu_rope uses at position pos: cs (head_size) = cos, sin of each pair's
 * angle, computed exactly as sl_cpu_rope does. */
void sl_cpu_rope_table(float *cs, int head_size, int pos, float theta);
/* sl_cpu_rope with a table from sl_cpu_rope_table: same result, no transcendental calls. */
void sl_cpu_rope_apply(float *x, int n_heads, int head_size, const float *cs);

/* SwiGLU gate in place: h (n) = silu(h) * g (n), silu(v) = v / (1 + e^-v). */
void sl_cpu_swiglu(float *h, const float *g, int n);

/* y (n) += x (n). */
void sl_cpu_add(float *y, const float *x, int n);

/* y (n) += a * x (n). */
void sl_cpu_axpy(float *y, float a, const float *x, int n);

/* Paged keys or values of one layer: position t of a sequence lives at
 * base + pages[t / page_size] * page_stride + (t % page_size) * row_stride (in floats). */
struct sl_cpu_pages {
    const float *base;
    const int32_t *pages;
    size_t page_stride;
    size_t row_stride;
    int page_size;
};

/* Causal attention of one query head over positions 0..n_ctx-1:
 * out (hs) = softmax(q · Kᵀ / sqrt(hs)) · V, where row t of K (V) is the hs floats at position t
 * of k (v). att: scratch (n_ctx). */
void sl_cpu_attention(float *out, const float *q, const struct sl_cpu_pages *k,
                      const struct sl_cpu_pages *v, int n_ctx, int hs, float *att);

/* The most queries sl_cpu_attention_multi takes at once. */
#define SL_CPU_ATTN_MAX_Q 3

/* nq (1..SL_CPU_ATTN_MAX_Q) queries over the same K and V (the heads of a grouped-query group,
 * or rows of one sequence): for each i, outs[i] (hs) = sl_cpu_attention(qs[i], k, v, n_ctx[i]),
 * bit for bit; each K and V row is loaded once for all the queries that see it. n_ctx[i] >= 1.
 * att: scratch (nq, att_stride floats), att_stride >= every n_ctx[i]. */
void sl_cpu_attention_multi(int nq, float *const *outs, const float *const *qs, const int *n_ctx,
                            const struct sl_cpu_pages *k, const struct sl_cpu_pages *v, int hs,
                            float *att, size_t att_stride);

/* ---------------------------------------------------------------------------------------------
 * Thread pool
 *
 * A fixed set of threads that run one job at a time. Workers spin briefly between jobs (a
 * forward pass posts a few jobs per layer, and a futex wake-up costs more than a small matmul),
 * then sleep. A pool of 1 thread runs everything on the caller and starts no thread.
 */
struct sl_cpu_pool;

/* threads: total threads including the caller (0 = online cores). Returns NULL only when a
 * thread cannot be started. */
struct sl_cpu_pool *sl_cpu_pool_new(int threads);
void sl_cpu_pool_free(struct sl_cpu_pool *p);
int sl_cpu_pool_threads(const struct sl_cpu_pool *p);

/* Runs fn(arg, ith, nth) on every thread of the pool (ith in [0, nth), the caller is 0) and
 * returns when all have returned. NULL pool: fn(arg, 0, 1) on the caller. */
void sl_cpu_pool_run(struct sl_cpu_pool *p, void (*fn)(void *arg, int ith, int nth), void *arg);

/* Guided self-scheduling of items [0, total) among nth threads that share *next (set to 0
 * before the job): claims the next chunk, about a (2 · nth)-th of what is left and at least
 * min_chunk items, sets *end past it and returns its first item; returns total when nothing is
 * left. Large chunks first keep grabs few; small ones last let the threads finish together, and
 * a thread that loses its core leaves its share to the others. Any thread may call it. */
int sl_cpu_grab(_Atomic int *next, int total, int nth, int min_chunk, int *end);

/* sl_cpu_matmul split over the pool by weight rows. Identical results whatever the thread
 * count. */
void sl_cpu_matmul_mt(struct sl_cpu_pool *p, float *out, const float *x, const struct sl_mat *w,
                      int n);

/* Up to 4 matmuls that share x and its width in one dispatch (Q, K and V):
 * outs[i] (n, ws[i].rows) = x (n, cols) · ws[i]ᵀ. */
void sl_cpu_matmul_multi_mt(struct sl_cpu_pool *p, int count, float *const *outs, const float *x,
                            const struct sl_mat *ws, int n);

/* The SwiGLU feed-forward up-projection in one dispatch: h (n, w1.rows) = silu(x · W1ᵀ) ⊙
 * (x · W3ᵀ), with g (n, w3.rows) as scratch for x · W3ᵀ. Each thread gates the columns it
 * computed, so the gate costs no extra pass. */
void sl_cpu_matmul_swiglu_mt(struct sl_cpu_pool *p, float *h, float *g, const float *x,
                             const struct sl_mat *w1, const struct sl_mat *w3, int n);

/* ---------------------------------------------------------------------------------------------
 * Machine figures for benchmarks
 */

/* Streams `bytes` of buf (64-byte aligned, bytes a multiple of 256) over the pool's threads,
 * summing it; returns the sum so the read cannot be optimised away. */
float sl_cpu_bench_read(struct sl_cpu_pool *p, const float *buf, size_t bytes);
/* Runs `iters` rounds of independent fp32 FMAs on every thread; returns the flops done (2 per
 * lane per FMA), 0 when the ISA has no FMA. */
double sl_cpu_bench_fma(struct sl_cpu_pool *p, long iters);

#endif
