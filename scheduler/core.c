/* The scheduling core: continuous batching over a paged KV pool, with tiers.
 *
 * Pure policy: no I/O, no threads, no clock (sched.h describes one step). Everything a step
 * needs is sized at creation for max_seqs sequences and max_batch_tokens rows, so a step
 * allocates nothing: queues are intrusive lists, running sequences a sorted array, and a
 * sequence's token and block arrays are sized for its whole length when it is submitted.
 *
 * Why these choices:
 *  - A prompt's blocks are taken when it starts, not chunk by chunk: a half-prefilled prompt that
 *    runs out of blocks would have to be preempted and its work thrown away, and a start that
 *    cannot be completed is better not made. Generated tokens take blocks as they come, which is
 *    where reserving up front wasted the pool (max_tokens is an upper bound, often far off).
 *  - Growth preempts the lowest-ranked running sequence, even below its tier's share, because
 *    the best-ranked running sequence must always be able to finish (it fits the pool alone):
 *    that is what rules out livelock. Starts only preempt strictly lower tiers above their
 *    guaranteed slots, so a flood of a high tier cannot push a lower tier's backlog to zero.
 *  - The guard learns the step time from the `now`s it is given rather than being told a cost
 *    model, so the same code tunes itself to the CPU worker, a GPU, or the simulator's model.
 */
#include "sched_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int blocks_for(const struct sl_sched_core *c, long n_positions)
{
    return (int)((n_positions + c->lim.block_size - 1) / c->lim.block_size);
}

/* ---- ranks and lists ---- */

/* Rank of running sequences: (priority, arrival, submission order), lower first. */
static bool ranks_before(const struct sl_seq *a, const struct sl_seq *b)
{
    if (a->prio != b->prio)
        return a->prio < b->prio;
    if (a->arrival_ns != b->arrival_ns)
        return a->arrival_ns < b->arrival_ns;
    return a->order < b->order;
}

static int resident_index(const struct sl_sched_core *c, const struct sl_seq *s)
{
    int lo = 0, hi = c->n_resident;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ranks_before(c->resident[mid], s))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void resident_insert(struct sl_sched_core *c, struct sl_seq *s)
{
    int i = resident_index(c, s);
    memmove(&c->resident[i + 1], &c->resident[i],
            sizeof *c->resident * (size_t)(c->n_resident - i));
    c->resident[i] = s;
    c->n_resident++;
}

static void resident_remove(struct sl_sched_core *c, struct sl_seq *s)
{
    int i = resident_index(c, s);
    memmove(&c->resident[i], &c->resident[i + 1],
            sizeof *c->resident * (size_t)(c->n_resident - i - 1));
    c->n_resident--;
}

static void q_push(struct sl_tier_q *q, struct sl_seq *s, bool front)
{
    if (front) {
        s->prev = NULL;
        s->next = q->head;
        if (q->head)
            q->head->prev = s;
        else
            q->tail = s;
        q->head = s;
    } else {
        s->next = NULL;
        s->prev = q->tail;
        if (q->tail)
            q->tail->next = s;
        else
            q->head = s;
        q->tail = s;
    }
}

static void q_unlink(struct sl_tier_q *q, struct sl_seq *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        q->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else
        q->tail = s->prev;
    s->prev = s->next = NULL;
}

/* The same for s's tenant's queue (tprev, tnext). */
static void t_push(struct sl_vtc *v, struct sl_seq *s, bool front)
{
    if (front) {
        s->tprev = NULL;
        s->tnext = v->head;
        if (v->head)
            v->head->tprev = s;
        else
            v->tail = s;
        v->head = s;
    } else {
        s->tnext = NULL;
        s->tprev = v->tail;
        if (v->tail)
            v->tail->tnext = s;
        else
            v->head = s;
        v->tail = s;
    }
}

static void t_unlink(struct sl_vtc *v, struct sl_seq *s)
{
    if (s->tprev)
        s->tprev->tnext = s->tnext;
    else
        v->head = s->tnext;
    if (s->tnext)
        s->tnext->tprev = s->tprev;
    else
        v->tail = s->tprev;
    s->tprev = s->tnext = NULL;
}

/* ---- the prefix cache, as sequences use it ---- */

/* Makes sure the identities of s's first k full blocks are known. */
static void seq_hash(struct sl_sched_core *c, struct sl_seq *s, int k)
{
    int bs = c->lim.block_size;
    for (; s->n_hashed < k; s->n_hashed++) {
        int i = s->n_hashed;
        struct sl_kv_hash parent =
            i > 0 ? s->hashes[i - 1] : sl_sched_kv_root(s->req->params.cache_key);
        s->hashes[i] = sl_sched_kv_chain(c->kv.seed, parent, s->tokens + (size_t)i * bs, bs);
    }
}

/* The cached blocks s's known tokens start with, at most all but its last token (whose logits
 * it needs): how many, their ids in out (when not NULL). Changes nothing in the pool. */
static int seq_match(struct sl_sched_core *c, struct sl_seq *s, int32_t *out)
{
    if (!s->req->params.cache_prefix)
        return 0;
    int bs = c->lim.block_size, most = (s->n_tokens - 1) / bs, k = 0;
    for (; k < most; k++) {
        seq_hash(c, s, k + 1);
        int32_t b = sl_sched_kv_find(&c->kv, s->hashes[k], s->tokens + (size_t)k * bs);
        if (b < 0)
            break;
        if (out)
            out[k] = b;
    }
    return k;
}

/* Offers s's full blocks whose KV is written to the cache (once each): a block whose identity
 * another block has already stays private. */
static void seq_offer(struct sl_sched_core *c, struct sl_seq *s)
{
    if (!s->req->params.cache_prefix)
        return;
    int bs = c->lim.block_size, full = s->n_computed / bs;
    if (full > s->n_blocks)
        full = s->n_blocks;
    if (s->n_offered >= full)
        return;
    seq_hash(c, s, full);
    for (; s->n_offered < full; s->n_offered++) {
        int i = s->n_offered;
        sl_sched_kv_register(&c->kv, s->blocks[i], s->hashes[i], s->tokens + (size_t)i * bs);
    }
}

/* ---- queues ---- */

/* Prompt work s puts in its tier's queue: its known tokens without KV, less, while it waits,
 * what the cache is expected to give it. */
static long queued_work(const struct sl_seq *s)
{
    return s->n_tokens - s->n_computed - (s->resident ? 0 : s->hint);
}

/* Puts s (not queued) into its tier's queue and counts it. */
static void enqueue(struct sl_sched_core *c, struct sl_seq *s, bool front)
{
    struct sl_tier_q *q = &c->tiers[s->tier];
    q_push(q, s, front);
    t_push(s->vt, s, front);
    s->queued = true;
    q->n_queued++;
    if (!s->resident) {
        q->n_waiting++;
        s->hint = seq_match(c, s, NULL) * c->lim.block_size;
    }
    q->prefill_tokens += queued_work(s);
}

static void dequeue(struct sl_sched_core *c, struct sl_seq *s)
{
    struct sl_tier_q *q = &c->tiers[s->tier];
    q_unlink(q, s);
    t_unlink(s->vt, s);
    s->queued = false;
    q->n_queued--;
    if (!s->resident)
        q->n_waiting--;
    q->prefill_tokens -= queued_work(s);
}

/* ---- tenants: virtual token counters ---- */

/* The smallest counter among the active tenants of q, or q's floor when none is. */
static double vtc_min_active(struct sl_tier_q *q)
{
    double m = INFINITY;
    for (struct sl_vtc *v = q->vtc; v; v = v->next)
        if (v->n_active > 0 && v->counter < m)
            m = v->counter;
    if (isinf(m))
        return q->vtc_floor;
    if (m > q->vtc_floor)
        q->vtc_floor = m;
    return m;
}

/* Forgets q's tenant idle the longest. */
static void vtc_forget(struct sl_tier_q *q)
{
    struct sl_vtc **oldest = NULL;
    for (struct sl_vtc **p = &q->vtc; *p; p = &(*p)->next)
        if ((*p)->n_active == 0 && (!oldest || (*p)->idle_since < (*oldest)->idle_since))
            oldest = p;
    if (!oldest)
        return;
    struct sl_vtc *v = *oldest;
    *oldest = v->next;
    free(v);
    q->n_idle--;
}

/* s (not queued) joins its tier as one of its tenant's sequences. A tenant that was idle starts
 * no lower than the smallest counter among the active (the floor when none is): service it did
 * not ask for is not owed. */
