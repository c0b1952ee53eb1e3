/* A completion's life: decode, route to a model, classify into a tier, admission (which may
 * park it), submit each choice to a replica's scheduler, then the scheduler's events (text and
 * ends) until the answer is whole. OpenAI's completions and chat completions run here, and so do
 * Anthropic's messages (anthropic.c decodes them and writes their objects).
 */
#include "api_impl.h"

#include <event2/event.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static uint64_t random_seed(struct api_thread *t)
{
    uint64_t seed;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed)
        return seed;
    /* No entropy yet (early boot): distinct per request is all sampling needs. */
    return sl_clock_ns() ^ (t->n_req * 0x9e3779b97f4a7c15ull);
}

/* ---- the end of a request ---- */

/* The end of the completion for admission: its parking timer stops and whatever it was charged
 * and did not use goes back (sl_admit_end does that once, however often this runs).
 * n_generated < 0: it never reached a scheduler. */
static void admit_release(struct api_exchange *a, int n_generated)
{
    a->adm.cost = a->metered ? a->usage.cost : 0;
    if (a->adm_timer)
        evtimer_del(a->adm_timer);
    if (a->fleet_call) {
        sl_fleet_call_cancel(a->fleet_call); /* a charge it made is given back by the client */
        a->fleet_call = NULL;
        atomic_fetch_sub_explicit(&a->t->api->fleet_pending, 1, memory_order_relaxed);
    }
    a->parked = false;
    sl_admit_end(&a->adm, n_generated, (int64_t)sl_clock_ns());
    /* With a fleet, the end settles in one call: what the buckets (and the budget) get back, and
     * the usage added to the fleet's ledger. */
    struct sl_admit_fleet_call refund;
    int n = a->t->fleet ? sl_admit_fleet_refund(&a->adm, a->t->api->fleet_prefix, &refund) : 0;
    bool usage = a->t->fleet && a->metered && !a->usage_sent;
    if (n > 0 || usage) {
        struct sl_usage_key_usage ku = {.key = a->usage_key, .usage = a->usage};
        bool sent =
            sl_fleet_settle(a->t->fleet, refund.b, n, a->t->api->fleet_prefix, usage ? &ku : NULL);
        if (usage && !sent)
            atomic_fetch_add_explicit(&a->t->api->fleet_unsent, 1, memory_order_relaxed);
        a->usage_sent |= usage;
    }
    api_release_prompts(a);
    if (a->has_oc) {
        sl_openai_completion_dispose(&a->oc);
        a->has_oc = false;
    }
}

/* Lets go of the choices: the engine's sequences (cancelled first when `cancel`, those not done),
 * their in_flight counts, and their text. Events still on their way find no exchange and are
 * just freed. */
static void release_choices(struct api_exchange *a, bool cancel)
{
    struct engine *en = &a->t->api->engines[a->engine];
    for (int i = 0; i < a->n_ch; i++) {
        struct choice *ch = &a->ch[i];
        if (!ch->req)
            continue;
        if (cancel && !ch->done)
            sl_sched_cancel(en->sched[a->replica], ch->req);
        atomic_fetch_sub_explicit(&en->in_flight[a->replica], 1, memory_order_relaxed);
        sl_req_set_user(ch->req, NULL);
        sl_req_unref(ch->req);
        ch->req = NULL;
        sl_str_clear(&ch->text);
        sl_str_clear(&ch->held);
        ch->n_lp = 0;
    }
    a->n_live = 0;
}

int api_cached_tokens(const struct api_exchange *a)
{
    /* usage.prompt_tokens counts each prompt once, though each of its n choices prefills it: of
     * each prompt, the tokens every one of its choices found cached (choices started together
     * each compute what was not cached before them, so they mostly agree). */
    int total = 0, n = a->per_prompt > 0 ? a->per_prompt : 1;
    for (int p = 0; p * n < a->n_ch; p++) {
        int least = -1;
        for (int j = p * n; j < (p + 1) * n && j < a->n_ch; j++) {
            int c = a->ch[j].req ? sl_req_cached_tokens(a->ch[j].req) : 0;
            least = least < 0 || c < least ? c : least;
        }
        total += least > 0 ? least : 0;
    }
    return total;
}

