/* sluice — scheduler: requests, the continuous-batching core, its thread, and outboxes.
 *
 * Three layers:
 *  - struct sl_req: one admitted request, reference-counted, shared by the gateway (while the
 *    connection wants it) and the scheduler (while queued or running).
 *  - struct sl_sched_core: the policy. No I/O, no threads, no clock: `now` is passed to step(),
 *    the worker and the event sink are interfaces. Single-threaded: one owner calls it.
 *  - struct sl_sched: the thin adapter: a thread that owns a core and a worker, an inbox that any
 *    thread submits to and cancels through, and delivery of text to each request's outbox with
 *    one wake-up per outbox per step.
 */
#ifndef SLUICE_SCHED_H
#define SLUICE_SCHED_H

#include <sluice/common.h>
#include <sluice/worker.h>

/* ---------------------------------------------------------------------------------------------
 * Requests
 */

enum sl_finish {
    SL_FINISH_NONE = 0,
    SL_FINISH_STOP,      /* stop token or stop string ("stop") */
    SL_FINISH_LENGTH,    /* max_tokens or the context limit ("length") */
    SL_FINISH_CANCELLED, /* cancelled by the gateway (client gone) */
    SL_FINISH_ERROR,     /* the engine failed; see the event's status */
};

/* "stop", "length", "cancelled", "error", or NULL for NONE. */
const char *sl_finish_str(enum sl_finish f);

#define SL_REQ_MAX_STOPS 4
/* logit_bias entries a request may carry (OpenAI documents no limit; vLLM none either). */
#define SL_REQ_MAX_LOGIT_BIAS 1024
/* stop_token_ids a request may carry. */
#define SL_REQ_MAX_STOP_IDS 256

/* Most tiers a scheduler knows (the gateway's configuration allows as many). */
#define SL_SCHED_MAX_TIERS 32
/* Longest tier name in bytes. */
#define SL_SCHED_TIER_NAME_MAX 32
/* Longest tenant name in bytes (as the gateway's SL_TENANT_NAME_MAX). */
#define SL_SCHED_TENANT_NAME_MAX 64

/* How a tier orders the prompts of its tenants. VTC (virtual token counters; Sheng et al.,
 * "Fairness in Serving Large Language Models", OSDI '24): each tenant with work in the tier has a
 * counter of the service it received, w_in per prompt token prefilled and w_out per token
 * generated, divided by its share; prompt chunks and new admissions to the slots go first to the
 * tenant with the smallest counter, and a tenant that becomes active starts no lower than the
 * smallest counter among the active (no credit banked while idle). FCFS: arrival order, whoever
 * sent it. Decodes keep their priority order either way. */
enum sl_sched_fairness { SL_SCHED_VTC = 0, SL_SCHED_FCFS = 1 };

/* A tier as the scheduler uses it: a prefill queue with a share of each step's prompt tokens and
 * of the sequence slots, and a rank. */
struct sl_sched_tier {
    char name[SL_SCHED_TIER_NAME_MAX + 1];
    int priority;    /* lower runs first: decodes, prefill order, preemption */
    int weight;      /* share of prompt tokens and of slots while tiers compete (< 1 reads as 1) */
    int ttft_slo_ms; /* p99 objectives; 0 = none */
    int tpot_slo_ms;
    int fairness; /* enum sl_sched_fairness */
    float w_in;   /* VTC's weights of a prompt token and a generated one (both 0: 1 and 2) */
    float w_out;
    float w_cached; /* and of a prompt token the prefix cache gave (0: not counted; it was not
                       computed) */
    /* Isolation from lower tiers: while this tier has requests (or had, within
     * SL_SCHED_ISOLATION_HOLD_S), the prompt chunks of lower-priority tiers may add at most this
     * much to a step, as the step-time fit predicts (at least SL_SCHED_ISOLATION_MIN_ROWS rows a
     * step, so they never stop), and they leave SL_SCHED_ISOLATION_SLOTS slots free: a request of
     * this tier that arrives finds a slot, waits for a step at most that much longer than the
     * decodes alone, and shares its own step with as little. 0: off. */
    float isolation_ms;
};
/* Long enough that a tier with steady traffic is isolated all along: toggling with every gap
 * in its arrivals made the lower tiers' drain rate, which the SLO guard predicts with, jumpy. */
