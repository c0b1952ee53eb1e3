/* sluice — kernels: the math of a forward pass, on the CPU and (when built) on CUDA devices.
 *
 * Pure functions over caller-owned buffers: no allocation, no logging, no knowledge of requests
 * or models. Shapes are given as (rows, cols), row-major; a weight matrix is stored (out, in) like
 * llama2.c, so out = x · Wᵀ reads one contiguous weight row per output feature. Activations are
 * always fp32; weights may be F32, F16, BF16 or Q8_0 and are converted inside the kernels, a few
 * values at a time, never expanded.
 *
 * Instruction sets: each kernel has a portable scalar version and, on x86-64, an AVX2+FMA+F16C
 * version chosen at run time (the build needs no -march flag; the binary runs on any x86-64).
 * Where the CPU also has AVX-512F and VL, the matmul of three rows or more runs 16-lane
 * register tiles instead (two activation rows per register, 32 registers); every other kernel
 * keeps its AVX2 version. sl_cpu_set_isa() lets tests and benchmarks force a lower level.
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
 *  - AVX-512 path: the AVX2 path's order exactly (each 16-lane register holds the 8 lanes of
 *    two rows), so its results are the AVX2 path's bit for bit.
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
    /* GGML Q4_0: blocks of 32 values (18 bytes): an fp16 scale d, then 16 bytes qs; value j < 16
     * is d * ((qs[j] & 15) - 8), value j + 16 is d * ((qs[j] >> 4) - 8). */
    SL_DTYPE_Q4_0,
    /* The K-quants: super-blocks of 256 values (rows are whole super-blocks), as GGML defines
     * them (ggml-common.h). All fp16 are little-endian IEEE half.
     * Q4_K (144 bytes): fp16 d, fp16 dmin, scales[12], qs[128]. Eight sub-blocks of 32, each
     *   with a 6-bit scale sc and min m packed in scales[] (sub-block s < 4: sc = scales[s] & 63,
     *   m = scales[s + 4] & 63; s >= 4: sc = (scales[s + 4] & 15) | (scales[s - 4] >> 6) << 4,
     *   m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4). The 64 values of chunk c (0..3) take
     *   the low nibbles of qs[32c .. 32c + 32) (sub-block 2c), then the high ones (2c + 1);
     *   value = (d * sc) * q - (dmin * m).
     * Q5_K (176 bytes): fp16 d, fp16 dmin, scales[12], qh[32], qs[128]: Q4_K's layout with a
     *   fifth bit: value i of sub-block s adds 16 when bit s of qh[i] is set.
     * Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d; sixteen sub-blocks of 16 with
     *   signed 8-bit scales. In half h (0..1) of 128 values, position l < 32 holds
     *   q0 = ql[64h + l] & 15 | (qh[32h + l] & 3) << 4 (value 128h + l),
     *   q1 = ql[64h + 32 + l] & 15 | (qh[32h + l] >> 2 & 3) << 4 (value 128h + 32 + l),
     *   q2 = ql[64h + l] >> 4 | (qh[32h + l] >> 4 & 3) << 4 (value 128h + 64 + l),
     *   q3 = ql[64h + 32 + l] >> 4 | (qh[32h + l] >> 6) << 4 (value 128h + 96 + l);
     *   value v = (d * scales[v / 16]) * (q - 32). */
    SL_DTYPE_Q4_K,
    SL_DTYPE_Q5_K,
    SL_DTYPE_Q6_K,
};

#define SL_DTYPE_COUNT 8

#define SL_Q8_0_BLOCK 32
#define SL_Q8_0_BYTES 34 /* 2-byte fp16 scale + 32 int8 */
#define SL_Q4_0_BYTES 18 /* 2-byte fp16 scale + 16 bytes of nibbles, 32 values */
#define SL_QK_BLOCK 256  /* values per K-quant super-block */
#define SL_Q4_K_BYTES 144
#define SL_Q5_K_BYTES 176
#define SL_Q6_K_BYTES 210

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
/* Values per block of t: 1 (F32, F16, BF16), 32 (Q8_0, Q4_0) or 256 (the K-quants); a row's
 * length must be a multiple of it. */
