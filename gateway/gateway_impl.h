/* Private layouts of the gateway module: the request parser (llhttp) and the OpenAI JSON layer.
 * Its tests include this header; nothing outside gateway/ may.
 *
 * Threads: everything here is plain data and pure functions; a parser belongs to the connection
 * (and so the I/O thread) that owns it.
 */
#ifndef SLUICE_GATEWAY_IMPL_H
#define SLUICE_GATEWAY_IMPL_H

#include <sluice/gateway.h>

#include <jansson.h>
#include <llhttp.h>

/* ---------------------------------------------------------------------------------------------
 * Request parser: llhttp over one contiguous buffer, recording spans (offsets, so the buffer may
 * grow) instead of copying.
 */

/* A byte range of sl_http_parser.buf. len == 0 means absent (or empty). */
struct sl_http_span {
    size_t off;
    size_t len;
};

enum sl_http_parse {
    SL_HTTP_PARSE_MORE,  /* the request is incomplete: feed more bytes */
    SL_HTTP_PARSE_DONE,  /* one whole request is parsed; bytes after it stay buffered */
    SL_HTTP_PARSE_ERROR, /* answer error_code and close the connection */
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

    /* The request, valid once headers_complete (url, headers) or DONE (body, keep_alive). */
    int method; /* enum llhttp_method */
    int http_major, http_minor;
    struct sl_http_span url;
    struct sl_http_span content_type;
    struct sl_http_span connection;
    struct sl_http_span expect;
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
};

void sl_http_parser_init(struct sl_http_parser *p, size_t max_header_bytes, size_t max_body_bytes);
void sl_http_parser_dispose(struct sl_http_parser *p);
/* Buffers data and parses up to the end of the current request. Once the state is DONE further
 * bytes are only buffered (the caller bounds them); after ERROR they are dropped. Returns the
 * state. */
enum sl_http_parse sl_http_parser_feed(struct sl_http_parser *p, const char *data, size_t len);
/* Forgets the DONE request, keeps the bytes that followed it and parses them as the next one.
 * Returns the new state. */
enum sl_http_parse sl_http_parser_next(struct sl_http_parser *p);

static inline const char *sl_http_span_ptr(const struct sl_http_parser *p, struct sl_http_span s)
{
    return p->buf.p + s.off;
}
/* True when the span equals lit, ignoring ASCII case and surrounding spaces/tabs. */
bool sl_http_span_eq(const struct sl_http_parser *p, struct sl_http_span s, const char *lit);
/* The URL without its query string or fragment. */
struct sl_http_span sl_http_parser_path(const struct sl_http_parser *p);

/* ---------------------------------------------------------------------------------------------
 * OpenAI JSON layer
 */

/* An error as OpenAI reports it: {"error":{"message","type","param","code"}}, sent with `http`.
 * type comes from sl_http_error_type(http). */
struct sl_openai_error {
    int http;
    const char *code; /* static, or NULL for JSON null */
    char param[32];   /* "" for JSON null */
    char message[512];
};

void sl_openai_error_set(struct sl_openai_error *e, int http, const char *param, const char *code,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A decoded POST /v1/completions body. Strings point into `root`, which owns them. */
struct sl_openai_completion {
    json_t *root;
    const char *prompt;
    size_t prompt_len;
    struct sl_req_params params; /* stop[] points into root; seed valid only when has_seed */
    bool has_seed;
    bool stream;
    bool include_usage;       /* stream_options.include_usage: a final chunk carries usage */
    const char *service_tier; /* OpenAI's service_tier ("auto", "default", "flex", "priority",
                                 …) as sent, or NULL; the gateway maps it to a tier */
    const char *user;         /* the end user's id as sent, or NULL */
};

/* Decodes and validates a completion request. `model_id` is the served model: a different
 * `model` is a 404. Returns SL_OK, or a negative status with err filled (c is then empty). */
int sl_openai_completion_decode(struct sl_openai_completion *c, const char *body, size_t len,
                                const char *model_id, int default_max_tokens,
                                struct sl_openai_error *err);
void sl_openai_completion_dispose(struct sl_openai_completion *c);

/* Tokenizes the prompt with BOS into ids (capacity seq_len) and checks that the prompt plus
 * max_tokens fits the context. Returns SL_OK with *n_ids set, or fills err. */
int sl_openai_prompt_encode(const struct sl_tok *tok, int seq_len, const char *prompt, size_t len,
                            int max_tokens, int32_t *ids, int *n_ids, struct sl_openai_error *err);
/* The context check alone. n_prompt is exact, or a lower bound when at_least. */
int sl_openai_check_context(int seq_len, long long n_prompt, bool at_least, long long max_tokens,
                            struct sl_openai_error *err);

/* What every object of one completion repeats. */
struct sl_openai_ident {
    char id[48]; /* "cmpl-…" */
    int64_t created;
    const char *model;
};

/* Encoders append one JSON document (no trailing newline) to out. Text must be valid UTF-8. */
void sl_openai_completion_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                 const char *text, size_t len, enum sl_finish finish,
                                 int prompt_tokens, int completion_tokens);
/* A streaming chunk; finish SL_FINISH_NONE gives "finish_reason": null. */
void sl_openai_chunk_encode(struct sl_str *out, const struct sl_openai_ident *id, const char *text,
                            size_t len, enum sl_finish finish);
