/* Admission control on the real server: a batch flood next to interactive load, tenant budgets
 * answered 429 with their headers, parking (queue:MS) and its end when a client leaves, budgets
 * kept across SIGHUP, and several models routed by "model".
 *
 * Assertions are on counts, statuses, headers and the server's own /metrics. Where the property
 * is about time (interactive keeps its TTFT objective) the test reads the server's TTFT histogram
 * with a generous margin: 99 % of interactive requests within 2.5 times the objective. Clients
 * that are refused honour retry-after-ms (capped), as the OpenAI SDKs do: that shapes the load,
 * it synchronises nothing. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"

#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct server srv;
static char cfg_path[64];

static void write_config(const char *content)
{
    char tmp[80];
    snprintf(tmp, sizeof tmp, "%s.new", cfg_path);
    FILE *f = fopen(tmp, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(content, 1, strlen(content), f), strlen(content));
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(rename(tmp, cfg_path), 0);
}

static void start_with(const char *config)
{
    snprintf(cfg_path, sizeof cfg_path, "/tmp/sluice-admission-%d.json", (int)getpid());
    write_config(config);
    const char *args[] = {"--config", cfg_path, NULL};
    server_start(&srv, args);
}

static void stop(void)
{
    server_stop(&srv);
    unlink(cfg_path);
}

TestSuite(admission, .fini = stop, .timeout = 300);

/* The value of header `name` (any case) in a raw response, or NULL (static buffer). */
static const char *raw_header(const char *raw, const char *name)
{
    static _Thread_local char v[256]; /* client threads call it at once */
    size_t n = strlen(name);
    const char *end = strstr(raw, "\r\n\r\n");
    for (const char *p = strstr(raw, "\r\n"); p && (!end || p < end); p = strstr(p + 2, "\r\n")) {
        if (strncasecmp(p + 2, name, n) == 0 && p[2 + n] == ':') {
            const char *s = p + 3 + n;
            while (*s == ' ')
                s++;
            size_t l = strcspn(s, "\r");
            snprintf(v, sizeof v, "%.*s", (int)(l < sizeof v ? l : sizeof v - 1), s);
            return v;
        }
    }
    return NULL;
}

static char *scrape(void)
{
    char *out = malloc(1 << 20);
    int st = client_try_request(srv.port, "GET", "/metrics", NULL, NULL, out, 1 << 20);
    cr_assert_eq(st, 200);
    return out;
}

static bool sample(const char *body, const char *series, double *v)
{
    size_t n = strlen(series);
    for (const char *p = body; (p = strstr(p, series)); p += n)
        if ((p == body || p[-1] == '\n') && p[n] == ' ') {
            *v = strtod(p + n + 1, NULL);
            return true;
        }
    return false;
}

/* The value of the sample `series` in a scrape, which must be there: a renamed metric or label
 * fails here instead of reading as 0. */
static double metric(const char *body, const char *series)
{
    double v = 0;
    cr_assert(sample(body, series, &v), "no sample %s in the scrape:\n%s", series, body);
    return v;
}

/* A counter's sample: the server renders no label set that has not happened, so an absent one
 * is 0; but its family must be declared (a "# TYPE" line), so that a renamed counter fails. */
static double counter(const char *body, const char *series)
{
    char type[256];
    int n = (int)strcspn(series, "{");
    snprintf(type, sizeof type, "\n# TYPE %.*s counter\n", n, series);
    cr_assert(strstr(body, type), "no counter %.*s in the scrape:\n%s", n, series, body);
    double v = 0;
    sample(body, series, &v);
    return v;
}

/* ---- a batch flood next to interactive load ---- */

/* stories15M on CPU with 8 slots. Interactive: a 2 s TTFT objective (loose enough that the SLO
 * guard lets interactive requests in even under a sanitizer's tenfold slowdown). Batch: 8
 * running, 4 queued, 4 more waiting up to 300 ms for room, max_tokens cut to 8 when that makes
 * room, then 503 with Retry-After. */