int sl_dtype_block(enum sl_dtype t);
/* Whether t is one of the block-quantized types (Q8_0, Q4_0, the K-quants). */
bool sl_dtype_quantized(enum sl_dtype t);
/* "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k". */
const char *sl_dtype_name(enum sl_dtype t);

/* ---------------------------------------------------------------------------------------------
 * Instruction set selection
 */

enum sl_cpu_isa {
    SL_CPU_ISA_SCALAR, /* portable C */
    SL_CPU_ISA_AVX2,   /* x86-64 AVX2 + FMA + F16C */
    SL_CPU_ISA_AVX512, /* AVX2's set + AVX-512F + VL (an fp32 matmul of 16 lanes, 32 registers) */
};

/* The best instruction set this CPU supports. */
enum sl_cpu_isa sl_cpu_isa_best(void);
/* The instruction set the kernels use now (sl_cpu_isa_best() unless forced). */
enum sl_cpu_isa sl_cpu_isa(void);
/* Forces the kernels onto `isa` process-wide (tests, benchmarks): any level up to
 * sl_cpu_isa_best(), each including the ones below it. Returns SL_EINVAL when this CPU does not
 * support it. Not to be called while another thread runs a kernel. */
int sl_cpu_set_isa(enum sl_cpu_isa isa);
/* "scalar", "avx2", "avx512". */
const char *sl_cpu_isa_name(enum sl_cpu_isa isa);

/* ---------------------------------------------------------------------------------------------
 * Paired builds (bench/paired.sh)
 *
 * A build configured with -Dpaired_avx2=FILE compiles FILE, kernels/cpu/avx2.c as another
 * revision has it (the "old" kernels), beside this tree's ("new"), every sl_cpu_avx2_ name in it
 * renamed. Its AVX2 matmul (sl_cpu_matmul_cols and the _mt matmuls wherever they take the AVX2
 * path: on an AVX-512 CPU, below three rows only, unless the ISA is forced to avx2) and its
 * attention of a decode row (sl_cpu_attention_row) can then run in place of this tree's,
 * switched between calls so that both sides meet the same machine. Every other kernel is this
 * tree's on both sides. Other builds have no old side.
 */

/* Whether this build has an old side. */
bool sl_cpu_paired_built(void);
/* Runs the old side's two kernels (old true) or this tree's (false, the default), process-wide.
 * SL_EINVAL when the build has no old side. Not to be called while another thread runs a
 * kernel. */
int sl_cpu_paired_use_old(bool old);

/* ---------------------------------------------------------------------------------------------
 * Conversions
 */

float sl_cpu_f16_to_f32(uint16_t h);
uint16_t sl_cpu_f32_to_f16(float f); /* round to nearest even */
float sl_cpu_bf16_to_f32(uint16_t h);
uint16_t sl_cpu_f32_to_bf16(float f); /* round to nearest even */
/* dst (n) = sl_cpu_f32_to_f16 of each src (n), bit for bit (NaNs stay NaNs, payloads may
 * differ). */
void sl_cpu_f32_to_f16_row(uint16_t *dst, const float *src, int n);

