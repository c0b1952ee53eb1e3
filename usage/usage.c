/* Prices, money and periods: the arithmetic of metering, with no state. */
#include <sluice/usage.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double nonneg(int64_t v)
{
    return v > 0 ? (double)v : 0.0;
}

int64_t sl_usage_cost(const struct sl_usage_price *p, const struct sl_usage *u)
{
    double cached = nonneg(u->cached_tokens), prompt = nonneg(u->prompt_tokens);
    double uncached = prompt > cached ? prompt - cached : 0.0;
    /* A price per million tokens is price × 1000 nano-units per token; a price per second is
     * price nano-units per nanosecond. */
    double nano = uncached * p->input_per_mtok * 1e3 + cached * p->cached_input_per_mtok * 1e3 +
                  nonneg(u->completion_tokens) * p->output_per_mtok * 1e3 +
                  nonneg(u->device_ns) * p->device_second;
    if (!(nano < 9.2e18)) /* NaN or past int64: the configuration bounds prices, so never */
        return INT64_MAX;
    return (int64_t)llround(nano);
}

int64_t sl_usage_worst_case(const struct sl_usage_price *p, int64_t prompt_tokens,
                            int64_t max_tokens)
{
    struct sl_usage u = {.prompt_tokens = prompt_tokens, .completion_tokens = max_tokens};
    return sl_usage_cost(p, &u);
}

void sl_usage_add(struct sl_usage *sum, const struct sl_usage *u)
{
    sum->requests += u->requests;
    sum->prompt_tokens += u->prompt_tokens;
    sum->cached_tokens += u->cached_tokens;
    sum->completion_tokens += u->completion_tokens;
    sum->device_ns += u->device_ns;
    sum->cost += u->cost;
}

void sl_usage_money_format(int64_t nano, char *out, size_t outlen)
{
    /* In unsigned arithmetic, so that INT64_MIN has a magnitude too. */
    uint64_t mag = nano < 0 ? 0 - (uint64_t)nano : (uint64_t)nano;
    uint64_t whole = mag / SL_USAGE_NANO, frac = mag % SL_USAGE_NANO;
    char f[16] = "";
    if (frac) {
        snprintf(f, sizeof f, ".%09llu", (unsigned long long)frac);
        size_t n = strlen(f);
        while (f[n - 1] == '0')
            f[--n] = '\0';
    }
    snprintf(out, outlen, "%s%llu%s", nano < 0 ? "-" : "", (unsigned long long)whole, f);
}

/* ---- periods ---- */

static const char *const period_names[] = {"day", "week", "month", "total"};

const char *sl_usage_period_name(enum sl_usage_period p)
{
    return (unsigned)p < 4 ? period_names[p] : "?";
}

int sl_usage_period_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, period_names[i]) == 0)
            return i;
    return -1;
}

#define DAY_S 86400LL

static int64_t floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

/* Days since 1970-01-01 of a proleptic Gregorian date, and back (the civil-calendar algorithms
 * of "chrono-compatible low-level date algorithms": eras of 400 years, March-based years). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = floor_div(y, 400);
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static void civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    z += 719468;
    int64_t era = floor_div(z, 146097);
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

void sl_usage_period_bounds(enum sl_usage_period p, int month_day, int64_t t, int64_t *start,
                            int64_t *end)
{
    int64_t days = floor_div(t, DAY_S);
    switch (p) {
    case SL_USAGE_DAY:
        *start = days * DAY_S;
        *end = *start + DAY_S;
        return;
    case SL_USAGE_WEEK: {
        int64_t monday = days - (((days + 3) % 7) + 7) % 7; /* 1970-01-01 was a Thursday */
        *start = monday * DAY_S;
        *end = *start + 7 * DAY_S;
        return;
    }
    case SL_USAGE_MONTH: {
        int md = month_day < 1 ? 1 : month_day > 28 ? 28 : month_day;
        int64_t y;
        int m, d;
        civil_from_days(days, &y, &m, &d);
        if (d < md) { /* still in the period that began last month */
            if (--m == 0) {
                m = 12;
                y--;
            }
        }
        *start = days_from_civil(y, m, md) * DAY_S;
        if (++m == 13) {
            m = 1;
            y++;
        }
        *end = days_from_civil(y, m, md) * DAY_S;
        return;
    }
    case SL_USAGE_TOTAL:
    default: *start = INT64_MIN, *end = INT64_MAX; return;
    }
}

bool sl_usage_time_parse(const char *s, int64_t *out)
{
    char *end;
    if (*s >= '0' && *s <= '9' && strspn(s, "0123456789") == strlen(s) && strlen(s) <= 12) {
        *out = strtoll(s, &end, 10);
        return true;
    }
    struct tm tm = {0};
    int n = 0;
    if (sscanf(s, "%4d-%2d-%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &n) != 3 || n != 10)
        return false;
    if (s[10] == 'T') {
        int m = 0;
        if (sscanf(s + 11, "%2d:%2d:%2dZ%n", &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &m) != 3 ||
            m != 9 || s[20] != '\0')
            return false;
    } else if (s[10] != '\0') {
        return false;
    }
    if (tm.tm_year < 1970 || tm.tm_year > 9999 || tm.tm_mon < 1 || tm.tm_mon > 12 ||
        tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
        return false;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    *out = (int64_t)timegm(&tm);
    return true;
}

void sl_usage_time_format(int64_t t, char out[32])
{
    struct tm tm;
    time_t tt = (time_t)t;
    gmtime_r(&tt, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

static const char *const group_names[4] = {"tenant", "model", "tier", "hour"};

const char *sl_usage_group_name(int i)
{
    return i >= 0 && i < 4 ? group_names[i] : "?";
}

bool sl_usage_group_parse(const char *s, unsigned *out, char *bad, size_t badlen)
{
    *out = 0;
    for (const char *p = s; *p;) {
        size_t n = strcspn(p, ",");
        int i = 0;
        while (i < 4 && !(strlen(group_names[i]) == n && strncmp(p, group_names[i], n) == 0))
            i++;
        if (n > 0 && i == 4) {
            snprintf(bad, badlen, "%.*s", (int)n, p);
            return false;
        }
        if (n > 0)
            *out |= 1u << i;
        p += n + (p[n] == ',');
    }
    return true;
}

int64_t sl_usage_hour(int64_t t)
{
    return floor_div(t, 3600) * 3600;
}

void sl_usage_key_set(struct sl_usage_key *k, const char *tenant, const char *model,
                      const char *tier, int64_t hour)
{
    memset(k, 0, sizeof *k);
    snprintf(k->tenant, sizeof k->tenant, "%s", tenant ? tenant : "");
    snprintf(k->model, sizeof k->model, "%s", model ? model : "");
    snprintf(k->tier, sizeof k->tier, "%s", tier ? tier : "");
    k->hour = hour;
}
