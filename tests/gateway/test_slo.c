/* SLO attainment (gateway/api/slo.c): a request judged against its tier's objectives at their
 * exact bounds, and the windows of the ring driven by a fake clock — which second and minute an
 * event is counted in, when it leaves each window, exact counts against a reference model over
 * two hours of events, quantiles against the exact nearest-rank values, and its fixed size. */
#include "gateway_impl.h"

#include <criterion/criterion.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000LL
#define SEC 1000000000LL

/* A fake clock's start: a whole hour, so that minutes and hours start on round figures. */
#define T0 (2 * 3600 * SEC)

static struct sl_slo_verdict judge(int ttft_slo, int tpot_slo, bool failed, int64_t ttft,
                                   int64_t e2e, int tokens)
{
    struct sl_slo_request r = {
        .failed = failed, .ttft_ns = ttft, .e2e_ns = e2e, .completion_tokens = tokens};
    struct sl_slo_verdict v;
    sl_slo_judge(ttft_slo, tpot_slo, &r, &v);
    return v;
}

#define TTFT(v) ((v).mark[SL_SLO_OBJECTIVE_TTFT])
#define TPOT(v) ((v).mark[SL_SLO_OBJECTIVE_TPOT])
#define BOTH(v) ((v).mark[SL_SLO_OBJECTIVE_BOTH])

/* ---- judging ---- */

Test(gateway, slo_ttft_is_met_at_exactly_its_objective_and_missed_one_ns_past_it)
{
    struct sl_slo_verdict v = judge(500, 50, false, 500 * MS, 600 * MS, 3);
    cr_assert_eq(TTFT(v), SL_SLO_MARK_MET, "ttft == objective meets it");
    cr_assert_eq(TPOT(v), SL_SLO_MARK_MET, "(600 - 500) / 2 = 50 ms, at the objective");
    cr_assert_eq(BOTH(v), SL_SLO_MARK_MET);
    cr_assert_eq(v.ttft_ns, 500 * MS);
    cr_assert_eq(v.tpot_ns, 50 * MS);
    v = judge(500, 50, false, 500 * MS + 1, 600 * MS + 1, 3);
    cr_assert_eq(TTFT(v), SL_SLO_MARK_MISSED);
    cr_assert_eq(TPOT(v), SL_SLO_MARK_MET, "its TPOT is still 50 ms");
    cr_assert_eq(BOTH(v), SL_SLO_MARK_MISSED, "one missed objective misses both");
}

Test(gateway, slo_tpot_compares_without_rounding_when_the_division_is_not_exact)
{
    /* 100 ms over 3 gaps is 33.33 ms: within 34 ms, not within 33 ms. */
    cr_assert_eq(TPOT(judge(1000, 34, false, 10 * MS, 110 * MS, 4)), SL_SLO_MARK_MET);
    cr_assert_eq(TPOT(judge(1000, 33, false, 10 * MS, 110 * MS, 4)), SL_SLO_MARK_MISSED);
    /* Exactly 33 ms a token, and 1 ns more over the whole request. */
    cr_assert_eq(TPOT(judge(1000, 33, false, 10 * MS, 109 * MS, 4)), SL_SLO_MARK_MET);
    cr_assert_eq(TPOT(judge(1000, 33, false, 10 * MS, 109 * MS + 1, 4)), SL_SLO_MARK_MISSED);
}

Test(gateway, slo_tpot_is_not_counted_when_the_request_has_fewer_than_two_tokens)
{
    struct sl_slo_verdict v = judge(100, 1, false, 20 * MS, 5000 * MS, 1);
    cr_assert_eq(TPOT(v), SL_SLO_MARK_NONE, "one token has no TPOT, however long the request");
    cr_assert_eq(TTFT(v), SL_SLO_MARK_MET);
    cr_assert_eq(BOTH(v), SL_SLO_MARK_MET, "both is the TTFT objective alone");
    cr_assert_lt(v.tpot_ns, 0, "nothing for the TPOT quantiles");
    v = judge(10, 1, false, 20 * MS, 20 * MS, 0);
    cr_assert_eq(TPOT(v), SL_SLO_MARK_NONE);
    cr_assert_eq(BOTH(v), SL_SLO_MARK_MISSED);
}

