/* SLO attainment on the real server (issue 30): sluice:slo_requests_total and
 * sluice:goodput_requests_total on /metrics, GET /admin/slo behind the admin key, and the access
 * log's ttft_met and tpot_met, for requests whose verdicts are known in advance.
 *
 * No assertion depends on how fast the host is. The server is the fault-injection build
 * (SLUICE_FAULT_BIN) whose every forward call sleeps 5 ms first (SLUICE_FAULT_FORWARD_MS), so a
 * first token takes at least 5 ms: a tier whose TTFT objective is 1 ms misses it every time. The
 * other objectives are 10 minutes, which no request of a few tokens comes near. Forward call 1
 * fails (SLUICE_FAULT_FORWARD), so the first request is a failure, known to be one. Requests go
 * one at a time, each answered before the next is sent, so the SLO guard never sees a prompt
 * queued ahead (with none it admits whatever its prediction). The counts are read from the 60m
 * window, which holds every request of a test that the suite's timeout allows. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"
#include "slo_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* relaxed: objectives of 10 minutes, always met. strict: a TTFT of 1 ms, never met here (every
 * step takes 5 ms or more). capped: relaxed objectives, and a token bucket of 20 whose overload
 * policy caps max_tokens at 2 rather than refuse. carol may send one request a minute. */
#define CONFIG                                                                                     \
    "{\"threads\":1,\"admin_key_sha256\":\"" ADMIN_SHA "\",\"tiers\":{"                            \
    "\"relaxed\":{\"priority\":0,\"weight\":1,\"ttft_slo_ms\":600000,\"tpot_slo_ms\":600000},"     \
    "\"strict\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":1,\"tpot_slo_ms\":600000},"           \
    "\"capped\":{\"priority\":2,\"weight\":1,\"ttft_slo_ms\":600000,\"tpot_slo_ms\":600000,"       \
    "\"token_rate\":1,\"burst\":20,\"overload\":[\"cap_max_tokens:2\",\"reject\"]}},"              \
    "\"tenants\":[{\"name\":\"alice\",\"key_sha256\":\"" ALICE_SHA "\",\"tiers\":[\"relaxed\","    \
    "\"capped\"],\"default_tier\":\"relaxed\"},{\"name\":\"bob\",\"key_sha256\":\"" BOB_SHA        \
    "\",\"tiers\":[\"strict\"],\"default_tier\":\"strict\"},{\"name\":\"carol\",\"key_sha256\":"   \
    "\"" CAROL_SHA "\",\"tiers\":[\"relaxed\"],\"default_tier\":\"relaxed\",\"rpm\":1}]}"

static struct server srv;

static void stop(void)
{
    server_stop(&srv);
}

TestSuite(slo, .fini = stop, .timeout = 300);

static void start(void)
{
    const char *bin = getenv("SLUICE_FAULT_BIN");
    cr_assert_not_null(bin, "SLUICE_FAULT_BIN is not set (run through meson test)");
    cr_assert_eq(setenv("SLUICE_FAULT_FORWARD", "1", 1), 0);
    cr_assert_eq(setenv("SLUICE_FAULT_FORWARD_MS", "5", 1), 0);
    server_start_bin_config(&srv, bin, CONFIG);
    unsetenv("SLUICE_FAULT_FORWARD");
    unsetenv("SLUICE_FAULT_FORWARD_MS");
}

static char raw[1 << 17];

/* POST /v1/completions as `headers` say, with max_tokens tokens exactly (ignore_eos). */
static int complete(const char *headers, int max_tokens, bool stream)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Hi\",\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0%s}",
             max_tokens, stream ? ",\"stream\":true" : "");
    return client_try_request(srv.port, "POST", "/v1/completions", headers, body, raw, sizeof raw);
}

/* The value of one exact series of a /metrics text ("name{labels}"), or -1 when absent. */
static double series(const char *text, const char *s)
{
    char line[512];
    snprintf(line, sizeof line, "\n%s ", s);
    const char *p = strstr(text, line);
    return p ? strtod(p + strlen(line), NULL) : -1;
}

static json_t *get_slo(void)
{
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/admin/slo", AUTH(ADMIN), NULL, raw, sizeof raw), 200,
        "%s", raw);
    const char *body = strstr(raw, "\r\n\r\n");
    cr_assert_not_null(body);
    json_error_t e;
    json_t *j = json_loads(body + 4, 0, &e);
    cr_assert_not_null(j, "%s: %s", e.text, body + 4);
    return j;
}

