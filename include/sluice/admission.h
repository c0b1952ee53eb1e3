/* sluice — admission: tenants and their keys, tiers and classification, token buckets (GCRA),
 * the SLO guard and the overload policy, decided before a request reaches a scheduler
 * (DESIGN.md, "Tiers, tenants, admission").
 *
 * Admission speaks no HTTP and no API's JSON: it answers with an enum sl_status and a neutral
 * reason (struct sl_admit_error, enum sl_admit_reason), and the gateway turns those into status
 * codes, headers and error objects. It reads the scheduler only through what the scheduler
 * publishes (struct sl_sched_stats), and the engines through struct sl_admit_env.
 *
 * Threads: unless said otherwise, every function here may run on any thread. A tenancy is
 * immutable once built; the state admission keeps in it is atomic and lock-free.
 */
#ifndef SLUICE_ADMISSION_H
#define SLUICE_ADMISSION_H

#include <sluice/common.h>
#include <sluice/sched.h>
#include <sluice/usage.h>

struct json_t; /* jansson's json_t: a configuration section */

#define SL_TIERS_MAX 32       /* tiers in one configuration (a tenant's tiers are a bit mask) */
#define SL_TIER_NAME_MAX 32   /* tier names: [A-Za-z0-9_.-], they travel in a header */
#define SL_TENANT_NAME_MAX 64 /* tenant names: printable ASCII without '"' or '\' */
#define SL_RULE_PATH_MAX 256
#define SL_TIER_HEADER "x-sluice-tier" /* the request header a "header" rule reads */
#define SL_OVERLOAD_MAX 8              /* steps in one tier's overload policy */
/* Models whose queues admission counts apart (struct sl_admit_env's n_models at most). */
#define SL_ADMIT_MODELS_MAX 8
#define SL_ADMIT_MODEL_NAME_MAX 64 /* the name a "model:NAME" overload step gives */

/* ---------------------------------------------------------------------------------------------
 * Errors
 */

/* Why admission refused a request, in no API's words: the gateway turns status into its HTTP
 * code (sl_http_status_code) and the rest into its API's error object. */
struct sl_admit_error {
    enum sl_status status; /* SL_EINVAL: the request asks for what does not exist; SL_EPERM:
                              its tenant may not have what it asks for */
    const char *code;      /* static, machine-readable ("invalid_tier", "tier_not_allowed") */
    char param[64];        /* the request field at fault ("service_tier"), "" when none */
    char message[512];     /* one client-safe sentence; never a key or a key hash */
};

/* ---------------------------------------------------------------------------------------------
 * Tiers, tenants and the rules that classify requests (the layouts a configuration fills)
 */

/* One step of a tier's overload policy ("cap_max_tokens:256", "demote:batch", "model:small",
 * "queue:2000", "reject"): what admission tries, in order, when the tier cannot take a request
 * as it is (its token bucket is empty, its queue is full, or the SLO guard predicts its TTFT
 * objective broken). */
enum sl_overload_kind {
    SL_OVERLOAD_CAP_MAX_TOKENS, /* arg: max_tokens cap */
    SL_OVERLOAD_DEMOTE,         /* arg: tier index */
    SL_OVERLOAD_MODEL,          /* model: a name of "models" (resolved when applied) */
    SL_OVERLOAD_QUEUE,          /* arg: milliseconds to wait for capacity */
    SL_OVERLOAD_REJECT,
};
/* Kinds of step (outside the enum, so that switches over it need no case for the count). */
#define SL_OVERLOAD_N_KINDS (SL_OVERLOAD_REJECT + 1)
/* The step's name as a configuration writes it: "cap_max_tokens", "demote", "model", "queue",
 * "reject" (and what /admin/slo counts degradations by). */
const char *sl_overload_kind_str(enum sl_overload_kind k);

struct sl_overload_step {
    enum sl_overload_kind kind;
    int arg;
    char model[SL_ADMIT_MODEL_NAME_MAX + 1];
};

/* A latency promise. */
struct sl_tier {
    /* The tier as the scheduler knows it and a request carries it (struct sl_req_params'
     * sched_tier): its name, priority (lower runs first, 0..1000), weight (capacity share
     * relative to the other tiers, 1..1000), ttft_slo_ms and tpot_slo_ms (p99 objectives). */
    struct sl_sched_tier sched;
    /* Admission. */
    long long token_rate;       /* tokens (prompt + max_tokens) admitted per second; 0: no limit */
    long long burst;            /* of them at once (the bucket's size); token_rate by default */
    int max_queue_requests;     /* admitted requests without a first token yet; -1: no limit */
    long long max_queue_tokens; /* their prompt tokens; -1: no limit */
    struct sl_overload_step overload[SL_OVERLOAD_MAX]; /* ["reject"] by default */
    int n_overload;
    int overload_status; /* the configuration's "overload_status" (503, the default, or 429):
                            what the gateway answers a rejection with; admission only keeps it */
};

