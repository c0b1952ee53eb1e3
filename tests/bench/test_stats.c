/* Unit tests of the numbers: percentiles against hand-computed values (numpy's linear rule),
 * summaries, the seeded generator, length distributions and arrival processes. Statistical
 * checks use fixed seeds, so they are deterministic: a failure is a bug, not bad luck. */
#include <criterion/criterion.h>

#include "bench_impl.h"

#include <math.h>
#include <string.h>

static void fill(struct sl_bench_samples *s, const double *v, size_t n)
{
    sl_bench_samples_init(s);
    for (size_t i = 0; i < n; i++)
        sl_bench_samples_add(s, v[i]);
}

Test(bench, percentiles_match_hand_computed_values_when_input_is_unsorted)
{
    /* Sorted: 15 20 35 40 50; rank = p/100 * 4. */
    static const double v[] = {40, 15, 50, 35, 20};
    struct sl_bench_samples s;
    fill(&s, v, 5);
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 0), 15, 1e-12);
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 25), 20, 1e-12);   /* rank 1 */
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 50), 35, 1e-12);   /* rank 2 */
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 40), 29, 1e-12);   /* 1.6: 20+.6*15 */
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 90), 46, 1e-12);   /* 3.6: 40+.6*10 */
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 99), 49.6, 1e-12); /* 3.96 */
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 99.9), 49.96, 1e-12);
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 100), 50, 1e-12);
    sl_bench_samples_dispose(&s);
}

Test(bench, percentiles_of_one_to_a_thousand_interpolate_when_rank_is_fractional)
{
    struct sl_bench_samples s;
    sl_bench_samples_init(&s);
    for (int i = 1000; i >= 1; i--)
        sl_bench_samples_add(&s, i);
    /* rank = p/100 * 999: p50 = 500.5, p90 = 900.1, p99 = 990.01, p99.9 = 999.001 */
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 50), 500.5, 1e-9);
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 90), 900.1, 1e-9);
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 99), 990.01, 1e-9);
    cr_expect_float_eq(sl_bench_samples_percentile(&s, 99.9), 999.001, 1e-9);
    sl_bench_samples_dispose(&s);
}

Test(bench, percentile_is_the_value_when_set_is_constant_or_single)
{
    static const double c3[] = {7.25, 7.25, 7.25};
    struct sl_bench_samples s;
    fill(&s, c3, 3);
    for (double p = 0; p <= 100; p += 0.7)
        cr_expect_eq(sl_bench_samples_percentile(&s, p), 7.25, "p%g", p);
    sl_bench_samples_dispose(&s);
    static const double one[] = {3};
    fill(&s, one, 1);
    cr_expect_eq(sl_bench_samples_percentile(&s, 99.9), 3);
    sl_bench_samples_dispose(&s);
}

Test(bench, summary_is_zero_when_set_is_empty)
{
    struct sl_bench_samples s;
    sl_bench_samples_init(&s);
    struct sl_bench_summary m = sl_bench_samples_summarize(&s);
    cr_expect_eq(m.n, 0);
    cr_expect_eq(m.mean, 0);
    cr_expect_eq(m.max, 0);
    cr_expect_eq(sl_bench_samples_percentile(&s, 99), 0);
}

Test(bench, summary_gives_population_std_when_values_are_known)
{
    static const double v[] = {2, 4, 4, 4, 5, 5, 7, 9};
    struct sl_bench_samples s;
    fill(&s, v, 8);
    struct sl_bench_summary m = sl_bench_samples_summarize(&s);
    cr_expect_eq(m.n, 8);
    cr_expect_float_eq(m.mean, 5, 1e-12);
    cr_expect_float_eq(m.std, 2, 1e-12);
    cr_expect_float_eq(m.median, 4.5, 1e-12);
    cr_expect_eq(m.min, 2);
    cr_expect_eq(m.max, 9);
    /* Adding after a summary keeps the set correct (it re-sorts). */
    sl_bench_samples_add(&s, 1);
    cr_expect_eq(sl_bench_samples_percentile(&s, 0), 1);
    sl_bench_samples_dispose(&s);
}

Test(bench, generator_repeats_when_seed_and_stream_repeat)
{
    struct sl_bench_rng a, b, c;
    sl_bench_rng_seed(&a, 42, 1);
    sl_bench_rng_seed(&b, 42, 1);
    sl_bench_rng_seed(&c, 42, 2);
    int differ = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = sl_bench_rng_next(&a);
        cr_assert_eq(x, sl_bench_rng_next(&b));
        differ += x != sl_bench_rng_next(&c);
        double u = sl_bench_rng_uniform(&a);
        sl_bench_rng_uniform(&b);
        sl_bench_rng_uniform(&c);
        cr_assert(u >= 0 && u < 1);
    }
    cr_expect_gt(differ, 95);
}

