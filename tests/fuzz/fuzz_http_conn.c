/* Fuzz target: the whole request path of a connection (gateway/http/conn.c): the real server runs
 * in this process on a loopback port, with the synthetic model and no engine (completions are
 * decoded, authenticated, classified and tokenized, then answered 503), and each input is what
 * one client sends on one connection before it shuts its side. The server must answer and close
 * (a connection it keeps open after that is a hang, reported as a crash), and what it sends must
 * be a well-formed HTTP/1.1 response stream whose JSON bodies parse. Two servers: one without
 * tenants, one with tenants and an admin key (the seed corpus carries their keys).
 *
 * Input: byte 0 picks the server, the rest is sent. */
#include "gateway_impl.h"
#include "http_impl.h"

#include <sluice/api.h>

#include "fuzz.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>

#define ALICE_KEY "sk-fuzz-alice-0123456789abcdef"
#define ADMIN_KEY "sk-fuzz-admin-0123456789abcdef"

static struct sl_model *model;
static struct sl_http_server *servers[2];
static int ports[2];

static void hex(const char *key, char out[65])
{
    unsigned char h[32];
    sl_tenant_sha256(key, strlen(key), h);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", h[i]);
}

static struct sl_http_server *start(const char *json)
{
    char path[64], err[1024];
    int fd = fuzz_memfd(json, strlen(json), path, sizeof path);
    struct sl_config *cfg = sl_config_new();
    if (fd < 0 || sl_config_load_file(cfg, path, err, sizeof err) != SL_OK ||
        sl_config_validate(cfg, err, sizeof err) != SL_OK) {
        fprintf(stderr, "fuzz_http_conn: config: %s\n", err);
        abort();
    }
    close(fd);
    struct sl_http_server *s;
    /* The server and its API live as long as the process (the fuzzer's). */
    struct sl_api *api = sl_api_new(cfg);
    if (sl_api_add_model(api, NULL, model, NULL, err, sizeof err) != SL_OK ||
        sl_http_server_new(cfg, sl_api_handler(api), &s, err, sizeof err) != SL_OK ||
        sl_http_server_start(s) != SL_OK) {
        fprintf(stderr, "fuzz_http_conn: server: %s\n", err);
        abort();
    }
    sl_config_unref(cfg);
    return s;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    sl_log_set_level(SL_LOG_ERROR);
    evthread_use_pthreads();
    signal(SIGPIPE, SIG_IGN);
    char err[256];
    if (sl_model_load("synthetic", NULL, &model, err, sizeof err) != SL_OK) {
        fprintf(stderr, "fuzz_http_conn: %s\n", err);
        abort();
    }
    /* Small limits, so that the fuzzer reaches them with small inputs. */
    static const char limits[] = "\"listen\": \"127.0.0.1:0\", \"log_level\": \"error\", "
                                 "\"max_header_bytes\": 1024, \"max_body_bytes\": 4096, "
                                 "\"header_timeout_ms\": 10000";
    char json[2048], alice[65], admin[65];
    hex(ALICE_KEY, alice);
    hex(ADMIN_KEY, admin);
    snprintf(json, sizeof json, "{%s}", limits);
    servers[0] = start(json);
    snprintf(json, sizeof json,
             "{%s, \"tenants\": [{\"name\": \"alice\", \"key_sha256\": \"%s\", "
             "\"tiers\": [\"interactive\", \"batch\"], \"default_tier\": \"batch\"}], "
             "\"admin_key_sha256\": \"%s\"}",
             limits, alice, admin);
    servers[1] = start(json);
    for (int i = 0; i < 2; i++)
        ports[i] = sl_http_server_port(servers[i]);
    return 0;
}

/* ---- the response stream, checked with llhttp ---- */

