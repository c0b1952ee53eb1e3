/* sluice — usage: what requests cost and who used what (issue 29). Prices and money, the UTC
 * periods that budgets run over, a ledger of usage totals by tenant, model, tier and hour, and
 * the journal that keeps the ledger across restarts on a server without Redis.
 *
 * Money is an int64_t count of nano-units of the server's currency (1e-9: a token at $0.15 per
 * million tokens is 150 of them), so sums are exact, reservations are atomic adds, and Redis can
 * keep the same figures with HINCRBY. 2^63 nano-units are 9.2 billion units of the currency.
 *
 * Threads: the ledger and the journal may be used from any thread; the rest are pure functions.
 */
#ifndef SLUICE_USAGE_H
#define SLUICE_USAGE_H

#include <sluice/common.h>

#define SL_USAGE_NANO 1000000000LL /* nano-units in one unit of the currency */
#define SL_USAGE_TENANT_MAX 64     /* as SL_TENANT_NAME_MAX */
#define SL_USAGE_MODEL_MAX 64      /* as SL_MODEL_NAME_MAX */
#define SL_USAGE_TIER_MAX 32       /* as SL_TIER_NAME_MAX */

/* A model's prices, in the server's currency (the configuration's "price"). */
struct sl_usage_price {
    double input_per_mtok;        /* per million prompt tokens computed */
    double cached_input_per_mtok; /* per million prompt tokens served from the prefix cache */
    double output_per_mtok;       /* per million tokens generated */
    double device_second;         /* per second of device time (sl_req_device_ns) */
};

/* One request's usage, or a sum of them. */
struct sl_usage {
    int64_t requests;
    int64_t prompt_tokens; /* every prompt token, cached ones included */
    int64_t cached_tokens; /* of them, served from the prefix cache (0 until it exists) */
    int64_t completion_tokens;
    int64_t device_ns; /* device time charged to it (the scheduler's rule: by rows) */
    int64_t cost;      /* nano-units: sl_usage_cost of the above */
};

/* What u costs at p, rounded to the nearest nano-unit: uncached prompt tokens at the input price,
 * cached ones at the cached price, completion tokens at the output price, device time at the
 * device-second price. Negative counts read as 0. */
int64_t sl_usage_cost(const struct sl_usage_price *p, const struct sl_usage *u);
/* The most a request can cost before it runs: every prompt token uncached, max_tokens generated,
 * no device time (which no admission can know): what a money budget reserves. */
int64_t sl_usage_worst_case(const struct sl_usage_price *p, int64_t prompt_tokens,
                            int64_t max_tokens);
/* sum += u, field by field. */
void sl_usage_add(struct sl_usage *sum, const struct sl_usage *u);
/* nano as a decimal in units ("0.00015", "12", "-0.5"): up to 9 decimals, trailing zeros
 * dropped. NUL-terminated in out (32 bytes are always enough). */
void sl_usage_money_format(int64_t nano, char *out, size_t outlen);

/* The periods a budget runs over, in UTC. */
enum sl_usage_period {
    SL_USAGE_DAY,
    SL_USAGE_WEEK,  /* from Monday 00:00 */
    SL_USAGE_MONTH, /* from month_day 00:00 (1 to 28) */
    SL_USAGE_TOTAL, /* never resets */
};
/* "day", "week", "month", "total"; sl_usage_period_parse returns -1 for anything else. */
const char *sl_usage_period_name(enum sl_usage_period p);
int sl_usage_period_parse(const char *s);
/* The period of kind p that contains unix time t: [*start, *end) in unix seconds. TOTAL is
 * [INT64_MIN, INT64_MAX). */
void sl_usage_period_bounds(enum sl_usage_period p, int month_day, int64_t t, int64_t *start,
                            int64_t *end);

/* ---------------------------------------------------------------------------------------------
 * The ledger: usage totals by tenant, model, tier and hour, in memory (the journal or Redis keeps
 * them). A mutex guards it: one add per finished request, and reads for the admin routes.
 */

struct sl_usage_key {
    char tenant[SL_USAGE_TENANT_MAX + 1];
    char model[SL_USAGE_MODEL_MAX + 1];
    char tier[SL_USAGE_TIER_MAX + 1];
    int64_t hour; /* unix seconds at the start of the hour (UTC) */
};

/* A time as the usage routes and the export take it: unix seconds, "YYYY-MM-DD" or
 * "YYYY-MM-DDTHH:MM:SSZ" (UTC). False for anything else. */
bool sl_usage_time_parse(const char *s, int64_t *out);
/* t as "YYYY-MM-DDTHH:MM:SSZ" (UTC), NUL-terminated in out. */
void sl_usage_time_format(int64_t t, char out[32]);
/* The hour of unix time t: t rounded down to a multiple of 3600. */
int64_t sl_usage_hour(int64_t t);
/* Fills k (names cut to their maximum length). */
void sl_usage_key_set(struct sl_usage_key *k, const char *tenant, const char *model,
                      const char *tier, int64_t hour);

