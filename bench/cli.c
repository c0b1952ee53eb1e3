/* The command line. Flags follow vLLM's `bench serve` where they overlap (--url/--base-url,
 * --host/--port, --endpoint, --backend, --model, --request-rate, --burstiness,
 * --max-concurrency, --num-prompts, --num-warmups, --ignore-eos, --goodput, --seed,
 * --metric-percentiles, --extra-body, --input-len/--output-len); --concurrency is a closed loop. */
#include "bench_impl.h"

#include <jansson.h>

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void sl_bench_cli_usage(FILE *f)
{
    fputs(
        "usage: sluice-bench [options]\n"
        "Load generator for OpenAI-compatible servers: open-loop arrivals, closed-loop users or a\n"
        "replayed trace; streaming TTFT, TPOT, ITL and end-to-end latency per request class.\n"
        "\n"
        "target\n"
        "  --url URL              server base URL (default http://127.0.0.1:8080); alias "
        "--base-url\n"
        "  --host H, --port P     the same, in parts\n"
        "  --endpoint PATH        default path of every class (/v1/completions)\n"
        "  --backend B            openai (completions) or openai-chat (/v1/chat/completions)\n"
        "  --model NAME           model field (default: the first of GET /v1/models)\n"
        "  --api-key KEY          Authorization: Bearer KEY (default $OPENAI_API_KEY)\n"
        "load (one of them, or a trace)\n"
        "  --request-rate R       open loop: requests/s over all classes (default inf: all at "
        "once)\n"
        "  --arrival A            poisson (default), constant, gamma:B, onoff:ON_S:OFF_S\n"
        "  --burstiness B         vLLM's gamma arrivals (1 = poisson)\n"
        "  --max-concurrency N    open loop: at most N requests in flight (the rest wait)\n"
        "  --concurrency N        closed loop: N users, each sending its next request when the "
        "last ends\n"
        "  --trace FILE           replay JSONL lines "
        "{\"t\",\"tier\",\"tenant\",\"prompt_tokens\",\"output_tokens\"}\n"
        "  --trace-speed X        replay X times faster (default 1)\n"
        "  --tenant-key T=KEY     API key for tenant T (trace lines and classes with tenant=T)\n"
        "bounds\n"
        "  --num-requests N       measured requests (alias --num-prompts; default 1000 when no\n"
        "                         --duration is given)\n"
        "  --duration S           stop starting measured requests after S seconds\n"
        "  --warmup S             requests due in the first S seconds are sent but not counted\n"
        "  --num-warmups N        the first N requests are sent but not counted\n"
        "  --timeout S            give up on a request after S seconds (default 600; 0 = never)\n"
        "  --max-retries N        retry 408/409/429/5xx and connection errors up to N times, "
        "waiting\n"
        "                         retry-after-ms / Retry-After (<= 60 s) or 0.5 s doubling to 8 s\n"
        "                         (the OpenAI SDKs' rules; default 0)\n"
        "requests (defaults for classes)\n"
        "  --prompt DIST          prompt tokens (default fixed:128); alias --input-len N\n"
        "  --output DIST          max tokens (default fixed:64); alias --output-len N\n"
        "                         DIST: N, fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA, "
        "file:PATH\n"
        "  --shared-prefix-tokens N   start every prompt with the same N tokens (a chat's system\n"
        "                         message), then --prompt tokens of its own (default 0: prompts\n"
        "                         share nothing)\n"
        "  --unique-prefix        each request draws its own prefix words instead: the same\n"
        "                         lengths and shape, nothing shared (a prefix cache's control)\n"
        "  --ignore-eos           send \"ignore_eos\": true and \"min_tokens\" = max tokens "
        "(vLLM)\n"
        "  --temperature T        default 0\n"
        "  --extra-body JSON      members merged into every request body\n"
        "  --no-calibrate         do not measure the server's tokens per prompt word at start\n"
        "  --seed N               arrivals, lengths, prompt words, shared prefix (default 0)\n"
        "classes\n"
        "  --class NAME,key=value,...   a request class (repeat for several); keys:\n"
        "      rate=R weight=W arrival=A tier=T service_tier=V tenant=T key=KEY|env:VAR model=M\n"
        "      endpoint=completions|chat|/path prompt=DIST output=DIST shared_prefix=N\n"
        "      ignore_eos=0|1 temperature=T n=N ttft_slo=MS tpot_slo=MS e2el_slo=MS\n"
        "    tier= sends the x-sluice-tier header; service_tier= OpenAI's body field. A class\n"
        "    without rate= shares --request-rate by weight; in a closed loop each request picks\n"
        "    its class by weight. n= caps the class's measured requests.\n"
        "  --classes FILE         the same as JSON: [{\"name\": ..., \"rate\": 5, ...}, ...]\n"
        "report\n"
        "  --goodput ttft:MS [tpot:MS] [e2el:MS]   objectives for goodput (vLLM's syntax)\n"
        "  --metric-percentiles L  e.g. 50,90,99,99.9 (the default)\n"
        "  --json FILE            vLLM bench serve fields, plus \"classes\" and \"generator\"\n"
        "  --csv FILE             one row per request\n"
        "  --plot DIR             latency CDFs and a TTFT/admissions time series (needs gnuplot)\n"
        "  --summary FILE         append one tab-separated line per class (for scenario tables)\n"
        "  --label NAME           the run's name in --summary and --json\n"
        "  --progress, --no-progress   progress line on stderr (default: when it is a terminal)\n"
        "  --quiet                no table on stdout\n"
        "  --help, --version\n"
        "\n"
        "Exit status: 0 when the run finished (whatever the server answered), 1 when it could not\n"
        "run (server unreachable, files not writable), 2 for a bad command line.\n",
        f);
}

