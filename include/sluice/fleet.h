/* sluice — fleet: the connection of one I/O thread to the Redis that holds the fleet's budgets
 * (issue 28). Asynchronous on the thread's event loop (hiredis's libevent adapter): a call never
 * blocks the thread, and every call ends in its callback exactly once, with the script's answer,
 * or a timeout, or an error, so that admission can fall back to local buckets at once.
 *
 * What the scripts do, and the arithmetic, is admission's (sl_fleet_take_lua in admission.h).
 */
#ifndef SLUICE_FLEET_H
#define SLUICE_FLEET_H

#include <sluice/admission.h>
#include <sluice/common.h>

#define SL_FLEET_HOST_MAX 255

/* Where Redis is: redis://[[user]:password@]host[:port][/db] (rediss:// is refused: Debian 12's
 * hiredis 0.14 has no TLS). */
struct sl_fleet_addr {
    char host[SL_FLEET_HOST_MAX + 1];
    int port;           /* 6379 */
    int db;             /* 0 */
    char password[128]; /* "" for none; the URL's, or the one of the password environment */
};

/* Parses url into *out: SL_OK, or SL_EINVAL with err saying what is wrong with it. */
enum sl_status sl_fleet_addr_parse(const char *url, struct sl_fleet_addr *out, char *err,
                                   size_t errlen);

struct event_base;
struct sl_fleet_client;
struct sl_fleet_call;

/* A take's end: SL_OK and the script's answer; SL_ETIMEDOUT when none came within the client's
 * timeout (a late answer that charged the buckets is refunded by the client: the caller went on
 * without it); SL_EIO when Redis is not connected, or answered an error (err says which). */
typedef void (*sl_fleet_take_fn)(void *arg, enum sl_status st, const struct sl_fleet_take *t,
                                 const char *err);

/* A client on base (one per I/O thread), connecting at once and again after any loss (backoff
 * from 100 ms to 2 s). timeout_ms bounds every take. */
struct sl_fleet_client *sl_fleet_client_new(struct event_base *base,
                                            const struct sl_fleet_addr *addr, int timeout_ms);
/* Cancels what is pending (their callbacks run with SL_ECANCELED) and frees the client. */
void sl_fleet_client_free(struct sl_fleet_client *c);
/* Whether the client is connected and ready (its AUTH and SELECT answered). */
bool sl_fleet_client_up(const struct sl_fleet_client *c);
/* Calls in flight: sent, and neither answered nor timed out (late answers count until they
 * arrive). */
int sl_fleet_client_pending(const struct sl_fleet_client *c);

/* Sends a take of the n buckets (keys and rates copied: b may go once this returns). fn runs
 * exactly once, later, on the client's loop, unless the call is cancelled first. Returns the
 * call, to cancel it; NULL when fn has already run: not connected (SL_EIO), or stalled
 * (SL_ETIMEDOUT: a take timed out and Redis has answered nothing since, so that a Redis that
 * stopped answering costs timeout_ms once, not on every request). */
struct sl_fleet_call *sl_fleet_take(struct sl_fleet_client *c, const struct sl_fleet_bucket *b,
                                    int n, sl_fleet_take_fn fn, void *arg);
/* The caller is gone: fn will not run, and if the take charged the buckets, the client gives the
 * charge back when the answer comes. Only while fn has not run: the call is the client's after.
 * The same for a usage read. */
void sl_fleet_call_cancel(struct sl_fleet_call *call);
/* Gives tokens back (fire and forget: a refund that cannot be sent is dropped, and the bucket
 * refills on its own in time). */
void sl_fleet_refund(struct sl_fleet_client *c, const struct sl_fleet_bucket *b, int n);
/* A request's usage and the hour it is counted in. */
struct sl_usage_key_usage {
    struct sl_usage_key key;
    struct sl_usage usage;
};
/* The end of a request in one call: the n buckets' refunds (money buckets take a signed
 * amount) and, when u is not NULL, its usage added to the fleet's ledger under prefix (the
 * refund script). Fire and forget; false when it could not be sent (not connected): the caller
 * keeps the usage elsewhere. */
bool sl_fleet_settle(struct sl_fleet_client *c, const struct sl_fleet_bucket *b, int n,
                     const char *prefix, const struct sl_usage_key_usage *u);

/* Reads the fleet's ledger (sl_fleet_usage_lua, a page of SL_FLEET_USAGE_PAGE hours at a time):
 * the hours in [from, to) of the ledger under prefix and, when budget_key is not NULL, that
 * key's spend. fn runs exactly once, later, on the client's loop, unless the call is cancelled
 * first: SL_OK with the ledger read (the client's: fn may query it, not keep it) and the spend
 * (-1: not asked, or no such key); SL_ETIMEDOUT when the whole read took longer than
 * SL_FLEET_USAGE_TIMEOUT_MS (or timeout_ms if longer; a slow read never counts as a stall);
 * SL_EIO with err otherwise. Returns the call, to cancel it; NULL when fn has already run (not
 * connected). */
#define SL_FLEET_USAGE_PAGE 24
#define SL_FLEET_USAGE_TIMEOUT_MS 5000
typedef void (*sl_fleet_usage_fn)(void *arg, enum sl_status st, struct sl_usage_ledger *l,
                                  int64_t spent, const char *err);
struct sl_fleet_call *sl_fleet_usage_read(struct sl_fleet_client *c, const char *prefix,
                                          const char *budget_key, int64_t from, int64_t to,
                                          sl_fleet_usage_fn fn, void *arg);

/* Claims key for the fleet, once (SET key 1 NX, expiring after ttl_ms; 0: never): fn runs
 * exactly once, on the client's loop or before this returns, with SL_OK and whether this call
 * claimed it (false: another had), or, with claimed false, SL_EIO (not connected, an error),
 * SL_ETIMEDOUT (no answer within timeout_ms) or SL_ECANCELED (the client is being freed). For
 * what one replica of the fleet should do, such as sending a notice. */
typedef void (*sl_fleet_once_fn)(void *arg, enum sl_status st, bool claimed);
void sl_fleet_once(struct sl_fleet_client *c, const char *key, int64_t ttl_ms, sl_fleet_once_fn fn,
                   void *arg);

/* Says this replica (id) is alive in the fleet's set (key), where a replica silent for ttl_ms
 * counts as gone; fire and forget. The answer, how many replicas are alive, is kept:
 * sl_fleet_client_replicas. Call it more often than ttl_ms (a third of it, say). */
void sl_fleet_beat(struct sl_fleet_client *c, const char *key, const char *id, int ttl_ms);
/* The replicas alive at the last beat's answer (this one included), or 0 before any. */
int sl_fleet_client_replicas(const struct sl_fleet_client *c);

#endif
