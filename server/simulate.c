/* `sluice simulate`: replays a trace of requests against a configuration's tiers and limits with
 * the scheduler's own core under a virtual clock (sl_sim_run), and reports what each tier would
 * get. Operators use it to try a tier configuration on yesterday's traffic before applying it.
 *
 * Reading the trace is the only part here: JSON lines, one request each, every bad line an error
 * naming its line, so a trace that is half wrong is never half simulated.
 */
#include <sluice/admission.h>
#include <sluice/config.h>
#include <sluice/sched.h>
#include <sluice/server.h>

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_MAX_REQUESTS 1000000
#define TRACE_MAX_LINE 65536
#define SIM_DEFAULT_CTX 8192
#define SIM_MAX_CTX 1048576

static const char usage[] =
    "usage: sluice simulate --trace TRACE.jsonl [--config FILE] [--json] [--context N]\n"
    "                       [--static-batching]\n"
    "\n"
    "Replays TRACE through the scheduler under a virtual clock, with the tiers, max_seqs,\n"
    "max_batch_tokens, block_size and kv_cache_mib of FILE (the defaults without it), on the\n"
    "stories15M CPU cost model (bench/README.md), and prints per tier: TTFT, TPOT and end-to-end\n"
    "p50/p90/p99, SLO attainment (TTFT and TPOT within the tier's objectives) and throughput.\n"
    "\n"
    "TRACE: one JSON object per line (blank lines are skipped, other keys ignored):\n"
    "  {\"arrival\": 0.25, \"tier\": \"batch\", \"tenant\": \"acme\", \"prompt_tokens\": 512,\n"
    "   \"output_tokens\": 128}\n"
    "  arrival: seconds from the trace's start; tier: a tier of the configuration (optional when\n"
    "  tenant names a configured tenant: its default tier); tenant: optional; when the\n"
    "  configuration has tenants it must be one of them and may use the tier. Every request\n"
    "  generates exactly output_tokens tokens. \"prefix\": \"NAME\", \"prefix_tokens\": N "
    "(optional):\n"
    "  the requests of the same NAME start with the same N prompt tokens (a system prompt),\n"
    "  which the prefix cache shares when the configuration has it on (prefix_cache.enabled,\n"
    "  the default; the simulation's requests all share one cache key).\n"
    "--context N: the model's context length in tokens (default 8192); longer requests are\n"
    "  refused, as the server refuses them.\n"
    "--static-batching: the baseline, a batch of up to max_seqs requests starts only when the\n"
    "  previous one has finished entirely.\n"
    "--json: {\"tiers\": {NAME: {\"p50_ttft_ms\", \"p99_ttft_ms\", \"p99_tpot_ms\", "
    "\"p99_e2e_ms\",\n"
    "  \"slo_attainment\", \"throughput_rps\", ...}}, ...} instead of a table.\n";

struct trace {
    struct sl_sim_request *r;
    int n, cap;
    /* The tenants the trace names (r[i].tenant_name points into these), in order of first
     * appearance. */
    char **names;
    int n_names;
    char **prefixes; /* the shared prefixes' names: r[i].prefix_group is an index + 1 */
    int n_prefixes;
};

/* The index of name in (*names)[n], added when new. */
static int intern_in(char ***names, int *n, const char *name)
{
    for (int i = 0; i < *n; i++)
        if (strcmp((*names)[i], name) == 0)
            return i;
    *names = sl_xrealloc(*names, sizeof **names * (size_t)(*n + 1));
    (*names)[*n] = sl_xstrdup(name);
    return (*n)++;
}

/* name, interned in tr's tenants. */
static const char *intern(struct trace *tr, const char *name)
{
    int i = intern_in(&tr->names, &tr->n_names, name); /* before reading tr->names: it moves */
    return tr->names[i];
}

static void trace_free(struct trace *tr)
{
    for (int i = 0; i < tr->n_names; i++)
        free(tr->names[i]);
    free(tr->names);
    for (int i = 0; i < tr->n_prefixes; i++)
        free(tr->prefixes[i]);
    free(tr->prefixes);
    free(tr->r);
}

