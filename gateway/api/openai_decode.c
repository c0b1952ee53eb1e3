/* The OpenAI API, decoding: /v1/completions, /v1/chat/completions and vLLM's /tokenize and
 * /detokenize requests (jansson), their checks against a model, and OpenAI's error objects.
 * openai_encode.c writes the responses.
 *
 * Decoding goes through jansson because a request is parsed once and its error messages need
 * line and column.
 */
#include "gateway_impl.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

void sl_openai_error_from_admit(struct sl_openai_error *e, const struct sl_admit_error *a)
{
    sl_openai_error_set(e, sl_http_status_code(a->status), a->param, a->code, "%s", a->message);
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

static int missing(struct sl_openai_error *err, const char *param)
{
    sl_openai_error_set(err, 400, param, "missing_required_parameter",
                        "Missing required parameter: '%s'.", param);
    return SL_EINVAL;
}

/* An optional member: NULL when absent or null, because clients that fill every field send null
 * for "use the default". */
static json_t *member(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* An optional boolean; absent or null leaves *out. */
static int decode_bool(json_t *root, const char *key, bool *out, struct sl_openai_error *err)
{
    json_t *v = member(root, key);
    if (!v)
        return SL_OK;
    if (!json_is_boolean(v))
        return bad_type(err, key, "a boolean", v);
    *out = json_is_true(v);
    return SL_OK;
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

static int decode_model(struct sl_openai_completion *c, const char *model_id,
                        struct sl_openai_error *err)
{
    json_t *v = member(c->root, "model");
    if (!v)
        return SL_OK;
    if (!json_is_string(v))
        return bad_type(err, "model", "a string", v);
    c->model = json_string_value(v);
    if (model_id && strcmp(json_string_value(v), model_id) != 0) {
        sl_openai_error_set(err, 404, "model", "model_not_found",
                            "The model '%.200s' does not exist or you do not have access to "
                            "it. This server serves '%.100s'.",
                            json_string_value(v), model_id);
        return SL_ENOENT;
    }
    return SL_OK;
}

/* A prompt given as token ids (param names it, e.g. "prompt" or "prompt[0]"): used as they are
 * (no BOS added, as vLLM and OpenAI do), checked against a vocabulary by sl_openai_check_vocab. */
static int decode_prompt_ids(struct sl_openai_prompt *p, json_t *arr, const char *param,
                             struct sl_openai_error *err)
{
    size_t n = json_array_size(arr);
    if (n == 0) {
        sl_openai_error_set(err, 400, param, "invalid_value",
                            "Invalid '%s': a prompt of token ids needs at least one id.", param);
        return SL_EINVAL;
    }
    p->ids = sl_xmalloc(sizeof(int32_t) * n);
    size_t i;
    json_t *id;
    json_array_foreach(arr, i, id)
    {
        char at[64];
        snprintf(at, sizeof at, "%.32s[%zu]", param, i);
        if (!json_is_integer(id))
            return bad_type(err, at, "an integer (a token id)", id);
        json_int_t x = json_integer_value(id);
        if (x < 0 || x > INT32_MAX) {
            sl_openai_error_set(err, 400, at, "invalid_value",
                                "Invalid '%s': %lld is not a token id.", at, (long long)x);
            return SL_EINVAL;
        }
        p->ids[i] = (int32_t)x;
    }
    p->n_ids = (int)n;
    return SL_OK;
}

void sl_openai_prompt_select(struct sl_openai_completion *c, int i)
{
    const struct sl_openai_prompt *p = &c->prompts[i];
    c->prompt = p->text;
    c->prompt_len = p->len;
    c->prompt_ids = p->ids;
    c->n_prompt_ids = p->n_ids;
}

/* prompt: a string, token ids, or an array of prompts, each a string or token ids (at most
 * SL_OPENAI_N_MAX; with n, prompts × n choices at most that). */
static int decode_prompt(struct sl_openai_completion *c, struct sl_openai_error *err)
{
    json_t *v = member(c->root, "prompt");
    if (!v)
        return missing(err, "prompt");
    /* One prompt: a string or an array of ids (an empty array is an empty list of ids). */
    bool one =
        !json_is_array(v) || json_array_size(v) == 0 || json_is_integer(json_array_get(v, 0));
    size_t n = one ? 1 : json_array_size(v);
    if (n > SL_OPENAI_N_MAX) {
        sl_openai_error_set(err, 400, "prompt", "invalid_value",
                            "Invalid 'prompt': at most %d prompts in one request, got %zu.",
                            SL_OPENAI_N_MAX, n);
        return SL_EINVAL;
    }
    c->prompts = sl_xcalloc(n, sizeof *c->prompts);
    c->n_prompts = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *p = one ? v : json_array_get(v, i);
        char at[32];
        snprintf(at, sizeof at, one ? "prompt" : "prompt[%zu]", i);
        int st = SL_OK;
        if (json_is_array(p))
            st = decode_prompt_ids(&c->prompts[i], p, at, err);
        else if (json_is_string(p))
            c->prompts[i] = (struct sl_openai_prompt){.text = json_string_value(p),
                                                      .len = json_string_length(p)};
        else
            st = bad_type(err, at, "a string or an array of token ids", p);
        if (st != SL_OK)
            return st;
    }
    sl_openai_prompt_select(c, 0);
    return SL_OK;
}

/* max_tokens or max_completion_tokens: an integer >= 1. Absent leaves *out. */
static int decode_max_tokens(json_t *root, const char *key, int *out, struct sl_openai_error *err)
{
    json_t *v = member(root, key);
    if (!v)
        return SL_OK;
    if (!json_is_integer(v))
        return bad_type(err, key, "an integer", v);
    json_int_t n = json_integer_value(v);
    if (n < 1) {
        sl_openai_error_set(err, 400, key, "integer_below_min_value",
                            "Invalid '%s': integer below minimum value. Expected a value >= 1, "
                            "but got %lld instead.",
                            key, (long long)n);
        return SL_EINVAL;
    }
    /* Larger values fail the context check later; clamping keeps the arithmetic in int. */
    *out = n > INT_MAX ? INT_MAX : (int)n;
    return SL_OK;
}

/* logit_bias: {"token id": bias}, each id a decimal string, each bias in [-100, 100] (OpenAI's
 * rules). The ids are checked against a model's vocabulary by sl_openai_check_vocab, once the
 * model is known. */
static int decode_logit_bias(struct sl_openai_completion *c, struct sl_openai_error *err)
{
    json_t *v = member(c->root, "logit_bias");
    if (!v)
        return SL_OK;
    if (!json_is_object(v))
        return bad_type(err, "logit_bias", "an object", v);
    size_t n = json_object_size(v);
    if (n == 0)
        return SL_OK;
    if (n > SL_REQ_MAX_LOGIT_BIAS) {
        sl_openai_error_set(err, 400, "logit_bias", "object_above_max_size",
                            "Invalid 'logit_bias': too many entries. Expected at most %d, but "
                            "got %zu instead.",
                            SL_REQ_MAX_LOGIT_BIAS, n);
        return SL_EINVAL;
    }
    c->bias_ids = sl_xmalloc(sizeof(int32_t) * n);
    c->bias = sl_xmalloc(sizeof(float) * n);
    const char *key;
    json_t *val;
    int i = 0;
    json_object_foreach(v, key, val)
    {
        char param[64];
        snprintf(param, sizeof param, "logit_bias.%.40s", key);
        long long id = 0;
        bool ok = key[0] != '\0' && strlen(key) <= 10;
        for (const char *k = key; ok && *k; k++) {
            ok = *k >= '0' && *k <= '9';
            id = id * 10 + (*k - '0');
        }
        if (!ok || id > INT32_MAX) {
            sl_openai_error_set(err, 400, "logit_bias", "invalid_value",
                                "Invalid key in 'logit_bias': '%.40s' is not a token id (a "
                                "non-negative integer, written as a string).",
                                key);
            return SL_EINVAL;
        }
        if (!json_is_number(val))
            return bad_type(err, param, "a number", val);
        double x = json_number_value(val);
        if (x < -100.0 || x > 100.0) {
            sl_openai_error_set(err, 400, param,
                                x < 0 ? "decimal_below_min_value" : "decimal_above_max_value",
                                "Invalid '%s': a bias must be between -100 and 100, but got %g "
                                "instead.",
                                param, x);
            return SL_EINVAL;
        }
        c->bias_ids[i] = (int32_t)id;
        c->bias[i] = (float)x;
        i++;
    }
    c->params.n_bias = i;
    c->params.bias_ids = c->bias_ids;
    c->params.bias = c->bias;
    return SL_OK;
}

int sl_openai_check_vocab(const struct sl_openai_completion *c, int vocab,
                          struct sl_openai_error *err)
{
    const struct sl_req_params *p = &c->params;
    /* logit_bias, stop_token_ids, then every prompt given as ids. */
    for (int k = 0; k < 2 + c->n_prompts; k++) {
        const struct sl_openai_prompt *q = k >= 2 ? &c->prompts[k - 2] : NULL;
        const int32_t *ids = k == 0 ? p->bias_ids : k == 1 ? p->stop_ids : q->ids;
        int n = k == 0 ? p->n_bias : k == 1 ? p->n_stop_ids : q->n_ids;
        char param[32];
        snprintf(param, sizeof param, "%s", k == 0 ? "logit_bias" : "stop_token_ids");
        if (q)
            snprintf(param, sizeof param, c->n_prompts > 1 ? "prompt[%d]" : "prompt", k - 2);
        for (int i = 0; i < n; i++)
            if (ids[i] >= vocab) {
                sl_openai_error_set(err, 400, param, "invalid_value",
                                    "Invalid '%s': token id %d is not in this model's "
                                    "vocabulary (ids 0 to %d).",
                                    param, (int)ids[i], vocab - 1);
                return SL_EINVAL;
            }
    }
    return SL_OK;
}

static int unsupported(struct sl_openai_error *err, const char *param, const char *why)
{
    sl_openai_error_set(err, 400, param, "unsupported_value", "%s", why);
    return SL_EINVAL;
}

/* An integer in [0, SL_MAX_TOP_LOGPROBS] (the number of alternatives). */
static int decode_top(json_t *v, const char *key, int *out, struct sl_openai_error *err)
{
    if (!json_is_integer(v))
        return bad_type(err, key, "an integer", v);
    json_int_t n = json_integer_value(v);
    if (n < 0 || n > SL_MAX_TOP_LOGPROBS) {
        sl_openai_error_set(err, 400, key,
                            n < 0 ? "integer_below_min_value" : "integer_above_max_value",
                            "Invalid '%s': expected a value between 0 and %d, but got %lld "
                            "instead.",
                            key, SL_MAX_TOP_LOGPROBS, (long long)n);
        return SL_EINVAL;
    }
    *out = (int)n;
    return SL_OK;
}

/* Log probabilities: completions' `logprobs` is the number of alternatives per token (0 = the
 * sampled token's only); chat's is a boolean, with `top_logprobs` the number, which needs it. */
static int decode_logprobs(struct sl_openai_completion *c, bool chat, struct sl_openai_error *err)
{
    json_t *v = member(c->root, "logprobs");
    struct sl_req_params *p = &c->params;
    if (!chat) {
        if (!v)
            return SL_OK;
        p->logprobs = true;
        return decode_top(v, "logprobs", &p->top_logprobs, err);
    }
    int st = decode_bool(c->root, "logprobs", &p->logprobs, err);
    if (st != SL_OK)
        return st;
    json_t *t = member(c->root, "top_logprobs");
    if (!t)
        return SL_OK;
    st = decode_top(t, "top_logprobs", &p->top_logprobs, err);
    if (st == SL_OK && p->top_logprobs > 0 && !p->logprobs) {
        sl_openai_error_set(err, 400, "top_logprobs", "invalid_value",
                            "Invalid 'top_logprobs': 'logprobs' must be true when top_logprobs "
                            "is set.");
        return SL_EINVAL;
    }
    return st;
}

/* vLLM's stop controls: ignore_eos, min_tokens (0..max_tokens), stop_token_ids (token ids,
 * checked against a model's vocabulary by sl_openai_check_vocab), include_stop_str_in_output.
 * After max_tokens. */
static int decode_stop_controls(struct sl_openai_completion *c, struct sl_openai_error *err)
{
    json_t *root = c->root, *v;
    struct sl_req_params *p = &c->params;
    int st;
    if ((st = decode_bool(root, "ignore_eos", &p->ignore_eos, err)) ||
        (st = decode_bool(root, "include_stop_str_in_output", &p->include_stop_str, err)))
        return st;
    if ((v = member(root, "min_tokens"))) {
        if (!json_is_integer(v))
            return bad_type(err, "min_tokens", "an integer", v);
        json_int_t n = json_integer_value(v);
        if (n < 0 || n > p->max_tokens) {
            sl_openai_error_set(err, 400, "min_tokens",
                                n < 0 ? "integer_below_min_value" : "integer_above_max_value",
                                "Invalid 'min_tokens': expected a value between 0 and max_tokens "
                                "(%d), but got %lld instead.",
                                p->max_tokens, (long long)n);
            return SL_EINVAL;
        }
        p->min_tokens = (int)n;
    }
    if (!(v = member(root, "stop_token_ids")))
        return SL_OK;
    if (!json_is_array(v))
        return bad_type(err, "stop_token_ids", "an array of integers", v);
    size_t n = json_array_size(v);
    if (n > SL_REQ_MAX_STOP_IDS) {
        sl_openai_error_set(err, 400, "stop_token_ids", "array_above_max_length",
                            "Invalid 'stop_token_ids': expected at most %d ids, but got %zu "
                            "instead.",
                            SL_REQ_MAX_STOP_IDS, n);
        return SL_EINVAL;
    }
    if (n == 0)
        return SL_OK;
    c->stop_ids = sl_xmalloc(sizeof(int32_t) * n);
    size_t i;
    json_t *id;
    json_array_foreach(v, i, id)
    {
        json_int_t x = json_is_integer(id) ? json_integer_value(id) : -1;
        if (x < 0 || x > INT32_MAX) {
            char param[48];
            snprintf(param, sizeof param, "stop_token_ids[%zu]", i);
            if (!json_is_integer(id))
                return bad_type(err, param, "an integer", id);
            sl_openai_error_set(err, 400, param, "invalid_value",
                                "Invalid '%s': %lld is not a token id.", param, (long long)x);
            return SL_EINVAL;
        }
        c->stop_ids[i] = (int32_t)x;
    }
    p->n_stop_ids = (int)n;
    p->stop_ids = c->stop_ids;
    return SL_OK;
}

/* A field whose presence (anything but null, false or an empty array) asks for what this
 * server does not do. */
static bool asks(json_t *root, const char *key)
{
    json_t *v = member(root, key);
    return v && !json_is_false(v) && !(json_is_array(v) && json_array_size(v) == 0);
}

/* Fields this server does not implement, refused when they ask for something; their default
 * values are accepted, since clients that fill in every field send them. */
static int decode_refusals(struct sl_openai_completion *c, bool chat, struct sl_openai_error *err)
{
    json_t *root = c->root, *v;
    /* vLLM's extensions that change the answer. */
    static const char *const structured[] = {"guided_json", "guided_regex", "guided_choice",
                                             "guided_grammar", "structured_outputs"};
    for (size_t i = 0; i < sizeof structured / sizeof *structured; i++)
        if (asks(root, structured[i]))
            return unsupported(err, structured[i],
                               "Structured output is not supported: this server does not "
                               "constrain its output.");
    if (asks(root, "use_beam_search"))
        return unsupported(err, "use_beam_search", "Beam search is not supported by this server.");
    if (member(root, "prompt_logprobs"))
        return unsupported(err, "prompt_logprobs",
                           "Prompt log probabilities are not supported by this server.");
    bool skip_special = true;
    int st = decode_bool(root, "skip_special_tokens", &skip_special, err);
    if (st != SL_OK)
        return st;
    c->params.keep_special = !skip_special;
    if (chat) {
        if (asks(root, "web_search_options"))
            return unsupported(err, "web_search_options",
                               "Web search is not supported: this server only generates text.");
        if ((v = member(root, "tool_choice")) &&
            !(json_is_string(v) && (strcmp(json_string_value(v), "none") == 0 ||
                                    strcmp(json_string_value(v), "auto") == 0)))
            return unsupported(err, "tool_choice",
                               "Tools are not supported: this server does not call tools, so "
                               "tool_choice can only be 'none' or 'auto'.");
        if ((v = member(root, "modalities"))) {
            if (!json_is_array(v))
                return bad_type(err, "modalities", "an array", v);
            size_t i;
            json_t *m;
            json_array_foreach(v, i, m)
            {
                if (!json_is_string(m))
                    return bad_type(err, "modalities", "an array of strings", v);
                if (strcmp(json_string_value(m), "text") != 0)
                    return unsupported(err, "modalities",
                                       "Only the 'text' modality is supported: this server "
                                       "generates text only.");
            }
        }
        if (member(root, "audio"))
            return unsupported(err, "audio",
                               "Audio output is not supported: this server generates text only.");
        return SL_OK;
    }
    if ((v = member(root, "echo"))) {
        if (!json_is_boolean(v))
            return bad_type(err, "echo", "a boolean", v);
        c->echo = json_is_true(v);
        if (c->echo && c->params.logprobs)
            return unsupported(err, "echo",
                               "Echoing the prompt with logprobs needs the prompt's log "
                               "probabilities, which this server does not compute; send echo "
                               "without logprobs.");
    }
    if ((v = member(root, "best_of"))) {
        if (!json_is_integer(v))
            return bad_type(err, "best_of", "an integer", v);
        json_int_t b = json_integer_value(v);
        c->best_of = b < 1 ? -1 : b > INT_MAX ? INT_MAX : (int)b; /* checked against n */
    }
    if ((v = member(root, "suffix"))) {
        if (!json_is_string(v))
            return bad_type(err, "suffix", "a string", v);
        if (json_string_length(v) > 0)
            return unsupported(err, "suffix",
                               "A suffix (insertion) is not supported by this server.");
    }
    return SL_OK;
}

/* A prefix cache salt (prompt_cache_key, cache_salt): a string of 1 to SL_OPENAI_CACHE_SALT_MAX
 * bytes. It goes into a hash, so any bytes do; the bound keeps that hash's input bounded, and an
 * empty salt is refused (as vLLM refuses one) rather than read as none. */
static int decode_salt(json_t *root, const char *key, struct sl_strv *out,
                       struct sl_openai_error *err)
{
    json_t *v = member(root, key);
    if (!v)
        return SL_OK;
    if (!json_is_string(v))
        return bad_type(err, key, "a string", v);
    size_t n = json_string_length(v);
    if (n == 0) {
        sl_openai_error_set(err, 400, key, "empty_string",
                            "Invalid '%s': string too short. Expected a non-empty string, or leave "
                            "it out.",
                            key);
        return SL_EINVAL;
    }
    if (n > SL_OPENAI_CACHE_SALT_MAX) {
        sl_openai_error_set(err, 400, key, "string_above_max_length",
                            "Invalid '%s': string too long. Expected a string with maximum length "
                            "%d, but got a string with length %zu instead.",
                            key, SL_OPENAI_CACHE_SALT_MAX, n);
        return SL_EINVAL;
    }
    *out = (struct sl_strv){json_string_value(v), n};
    return SL_OK;
}

/* The fields completions and chat share, after model and prompt/messages. */
static int decode_options(struct sl_openai_completion *c, int default_max_tokens, bool chat,
                          struct sl_openai_error *err)
{
    json_t *root = c->root;
    json_t *v;
    int st;

    /* default 0 (chat only): the caller sets max_tokens to what the model's context leaves once
     * the prompt is encoded (max_tokens_open); 1 stands in until then. */
    c->params.max_tokens = default_max_tokens > 0 ? default_max_tokens : 1;
    c->max_tokens_open = default_max_tokens <= 0 && !member(root, "max_tokens") &&
                         !(chat && member(root, "max_completion_tokens"));
    if ((st = decode_max_tokens(root, "max_tokens", &c->params.max_tokens, err)))
        return st;
    /* Chat's newer name wins over the deprecated one when both are sent (as in vLLM). */
    if (chat && (st = decode_max_tokens(root, "max_completion_tokens", &c->params.max_tokens, err)))
        return st;

    c->params.temperature = 1.0f;
    c->params.top_p = 1.0f;
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

    /* vLLM's repetition_penalty must be > 0; no upper bound, as there. */
    if ((st = decode_number(root, "repetition_penalty", 0.0, true, 1e9,
                            &c->params.repetition_penalty, err)) ||
        (st = decode_number(root, "frequency_penalty", -2.0, false, 2.0,
                            &c->params.frequency_penalty, err)) ||
        (st = decode_number(root, "presence_penalty", -2.0, false, 2.0, &c->params.presence_penalty,
                            err)) ||
        (st = decode_logit_bias(c, err)) || (st = decode_logprobs(c, chat, err)) ||
        (st = decode_stop_controls(c, err)) || (st = decode_refusals(c, chat, err)))
        return st;

    if ((st = decode_stop(c, err)))
        return st;

    if ((st = decode_bool(root, "stream", &c->stream, err)))
        return st;
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

    if ((st = decode_salt(root, "prompt_cache_key", &c->prompt_cache_key, err)) ||
        (st = decode_salt(root, "cache_salt", &c->cache_salt, err)))
        return st;

    /* n choices, each generated as its own sequence (the prompt is prefilled for each). */
    c->n = 1;
    if ((v = member(root, "n"))) {
        if (!json_is_integer(v))
            return bad_type(err, "n", "an integer", v);
        json_int_t n = json_integer_value(v);
        if (n < 1 || n > SL_OPENAI_N_MAX) {
            sl_openai_error_set(err, 400, "n",
                                n < 1 ? "integer_below_min_value" : "integer_above_max_value",
                                "Invalid 'n': expected an integer from 1 to %d, but got %lld "
                                "instead.",
                                SL_OPENAI_N_MAX, (long long)n);
            return SL_EINVAL;
        }
        c->n = (int)n;
    }
    if (c->n_prompts > 1 && c->n * c->n_prompts > SL_OPENAI_N_MAX) {
        sl_openai_error_set(err, 400, "n", "invalid_value",
                            "Invalid 'n': %d prompts × n = %d choices, more than the %d one "
                            "request may have.",
                            c->n_prompts, c->n_prompts * c->n, SL_OPENAI_N_MAX);
        return SL_EINVAL;
    }
    /* best_of > n means generating best_of and answering the n of highest log probability:
     * not implemented, and refused rather than answered differently. */
    if (c->best_of && c->best_of != c->n)
        return unsupported(err, "best_of",
                           c->best_of < c->n
                               ? "best_of must be at least n."
                               : "best_of above n (choosing the likeliest of more choices than "
                                 "are returned) is not supported; send best_of equal to n or "
                                 "leave it out.");
    return SL_OK;
}

static int decode_fields(struct sl_openai_completion *c, const char *model_id,
                         int default_max_tokens, struct sl_openai_error *err)
{
    int st;
    if ((st = decode_model(c, model_id, err)) || (st = decode_prompt(c, err)))
        return st;
    return decode_options(c, default_max_tokens, false, err);
}

/* ---- chat messages ---- */

/* One content part: {"type": "text", "text": "…"}; anything else names the param. */
static int decode_part(json_t *part, size_t i, size_t j, struct sl_openai_error *err)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%u].content[%u]", (unsigned)i, (unsigned)j);
    if (!json_is_object(part))
        return bad_type(err, param, "an object", part);
    snprintf(param, sizeof param, "messages[%u].content[%u].type", (unsigned)i, (unsigned)j);
    json_t *type = member(part, "type");
    if (!type)
        return missing(err, param);
    if (!json_is_string(type))
        return bad_type(err, param, "a string", type);
    if (strcmp(json_string_value(type), "text") != 0) {
        sl_openai_error_set(err, 400, param, "unsupported_value",
                            "Content parts of type '%.40s' are not supported: this server reads "
                            "text only (type 'text').",
                            json_string_value(type));
        return SL_EINVAL;
    }
    snprintf(param, sizeof param, "messages[%u].content[%u].text", (unsigned)i, (unsigned)j);
    json_t *t = member(part, "text");
    if (!t)
        return missing(err, param);
    if (!json_is_string(t))
        return bad_type(err, param, "a string", t);
    return SL_OK;
}

