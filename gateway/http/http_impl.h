/* Private layouts of gateway/http/: the request parser, TLS, I/O threads and connections. Its tests
 * include this header; nothing outside gateway/http/ may.
 */
#ifndef SLUICE_HTTP_IMPL_H
#define SLUICE_HTTP_IMPL_H

#include <sluice/http.h>

#include <event2/buffer.h>
#include <llhttp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* ---------------------------------------------------------------------------------------------
 * Request parser (parser.c): llhttp over one contiguous buffer, recording spans (offsets,
 * so the buffer may grow) instead of copying.
 */

/* A byte range of sl_http_parser.buf. len == 0 means absent (or empty). */
struct sl_http_span {
    size_t off;
    size_t len;
};

/* One header line of the head. */
struct sl_http_header {
    struct sl_http_span name, value;
};

enum sl_http_parse {
    SL_HTTP_PARSE_MORE,  /* the request is incomplete: feed more bytes */
    SL_HTTP_PARSE_DONE,  /* one whole request is parsed; bytes after it stay buffered */
    SL_HTTP_PARSE_ERROR, /* answer error_code and close the connection */
    SL_HTTP_PARSE_HEAD,  /* pause_at_head: the head is whole and checked, no body byte parsed;
                          * sl_http_parser_resume() goes on to the body */
};

/* Where a chunk-size line is (RFC 9112 §7.1.1), which sluice parses itself: llhttp 8 refuses legal
 * extensions after a valued one (";a=b;c"), and a size is checked against the limit as soon as
 * it is read. */
enum sl_http_chunk_line {
    SL_CHUNK_NONE,     /* not in a chunk-size line */
    SL_CHUNK_SIZE,     /* in the hex digits */
    SL_CHUNK_WS,       /* BWS after the size or a value: ';' may follow */
    SL_CHUNK_NAME_WS,  /* BWS before an extension's name */
    SL_CHUNK_NAME,     /* in a name */
    SL_CHUNK_AFTER,    /* BWS after a name: '=' or ';' may follow */
    SL_CHUNK_VALUE_WS, /* BWS after '=' */
    SL_CHUNK_TOKEN,    /* in a token value */
    SL_CHUNK_QUOTED,   /* in a quoted-string value */
    SL_CHUNK_PAIR,     /* after a backslash in a quoted-string */
    SL_CHUNK_END,      /* after a quoted-string: BWS ';' or the CR may follow */
    SL_CHUNK_LF,       /* after the line's CR */
};

struct sl_http_parser {
    llhttp_t ll;
    /* The current request's bytes, then whatever followed it. The request starts at offset 0.
     * Chunk framing is dropped as it is parsed and the body compacted in place, so buf holds
     * at most the head, the body and one feed. */
    struct sl_str buf;
    size_t parsed; /* bytes of buf given to llhttp */
    size_t max_header_bytes;
    size_t max_body_bytes;
    enum sl_http_parse state;
    bool pause_at_head; /* set by the caller: stop at HEAD once the head is whole */

    /* The request, valid once headers_complete (url, headers) or DONE (body, keep_alive). */
    int method; /* enum llhttp_method */
    int http_major, http_minor;
    struct sl_http_span url;
    struct sl_http_span content_type;
    struct sl_http_span connection;
    struct sl_http_span expect;
    struct sl_http_span authorization; /* "Bearer KEY" */
    /* Every header of the head in order (the first SL_HTTP_MAX_HEADERS), for
     * sl_http_parser_header. */
    struct sl_http_header headers[SL_HTTP_MAX_HEADERS];
    int n_headers;
    bool other_coding; /* a Transfer-Encoding names a coding besides chunked (answered 501) */
    struct sl_http_span body;
    bool headers_complete;
    bool keep_alive;      /* the connection may serve another request after this one */
    bool expect_continue; /* "Expect: 100-continue" on HTTP/1.1: the client waits for it */

