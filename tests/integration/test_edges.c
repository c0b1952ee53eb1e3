/* The server's edges as a careful operator and a hostile client meet them, over real sockets: a
 * keyless client is answered 401 from the head alone, a port in use is refused, chunk sizes and
 * transfer codings are judged as they arrive, absolute-form targets, HEAD on every GET route,
 * the metrics key, the served model's names, and --check-config proving the server can start. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Keys and their SHA-256 from `printf %s KEY | sha256sum`. */
#define SCRAPER "metrics-scraper-key-0123456789"
#define SCRAPER_SHA "b093567ef2ad809fe556a1e936c190a140f4f68a8f9132230557f2d12dc6f9e0"

/* header_timeout_ms is far past the client's 120 s receive timeout: an answer that waited for
 * the body (or for the timeout) fails the test instead of passing as a 408. */
#define TENANTS_CONFIG                                                                             \
    "{" HARNESS_TIERS_WITHOUT_GUARD                                                                \
    ",\"tenants\":[{\"name\":\"alice\",\"key_sha256\":\"" ALICE_SHA                                \
    "\",\"tiers\":[\"interactive\",\"batch\"],\"default_tier\":\"interactive\"}],"                 \
    "\"admin_key_sha256\":\"" ADMIN_SHA "\",\"metrics_key_sha256\":\"" SCRAPER_SHA "\","           \
    "\"header_timeout_ms\":600000,\"max_body_bytes\":2097152}"

static struct server srv;
static char cfg_path[64];

static const char *write_config(const char *name, const char *content)
{
    static char path[128];
    snprintf(path, sizeof path, "/tmp/sluice-edges-%d-%s", (int)getpid(), name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(content, 1, strlen(content), f), strlen(content));
    cr_assert_eq(fclose(f), 0);
    return path;
}

static void start_tenants(void)
{
    snprintf(cfg_path, sizeof cfg_path, "%s", write_config("tenants.json", TENANTS_CONFIG));
    const char *args[] = {"--config", cfg_path, NULL};
    server_start(&srv, args);
}

static void stop(void)
{
    if (srv.pid > 0)
        server_stop(&srv);
    if (cfg_path[0])
        unlink(cfg_path);
}

TestSuite(edges, .timeout = 300);

static json_t *error_of(const struct response *r)
{
    json_error_t e;
    json_t *j = json_loads(r->body, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, r->body);
    return j;
}

static void assert_401(const struct response *r)
{
    cr_assert_eq(r->status, 401, "status %d: %s", r->status, r->body);
    json_t *j = error_of(r);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "invalid_api_key", "%s", r->body);
    json_decref(j);
    const char *h = response_header(r, "www-authenticate");
    cr_assert(h && strstr(h, "Bearer"), "WWW-Authenticate: %s", h ? h : "(none)");
}

/* ---- 1. a keyless client gets its 401 from the head alone ---- */

Test(edges, keyless_uploads_get_401_from_the_head_and_their_bodies_are_not_kept,
     .init = start_tenants, .fini = stop)
{
    /* Warm up (the first request allocates the loop's buffers), then measure. */
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(ALICE),
                     "{\"prompt\":\"Hello\",\"max_tokens\":2}", false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    close(fd);
    size_t before = server_rss(&srv);
    cr_assert_gt(before, 0);

    static const char head[] = "POST /v1/completions HTTP/1.1\r\nHost: a\r\n"
                               "Content-Type: application/json\r\nContent-Length: 1048000\r\n\r\n";
    size_t body_len = 1000000;
    char *body = malloc(body_len);
    cr_assert_not_null(body);
    memset(body, ' ', body_len);
    for (int i = 0; i < 40; i++) {
        fd = client_connect(srv.port);
        /* Half of them wait for 100 Continue, which must not come: the 401 comes instead. */
        if (i % 2) {
            static const char expect[] =
                "POST /v1/completions HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
                "Content-Type: application/json\r\nContent-Length: 1048000\r\n\r\n";
            client_send(fd, expect, sizeof expect - 1);
        } else {
            client_send(fd, head, sizeof head - 1);
        }
        /* Not one byte of the body sent: the answer comes from the head. */
        cr_assert(client_read_response(fd, &r), "no answer to a keyless head (%d)", i);
        assert_401(&r);
        const char *conn = response_header(&r, "connection");
        cr_assert(conn && strstr(conn, "close"), "the connection ends: %s", conn ? conn : "");
        response_dispose(&r);
        /* What the client sends anyway is discarded, not buffered (it may be reset: the server
         * closes after a bounded linger). */
        for (size_t off = 0; off < body_len;) {
            ssize_t n = send(fd, body + off, body_len - off, MSG_NOSIGNAL);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        close(fd);
    }
    free(body);
    /* The server answers another request, then its RSS is within a few MiB of before (40 MB of
     * bodies went nowhere). */
    fd = client_connect(srv.port);
    client_request(fd, "GET", "/healthz", NULL, false);
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 200);
    response_dispose(&r);
    close(fd);
    size_t after = server_rss(&srv);
    /* Under AddressSanitizer every discarded read buffer sits in its quarantine (256 MiB) and
     * counts in RSS: the bound holds for the normal build only. */
    if (!sanitized_build())
        cr_assert_leq(after, before + (8u << 20), "RSS grew from %zu to %zu bytes", before, after);
}