/* Who pays. */
struct sl_tenant {
    char name[SL_TENANT_NAME_MAX + 1];
    unsigned char key_sha256[32]; /* SHA-256 of the API key; the key itself is never kept */
    uint32_t tiers;               /* bit i set: may use tiers[i] */
    int default_tier;             /* index into tiers; always allowed */
    long long rpm;                /* requests per minute; 0: no limit */
    long long tpm;                /* tokens (prompt + max_tokens, unused refunded) per minute */
    /* Money ("budget"): what it may spend per period, in nano-units of the currency (0: no
     * budget), warned about past soft_pct percent; periods are enum sl_usage_period, months
     * from month_day. */
    int64_t budget;
    int budget_period;
    int budget_soft_pct;
    int budget_month_day;
    /* Its share of each tier it uses, for fairness between tenants inside a tier (the
     * scheduler's virtual token counters count its service divided by it): 1 by default. */
    float share;
};

enum sl_rule_kind {
    SL_RULE_HEADER,         /* the x-sluice-tier header names the tier (explicit) */
    SL_RULE_SERVICE_TIER,   /* OpenAI's service_tier, through map (explicit) */
    SL_RULE_MATCH,          /* path / stream / max_tokens_above conditions → tier (shape) */
    SL_RULE_TENANT_DEFAULT, /* the tenant's default tier; ends the list */
};

/* service_tier value → tier; tier -1 means "no preference" (the next rule decides). */
struct sl_service_tier_map {
    char value[SL_TIER_NAME_MAX + 1];
    int tier;
};

/* One rule of the ordered classification list. */
struct sl_tier_rule {
    enum sl_rule_kind kind;
    /* SERVICE_TIER */
    struct sl_service_tier_map *map;
    int n_map;
    /* MATCH: every condition given must hold (absent ones match anything). */
    char *path;                 /* exact request path, or NULL */
    int stream;                 /* -1: any; 0 or 1: the request's "stream" */
    long long max_tokens_above; /* -1: any; else max_tokens (after the default) must exceed it */
    int tier;                   /* MATCH: the tier it yields */
};

/* ---------------------------------------------------------------------------------------------
 * Tenancy: what one configuration says about tenants, tiers, keys and admission
 * (admission/tenancy_config.c)
 */

struct sl_admit_state; /* admission's runtime state: buckets and queue counts */

/* A key as the configuration keeps it: only its SHA-256. */
struct sl_key_sha256 {
    bool set;
    unsigned char sha256[32];
};

/* Built by one thread (the configuration's loader), then shared and never changed (the state's
 * cells are atomic), so any thread may read it. Embedded: _init/_dispose. */
struct sl_tenancy {
    /* Arrays owned by the tenancy; tiers is never empty, classify may be (every request then gets
     * its tenant's default). With no tenants every request is the anonymous tenant's, who may
     * use every tier and defaults to tiers[0]. */
    struct sl_tier *tiers;
    int n_tiers;
    struct sl_tenant *tenants;
    int n_tenants;
    struct sl_tier_rule *classify;
    int n_classify;
    /* Metrics may be read only with this key (or the admin key) when set; by anyone otherwise,
     * as vLLM's are. Only the SHA-256 is kept. */
    struct sl_key_sha256 metrics_key;
    bool has_admin_key;                 /* the admin routes are closed without one */
    unsigned char admin_key_sha256[32]; /* SHA-256 of the admin key (never the key itself) */
    bool admission; /* false: every request is admitted as it comes (no limits, no guard) */
    /* Set once, by sl_admit_adopt, before any request sees the tenancy: the buckets and queue
     * counts its tenants and tiers use, shared by name with the tenancy it replaced. NULL for a
     * tenancy never served. Freed with the tenancy. */
    struct sl_admit_state *state;
};

/* The configuration's sections. init gives the defaults: tiers "interactive" and "batch", no
 * tenants, no admin or metrics key, admission on, and the rules [header, service_tier (priority
 * → interactive, flex → batch), tenant_default]. dispose frees the arrays and the admission
 * state. */
void sl_tenancy_init(struct sl_tenancy *ten);
void sl_tenancy_dispose(struct sl_tenancy *ten);
/* Applies the sections given (NULL = not in the file: "tiers", "tenants", "classify",
 * "admin_key_sha256") in dependency order: tiers, then tenants and classify, which name tiers.
 * When tiers are replaced, tenants kept from before are mapped to the new tiers by name and the
 * rules, unless given, go back to the defaults. A "model:NAME" overload step must name one of
 * models (n_models names, NULL for a model without one). Returns SL_OK, or SL_EINVAL with ten
 * unchanged and err naming the path of the bad value ("tenants[1].key_sha256: ..."); err never
 * contains a key or a key hash. Before the tenancy is adopted (no state yet). */
enum sl_status sl_tenancy_load(struct sl_tenancy *ten, const char *const *models, int n_models,
                               struct json_t *tiers, struct json_t *tenants,
                               struct json_t *classify, struct json_t *admin_key_sha256, char *err,
                               size_t errlen);
/* Cross-checks (every reference in range, defaults allowed, model steps among models), for
 * tenancies built in code: SL_OK, or SL_EINVAL with err naming the path. */
enum sl_status sl_tenancy_validate(const struct sl_tenancy *ten, const char *const *models,
                                   int n_models, char *err, size_t errlen);
