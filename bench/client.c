/* The HTTP/1.1 client: keep-alive pools over libevent bufferevents, responses parsed by llhttp.
 *
 * Each connection parses in place: llhttp callbacks see spans of the bytes libevent read, body
 * spans go straight to the exchange's on_body, and only the few headers the run needs are copied
 * (into small fixed buffers). A finished or failed connection is never freed inside its own
 * callback: it is unlinked, disabled, put on the dead list and freed by the reap event. */
#include "bench_impl.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <llhttp.h>

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct pool {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    struct sl_bench_conn *idle; /* most recently used first */
};

struct sl_bench_conn {
    struct sl_bench_client *cl;
    int pool;
    struct bufferevent *bev;
    llhttp_t ll;
    struct sl_bench_exchange *x;
    struct sl_bench_conn *prev, *next; /* idle list, or the dead list (next only) */
    bool idle, dead, connected, msg_done, body_failed, closing;
    uint32_t served;
    char hname[24]; /* the header being read, cut at the buffer (longer names are not ours) */
    size_t hname_len;
    char hval[96];
    size_t hval_len;
};

/* An exchange that failed inside submit, delivered from the reap event. */
struct late {
    struct sl_bench_exchange *x;
    enum sl_bench_err err;
    char why[120];
    struct late *next;
};

struct sl_bench_client {
    struct event_base *base;
    uint64_t t0_ns;
    struct pool *pools;
    size_t n_pools;
    struct sl_bench_conn *dead;
    struct late *late, **late_tail;
    struct event *reap_ev;
    uint64_t opened, reused, failed;
    double now; /* the time of the read being handled: one clock read per read callback */
};

double sl_bench_client_now(const struct sl_bench_client *cl)
{
    return (double)(int64_t)(sl_clock_ns() - cl->t0_ns) * 1e-9;
}

static struct sl_bench_conn *conn_of(llhttp_t *ll)
{
    return (struct sl_bench_conn *)((char *)ll - offsetof(struct sl_bench_conn, ll));
}

/* ---------------------------------------------------------------------------------------------
 * Response parsing
 */

double sl_bench_retry_after_parse(const char *v, double now_unix)
{
    while (*v == ' ')
        v++;
    char *end;
    double s = strtod(v, &end);
    if (end != v) {
        while (*end == ' ')
            end++;
        return *end || !isfinite(s) || s < 0 ? -1 : s;
    }
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *rest = strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!rest)
        return -1;
    double at = (double)timegm(&tm);
    return at > now_unix ? at - now_unix : 0;
}

static int on_header_field(llhttp_t *ll, const char *at, size_t len)
{
    struct sl_bench_conn *c = conn_of(ll);
    size_t room = sizeof c->hname - 1 - c->hname_len;
    size_t take = len < room ? len : room;
    memcpy(c->hname + c->hname_len, at, take);
    c->hname_len += take;
    c->hname[c->hname_len] = '\0';
    return 0;
}

static int on_header_value(llhttp_t *ll, const char *at, size_t len)
{
    struct sl_bench_conn *c = conn_of(ll);
    size_t room = sizeof c->hval - 1 - c->hval_len;
    size_t take = len < room ? len : room;
    memcpy(c->hval + c->hval_len, at, take);
    c->hval_len += take;
    c->hval[c->hval_len] = '\0';
    return 0;
}

static int on_header_value_complete(llhttp_t *ll)
{
    struct sl_bench_conn *c = conn_of(ll);
    struct sl_bench_exchange *x = c->x;
    const char *n = c->hname;
    if (x && !strcasecmp(n, "content-type")) {
        x->event_stream = strncasecmp(c->hval, "text/event-stream", 17) == 0;
    } else if (x && !strcasecmp(n, "retry-after-ms")) {
        /* The OpenAI SDKs prefer the millisecond header. */
        char *end;
        double ms = strtod(c->hval, &end);
        if (end != c->hval && isfinite(ms) && ms >= 0)
            x->retry_after = ms / 1000.0;
    } else if (x && !strcasecmp(n, "retry-after")) {
        if (x->retry_after < 0)
            x->retry_after = sl_bench_retry_after_parse(c->hval, (double)time(NULL));
    } else if (x && !strcasecmp(n, "x-should-retry")) {
        x->should_retry = !strcasecmp(c->hval, "true") ? 1 : !strcasecmp(c->hval, "false") ? 0 : -1;
    }
    c->hname_len = c->hval_len = 0;
    c->hname[0] = c->hval[0] = '\0';
    return 0;
}

