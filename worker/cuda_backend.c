/* The CUDA backend: the CPU backend's forward pass on one device, through kernels/cuda.
 *
 * At init the weights are uploaded once, converted for cuBLAS (F32 sources stay F32 — the tiny
 * real models are F32 and their goldens need it —, F16 and BF16 stay, Q8_0 becomes F16), with
 * the q, k and v projections fused into one matrix and the gate and up projections into another,
 * so a layer is four GEMMs. Everything a step needs is allocated at init: activations for
 * max_batch_tokens rows, the paged KV pool, the split-K and sampling workspaces, and pinned host
 * buffers for the step's inputs and sampled ids.
 *
 * A step: the host packs the batch (tokens, positions, block tables, which rows decode and which
 * prefill tiles) into the pinned buffer; one copy takes it to the device; then, on the worker's
 * one stream: embedding gather, per layer add+RMSNorm, QKV GEMM, RoPE + KV write, attention
 * (decode rows split-K, prefill rows tiled), output GEMM, add+RMSNorm, gate/up GEMM, SwiGLU,
 * down GEMM; then the final add+RMSNorm of the rows that sample and the classifier GEMM. Logits
 * come back, or (forward_sample) are sampled on the device and only ids come back. The launches
 * depend only on the batch's shape, so a decode-only step (one row per sequence, every row
 * sampling) whose batch size has been seen before is captured as a CUDA graph, inputs copy
 * included, and later steps of that size replay it.
 *
 * Errors: every CUDA and cuBLAS call is checked. A failure inside a step is logged once with the
 * call and CUDA's reason and the worker is marked broken: every later step returns SL_EBACKEND
 * at once (a device error is usually sticky; the scheduler fails the requests, it does not
 * crash). A failed graph capture is not an error: it is logged once and steps run eagerly. */
#include "worker_impl.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Pinned and device staging for the weight upload. */
#define STAGE_BYTES ((size_t)64 << 20)
/* Device memory kept free beyond what the backend allocates: the CUDA context, cuBLAS's
 * kernels and graph instances. */
#define MEM_MARGIN ((size_t)768 << 20)
/* A batch size is captured as a graph the second time a decode-only step of that size comes. */
#define GRAPH_AFTER 1

struct cuda_layer {
    float *rms_att; /* (dim) */
    float *rms_ffn; /* (dim) */
    void *wqkv;     /* (dim + 2 kv_dim, dim) wt: rows of wq, then wk, then wv */
    void *wo;       /* (dim, dim) wt */
    void *w13;      /* (2 hidden_dim, dim) wt: rows of w1 (gate), then w3 (up) */
    void *w2;       /* (dim, hidden_dim) wt */
};

struct cuda_graph {
    cudaGraphExec_t exec; /* NULL until captured */
    int seen;             /* decode-only steps of this size run so far */
};

/* Offsets, in int32 words, of the step's inputs in h_in and d_in (T = max_batch_tokens,
 * S = max_seqs, MB = max_blocks). Block tables come last, so a step copies only up to its
 * sequences' tables. */
struct in_layout {
    size_t tokens; /* (T) token ids */
    size_t pos;    /* (T) positions */
    size_t seq;    /* (T) sequence of each row */
    size_t logit;  /* (T) rows whose logits are wanted */
    size_t dec;    /* (T) rows attended by the decode kernel */
    size_t tiles;  /* (T, 2) prefill tiles: first row, rows */
    size_t sample; /* (S, 6) struct sl_cuda_sample_row of each logit row */
    size_t tables; /* (S, MB) block tables */
    size_t words;  /* total */
};

/* The shape of one step: what the launches depend on. */
struct step_shape {
    int n, n_seqs, n_dec, n_tiles, n_logits;
    size_t copy_words; /* inputs copied to the device */
};

/* opts.profile: an event before a step's first launch and after each launch, and the totals
 * they add up to (sl_worker_bench_profile). */
#define PROF_EVENTS 1024
struct step_prof {
    cudaEvent_t ev[PROF_EVENTS];
    const char *what[PROF_EVENTS]; /* the launch that ev[i] ends; NULL for a step's start */
    int n;
    struct sl_worker_profile sum;
};

struct sl_cuda_ctx {
    const struct sl_model *m;
    struct sl_model_config cfg;
    struct sl_backend_opts o;
    int head_size, kv_dim, qkv_dim, max_blocks;
    enum sl_dtype wt;  /* projections, embedding, classifier and every GEMM input */
    enum sl_dtype kvt; /* KV cache */
    size_t wt_size;    /* bytes of one wt element */
    cudaStream_t stream;
    struct sl_cuda_blas *blas;
    void **dmem; /* every cudaMalloc'd buffer, freed with the context */
    int n_dmem, cap_dmem;
    /* weights */
    void *emb;                 /* (vocab, dim) wt */
    void *cls;                 /* (vocab, dim) wt; == emb when the model ties them */
    float *rms_final;          /* (dim) */
    struct cuda_layer *layers; /* (n_layers), host array of device pointers */
    /* paged KV pool */
    void *k_cache; /* (n_layers, n_kv_blocks, n_kv_heads, block_size, head_size) kvt */
    void *v_cache; /* (n_layers, n_kv_blocks, n_kv_heads, block_size, head_size) kvt */
    size_t layer_kv_elems;
    size_t kv_bytes;
    /* activations, T = max_batch_tokens rows */
    float *x;       /* (T, dim) residual stream */
    float *y;       /* (T, dim) projection output, added to x by the next add+RMSNorm */
    float *qkv;     /* (T, qkv_dim) q, k, v heads of each row */
    float *h13;     /* (T, 2 hidden_dim) gate and up projections */
    void *xa;       /* (T, max(dim, hidden_dim)) wt: the input of every GEMM */
    float *logits;  /* (T, vocab) */
    float *attn_ws; /* sl_cuda_attention_decode_ws(S, …) floats */
    void *sample_ws;
    size_t sample_ws_bytes;
    int32_t *ids; /* (S) sampled ids, device */
    /* step inputs */
    struct in_layout in;
    int32_t *h_in;             /* (in.words) pinned host */
    int32_t *d_in;             /* (in.words) device */
    int32_t *h_ids;            /* (S) pinned host */
    bool filtered;             /* the step's sampling rows use min-p, top-k or top-p */
    struct cuda_graph *graphs; /* (S + 1) by decode batch size */
    bool graphs_off;
    struct step_prof *prof;  /* opts.profile: events around every launch; NULL otherwise */
    bool capturing;          /* inside capture(): failures are the capture's, not the step's */
    char capture_error[160]; /* why the capture failed */
    bool broken;
};

