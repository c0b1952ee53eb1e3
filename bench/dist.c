/* Randomness, token-length distributions and arrival processes. */
#include "bench_impl.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void sl_bench_rng_seed(struct sl_bench_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t sl_bench_rng_next(struct sl_bench_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double sl_bench_rng_uniform(struct sl_bench_rng *r)
{
    return (double)(sl_bench_rng_next(r) >> 11) * 0x1.0p-53;
}

double sl_bench_rng_normal(struct sl_bench_rng *r)
{
    double u1 = 1.0 - sl_bench_rng_uniform(r); /* (0, 1]: log is finite */
    double u2 = sl_bench_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double sl_bench_rng_exp(struct sl_bench_rng *r, double mean)
{
    return -mean * log(1.0 - sl_bench_rng_uniform(r));
}

double sl_bench_rng_gamma(struct sl_bench_rng *r, double shape)
{
    if (shape < 1.0) {
        /* Gamma(a) = Gamma(a + 1) · U^(1/a). */
        double u = 1.0 - sl_bench_rng_uniform(r);
        return sl_bench_rng_gamma(r, shape + 1.0) * pow(u, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = sl_bench_rng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0);
        v = v * v * v;
        double u = 1.0 - sl_bench_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return d * v;
    }
}

static uint32_t clamp_len(double x)
{
    if (!(x >= 1.0)) /* also NaN */
        return 1;
    if (x >= (double)SL_BENCH_LEN_MAX)
        return SL_BENCH_LEN_MAX;
    return (uint32_t)llround(x);
}

uint32_t sl_bench_len_sample(const struct sl_bench_len *d, struct sl_bench_rng *r)
{
    switch (d->kind) {
    case SL_BENCH_LEN_FIXED: return clamp_len(d->a);
    case SL_BENCH_LEN_UNIFORM: {
        uint64_t lo = clamp_len(d->a), hi = clamp_len(d->b);
        return (uint32_t)(lo + sl_bench_rng_next(r) % (hi - lo + 1));
    }
    case SL_BENCH_LEN_LOGNORMAL: return clamp_len(d->a * exp(d->b * sl_bench_rng_normal(r)));
    case SL_BENCH_LEN_FILE:
        return d->n_values ? clamp_len(d->values[sl_bench_rng_next(r) % d->n_values]) : 1;
    }
    return 1;
}

void sl_bench_arrivals_init(struct sl_bench_arrivals *a, const struct sl_bench_arrival *shape,
                            double rate, uint64_t seed, uint64_t stream)
{
    a->shape = *shape;
    a->rate = rate;
    a->on_clock = 0;
    a->t = 0;
    a->started = false;
    sl_bench_rng_seed(&a->rng, seed, stream);
}

double sl_bench_arrivals_next(struct sl_bench_arrivals *a)
{
    if (!a->started) {
        a->started = true;
        return a->t = 0;
    }
    if (isinf(a->rate) || a->rate <= 0)
        return a->t;
    double mean = 1.0 / a->rate;
    switch (a->shape.kind) {
    case SL_BENCH_ARRIVAL_POISSON: a->t += sl_bench_rng_exp(&a->rng, mean); break;
    case SL_BENCH_ARRIVAL_CONSTANT: a->t += mean; break;
    case SL_BENCH_ARRIVAL_GAMMA: {
        double b = a->shape.burstiness;
        a->t += sl_bench_rng_gamma(&a->rng, b) * mean / b;
        break;
    }
    case SL_BENCH_ARRIVAL_ONOFF: {
        /* Arrivals form a Poisson process on the "on" clock; map it onto real time, where every
         * on_s of it is followed by off_s of silence. */
        a->on_clock += sl_bench_rng_exp(&a->rng, mean);
        double cycles = floor(a->on_clock / a->shape.on_s);
        double t =
            cycles * (a->shape.on_s + a->shape.off_s) + (a->on_clock - cycles * a->shape.on_s);
        a->t = t > a->t ? t : a->t;
        break;
    }
    }
    return a->t;
}