#define SL_SCHED_ISOLATION_HOLD_S 5.0
#define SL_SCHED_ISOLATION_MIN_ROWS 16
/* Slots lower tiers leave free while a tier's isolation is in effect, so that its arrivals start
 * at once instead of waiting for a lower tier's sequence to end. */
#define SL_SCHED_ISOLATION_SLOTS 2

struct sl_req_params {
    int max_tokens;    /* most tokens to generate, >= 1 */
    float temperature; /* 0 = greedy */
    float top_p;       /* (0, 1] */
    int top_k;         /* keep the k most likely; 0 = off */
    float min_p;       /* [0, 1]; 0 = off */
    uint64_t seed;     /* sampling seed */
    int n_stop;        /* stop strings, at most SL_REQ_MAX_STOPS */
    const char *stop[SL_REQ_MAX_STOPS];
    /* vLLM's stop controls. A stop string's own text is released too when include_stop_str.
     * n_stop_ids (at most SL_REQ_MAX_STOP_IDS) token ids that end the sequence once sampled (the
     * token's text is released, as any other's). ignore_eos: the model's stop tokens (see
     * is_stop_token) do not end it. The first min_tokens tokens generated never end it: the
     * model's stop tokens and stop_ids are not sampled (their logits are masked) and stop
     * strings do not match. */
    bool include_stop_str;
    bool keep_special; /* vLLM's skip_special_tokens: false: control tokens add their text */
    int n_stop_ids;
    const int32_t *stop_ids;
    bool ignore_eos;
    int min_tokens;
    /* Changes to the logits before sampling (struct sl_penalties): repetition (0 = off),
     * frequency, presence, and n_bias (at most SL_REQ_MAX_LOGIT_BIAS) logit_bias entries. */
    float repetition_penalty;
    float frequency_penalty;
    float presence_penalty;
    int n_bias;
    const int32_t *bias_ids;
    const float *bias;
    /* Report each generated token's log probability and its top_logprobs (at most
     * SL_MAX_TOP_LOGPROBS) most likely alternatives (struct sl_token_logprobs). */
    bool logprobs;
    int top_logprobs;
    /* The tier the request runs in, by value: the tier of the configuration it started with, so
     * a reload cannot change it under a queued request; and `tier`, that tier's index in the
     * table handed to the scheduler with that configuration. The scheduler queues the request in
     * its tier `tier` when that tier has the request's tier name (or the name is empty), without
     * looking it up; else (a reload renamed, removed or reordered tiers since) in the tier of
     * that name; else by its priority: the tier of the same priority, else the next lower one,
     * else the lowest. It ranks the request for decoding and preemption by its own priority,
     * and its own tpot_slo_ms is what the TPOT guard protects. Zero when not set (the first
     * tier). */
    int tier;
    struct sl_sched_tier sched_tier;
    /* Who sent it, for fairness inside its tier: the tenant's name (requests with the same name
     * are one tenant; "" is a tenant too) and its share of the tier (<= 0 reads as 1): the
     * service it receives is counted divided by it, so a share of 2 gets twice the tokens of a
     * share of 1 while both are backlogged. */
    char tenant[SL_SCHED_TENANT_NAME_MAX + 1];
    float share;
    /* Prefix caching (see "The prefix cache" below). With cache_prefix, the leading full KV
     * blocks the request's tokens share with blocks computed earlier under the same cache_key
     * are reused rather than computed, and its own full blocks are kept for later requests.
     * Blocks are shared only between equal keys: the gateway derives the key from the model,
     * the tenant (unless the cache's scope is global) and the request's own cache salt, so the
     * key is what isolates tenants from one another. */
    bool cache_prefix;
    uint64_t cache_key;
};

struct sl_req;

/* A prompt's token ids, BOS first, shared read-only by the requests that hold a reference to it
 * (the n choices of one completion): tokenized once, never copied on the way to the scheduler.
 * The last reference frees it. Any thread. */
struct sl_req_prompt;
/* Room for n ids, holding one reference (the caller's); fill it through sl_req_prompt_ids before
 * handing it to a request. A request with an empty prompt is refused at submit. */