static void vtc_join(struct sl_sched_core *c, struct sl_seq *s, bool carry)
{
    struct sl_tier_q *q = &c->tiers[s->tier];
    const struct sl_req_params *p = &s->req->params;
    struct sl_vtc *v = q->vtc;
    while (v && strncmp(v->name, p->tenant, SL_SCHED_TENANT_NAME_MAX) != 0)
        v = v->next;
    if (!v) {
        v = sl_xcalloc(1, sizeof *v);
        snprintf(v->name, sizeof v->name, "%.*s", SL_SCHED_TENANT_NAME_MAX, p->tenant);
        v->counter = -INFINITY;
        v->next = q->vtc;
        q->vtc = v;
        q->n_idle++;
    }
    if (v->n_active == 0) {
        /* carry: a new tier table is being set up, and a tenant that was active keeps its count
         * whatever order its sequences come back in. */
        double m = vtc_min_active(q);
        if (v->counter < m && (!carry || isinf(v->counter)))
            v->counter = m;
        q->n_idle--;
    }
    v->share = p->share > 0 ? p->share : 1;
    v->n_active++;
    s->vt = v;
    while (q->n_idle > SL_VTC_IDLE_MAX)
        vtc_forget(q);
}

/* s (not queued) leaves its tier. */
static void vtc_leave(struct sl_sched_core *c, struct sl_seq *s)
{
    struct sl_tier_q *q = &c->tiers[s->tier];
    struct sl_vtc *v = s->vt;
    vtc_min_active(q); /* the floor, while v still counts */
    if (--v->n_active == 0) {
        v->idle_since = c->next_order;
        q->n_idle++;
    }
    s->vt = NULL;
    while (q->n_idle > SL_VTC_IDLE_MAX)
        vtc_forget(q);
}

/* Counts the prompt rows [p0, p0 + n) of s as its tenant's service, those not counted before
 * (a recompute after preemption is not, nor are generated tokens recomputed: they were counted
 * when sampled). */
static void vtc_charge_prompt(struct sl_sched_core *c, struct sl_seq *s, int p0, int n)
{
    int from = p0 > s->charged ? p0 : s->charged;
    int to = p0 + n < s->req->n_prompt ? p0 + n : s->req->n_prompt;
    if (to <= from)
        return;
    s->vt->counter += c->tiers[s->tier].t.w_in * (to - from) / s->vt->share;
    s->charged = to;
}

/* s's prompt positions below n came from the prefix cache: service at the tier's w_cached (0 by
 * default: they were not computed), and not charged again if computed later. */
static void vtc_charge_cached(struct sl_sched_core *c, struct sl_seq *s, int n)
{
    int to = n < s->req->n_prompt ? n : s->req->n_prompt;
    if (to > s->charged) {
        s->vt->counter += c->tiers[s->tier].t.w_cached * (to - s->charged) / s->vt->share;
        s->charged = to;
    }
}

static void vtc_charge_token(struct sl_sched_core *c, struct sl_seq *s)
{
    s->vt->counter += c->tiers[s->tier].t.w_out / s->vt->share;
}

static void vtc_free(struct sl_tier_q *q)
{
    while (q->vtc) {
        struct sl_vtc *v = q->vtc;
        q->vtc = v->next;
        free(v);
    }
    q->n_idle = 0;
}

/* ---- tiers ---- */

static const struct sl_sched_tier default_tier = {.name = "default", .priority = 0, .weight = 1};

/* The tier a request belongs to (see struct sl_req_params): the one at its index when that one
 * has its name, which it has unless a reload changed the table since the request was
 * classified; else by name; else by its priority (the tier of the same priority, else the next
 * lower one, else the lowest). */
static int tier_of(const struct sl_sched_core *c, const struct sl_req_params *p)
{
    const struct sl_sched_tier *want = &p->sched_tier;
    if (p->tier >= 0 && p->tier < c->n_tiers &&
        (!want->name[0] || strcmp(c->tiers[p->tier].t.name, want->name) == 0))
        return p->tier;
    for (int i = 0; want->name[0] && i < c->n_tiers; i++)
        if (strcmp(c->tiers[i].t.name, want->name) == 0)
            return i;
    int best = -1, lowest = 0;
    for (int i = 0; i < c->n_tiers; i++) {
        int pr = c->tiers[i].t.priority;
        if (pr >= want->priority && (best < 0 || pr < c->tiers[best].t.priority))
            best = i;
        if (pr > c->tiers[lowest].t.priority)
            lowest = i;
    }
    return best >= 0 ? best : lowest;
}

static void tiers_load(struct sl_sched_core *c, const struct sl_sched_tier *tiers, int n)
{
    if (n == 0) {
        tiers = &default_tier;
        n = 1;
    }
    memset(c->tiers, 0, sizeof c->tiers);
    for (int i = 0; i < n; i++) {
        c->tiers[i].t = tiers[i];
        struct sl_sched_tier *t = &c->tiers[i].t;
        t->name[SL_SCHED_TIER_NAME_MAX] = '\0';
        if (t->weight < 1)
            t->weight = 1;
        if (t->fairness != SL_SCHED_FCFS)
            t->fairness = SL_SCHED_VTC;
        t->w_in = t->w_in > 0 ? t->w_in : 0;
        t->w_out = t->w_out > 0 ? t->w_out : 0;
        if (t->w_in == 0 && t->w_out == 0) {
            t->w_in = 1;
            t->w_out = 2;
        }
    }
    c->n_tiers = n;
    /* Insertion sort: a handful of tiers, stable for equal priorities. */
    for (int i = 0; i < n; i++) {
        int k = i;
        while (k > 0 && c->tiers[c->tier_order[k - 1]].t.priority > c->tiers[i].t.priority) {
            c->tier_order[k] = c->tier_order[k - 1];
            k--;
        }
        c->tier_order[k] = i;
    }
}

/* Slots each active tier (one with sequences queued or resident) keeps against higher tiers:
 * its weighted share of max_seqs rounded up, except the highest active tier, which gets what is
 * left and at least one; shares of the lowest tiers shrink first when that does not add up. */
static void guarantees(struct sl_sched_core *c)
{
    long w = 0;
    int top = -1;
    for (int k = 0; k < c->n_tiers; k++) {
        struct sl_tier_q *q = &c->tiers[c->tier_order[k]];
        q->guaranteed = 0;
        if (q->n_queued + q->n_resident == 0)
            continue;
        w += q->t.weight;
        if (top < 0)
            top = c->tier_order[k];
    }
    if (top < 0)
        return;
    int left = c->lim.max_seqs - 1; /* the top tier's one */
    for (int k = 0; k < c->n_tiers; k++) {
        struct sl_tier_q *q = &c->tiers[c->tier_order[k]];
        if (c->tier_order[k] == top || q->n_queued + q->n_resident == 0)
            continue;
        long share = ((long)c->lim.max_seqs * q->t.weight + w - 1) / w;
        q->guaranteed = (int)(share < left ? share : left);
        left -= q->guaranteed;
    }
    c->tiers[top].guaranteed = left + 1;
}

/* Free slots a sequence of tier t must leave to tiers below it that are owed them and have work
 * queued. */
static int slots_owed_below(const struct sl_sched_core *c, int t)
{
    int owed = 0, pr = c->tiers[t].t.priority;
    for (int i = 0; i < c->n_tiers; i++) {
        const struct sl_tier_q *q = &c->tiers[i];
        if (q->t.priority > pr && q->n_waiting > 0 && q->n_resident < q->guaranteed)
            owed += q->guaranteed - q->n_resident;
    }
    return owed;
}

/* ---- life of a sequence ---- */