struct sl_usage_ledger;

struct sl_usage_ledger *sl_usage_ledger_new(void);
void sl_usage_ledger_free(struct sl_usage_ledger *l);
/* Adds u to k's totals. */
void sl_usage_ledger_add(struct sl_usage_ledger *l, const struct sl_usage_key *k,
                         const struct sl_usage *u);
/* The totals of tenant (NULL: every tenant) over the hours in [from, to) (unix seconds). */
void sl_usage_ledger_sum(struct sl_usage_ledger *l, const char *tenant, int64_t from, int64_t to,
                         struct sl_usage *out);

/* What a query groups by (a bit set); the fields not grouped by are "" (names) or -1 (hour) in
 * the rows' keys. */
enum {
    SL_USAGE_BY_TENANT = 1,
    SL_USAGE_BY_MODEL = 2,
    SL_USAGE_BY_TIER = 4,
    SL_USAGE_BY_HOUR = 8,
};
/* "model,tier,hour" (names in any order, comma-separated) → the SL_USAGE_BY_ bits in *out.
 * False on a name that is not tenant, model, tier or hour: bad gets it (NUL-terminated, cut). */
bool sl_usage_group_parse(const char *s, unsigned *out, char *bad, size_t badlen);
/* The name of SL_USAGE_BY_ bit number i (0: "tenant" … 3: "hour"). */
const char *sl_usage_group_name(int i);
typedef void (*sl_usage_row_fn)(void *arg, const struct sl_usage_key *k, const struct sl_usage *u);
/* Calls fn once per group of the totals of tenant (NULL: all) over the hours in [from, to), in
 * order of tenant, model, tier, hour. Returns the number of rows. fn must not use the ledger. */
int sl_usage_ledger_query(struct sl_usage_ledger *l, const char *tenant, int64_t from, int64_t to,
                          unsigned group, sl_usage_row_fn fn, void *arg);

/* ---------------------------------------------------------------------------------------------
 * The journal: the ledger on disk, for a server without Redis. One file, DIR/usage.jsonl, one
 * JSON object per line: a finished request's usage, or (after compaction) an hour's totals:
 *     {"tenant":"acme","model":"m","tier":"batch","hour":1795759200,"requests":1,
 *      "prompt_tokens":5,"cached_tokens":0,"completion_tokens":16,"device_ns":812000,"cost":10350}
 * Records are written by the I/O threads with one write(2) per batch, before the responses of
 * that batch reach their sockets, so a client never holds usage the file lacks: a killed process
 * (SIGTERM, SIGKILL) loses nothing. A thread of the journal fdatasyncs it at most once a second
 * when something was written: a power loss loses at most the last second.
 */

struct sl_usage_journal;

/* Opens (creating it when absent) dir/usage.jsonl, replays it into l, then compacts it: the
 * ledger's totals, one line per key, go to a new file that is synced and renamed over the old,
 * so the file stays one line per (tenant, model, tier, hour) plus the requests since start. A
 * last line cut short (a crash mid-write) is dropped with one log line; other lines that do not
 * parse are skipped, counted in one log line. SL_OK and *out, or an error with err saying what
 * (the directory missing or not writable, an I/O error). */
enum sl_status sl_usage_journal_open(const char *dir, struct sl_usage_ledger *l,
                                     struct sl_usage_journal **out, char *err, size_t errlen);
/* Syncs what was written, stops the sync thread, closes the file. NULL is fine. */
void sl_usage_journal_close(struct sl_usage_journal *j);
/* Appends the line of one record to buf (the calling thread's batch). */
void sl_usage_journal_record(struct sl_str *buf, const struct sl_usage_key *k,
                             const struct sl_usage *u);
/* Writes buf (whole lines) with one write(2) and clears it. SL_OK, or SL_EIO (logged once per
 * failure streak; the records are lost for the file, the ledger keeps them). Any thread. */
enum sl_status sl_usage_journal_write(struct sl_usage_journal *j, struct sl_str *buf);
/* Reads a journal file into l without changing it (sluice usage export): SL_OK, with *bad the
 * lines skipped (a torn last line included), or SL_EIO / SL_ENOENT with err. */
enum sl_status sl_usage_journal_read(const char *path, struct sl_usage_ledger *l, int *bad,
                                     char *err, size_t errlen);
/* One line of the journal (without its newline): SL_OK with *k and *u, or SL_EINVAL. */
enum sl_status sl_usage_journal_parse(const char *line, size_t len, struct sl_usage_key *k,
                                      struct sl_usage *u);

#endif