struct resp {
    struct sl_str body;
    struct sl_str field, ctype; /* the header name being read; the Content-Type */
    int n;
};

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    struct resp *r = p->data;
    sl_str_append(&r->field, at, len);
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    struct resp *r = p->data;
    if (r->field.len == 12 && strncasecmp(r->field.p, "content-type", 12) == 0)
        sl_str_append(&r->ctype, at, len);
    return 0;
}

static int on_header_value_complete(llhttp_t *p)
{
    struct resp *r = p->data;
    sl_str_clear(&r->field);
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    struct resp *r = p->data;
    sl_str_append(&r->body, at, len);
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    struct resp *r = p->data;
    int status = llhttp_get_status_code(p);
    fuzz_check(status == 100 || (status >= 200 && status < 600), "status %d", status);
    if (status != 100 && r->ctype.len >= 16 && strncmp(r->ctype.p, "application/json", 16) == 0) {
        json_error_t je;
        json_t *j = json_loadb(r->body.p ? r->body.p : "", r->body.len, 0, &je);
        fuzz_check(j != NULL, "a %d JSON body does not parse (%s): %.*s", status, je.text,
                   (int)r->body.len, r->body.p ? r->body.p : "");
        if (status >= 400)
            fuzz_check(json_is_object(json_object_get(j, "error")), "a %d without an error object",
                       status);
        json_decref(j);
    }
    sl_str_clear(&r->body);
    sl_str_clear(&r->ctype);
    r->n++;
    return 0;
}

static void check_responses(const char *out, size_t len)
{
    static const llhttp_settings_t settings = {
        .on_header_field = on_header_field,
        .on_header_value = on_header_value,
        .on_header_value_complete = on_header_value_complete,
        .on_body = on_body,
        .on_message_complete = on_message_complete,
    };
    llhttp_t p;
    llhttp_init(&p, HTTP_RESPONSE, &settings);
    struct resp r = {0};
    sl_str_init(&r.body);
    sl_str_init(&r.field);
    sl_str_init(&r.ctype);
    p.data = &r;
    /* What arrived must be a valid prefix of a response stream: a close may cut the last one. */
    llhttp_errno_t e = llhttp_execute(&p, out, len);
    fuzz_check(e == HPE_OK, "the server's output is not HTTP/1.1 (%s at byte %zu): %.*s",
               llhttp_errno_name(e), (size_t)(llhttp_get_error_pos(&p) - out), (int)len, out);
    sl_str_dispose(&r.body);
    sl_str_dispose(&r.field);
    sl_str_dispose(&r.ctype);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int which = data[0] & 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    fuzz_check(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[which])};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* libFuzzer's timer (SIGALRM) may interrupt a blocking connect, which then goes on in the
     * background: wait for it to finish and take its result. */
    int c = connect(fd, (struct sockaddr *)&a, sizeof a);
    if (c != 0 && errno == EINTR) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof err;
        while (poll(&pf, 1, -1) < 0 && errno == EINTR)
            ;
        c = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0 ? 0 : -1;
        errno = err;
    }
    fuzz_check(c == 0, "connect: %s", strerror(errno));
    struct timeval tv = {.tv_sec = 20};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const char *p = (const char *)data + 1;
    size_t left = size - 1;
    while (left) {
        ssize_t n = send(fd, p, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* the server answered an error and closed: what it said is read below */
        p += n;
        left -= (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    struct sl_str out;
    sl_str_init(&out);
    for (;;) {
        char buf[16384];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR)
            continue;
        fuzz_check(!(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)),
                   "the server kept the connection open after the client's EOF");
        if (n <= 0)
            break; /* EOF, or a reset after an answer the kernel could not deliver whole */
        sl_str_append(&out, buf, (size_t)n);
    }
    close(fd);
    /* A HEAD response has a Content-Length and no body, which a response parser cannot know. */
    if (!memmem(data + 1, size - 1, "HEAD", 4))
        check_responses(out.p ? out.p : "", out.len);
    sl_str_dispose(&out);
    return 0;
}