/* ---------------------------------------------------------------------------------------------
 * Sizes
 */

static size_t dtype_size(enum sl_dtype t)
{
    return t == SL_DTYPE_F32 ? 4 : 2;
}

/* The type every projection is converted to: F32 when all sources are F32, BF16 when any is
 * BF16 (its range is fp32's), else F16 (F16 and Q8_0 sources: Q8_0's d·q fits F16's 11 bits
 * better than BF16's 8; Q4_0 and the K-quants are rounded to it). */
static enum sl_dtype compute_type(const struct sl_model *m)
{
    const struct sl_model_weights *w = &m->w;
    bool all_f32 = true, any_bf16 = false;
    const struct sl_mat *top[2] = {&w->token_embedding, &w->wcls};
    for (int i = 0; i < 2; i++) {
        all_f32 = all_f32 && top[i]->type == SL_DTYPE_F32;
        any_bf16 = any_bf16 || top[i]->type == SL_DTYPE_BF16;
    }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct sl_layer_weights *L = &w->layers[l];
        const struct sl_mat *ms[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3};
        for (int i = 0; i < 7; i++) {
            all_f32 = all_f32 && ms[i]->type == SL_DTYPE_F32;
            any_bf16 = any_bf16 || ms[i]->type == SL_DTYPE_BF16;
        }
    }
    return all_f32 ? SL_DTYPE_F32 : any_bf16 ? SL_DTYPE_BF16 : SL_DTYPE_F16;
}

static bool tied(const struct sl_model *m)
{
    return m->w.wcls.data == m->w.token_embedding.data;
}

static size_t cuda_kv_block_bytes(const struct sl_model *m, int block_size, enum sl_kv_dtype kt)
{
    (void)kt; /* K and V are stored in the compute type (see sl_cuda_backend_ops) */
    const struct sl_model_config *c = &m->cfg;
    size_t kv = (size_t)(c->dim / c->n_heads) * (size_t)c->n_kv_heads;
    return 2 * (size_t)c->n_layers * (size_t)block_size * kv * dtype_size(compute_type(m));
}

static struct in_layout in_layout_of(int T, int S, int MB)
{
    struct in_layout l;
    size_t t = (size_t)T, s = (size_t)S;
    l.tokens = 0;
    l.pos = t;
    l.seq = 2 * t;
    l.logit = 3 * t;
    l.dec = 4 * t;
    l.tiles = 5 * t;
    l.sample = 7 * t;
    l.tables = 7 * t + 6 * s;
    l.words = l.tables + s * (size_t)MB;
    return l;
}

size_t sl_cuda_backend_mem_need(const struct sl_model *m, int max_batch_tokens, int max_seqs)
{
    const struct sl_model_config *c = &m->cfg;
    size_t es = dtype_size(compute_type(m));
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim, V = (size_t)c->vocab_size;
    size_t hs = dim / (size_t)c->n_heads, kv = hs * (size_t)c->n_kv_heads, qkv = dim + 2 * kv;
    size_t T = (size_t)max_batch_tokens, S = (size_t)max_seqs;
    size_t layer = (qkv * dim + dim * dim + 2 * hid * dim + dim * hid) * es + 2 * dim * 4;
    size_t weights = (size_t)c->n_layers * layer + V * dim * es * (tied(m) ? 1 : 2) + dim * 4;
    size_t acts = T * (2 * dim + qkv + 2 * hid + V) * 4 + T * (dim > hid ? dim : hid) * es;
    size_t attn = sl_cuda_attention_decode_ws(max_seqs, c->n_heads, (int)hs, c->seq_len) * 4;
    size_t sample = sl_cuda_sample_ws_bytes(max_seqs, c->vocab_size);
    /* Block tables as if blocks held one position: an upper bound for any block size. */
    size_t in = in_layout_of(max_batch_tokens, max_seqs, c->seq_len).words * 4;
    return weights + acts + attn + sample + in + S * 4 + ((size_t)32 << 20) + 2 * STAGE_BYTES +
           MEM_MARGIN;
}

/* ---------------------------------------------------------------------------------------------
 * Errors and memory
 */

