/* The prefix cache (scheduler/prefix.c, and its use in scheduler/core.c): the block pool's hash
 * chain, references and LRU; the core's sharing, isolation by cache key, accounting and figures
 * under a fake worker; and, under the simulator's checking worker (which reads each position's
 * prefix back through the block tables), that every generated token is what an uncached lone run
 * gives while blocks are shared, evicted and preempted. */
#include <criterion/criterion.h>
#include <sluice/sched.h>

#include "sched_impl.h"

#include <stdlib.h>
#include <string.h>

static const uint64_t seed[4] = {1, 2, 3, 4};

/* ---- the pool ---- */

static void fill(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++)
        t[i] = base + i;
}

Test(prefix, a_block_identity_depends_on_its_parent_its_tokens_the_key_and_the_seed)
{
    int32_t a[4], b[4];
    fill(a, 4, 10);
    fill(b, 4, 10);
    struct sl_kv_hash r = sl_sched_kv_root(7);
    struct sl_kv_hash h = sl_sched_kv_chain(seed, r, a, 4);
    struct sl_kv_hash same = sl_sched_kv_chain(seed, sl_sched_kv_root(7), b, 4);
    cr_assert(h.lo == same.lo && h.hi == same.hi, "the same prefix gives the same identity");
    b[3] = 99;
    struct sl_kv_hash t = sl_sched_kv_chain(seed, r, b, 4);
    cr_assert(t.lo != h.lo && t.hi != h.hi, "a token changed");
    struct sl_kv_hash k = sl_sched_kv_chain(seed, sl_sched_kv_root(8), a, 4);
    cr_assert(k.lo != h.lo && k.hi != h.hi, "another key");
    struct sl_kv_hash p = sl_sched_kv_chain(seed, h, a, 4);
    cr_assert(p.lo != h.lo && p.hi != h.hi, "another parent");
    uint64_t other[4] = {1, 2, 3, 5};
    struct sl_kv_hash s = sl_sched_kv_chain(other, r, a, 4);
    cr_assert(s.lo == h.lo && s.hi != h.hi, "the second half's key changed, the first's not");
}

Test(prefix, the_pool_takes_free_blocks_first_then_evicts_the_least_recently_cached)
{
    struct sl_kv_pool p;
    sl_sched_kv_init(&p, 4, 2, seed);
    int32_t b[4], tok[4][2];
    struct sl_kv_hash h[4];
    struct sl_kv_hash parent = sl_sched_kv_root(1);
    for (int i = 0; i < 4; i++) {
        b[i] = sl_sched_kv_alloc(&p);
        fill(tok[i], 2, 100 * i);
        h[i] = sl_sched_kv_chain(seed, parent, tok[i], 2);
        parent = h[i];
    }
    cr_assert_eq(sl_sched_kv_available(&p), 0);
    /* Blocks 0 and 2 registered; 1 and 3 stay private. */
    cr_assert(sl_sched_kv_register(&p, b[0], h[0], tok[0]));
    cr_assert(sl_sched_kv_register(&p, b[2], h[2], tok[2]));
    cr_assert_not(sl_sched_kv_register(&p, b[0], h[0], tok[0]), "registered once");
    cr_assert_not(sl_sched_kv_register(&p, b[1], h[0], tok[0]), "a duplicate stays private");
    sl_sched_kv_drop(&p, b[2]);
    sl_sched_kv_drop(&p, b[0]);
    sl_sched_kv_drop(&p, b[1]);
    cr_assert_eq(p.n_lru, 2, "the registered ones stay cached");
    cr_assert_eq(p.n_free, 1);
    cr_assert_eq(sl_sched_kv_find(&p, h[0], tok[0]), b[0]);
    int32_t wrong[2] = {0, 7};
    cr_assert_eq(sl_sched_kv_find(&p, h[0], wrong), -1, "the tokens are compared too");
    cr_assert_eq(sl_sched_kv_alloc(&p), b[1], "a free block before any cached one");
    cr_assert_eq(p.evictions, 0);
    cr_assert_eq(sl_sched_kv_alloc(&p), b[2], "then the least recently cached");
    cr_assert_eq(p.evictions, 1);
    cr_assert_eq(sl_sched_kv_find(&p, h[2], tok[2]), -1, "an evicted block is gone");
    cr_assert_eq(sl_sched_kv_find(&p, h[0], tok[0]), b[0]);
    /* Holding a cached block takes it out of the LRU; its last drop puts it back. */
    sl_sched_kv_hold(&p, b[0]);
    sl_sched_kv_hold(&p, b[0]);
    cr_assert_eq(p.n_lru, 0);
    cr_assert_eq(sl_sched_kv_available(&p), 0);
    sl_sched_kv_drop(&p, b[0]);
    cr_assert_eq(p.n_lru, 0, "still held once");
    sl_sched_kv_drop(&p, b[0]);
    cr_assert_eq(p.n_lru, 1);
    sl_sched_kv_free(&p);
}

