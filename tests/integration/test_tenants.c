/* Tenants, tiers and the admin API on the real server: API keys, classification, the
 * X-Sluice-Tier header, /admin/config, the access log, and SIGHUP reloads under load. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Keys and their SHA-256 from `printf %s KEY | sha256sum`. */
#define DAVE "sk-dave-0123456789abcdefXYZ"
#define DAVE_SHA "0a18f2c011ddd3fc084f68e5e1193ccb1ae971c9b0b7433cb0d4c2986b5aa0f7"
#define WRONG "sk-wrong-0123456789abcdef9999"

static struct server srv;
static char cfg_path[64];

/* The objectives are far beyond what a stalled host makes of these short prompts: the tests here
 * are about tenants and classification, and several send at once, where the SLO guard judges
 * from measured step times (it is tested against fixed figures in tests/gateway). */
#define TIERS(batch_weight)                                                                        \
    "\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,\"ttft_slo_ms\":60000,"               \
    "\"tpot_slo_ms\":100},\"batch\":{\"priority\":1,\"weight\":" batch_weight ","                  \
    "\"ttft_slo_ms\":60000,\"tpot_slo_ms\":1000}}"
#define TENANT(name, sha, tiers, def)                                                              \
    "{\"name\":\"" name "\",\"key_sha256\":\"" sha "\",\"tiers\":" tiers                           \
    ",\"default_tier\":\"" def "\"}"
#define ALICE_T TENANT("alice", ALICE_SHA, "[\"interactive\",\"batch\"]", "interactive")
#define BOB_T TENANT("bob", BOB_SHA, "[\"batch\"]", "batch")
#define CAROL_T TENANT("carol", CAROL_SHA, "[\"interactive\"]", "interactive")
#define DAVE_T TENANT("dave", DAVE_SHA, "[\"batch\",\"interactive\"]", "batch")
#define RULES                                                                                      \
    "\"classify\":[{\"header\":\"x-sluice-tier\"},"                                                \
    "{\"service_tier\":{\"priority\":\"interactive\",\"flex\":\"batch\"}},"                        \
    "{\"stream\":true,\"tier\":\"interactive\"},"                                                  \
    "{\"max_tokens_above\":64,\"tier\":\"batch\"},{\"tenant_default\":true}]"
#define CONFIG(batch_weight, tenants)                                                              \
    "{" TIERS(batch_weight) ",\"tenants\":[" tenants "],\"admin_key_sha256\":\"" ADMIN_SHA         \
                            "\"," RULES "}"

/* Replaces the config file's content (a rename, so a reload never reads half a file). */
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

static void start(void)
{
    snprintf(cfg_path, sizeof cfg_path, "/tmp/sluice-tenants-%d.json", (int)getpid());
    write_config(CONFIG("1", ALICE_T "," BOB_T));
    const char *args[] = {"--config", cfg_path, NULL};
    server_start(&srv, args);
}

static void stop(void)
{
    server_stop(&srv);
    unlink(cfg_path);
}

TestSuite(tenants, .init = start, .fini = stop, .timeout = 300);

static json_t *parse_json(const char *body)
{
    json_error_t e;
    json_t *j = json_loads(body, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, body);
    return j;
}

static struct response req(const char *method, const char *path, const char *headers,
                           const char *body)
{
    int fd = client_connect(srv.port);
    client_request_h(fd, method, path, headers, body, false);
    struct response r;
    cr_assert(client_read_response(fd, &r), "no response to %s %s", method, path);
    close(fd);
    return r;
}

/* Asserts an OpenAI error object with this status, type, param (NULL: null) and code. */
static void assert_error(const struct response *r, int status, const char *type, const char *param,
                         const char *code)
{
    cr_assert_eq(r->status, status, "status %d, body %s", r->status, r->body);
    json_t *j = parse_json(r->body);
    json_t *e = json_object_get(j, "error");
    cr_assert(json_is_object(e), "%s", r->body);
    cr_assert_gt(strlen(json_string_value(json_object_get(e, "message"))), 0);
    cr_assert_str_eq(json_string_value(json_object_get(e, "type")), type, "%s", r->body);
    if (param)
        cr_assert_str_eq(json_string_value(json_object_get(e, "param")), param, "%s", r->body);
    else
        cr_assert(json_is_null(json_object_get(e, "param")), "%s", r->body);
    if (code)
        cr_assert_str_eq(json_string_value(json_object_get(e, "code")), code, "%s", r->body);
    json_decref(j);
}

