/* The scheduler thread over the real CPU worker and the synthetic model: requests in through
 * the inbox, text out through an outbox. Waiting is on the outbox's wake-up, never on a timer. */
#include <criterion/criterion.h>
#include <sluice/sched.h>

#include "sched_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* While `hold` is set, the scheduler thread waits inside each wake-up until the test has taken
 * that step's events and released it: the scheduler then runs in lockstep with the test, so what
 * the test does between two steps (a cancel) lands before the next step, on any machine. */
struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    long wakes;
    long released;
    bool hold;
};

static void on_wake(void *arg)
{
    struct waiter *w = arg;
    pthread_mutex_lock(&w->lock);
    long mine = ++w->wakes;
    pthread_cond_broadcast(&w->cond);
    while (w->hold && w->released < mine)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

struct harness {
    struct sl_model *model;
    struct sl_worker *worker;
    struct sl_sched *sched;
    struct waiter w;
    struct sl_outbox *box;
    long seen;
};

static void harness_init(struct harness *h)
{
    memset(h, 0, sizeof *h);
    char err[256];
    cr_assert_eq(sl_model_load("synthetic", NULL, &h->model, err, sizeof err), SL_OK, "%s", err);
    const struct sl_model_config *mc = sl_model_config(h->model);
    struct sl_backend_opts bo = {
        .n_kv_blocks = 64, .block_size = 16, .max_batch_tokens = 64, .max_seqs = 4, .threads = 1};
    cr_assert_eq(sl_worker_new(h->model, &sl_cpu_backend_ops, &bo, &h->worker), SL_OK);
    struct sl_sched_limits lim = {.vocab = mc->vocab_size,
                                  .max_ctx = mc->seq_len,
                                  .max_seqs = 4,
                                  .max_batch_tokens = 64,
                                  .n_blocks = 64,
                                  .block_size = 16};
    cr_assert_eq(sl_sched_new(h->worker, &lim, &h->sched), SL_OK);
    pthread_mutex_init(&h->w.lock, NULL);
    pthread_cond_init(&h->w.cond, NULL);
    h->box = sl_outbox_new(on_wake, &h->w);
}

static void harness_dispose(struct harness *h)
{
    sl_sched_free(h->sched);
    sl_outbox_free(h->box);
    sl_worker_free(h->worker);
    sl_model_free(h->model);
}

/* Blocks until the scheduler has woken the outbox since the last call, then takes its events. */
static struct sl_out_event *next_events(struct harness *h)
{
    pthread_mutex_lock(&h->w.lock);
    while (h->w.wakes == h->seen)
        pthread_cond_wait(&h->w.cond, &h->w.lock);
    h->seen = h->w.wakes;
    pthread_mutex_unlock(&h->w.lock);
    return sl_outbox_take(h->box);
}

/* Lets a held scheduler thread go on from the wake-ups the test has seen. */
static void release(struct harness *h)
{
    pthread_mutex_lock(&h->w.lock);
    h->w.released = h->seen;
    pthread_cond_broadcast(&h->w.cond);
    pthread_mutex_unlock(&h->w.lock);
}

static void hold(struct harness *h, bool on)
{
    pthread_mutex_lock(&h->w.lock);
    h->w.hold = on;
    pthread_cond_broadcast(&h->w.cond);
    pthread_mutex_unlock(&h->w.lock);
}

struct result {
    struct sl_str text;
    int text_tokens;
    int text_events;
    enum sl_finish finish;
    int status;
    int n_tokens;
};

/* Collects events of r until its DONE, failing on any event of another request. */
static void collect(struct harness *h, struct sl_req *r, struct result *res, bool cancel_on_first)
{
    memset(res, 0, sizeof *res);
    sl_str_init(&res->text);
    bool done = false;
    while (!done) {
        for (struct sl_out_event *e = next_events(h), *next; e; e = next) {
            next = e->next;
            cr_assert_eq(e->req, r);
            cr_assert(!done, "no event after DONE");
            if (e->kind == SL_OUT_TEXT) {
                cr_assert_eq(strlen(e->text), e->len, "text has no NUL inside");
                sl_str_append(&res->text, e->text, e->len);
                res->text_tokens += e->n_tokens;
                if (res->text_events++ == 0 && cancel_on_first)
                    sl_sched_cancel(h->sched, r);
            } else {
                done = true;
                res->finish = e->finish;
                res->status = e->status;
                res->n_tokens = e->n_tokens;
            }
            sl_out_event_free(e);
        }
        release(h);
    }
}

static struct sl_req *make_req_eos(struct harness *h, const char *prompt, int max_tokens,
                                   float temp, uint64_t seed, bool ignore_eos)
{
    int32_t ids[512];
    int n;
    const struct sl_tok *tok = sl_model_tok(h->model);
    cr_assert_eq(sl_tok_encode(tok, prompt, strlen(prompt), true, ids, 512, &n), SL_OK);
    struct sl_req_params p = {
        .max_tokens = max_tokens, .temperature = temp, .top_p = 1.f, .seed = seed};
    p.ignore_eos = ignore_eos;
    return sl_req_new(sl_req_prompt_copy(ids, n), &p);
}

static struct sl_req *make_req(struct harness *h, const char *prompt, int max_tokens, float temp,
                               uint64_t seed)
{
    return make_req_eos(h, prompt, max_tokens, temp, seed, false);
}

Test(sched, thread_delivers_all_tokens_then_done_when_request_runs)
{
    struct harness h;
    harness_init(&h);
    struct sl_req *r = make_req(&h, "Hello, world", 24, 0.f, 1);
    cr_assert_eq(sl_sched_submit(h.sched, r, h.box), SL_OK);
    struct result res;
    collect(&h, r, &res, false);
    cr_assert(res.finish == SL_FINISH_LENGTH || res.finish == SL_FINISH_STOP);
    if (res.finish == SL_FINISH_LENGTH)
        cr_assert_eq(res.n_tokens, 24);
    cr_assert_leq(res.text_tokens, res.n_tokens);
    cr_assert_geq(res.text_tokens, res.n_tokens - 1, "only a stop token has no text");
    cr_assert_eq(sl_utf8_complete_prefix(res.text.p ? res.text.p : "", res.text.len), res.text.len);
    sl_str_dispose(&res.text);
    sl_req_unref(r);
    harness_dispose(&h);
}

Test(sched, requests_read_one_shared_prompt_without_copying_it_and_let_go_of_it_when_freed)
{
    struct harness h;
    harness_init(&h);
    int32_t ids[512];
    int n;
    const char *text = "Once upon a time";
    cr_assert_eq(sl_tok_encode(sl_model_tok(h.model), text, strlen(text), true, ids, 512, &n),
                 SL_OK);
    /* Two choices of one completion: one tokenized prompt, a reference each. */
    struct sl_req_prompt *pr = sl_req_prompt_copy(ids, n);
    struct sl_req_params p = {.max_tokens = 12, .temperature = 0.f, .top_p = 1.f};
    struct sl_req *r[2];
    struct result res[2];
    for (int i = 0; i < 2; i++) {
        r[i] = sl_req_new(sl_req_prompt_ref(pr), &p);
        cr_assert_eq(r[i]->prompt, sl_req_prompt_ids(pr), "the request reads the prompt given");
        cr_assert_eq(sl_req_n_prompt(r[i]), n);
    }
    cr_assert_eq(atomic_load(&pr->refs), 3);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(sl_sched_submit(h.sched, r[i], h.box), SL_OK);
        collect(&h, r[i], &res[i], false);
    }
    cr_assert_gt(res[0].n_tokens, 0);
    cr_assert_eq(res[0].text.len, res[1].text.len, "greedy over the same prompt");
    cr_assert(res[0].text.len == 0 || memcmp(res[0].text.p, res[1].text.p, res[0].text.len) == 0);
    for (int i = 0; i < 2; i++) {
        sl_str_dispose(&res[i].text);
        sl_req_unref(r[i]);
    }
    harness_dispose(&h); /* the scheduler's references are gone with it */
    cr_assert_eq(atomic_load(&pr->refs), 1, "each request let go of its reference once");
    cr_assert_eq(sl_req_prompt_ids(pr)[0], ids[0]);
    sl_req_prompt_unref(pr);
}

