/* sluice — gateway: configuration, the HTTP/1.1 front end and the OpenAI API.
 *
 * The gateway owns listeners, connections, HTTP parsing (llhttp), routes, OpenAI request and
 * response JSON (jansson), SSE, and `main`. It never touches model state beyond the immutable
 * tokenizer and config; it talks to the engine only through struct sl_sched.
 */
#ifndef SLUICE_GATEWAY_H
#define SLUICE_GATEWAY_H

#include <sluice/common.h>
#include <sluice/sched.h>
#include <sluice/worker.h>

#include <stdio.h>

/* ---------------------------------------------------------------------------------------------
 * Configuration (conf/sluice.json documents every key)
 */

#define SL_TIERS_MAX 32 /* tiers in one configuration (a tenant's allowed tiers are a bit mask) */

struct sl_tier;      /* a latency promise: priority, weight, SLOs (layout in gateway_impl.h) */
struct sl_tenant;    /* who pays: key hash, allowed tiers, default tier */
struct sl_tier_rule; /* one rule of the ordered classification list */

/* A TLS listener next to the plain one. Off when cert is NULL; then every field is unset. */
struct sl_config_tls {
    char *listen_host; /* "127.0.0.1" */
    int listen_port;   /* 8443; 0 picks a free port */
    char *cert;        /* PEM certificate (chain) file, or NULL: no TLS listener */
    char *key;         /* PEM private key file */
};

struct sl_config {
    char *listen_host;        /* "127.0.0.1" */
    int listen_port;          /* 8080; 0 picks a free port */
    int listen_backlog;       /* listen(2) queue of each listener (4096; the kernel may cap it) */
    struct sl_config_tls tls; /* the TLS listener, if any */
    char *model;              /* "synthetic", "synthetic:NAME" or a llama2.c .bin path */
    char *tokenizer;          /* llama2.c tokenizer.bin path, or NULL */
    char *device;             /* "auto" (default), "cpu", "cuda" or "cuda:N" */
    char *chat_template;      /* a builtin chat template's name, or NULL: the model's own */
    int io_threads;           /* event loops (default 1) */
    int threads;              /* CPU kernel threads (0 = all cores) */
    int max_seqs;             /* most running sequences in a step */
    int max_batch_tokens;     /* most rows in a step */
    int block_size;           /* KV block size in positions */
    int kv_cache_mib;         /* KV pool size cap in MiB */
    double kv_cache_fraction; /* when > 0: the cap is this fraction of available memory instead */
    int default_max_tokens;   /* max_tokens when a request gives none (OpenAI: 16) */
    size_t max_body_bytes;    /* larger request bodies get 413 */
    size_t max_header_bytes;  /* larger request heads get 431 */
    /* Transport limits (reloadable; a connection takes them up at its next request). */
    int header_timeout_ms;         /* the head must arrive within this (408), as must every
                                      piece of a body after the previous one */
    int idle_timeout_ms;           /* a kept-alive connection with no request is closed after
                                      this, as is one whose client reads nothing for this long */
    int max_connections;           /* open connections; the next one gets 503 and is closed */
    size_t write_high_water_bytes; /* output queued for a client above which its next pipelined
                                      request waits and stream text is held and coalesced */
    size_t write_hard_cap_bytes;   /* a stream this far behind (queued + held) is cancelled */
    size_t tcp_send_buffer_bytes;  /* SO_SNDBUF of each connection; 0 = the kernel's autotuning */
    int drain_timeout_ms;          /* SIGTERM: how long requests in flight may take to finish */
    char *log_level;               /* "debug", "info", "warn", "error" */

    /* Tenants, tiers and classification (gateway/tenant.c). Arrays owned by the config; tiers is
     * never empty, classify may be (every request then gets its tenant's default). With no tenants
     * every request is the anonymous tenant's, who may use every tier and defaults to tiers[0]. */
    struct sl_tier *tiers;
    int n_tiers;
    struct sl_tenant *tenants;
    int n_tenants;
    struct sl_tier_rule *classify;
    int n_classify;
    bool has_admin_key; /* the /admin/ routes answer 403 without one */
    unsigned char
        admin_key_sha256[32]; /* SHA-256 of the admin key (the key itself is never kept) */
};

/* Fills c with the built-in defaults (the embedded synthetic model on 127.0.0.1:8080). */
void sl_config_init(struct sl_config *c);
void sl_config_dispose(struct sl_config *c);

/* A configuration on the heap, shared by reference: the server holds the current one and each
 * request the one it started with, so a reload (SIGHUP) never changes a request in flight.
 * sl_config_new gives the defaults and one reference; the last sl_config_unref frees it. Only
 * configurations from sl_config_new may be passed to ref/unref. Thread-safe. */
