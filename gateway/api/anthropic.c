/* Anthropic's Messages API (POST /v1/messages): the request decoded into the same completion a
 * chat request is (a system prompt, user and assistant turns of text), run by completion.c
 * through the same tiers, admission, metrics and access log; the answer written as Anthropic's
 * `message` object, or streamed as its events (message_start, content_block_start,
 * content_block_delta, content_block_stop, message_delta, message_stop; error), and errors as
 * {"type":"error","error":{"type","message"}}.
 */
#include "api_impl.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#define put_lit(out, lit) sl_str_append((out), "" lit "", sizeof(lit) - 1)

/* ---- errors ---- */

/* Anthropic's error type for an HTTP status. */
static const char *error_type(int http)
{
    switch (http) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    case 504: return "timeout_error";
    }
    return http >= 500 ? "api_error" : "invalid_request_error";
}

static void put_text(struct sl_str *out, const char *s, size_t len)
{
    put_lit(out, "\"");
    if (sl_utf8_valid(s, len)) {
        sl_str_append_json(out, s, len);
    } else {
        struct sl_str clean;
        sl_str_init(&clean);
        sl_utf8_sanitize(&clean, s, len);
        sl_str_append_json(out, clean.p ? clean.p : "", clean.len);
        sl_str_dispose(&clean);
    }
    put_lit(out, "\"");
}

void sl_anthropic_error_encode(struct sl_str *out, const struct sl_openai_error *e)
{
    put_lit(out, "{\"type\":\"error\",\"error\":{\"type\":\"");
    sl_str_append(out, error_type(e->http), strlen(error_type(e->http)));
    put_lit(out, "\",\"message\":");
    put_text(out, e->message, strlen(e->message));
    put_lit(out, "}}");
}

/* ---- decoding ---- */

static const char *kind_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static int bad(struct sl_openai_error *err, const char *param, const char *want, const json_t *v)
{
    sl_openai_error_set(err, 400, param, "invalid_type", "%s: Input should be %s, not %s.", param,
                        want, kind_of(v));
    return SL_EINVAL;
}

static int missing(struct sl_openai_error *err, const char *param)
{
    sl_openai_error_set(err, 400, param, "missing_required_parameter", "%s: Field required.",
                        param);
    return SL_EINVAL;
}

/* A cache_control marker (on a content block, or the request's own): accepted and ignored, since
 * the prefix cache is automatic here (every full block of every prompt is cached, no breakpoint
 * needed), but checked as Anthropic checks it, so a malformed one is not taken silently:
 * {"type": "ephemeral", "ttl": "5m" or "1h" (optional)}, or null. */
static int check_cache_control(json_t *holder, const char *param, struct sl_openai_error *err)
{
    json_t *v = json_object_get(holder, "cache_control");
    if (!v || json_is_null(v))
        return SL_OK;
    char at[96];
    if (!json_is_object(v))
        return bad(err, param, "an object {\"type\": \"ephemeral\"}", v);
    json_t *type = json_object_get(v, "type"), *ttl = json_object_get(v, "ttl");
    snprintf(at, sizeof at, "%s.type", param);
    if (!type)
        return missing(err, at);
    if (!json_is_string(type) || strcmp(json_string_value(type), "ephemeral") != 0) {
        sl_openai_error_set(err, 400, at, "invalid_value", "%s: Input should be 'ephemeral'.", at);
        return SL_EINVAL;
    }
    snprintf(at, sizeof at, "%s.ttl", param);
    if (ttl && !json_is_null(ttl) &&
        !(json_is_string(ttl) && (strcmp(json_string_value(ttl), "5m") == 0 ||
                                  strcmp(json_string_value(ttl), "1h") == 0))) {
        sl_openai_error_set(err, 400, at, "invalid_value", "%s: Input should be '5m' or '1h'.", at);
        return SL_EINVAL;
    }
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x)
    {
        if (strcmp(k, "type") != 0 && strcmp(k, "ttl") != 0) {
            snprintf(at, sizeof at, "%s.%.40s", param, k);
            sl_openai_error_set(err, 400, at, "unsupported_parameter",
                                "%s: Extra inputs are not permitted.", at);
            return SL_EINVAL;
        }
    }
    return SL_OK;
}

/* Text content: a string, or an array of {"type": "text", "text"} blocks (joined with "\n"),
 * each with an optional cache_control. */