Test(prefix, a_match_follows_the_chain_and_leaves_the_last_token_to_compute)
{
    struct sl_kv_pool p;
    sl_sched_kv_init(&p, 8, 4, seed);
    int32_t ids[17];
    fill(ids, 17, 1);
    struct sl_kv_hash parent = sl_sched_kv_root(5);
    for (int i = 0; i < 4; i++) {
        int32_t b = sl_sched_kv_alloc(&p);
        parent = sl_sched_kv_chain(seed, parent, ids + 4 * i, 4);
        cr_assert(sl_sched_kv_register(&p, b, parent, ids + 4 * i));
    }
    int32_t got[4];
    cr_assert_eq(sl_sched_kv_match(&p, 5, ids, 16, got, NULL), 3,
                 "16 tokens: 3 blocks, then 4 "
                 "to compute");
    cr_assert_eq(sl_sched_kv_match(&p, 5, ids, 17, got, NULL), 4);
    cr_assert_eq(sl_sched_kv_match(&p, 5, ids, 9, got, NULL), 2);
    cr_assert_eq(sl_sched_kv_match(&p, 6, ids, 17, got, NULL), 0, "another key");
    cr_assert_eq(sl_sched_kv_published_match(&p, 5, ids, 17), 16, "published as well");
    cr_assert_eq(sl_sched_kv_published_match(&p, 6, ids, 17), 0);
    int32_t other[17];
    memcpy(other, ids, sizeof other);
    other[9] = 500; /* in the third block */
    cr_assert_eq(sl_sched_kv_match(&p, 5, other, 17, got, NULL), 2,
                 "a chain stops where it "
                 "differs");
    cr_assert_eq(sl_sched_kv_published_match(&p, 5, other, 17), 8);
    sl_sched_kv_free(&p);
}

/* ---- the core, under a fake worker ---- */

#define VOCAB 16
#define BS 4

struct fake {
    struct sl_sched_core *core;
    int done;
    long prompt_rows; /* rows of the batches below n_prompt */
    uint64_t now;
};

static struct fake *F;

static int fake_forward(void *ctx, const struct sl_batch *b, float *logits)
{
    (void)ctx;
    for (int r = 0; r < b->n_tokens; r++)
        if (b->pos[r] < F->core->b_seqs[b->seq[r]]->req->n_prompt)
            F->prompt_rows++;
    for (int i = 0; i < b->n_logits; i++) {
        memset(logits + (size_t)i * VOCAB, 0, sizeof(float) * VOCAB);
        logits[(size_t)i * VOCAB + 5] = 1.f;
    }
    return SL_OK;
}

static bool fake_token(void *ctx, struct sl_req *r, int32_t t)
{
    (void)ctx, (void)r, (void)t;
    return false;
}

static void fake_done(void *ctx, struct sl_req *r, enum sl_finish why, int st, int n)
{
    (void)ctx, (void)r, (void)st, (void)n;
    cr_assert_eq(why, SL_FINISH_LENGTH);
    F->done++;
}

