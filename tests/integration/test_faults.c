/* Faults and overload against the real server over loopback (issue 9): slow-loris connections,
 * clients that vanish mid-stream, a worker whose forward fails, and ten thousand idle
 * keep-alive connections. Each test asserts what must hold whatever the timing (requests
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

static void stop(void)
{
    server_log_pump(&srv, false);
    if (srv.pid)
        server_stop(&srv);
}

/* True under AddressSanitizer, whose redzones and quarantine make memory figures meaningless. */
static bool asan_build(void)
{
    const char *s = getenv("SLUICE_SANITIZE");
    return s && strstr(s, "address");
}

/* A blocking loopback connection without criterion assertions (any thread may dial). */
static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = 120}; /* a failure guard: a server that never answers */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static bool send_str(int fd, const char *s, size_t len)
{
    while (len) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        if (n <= 0)
            return false;
        s += n;
        len -= (size_t)n;
    }
    return true;
}

static int post_len(char *out, size_t max, const char *path, const char *body, bool close)
{
    return snprintf(out, max,
                    "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: %zu\r\n%s\r\n%s",
                    path, strlen(body), close ? "Connection: close\r\n" : "", body);
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

/* ---- slow loris ---- */

#define SLOW_CONNS 2000
#define SLOW_CAP 8192 /* bytes of head each slow client sends at most (the limit is 16 KiB) */

struct drip {
    int *fds;
    int n;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long rounds;
    long bytes;
};

/* The slow clients' head: a request line, then one header whose value never ends. */
static char slow_byte(size_t off)
{
    static const char head[] = "GET /healthz HTTP/1.1\r\nHost: slow\r\nX-Slow: ";
    return off < sizeof head - 1 ? head[off] : 'a';
}

/* One byte per connection per round, round after round, until told to stop. */
static void *drip_main(void *arg)
{
    struct drip *d = arg;
    size_t *off = calloc((size_t)d->n, sizeof *off);
    while (!atomic_load(&d->stop)) {
        long sent = 0;
        for (int i = 0; i < d->n && !atomic_load(&d->stop); i++) {
            if (off[i] >= SLOW_CAP)
                continue;
            char b = slow_byte(off[i]);
            if (send(d->fds[i], &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) {
                off[i]++;
                sent++;
            }
        }
        pthread_mutex_lock(&d->mu);
        d->rounds++;
        d->bytes += sent;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
        if (sent == 0)
            break; /* every head is at its cap: the clients just hold their connections */
    }
    free(off);
    return NULL;
}

Test(faults, normal_client_completes_when_2000_connections_send_headers_a_byte_at_a_time,
     .fini = stop, .timeout = 300)
{
    cr_assert_geq(raise_nofile(SLOW_CONNS + 256), SLOW_CONNS + 256, "cannot open enough files");
    /* The slow heads must not hit the head timeout while the test runs. */
    server_start_config(&srv, "{\"header_timeout_ms\": 600000}");

    struct drip d = {.n = SLOW_CONNS, .fds = calloc(SLOW_CONNS, sizeof(int))};
    atomic_init(&d.stop, false);
    pthread_mutex_init(&d.mu, NULL);
    pthread_cond_init(&d.cv, NULL);
    for (int i = 0; i < SLOW_CONNS; i++) {
        d.fds[i] = dial(srv.port);
        cr_assert_geq(d.fds[i], 0, "slow connection %d: %s", i, strerror(errno));
    }
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, drip_main, &d), 0);
    /* Two whole rounds: every slow client has started its head. */
    pthread_mutex_lock(&d.mu);
    while (d.rounds < 2)
        pthread_cond_wait(&d.cv, &d.mu);
    pthread_mutex_unlock(&d.mu);

    /* A normal client on one kept-alive connection: completions, whole and streamed. */
    int fd = client_connect(srv.port);
    for (int i = 0; i < 24; i++) {
        bool stream = i % 3 == 2;
        char body[160];
        snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time %d\",\"max_tokens\":8%s}", i,
                 stream ? ",\"stream\":true" : "");
        client_request(fd, "POST", "/v1/completions", body, true);
        struct response r;
        cr_assert(client_read_response(fd, &r), "request %d got no answer", i);
        cr_assert_eq(r.status, 200, "request %d: %s", i, r.body);
        if (stream)
            cr_assert(strstr(r.body, "data: [DONE]"), "stream %d ends: %s", i, r.body);
        else
            cr_assert(strstr(r.body, "\"finish_reason\""), "request %d: %s", i, r.body);
        response_dispose(&r);
        /* The accept queue is first in, first out: the normal client was accepted after every
         * slow one, so from its first answer on the server holds them all. */
        if (i == 0)
            cr_assert_geq(server_fd_count(&srv), SLOW_CONNS, "the server holds the slow ones");
    }
    close(fd);

    atomic_store(&d.stop, true);
    pthread_join(th, NULL);
    cr_log_info("slow loris: %d connections sent %ld head bytes in %ld rounds while 24 "
                "completions were served",
                SLOW_CONNS, d.bytes, d.rounds);
    /* The slow connections were held the whole time: still open, still unanswered. */
    cr_assert_geq(server_fd_count(&srv), SLOW_CONNS);
    for (int i = 0; i < SLOW_CONNS; i++)
        close(d.fds[i]);
    free(d.fds);
    pthread_cond_destroy(&d.cv);
    pthread_mutex_destroy(&d.mu);
}