struct sl_req_prompt *sl_req_prompt_new(int n);
/* A new prompt holding a copy of ids (n). */
struct sl_req_prompt *sl_req_prompt_copy(const int32_t *ids, int n);
int32_t *sl_req_prompt_ids(struct sl_req_prompt *pr); /* (n) */
int sl_req_prompt_n(const struct sl_req_prompt *pr);
struct sl_req_prompt *sl_req_prompt_ref(struct sl_req_prompt *pr);
void sl_req_prompt_unref(struct sl_req_prompt *pr);

/* Creates a request holding one reference (the caller's). It takes over the caller's reference
 * to prompt (sl_req_prompt_ref first to keep one), and copies the stop strings and the logit
 * bias. */
struct sl_req *sl_req_new(struct sl_req_prompt *prompt, const struct sl_req_params *p);
void sl_req_ref(struct sl_req *r);
/* Drops a reference; the last one frees the request. Any thread. */
void sl_req_unref(struct sl_req *r);

/* An opaque pointer for the submitting side (the gateway's connection). Only the thread that
 * owns the request's outbox may get or set it. */
void sl_req_set_user(struct sl_req *r, void *user);
void *sl_req_user(const struct sl_req *r);
int sl_req_n_prompt(const struct sl_req *r);
const struct sl_req_params *sl_req_params(const struct sl_req *r);
/* True once sl_sched_cancel() has been called on it. Any thread. */
bool sl_req_cancelled(const struct sl_req *r);
/* r's queue time: nanoseconds (sl_clock_ns) from sl_sched_submit() to the start of the first step
 * that ran part of it. Returns false, leaving *ns alone, while no step has run it (and for good
 * when it was refused or cancelled before it ran). Any thread; once true it stays true. */
bool sl_req_queue_ns(const struct sl_req *r, uint64_t *ns);
/* The device time charged to r so far, in nanoseconds: each forward's time (struct
 * sl_sched_worker's forward_ns) divided over the requests in its batch by the rows each had in it
 * (prompt tokens or a decode), the rounding's few nanoseconds to the first, so that the charges
 * of a forward add up to its time exactly. Any thread; final once r's DONE event is out. */
uint64_t sl_req_device_ns(const struct sl_req *r);
/* Prompt tokens of r whose KV the prefix cache gave it when it first started (OpenAI's
 * usage.prompt_tokens_details.cached_tokens): 0 until then, and when nothing was cached. A
 * recompute after preemption does not change it. Any thread; final once r has a token. */
int sl_req_cached_tokens(const struct sl_req *r);

/* ---------------------------------------------------------------------------------------------
 * The core
 *
 * One step (DESIGN.md, "Scheduling one step"):
 *  1. Decodes first: every running sequence whose prompt is computed gets one row, in order of
 *     (its priority, arrival), up to max_seqs sequences and max_batch_tokens rows. A sequence
 *     that needs a new KV block and finds none preempts the lowest-priority, latest-arrived
 *     running sequence (possibly itself): so a sequence is never preempted for one of a lower
 *     tier.
 *  2. The rest of the token budget goes to prompt chunks from the tiers' prefill queues: each
 *     tier with queued work gets a share proportional to its weight (fractions carried between
 *     steps), tiers in priority order; what a tier cannot use goes to the others, highest
 *     priority first (work-conserving: an idle tier's share is lent and taken back as soon as it
 *     has work). Within a tier, first come first served; a preempted sequence goes back to the
 *     front of its tier.
 *  3. A queued sequence starts (takes a slot and the KV blocks of its whole prompt) when a slot
 *     and its blocks are free, leaving one block in a hundred spare while others run. A sequence
 *     of a higher tier that cannot start may preempt running sequences of strictly lower tiers,
 *     latest first, as long as each of those tiers keeps its guaranteed slots: ceil(max_seqs *
 *     weight / sum of active weights) for every active tier but the highest, which gets the rest
 *     (at least one). Free slots a lower tier is owed stay free for it while it has work queued.
 *     It preempts only when waiting would cost too much: when no running sequence is predicted to
 *     end within SL_SCHED_PREEMPT_PATIENCE of its TTFT objective (a recompute is not free).
 *  4. Preemption frees the sequence's blocks and queues it at the front of its tier to
 *     recompute its prompt and the tokens it generated; nothing it has generated is reported
 *     again, and its output is what an uninterrupted run gives (when the worker's rows do not
 *     depend on the batch, as the CPU worker's do not).
 *  5. TPOT guard: the core fits the step time as a linear function of the batch (decode rows,
 *     prompt rows, and the positions each attends to) from the `now` of consecutive steps. While
 *     sequences with a TPOT objective are decoding, prompt chunks are cut so that the predicted
 *     step stays within SL_SCHED_GUARD_FRACTION of the tightest objective among them; when the
 *     decodes alone are predicted over it, decodes of sequences with a looser objective pause
 *     as long as their own gap stays within the same fraction of their own objective (one step
 *     at a time without one), and never below their tier's guaranteed slots.
 * Blocks grow with the sequence: a prompt's at start, then one block per block_size tokens.
 *
 * The prefix cache. A full block whose KV is written is identified by a 128-bit hash of its
 * token ids chained with its parent block's hash, from the request's cache_key at the root
 * (keyed with a secret seed, so a client cannot aim a collision; the tokens are compared too).
 * Blocks are reference-counted: a sequence that starts takes, instead of fresh blocks, the
 * longest chain of cached blocks that matches its known tokens (at most all but one token: the
 * last position is always computed, for its logits) and computes from the end of it. Only full
 * blocks are shared and a sequence only writes past its shared ones, so no block is written
 * while shared. A block whose last holder leaves stays cached in an LRU of unheld blocks, the
 * tail of a sequence before its head, and is reused for other content only when no free block
 * is left (allocation takes truly free blocks first). A preempted sequence's full blocks stay
 * cached the same way, so its recompute mostly finds them. Two sequences that compute the same
 * prefix at once (the second started before the first's blocks were written) each compute their
 * own; the first registered is cached, the other stays private and is freed at its end.
 */

