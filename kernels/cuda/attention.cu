/* Attention over the paged KV cache: decode rows (split-K over the context, one thread block per
 * (row, KV head, partition), the grouped query heads of a KV head together) and prefill tiles
 * (a tile of query rows of one sequence against key tiles, online softmax). Both compute
 * sl_cpu_attention's softmax(q · Kᵀ / sqrt(hs)) · V in fp32; only the order of the sums differs.
 * Simple shared-memory layouts, one role per loop: correctness first. */
#include "cuda_impl.cuh"

#define DEC_THREADS 128
#define DEC_WARPS (DEC_THREADS / 32)
#define PF_THREADS 128
#define PF_Q SL_CUDA_PREFILL_ROWS
#define PF_K 32 /* key positions per tile */

/* Block id of position t of a sequence whose table is `table`, or -1 when it is not in range. */
__device__ __forceinline__ int32_t kv_block(const struct sl_cuda_kv &kv, const int32_t *table,
                                            int t)
{
    int bi = t / kv.block_size;
    int32_t b = bi < kv.max_blocks ? table[bi] : -1;
    return b >= 0 && b < kv.n_blocks ? b : -1;
}

/* Offset of (block b, KV head g, slot of position t) in a layer's cache. */
__device__ __forceinline__ size_t kv_off(const struct sl_cuda_kv &kv, int32_t b, int g, int t)
{
    return (((size_t)b * kv.n_kv_heads + g) * kv.block_size + t % kv.block_size) *
           (size_t)kv.head_size;
}

/* ---------------------------------------------------------------------------------------------
 * Decode: partial results per partition, then a merge
 */

/* Positions whose K rows one warp loads together in decode's score loop: their loads are all
 * in flight before the first is used, so a row's few blocks don't wait on memory one position
 * at a time. */
#define DEC_POS 4
/* Head-dimension values one lane holds per position (head sizes up to SL_CUDA_MAX_HEAD). */
#define DEC_DIMS (SL_CUDA_MAX_HEAD / 32)
/* Positions whose V values a thread loads together in decode's values loop. */
#define DEC_VALS 16

/* Block (i, g, part): row rows[i], the kv_mul query heads of KV head g, positions
 * [part·P, min((part+1)·P, n_ctx)). Writes, per head, the partition's max score m, its sum of
 * exp(score − m) l, and o = Σ exp(score − m) · v (hs); an empty partition writes l = 0.
 * Shared: q (kv_mul, hs), then scores (kv_mul, P), then the cache offset of each position of
 * the partition (P; -1 where its block is absent). */
