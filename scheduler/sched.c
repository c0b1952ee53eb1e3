/* The scheduler thread: a thin adapter that owns a core and a worker.
 *
 * It sleeps on its inbox when idle and otherwise runs steps back to back. Text for each request
 * is gathered during a step and posted once at its end, and each outbox touched is woken once,
 * so an I/O thread wakes once per step however many tokens it receives.
 */
#include "sched_impl.h"

#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

enum msg_kind { MSG_SUBMIT, MSG_CANCEL, MSG_TIERS };

struct msg {
    struct msg *next;
    enum msg_kind kind;
    struct sl_req *req; /* a reference owned by the message (SUBMIT, CANCEL) */
    struct sl_outbox *box;
    /* TIERS: the new table, copied, so the caller's may go away at once. */
    struct sl_sched_tier *tiers;
    int n_tiers;
};

/* What the scheduler thread publishes after each step (see sl_sched_stats). */
struct pub_stats {
    struct sl_sched_stats st;
    uint64_t busy_at_ns; /* the time st.busy_ratio is up to */
};

#define PUB_WORDS ((sizeof(struct pub_stats) + sizeof(uint64_t) - 1) / sizeof(uint64_t))

struct sl_sched {
    struct sl_worker *worker;
    struct sl_sched_core *core;
    pthread_t thread;

    pthread_mutex_t lock; /* guards the inbox and `stopping` */
    pthread_cond_t cond;
    struct msg *head, *tail;
    bool stopping;

    /* Scheduler thread only. */
    struct sl_req **dirty; /* (n_dirty) requests with text to post, each with a reference */
    int n_dirty, cap_dirty;
    struct sl_outbox **woken; /* (n_woken) outboxes to wake at the end of the step */
    int n_woken, cap_woken;

    /* Scheduler thread only: time, for the statistics. */
    uint64_t step_busy_ns;  /* in forward() during the current step */
    uint64_t forward_ns;    /* the latest forward()'s time, which the core charges */
    uint64_t busy_total_ns; /* in forward() since start */
    uint64_t last_step_ns;  /* the latest step that ran the worker */
    double busy_ratio;      /* up to busy_at_ns */
    uint64_t busy_at_ns;

    atomic_int pub_running; /* published once per step */
    atomic_int pub_queued;
    /* A seqlock: pub_seq is odd while the scheduler thread rewrites pub_words. The words are
     * atomics so that a reader racing with the writer is defined behaviour; it then retries. */
    atomic_uint pub_seq;
    _Atomic uint64_t pub_words[PUB_WORDS];
};

static void touch_outbox(struct sl_sched *s, struct sl_outbox *box)
{
    for (int i = 0; i < s->n_woken; i++)
        if (s->woken[i] == box)
            return;
    if (s->n_woken == s->cap_woken) {
        s->cap_woken = s->cap_woken ? 2 * s->cap_woken : 8;
        s->woken = sl_xrealloc(s->woken, sizeof *s->woken * (size_t)s->cap_woken);
    }
    s->woken[s->n_woken++] = box;
}

static void post_text(struct sl_sched *s, struct sl_req *r)
{
    if (r->pending_tokens == 0 && r->pending.len == 0)
        return;
    struct sl_out_event *e = sl_outbox_event(r->box);
    sl_req_ref(r);
    e->req = r;
    e->kind = SL_OUT_TEXT;
    sl_out_event_set_text(e, r->pending.p ? r->pending.p : "", r->pending.len);
    e->n_tokens = r->pending_tokens;
    e->lp = r->pending_lp;
    e->n_lp = r->n_pending_lp;
    r->pending_lp = NULL;
    r->n_pending_lp = r->cap_pending_lp = 0;
    sl_str_clear(&r->pending);
    r->pending_tokens = 0;
    sl_outbox_push(r->box, e);
    touch_outbox(s, r->box);
}

static bool sink_token(void *ctx, struct sl_req *r, int32_t token)
{
    struct sl_sched *s = ctx;
    bool stopped = false;
    sl_detok_push(r->detok, token, &r->pending, &stopped);
    r->pending_tokens++;
    if (!r->dirty) {
        r->dirty = true;
        sl_req_ref(r);
        if (s->n_dirty == s->cap_dirty) {
            s->cap_dirty = s->cap_dirty ? 2 * s->cap_dirty : 64;
            s->dirty = sl_xrealloc(s->dirty, sizeof *s->dirty * (size_t)s->cap_dirty);
        }
        s->dirty[s->n_dirty++] = r;
    }
    return stopped;
}