/* A completion answered 200 in `tier` (checked in the X-Sluice-Tier header). */
static void expect_tier(const char *headers, const char *body, const char *tier)
{
    struct response r = req("POST", "/v1/completions", headers, body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    const char *h = response_header(&r, "x-sluice-tier");
    cr_assert_not_null(h, "no X-Sluice-Tier header:\n%s", r.headers);
    cr_assert_str_eq(h, tier, "for %s%s", headers, body);
    response_dispose(&r);
}

static const char small[] = "{\"prompt\":\"Hello\",\"max_tokens\":4}";

Test(tenants, missing_or_unknown_key_gets_401_when_tenants_are_configured)
{
    struct response r = req("POST", "/v1/completions", NULL, small);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    cr_assert_not_null(response_header(&r, "www-authenticate"));
    cr_assert(strstr(response_header(&r, "www-authenticate"), "Bearer"));
    response_dispose(&r);

    r = req("POST", "/v1/completions", AUTH(WRONG), small);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    cr_assert_null(strstr(r.body, WRONG), "the key is not echoed: %s", r.body);
    cr_assert(strstr(r.body, "sk-wr****9999"), "a redacted form is: %s", r.body);
    response_dispose(&r);

    /* Another scheme, a hash in place of the key, a key in the wrong case. */
    r = req("POST", "/v1/completions", "Authorization: Basic YWxpY2U6eA==\r\n", small);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);
    r = req("POST", "/v1/completions", AUTH(ALICE_SHA), small);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);
    r = req("POST", "/v1/completions", AUTH("SK-ALICE-0123456789ABCDEFXYZ"), small);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);

    /* Every route but /healthz; the key is checked before the body is read as JSON. */
    r = req("GET", "/v1/models", NULL, NULL);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);
    r = req("GET", "/v1/models/synthetic:tiny", AUTH(WRONG), NULL);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);
    r = req("POST", "/v1/completions", NULL, "{not json");
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);
    r = req("GET", "/healthz", NULL, NULL);
    cr_assert_eq(r.status, 200);
    response_dispose(&r);
}

Test(tenants, known_key_is_served_in_its_default_tier_when_valid)
{
    expect_tier(AUTH(ALICE), small, "interactive");
    expect_tier(AUTH(BOB), small, "batch");
    /* Case-insensitive scheme, spaces around the key. */
    expect_tier("Authorization: bearer   " ALICE "  \r\n", small, "interactive");
    struct response r = req("GET", "/v1/models", AUTH(BOB), NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_null(response_header(&r, "x-sluice-tier"), "only completions have a tier");
    response_dispose(&r);
    /* Keep-alive: two requests, each authenticated on its own. */
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(ALICE), small, true);
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    client_request_h(fd, "POST", "/v1/completions", NULL, small, true);
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 401, "a key is needed on every request, not once per connection");
    response_dispose(&r);
    close(fd);
}

/* Anthropic's SDKs send the key as x-api-key: any route takes it, and Authorization wins when
 * both are sent. */
Test(tenants, x_api_key_is_a_key_on_every_route_and_authorization_wins_over_it)
{
    expect_tier("x-api-key: " BOB "\r\n", small, "batch");
    expect_tier(AUTH(ALICE) "x-api-key: " BOB "\r\n", small, "interactive");
    struct response r = req("GET", "/v1/models", "x-api-key: " ALICE "\r\n", NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    r = req("POST", "/v1/completions", "x-api-key: " WRONG "\r\n", small);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);
    /* A wrong Authorization is not rescued by a right x-api-key. */
    r = req("POST", "/v1/completions", AUTH(WRONG) "x-api-key: " ALICE "\r\n", small);
    cr_assert_eq(r.status, 401, "%s", r.body);
    response_dispose(&r);
}

