#include "harness.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
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
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* Reads what the server printed; blocks for at most `ms` per call (a failure guard only). */
static bool read_log(struct server *s, int ms)
{
    struct pollfd p = {.fd = s->err_fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0)
        return false;
    char buf[4096];
    ssize_t n = read(s->err_fd, buf, sizeof buf);
    if (n <= 0)
        return false;
    fwrite(buf, 1, (size_t)n, stderr); /* keep the server's log visible in the test output */
    size_t room = sizeof s->log - 1 - s->log_len;
    size_t take = (size_t)n < room ? (size_t)n : room;
    memcpy(s->log + s->log_len, buf, take);
    s->log_len += take;
    s->log[s->log_len] = '\0';
    return true;
}

void server_wait_log(struct server *s, const char *needle)
{
    server_wait_log_from(s, 0, needle);
}

size_t server_wait_log_from(struct server *s, size_t from, const char *needle)
{
    const char *hit;
    /* 120 s with no output at all means the server hung: fail rather than hang CI. */
    while (!(hit = strstr(s->log + from, needle)))
        cr_assert(read_log(s, 120000), "server log ended before \"%s\":\n%s", needle, s->log);
    return (size_t)(hit - s->log) + strlen(needle);
}

void server_log_clear(struct server *s)
{
    /* Bounded: a server that never stops logging must not keep this loop going. */
    for (int i = 0; i < 1024; i++) {
        s->log_len = 0;
        s->log[0] = '\0';
        if (!read_log(s, 0))
            break;
    }
    s->log_len = 0;
    s->log[0] = '\0';
}

int server_wait_log_any(struct server *s, const char *const *needles)
{
    size_t keep = 0;
    for (int i = 0; needles[i]; i++)
        if (strlen(needles[i]) > keep)
            keep = strlen(needles[i]);
    for (;;) {
        for (int i = 0; needles[i]; i++)
            if (strstr(s->log, needles[i]))
                return i;
        if (s->log_len > sizeof s->log / 2) {
            /* Keep a tail as long as the longest needle: one cut by the last read survives. */
            size_t k = keep < s->log_len ? keep : s->log_len;
            memmove(s->log, s->log + s->log_len - k, k);
            s->log_len = k;
            s->log[k] = '\0';
        }
        cr_assert(read_log(s, 120000), "server log ended before \"%s\":\n%s", needles[0], s->log);
    }
}

static const char *sluice_bin(void)
{
    const char *bin = getenv("SLUICE_BIN");
    cr_assert_not_null(bin, "SLUICE_BIN is not set (run through meson test)");
    return bin;
}

/* Removes the config file server_start_config wrote, if any. */
static void remove_config(struct server *s)
{
    if (s->config[0])
        unlink(s->config);
    s->config[0] = '\0';
}

/* server_start_bin on a cleared s, which keeps s->config. A start that fails leaves nothing
 * behind: the server is killed and reaped (s->pid 0, so server_stop has nothing to do) and its
 * config file removed. */
static void spawn(struct server *s, const char *bin, const char *const *args)
{
    int pipefd[2];
    cr_assert_eq(pipe(pipefd), 0);
    const char *argv[32];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    for (int i = 0; args && args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        /* A test that ends without its teardown (a skip, a crash) must not leave a server
         * behind holding the runner's pipes. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        close(pipefd[1]);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(pipefd[1]);
    s->pid = pid;
    s->err_fd = pipefd[0];
    static const char listening[] = "listening on http://127.0.0.1:";
    while (!strstr(s->log, listening))
        if (!read_log(s, 120000)) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
            close(s->err_fd);
            s->pid = 0;
            remove_config(s);
            cr_assert_fail("server log ended before \"%s\":\n%s", listening, s->log);
        }
    s->port = atoi(strstr(s->log, listening) + strlen(listening));
    cr_assert_gt(s->port, 0);
}

void server_start(struct server *s, const char *const *args)
{
    server_start_bin(s, sluice_bin(), args);
}

void server_start_bin(struct server *s, const char *bin, const char *const *args)
{
    memset(s, 0, sizeof *s);
    spawn(s, bin, args);
}

void server_start_config(struct server *s, const char *json)
{
    server_start_bin_config(s, sluice_bin(), json);
}

void server_start_bin_config(struct server *s, const char *bin, const char *json)
{
    memset(s, 0, sizeof *s);
    snprintf(s->config, sizeof s->config, "/tmp/sluice-config-XXXXXX.json");
    int fd = mkstemps(s->config, 5);
    cr_assert_geq(fd, 0, "mkstemps: %s", strerror(errno));
    FILE *f = fdopen(fd, "w");
    bool written = f && fputs(json, f) >= 0;
    if (!f || fclose(f) != 0 || !written) {
        unlink(s->config);
        cr_assert_fail("cannot write %s: %s", s->config, strerror(errno));
    }
    const char *args[] = {"--config", s->config, NULL};
    spawn(s, bin, args);
}

bool server_reload_config(struct server *s, const char *json)
{
    cr_assert(s->config[0], "server_reload_config: not started by server_start_config");
    FILE *f = fopen(s->config, "w");
    cr_assert_not_null(f, "%s: %s", s->config, strerror(errno));
    bool written = fputs(json, f) >= 0;
    cr_assert(fclose(f) == 0 && written, "cannot write %s", s->config);
    static const char *const outcomes[] = {"SIGHUP: configuration reloaded",
                                           "SIGHUP: configuration refused", NULL};
    server_log_clear(s);
    cr_assert_eq(kill(s->pid, SIGHUP), 0);
    return server_wait_log_any(s, outcomes) == 0;
}

int server_wait_exit(struct server *s)
{
    /* Drain the log so the server never blocks on a full pipe while shutting down. */
    while (read_log(s, 120000))
        ;
    int status = 0;
    cr_assert_eq(waitpid(s->pid, &status, 0), s->pid);
    close(s->err_fd);
    s->pid = 0;
    remove_config(s);
    return status;
}

void server_stop(struct server *s)
{
    if (!s->pid)
        return;
    kill(s->pid, SIGTERM);
    int status = server_wait_exit(s);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "sluice exited uncleanly (status %d):\n%s", status, s->log);
}