/* The request ended after reaching an engine (finished, failed, or its client left): its usage,
 * priced as the configuration it started with says, goes to the ledger, to this thread's batch
 * for the journal (written before any response of the batch reaches a socket) and, through
 * api_log_end, to the access log and the metrics. Once. */
static void meter(struct api_exchange *a, int n_completion)
{
    if (a->metered || a->n_ch == 0)
        return;
    struct sl_api *api = a->t->api;
    a->metered = true;
    struct sl_usage *u = &a->usage;
    memset(u, 0, sizeof *u);
    u->requests = 1;
    u->prompt_tokens = a->n_prompt;
    u->cached_tokens = api_cached_tokens(a);
    a->ident.cached_tokens = (int)u->cached_tokens;
    u->completion_tokens = n_completion;
    for (int i = 0; i < a->n_ch; i++)
        if (a->ch[i].req)
            u->device_ns += (int64_t)sl_req_device_ns(a->ch[i].req);
    u->cost = sl_usage_cost(sl_config_model_price(a->cfg, a->engine), u);
    sl_usage_money_format(u->cost, a->cost, sizeof a->cost);
    a->ident.cost = a->cost;
    struct sl_usage_key k;
    const char *tier = a->tier >= 0 ? sl_config_tenancy(a->cfg)->tiers[a->tier].sched.name : "";
    sl_usage_key_set(&k, a->tenant ? a->tenant->name : sl_tenant_anonymous.name,
                     api->engines[a->engine].name, tier, sl_usage_hour(sl_clock_unix()));
    sl_usage_ledger_add(api->ledger, &k, u);
    a->usage_key = k;
    if (api->journal)
        sl_usage_journal_record(&a->t->journal_buf, &k, u);
}

void api_drop_request(struct api_exchange *a, bool cancel)
{
    if (cancel && a->parked && !a->x->logged) {
        a->x->status = 499; /* its client left while it waited for capacity */
        api_log_end(a, "cancelled", 0);
    }
    bool ran = a->n_ch > 0 && a->ch[0].req;
    if (ran && cancel)
        meter(a, a->n_gen); /* what it cost settles its budget */
    admit_release(a, ran ? a->n_gen : -1);
    if (!ran)
        return;
    if (cancel) {
        a->x->status = 499; /* nginx's "client closed request" */
        meter(a, a->n_gen);
        api_log_end(a, "cancelled", a->n_gen);
    }
    release_choices(a, cancel);
}

/* ---- classification and admission ---- */

/* Puts the completion into a tier; the tier goes with it to the scheduler. */
static int classify(struct api_exchange *a, struct sl_openai_completion *oc,
                    struct sl_openai_error *err)
{
    struct sl_strv h = {0};
    bool has = sl_exchange_header(a->x, SL_TIER_HEADER, &h);
    struct sl_tier_request rq = {
        .header = has ? h.p : NULL,
        .header_len = has ? h.len : 0,
        .service_tier = oc->service_tier,
        .path = a->x->path.p,
        .path_len = a->x->path.len,
        .stream = oc->stream,
        .max_tokens = oc->params.max_tokens,
    };
    const struct sl_tenancy *ten = sl_config_tenancy(a->cfg);
    int tier;
    struct sl_admit_error why;
    int st = sl_tier_classify(ten, a->tenant, &rq, &tier, &why);
    if (st != SL_OK) {
        sl_openai_error_from_admit(err, &why);
        return st;
    }
    a->tier = tier;
    oc->params.tier = tier;
    oc->params.sched_tier = ten->tiers[tier].sched;
    const struct sl_tenant *tn = a->tenant ? a->tenant : &sl_tenant_anonymous;
    snprintf(oc->params.tenant, sizeof oc->params.tenant, "%s", tn->name);
    oc->params.share = tn->share;
    return SL_OK;
}

/* The replica of engine en a request goes to now: the fewest requests in flight, then the
 * fewest queued prompt tokens, then the lowest index. out (when not NULL) gets its stats. */