static void fake_init_tier(struct fake *f, int max_seqs, int n_blocks,
                           const struct sl_sched_tier *tier)
{
    memset(f, 0, sizeof *f);
    F = f;
    struct sl_sched_limits lim = {.vocab = VOCAB,
                                  .max_ctx = 256,
                                  .max_seqs = max_seqs,
                                  .max_batch_tokens = 64,
                                  .n_blocks = n_blocks,
                                  .block_size = BS,
                                  .tiers = tier,
                                  .n_tiers = tier ? 1 : 0,
                                  .cache_seed = {9, 8, 7, 6}};
    struct sl_sched_worker w = {.forward = fake_forward};
    struct sl_sched_sink s = {.token = fake_token, .done = fake_done};
    f->core = sl_sched_core_new(&lim, &w, &s);
    cr_assert_not_null(f->core);
}

static void fake_init(struct fake *f, int max_seqs, int n_blocks)
{
    fake_init_tier(f, max_seqs, n_blocks, NULL);
}

/* Submits a request of n prompt tokens (BOS, then `from`, from + 1, ...) under key, caching or
 * not; the caller drops the reference. */
static struct sl_req *submit(struct fake *f, int n, int32_t from, uint64_t key, bool cache,
                             int max_tokens)
{
    struct sl_req_prompt *pr = sl_req_prompt_new(n);
    int32_t *ids = sl_req_prompt_ids(pr);
    ids[0] = 1;
    for (int i = 1; i < n; i++)
        ids[i] = from + i;
    struct sl_req_params p = {
        .max_tokens = max_tokens, .top_p = 1.f, .cache_prefix = cache, .cache_key = key};
    struct sl_req *r = sl_req_new(pr, &p);
    cr_assert_eq(sl_sched_core_submit(f->core, r, f->now), SL_OK);
    return r;
}

static void drain(struct fake *f)
{
    for (int k = 0; sl_sched_core_pending(f->core) > 0; k++) {
        cr_assert_lt(k, 10000);
        f->now += 1000000;
        cr_assert_geq(sl_sched_core_step(f->core, f->now), 0);
    }
}

Test(prefix, a_second_request_computes_only_what_follows_the_cached_blocks)
{
    struct fake f;
    fake_init(&f, 4, 64);
    struct sl_req *a = submit(&f, 22, 100, 1, true, 3);
    drain(&f);
    cr_assert_eq(sl_req_cached_tokens(a), 0);
    long first = f.prompt_rows;
    cr_assert_eq(first, 22);
    /* 22 prompt tokens and 2 generated ones fed back: 24 positions written, 6 full blocks. */
    struct sl_sched_stats st;
    sl_sched_core_stats(f.core, &st);
    cr_assert_eq(st.kv_blocks_cached, 6, "full blocks stay cached");
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(sl_sched_core_free_blocks(f.core), 64);
    cr_assert_eq(sl_sched_core_prefix_match(f.core, 1, a->prompt, 22), 20);

    struct sl_req *b = submit(&f, 22, 100, 1, true, 3);
    drain(&f);
    cr_assert_eq(sl_req_cached_tokens(b), 20, "5 blocks of the 22-token prompt");
    cr_assert_eq(f.prompt_rows - first, 2, "only the tokens after them are computed");
    sl_sched_core_stats(f.core, &st);
    cr_assert_eq(st.prefix_query_tokens, 44);
    cr_assert_eq(st.prefix_hit_tokens, 20);

    /* A prompt that is all full blocks, all cached: its last block is computed again. */
    struct sl_req *c = submit(&f, 20, 100, 1, true, 1);
    drain(&f);
    cr_assert_eq(sl_req_cached_tokens(c), 16);
    sl_req_unref(a);
    sl_req_unref(b);
    sl_req_unref(c);
    sl_sched_core_free(f.core);
}

Test(prefix, blocks_are_shared_only_under_the_same_key)
{
    struct fake f;
    fake_init(&f, 4, 64);
    struct sl_req *a = submit(&f, 30, 100, 11, true, 1);
    drain(&f);
    struct sl_req *b = submit(&f, 30, 100, 12, true, 1);
    struct sl_req *off = submit(&f, 30, 100, 11, false, 1);
    drain(&f);
    cr_assert_eq(sl_req_cached_tokens(b), 0, "tenant B never finds tenant A's blocks");
    cr_assert_eq(sl_req_cached_tokens(off), 0, "a request without the cache");
    cr_assert_eq(sl_sched_core_prefix_match(f.core, 11, a->prompt, 30), 28);
    cr_assert_eq(sl_sched_core_prefix_match(f.core, 12, a->prompt, 30), 28, "B's own, now");
    cr_assert_eq(sl_sched_core_prefix_match(f.core, 13, a->prompt, 30), 0);
    struct sl_sched_stats st;
    sl_sched_core_stats(f.core, &st);
    cr_assert_eq(st.prefix_query_tokens, 60, "the uncached request is not a query");
    sl_req_unref(a);
    sl_req_unref(b);
    sl_req_unref(off);
    sl_sched_core_free(f.core);
}

