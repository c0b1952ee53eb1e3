/* Fuzz target: request JSON validation of both endpoints (sl_openai_completion_decode and
 * sl_openai_chat_decode, gateway/api/openai_decode.c), and what the gateway does next with a
 * request that passes: the prompt tokenized or the messages rendered with every chat template and
 * tokenized, with the context check. Any refusal must be a 4xx whose error object (as sent) is
 * valid JSON; an accepted request's parameters must be inside their documented ranges; and the
 * response encoders, given the request's own text, must write JSON that reads back to that text.
 * The same body is also decoded as a /tokenize or /detokenize request.
 *
 * Input: byte 0 picks the endpoint (bit 0: chat; bit 1: detokenize) and default_max_tokens, the
 * rest is the body. */
#include "gateway_impl.h"

#include "fuzz.h"

#include <math.h>

static struct sl_model *model;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    sl_log_set_level(SL_LOG_ERROR);
    char err[256];
    if (sl_model_load("synthetic", NULL, &model, err, sizeof err) != SL_OK) {
        fprintf(stderr, "fuzz_openai: %s\n", err);
        abort();
    }
    return 0;
}

/* The error as the gateway sends it must be a JSON error object with the same status class. */
static void check_error(const struct sl_openai_error *e, bool client)
{
    fuzz_check(client ? e->http >= 400 && e->http < 500 : e->http >= 400, "status %d", e->http);
    fuzz_check(e->message[0] != '\0', "an error without a message");
    struct sl_str out;
    sl_str_init(&out);
    sl_openai_error_encode(&out, e);
    json_error_t je;
    json_t *j = json_loadb(out.p, out.len, 0, &je);
    fuzz_check(j != NULL, "error body is not JSON (%s): %s", je.text, out.p);
    json_t *o = json_object_get(j, "error");
    fuzz_check(json_is_string(json_object_get(o, "message")) &&
                   json_is_string(json_object_get(o, "type")),
               "error body lacks message or type: %s", out.p);
    json_decref(j);
    sl_str_dispose(&out);
}

/* A chunk and a whole response carrying text must read back as that text. */
static void check_encoders(const char *text, size_t len, bool chat)
{
    struct sl_openai_ident id = {.id = "cmpl-fuzz", .created = 1, .model = sl_model_id(model)};
    id.api = chat ? SL_OPENAI_API_CHAT : SL_OPENAI_API_COMPLETIONS;
    struct sl_str out;
    sl_str_init(&out);
    for (int whole = 0; whole < 2; whole++) {
        sl_str_clear(&out);
        if (whole)
            sl_openai_completion_encode(&out, &id, text, len, SL_FINISH_LENGTH, 3, 4, NULL);
        else
            sl_openai_chunk_encode(&out, &id, text, len, SL_FINISH_NONE, NULL);
        json_error_t je;
        json_t *j = json_loadb(out.p, out.len, JSON_ALLOW_NUL, &je);
        fuzz_check(j != NULL, "encoded response is not JSON (%s)", je.text);
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        json_t *t =
            chat ? json_object_get(json_object_get(c, whole ? "message" : "delta"), "content")
                 : json_object_get(c, "text");
        fuzz_check(json_is_string(t) && json_string_length(t) == len &&
                       memcmp(json_string_value(t), text, len) == 0,
                   "the text does not read back");
        json_decref(j);
    }
    sl_str_dispose(&out);
}

