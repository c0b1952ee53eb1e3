/* The OpenAI API: decoding /v1/completions requests (jansson) and encoding responses.
 *
 * Decoding goes through jansson because a request is parsed once and its error messages need
 * line and column. Encoding is written by hand into an sl_str: a stream emits one chunk per step
 * per request, and building a json_t tree for each would allocate on the hot path.
 */
#include "gateway_impl.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void sl_openai_error_set(struct sl_openai_error *e, int http, const char *param, const char *code,
                         const char *fmt, ...)
{
    e->http = http;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------
 * Decoding
 */

/* Names as OpenAI's messages spell them ("expected an integer, but got a string instead"). */
static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static int bad_type(struct sl_openai_error *err, const char *param, const char *want,
                    const json_t *got)
{
    sl_openai_error_set(err, 400, param, "invalid_type",
                        "Invalid type for '%s': expected %s, but got %s instead.", param, want,
                        json_kind(got));
    return SL_EINVAL;
}

/* An optional member: NULL when absent or null, because clients that fill every field send null
 * for "use the default". */
static json_t *member(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int decode_number(json_t *root, const char *key, double lo, bool lo_open, double hi,
                         float *out, struct sl_openai_error *err)
{
    json_t *v = member(root, key);
    if (!v)
        return SL_OK;
    if (!json_is_number(v))
        return bad_type(err, key, "a number", v);
    double x = json_number_value(v);
    if (x < lo || (lo_open && x == lo)) {
        sl_openai_error_set(err, 400, key, "decimal_below_min_value",
                            "Invalid '%s': decimal below minimum value. Expected a value %s %g, "
                            "but got %g instead.",
                            key, lo_open ? ">" : ">=", lo, x);
        return SL_EINVAL;
    }
    if (x > hi) {
        sl_openai_error_set(err, 400, key, "decimal_above_max_value",
                            "Invalid '%s': decimal above maximum value. Expected a value <= %g, "
                            "but got %g instead.",
                            key, hi, x);
        return SL_EINVAL;
    }
    *out = (float)x;
    return SL_OK;
}

static int decode_stop(struct sl_openai_completion *c, struct sl_openai_error *err)
{
    json_t *v = member(c->root, "stop");
    if (!v)
        return SL_OK;
    if (json_is_string(v)) {
        c->params.stop[0] = json_string_value(v);
        c->params.n_stop = 1;
        return SL_OK;
    }
    if (!json_is_array(v))
        return bad_type(err, "stop", "a string or an array of strings", v);
    size_t n = json_array_size(v);
    if (n > SL_REQ_MAX_STOPS) {
        sl_openai_error_set(err, 400, "stop", "array_above_max_length",
                            "Invalid 'stop': array too long. Expected an array with maximum "
                            "length %d, but got an array with length %zu instead.",
                            SL_REQ_MAX_STOPS, n);
        return SL_EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s)) {
            sl_openai_error_set(err, 400, "stop", "invalid_type",
                                "Invalid type for 'stop[%zu]': expected a string, but got %s "
                                "instead.",
                                i, json_kind(s));
            return SL_EINVAL;
        }
        c->params.stop[i] = json_string_value(s);
    }
    c->params.n_stop = (int)n;
    return SL_OK;
}