/* Logs a failed CUDA call at init and maps it to a status. */
static int init_fail(const struct sl_cuda_ctx *c, const char *what, cudaError_t e)
{
    sl_log(SL_LOG_ERROR, "cuda:%d: %s: %s", c->o.device, what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? SL_ENOMEM : SL_EBACKEND;
}

/* A failure inside a step: logged once, and the worker is broken from now on. */
static int step_fail(struct sl_cuda_ctx *c, const char *what, const char *why)
{
    if (c->capturing) {
        snprintf(c->capture_error, sizeof c->capture_error, "%s: %s", what, why);
        return SL_EBACKEND;
    }
    if (!c->broken)
        sl_log(SL_LOG_ERROR,
               "cuda:%d: %s failed: %s; this worker stops (every later step fails with \"%s\")",
               c->o.device, what, why, sl_status_str(SL_EBACKEND));
    c->broken = true;
    return SL_EBACKEND;
}

/* Checks a CUDA runtime call inside a step. */
#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return step_fail(c, #call, cudaGetErrorString(e_));                                    \
    } while (0)

/* Checks a kernels/cuda launcher inside a step. */
#define KL(call)                                                                                   \
    do {                                                                                           \
        if ((call) != SL_OK)                                                                       \
            return step_fail(c, #call, sl_cuda_last_error());                                      \
    } while (0)

/* cudaMalloc of `bytes` into the context's list; logs and returns NULL on failure. */
static void *dalloc(struct sl_cuda_ctx *c, size_t bytes, const char *what, int *rc)
{
    if (*rc != SL_OK)
        return NULL;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        sl_log(SL_LOG_ERROR, "cuda:%d: cannot allocate %s (%.1f MiB): %s", c->o.device, what,
               (double)bytes / (1 << 20), cudaGetErrorString(e));
        *rc = e == cudaErrorMemoryAllocation ? SL_ENOMEM : SL_EBACKEND;
        return NULL;
    }
    if (c->n_dmem == c->cap_dmem) {
        c->cap_dmem = c->cap_dmem ? 2 * c->cap_dmem : 64;
        c->dmem = sl_xrealloc(c->dmem, (size_t)c->cap_dmem * sizeof(*c->dmem));
    }
    c->dmem[c->n_dmem++] = p;
    return p;
}

/* a · b · c · d bytes, or SIZE_MAX when that overflows (cudaMalloc then refuses it). */
static size_t bytes4(size_t a, size_t b, size_t cc, size_t d)
{
    size_t r = a;
    size_t f[3] = {b, cc, d};
    for (int i = 0; i < 3; i++) {
        if (f[i] && r > SIZE_MAX / f[i])
            return SIZE_MAX;
        r *= f[i];
    }
    return r;
}

static void cuda_free(void *vctx)
{
    struct sl_cuda_ctx *c = vctx;
    if (!c)
        return;
    /* Best effort: the device may be gone; every call here may fail and nothing depends on it. */
    cudaSetDevice(c->o.device);
    if (c->stream)
        cudaStreamSynchronize(c->stream);
    if (c->graphs)
        for (int i = 0; i <= c->o.max_seqs; i++)
            if (c->graphs[i].exec)
                cudaGraphExecDestroy(c->graphs[i].exec);
    free(c->graphs);
    if (c->prof) {
        for (int i = 0; i < PROF_EVENTS; i++)
            if (c->prof->ev[i])
                cudaEventDestroy(c->prof->ev[i]);
        free(c->prof);
    }
    sl_cuda_blas_free(c->blas);
    for (int i = 0; i < c->n_dmem; i++)
        cudaFree(c->dmem[i]);
    free(c->dmem);
    if (c->h_in)
        cudaFreeHost(c->h_in);
    if (c->h_ids)
        cudaFreeHost(c->h_ids);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c->layers);
    cudaGetLastError(); /* leaves no error behind for the next context on this thread */
    free(c);
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 */

struct stage {
    unsigned char *h; /* (STAGE_BYTES) pinned */
    void *d;          /* (STAGE_BYTES) device */
};

/* Converts w into rows [row0, row0 + w->rows) of dst ((…, w->cols) in c->wt), a chunk of source
 * rows at a time: host copy into pinned memory, one transfer, one conversion kernel. */
static int upload_mat(struct sl_cuda_ctx *c, struct stage *st, void *dst, int row0,
                      const struct sl_mat *w)
{
    size_t rb = sl_dtype_row_bytes(w->type, w->cols);
    if (rb == 0 || rb > STAGE_BYTES) {
        sl_log(SL_LOG_ERROR, "cuda:%d: a weight row of %d values is too long to upload",
               c->o.device, w->cols);
        return SL_EINVAL;
    }
    size_t per = STAGE_BYTES / rb;
    const unsigned char *src = w->data;
    for (size_t r0 = 0; r0 < (size_t)w->rows; r0 += per) {
        size_t nr = (size_t)w->rows - r0 < per ? (size_t)w->rows - r0 : per;
        memcpy(st->h, src + r0 * rb, nr * rb);
        cudaError_t e = cudaMemcpyAsync(st->d, st->h, nr * rb, cudaMemcpyHostToDevice, c->stream);
        if (e != cudaSuccess)
            return init_fail(c, "weight upload", e);
        unsigned char *out =
            (unsigned char *)dst + ((size_t)row0 + r0) * (size_t)w->cols * c->wt_size;
        if (sl_cuda_convert(out, c->wt, st->d, w->type, nr, w->cols, c->stream) != SL_OK) {
            sl_log(SL_LOG_ERROR, "cuda:%d: weight conversion: %s", c->o.device,
                   sl_cuda_last_error());
            return SL_EBACKEND;
        }
        /* The pinned buffer is refilled next: wait for this chunk. */
        if ((e = cudaStreamSynchronize(c->stream)) != cudaSuccess)
            return init_fail(c, "weight upload", e);
    }
    return SL_OK;
}