Test(edges, keyless_chunked_upload_gets_401_before_any_chunk, .init = start_tenants, .fini = stop)
{
    int fd = client_connect(srv.port);
    static const char head[] =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
        "Transfer-Encoding: chunked\r\n" AUTH("sk-not-a-tenant-0123456789") "\r\n";
    client_send(fd, head, sizeof head - 1);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    assert_401(&r);
    cr_assert(strstr(r.body, "sk-no****6789"), "the key shown redacted: %s", r.body);
    response_dispose(&r);
    close(fd);
}

Test(edges, keyless_request_whose_small_body_came_with_it_keeps_the_connection,
     .init = start_tenants, .fini = stop)
{
    /* The whole request in one write (client_request writes head and body apart, and the server
     * may read the head alone): its 401 leaves the connection open for the next one. */
    int fd = client_connect(srv.port);
    static const char req[] = "POST /v1/completions HTTP/1.1\r\nHost: a\r\n"
                              "Content-Type: application/json\r\nContent-Length: 18\r\n\r\n"
                              "{\"prompt\":\"Hello\"}";
    client_send(fd, req, sizeof req - 1);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    assert_401(&r);
    response_dispose(&r);
    client_request(fd, "GET", "/healthz", NULL, false);
    cr_assert(client_read_response(fd, &r), "the connection was kept");
    cr_assert_eq(r.status, 200);
    response_dispose(&r);
    close(fd);
}

Test(edges, keyed_request_that_expects_100_continue_gets_it, .init = start_tenants, .fini = stop)
{
    int fd = client_connect(srv.port);
    static const char body[] = "{\"prompt\":\"Hello\",\"max_tokens\":2}";
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: a\r\n" AUTH(
                         ALICE) "Expect: 100-continue\r\nContent-Type: application/json\r\n"
                                "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     sizeof body - 1);
    client_send(fd, head, (size_t)n);
    char got[64];
    cr_assert(client_read_until(fd, "\r\n\r\n", got, sizeof got));
    cr_assert(strncmp(got, "HTTP/1.1 100 Continue\r\n\r\n", 25) == 0, "%s", got);
    client_send(fd, body, sizeof body - 1);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    cr_assert_eq(r.status, 200, "%s", r.body);
    response_dispose(&r);
    close(fd);
}

/* ---- 5, 9. HEAD on every GET route; the metrics key ---- */

Test(edges, metrics_need_the_metrics_key_when_one_is_set_and_answer_head, .init = start_tenants,
     .fini = stop)
{
    struct {
        const char *method, *path, *headers;
        int status;
    } cases[] = {
        {"GET", "/metrics", NULL, 401},
        {"GET", "/metrics", AUTH(ALICE), 401}, /* a tenant's key is not the metrics key */
        {"GET", "/metrics", AUTH(SCRAPER), 200},
        {"GET", "/metrics", AUTH(ADMIN), 200},
        {"HEAD", "/metrics", AUTH(SCRAPER), 200},
        {"HEAD", "/admin/config", AUTH(ADMIN), 200},
        {"GET", "/admin/config", AUTH(SCRAPER), 401},
        {"HEAD", "/v1/models", AUTH(ALICE), 200},
        {"HEAD", "/healthz", NULL, 200},
        {"GET", "/readyz", NULL, 200},
        {"POST", "/metrics", AUTH(SCRAPER), 405},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int fd = client_connect(srv.port);
        client_request_h(fd, cases[i].method, cases[i].path, cases[i].headers,
                         strcmp(cases[i].method, "POST") == 0 ? "{}" : NULL, false);
        if (strcmp(cases[i].method, "HEAD") == 0) {
            /* The head alone, then the end of the connection: no body follows. */
            char head[4096], more[16];
            cr_assert(client_read_until(fd, "\r\n\r\n", head, sizeof head - 1));
            char want[32];
            snprintf(want, sizeof want, "HTTP/1.1 %d ", cases[i].status);
            cr_assert(strncmp(head, want, strlen(want)) == 0, "HEAD %s with %s:\n%s", cases[i].path,
                      cases[i].headers ? cases[i].headers : "no key", head);
            char *body = strstr(head, "\r\n\r\n") + 4;
            cr_assert_eq(*body, '\0', "no body after the head: %s", body);
            cr_assert_eq(client_read_some(fd, more, sizeof more), 0, "no body after the head");
            cr_assert(strstr(head, "Content-Length: "), "HEAD says the GET's length:\n%s", head);
            cr_assert_null(strstr(head, "Content-Length: 0\r\n"), "%s", head);
            close(fd);
            continue;
        }
        struct response r;
        cr_assert(client_read_response(fd, &r), "%s %s", cases[i].method, cases[i].path);
        cr_assert_eq(r.status, cases[i].status, "%s %s with %s: %d %s", cases[i].method,
                     cases[i].path, cases[i].headers ? cases[i].headers : "no key", r.status,
                     r.body);
        if (r.status == 405)
            cr_assert_str_eq(response_header(&r, "allow"), "GET, HEAD");
        if (r.status == 401)
            assert_401(&r);
        response_dispose(&r);
        close(fd);
    }
}

