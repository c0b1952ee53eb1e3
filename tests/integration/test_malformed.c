/* Oversized and malformed everything (issue 9): one table of hostile requests against the real
 * server, each with the 4xx it must get (README.md, "Every error is an HTTP status with OpenAI's
 * error object"): huge heads and bodies, deep JSON, invalid UTF-8, NUL bytes, negative and
 * enormous numbers, prompts beyond the context, and requests that are not HTTP at all. Every
 * answer must be that status with a JSON error object whose type, code and param say why, and
 * must name nothing of the server's own (paths, sources). The server serves normally after all
 * of them. */
#include <criterion/criterion.h>

#include "harness.h"

#include <jansson.h>
#include <sluice/common.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct server srv;

static void start(void)
{
    server_start(&srv, NULL);
}

static void stop(void)
{
    server_stop(&srv);
}

/* A request with the given body (len bytes; Content-Length set) on /v1/completions or another
 * path. */
static void post(struct sl_str *out, const char *path, const char *body, size_t len)
{
    sl_str_appendf(out,
                   "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   "Connection: close\r\nContent-Length: %zu\r\n\r\n",
                   path, len);
    sl_str_append(out, body, len);
}

static void post_str(struct sl_str *out, const char *body)
{
    post(out, "/v1/completions", body, strlen(body));
}

static void repeat(struct sl_str *out, const char *s, size_t times)
{
    for (size_t i = 0; i < times; i++)
        sl_str_append(out, s, strlen(s));
}

/* ---- the requests ---- */

static void huge_header(struct sl_str *o)
{
    sl_str_appendf(o, "GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: ");
    repeat(o, "a", 20000);
    sl_str_appendf(o, "\r\n\r\n");
}

static void huge_url(struct sl_str *o)
{
    sl_str_appendf(o, "GET /v1/models/");
    repeat(o, "m", 20000);
    sl_str_appendf(o, " HTTP/1.1\r\nHost: a\r\n\r\n");
}

static void many_headers(struct sl_str *o)
{
    sl_str_appendf(o, "GET /healthz HTTP/1.1\r\nHost: a\r\n");
    for (int i = 0; i < 3000; i++)
        sl_str_appendf(o, "X-%d: v\r\n", i);
    sl_str_appendf(o, "\r\n");
}

static void huge_declared_body(struct sl_str *o)
{
    /* Only the head is sent: the answer must come before any of the body. */
    sl_str_appendf(o, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2000000\r\n"
                      "Content-Type: application/json\r\n\r\n");
}

static void huge_chunked_body(struct sl_str *o)
{
    sl_str_appendf(o, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                      "Content-Type: application/json\r\n\r\n");
    for (int i = 0; i < 40; i++) {
        sl_str_appendf(o, "8000\r\n");
        repeat(o, "x", 0x8000);
        sl_str_appendf(o, "\r\n");
    }
    sl_str_appendf(o, "0\r\n\r\n");
}

static void deep_json(struct sl_str *o)
{
    struct sl_str b;
    sl_str_init(&b);
    sl_str_appendf(&b, "{\"prompt\":\"x\",\"extra\":");
    repeat(&b, "[", 100000);
    repeat(&b, "]", 100000);
    sl_str_appendf(&b, "}");
    post(o, "/v1/completions", b.p, b.len);
    sl_str_dispose(&b);
}

static void deep_messages(struct sl_str *o)
{
    struct sl_str b;
    sl_str_init(&b);
    sl_str_appendf(&b, "{\"messages\":");
    repeat(&b, "[{\"role\":\"user\",\"content\":", 20000);
    sl_str_appendf(&b, "\"x\"");
    repeat(&b, "}]", 20000);
    sl_str_appendf(&b, "}");
    post(o, "/v1/chat/completions", b.p, b.len);
    sl_str_dispose(&b);
}

static void invalid_utf8(struct sl_str *o)
{
    post_str(o, "{\"prompt\":\"caf\xe9 \xff\xfe\"}");
}

static void overlong_utf8(struct sl_str *o)
{
    post_str(o, "{\"prompt\":\"\xc0\xaf\xe0\x80\xaf\"}");
}

static void lone_surrogate(struct sl_str *o)
{
    post_str(o, "{\"prompt\":\"\\ud800 alone\"}");
}