Test(tenants, tier_header_is_honoured_and_echoed_when_allowed)
{
    expect_tier(AUTH(ALICE) "x-sluice-tier: batch\r\n", small, "batch");
    expect_tier(AUTH(ALICE) "X-Sluice-Tier: interactive\r\n",
                "{\"prompt\":\"Hello\",\"max_tokens\":100}", "interactive");
    /* The header beats service_tier. */
    expect_tier(AUTH(ALICE) "x-sluice-tier: batch\r\n",
                "{\"prompt\":\"Hello\",\"max_tokens\":4,\"service_tier\":\"priority\"}", "batch");
    /* A stream carries it too. */
    struct response r = req("POST", "/v1/completions", AUTH(ALICE) "x-sluice-tier: batch\r\n",
                            "{\"prompt\":\"Hello\",\"max_tokens\":4,\"stream\":true}");
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(response_header(&r, "content-type"), "text/event-stream"));
    cr_assert_str_eq(response_header(&r, "x-sluice-tier"), "batch");
    cr_assert(strstr(r.body, "data: [DONE]"));
    response_dispose(&r);
}

Test(tenants, service_tier_maps_to_tier_when_openai_field_given)
{
    expect_tier(AUTH(ALICE), "{\"prompt\":\"Hello\",\"max_tokens\":4,\"service_tier\":\"flex\"}",
                "batch");
    expect_tier(AUTH(ALICE),
                "{\"prompt\":\"Hello\",\"max_tokens\":100,\"service_tier\":\"priority\"}",
                "interactive");
    /* "auto" says nothing: the tenant default (bob) or the shape rules (alice) decide. */
    expect_tier(AUTH(BOB), "{\"prompt\":\"Hello\",\"max_tokens\":4,\"service_tier\":\"auto\"}",
                "batch");
    expect_tier(AUTH(ALICE), "{\"prompt\":\"Hello\",\"max_tokens\":100,\"service_tier\":\"auto\"}",
                "batch");
}

Test(tenants, shape_rules_place_request_when_nothing_explicit)
{
    expect_tier(AUTH(ALICE), "{\"prompt\":\"Hello\",\"max_tokens\":65}", "batch");
    expect_tier(AUTH(ALICE), "{\"prompt\":\"Hello\",\"max_tokens\":64}", "interactive");
    expect_tier(AUTH(ALICE), "{\"prompt\":\"Hello\",\"max_tokens\":100,\"stream\":true}",
                "interactive");
    /* bob may not use interactive: the stream rule falls through to his default. */
    expect_tier(AUTH(BOB), "{\"prompt\":\"Hello\",\"max_tokens\":4,\"stream\":true}", "batch");
}

Test(tenants, explicit_tier_gets_403_when_not_allowed_and_400_when_unknown)
{
    struct response r =
        req("POST", "/v1/completions", AUTH(BOB) "x-sluice-tier: interactive\r\n", small);
    assert_error(&r, 403, "permission_error", "x-sluice-tier", "tier_not_allowed");
    response_dispose(&r);
    r = req("POST", "/v1/completions", AUTH(BOB),
            "{\"prompt\":\"Hello\",\"max_tokens\":4,\"service_tier\":\"priority\"}");
    assert_error(&r, 403, "permission_error", "service_tier", "tier_not_allowed");
    response_dispose(&r);
    r = req("POST", "/v1/completions", AUTH(ALICE) "x-sluice-tier: platinum\r\n", small);
    assert_error(&r, 400, "invalid_request_error", "x-sluice-tier", "invalid_tier");
    cr_assert(strstr(r.body, "platinum"), "%s", r.body);
    response_dispose(&r);
    r = req("POST", "/v1/completions", AUTH(ALICE),
            "{\"prompt\":\"Hello\",\"max_tokens\":4,\"service_tier\":\"turbo\"}");
    assert_error(&r, 400, "invalid_request_error", "service_tier", "invalid_tier");
    response_dispose(&r);
    r = req("POST", "/v1/completions", AUTH(ALICE),
            "{\"prompt\":\"Hello\",\"max_tokens\":4,\"service_tier\":7}");
    assert_error(&r, 400, "invalid_request_error", "service_tier", NULL);
    response_dispose(&r);
}