Test(sched, same_seed_gives_same_text_when_sampling_with_temperature)
{
    struct harness h;
    harness_init(&h);
    struct result a, b, c;
    struct sl_req *r = make_req(&h, "Once upon a time", 32, 1.0f, 1234);
    sl_sched_submit(h.sched, r, h.box);
    collect(&h, r, &a, false);
    sl_req_unref(r);
    r = make_req(&h, "Once upon a time", 32, 1.0f, 1234);
    sl_sched_submit(h.sched, r, h.box);
    collect(&h, r, &b, false);
    sl_req_unref(r);
    r = make_req(&h, "Once upon a time", 32, 1.0f, 999);
    sl_sched_submit(h.sched, r, h.box);
    collect(&h, r, &c, false);
    sl_req_unref(r);
    cr_assert_eq(a.text.len, b.text.len);
    cr_assert(a.text.len == 0 || memcmp(a.text.p, b.text.p, a.text.len) == 0);
    cr_assert(a.text.len != c.text.len || a.text.len == 0 ||
                  memcmp(a.text.p, c.text.p, a.text.len) != 0,
              "another seed samples another text");
    sl_str_dispose(&a.text);
    sl_str_dispose(&b.text);
    sl_str_dispose(&c.text);
    harness_dispose(&h);
}