template <typename K>
__global__ void decode_part_kernel(const float *qkv, const int32_t *rows, const int32_t *pos,
                                   const int32_t *seq, struct sl_cuda_kv kv, int n_heads,
                                   int max_ctx, int n_parts, float *ws_o, float *ws_ml)
{
    extern __shared__ float smem[];
    int i = blockIdx.x, g = blockIdx.y, part = blockIdx.z;
    int hs = kv.head_size, nkv = kv.n_kv_heads, kv_mul = n_heads / nkv;
    float *q_sh = smem, *s_sh = smem + (size_t)kv_mul * hs;
    long long *off_sh = (long long *)(s_sh + (size_t)kv_mul * SL_CUDA_ATTN_PART);
    int r = rows[i];
    int n_ctx = pos[r] + 1;
    n_ctx = n_ctx > max_ctx ? max_ctx : n_ctx;
    int t0 = part * SL_CUDA_ATTN_PART;
    int t1 = t0 + SL_CUDA_ATTN_PART < n_ctx ? t0 + SL_CUDA_ATTN_PART : n_ctx;
    size_t head0 = (size_t)i * n_heads + (size_t)g * kv_mul; /* (row, first head of the group) */
    if (t0 >= t1) {
        for (int j = threadIdx.x; j < kv_mul; j += blockDim.x) {
            size_t idx = (head0 + j) * n_parts + part;
            ws_ml[2 * idx] = -INFINITY;
            ws_ml[2 * idx + 1] = 0.0f;
        }
        return;
    }
    const float *q = qkv + (size_t)r * (n_heads + 2 * nkv) * hs + (size_t)g * kv_mul * hs;
    for (int idx = threadIdx.x; idx < kv_mul * hs; idx += blockDim.x)
        q_sh[idx] = q[idx];
    const int32_t *table = kv.block_tables + (size_t)seq[r] * kv.max_blocks;
    int len = t1 - t0;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        int32_t b = kv_block(kv, table, t0 + t);
        off_sh[t] = b >= 0 ? (long long)kv_off(kv, b, g, t0 + t) : -1;
    }
    __syncthreads();

    const K *kc = (const K *)kv.k, *vc = (const K *)kv.v;
    float scale = sqrtf((float)hs);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    /* Scores: each warp takes DEC_POS positions at a time (a warp-uniform loop, so every lane
     * reaches the shuffles), lanes split the head dimension; the K values of all DEC_POS
     * positions are loaded before the first product. */
    for (int tb = warp * DEC_POS; tb < len; tb += DEC_WARPS * DEC_POS) {
        float kx[DEC_POS][DEC_DIMS];
        long long off[DEC_POS];
#pragma unroll
        for (int p = 0; p < DEC_POS; p++) {
            off[p] = tb + p < len ? off_sh[tb + p] : -1;
#pragma unroll
            for (int e = 0; e < DEC_DIMS; e++) {
                int d = lane + 32 * e;
                kx[p][e] = off[p] >= 0 && d < hs ? sl_ld(kc, (size_t)off[p] + d) : 0.0f;
            }
        }
        for (int j = 0; j < kv_mul; j++) {
            float qx[DEC_DIMS];
#pragma unroll
            for (int e = 0; e < DEC_DIMS; e++) {
                int d = lane + 32 * e;
                qx[e] = d < hs ? q_sh[j * hs + d] : 0.0f;
            }
#pragma unroll
            for (int p = 0; p < DEC_POS; p++) {
                float acc = 0.0f;
#pragma unroll
                for (int e = 0; e < DEC_DIMS; e++)
                    acc += qx[e] * kx[p][e];
                acc = sl_warp_sum(acc);
                if (lane == 0 && tb + p < len)
                    s_sh[j * SL_CUDA_ATTN_PART + tb + p] = off[p] >= 0 ? acc / scale : -INFINITY;
            }
        }
    }
    __syncthreads();
    /* Softmax numerators of each head: one warp per head. */
    for (int j = warp; j < kv_mul; j += DEC_WARPS) {
        float *sj = s_sh + j * SL_CUDA_ATTN_PART;
        float m = -INFINITY;
        for (int t = lane; t < len; t += 32)
            m = fmaxf(m, sj[t]);
        m = sl_warp_max(m);
        float sum = 0.0f;
        for (int t = lane; t < len; t += 32) {
            float e = m == -INFINITY ? 0.0f : expf(sj[t] - m);
            sj[t] = e;
            sum += e;
        }
        sum = sl_warp_sum(sum);
        if (lane == 0) {
            size_t idx = (head0 + j) * n_parts + part;
            ws_ml[2 * idx] = m;
            ws_ml[2 * idx + 1] = sum;
        }
    }
    __syncthreads();
    /* Weighted values: one thread per (head, dimension), positions in order, DEC_VALS at a time:
     * their V values are all loaded (an absent position's from offset d, a valid address, and
     * then dropped) before the first is added, so the loads do not wait on each other. */
    for (int idx = threadIdx.x; idx < kv_mul * hs; idx += blockDim.x) {
        int j = idx / hs, d = idx % hs;
        const float *sj = s_sh + j * SL_CUDA_ATTN_PART;
        float acc = 0.0f;
        for (int tb = 0; tb < len; tb += DEC_VALS) {
            float v[DEC_VALS];
            bool ok[DEC_VALS];
#pragma unroll
            for (int u = 0; u < DEC_VALS; u++) {
                long long o = tb + u < len ? off_sh[tb + u] : -1;
                ok[u] = o >= 0;
                v[u] = sl_ld(vc, (size_t)(ok[u] ? o : 0) + d);
            }
#pragma unroll
            for (int u = 0; u < DEC_VALS; u++)
                if (ok[u])
                    acc += sj[tb + u] * v[u];
        }
        ws_o[((head0 + j) * n_parts + part) * hs + d] = acc;
    }
}

