/* Which model a request names, and its prompts as token ids: a completion's prompts as given, or
 * chat messages rendered with the model's chat template. Each request's prompts are tokenized once
 * per model: admission, parking and submit reuse the ids kept in the exchange's arena.
 */
#include "api_impl.h"

#include <stdio.h>
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