Test(sched, cancel_finishes_request_early_when_client_leaves)
{
    struct harness h;
    harness_init(&h);
    /* Without its stop tokens the request can only end by LENGTH or by the cancel; held in
     * lockstep, the scheduler takes the cancel before its next step. */
    struct sl_req *r = make_req_eos(&h, "A long story", 400, 0.f, 1, true);
    hold(&h, true);
    sl_sched_submit(h.sched, r, h.box);
    struct result res;
    collect(&h, r, &res, true);
    hold(&h, false);
    cr_assert_eq(res.finish, SL_FINISH_CANCELLED, "finish %s", sl_finish_str(res.finish));
    cr_assert_eq(res.text_events, 1, "no step ran after the cancel");
    cr_assert_lt(res.n_tokens, 400);
    sl_str_dispose(&res.text);
    sl_req_unref(r);
    harness_dispose(&h);
}

Test(sched, oversized_request_gets_error_done_when_it_cannot_fit)
{
    struct harness h;
    harness_init(&h);
    struct sl_req *r = make_req(&h, "hi", 100000, 0.f, 1);
    sl_sched_submit(h.sched, r, h.box);
    struct result res;
    collect(&h, r, &res, false);
    cr_assert_eq(res.finish, SL_FINISH_ERROR);
    cr_assert_eq(res.status, SL_ERANGE);
    cr_assert_eq(res.n_tokens, 0);
    sl_req_unref(r);
    harness_dispose(&h);
}

static void *free_sched(void *arg)
{
    sl_sched_free(arg);
    return NULL;
}

Test(sched, shutdown_cancels_in_flight_requests_when_freed)
{
    struct harness h;
    harness_init(&h);
    /* The request runs (its first token is out) when the scheduler is freed on another thread.
     * Held in lockstep, it makes one token per step the test takes, so the stopper has hundreds
     * of steps to land in and no stop token can end it first: only CANCELLED may end it. */
    struct sl_req *r = make_req_eos(&h, "Never ending", 400, 0.f, 1, true);
    hold(&h, true);
    sl_sched_submit(h.sched, r, h.box);
    bool got_done = false;
    int n_text = 0;
    struct sl_out_event *e = next_events(&h);
    pthread_t stopper;
    cr_assert_eq(pthread_create(&stopper, NULL, free_sched, h.sched), 0);
    for (;;) {
        for (struct sl_out_event *next; e; e = next) {
            next = e->next;
            if (e->kind == SL_OUT_TEXT)
                n_text += e->n_tokens;
            if (e->kind == SL_OUT_DONE) {
                got_done = true;
                cr_assert_eq(e->finish, SL_FINISH_CANCELLED, "finish %s", sl_finish_str(e->finish));
                cr_assert_lt(e->n_tokens, 400);
            }
            sl_out_event_free(e);
        }
        release(&h);
        if (got_done)
            break;
        e = next_events(&h);
    }
    hold(&h, false);
    pthread_join(stopper, NULL);
    h.sched = NULL;
    cr_assert_gt(n_text, 0, "the request ran before the stop");
    sl_req_unref(r);
    harness_dispose(&h);
}

