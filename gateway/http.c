/* The HTTP/1.1 front end: listeners, I/O threads, connections, routes. The request parser is
 * gateway/http/parser.c, the status mapping gateway/http/status.c.
 *
 * Each I/O thread owns an event_base, its own SO_REUSEPORT listener (the kernel spreads
 * connections over them) and every connection it accepted, so no per-connection state is shared
 * between threads. The only thing other threads touch is the thread's outbox, whose wake-up is an
 * event_active() on this base; the thread then takes the whole batch and routes each event to the
 * connection named by sl_req_user().
 *
 * A connection serves one request at a time: while a request is queued or streaming, the next
 * request's bytes wait in the input buffer (reading stays enabled up to a high-water mark so a
 * client that hangs up is still noticed and its request cancelled). Responses leave in request
 * order; the next pipelined request is taken up once the output queued for the client is below
 * write_high_water_bytes.
 *
 * Plain sockets are read and written by the loop itself: the answers to what one read completed
 * leave right after it in one writev, and output queued elsewhere (tokens from the scheduler) at
 * the end of the iteration for every connection that has some (a flush list), so a response
 * usually leaves without the loop ever waiting for the socket to become writable; only what the
 * kernel does not take is left to the bufferevent's write event. TLS connections read and write
 * through bufferevent_openssl.
 *
 * Every connection is bounded: a deadline while it reads a request (enum conn_timer), a write
 * timeout while the client does not read, max_connections, and for streams a high-water mark
 * and a hard cap on what waits for the client. A drain (SIGTERM) closes the listeners, refuses
 * requests that start afterwards and waits for the responses in progress (conn->busy).
 */
#include "gateway_impl.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Bytes a connection buffers from the socket while its current request is being answered. */
#define READ_HIGH_WATER (64 << 10)
/* Access-log bytes an I/O thread buffers before writing them out within an iteration. */
#define LOG_FLUSH_BYTES (16 << 10)
/* After a drain timed out and requests were cancelled, how long their error answers may take. */
#define DRAIN_CANCEL_GRACE_MS 2000
/* After an error answer, input discarded (at most, and for at most LINGER_SECS) so that the
 * close does not reset the connection before the client has read the answer. */
#define LINGER_MAX_BYTES (4 << 20)
#define LINGER_SECS 2

/* ---------------------------------------------------------------------------------------------
 * Server, I/O threads and connections
 */

struct io;

enum conn_state {
    CONN_READING,  /* parsing a request */
    CONN_WAITING,  /* a completion is queued or streaming */
    CONN_FLUSHING, /* the whole response is queued; waiting for it to drain */
    CONN_LINGER,   /* an error was answered and the write side shut; discarding input */
};

/* Which deadline a connection's timer stands for while it reads a request. */
enum conn_timer {
    TIMER_NONE,
    TIMER_HEAD,   /* header_timeout_ms from the request's first byte (or the accept) */
    TIMER_BODY,   /* header_timeout_ms since the last piece of the body */
    TIMER_IDLE,   /* idle_timeout_ms between kept-alive requests */
    TIMER_LINGER, /* LINGER_SECS of discarding input after an error answer */
};

/* One choice of the completion in flight (OpenAI's n: each its own sequence). */
struct choice {
    struct sl_req *req; /* the connection's reference, until the whole request ends */
    bool done;          /* its end arrived (finish) */
    enum sl_finish finish;
    int n_gen;          /* tokens received so far */
    bool echo_pending;  /* streaming with echo: text holds the prompt, its first chunk */
    struct sl_str text; /* non-streaming: the text so far (the prompt first with echo) */
    struct sl_str held; /* stream text held back while the client is behind (valid UTF-8) */
    /* Log probabilities, when the request asked for them: every token's (non-streaming), or
     * those not sent yet (streaming: of held text, or of tokens whose text is still to come). */
    struct sl_token_logprobs *lp;
    int n_lp, cap_lp;
    size_t lp_offset; /* streaming completions: the next token's text_offset */
};

struct conn {
    struct io *io;
    /* The configuration of the current request (a reference): the I/O thread's when the request
     * started, kept to its end whatever a reload does meanwhile. */
    struct sl_config *cfg;
    struct conn *prev, *next; /* io->conns, or io->dead once closed */
    struct bufferevent *bev;
    struct sl_http_parser req;
    enum conn_state state;
    bool closed;     /* waiting to be reaped; no callback may touch it any more */
    bool keep_alive; /* serve another request after this response */
    bool linger;     /* after this response, shut the write side and drain */
    bool sent_continue;
    size_t lingered; /* bytes discarded while lingering */
    /* conn_head's lookup of the current request's key, in cfg: route() takes the tenant from
     * here rather than hashing the key again. */
    bool head_keyed;
    const struct sl_tenant *head_tenant;

    /* Transport. */
    bool tls;                /* a bufferevent_openssl; otherwise the loop writes the socket */
    bool counted;            /* counts towards max_connections */
    bool busy;               /* a response is in progress (what a drain waits for) */
    bool flush_queued;       /* on io->flush */
    struct conn *flush_next; /* io->flush */
    struct event *read_ev;   /* plain sockets: the loop reads them itself (see conn_on_readable) */
    bool read_paused;        /* read_ev is off: READ_HIGH_WATER bytes wait, or EOF was seen */
    bool read_eof;           /* the client shut its side (or the read failed) */
    struct event *timer;     /* the read deadline, see enum conn_timer */
    enum conn_timer timer_kind; /* what the timer stands for; TIMER_NONE when not pending */

    /* The completion in flight: its n_ch choices (n_ch > 0 while queued or streaming), each a
     * sequence of its own on replica `replica` of engines[engine], n_live of them not done. */
    struct choice *ch;
    int n_ch, cap_ch, n_live;
    struct sl_openai_ident ident;
    int n_prompt;
    bool stream, include_usage, chunked, head_sent;
    bool want_lp; /* the request asked for log probabilities */

    /* For the access log of the current request. */
    uint64_t t_start_ns, t_first_ns; /* parsed; first token out */
    int status;                      /* HTTP status sent */
    int n_gen;                       /* tokens received so far, all choices together */
    bool logged;
    /* Who sent the current request and its tier (an index into cfg->tiers, -1 until
     * classified); both point into cfg. NULL: not authenticated (yet). */
    const struct sl_tenant *tenant;
    int tier;

    /* For /metrics: an inference request (counted in sluice:requests_total at its end) and when
     * its latest text arrived. */
    bool inference;
    uint64_t t_text_ns;

    /* Admission: the decision on the current completion, the model it runs on, and while a
     * queue:MS step parks it, its decoded request and the timer that looks again. */
    struct sl_admit adm;
    int engine;
    int replica; /* of engines[engine] running it (each choice counted in its in_flight) */
    struct sl_openai_completion oc;
    bool has_oc;
    bool parked;             /* a queue:MS step holds it: no scheduler has it yet */
    struct event *adm_timer; /* created at the first park */
};

struct io {
    struct sl_http_server *srv;
    /* This thread's reference to the server's current configuration, adopted on reload_ev. */
    struct sl_config *cfg;
    int idx;
    pthread_t thread;
    bool running;
    struct event_base *base;
    struct evconnlistener *listener;
    struct event *wake_ev;   /* activated by the outbox from the scheduler thread */
    struct event *stop_ev;   /* activated by sl_http_server_stop() */
    struct event *reap_ev;   /* frees closed connections outside their callbacks */
    struct event *reload_ev; /* activated by sl_http_server_reload() */

    /* Transport. */
    struct evconnlistener *tls_listener; /* NULL without TLS */
    struct ssl_ctx_st *tls_ctx;          /* this thread's reference to the current context */
    struct event *drain_ev;              /* activated by sl_http_server_drain(): stop accepting */
    struct event *cancel_ev;             /* activated when a drain times out: cancel what is left */
    struct event *flush_ev; /* writes the flush list and the access log, once per iteration */
    struct conn *flush;     /* connections with output queued or to move on this iteration */
    struct sl_str log;      /* access-log lines not yet written */
    struct sl_str wbuf;     /* scratch for one write: a head, an SSE event */
    bool flush_pending;     /* flush_ev is active */
    bool draining;

    struct sl_outbox *outbox;
    uint64_t wake_ns; /* when on_wake began: the time of every event of that batch */
    struct conn *conns;
    struct conn *dead;
    int32_t *ids;       /* (seq_len) prompt token scratch */
    struct sl_str out;  /* scratch for response bodies */
    struct sl_str line; /* scratch for access-log lines */
    uint64_t n_req;     /* completions started here, for ids */
    time_t date_sec;
    char date[40]; /* the Date header value for date_sec */
    bool accept_error_logged;
};

/* A served model: requests that name it run on its scheduler. */
struct engine {
    char name[SL_MODEL_NAME_MAX + 1];
    /* Another name requests may give: the model as configured ("synthetic", a file's path) when
     * no name was (vLLM serves its --model as given); NULL otherwise. */
    char *alias;
    const struct sl_model *model;
    /* Its replicas, one per device, each with its scheduler; sched[0] NULL: no engine (tests of
     * the front end alone). in_flight counts the requests each holds, from submit to their end:
     * a request goes to the replica with the fewest (then the fewest queued prompt tokens). */
    struct sl_sched *sched[SL_REPLICAS_MAX];
    atomic_int in_flight[SL_REPLICAS_MAX];
    int n_replicas;
    enum sl_chat_template chat_template; /* the model's, when the config names none */
};

struct sl_http_server {
    /* The current configuration (a reference), replaced by a reload under cfg_lock. The fields
     * read only at start (listen, io_threads) are the same in every configuration. */
    pthread_mutex_t cfg_lock;
    struct sl_config *cfg;
    /* The models, the first the default; fixed once started. */
    struct engine engines[SL_MODELS_MAX];
    const char *engine_names[SL_MODELS_MAX];
    int n_engines;
    struct sl_metrics *metrics; /* one shard per I/O thread */
    int port;
    int n_io;
    struct io *io;
    uint32_t nonce; /* makes completion ids unique across restarts */
    int64_t created;
    bool started;

    /* TLS: the listener's port (0 without one) and the current context (under cfg_lock). */
    int tls_port;
    struct ssl_ctx_st *tls_ctx;

    atomic_int n_conns; /* open connections that count towards max_connections */
    atomic_int busy;    /* responses in progress, over all I/O threads */
    atomic_bool draining;
    /* A drain waits on drain_cond for busy to reach 0 and for every thread's acknowledgement. */
    pthread_mutex_t drain_lock;
    pthread_cond_t drain_cond;
    int drain_acks;
};

static void conn_close(struct conn *c);
static void conn_advance(struct conn *c);
static void conn_set_busy(struct conn *c, bool busy);
static void io_flush_later(struct io *io);

