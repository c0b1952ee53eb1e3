/* sluice — config: the server's configuration (conf/sluice.json documents every key), loaded
 * from a file and the command line, shared by reference so that a reload never changes a request
 * in flight.
 */
#ifndef SLUICE_CONFIG_H
#define SLUICE_CONFIG_H

#include <sluice/admission.h>
#include <sluice/common.h>
#include <sluice/sched.h>
#include <sluice/usage.h>
#include <sluice/worker.h>

#include <stdio.h>

/* ---------------------------------------------------------------------------------------------
 * Configuration (conf/sluice.json documents every key)
 */

#define SL_MODELS_MAX 8   /* models served at once, each with its own worker and scheduler */
#define SL_REPLICAS_MAX 8 /* workers (and schedulers) of one model, one per device of "devices" */
#define SL_MODEL_NAME_MAX 64

/* One served model: its weights and where it runs. models[0] is also "model" and "tokenizer"
 * (the single-model keys), which stay in step with it. */
struct sl_config_model {
    char *name;      /* the id requests name in "model" and /v1/models lists; NULL: the model's
                        own id (sl_model_id), allowed only for models[0] */
    char *spec;      /* as "model": synthetic[:SHAPE[:TYPE]], a .gguf, an HF folder, a .bin */
    char *tokenizer; /* llama2.c tokenizer.bin for a .bin, or NULL */
    int threads;     /* CPU kernel threads; -1: the top-level "threads" */
    char *device;    /* where it runs (as "device"); NULL: "device" */
    /* Its prices ("price" of its entry; reloadable, by position when a reload changes models). */
    struct sl_usage_price price;
    bool has_price; /* false: the top-level "price" */
};

/* A TLS listener next to the plain one. Off when cert is NULL; then every field is unset. */
struct sl_config_tls {
    char *listen_host; /* "127.0.0.1" */
    int listen_port;   /* 8443; 0 picks a free port */
    char *cert;        /* PEM certificate (chain) file, or NULL: no TLS listener */
    char *key;         /* PEM private key file */
};

/* The configuration is opaque: its layout is config/config_impl.h's. Each consumer reads its
 * own section of it through the accessors below (nginx's per-module configuration), so a key
 * added for one of them changes no other. */
struct sl_config;

/* The transport's section (gateway/http). */
struct sl_config_http {
    char *listen_host;        /* "127.0.0.1" */
    int listen_port;          /* 8080; 0 picks a free port */
    int listen_backlog;       /* listen(2) queue of each listener (4096; the kernel may cap it) */
    struct sl_config_tls tls; /* the TLS listener, if any */
    int io_threads;           /* event loops (default 1) */
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
};

/* The engines' section (server/engine.c, server/simulate.c): the models, where they run and how
 * their workers and schedulers are sized. Start-only: a reload keeps the running engines. */
struct sl_config_engine {
    struct sl_config_model *models; /* (n_models), at least one */
    int n_models;
    char *device;              /* "auto" (default), "cpu", "cuda" or "cuda:N" */
    char **devices;            /* (n_devices) as "device", one replica of each model per entry */
    int n_devices;             /* 0: "device" */
    int threads;               /* CPU kernel threads (0 = one per CPU the process may use) */
    bool pin_threads;          /* each CPU kernel thread on a CPU of its own (default true) */
    char *cpu_isa;             /* "auto" (default), "avx512", "avx2" or "scalar": process-wide */
    int max_seqs;              /* most running sequences in a step */
    int max_batch_tokens;      /* most rows in a step */
    int block_size;            /* KV block size in positions */
    int kv_cache_mib;          /* KV pool size cap in MiB */
    double kv_cache_fraction;  /* when > 0: the cap is this fraction of available memory instead */
    enum sl_kv_dtype kv_dtype; /* how the CPU backend stores K and V (default f16) */
    bool cpu_int8_activations; /* quantized weights × 8-bit activations (default true) */
};

/* The prefix cache's scope: whose requests may reuse each other's cached KV blocks. */
enum sl_config_prefix_scope {
    SL_CONFIG_PREFIX_TENANT, /* one tenant's requests only (the default): a cache shared between
                                tenants tells each, through timing, which prefixes the others
                                sent */
    SL_CONFIG_PREFIX_GLOBAL, /* every tenant's requests to the same model */
};

/* "prefix_cache": {"enabled", "scope"} (reloadable: each request carries what the configuration
 * it started with says, as its sl_req_params' cache_prefix and cache_key). */
struct sl_config_prefix_cache {
    bool enabled; /* default true */
    enum sl_config_prefix_scope scope;
};

/* The API's section (gateway/api): what a request gets when it does not say, and what /metrics
 * shows. */
struct sl_config_api {
    int default_max_tokens;      /* a completion's max_tokens when it gives none (OpenAI: 16) */
    int default_max_tokens_chat; /* a chat's, when it gives none; 0: up to the model's context */
    char *chat_template;         /* a builtin chat template's name, or NULL: the model's own */
    bool vllm_metrics;           /* /metrics also has the gauges the Gateway API Inference
                                    Extension's endpoint picker reads, under vLLM's names
                                    (default false; reloadable: read at each scrape) */
    struct sl_config_prefix_cache prefix_cache;
};