static const char flood_config[] =
    "{\"model\":\"synthetic:stories15M\",\"max_seqs\":8,\"io_threads\":2,"
    "\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,\"ttft_slo_ms\":2000,"
    "\"tpot_slo_ms\":200},"
    "\"batch\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":3000,\"tpot_slo_ms\":1000,"
    "\"max_queue_requests\":4,\"overload\":[\"cap_max_tokens:8\",\"queue:300\",\"reject\"]}}}";

enum { BATCH_CLIENTS = 24, INTERACTIVE_CLIENTS = 2, INTERACTIVE_EACH = 10 };

struct tally {
    atomic_int ok, refused, refused_without_retry, incomplete, other, degraded;
    atomic_int status_other_code;
    char example[2048]; /* the first refusal without its retry headers */
};

static atomic_bool interactive_done;
static struct tally batch_t, inter_t;

/* One request; counts its outcome. Returns its retry-after-ms for a refusal, else 0. */
static long one(struct tally *t, const char *headers, const char *body, bool stream)
{
    char *raw = malloc(1 << 18);
    int st = client_try_request(srv.port, "POST", "/v1/completions", headers, body, raw, 1 << 18);
    long retry = 0;
    if (st == 200) {
        /* Accepted means completed: a finish reason, and for a stream its end. */
        bool done = strstr(raw, "\"finish_reason\":\"length\"") ||
                    strstr(raw, "\"finish_reason\":\"stop\"");
        if (!done || (stream && !strstr(raw, "data: [DONE]")))
            atomic_fetch_add(&t->incomplete, 1);
        else
            atomic_fetch_add(&t->ok, 1);
        const char *adm = raw_header(raw, "x-sluice-admission");
        if (adm && strncmp(adm, "degraded", 8) == 0)
            atomic_fetch_add(&t->degraded, 1);
    } else if (st == 429 || st == 503) {
        atomic_fetch_add(&t->refused, 1);
        const char *v = raw_header(raw, "retry-after");
        bool good = v && atoi(v) >= 1;
        v = raw_header(raw, "x-sluice-admission");
        good = good && v && strncmp(v, "rejected; reason=", 17) == 0;
        v = raw_header(raw, "retry-after-ms");
        if (!good || !v) {
            if (atomic_fetch_add(&t->refused_without_retry, 1) == 0)
                snprintf(t->example, sizeof t->example, "%s", raw);
        } else {
            retry = atol(v);
        }
    } else {
        atomic_fetch_add(&t->other, 1);
        atomic_store(&t->status_other_code, st);
    }
    free(raw);
    return retry;
}