/* ---- clients that vanish mid-stream ---- */

#define CUTS 1000
#define CUT_THREADS 4

struct cuts {
    int port;
    int first, count; /* this thread's cuts */
    long answered;    /* cuts after which some of the response had arrived */
};

static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Each cut: a request (a stream mostly, sometimes a whole completion) cut at a random point:
 * halfway through the request, right after it, or after a random number of response bytes; by
 * a FIN or, half the time, a reset. Seeded per cut, so a failure can be replayed. */
static void *cut_main(void *arg)
{
    struct cuts *c = arg;
    for (int k = c->first; k < c->first + c->count; k++) {
        uint64_t r = 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1);
        next_rand(&r);
        int fd = dial(c->port);
        if (fd < 0)
            continue;
        char body[256], req[512];
        bool stream = next_rand(&r) % 8 != 0;
        snprintf(body, sizeof body,
                 "{\"prompt\":\"Once upon a time %d\",\"max_tokens\":%d,\"seed\":%d%s}", k,
                 32 + (int)(next_rand(&r) % 224), k, stream ? ",\"stream\":true" : "");
        int n = post_len(req, sizeof req, "/v1/completions", body, true);
        int mode = (int)(next_rand(&r) % 10);
        size_t want = 1 + next_rand(&r) % 6000;
        if (mode == 0) {
            send_str(fd, req, (size_t)n / 2); /* cut inside the request */
        } else if (send_str(fd, req, (size_t)n) && mode > 1) {
            char buf[4096];
            size_t got = 0;
            while (got < want) {
                ssize_t m = recv(fd, buf, sizeof buf < want - got ? sizeof buf : want - got, 0);
                if (m <= 0)
                    break;
                got += (size_t)m;
            }
            if (got > 0)
                c->answered++;
        }
        if (next_rand(&r) % 2) {
            struct linger l = {.l_onoff = 1, .l_linger = 0}; /* close with a reset */
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        }
        close(fd);
    }
    return NULL;
}

static void run_cuts(int port, int first, int count, long *answered)
{
    pthread_t th[CUT_THREADS];
    struct cuts c[CUT_THREADS];
    for (int i = 0; i < CUT_THREADS; i++) {
        c[i] = (struct cuts){
            .port = port, .first = first + i * count / CUT_THREADS, .count = count / CUT_THREADS};
        cr_assert_eq(pthread_create(&th[i], NULL, cut_main, &c[i]), 0);
    }
    for (int i = 0; i < CUT_THREADS; i++) {
        pthread_join(th[i], NULL);
        *answered += c[i].answered;
    }
}