/* Block (i, h): merges the partitions of row rows[i], head h into out. Each partition's sum l_p
 * and weight exp(m_p − M) are read once, into shared memory (2 · n_parts floats), so the loop
 * over the values loads nothing it has to wait on before the next load. */
template <typename O>
__global__ void decode_merge_kernel(O *out, const int32_t *rows, int n_heads, int hs, int n_parts,
                                    const float *ws_o, const float *ws_ml)
{
    extern __shared__ float merge_sh[];
    __shared__ float red[32];
    float *lv = merge_sh, *wgt = merge_sh + n_parts;
    int i = blockIdx.x, h = blockIdx.y;
    int r = rows[i];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    size_t base = ((size_t)i * n_heads + h) * n_parts;
    float M = -INFINITY;
    for (int p = threadIdx.x; p < n_parts; p += blockDim.x) {
        float l = ws_ml[2 * (base + p) + 1];
        lv[p] = l;
        if (l > 0.0f)
            M = fmaxf(M, ws_ml[2 * (base + p)]);
    }
    M = sl_warp_max(M);
    if (lane == 0)
        red[warp] = M;
    __syncthreads();
    M = -INFINITY;
    for (int w = 0; w < n_warps; w++)
        M = fmaxf(M, red[w]);
    for (int p = threadIdx.x; p < n_parts; p += blockDim.x)
        wgt[p] = lv[p] > 0.0f ? expf(ws_ml[2 * (base + p)] - M) : 0.0f;
    __syncthreads();
    float L = 0.0f; /* in partition order, as before */
    for (int p = 0; p < n_parts; p++)
        if (lv[p] > 0.0f)
            L += lv[p] * wgt[p];
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 4
        for (int p = 0; p < n_parts; p++)
            if (lv[p] > 0.0f)
                acc += ws_o[(base + p) * hs + d] * wgt[p];
        sl_st(out, (size_t)r * n_heads * hs + (size_t)h * hs + d, L > 0.0f ? acc / L : 0.0f);
    }
}

static int n_parts_of(int max_ctx)
{
    return (max_ctx + SL_CUDA_ATTN_PART - 1) / SL_CUDA_ATTN_PART;
}

extern "C" size_t sl_cuda_attention_decode_ws(int n_rows, int n_heads, int head_size, int max_ctx)
{
    if (n_rows < 0 || n_heads < 1 || head_size < 1 || max_ctx < 1)
        return 0;
    return (size_t)n_rows * n_heads * (size_t)n_parts_of(max_ctx) * ((size_t)head_size + 2);
}

static bool heads_ok(const struct sl_cuda_kv *kv, int n_heads)
{
    return n_heads >= 1 && n_heads <= 65535 && n_heads % kv->n_kv_heads == 0 &&
           kv->n_kv_heads <= 65535;
}

extern "C" int sl_cuda_attention_decode(void *out, enum sl_dtype ot, const float *qkv,
                                        const int32_t *rows, int n_rows, const int32_t *pos,
                                        const int32_t *seq, const struct sl_cuda_kv *kv,
                                        int n_heads, int max_ctx, float *ws, void *stream)
{
    if (!out || !qkv || !rows || n_rows < 0 || !pos || !seq || !sl_cuda_kv_ok(kv) ||
        !heads_ok(kv, n_heads) || max_ctx < 1 || !ws || n_parts_of(max_ctx) > 65535)
        return sl_cuda_invalid("attention_decode: bad arguments");
    if (n_rows == 0)
        return SL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    int hs = kv->head_size, kv_mul = n_heads / kv->n_kv_heads, n_parts = n_parts_of(max_ctx);
    size_t smem = (size_t)kv_mul * (hs + SL_CUDA_ATTN_PART) * sizeof(float) +
                  SL_CUDA_ATTN_PART * sizeof(long long);
    float *ws_o = ws, *ws_ml = ws + (size_t)n_rows * n_heads * n_parts * hs;
    struct sl_cuda_kv k = *kv;
    dim3 grid((unsigned)n_rows, (unsigned)kv->n_kv_heads, (unsigned)n_parts);
    int rc = SL_CUDA_DISPATCH(kv->type, K, {
        int st = sl_cuda_smem(decode_part_kernel<K>, smem, "attention_decode");
        if (st != SL_OK)
            return st;
        decode_part_kernel<K><<<grid, DEC_THREADS, smem, s>>>(qkv, rows, pos, seq, k, n_heads,
                                                              max_ctx, n_parts, ws_o, ws_ml);
        return sl_cuda_launched("attention_decode");
    });
    if (rc != SL_OK)
        return rc;
    dim3 mgrid((unsigned)n_rows, (unsigned)n_heads);
    return SL_CUDA_DISPATCH(ot, O, {
        size_t msmem = 2 * (size_t)n_parts * sizeof(float);
        int st = sl_cuda_smem(decode_merge_kernel<O>, msmem, "attention_decode merge");
        if (st != SL_OK)
            return st;
        decode_merge_kernel<O>
            <<<mgrid, 128, msmem, s>>>((O *)out, rows, n_heads, hs, n_parts, ws_o, ws_ml);
        return sl_cuda_launched("attention_decode merge");
    });
}

