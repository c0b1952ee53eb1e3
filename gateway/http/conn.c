/* Connections: reading and parsing requests, writing responses, timeouts, keep-alive, pipelining
 * and the exchange of each request, handed to the server's handler (struct sl_http_handler). The
 * listeners, threads, reload and drain are server.c's.
 *
 * A connection serves one request at a time: while a response is in progress, the next
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
 * timeout while the client does not read, max_connections, and the handler's own limits on what
 * waits for a slow client (sl_http_queued).
 */
#include "http_impl.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* Bytes a connection buffers from the socket while its current request is being answered. */
#define READ_HIGH_WATER (64 << 10)
/* After an error answer, input discarded (at most, and for at most LINGER_SECS) so that the
 * close does not reset the connection before the client has read the answer. */
#define LINGER_MAX_BYTES (4 << 20)
#define LINGER_SECS 2
/* A refused request's body that is read anyway, so that its refusal keeps the connection: one
 * that came whole with its head (bytes the server holds already), up to this size. */
#define EARLY_REFUSAL_BODY_MAX (64 << 10)

typedef struct sl_http_conn conn_t;

static void conn_advance(conn_t *c);
static void conn_set_busy(conn_t *c, bool busy);

static conn_t *conn_of(const struct sl_exchange *x)
{
    return x->conn;
}