/* ---- 3, 8. chunk sizes, transfer codings, extensions, absolute-form ---- */

/* Sends raw bytes on a new connection and returns the answer's status. */
static int raw_status(const char *raw, struct response *out)
{
    int fd = client_connect(srv.port);
    client_send(fd, raw, strlen(raw));
    struct response r;
    cr_assert(client_read_response(fd, &r), "no answer to %s", raw);
    close(fd);
    int st = r.status;
    if (out)
        *out = r;
    else
        response_dispose(&r);
    return st;
}

#define POST_HEAD(te) "POST /v1/completions HTTP/1.1\r\nHost: a\r\n" AUTH(ALICE) te "\r\n"

Test(edges, chunks_and_codings_are_judged_as_they_arrive, .init = start_tenants, .fini = stop)
{
    /* A chunk size over max_body_bytes (2 MiB): 413 with the size line alone, no data sent (the
     * header timeout is far away). */
    cr_assert_eq(raw_status(POST_HEAD("Transfer-Encoding: chunked\r\n") "7fffffff\r\n", NULL), 413);
    cr_assert_eq(raw_status(POST_HEAD("Transfer-Encoding: chunked\r\n") "200001", NULL), 413);
    /* A coding sluice does not decode: 501 (RFC 9112 §6.1). */
    cr_assert_eq(
        raw_status(POST_HEAD("Transfer-Encoding: gzip, chunked\r\n") "2\r\n{}\r\n0\r\n\r\n", NULL),
        501);
    /* Extensions after a valued one, and quoted, are legal (RFC 9112 §7.1.1). */
    static const char body[] = "{\"prompt\":\"Hello\",\"max_tokens\":2}";
    char raw[512];
    snprintf(raw, sizeof raw,
             POST_HEAD("Transfer-Encoding: chunked\r\nConnection: close\r\n") "%zx;a=b;c=d\r\n%s"
                                                                              "\r\n0;e=\"f;g\";h"
                                                                              "\r\n\r\n",
             sizeof body - 1, body);
    struct response r;
    cr_assert_eq(raw_status(raw, &r), 200);
    response_dispose(&r);
    /* An absolute-form target (RFC 9112 §3.2.2). */
    cr_assert_eq(raw_status("GET http://127.0.0.1/healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                            "Connection: close\r\n\r\n",
                            &r),
                 200);
    cr_assert(strstr(r.body, "ok"), "%s", r.body);
    response_dispose(&r);
    cr_assert_eq(raw_status("GET http://127.0.0.1:1/v1/models?x=1 HTTP/1.1\r\nHost: a\r\n" AUTH(
                                ALICE) "Connection: close\r\n\r\n",
                            &r),
                 200);
    cr_assert(strstr(r.body, "synthetic:tiny"), "%s", r.body);
    response_dispose(&r);
}

/* ---- 2. a port in use ---- */

Test(edges, a_second_server_on_a_port_in_use_fails_and_io_threads_share_theirs, .fini = stop)
{
    const char *io2 = write_config("io2.json", "{\"io_threads\":2}");
    snprintf(cfg_path, sizeof cfg_path, "%s", io2);
    const char *args[] = {"--config", cfg_path, NULL};
    server_start(&srv, args);
    char cmd[256], out[4096];
    /* One I/O thread or two, the port is taken: exit 1 at once, naming the error. */
    snprintf(cmd, sizeof cmd, "--listen 127.0.0.1:%d", srv.port);
    cr_assert_eq(sluice_run(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "Address already in use"), "%s", out);
    snprintf(cmd, sizeof cmd, "--config '%s' --listen 127.0.0.1:%d", io2, srv.port);
    cr_assert_eq(sluice_run(cmd, out, sizeof out), 1, "%s", out);
    cr_assert(strstr(out, "Address already in use"), "%s", out);
    /* Every request still reaches the first server, and both of its I/O threads take
     * connections (the kernel spreads them by address: two of 64 all on one thread would be a
     * chance of 2^-63). */
    server_log_clear(&srv);
    for (int i = 0; i < 64; i++) {
        char body[256];
        cr_assert_eq(client_try_request(srv.port, "GET", "/healthz", NULL, NULL, body, sizeof body),
                     200);
    }
    server_wait_log(&srv, "\"io\":0,");
    server_wait_log(&srv, "\"io\":1,");
}