Test(tenants, admin_config_needs_admin_key_and_redacts_hashes_when_read)
{
    struct response r = req("GET", "/admin/config", NULL, NULL);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);
    r = req("GET", "/admin/config", AUTH(ALICE), NULL);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);
    r = req("GET", "/admin/config", AUTH(ALICE_SHA), NULL);
    assert_error(&r, 401, "invalid_request_error", NULL, "invalid_api_key");
    response_dispose(&r);

    r = req("GET", "/admin/config", AUTH(ADMIN), NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    for (const char *const *s =
             (const char *const[]){ALICE, BOB, ADMIN, ALICE_SHA, BOB_SHA, ADMIN_SHA, NULL};
         *s; s++)
        cr_assert_null(strstr(r.body, *s), "%s leaked: %s", *s, r.body);
    json_t *j = parse_json(r.body);
    json_t *tenants = json_object_get(j, "tenants");
    cr_assert_eq(json_array_size(tenants), 2);
    json_t *bob = json_array_get(tenants, 1);
    cr_assert_str_eq(json_string_value(json_object_get(bob, "name")), "bob");
    cr_assert_str_eq(json_string_value(json_object_get(bob, "key_sha256")), "<redacted>");
    cr_assert_str_eq(json_string_value(json_object_get(bob, "default_tier")), "batch");
    cr_assert_str_eq(json_string_value(json_object_get(j, "admin_key_sha256")), "<redacted>");
    json_t *batch = json_object_get(json_object_get(j, "tiers"), "batch");
    cr_assert_eq(json_integer_value(json_object_get(batch, "priority")), 1);
    cr_assert_eq(json_array_size(json_object_get(j, "classify")), 5);
    cr_assert_str_eq(json_string_value(json_object_get(j, "model")), "synthetic");
    json_decref(j);
    response_dispose(&r);

    r = req("POST", "/admin/config", AUTH(ADMIN), "{}");
    cr_assert_eq(r.status, 405, "%s", r.body);
    response_dispose(&r);
    r = req("GET", "/admin/nothing", AUTH(ADMIN), NULL);
    cr_assert_eq(r.status, 404, "%s", r.body);
    response_dispose(&r);
}

Test(tenants, keys_never_reach_the_log_when_requests_carry_them)
{
    expect_tier(AUTH(ALICE), small, "interactive");
    expect_tier(AUTH(BOB), "{\"prompt\":\"Hello\",\"max_tokens\":4,\"stream\":true}", "batch");
    struct response r = req("POST", "/v1/completions", AUTH(WRONG), small);
    cr_assert_eq(r.status, 401);
    response_dispose(&r);
    r = req("GET", "/admin/config", AUTH(ADMIN), NULL);
    cr_assert_eq(r.status, 200);
    response_dispose(&r);
    r = req("POST", "/v1/completions", AUTH(BOB) "x-sluice-tier: interactive\r\n", small);
    cr_assert_eq(r.status, 403);
    response_dispose(&r);
    /* Stopping drains the whole log into srv.log. */
    server_stop(&srv);
    cr_assert_lt(srv.log_len, sizeof srv.log - 1, "the log was captured whole");
    for (const char *const *s =
             (const char *const[]){ALICE, BOB, WRONG, ADMIN, ALICE_SHA, BOB_SHA, ADMIN_SHA, NULL};
         *s; s++)
        cr_assert_null(strstr(srv.log, *s), "%s is in the log:\n%s", *s, srv.log);
    /* What the access log says instead. */
    cr_assert(
        strstr(srv.log, "\"tenant\":\"alice\",\"tier\":\"interactive\",\"admission\":\"admitted\""),
        "%s", srv.log);
    cr_assert(strstr(srv.log, "\"tenant\":\"bob\",\"tier\":\"batch\",\"admission\":\"admitted\""),
              "%s", srv.log);
    cr_assert(strstr(srv.log, "\"status\":403"), "%s", srv.log);
    cr_assert(strstr(srv.log, "\"status\":401"), "%s", srv.log);
}

/* ---- SIGHUP ---- */

/* Appends what arrives on fd to buf until buf contains needle. */
static void read_into(int fd, char *buf, size_t *len, size_t cap, const char *needle)
{
    while (!strstr(buf, needle)) {
        cr_assert_lt(*len + 1, cap, "response larger than the test's buffer");
        size_t n = client_read_some(fd, buf + *len, cap - 1 - *len);
        cr_assert_gt(n, 0, "connection ended before \"%s\":\n%s", needle, buf);
        *len += n;
        buf[*len] = '\0';
    }
}

static const char *const reload_outcomes[] = {"SIGHUP: configuration reloaded",
                                              "SIGHUP: configuration refused", NULL};

/* Sends SIGHUP and returns 0 when the server reports the reload, 1 when it refused it. */
static int sighup(void)
{
    server_log_clear(&srv);
    cr_assert_eq(kill(srv.pid, SIGHUP), 0);
    return server_wait_log_any(&srv, reload_outcomes);
}