void sl_chat_msg_join(struct sl_chat_msg *m, json_t *parts)
{
    struct sl_str joined;
    sl_str_init(&joined);
    sl_str_append(&joined, "", 0); /* allocated and NUL-terminated even when empty */
    size_t j;
    json_t *part;
    json_array_foreach(parts, j, part)
    {
        json_t *t = json_object_get(part, "text");
        if (j > 0)
            sl_str_append(&joined, "\n", 1);
        sl_str_append(&joined, json_string_value(t), json_string_length(t));
    }
    m->content = joined.p;
    m->len = joined.len;
    m->owned = true;
}

/* content as an array of parts: text parts only, joined with "\n" (as vLLM does). */
static int decode_parts(struct sl_chat_msg *m, json_t *parts, size_t i, struct sl_openai_error *err)
{
    size_t j;
    json_t *part;
    json_array_foreach(parts, j, part)
    {
        int st = decode_part(part, i, j, err);
        if (st != SL_OK)
            return st;
    }
    sl_chat_msg_join(m, parts);
    return SL_OK;
}

static int decode_message(struct sl_chat_msg *m, json_t *v, size_t i, struct sl_openai_error *err)
{
    char param[64];
    snprintf(param, sizeof param, "messages[%u]", (unsigned)i);
    if (!json_is_object(v))
        return bad_type(err, param, "an object", v);

    snprintf(param, sizeof param, "messages[%u].role", (unsigned)i);
    json_t *r = member(v, "role");
    if (!r)
        return missing(err, param);
    if (!json_is_string(r))
        return bad_type(err, param, "a string", r);
    const char *role = json_string_value(r);
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
        m->role = SL_CHAT_ROLE_SYSTEM;
    } else if (strcmp(role, "user") == 0) {
        m->role = SL_CHAT_ROLE_USER;
    } else if (strcmp(role, "assistant") == 0) {
        m->role = SL_CHAT_ROLE_ASSISTANT;
    } else if (strcmp(role, "tool") == 0 || strcmp(role, "function") == 0) {
        sl_openai_error_set(err, 400, param, "unsupported_value",
                            "Messages with role '%s' are not supported: this server does not "
                            "call tools or functions.",
                            role);
        return SL_EINVAL;
    } else {
        sl_openai_error_set(err, 400, param, "invalid_value",
                            "Invalid value: '%.40s'. Supported values are: 'system', "
                            "'developer', 'user' and 'assistant'.",
                            role);
        return SL_EINVAL;
    }

    json_t *calls = member(v, "tool_calls");
    if (calls && !(json_is_array(calls) && json_array_size(calls) == 0)) {
        snprintf(param, sizeof param, "messages[%u].tool_calls", (unsigned)i);
        return unsupported(err, param,
                           "Tool calls are not supported: this server does not call "
                           "tools.");
    }
    if (member(v, "function_call")) {
        snprintf(param, sizeof param, "messages[%u].function_call", (unsigned)i);
        return unsupported(err, param,
                           "Function calls are not supported: this server does not "
                           "call functions.");
    }

    snprintf(param, sizeof param, "messages[%u].content", (unsigned)i);
    json_t *ct = member(v, "content");
    if (!ct) {
        /* An assistant turn may be empty (OpenAI allows null content there). */
        if (m->role != SL_CHAT_ROLE_ASSISTANT)
            return missing(err, param);
        m->content = "";
        m->len = 0;
        return SL_OK;
    }
    if (json_is_string(ct)) {
        m->content = json_string_value(ct);
        m->len = json_string_length(ct);
        return SL_OK;
    }
    if (json_is_array(ct))
        return decode_parts(m, ct, i, err);
    return bad_type(err, param, "a string or an array of content parts", ct);
}

