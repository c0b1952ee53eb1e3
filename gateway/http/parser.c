/* The HTTP/1.1 request parser: llhttp underneath, sluice's limits and checks on top (the head's
 * size and version, declared and chunked body sizes, transfer codings), chunk-size lines read by
 * sluice itself, and a request's head and body kept as spans of one buffer. No I/O: a
 * connection feeds it bytes (gateway/http/conn.c). */
#include "http_impl.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static struct sl_http_parser *parser_of(llhttp_t *ll)
{
    return (struct sl_http_parser *)((char *)ll - offsetof(struct sl_http_parser, ll));
}

static int fail(struct sl_http_parser *p, int code, const char *why)
{
    p->error_code = code;
    p->error_reason = why;
    return HPE_USER;
}

/* The request starts at offset 0 of buf and every span of the head ends inside it, so a span's
 * end bounds the head's size so far. Trailers (after a chunked body) are only counted. */
static int head_span(struct sl_http_parser *p, struct sl_http_span *s, const char *at, size_t len)
{
    static const char *const too_big = "The request line and headers are too large.";
    if (p->headers_complete) {
        p->trailer_bytes += len;
        return p->trailer_bytes > p->max_header_bytes ? fail(p, 431, too_big) : 0;
    }
    size_t off = (size_t)(at - p->buf.p);
    if (s->len == 0)
        s->off = off;
    s->len = off + len - s->off;
    if (off + len > p->max_header_bytes)
        return fail(p, 431, too_big);
    return 0;
}

static int on_url(llhttp_t *ll, const char *at, size_t len)
{
    struct sl_http_parser *p = parser_of(ll);
    return head_span(p, &p->url, at, len);
}

static int on_header_field(llhttp_t *ll, const char *at, size_t len)
{
    struct sl_http_parser *p = parser_of(ll);
    return head_span(p, &p->field, at, len);
}

static int on_header_value(llhttp_t *ll, const char *at, size_t len)
{
    struct sl_http_parser *p = parser_of(ll);
    return head_span(p, &p->value, at, len);
}

static int on_header_value_complete(llhttp_t *ll)
{
    struct sl_http_parser *p = parser_of(ll);
    if (p->headers_complete)
        return 0;
    const char *f = sl_http_span_ptr(p, p->field);
    size_t n = p->field.len;
    struct sl_http_span *dst = NULL;
    if (n == 10 && strncasecmp(f, "connection", n) == 0)
        dst = &p->connection;
    else if (n == 12 && strncasecmp(f, "content-type", n) == 0)
        dst = &p->content_type;
    else if (n == 6 && strncasecmp(f, "expect", n) == 0)
        dst = &p->expect;
    else if (n == 13 && strncasecmp(f, "authorization", n) == 0)
        dst = &p->authorization;
    else if (n == 17 && strncasecmp(f, "transfer-encoding", n) == 0 &&
             !sl_http_span_eq(p, p->value, "chunked"))
        p->other_coding = true; /* llhttp refuses it unless chunked comes last */
    if (dst)
        *dst = p->value;
    if (p->n_headers < SL_HTTP_MAX_HEADERS)
        p->headers[p->n_headers++] = (struct sl_http_header){p->field, p->value};
    p->field = p->value = (struct sl_http_span){0, 0};
    return 0;
}

static int on_headers_complete(llhttp_t *ll)
{
    struct sl_http_parser *p = parser_of(ll);
    p->headers_complete = true;
    p->method = llhttp_get_method(ll);
    p->http_major = llhttp_get_http_major(ll);
    p->http_minor = llhttp_get_http_minor(ll);
    p->expect_continue = p->http_major == 1 && p->http_minor >= 1 && p->expect.len &&
                         sl_http_span_eq(p, p->expect, "100-continue");
    /* Pause so that run() learns exactly where the head ends (llhttp's error position), and
     * checks the head there before any of the body is read (head_checked). */
    return HPE_PAUSED;
}

