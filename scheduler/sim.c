/* The simulator: the scheduling core, unchanged, under a virtual clock.
 *
 * The worker is a cost model: each step takes the time struct sl_sim_cost gives for its batch,
 * and the clock jumps by it. Its "model" is a rolling hash: a row writes the hash of the prefix
 * ending at its position into its KV slot, reading the previous position's hash back through
 * the block table, and the next token is derived from the hash. So a request's tokens are those
 * of a lone uninterrupted run exactly when every position it was given was right, which the
 * simulator checks for every token (struct sl_sim_result.mismatches).
 *
 * Why the cost model has the terms it has: on the CPU engine a row costs the layer matmuls,
 * rows that produce logits add the classifier (most of a stories15M decode), and attention
 * reads every earlier position of the sequence, from memory for a lone decode row and shared
 * across the rows of a prompt chunk. The fit: bench/results/2026-11-21-simulator-cost-model.md.
 */
#include "sched_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct sl_sim_cost sl_sim_cost_stories15m_cpu = {
    .base_us = 1403.0,
    .row_us = 84.8,
    .logit_us = 215.4,
    .attn_decode_us = 0.936,
    .attn_prefill_us = 0.106,
    .kv_bytes_per_token = 2 * 6 * 288 * sizeof(float), /* K and V, 6 layers, dim 288, fp32 */
};

double sl_sim_cost_us(const struct sl_sim_cost *m, const struct sl_batch *b)
{
    double t = m->base_us + m->row_us * b->n_tokens + m->logit_us * b->n_logits;
    double att1 = 0, attn = 0;
    for (int r = 0; r < b->n_tokens;) {
        /* Rows of a sequence are contiguous: r .. e - 1. */
        int e = r + 1;
        while (e < b->n_tokens && b->seq[e] == b->seq[r])
            e++;
        for (int k = r; k < e; k++) {
            if (e - r == 1)
                att1 += b->pos[k] + 1;
            else
                attn += b->pos[k] + 1;
        }
        r = e;
    }
    return t + m->attn_decode_us * att1 + m->attn_prefill_us * attn;
}

#define SIM_VOCAB 64
#define HASH_SEED 0xcbf29ce484222325ull

static uint64_t mix(uint64_t h, int32_t tok)
{
    h = (h ^ (uint64_t)(uint32_t)tok) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static int32_t next_of(uint64_t h)
{
    return 3 + (int32_t)((h >> 17) % (SIM_VOCAB - 3));
}

/* Prompt token k of request i: BOS, then its group's shared prefix, then tokens of its own (a
 * hash of (i, k): no two requests share a block of them, so only groups meet in the cache). */
static int32_t prompt_token(const struct sl_sim_request *rq, int i, int k)
{
    if (k == 0)
        return 1;
    bool shared = rq->prefix_group > 0 && k <= rq->prefix_tokens;
    /* splitmix64's finaliser of (whose, k): mix() is too weak for that, its tokens repeat. */
    uint64_t x = ((uint64_t)(uint32_t)(shared ? -rq->prefix_group : i) << 32 | (uint32_t)k) +
                 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return 3 + (int32_t)((x ^ (x >> 31)) % (SIM_VOCAB - 3));
}

struct gaps {
    double *v;
    long n, cap;
};

static void gaps_push(struct gaps *g, double x)
{
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 256;
        g->v = sl_xrealloc(g->v, sizeof *g->v * (size_t)g->cap);
    }
    g->v[g->n++] = x;
}

struct sim_req {
    int idx;
    uint64_t expect; /* hash of everything it knows: the reference run's state */
    uint64_t last_ns;
    struct sl_sim_result res;
};

struct sim {
    const struct sl_sim_config *cfg;
    const struct sl_sim_request *reqs;
    struct sim_req *st;
    uint64_t *kv; /* (n_blocks, block_size) prefix hash at each slot */
    uint64_t now_ns, step_end_ns;
    double busy_us;
    struct gaps itl[SL_SCHED_MAX_TIERS];
};

