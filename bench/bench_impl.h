/* sluice-bench — an open-loop load generator for OpenAI-compatible servers (issue 6).
 *
 * This is the bench module's private header: the tool is a program, not a library other modules
 * link, so its contracts live here rather than in include/sluice/ (STYLE.md: a module's layouts
 * in <module>/<module>_impl.h, which its tests may include).
 *
 * Parts, each in its own file:
 *   stats.c   sample sets and their summaries (mean, std, numpy-style percentiles)
 *   dist.c    the seeded random generator, length distributions, arrival processes
 *   spec.c    parsing: classes (flag syntax and JSON files), --goodput, traces, length files
 *   sse.c     the Server-Sent Events splitter and the reading of one OpenAI stream chunk
 *   prompt.c  prompt text of about N tokens
 *   client.c  the HTTP/1.1 client: per-host keep-alive pools over libevent, llhttp responses
 *   run.c     the run: arrivals, closed-loop users, warm-up, retries, progress, stopping
 *   report.c  aggregation per class, the terminal table, --json, --csv
 *   plot.c    --plot: gnuplot charts
 *   cli.c     the command line
 *
 * Everything runs on one thread (the run's event loop); nothing here is thread-safe. Times are
 * seconds since the run's start (double) unless a name says otherwise.
 */
#ifndef SLUICE_BENCH_IMPL_H
#define SLUICE_BENCH_IMPL_H

#include <sluice/common.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct event_base;

/* ---------------------------------------------------------------------------------------------
 * Samples and summaries (stats.c)
 */

/* A growable set of values. Embedded: _init/_dispose. */
struct sl_bench_samples {
    double *v;
    size_t n, cap;
    bool sorted;
};

void sl_bench_samples_init(struct sl_bench_samples *s);
void sl_bench_samples_dispose(struct sl_bench_samples *s);
void sl_bench_samples_add(struct sl_bench_samples *s, double x);
/* Appends every value of `from`. */
void sl_bench_samples_merge(struct sl_bench_samples *s, const struct sl_bench_samples *from);
/* The p-th percentile (0 <= p <= 100) with numpy's default linear interpolation (the method
 * vLLM's bench uses): rank p/100·(n−1) between the two nearest order statistics. Sorts the set
 * in place on first use. 0 for an empty set (numpy's percentile of [0]). */
double sl_bench_samples_percentile(struct sl_bench_samples *s, double p);

struct sl_bench_summary {
    size_t n;
    double mean, std, median, min, max; /* std: population (numpy's default ddof=0) */
};

/* All zero for an empty set. Sorts the set in place. */
struct sl_bench_summary sl_bench_samples_summarize(struct sl_bench_samples *s);

/* ---------------------------------------------------------------------------------------------
 * Randomness, lengths and arrivals (dist.c)
 */

/* xoshiro256** seeded through splitmix64: every stream of the run is derived from --seed and a
 * fixed label, so arrivals and lengths depend on the seed alone, never on timing. */
struct sl_bench_rng {
    uint64_t s[4];
};

void sl_bench_rng_seed(struct sl_bench_rng *r, uint64_t seed, uint64_t stream);
uint64_t sl_bench_rng_next(struct sl_bench_rng *r);
/* Uniform in [0, 1). */
double sl_bench_rng_uniform(struct sl_bench_rng *r);
/* Standard normal (Box–Muller; one value per call). */
double sl_bench_rng_normal(struct sl_bench_rng *r);
/* Exponential with the given mean. */
double sl_bench_rng_exp(struct sl_bench_rng *r, double mean);
/* Gamma(shape, scale 1) by Marsaglia and Tsang (shape > 0). */
double sl_bench_rng_gamma(struct sl_bench_rng *r, double shape);

enum sl_bench_len_kind {
    SL_BENCH_LEN_FIXED,     /* a */
    SL_BENCH_LEN_UNIFORM,   /* integers in [a, b] */
    SL_BENCH_LEN_LOGNORMAL, /* median a, sigma b (of the log) */
    SL_BENCH_LEN_FILE,      /* drawn with replacement from values[] */
};