static int decode_messages(struct sl_openai_completion *c, struct sl_openai_error *err)
{
    json_t *v = member(c->root, "messages");
    if (!v)
        return missing(err, "messages");
    if (!json_is_array(v))
        return bad_type(err, "messages", "an array", v);
    size_t n = json_array_size(v);
    if (n == 0) {
        sl_openai_error_set(err, 400, "messages", "empty_array",
                            "Invalid 'messages': empty array. Expected an array with minimum "
                            "length 1, but got an empty array instead.");
        return SL_EINVAL;
    }
    /* n is bounded by the body size, which the HTTP layer has bounded. */
    c->messages = sl_xcalloc(n, sizeof *c->messages);
    for (size_t i = 0; i < n; i++) {
        int st = decode_message(&c->messages[i], json_array_get(v, i), i, err);
        c->n_messages = (int)i + 1; /* so dispose frees what this one owns, even on failure */
        if (st != SL_OK)
            return st;
    }
    return SL_OK;
}

/* Chat fields that would change the answer's meaning if they were silently ignored. */
static int decode_chat_refusals(struct sl_openai_completion *c, struct sl_openai_error *err)
{
    json_t *v;
    if ((v = member(c->root, "tools")) && !(json_is_array(v) && json_array_size(v) == 0))
        return unsupported(err, "tools",
                           "Tools are not supported: this server does not call "
                           "tools.");
    if ((v = member(c->root, "functions")) && !(json_is_array(v) && json_array_size(v) == 0))
        return unsupported(err, "functions",
                           "Functions are not supported: this server does not "
                           "call functions.");
    if ((v = member(c->root, "response_format"))) {
        if (!json_is_object(v))
            return bad_type(err, "response_format", "an object", v);
        json_t *t = member(v, "type");
        if (!t || !json_is_string(t))
            return t ? bad_type(err, "response_format.type", "a string", t)
                     : missing(err, "response_format.type");
        if (strcmp(json_string_value(t), "text") != 0)
            return unsupported(err, "response_format.type",
                               "Only response_format type 'text' is supported: this server does "
                               "not constrain output to JSON.");
    }
    return SL_OK;
}

