/* sluice — kernels: the math of a forward pass on the CPU.
 *
 * Pure functions over caller-owned fp32 buffers: no allocation, no logging, no knowledge of
 * requests or models. Shapes are given as (rows, cols), row-major; a weight matrix is stored
 * (out, in) like llama2.c, so y = W x reads one contiguous weight row per output.
 *
 * Reductions run in plain sequential order (no reassociation) so results match llama2.c's
 * run.c bit for bit; the golden test depends on that.
 *
 * Threads: every function is reentrant. sl_cpu_matmul_mt splits its work over a struct
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

/* Dot product of a (n) and b (n), accumulated left to right in fp32. */
float sl_cpu_dot(const float *a, const float *b, int n);

/* out (n, d) = x (n, k) · w (d, k)ᵀ: each of the n rows of x times the d rows of w.
 * out must not alias x or w. */
void sl_cpu_matmul(float *out, const float *x, const float *w, int n, int d, int k);

/* Only the output columns [d0, d1) of sl_cpu_matmul: out keeps its full (n, d) layout. Lets a
 * thread pool split one matmul by weight rows. */
void sl_cpu_matmul_cols(float *out, const float *x, const float *w, int n, int d, int k, int d0,
                        int d1);

/* out (n, dim) = RMSNorm of each row of x (n, dim), scaled by w (dim):
 * out = w * x / sqrt(mean(x²) + eps). out may alias x. */
void sl_cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);

/* In-place softmax of x (n); n >= 1. Subtracts the max first, so large logits do not overflow. */
void sl_cpu_softmax(float *x, int n);

/* Rotary position embedding of one row x (n_heads * head_size) at position pos, in llama2.c's
 * interleaved-pair layout: within each head, the pair (2i, 2i+1) rotates by angle
 * pos * theta^(-2i / head_size). head_size must be even. */
void sl_cpu_rope(float *x, int n_heads, int head_size, int pos, float theta);

/* SwiGLU gate in place: h (n) = silu(h) * g (n), silu(v) = v / (1 + e^-v). */
void sl_cpu_swiglu(float *h, const float *g, int n);

/* y (n) += x (n). */
void sl_cpu_add(float *y, const float *x, int n);

/* y (n) += a * x (n). */
void sl_cpu_axpy(float *y, float a, const float *x, int n);

/* A fixed pool of worker threads for splitting matmuls by output rows. A pool of 1 thread runs
 * everything on the caller and starts no thread. */
struct sl_cpu_pool;

/* threads: total threads including the caller (0 = online cores). Returns NULL only when a
 * thread cannot be started. */
struct sl_cpu_pool *sl_cpu_pool_new(int threads);
void sl_cpu_pool_free(struct sl_cpu_pool *p);
int sl_cpu_pool_threads(const struct sl_cpu_pool *p);

/* sl_cpu_matmul split over the pool's threads (NULL pool: the caller alone). Returns after every
 * part is done. Results are identical to sl_cpu_matmul whatever the thread count. */
void sl_cpu_matmul_mt(struct sl_cpu_pool *p, float *out, const float *x, const float *w, int n,
                      int d, int k);

#endif
