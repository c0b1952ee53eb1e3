/* Faults and overload against the real server over loopback (issue 9): a worker whose forward
 * fails. Each test asserts what must hold whatever the timing (requests
 * complete, blocks come back, errors have their documented shape); how fast things go under
 * such load is measured in bench/ (bench/scenarios/slowloris.sh), never asserted here.
 *
 * Nothing here sleeps to wait for an event. The only waits on time are the polls of /metrics for
 * the scheduler to have freed what cancelled requests held (nothing tells a client when that
 * happens), and those are bounded failure guards. */
#include <criterion/criterion.h>

#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static struct server srv;
static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/sluice-faults-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    server_log_pump(&srv, false);
    if (srv.pid)
        server_stop(&srv);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Polls the scheduler's gauges until nothing runs, waits or holds a KV block (or fails after
 * 60 s). The scheduler frees a cancelled request's blocks within a step, but no event tells a
 * client when; the poll interval only spaces the scrapes. */
static void wait_engine_idle(int port)
{
    double used = -1, running = -1, waiting = -1;
    for (int i = 0; i < 6000; i++) {
        used = metrics_fetch_sum(port, "sluice:kv_blocks_used");
        running = metrics_fetch_sum(port, "sluice:num_requests_running");
        waiting = metrics_fetch_sum(port, "sluice:num_requests_waiting");
        if (used == 0 && running == 0 && waiting == 0)
            return;
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    cr_assert_fail("the engine did not go idle: %g KV blocks used, %g running, %g waiting", used,
                   running, waiting);
}

/* The sum of the samples of family `name` whose labels contain `label` (outcome="error"). */
static double metric_where(const char *text, const char *name, const char *label)
{
    size_t nl = strlen(name);
    double sum = 0;
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        const char *close = memchr(p, '}', len);
        if (strncmp(p, name, nl) == 0 && p[nl] == '{' && close &&
            memmem(p, (size_t)(close - p), label, strlen(label)))
            sum += strtod(close + 1, NULL);
        if (!eol)
            break;
        p = eol + 1;
    }
    return sum;
}

/* Reads a response; the body of a stream is its whole event stream. */
static struct response request(int port, const char *path, const char *body)
{
    int fd = client_connect(port);
    if (body)
        client_request(fd, "POST", path, body, false);
    else
        client_request(fd, "GET", path, NULL, false);
    struct response r;
    cr_assert(client_read_response(fd, &r), "%s: no answer", path);
    close(fd);
    return r;
}

/* ---- a worker that fails a step ---- */

Test(faults, failed_step_gets_500_or_error_event_and_server_stays_ready_when_worker_fails,
     .init = make_dir, .fini = remove_dir, .timeout = 300)
{
    /* One request at a time, so forward call n is a known step of a known request: call 1 is
     * the first request's prompt; calls 2 and 3 the second's prompt and first decode, call 4
     * its second decode. */
    cr_assert_eq(setenv("SLUICE_FAULT_FORWARD", "1,4", 1), 0);
    const char *bin = getenv("SLUICE_FAULT_BIN");
    cr_assert_not_null(bin, "SLUICE_FAULT_BIN is not set (run through meson test)");
    server_start_bin(&srv, bin, NULL);
    unsetenv("SLUICE_FAULT_FORWARD");

    /* The whole completion whose prompt step fails: a JSON 500 that names no internals. */
    struct response r =
        request(srv.port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":4}");
    cr_assert_eq(r.status, 500, "%s", r.body);
    cr_assert(strstr(r.body, "\"type\":\"server_error\""), "%s", r.body);
    cr_assert(strstr(r.body, "\"message\":\"The engine failed while generating: "), "%s", r.body);
    cr_assert_null(strstr(r.body, ".c:"), "%s", r.body);
    response_dispose(&r);
    server_wait_log(&srv, "fault injection: forward call 1 fails");

    /* The server is still ready, and other routes are unaffected. */
    r = request(srv.port, "/readyz", NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);

    /* A stream whose third step fails: the text so far, then an error event, then [DONE]. */
    r = request(srv.port, "/v1/completions",
                "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0,"
                "\"stream\":true}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    const char *err = strstr(r.body, "data: {\"error\":");
    cr_assert_not_null(err, "no error event: %s", r.body);
    cr_assert(strstr(err, "\"type\":\"server_error\""), "%s", err);
    cr_assert(strstr(err, "data: [DONE]\n\n"), "%s", err);
    cr_assert(strstr(r.body, "\"text\":"), "the first tokens came before the error: %s", r.body);
    cr_assert_null(strstr(r.body, "\"finish_reason\":\"length\""), "%s", r.body);
    response_dispose(&r);
    server_wait_log(&srv, "fault injection: forward call 4 fails");

    /* Every later request is served normally. */
    for (int i = 0; i < 3; i++) {
        r = request(srv.port, "/v1/completions",
                    i == 1 ? "{\"prompt\":\"Once\",\"max_tokens\":8,\"stream\":true}"
                           : "{\"prompt\":\"Once\",\"max_tokens\":8}");
        cr_assert_eq(r.status, 200, "%s", r.body);
        cr_assert_null(strstr(r.body, "\"error\""), "%s", r.body);
        response_dispose(&r);
    }
    r = request(srv.port, "/readyz", NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    /* The failed requests gave their KV blocks back and were counted as errors. */
    wait_engine_idle(srv.port);
    r = request(srv.port, "/metrics", NULL);
    double errors = metric_where(r.body, "sluice:requests_total", "outcome=\"error\"");
    cr_assert_eq(errors, 2, "requests counted as errors: %g", errors);
    response_dispose(&r);
}

Test(faults, release_binary_ignores_the_fault_variable_when_it_is_set, .init = make_dir,
     .fini = remove_dir)
{
    cr_assert_eq(setenv("SLUICE_FAULT_FORWARD", "1,2,3,4", 1), 0);
    server_start(&srv, NULL);
    unsetenv("SLUICE_FAULT_FORWARD");
    struct response r =
        request(srv.port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":4}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    cr_assert_null(strstr(srv.log, "fault injection"), "%s", srv.log);
}
