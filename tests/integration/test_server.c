/* The real server on a loopback port, spoken to over real sockets. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct server srv;

static void start_default(void)
{
    server_start(&srv, NULL);
}
static void stop(void)
{
    server_stop(&srv);
}

static json_t *parse_json(const char *body)
{
    json_error_t e;
    json_t *j = json_loads(body, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, body);
    return j;
}

static struct response roundtrip(const char *method, const char *path, const char *body)
{
    int fd = client_connect(srv.port);
    client_request(fd, method, path, body, false);
    struct response r;
    cr_assert(client_read_response(fd, &r), "no response to %s %s", method, path);
    close(fd);
    return r;
}

static void assert_error_object(const struct response *r, int status, const char *type)
{
    cr_assert_eq(r->status, status, "status %d, body %s", r->status, r->body);
    json_t *j = parse_json(r->body);
    json_t *err = json_object_get(j, "error");
    cr_assert(json_is_object(err), "no error object: %s", r->body);
    cr_assert(json_is_string(json_object_get(err, "message")));
    cr_assert_gt(strlen(json_string_value(json_object_get(err, "message"))), 0);
    cr_assert_str_eq(json_string_value(json_object_get(err, "type")), type);
    cr_assert_not_null(json_object_get(err, "param"), "param is present (may be null)");
    cr_assert_not_null(json_object_get(err, "code"), "code is present (may be null)");
    json_decref(j);
}

/* The text of a non-streamed completion, checked for shape; caller frees. */
static char *complete(const char *body, int max_tokens, const char **finish_out)
{
    struct response r = roundtrip("POST", "/v1/completions", body);
    cr_assert_eq(r.status, 200, "body: %s", r.body);
    cr_assert(strstr(response_header(&r, "content-type"), "application/json"));
    json_t *j = parse_json(r.body);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "text_completion");
    cr_assert(json_is_string(json_object_get(j, "id")));
    cr_assert(json_is_integer(json_object_get(j, "created")));
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert(json_is_object(choice));
    const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
    cr_assert(finish && (strcmp(finish, "length") == 0 || strcmp(finish, "stop") == 0));
    static char fin[16];
    snprintf(fin, sizeof fin, "%s", finish);
    if (finish_out)
        *finish_out = fin;
    json_t *usage = json_object_get(j, "usage");
    json_int_t pt = json_integer_value(json_object_get(usage, "prompt_tokens"));
    json_int_t ct = json_integer_value(json_object_get(usage, "completion_tokens"));
    cr_assert_gt(pt, 0);
    cr_assert_leq(ct, max_tokens);
    if (strcmp(finish, "length") == 0)
        cr_assert_eq(ct, max_tokens);
    cr_assert_eq(json_integer_value(json_object_get(usage, "total_tokens")), pt + ct);
    char *text = strdup(json_string_value(json_object_get(choice, "text")));
    json_decref(j);
    response_dispose(&r);
    return text;
}

/* Streams a completion; returns the concatenated text and checks the chunk format. */
static char *stream(const char *body, const char **finish_out)
{
    struct response r = roundtrip("POST", "/v1/completions", body);
    cr_assert_eq(r.status, 200, "body: %s", r.body);
    cr_assert(strstr(response_header(&r, "content-type"), "text/event-stream"));
    size_t cap = 4096, len = 0;
    char *text = calloc(1, cap);
    char id[128] = "";
    static char fin[16] = "";
    bool done = false;
    int chunks = 0;
    for (char *ev = r.body; ev && *ev;) {
        char *end = strstr(ev, "\n\n");
        cr_assert_not_null(end, "event not terminated by a blank line");
        *end = '\0';
        cr_assert_eq(strncmp(ev, "data: ", 6), 0, "event: %s", ev);
        cr_assert(!done, "nothing after [DONE]");
        const char *data = ev + 6;
        if (strcmp(data, "[DONE]") == 0) {
            done = true;
        } else {
            json_t *j = parse_json(data);
            cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "text_completion");
            const char *cid = json_string_value(json_object_get(j, "id"));
            if (!id[0])
                snprintf(id, sizeof id, "%s", cid);
            cr_assert_str_eq(cid, id, "every chunk has the same id");
            json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
            const char *t = json_string_value(json_object_get(choice, "text"));
            cr_assert_not_null(t);
            size_t tl = strlen(t);
            while (len + tl + 1 > cap)
                text = realloc(text, cap *= 2);
            memcpy(text + len, t, tl + 1);
            len += tl;
            json_t *f = json_object_get(choice, "finish_reason");
            if (json_is_string(f))
                snprintf(fin, sizeof fin, "%s", json_string_value(f));
            else
                cr_assert(json_is_null(f), "finish_reason is null before the end");
            chunks++;
            json_decref(j);
        }
        ev = end + 2;
    }
    cr_assert(done, "the stream ends with data: [DONE]");
    cr_assert_gt(chunks, 1);
    cr_assert(fin[0], "the last chunk carries a finish_reason");
    if (finish_out)
        *finish_out = fin;
    response_dispose(&r);
    return text;
}