/* The stream_options.include_usage chunk: "choices": [] and the usage. */
void sl_openai_usage_chunk_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                  int prompt_tokens, int completion_tokens);
void sl_openai_error_encode(struct sl_str *out, const struct sl_openai_error *e);
/* GET /v1/models (a list of one) and GET /v1/models/{id}. */
void sl_openai_models_encode(struct sl_str *out, const char *model_id, int64_t created);
void sl_openai_model_encode(struct sl_str *out, const char *model_id, int64_t created);

/* ---------------------------------------------------------------------------------------------
 * Metrics (metrics.c): counters and histograms that GET /metrics exposes in Prometheus text
 * format 0.0.4, with the scheduler's gauges.
 *
 * Recording is lock-free and cheap: every cell is a relaxed atomic counter, and there is one
 * shard of cells per I/O thread, so a thread recording into its own shard never shares a cache
 * line with another. Any thread may record into any shard (totals stay exact); a scrape sums the
 * shards. Durations are kept as integer nanoseconds, so bucket edges are exact and inclusive
 * (an observation equal to a bound counts in that bucket, as Prometheus' `le` says).
 *
 * Labels come from names given as strings (tiers and tenants come from configuration), interned
 * on first use into fixed tables: SL_METRICS_MAX_TIERS tier names, SL_METRICS_MAX_TENANTS tenant
 * names and SL_METRICS_MAX_ROUTES route names, for the life of the process (a reload that renames
 * a tier keeps the old series). A name past its table's cap, longer than SL_METRICS_MAX_NAME
 * bytes, empty or NULL is counted under SL_METRICS_OTHER ("other"), as is the name "other"
 * itself, so no series is ever exposed twice. Only a name not seen before takes a mutex.
 */

#define SL_METRICS_MAX_TIERS 16
#define SL_METRICS_MAX_TENANTS 128
#define SL_METRICS_MAX_ROUTES 16
#define SL_METRICS_MAX_NAME 128
#define SL_METRICS_OTHER "other"

/* How an inference request ended: the `outcome` label of sluice:requests_total. */
enum sl_metrics_outcome {
    SL_METRICS_OUTCOME_STOP,      /* finished: stop token or stop string */
    SL_METRICS_OUTCOME_LENGTH,    /* finished: max_tokens or the context */
    SL_METRICS_OUTCOME_CANCELLED, /* the client left, or the server shut down */
    SL_METRICS_OUTCOME_ERROR,     /* a 5xx, or the engine failed mid-stream */
    SL_METRICS_OUTCOME_INVALID,   /* a 4xx other than 429: the request cannot be served as sent */
    SL_METRICS_OUTCOME_REJECTED,  /* 429 or 503 before the engine ran it: over capacity */
    SL_METRICS_N_OUTCOMES,
};

/* The label value ("stop", …, "rejected"). */
const char *sl_metrics_outcome_str(enum sl_metrics_outcome o);
/* The outcome of a request that ended with `finish` (sl_finish_str(), or NULL when the engine
 * never finished it) and HTTP status `http_status`. */
enum sl_metrics_outcome sl_metrics_outcome_of(const char *finish, int http_status);

struct sl_metrics;

/* n_shards >= 1 (one per I/O thread). Allocation failure aborts. */
struct sl_metrics *sl_metrics_new(int n_shards);
void sl_metrics_free(struct sl_metrics *m);

/* Recording: any thread, `shard` is the caller's I/O thread index (taken modulo the number of
 * shards). Durations in seconds; negative or NaN durations count as 0. */

/* Time to first token of one request of `tier`. */
void sl_metrics_observe_ttft(struct sl_metrics *m, int shard, const char *tier, double seconds);
/* Inter-token latency: `gap_seconds` passed since the previous text of the request and the new
 * text carries n_tokens >= 1 tokens, so each of them is observed at gap / n_tokens (the sum grows
 * by the whole gap, the count by n_tokens). */
void sl_metrics_observe_itl(struct sl_metrics *m, int shard, const char *tier, double gap_seconds,
                            int n_tokens);

/* One inference request at its end, counted once. */
struct sl_metrics_request {
    const char *tier;
    const char *tenant;
    enum sl_metrics_outcome outcome;
    bool engine;           /* it was handed to the engine: the fields below count */
    int prompt_tokens;     /* added to sluice:prompt_tokens_total */
    int completion_tokens; /* added to sluice:generation_tokens_total */
    double ttft_seconds;   /* < 0 when no token came back (only used for TPOT here) */
    double e2e_seconds;    /* observed when the outcome is STOP or LENGTH */
    double queue_seconds;  /* < 0 when it never ran */
};

/* Counts r in sluice:requests_total and, when r->engine, its tokens; observes its queue time;
 * for STOP and LENGTH observes e2e and, with more than one completion token and a TTFT, the time
 * per output token (e2e - ttft) / (completion_tokens - 1). */
void sl_metrics_request_done(struct sl_metrics *m, int shard, const struct sl_metrics_request *r);
/* Any HTTP request at its end (every request once, whatever its route): sluice:http_requests_total
 * by route (a name from a fixed set chosen by the caller, never a client's path) and status. */
void sl_metrics_http_done(struct sl_metrics *m, int shard, const char *route, int code);

/* Appends the whole exposition: every family with # HELP and # TYPE, then the scheduler's gauges
 * from st (omitted when st is NULL). Any thread; concurrent recording may or may not be seen. */
void sl_metrics_render(struct sl_metrics *m, const struct sl_sched_stats *st, struct sl_str *out);

#endif
