/* /v1/chat/completions on the real server: the chat.completion object, streams checked chunk by
 * chunk against OpenAI's order (role first, finish_reason last, the usage chunk, [DONE]), the
 * same text streamed or not, limits and errors; and the completions stream against the same
 * rules. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "../models.h"
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

TestSuite(chat, .init = start_default, .fini = stop, .timeout = 300);

static json_t *parse_json(const char *s)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, s);
    return j;
}

static struct response post(int port, const char *path, const char *body)
{
    int fd = client_connect(port);
    client_request(fd, "POST", path, body, false);
    struct response r;
    cr_assert(client_read_response(fd, &r), "no response to POST %s", path);
    close(fd);
    return r;
}

static const char *str(json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);
    cr_assert(json_is_string(v), "\"%s\" is not a string", key);
    return json_string_value(v);
}

/* What a chat answer said, streamed or not. */
struct answer {
    char *content;
    char finish[16];
    long long prompt_tokens, completion_tokens;
    int content_chunks;
};

static void answer_dispose(struct answer *a)
{
    free(a->content);
}

/* usage: {prompt_tokens, completion_tokens, total_tokens} with a consistent total. */
static void read_usage(json_t *u, struct answer *a)
{
    cr_assert(json_is_object(u), "usage is an object");
    a->prompt_tokens = json_integer_value(json_object_get(u, "prompt_tokens"));
    a->completion_tokens = json_integer_value(json_object_get(u, "completion_tokens"));
    cr_assert_gt(a->prompt_tokens, 0);
    cr_assert_eq(json_integer_value(json_object_get(u, "total_tokens")),
                 a->prompt_tokens + a->completion_tokens);
}

/* A non-streaming chat answer of n choices: out[i] gets choice i (its index i), out[0] also the
 * usage (completion_tokens summed over the choices). */
static void chat_n(int port, const char *body, int n, struct answer *out)
{
    struct response r = post(port, "/v1/chat/completions", body);
    cr_assert_eq(r.status, 200, "body: %s", r.body);
    cr_assert(strstr(response_header(&r, "content-type"), "application/json"));
    json_t *j = parse_json(r.body);
    cr_assert_str_eq(str(j, "object"), "chat.completion");
    cr_assert_eq(strncmp(str(j, "id"), "chatcmpl-", 9), 0, "id %s", str(j, "id"));
    cr_assert(json_is_integer(json_object_get(j, "created")));
    cr_assert_str_eq(str(j, "model"), "synthetic:tiny");
    json_t *choices = json_object_get(j, "choices");
    cr_assert_eq(json_array_size(choices), (size_t)n, "%s", r.body);
    for (int i = 0; i < n; i++) {
        json_t *c = json_array_get(choices, (size_t)i);
        cr_assert_eq(json_integer_value(json_object_get(c, "index")), i);
        json_t *msg = json_object_get(c, "message");
        cr_assert_str_eq(str(msg, "role"), "assistant");
        out[i] = (struct answer){.content = strdup(str(msg, "content"))};
        snprintf(out[i].finish, sizeof out[i].finish, "%s", str(c, "finish_reason"));
        cr_assert(strcmp(out[i].finish, "stop") == 0 || strcmp(out[i].finish, "length") == 0, "%s",
                  out[i].finish);
    }
    read_usage(json_object_get(j, "usage"), &out[0]);
    json_decref(j);
    response_dispose(&r);
}

static struct answer chat_on(int port, const char *body)
{
    struct answer a;
    chat_n(port, body, 1, &a);
    return a;
}

static struct answer chat(const char *body)
{
    return chat_on(srv.port, body);
}

/* Streams a chat completion of n choices and checks every event against OpenAI's stream: each
 * chunk a chat.completion.chunk with the same id, created and model and one choice, its index
 * below n; each choice's first delta carries the role and no other does; content chunks have a
 * null finish_reason; each choice's last chunk has its finish_reason and an empty delta; with
 * include_usage every other chunk has "usage": null and a last chunk has empty choices and the
 * usage (completion_tokens summed over the choices); then data: [DONE], then nothing. out[i]
 * gets choice i's text and finish; out[0] the usage. */
