/* `sluice usage export`: the usage journal of a state_dir, for chargeback, as CSV or JSON, over a
 * time range, grouped as asked. It reads the file without changing it, so it may run beside the
 * server that appends to it (a line the server is writing at that moment is skipped, and said). */
#include <sluice/fleet.h>
#include <sluice/server.h>
#include <sluice/usage.h>

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: sluice usage export (--state-dir DIR | --redis URL [--key-prefix P]) [--from T]\n"
    "                           [--to T] [--tenant NAME] [--group-by tenant,model,tier,hour]\n"
    "                           [--format csv|json] [--currency NAME]\n"
    "\n"
    "  Prints the usage a server kept in DIR/usage.jsonl (its \"state_dir\"), or the fleet's\n"
    "  ledger in Redis (redis://[:password@]host[:port][/db], the password else from\n"
    "  $SLUICE_REDIS_PASSWORD; keys under --key-prefix, \"sluice:\" by default): requests, "
    "prompt,\n"
    "  cached and completion tokens, device seconds and cost, summed by the groups asked (all "
    "four\n"
    "  by default), over the hours that start in [--from, --to) (unix seconds, YYYY-MM-DD or\n"
    "  YYYY-MM-DDTHH:MM:SSZ, UTC; all of them by default). CSV (the default) has a header line;\n"
    "  costs are exact decimals in the server's currency (--currency names it in the output).\n"
    "  Exit status: 0, 1 when the journal cannot be read, 2 for bad arguments.\n";

struct out {
    FILE *f;
    bool json;
    unsigned group;
    const char *currency;
    int n;
};

static void row(void *arg, const struct sl_usage_key *k, const struct sl_usage *u)
{
    struct out *o = arg;
    char cost[32], hour[32] = "";
    sl_usage_money_format(u->cost, cost, sizeof cost);
    if (o->group & SL_USAGE_BY_HOUR)
        sl_usage_time_format(k->hour, hour);
    double dev = (double)u->device_ns / 1e9;
    if (!o->json) {
        /* Names may hold commas but never a '"' (the configuration refuses it): quoted. */
        fprintf(o->f, "\"%s\",\"%s\",\"%s\",%s,%lld,%lld,%lld,%lld,%.9f,%s,%s\n", k->tenant,
                k->model, k->tier, hour, (long long)u->requests, (long long)u->prompt_tokens,
                (long long)u->cached_tokens, (long long)u->completion_tokens, dev, cost,
                o->currency);
        return;
    }
    fprintf(o->f,
            "%s{\"tenant\":\"%s\",\"model\":\"%s\",\"tier\":\"%s\",\"hour\":%s%s%s,"
            "\"requests\":%lld,\"prompt_tokens\":%lld,\"cached_tokens\":%lld,"
            "\"completion_tokens\":%lld,\"device_seconds\":%.9f,\"cost\":%s,\"currency\":\"%s\"}",
            o->n++ ? ",\n " : "", k->tenant, k->model, k->tier, hour[0] ? "\"" : "",
            hour[0] ? hour : "null", hour[0] ? "\"" : "", (long long)u->requests,
            (long long)u->prompt_tokens, (long long)u->cached_tokens,
            (long long)u->completion_tokens, dev, cost, o->currency);
}

/* The fleet's ledger in Redis: the hours of its index in [from, to), each with its hash. */
static enum sl_status read_redis(const char *url, const char *prefix, int64_t from, int64_t to,
                                 struct sl_usage_ledger *l, int *bad, char *err, size_t errlen)
{
    struct sl_fleet_addr a;
    if (sl_fleet_addr_parse(url, &a, err, errlen) != SL_OK)
        return SL_EINVAL;
    const char *pw = getenv("SLUICE_REDIS_PASSWORD");
    if (!a.password[0] && pw)
        snprintf(a.password, sizeof a.password, "%s", pw);
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout(a.host, a.port, tv);
    if (!c || c->err) {
        snprintf(err, errlen, "redis %s:%d: %s", a.host, a.port, c ? c->errstr : "no memory");
        redisFree(c);
        return SL_EIO;
    }
    redisSetTimeout(c, tv);
    redisReply *r = NULL;
    if (a.password[0])
        freeReplyObject(redisCommand(c, "AUTH %s", a.password));
    if (a.db)
        freeReplyObject(redisCommand(c, "SELECT %d", a.db));
    /* A page of hours at a time, by the servers' own script (EVAL caches it). */
    char index[300], num[3][24];
    sl_fleet_usage_index(index, sizeof index, prefix);
    enum sl_status st = SL_OK;
    for (;;) {
        sl_fleet_usage_read_args(from, to, SL_FLEET_USAGE_PAGE, num);
        const char *argv[] = {"EVAL", sl_fleet_usage_lua, "1", index, prefix, num[0], num[1],
                              num[2]};
        r = redisCommandArgv(c, 8, argv, NULL);
        int64_t spent, last = 0;
        int n = sl_fleet_usage_parse(r, l, &spent, &last, bad, err, errlen);
        if (n < 0 && !r)
            snprintf(err, errlen, "redis %s:%d: %s", a.host, a.port, c->errstr);
        freeReplyObject(r);
        r = NULL;
        if (n < 0) {
            st = SL_EIO;
            break;
        }
        if (n < SL_FLEET_USAGE_PAGE || last + 1 >= to)
            break;
        from = last + 1;
    }
    freeReplyObject(r);
    redisFree(c);
    return st;
}