static int sim_forward(void *ctx, const struct sl_batch *b, float *logits)
{
    struct sim *m = ctx;
    int bs = m->cfg->lim.block_size, nb = m->cfg->lim.n_blocks;
    int li = 0;
    for (int r = 0; r < b->n_tokens; r++) {
        int s = b->seq[r], pos = b->pos[r];
        uint64_t prev = HASH_SEED;
        if (pos > 0) {
            int blk = b->block_tables[s][(pos - 1) / bs];
            if (blk < 0 || blk >= nb)
                return SL_EINVAL;
            prev = m->kv[(size_t)blk * (size_t)bs + (size_t)((pos - 1) % bs)];
        }
        int blk = b->block_tables[s][pos / bs];
        if (blk < 0 || blk >= nb)
            return SL_EINVAL;
        uint64_t h = mix(prev, b->tokens[r]);
        m->kv[(size_t)blk * (size_t)bs + (size_t)(pos % bs)] = h;
        if (li < b->n_logits && b->logit_rows[li] == r) {
            float *row = logits + (size_t)li * SIM_VOCAB;
            for (int v = 0; v < SIM_VOCAB; v++)
                row[v] = 0.f;
            row[next_of(h)] = 1.f;
            li++;
        }
    }
    double us = sl_sim_cost_us(&m->cfg->cost, b);
    uint64_t ns = (uint64_t)llround(us * 1e3);
    m->step_end_ns = m->now_ns + (ns > 0 ? ns : 1);
    m->busy_us += us;
    return SL_OK;
}

static bool sim_is_stop(void *ctx, int32_t token)
{
    (void)ctx;
    (void)token;
    return false;
}

static bool sim_token(void *ctx, struct sl_req *r, int32_t token)
{
    struct sim *m = ctx;
    struct sim_req *q = sl_req_user(r);
    double t = (double)m->step_end_ns / 1e9;
    if (q->res.n_out == 0) {
        q->res.first_token_at_s = t;
    } else {
        double gap = (double)(m->step_end_ns - q->last_ns) / 1e9;
        if (gap > q->res.max_itl_s)
            q->res.max_itl_s = gap;
        gaps_push(&m->itl[m->reqs[q->idx].tier], gap);
    }
    q->last_ns = m->step_end_ns;
    q->res.n_out++;
    if (token != next_of(q->expect))
        q->res.mismatches++;
    q->expect = mix(q->expect, token);
    return false;
}

static void sim_done(void *ctx, struct sl_req *r, enum sl_finish why, int status, int n_generated)
{
    struct sim *m = ctx;
    struct sim_req *q = sl_req_user(r);
    (void)n_generated;
    q->res.finish = why;
    q->res.status = status;
    q->res.cached_tokens = sl_req_cached_tokens(r);
    q->res.done_at_s = (double)m->step_end_ns / 1e9;
}

static void sim_preempted(void *ctx, struct sl_req *r)
{
    (void)ctx;
    struct sim_req *q = sl_req_user(r);
    q->res.preemptions++;
}

static int sim_submit(struct sim *m, struct sl_sched_core *core, int i)
{
    const struct sl_sim_request *rq = &m->reqs[i];
    const struct sl_sched_tier *t = &m->cfg->lim.tiers[rq->tier];
    struct sim_req *q = &m->st[i];
    if (m->cfg->on_arrival) {
        struct sl_sched_stats st;
        sl_sched_core_stats(core, &st);
        m->cfg->on_arrival(m->cfg->on_arrival_ctx, i, &st);
    }
    q->expect = HASH_SEED;
    struct sl_req_prompt *prompt = sl_req_prompt_new(rq->prompt_tokens);
    int32_t *ids = sl_req_prompt_ids(prompt);
    for (int k = 0; k < rq->prompt_tokens; k++) {
        ids[k] = prompt_token(rq, i, k);
        q->expect = mix(q->expect, ids[k]);
    }
    struct sl_req_params p = {
        .max_tokens = rq->output_tokens,
        .temperature = 0.f,
        .top_p = 1.f,
        .tier = rq->tier,
        .sched_tier = *t,
        .share = rq->share,
        .cache_prefix = m->cfg->prefix_cache,
    };
    snprintf(p.tenant, sizeof p.tenant, "%s", rq->tenant_name ? rq->tenant_name : "");
    struct sl_req *r = sl_req_new(prompt, &p);
    sl_req_set_user(r, q);
    uint64_t arrival = (uint64_t)llround(rq->arrival_s * 1e9);
    int st = sl_sched_core_submit(core, r, arrival);
    if (st != SL_OK) {
        q->res.finish = SL_FINISH_ERROR;
        q->res.status = st;
    }
    sl_req_unref(r);
    return st;
}

