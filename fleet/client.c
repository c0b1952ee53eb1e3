/* The fleet's Redis client (include/sluice/fleet.h): one hiredis asynchronous context per I/O
 * thread, attached to its event loop. Scripts go by EVALSHA; a server that has not seen one yet
 * (a restart, SCRIPT FLUSH) answers NOSCRIPT and gets the same call once more as EVAL, which also
 * caches it. Each take has its own timer; a call outlives its caller's interest until Redis
 * answers (hiredis runs every callback exactly once, with NULL when the connection goes), so that
 * a late answer that charged the buckets can be given back.
 */
#include <sluice/fleet.h>

#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MAX 256
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 2000

struct sl_fleet_call {
    struct sl_fleet_client *c;
    struct event *timer;
    sl_fleet_take_fn fn; /* NULL once answered, timed out or cancelled */
    void *arg;
    /* a take, a usage read and a once have a caller waiting */
    enum { CALL_TAKE, CALL_REFUND, CALL_BEAT, CALL_USAGE, CALL_ONCE } kind;
    bool retried; /* NOSCRIPT was answered once: sent again as EVAL */
    int n;
    struct sl_fleet_bucket b[SL_FLEET_BUCKETS_MAX];
    char keys[SL_FLEET_BUCKETS_MAX + 2][KEY_MAX]; /* + the usage hash and index of a settle */
    bool usage;                                   /* a refund that records usage too */
    char field[KEY_MAX];
    char unum[7][24];
    /* A usage read (keys[0] the index, keys[1] the budget's key or ""; field the prefix): the
     * range still to read, the pages read into ledger, and who waits for it. */
    int64_t from, to, spent;
    int pages, bad;
    struct sl_usage_ledger *ledger;
    sl_fleet_usage_fn ufn;
    sl_fleet_once_fn ofn; /* a once: keys[0] the key, px its time to live ("" for none) */
    char px[24];
    char beat_ttl[16]; /* a beat: keys[0] the fleet's set, keys[1] this replica's id */
};

struct sl_fleet_client {
    struct event_base *base;
    struct sl_fleet_addr addr;
    int timeout_ms;
    redisAsyncContext *ac; /* NULL while not connected */
    bool up;
    bool stalled; /* a take timed out and nothing has been answered since */
    bool connected_once;
    bool freeing;
    int pending;
    int replicas; /* alive at the last beat's answer; 0 before any */
    int backoff_ms;
    struct event *reconnect;
    char sha_take[SL_FLEET_SHA_LEN + 1], sha_refund[SL_FLEET_SHA_LEN + 1],
        sha_beat[SL_FLEET_SHA_LEN + 1], sha_usage[SL_FLEET_SHA_LEN + 1];
};

/* ---- addresses ---- */

enum sl_status sl_fleet_addr_parse(const char *url, struct sl_fleet_addr *out, char *err,
                                   size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->port = 6379;
    const char *p;
    if (strncmp(url, "rediss://", 9) == 0) {
        snprintf(err, errlen,
                 "rediss:// (TLS) is not supported: this build's hiredis (0.14) has no TLS; use "
                 "redis:// on a trusted network");
        return SL_EINVAL;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        snprintf(err, errlen, "expected redis://[:password@]host[:port][/db], got \"%.64s\"", url);
        return SL_EINVAL;
    }
    p = url + 8;
    const char *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *pw = colon ? colon + 1 : p; /* user:password, or a bare password */
        size_t len = (size_t)(at - pw);
        if (len >= sizeof out->password) {
            snprintf(err, errlen, "the password in the URL is longer than %zu bytes",
                     sizeof out->password - 1);
            return SL_EINVAL;
        }
        memcpy(out->password, pw, len);
        p = at + 1;
    }
    size_t hlen = strcspn(p, ":/");
    if (hlen == 0 || hlen > SL_FLEET_HOST_MAX) {
        snprintf(err, errlen, "the URL has no host, or one longer than %d bytes",
                 SL_FLEET_HOST_MAX);
        return SL_EINVAL;
    }
    for (size_t i = 0; i < hlen; i++) {
        char ch = p[i];
        if (!(ch >= 'a' && ch <= 'z') && !(ch >= 'A' && ch <= 'Z') && !(ch >= '0' && ch <= '9') &&
            ch != '.' && ch != '-' && ch != '_') {
            snprintf(err, errlen, "the URL's host has a '%c' (a name or an IPv4 address)",
                     ch >= 0x20 && ch < 0x7f ? ch : '?');
            return SL_EINVAL;
        }
    }
    memcpy(out->host, p, hlen);
    p += hlen;
    if (*p == ':') {
        char *end;
        long port = strtol(p + 1, &end, 10);
        if (end == p + 1 || port < 1 || port > 65535 || (*end && *end != '/')) {
            snprintf(err, errlen, "the URL's port is not a number from 1 to 65535");
            return SL_EINVAL;
        }
        out->port = (int)port;
        p = end;
    }
    if (*p == '/' && p[1]) {
        char *end;
        long db = strtol(p + 1, &end, 10);
        if (end == p + 1 || *end || db < 0 || db > 1000000) {
            snprintf(err, errlen, "the URL's database is not a number");
            return SL_EINVAL;
        }
        out->db = (int)db;
    } else if (*p && strcmp(p, "/") != 0) {
        snprintf(err, errlen, "unexpected \"%.32s\" after the host", p);
        return SL_EINVAL;
    }
    return SL_OK;
}

