/* The API as the HTTP server's handler: its state and its I/O threads' (each with the outbox its
 * schedulers post to), the life of an exchange's API state, and answering: the headers every
 * answer carries, errors in each API's shape, metrics and the access log at a request's end.
 */
#include "api_impl.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* The fleet's heartbeat: every BEAT_MS thread 0 says this replica is alive; a replica silent for
 * BEAT_TTL_MS counts as gone. */
#define BEAT_MS 1000
#define BEAT_TTL_MS 3000

/* ---- answering ---- */

static void str_add(struct sl_str *w, const char *lit)
{
    sl_str_append(w, lit, strlen(lit));
}

const char *api_headers(struct api_exchange *a, const char *extra)
{
    struct sl_str *w = &a->t->hdr;
    sl_str_clear(w);
    if (a->tier >= 0) {
        str_add(w, "X-Sluice-Tier: ");
        str_add(w, sl_config_tenancy(a->cfg)->tiers[a->tier].sched.name);
        str_add(w, "\r\n");
    }
    /* What admission did, and the tenant's budgets on every response of a tenant with limits. */
    sl_openai_admission_headers(&a->adm, w);
    if (a->tenant && (a->tenant->rpm > 0 || a->tenant->tpm > 0))
        sl_openai_ratelimit_headers(sl_config_tenancy(a->cfg), a->tenant, (int64_t)sl_clock_ns(),
                                    w);
    if (a->metered) {
        str_add(w, "x-sluice-cost: ");
        str_add(w, a->cost);
        str_add(w, "\r\n");
    }
    if (extra)
        str_add(w, extra);
    return w->p ? w->p : "";
}

/* The tier and tenant the request is accounted to: "none" for a request refused before
 * authentication or classification decided them. */
static void request_labels(const struct api_exchange *a, const char **tier, const char **tenant)
{
    *tier = a->tier >= 0 ? sl_config_tenancy(a->cfg)->tiers[a->tier].sched.name : "none";
    *tenant = a->tenant ? a->tenant->name : "none";
}

/* What admission did to the request, for the SLO windows: refused (with its reason) or admitted
 * degraded, counted under the tier whose policy decided. */
static void admission_end(const struct api_exchange *a, struct sl_metrics_request *r)
{
    const struct sl_admit *adm = &a->adm;
    if (!adm->ran)
        return;
    r->policy_tier = sl_config_tenancy(a->cfg)->tiers[adm->policy_tier].sched.name;
    if (adm->verdict == SL_ADMIT_RATE_LIMITED || adm->verdict == SL_ADMIT_OVERLOADED ||
        adm->verdict == SL_ADMIT_OVER_BUDGET)
        r->refused = adm->reason;
    else if (adm->verdict == SL_ADMIT_OK)
        r->degraded = adm->degraded_by;
}

/* Every request once, at its end: by route and status, and an inference request also by tier,
 * tenant and outcome, with its tokens and latencies, and its tier's objectives' verdict (v, left
 * zeroed when it does not count: it never reached an engine, or it was cancelled). */
