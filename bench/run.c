/* The run: probes (model, prompt calibration), then arrivals or closed-loop users, warm-up,
 * retries, deadlines, progress and the stop, all on one libevent loop.
 *
 * Times: the clock is read once per callback (a read, a timer) with sl_bench_client_now(), one
 * vDSO call, not taken from libevent's cached time. The cached time is the start of the loop
 * iteration, so a busy iteration would date late sends early; reading the clock where the work
 * happens makes the generator's own delays show in its own figures (send lag, CPU time). */
#include "bench_impl.h"

#include <event2/event.h>
#include <jansson.h>

#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define BODY_CAP (1u << 20) /* most bytes kept of a response that is not an event stream */
#define BATCH 256           /* most arrivals handled in one callback before I/O gets a turn */

struct run;

struct req {
    struct sl_bench_exchange x; /* first: the client hands it back */
    struct run *run;
    uint32_t cls;
    int user; /* closed-loop user, or -1 */
    bool warmup;
    double t_sched;
    uint32_t prompt_target, output_target;
    struct sl_str wire;
    size_t rec; /* its record, once sent */
    uint16_t attempts;
    struct event *deadline, *retry_ev;
    /* the current attempt's response */
    struct sl_bench_sse sse;
    struct sl_str body;
    double now; /* the time of the bytes being handled */
    double t_first, t_last;
    uint32_t chunks;
    struct sl_bench_samples gaps_ms;
    bool done_seen, finish_seen, usage_seen, stream_err;
    uint32_t usage_prompt, usage_output, usage_cached;
    char msg[200];
    /* lists */
    struct req *prev, *next; /* in flight */
    struct req *qnext;       /* waiting for --max-concurrency, or the reap list */
};

struct source {
    struct sl_bench_arrivals arr;
    double next_t;
    bool active;
};

struct probe {
    struct sl_bench_exchange x;
    struct run *run;
    struct sl_str wire, body;
    int step;
    uint32_t words[2];
    uint32_t tokens[2];
};

struct run {
    const struct sl_bench_config *c;
    struct sl_bench_results *r;
    struct event_base *base;
    struct sl_bench_client *cl;
    int pool;
    uint64_t t0_ns;
    struct rusage ru0;
    /* generation */
    struct source *src;
    struct sl_bench_rng *len_rng, *prompt_rng; /* per class */
    struct sl_str *prefix;                     /* per class: its shared prefix text, or empty */
    uint32_t *prefix_words; /* per class: the prefix's words (--unique-prefix: each request's) */
    struct sl_bench_rng pick_rng;
    size_t trace_pos;
    uint64_t made, measured_made;
    bool meas_started;
    double meas_end; /* t_meas0 + duration, or INFINITY */
    bool gen_done, stopping;
    int users_active;
    uint64_t *class_measured; /* measured requests made, per class */
    /* requests */
    struct req *inflight;
    uint32_t n_inflight;
    struct req *wait_head, **wait_tail;
    struct req *reap;
    struct event *reap_ev, *arrival_ev, *progress_ev, *sigint_ev, *sigterm_ev;
    int interrupts;
    /* progress */
    uint64_t n_done, n_ok, n_rej, n_err, out_tokens;
    uint64_t last_done, last_tokens;
    double last_progress_t;
    bool progress, progress_tty;
    /* probes */
    struct probe probe;
    bool probe_failed;
    int rc;
};

static double now_s(struct run *run)
{
    return sl_bench_client_now(run->cl);
}

static const struct sl_bench_class *cls_of(const struct run *run, uint32_t i)
{
    return &run->c->classes[i];
}

/* ---------------------------------------------------------------------------------------------
 * Request text
 */

static const char *model_of(const struct run *run, const struct sl_bench_class *k)
{
    return k->model ? k->model : run->r->model_id;
}

/* Appends a string literal (its length known at compile time). */
#define APPEND_LIT(s, lit) sl_str_append((s), (lit), sizeof(lit) - 1)

/* The body of a request: `prefix` (text, or NULL) then `words` random words. A chat sends the
 * prefix as a system message and the words as the user's; a completion joins them with a space,
 * so the prefix's tokens are the same in every prompt. */