static int on_headers_complete(llhttp_t *ll)
{
    struct sl_bench_conn *c = conn_of(ll);
    if (!c->x)
        return -1;
    if (ll->status_code < 200)
        return 0; /* an interim 1xx; the real head follows */
    c->x->status = ll->status_code;
    c->x->on_head(c->x, c->cl->now);
    return 0;
}

static int on_body(llhttp_t *ll, const char *at, size_t len)
{
    struct sl_bench_conn *c = conn_of(ll);
    struct sl_bench_exchange *x = c->x;
    if (!x || x->status < 200)
        return 0;
    if (x->on_body(x, at, len, c->cl->now)) {
        c->body_failed = true;
        return HPE_USER;
    }
    return 0;
}

static int on_message_complete(llhttp_t *ll)
{
    struct sl_bench_conn *c = conn_of(ll);
    if (c->x && c->x->status < 200) {
        c->x->event_stream = false;
        c->x->retry_after = -1;
        return 0; /* 1xx: keep reading */
    }
    c->msg_done = true;
    return HPE_PAUSED;
}

static const llhttp_settings_t settings = {
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

/* ---------------------------------------------------------------------------------------------
 * Connections
 */

static void idle_remove(struct sl_bench_conn *c)
{
    if (!c->idle)
        return;
    struct pool *p = &c->cl->pools[c->pool];
    if (c->prev)
        c->prev->next = c->next;
    else
        p->idle = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    c->idle = false;
}

static void idle_push(struct sl_bench_conn *c)
{
    struct pool *p = &c->cl->pools[c->pool];
    c->prev = NULL;
    c->next = p->idle;
    if (p->idle)
        p->idle->prev = c;
    p->idle = c;
    c->idle = true;
}

static void conn_kill(struct sl_bench_conn *c)
{
    if (c->dead)
        return;
    idle_remove(c);
    c->dead = true;
    c->x = NULL;
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
    c->next = c->cl->dead;
    c->cl->dead = c;
    event_active(c->cl->reap_ev, EV_TIMEOUT, 0);
}

static void late_fail(struct sl_bench_client *cl, struct sl_bench_exchange *x,
                      enum sl_bench_err err, const char *why)
{
    struct late *l = sl_xcalloc(1, sizeof *l);
    l->x = x;
    l->err = err;
    snprintf(l->why, sizeof l->why, "%s", why);
    *cl->late_tail = l;
    cl->late_tail = &l->next;
    event_active(cl->reap_ev, EV_TIMEOUT, 0);
}

/* The exchange on c ended (err NONE: a whole response). */
static void finish(struct sl_bench_conn *c, enum sl_bench_err err, const char *why)
{
    struct sl_bench_exchange *x = c->x;
    bool keep =
        err == SL_BENCH_ERR_NONE && !c->closing && !c->dead && llhttp_should_keep_alive(&c->ll);
    c->x = NULL;
    if (x)
        x->conn = NULL;
    if (keep) {
        c->served++;
        idle_push(c);
    } else {
        conn_kill(c);
    }
    /* A kept-alive connection the server closed before answering (it timed the connection out as
     * the request crossed the wire) is not the request's fault: send it again once, on a fresh
     * connection, as HTTP clients do. */
    if (x && err != SL_BENCH_ERR_NONE && err != SL_BENCH_ERR_STREAM && x->reused && !x->got_bytes &&
        !x->fresh_retry) {
        x->fresh_retry = true;
        sl_bench_client_submit(c->cl, c->pool, x);
        return;
    }
    if (x)
        x->on_done(x, err, why, err == SL_BENCH_ERR_NONE ? c->cl->now : sl_bench_client_now(c->cl));
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    struct sl_bench_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    if (!c->x) {
        /* Bytes nobody asked for (the server spoke first, or after the response). */
        conn_kill(c);
        return;
    }
    c->x->got_bytes = true;
    /* Everything in this read arrived together: chunks in it share one timestamp (a gap of 0,
     * as the client saw it), rather than microseconds of our own parsing between them. */
    c->cl->now = sl_bench_client_now(c->cl);
    struct evbuffer_iovec vec[16];
    int n;
    while (!c->msg_done && (n = evbuffer_peek(in, -1, NULL, vec, 16)) > 0) {
        if (n > 16)
            n = 16;
        size_t used = 0;
        for (int i = 0; i < n && !c->msg_done; i++) {
            llhttp_errno_t e = llhttp_execute(&c->ll, vec[i].iov_base, vec[i].iov_len);
            if (e == HPE_PAUSED && c->msg_done)
                break;
            if (e != HPE_OK) {
                evbuffer_drain(in, evbuffer_get_length(in));
                if (c->body_failed)
                    finish(c, SL_BENCH_ERR_STREAM, "the response body could not be read");
                else
                    finish(c, SL_BENCH_ERR_HTTP, llhttp_get_error_reason(&c->ll));
                return;
            }
            used += vec[i].iov_len;
        }
        if (!c->msg_done)
            evbuffer_drain(in, used);
    }
    if (c->msg_done) {
        /* No pipelining: anything after the response is noise; finish() decides the connection's
         * fate and may hand it straight to the next request. */
        evbuffer_drain(in, evbuffer_get_length(in));
        finish(c, SL_BENCH_ERR_NONE, NULL);
    }
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    struct sl_bench_conn *c = arg;
    if (what & BEV_EVENT_CONNECTED) {
        c->connected = true;
        return;
    }
    if (!c->x) {
        conn_kill(c); /* an idle connection closed */
        return;
    }
    if ((what & BEV_EVENT_EOF) && c->x->got_bytes && !c->msg_done) {
        /* A response framed by the end of the connection completes here. */
        c->cl->now = sl_bench_client_now(c->cl);
        llhttp_finish(&c->ll);
        if (c->msg_done) {
            c->closing = true;
            finish(c, SL_BENCH_ERR_NONE, NULL);
            return;
        }
    }
    int e = EVUTIL_SOCKET_ERROR();
    char why[120];
    enum sl_bench_err err;
    if (!c->connected) {
        c->cl->failed++;
        err = SL_BENCH_ERR_CONNECT;
        snprintf(why, sizeof why, "connect: %s",
                 (what & BEV_EVENT_ERROR) && e ? strerror(e) : "closed");
    } else {
        err = SL_BENCH_ERR_CLOSED;
        snprintf(why, sizeof why, "connection %s mid-response",
                 (what & BEV_EVENT_ERROR) && e ? strerror(e) : "closed");
    }
    finish(c, err, why);
}

static struct sl_bench_conn *conn_open(struct sl_bench_client *cl, int pool, char *why,
                                       size_t whylen)
{
    struct pool *p = &cl->pools[pool];
    int fd = socket(p->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, whylen, "socket: %s", strerror(errno));
        return NULL;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sl_bench_conn *c = sl_xcalloc(1, sizeof *c);
    c->cl = cl;
    c->pool = pool;
    c->bev = bufferevent_socket_new(cl->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev) {
        close(fd);
        free(c);
        snprintf(why, whylen, "bufferevent_socket_new failed");
        return NULL;
    }
    bufferevent_setcb(c->bev, read_cb, NULL, event_cb, c);
    if (bufferevent_socket_connect(c->bev, (struct sockaddr *)&p->addr, (int)p->addrlen) != 0) {
        snprintf(why, whylen, "connect: %s", strerror(errno));
        bufferevent_free(c->bev);
        free(c);
        return NULL;
    }
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    cl->opened++;
    return c;
}

static void exchange_start(struct sl_bench_conn *c, struct sl_bench_exchange *x)
{
    c->x = x;
    c->msg_done = c->body_failed = c->closing = false;
    c->hname_len = c->hval_len = 0;
    llhttp_init(&c->ll, HTTP_RESPONSE, &settings);
    x->conn = c;
    x->status = 0;
    x->event_stream = false;
    x->retry_after = -1;
    x->should_retry = -1;
    x->got_bytes = false;
    evbuffer_add(bufferevent_get_output(c->bev), x->wire, x->wire_len);
}

void sl_bench_client_submit(struct sl_bench_client *cl, int pool, struct sl_bench_exchange *x)
{
    struct pool *p = &cl->pools[pool];
    struct sl_bench_conn *c = p->idle;
    if (c) {
        idle_remove(c);
        cl->reused++;
        x->reused = true;
    } else {
        char why[120];
        c = conn_open(cl, pool, why, sizeof why);
        if (!c) {
            cl->failed++;
            x->conn = NULL;
            late_fail(cl, x, SL_BENCH_ERR_CONNECT, why);
            return;
        }
        x->reused = false;
    }
    exchange_start(c, x);
}

void sl_bench_client_cancel(struct sl_bench_client *cl, struct sl_bench_exchange *x)
{
    if (x->conn) {
        conn_kill(x->conn);
        x->conn = NULL;
    }
    /* An exchange waiting for a late failure is dropped from that list. */
    for (struct late **l = &cl->late; *l;) {
        if ((*l)->x == x) {
            struct late *d = *l;
            *l = d->next;
            free(d);
        } else {
            l = &(*l)->next;
        }
    }
    cl->late_tail = &cl->late;
    while (*cl->late_tail)
        cl->late_tail = &(*cl->late_tail)->next;
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct sl_bench_client *cl = arg;
    while (cl->dead) {
        struct sl_bench_conn *c = cl->dead;
        cl->dead = c->next;
        bufferevent_free(c->bev);
        free(c);
    }
    /* Deliver failures that happened inside submit; a callback may add more. */
    while (cl->late) {
        struct late *l = cl->late;
        cl->late = l->next;
        if (!cl->late)
            cl->late_tail = &cl->late;
        l->x->on_done(l->x, l->err, l->why, sl_bench_client_now(cl));
        free(l);
    }
}

struct sl_bench_client *sl_bench_client_new(struct event_base *base, uint64_t t0_ns)
{
    struct sl_bench_client *cl = sl_xcalloc(1, sizeof *cl);
    cl->base = base;
    cl->t0_ns = t0_ns;
    cl->late_tail = &cl->late;
    cl->reap_ev = event_new(base, -1, 0, reap_cb, cl);
    return cl;
}

void sl_bench_client_set_t0(struct sl_bench_client *cl, uint64_t t0_ns)
{
    cl->t0_ns = t0_ns;
    cl->opened = cl->reused = cl->failed = 0; /* the probes do not count */
}

void sl_bench_client_free(struct sl_bench_client *cl)
{
    if (!cl)
        return;
    for (size_t i = 0; i < cl->n_pools; i++)
        while (cl->pools[i].idle)
            conn_kill(cl->pools[i].idle);
    while (cl->dead) {
        struct sl_bench_conn *c = cl->dead;
        cl->dead = c->next;
        bufferevent_free(c->bev);
        free(c);
    }
    while (cl->late) {
        struct late *l = cl->late;
        cl->late = l->next;
        free(l);
    }
    event_free(cl->reap_ev);
    free(cl->pools);
    free(cl);
}

int sl_bench_client_pool(struct sl_bench_client *cl, const char *host, const char *port, char *err,
                         size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    /* "[::1]" in a URL is the address ::1. */
    char h[256];
    snprintf(h, sizeof h, "%s", host);
    size_t hl = strlen(h);
    if (hl > 2 && h[0] == '[' && h[hl - 1] == ']') {
        memmove(h, h + 1, hl - 2);
        h[hl - 2] = '\0';
    }
    int rc = getaddrinfo(h, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "cannot resolve %s:%s: %s", host, port, gai_strerror(rc));
        return SL_ENOENT;
    }
    cl->pools = sl_xrealloc(cl->pools, (cl->n_pools + 1) * sizeof *cl->pools);
    struct pool *p = &cl->pools[cl->n_pools];
    memset(p, 0, sizeof *p);
    memcpy(&p->addr, res->ai_addr, res->ai_addrlen);
    p->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return (int)cl->n_pools++;
}

void sl_bench_client_counts(const struct sl_bench_client *cl, uint64_t *opened, uint64_t *reused,
                            uint64_t *failed)
{
    *opened = cl->opened;
    *reused = cl->reused;
    *failed = cl->failed;
}