static int decode_content(struct sl_chat_msg *m, json_t *v, const char *param,
                          struct sl_openai_error *err)
{
    char at[64];
    if (json_is_string(v)) {
        m->content = json_string_value(v);
        m->len = json_string_length(v);
        return SL_OK;
    }
    if (!json_is_array(v))
        return bad(err, param, "a string or an array of content blocks", v);
    size_t j;
    json_t *b;
    json_array_foreach(v, j, b)
    {
        snprintf(at, sizeof at, "%s.%u", param, (unsigned)j);
        if (!json_is_object(b))
            return bad(err, at, "an object", b);
        json_t *type = json_object_get(b, "type");
        snprintf(at, sizeof at, "%s.%u.type", param, (unsigned)j);
        if (!type)
            return missing(err, at);
        if (!json_is_string(type))
            return bad(err, at, "a string", type);
        if (strcmp(json_string_value(type), "text") != 0) {
            sl_openai_error_set(err, 400, at, "unsupported_value",
                                "%s: content blocks of type '%.40s' are not supported: this "
                                "server reads text only (type 'text').",
                                at, json_string_value(type));
            return SL_EINVAL;
        }
        json_t *t = json_object_get(b, "text");
        snprintf(at, sizeof at, "%s.%u.text", param, (unsigned)j);
        if (!t)
            return missing(err, at);
        if (!json_is_string(t))
            return bad(err, at, "a string", t);
        snprintf(at, sizeof at, "%s.%u.cache_control", param, (unsigned)j);
        int st = check_cache_control(b, at, err);
        if (st != SL_OK)
            return st;
    }
    sl_chat_msg_join(m, v);
    return SL_OK;
}

static int decode_messages(struct sl_openai_completion *c, struct sl_openai_error *err)
{
    json_t *sys = json_object_get(c->root, "system");
    json_t *v = json_object_get(c->root, "messages");
    if (!v)
        return missing(err, "messages");
    if (!json_is_array(v))
        return bad(err, "messages", "an array", v);
    size_t n = json_array_size(v);
    if (n == 0) {
        sl_openai_error_set(err, 400, "messages", "invalid_value",
                            "messages: at least one message is required.");
        return SL_EINVAL;
    }
    /* n is bounded by the body size, which the HTTP layer has bounded. */
    c->messages = sl_xcalloc(n + 1, sizeof *c->messages);
    if (sys && !json_is_null(sys)) {
        struct sl_chat_msg *m = &c->messages[c->n_messages++];
        m->role = SL_CHAT_ROLE_SYSTEM;
        int st = decode_content(m, sys, "system", err);
        if (st != SL_OK)
            return st;
    }
    char at[64];
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(v, i);
        struct sl_chat_msg *m = &c->messages[c->n_messages++];
        snprintf(at, sizeof at, "messages.%u", (unsigned)i);
        if (!json_is_object(msg))
            return bad(err, at, "an object", msg);
        json_t *role = json_object_get(msg, "role");
        snprintf(at, sizeof at, "messages.%u.role", (unsigned)i);
        if (!role)
            return missing(err, at);
        if (!json_is_string(role))
            return bad(err, at, "a string", role);
        if (strcmp(json_string_value(role), "user") == 0) {
            m->role = SL_CHAT_ROLE_USER;
        } else if (strcmp(json_string_value(role), "assistant") == 0) {
            m->role = SL_CHAT_ROLE_ASSISTANT;
        } else {
            sl_openai_error_set(err, 400, at, "invalid_value",
                                "%s: Input should be 'user' or 'assistant', not '%.40s'.", at,
                                json_string_value(role));
            return SL_EINVAL;
        }
        json_t *content = json_object_get(msg, "content");
        snprintf(at, sizeof at, "messages.%u.content", (unsigned)i);
        if (!content)
            return missing(err, at);
        int st = decode_content(m, content, at, err);
        if (st != SL_OK)
            return st;
    }
    return SL_OK;
}

static int decode_unit(json_t *root, const char *key, float *out, struct sl_openai_error *err)
{
    json_t *v = json_object_get(root, key);
    if (!v)
        return SL_OK;
    if (!json_is_number(v))
        return bad(err, key, "a number", v);
    double d = json_number_value(v);
    if (!(d >= 0.0 && d <= 1.0)) {
        sl_openai_error_set(err, 400, key, "invalid_value",
                            "%s: Input should be between 0 and 1, not %g.", key, d);
        return SL_EINVAL;
    }
    *out = (float)d;
    return SL_OK;
}

/* The body's keys this server reads; any other is refused, as Anthropic refuses extra inputs,
 * so that nothing a client asks for is silently ignored. cache_control (automatic caching's
 * marker) asks for what this server does anyway. */
static const char *const known_keys[] = {
    "model",        "max_tokens", "messages",    "system",        "stop_sequences",
    "temperature",  "top_p",      "top_k",       "stream",        "metadata",
    "service_tier", "tools",      "tool_choice", "cache_control",
};