static void *batch_client(void *arg)
{
    (void)arg;
    static const char body[] =
        "{\"prompt\":\"The quick brown fox jumps over the lazy dog while the batch job keeps "
        "on summarising everything it reads\",\"max_tokens\":48,\"temperature\":0}";
    while (!atomic_load(&interactive_done)) {
        long retry = one(&batch_t, "x-sluice-tier: batch\r\n", body, false);
        /* A client that is told when to come back does (the OpenAI SDKs honour retry-after-ms);
         * capped so that the flood goes on as long as the interactive load. */
        if (retry > 0) {
            struct timespec ts = {0, (retry > 500 ? 500 : retry) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static void *interactive_client(void *arg)
{
    (void)arg;
    static const char body[] = "{\"prompt\":\"Hello there\",\"max_tokens\":16,\"stream\":true,"
                               "\"temperature\":0}";
    for (int i = 0; i < INTERACTIVE_EACH; i++)
        one(&inter_t, "x-sluice-tier: interactive\r\n", body, true);
    return NULL;
}

/* The server writes an access-log line per request to the pipe the harness reads; a flood of
 * refusals would fill the pipe and block the server if nobody read it. */
static atomic_bool log_drain_stop;

static void *log_drain(void *arg)
{
    (void)arg;
    char buf[65536];
    while (!atomic_load(&log_drain_stop)) {
        struct pollfd p = {.fd = srv.err_fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0 && read(srv.err_fd, buf, sizeof buf) <= 0)
            break;
    }
    return NULL;
}

Test(admission, interactive_keeps_its_objective_and_batch_is_told_when_batch_floods)
{
    start_with(flood_config);
    atomic_store(&log_drain_stop, false);
    pthread_t drain;
    cr_assert_eq(pthread_create(&drain, NULL, log_drain, NULL), 0);
    memset(&batch_t, 0, sizeof batch_t);
    memset(&inter_t, 0, sizeof inter_t);
    atomic_store(&interactive_done, false);
    pthread_t b[BATCH_CLIENTS], in[INTERACTIVE_CLIENTS];
    for (int i = 0; i < BATCH_CLIENTS; i++)
        cr_assert_eq(pthread_create(&b[i], NULL, batch_client, NULL), 0);
    /* The flood is on when every slot is taken and the batch queue is full; then interactive
     * load starts, and the flood lasts until it is done. */
    for (int tries = 0;; tries++) {
        char *m = scrape();
        double running = metric(m, "sluice:num_requests_running{tier=\"batch\"}");
        double refused = counter(m, "sluice:admission_decisions_total{tier=\"batch\","
                                    "decision=\"rejected\",reason=\"tier_queue_requests\"}");
        free(m);
        if (running >= 8 && refused > 0)
            break;
        cr_assert_lt(tries, 100000, "the flood never filled the slots");
    }
    for (int i = 0; i < INTERACTIVE_CLIENTS; i++)
        cr_assert_eq(pthread_create(&in[i], NULL, interactive_client, NULL), 0);
    for (int i = 0; i < INTERACTIVE_CLIENTS; i++)
        pthread_join(in[i], NULL);
    atomic_store(&interactive_done, true);
    for (int i = 0; i < BATCH_CLIENTS; i++)
        pthread_join(b[i], NULL);

    int b_ok = atomic_load(&batch_t.ok), b_ref = atomic_load(&batch_t.refused);
    cr_log_info("flood: batch %d completed (%d degraded), %d refused; interactive %d completed, "
                "%d refused",
                b_ok, atomic_load(&batch_t.degraded), b_ref, atomic_load(&inter_t.ok),
                atomic_load(&inter_t.refused));
    /* Interactive: served and complete, nothing else. In a normal build the 2 s objective holds
     * with room to spare, so at least three in four are served. A sanitizer's build runs several
     * times slower, and more so beside the suite's other tests: the guard then rightly refuses
     * those it predicts late, each with its Retry-After (checked below), so there only some
     * must be served (a CI run with the integration tests in parallel: 10 of 20; alone 20). */
    int inter_n = INTERACTIVE_CLIENTS * INTERACTIVE_EACH;
    cr_assert_eq(atomic_load(&inter_t.ok) + atomic_load(&inter_t.refused), inter_n);
    cr_assert_geq(atomic_load(&inter_t.ok), sanitized_build() ? 1 : inter_n * 3 / 4);
    cr_assert_eq(atomic_load(&inter_t.refused_without_retry), 0, "for example:\n%s",
                 inter_t.example);
    cr_assert_eq(atomic_load(&inter_t.incomplete) + atomic_load(&inter_t.other), 0);
    /* Batch: refused with Retry-After, or served to the end; nothing else, nothing lost. */
    cr_assert_gt(b_ref, 0, "a flood at three times the slots is refused in part");
    cr_assert_gt(b_ok, 0);
    cr_assert_eq(atomic_load(&batch_t.refused_without_retry), 0, "for example:\n%s",
                 batch_t.example);
    cr_assert_eq(atomic_load(&batch_t.incomplete), 0, "every accepted request completes");
    cr_assert_eq(atomic_load(&batch_t.other), 0, "status %d",
                 atomic_load(&batch_t.status_other_code));

    /* The server agrees: every request it admitted finished, none errored or was cancelled. */
    char *m = scrape();
    double fin = counter(m, "sluice:requests_total{tier=\"batch\",tenant=\"anonymous\","
                            "outcome=\"length\"}") +
                 counter(m, "sluice:requests_total{tier=\"batch\",tenant=\"anonymous\","
                            "outcome=\"stop\"}");
    double rej = counter(m, "sluice:requests_total{tier=\"batch\",tenant=\"anonymous\","
                            "outcome=\"rejected\"}");
    cr_assert_eq((int)fin, b_ok, "server finished %.0f, clients got %d", fin, b_ok);
    cr_assert_eq((int)rej, b_ref);
    cr_assert(!strstr(m, "outcome=\"error\"") && !strstr(m, "outcome=\"cancelled\""), "%s", m);
    double adm_rej = 0;
    static const char *const reasons[] = {"tier_queue_requests", "tier_queue_tokens",
                                          "tier_ttft_slo", "tier_token_rate"};
    for (int i = 0; i < 4; i++) {
        char series[160];
        snprintf(series, sizeof series,
                 "sluice:admission_decisions_total{tier=\"batch\",decision=\"rejected\","
                 "reason=\"%s\"}",
                 reasons[i]);
        adm_rej += counter(m, series);
    }
    cr_assert_eq((int)adm_rej, b_ref, "each refusal counted by tier and reason");
    /* Interactive TTFT from the server's histogram: 99 % within 5 s, 2.5x the objective. */
    double count = metric(m, "sluice:time_to_first_token_seconds_count{tier=\"interactive\"}");
    double within = metric(m, "sluice:time_to_first_token_seconds_bucket{tier=\"interactive\","
                              "le=\"5\"}");
    double within_slo =
        metric(m, "sluice:time_to_first_token_seconds_bucket{tier=\"interactive\",le=\"1\"}");
    cr_log_info("interactive TTFT: %.0f of %.0f within 1 s, %.0f within 5 s", within_slo, count,
                within);
    cr_assert_eq((int)count, atomic_load(&inter_t.ok));
    cr_assert_geq(within, 0.99 * count);
    free(m);
    atomic_store(&log_drain_stop, true);
    pthread_join(drain, NULL);
}

/* ---- tenants ---- */

/* This test is about tenant budgets: the SLO guard must not refuse the polite tenant's requests
 * when the host stalls a step. */
static const char tenants_config[] =
    "{" HARNESS_TIERS_WITHOUT_GUARD ",\"tenants\":[{\"name\":\"greedy\",\"key_sha256\":\"" ALICE_SHA
    "\",\"tiers\":"
    "[\"interactive\"],\"default_tier\":\"interactive\",\"rpm\":4,\"tpm\":100000},"
    "{\"name\":\"polite\",\"key_sha256\":\"" BOB_SHA "\",\"tiers\":[\"interactive\"],"
    "\"default_tier\":\"interactive\"}]}";

struct tenant_run {
    const char *auth;
    int n;
    int ok, limited, limited_with_headers, admitted_plain;
    double worst_ms;
};

static void *tenant_client(void *arg)
{
    struct tenant_run *r = arg;
    static const char body[] = "{\"prompt\":\"Hello\",\"max_tokens\":8}";
    char *raw = malloc(1 << 16);
    for (int i = 0; i < r->n; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int st =
            client_try_request(srv.port, "POST", "/v1/completions", r->auth, body, raw, 1 << 16);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (ms > r->worst_ms)
            r->worst_ms = ms;
        char adm_buf[128];
        const char *adm = raw_header(raw, "x-sluice-admission");
        if (adm) {
            snprintf(adm_buf, sizeof adm_buf, "%s", adm);
            adm = adm_buf;
        }
        if (st == 200) {
            r->ok++;
            r->admitted_plain += adm && strcmp(adm, "admitted") == 0;
        } else if (st == 429) {
            r->limited++;
            /* raw_header's buffer is reused: compare each value as it comes. */
            bool good = adm && strcmp(adm, "rejected; reason=tenant_requests") == 0;
            const char *v = raw_header(raw, "x-ratelimit-reset-requests");
            good = good && v && strchr(v, 's'); /* "14.9s" */
            v = raw_header(raw, "x-ratelimit-remaining-requests");
            good = good && v && strcmp(v, "0") == 0;
            v = raw_header(raw, "x-ratelimit-limit-requests");
            good = good && v && strcmp(v, "4") == 0;
            good = good && strstr(raw, "\"code\":\"rate_limit_exceeded\"") &&
                   raw_header(raw, "retry-after") && raw_header(raw, "retry-after-ms") &&
                   raw_header(raw, "x-ratelimit-limit-tokens");
            r->limited_with_headers += good;
        }
    }
    free(raw);
    return NULL;
}

Test(admission, tenant_over_budget_gets_429_and_another_is_admitted_unqueued_when_both_send)
{
    start_with(tenants_config);
    struct tenant_run greedy = {.auth = AUTH(ALICE), .n = 40},
                      polite = {.auth = AUTH(BOB), .n = 20};
    pthread_t a, b;
    cr_assert_eq(pthread_create(&a, NULL, tenant_client, &greedy), 0);
    cr_assert_eq(pthread_create(&b, NULL, tenant_client, &polite), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    cr_log_info("greedy: %d ok, %d limited; polite: %d ok, slowest %.1f ms", greedy.ok,
                greedy.limited, polite.ok, polite.worst_ms);
    /* 4 a minute, all at once; the rest 429 with every header (the run is far shorter than the
     * 15 s the next request takes to come back). */
    cr_assert_eq(greedy.ok, 4);
    cr_assert_eq(greedy.limited, 36);
    cr_assert_eq(greedy.limited_with_headers, 36);
    /* The other tenant: every request admitted as it came (not queued, not degraded), none
     * refused. How long each took is logged above, not asserted: timing lives in bench/. */
    cr_assert_eq(polite.ok, 20);
    cr_assert_eq(polite.admitted_plain, 20);
    /* The server agrees, and the refused requests never reached the engine: the greedy tenant's
     * prompt tokens are those of its 4 admitted requests, a fifth of the polite one's 20 (the
     * same body). */
    char *m = scrape();
    cr_assert_eq(counter(m, "sluice:admission_decisions_total{tier=\"interactive\","
                            "decision=\"admitted\",reason=\"none\"}"),
                 24);
    cr_assert_eq(counter(m, "sluice:admission_decisions_total{tier=\"interactive\","
                            "decision=\"rejected\",reason=\"tenant_requests\"}"),
                 36);
    cr_assert(!strstr(m, "decision=\"degraded\""), "%s", m);
    double greedy_prompt = metric(m, "sluice:prompt_tokens_total{tenant=\"greedy\"}");
    double polite_prompt = metric(m, "sluice:prompt_tokens_total{tenant=\"polite\"}");
    cr_assert_gt(greedy_prompt, 0);
    cr_assert_eq(greedy_prompt * 5, polite_prompt, "greedy %.0f, polite %.0f prompt tokens",
                 greedy_prompt, polite_prompt);
    free(m);
    /* A response of a tenant without limits has no rate headers; one with limits always has. */
    char raw[8192];
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/v1/models", AUTH(BOB), NULL, raw, sizeof raw), 200);
    cr_assert_null(raw_header(raw, "x-ratelimit-limit-requests"));
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/v1/models", AUTH(ALICE), NULL, raw, sizeof raw), 200);
    cr_assert_str_eq(raw_header(raw, "x-ratelimit-limit-requests"), "4");
    cr_assert_str_eq(raw_header(raw, "x-ratelimit-remaining-requests"), "0");
    cr_assert_not_null(raw_header(raw, "x-ratelimit-remaining-tokens"));
    /* The access log says what admission did. */
    server_wait_log(&srv, "\"admission\":\"rejected; reason=tenant_requests\"");
    server_wait_log(&srv, "\"tenant\":\"polite\",\"tier\":\"interactive\",\"admission\":"
                          "\"admitted\"");
}

static const char *const reload_outcomes[] = {"SIGHUP: configuration reloaded",
                                              "SIGHUP: configuration refused", NULL};

Test(admission, tenant_budget_survives_a_reload_when_the_tenant_stays)
{
    /* 2 a minute: the test ends long before the 30 s a token takes to come back. */
    static const char two[] =
        "{\"tenants\":[{\"name\":\"greedy\",\"key_sha256\":\"" ALICE_SHA "\",\"tiers\":"
        "[\"interactive\"],\"default_tier\":\"interactive\",\"rpm\":2}]}";
    static const char four[] =
        "{\"tenants\":[{\"name\":\"greedy\",\"key_sha256\":\"" ALICE_SHA "\",\"tiers\":"
        "[\"interactive\"],\"default_tier\":\"interactive\",\"rpm\":4}]}";
    start_with(two);
    static const char body[] = "{\"prompt\":\"Hello\",\"max_tokens\":2}";
    char raw[8192];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", AUTH(ALICE), body, raw,
                                        sizeof raw),
                     200);
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/v1/completions", AUTH(ALICE), body, raw, sizeof raw),
        429);
    /* The same file again: the bucket stays empty. */
    server_log_clear(&srv);
    cr_assert_eq(kill(srv.pid, SIGHUP), 0);
    cr_assert_eq(server_wait_log_any(&srv, reload_outcomes), 0);
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/v1/completions", AUTH(ALICE), body, raw, sizeof raw),
        429);
    /* Twice the rate: the 2 tokens it is short stay short, 2 of the new 4 are there. */
    write_config(four);
    server_log_clear(&srv);
    cr_assert_eq(kill(srv.pid, SIGHUP), 0);
    cr_assert_eq(server_wait_log_any(&srv, reload_outcomes), 0);
    int ok = 0;
    for (int i = 0; i < 4; i++)
        ok += client_try_request(srv.port, "POST", "/v1/completions", AUTH(ALICE), body, raw,
                                 sizeof raw) == 200;
    cr_assert_eq(ok, 2);
    cr_assert_str_eq(raw_header(raw, "x-ratelimit-limit-requests"), "4");
}

/* ---- parking ---- */

/* A tier whose bucket admits 20 tokens a second, 20 at once, and parks what does not fit for up
 * to 10 s. A request of n prompt tokens and 20 - n max_tokens empties it; the next, sent when
 * the first has ended (having used n + g >= n + 1 tokens), waits (n + g) x 50 ms for the rest. */
/* The slow tier's bucket holds 20 tokens and refills at `rate` a second; a request that costs all
 * 20 right after another one waits 20 / rate seconds, parked (queue:60000). The refill time is
 * the window in which the second request must arrive to be parked: 4 s when the test needs the
 * refill, 20 s when it only needs the parking (a loaded host with a sanitizer can take a second
 * between two requests). */
#define PARK_CONFIG(rate)                                                                          \
    "{\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,\"ttft_slo_ms\":1000,"               \
    "\"tpot_slo_ms\":100},\"slow\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":60000,"            \
    "\"tpot_slo_ms\":1000,\"token_rate\":" #rate ",\"burst\":20,\"overload\":[\"queue:60000\","    \
    "\"reject\"]}}}"

#define SLOW "x-sluice-tier: slow\r\n"

/* A body that costs `cost` of the bucket: the prompt's tokens found with a probe in another
 * tier. */
static void cost_body(char *body, size_t len, int cost)
{
    char raw[8192];
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", NULL,
                                    "{\"prompt\":\"Hello\",\"max_tokens\":1}", raw, sizeof raw),
                 200);
    const char *p = strstr(raw, "\"prompt_tokens\":");
    cr_assert_not_null(p, "%s", raw);
    int n = atoi(p + 16);
    cr_assert(n > 0 && n < cost, "%d prompt tokens", n);
    snprintf(body, len, "{\"prompt\":\"Hello\",\"max_tokens\":%d,\"temperature\":0}", cost - n);
}

