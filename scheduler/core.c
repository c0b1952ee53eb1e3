/* The scheduling core: continuous batching over a paged KV pool.
 *
 * Pure policy: no I/O, no threads, no clock. Each step decodes one token for every running
 * sequence, then spends what is left of max_batch_tokens on prompt chunks of waiting sequences in
 * arrival order (chunked prefill: a long prompt never stalls decodes). A sequence reserves the
 * KV blocks for its whole length (prompt + max_tokens) when it starts, so the spine never needs
 * preemption; a sequence whose blocks are not free yet waits its turn (issue 5 replaces this with
 * on-demand allocation and preemption).
 */
#include "sched_impl.h"

#include <stdlib.h>
#include <string.h>

static int blocks_for(const struct sl_sched_core *c, int n_positions)
{
    return (n_positions + c->lim.block_size - 1) / c->lim.block_size;
}

struct sl_sched_core *sl_sched_core_new(const struct sl_sched_limits *lim,
                                        const struct sl_sched_worker *w,
                                        const struct sl_sched_sink *sink)
{
    if (lim->vocab < 1 || lim->max_ctx < 1 || lim->max_seqs < 1 || lim->max_batch_tokens < 1 ||
        lim->n_blocks < 1 || lim->block_size < 1)
        return NULL;
    struct sl_sched_core *c = sl_xcalloc(1, sizeof *c);
    c->lim = *lim;
    c->worker = *w;
    c->sink = *sink;
    c->running = sl_xcalloc((size_t)lim->max_seqs, sizeof *c->running);
    c->free_blocks = sl_xmalloc(sizeof(int32_t) * (size_t)lim->n_blocks);
    /* Lowest ids on top of the stack: deterministic and cache-friendly at low load. */
    for (int i = 0; i < lim->n_blocks; i++)
        c->free_blocks[i] = lim->n_blocks - 1 - i;
    c->n_free = lim->n_blocks;
    size_t nt = (size_t)lim->max_batch_tokens, ns = (size_t)lim->max_seqs;
    c->b_tokens = sl_xmalloc(sizeof(int32_t) * nt);
    c->b_pos = sl_xmalloc(sizeof(int32_t) * nt);
    c->b_seq = sl_xmalloc(sizeof(int32_t) * nt);
    c->b_ctx = sl_xmalloc(sizeof(int32_t) * ns);
    c->b_tables = sl_xmalloc(sizeof(*c->b_tables) * ns);
    c->b_logit_rows = sl_xmalloc(sizeof(int32_t) * ns);
    c->b_seqs = sl_xmalloc(sizeof(*c->b_seqs) * ns);
    c->b_logit_seqs = sl_xmalloc(sizeof(*c->b_logit_seqs) * ns);
    c->logits = sl_xmalloc(sizeof(float) * ns * (size_t)lim->vocab);
    c->sample_scratch = sl_xmalloc(sl_sample_scratch_size(lim->vocab));
    return c;
}

static void seq_release(struct sl_sched_core *c, struct sl_seq *s)
{
    for (int i = 0; i < s->n_blocks; i++)
        c->free_blocks[c->n_free++] = s->blocks[i];
    free(s->blocks);
    free(s->tokens);
    s->req->seq = NULL;
    free(s);
}

/* Takes s out of whichever list holds it (order of the rest is kept). */
static void seq_unlink(struct sl_sched_core *c, struct sl_seq *s)
{
    struct sl_seq **list = s->state == SL_SEQ_RUNNING ? c->running : c->waiting;
    int *n = s->state == SL_SEQ_RUNNING ? &c->n_running : &c->n_waiting;
    for (int i = 0; i < *n; i++) {
        if (list[i] == s) {
            memmove(&list[i], &list[i + 1], sizeof *list * (size_t)(*n - i - 1));
            (*n)--;
            return;
        }
    }
}

/* Reports the end of s, frees its blocks and drops the core's reference. */
static void seq_finish(struct sl_sched_core *c, struct sl_seq *s, enum sl_finish why, int status)
{
    struct sl_req *r = s->req;
    int n_generated = s->n_generated;
    seq_unlink(c, s);
    seq_release(c, s);
    c->sink.done(c->sink.ctx, r, why, status, n_generated);
    sl_req_unref(r);
}

void sl_sched_core_free(struct sl_sched_core *c)
{
    if (!c)
        return;
    while (c->n_running)
        seq_finish(c, c->running[c->n_running - 1], SL_FINISH_CANCELLED, SL_ECANCELED);
    while (c->n_waiting)
        seq_finish(c, c->waiting[c->n_waiting - 1], SL_FINISH_CANCELLED, SL_ECANCELED);
    free(c->waiting);
    free(c->running);
    free(c->free_blocks);
    free(c->b_tokens);
    free(c->b_pos);
    free(c->b_seq);
    free(c->b_ctx);
    free(c->b_tables);
    free(c->b_logit_rows);
    free(c->b_seqs);
    free(c->b_logit_seqs);
    free(c->logits);
    free(c->sample_scratch);
    free(c);
}