static float *upload_norm(struct sl_cuda_ctx *c, const float *src, int n, int *rc)
{
    float *d = dalloc(c, (size_t)n * sizeof(float), "norm weights", rc);
    if (!d)
        return NULL;
    cudaError_t e = cudaMemcpy(d, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        *rc = init_fail(c, "norm upload", e);
        return NULL;
    }
    return d;
}

static int upload_weights(struct sl_cuda_ctx *c)
{
    const struct sl_model_config *cfg = &c->cfg;
    const struct sl_model_weights *w = &c->m->w;
    size_t dim = (size_t)cfg->dim, hid = (size_t)cfg->hidden_dim, es = c->wt_size;
    int rc = SL_OK;
    struct stage st = {0};
    cudaError_t e = cudaMallocHost((void **)&st.h, STAGE_BYTES);
    if (e != cudaSuccess) {
        st.h = NULL;
        return init_fail(c, "pinned staging buffer", e);
    }
    if ((e = cudaMalloc(&st.d, STAGE_BYTES)) != cudaSuccess) {
        st.d = NULL;
        rc = init_fail(c, "device staging buffer", e);
        goto out;
    }
    c->emb = dalloc(c, bytes4((size_t)cfg->vocab_size, dim, es, 1), "token embedding", &rc);
    if (rc == SL_OK)
        rc = upload_mat(c, &st, c->emb, 0, &w->token_embedding);
    if (rc == SL_OK && tied(c->m)) {
        c->cls = c->emb;
    } else {
        c->cls = dalloc(c, bytes4((size_t)cfg->vocab_size, dim, es, 1), "classifier", &rc);
        if (rc == SL_OK)
            rc = upload_mat(c, &st, c->cls, 0, &w->wcls);
    }
    c->rms_final = upload_norm(c, w->rms_final, cfg->dim, &rc);
    for (int l = 0; l < cfg->n_layers && rc == SL_OK; l++) {
        const struct sl_layer_weights *L = &w->layers[l];
        struct cuda_layer *D = &c->layers[l];
        D->rms_att = upload_norm(c, L->rms_att, cfg->dim, &rc);
        D->rms_ffn = upload_norm(c, L->rms_ffn, cfg->dim, &rc);
        D->wqkv = dalloc(c, bytes4((size_t)c->qkv_dim, dim, es, 1), "wqkv", &rc);
        D->wo = dalloc(c, bytes4(dim, dim, es, 1), "wo", &rc);
        D->w13 = dalloc(c, bytes4(2, hid, dim, es), "w1/w3", &rc);
        D->w2 = dalloc(c, bytes4(dim, hid, es, 1), "w2", &rc);
        if (rc == SL_OK)
            rc = upload_mat(c, &st, D->wqkv, 0, &L->wq);
        if (rc == SL_OK)
            rc = upload_mat(c, &st, D->wqkv, cfg->dim, &L->wk);
        if (rc == SL_OK)
            rc = upload_mat(c, &st, D->wqkv, cfg->dim + c->kv_dim, &L->wv);
        if (rc == SL_OK)
            rc = upload_mat(c, &st, D->wo, 0, &L->wo);
        if (rc == SL_OK)
            rc = upload_mat(c, &st, D->w13, 0, &L->w1);
        if (rc == SL_OK)
            rc = upload_mat(c, &st, D->w13, cfg->hidden_dim, &L->w3);
        if (rc == SL_OK)
            rc = upload_mat(c, &st, D->w2, 0, &L->w2);
    }
out:
    if (st.d)
        cudaFree(st.d);
    cudaFreeHost(st.h);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Init
 */

static int cuda_init(const struct sl_model *m, const struct sl_backend_opts *o, void **out)
{
    if (o->n_kv_blocks < 1 || o->block_size < 1 || o->max_batch_tokens < 1 || o->max_seqs < 1 ||
        o->device < 0)
        return SL_EINVAL;
    const struct sl_model_config *cfg = sl_model_config(m);
    int head_size = cfg->dim / cfg->n_heads;
    if (cfg->n_heads % cfg->n_kv_heads != 0 || head_size % 2 != 0 || head_size > SL_CUDA_MAX_HEAD ||
        head_size * cfg->n_heads != cfg->dim) {
        sl_log(SL_LOG_ERROR,
               "cuda:%d: model shape not supported: %d heads of %d over %d KV heads (head size "
               "must be even and at most %d)",
               o->device, cfg->n_heads, head_size, cfg->n_kv_heads, SL_CUDA_MAX_HEAD);
        return SL_EINVAL;
    }
    if (!sl_model_weights_ok(m))
        return SL_EINVAL;
    struct sl_cuda_ctx *c = sl_xcalloc(1, sizeof(*c));
    c->m = m;
    c->cfg = *cfg;
    c->o = *o;
    c->head_size = head_size;
    c->kv_dim = head_size * cfg->n_kv_heads;
    c->qkv_dim = cfg->dim + 2 * c->kv_dim;
    c->max_blocks = (cfg->seq_len + o->block_size - 1) / o->block_size;
    c->wt = compute_type(m);
    c->kvt = c->wt;
    c->wt_size = dtype_size(c->wt);
    c->layers = sl_xcalloc((size_t)cfg->n_layers, sizeof(*c->layers));
    c->graphs = sl_xcalloc((size_t)o->max_seqs + 1, sizeof(*c->graphs));
    c->graphs_off = o->eager;
    int rc = SL_OK;
    cudaError_t e = cudaSetDevice(o->device);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        c->stream = NULL;
        rc = init_fail(c, "device and stream", e);
        goto fail;
    }
    if (sl_cuda_blas_new(c->stream, &c->blas) != SL_OK) {
        sl_log(SL_LOG_ERROR, "cuda:%d: %s", o->device, sl_cuda_last_error());
        rc = SL_EBACKEND;
        goto fail;
    }
    if ((rc = upload_weights(c)) != SL_OK)
        goto fail;

    size_t T = (size_t)o->max_batch_tokens, S = (size_t)o->max_seqs;
    size_t dim = (size_t)cfg->dim, hid = (size_t)cfg->hidden_dim, V = (size_t)cfg->vocab_size;
    c->layer_kv_elems = bytes4((size_t)o->n_kv_blocks, (size_t)o->block_size, (size_t)c->kv_dim, 1);
    size_t cache = bytes4(c->layer_kv_elems, (size_t)cfg->n_layers, dtype_size(c->kvt), 1);
    c->k_cache = dalloc(c, cache, "KV cache (keys)", &rc);
    c->v_cache = dalloc(c, cache, "KV cache (values)", &rc);
    c->kv_bytes = cache == SIZE_MAX ? 0 : 2 * cache;
    c->x = dalloc(c, bytes4(T, dim, 4, 1), "activations", &rc);
    c->y = dalloc(c, bytes4(T, dim, 4, 1), "activations", &rc);
    c->qkv = dalloc(c, bytes4(T, (size_t)c->qkv_dim, 4, 1), "activations", &rc);
    c->h13 = dalloc(c, bytes4(T, 2 * hid, 4, 1), "activations", &rc);
    c->xa = dalloc(c, bytes4(T, dim > hid ? dim : hid, c->wt_size, 1), "activations", &rc);
    c->logits = dalloc(c, bytes4(T, V, 4, 1), "logits", &rc);
    size_t attn = sl_cuda_attention_decode_ws(o->max_seqs, cfg->n_heads, head_size, cfg->seq_len);
    c->attn_ws = dalloc(c, bytes4(attn, 4, 1, 1), "attention workspace", &rc);
    c->sample_ws_bytes = sl_cuda_sample_ws_bytes(o->max_seqs, cfg->vocab_size);
    if (rc == SL_OK && c->sample_ws_bytes == 0) {
        sl_log(SL_LOG_ERROR, "cuda:%d: no sampling workspace for %d rows of %d logits", o->device,
               o->max_seqs, cfg->vocab_size);
        rc = SL_EINVAL;
    }
    c->sample_ws = dalloc(c, c->sample_ws_bytes, "sampling workspace", &rc);
    c->ids = dalloc(c, S * sizeof(int32_t), "sampled ids", &rc);
    c->in = in_layout_of(o->max_batch_tokens, o->max_seqs, c->max_blocks);
    c->d_in = dalloc(c, c->in.words * sizeof(int32_t), "step inputs", &rc);
    if (rc != SL_OK)
        goto fail;
    if ((e = cudaMallocHost((void **)&c->h_in, c->in.words * sizeof(int32_t))) != cudaSuccess ||
        (e = cudaMallocHost((void **)&c->h_ids, S * sizeof(int32_t))) != cudaSuccess) {
        rc = init_fail(c, "pinned step buffers", e);
        goto fail;
    }
    memset(c->h_in, 0, c->in.words * sizeof(int32_t));
    /* Block tables are copied only up to each sequence's context: the rest must be defined. */
    if ((e = cudaMemset(c->d_in, 0, c->in.words * sizeof(int32_t))) != cudaSuccess ||
        (e = cudaDeviceSynchronize()) != cudaSuccess) {
        rc = init_fail(c, "step inputs", e);
        goto fail;
    }
    if (o->profile) {
        c->prof = sl_xcalloc(1, sizeof(*c->prof));
        c->graphs_off = true; /* events between launches: every step runs eagerly */
        for (int i = 0; i < PROF_EVENTS; i++)
            if ((e = cudaEventCreate(&c->prof->ev[i])) != cudaSuccess) {
                c->prof->ev[i] = NULL;
                rc = init_fail(c, "profile events", e);
                goto fail;
            }
    }
    sl_log(SL_LOG_INFO, "cuda:%d: weights %s, KV cache %s %.1f MiB (%d blocks of %d), graphs %s%s",
           o->device, sl_dtype_name(c->wt), sl_dtype_name(c->kvt), (double)c->kv_bytes / (1 << 20),
           o->n_kv_blocks, o->block_size, c->graphs_off ? "off" : "on",
           c->prof ? ", every launch timed (profile)" : "");
    *out = c;
    return SL_OK;
fail:
    cuda_free(c);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * A step
 */

/* The layer's cache as the kernels see it. */
static struct sl_cuda_kv layer_kv(const struct sl_cuda_ctx *c, int l)
{
    size_t off = (size_t)l * c->layer_kv_elems * dtype_size(c->kvt);
    return (struct sl_cuda_kv){
        .k = (unsigned char *)c->k_cache + off,
        .v = (unsigned char *)c->v_cache + off,
        .type = c->kvt,
        .n_blocks = c->o.n_kv_blocks,
        .block_size = c->o.block_size,
        .n_kv_heads = c->cfg.n_kv_heads,
        .head_size = c->head_size,
        .block_tables = c->d_in + c->in.tables,
        .max_blocks = c->max_blocks,
    };
}

/* Packs the batch into h_in and works out its shape. Rows are grouped into runs of one
 * sequence: a run of one row goes to the decode kernel, longer runs are cut into prefill tiles.
 * Either kernel is exact for any row; the split is for speed. */
static void pack(struct sl_cuda_ctx *c, const struct sl_batch *b, const struct sl_sample_row *rows,
                 struct step_shape *sh)
{
    int32_t *in = c->h_in;
    int n = b->n_tokens, bs = c->o.block_size;
    memcpy(in + c->in.tokens, b->tokens, (size_t)n * sizeof(int32_t));
    memcpy(in + c->in.pos, b->pos, (size_t)n * sizeof(int32_t));
    memcpy(in + c->in.seq, b->seq, (size_t)n * sizeof(int32_t));
    if (b->n_logits > 0)
        memcpy(in + c->in.logit, b->logit_rows, (size_t)b->n_logits * sizeof(int32_t));
    for (int s = 0; s < b->n_seqs; s++) {
        int nb = (b->ctx_len[s] + bs - 1) / bs;
        if (nb > 0)
            memcpy(in + c->in.tables + (size_t)s * c->max_blocks, b->block_tables[s],
                   (size_t)nb * sizeof(int32_t));
    }
    int n_dec = 0, n_tiles = 0;
    for (int r = 0; r < n;) {
        int r1 = r + 1;
        while (r1 < n && b->seq[r1] == b->seq[r])
            r1++;
        if (r1 - r == 1) {
            in[c->in.dec + n_dec++] = r;
        } else {
            for (int t = r; t < r1; t += SL_CUDA_PREFILL_ROWS) {
                in[c->in.tiles + 2 * (size_t)n_tiles] = t;
                in[c->in.tiles + 2 * (size_t)n_tiles + 1] =
                    r1 - t < SL_CUDA_PREFILL_ROWS ? r1 - t : SL_CUDA_PREFILL_ROWS;
                n_tiles++;
            }
        }
        r = r1;
    }
    c->filtered = false;
    for (int i = 0; rows && i < b->n_logits; i++) {
        const struct sl_sampling *p = &rows[i].p;
        struct sl_cuda_sample_row sr = {p->temperature, p->top_p, p->min_p,
                                        rows[i].coin,   p->top_k, 0};
        memcpy(in + c->in.sample + 6 * (size_t)i, &sr, sizeof sr);
        bool greedy = !(p->temperature > 0.0f) || !(p->top_p > 0.0f) || p->top_k == 1;
        c->filtered =
            c->filtered || (!greedy && (p->top_p < 1.0f || p->top_k > 0 || p->min_p > 0.0f));
    }
    *sh =
        (struct step_shape){n,       b->n_seqs,   n_dec,
                            n_tiles, b->n_logits, c->in.tables + (size_t)b->n_seqs * c->max_blocks};
}

/* opts.profile: records the event that ends launch `what` on the stream; NULL starts a step. */
static void mark(struct sl_cuda_ctx *c, const char *what)
{
    struct step_prof *p = c->prof;
    if (!p)
        return;
    if (!what)
        p->n = 0;
    if (p->n < PROF_EVENTS && cudaEventRecord(p->ev[p->n], c->stream) == cudaSuccess)
        p->what[p->n++] = what;
}

/* opts.profile, after a step's synchronize: adds the time between its events to the kind of
 * launch each one ends. */
static void collect(struct sl_cuda_ctx *c)
{
    struct step_prof *p = c->prof;
    if (!p || p->n < 2)
        return;
    struct sl_worker_profile *sum = &p->sum;
    for (int i = 1; i < p->n; i++) {
        float ms = 0;
        if (!p->what[i] || cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]) != cudaSuccess)
            continue;
        int k = 0;
        while (k < sum->n_kinds && strcmp(sum->k[k].kind, p->what[i]) != 0)
            k++;
        if (k == SL_WORKER_PROFILE_KINDS)
            continue;
        if (k == sum->n_kinds) {
            sum->n_kinds++;
            sum->k[k].kind = p->what[i];
            sum->k[k].ms = 0;
            sum->k[k].calls = 0;
        }
        sum->k[k].ms += ms;
        sum->k[k].calls++;
    }
    float all = 0;
    if (cudaEventElapsedTime(&all, p->ev[0], p->ev[p->n - 1]) == cudaSuccess)
        sum->step_ms += all;
    sum->steps++;
    p->n = 0;
}