struct sl_sched_core *sl_sched_core_new(const struct sl_sched_limits *lim,
                                        const struct sl_sched_worker *w,
                                        const struct sl_sched_sink *sink)
{
    if (lim->vocab < 1 || lim->max_ctx < 1 || lim->max_seqs < 1 || lim->max_batch_tokens < 1 ||
        lim->n_blocks < 1 || lim->block_size < 1 || lim->n_tiers < 0 ||
        lim->n_tiers > SL_SCHED_MAX_TIERS || (lim->n_tiers > 0 && !lim->tiers))
        return NULL;
    struct sl_sched_core *c = sl_xcalloc(1, sizeof *c);
    c->lim = *lim;
    c->lim.tiers = NULL; /* copied into c->tiers */
    c->worker = *w;
    c->sink = *sink;
    tiers_load(c, lim->tiers, lim->n_tiers);
    c->resident = sl_xcalloc((size_t)lim->max_seqs, sizeof *c->resident);
    sl_sched_kv_init(&c->kv, lim->n_blocks, lim->block_size, lim->cache_seed);
    c->watermark = lim->n_blocks / 100 > 1 ? lim->n_blocks / 100 : 1;
    size_t nt = (size_t)lim->max_batch_tokens, ns = (size_t)lim->max_seqs;
    c->plan = sl_xmalloc(sizeof *c->plan * 2 * ns);
    c->victims = sl_xmalloc(sizeof *c->victims * ns);
    c->b_tokens = sl_xmalloc(sizeof(int32_t) * nt);
    c->b_pos = sl_xmalloc(sizeof(int32_t) * nt);
    c->b_seq = sl_xmalloc(sizeof(int32_t) * nt);
    c->b_ctx = sl_xmalloc(sizeof(int32_t) * ns);
    c->b_tables = sl_xmalloc(sizeof(*c->b_tables) * ns);
    c->b_logit_rows = sl_xmalloc(sizeof(int32_t) * ns);
    c->b_seqs = sl_xmalloc(sizeof(*c->b_seqs) * ns);
    c->b_rows = sl_xmalloc(sizeof(int) * ns);
    c->b_logit_seqs = sl_xmalloc(sizeof(*c->b_logit_seqs) * ns);
    c->logits = sl_xmalloc(sizeof(float) * ns * (size_t)lim->vocab);
    c->sample_scratch = sl_xmalloc(sl_sample_scratch_size(lim->vocab));
    c->pen_counts = sl_xcalloc((size_t)lim->vocab, sizeof(int32_t));
    c->raw_row = sl_xmalloc(sizeof(float) * (size_t)lim->vocab);
    /* The model's stop tokens, listed once, for min_tokens to mask. */
    for (int32_t t = 0; w->is_stop_token && t < lim->vocab; t++)
        if (w->is_stop_token(w->ctx, t)) {
            c->model_stops =
                sl_xrealloc(c->model_stops, sizeof(int32_t) * (size_t)(c->n_model_stops + 1));
            c->model_stops[c->n_model_stops++] = t;
        }
    c->sample_rows = sl_xmalloc(sizeof(*c->sample_rows) * ns);
    c->sampled = sl_xmalloc(sizeof(int32_t) * ns);
    return c;
}

/* Drops s's blocks, its last first: of a sequence's blocks that stay cached, those further
 * from the head, which fewer prompts can share, are evicted first. */
static void blocks_release(struct sl_sched_core *c, struct sl_seq *s)
{
    for (int i = s->n_blocks - 1; i >= 0; i--)
        sl_sched_kv_drop(&c->kv, s->blocks[i]);
    s->n_blocks = 0;
    s->n_offered = 0;
}

/* Takes s out of the step being built. */
static void unplan(struct sl_sched_core *c, struct sl_seq *s)
{
    if (s->plan < 0)
        return;
    c->rows -= c->plan[s->plan].n;
    c->plan[s->plan].s = NULL;
    c->n_plan_live--;
    s->plan = -1;
}

static void make_resident(struct sl_sched_core *c, struct sl_seq *s)
{
    struct sl_tier_q *q = &c->tiers[s->tier];
    s->resident = true;
    resident_insert(c, s);
    q->n_resident++;
    if (s->queued)
        q->n_waiting--;
}

static void leave_resident(struct sl_sched_core *c, struct sl_seq *s)
{
    struct sl_tier_q *q = &c->tiers[s->tier];
    unplan(c, s);
    blocks_release(c, s);
    resident_remove(c, s);
    s->resident = false;
    q->n_resident--;
    if (s->queued)
        q->n_waiting++;
}

/* Frees s's blocks and queues it at the front of its tier to recompute everything it knows. */
static void preempt(struct sl_sched_core *c, struct sl_seq *s)
{
    leave_resident(c, s);
    if (s->queued)
        dequeue(c, s);
    s->n_computed = 0;
    enqueue(c, s, true);
    c->tiers[s->tier].step_added += s->n_tokens;
    c->tiers[s->tier].preemptions++;
    c->preemptions++;
    if (c->sink.preempted)
        c->sink.preempted(c->sink.ctx, s->req);
}

/* Reports the end of s, frees its blocks and drops the core's reference. */
static void seq_finish(struct sl_sched_core *c, struct sl_seq *s, enum sl_finish why, int status)
{
    struct sl_req *r = s->req;
    int n_generated = s->n_generated;
    if (s->resident)
        leave_resident(c, s);
    if (s->queued)
        dequeue(c, s);
    vtc_leave(c, s);
    c->n_seqs--;
    r->seq = NULL;
    free(s->blocks);
    free(s->hashes);
    free(s->tokens);
    free(s);
    c->sink.done(c->sink.ctx, r, why, status, n_generated);
    sl_req_unref(r);
}

void sl_sched_core_free(struct sl_sched_core *c)
{
    if (!c)
        return;
    while (c->n_resident)
        seq_finish(c, c->resident[c->n_resident - 1], SL_FINISH_CANCELLED, SL_ECANCELED);
    for (int t = c->n_tiers - 1; t >= 0; t--)
        while (c->tiers[t].tail)
            seq_finish(c, c->tiers[t].tail, SL_FINISH_CANCELLED, SL_ECANCELED);
    for (int t = 0; t < c->n_tiers; t++)
        vtc_free(&c->tiers[t]);
    free(c->resident);
    sl_sched_kv_free(&c->kv);
    free(c->plan);
    free(c->victims);
    free(c->b_tokens);
    free(c->b_pos);
    free(c->b_seq);
    free(c->b_ctx);
    free(c->b_tables);
    free(c->b_logit_rows);
    free(c->b_seqs);
    free(c->b_rows);
    free(c->b_logit_seqs);
    free(c->logits);
    free(c->sample_scratch);
    free(c->pen_counts);
    free(c->raw_row);
    free(c->model_stops);
    free(c->sample_rows);
    free(c->sampled);
    free(c);
}

int sl_sched_core_set_tiers(struct sl_sched_core *c, const struct sl_sched_tier *tiers, int n)
{
    if (n < 0 || n > SL_SCHED_MAX_TIERS || (n > 0 && !tiers))
        return SL_EINVAL;
    /* Take every queue apart, in tier then queue order, and rebuild under the new table. */
    struct sl_seq *all = NULL, **tail = &all;
    for (int t = 0; t < c->n_tiers; t++) {
        for (struct sl_seq *s = c->tiers[t].head; s; s = s->next) {
            *tail = s;
            tail = &s->prev; /* prev is free while the lists are rebuilt: a temporary chain */
        }
    }
    *tail = NULL;
    struct sl_sched_tier keep[SL_SCHED_MAX_TIERS];
    memcpy(keep, tiers ? tiers : &default_tier, sizeof *keep * (size_t)(n ? n : 1));
    struct sl_tier_q old[SL_SCHED_MAX_TIERS];
    int n_old = c->n_tiers;
    memcpy(old, c->tiers, sizeof *old * (size_t)n_old);
    tiers_load(c, keep, n);
    /* Preemption counts and tenants' counters follow the tier's name; every tenant is idle until
     * its sequences join again below. */
    for (int t = 0; t < c->n_tiers; t++)
        for (int o = 0; o < n_old; o++)
            if (old[o].vtc && strcmp(old[o].t.name, c->tiers[t].t.name) == 0) {
                struct sl_tier_q *q = &c->tiers[t];
                q->preemptions = old[o].preemptions;
                q->vtc = old[o].vtc;
                q->vtc_floor = old[o].vtc_floor;
                old[o].vtc = NULL;
                for (struct sl_vtc *v = q->vtc; v; v = v->next) {
                    v->n_active = 0;
                    v->head = v->tail = NULL;
                    q->n_idle++;
                }
            } else if (strcmp(old[o].t.name, c->tiers[t].t.name) == 0) {
                c->tiers[t].preemptions = old[o].preemptions;
            }
    for (int i = 0; i < c->n_resident; i++) {
        struct sl_seq *s = c->resident[i];
        s->tier = tier_of(c, &s->req->params);
        c->tiers[s->tier].n_resident++;
        vtc_join(c, s, true);
    }
    for (struct sl_seq *s = all, *next; s; s = next) {
        next = s->prev;
        s->queued = false;
        if (!s->resident) {
            s->tier = tier_of(c, &s->req->params);
            vtc_join(c, s, true);
        }
        enqueue(c, s, false);
    }
    for (int o = 0; o < n_old; o++)
        vtc_free(&old[o]); /* tiers that are gone */
    return SL_OK;
}