/* ---- connection ---- */

static void connect_now(struct sl_fleet_client *c);

static void reconnect_later(struct sl_fleet_client *c)
{
    if (c->freeing)
        return;
    struct timeval tv = {c->backoff_ms / 1000, (c->backoff_ms % 1000) * 1000};
    evtimer_add(c->reconnect, &tv);
    c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
}

static void on_reconnect(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    connect_now(arg);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct sl_fleet_client *c = ac->data;
    if (status != REDIS_OK) {
        if (c->backoff_ms == BACKOFF_MIN_MS)
            sl_log(c->connected_once ? SL_LOG_DEBUG : SL_LOG_WARN,
                   "fleet: cannot connect to redis %s:%d: %s", c->addr.host, c->addr.port,
                   ac->errstr);
        c->ac = NULL; /* hiredis frees it */
        reconnect_later(c);
        return;
    }
    c->up = true;
    c->stalled = false;
    c->backoff_ms = BACKOFF_MIN_MS;
    /* The first connection is news; a reconnection is the admission's transition, which the
     * gateway logs once for the process (not once per I/O thread). */
    sl_log(c->connected_once ? SL_LOG_DEBUG : SL_LOG_INFO, "fleet: connected to redis %s:%d",
           c->addr.host, c->addr.port);
    c->connected_once = true;
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    struct sl_fleet_client *c = ac->data;
    bool was_up = c->up;
    c->ac = NULL;
    c->up = false;
    if (c->freeing)
        return;
    if (was_up)
        sl_log(SL_LOG_DEBUG, "fleet: lost redis %s:%d%s%s", c->addr.host, c->addr.port,
               status != REDIS_OK ? ": " : "", status != REDIS_OK ? ac->errstr : "");
    reconnect_later(c);
}

static void connect_now(struct sl_fleet_client *c)
{
    redisAsyncContext *ac = redisAsyncConnect(c->addr.host, c->addr.port);
    if (!ac)
        abort(); /* no memory: the style's answer is to stop */
    if (ac->err) {
        if (c->backoff_ms == BACKOFF_MIN_MS)
            sl_log(c->connected_once ? SL_LOG_DEBUG : SL_LOG_WARN,
                   "fleet: cannot connect to redis %s:%d: %s", c->addr.host, c->addr.port,
                   ac->errstr);
        redisAsyncFree(ac);
        reconnect_later(c);
        return;
    }
    ac->data = c;
    redisLibeventAttach(ac, c->base);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    c->ac = ac;
    /* Queued before any script: Redis answers in order, so every call after them is
     * authenticated and in the right database (a wrong password shows in their errors). */
    if (c->addr.password[0])
        redisAsyncCommand(ac, NULL, NULL, "AUTH %s", c->addr.password);
    if (c->addr.db)
        redisAsyncCommand(ac, NULL, NULL, "SELECT %d", c->addr.db);
}

