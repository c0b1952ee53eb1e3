/* The CPU backend: a Llama forward over a varlen batch with a paged KV pool (fp32, or fp16 as
 * the server configures by default: half the bytes for attention to read, values rounded once
 * when written).
 *
 * Every projection is one matrix-matrix product over all rows of the step (kernels/cpu), split
 * over the pool by weight rows; attention is split over the pool by (row group, KV head), a
 * group of one row (a decode token) taking all its heads in one task. Per step
 * the pool runs five jobs per layer (QKV, attention, output, gate/up + SwiGLU, down) plus the
 * classifier; the cheap row-wise glue (embedding, RoPE tables, residual adds with the norms after
 * them, RoPE of K, KV writes) is split over the pool by rows for a prompt chunk and stays on the
 * calling thread for a decode batch. The last layer runs past its QKV only for the rows that
 * sample. */
#include "worker_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void cpu_free(void *vctx)
{
    struct sl_cpu_ctx *c = vctx;
    if (!c)
        return;
    sl_cpu_pool_free(c->pool);
    for (int i = 0; i < c->n_bufs; i++)
        free(c->bufs[i]);
    if (c->kv_map)
        munmap(c->kv_map, c->kv_map_bytes);
    free(c->attn_rows);
    free(c->attn_tasks);
    free(c);
}

/* n zeroed floats at a cache-line boundary (rows that straddle cache lines slow every vector
 * load down), owned by c. */
static float *alloc_f32(struct sl_cpu_ctx *c, uint64_t n, bool *ok)
{
    /* Plain calloc, not sl_xcalloc: the pool size comes from configuration, and running out is a
     * start-up error to report, not an abort. calloc rather than an aligned allocator, which
     * would have to zero the pool itself: fresh pages come zeroed, and untouched ones cost no
     * memory. */
    if (n == 0 || n > (SIZE_MAX - 64) / sizeof(float) || c->n_bufs == SL_CPU_MAX_BUFS) {
        *ok = false;
        return NULL;
    }
    char *p = calloc(1, (size_t)n * sizeof(float) + 64);
    if (!p) {
        *ok = false;
        return NULL;
    }
    c->bufs[c->n_bufs++] = p;
    return (float *)(p + (64 - (uintptr_t)p % 64));
}

/* The KV pool: its two caches of `bytes` each, zeroed, in one private anonymous mapping aligned
 * to 2 MiB and offered to transparent huge pages. Attention walks every block of every running
 * sequence in each step (56.6 MB for a batch-32 step of stories15M at context 128), a new 4 KiB
 * page every few rows; with 2 MiB pages the walk costs far fewer TLB misses (attention's share
 * of that step 5-15 % shorter). Untouched pages cost no memory either way, and a kernel whose
 * huge pages are off (or set to `never`) just maps small ones. False when the mapping fails. */
