/* The server: listeners (SO_REUSEPORT, one socket per I/O thread, plain and TLS), the I/O
 * threads and their event loops, reload and drain. Connections are conn.c's; what a request
 * means is the handler's (struct sl_http_handler).
 *
 * Each I/O thread owns an event_base, its own listener (the kernel spreads connections over them)
 * and every connection it accepted, so no per-connection state is shared between threads. Other
 * threads reach a loop only through event_active on one of its events (stop, reload, drain,
 * cancel), and the handler's own (its outbox wake-up).
 */
#include "http_impl.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* After a drain timed out and requests were cancelled, how long their error answers may take. */
#define DRAIN_CANCEL_GRACE_MS 2000

static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    sl_http_io_reap(arg);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int salen,
                      void *arg)
{
    (void)l, (void)sa, (void)salen;
    sl_http_conn_open(arg, fd, false);
}

static void on_accept_tls(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                          int salen, void *arg)
{
    (void)l, (void)sa, (void)salen;
    sl_http_conn_open(arg, fd, true);
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
        sl_http_conn_close(io->conns);
    sl_http_io_flush_clear(io);
    sl_http_io_reap(io);
    io->srv->h.thread_stop(io->handler_thread);
    sl_http_io_log_flush(io);
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

/* The drain timed out: every request still here is ended by the handler. */
static void on_drain_cancel(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    sl_http_io_cancel(arg);
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

enum sl_status sl_http_listen_check(const struct sl_config *cfg, char *err, size_t errlen)
{
    const struct sl_config_http *hc = sl_config_http(cfg);
    int port;
    int st = listen_all(hc->listen_host, hc->listen_port, 0, 0, NULL, &port, err, errlen);
    if (st == SL_OK && hc->tls.cert)
        st = listen_all(hc->tls.listen_host, hc->tls.listen_port, 0, 0, NULL, &port, err, errlen);
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
    io->stop_ev = event_new(io->base, -1, 0, on_stop, io);
    io->reap_ev = event_new(io->base, -1, 0, on_reap, io);
    io->reload_ev = event_new(io->base, -1, 0, on_reload, io);
    io->drain_ev = event_new(io->base, -1, 0, on_drain, io);
    io->cancel_ev = event_new(io->base, -1, 0, on_drain_cancel, io);
    io->flush_ev = event_new(io->base, -1, 0, sl_http_io_on_flush, io);
    if (!io->stop_ev || !io->reap_ev || !io->reload_ev || !io->drain_ev || !io->cancel_ev ||
        !io->flush_ev) {
        snprintf(err, errlen, "event_new failed");
        return SL_ENOMEM;
    }
    io->handler_thread = s->h.thread_start(s->h.ctx, io->base, idx);
    return SL_OK;
}

static void io_dispose(struct io *io)
{
    while (io->conns)
        sl_http_conn_close(io->conns);
    sl_http_io_flush_clear(io);
    sl_http_io_reap(io);
    sl_http_io_log_flush(io);
    io_close_listeners(io);
    if (io->handler_thread)
        io->srv->h.thread_free(io->handler_thread);
    struct event *evs[] = {io->stop_ev,  io->reap_ev,   io->reload_ev,
                           io->drain_ev, io->cancel_ev, io->flush_ev};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i])
            event_free(evs[i]);
    sl_config_unref(io->cfg);
    if (io->tls_ctx)
        SSL_CTX_free(io->tls_ctx);
    if (io->base)
        event_base_free(io->base);
    sl_str_dispose(&io->line);
    sl_str_dispose(&io->wbuf);
    sl_str_dispose(&io->log);
}

enum sl_status sl_http_server_new(struct sl_config *cfg, const struct sl_http_handler *h,
                                  struct sl_http_server **out, char *err, size_t errlen)
{
    const struct sl_config_http *hc = sl_config_http(cfg);
    if (hc->io_threads < 1) {
        snprintf(err, errlen, "io_threads must be at least 1");
        return SL_EINVAL;
    }
    int n = hc->io_threads;
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
    s->h = *h;
    s->io = sl_xcalloc((size_t)n, sizeof *s->io);

    int st = listen_all(hc->listen_host, hc->listen_port, hc->listen_backlog, n, fds, &s->port, err,
                        errlen);
    if (st == SL_OK && hc->tls.cert) {
        if (!(s->tls_ctx = sl_tls_ctx_new(&hc->tls, err, errlen)))
            st = SL_EINVAL;
        else
            st = listen_all(hc->tls.listen_host, hc->tls.listen_port, hc->listen_backlog, n,
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

int sl_http_server_port(const struct sl_http_server *s)
{
    return s->port;
}

int sl_http_server_tls_port(const struct sl_http_server *s)
{
    return s->tls_port;
}

enum sl_status sl_http_server_start(struct sl_http_server *s)
{
    if (s->started)
        return SL_OK;
    s->started = true;
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
    sl_config_unref(s->cfg);
    if (s->tls_ctx)
        SSL_CTX_free(s->tls_ctx);
    pthread_mutex_destroy(&s->cfg_lock);
    pthread_mutex_destroy(&s->drain_lock);
    pthread_cond_destroy(&s->drain_cond);
    free(s);
}

enum sl_status sl_http_server_reload(struct sl_http_server *s, struct sl_config *next, char *err,
                                     size_t errlen)
{
    if (sl_config_validate(next, err, errlen) != SL_OK)
        return SL_EINVAL;
    pthread_mutex_lock(&s->cfg_lock);
    struct sl_config *cur = sl_config_ref(s->cfg);
    pthread_mutex_unlock(&s->cfg_lock);
    sl_config_keep_start_keys(next, cur);
    /* The new certificate must load before anything changes. */
    SSL_CTX *ctx = NULL;
    const struct sl_config_tls *tls = &sl_config_http(next)->tls;
    if (tls->cert && !(ctx = sl_tls_ctx_new(tls, err, errlen))) {
        sl_config_unref(cur);
        return SL_EINVAL;
    }
    /* The handler takes up the new configuration (admission's buckets and queue counts carry
     * over, the schedulers get the new tiers) only once the reload can no longer fail. */
    s->h.on_reload(s->h.ctx, next, cur);
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

enum sl_status sl_http_server_drain(struct sl_http_server *s, int timeout_ms)
{
    if (timeout_ms < 0) {
        pthread_mutex_lock(&s->cfg_lock);
        timeout_ms = sl_config_http(s->cfg)->drain_timeout_ms;
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

bool sl_http_server_draining(const struct sl_http_server *s)
{
    return atomic_load(&((struct sl_http_server *)s)->draining);
}
