/* Metering's arithmetic (cost, money, periods), the ledger's totals and groups, and the journal:
 * replay after a restart, a last line cut short, lines that do not parse, compaction. */
#include <criterion/criterion.h>

#include "usage_impl.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct sl_usage_price price = {.input_per_mtok = 0.15,
                                            .cached_input_per_mtok = 0.075,
                                            .output_per_mtok = 0.60,
                                            .device_second = 0.002};

Test(usage, cost_charges_each_kind_of_token_and_device_time_at_its_price)
{
    struct sl_usage u = {.prompt_tokens = 1000,
                         .cached_tokens = 400,
                         .completion_tokens = 50,
                         .device_ns = 250000000};
    /* 600 × 150 + 400 × 75 + 50 × 600 nano-units, and 0.25 s × 0.002 = 500,000. */
    cr_assert_eq(sl_usage_cost(&price, &u), 90000 + 30000 + 30000 + 500000);
    cr_assert_eq(sl_usage_worst_case(&price, 1000, 256), 150000 + 256 * 600);
    struct sl_usage none = {.prompt_tokens = -5};
    cr_assert_eq(sl_usage_cost(&price, &none), 0);
    struct sl_usage_price free_ = {0};
    cr_assert_eq(sl_usage_cost(&free_, &u), 0);
}

Test(usage, money_is_written_as_a_decimal_without_trailing_zeros)
{
    char s[32];
    sl_usage_money_format(150000, s, sizeof s);
    cr_assert_str_eq(s, "0.00015");
    sl_usage_money_format(12 * SL_USAGE_NANO, s, sizeof s);
    cr_assert_str_eq(s, "12");
    sl_usage_money_format(-SL_USAGE_NANO / 2, s, sizeof s);
    cr_assert_str_eq(s, "-0.5");
    sl_usage_money_format(1, s, sizeof s);
    cr_assert_str_eq(s, "0.000000001");
    sl_usage_money_format(0, s, sizeof s);
    cr_assert_str_eq(s, "0");
    sl_usage_money_format(INT64_MIN, s, sizeof s);
    cr_assert_str_eq(s, "-9223372036.854775808");
}

/* 2026-11-27 06:30:00 UTC (a Friday). */
#define T 1795761000LL
#define DAY 86400LL

Test(usage, periods_start_at_midnight_monday_and_the_month_day_in_utc)
{
    int64_t s, e;
    sl_usage_period_bounds(SL_USAGE_DAY, 1, T, &s, &e);
    cr_assert_eq(s, 1795737600LL, "2026-11-27 00:00");
    cr_assert_eq(e, s + DAY);
    sl_usage_period_bounds(SL_USAGE_WEEK, 1, T, &s, &e);
    cr_assert_eq(s, 1795737600LL - 4 * DAY, "Monday 2026-11-23");
    cr_assert_eq(e, s + 7 * DAY);
    sl_usage_period_bounds(SL_USAGE_MONTH, 1, T, &s, &e);
    cr_assert_eq(s, 1793491200LL, "2026-11-01");
    cr_assert_eq(e, 1796083200LL, "2026-12-01");
    /* Billing from the 28th: 2026-10-28 to 2026-11-28. */
    sl_usage_period_bounds(SL_USAGE_MONTH, 28, T, &s, &e);
    cr_assert_eq(s, 1793491200LL - 4 * DAY);
    cr_assert_eq(e, 1795737600LL + DAY);
    /* The last second of a period is in it, the next is not (a fake clock across the turn). */
    sl_usage_period_bounds(SL_USAGE_MONTH, 1, 1796083199LL, &s, &e);
    cr_assert_eq(e, 1796083200LL);
    sl_usage_period_bounds(SL_USAGE_MONTH, 1, 1796083200LL, &s, &e);
    cr_assert_eq(s, 1796083200LL);
    cr_assert_eq(e, 1798761600LL, "2027-01-01: December has 31 days");
    /* February of a leap year, from the 15th. */
    sl_usage_period_bounds(SL_USAGE_MONTH, 15, 1834012800LL /* 2028-02-14 */, &s, &e);
    cr_assert_eq(s, 1831507200LL, "2028-01-15");
    cr_assert_eq(e, 1834185600LL, "2028-02-15");
    sl_usage_period_bounds(SL_USAGE_TOTAL, 1, T, &s, &e);
    cr_assert_eq(s, INT64_MIN);
    cr_assert_eq(e, INT64_MAX);
    cr_assert_eq(sl_usage_period_parse("week"), SL_USAGE_WEEK);
    cr_assert_eq(sl_usage_period_parse("year"), -1);
}

