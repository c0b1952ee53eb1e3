/* Private helpers of the CUDA kernels: element types, block reductions, launch checks. */
#ifndef SLUICE_KERNELS_CUDA_IMPL_CUH
#define SLUICE_KERNELS_CUDA_IMPL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include <sluice/kernels.h>
}

/* Kernel-private, with C linkage so that blas.c shares them. Records the failure for
 * sl_cuda_last_error() and returns SL_EBACKEND. */
extern "C" int sl_cuda_fail(const char *what, cudaError_t e);
/* Records an argument error for sl_cuda_last_error() and returns SL_EINVAL. */
extern "C" int sl_cuda_invalid(const char *what);

/* A struct sl_cuda_kv the kernels can take (pointers set, sizes in range). */
bool sl_cuda_kv_ok(const struct sl_cuda_kv *kv);

/* After a launch: SL_OK, or SL_EBACKEND naming the kernel. */
static inline int sl_cuda_launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? SL_OK : sl_cuda_fail(what, e);
}

/* Typed loads and stores: every typed buffer is read as fp32 and written rounded to nearest. */
__device__ __forceinline__ float sl_ld(const float *p, size_t i)
{
    return p[i];
}
__device__ __forceinline__ float sl_ld(const __half *p, size_t i)
{
    return __half2float(p[i]);
}
__device__ __forceinline__ float sl_ld(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void sl_st(float *p, size_t i, float v)
{
    p[i] = v;
}
__device__ __forceinline__ void sl_st(__half *p, size_t i, float v)
{
    p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void sl_st(__nv_bfloat16 *p, size_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}

/* Runs the statements after `T` (which end in a return of an int) with T bound to the C++ type
 * of typed buffer type `t` (F32, F16 or BF16); evaluates to their result, or to SL_EINVAL for any
 * other type. */
#define SL_CUDA_DISPATCH(t, T, ...)                                                                \
    ((t) == SL_DTYPE_F32    ? [&]() -> int { using T = float; __VA_ARGS__; }()                     \
     : (t) == SL_DTYPE_F16  ? [&]() -> int { using T = __half; __VA_ARGS__; }()                    \
     : (t) == SL_DTYPE_BF16 ? [&]() -> int { using T = __nv_bfloat16; __VA_ARGS__; }()             \
                            : sl_cuda_invalid("unsupported element type"))

static inline bool sl_cuda_typed(enum sl_dtype t)
{
    return t == SL_DTYPE_F32 || t == SL_DTYPE_F16 || t == SL_DTYPE_BF16;
}

/* Threads of the row-wise kernels: a power of two, so the tree reductions below halve evenly. */
#define SL_CUDA_ROW_THREADS 256

/* Sum of v over the block (blockDim.x a power of two, at most SL_CUDA_ROW_THREADS), returned to
 * every thread. sh: blockDim.x floats of shared memory, free again on return. */
__device__ __forceinline__ float sl_block_sum(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

/* Sum and max over the 32 lanes of a warp; every lane of the warp must call it. */
__device__ __forceinline__ float sl_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float sl_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Grid size for a grid-stride loop over n items with `threads` per block. */
static inline unsigned sl_cuda_blocks(size_t n, unsigned threads, unsigned cap)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > cap ? cap : b);
}

/* Allows a kernel more than 48 KiB of dynamic shared memory when it needs it. */
template <typename K> static inline int sl_cuda_smem(K kernel, size_t bytes, const char *what)
{
    if (bytes <= 48 * 1024)
        return SL_OK;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return e == cudaSuccess ? SL_OK : sl_cuda_fail(what, e);
}

#endif