/* ---- 4, 9. --check-config proves the server can start ---- */

Test(edges, check_config_names_what_would_stop_the_server, .fini = stop)
{
    char out[4096], cmd[1024];
    const char *ok = write_config("ok.json", "{\"listen\":\"127.0.0.1:0\"}");
    char okp[128];
    snprintf(okp, sizeof okp, "%s", ok);
    snprintf(cmd, sizeof cmd, "--check-config '%s'", okp);
    cr_assert_eq(sluice_run(cmd, out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "valid"), "%s", out);

    snprintf(cmd, sizeof cmd, "--check-config '%s' --model synthetic:nosuchshape", okp);
    cr_assert_eq(sluice_run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "nosuchshape") && strstr(out, "unknown synthetic model"), "%s", out);
    cr_assert(strstr(out, "stories15M"), "the known shapes are listed: %s", out);

    snprintf(cmd, sizeof cmd, "--check-config '%s' --model /nonexistent/model.gguf", okp);
    cr_assert_eq(sluice_run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "/nonexistent/model.gguf") && strstr(out, "No such file"), "%s", out);

    /* A file that exists but is no model: its header does not parse. */
    const char *junk = write_config("junk.gguf", "this is not a GGUF file at all, not even close");
    char junkp[128];
    snprintf(junkp, sizeof junkp, "%s", junk);
    snprintf(cmd, sizeof cmd, "--check-config '%s' --model '%s'", okp, junkp);
    cr_assert_eq(sluice_run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, junkp), "%s", out);
    unlink(junkp);

    /* A TLS key that does not exist: the file and the OS's reason. */
    const char *tls = write_config("tls.json", "{\"listen\":\"127.0.0.1:0\",\"tls\":{\"listen\":"
                                               "\"127.0.0.1:0\",\"cert\":\"/nonexistent/c.pem\","
                                               "\"key\":\"/nonexistent/k.pem\"}}");
    snprintf(cmd, sizeof cmd, "--check-config '%s'", tls);
    cr_assert_eq(sluice_run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "/nonexistent/c.pem") && strstr(out, "No such file or directory"), "%s",
              out);
    cr_assert_null(strstr(out, "unknown OpenSSL error"), "%s", out);
    unlink(tls);

    /* A listen address another process holds. */
    const char *args[] = {NULL};
    server_start(&srv, args);
    snprintf(cmd, sizeof cmd, "--check-config '%s' --listen 127.0.0.1:%d", okp, srv.port);
    cr_assert_eq(sluice_run(cmd, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, "Address already in use"), "%s", out);
    unlink(okp);

    /* --help lists simulate and every synthetic shape. */
    cr_assert_eq(sluice_run("--help", out, sizeof out), 0, "%s", out);
    cr_assert(strstr(out, "simulate"), "%s", out);
    const char *shapes[] = {"tiny", "stories15M", "llama-1b", "llama-8b"};
    for (int i = 0; i < 4; i++)
        cr_assert(strstr(out, shapes[i]), "--help names %s:\n%s", shapes[i], out);
}

/* ---- 10. the served model's names ---- */

static int completion_status(const char *model)
{
    char body[256], out[4096];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"Hi\",\"max_tokens\":1}", model);
    return client_try_request(srv.port, "POST", "/v1/completions", NULL, body, out, sizeof out);
}

Test(edges, the_model_is_served_under_the_name_it_was_configured_with, .fini = stop)
{
    const char *args[] = {"--model", "synthetic", NULL};
    server_start(&srv, args);
    cr_assert_eq(completion_status("synthetic"), 200, "the name the operator gave");
    cr_assert_eq(completion_status("synthetic:tiny"), 200, "the model's own id");
    cr_assert_eq(completion_status("synthetic:other"), 404);
    char out[4096];
    cr_assert_eq(
        client_try_request(srv.port, "GET", "/v1/models/synthetic", NULL, NULL, out, sizeof out),
        200, "%s", out);
    server_stop(&srv);

    const char *named[] = {"--served-model-name", "my-model", NULL};
    server_start(&srv, named);
    cr_assert_eq(completion_status("my-model"), 200);
    cr_assert_eq(completion_status("synthetic:tiny"), 404, "only the served name");
    cr_assert_eq(client_try_request(srv.port, "GET", "/v1/models", NULL, NULL, out, sizeof out),
                 200);
    cr_assert(strstr(out, "\"id\":\"my-model\""), "%s", out);
}
