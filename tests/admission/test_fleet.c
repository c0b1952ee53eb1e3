/* The fleet's bucket scripts (admission/fleet.c) against a real redis-server, started by the test
 * on a free loopback port: exact takes and refusals, all-or-none across buckets, refunds, a
 * reload's new rate, expiry, and many connections at once never admitting more than the rate
 * allows over the time they took (on Redis's own clock). Skips, saying so, without redis-server. */
#include "admission_impl.h"
#include "redis_server.h"

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HOUR_NS (3600LL * 1000000000LL)

static struct redis_server server;

static redisContext *connect_server(void)
{
    redisContext *c = redisConnect("127.0.0.1", server.port);
    cr_assert(c && !c->err, "connect: %s", c ? c->errstr : "no memory");
    return c;
}

static void start_server(void)
{
    server = (struct redis_server){0};
    if (!redis_server_start(&server))
        cr_skip_test("redis-server is not installed (scripts/setup.sh installs it)");
}

static void stop_server(void)
{
    redis_server_stop(&server);
}

TestSuite(fleet, .init = start_server, .fini = stop_server);

/* One script call with buckets b; refund when `back`. */
static redisReply *call(redisContext *c, bool back, const struct sl_fleet_bucket *b, int n)
{
    const char *script = back ? sl_fleet_refund_lua : sl_fleet_take_lua;
    char num[4 * SL_FLEET_BUCKETS_MAX][24], nkeys[8];
    int nargs = back ? sl_fleet_refund_args(b, n, num) : sl_fleet_take_args(b, n, num);
    const char *argv[3 + 5 * SL_FLEET_BUCKETS_MAX];
    int argc = 0;
    argv[argc++] = "EVAL";
    argv[argc++] = script;
    snprintf(nkeys, sizeof nkeys, "%d", n);
    argv[argc++] = nkeys;
    for (int i = 0; i < n; i++)
        argv[argc++] = b[i].key;
    for (int i = 0; i < nargs; i++)
        argv[argc++] = num[i];
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    cr_assert_not_null(r, "%s", c->errstr);
    return r;
}

static struct sl_fleet_take take(redisContext *c, const struct sl_fleet_bucket *b, int n)
{
    redisReply *r = call(c, false, b, n);
    struct sl_fleet_take t;
    char err[256];
    cr_assert_eq(sl_fleet_take_parse(r, n, &t, err, sizeof err), SL_OK, "%s", err);
    freeReplyObject(r);
    return t;
}

static void refund(redisContext *c, const struct sl_fleet_bucket *b, int n)
{
    redisReply *r = call(c, true, b, n);
    cr_assert_eq(r->type, REDIS_REPLY_INTEGER, "%s", r->type == REDIS_REPLY_ERROR ? r->str : "");
    freeReplyObject(r);
}

/* A bucket that refills one token an hour: nothing comes back while a test runs. */
static struct sl_fleet_bucket slow(const char *key, int64_t burst, int64_t cost)
{
    return (struct sl_fleet_bucket){key, {.limit = 1, .period_ns = HOUR_NS, .burst = burst}, cost};
}

Test(fleet, takes_exactly_the_burst_then_refuses_with_the_time_to_retry)
{
    redisContext *c = connect_server();
    struct sl_fleet_bucket b = slow("t:exact", 5, 1);
    for (int i = 0; i < 5; i++) {
        struct sl_fleet_take t = take(c, &b, 1);
        cr_assert(t.admitted, "take %d", i);
        cr_assert_eq(t.view[0].remaining, 4 - i);
        cr_assert_gt(t.view[0].reset_ns, (int64_t)i * HOUR_NS);
        cr_assert_leq(t.view[0].reset_ns, (int64_t)(i + 1) * HOUR_NS);
    }
    struct sl_fleet_take t = take(c, &b, 1);
    cr_assert_not(t.admitted);
    cr_assert_eq(t.failed, 0);
    cr_assert_eq(t.view[0].remaining, 0);
    cr_assert_gt(t.view[0].retry_ns, 0);
    cr_assert_leq(t.view[0].retry_ns, HOUR_NS, "one token's interval at most");
    /* More than the burst never fits: retry -1. */
    b = slow("t:exact-big", 5, 6);
    t = take(c, &b, 1);
    cr_assert_not(t.admitted);
    cr_assert_eq(t.view[0].retry_ns, -1);
    cr_assert_eq(t.view[0].remaining, 5, "a fresh bucket is full");
    redisFree(c);
}

