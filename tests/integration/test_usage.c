/* Metering on the real server (issue 29): what each response says it cost, the device time of
 * all requests against the worker's, /admin/usage and /v1/usage (only the caller's own), and the
 * journal across a kill -9 under load.
 *
 * The kill test waits for a count of answers the clients received, not for a time. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"
#include "tls_cert.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* $1 and $2 a million tokens in and out: a token is 1,000 and 2,000 nano-units. */
#define CONFIG(state)                                                                              \
    "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1,\"currency\":\"credits\",\"price\":"           \
    "{\"input_per_mtok\":1,\"output_per_mtok\":2},\"admin_key_sha256\":\"" ADMIN_SHA "\","         \
    "\"tenants\":[{\"name\":\"alice\",\"key_sha256\":\"" ALICE_SHA "\",\"tiers\":"                 \
    "[\"interactive\",\"batch\"],\"default_tier\":\"interactive\"},{\"name\":\"bob\","             \
    "\"key_sha256\":\"" BOB_SHA "\",\"tiers\":[\"interactive\",\"batch\"],\"default_tier\":"       \
    "\"batch\"}]" state "}"

static struct server srv;
static char state_dir[64];

static void stop(void)
{
    server_stop(&srv);
    if (state_dir[0]) {
        char p[128];
        snprintf(p, sizeof p, "%s/usage.jsonl", state_dir);
        unlink(p);
        rmdir(state_dir);
        state_dir[0] = '\0';
    }
}

TestSuite(usage, .fini = stop, .timeout = 300);

static long long expect_cost(json_t *usage)
{
    return json_integer_value(json_object_get(usage, "prompt_tokens")) * 1000 +
           json_integer_value(json_object_get(usage, "completion_tokens")) * 2000;
}

Test(usage, every_response_says_what_it_cost_and_device_time_adds_up_to_the_worker_s)
{
    server_start_config(&srv, CONFIG(""));
    long long sum = 0;
    const char *bodies[] = {
        "{\"prompt\":\"Once upon a time\",\"max_tokens\":5}",
        "{\"prompt\":\"Lily and Ben went to the park\",\"max_tokens\":9}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}"};
    for (int i = 0; i < 3; i++) {
        int fd = client_connect(srv.port);
        client_request_h(fd, "POST", i == 2 ? "/v1/chat/completions" : "/v1/completions",
                         AUTH(ALICE), bodies[i], false);
        struct response r;
        cr_assert(client_read_response(fd, &r));
        cr_assert_eq(r.status, 200, "%s", r.body);
        json_t *j = json_loads(r.body, 0, NULL);
        json_t *u = json_object_get(j, "usage");
        const char *h = response_header(&r, "x-sluice-cost");
        cr_assert_not_null(h);
        cr_assert_eq(nano_of(h), expect_cost(u), "%s for %s", h, json_dumps(u, 0));
        cr_assert_eq(nano_of(h),
                     (long long)llround(json_number_value(json_object_get(u, "cost")) * 1e9),
                     "the body's usage says the same");
        sum += nano_of(h);
        json_decref(j);
        response_dispose(&r);
        close(fd);
    }
    /* A stream: the final usage chunk has the cost, and the trailer after the last chunk too. */
    char raw[65536];
    int st = client_try_request(srv.port, "POST", "/v1/completions", AUTH(BOB),
                                "{\"prompt\":\"Once upon a time\",\"max_tokens\":6,\"stream\":true,"
                                "\"stream_options\":{\"include_usage\":true}}",
                                raw, sizeof raw);
    cr_assert_eq(st, 200);
    cr_assert(strstr(raw, "Trailer: x-sluice-cost\r\n"), "announced in the head");
    const char *t = strstr(raw, "\r\n0\r\nx-sluice-cost: ");
    cr_assert_not_null(t, "%s", raw);
    long long trailer = nano_of(t + 20);
    const char *chunk = strstr(raw, "\"choices\":[],\"usage\":");
    cr_assert_not_null(chunk);
    json_t *u = json_loads(chunk + 21, JSON_DISABLE_EOF_CHECK, NULL); /* the usage object */
    cr_assert_not_null(u);
    cr_assert_eq(trailer, expect_cost(u));
    json_decref(u);
    sum += trailer;
    /* Every forward's time went to some request: the tenants' device time is the worker's. */
    double busy = metrics_fetch_sum(srv.port, "sluice:worker_busy_seconds_total");
    double dev = metrics_fetch_sum(srv.port, "sluice:tenant_device_seconds_total");
    cr_assert_gt(busy, 0);
    cr_assert(fabs(busy - dev) <= 2e-6, "busy %.9f s, charged %.9f s", busy, dev);
    double cost = metrics_fetch_sum(srv.port, "sluice:tenant_cost_total");
    cr_assert(fabs(cost * 1e9 - (double)sum) < 1, "metrics %.9f, responses %lld", cost, sum);
}