static void list_remove(struct conn **head, struct conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        *head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static void list_push(struct conn **head, struct conn *c)
{
    c->prev = NULL;
    c->next = *head;
    if (*head)
        (*head)->prev = c;
    *head = c;
}

static int64_t io_now(struct io *io)
{
    struct timeval tv;
    if (event_base_gettimeofday_cached(io->base, &tv) != 0)
        return sl_clock_unix();
    return (int64_t)tv.tv_sec;
}

static const char *io_date(struct io *io)
{
    time_t now = (time_t)io_now(io);
    if (now != io->date_sec) {
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(io->date, sizeof io->date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        io->date_sec = now;
    }
    return io->date;
}

/* ---- writing responses ---- */

static void str_add(struct sl_str *w, const char *lit)
{
    sl_str_append(w, lit, strlen(lit));
}

static void str_add_num(struct sl_str *w, unsigned long long v)
{
    char d[24];
    size_t i = sizeof d;
    do
        d[--i] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    sl_str_append(w, d + i, sizeof d - i);
}

/* Puts the connection on its thread's flush list: on_flush writes its output (plain sockets)
 * and moves it on (conn_advance) at the end of this loop iteration. */
static void conn_flush_later(struct conn *c)
{
    if (c->flush_queued)
        return;
    c->flush_queued = true;
    c->flush_next = c->io->flush;
    c->io->flush = c;
    io_flush_later(c->io);
}

/* Queues bytes for the client. bufferevent_openssl encrypts and writes them at once. */
static void conn_write(struct conn *c, const void *data, size_t len)
{
    evbuffer_add(bufferevent_get_output(c->bev), data, len);
    conn_flush_later(c);
}

/* Appends the status line and headers to w. content_length < 0: the body is chunked (HTTP/1.1)
 * or ends with the connection (HTTP/1.0). Built with appends, not printf: this is the hot path. */
static void head_format(struct conn *c, struct sl_str *w, int code, const char *ctype,
                        long long content_length, const char *extra)
{
    /* Once draining, every response says the connection ends with it. */
    if (c->io->draining)
        c->keep_alive = false;
    c->status = code;
    str_add(w, "HTTP/1.1 ");
    str_add_num(w, (unsigned)code);
    sl_str_append(w, " ", 1);
    str_add(w, sl_http_reason_phrase(code));
    str_add(w, "\r\nServer: sluice/" SL_VERSION "\r\nDate: ");
    str_add(w, io_date(c->io));
    str_add(w, "\r\nContent-Type: ");
    str_add(w, ctype);
    if (content_length >= 0) {
        str_add(w, "\r\nContent-Length: ");
        str_add_num(w, (unsigned long long)content_length);
    } else if (c->chunked) {
        str_add(w, "\r\nTransfer-Encoding: chunked");
    }
    if (c->tier >= 0) {
        str_add(w, "\r\nX-Sluice-Tier: ");
        str_add(w, c->cfg->tiers[c->tier].name);
    }
    str_add(w, c->keep_alive ? "\r\nConnection: keep-alive\r\n" : "\r\nConnection: close\r\n");
    /* What admission did, and the tenant's budgets on every response of a tenant with limits. */
    sl_admit_headers(&c->adm, w);
    if (c->tenant && (c->tenant->rpm > 0 || c->tenant->tpm > 0))
        sl_admission_ratelimit_headers(c->cfg, c->tenant, (int64_t)sl_clock_ns(), w);
    if (extra)
        str_add(w, extra);
    sl_str_append(w, "\r\n", 2);
}

static void send_head(struct conn *c, int code, const char *ctype, long long content_length,
                      const char *extra)
{
    struct sl_str *w = &c->io->wbuf;
    sl_str_clear(w);
    head_format(c, w, code, ctype, content_length, extra);
    conn_write(c, w->p, w->len);
}

/* The whole response is queued: once enough of it is written, serve the next request or
 * close (conn_advance, from on_flush). */
static void conn_done(struct conn *c)
{
    c->state = CONN_FLUSHING;
    conn_flush_later(c);
}

/* Access-log lines are buffered per I/O thread and written once per loop iteration (or every
 * LOG_FLUSH_BYTES): a write(2) per request would cost as much as serving a small one. */
static void access_log_add(struct io *io, const struct sl_str *line)
{
    char prefix[SL_LOG_PREFIX_MAX];
    size_t n = sl_log_prefix(prefix, SL_LOG_INFO);
    if (n == 0)
        return;
    sl_str_append(&io->log, prefix, n);
    sl_str_append(&io->log, line->p, line->len);
    sl_str_append(&io->log, "\n", 1);
    if (io->log.len >= LOG_FLUSH_BYTES) {
        sl_log_write(io->log.p, io->log.len);
        sl_str_clear(&io->log);
    } else {
        io_flush_later(io);
    }
}

/* Appends ns as milliseconds with three decimals. */
static void str_add_ms(struct sl_str *w, uint64_t ns)
{
    uint64_t us = ns / 1000;
    char frac[5] = {'.', (char)('0' + us / 100 % 10), (char)('0' + us / 10 % 10),
                    (char)('0' + us % 10), 0};
    str_add_num(w, us / 1000);
    sl_str_append(w, frac, 4);
}

/* ---- metrics ---- */

static bool path_is(const struct sl_http_parser *p, struct sl_http_span path, const char *lit);
static bool method_is_get(const struct sl_http_parser *p);

/* The tier and tenant the current request is accounted to: "none" for a request refused before
 * authentication or classification decided them. */
static void request_labels(const struct conn *c, const char **tier, const char **tenant)
{
    *tier = c->tier >= 0 ? c->cfg->tiers[c->tier].name : "none";
    *tenant = c->tenant ? c->tenant->name : "none";
}

/* The route label of the current request: a fixed set, so that no client can create series. */
static const char *metrics_route(const struct conn *c)
{
    static const char *const routes[] = {
        "/v1/completions", "/v1/chat/completions", "/v1/models", "/healthz",   "/readyz",
        "/metrics",        "/admin/config",        "/tokenize",  "/detokenize"};
    static const char models[] = "/v1/models/";
    const struct sl_http_parser *p = &c->req;
    if (p->state != SL_HTTP_PARSE_DONE)
        return SL_METRICS_OTHER;
    struct sl_http_span path = sl_http_parser_path(p);
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (path_is(p, path, routes[i]))
            return routes[i];
    if (path.len > sizeof models - 1 &&
        memcmp(sl_http_span_ptr(p, path), models, sizeof models - 1) == 0)
        return "/v1/models/{id}";
    return SL_METRICS_OTHER;
}

/* Time to first token at a request's first text, inter-token latency at each later one. Every
 * event of one wake-up carries its time (io->wake_ns: one clock read per batch), which also
 * stamps t_first_ns so that the access log and the metrics agree. */
static void metrics_on_text(struct conn *c, const struct choice *ch, const struct sl_out_event *e)
{
    struct sl_metrics *m = c->io->srv->metrics;
    uint64_t now = c->io->wake_ns;
    const char *tier, *tenant;
    request_labels(c, &tier, &tenant);
    if (!c->t_first_ns) {
        c->t_first_ns = now;
        sl_metrics_observe_ttft(m, c->io->idx, tier, (double)(now - c->t_start_ns) / 1e9);
    } else if (ch != c->ch) {
        return; /* inter-token latency is choice 0's: the others' tokens interleave with it */
    } else if (e->n_tokens > 0) {
        sl_metrics_observe_itl(m, c->io->idx, tier, (double)(now - c->t_text_ns) / 1e9,
                               e->n_tokens);
    }
    c->t_text_ns = now;
}

/* Every request once, at its end (from log_access): by route and status, and an inference
 * request also by tier, tenant and outcome, with its tokens and latencies. */
static void metrics_request_end(struct conn *c, const char *finish, int n_completion, uint64_t now)
{
    struct sl_metrics *m = c->io->srv->metrics;
    sl_metrics_http_done(m, c->io->idx, metrics_route(c), c->status);
    if (!c->inference)
        return;
    c->inference = false;
    struct sl_metrics_request r = {
        .outcome = sl_metrics_outcome_of(finish, c->status),
        .engine = c->n_ch > 0,
        .prompt_tokens = c->n_prompt,
        .completion_tokens = n_completion,
        .ttft_seconds = -1,
        .e2e_seconds = (double)(now - c->t_start_ns) / 1e9,
        .queue_seconds = -1,
    };
    request_labels(c, &r.tier, &r.tenant);
    uint64_t q;
    if (c->n_ch > 0 && sl_req_queue_ns(c->ch[0].req, &q))
        r.queue_seconds = (double)q / 1e9;
    if (c->t_first_ns) {
        r.ttft_seconds = (double)(c->t_first_ns - c->t_start_ns) / 1e9;
    } else if (r.engine && n_completion > 0) {
        /* Its only token ended it (an end-of-sequence token has no text): it came at the end. */
        r.ttft_seconds = r.e2e_seconds;
        sl_metrics_observe_ttft(m, c->io->idx, r.tier, r.ttft_seconds);
    }
    sl_metrics_request_done(m, c->io->idx, &r);
}

/* One JSON line per request, written where its outcome is decided: its response is complete,
 * or its client left. finish is NULL for requests that generated nothing. */
static void log_access(struct conn *c, const char *finish, int n_completion)
{
    if (c->logged)
        return;
    c->logged = true;
    uint64_t now = sl_clock_ns();
    metrics_request_end(c, finish, n_completion, now);
    struct sl_str *l = &c->io->line;
    sl_str_clear(l);
    str_add(l, "access {\"io\":");
    str_add_num(l, (unsigned)c->io->idx);
    str_add(l, ",\"method\":\"");
    str_add(l, c->req.state == SL_HTTP_PARSE_DONE ? llhttp_method_name(c->req.method) : "");
    str_add(l, "\",\"path\":\"");
    struct sl_http_span path = sl_http_parser_path(&c->req);
    if (c->req.state == SL_HTTP_PARSE_DONE)
        sl_str_append_json(l, sl_http_span_ptr(&c->req, path), path.len > 200 ? 200 : path.len);
    str_add(l, "\",\"status\":");
    str_add_num(l, (unsigned)c->status);
    /* Names are checked at load to need no escaping; keys never get this far. */
    if (c->tenant) {
        str_add(l, ",\"tenant\":\"");
        str_add(l, c->tenant->name);
        sl_str_append(l, "\"", 1);
    }
    if (c->tier >= 0) {
        str_add(l, ",\"tier\":\"");
        str_add(l, c->cfg->tiers[c->tier].name);
        sl_str_append(l, "\"", 1);
    }
    if (c->adm.ran) {
        str_add(l, ",\"admission\":\"");
        str_add(l, c->adm.note);
        sl_str_append(l, "\"", 1);
        if (c->adm.predicted_ttft_s >= 0)
            sl_str_appendf(l, ",\"predicted_ttft_ms\":%.0f", c->adm.predicted_ttft_s * 1e3);
    }
    if (c->n_ch > 0 || finish) {
        str_add(l, ",\"model\":\"");
        str_add(l, c->io->srv->engines[c->engine].name);
        if (c->n_ch > 0 && c->io->srv->engines[c->engine].n_replicas > 1)
            sl_str_appendf(l, "\",\"replica\":%d,\"id", c->replica);
        else
            str_add(l, "\",\"id");
        sl_str_appendf(l, "\":\"%s\",\"prompt_tokens\":%d,\"completion_tokens\":%d", c->ident.id,
                       c->n_prompt, n_completion);
        sl_str_appendf(l, ",\"finish\":\"%s\"", finish ? finish : "none");
        if (c->n_ch > 1)
            sl_str_appendf(l, ",\"n\":%d", c->n_ch);
        if (c->t_first_ns) {
            str_add(l, ",\"ttft_ms\":");
            str_add_ms(l, c->t_first_ns - c->t_start_ns);
        }
    }
    str_add(l, ",\"e2e_ms\":");
    str_add_ms(l, now - c->t_start_ns);
    sl_str_append(l, "}", 1);
    access_log_add(c->io, l);
}

static void send_body(struct conn *c, int code, const char *ctype, const char *extra,
                      const char *body, size_t len)
{
    /* Head and body in one piece: one TLS record, one evbuffer chain. */
    struct sl_str *w = &c->io->wbuf;
    sl_str_clear(w);
    head_format(c, w, code, ctype, (long long)len, extra);
    log_access(c, NULL, 0);
    if (c->req.method != HTTP_HEAD || c->req.state != SL_HTTP_PARSE_DONE)
        sl_str_append(w, body, len);
    conn_write(c, w->p, w->len);
    conn_done(c);
}

static void send_json(struct conn *c, int code, const struct sl_str *body, const char *extra)
{
    send_body(c, code, "application/json", extra, body->p ? body->p : "", body->len);
}

static void send_error(struct conn *c, const struct sl_openai_error *e, const char *extra)
{
    struct sl_str *b = &c->io->out;
    sl_str_clear(b);
    sl_openai_error_encode(b, e);
    send_json(c, e->http, b, extra);
}

/* Appends one SSE event (payload + "\n\n") in the connection's framing. */
static void send_sse(struct conn *c, const char *payload, size_t len)
{
    static const char pre[] = "data: ", post[] = "\n\n";
    struct sl_str *w = &c->io->wbuf;
    sl_str_clear(w);
    size_t n = sizeof pre - 1 + len + sizeof post - 1;
    if (c->chunked)
        sl_str_appendf(w, "%zx\r\n", n);
    sl_str_append(w, pre, sizeof pre - 1);
    sl_str_append(w, payload, len);
    sl_str_append(w, post, sizeof post - 1);
    if (c->chunked)
        sl_str_append(w, "\r\n", 2);
    conn_write(c, w->p, w->len);
}

/* ---- completions ---- */

static uint64_t random_seed(struct io *io)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed)
        return seed;
    /* No entropy yet (early boot): distinct per request is all sampling needs. */
    return sl_clock_ns() ^ (io->n_req * 0x9e3779b97f4a7c15ull);
}

/* The end of the current completion for admission: its parking timer stops and whatever it
 * was charged and did not use goes back (sl_admit_end does that once, however often this runs).
 * n_generated < 0: it never reached a scheduler. */
static void admit_release(struct conn *c, int n_generated)
{
    if (c->adm_timer)
        evtimer_del(c->adm_timer);
    c->parked = false;
    sl_admit_end(&c->adm, n_generated, (int64_t)sl_clock_ns());
    if (c->has_oc) {
        sl_openai_completion_dispose(&c->oc);
        c->has_oc = false;
    }
}

/* Lets go of the choices: the engine's sequences (cancelled first when `cancel`, those not done),
 * their in_flight counts, and their text. Events still on their way find no connection and are
 * just freed. */
static void release_choices(struct conn *c, bool cancel)
{
    struct engine *en = &c->io->srv->engines[c->engine];
    for (int i = 0; i < c->n_ch; i++) {
        struct choice *ch = &c->ch[i];
        if (cancel && !ch->done)
            sl_sched_cancel(en->sched[c->replica], ch->req);
        atomic_fetch_sub_explicit(&en->in_flight[c->replica], 1, memory_order_relaxed);
        sl_req_set_user(ch->req, NULL);
        sl_req_unref(ch->req);
        ch->req = NULL;
        sl_str_clear(&ch->text);
        sl_str_clear(&ch->held);
        ch->n_lp = 0;
    }
    c->n_ch = c->n_live = 0;
}

static void drop_request(struct conn *c, bool cancel)
{
    if (cancel && c->parked && !c->logged) {
        c->status = 499; /* its client left while it waited for capacity */
        log_access(c, "cancelled", 0);
    }
    admit_release(c, c->n_ch > 0 ? c->n_gen : -1);
    if (c->n_ch == 0)
        return;
    if (cancel) {
        c->status = 499; /* nginx's "client closed request" */
        log_access(c, "cancelled", c->n_gen);
    }
    release_choices(c, cancel);
}

/* ---- tenants, tiers and the admin API ---- */

/* The key of the request's "Authorization: Bearer KEY", if it has one. */
static bool request_key(struct conn *c, const char **key, size_t *len)
{
    struct sl_http_parser *p = &c->req;
    return p->authorization.len &&
           sl_tenant_bearer(sl_http_span_ptr(p, p->authorization), p->authorization.len, key, len);
}

/* OpenAI's answer to a missing or wrong key; the key itself is never echoed. */
static void unauthorized(struct conn *c, bool has_key, const char *key, size_t len)
{
    struct sl_openai_error err;
    char shown[16];
    if (has_key) {
        sl_tenant_key_redact(key, len, shown, sizeof shown);
        sl_openai_error_set(&err, 401, NULL, "invalid_api_key", "Incorrect API key provided: %s.",
                            shown);
    } else {
        sl_openai_error_set(&err, 401, NULL, "invalid_api_key",
                            "You didn't provide an API key. Send it in an Authorization header "
                            "using Bearer auth (Authorization: Bearer YOUR_KEY).");
    }
    send_error(c, &err, "WWW-Authenticate: Bearer\r\n");
}

/* Sets c->tenant from the API key, or answers 401. Runs before the body is decoded, so a request
 * without a valid key costs one hash and no JSON. */
static bool authenticate(struct conn *c)
{
    const char *key = NULL;
    size_t len = 0;
    bool has_key = request_key(c, &key, &len);
    c->tenant =
        c->head_keyed ? c->head_tenant : sl_tenant_lookup(c->cfg, has_key ? key : NULL, len);
    if (c->tenant)
        return true;
    unauthorized(c, has_key, key, len);
    return false;
}

/* Puts the completion into a tier; the tier goes with it to the scheduler. */
static int classify(struct conn *c, struct sl_openai_completion *oc, struct sl_openai_error *err)
{
    struct sl_http_parser *p = &c->req;
    struct sl_http_span path = sl_http_parser_path(p);
    struct sl_tier_request rq = {
        .header = p->tier.len ? sl_http_span_ptr(p, p->tier) : NULL,
        .header_len = p->tier.len,
        .service_tier = oc->service_tier,
        .path = sl_http_span_ptr(p, path),
        .path_len = path.len,
        .stream = oc->stream,
        .max_tokens = oc->params.max_tokens,
    };
    int tier;
    int st = sl_tier_classify(c->cfg, c->tenant, &rq, &tier, err);
    if (st != SL_OK)
        return st;
    const struct sl_tier *t = &c->cfg->tiers[tier];
    c->tier = tier;
    oc->params.tier = tier;
    oc->params.priority = t->priority;
    oc->params.weight = t->weight;
    oc->params.ttft_slo_ms = t->ttft_slo_ms;
    oc->params.tpot_slo_ms = t->tpot_slo_ms;
    snprintf(oc->params.tier_name, sizeof oc->params.tier_name, "%s", t->name);
    return SL_OK;
}

