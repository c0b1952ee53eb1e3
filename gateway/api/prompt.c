/* Which model a request names, and its prompts as token ids: a completion's prompts as given, or
 * chat messages rendered with the model's chat template. Each request's prompts are tokenized once
 * per model: admission, parking and submit reuse the ids kept in the exchange's arena.
 */
#include "api_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool api_engine_is(const struct engine *e, const char *id, size_t n)
{
    return (n == strlen(e->name) && memcmp(id, e->name, n) == 0) ||
           (e->alias && n == strlen(e->alias) && memcmp(id, e->alias, n) == 0);
}

int api_route_model(struct api_exchange *a, const char *model, struct sl_openai_error *err)
{
    const struct sl_api *api = a->t->api;
    if (!model)
        return 0;
    for (int i = 0; i < api->n_engines; i++)
        if (api_engine_is(&api->engines[i], model, strlen(model)))
            return i;
    char list[256];
    size_t n = 0;
    list[0] = '\0';
    for (int i = 0; i < api->n_engines && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s'%s'", i ? ", " : "",
                              api->engines[i].name);
    sl_openai_error_set(err, 404, "model", "model_not_found",
                        "The model '%.200s' does not exist or you do not have access to it. This "
                        "server serves %s.",
                        model, list);
    return -1;
}

enum sl_chat_template api_chat_template(const struct api_exchange *a, const struct engine *en)
{
    const char *name = sl_config_api(a->cfg)->chat_template;
    int t = name ? sl_chat_template_from_name(name) : -1;
    return t >= 0 ? (enum sl_chat_template)t : en->chat_template;
}

/* The selected prompt's token ids for engine e into t->ids: the prompt as it is, or the messages
 * rendered with the chat template, checked against the model's context for max_tokens. */
static int encode_prompt(struct api_exchange *a, int e, int max_tokens, int *n_ids,
                         struct sl_openai_error *err)
{
    const struct engine *en = &a->t->api->engines[e];
    const struct sl_model *m = en->model;
    const struct sl_openai_completion *oc = &a->oc;
    int seq_len = sl_model_config(m)->seq_len;
    if (sl_openai_check_vocab(oc, sl_model_config(m)->vocab_size, err) != SL_OK)
        return SL_EINVAL;
    if (oc->messages == NULL)
        return sl_openai_prompt_ids(oc, sl_model_tok(m), seq_len, max_tokens, a->t->ids, n_ids,
                                    err);
    struct sl_chat_prompt p;
    sl_chat_prompt_init(&p);
    sl_chat_render(&p, api_chat_template(a, en), oc->messages, oc->n_messages);
    int st = sl_chat_prompt_encode(sl_model_tok(m), seq_len, &p, max_tokens, a->t->ids, n_ids, err);
    sl_chat_prompt_dispose(&p);
    return st;
}

void api_release_prompts(struct api_exchange *a)
{
    for (int i = 0; i < a->n_prompts; i++) {
        sl_req_prompt_unref(a->prompts[i]);
        a->prompts[i] = NULL;
    }
    a->n_prompts = 0;
    a->ids_engine = -1;
}

int api_encode_prompts(struct api_exchange *a, int e, int max_tokens, int *n_prompt,
                       struct sl_openai_error *err)
{
    struct sl_openai_completion *oc = &a->oc;
    int n_prompts = oc->n_prompts > 1 ? oc->n_prompts : 1;
    int total = 0;
    if (a->ids_engine == e) {
        /* Tokenized for this model already: only the context check depends on max_tokens. */
        int seq_len = sl_model_config(a->t->api->engines[e].model)->seq_len;
        const char *param = oc->messages ? "messages" : "prompt";
        for (int i = 0; i < n_prompts; i++) {
            int n = sl_req_prompt_n(a->prompts[i]);
            if (sl_openai_check_context(seq_len, n, false, max_tokens, param, err) != SL_OK)
                return SL_EINVAL;
            total += n;
        }
        *n_prompt = total;
        return SL_OK;
    }
    api_release_prompts(a);
    if (!a->prompts)
        a->prompts = sl_arena_calloc(&a->x->arena, (size_t)n_prompts, sizeof *a->prompts);
    int st = SL_OK;
    for (int i = 0; i < n_prompts && st == SL_OK; i++) {
        int n = 0;
        if (n_prompts > 1)
            sl_openai_prompt_select(oc, i);
        st = encode_prompt(a, e, max_tokens, &n, err);
        if (st == SL_OK) {
            a->prompts[a->n_prompts++] = sl_req_prompt_copy(a->t->ids, n);
            total += n;
        }
    }
    if (n_prompts > 1)
        sl_openai_prompt_select(oc, 0);
    if (st != SL_OK) {
        api_release_prompts(a);
        return st;
    }
    a->ids_engine = e;
    *n_prompt = total;
    return SL_OK;
}