/* A token-count distribution. Values are clamped to [1, SL_BENCH_LEN_MAX]. The values array of a
 * FILE distribution is shared by copies (the config owns it; see sl_bench_config_dispose). */
struct sl_bench_len {
    enum sl_bench_len_kind kind;
    double a, b;
    const uint32_t *values;
    size_t n_values;
    char text[96]; /* as the user wrote it, for reports */
};

#define SL_BENCH_LEN_MAX 1048576u

uint32_t sl_bench_len_sample(const struct sl_bench_len *d, struct sl_bench_rng *r);

enum sl_bench_arrival_kind {
    SL_BENCH_ARRIVAL_POISSON,  /* exponential gaps */
    SL_BENCH_ARRIVAL_CONSTANT, /* gaps of exactly 1/rate */
    SL_BENCH_ARRIVAL_GAMMA,    /* gamma gaps with shape `burstiness`, mean 1/rate (vLLM) */
    SL_BENCH_ARRIVAL_ONOFF,    /* Poisson at `rate` during on_s, silence during off_s, repeated */
};

struct sl_bench_arrival {
    enum sl_bench_arrival_kind kind;
    double burstiness;
    double on_s, off_s;
};

/* The state of one arrival stream. rate is in requests per second; INFINITY sends everything at
 * time 0. */
struct sl_bench_arrivals {
    struct sl_bench_arrival shape;
    double rate;
    double on_clock; /* ONOFF: "on" time elapsed up to the last arrival */
    double t;        /* the last arrival */
    bool started;
    struct sl_bench_rng rng;
};

void sl_bench_arrivals_init(struct sl_bench_arrivals *a, const struct sl_bench_arrival *shape,
                            double rate, uint64_t seed, uint64_t stream);
/* The next arrival time (seconds from the stream's start), non-decreasing. The first arrival is
 * at 0 and each later one a gap after the one before (as vLLM's bench sends its first request at
 * once); an ONOFF stream starts with an "on" period. */
double sl_bench_arrivals_next(struct sl_bench_arrivals *a);

/* ---------------------------------------------------------------------------------------------
 * Request classes and the run's configuration (spec.c, cli.c)
 */

/* A kind of request with its own arrivals, identity and shape. Strings are owned (malloc'd). */
struct sl_bench_class {
    char *name;
    double rate;   /* requests/s; see rate_set */
    bool rate_set; /* false: a share of --request-rate by weight (open loop) */
    double weight; /* share of --request-rate, or of closed-loop picks */
    struct sl_bench_arrival arrival;
    bool arrival_set;
    char *tier;         /* sent as the x-sluice-tier header, or NULL */
    char *service_tier; /* sent as OpenAI's service_tier field, or NULL */
    char *tenant;       /* a label; traces match classes by it; NULL: any */
    char *key;          /* API key (Authorization: Bearer), or NULL */
    char *model;        /* NULL: the run's model */
    char *path;         /* NULL: the run's --endpoint */
    int chat;           /* 1 chat, 0 completions, -1 from the path */
    struct sl_bench_len prompt, output;
    bool prompt_set, output_set;
    long shared_prefix; /* tokens of the run's shared prefix before each prompt; -1: the run's */
    int ignore_eos;     /* -1: the run's --ignore-eos */
    double temperature; /* NAN: the run's */
    long max_requests;  /* 0: no cap of its own */
    double slo_ms[3];   /* ttft, tpot, e2el; NAN: the run's --goodput */
    bool from_trace;    /* created for a (tier, tenant) pair of a trace */
};

enum { SL_BENCH_SLO_TTFT, SL_BENCH_SLO_TPOT, SL_BENCH_SLO_E2EL };