int sl_worker_bench_profile(struct sl_worker *w, struct sl_worker_profile *out)
{
    struct sl_cuda_ctx *c = sl_worker_backend_ctx(w, &sl_cuda_backend_ops);
    if (!c || !out || !c->prof)
        return SL_EINVAL;
    *out = c->prof->sum;
    memset(&c->prof->sum, 0, sizeof c->prof->sum);
    return SL_OK;
}

/* Enqueues the whole forward of a step of this shape: the inputs' copy, then every kernel. */
static int enqueue(struct sl_cuda_ctx *c, const struct step_shape *sh)
{
    const struct sl_model_config *cfg = &c->cfg;
    cudaStream_t s = c->stream;
    int n = sh->n, dim = cfg->dim, hid = cfg->hidden_dim;
    const int32_t *d_tokens = c->d_in + c->in.tokens, *d_pos = c->d_in + c->in.pos;
    const int32_t *d_seq = c->d_in + c->in.seq, *d_logit = c->d_in + c->in.logit;
    const int32_t *d_dec = c->d_in + c->in.dec, *d_tiles = c->d_in + c->in.tiles;
    mark(c, NULL);
    CU(cudaMemcpyAsync(c->d_in, c->h_in, sh->copy_words * sizeof(int32_t), cudaMemcpyHostToDevice,
                       s));
    mark(c, "inputs_copy");
    KL(sl_cuda_embed(c->x, c->emb, c->wt, cfg->vocab_size, dim, d_tokens, n, s));
    mark(c, "embed");
    for (int l = 0; l < cfg->n_layers; l++) {
        const struct cuda_layer *L = &c->layers[l];
        struct sl_cuda_kv kv = layer_kv(c, l);
        KL(sl_cuda_add_rmsnorm(c->xa, c->wt, c->x, l > 0 ? c->y : NULL, L->rms_att, NULL, n, dim,
                               cfg->rms_eps, s));
        mark(c, "add_rmsnorm");
        KL(sl_cuda_gemm(c->blas, c->qkv, c->xa, L->wqkv, c->wt, n, c->qkv_dim, dim));
        mark(c, "gemm_qkv");
        KL(sl_cuda_rope_kv(c->qkv, n, cfg->n_heads, cfg->rope_theta, d_pos, d_seq, &kv, s));
        mark(c, "rope_kv");
        if (sh->n_dec > 0) {
            KL(sl_cuda_attention_decode(c->xa, c->wt, c->qkv, d_dec, sh->n_dec, d_pos, d_seq, &kv,
                                        cfg->n_heads, cfg->seq_len, c->attn_ws, s));
            mark(c, "attention_decode");
        }
        if (sh->n_tiles > 0) {
            KL(sl_cuda_attention_prefill(c->xa, c->wt, c->qkv, d_tiles, sh->n_tiles, d_pos, d_seq,
                                         &kv, cfg->n_heads, s));
            mark(c, "attention_prefill");
        }
        KL(sl_cuda_gemm(c->blas, c->y, c->xa, L->wo, c->wt, n, dim, dim));
        mark(c, "gemm_o");
        KL(sl_cuda_add_rmsnorm(c->xa, c->wt, c->x, c->y, L->rms_ffn, NULL, n, dim, cfg->rms_eps,
                               s));
        mark(c, "add_rmsnorm");
        KL(sl_cuda_gemm(c->blas, c->h13, c->xa, L->w13, c->wt, n, 2 * hid, dim));
        mark(c, "gemm_gate_up");
        KL(sl_cuda_swiglu(c->xa, c->wt, c->h13, n, hid, s));
        mark(c, "swiglu");
        KL(sl_cuda_gemm(c->blas, c->y, c->xa, L->w2, c->wt, n, dim, hid));
        mark(c, "gemm_down");
    }
    /* Only rows that sample pay for the last residual add, the final norm and the classifier. */
    if (sh->n_logits > 0) {
        KL(sl_cuda_add_rmsnorm(c->xa, c->wt, c->x, c->y, c->rms_final, d_logit, sh->n_logits, dim,
                               cfg->rms_eps, s));
        mark(c, "add_rmsnorm");
        KL(sl_cuda_gemm(c->blas, c->logits, c->xa, c->cls, c->wt, sh->n_logits, cfg->vocab_size,
                        dim));
        mark(c, "gemm_classifier");
    }
    return SL_OK;
}

