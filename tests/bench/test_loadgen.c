/* sluice-bench end to end: the real binary against the real sluice on loopback, and against
 * sluice-stub, a scripted server whose delays and statuses are known. Assertions are on counts,
 * on lower bounds a delay guarantees (a first chunk held 300 ms cannot arrive sooner), and on the
 * server's own record of what it received, never on how fast anything ran. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "../integration/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(loadgen, .timeout = 300);

static char tmp_dir[64];

static void make_tmp(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/sluice-bench-it-XXXXXX");
    cr_assert_not_null(mkdtemp(tmp_dir));
}

static char *tmp(const char *name)
{
    static char paths[8][128];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 128, "%s/%s", tmp_dir, name);
    return p;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
}

/* Runs sluice-bench with the arguments (NULL-terminated), its output going to out.txt in the
 * temporary folder. Returns its exit status. */
static int bench(const char *const *args, char *output, size_t max)
{
    const char *bin = getenv("SLUICE_BENCH_BIN");
    cr_assert_not_null(bin, "SLUICE_BENCH_BIN is not set (run through meson test)");
    const char *argv[64];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--no-progress";
    for (int i = 0; args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *out = tmp("out.txt");
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    FILE *f = fopen(out, "r");
    size_t len = f ? fread(output, 1, max - 1, f) : 0;
    output[len] = '\0';
    if (f)
        fclose(f);
    fprintf(stderr, "%s", output); /* visible in the test log */
    cr_assert(WIFEXITED(st), "sluice-bench died (status %d):\n%s", st, output);
    return WEXITSTATUS(st);
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    cr_assert_not_null(j, "%s: %s", path, e.text);
    return j;
}

static long long jint(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_integer(v), "\"%s\" is not an integer", key);
    return json_integer_value(v);
}

static double jnum(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    cr_assert(json_is_number(v), "\"%s\" is not a number", key);
    return json_number_value(v);
}

static long long jrejected(json_t *o, const char *status)
{
    json_t *v = json_object_get(json_object_get(o, "rejected"), status);
    return v ? json_integer_value(v) : 0;
}

static long long jerrors(json_t *o, const char *kind)
{
    json_t *v = json_object_get(json_object_get(o, "errors"), kind);
    return v ? json_integer_value(v) : 0;
}

/* sent = completed + rejected + errors, and the breakdowns sum to their totals. */
static void assert_counts_add_up(json_t *o, const char *what)
{
    long long sent = jint(o, "sent"), completed = jint(o, "completed");
    long long rej = jint(o, "rejected_total"), err = jint(o, "errors_total");
    cr_assert_eq(sent, completed + rej + err, "%s: sent %lld != %lld + %lld + %lld", what, sent,
                 completed, rej, err);
    cr_assert_eq(jint(o, "failed"), rej + err, "%s", what);
    long long sum = 0;
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(o, "rejected"), k, v) sum += json_integer_value(v);
    cr_assert_eq(sum, rej, "%s: rejected by status", what);
    sum = 0;
    json_object_foreach(json_object_get(o, "errors"), k, v) sum += json_integer_value(v);
    cr_assert_eq(sum, err, "%s: errors by kind", what);
}

/* One CSV row's fields, split in place (no quoting: sluice-bench writes none). */
static int csv_fields(char *line, char **f, int max)
{
    int n = 0;
    for (char *p = line; n < max;) {
        f[n++] = p;
        char *c = strchr(p, ',');
        if (!c)
            break;
        *c = '\0';
        p = c + 1;
    }
    char *nl = strchr(f[n - 1], '\n');
    if (nl)
        *nl = '\0';
    return n;
}

enum {
    C_CLASS,
    C_ID,
    C_WARMUP,
    C_OUTCOME,
    C_STATUS,
    C_ERROR,
    C_ATTEMPTS,
    C_SCHED,
    C_READY,
    C_SENT,
    C_FIRST,
    C_END,
    C_TTFT,
    C_E2EL,
    C_TPOT,
    C_ITL,
    C_PTARGET,
    C_OTARGET,
    C_PTOK,
    C_OTOK,
    C_CHUNKS,
    C_USAGE,
    C_REUSED,
    C_CACHED,
    C_COUNT
};

