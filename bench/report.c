/* The report: figures per class and for all, the terminal table, --json and --csv.
 *
 * Definitions follow vLLM's `bench serve` so that figures compare: TTFT is first text chunk minus
 * send; E2EL end minus send; TPOT (E2EL − TTFT) / (output tokens − 1) for requests with more than
 * one output token; ITL every gap between text chunks; throughputs divide by the measured window
 * (start of measurement to the end of the last measured request); goodput counts completed
 * requests meeting every given objective (a TPOT of 0 for one-token outputs), per second. Only
 * completed requests enter latencies. Tokens are the server's usage figures. */
#include "bench_impl.h"

#include <jansson.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const metric_names[4] = {"ttft", "tpot", "itl", "e2el"};

static struct sl_bench_samples *metric(struct sl_bench_figures *f, int i)
{
    return i == 0 ? &f->ttft_ms : i == 1 ? &f->tpot_ms : i == 2 ? &f->itl_ms : &f->e2el_ms;
}

static bool any_slo(const double slo[3])
{
    return !isnan(slo[0]) || !isnan(slo[1]) || !isnan(slo[2]);
}

static bool class_has_slo(const struct sl_bench_config *c, size_t cls)
{
    if (cls != SIZE_MAX)
        return any_slo(c->classes[cls].slo_ms);
    for (size_t i = 0; i < c->n_classes; i++)
        if (any_slo(c->classes[i].slo_ms))
            return true;
    return false;
}

static int cmp_ev(const void *a, const void *b)
{
    const double *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]); /* a departure (-1) before an arrival at equal times */
}

void sl_bench_figures_compute(const struct sl_bench_config *c, struct sl_bench_results *r,
                              size_t cls, struct sl_bench_figures *f)
{
    memset(f, 0, sizeof *f);
    sl_bench_samples_init(&f->ttft_ms);
    sl_bench_samples_init(&f->tpot_ms);
    sl_bench_samples_init(&f->itl_ms);
    sl_bench_samples_init(&f->e2el_ms);
    double *ev = NULL;
    size_t n_ev = 0;
    for (size_t i = 0; i < r->n_recs; i++) {
        const struct sl_bench_record *q = &r->recs[i];
        if (cls != SIZE_MAX && q->cls != cls)
            continue;
        if (q->warmup) {
            f->warmup++;
            continue;
        }
        f->sent++;
        f->retries += q->attempts > 1 ? q->attempts - 1u : 0;
        if (q->outcome == SL_BENCH_REJECTED) {
            f->rejected++;
            f->rejected_no_retry_after += !q->retry_after;
            f->status_count[q->status > 0 && q->status < 600 ? q->status : 0]++;
            continue;
        }
        if (q->outcome == SL_BENCH_ERROR) {
            f->errors++;
            f->err_count[q->err]++;
            continue;
        }
        f->completed++;
        f->input_tokens += q->prompt_tokens;
        f->cached_tokens += q->cached_tokens;
        f->output_tokens += q->output_tokens;
        f->no_usage += !q->usage;
        double e2el = (q->t_end - q->t_sent) * 1000.0;
        double ttft = q->t_first > 0 ? (q->t_first - q->t_sent) * 1000.0 : e2el;
        double tpot = 0;
        sl_bench_samples_add(&f->ttft_ms, ttft);
        sl_bench_samples_add(&f->e2el_ms, e2el);
        if (q->output_tokens > 1) {
            tpot = (e2el - ttft) / (double)(q->output_tokens - 1);
            sl_bench_samples_add(&f->tpot_ms, tpot);
        }
        const double *slo = c->classes[q->cls].slo_ms;
        if (any_slo(slo) && !(ttft > slo[0]) && !(tpot > slo[1]) && !(e2el > slo[2]))
            f->good++;
        ev = sl_xrealloc(ev, (n_ev + 2) * 2 * sizeof *ev);
        ev[2 * n_ev] = q->t_sent;
        ev[2 * n_ev + 1] = 1;
        ev[2 * n_ev + 2] = q->t_end;
        ev[2 * n_ev + 3] = -1;
        n_ev += 2;
    }
    for (size_t k = 0; k < c->n_classes; k++)
        if (cls == SIZE_MAX || cls == k)
            sl_bench_samples_merge(&f->itl_ms, &r->itl_ms[k]);
    /* The peak number of requests in flight, over half-open intervals [sent, end). */
    if (n_ev)
        qsort(ev, n_ev, 2 * sizeof *ev, cmp_ev);
    int cur = 0;
    for (size_t i = 0; i < n_ev; i++) {
        cur += (int)ev[2 * i + 1];
        if (cur > (int)f->max_concurrent_requests)
            f->max_concurrent_requests = (uint32_t)cur;
    }
    free(ev);
    double d = r->t_meas_end - r->t_meas0;
    f->duration_s = d > 0 ? d : 0;
    if (f->duration_s > 0) {
        f->request_throughput = (double)f->completed / f->duration_s;
        f->output_throughput = (double)f->output_tokens / f->duration_s;
        f->total_token_throughput = (double)(f->input_tokens + f->output_tokens) / f->duration_s;
        f->request_goodput = (double)f->good / f->duration_s;
    }
    if (cls == SIZE_MAX)
        for (size_t s = 0; s < r->n_seconds; s++)
            if (r->chunks_per_s[s] > f->max_output_tokens_per_s)
                f->max_output_tokens_per_s = r->chunks_per_s[s];
}

