/* The CPU backend: a Llama forward over a varlen batch with a paged fp32 KV pool. */
#include "worker_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void cpu_free(void *vctx)
{
    struct sl_cpu_ctx *c = vctx;
    if (!c)
        return;
    sl_cpu_pool_free(c->pool);
    free(c->x);
    free(c->xb);
    free(c->xb2);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->hb);
    free(c->hb2);
    free(c->att);
    free(c->xl);
    free(c->key_cache);
    free(c->value_cache);
    free(c);
}

static float *alloc_f32(uint64_t n, bool *ok)
{
    /* Plain calloc, not sl_xcalloc: the pool size comes from configuration, and running out is a
     * start-up error to report, not an abort. */
    if (n == 0 || n > SIZE_MAX / sizeof(float)) {
        *ok = false;
        return NULL;
    }
    float *p = calloc((size_t)n, sizeof(float));
    if (!p)
        *ok = false;
    return p;
}

/* Until the typed kernels land, the CPU backend runs fp32 weights only. */
static bool all_f32(const struct sl_model *m)
{
    const struct sl_model_weights *w = &m->w;
    if (w->token_embedding.type != SL_DTYPE_F32 || w->wcls.type != SL_DTYPE_F32)
        return false;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct sl_layer_weights *L = &w->layers[l];
        const struct sl_mat *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if (mats[i]->type != SL_DTYPE_F32)
                return false;
    }
    return true;
}

static int cpu_init(const struct sl_model *m, const struct sl_backend_opts *o, void **out)
{
    if (o->n_kv_blocks < 1 || o->block_size < 1 || o->max_batch_tokens < 1 || o->max_seqs < 1 ||
        o->threads < 0)
        return SL_EINVAL;
    const struct sl_model_config *cfg = sl_model_config(m);
    if (!all_f32(m))
        return SL_EINVAL;
    struct sl_cpu_ctx *c = sl_xcalloc(1, sizeof(*c));
    c->m = m;
    c->cfg = *cfg;
    c->o = *o;
    c->head_size = cfg->dim / cfg->n_heads;
    c->kv_dim = c->head_size * cfg->n_kv_heads;
    uint64_t T = (uint64_t)o->max_batch_tokens, dim = (uint64_t)cfg->dim;
    uint64_t hid = (uint64_t)cfg->hidden_dim, kv = (uint64_t)c->kv_dim;
    bool ok = true;
    c->x = alloc_f32(T * dim, &ok);
    c->xb = alloc_f32(T * dim, &ok);
    c->xb2 = alloc_f32(T * dim, &ok);
    c->q = alloc_f32(T * dim, &ok);
    c->k = alloc_f32(T * kv, &ok);
    c->v = alloc_f32(T * kv, &ok);
    c->hb = alloc_f32(T * hid, &ok);
    c->hb2 = alloc_f32(T * hid, &ok);
    c->att = alloc_f32((uint64_t)cfg->seq_len, &ok);
    c->xl = alloc_f32(T * dim, &ok);
    uint64_t cache =
        (uint64_t)o->n_kv_blocks * (uint64_t)cfg->n_layers * (uint64_t)o->block_size * kv;
    c->key_cache = alloc_f32(cache, &ok);
    c->value_cache = alloc_f32(cache, &ok);
    if (!ok) {
        cpu_free(c);
        return SL_ENOMEM;
    }
    c->kv_bytes = (size_t)(2 * cache * sizeof(float));
    c->pool = sl_cpu_pool_new(o->threads);
    if (!c->pool) {
        cpu_free(c);
        return SL_EBACKEND;
    }
    *out = c;
    return SL_OK;
}

/* Everything a forward reads is checked before any of it is used: a bad batch changes nothing. */
static int check_batch(const struct sl_cpu_ctx *c, const struct sl_batch *b)
{
    if (!b || b->n_tokens < 1 || b->n_tokens > c->o.max_batch_tokens || b->n_seqs < 1 ||
        b->n_seqs > c->o.max_seqs || b->n_logits < 0 || b->n_logits > b->n_tokens)
        return SL_EINVAL;
    if (!b->tokens || !b->pos || !b->seq || !b->block_tables || !b->ctx_len ||
        (b->n_logits > 0 && !b->logit_rows))
        return SL_EINVAL;
    int bs = c->o.block_size;
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t len = b->ctx_len[s];
        if (len < 0 || len > c->cfg.seq_len)
            return SL_EINVAL;
        if (len == 0)
            continue;
        const int32_t *bt = b->block_tables[s];
        if (!bt)
            return SL_EINVAL;
        for (int i = 0; i < (len + bs - 1) / bs; i++)
            if (bt[i] < 0 || bt[i] >= c->o.n_kv_blocks)
                return SL_EINVAL;
    }
    for (int r = 0; r < b->n_tokens; r++) {
        if (b->tokens[r] < 0 || b->tokens[r] >= c->cfg.vocab_size)
            return SL_EINVAL;
        if (b->seq[r] < 0 || b->seq[r] >= b->n_seqs)
            return SL_EINVAL;
        if (b->pos[r] < 0 || b->pos[r] >= b->ctx_len[b->seq[r]])
            return SL_EINVAL;
    }
    for (int i = 0; i < b->n_logits; i++) {
        int32_t r = b->logit_rows[i];
        if (r < 0 || r >= b->n_tokens || (i > 0 && r <= b->logit_rows[i - 1]))
            return SL_EINVAL;
    }
    return SL_OK;
}