/* Captures enqueue() of this shape into graphs[n]. A failure to capture turns graphs off (logged
 * once) and is not an error: the caller then runs the step eagerly. */
static void capture(struct sl_cuda_ctx *c, const struct step_shape *sh)
{
    struct cuda_graph *g = &c->graphs[sh->n];
    cudaGraph_t graph = NULL;
    const char *why = NULL;
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        why = cudaGetErrorString(e);
    } else {
        c->capturing = true;
        int rc = enqueue(c, sh);
        c->capturing = false;
        e = cudaStreamEndCapture(c->stream, &graph);
        if (rc != SL_OK) {
            why = c->capture_error;
        } else if (e != cudaSuccess) {
            why = cudaGetErrorString(e);
        } else if ((e = cudaGraphInstantiate(&g->exec, graph, 0)) != cudaSuccess) {
            g->exec = NULL;
            why = cudaGetErrorString(e);
        }
    }
    if (graph)
        cudaGraphDestroy(graph);
    if (why) {
        cudaGetLastError(); /* a capture error is not sticky; clear it */
        c->graphs_off = true;
        sl_log(SL_LOG_WARN,
               "cuda:%d: cannot capture a decode step of %d rows as a graph (%s); "
               "steps run without graphs from now on",
               c->o.device, sh->n, why);
    }
}