/* Adds "tiers", "tenants", "classify" and "admin_key_sha256" to the JSON object root as the file
 * would spell them, every key hash replaced by "<redacted>". */
void sl_tenancy_to_json(const struct sl_tenancy *ten, struct json_t *root);
/* A step of ten's tiers as the file spells it ("demote:batch"), NUL-terminated in out. */
void sl_tier_overload_format(const struct sl_tenancy *ten, const struct sl_overload_step *s,
                             char *out, size_t outlen);

/* ---------------------------------------------------------------------------------------------
 * Tenants and keys (admission/tenant.c)
 *
 * Keys are compared as SHA-256 hashes, in constant time.
 */

/* The tenant of requests when the configuration has none: every tier allowed, tiers[0] default. */
extern const struct sl_tenant sl_tenant_anonymous;

/* SHA-256 of data into out. */
void sl_tenant_sha256(const void *data, size_t len, unsigned char out[32]);
/* Parses 64 hex digits (either case) into out. False when s is anything else. */
bool sl_tenant_hex_decode(const char *s, unsigned char out[32]);
/* The tenant whose key is `key`: its SHA-256 is compared with every tenant's hash in constant
 * time, without stopping at a match. NULL when none matches (or no key). With no tenants
 * configured, the anonymous tenant whatever the key. The result points into ten. */
const struct sl_tenant *sl_tenant_lookup(const struct sl_tenancy *ten, const char *key, size_t len);
/* True when ten has an admin key and `key` is it (constant-time comparison of hashes). */
bool sl_tenant_admin_check(const struct sl_tenancy *ten, const char *key, size_t len);
/* True when metrics may be read with `key`: no metrics key is configured, or the key is it or
 * the admin key (constant-time comparison of hashes). */
bool sl_tenant_metrics_check(const struct sl_tenancy *ten, const char *key, size_t len);
/* A form of key safe to show its owner, NUL-terminated in out: "sk-ab****wxyz" (5 + 4 of its
 * bytes) for printable keys of 20 bytes or more, "****" otherwise. */
void sl_tenant_key_redact(const char *key, size_t len, char *out, size_t outlen);

/* ---------------------------------------------------------------------------------------------
 * Classification (admission/classify.c)
 */

/* What classification looks at. Strings need not be NUL-terminated unless said. */
struct sl_tier_request {
    const char *header; /* the x-sluice-tier value (spaces trimmed by the callee), or NULL */
    size_t header_len;
    const char *service_tier; /* NUL-terminated, or NULL */
    const char *path;
    size_t path_len;
    bool stream;
    int max_tokens; /* after default_max_tokens applied */
};

/* Index of the tier named name[0..len), or -1. */
int sl_tier_find(const struct sl_tenancy *ten, const char *name, size_t len);
/* Puts a request of tenant t into a tier by ten's classify rules, first match wins (see
 * conf/sluice.json). An explicit request (header or service_tier) for an unknown tier is
 * SL_EINVAL ("invalid_tier"), for a tier the tenant may not use SL_EPERM ("tier_not_allowed"),
 * err naming the param either way; a shape rule whose tier the tenant may not use is skipped;
 * the tenant default ends the list. Returns SL_OK with *tier set, or the status with err
 * filled. */
enum sl_status sl_tier_classify(const struct sl_tenancy *ten, const struct sl_tenant *t,
                                const struct sl_tier_request *rq, int *tier,
                                struct sl_admit_error *err);
/* False when no rule of ten reads the body (service_tier, stream, max_tokens): the tier then
 * follows from the head alone, whatever the body says. */
bool sl_tier_classify_needs_body(const struct sl_tenancy *ten);

/* ---------------------------------------------------------------------------------------------
 * Admission (admission/admission.c): tenant budgets, tier buckets and queues, the SLO guard and
 * the overload policy, run on the I/O threads before a request reaches a scheduler.
 *
 * Lock-free throughout: every bucket is one atomic word (struct sl_gcra_bucket), every queue
 * count an atomic reserved by compare-and-swap below its cap, and the scheduler's figures are
 * read through struct sl_admit_env. The state lives in cells shared by name between a tenancy
 * and the one that replaces it (sl_admit_adopt), so a reload keeps the buckets and queue counts
 * of the tenants and tiers it keeps, and a request refunds into the cells of the tenancy it
 * started with, which its caller holds.
 */

/* Why a request was refused or degraded: the reason the gateway shows (x-sluice-admission) and
 * counts (metrics). */
enum sl_admit_reason {
    SL_ADMIT_REASON_NONE,
    SL_ADMIT_REASON_TENANT_REQUESTS,     /* "tenant_requests": the tenant's rpm */
    SL_ADMIT_REASON_TENANT_TOKENS,       /* "tenant_tokens": the tenant's tpm */
    SL_ADMIT_REASON_TIER_TOKEN_RATE,     /* "tier_token_rate": the tier's bucket */
    SL_ADMIT_REASON_TIER_QUEUE_REQUESTS, /* "tier_queue_requests": max_queue_requests */
    SL_ADMIT_REASON_TIER_QUEUE_TOKENS,   /* "tier_queue_tokens": max_queue_tokens */
    SL_ADMIT_REASON_TIER_TTFT_SLO,       /* "tier_ttft_slo": the SLO guard */
    SL_ADMIT_REASON_TENANT_BUDGET,       /* "tenant_budget": the tenant's money budget */
    SL_ADMIT_N_REASONS,
};
const char *sl_admit_reason_str(enum sl_admit_reason r);