static int on_body(llhttp_t *ll, const char *at, size_t len)
{
    struct sl_http_parser *p = parser_of(ll);
    if (p->body.len + len > p->max_body_bytes)
        return fail(p, 413, "The request body is too large.");
    size_t off = (size_t)(at - p->buf.p);
    if (!p->body_started) {
        p->body_started = true;
        p->body.off = p->head_end;
    }
    /* Chunked bodies arrive in pieces separated by framing that llhttp has already consumed:
     * slide each piece down so the body is one span right after the head. */
    if (off != p->body.off + p->body.len)
        memmove(p->buf.p + p->body.off + p->body.len, at, len);
    p->body.len += len;
    return 0;
}

/* A chunk and its CRLF are read: a chunk-size line comes next, unless that was the last chunk
 * (then trailers do). Pause so that run() reads the line itself. */
static int on_chunk_complete(llhttp_t *ll)
{
    struct sl_http_parser *p = parser_of(ll);
    if (p->chunk_size == 0)
        return 0;
    p->chunk = SL_CHUNK_SIZE;
    p->chunk_size = 0;
    return HPE_PAUSED;
}

static int on_message_complete(llhttp_t *ll)
{
    struct sl_http_parser *p = parser_of(ll);
    p->keep_alive = llhttp_should_keep_alive(ll);
    p->state = SL_HTTP_PARSE_DONE;
    /* Stop at the end of this request; the bytes after it wait for sl_http_parser_next(). */
    return HPE_PAUSED;
}

static const llhttp_settings_t parser_settings = {
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_chunk_complete = on_chunk_complete,
    .on_message_complete = on_message_complete,
};

static void parser_clear(struct sl_http_parser *p)
{
    llhttp_init(&p->ll, HTTP_REQUEST, &parser_settings);
    p->parsed = 0;
    p->state = SL_HTTP_PARSE_MORE;
    p->method = 0;
    p->http_major = p->http_minor = 0;
    p->url = p->content_type = p->connection = p->expect = p->body = (struct sl_http_span){0, 0};
    p->field = p->value = (struct sl_http_span){0, 0};
    p->authorization = (struct sl_http_span){0, 0};
    p->n_headers = 0;
    p->headers_complete = p->keep_alive = p->expect_continue = p->body_started = false;
    p->other_coding = p->run_empty = false;
    p->chunk = SL_CHUNK_NONE;
    p->chunk_digits = 0;
    p->chunk_size = 0;
    p->head_end = p->trailer_bytes = 0;
    p->error_code = 0;
    p->error_reason = NULL;
}

void sl_http_parser_init(struct sl_http_parser *p, size_t max_header_bytes, size_t max_body_bytes)
{
    memset(p, 0, sizeof *p);
    sl_str_init(&p->buf);
    p->max_header_bytes = max_header_bytes;
    p->max_body_bytes = max_body_bytes;
    parser_clear(p);
}

void sl_http_parser_dispose(struct sl_http_parser *p)
{
    sl_str_dispose(&p->buf);
}

static enum sl_http_parse parse_error(struct sl_http_parser *p, int code, const char *why)
{
    if (!p->error_code) {
        p->error_code = code;
        p->error_reason = why;
    }
    p->state = SL_HTTP_PARSE_ERROR;
    return p->state;
}

/* The head is complete and ends at head_end. Its size comes first: a head that arrives in pieces
 * is refused as too large as soon as it crosses the limit, before whatever else it says is
 * known, so a head that arrives whole must get the same answer. Then what else it says: llhttp
 * also takes HTTP/0.9 ("GET /\r\n", even "CONNECT \n" with no URL at all) and any version
 * number, and sluice speaks HTTP/1.0 and 1.1 only; and a declared body is refused before any of
 * it is buffered. */
static enum sl_http_parse head_checked(struct sl_http_parser *p)
{
    if (p->head_end > p->max_header_bytes)
        return parse_error(p, 431, "The request line and headers are too large.");
    if (p->http_major != 1 || p->url.len == 0)
        return parse_error(p, 400, "The request is not valid HTTP/1.1.");
    if ((p->ll.flags & F_CONTENT_LENGTH) && p->ll.content_length > p->max_body_bytes)
        return parse_error(p, 413, "The request body is too large.");
    /* RFC 9112 §6.1: a coding the server does not decode is 501 (chunked not last is llhttp's
     * 400). */
    if (p->other_coding && (p->ll.flags & F_CHUNKED))
        return parse_error(p, 501, "Only the chunked transfer coding is supported.");
    return SL_HTTP_PARSE_MORE;
}