/* The worker as the core sees it. */
struct sl_sched_worker {
    void *ctx;
    /* Runs the batch and writes logits (b->n_logits, vocab). See struct sl_batch. */
    int (*forward)(void *ctx, const struct sl_batch *b, float *logits);
    /* Optional: runs the batch and samples its logit rows where the logits are (see struct
     * sl_backend_ops.forward_sample), writing ids (b->n_logits). When set, the core calls it
     * instead of forward, with each row's sampling parameters and the coin drawn from its
     * sequence's rng. */
    int (*forward_sample)(void *ctx, const struct sl_batch *b, const struct sl_sample_row *rows,
                          int32_t *ids);
    /* True when sampling `token` ends the sequence (EOS/BOS rules of the model), unless the
     * request sets ignore_eos or has not reached min_tokens. Asked once for every id when the
     * core is created (to list what min_tokens masks), then per sampled token. */
    bool (*is_stop_token)(void *ctx, int32_t token);
    /* Optional: how long the latest forward or forward_sample took (the caller's clock, ns),
     * which the core divides over the batch's requests (sl_req_device_ns); without it nothing
     * is charged. */
    uint64_t (*forward_ns)(void *ctx);
};

/* Where the core reports what happened; called synchronously inside step() or cancel(). */
struct sl_sched_sink {
    void *ctx;
    /* A token was sampled and appended for r. Return true to finish the sequence now with
     * SL_FINISH_STOP (a stop string matched); `done` then follows. */
    bool (*token)(void *ctx, struct sl_req *r, int32_t token);
    /* Optional: for a request that asked for log probabilities, called with a token's right
     * before token() is called with it (never for a token that ends the sequence by the model's
     * EOS rules, which token() does not see either; with ignore_eos both see it). */
    void (*logprobs)(void *ctx, struct sl_req *r, const struct sl_token_logprobs *lp);
    /* r left the scheduler (finished, cancelled or failed); n_generated tokens were produced.
     * The core drops its reference right after this returns. */
    void (*done)(void *ctx, struct sl_req *r, enum sl_finish why, int status, int n_generated);
    /* Optional (may be NULL): r was preempted; it will recompute and go on. */
    void (*preempted)(void *ctx, struct sl_req *r);
};

/* A queued sequence that could start only by preempting waits instead while a running sequence
 * is predicted to end within this fraction of its TTFT objective (from its arrival). */
#define SL_SCHED_PREEMPT_PATIENCE 0.25

/* The TPOT guard keeps predicted steps within this fraction of the tightest TPOT objective. */
#define SL_SCHED_GUARD_FRACTION 0.8

