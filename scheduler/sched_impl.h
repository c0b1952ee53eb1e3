/* Private layouts of the scheduler module; its tests may include this. */
#ifndef SLUICE_SCHED_IMPL_H
#define SLUICE_SCHED_IMPL_H

#include <sluice/sched.h>

#include <pthread.h>
#include <stdatomic.h>

struct sl_seq;

/* ---- The KV block pool and its prefix cache (prefix.c) ---- */

/* A full block's identity: a 128-bit keyed hash of its tokens and its parent's identity. */
struct sl_kv_hash {
    uint64_t lo, hi;
};

/* Blocks are free (in `free`, no content worth keeping), cached (no holder, content registered,
 * in the LRU), or held (ref > 0, registered or private). Single-threaded (the core's owner),
 * but for `pub`, which other threads read. */
struct sl_kv_pool {
    int n_blocks, block_size;
    uint64_t seed[4]; /* two SipHash keys */
    int32_t *free;    /* (n_blocks) stack of free block ids */
    int n_free;
    int32_t *ref;            /* (n_blocks) sequences holding each block */
    bool *cached;            /* (n_blocks) registered: findable by hash */
    bool *mark;              /* (n_blocks) scratch of the core, false between uses */
    struct sl_kv_hash *hash; /* (n_blocks) of registered blocks */
    int32_t *tokens;         /* (n_blocks, block_size) token ids of registered blocks */
    int32_t *hnext;          /* (n_blocks) next registered block in the same bucket */
    int32_t *bucket;         /* (bucket_mask + 1) first registered block, -1 when none */
    uint32_t bucket_mask;
    int32_t *lru_prev, *lru_next; /* (n_blocks) links of cached blocks, oldest at lru_head */
    int32_t lru_head, lru_tail;
    int n_lru;
    _Atomic uint64_t *pub; /* ((pub_mask + 1) * 4) fingerprints of registered blocks, 0: empty */
    uint32_t pub_mask;
    uint64_t evictions;
};

void sl_sched_kv_init(struct sl_kv_pool *p, int n_blocks, int block_size, const uint64_t seed[4]);
void sl_sched_kv_free(struct sl_kv_pool *p);
/* Blocks an allocation can take: free or cached. */
static inline int sl_sched_kv_available(const struct sl_kv_pool *p)
{
    return p->n_free + p->n_lru;
}
/* A block held once: a free one, else the least recently cached (evicted). Needs one available. */
int32_t sl_sched_kv_alloc(struct sl_kv_pool *p);
/* Holds block b once more (a cached one leaves the LRU). */
void sl_sched_kv_hold(struct sl_kv_pool *p, int32_t b);
/* Drops a hold on b; its last holder gone, a registered block is cached (LRU's newest), another
 * freed. */
void sl_sched_kv_drop(struct sl_kv_pool *p, int32_t b);
/* The identity of the root of key's chains, and of a block of tokens (block_size) under parent. */
struct sl_kv_hash sl_sched_kv_root(uint64_t cache_key);
struct sl_kv_hash sl_sched_kv_chain(const uint64_t seed[4], struct sl_kv_hash parent,
                                    const int32_t *tokens, int block_size);
/* The registered block of identity h holding tokens (block_size), or -1. */
int sl_sched_kv_find(const struct sl_kv_pool *p, struct sl_kv_hash h, const int32_t *tokens);
/* Registers held block b as identity h with tokens (block_size). False (nothing changed) when b
 * is registered already or another block holds that identity (b then stays private). */
bool sl_sched_kv_register(struct sl_kv_pool *p, int32_t b, struct sl_kv_hash h,
                          const int32_t *tokens);
/* The longest chain of registered blocks under key matching ids (n), at most (n - 1) /
 * block_size blocks: returns how many, with their ids in blocks and identities in hashes (either
 * may be NULL). Changes nothing. */
int sl_sched_kv_match(const struct sl_kv_pool *p, uint64_t key, const int32_t *ids, int n,
                      int32_t *blocks, struct sl_kv_hash *hashes);