Test(fleet, charges_every_bucket_or_none_when_one_has_no_room)
{
    redisContext *c = connect_server();
    struct sl_fleet_bucket b[3] = {slow("t:a:rpm", 10, 1), slow("t:a:tpm", 100, 60),
                                   slow("tier:x", 1000, 60)};
    struct sl_fleet_take t = take(c, b, 3);
    cr_assert(t.admitted);
    cr_assert_eq(t.view[0].remaining, 9);
    cr_assert_eq(t.view[1].remaining, 40);
    cr_assert_eq(t.view[2].remaining, 940);
    /* The tenant's tokens have 40 left: a 60-token request is refused there, and neither the
     * request bucket before it nor the tier's after it is charged. */
    t = take(c, b, 3);
    cr_assert_not(t.admitted);
    cr_assert_eq(t.failed, 1);
    cr_assert_eq(t.view[1].remaining, 40);
    b[1].cost = b[2].cost = 40;
    t = take(c, b, 3);
    cr_assert(t.admitted);
    cr_assert_eq(t.view[0].remaining, 8, "the refused call took no request");
    cr_assert_eq(t.view[1].remaining, 0);
    cr_assert_eq(t.view[2].remaining, 900, "nor tier tokens");
    redisFree(c);
}

Test(fleet, refund_gives_back_exactly_what_was_not_used)
{
    redisContext *c = connect_server();
    struct sl_fleet_bucket b = slow("t:refund", 1000, 300);
    cr_assert(take(c, &b, 1).admitted);
    b.cost = 120; /* 300 reserved, 180 used */
    refund(c, &b, 1);
    b.cost = 0;
    struct sl_fleet_take t = take(c, &b, 1);
    cr_assert_eq(t.view[0].remaining, 820);
    /* Giving back more than is owed fills the bucket and no more; the key goes. */
    b.cost = 5000;
    refund(c, &b, 1);
    redisReply *r = redisCommand(c, "EXISTS t:refund");
    cr_assert_eq(r->integer, 0);
    freeReplyObject(r);
    b.cost = 0;
    cr_assert_eq(take(c, &b, 1).view[0].remaining, 1000);
    redisFree(c);
}

Test(fleet, a_new_rate_keeps_what_is_owed_in_tokens)
{
    redisContext *c = connect_server();
    struct sl_fleet_bucket b = {
        "t:reload", {.limit = 60, .period_ns = 60 * HOUR_NS, .burst = 60}, 30};
    cr_assert(take(c, &b, 1).admitted);
    /* A reload doubles the rate: the 30 tokens owed stay owed, the burst is the new one. */
    b.rate = (struct sl_gcra_rate){.limit = 120, .period_ns = 60 * HOUR_NS, .burst = 120};
    b.cost = 10;
    struct sl_fleet_take t = take(c, &b, 1);
    cr_assert(t.admitted);
    cr_assert_eq(t.view[0].remaining, 80);
    redisFree(c);
}

Test(fleet, a_bucket_expires_when_it_would_be_full_again)
{
    redisContext *c = connect_server();
    struct sl_fleet_bucket b = slow("t:expire", 3, 2);
    cr_assert(take(c, &b, 1).admitted);
    redisReply *r = redisCommand(c, "PTTL t:expire");
    cr_assert_eq(r->type, REDIS_REPLY_INTEGER);
    cr_assert_gt(r->integer, HOUR_NS / 1000000, "two hours owed: well over an hour left");
    cr_assert_leq(r->integer, 2 * HOUR_NS / 1000000);
    freeReplyObject(r);
    redisFree(c);
}

