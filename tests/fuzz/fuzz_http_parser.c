/* Fuzz target: the HTTP/1.1 request parser (sl_http_parser, gateway/http/parser.c) as a connection
 * drives it: requests pipelined back to back, their bytes arriving all at once, one byte at a time,
 * or cut at one point with the tail buffered behind a finished request (what a connection does
 * while it answers one). Every way of cutting the same bytes must give the same requests (method,
 * version, URL, the headers sluice reads, body, keep-alive) and end in the same state with the
 * same error status; every span must lie inside the buffer and within the limits.
 *
 * Input: byte 0 picks the limits and whether the parser pauses at each head (as a connection's
 * does), bytes 1-2 the cut point, the rest is what the client sends. */
#include "gateway_impl.h"
#include "http_impl.h"

#include "fuzz.h"

struct transcript {
    struct sl_str s;
    int n_reqs;
    enum sl_http_parse final;
    int error_code;
};

static void put_span(struct transcript *t, const struct sl_http_parser *p, struct sl_http_span s)
{
    fuzz_check(s.off <= p->buf.len && s.len <= p->buf.len - s.off, "span %zu+%zu outside %zu bytes",
               s.off, s.len, p->buf.len);
    uint64_t n = s.len;
    sl_str_append(&t->s, &n, sizeof n);
    if (s.len)
        sl_str_append(&t->s, sl_http_span_ptr(p, s), s.len);
}

/* Records one DONE request; returns false when the connection would close after it. */
static bool record(struct transcript *t, const struct sl_http_parser *p)
{
    fuzz_check(p->headers_complete, "DONE before the head");
    fuzz_check(p->head_end <= p->max_header_bytes, "head of %zu bytes over %zu", p->head_end,
               p->max_header_bytes);
    fuzz_check(p->body.len <= p->max_body_bytes, "body of %zu over %zu", p->body.len,
               p->max_body_bytes);
    fuzz_check(p->parsed <= p->buf.len, "parsed %zu of %zu", p->parsed, p->buf.len);
    fuzz_check(p->url.len > 0, "a request without a URL");
    int head[5] = {p->method, p->http_major, p->http_minor, p->keep_alive, p->expect_continue};
    sl_str_append(&t->s, head, sizeof head);
    put_span(t, p, p->url);
    put_span(t, p, sl_http_parser_path(p));
    put_span(t, p, p->content_type);
    put_span(t, p, p->connection);
    put_span(t, p, p->expect);
    put_span(t, p, p->authorization);
    /* Every header the head kept (the API looks them up by name), inside the head. */
    fuzz_check(p->n_headers >= 0 && p->n_headers <= SL_HTTP_MAX_HEADERS, "%d headers",
               p->n_headers);
    for (int i = 0; i < p->n_headers; i++) {
        fuzz_check(p->headers[i].name.off + p->headers[i].name.len <= p->head_end &&
                       p->headers[i].value.off + p->headers[i].value.len <= p->head_end,
                   "header %d outside the head", i);
        put_span(t, p, p->headers[i].name);
        put_span(t, p, p->headers[i].value);
    }
    struct sl_http_span tier = {0, 0};
    sl_http_parser_header(p, "x-sluice-tier", &tier);
    put_span(t, p, tier);
    put_span(t, p, p->body);
    /* What the routes do with the head next. */
    const char *key;
    size_t key_len;
    if (p->authorization.len &&
        sl_http_bearer(sl_http_span_ptr(p, p->authorization), p->authorization.len, &key, &key_len))
        fuzz_check(key >= p->buf.p && key + key_len <= p->buf.p + p->buf.len, "key outside");
    (void)sl_http_span_eq(p, p->content_type, "application/json");
    t->n_reqs++;
    return p->keep_alive;
}