void sl_bench_figures_dispose(struct sl_bench_figures *f)
{
    sl_bench_samples_dispose(&f->ttft_ms);
    sl_bench_samples_dispose(&f->tpot_ms);
    sl_bench_samples_dispose(&f->itl_ms);
    sl_bench_samples_dispose(&f->e2el_ms);
}

/* vLLM writes percentile 99 as "p99" and 99.9 as "p99.9". */
static void pct_word(char *out, size_t n, double p)
{
    if (p == floor(p))
        snprintf(out, n, "p%d", (int)p);
    else
        snprintf(out, n, "p%g", p);
}

static const char *endpoint_kind(const struct sl_bench_config *c)
{
    bool chat = false, comp = false;
    for (size_t i = 0; i < c->n_classes; i++)
        *(c->classes[i].chat ? &chat : &comp) = true;
    return chat && comp ? "mixed" : chat ? "openai-chat" : "openai";
}

/* ---------------------------------------------------------------------------------------------
 * The terminal table
 */

static void rejected_text(const struct sl_bench_figures *f, char *out, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int s = 0; s < 600 && len < n; s++)
        if (f->status_count[s])
            len += (size_t)snprintf(out + len, n - len, "%s%d:%llu", len ? " " : "", s,
                                    (unsigned long long)f->status_count[s]);
    for (int e = 1; e < SL_BENCH_ERR_COUNT && len < n; e++)
        if (f->err_count[e])
            len += (size_t)snprintf(out + len, n - len, "%s%s:%llu", len ? " " : "",
                                    sl_bench_err_name((enum sl_bench_err)e),
                                    (unsigned long long)f->err_count[e]);
    if (!out[0])
        snprintf(out, n, "-");
}

static void counts_row(FILE *o, const char *name, const struct sl_bench_figures *f, bool goodput)
{
    char rej[256];
    rejected_text(f, rej, sizeof rej);
    fprintf(o, "%-16s %7llu %7llu %7llu %7llu %8.2f %10.1f ", name, (unsigned long long)f->sent,
            (unsigned long long)f->completed, (unsigned long long)f->rejected,
            (unsigned long long)f->errors, f->request_throughput, f->output_throughput);
    if (goodput)
        fprintf(o, "%9.2f ", f->request_goodput);
    else
        fprintf(o, "%9s ", "-");
    fprintf(o, "%9llu %9llu  %s\n", (unsigned long long)f->input_tokens,
            (unsigned long long)f->output_tokens, rej);
}