enum sl_admit_verdict {
    SL_ADMIT_OK,           /* admitted, perhaps degraded: submit it as struct sl_admit says */
    SL_ADMIT_PARK,         /* a queue:MS step: call sl_admit_resume at recheck_ns (or before) */
    SL_ADMIT_RATE_LIMITED, /* over the tenant's budget (rpm or tpm): the client's doing */
    SL_ADMIT_OVERLOADED,   /* the tier's overload policy ended in a rejection: the server's */
    SL_ADMIT_OVER_BUDGET,  /* the tenant's money budget cannot take the request's worst case: no
                              retry helps before the period resets (retry_ns then, -1 never) */
    SL_ADMIT_FLEET,        /* the fleet's buckets decide (struct sl_admit's fleet): send the take
                              sl_admit_fleet_take builds, and give its answer to
                              sl_admit_fleet_answer */
};

/* The decision's label in metrics: "admitted", "degraded", "rejected". */
enum sl_admit_decision {
    SL_ADMIT_ADMITTED,
    SL_ADMIT_DEGRADED,
    SL_ADMIT_REJECTED,
    SL_ADMIT_N_DECISIONS
};

/* What admission reads of the engines (the served models). */
struct sl_admit_env {
    int n_models;
    const char *const *model_names; /* (n_models) as requests name them */
    void *ctx;
    /* The statistics of model i's scheduler; leaves *out zeroed when it has none. */
    void (*stats)(void *ctx, int model, struct sl_sched_stats *out);
    /* Tokenizes the request's prompt for model i (a "model:NAME" step), checking the context
     * for max_tokens; SL_OK with *n_prompt, and in *n_cached how many of those tokens model i's
     * prefix cache is predicted to hold for the request (sl_sched_prefix_match: 0 when none or
     * unknown), or an error (the step is then skipped). */
    int (*encode)(void *ctx, int model, int max_tokens, int *n_prompt, int *n_cached);
    /* Money budgets (optional: without them no budget is checked). The prices of model i; what
     * tenant has spent in the hours of [from, to) (unix seconds) as the usage ledger says; and
     * the wall clock now (unix seconds), which budget periods follow. */
    const struct sl_usage_price *(*price)(void *ctx, int model);
    int64_t (*spent)(void *ctx, const char *tenant, int64_t from, int64_t to);
    int64_t unix_s;
};

/* One request's admission, embedded in the caller's state for the request. Zeroed (sl_admit_init)
 * before each request; sl_admit_end releases what it holds exactly once. */