static void metrics_request_end(struct api_exchange *a, const char *finish, int n_completion,
                                uint64_t now, struct sl_slo_verdict *v)
{
    struct sl_exchange *x = a->x;
    struct sl_metrics *m = a->t->api->metrics;
    memset(v, 0, sizeof *v);
    sl_metrics_http_done(m, a->t->idx, api_route_label(a), x->status);
    if (!a->inference)
        return;
    a->inference = false;
    struct sl_metrics_request r = {
        .outcome = sl_metrics_outcome_of(finish, x->status),
        .engine = a->n_ch > 0,
        .prompt_tokens = a->n_prompt,
        .completion_tokens = n_completion,
        .ttft_seconds = -1,
        .e2e_seconds = (double)(now - x->t_start_ns) / 1e9,
        .queue_seconds = -1,
    };
    request_labels(a, &r.tier, &r.tenant);
    uint64_t q;
    if (a->n_ch > 0 && a->ch[0].req && sl_req_queue_ns(a->ch[0].req, &q))
        r.queue_seconds = (double)q / 1e9;
    if (a->metered) {
        r.model = a->t->api->engines[a->engine].name;
        r.cost = a->usage.cost;
        r.device_ns = a->usage.device_ns;
    }
    if (a->t_first_ns) {
        r.ttft_seconds = (double)(a->t_first_ns - x->t_start_ns) / 1e9;
    } else if (r.engine && n_completion > 0) {
        /* Its only token ended it (an end-of-sequence token has no text): it came at the end. */
        r.ttft_seconds = r.e2e_seconds;
        sl_metrics_observe_ttft(m, a->t->idx, r.tier, r.ttft_seconds);
    }
    if (r.engine && r.outcome != SL_METRICS_OUTCOME_CANCELLED && a->tier >= 0) {
        const struct sl_sched_tier *tier = &sl_config_tenancy(a->cfg)->tiers[a->tier].sched;
        struct sl_slo_request q = {
            .failed =
                r.outcome != SL_METRICS_OUTCOME_STOP && r.outcome != SL_METRICS_OUTCOME_LENGTH,
            .ttft_ns = a->t_first_ns ? (int64_t)(a->t_first_ns - x->t_start_ns) : -1,
            .e2e_ns = (int64_t)(now - x->t_start_ns),
            .completion_tokens = n_completion,
        };
        sl_slo_judge(tier->ttft_slo_ms, tier->tpot_slo_ms, &q, v);
        r.slo = *v;
    }
    admission_end(a, &r);
    r.now_ns = now;
    sl_metrics_request_done(m, a->t->idx, &r);
}

void api_log_end(struct api_exchange *a, const char *finish, int n_completion)
{
    struct sl_exchange *x = a->x;
    if (x->logged)
        return;
    x->t_end_ns = sl_clock_ns();
    struct sl_slo_verdict v;
    metrics_request_end(a, finish, n_completion, x->t_end_ns, &v);
    struct sl_http_log *g = &x->log;
    g->tenant = a->tenant ? a->tenant->name : NULL;
    g->tier = a->tier >= 0 ? sl_config_tenancy(a->cfg)->tiers[a->tier].sched.name : NULL;
    if (a->adm.ran) {
        g->admission = a->adm.note;
        g->predicted_ttft_ms = a->adm.predicted_ttft_s >= 0 ? a->adm.predicted_ttft_s * 1e3 : -1;
    }
    if (a->n_ch > 0 || finish) {
        const struct engine *en = &a->t->api->engines[a->engine];
        g->engine = true;
        g->model = en->name;
        g->replica = a->n_ch > 0 && en->n_replicas > 1 ? a->replica : -1;
        g->id = a->ident.id;
        g->prompt_tokens = a->n_prompt;
        g->completion_tokens = n_completion;
        g->finish = finish;
        g->n = a->n_ch;
        g->ttft_ns = a->t_first_ns ? a->t_first_ns - x->t_start_ns : 0;
        g->slo = v.mark[SL_SLO_OBJECTIVE_BOTH] != SL_SLO_MARK_NONE;
        g->ttft_met = v.mark[SL_SLO_OBJECTIVE_TTFT] == SL_SLO_MARK_NONE
                          ? -1
                          : v.mark[SL_SLO_OBJECTIVE_TTFT] == SL_SLO_MARK_MET;
        g->tpot_met = v.mark[SL_SLO_OBJECTIVE_TPOT] == SL_SLO_MARK_NONE
                          ? -1
                          : v.mark[SL_SLO_OBJECTIVE_TPOT] == SL_SLO_MARK_MET;
        if (a->metered) {
            g->cost = a->cost;
            g->device_ns = (uint64_t)a->usage.device_ns;
        }
    }
    sl_http_log_access(x);
}

void api_send(struct api_exchange *a, int status, const char *ctype, const char *extra,
              const char *body, size_t len)
{
    const char *hdr = api_headers(a, extra);
    /* The status goes to the log before the head is written (sl_http_send sets it too). */
    a->x->status = status;
    api_log_end(a, NULL, 0);
    sl_http_send(a->x, status, ctype, hdr, body, len);
}

