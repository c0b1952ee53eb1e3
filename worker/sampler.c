/* Sampling: greedy, temperature, top-p; xorshift64* per sequence. */
#include "worker_impl.h"

#include <math.h>

void sl_rng_seed(struct sl_rng *r, uint64_t seed)
{
    /* splitmix64 of the seed: xorshift must not start at 0, and nearby seeds (0, 1, 2…) must not
     * give correlated streams. */
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    r->state = z ? z : 0x2545f4914f6cdd1dull;
}

static uint64_t rng_u64(struct sl_rng *r)
{
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return r->state * 0x2545f4914f6cdd1dull;
}

float sl_rng_f32(struct sl_rng *r)
{
    return (float)(rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

struct cand {
    float p;
    int32_t id;
};

size_t sl_sample_scratch_size(int vocab)
{
    return (size_t)(vocab > 0 ? vocab : 1) * sizeof(struct cand);
}

static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i]))
            best = i; /* strict >: the lowest id wins ties; NaN never wins over a number */
    return best;
}

/* Max-heap order: more mass first, then the lower id (deterministic whatever the input order). */
static bool cand_above(const struct cand *a, const struct cand *b)
{
    return a->p > b->p || (a->p == b->p && a->id < b->id);
}

static void sift_down(struct cand *h, int n, int i)
{
    struct cand c = h[i];
    for (;;) {
        int l = 2 * i + 1, m = l;
        if (l >= n)
            break;
        if (l + 1 < n && cand_above(&h[l + 1], &h[l]))
            m = l + 1;
        if (!cand_above(&h[m], &c))
            break;
        h[i] = h[m];
        i = m;
    }
    h[i] = c;
}

/* Nucleus sampling over probs (n, summing to 1): the smallest set of most likely tokens whose
 * mass exceeds top_p, then a draw within it. A max-heap pops candidates in order, so only the
 * nucleus is ever sorted: O(n + k log n), no allocation. */
static int32_t sample_top_p(const float *probs, int n, float top_p, float coin, struct cand *c)
{
    /* A token below (1 - top_p) / (n - 1) cannot be in the nucleus (llama2.c's cut): even if
     * every other excluded token had that mass, the rest would exceed top_p without it. */
    float cutoff = n > 1 ? (1.0f - top_p) / (float)(n - 1) : 0.0f;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (probs[i] >= cutoff)
            c[k++] = (struct cand){probs[i], i};
    if (k == 0)
        return argmax(probs, n);
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(c, k, i);
    /* Pop into the tail of the array: c[k - 1], c[k - 2], … hold the nucleus in order. */
    float cum = 0.0f;
    int end = k, taken = 0;
    while (end > 0) {
        struct cand top = c[0];
        c[0] = c[end - 1];
        end--;
        sift_down(c, end, 0);
        c[k - 1 - taken] = top;
        taken++;
        cum += top.p;
        if (cum > top_p)
            break;
    }
    float r = coin * cum, acc = 0.0f;
    for (int i = 0; i < taken; i++) {
        acc += c[k - 1 - i].p;
        if (r < acc)
            return c[k - 1 - i].id;
    }
    return c[k - taken].id; /* rounding: the last of the nucleus */
}

int32_t sl_sample(float *logits, int vocab, const struct sl_sampling *p, struct sl_rng *rng,
                  void *scratch)
{
    if (vocab <= 1)
        return 0;
    if (!(p->temperature > 0.0f) || !(p->top_p > 0.0f))
        return argmax(logits, vocab);
    for (int i = 0; i < vocab; i++)
        logits[i] /= p->temperature;
    sl_cpu_softmax(logits, vocab);
    float coin = sl_rng_f32(rng);
    if (p->top_p < 1.0f)
        return sample_top_p(logits, vocab, p->top_p, coin, scratch);
    float acc = 0.0f;
    int32_t last = 0;
    for (int i = 0; i < vocab; i++) {
        if (logits[i] > 0.0f)
            last = i;
        acc += logits[i];
        if (coin < acc)
            return i;
    }
    return last; /* rounding left the sum just below coin */
}