int sl_sched_core_submit(struct sl_sched_core *c, struct sl_req *r, uint64_t now_ns)
{
    const struct sl_req_params *p = &r->params;
    if (r->n_prompt < 1 || p->max_tokens < 1 || r->seq)
        return SL_EINVAL;
    long total = (long)r->n_prompt + p->max_tokens;
    if (total > c->lim.max_ctx || blocks_for(c, total) > c->lim.n_blocks)
        return SL_ERANGE;
    struct sl_seq *s = sl_xcalloc(1, sizeof *s);
    s->req = r;
    sl_req_ref(r);
    s->tier = tier_of(c, p);
    s->prio = p->sched_tier.priority;
    s->tpot_ms = p->sched_tier.tpot_slo_ms > 0 ? p->sched_tier.tpot_slo_ms : 0;
    s->arrival_ns = now_ns;
    s->order = c->next_order++;
    s->plan = -1;
    s->tokens = sl_xmalloc(sizeof(int32_t) * (size_t)total);
    memcpy(s->tokens, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    s->n_tokens = r->n_prompt;
    s->blocks = sl_xmalloc(sizeof(int32_t) * (size_t)blocks_for(c, total));
    s->hashes = sl_xmalloc(sizeof *s->hashes * (size_t)(total / c->lim.block_size + 1));
    sl_rng_seed(&s->rng, p->seed);
    r->seq = s;
    vtc_join(c, s, false);
    enqueue(c, s, false);
    c->n_seqs++;
    return SL_OK;
}

void sl_sched_core_cancel(struct sl_sched_core *c, struct sl_req *r)
{
    if (r->seq)
        seq_finish(c, r->seq, SL_FINISH_CANCELLED, SL_ECANCELED);
}

/* ---- the step-time model ---- */

#define FIT_FORGET 0.98 /* weight of the past per step: a window of about 50 steps */
#define FIT_MIN_OBS 8

void sl_sched_fit_add(struct sl_sched_fit *f, const double x[SL_SCHED_FIT_K], double us)
{
    for (int i = 0; i < SL_SCHED_FIT_K; i++) {
        for (int j = 0; j < SL_SCHED_FIT_K; j++)
            f->xtx[i][j] = FIT_FORGET * f->xtx[i][j] + x[i] * x[j];
        f->xty[i] = FIT_FORGET * f->xty[i] + x[i] * us;
    }
    f->n_obs++;
    /* Ridge-regularised normal equations, solved by Gaussian elimination with partial pivoting.
     * The ridge is relative to each feature's own scale: a feature that never varied (no prompt
     * ever ran) gets a coefficient of 0 instead of an arbitrary one. */
    double a[SL_SCHED_FIT_K][SL_SCHED_FIT_K + 1];
    for (int i = 0; i < SL_SCHED_FIT_K; i++) {
        for (int j = 0; j < SL_SCHED_FIT_K; j++)
            a[i][j] = f->xtx[i][j];
        a[i][i] += 1e-6 * f->xtx[i][i] + 1e-9;
        a[i][SL_SCHED_FIT_K] = f->xty[i];
    }
    for (int k = 0; k < SL_SCHED_FIT_K; k++) {
        int piv = k;
        for (int i = k + 1; i < SL_SCHED_FIT_K; i++)
            if (fabs(a[i][k]) > fabs(a[piv][k]))
                piv = i;
        if (piv != k)
            for (int j = 0; j <= SL_SCHED_FIT_K; j++) {
                double t = a[k][j];
                a[k][j] = a[piv][j];
                a[piv][j] = t;
            }
        if (fabs(a[k][k]) < 1e-300)
            return; /* keep the previous fit */
        for (int i = k + 1; i < SL_SCHED_FIT_K; i++) {
            double m = a[i][k] / a[k][k];
            for (int j = k; j <= SL_SCHED_FIT_K; j++)
                a[i][j] -= m * a[k][j];
        }
    }
    double th[SL_SCHED_FIT_K];
    for (int i = SL_SCHED_FIT_K - 1; i >= 0; i--) {
        double v = a[i][SL_SCHED_FIT_K];
        for (int j = i + 1; j < SL_SCHED_FIT_K; j++)
            v -= a[i][j] * th[j];
        th[i] = v / a[i][i];
    }
    memcpy(f->theta, th, sizeof th);
}

double sl_sched_fit_predict(const struct sl_sched_fit *f, const double x[SL_SCHED_FIT_K])
{
    if (f->n_obs < FIT_MIN_OBS)
        return 0;
    double y = 0;
    for (int i = 0; i < SL_SCHED_FIT_K; i++)
        y += f->theta[i] * x[i];
    return y > 0 ? y : 0;
}

/* Adds n rows from position p0 of a sequence to a step's features (see struct sl_sched_fit); a
 * row at position p attends to p + 1 positions. */
static void features_add(double x[SL_SCHED_FIT_K], long p0, long n, bool logit)
{
    double att = (double)n * (double)p0 + (double)n * (double)(n + 1) / 2;
    x[1] += (double)n;
    x[2] += logit;
    x[n == 1 ? 3 : 4] += att / 1000;
}

/* Learns from the previous step's duration, when the previous step ran and work was left (so
 * this step followed it at once and the gap is its duration, not idle time). */
static void observe(struct sl_sched_core *c, uint64_t now_ns)
{
    struct sl_step_shape *p = &c->prev;
    if (!p->ran || !p->left_work || now_ns <= p->now_ns)
        return;
    double us = (double)(now_ns - p->now_ns) / 1e3;
    /* A step far slower than predicted is most likely the thread losing its core, not the
     * worker: the fit, and the prefill rate the SLO guard predicts with, learn from it only up
     * to four times the prediction, so one stall does not make the guard starve prompts for the
     * next fifty steps, nor refuse them at the door (a real change in cost still gets through,
     * fourfold a step). The decode-step average, which paces the TPOT guard, and the drain
     * rates below see the real time. */
    double pred = sl_sched_fit_predict(&c->fit, p->x);
    double cost = pred > 0 && us > 4 * pred + 1000 ? 4 * pred + 1000 : us;
    sl_sched_fit_add(&c->fit, p->x, cost);
    const double a = 1.0 / 8;
    if (p->decodes > 0)
        c->ema_decode_us =
            c->ema_decode_us > 0 ? c->ema_decode_us + a * (us - c->ema_decode_us) : us;
    if (p->prompt_rows > 0) {
        if (c->ema_prefill_us > 0) {
            c->ema_prefill_rows += a * (p->prompt_rows - c->ema_prefill_rows);
            c->ema_prefill_us += a * (cost - c->ema_prefill_us);
        } else {
            c->ema_prefill_rows = p->prompt_rows;
            c->ema_prefill_us = cost;
        }
    }
    /* Only steps that left a backlog: otherwise a tier's rows follow its arrivals, not what it
     * can get. Sums of rows and of time discounted by the time since (a window of time, not of
     * steps: a tier's rows come in bursts of whole prompts between slot turnovers), so the rate
     * is rows over time with no step weighing more than its share of the time. */
    double keep = exp(-us / (SL_SCHED_DRAIN_WINDOW_S * 1e6));
    for (int t = 0; t < c->n_tiers; t++) {
        struct sl_tier_q *q = &c->tiers[t];
        if (!q->step_backlogged)
            continue;
        /* A preempted sequence's recompute is queued in front of everything: work added ahead
         * of whoever waits, so it does not count as drained. */
        q->ema_drain_rows = q->ema_drain_rows * keep + (q->step_rows - q->step_added);
        q->ema_drain_us = q->ema_drain_us * keep + us;
    }
}

/* ---- building a step ---- */

static void plan_add(struct sl_sched_core *c, struct sl_seq *s, int n)
{
    if (s->plan >= 0) {
        c->plan[s->plan].n += n;
    } else {
        s->plan = c->n_plan;
        c->plan[c->n_plan++] = (struct sl_plan){s, n};
        c->n_plan_live++;
    }
    c->rows += n;
}

/* Gives decoding sequence s the block its next position needs, preempting the lowest-ranked
 * running sequence while none is free. False when that was s itself. */
static bool grow(struct sl_sched_core *c, struct sl_seq *s)
{
    if (blocks_for(c, s->n_computed + 1) <= s->n_blocks)
        return true;
    /* A victim whose blocks are all shared frees none: go on to the next. */
    while (sl_sched_kv_available(&c->kv) == 0) {
        struct sl_seq *v = c->resident[c->n_resident - 1];
        if (v == s) {
            preempt(c, s);
            return false;
        }
        preempt(c, v);
    }
    s->blocks[s->n_blocks++] = sl_sched_kv_alloc(&c->kv);
    return true;
}

/* Whether s, which cannot start without preempting, should rather wait for a running sequence
 * to end. Preempting throws the victim's work away (it recomputes everything), so s waits as
 * long as a running sequence is predicted to end (its tokens left at the measured decode step
 * time) within SL_SCHED_PREEMPT_PATIENCE of s's TTFT objective, counted from its arrival. */
static bool worth_preempting(const struct sl_sched_core *c, const struct sl_seq *s)
{
    int slo = s->req->params.sched_tier.ttft_slo_ms;
    if (slo <= 0)
        return true;
    double patience_us = slo * 1e3 * SL_SCHED_PREEMPT_PATIENCE;
    double waited_us = c->now_ns > s->arrival_ns ? (double)(c->now_ns - s->arrival_ns) / 1e3 : 0;
    if (waited_us >= patience_us)
        return true;
    if (c->ema_decode_us <= 0)
        return false; /* nothing measured yet: wait out the patience */
    int fewest = INT32_MAX;
    for (int i = 0; i < c->n_resident; i++) {
        const struct sl_seq *r = c->resident[i];
        int left = r->req->params.max_tokens - r->n_generated;
        int ctx_left = c->lim.max_ctx - r->n_tokens;
        left = left < ctx_left ? left : ctx_left;
        if (!r->queued && left < fewest)
            fewest = left;
    }
    return waited_us + fewest * c->ema_decode_us > patience_us;
}

/* Blocks preempting v would make available to s, whose cached blocks (marked) are not counted:
 * those only v holds. */
static int blocks_freed(const struct sl_sched_core *c, const struct sl_seq *v)
{
    int n = 0;
    for (int i = 0; i < v->n_blocks; i++)
        n += c->kv.ref[v->blocks[i]] == 1 && !c->kv.mark[v->blocks[i]];
    return n;
}

/* Whether s can take a slot and `need` blocks of the pool, after preempting running sequences of
 * strictly lower tiers above their guaranteed slots when that makes it fit and waiting would
 * cost s too much (done here). False, with nothing changed, when it cannot. */
static bool start_fit(struct sl_sched_core *c, struct sl_seq *s, int need)
{
    int spare = c->n_resident > 0 ? c->watermark : 0;
    int slots = c->lim.max_seqs - c->n_resident - slots_owed_below(c, s->tier);
    if (c->iso_on && c->tiers[s->tier].t.priority > c->iso_prio)
        slots -= SL_SCHED_ISOLATION_SLOTS; /* kept free for the isolated tier's arrivals */
    int want_slots = slots >= 1 ? 0 : 1 - slots;
    int want_blocks = need + spare - sl_sched_kv_available(&c->kv);
    if (want_slots > 0 || want_blocks > 0) {
        if (c->n_resident == 0 || c->resident[c->n_resident - 1]->prio <= s->prio ||
            !worth_preempting(c, s))
            return false;
        int n_v = 0, got_slots = 0, got_blocks = 0;
        for (int t = 0; t < c->n_tiers; t++)
            c->tiers[t].victims = 0;
        for (int i = c->n_resident - 1; i >= 0; i--) {
            if (got_slots >= want_slots && got_blocks >= want_blocks)
                break;
            struct sl_seq *v = c->resident[i];
            if (v->prio <= s->prio)
                break; /* sorted: nothing of a lower tier is left */
            struct sl_tier_q *q = &c->tiers[v->tier];
            if (v->tier == s->tier || q->n_resident - q->victims <= q->guaranteed)
                continue;
            q->victims++;
            c->victims[n_v++] = v;
            got_slots++;
            got_blocks += blocks_freed(c, v);
        }
        if (got_slots < want_slots || got_blocks < want_blocks)
            return false;
        for (int i = 0; i < n_v; i++)
            preempt(c, c->victims[i]);
    }
    return true;
}

/* Starts queued sequence s: a slot, the cached blocks its known tokens start with, and fresh
 * blocks for the rest, preempting running sequences of strictly lower tiers that are above their
 * guaranteed slots when that makes it fit and waiting would cost s too much. False (and nothing
 * changed) when it cannot start now. */
static bool start(struct sl_sched_core *c, struct sl_seq *s)
{
    int hit = seq_match(c, s, s->blocks); /* candidates, held below */
    int need = blocks_for(c, s->n_tokens) - hit;
    int pinned = 0; /* cached blocks it takes out of the LRU */
    for (int i = 0; i < hit; i++) {
        pinned += c->kv.ref[s->blocks[i]] == 0;
        c->kv.mark[s->blocks[i]] = true;
    }
    bool ok = start_fit(c, s, need + pinned);
    for (int i = 0; i < hit; i++)
        c->kv.mark[s->blocks[i]] = false;
    if (!ok)
        return false;
    struct sl_tier_q *q = &c->tiers[s->tier];
    q->prefill_tokens -= queued_work(s);
    make_resident(c, s);
    for (int i = 0; i < hit; i++)
        sl_sched_kv_hold(&c->kv, s->blocks[i]);
    s->n_blocks = hit;
    for (int i = 0; i < need; i++)
        s->blocks[s->n_blocks++] = sl_sched_kv_alloc(&c->kv);
    s->n_computed = hit * c->lim.block_size;
    s->n_offered = hit;
    s->hint = 0;
    q->prefill_tokens += queued_work(s);
    vtc_charge_cached(c, s, s->n_computed);
    if (!s->started) {
        s->started = true;
        if (s->req->params.cache_prefix) {
            int got = s->n_computed < s->req->n_prompt ? s->n_computed : s->req->n_prompt;
            c->prefix_query_tokens += (uint64_t)s->req->n_prompt;
            c->prefix_hit_tokens += (uint64_t)got;
            atomic_store_explicit(&s->req->cached_tokens, got, memory_order_relaxed);
        }
    }
    return true;
}

/* Prompt rows a step may take even when the decodes alone are predicted over the objective, so
 * that prompts never stop. */
#define GUARD_MIN_ROWS 16

/* The time budgets of one step's prompt chunks: the TPOT guard's, for every tier, and the
 * isolation of a higher tier with traffic, for the tiers of a lower priority (priority >
 * iso_prio). */
struct guard {
    double budget_us; /* predicted time prompt chunks may still add; INFINITY when unguarded */
    int floor_rows;   /* prompt rows allowed whatever the prediction, left this step */
    double iso_us;    /* predicted time lower tiers' prompt chunks may still add, or INFINITY */
    int iso_prio;     /* tiers of a priority above it are held to iso_us */
};

static bool isolated(const struct sl_sched_core *c, const struct guard *g, int t)
{
    return !isinf(g->iso_us) && c->tiers[t].t.priority > g->iso_prio;
}

/* The most rows of s's next chunk (from position p0) that fit g's time budgets, s being of tier
 * t. */
static int guard_rows(const struct sl_sched_core *c, struct guard *g, int t, int p0, int want)
{
    double budget = g->budget_us;
    if (isolated(c, g, t) && g->iso_us < budget)
        budget = g->iso_us;
    if (isinf(budget))
        return want;
    const double *th = c->fit.theta;
    /* Marginal time of n rows from p0: th_row n + th_attn (n p0 + n (n + 1) / 2) / 1000. */
    double a = fmax(th[4], 0) / 2000,
           b = fmax(th[1], 0) + fmax(th[4], 0) * ((double)p0 + 0.5) / 1000;
    double r = budget, n;
    if (r <= 0)
        n = 0;
    else if (a > 0)
        n = (-b + sqrt(b * b + 4 * a * r)) / (2 * a);
    else
        n = b > 0 ? r / b : want;
    int k = n >= want ? want : (int)n;
    if (k < g->floor_rows)
        k = g->floor_rows < want ? g->floor_rows : want;
    return k;
}

static void guard_take(const struct sl_sched_core *c, struct guard *g, int t, int p0, int n)
{
    const double *th = c->fit.theta;
    double a = fmax(th[4], 0), b = fmax(th[1], 0);
    double us = b * n + a * ((double)n * p0 + (double)n * (n + 1) / 2) / 1000;
    if (!isinf(g->budget_us))
        g->budget_us -= us;
    if (isolated(c, g, t))
        g->iso_us -= us;
    g->floor_rows = g->floor_rows > n ? g->floor_rows - n : 0;
}

/* Plans up to n of s's next prompt rows within the guard; returns how many (0: the guard has no
 * time left for any). */
static int plan_chunk(struct sl_sched_core *c, struct sl_seq *s, int n, struct guard *g)
{
    int p0 = s->n_computed + (s->plan >= 0 ? c->plan[s->plan].n : 0);
    if (n > c->lim.max_batch_tokens - c->rows)
        n = c->lim.max_batch_tokens - c->rows;
    n = guard_rows(c, g, s->tier, p0, n);
    if (n == 0)
        return 0;
    guard_take(c, g, s->tier, p0, n);
    plan_add(c, s, n);
    vtc_charge_prompt(c, s, p0, n);
    return n;
}

/* Prompt rows of s not planned yet, when it may take some this step (it holds a plan slot, or
 * one is free); else 0. */
static int rows_left(const struct sl_sched_core *c, const struct sl_seq *s)
{
    int planned = s->plan >= 0 ? c->plan[s->plan].n : 0;
    int left = s->n_tokens - s->n_computed - planned;
    return left > 0 && (s->plan >= 0 || c->n_plan_live < c->lim.max_seqs) ? left : 0;
}

/* A tenant's turn gives it at least this many rows (or what its prompt has left), so that
 * counters a few tokens apart do not cut a step into slivers. */
#define VTC_QUANTUM 16

/* Gives tier t's queue up to `limit` prompt rows by virtual token counters: each turn goes to
 * the tenant with the smallest counter that has a queued sequence (ties: the earlier arrival),
 * for its first sequence in arrival order, and lasts until its counter would pass the next
 * smallest one's (by VTC_QUANTUM rows at least). A sequence that cannot start blocks the rest of
 * the tier, as in FCFS. Returns the rows planned. */
static int fill_vtc(struct sl_sched_core *c, int t, int limit, struct guard *g)
{
    struct sl_tier_q *q = &c->tiers[t];
    for (struct sl_vtc *v = q->vtc; v; v = v->next)
        v->cursor = v->head;
    int used = 0;
    while (used < limit && c->rows < c->lim.max_batch_tokens) {
        struct sl_vtc *best = NULL;
        double second = INFINITY;
        for (struct sl_vtc *v = q->vtc; v; v = v->next) {
            if (!v->cursor)
                continue;
            if (!best || v->counter < best->counter ||
                (v->counter == best->counter && v->cursor->order < best->cursor->order)) {
                if (best)
                    second = best->counter < second ? best->counter : second;
                best = v;
            } else if (v->counter < second) {
                second = v->counter;
            }
        }
        if (!best)
            break;
        struct sl_seq *s = best->cursor;
        best->cursor = s->tnext;
        if (!s->resident) {
            if (sl_req_cancelled(s->req)) {
                seq_finish(c, s, SL_FINISH_CANCELLED, SL_ECANCELED);
                continue;
            }
            if (!start(c, s))
                break;
        }
        int left = rows_left(c, s);
        if (left == 0)
            continue;
        int n = left < limit - used ? left : limit - used;
        double w_in = c->tiers[t].t.w_in;
        if (!isinf(second) && w_in > 0) {
            double turn = (second - best->counter) * best->share / w_in;
            int cap = turn < VTC_QUANTUM ? VTC_QUANTUM : turn < n ? (int)ceil(turn) : n;
            if (n > cap)
                n = cap;
        }
        int got = plan_chunk(c, s, n, g);
        if (got == 0)
            break;
        used += got;
        if (got < left)
            best->cursor = s; /* its turn may come again this step */
    }
    return used;
}

/* Gives tier t's queue up to `limit` prompt rows, first come first served. A sequence that
 * cannot start blocks the rest of its tier (a big prompt is not starved by small ones). Returns
 * the rows planned. */
static int fill(struct sl_sched_core *c, int t, int limit, struct guard *g)
{
    if (c->tiers[t].t.fairness == SL_SCHED_VTC)
        return fill_vtc(c, t, limit, g);
    int used = 0;
    struct sl_seq *s = c->tiers[t].head;
    while (s && used < limit && c->rows < c->lim.max_batch_tokens) {
        struct sl_seq *next = s->next;
        if (!s->resident) {
            if (sl_req_cancelled(s->req)) {
                seq_finish(c, s, SL_FINISH_CANCELLED, SL_ECANCELED);
                s = next;
                continue;
            }
            /* start() may preempt planned sequences of lower tiers; once started, s has a
             * plan slot, since every planned sequence holds one of the max_seqs slots. */
            if (!start(c, s))
                break;
        }
        int left = rows_left(c, s);
        if (left > 0) {
            int n = plan_chunk(c, s, left < limit - used ? left : limit - used, g);
            if (n == 0)
                break;
            used += n;
        }
        s = next;
    }
    return used;
}

/* Whether the guard may hold back decoding sequence s (of a looser objective) this step, a full
 * step being predicted at full_us: as long as the gap it then sees, from its last decode to the
 * end of the step after this one, stays within SL_SCHED_GUARD_FRACTION of its own objective.
 * Without an objective, for one step at a time. */
static bool may_pause(const struct sl_sched_core *c, const struct sl_seq *s, double full_us)
{
    if (s->tpot_ms <= 0)
        return s->last_decode_step + 1 == c->step_id;
    double since_us =
        c->now_ns > s->last_decode_ns ? (double)(c->now_ns - s->last_decode_ns) / 1e3 : 0;
    return since_us + 2 * full_us <= s->tpot_ms * 1e3 * SL_SCHED_GUARD_FRACTION;
}

/* Step 1: one row for every decoding sequence, best-ranked first; dx gets their features.
 * Returns the tightest TPOT objective among them (us, 0 when none), which the prompt chunks must
 * then respect. */
static double plan_decodes(struct sl_sched_core *c, double dx[SL_SCHED_FIT_K])
{
    /* What the decodes alone would cost, and the objective to hold. */
    int min_tpot = 0;
    double x[SL_SCHED_FIT_K] = {1, 0, 0, 0, 0};
    int n_dec = 0;
    for (int i = 0; i < c->n_resident && n_dec < c->lim.max_seqs; i++) {
        const struct sl_seq *s = c->resident[i];
        if (s->queued)
            continue;
        n_dec++;
        x[1] += 1;
        x[2] += 1;
        x[3] += (double)(s->n_computed + 1) / 1000;
        if (s->tpot_ms > 0 && (min_tpot == 0 || s->tpot_ms < min_tpot))
            min_tpot = s->tpot_ms;
    }
    double target = min_tpot * 1000.0 * SL_SCHED_GUARD_FRACTION;
    double full_us = min_tpot > 0 ? sl_sched_fit_predict(&c->fit, x) : 0;
    bool pause = full_us > target;
    for (int t = 0; t < c->n_tiers; t++)
        c->tiers[t].planned = 0;
    int i = 0;
    while (i < c->n_resident) {
        struct sl_seq *s = c->resident[i];
        if (s->queued) {
            i++;
            continue;
        }
        if (c->n_plan_live >= c->lim.max_seqs || c->rows >= c->lim.max_batch_tokens)
            break;
        struct sl_tier_q *q = &c->tiers[s->tier];
        if (pause && (s->tpot_ms == 0 || s->tpot_ms > min_tpot) && q->planned >= q->guaranteed &&
            may_pause(c, s, full_us)) {
            i++;
            continue;
        }
        if (!grow(c, s))
            continue; /* s went back to its queue: resident[i] is the next one now */
        q->planned++;
        s->last_decode_ns = c->now_ns;
        s->last_decode_step = c->step_id;
        plan_add(c, s, 1);
        features_add(dx, s->n_computed, 1, true);
        i++;
    }
    return target;
}

/* The isolation in effect this step: of the tiers with isolation_ms that have sequences, or had
 * within SL_SCHED_ISOLATION_HOLD_S, the highest-priority one protects every tier below it with
 * the smallest of their budgets. Off until the step-time fit can predict. */
static void isolate(struct sl_sched_core *c, struct guard *g)
{
    uint64_t hold = (uint64_t)(SL_SCHED_ISOLATION_HOLD_S * 1e9);
    for (int k = 0; k < c->n_tiers; k++) {
        struct sl_tier_q *q = &c->tiers[c->tier_order[k]];
        if (q->n_queued + q->n_resident > 0)
            q->last_busy_ns = c->now_ns > 0 ? c->now_ns : 1;
        bool recent = q->last_busy_ns > 0 && c->now_ns - q->last_busy_ns <= hold;
        if (q->t.isolation_ms <= 0 || !recent || c->fit.n_obs < FIT_MIN_OBS)
            continue;
        if (isinf(g->iso_us))
            g->iso_prio = q->t.priority;
        g->iso_us = fmin(g->iso_us, q->t.isolation_ms * 1e3);
    }
    c->iso_on = !isinf(g->iso_us);
    c->iso_prio = g->iso_prio;
}

/* Step 2: the rest of the token budget to prompt chunks, by weighted shares. */
static void plan_prefills(struct sl_sched_core *c, double target_us,
                          const double dx[SL_SCHED_FIT_K])
{
    int budget = c->lim.max_batch_tokens - c->rows;
    if (budget <= 0)
        return;
    struct guard g = {INFINITY, 0, INFINITY, 0};
    if (target_us > 0 && c->fit.n_obs >= FIT_MIN_OBS) {
        g.budget_us = target_us - sl_sched_fit_predict(&c->fit, dx);
        g.floor_rows =
            GUARD_MIN_ROWS < c->lim.max_batch_tokens ? GUARD_MIN_ROWS : c->lim.max_batch_tokens;
    }
    isolate(c, &g);
    if (!isinf(g.iso_us) && g.floor_rows < SL_SCHED_ISOLATION_MIN_ROWS)
        g.floor_rows = SL_SCHED_ISOLATION_MIN_ROWS < c->lim.max_batch_tokens
                           ? SL_SCHED_ISOLATION_MIN_ROWS
                           : c->lim.max_batch_tokens;
    long w = 0;
    for (int t = 0; t < c->n_tiers; t++)
        if (c->tiers[t].head)
            w += c->tiers[t].t.weight;
        else
            c->tiers[t].deficit = 0;
    if (w == 0)
        return;
    /* Shares with the fractions carried between steps. When the carried fractions add up to a
     * whole row too many, the highest tiers give it up first and are owed it next step. */
    int grant[SL_SCHED_MAX_TIERS] = {0};
    double exact[SL_SCHED_MAX_TIERS] = {0};
    int total = 0;
    for (int t = 0; t < c->n_tiers; t++) {
        struct sl_tier_q *q = &c->tiers[t];
        if (!q->head)
            continue;
        exact[t] = (double)budget * q->t.weight / (double)w + q->deficit;
        grant[t] = (int)(exact[t] + 1e-9); /* 3.2 + 0.8 is 4, whatever the rounding */
        total += grant[t];
    }
    for (int k = 0; k < c->n_tiers && total > budget; k++) {
        int t = c->tier_order[k];
        int cut = grant[t] < total - budget ? grant[t] : total - budget;
        grant[t] -= cut;
        total -= cut;
    }
    for (int t = 0; t < c->n_tiers; t++)
        if (c->tiers[t].head)
            c->tiers[t].deficit = exact[t] > grant[t] ? exact[t] - grant[t] : 0;
    for (int k = 0; k < c->n_tiers; k++) {
        int t = c->tier_order[k];
        if (c->tiers[t].head && grant[t] > 0)
            fill(c, t, grant[t], &g);
    }
    /* Work-conserving: what a tier left goes to whoever can use it, highest priority first. */
    for (int k = 0; k < c->n_tiers && c->rows < c->lim.max_batch_tokens; k++) {
        int t = c->tier_order[k];
        if (c->tiers[t].head)
            fill(c, t, c->lim.max_batch_tokens - c->rows, &g);
    }
}

/* Adds plan entry e to the batch as slot `slot`; its last row samples when it reaches the end of
 * the known tokens. Counts it in the step's shape. */
static void emit(struct sl_sched_core *c, const struct sl_plan *e, int slot, int *n_rows,
                 int *n_logits)
{
    struct sl_seq *s = e->s;
    s->plan = -1;
    features_add(c->prev.x, s->n_computed, e->n, s->n_computed + e->n == s->n_tokens);
    if (s->queued)
        c->prev.prompt_rows += e->n;
    else
        c->prev.decodes++;
    /* Queue time ends when a request first takes part in a step (a recomputed one keeps it). */
    struct sl_req *r = s->req;
    if (atomic_load_explicit(&r->first_step_ns, memory_order_relaxed) == SL_REQ_NOT_YET)
        atomic_store_explicit(&r->first_step_ns, c->now_ns, memory_order_relaxed);
    for (int i = 0; i < e->n; i++) {
        int pos = s->n_computed + i;
        c->b_tokens[*n_rows] = s->tokens[pos];
        c->b_pos[*n_rows] = pos;
        c->b_seq[*n_rows] = slot;
        (*n_rows)++;
    }
    c->b_seqs[slot] = s;
    c->b_rows[slot] = e->n;
    c->b_tables[slot] = s->blocks;
    c->b_ctx[slot] = s->n_computed + e->n;
    if (s->n_computed + e->n == s->n_tokens) {
        c->b_logit_rows[*n_logits] = *n_rows - 1;
        c->b_logit_seqs[(*n_logits)++] = s;
    }
}

static struct sl_penalties penalties_of(const struct sl_req_params *rp)
{
    return (struct sl_penalties){.repetition = rp->repetition_penalty,
                                 .frequency = rp->frequency_penalty,
                                 .presence = rp->presence_penalty,
                                 .n_bias = rp->n_bias,
                                 .bias_ids = rp->bias_ids,
                                 .bias = rp->bias};
}

static bool in_ids(const int32_t *ids, int n, int32_t token)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == token)
            return true;
    return false;
}

