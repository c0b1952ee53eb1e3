/* Projections through cuBLAS: out = x · Wᵀ with row-major operands.
 *
 * cuBLAS is column-major. A row-major W (rows, cols) is a column-major (cols, rows) matrix, so
 * W is passed transposed (m = rows, k = cols, lda = cols); a row-major x (n, cols) is a
 * column-major (cols, n) matrix passed as is (ldb = cols); the column-major (rows, n) result is
 * the row-major (n, rows) out (ldc = rows). Products are accumulated in fp32
 * (CUBLAS_COMPUTE_32F, the default math mode: no TF32 unless asked for). */
#include <sluice/kernels.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

/* cuBLAS's recommended workspace for Hopper; given explicitly so that a captured graph never
 * needs cuBLAS to allocate. */
#define WORKSPACE_BYTES ((size_t)32 << 20)

struct sl_cuda_blas {
    cublasHandle_t h;
    void *workspace; /* (WORKSPACE_BYTES) device */
};

/* The kernels' error slot (kernels/cuda/ops.cu, C linkage). */
int sl_cuda_fail(const char *what, cudaError_t e);
int sl_cuda_invalid(const char *what);

static int blas_fail(const char *what, cublasStatus_t st)
{
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s", what, cublasGetStatusString(st));
    sl_cuda_invalid(msg);
    return SL_EBACKEND;
}

void sl_cuda_blas_free(struct sl_cuda_blas *b)
{
    if (!b)
        return;
    if (b->h)
        cublasDestroy(b->h);
    if (b->workspace)
        cudaFree(b->workspace);
    free(b);
}

int sl_cuda_blas_new(void *stream, struct sl_cuda_blas **out)
{
    struct sl_cuda_blas *b = sl_xcalloc(1, sizeof *b);
    cublasStatus_t st = cublasCreate(&b->h);
    int rc = SL_OK;
    if (st != CUBLAS_STATUS_SUCCESS) {
        b->h = NULL;
        rc = blas_fail("cublasCreate", st);
        goto fail;
    }
    cudaError_t e = cudaMalloc(&b->workspace, WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        b->workspace = NULL;
        rc = sl_cuda_fail("cuBLAS workspace", e);
        goto fail;
    }
    if ((st = cublasSetStream(b->h, (cudaStream_t)stream)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetWorkspace(b->h, b->workspace, WORKSPACE_BYTES)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetMathMode(b->h, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS) {
        rc = blas_fail("cuBLAS set-up", st);
        goto fail;
    }
    *out = b;
    return SL_OK;
fail:
    sl_cuda_blas_free(b);
    return rc;
}

int sl_cuda_gemm(struct sl_cuda_blas *b, float *out, const void *x, const void *w, enum sl_dtype t,
                 int n, int rows, int cols)
{
    cudaDataType type = t == SL_DTYPE_F32    ? CUDA_R_32F
                        : t == SL_DTYPE_F16  ? CUDA_R_16F
                        : t == SL_DTYPE_BF16 ? CUDA_R_16BF
                                             : (cudaDataType)-1;
    if (!b || !out || !x || !w || type == (cudaDataType)-1 || n < 0 || rows < 1 || cols < 1)
        return sl_cuda_invalid("gemm: bad arguments");
    if (n == 0)
        return SL_OK;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st =
        cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, w, type, cols, x, type,
                     cols, &zero, out, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? SL_OK : blas_fail("cublasGemmEx", st);
}