static void list_remove(conn_t **head, conn_t *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        *head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static void list_push(conn_t **head, conn_t *c)
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

/* ---- the exchange's view of the request ---- */

static struct sl_strv strv(const struct sl_http_parser *p, struct sl_http_span s)
{
    return (struct sl_strv){s.len ? sl_http_span_ptr(p, s) : "", s.len};
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int sl_exchange_query_param(const struct sl_exchange *x, const char *name, char *out, size_t outlen)
{
    size_t n = strlen(name);
    const char *q = x->query.p, *end = q + x->query.len;
    while (q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *e = amp ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(e - q));
        const char *k_end = eq ? eq : e;
        if ((size_t)(k_end - q) == n && memcmp(q, name, n) == 0) {
            size_t o = 0;
            for (const char *v = eq ? eq + 1 : e; v < e; v++) {
                int c = (unsigned char)*v;
                if (c == '+') {
                    c = ' ';
                } else if (c == '%') {
                    if (e - v < 3)
                        return -1;
                    int h = hex_value(v[1]), l = hex_value(v[2]);
                    if (h < 0 || l < 0)
                        return -1;
                    c = h * 16 + l;
                    v += 2;
                }
                if (c == 0 || o + 1 >= outlen)
                    return -1;
                out[o++] = (char)c;
            }
            out[o] = '\0';
            return 1;
        }
        q = e + 1;
    }
    return 0;
}

bool sl_exchange_header(const struct sl_exchange *x, const char *name, struct sl_strv *value)
{
    const struct sl_http_parser *p = &conn_of(x)->req;
    struct sl_http_span s;
    if (!p->headers_complete || !sl_http_parser_header(p, name, &s))
        return false;
    /* llhttp leaves trailing spaces in a value. */
    while (s.len && (p->buf.p[s.off + s.len - 1] == ' ' || p->buf.p[s.off + s.len - 1] == '\t'))
        s.len--;
    *value = strv(p, s);
    return true;
}

bool sl_exchange_path_is(const struct sl_exchange *x, const char *lit)
{
    return x->path.len == strlen(lit) && memcmp(x->path.p, lit, x->path.len) == 0;
}

bool sl_exchange_is_get(const struct sl_exchange *x)
{
    return x->method == HTTP_GET || x->method == HTTP_HEAD;
}

bool sl_exchange_draining(const struct sl_exchange *x)
{
    return conn_of(x)->io->draining;
}

/* ---- writing responses ---- */

static void str_add(struct sl_str *w, const char *lit)
{
    sl_str_append(w, lit, strlen(lit));
}

/* Puts the connection on its thread's flush list: sl_http_io_on_flush writes its output (plain
 * sockets) and moves it on (conn_advance) at the end of this loop iteration. */
static void conn_flush_later(conn_t *c)
{
    if (c->flush_queued)
        return;
    c->flush_queued = true;
    c->flush_next = c->io->flush;
    c->io->flush = c;
    sl_http_io_flush_later(c->io);
}

/* Queues bytes for the client. bufferevent_openssl encrypts and writes them at once. */
static void conn_write(conn_t *c, const void *data, size_t len)
{
    if (c->tls && c->io->srv->h.before_write)
        c->io->srv->h.before_write(c->io->handler_thread);
    evbuffer_add(bufferevent_get_output(c->bev), data, len);
    conn_flush_later(c);
}

/* Appends the status line and headers to w. content_length < 0: the body is chunked (HTTP/1.1)
 * or ends with the connection (HTTP/1.0). Built with appends, not printf: this is the hot path. */
static void head_format(struct sl_exchange *x, struct sl_str *w, int code, const char *ctype,
                        long long content_length, const char *extra)
{
    conn_t *c = conn_of(x);
    /* Once draining, every response says the connection ends with it. */
    if (c->io->draining)
        x->keep_alive = false;
    x->status = code;
    str_add(w, "HTTP/1.1 ");
    sl_str_append_int(w, code);
    sl_str_append(w, " ", 1);
    str_add(w, sl_http_reason_phrase(code));
    str_add(w, "\r\nServer: sluice/" SL_VERSION "\r\nDate: ");
    str_add(w, io_date(c->io));
    str_add(w, "\r\nContent-Type: ");
    str_add(w, ctype);
    if (content_length >= 0) {
        str_add(w, "\r\nContent-Length: ");
        sl_str_append_int(w, content_length);
    } else if (x->chunked) {
        str_add(w, "\r\nTransfer-Encoding: chunked");
    }
    str_add(w, x->keep_alive ? "\r\nConnection: keep-alive\r\n" : "\r\nConnection: close\r\n");
    if (extra)
        str_add(w, extra);
    sl_str_append(w, "\r\n", 2);
}

/* The whole response is queued: once enough of it is written, the exchange ends and the
 * connection serves the next request or closes (conn_advance, from the flush). */
static void conn_done(conn_t *c)
{
    c->state = CONN_FLUSHING;
    conn_flush_later(c);
}

void sl_http_send(struct sl_exchange *x, int status, const char *ctype, const char *extra,
                  const char *body, size_t len)
{
    conn_t *c = conn_of(x);
    /* Head and body in one piece: one TLS record, one evbuffer chain. */
    struct sl_str *w = &c->io->wbuf;
    sl_str_clear(w);
    head_format(x, w, status, ctype, (long long)len, extra);
    sl_http_log_access(x);
    if (x->method != HTTP_HEAD || !x->parsed)
        sl_str_append(w, body, len);
    conn_write(c, w->p, w->len);
    conn_done(c);
}

void sl_http_send_head(struct sl_exchange *x, int status, const char *ctype, const char *extra)
{
    conn_t *c = conn_of(x);
    /* HTTP/1.0 has no chunked encoding: the stream then ends with the connection. */
    x->chunked = x->http_major == 1 && x->http_minor >= 1;
    if (!x->chunked)
        x->keep_alive = false;
    x->head_sent = true;
    struct sl_str *w = &c->io->wbuf;
    sl_str_clear(w);
    head_format(x, w, status, ctype, -1, extra);
    conn_write(c, w->p, w->len);
}

/* Writes n in hex (a chunk size) at p; returns the end. */
static char *put_hex(char *p, size_t n)
{
    char d[2 * sizeof n];
    size_t i = sizeof d;
    do
        d[--i] = "0123456789abcdef"[n & 15];
    while ((n >>= 4) != 0);
    memcpy(p, d + i, sizeof d - i);
    return p + (sizeof d - i);
}

static char *put(char *p, const void *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

/* A server-sent event is framed in the output buffer around its payload, which the caller writes
 * in place: the room is reserved with the payload at a fixed offset past the longest framing that
 * can precede it, and at commit the framing is written and the payload moved back against it
 * (a few hundred bytes at most, in cache). One reservation is open at a time per connection. */
#define SSE_EVENT_MAX 64 /* longest event name */
#define SSE_PRE_MAX (2 * sizeof(size_t) + 2 + 7 + SSE_EVENT_MAX + 1 + 6)
#define SSE_POST_MAX 4 /* "\n\n", "\r\n" */

char *sl_http_sse_begin(struct sl_exchange *x, const char *event, size_t max)
{
    conn_t *c = conn_of(x);
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_reserve_space(out, (ev_ssize_t)(SSE_PRE_MAX + max + SSE_POST_MAX), &c->sse, 1) < 1)
        abort(); /* libevent could not allocate: the style's answer is to stop */
    c->sse_event = event;
    return (char *)c->sse.iov_base + SSE_PRE_MAX;
}

void sl_http_sse_commit(struct sl_exchange *x, char *end)
{
    static const char ev[] = "event: ", pre[] = "data: ", post[] = "\n\n";
    conn_t *c = conn_of(x);
    const char *event = c->sse_event;
    char *base = c->sse.iov_base, *payload = base + SSE_PRE_MAX;
    size_t len = (size_t)(end - payload);
    size_t elen = event ? strnlen(event, SSE_EVENT_MAX) : 0;
    size_t n = sizeof pre - 1 + len + sizeof post - 1 + (event ? sizeof ev - 1 + elen + 1 : 0);
    char *p = base;
    if (x->chunked) {
        p = put_hex(p, n);
        p = put(p, "\r\n", 2);
    }
    if (event) {
        p = put(p, ev, sizeof ev - 1);
        p = put(p, event, elen);
        *p++ = '\n';
    }
    p = put(p, pre, sizeof pre - 1);
    memmove(p, payload, len);
    p += len;
    p = put(p, post, sizeof post - 1);
    if (x->chunked)
        p = put(p, "\r\n", 2);
    c->sse.iov_len = (size_t)(p - base);
    evbuffer_commit_space(bufferevent_get_output(c->bev), &c->sse, 1);
    conn_flush_later(c);
}

static void send_event(struct sl_exchange *x, const char *event, const char *payload, size_t len)
{
    char *p = sl_http_sse_begin(x, event, len);
    memcpy(p, payload, len);
    sl_http_sse_commit(x, p + len);
}

void sl_http_send_sse(struct sl_exchange *x, const char *payload, size_t len)
{
    send_event(x, NULL, payload, len);
}

void sl_http_send_sse_event(struct sl_exchange *x, const char *event, const char *payload,
                            size_t len)
{
    send_event(x, event, payload, len);
}

void sl_http_end(struct sl_exchange *x)
{
    sl_http_end_trailers(x, NULL);
}

void sl_http_end_trailers(struct sl_exchange *x, const char *trailers)
{
    conn_t *c = conn_of(x);
    if (x->chunked) {
        struct sl_str *w = &c->io->wbuf;
        sl_str_clear(w);
        sl_str_append(w, "0\r\n", 3);
        if (trailers)
            sl_str_append(w, trailers, strlen(trailers));
        sl_str_append(w, "\r\n", 2);
        conn_write(c, w->p, w->len);
    }
    conn_done(c);
}

bool sl_exchange_chunked(const struct sl_exchange *x)
{
    return x->http_major == 1 && x->http_minor >= 1;
}

size_t sl_http_queued(const struct sl_exchange *x)
{
    return evbuffer_get_length(bufferevent_get_output(conn_of(x)->bev));
}

void sl_http_abort(struct sl_exchange *x)
{
    sl_http_conn_close(conn_of(x));
}

/* ---- exchanges ---- */

static struct timeval ms_tv(int ms)
{
    return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
}

/* Takes up the connection's configuration: limits, the write low watermark (the output below
 * which the next pipelined request is taken up) and the write timeout (a client that reads
 * nothing for idle_timeout_ms is dropped). */
static void conn_apply_cfg(conn_t *c)
{
    const struct sl_config_http *hc = sl_config_http(c->cfg);
    c->req.max_header_bytes = hc->max_header_bytes;
    c->req.max_body_bytes = hc->max_body_bytes;
    bufferevent_setwatermark(c->bev, EV_WRITE, hc->write_high_water_bytes, 0);
    struct timeval tv = ms_tv(hc->idle_timeout_ms);
    bufferevent_set_timeouts(c->bev, NULL, &tv);
}

/* Takes up the I/O thread's configuration if a reload replaced the connection's: keys, tiers and
 * limits apply from the request that starts now on, so a revoked key does not live on in a
 * kept-alive connection. A request keeps the configuration it started with. */
static void conn_adopt_cfg(conn_t *c)
{
    if (c->cfg == c->io->cfg)
        return;
    sl_config_unref(c->cfg);
    c->cfg = sl_config_ref(c->io->cfg);
    conn_apply_cfg(c);
}

static void conn_set_busy(conn_t *c, bool busy)
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

/* The exchange ends: the handler lets go of it (cancelled when its response is not complete)
 * and its arena is reset. */
static void exchange_end(conn_t *c, bool cancel)
{
    if (!c->active)
        return;
    c->active = false;
    struct sl_exchange *x = &c->x;
    c->io->srv->h.on_close(x, cancel);
    x->data = NULL;
    sl_arena_reset(&x->arena);
    x->cfg = NULL;
}

/* The request's view from the parser: the head once it is whole, the body once it is all here. */
static void exchange_view(conn_t *c)
{
    struct sl_exchange *x = &c->x;
    const struct sl_http_parser *p = &c->req;
    x->method = p->method;
    x->method_name = llhttp_method_name(p->method);
    x->http_major = p->http_major;
    x->http_minor = p->http_minor;
    x->path = strv(p, sl_http_parser_path(p));
    x->query = strv(p, sl_http_parser_query(p));
    x->body = strv(p, p->body);
}

/* A request (or a refusal) starts: its exchange begins, and its response is in progress until
 * written. */
static struct sl_exchange *exchange_begin(conn_t *c)
{
    exchange_end(c, true); /* none is active here; this only makes sure */
    conn_adopt_cfg(c);
    struct sl_exchange *x = &c->x;
    x->data = NULL;
    x->cfg = c->cfg; /* the connection's reference: it changes only between exchanges */
    x->parsed = false;
    x->body_skipped = false;
    x->method = 0;
    x->method_name = "";
    x->http_major = x->http_minor = 0;
    x->path = x->body = (struct sl_strv){"", 0};
    x->status = 0;
    x->keep_alive = false;
    x->chunked = false;
    x->head_sent = false;
    x->t_start_ns = sl_clock_ns();
    x->t_end_ns = 0;
    x->log = (struct sl_http_log){.predicted_ttft_ms = -1, .replica = -1};
    x->logged = false;
    c->active = true;
    conn_set_busy(c, true);
    return x;
}

/* Answers an error itself (through the handler's on_error), after which the connection ends.
 * The write side is then shut and input discarded for a while, so the client reads the answer
 * rather than a reset. */
static void conn_refuse(conn_t *c, int code, const char *errcode, const char *why,
                        const char *extra)
{
    struct sl_exchange *x = exchange_begin(c);
    c->linger = true;
    c->io->srv->h.on_error(x, code, errcode, why, extra);
}

static void conn_after_parse(conn_t *c, enum sl_http_parse st)
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
    struct sl_exchange *x = c->active ? &c->x : exchange_begin(c);
    exchange_view(c);
    x->parsed = true;
    x->keep_alive = p->keep_alive;
    c->state = CONN_WAITING;
    c->io->srv->h.on_request(x);
}