/* One line of a trace (the JSONL format of `sluice simulate`):
 * {"t": 0.0, "tier": "interactive", "tenant": "acme", "prompt_tokens": 128, "output_tokens": 64} */
struct sl_bench_trace_entry {
    double t;
    uint32_t prompt_tokens, output_tokens;
    uint32_t cls; /* resolved class index */
    uint32_t seq; /* line order in the file (ties in t keep it) */
};

struct sl_bench_tenant_key {
    char *tenant, *key;
};

#define SL_BENCH_MAX_CLASSES 64
#define SL_BENCH_MAX_PERCENTILES 8

struct sl_bench_config {
    /* target */
    char *url;      /* as given */
    char host[256]; /* parsed from url */
    char port[8];
    char prefix[256]; /* path prefix of url, without a trailing '/' */
    char *endpoint;   /* default path of every class, "/v1/completions" */
    char *model;      /* NULL: the first of GET /v1/models, else omitted */
    char *api_key;    /* default key; --api-key or $OPENAI_API_KEY */
    /* classes */
    struct sl_bench_class *classes;
    size_t n_classes;
    struct sl_bench_tenant_key *tenant_keys;
    size_t n_tenant_keys;
    struct sl_bench_class defaults; /* what a class leaves unset; from the global flags */
    /* load */
    double request_rate; /* INFINITY (default): all at once */
    struct sl_bench_arrival arrival;
    int concurrency;     /* closed loop with this many users; 0: open loop */
    int max_concurrency; /* open loop: at most this many in flight; 0: no cap */
    long num_requests;   /* measured requests; 0: none */
    double duration_s;   /* measured seconds; 0: none */
    long num_warmups;
    double warmup_s;
    uint64_t seed;
    /* trace replay */
    char *trace_path;
    double trace_speed;
    struct sl_bench_trace_entry *trace;
    size_t n_trace;
    /* request details */
    bool ignore_eos;
    double temperature;
    uint32_t shared_prefix; /* --shared-prefix-tokens: every class's default, 0 = no sharing */
    bool unique_prefix;     /* --unique-prefix: each request draws its prefix's words */
    char *extra_body;       /* JSON object members without braces ("\"a\":1,\"b\":2"), or NULL */
    int max_retries;
    double timeout_s;
    bool calibrate;
    /* report */
    double slo_ms[3]; /* --goodput; NAN: not given */
    double percentiles[SL_BENCH_MAX_PERCENTILES];
    size_t n_percentiles;
    char *json_path, *csv_path, *plot_dir;
    char *summary_path; /* --summary: one TSV line per class appended (scenarios) */
    char *label;        /* --label: the run's name in --summary and --json */
    char *gnuplot;      /* the gnuplot program found for --plot */
    int progress;       /* 1 on, 0 off, -1 when stderr is a terminal */
    bool quiet;         /* no table on stdout */
    /* owned arrays of FILE length distributions */
    uint32_t **len_files;
    size_t n_len_files;
};

/* Fills defaults (see cli.c's usage text). */
void sl_bench_config_init(struct sl_bench_config *c);
void sl_bench_config_dispose(struct sl_bench_config *c);

/* Parses the command line into c (after sl_bench_config_init) and checks it. On error writes
 * one line naming the flag or key to `err` (size errlen) and returns SL_EINVAL. Returns SL_OK,
 * or 1 when --help or --version was asked and printed (to stdout). */
int sl_bench_cli_parse(struct sl_bench_config *c, int argc, char **argv, char *err, size_t errlen);
void sl_bench_cli_usage(FILE *f);

/* Parses "fixed:N", "uniform:LO:HI", "lognormal:MEDIAN:SIGMA" or "file:PATH" (integers, one per
 * line; '#' starts a comment). A file's values are added to c->len_files. */
int sl_bench_len_parse(struct sl_bench_config *c, struct sl_bench_len *d, const char *text,
                       char *err, size_t errlen);
