/* Row-wise CUDA kernels: conversions, embedding gather, RMSNorm with the residual add, RoPE with
 * the KV cache write, SwiGLU, and the bandwidth probe. One thread block per row where a row needs
 * a reduction; grid-stride loops elsewhere. Plain indexing throughout: every kernel is a direct
 * transcription of its CPU counterpart in kernels/cpu/ops.c. */
#include "cuda_impl.cuh"

#include <stdio.h>

static thread_local char last_error[160];

extern "C" const char *sl_cuda_last_error(void)
{
    return last_error;
}

extern "C" int sl_cuda_fail(const char *what, cudaError_t e)
{
    snprintf(last_error, sizeof last_error, "%s: %s", what, cudaGetErrorString(e));
    return SL_EBACKEND;
}

extern "C" int sl_cuda_invalid(const char *what)
{
    snprintf(last_error, sizeof last_error, "%s", what);
    return SL_EINVAL;
}

/* ---------------------------------------------------------------------------------------------
 * Conversions
 */

__device__ static float ld_half(const unsigned char *p)
{
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* Value c of a row of a block-quantized type (kernels.h's layouts), as sl_cpu_mat_row gives it:
 * read byte by byte, since the blocks leave their fp16 fields only 2-aligned. */
__device__ static float dequant_value(int st, const unsigned char *row, int c)
{
    switch (st) {
    case SL_DTYPE_Q8_0: {
        const unsigned char *b = row + (size_t)(c / 32) * SL_Q8_0_BYTES;
        return ld_half(b) * (float)(signed char)b[2 + c % 32];
    }
    case SL_DTYPE_Q4_0: {
        const unsigned char *b = row + (size_t)(c / 32) * SL_Q4_0_BYTES;
        int i = c % 32, q = i < 16 ? b[2 + i] & 15 : b[2 + i - 16] >> 4;
        return ld_half(b) * (float)(q - 8);
    }
    case SL_DTYPE_Q4_K:
    case SL_DTYPE_Q5_K: {
        size_t bb = st == SL_DTYPE_Q4_K ? SL_Q4_K_BYTES : SL_Q5_K_BYTES;
        const unsigned char *b = row + (size_t)(c / SL_QK_BLOCK) * bb, *sc = b + 4;
        const unsigned char *qs = b + (st == SL_DTYPE_Q4_K ? 16 : 48);
        int i = c % SL_QK_BLOCK, chunk = i / 64, upper = (i % 64) >= 32, l = i % 32;
        int s = 2 * chunk + upper, scale, min;
        if (s < 4) {
            scale = sc[s] & 63;
            min = sc[s + 4] & 63;
        } else {
            scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
            min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
        }
        int q = upper ? qs[32 * chunk + l] >> 4 : qs[32 * chunk + l] & 15;
        if (st == SL_DTYPE_Q5_K && ((b[16 + l] >> s) & 1))
            q += 16;
        return __fmul_rn(__fmul_rn(ld_half(b), (float)scale), (float)q) -
               __fmul_rn(ld_half(b + 2), (float)min);
    }
    default: { /* Q6_K */
        const unsigned char *b = row + (size_t)(c / SL_QK_BLOCK) * SL_Q6_K_BYTES;
        int i = c % SL_QK_BLOCK, h = i / 128, j = (i % 128) / 32, l = i % 32;
        int lo = j % 2 ? b[64 * h + 32 + l] : b[64 * h + l];
        lo = j < 2 ? lo & 15 : lo >> 4;
        int q = lo | ((b[128 + 32 * h + l] >> (2 * j)) & 3) << 4;
        return __fmul_rn(ld_half(b + 208) * (float)(signed char)b[192 + i / 16], (float)(q - 32));
    }
    }
}

template <typename D>
__global__ void convert_kernel(D *dst, const unsigned char *src, int st, size_t rows, int cols,
                               size_t row_bytes)
{
    size_t n = rows * (size_t)cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)cols;
        int c = (int)(i % (size_t)cols);
        float v;
        if (st == SL_DTYPE_F32) {
            v = ((const float *)src)[i];
        } else if (st == SL_DTYPE_F16) {
            v = __half2float(((const __half *)src)[i]);
        } else if (st == SL_DTYPE_BF16) {
            v = __bfloat162float(((const __nv_bfloat16 *)src)[i]);
        } else {
            v = dequant_value(st, src + r * row_bytes, c);
        }
        sl_st(dst, i, v);
    }
}

