/* The fleet's Redis client (fleet/client.c) on a real event loop against a real redis-server
 * (tests/support/redis_server.c): answers, a server that lost its scripts, a server that stops
 * answering (SIGSTOP) and one that goes away and comes back, cancelled calls, and the URL. Waits
 * are on the loop for a condition, with a guard timer that fails the test instead of hanging. */
#include "redis_server.h"

#include <criterion/criterion.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <sluice/fleet.h>
#include <string.h>

#define HOUR_NS (3600LL * 1000000000LL)

static struct redis_server server;
static struct event_base *base;

static void start(void)
{
    server = (struct redis_server){0};
    if (!redis_server_start(&server))
        cr_skip_test("redis-server is not installed (scripts/setup.sh installs it)");
    base = event_base_new();
}

static void stop(void)
{
    redis_server_stop(&server);
    if (base)
        event_base_free(base);
    base = NULL;
}

TestSuite(fleet_client, .init = start, .fini = stop);

static void on_guard(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    *(bool *)arg = true;
}

/* Runs the loop until cond(ctx) holds; fails after 10 s without it. */
static void run_until(bool (*cond)(void *), void *ctx, const char *what)
{
    bool expired = false;
    struct event *guard = evtimer_new(base, on_guard, &expired);
    struct timeval ten = {10, 0};
    evtimer_add(guard, &ten);
    while (!cond(ctx) && !expired)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(guard);
    cr_assert(cond(ctx), "waited 10 s for %s", what);
}

static bool is_up(void *c)
{
    return sl_fleet_client_up(c);
}
static bool is_down(void *c)
{
    return !sl_fleet_client_up(c);
}
static bool is_idle(void *c)
{
    return sl_fleet_client_pending(c) == 0;
}

static struct sl_fleet_client *client(int timeout_ms)
{
    struct sl_fleet_addr a;
    char err[256], url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", server.port);
    cr_assert_eq(sl_fleet_addr_parse(url, &a, err, sizeof err), SL_OK, "%s", err);
    struct sl_fleet_client *c = sl_fleet_client_new(base, &a, timeout_ms);
    run_until(is_up, c, "the client to connect");
    return c;
}

struct answer {
    bool done;
    enum sl_status st;
    struct sl_fleet_take t;
    char err[256];
};

static void on_answer(void *arg, enum sl_status st, const struct sl_fleet_take *t, const char *err)
{
    struct answer *a = arg;
    cr_assert_not(a->done, "a callback ran twice");
    a->done = true;
    a->st = st;
    if (t)
        a->t = *t;
    snprintf(a->err, sizeof a->err, "%s", err ? err : "");
}

static bool answered(void *a)
{
    return ((struct answer *)a)->done;
}

static struct answer take(struct sl_fleet_client *c, const struct sl_fleet_bucket *b)
{
    struct answer a = {0};
    sl_fleet_take(c, b, 1, on_answer, &a);
    run_until(answered, &a, "an answer");
    return a;
}

static struct sl_fleet_bucket slow(const char *key, int64_t burst, int64_t cost)
{
    return (struct sl_fleet_bucket){key, {.limit = 1, .period_ns = HOUR_NS, .burst = burst}, cost};
}

/* What a bucket holds now, read on a connection of its own (a take of nothing). */
static int64_t remaining(const char *key, int64_t burst)
{
    redisContext *r = redisConnect("127.0.0.1", server.port);
    cr_assert(r && !r->err);
    struct sl_fleet_bucket b = slow(key, burst, 0);
    char num[4][24];
    sl_fleet_take_args(&b, 1, num);
    redisReply *rep = redisCommand(r, "EVAL %s 1 %s %s %s %s %s", sl_fleet_take_lua, key, num[0],
                                   num[1], num[2], num[3]);
    struct sl_fleet_take t;
    char err[256];
    cr_assert_eq(sl_fleet_take_parse(rep, 1, &t, err, sizeof err), SL_OK, "%s", err);
    freeReplyObject(rep);
    redisFree(r);
    return t.view[0].remaining;
}

static void command(const char *cmd)
{
    redisContext *r = redisConnect("127.0.0.1", server.port);
    cr_assert(r && !r->err);
    freeReplyObject(redisCommand(r, cmd));
    redisFree(r);
}

Test(fleet_client, takes_are_answered_on_the_loop_in_order)
{
    struct sl_fleet_client *c = client(2000);
    struct sl_fleet_bucket b = slow("c:order", 2, 1);
    struct answer a = take(c, &b);
    cr_assert_eq(a.st, SL_OK, "%s", a.err);
    cr_assert(a.t.admitted);
    cr_assert_eq(a.t.view[0].remaining, 1);
    a = take(c, &b);
    cr_assert(a.t.admitted);
    a = take(c, &b);
    cr_assert_eq(a.st, SL_OK);
    cr_assert_not(a.t.admitted);
    cr_assert_gt(a.t.view[0].retry_ns, 0);
    sl_fleet_client_free(c);
}