static int decode_chat_fields(struct sl_openai_completion *c, const char *model_id,
                              int default_max_tokens, struct sl_openai_error *err)
{
    int st;
    if ((st = decode_model(c, model_id, err)) || (st = decode_messages(c, err)) ||
        (st = decode_chat_refusals(c, err)))
        return st;
    return decode_options(c, default_max_tokens, true, err);
}

/* Parses the body as a JSON object into c->root, then decodes its fields with `fields`. */
/* The request body as a JSON object into *root (the caller's reference), or a 400 in err. */
static int parse_object(const char *body, size_t len, json_t **root, struct sl_openai_error *err)
{
    json_error_t je;
    *root = json_loadb(body, len, 0, &je);
    if (!*root) {
        sl_openai_error_set(err, 400, NULL, "invalid_json",
                            "We could not parse the JSON body of your request: %s (line %d, "
                            "column %d).",
                            je.text, je.line, je.column);
        return SL_EFORMAT;
    }
    if (!json_is_object(*root)) {
        sl_openai_error_set(err, 400, NULL, "invalid_json",
                            "The request body must be a JSON object, but got %s.",
                            json_kind(*root));
        json_decref(*root);
        *root = NULL;
        return SL_EINVAL;
    }
    return SL_OK;
}

static int decode_body(struct sl_openai_completion *c, const char *body, size_t len,
                       const char *model_id, int default_max_tokens,
                       int (*fields)(struct sl_openai_completion *, const char *, int,
                                     struct sl_openai_error *),
                       struct sl_openai_error *err)
{
    memset(c, 0, sizeof *c);
    int st = parse_object(body, len, &c->root, err);
    if (st != SL_OK)
        return st;
    st = fields(c, model_id, default_max_tokens, err);
    if (st != SL_OK)
        sl_openai_completion_dispose(c);
    return st;
}