static bool map_kv(struct sl_cpu_ctx *c, size_t bytes)
{
    size_t align = (size_t)2 << 20;
    if (bytes > (SIZE_MAX - 3 * align) / 2)
        return false;
    size_t span = (bytes + align - 1) & ~(align - 1), len = 2 * span + align;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return false;
    c->kv_map = m;
    c->kv_map_bytes = len;
    char *a = (char *)(((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1));
#ifdef MADV_HUGEPAGE
    (void)madvise(a, 2 * span, MADV_HUGEPAGE); /* a hint only */
#endif
    c->key_cache = a;
    c->value_cache = a + span;
    return true;
}

/* Rows of attention scores each thread's scratch holds: a group's queries of one KV head, or
 * every head of a decode row. */
static int att_rows(const struct sl_model_config *cfg)
{
    return cfg->n_heads > SL_CPU_ATTN_MAX_Q ? cfg->n_heads : SL_CPU_ATTN_MAX_Q;
}

static int cpu_init(const struct sl_model *m, const struct sl_backend_opts *o, void **out)
{
    if (o->n_kv_blocks < 1 || o->block_size < 1 || o->max_batch_tokens < 1 || o->max_seqs < 1 ||
        o->threads < 0 || (o->kv_dtype != SL_KV_F32 && o->kv_dtype != SL_KV_F16))
        return SL_EINVAL;
    const struct sl_model_config *cfg = sl_model_config(m);
    int head_size = cfg->dim / cfg->n_heads;
    if (!sl_model_weights_ok(m))
        return SL_EINVAL;
    struct sl_cpu_ctx *c = sl_xcalloc(1, sizeof(*c));
    c->m = m;
    c->cfg = *cfg;
    c->o = *o;
    c->head_size = head_size;
    c->kv_dim = c->head_size * cfg->n_kv_heads;
    c->pool = sl_cpu_pool_new(o->threads, !o->no_pin);
    if (!c->pool) {
        cpu_free(c);
        return SL_EBACKEND;
    }
    c->n_threads = sl_cpu_pool_threads(c->pool);
    sl_cpu_pool_set_int8(c->pool, !o->float_activations);
    int pinned = sl_cpu_pool_pinned(c->pool);
    if (c->n_threads > 1)
        sl_log(SL_LOG_INFO, "cpu backend: %d kernel threads, %s", c->n_threads,
               o->no_pin                    ? "unpinned (pin_threads false)"
               : pinned == c->n_threads - 1 ? "each on a CPU of its own (pin_threads)"
               : pinned == 0                ? "unpinned (more threads than CPUs, or refused)"
                             : "some pool threads pinned (the system refused the rest)");
    uint64_t T = (uint64_t)o->max_batch_tokens, dim = (uint64_t)cfg->dim;
    uint64_t hid = (uint64_t)cfg->hidden_dim, kv = (uint64_t)c->kv_dim;
    bool ok = true;
    c->x = alloc_f32(c, T * dim, &ok);
    c->xb = alloc_f32(c, T * dim, &ok);
    c->xb2 = alloc_f32(c, T * dim, &ok);
    c->q = alloc_f32(c, T * dim, &ok);
    c->k = alloc_f32(c, T * kv, &ok);
    c->v = alloc_f32(c, T * kv, &ok);
    c->hb = alloc_f32(c, T * hid, &ok);
    c->hb2 = alloc_f32(c, T * hid, &ok);
    c->att = alloc_f32(c, (uint64_t)c->n_threads * (uint64_t)att_rows(cfg) * (uint64_t)cfg->seq_len,
                       &ok);
    c->attn_rows = calloc((size_t)T + 1, sizeof(int));
    c->attn_tasks = calloc((size_t)T * (size_t)cfg->n_kv_heads, sizeof(int));
    ok = ok && c->attn_rows && c->attn_tasks;
    c->rope = alloc_f32(c, T * (uint64_t)head_size, &ok);
    c->xl = alloc_f32(c, T * dim, &ok);
    uint64_t vocab = (uint64_t)cfg->vocab_size;
    c->slogits = alloc_f32(c, (uint64_t)o->max_seqs * vocab, &ok);
    /* (whole cache lines per thread) */
    c->sscratch_len = (sl_sample_scratch_size(cfg->vocab_size) + 63) / 64 * 16;
    c->sscratch = alloc_f32(c, (uint64_t)c->n_threads * c->sscratch_len, &ok);
    /* (elements of each cache; fp16 ones in half as many floats' room) */
    uint64_t cache =
        (uint64_t)o->n_kv_blocks * (uint64_t)cfg->n_layers * (uint64_t)o->block_size * kv;
    c->kv_type = o->kv_dtype == SL_KV_F16 ? SL_DTYPE_F16 : SL_DTYPE_F32;
    uint64_t cache_floats = c->kv_type == SL_DTYPE_F16 ? (cache + 1) / 2 : cache;
    ok = ok && cache_floats <= SIZE_MAX / sizeof(float) &&
         map_kv(c, (size_t)cache_floats * sizeof(float));
    /* The widest x a matmul reads: the step's rows of the down projection's input (or dim). */
    ok =
        ok && sl_cpu_pool_reserve(c->pool, o->max_batch_tokens,
                                  cfg->hidden_dim > cfg->dim ? cfg->hidden_dim : cfg->dim) == SL_OK;
    if (!ok) {
        cpu_free(c);
        return SL_ENOMEM;
    }
    c->kv_bytes = (size_t)(2 * cache) * sl_dtype_row_bytes(c->kv_type, 1);
    *out = c;
    return SL_OK;
}

/* Offset of (block, layer, KV head, slot) in a cache array, in elements. A block holds, per layer,
 * each KV head's rows together: (n_layers, n_kv_heads, block_size, head_size). Attention over one
 * head then reads one contiguous run per block instead of a slice of every row. */
static size_t kv_off(const struct sl_cpu_ctx *c, int32_t block, int layer, int head, int slot)
{
    size_t bs = (size_t)c->o.block_size, hs = (size_t)c->head_size;
    return (((size_t)block * (size_t)c->cfg.n_layers + (size_t)layer) * (size_t)c->cfg.n_kv_heads +
            (size_t)head) *
               bs * hs +
           (size_t)slot * hs;
}

/* The K and V pages of KV head g of `layer` for row r's sequence: rows hs elements apart, pages
 * a block of every layer apart. */
static void kv_pages(const struct sl_cpu_ctx *c, const struct sl_batch *b, int r, int layer, int g,
                     struct sl_cpu_pages *kp, struct sl_cpu_pages *vp)
{
    size_t off = kv_off(c, 0, layer, g, 0) * sl_dtype_row_bytes(c->kv_type, 1);
    *kp = (struct sl_cpu_pages){
        .base = (const char *)c->key_cache + off,
        .pages = b->block_tables[b->seq[r]],
        .page_stride = (size_t)c->cfg.n_layers * (size_t)c->o.block_size * (size_t)c->kv_dim,
        .row_stride = (size_t)c->head_size,
        .page_size = c->o.block_size,
        .type = c->kv_type,
    };
    *vp = *kp;
    vp->base = (const char *)c->value_cache + off;
}

/* Rows of one sequence attended together: their scores against a K row are taken while it is
 * in registers (the AVX-512 kernel takes 8 queries at once, the AVX2 one 3 at a time). */
#define ATTN_ROWS SL_CPU_ATTN_MAX_Q

/* Causal attention of rows [r0, r1) (one sequence, consecutive in the batch) for the query heads
 * of KV head g: RoPE of each query head, then each (row, head) over positions 0..pos of the
 * sequence, read through its block table into xb, up to SL_CPU_ATTN_MAX_Q queries at a time.
 * Each query's result is the bits sl_cpu_attention gives it alone (see
 * sl_cpu_attention_multi), and a task reads only the cache and its own q heads and writes only
 * its own xb heads, so the grouping, the task order and the thread count do not change a bit.
 * att: (SL_CPU_ATTN_MAX_Q, seq_len) scratch. */
static void attend(struct sl_cpu_ctx *c, const struct sl_batch *b, int layer, int r0, int r1, int g,
                   float *att)
{
    int hs = c->head_size, dim = c->cfg.dim, kv_mul = c->cfg.n_heads / c->cfg.n_kv_heads;
    struct sl_cpu_pages kp, vp;
    kv_pages(c, b, r0, layer, g, &kp, &vp);
    float *outs[SL_CPU_ATTN_MAX_Q];
    const float *qs[SL_CPU_ATTN_MAX_Q];
    int n_ctx[SL_CPU_ATTN_MAX_Q], nq = 0;
    for (int r = r0; r < r1; r++)
        for (int h = g * kv_mul; h < (g + 1) * kv_mul; h++) {
            size_t off = (size_t)r * dim + (size_t)h * hs;
            sl_cpu_rope_apply(c->q + off, 1, hs, c->rope + (size_t)r * hs);
            outs[nq] = c->xb + off;
            qs[nq] = c->q + off;
            n_ctx[nq++] = b->pos[r] + 1;
            if (nq == SL_CPU_ATTN_MAX_Q || (r == r1 - 1 && h == (g + 1) * kv_mul - 1)) {
                sl_cpu_attention_multi(nq, outs, qs, n_ctx, &kp, &vp, hs, att,
                                       (size_t)c->cfg.seq_len);
                nq = 0;
            }
        }
}

/* Attention of a group of one row (a decode token) for every head at once, block by block:
 * each block's K (then V) rows of all heads are one run of memory, read in address order with
 * the next block's fetched meanwhile, where head by head would read a short run of every block
 * once per head. The bits are those of attend (sl_cpu_attention_row). att: (n_heads, seq_len). */
static void attend_row(struct sl_cpu_ctx *c, const struct sl_batch *b, int layer, int r, float *att)
{
    int hs = c->head_size, dim = c->cfg.dim;
    struct sl_cpu_pages kp, vp; /* from KV head 0: the row kernel walks the others */
    kv_pages(c, b, r, layer, 0, &kp, &vp);
    float *q = c->q + (size_t)r * dim;
    sl_cpu_rope_apply(q, c->cfg.n_heads, hs, c->rope + (size_t)r * hs);
    sl_cpu_attention_row(c->xb + (size_t)r * dim, q, c->cfg.n_heads, c->cfg.n_kv_heads, &kp, &vp,
                         b->pos[r] + 1, hs, att, (size_t)c->cfg.seq_len);
}

struct attn_job {
    struct sl_cpu_ctx *c;
    const struct sl_batch *b;
    int layer;
    int n_tasks;      /* c->attn_tasks[0 .. n_tasks] */
    _Atomic int next; /* tasks handed out, last first */
};

/* Tasks are grabbed in shrinking chunks (sl_cpu_grab), so a thread that loses its core to
 * another process does not hold the others up. The last row groups go first: in a prompt chunk
 * they attend the most positions, and the cheap early rows then even out the end of the job. */
static void attn_task(void *arg, int ith, int nth)
{
    struct attn_job *j = arg;
    struct sl_cpu_ctx *c = j->c;
    int nkv1 = c->cfg.n_kv_heads + 1, tasks = j->n_tasks, end;
    const int *rows = c->attn_rows;
    float *att = c->att + (size_t)ith * (size_t)att_rows(&c->cfg) * (size_t)c->cfg.seq_len;
    for (int t0; (t0 = sl_cpu_grab(&j->next, tasks, nth, 1, &end)) < tasks;)
        for (int u = t0; u < end; u++) {
            int t = c->attn_tasks[tasks - 1 - u], g = t / nkv1, head = t % nkv1;
            if (head == 0)
                attend_row(c, j->b, j->layer, rows[g], att);
            else
                attend(c, j->b, j->layer, rows[g], rows[g + 1], head - 1, att);
        }
}

/* The row-wise work between the matmuls, which two rows never share. */
enum glue_op {
    GLUE_EMBED, /* token embedding and RoPE table of each row */
    GLUE_NORM,  /* x += xb2 when add, then xb = rmsnorm(x) · norm */
    GLUE_KV,    /* RoPE of K, then K and V into the cache */
};

struct glue_job {
    struct sl_cpu_ctx *c;
    const struct sl_batch *b;
    enum glue_op op;
    int n; /* rows [0, n): the batch's, or the last layer's sampled rows once gathered */
    int layer;
    bool add;
    const float *norm; /* (dim) GLUE_NORM's weights */
};

static void glue_rows(const struct glue_job *j, int r0, int r1)
{
    struct sl_cpu_ctx *c = j->c;
    const struct sl_batch *b = j->b;
    const struct sl_model_config *cfg = &c->cfg;
    int dim = cfg->dim, kv = c->kv_dim, hs = c->head_size, bs = c->o.block_size;
    for (int r = r0; r < r1; r++) {
        size_t xo = (size_t)r * dim;
        switch (j->op) {
        case GLUE_EMBED:
            sl_cpu_mat_row(c->x + xo, &c->m->w.token_embedding, b->tokens[r]);
            /* RoPE angles depend only on the position: computed once per step, not per layer. */
            sl_cpu_rope_table(c->rope + (size_t)r * hs, hs, b->pos[r], cfg->rope_theta);
            break;
        case GLUE_NORM:
            if (j->add)
                sl_cpu_add(c->x + xo, c->xb2 + xo, dim);
            sl_cpu_rmsnorm(c->xb + xo, c->x + xo, j->norm, 1, dim, cfg->rms_eps);
            break;
        case GLUE_KV: {
            int32_t pos = b->pos[r];
            sl_cpu_rope_apply(c->k + (size_t)r * kv, cfg->n_kv_heads, hs, c->rope + (size_t)r * hs);
            int32_t block = b->block_tables[b->seq[r]][pos / bs];
            for (int g = 0; g < cfg->n_kv_heads; g++) {
                size_t off = kv_off(c, block, j->layer, g, pos % bs),
                       src = (size_t)r * kv + (size_t)g * hs;
                if (c->kv_type == SL_DTYPE_F16) {
                    sl_cpu_f32_to_f16_row((uint16_t *)c->key_cache + off, c->k + src, hs);
                    sl_cpu_f32_to_f16_row((uint16_t *)c->value_cache + off, c->v + src, hs);
                } else {
                    memcpy((float *)c->key_cache + off, c->k + src, (size_t)hs * sizeof(float));
                    memcpy((float *)c->value_cache + off, c->v + src, (size_t)hs * sizeof(float));
                }
            }
            break;
        }
        }
    }
}

static void glue_task(void *arg, int ith, int nth)
{
    const struct glue_job *j = arg;
    glue_rows(j, j->n * ith / nth, j->n * (ith + 1) / nth);
}

/* Rows are split evenly over the pool when there are enough of them to pay for a hand-off (a
 * prompt chunk: 256 rows of RoPE tables, norms and KV writes took 4 % of a two-thread prefill
 * on the caller alone); a decode batch's few rows stay on the caller. Each row's operations are
 * the same either way. */
#define GLUE_MIN_ROWS 64

static void glue(struct sl_cpu_ctx *c, const struct glue_job *j)
{
    if (c->n_threads > 1 && j->n >= GLUE_MIN_ROWS)
        sl_cpu_pool_run(c->pool, glue_task, (void *)j);
    else
        glue_rows(j, 0, j->n);
}

/* The last layer's attention tasks where only some rows sample: one task (all heads, as
 * attend_row) for each sampled row, whose bits are those its group would give it. Returns the
 * number of tasks. */
static int sampled_rows_tasks(struct sl_cpu_ctx *c, const struct sl_batch *b)
{
    int nkv1 = c->cfg.n_kv_heads + 1;
    for (int i = 0; i < b->n_logits; i++) {
        c->attn_rows[i] = b->logit_rows[i];
        c->attn_tasks[i] = i * nkv1;
    }
    return b->n_logits;
}

/* Rows logit_rows[i] of the residual stream x and of the attention output xb moved to row i
 * (ascending rows: a row is read before anything is written over it). */
static void gather_sampled_rows(struct sl_cpu_ctx *c, const struct sl_batch *b)
{
    size_t dim = (size_t)c->cfg.dim;
    for (int i = 0; i < b->n_logits; i++) {
        size_t r = (size_t)b->logit_rows[i];
        if (r == (size_t)i)
            continue;
        memcpy(c->x + (size_t)i * dim, c->x + r * dim, dim * sizeof(float));
        memcpy(c->xb + (size_t)i * dim, c->xb + r * dim, dim * sizeof(float));
    }
}

/* sl_worker_bench_time_phases: the time since the last phase ended goes to phase p. */
static inline void phase_end(struct sl_cpu_ctx *c, enum sl_worker_phase p)
{
    if (!c->time_phases)
        return;
    uint64_t t = sl_clock_ns();
    c->phase_ns[p] += t - c->phase_t;
    c->phase_t = t;
}

static int cpu_forward(void *vctx, const struct sl_batch *b, float *logits)
{
    struct sl_cpu_ctx *c = vctx;
    int rc = sl_worker_batch_check(b, &c->cfg, &c->o);
    if (rc != SL_OK)
        return rc;
    if (b->n_logits > 0 && !logits)
        return SL_EINVAL;
    const struct sl_model_config *cfg = &c->cfg;
    const struct sl_model_weights *w = &c->m->w;
    int n = b->n_tokens, dim = cfg->dim, L = cfg->n_layers;
    if (c->time_phases)
        c->phase_t = sl_clock_ns();
    glue(c, &(struct glue_job){.c = c, .b = b, .op = GLUE_EMBED, .n = n});

    /* Consecutive rows of one sequence (a prefill chunk) are attended in groups. */
    int n_groups = 0;
    for (int r = 0; r < n; r++)
        if (r == 0 || b->seq[r] != b->seq[r - 1] || r - c->attn_rows[n_groups - 1] == ATTN_ROWS)
            c->attn_rows[n_groups++] = r;
    c->attn_rows[n_groups] = n;
    /* A group of one row is one task for all heads; a group of several, one task per KV head. */
    int n_tasks = 0, nkv = cfg->n_kv_heads;
    for (int g = 0; g < n_groups; g++) {
        if (c->attn_rows[g + 1] - c->attn_rows[g] == 1)
            c->attn_tasks[n_tasks++] = g * (nkv + 1);
        else
            for (int h = 0; h < nkv; h++)
                c->attn_tasks[n_tasks++] = g * (nkv + 1) + h + 1;
    }

    /* The residual add of each block goes with the norm that follows it. */
    glue(c,
         &(struct glue_job){.c = c, .b = b, .op = GLUE_NORM, .n = n, .norm = w->layers[0].rms_att});
    /* The last layer's output is wanted only at the rows that sample: a prompt chunk's other
     * rows need that layer for their K and V alone, in the cache once its QKV is done (as
     * llama.cpp's output ids; 0.13 of a 256-token prompt's flops, none of a decode batch's). */
    bool gather = b->n_logits < n;
    for (int l = 0; l < L; l++) {
        const struct sl_layer_weights *Lw = &w->layers[l];
        float *const qkv_out[3] = {c->q, c->k, c->v};
        const struct sl_mat qkv[3] = {Lw->wq, Lw->wk, Lw->wv};
        sl_cpu_matmul_multi_mt(c->pool, 3, qkv_out, c->xb, qkv, n);
        phase_end(c, SL_WORKER_PHASE_QKV);
        /* Every row's K and V go to the cache before any row attends, so a prefill chunk sees
         * its own earlier rows. */
        glue(c, &(struct glue_job){.c = c, .b = b, .op = GLUE_KV, .n = n, .layer = l});
        phase_end(c, SL_WORKER_PHASE_KV);
        if (l == L - 1 && gather) {
            if (b->n_logits == 0)
                return SL_OK;
            n_tasks = sampled_rows_tasks(c, b);
        }
        struct attn_job aj = {.c = c, .b = b, .layer = l, .n_tasks = n_tasks};
        atomic_store_explicit(&aj.next, 0, memory_order_relaxed);
        sl_cpu_pool_run(c->pool, attn_task, &aj);
        phase_end(c, SL_WORKER_PHASE_ATTENTION);
        if (l == L - 1 && gather) {
            gather_sampled_rows(c, b);
            n = b->n_logits;
        }
        sl_cpu_matmul_mt(c->pool, c->xb2, c->xb, &Lw->wo, n);
        phase_end(c, SL_WORKER_PHASE_WO);
        glue(c, &(struct glue_job){
                    .c = c, .b = b, .op = GLUE_NORM, .n = n, .add = true, .norm = Lw->rms_ffn});
        phase_end(c, SL_WORKER_PHASE_NORM);
        sl_cpu_matmul_swiglu_mt(c->pool, c->hb, c->hb2, c->xb, &Lw->w1, &Lw->w3, n);
        phase_end(c, SL_WORKER_PHASE_W1_W3);
        sl_cpu_matmul_mt(c->pool, c->xb2, c->hb, &Lw->w2, n);
        phase_end(c, SL_WORKER_PHASE_W2);
        if (l + 1 < L)
            glue(c, &(struct glue_job){.c = c,
                                       .b = b,
                                       .op = GLUE_NORM,
                                       .n = n,
                                       .add = true,
                                       .norm = w->layers[l + 1].rms_att});
        else
            sl_cpu_add(c->x, c->xb2, n * dim);
        phase_end(c, SL_WORKER_PHASE_NORM2);
    }

    /* Only rows that sample pay for the final norm and the (vocab, dim) classifier. */
    for (int i = 0; i < b->n_logits; i++)
        sl_cpu_rmsnorm(c->xl + (size_t)i * dim,
                       c->x + (size_t)(gather ? i : b->logit_rows[i]) * dim, w->rms_final, 1, dim,
                       cfg->rms_eps);
    if (b->n_logits > 0)
        sl_cpu_matmul_mt(c->pool, logits, c->xl, &w->wcls, b->n_logits);
    phase_end(c, SL_WORKER_PHASE_CLASSIFIER);
    return SL_OK;
}

struct sample_job {
    struct sl_cpu_ctx *c;
    const struct sl_sample_row *rows;
    int32_t *ids;
    int n;
    _Atomic int next;
};

static void sample_task(void *arg, int ith, int nth)
{
    (void)nth;
    struct sample_job *j = arg;
    struct sl_cpu_ctx *c = j->c;
    size_t vocab = (size_t)c->cfg.vocab_size;
    void *scratch = c->sscratch + (size_t)ith * c->sscratch_len;
    for (int i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;)
        j->ids[i] = sl_sample_with_coin(c->slogits + (size_t)i * vocab, (int)vocab, &j->rows[i].p,
                                        j->rows[i].coin, scratch);
}

/* forward, then each logit row sampled by sl_sample_with_coin, the rows spread over the pool:
 * a served step's sampling no longer runs on one thread while the others wait. The ids are the
 * ones the caller would get sampling forward's logits itself, whichever thread takes a row. */
static int cpu_forward_sample(void *vctx, const struct sl_batch *b,
                              const struct sl_sample_row *rows, int32_t *ids)
{
    struct sl_cpu_ctx *c = vctx;
    int st = cpu_forward(c, b, c->slogits);
    if (st != SL_OK || b->n_logits == 0)
        return st;
    struct sample_job j = {.c = c, .rows = rows, .ids = ids, .n = b->n_logits};
    atomic_store_explicit(&j.next, 0, memory_order_relaxed);
    if (c->n_threads > 1 && b->n_logits > 1)
        sl_cpu_pool_run(c->pool, sample_task, &j);
    else
        sample_task(&j, 0, 1);
    return SL_OK;
}

static size_t cpu_kv_bytes(void *vctx)
{
    return ((struct sl_cpu_ctx *)vctx)->kv_bytes;
}

const struct sl_backend_ops sl_cpu_backend_ops = {
    .name = "cpu",
    .init = cpu_init,
    .forward = cpu_forward,
    .forward_sample = cpu_forward_sample,
    .free = cpu_free,
    .kv_bytes = cpu_kv_bytes,
    .kv_block_bytes = sl_model_kv_block_bytes,
};