static void add(struct sl_usage_ledger *l, const char *tenant, const char *model, const char *tier,
                int64_t t, int prompt, int completion)
{
    struct sl_usage_key k;
    sl_usage_key_set(&k, tenant, model, tier, sl_usage_hour(t));
    struct sl_usage u = {.requests = 1, .prompt_tokens = prompt, .completion_tokens = completion};
    u.cost = sl_usage_cost(&price, &u);
    sl_usage_ledger_add(l, &k, &u);
}

struct rows {
    int n;
    struct sl_usage_key k[16];
    struct sl_usage u[16];
};

static void collect(void *arg, const struct sl_usage_key *k, const struct sl_usage *u)
{
    struct rows *r = arg;
    cr_assert_lt(r->n, 16);
    r->k[r->n] = *k;
    r->u[r->n++] = *u;
}

Test(usage, ledger_sums_and_groups_by_what_is_asked_in_order)
{
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    add(l, "b", "m1", "batch", T, 10, 1);
    add(l, "a", "m1", "interactive", T, 100, 10);
    add(l, "a", "m2", "interactive", T + 3600, 200, 20);
    add(l, "a", "m1", "interactive", T + 60, 1, 1);
    struct sl_usage s;
    sl_usage_ledger_sum(l, "a", 0, INT64_MAX, &s);
    cr_assert_eq(s.requests, 3);
    cr_assert_eq(s.prompt_tokens, 301);
    sl_usage_ledger_sum(l, NULL, sl_usage_hour(T), sl_usage_hour(T) + 3600, &s);
    cr_assert_eq(s.requests, 3, "the hour of T only");
    struct rows r = {0};
    cr_assert_eq(sl_usage_ledger_query(l, NULL, 0, INT64_MAX, SL_USAGE_BY_TENANT, collect, &r), 2);
    cr_assert_str_eq(r.k[0].tenant, "a");
    cr_assert_eq(r.u[0].completion_tokens, 31);
    cr_assert_str_eq(r.k[0].model, "", "not grouped by model");
    cr_assert_eq(r.k[0].hour, -1);
    memset(&r, 0, sizeof r);
    cr_assert_eq(sl_usage_ledger_query(l, "a", 0, INT64_MAX, SL_USAGE_BY_MODEL | SL_USAGE_BY_HOUR,
                                       collect, &r),
                 2);
    cr_assert_str_eq(r.k[0].model, "m1");
    cr_assert_eq(r.u[0].requests, 2, "two requests of the same hour");
    cr_assert_eq(r.k[1].hour, sl_usage_hour(T + 3600));
    sl_usage_ledger_free(l);
}

/* ---- the journal ---- */

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/sluice-usage-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    char p[128];
    snprintf(p, sizeof p, "%s/usage.jsonl", dir);
    unlink(p);
    rmdir(dir);
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    int n = 0, c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