void sl_bench_config_init(struct sl_bench_config *c)
{
    memset(c, 0, sizeof *c);
    c->url = sl_xstrdup("http://127.0.0.1:8080");
    c->endpoint = sl_xstrdup("/v1/completions");
    const char *key = getenv("OPENAI_API_KEY");
    if (key && *key)
        c->api_key = sl_xstrdup(key);
    sl_bench_class_init(&c->defaults, "defaults");
    c->defaults.prompt = (struct sl_bench_len){.kind = SL_BENCH_LEN_FIXED, .a = 128};
    snprintf(c->defaults.prompt.text, sizeof c->defaults.prompt.text, "fixed:128");
    c->defaults.output = (struct sl_bench_len){.kind = SL_BENCH_LEN_FIXED, .a = 64};
    snprintf(c->defaults.output.text, sizeof c->defaults.output.text, "fixed:64");
    c->request_rate = INFINITY;
    c->arrival = (struct sl_bench_arrival){.kind = SL_BENCH_ARRIVAL_POISSON, .burstiness = 1};
    c->trace_speed = 1;
    c->temperature = 0;
    c->timeout_s = 600;
    c->calibrate = true;
    for (int i = 0; i < 3; i++)
        c->slo_ms[i] = NAN;
    static const double pct[] = {50, 90, 99, 99.9};
    memcpy(c->percentiles, pct, sizeof pct);
    c->n_percentiles = 4;
    c->progress = -1;
}

void sl_bench_config_dispose(struct sl_bench_config *c)
{
    free(c->url);
    free(c->endpoint);
    free(c->model);
    free(c->api_key);
    for (size_t i = 0; i < c->n_classes; i++)
        sl_bench_class_dispose(&c->classes[i]);
    free(c->classes);
    for (size_t i = 0; i < c->n_tenant_keys; i++) {
        free(c->tenant_keys[i].tenant);
        free(c->tenant_keys[i].key);
    }
    free(c->tenant_keys);
    sl_bench_class_dispose(&c->defaults);
    free(c->trace_path);
    free(c->trace);
    free(c->extra_body);
    free(c->json_path);
    free(c->csv_path);
    free(c->plot_dir);
    free(c->summary_path);
    free(c->label);
    free(c->gnuplot);
    for (size_t i = 0; i < c->n_len_files; i++)
        free(c->len_files[i]);
    free(c->len_files);
    memset(c, 0, sizeof *c);
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return SL_EINVAL;
}

