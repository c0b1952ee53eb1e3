/* Private layouts of gateway/api/: the API's state, its I/O-thread state and the state of one
 * exchange, shared by routes.c, api.c, completion.c, stream.c and prompt.c. Nothing outside
 * gateway/api/ may include it.
 */
#ifndef SLUICE_API_IMPL_H
#define SLUICE_API_IMPL_H

#include "gateway_impl.h"

#include <sluice/admission.h>
#include <sluice/api.h>
#include <sluice/fleet.h>
#include <sluice/http.h>

#include <stdatomic.h>

struct event;

/* A served model: requests that name it run on its scheduler. */
struct engine {
    char name[SL_MODEL_NAME_MAX + 1];
    /* Another name requests may give: the model as configured ("synthetic", a file's path) when
     * no name was (vLLM serves its --model as given); NULL otherwise. */
    char *alias;
    const struct sl_model *model;
    /* Its replicas, one per device, each with its scheduler; sched[0] NULL: no engine (tests of
     * the front end alone). in_flight counts the requests each holds, from submit to their end:
     * a request goes to the replica with the fewest (then the fewest queued prompt tokens). */
    struct sl_sched *sched[SL_REPLICAS_MAX];
    atomic_int in_flight[SL_REPLICAS_MAX];
    int n_replicas;
    enum sl_chat_template chat_template; /* the model's, when the config names none */
};

struct sl_api {
    struct sl_http_handler h;
    /* The models, the first the default; fixed once serving. */
    struct engine engines[SL_MODELS_MAX];
    const char *engine_names[SL_MODELS_MAX];
    int n_engines;
    struct sl_metrics *metrics; /* one shard per I/O thread */
    int n_shards;
    uint32_t nonce; /* makes completion ids unique across restarts */
    int64_t created;
    bool serving;                  /* a thread started: no more models */
    struct sl_http_server *server; /* for readiness (draining); may be NULL */
    const struct sl_config *cfg0;  /* the configuration it was made for (until it serves) */
    /* The fleet (the configuration's "redis", read at start): tenant and tier buckets are
     * Redis's, asked by each I/O thread's client; thread 0 says this replica is alive. */
    bool fleet;
    struct sl_fleet_addr fleet_addr;
    char fleet_prefix[SL_FLEET_PREFIX_MAX + 1];
    int fleet_timeout_ms;
    char fleet_id[128];        /* this replica in the fleet's set: host:pid:nonce */
    atomic_int fleet_replicas; /* alive at thread 0's last beat; 0 until known */
    atomic_int fleet_up;       /* 1: the latest take was answered; 0: deciding on local shares */
    atomic_llong fleet_local;  /* takes decided on the local share (sluice:fleet_local_total) */
    atomic_int fleet_pending;  /* requests waiting for a take's answer (sluice:fleet_pending) */
    atomic_llong fleet_unsent; /* usage records Redis could not be sent (kept locally only) */
    /* Metering: every finished request's usage, and the journal that keeps it (or NULL). */
    struct sl_usage_ledger *ledger;
    struct sl_usage_journal *journal;
};

/* The API's part of one I/O thread. */
struct api_thread {
    struct sl_api *api;
    int idx;
    struct event_base *base;
    struct event *wake_ev; /* activated by the outbox from a scheduler thread */
    struct sl_outbox *outbox;
    uint64_t wake_ns;  /* when on_wake began: the time of every event of that batch */
    struct sl_str out; /* scratch for response bodies */
    struct sl_str hdr; /* scratch for response headers */
    uint64_t n_req;    /* completions started here, for ids */
    int32_t *ids;      /* (seq_len of the longest model) scratch for tokenizing a prompt */
    struct sl_fleet_client *fleet;  /* NULL without a fleet */
    struct event *beat_ev;          /* thread 0 of a fleet: the heartbeat */
    struct sl_str journal_buf;      /* usage records for the journal, written before_write */
    struct api_webhook *webhooks;   /* budget webhooks in flight or waiting to retry */
    struct evdns_base *dns;         /* their resolver, made at the first */
    struct ssl_ctx_st *webhook_tls; /* their TLS client context (SSL_CTX), made at the first */
};

/* Which API a route speaks (its errors' shape, its objects). */
enum api_kind {
    API_OPENAI,    /* OpenAI's and vLLM's routes, and the operator's */
    API_ANTHROPIC, /* Anthropic's Messages API */
};