Test(gateway, slo_every_objective_is_missed_when_the_request_failed_whatever_its_latency)
{
    struct sl_slo_verdict v = judge(1000, 100, true, 1 * MS, 2 * MS, 2);
    cr_assert_eq(TTFT(v), SL_SLO_MARK_MISSED);
    cr_assert_eq(TPOT(v), SL_SLO_MARK_MISSED);
    cr_assert_eq(BOTH(v), SL_SLO_MARK_MISSED);
    cr_assert_lt(v.ttft_ns, 0, "a failure's latencies are not in the quantiles");
    cr_assert_lt(v.tpot_ns, 0);
    /* Even one that made a single token: the tier's TPOT objective counts it as missed. */
    cr_assert_eq(TPOT(judge(1000, 100, true, -1, 2 * MS, 1)), SL_SLO_MARK_MISSED);
}

Test(gateway, slo_an_objective_of_zero_is_not_counted_and_both_is_met_when_none_is)
{
    struct sl_slo_verdict v = judge(0, 100, false, 9000 * MS, 9100 * MS, 2);
    cr_assert_eq(TTFT(v), SL_SLO_MARK_NONE);
    cr_assert_eq(TPOT(v), SL_SLO_MARK_MET);
    cr_assert_eq(BOTH(v), SL_SLO_MARK_MET);
    cr_assert_eq(v.ttft_ns, 9000 * MS, "its latency is still in the quantiles");
    v = judge(0, 0, false, 9000 * MS, 9100 * MS, 2);
    cr_assert_eq(TTFT(v), SL_SLO_MARK_NONE);
    cr_assert_eq(TPOT(v), SL_SLO_MARK_NONE);
    cr_assert_eq(BOTH(v), SL_SLO_MARK_MET, "no objective: goodput");
    v = judge(0, 0, true, 1, 2, 2);
    cr_assert_eq(BOTH(v), SL_SLO_MARK_MISSED, "but a failure is never goodput");
}

Test(gateway, slo_ttft_is_the_end_when_no_token_with_text_came)
{
    struct sl_slo_verdict v = judge(100, 100, false, -1, 100 * MS, 1);
    cr_assert_eq(TTFT(v), SL_SLO_MARK_MET);
    cr_assert_eq(v.ttft_ns, 100 * MS);
    cr_assert_eq(TTFT(judge(100, 100, false, -1, 100 * MS + 1, 1)), SL_SLO_MARK_MISSED);
}

/* ---- windows ---- */

static struct sl_slo_event met_event(void)
{
    struct sl_slo_event e = {.v = judge(1000, 100, false, 10 * MS, 110 * MS, 2)};
    return e;
}

static uint64_t requests(const struct sl_slo_ring *r, int64_t now, enum sl_slo_window w)
{
    struct sl_slo_summary s;
    sl_slo_ring_read(r, (uint64_t)now, w, &s);
    return s.counted[SL_SLO_OBJECTIVE_BOTH];
}

Test(gateway, slo_window_1m_holds_an_event_for_60_seconds_and_5m_for_300)
{
    struct sl_slo_ring *r = sl_slo_ring_new();
    struct sl_slo_event e = met_event();
    sl_slo_ring_add(r, T0, &e);
    cr_assert_eq(requests(r, T0, SL_SLO_WINDOW_1M), 1, "counted in its own second");
    cr_assert_eq(requests(r, T0 + 59 * SEC, SL_SLO_WINDOW_1M), 1);
    cr_assert_eq(requests(r, T0 + 60 * SEC - 1, SL_SLO_WINDOW_1M), 1, "59.999999999 s later");
    cr_assert_eq(requests(r, T0 + 60 * SEC, SL_SLO_WINDOW_1M), 0, "60 s later it has left");
    cr_assert_eq(requests(r, T0 + 61 * SEC, SL_SLO_WINDOW_1M), 0);
    cr_assert_eq(requests(r, T0 + 60 * SEC, SL_SLO_WINDOW_5M), 1);
    cr_assert_eq(requests(r, T0 + 300 * SEC - 1, SL_SLO_WINDOW_5M), 1);
    cr_assert_eq(requests(r, T0 + 300 * SEC, SL_SLO_WINDOW_5M), 0);
    cr_assert_eq(requests(r, T0 - 1, SL_SLO_WINDOW_1M), 0, "not before it happened");
    /* An event late in its second leaves with its second: the window is whole seconds. */
    sl_slo_ring_add(r, T0 + 1000 * SEC + 999 * MS, &e);
    cr_assert_eq(requests(r, T0 + 1059 * SEC + 999 * MS, SL_SLO_WINDOW_1M), 1);
    cr_assert_eq(requests(r, T0 + 1060 * SEC, SL_SLO_WINDOW_1M), 0);
    sl_slo_ring_free(r);
}