TestSuite(integration, .init = start_default, .fini = stop, .timeout = 300);

Test(integration, completion_returns_openai_object_when_not_streaming)
{
    char *t =
        complete("{\"prompt\":\"Hello there\",\"max_tokens\":12,\"temperature\":0}", 12, NULL);
    free(t);
}

Test(integration, stream_yields_same_text_as_non_streaming_when_greedy)
{
    const char *f1, *f2;
    char *a =
        complete("{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0}", 40, &f1);
    char fin1[16];
    snprintf(fin1, sizeof fin1, "%s", f1);
    char *b = stream("{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,"
                     "\"stream\":true}",
                     &f2);
    cr_assert_str_eq(a, b);
    cr_assert_str_eq(fin1, f2);
    free(a);
    free(b);
}

Test(integration, same_seed_gives_same_text_when_sampling)
{
    const char *body = "{\"prompt\":\"The cat\",\"max_tokens\":30,\"temperature\":0.9,\"seed\":77}";
    char *a = complete(body, 30, NULL);
    char *b = complete(body, 30, NULL);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
}

Test(integration, two_requests_share_one_connection_when_keep_alive)
{
    int fd = client_connect(srv.port);
    const char *body = "{\"prompt\":\"Hi\",\"max_tokens\":5}";
    client_request(fd, "POST", "/v1/completions", body, true);
    struct response r1, r2;
    cr_assert(client_read_response(fd, &r1));
    cr_assert_eq(r1.status, 200, "%s", r1.body);
    client_request(fd, "GET", "/v1/models", NULL, true);
    cr_assert(client_read_response(fd, &r2), "the connection stayed open for a second request");
    cr_assert_eq(r2.status, 200);
    json_t *j = parse_json(r2.body);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "list");
    json_t *m = json_array_get(json_object_get(j, "data"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(m, "id")), "synthetic:tiny");
    json_decref(j);
    response_dispose(&r1);
    response_dispose(&r2);
    close(fd);
}

Test(integration, malformed_json_gets_400_error_object_when_posted)
{
    struct response r = roundtrip("POST", "/v1/completions", "{\"prompt\": \"x\",");
    assert_error_object(&r, 400, "invalid_request_error");
    response_dispose(&r);
}

Test(integration, wrong_type_gets_400_naming_param_when_field_mistyped)
{
    struct response r =
        roundtrip("POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":\"ten\"}");
    assert_error_object(&r, 400, "invalid_request_error");
    json_t *j = parse_json(r.body);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "param")),
                     "max_tokens");
    json_decref(j);
    response_dispose(&r);
}

Test(integration, unknown_route_gets_404_and_wrong_method_405_when_requested)
{
    struct response r = roundtrip("GET", "/v1/nothing", NULL);
    assert_error_object(&r, 404, "invalid_request_error");
    response_dispose(&r);
    r = roundtrip("GET", "/v1/completions", NULL);
    assert_error_object(&r, 405, "invalid_request_error");
    cr_assert_not_null(response_header(&r, "allow"));
    cr_assert(strstr(response_header(&r, "allow"), "POST"));
    response_dispose(&r);
}

Test(integration, prompt_over_context_gets_400_when_too_long)
{
    /* The tiny synthetic model has a 512-token context; 3000 words cannot fit. */
    size_t n = 3000 * 6 + 64;
    char *body = malloc(n);
    size_t len = (size_t)sprintf(body, "{\"prompt\":\"");
    for (int i = 0; i < 3000; i++)
        len += (size_t)sprintf(body + len, "word%d ", i % 10);
    sprintf(body + len, "\"}");
    struct response r = roundtrip("POST", "/v1/completions", body);
    assert_error_object(&r, 400, "invalid_request_error");
    json_t *j = parse_json(r.body);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "context_length_exceeded");
    json_decref(j);
    response_dispose(&r);
    free(body);
}

Test(integration, healthz_answers_ok_when_alive)
{
    struct response r = roundtrip("GET", "/healthz", NULL);
    cr_assert_eq(r.status, 200);
    response_dispose(&r);
}

Test(integration, disconnect_mid_stream_cancels_request_when_client_leaves)
{
    int fd = client_connect(srv.port);
    client_request(fd, "POST", "/v1/completions",
                   "{\"prompt\":\"Tell me a long story\",\"max_tokens\":400,\"stream\":true}",
                   false);
    char buf[8192];
    cr_assert(client_read_until(fd, "data: {", buf, sizeof buf), "a first chunk arrives");
    close(fd);
    /* The server logs each request's outcome; a cancelled one proves the sequence was dropped. */
    server_wait_log(&srv, "\"finish\":\"cancelled\"");
    /* And it goes on serving. */
    char *t = complete("{\"prompt\":\"Still there?\",\"max_tokens\":3}", 3, NULL);
    free(t);
}

