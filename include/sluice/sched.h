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

struct sl_req_params {
    int max_tokens;    /* most tokens to generate, >= 1 */
    float temperature; /* 0 = greedy */
    float top_p;       /* (0, 1] */
    int top_k;         /* keep the k most likely; 0 = off */
    float min_p;       /* [0, 1]; 0 = off */
    uint64_t seed;     /* sampling seed */
    int n_stop;        /* stop strings, at most SL_REQ_MAX_STOPS */
    const char *stop[SL_REQ_MAX_STOPS];
    /* The tier the gateway classified the request into, copied from the configuration it
     * started with, so a reload cannot change them under a queued request. The scheduler does
     * not use them yet (tier-aware queues come with admission control). Zero when not set. */
    int tier;        /* index into the gateway configuration's tiers */
    int priority;    /* lower runs first */
    int weight;      /* capacity share relative to the other tiers */
    int ttft_slo_ms; /* p99 time-to-first-token objective */
    int tpot_slo_ms; /* p99 time-per-output-token objective */
};

struct sl_req;

/* Creates a request holding one reference (the caller's). Copies the prompt ids and the stop
 * strings. n_prompt >= 1. */
struct sl_req *sl_req_new(const int32_t *prompt, int n_prompt, const struct sl_req_params *p);
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

/* ---------------------------------------------------------------------------------------------
 * The core
 */

/* The worker as the core sees it. */
struct sl_sched_worker {
    void *ctx;
    /* Runs the batch and writes logits (b->n_logits, vocab). See struct sl_batch. */
    int (*forward)(void *ctx, const struct sl_batch *b, float *logits);
    /* True when sampling `token` ends the sequence (EOS/BOS rules of the model). */
    bool (*is_stop_token)(void *ctx, int32_t token);
};

/* Where the core reports what happened; called synchronously inside step() or cancel(). */
struct sl_sched_sink {
    void *ctx;
    /* A token was sampled and appended for r. Return true to finish the sequence now with
     * SL_FINISH_STOP (a stop string matched); `done` then follows. */
    bool (*token)(void *ctx, struct sl_req *r, int32_t token);
    /* r left the scheduler (finished, cancelled or failed); n_generated tokens were produced.
     * The core drops its reference right after this returns. */
    void (*done)(void *ctx, struct sl_req *r, enum sl_finish why, int status, int n_generated);
};

struct sl_sched_limits {
    int vocab;            /* logits per row */
    int max_ctx;          /* the model's context length */
    int max_seqs;         /* most running sequences in one step */
    int max_batch_tokens; /* most rows (prefill + decode) in one step */
    int n_blocks;         /* KV blocks in the worker's pool */
    int block_size;       /* positions per KV block */
};

struct sl_sched_core;

struct sl_sched_core *sl_sched_core_new(const struct sl_sched_limits *lim,
                                        const struct sl_sched_worker *w,
                                        const struct sl_sched_sink *sink);
/* Cancels and reports every request still held, then frees. */
void sl_sched_core_free(struct sl_sched_core *c);

/* Queues r (the core takes its own reference). Returns SL_ERANGE when r can never fit (prompt +
 * max_tokens over the context or over the whole KV pool); the core then keeps no reference. */
int sl_sched_core_submit(struct sl_sched_core *c, struct sl_req *r, uint64_t now_ns);
/* Removes r wherever it is and reports done(CANCELLED). A request the core no longer holds is
 * ignored. */
void sl_sched_core_cancel(struct sl_sched_core *c, struct sl_req *r);
/* Builds and runs one step: every running sequence decodes one token, then waiting prompts are
 * prefilled in chunks up to max_batch_tokens (continuous batching: new requests join between
 * steps, finished ones leave). Returns the number of rows run (0 when idle) or a negative
 * status when the worker failed (every sequence of the step is then finished with ERROR). */
int sl_sched_core_step(struct sl_sched_core *c, uint64_t now_ns);
/* Requests queued or running. */
int sl_sched_core_pending(const struct sl_sched_core *c);
int sl_sched_core_running(const struct sl_sched_core *c);
int sl_sched_core_free_blocks(const struct sl_sched_core *c);

