/* The KV block pool and its prefix cache (sched.h, "The prefix cache").
 *
 * Why these choices:
 *  - A block is found by the hash of its whole prefix (its tokens chained with its parent's
 *    hash), not by walking a tree: a lookup is one probe per block, and a block keeps no
 *    pointer to its parent, so evicting a parent leaves its children harmless (they can no
 *    longer be reached through it, and age out of the LRU).
 *  - The hash is 128 bits of SipHash-2-4 under a secret key, and a block's tokens are compared
 *    as well: a client that cannot see the key cannot aim a collision at another request's
 *    prefix, and a chance collision of 128 bits is not a risk worth a byte-wise proof of the
 *    whole prefix.
 *  - Freed blocks of a sequence enter the LRU tail first, so that of one conversation the
 *    blocks nobody else can reach (the later ones) go before the shared head.
 *  - The published index is a separate set of 64-bit fingerprints in fixed buckets of atomics,
 *    written only by the scheduler thread: other threads read it with no lock and never make
 *    the scheduler wait. A full bucket leaves a block unpublished, which only makes a prediction
 *    pessimistic.
 */
#include "sched_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- SipHash-2-4 (Aumasson and Bernstein, 2012) over 32-bit words ---- */

static inline uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = rotl(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = rotl(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = rotl(v2, 32);                                                                         \
    } while (0)

/* SipHash-2-4 of the message head (4 words) then w (n words), each word as 4 little-endian
 * bytes, under key (k0, k1). */
static uint64_t siphash(uint64_t k0, uint64_t k1, const uint32_t head[4], const int32_t *w, int n)
{
    uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull,
             v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
    int total = 4 + n;
    uint64_t m = 0;
    int half = 0; /* words in m */
    for (int i = 0; i < total; i++) {
        uint32_t x = i < 4 ? head[i] : (uint32_t)w[i - 4];
        m |= (uint64_t)x << (32 * half);
        if (++half == 2) {
            v3 ^= m;
            SIPROUND;
            SIPROUND;
            v0 ^= m;
            m = 0;
            half = 0;
        }
    }
    m |= (uint64_t)((uint64_t)total * 4 & 0xff) << 56;
    v3 ^= m;
    SIPROUND;
    SIPROUND;
    v0 ^= m;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

struct sl_kv_hash sl_sched_kv_root(uint64_t cache_key)
{
    return (struct sl_kv_hash){cache_key, 0x70726566697821ull}; /* "prefix!" */
}

struct sl_kv_hash sl_sched_kv_chain(const uint64_t seed[4], struct sl_kv_hash parent,
                                    const int32_t *tokens, int block_size)
{
    uint32_t head[4] = {(uint32_t)parent.lo, (uint32_t)(parent.lo >> 32), (uint32_t)parent.hi,
                        (uint32_t)(parent.hi >> 32)};
    return (struct sl_kv_hash){siphash(seed[0], seed[1], head, tokens, block_size),
                               siphash(seed[2], seed[3], head, tokens, block_size)};
}

/* ---- the pool ---- */

/* Slots per bucket of the published index. */
#define PUB_WAYS 4

static uint32_t pow2_at_least(long n)
{
    uint32_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

void sl_sched_kv_init(struct sl_kv_pool *p, int n_blocks, int block_size, const uint64_t seed[4])
{
    memset(p, 0, sizeof *p);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    memcpy(p->seed, seed, sizeof p->seed);
    size_t nb = (size_t)n_blocks;
    p->free = sl_xmalloc(sizeof(int32_t) * nb);
    /* Lowest ids on top of the stack: deterministic and cache-friendly at low load. */
    for (int i = 0; i < n_blocks; i++)
        p->free[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    p->ref = sl_xcalloc(nb, sizeof(int32_t));
    p->cached = sl_xcalloc(nb, sizeof(bool));
    p->mark = sl_xcalloc(nb, sizeof(bool));
    p->hash = sl_xcalloc(nb, sizeof(struct sl_kv_hash));
    p->tokens = sl_xmalloc(sizeof(int32_t) * nb * (size_t)block_size);
    p->hnext = sl_xmalloc(sizeof(int32_t) * nb);
    p->lru_prev = sl_xmalloc(sizeof(int32_t) * nb);
    p->lru_next = sl_xmalloc(sizeof(int32_t) * nb);
    p->lru_head = p->lru_tail = -1;
    uint32_t nbk = pow2_at_least(n_blocks);
    p->bucket_mask = nbk - 1;
    p->bucket = sl_xmalloc(sizeof(int32_t) * nbk);
    for (uint32_t i = 0; i < nbk; i++)
        p->bucket[i] = -1;
    /* Twice the blocks in slots: buckets rarely fill. */
    uint32_t npub = pow2_at_least(2L * n_blocks / PUB_WAYS + 1);
    p->pub_mask = npub - 1;
    p->pub = sl_xcalloc((size_t)npub * PUB_WAYS, sizeof *p->pub);
}

void sl_sched_kv_free(struct sl_kv_pool *p)
{
    free(p->free);
    free(p->ref);
    free(p->cached);
    free(p->mark);
    free(p->hash);
    free(p->tokens);
    free(p->hnext);
    free(p->lru_prev);
    free(p->lru_next);
    free(p->bucket);
    free(p->pub);
    memset(p, 0, sizeof *p);
}

static uint64_t fingerprint(struct sl_kv_hash h)
{
    return h.lo | 1; /* 0 marks an empty slot */
}

static _Atomic uint64_t *pub_bucket(_Atomic uint64_t *pub, uint32_t mask, struct sl_kv_hash h)
{
    return pub + (size_t)((uint32_t)(h.hi >> 32) & mask) * PUB_WAYS;
}

static void publish(struct sl_kv_pool *p, struct sl_kv_hash h)
{
    _Atomic uint64_t *b = pub_bucket(p->pub, p->pub_mask, h);
    for (int i = 0; i < PUB_WAYS; i++)
        if (atomic_load_explicit(&b[i], memory_order_relaxed) == 0) {
            atomic_store_explicit(&b[i], fingerprint(h), memory_order_release);
            return;
        }
}

static void unpublish(struct sl_kv_pool *p, struct sl_kv_hash h)
{
    _Atomic uint64_t *b = pub_bucket(p->pub, p->pub_mask, h);
    for (int i = 0; i < PUB_WAYS; i++)
        if (atomic_load_explicit(&b[i], memory_order_relaxed) == fingerprint(h)) {
            atomic_store_explicit(&b[i], 0, memory_order_release);
            return;
        }
}

static bool published(const struct sl_kv_pool *p, struct sl_kv_hash h)
{
    _Atomic uint64_t *b = pub_bucket(p->pub, p->pub_mask, h);
    for (int i = 0; i < PUB_WAYS; i++)
        if (atomic_load_explicit(&b[i], memory_order_acquire) == fingerprint(h))
            return true;
    return false;
}

static uint32_t bucket_of(const struct sl_kv_pool *p, struct sl_kv_hash h)
{
    return (uint32_t)h.lo & p->bucket_mask;
}

int sl_sched_kv_find(const struct sl_kv_pool *p, struct sl_kv_hash h, const int32_t *tokens)
{
    for (int32_t b = p->bucket[bucket_of(p, h)]; b >= 0; b = p->hnext[b])
        if (p->hash[b].lo == h.lo && p->hash[b].hi == h.hi &&
            memcmp(p->tokens + (size_t)b * (size_t)p->block_size, tokens,
                   sizeof(int32_t) * (size_t)p->block_size) == 0)
            return b;
    return -1;
}

bool sl_sched_kv_register(struct sl_kv_pool *p, int32_t b, struct sl_kv_hash h,
                          const int32_t *tokens)
{
    if (p->cached[b] || sl_sched_kv_find(p, h, tokens) >= 0)
        return false;
    p->cached[b] = true;
    p->hash[b] = h;
    memcpy(p->tokens + (size_t)b * (size_t)p->block_size, tokens,
           sizeof(int32_t) * (size_t)p->block_size);
    uint32_t k = bucket_of(p, h);
    p->hnext[b] = p->bucket[k];
    p->bucket[k] = b;
    publish(p, h);
    return true;
}

static void unregister(struct sl_kv_pool *p, int32_t b)
{
    int32_t *link = &p->bucket[bucket_of(p, p->hash[b])];
    while (*link != b)
        link = &p->hnext[*link];
    *link = p->hnext[b];
    unpublish(p, p->hash[b]);
    p->cached[b] = false;
}

static void lru_unlink(struct sl_kv_pool *p, int32_t b)
{
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0)
        p->lru_next[pr] = nx;
    else
        p->lru_head = nx;
    if (nx >= 0)
        p->lru_prev[nx] = pr;
    else
        p->lru_tail = pr;
    p->n_lru--;
}

static void lru_append(struct sl_kv_pool *p, int32_t b)
{
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0)
        p->lru_next[p->lru_tail] = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_lru++;
}

int32_t sl_sched_kv_alloc(struct sl_kv_pool *p)
{
    int32_t b;
    if (p->n_free > 0) {
        b = p->free[--p->n_free];
    } else {
        b = p->lru_head;
        lru_unlink(p, b);
        unregister(p, b);
        p->evictions++;
    }
    p->ref[b] = 1;
    return b;
}

void sl_sched_kv_hold(struct sl_kv_pool *p, int32_t b)
{
    if (p->ref[b]++ == 0)
        lru_unlink(p, b);
}

void sl_sched_kv_drop(struct sl_kv_pool *p, int32_t b)
{
    if (--p->ref[b] > 0)
        return;
    if (p->cached[b])
        lru_append(p, b);
    else
        p->free[p->n_free++] = b;
}

int sl_sched_kv_match(const struct sl_kv_pool *p, uint64_t key, const int32_t *ids, int n,
                      int32_t *blocks, struct sl_kv_hash *hashes)
{
    int bs = p->block_size, most = n > 0 ? (n - 1) / bs : 0;
    struct sl_kv_hash h = sl_sched_kv_root(key);
    int k = 0;
    for (; k < most; k++) {
        h = sl_sched_kv_chain(p->seed, h, ids + (size_t)k * (size_t)bs, bs);
        int32_t b = sl_sched_kv_find(p, h, ids + (size_t)k * (size_t)bs);
        if (b < 0)
            break;
        if (blocks)
            blocks[k] = b;
        if (hashes)
            hashes[k] = h;
    }
    return k;
}

int sl_sched_kv_published_match(const struct sl_kv_pool *p, uint64_t key, const int32_t *ids, int n)
{
    int bs = p->block_size, most = n > 0 ? (n - 1) / bs : 0;
    struct sl_kv_hash h = sl_sched_kv_root(key);
    int k = 0;
    for (; k < most; k++) {
        h = sl_sched_kv_chain(p->seed, h, ids + (size_t)k * (size_t)bs, bs);
        if (!published(p, h))
            break;
    }
    return k * bs;
}
