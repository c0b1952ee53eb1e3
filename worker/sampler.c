/* Sampling: penalties and logit bias, greedy, temperature, min-p, top-k, top-p; xorshift64* per
 * sequence. */
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

/* Draws from the most likely candidates of probs (n, summing to 1) after the filters, in this
 * order: min-p (drop tokens below min_p times the best one's probability), top-k (keep the k most
 * likely), top-p (the smallest prefix of what is left whose renormalised mass exceeds top_p). A
 * max-heap pops candidates in order, so only the kept ones are ever sorted: O(n + k log n), no
 * allocation. */
static int32_t sample_filtered(const float *probs, int n, const struct sl_sampling *p, float coin,
                               struct cand *c)
{
    float pmax = probs[sl_cpu_argmax(probs, n)];
    float cutoff = p->min_p > 0.0f ? p->min_p * pmax : 0.0f;
    bool top_p = p->top_p < 1.0f;
    /* Without min-p and top-k, a token below (1 - top_p) / (n - 1) cannot be in the nucleus
     * (llama2.c's cut): even if every other excluded token had that mass, the rest would exceed
     * top_p without it. */
    if (top_p && p->top_k <= 0 && cutoff == 0.0f && n > 1)
        cutoff = (1.0f - p->top_p) / (float)(n - 1);
    int k = 0;
    float mass = 0.0f;
    for (int i = 0; i < n; i++)
        if (probs[i] >= cutoff && probs[i] > 0.0f) {
            c[k++] = (struct cand){probs[i], i};
            mass += probs[i];
        }
    if (k == 0)
        return sl_cpu_argmax(probs, n);
    for (int i = k / 2 - 1; i >= 0; i--)
        sift_down(c, k, i);
    int keep = p->top_k > 0 && p->top_k < k ? p->top_k : k;
    /* With top-k, the nucleus is measured against the mass of the k kept tokens, so those are
     * popped first; without it, against everything that passed min-p. */
    int end = k, taken = 0;
    float cum = 0.0f;
    if (keep < k) {
        while (taken < keep) {
            struct cand top = c[0];
            c[0] = c[--end];
            sift_down(c, end, 0);
            c[k - 1 - taken++] = top;
            cum += top.p;
        }
        mass = cum;
        if (top_p) {
            float acc = 0.0f;
            int i = 0;
            while (i < taken && !(acc > p->top_p * mass))
                acc += c[k - 1 - i++].p;
            taken = i;
            cum = acc;
        }
    } else {
        float limit = top_p ? p->top_p * mass : mass;
        while (end > 0) {
            struct cand top = c[0];
            c[0] = c[--end];
            sift_down(c, end, 0);
            c[k - 1 - taken++] = top;
            cum += top.p;
            if (top_p && cum > limit)
                break;
        }
    }
    float r = coin * cum, acc = 0.0f;
    for (int i = 0; i < taken; i++) {
        acc += c[k - 1 - i].p;
        if (r < acc)
            return c[k - 1 - i].id;
    }
    return c[k - taken].id; /* rounding: the last kept candidate */
}

static bool greedy(const struct sl_sampling *p)
{
    return !(p->temperature > 0.0f) || !(p->top_p > 0.0f) || p->top_k == 1;
}

float sl_sample_coin(const struct sl_sampling *p, int vocab, struct sl_rng *rng)
{
    return vocab <= 1 || greedy(p) ? 0.0f : sl_rng_f32(rng);
}

int32_t sl_sample_with_coin(float *logits, int vocab, const struct sl_sampling *p, float coin,
                            void *scratch)
{
    if (vocab <= 1)
        return 0;
    if (greedy(p))
        return sl_cpu_argmax(logits, vocab);
    sl_cpu_div(logits, vocab, p->temperature);
    sl_cpu_softmax(logits, vocab);
    if (p->top_p < 1.0f || p->top_k > 0 || p->min_p > 0.0f)
        return sample_filtered(logits, vocab, p, coin, scratch);
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

int32_t sl_sample(float *logits, int vocab, const struct sl_sampling *p, struct sl_rng *rng,
                  void *scratch)
{
    /* The coin is drawn before the softmax rather than after it as it once was: nothing between
     * reads the rng, so the draws are the same. */
    float coin = sl_sample_coin(p, vocab, rng);
    return sl_sample_with_coin(logits, vocab, p, coin, scratch);
}

bool sl_penalties_active(const struct sl_penalties *p)
{
    return (p->repetition > 0.0f && p->repetition != 1.0f) || p->frequency != 0.0f ||
           p->presence != 0.0f || p->n_bias > 0;
}

static bool in_vocab(int32_t t, int vocab)
{
    return t >= 0 && t < vocab;
}

void sl_penalties_apply(float *logits, int vocab, const struct sl_penalties *p,
                        const int32_t *prompt, int n_prompt, const int32_t *gen, int n_gen,
                        int32_t *counts)
{
    if (p->repetition > 0.0f && p->repetition != 1.0f) {
        /* Once per distinct token: mark, then apply and unmark on the first visit. */
        for (int i = 0; i < n_prompt; i++)
            if (in_vocab(prompt[i], vocab))
                counts[prompt[i]] = 1;
        for (int i = 0; i < n_gen; i++)
            if (in_vocab(gen[i], vocab))
                counts[gen[i]] = 1;
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? gen : prompt;
            int n = pass ? n_gen : n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t t = ids[i];
                if (!in_vocab(t, vocab) || !counts[t])
                    continue;
                counts[t] = 0;
                logits[t] =
                    logits[t] > 0.0f ? logits[t] / p->repetition : logits[t] * p->repetition;
            }
        }
    }
    if (p->frequency != 0.0f || p->presence != 0.0f) {
        for (int i = 0; i < n_gen; i++)
            if (in_vocab(gen[i], vocab))
                counts[gen[i]]++;
        for (int i = 0; i < n_gen; i++) {
            int32_t t = gen[i];
            if (!in_vocab(t, vocab) || !counts[t])
                continue;
            logits[t] -= (float)counts[t] * p->frequency + p->presence;
            counts[t] = 0;
        }
    }
    for (int i = 0; i < p->n_bias; i++)
        if (in_vocab(p->bias_ids[i], vocab))
            logits[p->bias_ids[i]] += p->bias[i];
}

void sl_logprobs(const float *logits, int vocab, int32_t token, int n_top,
                 struct sl_token_logprobs *out)
{
    float max = logits[0];
    for (int i = 1; i < vocab; i++)
        max = logits[i] > max ? logits[i] : max;
    double sum = 0.0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - (double)max);
    double lse = (double)max + log(sum);
    out->token = token;
    out->logprob = (float)((double)logits[token] - lse);
    n_top = n_top < 0 ? 0 : n_top > SL_MAX_TOP_LOGPROBS ? SL_MAX_TOP_LOGPROBS : n_top;
    n_top = n_top > vocab ? vocab : n_top;
    /* Insertion into the n_top best so far; a tie keeps the earlier (lower) id first. */
    int n = 0;
    for (int i = 0; i < vocab && n_top > 0; i++) {
        float l = logits[i];
        if (n == n_top && l <= logits[out->top_ids[n - 1]])
            continue;
        int j = n < n_top ? n++ : n - 1;
        while (j > 0 && logits[out->top_ids[j - 1]] < l) {
            out->top_ids[j] = out->top_ids[j - 1];
            j--;
        }
        out->top_ids[j] = i;
    }
    out->n_top = n;
    for (int i = 0; i < n; i++)
        out->top_logprobs[i] = (float)((double)logits[out->top_ids[i]] - lse);
}
