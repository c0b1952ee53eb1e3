/* Requests: reference-counted, shared by the gateway and the scheduler. */
#include "sched_impl.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

const char *sl_finish_str(enum sl_finish f)
{
    switch (f) {
    case SL_FINISH_STOP: return "stop";
    case SL_FINISH_LENGTH: return "length";
    case SL_FINISH_CANCELLED: return "cancelled";
    case SL_FINISH_ERROR: return "error";
    case SL_FINISH_NONE: break;
    }
    return NULL;
}

static int clamp_count(int n, int max)
{
    return n < 0 ? 0 : n > max ? max : n;
}

/* A copy of n elements of `size` bytes, or NULL when there are none. */
static void *dup_array(const void *src, int n, size_t size)
{
    if (n <= 0)
        return NULL;
    void *p = sl_xmalloc(size * (size_t)n);
    memcpy(p, src, size * (size_t)n);
    return p;
}

struct sl_req_prompt *sl_req_prompt_new(int n)
{
    n = n < 0 ? 0 : n; /* an empty prompt: sl_sched_submit refuses the request */
    struct sl_req_prompt *pr = sl_xmalloc(sizeof *pr + sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    atomic_init(&pr->refs, 1);
    pr->n = n;
    return pr;
}

struct sl_req_prompt *sl_req_prompt_copy(const int32_t *ids, int n)
{
    struct sl_req_prompt *pr = sl_req_prompt_new(n);
    memcpy(pr->ids, ids, sizeof(int32_t) * (size_t)pr->n);
    return pr;
}

int32_t *sl_req_prompt_ids(struct sl_req_prompt *pr)
{
    return pr->ids;
}

int sl_req_prompt_n(const struct sl_req_prompt *pr)
{
    return pr->n;
}

struct sl_req_prompt *sl_req_prompt_ref(struct sl_req_prompt *pr)
{
    atomic_fetch_add_explicit(&pr->refs, 1, memory_order_relaxed);
    return pr;
}

void sl_req_prompt_unref(struct sl_req_prompt *pr)
{
    if (pr && atomic_fetch_sub_explicit(&pr->refs, 1, memory_order_acq_rel) == 1)
        free(pr);
}

struct sl_req *sl_req_new(struct sl_req_prompt *prompt, const struct sl_req_params *p)
{
    struct sl_req *r = sl_xcalloc(1, sizeof *r);
    atomic_init(&r->refs, 1);
    atomic_init(&r->cancelled, false);
    atomic_init(&r->submit_ns, SL_REQ_NOT_YET);
    atomic_init(&r->first_step_ns, SL_REQ_NOT_YET);
    atomic_init(&r->device_ns, 0);
    r->prompt_ref = prompt;
    r->prompt = prompt->ids;
    r->n_prompt = prompt->n;
    r->params = *p;
    r->params.sched_tier.name[SL_SCHED_TIER_NAME_MAX] = '\0';
    int n = clamp_count(p->n_stop, SL_REQ_MAX_STOPS);
    r->params.n_stop = n;
    for (int i = 0; i < SL_REQ_MAX_STOPS; i++) {
        r->stop_copy[i] = i < n ? sl_xstrdup(p->stop[i]) : NULL;
        r->params.stop[i] = r->stop_copy[i];
    }
    int nb = clamp_count(p->n_bias, SL_REQ_MAX_LOGIT_BIAS);
    r->params.n_bias = nb;
    r->params.bias_ids = r->bias_ids_copy = dup_array(p->bias_ids, nb, sizeof(int32_t));
    r->params.bias = r->bias_copy = dup_array(p->bias, nb, sizeof(float));
    int ns = clamp_count(p->n_stop_ids, SL_REQ_MAX_STOP_IDS);
    r->params.n_stop_ids = ns;
    r->params.stop_ids = r->stop_ids_copy = dup_array(p->stop_ids, ns, sizeof(int32_t));
    if (r->params.min_tokens < 0)
        r->params.min_tokens = 0;
    sl_str_init(&r->pending);
    return r;
}

void sl_req_ref(struct sl_req *r)
{
    atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
}

void sl_req_unref(struct sl_req *r)
{
    if (!r || atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (int i = 0; i < SL_REQ_MAX_STOPS; i++)
        free(r->stop_copy[i]);
    free(r->bias_ids_copy);
    free(r->bias_copy);
    free(r->stop_ids_copy);
    free(r->pending_lp);
    if (r->detok)
        sl_detok_free(r->detok);
    sl_str_dispose(&r->pending);
    sl_req_prompt_unref(r->prompt_ref);
    free(r);
}

void sl_req_set_user(struct sl_req *r, void *user)
{
    r->user = user;
}
void *sl_req_user(const struct sl_req *r)
{
    return r->user;
}
int sl_req_n_prompt(const struct sl_req *r)
{
    return r->n_prompt;
}
const struct sl_req_params *sl_req_params(const struct sl_req *r)
{
    return &r->params;
}

bool sl_req_cancelled(const struct sl_req *r)
{
    return atomic_load_explicit(&r->cancelled, memory_order_acquire);
}

uint64_t sl_req_device_ns(const struct sl_req *r)
{
    return atomic_load_explicit(&r->device_ns, memory_order_relaxed);
}

int sl_req_cached_tokens(const struct sl_req *r)
{
    return atomic_load_explicit(&r->cached_tokens, memory_order_relaxed);
}

bool sl_req_queue_ns(const struct sl_req *r, uint64_t *ns)
{
    uint64_t sub = atomic_load_explicit(&r->submit_ns, memory_order_relaxed);
    uint64_t first = atomic_load_explicit(&r->first_step_ns, memory_order_relaxed);
    if (sub == SL_REQ_NOT_YET || first == SL_REQ_NOT_YET)
        return false;
    /* The core is given `now` by its owner; a step stamped before the submit waited nothing. */
    *ns = first > sub ? first - sub : 0;
    return true;
}