/* One choice of the completion in flight (OpenAI's n: each its own sequence). */
struct choice {
    struct sl_req *req; /* the exchange's reference, until the whole request ends */
    bool done;          /* its end arrived (finish) */
    enum sl_finish finish;
    int n_gen;          /* tokens received so far */
    bool echo_pending;  /* streaming with echo: text holds the prompt, its first chunk */
    struct sl_str text; /* non-streaming: the text so far (the prompt first with echo) */
    struct sl_str held; /* stream text held back while the client is behind (valid UTF-8) */
    /* Log probabilities, when the request asked for them: every token's (non-streaming), or
     * those not sent yet (streaming: of held text, or of tokens whose text is still to come). */
    struct sl_token_logprobs *lp;
    int n_lp, cap_lp;
    size_t lp_offset; /* streaming completions: the next token's text_offset */
    int stop_index;   /* done with a stop string: which (params.stop's index), else -1 */
    /* Streaming (OpenAI): what its chunks of plain text have around the text, made once at the
     * stream's head (sl_openai_chunk_affixes), in the arena. */
    struct sl_strv chunk_pre, chunk_post;
};

/* The API's state of one exchange (x->data), in the exchange's arena. */
struct api_exchange {
    struct sl_exchange *x;
    struct api_thread *t;
    const struct sl_config *cfg; /* x->cfg */
    enum api_kind kind;
    const struct api_route *route; /* NULL: an unknown URL (or the transport refused it) */
    /* The request's key (api_request_key), read once. */
    bool key_read, has_key;
    const char *key;
    size_t key_len;
    /* Who sent it and its tier (an index into cfg's tenancy tiers, -1 until classified); both point
     * into cfg. NULL: not authenticated (yet). */
    const struct sl_tenant *tenant;
    int tier;
    bool head_keyed; /* on_head looked the key up: tenant is its answer (maybe NULL) */

    /* An inference request (counted in sluice:requests_total at its end), and when its first
     * and latest text arrived. */
    bool inference;
    uint64_t t_first_ns, t_text_ns;

    /* The completion in flight: its n_ch choices (n_ch > 0 while queued or streaming), each a
     * sequence of its own on replica `replica` of engines[engine], n_live of them not done. */
    struct choice *ch;
    int n_ch, n_live;
    int per_prompt; /* choices of each prompt (OpenAI's n): ch[p · per_prompt ..] are prompt p's */
    struct sl_openai_ident ident;
    int n_prompt;
    bool stream, include_usage;
    bool want_lp; /* the request asked for log probabilities */
    int n_gen;    /* tokens received so far, all choices together */

    /* Admission: the decision on the current completion, the model it runs on, and while a
     * queue:MS step parks it, its decoded request and the timer that looks again. */
    struct sl_admit adm;
    int engine;
    int replica; /* of engines[engine] running it (each choice counted in its in_flight) */
    struct sl_openai_completion oc;
    bool has_oc;
    bool parked; /* a queue:MS step or the fleet's take holds it: no scheduler has
                    it yet */
    struct sl_fleet_call *fleet_call; /* the take it waits for, or NULL */
    struct sl_fleet_call *usage_call; /* a usage route's read of the fleet's ledger, or NULL */
    struct event *adm_timer;          /* created at the first park */
    /* The prompts' token ids for `ids_engine`, computed once: prompts[i] is prompt i's (the
     * array in the arena, each prompt a reference the exchange holds until its requests take
     * theirs: api_release_prompts); admission, parking and submit reuse them. */
    struct sl_req_prompt **prompts;
    int n_prompts;
    int ids_engine; /* -1: none computed */
    /* Metering: the request's usage once it has ended (metered), and its cost as a decimal. */
    bool metered;
    struct sl_usage usage;
    struct sl_usage_key usage_key; /* the ledger's row it was added to */
    bool usage_sent;               /* given to the fleet's ledger (Redis) */
    char cost[32];
    /* Anthropic: the stop sequences (in the arena), to name the one that matched. */
    const char *stops[SL_REQ_MAX_STOPS];
    int n_stops;
};

/* api.c: answering */

/* The response headers the API adds to every answer (tier, admission, rate limits) and `extra`,
 * into t->hdr; returns it as a string. */
const char *api_headers(struct api_exchange *a, const char *extra);
/* A whole answer; metrics and the access log are written first. */
void api_send(struct api_exchange *a, int status, const char *ctype, const char *extra,
              const char *body, size_t len);
void api_send_json(struct api_exchange *a, int status, const struct sl_str *body,
                   const char *extra);