/* A body that costs the whole bucket. */
static void full_cost_body(char *body, size_t len)
{
    cost_body(body, len, 20);
}

static double parked_now(void)
{
    char *m = scrape();
    double v = metric(m, "sluice:admission_parked_requests{tier=\"slow\"}");
    free(m);
    return v;
}

Test(admission, parked_request_is_admitted_when_the_bucket_refills)
{
    start_with(PARK_CONFIG(5));
    char body[128], raw[8192];
    full_cost_body(body, sizeof body);
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/v1/completions", SLOW, body, raw, sizeof raw), 200);
    cr_assert_str_eq(raw_header(raw, "x-sluice-admission"), "admitted");
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/v1/completions", SLOW, body, raw, sizeof raw), 200);
    const char *adm = raw_header(raw, "x-sluice-admission");
    cr_assert(strncmp(adm, "degraded; queued_ms=", 20) == 0, "%s", adm);
    cr_assert(strstr(raw, "\"finish_reason\""), "and it ran: %s", raw);
    cr_assert_eq(parked_now(), 0);
    server_wait_log(&srv, "\"tier\":\"slow\",\"admission\":\"degraded; queued_ms=");
}

Test(admission, parked_request_is_released_when_its_client_leaves)
{
    /* The first request takes half the bucket, at most (what it did not use comes back); the
     * second, costing all of it, is parked; its client leaves. The bucket then holds at least
     * the half the first one left: a third request of half the cost is admitted at once, unless
     * the parked one was charged. The first one's tokens come back at 1 a second: the second
     * must arrive within as many seconds as it used (10 here) to be parked. */
    start_with(PARK_CONFIG(1));
    char half[128], body[128], raw[8192];
    cost_body(half, sizeof half, 10);
    full_cost_body(body, sizeof body);
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/v1/completions", SLOW, half, raw, sizeof raw), 200);
    cr_assert_str_eq(raw_header(raw, "x-sluice-admission"), "admitted");
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", SLOW, body, false);
    /* Parked (the gauge says so); then its client hangs up. */
    for (int tries = 0; parked_now() < 1; tries++) {
        /* A poll interval, so that a failure ends in seconds without using up the ports. */
        cr_assert_lt(tries, 5000, "the request was never parked");
        poll(NULL, 0, 2);
    }
    close(fd);
    server_wait_log(&srv, "\"status\":499,\"tenant\":\"anonymous\",\"tier\":\"slow\","
                          "\"admission\":\"queued\"");
    cr_assert_eq(parked_now(), 0, "its place is free again");
    /* And the bucket was not charged for it: the other half is still there. */
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/v1/completions", SLOW, half, raw, sizeof raw), 200);
    cr_assert_str_eq(raw_header(raw, "x-sluice-admission"), "admitted");
    char *m = scrape();
    cr_assert_eq(counter(m, "sluice:requests_total{tier=\"slow\",tenant=\"anonymous\","
                            "outcome=\"cancelled\"}"),
                 1);
    free(m);
}

