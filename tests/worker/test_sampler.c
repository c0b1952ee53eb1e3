#include "worker_test.h"

#include <math.h>

static void *scratch_for(int vocab)
{
    return malloc(sl_sample_scratch_size(vocab));
}

Test(worker, greedy_picks_argmax_when_temperature_is_zero)
{
    float logits[6] = {0.1f, 2.5f, -1.0f, 2.4f, 0.0f, -3.0f};
    struct sl_sampling p = {.temperature = 0.0f, .top_p = 1.0f};
    struct sl_rng r;
    sl_rng_seed(&r, 7);
    void *scratch = scratch_for(6);
    cr_assert_eq(sl_sample(logits, 6, &p, &r, scratch), 1);
    float tie[5] = {-1.0f, 3.0f, 0.0f, 3.0f, 3.0f};
    cr_assert_eq(sl_sample(tie, 5, &p, &r, scratch), 1, "lowest id must win a tie");
    float neg[3] = {-5.0f, -4.0f, -4.5f};
    cr_assert_eq(sl_sample(neg, 3, &p, &r, scratch), 1);
    free(scratch);
}

static void random_logits(float *l, int n, struct sl_rng *r)
{
    for (int i = 0; i < n; i++)
        l[i] = (sl_rng_f32(r) - 0.5f) * 8.0f;
}

Test(worker, sampler_repeats_output_when_seed_is_the_same)
{
    enum { V = 300, N = 64 };
    struct sl_sampling p = {.temperature = 1.0f, .top_p = 0.9f};
    void *scratch = scratch_for(V);
    int32_t out[3][N];
    uint64_t seeds[3] = {42, 42, 43};
    for (int s = 0; s < 3; s++) {
        struct sl_rng lr, sr;
        sl_rng_seed(&lr, 1000);
        sl_rng_seed(&sr, seeds[s]);
        for (int i = 0; i < N; i++) {
            float l[V];
            random_logits(l, V, &lr);
            out[s][i] = sl_sample(l, V, &p, &sr, scratch);
            cr_assert(out[s][i] >= 0 && out[s][i] < V);
        }
    }
    cr_assert(memcmp(out[0], out[1], sizeof(out[0])) == 0, "same seed, different output");
    cr_assert(memcmp(out[0], out[2], sizeof(out[0])) != 0, "different seeds, same output");
    free(scratch);
}

Test(worker, rng_is_uniform_when_seed_is_zero)
{
    struct sl_rng r;
    sl_rng_seed(&r, 0);
    cr_assert_neq(r.state, 0);
    double sum = 0;
    float prev = -1.0f;
    int repeats = 0;
    for (int i = 0; i < 10000; i++) {
        float f = sl_rng_f32(&r);
        cr_assert(f >= 0.0f && f < 1.0f);
        repeats += f == prev;
        prev = f;
        sum += f;
    }
    cr_assert_lt(repeats, 3);
    cr_assert(fabs(sum / 10000 - 0.5) < 0.02, "mean %g", sum / 10000);
    struct sl_rng a, b;
    sl_rng_seed(&a, 1);
    sl_rng_seed(&b, 2);
    cr_assert_neq(sl_rng_f32(&a), sl_rng_f32(&b));
}

Test(worker, top_p_picks_argmax_when_nucleus_is_tiny)
{
    enum { V = 1000 };
    struct sl_sampling p = {.temperature = 1.0f, .top_p = 1e-6f};
    void *scratch = scratch_for(V);
    struct sl_rng lr, sr;
    sl_rng_seed(&lr, 5);
    sl_rng_seed(&sr, 6);
    for (int it = 0; it < 200; it++) {
        float l[V];
        random_logits(l, V, &lr);
        int best = 0;
        for (int i = 1; i < V; i++)
            if (l[i] > l[best])
                best = i;
        cr_assert_eq(sl_sample(l, V, &p, &sr, scratch), best);
    }
    free(scratch);
}