Test(integration, logit_bias_and_penalties_shape_the_text_when_sent)
{
    /* A bias of 100 outweighs every logit: each token is the biased one. */
    char *one = complete("{\"prompt\":\"Once\",\"max_tokens\":1,\"temperature\":0,"
                         "\"logit_bias\":{\"100\":100}}",
                         1, NULL);
    char *five = complete("{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0,"
                          "\"logit_bias\":{\"100\":100}}",
                          5, NULL);
    char want[256] = "";
    for (int i = 0; i < 5; i++)
        strncat(want, one, sizeof want - strlen(want) - 1);
    cr_assert_str_eq(five, want);
    char *plain = complete("{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0}", 5, NULL);
    cr_assert_str_neq(plain, five, "the bias changed nothing");

    /* A frequency penalty changes a greedy run, the same way streamed or not. */
    const char *f;
    char *pen = complete("{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,"
                         "\"frequency_penalty\":2}",
                         24, NULL);
    char *greedy =
        complete("{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0}", 24, NULL);
    char *streamed = stream("{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,"
                            "\"frequency_penalty\":2,\"stream\":true}",
                            &f);
    cr_assert_str_neq(pen, greedy, "the penalty changed nothing");
    cr_assert_str_eq(pen, streamed);
    free(one);
    free(five);
    free(plain);
    free(pen);
    free(greedy);
    free(streamed);
}

Test(integration, echo_puts_the_prompt_before_the_completion_streamed_or_not)
{
    const char *f;
    char *plain =
        complete("{\"prompt\":\"Once upon\",\"max_tokens\":6,\"temperature\":0}", 6, NULL);
    char *echo = complete("{\"prompt\":\"Once upon\",\"max_tokens\":6,\"temperature\":0,"
                          "\"echo\":true}",
                          6, NULL);
    char want[512];
    snprintf(want, sizeof want, "Once upon%s", plain);
    cr_assert_str_eq(echo, want);
    char *streamed = stream("{\"prompt\":\"Once upon\",\"max_tokens\":6,\"temperature\":0,"
                            "\"echo\":true,\"stream\":true}",
                            &f);
    cr_assert_str_eq(streamed, want);
    struct response r =
        roundtrip("POST", "/v1/completions", "{\"prompt\":\"x\",\"echo\":true,\"logprobs\":1}");
    assert_error_object(&r, 400, "invalid_request_error");
    cr_assert(strstr(r.body, "\"param\":\"echo\""), "%s", r.body);
    response_dispose(&r);
    free(plain);
    free(echo);
    free(streamed);
}

/* complete(), also giving usage.completion_tokens. */
static char *complete_counted(const char *body, int max_tokens, const char **finish, int *n)
{
    char *text = complete(body, max_tokens, finish);
    struct response r = roundtrip("POST", "/v1/completions", body);
    json_t *j = parse_json(r.body);
    *n = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    json_decref(j);
    response_dispose(&r);
    return text;
}

/* vLLM's stop controls over HTTP, on the tiny synthetic model (its stop tokens: BOS 1, EOS 2):
 * a bias of 100 makes a token the greedy choice, so "the model wants to stop now" is set up. */