static void latency_rows(FILE *o, const struct sl_bench_config *c, const char *name,
                         struct sl_bench_figures *f)
{
    static const char *const upper[4] = {"TTFT", "TPOT", "ITL", "E2EL"};
    for (int m = 0; m < 4; m++) {
        struct sl_bench_samples *s = metric(f, m);
        struct sl_bench_summary sm = sl_bench_samples_summarize(s);
        fprintf(o, "%-16s %-4s %8zu %9.2f", m == 0 ? name : "", upper[m], sm.n, sm.mean);
        for (size_t p = 0; p < c->n_percentiles; p++)
            fprintf(o, " %9.2f", sl_bench_samples_percentile(s, c->percentiles[p]));
        fprintf(o, " %9.2f\n", sm.max);
    }
}

void sl_bench_report_text(const struct sl_bench_config *c, struct sl_bench_results *r, FILE *o)
{
    size_t nf = c->n_classes + 1;
    struct sl_bench_figures *f = sl_xcalloc(nf, sizeof *f);
    for (size_t i = 0; i < c->n_classes; i++)
        sl_bench_figures_compute(c, r, i, &f[i]);
    sl_bench_figures_compute(c, r, SIZE_MAX, &f[c->n_classes]);
    struct sl_bench_figures *all = &f[c->n_classes];

    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&now));
    fprintf(o, "\nsluice-bench %s  %s  model %s  %s\n", SL_VERSION, c->url,
            r->model_id ? r->model_id
            : c->model  ? c->model
                        : "(none sent)",
            when);
    if (c->trace_path)
        fprintf(o, "load: trace %s (%zu requests, speed %gx)", c->trace_path, c->n_trace,
                c->trace_speed);
    else if (c->concurrency)
        fprintf(o, "load: closed loop, concurrency %d", c->concurrency);
    else
        fprintf(o, "load: open loop");
    if (c->max_concurrency)
        fprintf(o, ", at most %d in flight", c->max_concurrency);
    fprintf(o, "; measured %.2f s", all->duration_s);
    if (all->warmup)
        fprintf(o, " after %llu warm-up requests", (unsigned long long)all->warmup);
    fprintf(o, "; seed %llu%s\n", (unsigned long long)c->seed,
            r->interrupted ? "; INTERRUPTED" : "");
    if (!c->concurrency && !c->trace_path) {
        for (size_t i = 0; i < c->n_classes; i++) {
            const struct sl_bench_class *k = &c->classes[i];
            static const char *const shapes[] = {"poisson", "constant", "gamma", "onoff"};
            fprintf(o, "  %-14s %s", k->name, k->chat ? "chat" : "completions");
            if (isinf(k->rate))
                fprintf(o, ", all at once");
            else
                fprintf(o, ", %g req/s %s", k->rate, shapes[k->arrival.kind]);
            if (k->shared_prefix)
                fprintf(o, ", a %s %ld-token prefix", c->unique_prefix ? "unique" : "shared",
                        k->shared_prefix);
            fprintf(o, ", prompt %s, output %s%s%s%s\n", k->prompt.text, k->output.text,
                    k->tier ? ", tier " : "", k->tier ? k->tier : "",
                    k->ignore_eos ? ", ignore_eos" : "");
        }
    }

    bool goodput = class_has_slo(c, SIZE_MAX);
    fprintf(o, "\n%-16s %7s %7s %7s %7s %8s %10s %9s %9s %9s  %s\n", "class", "sent", "ok",
            "reject", "errors", "req/s", "out tok/s", "goodput/s", "in tok", "out tok",
            "rejected/errors by kind");
    for (size_t i = 0; i < c->n_classes; i++)
        counts_row(o, c->classes[i].name, &f[i], class_has_slo(c, i));
    if (c->n_classes > 1)
        counts_row(o, "all", all, goodput);
    if (all->cached_tokens)
        fprintf(o, "cached prompt tokens (usage.prompt_tokens_details): %llu of %llu, %.1f %%\n",
                (unsigned long long)all->cached_tokens, (unsigned long long)all->input_tokens,
                100.0 * (double)all->cached_tokens / (double)all->input_tokens);

    fprintf(o, "\n%-16s %-4s %8s %9s", "latency (ms)", "", "n", "mean");
    for (size_t p = 0; p < c->n_percentiles; p++) {
        char w[16];
        pct_word(w, sizeof w, c->percentiles[p]);
        fprintf(o, " %9s", w);
    }
    fprintf(o, " %9s\n", "max");
    for (size_t i = 0; i < c->n_classes; i++)
        latency_rows(o, c, c->classes[i].name, &f[i]);
    if (c->n_classes > 1)
        latency_rows(o, c, "all", all);

    struct sl_bench_summary lag = sl_bench_samples_summarize(&r->lag_ms);
    double cpu = r->cpu_user_s + r->cpu_sys_s;
    fprintf(o,
            "\ngenerator: send lag p50 %.3f ms, p99 %.3f ms, max %.3f ms; CPU %.2f s over %.2f s "
            "(%.1f %% of a core, %.1f us/request); connections %llu opened, %llu reused",
            sl_bench_samples_percentile(&r->lag_ms, 50),
            sl_bench_samples_percentile(&r->lag_ms, 99), lag.max, cpu, r->wall_s,
            r->wall_s > 0 ? 100.0 * cpu / r->wall_s : 0,
            r->n_recs ? cpu * 1e6 / (double)r->n_recs : 0, (unsigned long long)r->conns_opened,
            (unsigned long long)r->conns_reused);
    if (r->conns_failed)
        fprintf(o, ", %llu failed", (unsigned long long)r->conns_failed);
    fprintf(o, "; peak %u in flight", r->peak_in_flight);
    if (r->retries)
        fprintf(o, "; %llu retries", (unsigned long long)r->retries);
    fprintf(o, "\n");
    if (r->queue_ms.n)
        fprintf(o, "client queue (--max-concurrency): p50 %.1f ms, p99 %.1f ms\n",
                sl_bench_samples_percentile(&r->queue_ms, 50),
                sl_bench_samples_percentile(&r->queue_ms, 99));
    for (int k = 0; k < 2; k++)
        if (r->calib[k].measured) {
            fprintf(o, "prompt calibration (%s): tokens = %.3f x words %+.1f",
                    k ? "chat" : "completions", r->calib[k].slope, r->calib[k].intercept);
            if (r->calib[k].prefix_slope > 0)
                fprintf(o, "; shared prefix %.3f tokens a word", r->calib[k].prefix_slope);
            fprintf(o, "\n");
        }
    if (all->no_usage)
        fprintf(o,
                "note: %llu completed requests carried no usage; their output is counted in "
                "chunks and their prompt as 0\n",
                (unsigned long long)all->no_usage);
    for (size_t i = 0; i < r->n_first_error; i++)
        fprintf(o, "%s %s\n", i ? "      " : "first errors:", r->first_error[i]);
    for (size_t i = 0; i < nf; i++)
        sl_bench_figures_dispose(&f[i]);
    free(f);
}

