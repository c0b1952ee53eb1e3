/* Server-Sent Events and OpenAI stream chunks.
 *
 * The splitter works on whatever pieces the socket gives: bytes of a line that has not ended are
 * kept in `line`; complete lines inside one piece are handled where they lie. Each chunk's JSON
 * is parsed with jansson: a few microseconds per chunk, which the generator's measured CPU time
 * accounts for, and robust to servers that order or space their fields differently. */
#include "bench_impl.h"

#include <jansson.h>

#include <string.h>

void sl_bench_sse_init(struct sl_bench_sse *p)
{
    memset(p, 0, sizeof *p);
    sl_str_init(&p->line);
    sl_str_init(&p->data);
}

void sl_bench_sse_dispose(struct sl_bench_sse *p)
{
    sl_str_dispose(&p->line);
    sl_str_dispose(&p->data);
}

void sl_bench_sse_reset(struct sl_bench_sse *p)
{
    sl_str_clear(&p->line);
    sl_str_clear(&p->data);
    p->has_data = false;
    p->cr = false;
}

/* One complete line, without its end. */
static int line(struct sl_bench_sse *p, const char *s, size_t n,
                int (*on_data)(void *, const char *, size_t), void *arg)
{
    if (n == 0) {
        /* A blank line ends the event. */
        int rc = 0;
        if (p->has_data) {
            if (!p->data.p)
                sl_str_append(&p->data, "", 0);
            rc = on_data(arg, p->data.p, p->data.len);
        }
        sl_str_clear(&p->data);
        p->has_data = false;
        return rc;
    }
    if (n >= 5 && memcmp(s, "data", 4) == 0 && s[4] == ':') {
        s += 5;
        n -= 5;
        if (n && *s == ' ') {
            s++;
            n--;
        }
        if (p->data.len + n + 1 > SL_BENCH_SSE_MAX)
            return SL_ERANGE;
        if (p->has_data)
            sl_str_append(&p->data, "\n", 1);
        sl_str_append(&p->data, s, n);
        p->has_data = true;
    } else if (n == 4 && memcmp(s, "data", 4) == 0) {
        if (p->has_data)
            sl_str_append(&p->data, "\n", 1);
        p->has_data = true;
    }
    /* Comments (":...") and the fields event, id and retry do not matter here. */
    return 0;
}

int sl_bench_sse_feed(struct sl_bench_sse *p, const char *data, size_t len,
                      int (*on_data)(void *arg, const char *data, size_t len), void *arg)
{
    size_t i = 0;
    if (len == 0)
        return 0;
    if (p->cr && data[0] == '\n')
        i = 1; /* the LF of a CRLF split across pieces */
    p->cr = false;
    while (i < len) {
        const char *s = data + i;
        size_t rest = len - i, n = 0;
        while (n < rest && s[n] != '\n' && s[n] != '\r')
            n++;
        if (n == rest) {
            if (p->line.len + n > SL_BENCH_SSE_MAX)
                return SL_ERANGE;
            sl_str_append(&p->line, s, n);
            break;
        }
        size_t end = n + 1;
        if (s[n] == '\r') {
            if (n + 1 < rest && s[n + 1] == '\n')
                end++;
            else if (n + 1 == rest)
                p->cr = true;
        }
        int rc;
        if (p->line.len) {
            if (p->line.len + n > SL_BENCH_SSE_MAX)
                return SL_ERANGE;
            sl_str_append(&p->line, s, n);
            rc = line(p, p->line.p, p->line.len, on_data, arg);
            sl_str_clear(&p->line);
        } else {
            rc = line(p, s, n, on_data, arg);
        }
        if (rc)
            return rc;
        i += end;
    }
    return 0;
}

/* By the length jansson reports, not strlen: a text of one NUL byte is a token. */
static bool nonempty_string(json_t *v)
{
    return json_is_string(v) && json_string_length(v) > 0;
}

int sl_bench_chunk_read(const char *data, size_t len, struct sl_bench_chunk *out)
{
    memset(out, 0, sizeof *out);
    while (len && (*data == ' ' || *data == '\t')) {
        data++;
        len--;
    }
    if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
        out->done = true;
        return SL_OK;
    }
    /* JSON_ALLOW_NUL: a model may emit the byte token <0x00>, which a server sends as \u0000;
     * the chunk is valid and its text counts as sent. */
    json_error_t je;
    json_t *o = json_loadb(data, len, JSON_ALLOW_NUL, &je);
    if (!json_is_object(o)) {
        snprintf(out->message, sizeof out->message, "chunk is not a JSON object: %.100s",
                 o ? "other type" : je.text);
        json_decref(o);
        return SL_EFORMAT;
    }
    json_t *e = json_object_get(o, "error");
    if (e && !json_is_null(e)) {
        out->error = true;
        json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
        snprintf(out->message, sizeof out->message, "%s",
                 json_is_string(m) ? json_string_value(m) : "error");
    }
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) {
        json_t *pt = json_object_get(u, "prompt_tokens");
        json_t *ct = json_object_get(u, "completion_tokens");
        if (json_is_integer(pt) && json_is_integer(ct) && json_integer_value(pt) >= 0 &&
            json_integer_value(ct) >= 0) {
            out->usage = true;
            out->prompt_tokens = (uint32_t)json_integer_value(pt);
            out->completion_tokens = (uint32_t)json_integer_value(ct);
            json_t *cached =
                json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
            if (json_is_integer(cached) && json_integer_value(cached) >= 0 &&
                json_integer_value(cached) <= json_integer_value(pt))
                out->cached_tokens = (uint32_t)json_integer_value(cached);
        }
    }
    size_t i;
    json_t *ch;
    json_array_foreach(json_object_get(o, "choices"), i, ch)
    {
        json_t *fr = json_object_get(ch, "finish_reason");
        if (fr && !json_is_null(fr))
            out->finish = true;
        json_t *delta = json_object_get(ch, "delta");
        json_t *msg = json_object_get(ch, "message"); /* a non-streamed chat response */
        if (nonempty_string(json_object_get(ch, "text")))
            out->text = true;
        for (json_t *d = delta ? delta : msg; d; d = NULL)
            if (nonempty_string(json_object_get(d, "content")) ||
                nonempty_string(json_object_get(d, "reasoning_content")) ||
                nonempty_string(json_object_get(d, "reasoning")))
                out->text = true;
    }
    json_decref(o);
    return SL_OK;
}