    int error_code;           /* ERROR: the HTTP status to answer (400, 413 or 431) */
    const char *error_reason; /* ERROR: a static, client-safe explanation */

    /* Scratch while parsing. */
    struct sl_http_span field, value; /* the header line being parsed */
    size_t head_end;                  /* offset just past the head, once headers_complete */
    size_t trailer_bytes;             /* chunked trailers so far (counted, not kept) */
    bool body_started;
    bool run_empty; /* llhttp must run once more, even on no bytes (after the head's pause) */
    enum sl_http_chunk_line chunk;
    int chunk_digits;    /* hex digits of the size read so far (leading zeros included) */
    uint64_t chunk_size; /* the size so far */
};

void sl_http_parser_init(struct sl_http_parser *p, size_t max_header_bytes, size_t max_body_bytes);
void sl_http_parser_dispose(struct sl_http_parser *p);
/* Buffers data and parses up to the end of the current request. Once the state is DONE further
 * bytes are only buffered (the caller bounds them); after ERROR they are dropped. Returns the
 * state. */
enum sl_http_parse sl_http_parser_feed(struct sl_http_parser *p, const char *data, size_t len);
/* After HEAD: parses the body (and what is already buffered of it). Returns the state. */
enum sl_http_parse sl_http_parser_resume(struct sl_http_parser *p);
/* Forgets the DONE request, keeps the bytes that followed it and parses them as the next one.
 * Returns the new state. */
enum sl_http_parse sl_http_parser_next(struct sl_http_parser *p);

static inline const char *sl_http_span_ptr(const struct sl_http_parser *p, struct sl_http_span s)
{
    return p->buf.p + s.off;
}
/* True when the span equals lit, ignoring ASCII case and surrounding spaces/tabs. */
bool sl_http_span_eq(const struct sl_http_parser *p, struct sl_http_span s, const char *lit);
/* The value of header `name` (ASCII case-insensitive; the first of that name), spaces around it
 * trimmed; false when the head has none among its first SL_HTTP_MAX_HEADERS. */
bool sl_http_parser_header(const struct sl_http_parser *p, const char *name,
                           struct sl_http_span *out);
/* The URL without its query string or fragment, and for an absolute-form target
 * ("http://host/path", RFC 9112 §3.2.2) without its scheme and authority. */
struct sl_http_span sl_http_parser_path(const struct sl_http_parser *p);
/* The query of the request target: after the path's '?', up to a '#' (empty when none). */
struct sl_http_span sl_http_parser_query(const struct sl_http_parser *p);

/* ---------------------------------------------------------------------------------------------
 * TLS (tls.c)
 */

struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

/* A server context for t (cert and key loaded and checked against each other; TLS 1.2+).
 * Returns a context with one reference (SSL_CTX_free drops it), or NULL with err set. Any
 * thread. */
struct ssl_ctx_st *sl_tls_ctx_new(const struct sl_config_tls *t, char *err, size_t errlen);

/* ---------------------------------------------------------------------------------------------
 * I/O threads and connections (server.c, conn.c)
 */

struct io;
struct bufferevent;
struct evconnlistener;

enum conn_state {
    CONN_READING,  /* parsing a request */
    CONN_WAITING,  /* its response is in progress (queued, parked or streaming) */
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

/* A client connection: the socket, the parser, the timers and keep-alive. Its current request is
 * the exchange x (active from the request's first decision to the end of its response). */
struct sl_http_conn {
    struct io *io;
    struct sl_http_conn *prev, *next; /* io->conns, or io->dead once closed */
    struct bufferevent *bev;
    struct evbuffer_iovec sse; /* the room sl_http_sse_begin reserved in the output */
    const char *sse_event;     /* and its event name, or NULL */
    struct sl_http_parser req;
    enum conn_state state;
    bool closed; /* waiting to be reaped; no callback may touch it any more */
    bool linger; /* after this response, shut the write side and drain */
    bool sent_continue;
    size_t lingered; /* bytes discarded while lingering */
    /* The configuration of the next request (a reference): the I/O thread's, taken up between
     * requests, so a request keeps the one it started with (x.cfg). */
    struct sl_config *cfg;