int sl_usage_export_main(int argc, char **argv, FILE *out, FILE *errf)
{
    const char *dir = NULL, *tenant = NULL, *format = "csv", *currency = "", *redis = NULL,
               *prefix = "sluice:";
    int64_t from = INT64_MIN, to = INT64_MAX;
    unsigned group = SL_USAGE_BY_TENANT | SL_USAGE_BY_MODEL | SL_USAGE_BY_TIER | SL_USAGE_BY_HOUR;
    if (argc < 2 || strcmp(argv[1], "export") != 0) {
        fputs(argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
                  ? usage_text
                  : "sluice usage: the only command is \"export\" (sluice usage export --help)\n",
              argc >= 2 && strcmp(argv[1], "--help") == 0 ? out : errf);
        return argc >= 2 && strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage_text, out);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(errf, "sluice usage export: %s needs a value (--help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (strcmp(a, "--state-dir") == 0) {
            dir = v;
        } else if (strcmp(a, "--redis") == 0) {
            redis = v;
        } else if (strcmp(a, "--key-prefix") == 0) {
            prefix = v;
        } else if (strcmp(a, "--tenant") == 0) {
            tenant = v;
        } else if (strcmp(a, "--currency") == 0) {
            currency = v;
        } else if (strcmp(a, "--format") == 0 &&
                   (strcmp(v, "csv") == 0 || strcmp(v, "json") == 0)) {
            format = v;
        } else if ((strcmp(a, "--from") == 0 || strcmp(a, "--to") == 0)) {
            if (!sl_usage_time_parse(v, strcmp(a, "--from") == 0 ? &from : &to)) {
                fprintf(errf,
                        "sluice usage export: %s: \"%s\" is not unix seconds, YYYY-MM-DD or "
                        "YYYY-MM-DDTHH:MM:SSZ\n",
                        a, v);
                return 2;
            }
        } else if (strcmp(a, "--group-by") == 0) {
            char bad[64];
            if (!sl_usage_group_parse(v, &group, bad, sizeof bad)) {
                fprintf(errf,
                        "sluice usage export: --group-by: \"%s\" is not tenant, model, tier or "
                        "hour\n",
                        bad);
                return 2;
            }
        } else {
            fprintf(errf, "sluice usage export: unknown argument %s %s (--help)\n", a, v);
            return 2;
        }
    }
    if (!dir == !redis) {
        fprintf(errf, "sluice usage export: give --state-dir DIR or --redis URL (--help)\n");
        return 2;
    }
    char path[4096], err[512];
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    int bad = 0;
    if (redis) {
        if (read_redis(redis, prefix, from, to, l, &bad, err, sizeof err) != SL_OK) {
            fprintf(errf, "sluice usage export: %s\n", err);
            sl_usage_ledger_free(l);
            return 1;
        }
        if (bad)
            fprintf(errf, "sluice usage export: %d field%s of the fleet's ledger not understood\n",
                    bad, bad == 1 ? "" : "s");
    } else {
        snprintf(path, sizeof path, "%s/usage.jsonl", dir);
        if (sl_usage_journal_read(path, l, &bad, err, sizeof err) != SL_OK) {
            fprintf(errf, "sluice usage export: %s\n", err);
            sl_usage_ledger_free(l);
            return 1;
        }
        if (bad)
            fprintf(errf, "sluice usage export: %s: %d line%s that do not parse skipped\n", path,
                    bad, bad == 1 ? "" : "s");
    }
    struct out o = {
        .f = out, .json = strcmp(format, "json") == 0, .group = group, .currency = currency};
    if (o.json)
        fputs("[", out);
    else
        fputs("tenant,model,tier,hour,requests,prompt_tokens,cached_tokens,completion_tokens,"
              "device_seconds,cost,currency\n",
              out);
    sl_usage_ledger_query(l, tenant, from, to, group, row, &o);
    if (o.json)
        fputs("]\n", out);
    sl_usage_ledger_free(l);
    return 0;
}