Test(fleet_client, a_server_that_lost_its_scripts_gets_them_again)
{
    struct sl_fleet_client *c = client(2000);
    struct sl_fleet_bucket b = slow("c:flush", 3, 1);
    cr_assert(take(c, &b).t.admitted);
    command("SCRIPT FLUSH"); /* as after a restart */
    struct answer a = take(c, &b);
    cr_assert_eq(a.st, SL_OK, "%s", a.err);
    cr_assert(a.t.admitted);
    cr_assert_eq(a.t.view[0].remaining, 1, "charged once, not twice");
    sl_fleet_client_free(c);
}

Test(fleet_client, a_take_past_its_timeout_times_out_and_its_late_charge_is_given_back)
{
    struct sl_fleet_client *c = client(50);
    struct sl_fleet_bucket b = slow("c:late", 5, 2);
    kill(server.pid, SIGSTOP);
    struct answer a = take(c, &b);
    cr_assert_eq(a.st, SL_ETIMEDOUT);
    cr_assert_eq(sl_fleet_client_pending(c), 1, "the call waits for its answer");
    /* Until Redis answers anything, the next takes fail at once instead of waiting too. */
    struct answer now = {0};
    cr_assert_null(sl_fleet_take(c, &b, 1, on_answer, &now));
    cr_assert(now.done);
    cr_assert_eq(now.st, SL_ETIMEDOUT);
    cr_assert_eq(sl_fleet_client_pending(c), 1, "nothing more was sent");
    kill(server.pid, SIGCONT);
    run_until(is_idle, c, "the late answer and its refund");
    cr_assert_eq(remaining("c:late", 5), 5, "the late take was refunded");
    a = take(c, &b);
    cr_assert_eq(a.st, SL_OK, "answered again: takes go to Redis again (%s)", a.err);
    cr_assert(a.t.admitted);
    sl_fleet_client_free(c);
}

Test(fleet_client, a_cancelled_take_never_calls_back_and_gives_its_charge_back)
{
    struct sl_fleet_client *c = client(2000);
    struct sl_fleet_bucket b = slow("c:cancel", 4, 3);
    struct answer a = {0};
    struct sl_fleet_call *call = sl_fleet_take(c, &b, 1, on_answer, &a);
    cr_assert_not_null(call);
    sl_fleet_call_cancel(call);
    run_until(is_idle, c, "the answer and its refund");
    cr_assert_not(a.done);
    cr_assert_eq(remaining("c:cancel", 4), 4);
    sl_fleet_client_free(c);
}

Test(fleet_client, a_lost_server_fails_takes_at_once_and_is_found_again)
{
    struct sl_fleet_client *c = client(2000);
    struct sl_fleet_bucket b = slow("c:lost", 3, 1);
    cr_assert(take(c, &b).t.admitted);
    redis_server_stop(&server);
    run_until(is_down, c, "the client to see the loss");
    struct answer a = {0};
    cr_assert_null(sl_fleet_take(c, &b, 1, on_answer, &a));
    cr_assert(a.done, "called back before returning");
    cr_assert_eq(a.st, SL_EIO);
    cr_assert(redis_server_start(&server)); /* the same port; an empty server */
    run_until(is_up, c, "the client to reconnect");
    a = take(c, &b);
    cr_assert_eq(a.st, SL_OK, "%s", a.err);
    cr_assert(a.t.admitted);
    sl_fleet_client_free(c);
}

Test(fleet_client, freeing_the_client_cancels_what_is_pending)
{
    struct sl_fleet_client *c = client(2000);
    struct sl_fleet_bucket b = slow("c:free", 3, 1);
    kill(server.pid, SIGSTOP);
    struct answer a = {0};
    cr_assert_not_null(sl_fleet_take(c, &b, 1, on_answer, &a));
    sl_fleet_client_free(c);
    cr_assert(a.done);
    cr_assert_eq(a.st, SL_ECANCELED);
}

struct two {
    struct sl_fleet_client *a, *b;
};

static bool both_idle(void *arg)
{
    struct two *t = arg;
    return sl_fleet_client_pending(t->a) == 0 && sl_fleet_client_pending(t->b) == 0;
}

static bool a_alone(void *arg)
{
    return sl_fleet_client_replicas(((struct two *)arg)->a) == 1;
}

static void beat_a(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    sl_fleet_beat(((struct two *)arg)->a, "fleet:replicas", "replica-a", 300);
}