static int pick_replica(struct engine *en, struct sl_sched_stats *out)
{
    if (en->n_replicas == 1) {
        if (out)
            sl_sched_stats(en->sched[0], out);
        return 0;
    }
    struct sl_sched_stats tmp, best_st;
    int best = 0, best_n = INT_MAX;
    for (int r = 0; r < en->n_replicas; r++) {
        int n = atomic_load_explicit(&en->in_flight[r], memory_order_relaxed);
        if (n > best_n)
            continue;
        sl_sched_stats(en->sched[r], &tmp);
        if (n < best_n || tmp.queued_prompt_tokens < best_st.queued_prompt_tokens) {
            best = r;
            best_n = n;
            best_st = tmp;
        }
    }
    if (out)
        *out = best_st;
    return best;
}

static void admit_env_stats(void *ctx, int model, struct sl_sched_stats *out)
{
    struct api_exchange *a = ctx;
    struct sl_api *api = a->t->api;
    if (model >= 0 && model < api->n_engines && api->engines[model].sched[0])
        pick_replica(&api->engines[model], out);
}

/* The prompt's tokens for model i and what of them its prefix cache holds now, on the replica
 * the request would go to now (which submit picks again: a prediction either way). */
static int admit_env_encode(void *ctx, int model, int max_tokens, int *n_prompt, int *n_cached)
{
    struct api_exchange *a = ctx;
    struct sl_openai_error err;
    struct sl_api *api = a->t->api;
    if (model < 0 || model >= api->n_engines || !api->engines[model].sched[0])
        return SL_ENOENT;
    int st = api_encode_prompts(a, model, max_tokens, n_prompt, &err);
    if (st == SL_OK)
        *n_cached = api_predict_cached(a, model, pick_replica(&api->engines[model], NULL));
    return st;
}

static const struct sl_usage_price *admit_env_price(void *ctx, int model)
{
    struct api_exchange *a = ctx;
    return sl_config_model_price(a->cfg, model);
}

static int64_t admit_env_spent(void *ctx, const char *tenant, int64_t from, int64_t to)
{
    struct api_exchange *a = ctx;
    struct sl_usage u;
    sl_usage_ledger_sum(a->t->api->ledger, tenant, from, to, &u);
    return u.cost;
}

static struct sl_admit_env admit_env(struct api_exchange *a)
{
    struct sl_api *api = a->t->api;
    return (struct sl_admit_env){
        .n_models = api->n_engines,
        .model_names = api->engine_names,
        .ctx = a,
        .stats = admit_env_stats,
        .encode = admit_env_encode,
        .price = admit_env_price,
        .spent = admit_env_spent,
        .unix_s = sl_clock_unix(),
    };
}

static void on_admit_timer(evutil_socket_t fd, short what, void *arg);
static void admission_decided(struct api_exchange *a, enum sl_admit_verdict v);

/* Whether the fleet's budgets are Redis's (up) or this replica's shares: one log line at each
 * change, whichever I/O thread sees it. */
static void fleet_state(struct sl_api *api, bool up, const char *why)
{
    if (!up)
        atomic_fetch_add_explicit(&api->fleet_local, 1, memory_order_relaxed);
    if (atomic_exchange_explicit(&api->fleet_up, up, memory_order_relaxed) == (int)up)
        return;
    int n = atomic_load_explicit(&api->fleet_replicas, memory_order_relaxed);
    if (up)
        sl_log(SL_LOG_INFO, "fleet: redis answers again: budgets are the fleet's again (what was "
                            "admitted on local shares meanwhile is not charged to it)");
    else
        sl_log(SL_LOG_WARN,
               "fleet: no answer from redis (%s): admitting on this replica's share, each limit "
               "÷ %d replica%s",
               why ? why : "?", n > 1 ? n : 1, n > 1 ? "s" : "");
}

static void on_fleet_answer(void *arg, enum sl_status st, const struct sl_fleet_take *t,
                            const char *err)
{
    struct api_exchange *a = arg;
    struct sl_api *api = a->t->api;
    if (a->fleet_call) /* else answered at once, never counted */
        atomic_fetch_sub_explicit(&api->fleet_pending, 1, memory_order_relaxed);
    a->fleet_call = NULL;
    fleet_state(api, st == SL_OK, err);
    struct sl_admit_env env = admit_env(a);
    int replicas = atomic_load_explicit(&api->fleet_replicas, memory_order_relaxed);
    admission_decided(a, sl_admit_fleet_answer(&a->adm, &env, st == SL_OK ? t : NULL, replicas,
                                               (int64_t)sl_clock_ns()));
}