/* ---------------------------------------------------------------------------------------------
 * --json
 */

static json_t *real_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static void put_block(json_t *o, const struct sl_bench_config *c, struct sl_bench_figures *f,
                      bool goodput)
{
    json_object_set_new(o, "duration", json_real(f->duration_s));
    json_object_set_new(o, "completed", json_integer((json_int_t)f->completed));
    json_object_set_new(o, "failed", json_integer((json_int_t)(f->rejected + f->errors)));
    json_object_set_new(o, "sent", json_integer((json_int_t)f->sent));
    json_object_set_new(o, "rejected_total", json_integer((json_int_t)f->rejected));
    json_object_set_new(o, "rejected_without_retry_after",
                        json_integer((json_int_t)f->rejected_no_retry_after));
    json_object_set_new(o, "errors_total", json_integer((json_int_t)f->errors));
    json_t *rej = json_object(), *errs = json_object();
    for (int s = 0; s < 600; s++)
        if (f->status_count[s]) {
            char k[8];
            snprintf(k, sizeof k, "%d", s);
            json_object_set_new(rej, k, json_integer((json_int_t)f->status_count[s]));
        }
    for (int e = 1; e < SL_BENCH_ERR_COUNT; e++)
        if (f->err_count[e])
            json_object_set_new(errs, sl_bench_err_name((enum sl_bench_err)e),
                                json_integer((json_int_t)f->err_count[e]));
    json_object_set_new(o, "rejected", rej);
    json_object_set_new(o, "errors", errs);
    json_object_set_new(o, "retries", json_integer((json_int_t)f->retries));
    json_object_set_new(o, "warmup_requests", json_integer((json_int_t)f->warmup));
    json_object_set_new(o, "total_input_tokens", json_integer((json_int_t)f->input_tokens));
    json_object_set_new(o, "total_cached_input_tokens", json_integer((json_int_t)f->cached_tokens));
    json_object_set_new(o, "total_output_tokens", json_integer((json_int_t)f->output_tokens));
    json_object_set_new(o, "request_throughput", json_real(f->request_throughput));
    json_object_set_new(o, "request_goodput",
                        goodput ? json_real(f->request_goodput) : json_null());
    json_object_set_new(o, "output_throughput", json_real(f->output_throughput));
    json_object_set_new(o, "total_token_throughput", json_real(f->total_token_throughput));
    for (int m = 0; m < 4; m++) {
        struct sl_bench_samples *s = metric(f, m);
        struct sl_bench_summary sm = sl_bench_samples_summarize(s);
        char k[48];
        snprintf(k, sizeof k, "mean_%s_ms", metric_names[m]);
        json_object_set_new(o, k, json_real(sm.mean));
        snprintf(k, sizeof k, "median_%s_ms", metric_names[m]);
        json_object_set_new(o, k, json_real(sm.median));
        snprintf(k, sizeof k, "std_%s_ms", metric_names[m]);
        json_object_set_new(o, k, json_real(sm.std));
        for (size_t p = 0; p < c->n_percentiles; p++) {
            char w[16];
            pct_word(w, sizeof w, c->percentiles[p]);
            snprintf(k, sizeof k, "%s_%s_ms", w, metric_names[m]);
            json_object_set_new(o, k, json_real(sl_bench_samples_percentile(s, c->percentiles[p])));
        }
        snprintf(k, sizeof k, "max_%s_ms", metric_names[m]);
        json_object_set_new(o, k, json_real(sm.max));
    }
    json_object_set_new(o, "max_concurrent_requests",
                        json_integer((json_int_t)f->max_concurrent_requests));
}