Test(usage, usage_routes_show_the_admin_everyone_and_a_tenant_only_itself)
{
    server_start_config(&srv, CONFIG(""));
    char raw[16384];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", AUTH(ALICE),
                                        "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", raw,
                                        sizeof raw),
                     200);
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", AUTH(BOB),
                                    "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}", raw,
                                    sizeof raw),
                 200);
    /* Bob sees Bob. */
    cr_assert_eq(client_try_request(srv.port, "GET", "/v1/usage", AUTH(BOB), NULL, raw, sizeof raw),
                 200);
    json_t *j = json_loads(strstr(raw, "\r\n\r\n") + 4, 0, NULL);
    cr_assert_not_null(j, "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(j, "tenant")), "bob");
    cr_assert_str_eq(json_string_value(json_object_get(j, "currency")), "credits");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "total"), "requests")), 1);
    cr_assert_null(strstr(raw, "alice"), "nothing of another tenant: %s", raw);
    json_decref(j);
    /* A tenant's key does not open the admin's route; nor does a tenant= parameter widen its own.
     */
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/admin/usage", AUTH(BOB), NULL, raw, sizeof raw), 401);
    cr_assert_eq(client_try_request(srv.port, "GET", "/v1/usage?tenant=alice", AUTH(BOB), NULL, raw,
                                    sizeof raw),
                 200);
    cr_assert_null(strstr(raw, "alice"), "%s", raw);
    /* The admin sees both, grouped as asked, and filters by tenant. */
    cr_assert_eq(client_try_request(srv.port, "GET", "/admin/usage?group_by=tenant", AUTH(ADMIN),
                                    NULL, raw, sizeof raw),
                 200);
    j = json_loads(strstr(raw, "\r\n\r\n") + 4, 0, NULL);
    json_t *data = json_object_get(j, "data");
    cr_assert_eq(json_array_size(data), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(data, 0), "tenant")),
                     "alice");
    cr_assert_eq(json_integer_value(json_object_get(json_array_get(data, 0), "requests")), 2);
    cr_assert_null(json_object_get(json_array_get(data, 0), "model"), "not grouped by model");
    json_decref(j);
    cr_assert_eq(client_try_request(srv.port, "GET",
                                    "/admin/usage?tenant=bob&group_by=model,hour&from=2020-01-01",
                                    AUTH(ADMIN), NULL, raw, sizeof raw),
                 200);
    j = json_loads(strstr(raw, "\r\n\r\n") + 4, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "total"), "requests")), 1);
    cr_assert_not_null(json_object_get(json_array_get(json_object_get(j, "data"), 0), "hour"));
    json_decref(j);
    /* Bad parameters are 400s that name them. */
    cr_assert_eq(client_try_request(srv.port, "GET", "/admin/usage?to=tomorrow", AUTH(ADMIN), NULL,
                                    raw, sizeof raw),
                 400);
    cr_assert(strstr(raw, "\"param\":\"to\""), "%s", raw);
    cr_assert_eq(client_try_request(srv.port, "GET", "/admin/usage?group_by=day", AUTH(ADMIN), NULL,
                                    raw, sizeof raw),
                 400);
    cr_assert(strstr(raw, "\"param\":\"group_by\""), "%s", raw);
    /* Without redis there is no fleet to ask: scope=replica is the only scope, and the default. */
    cr_assert_eq(client_try_request(srv.port, "GET", "/admin/usage?scope=fleet", AUTH(ADMIN), NULL,
                                    raw, sizeof raw),
                 400);
    cr_assert(strstr(raw, "\"param\":\"scope\""), "%s", raw);
    cr_assert_eq(client_try_request(srv.port, "GET", "/v1/usage?scope=replica", AUTH(BOB), NULL,
                                    raw, sizeof raw),
                 200);
    cr_assert(strstr(raw, "\"scope\":\"replica\""), "%s", raw);
}