/* ---- the prefix cache's key ---- */

/* One field of the key's input, at b + at (when b is not NULL): a tag, then a 4-byte big-endian
 * length and the bytes; returns the end. The tag and the length make every input one sequence
 * of fields only: "ab" + "c" never hashes as "a" + "bc", nor a salt as the other salt. */
static size_t put_field(unsigned char *b, size_t at, unsigned char tag, const void *p, size_t n)
{
    if (b) {
        b[at] = tag;
        for (int i = 0; i < 4; i++)
            b[at + 1 + (size_t)i] = (unsigned char)(n >> (24 - 8 * i));
        if (n)
            memcpy(b + at + 5, p, n);
    }
    return at + 5 + n;
}

/* What the key hashes, into b (NULL: only its size is computed). */
static size_t key_input(unsigned char *b, const char *model, enum sl_config_prefix_scope scope,
                        const char *tenant, struct sl_strv pck, struct sl_strv salt)
{
    static const char version[] = "sluice prefix cache 1";
    size_t at = put_field(b, 0, 'v', version, sizeof version - 1);
    at = put_field(b, at, 'm', model, strlen(model));
    /* Global scope's identity is its tag alone: no tenant's name, whatever it is, makes it. */
    if (scope == SL_CONFIG_PREFIX_GLOBAL)
        at = put_field(b, at, 'g', NULL, 0);
    else
        at = put_field(b, at, 't', tenant, strlen(tenant));
    if (pck.p)
        at = put_field(b, at, 'k', pck.p, pck.len);
    if (salt.p)
        at = put_field(b, at, 's', salt.p, salt.len);
    return at;
}

uint64_t sl_api_cache_key(const char *model, enum sl_config_prefix_scope scope, const char *tenant,
                          struct sl_strv prompt_cache_key, struct sl_strv cache_salt)
{
    /* Names are at most 64 bytes and salts 256 (both bounded where they are read): the stack
     * buffer holds every input the server makes; a larger one still hashes, from the heap. */
    unsigned char buf[1024], h[32];
    size_t n = key_input(NULL, model, scope, tenant, prompt_cache_key, cache_salt);
    unsigned char *b = n <= sizeof buf ? buf : sl_xmalloc(n);
    key_input(b, model, scope, tenant, prompt_cache_key, cache_salt);
    sl_tenant_sha256(b, n, h);
    if (b != buf)
        free(b);
    uint64_t k = 0;
    for (int i = 0; i < 8; i++)
        k = k << 8 | h[i];
    return k;
}

void api_cache_params(const struct api_exchange *a, int e, struct sl_req_params *p)
{
    const struct sl_config_prefix_cache *pc = &sl_config_api(a->cfg)->prefix_cache;
    p->cache_prefix = pc->enabled;
    p->cache_key = 0;
    if (!pc->enabled)
        return;
    const struct sl_tenant *t = a->tenant ? a->tenant : &sl_tenant_anonymous;
    p->cache_key = sl_api_cache_key(a->t->api->engines[e].name, pc->scope, t->name,
                                    a->oc.prompt_cache_key, a->oc.cache_salt);
}

int api_predict_cached(struct api_exchange *a, int e, int replica)
{
    struct sl_req_params p;
    api_cache_params(a, e, &p);
    struct sl_sched *s = a->t->api->engines[e].sched[replica];
    if (!p.cache_prefix || !s || a->ids_engine != e)
        return 0;
    int n = 0;
    for (int i = 0; i < a->n_prompts; i++)
        n += sl_sched_prefix_match(s, p.cache_key, sl_req_prompt_ids(a->prompts[i]),
                                   sl_req_prompt_n(a->prompts[i]));
    return n;
}

void api_echo_prompt(struct sl_str *out, const struct sl_openai_completion *oc,
                     const struct sl_tok *tok, const int32_t *ids, int n)
{
    if (oc->prompt) {
        sl_str_append(out, oc->prompt, oc->prompt_len);
        return;
    }
    struct sl_detok *d = sl_detok_new(tok, -1, NULL, 0);
    if (oc->params.keep_special)
        sl_detok_keep_special(d);
    for (int i = 0; i < n; i++)
        sl_detok_push(d, ids[i], out, NULL);
    sl_detok_finish(d, out);
    sl_detok_free(d);
}
