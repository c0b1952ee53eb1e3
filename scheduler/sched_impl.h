/* Private layouts of the scheduler module; its tests may include this. */
#ifndef SLUICE_SCHED_IMPL_H
#define SLUICE_SCHED_IMPL_H

#include <sluice/sched.h>

#include <pthread.h>
#include <stdatomic.h>

struct sl_seq;

struct sl_req {
    atomic_int refs;
    atomic_bool cancelled;
    int32_t *prompt; /* (n_prompt) token ids, BOS first */
    int n_prompt;
    struct sl_req_params params; /* stop strings point into stop_copy */
    char *stop_copy[SL_REQ_MAX_STOPS];
    void *user; /* the outbox owner's thread only */
    /* Queue time (sl_req_queue_ns): stamped by sl_sched_submit's caller and by the core at the
     * start of the first step that runs the request; SL_REQ_NOT_YET until then. */
    _Atomic uint64_t submit_ns;
    _Atomic uint64_t first_step_ns;

    /* Scheduler thread only. */
    struct sl_seq *seq;     /* the core's state while it holds the request */
    struct sl_outbox *box;  /* where events go */
    struct sl_detok *detok; /* token ids → text, stop strings */
    struct sl_str pending;  /* text released this step, not yet posted */
    int pending_tokens;     /* tokens behind `pending` */
    bool dirty;             /* on the adapter's list of requests with pending text */
};

#define SL_REQ_NOT_YET UINT64_MAX

/* A sequence as the core tracks it. */
enum sl_seq_state { SL_SEQ_WAITING, SL_SEQ_RUNNING };

struct sl_seq {
    struct sl_req *req; /* the core's reference */
    enum sl_seq_state state;
    int32_t *tokens; /* (n_prompt + max_tokens) prompt then generated ids */
    int n_tokens;    /* ids known so far */
    int n_computed;  /* positions whose KV is written */
    int n_generated;
    int32_t *blocks; /* (n_blocks) KV block ids reserved for the whole sequence */
    int n_blocks;
    struct sl_rng rng;
    uint64_t arrival_ns;
};

struct sl_sched_core {
    struct sl_sched_limits lim;
    struct sl_sched_worker worker;
    struct sl_sched_sink sink;

    struct sl_seq **waiting; /* FIFO of sequences whose prompt is not fully computed */
    int n_waiting, cap_waiting;
    struct sl_seq **running; /* (max_seqs) sequences holding KV blocks */
    int n_running;

    int32_t *free_blocks; /* (n_blocks) stack of free block ids */
    int n_free;

    /* Step buffers, sized once from the limits. */
    int32_t *b_tokens;            /* (max_batch_tokens) */
    int32_t *b_pos;               /* (max_batch_tokens) */
    int32_t *b_seq;               /* (max_batch_tokens) */
    int32_t *b_ctx;               /* (max_seqs) */
    const int32_t **b_tables;     /* (max_seqs) */
    int32_t *b_logit_rows;        /* (max_seqs) */
    struct sl_seq **b_seqs;       /* (max_seqs) sequence of each batch slot */
    struct sl_seq **b_logit_seqs; /* (max_seqs) which sequence each logits row samples for */
    float *logits;                /* (max_seqs, vocab) */
    void *sample_scratch;         /* sl_sample_scratch_size(vocab) */

    /* For sl_sched_core_stats. */
    int last_step_rows, last_step_seqs;
    uint64_t steps;
};

/* The busy ratio's moving average (see sl_sched_stats): ratio after an interval of dt_ns of which
 * busy_ns were spent in forward(), given the ratio before it. Continuous-time exponential
 * smoothing with time constant SL_SCHED_BUSY_WINDOW_S, so it does not depend on how the time was
 * cut into steps; an idle interval is one with busy_ns = 0. */
double sl_sched_busy_update(double ratio, uint64_t dt_ns, uint64_t busy_ns);

/* Outbox producer side, used by the scheduler thread (sched.c). */
void sl_outbox_push(struct sl_outbox *o, struct sl_out_event *e);
void sl_outbox_wake(struct sl_outbox *o);

#endif