int sl_openai_completion_decode(struct sl_openai_completion *c, const char *body, size_t len,
                                const char *model_id, int default_max_tokens,
                                struct sl_openai_error *err)
{
    return decode_body(c, body, len, model_id, default_max_tokens, decode_fields, err);
}

int sl_openai_chat_decode(struct sl_openai_completion *c, const char *body, size_t len,
                          const char *model_id, int default_max_tokens, struct sl_openai_error *err)
{
    return decode_body(c, body, len, model_id, default_max_tokens, decode_chat_fields, err);
}

int sl_openai_tokenize_decode(struct sl_openai_tokenize *t, const char *body, size_t len,
                              bool detokenize, struct sl_openai_error *err)
{
    memset(t, 0, sizeof *t);
    t->add_special = true;
    json_t *root;
    int st = parse_object(body, len, &root, err);
    if (st != SL_OK)
        return st;
    if (!detokenize && member(root, "messages")) {
        /* The messages exactly as a chat completion takes them. */
        json_decref(root);
        t->chat = true;
        return sl_openai_chat_decode(&t->c, body, len, NULL, 1, err);
    }
    t->c.root = root;
    st = decode_model(&t->c, NULL, err);
    json_t *v;
    if (st == SL_OK && detokenize) {
        struct sl_openai_prompt p = {0};
        if (!(v = member(root, "tokens")))
            st = missing(err, "tokens");
        else if (!json_is_array(v))
            st = bad_type(err, "tokens", "an array of token ids", v);
        else if (json_array_size(v) > 0)
            st = decode_prompt_ids(&p, v, "tokens", err);
        t->tokens = p.ids;
        t->n_tokens = p.n_ids;
    } else if (st == SL_OK) {
        if (!(v = member(root, "prompt"))) {
            st = SL_EINVAL;
            sl_openai_error_set(err, 400, "prompt", "missing_required_parameter",
                                "Missing required parameter: 'prompt' (or 'messages').");
        } else if (!json_is_string(v)) {
            st = bad_type(err, "prompt", "a string", v);
        } else {
            t->c.prompt = json_string_value(v);
            t->c.prompt_len = json_string_length(v);
            st = decode_bool(root, "add_special_tokens", &t->add_special, err);
        }
    }
    if (st != SL_OK)
        sl_openai_tokenize_dispose(t);
    return st;
}

