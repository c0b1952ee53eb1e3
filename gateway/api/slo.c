/* SLO attainment: judging a finished request against its tier's objectives, and the ring of
 * per-second and per-minute slots that /admin/slo's windows are read from (gateway_impl.h says
 * what counts and how).
 *
 * Latencies are compared in integer nanoseconds, TPOT without dividing: (e2e - ttft) against the
 * objective times (tokens - 1), so a request exactly at its objective meets it whatever the
 * rounding of a division would say.
 */
#include "gateway_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NS_PER_MS 1000000LL
#define NS_PER_S 1000000000LL

const char *sl_slo_objective_str(enum sl_slo_objective o)
{
    static const char *const names[SL_SLO_N_OBJECTIVES] = {
        [SL_SLO_OBJECTIVE_TTFT] = "ttft",
        [SL_SLO_OBJECTIVE_TPOT] = "tpot",
        [SL_SLO_OBJECTIVE_BOTH] = "both",
    };
    return (int)o >= 0 && o < SL_SLO_N_OBJECTIVES ? names[o] : "both";
}

const char *sl_slo_window_str(enum sl_slo_window w)
{
    static const char *const names[SL_SLO_N_WINDOWS] = {
        [SL_SLO_WINDOW_1M] = "1m",
        [SL_SLO_WINDOW_5M] = "5m",
        [SL_SLO_WINDOW_60M] = "60m",
    };
    return (int)w >= 0 && w < SL_SLO_N_WINDOWS ? names[w] : "60m";
}

static enum sl_slo_mark mark(bool met)
{
    return met ? SL_SLO_MARK_MET : SL_SLO_MARK_MISSED;
}

void sl_slo_judge(int ttft_slo_ms, int tpot_slo_ms, const struct sl_slo_request *r,
                  struct sl_slo_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->ttft_ns = v->tpot_ns = -1;
    int64_t e2e = r->e2e_ns > 0 ? r->e2e_ns : 0;
    int64_t ttft = r->ttft_ns >= 0 && r->ttft_ns <= e2e ? r->ttft_ns : e2e;
    bool has_tpot = r->completion_tokens > 1;
    if (r->failed) {
        if (ttft_slo_ms > 0)
            v->mark[SL_SLO_OBJECTIVE_TTFT] = SL_SLO_MARK_MISSED;
        if (tpot_slo_ms > 0)
            v->mark[SL_SLO_OBJECTIVE_TPOT] = SL_SLO_MARK_MISSED;
        v->mark[SL_SLO_OBJECTIVE_BOTH] = SL_SLO_MARK_MISSED;
        return;
    }
    v->ttft_ns = ttft;
    if (has_tpot)
        v->tpot_ns = (e2e - ttft + (r->completion_tokens - 1) / 2) / (r->completion_tokens - 1);
    bool all = true;
    if (ttft_slo_ms > 0) {
        bool met = ttft <= ttft_slo_ms * NS_PER_MS;
        v->mark[SL_SLO_OBJECTIVE_TTFT] = mark(met);
        all &= met;
    }
    if (tpot_slo_ms > 0 && has_tpot) {
        bool met = e2e - ttft <= tpot_slo_ms * NS_PER_MS * (int64_t)(r->completion_tokens - 1);
        v->mark[SL_SLO_OBJECTIVE_TPOT] = mark(met);
        all &= met;
    }
    v->mark[SL_SLO_OBJECTIVE_BOTH] = mark(all);
}

/* ---- latency histograms ---- */

#define N_BINS SL_SLO_BINS
#define BIN_BASE_NS 100000 /* 100 us: the first bin's upper bound */

/* Upper bound of bin i (0 .. N_BINS - 2) in ns: 100 us * 2^(i/3). The last bin has none. */
static double bin_bound(int i)
{
    static const double third[3] = {1.0, 1.2599210498948732, 1.5874010519681994}; /* 2^(k/3) */
    return (double)BIN_BASE_NS * (double)(1ull << (i / 3)) * third[i % 3];
}

