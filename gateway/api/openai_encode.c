/* The OpenAI API, encoding: completion and chat objects, stream chunks, errors, models, and the
 * headers that carry admission's decision and a tenant's rate limits in OpenAI's words.
 *
 * Written by hand into an sl_str, not through jansson: a stream emits one chunk per step per
 * request, and building a json_t tree for each would allocate on the hot path.
 */
#include "gateway_impl.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Encoding
 */

/* Appends a string literal without counting it by hand; anything but a literal (a pointer, whose
 * sizeof is not its length) fails to compile on the "" pastes. */
#define put_lit(out, lit) sl_str_append((out), "" lit "", sizeof(lit) - 1)

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

/* id, object, created, model; chunk selects the stream's object name. */
static void put_head(struct sl_str *out, const struct sl_openai_ident *id, bool chunk)
{
    const char *object = id->api != SL_OPENAI_API_CHAT ? "text_completion"
                         : chunk                       ? "chat.completion.chunk"
                                                       : "chat.completion";
    put_lit(out, "{\"id\":");
    put_cstr(out, id->id);
    put_lit(out, ",\"object\":\"");
    sl_str_append(out, object, strlen(object));
    put_lit(out, "\",\"created\":");
    sl_str_append_int(out, id->created);
    put_lit(out, ",\"model\":");
    put_cstr(out, id->model);
    if (id->api == SL_OPENAI_API_CHAT)
        put_lit(out, ",\"system_fingerprint\":null");
}

static void put_finish(struct sl_str *out, enum sl_finish finish)
{
    put_lit(out, ",\"finish_reason\":");
    const char *f = sl_finish_str(finish);
    if (f)
        put_cstr(out, f);
    else
        put_lit(out, "null");
}

/* A token's text: tok's piece after prev, or (not valid UTF-8 on its own: a byte-fallback token
 * or part of a character) OpenAI's "bytes:\\xNN..." spelling of its bytes. */
static void put_token(struct sl_str *out, const struct sl_tok *tok, int32_t prev, int32_t id)
{
    size_t len = 0;
    const char *p = sl_tok_decode(tok, prev, id, &len);
    if (sl_utf8_valid(p, len)) {
        put_str(out, p, len);
        return;
    }
    put_lit(out, "\"bytes:");
    for (size_t i = 0; i < len; i++)
        sl_str_appendf(out, "\\\\x%02x", (unsigned char)p[i]);
    put_lit(out, "\"");
}

/* A token's bytes as a JSON array of integers (chat's "bytes"). */
static void put_token_bytes(struct sl_str *out, const struct sl_tok *tok, int32_t prev, int32_t id)
{
    size_t len = 0;
    const char *p = sl_tok_decode(tok, prev, id, &len);
    put_lit(out, "[");
    for (size_t i = 0; i < len; i++)
        sl_str_appendf(out, "%s%u", i ? "," : "", (unsigned)(unsigned char)p[i]);
    put_lit(out, "]");
}

/* A log probability; -9999 stands for -inf (as vLLM writes it), JSON having no infinity. */
static void put_logprob(struct sl_str *out, float lp)
{
    sl_str_appendf(out, "%.9g", isfinite(lp) ? (double)lp : -9999.0);
}

size_t sl_openai_token_len(const struct sl_tok *tok, int32_t prev, int32_t id)
{
    size_t len = 0;
    sl_tok_decode(tok, prev, id, &len);
    return len;
}

/* The completions API's logprobs object: tokens, token_logprobs, top_logprobs (a token → logprob
 * object per token; a text two alternatives share is listed once, for the likelier) and
 * text_offset (bytes into the completion's text). */
static void put_completion_logprobs(struct sl_str *out, const struct sl_openai_logprobs *lp)
{
    put_lit(out, "{\"tokens\":[");
    for (int i = 0; i < lp->n; i++) {
        if (i)
            put_lit(out, ",");
        put_token(out, lp->tok, lp->e[i].prev, lp->e[i].token);
    }
    put_lit(out, "],\"token_logprobs\":[");
    for (int i = 0; i < lp->n; i++) {
        if (i)
            put_lit(out, ",");
        put_logprob(out, lp->e[i].logprob);
    }
    put_lit(out, "],\"top_logprobs\":[");
    for (int i = 0; i < lp->n; i++) {
        const struct sl_token_logprobs *e = &lp->e[i];
        if (i)
            put_lit(out, ",");
        put_lit(out, "{");
        for (int k = 0, written = 0; k < e->n_top; k++) {
            /* Each key once: an alternative whose bytes a likelier one had is left out. */
            size_t len = 0, l2 = 0;
            const char *p = sl_tok_decode(lp->tok, e->prev, e->top_ids[k], &len);
            bool seen = false;
            for (int k2 = 0; k2 < k && !seen; k2++) {
                const char *p2 = sl_tok_decode(lp->tok, e->prev, e->top_ids[k2], &l2);
                seen = l2 == len && memcmp(p2, p, len) == 0;
            }
            if (seen)
                continue;
            if (written++)
                put_lit(out, ",");
            put_token(out, lp->tok, e->prev, e->top_ids[k]);
            put_lit(out, ":");
            put_logprob(out, e->top_logprobs[k]);
        }
        put_lit(out, "}");
    }
    put_lit(out, "],\"text_offset\":[");
    size_t off = lp->text_offset;
    for (int i = 0; i < lp->n; i++) {
        sl_str_appendf(out, "%s%zu", i ? "," : "", off);
        off += sl_openai_token_len(lp->tok, lp->e[i].prev, lp->e[i].token);
    }
    put_lit(out, "]}");
}

