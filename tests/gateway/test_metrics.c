/* Metrics: histograms (edges, cumulative buckets, sum and count), the Prometheus text rendering
 * parsed back line by line, label interning and its cap, and exact totals under concurrent
 * recording. */
#include "gateway_impl.h"
#include "slo_json.h"

#include <criterion/criterion.h>
#include <jansson.h>

#include <ctype.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a strict parser of text format 0.0.4 ---- */

#define MAX_FAMILIES 64
#define MAX_LABELS 4

struct family {
    char name[128];
    char type[16];
    bool help;
};

struct sample {
    char name[128];
    int family; /* index into expo.fam */
    int n_labels;
    char label[MAX_LABELS][32];
    char value[MAX_LABELS][256]; /* unescaped */
    double v;
    char key[1024]; /* name{k=v,...} with unescaped values, for lookups */
};

struct expo {
    struct family fam[MAX_FAMILIES];
    int n_fam;
    struct sample *s;
    int n, cap;
};

static bool name_start(char c)
{
    return isalpha((unsigned char)c) || c == '_' || c == ':';
}

static bool name_char(char c)
{
    return name_start(c) || isdigit((unsigned char)c);
}

/* Reads a metric or label name at *p (label names may not contain ':'). */
static void read_name(const char **p, char *out, size_t max, bool label)
{
    const char *s = *p;
    cr_assert(name_start(*s) && !(label && *s == ':'), "bad name start at: %.40s", s);
    size_t n = 0;
    while (name_char(s[n]) && !(label && s[n] == ':'))
        n++;
    cr_assert_lt(n, max);
    memcpy(out, s, n);
    out[n] = '\0';
    *p = s + n;
}

static int family_of(struct expo *x, const char *name)
{
    for (int i = 0; i < x->n_fam; i++)
        if (strcmp(x->fam[i].name, name) == 0)
            return i;
    return -1;
}

static void parse_sample(struct expo *x, const char *line, int current)
{
    if (x->n == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 256;
        x->s = realloc(x->s, sizeof *x->s * (size_t)x->cap);
    }
    struct sample *s = &x->s[x->n];
    memset(s, 0, sizeof *s);
    const char *p = line;
    read_name(&p, s->name, sizeof s->name, false);
    int kn = snprintf(s->key, sizeof s->key, "%s{", s->name);
    if (*p == '{') {
        p++;
        while (*p != '}') {
            cr_assert_lt(s->n_labels, MAX_LABELS, "%s", line);
            read_name(&p, s->label[s->n_labels], sizeof s->label[0], true);
            cr_assert_eq(*p, '=', "%s", line);
            p++;
            cr_assert_eq(*p, '"', "%s", line);
            p++;
            char *v = s->value[s->n_labels];
            size_t n = 0;
            while (*p != '"') {
                cr_assert(*p && *p != '\n', "unterminated label value: %s", line);
                char c = *p++;
                if (c == '\\') {
                    c = *p++;
                    cr_assert(c == '\\' || c == '"' || c == 'n', "bad escape in %s", line);
                    c = c == 'n' ? '\n' : c;
                }
                cr_assert_lt(n, sizeof s->value[0] - 1);
                v[n++] = c;
            }
            v[n] = '\0';
            p++;
            for (int i = 0; i < s->n_labels; i++)
                cr_assert_str_neq(s->label[i], s->label[s->n_labels], "repeated label: %s", line);
            kn += snprintf(s->key + kn, sizeof s->key - (size_t)kn, "%s%s=%s",
                           s->n_labels ? "," : "", s->label[s->n_labels], v);
            s->n_labels++;
            if (*p == ',')
                p++;
            else
                cr_assert_eq(*p, '}', "%s", line);
        }
        p++;
    }
    snprintf(s->key + kn, sizeof s->key - (size_t)kn, "}");
    cr_assert_eq(*p, ' ', "%s", line);
    p++;
    char *end;
    if (strcmp(p, "+Inf") == 0)
        s->v = INFINITY;
    else {
        s->v = strtod(p, &end);
        cr_assert(end != p && *end == '\0', "bad value in: %s", line);
    }
    /* The family: a counter or gauge by its own name, a histogram by name + suffix. */
    int f = family_of(x, s->name);
    if (f < 0 || strcmp(x->fam[f].type, "histogram") == 0) {
        static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
        f = -1;
        for (int i = 0; i < 3 && f < 0; i++) {
            size_t nl = strlen(s->name), sl = strlen(suffixes[i]);
            if (nl > sl && strcmp(s->name + nl - sl, suffixes[i]) == 0) {
                char base[128];
                memcpy(base, s->name, nl - sl);
                base[nl - sl] = '\0';
                int g = family_of(x, base);
                if (g >= 0 && strcmp(x->fam[g].type, "histogram") == 0)
                    f = g;
            }
        }
    }
    cr_assert_geq(f, 0, "sample without a # TYPE: %s", line);
    cr_assert_eq(f, current, "samples of a family are together, after its # TYPE: %s", line);
    bool total = strlen(s->name) > 6 && strcmp(s->name + strlen(s->name) - 6, "_total") == 0;
    if (strcmp(x->fam[f].type, "counter") == 0)
        cr_assert(total, "a counter ends in _total: %s", line);
    else /* promtool: "non-counter metrics should not have "_total" suffix" */
        cr_assert(!total, "only a counter ends in _total: %s", line);
    bool bucket = strstr(s->name, "_bucket") != NULL;
    bool has_le = false;
    for (int i = 0; i < s->n_labels; i++)
        has_le |= strcmp(s->label[i], "le") == 0;
    cr_assert_eq(has_le, bucket, "le only and always on buckets: %s", line);
    for (int i = 0; i < x->n; i++)
        cr_assert_str_neq(x->s[i].key, s->key, "series exposed twice: %s", line);
    s->family = f;
    x->n++;
}

static void expo_parse(struct expo *x, const char *text)
{
    memset(x, 0, sizeof *x);
    int current = -1;
    const char *p = text;
    cr_assert(*p, "empty exposition");
    while (*p) {
        const char *nl = strchr(p, '\n');
        cr_assert_not_null(nl, "every line ends with a newline");
        char line[2048];
        size_t len = (size_t)(nl - p);
        cr_assert_lt(len, sizeof line);
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl + 1;
        if (strncmp(line, "# HELP ", 7) == 0) {
            const char *q = line + 7;
            char name[128];
            read_name(&q, name, sizeof name, false);
            cr_assert_eq(*q, ' ', "%s", line);
            for (q++; *q; q++) {
                if (*q != '\\')
                    continue;
                cr_assert(q[1] == '\\' || q[1] == 'n', "bad escape in %s", line);
                q++;
            }
            cr_assert_eq(family_of(x, name), -1, "HELP comes first, once: %s", line);
            cr_assert_lt(x->n_fam, MAX_FAMILIES);
            struct family *f = &x->fam[x->n_fam++];
            snprintf(f->name, sizeof f->name, "%s", name);
            f->help = true;
            current = -1;
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            const char *q = line + 7;
            char name[128];
            read_name(&q, name, sizeof name, false);
            cr_assert_eq(*q, ' ', "%s", line);
            q++;
            int f = family_of(x, name);
            cr_assert_geq(f, 0, "TYPE after its HELP: %s", line);
            cr_assert_eq(f, x->n_fam - 1, "TYPE right after its HELP: %s", line);
            cr_assert_str_empty(x->fam[f].type, "one TYPE per family: %s", line);
            cr_assert(strcmp(q, "counter") == 0 || strcmp(q, "gauge") == 0 ||
                          strcmp(q, "histogram") == 0,
                      "%s", line);
            snprintf(x->fam[f].type, sizeof x->fam[f].type, "%s", q);
            current = f;
        } else {
            cr_assert_neq(line[0], '#', "unknown comment: %s", line);
            parse_sample(x, line, current);
        }
    }
    for (int i = 0; i < x->n_fam; i++)
        cr_assert(x->fam[i].help && x->fam[i].type[0], "%s has HELP and TYPE", x->fam[i].name);
}

