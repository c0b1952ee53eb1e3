/* Sampling on the device, so that only token ids cross PCIe. A transcription of
 * worker/sampler.c's sl_sample with the coin drawn by the host:
 *   1. one block per row: greedy rows take the argmax; the others scale by the temperature and
 *      softmax in place; rows without filters draw in id order right there;
 *   2. rows with min-p, top-k or top-p are sorted by (probability desc, id asc) with CUB's
 *      segmented radix sort over 64-bit keys (probability bits above the inverted id, so the
 *      order is total and the sort's stability does not matter);
 *   3. one block per filtered row walks the sorted prefix with block-wide prefix sums.
 * Sums run in a different order than the CPU's left-to-right loops, so a coin that falls within
 * rounding of a boundary between two tokens may pick the neighbour; nothing else differs. */
#include "cuda_impl.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include <limits.h>

#define SAMPLE_THREADS 512

struct best {
    float v;
    int id;
};

/* sl_sample's argmax order as a total order: numbers above NaN, then larger, then lower id. */
struct best_op {
    __device__ __forceinline__ best operator()(const best &a, const best &b) const
    {
        bool an = a.v != a.v, bn = b.v != b.v;
        if (an != bn)
            return an ? b : a;
        if (!an && a.v != b.v)
            return a.v > b.v ? a : b;
        return a.id < b.id ? a : b;
    }
};

struct max_op {
    __device__ __forceinline__ float operator()(float a, float b) const
    {
        return fmaxf(a, b);
    }
};

struct max_int_op {
    __device__ __forceinline__ int operator()(int a, int b) const
    {
        return a > b ? a : b;
    }
};

struct min_int_op {
    __device__ __forceinline__ int operator()(int a, int b) const
    {
        return a < b ? a : b;
    }
};

typedef cub::BlockReduce<best, SAMPLE_THREADS> reduce_best;
typedef cub::BlockReduce<float, SAMPLE_THREADS> reduce_f;
typedef cub::BlockReduce<int, SAMPLE_THREADS> reduce_i;
typedef cub::BlockScan<float, SAMPLE_THREADS> scan_f;

union sample_smem {
    typename reduce_best::TempStorage best;
    typename reduce_f::TempStorage f;
    typename reduce_i::TempStorage i;
    typename scan_f::TempStorage scan;
};

/* The first index j < count whose inclusive prefix sum of get(0..j) exceeds limit, or -1; *total
 * gets the sum of all count values (up to j's chunk when found early, which callers don't use).
 * Block-uniform: every thread of the block must call it with the same arguments. */
template <typename G>
__device__ int first_exceeding(G get, int count, float limit, float *total, sample_smem &sm)
{
    __shared__ float carry;
    __shared__ int found;
    if (threadIdx.x == 0) {
        carry = 0.0f;
        found = INT_MAX;
    }
    __syncthreads();
    for (int base = 0; base < count; base += SAMPLE_THREADS) {
        int i = base + (int)threadIdx.x;
        float v = i < count ? get(i) : 0.0f, inc;
        scan_f(sm.scan).InclusiveSum(v, inc);
        float prefix = carry + inc;
        __syncthreads(); /* everyone has read carry and the scan storage is free */
        if (i < count && prefix > limit)
            atomicMin(&found, i);
        if (threadIdx.x == SAMPLE_THREADS - 1)
            carry = prefix; /* the padding adds 0, so the last thread holds the chunk's end */
        __syncthreads();
        if (found != INT_MAX)
            break;
    }
    *total = carry;
    int f = found;
    __syncthreads(); /* before a later call resets the shared state */
    return f == INT_MAX ? -1 : f;
}

__device__ __forceinline__ bool is_greedy(const struct sl_cuda_sample_row &p)
{
    return !(p.temperature > 0.0f) || !(p.top_p > 0.0f) || p.top_k == 1;
}

__device__ __forceinline__ bool is_filtered(const struct sl_cuda_sample_row &p)
{
    return !is_greedy(p) && (p.top_p < 1.0f || p.top_k > 0 || p.min_p > 0.0f);
}

