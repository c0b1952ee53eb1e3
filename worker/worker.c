/* A worker: a model replica bound to one backend instance. */
#include "worker_impl.h"

#include <stdlib.h>

struct sl_worker {
    const struct sl_model *m;
    const struct sl_backend_ops *ops;
    struct sl_backend_opts o;
    void *ctx;
};

int sl_worker_new(const struct sl_model *m, const struct sl_backend_ops *ops,
                  const struct sl_backend_opts *o, struct sl_worker **out)
{
    if (!m || !ops || !o || !out)
        return SL_EINVAL;
    void *ctx = NULL;
    int rc = ops->init(m, o, &ctx);
    if (rc != SL_OK)
        return rc;
    struct sl_worker *w = sl_xcalloc(1, sizeof(*w));
    w->m = m;
    w->ops = ops;
    w->o = *o;
    w->ctx = ctx;
    *out = w;
    return SL_OK;
}

void *sl_worker_backend_ctx(struct sl_worker *w, const struct sl_backend_ops *ops)
{
    return w && w->ops == ops ? w->ctx : NULL;
}

void sl_worker_free(struct sl_worker *w)
{
    if (!w)
        return;
    w->ops->free(w->ctx);
    free(w);
}

int sl_worker_forward(struct sl_worker *w, const struct sl_batch *b, float *logits)
{
    return w->ops->forward(w->ctx, b, logits);
}

bool sl_worker_can_sample(const struct sl_worker *w)
{
    return w->ops->forward_sample != NULL;
}

int sl_worker_forward_sample(struct sl_worker *w, const struct sl_batch *b,
                             const struct sl_sample_row *rows, int32_t *ids)
{
    if (!w->ops->forward_sample)
        return SL_EINVAL;
    return w->ops->forward_sample(w->ctx, b, rows, ids);
}

/* Everything a forward reads is checked before any of it is used: a bad batch changes nothing. */
int sl_worker_batch_check(const struct sl_batch *b, const struct sl_model_config *cfg,
                          const struct sl_backend_opts *o)
{
    if (!b || b->n_tokens < 1 || b->n_tokens > o->max_batch_tokens || b->n_seqs < 1 ||
        b->n_seqs > o->max_seqs || b->n_logits < 0 || b->n_logits > b->n_tokens)
        return SL_EINVAL;
    if (!b->tokens || !b->pos || !b->seq || !b->block_tables || !b->ctx_len ||
        (b->n_logits > 0 && !b->logit_rows))
        return SL_EINVAL;
    int bs = o->block_size;
    for (int s = 0; s < b->n_seqs; s++) {
        int32_t len = b->ctx_len[s];
        if (len < 0 || len > cfg->seq_len)
            return SL_EINVAL;
        if (len == 0)
            continue;
        const int32_t *bt = b->block_tables[s];
        if (!bt)
            return SL_EINVAL;
        for (int i = 0; i < (len + bs - 1) / bs; i++)
            if (bt[i] < 0 || bt[i] >= o->n_kv_blocks)
                return SL_EINVAL;
    }
    for (int r = 0; r < b->n_tokens; r++) {
        if (b->tokens[r] < 0 || b->tokens[r] >= cfg->vocab_size)
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

const struct sl_model *sl_worker_model(const struct sl_worker *w)
{
    return w->m;
}

const struct sl_backend_opts *sl_worker_opts(const struct sl_worker *w)
{
    return &w->o;
}

size_t sl_worker_kv_bytes(const struct sl_worker *w)
{
    return w->ops->kv_bytes(w->ctx);
}