static int decode_fields(struct sl_openai_completion *c, const char *model_id,
                         int default_max_tokens, struct sl_openai_error *err)
{
    json_t *root = c->root;
    json_t *v;

    if ((v = member(root, "model"))) {
        if (!json_is_string(v))
            return bad_type(err, "model", "a string", v);
        if (strcmp(json_string_value(v), model_id) != 0) {
            sl_openai_error_set(err, 404, "model", "model_not_found",
                                "The model '%.200s' does not exist or you do not have access to "
                                "it. This server serves '%.100s'.",
                                json_string_value(v), model_id);
            return SL_ENOENT;
        }
    }

    v = member(root, "prompt");
    if (!v) {
        sl_openai_error_set(err, 400, "prompt", "missing_required_parameter",
                            "Missing required parameter: 'prompt'.");
        return SL_EINVAL;
    }
    if (json_is_array(v)) {
        sl_openai_error_set(err, 400, "prompt", "unsupported_value",
                            "Only a single string 'prompt' is supported for now; arrays of "
                            "prompts or of token ids are not. Send one request per prompt.");
        return SL_EINVAL;
    }
    if (!json_is_string(v))
        return bad_type(err, "prompt", "a string", v);
    c->prompt = json_string_value(v);
    c->prompt_len = json_string_length(v);

    c->params.max_tokens = default_max_tokens;
    if ((v = member(root, "max_tokens"))) {
        if (!json_is_integer(v))
            return bad_type(err, "max_tokens", "an integer", v);
        json_int_t n = json_integer_value(v);
        if (n < 1) {
            sl_openai_error_set(err, 400, "max_tokens", "integer_below_min_value",
                                "Invalid 'max_tokens': integer below minimum value. Expected a "
                                "value >= 1, but got %lld instead.",
                                (long long)n);
            return SL_EINVAL;
        }
        /* Larger values fail the context check later; clamping keeps the arithmetic in int. */
        c->params.max_tokens = n > INT_MAX ? INT_MAX : (int)n;
    }

    c->params.temperature = 1.0f;
    c->params.top_p = 1.0f;
    int st;
    if ((st = decode_number(root, "temperature", 0.0, false, 2.0, &c->params.temperature, err)))
        return st;
    if ((st = decode_number(root, "top_p", 0.0, true, 1.0, &c->params.top_p, err)))
        return st;
    /* vLLM's extensions, which OpenAI clients send through extra_body. */
    if ((st = decode_number(root, "min_p", 0.0, false, 1.0, &c->params.min_p, err)))
        return st;
    if ((v = member(root, "top_k"))) {
        if (!json_is_integer(v))
            return bad_type(err, "top_k", "an integer", v);
        json_int_t k = json_integer_value(v);
        if (k < -1) {
            sl_openai_error_set(err, 400, "top_k", "integer_below_min_value",
                                "Invalid 'top_k': expected -1 or 0 (off) or a positive integer, "
                                "but got %lld instead.",
                                (long long)k);
            return SL_EINVAL;
        }
        c->params.top_k = k <= 0 ? 0 : k > INT_MAX ? INT_MAX : (int)k;
    }

    if ((v = member(root, "seed"))) {
        if (!json_is_integer(v))
            return bad_type(err, "seed", "an integer", v);
        c->params.seed = (uint64_t)json_integer_value(v);
        c->has_seed = true;
    }

    if ((st = decode_stop(c, err)))
        return st;

    if ((v = member(root, "stream"))) {
        if (!json_is_boolean(v))
            return bad_type(err, "stream", "a boolean", v);
        c->stream = json_is_true(v);
    }
    if ((v = member(root, "stream_options"))) {
        if (!json_is_object(v))
            return bad_type(err, "stream_options", "an object", v);
        json_t *u = member(v, "include_usage");
        if (u && !json_is_boolean(u))
            return bad_type(err, "stream_options.include_usage", "a boolean", u);
        c->include_usage = u && json_is_true(u);
    }

    if ((v = member(root, "service_tier")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return bad_type(err, "service_tier", "a string", v);
        c->service_tier = json_string_value(v);
    }
    if ((v = member(root, "user")) && !json_is_null(v)) {
        if (!json_is_string(v))
            return bad_type(err, "user", "a string", v);
        c->user = json_string_value(v);
    }

    /* `n` is a known field whose silent omission would change the answer's shape. */
    if ((v = member(root, "n"))) {
        if (!json_is_integer(v))
            return bad_type(err, "n", "an integer", v);
        if (json_integer_value(v) != 1) {
            sl_openai_error_set(err, 400, "n", "unsupported_value",
                                "Only n=1 is supported for now.");
            return SL_EINVAL;
        }
    }
    return SL_OK;
}

int sl_openai_completion_decode(struct sl_openai_completion *c, const char *body, size_t len,
                                const char *model_id, int default_max_tokens,
                                struct sl_openai_error *err)
{
    memset(c, 0, sizeof *c);
    json_error_t je;
    c->root = json_loadb(body, len, 0, &je);
    if (!c->root) {
        sl_openai_error_set(err, 400, NULL, "invalid_json",
                            "We could not parse the JSON body of your request: %s (line %d, "
                            "column %d).",
                            je.text, je.line, je.column);
        return SL_EFORMAT;
    }
    if (!json_is_object(c->root)) {
        sl_openai_error_set(err, 400, NULL, "invalid_json",
                            "The request body must be a JSON object, but got %s.",
                            json_kind(c->root));
        sl_openai_completion_dispose(c);
        return SL_EINVAL;
    }
    int st = decode_fields(c, model_id, default_max_tokens, err);
    if (st != SL_OK)
        sl_openai_completion_dispose(c);
    return st;
}

void sl_openai_completion_dispose(struct sl_openai_completion *c)
{
    json_decref(c->root);
    memset(c, 0, sizeof *c);
}

int sl_openai_check_context(int seq_len, long long n_prompt, bool at_least, long long max_tokens,
                            struct sl_openai_error *err)
{
    if (!at_least && n_prompt + max_tokens <= seq_len)
        return SL_OK;
    const char *al = at_least ? "at least " : "";
    sl_openai_error_set(err, 400, NULL, "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, you "
                        "requested %s%lld tokens (%s%lld in the prompt, %lld for the "
                        "completion). Please reduce the length of the prompt or of the "
                        "completion (max_tokens).",
                        seq_len, al, n_prompt + max_tokens, al, n_prompt, max_tokens);
    return SL_ERANGE;
}

int sl_openai_prompt_encode(const struct sl_tok *tok, int seq_len, const char *prompt, size_t len,
                            int max_tokens, int32_t *ids, int *n_ids, struct sl_openai_error *err)
{
    int n = 0;
    int st = sl_tok_encode(tok, prompt, len, true, ids, seq_len, &n);
    if (st == SL_EINVAL) {
        sl_openai_error_set(err, 400, "prompt", "invalid_value",
                            "Invalid 'prompt': it is not valid UTF-8.");
        return st;
    }
    if (st == SL_ERANGE)
        return sl_openai_check_context(seq_len, n, true, max_tokens, err);
    if (st != SL_OK) {
        sl_openai_error_set(err, sl_http_status_code(st), NULL, NULL,
                            "The prompt could not be tokenized: %s.", sl_status_str(st));
        return st;
    }
    if ((st = sl_openai_check_context(seq_len, n, false, max_tokens, err)) != SL_OK)
        return st;
    *n_ids = n;
    return SL_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Encoding
 */

/* Appends a string literal without counting it by hand. */
#define put_lit(out, lit) sl_str_append((out), (lit), sizeof(lit) - 1)

static void put_str(struct sl_str *out, const char *s, size_t len)
{
    put_lit(out, "\"");
    sl_str_append_json(out, s, len);
    put_lit(out, "\"");
}

static void put_cstr(struct sl_str *out, const char *s)
{
    put_str(out, s, strlen(s));
}

static void put_head(struct sl_str *out, const struct sl_openai_ident *id)
{
    put_lit(out, "{\"id\":");
    put_cstr(out, id->id);
    sl_str_appendf(
        out, ",\"object\":\"text_completion\",\"created\":%lld,\"model\":", (long long)id->created);
    put_cstr(out, id->model);
}

static void put_choice(struct sl_str *out, const char *text, size_t len, enum sl_finish finish)
{
    put_lit(out, "{\"text\":");
    put_str(out, text, len);
    put_lit(out, ",\"index\":0,\"logprobs\":null,\"finish_reason\":");
    const char *f = sl_finish_str(finish);
    if (f)
        put_cstr(out, f);
    else
        put_lit(out, "null");
    put_lit(out, "}");
}

static void put_usage(struct sl_str *out, int prompt_tokens, int completion_tokens)
{
    sl_str_appendf(out,
                   "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}",
                   prompt_tokens, completion_tokens, prompt_tokens + completion_tokens);
}

void sl_openai_completion_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                 const char *text, size_t len, enum sl_finish finish,
                                 int prompt_tokens, int completion_tokens)
{
    put_head(out, id);
    put_lit(out, ",\"choices\":[");
    put_choice(out, text, len, finish);
    put_lit(out, "],");
    put_usage(out, prompt_tokens, completion_tokens);
    put_lit(out, "}");
}

void sl_openai_chunk_encode(struct sl_str *out, const struct sl_openai_ident *id, const char *text,
                            size_t len, enum sl_finish finish)
{
    put_head(out, id);
    put_lit(out, ",\"choices\":[");
    put_choice(out, text, len, finish);
    put_lit(out, "]");
    /* OpenAI: with include_usage "all other chunks will also include a usage field, but with a
     * null value". */
    if (id->include_usage)
        put_lit(out, ",\"usage\":null");
    put_lit(out, "}");
}

void sl_openai_usage_chunk_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                  int prompt_tokens, int completion_tokens)
{
    put_head(out, id);
    put_lit(out, ",\"choices\":[],");
    put_usage(out, prompt_tokens, completion_tokens);
    put_lit(out, "}");
}