void api_send_json(struct api_exchange *a, int status, const struct sl_str *body, const char *extra)
{
    api_send(a, status, "application/json", extra, body->p ? body->p : "", body->len);
}

void api_send_error(struct api_exchange *a, const struct sl_openai_error *e, const char *extra)
{
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    if (a->kind == API_ANTHROPIC)
        sl_anthropic_error_encode(b, e);
    else
        sl_openai_error_encode(b, e);
    api_send_json(a, e->http, b, extra);
}

void api_not_allowed(struct api_exchange *a, const char *allow)
{
    struct sl_openai_error err;
    char extra[64];
    sl_openai_error_set(&err, 405, NULL, "method_not_allowed",
                        "Method %s is not allowed on this URL; use %s.", a->x->method_name, allow);
    snprintf(extra, sizeof extra, "Allow: %s\r\n", allow);
    api_send_error(a, &err, extra);
}

/* ---- keys ---- */

static bool read_key(const struct api_exchange *a, const char **key, size_t *len)
{
    struct sl_strv v;
    if (sl_exchange_header(a->x, "authorization", &v) && v.len)
        return sl_http_bearer(v.p, v.len, key, len);
    /* Anthropic's SDKs send the key as x-api-key; any route takes it (as LiteLLM does). */
    if (sl_exchange_header(a->x, "x-api-key", &v) && v.len) {
        *key = v.p;
        *len = v.len;
        return true;
    }
    return false;
}

bool api_request_key(struct api_exchange *a, const char **key, size_t *len)
{
    if (!a->key_read) {
        a->key_read = true;
        a->has_key = read_key(a, &a->key, &a->key_len);
    }
    *key = a->has_key ? a->key : NULL;
    *len = a->has_key ? a->key_len : 0;
    return a->has_key;
}

void api_unauthorized(struct api_exchange *a, bool has_key, const char *key, size_t len)
{
    struct sl_openai_error err;
    char shown[16];
    if (has_key) {
        sl_tenant_key_redact(key, len, shown, sizeof shown);
        sl_openai_error_set(&err, 401, NULL, "invalid_api_key", "Incorrect API key provided: %s.",
                            shown);
    } else {
        sl_openai_error_set(&err, 401, NULL, "invalid_api_key",
                            "You didn't provide an API key. Send it in an Authorization header "
                            "using Bearer auth (Authorization: Bearer YOUR_KEY).");
    }
    api_send_error(a, &err, "WWW-Authenticate: Bearer\r\n");
}

bool api_authenticate(struct api_exchange *a)
{
    const char *key = NULL;
    size_t len = 0;
    bool has_key = api_request_key(a, &key, &len);
    if (!a->head_keyed)
        a->tenant = sl_tenant_lookup(sl_config_tenancy(a->cfg), has_key ? key : NULL, len);
    a->head_keyed = true;
    if (a->tenant)
        return true;
    api_unauthorized(a, has_key, key, len);
    return false;
}

/* ---- the handler ---- */

static struct api_exchange *exchange_state(struct sl_exchange *x)
{
    struct api_exchange *a = x->data;
    if (a)
        return a;
    a = sl_arena_calloc(&x->arena, 1, sizeof *a);
    a->x = x;
    a->t = x->thread;
    a->cfg = x->cfg;
    a->tier = -1;
    a->ids_engine = -1;
    a->adm.predicted_ttft_s = -1; /* sl_admit_init's state, but for the zeroing done above */
    a->adm.raw_ttft_s = -1;
    a->route = x->path.len ? api_route_find(x) : NULL;
    a->kind = a->route ? a->route->kind : API_OPENAI;
    x->data = a;
    return a;
}

/* The head is whole: a route that needs a key the request lacks is refused before its body is
 * read. The tenant found is kept for the route (head_keyed); the admin and metrics keys, rarer,
 * the route checks again. */