/* RFC 9110 §5.6.2's tchar. */
static bool is_tchar(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* HTAB, SP, VCHAR, obs-text: what a quoted-string's text and its quoted-pairs may hold. */
static bool is_qtext(unsigned char ch)
{
    return ch == ' ' || ch == '\t' || (ch >= 0x21 && ch != 0x7f);
}

/* After the size, a value or a quoted-string: BWS then ';', or the line's CR. */
static enum sl_http_chunk_line after_value(unsigned char ch)
{
    return ch == ' ' || ch == '\t' ? SL_CHUNK_WS
           : ch == ';'             ? SL_CHUNK_NAME_WS
           : ch == '\r'            ? SL_CHUNK_LF
                                   : SL_CHUNK_NONE;
}

static int hex_value(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch |= 0x20;
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Reads the chunk-size line from buf at parsed, one byte at a time so that none of it needs to
 * stay buffered: chunk-size [ chunk-ext ] CRLF, where chunk-ext is
 * *( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] ). Extensions are dropped. Once the
 * line ends llhttp is given the canonical "SIZE\r\n" in its place. Returns MORE, or an error. */
static enum sl_http_parse chunk_line(struct sl_http_parser *p)
{
    static const char *const bad = "The request's chunked body is not valid HTTP/1.1.";
    while (p->chunk != SL_CHUNK_NONE && p->parsed < p->buf.len) {
        unsigned char ch = (unsigned char)p->buf.p[p->parsed++];
        bool ws = ch == ' ' || ch == '\t';
        enum sl_http_chunk_line next = SL_CHUNK_NONE; /* NONE here: the byte is refused */
        switch (p->chunk) {
        case SL_CHUNK_SIZE: {
            int v = hex_value(ch);
            if (v >= 0) {
                /* The size is refused as soon as it is over what the body may still take. */
                if (p->chunk_size > (p->max_body_bytes - p->body.len) >> 4)
                    return parse_error(p, 413, "The request body is too large.");
                p->chunk_size = p->chunk_size << 4 | (uint64_t)v;
                p->chunk_digits++;
                if (p->chunk_size > p->max_body_bytes - p->body.len)
                    return parse_error(p, 413, "The request body is too large.");
                next = SL_CHUNK_SIZE;
            } else if (p->chunk_digits > 0) {
                next = after_value(ch);
            }
            break;
        }
        case SL_CHUNK_WS:
            next = ws ? SL_CHUNK_WS : ch == ';' ? SL_CHUNK_NAME_WS : SL_CHUNK_NONE;
            break;
        case SL_CHUNK_NAME_WS:
            next = ws ? SL_CHUNK_NAME_WS : is_tchar(ch) ? SL_CHUNK_NAME : SL_CHUNK_NONE;
            break;
        case SL_CHUNK_NAME:
        case SL_CHUNK_AFTER:
            if (p->chunk == SL_CHUNK_NAME && is_tchar(ch))
                next = SL_CHUNK_NAME;
            else
                next = ws                                        ? SL_CHUNK_AFTER
                       : ch == '='                               ? SL_CHUNK_VALUE_WS
                       : ch == ';'                               ? SL_CHUNK_NAME_WS
                       : ch == '\r' && p->chunk == SL_CHUNK_NAME ? SL_CHUNK_LF
                                                                 : SL_CHUNK_NONE;
            break;
        case SL_CHUNK_VALUE_WS:
            next = ws             ? SL_CHUNK_VALUE_WS
                   : ch == '"'    ? SL_CHUNK_QUOTED
                   : is_tchar(ch) ? SL_CHUNK_TOKEN
                                  : SL_CHUNK_NONE;
            break;
        case SL_CHUNK_TOKEN: next = is_tchar(ch) ? SL_CHUNK_TOKEN : after_value(ch); break;
        case SL_CHUNK_QUOTED: /* qdtext: HTAB, SP, VCHAR but '"' and '\\', obs-text */
            next = ch == '"'      ? SL_CHUNK_END
                   : ch == '\\'   ? SL_CHUNK_PAIR
                   : is_qtext(ch) ? SL_CHUNK_QUOTED
                                  : SL_CHUNK_NONE;
            break;
        case SL_CHUNK_END: next = after_value(ch); break;
        case SL_CHUNK_PAIR: next = is_qtext(ch) ? SL_CHUNK_QUOTED : SL_CHUNK_NONE; break;
        case SL_CHUNK_LF:
            if (ch != '\n')
                return parse_error(p, 400, bad);
            char line[24];
            int n = snprintf(line, sizeof line, "%llx\r\n", (unsigned long long)p->chunk_size);
            p->chunk = SL_CHUNK_NONE;
            p->chunk_digits = 0;
            if (llhttp_execute(&p->ll, line, (size_t)n) != HPE_OK)
                return parse_error(p, 400, bad);
            return SL_HTTP_PARSE_MORE;
        case SL_CHUNK_NONE: break;
        }
        if (next == SL_CHUNK_NONE)
            return parse_error(p, 400, bad);
        p->chunk = next;
    }
    return SL_HTTP_PARSE_MORE;
}

/* The head is whole and checked: go on to the body. A chunked one starts with a size line,
 * read by chunk_line(); otherwise llhttp runs once more, even on no bytes, to finish a request
 * without a body. */
static void head_resume(struct sl_http_parser *p)
{
    llhttp_resume(&p->ll);
    if (p->ll.flags & F_CHUNKED) {
        p->chunk = SL_CHUNK_SIZE;
        p->chunk_size = 0;
    } else {
        p->run_empty = true;
    }
}

/* Drops what of buf after the head is not body: framing llhttp or chunk_line() has consumed
 * (chunk sizes, extensions, trailers), so a client cannot grow the buffer with it. llhttp keeps no
 * pointer into bytes it has returned from. */
static void drop_framing(struct sl_http_parser *p)
{
    size_t keep = p->body_started ? p->body.off + p->body.len : p->head_end;
    p->buf.len = p->parsed = keep;
    p->buf.p[keep] = '\0';
}

static enum sl_http_parse run(struct sl_http_parser *p)
{
    static const char *const too_big = "The request line and headers are too large.";
    while (p->state == SL_HTTP_PARSE_MORE && (p->parsed < p->buf.len || p->run_empty)) {
        if (p->chunk != SL_CHUNK_NONE) {
            if (chunk_line(p) != SL_HTTP_PARSE_MORE)
                return p->state;
            if (p->chunk != SL_CHUNK_NONE)
                break; /* all of buf is read; the line goes on in the next feed */
            continue;
        }
        p->run_empty = false;
        const char *start = p->buf.p + p->parsed;
        llhttp_errno_t e = llhttp_execute(&p->ll, start, p->buf.len - p->parsed);
        if (e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE) {
            p->parsed = (size_t)(llhttp_get_error_pos(&p->ll) - p->buf.p);
            if (e == HPE_PAUSED_UPGRADE) {
                /* An Upgrade or CONNECT, which we do not follow: answer it, then close. */
                p->keep_alive = false;
                if (p->state != SL_HTTP_PARSE_DONE)
                    return parse_error(p, 400, "Protocol upgrades are not supported.");
                return p->state;
            }
            if (p->state == SL_HTTP_PARSE_MORE && p->head_end == 0) {
                /* Paused by on_headers_complete: the head ends here. */
                p->head_end = p->parsed;
                enum sl_http_parse st = head_checked(p);
                if (st != SL_HTTP_PARSE_MORE)
                    return st;
                if (p->pause_at_head) {
                    p->state = SL_HTTP_PARSE_HEAD;
                    return p->state;
                }
                head_resume(p);
            } else if (p->state == SL_HTTP_PARSE_MORE) {
                llhttp_resume(&p->ll); /* paused by on_chunk_complete: a size line is next */
            }
            continue;
        }
        if (e != HPE_OK) {
            /* Pieces are checked against the head limit as they arrive, so a bad byte past the
             * limit is never reached when the head comes in small pieces: it must not turn the
             * 431 into a 400 when the same head comes in one piece. */
            size_t at = (size_t)(llhttp_get_error_pos(&p->ll) - p->buf.p);
            if (!p->headers_complete && at > p->max_header_bytes)
                return parse_error(p, 431, too_big);
            return parse_error(p, 400, "The request is not valid HTTP/1.1.");
        }
        p->parsed = p->buf.len;
        if (!p->headers_complete) {
            if (p->parsed > p->max_header_bytes)
                return parse_error(p, 431, too_big);
            break;
        }
        drop_framing(p);
    }
    if (p->state == SL_HTTP_PARSE_MORE && p->headers_complete && p->parsed == p->buf.len)
        drop_framing(p); /* e.g. after on_chunk_complete paused at the end of buf */
    return p->state;
}

enum sl_http_parse sl_http_parser_feed(struct sl_http_parser *p, const char *data, size_t len)
{
    /* After an error nothing more will be parsed, so nothing more is kept. */
    if (len && p->state != SL_HTTP_PARSE_ERROR)
        sl_str_append(&p->buf, data, len);
    return run(p);
}

enum sl_http_parse sl_http_parser_resume(struct sl_http_parser *p)
{
    if (p->state != SL_HTTP_PARSE_HEAD)
        return p->state;
    p->state = SL_HTTP_PARSE_MORE;
    head_resume(p);
    return run(p);
}

enum sl_http_parse sl_http_parser_next(struct sl_http_parser *p)
{
    size_t rest = p->buf.len - p->parsed;
    if (rest)
        memmove(p->buf.p, p->buf.p + p->parsed, rest);
    p->buf.len = rest;
    if (p->buf.p)
        p->buf.p[rest] = '\0';
    parser_clear(p);
    return run(p);
}

bool sl_http_span_eq(const struct sl_http_parser *p, struct sl_http_span s, const char *lit)
{
    const char *v = s.len ? sl_http_span_ptr(p, s) : "";
    size_t n = s.len;
    while (n && (v[0] == ' ' || v[0] == '\t'))
        v++, n--;
    while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    return n == strlen(lit) && strncasecmp(v, lit, n) == 0;
}

struct sl_http_span sl_http_parser_path(const struct sl_http_parser *p)
{
    struct sl_http_span s = p->url;
    const char *u = sl_http_span_ptr(p, s);
    /* absolute-form: "http://authority/path?query" (a proxy's form, which servers must accept) */
    size_t scheme = 0;
    if (s.len >= 7 && strncasecmp(u, "http://", 7) == 0)
        scheme = 7;
    else if (s.len >= 8 && strncasecmp(u, "https://", 8) == 0)
        scheme = 8;
    if (scheme) {
        size_t i = scheme;
        while (i < s.len && u[i] != '/' && u[i] != '?' && u[i] != '#')
            i++;
        s.off += i;
        s.len -= i;
        u += i;
    }
    for (size_t i = 0; i < s.len; i++)
        if (u[i] == '?' || u[i] == '#') {
            s.len = i;
            break;
        }
    return s;
}

struct sl_http_span sl_http_parser_query(const struct sl_http_parser *p)
{
    struct sl_http_span path = sl_http_parser_path(p), q = {0};
    size_t end = p->url.off + p->url.len, at = path.off + path.len;
    const char *u = sl_http_span_ptr(p, p->url) - p->url.off; /* offsets are into the buffer */
    if (at >= end || u[at] != '?')
        return q;
    q.off = at + 1;
    while (at + 1 + q.len < end && u[at + 1 + q.len] != '#')
        q.len++;
    return q;
}

bool sl_http_parser_header(const struct sl_http_parser *p, const char *name,
                           struct sl_http_span *out)
{
    size_t n = strlen(name);
    for (int i = 0; i < p->n_headers; i++) {
        const struct sl_http_header *h = &p->headers[i];
        if (h->name.len == n && strncasecmp(sl_http_span_ptr(p, h->name), name, n) == 0) {
            *out = h->value;
            return true;
        }
    }
    return false;
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

bool sl_http_bearer(const char *value, size_t len, const char **key, size_t *key_len)
{
    static const char scheme[] = "bearer";
    const size_t sl = sizeof scheme - 1;
    if (!value)
        return false;
    while (len && is_ows(*value))
        value++, len--;
    while (len && is_ows(value[len - 1]))
        len--;
    if (len <= sl || strncasecmp(value, scheme, sl) != 0 || !is_ows(value[sl]))
        return false;
    value += sl, len -= sl;
    while (len && is_ows(*value))
        value++, len--;
    if (!len)
        return false;
    *key = value;
    *key_len = len;
    return true;
}