Test(gateway, slo_window_60m_holds_an_event_for_its_minute_and_59_more)
{
    struct sl_slo_ring *r = sl_slo_ring_new();
    struct sl_slo_event e = met_event();
    sl_slo_ring_add(r, T0, &e); /* the first second of a minute */
    cr_assert_eq(requests(r, T0 + 3599 * SEC, SL_SLO_WINDOW_60M), 1);
    cr_assert_eq(requests(r, T0 + 3600 * SEC, SL_SLO_WINDOW_60M), 0, "an hour later it has left");
    /* The last second of a minute: it leaves with its minute, 3541 s later. */
    sl_slo_ring_add(r, T0 + 2 * 3600 * SEC + 59 * SEC, &e);
    cr_assert_eq(requests(r, T0 + 3 * 3600 * SEC - 1, SL_SLO_WINDOW_60M), 1);
    cr_assert_eq(requests(r, T0 + 3 * 3600 * SEC, SL_SLO_WINDOW_60M), 0);
    sl_slo_ring_free(r);
}

/* What one reference event was. */
struct ref {
    int64_t at; /* ns */
    struct sl_slo_event e;
};

/* The windows as their definition says, from the list of every event. */
static void ref_read(const struct ref *ev, int n, int64_t now, enum sl_slo_window w,
                     struct sl_slo_summary *s)
{
    memset(s, 0, sizeof *s);
    int64_t sec = now / SEC;
    for (int i = 0; i < n; i++) {
        int64_t t = ev[i].at / SEC;
        bool in = w == SL_SLO_WINDOW_1M   ? t > sec - 60 && t <= sec
                  : w == SL_SLO_WINDOW_5M ? t > sec - 300 && t <= sec
                                          : t / 60 > sec / 60 - 60 && t / 60 <= sec / 60;
        if (!in)
            continue;
        for (int o = 0; o < SL_SLO_N_OBJECTIVES; o++) {
            s->counted[o] += ev[i].e.v.mark[o] != SL_SLO_MARK_NONE;
            s->met[o] += ev[i].e.v.mark[o] == SL_SLO_MARK_MET;
        }
        if (ev[i].e.refused != SL_ADMIT_REASON_NONE)
            s->refused[ev[i].e.refused]++;
        for (int k = 0; k < SL_OVERLOAD_N_KINDS; k++)
            s->degraded[k] += (ev[i].e.degraded >> k) & 1;
    }
}