struct sl_fleet_client *sl_fleet_client_new(struct event_base *base,
                                            const struct sl_fleet_addr *addr, int timeout_ms)
{
    struct sl_fleet_client *c = sl_xcalloc(1, sizeof *c);
    c->base = base;
    c->addr = *addr;
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 1;
    c->backoff_ms = BACKOFF_MIN_MS;
    c->reconnect = evtimer_new(base, on_reconnect, c);
    sl_fleet_script_sha(sl_fleet_take_lua, c->sha_take);
    sl_fleet_script_sha(sl_fleet_refund_lua, c->sha_refund);
    sl_fleet_script_sha(sl_fleet_beat_lua, c->sha_beat);
    sl_fleet_script_sha(sl_fleet_usage_lua, c->sha_usage);
    connect_now(c);
    return c;
}

bool sl_fleet_client_up(const struct sl_fleet_client *c)
{
    return c->up;
}

int sl_fleet_client_pending(const struct sl_fleet_client *c)
{
    return c->pending;
}

void sl_fleet_client_free(struct sl_fleet_client *c)
{
    if (!c)
        return;
    c->freeing = true;
    if (c->ac)
        redisAsyncFree(c->ac); /* runs every pending callback with no reply */
    event_free(c->reconnect);
    free(c);
}

/* ---- calls ---- */

static void on_reply(redisAsyncContext *ac, void *reply, void *priv);

/* What a call answers its caller: st, and what its kind's callback takes besides. */
struct answer {
    enum sl_status st;
    const char *err;                /* a take's and a usage read's; NULL with SL_OK */
    const struct sl_fleet_take *t;  /* a take's, with SL_OK */
    struct sl_usage_ledger *ledger; /* a usage read's, with SL_OK, and the budget's spent */
    int64_t spent;
    bool claimed; /* a once's */
};

/* Stops call's timer and answers its caller, if one still waits: the callback is cleared before
 * it runs, so that it runs once. */
static void call_answer(struct sl_fleet_call *call, const struct answer *a)
{
    if (call->timer)
        evtimer_del(call->timer);
    sl_fleet_take_fn fn = call->fn;
    sl_fleet_usage_fn ufn = call->ufn;
    sl_fleet_once_fn ofn = call->ofn;
    call->fn = NULL;
    call->ufn = NULL;
    call->ofn = NULL;
    if (fn)
        fn(call->arg, a->st, a->t, a->err);
    else if (ufn)
        ufn(call->arg, a->st, a->ledger, a->spent, a->err);
    else if (ofn)
        ofn(call->arg, a->st, a->claimed);
}

static void call_free(struct sl_fleet_call *call)
{
    if (call->timer)
        event_free(call->timer);
    if (call->ledger)
        sl_usage_ledger_free(call->ledger);
    call->c->pending--;
    free(call);
}