Test(integration, ignore_eos_min_tokens_and_stop_token_ids_decide_where_the_text_ends)
{
    const char *f;
    int n;
    char *plain =
        complete_counted("{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0}", 5, &f, &n);
    cr_assert_str_eq(f, "length", "the plain greedy run hits no stop token");
    /* EOS at once: one token generated, no text. */
    char *eos = complete_counted("{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":0,"
                                 "\"logit_bias\":{\"2\":100}}",
                                 8, &f, &n);
    cr_assert_str_eq(f, "stop");
    cr_assert_eq(n, 1);
    cr_assert_str_eq(eos, "");
    /* ignore_eos: EOS every step, to max_tokens; a control token's text is empty. */
    char *ign = complete_counted("{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":0,"
                                 "\"logit_bias\":{\"2\":100},\"ignore_eos\":true}",
                                 8, &f, &n);
    cr_assert_str_eq(f, "length");
    cr_assert_eq(n, 8);
    cr_assert_str_eq(ign, "");
    /* min_tokens 5: EOS masked for five tokens (the plain run's), then taken; streamed alike. */
    const char *min_body = "{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":0,"
                           "\"logit_bias\":{\"2\":100},\"min_tokens\":5%s}";
    char body[512];
    snprintf(body, sizeof body, min_body, "");
    char *min = complete_counted(body, 8, &f, &n);
    cr_assert_str_eq(f, "stop");
    cr_assert_eq(n, 6);
    cr_assert_str_eq(min, plain);
    snprintf(body, sizeof body, min_body, ",\"stream\":true");
    char *min_s = stream(body, &f);
    cr_assert_str_eq(f, "stop");
    cr_assert_str_eq(min_s, plain);

    /* stop_token_ids: the token's text is part of the output; with min_tokens 3 it comes after
     * the plain run's first three. */
    char *one = complete("{\"prompt\":\"Once\",\"max_tokens\":1,\"temperature\":0,"
                         "\"logit_bias\":{\"100\":100}}",
                         1, NULL);
    char *stop_id = complete_counted("{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":0,"
                                     "\"logit_bias\":{\"100\":100},\"stop_token_ids\":[100]}",
                                     8, &f, &n);
    cr_assert_str_eq(f, "stop");
    cr_assert_eq(n, 1);
    cr_assert_str_eq(stop_id, one);
    char *three = complete("{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0}", 3, NULL);
    char *late = complete_counted("{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":0,"
                                  "\"logit_bias\":{\"100\":100},\"stop_token_ids\":[100],"
                                  "\"min_tokens\":3}",
                                  8, &f, &n);
    cr_assert_str_eq(f, "stop");
    cr_assert_eq(n, 4);
    char want[256];
    snprintf(want, sizeof want, "%s%s", three, one);
    cr_assert_str_eq(late, want);

    /* include_stop_str_in_output keeps the stop string. */
    char stop_body[512];
    json_t *js = json_string(one);
    char *quoted = json_dumps(js, JSON_ENCODE_ANY);
    const char *fmt = "{\"prompt\":\"Once\",\"max_tokens\":8,\"temperature\":0,"
                      "\"logit_bias\":{\"100\":100},\"stop\":%s%s}";
    snprintf(stop_body, sizeof stop_body, fmt, quoted, "");
    char *cut = complete(stop_body, 8, &f);
    cr_assert_str_eq(f, "stop");
    cr_assert_str_eq(cut, "");
    snprintf(stop_body, sizeof stop_body, fmt, quoted, ",\"include_stop_str_in_output\":true");
    char *kept = complete(stop_body, 8, &f);
    cr_assert_str_eq(f, "stop");
    cr_assert_str_eq(kept, one);
    free(quoted);
    json_decref(js);

    /* An id outside the vocabulary is named. */
    struct response r =
        roundtrip("POST", "/v1/completions", "{\"prompt\":\"Once\",\"stop_token_ids\":[512]}");
    assert_error_object(&r, 400, "invalid_request_error");
    cr_assert(strstr(r.body, "stop_token_ids"), "%s", r.body);
    response_dispose(&r);

    char *all[] = {plain, eos, ign, min_s, min, one, stop_id, three, late, cut, kept};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
}

/* The SSE events of a streamed response body, each parsed (the [DONE] left out); caller decrefs
 * the array. */
static json_t *stream_events(const char *path, const char *body)
{
    struct response r = roundtrip("POST", path, body);
    cr_assert_eq(r.status, 200, "body: %s", r.body);
    json_t *all = json_array();
    for (char *ev = r.body; ev && *ev;) {
        char *end = strstr(ev, "\n\n");
        cr_assert_not_null(end);
        *end = '\0';
        if (strcmp(ev, "data: [DONE]") != 0)
            json_array_append_new(all, parse_json(ev + 6));
        ev = end + 2;
    }
    response_dispose(&r);
    return all;
}