/* The chat API's: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
 * "refusal": null}. */
static void put_chat_logprobs(struct sl_str *out, const struct sl_openai_logprobs *lp)
{
    put_lit(out, "{\"content\":[");
    for (int i = 0; i < lp->n; i++) {
        const struct sl_token_logprobs *e = &lp->e[i];
        if (i)
            put_lit(out, ",");
        put_lit(out, "{\"token\":");
        put_token(out, lp->tok, e->prev, e->token);
        put_lit(out, ",\"logprob\":");
        put_logprob(out, e->logprob);
        put_lit(out, ",\"bytes\":");
        put_token_bytes(out, lp->tok, e->prev, e->token);
        put_lit(out, ",\"top_logprobs\":[");
        for (int k = 0; k < e->n_top; k++) {
            if (k)
                put_lit(out, ",");
            put_lit(out, "{\"token\":");
            put_token(out, lp->tok, e->prev, e->top_ids[k]);
            put_lit(out, ",\"logprob\":");
            put_logprob(out, e->top_logprobs[k]);
            put_lit(out, ",\"bytes\":");
            put_token_bytes(out, lp->tok, e->prev, e->top_ids[k]);
            put_lit(out, "}");
        }
        put_lit(out, "]}");
    }
    put_lit(out, "],\"refusal\":null}");
}

static void put_logprobs(struct sl_str *out, const struct sl_openai_ident *id,
                         const struct sl_openai_logprobs *lp)
{
    put_lit(out, ",\"logprobs\":");
    if (!lp)
        put_lit(out, "null");
    else if (id->api == SL_OPENAI_API_CHAT)
        put_chat_logprobs(out, lp);
    else
        put_completion_logprobs(out, lp);
}

static void put_choice(struct sl_str *out, const struct sl_openai_ident *id, int index,
                       const char *text, size_t len, enum sl_finish finish,
                       const struct sl_openai_logprobs *lp)
{
    put_lit(out, "{\"text\":");
    put_str(out, text, len);
    put_lit(out, ",\"index\":");
    sl_str_append_int(out, index);
    put_logprobs(out, id, lp);
    put_finish(out, finish);
    put_lit(out, "}");
}

static void put_usage(struct sl_str *out, const struct sl_openai_ident *id, int prompt_tokens,
                      int completion_tokens)
{
    sl_str_appendf(out,
                   "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":%d}",
                   prompt_tokens, completion_tokens, prompt_tokens + completion_tokens,
                   id->cached_tokens);
    if (id->cost) {
        put_lit(out, ",\"cost\":");
        sl_str_append(out, id->cost, strlen(id->cost));
    }
    put_lit(out, "}");
}

/* OpenAI: with include_usage "all other chunks will also include a usage field, but with a null
 * value". */
static void put_chunk_tail(struct sl_str *out, const struct sl_openai_ident *id)
{
    if (id->include_usage)
        put_lit(out, ",\"usage\":null");
    put_lit(out, "}");
}

void sl_openai_completion_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                 const char *text, size_t len, enum sl_finish finish,
                                 int prompt_tokens, int completion_tokens,
                                 const struct sl_openai_logprobs *lp)
{
    struct sl_openai_choice ch = {text, len, finish, lp};
    sl_openai_completion_encode_choices(out, id, &ch, 1, prompt_tokens, completion_tokens);
}