/* Runs the forward of a packed step, through a graph when the shape allows. */
static int run(struct sl_cuda_ctx *c, const struct step_shape *sh)
{
    bool decode_only = sh->n == sh->n_seqs && sh->n_logits == sh->n && sh->n_dec == sh->n;
    if (decode_only && !c->graphs_off) {
        struct cuda_graph *g = &c->graphs[sh->n];
        if (!g->exec && g->seen++ >= GRAPH_AFTER)
            capture(c, sh);
        if (g->exec) {
            CU(cudaGraphLaunch(g->exec, c->stream));
            return SL_OK;
        }
    }
    return enqueue(c, sh);
}

static int begin(struct sl_cuda_ctx *c, const struct sl_batch *b)
{
    int rc = sl_worker_batch_check(b, &c->cfg, &c->o);
    if (rc != SL_OK)
        return rc;
    if (c->broken)
        return SL_EBACKEND;
    /* The device is a per-thread setting, and the scheduler's thread is not the one that ran
     * init. */
    CU(cudaSetDevice(c->o.device));
    return SL_OK;
}

static int cuda_forward(void *vctx, const struct sl_batch *b, float *logits)
{
    struct sl_cuda_ctx *c = vctx;
    int rc = begin(c, b);
    if (rc != SL_OK)
        return rc;
    if (b->n_logits > 0 && !logits)
        return SL_EINVAL;
    struct step_shape sh;
    pack(c, b, NULL, &sh);
    if ((rc = run(c, &sh)) != SL_OK)
        return rc;
    if (b->n_logits > 0) {
        CU(cudaMemcpyAsync(logits, c->logits,
                           (size_t)b->n_logits * (size_t)c->cfg.vocab_size * sizeof(float),
                           cudaMemcpyDeviceToHost, c->stream));
        mark(c, "logits_copy");
    }
    /* Also before the next step rewrites the pinned inputs this one copies from. */
    CU(cudaStreamSynchronize(c->stream));
    collect(c);
    return SL_OK;
}