/* After feeding: takes every finished request the buffered bytes hold, as a connection does. */
static enum sl_http_parse drain(struct transcript *t, struct sl_http_parser *p,
                                enum sl_http_parse st, bool *open)
{
    while (*open && (st == SL_HTTP_PARSE_DONE || st == SL_HTTP_PARSE_HEAD)) {
        if (st == SL_HTTP_PARSE_HEAD) {
            /* A connection looks at the head, then goes on to the body. */
            fuzz_check(p->headers_complete && p->parsed == p->head_end && p->body.len == 0,
                       "HEAD with %zu parsed past a head of %zu", p->parsed, p->head_end);
            st = sl_http_parser_resume(p);
            continue;
        }
        if (!record(t, p)) {
            *open = false;
            break;
        }
        st = sl_http_parser_next(p);
    }
    return st;
}

enum mode { WHOLE, BYTES, CUT };

static void run(struct transcript *t, enum mode mode, const char *in, size_t len, size_t cut,
                size_t max_head, size_t max_body, bool pause_at_head)
{
    struct sl_http_parser p;
    sl_http_parser_init(&p, max_head, max_body);
    p.pause_at_head = pause_at_head;
    sl_str_init(&t->s);
    t->n_reqs = 0;
    bool open = true;
    enum sl_http_parse st = SL_HTTP_PARSE_MORE;
    switch (mode) {
    case WHOLE: st = drain(t, &p, sl_http_parser_feed(&p, in, len), &open); break;
    case BYTES:
        for (size_t i = 0; i < len && open; i++)
            st = drain(t, &p, sl_http_parser_feed(&p, in + i, 1), &open);
        break;
    case CUT:
        /* The tail arrives while the first part's request may be DONE: it is only buffered. */
        sl_http_parser_feed(&p, in, cut);
        st = drain(t, &p, sl_http_parser_feed(&p, in + cut, len - cut), &open);
        break;
    }
    if (open && st == SL_HTTP_PARSE_ERROR) {
        fuzz_check(p.error_code == 400 || p.error_code == 413 || p.error_code == 431 ||
                       p.error_code == 501,
                   "error status %d", p.error_code);
        fuzz_check(p.error_reason != NULL, "an error without a reason");
    }
    t->final = open ? st : SL_HTTP_PARSE_DONE;
    t->error_code = open && st == SL_HTTP_PARSE_ERROR ? p.error_code : 0;
    sl_http_parser_dispose(&p);
}

static void same(const struct transcript *a, const struct transcript *b, const char *what)
{
    fuzz_check(a->n_reqs == b->n_reqs, "%s: %d requests, whole: %d", what, b->n_reqs, a->n_reqs);
    fuzz_check(a->s.len == b->s.len && (a->s.len == 0 || memcmp(a->s.p, b->s.p, a->s.len) == 0),
               "%s: the requests differ from the whole feed's", what);
    fuzz_check(a->final == b->final, "%s: ends in state %d, whole: %d", what, b->final, a->final);
    fuzz_check(a->error_code == b->error_code, "%s: error %d, whole: %d", what, b->error_code,
               a->error_code);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    static const size_t heads[4] = {256, 1024, 4096, 16384};
    static const size_t bodies[4] = {64, 512, 4096, 1 << 20};
    size_t max_head = heads[data[0] & 3], max_body = bodies[(data[0] >> 2) & 3];
    bool pause = (data[0] >> 4) & 1;
    size_t len = size - 3;
    size_t cut = len ? ((size_t)data[1] << 8 | data[2]) % (len + 1) : 0;
    const char *in = (const char *)data + 3;

    struct transcript whole, bytes, at;
    run(&whole, WHOLE, in, len, 0, max_head, max_body, pause);
    run(&bytes, BYTES, in, len, 0, max_head, max_body, pause);
    run(&at, CUT, in, len, cut, max_head, max_body, pause);
    same(&whole, &bytes, "a byte at a time");
    same(&whole, &at, "cut in two");
    sl_str_dispose(&whole.s);
    sl_str_dispose(&bytes.s);
    sl_str_dispose(&at.s);
    return 0;
}