static void expo_dispose(struct expo *x)
{
    free(x->s);
}

/* The value of the series `key` (as struct sample.key), or NAN when absent. */
static double value(const struct expo *x, const char *key)
{
    for (int i = 0; i < x->n; i++)
        if (strcmp(x->s[i].key, key) == 0)
            return x->s[i].v;
    return NAN;
}

/* Checks every histogram: buckets in rising le, counts non-decreasing, the last le is +Inf and
 * equals _count. Returns how many histogram series it checked. */
static int check_histograms(const struct expo *x)
{
    int checked = 0;
    for (int i = 0; i < x->n; i++) {
        const struct sample *s = &x->s[i];
        size_t nl = strlen(s->name);
        if (nl < 7 || strcmp(s->name + nl - 7, "_bucket") != 0)
            continue;
        if (i > 0 && strcmp(x->s[i - 1].name, s->name) == 0 &&
            strcmp(x->s[i - 1].value[0], s->value[0]) == 0)
            continue; /* not the first bucket of its series */
        double prev_le = -INFINITY, prev = 0;
        int j = i;
        for (; j < x->n && strcmp(x->s[j].name, s->name) == 0 &&
               strcmp(x->s[j].value[0], s->value[0]) == 0;
             j++) {
            const struct sample *b = &x->s[j];
            cr_assert_str_eq(b->label[b->n_labels - 1], "le");
            double le = strcmp(b->value[b->n_labels - 1], "+Inf") == 0
                            ? INFINITY
                            : strtod(b->value[b->n_labels - 1], NULL);
            cr_assert_gt(le, prev_le, "le rises: %s", b->key);
            cr_assert_geq(b->v, prev, "cumulative: %s", b->key);
            prev_le = le;
            prev = b->v;
        }
        cr_assert(isinf(prev_le), "the last bucket is +Inf: %s", s->key);
        char base[128], key[512];
        snprintf(base, sizeof base, "%.*s", (int)(nl - 7), s->name);
        cr_assert_lt(j + 1, x->n, "_sum and _count follow the buckets of %s", s->key);
        cr_assert(strstr(x->s[j].name, "_sum"), "_sum follows the buckets of %s", s->key);
        cr_assert(strstr(x->s[j + 1].name, "_count"), "_count follows _sum of %s", s->key);
        snprintf(key, sizeof key, "%s_count{%s=%s}", base, s->label[0], s->value[0]);
        cr_assert_eq(value(x, key), prev, "+Inf equals %s", key);
        checked++;
    }
    return checked;
}

static void render(struct sl_metrics *m, const struct sl_sched_stats *st, struct expo *x,
                   struct sl_str *text)
{
    sl_str_init(text);
    sl_metrics_render(m, st, text);
    expo_parse(x, text->p);
    check_histograms(x);
}

/* ---- histograms ---- */