/* ---- models ---- */

static const char models_config[] =
    "{\"models\":[{\"name\":\"big\",\"model\":\"synthetic:tiny\"},{\"name\":\"small\","
    "\"model\":\"synthetic:tiny\",\"threads\":1}],"
    "\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,\"ttft_slo_ms\":1000,"
    "\"tpot_slo_ms\":100},\"closed\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":60000,"
    "\"tpot_slo_ms\":1000,\"max_queue_requests\":0,\"overload_status\":429}}}";

Test(admission, requests_run_on_the_model_they_name_when_several_are_served)
{
    start_with(models_config);
    char raw[16384];
    cr_assert_eq(client_try_request(srv.port, "GET", "/v1/models", NULL, NULL, raw, sizeof raw),
                 200);
    cr_assert(strstr(raw, "\"id\":\"big\"") && strstr(raw, "\"id\":\"small\""), "%s", raw);
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", NULL,
                                    "{\"prompt\":\"Hi\",\"max_tokens\":3,\"model\":\"small\"}", raw,
                                    sizeof raw),
                 200);
    cr_assert(strstr(raw, "\"model\":\"small\""), "%s", raw);
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", NULL,
                                    "{\"prompt\":\"Hi\",\"max_tokens\":3}", raw, sizeof raw),
                 200);
    cr_assert(strstr(raw, "\"model\":\"big\""), "the first is the default: %s", raw);
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", NULL,
                                    "{\"prompt\":\"Hi\",\"max_tokens\":3,\"model\":\"huge\"}", raw,
                                    sizeof raw),
                 404);
    cr_assert(strstr(raw, "\"code\":\"model_not_found\""), "%s", raw);
    /* A closed tier answers as configured: 429, server_is_overloaded, with Retry-After. */
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions",
                                    "x-sluice-tier: closed\r\n",
                                    "{\"prompt\":\"Hi\",\"max_tokens\":3}", raw, sizeof raw),
                 429);
    cr_assert(strstr(raw, "\"code\":\"server_is_overloaded\""), "%s", raw);
    cr_assert_str_eq(raw_header(raw, "retry-after"), "1");
    cr_assert_str_eq(raw_header(raw, "x-sluice-admission"), "rejected; reason=tier_queue_requests");
    /* Each model's scheduler has its gauges, labelled by model. */
    char *m = scrape();
    cr_assert(strstr(m, "sluice:num_requests_running{model=\"small\",tier=\"interactive\"} "), "%s",
              m);
    cr_assert(strstr(m, "sluice:scheduler_steps_total{model=\"big\"} "), "%s", m);
    free(m);
}