Test(integration, logprobs_cover_every_token_alike_when_streamed_or_not)
{
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":20,\"temperature\":0,"
                       "\"logprobs\":3";
    char whole[256], streamed[256];
    snprintf(whole, sizeof whole, "%s}", body);
    snprintf(streamed, sizeof streamed, "%s,\"stream\":true}", body);
    struct response r = roundtrip("POST", "/v1/completions", whole);
    cr_assert_eq(r.status, 200, "body: %s", r.body);
    json_t *j = parse_json(r.body);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *lp = json_object_get(ch, "logprobs");
    json_t *tokens = json_object_get(lp, "tokens");
    json_int_t n =
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    cr_assert_eq((json_int_t)json_array_size(tokens), n, "one entry per generated token");
    json_t *tlp = json_object_get(lp, "token_logprobs"), *top = json_object_get(lp, "top_logprobs");
    json_t *off = json_object_get(lp, "text_offset");
    bool all_text = true;
    for (size_t i = 0; i < json_array_size(tokens); i++) {
        const char *t = json_string_value(json_array_get(tokens, i));
        double l = json_number_value(json_array_get(tlp, i));
        cr_assert_leq(l, 0.0);
        json_t *alts = json_array_get(top, i);
        cr_assert_leq(json_object_size(alts), 3);
        /* Greedy: the token is the likeliest, so it heads its own alternatives. */
        double best = -1e30;
        const char *k;
        json_t *v;
        json_object_foreach(alts, k, v) best =
            json_number_value(v) > best ? json_number_value(v) : best;
        cr_assert_float_eq(l, best, 1e-6, "token %zu ('%s'): %g, best alternative %g", i, t, l,
                           best);
        if (i > 0)
            cr_assert_geq(json_integer_value(json_array_get(off, i)),
                          json_integer_value(json_array_get(off, i - 1)));
        all_text &= strncmp(t, "bytes:", 6) != 0;
    }
    if (all_text) {
        char joined[1024] = "";
        for (size_t i = 0; i < json_array_size(tokens); i++)
            strncat(joined, json_string_value(json_array_get(tokens, i)),
                    sizeof joined - strlen(joined) - 1);
        cr_assert_str_eq(joined, json_string_value(json_object_get(ch, "text")));
    }

    /* Streamed: the same tokens, in order, spread over the chunks, offsets running on. */
    json_t *events = stream_events("/v1/completions", streamed);
    size_t at = 0;
    for (size_t e = 0; e < json_array_size(events); e++) {
        json_t *c = json_array_get(json_object_get(json_array_get(events, e), "choices"), 0);
        json_t *l = json_object_get(c, "logprobs");
        if (!json_is_object(l))
            continue;
        json_t *ts = json_object_get(l, "tokens"), *os = json_object_get(l, "text_offset");
        for (size_t i = 0; i < json_array_size(ts); i++, at++) {
            cr_assert_lt(at, json_array_size(tokens), "more streamed entries than tokens");
            cr_assert_str_eq(json_string_value(json_array_get(ts, i)),
                             json_string_value(json_array_get(tokens, at)));
            cr_assert_eq(json_integer_value(json_array_get(os, i)),
                         json_integer_value(json_array_get(off, at)));
        }
    }
    cr_assert_eq(at, json_array_size(tokens), "streamed %zu entries of %zu", at,
                 json_array_size(tokens));
    json_decref(events);
    json_decref(j);
    response_dispose(&r);
}

Test(integration, chat_logprobs_list_each_token_with_its_bytes_when_asked)
{
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],"
                       "\"max_tokens\":12,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2}";
    struct response r = roundtrip("POST", "/v1/chat/completions", body);
    cr_assert_eq(r.status, 200, "body: %s", r.body);
    json_t *j = parse_json(r.body);
    json_t *content = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    json_int_t n =
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
    cr_assert_eq((json_int_t)json_array_size(content), n);
    for (size_t i = 0; i < json_array_size(content); i++) {
        json_t *c = json_array_get(content, i);
        cr_assert(json_is_string(json_object_get(c, "token")));
        cr_assert(json_is_array(json_object_get(c, "bytes")));
        json_t *alts = json_object_get(c, "top_logprobs");
        cr_assert_eq(json_array_size(alts), 2);
        cr_assert_float_eq(json_number_value(json_object_get(c, "logprob")),
                           json_number_value(json_object_get(json_array_get(alts, 0), "logprob")),
                           1e-6, "greedy: the token is the likeliest");
    }
    json_decref(j);
    response_dispose(&r);
    /* Without logprobs: null, as OpenAI writes it. */
    r = roundtrip("POST", "/v1/chat/completions",
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":2}");
    j = parse_json(r.body);
    cr_assert(json_is_null(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs")));
    json_decref(j);
    response_dispose(&r);
}

/* Event e's choice of a streamed completion of n choices (NULL for the usage chunk), its text
 * appended to text[its index]. */
static json_t *stream_choice(json_t *events, size_t e, int n, char text[][256])
{
    json_t *c = json_array_get(json_object_get(json_array_get(events, e), "choices"), 0);
    if (!c)
        return NULL;
    json_int_t k = json_integer_value(json_object_get(c, "index"));
    cr_assert(k >= 0 && k < n, "index %lld of %d", (long long)k, n);
    strncat(text[k], json_string_value(json_object_get(c, "text")),
            sizeof text[k] - strlen(text[k]) - 1);
    return c;
}

/* n choices of a completion: with echo each starts with the prompt (greedy: all alike); sampled
 * with a seed, each choice's text and log probabilities are the same streamed (chunks by index)
 * as not, and the usage sums the choices. */
Test(integration, completions_answer_n_choices_alike_streamed_or_not)
{
    char *plain =
        complete("{\"prompt\":\"Once upon\",\"max_tokens\":6,\"temperature\":0}", 6, NULL);
    char want[512];
    snprintf(want, sizeof want, "Once upon%s", plain);
    struct response r = roundtrip("POST", "/v1/completions",
                                  "{\"prompt\":\"Once upon\",\"max_tokens\":6,\"temperature\":0,"
                                  "\"echo\":true,\"n\":2}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = parse_json(r.body);
    json_t *chs = json_object_get(j, "choices");
    cr_assert_eq(json_array_size(chs), 2, "%s", r.body);
    for (size_t i = 0; i < 2; i++) {
        json_t *c = json_array_get(chs, i);
        cr_assert_eq(json_integer_value(json_object_get(c, "index")), (json_int_t)i);
        cr_assert_str_eq(json_string_value(json_object_get(c, "text")), want);
    }
    json_decref(j);
    response_dispose(&r);
    free(plain);

    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":9,\"temperature\":1,"
                       "\"seed\":11,\"logprobs\":2,\"ignore_eos\":true,\"n\":3";
    char whole[256], streamed[256];
    snprintf(whole, sizeof whole, "%s}", body);
    snprintf(streamed, sizeof streamed, "%s,\"stream\":true}", body);
    r = roundtrip("POST", "/v1/completions", whole);
    cr_assert_eq(r.status, 200, "%s", r.body);
    j = parse_json(r.body);
    chs = json_object_get(j, "choices");
    cr_assert_eq(json_array_size(chs), 3);
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 27);
    char text[3][256] = {{0}};
    json_t *events = stream_events("/v1/completions", streamed);
    size_t at[3] = {0};
    for (size_t e = 0; e < json_array_size(events); e++) {
        json_t *c = stream_choice(events, e, 3, text);
        if (!c)
            continue;
        json_int_t k = json_integer_value(json_object_get(c, "index"));
        json_t *l = json_object_get(c, "logprobs");
        json_t *want_tokens =
            json_object_get(json_object_get(json_array_get(chs, (size_t)k), "logprobs"), "tokens");
        for (size_t i = 0; json_is_object(l) && i < json_array_size(json_object_get(l, "tokens"));
             i++, at[k]++)
            cr_assert_str_eq(json_string_value(json_array_get(json_object_get(l, "tokens"), i)),
                             json_string_value(json_array_get(want_tokens, at[k])),
                             "choice %lld token %zu", (long long)k, at[k]);
    }
    for (size_t i = 0; i < 3; i++) {
        json_t *c = json_array_get(chs, i);
        cr_assert_str_eq(text[i], json_string_value(json_object_get(c, "text")), "choice %zu", i);
        cr_assert_eq(at[i], 9, "choice %zu: %zu streamed log probabilities", i, at[i]);
        cr_assert_eq(json_array_size(json_object_get(json_object_get(c, "logprobs"), "tokens")), 9);
    }
    json_decref(events);
    json_decref(j);
    response_dispose(&r);
}

/* choices[] of a completion response body, checked for count and order; caller decrefs j. */
static json_t *choices_of(const struct response *r, size_t n, json_t **j)
{
    cr_assert_eq(r->status, 200, "%s", r->body);
    *j = parse_json(r->body);
    json_t *chs = json_object_get(*j, "choices");
    cr_assert_eq(json_array_size(chs), n, "%s", r->body);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(chs, i), "index")),
                     (json_int_t)i);
    return chs;
}