void sl_openai_completion_encode_choices(struct sl_str *out, const struct sl_openai_ident *id,
                                         const struct sl_openai_choice *ch, int n,
                                         int prompt_tokens, int completion_tokens)
{
    put_head(out, id, false);
    put_lit(out, ",\"choices\":[");
    for (int i = 0; i < n; i++) {
        if (i)
            put_lit(out, ",");
        if (id->api != SL_OPENAI_API_CHAT) {
            put_choice(out, id, i, ch[i].text, ch[i].len, ch[i].finish, ch[i].lp);
            continue;
        }
        sl_str_appendf(out, "{\"index\":%d,\"message\":{\"role\":\"assistant\",\"content\":", i);
        put_str(out, ch[i].text, ch[i].len);
        put_lit(out, ",\"refusal\":null}");
        put_logprobs(out, id, ch[i].lp);
        put_finish(out, ch[i].finish);
        put_lit(out, "}");
    }
    put_lit(out, "],");
    put_usage(out, id, prompt_tokens, completion_tokens);
    put_lit(out, "}");
}

/* A chunk up to its text (content: a chat delta has "content"), and from its text on. */
static void chunk_open(struct sl_str *out, const struct sl_openai_ident *id, bool content)
{
    put_head(out, id, true);
    put_lit(out, ",\"choices\":[");
    if (id->api != SL_OPENAI_API_CHAT) {
        put_lit(out, "{\"text\":\"");
        return;
    }
    /* OpenAI's last chunk has an empty delta and the finish_reason. */
    put_lit(out, "{\"index\":");
    sl_str_append_int(out, id->index);
    put_lit(out, ",\"delta\":{");
    if (content)
        put_lit(out, "\"content\":\"");
}

static void chunk_close(struct sl_str *out, const struct sl_openai_ident *id, bool content,
                        enum sl_finish finish, const struct sl_openai_logprobs *lp)
{
    if (id->api != SL_OPENAI_API_CHAT) {
        put_lit(out, "\",\"index\":");
        sl_str_append_int(out, id->index);
    } else {
        if (content)
            put_lit(out, "\"");
        put_lit(out, "}");
    }
    put_logprobs(out, id, lp);
    put_finish(out, finish);
    put_lit(out, "}]");
    put_chunk_tail(out, id);
}

void sl_openai_chunk_encode(struct sl_str *out, const struct sl_openai_ident *id, const char *text,
                            size_t len, enum sl_finish finish, const struct sl_openai_logprobs *lp)
{
    bool content = id->api != SL_OPENAI_API_CHAT || len > 0 || finish == SL_FINISH_NONE;
    chunk_open(out, id, content);
    if (content)
        sl_str_append_json(out, text, len);
    chunk_close(out, id, content, finish, lp);
}

size_t sl_openai_chunk_affixes(const struct sl_openai_ident *id, struct sl_str *out)
{
    chunk_open(out, id, true);
    size_t n_pre = out->len;
    chunk_close(out, id, true, SL_FINISH_NONE, NULL);
    return n_pre;
}

void sl_openai_chunk_role_encode(struct sl_str *out, const struct sl_openai_ident *id)
{
    put_head(out, id, true);
    sl_str_appendf(
        out,
        ",\"choices\":[{\"index\":%d,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
        "\"logprobs\":null,\"finish_reason\":null}]",
        id->index);
    put_chunk_tail(out, id);
}

void sl_openai_usage_chunk_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                  int prompt_tokens, int completion_tokens)
{
    put_head(out, id, true);
    put_lit(out, ",\"choices\":[],");
    put_usage(out, id, prompt_tokens, completion_tokens);
    put_lit(out, "}");
}

const char *sl_openai_error_type(int http_code)
{
    switch (http_code) {
    case 401: return "invalid_request_error"; /* OpenAI's type for invalid_api_key */
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    default: break;
    }
    if (http_code >= 500)
        return "server_error";
    return "invalid_request_error";
}