extern "C" int sl_cuda_convert(void *dst, enum sl_dtype dt, const void *src, enum sl_dtype st,
                               size_t rows, int cols, void *stream)
{
    size_t rb = sl_dtype_row_bytes(st, cols);
    if (!dst || !src || cols < 1 || rb == 0 || !sl_cuda_typed(dt))
        return sl_cuda_invalid("convert: bad arguments");
    if (rows == 0)
        return SL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    unsigned blocks = sl_cuda_blocks(rows * (size_t)cols, 256, 65535);
    return SL_CUDA_DISPATCH(dt, D, {
        convert_kernel<D>
            <<<blocks, 256, 0, s>>>((D *)dst, (const unsigned char *)src, (int)st, rows, cols, rb);
        return sl_cuda_launched("convert");
    });
}

/* ---------------------------------------------------------------------------------------------
 * Embedding gather
 */

template <typename T>
__global__ void embed_kernel(float *x, const T *table, int vocab, int dim, const int32_t *tokens)
{
    int r = blockIdx.x;
    int32_t tok = tokens[r];
    bool ok = tok >= 0 && tok < vocab;
    for (int j = threadIdx.x; j < dim; j += blockDim.x)
        x[(size_t)r * dim + j] = ok ? sl_ld(table, (size_t)tok * dim + j) : 0.0f;
}

extern "C" int sl_cuda_embed(float *x, const void *table, enum sl_dtype t, int vocab, int dim,
                             const int32_t *tokens, int n, void *stream)
{
    if (!x || !table || !tokens || vocab < 1 || dim < 1 || n < 0)
        return sl_cuda_invalid("embed: bad arguments");
    if (n == 0)
        return SL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    return SL_CUDA_DISPATCH(t, T, {
        embed_kernel<T><<<n, SL_CUDA_ROW_THREADS, 0, s>>>(x, (const T *)table, vocab, dim, tokens);
        return sl_cuda_launched("embed");
    });
}

/* ---------------------------------------------------------------------------------------------
 * RMSNorm fused with the residual add
 */

/* Columns of a row each add_rmsnorm thread keeps in registers: the row is loaded in one go, its
 * updated x stored after, and the output written from the registers, so a decode step's single
 * row waits on memory once, not once per column (dim up to 16 · SL_CUDA_ROW_THREADS; wider rows
 * do the rest column by column). */
#define RMS_KEEP 16

template <typename O>
__global__ void add_rmsnorm_kernel(O *out, float *x, const float *y, const float *w,
                                   const int32_t *rows, int dim, float eps)
{
    __shared__ float sh[SL_CUDA_ROW_THREADS];
    int i = blockIdx.x;
    int r = rows ? rows[i] : i;
    float *xr = x + (size_t)r * dim;
    const float *yr = y ? y + (size_t)r * dim : NULL;
    int nt = blockDim.x, rest0 = threadIdx.x + RMS_KEEP * nt;
    float ss = 0.0f, xv[RMS_KEEP];
    /* Each thread owns columns j ≡ threadIdx.x (mod blockDim.x), in order. */
#pragma unroll
    for (int u = 0; u < RMS_KEEP; u++) {
        int j = threadIdx.x + u * nt;
        float v = j < dim ? xr[j] : 0.0f;
        if (yr && j < dim)
            v += yr[j];
        xv[u] = v;
        ss += v * v;
    }
    if (yr) {
#pragma unroll
        for (int u = 0; u < RMS_KEEP; u++) {
            int j = threadIdx.x + u * nt;
            if (j < dim)
                xr[j] = xv[u];
        }
    }
    for (int j = rest0; j < dim; j += nt) {
        float v = xr[j];
        if (yr) {
            v += yr[j];
            xr[j] = v;
        }
        ss += v * v;
    }
    ss = sl_block_sum(ss, sh);
    /* The CPU's order: mean, plus eps, then the reciprocal square root. */
    ss /= (float)dim;
    ss += eps;
    float scale = 1.0f / sqrtf(ss);
#pragma unroll
    for (int u = 0; u < RMS_KEEP; u++) {
        int j = threadIdx.x + u * nt;
        if (j < dim)
            sl_st(out, (size_t)i * dim + j, w[j] * (scale * xv[u]));
    }
    for (int j = rest0; j < dim; j += nt)
        sl_st(out, (size_t)i * dim + j, w[j] * (scale * xr[j]));
}