/* True while s's next token must not be one that ends it (min_tokens not yet reached) and
 * there is such a token to mask. */
static bool masks_stops(const struct sl_sched_core *c, const struct sl_seq *s)
{
    const struct sl_req_params *rp = &s->req->params;
    return s->n_generated < rp->min_tokens &&
           (rp->n_stop_ids > 0 || (!rp->ignore_eos && c->n_model_stops > 0));
}

/* row (vocab): the tokens that would end s get no chance at all. */
static void mask_stops(const struct sl_sched_core *c, const struct sl_seq *s, float *row)
{
    const struct sl_req_params *rp = &s->req->params;
    if (!rp->ignore_eos)
        for (int i = 0; i < c->n_model_stops; i++)
            row[c->model_stops[i]] = -INFINITY;
    for (int i = 0; i < rp->n_stop_ids; i++)
        if (rp->stop_ids[i] >= 0 && rp->stop_ids[i] < c->lim.vocab)
            row[rp->stop_ids[i]] = -INFINITY;
}

/* True when s's row must come back as logits and be sampled here: penalties, logit bias, log
 * probabilities or min_tokens' mask change or read them first. */
static bool needs_logits(const struct sl_sched_core *c, const struct sl_seq *s)
{
    const struct sl_req_params *rp = &s->req->params;
    struct sl_penalties pen = penalties_of(rp);
    return sl_penalties_active(&pen) || rp->logprobs || masks_stops(c, s);
}