Test(sched, stats_show_the_pool_before_the_first_step_when_new)
{
    struct harness h;
    harness_init(&h);
    struct sl_sched_stats st;
    sl_sched_stats(h.sched, &st);
    cr_assert_eq(st.kv_blocks_total, 64);
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(st.steps, 0);
    cr_assert_eq(st.running, 0);
    cr_assert_eq(st.n_tiers, 1);
    harness_dispose(&h);
}

Test(sched, stats_are_published_before_a_steps_events_when_tokens_arrive)
{
    struct harness h;
    harness_init(&h);
    struct sl_req *r = make_req(&h, "A long story", 200, 0.f, 1);
    int need = (sl_req_n_prompt(r) + 200 + 15) / 16;
    cr_assert_eq(sl_sched_submit(h.sched, r, h.box), SL_OK);
    bool done = false;
    int text_events = 0, n_tokens = 0, n_seen = 0;
    while (!done) {
        int batch_text = 0, batch_tokens = 0;
        for (struct sl_out_event *e = next_events(&h), *next; e; e = next) {
            next = e->next;
            if (e->kind == SL_OUT_TEXT) {
                batch_text++;
                batch_tokens += e->n_tokens;
            } else {
                done = true;
                n_tokens = e->n_tokens;
            }
            sl_out_event_free(e);
        }
        text_events += batch_text;
        n_seen += batch_tokens;
        struct sl_sched_stats st;
        sl_sched_stats(h.sched, &st);
        /* Each TEXT event of one request comes from its own step, published before it. */
        cr_assert_geq(st.steps, (uint64_t)text_events);
        cr_assert_eq(st.kv_blocks_total, 64);
        if (done) {
            /* The step that finished it was published before its DONE. */
            cr_assert_eq(st.running, 0);
            cr_assert_eq(st.kv_blocks_used, 0);
        } else if (st.running == 1) {
            /* Blocks grow with the sequence: the prompt's and those of the positions computed
             * so far (at most one per step), never the whole length up front. */
            int n_prompt = sl_req_n_prompt(r);
            cr_assert_geq(st.kv_blocks_used, (n_prompt + n_seen - 1 + 15) / 16);
            cr_assert_leq(st.kv_blocks_used, need);
            if (st.steps < 100)
                cr_assert_lt(st.kv_blocks_used, need, "not reserved up front");
        } else {
            /* It finished after we took its events; the DONE is on its way. */
            cr_assert_eq(st.running, 0);
            cr_assert_eq(st.kv_blocks_used, 0);
        }
    }
    struct sl_sched_stats st;
    sl_sched_stats(h.sched, &st);
    cr_assert_eq(st.queued_requests, 0);
    cr_assert_eq(st.queued_prompt_tokens, 0);
    cr_assert_geq(st.steps, (uint64_t)n_tokens, "one step per token of a lone request");
    cr_assert_geq(st.last_step_rows, 1);
    cr_assert_eq(st.last_step_seqs, 1);
    cr_assert_gt(st.busy_seconds, 0.0, "forward() was timed");
    cr_assert_gt(st.busy_ratio, 0.0);
    cr_assert_leq(st.busy_ratio, 1.0);
    uint64_t q;
    cr_assert(sl_req_queue_ns(r, &q), "a request that ran has a queue time");
    sl_req_unref(r);
    harness_dispose(&h);
}

Test(sched, queue_time_is_unknown_when_the_request_never_ran)
{
    struct harness h;
    harness_init(&h);
    struct sl_req *r = make_req(&h, "hi", 100000, 0.f, 1);
    sl_sched_submit(h.sched, r, h.box);
    struct result res;
    collect(&h, r, &res, false);
    cr_assert_eq(res.finish, SL_FINISH_ERROR);
    uint64_t q;
    cr_assert(!sl_req_queue_ns(r, &q));
    sl_req_unref(r);
    harness_dispose(&h);
}