    bool tls;          /* a bufferevent_openssl; otherwise the loop writes the socket */
    bool counted;      /* counts towards max_connections */
    bool busy;         /* a response is in progress (what a drain waits for) */
    bool flush_queued; /* on io->flush */
    struct sl_http_conn *flush_next; /* io->flush */
    struct event *read_ev;           /* plain sockets: the loop reads them itself */
    bool read_paused;           /* read_ev is off: READ_HIGH_WATER bytes wait, or EOF was seen */
    bool read_eof;              /* the client shut its side (or the read failed) */
    struct event *timer;        /* the read deadline, see enum conn_timer */
    enum conn_timer timer_kind; /* what the timer stands for; TIMER_NONE when not pending */

    bool active; /* x is a request whose exchange has not ended */
    struct sl_exchange x;
};

struct io {
    struct sl_http_server *srv;
    /* This thread's reference to the server's current configuration, adopted on reload_ev. */
    struct sl_config *cfg;
    int idx;
    pthread_t thread;
    bool running;
    struct event_base *base;
    void *handler_thread; /* the handler's state of this thread */
    struct evconnlistener *listener;
    struct evconnlistener *tls_listener; /* NULL without TLS */
    struct ssl_ctx_st *tls_ctx;          /* this thread's reference to the current context */
    struct event *stop_ev;               /* activated by sl_http_server_stop() */
    struct event *reap_ev;               /* frees closed connections outside their callbacks */
    struct event *reload_ev;             /* activated by sl_http_server_reload() */
    struct event *drain_ev;              /* activated by sl_http_server_drain(): stop accepting */
    struct event *cancel_ev;             /* activated when a drain times out: cancel what is left */
    struct event *flush_ev;     /* writes the flush list and the access log, once per iteration */
    struct sl_http_conn *flush; /* connections with output queued or to move on */
    struct sl_str log;          /* access-log lines not yet written */
    struct sl_str line;         /* scratch for one access-log line */
    struct sl_str wbuf;         /* scratch for one write: a head, an SSE event */
    bool flush_pending;         /* flush_ev is active */
    bool draining;
    struct sl_http_conn *conns;
    struct sl_http_conn *dead;
    time_t date_sec;
    char date[40]; /* the Date header value for date_sec */
    bool accept_error_logged;
};

struct sl_http_server {
    /* The current configuration (a reference), replaced by a reload under cfg_lock. The fields
     * read only at start (listen, io_threads) are the same in every configuration. */
    pthread_mutex_t cfg_lock;
    struct sl_config *cfg;
    struct sl_http_handler h;
    int port;
    int n_io;
    struct io *io;
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

/* conn.c */
void sl_http_conn_open(struct io *io, int fd, bool tls);
/* Marks the connection closed (ending its exchange as cancelled) and leaves the freeing to
 * sl_http_io_reap. */
void sl_http_conn_close(struct sl_http_conn *c);
/* A drain timed out: hands every exchange still in progress to the handler's on_cancel. */
void sl_http_io_cancel(struct io *io);
/* Frees closed connections not on the flush list. */
void sl_http_io_reap(struct io *io);
/* Forgets the flush list (the loop is stopping), so reap frees every closed connection. */
void sl_http_io_flush_clear(struct io *io);
/* Has the flush run at the end of this loop iteration. */
void sl_http_io_flush_later(struct io *io);

/* access_log.c: writes the access-log lines buffered. */
void sl_http_io_log_flush(struct io *io);
/* The flush event's callback: writes and moves on the flush list, then the log. */
void sl_http_io_on_flush(int fd, short what, void *arg);

#endif