static void sink_logprobs(void *ctx, struct sl_req *r, const struct sl_token_logprobs *lp)
{
    (void)ctx;
    if (r->n_pending_lp == r->cap_pending_lp) {
        r->cap_pending_lp = r->cap_pending_lp ? 2 * r->cap_pending_lp : 8;
        r->pending_lp =
            sl_xrealloc(r->pending_lp, sizeof *r->pending_lp * (size_t)r->cap_pending_lp);
    }
    r->pending_lp[r->n_pending_lp++] = *lp;
}

static void sink_done(void *ctx, struct sl_req *r, enum sl_finish why, int status, int n_generated)
{
    struct sl_sched *s = ctx;
    /* Text released before the end goes first, so DONE is always the last event. */
    if (why == SL_FINISH_STOP || why == SL_FINISH_LENGTH)
        sl_detok_finish(r->detok, &r->pending);
    post_text(s, r);
    struct sl_out_event *e = sl_outbox_event(r->box);
    sl_req_ref(r);
    e->req = r;
    e->kind = SL_OUT_DONE;
    e->n_tokens = n_generated;
    e->finish = why;
    e->status = status;
    e->stop_index = r->detok ? sl_detok_stop_index(r->detok) : -1;
    sl_outbox_push(r->box, e);
    touch_outbox(s, r->box);
}

static void flush_step(struct sl_sched *s)
{
    for (int i = 0; i < s->n_dirty; i++) {
        struct sl_req *r = s->dirty[i];
        r->dirty = false;
        post_text(s, r);
        sl_req_unref(r);
    }
    s->n_dirty = 0;
    for (int i = 0; i < s->n_woken; i++)
        sl_outbox_wake(s->woken[i]);
    s->n_woken = 0;
}

/* The worker as the core sees it: timed here, since the core has no clock. */
static int worker_forward(void *ctx, const struct sl_batch *b, float *logits)
{
    struct sl_sched *s = ctx;
    uint64_t t0 = sl_clock_ns();
    int st = sl_worker_forward(s->worker, b, logits);
    s->forward_ns = sl_clock_ns() - t0;
    s->step_busy_ns += s->forward_ns;
    return st;
}

static int worker_forward_sample(void *ctx, const struct sl_batch *b,
                                 const struct sl_sample_row *rows, int32_t *ids)
{
    struct sl_sched *s = ctx;
    uint64_t t0 = sl_clock_ns();
    int st = sl_worker_forward_sample(s->worker, b, rows, ids);
    s->forward_ns = sl_clock_ns() - t0;
    s->step_busy_ns += s->forward_ns;
    return st;
}

static uint64_t worker_forward_ns(void *ctx)
{
    return ((struct sl_sched *)ctx)->forward_ns;
}

static bool worker_is_stop(void *ctx, int32_t token)
{
    struct sl_sched *s = ctx;
    return sl_model_is_stop_token(sl_worker_model(s->worker), token);
}

double sl_sched_busy_update(double ratio, uint64_t dt_ns, uint64_t busy_ns)
{
    if (dt_ns == 0)
        return ratio;
    if (busy_ns > dt_ns)
        busy_ns = dt_ns;
    double keep = exp(-(double)dt_ns / (SL_SCHED_BUSY_WINDOW_S * 1e9));
    return ratio * keep + (double)busy_ns / (double)dt_ns * (1.0 - keep);
}

/* Publishes the state after a step. Called before the step's events are posted, so that a
 * client holding its answer never reads statistics older than the step that produced it. */