/* ---------------------------------------------------------------------------------------------
 * Statistics: what the scheduler publishes for admission, health and /metrics
 */

/* Most tiers a scheduler reports. */
#define SL_SCHED_MAX_TIERS 8

struct sl_sched_tier_stats {
    const char *name;          /* static, valid for the scheduler's life ("default" for now) */
    int running;               /* sequences holding KV blocks */
    int queued_requests;       /* requests waiting for a slot and their KV blocks */
    long queued_prompt_tokens; /* prompt tokens not yet prefilled, over waiting and running
                                  sequences: the prefill work ahead of a new arrival */
};

struct sl_sched_stats {
    /* Per tier. Until tiers reach the scheduler there is one, "default", holding everything. */
    int n_tiers;
    struct sl_sched_tier_stats tiers[SL_SCHED_MAX_TIERS];
    /* Sums over the tiers. */
    int running;
    int queued_requests;
    long queued_prompt_tokens;
    int kv_blocks_used; /* blocks owned by sequences (reserved for their whole length) */
    int kv_blocks_total;
    /* The latest step that ran the worker (0 before the first). */
    int last_step_rows; /* tokens in the batch: one per decode, plus prompt chunks */
    int last_step_seqs; /* sequences in the batch */
    uint64_t steps;     /* steps that ran the worker since start */
    /* Time, measured by the scheduler thread (the core leaves these 0). */
    double last_step_seconds; /* the whole step: building the batch, forward, sampling */
    double busy_seconds;      /* total time inside the worker's forward() since start */
    double busy_ratio;        /* time in forward() / wall time, averaged exponentially with a
                                 time constant of SL_SCHED_BUSY_WINDOW_S seconds; decays
                                 towards 0 while idle */
};

#define SL_SCHED_BUSY_WINDOW_S 10.0

/* Fills out with what the core knows now (every field but the times). Owner thread only. */
void sl_sched_core_stats(const struct sl_sched_core *c, struct sl_sched_stats *out);

/* ---------------------------------------------------------------------------------------------
 * Outboxes: the way back to an I/O thread
 */

enum sl_out_kind {
    SL_OUT_TEXT, /* a text delta (valid UTF-8, may be empty only when tokens advanced) */
    SL_OUT_DONE, /* the request finished; no more events for it */
};

struct sl_out_event {
    struct sl_out_event *next;
    struct sl_req *req; /* holds a reference, dropped by sl_out_event_free */
    enum sl_out_kind kind;
    char *text; /* TEXT: the delta (owned, NUL-terminated) */
    size_t len;
    int n_tokens;          /* TEXT: tokens this delta covers; DONE: total tokens generated */
    enum sl_finish finish; /* DONE */
    int status;            /* DONE with SL_FINISH_ERROR: why */
};

struct sl_outbox;

/* `wake(arg)` is called from the scheduler thread after a batch of events is queued (once per
 * step at most); it must be thread-safe (e.g. event_active on a pthreads-enabled base). */
struct sl_outbox *sl_outbox_new(void (*wake)(void *arg), void *arg);
/* Frees the outbox and any events still queued. No producer may use it any more. */
void sl_outbox_free(struct sl_outbox *o);
/* Takes every queued event, oldest first (NULL when empty). The consumer frees each. */
struct sl_out_event *sl_outbox_take(struct sl_outbox *o);
void sl_out_event_free(struct sl_out_event *e);

/* ---------------------------------------------------------------------------------------------
 * The scheduler thread
 */

struct sl_sched;

/* Starts the scheduler thread over `w` (which it then owns exclusively until sl_sched_free).
 * lim.vocab and lim.max_ctx come from the model. */
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
/* Published once per step for readers on other threads (admission, health). */
int sl_sched_running(const struct sl_sched *s);
int sl_sched_queued(const struct sl_sched *s);
/* A consistent snapshot of the statistics the scheduler thread published at the end of its latest
 * step (before that step's events reach the outboxes, so a client that has its answer sees the
 * state after the step that finished it), with busy_ratio decayed to now. Any thread; never
 * blocks the scheduler (a seqlock over relaxed atomics; the reader retries while a step is being
 * published). */
void sl_sched_stats(const struct sl_sched *s, struct sl_sched_stats *out);

#endif