/* ---- the journal across kill -9 ---- */

#define SENDERS 4
#define PER_SENDER 60
#define KILL_AFTER 80

struct load {
    int port;
    atomic_int done; /* answers received whole */
    atomic_llong prompt, completion;
};

/* A whole answer's usage, or false when the answer was cut off (the kill). */
static bool whole_usage(const char *raw, bool stream, long long *prompt, long long *completion)
{
    const char *u = stream ? strstr(raw, "\"choices\":[],\"usage\":") : strstr(raw, "\"usage\":");
    if (!u || (stream && !strstr(raw, "data: [DONE]")))
        return false;
    u = strstr(u, "\"usage\":") + 8;
    json_t *j = json_loads(u, JSON_DISABLE_EOF_CHECK, NULL); /* the usage object alone */
    if (!j)
        return false;
    *prompt = json_integer_value(json_object_get(j, "prompt_tokens"));
    *completion = json_integer_value(json_object_get(j, "completion_tokens"));
    json_decref(j);
    return stream || strstr(raw, "}}") != NULL; /* the body's end */
}

static void *sender(void *arg)
{
    struct load *l = arg;
    static char raw[SENDERS][65536];
    static atomic_int next;
    int me = atomic_fetch_add(&next, 1) % SENDERS;
    for (int i = 0; i < PER_SENDER; i++) {
        bool stream = (i + me) % 2;
        int st = client_try_request(
            l->port, "POST", "/v1/completions", AUTH(ALICE),
            stream ? "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"stream\":true,"
                     "\"stream_options\":{\"include_usage\":true}}"
                   : "{\"prompt\":\"Once upon a time there was\",\"max_tokens\":8}",
            raw[me], sizeof raw[me]);
        long long p, c;
        if (st != 200 || !whole_usage(raw[me], stream, &p, &c))
            return NULL; /* the server is gone */
        atomic_fetch_add(&l->prompt, p);
        atomic_fetch_add(&l->completion, c);
        atomic_fetch_add(&l->done, 1);
    }
    return NULL;
}

Test(usage, the_journal_keeps_every_answer_clients_received_across_a_kill_9)
{
    snprintf(state_dir, sizeof state_dir, "/tmp/sluice-usage-state-XXXXXX");
    cr_assert_not_null(mkdtemp(state_dir));
    char config[4096];
    snprintf(config, sizeof config, CONFIG(",\"state_dir\":\"%s\""), state_dir);
    server_start_config(&srv, config);
    server_log_pump(&srv, true);
    struct load l = {.port = srv.port};
    pthread_t th[SENDERS];
    for (int i = 0; i < SENDERS; i++)
        pthread_create(&th[i], NULL, sender, &l);
    while (atomic_load(&l.done) < KILL_AFTER)
        sched_yield();
    kill(srv.pid, SIGKILL);
    for (int i = 0; i < SENDERS; i++)
        pthread_join(th[i], NULL);
    server_log_pump(&srv, false);
    server_wait_exit(&srv);
    int done = atomic_load(&l.done);
    cr_assert_lt(done, SENDERS * PER_SENDER, "the kill came before the end of the load");

    /* The restarted server has on record every answer the clients received whole, and at most
     * the requests in flight at the kill besides (ran, their answers cut off). */
    server_start_config(&srv, config);
    char raw[16384];
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/admin/usage", AUTH(ADMIN), NULL, raw, sizeof raw),
        200);
    json_t *j = json_loads(strstr(raw, "\r\n\r\n") + 4, 0, NULL);
    json_t *total = json_object_get(j, "total");
    long long req = json_integer_value(json_object_get(total, "requests"));
    long long prompt = json_integer_value(json_object_get(total, "prompt_tokens"));
    long long completion = json_integer_value(json_object_get(total, "completion_tokens"));
    json_decref(j);
    cr_assert_geq(req, done, "on record %lld, received %d", req, done);
    cr_assert_leq(req, done + SENDERS, "on record %lld, received %d", req, done);
    cr_assert_geq(prompt, (long long)atomic_load(&l.prompt));
    cr_assert_geq(completion, (long long)atomic_load(&l.completion));
    cr_assert_leq(completion, (long long)atomic_load(&l.completion) + SENDERS * 8);
    /* Finance's export reads the same journal, beside the running server. */
    char args[256], out[8192];
    snprintf(args, sizeof args,
             "usage export --state-dir '%s' --group-by tenant --format json "
             "--currency credits",
             state_dir);
    cr_assert_eq(sluice_run(args, out, sizeof out), 0, "%s", out);
    json_t *e = json_loads(out, 0, NULL);
    cr_assert(json_is_array(e) && json_array_size(e) == 1, "%s", out);
    json_t *r0 = json_array_get(e, 0);
    cr_assert_str_eq(json_string_value(json_object_get(r0, "tenant")), "alice");
    cr_assert_eq(json_integer_value(json_object_get(r0, "requests")), req);
    cr_assert_eq(json_integer_value(json_object_get(r0, "prompt_tokens")), prompt);
    cr_assert_str_eq(json_string_value(json_object_get(r0, "currency")), "credits");
    json_decref(e);
}