static void build_body(struct sl_str *b, const struct run *run, const struct sl_bench_class *k,
                       const struct sl_str *prefix, uint32_t words, uint32_t max_tokens,
                       bool stream, bool ignore_eos, struct sl_bench_rng *rng)
{
    const struct sl_bench_config *c = run->c;
    APPEND_LIT(b, "{");
    const char *model = model_of(run, k);
    if (model) {
        APPEND_LIT(b, "\"model\":\"");
        sl_str_append_json(b, model, strlen(model));
        APPEND_LIT(b, "\",");
    }
    bool pre = prefix && prefix->len;
    if (k->chat && pre) {
        APPEND_LIT(b, "\"messages\":[{\"role\":\"system\",\"content\":\"");
        sl_str_append(b, prefix->p, prefix->len);
        APPEND_LIT(b, "\"},{\"role\":\"user\",\"content\":\"");
    } else if (k->chat) {
        APPEND_LIT(b, "\"messages\":[{\"role\":\"user\",\"content\":\"");
    } else {
        APPEND_LIT(b, "\"prompt\":\"");
        if (pre) {
            sl_str_append(b, prefix->p, prefix->len);
            APPEND_LIT(b, " ");
        }
    }
    sl_bench_prompt_append(b, words, rng);
    sl_str_appendf(b, "\"%s,\"%s\":%u,\"temperature\":%g", k->chat ? "}]" : "",
                   k->chat ? "max_completion_tokens" : "max_tokens", max_tokens, k->temperature);
    if (ignore_eos)
        sl_str_appendf(b, ",\"ignore_eos\":true,\"min_tokens\":%u", max_tokens);
    if (k->service_tier)
        sl_str_appendf(b, ",\"service_tier\":\"%s\"", k->service_tier);
    if (stream)
        APPEND_LIT(b, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    if (c->extra_body && *c->extra_body)
        sl_str_appendf(b, ",%s", c->extra_body);
    APPEND_LIT(b, "}");
}

/* The request head for a body of body_len bytes, then the body. */
static void build_wire(struct sl_str *w, const struct run *run, const struct sl_bench_class *k,
                       const char *method, const char *path, const struct sl_str *body)
{
    const struct sl_bench_config *c = run->c;
    sl_str_appendf(w,
                   "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: sluice-bench/" SL_VERSION
                   "\r\nAccept: %s\r\n",
                   method, c->prefix, path, c->host, c->port,
                   body ? "text/event-stream, application/json" : "application/json");
    if (k && k->key)
        sl_str_appendf(w, "Authorization: Bearer %s\r\n", k->key);
    if (k && k->tier)
        sl_str_appendf(w, "x-sluice-tier: %s\r\n", k->tier);
    if (body)
        sl_str_appendf(w, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                       body->len);
    else
        APPEND_LIT(w, "\r\n");
    if (body)
        sl_str_append(w, body->p, body->len);
}

/* ---------------------------------------------------------------------------------------------
 * Results bookkeeping
 */

static void note_error(struct sl_bench_results *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void note_error(struct sl_bench_results *r, const char *fmt, ...)
{
    char m[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < r->n_first_error; i++)
        if (!strcmp(r->first_error[i], m))
            return;
    if (r->n_first_error < sizeof r->first_error / sizeof r->first_error[0])
        memcpy(r->first_error[r->n_first_error++], m, sizeof m);
}

static void add_admission(struct run *run, double t, int status, uint32_t cls)
{
    struct sl_bench_results *r = run->r;
    if (r->n_adm == r->cap_adm) {
        r->cap_adm = r->cap_adm ? r->cap_adm * 2 : 1024;
        r->adm = sl_xrealloc(r->adm, r->cap_adm * sizeof *r->adm);
    }
    r->adm[r->n_adm++] = (struct sl_bench_admission){.t = t, .status = status, .cls = cls};
}

static void count_chunk(struct run *run, double t)
{
    struct sl_bench_results *r = run->r;
    size_t s = t > 0 ? (size_t)t : 0;
    if (s >= r->n_seconds) {
        size_t n = s + 64;
        r->chunks_per_s = sl_xrealloc(r->chunks_per_s, n * sizeof *r->chunks_per_s);
        memset(r->chunks_per_s + r->n_seconds, 0, (n - r->n_seconds) * sizeof *r->chunks_per_s);
        r->n_seconds = n;
    }
    r->chunks_per_s[s]++;
}

/* ---------------------------------------------------------------------------------------------
 * One request's life
 */

static void check_done(struct run *run);
static void user_next(struct run *run, int user);
static void send_first(struct run *run, struct req *q, double t_ready);

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct run *run = arg;
    while (run->reap) {
        struct req *q = run->reap;
        run->reap = q->qnext;
        if (q->deadline)
            event_free(q->deadline);
        if (q->retry_ev)
            event_free(q->retry_ev);
        sl_str_dispose(&q->wire);
        sl_str_dispose(&q->body);
        sl_bench_sse_dispose(&q->sse);
        sl_bench_samples_dispose(&q->gaps_ms);
        free(q);
    }
}

static void req_free_later(struct run *run, struct req *q)
{
    q->qnext = run->reap;
    run->reap = q;
    event_active(run->reap_ev, EV_TIMEOUT, 0);
}

static void finish(struct req *q, enum sl_bench_outcome outcome, enum sl_bench_err err, int status,
                   double now)
{
    struct run *run = q->run;
    struct sl_bench_results *r = run->r;
    struct sl_bench_record *rec = &r->recs[q->rec];
    evtimer_del(q->deadline);
    evtimer_del(q->retry_ev);
    sl_bench_client_cancel(run->cl, &q->x);
    rec->outcome = outcome;
    rec->err = err;
    rec->status = status;
    rec->attempts = q->attempts;
    rec->t_end = now;
    rec->t_first = q->t_first;
    rec->chunks = q->chunks;
    rec->usage = q->usage_seen;
    rec->prompt_tokens = q->usage_seen ? q->usage_prompt : 0;
    rec->cached_tokens = q->usage_seen ? q->usage_cached : 0;
    rec->output_tokens = q->usage_seen ? q->usage_output : q->chunks;
    double sum = 0;
    for (size_t i = 0; i < q->gaps_ms.n; i++)
        sum += q->gaps_ms.v[i];
    rec->itl_sum = sum / 1000.0;
    if (!q->warmup) {
        if (outcome == SL_BENCH_OK)
            sl_bench_samples_merge(&r->itl_ms[q->cls], &q->gaps_ms);
        if (now > r->t_meas_end)
            r->t_meas_end = now;
    }
    if (outcome != SL_BENCH_OK) {
        if (outcome == SL_BENCH_REJECTED)
            note_error(r, "%s: HTTP %d%s%s", cls_of(run, q->cls)->name, status,
                       q->msg[0] ? ": " : "", q->msg);
        else
            note_error(r, "%s: %s%s%s", cls_of(run, q->cls)->name, sl_bench_err_name(err),
                       q->msg[0] ? ": " : "", q->msg);
    }
    run->n_done++;
    if (outcome == SL_BENCH_OK)
        run->n_ok++;
    else if (outcome == SL_BENCH_REJECTED)
        run->n_rej++;
    else
        run->n_err++;
    run->out_tokens += rec->output_tokens;
    /* unlink */
    if (q->prev)
        q->prev->next = q->next;
    else
        run->inflight = q->next;
    if (q->next)
        q->next->prev = q->prev;
    run->n_inflight--;
    int user = q->user;
    req_free_later(run, q);
    if (user >= 0) {
        user_next(run, user);
    } else if (run->wait_head && !run->stopping) {
        struct req *w = run->wait_head;
        run->wait_head = w->qnext;
        if (!run->wait_head)
            run->wait_tail = &run->wait_head;
        w->qnext = NULL;
        send_first(run, w, now);
    }
    check_done(run);
}

static void attempt(struct req *q)
{
    sl_bench_sse_reset(&q->sse);
    sl_str_clear(&q->body);
    q->t_first = q->t_last = 0;
    q->chunks = 0;
    q->gaps_ms.n = 0;
    q->gaps_ms.sorted = true;
    q->done_seen = q->finish_seen = q->usage_seen = q->stream_err = false;
    q->msg[0] = '\0';
    q->x.fresh_retry = false;
    sl_bench_client_submit(q->run->cl, q->run->pool, &q->x);
}

static int on_data(void *arg, const char *data, size_t len)
{
    struct req *q = arg;
    struct sl_bench_chunk ch;
    if (sl_bench_chunk_read(data, len, &ch) != SL_OK) {
        q->stream_err = true;
        snprintf(q->msg, sizeof q->msg, "%s", ch.message);
        return 1;
    }
    if (ch.done)
        q->done_seen = true;
    if (ch.error && !q->stream_err) {
        q->stream_err = true;
        snprintf(q->msg, sizeof q->msg, "%s", ch.message);
    }
    if (ch.finish)
        q->finish_seen = true;
    if (ch.usage) {
        q->usage_seen = true;
        q->usage_prompt = ch.prompt_tokens;
        q->usage_output = ch.completion_tokens;
        q->usage_cached = ch.cached_tokens;
    }
    if (ch.text) {
        if (q->chunks == 0)
            q->t_first = q->now;
        else
            sl_bench_samples_add(&q->gaps_ms, (q->now - q->t_last) * 1000.0);
        q->t_last = q->now;
        q->chunks++;
        if (!q->warmup)
            count_chunk(q->run, q->now);
    }
    return 0;
}

static void on_head(struct sl_bench_exchange *x, double now)
{
    struct req *q = (struct req *)x;
    add_admission(q->run, now, x->status, q->cls);
}

static int on_body(struct sl_bench_exchange *x, const char *p, size_t n, double now)
{
    struct req *q = (struct req *)x;
    q->now = now;
    if (x->status >= 200 && x->status < 300 && x->event_stream) {
        int rc = sl_bench_sse_feed(&q->sse, p, n, on_data, q);
        if (rc == SL_ERANGE) {
            q->stream_err = true;
            snprintf(q->msg, sizeof q->msg, "an event stream line over %u bytes", SL_BENCH_SSE_MAX);
        }
        return rc;
    }
    size_t take = q->body.len + n <= BODY_CAP ? n : BODY_CAP - q->body.len;
    sl_str_append(&q->body, p, take);
    return 0;
}

static bool retryable(const struct sl_bench_exchange *x)
{
    /* The OpenAI SDKs: x-should-retry decides when present; else 408, 409, 429 and 5xx. */
    if (x->should_retry >= 0)
        return x->should_retry == 1;
    return x->status == 408 || x->status == 409 || x->status == 429 || x->status >= 500;
}

static void retry_later(struct req *q, double retry_after)
{
    struct run *run = q->run;
    double wait;
    if (retry_after > 0 && retry_after <= 60) {
        wait = retry_after;
    } else {
        /* The SDKs' backoff: 0.5 s doubling to 8 s, less up to 25 % jitter. */
        wait = 0.5 * pow(2.0, q->attempts - 1);
        if (wait > 8)
            wait = 8;
        wait *= 1.0 - 0.25 * sl_bench_rng_uniform(&run->pick_rng);
    }
    run->r->retries++;
    struct timeval tv = {.tv_sec = (time_t)wait,
                         .tv_usec = (suseconds_t)((wait - floor(wait)) * 1e6)};
    evtimer_add(q->retry_ev, &tv);
}

static void error_message(struct req *q)
{
    if (q->msg[0] || !q->body.len)
        return;
    json_t *o = json_loadb(q->body.p, q->body.len, 0, NULL);
    json_t *e = json_object_get(o, "error");
    json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
    if (json_is_string(m))
        snprintf(q->msg, sizeof q->msg, "%s", json_string_value(m));
    json_decref(o);
}

static void on_done(struct sl_bench_exchange *x, enum sl_bench_err err, const char *why, double now)
{
    struct req *q = (struct req *)x;
    const struct sl_bench_config *c = q->run->c;
    bool retries_left = q->attempts <= c->max_retries;
    if (err != SL_BENCH_ERR_NONE) {
        if (err == SL_BENCH_ERR_STREAM) {
            finish(q, SL_BENCH_ERROR, err, x->status, now);
        } else if (retries_left && !q->run->stopping) {
            retry_later(q, -1);
        } else {
            if (!q->msg[0] && why)
                snprintf(q->msg, sizeof q->msg, "%s", why);
            finish(q, SL_BENCH_ERROR, err, x->status, now);
        }
        return;
    }
    if (x->status >= 200 && x->status < 300) {
        if (x->event_stream) {
            if (q->stream_err)
                finish(q, SL_BENCH_ERROR, SL_BENCH_ERR_STREAM, x->status, now);
            else if (q->done_seen || q->finish_seen || q->usage_seen)
                finish(q, SL_BENCH_OK, SL_BENCH_ERR_NONE, x->status, now);
            else
                finish(q, SL_BENCH_ERROR, SL_BENCH_ERR_TRUNCATED, x->status, now);
            return;
        }
        /* A whole JSON response (a server that does not stream): its end is its first token. */
        struct sl_bench_chunk ch;
        if (sl_bench_chunk_read(q->body.p ? q->body.p : "", q->body.len, &ch) != SL_OK ||
            ch.error) {
            snprintf(q->msg, sizeof q->msg, "%s", ch.message);
            finish(q, SL_BENCH_ERROR, SL_BENCH_ERR_STREAM, x->status, now);
            return;
        }
        q->t_first = now;
        q->chunks = ch.text ? 1 : 0;
        q->usage_seen = ch.usage;
        q->usage_prompt = ch.prompt_tokens;
        q->usage_output = ch.completion_tokens;
        q->usage_cached = ch.cached_tokens;
        finish(q, SL_BENCH_OK, SL_BENCH_ERR_NONE, x->status, now);
        return;
    }
    error_message(q);
    if (retryable(x) && retries_left && !q->run->stopping) {
        retry_later(q, x->retry_after);
    } else {
        q->run->r->recs[q->rec].retry_after = x->retry_after >= 0;
        finish(q, SL_BENCH_REJECTED, SL_BENCH_ERR_NONE, x->status, now);
    }
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct req *q = arg;
    q->attempts++;
    attempt(q);
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct req *q = arg;
    snprintf(q->msg, sizeof q->msg, "no complete response within %g s", q->run->c->timeout_s);
    finish(q, SL_BENCH_ERROR, SL_BENCH_ERR_TIMEOUT, q->x.status, now_s(q->run));
}

static struct req *req_new(struct run *run, uint32_t cls, double t_sched, bool warmup,
                           uint32_t prompt_target, uint32_t output_target, int user)
{
    const struct sl_bench_class *k = cls_of(run, cls);
    struct req *q = sl_xcalloc(1, sizeof *q);
    q->run = run;
    q->cls = cls;
    q->user = user;
    q->warmup = warmup;
    q->t_sched = t_sched;
    q->prompt_target = prompt_target;
    q->output_target = output_target;
    q->x.on_head = on_head;
    q->x.on_body = on_body;
    q->x.on_done = on_done;
    sl_str_init(&q->wire);
    sl_str_init(&q->body);
    sl_bench_sse_init(&q->sse);
    sl_bench_samples_init(&q->gaps_ms);
    struct sl_str body, own;
    sl_str_init(&body);
    sl_str_init(&own);
    const struct sl_str *prefix = &run->prefix[cls];
    if (run->c->unique_prefix && run->prefix_words[cls]) {
        sl_bench_prompt_append(&own, run->prefix_words[cls], &run->prompt_rng[cls]);
        prefix = &own;
    }
    uint32_t words = sl_bench_prompt_words(&run->r->calib[k->chat ? 1 : 0], prompt_target);
    build_body(&body, run, k, prefix, words, output_target, true, k->ignore_eos,
               &run->prompt_rng[cls]);
    build_wire(&q->wire, run, k, "POST", k->path, &body);
    sl_str_dispose(&body);
    sl_str_dispose(&own);
    q->x.wire = q->wire.p;
    q->x.wire_len = q->wire.len;
    q->deadline = evtimer_new(run->base, deadline_cb, q);
    q->retry_ev = evtimer_new(run->base, retry_cb, q);
    return q;
}

static void send_first(struct run *run, struct req *q, double t_ready)
{
    struct sl_bench_results *r = run->r;
    double now = now_s(run);
    if (r->n_recs == r->cap_recs) {
        r->cap_recs = r->cap_recs ? r->cap_recs * 2 : 1024;
        r->recs = sl_xrealloc(r->recs, r->cap_recs * sizeof *r->recs);
    }
    q->rec = r->n_recs++;
    struct sl_bench_record *rec = &r->recs[q->rec];
    memset(rec, 0, sizeof *rec);
    rec->cls = q->cls;
    rec->id = (uint32_t)q->rec;
    rec->warmup = q->warmup;
    rec->t_sched = q->t_sched;
    rec->t_ready = t_ready;
    rec->t_sent = now;
    rec->prompt_target = q->prompt_target;
    rec->output_target = q->output_target;
    rec->outcome = SL_BENCH_ERROR; /* until finish() says otherwise */
    rec->err = SL_BENCH_ERR_CANCELLED;
    sl_bench_samples_add(&r->lag_ms, (now - t_ready) * 1000.0);
    if (run->c->max_concurrency)
        sl_bench_samples_add(&r->queue_ms, (t_ready - q->t_sched) * 1000.0);
    q->next = run->inflight;
    if (q->next)
        q->next->prev = q;
    run->inflight = q;
    if (++run->n_inflight > r->peak_in_flight)
        r->peak_in_flight = run->n_inflight;
    if (run->c->timeout_s > 0) {
        double t = run->c->timeout_s;
        struct timeval tv = {.tv_sec = (time_t)t, .tv_usec = (suseconds_t)((t - floor(t)) * 1e6)};
        evtimer_add(q->deadline, &tv);
    }
    q->attempts = 1;
    attempt(q);
    rec->reused = q->x.reused;
}

static void admit(struct run *run, struct req *q)
{
    if (run->c->max_concurrency && run->n_inflight >= (uint32_t)run->c->max_concurrency) {
        q->qnext = NULL;
        *run->wait_tail = q;
        run->wait_tail = &q->qnext;
        return;
    }
    send_first(run, q, q->t_sched);
}

/* ---------------------------------------------------------------------------------------------
 * Generation
 */

enum take { TAKE_OK, TAKE_CLASS_DONE, TAKE_ALL_DONE };

/* May a request of class cls be made for time t? Sets *warmup. Warm-up requests (the first
 * --num-warmups, or those due before --warmup seconds) are outside every cap. */
static enum take gen_take(struct run *run, uint32_t cls, double t, bool *warmup)
{
    const struct sl_bench_config *c = run->c;
    if (run->stopping)
        return TAKE_ALL_DONE;
    *warmup = run->made < (uint64_t)c->num_warmups || t < c->warmup_s;
    if (*warmup)
        return TAKE_OK;
    if (c->num_requests && run->measured_made >= (uint64_t)c->num_requests)
        return TAKE_ALL_DONE;
    if (run->meas_started && t >= run->meas_end)
        return TAKE_ALL_DONE;
    long cap = cls_of(run, cls)->max_requests;
    if (cap && run->class_measured[cls] >= (uint64_t)cap)
        return TAKE_CLASS_DONE;
    return TAKE_OK;
}

/* Counts a request that gen_take allowed. */
static void gen_count(struct run *run, uint32_t cls, double t, bool warmup)
{
    const struct sl_bench_config *c = run->c;
    run->made++;
    if (warmup)
        return;
    if (!run->meas_started) {
        run->meas_started = true;
        run->r->t_meas0 = c->warmup_s > 0 ? c->warmup_s : t;
        run->meas_end = c->duration_s > 0 ? run->r->t_meas0 + c->duration_s : INFINITY;
    }
    run->measured_made++;
    run->class_measured[cls]++;
}

static void stop_generation(struct run *run)
{
    run->stopping = true;
    if (run->src)
        for (size_t i = 0; i < run->c->n_classes; i++)
            run->src[i].active = false;
    /* Requests waiting for --max-concurrency were never sent: drop them. */
    while (run->wait_head) {
        struct req *w = run->wait_head;
        run->wait_head = w->qnext;
        req_free_later(run, w);
    }
    run->wait_tail = &run->wait_head;
}

static void arm(struct event *ev, double seconds)
{
    if (!(seconds > 0))
        seconds = 0;
    struct timeval tv = {.tv_sec = (time_t)seconds,
                         .tv_usec = (suseconds_t)((seconds - floor(seconds)) * 1e6)};
    evtimer_add(ev, &tv);
}

static void make_open(struct run *run, uint32_t cls, double t, bool warmup, uint32_t prompt,
                      uint32_t output)
{
    gen_count(run, cls, t, warmup);
    admit(run, req_new(run, cls, t, warmup, prompt, output, -1));
}

/* Open loop and trace replay: make every request that is due, then sleep until the next. */
static void arrivals_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct run *run = arg;
    const struct sl_bench_config *c = run->c;
    double now = now_s(run);
    for (int budget = BATCH;; budget--) {
        uint32_t cls;
        double t;
        const struct sl_bench_trace_entry *e = NULL;
        if (c->trace) {
            if (run->stopping || run->trace_pos == c->n_trace)
                break;
            e = &c->trace[run->trace_pos];
            cls = e->cls;
            t = e->t / c->trace_speed;
        } else {
            int best = -1;
            for (size_t i = 0; i < c->n_classes; i++)
                if (run->src[i].active && (best < 0 || run->src[i].next_t < run->src[best].next_t))
                    best = (int)i;
            if (best < 0)
                break;
            cls = (uint32_t)best;
            t = run->src[cls].next_t;
        }
        if (t > now) {
            arm(run->arrival_ev, t - now);
            return;
        }
        if (budget == 0) {
            arm(run->arrival_ev, 0); /* let the loop read sockets, then go on */
            return;
        }
        bool warmup = false;
        enum take tk = gen_take(run, cls, t, &warmup);
        if (tk == TAKE_ALL_DONE)
            break;
        if (c->trace) {
            run->trace_pos++;
            if (tk == TAKE_OK)
                make_open(run, cls, t, warmup, e->prompt_tokens, e->output_tokens);
            continue;
        }
        struct source *s = &run->src[cls];
        if (tk == TAKE_CLASS_DONE) {
            s->active = false;
            continue;
        }
        const struct sl_bench_class *k = cls_of(run, cls);
        uint32_t prompt = sl_bench_len_sample(&k->prompt, &run->len_rng[cls]);
        uint32_t output = sl_bench_len_sample(&k->output, &run->len_rng[cls]);
        make_open(run, cls, t, warmup, prompt, output);
        s->next_t = sl_bench_arrivals_next(&s->arr);
    }
    run->gen_done = true;
    check_done(run);
}