Test(gateway, slo_windows_count_exactly_what_their_definition_says_over_two_hours)
{
    struct sl_slo_ring *r = sl_slo_ring_new();
    enum { SPAN = 7200 };
    /* Up to three events a second, some seconds (and whole minutes) without any: requests met
     * and missed, refusals and degradations, from a fixed pseudo-random sequence. */
    struct ref *ev = calloc(3 * SPAN, sizeof *ev);
    int n = 0;
    uint32_t x = 12345;
    for (int s = 0; s < SPAN; s++) {
        if ((s / 60) % 7 == 3)
            continue; /* an idle minute */
        for (int k = 0; k < 3; k++) {
            x = x * 1664525u + 1013904223u;
            if ((x >> 28) < 6)
                continue;
            struct ref *e = &ev[n++];
            e->at = T0 + (int64_t)s * SEC + (int64_t)(x % 1000) * MS;
            int kind = (int)((x >> 12) % 6);
            if (kind == 0)
                e->e.refused = SL_ADMIT_REASON_TIER_QUEUE_REQUESTS;
            else if (kind == 1)
                e->e.refused = SL_ADMIT_REASON_TENANT_TOKENS;
            else
                e->e.v = judge(100, 10, kind == 5, (kind == 3 ? 150 : 50) * MS,
                               (kind == 4 ? 900 : 200) * MS, 1 + (int)((x >> 8) % 20));
            if (kind == 2)
                e->e.degraded = 1u << SL_OVERLOAD_CAP_MAX_TOKENS | 1u << SL_OVERLOAD_DEMOTE;
            sl_slo_ring_add(r, (uint64_t)e->at, &e->e);
        }
        /* Read every window now and then, in the middle of a second and at its edges. */
        if (s % 37 == 0 || s % 600 == 599) {
            int64_t now = T0 + (int64_t)s * SEC + (s % 2 ? SEC - 1 : 500 * MS);
            for (int w = 0; w < SL_SLO_N_WINDOWS; w++) {
                struct sl_slo_summary got, want;
                sl_slo_ring_read(r, (uint64_t)now, (enum sl_slo_window)w, &got);
                /* Every event so far: those later in now's second count too (whole seconds). */
                ref_read(ev, n, now, (enum sl_slo_window)w, &want);
                for (int o = 0; o < SL_SLO_N_OBJECTIVES; o++) {
                    cr_assert_eq(got.counted[o], want.counted[o], "s=%d w=%d o=%d", s, w, o);
                    cr_assert_eq(got.met[o], want.met[o], "s=%d w=%d o=%d", s, w, o);
                }
                for (int k = 0; k < SL_ADMIT_N_REASONS; k++)
                    cr_assert_eq(got.refused[k], want.refused[k], "s=%d w=%d", s, w);
                for (int k = 0; k < SL_OVERLOAD_N_KINDS; k++)
                    cr_assert_eq(got.degraded[k], want.degraded[k], "s=%d w=%d", s, w);
            }
        }
    }
    /* The 60m window at the end holds the last hour's minutes, not the first hour's. */
    struct sl_slo_summary got, want;
    int64_t end = T0 + (int64_t)SPAN * SEC - 1;
    sl_slo_ring_read(r, (uint64_t)end, SL_SLO_WINDOW_60M, &got);
    ref_read(ev, n, end, SL_SLO_WINDOW_60M, &want);
    cr_assert_eq(got.counted[SL_SLO_OBJECTIVE_BOTH], want.counted[SL_SLO_OBJECTIVE_BOTH]);
    cr_assert_gt(want.counted[SL_SLO_OBJECTIVE_BOTH], 0);
    cr_assert_lt(want.counted[SL_SLO_OBJECTIVE_BOTH], (uint64_t)n / 2, "half the events are older");
    free(ev);
    sl_slo_ring_free(r);
}

Test(gateway, slo_ring_is_a_fixed_size_whatever_the_traffic)
{
    /* 300 second slots and 60 minute slots of counts and two 64-bin histograms. */
    cr_assert_lt(sl_slo_ring_bytes(), 256 * 1024);
    cr_assert_gt(sl_slo_ring_bytes(), 360 * 2 * 64 * 4, "every slot has its histograms");
    /* A day of traffic at a thousand events a second: the last hour is all it holds. */
    struct sl_slo_ring *r = sl_slo_ring_new();
    struct sl_slo_event e = met_event();
    for (int64_t s = 0; s < 24 * 3600; s += 7)
        for (int k = 0; k < 1000; k += 100)
            sl_slo_ring_add(r, (uint64_t)(T0 + s * SEC + k * MS), &e);
    int64_t end = T0 + 24 * 3600 * SEC - 1;
    /* Seconds of the last 60 minutes (minutes 1380 .. 1439 of the day) that are multiples of 7. */
    uint64_t want = 0;
    for (int64_t s = 1380 * 60; s < 24 * 3600; s++)
        want += s % 7 == 0 ? 10 : 0;
    cr_assert_eq(requests(r, end, SL_SLO_WINDOW_60M), want);
    sl_slo_ring_free(r);
}

Test(gateway, slo_ring_drops_an_event_older_than_what_its_slot_holds)
{
    /* A clock that ran backwards by the whole ring: the second slot is already the later time's. */
    struct sl_slo_ring *r = sl_slo_ring_new();
    struct sl_slo_event e = met_event();
    sl_slo_ring_add(r, T0 + 300 * SEC, &e);
    sl_slo_ring_add(r, T0, &e);
    cr_assert_eq(requests(r, T0, SL_SLO_WINDOW_5M), 0, "dropped from the second slots");
    cr_assert_eq(requests(r, T0 + 300 * SEC, SL_SLO_WINDOW_60M), 2, "its minute slot was free");
    sl_slo_ring_free(r);
}

/* ---- quantiles ---- */