struct sl_admit {
    bool ran;    /* admission decided something about this request */
    bool active; /* it holds tokens, a queue slot or a parking place: sl_admit_end owes */
    /* The request as admission leaves it (submit it so). */
    const struct sl_tenancy *tenancy; /* of the configuration it started with */
    const struct sl_tenant *tenant;
    int tier;        /* the tier it runs in (after a demotion) */
    int policy_tier; /* the tier it was classified into, whose overload policy applies */
    int model;
    int n_prompt;   /* tokens of its prompts, all of them together */
    int n_cached;   /* of them, those its model's prefix cache is predicted to hold (set by the
                     * caller before sl_admit_begin, and by env's encode at a model step; 0 when
                     * none). The guard and the tier's queue count the n_prompt - n_cached tokens
                     * it will compute; buckets, budgets and charges count all n_prompt (a
                     * prediction: the blocks may be evicted before it starts, when it computes
                     * them after all and the scheduler's figures say so) */
    int max_tokens; /* of each choice */
    int n;          /* choices of each prompt (OpenAI's n; 0 reads as 1) */
    int prompts;    /* prompts (a completion's array of them; 0 reads as 1): each choice of
                     * each prompt is a sequence, so the request may use n · (n_prompt +
                     * prompts · max_tokens) tokens and queues n · (n_prompt - n_cached) prompt
                     * tokens */
    /* The decision. */
    enum sl_admit_verdict verdict;
    enum sl_admit_reason reason; /* what refused or degraded it */
    bool degraded;
    unsigned degraded_by;    /* bit (1u << enum sl_overload_kind) for each kind of step that
                                changed it: cap_max_tokens, demote, model, and queue once a
                                parked request is admitted */
    int64_t retry_ns;        /* refused: until a retry may pass; -1: never as sent */
    double predicted_ttft_s; /* the guard's latest prediction, < 0 when none (calibrated) */
    double raw_ttft_s;       /* the same before the tier's calibration; < 0 when none */
    char note[192];          /* what was decided: "admitted", "degraded; cap_max_tokens=256",
                                "rejected; reason=tier_ttft_slo" (the gateway's
                                x-sluice-admission) */
    char why[384];           /* refused: one client-safe sentence saying why */
    /* Parking (queue:MS). */
    int step; /* next overload step */
    int64_t park_start_ns, deadline_ns, recheck_ns;
    /* What it holds. */
    void *tenant_cell, *tier_cell, *queue_cell, *park_cell;
    bool took_request;     /* one of the tenant's requests per minute */
    int64_t tenant_tokens; /* charged to the tenant's tokens per minute */
    int64_t tier_tokens;   /* charged to tier_cell's bucket */
    int queue_model;
    long queue_tokens; /* prompt tokens counted in queue_cell's queue of queue_model */
    bool queued;       /* counted in a tier's queue until its first token */
    /* The fleet (set by the caller before sl_admit_begin): the tenant's and the tier's buckets
     * are the fleet's, in Redis, and each decision that passes this replica's checks (queue
     * caps, the guard) ends in SL_ADMIT_FLEET, for one take of every bucket it touches. */
    bool fleet;
    bool local;          /* Redis did not answer: decided on this replica's share of the buckets
                            (limit ÷ replicas), noted "; budget=local" */
    int replicas;        /* the share's divisor, when local */
    bool fleet_charged;  /* what it holds of the buckets (took_request, tenant_tokens,
                            tier_tokens) is held in Redis: sl_admit_end leaves the refund to
                            sl_admit_fleet_refund */
    bool refund_request; /* owed back to Redis, once sl_admit_end has run */
    int64_t refund_tenant_tokens, refund_tier_tokens;
    /* Money: the worst case reserved against the tenant's budget (nano-units) and the period it
     * was reserved in; what the request cost (set by the caller before sl_admit_end; 0 for one
     * that never ran); the share of the budget spent once it was reserved (< 0: no budget), and
     * whether that is past the tenant's soft_pct (the x-sluice-budget warning). */
    int64_t budget_reserved, budget_period_start, budget_period_end, budget_now;
    void *budget_cell; /* where it is reserved (budget_held) */
    bool budget_held;
    bool budget_fleet;      /* the budget is the fleet's: the take reserves it in Redis */
    bool budget_fleet_held; /* reserved there: sl_admit_end leaves the settling to the refund */
    bool refund_budget_pending;
    int64_t refund_budget; /* what the refund adds to the fleet's spend (signed) */
    int64_t cost;
    double budget_used;
    int64_t budget_spent; /* the period's spend once it was reserved (nano-units) */
    bool budget_warn;
    bool budget_crossed; /* it took the budget past soft_pct first this period: the caller tells
                            the operator's webhook (budget_webhook), once */
};

void sl_admit_init(struct sl_admit *a);
/* Decides on a request of tenant t (NULL: anonymous) classified into `tier`, for `model`, with
 * n_prompt prompt tokens and max_tokens, at now_ns (sl_clock_ns). ten must have been adopted
 * (sl_admit_adopt) and must outlive the admission. Any I/O thread. */
enum sl_admit_verdict sl_admit_begin(struct sl_admit *a, const struct sl_admit_env *env,
                                     const struct sl_tenancy *ten, const struct sl_tenant *t,
                                     int tier, int model, int n_prompt, int max_tokens,
                                     int64_t now_ns);
/* Before the prompt is tokenized: a request admission would refuse whatever its length (its
 * tier's queue at max_queue_requests for its model, an overload policy of cap_max_tokens and
 * reject steps only, a tenant without budgets) is refused now, as sl_admit_begin would refuse
 * it (SL_ADMIT_OVERLOADED), so that a flood's refusals cost no tokenization. Otherwise SL_ADMIT_OK
 * and a untouched: tokenize and call sl_admit_begin. */
enum sl_admit_verdict sl_admit_precheck(struct sl_admit *a, const struct sl_admit_env *env,
                                        const struct sl_tenancy *ten, const struct sl_tenant *t,
                                        int tier, int model, int max_tokens, int64_t now_ns);
/* A parked request's next look: admitted as soon as the tier has room, else parked again until
 * its deadline, after which the rest of the policy applies. */
enum sl_admit_verdict sl_admit_resume(struct sl_admit *a, const struct sl_admit_env *env,
                                      int64_t now_ns);
/* The request's first token arrived (or it ended): it leaves its tier's queue. Idempotent. */
void sl_admit_started(struct sl_admit *a);
/* The request's first token came ttft_s after it arrived: the guard's tier learns how far its
 * predictions fall short. The guard multiplies its predictions by SL_GUARD_CALIBRATION_Q's
 * quantile of actual ÷ predicted TTFT over the tier's recent requests (predictions of at least
 * SL_GUARD_CALIBRATION_MIN_S, once it has SL_GUARD_CALIBRATION_MIN_OBS of them; between 1 and
 * 4): a tier the guard admits up to its objective then meets it for most of what it admits,
 * instead of missing it for every request a prediction flattered. Once per request. */
void sl_admit_first_token(struct sl_admit *a, double ttft_s);
#define SL_GUARD_CALIBRATION_Q 0.9
#define SL_GUARD_CALIBRATION_MIN_S 0.2
#define SL_GUARD_CALIBRATION_MIN_OBS 50
/* The request ended (finished, cancelled, failed, or its client left) after n_generated
 * tokens (all its choices together; < 0: it never reached a scheduler): releases its queue slot or
 * parking place and refunds the tokens it was charged and did not use. Exactly once: later calls do
 * nothing. */