/* An error in the shape of the exchange's API. */
void api_send_error(struct api_exchange *a, const struct sl_openai_error *e, const char *extra);
/* The request's end for metrics and the access log, once: finish NULL when nothing was
 * generated. */
void api_log_end(struct api_exchange *a, const char *finish, int n_completion);
/* A 405 naming the methods allowed. */
void api_not_allowed(struct api_exchange *a, const char *allow);
/* The key of the request: "Authorization: Bearer KEY", or (Anthropic) "x-api-key: KEY". Read
 * once. */
bool api_request_key(struct api_exchange *a, const char **key, size_t *len);
/* A 401 for a missing or wrong key; the key itself is never echoed. */
void api_unauthorized(struct api_exchange *a, bool has_key, const char *key, size_t len);
/* Sets a->tenant from the key (looked up once, in on_head), or answers 401. */
bool api_authenticate(struct api_exchange *a);

/* routes.c */

/* The key a route needs: none (probes), the metrics key (when one is configured), the admin
 * key, or a tenant's (every other route, unknown URLs included, when tenants are configured). */
enum api_guard { GUARD_NONE, GUARD_METRICS, GUARD_ADMIN, GUARD_TENANT };

enum api_method { METHOD_GET = 1, METHOD_POST = 2 }; /* GET routes answer HEAD too */

/* One entry of the route table, like an nginx location: a path (exact, or a prefix when it ends
 * with '/'), the methods it takes, the key it needs, the API it speaks and its handler. */
struct api_route {
    const char *path;
    size_t path_len;
    unsigned methods;
    enum api_guard guard;
    enum api_kind kind;
    const char *label; /* the route label of metrics: a fixed set, never a client's path */
    void (*serve)(struct api_exchange *a);
};

/* The route of x's path, or NULL (an unknown URL). */
const struct api_route *api_route_find(const struct sl_exchange *x);
/* The metrics label of a's route, SL_METRICS_OTHER for an unknown one. */
const char *api_route_label(const struct api_exchange *a);
/* The whole request is here: routes it (the key, the method, then the handler). */
void api_route(struct api_exchange *a);
/* GET /readyz. */
void api_serve_ready(struct api_exchange *a);

/* prompt.c */

/* The engine a request's "model" names (the first without one), or -1 with a 404. */
int api_route_model(struct api_exchange *a, const char *model, struct sl_openai_error *err);
/* Whether a request naming the model id[0 .. n) means engine e. */
bool api_engine_is(const struct engine *e, const char *id, size_t n);
/* The chat template of engine en's chats: the configured one, else the model's own. */
enum sl_chat_template api_chat_template(const struct api_exchange *a, const struct engine *en);
/* The request's prompts' token ids for engine e, each checked against the model's context for
 * max_tokens, kept in a->ids (computed once per engine and max_tokens bound); *n_prompt gets
 * their tokens together. */
int api_encode_prompts(struct api_exchange *a, int e, int max_tokens, int *n_prompt,
                       struct sl_openai_error *err);
/* The prefix cache's parameters (cache_prefix, cache_key) of a's requests to engine e, as the
 * configuration a started with says, into p. */
void api_cache_params(const struct api_exchange *a, int e, struct sl_req_params *p);
/* Of a's prompts as encoded for engine e (api_encode_prompts; 0 when they are not), the tokens
 * that replica `replica`'s prefix cache is predicted to hold under a's cache key
 * (sl_sched_prefix_match, nothing pinned): each prompt counted once, 0 with the cache off. */
int api_predict_cached(struct api_exchange *a, int e, int replica);
/* Drops the exchange's references to its prompts' ids (the requests keep theirs). */
void api_release_prompts(struct api_exchange *a);
/* echo: the prompt's text into out, as sent, or its token ids through the detokenizer. */
void api_echo_prompt(struct sl_str *out, const struct sl_openai_completion *oc,
                     const struct sl_tok *tok, const int32_t *ids, int n);

/* completion.c */

/* POST /v1/completions, /v1/chat/completions. */
void api_serve_completion(struct api_exchange *a);
/* The prompt tokens of a's completion that the prefix cache gave it (usage's cached_tokens, at
 * most its prompt_tokens): of each prompt, the least any of its choices was given. Final once each
 * choice has a token; read while a holds its choices (meter keeps it in a->usage). */
int api_cached_tokens(const struct api_exchange *a);
/* usage.c: GET /admin/usage (every tenant's) and GET /v1/usage (the caller's). Query: from, to
 * (unix seconds, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ: hours starting in [from, to)), group_by
 * (tenant, model, tier, hour), and for the admin's, tenant. */