struct hammer {
    const struct sl_fleet_bucket *b;
    int calls, admitted;
};

static void *hammer_run(void *arg)
{
    struct hammer *h = arg;
    redisContext *c = connect_server();
    for (int i = 0; i < h->calls; i++)
        h->admitted += take(c, h->b, 1).admitted;
    redisFree(c);
    return NULL;
}

Test(fleet, many_connections_never_take_more_than_the_rate_over_their_time_plus_the_burst)
{
    /* 200 a second with a burst of 50, eight connections asking 400 times each as fast as they
     * can: what they get is at most burst + rate × (Redis time from first to last call). */
    struct sl_fleet_bucket b = {
        "t:hammer", {.limit = 200, .period_ns = 1000000000, .burst = 50}, 1};
    redisContext *c = connect_server();
    redisReply *r = redisCommand(c, "TIME");
    int64_t t0 = atoll(r->element[0]->str) * 1000000 + atoll(r->element[1]->str);
    freeReplyObject(r);
    enum { N = 8 };
    struct hammer h[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        h[i] = (struct hammer){&b, 400, 0};
        pthread_create(&th[i], NULL, hammer_run, &h[i]);
    }
    int admitted = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        admitted += h[i].admitted;
    }
    r = redisCommand(c, "TIME");
    int64_t t1 = atoll(r->element[0]->str) * 1000000 + atoll(r->element[1]->str);
    freeReplyObject(r);
    int64_t bound = 50 + (t1 - t0) * 200 / 1000000 + 1;
    cr_assert_leq(admitted, bound, "%d admitted in %lld us, bound %lld", admitted,
                  (long long)(t1 - t0), (long long)bound);
    cr_assert_geq(admitted, 50, "the burst at least");
    redisFree(c);
}

Test(fleet, replies_that_are_not_the_scripts_are_errors_not_verdicts)
{
    redisContext *c = connect_server();
    struct sl_fleet_take t;
    char err[256];
    redisReply *r = redisCommand(c, "EVALSHA 0000000000000000000000000000000000000000 0");
    cr_assert_eq(sl_fleet_take_parse(r, 1, &t, err, sizeof err), SL_EIO);
    cr_assert(strstr(err, "NOSCRIPT"), "%s", err);
    freeReplyObject(r);
    r = redisCommand(c, "PING");
    cr_assert_eq(sl_fleet_take_parse(r, 1, &t, err, sizeof err), SL_EIO);
    freeReplyObject(r);
    r = redisCommand(c, "EVAL %s 0", "return {1, 5, 3}");
    cr_assert_eq(sl_fleet_take_parse(r, 1, &t, err, sizeof err), SL_EIO, "a value missing");
    freeReplyObject(r);
    r = redisCommand(c, "EVAL %s 0", "return {0, 5, 2, 1, 1, 1}");
    cr_assert_eq(sl_fleet_take_parse(r, 1, &t, err, sizeof err), SL_EIO, "no bucket 2 of 1");
    freeReplyObject(r);
    cr_assert_eq(sl_fleet_take_parse(NULL, 1, &t, err, sizeof err), SL_EIO);
    /* EVALSHA of the script's own SHA-1 runs it once it is loaded. */
    char sha[SL_FLEET_SHA_LEN + 1];
    sl_fleet_script_sha(sl_fleet_take_lua, sha);
    r = redisCommand(c, "SCRIPT LOAD %s", sl_fleet_take_lua);
    cr_assert_str_eq(r->str, sha);
    freeReplyObject(r);
    redisFree(c);
}

/* A money bucket: limit 0, burst the budget, period the time to the period's end. */
static struct sl_fleet_bucket money(const char *key, int64_t budget, int64_t cost)
{
    return (struct sl_fleet_bucket){key, {.limit = 0, .period_ns = HOUR_NS, .burst = budget}, cost};
}