static enum sl_http_head on_head(struct sl_exchange *x)
{
    struct api_exchange *a = exchange_state(x);
    enum api_guard guard = a->route ? a->route->guard : GUARD_TENANT;
    if (guard == GUARD_NONE)
        return SL_HTTP_HEAD_READ; /* probes: no key is read */
    const char *key = NULL;
    size_t len = 0;
    bool has_key = api_request_key(a, &key, &len);
    const struct sl_tenancy *ten = sl_config_tenancy(a->cfg);
    bool ok;
    switch (guard) {
    case GUARD_METRICS: ok = sl_tenant_metrics_check(ten, has_key ? key : NULL, len); break;
    case GUARD_ADMIN:
        ok = !ten->has_admin_key || sl_tenant_admin_check(ten, has_key ? key : NULL, len);
        break;
    default:
        a->tenant = sl_tenant_lookup(ten, has_key ? key : NULL, len);
        a->head_keyed = true;
        ok = a->tenant != NULL;
        break;
    }
    return ok ? SL_HTTP_HEAD_READ : SL_HTTP_HEAD_REFUSE;
}

static void on_request(struct sl_exchange *x)
{
    api_route(exchange_state(x));
}

static void on_error(struct sl_exchange *x, int status, const char *code, const char *message,
                     const char *extra)
{
    struct api_exchange *a = exchange_state(x);
    struct sl_openai_error err;
    sl_openai_error_set(&err, status, NULL, code, "%s", message);
    api_send_error(a, &err, extra);
}

static void on_writable(struct sl_exchange *x)
{
    struct api_exchange *a = x->data;
    if (a && a->n_ch > 0 && a->stream)
        api_stream_release(a);
}

static void on_close(struct sl_exchange *x, bool cancel)
{
    struct api_exchange *a = x->data;
    if (!a)
        return;
    if (a->usage_call) {
        sl_fleet_call_cancel(a->usage_call);
        a->usage_call = NULL;
    }
    api_drop_request(a, cancel);
    if (a->adm_timer) {
        event_free(a->adm_timer);
        a->adm_timer = NULL;
    }
    for (int i = 0; i < a->n_ch; i++) {
        sl_str_dispose(&a->ch[i].text);
        sl_str_dispose(&a->ch[i].held);
        free(a->ch[i].lp);
    }
}

static void on_cancel(struct sl_exchange *x)
{
    if (x->data)
        api_cancel(x->data);
}

static void on_reload(void *ctx, struct sl_config *next, const struct sl_config *prev)
{
    struct sl_api *api = ctx;
    /* Buckets and queue counts of the tenants and tiers both configurations have carry over. */
    sl_admit_adopt(sl_config_tenancy_mut(next), sl_config_tenancy(prev), (int64_t)sl_clock_ns());
    /* Every model's scheduler takes the new tier table through its inbox. */
    struct sl_sched_tier tiers[SL_SCHED_MAX_TIERS];
    int n_tiers = sl_config_sched_tiers(next, tiers, SL_SCHED_MAX_TIERS);
    for (int i = 0; i < api->n_engines; i++)
        for (int r = 0; r < api->engines[i].n_replicas; r++)
            sl_sched_set_tiers(api->engines[i].sched[r], tiers, n_tiers);
}

/* ---- I/O threads ---- */

static void outbox_wake(void *arg)
{
    struct api_thread *t = arg;
    event_active(t->wake_ev, EV_READ, 0);
}

/* Thread 0 of a fleet: says this replica is alive, and publishes how many are (the divisor of the
 * local shares should Redis go). */
static void on_beat(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct api_thread *t = arg;
    struct sl_api *api = t->api;
    char key[SL_FLEET_PREFIX_MAX + 16];
    snprintf(key, sizeof key, "%sreplicas", api->fleet_prefix);
    int n = sl_fleet_client_replicas(t->fleet);
    if (n > 0)
        atomic_store_explicit(&api->fleet_replicas, n, memory_order_relaxed);
    sl_fleet_beat(t->fleet, key, api->fleet_id, BEAT_TTL_MS);
}