/* SL_ADMIT_FLEET: one take of every bucket the request touches. The request waits like a parked
 * one (its client may leave, a drain may turn it away) until the answer, or the client's timeout,
 * which the fallback answers. */
static void ask_fleet(struct api_exchange *a)
{
    struct sl_admit_fleet_call call;
    a->parked = true;
    sl_admit_fleet_take(&a->adm, a->t->api->fleet_prefix, &call);
    /* The answer may come at once (no connection), a may be gone after it: not touched then. */
    struct sl_api *api = a->t->api;
    struct sl_fleet_call *c = sl_fleet_take(a->t->fleet, call.b, call.n, on_fleet_answer, a);
    if (c) {
        a->fleet_call = c;
        atomic_fetch_add_explicit(&api->fleet_pending, 1, memory_order_relaxed);
    }
}

/* Hands the admitted request to its model's scheduler, as admission left it (tier, model,
 * max_tokens). */
static void submit(struct api_exchange *a)
{
    struct api_thread *t = a->t;
    struct sl_api *api = t->api;
    struct sl_openai_completion *oc = &a->oc;
    struct sl_openai_error err;
    const struct sl_admit *adm = &a->adm;
    int n_prompts = oc->n_prompts > 1 ? oc->n_prompts : 1;
    int n_prompt;
    /* The ids computed for admission, unless it moved the request to another model. */
    if (api_encode_prompts(a, adm->model, adm->max_tokens, &n_prompt, &err) != SL_OK) {
        admit_release(a, -1);
        api_send_error(a, &err, NULL);
        return;
    }
    a->engine = adm->model;
    struct engine *en = &api->engines[a->engine];
    if (adm->tier != a->tier) {
        /* Demoted: it runs, and says it runs, in the tier admission chose. */
        a->tier = adm->tier;
        oc->params.tier = adm->tier;
        oc->params.sched_tier = sl_config_tenancy(a->cfg)->tiers[adm->tier].sched;
    }
    oc->params.max_tokens = adm->max_tokens;
    /* Keyed for the model it runs on, under the configuration it started with. */
    api_cache_params(a, a->engine, &oc->params);
    t->n_req++;
    a->stream = oc->stream;
    a->include_usage = oc->stream && oc->include_usage;
    a->want_lp = oc->params.logprobs;
    /* Choices in OpenAI's order: prompt p's choice j has index p · n + j. */
    int n = oc->n > 1 ? oc->n : 1, total = n_prompts * n;
    a->ch = sl_arena_calloc(&a->x->arena, (size_t)total, sizeof *a->ch);
    a->per_prompt = n;
    /* Choice j's seed is the request's plus j: the same seed gives the same n answers, and
     * choice 0 the answer of the same request with n = 1 (and with this prompt alone). */
    uint64_t seed = oc->has_seed ? oc->params.seed : 0;
    a->replica = pick_replica(en, NULL);
    a->n_ch = a->n_live = 0;
    for (int i = 0; i < total; i++) {
        struct choice *ch = &a->ch[i];
        struct sl_req_prompt *prompt = a->prompts[i / n];
        if (n_prompts > 1 && i % n == 0)
            sl_openai_prompt_select(oc, i / n); /* echo writes the selected prompt */
        oc->params.seed = oc->has_seed ? seed + (uint64_t)(i % n) : random_seed(t);
        struct sl_req *r = sl_req_new(sl_req_prompt_ref(prompt), &oc->params);
        sl_req_set_user(r, a);
        int st = sl_sched_submit(en->sched[a->replica], r, t->outbox);
        if (st != SL_OK) {
            sl_req_set_user(r, NULL);
            sl_req_unref(r);
            release_choices(a, true);
            admit_release(a, -1);
            sl_openai_error_set(&err, sl_http_status_code(st), NULL, NULL,
                                "The request could not be queued: %s.", sl_status_str(st));
            sl_log(SL_LOG_WARN, "io %d: submit failed: %s", t->idx, sl_status_str(st));
            a->n_ch = 0;
            api_send_error(a, &err, NULL);
            return;
        }
        atomic_fetch_add_explicit(&en->in_flight[a->replica], 1, memory_order_relaxed);
        ch->req = r;
        ch->finish = SL_FINISH_NONE;
        ch->stop_index = -1;
        sl_str_init(&ch->text);
        sl_str_init(&ch->held);
        if (oc->echo)
            api_echo_prompt(&ch->text, oc, sl_model_tok(en->model), sl_req_prompt_ids(prompt),
                            sl_req_prompt_n(prompt));
        ch->echo_pending = oc->echo && oc->stream;
        a->n_ch = ++a->n_live;
    }
    sl_openai_completion_dispose(oc);
    a->has_oc = false;
    api_release_prompts(a); /* the requests hold them now */
    a->n_prompt = n_prompt; /* all the prompts together */
    const char *prefix = a->kind == API_ANTHROPIC             ? "msg_"
                         : a->ident.api == SL_OPENAI_API_CHAT ? "chatcmpl-"
                                                              : "cmpl-";
    snprintf(a->ident.id, sizeof a->ident.id, "%s%08x%02x%014llx", prefix, api->nonce,
             (unsigned)t->idx & 0xff, (unsigned long long)t->n_req);
    a->ident.created = sl_clock_unix();
    a->ident.model = en->name;
    a->ident.include_usage = a->include_usage;
    a->t_first_ns = 0;
    a->n_gen = 0;
}