/* Parses "poisson", "constant", "gamma:BURSTINESS" or "onoff:ON_S:OFF_S". */
int sl_bench_arrival_parse(struct sl_bench_arrival *a, const char *text, char *err, size_t errlen);

/* A new class with nothing set (weight 1, ignore_eos -1, temperature and SLOs NAN). */
void sl_bench_class_init(struct sl_bench_class *k, const char *name);
void sl_bench_class_dispose(struct sl_bench_class *k);
/* Sets one key of a class (the keys of --class; see cli.c's usage). */
int sl_bench_class_set(struct sl_bench_config *c, struct sl_bench_class *k, const char *key,
                       const char *value, char *err, size_t errlen);
/* Parses "NAME,key=value,..." and appends the class. */
int sl_bench_class_parse(struct sl_bench_config *c, const char *spec, char *err, size_t errlen);
/* Reads a JSON file: an array of class objects, or {"classes": [...]}; every object has "name"
 * and the keys of --class, with strings or numbers as values. Appends the classes. */
int sl_bench_classes_load(struct sl_bench_config *c, const char *path, char *err, size_t errlen);
/* Parses one "--goodput" word: "ttft:MS", "tpot:MS", "e2el:MS", or several joined by commas. */
int sl_bench_goodput_parse(double slo_ms[3], const char *text, char *err, size_t errlen);
/* Reads a trace into c->trace, sorted by t (stable), resolving each line's class: the first class
 * whose tier and tenant match (a class without tier or tenant matches any), else a class created
 * for the pair, named "TIER" or "TIER@TENANT". */
int sl_bench_trace_load(struct sl_bench_config *c, const char *path, char *err, size_t errlen);

/* Fills in what classes leave to the run (model, path, key, lengths, ...) once the command line
 * is read, and derives rates from --request-rate. */
int sl_bench_config_finish(struct sl_bench_config *c, char *err, size_t errlen);

/* ---------------------------------------------------------------------------------------------
 * Server-Sent Events (sse.c)
 */

/* Splits a byte stream into events and hands each event's data (its "data:" lines joined with
 * '\n', NUL-terminated) to `on_data`. Comments, other fields and events without data are
 * skipped. Handles any split of the input (CR, LF or CRLF line ends). Embedded: _init/_dispose. */
struct sl_bench_sse {
    struct sl_str line; /* a line not yet ended */
    struct sl_str data; /* the current event's data */
    bool has_data;
    bool cr; /* the last byte seen was CR (a following LF belongs to it) */
};

void sl_bench_sse_init(struct sl_bench_sse *p);
void sl_bench_sse_dispose(struct sl_bench_sse *p);
void sl_bench_sse_reset(struct sl_bench_sse *p);
/* Returns the first non-zero value an on_data call returned (then stops), SL_ERANGE when a line
 * or an event grows past SL_BENCH_SSE_MAX bytes (a server's sizes are bounded too), else 0. */
#define SL_BENCH_SSE_MAX (4u << 20)
int sl_bench_sse_feed(struct sl_bench_sse *p, const char *data, size_t len,
                      int (*on_data)(void *arg, const char *data, size_t len), void *arg);

/* What one chunk of an OpenAI stream (or a whole non-streamed response) says. */
struct sl_bench_chunk {
    bool done;   /* "[DONE]" */
    bool text;   /* carries generated text (completions "text", chat "content" or
                    "reasoning_content"), non-empty */
    bool usage;  /* a usage object with counts */
    bool error;  /* an "error" object */
    bool finish; /* some choice has a finish_reason */
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens; /* usage.prompt_tokens_details.cached_tokens (OpenAI's), else 0 */
    char message[160];      /* error.message when error */
};

/* Reads one chunk. Returns SL_EFORMAT when it is not JSON (out->message says why). */
int sl_bench_chunk_read(const char *data, size_t len, struct sl_bench_chunk *out);

/* ---------------------------------------------------------------------------------------------
 * Prompts (prompt.c)
 */