/* No classify rule reads the body: a closed tier's refusal is decided on the head alone. */
static const char head_only_config[] =
    "{\"tiers\":{\"open\":{\"priority\":0,\"weight\":1,\"ttft_slo_ms\":1000,\"tpot_slo_ms\":100},"
    "\"closed\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":1000,\"tpot_slo_ms\":100,"
    "\"max_queue_requests\":0,\"overload_status\":429}},"
    "\"classify\":[{\"header\":\"x-sluice-tier\"},{\"tenant_default\":true}]}";

Test(admission, closed_tier_refuses_on_the_head_when_no_rule_reads_the_body)
{
    start_with(head_only_config);
    char raw[8192];
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions",
                                    "x-sluice-tier: closed\r\n",
                                    "{\"prompt\":\"Hi\",\"max_tokens\":3}", raw, sizeof raw),
                 429);
    cr_assert_str_eq(raw_header(raw, "x-sluice-admission"), "rejected; reason=tier_queue_requests");
    cr_assert_str_eq(raw_header(raw, "retry-after"), "1");
    cr_assert_str_eq(raw_header(raw, "x-sluice-tier"), "closed");
    /* Refused before it was read: what the body says does not matter to a tier that takes
     * nothing. */
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions",
                                    "x-sluice-tier: closed\r\n", "{not json", raw, sizeof raw),
                 429);
    /* The open tier reads the body as ever: a bad one is a 400, a good one is served. */
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/v1/completions", NULL, "{not json", raw, sizeof raw),
        400);
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", NULL,
                                    "{\"prompt\":\"Hi\",\"max_tokens\":3}", raw, sizeof raw),
                 200);
    cr_assert_str_eq(raw_header(raw, "x-sluice-admission"), "admitted");
    char *m = scrape();
    cr_assert_eq(counter(m,
                         "sluice:admission_decisions_total{tier=\"closed\",decision=\"rejected\","
                         "reason=\"tier_queue_requests\"}"),
                 2);
    cr_assert_eq(counter(m, "sluice:requests_total{tier=\"closed\",tenant=\"anonymous\","
                            "outcome=\"rejected\"}"),
                 2);
    free(m);
    server_wait_log(&srv,
                    "\"tier\":\"closed\",\"admission\":\"rejected; reason=tier_queue_requests\"");
}