Test(gateway, histogram_counts_a_value_at_a_bound_in_that_bucket_when_observed_exactly)
{
    struct sl_metrics *m = sl_metrics_new(1);
    sl_metrics_observe_ttft(m, 0, "t", 0.005);       /* exactly the 0.005 bound */
    sl_metrics_observe_ttft(m, 0, "t", 0.005000001); /* 1 ns above it */
    sl_metrics_observe_ttft(m, 0, "t", 0.0);
    sl_metrics_observe_ttft(m, 0, "t", -1.0); /* counts as 0 */
    sl_metrics_observe_ttft(m, 0, "t", NAN);  /* counts as 0 */
    sl_metrics_observe_ttft(m, 0, "t", 2560.0);
    sl_metrics_observe_ttft(m, 0, "t", 3000.0); /* past the last bound */
    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    const char *h = "sluice:time_to_first_token_seconds";
    char key[256];
#define BUCKET(le) (snprintf(key, sizeof key, "%s_bucket{tier=t,le=%s}", h, le), value(&x, key))
    cr_assert_eq(BUCKET("0.001"), 3);
    cr_assert_eq(BUCKET("0.005"), 4, "le is inclusive");
    cr_assert_eq(BUCKET("0.01"), 5);
    cr_assert_eq(BUCKET("1"), 5);
    cr_assert_eq(BUCKET("640"), 5);
    cr_assert_eq(BUCKET("2560"), 6);
    cr_assert_eq(BUCKET("+Inf"), 7);
#undef BUCKET
    snprintf(key, sizeof key, "%s_count{tier=t}", h);
    cr_assert_eq(value(&x, key), 7);
    /* The sum in exact decimal seconds: 0.005 + 0.005000001 + 2560 + 3000. */
    cr_assert(strstr(text.p, "sluice:time_to_first_token_seconds_sum{tier=\"t\"} 5560.010000001\n"),
              "%s", text.p);
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

Test(gateway, histogram_buckets_are_cumulative_when_values_spread)
{
    struct sl_metrics *m = sl_metrics_new(2);
    static const double vals[] = {0.1, 0.29, 0.3, 0.31, 0.9, 1.0, 1.7, 7.0, 70.0, 70.0, 9999.0};
    int n = (int)(sizeof vals / sizeof vals[0]);
    for (int i = 0; i < n; i++) {
        struct sl_metrics_request r = {.tier = "batch",
                                       .tenant = "acme",
                                       .outcome = SL_METRICS_OUTCOME_LENGTH,
                                       .engine = true,
                                       .completion_tokens = 1,
                                       .ttft_seconds = -1,
                                       .e2e_seconds = vals[i],
                                       .queue_seconds = -1};
        sl_metrics_request_done(m, i, &r); /* alternating shards */
    }
    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    int buckets = 0;
    for (int i = 0; i < x.n; i++) {
        const struct sample *s = &x.s[i];
        if (strcmp(s->name, "sluice:e2e_request_latency_seconds_bucket") != 0)
            continue;
        double le = strcmp(s->value[1], "+Inf") == 0 ? INFINITY : strtod(s->value[1], NULL);
        int want = 0;
        for (int k = 0; k < n; k++)
            want += vals[k] <= le;
        cr_assert_eq(s->v, want, "%s", s->key);
        buckets++;
    }
    cr_assert_eq(buckets, 22, "vLLM's 21 request-latency bounds and +Inf");
    cr_assert_eq(value(&x, "sluice:e2e_request_latency_seconds_count{tier=batch}"), n);
    cr_assert_float_eq(value(&x, "sluice:e2e_request_latency_seconds_sum{tier=batch}"),
                       0.1 + 0.29 + 0.3 + 0.31 + 0.9 + 1.0 + 1.7 + 7.0 + 140.0 + 9999.0, 1e-6);
    cr_assert_eq(value(&x, "sluice:request_queue_time_seconds_count{tier=batch}"), 0,
                 "no queue time was given");
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

Test(gateway, inter_token_latency_spreads_a_gap_over_its_tokens_when_one_text_carries_several)
{
    struct sl_metrics *m = sl_metrics_new(1);
    sl_metrics_observe_itl(m, 0, "t", 0.3, 3); /* 0.1 per token */
    sl_metrics_observe_itl(m, 0, "t", 0.02, 1);
    sl_metrics_observe_itl(m, 0, "t", 5.0, 0); /* no tokens: nothing to observe */
    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    const char *h = "sluice:inter_token_latency_seconds";
    char key[256];
    snprintf(key, sizeof key, "%s_bucket{tier=t,le=0.025}", h);
    cr_assert_eq(value(&x, key), 1);
    snprintf(key, sizeof key, "%s_bucket{tier=t,le=0.075}", h);
    cr_assert_eq(value(&x, key), 1);
    snprintf(key, sizeof key, "%s_bucket{tier=t,le=0.1}", h);
    cr_assert_eq(value(&x, key), 4);
    snprintf(key, sizeof key, "%s_count{tier=t}", h);
    cr_assert_eq(value(&x, key), 4, "one observation per token");
    cr_assert(strstr(text.p, "sluice:inter_token_latency_seconds_sum{tier=\"t\"} 0.32\n"),
              "the sum is the whole gaps");
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

Test(gateway, request_done_counts_outcomes_tokens_and_derived_latencies_when_requests_end)
{
    struct sl_metrics *m = sl_metrics_new(1);
    struct sl_metrics_request ok = {.tier = "default",
                                    .tenant = "acme",
                                    .outcome = SL_METRICS_OUTCOME_STOP,
                                    .engine = true,
                                    .prompt_tokens = 7,
                                    .completion_tokens = 11,
                                    .ttft_seconds = 0.1,
                                    .e2e_seconds = 1.1, /* TPOT (1.1 - 0.1) / 10 = 0.1 */
                                    .queue_seconds = 0.002};
    sl_metrics_request_done(m, 0, &ok);
    struct sl_metrics_request one = ok; /* one token: no TPOT */
    one.completion_tokens = 1;
    one.outcome = SL_METRICS_OUTCOME_LENGTH;
    sl_metrics_request_done(m, 0, &one);
    struct sl_metrics_request gone = ok; /* cancelled: no e2e, no TPOT, but it queued */
    gone.outcome = SL_METRICS_OUTCOME_CANCELLED;
    gone.completion_tokens = 4;
    sl_metrics_request_done(m, 0, &gone);
    struct sl_metrics_request bad = {.tier = "default",
                                     .tenant = "acme",
                                     .outcome = SL_METRICS_OUTCOME_INVALID,
                                     .engine = false,
                                     .prompt_tokens = 1000,
                                     .ttft_seconds = -1,
                                     .e2e_seconds = 0.001,
                                     .queue_seconds = -1};
    sl_metrics_request_done(m, 0, &bad);
    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    cr_assert_eq(value(&x, "sluice:requests_total{tier=default,tenant=acme,outcome=stop}"), 1);
    cr_assert_eq(value(&x, "sluice:requests_total{tier=default,tenant=acme,outcome=length}"), 1);
    cr_assert_eq(value(&x, "sluice:requests_total{tier=default,tenant=acme,outcome=cancelled}"), 1);
    cr_assert_eq(value(&x, "sluice:requests_total{tier=default,tenant=acme,outcome=invalid}"), 1);
    cr_assert(isnan(value(&x, "sluice:requests_total{tier=default,tenant=acme,outcome=error}")),
              "a label set that never happened is not exposed");
    cr_assert_eq(value(&x, "sluice:prompt_tokens_total{tenant=acme}"), 21,
                 "a request refused before the engine adds no tokens");
    cr_assert_eq(value(&x, "sluice:generation_tokens_total{tenant=acme}"), 16);
    cr_assert_eq(value(&x, "sluice:e2e_request_latency_seconds_count{tier=default}"), 2);
    cr_assert_eq(value(&x, "sluice:request_queue_time_seconds_count{tier=default}"), 3);
    cr_assert_eq(value(&x, "sluice:time_per_output_token_seconds_count{tier=default}"), 1);
    cr_assert_eq(value(&x, "sluice:time_per_output_token_seconds_bucket{tier=default,le=0.075}"),
                 0);
    cr_assert_eq(value(&x, "sluice:time_per_output_token_seconds_bucket{tier=default,le=0.1}"), 1);
    cr_assert_eq(value(&x, "sluice:time_to_first_token_seconds_count{tier=default}"), 0,
                 "TTFT is observed when the first token arrives, not here");
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

Test(gateway, outcome_follows_the_finish_then_the_status_when_mapped)
{
    cr_assert_eq(sl_metrics_outcome_of("stop", 200), SL_METRICS_OUTCOME_STOP);
    cr_assert_eq(sl_metrics_outcome_of("length", 200), SL_METRICS_OUTCOME_LENGTH);
    cr_assert_eq(sl_metrics_outcome_of("cancelled", 499), SL_METRICS_OUTCOME_CANCELLED);
    cr_assert_eq(sl_metrics_outcome_of("cancelled", 503), SL_METRICS_OUTCOME_CANCELLED);
    cr_assert_eq(sl_metrics_outcome_of("error", 200), SL_METRICS_OUTCOME_ERROR, "mid-stream");
    cr_assert_eq(sl_metrics_outcome_of("error", 500), SL_METRICS_OUTCOME_ERROR);
    cr_assert_eq(sl_metrics_outcome_of("error", 400), SL_METRICS_OUTCOME_INVALID);
    cr_assert_eq(sl_metrics_outcome_of(NULL, 400), SL_METRICS_OUTCOME_INVALID);
    cr_assert_eq(sl_metrics_outcome_of(NULL, 404), SL_METRICS_OUTCOME_INVALID);
    cr_assert_eq(sl_metrics_outcome_of(NULL, 429), SL_METRICS_OUTCOME_REJECTED);
    cr_assert_eq(sl_metrics_outcome_of(NULL, 503), SL_METRICS_OUTCOME_REJECTED);
    cr_assert_eq(sl_metrics_outcome_of(NULL, 500), SL_METRICS_OUTCOME_ERROR);
    cr_assert_str_eq(sl_metrics_outcome_str(SL_METRICS_OUTCOME_REJECTED), "rejected");
    cr_assert_str_eq(sl_metrics_outcome_str(SL_METRICS_OUTCOME_CANCELLED), "cancelled");
}

/* ---- rendering ---- */

Test(gateway, rendering_parses_back_with_escaped_labels_when_names_are_hostile)
{
    struct sl_metrics *m = sl_metrics_new(2);
    const char *tier = "a\"b\\c\nd", *tenant = "x\\\"y";
    sl_metrics_observe_ttft(m, 0, tier, 0.02);
    struct sl_metrics_request r = {.tier = tier,
                                   .tenant = tenant,
                                   .outcome = SL_METRICS_OUTCOME_STOP,
                                   .engine = true,
                                   .prompt_tokens = 2,
                                   .completion_tokens = 3,
                                   .ttft_seconds = 0.02,
                                   .e2e_seconds = 0.5,
                                   .queue_seconds = 0.001};
    sl_metrics_request_done(m, 1, &r);
    sl_metrics_http_done(m, 0, "/v1/completions", 200);
    sl_metrics_http_done(m, 1, "/v1/completions", 200);
    sl_metrics_http_done(m, 0, "other", 404);
    sl_metrics_http_done(m, 0, "other", 42); /* not an HTTP status */
    struct sl_sched_stats st = {.n_tiers = 2,
                                .tiers = {{"interactive", 3, 1, 40, .preemptions = 0},
                                          {"ba\"tch", 0, 9, 900, .preemptions = 7}},
                                .running = 3,
                                .queued_requests = 10,
                                .queued_prompt_tokens = 940,
                                .kv_blocks_used = 12,
                                .kv_blocks_total = 100,
                                .kv_blocks_cached = 5,
                                .prefix_query_tokens = 4096,
                                .prefix_hit_tokens = 1024,
                                .prefix_evictions = 3,
                                .last_step_rows = 17,
                                .last_step_seqs = 4,
                                .steps = 1234,
                                .last_step_seconds = 0.0125,
                                .busy_seconds = 12.5,
                                .busy_ratio = 0.75,
                                .prefill_tokens_per_s = 8123.5,
                                .decode_step_seconds = 0.0145};
    struct expo x;
    struct sl_str text;
    render(m, &st, &x, &text);

    /* Every family the issue asks for is there, typed. */
    static const struct {
        const char *name, *type;
    } want[] = {
        {"sluice:requests_total", "counter"},
        {"sluice:slo_requests_total", "counter"},
        {"sluice:goodput_requests_total", "counter"},
        {"sluice:prompt_tokens_total", "counter"},
        {"sluice:generation_tokens_total", "counter"},
        {"sluice:tenant_cost_total", "counter"},
        {"sluice:tenant_device_seconds_total", "counter"},
        {"sluice:time_to_first_token_seconds", "histogram"},
        {"sluice:time_per_output_token_seconds", "histogram"},
        {"sluice:inter_token_latency_seconds", "histogram"},
        {"sluice:e2e_request_latency_seconds", "histogram"},
        {"sluice:request_queue_time_seconds", "histogram"},
        {"sluice:http_requests_total", "counter"},
        {"sluice:num_requests_running", "gauge"},
        {"sluice:num_requests_waiting", "gauge"},
        {"sluice:num_prompt_tokens_waiting", "gauge"},
        {"sluice:num_preemptions_total", "counter"},
        {"sluice:kv_blocks_used", "gauge"},
        {"sluice:kv_blocks_capacity", "gauge"},
        {"sluice:kv_blocks_cached", "gauge"},
        {"sluice:prefix_cache_queries_total", "counter"},
        {"sluice:prefix_cache_hits_total", "counter"},
        {"sluice:prefix_cache_evictions_total", "counter"},
        {"sluice:step_batch_tokens", "gauge"},
        {"sluice:step_batch_sequences", "gauge"},
        {"sluice:step_duration_seconds", "gauge"},
        {"sluice:prefill_tokens_per_second", "gauge"},
        {"sluice:decode_step_seconds", "gauge"},
        {"sluice:scheduler_steps_total", "counter"},
        {"sluice:worker_busy_ratio", "gauge"},
        {"sluice:worker_busy_seconds_total", "counter"},
        {"sluice:admission_decisions_total", "counter"},
    };
    cr_assert_eq(x.n_fam, (int)(sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int f = family_of(&x, want[i].name);
        cr_assert_geq(f, 0, "%s is exposed", want[i].name);
        cr_assert_str_eq(x.fam[f].type, want[i].type, "%s", want[i].name);
    }
    /* Label values come back byte for byte. */
    char key[512];
    snprintf(key, sizeof key, "sluice:requests_total{tier=%s,tenant=%s,outcome=stop}", tier,
             tenant);
    cr_assert_eq(value(&x, key), 1, "%s", text.p);
    snprintf(key, sizeof key, "sluice:time_to_first_token_seconds_count{tier=%s}", tier);
    cr_assert_eq(value(&x, key), 1);
    cr_assert(strstr(text.p, "tier=\"a\\\"b\\\\c\\nd\""), "escaped on the wire");
    cr_assert_eq(value(&x, "sluice:http_requests_total{route=/v1/completions,code=200}"), 2,
                 "shards are summed");
    cr_assert_eq(value(&x, "sluice:http_requests_total{route=other,code=404}"), 1);
    cr_assert_eq(value(&x, "sluice:http_requests_total{route=other,code=other}"), 1);
    cr_assert_eq(value(&x, "sluice:num_requests_running{tier=interactive}"), 3);
    cr_assert_eq(value(&x, "sluice:num_requests_waiting{tier=ba\"tch}"), 9);
    cr_assert_eq(value(&x, "sluice:num_prompt_tokens_waiting{tier=ba\"tch}"), 900);
    cr_assert_eq(value(&x, "sluice:kv_blocks_used{}"), 12);
    cr_assert_eq(value(&x, "sluice:kv_blocks_capacity{}"), 100);
    cr_assert_eq(value(&x, "sluice:kv_blocks_cached{}"), 5);
    cr_assert_eq(value(&x, "sluice:prefix_cache_queries_total{}"), 4096);
    cr_assert_eq(value(&x, "sluice:prefix_cache_hits_total{}"), 1024);
    cr_assert_eq(value(&x, "sluice:prefix_cache_evictions_total{}"), 3);
    cr_assert_eq(value(&x, "sluice:step_batch_tokens{}"), 17);
    cr_assert_eq(value(&x, "sluice:step_batch_sequences{}"), 4);
    cr_assert_eq(value(&x, "sluice:scheduler_steps_total{}"), 1234);
    cr_assert_float_eq(value(&x, "sluice:step_duration_seconds{}"), 0.0125, 1e-9);
    cr_assert_float_eq(value(&x, "sluice:worker_busy_ratio{}"), 0.75, 1e-9);
    cr_assert_float_eq(value(&x, "sluice:worker_busy_seconds_total{}"), 12.5, 1e-9);
    cr_assert_eq(value(&x, "sluice:num_preemptions_total{tier=ba\"tch}"), 7);
    cr_assert_eq(value(&x, "sluice:num_preemptions_total{tier=interactive}"), 0);
    cr_assert_float_eq(value(&x, "sluice:prefill_tokens_per_second{}"), 8123.5, 1e-6);
    cr_assert_float_eq(value(&x, "sluice:decode_step_seconds{}"), 0.0145, 1e-9);
    cr_assert_eq(check_histograms(&x), 5, "five histograms for the one tier");
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

Test(gateway, rendering_omits_scheduler_gauges_when_there_is_no_scheduler)
{
    struct sl_metrics *m = sl_metrics_new(1);
    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    cr_assert_eq(family_of(&x, "sluice:kv_blocks_capacity"), -1);
    cr_assert_geq(family_of(&x, "sluice:requests_total"), 0, "families exist before samples");
    cr_assert_eq(x.n, 0, "no samples before anything happened");
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

/* ---- vLLM's names (vllm_metrics) ---- */

/* The sum of sluice's per-tier gauge `name` for one model, as the same exposition shows it. */
static double tier_sum(const struct expo *x, const char *name, const char *model)
{
    double sum = 0;
    for (int i = 0; i < x->n; i++) {
        const struct sample *s = &x->s[i];
        if (strcmp(s->name, name) != 0)
            continue;
        for (int l = 0; l < s->n_labels; l++)
            if (strcmp(s->label[l], "model") == 0 && strcmp(s->value[l], model) == 0)
                sum += s->v;
    }
    return sum;
}

Test(gateway, vllm_gauges_sum_a_models_replicas_into_one_series_when_rendered)
{
    /* Model "big" on two replicas, "small" on one and idle; each scheduler with two tiers. */
    const char *names[3] = {"big", "big", "small"};
    const int replicas[3] = {0, 1, 0};
    struct sl_sched_stats st[3] = {
        {.n_tiers = 2,
         .tiers = {{"interactive", 2, 3, 30}, {"batch", 1, 4, 40}},
         .running = 3,
         .queued_requests = 7,
         .kv_blocks_used = 30,
         .kv_blocks_total = 100,
         .block_size = 16},
        {.n_tiers = 2,
         .tiers = {{"interactive", 4, 0, 0}, {"batch", 0, 1, 10}},
         .running = 4,
         .queued_requests = 1,
         .kv_blocks_used = 20,
         .kv_blocks_total = 100,
         .prefix_hit_tokens = 48,
         .block_size = 16},
        {.n_tiers = 2,
         .tiers = {{"interactive", 0, 0, 0}, {"batch", 0, 0, 0}},
         .kv_blocks_total = 50,
         .block_size = 16},
    };
    struct sl_metrics *m = sl_metrics_new(1);
    struct sl_str text;
    sl_str_init(&text);
    sl_metrics_render_models(m, names, replicas, st, 3, &text);
    sl_metrics_render_vllm(names, st, 3, false, &text);
    struct expo x;
    expo_parse(&x, text.p); /* every family with HELP and TYPE, no series twice */

    static const char *const gauges[] = {"vllm:num_requests_waiting", "vllm:num_requests_running",
                                         "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                                         "vllm:cache_config_info"};
    for (size_t i = 0; i < sizeof gauges / sizeof gauges[0]; i++) {
        int f = family_of(&x, gauges[i]);
        cr_assert_geq(f, 0, "%s is exposed", gauges[i]);
        cr_assert_str_eq(x.fam[f].type, "gauge", "%s", gauges[i]);
        int series = 0;
        for (int k = 0; k < x.n; k++)
            series += x.s[k].family == f;
        cr_assert_eq(series, 2, "one series per model: %s", gauges[i]);
    }
    cr_assert_eq(value(&x, "vllm:num_requests_waiting{model_name=big}"), 3 + 4 + 0 + 1);
    cr_assert_eq(value(&x, "vllm:num_requests_running{model_name=big}"), 2 + 1 + 4 + 0);
    cr_assert_float_eq(value(&x, "vllm:kv_cache_usage_perc{model_name=big}"), 50.0 / 200.0, 1e-9,
                       "a fraction of the blocks of both replicas");
    cr_assert_float_eq(value(&x, "vllm:gpu_cache_usage_perc{model_name=big}"), 0.25, 1e-9);
    cr_assert_eq(value(&x, "vllm:cache_config_info{model_name=big,block_size=16,"
                           "num_gpu_blocks=200,enable_prefix_caching=False}"),
                 1, "%s", text.p);
    /* sluice's own series are per replica, the prefix cache's too (each replica has its own). */
    cr_assert_eq(value(&x, "sluice:prefix_cache_hits_total{model=big,replica=1}"), 48, "%s",
                 text.p);
    cr_assert_eq(value(&x, "sluice:prefix_cache_hits_total{model=big,replica=0}"), 0);
    /* The same snapshot as sluice's own gauges. */
    cr_assert_eq(value(&x, "vllm:num_requests_waiting{model_name=big}"),
                 tier_sum(&x, "sluice:num_requests_waiting", "big"));
    cr_assert_eq(value(&x, "vllm:num_requests_running{model_name=big}"),
                 tier_sum(&x, "sluice:num_requests_running", "big"));
    /* The idle model: nothing waits, runs or holds a block. */
    cr_assert_eq(value(&x, "vllm:num_requests_waiting{model_name=small}"), 0);
    cr_assert_eq(value(&x, "vllm:num_requests_running{model_name=small}"), 0);
    cr_assert_eq(value(&x, "vllm:kv_cache_usage_perc{model_name=small}"), 0);
    cr_assert_eq(value(&x, "vllm:cache_config_info{model_name=small,block_size=16,"
                           "num_gpu_blocks=50,enable_prefix_caching=False}"),
                 1);
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

Test(gateway, vllm_gauges_label_even_a_lone_model_when_one_scheduler_serves)
{
    /* sluice's own gauges carry no model label for one scheduler; vLLM's always carry
     * model_name, and a pool without blocks reads as unused rather than dividing by zero. */
    const char *names[1] = {"we\"ird\\id"};
    struct sl_sched_stats st = {.n_tiers = 1,
                                .tiers = {{"interactive", 1, 2, 20}},
                                .running = 1,
                                .queued_requests = 2,
                                .block_size = 32};
    struct sl_metrics *m = sl_metrics_new(1);
    struct sl_str text;
    sl_str_init(&text);
    sl_metrics_render_models(m, names, NULL, &st, 1, &text);
    sl_metrics_render_vllm(names, &st, 1, true, &text);
    struct expo x;
    expo_parse(&x, text.p);
    cr_assert_eq(value(&x, "sluice:num_requests_waiting{tier=interactive}"), 2);
    cr_assert_eq(value(&x, "vllm:num_requests_waiting{model_name=we\"ird\\id}"), 2);
    cr_assert_eq(value(&x, "vllm:num_requests_running{model_name=we\"ird\\id}"), 1);
    cr_assert_eq(value(&x, "vllm:kv_cache_usage_perc{model_name=we\"ird\\id}"), 0);
    cr_assert_eq(value(&x, "vllm:cache_config_info{model_name=we\"ird\\id,block_size=32,"
                           "num_gpu_blocks=0,enable_prefix_caching=True}"),
                 1);
    cr_assert(strstr(text.p, "model_name=\"we\\\"ird\\\\id\""), "escaped on the wire");
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

/* ---- labels ---- */

Test(gateway, label_names_past_the_cap_count_as_other_when_too_many)
{
    struct sl_metrics *m = sl_metrics_new(1);
    char name[32];
    for (int i = 0; i < SL_METRICS_MAX_TIERS + 5; i++) {
        snprintf(name, sizeof name, "tier%d", i);
        sl_metrics_observe_ttft(m, 0, name, 0.01);
    }
    sl_metrics_observe_ttft(m, 0, "tier0", 0.01); /* a known name keeps its own series */
    char long_name[SL_METRICS_MAX_NAME + 2];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    sl_metrics_observe_ttft(m, 0, long_name, 0.01);
    sl_metrics_observe_ttft(m, 0, NULL, 0.01);
    sl_metrics_observe_ttft(m, 0, "", 0.01);
    sl_metrics_observe_ttft(m, 0, SL_METRICS_OTHER, 0.01); /* never a second "other" series */
    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    int series = 0;
    for (int i = 0; i < x.n; i++)
        series += strcmp(x.s[i].name, "sluice:time_to_first_token_seconds_count") == 0;
    cr_assert_eq(series, SL_METRICS_MAX_TIERS + 1, "the cap, then \"other\"");
    cr_assert_eq(value(&x, "sluice:time_to_first_token_seconds_count{tier=tier0}"), 2);
    snprintf(name, sizeof name, "tier%d", SL_METRICS_MAX_TIERS - 1);
    char key[256];
    snprintf(key, sizeof key, "sluice:time_to_first_token_seconds_count{tier=%s}", name);
    cr_assert_eq(value(&x, key), 1, "the last name that fits");
    cr_assert_eq(value(&x, "sluice:time_to_first_token_seconds_count{tier=other}"), 5 + 4);
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

Test(gateway, the_name_other_shares_the_overflow_series_when_used_before_the_cap)
{
    struct sl_metrics *m = sl_metrics_new(1);
    sl_metrics_observe_ttft(m, 0, SL_METRICS_OTHER, 0.01);
    sl_metrics_observe_ttft(m, 0, NULL, 0.01);
    sl_metrics_observe_ttft(m, 0, "real", 0.01);
    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text); /* fails on a series exposed twice */
    cr_assert_eq(value(&x, "sluice:time_to_first_token_seconds_count{tier=other}"), 2);
    cr_assert_eq(value(&x, "sluice:time_to_first_token_seconds_count{tier=real}"), 1);
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

/* ---- concurrency ---- */

#define THREADS 6
#define ROUNDS 20000
#define SLO_T0 (3600ull * 1000000000ull) /* the fake clock of the SLO windows, in ns */
#define HOT_ROUNDS 300000

struct worker_arg {
    struct sl_metrics *m;
    int idx;
};

static void *record_many(void *p)
{
    struct worker_arg *a = p;
    char tier[16], tenant[16];
    snprintf(tier, sizeof tier, "tier%d", a->idx % 2);
    snprintf(tenant, sizeof tenant, "tenant%d", a->idx % 3);
    /* Three shards for six threads: pairs share a shard, so the atomics are what keeps counts. */
    int shard = a->idx % 3;
    for (int i = 0; i < ROUNDS; i++) {
        sl_metrics_observe_ttft(a->m, shard, tier, 0.05);
        sl_metrics_observe_itl(a->m, shard, tier, 0.04, 2);
        struct sl_metrics_request r = {.tier = tier,
                                       .tenant = tenant,
                                       .outcome = i % 2 ? SL_METRICS_OUTCOME_STOP
                                                        : SL_METRICS_OUTCOME_LENGTH,
                                       .engine = true,
                                       .prompt_tokens = 3,
                                       .completion_tokens = 5,
                                       .ttft_seconds = 0.05,
                                       .e2e_seconds = 0.45,
                                       .queue_seconds = 0.001,
                                       .now_ns = SLO_T0 + (uint64_t)i * 1000000};
        /* Every third request misses its TTFT objective (and so both). */
        struct sl_slo_request q = {
            .ttft_ns = i % 3 ? 50000000 : 150000000, .e2e_ns = 450000000, .completion_tokens = 5};
        sl_slo_judge(100, 100, &q, &r.slo);
        sl_metrics_request_done(a->m, shard, &r);
        sl_metrics_http_done(a->m, shard, "/v1/completions", 200);
    }
    /* And every thread on one cell of one shard: a lost update would show. */
    for (int i = 0; i < HOT_ROUNDS; i++)
        sl_metrics_http_done(a->m, 0, "/healthz", 200);
    return NULL;
}

static void *scrape_many(void *p)
{
    struct sl_metrics *m = p;
    struct sl_str text;
    sl_str_init(&text);
    for (int i = 0; i < 20; i++) {
        sl_str_clear(&text);
        sl_metrics_render(m, NULL, &text);
    }
    sl_str_dispose(&text);
    return NULL;
}

Test(gateway, concurrent_recording_keeps_exact_totals_when_threads_share_shards)
{
    struct sl_metrics *m = sl_metrics_new(3);
    pthread_t th[THREADS], scraper;
    struct worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (struct worker_arg){m, i};
        cr_assert_eq(pthread_create(&th[i], NULL, record_many, &args[i]), 0);
    }
    cr_assert_eq(pthread_create(&scraper, NULL, scrape_many, m), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    pthread_join(scraper, NULL);

    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    const double per_thread = ROUNDS;
    char key[256];
    for (int t = 0; t < 2; t++) {
        /* Threads t, t+2, t+4 record tier t. */
        snprintf(key, sizeof key, "sluice:time_to_first_token_seconds_count{tier=tier%d}", t);
        cr_assert_eq(value(&x, key), 3 * per_thread, "%s", key);
        snprintf(key, sizeof key, "sluice:inter_token_latency_seconds_count{tier=tier%d}", t);
        cr_assert_eq(value(&x, key), 3 * 2 * per_thread, "%s", key);
        snprintf(key, sizeof key, "sluice:e2e_request_latency_seconds_count{tier=tier%d}", t);
        cr_assert_eq(value(&x, key), 3 * per_thread, "%s", key);
        snprintf(key, sizeof key, "sluice:e2e_request_latency_seconds_sum{tier=tier%d}", t);
        cr_assert_float_eq(value(&x, key), 3 * per_thread * 0.45, 1e-6, "%s", key);
        snprintf(key, sizeof key, "sluice:time_per_output_token_seconds_bucket{tier=tier%d,le=0.1}",
                 t);
        cr_assert_eq(value(&x, key), 3 * per_thread, "TPOT (0.45 - 0.05) / 4 = 0.1");
    }
    for (int n = 0; n < 3; n++) {
        /* Threads n and n+3 record tenant n, one in each tier. */
        double total = 0;
        for (int t = 0; t < 2; t++)
            for (int o = 0; o < 2; o++) {
                snprintf(key, sizeof key,
                         "sluice:requests_total{tier=tier%d,tenant=tenant%d,outcome=%s}", t, n,
                         o ? "stop" : "length");
                double v = value(&x, key);
                total += isnan(v) ? 0 : v;
            }
        cr_assert_eq(total, 2 * per_thread, "tenant%d", n);
        snprintf(key, sizeof key, "sluice:prompt_tokens_total{tenant=tenant%d}", n);
        cr_assert_eq(value(&x, key), 2 * per_thread * 3);
        snprintf(key, sizeof key, "sluice:generation_tokens_total{tenant=tenant%d}", n);
        cr_assert_eq(value(&x, key), 2 * per_thread * 5);
    }
    cr_assert_eq(value(&x, "sluice:http_requests_total{route=/v1/completions,code=200}"),
                 THREADS * per_thread);
    cr_assert_eq(value(&x, "sluice:http_requests_total{route=/healthz,code=200}"),
                 (double)THREADS * HOT_ROUNDS);
    /* SLO: (ROUNDS + 2) / 3 of each thread's requests missed TTFT; the windows (20 s of fake
     * time, all within the last minute) agree with the counters. */
    const double missed = (ROUNDS + 2) / 3;
    for (int t = 0; t < 2; t++)
        for (int n = 0; n < 3; n++) {
            /* Thread t + 2k records tier t, thread n + 3k tenant n: one thread each pair. */
            snprintf(key, sizeof key,
                     "sluice:slo_requests_total{tier=tier%d,tenant=tenant%d,objective=ttft,"
                     "met=false}",
                     t, n);
            cr_assert_eq(value(&x, key), missed, "%s", key);
            snprintf(key, sizeof key,
                     "sluice:slo_requests_total{tier=tier%d,tenant=tenant%d,objective=both,"
                     "met=true}",
                     t, n);
            cr_assert_eq(value(&x, key), per_thread - missed, "%s", key);
        }
    snprintf(key, sizeof key, "sluice:goodput_requests_total{tier=tier0}");
    cr_assert_eq(value(&x, key), 3 * (per_thread - missed));
    struct sl_str js;
    sl_str_init(&js);
    sl_metrics_slo_json(m, NULL, SLO_T0 + (uint64_t)ROUNDS * 1000000, &js);
    json_t *j = json_loads(js.p, 0, NULL);
    cr_assert_not_null(j, "%s", js.p);
    json_t *tiers = json_object_get(j, "tiers");
    cr_assert_eq(json_array_size(tiers), 2);
    for (size_t t = 0; t < 2; t++) {
        json_t *tenants = json_object_get(json_array_get(tiers, t), "tenants");
        cr_assert_eq(json_array_size(tenants), 3);
        for (size_t n = 0; n < 3; n++) {
            json_t *w = json_object_get(json_array_get(tenants, n), "1m");
            cr_assert_eq(json_integer_value(json_object_get(w, "requests")), per_thread);
            cr_assert_eq(json_integer_value(json_object_get(w, "ttft_met")), per_thread - missed);
        }
    }
    json_decref(j);
    sl_str_dispose(&js);
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

/* ---- SLO attainment ---- */

#define S_NS 1000000000ull

/* A request of tier/tenant at now_s (fake seconds) with verdict v. */
static void slo_request(struct sl_metrics *m, const char *tier, const char *tenant, uint64_t now_s,
                        bool failed, int64_t ttft_ms, int64_t e2e_ms, int tokens)
{
    struct sl_metrics_request r = {.tier = tier,
                                   .tenant = tenant,
                                   .outcome =
                                       failed ? SL_METRICS_OUTCOME_ERROR : SL_METRICS_OUTCOME_STOP,
                                   .engine = true,
                                   .completion_tokens = tokens,
                                   .ttft_seconds = (double)ttft_ms / 1e3,
                                   .e2e_seconds = (double)e2e_ms / 1e3,
                                   .queue_seconds = -1,
                                   .now_ns = now_s * S_NS};
    struct sl_slo_request q = {.failed = failed,
                               .ttft_ns = ttft_ms * 1000000,
                               .e2e_ns = e2e_ms * 1000000,
                               .completion_tokens = tokens};
    /* gold: 200 ms to the first token, 20 ms a token after it. */
    sl_slo_judge(200, 20, &q, &r.slo);
    sl_metrics_request_done(m, 0, &r);
}

static long long jint(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    cr_assert(json_is_integer(v), "%s is an integer", k);
    return json_integer_value(v);
}

Test(gateway, slo_counters_and_windows_agree_when_requests_meet_and_miss_objectives)
{
    struct sl_metrics *m = sl_metrics_new(2);
    /* acme in gold: met, TTFT missed, TPOT missed, one token (no TPOT), failed. */
    slo_request(m, "gold", "acme", 1000, false, 100, 140, 3); /* tpot 20: met */
    slo_request(m, "gold", "acme", 1001, false, 250, 260, 2); /* ttft missed */
    slo_request(m, "gold", "acme", 1002, false, 100, 200, 3); /* tpot 50: missed */
    slo_request(m, "gold", "acme", 1003, false, 100, 100, 1); /* no tpot; both met */
    slo_request(m, "gold", "acme", 1004, true, 100, 100, 3);  /* failed */
    slo_request(m, "gold", "bolt", 1500, false, 100, 100, 1); /* another tenant, later */
    /* A request that never reached an engine counts nowhere; one refused counts apart. */
    struct sl_metrics_request refused = {.tier = "gold",
                                         .tenant = "acme",
                                         .outcome = SL_METRICS_OUTCOME_REJECTED,
                                         .refused = SL_ADMIT_REASON_TIER_QUEUE_REQUESTS,
                                         .policy_tier = "gold",
                                         .now_ns = 1005 * S_NS};
    sl_metrics_request_done(m, 1, &refused);

    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    static const struct {
        const char *key;
        double v;
    } want[] = {
        {"sluice:slo_requests_total{tier=gold,tenant=acme,objective=ttft,met=true}", 3},
        {"sluice:slo_requests_total{tier=gold,tenant=acme,objective=ttft,met=false}", 2},
        {"sluice:slo_requests_total{tier=gold,tenant=acme,objective=tpot,met=true}", 2},
        {"sluice:slo_requests_total{tier=gold,tenant=acme,objective=tpot,met=false}", 2},
        {"sluice:slo_requests_total{tier=gold,tenant=acme,objective=both,met=true}", 2},
        {"sluice:slo_requests_total{tier=gold,tenant=acme,objective=both,met=false}", 3},
        {"sluice:slo_requests_total{tier=gold,tenant=bolt,objective=both,met=true}", 1},
        {"sluice:slo_requests_total{tier=gold,tenant=bolt,objective=tpot,met=true}", NAN},
        {"sluice:goodput_requests_total{tier=gold}", 3},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        double v = value(&x, want[i].key);
        if (isnan(want[i].v))
            cr_assert(isnan(v), "%s is not exposed: nothing counted", want[i].key);
        else
            cr_assert_eq(v, want[i].v, "%s: %g\n%s", want[i].key, v, text.p);
    }

    /* /admin/slo at 1005 s: acme's five requests and refusal are in every window; bolt's, at
     * 1500 s, in none but... none yet: it is in the future of this read. */
    struct sl_tier cfg[2] = {{.sched = {.name = "gold", .ttft_slo_ms = 200, .tpot_slo_ms = 20}},
                             {.sched = {.name = "idle", .ttft_slo_ms = 1, .tpot_slo_ms = 1}}};
    struct sl_tenancy ten = {.tiers = cfg, .n_tiers = 2};
    struct sl_str js;
    sl_str_init(&js);
    sl_metrics_slo_json(m, &ten, 1005 * S_NS, &js);
    json_t *j = json_loads(js.p, 0, NULL);
    cr_assert_not_null(j, "%s", js.p);
    json_t *gold = json_array_get(json_object_get(j, "tiers"), 0);
    cr_assert_eq(jint(gold, "ttft_slo_ms"), 200);
    cr_assert_eq(jint(gold, "tpot_slo_ms"), 20);
    json_t *idle = json_array_get(json_object_get(j, "tiers"), 1);
    cr_assert_str_eq(json_string_value(json_object_get(idle, "tier")), "idle");
    cr_assert_eq(json_array_size(json_object_get(idle, "tenants")), 0, "listed, without traffic");
    for (int w = 0; w < SL_SLO_N_WINDOWS; w++) {
        json_t *a = slo_json_window(j, "gold", "acme", sl_slo_window_str((enum sl_slo_window)w));
        cr_assert_not_null(a, "%s", js.p);
        cr_assert_eq(jint(a, "requests"), 5);
        cr_assert_eq(jint(a, "ttft_requests"), 5);
        cr_assert_eq(jint(a, "ttft_met"), 3);
        cr_assert_eq(jint(a, "tpot_requests"), 4);
        cr_assert_eq(jint(a, "tpot_met"), 2);
        cr_assert_eq(jint(a, "both_met"), 2);
        cr_assert_float_eq(json_real_value(json_object_get(a, "attainment")), 0.4, 1e-9);
        cr_assert_eq(jint(json_object_get(a, "refused"), "tier_queue_requests"), 1);
        cr_assert_eq(json_object_size(json_object_get(a, "degraded")), 0);
        /* TTFTs 100, 250, 100, 100 (the failure's is not a latency): p50 100 ms, p99 250. */
        cr_assert_lt(fabs(log2(json_real_value(json_object_get(a, "ttft_p50")) / 0.1)), 1.0 / 3);
        cr_assert_lt(fabs(log2(json_real_value(json_object_get(a, "ttft_p99")) / 0.25)), 1.0 / 3);
    }
    json_t *b = slo_json_window(j, "gold", "bolt", "60m");
    cr_assert_not_null(b, "bolt has a series");
    cr_assert_eq(jint(b, "requests"), 0, "its request is after this read");
    cr_assert(json_is_null(json_object_get(b, "attainment")));
    cr_assert(json_is_null(json_object_get(b, "ttft_p50")));
    json_decref(j);

    /* At 1070 s acme's requests have left 1m, not 5m; at 1500 s bolt's is in 1m, acme's in 60m
     * only. */
    sl_str_clear(&js);
    sl_metrics_slo_json(m, &ten, 1070 * S_NS, &js);
    j = json_loads(js.p, 0, NULL);
    cr_assert_eq(jint(slo_json_window(j, "gold", "acme", "1m"), "requests"), 0);
    cr_assert_eq(jint(slo_json_window(j, "gold", "acme", "5m"), "requests"), 5);
    json_decref(j);
    sl_str_clear(&js);
    sl_metrics_slo_json(m, &ten, 1500 * S_NS, &js);
    j = json_loads(js.p, 0, NULL);
    cr_assert_eq(jint(slo_json_window(j, "gold", "bolt", "1m"), "requests"), 1);
    cr_assert_eq(jint(slo_json_window(j, "gold", "acme", "5m"), "requests"), 0);
    cr_assert_eq(jint(slo_json_window(j, "gold", "acme", "60m"), "requests"), 5);
    json_decref(j);
    sl_str_dispose(&js);
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_metrics_free(m);
}

Test(gateway, slo_degradation_counts_in_the_policy_tier_and_attainment_in_the_tier_it_ran_in)
{
    struct sl_metrics *m = sl_metrics_new(1);
    struct sl_metrics_request r = {.tier = "batch",
                                   .tenant = "acme",
                                   .outcome = SL_METRICS_OUTCOME_LENGTH,
                                   .engine = true,
                                   .completion_tokens = 2,
                                   .policy_tier = "gold",
                                   .degraded =
                                       1u << SL_OVERLOAD_DEMOTE | 1u << SL_OVERLOAD_CAP_MAX_TOKENS,
                                   .now_ns = 10 * S_NS};
    struct sl_slo_request q = {.ttft_ns = 1, .e2e_ns = 2, .completion_tokens = 2};
    sl_slo_judge(100, 100, &q, &r.slo);
    sl_metrics_request_done(m, 0, &r);
    struct sl_str js;
    sl_str_init(&js);
    sl_metrics_slo_json(m, NULL, 10 * S_NS, &js);
    json_t *j = json_loads(js.p, 0, NULL);
    cr_assert_not_null(j, "%s", js.p);
    json_t *batch = slo_json_window(j, "batch", "acme", "1m"),
           *gold = slo_json_window(j, "gold", "acme", "1m");
    cr_assert_not_null(batch, "%s", js.p);
    cr_assert_not_null(gold, "%s", js.p);
    cr_assert_eq(jint(batch, "requests"), 1);
    cr_assert_eq(jint(batch, "both_met"), 1);
    cr_assert_eq(json_object_size(json_object_get(batch, "degraded")), 0);
    cr_assert_eq(jint(gold, "requests"), 0);
    cr_assert_eq(jint(json_object_get(gold, "degraded"), "demote"), 1);
    cr_assert_eq(jint(json_object_get(gold, "degraded"), "cap_max_tokens"), 1);
    cr_assert(json_is_null(json_object_get(gold, "ttft_p50")), "no latency in the policy tier");
    cr_assert(json_is_null(
                  json_object_get(json_array_get(json_object_get(j, "tiers"), 0), "ttft_slo_ms")),
              "no configuration given: objectives unknown");
    json_decref(j);
    sl_str_dispose(&js);
    sl_metrics_free(m);
}

Test(gateway, slo_series_past_the_cap_go_to_the_tier_s_other_tenant)
{
    struct sl_metrics *m = sl_metrics_new(1);
    /* 2 tiers x 128 tenants: 256 series, the cap; then 10 tenant names past the label table's
     * cap, and one more pair of named labels. */
    char tenant[32];
    for (int t = 0; t < 2; t++)
        for (int n = 0; n < SL_METRICS_MAX_TENANTS; n++) {
            snprintf(tenant, sizeof tenant, "t%d", n);
            slo_request(m, t ? "b" : "a", tenant, 100, false, 1, 1, 1);
        }
    slo_request(m, "c", "t0", 100, false, 1, 1, 1); /* a 257th pair of known names */
    for (int n = 0; n < 10; n++) {
        snprintf(tenant, sizeof tenant, "late%d", n); /* past the tenant labels: "other" */
        slo_request(m, "a", tenant, 100, false, 1, 1, 1);
    }
    struct sl_str js;
    sl_str_init(&js);
    sl_metrics_slo_json(m, NULL, 100 * S_NS, &js);
    json_t *j = json_loads(js.p, 0, NULL);
    cr_assert_not_null(j);
    cr_assert_null(slo_json_window(j, "c", "t0", "1m"), "no room for a 257th series");
    cr_assert_eq(jint(slo_json_window(j, "c", "other", "1m"), "requests"), 1);
    cr_assert_eq(jint(slo_json_window(j, "a", "other", "1m"), "requests"), 10);
    cr_assert_eq(jint(slo_json_window(j, "b", "t127", "1m"), "requests"), 1);
    json_decref(j);
    /* The counters keep their own labels. */
    struct expo x;
    struct sl_str text;
    render(m, NULL, &x, &text);
    cr_assert_eq(value(&x, "sluice:slo_requests_total{tier=c,tenant=t0,objective=both,met=true}"),
                 1);
    expo_dispose(&x);
    sl_str_dispose(&text);
    sl_str_dispose(&js);
    sl_metrics_free(m);
}