struct arrival {
    double at;
    int idx;
};

static int by_arrival(const void *a, const void *b)
{
    const struct arrival *x = a, *y = b;
    if (x->at != y->at)
        return x->at < y->at ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* p50, p90, p99 by nearest rank (v is sorted in place), in milliseconds. */
static void percentiles(double *v, long n, double out[3])
{
    static const double ps[3] = {50, 90, 99};
    if (n == 0) {
        out[0] = out[1] = out[2] = 0;
        return;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    for (int k = 0; k < 3; k++) {
        long rank = (long)ceil(ps[k] / 100.0 * (double)n);
        out[k] = v[(rank < 1 ? 1 : rank) - 1] * 1e3;
    }
}

static void report(struct sim *m, int n, double makespan, struct sl_sim_report *rep)
{
    const struct sl_sched_limits *lim = &m->cfg->lim;
    memset(rep, 0, sizeof *rep);
    rep->n_tiers = lim->n_tiers;
    rep->makespan_s = makespan;
    double *ttft = sl_xmalloc(sizeof(double) * (size_t)(n + 1));
    double *tpot = sl_xmalloc(sizeof(double) * (size_t)(n + 1));
    double *e2e = sl_xmalloc(sizeof(double) * (size_t)(n + 1));
    for (int t = 0; t < lim->n_tiers; t++) {
        struct sl_sim_tier_report *o = &rep->tiers[t];
        const struct sl_sched_tier *tier = &lim->tiers[t];
        long n_ttft = 0, n_tpot = 0, n_e2e = 0, met = 0, tokens = 0;
        for (int i = 0; i < n; i++) {
            if (m->reqs[i].tier != t)
                continue;
            const struct sl_sim_result *r = &m->st[i].res;
            o->requests++;
            o->preemptions += r->preemptions;
            tokens += r->n_out;
            if (r->finish == SL_FINISH_ERROR) {
                o->refused++;
                continue;
            }
            if (r->n_out > 0)
                ttft[n_ttft++] = r->ttft_s;
            if (r->finish != SL_FINISH_LENGTH)
                continue;
            o->completed++;
            e2e[n_e2e++] = r->e2e_s;
            if (r->n_out > 1)
                tpot[n_tpot++] = r->tpot_s;
            bool ok = tier->ttft_slo_ms <= 0 || r->ttft_s * 1e3 <= tier->ttft_slo_ms;
            ok &= tier->tpot_slo_ms <= 0 || r->n_out < 2 || r->tpot_s * 1e3 <= tier->tpot_slo_ms;
            met += ok;
        }
        percentiles(ttft, n_ttft, o->ttft_ms);
        percentiles(tpot, n_tpot, o->tpot_ms);
        percentiles(e2e, n_e2e, o->e2e_ms);
        percentiles(m->itl[t].v, m->itl[t].n, o->itl_ms);
        for (long k = 0; k < m->itl[t].n; k++)
            if (m->itl[t].v[k] * 1e3 > o->max_itl_ms)
                o->max_itl_ms = m->itl[t].v[k] * 1e3;
        o->slo_attainment = o->requests ? (double)met / o->requests : 0;
        o->throughput_rps = makespan > 0 ? o->completed / makespan : 0;
        o->output_tokens_per_s = makespan > 0 ? (double)tokens / makespan : 0;
        rep->output_tokens += tokens;
    }
    for (int i = 0; i < n; i++) {
        rep->mismatches += m->st[i].res.mismatches;
        rep->prompt_tokens += m->reqs[i].prompt_tokens;
        rep->cached_tokens += m->st[i].res.cached_tokens;
    }
    free(ttft);
    free(tpot);
    free(e2e);
}

int sl_sim_run(const struct sl_sim_config *cfg, const struct sl_sim_request *reqs, int n,
               struct sl_sim_result *results, struct sl_sim_report *rep)
{
    const struct sl_sched_limits *lim = &cfg->lim;
    if (n < 0 || lim->n_tiers < 1 || lim->n_tiers > SL_SCHED_MAX_TIERS || !lim->tiers ||
        lim->n_blocks < 1 || lim->block_size < 1)
        return SL_EINVAL;
    for (int i = 0; i < n; i++) {
        const struct sl_sim_request *r = &reqs[i];
        if (!(r->arrival_s >= 0) || !isfinite(r->arrival_s) || r->tier < 0 ||
            r->tier >= lim->n_tiers || r->prompt_tokens < 1 || r->output_tokens < 1 ||
            r->prefix_group < 0 || (r->prefix_group > 0 && r->prefix_tokens < 0))
            return SL_EINVAL;
    }
    struct sim m = {.cfg = cfg, .reqs = reqs};
    struct sl_sched_limits l = *lim;
    l.vocab = SIM_VOCAB;
    struct sl_sched_worker w = {.ctx = &m, .forward = sim_forward, .is_stop_token = sim_is_stop};
    struct sl_sched_sink sink = {
        .ctx = &m, .token = sim_token, .done = sim_done, .preempted = sim_preempted};
    struct sl_sched_core *core = sl_sched_core_new(&l, &w, &sink);
    if (!core)
        return SL_EINVAL;
    m.kv = sl_xcalloc((size_t)lim->n_blocks * (size_t)lim->block_size, sizeof *m.kv);
    m.st = sl_xcalloc((size_t)(n > 0 ? n : 1), sizeof *m.st);
    struct arrival *by = sl_xmalloc(sizeof *by * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++) {
        by[i] = (struct arrival){reqs[i].arrival_s, i};
        m.st[i].idx = i;
        m.st[i].res.ttft_s = -1;
    }
    qsort(by, (size_t)n, sizeof *by, by_arrival);
    int *order = sl_xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++)
        order[i] = by[i].idx;
    free(by);

    int next = 0, held = 0, st = SL_OK;
    long steps = 0;
    m.now_ns = n > 0 ? (uint64_t)llround(reqs[order[0]].arrival_s * 1e9) : 0;
    for (;;) {
        while (next < n && (uint64_t)llround(reqs[order[next]].arrival_s * 1e9) <= m.now_ns) {
            if (!cfg->static_batching)
                sim_submit(&m, core, order[next]);
            next++;
        }
        /* Static batching: the next batch is whatever has arrived, once the last one is done. */
        if (cfg->static_batching && sl_sched_core_pending(core) == 0)
            for (int k = 0; k < lim->max_seqs && held < next; k++)
                sim_submit(&m, core, order[held++]);
        if (sl_sched_core_pending(core) == 0) {
            if (cfg->static_batching && held < next)
                continue; /* every request of the batch was refused: form the next one */
            if (next >= n)
                break;
            if (next < n)
                m.now_ns = (uint64_t)llround(reqs[order[next]].arrival_s * 1e9);
            continue;
        }
        m.step_end_ns = m.now_ns;
        int rows = sl_sched_core_step(core, m.now_ns);
        if (rows < 0) {
            st = rows;
            break;
        }
        if (rows == 0) {
            /* Work is held but none of it can run: only an arrival could change that. */
            if (next >= n) {
                st = SL_EBUSY;
                break;
            }
            m.now_ns = (uint64_t)llround(reqs[order[next]].arrival_s * 1e9);
            continue;
        }
        steps++;
        m.now_ns = m.step_end_ns;
    }
    sl_sched_core_free(core);

    double first = n > 0 ? reqs[order[0]].arrival_s : 0, last = first;
    for (int i = 0; i < n; i++) {
        struct sl_sim_result *r = &m.st[i].res;
        double arrival = reqs[i].arrival_s;
        if (r->n_out > 0) {
            r->ttft_s = r->first_token_at_s - arrival;
            r->e2e_s = r->done_at_s - arrival;
            r->tpot_s = r->n_out > 1 ? (r->e2e_s - r->ttft_s) / (r->n_out - 1) : 0;
        }
        if (r->finish == SL_FINISH_LENGTH && r->done_at_s > last)
            last = r->done_at_s;
        if (results)
            results[i] = *r;
    }
    if (st == SL_OK) {
        report(&m, n, last - first, rep);
        rep->steps = steps;
        rep->busy_s = m.busy_us / 1e6;
    }
    for (int t = 0; t < SL_SCHED_MAX_TIERS; t++)
        free(m.itl[t].v);
    free(order);
    free(m.st);
    free(m.kv);
    return st;
}