extern "C" int sl_cuda_add_rmsnorm(void *out, enum sl_dtype ot, float *x, const float *y,
                                   const float *w, const int32_t *rows, int n, int dim, float eps,
                                   void *stream)
{
    if (!out || !x || !w || n < 0 || dim < 1)
        return sl_cuda_invalid("add_rmsnorm: bad arguments");
    if (n == 0)
        return SL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    return SL_CUDA_DISPATCH(ot, O, {
        add_rmsnorm_kernel<O><<<n, SL_CUDA_ROW_THREADS, 0, s>>>((O *)out, x, y, w, rows, dim, eps);
        return sl_cuda_launched("add_rmsnorm");
    });
}

/* ---------------------------------------------------------------------------------------------
 * RoPE and the KV cache write
 */

/* Threads of a rope_kv block, and the most blocks one row's pairs are spread over: a single
 * decode row has (n_heads + n_kv_heads) · head_size / 2 pairs, each a powf, a cosf and a sinf,
 * too many for one block to finish soon. */
#define ROPE_THREADS 128
#define ROPE_MAX_SPLIT 16

/* Block (r, part): row r's pairs and V values idx ≡ part · ROPE_THREADS + threadIdx.x (mod
 * gridDim.y · ROPE_THREADS). */
template <typename K>
__global__ void rope_kv_kernel(float *qkv, int n_heads, float theta, const int32_t *pos,
                               const int32_t *seq, struct sl_cuda_kv kv)
{
    int r = blockIdx.x;
    int first = blockIdx.y * blockDim.x + threadIdx.x, step = gridDim.y * blockDim.x;
    int hs = kv.head_size, nkv = kv.n_kv_heads, half = hs / 2;
    float *row = qkv + (size_t)r * (size_t)(n_heads + 2 * nkv) * hs;
    int32_t p = pos[r], s = seq[r];
    int bi = p / kv.block_size, slot = p % kv.block_size;
    int32_t b = bi < kv.max_blocks ? kv.block_tables[(size_t)s * kv.max_blocks + bi] : -1;
    bool store = p >= 0 && b >= 0 && b < kv.n_blocks;
    K *kc = (K *)kv.k, *vc = (K *)kv.v;
    /* Pairs (2i, 2i+1) of every query head, then of every key head. */
    for (int idx = first; idx < (n_heads + nkv) * half; idx += step) {
        int h = idx / half, i = idx % half;
        /* sl_cpu_rope_table's expression, term for term. */
        float freq = 1.0f / powf(theta, (float)(2 * i) / (float)hs);
        float val = (float)p * freq;
        float fcr = cosf(val), fci = sinf(val);
        float *v = row + (size_t)h * hs + 2 * i;
        float v0 = v[0], v1 = v[1];
        float a = v0 * fcr - v1 * fci, c = v0 * fci + v1 * fcr;
        v[0] = a;
        v[1] = c;
        if (h >= n_heads && store) {
            size_t off = (((size_t)b * nkv + (h - n_heads)) * kv.block_size + slot) * hs + 2 * i;
            sl_st(kc, off, a);
            sl_st(kc, off + 1, c);
        }
    }
    if (!store)
        return;
    const float *vr = row + (size_t)(n_heads + nkv) * hs;
    for (int idx = first; idx < nkv * hs; idx += step) {
        int g = idx / hs, d = idx % hs;
        sl_st(vc, (((size_t)b * nkv + g) * kv.block_size + slot) * hs + d, vr[idx]);
    }
}