/* Closed loop: user u sends its next request, or retires. */
static void user_next(struct run *run, int user)
{
    const struct sl_bench_config *c = run->c;
    double now = now_s(run);
    for (;;) {
        if (run->stopping)
            break;
        /* Pick a class by weight among those not at their cap. */
        double total = 0;
        for (size_t i = 0; i < c->n_classes; i++) {
            long cap = c->classes[i].max_requests;
            if (!cap || run->class_measured[i] < (uint64_t)cap)
                total += c->classes[i].weight;
        }
        if (total <= 0)
            break;
        double x = sl_bench_rng_uniform(&run->pick_rng) * total;
        uint32_t cls = 0;
        for (size_t i = 0; i < c->n_classes; i++) {
            long cap = c->classes[i].max_requests;
            if (cap && run->class_measured[i] >= (uint64_t)cap)
                continue;
            cls = (uint32_t)i;
            if ((x -= c->classes[i].weight) < 0)
                break;
        }
        bool warmup = false;
        enum take tk = gen_take(run, cls, now, &warmup);
        if (tk == TAKE_ALL_DONE)
            break;
        if (tk == TAKE_CLASS_DONE)
            continue; /* cannot happen: capped classes were left out */
        const struct sl_bench_class *k = cls_of(run, cls);
        uint32_t prompt = sl_bench_len_sample(&k->prompt, &run->len_rng[cls]);
        uint32_t output = sl_bench_len_sample(&k->output, &run->len_rng[cls]);
        gen_count(run, cls, now, warmup);
        send_first(run, req_new(run, cls, now, warmup, prompt, output, user), now);
        return;
    }
    run->users_active--;
    if (run->users_active == 0)
        run->gen_done = true;
}

