/* Integration harness: runs the real sluice binary on a loopback port and talks HTTP/1.1 to it
 * over real sockets.
 *
 * Every test that sets a criterion timeout uses .timeout = 300. criterion's sandbox (boxfort)
 * keeps pending timeouts in a list sorted by deadline and, when a test with an earlier deadline
 * starts while another runs (criterion runs tests in parallel), drops the rest of the list: the
 * other test loses its timeout and LeakSanitizer reports the lost entries at exit. With equal
 * timeouts deadlines come in start order and nothing is dropped. */
#ifndef SLUICE_TEST_HARNESS_H
#define SLUICE_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The default tiers (names, priorities, weights) with objectives no stalled host breaks, for
 * tests that send at once and are not about the SLO guard (it judges from measured step times;
 * tests/gateway tests it against fixed figures): a config's "tiers" key and value. */
#define HARNESS_TIERS_WITHOUT_GUARD                                                                \
    "\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,\"ttft_slo_ms\":600000,"              \
    "\"tpot_slo_ms\":1000},\"batch\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":600000,"         \
    "\"tpot_slo_ms\":1000}}"

/* Tenant keys the tests send, each with the key_sha256 a config gives for it (`printf %s KEY |
 * sha256sum`). */
#define ALICE "sk-alice-0123456789abcdefXYZ"
#define ALICE_SHA "4e3cf284f86ed2e2912a406e093fde194fffbfc71792276277eb201998cc4cfe"
#define BOB "sk-bob-0123456789abcdefXYZ"
#define BOB_SHA "ca94e0a18defaf16a73804c392e6898bd1b71c8a2fdf1ec61e574517dadbedca"
#define CAROL "sk-carol-0123456789abcdefXYZ"
#define CAROL_SHA "ce548d28bf71aa9d30cf3e8667a790d9244416b551883d5c1d8753b04686d643"
#define ADMIN "admin-secret-key-0123456789"
#define ADMIN_SHA "4863aec637069806d797219f620402072ed601f239fbc9cb3533c91cc53c1611"
/* The header line that sends `key`. */
#define AUTH(key) "Authorization: Bearer " key "\r\n"

struct server {
    pid_t pid;
    int port;
    int err_fd;        /* read end of the server's stderr */
    char config[64];   /* the config file server_start_config wrote, or "" */
    char log[1 << 16]; /* what it printed so far (truncated at the end if longer) */
    size_t log_len;
};

/* True when the server under test was built with a sanitizer (meson's b_sanitize, passed in
 * SLUICE_SANITIZE), whose slowdown and memory overhead some figures must allow for. */
bool sanitized_build(void);

/* Starts build/sluice (SLUICE_BIN) with the given extra arguments and --listen 127.0.0.1:0, and
 * waits for its "listening on" line. Fails the test when it exits first (or prints nothing for
 * 120 s), leaving s->pid 0. */
void server_start(struct server *s, const char *const *args);
/* The same with another executable (a test build of sluice, such as SLUICE_FAULT_BIN). */
void server_start_bin(struct server *s, const char *bin, const char *const *args);
/* server_start with the arguments "--config FILE", FILE a new temporary file holding `json`. s
 * owns FILE: server_wait_exit (server_stop with it) removes it, and so does a start that fails. */
void server_start_config(struct server *s, const char *json);
/* Rewrites the config file of a server started by server_start_config with json, sends it SIGHUP
 * and waits for its verdict: true when it reloaded, false when it refused (the log says why). */
bool server_reload_config(struct server *s, const char *json);
/* The same with another executable, as server_start_bin. */
void server_start_bin_config(struct server *s, const char *bin, const char *json);
/* A busy server writes an access line per request; while the test makes many requests without
 * looking at the log, a thread reads it so the server never blocks on a full pipe (the newest
 * part is kept in s->log). Between on and off the test must not call the other server_* log
 * functions. */