static void publish(struct sl_sched *s)
{
    struct pub_stats p;
    memset(&p, 0, sizeof p);
    sl_sched_core_stats(s->core, &p.st);
    p.st.last_step_seconds = (double)s->last_step_ns / 1e9;
    p.st.busy_seconds = (double)s->busy_total_ns / 1e9;
    p.st.busy_ratio = s->busy_ratio;
    p.busy_at_ns = s->busy_at_ns;
    uint64_t w[PUB_WORDS] = {0};
    memcpy(w, &p, sizeof p);
    unsigned q = atomic_load_explicit(&s->pub_seq, memory_order_relaxed);
    atomic_store_explicit(&s->pub_seq, q + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    for (size_t i = 0; i < PUB_WORDS; i++)
        atomic_store_explicit(&s->pub_words[i], w[i], memory_order_relaxed);
    atomic_store_explicit(&s->pub_seq, q + 2, memory_order_release);
    atomic_store_explicit(&s->pub_running, p.st.running, memory_order_relaxed);
    atomic_store_explicit(&s->pub_queued, p.st.queued_requests, memory_order_relaxed);
}

static void msg_free(struct msg *m)
{
    if (m->req)
        sl_req_unref(m->req);
    free(m->tiers);
    free(m);
}

static void handle(struct sl_sched *s, struct msg *m)
{
    struct sl_req *r = m->req;
    if (m->kind == MSG_TIERS) {
        sl_sched_core_set_tiers(s->core, m->tiers, m->n_tiers);
        sl_log(SL_LOG_INFO, "scheduler: %d tiers in effect", m->n_tiers);
    } else if (m->kind == MSG_SUBMIT) {
        r->box = m->box;
        const struct sl_tok *tok = sl_model_tok(sl_worker_model(s->worker));
        r->detok = sl_detok_new(tok, r->prompt[r->n_prompt - 1], r->params.stop, r->params.n_stop);
        sl_detok_stop_options(r->detok, r->params.min_tokens, r->params.include_stop_str);
        if (r->params.keep_special)
            sl_detok_keep_special(r->detok);
        int st =
            sl_req_cancelled(r) ? SL_ECANCELED : sl_sched_core_submit(s->core, r, sl_clock_ns());
        if (st != SL_OK)
            sink_done(s, r, st == SL_ECANCELED ? SL_FINISH_CANCELLED : SL_FINISH_ERROR, st, 0);
    } else {
        sl_sched_core_cancel(s->core, r);
    }
    msg_free(m);
}

static void *sched_main(void *arg)
{
    struct sl_sched *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        struct msg *m = s->head;
        s->head = s->tail = NULL;
        bool stopping = s->stopping;
        if (!m && !stopping && sl_sched_core_pending(s->core) == 0) {
            pthread_cond_wait(&s->cond, &s->lock);
            continue;
        }
        pthread_mutex_unlock(&s->lock);
        while (m) {
            struct msg *next = m->next;
            handle(s, m);
            m = next;
        }
        if (stopping) {
            /* Reports CANCELLED for everything still held, then posts it. */
            sl_sched_core_free(s->core);
            s->core = NULL;
            flush_step(s);
            return NULL;
        }
        uint64_t t0 = sl_clock_ns();
        s->step_busy_ns = 0;
        int st = sl_sched_core_step(s->core, t0);
        uint64_t t1 = sl_clock_ns();
        if (st < 0)
            sl_log(SL_LOG_ERROR, "scheduler: step failed: %s", sl_status_str(st));
        if (st != 0)
            s->last_step_ns = t1 - t0;
        s->busy_total_ns += s->step_busy_ns;
        /* The interval since the last update includes any time asleep on the inbox. */
        s->busy_ratio = sl_sched_busy_update(s->busy_ratio, t1 - s->busy_at_ns, s->step_busy_ns);
        s->busy_at_ns = t1;
        publish(s);
        flush_step(s);
        pthread_mutex_lock(&s->lock);
    }
}

int sl_sched_new(struct sl_worker *w, const struct sl_sched_limits *lim, struct sl_sched **out)
{
    struct sl_sched *s = sl_xcalloc(1, sizeof *s);
    s->worker = w;
    struct sl_sched_worker wi = {.ctx = s,
                                 .forward = worker_forward,
                                 .forward_sample =
                                     sl_worker_can_sample(w) ? worker_forward_sample : NULL,
                                 .is_stop_token = worker_is_stop,
                                 .forward_ns = worker_forward_ns};
    struct sl_sched_sink sink = {
        .ctx = s, .token = sink_token, .logprobs = sink_logprobs, .done = sink_done};
    struct sl_sched_limits l = *lim;
    if (!(l.cache_seed[0] | l.cache_seed[1] | l.cache_seed[2] | l.cache_seed[3]) &&
        getrandom(l.cache_seed, sizeof l.cache_seed, 0) != (ssize_t)sizeof l.cache_seed) {
        /* No entropy (never on Linux after boot): the clock is a poor key, but better than 0. */
        for (int i = 0; i < 4; i++)
            l.cache_seed[i] = sl_clock_ns() * 0x9e3779b97f4a7c15ull + (uint64_t)i;
    }
    s->core = sl_sched_core_new(&l, &wi, &sink);
    if (!s->core) {
        free(s);
        return SL_EINVAL;
    }
    s->busy_at_ns = sl_clock_ns();
    publish(s); /* the limits (KV blocks) are visible before the first step */
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0) {
        sl_sched_core_free(s->core);
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return SL_EAGAIN;
    }
    *out = s;
    return SL_OK;
}