/* Sends call: a once as SET, the others as EVALSHA (or EVAL once NOSCRIPT was answered). */
static int call_send(struct sl_fleet_call *call)
{
    struct sl_fleet_client *c = call->c;
    if (call->kind == CALL_ONCE) {
        const char *set[] = {"SET", call->keys[0], "1", "NX", "PX", call->px};
        return redisAsyncCommandArgv(c->ac, on_reply, call, call->px[0] ? 6 : 4, set, NULL);
    }
    static const char *const scripts[] = {sl_fleet_take_lua, sl_fleet_refund_lua, sl_fleet_beat_lua,
                                          sl_fleet_usage_lua};
    const char *shas[] = {c->sha_take, c->sha_refund, c->sha_beat, c->sha_usage};
    char num[4 * SL_FLEET_BUCKETS_MAX][24], nkeys[8];
    const char *argv[3 + 5 * SL_FLEET_BUCKETS_MAX + 8];
    int argc = 0;
    argv[argc++] = call->retried ? "EVAL" : "EVALSHA";
    argv[argc++] = call->retried ? scripts[call->kind] : shas[call->kind];
    if (call->kind == CALL_BEAT) {
        argv[argc++] = "1";
        argv[argc++] = call->keys[0];
        argv[argc++] = call->keys[1];
        argv[argc++] = call->beat_ttl;
        return redisAsyncCommandArgv(c->ac, on_reply, call, argc, argv, NULL);
    }
    if (call->kind == CALL_USAGE) {
        bool budget = call->keys[1][0] && call->pages == 0; /* its spend, with the first page */
        argv[argc++] = budget ? "2" : "1";
        argv[argc++] = call->keys[0];
        if (budget)
            argv[argc++] = call->keys[1];
        argv[argc++] = call->field;
        int k = sl_fleet_usage_read_args(call->from, call->to, SL_FLEET_USAGE_PAGE, num);
        for (int i = 0; i < k; i++)
            argv[argc++] = num[i];
        return redisAsyncCommandArgv(c->ac, on_reply, call, argc, argv, NULL);
    }
    int nargs = call->kind == CALL_REFUND ? sl_fleet_refund_args(call->b, call->n, num)
                                          : sl_fleet_take_args(call->b, call->n, num);
    snprintf(nkeys, sizeof nkeys, "%d", call->n + (call->usage ? 2 : 0));
    argv[argc++] = nkeys;
    for (int i = 0; i < call->n + (call->usage ? 2 : 0); i++)
        argv[argc++] = call->keys[i];
    for (int i = 0; i < nargs; i++)
        argv[argc++] = num[i];
    if (call->usage) {
        argv[argc++] = call->field;
        for (int i = 0; i < 7; i++)
            argv[argc++] = call->unum[i];
    }
    return redisAsyncCommandArgv(c->ac, on_reply, call, argc, argv, NULL);
}

/* A page of a usage read: the next is asked for while pages come full; the caller hears of the
 * end, or of the first failure. */
static void usage_reply(struct sl_fleet_call *call, const redisReply *r)
{
    struct sl_fleet_client *c = call->c;
    if (!call->ufn) { /* timed out or cancelled */
        call_free(call);
        return;
    }
    char err[256] = "";
    enum sl_status st = SL_EIO;
    int64_t spent = -1, last = 0;
    if (!r) {
        st = c->freeing ? SL_ECANCELED : SL_EIO;
        snprintf(err, sizeof err, c->freeing ? "the client is closing" : "connection lost");
    } else {
        int n = sl_fleet_usage_parse(r, call->ledger, &spent, &last, &call->bad, err, sizeof err);
        if (call->pages++ == 0)
            call->spent = spent;
        if (n == SL_FLEET_USAGE_PAGE && last < INT64_MAX - 1 &&
            (call->to == INT64_MAX || last + 1 < call->to)) {
            call->from = last + 1;
            call->retried = false;
            if (c->ac && !c->freeing && call_send(call) == REDIS_OK)
                return;
            snprintf(err, sizeof err, "redis did not take the command");
        } else if (n >= 0) {
            st = SL_OK;
        }
    }
    call_answer(call, &(struct answer){.st = st,
                                       .err = st == SL_OK ? NULL : err,
                                       .ledger = st == SL_OK ? call->ledger : NULL,
                                       .spent = st == SL_OK ? call->spent : -1});
    call_free(call);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    (void)ac;
    struct sl_fleet_call *call = priv;
    struct sl_fleet_client *c = call->c;
    const redisReply *r = reply;
    if (r)
        c->stalled = false; /* Redis answers again */
    if (r && r->type == REDIS_REPLY_ERROR && !call->retried && r->str &&
        strncmp(r->str, "NOSCRIPT", 8) == 0 && c->ac && !c->freeing) {
        call->retried = true;
        if (call_send(call) == REDIS_OK)
            return; /* the same call, once more, as EVAL */
    }
    if (call->kind == CALL_BEAT) {
        int n = sl_fleet_beat_parse(r);
        if (n > 0)
            c->replicas = n;
        call_free(call);
        return;
    }
    if (call->kind == CALL_REFUND) {
        call_free(call);
        return;
    }
    if (call->kind == CALL_USAGE) {
        usage_reply(call, r);
        return;
    }
    if (call->kind == CALL_ONCE) {
        struct answer a = {.st = c->freeing ? SL_ECANCELED : SL_EIO};
        if (r) {
            a.st = r->type == REDIS_REPLY_STATUS || r->type == REDIS_REPLY_NIL ? SL_OK : SL_EIO;
            a.claimed = r->type == REDIS_REPLY_STATUS && r->str && strcmp(r->str, "OK") == 0;
        }
        call_answer(call, &a);
        call_free(call);
        return;
    }
    struct sl_fleet_take t;
    char err[256];
    enum sl_status st;
    if (!r) {
        st = c->freeing ? SL_ECANCELED : SL_EIO;
        snprintf(err, sizeof err, c->freeing ? "the client is closing" : "connection lost");
    } else {
        st = sl_fleet_take_parse(r, call->n, &t, err, sizeof err);
    }
    if (call->fn)
        call_answer(call, &(struct answer){.st = st,
                                           .err = st == SL_OK ? NULL : err,
                                           .t = st == SL_OK ? &t : NULL});
    else if (st == SL_OK && t.admitted && !c->freeing)
        sl_fleet_refund(c, call->b, call->n); /* its caller went on without it */
    call_free(call);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct sl_fleet_call *call = arg;
    if (call->kind == CALL_ONCE) {
        call_answer(call, &(struct answer){.st = SL_ETIMEDOUT});
        return;
    }
    if (call->kind == CALL_USAGE) { /* a long read is no sign that Redis stalled */
        call_answer(call, &(struct answer){.st = SL_ETIMEDOUT,
                                           .err = "the fleet's ledger was not read in time",
                                           .spent = -1});
        return;
    }
    call->c->stalled = true;
    call_answer(call, &(struct answer){.st = SL_ETIMEDOUT, .err = "no answer within timeout_ms"});
}