/* Calls fn on every data row of a --csv file; returns the row count. */
static int csv_rows(const char *path, void (*fn)(char **f, void *arg), void *arg)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[1024];
    cr_assert_not_null(fgets(line, sizeof line, f));
    cr_assert(strncmp(line, "class,id,warmup,outcome,status", 30) == 0, "header: %s", line);
    int rows = 0;
    while (fgets(line, sizeof line, f)) {
        char *fields[C_COUNT + 1];
        cr_assert_eq(csv_fields(line, fields, C_COUNT + 1), C_COUNT, "row %d", rows);
        fn(fields, arg);
        rows++;
    }
    fclose(f);
    return rows;
}

/* ---------------------------------------------------------------------------------------------
 * sluice-stub
 */

/* Starts sluice-stub through the integration harness (which runs $SLUICE_BIN). */
static void stub_start(struct server *s, const char *const *args)
{
    const char *stub = getenv("SLUICE_STUB_BIN");
    cr_assert_not_null(stub, "SLUICE_STUB_BIN is not set (run through meson test)");
    char *saved = getenv("SLUICE_BIN") ? strdup(getenv("SLUICE_BIN")) : NULL;
    setenv("SLUICE_BIN", stub, 1);
    server_start(s, args);
    if (saved) {
        setenv("SLUICE_BIN", saved, 1);
        free(saved);
    }
}

struct stub_line {
    unsigned long seq;
    double t_ms;
    char method[8], path[64], tier[32], auth[96];
    int status, inflight, ignore_eos;
    long max_tokens;
    unsigned words;
    unsigned first; /* a hash of the chat's first message or of the prompt */
};

static int stub_log(const char *path, struct stub_line *out, int max)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[512];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        struct stub_line *l = &out[n];
        int got = sscanf(line,
                         "seq=%lu t_ms=%lf method=%7s path=%63s status=%d max_tokens=%ld words=%u "
                         "tier=%31s auth=%95s inflight=%d ignore_eos=%d first=%x",
                         &l->seq, &l->t_ms, l->method, l->path, &l->status, &l->max_tokens,
                         &l->words, l->tier, l->auth, &l->inflight, &l->ignore_eos, &l->first);
        cr_assert_eq(got, 12, "stub log line: %s", line);
        n++;
    }
    fclose(f);
    return n;
}

static char url_buf[64];

static const char *url_of(const struct server *s)
{
    snprintf(url_buf, sizeof url_buf, "http://127.0.0.1:%d", s->port);
    return url_buf;
}

static char output[1 << 16];

struct held {
    int rows;
};

static void check_held(char **f, void *arg)
{
    struct held *h = arg;
    cr_assert_str_eq(f[C_OUTCOME], "ok");
    double ttft = atof(f[C_TTFT]), e2el = atof(f[C_E2EL]);
    /* The stub holds the first chunk 300 ms after the request arrived, which is after it was
     * sent; then 4 more chunks 20 ms apart. */
    cr_assert_geq(ttft, 300.0, "TTFT %g ms is below the 300 ms the server held it", ttft);
    cr_assert_lt(ttft, 300.0 + 30000.0, "TTFT %g ms", ttft);
    cr_assert_geq(e2el, 300.0 + 4 * 20.0, "E2EL %g ms", e2el);
    cr_assert_geq(e2el, ttft);
    cr_assert_eq(atoi(f[C_CHUNKS]), 5);
    cr_assert_eq(atoi(f[C_OTOK]), 5, "usage.completion_tokens");
    cr_assert_eq(atoi(f[C_USAGE]), 1);
    h->rows++;
}