/* As sl_sched_kv_match, in tokens, from the published fingerprints: any thread. */
int sl_sched_kv_published_match(const struct sl_kv_pool *p, uint64_t key, const int32_t *ids,
                                int n);

struct sl_req_prompt {
    atomic_int refs;
    int n;
    int32_t ids[]; /* (n) */
};

struct sl_req {
    atomic_int refs;
    atomic_bool cancelled;
    struct sl_req_prompt *prompt_ref; /* the reference the request holds */
    const int32_t *prompt;            /* (n_prompt) prompt_ref's ids, BOS first */
    int n_prompt;
    struct sl_req_params params; /* stop strings point into stop_copy */
    char *stop_copy[SL_REQ_MAX_STOPS];
    int32_t *bias_ids_copy; /* params.bias_ids and params.bias point here */
    float *bias_copy;
    int32_t *stop_ids_copy;
    void *user; /* the outbox owner's thread only */
    /* Queue time (sl_req_queue_ns): stamped by sl_sched_submit's caller and by the core at the
     * start of the first step that runs the request; SL_REQ_NOT_YET until then. */
    _Atomic uint64_t submit_ns;
    _Atomic uint64_t first_step_ns;
    _Atomic uint64_t device_ns; /* sl_req_device_ns: written by the scheduler thread only */
    atomic_int cached_tokens;   /* sl_req_cached_tokens: written by the scheduler thread only */

    /* Scheduler thread only. */
    struct sl_seq *seq;                   /* the core's state while it holds the request */
    struct sl_outbox *box;                /* where events go */
    struct sl_detok *detok;               /* token ids → text, stop strings */
    struct sl_str pending;                /* text released this step, not yet posted */
    int pending_tokens;                   /* tokens behind `pending` */
    struct sl_token_logprobs *pending_lp; /* their log probabilities, when asked for */
    int n_pending_lp, cap_pending_lp;
    bool dirty; /* on the adapter's list of requests with pending text */
};

#define SL_REQ_NOT_YET UINT64_MAX

/* A tenant of a tier for its virtual token counter (enum sl_sched_fairness): while it has
 * sequences in the tier and, idle, until the tier forgets it (the longest idle first, past
 * SL_VTC_IDLE_MAX), so that going idle for a moment does not wipe out what it has received. */
struct sl_vtc {
    struct sl_vtc *next; /* the tier's list */
    char name[SL_SCHED_TENANT_NAME_MAX + 1];
    double counter; /* service received (w_in prompt tokens + w_out generated) / share */
    float share;
    int n_active;               /* its sequences in the tier, queued or resident */
    struct sl_seq *head, *tail; /* its queued sequences, in the tier queue's order */
    struct sl_seq *cursor;      /* scratch of a step: its next queued sequence to offer rows */
    uint64_t idle_since;        /* when it became idle, in submission order */
};
#define SL_VTC_IDLE_MAX 256

/* A sequence as the core tracks it. It is in its tier's prefill queue while part of its known
 * tokens has no KV yet (`queued`: waiting, partly prefilled, or preempted to recompute), and
 * resident while it holds a slot and KV blocks; a resident sequence that is not queued decodes.
 */