bool sl_cuda_kv_ok(const struct sl_cuda_kv *kv)
{
    return kv && kv->k && kv->v && sl_cuda_typed(kv->type) && kv->n_blocks >= 1 &&
           kv->block_size >= 1 && kv->n_kv_heads >= 1 && kv->head_size >= 2 &&
           kv->head_size % 2 == 0 && kv->head_size <= SL_CUDA_MAX_HEAD && kv->block_tables &&
           kv->max_blocks >= 1;
}

extern "C" int sl_cuda_rope_kv(float *qkv, int n, int n_heads, float theta, const int32_t *pos,
                               const int32_t *seq, const struct sl_cuda_kv *kv, void *stream)
{
    if (!qkv || n < 0 || n_heads < 1 || !pos || !seq || !sl_cuda_kv_ok(kv))
        return sl_cuda_invalid("rope_kv: bad arguments");
    if (n == 0)
        return SL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    struct sl_cuda_kv k = *kv;
    return SL_CUDA_DISPATCH(kv->type, K, {
        int pairs = (n_heads + kv->n_kv_heads) * (kv->head_size / 2);
        dim3 grid((unsigned)n, sl_cuda_blocks((size_t)pairs, ROPE_THREADS, ROPE_MAX_SPLIT));
        rope_kv_kernel<K><<<grid, ROPE_THREADS, 0, s>>>(qkv, n_heads, theta, pos, seq, k);
        return sl_cuda_launched("rope_kv");
    });
}

/* ---------------------------------------------------------------------------------------------
 * SwiGLU
 */

template <typename O> __global__ void swiglu_kernel(O *out, const float *h13, int n, int hidden)
{
    size_t total = (size_t)n * hidden;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / (size_t)hidden, j = i % (size_t)hidden;
        const float *row = h13 + r * 2 * (size_t)hidden;
        float v = row[j];
        v *= 1.0f / (1.0f + expf(-v));
        sl_st(out, i, v * row[hidden + j]);
    }
}

extern "C" int sl_cuda_swiglu(void *out, enum sl_dtype ot, const float *h13, int n, int hidden,
                              void *stream)
{
    if (!out || !h13 || n < 0 || hidden < 1)
        return sl_cuda_invalid("swiglu: bad arguments");
    if (n == 0)
        return SL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    unsigned blocks = sl_cuda_blocks((size_t)n * hidden, 256, 65535);
    return SL_CUDA_DISPATCH(ot, O, {
        swiglu_kernel<O><<<blocks, 256, 0, s>>>((O *)out, h13, n, hidden);
        return sl_cuda_launched("swiglu");
    });
}

/* ---------------------------------------------------------------------------------------------
 * Bandwidth probe
 */

__global__ void copy_kernel(float4 *dst, const float4 *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

extern "C" int sl_cuda_bench_copy(void *dst, const void *src, size_t bytes, void *stream)
{
    if (!dst || !src || bytes % 16 || (uintptr_t)dst % 16 || (uintptr_t)src % 16)
        return sl_cuda_invalid("bench_copy: bad arguments");
    if (bytes == 0)
        return SL_OK;
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
        return sl_cuda_fail("bench_copy", e);
    size_t n = bytes / 16;
    unsigned blocks = sl_cuda_blocks(n, 512, (unsigned)(sms > 0 ? sms * 8 : 1024));
    copy_kernel<<<blocks, 512, 0, (cudaStream_t)stream>>>((float4 *)dst, (const float4 *)src, n);
    return sl_cuda_launched("bench_copy");
}