/* dst (sl_dtype_row_bytes(t, cols) bytes) = src (cols) in type t. Q8_0 uses GGML's rule:
 * d = max|v| / 127 (stored fp16), q = round(v / d). Q4_0 and the K-quants take each block's
 * scales from its extremes and round to nearest (kernels/cpu/quant.c): valid files, for
 * synthetic models and tests, not llama-quantize's error-minimising choices. cols must be valid
 * for t. */
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
 * Integer matmul of quantized weights (8-bit activations)
 *
 * Weights in Q8_0, Q4_0 or a K-quant can be multiplied with integer dot products: each row of x
 * is rounded once to 8-bit blocks, SL_QACT_32 for Q8_0 and Q4_0 (blocks of 32, an fp32 scale
 * each) or SL_QACT_256 for the K-quants (blocks of 256, an fp32 scale and the sum of each 16
 * quants). In a block whose largest magnitude is a: d = a / 127, q = round-half-even(v · (127 /
 * a)) (all 0 when a is 0). This changes results (the activations lose precision: a relative
 * error of about 1/254 per value); the fp32 matmul above stays exact.
 *
 * Arithmetic, the same bits on every path (scalar, AVX2), batch, tile and thread count: an
 * output is the sum, left to right in fp32 from 0, of one term per unit of its row:
 *  - K-quants, a unit is a super-block: with exact integers I = Σ_s sc_s Σ_i q_i x_i (Q6_K: its
 *    sixteen signed scales and q - 32) and M = Σ_s m_s Σ_i x_i (Q4_K, Q5_K; Q6_K: 0), the term
 *    is (d · dx) · I − (dmin · dx) · M, each product rounded (no fused multiply-add);
 *  - Q8_0 and Q4_0, a unit is 8 blocks (fewer at the row's end, the missing ones 0): with exact
 *    I_b = Σ q x of block b and p_b = (d_b · dx_b) · I_b, the term is
 *    ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)).
 * The buffer of n quantized rows holds each in sl_cpu_qact_row_bytes(kind, cols) bytes.
 */

enum sl_qact {
    SL_QACT_NONE, /* not a quantized type: the fp32 matmul */
    SL_QACT_32,   /* Q8_0, Q4_0 weights */
    SL_QACT_256,  /* Q4_K, Q5_K, Q6_K weights */
};

/* The activation blocks weights of type t take. */
enum sl_qact sl_cpu_qact_kind(enum sl_dtype t);
/* Bytes of one quantized row of cols values (a multiple of 32); 0 when cols is not a multiple of
 * the kind's block. */
size_t sl_cpu_qact_row_bytes(enum sl_qact kind, int cols);
/* qa (n rows of sl_cpu_qact_row_bytes) = x (n, cols) quantized as `kind`. */
void sl_cpu_qact_quantize(enum sl_qact kind, void *qa, const float *x, int n, int cols);
/* Only the output columns [d0, d1) of out (n, w->rows) = qa (n rows quantized as
 * sl_cpu_qact_kind(w->type), w->cols values each) · Wᵀ, by the arithmetic above. */
void sl_cpu_matmul_q_cols(float *out, const void *qa, const struct sl_mat *w, int n, int d0,
                          int d1);

/* ---------------------------------------------------------------------------------------------
 * Row-wise ops
 */

/* out (n, dim) = RMSNorm of each row of x (n, dim), scaled by w (dim):
 * out = w * x / sqrt(mean(x²) + eps). out may alias x. */
void sl_cpu_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);

/* In-place softmax of x (n); n >= 1. Subtracts the max first, so large logits do not overflow. */
void sl_cpu_softmax(float *x, int n);

/* x[i] /= d for i < n: IEEE division on every path, so the same bits as the scalar loop. */
void sl_cpu_div(float *x, int n, float d);

/* The index of the largest of x (n >= 1): the lowest index on ties; NaN never wins over a number
 * (all NaN: 0). Exact whatever the ISA path: only comparisons. */
int32_t sl_cpu_argmax(const float *x, int n);

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
 * base + pages[t / page_size] * page_stride + (t % page_size) * row_stride (in elements of
 * `type`: SL_DTYPE_F32, the zero value, or SL_DTYPE_F16, converted exactly to fp32 on load). */
struct sl_cpu_pages {
    const void *base;
    const int32_t *pages;
    size_t page_stride;
    size_t row_stride;
    int page_size;
    enum sl_dtype type;
};