static int tenant_find(const struct sl_tenancy *ten, const char *name)
{
    for (int i = 0; i < ten->n_tenants; i++)
        if (strcmp(ten->tenants[i].name, name) == 0)
            return i;
    return -1;
}

/* Parses one trace line into *out. Returns 0, or -1 with err set. */
static int parse_line(const struct sl_tenancy *ten, struct trace *tr, const char *line, size_t len,
                      struct sl_sim_request *out, char *err, size_t errlen)
{
    json_error_t je;
    json_t *j = json_loadb(line, len, 0, &je);
    if (!j) {
        snprintf(err, errlen, "not JSON: %s (column %d)", je.text, je.column);
        return -1;
    }
    int rc = -1;
    if (!json_is_object(j)) {
        snprintf(err, errlen, "must be a JSON object");
        goto out;
    }
    *out = (struct sl_sim_request){0};
    json_t *v = json_object_get(j, "arrival");
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0) {
        snprintf(err, errlen, "\"arrival\": must be a number of seconds, 0 or more");
        goto out;
    }
    out->arrival_s = json_number_value(v);
    static const char *const counts[2] = {"prompt_tokens", "output_tokens"};
    json_int_t n[2];
    for (int k = 0; k < 2; k++) {
        v = json_object_get(j, counts[k]);
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > SIM_MAX_CTX) {
            snprintf(err, errlen, "\"%s\": must be an integer from 1 to %d", counts[k],
                     SIM_MAX_CTX);
            goto out;
        }
        n[k] = json_integer_value(v);
    }
    /* Longer than the context: refused by the scheduler and counted as refused, as the server
     * would answer it 400. */
    out->prompt_tokens = (int)n[0];
    out->output_tokens = (int)n[1];
    int tenant = -1;
    v = json_object_get(j, "tenant");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v)) {
            snprintf(err, errlen, "\"tenant\": must be a string");
            goto out;
        }
        if (ten->n_tenants > 0) {
            tenant = tenant_find(ten, json_string_value(v));
            if (tenant < 0) {
                snprintf(err, errlen, "\"tenant\": no tenant \"%.64s\" in the configuration",
                         json_string_value(v));
                goto out;
            }
        }
    }
    out->tenant = tenant;
    const struct sl_tenant *t = tenant >= 0 ? &ten->tenants[tenant] : &sl_tenant_anonymous;
    /* Without tenants in the configuration the trace's names still tell tenants apart for
     * fairness, each with a share of 1. */
    out->tenant_name = intern(tr, tenant >= 0              ? t->name
                                  : v && json_is_string(v) ? json_string_value(v)
                                                           : t->name);
    out->share = t->share;
    v = json_object_get(j, "prefix");
    json_t *pt = json_object_get(j, "prefix_tokens");
    if ((v && !json_is_null(v)) || pt) {
        if (!json_is_string(v) || json_string_length(v) == 0) {
            snprintf(err, errlen, "\"prefix\": must be a name (with prefix_tokens)");
            goto out;
        }
        if (!json_is_integer(pt) || json_integer_value(pt) < 1 ||
            json_integer_value(pt) > out->prompt_tokens) {
            snprintf(err, errlen, "\"prefix_tokens\": must be an integer from 1 to prompt_tokens");
            goto out;
        }
        out->prefix_group = 1 + intern_in(&tr->prefixes, &tr->n_prefixes, json_string_value(v));
        out->prefix_tokens = (int)json_integer_value(pt);
    }
    v = json_object_get(j, "tier");
    if (!v || json_is_null(v)) {
        out->tier = t->default_tier;
    } else if (!json_is_string(v)) {
        snprintf(err, errlen, "\"tier\": must be a string");
        goto out;
    } else {
        const char *name = json_string_value(v);
        out->tier = sl_tier_find(ten, name, strlen(name));
        if (out->tier < 0) {
            snprintf(err, errlen, "\"tier\": no tier \"%.64s\" in the configuration", name);
            goto out;
        }
        if (!(t->tiers >> out->tier & 1u)) {
            snprintf(err, errlen, "\"tier\": tenant \"%s\" may not use tier \"%s\"", t->name, name);
            goto out;
        }
    }
    rc = 0;