static void nul_escape(struct sl_str *o)
{
    post_str(o, "{\"prompt\":\"a\\u0000b\"}");
}

static void nul_byte_in_body(struct sl_str *o)
{
    static const char body[] = "{\"prompt\":\"a\0b\"}";
    post(o, "/v1/completions", body, sizeof body - 1);
}

static void nul_byte_in_header(struct sl_str *o)
{
    static const char r[] = "GET /healthz HTTP/1.1\r\nHost: a\0b\r\n\r\n";
    sl_str_append(o, r, sizeof r - 1);
}

static void nul_byte_in_url(struct sl_str *o)
{
    static const char r[] = "GET /health\0z HTTP/1.1\r\nHost: a\r\n\r\n";
    sl_str_append(o, r, sizeof r - 1);
}

static void long_prompt(struct sl_str *o)
{
    /* The synthetic model's context is 512 tokens. */
    struct sl_str b;
    sl_str_init(&b);
    sl_str_appendf(&b, "{\"prompt\":\"");
    for (int i = 0; i < 3000; i++)
        sl_str_appendf(&b, "w%d ", i);
    sl_str_appendf(&b, "\",\"max_tokens\":4}");
    post(o, "/v1/completions", b.p, b.len);
    sl_str_dispose(&b);
}

static void long_chat(struct sl_str *o)
{
    struct sl_str b;
    sl_str_init(&b);
    sl_str_appendf(&b, "{\"messages\":[");
    for (int i = 0; i < 400; i++)
        sl_str_appendf(&b, "%s{\"role\":\"user\",\"content\":\"word %d and more\"}", i ? "," : "",
                       i);
    sl_str_appendf(&b, "]}");
    post(o, "/v1/chat/completions", b.p, b.len);
    sl_str_dispose(&b);
}

static void many_stops(struct sl_str *o)
{
    post_str(o, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}");
}

#define BODY(name, json)                                                                           \
    static void name(struct sl_str *o)                                                             \
    {                                                                                              \
        post_str(o, json);                                                                         \
    }
BODY(negative_max_tokens, "{\"prompt\":\"x\",\"max_tokens\":-1}")
BODY(zero_max_tokens, "{\"prompt\":\"x\",\"max_tokens\":0}")
BODY(int64_max_tokens, "{\"prompt\":\"x\",\"max_tokens\":9223372036854775807}")
BODY(beyond_int64_max_tokens, "{\"prompt\":\"x\",\"max_tokens\":99999999999999999999999}")
BODY(real_max_tokens, "{\"prompt\":\"x\",\"max_tokens\":1e30}")
BODY(max_tokens_past_context, "{\"prompt\":\"x\",\"max_tokens\":600}")
BODY(negative_temperature, "{\"prompt\":\"x\",\"temperature\":-0.5}")
BODY(enormous_temperature, "{\"prompt\":\"x\",\"temperature\":1e308}")
BODY(infinite_temperature, "{\"prompt\":\"x\",\"temperature\":1e999}")
BODY(zero_top_p, "{\"prompt\":\"x\",\"top_p\":0}")
BODY(negative_top_k, "{\"prompt\":\"x\",\"top_k\":-2}")
BODY(two_choices, "{\"prompt\":\"x\",\"n\":129}")
BODY(not_an_object, "[1,2,3]")
BODY(empty_body, "")
BODY(truncated_json, "{\"prompt\":\"x\",")
BODY(wrong_model, "{\"prompt\":\"x\",\"model\":\"../../etc/passwd\"}")
BODY(prompt_of_wrong_type, "{\"prompt\":5}")
BODY(two_prompts, "{\"prompt\":[[1,2,3],[4,512]]}")
BODY(prompt_id_outside_vocab, "{\"prompt\":[1,2,512]}")

#define CHAT(name, json)                                                                           \
    static void name(struct sl_str *o)                                                             \
    {                                                                                              \
        post(o, "/v1/chat/completions", json, strlen(json));                                       \
    }
CHAT(empty_messages, "{\"messages\":[]}")
CHAT(messages_not_array, "{\"messages\":\"hi\"}")
CHAT(tool_message, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}")
CHAT(image_part, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}")

#define RAW(name, text)                                                                            \
    static void name(struct sl_str *o)                                                             \
    {                                                                                              \
        sl_str_append(o, text, strlen(text));                                                      \
    }