static void chat_stream_n(int port, const char *body, bool include_usage, int n, struct answer *out)
{
    struct response r = post(port, "/v1/chat/completions", body);
    cr_assert_eq(r.status, 200, "body: %s", r.body);
    cr_assert(strstr(response_header(&r, "content-type"), "text/event-stream"));
    size_t len[8] = {0};
    int seen[8] = {0}; /* chunks of each choice so far */
    bool finished[8] = {0};
    cr_assert_leq(n, 8);
    for (int i = 0; i < n; i++)
        out[i] = (struct answer){.content = calloc(1, 1)};
    char id[64] = "", model[64] = "";
    json_int_t created = -1;
    int chunks = 0, n_finished = 0;
    bool usage_seen = false, done = false;
    for (char *ev = r.body; *ev;) {
        char *end = strstr(ev, "\n\n");
        cr_assert_not_null(end, "event not terminated by a blank line: %s", ev);
        *end = '\0';
        cr_assert_eq(strncmp(ev, "data: ", 6), 0, "event: %s", ev);
        cr_assert(!done, "nothing after [DONE]: %s", ev);
        const char *data = ev + 6;
        ev = end + 2;
        if (strcmp(data, "[DONE]") == 0) {
            done = true;
            continue;
        }
        json_t *j = parse_json(data);
        cr_assert_null(json_object_get(j, "error"), "error mid-stream: %s", data);
        cr_assert_str_eq(str(j, "object"), "chat.completion.chunk");
        if (chunks++ == 0) {
            snprintf(id, sizeof id, "%s", str(j, "id"));
            snprintf(model, sizeof model, "%s", str(j, "model"));
            created = json_integer_value(json_object_get(j, "created"));
            cr_assert_eq(strncmp(id, "chatcmpl-", 9), 0, "%s", id);
        }
        cr_assert_str_eq(str(j, "id"), id, "every chunk has the same id");
        cr_assert_str_eq(str(j, "model"), model, "every chunk has the same model");
        cr_assert_eq(json_integer_value(json_object_get(j, "created")), created,
                     "every chunk has the same created");
        cr_assert(!usage_seen, "the usage chunk is the last one: %s", data);
        json_t *choices = json_object_get(j, "choices");
        cr_assert(json_is_array(choices), "%s", data);
        json_t *usage = json_object_get(j, "usage");
        if (json_array_size(choices) == 0) {
            cr_assert(include_usage, "a chunk without choices only with include_usage: %s", data);
            cr_assert_eq(n_finished, n, "usage comes after every finish_reason");
            read_usage(usage, &out[0]);
            usage_seen = true;
            json_decref(j);
            continue;
        }
        cr_assert_eq(json_array_size(choices), 1);
        if (include_usage)
            cr_assert(usage && json_is_null(usage), "usage: null in every other chunk");
        else
            cr_assert_null(usage, "no usage member without include_usage: %s", data);
        json_t *c = json_array_get(choices, 0);
        json_int_t k = json_integer_value(json_object_get(c, "index"));
        cr_assert(k >= 0 && k < n, "index %lld of %d choices: %s", (long long)k, n, data);
        struct answer *a = &out[k];
        cr_assert(!finished[k], "no chunk of a choice after its finish_reason: %s", data);
        json_t *d = json_object_get(c, "delta");
        cr_assert(json_is_object(d), "%s", data);
        json_t *role = json_object_get(d, "role");
        if (seen[k] == 0)
            cr_assert(json_is_string(role) && strcmp(json_string_value(role), "assistant") == 0,
                      "each choice's first delta has the role: %s", data);
        else
            cr_assert_null(role, "only the first delta has the role: %s", data);
        json_t *f = json_object_get(c, "finish_reason");
        if (json_is_string(f)) {
            snprintf(a->finish, sizeof a->finish, "%s", json_string_value(f));
            cr_assert_eq(json_object_size(d), 0, "the finishing delta is empty: %s", data);
            finished[k] = true;
            n_finished++;
        } else {
            cr_assert(json_is_null(f), "finish_reason is null before the end: %s", data);
            json_t *t = json_object_get(d, "content");
            cr_assert(json_is_string(t), "content in every delta before the end: %s", data);
            size_t tl = json_string_length(t);
            a->content = realloc(a->content, len[k] + tl + 1);
            memcpy(a->content + len[k], json_string_value(t), tl + 1);
            len[k] += tl;
            if (seen[k] > 0)
                a->content_chunks++;
        }
        seen[k]++;
        json_decref(j);
    }
    cr_assert(done, "the stream ends with data: [DONE]");
    cr_assert_eq(n_finished, n, "a chunk carries each choice's finish_reason");
    cr_assert_eq(usage_seen, include_usage, "a usage chunk exactly when include_usage is set");
    response_dispose(&r);
}

static struct answer chat_stream(const char *body, bool include_usage)
{
    struct answer a;
    chat_stream_n(srv.port, body, include_usage, 1, &a);
    return a;
}