struct sl_sched_limits {
    int vocab;            /* logits per row */
    int max_ctx;          /* the model's context length */
    int max_seqs;         /* most running sequences (holding KV blocks; one slot each) */
    int max_batch_tokens; /* most rows (prefill + decode) in one step */
    int n_blocks;         /* KV blocks in the worker's pool */
    int block_size;       /* positions per KV block */
    /* The tier table (copied; at most SL_SCHED_MAX_TIERS). None: one tier "default". */
    const struct sl_sched_tier *tiers;
    int n_tiers;
    /* The keys of the prefix cache's hash: secret, so that clients cannot aim collisions
     * (sl_sched_new draws them at random when all are 0). */
    uint64_t cache_seed[4];
};

struct sl_sched_core;

/* NULL when a limit is out of range. */
struct sl_sched_core *sl_sched_core_new(const struct sl_sched_limits *lim,
                                        const struct sl_sched_worker *w,
                                        const struct sl_sched_sink *sink);
/* Cancels and reports every request still held, then frees. */
void sl_sched_core_free(struct sl_sched_core *c);

/* Replaces the tier table (copied; n = 0: one tier "default"). Requests held are moved to the
 * tier of their name (else by their priority, see struct sl_req_params), keeping their order
 * and their own priority and objectives. SL_EINVAL when n is out of range. */
int sl_sched_core_set_tiers(struct sl_sched_core *c, const struct sl_sched_tier *tiers, int n);
/* Queues r at the back of its tier (the core takes its own reference). now_ns is its arrival,
 * which ranks it against others. Returns SL_ERANGE when r can never fit (prompt + max_tokens
 * over the context or over the whole KV pool); the core then keeps no reference. */
int sl_sched_core_submit(struct sl_sched_core *c, struct sl_req *r, uint64_t now_ns);
/* Removes r wherever it is, frees its blocks and reports done(CANCELLED). A request the core no
 * longer holds is ignored. */
void sl_sched_core_cancel(struct sl_sched_core *c, struct sl_req *r);
/* Builds and runs one step (see above). now_ns must not go backwards; the time between two
 * steps, when the first left work pending, is taken as the first step's duration. Returns the
 * number of rows run (0 when idle) or a negative status when the worker failed (every sequence
 * of the step is then finished with ERROR). */
int sl_sched_core_step(struct sl_sched_core *c, uint64_t now_ns);
/* Requests queued or running. */
int sl_sched_core_pending(const struct sl_sched_core *c);
int sl_sched_core_running(const struct sl_sched_core *c);
int sl_sched_core_free_blocks(const struct sl_sched_core *c);
/* Tokens of ids (n, BOS first) that a request with cache key `key` would find in the prefix
 * cache now: a multiple of block_size, at most n - 1. Changes nothing (no block is pinned). */
int sl_sched_core_prefix_match(const struct sl_sched_core *c, uint64_t key, const int32_t *ids,
                               int n);

/* ---------------------------------------------------------------------------------------------
 * Statistics: what the scheduler publishes for admission, health and /metrics
 */

struct sl_sched_tier_stats {
    char name[SL_SCHED_TIER_NAME_MAX + 1];
    int running;               /* sequences holding KV blocks */
    int queued_requests;       /* requests waiting for a slot and their KV blocks */
    long queued_prompt_tokens; /* prompt tokens not yet prefilled, over waiting and running
                                  sequences (a preempted one's generated tokens count: they are
                                  recomputed): the prefill work ahead of a new arrival */
    int priority;
    int weight;
    uint64_t preemptions; /* of this tier's sequences, since start */
    /* Prompt tokens of this tier prefilled per second (less those a preemption queued again in
     * front), measured over the steps after which at least max_batch_tokens of its prompt tokens
     * were still waiting: how fast a real backlog drains, whatever holds it back (its weighted
     * share of each step, slots, KV blocks), rather than how fast requests arrive. Rows over
     * time with the past discounted by exp(-age / SL_SCHED_DRAIN_WINDOW_S); 0 until measured. */
    double drain_tokens_per_s;
};

