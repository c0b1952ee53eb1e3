/* GET /admin/stats and GET /dashboard on the real server (issue 33): the stats document moves as
 * requests are served and agrees with /metrics; the admin key guards it; the page, its script and
 * its style are served without a key, with their security headers; the fleet's fallback shows.
 *
 * No assertion depends on how fast the host is: the objectives are HARNESS_TIERS_WITHOUT_GUARD's,
 * requests go one at a time, and the windows read are the 5 minute ones, which hold every request
 * of a test the suite's timeout allows. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"
#include "redis_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* alice has a budget (prices make every token cost); bob none; carol one request a minute. */
#define CONFIG                                                                                     \
    "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1,\"admin_key_sha256\":\"" ADMIN_SHA "\","       \
    "\"currency\":\"credits\",\"price\":{\"input_per_mtok\":1000,\"output_per_mtok\":2000},"       \
    "\"tenants\":[{\"name\":\"alice\",\"key_sha256\":\"" ALICE_SHA "\",\"tiers\":["                \
    "\"interactive\",\"batch\"],\"default_tier\":\"interactive\",\"budget\":{\"amount\":1000,"     \
    "\"period\":\"day\"}},{\"name\":\"bob\",\"key_sha256\":\"" BOB_SHA "\",\"tiers\":[\"batch\"]," \
    "\"default_tier\":\"batch\"},{\"name\":\"carol\",\"key_sha256\":\"" CAROL_SHA "\",\"tiers\":[" \
    "\"interactive\"],\"default_tier\":\"interactive\",\"rpm\":1}]}"

static struct server srv;
static struct redis_server redis;

static void stop(void)
{
    server_stop(&srv);
    if (redis.pid)
        redis_server_stop(&redis);
    redis = (struct redis_server){0};
}

TestSuite(stats, .fini = stop, .timeout = 300);

static char raw[1 << 18];

static int complete(const char *key_header, int max_tokens)
{
    char body[256];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":%d,\"ignore_eos\":true,"
             "\"temperature\":0}",
             max_tokens);
    return client_try_request(srv.port, "POST", "/v1/completions", key_header, body, raw,
                              sizeof raw);
}

/* The head of the latest raw response, lower-cased, NUL-terminated into out. */
static void head_of(const char *resp, char *out, size_t max)
{
    const char *end = strstr(resp, "\r\n\r\n");
    size_t n = end ? (size_t)(end - resp) : strlen(resp);
    if (n >= max)
        n = max - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (char)(resp[i] >= 'A' && resp[i] <= 'Z' ? resp[i] + 32 : resp[i]);
    out[n] = '\0';
}

static json_t *get_stats(void)
{
    int st =
        client_try_request(srv.port, "GET", "/admin/stats", AUTH(ADMIN), NULL, raw, sizeof raw);
    cr_assert_eq(st, 200, "%s", raw);
    char head[4096];
    head_of(raw, head, sizeof head);
    cr_assert_not_null(strstr(head, "\r\ncache-control: no-store"), "%s", head);
    cr_assert_not_null(strstr(head, "\r\ncontent-type: application/json"), "%s", head);
    json_error_t e;
    json_t *j = json_loads(strstr(raw, "\r\n\r\n") + 4, 0, &e);
    cr_assert_not_null(j, "%s: %s", e.text, raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "stats");
    return j;
}

static json_t *tier_of(json_t *stats, const char *name)
{
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(stats, "tiers"), i, t)
    {
        if (strcmp(json_string_value(json_object_get(t, "tier")), name) == 0)
            return t;
    }
    cr_assert_fail("tier %s is not in /admin/stats", name);
    return NULL;
}

static long long num(json_t *o, const char *path)
{
    /* "a.b.c": nested members; a missing one reads as 0 (the decisions list only counts > 0). */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *v = o;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
        v = json_object_get(v, k);
    cr_assert(v == NULL || json_is_integer(v), "%s is an integer", path);
    return v ? json_integer_value(v) : 0;
}

static double real(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    cr_assert(json_is_number(v), "%s is a number", k);
    return json_number_value(v);
}

static json_t *tenant_row(json_t *stats, const char *list, int i)
{
    return json_array_get(json_object_get(json_object_get(stats, "tenants"), list), (size_t)i);
}

/* The sum of every decision of every tier in a stats document. */
static long long decisions_total(json_t *stats)
{
    long long n = 0;
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(stats, "tiers"), i, t)
    {
        const char *d;
        json_t *reasons;
        json_object_foreach(json_object_get(t, "decisions"), d, reasons)
        {
            const char *r;
            json_t *v;
            json_object_foreach(reasons, r, v) n += json_integer_value(v);
        }
    }
    return n;
}