static void check_done(struct run *run)
{
    if (run->gen_done && run->n_inflight == 0 && !run->wait_head)
        event_base_loopexit(run->base, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Progress and signals
 */

static void progress_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct run *run = arg;
    double now = now_s(run);
    double dt = now - run->last_progress_t;
    double rps = dt > 0 ? (double)(run->n_done - run->last_done) / dt : 0;
    double tps = dt > 0 ? (double)(run->out_tokens - run->last_tokens) / dt : 0;
    run->last_done = run->n_done;
    run->last_tokens = run->out_tokens;
    run->last_progress_t = now;
    fprintf(stderr,
            "%s%7.1f s  sent %llu  done %llu  in flight %u  ok %llu  rejected %llu  errors %llu"
            "  |  %.1f req/s  %.0f tok/s%s",
            run->progress_tty ? "\r\033[K" : "", now, (unsigned long long)run->r->n_recs,
            (unsigned long long)run->n_done, run->n_inflight, (unsigned long long)run->n_ok,
            (unsigned long long)run->n_rej, (unsigned long long)run->n_err, rps, tps,
            run->progress_tty ? "" : "\n");
    fflush(stderr);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    struct run *run = arg;
    run->r->interrupted = true;
    if (++run->interrupts == 1) {
        fprintf(stderr,
                "%ssluice-bench: %s: no new requests; waiting for %u in flight "
                "(again to abandon them)\n",
                run->progress_tty ? "\r\033[K" : "", sig == SIGINT ? "interrupted" : "terminated",
                run->n_inflight);
        stop_generation(run);
        run->gen_done = true;
        check_done(run);
        return;
    }
    stop_generation(run);
    double now = now_s(run);
    while (run->inflight) {
        struct req *q = run->inflight;
        snprintf(q->msg, sizeof q->msg, "abandoned by a second interrupt");
        finish(q, SL_BENCH_ERROR, SL_BENCH_ERR_CANCELLED, q->x.status, now);
    }
    run->gen_done = true;
    check_done(run);
}

/* ---------------------------------------------------------------------------------------------
 * Probes: the model's name, then prompt calibration, one request at a time
 */

static void start_main(struct run *run);
static void probe_next(struct run *run);

/* Which probe comes at step s: 0 is GET /v1/models; 1-2 and 3-4 calibrate completions and chat
 * with two prompt lengths each; 5 and 6 measure the shared prefix of the first completions and
 * chat class that has one. */
static const struct sl_bench_class *probe_class(const struct run *run, int kind, bool prefix)
{
    for (size_t i = 0; i < run->c->n_classes; i++)
        if (run->c->classes[i].chat == kind && (!prefix || run->c->classes[i].shared_prefix))
            return &run->c->classes[i];
    return NULL;
}

static void probe_on_head(struct sl_bench_exchange *x, double now)
{
    (void)x;
    (void)now;
}

static int probe_on_body(struct sl_bench_exchange *x, const char *p, size_t n, double now)
{
    (void)now;
    struct probe *pr = (struct probe *)x;
    size_t take = pr->body.len + n <= BODY_CAP ? n : BODY_CAP - pr->body.len;
    sl_str_append(&pr->body, p, take);
    return 0;
}

static void probe_on_done(struct sl_bench_exchange *x, enum sl_bench_err err, const char *why,
                          double now)
{
    (void)now;
    struct probe *pr = (struct probe *)x;
    struct run *run = pr->run;
    const struct sl_bench_config *c = run->c;
    if (err == SL_BENCH_ERR_CONNECT) {
        fprintf(stderr, "sluice-bench: cannot reach %s: %s\n", c->url, why ? why : "");
        run->rc = SL_EIO;
        event_base_loopexit(run->base, NULL);
        return;
    }
    json_t *o = err == SL_BENCH_ERR_NONE && pr->body.len
                    ? json_loadb(pr->body.p, pr->body.len, 0, NULL)
                    : NULL;
    if (pr->step == 0) {
        json_t *id = json_object_get(json_array_get(json_object_get(o, "data"), 0), "id");
        if (x->status == 200 && json_is_string(id)) {
            run->r->model_id = sl_xstrdup(json_string_value(id));
        } else if (!c->quiet) {
            fprintf(stderr,
                    "sluice-bench: GET /v1/models gave %d; requests carry no \"model\" (use "
                    "--model)\n",
                    x->status);
        }
    } else if (pr->step >= 5) {
        /* The prefix's tokens: the whole prompt's, less the calibration's tokens for the rest
         * (its intercept and one word). */
        struct sl_bench_calib *k = &run->r->calib[pr->step - 5];
        json_t *pt = json_object_get(json_object_get(o, "usage"), "prompt_tokens");
        double tokens = json_is_integer(pt) ? (double)json_integer_value(pt) : 0;
        double prefix = tokens - k->intercept - k->slope;
        if (x->status == 200 && prefix >= 1)
            k->prefix_slope = prefix / pr->words[0];
        else if (!c->quiet)
            fprintf(stderr,
                    "sluice-bench: shared prefix probe (%s) gave %d; its words follow the "
                    "calibration\n",
                    pr->step == 6 ? "chat" : "completions", x->status);
    } else {
        int kind = (pr->step - 1) / 2, i = (pr->step - 1) % 2;
        json_t *pt = json_object_get(json_object_get(o, "usage"), "prompt_tokens");
        if (x->status == 200 && json_is_integer(pt)) {
            pr->tokens[i] = (uint32_t)json_integer_value(pt);
            if (i == 1) {
                struct sl_bench_calib *k = &run->r->calib[kind];
                double slope =
                    ((double)pr->tokens[1] - pr->tokens[0]) / ((double)pr->words[1] - pr->words[0]);
                if (slope > 0.1 && slope < 20) {
                    k->slope = slope;
                    k->intercept = pr->tokens[0] - slope * pr->words[0];
                    k->measured = true;
                }
            }
        } else {
            if (!c->quiet)
                fprintf(stderr,
                        "sluice-bench: prompt calibration (%s) gave %d; assuming one token per "
                        "word\n",
                        kind ? "chat" : "completions", x->status);
            pr->step += 1 - i; /* skip the other length */
        }
    }
    json_decref(o);
    pr->step++;
    probe_next(run);
}

static void probe_next(struct run *run)
{
    struct probe *pr = &run->probe;
    const struct sl_bench_config *c = run->c;
    for (; pr->step <= 6; pr->step++) {
        sl_str_clear(&pr->wire);
        sl_str_clear(&pr->body);
        if (pr->step == 0) {
            if (c->model || c->classes[0].model)
                continue;
            build_wire(&pr->wire, run, &c->classes[0], "GET", "/v1/models", NULL);
        } else if (pr->step >= 5) {
            int kind = pr->step - 5;
            const struct sl_bench_class *k = probe_class(run, kind, true);
            if (!c->calibrate || !k || !run->r->calib[kind].measured)
                continue;
            /* A request as the run will send it, with one word of its own. */
            struct sl_str prefix, body;
            sl_str_init(&prefix);
            sl_str_init(&body);
            pr->words[0] = sl_bench_prefix_words(&run->r->calib[kind], (uint32_t)k->shared_prefix);
            sl_bench_prefix_append(&prefix, pr->words[0], c->seed);
            struct sl_bench_rng rng;
            sl_bench_rng_seed(&rng, c->seed, 0xca1b + (uint64_t)pr->step);
            build_body(&body, run, k, &prefix, 1, 1, false, false, &rng);
            build_wire(&pr->wire, run, k, "POST", k->path, &body);
            sl_str_dispose(&body);
            sl_str_dispose(&prefix);
        } else {
            int kind = (pr->step - 1) / 2, i = (pr->step - 1) % 2;
            const struct sl_bench_class *k = probe_class(run, kind, false);
            if (!c->calibrate || !k) {
                pr->step += 1 - i;
                continue;
            }
            struct sl_str body;
            sl_str_init(&body);
            struct sl_bench_rng rng;
            sl_bench_rng_seed(&rng, c->seed, 0xca1b + (uint64_t)pr->step);
            build_body(&body, run, k, NULL, pr->words[i], 1, false, false, &rng);
            build_wire(&pr->wire, run, k, "POST", k->path, &body);
            sl_str_dispose(&body);
        }
        pr->x.wire = pr->wire.p;
        pr->x.wire_len = pr->wire.len;
        sl_bench_client_submit(run->cl, run->pool, &pr->x);
        return;
    }
    start_main(run);
}

/* ---------------------------------------------------------------------------------------------
 * The main phase
 */

static void start_main(struct run *run)
{
    const struct sl_bench_config *c = run->c;
    /* The prefix's words follow the calibration, which ended just now. */
    for (size_t i = 0; i < c->n_classes; i++) {
        const struct sl_bench_class *k = &c->classes[i];
        run->prefix_words[i] =
            sl_bench_prefix_words(&run->r->calib[k->chat ? 1 : 0], (uint32_t)k->shared_prefix);
        if (!c->unique_prefix)
            sl_bench_prefix_append(&run->prefix[i], run->prefix_words[i], c->seed);
    }
    run->t0_ns = sl_clock_ns();
    sl_bench_client_set_t0(run->cl, run->t0_ns);
    getrusage(RUSAGE_SELF, &run->ru0);
    if (run->progress) {
        struct timeval tv = {.tv_sec = 1};
        event_add(run->progress_ev, &tv);
    }
    if (c->concurrency) {
        run->users_active = c->concurrency;
        for (int u = 0; u < c->concurrency && !run->stopping; u++)
            user_next(run, u);
        check_done(run);
        return;
    }
    if (!c->trace) {
        run->src = sl_xcalloc(c->n_classes, sizeof *run->src);
        for (size_t i = 0; i < c->n_classes; i++) {
            struct source *s = &run->src[i];
            sl_bench_arrivals_init(&s->arr, &c->classes[i].arrival, c->classes[i].rate, c->seed,
                                   0xa000 + i);
            s->next_t = sl_bench_arrivals_next(&s->arr);
            s->active = true;
        }
    }
    arm(run->arrival_ev, 0);
}

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static double tv_s(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

int sl_bench_run(const struct sl_bench_config *c, struct sl_bench_results *r)
{
    raise_fd_limit();
    struct run run_s, *run = &run_s;
    memset(run, 0, sizeof *run);
    run->c = c;
    run->r = r;
    run->wait_tail = &run->wait_head;
    run->meas_end = INFINITY;
    for (int k = 0; k < 2; k++)
        r->calib[k] = (struct sl_bench_calib){.slope = 1, .intercept = 0};
    r->itl_ms = sl_xcalloc(c->n_classes, sizeof *r->itl_ms);
    for (size_t i = 0; i < c->n_classes; i++)
        sl_bench_samples_init(&r->itl_ms[i]);
    sl_bench_samples_init(&r->lag_ms);
    sl_bench_samples_init(&r->queue_ms);
    run->class_measured = sl_xcalloc(c->n_classes, sizeof *run->class_measured);
    run->len_rng = sl_xcalloc(c->n_classes, sizeof *run->len_rng);
    run->prompt_rng = sl_xcalloc(c->n_classes, sizeof *run->prompt_rng);
    run->prefix = sl_xcalloc(c->n_classes, sizeof *run->prefix);
    run->prefix_words = sl_xcalloc(c->n_classes, sizeof *run->prefix_words);
    for (size_t i = 0; i < c->n_classes; i++) {
        sl_bench_rng_seed(&run->len_rng[i], c->seed, 0x1e00 + i);
        sl_bench_rng_seed(&run->prompt_rng[i], c->seed, 0x9000 + i);
        sl_str_init(&run->prefix[i]);
    }
    sl_bench_rng_seed(&run->pick_rng, c->seed, 0x7c);
    run->progress_tty = isatty(2);
    run->progress = c->progress == 1 || (c->progress < 0 && run->progress_tty);

    /* One thread and precise timers: arrivals are scheduled to the microsecond (timerfd), not
     * rounded up to epoll's milliseconds. */
    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_NOLOCK);
    event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    run->base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    if (!run->base) {
        fprintf(stderr, "sluice-bench: cannot create an event loop\n");
        return SL_EIO;
    }
    run->cl = sl_bench_client_new(run->base, sl_clock_ns());
    char err[300];
    run->pool = sl_bench_client_pool(run->cl, c->host, c->port, err, sizeof err);
    if (run->pool < 0) {
        fprintf(stderr, "sluice-bench: %s\n", err);
        sl_bench_client_free(run->cl);
        event_base_free(run->base);
        return SL_ENOENT;
    }
    run->reap_ev = event_new(run->base, -1, 0, reap_cb, run);
    run->arrival_ev = evtimer_new(run->base, arrivals_cb, run);
    run->progress_ev = event_new(run->base, -1, EV_PERSIST, progress_cb, run);
    run->sigint_ev = evsignal_new(run->base, SIGINT, signal_cb, run);
    run->sigterm_ev = evsignal_new(run->base, SIGTERM, signal_cb, run);
    event_add(run->sigint_ev, NULL);
    event_add(run->sigterm_ev, NULL);

    struct probe *pr = &run->probe;
    pr->run = run;
    pr->x.on_head = probe_on_head;
    pr->x.on_body = probe_on_body;
    pr->x.on_done = probe_on_done;
    pr->words[0] = 16;
    pr->words[1] = 80;
    sl_str_init(&pr->wire);
    sl_str_init(&pr->body);
    probe_next(run);

    event_base_dispatch(run->base);

    double end = now_s(run);
    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);
    r->wall_s = end;
    r->cpu_user_s = tv_s(ru1.ru_utime) - tv_s(run->ru0.ru_utime);
    r->cpu_sys_s = tv_s(ru1.ru_stime) - tv_s(run->ru0.ru_stime);
    if (!run->meas_started)
        r->t_meas0 = r->t_meas_end = 0;
    sl_bench_client_counts(run->cl, &r->conns_opened, &r->conns_reused, &r->conns_failed);
    if (run->progress && run->progress_tty)
        fprintf(stderr, "\r\033[K");

    /* Tear down: whatever is still in flight (an early exit) is abandoned and counted so. */
    stop_generation(run);
    while (run->inflight) {
        struct req *q = run->inflight;
        snprintf(q->msg, sizeof q->msg, "abandoned at exit");
        finish(q, SL_BENCH_ERROR, SL_BENCH_ERR_CANCELLED, q->x.status, end);
    }
    reap_cb(-1, 0, run);
    sl_bench_client_free(run->cl);
    event_free(run->reap_ev);
    event_free(run->arrival_ev);
    event_free(run->progress_ev);
    event_free(run->sigint_ev);
    event_free(run->sigterm_ev);
    event_base_free(run->base);
    sl_str_dispose(&pr->wire);
    sl_str_dispose(&pr->body);
    free(run->src);
    free(run->class_measured);
    free(run->len_rng);
    free(run->prompt_rng);
    for (size_t i = 0; i < c->n_classes; i++)
        sl_str_dispose(&run->prefix[i]);
    free(run->prefix);
    free(run->prefix_words);
    return run->rc;
}

void sl_bench_results_dispose(struct sl_bench_results *r, size_t n_classes)
{
    free(r->recs);
    if (r->itl_ms)
        for (size_t i = 0; i < n_classes; i++)
            sl_bench_samples_dispose(&r->itl_ms[i]);
    free(r->itl_ms);
    free(r->adm);
    free(r->chunks_per_s);
    sl_bench_samples_dispose(&r->lag_ms);
    sl_bench_samples_dispose(&r->queue_ms);
    free(r->model_id);
    memset(r, 0, sizeof *r);
}

const char *sl_bench_err_name(enum sl_bench_err e)
{
    switch (e) {
    case SL_BENCH_ERR_NONE: return "none";
    case SL_BENCH_ERR_CONNECT: return "connect";
    case SL_BENCH_ERR_CLOSED: return "closed";
    case SL_BENCH_ERR_HTTP: return "http";
    case SL_BENCH_ERR_TIMEOUT: return "timeout";
    case SL_BENCH_ERR_STREAM: return "stream";
    case SL_BENCH_ERR_TRUNCATED: return "truncated";
    case SL_BENCH_ERR_CANCELLED: return "cancelled";
    case SL_BENCH_ERR_COUNT: break;
    }
    return "?";
}