Test(prefix, requests_that_start_together_compute_their_own_and_leak_nothing)
{
    struct fake f;
    fake_init(&f, 4, 64);
    struct sl_req *r[3];
    for (int i = 0; i < 3; i++)
        r[i] = submit(&f, 26, 100, 1, true, 2);
    drain(&f);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sl_req_cached_tokens(r[i]), 0, "request %d: nothing was written yet", i);
    cr_assert_eq(f.prompt_rows, 78);
    struct sl_sched_stats st;
    sl_sched_core_stats(f.core, &st);
    cr_assert_eq(st.kv_blocks_cached, 6, "one copy of each full block cached: 26 + 1 positions");
    cr_assert_eq(sl_sched_core_free_blocks(f.core), 64, "the duplicates were freed");
    struct sl_req *late = submit(&f, 26, 100, 1, true, 2);
    drain(&f);
    cr_assert_eq(sl_req_cached_tokens(late), 24);
    for (int i = 0; i < 3; i++)
        sl_req_unref(r[i]);
    sl_req_unref(late);
    sl_sched_core_free(f.core);
}

Test(prefix, a_waiting_request_counts_only_its_uncached_tokens_as_queued_work)
{
    struct fake f;
    fake_init(&f, 1, 64); /* one slot: the third request waits */
    struct sl_req *a = submit(&f, 41, 100, 1, true, 1);
    drain(&f);
    struct sl_req *busy = submit(&f, 9, 500, 1, true, 50);
    f.now += 1000000;
    sl_sched_core_step(f.core, f.now); /* busy holds the slot */
    struct sl_req *b = submit(&f, 41, 100, 1, true, 1);
    struct sl_sched_stats st;
    sl_sched_core_stats(f.core, &st);
    cr_assert_eq(st.queued_prompt_tokens, 1, "41 tokens of which 40 are cached");
    drain(&f);
    cr_assert_eq(sl_req_cached_tokens(b), 40);
    sl_sched_core_stats(f.core, &st);
    cr_assert_eq(st.queued_prompt_tokens, 0);
    sl_req_unref(a);
    sl_req_unref(busy);
    sl_req_unref(b);
    sl_sched_core_free(f.core);
}

Test(prefix, a_full_pool_evicts_cached_blocks_oldest_first)
{
    struct fake f;
    fake_init(&f, 2, 12);
    struct sl_req *a = submit(&f, 17, 100, 1, true, 1); /* 4 full blocks cached */
    drain(&f);
    struct sl_req *b = submit(&f, 17, 300, 1, true, 1); /* 4 more: 8 cached */
    drain(&f);
    struct sl_sched_stats st;
    sl_sched_core_stats(f.core, &st);
    cr_assert_eq(st.kv_blocks_cached, 8);
    /* 25 positions need 7 blocks: 4 free, then 3 cached ones, a's (the oldest) first; a's tail
     * before its head. */
    struct sl_req *c = submit(&f, 24, 700, 1, true, 2);
    drain(&f);
    sl_sched_core_stats(f.core, &st);
    cr_assert_eq(st.prefix_evictions, 3);
    cr_assert_eq(sl_sched_core_prefix_match(f.core, 1, a->prompt, 17), 4, "a's head block left");
    cr_assert_eq(sl_sched_core_prefix_match(f.core, 1, b->prompt, 17), 16, "b untouched");
    sl_req_unref(a);
    sl_req_unref(b);
    sl_req_unref(c);
    sl_sched_core_free(f.core);
}