Test(faults, kv_blocks_and_memory_return_to_baseline_when_1000_streams_are_cut_at_random_points,
     .fini = stop, .timeout = 300)
{
    server_start(&srv, NULL);
    server_log_pump(&srv, true);
    long answered = 0;
    /* A first tenth warms the allocator and the pools up; the rest is measured against it. */
    run_cuts(srv.port, 0, CUTS / 10, &answered);
    wait_engine_idle(srv.port);
    size_t base = server_rss(&srv);
    run_cuts(srv.port, CUTS / 10, CUTS / 2 - CUTS / 10, &answered);
    wait_engine_idle(srv.port);
    size_t half = server_rss(&srv);
    run_cuts(srv.port, CUTS / 2, CUTS / 2, &answered);
    wait_engine_idle(srv.port);
    size_t end = server_rss(&srv);

    struct response m = request(srv.port, "/metrics", NULL);
    double total = metric_where(m.body, "sluice:requests_total", "");
    double cancelled = metric_where(m.body, "sluice:requests_total", "outcome=\"cancelled\"");
    response_dispose(&m);
    cr_log_info("cut %d requests (%ld after part of the answer): %g counted, %g cancelled by the "
                "client; RSS %zu KiB after 100, %zu KiB after 500, %zu KiB after 1000",
                CUTS, answered, total, cancelled, base >> 10, half >> 10, end >> 10);
    /* Most requests were really cut while the engine worked on them. */
    cr_assert_geq(cancelled, CUTS / 2, "only %g of %d cuts cancelled a request", cancelled, CUTS);
    /* The server still serves. */
    int fd = client_connect(srv.port);
    client_request(fd, "POST", "/v1/completions", "{\"prompt\":\"Hello\",\"max_tokens\":4}", false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    close(fd);
    /* Memory: LeakSanitizer checks for leaks in the ASan run; here, the growth from the second
     * half must stay small next to what the first half settled at. */
    if (!asan_build()) {
        cr_assert_gt(base, 0);
        cr_assert_lt(end, half + (8u << 20), "RSS grew %zu KiB over the last 500 cuts",
                     (end - half) >> 10);
    }
    server_log_pump(&srv, false);
}

/* ---- a worker that fails a step ---- */

Test(faults, failed_step_gets_500_or_error_event_and_server_stays_ready_when_worker_fails,
     .fini = stop, .timeout = 300)
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

#define FAULT_KEY "sk-fault-0123456789abcdef"
#define FAULT_SHA "ce0eef7b9fdccde0f556207c6207a5bbed856fb96e70c8f4453b1fedb35fba36"

/* What a failed request reserved of its tenant's budget (its worst case) is settled to what it
 * cost when the engine fails it, as for any other end: the budget's spend is the ledger's. */
Test(faults, a_request_the_engine_fails_settles_its_budget_to_what_ran, .fini = stop,
     .timeout = 300)
{
    cr_assert_eq(setenv("SLUICE_FAULT_FORWARD", "3", 1), 0); /* the first's second decode */
    const char *bin = getenv("SLUICE_FAULT_BIN");
    cr_assert_not_null(bin, "SLUICE_FAULT_BIN is not set (run through meson test)");
    server_start_bin_config(&srv, bin,
                            "{" HARNESS_TIERS_WITHOUT_GUARD ",\"price\":{\"input_per_mtok\":1,"
                            "\"output_per_mtok\":2},\"tenants\":[{\"name\":\"f\",\"key_sha256\":"
                            "\"" FAULT_SHA "\",\"tiers\":[\"interactive\"],\"default_tier\":"
                            "\"interactive\",\"budget\":{\"amount\":1,\"period\":\"day\"}}]}");
    unsetenv("SLUICE_FAULT_FORWARD");
    char raw[16384];
    /* Greedy and past the model's stop tokens: exactly 100 tokens when it is not failed. */
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":100,\"temperature\":0,"
                       "\"ignore_eos\":true}";
    for (int i = 0; i < 2; i++) /* the first fails after two tokens; the second is whole */
        cr_assert_eq(client_try_request(srv.port, "POST", "/v1/completions",
                                        "Authorization: Bearer " FAULT_KEY "\r\n", body, raw,
                                        sizeof raw),
                     i == 0 ? 500 : 200, "%s", raw);
    server_wait_log(&srv, "fault injection: forward call 3 fails");
    cr_assert_eq(client_try_request(srv.port, "GET", "/v1/usage",
                                    "Authorization: Bearer " FAULT_KEY "\r\n", NULL, raw,
                                    sizeof raw),
                 200);
    /* 5 prompt tokens each at 1,000; 2 generated by the first and 100 by the second at 2,000:
     * 10,000 + 204,000 = 214,000 nano-units, not the two worst cases of 410,000. */
    cr_assert(strstr(raw, "\"requests\":2,"), "%s", raw);
    cr_assert(strstr(raw, "\"completion_tokens\":102,"), "%s", raw);
    cr_assert(strstr(raw, "\"spent\":0.000214,"), "%s", raw);
}

/* n choices are n sequences: when a step fails, the first choice it fails ends the answer (an
 * error event, then [DONE]) and the others are cancelled, so nothing is left running or holding
 * KV blocks; the next request of n choices is served whole. */
Test(faults, failed_step_ends_every_choice_when_n_is_above_one, .fini = stop, .timeout = 300)
{
    /* Call 3 is a decode step of the first request (its prompts take one or two calls). */
    cr_assert_eq(setenv("SLUICE_FAULT_FORWARD", "3", 1), 0);
    const char *bin = getenv("SLUICE_FAULT_BIN");
    cr_assert_not_null(bin, "SLUICE_FAULT_BIN is not set (run through meson test)");
    server_start_bin(&srv, bin, NULL);
    unsetenv("SLUICE_FAULT_FORWARD");

    struct response r = request(srv.port, "/v1/completions",
                                "{\"prompt\":\"Once upon a time\",\"max_tokens\":32,\"n\":3,"
                                "\"ignore_eos\":true,\"stream\":true}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    const char *err = strstr(r.body, "data: {\"error\":");
    cr_assert_not_null(err, "no error event: %s", r.body);
    cr_assert(strstr(err, "\"type\":\"server_error\""), "%s", err);
    cr_assert(strstr(err, "data: [DONE]\n\n"), "%s", err);
    cr_assert_null(strstr(r.body, "\"finish_reason\":\"length\""), "%s", r.body);
    response_dispose(&r);
    server_wait_log(&srv, "fault injection: forward call 3 fails");
    wait_engine_idle(srv.port);

    r = request(srv.port, "/v1/completions",
                "{\"prompt\":\"Once\",\"max_tokens\":8,\"n\":2,\"ignore_eos\":true}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    cr_assert(strstr(r.body, "\"index\":1"), "%s", r.body);
    cr_assert(strstr(r.body, "\"completion_tokens\":16"), "%s", r.body);
    response_dispose(&r);
    wait_engine_idle(srv.port);
}

/* A client that leaves a stream of n choices cancels every one of them. */
Test(faults, leaving_a_stream_cancels_every_choice_when_n_is_above_one, .fini = stop,
     .timeout = 300)
{
    server_start(&srv, NULL);
    int fd = client_connect(srv.port);
    client_request(fd, "POST", "/v1/completions",
                   "{\"prompt\":\"Tell me a long story\",\"max_tokens\":400,\"n\":4,"
                   "\"ignore_eos\":true,\"stream\":true}",
                   false);
    char buf[8192];
    cr_assert(client_read_until(fd, "\"text\"", buf, sizeof buf), "a first chunk arrives");
    close(fd);
    server_wait_log(&srv, "\"finish\":\"cancelled\"");
    wait_engine_idle(srv.port);
}

Test(faults, release_binary_ignores_the_fault_variable_when_it_is_set, .fini = stop)
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

/* ---- idle keep-alive connections ---- */

#define IDLE_CONNS 10000
#define IDLE_WARM 200

/* Opens n connections that each get one /healthz answered and stay open, kept alive. */
static void open_idle(int port, int *fds, int n)
{
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    for (int i = 0; i < n; i++) {
        fds[i] = dial(port);
        cr_assert_geq(fds[i], 0, "connection %d: %s", i, strerror(errno));
        cr_assert(send_str(fds[i], req, sizeof req - 1));
    }
    for (int i = 0; i < n; i++) {
        char buf[512];
        size_t got = 0;
        while (!memmem(buf, got, "{\"status\":\"ok\"}", 15)) {
            ssize_t m = recv(fds[i], buf + got, sizeof buf - got, 0);
            cr_assert_gt(m, 0, "connection %d: no answer", i);
            got += (size_t)m;
        }
        cr_assert(memmem(buf, got, "Connection: keep-alive", 22), "%.*s", (int)got, buf);
    }
}

Test(faults, memory_per_connection_is_bounded_when_10000_idle_connections_are_kept_alive,
     .fini = stop, .timeout = 300)
{
    long lim = raise_nofile(IDLE_CONNS + IDLE_WARM + 256);
    if (lim < IDLE_CONNS + IDLE_WARM + 256)
        cr_skip_test("RLIMIT_NOFILE allows %ld files, fewer than the %d this test opens", lim,
                     IDLE_CONNS + IDLE_WARM + 256);
    server_start_config(&srv, "{\"max_connections\": 20000, \"idle_timeout_ms\": 600000}");
    server_log_pump(&srv, true);
    int *fds = calloc(IDLE_CONNS + IDLE_WARM, sizeof *fds);
    open_idle(srv.port, fds, IDLE_WARM);
    size_t before = server_rss(&srv);
    open_idle(srv.port, fds + IDLE_WARM, IDLE_CONNS);
    size_t after = server_rss(&srv);
    cr_assert_geq(server_fd_count(&srv), IDLE_CONNS + IDLE_WARM);
    size_t per = after > before ? (after - before) / IDLE_CONNS : 0;
    cr_log_info("%d idle keep-alive connections: RSS %zu KiB -> %zu KiB, %zu bytes each%s",
                IDLE_CONNS, before >> 10, after >> 10, per, asan_build() ? " (ASan build)" : "");
    /* An ordinary request is still served among them. */
    struct response r =
        request(srv.port, "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":2}");
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    if (!asan_build())
        cr_assert_lt(per, 16u << 10, "%zu bytes per idle connection", per);
    for (int i = 0; i < IDLE_CONNS + IDLE_WARM; i++)
        close(fds[i]);
    free(fds);
    server_log_pump(&srv, false);
}