static long long field(json_t *w, const char *k)
{
    json_t *v = json_object_get(w, k);
    cr_assert(json_is_integer(v), "%s is an integer", k);
    return json_integer_value(v);
}

/* What one (tier, tenant) must show: counted and met per objective. */
struct expect {
    const char *tier, *tenant;
    int ttft, ttft_met, tpot, tpot_met, both, both_met;
};

static void check_series(const char *metrics, json_t *slo, const struct expect *e)
{
    static const char *const obj[3] = {"ttft", "tpot", "both"};
    const int counted[3] = {e->ttft, e->tpot, e->both},
              met[3] = {e->ttft_met, e->tpot_met, e->both_met};
    char s[256];
    for (int o = 0; o < 3; o++)
        for (int m = 0; m < 2; m++) {
            snprintf(s, sizeof s,
                     "sluice:slo_requests_total{tier=\"%s\",tenant=\"%s\",objective=\"%s\","
                     "met=\"%s\"}",
                     e->tier, e->tenant, obj[o], m ? "true" : "false");
            double want = counted[o] == 0 ? -1 : m ? met[o] : counted[o] - met[o];
            cr_assert_eq(series(metrics, s), want, "%s\n%s", s, metrics);
        }
    json_t *w = slo_json_window(slo, e->tier, e->tenant, "60m");
    cr_assert_not_null(w, "%s/%s in /admin/slo", e->tier, e->tenant);
    cr_assert_eq(field(w, "requests"), e->both, "%s/%s", e->tier, e->tenant);
    cr_assert_eq(field(w, "ttft_requests"), e->ttft);
    cr_assert_eq(field(w, "ttft_met"), e->ttft_met);
    cr_assert_eq(field(w, "tpot_requests"), e->tpot);
    cr_assert_eq(field(w, "tpot_met"), e->tpot_met);
    cr_assert_eq(field(w, "both_met"), e->both_met);
    cr_assert_float_eq(json_number_value(json_object_get(w, "attainment")),
                       (double)e->both_met / e->both, 1e-6);
    /* The shorter windows hold no more than the longer ones. */
    json_t *w1 = slo_json_window(slo, e->tier, e->tenant, "1m"),
           *w5 = slo_json_window(slo, e->tier, e->tenant, "5m");
    cr_assert_leq(field(w1, "requests"), field(w5, "requests"));
    cr_assert_leq(field(w5, "requests"), field(w, "requests"));
}