static void fleet_thread_start(struct api_thread *t)
{
    struct sl_api *api = t->api;
    t->fleet = sl_fleet_client_new(t->base, &api->fleet_addr, api->fleet_timeout_ms);
    if (t->idx != 0)
        return;
    t->beat_ev = event_new(t->base, -1, EV_PERSIST, on_beat, t);
    if (!t->beat_ev)
        abort();
    struct timeval tv = {BEAT_MS / 1000, BEAT_MS % 1000 * 1000};
    event_add(t->beat_ev, &tv);
}

static void *thread_start(void *ctx, struct event_base *base, int idx)
{
    struct sl_api *api = ctx;
    api->serving = true;
    struct api_thread *t = sl_xcalloc(1, sizeof *t);
    t->api = api;
    t->idx = idx;
    t->base = base;
    sl_str_init(&t->out);
    sl_str_init(&t->hdr);
    t->wake_ev = event_new(base, -1, 0, api_on_wake, t);
    if (!t->wake_ev)
        abort();
    t->outbox = sl_outbox_new(outbox_wake, t);
    sl_str_init(&t->journal_buf);
    /* Prompt scratch for the longest context of the models served. */
    int seq_len = 1;
    for (int i = 0; i < api->n_engines; i++)
        if (api->engines[i].model && sl_model_config(api->engines[i].model)->seq_len > seq_len)
            seq_len = sl_model_config(api->engines[i].model)->seq_len;
    t->ids = sl_xmalloc(sizeof *t->ids * (size_t)seq_len);
    if (api->fleet)
        fleet_thread_start(t);
    return t;
}

/* Usage records of the requests that ended since, before any of their responses' bytes go. */
static void before_write(void *arg)
{
    struct api_thread *t = arg;
    if (t->journal_buf.len && t->api->journal)
        sl_usage_journal_write(t->api->journal, &t->journal_buf);
    sl_str_clear(&t->journal_buf);
}

/* Events already delivered belong to exchanges that are gone: they are freed. The last usage
 * records go to the journal. */
static void thread_stop(void *arg)
{
    api_on_wake(-1, 0, arg);
    before_write(arg);
}

static void thread_free(void *arg)
{
    struct api_thread *t = arg;
    api_on_wake(-1, 0, t);
    if (t->beat_ev)
        event_free(t->beat_ev);
    sl_fleet_client_free(t->fleet);
    event_free(t->wake_ev);
    sl_outbox_free(t->outbox);
    sl_str_dispose(&t->out);
    sl_str_dispose(&t->hdr);
    sl_str_dispose(&t->journal_buf);
    api_webhooks_free(t);
    free(t->ids);
    free(t);
}

/* ---- the API ---- */

/* The fleet's settings, read once at start (the section is start-only). */
static void fleet_init(struct sl_api *a, const struct sl_config_fleet *fc)
{
    char err[256];
    if (!fc->url || sl_fleet_addr_parse(fc->url, &a->fleet_addr, err, sizeof err) != SL_OK)
        return; /* the configuration checked the URL when it was loaded */
    a->fleet = true;
    const char *pw = fc->password_env ? getenv(fc->password_env) : NULL;
    if (!a->fleet_addr.password[0] && pw && *pw) {
        if (strlen(pw) < sizeof a->fleet_addr.password)
            snprintf(a->fleet_addr.password, sizeof a->fleet_addr.password, "%s", pw);
        else
            sl_log(SL_LOG_ERROR, "fleet: $%s is longer than %zu bytes: not sent to redis",
                   fc->password_env, sizeof a->fleet_addr.password - 1);
    }
    snprintf(a->fleet_prefix, sizeof a->fleet_prefix, "%s", fc->key_prefix ? fc->key_prefix : "");
    a->fleet_timeout_ms = fc->timeout_ms;
    char host[64] = "sluice";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    snprintf(a->fleet_id, sizeof a->fleet_id, "%s:%ld:%08x", host, (long)getpid(), a->nonce);
}

