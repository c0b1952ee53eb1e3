/* sluice — admission: tenants and their keys, tiers and classification, token buckets (GCRA),
 * the SLO guard and the overload policy, decided before a request reaches a scheduler
 * (DESIGN.md, "Tiers, tenants, admission").
 *
 * Admission speaks no HTTP and no API's JSON: it answers with an enum sl_status and a neutral
 * reason, and the gateway turns those into status codes, headers and error objects. It reads
 * the scheduler only through what the scheduler publishes (struct sl_sched_stats).
 *
 * Threads: unless said otherwise, every function here may run on any thread; state shared
 * between threads is atomic and lock-free.
 */
#ifndef SLUICE_ADMISSION_H
#define SLUICE_ADMISSION_H

#include <sluice/common.h>
#include <sluice/sched.h>

/* Tiers in one configuration (a tenant's allowed tiers are a bit mask). */
#define SL_TIERS_MAX 32

/* ---------------------------------------------------------------------------------------------
 * Tenancy: what one configuration says about tenants, tiers, keys and admission
 */

struct sl_tier;        /* a latency promise: the scheduler's tier and admission's limits */
struct sl_tenant;      /* who pays: key hash, allowed tiers, default tier, budgets */
struct sl_tier_rule;   /* one rule of the ordered classification list */
struct sl_admit_state; /* admission's runtime state: buckets and queue counts */

/* A key as the configuration keeps it: only its SHA-256. */
struct sl_key_sha256 {
    bool set;
    unsigned char sha256[32];
};

/* Shared and immutable once built (the state's cells are atomic), so any thread may read it. */
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
    bool has_admin_key;                 /* the /admin/ routes answer 403 without one */
    unsigned char admin_key_sha256[32]; /* SHA-256 of the admin key (never the key itself) */
    bool admission; /* false: every request is admitted as it comes (no limits, no guard) */
    /* Set once, by sl_admit_adopt, before any request sees the tenancy: the buckets and queue
     * counts its tenants and tiers use, shared by name with the tenancy it replaced. NULL for a
     * tenancy never served. Freed with the tenancy. */
    struct sl_admit_state *state;
};

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
/* The rate of the bucket changed from `from` to `to` (a reload): the tokens it is short of full
 * stay short (as many tokens, at the new rate), so a reload neither forgives nor adds debt. */
void sl_gcra_bucket_rescale(struct sl_gcra_bucket *b, const struct sl_gcra_rate *from,
                            const struct sl_gcra_rate *to, int64_t now_ns);

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