/* ---------------------------------------------------------------------------------------------
 * Prefill: a tile of query rows against key tiles, online softmax
 */

#define PF_WARPS (PF_THREADS / 32)
static_assert(PF_K == 32, "prefill: one lane per key position of a tile");
static_assert(PF_Q % PF_WARPS == 0, "prefill: every warp takes as many query rows");

/* Block (tile, h): rows tiles[2·tile] .. + tiles[2·tile+1] of one sequence, query head h.
 * Shared: Q (PF_Q, hs), K (PF_K, hs + 1: the pad puts each lane's key row in a bank of its own
 * in the score loop), V (PF_K, hs), scores (PF_Q, PF_K), O (PF_Q, hs), then per query row its
 * running max m, sum l and the rescale c of the current key tile; then each key position's
 * offset in the cache (PF_K; -1 where absent or past the tile's last query). */
template <typename K, typename O>
__global__ void prefill_kernel(O *out, const float *qkv, const int32_t *tiles, const int32_t *pos,
                               const int32_t *seq, struct sl_cuda_kv kv, int n_heads)
{
    extern __shared__ float smem[];
    __shared__ int qpos[PF_Q];
    __shared__ long long koff[PF_K];
    int hs = kv.head_size, nkv = kv.n_kv_heads, kv_mul = n_heads / nkv, ks = hs + 1;
    int tile = blockIdx.x, h = blockIdx.y, g = h / kv_mul;
    int r0 = tiles[2 * tile], nq = tiles[2 * tile + 1];
    nq = nq < 0 ? 0 : nq > PF_Q ? PF_Q : nq;
    float *Qs = smem, *Ks = Qs + PF_Q * hs, *Vs = Ks + PF_K * ks, *S = Vs + PF_K * hs;
    float *Os = S + PF_Q * PF_K, *m = Os + PF_Q * hs, *l = m + PF_Q, *c = l + PF_Q;
    size_t stride = (size_t)(n_heads + 2 * nkv) * hs;
    for (int idx = threadIdx.x; idx < PF_Q * hs; idx += blockDim.x) {
        int i = idx / hs, d = idx % hs;
        Qs[idx] = i < nq ? qkv[(size_t)(r0 + i) * stride + (size_t)h * hs + d] : 0.0f;
        Os[idx] = 0.0f;
    }
    for (int i = threadIdx.x; i < PF_Q; i += blockDim.x) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        qpos[i] = i < nq ? pos[r0 + i] : -1;
    }
    __syncthreads();
    int maxp = -1; /* the same in every thread: the loop below is block-uniform */
    for (int i = 0; i < nq; i++)
        maxp = qpos[i] > maxp ? qpos[i] : maxp;
    if (nq == 0)
        return;
    const K *kc = (const K *)kv.k, *vc = (const K *)kv.v;
    const int32_t *table = kv.block_tables + (size_t)seq[r0] * kv.max_blocks;
    float scale = sqrtf((float)hs);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j0 = 0; j0 <= maxp; j0 += PF_K) {
        for (int jj = threadIdx.x; jj < PF_K; jj += blockDim.x) {
            int t = j0 + jj;
            int32_t b = t <= maxp ? kv_block(kv, table, t) : -1;
            koff[jj] = b >= 0 ? (long long)kv_off(kv, b, g, t) : -1;
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < PF_K * hs; idx += blockDim.x) {
            int jj = idx / hs, d = idx % hs;
            long long o = koff[jj];
            Ks[jj * ks + d] = o >= 0 ? sl_ld(kc, (size_t)o + d) : 0.0f;
            Vs[idx] = o >= 0 ? sl_ld(vc, (size_t)o + d) : 0.0f;
        }
        __syncthreads();
        /* Scores: lane jj takes key position j0 + jj, warp w the query rows w, w + PF_WARPS, …;
         * each K value read serves all of them (the Q values are the warp's broadcast). */
        {
            float acc[PF_Q / PF_WARPS];
#pragma unroll
            for (int k = 0; k < PF_Q / PF_WARPS; k++)
                acc[k] = 0.0f;
            const float *kr = Ks + lane * ks;
            for (int d = 0; d < hs; d++) {
                float kx = kr[d];
#pragma unroll
                for (int k = 0; k < PF_Q / PF_WARPS; k++)
                    acc[k] += Qs[(warp + PF_WARPS * k) * hs + d] * kx;
            }
#pragma unroll
            for (int k = 0; k < PF_Q / PF_WARPS; k++) {
                int i = warp + PF_WARPS * k;
                S[i * PF_K + lane] = i < nq && j0 + lane <= qpos[i] ? acc[k] / scale : -INFINITY;
            }
        }
        __syncthreads();
        /* Online softmax: one warp per query row, a lane per key position. */
        for (int i = warp; i < PF_Q; i += PF_WARPS) {
            float sc = S[i * PF_K + lane], mi = m[i];
            float mx = fmaxf(sl_warp_max(sc), mi);
            float e = 0.0f, ci = 1.0f; /* nothing visible yet (or a padding row): no change */
            if (mx != -INFINITY) {
                e = sc == -INFINITY ? 0.0f : expf(sc - mx);
                ci = mi == -INFINITY ? 0.0f : expf(mi - mx);
            }
            float sum = sl_warp_sum(e);
            S[i * PF_K + lane] = e;
            if (lane == 0) {
                c[i] = ci;
                if (mx != -INFINITY) {
                    l[i] = l[i] * ci + sum;
                    m[i] = mx;
                }
            }
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < PF_Q * hs; idx += blockDim.x) {
            int i = idx / hs, d = idx % hs;
            float acc = Os[idx] * c[i];
            for (int jj = 0; jj < PF_K; jj++)
                acc += S[i * PF_K + jj] * Vs[jj * hs + d];
            Os[idx] = acc;
        }
        __syncthreads();
    }
    for (int idx = threadIdx.x; idx < nq * hs; idx += blockDim.x) {
        int i = idx / hs, d = idx % hs;
        sl_st(out, (size_t)(r0 + i) * n_heads * hs + (size_t)h * hs + d,
              l[i] > 0.0f ? Os[idx] / l[i] : 0.0f);
    }
}