static struct sl_bench_len len_of(enum sl_bench_len_kind k, double a, double b)
{
    return (struct sl_bench_len){.kind = k, .a = a, .b = b};
}

Test(bench, lengths_stay_in_range_when_drawn_from_each_distribution)
{
    struct sl_bench_rng r;
    sl_bench_rng_seed(&r, 7, 0);
    struct sl_bench_len fixed = len_of(SL_BENCH_LEN_FIXED, 64, 0);
    struct sl_bench_len uni = len_of(SL_BENCH_LEN_UNIFORM, 3, 6);
    bool seen[7] = {0};
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(sl_bench_len_sample(&fixed, &r), 64);
        uint32_t u = sl_bench_len_sample(&uni, &r);
        cr_assert(u >= 3 && u <= 6, "%u", u);
        seen[u] = true;
    }
    cr_expect(seen[3] && seen[4] && seen[5] && seen[6], "every value of [3, 6] comes up");
    static const uint32_t file_values[] = {10, 20, 30};
    struct sl_bench_len file = {.kind = SL_BENCH_LEN_FILE, .values = file_values, .n_values = 3};
    for (int i = 0; i < 100; i++) {
        uint32_t f = sl_bench_len_sample(&file, &r);
        cr_assert(f == 10 || f == 20 || f == 30);
    }
    /* A wide lognormal is clamped to at least one token. */
    struct sl_bench_len wide = len_of(SL_BENCH_LEN_LOGNORMAL, 1, 5);
    for (int i = 0; i < 1000; i++)
        cr_assert_geq(sl_bench_len_sample(&wide, &r), 1);
}

Test(bench, lognormal_median_is_near_its_parameter_when_many_are_drawn)
{
    struct sl_bench_rng r;
    sl_bench_rng_seed(&r, 1, 0);
    struct sl_bench_len d = len_of(SL_BENCH_LEN_LOGNORMAL, 200, 0.5);
    struct sl_bench_samples s;
    sl_bench_samples_init(&s);
    for (int i = 0; i < 20001; i++)
        sl_bench_samples_add(&s, sl_bench_len_sample(&d, &r));
    double med = sl_bench_samples_percentile(&s, 50);
    cr_expect(med > 190 && med < 210, "median %g", med);
    /* exp(0.5 * 1.2816) = 1.898: the 90th percentile is near 380. */
    double p90 = sl_bench_samples_percentile(&s, 90);
    cr_expect(p90 > 360 && p90 < 400, "p90 %g", p90);
    sl_bench_samples_dispose(&s);
}

static void gaps(const struct sl_bench_arrival *shape, double rate, int n,
                 struct sl_bench_samples *out, double *last)
{
    struct sl_bench_arrivals a;
    sl_bench_arrivals_init(&a, shape, rate, 3, 9);
    sl_bench_samples_init(out);
    double prev = sl_bench_arrivals_next(&a);
    cr_assert_eq(prev, 0, "the first arrival is at 0");
    for (int i = 0; i < n; i++) {
        double t = sl_bench_arrivals_next(&a);
        cr_assert_geq(t, prev);
        sl_bench_samples_add(out, t - prev);
        prev = t;
    }
    *last = prev;
}

Test(bench, arrivals_have_the_asked_mean_gap_when_poisson_constant_or_gamma)
{
    struct sl_bench_samples g;
    double last;
    struct sl_bench_arrival constant = {.kind = SL_BENCH_ARRIVAL_CONSTANT};
    gaps(&constant, 4, 1000, &g, &last);
    cr_expect_float_eq(last, 250, 1e-9, "1000 gaps of 0.25 s");
    sl_bench_samples_dispose(&g);

    struct sl_bench_arrival poisson = {.kind = SL_BENCH_ARRIVAL_POISSON};
    gaps(&poisson, 10, 100000, &g, &last);
    struct sl_bench_summary m = sl_bench_samples_summarize(&g);
    cr_expect(fabs(m.mean - 0.1) < 0.002, "mean gap %g", m.mean);
    cr_expect(fabs(m.std - 0.1) < 0.003, "exponential: std = mean, got %g", m.std);
    sl_bench_samples_dispose(&g);

    /* Gamma with shape k: mean 1/rate, coefficient of variation 1/sqrt(k). */
    struct sl_bench_arrival bursty = {.kind = SL_BENCH_ARRIVAL_GAMMA, .burstiness = 0.25};
    gaps(&bursty, 10, 100000, &g, &last);
    m = sl_bench_samples_summarize(&g);
    cr_expect(fabs(m.mean - 0.1) < 0.004, "mean gap %g", m.mean);
    cr_expect(fabs(m.std / m.mean - 2.0) < 0.1, "cv %g", m.std / m.mean);
    sl_bench_samples_dispose(&g);
}