static const char *choice_text(json_t *chs, size_t i)
{
    return json_string_value(json_object_get(json_array_get(chs, i), "text"));
}

/* An array of prompts: prompt p's choice j is choices[p · n + j], the answer that prompt gets
 * alone with the same seed; the usage counts every prompt once and every choice's tokens; with
 * echo each choice starts with its own prompt; streamed alike; a prompt too long for the
 * context is refused whatever its place. */
Test(integration, completions_answer_every_prompt_of_an_array_in_order)
{
    const char *tail = "\"max_tokens\":5,\"temperature\":1,\"seed\":21,\"ignore_eos\":true";
    char body[512];
    json_t *one[3], *all;
    const char *prompts[3] = {"\"Once upon\"", "[1, 300, 301, 302]", "\"The cat\""};
    long long prompt_tokens = 0;
    for (int p = 0; p < 3; p++) {
        snprintf(body, sizeof body, "{\"prompt\":%s,\"n\":2,%s}", prompts[p], tail);
        struct response r = roundtrip("POST", "/v1/completions", body);
        choices_of(&r, 2, &one[p]);
        prompt_tokens +=
            json_integer_value(json_object_get(json_object_get(one[p], "usage"), "prompt_tokens"));
        response_dispose(&r);
    }
    snprintf(body, sizeof body, "{\"prompt\":[%s,%s,%s],\"n\":2,%s}", prompts[0], prompts[1],
             prompts[2], tail);
    struct response r = roundtrip("POST", "/v1/completions", body);
    json_t *chs = choices_of(&r, 6, &all);
    json_t *usage = json_object_get(all, "usage");
    cr_assert_eq(json_integer_value(json_object_get(usage, "prompt_tokens")), prompt_tokens);
    cr_assert_eq(json_integer_value(json_object_get(usage, "completion_tokens")), 6 * 5);
    for (int p = 0; p < 3; p++)
        for (int j = 0; j < 2; j++)
            cr_assert_str_eq(choice_text(chs, (size_t)(p * 2 + j)),
                             choice_text(json_object_get(one[p], "choices"), (size_t)j),
                             "prompt %d choice %d", p, j);
    /* Streamed: the same text under each index. */
    snprintf(body, sizeof body, "{\"prompt\":[%s,%s,%s],\"n\":2,%s,\"stream\":true}", prompts[0],
             prompts[1], prompts[2], tail);
    json_t *events = stream_events("/v1/completions", body);
    char text[6][256] = {{0}};
    for (size_t e = 0; e < json_array_size(events); e++)
        stream_choice(events, e, 6, text);
    for (size_t i = 0; i < 6; i++)
        cr_assert_str_eq(text[i], choice_text(chs, i), "streamed choice %zu", i);
    json_decref(events);
    response_dispose(&r);
    json_decref(all);
    for (int p = 0; p < 3; p++)
        json_decref(one[p]);

    /* echo: each choice after its own prompt's text. */
    r = roundtrip("POST", "/v1/completions",
                  "{\"prompt\":[\"Once upon\",\"The cat\"],\"max_tokens\":3,\"temperature\":0,"
                  "\"echo\":true}");
    chs = choices_of(&r, 2, &all);
    cr_assert_eq(strncmp(choice_text(chs, 0), "Once upon", 9), 0, "%s", choice_text(chs, 0));
    cr_assert_eq(strncmp(choice_text(chs, 1), "The cat", 7), 0, "%s", choice_text(chs, 1));
    json_decref(all);
    response_dispose(&r);

    /* The context is checked for each prompt (tiny's is 512 positions: 2 + 505 fit, the second
     * prompt's 10 + 505 do not). */
    r = roundtrip("POST", "/v1/completions",
                  "{\"prompt\":[[1,2],[1,2,3,4,5,6,7,8,9,10]],\"max_tokens\":505}");
    assert_error_object(&r, 400, "invalid_request_error");
    cr_assert(strstr(r.body, "context_length_exceeded"), "%s", r.body);
    response_dispose(&r);
}