/* Reads again once the input buffer has room for what the client sends next. */
static void conn_read_resume(conn_t *c)
{
    if (c->read_paused && !c->read_eof && !c->closed &&
        evbuffer_get_length(bufferevent_get_input(c->bev)) < READ_HIGH_WATER) {
        c->read_paused = false;
        event_add(c->read_ev, NULL);
    }
}

/* Moves input into the parser until one request is whole (the rest stays in the evbuffer). */
static enum sl_http_parse conn_parse(conn_t *c)
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

/* The head is whole: the handler judges it (a route that needs a key it lacks) before any of the
 * body is read. A refused request is answered without its body, no 100 Continue sent, and the
 * connection ends, unless the body is already all here (at most EARLY_REFUSAL_BODY_MAX): then it
 * is parsed and answered on a kept-alive connection. True when the body is to be read. */
static bool conn_head(conn_t *c)
{
    if (c->io->draining)
        return true; /* conn_after_parse answers 503 */
    struct sl_http_parser *p = &c->req;
    struct sl_exchange *x = exchange_begin(c);
    exchange_view(c);
    if (c->io->srv->h.on_head(x) == SL_HTTP_HEAD_READ)
        return true;
    bool chunked = (p->ll.flags & F_CHUNKED) != 0;
    uint64_t declared = (p->ll.flags & F_CONTENT_LENGTH) ? p->ll.content_length : 0;
    size_t here = p->buf.len - p->head_end + evbuffer_get_length(bufferevent_get_input(c->bev));
    if (!chunked && declared <= EARLY_REFUSAL_BODY_MAX && here >= declared)
        return true;
    c->linger = true;
    x->parsed = true;
    x->body_skipped = true;
    x->keep_alive = false;
    c->state = CONN_WAITING;
    c->io->srv->h.on_request(x);
    return false;
}