Test(loadgen, ttft_is_at_least_the_held_delay_when_server_withholds_the_first_chunk)
{
    make_tmp();
    struct server s;
    const char *sargs[] = {"--ttft-ms", "300", "--itl-ms", "20", "--tokens", "5", NULL};
    stub_start(&s, sargs);
    const char *args[] = {"--url", url_of(&s), "--concurrency", "2",     "--num-requests",
                          "4",     "--json",   tmp("r.json"),   "--csv", tmp("r.csv"),
                          NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    struct held h = {0};
    cr_assert_eq(csv_rows(tmp("r.csv"), check_held, &h), 4);
    json_t *j = load_json(tmp("r.json"));
    assert_counts_add_up(j, "all");
    cr_assert_eq(jint(j, "completed"), 4);
    cr_assert_geq(jnum(j, "mean_ttft_ms"), 300.0);
    cr_assert_geq(jnum(j, "p99_ttft_ms"), jnum(j, "median_ttft_ms"));
    cr_assert_geq(jnum(j, "mean_e2el_ms"), jnum(j, "mean_ttft_ms"));
    cr_assert_eq(jint(j, "total_output_tokens"), 20);
    /* Five chunks make four gaps each, all within E2EL − TTFT (the end comes after the last
     * chunk), so TPOT = (E2EL − TTFT) / 4 is at least the mean gap. */
    cr_assert_gt(jnum(j, "mean_itl_ms"), 0);
    cr_assert_geq(jnum(j, "mean_tpot_ms") + 1e-9, jnum(j, "mean_itl_ms"));
    json_decref(j);
}

Test(loadgen, rejects_are_counted_by_status_when_server_answers_429_and_503)
{
    make_tmp();
    struct server s;
    char log[128];
    snprintf(log, sizeof log, "%s", tmp("stub.log"));
    const char *sargs[] = {"--statuses", "200,429,503", "--retry-after", "1", "--log", log, NULL};
    stub_start(&s, sargs);
    /* One user and no probes: the stub's statuses fall on requests in order. */
    const char *args[] = {"--url",          url_of(&s), "--concurrency", "1",
                          "--num-requests", "9",        "--model",       "stub",
                          "--no-calibrate", "--json",   tmp("r.json"),   NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    json_t *j = load_json(tmp("r.json"));
    assert_counts_add_up(j, "all");
    cr_assert_eq(jint(j, "sent"), 9);
    cr_assert_eq(jint(j, "completed"), 3);
    cr_assert_eq(jrejected(j, "429"), 3);
    cr_assert_eq(jrejected(j, "503"), 3);
    cr_assert_eq(jint(j, "retries"), 0, "retries are off by default");
    cr_assert_eq(jint(j, "rejected_without_retry_after"), 0, "every one said when to retry");
    json_decref(j);
    cr_assert(strstr(output, "429:3 503:3"), "the table shows them:\n%s", output);
    struct stub_line lines[32];
    cr_assert_eq(stub_log(log, lines, 32), 9, "no request was retried");
}

static void retry_case(const char *const *stub_args, double min_gap_ms)
{
    make_tmp();
    struct server s;
    char log[128];
    snprintf(log, sizeof log, "%s", tmp("stub.log"));
    const char *sargs[16];
    int n = 0;
    for (int i = 0; stub_args[i]; i++)
        sargs[n++] = stub_args[i];
    sargs[n++] = "--log";
    sargs[n++] = log;
    sargs[n] = NULL;
    stub_start(&s, sargs);
    const char *args[] = {
        "--url", url_of(&s),       "--concurrency", "1", "--num-requests", "2",           "--model",
        "stub",  "--no-calibrate", "--max-retries", "2", "--json",         tmp("r.json"), NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    json_t *j = load_json(tmp("r.json"));
    assert_counts_add_up(j, "all");
    cr_assert_eq(jint(j, "sent"), 2);
    cr_assert_eq(jint(j, "completed"), 2, "each request succeeds on its second attempt");
    cr_assert_eq(jint(j, "retries"), 2);
    json_decref(j);
    struct stub_line l[8];
    cr_assert_eq(stub_log(log, l, 8), 4);
    for (int i = 0; i < 4; i += 2) {
        cr_assert_eq(l[i].status, 429);
        cr_assert_eq(l[i + 1].status, 200);
        double gap = l[i + 1].t_ms - l[i].t_ms;
        cr_assert_geq(gap, min_gap_ms,
                      "the retry came %g ms after the 429, before the %g ms "
                      "the server asked for",
                      gap, min_gap_ms);
    }
}

Test(loadgen, retry_waits_retry_after_ms_when_the_server_sends_it)
{
    const char *sargs[] = {"--statuses", "429,200", "--retry-after-ms", "250", "--retry-after",
                           "30",         NULL};
    /* retry-after-ms wins over Retry-After (30 s would time the test out). */
    retry_case(sargs, 250);
}

Test(loadgen, retry_waits_retry_after_seconds_when_only_that_is_sent)
{
    const char *sargs[] = {"--statuses", "429,200", "--retry-after", "1", NULL};
    retry_case(sargs, 1000);
}

Test(loadgen, closed_loop_never_exceeds_its_concurrency)
{
    make_tmp();
    struct server s;
    char log[128];
    snprintf(log, sizeof log, "%s", tmp("stub.log"));
    const char *sargs[] = {"--ttft-ms", "5", "--itl-ms", "1", "--log", log, NULL};
    stub_start(&s, sargs);
    const char *args[] = {"--url",
                          url_of(&s),
                          "--concurrency",
                          "3",
                          "--num-requests",
                          "30",
                          "--model",
                          "stub",
                          "--no-calibrate",
                          "--output",
                          "4",
                          NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    struct stub_line l[64];
    cr_assert_eq(stub_log(log, l, 64), 30);
    for (int i = 0; i < 30; i++) {
        cr_assert_leq(l[i].inflight, 3, "request %d found %d in flight", i, l[i].inflight);
        cr_assert_eq(l[i].max_tokens, 4);
    }
}

Test(loadgen, open_loop_cap_holds_when_max_concurrency_is_set)
{
    make_tmp();
    struct server s;
    char log[128];
    snprintf(log, sizeof log, "%s", tmp("stub.log"));
    const char *sargs[] = {"--ttft-ms", "20", "--log", log, NULL};
    stub_start(&s, sargs);
    const char *args[] = {"--url",          url_of(&s), "--max-concurrency", "2",
                          "--num-requests", "12",       "--model",           "stub",
                          "--no-calibrate", "--json",   tmp("r.json"),       NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    struct stub_line l[32];
    cr_assert_eq(stub_log(log, l, 32), 12);
    for (int i = 0; i < 12; i++)
        cr_assert_leq(l[i].inflight, 2);
    json_t *j = load_json(tmp("r.json"));
    cr_assert_eq(jint(j, "completed"), 12);
    cr_assert_leq(jint(j, "max_concurrent_requests"), 2);
    cr_assert_eq(jint(j, "max_concurrency"), 2);
    json_decref(j);
}

Test(loadgen, hundreds_of_connections_complete_when_all_are_sent_at_once)
{
    make_tmp();
    struct server s;
    const char *sargs[] = {"--ttft-ms", "100", "--tokens", "3", NULL};
    stub_start(&s, sargs);
    const char *args[] = {"--url", url_of(&s),       "--num-requests", "400",         "--model",
                          "stub",  "--no-calibrate", "--json",         tmp("r.json"), NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    json_t *j = load_json(tmp("r.json"));
    assert_counts_add_up(j, "all");
    cr_assert_eq(jint(j, "completed"), 400);
    cr_assert_eq(jint(j, "total_output_tokens"), 1200);
    json_t *g = json_object_get(j, "generator");
    cr_assert_eq(jint(g, "requests_sent"), 400);
    cr_assert_eq(jint(g, "connections_opened") + jint(g, "connections_reused"), 400);
    json_decref(j);
}

Test(loadgen, broken_streams_and_timeouts_are_errors_when_the_server_fails)
{
    make_tmp();
    struct server s;
    const char *sargs[] = {"--drop-after", "2", NULL};
    stub_start(&s, sargs);
    const char *args[] = {"--url",          url_of(&s), "--concurrency", "2",
                          "--num-requests", "6",        "--model",       "stub",
                          "--no-calibrate", "--json",   tmp("r.json"),   NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    json_t *j = load_json(tmp("r.json"));
    assert_counts_add_up(j, "all");
    cr_assert_eq(jint(j, "errors_total"), 6);
    cr_assert_eq(jerrors(j, "closed"), 6, "a connection closed mid-stream");
    json_decref(j);

    /* A server that never sends its first chunk, and a short --timeout. */
    const char *s2[] = {"--ttft-ms", "600000", NULL};
    stub_start(&s, s2);
    const char *a2[] = {"--url",   url_of(&s), "--num-requests", "3",      "--timeout",   "0.5",
                        "--model", "stub",     "--no-calibrate", "--json", tmp("r.json"), NULL};
    cr_assert_eq(bench(a2, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    j = load_json(tmp("r.json"));
    assert_counts_add_up(j, "all");
    cr_assert_eq(jerrors(j, "timeout"), 3);
    json_decref(j);
}

Test(loadgen, warmup_requests_are_sent_but_not_counted)
{
    make_tmp();
    struct server s;
    char log[128];
    snprintf(log, sizeof log, "%s", tmp("stub.log"));
    const char *sargs[] = {"--log", log, NULL};
    stub_start(&s, sargs);
    const char *args[] = {"--url",          url_of(&s), "--concurrency",  "2",
                          "--num-requests", "5",        "--num-warmups",  "3",
                          "--model",        "stub",     "--no-calibrate", "--json",
                          tmp("r.json"),    "--csv",    tmp("r.csv"),     NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    struct stub_line l[16];
    cr_assert_eq(stub_log(log, l, 16), 8);
    json_t *j = load_json(tmp("r.json"));
    cr_assert_eq(jint(j, "sent"), 5);
    cr_assert_eq(jint(j, "completed"), 5);
    cr_assert_eq(jint(j, "warmup_requests"), 3);
    json_decref(j);
}

Test(loadgen, trace_replay_sends_each_line_with_its_tier_key_and_length)
{
    make_tmp();
    struct server s;
    char log[128];
    snprintf(log, sizeof log, "%s", tmp("stub.log"));
    const char *sargs[] = {"--log", log, NULL};
    stub_start(&s, sargs);
    char *trace = tmp("trace.jsonl");
    write_file(trace,
               "{\"t\": 0.0, \"tier\": \"interactive\", \"tenant\": \"acme\", \"prompt_tokens\": "
               "20, \"output_tokens\": 7}\n"
               "{\"t\": 0.05, \"tier\": \"batch\", \"tenant\": \"acme\", \"prompt_tokens\": 40, "
               "\"output_tokens\": 11}\n"
               "{\"t\": 0.1, \"tier\": \"batch\", \"tenant\": \"zeta\", \"prompt_tokens\": 10, "
               "\"output_tokens\": 13}\n"
               "{\"t\": 0.1, \"tier\": \"interactive\", \"tenant\": \"acme\", \"prompt_tokens\": "
               "30, \"output_tokens\": 17}\n");
    const char *args[] = {
        "--url",          url_of(&s),     "--trace",      trace,     "--tenant-key",
        "acme=sk-acme",   "--tenant-key", "zeta=sk-zeta", "--model", "stub",
        "--no-calibrate", "--json",       tmp("r.json"),  NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    struct stub_line l[8];
    cr_assert_eq(stub_log(log, l, 8), 4);
    /* Arrival order at the server may differ from the trace's; match each line by its length. */
    static const struct {
        long out;
        const char *tier, *auth;
    } want[] = {{7, "interactive", "Bearer:sk-acme"},
                {11, "batch", "Bearer:sk-acme"},
                {13, "batch", "Bearer:sk-zeta"},
                {17, "interactive", "Bearer:sk-acme"}};
    for (int w = 0; w < 4; w++) {
        int found = 0;
        for (int i = 0; i < 4; i++)
            if (l[i].max_tokens == want[w].out) {
                found++;
                cr_assert_str_eq(l[i].tier, want[w].tier);
                cr_assert_str_eq(l[i].auth, want[w].auth);
            }
        cr_assert_eq(found, 1, "output_tokens %ld", want[w].out);
    }
    json_t *j = load_json(tmp("r.json"));
    json_t *classes = json_object_get(j, "classes");
    cr_assert_eq(jint(json_object_get(classes, "interactive@acme"), "completed"), 2);
    cr_assert_eq(jint(json_object_get(classes, "batch@acme"), "completed"), 1);
    cr_assert_eq(jint(json_object_get(classes, "batch@zeta"), "completed"), 1);
    cr_assert_eq(jint(j, "total_output_tokens"), 7 + 11 + 13 + 17);
    cr_assert_str_eq(json_string_value(json_object_get(j, "mode")), "trace");
    json_decref(j);
}

/* Runs chat, completions and a class without a prefix against the stub, with a 40-word prefix
 * (--no-calibrate: a word is a token) and 10 words of each request's own, shared or
 * (--unique-prefix) drawn per request. */
static void prefix_case(bool unique)
{
    make_tmp();
    struct server s;
    char log[128];
    snprintf(log, sizeof log, "%s", tmp("stub.log"));
    const char *sargs[] = {"--log", log, NULL};
    stub_start(&s, sargs);
    const char *args[] = {"--url",
                          url_of(&s),
                          "--model",
                          "stub",
                          "--no-calibrate",
                          "--concurrency",
                          "2",
                          "--num-requests",
                          "12",
                          "--shared-prefix-tokens",
                          "40",
                          "--prompt",
                          "10",
                          "--output",
                          "3",
                          "--class",
                          "chat,endpoint=chat",
                          "--class",
                          "text,endpoint=completions",
                          "--class",
                          "alone,endpoint=completions,shared_prefix=0",
                          "--json",
                          tmp("r.json"),
                          unique ? "--unique-prefix" : NULL,
                          NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    struct stub_line l[16];
    int n = stub_log(log, l, 16);
    cr_assert_eq(n, 12);
    json_t *j = load_json(tmp("r.json"));
    json_t *classes = json_object_get(j, "classes");
    long long want[3] = {0}; /* chat, text, alone */
    const char *name;
    json_t *b;
    json_object_foreach(classes, name, b)
    {
        long long prefix = jint(b, "shared_prefix_tokens");
        cr_assert_eq(prefix, strcmp(name, "alone") ? 40 : 0, "%s", name);
        want[!strcmp(name, "chat") ? 0 : !strcmp(name, "text") ? 1 : 2] += jint(b, "sent");
    }
    json_decref(j);
    long long got[3] = {0};
    unsigned chat_first[16];
    int n_chat = 0;
    for (int i = 0; i < n; i++) {
        bool chat = strstr(l[i].path, "/chat/") != NULL;
        cr_assert(l[i].words == 50 || (!chat && l[i].words == 10), "%s: words=%u", l[i].path,
                  l[i].words);
        got[chat ? 0 : l[i].words == 50 ? 1 : 2]++;
        if (chat)
            chat_first[n_chat++] = l[i].first;
    }
    for (int k = 0; k < 3; k++)
        cr_assert_eq(got[k], want[k], "class %d: %lld requests with its shape, %lld sent", k,
                     got[k], want[k]);
    cr_assert_geq(n_chat, 2, "the seed gives the chat class two requests or more");
    /* The chat's first message is the prefix: one text, or one per request. */
    for (int a = 0; a < n_chat; a++)
        for (int c = a + 1; c < n_chat; c++)
            cr_assert_eq(chat_first[a] == chat_first[c], !unique,
                         "system prompts %d and %d: %08x, %08x", a, c, chat_first[a],
                         chat_first[c]);
}

Test(loadgen, shared_prefix_words_come_before_each_prompts_own_when_asked)
{
    prefix_case(false);
}

Test(loadgen, prefix_words_differ_per_request_when_unique_prefix_is_asked)
{
    prefix_case(true);
}

Test(loadgen, bad_command_lines_exit_2_with_a_message)
{
    make_tmp();
    const char *a1[] = {"--class", "x,rate=fast", NULL};
    cr_assert_eq(bench(a1, output, sizeof output), 2);
    cr_assert(strstr(output, "class x: rate"), "%s", output);
    const char *a2[] = {"--url", "http://127.0.0.1:1", "--num-requests", "1", NULL};
    cr_assert_eq(bench(a2, output, sizeof output), 1, "an unreachable server is a failed run");
    cr_assert(strstr(output, "cannot reach http://127.0.0.1:1"), "%s", output);
}

Test(loadgen, plot_writes_charts_when_gnuplot_is_installed)
{
    make_tmp();
    const char *path = getenv("PATH");
    bool have = false;
    char probe[512];
    for (const char *p = path; p && *p && !have;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        snprintf(probe, sizeof probe, "%.*s/gnuplot", (int)n, p);
        have = access(probe, X_OK) == 0;
        p = colon ? colon + 1 : p + n;
    }
    if (!have)
        cr_skip_test("gnuplot is not installed (Debian: gnuplot-nox); --plot is optional");
    struct server s;
    const char *sargs[] = {"--statuses", "200,200,429", "--ttft-ms", "5", NULL};
    stub_start(&s, sargs);
    char *dir = tmp("plots");
    const char *args[] = {
        "--url",   url_of(&s), "--concurrency",  "2",       "--num-requests",
        "12",      "--class",  "a,weight=1",     "--class", "b,weight=1,endpoint=chat",
        "--model", "stub",     "--no-calibrate", "--plot",  dir,
        NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&s);
    struct stat st;
    char f[256];
    snprintf(f, sizeof f, "%s/latency_cdf.png", dir);
    cr_assert(stat(f, &st) == 0 && st.st_size > 1000, "%s", f);
    snprintf(f, sizeof f, "%s/timeseries.png", dir);
    cr_assert(stat(f, &st) == 0 && st.st_size > 1000, "%s", f);
}

/* ---------------------------------------------------------------------------------------------
 * The real sluice
 */

/* The value of a Prometheus sample line "NAME{LABELS} VALUE" in a /metrics body. */
static double metric_value(const char *body, const char *series)
{
    const char *p = strstr(body, series);
    cr_assert_not_null(p, "no %s in /metrics", series);
    return atof(p + strlen(series));
}

struct sums {
    long long out, prompt, rows;
    long long over_target;
};

static void sum_row(char **f, void *arg)
{
    struct sums *s = arg;
    cr_assert_str_eq(f[C_OUTCOME], "ok", "request %s: %s %s", f[C_ID], f[C_STATUS], f[C_ERROR]);
    cr_assert_eq(atoi(f[C_USAGE]), 1, "sluice reports usage in the last chunk");
    s->out += atoll(f[C_OTOK]);
    s->prompt += atoll(f[C_PTOK]);
    s->over_target += atoll(f[C_OTOK]) > atoll(f[C_OTARGET]);
    s->rows++;
}

Test(loadgen, counts_and_tokens_add_up_when_run_against_sluice)
{
    make_tmp();
    struct server srv;
    server_start(&srv, NULL);
    /* --no-calibrate and --model: no probes, so the server's counters hold only the run. */
    const char *args[] = {"--url",
                          url_of(&srv),
                          "--concurrency",
                          "4",
                          "--num-requests",
                          "24",
                          "--model",
                          "synthetic:tiny",
                          "--no-calibrate",
                          "--class",
                          "chat,endpoint=chat,prompt=uniform:4:24,output=uniform:2:12,weight=1",
                          "--class",
                          "text,prompt=fixed:16,output=fixed:8,weight=2",
                          "--json",
                          tmp("r.json"),
                          "--csv",
                          tmp("r.csv"),
                          NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    static char metrics[1 << 16];
    int st = client_try_request(srv.port, "GET", "/metrics", NULL, NULL, metrics, sizeof metrics);
    cr_assert_eq(st, 200);
    server_stop(&srv);
    json_t *j = load_json(tmp("r.json"));
    assert_counts_add_up(j, "all");
    cr_assert_eq(jint(j, "sent"), 24);
    cr_assert_eq(jint(j, "completed"), 24);
    json_t *classes = json_object_get(j, "classes");
    long long csent = 0, cout = 0, cin = 0;
    const char *name;
    json_t *b;
    json_object_foreach(classes, name, b)
    {
        assert_counts_add_up(b, name);
        csent += jint(b, "sent");
        cout += jint(b, "total_output_tokens");
        cin += jint(b, "total_input_tokens");
    }
    cr_assert_eq(csent, 24, "classes partition the requests");
    cr_assert_eq(cout, jint(j, "total_output_tokens"));
    cr_assert_eq(cin, jint(j, "total_input_tokens"));
    struct sums s = {0};
    cr_assert_eq(csv_rows(tmp("r.csv"), sum_row, &s), 24);
    cr_assert_eq(s.out, jint(j, "total_output_tokens"));
    cr_assert_eq(s.prompt, jint(j, "total_input_tokens"));
    cr_assert_eq(s.over_target, 0, "no request got more tokens than its max_tokens");
    /* The server counted the same tokens. */
    cr_assert_eq(
        (long long)metric_value(metrics, "sluice:generation_tokens_total{tenant=\"anonymous\"} "),
        jint(j, "total_output_tokens"));
    cr_assert_eq(
        (long long)metric_value(metrics, "sluice:prompt_tokens_total{tenant=\"anonymous\"} "),
        jint(j, "total_input_tokens"));
    cr_assert_eq(jint(j, "max_concurrency"), 4);
    cr_assert_leq(jint(j, "max_concurrent_requests"), 4);
    json_decref(j);
}

static void prompt_near_220(char **f, void *arg)
{
    (void)arg;
    cr_assert_str_eq(f[C_OUTCOME], "ok", "request %s: %s %s", f[C_ID], f[C_STATUS], f[C_ERROR]);
    long long t = atoll(f[C_PTOK]);
    cr_expect(t >= 198 && t <= 242, "request %s: %lld prompt tokens for 200 shared + 20", f[C_ID],
              t);
}

Test(loadgen, shared_prefix_tokens_match_the_servers_tokenizer_when_calibrated)
{
    make_tmp();
    struct server srv;
    server_start(&srv, NULL);
    const char *args[] = {"--url",
                          url_of(&srv),
                          "--concurrency",
                          "2",
                          "--num-requests",
                          "6",
                          "--shared-prefix-tokens",
                          "200",
                          "--prompt",
                          "20",
                          "--output",
                          "2",
                          "--class",
                          "chat,endpoint=chat",
                          "--class",
                          "text,endpoint=completions",
                          "--csv",
                          tmp("r.csv"),
                          "--json",
                          tmp("r.json"),
                          NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&srv);
    cr_assert_eq(csv_rows(tmp("r.csv"), prompt_near_220, NULL), 6);
    /* The prefix probes (and with two users, each class's earlier requests) leave the prefix in
     * sluice's cache, on by default: requests find it there, and their usage says so. */
    json_t *j = load_json(tmp("r.json"));
    cr_assert_gt(jint(j, "total_cached_input_tokens"), 0);
    cr_assert_lt(jint(j, "total_cached_input_tokens"), jint(j, "total_input_tokens"));
    json_decref(j);
}

#define GOOD_KEY "sk-bench-good-0123456789"

Test(loadgen, unauthorised_requests_are_rejected_by_status_when_the_key_is_wrong)
{
    make_tmp();
    /* The key's SHA-256 is computed here rather than trusted from a constant. */
    char cmd[256], sha[80] = {0};
    snprintf(cmd, sizeof cmd, "printf %%s '%s' | sha256sum", GOOD_KEY);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    cr_assert_not_null(fgets(sha, sizeof sha, p));
    pclose(p);
    sha[64] = '\0';
    char *cfg = tmp("tenants.json");
    char text[1024];
    snprintf(text, sizeof text,
             "{\"tenants\": [{\"name\": \"good\", \"key_sha256\": \"%s\", \"tiers\": "
             "[\"interactive\", \"batch\"], \"default_tier\": \"batch\"}]}",
             sha);
    write_file(cfg, text);
    struct server srv;
    const char *sargs[] = {"--config", cfg, NULL};
    server_start(&srv, sargs);
    const char *args[] = {"--url",
                          url_of(&srv),
                          "--concurrency",
                          "2",
                          "--num-requests",
                          "12",
                          "--model",
                          "synthetic:tiny",
                          "--no-calibrate",
                          "--output",
                          "4",
                          "--prompt",
                          "8",
                          "--class",
                          "good,key=" GOOD_KEY ",tier=interactive",
                          "--class",
                          "wrong,key=sk-not-a-tenant-key-000",
                          "--class",
                          "forbidden,key=" GOOD_KEY ",tier=nonesuch",
                          "--json",
                          tmp("r.json"),
                          NULL};
    cr_assert_eq(bench(args, output, sizeof output), 0, "%s", output);
    server_stop(&srv);
    json_t *j = load_json(tmp("r.json"));
    assert_counts_add_up(j, "all");
    json_t *c = json_object_get(j, "classes");
    json_t *good = json_object_get(c, "good"), *wrong = json_object_get(c, "wrong"),
           *forb = json_object_get(c, "forbidden");
    cr_assert_eq(jint(good, "completed"), jint(good, "sent"));
    cr_assert_eq(jrejected(wrong, "401"), jint(wrong, "sent"));
    cr_assert_eq(jrejected(forb, "400"), jint(forb, "sent"), "an unknown tier is a 400");
    cr_assert_eq(jint(wrong, "rejected_without_retry_after"), jint(wrong, "sent"),
                 "a 401 says nothing of retrying");
    cr_assert_eq(jint(j, "sent"), 12);
    cr_assert_eq(jrejected(j, "401") + jrejected(j, "400") + jint(j, "completed"), 12);
    json_decref(j);
    cr_assert(strstr(output, "HTTP 401"), "the first 401's message is shown:\n%s", output);
}