void sl_openai_error_encode(struct sl_str *out, const struct sl_openai_error *e)
{
    put_lit(out, "{\"error\":{\"message\":");
    /* Messages quote client input, which need not be valid UTF-8 once truncated by snprintf. */
    struct sl_str clean;
    sl_str_init(&clean);
    sl_utf8_sanitize(&clean, e->message, strlen(e->message));
    put_str(out, clean.p ? clean.p : "", clean.len);
    sl_str_dispose(&clean);
    put_lit(out, ",\"type\":");
    put_cstr(out, sl_http_error_type(e->http));
    put_lit(out, ",\"param\":");
    if (e->param[0])
        put_cstr(out, e->param);
    else
        put_lit(out, "null");
    put_lit(out, ",\"code\":");
    if (e->code)
        put_cstr(out, e->code);
    else
        put_lit(out, "null");
    put_lit(out, "}}");
}

void sl_openai_model_encode(struct sl_str *out, const char *model_id, int64_t created)
{
    put_lit(out, "{\"id\":");
    put_cstr(out, model_id);
    sl_str_appendf(out, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"sluice\"}",
                   (long long)created);
}

void sl_openai_models_encode(struct sl_str *out, const char *model_id, int64_t created)
{
    put_lit(out, "{\"object\":\"list\",\"data\":[");
    sl_openai_model_encode(out, model_id, created);
    put_lit(out, "]}");
}