/* The key_sha256 a configuration gives for key. */
static void key_hash(const char *key, char hex[65])
{
    unsigned char h[32];
    SHA256((const unsigned char *)key, strlen(key), h);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
}

/* A budget of 100,000 nano-units a day; each request's worst case is 5 prompt tokens at 1,000 and
 * 10 generated at 2,000: 25,000. */
Test(usage, a_budget_refuses_with_insufficient_quota_exactly_when_the_worst_case_would_not_fit)
{
    char hex[65], config[4096];
    key_hash(CAROL, hex);
    snprintf(config, sizeof config,
             "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1,\"price\":{\"input_per_mtok\":1,"
             "\"output_per_mtok\":2},\"tenants\":[{\"name\":\"carol\",\"key_sha256\":\"%s\","
             "\"tiers\":[\"interactive\"],\"default_tier\":\"interactive\",\"budget\":"
             "{\"amount\":0.0001,\"period\":\"day\",\"soft_pct\":50}}]}",
             hex);
    server_start_config(&srv, config);
    long long spent = 0, worst = 5 * 1000 + 10 * 2000;
    int admitted = 0, refused = 0;
    for (int i = 0; i < 8; i++) {
        int fd = client_connect(srv.port);
        client_request_h(fd, "POST", "/v1/completions", AUTH(CAROL),
                         "{\"prompt\":\"Once upon a time\",\"max_tokens\":10}", false);
        struct response r;
        cr_assert(client_read_response(fd, &r));
        close(fd);
        if (spent + worst <= 100000) {
            cr_assert_eq(r.status, 200, "request %d: %lld spent, %lld more fit: %s", i, spent,
                         worst, r.body);
            json_t *j = json_loads(r.body, 0, NULL);
            cr_assert_eq(
                json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")),
                5);
            json_decref(j);
            spent += nano_of(response_header(&r, "x-sluice-cost"));
            const char *b = response_header(&r, "x-sluice-budget");
            cr_assert_eq(b != NULL,
                         spent > 0 &&
                             (spent - nano_of(response_header(&r, "x-sluice-cost")) + worst) * 2 >=
                                 100000,
                         "warned past 50 %% of the budget (%s)", b ? b : "none");
            admitted++;
        } else {
            cr_assert_eq(r.status, 429, "request %d: %lld spent, %lld would not fit", i, spent,
                         worst);
            cr_assert(strstr(r.body, "\"type\":\"insufficient_quota\""), "%s", r.body);
            cr_assert(strstr(r.body, "\"code\":\"insufficient_quota\""), "%s", r.body);
            cr_assert_str_eq(response_header(&r, "x-should-retry"), "false");
            cr_assert_not_null(response_header(&r, "retry-after"), "a day budget resets");
            cr_assert(strncmp(response_header(&r, "x-sluice-budget"), "exhausted; used=", 16) == 0);
            refused++;
        }
        response_dispose(&r);
    }
    cr_assert_gt(admitted, 0);
    cr_assert_gt(refused, 0);
    double ratio = metrics_fetch_sum(srv.port, "sluice:tenant_budget_used_ratio");
    cr_assert(fabs(ratio - (double)spent / 100000.0) < 1e-6, "gauge %f, spent %lld", ratio, spent);
    /* The tenant sees its budget in /v1/usage. */
    char raw[16384];
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/v1/usage", AUTH(CAROL), NULL, raw, sizeof raw), 200);
    json_t *j = json_loads(strstr(raw, "\r\n\r\n") + 4, 0, NULL);
    json_t *b = json_object_get(j, "budget");
    cr_assert(json_is_object(b), "%s", raw);
    cr_assert_str_eq(json_string_value(json_object_get(b, "period")), "day");
    cr_assert_eq(llround(json_number_value(json_object_get(b, "amount")) * 1e9), 100000);
    cr_assert_eq(llround(json_number_value(json_object_get(b, "spent")) * 1e9), spent);
    cr_assert_eq(llround(json_number_value(json_object_get(b, "remaining")) * 1e9), 100000 - spent);
    cr_assert_not_null(json_string_value(json_object_get(b, "period_end")));
    json_decref(j);
}