/* Buffered reader over the socket. Leftover bytes stay in a per-fd buffer so a second response
 * on the same connection is read correctly. */
struct rbuf {
    int fd;
    char data[1 << 16];
    size_t start, end;
};
static struct rbuf rb;

int client_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {.tv_sec = 120};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    /* A new socket may reuse the number of one closed with unread bytes still buffered here. */
    if (rb.fd == fd)
        rb.start = rb.end = 0;
    return fd;
}

void client_send(int fd, const char *data, size_t len)
{
    while (len) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        cr_assert_gt(n, 0, "send: %s", strerror(errno));
        data += n;
        len -= (size_t)n;
    }
}

void client_request(int fd, const char *method, const char *path, const char *body, bool keep_alive)
{
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: sluice-test\r\n%s", method,
                     path, keep_alive ? "" : "Connection: close\r\n");
    if (body)
        n += snprintf(head + n, sizeof head - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", strlen(body));
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    client_send(fd, head, (size_t)n);
    if (body)
        client_send(fd, body, strlen(body));
}

void client_request_h(int fd, const char *method, const char *path, const char *headers,
                      const char *body, bool keep_alive)
{
    char head[8192];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: sluice-test\r\n%s%s", method,
                     path, keep_alive ? "" : "Connection: close\r\n", headers ? headers : "");
    if (body)
        n += snprintf(head + n, sizeof head - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", strlen(body));
    n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    cr_assert_lt((size_t)n, sizeof head, "request head too long for the harness");
    client_send(fd, head, (size_t)n);
    if (body)
        client_send(fd, body, strlen(body));
}

static bool send_all(int fd, const char *p, size_t len)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

int client_try_request(int port, const char *method, const char *path, const char *headers,
                       const char *body, char *out, size_t max)
{
    if (out && max)
        out[0] = '\0';
    char head[8192];
    int n =
        snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s",
                 method, path, headers ? headers : "");
    if (body && n > 0 && (size_t)n < sizeof head)
        n += snprintf(head + n, sizeof head - (size_t)n,
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n", strlen(body));
    if (n > 0 && (size_t)n < sizeof head)
        n += snprintf(head + n, sizeof head - (size_t)n, "\r\n");
    if (n <= 0 || (size_t)n >= sizeof head)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {.tv_sec = 120};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || !send_all(fd, head, (size_t)n) ||
        (body && !send_all(fd, body, strlen(body)))) {
        close(fd);
        return -1;
    }
    /* The server closes after a "Connection: close" response: read to the end. */
    char first[16];
    size_t got = 0, total = 0;
    bool failed = false;
    for (;;) {
        char buf[4096];
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) {
            failed = r < 0;
            break;
        }
        for (ssize_t i = 0; i < r && got < sizeof first - 1; i++)
            first[got++] = buf[i];
        if (out && total + 1 < max) {
            size_t take = (size_t)r < max - 1 - total ? (size_t)r : max - 1 - total;
            memcpy(out + total, buf, take);
            total += take;
            out[total] = '\0';
        }
    }
    close(fd);
    first[got] = '\0';
    if (failed || got < 12 || strncmp(first, "HTTP/1.", 7) != 0)
        return -1;
    return atoi(first + 9);
}