extern "C" int sl_cuda_attention_prefill(void *out, enum sl_dtype ot, const float *qkv,
                                         const int32_t *tiles, int n_tiles, const int32_t *pos,
                                         const int32_t *seq, const struct sl_cuda_kv *kv,
                                         int n_heads, void *stream)
{
    if (!out || !qkv || !tiles || n_tiles < 0 || !pos || !seq || !sl_cuda_kv_ok(kv) ||
        !heads_ok(kv, n_heads))
        return sl_cuda_invalid("attention_prefill: bad arguments");
    if (n_tiles == 0)
        return SL_OK;
    cudaStream_t s = (cudaStream_t)stream;
    int hs = kv->head_size;
    size_t smem =
        ((size_t)(2 * PF_Q + 2 * PF_K) * hs + PF_K + PF_Q * PF_K + 3 * PF_Q) * sizeof(float);
    struct sl_cuda_kv k = *kv;
    dim3 grid((unsigned)n_tiles, (unsigned)n_heads);
    return SL_CUDA_DISPATCH(kv->type, K, {
        return SL_CUDA_DISPATCH(ot, O, {
            int st = sl_cuda_smem(prefill_kernel<K, O>, smem, "attention_prefill");
            if (st != SL_OK)
                return st;
            prefill_kernel<K, O>
                <<<grid, PF_THREADS, smem, s>>>((O *)out, qkv, tiles, pos, seq, k, n_heads);
            return sl_cuda_launched("attention_prefill");
        });
    });
}