/* Appends a sampled token and decides whether s goes on. lp: its log probabilities, or NULL.
 * None of the first min_tokens tokens ends s. */
static void seq_accept(struct sl_sched_core *c, struct sl_seq *s, int32_t token,
                       const struct sl_token_logprobs *lp)
{
    const struct sl_req_params *rp = &s->req->params;
    s->tokens[s->n_tokens++] = token;
    s->n_generated++;
    vtc_charge_token(c, s);
    bool armed = s->n_generated > rp->min_tokens;
    if (armed && !rp->ignore_eos && c->worker.is_stop_token &&
        c->worker.is_stop_token(c->worker.ctx, token)) {
        seq_finish(c, s, SL_FINISH_STOP, SL_OK);
        return;
    }
    if (lp && c->sink.logprobs)
        c->sink.logprobs(c->sink.ctx, s->req, lp);
    bool stop_str = c->sink.token(c->sink.ctx, s->req, token);
    if (stop_str || (armed && in_ids(rp->stop_ids, rp->n_stop_ids, token))) {
        seq_finish(c, s, SL_FINISH_STOP, SL_OK);
        return;
    }
    if (s->n_generated >= rp->max_tokens || s->n_tokens >= c->lim.max_ctx)
        seq_finish(c, s, SL_FINISH_LENGTH, SL_OK);
}