#define MESSAGES                                                                                   \
    "\"messages\":[{\"role\":\"system\",\"content\":\"You tell short stories.\"},"                 \
    "{\"role\":\"user\",\"content\":\"Once upon a time\"}]"

Test(chat, returns_a_chat_completion_when_not_streaming)
{
    struct answer a = chat("{" MESSAGES ",\"max_completion_tokens\":8,\"temperature\":0}");
    if (strcmp(a.finish, "length") == 0)
        cr_assert_eq(a.completion_tokens, 8);
    cr_assert_leq(a.completion_tokens, 8);
    answer_dispose(&a);
}

Test(chat, streams_chunks_in_openai_order_when_include_usage_is_set)
{
    struct answer a = chat_stream("{" MESSAGES ",\"max_completion_tokens\":12,\"seed\":5,"
                                  "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                                  true);
    cr_assert_leq(a.completion_tokens, 12);
    cr_assert_gt(a.content_chunks, 0, "text arrives in chunks");
    cr_assert_leq(a.content_chunks, a.completion_tokens, "at most one chunk per token");
    answer_dispose(&a);
}

Test(chat, streams_without_usage_when_include_usage_is_not_set)
{
    struct answer a =
        chat_stream("{" MESSAGES ",\"max_tokens\":4,\"seed\":5,\"stream\":true}", false);
    cr_assert_str_eq(a.finish, "length");
    answer_dispose(&a);
}

Test(chat, streamed_text_equals_non_streamed_text_when_the_seed_is_the_same)
{
    const char *req = "{" MESSAGES ",\"max_completion_tokens\":24,\"temperature\":0.9,"
                      "\"top_p\":0.95,\"seed\":1234%s}";
    char body[1024];
    snprintf(body, sizeof body, req, "");
    struct answer a = chat(body);
    snprintf(body, sizeof body, req,
             ",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    struct answer b = chat_stream(body, true);
    cr_assert_str_eq(a.content, b.content);
    cr_assert_str_eq(a.finish, b.finish);
    cr_assert_eq(a.prompt_tokens, b.prompt_tokens);
    cr_assert_eq(a.completion_tokens, b.completion_tokens);
    answer_dispose(&a);
    answer_dispose(&b);
}

Test(chat, stops_at_max_completion_tokens_when_both_limits_are_given)
{
    /* The synthetic model's noise rarely samples a stop token; with greedy decoding and no stop
     * string it runs to the limit, which must be max_completion_tokens, not max_tokens. */
    struct answer a = chat("{" MESSAGES ",\"max_tokens\":40,\"max_completion_tokens\":3,"
                           "\"temperature\":0}");
    cr_assert_leq(a.completion_tokens, 3);
    if (strcmp(a.finish, "length") == 0)
        cr_assert_eq(a.completion_tokens, 3);
    answer_dispose(&a);
    a = chat("{" MESSAGES ",\"max_tokens\":2,\"temperature\":0}");
    cr_assert_leq(a.completion_tokens, 2);
    answer_dispose(&a);
}

static void expect_400(const char *body, const char *param)
{
    struct response r = post(srv.port, "/v1/chat/completions", body);
    cr_assert_eq(r.status, 400, "status %d: %s", r.status, r.body);
    json_t *j = parse_json(r.body);
    json_t *e = json_object_get(j, "error");
    cr_assert(json_is_object(e), "%s", r.body);
    cr_assert_str_eq(str(e, "type"), "invalid_request_error");
    cr_assert_str_eq(str(e, "param"), param);
    cr_assert_gt(strlen(str(e, "message")), 0);
    json_decref(j);
    response_dispose(&r);
}

/* n choices: each its own sample (choice i seeded with seed + i, so choice 0 is the n = 1
 * answer and the same request gives the same n answers), the usage their sum, streamed the
 * same as not. */
Test(chat, answers_n_choices_when_n_is_above_one)
{
    const char *req = "{" MESSAGES ",\"max_tokens\":12,\"temperature\":1,\"seed\":77,"
                      "\"ignore_eos\":true%s}";
    char body[1024];
    struct answer one, a[3], b[3], st[3];
    snprintf(body, sizeof body, req, "");
    one = chat(body);
    snprintf(body, sizeof body, req, ",\"n\":3");
    chat_n(srv.port, body, 3, a);
    chat_n(srv.port, body, 3, b);
    snprintf(body, sizeof body, req,
             ",\"n\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true}");
    chat_stream_n(srv.port, body, true, 3, st);
    cr_assert_str_eq(a[0].content, one.content, "choice 0 is the n = 1 answer");
    cr_assert_eq(a[0].prompt_tokens, one.prompt_tokens, "the prompt counts once");
    cr_assert_eq(a[0].completion_tokens, 3 * 12, "completion_tokens sums the choices");
    cr_assert_eq(st[0].completion_tokens, 3 * 12);
    for (int i = 0; i < 3; i++) {
        cr_assert_str_eq(a[i].finish, "length");
        cr_assert_str_eq(a[i].content, b[i].content, "the same seed, the same choice %d", i);
        cr_assert_str_eq(a[i].content, st[i].content, "streamed as not, choice %d", i);
        cr_assert_str_eq(st[i].finish, "length");
    }
    cr_assert(strcmp(a[0].content, a[1].content) != 0 || strcmp(a[1].content, a[2].content) != 0,
              "sampled choices differ: %s | %s | %s", a[0].content, a[1].content, a[2].content);
    answer_dispose(&one);
    for (int i = 0; i < 3; i++) {
        answer_dispose(&a[i]);
        answer_dispose(&b[i]);
        answer_dispose(&st[i]);
    }
}

Test(chat, names_the_param_with_400_when_messages_are_bad)
{
    expect_400("{\"messages\":[]}", "messages");
    expect_400("{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].role");
    expect_400("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
               "messages[0].content[0].type");
}

Test(chat, answers_405_with_allow_when_the_method_is_get)
{
    int fd = client_connect(srv.port);
    client_request(fd, "GET", "/v1/chat/completions", NULL, false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    close(fd);
    cr_assert_eq(r.status, 405);
    cr_assert(strstr(response_header(&r, "allow"), "POST"));
    response_dispose(&r);
}

Test(chat, serves_chat_and_completions_in_turn_when_one_connection_is_kept_alive)
{
    /* The connection's API kind is per request: a completion after a chat is a text_completion. */
    int fd = client_connect(srv.port);
    client_request(fd, "POST", "/v1/chat/completions", "{" MESSAGES ",\"max_tokens\":2}", true);
    struct response r1, r2;
    cr_assert(client_read_response(fd, &r1));
    client_request(fd, "POST", "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":2}", true);
    cr_assert(client_read_response(fd, &r2));
    close(fd);
    cr_assert_eq(r1.status, 200, "%s", r1.body);
    cr_assert_eq(r2.status, 200, "%s", r2.body);
    json_t *a = parse_json(r1.body), *b = parse_json(r2.body);
    cr_assert_str_eq(str(a, "object"), "chat.completion");
    cr_assert_str_eq(str(b, "object"), "text_completion");
    cr_assert_eq(strncmp(str(b, "id"), "cmpl-", 5), 0);
    json_decref(a);
    json_decref(b);
    response_dispose(&r1);
    response_dispose(&r2);
}

Test(chat, completion_stream_follows_the_same_rules_when_include_usage_is_set)
{
    struct response r = post(srv.port, "/v1/completions",
                             "{\"prompt\":\"Once\",\"max_tokens\":5,\"stream\":true,"
                             "\"stream_options\":{\"include_usage\":true}}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    char id[64] = "";
    json_int_t created = -1;
    int chunks = 0;
    bool finished = false, usage_seen = false, done = false;
    for (char *ev = r.body; *ev;) {
        char *end = strstr(ev, "\n\n");
        cr_assert_not_null(end);
        *end = '\0';
        cr_assert_eq(strncmp(ev, "data: ", 6), 0);
        const char *data = ev + 6;
        ev = end + 2;
        cr_assert(!done, "nothing after [DONE]");
        if (strcmp(data, "[DONE]") == 0) {
            done = true;
            continue;
        }
        json_t *j = parse_json(data);
        cr_assert_str_eq(str(j, "object"), "text_completion");
        if (!id[0]) {
            snprintf(id, sizeof id, "%s", str(j, "id"));
            created = json_integer_value(json_object_get(j, "created"));
        }
        cr_assert_str_eq(str(j, "id"), id);
        cr_assert_eq(json_integer_value(json_object_get(j, "created")), created);
        cr_assert_str_eq(str(j, "model"), "synthetic:tiny");
        cr_assert(!usage_seen, "the usage chunk is the last one");
        json_t *choices = json_object_get(j, "choices");
        if (json_array_size(choices) == 0) {
            cr_assert(finished);
            struct answer a = {0};
            read_usage(json_object_get(j, "usage"), &a);
            cr_assert_leq(a.completion_tokens, 5);
            usage_seen = true;
        } else {
            cr_assert(!finished, "no choice after the finish_reason");
            cr_assert(json_is_null(json_object_get(j, "usage")), "usage: null: %s", data);
            json_t *f = json_object_get(json_array_get(choices, 0), "finish_reason");
            finished = json_is_string(f);
            cr_assert(finished || json_is_null(f));
        }
        chunks++;
        json_decref(j);
    }
    cr_assert(done && finished && usage_seen);
    cr_assert_gt(chunks, 2);
    response_dispose(&r);
}

/* ---- other servers: a configured template, a real model ---- */

static char *write_config(const char *json)
{
    char *path = strdup("/tmp/sluice-chat-config-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    return path;
}

Test(chat, renders_with_the_configured_template_when_chat_template_is_set)
{
    /* The same messages cost a different number of prompt tokens in ChatML than in the plain
     * default: the key reaches the renderer. */
    const char *body = "{" MESSAGES ",\"max_tokens\":1}";
    struct answer plain = chat(body);
    char *cfg = write_config("{\"chat_template\":\"chatml\"}");
    struct server other;
    const char *args[] = {"--config", cfg, NULL};
    server_start(&other, args);
    struct answer chatml = chat_on(other.port, body);
    server_stop(&other);
    unlink(cfg);
    free(cfg);
    cr_assert_neq(plain.prompt_tokens, chatml.prompt_tokens);
    cr_assert_gt(chatml.prompt_tokens, plain.prompt_tokens, "ChatML's markers are longer");
    answer_dispose(&plain);
    answer_dispose(&chatml);
}

Test(chat, serves_a_real_model_with_the_default_template_when_it_has_none)
{
    const char *dir = getenv("SL_MODELS_DIR");
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/stories260K.gguf", dir ? dir : "../shared/models");
    if (stat(path, &st) != 0)
        MODELS_MISSING("%s not found: the real-model chat test needs it", path);
    struct server other;
    const char *args[] = {"--model", path, NULL};
    server_start(&other, args);
    server_wait_log(&other, "has no chat template: chat requests use the default \"plain\"");
    struct response r = post(other.port, "/v1/chat/completions",
                             "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story "
                             "about Lily.\"}],\"max_tokens\":24,\"temperature\":0}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = parse_json(r.body);
    cr_assert_str_eq(str(j, "model"), "stories260K");
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    cr_assert_gt(strlen(str(msg, "content")), 0, "the model says something");
    json_decref(j);
    response_dispose(&r);
    server_stop(&other);
}

Test(chat, generates_to_the_context_when_no_max_tokens_is_given)
{
    /* OpenAI's and vLLM's chat: no max_tokens means up to the model's context (synthetic:tiny's
     * 512 positions), not the completions endpoint's default of 16. ignore_eos keeps the model's
     * stop tokens from ending it first; greedy, so the run is the same every time. */
    struct answer a = chat("{" MESSAGES ",\"temperature\":0,\"ignore_eos\":true}");
    cr_assert_str_eq(a.finish, "length");
    cr_assert_eq(a.prompt_tokens + a.completion_tokens, 512, "prompt %lld + completion %lld",
                 a.prompt_tokens, a.completion_tokens);
    answer_dispose(&a);
    /* Streamed alike. */
    struct answer b = chat_stream("{" MESSAGES ",\"temperature\":0,\"ignore_eos\":true,"
                                  "\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                                  true);
    cr_assert_str_eq(b.finish, "length");
    cr_assert_eq(b.prompt_tokens + b.completion_tokens, 512);
    answer_dispose(&b);
}

Test(chat, generates_the_configured_default_when_default_max_tokens_chat_is_set)
{
    char *cfg = write_config("{\"default_max_tokens_chat\":5,\"default_max_tokens\":7}");
    struct server other;
    const char *args[] = {"--config", cfg, NULL};
    server_start(&other, args);
    struct answer a = chat_on(other.port, "{" MESSAGES ",\"temperature\":0,\"ignore_eos\":true}");
    cr_assert_str_eq(a.finish, "length");
    cr_assert_eq(a.completion_tokens, 5);
    answer_dispose(&a);
    /* A request's own limit still wins. */
    a = chat_on(other.port, "{" MESSAGES ",\"max_tokens\":3,\"ignore_eos\":true}");
    cr_assert_eq(a.completion_tokens, 3);
    answer_dispose(&a);
    /* The completions endpoint keeps its own default. */
    struct response r = post(other.port, "/v1/completions",
                             "{\"prompt\":\"Once upon a time\",\"ignore_eos\":true}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = parse_json(r.body);
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 7);
    json_decref(j);
    response_dispose(&r);
    server_stop(&other);
    unlink(cfg);
    free(cfg);
}