/* Within a bin (2^(1/3) wide) of the exact value. */
static void near(double got, double want, const char *what)
{
    cr_assert_gt(got, 0, "%s", what);
    cr_assert_lt(fabs(log2(got / want)), 1.0 / 3, "%s: %.9f s for %.9f s", what, got, want);
}

Test(gateway, slo_quantiles_fall_near_the_nearest_rank_values_when_spread_over_the_window)
{
    struct sl_slo_ring *r = sl_slo_ring_new();
    /* TTFT 1 .. 200 ms and TPOT 0.5 .. 100 ms, one request in each of 200 seconds (shuffled, so
     * that each slot holds one value and the read merges them). */
    for (int i = 0; i < 200; i++) {
        int k = (i * 73) % 200 + 1;
        struct sl_slo_event e = {
            .v = judge(1000, 100, false, k * MS, k * MS + 99 * k * MS / 2, 100)};
        sl_slo_ring_add(r, (uint64_t)(T0 + i * SEC), &e);
    }
    struct sl_slo_summary s;
    sl_slo_ring_read(r, T0 + 199 * SEC, SL_SLO_WINDOW_5M, &s);
    near(s.ttft_p50, 0.100, "p50 TTFT: the 100th of 200");
    near(s.ttft_p99, 0.198, "p99 TTFT: the 198th");
    near(s.tpot_p50, 0.050, "p50 TPOT");
    near(s.tpot_p99, 0.099, "p99 TPOT");
    cr_assert_leq(s.ttft_p50, s.ttft_p99);
    /* The last minute: 141 .. 200 s hold the values of i = 140 .. 199. */
    sl_slo_ring_read(r, T0 + 199 * SEC, SL_SLO_WINDOW_1M, &s);
    int vals[60];
    for (int i = 140; i < 200; i++)
        vals[i - 140] = (i * 73) % 200 + 1;
    /* Sorted, the 30th of 60 is the median. */
    for (int i = 0; i < 60; i++)
        for (int j = i + 1; j < 60; j++)
            if (vals[j] < vals[i]) {
                int t = vals[i];
                vals[i] = vals[j];
                vals[j] = t;
            }
    near(s.ttft_p50, vals[29] / 1e3, "p50 TTFT of the last minute");
    near(s.ttft_p99, vals[59] / 1e3, "p99 TTFT of the last minute: its largest");
    sl_slo_ring_free(r);
}

Test(gateway, slo_quantiles_are_none_without_observations_and_clamped_past_the_last_bin)
{
    struct sl_slo_ring *r = sl_slo_ring_new();
    struct sl_slo_summary s;
    sl_slo_ring_read(r, T0, SL_SLO_WINDOW_1M, &s);
    cr_assert_lt(s.ttft_p50, 0);
    cr_assert_lt(s.tpot_p99, 0);
    /* One request of a single token: a TTFT, no TPOT. */
    struct sl_slo_event e = {.v = judge(1000, 100, false, 42 * MS, 42 * MS, 1)};
    sl_slo_ring_add(r, T0, &e);
    sl_slo_ring_read(r, T0, SL_SLO_WINDOW_1M, &s);
    near(s.ttft_p50, 0.042, "p50 of one value");
    cr_assert_eq(s.ttft_p50, s.ttft_p99);
    cr_assert_lt(s.tpot_p50, 0);
    /* 10 000 s is past the last bin's bound (about 166 s): it reads as that bound. */
    e.v = judge(1000, 100, false, 10000 * SEC, 10000 * SEC, 1);
    sl_slo_ring_add(r, T0 + 100 * SEC, &e);
    sl_slo_ring_read(r, T0 + 100 * SEC, SL_SLO_WINDOW_1M, &s);
    cr_assert_float_eq(s.ttft_p50, 0.0001 * exp2(62.0 / 3), 1e-6);
    /* Zero is in the first bin, below 100 us. */
    e.v = judge(1000, 100, false, 0, 0, 1);
    sl_slo_ring_add(r, T0 + 200 * SEC, &e);
    sl_slo_ring_read(r, T0 + 200 * SEC, SL_SLO_WINDOW_1M, &s);
    cr_assert_geq(s.ttft_p50, 0);
    cr_assert_lt(s.ttft_p50, 0.0001);
    sl_slo_ring_free(r);
}

/* ---- JSON ---- */