out:
    json_decref(j);
    return rc;
}

static int read_trace(const struct sl_tenancy *ten, const char *path, struct trace *tr, FILE *errf)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(errf, "sluice simulate: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = 0;
        while (k < (size_t)len &&
               (line[k] == ' ' || line[k] == '\t' || line[k] == '\r' || line[k] == '\n'))
            k++;
        if (k == (size_t)len)
            continue;
        char err[256];
        if (len > TRACE_MAX_LINE) {
            snprintf(err, sizeof err, "longer than %d bytes", TRACE_MAX_LINE);
            rc = -1;
        } else if (tr->n == TRACE_MAX_REQUESTS) {
            snprintf(err, sizeof err, "more than %d requests", TRACE_MAX_REQUESTS);
            rc = -1;
        } else {
            if (tr->n == tr->cap) {
                tr->cap = tr->cap ? 2 * tr->cap : 1024;
                tr->r = sl_xrealloc(tr->r, sizeof *tr->r * (size_t)tr->cap);
            }
            rc = parse_line(ten, tr, line, (size_t)len, &tr->r[tr->n], err, sizeof err);
        }
        if (rc != 0) {
            fprintf(errf, "sluice simulate: %s:%ld: %s\n", path, lineno, err);
            break;
        }
        tr->n++;
    }
    if (rc == 0 && ferror(f)) {
        fprintf(errf, "sluice simulate: %s: read error\n", path);
        rc = -1;
    }
    free(line);
    fclose(f);
    return rc;
}

/* The KV pool main.c would give this configuration on the cost model's model: max_seqs full
 * contexts, capped by kv_cache_mib. */
static int pool_blocks(const struct sl_config_engine *ec, const struct sl_sim_cost *cost,
                       int max_ctx)
{
    long per_seq = (max_ctx + ec->block_size - 1) / ec->block_size;
    long want = per_seq * ec->max_seqs;
    /* The cost model's bytes are fp32 K and V. */
    size_t block_bytes =
        cost->kv_bytes_per_token * (size_t)ec->block_size / (ec->kv_dtype == SL_KV_F16 ? 2 : 1);
    long cap = (long)(((size_t)ec->kv_cache_mib << 20) / block_bytes);
    long n = want < cap ? want : cap;
    return n < 1 ? 1 : n > 1 << 30 ? 1 << 30 : (int)n;
}

/* What each tenant of the trace got: its requests, the service its tier's fairness counts
 * (w_in per prompt token, w_out per generated token, of the tier each request ran in), and its
 * TTFT. */