Test(fleet, a_budget_takes_worst_cases_while_they_fit_and_settles_to_the_cost)
{
    redisContext *c = connect_server();
    struct sl_fleet_bucket b = money("f:budget", 100, 30);
    struct sl_fleet_take t = take(c, &b, 1);
    cr_assert(t.admitted);
    cr_assert_eq(t.view[0].remaining, 70);
    cr_assert_eq(t.view[0].reset_ns, HOUR_NS, "the period's end");
    cr_assert(take(c, &b, 1).admitted);
    cr_assert(take(c, &b, 1).admitted);
    t = take(c, &b, 1);
    cr_assert_not(t.admitted, "90 spent: 30 more would pass 100");
    cr_assert_eq(t.failed, 0);
    cr_assert_eq(t.view[0].remaining, 10);
    cr_assert_eq(t.view[0].retry_ns, HOUR_NS, "not before the period resets");
    /* A request reserved 30 and cost 5: -25 settles it; one that cost more adds. */
    b.cost = -25;
    refund(c, &b, 1);
    b.cost = 30;
    t = take(c, &b, 1);
    cr_assert(t.admitted, "65 spent");
    cr_assert_eq(t.view[0].remaining, 5);
    redisReply *r = redisCommand(c, "PTTL f:budget");
    cr_assert_gt(r->integer, 3600000, "kept a day past its period");
    freeReplyObject(r);
    /* A budget without end (period 0) never expires and says never to retry. */
    struct sl_fleet_bucket total = money("f:total", 10, 10);
    total.rate.period_ns = 0;
    cr_assert(take(c, &total, 1).admitted);
    t = take(c, &total, 1);
    cr_assert_not(t.admitted);
    cr_assert_eq(t.view[0].retry_ns, -1);
    r = redisCommand(c, "PTTL f:total");
    cr_assert_eq(r->integer, -1);
    freeReplyObject(r);
    /* A settle after the period's key is gone adds nothing anywhere. */
    freeReplyObject(redisCommand(c, "DEL f:budget"));
    b.cost = 7;
    refund(c, &b, 1);
    r = redisCommand(c, "EXISTS f:budget");
    cr_assert_eq(r->integer, 0);
    freeReplyObject(r);
    redisFree(c);
}

Test(fleet, the_end_of_a_request_adds_its_usage_to_the_hour_in_the_same_call)
{
    redisContext *c = connect_server();
    struct sl_fleet_bucket b = slow("f:tpm", 100, 60);
    cr_assert(take(c, &b, 1).admitted);
    struct sl_usage_key k;
    sl_usage_key_set(&k, "acme", "m", "batch", 1795759200);
    struct sl_usage u = {.requests = 1,
                         .prompt_tokens = 5,
                         .completion_tokens = 16,
                         .device_ns = 812000,
                         .cost = 10350};
    char hkey[64], index[64], field[256], num[10][24];
    sl_fleet_usage_key(hkey, sizeof hkey, "sl:", k.hour);
    cr_assert_str_eq(hkey, "sl:usage:1795759200");
    sl_fleet_usage_index(index, sizeof index, "sl:");
    sl_fleet_usage_field(field, sizeof field, &k);
    b.cost = 39; /* gives back what it did not use */
    sl_fleet_refund_args(&b, 1, num);
    sl_fleet_usage_args(&u, k.hour, num + 3);
    for (int round = 0; round < 2; round++) {
        const char *argv[] = {"EVAL", sl_fleet_refund_lua,
                              "3",    b.key,
                              hkey,   index,
                              num[0], num[1],
                              num[2], field,
                              num[3], num[4],
                              num[5], num[6],
                              num[7], num[8],
                              num[9]};
        redisReply *r = redisCommandArgv(c, 17, argv, NULL);
        cr_assert(r && r->type == REDIS_REPLY_INTEGER, "%s", r && r->str ? r->str : "?");
        freeReplyObject(r);
    }
    redisReply *r = redisCommand(c, "HGET %s %s", hkey, "acme\tm\tbatch\tcost");
    cr_assert(r->str, "type %d", r->type);
    cr_assert_str_eq(r->str, "20700", "two requests' cost");
    freeReplyObject(r);
    r = redisCommand(c, "HGET %s %s", hkey, "acme\tm\tbatch\tcompletion_tokens");
    cr_assert_str_eq(r->str, "32");
    freeReplyObject(r);
    r = redisCommand(c, "HEXISTS %s %s", hkey, "acme\tm\tbatch\tcached_tokens");
    cr_assert_eq(r->integer, 0, "zeros are not written");
    freeReplyObject(r);
    r = redisCommand(c, "ZSCORE %s %s", index, "1795759200");
    cr_assert(r->str, "the hour is in the index");
    cr_assert_eq(atoll(r->str), 1795759200);
    freeReplyObject(r);
    /* The bucket got its 39 back once, the second time it was full: 100 - 60 + 39 + 21. */
    b.cost = 0;
    cr_assert_eq(take(c, &b, 1).view[0].remaining, 100);
    redisFree(c);
}