Test(stats, figures_move_as_requests_are_served_and_agree_with_the_metrics)
{
    server_start_config(&srv, CONFIG);
    json_t *s0 = get_stats();
    cr_assert(json_is_false(json_object_get(s0, "draining")));
    cr_assert(json_is_null(json_object_get(s0, "fleet")), "no redis: no fleet");
    cr_assert_str_eq(json_string_value(json_object_get(s0, "currency")), "credits");
    /* The configuration's tiers, in its order, with their objectives and nothing counted. */
    json_t *tiers = json_object_get(s0, "tiers");
    cr_assert_eq(json_array_size(tiers), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(tiers, 0), "tier")),
                     "interactive");
    json_t *i0 = tier_of(s0, "interactive");
    cr_assert_eq(num(i0, "ttft_slo_ms"), 600000);
    cr_assert_eq(num(i0, "tpot_slo_ms"), 1000);
    cr_assert_eq(num(i0, "windows.5m.requests"), 0);
    cr_assert(json_is_null(
        json_object_get(json_object_get(json_object_get(i0, "windows"), "1m"), "ttft_p99")));
    cr_assert_eq(num(i0, "decisions.admitted.none"), 0);
    json_t *m0 = json_array_get(json_object_get(s0, "models"), 0);
    cr_assert_not_null(m0, "one model");
    cr_assert_gt(num(m0, "kv_blocks_total"), 0);
    long long steps0 = num(m0, "steps");
    cr_assert_null(tenant_row(s0, "by_tokens", 0), "no usage yet");

    /* alice: three requests of 4 tokens in interactive; bob: two of 4 in batch. */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(complete(AUTH(ALICE), 4), 200, "%s", raw);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(complete(AUTH(BOB), 4), 200, "%s", raw);
    json_t *s1 = get_stats();
    json_t *i1 = tier_of(s1, "interactive"), *b1 = tier_of(s1, "batch");
    cr_assert_eq(num(i1, "windows.5m.requests"), 3);
    cr_assert_eq(num(b1, "windows.5m.requests"), 2);
    cr_assert_eq(num(i1, "decisions.admitted.none"), 3);
    cr_assert_eq(num(b1, "decisions.admitted.none"), 2);
    json_t *w = json_object_get(json_object_get(i1, "windows"), "5m");
    double a = real(w, "attainment");
    cr_assert(a >= 0 && a <= 1, "attainment %g", a);
    cr_assert_gt(real(w, "ttft_p50"), 0);
    cr_assert_geq(real(w, "ttft_p99"), real(w, "ttft_p50"));
    cr_assert_geq(real(w, "tpot_p99"), real(w, "tpot_p50"));
    json_t *m1 = json_array_get(json_object_get(s1, "models"), 0);
    cr_assert_gt(num(m1, "steps"), steps0, "the scheduler ran steps");
    cr_assert_eq(num(m1, "running"), 0, "nothing in flight between requests");
    /* Tenants: alice has more tokens than bob (same prompts, more requests) and is first in both
     * lists; her budget is spent by what she cost; bob has none. */
    json_t *top = tenant_row(s1, "by_tokens", 0), *second = tenant_row(s1, "by_tokens", 1);
    cr_assert_str_eq(json_string_value(json_object_get(top, "tenant")), "alice");
    cr_assert_str_eq(json_string_value(json_object_get(second, "tenant")), "bob");
    cr_assert_eq(num(top, "requests"), 3);
    cr_assert_eq(num(top, "completion_tokens"), 12);
    cr_assert_eq(num(second, "completion_tokens"), 8);
    cr_assert_eq(num(top, "total_tokens"), num(top, "prompt_tokens") + 12);
    cr_assert_str_eq(json_string_value(json_object_get(tenant_row(s1, "by_cost", 0), "tenant")),
                     "alice");
    json_t *budget = json_object_get(top, "budget");
    cr_assert(json_is_object(budget), "alice has a budget");
    cr_assert_gt(real(budget, "used"), 0);
    cr_assert_float_eq(real(budget, "used"), real(budget, "spent") / real(budget, "amount"), 1e-6);
    cr_assert(json_is_null(json_object_get(second, "budget")), "bob has no budget");

    /* carol's second request in a minute is refused: the refusal shows by its reason. */
    cr_assert_eq(complete(AUTH(CAROL), 2), 200, "%s", raw);
    cr_assert_eq(complete(AUTH(CAROL), 2), 429, "%s", raw);
    json_t *s2 = get_stats();
    json_t *i2 = tier_of(s2, "interactive");
    cr_assert_eq(num(i2, "decisions.rejected.tenant_requests"), 1);
    cr_assert_eq(num(i2, "decisions.admitted.none"), 4);
    cr_assert_eq(num(i2, "windows.5m.refused.tenant_requests"), 1);
    /* The same counters as the scrape's. */
    double scraped = metrics_fetch_sum(srv.port, "sluice:admission_decisions_total");
    cr_assert_eq((long long)scraped, decisions_total(s2), "/metrics %g", scraped);
    json_decref(s0);
    json_decref(s1);
    json_decref(s2);
}