static void not_allowed(struct conn *c, const char *allow);

/* /admin/...: the admin key only (tenant keys do not open it). */
static void serve_admin(struct conn *c, struct sl_http_span path)
{
    struct sl_openai_error err;
    const char *key = NULL;
    size_t len = 0;
    bool has_key = request_key(c, &key, &len);
    if (!c->cfg->has_admin_key) {
        sl_openai_error_set(&err, 403, NULL, "admin_disabled",
                            "The admin API is disabled: the configuration has no "
                            "admin_key_sha256.");
        send_error(c, &err, NULL);
        return;
    }
    if (!sl_tenant_admin_check(c->cfg, has_key ? key : NULL, len)) {
        unauthorized(c, has_key, key, len);
        return;
    }
    static const char config[] = "/admin/config";
    if (!(path.len == sizeof config - 1 &&
          memcmp(sl_http_span_ptr(&c->req, path), config, path.len) == 0)) {
        int n = path.len > 200 ? 200 : (int)path.len;
        sl_openai_error_set(&err, 404, NULL, "unknown_url", "Invalid URL (%s %.*s).",
                            llhttp_method_name(c->req.method), n, sl_http_span_ptr(&c->req, path));
        send_error(c, &err, NULL);
        return;
    }
    if (!method_is_get(&c->req)) {
        not_allowed(c, "GET, HEAD");
        return;
    }
    /* The configuration this request started with: the current one. */
    json_t *j = sl_config_to_json(c->cfg);
    char *s = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!s) /* jansson failed to allocate: the style's answer to that is to stop */
        abort();
    send_body(c, 200, "application/json", NULL, s, strlen(s));
    free(s);
}

/* /v1/completions or /v1/chat/completions, as route() set c->ident.api. Any served model may be
 * named; route_model() picks it. */
static int decode_request(struct conn *c, struct sl_openai_completion *oc, const char *body,
                          struct sl_openai_error *err)
{
    if (c->ident.api == SL_OPENAI_API_CHAT)
        return sl_openai_chat_decode(oc, body, c->req.body.len, NULL,
                                     c->cfg->default_max_tokens_chat, err);
    return sl_openai_completion_decode(oc, body, c->req.body.len, NULL, c->cfg->default_max_tokens,
                                       err);
}

/* The engine a request's "model" names (the first without one), or -1 with a 404. */
/* Whether a request naming the model id[0 .. n) means engine e. */
static bool engine_is(const struct engine *e, const char *id, size_t n)
{
    return (n == strlen(e->name) && memcmp(id, e->name, n) == 0) ||
           (e->alias && n == strlen(e->alias) && memcmp(id, e->alias, n) == 0);
}

static int route_model(struct conn *c, const char *model, struct sl_openai_error *err)
{
    struct sl_http_server *srv = c->io->srv;
    if (!model)
        return 0;
    for (int i = 0; i < srv->n_engines; i++)
        if (engine_is(&srv->engines[i], model, strlen(model)))
            return i;
    char list[256];
    size_t n = 0;
    list[0] = '\0';
    for (int i = 0; i < srv->n_engines && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s'%s'", i ? ", " : "",
                              srv->engines[i].name);
    sl_openai_error_set(err, 404, "model", "model_not_found",
                        "The model '%.200s' does not exist or you do not have access to it. This "
                        "server serves %s.",
                        model, list);
    return -1;
}

/* The chat template of engine en's chats: the configured one, else the model's own. */
static enum sl_chat_template chat_template_of(const struct conn *c, const struct engine *en)
{
    int t = c->cfg->chat_template ? sl_chat_template_from_name(c->cfg->chat_template) : -1;
    return t >= 0 ? (enum sl_chat_template)t : en->chat_template;
}

/* The prompt's token ids for engine e into io->ids: the prompt as it is, or the messages
 * rendered with the configured chat template (the model's own when the configuration names
 * none), checked against the model's context for max_tokens. */
static int encode_prompt(struct conn *c, const struct sl_openai_completion *oc, int e,
                         int max_tokens, int *n_prompt, struct sl_openai_error *err)
{
    const struct engine *en = &c->io->srv->engines[e];
    const struct sl_model *m = en->model;
    int seq_len = sl_model_config(m)->seq_len;
    if (sl_openai_check_vocab(oc, sl_model_config(m)->vocab_size, err) != SL_OK)
        return SL_EINVAL;
    if (c->ident.api != SL_OPENAI_API_CHAT)
        return sl_openai_prompt_ids(oc, sl_model_tok(m), seq_len, max_tokens, c->io->ids, n_prompt,
                                    err);
    struct sl_chat_prompt p;
    sl_chat_prompt_init(&p);
    sl_chat_render(&p, chat_template_of(c, en), oc->messages, oc->n_messages);
    int st =
        sl_chat_prompt_encode(sl_model_tok(m), seq_len, &p, max_tokens, c->io->ids, n_prompt, err);
    sl_chat_prompt_dispose(&p);
    return st;
}

/* The request's prompts for engine e, each checked as encode_prompt does: *n_prompt gets their
 * tokens together; io->ids holds the last one's. The first prompt is left selected. */
static int encode_prompts(struct conn *c, struct sl_openai_completion *oc, int e, int max_tokens,
                          int *n_prompt, struct sl_openai_error *err)
{
    if (oc->n_prompts <= 1)
        return encode_prompt(c, oc, e, max_tokens, n_prompt, err);
    int total = 0, st = SL_OK;
    for (int i = 0; i < oc->n_prompts && st == SL_OK; i++) {
        int n = 0;
        sl_openai_prompt_select(oc, i);
        st = encode_prompt(c, oc, e, max_tokens, &n, err);
        total += n;
    }
    sl_openai_prompt_select(oc, 0);
    *n_prompt = total;
    return st;
}

/* ---- admission ---- */

/* The replica of engine en a request goes to now: the fewest requests in flight, then the
 * fewest queued prompt tokens, then the lowest index. out (when not NULL) gets its stats. */
static int pick_replica(struct engine *en, struct sl_sched_stats *out)
{
    if (en->n_replicas == 1) {
        if (out)
            sl_sched_stats(en->sched[0], out);
        return 0;
    }
    struct sl_sched_stats tmp, best_st;
    int best = 0, best_n = INT_MAX;
    for (int r = 0; r < en->n_replicas; r++) {
        int n = atomic_load_explicit(&en->in_flight[r], memory_order_relaxed);
        if (n > best_n)
            continue;
        sl_sched_stats(en->sched[r], &tmp);
        if (n < best_n || tmp.queued_prompt_tokens < best_st.queued_prompt_tokens) {
            best = r;
            best_n = n;
            best_st = tmp;
        }
    }
    if (out)
        *out = best_st;
    return best;
}

static void admit_env_stats(void *ctx, int model, struct sl_sched_stats *out)
{
    struct conn *c = ctx;
    struct sl_http_server *srv = c->io->srv;
    if (model >= 0 && model < srv->n_engines && srv->engines[model].sched[0])
        pick_replica(&srv->engines[model], out);
}

static int admit_env_encode(void *ctx, int model, int max_tokens, int *n_prompt)
{
    struct conn *c = ctx;
    struct sl_openai_error err;
    if (model < 0 || model >= c->io->srv->n_engines || !c->io->srv->engines[model].sched[0])
        return SL_ENOENT;
    return encode_prompts(c, &c->oc, model, max_tokens, n_prompt, &err);
}

static struct sl_admit_env admit_env(struct conn *c)
{
    struct sl_http_server *srv = c->io->srv;
    return (struct sl_admit_env){
        .n_models = srv->n_engines,
        .model_names = srv->engine_names,
        .ctx = c,
        .stats = admit_env_stats,
        .encode = admit_env_encode,
    };
}

static void conn_on_admit_timer(evutil_socket_t fd, short what, void *arg);

/* echo: the prompt's text into out, as sent, or its token ids (n of them in ids) through the
 * detokenizer that turns generated ids into text. */
static void echo_prompt(struct sl_str *out, const struct sl_openai_completion *oc,
                        const struct sl_tok *tok, const int32_t *ids, int n)
{
    if (oc->prompt) {
        sl_str_append(out, oc->prompt, oc->prompt_len);
        return;
    }
    struct sl_detok *d = sl_detok_new(tok, -1, NULL, 0);
    if (oc->params.keep_special)
        sl_detok_keep_special(d);
    for (int i = 0; i < n; i++)
        sl_detok_push(d, ids[i], out, NULL);
    sl_detok_finish(d, out);
    sl_detok_free(d);
}

/* Hands the admitted request to its model's scheduler, as admission left it (tier, model,
 * max_tokens). */
static void submit(struct conn *c)
{
    struct io *io = c->io;
    struct sl_http_server *srv = io->srv;
    struct sl_openai_completion *oc = &c->oc;
    struct sl_openai_error err;
    const struct sl_admit *a = &c->adm;
    /* io->ids holds this request's one prompt for its model unless admission changed the model
     * since, or another request used the scratch while this one was parked; several prompts
     * are each encoded again in turn. */
    int n_prompts = oc->n_prompts > 1 ? oc->n_prompts : 1;
    bool encode = n_prompts > 1 || a->park_start_ns || a->model != c->engine;
    c->engine = a->model;
    struct engine *en = &srv->engines[c->engine];
    if (a->tier != c->tier) {
        /* Demoted: it runs, and says it runs, in the tier admission chose. */
        const struct sl_tier *t = &c->cfg->tiers[a->tier];
        c->tier = a->tier;
        oc->params.tier = a->tier;
        oc->params.priority = t->priority;
        oc->params.weight = t->weight;
        oc->params.ttft_slo_ms = t->ttft_slo_ms;
        oc->params.tpot_slo_ms = t->tpot_slo_ms;
        snprintf(oc->params.tier_name, sizeof oc->params.tier_name, "%s", t->name);
    }
    oc->params.max_tokens = a->max_tokens;
    io->n_req++;
    c->stream = oc->stream;
    c->include_usage = oc->stream && oc->include_usage;
    c->want_lp = oc->params.logprobs;
    /* Choices in OpenAI's order: prompt p's choice j has index p · n + j. */
    int n = oc->n > 1 ? oc->n : 1, total = n_prompts * n;
    if (total > c->cap_ch) {
        c->ch = sl_xrealloc(c->ch, sizeof *c->ch * (size_t)total);
        memset(c->ch + c->cap_ch, 0, sizeof *c->ch * (size_t)(total - c->cap_ch));
        for (int i = c->cap_ch; i < total; i++) {
            sl_str_init(&c->ch[i].text);
            sl_str_init(&c->ch[i].held);
        }
        c->cap_ch = total;
    }
    /* Choice j's seed is the request's plus j: the same seed gives the same n answers, and
     * choice 0 the answer of the same request with n = 1 (and with this prompt alone). */
    uint64_t seed = oc->has_seed ? oc->params.seed : 0;
    c->replica = pick_replica(en, NULL);
    c->n_ch = c->n_live = 0;
    int n_ids = a->n_prompt; /* the current prompt's tokens, in io->ids */
    for (int i = 0; i < total; i++) {
        struct choice *ch = &c->ch[i];
        if (encode && i % n == 0) {
            sl_openai_prompt_select(oc, i / n);
            if (encode_prompt(c, oc, c->engine, a->max_tokens, &n_ids, &err) != SL_OK) {
                release_choices(c, true); /* those already queued */
                admit_release(c, -1);     /* which lets go of oc too */
                send_error(c, &err, NULL);
                return;
            }
        }
        oc->params.seed = oc->has_seed ? seed + (uint64_t)(i % n) : random_seed(io);
        struct sl_req *r = sl_req_new(io->ids, n_ids, &oc->params);
        sl_req_set_user(r, c);
        int st = sl_sched_submit(en->sched[c->replica], r, io->outbox);
        if (st != SL_OK) {
            sl_req_set_user(r, NULL);
            sl_req_unref(r);
            release_choices(c, true);
            admit_release(c, -1);
            sl_openai_error_set(&err, sl_http_status_code(st), NULL, NULL,
                                "The request could not be queued: %s.", sl_status_str(st));
            sl_log(SL_LOG_WARN, "io %d: submit failed: %s", io->idx, sl_status_str(st));
            send_error(c, &err, NULL);
            return;
        }
        atomic_fetch_add_explicit(&en->in_flight[c->replica], 1, memory_order_relaxed);
        ch->req = r;
        ch->done = false;
        ch->finish = SL_FINISH_NONE;
        ch->n_gen = 0;
        ch->n_lp = 0;
        ch->lp_offset = 0;
        sl_str_clear(&ch->text);
        sl_str_clear(&ch->held);
        if (oc->echo)
            echo_prompt(&ch->text, oc, sl_model_tok(en->model), io->ids, n_ids);
        ch->echo_pending = oc->echo && oc->stream;
        c->n_ch = ++c->n_live;
    }
    sl_openai_completion_dispose(oc);
    c->has_oc = false;
    c->n_prompt = a->n_prompt; /* all the prompts together, as admission encoded them */
    c->head_sent = false;
    /* HTTP/1.0 has no chunked encoding: the stream then ends with the connection. */
    c->chunked = c->req.http_major == 1 && c->req.http_minor >= 1;
    if (c->stream && !c->chunked)
        c->keep_alive = false;
    snprintf(c->ident.id, sizeof c->ident.id, "%s-%08x%02x%014llx",
             c->ident.api == SL_OPENAI_API_CHAT ? "chatcmpl" : "cmpl", srv->nonce,
             (unsigned)io->idx & 0xff, (unsigned long long)io->n_req);
    c->ident.created = io_now(io);
    c->ident.model = en->name;
    c->ident.include_usage = c->include_usage;
    c->t_first_ns = 0;
    c->n_gen = 0;
    c->state = CONN_WAITING;
}