static json_t *slo_json(const double slo[3])
{
    json_t *g = json_object();
    for (int i = 0; i < 3; i++)
        if (!isnan(slo[i]))
            json_object_set_new(g, metric_names[i == 2 ? 3 : i], json_real(slo[i]));
    return g;
}

int sl_bench_report_json(const struct sl_bench_config *c, struct sl_bench_results *r,
                         const char *path)
{
    json_t *o = json_object();
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", localtime(&now));
    json_object_set_new(o, "date", json_string(date));
    json_object_set_new(o, "backend", json_string(endpoint_kind(c)));
    json_object_set_new(o, "endpoint_type", json_string(endpoint_kind(c)));
    json_object_set_new(o, "label", c->label ? json_string(c->label) : json_null());
    const char *model = r->model_id ? r->model_id : c->model;
    json_object_set_new(o, "model_id", model ? json_string(model) : json_null());
    json_object_set_new(o, "tokenizer_id", json_null());
    json_object_set_new(o, "base_url", json_string(c->url));
    json_object_set_new(o, "endpoint", json_string(c->endpoint));
    json_object_set_new(o, "mode",
                        json_string(c->trace_path    ? "trace"
                                    : c->concurrency ? "closed"
                                                     : "open"));
    struct sl_bench_figures all;
    sl_bench_figures_compute(c, r, SIZE_MAX, &all);
    json_object_set_new(o, "num_prompts", json_integer((json_int_t)all.sent));
    if (c->concurrency || c->trace_path)
        json_object_set_new(o, "request_rate", c->concurrency ? json_string("inf") : json_null());
    else if (isinf(c->request_rate))
        json_object_set_new(o, "request_rate", json_string("inf"));
    else
        json_object_set_new(o, "request_rate", json_real(c->request_rate));
    json_object_set_new(
        o, "burstiness",
        json_real(c->arrival.kind == SL_BENCH_ARRIVAL_GAMMA ? c->arrival.burstiness : 1.0));
    int maxc = c->concurrency ? c->concurrency : c->max_concurrency;
    json_object_set_new(o, "max_concurrency", maxc ? json_integer(maxc) : json_null());
    json_object_set_new(o, "seed", json_integer((json_int_t)c->seed));
    json_object_set_new(o, "goodput", slo_json(c->slo_ms));
    json_object_set_new(o, "interrupted", json_boolean(r->interrupted));
    put_block(o, c, &all, class_has_slo(c, SIZE_MAX));
    json_object_set_new(o, "max_output_tokens_per_s", json_real(all.max_output_tokens_per_s));
    sl_bench_figures_dispose(&all);

    json_t *classes = json_object();
    for (size_t i = 0; i < c->n_classes; i++) {
        const struct sl_bench_class *k = &c->classes[i];
        json_t *b = json_object();
        json_object_set_new(b, "endpoint", json_string(k->path));
        json_object_set_new(b, "backend", json_string(k->chat ? "openai-chat" : "openai"));
        json_object_set_new(b, "tier", k->tier ? json_string(k->tier) : json_null());
        json_object_set_new(b, "service_tier",
                            k->service_tier ? json_string(k->service_tier) : json_null());
        json_object_set_new(b, "tenant", k->tenant ? json_string(k->tenant) : json_null());
        json_object_set_new(b, "request_rate",
                            c->concurrency || c->trace_path ? json_null()
                            : isinf(k->rate)                ? json_string("inf")
                                                            : real_or_null(k->rate));
        json_object_set_new(b, "weight", json_real(k->weight));
        json_object_set_new(b, "prompt", json_string(k->prompt.text));
        json_object_set_new(b, "shared_prefix_tokens", json_integer(k->shared_prefix));
        json_object_set_new(b, "unique_prefix", json_boolean(c->unique_prefix));
        json_object_set_new(b, "output", json_string(k->output.text));
        json_object_set_new(b, "ignore_eos", json_boolean(k->ignore_eos));
        json_object_set_new(b, "goodput", slo_json(k->slo_ms));
        struct sl_bench_figures f;
        sl_bench_figures_compute(c, r, i, &f);
        put_block(b, c, &f, class_has_slo(c, i));
        sl_bench_figures_dispose(&f);
        json_object_set_new(classes, k->name, b);
    }
    json_object_set_new(o, "classes", classes);

    json_t *g = json_object();
    struct sl_bench_summary lag = sl_bench_samples_summarize(&r->lag_ms);
    double cpu = r->cpu_user_s + r->cpu_sys_s;
    json_object_set_new(g, "send_lag_mean_ms", json_real(lag.mean));
    json_object_set_new(g, "send_lag_p50_ms",
                        json_real(sl_bench_samples_percentile(&r->lag_ms, 50)));
    json_object_set_new(g, "send_lag_p99_ms",
                        json_real(sl_bench_samples_percentile(&r->lag_ms, 99)));
    json_object_set_new(g, "send_lag_max_ms", json_real(lag.max));
    json_object_set_new(g, "client_queue_p50_ms",
                        json_real(sl_bench_samples_percentile(&r->queue_ms, 50)));
    json_object_set_new(g, "client_queue_p99_ms",
                        json_real(sl_bench_samples_percentile(&r->queue_ms, 99)));
    json_object_set_new(g, "cpu_user_s", json_real(r->cpu_user_s));
    json_object_set_new(g, "cpu_sys_s", json_real(r->cpu_sys_s));
    json_object_set_new(g, "wall_s", json_real(r->wall_s));
    json_object_set_new(g, "cpu_fraction", json_real(r->wall_s > 0 ? cpu / r->wall_s : 0));
    json_object_set_new(g, "cpu_us_per_request",
                        json_real(r->n_recs ? cpu * 1e6 / (double)r->n_recs : 0));
    json_object_set_new(g, "requests_sent", json_integer((json_int_t)r->n_recs));
    json_object_set_new(g, "connections_opened", json_integer((json_int_t)r->conns_opened));
    json_object_set_new(g, "connections_reused", json_integer((json_int_t)r->conns_reused));
    json_object_set_new(g, "connections_failed", json_integer((json_int_t)r->conns_failed));
    json_object_set_new(g, "peak_in_flight", json_integer(r->peak_in_flight));
    json_object_set_new(g, "retries", json_integer((json_int_t)r->retries));
    for (int k = 0; k < 2; k++) {
        json_t *cb = json_object();
        json_object_set_new(cb, "measured", json_boolean(r->calib[k].measured));
        json_object_set_new(cb, "tokens_per_word", json_real(r->calib[k].slope));
        json_object_set_new(cb, "intercept", json_real(r->calib[k].intercept));
        json_object_set_new(cb, "prefix_tokens_per_word",
                            r->calib[k].prefix_slope > 0 ? json_real(r->calib[k].prefix_slope)
                                                         : json_null());
        json_object_set_new(g, k ? "prompt_calibration_chat" : "prompt_calibration_completions",
                            cb);
    }
    json_object_set_new(o, "generator", g);
    json_t *errs = json_array();
    for (size_t i = 0; i < r->n_first_error; i++)
        json_array_append_new(errs, json_string(r->first_error[i]));
    json_object_set_new(o, "first_errors", errs);

    int rc = json_dump_file(o, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(o);
    if (rc != 0) {
        fprintf(stderr, "sluice-bench: --json %s: cannot write the file\n", path);
        return SL_EIO;
    }
    return SL_OK;
}

/* ---------------------------------------------------------------------------------------------
 * --csv
 */

int sl_bench_report_csv(const struct sl_bench_config *c, const struct sl_bench_results *r,
                        const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "sluice-bench: --csv %s: cannot write the file\n", path);
        return SL_EIO;
    }
    fprintf(f, "class,id,warmup,outcome,status,error,attempts,scheduled_s,ready_s,sent_s,"
               "first_token_s,end_s,ttft_ms,e2el_ms,tpot_ms,itl_mean_ms,prompt_target,"
               "output_target,prompt_tokens,output_tokens,chunks,usage,reused,cached_tokens\n");
    static const char *const outcomes[] = {"ok", "rejected", "error"};
    for (size_t i = 0; i < r->n_recs; i++) {
        const struct sl_bench_record *q = &r->recs[i];
        bool ok = q->outcome == SL_BENCH_OK;
        double e2el = (q->t_end - q->t_sent) * 1000.0;
        double ttft = q->t_first > 0 ? (q->t_first - q->t_sent) * 1000.0 : ok ? e2el : 0;
        fprintf(f, "%s,%u,%d,%s,%d,%s,%u,%.6f,%.6f,%.6f,%.6f,%.6f,", c->classes[q->cls].name, q->id,
                q->warmup, outcomes[q->outcome], q->status, q->err ? sl_bench_err_name(q->err) : "",
                q->attempts, q->t_sched, q->t_ready, q->t_sent, q->t_first, q->t_end);
        if (ok)
            fprintf(f, "%.3f,%.3f,", ttft, e2el);
        else
            fprintf(f, ",,");
        if (ok && q->output_tokens > 1)
            fprintf(f, "%.3f,", (e2el - ttft) / (q->output_tokens - 1));
        else
            fprintf(f, ",");
        if (ok && q->chunks > 1)
            fprintf(f, "%.3f,", q->itl_sum * 1000.0 / (q->chunks - 1));
        else
            fprintf(f, ",");
        fprintf(f, "%u,%u,%u,%u,%u,%d,%d,%u\n", q->prompt_target, q->output_target,
                q->prompt_tokens, q->output_tokens, q->chunks, q->usage, q->reused,
                q->cached_tokens);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "sluice-bench: --csv %s: cannot write the file\n", path);
        return SL_EIO;
    }
    return SL_OK;
}