__device__ __forceinline__ unsigned long long key_of(float p, int id)
{
    return (unsigned long long)__float_as_uint(p) << 32 | (unsigned long long)(0xffffffffu - (unsigned)id);
}

__global__ void sample_head_kernel(int32_t *ids, float *logits, int vocab,
                                   const struct sl_cuda_sample_row *rows, int *begin, int *end,
                                   unsigned long long *keys)
{
    __shared__ sample_smem sm;
    __shared__ float bcast;
    __shared__ int bcast_i;
    int r = blockIdx.x;
    struct sl_cuda_sample_row p = rows[r];
    float *x = logits + (size_t)r * vocab;
    bool filtered = is_filtered(p);
    if (threadIdx.x == 0) {
        begin[r] = r * vocab;
        end[r] = filtered ? (r + 1) * vocab : r * vocab;
    }
    if (vocab <= 1) {
        if (threadIdx.x == 0)
            ids[r] = 0;
        return;
    }
    if (is_greedy(p)) {
        best b = {NAN, INT_MAX};
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            b = best_op()(b, best{x[i], i});
        b = reduce_best(sm.best).Reduce(b, best_op());
        if (threadIdx.x == 0)
            ids[r] = b.id;
        return;
    }
    /* logits / temperature, then sl_cpu_softmax: max, exp(x - max), sum, divide. */
    float m = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        x[i] /= p.temperature;
        m = fmaxf(m, x[i]);
    }
    m = reduce_f(sm.f).Reduce(m, max_op());
    if (threadIdx.x == 0)
        bcast = m;
    __syncthreads();
    m = bcast;
    float sum = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        x[i] = expf(x[i] - m);
        sum += x[i];
    }
    __syncthreads();
    sum = reduce_f(sm.f).Sum(sum);
    if (threadIdx.x == 0)
        bcast = sum;
    __syncthreads();
    sum = bcast;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        x[i] /= sum;
    __syncthreads();
    if (filtered) {
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            keys[(size_t)r * vocab + i] = key_of(x[i], i);
        return;
    }
    /* No filter: the first id whose running sum exceeds the coin, else the last id with mass. */
    float total;
    int j = first_exceeding([&](int i) { return x[i]; }, vocab, p.coin, &total, sm);
    if (j < 0) {
        int last = -1;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x)
            if (x[i] > 0.0f)
                last = i;
        last = reduce_i(sm.i).Reduce(last, max_int_op());
        if (threadIdx.x == 0)
            bcast_i = last < 0 ? 0 : last;
        __syncthreads();
        j = bcast_i;
    }
    if (threadIdx.x == 0)
        ids[r] = j;
}

__global__ void sample_tail_kernel(int32_t *ids, int vocab, const struct sl_cuda_sample_row *rows,
                                   const unsigned long long *sorted)
{
    __shared__ sample_smem sm;
    __shared__ int bcast_i;
    int r = blockIdx.x;
    struct sl_cuda_sample_row p = rows[r];
    if (vocab <= 1 || !is_filtered(p))
        return;
    const unsigned long long *ks = sorted + (size_t)r * vocab;
    auto prob = [&](int i) { return __uint_as_float((unsigned)(ks[i] >> 32)); };
    auto id_at = [&](int i) { return (int32_t)(0xffffffffu - (unsigned)(ks[i] & 0xffffffffu)); };
    float cutoff = p.min_p > 0.0f ? p.min_p * prob(0) : 0.0f;
    bool top_p = p.top_p < 1.0f;
    if (top_p && p.top_k <= 0 && cutoff == 0.0f && vocab > 1)
        cutoff = (1.0f - p.top_p) / (float)(vocab - 1);
    /* Candidates (probability >= cutoff and > 0) are a prefix of the sorted row: k is the first
     * index that fails. */
    int k = vocab;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = prob(i);
        if (!(v >= cutoff && v > 0.0f) && i < k)
            k = i;
    }
    k = reduce_i(sm.i).Reduce(k, min_int_op());
    if (threadIdx.x == 0)
        bcast_i = k;
    __syncthreads();
    k = bcast_i;
    if (k == 0) {
        if (threadIdx.x == 0)
            ids[r] = id_at(0); /* the argmax: the highest probability, lowest id first */
        return;
    }
    int keep = p.top_k > 0 && p.top_k < k ? p.top_k : k;
    int taken = keep;
    float mass;
    if (top_p) {
        first_exceeding(prob, keep, INFINITY, &mass, sm);
        int j = first_exceeding(prob, keep, p.top_p * mass, &mass, sm);
        taken = j >= 0 ? j + 1 : keep;
    }
    float cum;
    first_exceeding(prob, taken, INFINITY, &cum, sm);
    int j = first_exceeding(prob, taken, p.coin * cum, &cum, sm);
    if (threadIdx.x == 0)
        ids[r] = id_at(j >= 0 ? j : taken - 1);
}