/* Causal attention of one query head over positions 0..n_ctx-1:
 * out (hs) = softmax(q · Kᵀ / sqrt(hs)) · V, where row t of K (V) is the hs floats at position t
 * of k (v). att: scratch (n_ctx). */
void sl_cpu_attention(float *out, const float *q, const struct sl_cpu_pages *k,
                      const struct sl_cpu_pages *v, int n_ctx, int hs, float *att);

/* The most queries sl_cpu_attention_multi takes at once. */
#define SL_CPU_ATTN_MAX_Q 8

/* nq (1..SL_CPU_ATTN_MAX_Q) queries over the same K and V (the heads of a grouped-query group,
 * or rows of one sequence): for each i, outs[i] (hs) = sl_cpu_attention(qs[i], k, v, n_ctx[i]),
 * bit for bit; each K and V row is loaded once for all the queries that see it. n_ctx[i] >= 1.
 * att: scratch (nq, att_stride floats), att_stride >= every n_ctx[i]. */
void sl_cpu_attention_multi(int nq, float *const *outs, const float *const *qs, const int *n_ctx,
                            const struct sl_cpu_pages *k, const struct sl_cpu_pages *v, int hs,
                            float *att, size_t att_stride);

/* One query row of every head (a decode token) over pages that hold all KV heads of a position
 * range, (n_kv_heads, page_size, hs) per page with row_stride == hs: head h reads KV head
 * h / (n_heads / n_kv_heads), whose rows start h's page_size · hs elements into each page.
 * out (n_heads · hs)[h] = sl_cpu_attention(q (n_heads · hs)[h], ...), bit for bit; the pages are
 * read in address order, every head of a page together. att: scratch (n_heads, att_stride),
 * att_stride >= n_ctx >= 1. */
void sl_cpu_attention_row(float *out, const float *q, int n_heads, int n_kv_heads,
                          const struct sl_cpu_pages *k, const struct sl_cpu_pages *v, int n_ctx,
                          int hs, float *att, size_t att_stride);

/* ---------------------------------------------------------------------------------------------
 * Thread pool
 *
 * A fixed set of threads that run one job at a time. Workers spin briefly between jobs (a
 * forward pass posts a few jobs per layer, and a futex wake-up costs more than a small matmul),
 * then sleep. A pool of 1 thread runs everything on the caller and starts no thread.
 */
struct sl_cpu_pool;

/* threads: total threads including the caller (0 = one per CPU this thread may run on, its
 * affinity mask: what taskset or a cpuset allows). With pin, and from 2 threads up to that many
 * CPUs, each thread runs on a CPU of its own: pool thread i on the mask's CPU i, and the thread
 * that calls sl_cpu_pool_run on its first (from its first run; sl_cpu_pool_free, called by that
 * thread, gives it its mask back; threads it starts meanwhile inherit the one CPU). Unpinned, a
 * worker woken after a pause could be placed on the caller's CPU, and on the project's 2-vCPU VM
 * each job then waited on it (a 60 µs matmul took 400-700) until the kernel moved it, 10-20 ms
 * later: a prompt reaching an idle server had a third more TTFT. Returns NULL only when a thread
 * cannot be started; a CPU the system refuses leaves that thread unpinned. */
struct sl_cpu_pool *sl_cpu_pool_new(int threads, bool pin);
void sl_cpu_pool_free(struct sl_cpu_pool *p);
int sl_cpu_pool_threads(const struct sl_cpu_pool *p);
/* Pool threads (not counting the caller) that run pinned to a CPU of their own. */
int sl_cpu_pool_pinned(const struct sl_cpu_pool *p);

/* Room for the pool's matmuls to pack x (up to rows × cols) once per job rather than once per
 * piece of work (the AVX-512 matmul; elsewhere a no-op): allocated here, so that a forward pass
 * need not. A job larger than the room still runs, packing piece by piece. SL_ENOMEM when the
 * room cannot be had (the pool keeps what it had). */