/* Settles one request of tenant t in hour h through the refund script, as a replica does. */
static void settle_usage(redisContext *c, const char *t, int64_t h, int64_t cost)
{
    struct sl_usage_key k;
    sl_usage_key_set(&k, t, "m", "batch", h);
    struct sl_usage u = {.requests = 1, .prompt_tokens = 3, .completion_tokens = 4, .cost = cost};
    char hkey[64], index[64], field[256], num[7][24];
    sl_fleet_usage_key(hkey, sizeof hkey, "u:", h);
    sl_fleet_usage_index(index, sizeof index, "u:");
    sl_fleet_usage_field(field, sizeof field, &k);
    sl_fleet_usage_args(&u, h, num);
    const char *argv[] = {"EVAL", sl_fleet_refund_lua,
                          "2",    hkey,
                          index,  field,
                          num[0], num[1],
                          num[2], num[3],
                          num[4], num[5],
                          num[6]};
    redisReply *r = redisCommandArgv(c, 13, argv, NULL);
    cr_assert(r && r->type == REDIS_REPLY_INTEGER, "%s", r && r->str ? r->str : "?");
    freeReplyObject(r);
}

/* Reads [from, to) of the ledger under "u:" a page of `page` hours at a time, as the client and
 * the export do; returns the pages it took. */
static int read_usage(redisContext *c, int64_t from, int64_t to, int page, const char *budget,
                      struct sl_usage_ledger *l, int64_t *spent)
{
    char index[64], num[3][24];
    sl_fleet_usage_index(index, sizeof index, "u:");
    int pages = 0;
    for (;;) {
        sl_fleet_usage_read_args(from, to, page, num);
        const char *argv[9];
        int argc = 0;
        argv[argc++] = "EVAL";
        argv[argc++] = sl_fleet_usage_lua;
        argv[argc++] = budget ? "2" : "1";
        argv[argc++] = index;
        if (budget)
            argv[argc++] = budget;
        argv[argc++] = "u:";
        for (int i = 0; i < 3; i++)
            argv[argc++] = num[i];
        redisReply *r = redisCommandArgv(c, argc, argv, NULL);
        int64_t s = -2, last = 0;
        int bad = 0;
        char err[128];
        int n = sl_fleet_usage_parse(r, l, &s, &last, &bad, err, sizeof err);
        freeReplyObject(r);
        cr_assert_geq(n, 0, "%s", err);
        cr_assert_eq(bad, 0);
        if (pages++ == 0)
            *spent = s;
        if (n < page)
            return pages;
        from = last + 1;
    }
}

