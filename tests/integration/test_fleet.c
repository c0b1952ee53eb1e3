/* The fleet's budgets on the real server (issue 28), around a request that waits for Redis's
 * answer: its client leaving, and a drain, while Redis is stopped (SIGSTOP) with a long
 * timeout_ms. The budgets across replicas, Redis killed and Redis answering late are
 * tests/fleet/replicas.py's; the client's own behaviour is tests/fleet/test_client.c's.
 *
 * Waits are for conditions the server publishes (sluice:fleet_pending, log lines), never for a
 * length of time. */
#include <criterion/criterion.h>

#include "harness.h"
#include "redis_server.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BODY "{\"prompt\":\"Once upon a time\",\"max_tokens\":2}"

static struct server srv;
static struct redis_server redis;
static char cfg_path[64];
static bool running;

static void start(void)
{
    redis = (struct redis_server){0};
    if (!redis_server_start(&redis))
        cr_skip_test("redis-server is not installed (scripts/setup.sh installs it)");
    snprintf(cfg_path, sizeof cfg_path, "/tmp/sluice-fleet-%d.json", (int)getpid());
    FILE *f = fopen(cfg_path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1,\"redis\":{\"url\":"
            "\"redis://127.0.0.1:%d\",\"timeout_ms\":60000},\"tenants\":[{\"name\":\"alice\","
            "\"key_sha256\":\"" ALICE_SHA "\",\"tiers\":[\"interactive\",\"batch\"],"
            "\"default_tier\":\"interactive\",\"rpm\":600}]}",
            redis.port);
    cr_assert_eq(fclose(f), 0);
    const char *args[] = {"--config", cfg_path, NULL};
    server_start(&srv, args);
    running = true;
    server_wait_log(&srv, "fleet: connected to redis");
}

static void stop(void)
{
    if (redis.pid)
        kill(redis.pid, SIGCONT);
    if (running)
        server_stop(&srv);
    running = false;
    redis_server_stop(&redis);
    unlink(cfg_path);
}

TestSuite(fleet, .init = start, .fini = stop, .timeout = 300);

/* Sends a completion on a connection of its own and waits until the server counts it as
 * waiting for Redis. Returns the connection. */
static int send_waiting(void)
{
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(ALICE), BODY, true);
    double n;
    while ((n = metrics_fetch_sum(srv.port, "sluice:fleet_pending")) == 0)
        ;
    cr_assert_eq(n, 1, "one request waits for Redis's answer");
    return fd;
}

Test(fleet, a_request_answered_by_redis_is_admitted_with_the_fleet_budget_in_its_headers)
{
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(ALICE), BODY, false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_str_eq(response_header(&r, "x-sluice-admission"), "admitted");
    cr_assert_str_eq(response_header(&r, "x-ratelimit-remaining-requests"), "599");
    response_dispose(&r);
    close(fd);
    cr_assert_eq(metrics_fetch_sum(srv.port, "sluice:redis_up"), 1);
    cr_assert_eq(metrics_fetch_sum(srv.port, "sluice:fleet_pending"), 0);
}

Test(fleet, a_client_that_leaves_while_redis_is_stopped_is_let_go_and_the_server_goes_on)
{
    kill(redis.pid, SIGSTOP);
    int fd = send_waiting();
    close(fd);
    server_wait_log(&srv, "\"status\":499");
    cr_assert_eq(metrics_fetch_sum(srv.port, "sluice:fleet_pending"), 0, "its take was let go");
    kill(redis.pid, SIGCONT);
    /* The same thread's connection carries the late answer, then the next request. */
    fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(ALICE), BODY, false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert_str_eq(response_header(&r, "x-sluice-admission"), "admitted");
    response_dispose(&r);
    close(fd);
}

Test(fleet, a_drain_answers_a_request_waiting_for_redis_with_503)
{
    kill(redis.pid, SIGSTOP);
    int fd = send_waiting();
    kill(srv.pid, SIGTERM);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 503, "%s", r.body);
    cr_assert(strstr(r.body, "draining"), "%s", r.body);
    cr_assert_not_null(response_header(&r, "retry-after"));
    response_dispose(&r);
    close(fd);
    running = false;
    cr_assert_eq(server_wait_exit(&srv), 0, "a clean exit with a take still unanswered");
}