/* Acts on admission's verdict: submit, park until the next look, or refuse. */
static void admission_decided(struct conn *c, enum sl_admit_verdict v)
{
    struct io *io = c->io;
    const struct sl_admit *a = &c->adm;
    const char *policy_tier = c->cfg->tiers[a->policy_tier].name;
    struct sl_openai_error err;
    switch (v) {
    case SL_ADMIT_OK:
        c->parked = false;
        sl_metrics_admission(io->srv->metrics, io->idx, policy_tier,
                             a->degraded ? SL_ADMIT_DEGRADED : SL_ADMIT_ADMITTED, a->reason);
        submit(c);
        return;
    case SL_ADMIT_PARK: {
        if (!c->adm_timer)
            c->adm_timer = evtimer_new(io->base, conn_on_admit_timer, c);
        int64_t wait = a->recheck_ns - (int64_t)sl_clock_ns();
        if (wait < 0)
            wait = 0;
        struct timeval tv = {.tv_sec = wait / 1000000000, .tv_usec = wait % 1000000000 / 1000};
        evtimer_add(c->adm_timer, &tv);
        c->parked = true;
        c->state = CONN_WAITING;
        return;
    }
    case SL_ADMIT_RATE_LIMITED:
        sl_openai_error_set(&err, 429, NULL, "rate_limit_exceeded", "%s", a->why);
        break;
    case SL_ADMIT_OVERLOADED:
        sl_openai_error_set(&err, c->cfg->tiers[a->policy_tier].overload_status, NULL,
                            "server_is_overloaded", "%s", a->why);
        break;
    }
    sl_metrics_admission(io->srv->metrics, io->idx, policy_tier, SL_ADMIT_REJECTED, a->reason);
    /* Admission logs its refusals only in the access log: one line per request, never more. */
    admit_release(c, -1);
    send_error(c, &err, NULL);
}

static void conn_on_admit_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct conn *c = arg;
    if (c->closed || !c->parked)
        return;
    struct sl_admit_env env = admit_env(c);
    admission_decided(c, sl_admit_resume(&c->adm, &env, (int64_t)sl_clock_ns()));
}

/* When the tier follows from the head alone and that tier refuses whatever comes (a full
 * queue, sl_admit_precheck), the refusal needs no body: a flood against a closed tier costs what
 * parsing its heads costs, as nginx's limit_req does. True when it answered. */
static bool refuse_early(struct conn *c)
{
    if (!c->cfg->admission || sl_tier_classify_needs_body(c->cfg))
        return false;
    struct sl_openai_completion head = {.params.max_tokens = c->cfg->default_max_tokens};
    struct sl_openai_error err;
    if (classify(c, &head, &err) != SL_OK)
        return false; /* answered in full, after the body, like any bad request */
    struct sl_admit_env env = admit_env(c);
    if (sl_admit_precheck(&c->adm, &env, c->cfg, c->tenant, c->tier, 0, 0,
                          (int64_t)sl_clock_ns()) == SL_ADMIT_OK) {
        c->tier = -1;
        return false;
    }
    admission_decided(c, c->adm.verdict);
    return true;
}

static void serve_completion(struct conn *c)
{
    c->inference = true;
    struct sl_http_server *srv = c->io->srv;
    struct sl_openai_error err;
    const char *body = c->req.body.len ? sl_http_span_ptr(&c->req, c->req.body) : "";
    /* The default model: a request naming another is not known until the body is read. */
    if (srv->n_engines == 1 && refuse_early(c))
        return;
    if (decode_request(c, &c->oc, body, &err) != SL_OK) {
        send_error(c, &err, NULL);
        return;
    }
    c->has_oc = true;
    int e = route_model(c, c->oc.model, &err), n_prompt = -1;
    if (e >= 0 && c->oc.max_tokens_open) {
        /* A chat that sets no max_tokens may generate up to the model's context, as OpenAI's and
         * vLLM's: the rest of the context once the prompt is encoded, a figure that classifying
         * rules, budgets and admission then see like any other. */
        if (encode_prompt(c, &c->oc, e, 1, &n_prompt, &err) != SL_OK) {
            admit_release(c, -1);
            send_error(c, &err, NULL);
            return;
        }
        c->oc.params.max_tokens = sl_model_config(srv->engines[e].model)->seq_len - n_prompt;
    }
    if (e < 0 || classify(c, &c->oc, &err) != SL_OK) {
        admit_release(c, -1);
        send_error(c, &err, NULL);
        return;
    }
    c->engine = e;
    c->adm.n = c->oc.n; /* admission counts each choice's tokens */
    c->adm.prompts = c->oc.n_prompts;
    struct sl_admit_env env = admit_env(c);
    if (sl_admit_precheck(&c->adm, &env, c->cfg, c->tenant, c->tier, e, c->oc.params.max_tokens,
                          (int64_t)sl_clock_ns()) != SL_ADMIT_OK) {
        admission_decided(c, c->adm.verdict);
        return;
    }
    /* io->ids still holds the prompt when it was encoded above (nothing ran in between). */
    if (n_prompt < 0 &&
        encode_prompts(c, &c->oc, e, c->oc.params.max_tokens, &n_prompt, &err) != SL_OK) {
        admit_release(c, -1);
        send_error(c, &err, NULL);
        return;
    }
    if (!srv->engines[e].sched[0]) {
        admit_release(c, -1);
        sl_openai_error_set(&err, 503, NULL, NULL, "This server has no engine to run completions.");
        send_error(c, &err, NULL);
        return;
    }
    admission_decided(c, sl_admit_begin(&c->adm, &env, c->cfg, c->tenant, c->tier, e, n_prompt,
                                        c->oc.params.max_tokens, (int64_t)sl_clock_ns()));
}

/* ---- log probabilities ---- */

static void lp_append(struct conn *c, struct choice *ch, const struct sl_token_logprobs *e, int n)
{
    if (!c->want_lp || n <= 0)
        return;
    if (ch->n_lp + n > ch->cap_lp) {
        while (ch->n_lp + n > ch->cap_lp)
            ch->cap_lp = ch->cap_lp ? 2 * ch->cap_lp : 64;
        ch->lp = sl_xrealloc(ch->lp, sizeof *ch->lp * (size_t)ch->cap_lp);
    }
    memcpy(ch->lp + ch->n_lp, e, sizeof *e * (size_t)n);
    ch->n_lp += n;
}

/* The logprobs of the entries ch->lp holds, into *buf; NULL when the request did not ask. */
static const struct sl_openai_logprobs *lp_pending(struct conn *c, const struct choice *ch,
                                                   struct sl_openai_logprobs *buf)
{
    if (!c->want_lp)
        return NULL;
    *buf = (struct sl_openai_logprobs){.tok = sl_model_tok(c->io->srv->engines[c->engine].model),
                                       .e = ch->lp,
                                       .n = ch->n_lp,
                                       .text_offset = ch->lp_offset};
    return buf;
}

/* The pending entries went out in a chunk: the next chunk's offsets start after their text. */
static void lp_sent(struct choice *ch, const struct sl_openai_logprobs *lp)
{
    for (int i = 0; lp && i < lp->n; i++)
        ch->lp_offset += sl_openai_token_len(lp->tok, lp->e[i].prev, lp->e[i].token);
    ch->n_lp = 0;
}

/* One chunk of choice ch's stream: text, its finish, and the log probabilities pending (with
 * lp_all, "logprobs" is null when none are: the last chunk of a choice). */
static void stream_chunk(struct conn *c, struct choice *ch, const char *text, size_t len,
                         enum sl_finish finish, bool lp_all)
{
    struct sl_str *b = &c->io->out;
    sl_str_clear(b);
    struct sl_openai_logprobs lpb;
    const struct sl_openai_logprobs *lp = lp_all && ch->n_lp == 0 ? NULL : lp_pending(c, ch, &lpb);
    c->ident.index = (int)(ch - c->ch);
    sl_openai_chunk_encode(b, &c->ident, text, len, finish, lp);
    lp_sent(ch, lp);
    send_sse(c, b->p, b->len);
    sl_str_clear(b);
}

/* ---- back-pressure ---- */

/* Sends the text held back from a slow client, one chunk per choice that has some. */
static void stream_release(struct conn *c)
{
    for (int i = 0; i < c->n_ch; i++) {
        struct choice *ch = &c->ch[i];
        if (ch->held.len == 0)
            continue;
        stream_chunk(c, ch, ch->held.p, ch->held.len, SL_FINISH_NONE, false);
        sl_str_clear(&ch->held);
    }
}

static size_t held_bytes(const struct conn *c)
{
    size_t n = 0;
    for (int i = 0; i < c->n_ch; i++)
        n += c->ch[i].held.len;
    return n;
}

/* Redis-style output limits for a stream. Above write_high_water_bytes queued for the client,
 * text is held and later sent as one chunk per choice (OpenAI clients concatenate chunks), so a
 * slow reader costs its text, not a JSON chunk per token. Past write_hard_cap_bytes (queued +
 * held) the client is not reading: the request is cancelled in the scheduler and the connection
 * closed. "Queued" is what the kernel has not taken yet (tcp_send_buffer_bytes bounds the
 * kernel's part). Returns true when the text was taken (held, sent with held text, or
 * dropped). */
static bool stream_hold(struct conn *c, struct choice *ch, const char *text, size_t len)
{
    size_t queued = evbuffer_get_length(bufferevent_get_output(c->bev));
    size_t high = c->cfg->write_high_water_bytes;
    if (held_bytes(c) == 0 && queued <= high)
        return false;
    sl_str_append(&ch->held, text, len);
    if (queued <= high) {
        stream_release(c);
        return true;
    }
    size_t held = held_bytes(c);
    if (queued + held > c->cfg->write_hard_cap_bytes) {
        sl_log(SL_LOG_WARN,
               "io %d: %s: client is %zu bytes behind the stream (write_hard_cap_bytes %zu); "
               "cancelling",
               c->io->idx, c->ident.id, queued + held, c->cfg->write_hard_cap_bytes);
        conn_close(c);
    }
    return true;
}

static void stream_head(struct conn *c)
{
    if (c->head_sent)
        return;
    c->head_sent = true;
    send_head(c, 200, "text/event-stream", -1, "Cache-Control: no-cache\r\n");
    struct sl_str *b = &c->io->out;
    for (int i = 0; i < c->n_ch; i++) {
        struct choice *ch = &c->ch[i];
        c->ident.index = i;
        if (c->ident.api == SL_OPENAI_API_CHAT) {
            /* A chat stream opens each choice with the assistant's role. */
            sl_str_clear(b);
            sl_openai_chunk_role_encode(b, &c->ident);
            send_sse(c, b->p, b->len);
            sl_str_clear(b); /* callers encode into the same scratch next */
        }
        if (ch->echo_pending) {
            /* echo: the prompt goes out as each choice's first chunk (as vLLM sends it). */
            ch->echo_pending = false;
            sl_str_clear(b);
            sl_openai_chunk_encode(b, &c->ident, ch->text.p ? ch->text.p : "", ch->text.len,
                                   SL_FINISH_NONE, NULL);
            send_sse(c, b->p, b->len);
            sl_str_clear(b);
            sl_str_clear(&ch->text);
        }
    }
}

/* The engine's answer when a request ends without finishing normally. */
static void finish_error(struct conn *c, const struct sl_out_event *e, struct sl_openai_error *err)
{
    if (e->finish == SL_FINISH_CANCELLED) {
        sl_openai_error_set(err, 503, NULL, "cancelled",
                            "The request was cancelled because the server is shutting down.");
    } else if (e->status == SL_ERANGE) {
        sl_openai_error_set(err, 400, "max_tokens", "context_length_exceeded",
                            "The prompt plus max_tokens needs more KV cache than this server "
                            "has; reduce the prompt or max_tokens.");
    } else {
        int st = e->status < 0 ? e->status : SL_EBACKEND;
        sl_openai_error_set(err, sl_http_status_code(st), NULL, NULL,
                            "The engine failed while generating: %s.", sl_status_str(st));
        sl_log(SL_LOG_ERROR, "io %d: %s failed: %s", c->io->idx, c->ident.id, sl_status_str(st));
    }
}

/* Choice ch ended. The response ends with the last choice, or with the first that fails (the
 * others are cancelled: one answer, not part of one). */
static void on_done(struct conn *c, struct choice *ch, const struct sl_out_event *e)
{
    struct sl_str *b = &c->io->out;
    bool ok = e->finish == SL_FINISH_STOP || e->finish == SL_FINISH_LENGTH;
    c->n_gen += e->n_tokens - ch->n_gen;
    ch->n_gen = e->n_tokens;
    ch->done = true;
    ch->finish = e->finish;
    c->n_live--;
    struct sl_openai_error err;
    if (!ok) {
        finish_error(c, e, &err);
        struct engine *en = &c->io->srv->engines[c->engine];
        for (int i = 0; i < c->n_ch; i++)
            if (!c->ch[i].done) {
                sl_sched_cancel(en->sched[c->replica], c->ch[i].req);
                c->ch[i].done = true;
                c->ch[i].finish = SL_FINISH_CANCELLED;
            }
        c->n_live = 0;
    }
    /* Text held back from a slow client goes before the end of the stream. */
    stream_release(c);
    if (ok && c->stream) {
        stream_head(c);
        /* Tokens whose text never came (the end of a stop string) go with the last chunk. */
        stream_chunk(c, ch, "", 0, e->finish, true);
    }
    if (c->n_live > 0)
        return;
    c->status = ok || c->head_sent ? 200 : err.http;
    log_access(c, sl_finish_str(e->finish), c->n_gen);
    admit_release(c, c->n_gen);
    sl_str_clear(b);
    if (!c->stream && ok) {
        struct sl_openai_choice chs[SL_OPENAI_N_MAX];
        struct sl_openai_logprobs lps[SL_OPENAI_N_MAX];
        for (int i = 0; i < c->n_ch; i++) {
            const struct choice *x = &c->ch[i];
            chs[i] = (struct sl_openai_choice){.text = x->text.p ? x->text.p : "",
                                               .len = x->text.len,
                                               .finish = x->finish,
                                               .lp = lp_pending(c, x, &lps[i])};
        }
        c->ident.index = 0;
        sl_openai_completion_encode_choices(b, &c->ident, chs, c->n_ch, c->n_prompt, c->n_gen);
    }
    /* The request is over before the response is: once it is queued, the connection may move
     * on to its next request. */
    drop_request(c, false);

    if (!c->stream && ok) {
        send_json(c, 200, b, NULL);
        return;
    }
    if (!ok && !c->head_sent) {
        bool drained = c->io->draining && e->finish == SL_FINISH_CANCELLED;
        send_error(c, &err, drained ? "Retry-After: 1\r\n" : NULL);
        return;
    }
    stream_head(c);
    if (ok) {
        if (c->include_usage) {
            sl_str_clear(b);
            sl_openai_usage_chunk_encode(b, &c->ident, c->n_prompt, c->n_gen);
            send_sse(c, b->p, b->len);
        }
    } else {
        sl_str_clear(b);
        sl_openai_error_encode(b, &err);
        send_sse(c, b->p, b->len);
    }
    send_sse(c, "[DONE]", 6);
    if (c->chunked)
        conn_write(c, "0\r\n\r\n", 5);
    conn_done(c);
}