void sl_openai_tokenize_dispose(struct sl_openai_tokenize *t)
{
    free(t->tokens);
    sl_openai_completion_dispose(&t->c);
    memset(t, 0, sizeof *t);
}

void sl_openai_completion_dispose(struct sl_openai_completion *c)
{
    for (int i = 0; i < c->n_messages; i++)
        if (c->messages[i].owned)
            free((char *)c->messages[i].content);
    free(c->messages);
    free(c->bias_ids);
    free(c->bias);
    free(c->stop_ids);
    for (int i = 0; i < c->n_prompts; i++)
        free(c->prompts[i].ids);
    free(c->prompts);
    json_decref(c->root);
    memset(c, 0, sizeof *c);
}

int sl_openai_check_context(int seq_len, long long n_prompt, bool at_least, long long max_tokens,
                            const char *prompt_param, struct sl_openai_error *err)
{
    if (!at_least && n_prompt + max_tokens <= seq_len)
        return SL_OK;
    const char *al = at_least ? "at least " : "";
    /* The field to change: the prompt when it leaves no room for even one token, else max_tokens.
     */
    const char *param = at_least || n_prompt >= seq_len ? prompt_param : "max_tokens";
    sl_openai_error_set(err, 400, param, "context_length_exceeded",
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
        return sl_openai_check_context(seq_len, n, true, max_tokens, "prompt", err);
    if (st != SL_OK) {
        sl_openai_error_set(err, sl_http_status_code(st), NULL, NULL,
                            "The prompt could not be tokenized: %s.", sl_status_str(st));
        return st;
    }
    if ((st = sl_openai_check_context(seq_len, n, false, max_tokens, "prompt", err)) != SL_OK)
        return st;
    *n_ids = n;
    return SL_OK;
}

int sl_openai_prompt_ids(const struct sl_openai_completion *c, const struct sl_tok *tok,
                         int seq_len, int max_tokens, int32_t *ids, int *n_ids,
                         struct sl_openai_error *err)
{
    if (!c->prompt_ids)
        return sl_openai_prompt_encode(tok, seq_len, c->prompt, c->prompt_len, max_tokens, ids,
                                       n_ids, err);
    int st = sl_openai_check_context(seq_len, c->n_prompt_ids, false, max_tokens, "prompt", err);
    if (st != SL_OK)
        return st;
    memcpy(ids, c->prompt_ids, sizeof(int32_t) * (size_t)c->n_prompt_ids);
    *n_ids = c->n_prompt_ids;
    return SL_OK;
}