static bool fill(int fd)
{
    if (rb.fd != fd) {
        rb.fd = fd;
        rb.start = rb.end = 0;
    }
    if (rb.start == rb.end)
        rb.start = rb.end = 0;
    if (rb.end == sizeof rb.data) {
        memmove(rb.data, rb.data + rb.start, rb.end - rb.start);
        rb.end -= rb.start;
        rb.start = 0;
    }
    ssize_t n = recv(fd, rb.data + rb.end, sizeof rb.data - rb.end, 0);
    if (n <= 0)
        return false;
    rb.end += (size_t)n;
    return true;
}

static bool read_line(int fd, char *out, size_t max)
{
    if (rb.fd != fd) {
        rb.fd = fd;
        rb.start = rb.end = 0;
    }
    for (;;) {
        char *nl = memchr(rb.data + rb.start, '\n', rb.end - rb.start);
        if (nl) {
            size_t len = (size_t)(nl - (rb.data + rb.start)) + 1;
            size_t copy = len < max - 1 ? len : max - 1;
            memcpy(out, rb.data + rb.start, copy);
            out[copy] = '\0';
            rb.start += len;
            return true;
        }
        if (!fill(fd))
            return false;
    }
}

static bool read_exact(int fd, char *out, size_t n)
{
    while (n) {
        if (rb.fd != fd || rb.start == rb.end)
            if (!fill(fd))
                return false;
        size_t take = rb.end - rb.start < n ? rb.end - rb.start : n;
        memcpy(out, rb.data + rb.start, take);
        rb.start += take;
        out += take;
        n -= take;
    }
    return true;
}

bool client_read_response(int fd, struct response *r)
{
    memset(r, 0, sizeof *r);
    char line[8192];
    if (!read_line(fd, line, sizeof line))
        return false;
    cr_assert_eq(strncmp(line, "HTTP/1.", 7), 0, "status line: %s", line);
    r->status = atoi(line + 9);
    size_t hl = 0;
    for (;;) {
        cr_assert(read_line(fd, line, sizeof line), "headers cut short");
        if (strcmp(line, "\r\n") == 0)
            break;
        for (char *c = line; *c && *c != ':'; c++)
            *c = (char)tolower((unsigned char)*c);
        size_t l = strlen(line);
        cr_assert_lt(hl + l, sizeof r->headers);
        memcpy(r->headers + hl, line, l);
        hl += l;
    }
    r->headers[hl] = '\0';
    const char *cl = response_header(r, "content-length");
    const char *te = response_header(r, "transfer-encoding");
    size_t cap = 1 << 16;
    r->body = malloc(cap);
    if (te && strstr(te, "chunked")) {
        for (;;) {
            cr_assert(read_line(fd, line, sizeof line), "chunk size line missing");
            size_t n = strtoul(line, NULL, 16);
            if (n == 0) {
                /* Trailer fields, if any, then the empty line: kept with the head's fields. */
                for (;;) {
                    cr_assert(read_line(fd, line, sizeof line), "trailer cut short");
                    if (strcmp(line, "\r\n") == 0)
                        break;
                    for (char *c = line; *c && *c != ':'; c++)
                        *c = (char)tolower((unsigned char)*c);
                    size_t l = strlen(line), hl = strlen(r->headers);
                    cr_assert_lt(hl + l, sizeof r->headers);
                    memcpy(r->headers + hl, line, l + 1);
                }
                break;
            }
            while (r->body_len + n + 1 > cap)
                r->body = realloc(r->body, cap *= 2);
            cr_assert(read_exact(fd, r->body + r->body_len, n), "chunk cut short");
            r->body_len += n;
            cr_assert(read_line(fd, line, sizeof line));
        }
    } else if (cl) {
        size_t n = strtoul(cl, NULL, 10);
        while (n + 1 > cap)
            r->body = realloc(r->body, cap *= 2);
        cr_assert(read_exact(fd, r->body, n), "body cut short");
        r->body_len = n;
    } else {
        char buf[4096];
        for (;;) {
            if (rb.start == rb.end && !fill(fd))
                break;
            size_t n = rb.end - rb.start < sizeof buf ? rb.end - rb.start : sizeof buf;
            read_exact(fd, buf, n);
            while (r->body_len + n + 1 > cap)
                r->body = realloc(r->body, cap *= 2);
            memcpy(r->body + r->body_len, buf, n);
            r->body_len += n;
        }
    }
    r->body[r->body_len] = '\0';
    return true;
}

void response_dispose(struct response *r)
{
    free(r->body);
    r->body = NULL;
}

const char *response_header(const struct response *r, const char *name)
{
    static char value[1024];
    size_t nl = strlen(name);
    for (const char *p = r->headers; *p;) {
        const char *eol = strstr(p, "\r\n");
        if (!eol)
            break;
        if (strncmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            size_t vl = (size_t)(eol - v);
            if (vl >= sizeof value)
                vl = sizeof value - 1;
            memcpy(value, v, vl);
            value[vl] = '\0';
            return value;
        }
        p = eol + 2;
    }
    return NULL;
}