/* Gives the caller of call an answer within ms at the latest (on_timeout). */
static void call_arm(struct sl_fleet_call *call, int ms)
{
    call->timer = evtimer_new(call->c->base, on_timeout, call);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(call->timer, &tv);
}

static struct sl_fleet_call *call_new(struct sl_fleet_client *c, const struct sl_fleet_bucket *b,
                                      int n, bool refund)
{
    if (n < (refund ? 0 : 1) || n > SL_FLEET_BUCKETS_MAX)
        return NULL;
    struct sl_fleet_call *call = sl_xcalloc(1, sizeof *call);
    call->c = c;
    call->kind = refund ? CALL_REFUND : CALL_TAKE;
    call->n = n;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(b[i].key);
        if (len >= KEY_MAX) {
            free(call);
            return NULL;
        }
        memcpy(call->keys[i], b[i].key, len + 1);
        call->b[i] = b[i];
        call->b[i].key = call->keys[i];
    }
    c->pending++;
    return call;
}

struct sl_fleet_call *sl_fleet_take(struct sl_fleet_client *c, const struct sl_fleet_bucket *b,
                                    int n, sl_fleet_take_fn fn, void *arg)
{
    if (!c->up || !c->ac) {
        fn(arg, SL_EIO, NULL, "not connected to redis");
        return NULL;
    }
    if (c->stalled) {
        /* Waiting timeout_ms for each request while Redis does not answer would add it to
         * every request: until anything is answered, takes fail at once. */
        fn(arg, SL_ETIMEDOUT, NULL, "redis has not answered since a call timed out");
        return NULL;
    }
    struct sl_fleet_call *call = call_new(c, b, n, false);
    if (!call) {
        fn(arg, SL_EINVAL, NULL, "too many buckets, or a key too long");
        return NULL;
    }
    call->fn = fn;
    call->arg = arg;
    if (call_send(call) != REDIS_OK) {
        call_answer(call, &(struct answer){.st = SL_EIO, .err = "redis did not take the command"});
        call_free(call);
        return NULL;
    }
    call_arm(call, c->timeout_ms);
    return call;
}

void sl_fleet_call_cancel(struct sl_fleet_call *call)
{
    if (!call)
        return;
    if (call->timer)
        evtimer_del(call->timer);
    call->fn = NULL;
    call->ufn = NULL;
    call->ofn = NULL;
}

void sl_fleet_refund(struct sl_fleet_client *c, const struct sl_fleet_bucket *b, int n)
{
    sl_fleet_settle(c, b, n, NULL, NULL);
}