Test(gateway, slo_summary_json_says_null_without_requests_and_names_reasons_and_kinds)
{
    struct sl_slo_summary s;
    memset(&s, 0, sizeof s);
    s.ttft_p50 = s.ttft_p99 = s.tpot_p50 = s.tpot_p99 = -1;
    s.refused[SL_ADMIT_REASON_TENANT_REQUESTS] = 2;
    struct sl_str o;
    sl_str_init(&o);
    sl_slo_summary_json(&o, &s);
    cr_assert_str_eq(o.p, "{\"requests\":0,\"ttft_requests\":0,\"ttft_met\":0,\"tpot_requests\":0,"
                          "\"tpot_met\":0,\"both_met\":0,\"attainment\":null,\"ttft_p50\":null,"
                          "\"ttft_p99\":null,\"tpot_p50\":null,\"tpot_p99\":null,\"refused\":"
                          "{\"tenant_requests\":2},\"degraded\":{}}");
    sl_str_clear(&o);
    s.counted[SL_SLO_OBJECTIVE_BOTH] = 3;
    s.met[SL_SLO_OBJECTIVE_BOTH] = 2;
    s.ttft_p50 = 0.25;
    s.degraded[SL_OVERLOAD_QUEUE] = 1;
    s.degraded[SL_OVERLOAD_MODEL] = 4;
    sl_slo_summary_json(&o, &s);
    cr_assert(strstr(o.p, "\"requests\":3,"), "%s", o.p);
    cr_assert(strstr(o.p, "\"attainment\":0.666667,\"ttft_p50\":0.250000,"), "%s", o.p);
    cr_assert(strstr(o.p, "\"degraded\":{\"model\":4,\"queue\":1}}"), "%s", o.p);
    sl_str_dispose(&o);
}

/* One tier's window over its tenants (/admin/stats): the rings' windows summed, and the quantiles
 * those of the merged histograms, the same as one ring holding every event gives; not the mean
 * of each ring's quantiles (tenant a's p99 is 10 ms, b's 1 s: the tier's p50 is a's). */
Test(gateway, slo_rings_accumulated_read_as_one_ring_with_all_their_events)
{
    struct sl_slo_ring *a = sl_slo_ring_new(), *b = sl_slo_ring_new(), *all = sl_slo_ring_new();
    for (int i = 0; i < 100; i++) {
        bool to_a = i % 4 != 0; /* 75 to a, fast; 25 to b, slow */
        int64_t ttft = to_a ? 10 * MS : 1000 * MS;
        struct sl_slo_event e = {.v = judge(100, 100, false, ttft, ttft + 50 * MS, 2)};
        if (i == 7)
            e.refused = SL_ADMIT_REASON_TENANT_REQUESTS;
        sl_slo_ring_add(to_a ? a : b, (uint64_t)(T0 + i * SEC), &e);
        sl_slo_ring_add(all, (uint64_t)(T0 + i * SEC), &e);
    }
    struct sl_slo_acc acc;
    sl_slo_acc_init(&acc);
    sl_slo_ring_accumulate(a, T0 + 99 * SEC, SL_SLO_WINDOW_5M, &acc);
    sl_slo_ring_accumulate(b, T0 + 99 * SEC, SL_SLO_WINDOW_5M, &acc);
    struct sl_slo_summary got, want;
    sl_slo_acc_summary(&acc, &got);
    sl_slo_ring_read(all, T0 + 99 * SEC, SL_SLO_WINDOW_5M, &want);
    cr_assert_eq(got.counted[SL_SLO_OBJECTIVE_BOTH], 100);
    cr_assert_eq(got.met[SL_SLO_OBJECTIVE_BOTH], 75, "b's miss their TTFT of 100 ms");
    cr_assert_eq(got.refused[SL_ADMIT_REASON_TENANT_REQUESTS], 1);
    cr_assert_eq(memcmp(got.counted, want.counted, sizeof got.counted), 0);
    cr_assert_eq(memcmp(got.met, want.met, sizeof got.met), 0);
    cr_assert_eq(got.ttft_p50, want.ttft_p50);
    cr_assert_eq(got.ttft_p99, want.ttft_p99);
    cr_assert_eq(got.tpot_p99, want.tpot_p99);
    near(got.ttft_p50, 0.010, "p50 TTFT: a's");
    near(got.ttft_p99, 1.0, "p99 TTFT: b's");
    sl_slo_ring_free(a);
    sl_slo_ring_free(b);
    sl_slo_ring_free(all);
}