/* Acts on admission's verdict: submit, park until the next look, or refuse. */
static void admission_decided(struct api_exchange *a, enum sl_admit_verdict v)
{
    struct api_thread *t = a->t;
    const struct sl_admit *adm = &a->adm;
    const struct sl_tier *policy = &sl_config_tenancy(a->cfg)->tiers[adm->policy_tier];
    const char *policy_tier = policy->sched.name;
    struct sl_openai_error err;
    if (a->adm.budget_crossed) {
        a->adm.budget_crossed = false;
        api_budget_webhook(a);
    }
    switch (v) {
    case SL_ADMIT_OK:
        a->parked = false;
        sl_metrics_admission(t->api->metrics, t->idx, policy_tier,
                             adm->degraded ? SL_ADMIT_DEGRADED : SL_ADMIT_ADMITTED, adm->reason);
        submit(a);
        return;
    case SL_ADMIT_FLEET: ask_fleet(a); return;
    case SL_ADMIT_PARK: {
        if (!a->adm_timer)
            a->adm_timer = evtimer_new(t->base, on_admit_timer, a);
        int64_t wait = adm->recheck_ns - (int64_t)sl_clock_ns();
        if (wait < 0)
            wait = 0;
        struct timeval tv = {.tv_sec = wait / 1000000000, .tv_usec = wait % 1000000000 / 1000};
        evtimer_add(a->adm_timer, &tv);
        a->parked = true;
        return;
    }
    case SL_ADMIT_RATE_LIMITED:
        sl_openai_error_set(&err, 429, NULL, "rate_limit_exceeded", "%s", adm->why);
        break;
    case SL_ADMIT_OVER_BUDGET:
        /* OpenAI's answer when a quota is spent: clients must not retry it. */
        sl_openai_error_set(&err, 429, NULL, "insufficient_quota", "%s", adm->why);
        break;
    case SL_ADMIT_OVERLOADED:
        sl_openai_error_set(&err, policy->overload_status, NULL, "server_is_overloaded", "%s",
                            adm->why);
        break;
    }
    sl_metrics_admission(t->api->metrics, t->idx, policy_tier, SL_ADMIT_REJECTED, adm->reason);
    /* Admission logs its refusals only in the access log: one line per request, never more. */
    admit_release(a, -1);
    api_send_error(a, &err, NULL);
}

static void on_admit_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct api_exchange *a = arg;
    if (!a->parked)
        return;
    struct sl_admit_env env = admit_env(a);
    admission_decided(a, sl_admit_resume(&a->adm, &env, (int64_t)sl_clock_ns()));
}

/* When the tier follows from the head alone and that tier refuses whatever comes (a full
 * queue, sl_admit_precheck), the refusal needs no body: a flood against a closed tier costs what
 * parsing its heads costs, as nginx's limit_req does. True when it answered. */