void sl_sched_free(struct sl_sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    /* Messages that arrived after the thread's last look at the inbox. */
    for (struct msg *m = s->head, *next; m; m = next) {
        next = m->next;
        msg_free(m);
    }
    free(s->dirty);
    free(s->woken);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void enqueue_msg(struct sl_sched *s, struct msg *m)
{
    pthread_mutex_lock(&s->lock);
    if (s->tail)
        s->tail->next = m;
    else
        s->head = m;
    s->tail = m;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void post(struct sl_sched *s, enum msg_kind kind, struct sl_req *r, struct sl_outbox *box)
{
    struct msg *m = sl_xcalloc(1, sizeof *m);
    m->kind = kind;
    sl_req_ref(r);
    m->req = r;
    m->box = box;
    enqueue_msg(s, m);
}

int sl_sched_set_tiers(struct sl_sched *s, const struct sl_sched_tier *tiers, int n)
{
    if (n < 0 || n > SL_SCHED_MAX_TIERS || (n > 0 && !tiers))
        return SL_EINVAL;
    struct msg *m = sl_xcalloc(1, sizeof *m);
    m->kind = MSG_TIERS;
    if (n > 0) {
        m->tiers = sl_xmalloc(sizeof *m->tiers * (size_t)n);
        memcpy(m->tiers, tiers, sizeof *m->tiers * (size_t)n);
    }
    m->n_tiers = n;
    enqueue_msg(s, m);
    return SL_OK;
}

int sl_sched_submit(struct sl_sched *s, struct sl_req *r, struct sl_outbox *box)
{
    if (!box || r->n_prompt < 1)
        return SL_EINVAL;
    atomic_store_explicit(&r->submit_ns, sl_clock_ns(), memory_order_relaxed);
    post(s, MSG_SUBMIT, r, box);
    return SL_OK;
}

void sl_sched_cancel(struct sl_sched *s, struct sl_req *r)
{
    atomic_store_explicit(&r->cancelled, true, memory_order_release);
    post(s, MSG_CANCEL, r, NULL);
}

int sl_sched_running(const struct sl_sched *s)
{
    return atomic_load_explicit(&s->pub_running, memory_order_relaxed);
}

int sl_sched_queued(const struct sl_sched *s)
{
    return atomic_load_explicit(&s->pub_queued, memory_order_relaxed);
}

void sl_sched_stats(const struct sl_sched *s, struct sl_sched_stats *out)
{
    uint64_t w[PUB_WORDS];
    for (;;) {
        unsigned q = atomic_load_explicit(&s->pub_seq, memory_order_acquire);
        if (q & 1) {
            sched_yield(); /* the scheduler thread is mid-publish */
            continue;
        }
        for (size_t i = 0; i < PUB_WORDS; i++)
            w[i] = atomic_load_explicit(&s->pub_words[i], memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&s->pub_seq, memory_order_relaxed) == q)
            break;
    }
    struct pub_stats p;
    memcpy(&p, w, sizeof p);
    *out = p.st;
    /* Time since the last step counts as idle (at most one step's worth is really busy). */
    uint64_t now = sl_clock_ns();
    if (now > p.busy_at_ns)
        out->busy_ratio = sl_sched_busy_update(p.st.busy_ratio, now - p.busy_at_ns, 0);
}

int sl_sched_prefix_match(const struct sl_sched *s, uint64_t key, const int32_t *ids, int n)
{
    return sl_sched_kv_published_match(&s->core->kv, key, ids, n);
}