static int cuda_forward_sample(void *vctx, const struct sl_batch *b,
                               const struct sl_sample_row *rows, int32_t *ids)
{
    struct sl_cuda_ctx *c = vctx;
    int rc = begin(c, b);
    if (rc != SL_OK)
        return rc;
    if (b->n_logits > c->o.max_seqs || (b->n_logits > 0 && (!rows || !ids)))
        return SL_EINVAL;
    struct step_shape sh;
    pack(c, b, rows, &sh);
    if ((rc = run(c, &sh)) != SL_OK)
        return rc;
    if (b->n_logits > 0) {
        const struct sl_cuda_sample_row *d_rows =
            (const struct sl_cuda_sample_row *)(c->d_in + c->in.sample);
        KL(sl_cuda_sample(c->ids, c->logits, b->n_logits, c->cfg.vocab_size, d_rows, c->filtered,
                          c->sample_ws, c->sample_ws_bytes, c->stream));
        mark(c, "sample");
        CU(cudaMemcpyAsync(c->h_ids, c->ids, (size_t)b->n_logits * sizeof(int32_t),
                           cudaMemcpyDeviceToHost, c->stream));
        mark(c, "ids_copy");
    }
    CU(cudaStreamSynchronize(c->stream));
    collect(c);
    if (b->n_logits > 0)
        memcpy(ids, c->h_ids, (size_t)b->n_logits * sizeof(int32_t));
    return SL_OK;
}

static size_t cuda_kv_bytes(void *vctx)
{
    return ((struct sl_cuda_ctx *)vctx)->kv_bytes;
}

const struct sl_backend_ops sl_cuda_backend_ops = {
    .name = "cuda",
    .init = cuda_init,
    .forward = cuda_forward,
    .forward_sample = cuda_forward_sample,
    .free = cuda_free,
    .kv_bytes = cuda_kv_bytes,
    .kv_block_bytes = cuda_kv_block_bytes,
};

/* ---------------------------------------------------------------------------------------------
 * Devices
 */

int sl_cuda_device_probe(int index, struct sl_worker_device *out, char *why, size_t whylen)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, whylen, "no CUDA device: cudaGetDeviceCount: %s%s", cudaGetErrorString(e),
                 e == cudaErrorInsufficientDriver
                     ? " (no NVIDIA driver, or one older than this build's CUDA runtime)"
                     : "");
        cudaGetLastError();
        return SL_ENOENT;
    }
    if (count < 1) {
        snprintf(why, whylen, "no CUDA device: cudaGetDeviceCount found none");
        return SL_ENOENT;
    }
    if (index < 0 || index >= count) {
        snprintf(why, whylen, "no CUDA device %d: %d device%s present", index, count,
                 count == 1 ? "" : "s");
        return SL_ENOENT;
    }
    struct cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    if ((e = cudaGetDeviceProperties(&prop, index)) != cudaSuccess ||
        (e = cudaSetDevice(index)) != cudaSuccess ||
        (e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
        snprintf(why, whylen, "CUDA device %d unusable: %s", index, cudaGetErrorString(e));
        cudaGetLastError();
        return SL_ENOENT;
    }
    /* The build carries sm_90 code and compute_90 PTX: nothing older can run it. */
    if (prop.major < 9) {
        snprintf(why, whylen,
                 "CUDA device %d (%.64s) has compute capability %d.%d; this build targets 9.0 "
                 "(sm_90) and newer",
                 index, prop.name, prop.major, prop.minor);
        return SL_ENOENT;
    }
    if (out) {
        out->ops = &sl_cuda_backend_ops;
        out->index = index;
        snprintf(out->name, sizeof out->name, "cuda:%d (%.64s, compute %d.%d, %.1f GiB)", index,
                 prop.name, prop.major, prop.minor, (double)total_b / (1 << 30));
        out->mem_free = free_b;
    }
    return SL_OK;
}