void sl_openai_error_encode(struct sl_str *out, const struct sl_openai_error *e)
{
    put_lit(out, "{\"error\":{\"message\":");
    /* Messages quote client input, which need not be valid UTF-8 once truncated by snprintf;
     * most are plain ASCII and go as they are. */
    size_t len = strlen(e->message), i = 0;
    while (i < len && (unsigned char)e->message[i] < 0x80)
        i++;
    if (i == len) {
        put_str(out, e->message, len);
    } else {
        struct sl_str clean;
        sl_str_init(&clean);
        sl_utf8_sanitize(&clean, e->message, len);
        put_str(out, clean.p ? clean.p : "", clean.len);
        sl_str_dispose(&clean);
    }
    put_lit(out, ",\"type\":");
    /* A spent quota has a type of its own (OpenAI's insufficient_quota). */
    put_cstr(out, e->code && strcmp(e->code, "insufficient_quota") == 0
                      ? "insufficient_quota"
                      : sl_openai_error_type(e->http));
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

void sl_openai_model_encode(struct sl_str *out, const char *model_id, int max_len, int64_t created)
{
    put_lit(out, "{\"id\":");
    put_cstr(out, model_id);
    sl_str_appendf(out,
                   ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"sluice\","
                   "\"max_model_len\":%d}",
                   (long long)created, max_len);
}

void sl_openai_models_encode(struct sl_str *out, const char *const *ids, const int *max_lens, int n,
                             int64_t created)
{
    put_lit(out, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < n; i++) {
        if (i)
            put_lit(out, ",");
        sl_openai_model_encode(out, ids[i], max_lens[i], created);
    }
    put_lit(out, "]}");
}

void sl_openai_tokens_encode(struct sl_str *out, const int32_t *ids, int n, int max_len)
{
    sl_str_appendf(out, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":[", n, max_len);
    for (int i = 0; i < n; i++)
        sl_str_appendf(out, "%s%d", i ? "," : "", (int)ids[i]);
    put_lit(out, "]}");
}

void sl_openai_detokenized_encode(struct sl_str *out, const char *text, size_t len)
{
    put_lit(out, "{\"prompt\":");
    put_str(out, text, len);
    put_lit(out, "}");
}

/* ---------------------------------------------------------------------------------------------
 * Admission's headers
 */

#define NS_PER_S 1000000000LL
#define NS_PER_MS 1000000LL

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

void sl_openai_admission_headers(const struct sl_admit *a, struct sl_str *out)
{
    if (!a->ran)
        return;
    put_lit(out, "x-sluice-admission: ");
    sl_str_append(out, a->note, strlen(a->note));
    put_lit(out, "\r\n");
    if (a->budget_used >= 0 && (a->budget_warn || a->verdict == SL_ADMIT_OVER_BUDGET))
        sl_str_appendf(out, "x-sluice-budget: %s; used=%.2f\r\n",
                       a->verdict == SL_ADMIT_OVER_BUDGET ? "exhausted" : "warning",
                       a->budget_used);
    if (a->verdict == SL_ADMIT_OVER_BUDGET)
        put_lit(out, "x-should-retry: false\r\n"); /* what OpenAI's and Anthropic's SDKs obey */
    if ((a->verdict == SL_ADMIT_RATE_LIMITED || a->verdict == SL_ADMIT_OVERLOADED ||
         a->verdict == SL_ADMIT_OVER_BUDGET) &&
        a->retry_ns >= 0) {
        int64_t ns = a->retry_ns > 0 ? a->retry_ns : 1;
        put_lit(out, "Retry-After: ");
        sl_str_append_int(out, ceil_div(ns, NS_PER_S));
        put_lit(out, "\r\nretry-after-ms: ");
        sl_str_append_int(out, ceil_div(ns, NS_PER_MS));
        put_lit(out, "\r\n");
    }
}

void sl_openai_duration_format(int64_t ns, char *out, size_t outlen)
{
    if (ns <= 0) {
        snprintf(out, outlen, "0s");
        return;
    }
    long long ms = (ns + NS_PER_MS - 1) / NS_PER_MS;
    if (ms < 1000) {
        snprintf(out, outlen, "%lldms", ms);
        return;
    }
    long long h = ms / 3600000, m = ms / 60000 % 60, sec = ms / 1000 % 60, frac = ms % 1000;
    char s[16];
    if (frac == 0) {
        snprintf(s, sizeof s, "%lld", sec);
    } else {
        snprintf(s, sizeof s, "%lld.%03lld", sec, frac);
        size_t n = strlen(s);
        while (s[n - 1] == '0')
            s[--n] = '\0';
    }
    if (h)
        snprintf(out, outlen, "%lldh%lldm%ss", h, m, s);
    else if (m)
        snprintf(out, outlen, "%lldm%ss", m, s);
    else
        snprintf(out, outlen, "%ss", s);
}

/* OpenAI's x-ratelimit-{limit,remaining,reset}-WHAT for one per-minute budget. */
static void limit_headers(struct sl_str *out, const char *what, const struct sl_admit_budget *b)
{
    char reset[32];
    sl_openai_duration_format(b->reset_ns, reset, sizeof reset);
    sl_str_appendf(out,
                   "x-ratelimit-limit-%s: %lld\r\nx-ratelimit-remaining-%s: %lld\r\n"
                   "x-ratelimit-reset-%s: %s\r\n",
                   what, b->limit, what, (long long)b->remaining, what, reset);
}

void sl_openai_ratelimit_headers(const struct sl_tenancy *ten, const struct sl_tenant *t,
                                 int64_t now_ns, struct sl_str *out)
{
    struct sl_admit_budget requests, tokens;
    if (!sl_admit_budgets(ten, t, now_ns, &requests, &tokens))
        return;
    if (requests.limit > 0)
        limit_headers(out, "requests", &requests);
    if (tokens.limit > 0)
        limit_headers(out, "tokens", &tokens);
}