/* Cached prompt tokens are service at the tier's w_cached (0 by default), not at w_in. */
Test(prefix, cached_prompt_tokens_count_at_their_own_vtc_weight)
{
    static const float weights[2] = {0, 0.5f};
    for (int k = 0; k < 2; k++) {
        struct sl_sched_tier tier = {.name = "t", .w_in = 1, .w_out = 2, .w_cached = weights[k]};
        struct fake f;
        fake_init_tier(&f, 4, 64, &tier);
        struct sl_req *a = submit(&f, 22, 100, 1, true, 3);
        drain(&f);
        struct sl_vtc *v = f.core->tiers[0].vtc;
        cr_assert_not_null(v);
        cr_assert_float_eq(v->counter, 22 + 2 * 3, 1e-9, "22 prompt tokens, 3 generated");
        struct sl_req *b = submit(&f, 22, 100, 1, true, 3);
        drain(&f);
        cr_assert_eq(sl_req_cached_tokens(b), 20);
        cr_assert_float_eq(v->counter, 28 + weights[k] * 20 + 2 + 2 * 3, 1e-9,
                           "w_cached %g: 20 cached, 2 computed, 3 generated", weights[k]);
        sl_req_unref(a);
        sl_req_unref(b);
        sl_sched_core_free(f.core);
    }
}

/* ---- the simulator's checking worker ---- */

static const struct sl_sched_tier sim_tiers[2] = {
    {.name = "interactive", .priority = 0, .weight = 4, .ttft_slo_ms = 1000, .tpot_slo_ms = 200},
    {.name = "batch", .priority = 1, .weight = 1},
};

/* n requests: three groups sharing prefixes of 0, some and all of their full blocks, arriving
 * together and over time, in both tiers. */
static void sim_trace(struct sl_sim_request *r, int n)
{
    for (int i = 0; i < n; i++) {
        r[i] = (struct sl_sim_request){
            .arrival_s = (i % 7) * 0.05 * (i / 7),
            .tier = i % 3 == 0 ? 0 : 1,
            .prompt_tokens = 40 + (i * 37) % 90,
            .output_tokens = 8 + (i * 13) % 40,
            .prefix_group = i % 4, /* 0: no sharing */
        };
        r[i].prefix_tokens = r[i].prefix_group == 3 ? r[i].prompt_tokens : 33 + 5 * (i % 4);
    }
}

static void sim(int n_blocks, bool cache, struct sl_sim_report *rep, struct sl_sim_result *res,
                int n)
{
    struct sl_sim_request reqs[64];
    sim_trace(reqs, n);
    struct sl_sim_config cfg = {
        .lim = {.max_ctx = 512,
                .max_seqs = 8,
                .max_batch_tokens = 64,
                .n_blocks = n_blocks,
                .block_size = 8,
                .tiers = sim_tiers,
                .n_tiers = 2},
        .cost = sl_sim_cost_stories15m_cpu,
        .prefix_cache = cache,
    };
    cr_assert_eq(sl_sim_run(&cfg, reqs, n, res, rep), SL_OK);
}

Test(prefix, generated_tokens_are_a_lone_runs_with_sharing_eviction_and_preemption)
{
    struct sl_sim_report rep, off;
    struct sl_sim_result res[64], res_off[64];
    /* A roomy pool, then one so small that blocks are evicted and sequences preempted. */
    int pools[2] = {512, 40};
    for (int k = 0; k < 2; k++) {
        sim(pools[k], true, &rep, res, 64);
        sim(pools[k], false, &off, res_off, 64);
        cr_assert_eq(rep.mismatches, 0, "pool %d: every token as an uninterrupted run's", pools[k]);
        cr_assert_eq(off.mismatches, 0);
        cr_assert_gt(rep.cached_tokens, k == 0 ? rep.prompt_tokens / 3 : 0,
                     "pool %d: %ld of %ld cached", pools[k], rep.cached_tokens, rep.prompt_tokens);
        cr_assert_eq(off.cached_tokens, 0);
        long pre = 0;
        for (int i = 0; i < 64; i++) {
            cr_assert_eq(res[i].finish, SL_FINISH_LENGTH, "request %d", i);
            cr_assert_eq(res[i].n_out, res_off[i].n_out);
            pre += res[i].preemptions;
        }
        if (k == 1)
            cr_assert_gt(pre, 0, "the small pool preempts");
    }
}