static bool num(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static bool whole(const char *s, double lo, double hi, long *out)
{
    double v;
    if (!num(s, &v) || v != floor(v) || v < lo || v > hi)
        return false;
    *out = (long)v;
    return true;
}

static void set(char **dst, const char *v)
{
    free(*dst);
    *dst = sl_xstrdup(v);
}

/* Splits the URL into host, port and path prefix. Only http: TLS is not supported yet. */
static int parse_url(struct sl_bench_config *c, char *err, size_t errlen)
{
    const char *u = c->url;
    if (!strncmp(u, "https://", 8))
        return fail(err, errlen,
                    "--url %s: https is not supported yet (TLS arrives with the "
                    "gateway's TLS issue); use http://",
                    u);
    if (strncmp(u, "http://", 7))
        return fail(err, errlen, "--url %s: expected http://HOST[:PORT][/PREFIX]", u);
    const char *h = u + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    const char *colon = NULL;
    if (hl && h[0] == '[') {
        const char *rb = memchr(h, ']', hl);
        if (!rb)
            return fail(err, errlen, "--url %s: unterminated [IPv6] address", u);
        if (rb + 1 < h + hl && rb[1] == ':')
            colon = rb + 1;
    } else {
        colon = memchr(h, ':', hl);
    }
    size_t name_len = colon ? (size_t)(colon - h) : hl;
    if (name_len == 0 || name_len >= sizeof c->host)
        return fail(err, errlen, "--url %s: bad host", u);
    memcpy(c->host, h, name_len);
    c->host[name_len] = '\0';
    if (colon) {
        size_t pl = hl - name_len - 1;
        long port;
        char pbuf[8];
        if (pl == 0 || pl >= sizeof pbuf)
            return fail(err, errlen, "--url %s: bad port", u);
        memcpy(pbuf, colon + 1, pl);
        pbuf[pl] = '\0';
        if (!whole(pbuf, 1, 65535, &port))
            return fail(err, errlen, "--url %s: bad port", u);
        snprintf(c->port, sizeof c->port, "%ld", port);
    } else {
        snprintf(c->port, sizeof c->port, "80");
    }
    const char *prefix = slash ? slash : "";
    size_t pl = strlen(prefix);
    while (pl && prefix[pl - 1] == '/')
        pl--;
    /* "--url http://h:p/v1" with the default endpoint /v1/completions: do not say v1 twice. */
    if (pl >= 3 && !strncmp(prefix + pl - 3, "/v1", 3) && !strncmp(c->endpoint, "/v1/", 4))
        pl -= 3;
    if (pl >= sizeof c->prefix)
        return fail(err, errlen, "--url %s: path too long", u);
    for (size_t i = 0; i < pl; i++)
        if ((unsigned char)prefix[i] <= 0x20 || prefix[i] == 0x7f)
            return fail(err, errlen, "--url %s: bad path", u);
    memcpy(c->prefix, prefix, pl);
    c->prefix[pl] = '\0';
    return SL_OK;
}

static bool flag_is(const char *arg, const char *name, const char **inline_value)
{
    size_t n = strlen(name);
    if (strncmp(arg, name, n))
        return false;
    if (arg[n] == '\0') {
        *inline_value = NULL;
        return true;
    }
    if (arg[n] == '=') {
        *inline_value = arg + n + 1;
        return true;
    }
    return false;
}

int sl_bench_cli_parse(struct sl_bench_config *c, int argc, char **argv, char *err, size_t errlen)
{
    char *host = NULL, *port = NULL;
    bool url_given = false;
    int rc = SL_OK;
#define NEED_VALUE()                                                                               \
    do {                                                                                           \
        if (!v) {                                                                                  \
            if (i + 1 >= argc) {                                                                   \
                rc = fail(err, errlen, "%s: expected a value", name);                              \
                goto out;                                                                          \
            }                                                                                      \
            v = argv[++i];                                                                         \
        }                                                                                          \
    } while (0)
#define BAD(...)                                                                                   \
    do {                                                                                           \
        rc = fail(err, errlen, __VA_ARGS__);                                                       \
        goto out;                                                                                  \
    } while (0)
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL, *name = a;
        double x;
        long n;
        char e2[400];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            sl_bench_cli_usage(stdout);
            rc = 1;
            goto out;
        } else if (!strcmp(a, "--version")) {
            printf("sluice-bench %s\n", SL_VERSION);
            rc = 1;
            goto out;
        } else if (flag_is(a, "--url", &v) || flag_is(a, "--base-url", &v)) {
            NEED_VALUE();
            set(&c->url, v);
            url_given = true;
        } else if (flag_is(a, "--host", &v)) {
            NEED_VALUE();
            set(&host, v);
        } else if (flag_is(a, "--port", &v)) {
            NEED_VALUE();
            set(&port, v);
        } else if (flag_is(a, "--endpoint", &v)) {
            NEED_VALUE();
            if (v[0] != '/' || strchr(v, ' '))
                BAD("--endpoint %s: expected a path such as /v1/completions", v);
            set(&c->endpoint, v);
        } else if (flag_is(a, "--backend", &v)) {
            NEED_VALUE();
            if (!strcmp(v, "openai") || !strcmp(v, "vllm") || !strcmp(v, "sluice"))
                set(&c->endpoint, "/v1/completions");
            else if (!strcmp(v, "openai-chat"))
                set(&c->endpoint, "/v1/chat/completions");
            else
                BAD("--backend %s: expected openai or openai-chat", v);
        } else if (flag_is(a, "--model", &v)) {
            NEED_VALUE();
            if (strchr(v, '"') || strchr(v, '\\') || !*v)
                BAD("--model: expected a name without quotes");
            set(&c->model, v);
        } else if (flag_is(a, "--api-key", &v)) {
            NEED_VALUE();
            for (const char *p = v; *p; p++)
                if ((unsigned char)*p < 0x20)
                    BAD("--api-key: expected printable text");
            set(&c->api_key, v);
        } else if (flag_is(a, "--request-rate", &v)) {
            NEED_VALUE();
            if (!strcasecmp(v, "inf"))
                c->request_rate = INFINITY;
            else if (!num(v, &x) || x <= 0)
                BAD("--request-rate %s: expected requests/s above 0, or inf", v);
            else
                c->request_rate = x;
        } else if (flag_is(a, "--arrival", &v)) {
            NEED_VALUE();
            if (sl_bench_arrival_parse(&c->arrival, v, e2, sizeof e2))
                BAD("--arrival %s", e2);
        } else if (flag_is(a, "--burstiness", &v)) {
            NEED_VALUE();
            if (!num(v, &x) || x <= 0)
                BAD("--burstiness %s: expected a number above 0", v);
            c->arrival = (struct sl_bench_arrival){.kind = x == 1 ? SL_BENCH_ARRIVAL_POISSON
                                                                  : SL_BENCH_ARRIVAL_GAMMA,
                                                   .burstiness = x};
        } else if (flag_is(a, "--concurrency", &v)) {
            NEED_VALUE();
            if (!whole(v, 1, 1000000, &n))
                BAD("--concurrency %s: expected 1 to 1000000", v);
            c->concurrency = (int)n;
        } else if (flag_is(a, "--max-concurrency", &v)) {
            NEED_VALUE();
            if (!whole(v, 1, 1000000, &n))
                BAD("--max-concurrency %s: expected 1 to 1000000", v);
            c->max_concurrency = (int)n;
        } else if (flag_is(a, "--num-requests", &v) || flag_is(a, "--num-prompts", &v)) {
            NEED_VALUE();
            if (!whole(v, 1, 1e12, &n))
                BAD("%s %s: expected a positive whole number", name, v);
            c->num_requests = n;
        } else if (flag_is(a, "--duration", &v)) {
            NEED_VALUE();
            if (!num(v, &x) || x <= 0)
                BAD("--duration %s: expected seconds above 0", v);
            c->duration_s = x;
        } else if (flag_is(a, "--warmup", &v)) {
            NEED_VALUE();
            if (!num(v, &x) || x < 0)
                BAD("--warmup %s: expected seconds, at least 0", v);
            c->warmup_s = x;
        } else if (flag_is(a, "--num-warmups", &v)) {
            NEED_VALUE();
            if (!whole(v, 0, 1e12, &n))
                BAD("--num-warmups %s: expected a whole number", v);
            c->num_warmups = n;
        } else if (flag_is(a, "--timeout", &v)) {
            NEED_VALUE();
            if (!num(v, &x) || x < 0)
                BAD("--timeout %s: expected seconds, at least 0", v);
            c->timeout_s = x;
        } else if (flag_is(a, "--max-retries", &v)) {
            NEED_VALUE();
            if (!whole(v, 0, 100, &n))
                BAD("--max-retries %s: expected 0 to 100", v);
            c->max_retries = (int)n;
        } else if (flag_is(a, "--prompt", &v) || flag_is(a, "--input-len", &v) ||
                   flag_is(a, "--output", &v) || flag_is(a, "--output-len", &v)) {
            NEED_VALUE();
            bool prompt = !strncmp(a, "--prompt", 8) || !strncmp(a, "--input", 7);
            if (sl_bench_len_parse(c, prompt ? &c->defaults.prompt : &c->defaults.output, v, e2,
                                   sizeof e2))
                BAD("%.*s: %s", (int)strcspn(a, "="), a, e2);
        } else if (flag_is(a, "--shared-prefix-tokens", &v)) {
            NEED_VALUE();
            if (!whole(v, 0, SL_BENCH_LEN_MAX, &n))
                BAD("--shared-prefix-tokens %s: expected tokens, 0 to %u", v, SL_BENCH_LEN_MAX);
            c->shared_prefix = (uint32_t)n;
        } else if (!strcmp(a, "--unique-prefix")) {
            c->unique_prefix = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            c->ignore_eos = true;
        } else if (flag_is(a, "--temperature", &v)) {
            NEED_VALUE();
            if (!num(v, &x) || x < 0 || x > 2)
                BAD("--temperature %s: expected 0 to 2", v);
            c->temperature = x;
        } else if (flag_is(a, "--extra-body", &v)) {
            NEED_VALUE();
            json_t *o = json_loads(v, 0, NULL);
            if (!json_is_object(o)) {
                json_decref(o);
                BAD("--extra-body: expected a JSON object");
            }
            char *s = json_dumps(o, JSON_COMPACT);
            json_decref(o);
            size_t len = strlen(s);
            /* Keep the members only: "{...}" without its braces. */
            free(c->extra_body);
            c->extra_body = sl_xstrndup(s + 1, len >= 2 ? len - 2 : 0);
            free(s);
        } else if (!strcmp(a, "--no-calibrate")) {
            c->calibrate = false;
        } else if (flag_is(a, "--seed", &v)) {
            NEED_VALUE();
            char *end;
            unsigned long long s = strtoull(v, &end, 10);
            if (end == v || *end || v[0] == '-')
                BAD("--seed %s: expected a whole number", v);
            c->seed = s;
        } else if (flag_is(a, "--class", &v)) {
            NEED_VALUE();
            if (sl_bench_class_parse(c, v, e2, sizeof e2))
                BAD("--class: %s", e2);
        } else if (flag_is(a, "--classes", &v)) {
            NEED_VALUE();
            if (sl_bench_classes_load(c, v, e2, sizeof e2))
                BAD("--classes: %s", e2);
        } else if (flag_is(a, "--trace", &v)) {
            NEED_VALUE();
            set(&c->trace_path, v);
        } else if (flag_is(a, "--trace-speed", &v)) {
            NEED_VALUE();
            if (!num(v, &x) || x <= 0)
                BAD("--trace-speed %s: expected a number above 0", v);
            c->trace_speed = x;
        } else if (flag_is(a, "--tenant-key", &v)) {
            NEED_VALUE();
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || !eq[1])
                BAD("--tenant-key: expected TENANT=KEY");
            c->tenant_keys =
                sl_xrealloc(c->tenant_keys, (c->n_tenant_keys + 1) * sizeof *c->tenant_keys);
            c->tenant_keys[c->n_tenant_keys].tenant = sl_xstrndup(v, (size_t)(eq - v));
            c->tenant_keys[c->n_tenant_keys].key = sl_xstrdup(eq + 1);
            c->n_tenant_keys++;
        } else if (flag_is(a, "--goodput", &v)) {
            /* vLLM takes several words: --goodput ttft:500 tpot:50 */
            NEED_VALUE();
            if (sl_bench_goodput_parse(c->slo_ms, v, e2, sizeof e2))
                BAD("%s", e2);
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) && strchr(argv[i + 1], ':'))
                if (sl_bench_goodput_parse(c->slo_ms, argv[++i], e2, sizeof e2))
                    BAD("%s", e2);
        } else if (flag_is(a, "--metric-percentiles", &v)) {
            NEED_VALUE();
            char *buf = sl_xstrdup(v), *save = NULL;
            c->n_percentiles = 0;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (!num(t, &x) || x < 0 || x > 100 ||
                    c->n_percentiles == SL_BENCH_MAX_PERCENTILES) {
                    free(buf);
                    BAD("--metric-percentiles %s: expected up to %d numbers from 0 to 100", v,
                        SL_BENCH_MAX_PERCENTILES);
                }
                c->percentiles[c->n_percentiles++] = x;
            }
            free(buf);
            if (!c->n_percentiles)
                BAD("--metric-percentiles: expected at least one percentile");
        } else if (flag_is(a, "--json", &v) || flag_is(a, "--result-filename", &v)) {
            NEED_VALUE();
            set(&c->json_path, v);
        } else if (flag_is(a, "--summary", &v)) {
            NEED_VALUE();
            set(&c->summary_path, v);
        } else if (flag_is(a, "--label", &v)) {
            NEED_VALUE();
            for (const char *p = v; *p; p++)
                if ((unsigned char)*p <= ' ' || *p == '"' || *p == '\\')
                    BAD("--label: expected printable text without spaces or quotes");
            set(&c->label, v);
        } else if (flag_is(a, "--csv", &v)) {
            NEED_VALUE();
            set(&c->csv_path, v);
        } else if (flag_is(a, "--plot", &v)) {
            NEED_VALUE();
            set(&c->plot_dir, v);
        } else if (!strcmp(a, "--progress")) {
            c->progress = 1;
        } else if (!strcmp(a, "--no-progress") || !strcmp(a, "--disable-tqdm")) {
            c->progress = 0;
        } else if (!strcmp(a, "--quiet")) {
            c->quiet = true;
        } else {
            BAD("unknown option %s (see --help)", a);
        }
    }
    if (host || port) {
        if (url_given)
            BAD("give --url or --host/--port, not both");
        free(c->url);
        struct sl_str u;
        sl_str_init(&u);
        bool v6 = host && strchr(host, ':') && host[0] != '[';
        sl_str_appendf(&u, "http://%s%s%s:%s", v6 ? "[" : "", host ? host : "127.0.0.1",
                       v6 ? "]" : "", port ? port : "8080");
        c->url = u.p;
    }
    if ((rc = parse_url(c, err, errlen)))
        goto out;
    if (c->plot_dir) {
        /* Fail now, not after a long run. */
        c->gnuplot = sl_bench_plot_find_gnuplot();
        if (!c->gnuplot)
            BAD("--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)");
    }
    rc = sl_bench_config_finish(c, err, errlen);
out:
    free(host);
    free(port);
    return rc;
#undef NEED_VALUE
#undef BAD
}