struct sl_seq {
    struct sl_req *req;           /* the core's reference */
    struct sl_seq *prev, *next;   /* in its tier's prefill queue while `queued` */
    int tier;                     /* index into the core's tiers */
    struct sl_vtc *vt;            /* its tenant in that tier */
    struct sl_seq *tprev, *tnext; /* in its tenant's queue while `queued` */
    int charged; /* prompt positions counted as service: a recompute is not counted again */
    int prio;    /* the request's own priority */
    int tpot_ms; /* the request's own TPOT objective; 0 = none */
    uint64_t arrival_ns;
    uint64_t order; /* submission order: ranks equal arrivals */
    bool queued;
    bool resident;
    int plan;        /* index of its entry in the step being built, -1 when none */
    int32_t *tokens; /* (n_prompt + max_tokens) prompt then generated ids */
    int n_tokens;    /* ids known so far */
    int n_computed;  /* positions whose KV is written */
    int n_generated; /* sampled ids (the sink has seen them) */
    int32_t *blocks; /* (blocks_for(n_prompt + max_tokens)) KV block ids held */
    int n_blocks;    /* in use */
    /* The prefix cache: identities of its first n_hashed full blocks of tokens (they never
     * change), how many of its held blocks are registered or found duplicate (n_offered), and
     * while waiting, the tokens the cache is expected to give it at its start (`hint`, counted
     * off its tier's queued work; 0 while resident). */
    struct sl_kv_hash *hashes; /* (n_prompt + max_tokens) / block_size */
    int n_hashed;
    int n_offered;
    int hint;
    bool started;      /* it has started once (the cache's queries count first starts only) */
    struct sl_rng rng; /* sampling state: survives preemption, so a resumed run samples the same */
    uint64_t last_decode_ns;   /* `now` of the step that last gave it a token (TPOT guard) */
    uint64_t last_decode_step; /* and that step's number */
};

/* A tier: its settings and its prefill queue. */
struct sl_tier_q {
    struct sl_sched_tier t;
    struct sl_seq *head, *tail; /* FIFO of queued sequences; preempted ones go to the front */
    int n_queued;               /* in the queue */
    int n_waiting;              /* queued without blocks (not resident) */
    int n_resident;             /* holding a slot, queued or decoding */
    long prefill_tokens;        /* known tokens without KV, over the queue */
    uint64_t preemptions;
    double deficit;        /* share of prompt tokens carried to the next step (< 1) */
    uint64_t last_busy_ns; /* `now` of the latest step that found it with sequences; 0: never */
    /* Its tenants (struct sl_vtc) and how many of them are idle; floor: the smallest counter
     * among the active when one last joined or left, where a tenant joining an idle tier
     * starts. */
    struct sl_vtc *vtc;
    int n_idle;
    double vtc_floor;
    int guaranteed; /* slots protected from higher tiers this step (0 when inactive) */
    int victims;    /* scratch: candidates taken while choosing victims */
    int planned;    /* scratch: decodes planned this step */
    /* Drain rate under load (sl_sched_tier_stats.drain_tokens_per_s): the latest step's prompt
     * rows of this tier and whether some of its prompt tokens were left after it; moving
     * averages of rows and durations over such steps. */
    int step_rows;
    int step_added; /* tokens queued again by preemptions in that step (recomputes go first) */
    bool step_backlogged;
    double ema_drain_rows, ema_drain_us;
};

/* One sequence's part of the step being built. */
struct sl_plan {
    struct sl_seq *s; /* NULL once its sequence was preempted by a later choice */
    int n;            /* rows, from s->n_computed */
};

/* The step-time model of the TPOT guard: exponentially weighted least squares of a step's
 * duration (us) on x = (1, decode rows, prompt rows, decode attended positions / 1000, prompt
 * attended positions / 1000). */
#define SL_SCHED_FIT_K 5
struct sl_sched_fit {
    double xtx[SL_SCHED_FIT_K][SL_SCHED_FIT_K];
    double xty[SL_SCHED_FIT_K];
    double theta[SL_SCHED_FIT_K]; /* the fit after the latest observation */
    int n_obs;
};

/* What the core remembers of its previous step, to learn from its duration. */
struct sl_step_shape {
    bool ran;        /* it ran the worker */
    bool left_work;  /* work was still pending after it: the next step followed at once */
    uint64_t now_ns; /* when it started */
    double x[SL_SCHED_FIT_K];
    int decodes;     /* decode rows */
    int prompt_rows; /* prompt (prefill and recompute) rows */
};

struct sl_sched_core {
    struct sl_sched_limits lim;
    struct sl_sched_worker worker;
    struct sl_sched_sink sink;