Test(fleet_client, beats_count_the_replicas_alive_and_forget_a_silent_one)
{
    struct two t = {client(2000), client(2000)};
    cr_assert_eq(sl_fleet_client_replicas(t.a), 0, "unknown before any beat");
    sl_fleet_beat(t.a, "fleet:replicas", "replica-a", 5000);
    sl_fleet_beat(t.b, "fleet:replicas", "replica-b", 5000);
    run_until(both_idle, &t, "two beats");
    /* Each has seen the other once both have beaten again (a generous ttl: a stalled machine
     * must not make one forget the other here). */
    sl_fleet_beat(t.a, "fleet:replicas", "replica-a", 5000);
    sl_fleet_beat(t.b, "fleet:replicas", "replica-b", 5000);
    run_until(both_idle, &t, "two more beats");
    cr_assert_eq(sl_fleet_client_replicas(t.a), 2);
    cr_assert_eq(sl_fleet_client_replicas(t.b), 2);
    /* b falls silent; a keeps beating, saying a replica silent for 300 ms is gone, until the set
     * forgets b. */
    struct event *tick = event_new(base, -1, EV_PERSIST, beat_a, &t);
    struct timeval every = {0, 50 * 1000};
    evtimer_add(tick, &every);
    run_until(a_alone, &t, "the silent replica to be forgotten");
    event_free(tick);
    sl_fleet_client_free(t.a);
    sl_fleet_client_free(t.b);
}