static int decode_fields(struct sl_openai_completion *c, struct sl_openai_error *err)
{
    json_t *root = c->root, *v;
    const char *key;
    json_object_foreach(root, key, v)
    {
        size_t i = 0;
        while (i < sizeof known_keys / sizeof known_keys[0] && strcmp(key, known_keys[i]) != 0)
            i++;
        if (i == sizeof known_keys / sizeof known_keys[0]) {
            sl_openai_error_set(err, 400, NULL, "unsupported_parameter",
                                "%.60s: Extra inputs are not permitted.", key);
            return SL_EINVAL;
        }
    }
    int st = check_cache_control(root, "cache_control", err);
    if (st != SL_OK)
        return st;
    if (!(v = json_object_get(root, "model")))
        return missing(err, "model");
    if (!json_is_string(v))
        return bad(err, "model", "a string", v);
    c->model = json_string_value(v);

    if (!(v = json_object_get(root, "max_tokens")))
        return missing(err, "max_tokens");
    if (!json_is_integer(v))
        return bad(err, "max_tokens", "an integer", v);
    if (json_integer_value(v) < 1) {
        sl_openai_error_set(err, 400, "max_tokens", "invalid_value",
                            "max_tokens: Input should be greater than or equal to 1.");
        return SL_EINVAL;
    }
    json_int_t mt = json_integer_value(v);
    c->params.max_tokens = mt > INT_MAX ? INT_MAX : (int)mt;

    if ((st = decode_messages(c, err)) != SL_OK)
        return st;

    c->params.temperature = 1.0f;
    c->params.top_p = 1.0f;
    if ((st = decode_unit(root, "temperature", &c->params.temperature, err)) ||
        (st = decode_unit(root, "top_p", &c->params.top_p, err)))
        return st;
    if (c->params.top_p == 0.0f)
        c->params.top_p = 1e-6f; /* the sampler's range is (0, 1]: keep the likeliest only */
    if ((v = json_object_get(root, "top_k"))) {
        if (!json_is_integer(v))
            return bad(err, "top_k", "an integer", v);
        if (json_integer_value(v) < 0) {
            sl_openai_error_set(err, 400, "top_k", "invalid_value",
                                "top_k: Input should be greater than or equal to 0.");
            return SL_EINVAL;
        }
        c->params.top_k = json_integer_value(v) > INT_MAX ? INT_MAX : (int)json_integer_value(v);
    }
    if ((v = json_object_get(root, "stop_sequences")) && !json_is_null(v)) {
        if (!json_is_array(v))
            return bad(err, "stop_sequences", "an array of strings", v);
        if (json_array_size(v) > SL_REQ_MAX_STOPS) {
            sl_openai_error_set(err, 400, "stop_sequences", "invalid_value",
                                "stop_sequences: at most %d are supported, not %zu.",
                                SL_REQ_MAX_STOPS, json_array_size(v));
            return SL_EINVAL;
        }
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s)
        {
            char at[32];
            snprintf(at, sizeof at, "stop_sequences.%u", (unsigned)i);
            if (!json_is_string(s))
                return bad(err, at, "a string", s);
            c->params.stop[c->params.n_stop++] = json_string_value(s);
        }
    }
    if ((v = json_object_get(root, "stream"))) {
        if (!json_is_boolean(v))
            return bad(err, "stream", "a boolean", v);
        c->stream = json_is_true(v);
    }
    if ((v = json_object_get(root, "metadata")) && !json_is_null(v)) {
        if (!json_is_object(v))
            return bad(err, "metadata", "an object", v);
        json_t *u = json_object_get(v, "user_id");
        if (u && !json_is_null(u) && !json_is_string(u))
            return bad(err, "metadata.user_id", "a string", u);
        c->user = u && json_is_string(u) ? json_string_value(u) : NULL;
    }
    if ((v = json_object_get(root, "service_tier")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return bad(err, "service_tier", "a string", v);
        c->service_tier = json_string_value(v);
    }
    if ((v = json_object_get(root, "tools")) && !(json_is_array(v) && json_array_size(v) == 0)) {
        sl_openai_error_set(err, 400, "tools", "unsupported_value",
                            "tools: tool use is not supported: this server does not call tools.");
        return SL_EINVAL;
    }
    c->n = 1;
    return SL_OK;
}

int sl_anthropic_messages_decode(struct sl_openai_completion *c, const char *body, size_t len,
                                 struct sl_openai_error *err)
{
    memset(c, 0, sizeof *c);
    json_error_t je;
    c->root = json_loadb(body, len, 0, &je);
    if (!c->root) {
        sl_openai_error_set(err, 400, NULL, "invalid_json",
                            "The request body is not valid JSON: %s (line %d, column %d).", je.text,
                            je.line, je.column);
        return SL_EFORMAT;
    }
    int st =
        json_is_object(c->root) ? decode_fields(c, err) : bad(err, "body", "an object", c->root);
    if (st != SL_OK)
        sl_openai_completion_dispose(c);
    return st;
}

/* ---- encoding ---- */