Test(slo, counters_admin_slo_and_access_log_agree_with_the_known_verdicts)
{
    start();
    /* alice, relaxed: the first forward call fails; then two of 4 tokens (one streamed) and one
     * of a single token, which has no TPOT. */
    cr_assert_eq(complete(AUTH(ALICE), 4, false), 500, "%s", raw);
    cr_assert_eq(complete(AUTH(ALICE), 4, false), 200, "%s", raw);
    cr_assert_eq(complete(AUTH(ALICE), 4, true), 200, "%s", raw);
    cr_assert_eq(complete(AUTH(ALICE), 1, false), 200, "%s", raw);
    /* bob, strict: TTFT missed, with and without a TPOT. */
    cr_assert_eq(complete(AUTH(BOB), 4, false), 200, "%s", raw);
    cr_assert_eq(complete(AUTH(BOB), 1, false), 200, "%s", raw);
    /* alice, capped: 30 tokens do not fit the bucket of 20, 2 do: degraded, and met. */
    cr_assert_eq(complete(AUTH(ALICE) "x-sluice-tier: capped\r\n", 30, false), 200, "%s", raw);
    cr_assert(strstr(raw, "x-sluice-admission: degraded; cap_max_tokens=2"), "%s", raw);
    /* carol: one request, then her second in the minute is refused. */
    cr_assert_eq(complete(AUTH(CAROL), 2, false), 200, "%s", raw);
    cr_assert_eq(complete(AUTH(CAROL), 2, false), 429, "%s", raw);
    /* bob again, a stream whose client leaves: a cancelled request counts nowhere. */
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(BOB),
                     "{\"prompt\":\"Hi\",\"max_tokens\":500,\"ignore_eos\":true,\"stream\":true}",
                     true);
    char buf[4096];
    cr_assert(client_read_until(fd, "data: ", buf, sizeof buf), "the stream started");
    close(fd);
    server_wait_log(&srv, "\"status\":499");

    /* The access log says how each went. */
    server_wait_log(&srv, "\"finish\":\"error\",\"ttft_met\":false,\"tpot_met\":false");
    server_wait_log(&srv, "\"ttft_met\":true,\"tpot_met\":true");
    server_wait_log(&srv, "\"ttft_met\":true,\"tpot_met\":null");
    server_wait_log(&srv, "\"ttft_met\":false,\"tpot_met\":true");
    server_wait_log(&srv, "\"ttft_met\":false,\"tpot_met\":null");
    const char *cancelled = strstr(srv.log, "\"status\":499");
    const char *eol = strchr(cancelled, '\n');
    cr_assert_not_null(eol);
    cr_assert_null(memmem(cancelled, (size_t)(eol - cancelled), "_met", 4),
                   "no verdict for a cancelled request: %.*s", (int)(eol - cancelled), cancelled);

    cr_assert_eq(client_try_request(srv.port, "GET", "/metrics", NULL, NULL, raw, sizeof raw), 200);
    char *metrics = strdup(raw);
    json_t *slo = get_slo();
    static const struct expect want[] = {
        /* failed, 4 tokens, 4 streamed, 1 token */
        {"relaxed", "alice", 4, 3, 3, 2, 4, 3},
        {"relaxed", "carol", 1, 1, 1, 1, 1, 1},
        /* 4 tokens, 1 token: TTFT missed both times */
        {"strict", "bob", 2, 0, 1, 1, 2, 0},
        {"capped", "alice", 1, 1, 1, 1, 1, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        check_series(metrics, slo, &want[i]);
    cr_assert_eq(series(metrics, "sluice:goodput_requests_total{tier=\"relaxed\"}"), 4);
    cr_assert_eq(series(metrics, "sluice:goodput_requests_total{tier=\"strict\"}"), 0);
    cr_assert_eq(series(metrics, "sluice:goodput_requests_total{tier=\"capped\"}"), 1);
    cr_assert(strstr(metrics, "# TYPE sluice:slo_requests_total counter\n"));
    cr_assert(strstr(metrics, "# TYPE sluice:goodput_requests_total counter\n"));

    /* Refusals and degradations, by reason and kind, in the tier whose policy decided. */
    json_t *c = slo_json_window(slo, "relaxed", "carol", "60m");
    cr_assert_eq(field(json_object_get(c, "refused"), "tenant_requests"), 1);
    json_t *a = slo_json_window(slo, "capped", "alice", "60m");
    cr_assert_eq(field(json_object_get(a, "degraded"), "cap_max_tokens"), 1);
    a = slo_json_window(slo, "relaxed", "alice", "60m");
    cr_assert_eq(json_object_size(json_object_get(a, "refused")), 0);
    cr_assert_eq(json_object_size(json_object_get(a, "degraded")), 0);
    /* Each tier with its objectives; bob's TTFTs are past 1 ms (every step sleeps 5 ms). */
    json_t *strict = json_array_get(json_object_get(slo, "tiers"), 1);
    cr_assert_str_eq(json_string_value(json_object_get(strict, "tier")), "strict");
    cr_assert_eq(field(strict, "ttft_slo_ms"), 1);
    cr_assert_eq(field(strict, "tpot_slo_ms"), 600000);
    json_t *bob = slo_json_window(slo, "strict", "bob", "60m");
    cr_assert_gt(json_real_value(json_object_get(bob, "ttft_p50")), 0.001);
    cr_assert(json_is_number(json_object_get(bob, "tpot_p99")), "the 4-token request's TPOT");
    json_decref(slo);
    free(metrics);
}

Test(slo, admin_slo_needs_the_admin_key)
{
    start();
    cr_assert_eq(client_try_request(srv.port, "GET", "/admin/slo", NULL, NULL, raw, sizeof raw),
                 401, "%s", raw);
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/admin/slo", AUTH(ALICE), NULL, raw, sizeof raw), 401,
        "a tenant's key does not open it");
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/admin/slo", AUTH(ADMIN), "{}", raw, sizeof raw), 405,
        "%s", raw);
    /* Before any request: every tier, with its objectives and no tenant. */
    json_t *j = get_slo();
    json_t *tiers = json_object_get(j, "tiers");
    cr_assert_eq(json_array_size(tiers), 3, "%s", raw);
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(json_array_size(json_object_get(json_array_get(tiers, i), "tenants")), 0);
    json_decref(j);
}