/* Draws n samples from logits (copied each time) and returns the frequency of each id. */
static void frequencies(const float *logits, int v, const struct sl_sampling *p, int n,
                        double *freq)
{
    void *scratch = scratch_for(v);
    struct sl_rng r;
    sl_rng_seed(&r, 99);
    for (int i = 0; i < v; i++)
        freq[i] = 0;
    for (int i = 0; i < n; i++) {
        float l[8];
        memcpy(l, logits, (size_t)v * sizeof(float));
        freq[sl_sample(l, v, p, &r, scratch)] += 1.0 / n;
    }
    free(scratch);
}

Test(worker, sampler_follows_softmax_when_temperature_is_set)
{
    float logits[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    double f[3];
    struct sl_sampling p = {.temperature = 1.0f, .top_p = 1.0f};
    frequencies(logits, 3, &p, 20000, f);
    cr_assert(fabs(f[0] - 0.5) < 0.02 && fabs(f[1] - 0.3) < 0.02 && fabs(f[2] - 0.2) < 0.02,
              "T=1: %g %g %g", f[0], f[1], f[2]);
    /* T = 0.5 squares the probabilities: 0.25, 0.09, 0.04 over 0.38. */
    p.temperature = 0.5f;
    frequencies(logits, 3, &p, 20000, f);
    cr_assert(fabs(f[0] - 0.25 / 0.38) < 0.02 && fabs(f[1] - 0.09 / 0.38) < 0.02 &&
                  fabs(f[2] - 0.04 / 0.38) < 0.02,
              "T=0.5: %g %g %g", f[0], f[1], f[2]);
}

Test(worker, top_p_excludes_tail_when_mass_is_reached)
{
    float logits[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    double f[4];
    /* 0.5 alone is not above 0.75; 0.5 + 0.3 is: the nucleus is {0, 1}, renormalised. */
    struct sl_sampling p = {.temperature = 1.0f, .top_p = 0.75f};
    frequencies(logits, 4, &p, 20000, f);
    cr_assert_eq(f[2], 0.0);
    cr_assert_eq(f[3], 0.0);
    cr_assert(fabs(f[0] - 0.625) < 0.02 && fabs(f[1] - 0.375) < 0.02, "%g %g", f[0], f[1]);
}

Test(worker, top_k_keeps_k_most_likely_when_set)
{
    float logits[5] = {logf(0.1f), logf(0.4f), logf(0.05f), logf(0.3f), logf(0.15f)};
    double f[5];
    struct sl_sampling p = {.temperature = 1.0f, .top_p = 1.0f, .top_k = 2};
    frequencies(logits, 5, &p, 20000, f);
    cr_assert(f[0] == 0.0 && f[2] == 0.0 && f[4] == 0.0, "%g %g %g", f[0], f[2], f[4]);
    cr_assert(fabs(f[1] - 0.4 / 0.7) < 0.02 && fabs(f[3] - 0.3 / 0.7) < 0.02, "%g %g", f[1], f[3]);
    /* top_k 1 is greedy whatever the temperature. */
    p.top_k = 1;
    frequencies(logits, 5, &p, 2000, f);
    cr_assert(fabs(f[1] - 1.0) < 1e-9, "%g", f[1]);
}

Test(worker, top_p_applies_to_top_k_survivors_when_both_set)
{
    float logits[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
    double f[4];
    /* top-k 3 keeps {0.4, 0.3, 0.2} (mass 0.9); top-p 0.5 of that is 0.45: 0.4 alone is not above
     * it, 0.4 + 0.3 is — the nucleus is {0, 1}. Without top-k, 0.5 of 1.0 would give the same
     * set, so also check a case where they differ: top-p 0.8 → 0.72 of 0.9 needs all three. */
    struct sl_sampling p = {.temperature = 1.0f, .top_p = 0.5f, .top_k = 3};
    frequencies(logits, 4, &p, 20000, f);
    cr_assert(f[2] == 0.0 && f[3] == 0.0, "%g %g", f[2], f[3]);
    cr_assert(fabs(f[0] - 0.4 / 0.7) < 0.02, "%g", f[0]);
    p.top_p = 0.8f;
    frequencies(logits, 4, &p, 20000, f);
    cr_assert_eq(f[3], 0.0);
    cr_assert(fabs(f[2] - 0.2 / 0.9) < 0.02, "%g", f[2]);
}

Test(worker, min_p_drops_tokens_below_fraction_of_best_when_set)
{
    float logits[4] = {logf(0.5f), logf(0.3f), logf(0.12f), logf(0.08f)};
    double f[4];
    /* min_p 0.2: the bar is 0.1, so 0.08 goes and 0.12 stays. */
    struct sl_sampling p = {.temperature = 1.0f, .top_p = 1.0f, .min_p = 0.2f};
    frequencies(logits, 4, &p, 20000, f);
    cr_assert_eq(f[3], 0.0);
    cr_assert(fabs(f[0] - 0.5 / 0.92) < 0.02 && fabs(f[2] - 0.12 / 0.92) < 0.02, "%g %g", f[0],
              f[2]);
}

/* A backend that samples on its device gets the coin from sl_sample_coin: the two halves must be
 * sl_sample exactly, rng state included, for every kind of parameters. */
Test(worker, sample_with_coin_equals_sample_when_coin_is_drawn_first)
{
    enum { V = 257, N = 200 };
    const struct sl_sampling ps[] = {
        {.temperature = 0.0f, .top_p = 1.0f},
        {.temperature = 0.7f, .top_p = 1.0f},
        {.temperature = 1.0f, .top_p = 0.9f},
        {.temperature = 1.3f, .top_p = 1.0f, .top_k = 20},
        {.temperature = 1.0f, .top_p = 0.5f, .top_k = 5},
        {.temperature = 0.9f, .top_p = 1.0f, .min_p = 0.05f},
        {.temperature = 1.0f, .top_p = 1.0f, .top_k = 1},
        {.temperature = 1.0f, .top_p = 0.0f},
    };
    void *scratch = scratch_for(V);
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        struct sl_rng lr, a, b;
        sl_rng_seed(&lr, 99 + k);
        sl_rng_seed(&a, 5);
        sl_rng_seed(&b, 5);
        for (int i = 0; i < N; i++) {
            float l1[V], l2[V];
            random_logits(l1, V, &lr);
            memcpy(l2, l1, sizeof l1);
            int32_t want = sl_sample(l1, V, &ps[k], &a, scratch);
            float coin = sl_sample_coin(&ps[k], V, &b);
            int32_t got = sl_sample_with_coin(l2, V, &ps[k], coin, scratch);
            cr_assert_eq(got, want, "params %zu step %d", k, i);
            cr_assert_eq(a.state, b.state, "params %zu step %d: rng drifted", k, i);
        }
    }
    /* One-entry vocabularies draw nothing. */
    struct sl_rng r;
    sl_rng_seed(&r, 1);
    uint64_t before = r.state;
    cr_assert_eq(sl_sample_coin(&ps[1], 1, &r), 0.0f);
    cr_assert_eq(r.state, before);
    free(scratch);
}

/* Each rule's arithmetic, on a vocabulary small enough to state every expected logit. */
Test(worker, penalties_change_the_logits_each_rule_names)
{
    enum { V = 6 };
    int32_t counts[V] = {0};
    const int32_t prompt[] = {1, 4, 4};
    const int32_t gen[] = {2, 4, 2, 2};

    /* Frequency and presence: generated tokens only, count times frequency plus presence once. */
    float l[V] = {1.0f, 2.0f, 3.0f, -1.0f, 0.5f, 0.0f};
    struct sl_penalties fp = {.frequency = 0.5f, .presence = 0.25f};
    cr_assert(sl_penalties_active(&fp));
    sl_penalties_apply(l, V, &fp, prompt, 3, gen, 4, counts);
    const float want_fp[V] = {1.0f, 2.0f, 3.0f - 1.5f - 0.25f, -1.0f, 0.5f - 0.5f - 0.25f, 0.0f};
    for (int i = 0; i < V; i++)
        cr_assert_float_eq(l[i], want_fp[i], 1e-6f, "token %d: %g, want %g", i, l[i], want_fp[i]);

    /* Repetition: prompt and generated tokens once each, dividing positive logits and
     * multiplying negative ones. */
    float r[V] = {1.0f, 2.0f, -3.0f, -1.0f, 0.5f, 4.0f};
    struct sl_penalties rp = {.repetition = 2.0f};
    sl_penalties_apply(r, V, &rp, prompt, 3, gen, 4, counts);
    const float want_r[V] = {1.0f, 1.0f, -6.0f, -1.0f, 0.25f, 4.0f};
    for (int i = 0; i < V; i++)
        cr_assert_float_eq(r[i], want_r[i], 1e-6f, "token %d: %g, want %g", i, r[i], want_r[i]);

    /* Bias: added, whatever was generated. */
    float b[V] = {0};
    const int32_t ids[] = {5, 0};
    const float bias[] = {100.0f, -3.5f};
    struct sl_penalties bp = {.n_bias = 2, .bias_ids = ids, .bias = bias};
    sl_penalties_apply(b, V, &bp, prompt, 3, gen, 4, counts);
    cr_assert_float_eq(b[5], 100.0f, 1e-6f);
    cr_assert_float_eq(b[0], -3.5f, 1e-6f);
    cr_assert_float_eq(b[2], 0.0f, 1e-6f);

    for (int i = 0; i < V; i++)
        cr_assert_eq(counts[i], 0, "counts must be left zero (token %d: %d)", i, counts[i]);
}

Test(worker, penalties_are_off_when_every_rule_is_at_its_default)
{
    struct sl_penalties none = {0}, one = {.repetition = 1.0f};
    cr_assert_not(sl_penalties_active(&none));
    cr_assert_not(sl_penalties_active(&one));
    float l[3] = {1.0f, -2.0f, 3.0f};
    int32_t counts[3] = {0};
    const int32_t gen[] = {0, 1, 1};
    sl_penalties_apply(l, 3, &one, gen, 3, gen, 3, counts);
    cr_assert(l[0] == 1.0f && l[1] == -2.0f && l[2] == 3.0f);
}

Test(worker, logprobs_are_the_log_softmax_of_the_raw_logits_with_the_best_alternatives)
{
    enum { V = 5 };
    const float l[V] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
    double z = 0;
    for (int i = 0; i < V; i++)
        z += exp((double)l[i]);
    struct sl_token_logprobs lp;
    sl_logprobs(l, V, 4, 3, &lp);
    cr_assert_eq(lp.token, 4);
    cr_assert_float_eq(lp.logprob, (float)(0.5 - log(z)), 1e-5f);
    cr_assert_eq(lp.n_top, 3);
    /* 1 and 3 tie: the lower id first; then 0. */
    cr_assert_eq(lp.top_ids[0], 1);
    cr_assert_eq(lp.top_ids[1], 3);
    cr_assert_eq(lp.top_ids[2], 0);
    for (int k = 0; k < 3; k++)
        cr_assert_float_eq(lp.top_logprobs[k], (float)(l[lp.top_ids[k]] - log(z)), 1e-5f);
    /* No alternatives asked; more than the vocabulary has. */
    sl_logprobs(l, V, 2, 0, &lp);
    cr_assert_eq(lp.n_top, 0);
    cr_assert_float_eq(lp.logprob, (float)(-2.0 - log(z)), 1e-5f);
    sl_logprobs(l, V, 2, SL_MAX_TOP_LOGPROBS, &lp);
    cr_assert_eq(lp.n_top, V);
    cr_assert_eq(lp.top_ids[V - 1], 2, "the least likely comes last");
}