struct tenant_report {
    int requests, completed;
    long prompt_tokens, output_tokens;
    double service;
    double ttft_ms[2]; /* p50, p99 over its requests that produced a token */
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of xs (n > 0, sorted here), nearest rank. */
static double quantile(double *xs, int n, double q)
{
    qsort(xs, (size_t)n, sizeof *xs, cmp_double);
    int k = (int)ceil(q * n) - 1;
    return xs[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static void tenants_report(const struct trace *tr, const struct sl_sim_result *res,
                           const struct sl_sched_tier *tiers, struct tenant_report *out)
{
    double *ttft = sl_xmalloc(sizeof *ttft * (size_t)(tr->n > 0 ? tr->n : 1));
    for (int k = 0; k < tr->n_names; k++) {
        struct tenant_report *o = &out[k];
        int n = 0;
        for (int i = 0; i < tr->n; i++) {
            const struct sl_sim_request *rq = &tr->r[i];
            if (rq->tenant_name != tr->names[k])
                continue;
            const struct sl_sched_tier *t = &tiers[rq->tier];
            o->requests++;
            o->completed += res[i].finish == SL_FINISH_LENGTH;
            if (res[i].finish != SL_FINISH_ERROR)
                o->prompt_tokens += rq->prompt_tokens;
            o->output_tokens += res[i].n_out;
            o->service += (res[i].finish != SL_FINISH_ERROR ? t->w_in * rq->prompt_tokens : 0) +
                          t->w_out * res[i].n_out;
            if (res[i].ttft_s >= 0)
                ttft[n++] = res[i].ttft_s * 1e3;
        }
        if (n > 0) {
            o->ttft_ms[0] = quantile(ttft, n, 0.5);
            o->ttft_ms[1] = quantile(ttft, n, 0.99);
        }
    }
    free(ttft);
}

/* What the report says about the simulated machine besides the configuration. */
struct sim_machine {
    int max_ctx, n_blocks;
    bool static_batching;
};

static json_t *num(double v)
{
    return json_real(isfinite(v) ? round(v * 1000) / 1000 : 0);
}

static void print_json(FILE *out, const struct sl_config *cfg, const struct sl_sim_report *rep,
                       int n_reqs, const struct sim_machine *lv, const struct trace *tr,
                       const struct tenant_report *tens)
{
    const struct sl_config_engine *ec = sl_config_engine(cfg);
    const struct sl_tier *ct = sl_config_tenancy(cfg)->tiers;
    json_t *root = json_object(), *tiers = json_object();
    for (int t = 0; t < rep->n_tiers; t++) {
        const struct sl_sim_tier_report *r = &rep->tiers[t];
        json_t *o = json_object();
        json_object_set_new(o, "requests", json_integer(r->requests));
        json_object_set_new(o, "completed", json_integer(r->completed));
        json_object_set_new(o, "refused", json_integer(r->refused));
        static const char *const p[3] = {"p50", "p90", "p99"};
        char key[32];
        for (int k = 0; k < 3; k++) {
            snprintf(key, sizeof key, "%s_ttft_ms", p[k]);
            json_object_set_new(o, key, num(r->ttft_ms[k]));
            snprintf(key, sizeof key, "%s_tpot_ms", p[k]);
            json_object_set_new(o, key, num(r->tpot_ms[k]));
            snprintf(key, sizeof key, "%s_e2e_ms", p[k]);
            json_object_set_new(o, key, num(r->e2e_ms[k]));
            snprintf(key, sizeof key, "%s_itl_ms", p[k]);
            json_object_set_new(o, key, num(r->itl_ms[k]));
        }
        json_object_set_new(o, "max_itl_ms", num(r->max_itl_ms));
        json_object_set_new(o, "slo_attainment", num(r->slo_attainment));
        json_object_set_new(o, "throughput_rps", num(r->throughput_rps));
        json_object_set_new(o, "output_tokens_per_s", num(r->output_tokens_per_s));
        json_object_set_new(o, "preemptions", json_integer(r->preemptions));
        json_object_set_new(o, "ttft_slo_ms", json_integer(ct[t].sched.ttft_slo_ms));
        json_object_set_new(o, "tpot_slo_ms", json_integer(ct[t].sched.tpot_slo_ms));
        json_object_set_new(tiers, ct[t].sched.name, o);
    }
    json_object_set_new(root, "tiers", tiers);
    json_t *tj = json_object();
    for (int k = 0; k < tr->n_names; k++) {
        const struct tenant_report *r = &tens[k];
        json_object_set_new(
            tj, tr->names[k],
            json_pack("{s:i,s:i,s:I,s:I,s:o,s:o,s:o}", "requests", r->requests, "completed",
                      r->completed, "prompt_tokens", (json_int_t)r->prompt_tokens, "output_tokens",
                      (json_int_t)r->output_tokens, "service", num(r->service), "p50_ttft_ms",
                      num(r->ttft_ms[0]), "p99_ttft_ms", num(r->ttft_ms[1])));
    }
    json_object_set_new(root, "tenants", tj);
    json_object_set_new(root, "requests", json_integer(n_reqs));
    json_object_set_new(root, "makespan_s", num(rep->makespan_s));
    json_object_set_new(root, "busy_s", num(rep->busy_s));
    json_object_set_new(root, "steps", json_integer(rep->steps));
    json_object_set_new(root, "output_tokens", json_integer(rep->output_tokens));
    json_object_set_new(root, "prompt_tokens", json_integer(rep->prompt_tokens));
    json_object_set_new(root, "cached_prompt_tokens", json_integer(rep->cached_tokens));
    json_object_set_new(root, "cost_model", json_string("stories15M-cpu"));
    json_object_set_new(root, "context", json_integer(lv->max_ctx));
    json_object_set_new(root, "kv_blocks", json_integer(lv->n_blocks));
    json_object_set_new(root, "max_seqs", json_integer(ec->max_seqs));
    json_object_set_new(root, "max_batch_tokens", json_integer(ec->max_batch_tokens));
    json_object_set_new(root, "static_batching", json_boolean(lv->static_batching));
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
    json_decref(root);
    if (!s) /* jansson failed to allocate */
        abort();
    fprintf(out, "%s\n", s);
    free(s);
}

static void print_table(FILE *out, const struct sl_config *cfg, const struct sl_sim_report *rep,
                        int n_reqs, const struct sim_machine *lv, const struct trace *tr,
                        const struct tenant_report *tens)
{
    const struct sl_config_engine *ec = sl_config_engine(cfg);
    const struct sl_tier *ct = sl_config_tenancy(cfg)->tiers;
    fprintf(out,
            "%d requests, makespan %.1f s (%ld steps, %.1f s busy); stories15M CPU cost model, "
            "context %d, max_seqs %d, max_batch_tokens %d, KV %d blocks of %d%s\n\n",
            n_reqs, rep->makespan_s, rep->steps, rep->busy_s, lv->max_ctx, ec->max_seqs,
            ec->max_batch_tokens, lv->n_blocks, ec->block_size,
            lv->static_batching ? ", static batching" : "");
    fprintf(out, "%-16s %7s %7s %7s  %-20s %-20s %-22s %6s %8s %8s %7s\n", "tier", "reqs", "done",
            "refused", "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms", "e2e p50/p90/p99 ms", "SLO",
            "req/s", "tok/s", "preempt");
    for (int t = 0; t < rep->n_tiers; t++) {
        const struct sl_sim_tier_report *r = &rep->tiers[t];
        char a[32], b[32], c[40];
        snprintf(a, sizeof a, "%.0f/%.0f/%.0f", r->ttft_ms[0], r->ttft_ms[1], r->ttft_ms[2]);
        snprintf(b, sizeof b, "%.1f/%.1f/%.1f", r->tpot_ms[0], r->tpot_ms[1], r->tpot_ms[2]);
        snprintf(c, sizeof c, "%.0f/%.0f/%.0f", r->e2e_ms[0], r->e2e_ms[1], r->e2e_ms[2]);
        fprintf(out, "%-16s %7d %7d %7d  %-20s %-20s %-22s %5.1f%% %8.2f %8.1f %7ld\n",
                ct[t].sched.name, r->requests, r->completed, r->refused, a, b, c,
                100 * r->slo_attainment, r->throughput_rps, r->output_tokens_per_s, r->preemptions);
    }
    fprintf(out, "\nSLO: TTFT within ttft_slo_ms and TPOT within tpot_slo_ms (");
    for (int t = 0; t < rep->n_tiers; t++)
        fprintf(out, "%s%s %d/%d ms", t ? ", " : "", ct[t].sched.name, ct[t].sched.ttft_slo_ms,
                ct[t].sched.tpot_slo_ms);
    fprintf(out, "); refused requests count as missed.\n");
    if (rep->cached_tokens > 0)
        fprintf(out, "Prefix cache: %ld of %ld prompt tokens cached (%.1f%%).\n",
                rep->cached_tokens, rep->prompt_tokens,
                100.0 * (double)rep->cached_tokens / (double)rep->prompt_tokens);
    if (tr->n_names < 2)
        return;
    fprintf(out, "\n%-24s %7s %7s %10s %10s %12s  %-14s\n", "tenant", "reqs", "done", "prompt tok",
            "output tok", "service", "TTFT p50/p99 ms");
    for (int k = 0; k < tr->n_names; k++) {
        const struct tenant_report *r = &tens[k];
        char a[32];
        snprintf(a, sizeof a, "%.0f/%.0f", r->ttft_ms[0], r->ttft_ms[1]);
        fprintf(out, "%-24.24s %7d %7d %10ld %10ld %12.0f  %-14s\n", tr->names[k], r->requests,
                r->completed, r->prompt_tokens, r->output_tokens, r->service, a);
    }
    fprintf(out, "\nservice: what fairness counts, vtc_weights.input per prompt token and .output "
                 "per generated token of the tier a request ran in.\n");
}

int sl_simulate_main(int argc, char **argv, FILE *out, FILE *errf)
{
    const char *config = NULL, *trace = NULL;
    bool json = false, static_batching = false;
    int max_ctx = SIM_DEFAULT_CTX;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, out);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--static-batching") == 0) {
            static_batching = true;
        } else if ((strcmp(a, "--config") == 0 || strcmp(a, "--trace") == 0 ||
                    strcmp(a, "--context") == 0) &&
                   i + 1 < argc) {
            const char *v = argv[++i];
            if (strcmp(a, "--config") == 0) {
                config = v;
            } else if (strcmp(a, "--trace") == 0) {
                trace = v;
            } else {
                char *end;
                long n = strtol(v, &end, 10);
                if (*v == '\0' || *end != '\0' || n < 16 || n > SIM_MAX_CTX) {
                    fprintf(errf, "sluice simulate: --context: an integer from 16 to %d\n",
                            SIM_MAX_CTX);
                    return 2;
                }
                max_ctx = (int)n;
            }
        } else {
            fprintf(errf, "sluice simulate: unknown or incomplete argument \"%s\"\n%s", a, usage);
            return 2;
        }
    }
    if (!trace) {
        fprintf(errf, "sluice simulate: --trace is required\n%s", usage);
        return 2;
    }
    char err[1024] = "";
    struct sl_config *cfg = sl_config_new();
    if ((config && sl_config_load_file(cfg, config, err, sizeof err) != SL_OK) ||
        sl_config_validate(cfg, err, sizeof err) != SL_OK) {
        fprintf(errf, "sluice simulate: %s\n", err);
        sl_config_unref(cfg);
        return 2;
    }
    struct trace tr = {0};
    if (read_trace(sl_config_tenancy(cfg), trace, &tr, errf) != 0) {
        trace_free(&tr);
        sl_config_unref(cfg);
        return 2;
    }
    const struct sl_config_engine *ec = sl_config_engine(cfg);
    struct sl_sched_tier tiers[SL_SCHED_MAX_TIERS];
    struct sl_sim_config sc = {
        .lim = {.max_ctx = max_ctx,
                .max_seqs = ec->max_seqs,
                .max_batch_tokens = ec->max_batch_tokens,
                .block_size = ec->block_size,
                .tiers = tiers,
                .n_tiers = sl_config_sched_tiers(cfg, tiers, SL_SCHED_MAX_TIERS)},
        .cost = sl_sim_cost_stories15m_cpu,
        .static_batching = static_batching,
        .prefix_cache = sl_config_api(cfg)->prefix_cache.enabled,
    };
    sc.lim.n_blocks = pool_blocks(ec, &sc.cost, max_ctx);
    struct sim_machine lv = {max_ctx, sc.lim.n_blocks, static_batching};
    struct sl_sim_report rep;
    struct sl_sim_result *res = sl_xcalloc((size_t)tr.n, sizeof *res);
    int st = sl_sim_run(&sc, tr.r, tr.n, res, &rep);
    int rc = 0;
    struct tenant_report *tens = sl_xcalloc((size_t)tr.n_names, sizeof *tens);
    if (st == SL_OK)
        tenants_report(&tr, res, tiers, tens);
    if (st != SL_OK) {
        fprintf(errf, "sluice simulate: the simulation failed: %s\n", sl_status_str(st));
        rc = 1;
    } else if (json) {
        print_json(out, cfg, &rep, tr.n, &lv, &tr, tens);
    } else {
        print_table(out, cfg, &rep, tr.n, &lv, &tr, tens);
    }
    free(tens);
    free(res);
    trace_free(&tr);
    sl_config_unref(cfg);
    return rc;
}