static bool refuse_early(struct api_exchange *a)
{
    const struct sl_tenancy *ten = sl_config_tenancy(a->cfg);
    if (!ten->admission || sl_tier_classify_needs_body(ten))
        return false;
    struct sl_openai_completion head = {.params.max_tokens =
                                            sl_config_api(a->cfg)->default_max_tokens};
    struct sl_openai_error err;
    if (classify(a, &head, &err) != SL_OK)
        return false; /* answered in full, after the body, like any bad request */
    struct sl_admit_env env = admit_env(a);
    if (sl_admit_precheck(&a->adm, &env, ten, a->tenant, a->tier, 0, 0, (int64_t)sl_clock_ns()) ==
        SL_ADMIT_OK) {
        a->tier = -1;
        return false;
    }
    admission_decided(a, a->adm.verdict);
    return true;
}

/* Runs a decoded request (a->oc, a->has_oc): model, tier, admission, submit. */
static void run_decoded(struct api_exchange *a)
{
    struct sl_api *api = a->t->api;
    struct sl_openai_error err;
    int e = api_route_model(a, a->oc.model, &err), n_prompt = -1;
    if (e >= 0 && a->oc.max_tokens_open) {
        /* A chat that sets no max_tokens may generate up to the model's context, as OpenAI's and
         * vLLM's: the rest of the context once the prompt is encoded, a figure that classifying
         * rules, budgets and admission then see like any other. */
        if (api_encode_prompts(a, e, 1, &n_prompt, &err) != SL_OK) {
            admit_release(a, -1);
            api_send_error(a, &err, NULL);
            return;
        }
        a->oc.params.max_tokens = sl_model_config(api->engines[e].model)->seq_len - n_prompt;
    }
    if (e < 0 || classify(a, &a->oc, &err) != SL_OK) {
        admit_release(a, -1);
        api_send_error(a, &err, NULL);
        return;
    }
    a->engine = e;
    a->adm.fleet = api->fleet;
    a->adm.n = a->oc.n; /* admission counts each choice's tokens */
    a->adm.prompts = a->oc.n_prompts;
    struct sl_admit_env env = admit_env(a);
    const struct sl_tenancy *ten = sl_config_tenancy(a->cfg);
    if (sl_admit_precheck(&a->adm, &env, ten, a->tenant, a->tier, e, a->oc.params.max_tokens,
                          (int64_t)sl_clock_ns()) != SL_ADMIT_OK) {
        admission_decided(a, a->adm.verdict);
        return;
    }
    if (api_encode_prompts(a, e, a->oc.params.max_tokens, &n_prompt, &err) != SL_OK) {
        admit_release(a, -1);
        api_send_error(a, &err, NULL);
        return;
    }
    if (!api->engines[e].sched[0]) {
        admit_release(a, -1);
        sl_openai_error_set(&err, 503, NULL, NULL, "This server has no engine to run completions.");
        api_send_error(a, &err, NULL);
        return;
    }
    /* The guard predicts from what the engine will compute: the cached prefix is not. */
    a->adm.n_cached = api_predict_cached(a, e, pick_replica(&api->engines[e], NULL));
    admission_decided(a, sl_admit_begin(&a->adm, &env, ten, a->tenant, a->tier, e, n_prompt,
                                        a->oc.params.max_tokens, (int64_t)sl_clock_ns()));
}

void api_serve_completion(struct api_exchange *a)
{
    a->inference = true;
    struct sl_openai_error err;
    bool chat = sl_exchange_path_is(a->x, "/v1/chat/completions");
    a->ident.api = chat ? SL_OPENAI_API_CHAT : SL_OPENAI_API_COMPLETIONS;
    /* The default model: a request naming another is not known until the body is read. */
    if (a->t->api->n_engines == 1 && refuse_early(a))
        return;
    const struct sl_config_api *ac = sl_config_api(a->cfg);
    int st = chat ? sl_openai_chat_decode(&a->oc, a->x->body.p, a->x->body.len, NULL,
                                          ac->default_max_tokens_chat, &err)
                  : sl_openai_completion_decode(&a->oc, a->x->body.p, a->x->body.len, NULL,
                                                ac->default_max_tokens, &err);
    if (st != SL_OK) {
        api_send_error(a, &err, NULL);
        return;
    }
    api_serve_decoded(a);
}

void api_serve_decoded(struct api_exchange *a)
{
    a->has_oc = true;
    run_decoded(a);
}

/* ---- the scheduler's events ---- */