/* ---- the budget webhook ---- */

struct receiver {
    int fd; /* listening */
    int port;
    int attempts;         /* requests received */
    char first_line[256]; /* of the last */
    char body[2048];      /* of the last */
};

/* Reads one HTTP request from c (head and Content-Length body), over ssl when not NULL, into
 * r. */
static bool read_request(int c, SSL *ssl, struct receiver *r)
{
    char buf[8192];
    size_t len = 0;
    struct timeval guard = {30, 0}; /* a guard against a hang, not a wait */
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &guard, sizeof guard);
    for (;;) {
        ssize_t n = ssl ? SSL_read(ssl, buf + len, (int)(sizeof buf - 1 - len))
                        : recv(c, buf + len, sizeof buf - 1 - len, 0);
        if (n <= 0)
            return false;
        len += (size_t)n;
        buf[len] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (!end)
            continue;
        const char *cl = strcasestr(buf, "content-length:");
        size_t want = cl ? (size_t)atol(cl + 15) : 0;
        if (len - (size_t)(end + 4 - buf) < want)
            continue;
        snprintf(r->first_line, sizeof r->first_line, "%.*s", (int)strcspn(buf, "\r"), buf);
        snprintf(r->body, sizeof r->body, "%.*s", (int)want, end + 4);
        return true;
    }
}

/* Answers the first attempt 500 and the second 204. */
static void *receive(void *arg)
{
    struct receiver *r = arg;
    for (int i = 0; i < 2; i++) {
        struct pollfd p = {.fd = r->fd, .events = POLLIN};
        if (poll(&p, 1, 30000) <= 0)
            return NULL;
        int c = accept(r->fd, NULL, NULL);
        if (c < 0)
            return NULL;
        if (read_request(c, NULL, r)) {
            r->attempts++;
            const char *ans = i == 0 ? "HTTP/1.1 500 Internal Server Error\r\nContent-Length: "
                                       "0\r\nConnection: close\r\n\r\n"
                                     : "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
            send(c, ans, strlen(ans), MSG_NOSIGNAL);
        }
        close(c);
    }
    return NULL;
}