void sl_admit_end(struct sl_admit *a, int n_generated, int64_t now_ns);
/* A tenant's per-minute budget (rpm or tpm) as its bucket stands. */
struct sl_admit_budget {
    long long limit;   /* per minute; 0: the tenant has no such limit (and the rest is 0) */
    int64_t remaining; /* that could be taken at once now */
    int64_t reset_ns;  /* until the bucket is full again (0 when full) */
};
/* Tenant t's requests and tokens per minute under ten, as the buckets are at now_ns. False, both
 * zeroed, when t has neither (or admission is off). */
bool sl_admit_budgets(const struct sl_tenancy *ten, const struct sl_tenant *t, int64_t now_ns,
                      struct sl_admit_budget *requests, struct sl_admit_budget *tokens);

/* A tenant's money budget as this replica knows it at unix_s: its period [start, end) (end
 * INT64_MAX for a total budget) and what was spent in it, reservations of requests in flight
 * included: this replica's count (local budgets), or the fleet's at its latest answer (with
 * Redis). spent is -1 when the period has had no request here yet (the caller may read its
 * ledger). False when t has no budget. */
struct sl_admit_budget_state {
    int64_t amount, start, end, spent;
};
bool sl_admit_budget_now(const struct sl_tenancy *ten, const struct sl_tenant *t, int64_t unix_s,
                         struct sl_admit_budget_state *out);

/* Gives next its runtime state (next->state), sharing cells with prev (may be NULL) by tenant
 * and tier name; a kept bucket whose rate changed keeps its debt in tokens
 * (sl_gcra_bucket_rescale). Does nothing when next already has its state. Call before next
 * serves any request, from one thread at a time. */
void sl_admit_adopt(struct sl_tenancy *next, const struct sl_tenancy *prev, int64_t now_ns);
/* Appends the admission gauges of the metrics (Prometheus text): requests and prompt tokens
 * queued per tier (admitted, no first token yet), requests parked by queue:MS steps, and each
 * tenant's budget: used ratio and what remains (reservations of requests in flight counted). */
void sl_admit_render(const struct sl_tenancy *ten, struct sl_str *out);
/* Requests and prompt tokens admitted into tier i for model m and not started yet. */
void sl_admit_queue(const struct sl_tenancy *ten, int tier, int model, int *requests, long *tokens);

/* ---------------------------------------------------------------------------------------------
 * Token buckets and the SLO guard (admission/gcra.c)
 *
 * Pure functions of their inputs and `now`: no clock, no I/O, no locks.
 */

/* A rate: `limit` tokens per `period_ns`, of which up to `burst` may be taken at once (the
 * bucket's capacity). limit >= 1, period_ns >= 1, burst >= 1. A requests-per-minute limit of N
 * is {N, 60 s, N}: the whole minute's worth at once, then one every 60/N s. */
struct sl_gcra_rate {
    int64_t limit;
    int64_t period_ns;
    int64_t burst;
};

/* A GCRA token bucket (the generic cell rate algorithm): one atomic word, the "theoretical
 * arrival time" (TAT) at which the bucket is full again, in the caller's nanoseconds. Taking
 * `cost` tokens moves TAT forward by cost * period / limit (rounded up) from max(TAT, now) and
 * is allowed while TAT - now stays within burst * period / limit, so over any interval of length
 * T the tokens taken (less those refunded) never exceed limit * T / period + burst, however many
 * threads take at once (a compare-and-swap loop; a thread with an older `now` only takes less).
 * The rate is not stored: callers pass it (it comes from the configuration, which may change
 * while the bucket lives on). Embedded: _init. Any thread. */
struct sl_gcra_bucket {
    _Atomic int64_t tat_ns;
};

/* What a take or a peek saw. */
struct sl_gcra_view {
    int64_t remaining; /* tokens that could be taken at once now (after the take) */
    int64_t reset_ns;  /* until the bucket is full again (0 when full) */
    int64_t retry_ns;  /* a refused take: until the same take would be allowed (exact when no one
                          else takes meanwhile); -1 when it never would (cost over burst) */
};

/* Starts full at now_ns. */
void sl_gcra_bucket_init(struct sl_gcra_bucket *b, int64_t now_ns);
/* Takes cost >= 0 tokens when they are there: true, with v (may be NULL) after the take; else
 * false, nothing taken, and v says when to retry. */
bool sl_gcra_bucket_take(struct sl_gcra_bucket *b, const struct sl_gcra_rate *r, int64_t now_ns,
                         int64_t cost, struct sl_gcra_view *v);
/* Gives back cost tokens taken earlier (a request that used less than it was charged); the
 * bucket never holds more than burst. */
void sl_gcra_bucket_refund(struct sl_gcra_bucket *b, const struct sl_gcra_rate *r, int64_t now_ns,
                           int64_t cost);
/* The bucket's state now, taking nothing (retry_ns 0). */
void sl_gcra_bucket_peek(const struct sl_gcra_bucket *b, const struct sl_gcra_rate *r,
                         int64_t now_ns, struct sl_gcra_view *v);
/* The bucket as another holder of it says it stands (the fleet's copy in Redis): full again
 * reset_ns after now_ns. */
