/* Anthropic's Messages API codec (gateway/api/anthropic.c) and the route table: requests decoded
 * into the completion a chat is, errors named by field, and the objects and events written as
 * Anthropic's API reference spells them. The SDK test (tests/sdk/anthropic.mjs) drives the same
 * code over HTTP. */
#include "api_impl.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

static int decode(struct sl_openai_completion *c, const char *body, struct sl_openai_error *err)
{
    return sl_anthropic_messages_decode(c, body, strlen(body), err);
}

Test(gateway, anthropic_decodes_system_and_turns_as_chat_messages_when_valid)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":64,\"system\":\"Be brief.\",\"messages\":["
        "{\"role\":\"user\",\"content\":\"Hi\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Hello\"},"
        "{\"type\":\"text\",\"text\":\"there\"}]},"
        "{\"role\":\"user\",\"content\":\"Tell me\"}],"
        "\"stop_sequences\":[\"END\",\"\\n\\n\"],\"temperature\":0.5,\"top_p\":0.9,\"top_k\":7,"
        "\"stream\":true,\"metadata\":{\"user_id\":\"u-1\"}}";
    cr_assert_eq(decode(&c, body, &err), SL_OK, "%s", err.message);
    cr_assert_str_eq(c.model, "m");
    cr_assert_eq(c.params.max_tokens, 64);
    cr_assert_eq(c.n_messages, 4, "the system prompt leads");
    cr_assert_eq(c.messages[0].role, SL_CHAT_ROLE_SYSTEM);
    cr_assert_str_eq(c.messages[0].content, "Be brief.");
    cr_assert_eq(c.messages[2].role, SL_CHAT_ROLE_ASSISTANT);
    cr_assert_str_eq(c.messages[2].content, "Hello\nthere", "text blocks are joined");
    cr_assert_eq(c.params.n_stop, 2);
    cr_assert_str_eq(c.params.stop[0], "END");
    cr_assert_float_eq(c.params.temperature, 0.5f, 1e-6);
    cr_assert_float_eq(c.params.top_p, 0.9f, 1e-6);
    cr_assert_eq(c.params.top_k, 7);
    cr_assert(c.stream);
    cr_assert_str_eq(c.user, "u-1");
    cr_assert_eq(c.n, 1);
    sl_openai_completion_dispose(&c);
}

Test(gateway, anthropic_refuses_with_the_field_named_when_a_request_is_wrong)
{
    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens"},
        {"{\"model\":\"m\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         "max_tokens"},
        {"{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "model"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[]}", "messages"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]"
         "}",
         "messages.0.role"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{"
         "\"type\":\"image\",\"source\":{}}]}]}",
         "messages.0.content.0.type"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"temperature\":1.5,\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         "temperature"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"stop_sequences\":[\"a\",\"b\",\"c\",\"d\",\"e\"],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         "stop_sequences"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"tools\":[{\"name\":\"t\"}],\"messages\":[{\"role\":"
         "\"user\",\"content\":\"x\"}]}",
         "tools"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"thinking\":{},\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         ""},
        {"[1]", "body"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sl_openai_completion c;
        struct sl_openai_error err;
        cr_assert_neq(decode(&c, cases[i].body, &err), SL_OK, "%s", cases[i].body);
        cr_assert_eq(err.http, 400, "%s", cases[i].body);
        cr_assert_str_eq(err.param, cases[i].param, "%s: %s", cases[i].body, err.message);
        cr_assert_null(c.root, "nothing is kept of a refused body");
    }
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"model\":", &err), SL_EFORMAT);
    cr_assert(strstr(err.message, "line 1"), "%s", err.message);
}

/* out as JSON, checked to parse. */
static json_t *parsed(const struct sl_str *out)
{
    json_error_t je;
    json_t *j = json_loadb(out->p, out->len, 0, &je);
    cr_assert_not_null(j, "%.*s: %s", (int)out->len, out->p, je.text);
    return j;
}