/* ---- timeouts ---- */

static void conn_timer_stop(conn_t *c)
{
    if (c->timer_kind != TIMER_NONE) {
        evtimer_del(c->timer);
        c->timer_kind = TIMER_NONE;
    }
}

static void conn_timer_start(conn_t *c, enum conn_timer kind, int ms)
{
    struct timeval tv = ms_tv(ms);
    c->timer_kind = kind;
    evtimer_add(c->timer, &tv);
}

/* While a request is read: idle_timeout_ms until its first byte on a kept-alive connection
 * (a new connection starts with the head's deadline, so a silent client cannot hold one), then
 * header_timeout_ms from that byte to the end of the head, then header_timeout_ms between
 * pieces of the body. A slow-loris head cannot stretch its deadline; a body can keep arriving. */
static void conn_read_timer(conn_t *c)
{
    const struct sl_config_http *hc = sl_config_http(c->cfg);
    if (c->req.headers_complete)
        conn_timer_start(c, TIMER_BODY, hc->header_timeout_ms);
    else if (c->req.buf.len > 0 && c->timer_kind != TIMER_HEAD)
        conn_timer_start(c, TIMER_HEAD, hc->header_timeout_ms);
    else if (c->req.buf.len == 0 && c->timer_kind == TIMER_NONE)
        conn_timer_start(c, TIMER_IDLE, hc->idle_timeout_ms);
}

