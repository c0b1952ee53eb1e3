/* sluice — http: the HTTP/1.1 transport (gateway/http/).
 *
 * Listeners, I/O threads, connections, the request parser (llhttp), TLS, timeouts, write queues
 * and the access log. It knows nothing of OpenAI, Anthropic, tenants or models: each request is an
 * exchange (struct sl_exchange) handed to a handler (struct sl_http_handler), which answers it
 * with the sl_http_send_* functions below, at once or later (a stream).
 *
 * The seam is h2o's conn/req split. A connection keeps the socket, the parser, the timers and
 * keep-alive; an exchange is one request on it and its response, and owns an arena (struct
 * sl_arena) that is reset once when the exchange ends. A connection serves one exchange at a
 * time; pipelined requests wait in its input buffer.
 *
 * Threads: every call about an exchange or a connection runs on the I/O thread that owns it.
 */
#ifndef SLUICE_HTTP_H
#define SLUICE_HTTP_H

#include <sluice/common.h>
#include <sluice/config.h>

struct event_base;
struct sl_http_server;
struct sl_http_conn; /* opaque: one client connection */

/* A byte range of the request (not NUL-terminated); len == 0 means absent or empty. */
struct sl_strv {
    const char *p;
    size_t len;
};

/* What the access log line of an exchange says besides method, path, status and e2e_ms: the
 * handler fills it (strings it points at must live until the exchange ends; names need no JSON
 * escaping, which configuration loading checks). */
struct sl_http_log {
    const char *tenant;       /* NULL: not authenticated */
    const char *tier;         /* NULL: not classified */
    const char *admission;    /* x-sluice-admission's note, or NULL */
    double predicted_ttft_ms; /* < 0: none */
    bool engine;              /* it reached a model: the fields below are written */
    const char *model;
    int replica;    /* >= 0 and the model has several: written */
    const char *id; /* "chatcmpl-…" */
    int prompt_tokens, completion_tokens;
    const char *finish; /* NULL: "none" */
    int n;              /* choices; written when > 1 */
    uint64_t ttft_ns;   /* 0: no first token */
    const char *cost;   /* what it cost, a decimal (metering), or NULL */
    uint64_t device_ns; /* its device time, written with cost */
    /* Its tier's objectives (SLO attainment), when it counts for them: ttft_met and tpot_met are
     * 1 (met), 0 (missed) or -1 (not counted: written null). */
    bool slo;
    int ttft_met, tpot_met;
};

/* One request and its response. The transport's fields are read-only to the handler, except
 * `data`, `log`, `t_end_ns`, `status` before the head is sent (a request whose client left is
 * logged 499) and `keep_alive` (which a handler may only clear). The exchange is the
 * connection's: a handler that hands work to another thread (a scheduler) refers back to it
 * through its own state and lets go of that reference in on_close. */
struct sl_exchange {
    struct sl_http_conn *conn;
    struct sl_arena arena; /* the exchange's memory, reset once when it ends */
    void *data;            /* the handler's state of this exchange (in arena, usually) */
    void *thread;          /* the handler's state of this I/O thread (thread_start) */
    struct sl_config *cfg; /* the configuration this request started with (the connection's
                            * reference, which it keeps until the exchange ends) */

    /* The request. Valid once the head is whole (on_head), the body once it is all here
     * (on_request); they point into the connection's buffer until the exchange ends. */
    int method;              /* llhttp's enum llhttp_method */
    const char *method_name; /* "POST" */
    int http_major, http_minor;
    struct sl_strv path;  /* without query and fragment, or scheme and authority */
    struct sl_strv query; /* after '?' and before '#', undecoded; empty when none */
    struct sl_strv body;
    bool body_skipped; /* on_head refused it and its body was not read: answer without */
    bool parsed;       /* the request is whole (false: a transport error answers it) */

    /* The response. */
    int status;      /* the HTTP status sent, 0 until the head is */
    bool keep_alive; /* the connection serves another request after this response */
    bool chunked;    /* a streamed body goes out chunked (HTTP/1.1); false: it ends with the
                      * connection (HTTP/1.0) */
    bool head_sent;
    uint64_t t_start_ns; /* when it began (the clock, once) */
    uint64_t t_end_ns;   /* when its outcome was decided: set by the handler before it logs (one
                          * clock read for its metrics and the log), else read when logging */
    struct sl_http_log log;
    bool logged; /* its access-log line is written */
};

/* The value of request header `name` (ASCII case-insensitive), spaces around it trimmed; false
 * when absent. Only headers the parser keeps are found: authorization, x-api-key,
 * anthropic-version, x-sluice-tier, content-type, and any other up to SL_HTTP_MAX_HEADERS. */
