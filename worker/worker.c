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
