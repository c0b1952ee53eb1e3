/* Sample sets and their summaries. Every value is kept: percentiles are exact order statistics
 * (with numpy's interpolation), not histogram buckets, so p99.9 of a few thousand requests means
 * what it says. A run of a million tokens keeps 8 MB of ITLs, which is fine for a client. */
#include "bench_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sl_bench_samples_init(struct sl_bench_samples *s)
{
    memset(s, 0, sizeof *s);
    s->sorted = true;
}

void sl_bench_samples_dispose(struct sl_bench_samples *s)
{
    free(s->v);
    sl_bench_samples_init(s);
}

void sl_bench_samples_add(struct sl_bench_samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = sl_xrealloc(s->v, s->cap * sizeof *s->v);
    }
    if (s->n && x < s->v[s->n - 1])
        s->sorted = false;
    s->v[s->n++] = x;
}

void sl_bench_samples_merge(struct sl_bench_samples *s, const struct sl_bench_samples *from)
{
    for (size_t i = 0; i < from->n; i++)
        sl_bench_samples_add(s, from->v[i]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void sort(struct sl_bench_samples *s)
{
    if (!s->sorted) {
        qsort(s->v, s->n, sizeof *s->v, cmp_double);
        s->sorted = true;
    }
}

double sl_bench_samples_percentile(struct sl_bench_samples *s, double p)
{
    if (s->n == 0)
        return 0;
    sort(s);
    if (p <= 0)
        return s->v[0];
    if (p >= 100)
        return s->v[s->n - 1];
    double rank = p / 100.0 * (double)(s->n - 1);
    size_t lo = (size_t)floor(rank);
    size_t hi = lo + 1 < s->n ? lo + 1 : lo;
    double frac = rank - (double)lo;
    /* numpy's _lerp: exact at both ends, so a constant set gives that constant. */
    double a = s->v[lo], b = s->v[hi];
    return frac >= 0.5 ? b - (b - a) * (1 - frac) : a + (b - a) * frac;
}

struct sl_bench_summary sl_bench_samples_summarize(struct sl_bench_samples *s)
{
    struct sl_bench_summary m = {0};
    if (s->n == 0)
        return m;
    sort(s);
    m.n = s->n;
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->v[i];
    m.mean = sum / (double)s->n;
    double ss = 0;
    for (size_t i = 0; i < s->n; i++)
        ss += (s->v[i] - m.mean) * (s->v[i] - m.mean);
    m.std = sqrt(ss / (double)s->n);
    m.median = sl_bench_samples_percentile(s, 50);
    m.min = s->v[0];
    m.max = s->v[s->n - 1];
    return m;
}