RAW(not_http, "HELLO THERE\r\n\r\n")
RAW(http2_preface, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
RAW(bad_content_length, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n")
RAW(two_content_lengths, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n"
                         "Content-Length: 3\r\n\r\n{}")
RAW(bad_chunk_size, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                    "\r\nzz\r\n")
RAW(upgrade, "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
RAW(unknown_route, "GET /etc/passwd HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
RAW(wrong_method, "DELETE /v1/completions HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
RAW(unknown_tier, "POST /v1/completions HTTP/1.1\r\nHost: a\r\nx-sluice-tier: \xff\xfe gold\r\n"
                  "Connection: close\r\nContent-Length: 14\r\n\r\n{\"prompt\":\"x\"}")

struct bad {
    const char *what;
    void (*make)(struct sl_str *out);
    int status;
    const char *code;  /* error.code; NULL: JSON null */
    const char *param; /* error.param; NULL: JSON null */
};

static const struct bad table[] = {
    {"a 20 KB header", huge_header, 431, NULL, NULL},
    {"a 20 KB URL", huge_url, 431, NULL, NULL},
    {"3000 headers", many_headers, 431, NULL, NULL},
    {"a declared 2 MB body", huge_declared_body, 413, NULL, NULL},
    {"a 1.3 MB chunked body", huge_chunked_body, 413, NULL, NULL},
    {"JSON nested 100000 deep", deep_json, 400, "invalid_json", NULL},
    {"messages nested 20000 deep", deep_messages, 400, "invalid_json", NULL},
    {"invalid UTF-8 in the prompt", invalid_utf8, 400, "invalid_json", NULL},
    {"overlong UTF-8 in the prompt", overlong_utf8, 400, "invalid_json", NULL},
    {"a lone surrogate escape", lone_surrogate, 400, "invalid_json", NULL},
    {"a \\u0000 escape in the prompt", nul_escape, 400, "invalid_json", NULL},
    {"a NUL byte in the body", nul_byte_in_body, 400, "invalid_json", NULL},
    {"a NUL byte in a header", nul_byte_in_header, 400, NULL, NULL},
    {"a NUL byte in the URL", nul_byte_in_url, 400, NULL, NULL},
    {"max_tokens -1", negative_max_tokens, 400, "integer_below_min_value", "max_tokens"},
    {"max_tokens 0", zero_max_tokens, 400, "integer_below_min_value", "max_tokens"},
    {"max_tokens 2^63-1", int64_max_tokens, 400, "context_length_exceeded", "max_tokens"},
    {"max_tokens past int64", beyond_int64_max_tokens, 400, "invalid_json", NULL},
    {"max_tokens 1e30", real_max_tokens, 400, "invalid_type", "max_tokens"},
    {"max_tokens past the context", max_tokens_past_context, 400, "context_length_exceeded",
     "max_tokens"},
    {"a prompt of 3000 words", long_prompt, 400, "context_length_exceeded", "prompt"},
    {"400 chat messages", long_chat, 400, "context_length_exceeded", "messages"},
    {"temperature -0.5", negative_temperature, 400, "decimal_below_min_value", "temperature"},
    {"temperature 1e308", enormous_temperature, 400, "decimal_above_max_value", "temperature"},
    {"temperature 1e999", infinite_temperature, 400, "invalid_json", NULL},
    {"top_p 0", zero_top_p, 400, "decimal_below_min_value", "top_p"},
    {"top_k -2", negative_top_k, 400, "integer_below_min_value", "top_k"},
    {"n 129", two_choices, 400, "integer_above_max_value", "n"},
    {"five stop strings", many_stops, 400, "array_above_max_length", "stop"},
    {"a body that is an array", not_an_object, 400, "invalid_json", NULL},
    {"an empty body", empty_body, 400, "invalid_json", NULL},
    {"truncated JSON", truncated_json, 400, "invalid_json", NULL},
    {"a model that is a path", wrong_model, 404, "model_not_found", "model"},
    {"a prompt that is a number", prompt_of_wrong_type, 400, "invalid_type", "prompt"},
    {"the second of two prompts outside the vocabulary", two_prompts, 400, "invalid_value",
     "prompt[1]"},
    {"a prompt id outside the vocabulary", prompt_id_outside_vocab, 400, "invalid_value", "prompt"},
    {"empty messages", empty_messages, 400, "empty_array", "messages"},
    {"messages that are a string", messages_not_array, 400, "invalid_type", "messages"},
    {"a tool message", tool_message, 400, "unsupported_value", "messages[0].role"},
    {"an image part", image_part, 400, "unsupported_value", "messages[0].content[0].type"},
    {"not HTTP", not_http, 400, NULL, NULL},
    {"the HTTP/2 preface", http2_preface, 400, NULL, NULL},
    {"a negative Content-Length", bad_content_length, 400, NULL, NULL},
    {"two Content-Lengths", two_content_lengths, 400, NULL, NULL},
    {"a bad chunk size", bad_chunk_size, 400, NULL, NULL},
    {"an Upgrade (not followed)", upgrade, 404, "unknown_url", NULL},
    {"an unknown route", unknown_route, 404, "unknown_url", NULL},
    {"a wrong method", wrong_method, 405, "method_not_allowed", NULL},
    {"a tier header of invalid UTF-8", unknown_tier, 400, "invalid_tier", "x-sluice-tier"},
};

/* Sends the raw request and reads the one answer; the connection then ends. */
static struct response exchange(const struct sl_str *req)
{
    int fd = client_connect(srv.port);
    /* The server may answer and stop reading before the whole request is sent (413, 431); it
     * reads on for a while so that the answer arrives, but a send may still see the close. */
    const char *p = req->p;
    size_t left = req->len;
    while (left) {
        ssize_t n = send(fd, p, left, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        p += n;
        left -= (size_t)n;
    }
    struct response r;
    cr_assert(client_read_response(fd, &r), "no answer");
    close(fd);
    return r;
}

static void expect_string_or_null(json_t *o, const char *key, const char *want, const char *what)
{
    json_t *v = json_object_get(o, key);
    if (!want)
        cr_assert(json_is_null(v), "%s: %s is %s, not null", what, key,
                  json_is_string(v) ? json_string_value(v) : "not a string");
    else
        cr_assert(json_is_string(v) && strcmp(json_string_value(v), want) == 0,
                  "%s: %s is %s, not %s", what, key,
                  json_is_string(v) ? json_string_value(v) : "not a string", want);
}

Test(malformed, every_hostile_request_gets_its_documented_4xx_when_sent, .init = start,
     .fini = stop, .timeout = 300)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const struct bad *b = &table[i];
        struct sl_str req;
        sl_str_init(&req);
        b->make(&req);
        struct response r = exchange(&req);
        sl_str_dispose(&req);
        cr_assert_eq(r.status, b->status, "%s: got %d: %s", b->what, r.status, r.body);
        const char *ct = response_header(&r, "content-type");
        cr_assert(ct && strcmp(ct, "application/json") == 0, "%s: Content-Type %s", b->what,
                  ct ? ct : "(none)");
        json_error_t je;
        json_t *j = json_loads(r.body, 0, &je);
        cr_assert_not_null(j, "%s: the body is not JSON (%s): %s", b->what, je.text, r.body);
        json_t *e = json_object_get(j, "error");
        cr_assert(json_is_object(e), "%s: no error object: %s", b->what, r.body);
        json_t *msg = json_object_get(e, "message");
        cr_assert(json_is_string(msg) && json_string_length(msg) > 0, "%s: %s", b->what, r.body);
        expect_string_or_null(e, "type", "invalid_request_error", b->what);
        expect_string_or_null(e, "code", b->code, b->what);
        expect_string_or_null(e, "param", b->param, b->what);
        /* Nothing of the server's own: no source file, no path of its machine. */
        const char *m = json_string_value(msg);
        cr_assert_null(strstr(m, ".c:"), "%s: %s", b->what, m);
        cr_assert_null(strstr(m, "/tmp/"), "%s: %s", b->what, m);
        cr_assert_null(strstr(m, "/home/"), "%s: %s", b->what, m);
        json_decref(j);
        response_dispose(&r);
    }
    /* After all of that, the server serves. */
    int fd = client_connect(srv.port);
    client_request(fd, "POST", "/v1/completions", "{\"prompt\":\"Hello\",\"max_tokens\":3}", false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    close(fd);
}
