/* The route table, like nginx's locations: each route names its path, the methods it takes, the
 * key it needs and the API it speaks, and its handler. The small routes' handlers are here
 * (models, probes, metrics, admin, tokenize); completions are completion.c's, messages
 * anthropic.c's.
 */
#include "api_impl.h"

#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void serve_models(struct api_exchange *a);
static void serve_model(struct api_exchange *a);
static void serve_metrics(struct api_exchange *a);
static void serve_healthz(struct api_exchange *a);
static void serve_admin_config(struct api_exchange *a);
static void serve_admin_slo(struct api_exchange *a);
static void serve_tokenize(struct api_exchange *a);

/* A path's length is part of its entry, measured at compile time. */
#define ROUTE(path, ...)                                                                           \
    {                                                                                              \
        path, sizeof path - 1, __VA_ARGS__                                                         \
    }

/* Exact paths first, then prefixes (a path ending with '/'), each list in the order looked at. */
static const struct api_route routes[] = {
    ROUTE("/v1/chat/completions", METHOD_POST, GUARD_TENANT, API_OPENAI, "/v1/chat/completions",
          api_serve_completion),
    ROUTE("/v1/completions", METHOD_POST, GUARD_TENANT, API_OPENAI, "/v1/completions",
          api_serve_completion),
    ROUTE("/v1/messages", METHOD_POST, GUARD_TENANT, API_ANTHROPIC, "/v1/messages",
          api_serve_messages),
    ROUTE("/v1/models", METHOD_GET, GUARD_TENANT, API_OPENAI, "/v1/models", serve_models),
    ROUTE("/tokenize", METHOD_POST, GUARD_TENANT, API_OPENAI, "/tokenize", serve_tokenize),
    ROUTE("/detokenize", METHOD_POST, GUARD_TENANT, API_OPENAI, "/detokenize", serve_tokenize),
    ROUTE("/metrics", METHOD_GET, GUARD_METRICS, API_OPENAI, "/metrics", serve_metrics),
    ROUTE("/healthz", METHOD_GET, GUARD_NONE, API_OPENAI, "/healthz", serve_healthz),
    ROUTE("/readyz", METHOD_GET, GUARD_NONE, API_OPENAI, "/readyz", api_serve_ready),
    ROUTE("/admin/config", METHOD_GET, GUARD_ADMIN, API_OPENAI, "/admin/config",
          serve_admin_config),
    ROUTE("/admin/usage", METHOD_GET, GUARD_ADMIN, API_OPENAI, "/admin/usage",
          api_serve_admin_usage),
    ROUTE("/admin/slo", METHOD_GET, GUARD_ADMIN, API_OPENAI, "/admin/slo", serve_admin_slo),
    ROUTE("/admin/stats", METHOD_GET, GUARD_ADMIN, API_OPENAI, "/admin/stats",
          api_serve_admin_stats),
    ROUTE("/dashboard", METHOD_GET, GUARD_NONE, API_OPENAI, "/dashboard", api_serve_dashboard),
    ROUTE("/dashboard/app.js", METHOD_GET, GUARD_NONE, API_OPENAI, "/dashboard",
          api_serve_dashboard),
    ROUTE("/dashboard/app.css", METHOD_GET, GUARD_NONE, API_OPENAI, "/dashboard",
          api_serve_dashboard),
    ROUTE("/v1/usage", METHOD_GET, GUARD_TENANT, API_OPENAI, "/v1/usage", api_serve_own_usage),
    ROUTE("/v1/models/", METHOD_GET, GUARD_TENANT, API_OPENAI, "/v1/models/{id}", serve_model),
    /* Any other /admin/ URL: the admin key first, then a 404. */
    ROUTE("/admin/", 0, GUARD_ADMIN, API_OPENAI, SL_METRICS_OTHER, NULL),
};

const struct api_route *api_route_find(const struct sl_exchange *x)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const struct api_route *r = &routes[i];
        size_t n = r->path_len;
        if (r->path[n - 1] == '/') {
            if (x->path.len >= n && memcmp(x->path.p, r->path, n) == 0 &&
                (x->path.len > n || !r->serve))
                return r;
        } else if (x->path.len == n && memcmp(x->path.p, r->path, n) == 0) {
            return r;
        }
    }
    return NULL;
}