Test(stats, the_admin_key_guards_the_figures_and_not_the_page)
{
    server_start_config(&srv, CONFIG);
    cr_assert_eq(client_try_request(srv.port, "GET", "/admin/stats", NULL, NULL, raw, sizeof raw),
                 401, "%s", raw);
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/admin/stats", AUTH(ALICE), NULL, raw, sizeof raw),
        401, "a tenant's key does not open it: %s", raw);
    cr_assert_not_null(strstr(raw, "\"error\""), "an API error object: %s", raw);
    cr_assert_eq(
        client_try_request(srv.port, "POST", "/admin/stats", AUTH(ADMIN), "{}", raw, sizeof raw),
        405, "%s", raw);

    /* The page, its script and its style: no key, each with its type and the security headers;
     * the page loads its script and style from this server only. */
    static const struct {
        const char *path, *ctype, *needle;
    } files[] = {
        {"/dashboard", "text/html; charset=utf-8", "<script src=\"/dashboard/app.js\""},
        {"/dashboard/app.js", "text/javascript; charset=utf-8", "/admin/stats"},
        {"/dashboard/app.css", "text/css; charset=utf-8", ".card"},
    };
    char head[4096], want[128];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        cr_assert_eq(
            client_try_request(srv.port, "GET", files[i].path, NULL, NULL, raw, sizeof raw), 200,
            "%s: %s", files[i].path, raw);
        head_of(raw, head, sizeof head);
        snprintf(want, sizeof want, "\r\ncontent-type: %s\r\n", files[i].ctype);
        cr_assert_not_null(strstr(head, want), "%s: %s", files[i].path, head);
        cr_assert_not_null(strstr(head, "\r\nx-content-type-options: nosniff\r\n"), "%s", head);
        cr_assert_not_null(strstr(head, "\r\ncontent-security-policy: default-src 'none'; "
                                        "script-src 'self'; style-src 'self'; connect-src 'self';"),
                           "%s", head);
        cr_assert_not_null(strstr(raw, files[i].needle), "%s", files[i].path);
    }
    /* The script writes what the server sends as text, never as markup, and keeps the key out of
     * storage and URLs. */
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/dashboard/app.js", NULL, NULL, raw, sizeof raw), 200);
    static const char *const banned[] = {"innerHTML",      "outerHTML",      "insertAdjacentHTML",
                                         "document.write", "eval(",          "localStorage",
                                         "sessionStorage", "document.cookie"};
    for (size_t i = 0; i < sizeof banned / sizeof banned[0]; i++)
        cr_assert_null(strstr(raw, banned[i]), "app.js uses %s", banned[i]);
    cr_assert_eq(client_try_request(srv.port, "POST", "/dashboard", NULL, "x", raw, sizeof raw),
                 405, "%s", raw);
    cr_assert_eq(client_try_request(srv.port, "HEAD", "/dashboard", NULL, NULL, raw, sizeof raw),
                 200, "%s", raw);
}

Test(stats, without_an_admin_key_in_the_configuration_the_figures_are_closed)
{
    server_start_config(&srv, "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1}");
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/admin/stats", AUTH(ADMIN), NULL, raw, sizeof raw),
        403, "%s", raw);
    cr_assert_not_null(strstr(raw, "admin_disabled"), "%s", raw);
    cr_assert_eq(client_try_request(srv.port, "GET", "/dashboard", NULL, NULL, raw, sizeof raw),
                 200, "%s", raw);
}

Test(stats, losing_redis_raises_the_fallback_flag)
{
    redis = (struct redis_server){0};
    if (!redis_server_start(&redis))
        cr_skip_test("redis-server is not installed (scripts/setup.sh installs it)");
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1,\"admin_key_sha256\":\"" ADMIN_SHA
             "\",\"redis\":{\"url\":\"redis://127.0.0.1:%d\",\"timeout_ms\":200},\"tenants\":[{"
             "\"name\":\"alice\",\"key_sha256\":\"" ALICE_SHA "\",\"tiers\":[\"interactive\"],"
             "\"default_tier\":\"interactive\",\"rpm\":600}]}",
             redis.port);
    server_start_config(&srv, cfg);
    server_wait_log(&srv, "fleet: connected to redis");
    server_log_clear(&srv);
    cr_assert_eq(complete(AUTH(ALICE), 2), 200, "%s", raw);
    json_t *up = get_stats();
    json_t *fleet = json_object_get(up, "fleet");
    cr_assert(json_is_true(json_object_get(fleet, "redis_up")));
    cr_assert(json_is_false(json_object_get(fleet, "fallback")));
    long long local0 = num(fleet, "local_decisions");
    json_decref(up);

    redis_server_stop(&redis);
    redis = (struct redis_server){0};
    /* The next decision finds Redis gone and is taken on the local share. */
    cr_assert_eq(complete(AUTH(ALICE), 2), 200, "%s", raw);
    server_wait_log(&srv, "fleet: no answer from redis");
    json_t *down = get_stats();
    fleet = json_object_get(down, "fleet");
    cr_assert(json_is_false(json_object_get(fleet, "redis_up")));
    cr_assert(json_is_true(json_object_get(fleet, "fallback")));
    cr_assert_gt(num(fleet, "local_decisions"), local0);
    json_decref(down);
}