Test(fleet, the_ledger_is_read_back_a_page_of_hours_at_a_time_within_its_range)
{
    redisContext *c = connect_server();
    const int64_t h0 = 1795759200;
    for (int i = 0; i < 30; i++) {
        settle_usage(c, "acme", h0 + 3600 * i, 1000 + i);
        if (i % 2 == 0)
            settle_usage(c, "zeta", h0 + 3600 * i, 7);
    }
    settle_usage(c, "acme", h0, 5); /* a second request in the first hour adds to it */
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    int64_t spent;
    cr_assert_eq(read_usage(c, INT64_MIN, INT64_MAX, 24, NULL, l, &spent), 2);
    cr_assert_eq(spent, -1, "no budget key was asked");
    struct sl_usage u;
    sl_usage_ledger_sum(l, "acme", INT64_MIN, INT64_MAX, &u);
    cr_assert_eq(u.requests, 31);
    cr_assert_eq(u.cost, 30 * 1000 + 29 * 30 / 2 + 5);
    cr_assert_eq(u.completion_tokens, 31 * 4);
    sl_usage_ledger_sum(l, "zeta", INT64_MIN, INT64_MAX, &u);
    cr_assert_eq(u.requests, 15);
    sl_usage_ledger_free(l);

    /* [from, to): hours 10 to 19; pages of 4 take three calls. */
    l = sl_usage_ledger_new();
    freeReplyObject(redisCommand(c, "SET u:budget 123456"));
    cr_assert_eq(read_usage(c, h0 + 36000, h0 + 72000, 4, "u:budget", l, &spent), 3);
    cr_assert_eq(spent, 123456, "the budget's spend comes with the first page");
    sl_usage_ledger_sum(l, NULL, INT64_MIN, INT64_MAX, &u);
    cr_assert_eq(u.requests, 10 + 5);
    sl_usage_ledger_sum(l, "acme", INT64_MIN, INT64_MAX, &u);
    cr_assert_eq(u.cost, 10 * 1000 + (10 + 19) * 10 / 2);
    sl_usage_ledger_free(l);
    redisFree(c);
}

Test(fleet, a_usage_reply_that_is_not_a_page_is_an_error_and_odd_fields_are_counted)
{
    redisContext *c = connect_server();
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    int64_t spent = 0, last = 0;
    int bad = 0;
    char err[128];
    static const char *const wrong[] = {"return 'x'",
                                        "return {}",
                                        "return {-1, 1795759200}",
                                        "return {-1, 17, {}}",
                                        "return {-1, 1795759200, {'a'}}",
                                        "return redis.error_reply('NOPE')"};
    for (size_t i = 0; i < sizeof wrong / sizeof *wrong; i++) {
        redisReply *r = redisCommand(c, "EVAL %s 0", wrong[i]);
        cr_assert_eq(sl_fleet_usage_parse(r, l, &spent, &last, &bad, err, sizeof err), -1, "%s",
                     wrong[i]);
        freeReplyObject(r);
    }
    cr_assert(strstr(err, "NOPE"), "an error reply is passed on as worded: %s", err);
    redisReply *r = redisCommand(
        c, "EVAL %s 0",
        "return {5, 1795759200, {'a\tm\tt\tcost', '9', 'a\tm\tcost', '1', "
        "'a\tm\tt\tcolour', '2', 'a\tm\tt\trequests', 'x1', 'a\tm\tt\trequests', '2'}}");
    cr_assert_eq(sl_fleet_usage_parse(r, l, &spent, &last, &bad, err, sizeof err), 1);
    freeReplyObject(r);
    cr_assert_eq(spent, 5);
    cr_assert_eq(last, 1795759200);
    cr_assert_eq(bad, 3, "a field without a tier, an unknown counter, a value not a number");
    struct sl_usage u;
    sl_usage_ledger_sum(l, "a", INT64_MIN, INT64_MAX, &u);
    cr_assert_eq(u.cost, 9);
    cr_assert_eq(u.requests, 2);
    sl_usage_ledger_free(l);
    redisFree(c);
}