Test(tenants, request_keeps_its_config_and_next_one_gets_new_when_reloaded)
{
    /* A kept-alive connection of bob's whose last request ended before the reload. */
    int idle = client_connect(srv.port);
    client_request_h(idle, "POST", "/v1/completions", AUTH(BOB), small, true);
    struct response r;
    cr_assert(client_read_response(idle, &r));
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    /* A long stream of bob's, started before the reload that removes bob. */
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(BOB),
                     "{\"prompt\":\"Once\",\"max_tokens\":480,\"stream\":true,\"temperature\":0}",
                     true);
    size_t cap = 1 << 20, len = 0;
    char *stream = calloc(1, cap);
    read_into(fd, stream, &len, cap, "data: {");
    cr_assert(strstr(stream, "200 OK") && strstr(stream, "X-Sluice-Tier: batch"), "%s", stream);

    write_config(CONFIG("1", ALICE_T));
    cr_assert_eq(sighup(), 0, "%s", srv.log);

    /* New requests: bob is gone, on a new connection and on the idle one... */
    client_request_h(idle, "POST", "/v1/completions", AUTH(BOB), small, true);
    cr_assert(client_read_response(idle, &r));
    cr_assert_eq(r.status, 401, "a revoked key must not live on in a kept-alive connection");
    response_dispose(&r);
    close(idle);
    r = req("POST", "/v1/completions", AUTH(BOB), small);
    cr_assert_eq(r.status, 401, "%s", r.body);
    response_dispose(&r);
    expect_tier(AUTH(ALICE), small, "interactive");

    /* ...while the stream that started under the old configuration runs to its end. */
    /* The last chunk, its trailer (what the request cost) and the empty line. */
    read_into(fd, stream, &len, cap, "\r\n0\r\nx-sluice-cost: ");
    size_t tail = (size_t)(strstr(stream, "\r\n0\r\nx-sluice-cost: ") - stream), rest = len - tail;
    read_into(fd, stream + tail, &rest, cap - tail, "\r\n\r\n");
    len = tail + rest;
    cr_assert(strstr(stream, "data: [DONE]"), "%s", stream);
    cr_assert_null(strstr(stream, "\"error\""), "%s", stream);
    cr_assert(strstr(stream, "\"finish_reason\":\"length\""), "all 480 tokens: %s", stream);
    free(stream);

    /* The same kept-alive connection's next request is judged by the new configuration. */
    client_request_h(fd, "POST", "/v1/completions", AUTH(BOB), small, true);
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 401, "%s", r.body);
    response_dispose(&r);
    close(fd);
    server_wait_log_any(&srv, (const char *const[]){"\"tenant\":\"bob\",\"tier\":\"batch\"", NULL});
}

/* The scheduler gets the reloaded tier table through its inbox: a completion submitted after the
 * reload is done only after the table is in effect, and /metrics then shows its tiers. */
Test(tenants, scheduler_reports_the_new_tiers_when_reloaded)
{
    struct response r = req("GET", "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    cr_assert_not_null(strstr(r.body, "sluice:num_requests_waiting{tier=\"batch\"} 0"), "%s",
                       r.body);
    cr_assert_null(strstr(r.body, "tier=\"bulk\""));
    response_dispose(&r);
    write_config("{\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,"
                 "\"ttft_slo_ms\":1000,\"tpot_slo_ms\":100},\"batch\":{\"priority\":1,"
                 "\"weight\":1,\"ttft_slo_ms\":60000,\"tpot_slo_ms\":1000},\"bulk\":{"
                 "\"priority\":2,\"weight\":1,\"ttft_slo_ms\":600000,\"tpot_slo_ms\":5000}},"
                 "\"tenants\":[" ALICE_T "]}");
    cr_assert_eq(sighup(), 0, "%s", srv.log);
    expect_tier(AUTH(ALICE), small, "interactive");
    r = req("GET", "/metrics", NULL, NULL);
    cr_assert_not_null(strstr(r.body, "sluice:num_requests_running{tier=\"bulk\"} 0"), "%s",
                       r.body);
    cr_assert_not_null(strstr(r.body, "sluice:num_prompt_tokens_waiting{tier=\"batch\"} 0"));
    response_dispose(&r);
    server_wait_log(&srv, "scheduler: 3 tiers in effect");
}