static void on_text(struct conn *c, struct choice *ch, const struct sl_out_event *e)
{
    sl_admit_started(&c->adm);
    metrics_on_text(c, ch, e);
    if (!c->t_first_ns)
        c->t_first_ns = sl_clock_ns();
    c->n_gen += e->n_tokens;
    ch->n_gen += e->n_tokens;
    lp_append(c, ch, e->lp, e->n_lp);
    if (!c->stream) {
        sl_str_append(&ch->text, e->text, e->len);
        return;
    }
    stream_head(c);
    if (e->len == 0 || stream_hold(c, ch, e->text, e->len))
        return;
    stream_chunk(c, ch, e->text, e->len, SL_FINISH_NONE, false);
}

/* The choice of c that e belongs to, or NULL (an event of a request c has let go of). */
static struct choice *choice_of(struct conn *c, const struct sl_req *r)
{
    for (int i = 0; i < c->n_ch; i++)
        if (c->ch[i].req == r)
            return c->ch[i].done ? NULL : &c->ch[i];
    return NULL;
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct io *io = arg;
    io->wake_ns = sl_clock_ns();
    struct sl_out_event *e = sl_outbox_take(io->outbox);
    while (e) {
        struct sl_out_event *next = e->next;
        struct conn *c = sl_req_user(e->req);
        struct choice *ch = c && !c->closed ? choice_of(c, e->req) : NULL;
        if (ch) {
            if (e->kind == SL_OUT_TEXT)
                on_text(c, ch, e);
            else
                on_done(c, ch, e);
        }
        sl_out_event_free(e);
        e = next;
    }
}

static void outbox_wake(void *arg)
{
    struct io *io = arg;
    event_active(io->wake_ev, EV_READ, 0);
}

/* ---- routes ---- */

static bool path_is(const struct sl_http_parser *p, struct sl_http_span path, const char *lit)
{
    return path.len == strlen(lit) && memcmp(sl_http_span_ptr(p, path), lit, path.len) == 0;
}

/* GET routes answer HEAD too (send_body leaves the body out). */
static bool method_is_get(const struct sl_http_parser *p)
{
    return p->method == HTTP_GET || p->method == HTTP_HEAD;
}

static void serve_ready(struct conn *c);

static void not_allowed(struct conn *c, const char *allow)
{
    struct sl_openai_error err;
    char extra[64];
    sl_openai_error_set(&err, 405, NULL, "method_not_allowed",
                        "Method %s is not allowed on this URL; use %s.",
                        llhttp_method_name(c->req.method), allow);
    snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
    send_error(c, &err, extra);
}

/* vLLM's POST /tokenize and /detokenize: what a model's tokenizer makes of a prompt or of chat
 * messages (rendered with the chat template a completion would use), and the text of ids. Not
 * inference: no admission, no engine. A prompt longer than the context is still tokenized
 * (count above max_model_len says so). */
static void serve_tokenize(struct conn *c, bool detokenize)
{
    struct sl_http_server *srv = c->io->srv;
    struct sl_openai_error err;
    struct sl_openai_tokenize t;
    const char *body = c->req.body.len ? sl_http_span_ptr(&c->req, c->req.body) : "";
    if (sl_openai_tokenize_decode(&t, body, c->req.body.len, detokenize, &err) != SL_OK) {
        send_error(c, &err, NULL);
        return;
    }
    int e = route_model(c, t.c.model, &err);
    if (e < 0) {
        sl_openai_tokenize_dispose(&t);
        send_error(c, &err, NULL);
        return;
    }
    const struct engine *en = &srv->engines[e];
    const struct sl_tok *tok = sl_model_tok(en->model);
    int max_len = sl_model_config(en->model)->seq_len;
    struct sl_str *b = &c->io->out;
    sl_str_clear(b);
    if (detokenize) {
        int vocab = sl_model_config(en->model)->vocab_size;
        for (int i = 0; i < t.n_tokens; i++)
            if (t.tokens[i] >= vocab) {
                char at[32];
                snprintf(at, sizeof at, "tokens[%d]", i);
                sl_openai_error_set(&err, 400, at, "invalid_value",
                                    "Invalid '%s': token id %d is not in this model's vocabulary "
                                    "(ids 0 to %d).",
                                    at, (int)t.tokens[i], vocab - 1);
                sl_openai_tokenize_dispose(&t);
                send_error(c, &err, NULL);
                return;
            }
        struct sl_str text;
        sl_str_init(&text);
        struct sl_detok *d = sl_detok_new(tok, -1, NULL, 0);
        for (int i = 0; i < t.n_tokens; i++)
            sl_detok_push(d, t.tokens[i], &text, NULL);
        sl_detok_finish(d, &text);
        sl_detok_free(d);
        sl_openai_detokenized_encode(b, text.p ? text.p : "", text.len);
        sl_str_dispose(&text);
    } else {
        /* Room for every byte as a token, plus BOS and the chat markers. */
        size_t cap = (t.chat ? 0 : t.c.prompt_len) + 2;
        struct sl_chat_prompt p;
        sl_chat_prompt_init(&p);
        if (t.chat) {
            sl_chat_render(&p, chat_template_of(c, en), t.c.messages, t.c.n_messages);
            cap = p.text.len + (size_t)p.n_segs + 2;
        }
        int32_t *ids = sl_xmalloc(sizeof *ids * cap);
        int n = 0, st;
        if (t.chat)
            st = sl_chat_prompt_encode(tok, (int)cap, &p, 0, ids, &n, &err);
        else
            st = sl_tok_encode(tok, t.c.prompt, t.c.prompt_len, t.add_special, ids, (int)cap, &n);
        sl_chat_prompt_dispose(&p);
        if (st != SL_OK && !t.chat)
            sl_openai_error_set(&err, 400, "prompt", "invalid_value",
                                "Invalid 'prompt': it could not be tokenized (%s).",
                                st == SL_EINVAL ? "not valid UTF-8" : sl_status_str(st));
        if (st != SL_OK) {
            free(ids);
            sl_openai_tokenize_dispose(&t);
            send_error(c, &err, NULL);
            return;
        }
        sl_openai_tokens_encode(b, ids, n, max_len);
        free(ids);
    }
    sl_openai_tokenize_dispose(&t);
    send_json(c, 200, b, NULL);
}

static void serve_metrics(struct conn *c)
{
    struct sl_http_server *srv = c->io->srv;
    struct sl_sched_stats st[SL_MODELS_MAX * SL_REPLICAS_MAX];
    const char *names[SL_MODELS_MAX * SL_REPLICAS_MAX];
    int n = 0;
    int replicas[SL_MODELS_MAX * SL_REPLICAS_MAX];
    bool several = false;
    for (int i = 0; i < srv->n_engines; i++)
        for (int r = 0; r < srv->engines[i].n_replicas; r++) {
            sl_sched_stats(srv->engines[i].sched[r], &st[n]);
            names[n] = srv->engines[i].name;
            replicas[n++] = r;
            several |= r > 0;
        }
    struct sl_str *b = &c->io->out;
    sl_str_clear(b);
    sl_metrics_render_models(srv->metrics, names, several ? replicas : NULL, st, n, b);
    sl_admission_render(c->cfg, b);
    send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b->p, b->len);
}

/* The key a route needs: none (probes), the metrics key (when one is configured), the admin
 * key, or a tenant's (every other route, unknown URLs included, when tenants are configured). */
enum route_guard { GUARD_NONE, GUARD_METRICS, GUARD_ADMIN, GUARD_TENANT };

static enum route_guard route_guard(const struct sl_http_parser *p)
{
    struct sl_http_span path = sl_http_parser_path(p);
    if (path.len >= 7 && memcmp(sl_http_span_ptr(p, path), "/admin/", 7) == 0)
        return GUARD_ADMIN;
    if (path_is(p, path, "/healthz") || path_is(p, path, "/readyz"))
        return GUARD_NONE;
    return path_is(p, path, "/metrics") ? GUARD_METRICS : GUARD_TENANT;
}

static void route(struct conn *c)
{
    struct sl_http_parser *p = &c->req;
    struct sl_http_server *srv = c->io->srv;
    struct sl_http_span path = sl_http_parser_path(p);
    struct sl_str *b = &c->io->out;
    struct sl_openai_error err;
    static const char models[] = "/v1/models/";

    sl_str_clear(b);
    enum route_guard guard = route_guard(p);
    if (guard == GUARD_ADMIN) {
        serve_admin(c, path);
        return;
    }
    /* Probes need no key, nor does the scrape unless metrics_key_sha256 is set (as in vLLM). */
    if (guard == GUARD_METRICS) {
        const char *key = NULL;
        size_t len = 0;
        bool has_key = request_key(c, &key, &len);
        if (!sl_tenant_metrics_check(c->cfg, has_key ? key : NULL, len)) {
            unauthorized(c, has_key, key, len);
            return;
        }
    }
    if (guard == GUARD_TENANT && !authenticate(c))
        return;
    c->ident.api = SL_OPENAI_API_COMPLETIONS;
    if (path_is(p, path, "/v1/chat/completions")) {
        if (p->method != HTTP_POST) {
            not_allowed(c, "POST");
            return;
        }
        c->ident.api = SL_OPENAI_API_CHAT;
        serve_completion(c);
        return;
    }
    if (path_is(p, path, "/v1/completions")) {
        if (p->method != HTTP_POST) {
            not_allowed(c, "POST");
            return;
        }
        serve_completion(c);
        return;
    }
    if (path_is(p, path, "/tokenize") || path_is(p, path, "/detokenize")) {
        if (p->method != HTTP_POST) {
            not_allowed(c, "POST");
            return;
        }
        serve_tokenize(c, path_is(p, path, "/detokenize"));
        return;
    }
    if (path_is(p, path, "/v1/models")) {
        if (!method_is_get(p)) {
            not_allowed(c, "GET, HEAD");
            return;
        }
        int lens[SL_MODELS_MAX];
        for (int i = 0; i < srv->n_engines; i++)
            lens[i] = sl_model_config(srv->engines[i].model)->seq_len;
        sl_openai_models_encode(b, srv->engine_names, lens, srv->n_engines, srv->created);
        send_json(c, 200, b, NULL);
        return;
    }
    if (path.len > sizeof models - 1 &&
        memcmp(sl_http_span_ptr(p, path), models, sizeof models - 1) == 0) {
        if (!method_is_get(p)) {
            not_allowed(c, "GET, HEAD");
            return;
        }
        const char *want = sl_http_span_ptr(p, path) + sizeof models - 1;
        size_t n = path.len - (sizeof models - 1);
        for (int i = 0; i < srv->n_engines; i++) {
            const char *id = srv->engines[i].name;
            if (engine_is(&srv->engines[i], want, n)) {
                sl_openai_model_encode(b, id, sl_model_config(srv->engines[i].model)->seq_len,
                                       srv->created);
                send_json(c, 200, b, NULL);
                return;
            }
        }
        sl_openai_error_set(&err, 404, "model", "model_not_found",
                            "The model '%.*s' does not exist.", (int)(n > 200 ? 200 : n), want);
        send_error(c, &err, NULL);
        return;
    }
    if (path_is(p, path, "/metrics")) {
        if (!method_is_get(p)) {
            not_allowed(c, "GET, HEAD");
            return;
        }
        serve_metrics(c);
        return;
    }
    if (path_is(p, path, "/healthz")) {
        if (!method_is_get(p)) {
            not_allowed(c, "GET, HEAD");
            return;
        }
        static const char ok[] = "{\"status\":\"ok\"}";
        send_body(c, 200, "application/json", NULL, ok, sizeof ok - 1);
        return;
    }
    if (path_is(p, path, "/readyz")) {
        if (!method_is_get(p)) {
            not_allowed(c, "GET, HEAD");
            return;
        }
        serve_ready(c);
        return;
    }
    int n = path.len > 200 ? 200 : (int)path.len;
    sl_openai_error_set(&err, 404, NULL, "unknown_url", "Invalid URL (%s %.*s).",
                        llhttp_method_name(p->method), n, sl_http_span_ptr(p, path));
    send_error(c, &err, NULL);
}

/* ---- connection life ---- */

static struct timeval ms_tv(int ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* Takes up the connection's configuration: limits, the write low watermark (the output below
 * which the next pipelined request is taken up) and the write timeout (a client that reads
 * nothing for idle_timeout_ms is dropped). */
static void conn_apply_cfg(struct conn *c)
{
    const struct sl_config *cfg = c->cfg;
    c->req.max_header_bytes = cfg->max_header_bytes;
    c->req.max_body_bytes = cfg->max_body_bytes;
    bufferevent_setwatermark(c->bev, EV_WRITE, cfg->write_high_water_bytes, 0);
    struct timeval tv = ms_tv(cfg->idle_timeout_ms);
    bufferevent_set_timeouts(c->bev, NULL, &tv);
}

/* Takes up the I/O thread's configuration if a reload replaced the connection's: keys, tiers and
 * limits apply from the request that starts now on, so a revoked key does not live on in a
 * kept-alive connection. A request keeps the configuration it started with. */
static void conn_adopt_cfg(struct conn *c)
{
    if (c->cfg == c->io->cfg)
        return;
    sl_config_unref(c->cfg);
    c->cfg = sl_config_ref(c->io->cfg);
    conn_apply_cfg(c);
    c->head_keyed = false; /* a lookup in the old configuration */
}

static void conn_set_busy(struct conn *c, bool busy)
{
    if (c->busy == busy)
        return;
    c->busy = busy;
    struct sl_http_server *s = c->io->srv;
    if (busy) {
        atomic_fetch_add(&s->busy, 1);
    } else if (atomic_fetch_sub(&s->busy, 1) == 1 && atomic_load(&s->draining)) {
        pthread_mutex_lock(&s->drain_lock);
        pthread_cond_broadcast(&s->drain_cond);
        pthread_mutex_unlock(&s->drain_lock);
    }
}