#define SL_HTTP_MAX_HEADERS 64
bool sl_exchange_header(const struct sl_exchange *x, const char *name, struct sl_strv *value);
/* The key of an Authorization value "Bearer KEY" (scheme case-insensitive, spaces around the key
 * trimmed). False when the value is absent, another scheme, or an empty key. */
bool sl_http_bearer(const char *value, size_t len, const char **key, size_t *key_len);
/* Query parameter `name` of x (the first, if given more than once), percent-decoded ('+' is a
 * space) into out as a NUL-terminated string: 1 when found, 0 when absent, -1 when its value does
 * not fit outlen or decodes to a NUL or a bad escape. */
int sl_exchange_query_param(const struct sl_exchange *x, const char *name, char *out,
                            size_t outlen);
/* True when the path is lit exactly. */
bool sl_exchange_path_is(const struct sl_exchange *x, const char *lit);
/* GET or HEAD (GET routes answer HEAD too; the body is then left out). */
bool sl_exchange_is_get(const struct sl_exchange *x);
/* The server is draining (SIGTERM): every response now says Connection: close. */
bool sl_exchange_draining(const struct sl_exchange *x);

/* What a request needs, judged from its head alone (on_head). */
enum sl_http_head {
    SL_HTTP_HEAD_READ,   /* read the body, then on_request */
    SL_HTTP_HEAD_REFUSE, /* refused (a missing or wrong key): on_request answers without the body
                          * (x->body_skipped), which is not read, and the connection ends
                          * after; a small body that came whole with the head is read anyway so
                          * that the connection survives */
};

/* The handler of every request of a server: the API (gateway/api/). ctx is handler-wide. */
struct sl_http_handler {
    void *ctx;
    /* I/O thread idx starts on base: returns the handler's state for that thread, which every
     * exchange of the thread carries in x->thread. thread_stop runs on the thread as it stops
     * (after every connection closed), thread_free after it has joined. */
    void *(*thread_start)(void *ctx, struct event_base *base, int idx);
    void (*thread_stop)(void *thread);
    void (*thread_free)(void *thread);
    /* The head of a request is whole, no byte of its body read: may it go on? */
    enum sl_http_head (*on_head)(struct sl_exchange *x);
    /* The whole request is here (or x->body_skipped): answer it, now or later. */
    void (*on_request)(struct sl_exchange *x);
    /* The transport answers a request itself (a parse error: 400, 413, 431, 501; 408; 503
     * while draining or over max_connections): the handler sends the error body its API uses,
     * with `code` (the API's error code, may be NULL), `message` and the `extra` header lines,
     * through sl_http_send. The connection ends after it. */
    void (*on_error)(struct sl_exchange *x, int status, const char *code, const char *message,
                     const char *extra);
    /* A streaming response's output fell to write_high_water_bytes: text held back may go. */
    void (*on_writable)(struct sl_exchange *x);
    /* The exchange ends: its response is all queued (cancel false), or its client left or the
     * server stops (cancel true). Release what it holds; the arena is reset after. */
    void (*on_close)(struct sl_exchange *x, bool cancel);
    /* A drain timed out: end the response now (a 503, or an error event ending a stream). */
    void (*on_cancel)(struct sl_exchange *x);
    /* A reload made next the configuration (prev the one before), before any request sees it. */
    void (*on_reload)(void *ctx, struct sl_config *next, const struct sl_config *prev);
    /* Optional: bytes are about to go to a socket of this thread: before the loop iteration's
     * flush of plain connections, and before each write of a TLS connection (which writes at
     * once). What the handler must have kept before a client can see it (the usage journal) is
     * written here. */
    void (*before_write)(void *thread);
};

/* ---- answering ---- */

/* A whole response: status line, headers (Server, Date, Content-Type, Content-Length,
 * Connection, then `extra`: "Name: value\r\n" lines, or NULL) and body (left out for HEAD).
 * Writes the access-log line (sl_http_log_access) and queues the end of the exchange. */
void sl_http_send(struct sl_exchange *x, int status, const char *ctype, const char *extra,
                  const char *body, size_t len);
/* The head of a streamed response (text/event-stream, chunked on HTTP/1.1). */
void sl_http_send_head(struct sl_exchange *x, int status, const char *ctype, const char *extra);
/* One server-sent event ("data: " payload "\n\n") of a streamed response, in its framing. */
void sl_http_send_sse(struct sl_exchange *x, const char *payload, size_t len);
/* The same with an "event: NAME" line before the data (Anthropic's streams). */
void sl_http_send_sse_event(struct sl_exchange *x, const char *event, const char *payload,
                            size_t len);
/* One server-sent event written in place, with no copy: sl_http_sse_begin reserves room for a
 * payload of at most max bytes in the output and returns where to write it; sl_http_sse_commit,
 * given the end of what was written, frames it as sl_http_send_sse_event does (event NULL: as
 * sl_http_send_sse). Nothing else may be sent on x in between. event: at most 64 bytes, and it
 * must stay valid until the commit. */