/* The "usage.prompt_tokens" of a response body. */
static json_int_t prompt_tokens_of(const char *path, const char *body)
{
    struct response r = roundtrip("POST", path, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = parse_json(r.body);
    json_int_t n =
        json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    response_dispose(&r);
    return n;
}

/* A prompt of 2-, 3- and 4-byte characters ("é" is a piece of the synthetic vocabulary; the
 * others fall back to byte tokens) survives byte for byte: its ids, as many as the request
 * counts, go back to its exact text through /detokenize and through a request's own
 * detokenizer (echo of a prompt of ids); echo gives a text prompt back as sent, streamed or
 * not; and what a sampled completion makes of it is valid JSON (jansson refuses bad UTF-8). */
Test(integration, utf8_prompt_round_trips_byte_for_byte_when_multibyte)
{
    static const char text[] = "caf\xc3\xa9 \xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87";
    static const char escaped[] = "caf\\u00e9 \\ud83d\\ude00 \\u4e2d\\u6587";
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", escaped);
    struct response r = roundtrip("POST", "/tokenize", body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = parse_json(r.body);
    json_t *ids = json_object_get(j, "tokens");
    json_int_t count = json_integer_value(json_object_get(j, "count"));
    cr_assert_gt(count, 4, "the emoji and the CJK characters are byte tokens: %s", r.body);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":1}", escaped);
    cr_assert_eq(prompt_tokens_of("/v1/completions", body), count);
    char *dumped = json_dumps(ids, JSON_COMPACT);
    json_decref(j);
    response_dispose(&r);
    snprintf(body, sizeof body, "{\"tokens\":%s}", dumped);
    r = roundtrip("POST", "/detokenize", body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    j = parse_json(r.body);
    cr_assert_str_eq(json_string_value(json_object_get(j, "prompt")), text);
    json_decref(j);
    response_dispose(&r);

    /* Echo, the same greedy completion after the prompt each way. */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":4,\"temperature\":0}", escaped);
    char *plain = complete(body, 4, NULL);
    char want[256];
    snprintf(want, sizeof want, "%s%s", text, plain);
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":4,\"temperature\":0,\"echo\":true}",
             dumped);
    char *from_ids = complete(body, 4, NULL);
    cr_assert_str_eq(from_ids, want, "a prompt of ids, echoed through the detokenizer");
    snprintf(body, sizeof body,
             "{\"prompt\":\"%s\",\"max_tokens\":4,\"temperature\":0,\"echo\":true}", escaped);
    char *from_text = complete(body, 4, NULL);
    cr_assert_str_eq(from_text, want, "a text prompt, echoed as sent");
    snprintf(body, sizeof body,
             "{\"prompt\":\"%s\",\"max_tokens\":4,\"temperature\":0,\"echo\":true,"
             "\"stream\":true}",
             escaped);
    char *streamed = stream(body, NULL);
    cr_assert_str_eq(streamed, want, "a text prompt, echoed as sent in the stream");
    free(dumped);
    free(plain);
    free(from_ids);
    free(from_text);
    free(streamed);

    snprintf(body, sizeof body,
             "{\"prompt\":\"%s\",\"max_tokens\":20,\"temperature\":1.0,\"seed\":5}", escaped);
    free(complete(body, 20, NULL)); /* parse_json proved the body is valid JSON */
}