Test(sched, new_tier_table_is_in_effect_when_a_later_request_is_done)
{
    struct harness h;
    harness_init(&h);
    struct sl_sched_stats st;
    sl_sched_stats(h.sched, &st);
    cr_assert_eq(st.n_tiers, 1);
    cr_assert_str_eq(st.tiers[0].name, "default");
    struct sl_sched_tier t[2] = {
        {.name = "interactive", .priority = 0, .weight = 4, .tpot_slo_ms = 100},
        {.name = "batch", .priority = 1, .weight = 1},
    };
    cr_assert_eq(sl_sched_set_tiers(h.sched, t, 2), SL_OK);
    /* The caller's table may change at once: the scheduler took a copy. */
    snprintf(t[0].name, sizeof t[0].name, "changed");
    cr_assert_eq(sl_sched_set_tiers(h.sched, t, -1), SL_EINVAL);
    /* The inbox is first in, first out: once a later request is done, the table is applied. */
    int32_t ids[2] = {1, 42};
    struct sl_req_params p = {
        .max_tokens = 4, .top_p = 1.f, .sched_tier = {.name = "batch", .priority = 1}};
    struct sl_req *r = sl_req_new(sl_req_prompt_copy(ids, 2), &p);
    sl_sched_submit(h.sched, r, h.box);
    struct result res;
    collect(&h, r, &res, false);
    sl_sched_stats(h.sched, &st);
    cr_assert_eq(st.n_tiers, 2);
    cr_assert_str_eq(st.tiers[0].name, "interactive");
    cr_assert_str_eq(st.tiers[1].name, "batch");
    cr_assert_eq(st.tiers[1].weight, 1);
    sl_str_dispose(&res.text);
    sl_req_unref(r);
    harness_dispose(&h);
}

static void no_wake(void *arg)
{
    (void)arg;
}

Test(sched, outbox_recycles_events_empty_and_keeps_long_text_apart_when_given_back)
{
    struct sl_outbox *box = sl_outbox_new(no_wake, NULL);
    int32_t prompt[] = {1, 2, 3};
    struct sl_req_params p = {.max_tokens = 4, .temperature = 0, .top_p = 1};
    struct sl_req *r = sl_req_new(sl_req_prompt_copy(prompt, 3), &p);
    char long_text[SL_OUT_INLINE * 3];
    memset(long_text, 'x', sizeof long_text);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 4; i++) {
            struct sl_out_event *e = sl_outbox_event(box);
            cr_assert_null(e->req, "a recycled event comes back empty");
            cr_assert_null(e->text);
            cr_assert_eq(e->n_tokens, 0);
            cr_assert_eq(e->stop_index, 0);
            sl_req_ref(r);
            e->req = r;
            e->kind = SL_OUT_TEXT;
            e->n_tokens = 1 + i;
            e->stop_index = 7;
            if (i == 3)
                sl_out_event_set_text(e, long_text, sizeof long_text);
            else
                sl_out_event_set_text(e, "tok", 3);
            sl_outbox_push(box, e);
        }
        struct sl_out_event *batch = sl_outbox_take(box);
        int n = 0;
        for (struct sl_out_event *e = batch; e; e = e->next, n++) {
            cr_assert_eq(e->n_tokens, 1 + n, "in order");
            if (n == 3) {
                cr_assert_neq(e->text, e->inline_text, "long text is not inline");
                cr_assert_eq(e->len, sizeof long_text);
            } else {
                cr_assert_eq(e->text, e->inline_text, "short text travels inside its event");
                cr_assert_str_eq(e->text, "tok");
            }
        }
        cr_assert_eq(n, 4);
        sl_outbox_recycle(box, batch);
    }
    /* The outbox frees its spares without touching the request again (a double unref would free
     * r here, and the unref below would be a use after free under the sanitizers). */
    sl_outbox_free(box);
    sl_req_unref(r);
}