struct sl_sched_stats {
    /* Per tier, as the current tier table gives them. */
    int n_tiers;
    struct sl_sched_tier_stats tiers[SL_SCHED_MAX_TIERS];
    /* Sums over the tiers. */
    int running;
    int queued_requests;
    long queued_prompt_tokens;
    int kv_blocks_used; /* blocks held by sequences (a shared block counts once) */
    int kv_blocks_total;
    int kv_blocks_cached; /* blocks no sequence holds that keep a prefix for reuse: free for
                             allocation, evicted (least recently used first) when needed */
    /* The prefix cache since start, as vLLM counts it: prompt tokens of requests with
     * cache_prefix looked up at their first start, and those found cached; cached blocks
     * evicted (reused for other content). */
    uint64_t prefix_query_tokens;
    uint64_t prefix_hit_tokens;
    uint64_t prefix_evictions;
    uint64_t preemptions;
    /* The latest step that ran the worker (0 before the first). */
    int last_step_rows; /* tokens in the batch: one per decode, plus prompt chunks */
    int last_step_seqs; /* sequences in the batch */
    uint64_t steps;     /* steps that ran the worker since start */
    /* Measured by the core from the `now` of consecutive steps (0 until measured):
     * exponential moving averages (weight 1/8 for the newest step). */
    double prefill_tokens_per_s; /* prompt rows per second of steps that had them */
    double decode_step_seconds;  /* duration of steps that had decodes: the inter-token time */
    /* Prompt rows per second of a step filled with prompt chunks next to the sequences decoding
     * now, as the step-time fit predicts it (0 until fitted): the prefill rate a backlog gets,
     * which prefill_tokens_per_s understates while few prompt rows arrive. */
    double prefill_capacity_tokens_per_s;
    int max_seqs; /* the limits, for readers that model the queue */
    int max_batch_tokens;
    int block_size; /* positions per KV block (as kv_blocks_total counts them) */
    /* Time, measured by the scheduler thread (the core leaves these 0). */
    double last_step_seconds; /* the whole step: building the batch, forward, sampling */
    double busy_seconds;      /* total time inside the worker's forward() since start */
    double busy_ratio;        /* time in forward() / wall time, averaged exponentially with a
                                 time constant of SL_SCHED_BUSY_WINDOW_S seconds; decays
                                 towards 0 while idle */
};

#define SL_SCHED_BUSY_WINDOW_S 10.0
/* 10 s: a flooded tier's rows come in bursts as slots turn over, seconds apart; over eight
 * simulated floods a 2 s window put 70 % of batch's predictions near its objective on the right
 * side of it, 10 s 95 % (tests/admission/test_gcra.c). */
#define SL_SCHED_DRAIN_WINDOW_S 10.0

/* Fills out with what the core knows now (every field but the thread's times). Owner thread
 * only. */
void sl_sched_core_stats(const struct sl_sched_core *c, struct sl_sched_stats *out);

/* ---------------------------------------------------------------------------------------------
 * Simulation: the same core under a virtual clock, with a cost-model worker
 *
 * Deterministic: the same inputs give the same figures, bit for bit. The worker keeps a KV pool
 * of rolling hashes of token prefixes and predicts each next token from the prefix it reads back
 * through the block table, so every generated token is also checked against what an
 * uninterrupted lone run gives (paging, chunking and preemption must all be right).
 */

/* A worker's step time: base + row * rows + logit * rows with logits + attn_decode * positions
 * attended by a sequence's lone row + attn_prefill * positions attended by rows of multi-row
 * chunks (a row at position p attends p + 1). Microseconds. */
struct sl_sim_cost {
    double base_us;
    double row_us;
    double logit_us;
    double attn_decode_us;
    double attn_prefill_us;
    size_t kv_bytes_per_token; /* for sizing a pool in bytes (not used by the step time) */
};

/* Fitted to engine-bench's figures for synthetic:stories15M on the 2-vCPU development VM
 * (bench/README.md, "Cost model of the simulator"). */
extern const struct sl_sim_cost sl_sim_cost_stories15m_cpu;

/* The model's time for a batch, in microseconds. */
double sl_sim_cost_us(const struct sl_sim_cost *m, const struct sl_batch *b);

struct sl_sim_request {
    double arrival_s;        /* >= 0 */
    int tier;                /* index into the simulation's tiers */
    int tenant;              /* the caller's tag, not used by the simulation */
    int prompt_tokens;       /* >= 1 */
    int output_tokens;       /* >= 1: generated to the end (no stop token) */
    const char *tenant_name; /* for fairness inside its tier (NULL: ""), and its share */
    float share;
    /* > 0: the requests of the same group start with the same prefix_tokens prompt tokens
     * (after BOS), which the prefix cache may share when the simulation has it on. */
    int prefix_group;
    int prefix_tokens;
};