/* A request (or a refusal) starts: its response is in progress until written. */
static void conn_begin(struct conn *c)
{
    c->t_start_ns = sl_clock_ns();
    c->logged = false;
    c->tenant = NULL;
    c->tier = -1;
    c->inference = false;
    admit_release(c, -1); /* nothing is held between requests; this only makes sure */
    sl_admit_init(&c->adm);
    c->engine = 0;
    c->replica = 0;
    c->ident.id[0] = '\0';
    conn_adopt_cfg(c);
    conn_set_busy(c, true);
}

/* Answers an error after which the connection ends. The write side is then shut and input
 * discarded for a while, so the client reads the answer rather than a reset. */
static void conn_refuse(struct conn *c, int code, const char *errcode, const char *why,
                        const char *extra)
{
    struct sl_openai_error err;
    conn_begin(c);
    c->keep_alive = false;
    c->linger = true;
    sl_openai_error_set(&err, code, NULL, errcode, "%s", why);
    send_error(c, &err, extra);
}

static void conn_after_parse(struct conn *c, enum sl_http_parse st)
{
    struct sl_http_parser *p = &c->req;
    if (st == SL_HTTP_PARSE_ERROR) {
        conn_refuse(c, p->error_code, NULL, p->error_reason, NULL);
        return;
    }
    if (c->io->draining) {
        conn_refuse(c, 503, "draining",
                    "The server is shutting down; retry the request on a new connection.",
                    "Retry-After: 1\r\n");
        return;
    }
    conn_begin(c);
    c->keep_alive = p->keep_alive;
    route(c);
}

/* Reads again once the input buffer has room for what the client sends next. */
static void conn_read_resume(struct conn *c)
{
    if (c->read_paused && !c->read_eof && !c->closed &&
        evbuffer_get_length(bufferevent_get_input(c->bev)) < READ_HIGH_WATER) {
        c->read_paused = false;
        event_add(c->read_ev, NULL);
    }
}

/* Moves input into the parser until one request is whole (the rest stays in the evbuffer). */
static enum sl_http_parse conn_parse(struct conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    enum sl_http_parse st = c->req.state;
    while (st == SL_HTTP_PARSE_MORE && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        st = sl_http_parser_feed(&c->req, v.iov_base, v.iov_len);
        evbuffer_drain(in, v.iov_len);
    }
    conn_read_resume(c);
    return st;
}

/* A keyless request's body that is read anyway, so that its 401 keeps the connection: one that
 * came whole with its head (bytes the server holds already), up to this size. */
#define EARLY_401_BODY_MAX (64 << 10)

/* Which key a route needs, looked at as soon as the head is whole: true when the request may
 * go on to its body. A request without the key its route needs is answered 401 there and then,
 * without reading its body or sending 100 Continue, and the connection ends, unless the body is
 * already all here (at most EARLY_401_BODY_MAX): then it is parsed and route() answers the same
 * 401 on a kept-alive connection. The tenant found is kept for route() (head_tenant); the
 * admin and metrics keys, rarer, route() checks again. */
static bool conn_head(struct conn *c)
{
    struct sl_http_parser *p = &c->req;
    c->head_keyed = false;
    if (c->io->draining)
        return true; /* conn_after_parse answers 503 */
    conn_adopt_cfg(c);
    const struct sl_config *cfg = c->cfg;
    const char *key = NULL;
    size_t len = 0;
    bool has_key = request_key(c, &key, &len);
    bool ok;
    switch (route_guard(p)) {
    case GUARD_NONE: ok = true; break;
    case GUARD_METRICS: ok = sl_tenant_metrics_check(cfg, has_key ? key : NULL, len); break;
    case GUARD_ADMIN:
        ok = !cfg->has_admin_key || sl_tenant_admin_check(cfg, has_key ? key : NULL, len);
        break;
    default:
        c->head_tenant = sl_tenant_lookup(cfg, has_key ? key : NULL, len);
        c->head_keyed = true;
        ok = c->head_tenant != NULL;
        break;
    }
    if (ok)
        return true;
    bool chunked = (p->ll.flags & F_CHUNKED) != 0;
    uint64_t declared = (p->ll.flags & F_CONTENT_LENGTH) ? p->ll.content_length : 0;
    size_t here = p->buf.len - p->head_end + evbuffer_get_length(bufferevent_get_input(c->bev));
    if (!chunked && declared <= EARLY_401_BODY_MAX && here >= declared)
        return true;
    conn_begin(c);
    c->keep_alive = false;
    c->linger = true;
    unauthorized(c, has_key, key, len);
    return false;
}

/* ---- timeouts ---- */

static void conn_timer_stop(struct conn *c)
{
    if (c->timer_kind != TIMER_NONE) {
        evtimer_del(c->timer);
        c->timer_kind = TIMER_NONE;
    }
}

static void conn_timer_start(struct conn *c, enum conn_timer kind, int ms)
{
    struct timeval tv = ms_tv(ms);
    c->timer_kind = kind;
    evtimer_add(c->timer, &tv);
}

/* While a request is read: idle_timeout_ms until its first byte on a kept-alive connection
 * (a new connection starts with the head's deadline, so a silent client cannot hold one), then
 * header_timeout_ms from that byte to the end of the head, then header_timeout_ms between
 * pieces of the body. A slow-loris head cannot stretch its deadline; a body can keep arriving. */
static void conn_read_timer(struct conn *c)
{
    if (c->req.headers_complete)
        conn_timer_start(c, TIMER_BODY, c->cfg->header_timeout_ms);
    else if (c->req.buf.len > 0 && c->timer_kind != TIMER_HEAD)
        conn_timer_start(c, TIMER_HEAD, c->cfg->header_timeout_ms);
    else if (c->req.buf.len == 0 && c->timer_kind == TIMER_NONE)
        conn_timer_start(c, TIMER_IDLE, c->cfg->idle_timeout_ms);
}

static void conn_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct conn *c = arg;
    enum conn_timer kind = c->timer_kind;
    c->timer_kind = TIMER_NONE;
    if (!c->closed && kind == TIMER_LINGER) {
        conn_close(c);
        return;
    }
    if (c->closed || c->state != CONN_READING)
        return;
    /* A client still reading the previous response is not idle (the write timeout watches
     * that it makes progress). */
    if (kind == TIMER_IDLE && c->busy) {
        conn_timer_start(c, TIMER_IDLE, c->cfg->idle_timeout_ms);
        return;
    }
    /* Nothing of a request came: there is no one to answer. */
    if (kind == TIMER_IDLE || c->req.buf.len == 0) {
        conn_close(c);
        return;
    }
    conn_refuse(c, 408, "request_timeout",
                kind == TIMER_HEAD ? "The request head did not arrive in time."
                                   : "The request body stopped arriving.",
                NULL);
}

/* ---- moving a connection on ---- */

/* Serves what the connection has buffered as far as it can: while each response is queued and
 * the output is below write_high_water_bytes, the next pipelined request is parsed and answered
 * (their responses leave together in on_flush). Called from the read callback and from on_flush,
 * never from inside a route. */
static void conn_advance(struct conn *c)
{
    while (!c->closed) {
        size_t queued = evbuffer_get_length(bufferevent_get_output(c->bev));
        if (c->busy && queued == 0 && c->state == CONN_READING)
            conn_set_busy(c, false);
        if (c->state == CONN_WAITING) {
            if (queued <= c->cfg->write_high_water_bytes)
                stream_release(c);
            return;
        }
        if (c->state == CONN_FLUSHING) {
            if (c->linger || !c->keep_alive) {
                if (queued > 0)
                    return; /* all of it must be out first */
                conn_set_busy(c, false);
                if (!c->linger) {
                    conn_close(c);
                    return;
                }
                /* The client may still be sending a body we refused; reading it until EOF lets
                 * the answer arrive instead of a reset. */
                c->state = CONN_LINGER;
                shutdown(bufferevent_getfd(c->bev), SHUT_WR);
                bufferevent_set_timeouts(c->bev, NULL, NULL);
                conn_timer_start(c, TIMER_LINGER, LINGER_SECS * 1000);
                struct evbuffer *in = bufferevent_get_input(c->bev);
                c->lingered += evbuffer_get_length(in);
                evbuffer_drain(in, evbuffer_get_length(in));
                conn_read_resume(c);
                return;
            }
            if (queued > c->cfg->write_high_water_bytes)
                return;
            /* The response is in progress until all of it is out (a drain waits for that). */
            conn_set_busy(c, queued > 0);
            c->state = CONN_READING;
            c->sent_continue = false;
            conn_adopt_cfg(c); /* the previous request is over */
            sl_http_parser_next(&c->req);
        }
        if (c->state != CONN_READING)
            return;
        enum sl_http_parse st = conn_parse(c);
        if (st == SL_HTTP_PARSE_HEAD) {
            conn_timer_stop(c); /* the body's own deadline starts in conn_read_timer */
            if (!conn_head(c))
                continue; /* answered, and the connection ends */
            st = sl_http_parser_resume(&c->req);
            if (st == SL_HTTP_PARSE_MORE)
                st = conn_parse(c);
        }
        if (st == SL_HTTP_PARSE_MORE) {
            if (c->req.expect_continue && !c->sent_continue) {
                c->sent_continue = true;
                conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
            }
            conn_read_timer(c);
            return;
        }
        conn_timer_stop(c);
        conn_after_parse(c, st);
    }
}

static void conn_on_event(struct bufferevent *bev, short what, void *arg);
static void conn_on_read(struct bufferevent *bev, void *arg);
static void conn_write_socket(struct conn *c);

/* Reads a plain socket into the connection's input buffer. The loop does this itself rather than
 * through the bufferevent, whose evbuffer_read asks the kernel how much is readable (an ioctl)
 * before every read: one syscall in three per small request. */
static void conn_on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    struct conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    struct evbuffer_iovec v;
    /* A socket bufferevent keeps the end of its input frozen except while it reads. */
    evbuffer_unfreeze(in, 0);
    ssize_t n = -1;
    int e = 0;
    if (evbuffer_reserve_space(in, 16384, &v, 1) == 1) {
        n = recv(fd, v.iov_base, v.iov_len, 0);
        e = errno;
        v.iov_len = n > 0 ? (size_t)n : 0;
        evbuffer_commit_space(in, &v, 1);
    }
    evbuffer_freeze(in, 0);
    if (n < 0 && (e == EAGAIN || e == EWOULDBLOCK || e == EINTR))
        return;
    if (n <= 0) {
        /* EOF or an error: nothing more will be read. */
        event_del(c->read_ev);
        c->read_paused = c->read_eof = true;
        conn_on_event(c->bev, BEV_EVENT_READING | (n == 0 ? BEV_EVENT_EOF : BEV_EVENT_ERROR), c);
        return;
    }
    if (evbuffer_get_length(in) >= READ_HIGH_WATER) {
        event_del(c->read_ev);
        c->read_paused = true;
    }
    conn_on_read(c->bev, c);
    /* The answers to everything this read completed leave now, in one write, rather than after
     * every other connection of this loop iteration has been served: that wait would only add
     * latency (on_flush still moves the connection on). */
    if (!c->closed)
        conn_write_socket(c);
}

static void conn_on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    if (c->closed)
        return;
    if (c->state == CONN_LINGER) {
        struct evbuffer *in = bufferevent_get_input(bev);
        c->lingered += evbuffer_get_length(in);
        evbuffer_drain(in, evbuffer_get_length(in));
        if (c->lingered > LINGER_MAX_BYTES)
            conn_close(c);
        else
            conn_read_resume(c);
        return;
    }
    /* Bytes that arrive while a request is answered are the next request's: they wait in the
     * input buffer (bounded by READ_HIGH_WATER) until conn_advance takes them up. */
    conn_advance(c);
}

/* The bufferevent wrote (some of) what on_flush left it, or (TLS) what it encrypted: the output
 * is at or below the write low watermark. */
static void conn_on_write(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    if (c->closed)
        return;
    /* A plain socket whose output is out goes back to being written by the loop. */
    if (!c->tls && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
        bufferevent_disable(bev, EV_WRITE);
    /* This may run inside conn_write (bufferevent_openssl writes at once): move on later. */
    conn_flush_later(c);
}

/* Writes a plain connection's output now; what the kernel does not take is left to the
 * bufferevent's write event (with its timeout) until conn_on_write hands it back. */
static void conn_write_socket(struct conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_get_length(out) == 0)
        return;
    /* A socket bufferevent keeps the start of its output frozen except while it writes. */
    evbuffer_unfreeze(out, 1);
    int n = evbuffer_write(out, bufferevent_getfd(c->bev));
    evbuffer_freeze(out, 1);
    if (n < 0) {
        int e = EVUTIL_SOCKET_ERROR();
        if (e != EAGAIN && e != EWOULDBLOCK && e != EINTR) {
            conn_close(c); /* the peer is gone: its request is cancelled */
            return;
        }
    }
    if (evbuffer_get_length(out) > 0)
        bufferevent_enable(c->bev, EV_WRITE);
}

static void conn_on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    if (c->closed)
        return;
    if (c->tls && (what & BEV_EVENT_ERROR)) {
        unsigned long e = bufferevent_get_openssl_error(bev);
        if (e)
            sl_log(SL_LOG_DEBUG, "io %d: TLS: %s", c->io->idx, ERR_reason_error_string(e));
        while (bufferevent_get_openssl_error(bev))
            ;
    }
    /* A client that shuts its side after sending a request still gets the response queued for
     * it (a peer that is really gone turns the write into an error). */
    if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) && c->state == CONN_FLUSHING) {
        c->keep_alive = false;
        c->linger = false;
        conn_flush_later(c);
        return;
    }
    /* Otherwise EOF, an error, the write timeout or the linger timeout: a client that hangs up
     * while its request is queued or streaming gives up on it, and the request is cancelled. */
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        conn_close(c);
}

/* Marks the connection closed, cancels its request and leaves the freeing to reap(), since this
 * may run inside one of the connection's own callbacks. */
static void conn_close(struct conn *c)
{
    if (c->closed)
        return;
    c->closed = true;
    drop_request(c, true);
    conn_timer_stop(c);
    if (c->read_ev)
        event_del(c->read_ev);
    conn_set_busy(c, false);
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
    list_remove(&c->io->conns, c);
    list_push(&c->io->dead, c);
    event_active(c->io->reap_ev, EV_READ, 0);
}