const char *api_route_label(const struct api_exchange *a)
{
    return a->x->parsed && a->route ? a->route->label : SL_METRICS_OTHER;
}

static void unknown_url(struct api_exchange *a)
{
    struct sl_openai_error err;
    const struct sl_exchange *x = a->x;
    int n = x->path.len > 200 ? 200 : (int)x->path.len;
    sl_openai_error_set(&err, 404, NULL, "unknown_url", "Invalid URL (%s %.*s).", x->method_name, n,
                        x->path.p);
    api_send_error(a, &err, NULL);
}

/* The admin key: tenant keys do not open the admin routes. */
static bool admin_guard(struct api_exchange *a)
{
    struct sl_openai_error err;
    const char *key = NULL;
    size_t len = 0;
    bool has_key = api_request_key(a, &key, &len);
    const struct sl_tenancy *ten = sl_config_tenancy(a->cfg);
    if (!ten->has_admin_key) {
        sl_openai_error_set(&err, 403, NULL, "admin_disabled",
                            "The admin API is disabled: the configuration has no "
                            "admin_key_sha256.");
        api_send_error(a, &err, NULL);
        return false;
    }
    if (!sl_tenant_admin_check(ten, has_key ? key : NULL, len)) {
        api_unauthorized(a, has_key, key, len);
        return false;
    }
    return true;
}

/* Probes need no key, nor does the scrape unless metrics_key_sha256 is set (as in vLLM). */
static bool guard(struct api_exchange *a, enum api_guard g)
{
    switch (g) {
    case GUARD_NONE: return true;
    case GUARD_ADMIN: return admin_guard(a);
    case GUARD_METRICS: {
        const char *key = NULL;
        size_t len = 0;
        bool has_key = api_request_key(a, &key, &len);
        if (sl_tenant_metrics_check(sl_config_tenancy(a->cfg), has_key ? key : NULL, len))
            return true;
        api_unauthorized(a, has_key, key, len);
        return false;
    }
    case GUARD_TENANT: return api_authenticate(a);
    }
    return false;
}

void api_route(struct api_exchange *a)
{
    struct sl_exchange *x = a->x;
    const struct api_route *r = a->route;
    if (!guard(a, r ? r->guard : GUARD_TENANT))
        return;
    if (x->body_skipped) {
        /* on_head refused it; the guard above answers the same for the same head. */
        api_unauthorized(a, false, NULL, 0);
        return;
    }
    if (!r || !r->serve) {
        unknown_url(a);
        return;
    }
    if (r->methods == METHOD_POST && x->method != HTTP_POST) {
        api_not_allowed(a, "POST");
        return;
    }
    if (r->methods == METHOD_GET && !sl_exchange_is_get(x)) {
        api_not_allowed(a, "GET, HEAD");
        return;
    }
    r->serve(a);
}

/* ---- models ---- */

static void serve_models(struct api_exchange *a)
{
    const struct sl_api *api = a->t->api;
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    int lens[SL_MODELS_MAX];
    for (int i = 0; i < api->n_engines; i++)
        lens[i] = sl_model_config(api->engines[i].model)->seq_len;
    sl_openai_models_encode(b, api->engine_names, lens, api->n_engines, api->created);
    api_send_json(a, 200, b, NULL);
}

static void serve_model(struct api_exchange *a)
{
    static const char models[] = "/v1/models/";
    const struct sl_api *api = a->t->api;
    struct sl_str *b = &a->t->out;
    struct sl_openai_error err;
    const char *want = a->x->path.p + sizeof models - 1;
    size_t n = a->x->path.len - (sizeof models - 1);
    sl_str_clear(b);
    for (int i = 0; i < api->n_engines; i++)
        if (api_engine_is(&api->engines[i], want, n)) {
            sl_openai_model_encode(b, api->engines[i].name,
                                   sl_model_config(api->engines[i].model)->seq_len, api->created);
            api_send_json(a, 200, b, NULL);
            return;
        }
    sl_openai_error_set(&err, 404, "model", "model_not_found", "The model '%.*s' does not exist.",
                        (int)(n > 200 ? 200 : n), want);
    api_send_error(a, &err, NULL);
}