/* Workspace layout: begin (rows) and end (rows) offsets, keys and sorted keys (rows, vocab), then
 * CUB's temporary storage; each part 256-byte aligned. */
static size_t align256(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

static size_t fixed_bytes(int rows, int vocab)
{
    return 2 * align256((size_t)rows * sizeof(int)) +
           2 * align256((size_t)rows * vocab * sizeof(unsigned long long));
}

static cudaError_t sort_bytes(int rows, int vocab, size_t *bytes)
{
    *bytes = 0;
    return cub::DeviceSegmentedRadixSort::SortKeysDescending(
        (void *)NULL, *bytes, (const unsigned long long *)NULL, (unsigned long long *)NULL,
        rows * vocab, rows, (const int *)NULL, (const int *)NULL, 0, 64, (cudaStream_t)0);
}

extern "C" size_t sl_cuda_sample_ws_bytes(int max_rows, int vocab)
{
    if (max_rows < 1 || vocab < 1 || (long long)max_rows * vocab > INT_MAX)
        return 0;
    size_t tmp;
    if (sort_bytes(max_rows, vocab, &tmp) != cudaSuccess)
        return 0;
    return fixed_bytes(max_rows, vocab) + align256(tmp);
}

extern "C" int sl_cuda_sample(int32_t *ids, float *logits, int n, int vocab,
                              const struct sl_cuda_sample_row *rows, bool filtered, void *ws,
                              size_t ws_bytes, void *stream)
{
    if (!ids || !logits || !rows || !ws || n < 0 || vocab < 1 || (long long)n * vocab > INT_MAX)
        return sl_cuda_invalid("sample: bad arguments");
    if (n == 0)
        return SL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    char *w = (char *)ws;
    size_t rb = align256((size_t)n * sizeof(int));
    size_t kb = align256((size_t)n * vocab * sizeof(unsigned long long));
    int *begin = (int *)w, *end = (int *)(w + rb);
    unsigned long long *keys = (unsigned long long *)(w + 2 * rb);
    unsigned long long *sorted = (unsigned long long *)(w + 2 * rb + kb);
    size_t tmp = 0;
    if (filtered) {
        cudaError_t e = sort_bytes(n, vocab, &tmp);
        if (e != cudaSuccess)
            return sl_cuda_fail("sample: sort size", e);
    }
    if (2 * rb + 2 * kb + tmp > ws_bytes)
        return sl_cuda_invalid("sample: workspace too small");
    sample_head_kernel<<<n, SAMPLE_THREADS, 0, s>>>(ids, logits, vocab, rows, begin, end, keys);
    int rc = sl_cuda_launched("sample");
    if (rc != SL_OK || !filtered)
        return rc;
    cudaError_t e = cub::DeviceSegmentedRadixSort::SortKeysDescending(
        (void *)(w + 2 * rb + 2 * kb), tmp, (const unsigned long long *)keys, sorted, n * vocab, n,
        (const int *)begin, (const int *)end, 0, 64, s);
    if (e != cudaSuccess)
        return sl_cuda_fail("sample: sort", e);
    sample_tail_kernel<<<n, SAMPLE_THREADS, 0, s>>>(ids, vocab, rows, sorted);
    return sl_cuda_launched("sample filters");
}