Test(bench, onoff_arrivals_never_fall_in_an_off_period)
{
    struct sl_bench_arrival onoff = {.kind = SL_BENCH_ARRIVAL_ONOFF, .on_s = 2, .off_s = 3};
    struct sl_bench_arrivals a;
    sl_bench_arrivals_init(&a, &onoff, 50, 5, 0);
    int n = 0;
    double t = 0;
    while ((t = sl_bench_arrivals_next(&a)) < 500) {
        double phase = fmod(t, 5.0);
        cr_assert(phase <= 2.0 + 1e-9, "arrival at %g is in an off period", t);
        n++;
    }
    /* 100 cycles of 2 s at 50/s: 10000 expected. */
    cr_expect(n > 9600 && n < 10400, "%d arrivals", n);
}

Test(bench, infinite_rate_sends_everything_at_zero)
{
    struct sl_bench_arrival poisson = {.kind = SL_BENCH_ARRIVAL_POISSON};
    struct sl_bench_arrivals a;
    sl_bench_arrivals_init(&a, &poisson, INFINITY, 0, 0);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(sl_bench_arrivals_next(&a), 0);
}

Test(bench, prompt_words_follow_calibration_when_measured)
{
    struct sl_bench_calib none = {.slope = 1, .intercept = 0};
    cr_expect_eq(sl_bench_prompt_words(&none, 128), 128);
    cr_expect_eq(sl_bench_prompt_words(&none, 0), 1);
    struct sl_bench_calib k = {.slope = 2, .intercept = 6, .measured = true};
    cr_expect_eq(sl_bench_prompt_words(&k, 106), 50);
    struct sl_str s;
    sl_str_init(&s);
    struct sl_bench_rng r;
    sl_bench_rng_seed(&r, 0, 0);
    sl_bench_prompt_append(&s, 5, &r);
    int spaces = 0;
    for (size_t i = 0; i < s.len; i++) {
        spaces += s.p[i] == ' ';
        cr_assert(s.p[i] == ' ' || (s.p[i] >= 'a' && s.p[i] <= 'z'), "plain words: %s", s.p);
    }
    cr_expect_eq(spaces, 4);
    sl_str_dispose(&s);
}

Test(bench, shared_prefix_is_one_text_when_seed_repeats)
{
    struct sl_str a, b, c;
    sl_str_init(&a);
    sl_str_init(&b);
    sl_str_init(&c);
    sl_bench_prefix_append(&a, 40, 7);
    sl_bench_prefix_append(&b, 400, 7);
    sl_bench_prefix_append(&c, 40, 8);
    cr_assert_gt(a.len, 0);
    cr_expect_eq(memcmp(a.p, b.p, a.len), 0, "a shorter prefix starts a longer one");
    cr_expect_eq(b.p[a.len], ' ', "and ends at a word's end");
    cr_expect(a.len != c.len || memcmp(a.p, c.p, a.len), "another seed, another prefix");
    /* Not the words a request draws from the same seed. */
    struct sl_str q;
    sl_str_init(&q);
    struct sl_bench_rng r;
    sl_bench_rng_seed(&r, 7, 0x9000);
    sl_bench_prompt_append(&q, 40, &r);
    cr_expect(q.len != a.len || memcmp(q.p, a.p, a.len));
    sl_str_dispose(&a);
    sl_str_dispose(&b);
    sl_str_dispose(&c);
    sl_str_dispose(&q);
}

Test(bench, prefix_words_divide_by_the_slope_without_the_intercept)
{
    struct sl_bench_calib none = {.slope = 1, .intercept = 0};
    cr_expect_eq(sl_bench_prefix_words(&none, 0), 0, "no prefix");
    cr_expect_eq(sl_bench_prefix_words(&none, 1000), 1000);
    struct sl_bench_calib k = {.slope = 2.5, .intercept = 6, .measured = true};
    cr_expect_eq(sl_bench_prefix_words(&k, 1000), 400);
    cr_expect_eq(sl_bench_prefix_words(&k, 1), 1, "at least one word");
    /* prefix + prompt words aim at prefix + prompt tokens: 6 + 2.5 * (400 + 20) = 1056. */
    cr_expect_eq(sl_bench_prompt_words(&k, 56), 20);
}