enum sl_status sl_cpu_pool_reserve(struct sl_cpu_pool *p, int rows, int cols);

/* Runs fn(arg, ith, nth) on every thread of the pool (ith in [0, nth), the caller is 0) and
 * returns when all have returned. NULL pool: fn(arg, 0, 1) on the caller. */
void sl_cpu_pool_run(struct sl_cpu_pool *p, void (*fn)(void *arg, int ith, int nth), void *arg);

/* Guided self-scheduling of items [0, total) among nth threads that share *next (set to 0
 * before the job): claims the next chunk, about a (2 · nth)-th of what is left and at least
 * min_chunk items, sets *end past it and returns its first item; returns total when nothing is
 * left. Large chunks first keep grabs few; small ones last let the threads finish together, and
 * a thread that loses its core leaves its share to the others. Any thread may call it. */
#ifndef __cplusplus /* C11 atomics; the CUDA sources (C++) include this header too */
int sl_cpu_grab(_Atomic int *next, int total, int nth, int min_chunk, int *end);
#endif

/* Whether the pool's matmuls of Q8_0, Q4_0 and K-quant weights take 8-bit activations (the
 * integer matmul above; the config's cpu_int8_activations) or stay exact fp32 (the default).
 * Process-local to the pool; not to be changed while a job runs. */
void sl_cpu_pool_set_int8(struct sl_cpu_pool *p, bool on);
bool sl_cpu_pool_int8(const struct sl_cpu_pool *p);

/* sl_cpu_matmul split over the pool by weight rows (with the pool's int8 choice: integer for
 * quantized weights when on). Identical results whatever the thread count and batch. */
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

/* ---------------------------------------------------------------------------------------------
 * CUDA kernels (kernels/cuda/; built when sl_build_config.h has SL_HAVE_CUDA 1, else these
 * symbols do not exist)
 *
 * Pointers are device pointers unless said; `stream` is a cudaStream_t. Each function checks its
 * arguments, enqueues its work on the stream and returns at once: SL_OK, SL_EINVAL for a shape or
 * type it does not take (nothing is enqueued then), or SL_EBACKEND when the launch fails
 * (sl_cuda_last_error() says why). Nothing here synchronizes, allocates device memory or logs.
 * The functions are reentrant; the shapes of a launch depend only on the arguments, never on
 * device data, so a sequence of them can be captured in a CUDA graph and replayed with new data.
 *
 * "Typed" buffers (weights, KV cache, GEMM inputs) hold SL_DTYPE_F32, SL_DTYPE_F16 or
 * SL_DTYPE_BF16 values; activations are fp32 unless said. Results follow the CPU kernels'
 * formulas (kernels/cpu/ops.c) in fp32, but not their order of summation: they agree within a
 * rounding bound, not bit for bit (tests/kernels/test_cuda.c has the bounds).
 */

/* Positions one split-K partition of sl_cuda_attention_decode covers. */
#define SL_CUDA_ATTN_PART 256
/* Query rows one tile of sl_cuda_attention_prefill covers. */
#define SL_CUDA_PREFILL_ROWS 16
/* Largest head size the attention kernels take (even sizes only). */
#define SL_CUDA_MAX_HEAD 256

/* A static description of the last failure of a sl_cuda_ function on this thread ("swiglu:
 * invalid configuration argument"); "" when none. */
const char *sl_cuda_last_error(void);

/* dst (rows, cols) in type dt (F32, F16 or BF16) = src (rows, cols) in type st (any sl_dtype,
 * rows of sl_dtype_row_bytes(st, cols) bytes; the block-quantized ones decoded by the formulas
 * of their layouts above), rounded to nearest even: the values sl_cpu_mat_row then
 * sl_cpu_f32_to_f16/bf16 give. src is device memory, 4-byte aligned. */