struct sl_sim_config {
    struct sl_sched_limits lim; /* vocab is the simulator's own; tiers as the server's */
    struct sl_sim_cost cost;
    /* The baseline: a batch of up to max_seqs queued requests starts only when the previous
     * batch has finished entirely (no joining between steps). */
    bool static_batching;
    /* Requests use the prefix cache (one key for all: the cache's global scope). */
    bool prefix_cache;
    /* Optional: called at each request's arrival (virtual time), just before it is submitted,
     * with the statistics the core publishes at that moment, so that a prediction made from them
     * (the admission guard's) can be checked against what the run then gives. */
    void (*on_arrival)(void *ctx, int idx, const struct sl_sched_stats *st);
    void *on_arrival_ctx;
};

/* One request's fate. Times in seconds from its arrival. */
struct sl_sim_result {
    enum sl_finish finish; /* LENGTH when it finished; ERROR when refused (status says why) */
    int status;
    int n_out;      /* tokens generated */
    int mismatches; /* generated tokens that differ from an uninterrupted run's (0: lossless) */
    int preemptions;
    int cached_tokens;                  /* prompt tokens the prefix cache gave it */
    double ttft_s;                      /* to the first token; < 0 when none */
    double e2e_s;                       /* to the last token */
    double tpot_s;                      /* (e2e - ttft) / (n_out - 1); 0 with one token */
    double max_itl_s;                   /* longest gap between two of its tokens */
    double first_token_at_s, done_at_s; /* virtual clock, from the simulation's start */
};

struct sl_sim_tier_report {
    int requests, completed, refused;
    double ttft_ms[3]; /* p50, p90, p99 over requests that produced a token */
    double tpot_ms[3]; /* over completed requests with more than one token */
    double e2e_ms[3];  /* over completed requests */
    double itl_ms[3];  /* over every gap between tokens */
    double max_itl_ms;
    double slo_attainment; /* share of requests with TTFT and TPOT within the tier's */
    double throughput_rps; /* completed / the simulation's makespan */
    double output_tokens_per_s;
    long preemptions;
};

struct sl_sim_report {
    int n_tiers; /* as lim.n_tiers, at least 1 */
    struct sl_sim_tier_report tiers[SL_SCHED_MAX_TIERS];
    double makespan_s; /* first arrival to last completion */
    long steps;
    double busy_s; /* virtual time spent in steps */
    long output_tokens;
    long mismatches; /* over every request: 0 when every output is what a lone run gives */
    long prompt_tokens, cached_tokens; /* over every request: the prefix cache's hits */
};

/* Runs reqs (any order; ties keep their order) to completion. results: (n) or NULL. Returns
 * SL_OK, SL_EINVAL for a bad config or request (report untouched), or the status of a failed
 * step. */
int sl_sim_run(const struct sl_sim_config *cfg, const struct sl_sim_request *reqs, int n,
               struct sl_sim_result *results, struct sl_sim_report *rep);

/* ---------------------------------------------------------------------------------------------
 * Outboxes: the way back to an I/O thread
 */

enum sl_out_kind {
    SL_OUT_TEXT, /* a text delta (valid UTF-8, may be empty only when tokens advanced) */
    SL_OUT_DONE, /* the request finished; no more events for it */
};

/* Text up to this many bytes travels inside its event (a token's text usually does). */
#define SL_OUT_INLINE 48

struct sl_out_event {
    struct sl_out_event *next;
    struct sl_req *req; /* holds a reference, dropped by sl_out_event_free */
    enum sl_out_kind kind;
    char *text; /* TEXT: the delta (NUL-terminated): in `inline_text`, or owned when longer */
    size_t len;
    int n_tokens; /* TEXT: tokens this delta covers; DONE: total tokens generated */
    /* TEXT, when the request asked for log probabilities: one entry per token the delta covers,
     * in order (owned). */
    struct sl_token_logprobs *lp;
    int n_lp;
    enum sl_finish finish; /* DONE */
    int status;            /* DONE with SL_FINISH_ERROR: why */
    int stop_index;        /* DONE with SL_FINISH_STOP: the params.stop string that ended it, or
                            * -1 (a stop token) */
    char inline_text[SL_OUT_INLINE + 1]; /* last: a recycled event is cleared up to here */
};

