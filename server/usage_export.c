/* `sluice usage export`: the usage journal of a state_dir, for chargeback, as CSV or JSON, over a
 * time range, grouped as asked. It reads the file without changing it, so it may run beside the
 * server that appends to it (a line the server is writing at that moment is skipped, and said). */
#include <sluice/server.h>
#include <sluice/usage.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: sluice usage export --state-dir DIR [--from T] [--to T] [--tenant NAME]\n"
    "                           [--group-by tenant,model,tier,hour] [--format csv|json]\n"
    "                           [--currency NAME]\n"
    "\n"
    "  Prints the usage a server kept in DIR/usage.jsonl (its \"state_dir\"): requests, prompt,\n"
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

int sl_usage_export_main(int argc, char **argv, FILE *out, FILE *errf)
{
    const char *dir = NULL, *tenant = NULL, *format = "csv", *currency = "";
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
            group = 0;
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                unsigned bit = strcmp(t, "tenant") == 0  ? SL_USAGE_BY_TENANT
                               : strcmp(t, "model") == 0 ? SL_USAGE_BY_MODEL
                               : strcmp(t, "tier") == 0  ? SL_USAGE_BY_TIER
                               : strcmp(t, "hour") == 0  ? SL_USAGE_BY_HOUR
                                                         : 0;
                if (!bit) {
                    fprintf(errf,
                            "sluice usage export: --group-by: \"%s\" is not tenant, model, tier "
                            "or hour\n",
                            t);
                    return 2;
                }
                group |= bit;
            }
        } else {
            fprintf(errf, "sluice usage export: unknown argument %s %s (--help)\n", a, v);
            return 2;
        }
    }
    if (!dir) {
        fprintf(errf, "sluice usage export: --state-dir DIR is required (--help)\n");
        return 2;
    }
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/usage.jsonl", dir);
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    int bad = 0;
    if (sl_usage_journal_read(path, l, &bad, err, sizeof err) != SL_OK) {
        fprintf(errf, "sluice usage export: %s\n", err);
        sl_usage_ledger_free(l);
        return 1;
    }
    if (bad)
        fprintf(errf, "sluice usage export: %s: %d line%s that do not parse skipped\n", path, bad,
                bad == 1 ? "" : "s");
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