void server_log_pump(struct server *s, bool on);
/* The server's resident set size in bytes (VmRSS), or 0 when it cannot be read. */
size_t server_rss(const struct server *s);
/* Open file descriptors of the server process. */
int server_fd_count(const struct server *s);
/* Runs build/sluice (SLUICE_BIN) to its end with `args`, a shell fragment (quote paths), its
 * stdout and stderr together in out (NUL-terminated, cut at outlen - 1 bytes). Returns its exit
 * status, or -1 when it did not exit. For commands that do not serve: --check-config, --help,
 * or a start that must fail. */
int sluice_run(const char *args, char *out, size_t outlen);
/* Sends SIGTERM, waits for the exit and asserts it was clean (status 0). Does nothing when s has
 * no server (s->pid 0: not started, or reaped already). */
void server_stop(struct server *s);
/* Reads the server's log until it ends (keeping the server from blocking on a full pipe), then
 * reaps the server, removes its config file (server_start_config) and returns its wait status. */
int server_wait_exit(struct server *s);
/* Reads the server's log until a line contains `needle` (or the server exits, failing). */
void server_wait_log(struct server *s, const char *needle);
/* Forgets the captured log, after taking in what the server has already written, so that the
 * next wait matches only lines printed after this call. */
void server_log_clear(struct server *s);
/* Reads the server's log until it contains one of `needles` (NULL-terminated) and returns the
 * index of the one found (or fails when the server exits). Unlike server_wait_log it drops the
 * oldest captured output as the capture fills, so a busy server (one access line per request)
 * cannot push the line out of reach; s->log then holds only the newest part. */
int server_wait_log_any(struct server *s, const char *const *needles);
/* The same, looking only at what was logged from offset `from` of s->log on; returns the offset
 * just past the match. */
size_t server_wait_log_from(struct server *s, size_t from, const char *needle);

struct response {
    int status;
    char headers[8192]; /* raw header block, lower-cased names (a chunked body's trailer
                         * fields follow the head's) */
    char *body;         /* de-chunked, NUL-terminated, malloc'd */
    size_t body_len;
};

int client_connect(int port);
/* Writes all bytes. */
void client_send(int fd, const char *data, size_t len);
/* Sends one request (Content-Length set when body != NULL). */
void client_request(int fd, const char *method, const char *path, const char *body,
                    bool keep_alive);
/* As client_request, with extra header lines: `headers` is "Name: value\r\n" repeated, or
 * NULL. */
void client_request_h(int fd, const char *method, const char *path, const char *headers,
                      const char *body, bool keep_alive);
/* One request on a new connection with "Connection: close", read to its end. Returns the HTTP
 * status, or -1 when connecting, sending or reading failed. When out != NULL the raw response
 * (head and body, NUL-terminated, cut at max - 1 bytes) is copied there. Makes no criterion
 * assertion and touches no shared state, so any thread may call it (criterion's assertions
 * belong to the test's own thread). */
int client_try_request(int port, const char *method, const char *path, const char *headers,
                       const char *body, char *out, size_t max);
/* Reads one full response (Content-Length, chunked, or until close). Returns false on EOF before
 * a status line. */
bool client_read_response(int fd, struct response *r);
void response_dispose(struct response *r);
/* The value of header `name` (lower case) or NULL; points into a static buffer. */
const char *response_header(const struct response *r, const char *name);

/* Reads what is buffered for fd, or else what one recv() gives, at most max bytes (no NUL
 * added). Returns the count, 0 at EOF or on error. */
size_t client_read_some(int fd, char *buf, size_t max);
/* Reads from fd until `needle` has appeared in what was read (bounded by max bytes). */
bool client_read_until(int fd, const char *needle, char *buf, size_t max);

/* The sum of every sample of the Prometheus family `name` (over all label sets) in a /metrics
 * text, or -1 when the family has none. */
double metrics_sum(const char *text, const char *name);
/* GET /metrics on a new connection: the sum of `name` as metrics_sum says, or -1 on failure. No
 * criterion assertion: any thread may call it. */
double metrics_fetch_sum(int port, const char *name);
/* A cost as sluice writes it (a decimal, "0.000021") in nano-units. */
long long nano_of(const char *s);
/* Raises the soft RLIMIT_NOFILE to at least `want` (up to the hard limit). Returns the limit now
 * in effect. */
long raise_nofile(long want);

#endif