struct sl_outbox;

/* `wake(arg)` is called from the scheduler thread after a batch of events is queued (once per
 * step at most); it must be thread-safe (e.g. event_active on a pthreads-enabled base). */
struct sl_outbox *sl_outbox_new(void (*wake)(void *arg), void *arg);
/* Frees the outbox and any events still queued. No producer may use it any more. */
void sl_outbox_free(struct sl_outbox *o);
/* Takes every queued event, oldest first (NULL when empty). The consumer gives them back with
 * sl_outbox_recycle (or frees each with sl_out_event_free). */
struct sl_out_event *sl_outbox_take(struct sl_outbox *o);
/* Gives a list of taken events back (their request references dropped): the outbox keeps up to
 * SL_OUTBOX_SPARE of them for its producers to fill again, so a stream's events cost no
 * allocation once warm. Consumer thread. */
#define SL_OUTBOX_SPARE 4096
void sl_outbox_recycle(struct sl_outbox *o, struct sl_out_event *list);
/* Producer side: an empty event (zeroed), from the outbox's spares or new; the producer fills it
 * (sl_out_event_set_text for text) and pushes it. */
struct sl_out_event *sl_outbox_event(struct sl_outbox *o);
/* Copies text[0..len) into e: inline when it fits. */
void sl_out_event_set_text(struct sl_out_event *e, const char *text, size_t len);
void sl_out_event_free(struct sl_out_event *e);

/* ---------------------------------------------------------------------------------------------
 * The scheduler thread
 */

struct sl_sched;

/* Starts the scheduler thread over `w` (which it then owns exclusively until sl_sched_free).
 * lim.vocab and lim.max_ctx come from the model; lim.tiers is copied before this returns. */
int sl_sched_new(struct sl_worker *w, const struct sl_sched_limits *lim, struct sl_sched **out);
/* Stops the thread (requests still held finish with CANCELLED), joins, frees. The worker stays
 * the caller's. */
void sl_sched_free(struct sl_sched *s);

/* Hands r to the scheduler; its events go to `box`. Any thread. Takes a reference. Errors that
 * the core finds (SL_ERANGE) arrive as a DONE event with status set. */
int sl_sched_submit(struct sl_sched *s, struct sl_req *r, struct sl_outbox *box);
/* Asks for r to be cancelled; a DONE(CANCELLED) follows unless it already finished. Any thread.
 * Its KV blocks are free by the end of the next step. */
void sl_sched_cancel(struct sl_sched *s, struct sl_req *r);
/* Hands the scheduler a new tier table (copied before this returns; see
 * sl_sched_core_set_tiers). It travels through the inbox, so requests submitted before this call
 * are queued under the old table and re-homed by name, those after it under the new one. Any
 * thread (the main thread on SIGHUP). SL_EINVAL when n is out of range. */
int sl_sched_set_tiers(struct sl_sched *s, const struct sl_sched_tier *tiers, int n);
/* Published once per step for readers on other threads (admission, health). */
int sl_sched_running(const struct sl_sched *s);
int sl_sched_queued(const struct sl_sched *s);
/* A consistent snapshot of the statistics the scheduler thread published at the end of its latest
 * step (before that step's events reach the outboxes, so a client that has its answer sees the
 * state after the step that finished it), with busy_ratio decayed to now. Any thread; never
 * blocks the scheduler (a seqlock over relaxed atomics; the reader retries while a step is being
 * published). */
void sl_sched_stats(const struct sl_sched *s, struct sl_sched_stats *out);
/* Tokens of ids (n, BOS first) that a request with cache key `key` is predicted to find in s's
 * prefix cache: as sl_sched_core_prefix_match, but from an index the scheduler thread publishes
 * (lock-free, never blocks it), for admission's TTFT prediction. Nothing is pinned: the blocks
 * may be evicted before the request starts, when the scheduler matches again exactly and
 * computes whatever is gone (the queue figures then count it). Any thread. */
int sl_sched_prefix_match(const struct sl_sched *s, uint64_t key, const int32_t *ids, int n);

#endif