static void conn_free(struct conn *c)
{
    if (c->counted)
        atomic_fetch_sub(&c->io->srv->n_conns, 1);
    sl_config_unref(c->cfg);
    if (c->timer)
        event_free(c->timer);
    if (c->adm_timer)
        event_free(c->adm_timer);
    if (c->read_ev)
        event_free(c->read_ev);
    bufferevent_free(c->bev);
    sl_http_parser_dispose(&c->req);
    for (int i = 0; i < c->cap_ch; i++) {
        sl_str_dispose(&c->ch[i].text);
        sl_str_dispose(&c->ch[i].held);
        free(c->ch[i].lp);
    }
    free(c->ch);
    free(c);
}

/* Frees closed connections, except those still on the flush list (the next on_flush reaps
 * them). */
static void reap(struct io *io)
{
    struct conn *c = io->dead;
    while (c) {
        struct conn *next = c->next;
        if (!c->flush_queued) {
            list_remove(&io->dead, c);
            conn_free(c);
        }
        c = next;
    }
}

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    reap(arg);
}

static void io_flush_later(struct io *io)
{
    if (!io->flush_pending) {
        io->flush_pending = true;
        event_active(io->flush_ev, EV_WRITE, 0);
    }
}

static void log_flush(struct io *io)
{
    if (io->log.len) {
        sl_log_write(io->log.p, io->log.len);
        sl_str_clear(&io->log);
    }
}

/* Once per loop iteration (after every callback that queued output in it): writes each plain
 * connection's output in one writev, moves each listed connection on, writes the access log. */
static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct io *io = arg;
    io->flush_pending = false;
    struct conn *c = io->flush;
    io->flush = NULL;
    while (c) {
        struct conn *next = c->flush_next;
        c->flush_queued = false;
        c->flush_next = NULL;
        if (!c->closed && !c->tls)
            conn_write_socket(c);
        if (!c->closed)
            conn_advance(c);
        c = next;
    }
    log_flush(io);
    reap(io);
}

/* Forgets the flush list (the loop is stopping), so reap() frees every closed connection. */
static void flush_list_clear(struct io *io)
{
    while (io->flush) {
        struct conn *c = io->flush;
        io->flush = c->flush_next;
        c->flush_queued = false;
        c->flush_next = NULL;
    }
}

static void conn_open(struct io *io, evutil_socket_t fd, bool tls)
{
    struct sl_http_server *s = io->srv;
    const struct sl_config *cfg = io->cfg;
    io->accept_error_logged = false;
    /* SSE chunks are small and latency is the point: no Nagle delay. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (cfg->tcp_send_buffer_bytes) {
        int v = (int)cfg->tcp_send_buffer_bytes;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
    }
    struct bufferevent *bev;
    if (tls) {
        SSL *ssl = SSL_new(io->tls_ctx);
        bev = ssl ? bufferevent_openssl_socket_new(io->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                   BEV_OPT_CLOSE_ON_FREE)
                  : NULL;
        if (!bev && ssl)
            SSL_free(ssl);
        if (bev)
            bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    } else {
        bev = bufferevent_socket_new(io->base, fd, BEV_OPT_CLOSE_ON_FREE);
    }
    if (!bev) {
        evutil_closesocket(fd);
        return;
    }
    struct conn *c = sl_xcalloc(1, sizeof *c);
    c->io = io;
    c->cfg = sl_config_ref(io->cfg);
    c->bev = bev;
    c->tls = tls;
    c->state = CONN_READING;
    c->tier = -1;
    sl_http_parser_init(&c->req, cfg->max_header_bytes, cfg->max_body_bytes);
    c->req.pause_at_head = true; /* conn_head() looks at the key before any of the body */
    c->timer = evtimer_new(io->base, conn_on_timer, c);
    list_push(&io->conns, c);
    bufferevent_setcb(bev, conn_on_read, conn_on_write, conn_on_event, c);
    bufferevent_setwatermark(bev, EV_READ, 0, READ_HIGH_WATER);
    conn_apply_cfg(c);
    /* Plain sockets are read by read_ev and written by on_flush; the bufferevent's write event
     * is enabled only when the kernel does not take everything. */
    if (tls) {
        bufferevent_enable(bev, EV_READ | EV_WRITE);
    } else {
        c->read_ev = event_new(io->base, fd, EV_READ | EV_PERSIST, conn_on_readable, c);
        event_add(c->read_ev, NULL);
    }
    if (atomic_fetch_add(&s->n_conns, 1) >= cfg->max_connections) {
        atomic_fetch_sub(&s->n_conns, 1);
        conn_refuse(c, 503, "too_many_connections",
                    "The server has too many open connections; retry later.", "Retry-After: 1\r\n");
        return;
    }
    c->counted = true;
    conn_timer_start(c, TIMER_HEAD, cfg->header_timeout_ms);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    (void)l, (void)sa, (void)salen;
    conn_open(arg, fd, false);
}

static void on_accept_tls(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                          int salen, void *arg)
{
    (void)l, (void)sa, (void)salen;
    conn_open(arg, fd, true);
}

static void on_accept_error(struct evconnlistener *l, void *arg)
{
    (void)l;
    struct io *io = arg;
    int e = EVUTIL_SOCKET_ERROR();
    if (!io->accept_error_logged)
        sl_log(SL_LOG_WARN, "io %d: accept: %s", io->idx, evutil_socket_error_to_string(e));
    io->accept_error_logged = true;
}

static void io_close_listeners(struct io *io)
{
    if (io->listener) {
        evconnlistener_free(io->listener);
        io->listener = NULL;
    }
    if (io->tls_listener) {
        evconnlistener_free(io->tls_listener);
        io->tls_listener = NULL;
    }
}

static void on_stop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct io *io = arg;
    io_close_listeners(io);
    while (io->conns)
        conn_close(io->conns);
    flush_list_clear(io);
    reap(io);
    /* Events already delivered belong to connections that are gone. */
    on_wake(-1, 0, io);
    log_flush(io);
    event_base_loopbreak(io->base);
}

/* Adopts the server's current configuration (and TLS context) for the connections and requests
 * that start from now on. */
static void on_reload(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct io *io = arg;
    struct sl_http_server *s = io->srv;
    pthread_mutex_lock(&s->cfg_lock);
    struct sl_config *next = sl_config_ref(s->cfg);
    SSL_CTX *ctx = s->tls_ctx;
    if (ctx)
        SSL_CTX_up_ref(ctx);
    pthread_mutex_unlock(&s->cfg_lock);
    sl_config_unref(io->cfg);
    io->cfg = next;
    if (io->tls_ctx)
        SSL_CTX_free(io->tls_ctx);
    io->tls_ctx = ctx;
}