Test(gateway, anthropic_errors_carry_the_type_of_their_status_when_encoded)
{
    static const struct {
        int http;
        const char *type;
    } cases[] = {{400, "invalid_request_error"},
                 {401, "authentication_error"},
                 {403, "permission_error"},
                 {404, "not_found_error"},
                 {413, "request_too_large"},
                 {429, "rate_limit_error"},
                 {500, "api_error"},
                 {503, "overloaded_error"},
                 {529, "overloaded_error"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sl_openai_error e;
        sl_openai_error_set(&e, cases[i].http, NULL, NULL, "why \"%d\"", cases[i].http);
        struct sl_str out;
        sl_str_init(&out);
        sl_anthropic_error_encode(&out, &e);
        json_t *j = parsed(&out);
        cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "error");
        json_t *inner = json_object_get(j, "error");
        cr_assert_str_eq(json_string_value(json_object_get(inner, "type")), cases[i].type);
        cr_assert(strstr(json_string_value(json_object_get(inner, "message")), "why \""));
        json_decref(j);
        sl_str_dispose(&out);
    }
}

Test(gateway, anthropic_message_names_its_stop_when_encoded)
{
    struct sl_openai_ident id = {.id = "msg_1", .model = "m", .api = SL_OPENAI_API_CHAT};
    struct sl_str out;
    sl_str_init(&out);
    sl_anthropic_message_encode(&out, &id, "Hi \"you\"", 8, SL_FINISH_STOP, "END", 5, 3);
    json_t *j = parsed(&out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "message");
    cr_assert_str_eq(json_string_value(json_object_get(j, "role")), "assistant");
    json_t *block = json_array_get(json_object_get(j, "content"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(block, "type")), "text");
    cr_assert_str_eq(json_string_value(json_object_get(block, "text")), "Hi \"you\"");
    cr_assert_str_eq(json_string_value(json_object_get(j, "stop_reason")), "stop_sequence");
    cr_assert_str_eq(json_string_value(json_object_get(j, "stop_sequence")), "END");
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "input_tokens")), 5);
    cr_assert_eq(json_integer_value(json_object_get(u, "output_tokens")), 3);
    json_decref(j);

    static const struct {
        enum sl_finish f;
        const char *stop, *reason;
    } cases[] = {{SL_FINISH_STOP, NULL, "end_turn"}, {SL_FINISH_LENGTH, NULL, "max_tokens"}};
    for (size_t i = 0; i < 2; i++) {
        sl_str_clear(&out);
        sl_anthropic_message_delta_encode(&out, &id, cases[i].f, cases[i].stop, 5, 7);
        j = parsed(&out);
        cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "message_delta");
        json_t *d = json_object_get(j, "delta");
        cr_assert_str_eq(json_string_value(json_object_get(d, "stop_reason")), cases[i].reason);
        cr_assert(json_is_null(json_object_get(d, "stop_sequence")));
        cr_assert_eq(
            json_integer_value(json_object_get(json_object_get(j, "usage"), "output_tokens")), 7);
        json_decref(j);
    }
    sl_str_clear(&out);
    sl_anthropic_delta_encode(&out, "a\nb", 3);
    /* The stream's fast path, pre + the escaped text + post, writes the same bytes. */
    char fast[256], *p = fast;
    memcpy(p, sl_anthropic_delta_pre.p, sl_anthropic_delta_pre.len);
    p = sl_json_escape(p + sl_anthropic_delta_pre.len, "a\nb", 3);
    memcpy(p, sl_anthropic_delta_post.p, sl_anthropic_delta_post.len);
    p += sl_anthropic_delta_post.len;
    cr_assert_eq((size_t)(p - fast), out.len);
    cr_assert_eq(memcmp(fast, out.p, out.len), 0, "%.*s", (int)out.len, out.p);
    j = parsed(&out);
    cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "content_block_delta");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "delta"), "text")),
                     "a\nb");
    json_decref(j);
    sl_str_clear(&out);
    sl_anthropic_message_start_encode(&out, &id, 11);
    j = parsed(&out);
    json_t *m = json_object_get(j, "message");
    cr_assert_eq(json_array_size(json_object_get(m, "content")), 0);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(m, "usage"), "input_tokens")),
                 11);
    json_decref(j);
    sl_str_dispose(&out);
}

/* Caching is automatic here: Anthropic's cache_control markers (on system and message blocks, and
 * the request's own) are accepted and change nothing, but a malformed one is named. */