Test(fleet_client, urls_are_read_or_refused_with_a_reason)
{
    struct sl_fleet_addr a;
    char err[256];
    cr_assert_eq(sl_fleet_addr_parse("redis://127.0.0.1", &a, err, sizeof err), SL_OK);
    cr_assert_str_eq(a.host, "127.0.0.1");
    cr_assert_eq(a.port, 6379);
    cr_assert_eq(a.db, 0);
    cr_assert_str_eq(a.password, "");
    cr_assert_eq(sl_fleet_addr_parse("redis://:s3cret@redis.internal:6380/2", &a, err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert_str_eq(a.host, "redis.internal");
    cr_assert_eq(a.port, 6380);
    cr_assert_eq(a.db, 2);
    cr_assert_str_eq(a.password, "s3cret");
    cr_assert_eq(sl_fleet_addr_parse("redis://user:pw@h/", &a, err, sizeof err), SL_OK);
    cr_assert_str_eq(a.password, "pw");
    const char *bad[][2] = {
        {"rediss://h", "TLS"},        {"http://h", "expected redis://"},
        {"redis://", "no host"},      {"redis://h:0", "port"},
        {"redis://h:99999", "port"},  {"redis://h:12x", "port"},
        {"redis://h/db", "database"}, {"redis://h?x", "host has"},
        {"redis://h/1x", "database"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err[0] = '\0';
        cr_assert_eq(sl_fleet_addr_parse(bad[i][0], &a, err, sizeof err), SL_EINVAL, "%s",
                     bad[i][0]);
        cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
    }
}

struct usage_answer {
    bool done;
    enum sl_status st;
    int64_t spent;
    struct sl_usage total, acme;
    char err[256];
};

static void on_usage(void *arg, enum sl_status st, struct sl_usage_ledger *l, int64_t spent,
                     const char *err)
{
    struct usage_answer *a = arg;
    cr_assert_not(a->done, "a callback ran twice");
    a->done = true;
    a->st = st;
    a->spent = spent;
    cr_assert_eq(l != NULL, st == SL_OK, "a ledger exactly when the read succeeded");
    if (l) {
        sl_usage_ledger_sum(l, NULL, INT64_MIN, INT64_MAX, &a->total);
        sl_usage_ledger_sum(l, "acme", INT64_MIN, INT64_MAX, &a->acme);
    }
    snprintf(a->err, sizeof a->err, "%s", err ? err : "");
}

static bool usage_answered(void *a)
{
    return ((struct usage_answer *)a)->done;
}

Test(fleet_client, settled_usage_is_read_back_across_pages_with_the_budget_spend)
{
    struct sl_fleet_client *c = client(2000);
    const int64_t h0 = 1795759200;
    int hours = SL_FLEET_USAGE_PAGE + 6;
    for (int i = 0; i < hours; i++) {
        struct sl_usage_key_usage ku = {.usage = {.requests = 1, .prompt_tokens = 2, .cost = 10}};
        sl_usage_key_set(&ku.key, i % 3 ? "acme" : "zeta", "m", "batch", h0 + 3600 * i);
        cr_assert(sl_fleet_settle(c, NULL, 0, "r:", &ku));
    }
    run_until(is_idle, c, "the settles");
    command("SET r:budget:acme 4242");
    struct usage_answer a = {0};
    cr_assert_not_null(
        sl_fleet_usage_read(c, "r:", "r:budget:acme", INT64_MIN, INT64_MAX, on_usage, &a));
    run_until(usage_answered, &a, "the usage");
    cr_assert_eq(a.st, SL_OK, "%s", a.err);
    cr_assert_eq(a.spent, 4242);
    cr_assert_eq(a.total.requests, hours);
    cr_assert_eq(a.total.cost, 10 * hours);
    cr_assert_eq(a.acme.requests, hours - (hours + 2) / 3);

    /* From the third hour on, the last excluded; no budget asked. */
    a = (struct usage_answer){0};
    sl_fleet_usage_read(c, "r:", NULL, h0 + 2 * 3600, h0 + (hours - 1) * 3600, on_usage, &a);
    run_until(usage_answered, &a, "the usage");
    cr_assert_eq(a.st, SL_OK, "%s", a.err);
    cr_assert_eq(a.spent, -1);
    cr_assert_eq(a.total.requests, hours - 3);
    sl_fleet_client_free(c);
}

Test(fleet_client, a_cancelled_usage_read_never_calls_back_and_a_lost_server_fails_it_at_once)
{
    struct sl_fleet_client *c = client(2000);
    struct usage_answer a = {0};
    struct sl_fleet_call *call =
        sl_fleet_usage_read(c, "r:", NULL, INT64_MIN, INT64_MAX, on_usage, &a);
    cr_assert_not_null(call);
    sl_fleet_call_cancel(call);
    run_until(is_idle, c, "the answer");
    cr_assert_not(a.done);
    redis_server_stop(&server);
    run_until(is_down, c, "the client to see the loss");
    cr_assert_null(sl_fleet_usage_read(c, "r:", NULL, INT64_MIN, INT64_MAX, on_usage, &a));
    cr_assert(a.done, "called back before returning");
    cr_assert_eq(a.st, SL_EIO);
    sl_fleet_client_free(c);
}

Test(fleet_client, freeing_the_client_cancels_a_usage_read_in_flight)
{
    struct sl_fleet_client *c = client(2000);
    kill(server.pid, SIGSTOP);
    struct usage_answer a = {0};
    cr_assert_not_null(sl_fleet_usage_read(c, "r:", NULL, INT64_MIN, INT64_MAX, on_usage, &a));
    sl_fleet_client_free(c);
    cr_assert(a.done);
    cr_assert_eq(a.st, SL_ECANCELED);
}

struct once_answer {
    int calls;
    enum sl_status st;
    bool claimed;
};

static void on_once(void *arg, enum sl_status st, bool claimed)
{
    struct once_answer *a = arg;
    a->calls++;
    a->st = st;
    a->claimed = claimed;
}

static bool once_answered(void *a)
{
    return ((struct once_answer *)a)->calls > 0;
}

Test(fleet_client, once_is_claimed_by_one_call_of_the_fleet_until_it_expires)
{
    struct sl_fleet_client *c = client(2000), *d = client(2000);
    struct once_answer first = {0}, second = {0}, third = {0};
    sl_fleet_once(c, "o:warned", 0, on_once, &first);
    run_until(once_answered, &first, "the first claim");
    sl_fleet_once(d, "o:warned", 0, on_once, &second);
    run_until(once_answered, &second, "the second claim");
    cr_assert_eq(first.st, SL_OK);
    cr_assert(first.claimed);
    cr_assert_eq(second.st, SL_OK);
    cr_assert_not(second.claimed, "another client of the fleet had claimed it");
    cr_assert_eq(first.calls + second.calls, 2);
    /* A time to live: the key goes with it, and the next claim wins. */
    sl_fleet_once(c, "o:ttl", 60000, on_once, &third);
    run_until(once_answered, &third, "a claim with a time to live");
    cr_assert(third.claimed);
    redisContext *r = redisConnect("127.0.0.1", server.port);
    redisReply *rep = redisCommand(r, "PTTL o:ttl");
    cr_assert(rep->integer > 0 && rep->integer <= 60000, "pttl %lld", rep->integer);
    freeReplyObject(rep);
    redisFree(r);
    sl_fleet_client_free(d);
    /* Without a server, no one can say: the caller hears it at once. */
    redis_server_stop(&server);
    run_until(is_down, c, "the client to see the loss");
    struct once_answer lost = {0};
    sl_fleet_once(c, "o:warned", 0, on_once, &lost);
    cr_assert_eq(lost.calls, 1, "called back before returning");
    cr_assert_eq(lost.st, SL_EIO);
    cr_assert_not(lost.claimed);
    sl_fleet_client_free(c);
}