bool client_read_until(int fd, const char *needle, char *buf, size_t max)
{
    size_t len = 0;
    buf[0] = '\0';
    while (!strstr(buf, needle)) {
        if (rb.fd != fd || rb.start == rb.end)
            if (!fill(fd))
                return false;
        size_t take = rb.end - rb.start;
        if (take > max - 1 - len)
            take = max - 1 - len;
        if (take == 0)
            return false;
        memcpy(buf + len, rb.data + rb.start, take);
        rb.start += take;
        len += take;
        buf[len] = '\0';
    }
    return true;
}

size_t client_read_some(int fd, char *buf, size_t max)
{
    if (rb.fd != fd || rb.start == rb.end)
        if (!fill(fd))
            return 0;
    size_t take = rb.end - rb.start < max ? rb.end - rb.start : max;
    memcpy(buf, rb.data + rb.start, take);
    rb.start += take;
    return take;
}

/* ---- the server's log under load, its memory and descriptors ---- */

static struct {
    pthread_t thread;
    atomic_bool stop;
    struct server *s;
    bool running;
} pump;

static void *pump_main(void *arg)
{
    (void)arg;
    struct server *s = pump.s;
    while (!atomic_load(&pump.stop)) {
        if (s->log_len > sizeof s->log / 2) {
            /* Keep the newest quarter, so the capture never fills. */
            size_t keep = sizeof s->log / 4;
            memmove(s->log, s->log + s->log_len - keep, keep);
            s->log_len = keep;
            s->log[keep] = '\0';
        }
        struct pollfd p = {.fd = s->err_fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        char buf[65536];
        ssize_t n = read(s->err_fd, buf, sizeof buf);
        if (n <= 0)
            break;
        size_t room = sizeof s->log - 1 - s->log_len;
        size_t take = (size_t)n < room ? (size_t)n : room;
        memcpy(s->log + s->log_len, buf, take);
        s->log_len += take;
        s->log[s->log_len] = '\0';
    }
    return NULL;
}

void server_log_pump(struct server *s, bool on)
{
    if (on && !pump.running) {
        pump.s = s;
        atomic_store(&pump.stop, false);
        cr_assert_eq(pthread_create(&pump.thread, NULL, pump_main, NULL), 0);
        pump.running = true;
    } else if (!on && pump.running) {
        atomic_store(&pump.stop, true);
        pthread_join(pump.thread, NULL);
        pump.running = false;
    }
}

size_t server_rss(const struct server *s)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)s->pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %zu kB", &kib) == 1)
            break;
    fclose(f);
    return kib << 10;
}

int server_fd_count(const struct server *s)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)s->pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 2; /* . and .. */
}

double metrics_sum(const char *text, const char *name)
{
    size_t nl = strlen(name);
    double sum = 0;
    bool found = false;
    for (const char *p = text; *p;) {
        /* A sample line: NAME VALUE or NAME{LABELS} VALUE. */
        if (strncmp(p, name, nl) == 0 && (p[nl] == ' ' || p[nl] == '{')) {
            const char *v = p[nl] == '{' ? strchr(p, '}') : p + nl;
            if (v) {
                sum += strtod(v + (p[nl] == '{'), NULL);
                found = true;
            }
        }
        const char *eol = strchr(p, '\n');
        if (!eol)
            break;
        p = eol + 1;
    }
    return found ? sum : -1;
}

double metrics_fetch_sum(int port, const char *name)
{
    static __thread char out[1 << 18];
    if (client_try_request(port, "GET", "/metrics", NULL, NULL, out, sizeof out) != 200)
        return -1;
    const char *body = strstr(out, "\r\n\r\n");
    return body ? metrics_sum(body + 4, name) : -1;
}

long raise_nofile(long want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    if (rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < want) {
        rl.rlim_cur =
            rl.rlim_max == RLIM_INFINITY || (long)rl.rlim_max >= want ? (rlim_t)want : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY ? want : (long)rl.rlim_cur;
}

bool sanitized_build(void)
{
    const char *s = getenv("SLUICE_SANITIZE");
    return s && *s && strcmp(s, "none") != 0;
}

int sluice_run(const char *args, char *out, size_t outlen)
{
    const char *bin = sluice_bin();
    char cmd[1024];
    cr_assert_lt((size_t)snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", bin, args), sizeof cmd);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "popen: %s", strerror(errno));
    size_t n = fread(out, 1, outlen - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

long long nano_of(const char *s)
{
    long long whole = 0, frac = 0;
    int digits = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++)
        whole = whole * 10 + (*p - '0');
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++, digits++)
            frac = frac * 10 + (*p - '0');
    while (digits++ < 9)
        frac *= 10;
    return whole * 1000000000LL + frac;
}