struct sl_config *sl_config_new(void);
struct sl_config *sl_config_ref(struct sl_config *c);
void sl_config_unref(struct sl_config *c);
/* Overlays the JSON file at `path` onto c. Unknown keys, wrong types and out-of-range values are
 * errors; err then names the key (and "line L, column C" for JSON syntax errors). */
int sl_config_load_file(struct sl_config *c, const char *path, char *err, size_t errlen);
/* Checks cross-field invariants after everything is loaded. */
int sl_config_validate(const struct sl_config *c, char *err, size_t errlen);

enum sl_cli_action { SL_CLI_SERVE, SL_CLI_HELP, SL_CLI_VERSION, SL_CLI_CHECK };

/* The scheduler's view of c's tiers, in c's order (so a request's tier index is the same in
 * both): writes at most max entries to out and returns how many. */
int sl_config_sched_tiers(const struct sl_config *c, struct sl_sched_tier *out, int max);

/* Parses the command line: `--config FILE` is applied first, then the other flags override it
 * (`--listen HOST:PORT`, `--model SPEC`, `--tokenizer PATH`, `--help`, `--version`).
 * `--check-config FILE` loads FILE as --config does and sets SL_CLI_CHECK: the caller reports
 * the result and exits without serving.
 * Returns SL_OK and sets *action, or SL_EINVAL with err naming the flag. */
int sl_config_from_args(struct sl_config *c, int argc, char **argv, enum sl_cli_action *action,
                        char *err, size_t errlen);
/* The --help text. */
const char *sl_config_usage(void);
/* Loads the TLS certificate and key that cfg names (if any) as the server would, so that
 * --check-config and a reload fail the same way. Returns SL_OK, or SL_EINVAL with err saying
 * which file does not load or that they do not match. Any thread. */
int sl_http_tls_check(const struct sl_config *cfg, char *err, size_t errlen);

/* `sluice simulate ARGS` (argv[0] is "simulate"): replays a trace of requests against a
 * configuration's tiers and limits with the scheduler under a virtual clock (gateway/simulate.c
 * documents the arguments and the trace format) and prints the report to out, errors to err.
 * Returns the process exit status: 0, 1 when the simulation failed, 2 for bad arguments, a bad
 * configuration or a bad trace line (named by its line number). */
int sl_simulate_main(int argc, char **argv, FILE *out, FILE *err);

/* ---------------------------------------------------------------------------------------------
 * HTTP server
 */

struct sl_http_server;

/* Binds the listener (host:port from cfg, SO_REUSEPORT, one socket per I/O thread) and, when
 * cfg->tls.cert is set, the TLS listener next to it (its certificate and key loaded now), and
 * prepares cfg->io_threads event loops. The server takes its own reference to cfg (from
 * sl_config_new). The model and scheduler must outlive the server. On failure err says why. */
int sl_http_server_new(struct sl_config *cfg, const struct sl_model *model, struct sl_sched *sched,
                       struct sl_http_server **out, char *err, size_t errlen);
/* Makes next (validated, from sl_config_new; the server takes a reference) the configuration of
 * every request that starts from now on; requests in flight keep theirs. Keys that only take
 * effect at start (listen, listen_backlog, tls.listen, model, threads, KV and batch sizes,
 * io_threads) keep their running values, each change logged as needing a restart. With a TLS
 * listener the certificate and key are loaded again first: when they do not load or do not
 * match, nothing changes and SL_EINVAL says why; otherwise new TLS connections use them and open
 * ones keep theirs. Callable from any thread. */
int sl_http_server_reload(struct sl_http_server *s, struct sl_config *next, char *err,
                          size_t errlen);
/* The port actually bound (useful when cfg->listen_port is 0). */
int sl_http_server_port(const struct sl_http_server *s);
/* The TLS listener's bound port, or 0 without one. */
int sl_http_server_tls_port(const struct sl_http_server *s);
/* Starts the I/O threads. */
int sl_http_server_start(struct sl_http_server *s);
/* Drains (SIGTERM): stops accepting, makes /readyz fail and answers every request that starts on
 * an open connection from now on with 503, Retry-After and Connection: close; then blocks until
 * the responses in progress are complete or timeout_ms (< 0: the current configuration's
 * drain_timeout_ms) has passed. Whatever is left is then cancelled in the scheduler and its
 * client told so (a JSON 503, or an error event ending a stream) before it returns. Returns
 * SL_OK, or SL_ETIMEDOUT when requests had to be cancelled. Call from one thread (main), after
 * sl_http_server_start; sl_http_server_stop follows it. */
int sl_http_server_drain(struct sl_http_server *s, int timeout_ms);
/* Stops accepting, closes connections (cancelling their requests), joins the I/O threads. */
void sl_http_server_stop(struct sl_http_server *s);
void sl_http_server_free(struct sl_http_server *s);

/* Maps a status to the HTTP status code and OpenAI error `type` used in error objects: the one
 * place where statuses become HTTP. */
int sl_http_status_code(int status);
const char *sl_http_error_type(int http_code);

#endif