struct sl_api *sl_api_new(struct sl_config *cfg)
{
    struct sl_api *a = sl_xcalloc(1, sizeof *a);
    a->h = (struct sl_http_handler){
        .ctx = a,
        .thread_start = thread_start,
        .thread_stop = thread_stop,
        .thread_free = thread_free,
        .on_head = on_head,
        .on_request = on_request,
        .on_error = on_error,
        .on_writable = on_writable,
        .on_close = on_close,
        .on_cancel = on_cancel,
        .on_reload = on_reload,
        .before_write = before_write,
    };
    int io_threads = sl_config_http(cfg)->io_threads;
    a->n_shards = io_threads > 0 ? io_threads : 1;
    a->metrics = sl_metrics_new(a->n_shards);
    a->created = sl_clock_unix();
    if (getrandom(&a->nonce, sizeof a->nonce, GRND_NONBLOCK) != (ssize_t)sizeof a->nonce)
        a->nonce = (uint32_t)sl_clock_ns();
    sl_admit_adopt(sl_config_tenancy_mut(cfg), NULL, (int64_t)sl_clock_ns());
    a->cfg0 = cfg;
    atomic_init(&a->fleet_replicas, 0);
    atomic_init(&a->fleet_up, 1);
    atomic_init(&a->fleet_local, 0);
    atomic_init(&a->fleet_pending, 0);
    atomic_init(&a->fleet_unsent, 0);
    a->ledger = sl_usage_ledger_new();
    fleet_init(a, sl_config_fleet(cfg));
    return a;
}

void sl_api_free(struct sl_api *a)
{
    if (!a)
        return;
    sl_metrics_free(a->metrics);
    sl_usage_ledger_free(a->ledger);
    for (int i = 0; i < a->n_engines; i++)
        free(a->engines[i].alias);
    free(a);
}

const struct sl_http_handler *sl_api_handler(struct sl_api *a)
{
    return &a->h;
}

void sl_api_set_server(struct sl_api *a, struct sl_http_server *s)
{
    a->server = s;
}

struct sl_usage_ledger *sl_api_ledger(struct sl_api *a)
{
    return a->ledger;
}

void sl_api_set_journal(struct sl_api *a, struct sl_usage_journal *j)
{
    a->journal = j;
}

enum sl_status sl_api_add_model(struct sl_api *a, const char *name, const struct sl_model *model,
                                struct sl_sched *sched, char *err, size_t errlen)
{
    const struct sl_config_model *m0 = &sl_config_engine(a->cfg0)->models[0];
    bool first = a->n_engines == 0;
    if (first && !name)
        name = m0->name ? m0->name : model ? sl_model_id(model) : NULL;
    if (a->serving || a->n_engines >= SL_MODELS_MAX || !name || !model) {
        snprintf(err, errlen, "cannot serve model \"%s\": at most %d models, added before start",
                 name ? name : "?", SL_MODELS_MAX);
        return SL_EINVAL;
    }
    for (int i = 0; i < a->n_engines; i++)
        if (strcmp(a->engines[i].name, name) == 0) {
            snprintf(err, errlen, "two models are named \"%s\"", name);
            return SL_EINVAL;
        }
    struct engine *e = &a->engines[a->n_engines];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->model = model;
    e->sched[0] = sched;
    e->n_replicas = sched ? 1 : 0;
    for (int r = 0; r < SL_REPLICAS_MAX; r++)
        atomic_init(&e->in_flight[r], 0);
    e->chat_template = sl_chat_template_of_model(model);
    if (first && !m0->name && strcmp(m0->spec, e->name) != 0)
        e->alias = sl_xstrdup(m0->spec);
    a->engine_names[a->n_engines++] = e->name;
    return SL_OK;
}

enum sl_status sl_api_add_replica(struct sl_api *a, const char *name, struct sl_sched *sched,
                                  char *err, size_t errlen)
{
    for (int i = 0; i < a->n_engines && !a->serving; i++) {
        struct engine *e = &a->engines[i];
        if (strcmp(e->name, name) != 0)
            continue;
        if (e->n_replicas < 1 || e->n_replicas >= SL_REPLICAS_MAX || !sched)
            break;
        e->sched[e->n_replicas++] = sched;
        return SL_OK;
    }
    snprintf(err, errlen,
             "cannot add a replica of model \"%s\": not served, at most %d replicas, added "
             "before start",
             name ? name : "?", SL_REPLICAS_MAX);
    return SL_EINVAL;
}