/* The latest forward's time, divided over the batch's requests by their rows: each gets
 * ns × rows / n_rows rounded down, and what the rounding left goes a nanosecond each to the first
 * ones, so the charges add up to the forward's time exactly. */
static uint64_t rows_part(uint64_t ns, int rows, int n_rows)
{
    return (uint64_t)((unsigned __int128)ns * (uint64_t)rows / (uint64_t)n_rows);
}

static void charge_device(struct sl_sched_core *c, int n_seqs, int n_rows)
{
    if (!c->worker.forward_ns || n_rows <= 0)
        return;
    uint64_t ns = c->worker.forward_ns(c->worker.ctx), given = 0;
    for (int i = 0; i < n_seqs; i++)
        given += rows_part(ns, c->b_rows[i], n_rows);
    uint64_t left = ns - given; /* fewer than n_seqs */
    for (int i = 0; i < n_seqs; i++) {
        uint64_t part = rows_part(ns, c->b_rows[i], n_rows) + ((uint64_t)i < left ? 1 : 0);
        struct sl_req *r = c->b_seqs[i]->req;
        atomic_store_explicit(&r->device_ns,
                              atomic_load_explicit(&r->device_ns, memory_order_relaxed) + part,
                              memory_order_relaxed);
    }
}

int sl_sched_core_step(struct sl_sched_core *c, uint64_t now_ns)
{
    observe(c, now_ns);
    c->prev.ran = false;
    c->step_id++;
    c->now_ns = now_ns;
    /* A cancellation that raced with the step is honoured before spending compute on it (queued
     * ones are caught when they would start). */
    for (int i = c->n_resident - 1; i >= 0; i--)
        if (sl_req_cancelled(c->resident[i]->req))
            seq_finish(c, c->resident[i], SL_FINISH_CANCELLED, SL_ECANCELED);
    guarantees(c);
    for (int t = 0; t < c->n_tiers; t++) {
        c->tiers[t].step_rows = c->tiers[t].step_added = 0;
        c->tiers[t].step_backlogged = false;
    }
    c->n_plan = c->n_plan_live = c->rows = 0;
    double dx[SL_SCHED_FIT_K] = {1, 0, 0, 0, 0};
    double target = plan_decodes(c, dx);
    plan_prefills(c, target, dx);

    int n_rows = 0, n_seqs = 0, n_logits = 0;
    struct sl_step_shape *sh = &c->prev;
    memset(sh->x, 0, sizeof sh->x);
    sh->x[0] = 1;
    sh->decodes = sh->prompt_rows = 0;
    for (int i = 0; i < c->n_plan; i++)
        if (c->plan[i].s)
            emit(c, &c->plan[i], n_seqs++, &n_rows, &n_logits);
    if (n_rows == 0) {
        sh->left_work = false;
        return 0;
    }
    sh->ran = true;
    sh->now_ns = now_ns;
    c->steps++;
    c->last_step_rows = n_rows;
    c->last_step_seqs = n_seqs;

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
    /* Penalties, logit bias, log probabilities and min_tokens' mask need the logits on the
     * host: a step with such a row runs forward, whose logits come back, even on a worker that
     * can sample where they are. */
    bool host_sample = !c->worker.forward_sample;
    for (int i = 0; i < n_logits && !host_sample; i++)
        host_sample = needs_logits(c, c->b_logit_seqs[i]);
    int st;
    if (!host_sample) {
        /* The worker samples where the logits are; each sequence's rng is drawn here, exactly as
         * sl_sample would draw it, so a seed gives the same tokens on any worker. */
        for (int i = 0; i < n_logits; i++) {
            struct sl_seq *s = c->b_logit_seqs[i];
            const struct sl_req_params *rp = &s->req->params;
            struct sl_sampling sp = {rp->temperature, rp->top_p, rp->top_k, rp->min_p};
            c->sample_rows[i] =
                (struct sl_sample_row){sp, sl_sample_coin(&sp, c->lim.vocab, &s->rng)};
        }
        st = c->worker.forward_sample(c->worker.ctx, &b, c->sample_rows, c->sampled);
    } else {
        st = c->worker.forward(c->worker.ctx, &b, c->logits);
    }
    charge_device(c, n_seqs, n_rows);
    if (st != SL_OK) {
        for (int i = 0; i < n_seqs; i++)
            seq_finish(c, c->b_seqs[i], SL_FINISH_ERROR, st);
        c->prev.left_work = false;
        return st;
    }
    for (int i = 0; i < n_seqs; i++) {
        struct sl_seq *s = c->b_seqs[i];
        if (s->queued) {
            c->tiers[s->tier].prefill_tokens -= c->b_rows[i];
            c->tiers[s->tier].step_rows += c->b_rows[i];
        }
        s->n_computed = c->b_ctx[i];
        seq_offer(c, s);
        if (s->queued && s->n_computed == s->n_tokens) {
            dequeue(c, s); /* prompt done: it decodes from now on */
            s->last_decode_ns = now_ns;
            s->last_decode_step = c->step_id;
        }
    }
    for (int i = 0; i < n_logits; i++) {
        struct sl_seq *s = c->b_logit_seqs[i];
        const struct sl_req_params *rp = &s->req->params;
        struct sl_sampling sp = {rp->temperature, rp->top_p, rp->top_k, rp->min_p};
        float *row = c->logits + (size_t)i * (size_t)c->lim.vocab;
        struct sl_token_logprobs lp, *lpp = NULL;
        if (host_sample && rp->logprobs) {
            /* The raw row, before penalties and sampling change it in place. */
            memcpy(c->raw_row, row, sizeof(float) * (size_t)c->lim.vocab);
            lpp = &lp;
        }
        if (host_sample) {
            if (masks_stops(c, s))
                mask_stops(c, s, row);
            struct sl_penalties pen = penalties_of(rp);
            if (sl_penalties_active(&pen)) {
                int n_gen = s->n_generated;
                sl_penalties_apply(row, c->lim.vocab, &pen, s->tokens, s->n_tokens - n_gen,
                                   s->tokens + (s->n_tokens - n_gen), n_gen, c->pen_counts);
            }
        }
        int32_t tok = host_sample ? sl_sample(row, c->lim.vocab, &sp, &s->rng, c->sample_scratch)
                                  : c->sampled[i];
        if (lpp) {
            sl_logprobs(c->raw_row, c->lim.vocab, tok, rp->top_logprobs, lpp);
            lpp->prev = s->tokens[s->n_tokens - 1];
        }
        seq_accept(c, s, tok, lpp);
    }
    /* A backlog is more than a step can take: a few prompts waiting a step or two for a slot
     * say nothing about the rate a real backlog drains at. */
    for (int t = 0; t < c->n_tiers; t++)
        c->tiers[t].step_backlogged = c->tiers[t].prefill_tokens >= c->lim.max_batch_tokens;
    c->prev.left_work = c->n_seqs > 0;
    return n_rows;
}