Test(gateway, anthropic_accepts_cache_control_markers_and_names_a_malformed_one)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    const char *body =
        "{\"model\":\"m\",\"max_tokens\":8,\"cache_control\":{\"type\":\"ephemeral\"},"
        "\"system\":[{\"type\":\"text\",\"text\":\"Be brief.\",\"cache_control\":{\"type\":"
        "\"ephemeral\",\"ttl\":\"1h\"}}],\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
        "\"text\",\"text\":\"Long context\",\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":"
        "\"5m\"}},{\"type\":\"text\",\"text\":\"Question\",\"cache_control\":null}]}]}";
    cr_assert_eq(decode(&c, body, &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.n_messages, 2);
    cr_assert_str_eq(c.messages[0].content, "Be brief.");
    cr_assert_str_eq(c.messages[1].content, "Long context\nQuestion");
    sl_openai_completion_dispose(&c);

    static const struct {
        const char *body, *param;
    } cases[] = {
        {"{\"model\":\"m\",\"max_tokens\":5,\"cache_control\":\"ephemeral\",\"messages\":[{"
         "\"role\":"
         "\"user\",\"content\":\"x\"}]}",
         "cache_control"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"cache_control\":{\"type\":\"persistent\"},"
         "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         "cache_control.type"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"cache_control\":{},\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         "cache_control.type"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"system\":[{\"type\":\"text\",\"text\":\"s\","
         "\"cache_control\":{\"type\":\"ephemeral\",\"ttl\":\"2h\"}}],\"messages\":[{\"role\":"
         "\"user\",\"content\":\"x\"}]}",
         "system.0.cache_control.ttl"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{"
         "\"type\":"
         "\"text\",\"text\":\"x\",\"cache_control\":[1]}]}]}",
         "messages.0.content.0.cache_control"},
        {"{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{"
         "\"type\":"
         "\"text\",\"text\":\"x\",\"cache_control\":{\"type\":\"ephemeral\",\"scope\":1}}]}]}",
         "messages.0.content.0.cache_control.scope"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_assert_eq(decode(&c, cases[i].body, &err), SL_EINVAL, "%s", cases[i].body);
        cr_assert_eq(err.http, 400);
        cr_assert_str_eq(err.param, cases[i].param, "%s", err.message);
        cr_assert(strstr(err.message, cases[i].param), "%s", err.message);
    }
}

/* Anthropic's input_tokens leaves out the tokens read from the cache, which
 * cache_read_input_tokens counts; the stream's message_start and message_delta say the same. */
Test(gateway, anthropic_usage_counts_cache_reads_apart_from_input_tokens)
{
    struct sl_openai_ident id = {
        .id = "msg_1", .model = "m", .api = SL_OPENAI_API_CHAT, .cached_tokens = 96, .cost = "0.5"};
    struct sl_str out;
    sl_str_init(&out);
    sl_anthropic_message_encode(&out, &id, "ok", 2, SL_FINISH_STOP, NULL, 100, 3);
    json_t *j = parsed(&out);
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "input_tokens")), 4);
    cr_assert_eq(json_integer_value(json_object_get(u, "cache_read_input_tokens")), 96);
    cr_assert_eq(json_integer_value(json_object_get(u, "cache_creation_input_tokens")), 0);
    cr_assert_eq(json_integer_value(json_object_get(u, "output_tokens")), 3);
    cr_assert_eq(json_number_value(json_object_get(u, "cost")), 0.5);
    json_decref(j);

    sl_str_clear(&out);
    sl_anthropic_message_start_encode(&out, &id, 100);
    j = parsed(&out);
    u = json_object_get(json_object_get(j, "message"), "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "input_tokens")), 4);
    cr_assert_eq(json_integer_value(json_object_get(u, "cache_read_input_tokens")), 96);
    cr_assert_eq(json_integer_value(json_object_get(u, "cache_creation_input_tokens")), 0);
    cr_assert_eq(json_integer_value(json_object_get(u, "output_tokens")), 0);
    json_decref(j);

    sl_str_clear(&out);
    sl_anthropic_message_delta_encode(&out, &id, SL_FINISH_LENGTH, NULL, 100, 9);
    j = parsed(&out);
    u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "input_tokens")), 4);
    cr_assert_eq(json_integer_value(json_object_get(u, "cache_read_input_tokens")), 96);
    cr_assert_eq(json_integer_value(json_object_get(u, "output_tokens")), 9);
    cr_assert_eq(json_number_value(json_object_get(u, "cost")), 0.5);
    json_decref(j);

    /* Nothing cached: every prompt token is input. */
    id.cached_tokens = 0;
    sl_str_clear(&out);
    sl_anthropic_message_encode(&out, &id, "ok", 2, SL_FINISH_STOP, NULL, 100, 3);
    j = parsed(&out);
    u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "input_tokens")), 100);
    cr_assert_eq(json_integer_value(json_object_get(u, "cache_read_input_tokens")), 0);
    json_decref(j);
    sl_str_dispose(&out);
}