/* tokens ≈ slope·words + intercept for an endpoint kind; measured by calibration, else 1 and 0.
 * prefix_slope: tokens per word of the run's shared prefix, measured on the prefix itself (one
 * probe, so that a long prefix matches its token count closely); 0 when not measured. */
struct sl_bench_calib {
    double slope, intercept;
    bool measured;
    double prefix_slope;
};

/* How many words aim at `tokens` tokens (at least 1). */
uint32_t sl_bench_prompt_words(const struct sl_bench_calib *k, uint32_t tokens);
/* Appends `words` common English words (each one token in common BPE vocabularies), drawn from
 * the generator so that prompts differ (no shared prefix for a cache to hit), as a JSON string
 * body (plain ASCII, nothing to escape). */
void sl_bench_prompt_append(struct sl_str *out, uint32_t words, struct sl_bench_rng *r);

/* How many words of the shared prefix aim at `tokens` tokens: tokens / prefix_slope (else
 * slope), rounded, with no intercept (the prompt after it carries the request's constant tokens);
 * 0 for 0 tokens, else at least 1. */
uint32_t sl_bench_prefix_words(const struct sl_bench_calib *k, uint32_t tokens);
/* Appends the first `words` words of the run's shared prefix: the same words as
 * sl_bench_prompt_append draws, from a stream that depends on `seed` alone, so every request,
 * user and class of a run (and every run with that seed) sends the same text, and a shorter
 * prefix is the start of a longer one. */
void sl_bench_prefix_append(struct sl_str *out, uint32_t words, uint64_t seed);

/* ---------------------------------------------------------------------------------------------
 * How a request ended
 */

enum sl_bench_outcome {
    SL_BENCH_OK,       /* 2xx and the stream ended with [DONE] (or a JSON body with usage) */
    SL_BENCH_REJECTED, /* a non-2xx status, after any retries */
    SL_BENCH_ERROR,    /* no status, or the stream failed: see err */
};

enum sl_bench_err {
    SL_BENCH_ERR_NONE,
    SL_BENCH_ERR_CONNECT,   /* connecting failed or was refused */
    SL_BENCH_ERR_CLOSED,    /* the server closed or reset the connection mid-response */
    SL_BENCH_ERR_HTTP,      /* the response was not valid HTTP */
    SL_BENCH_ERR_TIMEOUT,   /* --timeout passed */
    SL_BENCH_ERR_STREAM,    /* an error event in the stream, or a chunk that is not JSON */
    SL_BENCH_ERR_TRUNCATED, /* a 2xx stream that ended without [DONE] */
    SL_BENCH_ERR_CANCELLED, /* stopped by a second Ctrl-C */
    SL_BENCH_ERR_COUNT
};

const char *sl_bench_err_name(enum sl_bench_err e);

/* ---------------------------------------------------------------------------------------------
 * The HTTP/1.1 client (client.c)
 *
 * One client per event loop. A pool per host:port keeps idle keep-alive connections (the most
 * recently used first) and opens a new connection, with a non-blocking connect, whenever none is
 * idle: HTTP/1.1 without pipelining needs one connection per request in flight, so an open loop
 * holds as many connections as it has requests outstanding (thousands, on one thread).
 */

struct sl_bench_client;
struct sl_bench_conn;

/* One request and its response. The caller embeds it, fills the first fields, and submits it;
 * the client fills the response fields and calls back. */