/* Offset of (block, layer, slot) in a cache array, in floats. */
static size_t kv_off(const struct sl_cpu_ctx *c, int32_t block, int layer, int slot)
{
    return (((size_t)block * (size_t)c->cfg.n_layers + (size_t)layer) * (size_t)c->o.block_size +
            (size_t)slot) *
           (size_t)c->kv_dim;
}

/* Causal attention of row r over positions 0..pos of its own sequence, read through its block
 * table. Writes the heads' outputs into xb row r. */
static void attend(struct sl_cpu_ctx *c, const struct sl_batch *b, int layer, int r)
{
    int hs = c->head_size, bs = c->o.block_size;
    int kv_mul = c->cfg.n_heads / c->cfg.n_kv_heads;
    int32_t pos = b->pos[r];
    const int32_t *bt = b->block_tables[b->seq[r]];
    float scale = sqrtf((float)hs);
    for (int h = 0; h < c->cfg.n_heads; h++) {
        const float *q = c->q + (size_t)r * c->cfg.dim + (size_t)h * hs;
        size_t head_off = (size_t)(h / kv_mul) * hs;
        float *att = c->att;
        for (int t = 0; t <= pos; t++) {
            const float *k = c->key_cache + kv_off(c, bt[t / bs], layer, t % bs) + head_off;
            att[t] = sl_cpu_dot(q, k, hs) / scale;
        }
        sl_cpu_softmax(att, pos + 1);
        float *o = c->xb + (size_t)r * c->cfg.dim + (size_t)h * hs;
        memset(o, 0, (size_t)hs * sizeof(float));
        for (int t = 0; t <= pos; t++) {
            const float *v = c->value_cache + kv_off(c, bt[t / bs], layer, t % bs) + head_off;
            sl_cpu_axpy(o, att[t], v, hs);
        }
    }
}

static int cpu_forward(void *vctx, const struct sl_batch *b, float *logits)
{
    struct sl_cpu_ctx *c = vctx;
    int rc = check_batch(c, b);
    if (rc != SL_OK)
        return rc;
    if (b->n_logits > 0 && !logits)
        return SL_EINVAL;
    const struct sl_model_config *cfg = &c->cfg;
    const struct sl_model_weights *w = &c->m->w;
    int n = b->n_tokens, dim = cfg->dim, hid = cfg->hidden_dim, kv = c->kv_dim;
    int hs = c->head_size, bs = c->o.block_size;
    const float *emb = w->token_embedding.data;
    for (int r = 0; r < n; r++)
        memcpy(c->x + (size_t)r * dim, emb + (size_t)b->tokens[r] * dim,
               (size_t)dim * sizeof(float));

    for (int l = 0; l < cfg->n_layers; l++) {
        const struct sl_layer_weights *L = &w->layers[l];
        sl_cpu_rmsnorm(c->xb, c->x, L->rms_att, n, dim, cfg->rms_eps);
        sl_cpu_matmul_mt(c->pool, c->q, c->xb, L->wq.data, n, dim, dim);
        sl_cpu_matmul_mt(c->pool, c->k, c->xb, L->wk.data, n, kv, dim);
        sl_cpu_matmul_mt(c->pool, c->v, c->xb, L->wv.data, n, kv, dim);
        /* Every row's K and V go to the cache before any row attends, so a prefill chunk sees
         * its own earlier rows. */
        for (int r = 0; r < n; r++) {
            int32_t pos = b->pos[r];
            sl_cpu_rope(c->q + (size_t)r * dim, cfg->n_heads, hs, pos, cfg->rope_theta);
            sl_cpu_rope(c->k + (size_t)r * kv, cfg->n_kv_heads, hs, pos, cfg->rope_theta);
            int32_t block = b->block_tables[b->seq[r]][pos / bs];
            size_t off = kv_off(c, block, l, pos % bs);
            memcpy(c->key_cache + off, c->k + (size_t)r * kv, (size_t)kv * sizeof(float));
            memcpy(c->value_cache + off, c->v + (size_t)r * kv, (size_t)kv * sizeof(float));
        }
        for (int r = 0; r < n; r++)
            attend(c, b, l, r);
        sl_cpu_matmul_mt(c->pool, c->xb2, c->xb, L->wo.data, n, dim, dim);
        sl_cpu_add(c->x, c->xb2, n * dim);

        sl_cpu_rmsnorm(c->xb, c->x, L->rms_ffn, n, dim, cfg->rms_eps);
        sl_cpu_matmul_mt(c->pool, c->hb, c->xb, L->w1.data, n, hid, dim);
        sl_cpu_matmul_mt(c->pool, c->hb2, c->xb, L->w3.data, n, hid, dim);
        sl_cpu_swiglu(c->hb, c->hb2, n * hid);
        sl_cpu_matmul_mt(c->pool, c->xb2, c->hb, L->w2.data, n, dim, hid);
        sl_cpu_add(c->x, c->xb2, n * dim);
    }

    /* Only rows that sample pay for the final norm and the (vocab, dim) classifier. */
    for (int i = 0; i < b->n_logits; i++)
        sl_cpu_rmsnorm(c->xl + (size_t)i * dim, c->x + (size_t)b->logit_rows[i] * dim, w->rms_final,
                       1, dim, cfg->rms_eps);
    if (b->n_logits > 0)
        sl_cpu_matmul_mt(c->pool, logits, c->xl, w->wcls.data, b->n_logits, cfg->vocab_size, dim);
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
    .free = cpu_free,
    .kv_bytes = cpu_kv_bytes,
};