char *sl_http_sse_begin(struct sl_exchange *x, const char *event, size_t max);
void sl_http_sse_commit(struct sl_exchange *x, char *end);
/* The streamed response is complete (the last chunk): the exchange ends once it is written. */
void sl_http_end(struct sl_exchange *x);
/* The same with trailer fields ("Name: value\r\n" lines) after the last chunk, when the response
 * is chunked (HTTP/1.1; announce them in the head's Trailer header); dropped otherwise. */
void sl_http_end_trailers(struct sl_exchange *x, const char *trailers);
/* Whether x's response is chunked (HTTP/1.1): trailers reach the client. */
bool sl_exchange_chunked(const struct sl_exchange *x);
/* Bytes queued for the client and not yet taken by the kernel. */
size_t sl_http_queued(const struct sl_exchange *x);
/* The client is gone or too far behind: closes the connection; on_close(x, true) follows. */
void sl_http_abort(struct sl_exchange *x);
/* Writes the exchange's access-log line now (once; later calls do nothing), with x->log and
 * the status. sl_http_send does it; a stream calls it where its outcome is decided. */
void sl_http_log_access(struct sl_exchange *x);

/* ---- the server ---- */

/* Binds the listener (host:port from sl_config_http(cfg), SO_REUSEPORT, one socket per I/O
 * thread) and, when its tls.cert is set, the TLS listener next to it (its certificate and key
 * loaded now), and prepares its io_threads event loops, each with its handler state. The server
 * takes its own reference to cfg (from sl_config_new). On failure err says why. */
enum sl_status sl_http_server_new(struct sl_config *cfg, const struct sl_http_handler *h,
                                  struct sl_http_server **out, char *err, size_t errlen);
/* Makes next (validated, from sl_config_new; the server takes a reference) the configuration of
 * every request that starts from now on; requests in flight keep theirs. Keys that only take
 * effect at start (listen, listen_backlog, tls.listen, model, threads, pin_threads, KV and
 * batch sizes, io_threads) keep their running values, each change logged as needing a restart
 * (sl_config_keep_start_keys).
 * With a TLS listener the certificate and key are loaded again first: when they do not load or
 * do not match, nothing changes and SL_EINVAL says why; otherwise new TLS connections use them
 * and open ones keep theirs. The handler's on_reload sees the change first. Any thread. */
enum sl_status sl_http_server_reload(struct sl_http_server *s, struct sl_config *next, char *err,
                                     size_t errlen);
/* The port actually bound (useful when the configured listen_port is 0). */
int sl_http_server_port(const struct sl_http_server *s);
/* The TLS listener's bound port, or 0 without one. */
int sl_http_server_tls_port(const struct sl_http_server *s);
/* Starts the I/O threads. */
enum sl_status sl_http_server_start(struct sl_http_server *s);
/* Drains (SIGTERM): stops accepting, answers every request that starts on an open connection
 * from now on with 503, Retry-After and Connection: close; then blocks until the responses in
 * progress are complete or timeout_ms (< 0: the current configuration's drain_timeout_ms) has
 * passed. Whatever is left is then ended by the handler's on_cancel before it returns. Returns
 * SL_OK, or SL_ETIMEDOUT when requests had to be cancelled. Call from one thread (main), after
 * sl_http_server_start; sl_http_server_stop follows it. */
enum sl_status sl_http_server_drain(struct sl_http_server *s, int timeout_ms);
/* True once a drain began. Any thread. */
bool sl_http_server_draining(const struct sl_http_server *s);
/* Stops accepting, closes connections (on_close with cancel), joins the I/O threads. */
void sl_http_server_stop(struct sl_http_server *s);
void sl_http_server_free(struct sl_http_server *s);

/* Loads the TLS certificate and key that cfg names (if any) as the server would, so that
 * --check-config and a reload fail the same way. Returns SL_OK, or SL_EINVAL with err saying
 * which file does not load or that they do not match. Any thread. */
enum sl_status sl_http_tls_check(const struct sl_config *cfg, char *err, size_t errlen);
/* Checks that the server could listen where cfg says (plain and TLS): each address resolves and
 * can be bound now, no other process listening there. Nothing is left open. Returns SL_OK, or
 * SL_EIO / SL_EINVAL with err naming the address and the OS error. */
enum sl_status sl_http_listen_check(const struct sl_config *cfg, char *err, size_t errlen);

/* Maps a status to the HTTP status code: the one place where statuses become HTTP. */
int sl_http_status_code(int status);
/* The reason phrase of an HTTP status line ("Not Implemented"); "Unknown" for a code sluice
 * never sends. */
const char *sl_http_reason_phrase(int code);

#endif