struct sl_bench_exchange {
    /* set by the caller */
    const char *wire; /* the whole request (head and body); kept alive until on_done */
    size_t wire_len;
    /* The head arrived (status and the headers below are set). */
    void (*on_head)(struct sl_bench_exchange *x, double now);
    /* Body bytes (de-chunked). Returning non-zero aborts the exchange with SL_BENCH_ERR_STREAM
     * (the connection is closed). */
    int (*on_body)(struct sl_bench_exchange *x, const char *p, size_t n, double now);
    /* The exchange ended: err is SL_BENCH_ERR_NONE when a whole response arrived. Called once,
     * never from inside sl_bench_client_submit; the connection is already released, so the
     * callback may submit again (this exchange or another). */
    void (*on_done)(struct sl_bench_exchange *x, enum sl_bench_err err, const char *why,
                    double now);
    /* response */
    int status;
    bool event_stream;  /* Content-Type: text/event-stream */
    double retry_after; /* seconds from retry-after-ms or Retry-After, or -1 */
    int should_retry;   /* x-should-retry: 1 true, 0 false, -1 absent */
    bool reused;        /* went out on a kept-alive connection */
    /* private to the client */
    struct sl_bench_conn *conn;
    bool got_bytes;
    bool fresh_retry; /* already re-sent once after a stale keep-alive connection closed */
};

/* Creates a client on `base`; times passed to callbacks are seconds since t0_ns
 * (sl_clock_ns()). */
struct sl_bench_client *sl_bench_client_new(struct event_base *base, uint64_t t0_ns);
/* Moves the time origin (the run's start, after its probes) and zeroes the counters. */
void sl_bench_client_set_t0(struct sl_bench_client *cl, uint64_t t0_ns);
/* Closes every connection. No callbacks are made. */
void sl_bench_client_free(struct sl_bench_client *cl);
/* Resolves host:port (blocking, once, at start) and returns the pool's index, or a negative
 * status with a message in err. */
int sl_bench_client_pool(struct sl_bench_client *cl, const char *host, const char *port, char *err,
                         size_t errlen);
/* Sends x on an idle connection of the pool, or a new one. Failures arrive through on_done. */
void sl_bench_client_submit(struct sl_bench_client *cl, int pool, struct sl_bench_exchange *x);
/* Abandons x if it is in flight (its connection is closed); on_done is not called. */
void sl_bench_client_cancel(struct sl_bench_client *cl, struct sl_bench_exchange *x);
/* Counters for the report. */
void sl_bench_client_counts(const struct sl_bench_client *cl, uint64_t *opened, uint64_t *reused,
                            uint64_t *failed);
/* Seconds since t0 now (one clock read). */
double sl_bench_client_now(const struct sl_bench_client *cl);

/* Seconds to wait from Retry-After ("120" or an HTTP date) at wall-clock time now_unix, or -1. */
double sl_bench_retry_after_parse(const char *value, double now_unix);

/* ---------------------------------------------------------------------------------------------
 * Per-request records (run.c fills them, report.c reads them)
 */

struct sl_bench_record {
    uint32_t cls;
    uint32_t id; /* order of creation, from 0 */
    bool warmup;
    bool usage;  /* the server reported usage (else tokens are our estimate / chunk count) */
    bool reused; /* the first attempt went out on a kept-alive connection */
    enum sl_bench_outcome outcome;
    enum sl_bench_err err;
    int status;       /* the final HTTP status, 0 when none */
    bool retry_after; /* rejected: the final answer said when to retry (retry-after[-ms]) */
    uint16_t attempts;
    double t_sched; /* when it should have been sent (arrival, or a closed-loop user's turn) */
    double t_ready; /* when --max-concurrency let it go (= t_sched without a cap) */
    double t_sent;  /* when the first attempt was handed to a connection */
    double t_first; /* first text chunk (0: none) */
    double t_end;   /* the end of the last attempt */
    uint32_t prompt_target, output_target; /* what was asked for */
    uint32_t prompt_tokens, output_tokens; /* usage (or estimates, see `usage`) */
    uint32_t cached_tokens;                /* of prompt_tokens, a prefix cache's (usage) */
    uint32_t chunks;                       /* text chunks received */
    double itl_sum;                        /* sum of gaps between text chunks */
};

/* One HTTP response (any attempt): when its head arrived and its status, for the admissions
 * time series. */
struct sl_bench_admission {
    double t;
    int status;
    uint32_t cls;
};