/* vLLM's /tokenize and /detokenize: the ids a completion or chat sees (as many as its usage
 * counts), BOS as add_special_tokens says, back to the prompt's text; the context in
 * max_model_len, as in the model card; bad ids named. */
Test(integration, tokenize_gives_the_ids_a_request_sees_and_detokenize_the_text_back)
{
    const char *text = "Once upon a time, there was a girl.";
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\"}", text);
    struct response r = roundtrip("POST", "/tokenize", body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = parse_json(r.body);
    json_t *ids = json_object_get(j, "tokens");
    json_int_t count = json_integer_value(json_object_get(j, "count"));
    cr_assert_eq((json_int_t)json_array_size(ids), count);
    cr_assert_eq(json_integer_value(json_object_get(j, "max_model_len")), 512);
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":1}", text);
    cr_assert_eq(prompt_tokens_of("/v1/completions", body), count);
    /* Without BOS: the same ids after the first. */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"add_special_tokens\":false}", text);
    struct response r2 = roundtrip("POST", "/tokenize", body);
    json_t *j2 = parse_json(r2.body);
    json_t *ids2 = json_object_get(j2, "tokens");
    cr_assert_eq(json_array_size(ids2) + 1, json_array_size(ids));
    for (size_t i = 0; i < json_array_size(ids2); i++)
        cr_assert_eq(json_integer_value(json_array_get(ids2, i)),
                     json_integer_value(json_array_get(ids, i + 1)));
    json_decref(j2);
    response_dispose(&r2);
    /* And back. */
    char *dumped = json_dumps(ids, JSON_COMPACT);
    snprintf(body, sizeof body, "{\"tokens\":%s}", dumped);
    free(dumped);
    r2 = roundtrip("POST", "/detokenize", body);
    cr_assert_eq(r2.status, 200, "%s", r2.body);
    j2 = parse_json(r2.body);
    cr_assert_str_eq(json_string_value(json_object_get(j2, "prompt")), text);
    json_decref(j2);
    response_dispose(&r2);
    json_decref(j);
    response_dispose(&r);

    /* Messages: what a chat completion counts. */
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}]";
    snprintf(body, sizeof body, "{%s}", msgs);
    r = roundtrip("POST", "/tokenize", body);
    j = parse_json(r.body);
    snprintf(body, sizeof body, "{%s,\"max_tokens\":1}", msgs);
    cr_assert_eq(json_integer_value(json_object_get(j, "count")),
                 prompt_tokens_of("/v1/chat/completions", body));
    json_decref(j);
    response_dispose(&r);

    r = roundtrip("POST", "/detokenize", "{\"tokens\":[1,512]}");
    assert_error_object(&r, 400, "invalid_request_error");
    cr_assert(strstr(r.body, "\"param\":\"tokens[1]\""), "%s", r.body);
    response_dispose(&r);
    r = roundtrip("POST", "/tokenize", "{\"prompt\":[1,2]}");
    assert_error_object(&r, 400, "invalid_request_error");
    response_dispose(&r);
    r = roundtrip("GET", "/tokenize", NULL);
    cr_assert_eq(r.status, 405);
    response_dispose(&r);
    r = roundtrip("GET", "/v1/models", NULL);
    cr_assert(strstr(r.body, "\"max_model_len\":512"), "%s", r.body);
    response_dispose(&r);
}

/* skip_special_tokens: false. A bias of 100 makes </s> (id 2) the greedy choice and ignore_eos
 * lets it repeat: by default it adds no text; kept, each adds the vocabulary's text for it. */
Test(integration, control_tokens_add_their_text_when_skip_special_tokens_is_false)
{
    const char *base =
        "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0,\"ignore_eos\":true,"
        "\"logit_bias\":{\"2\":100}";
    char body[256];
    snprintf(body, sizeof body, "%s}", base);
    char *plain = complete(body, 3, NULL);
    cr_assert_str_eq(plain, "");
    snprintf(body, sizeof body, "%s,\"skip_special_tokens\":false}", base);
    char *kept = complete(body, 3, NULL);
    size_t n = strlen(kept);
    cr_assert(n > 0 && n % 3 == 0, "\"%s\"", kept);
    cr_assert(memcmp(kept, kept + n / 3, n / 3) == 0 && memcmp(kept, kept + 2 * n / 3, n / 3) == 0,
              "three times the same text: \"%s\"", kept);
    cr_assert(strstr(kept, "</s>"), "\"%s\"", kept);
    free(plain);
    free(kept);
}