struct load {
    int port;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long ok, bad;
    int bad_status;
    char bad_body[1024];
};

/* Issues alice's completions back to back until told to stop; counts what came back. */
static void *load_thread(void *arg)
{
    struct load *ld = arg;
    char out[8192];
    while (!atomic_load(&ld->stop)) {
        int st = client_try_request(ld->port, "POST", "/v1/completions", AUTH(ALICE),
                                    "{\"prompt\":\"Hi there\",\"max_tokens\":3}", out, sizeof out);
        pthread_mutex_lock(&ld->mu);
        if (st == 200 && strstr(out, "X-Sluice-Tier: interactive")) {
            ld->ok++;
        } else if (ld->bad++ == 0) {
            ld->bad_status = st;
            snprintf(ld->bad_body, sizeof ld->bad_body, "%.1000s", out);
        }
        pthread_cond_broadcast(&ld->cv);
        pthread_mutex_unlock(&ld->mu);
    }
    return NULL;
}

/* Waits until the load threads have had `more` further successes (or any failure). */
static void wait_ok(struct load *ld, long more)
{
    pthread_mutex_lock(&ld->mu);
    long want = ld->ok + more;
    while (ld->ok < want && ld->bad == 0)
        pthread_cond_wait(&ld->cv, &ld->mu);
    pthread_mutex_unlock(&ld->mu);
}

static long admin_batch_weight(void)
{
    struct response r = req("GET", "/admin/config", AUTH(ADMIN), NULL);
    cr_assert_eq(r.status, 200);
    json_t *j = parse_json(r.body);
    long w = (long)json_integer_value(
        json_object_get(json_object_get(json_object_get(j, "tiers"), "batch"), "weight"));
    json_decref(j);
    response_dispose(&r);
    return w;
}

Test(tenants, reload_under_load_serves_every_request_when_config_changes_or_breaks)
{
    enum { THREADS = 4 };
    struct load ld = {.port = srv.port};
    atomic_init(&ld.stop, false);
    pthread_mutex_init(&ld.mu, NULL);
    pthread_cond_init(&ld.cv, NULL);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, load_thread, &ld), 0);
    wait_ok(&ld, THREADS);

    /* Reloads that add a tenant each, and change a tier, while alice's requests keep coming. */
    static const char *const configs[] = {
        CONFIG("1", ALICE_T "," BOB_T "," CAROL_T),
        CONFIG("7", ALICE_T "," BOB_T "," CAROL_T),
        CONFIG("7", ALICE_T "," BOB_T "," CAROL_T "," DAVE_T),
    };
    for (int i = 0; i < 3; i++) {
        write_config(configs[i]);
        cr_assert_eq(sighup(), 0, "reload %d refused:\n%s", i, srv.log);
        wait_ok(&ld, THREADS);
        expect_tier(AUTH(CAROL), small, "interactive");
        if (i == 1)
            cr_assert_eq(admin_batch_weight(), 7, "tiers reload with tenants");
    }
    expect_tier(AUTH(DAVE), small, "batch");

    /* A configuration that does not validate, then one that does not parse: both refused with
     * a line naming the problem, and the old one keeps serving. */
    write_config(CONFIG("7", ALICE_T "," TENANT("eve", "not-a-hash", "[\"batch\"]", "batch")));
    cr_assert_eq(sighup(), 1, "%s", srv.log);
    server_wait_log_any(&srv, (const char *const[]){"tenants[1].key_sha256", NULL});
    wait_ok(&ld, THREADS);
    write_config("{\"tenants\": [");
    cr_assert_eq(sighup(), 1, "%s", srv.log);
    wait_ok(&ld, THREADS);
    expect_tier(AUTH(DAVE), small, "batch");
    expect_tier(AUTH(CAROL), small, "interactive");
    expect_tier(AUTH(BOB), small, "batch");
    cr_assert_eq(admin_batch_weight(), 7);

    atomic_store(&ld.stop, true);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(ld.bad, 0, "%ld of %ld requests failed; the first got %d:\n%s", ld.bad,
                 ld.ok + ld.bad, ld.bad_status, ld.bad_body);
    cr_assert_geq(ld.ok, 6 * THREADS);
    cr_log_info("%ld completions across 5 SIGHUPs, none failed", ld.ok);
    pthread_cond_destroy(&ld.cv);
    pthread_mutex_destroy(&ld.mu);
}