/* ---- operators ---- */

static void serve_healthz(struct api_exchange *a)
{
    static const char ok[] = "{\"status\":\"ok\"}";
    api_send(a, 200, "application/json", NULL, ok, sizeof ok - 1);
}

void api_serve_ready(struct api_exchange *a)
{
    const struct sl_api *api = a->t->api;
    struct sl_openai_error err;
    if (sl_exchange_draining(a->x) || (api->server && sl_http_server_draining(api->server))) {
        sl_openai_error_set(&err, 503, NULL, "draining", "The server is shutting down.");
    } else if (api->n_engines == 0 || !api->engines[0].model || !api->engines[0].sched[0]) {
        sl_openai_error_set(&err, 503, NULL, "not_ready",
                            "This server has no engine to run completions.");
    } else {
        static const char ok[] = "{\"status\":\"ready\"}";
        api_send(a, 200, "application/json", NULL, ok, sizeof ok - 1);
        return;
    }
    api_send_error(a, &err, NULL);
}

static void serve_metrics(struct api_exchange *a)
{
    const struct sl_api *api = a->t->api;
    struct sl_sched_stats st[SL_MODELS_MAX * SL_REPLICAS_MAX];
    const char *names[SL_MODELS_MAX * SL_REPLICAS_MAX];
    int replicas[SL_MODELS_MAX * SL_REPLICAS_MAX];
    int n = 0;
    bool several = false;
    for (int i = 0; i < api->n_engines; i++)
        for (int r = 0; r < api->engines[i].n_replicas; r++) {
            sl_sched_stats(api->engines[i].sched[r], &st[n]);
            names[n] = api->engines[i].name;
            replicas[n++] = r;
            several |= r > 0;
        }
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    sl_metrics_render_models(api->metrics, names, several ? replicas : NULL, st, n, b);
    if (sl_config_api(a->cfg)->vllm_metrics)
        sl_metrics_render_vllm(names, st, n, sl_config_api(a->cfg)->prefix_cache.enabled,
                               b); /* from the same snapshot as sluice's gauges */
    sl_admit_render(sl_config_tenancy(a->cfg), b);
    if (api->fleet)
        sl_str_appendf(
            b,
            "# HELP sluice:redis_up 1 while the fleet's budgets are decided in Redis, 0 while this "
            "replica admits on its local share (Redis lost or not answering).\n"
            "# TYPE sluice:redis_up gauge\nsluice:redis_up %d\n"
            "# HELP sluice:fleet_replicas Replicas alive in the fleet at this replica's latest "
            "heartbeat (0 before any).\n# TYPE sluice:fleet_replicas gauge\n"
            "sluice:fleet_replicas %d\n"
            "# HELP sluice:fleet_local_total Admission decisions taken on this replica's local "
            "share because Redis did not answer.\n# TYPE sluice:fleet_local_total counter\n"
            "sluice:fleet_local_total %lld\n"
            "# HELP sluice:fleet_pending Requests waiting for Redis's answer to their budget "
            "check.\n# TYPE sluice:fleet_pending gauge\nsluice:fleet_pending %d\n"
            "# HELP sluice:fleet_usage_unsent_total Usage records that could not be sent to the "
            "fleet's ledger in Redis (this replica's ledger and journal keep them).\n"
            "# TYPE sluice:fleet_usage_unsent_total counter\nsluice:fleet_usage_unsent_total "
            "%lld\n",
            atomic_load_explicit(&api->fleet_up, memory_order_relaxed),
            atomic_load_explicit(&api->fleet_replicas, memory_order_relaxed),
            atomic_load_explicit(&api->fleet_local, memory_order_relaxed),
            atomic_load_explicit(&api->fleet_pending, memory_order_relaxed),
            atomic_load_explicit(&api->fleet_unsent, memory_order_relaxed));
    api_send(a, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b->p, b->len);
}

/* GET /admin/config: the configuration this request started with, the current one. */
static void serve_admin_config(struct api_exchange *a)
{
    json_t *j = sl_config_to_json(a->cfg);
    char *s = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!s) /* jansson failed to allocate: the style's answer to that is to stop */
        abort();
    api_send(a, 200, "application/json", NULL, s, strlen(s));
    free(s);
}