static void conn_on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    conn_t *c = arg;
    enum conn_timer kind = c->timer_kind;
    c->timer_kind = TIMER_NONE;
    if (!c->closed && kind == TIMER_LINGER) {
        sl_http_conn_close(c);
        return;
    }
    if (c->closed || c->state != CONN_READING)
        return;
    /* A client still reading the previous response is not idle (the write timeout watches
     * that it makes progress). */
    if (kind == TIMER_IDLE && c->busy) {
        conn_timer_start(c, TIMER_IDLE, sl_config_http(c->cfg)->idle_timeout_ms);
        return;
    }
    /* Nothing of a request came: there is no one to answer. */
    if (kind == TIMER_IDLE || c->req.buf.len == 0) {
        sl_http_conn_close(c);
        return;
    }
    exchange_end(c, true); /* a body stopped arriving after its head was judged */
    conn_refuse(c, 408, "request_timeout",
                kind == TIMER_HEAD ? "The request head did not arrive in time."
                                   : "The request body stopped arriving.",
                NULL);
}

/* ---- moving a connection on ---- */

/* Serves what the connection has buffered as far as it can: while each response is queued and
 * the output is below write_high_water_bytes, the next pipelined request is parsed and answered
 * (their responses leave together in the flush). Called from the read callback and from the
 * flush, never from inside a handler. */