Test(usage, passing_the_soft_threshold_posts_the_webhook_and_retries_it)
{
    struct receiver r = {.fd = socket(AF_INET, SOCK_STREAM, 0)};
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(r.fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    getsockname(r.fd, (struct sockaddr *)&a, &al);
    r.port = ntohs(a.sin_port);
    cr_assert_eq(listen(r.fd, 4), 0);
    pthread_t th;
    pthread_create(&th, NULL, receive, &r);
    char hex[65], config[4096];
    key_hash(CAROL, hex);
    snprintf(config, sizeof config,
             "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1,\"currency\":\"EUR\",\"price\":"
             "{\"input_per_mtok\":1,\"output_per_mtok\":2},\"budget_webhook\":"
             "\"http://127.0.0.1:%d/hooks/budget?from=sluice\",\"tenants\":[{\"name\":\"carol\","
             "\"key_sha256\":\"%s\",\"tiers\":[\"interactive\"],\"default_tier\":\"interactive\","
             "\"budget\":{\"amount\":0.0001,\"period\":\"day\",\"soft_pct\":50}}]}",
             r.port, hex);
    server_start_config(&srv, config);
    /* Two worst cases of 25,000 make 50 % of 100,000: the second crosses. */
    char raw[16384];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", AUTH(CAROL),
                                        "{\"prompt\":\"Once upon a time\",\"max_tokens\":10}", raw,
                                        sizeof raw),
                     200);
    pthread_join(th, NULL);
    close(r.fd);
    cr_assert_eq(r.attempts, 2, "a 500, then again");
    cr_assert_str_eq(r.first_line, "POST /hooks/budget?from=sluice HTTP/1.1");
    json_t *j = json_loads(r.body, 0, NULL);
    cr_assert_not_null(j, "%s", r.body);
    cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "budget.soft_limit");
    cr_assert_str_eq(json_string_value(json_object_get(j, "tenant")), "carol");
    cr_assert_str_eq(json_string_value(json_object_get(j, "currency")), "EUR");
    cr_assert_str_eq(json_string_value(json_object_get(j, "period")), "day");
    cr_assert_eq(json_integer_value(json_object_get(j, "soft_pct")), 50);
    cr_assert_eq(json_real_value(json_object_get(j, "used")), 0.5);
    cr_assert_eq(json_real_value(json_object_get(j, "budget")), 0.0001);
    cr_assert_not_null(json_object_get(j, "period_start"));
    json_decref(j);
    server_wait_log(&srv, "webhook for tenant 'carol' answered 204");
}

/* ---- the budget webhook over https ---- */

struct tls_receiver {
    struct receiver r;
    SSL_CTX *ctx[2]; /* the certificate of each attempt */
    int refused;     /* handshakes the client gave up */
};

/* The first attempt meets a certificate sluice does not trust; the second one it does. */
static void *receive_tls(void *arg)
{
    struct tls_receiver *t = arg;
    for (int i = 0; i < 2; i++) {
        struct pollfd p = {.fd = t->r.fd, .events = POLLIN};
        if (poll(&p, 1, 30000) <= 0)
            return NULL;
        int c = accept(t->r.fd, NULL, NULL);
        if (c < 0)
            return NULL;
        SSL *ssl = SSL_new(t->ctx[i]);
        SSL_set_fd(ssl, c);
        struct timeval guard = {30, 0};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &guard, sizeof guard);
        if (SSL_accept(ssl) != 1) {
            t->refused++;
        } else if (read_request(c, ssl, &t->r)) {
            t->r.attempts++;
            const char *ans = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
            SSL_write(ssl, ans, (int)strlen(ans));
            SSL_shutdown(ssl);
        }
        SSL_free(ssl);
        close(c);
    }
    return NULL;
}

static SSL_CTX *server_ctx(EVP_PKEY *k, X509 *x)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    cr_assert(ctx && SSL_CTX_use_certificate(ctx, x) == 1 && SSL_CTX_use_PrivateKey(ctx, k) == 1);
    return ctx;
}