void api_serve_admin_usage(struct api_exchange *a);
/* webhook.c: POSTs the budget_webhook for the tenant a's admission took past its soft_pct
 * (a->adm.budget_crossed), from a's thread, retried with backoff; never waited for. */
void api_budget_webhook(struct api_exchange *a);
/* Frees the thread's webhooks still in flight or waiting (at the thread's end). */
void api_webhooks_free(struct api_thread *t);
void api_serve_own_usage(struct api_exchange *a);
/* stats.c: GET /admin/stats, the dashboard's figures (what /metrics, /admin/slo and
 * /admin/usage show, in one JSON document; never cached). */
void api_serve_admin_stats(struct api_exchange *a);
/* dashboard.c: GET /dashboard (the page) and /dashboard/app.js, /dashboard/app.css (its script
 * and style), compiled into the binary; no key (the page asks for the admin key and keeps it in
 * its memory). */
void api_serve_dashboard(struct api_exchange *a);
/* Runs a request decoded into a->oc (Anthropic's messages): model, tier, admission, submit. */
void api_serve_decoded(struct api_exchange *a);
/* The outbox's events of one wake-up. */
void api_on_wake(int fd, short what, void *arg);
/* The end of the exchange's completion: admission's hold and the choices are let go (cancelled
 * in the scheduler when `cancel`). Idempotent. */
void api_drop_request(struct api_exchange *a, bool cancel);
/* A drain timed out: ends a parked or running completion with a 503 or an error event. */
void api_cancel(struct api_exchange *a);

/* stream.c */

void api_stream_head(struct api_exchange *a);
/* The stream's last events: usage, or the error err (not NULL), then its end. */
void api_stream_end(struct api_exchange *a, const struct sl_openai_error *err);
/* The stop sequence that ended choice 0 (Anthropic's stop_sequence), or NULL. */
const char *api_stop_sequence(const struct api_exchange *a);
/* One chunk of choice ch's stream: text, its finish, and the log probabilities pending. */
void api_stream_chunk(struct api_exchange *a, struct choice *ch, const char *text, size_t len,
                      enum sl_finish finish, bool lp_all);
/* Sends the text held back from a slow client. */
void api_stream_release(struct api_exchange *a);
/* Holds text back while the client is behind; true when it took the text. */
bool api_stream_hold(struct api_exchange *a, struct choice *ch, const char *text, size_t len);
void api_lp_append(struct api_exchange *a, struct choice *ch, const struct sl_token_logprobs *e,
                   int n);
const struct sl_openai_logprobs *api_lp_pending(struct api_exchange *a, const struct choice *ch,
                                                struct sl_openai_logprobs *buf);

/* anthropic.c: Anthropic's Messages API */

/* POST /v1/messages. */
void api_serve_messages(struct api_exchange *a);
/* Decodes a Messages request into c (system and messages as chat messages, max_tokens,
 * stop_sequences, temperature, top_p, top_k, stream, metadata.user_id, service_tier). SL_OK, or
 * an error naming the field in err (c is then empty). */
int sl_anthropic_messages_decode(struct sl_openai_completion *c, const char *body, size_t len,
                                 struct sl_openai_error *err);
/* {"type":"error","error":{"type","message"}}, the type from e->http. */
void sl_anthropic_error_encode(struct sl_str *out, const struct sl_openai_error *e);
/* The `message` object of a whole answer; stop: the stop sequence that ended it, or NULL;
 * input_tokens: all its prompt tokens, written as Anthropic counts them: id->cached_tokens of them
 * as cache_read_input_tokens, the rest as input_tokens (and cache_creation_input_tokens 0). Its
 * usage has "cost" when id->cost is set (and message_delta's too). */
void sl_anthropic_message_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                 const char *text, size_t len, enum sl_finish finish,
                                 const char *stop, int input_tokens, int output_tokens);
/* The stream's events' data: message_start, a text_delta, message_delta (whose usage is the
 * whole request's, as in the message object). */
void sl_anthropic_message_start_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                       int input_tokens);
void sl_anthropic_delta_encode(struct sl_str *out, const char *text, size_t len);
/* What a text_delta's data has around a text that is valid UTF-8 (then written by
 * sl_json_escape): the same bytes as sl_anthropic_delta_encode. */
extern const struct sl_strv sl_anthropic_delta_pre, sl_anthropic_delta_post;
void sl_anthropic_message_delta_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                       enum sl_finish finish, const char *stop, int input_tokens,
                                       int output_tokens);

#endif