int sl_cuda_convert(void *dst, enum sl_dtype dt, const void *src, enum sl_dtype st, size_t rows,
                    int cols, void *stream);

/* x (n, dim) = rows tokens[i] of table (vocab, dim), typed. A token outside [0, vocab) gives a
 * row of zeros. tokens: (n) device ids. */
int sl_cuda_embed(float *x, const void *table, enum sl_dtype t, int vocab, int dim,
                  const int32_t *tokens, int n, void *stream);

/* RMSNorm fused with the residual add. For i in [0, n), with r = rows ? rows[i] : i:
 *   x[r] (dim) += y[r] (when y is not NULL); out[i] (dim, type ot) = sl_cpu_rmsnorm(x[r], w).
 * x, y: (rows, dim) fp32; w: (dim) fp32; rows: (n) device row ids, distinct, or NULL. out, x, y
 * and w do not overlap. */
int sl_cuda_add_rmsnorm(void *out, enum sl_dtype ot, float *x, const float *y, const float *w,
                        const int32_t *rows, int n, int dim, float eps, void *stream);

/* The paged KV cache of one layer as the attention kernels read it: position t of sequence s
 * lives in block b = block_tables[s * max_blocks + t / block_size], slot t % block_size, at
 * k + ((b * n_kv_heads + g) * block_size + slot) * head_size for KV head g (likewise v). A block
 * id outside [0, n_blocks) is never read or written (its rows count as absent). */
struct sl_cuda_kv {
    void *k;                     /* (n_blocks, n_kv_heads, block_size, head_size) typed */
    void *v;                     /* (n_blocks, n_kv_heads, block_size, head_size) typed */
    enum sl_dtype type;          /* F32, F16 or BF16 */
    int n_blocks;                /* blocks in the pool */
    int block_size;              /* positions per block */
    int n_kv_heads;              /* KV heads */
    int head_size;               /* even, at most SL_CUDA_MAX_HEAD */
    const int32_t *block_tables; /* (n_seqs, max_blocks) device block ids of each sequence */
    int max_blocks;              /* entries per sequence in block_tables */
};

/* RoPE of one step's queries and keys, then the keys and values into the cache. qkv (n,
 * (n_heads + 2 * n_kv_heads) * head_size) fp32 holds each row's q, k and v heads side by side (a
 * fused projection); q and k are rotated in place at pos[r] (sl_cpu_rope_table's angles with
 * theta), then k and v of row r are stored at position pos[r] of sequence seq[r] in kv. pos, seq:
 * (n) device. */
int sl_cuda_rope_kv(float *qkv, int n, int n_heads, float theta, const int32_t *pos,
                    const int32_t *seq, const struct sl_cuda_kv *kv, void *stream);

/* Floats of workspace sl_cuda_attention_decode needs for n_rows rows. */
size_t sl_cuda_attention_decode_ws(int n_rows, int n_heads, int head_size, int max_ctx);

/* Paged attention of single query rows (decodes), grouped-query heads, split-K. For each listed
 * row r = rows[i] (i < n_rows) and query head h (KV head h / (n_heads / n_kv_heads)): out[r] head h
 * (type ot) = sl_cpu_attention(q of row r head h, positions 0..pos[r] of sequence seq[r]). q is
 * read from qkv laid out as for sl_cuda_rope_kv; out is (rows, n_heads * head_size). The context is
 * cut into SL_CUDA_ATTN_PART-position partitions, each attended by its own thread block, then
 * merged (flash-decoding); the grid covers ceil(max_ctx / SL_CUDA_ATTN_PART) partitions whatever
 * the lengths, so a captured graph stays valid as contexts grow. pos[r] < max_ctx. ws:
 * sl_cuda_attention_decode_ws(n_rows, ...) floats. */