static void *io_main(void *arg)
{
    struct io *io = arg;
    event_base_loop(io->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

/* ---- drain ---- */

static void serve_ready(struct conn *c)
{
    struct sl_http_server *s = c->io->srv;
    struct sl_openai_error err;
    if (c->io->draining || atomic_load(&s->draining)) {
        sl_openai_error_set(&err, 503, NULL, "draining", "The server is shutting down.");
    } else if (!s->engines[0].model || !s->engines[0].sched[0]) {
        sl_openai_error_set(&err, 503, NULL, "not_ready",
                            "This server has no engine to run completions.");
    } else {
        static const char ok[] = "{\"status\":\"ready\"}";
        send_body(c, 200, "application/json", NULL, ok, sizeof ok - 1);
        return;
    }
    send_error(c, &err, NULL);
}

/* Stops accepting; requests that start from now on are refused (conn_after_parse). */
static void on_drain(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct io *io = arg;
    struct sl_http_server *s = io->srv;
    io->draining = true;
    io_close_listeners(io);
    pthread_mutex_lock(&s->drain_lock);
    s->drain_acks++;
    pthread_cond_broadcast(&s->drain_cond);
    pthread_mutex_unlock(&s->drain_lock);
}

/* The drain timed out: every request still here is cancelled and its client told so. */
static void on_drain_cancel(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct io *io = arg;
    for (struct conn *c = io->conns, *next; c; c = next) {
        next = c->next;
        if (!c->closed && c->parked) {
            /* Still waiting for capacity: it never will now. */
            struct sl_openai_error err;
            admit_release(c, -1);
            c->adm.ran = false;
            c->keep_alive = false;
            sl_openai_error_set(&err, 503, NULL, "draining",
                                "The server is shutting down; retry the request elsewhere.");
            send_error(c, &err, "Retry-After: 1\r\n");
            continue;
        }
        if (c->closed || c->n_live == 0)
            continue;
        /* Ended as cancelled: the first choice still running ends the response, and with it
         * the others (on_done cancels them in the scheduler). */
        struct choice *ch = c->ch;
        while (ch->done)
            ch++;
        sl_sched_cancel(io->srv->engines[c->engine].sched[c->replica], ch->req);
        struct sl_out_event e = {.req = ch->req,
                                 .kind = SL_OUT_DONE,
                                 .finish = SL_FINISH_CANCELLED,
                                 .n_tokens = ch->n_gen};
        c->keep_alive = false;
        on_done(c, ch, &e);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Public API
 */

/* A socket bound (listening when backlog > 0) to ai's address and port, with SO_REUSEPORT when
 * reuseport; -1 with err set. */
static int open_listener(const struct addrinfo *ai, int port, int backlog, bool reuseport,
                         char *err, size_t errlen, const char *host)
{
    struct sockaddr_storage ss;
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
    else if (ss.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0) ||
        bind(fd, (struct sockaddr *)&ss, ai->ai_addrlen) < 0 ||
        (backlog > 0 && listen(fd, backlog) < 0)) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
}

/* Opens n listening sockets on host:port, one per I/O thread, which share it with SO_REUSEPORT
 * so that the kernel spreads connections. SO_REUSEPORT would also let another process join
 * (another sluice started on the same port would take a share of the traffic), so the port is
 * first claimed by a probe bound without it: the bind fails with EADDRINUSE while anyone listens
 * there. The probe (SO_REUSEADDR, never listening) does not stand in the way of our own sockets,
 * which join it on the port it got (port 0: any), and is closed once they listen; from then on
 * any socket without SO_REUSEPORT conflicts with them, as a second sluice's probe does. With
 * n = 0 only the probe is made: whether the server could listen there now. */
static int listen_all(const char *host, int port, int backlog, int n, int *fds, int *bound,
                      char *err, size_t errlen)
{
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ais = NULL;
    int gai = getaddrinfo(host, NULL, &hints, &ais);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve listen host \"%s\": %s", host, gai_strerror(gai));
        return SL_EINVAL;
    }
    const struct addrinfo *ai = ais;
    int probe = -1;
    for (; ai; ai = ai->ai_next)
        if ((probe = open_listener(ai, port, 0, false, err, errlen, host)) >= 0)
            break;
    int st = SL_OK;
    if (!ai) {
        st = SL_EIO;
    } else {
        *bound = bound_port(probe);
        for (int i = 0; i < n && st == SL_OK; i++) /* the caller closes those opened */
            if ((fds[i] = open_listener(ai, *bound, backlog, n > 1, err, errlen, host)) < 0)
                st = SL_EIO;
        close(probe);
    }
    freeaddrinfo(ais);
    return st;
}

int sl_http_listen_check(const struct sl_config *cfg, char *err, size_t errlen)
{
    int port;
    int st = listen_all(cfg->listen_host, cfg->listen_port, 0, 0, NULL, &port, err, errlen);
    if (st == SL_OK && cfg->tls.cert)
        st = listen_all(cfg->tls.listen_host, cfg->tls.listen_port, 0, 0, NULL, &port, err, errlen);
    return st;
}

static struct evconnlistener *listener_new(struct io *io, int fd, evconnlistener_cb cb)
{
    struct evconnlistener *l =
        evconnlistener_new(io->base, cb, io, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
    if (l)
        evconnlistener_set_error_cb(l, on_accept_error);
    return l;
}

/* Takes the listening sockets: on failure they are closed. */
static int io_init(struct io *io, struct sl_http_server *s, int idx, int fd, int tls_fd, char *err,
                   size_t errlen)
{
    io->srv = s;
    io->cfg = sl_config_ref(s->cfg);
    io->idx = idx;
    sl_str_init(&io->out);
    sl_str_init(&io->line);
    sl_str_init(&io->wbuf);
    sl_str_init(&io->log);
    if (s->tls_ctx) {
        SSL_CTX_up_ref(s->tls_ctx);
        io->tls_ctx = s->tls_ctx;
    }
    io->base = event_base_new();
    if (io->base) {
        io->listener = listener_new(io, fd, on_accept);
        if (io->listener)
            fd = -1;
        if (tls_fd >= 0 && (io->tls_listener = listener_new(io, tls_fd, on_accept_tls)))
            tls_fd = -1;
    }
    if (fd >= 0 || tls_fd >= 0) {
        snprintf(err, errlen, "cannot set up the event loop of I/O thread %d", idx);
        if (fd >= 0)
            close(fd);
        if (tls_fd >= 0)
            close(tls_fd);
        return SL_ENOMEM;
    }
    io->wake_ev = event_new(io->base, -1, 0, on_wake, io);
    io->stop_ev = event_new(io->base, -1, 0, on_stop, io);
    io->reap_ev = event_new(io->base, -1, 0, on_reap, io);
    io->reload_ev = event_new(io->base, -1, 0, on_reload, io);
    io->drain_ev = event_new(io->base, -1, 0, on_drain, io);
    io->cancel_ev = event_new(io->base, -1, 0, on_drain_cancel, io);
    io->flush_ev = event_new(io->base, -1, 0, on_flush, io);
    if (!io->wake_ev || !io->stop_ev || !io->reap_ev || !io->reload_ev || !io->drain_ev ||
        !io->cancel_ev || !io->flush_ev) {
        snprintf(err, errlen, "event_new failed");
        return SL_ENOMEM;
    }
    io->outbox = sl_outbox_new(outbox_wake, io);
    return SL_OK;
}

static void io_dispose(struct io *io)
{
    while (io->conns)
        conn_close(io->conns);
    flush_list_clear(io);
    reap(io);
    log_flush(io);
    io_close_listeners(io);
    struct event *evs[] = {io->wake_ev,  io->stop_ev,   io->reap_ev, io->reload_ev,
                           io->drain_ev, io->cancel_ev, io->flush_ev};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    sl_config_unref(io->cfg);
    if (io->tls_ctx)
        SSL_CTX_free(io->tls_ctx);
    sl_outbox_free(io->outbox);
    if (io->base)
        event_base_free(io->base);
    free(io->ids);
    sl_str_dispose(&io->out);
    sl_str_dispose(&io->line);
    sl_str_dispose(&io->wbuf);
    sl_str_dispose(&io->log);
}

static void engine_set(struct engine *e, const char *name, const struct sl_model *model,
                       struct sl_sched *sched)
{
    snprintf(e->name, sizeof e->name, "%s", name);
    e->model = model;
    e->sched[0] = sched;
    e->n_replicas = sched ? 1 : 0;
    for (int r = 0; r < SL_REPLICAS_MAX; r++)
        atomic_init(&e->in_flight[r], 0);
    e->chat_template = sl_chat_template_of_model(model);
}

int sl_http_server_new(struct sl_config *cfg, const struct sl_model *model, struct sl_sched *sched,
                       struct sl_http_server **out, char *err, size_t errlen)
{
    if (cfg->io_threads < 1) {
        snprintf(err, errlen, "io_threads must be at least 1");
        return SL_EINVAL;
    }
    int n = cfg->io_threads;
    int *fds = sl_xmalloc(2 * (size_t)n * sizeof *fds), *tls_fds = fds + n;
    for (int i = 0; i < 2 * n; i++)
        fds[i] = -1;

    struct sl_http_server *s = sl_xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->cfg_lock, NULL);
    pthread_mutex_init(&s->drain_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->drain_cond, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&s->n_conns, 0);
    atomic_init(&s->busy, 0);
    atomic_init(&s->draining, false);
    s->cfg = sl_config_ref(cfg);
    sl_admission_adopt(s->cfg, NULL, (int64_t)sl_clock_ns());
    engine_set(&s->engines[0], cfg->models[0].name ? cfg->models[0].name : sl_model_id(model),
               model, sched);
    if (!cfg->models[0].name && strcmp(cfg->models[0].spec, s->engines[0].name) != 0)
        s->engines[0].alias = sl_xstrdup(cfg->models[0].spec);
    s->engine_names[0] = s->engines[0].name;
    s->n_engines = 1;
    s->created = sl_clock_unix();
    if (getrandom(&s->nonce, sizeof s->nonce, GRND_NONBLOCK) != (ssize_t)sizeof s->nonce)
        s->nonce = (uint32_t)sl_clock_ns();
    s->io = sl_xcalloc((size_t)n, sizeof *s->io);
    s->metrics = sl_metrics_new(n);

    int st = listen_all(cfg->listen_host, cfg->listen_port, cfg->listen_backlog, n, fds, &s->port,
                        err, errlen);
    if (st == SL_OK && cfg->tls.cert) {
        if (!(s->tls_ctx = sl_tls_ctx_new(cfg, err, errlen)))
            st = SL_EINVAL;
        else
            st = listen_all(cfg->tls.listen_host, cfg->tls.listen_port, cfg->listen_backlog, n,
                            tls_fds, &s->tls_port, err, errlen);
    }
    for (int i = 0; i < n && st == SL_OK; i++) {
        s->n_io = i + 1;
        st = io_init(&s->io[i], s, i, fds[i], tls_fds[i], err, errlen);
        fds[i] = tls_fds[i] = -1;
    }
    for (int i = 0; i < 2 * n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    if (st != SL_OK) {
        sl_http_server_free(s);
        return st;
    }
    *out = s;
    return SL_OK;
}

int sl_http_server_add_model(struct sl_http_server *s, const char *name,
                             const struct sl_model *model, struct sl_sched *sched, char *err,
                             size_t errlen)
{
    if (s->started || s->n_engines >= SL_MODELS_MAX || !name || !model) {
        snprintf(err, errlen, "cannot serve model \"%s\": at most %d models, added before start",
                 name ? name : "?", SL_MODELS_MAX);
        return SL_EINVAL;
    }
    for (int i = 0; i < s->n_engines; i++)
        if (strcmp(s->engines[i].name, name) == 0) {
            snprintf(err, errlen, "two models are named \"%s\"", name);
            return SL_EINVAL;
        }
    struct engine *e = &s->engines[s->n_engines];
    engine_set(e, name, model, sched);
    s->engine_names[s->n_engines++] = e->name;
    return SL_OK;
}

int sl_http_server_add_replica(struct sl_http_server *s, const char *name, struct sl_sched *sched,
                               char *err, size_t errlen)
{
    for (int i = 0; i < s->n_engines && !s->started; i++) {
        struct engine *e = &s->engines[i];
        if (strcmp(e->name, name) != 0)
            continue;
        if (e->n_replicas < 1 || e->n_replicas >= SL_REPLICAS_MAX || !sched)
            break;
        e->sched[e->n_replicas++] = sched;
        return SL_OK;
    }
    snprintf(err, errlen,
             "cannot add a replica of model \"%s\": not served, at most %d replicas, added "
             "before start",
             name ? name : "?", SL_REPLICAS_MAX);
    return SL_EINVAL;
}

int sl_http_server_port(const struct sl_http_server *s)
{
    return s->port;
}

int sl_http_server_tls_port(const struct sl_http_server *s)
{
    return s->tls_port;
}

int sl_http_server_start(struct sl_http_server *s)
{
    if (s->started)
        return SL_OK;
    s->started = true;
    /* Prompt scratch for the longest context of the models served. */
    int seq_len = 1;
    for (int i = 0; i < s->n_engines; i++)
        if (sl_model_config(s->engines[i].model)->seq_len > seq_len)
            seq_len = sl_model_config(s->engines[i].model)->seq_len;
    for (int i = 0; i < s->n_io; i++)
        s->io[i].ids = sl_xmalloc(sizeof(int32_t) * (size_t)seq_len);
    for (int i = 0; i < s->n_io; i++) {
        int e = pthread_create(&s->io[i].thread, NULL, io_main, &s->io[i]);
        if (e != 0) {
            sl_log(SL_LOG_ERROR, "cannot start I/O thread %d: %s", i, strerror(e));
            sl_http_server_stop(s);
            return SL_ENOMEM;
        }
        s->io[i].running = true;
    }
    return SL_OK;
}

void sl_http_server_stop(struct sl_http_server *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_io; i++)
        if (s->io[i].running)
            event_active(s->io[i].stop_ev, EV_READ, 0);
    for (int i = 0; i < s->n_io; i++)
        if (s->io[i].running) {
            pthread_join(s->io[i].thread, NULL);
            s->io[i].running = false;
        }
}

void sl_http_server_free(struct sl_http_server *s)
{
    if (!s)
        return;
    sl_http_server_stop(s);
    for (int i = 0; i < s->n_io; i++)
        io_dispose(&s->io[i]);
    free(s->io);
    sl_metrics_free(s->metrics);
    for (int i = 0; i < s->n_engines; i++)
        free(s->engines[i].alias);
    sl_config_unref(s->cfg);
    if (s->tls_ctx)
        SSL_CTX_free(s->tls_ctx);
    pthread_mutex_destroy(&s->cfg_lock);
    pthread_mutex_destroy(&s->drain_lock);
    pthread_cond_destroy(&s->drain_cond);
    free(s);
}

/* Keys read only at start: a reload keeps the running value and says so. */
static void keep_start_keys(struct sl_config *next, const struct sl_config *cur)
{
#define KEEP_STR(f)                                                                                \
    if (!(next->f == cur->f || (next->f && cur->f && strcmp(next->f, cur->f) == 0))) {             \
        sl_log(SL_LOG_WARN, "reload: \"" #f "\" changes only on restart; keeping \"%s\"",          \
               cur->f ? cur->f : "null");                                                          \
        free(next->f);                                                                             \
        next->f = cur->f ? sl_xstrdup(cur->f) : NULL;                                              \
    }
#define KEEP_NUM(f)                                                                                \
    if (next->f != cur->f) {                                                                       \
        sl_log(SL_LOG_WARN, "reload: \"" #f "\" changes only on restart; keeping %g",              \
               (double)cur->f);                                                                    \
        next->f = cur->f;                                                                          \
    }
    KEEP_STR(listen_host)
    KEEP_NUM(listen_port)
    KEEP_NUM(listen_backlog)
    KEEP_STR(model)
    KEEP_STR(tokenizer)
    KEEP_STR(device)
    KEEP_NUM(io_threads)
    KEEP_NUM(threads)
    KEEP_NUM(pin_threads)
    KEEP_STR(cpu_isa)
    KEEP_NUM(max_seqs)
    KEEP_NUM(max_batch_tokens)
    KEEP_NUM(block_size)
    KEEP_NUM(kv_cache_mib)
    KEEP_NUM(kv_cache_fraction)
    if (next->kv_dtype != cur->kv_dtype) {
        sl_log(SL_LOG_WARN, "reload: \"kv_dtype\" changes only on restart; keeping %s",
               sl_kv_dtype_name(cur->kv_dtype));
        next->kv_dtype = cur->kv_dtype;
    }
    /* The TLS listener exists or not from the start; its certificate and key are reloadable. */
    if (!cur->tls.cert != !next->tls.cert) {
        sl_log(SL_LOG_WARN, "reload: \"tls\" can be %s only on restart; keeping it %s",
               cur->tls.cert ? "removed" : "added", cur->tls.cert ? "as it was" : "off");
        free(next->tls.listen_host);
        free(next->tls.cert);
        free(next->tls.key);
        next->tls.listen_host = cur->tls.listen_host ? sl_xstrdup(cur->tls.listen_host) : NULL;
        next->tls.listen_port = cur->tls.listen_port;
        next->tls.cert = cur->tls.cert ? sl_xstrdup(cur->tls.cert) : NULL;
        next->tls.key = cur->tls.key ? sl_xstrdup(cur->tls.key) : NULL;
    }
    KEEP_STR(tls.listen_host)
    KEEP_NUM(tls.listen_port)
#undef KEEP_STR
#undef KEEP_NUM
    /* Each model has its worker and scheduler from the start. */
    if (!sl_config_models_equal(next, cur)) {
        sl_log(SL_LOG_WARN, "reload: \"models\" change only on restart; keeping the %d served",
               cur->n_models);
        sl_config_models_copy(next, cur);
    }
}

int sl_http_server_reload(struct sl_http_server *s, struct sl_config *next, char *err,
                          size_t errlen)
{
    if (sl_config_validate(next, err, errlen) != SL_OK)
        return SL_EINVAL;
    pthread_mutex_lock(&s->cfg_lock);
    struct sl_config *cur = sl_config_ref(s->cfg);
    pthread_mutex_unlock(&s->cfg_lock);
    keep_start_keys(next, cur);
    /* The new certificate must load before anything changes. */
    SSL_CTX *ctx = NULL;
    if (next->tls.cert && !(ctx = sl_tls_ctx_new(next, err, errlen))) {
        sl_config_unref(cur);
        return SL_EINVAL;
    }
    /* Buckets and queue counts of the tenants and tiers both configurations have carry over (a
     * changed rate rescales a shared bucket: only once the reload can no longer fail). */
    sl_admission_adopt(next, cur, (int64_t)sl_clock_ns());
    sl_config_unref(cur);
    pthread_mutex_lock(&s->cfg_lock);
    struct sl_config *old = s->cfg;
    s->cfg = sl_config_ref(next);
    SSL_CTX *old_ctx = s->tls_ctx;
    s->tls_ctx = ctx;
    pthread_mutex_unlock(&s->cfg_lock);
    sl_config_unref(old);
    if (old_ctx)
        SSL_CTX_free(old_ctx);
    for (int i = 0; i < s->n_io; i++)
        event_active(s->io[i].reload_ev, EV_READ, 0);
    /* Every model's scheduler takes the new tier table through its inbox. */
    struct sl_sched_tier tiers[SL_SCHED_MAX_TIERS];
    int n_tiers = sl_config_sched_tiers(next, tiers, SL_SCHED_MAX_TIERS);
    for (int i = 0; i < s->n_engines; i++)
        for (int r = 0; r < s->engines[i].n_replicas; r++)
            sl_sched_set_tiers(s->engines[i].sched[r], tiers, n_tiers);
    return SL_OK;
}

/* Waits until no response is in progress or the monotonic deadline passes; true when none is. */
static bool drain_wait(struct sl_http_server *s, const struct timespec *deadline)
{
    pthread_mutex_lock(&s->drain_lock);
    while (atomic_load(&s->busy) > 0)
        if (pthread_cond_timedwait(&s->drain_cond, &s->drain_lock, deadline) == ETIMEDOUT)
            break;
    bool idle = atomic_load(&s->busy) == 0;
    pthread_mutex_unlock(&s->drain_lock);
    return idle;
}

static struct timespec deadline_after(int ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

int sl_http_server_drain(struct sl_http_server *s, int timeout_ms)
{
    if (timeout_ms < 0) {
        pthread_mutex_lock(&s->cfg_lock);
        timeout_ms = s->cfg->drain_timeout_ms;
        pthread_mutex_unlock(&s->cfg_lock);
    }
    int running = 0;
    pthread_mutex_lock(&s->drain_lock);
    s->drain_acks = 0;
    pthread_mutex_unlock(&s->drain_lock);
    atomic_store(&s->draining, true);
    for (int i = 0; i < s->n_io; i++)
        if (s->io[i].running) {
            running++;
            event_active(s->io[i].drain_ev, EV_READ, 0);
        }
    /* Every thread has closed its listeners before the drain is announced. */
    pthread_mutex_lock(&s->drain_lock);
    while (s->drain_acks < running)
        pthread_cond_wait(&s->drain_cond, &s->drain_lock);
    pthread_mutex_unlock(&s->drain_lock);
    sl_log(SL_LOG_INFO,
           "draining: not accepting; %d responses in progress, waiting up to %d ms for them",
           atomic_load(&s->busy), timeout_ms);
    struct timespec deadline = deadline_after(timeout_ms);
    if (drain_wait(s, &deadline)) {
        sl_log(SL_LOG_INFO, "drained");
        return SL_OK;
    }
    sl_log(SL_LOG_WARN, "drain: %d responses still in progress after %d ms; cancelling them",
           atomic_load(&s->busy), timeout_ms);
    for (int i = 0; i < s->n_io; i++)
        if (s->io[i].running)
            event_active(s->io[i].cancel_ev, EV_READ, 0);
    deadline = deadline_after(DRAIN_CANCEL_GRACE_MS);
    if (!drain_wait(s, &deadline))
        sl_log(SL_LOG_WARN, "drain: %d responses could not be completed; closing them",
               atomic_load(&s->busy));
    return SL_ETIMEDOUT;
}