/* Time to first token at a request's first text, inter-token latency at each later one. Every
 * event of one wake-up carries its time (t->wake_ns: one clock read per batch), which also
 * stamps t_first_ns so that the access log and the metrics agree. */
static void metrics_on_text(struct api_exchange *a, const struct choice *ch,
                            const struct sl_out_event *e)
{
    struct sl_metrics *m = a->t->api->metrics;
    uint64_t now = a->t->wake_ns;
    const char *tier = a->tier >= 0 ? sl_config_tenancy(a->cfg)->tiers[a->tier].sched.name : "none";
    if (!a->t_first_ns) {
        a->t_first_ns = now;
        double ttft = (double)(now - a->x->t_start_ns) / 1e9;
        sl_metrics_observe_ttft(m, a->t->idx, tier, ttft);
        sl_admit_first_token(&a->adm, ttft); /* the guard learns how late it came */
    } else if (ch != a->ch) {
        return; /* inter-token latency is choice 0's: the others' tokens interleave with it */
    } else if (e->n_tokens > 0) {
        sl_metrics_observe_itl(m, a->t->idx, tier, (double)(now - a->t_text_ns) / 1e9, e->n_tokens);
    }
    a->t_text_ns = now;
}

/* The engine's answer when a request ends without finishing normally. */
static void finish_error(struct api_exchange *a, const struct sl_out_event *e,
                         struct sl_openai_error *err)
{
    if (e->finish == SL_FINISH_CANCELLED) {
        sl_openai_error_set(err, 503, NULL, "cancelled",
                            "The request was cancelled because the server is shutting down.");
    } else if (e->status == SL_ERANGE) {
        sl_openai_error_set(err, 400, "max_tokens", "context_length_exceeded",
                            "The prompt plus max_tokens needs more KV cache than this server "
                            "has; reduce the prompt or max_tokens.");
    } else {
        int st = e->status < 0 ? e->status : SL_EBACKEND;
        sl_openai_error_set(err, sl_http_status_code(st), NULL, NULL,
                            "The engine failed while generating: %s.", sl_status_str(st));
        sl_log(SL_LOG_ERROR, "io %d: %s failed: %s", a->t->idx, a->ident.id, sl_status_str(st));
    }
}

/* The whole answer of a request that did not stream. */
static void answer_whole(struct api_exchange *a)
{
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    if (a->kind == API_ANTHROPIC) {
        sl_anthropic_message_encode(b, &a->ident, a->ch[0].text.p ? a->ch[0].text.p : "",
                                    a->ch[0].text.len, a->ch[0].finish, api_stop_sequence(a),
                                    a->n_prompt, a->n_gen);
        return;
    }
    struct sl_openai_choice chs[SL_OPENAI_N_MAX];
    struct sl_openai_logprobs lps[SL_OPENAI_N_MAX];
    for (int i = 0; i < a->n_ch; i++) {
        const struct choice *x = &a->ch[i];
        chs[i] = (struct sl_openai_choice){.text = x->text.p ? x->text.p : "",
                                           .len = x->text.len,
                                           .finish = x->finish,
                                           .lp = api_lp_pending(a, x, &lps[i])};
    }
    a->ident.index = 0;
    sl_openai_completion_encode_choices(b, &a->ident, chs, a->n_ch, a->n_prompt, a->n_gen);
}

/* Choice ch ended. The response ends with the last choice, or with the first that fails (the
 * others are cancelled: one answer, not part of one). */