int sl_sched_core_submit(struct sl_sched_core *c, struct sl_req *r, uint64_t now_ns)
{
    const struct sl_req_params *p = &r->params;
    if (r->n_prompt < 1 || p->max_tokens < 1 || r->seq)
        return SL_EINVAL;
    long total = (long)r->n_prompt + p->max_tokens;
    if (total > c->lim.max_ctx || blocks_for(c, (int)total) > c->lim.n_blocks)
        return SL_ERANGE;
    struct sl_seq *s = sl_xcalloc(1, sizeof *s);
    s->req = r;
    sl_req_ref(r);
    s->state = SL_SEQ_WAITING;
    s->tokens = sl_xmalloc(sizeof(int32_t) * (size_t)total);
    memcpy(s->tokens, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    s->n_tokens = r->n_prompt;
    s->arrival_ns = now_ns;
    sl_rng_seed(&s->rng, p->seed);
    r->seq = s;
    if (c->n_waiting == c->cap_waiting) {
        c->cap_waiting = c->cap_waiting ? 2 * c->cap_waiting : 16;
        c->waiting = sl_xrealloc(c->waiting, sizeof *c->waiting * (size_t)c->cap_waiting);
    }
    c->waiting[c->n_waiting++] = s;
    return SL_OK;
}

void sl_sched_core_cancel(struct sl_sched_core *c, struct sl_req *r)
{
    if (r->seq)
        seq_finish(c, r->seq, SL_FINISH_CANCELLED, SL_ECANCELED);
}

/* Moves waiting sequences to running, in arrival order, while a slot and their blocks are
 * free. Stops at the first that does not fit so a big prompt is not starved by small ones. */
static void admit_waiting(struct sl_sched_core *c)
{
    while (c->n_waiting && c->n_running < c->lim.max_seqs) {
        struct sl_seq *s = c->waiting[0];
        int need = blocks_for(c, s->n_tokens + s->req->params.max_tokens);
        if (need > c->n_free)
            return;
        s->blocks = sl_xmalloc(sizeof(int32_t) * (size_t)need);
        for (int i = 0; i < need; i++)
            s->blocks[i] = c->free_blocks[--c->n_free];
        s->n_blocks = need;
        memmove(&c->waiting[0], &c->waiting[1], sizeof *c->waiting * (size_t)(c->n_waiting - 1));
        c->n_waiting--;
        s->state = SL_SEQ_RUNNING;
        c->running[c->n_running++] = s;
    }
}

/* Adds rows [from, from + n) of s to the batch; the last row samples when it reaches the end of
 * the known tokens. */
static void add_rows(struct sl_sched_core *c, struct sl_seq *s, int n, int *n_rows, int *n_seqs,
                     int *n_logits)
{
    int slot = (*n_seqs)++;
    for (int i = 0; i < n; i++) {
        int pos = s->n_computed + i;
        c->b_tokens[*n_rows] = s->tokens[pos];
        c->b_pos[*n_rows] = pos;
        c->b_seq[*n_rows] = slot;
        (*n_rows)++;
    }
    c->b_seqs[slot] = s;
    c->b_tables[slot] = s->blocks;
    c->b_ctx[slot] = s->n_computed + n;
    if (s->n_computed + n == s->n_tokens) {
        c->b_logit_rows[*n_logits] = *n_rows - 1;
        c->b_logit_seqs[(*n_logits)++] = s;
    }
}

/* Appends a sampled token and decides whether s goes on. */
static void seq_accept(struct sl_sched_core *c, struct sl_seq *s, int32_t token)
{
    s->tokens[s->n_tokens++] = token;
    s->n_generated++;
    if (c->worker.is_stop_token && c->worker.is_stop_token(c->worker.ctx, token)) {
        seq_finish(c, s, SL_FINISH_STOP, SL_OK);
        return;
    }
    if (c->sink.token(c->sink.ctx, s->req, token)) {
        seq_finish(c, s, SL_FINISH_STOP, SL_OK);
        return;
    }
    if (s->n_generated >= s->req->params.max_tokens || s->n_tokens >= c->lim.max_ctx)
        seq_finish(c, s, SL_FINISH_LENGTH, SL_OK);
}

int sl_sched_core_step(struct sl_sched_core *c, uint64_t now_ns)
{
    /* A cancellation that raced with the step is honoured before spending compute on it. */
    for (int i = c->n_running - 1; i >= 0; i--)
        if (sl_req_cancelled(c->running[i]->req))
            seq_finish(c, c->running[i], SL_FINISH_CANCELLED, SL_ECANCELED);
    for (int i = c->n_waiting - 1; i >= 0; i--)
        if (sl_req_cancelled(c->waiting[i]->req))
            seq_finish(c, c->waiting[i], SL_FINISH_CANCELLED, SL_ECANCELED);
    admit_waiting(c);

    int budget = c->lim.max_batch_tokens;
    int n_rows = 0, n_seqs = 0, n_logits = 0;
    /* Decodes first: one row each for sequences whose prompt is done. */
    for (int i = 0; i < c->n_running && budget > 0; i++) {
        struct sl_seq *s = c->running[i];
        if (s->n_tokens - s->n_computed != 1 || s->n_computed < s->req->n_prompt)
            continue;
        add_rows(c, s, 1, &n_rows, &n_seqs, &n_logits);
        budget--;
    }
    /* Then prompt chunks, oldest first, with what is left of the token budget. */
    for (int i = 0; i < c->n_running && budget > 0; i++) {
        struct sl_seq *s = c->running[i];
        if (s->n_computed >= s->req->n_prompt)
            continue;
        int n = s->n_tokens - s->n_computed;
        if (n > budget)
            n = budget;
        add_rows(c, s, n, &n_rows, &n_seqs, &n_logits);
        budget -= n;
    }
    if (n_rows == 0)
        return 0;
    c->steps++;
    c->last_step_rows = n_rows;
    c->last_step_seqs = n_seqs;
    /* Queue time ends when a request first takes part in a step (a recomputed one keeps it). */
    for (int i = 0; i < n_seqs; i++) {
        struct sl_req *r = c->b_seqs[i]->req;
        if (atomic_load_explicit(&r->first_step_ns, memory_order_relaxed) == SL_REQ_NOT_YET)
            atomic_store_explicit(&r->first_step_ns, now_ns, memory_order_relaxed);
    }

    struct sl_batch b = {
        .n_tokens = n_rows,
        .tokens = c->b_tokens,
        .pos = c->b_pos,
        .seq = c->b_seq,
        .n_seqs = n_seqs,
        .block_tables = c->b_tables,
        .ctx_len = c->b_ctx,
        .n_logits = n_logits,
        .logit_rows = c->b_logit_rows,
    };
    int st = c->worker.forward(c->worker.ctx, &b, c->logits);
    if (st != SL_OK) {
        for (int i = 0; i < n_seqs; i++)
            seq_finish(c, c->b_seqs[i], SL_FINISH_ERROR, st);
        return st;
    }
    for (int i = 0; i < n_seqs; i++)
        c->b_seqs[i]->n_computed = c->b_ctx[i];
    for (int i = 0; i < n_logits; i++) {
        struct sl_seq *s = c->b_logit_seqs[i];
        const struct sl_req_params *rp = &s->req->params;
        struct sl_sampling sp = {rp->temperature, rp->top_p, rp->top_k, rp->min_p};
        float *row = c->logits + (size_t)i * (size_t)c->lim.vocab;
        int32_t tok = sl_sample(row, c->lim.vocab, &sp, &s->rng, c->sample_scratch);
        seq_accept(c, s, tok);
    }
    return n_rows;
}

int sl_sched_core_pending(const struct sl_sched_core *c)
{
    return c->n_waiting + c->n_running;
}
int sl_sched_core_running(const struct sl_sched_core *c)
{
    return c->n_running;
}
int sl_sched_core_free_blocks(const struct sl_sched_core *c)
{
    return c->n_free;
}

void sl_sched_core_stats(const struct sl_sched_core *c, struct sl_sched_stats *out)
{
    memset(out, 0, sizeof *out);
    long tokens = 0;
    for (int i = 0; i < c->n_waiting; i++) {
        const struct sl_seq *s = c->waiting[i];
        tokens += s->req->n_prompt > s->n_computed ? s->req->n_prompt - s->n_computed : 0;
    }
    for (int i = 0; i < c->n_running; i++) {
        const struct sl_seq *s = c->running[i];
        tokens += s->req->n_prompt > s->n_computed ? s->req->n_prompt - s->n_computed : 0;
    }
    /* One tier until the tier scheduler arrives; the totals are its figures. */
    out->n_tiers = 1;
    out->tiers[0] = (struct sl_sched_tier_stats){.name = "default",
                                                 .running = c->n_running,
                                                 .queued_requests = c->n_waiting,
                                                 .queued_prompt_tokens = tokens};
    out->running = c->n_running;
    out->queued_requests = c->n_waiting;
    out->queued_prompt_tokens = tokens;
    out->kv_blocks_used = c->lim.n_blocks - c->n_free;
    out->kv_blocks_total = c->lim.n_blocks;
    out->last_step_rows = c->last_step_rows;
    out->last_step_seqs = c->last_step_seqs;
    out->steps = c->steps;
}