void sl_gcra_bucket_set(struct sl_gcra_bucket *b, int64_t now_ns, int64_t reset_ns);
/* The rate of the bucket changed from `from` to `to` (a reload): the tokens it is short of full
 * stay short (as many tokens, at the new rate), so a reload neither forgives nor adds debt. */
void sl_gcra_bucket_rescale(struct sl_gcra_bucket *b, const struct sl_gcra_rate *from,
                            const struct sl_gcra_rate *to, int64_t now_ns);

/* ---------------------------------------------------------------------------------------------
 * The fleet's buckets (admission/fleet.c): the same GCRA, held in Redis so that every replica
 * charges one budget. Two Lua scripts do the work, on Redis's clock: take checks every bucket a
 * request touches and charges all of them or none; refund gives tokens back. What is here builds
 * their arguments and reads their replies; the connection that sends them is the caller's.
 */

#define SL_FLEET_BUCKETS_MAX 4 /* tenant requests, tenant tokens, tier tokens, and one spare */
#define SL_FLEET_SHA_LEN 40

/* One bucket of a call: its key, its rate (period_ns a whole number of µs) and the tokens to
 * take or give back. */
struct sl_fleet_bucket {
    const char *key;
    struct sl_gcra_rate rate;
    int64_t cost;
};

/* What take answered. admitted: every bucket charged, view[i] each bucket after the take.
 * Otherwise nothing was charged; failed is the first bucket without room, and view[failed] says
 * what it holds and when to retry (retry_ns -1: never, the cost is over its burst). now_us:
 * Redis's clock at the call. */
struct sl_fleet_take {
    bool admitted;
    int failed;
    int64_t now_us;
    struct sl_gcra_view view[SL_FLEET_BUCKETS_MAX];
};

/* The scripts' sources (for EVAL and SCRIPT LOAD) and their SHA-1s (for EVALSHA). beat records
 * that a replica is alive and answers how many are (KEYS[1] the fleet's set, ARGV its id and the
 * milliseconds after which a silent replica counts as gone). */
extern const char sl_fleet_take_lua[], sl_fleet_refund_lua[], sl_fleet_beat_lua[];
/* The ledger's reader: KEYS[1] the index of hours (sl_fleet_usage_index), KEYS[2] when given a
 * budget's key; ARGV the key prefix and sl_fleet_usage_read_args's three. Answers one page: the
 * budget key's spend (-1: not asked, or no key yet), then each hour with usage in the range,
 * ascending, at most limit of them, with its hash (sl_fleet_usage_parse reads it). A caller
 * pages by asking again from the last hour answered + 1 while a page is full. */
extern const char sl_fleet_usage_lua[];
void sl_fleet_script_sha(const char *script, char sha[SL_FLEET_SHA_LEN + 1]);
/* The ARGV of take (4 per bucket) or refund (3 per bucket) for n buckets, as decimal strings in
 * num; returns how many. The KEYS are the buckets' keys in the same order. */
int sl_fleet_take_args(const struct sl_fleet_bucket *b, int n, char (*num)[24]);
int sl_fleet_refund_args(const struct sl_fleet_bucket *b, int n, char (*num)[24]);
/* The fleet's usage ledger (written by the refund script): one hash per hour, key
 * "<prefix>usage:<hour>" (unix seconds), fields "<tenant>\t<model>\t<tier>\t<counter>" with
 * counter one of requests, prompt_tokens, cached_tokens, completion_tokens, device_ns, cost; and
 * an index of the hours that have one, the sorted set "<prefix>usage-hours" (score and member the
 * hour). The hash's key, the index's key and a record's field prefix
 * ("<tenant>\t<model>\t<tier>"), NUL-terminated; the refund script's ARGV tail for usage u in
 * hour (7 numbers: the 6 counters in that order, then the hour). */
void sl_fleet_usage_key(char *out, size_t outlen, const char *prefix, int64_t hour);
void sl_fleet_usage_index(char *out, size_t outlen, const char *prefix);
void sl_fleet_usage_field(char *out, size_t outlen, const struct sl_usage_key *k);
int sl_fleet_usage_args(const struct sl_usage *u, int64_t hour, char (*num)[24]);
/* The usage script's range and page size as ARGV (3 strings): the hours in [from, to)
 * (INT64_MIN and INT64_MAX: unbounded), at most limit of them. */
int sl_fleet_usage_read_args(int64_t from, int64_t to, int limit, char (*num)[24]);
struct redisReply;
/* Adds one page of the usage script's answer to l: returns the hours it held (*last_hour the
 * latest of them), *spent the budget's; fields that are not the ledger's count in *bad and are
 * skipped. -1 with err when the reply is not such a page (an error reply passed on as worded). */
int sl_fleet_usage_parse(const struct redisReply *r, struct sl_usage_ledger *l, int64_t *spent,
                         int64_t *last_hour, int *bad, char *err, size_t errlen);
/* Reads take's reply for n buckets: SL_OK and *out, or SL_EIO with err saying what was wrong
 * (an error reply, such as NOSCRIPT, is passed on in err as Redis worded it). */