/* GET /admin/slo: each tier's objectives and, per tenant, attainment, latency quantiles, refusals
 * and degradations over the last 1, 5 and 60 minutes (sl_metrics_slo_json). */
static void serve_admin_slo(struct api_exchange *a)
{
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    sl_metrics_slo_json(a->t->api->metrics, sl_config_tenancy(a->cfg), sl_clock_ns(), b);
    api_send_json(a, 200, b, NULL);
}

/* ---- tokenize ---- */

/* vLLM's POST /tokenize and /detokenize: what a model's tokenizer makes of a prompt or of chat
 * messages (rendered with the chat template a completion would use), and the text of ids. Not
 * inference: no admission, no engine. A prompt longer than the context is still tokenized
 * (count above max_model_len says so). */
static void serve_tokenize(struct api_exchange *a)
{
    bool detokenize = sl_exchange_path_is(a->x, "/detokenize");
    const struct sl_api *api = a->t->api;
    struct sl_openai_error err;
    struct sl_openai_tokenize t;
    if (sl_openai_tokenize_decode(&t, a->x->body.p, a->x->body.len, detokenize, &err) != SL_OK) {
        api_send_error(a, &err, NULL);
        return;
    }
    int e = api_route_model(a, t.c.model, &err);
    if (e < 0) {
        sl_openai_tokenize_dispose(&t);
        api_send_error(a, &err, NULL);
        return;
    }
    const struct engine *en = &api->engines[e];
    const struct sl_tok *tok = sl_model_tok(en->model);
    int max_len = sl_model_config(en->model)->seq_len;
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    if (detokenize) {
        int vocab = sl_model_config(en->model)->vocab_size;
        for (int i = 0; i < t.n_tokens; i++)
            if (t.tokens[i] >= vocab) {
                char at[32];
                snprintf(at, sizeof at, "tokens[%d]", i);
                sl_openai_error_set(&err, 400, at, "invalid_value",
                                    "Invalid '%s': token id %d is not in this model's vocabulary "
                                    "(ids 0 to %d).",
                                    at, (int)t.tokens[i], vocab - 1);
                sl_openai_tokenize_dispose(&t);
                api_send_error(a, &err, NULL);
                return;
            }
        struct sl_str text;
        sl_str_init(&text);
        struct sl_detok *d = sl_detok_new(tok, -1, NULL, 0);
        for (int i = 0; i < t.n_tokens; i++)
            sl_detok_push(d, t.tokens[i], &text, NULL);
        sl_detok_finish(d, &text);
        sl_detok_free(d);
        sl_openai_detokenized_encode(b, text.p ? text.p : "", text.len);
        sl_str_dispose(&text);
    } else {
        /* Room for every byte as a token, plus BOS and the chat markers. */
        size_t cap = (t.chat ? 0 : t.c.prompt_len) + 2;
        struct sl_chat_prompt p;
        sl_chat_prompt_init(&p);
        if (t.chat) {
            sl_chat_render(&p, api_chat_template(a, en), t.c.messages, t.c.n_messages);
            cap = p.text.len + (size_t)p.n_segs + 2;
        }
        int32_t *ids = sl_xmalloc(sizeof *ids * cap);
        int n = 0, st;
        if (t.chat)
            st = sl_chat_prompt_encode(tok, (int)cap, &p, 0, ids, &n, &err);
        else
            st = sl_tok_encode(tok, t.c.prompt, t.c.prompt_len, t.add_special, ids, (int)cap, &n);
        sl_chat_prompt_dispose(&p);
        if (st != SL_OK && !t.chat)
            sl_openai_error_set(&err, 400, "prompt", "invalid_value",
                                "Invalid 'prompt': it could not be tokenized (%s).",
                                st == SL_EINVAL ? "not valid UTF-8" : sl_status_str(st));
        if (st != SL_OK) {
            free(ids);
            sl_openai_tokenize_dispose(&t);
            api_send_error(a, &err, NULL);
            return;
        }
        sl_openai_tokens_encode(b, ids, n, max_len);
        free(ids);
    }
    sl_openai_tokenize_dispose(&t);
    api_send_json(a, 200, b, NULL);
}