bool sl_fleet_settle(struct sl_fleet_client *c, const struct sl_fleet_bucket *b, int n,
                     const char *prefix, const struct sl_usage_key_usage *u)
{
    if (!c->up || !c->ac || (n == 0 && !u))
        return false;
    struct sl_fleet_call *call = call_new(c, b, n, true);
    if (!call)
        return false;
    if (u) {
        call->usage = true;
        sl_fleet_usage_key(call->keys[n], KEY_MAX, prefix, u->key.hour);
        sl_fleet_usage_index(call->keys[n + 1], KEY_MAX, prefix);
        sl_fleet_usage_field(call->field, KEY_MAX, &u->key);
        sl_fleet_usage_args(&u->usage, u->key.hour, call->unum);
    }
    if (call_send(call) != REDIS_OK) {
        call_free(call);
        return false;
    }
    return true;
}

void sl_fleet_beat(struct sl_fleet_client *c, const char *key, const char *id, int ttl_ms)
{
    if (!c->up || !c->ac || strlen(key) >= KEY_MAX || strlen(id) >= KEY_MAX)
        return;
    struct sl_fleet_call *call = sl_xcalloc(1, sizeof *call);
    call->c = c;
    call->kind = CALL_BEAT;
    snprintf(call->keys[0], KEY_MAX, "%s", key);
    snprintf(call->keys[1], KEY_MAX, "%s", id);
    snprintf(call->beat_ttl, sizeof call->beat_ttl, "%d", ttl_ms > 0 ? ttl_ms : 1);
    c->pending++;
    if (call_send(call) != REDIS_OK)
        call_free(call);
}

int sl_fleet_client_replicas(const struct sl_fleet_client *c)
{
    return c->replicas;
}

struct sl_fleet_call *sl_fleet_usage_read(struct sl_fleet_client *c, const char *prefix,
                                          const char *budget_key, int64_t from, int64_t to,
                                          sl_fleet_usage_fn fn, void *arg)
{
    if (!c->up || !c->ac) {
        fn(arg, SL_EIO, NULL, -1, "not connected to redis");
        return NULL;
    }
    if (strlen(prefix) + 16 >= KEY_MAX || (budget_key && strlen(budget_key) >= KEY_MAX)) {
        fn(arg, SL_EINVAL, NULL, -1, "a key too long");
        return NULL;
    }
    struct sl_fleet_call *call = sl_xcalloc(1, sizeof *call);
    call->c = c;
    call->kind = CALL_USAGE;
    sl_fleet_usage_index(call->keys[0], KEY_MAX, prefix);
    snprintf(call->keys[1], KEY_MAX, "%s", budget_key ? budget_key : "");
    snprintf(call->field, KEY_MAX, "%s", prefix);
    call->from = from;
    call->to = to;
    call->spent = -1;
    call->ledger = sl_usage_ledger_new();
    call->ufn = fn;
    call->arg = arg;
    c->pending++;
    if (call_send(call) != REDIS_OK) {
        call->ufn = NULL;
        call_free(call);
        fn(arg, SL_EIO, NULL, -1, "redis did not take the command");
        return NULL;
    }
    call_arm(call,
             c->timeout_ms > SL_FLEET_USAGE_TIMEOUT_MS ? c->timeout_ms : SL_FLEET_USAGE_TIMEOUT_MS);
    return call;
}

void sl_fleet_once(struct sl_fleet_client *c, const char *key, int64_t ttl_ms, sl_fleet_once_fn fn,
                   void *arg)
{
    if (!c->up || !c->ac || strlen(key) >= KEY_MAX) {
        fn(arg, !c->up || !c->ac ? SL_EIO : SL_EINVAL, false);
        return;
    }
    struct sl_fleet_call *call = sl_xcalloc(1, sizeof *call);
    call->c = c;
    call->kind = CALL_ONCE;
    snprintf(call->keys[0], KEY_MAX, "%s", key);
    if (ttl_ms > 0)
        snprintf(call->px, sizeof call->px, "%lld", (long long)ttl_ms);
    call->ofn = fn;
    call->arg = arg;
    c->pending++;
    if (call_send(call) != REDIS_OK) {
        call->ofn = NULL;
        call_free(call);
        fn(arg, SL_EIO, false);
        return;
    }
    call_arm(call, c->timeout_ms);
}