static void on_done(struct api_exchange *a, struct choice *ch, const struct sl_out_event *e)
{
    bool ok = e->finish == SL_FINISH_STOP || e->finish == SL_FINISH_LENGTH;
    a->n_gen += e->n_tokens - ch->n_gen;
    ch->n_gen = e->n_tokens;
    ch->done = true;
    ch->finish = e->finish;
    ch->stop_index = e->finish == SL_FINISH_STOP ? e->stop_index : -1;
    a->n_live--;
    struct sl_openai_error err;
    if (!ok) {
        finish_error(a, e, &err);
        struct engine *en = &a->t->api->engines[a->engine];
        for (int i = 0; i < a->n_ch; i++)
            if (!a->ch[i].done) {
                sl_sched_cancel(en->sched[a->replica], a->ch[i].req);
                a->ch[i].done = true;
                a->ch[i].finish = SL_FINISH_CANCELLED;
            }
        a->n_live = 0;
    }
    /* Text held back from a slow client goes before the end of the stream. */
    api_stream_release(a);
    if (ok && a->stream) {
        api_stream_head(a);
        /* Tokens whose text never came (the end of a stop string) go with the last chunk. */
        api_stream_chunk(a, ch, "", 0, e->finish, true);
    }
    if (a->n_live > 0)
        return;
    a->x->status = ok || a->x->head_sent ? 200 : err.http;
    meter(a, a->n_gen);
    api_log_end(a, sl_finish_str(e->finish), a->n_gen);
    admit_release(a, a->n_gen);
    if (!a->stream && ok)
        answer_whole(a);
    /* The request is over before the response is: once it is queued, the connection may move
     * on to its next request. */
    api_drop_request(a, false);

    if (!a->stream && ok) {
        api_send_json(a, 200, &a->t->out, NULL);
        return;
    }
    if (!ok && !a->x->head_sent) {
        bool drained = sl_exchange_draining(a->x) && e->finish == SL_FINISH_CANCELLED;
        api_send_error(a, &err, drained ? "Retry-After: 1\r\n" : NULL);
        return;
    }
    api_stream_head(a);
    api_stream_end(a, ok ? NULL : &err);
}

static void on_text(struct api_exchange *a, struct choice *ch, const struct sl_out_event *e)
{
    sl_admit_started(&a->adm);
    metrics_on_text(a, ch, e);
    a->n_gen += e->n_tokens;
    ch->n_gen += e->n_tokens;
    api_lp_append(a, ch, e->lp, e->n_lp);
    if (!a->stream) {
        sl_str_append(&ch->text, e->text, e->len);
        return;
    }
    api_stream_head(a);
    if (e->len == 0 || api_stream_hold(a, ch, e->text, e->len))
        return;
    api_stream_chunk(a, ch, e->text, e->len, SL_FINISH_NONE, false);
}

/* The choice of a that e belongs to, or NULL (an event of a request a has let go of). */
static struct choice *choice_of(struct api_exchange *a, const struct sl_req *r)
{
    for (int i = 0; i < a->n_ch; i++)
        if (a->ch[i].req == r)
            return a->ch[i].done ? NULL : &a->ch[i];
    return NULL;
}

void api_on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct api_thread *t = arg;
    t->wake_ns = sl_clock_ns();
    struct sl_out_event *batch = sl_outbox_take(t->outbox);
    for (struct sl_out_event *e = batch; e; e = e->next) {
        struct api_exchange *a = sl_req_user(e->req);
        struct choice *ch = a ? choice_of(a, e->req) : NULL;
        if (ch) {
            if (e->kind == SL_OUT_TEXT)
                on_text(a, ch, e);
            else
                on_done(a, ch, e);
        }
    }
    sl_outbox_recycle(t->outbox, batch);
}

const char *api_stop_sequence(const struct api_exchange *a)
{
    int i = a->n_ch > 0 ? a->ch[0].stop_index : -1;
    return i >= 0 && i < a->n_stops ? a->stops[i] : NULL;
}

void api_cancel(struct api_exchange *a)
{
    if (a->parked) {
        /* Still waiting for capacity: it never will now. */
        struct sl_openai_error err;
        admit_release(a, -1);
        a->adm.ran = false;
        a->x->keep_alive = false;
        sl_openai_error_set(&err, 503, NULL, "draining",
                            "The server is shutting down; retry the request elsewhere.");
        api_send_error(a, &err, "Retry-After: 1\r\n");
        return;
    }
    if (a->n_live == 0)
        return;
    /* Ended as cancelled: the first choice still running ends the response, and with it the
     * others (on_done cancels them in the scheduler). */
    struct choice *ch = a->ch;
    while (ch->done)
        ch++;
    sl_sched_cancel(a->t->api->engines[a->engine].sched[a->replica], ch->req);
    struct sl_out_event e = {.req = ch->req,
                             .kind = SL_OUT_DONE,
                             .finish = SL_FINISH_CANCELLED,
                             .n_tokens = ch->n_gen,
                             .stop_index = -1};
    a->x->keep_alive = false;
    on_done(a, ch, &e);
}