    struct sl_tier_q tiers[SL_SCHED_MAX_TIERS];
    int n_tiers;
    int tier_order[SL_SCHED_MAX_TIERS]; /* tier indices by (priority, index) */

    struct sl_seq **resident; /* (max_seqs) by (prio, arrival, order) */
    int n_resident;
    int n_seqs; /* held: queued or resident */
    uint64_t next_order;

    struct sl_kv_pool kv;
    int watermark; /* blocks kept spare when a sequence starts while others run */
    uint64_t prefix_query_tokens, prefix_hit_tokens; /* sl_sched_stats */
    /* The isolation of this step (see isolate() in core.c): tiers of a priority above iso_prio
     * have their prompt chunks cut and leave SL_SCHED_ISOLATION_SLOTS slots free. */
    bool iso_on;
    int iso_prio;

    /* The step being built. */
    uint64_t step_id;
    uint64_t now_ns;      /* the step's `now` */
    struct sl_plan *plan; /* (2 * max_seqs): entries of preempted sequences stay, dead */
    int n_plan;
    int n_plan_live;
    int rows;
    struct sl_seq **victims; /* (max_seqs) scratch */

    /* Step buffers, sized once from the limits. */
    int32_t *b_tokens;            /* (max_batch_tokens) */
    int32_t *b_pos;               /* (max_batch_tokens) */
    int32_t *b_seq;               /* (max_batch_tokens) */
    int32_t *b_ctx;               /* (max_seqs) */
    const int32_t **b_tables;     /* (max_seqs) */
    int32_t *b_logit_rows;        /* (max_seqs) */
    struct sl_seq **b_seqs;       /* (max_seqs) sequence of each batch slot */
    int *b_rows;                  /* (max_seqs) rows of each batch slot */
    struct sl_seq **b_logit_seqs; /* (max_seqs) which sequence each logits row samples for */
    float *logits;                /* (max_seqs, vocab) */
    void *sample_scratch;         /* sl_sample_scratch_size(vocab) */
    int32_t *pen_counts;          /* (vocab) zero between uses: sl_penalties_apply's counts */
    float *raw_row;               /* (vocab) a row's logits before sampling changes them */
    int32_t *model_stops;         /* (n_model_stops) the ids is_stop_token accepts */
    int n_model_stops;

    /* When the worker samples (forward_sample): each logit row's parameters, and its ids. */
    struct sl_sample_row *sample_rows; /* (max_seqs) */
    int32_t *sampled;                  /* (max_seqs) */

    /* Time, from the `now` of consecutive steps. */
    struct sl_step_shape prev;
    struct sl_sched_fit fit;
    double ema_prefill_rows, ema_prefill_us; /* for prefill_tokens_per_s */
    double ema_decode_us;                    /* for decode_step_seconds */

    /* For sl_sched_core_stats. */
    int last_step_rows, last_step_seqs;
    uint64_t steps;
    uint64_t preemptions;
};

/* The step-time model, exposed for tests: adds an observation (features x, duration us) and
 * refits; predicts a step's duration in us (0 until it has seen enough steps). */
void sl_sched_fit_add(struct sl_sched_fit *f, const double x[SL_SCHED_FIT_K], double us);
double sl_sched_fit_predict(const struct sl_sched_fit *f, const double x[SL_SCHED_FIT_K]);

/* The busy ratio's moving average (see sl_sched_stats): ratio after an interval of dt_ns of which
 * busy_ns were spent in forward(), given the ratio before it. Continuous-time exponential
 * smoothing with time constant SL_SCHED_BUSY_WINDOW_S, so it does not depend on how the time was
 * cut into steps; an idle interval is one with busy_ns = 0. */
double sl_sched_busy_update(double ratio, uint64_t dt_ns, uint64_t busy_ns);

/* Outbox producer side, used by the scheduler thread (sched.c). */
void sl_outbox_push(struct sl_outbox *o, struct sl_out_event *e);
void sl_outbox_wake(struct sl_outbox *o);

#endif