/* ---------------------------------------------------------------------------------------------
 * --summary
 */

static void summary_line(FILE *f, const struct sl_bench_config *c, const char *name,
                         struct sl_bench_figures *x, bool goodput)
{
    fprintf(f, "%s\t%s\t%llu\t%llu\t%llu\t%llu\t%.2f\t%.1f\t", c->label ? c->label : "-", name,
            (unsigned long long)x->sent, (unsigned long long)x->completed,
            (unsigned long long)x->rejected, (unsigned long long)x->errors, x->request_throughput,
            x->output_throughput);
    if (goodput)
        fprintf(f, "%.2f", x->request_goodput);
    else
        fprintf(f, "-");
    fprintf(
        f, "\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%llu\t%llu\t%llu\n",
        sl_bench_samples_percentile(&x->ttft_ms, 50), sl_bench_samples_percentile(&x->ttft_ms, 99),
        sl_bench_samples_percentile(&x->tpot_ms, 50), sl_bench_samples_percentile(&x->tpot_ms, 99),
        sl_bench_samples_percentile(&x->itl_ms, 99), sl_bench_samples_percentile(&x->e2el_ms, 50),
        sl_bench_samples_percentile(&x->e2el_ms, 99),
        (unsigned long long)x->rejected_no_retry_after, (unsigned long long)x->input_tokens,
        (unsigned long long)x->cached_tokens);
}

int sl_bench_report_summary(const struct sl_bench_config *c, struct sl_bench_results *r,
                            const char *path)
{
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "sluice-bench: --summary %s: cannot write the file\n", path);
        return SL_EIO;
    }
    if (ftell(f) == 0)
        fprintf(f, "label\tclass\tsent\tok\trejected\terrors\treq/s\tout_tok/s\tgoodput/s\t"
                   "ttft_p50\tttft_p99\ttpot_p50\ttpot_p99\titl_p99\te2el_p50\te2el_p99\t"
                   "rej_no_retry\tin_tok\tcached_tok\n");
    for (size_t i = 0; i <= c->n_classes; i++) {
        if (i == c->n_classes && c->n_classes == 1)
            break;
        size_t cls = i < c->n_classes ? i : SIZE_MAX;
        struct sl_bench_figures x;
        sl_bench_figures_compute(c, r, cls, &x);
        summary_line(f, c, i < c->n_classes ? c->classes[i].name : "all", &x,
                     class_has_slo(c, cls));
        sl_bench_figures_dispose(&x);
    }
    return fclose(f) == 0 ? SL_OK : SL_EIO;
}