static void conn_advance(conn_t *c)
{
    while (!c->closed) {
        size_t queued = evbuffer_get_length(bufferevent_get_output(c->bev));
        if (c->busy && queued == 0 && c->state == CONN_READING && !c->active)
            conn_set_busy(c, false);
        if (c->state == CONN_WAITING) {
            if (queued <= sl_config_http(c->cfg)->write_high_water_bytes && c->active)
                c->io->srv->h.on_writable(&c->x);
            return;
        }
        if (c->state == CONN_FLUSHING) {
            bool keep_alive = c->x.keep_alive;
            if (c->linger || !keep_alive) {
                if (queued > 0)
                    return; /* all of it must be out first */
                exchange_end(c, false);
                conn_set_busy(c, false);
                if (!c->linger) {
                    sl_http_conn_close(c);
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
            if (queued > sl_config_http(c->cfg)->write_high_water_bytes)
                return;
            exchange_end(c, false);
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
        if (st == SL_HTTP_PARSE_ERROR)
            exchange_end(c, true); /* a head judged, then a bad body: the transport answers */
        conn_after_parse(c, st);
    }
}

static void conn_on_event(struct bufferevent *bev, short what, void *arg);
static void conn_on_read(struct bufferevent *bev, void *arg);
static void conn_write_socket(conn_t *c);

/* Reads a plain socket into the connection's input buffer. The loop does this itself rather than
 * through the bufferevent, whose evbuffer_read asks the kernel how much is readable (an ioctl)
 * before every read: one syscall in three per small request. */
static void conn_on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    conn_t *c = arg;
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
     * latency (the flush still moves the connection on). */
    if (!c->closed)
        conn_write_socket(c);
}

static void conn_on_read(struct bufferevent *bev, void *arg)
{
    conn_t *c = arg;
    if (c->closed)
        return;
    if (c->state == CONN_LINGER) {
        struct evbuffer *in = bufferevent_get_input(bev);
        c->lingered += evbuffer_get_length(in);
        evbuffer_drain(in, evbuffer_get_length(in));
        if (c->lingered > LINGER_MAX_BYTES)
            sl_http_conn_close(c);
        else
            conn_read_resume(c);
        return;
    }
    /* Bytes that arrive while a request is answered are the next request's: they wait in the
     * input buffer (bounded by READ_HIGH_WATER) until conn_advance takes them up. */
    conn_advance(c);
}

/* The bufferevent wrote (some of) what the flush left it, or (TLS) what it encrypted: the output
 * is at or below the write low watermark. */
static void conn_on_write(struct bufferevent *bev, void *arg)
{
    conn_t *c = arg;
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
static void conn_write_socket(conn_t *c)
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
            sl_http_conn_close(c); /* the peer is gone: its request is cancelled */
            return;
        }
    }
    if (evbuffer_get_length(out) > 0)
        bufferevent_enable(c->bev, EV_WRITE);
}

static void conn_on_event(struct bufferevent *bev, short what, void *arg)
{
    conn_t *c = arg;
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
        c->x.keep_alive = false;
        c->linger = false;
        conn_flush_later(c);
        return;
    }
    /* Otherwise EOF, an error, the write timeout or the linger timeout: a client that hangs up
     * while its request is queued or streaming gives up on it, and the request is cancelled. */
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR | BEV_EVENT_TIMEOUT))
        sl_http_conn_close(c);
}

/* Marks the connection closed, ends its exchange and leaves the freeing to reap, since this may
 * run inside one of the connection's own callbacks. */