static void check_params(const struct sl_openai_completion *c)
{
    const struct sl_req_params *p = &c->params;
    fuzz_check(p->max_tokens >= 1, "max_tokens %d", p->max_tokens);
    fuzz_check(p->temperature >= 0.0f && p->temperature <= 2.0f, "temperature %g",
               (double)p->temperature);
    fuzz_check(p->top_p > 0.0f && p->top_p <= 1.0f, "top_p %g", (double)p->top_p);
    fuzz_check(p->min_p >= 0.0f && p->min_p <= 1.0f, "min_p %g", (double)p->min_p);
    fuzz_check(p->top_k >= 0, "top_k %d", p->top_k);
    fuzz_check(p->n_stop >= 0 && p->n_stop <= SL_REQ_MAX_STOPS, "n_stop %d", p->n_stop);
    for (int i = 0; i < p->n_stop; i++)
        fuzz_check(p->stop[i] != NULL, "stop[%d] is NULL", i);
    fuzz_check(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f &&
                   p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f &&
                   p->repetition_penalty >= 0.0f,
               "penalties %g %g %g", (double)p->frequency_penalty, (double)p->presence_penalty,
               (double)p->repetition_penalty);
    fuzz_check(p->n_bias >= 0 && p->n_bias <= SL_REQ_MAX_LOGIT_BIAS, "n_bias %d", p->n_bias);
    fuzz_check(p->top_logprobs >= 0 && p->top_logprobs <= SL_MAX_TOP_LOGPROBS &&
                   (p->logprobs || p->top_logprobs == 0),
               "logprobs %d, top_logprobs %d", p->logprobs, p->top_logprobs);
    for (int i = 0; i < p->n_bias; i++)
        fuzz_check(p->bias_ids[i] >= 0 && p->bias[i] >= -100.0f && p->bias[i] <= 100.0f,
                   "logit_bias[%d]: %d -> %g", i, (int)p->bias_ids[i], (double)p->bias[i]);
    fuzz_check(p->min_tokens >= 0 && p->min_tokens <= p->max_tokens, "min_tokens %d of %d",
               p->min_tokens, p->max_tokens);
    fuzz_check(p->n_stop_ids >= 0 && p->n_stop_ids <= SL_REQ_MAX_STOP_IDS, "n_stop_ids %d",
               p->n_stop_ids);
    for (int i = 0; i < p->n_stop_ids; i++)
        fuzz_check(p->stop_ids[i] >= 0, "stop_token_ids[%d]: %d", i, (int)p->stop_ids[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool chat = data[0] & 1;
    /* Chat's default may be 0 (up to the context, decided after encoding: max_tokens_open). */
    int default_max_tokens = (data[0] >> 1) + (chat ? 0 : 1);
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    const struct sl_model_config *mc = sl_model_config(model);
    const struct sl_tok *tok = sl_model_tok(model);

    struct sl_openai_completion c;
    struct sl_openai_error err;
    /* The same body as a /tokenize or /detokenize request. */
    struct sl_openai_tokenize t;
    bool detok = data[0] & 2;
    if (sl_openai_tokenize_decode(&t, body, len, detok, &err) != SL_OK) {
        check_error(&err, true);
    } else {
        for (int i = 0; detok && i < t.n_tokens; i++)
            fuzz_check(t.tokens[i] >= 0, "token %d", (int)t.tokens[i]);
        fuzz_check(detok || t.chat || t.c.prompt != NULL, "a tokenize request without a prompt");
        fuzz_check(!t.chat || t.c.n_messages >= 1, "a tokenize request without messages");
        sl_openai_tokenize_dispose(&t);
    }
    int st =
        chat ? sl_openai_chat_decode(&c, body, len, sl_model_id(model), default_max_tokens, &err)
             : sl_openai_completion_decode(&c, body, len, sl_model_id(model), default_max_tokens,
                                           &err);
    if (st != SL_OK) {
        check_error(&err, true);
        fuzz_check(c.root == NULL && c.messages == NULL, "a refused request keeps its parts");
        return 0;
    }
    check_params(&c);
    fuzz_check(c.n >= 1 && c.n <= SL_OPENAI_N_MAX, "n %d", c.n);
    fuzz_check(c.best_of == 0 || c.best_of == c.n, "best_of %d with n %d", c.best_of, c.n);
    fuzz_check(!c.max_tokens_open || (chat && default_max_tokens == 0),
               "max_tokens left open without a chat default of 0");
    /* The prefix cache's salts: absent, or 1 to SL_OPENAI_CACHE_SALT_MAX bytes that key it. */
    const struct sl_strv *salts[2] = {&c.prompt_cache_key, &c.cache_salt};
    for (int k = 0; k < 2; k++)
        fuzz_check(salts[k]->p ? salts[k]->len >= 1 && salts[k]->len <= SL_OPENAI_CACHE_SALT_MAX
                               : salts[k]->len == 0,
                   "salt %d of %zu bytes", k, salts[k]->len);
    (void)sl_api_cache_key(sl_model_id(model), SL_CONFIG_PREFIX_TENANT, "fuzz", c.prompt_cache_key,
                           c.cache_salt);
    if (sl_openai_check_vocab(&c, mc->vocab_size, &err) != SL_OK)
        check_error(&err, true);
    int32_t *ids = malloc(sizeof *ids * (size_t)mc->seq_len);
    int n = 0;
    if (!chat) {
        fuzz_check(c.n_prompts >= 1 && c.n_prompts <= SL_OPENAI_N_MAX &&
                       (c.n_prompts == 1 || c.n_prompts * c.n <= SL_OPENAI_N_MAX),
                   "%d prompts, n %d", c.n_prompts, c.n);
        for (int k = 0; k < c.n_prompts; k++) {
            sl_openai_prompt_select(&c, k);
            fuzz_check((c.prompt != NULL) != (c.prompt_ids != NULL), "prompt %d is neither", k);
            fuzz_check(!c.prompt_ids || c.n_prompt_ids >= 1, "%d prompt ids given", c.n_prompt_ids);
            for (int i = 0; i < c.n_prompt_ids; i++)
                fuzz_check(c.prompt_ids[i] >= 0, "prompt id %d", (int)c.prompt_ids[i]);
            if (c.prompt)
                check_encoders(c.prompt, c.prompt_len, false);
            st = sl_openai_prompt_ids(&c, tok, mc->seq_len, c.params.max_tokens, ids, &n, &err);
            if (st != SL_OK)
                check_error(&err, true);
            else
                fuzz_check(n >= 1 && n + c.params.max_tokens <= mc->seq_len, "%d prompt ids", n);
        }
    } else {
        fuzz_check(c.n_messages >= 1 && c.messages, "a chat without messages");
        for (int i = 0; i < c.n_messages; i++)
            check_encoders(c.messages[i].content, c.messages[i].len, true);
        struct sl_chat_prompt p;
        sl_chat_prompt_init(&p);
        for (int t = 0; t < SL_CHAT_TEMPLATE_COUNT; t++) {
            sl_chat_render(&p, (enum sl_chat_template)t, c.messages, c.n_messages);
            size_t covered = 0;
            for (int s = 0; s < p.n_segs; s++) {
                fuzz_check(p.segs[s].off == covered, "segments leave a gap");
                covered += p.segs[s].len;
            }
            fuzz_check(covered == p.text.len, "segments cover %zu of %zu bytes", covered,
                       p.text.len);
            st = sl_chat_prompt_encode(tok, mc->seq_len, &p, c.params.max_tokens, ids, &n, &err);
            if (st != SL_OK)
                check_error(&err, true);
            else
                fuzz_check(n >= 1 && n + c.params.max_tokens <= mc->seq_len, "%d chat ids", n);
        }
        sl_chat_prompt_dispose(&p);
    }
    free(ids);
    sl_openai_completion_dispose(&c);
    return 0;
}