int sl_sched_core_pending(const struct sl_sched_core *c)
{
    return c->n_seqs;
}
int sl_sched_core_running(const struct sl_sched_core *c)
{
    return c->n_resident;
}
int sl_sched_core_free_blocks(const struct sl_sched_core *c)
{
    return sl_sched_kv_available(&c->kv);
}

void sl_sched_core_stats(const struct sl_sched_core *c, struct sl_sched_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n_tiers = c->n_tiers;
    for (int t = 0; t < c->n_tiers; t++) {
        const struct sl_tier_q *q = &c->tiers[t];
        struct sl_sched_tier_stats *o = &out->tiers[t];
        memcpy(o->name, q->t.name, sizeof o->name);
        o->running = q->n_resident;
        o->queued_requests = q->n_waiting;
        o->queued_prompt_tokens = q->prefill_tokens;
        o->priority = q->t.priority;
        o->weight = q->t.weight;
        o->preemptions = q->preemptions;
        if (q->ema_drain_us > 0 && q->ema_drain_rows > 0)
            o->drain_tokens_per_s = q->ema_drain_rows / q->ema_drain_us * 1e6;
        out->running += o->running;
        out->queued_requests += o->queued_requests;
        out->queued_prompt_tokens += o->queued_prompt_tokens;
    }
    out->kv_blocks_used = c->lim.n_blocks - sl_sched_kv_available(&c->kv);
    out->kv_blocks_cached = c->kv.n_lru;
    out->prefix_query_tokens = c->prefix_query_tokens;
    out->prefix_hit_tokens = c->prefix_hit_tokens;
    out->prefix_evictions = c->kv.evictions;
    out->kv_blocks_total = c->lim.n_blocks;
    out->preemptions = c->preemptions;
    out->last_step_rows = c->last_step_rows;
    out->last_step_seqs = c->last_step_seqs;
    out->steps = c->steps;
    if (c->ema_prefill_us > 0)
        out->prefill_tokens_per_s = c->ema_prefill_rows / c->ema_prefill_us * 1e6;
    out->decode_step_seconds = c->ema_decode_us / 1e6;
    out->max_seqs = c->lim.max_seqs;
    out->max_batch_tokens = c->lim.max_batch_tokens;
    out->block_size = c->lim.block_size;
    /* A step of the sequences decoding now plus prompt rows up to the budget, the chunk taken
     * from the start of a prompt (its rows attend to positions 1..P). */
    double x[SL_SCHED_FIT_K] = {1, 0, 0, 0, 0};
    int d = 0;
    for (int i = 0; i < c->n_resident && d < c->lim.max_seqs; i++) {
        const struct sl_seq *s = c->resident[i];
        if (s->queued)
            continue;
        d++;
        features_add(x, s->n_computed, 1, true);
    }
    long p = c->lim.max_batch_tokens - d;
    if (p > 0) {
        features_add(x, 0, p, true);
        double us = sl_sched_fit_predict(&c->fit, x);
        if (us > 0)
            out->prefill_capacity_tokens_per_s = (double)p / us * 1e6;
    }
}

int sl_sched_core_prefix_match(const struct sl_sched_core *c, uint64_t key, const int32_t *ids,
                               int n)
{
    return sl_sched_kv_match(&c->kv, key, ids, n, NULL, NULL) * c->lim.block_size;
}