enum sl_status sl_fleet_take_parse(const struct redisReply *r, int n, struct sl_fleet_take *out,
                                   char *err, size_t errlen);
/* beat's answer: the replicas alive (>= 1), or -1 when the reply is not one. */
int sl_fleet_beat_parse(const struct redisReply *r);

/* The fleet's part (admission/admission.c): keys and buckets of a request's take and refund, and
 * what its answer means. A request whose take finds every bucket with room is admitted and its
 * local buckets are set to the fleet's state as the answer gave it (sl_gcra_bucket_set), so the
 * x-ratelimit-* headers show the fleet's budget and, should Redis go, the local share starts
 * where the fleet stood. */
#define SL_FLEET_PREFIX_MAX 64 /* the configuration's key_prefix, in bytes */
#define SL_ADMIT_FLEET_KEY_MAX 160
struct sl_admit_fleet_call {
    struct sl_fleet_bucket b[SL_FLEET_BUCKETS_MAX]; /* keys point into key */
    char key[SL_FLEET_BUCKETS_MAX][SL_ADMIT_FLEET_KEY_MAX];
    int n;
};
/* The take an SL_ADMIT_FLEET verdict asks for: the tenant's requests (1) and tokens (prompt +
 * max_tokens of every choice), the tier's tokens, of those with a limit, keyed under prefix
 * ("<prefix>tenant:<name>:rpm", "…:tpm", "<prefix>tier:<name>"). Returns out->n. */
int sl_admit_fleet_take(const struct sl_admit *a, const char *prefix,
                        struct sl_admit_fleet_call *out);
/* The take's answer: t (admitted or refused), or NULL when Redis did not give one (a timeout, no
 * connection, an error): the request is then decided on this replica's share of each bucket,
 * limit ÷ replicas (at least 1), the last count of live replicas the caller knows. Returns the
 * next verdict, as sl_admit_begin would (a tier bucket's refusal walks the overload policy, which
 * may end in SL_ADMIT_FLEET again for another tier). */
enum sl_admit_verdict sl_admit_fleet_answer(struct sl_admit *a, const struct sl_admit_env *env,
                                            const struct sl_fleet_take *t, int replicas,
                                            int64_t now_ns);
/* The key of tenant's money budget for the period starting at period_start (one key per
 * period, so a new period starts from nothing): "<prefix>budget:<tenant>:<period_start>". */
void sl_admit_fleet_budget_key(char *out, size_t outlen, const char *prefix, const char *tenant,
                               int64_t period_start);
/* After sl_admit_end of a request charged in Redis: the refund to send (fire and forget), once.
 * Returns out->n, 0 when nothing is owed. */
int sl_admit_fleet_refund(struct sl_admit *a, const char *prefix, struct sl_admit_fleet_call *out);

/* The SLO guard's prediction of a new request's time to first token from what the scheduler
 * publishes (struct sl_sched_stats), before the request is queued. The scheduler serves a tier's
 * prompts first come first served, so the request's first token comes when its tier has
 * prefilled everything queued ahead of it (waiting and partly prefilled prompts, recomputes of
 * preempted sequences) and then its own prompt, with the step that finishes it:
 *     ttft = (queued prompt tokens of the tier + n_prompt) / rate + one step
 * where rate is the tier's measured drain rate under load (drain_tokens_per_s: its weighted
 * share of the steps, or what slots and KV blocks let through); for a tier that was never
 * backlogged, the time under weighted sharing of the larger of the measured and the fitted
 * prefill rate with the other tiers' backlogs (generalised processor sharing, which the
 * scheduler's weighted, work-conserving prompt shares amount to), and one step is
 * decode_step_seconds. queued_tokens (per tier, as st->tiers; NULL: st's own
 * queued_prompt_tokens) lets a caller count prompts it has admitted that the published figures
 * do not show yet. */
struct sl_guard_prediction {
    double ttft_s;     /* predicted time to first token */
    double prefill_s;  /* of which the prefill backlog, the request's own prompt included */
    double rate;       /* the prefill rate used, tokens/s */
    long ahead_tokens; /* prompt tokens queued ahead of it, every tier's together */
};

/* tier: index into st->tiers. Returns SL_OK, SL_EAGAIN when the scheduler has not measured
 * enough yet to predict (no prefill rate: the guard then admits), SL_EINVAL for a bad tier. */
int sl_guard_predict_ttft(const struct sl_sched_stats *st, const long *queued_tokens, int tier,
                          int n_prompt, struct sl_guard_prediction *out);
/* How far prediction p breaks objective slo_s, in seconds (a time to retry): 0 when it is within
 * it, and when no prompt is queued ahead of the request in any tier (its own prefill, which no
 * wait shortens: the guard admits it). */
double sl_guard_over_s(const struct sl_guard_prediction *p, double slo_s);
/* How long until a request of tier `tier` and n_prompt tokens would be predicted within slo_s,
 * when the backlogs ahead of it drain at the rates the prediction used and nothing new arrives
 * (a time to retry for an overloaded tier): 0 when it already is. */
double sl_guard_drain_s(const struct sl_sched_stats *st, const long *queued_tokens, int tier,
                        int n_prompt, double slo_s);

#endif
