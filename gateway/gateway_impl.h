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
 * TLS (tls.c)
 */

struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

/* A server context for cfg->tls (cert and key loaded and checked against each other; TLS 1.2+).
 * Returns a context with one reference (SSL_CTX_free drops it), or NULL with err set. Any
 * thread. */
struct ssl_ctx_st *sl_tls_ctx_new(const struct sl_config *cfg, char *err, size_t errlen);

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

#endif