static int bin_of(int64_t ns)
{
    /* The first bin whose bound is >= ns: bounds are inclusive, as Prometheus' le. */
    int lo = 0, hi = N_BINS - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if ((double)ns <= bin_bound(mid))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The q-quantile (0 < q <= 1) of n observations in h, in seconds; -1 when n is 0. The
 * nearest-rank observation's bin, and where that rank falls among the bin's observations placed
 * evenly on a log scale between its bounds (linearly in the first bin, from 0). */
static double quantile(const uint64_t *h, uint64_t n, double q)
{
    if (n == 0)
        return -1;
    uint64_t rank = (uint64_t)ceil(q * (double)n);
    if (rank < 1)
        rank = 1;
    uint64_t below = 0;
    int b = 0;
    while (b < N_BINS - 1 && below + h[b] < rank)
        below += h[b++];
    if (b == N_BINS - 1)
        return bin_bound(N_BINS - 2) / 1e9;
    double f = ((double)(rank - below) - 0.5) / (double)h[b];
    if (b == 0)
        return f * bin_bound(0) / 1e9;
    return bin_bound(b - 1) * exp2(f / 3.0) / 1e9;
}

/* ---- the ring ---- */

#define SECOND_SLOTS 300 /* the 5m window, which holds the 1m one */
#define MINUTE_SLOTS 60

struct slot {
    int64_t t; /* the second (or minute) it counts; INT64_MIN: never used */
    uint32_t counted[SL_SLO_N_OBJECTIVES], met[SL_SLO_N_OBJECTIVES];
    uint32_t refused[SL_ADMIT_N_REASONS];
    uint32_t degraded[SL_OVERLOAD_N_KINDS];
    uint32_t ttft[N_BINS], tpot[N_BINS]; /* latency histograms (bins as bin_of) */
};

struct sl_slo_ring {
    struct slot seconds[SECOND_SLOTS]; /* second s in [s % SECOND_SLOTS] */
    struct slot minutes[MINUTE_SLOTS]; /* minute m (second / 60) in [m % MINUTE_SLOTS] */
};

static void slot_clear(struct slot *s, int64_t t)
{
    memset(s, 0, sizeof *s);
    s->t = t;
}

struct sl_slo_ring *sl_slo_ring_new(void)
{
    struct sl_slo_ring *r = sl_xmalloc(sizeof *r);
    for (int i = 0; i < SECOND_SLOTS; i++)
        slot_clear(&r->seconds[i], INT64_MIN);
    for (int i = 0; i < MINUTE_SLOTS; i++)
        slot_clear(&r->minutes[i], INT64_MIN);
    return r;
}

void sl_slo_ring_free(struct sl_slo_ring *r)
{
    free(r);
}

size_t sl_slo_ring_bytes(void)
{
    return sizeof(struct sl_slo_ring);
}

static void slot_add(struct slot *s, int64_t t, const struct sl_slo_event *e)
{
    if (s->t > t)
        return; /* older than what the slot holds now: its time has left the ring */
    if (s->t < t)
        slot_clear(s, t);
    for (int o = 0; o < SL_SLO_N_OBJECTIVES; o++)
        if (e->v.mark[o] != SL_SLO_MARK_NONE) {
            s->counted[o]++;
            s->met[o] += e->v.mark[o] == SL_SLO_MARK_MET;
        }
    /* Latencies only of a request that counts: a zeroed event (a refusal) has none. */
    bool counted = e->v.mark[SL_SLO_OBJECTIVE_BOTH] != SL_SLO_MARK_NONE;
    if (counted && e->v.ttft_ns >= 0)
        s->ttft[bin_of(e->v.ttft_ns)]++;
    if (counted && e->v.tpot_ns >= 0)
        s->tpot[bin_of(e->v.tpot_ns)]++;
    if ((int)e->refused > SL_ADMIT_REASON_NONE && e->refused < SL_ADMIT_N_REASONS)
        s->refused[e->refused]++;
    for (int k = 0; k < SL_OVERLOAD_N_KINDS; k++)
        if (e->degraded & (1u << k))
            s->degraded[k]++;
}

void sl_slo_ring_add(struct sl_slo_ring *r, uint64_t now_ns, const struct sl_slo_event *e)
{
    int64_t sec = (int64_t)(now_ns / NS_PER_S), min = sec / 60;
    slot_add(&r->seconds[sec % SECOND_SLOTS], sec, e);
    slot_add(&r->minutes[min % MINUTE_SLOTS], min, e);
}

void sl_slo_acc_init(struct sl_slo_acc *acc)
{
    memset(acc, 0, sizeof *acc);
}

void sl_slo_ring_accumulate(const struct sl_slo_ring *r, uint64_t now_ns, enum sl_slo_window w,
                            struct sl_slo_acc *acc)
{
    struct sl_slo_summary *s = &acc->s;
    int64_t sec = (int64_t)(now_ns / NS_PER_S);
    const struct slot *slots = r->seconds;
    int n = SECOND_SLOTS, span = w == SL_SLO_WINDOW_1M ? 60 : SECOND_SLOTS;
    int64_t now = sec;
    if (w == SL_SLO_WINDOW_60M) {
        slots = r->minutes;
        n = span = MINUTE_SLOTS;
        now = sec / 60;
    }
    /* The slots of times now - span + 1 .. now, each holding that time's counts or a recycled
     * time's (which is not in the window). */
    for (int64_t t = now - span + 1; t <= now; t++) {
        if (t < 0)
            continue;
        const struct slot *sl = &slots[t % n];
        if (sl->t != t)
            continue;
        for (int o = 0; o < SL_SLO_N_OBJECTIVES; o++) {
            s->counted[o] += sl->counted[o];
            s->met[o] += sl->met[o];
        }
        for (int k = 0; k < SL_ADMIT_N_REASONS; k++)
            s->refused[k] += sl->refused[k];
        for (int k = 0; k < SL_OVERLOAD_N_KINDS; k++)
            s->degraded[k] += sl->degraded[k];
        for (int b = 0; b < N_BINS; b++) {
            acc->ttft[b] += sl->ttft[b];
            acc->tpot[b] += sl->tpot[b];
            acc->n_ttft += sl->ttft[b];
            acc->n_tpot += sl->tpot[b];
        }
    }
}

void sl_slo_acc_summary(const struct sl_slo_acc *acc, struct sl_slo_summary *s)
{
    *s = acc->s;
    s->ttft_p50 = quantile(acc->ttft, acc->n_ttft, 0.50);
    s->ttft_p99 = quantile(acc->ttft, acc->n_ttft, 0.99);
    s->tpot_p50 = quantile(acc->tpot, acc->n_tpot, 0.50);
    s->tpot_p99 = quantile(acc->tpot, acc->n_tpot, 0.99);
}

void sl_slo_ring_read(const struct sl_slo_ring *r, uint64_t now_ns, enum sl_slo_window w,
                      struct sl_slo_summary *s)
{
    struct sl_slo_acc acc;
    sl_slo_acc_init(&acc);
    sl_slo_ring_accumulate(r, now_ns, w, &acc);
    sl_slo_acc_summary(&acc, s);
}

/* ---- JSON ---- */

static void put_seconds(struct sl_str *o, const char *name, double s)
{
    if (s < 0)
        sl_str_appendf(o, ",\"%s\":null", name);
    else
        sl_str_appendf(o, ",\"%s\":%.6f", name, s);
}

void sl_slo_summary_json(struct sl_str *o, const struct sl_slo_summary *s)
{
    uint64_t n = s->counted[SL_SLO_OBJECTIVE_BOTH];
    sl_str_appendf(o,
                   "{\"requests\":%llu,\"ttft_requests\":%llu,\"ttft_met\":%llu,"
                   "\"tpot_requests\":%llu,\"tpot_met\":%llu,\"both_met\":%llu,\"attainment\":",
                   (unsigned long long)n, (unsigned long long)s->counted[SL_SLO_OBJECTIVE_TTFT],
                   (unsigned long long)s->met[SL_SLO_OBJECTIVE_TTFT],
                   (unsigned long long)s->counted[SL_SLO_OBJECTIVE_TPOT],
                   (unsigned long long)s->met[SL_SLO_OBJECTIVE_TPOT],
                   (unsigned long long)s->met[SL_SLO_OBJECTIVE_BOTH]);
    if (n)
        sl_str_appendf(o, "%.6g", (double)s->met[SL_SLO_OBJECTIVE_BOTH] / (double)n);
    else
        sl_str_append(o, "null", 4);
    put_seconds(o, "ttft_p50", s->ttft_p50);
    put_seconds(o, "ttft_p99", s->ttft_p99);
    put_seconds(o, "tpot_p50", s->tpot_p50);
    put_seconds(o, "tpot_p99", s->tpot_p99);
    sl_str_append(o, ",\"refused\":{", 12);
    const char *sep = "";
    for (int k = SL_ADMIT_REASON_NONE + 1; k < SL_ADMIT_N_REASONS; k++)
        if (s->refused[k]) {
            sl_str_appendf(o, "%s\"%s\":%llu", sep, sl_admit_reason_str((enum sl_admit_reason)k),
                           (unsigned long long)s->refused[k]);
            sep = ",";
        }
    sl_str_append(o, "},\"degraded\":{", 14);
    sep = "";
    for (int k = 0; k < SL_OVERLOAD_N_KINDS; k++)
        if (s->degraded[k]) {
            sl_str_appendf(o, "%s\"%s\":%llu", sep, sl_overload_kind_str((enum sl_overload_kind)k),
                           (unsigned long long)s->degraded[k]);
            sep = ",";
        }
    sl_str_append(o, "}}", 2);
}