Test(usage, an_https_webhook_sends_only_to_a_server_whose_certificate_it_trusts)
{
    EVP_PKEY *good_key = tls_key_new(), *bad_key = tls_key_new();
    X509 *good = tls_cert_new(good_key, "hooks.sluice.test", 11, "127.0.0.1"),
         *bad = tls_cert_new(bad_key, "hooks.sluice.test", 12, "127.0.0.1");
    /* The server trusts the good certificate alone (OpenSSL's SSL_CERT_FILE). */
    char ca[] = "/tmp/sluice-webhook-ca-XXXXXX";
    int fd = mkstemp(ca);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert(PEM_write_X509(f, good));
    fclose(f);
    setenv("SSL_CERT_FILE", ca, 1);
    setenv("SSL_CERT_DIR", "/nonexistent", 1);
    struct tls_receiver t = {.r.fd = socket(AF_INET, SOCK_STREAM, 0),
                             .ctx = {server_ctx(bad_key, bad), server_ctx(good_key, good)}};
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(bind(t.r.fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t al = sizeof a;
    getsockname(t.r.fd, (struct sockaddr *)&a, &al);
    cr_assert_eq(listen(t.r.fd, 4), 0);
    pthread_t th;
    pthread_create(&th, NULL, receive_tls, &t);
    char hex[65], config[4096];
    key_hash(CAROL, hex);
    snprintf(config, sizeof config,
             "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1,\"price\":"
             "{\"input_per_mtok\":1,\"output_per_mtok\":2},\"budget_webhook\":"
             "\"https://127.0.0.1:%d/hooks/budget\",\"tenants\":[{\"name\":\"carol\","
             "\"key_sha256\":\"%s\",\"tiers\":[\"interactive\"],\"default_tier\":"
             "\"interactive\",\"budget\":{\"amount\":0.0001,\"period\":\"day\","
             "\"soft_pct\":20}}]}",
             ntohs(a.sin_port), hex);
    server_start_config(&srv, config);
    char raw[16384];
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", AUTH(CAROL),
                                    "{\"prompt\":\"Once upon a time\",\"max_tokens\":10}", raw,
                                    sizeof raw),
                 200);
    pthread_join(th, NULL);
    close(t.r.fd);
    unlink(ca);
    cr_assert_eq(t.refused, 1, "the untrusted certificate was refused");
    cr_assert_eq(t.r.attempts, 1, "then the trusted server got the notice");
    cr_assert_str_eq(t.r.first_line, "POST /hooks/budget HTTP/1.1");
    json_t *j = json_loads(t.r.body, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "tenant")), "carol");
    json_decref(j);
    server_wait_log(&srv, "certificate verify failed");
    server_wait_log(&srv, "webhook for tenant 'carol' answered 204");
    for (int i = 0; i < 2; i++)
        SSL_CTX_free(t.ctx[i]);
    X509_free(good);
    X509_free(bad);
    EVP_PKEY_free(good_key);
    EVP_PKEY_free(bad_key);
}

/* ---- a client that leaves, and a reload ---- */

static long long admin_total(const char *field)
{
    char raw[16384];
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/admin/usage", AUTH(ADMIN), NULL, raw, sizeof raw),
        200);
    json_t *j = json_loads(strstr(raw, "\r\n\r\n") + 4, 0, NULL);
    long long v = json_integer_value(json_object_get(json_object_get(j, "total"), field));
    json_decref(j);
    return v;
}

Test(usage, a_client_that_leaves_pays_for_what_ran_and_a_reload_changes_prices_not_usage)
{
    server_start_config(&srv, CONFIG(""));
    /* A stream of up to 200 tokens; the client leaves after the first text. */
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(ALICE),
                     "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"stream\":true,"
                     "\"ignore_eos\":true}",
                     true);
    char buf[4096];
    cr_assert(client_read_until(fd, "\"text\":", buf, sizeof buf));
    close(fd);
    server_wait_log(&srv, "\"status\":499");
    cr_assert_eq(admin_total("requests"), 1, "metered although its client left");
    long long completion = admin_total("completion_tokens");
    cr_assert_gt(completion, 0);
    cr_assert_lt(completion, 200, "only what ran");
    long long cost = admin_total("prompt_tokens") * 1000 + completion * 2000;
    double metric = metrics_fetch_sum(srv.port, "sluice:tenant_cost_total");
    cr_assert(fabs(metric * 1e9 - (double)cost) < 1, "%f against %lld", metric, cost);
    /* Prices ten times higher from the reload on; usage stays. */
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s", CONFIG(""));
    char *p = strstr(cfg, "\"input_per_mtok\":1,\"output_per_mtok\":2");
    cr_assert_not_null(p);
    memcpy(p, "\"input_per_mtok\":9,\"output_per_mtok\":8", 38);
    cr_assert(server_reload_config(&srv, cfg), "%s", srv.log);
    cr_assert_eq(admin_total("requests"), 1, "a reload resets no usage");
    char raw[16384];
    cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions", AUTH(ALICE),
                                    "{\"prompt\":\"Once upon a time\",\"max_tokens\":3,"
                                    "\"ignore_eos\":true}",
                                    raw, sizeof raw),
                 200);
    const char *h = strcasestr(raw, "x-sluice-cost: ");
    cr_assert_not_null(h);
    cr_assert_eq(nano_of(h + 15), 5 * 9000 + 3 * 8000, "the new prices");
    cr_assert_eq(admin_total("requests"), 2);
}