static void journal_add(struct sl_usage_journal *j, struct sl_usage_ledger *l, const char *tenant,
                        int64_t t, int prompt, int completion)
{
    struct sl_usage_key k;
    sl_usage_key_set(&k, tenant, "m", "batch", sl_usage_hour(t));
    struct sl_usage u = {
        .requests = 1, .prompt_tokens = prompt, .completion_tokens = completion, .device_ns = 1000};
    u.cost = sl_usage_cost(&price, &u);
    sl_usage_ledger_add(l, &k, &u);
    struct sl_str buf;
    sl_str_init(&buf);
    sl_usage_journal_record(&buf, &k, &u);
    cr_assert_eq(sl_usage_journal_write(j, &buf), SL_OK);
    cr_assert_eq(buf.len, 0);
    sl_str_dispose(&buf);
}

TestSuite(usage_journal, .init = make_dir, .fini = remove_dir);

Test(usage_journal, a_restart_replays_every_record_and_compacts_them_into_hours)
{
    char err[256], path[128];
    snprintf(path, sizeof path, "%s/usage.jsonl", dir);
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    struct sl_usage_journal *j;
    cr_assert_eq(sl_usage_journal_open(dir, l, &j, err, sizeof err), SL_OK, "%s", err);
    for (int i = 0; i < 10; i++)
        journal_add(j, l, i % 2 ? "a" : "b", T + i * 600, 10 + i, i);
    sl_usage_journal_close(j);
    cr_assert_eq(count_lines(path), 10, "one line per request");
    struct sl_usage before, after;
    sl_usage_ledger_sum(l, NULL, INT64_MIN, INT64_MAX, &before);
    sl_usage_ledger_free(l);

    l = sl_usage_ledger_new();
    cr_assert_eq(sl_usage_journal_open(dir, l, &j, err, sizeof err), SL_OK, "%s", err);
    sl_usage_ledger_sum(l, NULL, INT64_MIN, INT64_MAX, &after);
    cr_assert_eq(memcmp(&before, &after, sizeof before), 0, "the same totals after the restart");
    cr_assert_eq(after.requests, 10);
    /* 06:30 to 08:00 in 10-minute steps, a and b in turn: b in hours 06 and 07, a (from 06:40
     * to 08:00) in 06, 07 and 08. */
    cr_assert_eq(count_lines(path), 5, "compacted: one line per tenant and hour");
    journal_add(j, l, "a", T, 1, 1);
    sl_usage_journal_close(j);
    int bad = -1;
    struct sl_usage_ledger *r = sl_usage_ledger_new();
    cr_assert_eq(sl_usage_journal_read(path, r, &bad, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(bad, 0);
    sl_usage_ledger_sum(r, "a", INT64_MIN, INT64_MAX, &after);
    sl_usage_ledger_sum(l, "a", INT64_MIN, INT64_MAX, &before);
    cr_assert_eq(memcmp(&before, &after, sizeof before), 0, "read-only, the same as the server's");
    sl_usage_ledger_free(r);
    sl_usage_ledger_free(l);
}

static void append_raw(const char *path, const char *text)
{
    FILE *f = fopen(path, "a");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(usage_journal, a_torn_last_line_and_garbage_are_dropped_and_the_rest_kept)
{
    char err[256], path[128];
    snprintf(path, sizeof path, "%s/usage.jsonl", dir);
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    struct sl_usage_journal *j;
    cr_assert_eq(sl_usage_journal_open(dir, l, &j, err, sizeof err), SL_OK, "%s", err);
    journal_add(j, l, "a", T, 5, 5);
    sl_usage_journal_close(j);
    append_raw(path, "not json\n{\"tenant\":\"a\",\"model\":\"m\",\"tier\":\"batch\",\"hour\":12,"
                     "\"requests\":1,\"prompt_tokens\":1,\"cached_tokens\":0,"
                     "\"completion_tokens\":1,\"device_ns\":0,\"cost\":1}\n");
    append_raw(path, "{\"tenant\":\"a\",\"model\":\"m\",\"tier\":\"batch\",\"hour\":1795759200,"
                     "\"requests\":1,\"prompt_tok");
    sl_usage_ledger_free(l);
    l = sl_usage_ledger_new();
    int bad = -1;
    cr_assert_eq(sl_usage_journal_read(path, l, &bad, err, sizeof err), SL_OK);
    cr_assert_eq(bad, 3, "garbage, an hour not on the hour, and the torn line");
    struct sl_usage s;
    sl_usage_ledger_sum(l, NULL, INT64_MIN, INT64_MAX, &s);
    cr_assert_eq(s.requests, 1);
    cr_assert_eq(s.prompt_tokens, 5);
    sl_usage_ledger_free(l);
    /* The server starts on it, and the compaction leaves only what parsed. */
    l = sl_usage_ledger_new();
    cr_assert_eq(sl_usage_journal_open(dir, l, &j, err, sizeof err), SL_OK, "%s", err);
    sl_usage_journal_close(j);
    cr_assert_eq(count_lines(path), 1);
    sl_usage_ledger_free(l);
}

Test(usage_journal, a_missing_directory_is_an_error_that_names_it)
{
    char err[256];
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    struct sl_usage_journal *j = (void *)1;
    cr_assert_eq(sl_usage_journal_open("/nonexistent/sluice", l, &j, err, sizeof err), SL_ENOENT);
    cr_assert_null(j);
    cr_assert(strstr(err, "/nonexistent/sluice"), "%s", err);
    sl_usage_ledger_free(l);
}

Test(usage_journal, lines_parse_only_when_every_field_is_there_and_sane)
{
    struct sl_usage_key k;
    struct sl_usage u;
    const char *ok =
        "{\"tenant\":\"t\",\"model\":\"m\",\"tier\":\"x\",\"hour\":3600,\"requests\":2,"
        "\"prompt_tokens\":3,\"cached_tokens\":1,\"completion_tokens\":4,"
        "\"device_ns\":5,\"cost\":-6}";
    cr_assert_eq(sl_usage_journal_parse(ok, strlen(ok), &k, &u), SL_OK);
    cr_assert_eq(u.requests, 2);
    cr_assert_eq(u.cost, -6, "a refund can make a cost negative");
    const char *neg =
        "{\"tenant\":\"t\",\"model\":\"m\",\"tier\":\"x\",\"hour\":3600,\"requests\":-1,"
        "\"prompt_tokens\":3,\"cached_tokens\":1,\"completion_tokens\":4,"
        "\"device_ns\":5,\"cost\":6}";
    cr_assert_eq(sl_usage_journal_parse(neg, strlen(neg), &k, &u), SL_EINVAL);
    const char *nul = "{\"tenant\":\"t\\u0000x\",\"model\":\"m\",\"tier\":\"x\",\"hour\":3600,"
                      "\"requests\":1,\"prompt_tokens\":3,\"cached_tokens\":1,"
                      "\"completion_tokens\":4,\"device_ns\":5,\"cost\":6}";
    cr_assert_eq(sl_usage_journal_parse(nul, strlen(nul), &k, &u), SL_EINVAL);
    cr_assert_eq(sl_usage_journal_parse("[]", 2, &k, &u), SL_EINVAL);
}

Test(usage, group_lists_parse_into_bits_or_name_the_word_they_do_not_know)
{
    unsigned g = 99;
    char bad[16] = "";
    cr_assert(sl_usage_group_parse("hour,tenant", &g, bad, sizeof bad));
    cr_assert_eq(g, SL_USAGE_BY_HOUR | SL_USAGE_BY_TENANT);
    cr_assert(sl_usage_group_parse("", &g, bad, sizeof bad));
    cr_assert_eq(g, 0);
    cr_assert_not(sl_usage_group_parse("model,days", &g, bad, sizeof bad));
    cr_assert_str_eq(bad, "days");
    cr_assert_not(sl_usage_group_parse("tiers", &g, bad, sizeof bad), "whole names only");
    cr_assert_str_eq(sl_usage_group_name(2), "tier");
}
