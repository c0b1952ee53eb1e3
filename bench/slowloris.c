/* sluice-slowloris: holds N connections to an HTTP server, each sending a request head one byte
 * at a time and never finishing it (a slow-loris client), reopening any the server closes. For
 * measuring what such clients cost everyone else (bench/scenarios/slowloris.sh); the tests'
 * own slow-loris check is tests/integration/test_faults.c.
 *
 *   sluice-slowloris --url http://HOST:PORT [--connections N] [--interval-ms MS]
 *                    [--duration S]
 *
 * Every interval each connection sends its next byte (0: as fast as the sockets take them). A
 * head is "GET / HTTP/1.1", a Host line and one header whose value grows without end, up to
 * 8 KiB, after which the connection only waits. Runs until --duration (default: until SIGINT or
 * SIGTERM), then prints what it did on one line. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HEAD_CAP 8192

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static char head_byte(size_t off)
{
    static const char head[] = "GET / HTTP/1.1\r\nHost: slowloris\r\nX-Slow: ";
    return off < sizeof head - 1 ? head[off] : 'a';
}

static int dial(const struct sockaddr_in *a)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void usage(void)
{
    fputs("usage: sluice-slowloris --url http://HOST:PORT [--connections N] [--interval-ms MS]\n"
          "                        [--duration S]\n",
          stderr);
    exit(2);
}

int main(int argc, char **argv)
{
    const char *url = NULL;
    int n = 2000, interval_ms = 1000;
    double duration = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        if (strcmp(argv[i], "--url") == 0)
            url = argv[++i];
        else if (strcmp(argv[i], "--connections") == 0)
            n = atoi(argv[++i]);
        else if (strcmp(argv[i], "--interval-ms") == 0)
            interval_ms = atoi(argv[++i]);
        else if (strcmp(argv[i], "--duration") == 0)
            duration = atof(argv[++i]);
        else
            usage();
    }
    char host[256];
    int port = 0;
    if (!url || n < 1 || interval_ms < 0 || sscanf(url, "http://%255[^:/]:%d", host, &port) != 2 ||
        port < 1 || port > 65535)
        usage();
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0) {
        fprintf(stderr, "sluice-slowloris: cannot resolve %s\n", host);
        return 1;
    }
    struct sockaddr_in addr = *(struct sockaddr_in *)ai->ai_addr;
    addr.sin_port = htons((uint16_t)port);
    freeaddrinfo(ai);

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);

    int *fds = calloc((size_t)n, sizeof *fds);
    size_t *off = calloc((size_t)n, sizeof *off);
    long opened = 0, reopened = 0, bytes = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        fds[i] = dial(&addr);
        if (fds[i] < 0)
            failed++;
        else
            opened++;
    }
    fprintf(stderr, "sluice-slowloris: %ld connections open\n", opened);
    double t0 = now_s(), next = t0;
    while (!stop && (duration <= 0 || now_s() - t0 < duration)) {
        for (int i = 0; i < n && !stop; i++) {
            if (fds[i] < 0 || off[i] >= HEAD_CAP)
                continue;
            char b = head_byte(off[i]);
            ssize_t r = send(fds[i], &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (r == 1) {
                off[i]++;
                bytes++;
            } else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                /* The server gave up on it (408, 431, or a reset): open another. */
                close(fds[i]);
                off[i] = 0;
                fds[i] = dial(&addr);
                if (fds[i] < 0)
                    failed++;
                else
                    reopened++;
            }
        }
        if (interval_ms > 0) {
            next += interval_ms / 1000.0;
            double wait = next - now_s();
            if (wait > 0)
                nanosleep(&(struct timespec){.tv_sec = (time_t)wait,
                                             .tv_nsec = (long)((wait - (time_t)wait) * 1e9)},
                          NULL);
        }
    }
    printf("sluice-slowloris: %d connections (%ld opened, %ld reopened, %ld failed), %ld bytes "
           "in %.1f s\n",
           n, opened, reopened, failed, bytes, now_s() - t0);
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    free(off);
    return 0;
}