/* The fleet's section: where the budgets every replica shares are kept (issue 28). Start-only. */
struct sl_config_fleet {
    char *url;          /* redis://[:password@]host[:port][/db], or NULL: budgets are local */
    char *key_prefix;   /* before every key sluice writes ("sluice:") */
    int timeout_ms;     /* a budget check without an answer by then goes to the local fallback */
    char *password_env; /* the environment variable with Redis's password, if the URL has none
                           ("SLUICE_REDIS_PASSWORD") */
};

/* Metering (issue 29): what requests cost and where usage is kept. */
struct sl_config_metering {
    char *currency;              /* what prices are in ("USD"): named in /v1/usage */
    struct sl_usage_price price; /* of every model without a price of its own (0: free) */
    char *state_dir;             /* the usage journal's directory (start-only), or NULL: usage is
                                    kept in memory only (or in Redis with "redis") */
    char *budget_webhook;        /* http://host[:port]/path POSTed when a tenant passes its
                                    budget's soft_pct, or NULL */
};

/* c's sections, valid as long as the caller holds c. Any thread. */
const struct sl_config_http *sl_config_http(const struct sl_config *c);
const struct sl_config_engine *sl_config_engine(const struct sl_config *c);
const struct sl_config_api *sl_config_api(const struct sl_config *c);
const struct sl_config_fleet *sl_config_fleet(const struct sl_config *c);
const struct sl_config_metering *sl_config_metering(const struct sl_config *c);
/* The prices of models[i] (its own, else the top-level "price"). */
const struct sl_usage_price *sl_config_model_price(const struct sl_config *c, int i);
/* Tenants, tiers, classification, keys and admission control (reloadable). */
const struct sl_tenancy *sl_config_tenancy(const struct sl_config *c);
/* The same tenancy, writable: only to give it its admission state (sl_admit_adopt, when the API
 * takes c up at start or on a reload) before any request sees c. */
struct sl_tenancy *sl_config_tenancy_mut(struct sl_config *c);
/* "debug", "info", "warn" or "error". */
const char *sl_config_log_level(const struct sl_config *c);

/* Fills c with the built-in defaults (the embedded synthetic model on 127.0.0.1:8080). For an
 * embedded configuration, which only code that sees the layout (config/config_impl.h: the config
 * module and its tests) can declare; everyone else uses sl_config_new. */
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
enum sl_status sl_config_load_file(struct sl_config *c, const char *path, char *err, size_t errlen);
/* Checks cross-field invariants after everything is loaded. */
enum sl_status sl_config_validate(const struct sl_config *c, char *err, size_t errlen);

enum sl_cli_action { SL_CLI_SERVE, SL_CLI_HELP, SL_CLI_VERSION, SL_CLI_CHECK };

/* The scheduler's view of c's tiers, in c's order (so a request's tier index is the same in
 * both): writes at most max entries to out and returns how many. */
int sl_config_sched_tiers(const struct sl_config *c, struct sl_sched_tier *out, int max);

/* Parses the command line: `--config FILE` is applied first, then the other flags override it
 * (`--listen HOST:PORT`, `--model SPEC`, `--served-model-name NAME`, `--tokenizer PATH`,
 * `--help`, `--version`).
 * `--check-config FILE` loads FILE as --config does and sets SL_CLI_CHECK: the caller reports
 * the result and exits without serving.
 * Returns SL_OK and sets *action, or SL_EINVAL with err naming the flag. */
enum sl_status sl_config_from_args(struct sl_config *c, int argc, char **argv,
                                   enum sl_cli_action *action, char *err, size_t errlen);
/* Writes the --help text. */
void sl_config_usage(FILE *out);

/* "models" of src into dst (replacing dst's), and whether two configurations serve the same
 * models in the same way (a reload cannot change them). */
void sl_config_models_copy(struct sl_config *dst, const struct sl_config *src);
bool sl_config_models_equal(const struct sl_config *a, const struct sl_config *b);
/* For a reload: next keeps cur's value of every key read only at start (listen, io_threads, the
 * models and their devices, threads, the KV cache's sizing, whether there is a TLS listener and
 * where), logging a warning for each one that next changed. */
void sl_config_keep_start_keys(struct sl_config *next, const struct sl_config *cur);

/* The effective configuration as JSON (every key conf/sluice.json documents), with key hashes
 * redacted: what GET /admin/config answers. The caller owns the result (a jansson json_t). */
struct json_t;
struct json_t *sl_config_to_json(const struct sl_config *c);

/* The builtin chat templates "chat_template" may name, in the order of the API's
 * enum sl_chat_template (gateway/api/chat.c renders them). */
#define SL_CONFIG_CHAT_TEMPLATES 8
extern const char *const sl_config_chat_templates[SL_CONFIG_CHAT_TEMPLATES];

#endif