void sl_http_conn_close(conn_t *c)
{
    if (c->closed)
        return;
    c->closed = true;
    exchange_end(c, c->state != CONN_FLUSHING && c->state != CONN_LINGER);
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

static void conn_free(conn_t *c)
{
    if (c->counted)
        atomic_fetch_sub(&c->io->srv->n_conns, 1);
    sl_config_unref(c->cfg);
    if (c->timer)
        event_free(c->timer);
    if (c->read_ev)
        event_free(c->read_ev);
    bufferevent_free(c->bev);
    sl_http_parser_dispose(&c->req);
    sl_arena_dispose(&c->x.arena);
    free(c);
}

void sl_http_io_reap(struct io *io)
{
    conn_t *c = io->dead;
    while (c) {
        conn_t *next = c->next;
        if (!c->flush_queued) {
            list_remove(&io->dead, c);
            conn_free(c);
        }
        c = next;
    }
}

void sl_http_io_flush_later(struct io *io)
{
    if (!io->flush_pending) {
        io->flush_pending = true;
        event_active(io->flush_ev, EV_WRITE, 0);
    }
}

/* Once per loop iteration (after every callback that queued output in it): writes each plain
 * connection's output in one writev, moves each listed connection on, writes the access log. */
void sl_http_io_on_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct io *io = arg;
    io->flush_pending = false;
    if (io->srv->h.before_write)
        io->srv->h.before_write(io->handler_thread);
    conn_t *c = io->flush;
    io->flush = NULL;
    while (c) {
        conn_t *next = c->flush_next;
        c->flush_queued = false;
        c->flush_next = NULL;
        if (!c->closed && !c->tls)
            conn_write_socket(c);
        if (!c->closed)
            conn_advance(c);
        c = next;
    }
    sl_http_io_log_flush(io);
    sl_http_io_reap(io);
}

void sl_http_io_flush_clear(struct io *io)
{
    while (io->flush) {
        conn_t *c = io->flush;
        io->flush = c->flush_next;
        c->flush_queued = false;
        c->flush_next = NULL;
    }
}

void sl_http_io_cancel(struct io *io)
{
    for (conn_t *c = io->conns, *next; c; c = next) {
        next = c->next;
        if (!c->closed && c->active && c->state == CONN_WAITING)
            c->io->srv->h.on_cancel(&c->x);
    }
}

void sl_http_conn_open(struct io *io, evutil_socket_t fd, bool tls)
{
    struct sl_http_server *s = io->srv;
    const struct sl_config_http *hc = sl_config_http(io->cfg);
    io->accept_error_logged = false;
    /* SSE chunks are small and latency is the point: no Nagle delay. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (hc->tcp_send_buffer_bytes) {
        int v = (int)hc->tcp_send_buffer_bytes;
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
    conn_t *c = sl_xcalloc(1, sizeof *c);
    c->io = io;
    c->cfg = sl_config_ref(io->cfg);
    c->bev = bev;
    c->tls = tls;
    c->state = CONN_READING;
    c->x.conn = c;
    c->x.thread = io->handler_thread;
    sl_arena_init(&c->x.arena);
    sl_http_parser_init(&c->req, hc->max_header_bytes, hc->max_body_bytes);
    c->req.pause_at_head = true; /* conn_head() looks at the key before any of the body */
    c->timer = evtimer_new(io->base, conn_on_timer, c);
    list_push(&io->conns, c);
    bufferevent_setcb(bev, conn_on_read, conn_on_write, conn_on_event, c);
    bufferevent_setwatermark(bev, EV_READ, 0, READ_HIGH_WATER);
    conn_apply_cfg(c);
    /* Plain sockets are read by read_ev and written by the flush; the bufferevent's write event
     * is enabled only when the kernel does not take everything. */
    if (tls) {
        bufferevent_enable(bev, EV_READ | EV_WRITE);
    } else {
        c->read_ev = event_new(io->base, fd, EV_READ | EV_PERSIST, conn_on_readable, c);
        event_add(c->read_ev, NULL);
    }
    if (atomic_fetch_add(&s->n_conns, 1) >= hc->max_connections) {
        atomic_fetch_sub(&s->n_conns, 1);
        conn_refuse(c, 503, "too_many_connections",
                    "The server has too many open connections; retry later.", "Retry-After: 1\r\n");
        return;
    }
    c->counted = true;
    conn_timer_start(c, TIMER_HEAD, hc->header_timeout_ms);
}