/* stop_reason, and stop_sequence (the matched string, or null). */
static void put_stop(struct sl_str *out, enum sl_finish finish, const char *stop)
{
    put_lit(out, "\"stop_reason\":");
    if (finish == SL_FINISH_LENGTH)
        put_lit(out, "\"max_tokens\"");
    else if (finish == SL_FINISH_STOP && stop)
        put_lit(out, "\"stop_sequence\"");
    else if (finish == SL_FINISH_STOP)
        put_lit(out, "\"end_turn\"");
    else
        put_lit(out, "null");
    put_lit(out, ",\"stop_sequence\":");
    if (finish == SL_FINISH_STOP && stop)
        put_text(out, stop, strlen(stop));
    else
        put_lit(out, "null");
}

static void put_message_head(struct sl_str *out, const struct sl_openai_ident *id)
{
    put_lit(out, "{\"id\":");
    put_text(out, id->id, strlen(id->id));
    put_lit(out, ",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    put_text(out, id->model, strlen(id->model));
}

/* Anthropic's input usage: input_tokens counts the prompt tokens not read from the cache, which
 * cache_read_input_tokens counts (their sum is the prompt); nothing is written to a cache at a
 * price of its own here (caching is automatic), so cache_creation_input_tokens is 0. */
static void put_input_usage(struct sl_str *out, const struct sl_openai_ident *id, int prompt_tokens)
{
    int cached = id->cached_tokens < 0               ? 0
                 : id->cached_tokens > prompt_tokens ? prompt_tokens
                                                     : id->cached_tokens;
    sl_str_appendf(out,
                   "\"input_tokens\":%d,\"cache_creation_input_tokens\":0,"
                   "\"cache_read_input_tokens\":%d",
                   prompt_tokens - cached, cached);
}

void sl_anthropic_message_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                 const char *text, size_t len, enum sl_finish finish,
                                 const char *stop, int input_tokens, int output_tokens)
{
    put_message_head(out, id);
    put_lit(out, ",\"content\":[{\"type\":\"text\",\"text\":");
    put_text(out, text, len);
    put_lit(out, "}],");
    put_stop(out, finish, stop);
    put_lit(out, ",\"usage\":{");
    put_input_usage(out, id, input_tokens);
    put_lit(out, ",\"output_tokens\":");
    sl_str_append_int(out, output_tokens);
    if (id->cost) {
        put_lit(out, ",\"cost\":");
        sl_str_append(out, id->cost, strlen(id->cost));
    }
    put_lit(out, "}}");
}

void sl_anthropic_message_start_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                       int input_tokens)
{
    put_lit(out, "{\"type\":\"message_start\",\"message\":");
    put_message_head(out, id);
    put_lit(out, ",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{");
    put_input_usage(out, id, input_tokens);
    put_lit(out, ",\"output_tokens\":0}}}");
}

#define DELTA_PRE                                                                                  \
    "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"
#define DELTA_POST "}}"
const struct sl_strv sl_anthropic_delta_pre = {DELTA_PRE "\"", sizeof DELTA_PRE};
const struct sl_strv sl_anthropic_delta_post = {"\"" DELTA_POST, sizeof DELTA_POST};

void sl_anthropic_delta_encode(struct sl_str *out, const char *text, size_t len)
{
    put_lit(out, DELTA_PRE);
    put_text(out, text, len);
    put_lit(out, DELTA_POST);
}

void sl_anthropic_message_delta_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                       enum sl_finish finish, const char *stop, int input_tokens,
                                       int output_tokens)
{
    put_lit(out, "{\"type\":\"message_delta\",\"delta\":{");
    put_stop(out, finish, stop);
    /* The usage so far, as Anthropic's final message_delta gives it (cumulative). */
    put_lit(out, "},\"usage\":{");
    put_input_usage(out, id, input_tokens);
    put_lit(out, ",\"output_tokens\":");
    sl_str_append_int(out, output_tokens);
    if (id->cost) {
        put_lit(out, ",\"cost\":");
        sl_str_append(out, id->cost, strlen(id->cost));
    }
    put_lit(out, "}}");
}

/* ---- the route ---- */

void api_serve_messages(struct api_exchange *a)
{
    a->inference = true;
    a->ident.api = SL_OPENAI_API_CHAT; /* a chat: the model's chat template renders it */
    struct sl_openai_error err;
    if (sl_anthropic_messages_decode(&a->oc, a->x->body.p, a->x->body.len, &err) != SL_OK) {
        api_send_error(a, &err, NULL);
        return;
    }
    /* The stop sequences outlive the decoded body (disposed at submit): the answer names the
     * one that matched. */
    a->n_stops = a->oc.params.n_stop;
    for (int i = 0; i < a->n_stops; i++)
        a->stops[i] =
            sl_arena_strndup(&a->x->arena, a->oc.params.stop[i], strlen(a->oc.params.stop[i]));
    api_serve_decoded(a);
}