/* What a run leaves behind for the report. Owned by the run. */
struct sl_bench_results {
    struct sl_bench_record *recs;
    size_t n_recs, cap_recs;
    /* per class: measured, completed requests' ITLs (ms), appended as they finish */
    struct sl_bench_samples *itl_ms;
    struct sl_bench_admission *adm;
    size_t n_adm, cap_adm;
    /* text chunks per whole second of the run (measured requests), for the peak output rate */
    uint32_t *chunks_per_s;
    size_t n_seconds;
    double t_meas0;    /* start of the measured window */
    double t_meas_end; /* end of the last measured request */
    double wall_s;     /* the whole run */
    double cpu_user_s, cpu_sys_s;
    struct sl_bench_samples lag_ms;   /* t_sent − t_ready, every request: the generator's delay */
    struct sl_bench_samples queue_ms; /* t_ready − t_sched, with --max-concurrency */
    uint64_t conns_opened, conns_reused, conns_failed;
    uint32_t peak_in_flight;
    uint64_t retries;
    bool interrupted;
    struct sl_bench_calib calib[2]; /* completions, chat */
    char *model_id;                 /* the model sent (or NULL) */
    char first_error[8][200];       /* a few distinct error messages, for the report */
    size_t n_first_error;
};

/* Runs the load described by c and fills r (which the caller zeroes and later disposes).
 * Returns SL_OK, or a negative status with a message on stderr when the run could not start. */
int sl_bench_run(const struct sl_bench_config *c, struct sl_bench_results *r);
void sl_bench_results_dispose(struct sl_bench_results *r, size_t n_classes);

/* ---------------------------------------------------------------------------------------------
 * The report (report.c, plot.c)
 */

/* The figures of one class (cls = its index) or of all (cls = SIZE_MAX). */
struct sl_bench_figures {
    uint64_t sent, completed, rejected, errors, retries, warmup;
    uint64_t rejected_no_retry_after; /* rejected without retry-after-ms or Retry-After */
    uint64_t status_count[600];       /* rejected, by final status */
    uint64_t err_count[SL_BENCH_ERR_COUNT];
    uint64_t input_tokens, output_tokens, good, no_usage;
    uint64_t cached_tokens; /* of input_tokens, those the server's prefix cache held */
    double duration_s;
    double request_throughput, output_throughput, total_token_throughput, request_goodput;
    struct sl_bench_samples ttft_ms, tpot_ms, itl_ms, e2el_ms;
    double max_output_tokens_per_s;
    uint32_t max_concurrent_requests;
};

void sl_bench_figures_compute(const struct sl_bench_config *c, struct sl_bench_results *r,
                              size_t cls, struct sl_bench_figures *f);
void sl_bench_figures_dispose(struct sl_bench_figures *f);

/* The terminal table. */
void sl_bench_report_text(const struct sl_bench_config *c, struct sl_bench_results *r, FILE *out);
/* --json: vLLM's `bench serve` fields plus "classes" and "generator". */
int sl_bench_report_json(const struct sl_bench_config *c, struct sl_bench_results *r,
                         const char *path);
/* --csv: one row per request. */
int sl_bench_report_csv(const struct sl_bench_config *c, const struct sl_bench_results *r,
                        const char *path);
/* --summary: appends one tab-separated line per class and one for all (label, class, counts,
 * throughputs, goodput and p50/p99 latencies in ms), after a header line when the file is new or
 * empty. Scenario scripts build their tables from it. */
int sl_bench_report_summary(const struct sl_bench_config *c, struct sl_bench_results *r,
                            const char *path);
/* Finds gnuplot on PATH; returns a malloc'd path or NULL. */
char *sl_bench_plot_find_gnuplot(void);
/* --plot DIR: writes data files, a gnuplot script and runs c->gnuplot on it. */
int sl_bench_plot(const struct sl_bench_config *c, struct sl_bench_results *r, const char *dir);

#endif