int sl_cuda_attention_decode(void *out, enum sl_dtype ot, const float *qkv, const int32_t *rows,
                             int n_rows, const int32_t *pos, const int32_t *seq,
                             const struct sl_cuda_kv *kv, int n_heads, int max_ctx, float *ws,
                             void *stream);

/* Causal attention of prefill chunks (varlen): tiles (n_tiles, 2) device pairs (first row, row
 * count <= SL_CUDA_PREFILL_ROWS) of consecutive rows of one sequence. Each tile's rows attend,
 * head by head, to positions 0..pos[r] of their sequence through the cache (which already holds
 * the chunk's own keys), key tile by key tile with an online softmax. Same result and layouts as
 * sl_cuda_attention_decode. */
int sl_cuda_attention_prefill(void *out, enum sl_dtype ot, const float *qkv, const int32_t *tiles,
                              int n_tiles, const int32_t *pos, const int32_t *seq,
                              const struct sl_cuda_kv *kv, int n_heads, void *stream);

/* out (n, hidden) type ot = sl_cpu_swiglu of h13 (n, 2 * hidden) fp32: the gate's columns
 * [0, hidden) and the up projection's [hidden, 2 * hidden) of one fused product. */
int sl_cuda_swiglu(void *out, enum sl_dtype ot, const float *h13, int n, int hidden, void *stream);

/* Projections through cuBLAS: one handle bound to one stream, with its own workspace (so that
 * its calls can be captured in a graph). Belongs to one thread at a time. */
struct sl_cuda_blas;
/* On the current device. Returns SL_OK, or SL_EBACKEND when cuBLAS or the workspace cannot be
 * had (sl_cuda_last_error() says why). */
int sl_cuda_blas_new(void *stream, struct sl_cuda_blas **out);
void sl_cuda_blas_free(struct sl_cuda_blas *b);
/* out (n, rows) fp32 = x (n, cols) · Wᵀ, W (rows, cols) row-major as in struct sl_mat; x and W
 * both in type t (F32, F16 or BF16), products accumulated in fp32 (no TF32). */
int sl_cuda_gemm(struct sl_cuda_blas *b, float *out, const void *x, const void *w, enum sl_dtype t,
                 int n, int rows, int cols);

/* One row's sampling on the device: sl_sample's parameters and the coin it would draw. */
struct sl_cuda_sample_row {
    float temperature; /* <= 0: greedy */
    float top_p;       /* (0, 1]; 1 = off */
    float min_p;       /* 0 = off */
    float coin;        /* uniform in [0, 1) */
    int32_t top_k;     /* 0 = off, 1 = greedy */
    int32_t unused;    /* keeps the row 8 bytes aligned; 0 */
};

/* Bytes of workspace sl_cuda_sample needs for up to max_rows rows of vocab logits; 0 when the
 * sizes overflow or the device cannot be asked. */
size_t sl_cuda_sample_ws_bytes(int max_rows, int vocab);

/* ids (n) = the token sl_sample would pick from each row of logits (n, vocab) with rows[i] and
 * coin rows[i].coin: greedy rows the argmax (lowest id on ties); others softmax(logits /
 * temperature), then min-p, top-k and top-p in that order, each candidate set ordered by
 * probability then id, and one draw with the coin. logits are overwritten. `filtered`: whether
 * any row uses min-p, top-k or top-p (the host knows; only then are rows sorted). rows: (n)
 * device. ws: ws_bytes >= sl_cuda_sample_ws_bytes(n, vocab). */
int sl_cuda_sample(int32_t *ids, float *logits, int n, int vocab,
                   const struct sl_cuda_sample_row *rows, bool filtered, void *ws, size_t ws_bytes,
                   void *stream);

/* Device bandwidth probe: dst = src, bytes a multiple of 16, both 16-byte aligned, read and
 * written once by a grid-stride kernel. */
int sl_cuda_bench_copy(void *dst, const void *src, size_t bytes, void *stream);

#endif
