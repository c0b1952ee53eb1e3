/* The configuration's sections about tenants, tiers and admission ("tiers", "tenants",
 * "classify", "admin_key_sha256"): loading them from JSON with an error that names the path of
 * the bad value, checking them, and writing them back as /admin/config shows them. A load builds
 * every section aside and swaps them in only when all are valid, so a bad file changes nothing.
 * Errors name tenants and tiers, never keys or their hashes (even a malformed hash may be a
 * pasted key).
 */
#include "admission_impl.h"

#include <jansson.h>
#include <math.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A tier's isolation from the tiers below it by default (sl_sched_tier.isolation_ms). */
#define ISOLATION_MS_DEFAULT 7

#define TENANTS_MAX 100000
#define RULES_MAX 64
#define MAP_MAX 32

/* The sections being built by one load; swapped into the config only when all are valid. */
struct tenancy {
    struct sl_tier *tiers;
    int n_tiers;
    struct sl_tenant *tenants;
    int n_tenants;
    struct sl_tier_rule *classify;
    int n_classify;
    bool has_admin_key;
    unsigned char admin_key_sha256[32];
};

static void rules_free(struct sl_tier_rule *r, int n)
{
    for (int i = 0; i < n; i++) {
        free(r[i].map);
        free(r[i].path);
    }
    free(r);
}

static void tenancy_dispose(struct tenancy *t)
{
    free(t->tiers);
    free(t->tenants);
    rules_free(t->classify, t->n_classify);
    memset(t, 0, sizeof *t);
}

/* A tier's admission settings when the configuration gives none: no bucket, no queue caps, the
 * SLO guard on, and an overload policy of ["reject"] answered with 503. */
static void admission_defaults(struct sl_tier *t)
{
    t->token_rate = 0;
    t->burst = 0;
    t->max_queue_requests = -1;
    t->max_queue_tokens = -1;
    memset(t->overload, 0, sizeof t->overload);
    t->overload[0].kind = SL_OVERLOAD_REJECT;
    t->n_overload = 1;
    t->overload_status = 503;
}

static void default_tiers(struct tenancy *t)
{
    static const struct sl_tier defs[] = {
        {.sched = {.name = "interactive",
                   .priority = 0,
                   .weight = 4,
                   .ttft_slo_ms = 1000,
                   .tpot_slo_ms = 100,
                   .w_in = 1,
                   .w_out = 2,
                   .isolation_ms = ISOLATION_MS_DEFAULT}},
        {.sched = {.name = "batch",
                   .priority = 1,
                   .weight = 1,
                   .ttft_slo_ms = 60000,
                   .tpot_slo_ms = 1000,
                   .w_in = 1,
                   .w_out = 2,
                   .isolation_ms = ISOLATION_MS_DEFAULT}},
    };
    t->n_tiers = 2;
    t->tiers = sl_xmalloc(sizeof defs);
    memcpy(t->tiers, defs, sizeof defs);
    for (int i = 0; i < t->n_tiers; i++)
        admission_defaults(&t->tiers[i]);
}

static int find_in(const struct tenancy *t, const char *name)
{
    for (int i = 0; i < t->n_tiers; i++)
        if (strcmp(t->tiers[i].sched.name, name) == 0)
            return i;
    return -1;
}

/* [header, service_tier (priority → interactive, flex → batch, where those tiers exist),
 * tenant_default]. */
static void default_rules(struct tenancy *t)
{
    t->n_classify = 3;
    t->classify = sl_xcalloc(3, sizeof *t->classify);
    t->classify[0].kind = SL_RULE_HEADER;
    struct sl_tier_rule *st = &t->classify[1];
    st->kind = SL_RULE_SERVICE_TIER;
    st->map = sl_xcalloc(2, sizeof *st->map);
    static const char *const pairs[][2] = {{"priority", "interactive"}, {"flex", "batch"}};
    for (int i = 0; i < 2; i++) {
        int k = find_in(t, pairs[i][1]);
        if (k < 0)
            continue;
        snprintf(st->map[st->n_map].value, sizeof st->map[0].value, "%s", pairs[i][0]);
        st->map[st->n_map++].tier = k;
    }
    t->classify[2].kind = SL_RULE_TENANT_DEFAULT;
}

void sl_tenancy_init(struct sl_tenancy *c)
{
    struct tenancy t = {0};
    default_tiers(&t);
    default_rules(&t);
    memset(c, 0, sizeof *c);
    c->tiers = t.tiers;
    c->n_tiers = t.n_tiers;
    c->classify = t.classify;
    c->n_classify = t.n_classify;
    c->admission = true;
}

/* The sections' arrays; the keys, the admission switch and the state stay. */
static void sections_free(struct sl_tenancy *c)
{
    free(c->tiers);
    free(c->tenants);
    rules_free(c->classify, c->n_classify);
    c->tiers = NULL;
    c->tenants = NULL;
    c->classify = NULL;
    c->n_tiers = c->n_tenants = c->n_classify = 0;
}

void sl_tenancy_dispose(struct sl_tenancy *c)
{
    sl_admit_state_free(c->state);
    sections_free(c);
    memset(c, 0, sizeof *c);
}

/* A configuration name shown in an error: printable ASCII, clipped. */
static const char *shown(const char *s, char buf[48])
{
    sl_admit_quote(buf, 48, s, strlen(s));
    return buf;
}

static bool is_comment(const char *key)
{
    return strncmp(key, "//", 2) == 0;
}

static bool valid_tier_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > SL_TIER_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

static bool valid_tenant_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > SL_TENANT_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < ' ' || s[i] >= 0x7f || s[i] == '"' || s[i] == '\\')
            return false;
    return true;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        return SL_EINVAL;                                                                          \
    } while (0)

static int int_field(json_t *obj, const char *tier, const char *key, long min, long max, int *out,
                     char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        FAIL("tiers.%s.%s: missing (every tier gives priority, weight, ttft_slo_ms and "
             "tpot_slo_ms)",
             tier, key);
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        FAIL("tiers.%s.%s: must be an integer from %ld to %ld", tier, key, min, max);
    *out = (int)json_integer_value(v);
    return SL_OK;
}

/* An optional integer key of a tier or tenant: absent leaves *out alone; null is `none` when
 * none_ok (no limit). */
static int opt_int(json_t *obj, const char *path, const char *key, long long min, long long max,
                   bool none_ok, long long none, long long *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return SL_OK;
    if (none_ok && json_is_null(v)) {
        *out = none;
        return SL_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
        FAIL("%s.%s: must be an integer from %lld to %lld%s", path, key, min, max,
             none_ok ? ", or null for no limit" : "");
    *out = json_integer_value(v);
    return SL_OK;
}

/* An optional number key at path: absent leaves *out alone; else a number in (min, max]
 * (min itself when min_ok). */
static int opt_num(json_t *obj, const char *path, const char *key, double min, bool min_ok,
                   double max, float *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v)
        return SL_OK;
    double x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(x <= max && (x > min || (min_ok && x == min))))
        FAIL("%s.%s: must be a number %s %g and at most %g", path, key, min_ok ? "from" : "above",
             min, max);
    *out = (float)x;
    return SL_OK;
}

/* A tier's fairness between its tenants: "fairness" ("vtc", the default, or "fcfs") and
 * "vtc_weights" ({"input", "output", "cached"}: a prompt token's, a generated token's and a
 * prompt token the prefix cache gave's weight in the counters, 1, 2 and 0 by default; input and
 * output not both 0). */
static int load_fairness(struct sl_tier *tr, json_t *tv, char *err, size_t errlen)
{
    char path[64], b[48];
    const char *name = tr->sched.name;
    tr->sched.fairness = SL_SCHED_VTC;
    tr->sched.w_in = 1;
    tr->sched.w_out = 2;
    tr->sched.w_cached = 0;
    json_t *f = json_object_get(tv, "fairness");
    if (f) {
        const char *s = json_is_string(f) ? json_string_value(f) : "";
        if (strcmp(s, "vtc") == 0)
            tr->sched.fairness = SL_SCHED_VTC;
        else if (strcmp(s, "fcfs") == 0)
            tr->sched.fairness = SL_SCHED_FCFS;
        else
            FAIL("tiers.%s.fairness: must be \"vtc\" (virtual token counters between its "
                 "tenants) or \"fcfs\" (arrival order), not %s",
                 name, json_is_string(f) ? shown(s, b) : "a non-string");
    }
    json_t *w = json_object_get(tv, "vtc_weights");
    if (!w)
        return SL_OK;
    snprintf(path, sizeof path, "tiers.%s.vtc_weights", name);
    if (!json_is_object(w))
        FAIL("%s: must be an object {\"input\": 1, \"output\": 2, \"cached\": 0}", path);
    const char *k;
    json_t *kv;
    json_object_foreach(w, k, kv)
    {
        if (!is_comment(k) && strcmp(k, "input") != 0 && strcmp(k, "output") != 0 &&
            strcmp(k, "cached") != 0)
            FAIL("%s.%s: unknown key (input, output, cached)", path, shown(k, b));
    }
    int st;
    if ((st = opt_num(w, path, "input", 0, true, 1000, &tr->sched.w_in, err, errlen)) ||
        (st = opt_num(w, path, "output", 0, true, 1000, &tr->sched.w_out, err, errlen)) ||
        (st = opt_num(w, path, "cached", 0, true, 1000, &tr->sched.w_cached, err, errlen)))
        return st;
    if (tr->sched.w_in == 0 && tr->sched.w_out == 0)
        FAIL("%s: input and output cannot both be 0 (nothing would be counted)", path);
    return SL_OK;
}

static const char steps_help[] = "cap_max_tokens:N, demote:TIER, model:NAME, queue:MS, reject";

/* The names of the served models, which "model:NAME" steps refer to (NULL for a model without
 * one). */
struct models {
    const char *const *names;
    int n;
};

static bool model_named(const struct models *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (m->names[i] && strcmp(m->names[i], name) == 0)
            return true;
    return false;
}

/* One overload step as the file spells it; a demote target's name is kept in step->model until
 * every tier is known. */
static int parse_step(const char *path, int i, json_t *v, struct sl_overload_step *step,
                      const struct models *c, char *err, size_t errlen)
{
    char b[48];
    if (!json_is_string(v))
        FAIL("%s.overload[%d]: must be a string (%s)", path, i, steps_help);
    const char *s = json_string_value(v);
    memset(step, 0, sizeof *step);
    const char *colon = strchr(s, ':');
    size_t kl = colon ? (size_t)(colon - s) : strlen(s);
    const char *arg = colon ? colon + 1 : NULL;
    char *end;
    if (kl == 6 && strncmp(s, "reject", 6) == 0 && !arg) {
        step->kind = SL_OVERLOAD_REJECT;
    } else if (kl == 14 && strncmp(s, "cap_max_tokens", 14) == 0 && arg) {
        long n = strtol(arg, &end, 10);
        if (!*arg || *end || n < 1 || n > (1 << 20))
            FAIL("%s.overload[%d]: \"%s\": the cap must be an integer from 1 to %d", path, i,
                 shown(s, b), 1 << 20);
        step->kind = SL_OVERLOAD_CAP_MAX_TOKENS;
        step->arg = (int)n;
    } else if (kl == 5 && strncmp(s, "queue", 5) == 0 && arg) {
        long n = strtol(arg, &end, 10);
        if (!*arg || *end || n < 1 || n > 600000)
            FAIL("%s.overload[%d]: \"%s\": the wait must be 1 to 600000 ms", path, i, shown(s, b));
        step->kind = SL_OVERLOAD_QUEUE;
        step->arg = (int)n;
    } else if (kl == 6 && strncmp(s, "demote", 6) == 0 && arg) {
        if (!valid_tier_name(arg))
            FAIL("%s.overload[%d]: \"%s\": not a tier name", path, i, shown(s, b));
        step->kind = SL_OVERLOAD_DEMOTE;
        snprintf(step->model, sizeof step->model, "%s", arg);
    } else if (kl == 5 && strncmp(s, "model", 5) == 0 && arg) {
        if (!model_named(c, arg))
            FAIL("%s.overload[%d]: \"%s\": no model named \"%s\" in \"models\"", path, i,
                 shown(s, b), arg);
        step->kind = SL_OVERLOAD_MODEL;
        snprintf(step->model, sizeof step->model, "%s", arg);
    } else {
        FAIL("%s.overload[%d]: unknown step \"%s\" (%s)", path, i, shown(s, b), steps_help);
    }
    return SL_OK;
}

/* A tier's admission keys (token_rate, burst, max_queue_requests, max_queue_tokens, overload,
 * overload_status). Demote targets are resolved by resolve_demotes once all tiers are read. */
static int load_tier_admission(struct sl_tier *tr, json_t *tv, const struct models *c, char *err,
                               size_t errlen)
{
    char path[64];
    snprintf(path, sizeof path, "tiers.%s", tr->sched.name);
    admission_defaults(tr);
    long long q = tr->max_queue_requests;
    int st;
    if ((st = opt_int(tv, path, "token_rate", 0, 1000000000LL, false, 0, &tr->token_rate, err,
                      errlen)) ||
        (st = opt_int(tv, path, "burst", 1, 1000000000000LL, false, 0, &tr->burst, err, errlen)) ||
        (st = opt_int(tv, path, "max_queue_requests", 0, 1000000, true, -1, &q, err, errlen)) ||
        (st = opt_int(tv, path, "max_queue_tokens", 0, 1000000000000LL, true, -1,
                      &tr->max_queue_tokens, err, errlen)))
        return st;
    tr->max_queue_requests = (int)q;
    if (tr->burst && !tr->token_rate)
        FAIL("%s.burst: needs token_rate (the bucket's refill rate)", path);
    if (tr->token_rate && !tr->burst)
        tr->burst = tr->token_rate; /* a second's worth at once */
    json_t *ov = json_object_get(tv, "overload");
    if (ov) {
        if (!json_is_array(ov) || json_array_size(ov) < 1 || json_array_size(ov) > SL_OVERLOAD_MAX)
            FAIL("%s.overload: must be an array of 1 to %d steps (%s)", path, SL_OVERLOAD_MAX,
                 steps_help);
        tr->n_overload = 0;
        for (size_t i = 0; i < json_array_size(ov); i++) {
            if (tr->n_overload > 0 && tr->overload[tr->n_overload - 1].kind == SL_OVERLOAD_REJECT)
                FAIL("%s.overload[%zu]: never reached, \"reject\" at %s.overload[%zu] ends the "
                     "policy",
                     path, i, path, i - 1);
            if ((st = parse_step(path, (int)i, json_array_get(ov, i), &tr->overload[i], c, err,
                                 errlen)))
                return st;
            tr->n_overload++;
        }
    }
    json_t *os = json_object_get(tv, "overload_status");
    if (os) {
        if (!json_is_integer(os) ||
            (json_integer_value(os) != 429 && json_integer_value(os) != 503))
            FAIL("%s.overload_status: must be 503 (server_is_overloaded, the default) or 429",
                 path);
        tr->overload_status = (int)json_integer_value(os);
    }
    return SL_OK;
}

static int resolve_demotes(struct tenancy *t, char *err, size_t errlen)
{
    for (int i = 0; i < t->n_tiers; i++) {
        struct sl_tier *tr = &t->tiers[i];
        for (int k = 0; k < tr->n_overload; k++) {
            struct sl_overload_step *step = &tr->overload[k];
            if (step->kind != SL_OVERLOAD_DEMOTE)
                continue;
            int target = find_in(t, step->model);
            if (target < 0)
                FAIL("tiers.%s.overload[%d]: \"demote:%s\": no tier \"%s\" in \"tiers\"",
                     tr->sched.name, k, step->model, step->model);
            if (target == i)
                FAIL("tiers.%s.overload[%d]: \"demote:%s\" demotes the tier to itself",
                     tr->sched.name, k, step->model);
            step->arg = target;
            step->model[0] = '\0';
        }
    }
    return SL_OK;
}

static int load_tiers(struct tenancy *t, json_t *v, const struct models *c, char *err,
                      size_t errlen)
{
    char b[48];
    if (!json_is_object(v) || json_object_size(v) == 0)
        FAIL("tiers: must be a non-empty object of tiers keyed by name");
    size_t n = 0;
    const char *name;
    json_t *tv;
    json_object_foreach(v, name, tv)
    {
        if (!is_comment(name))
            n++;
    }
    if (n == 0)
        FAIL("tiers: must be a non-empty object of tiers keyed by name");
    if (n > SL_TIERS_MAX)
        FAIL("tiers: %zu tiers, at most %d", n, SL_TIERS_MAX);
    t->tiers = sl_xcalloc(n, sizeof *t->tiers);
    json_object_foreach(v, name, tv)
    {
        if (is_comment(name))
            continue;
        if (!valid_tier_name(name))
            FAIL("tiers.%s: a tier name is 1 to %d of A-Z a-z 0-9 _ . -", shown(name, b),
                 SL_TIER_NAME_MAX);
        if (!json_is_object(tv))
            FAIL("tiers.%s: must be an object", name);
        struct sl_tier *tr = &t->tiers[t->n_tiers];
        snprintf(tr->sched.name, sizeof tr->sched.name, "%s", name);
        const char *k;
        json_t *kv;
        static const char *const known[] = {
            "priority", "weight",      "ttft_slo_ms",     "tpot_slo_ms",        "token_rate",
            "burst",    "overload",    "overload_status", "max_queue_requests", "max_queue_tokens",
            "fairness", "vtc_weights", "isolation_ms",
        };
        json_object_foreach(tv, k, kv)
        {
            bool ok = is_comment(k);
            for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++)
                ok = strcmp(k, known[i]) == 0;
            if (!ok)
                FAIL("tiers.%s.%s: unknown key", name, shown(k, b));
        }
        int st;
        if ((st = int_field(tv, name, "priority", 0, 1000, &tr->sched.priority, err, errlen)) ||
            (st = int_field(tv, name, "weight", 1, 1000, &tr->sched.weight, err, errlen)) ||
            (st = int_field(tv, name, "ttft_slo_ms", 1, 3600000, &tr->sched.ttft_slo_ms, err,
                            errlen)) ||
            (st = int_field(tv, name, "tpot_slo_ms", 1, 600000, &tr->sched.tpot_slo_ms, err,
                            errlen)) ||
            (st = load_tier_admission(tr, tv, c, err, errlen)) ||
            (st = load_fairness(tr, tv, err, errlen)))
            return st;
        char path[64];
        snprintf(path, sizeof path, "tiers.%s", name);
        tr->sched.isolation_ms = ISOLATION_MS_DEFAULT;
        if ((st = opt_num(tv, path, "isolation_ms", 0, true, 10000, &tr->sched.isolation_ms, err,
                          errlen)))
            return st;
        t->n_tiers++;
    }
    return resolve_demotes(t, err, errlen);
}

/* A tier name at `path` (a JSON string) resolved against t's tiers. */
static int tier_ref(const struct tenancy *t, json_t *v, const char *path, int *out, char *err,
                    size_t errlen)
{
    char b[48];
    if (!json_is_string(v))
        FAIL("%s: must be a tier name (a string)", path);
    int k = find_in(t, json_string_value(v));
    if (k < 0) {
        char list[256];
        size_t n = 0;
        list[0] = '\0';
        for (int i = 0; i < t->n_tiers && n < sizeof list; i++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
                                  t->tiers[i].sched.name);
        FAIL("%s: unknown tier \"%s\" (the tiers are: %s)", path, shown(json_string_value(v), b),
             list);
    }
    *out = k;
    return SL_OK;
}

#define BUDGET_MAX 1e9 /* units of the currency: 2^63 nano-units are 9.2e9 */

/* "budget": null, or {"amount", "period" ("month" by default), "soft_pct" (80), "month_day"
 * (1)}. */
static int load_budget(struct sl_tenant *tn, json_t *v, int i, char *err, size_t errlen)
{
    tn->budget = 0;
    tn->budget_period = SL_USAGE_MONTH;
    tn->budget_soft_pct = 80;
    tn->budget_month_day = 1;
    if (!v || json_is_null(v))
        return SL_OK;
    if (!json_is_object(v))
        FAIL("tenants[%d].budget: must be null or an object {\"amount\", \"period\", "
             "\"soft_pct\", \"month_day\"}",
             i);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x)
    {
        if (is_comment(k) || strcmp(k, "amount") == 0 || strcmp(k, "period") == 0 ||
            strcmp(k, "soft_pct") == 0 || strcmp(k, "month_day") == 0)
            continue;
        char b[48];
        FAIL("tenants[%d].budget.%s: unknown key (amount, period, soft_pct, month_day)", i,
             shown(k, b));
    }
    json_t *amount = json_object_get(v, "amount");
    double a = json_is_number(amount) ? json_number_value(amount) : -1;
    if (!(a > 0 && a <= BUDGET_MAX))
        FAIL("tenants[%d].budget.amount: must be a number above 0 and at most %g (in the "
             "configuration's currency)",
             i, BUDGET_MAX);
    tn->budget = (int64_t)llround(a * (double)SL_USAGE_NANO);
    json_t *p = json_object_get(v, "period");
    if (p) {
        int period = json_is_string(p) ? sl_usage_period_parse(json_string_value(p)) : -1;
        if (period < 0)
            FAIL("tenants[%d].budget.period: must be \"day\", \"week\", \"month\" or "
                 "\"total\"",
                 i);
        tn->budget_period = period;
    }
    char path[48];
    snprintf(path, sizeof path, "tenants[%d].budget", i);
    long long soft = 80, day = 1;
    int st;
    if ((st = opt_int(v, path, "soft_pct", 1, 100, false, 0, &soft, err, errlen)) ||
        (st = opt_int(v, path, "month_day", 1, 28, false, 0, &day, err, errlen)))
        return st;
    tn->budget_soft_pct = (int)soft;
    tn->budget_month_day = (int)day;
    return SL_OK;
}

static int load_tenant(struct tenancy *t, int i, json_t *v, char *err, size_t errlen)
{
    char b[48], path[64];
    struct sl_tenant *tn = &t->tenants[i];
    if (!json_is_object(v))
        FAIL("tenants[%d]: must be an object with name, key_sha256, tiers and default_tier", i);
    const char *k;
    json_t *kv;
    json_object_foreach(v, k, kv)
    {
        if (!is_comment(k) && strcmp(k, "name") != 0 && strcmp(k, "key_sha256") != 0 &&
            strcmp(k, "tiers") != 0 && strcmp(k, "default_tier") != 0 && strcmp(k, "rpm") != 0 &&
            strcmp(k, "tpm") != 0 && strcmp(k, "budget") != 0 && strcmp(k, "share") != 0)
            FAIL("tenants[%d].%s: unknown key", i, shown(k, b));
    }
    json_t *name = json_object_get(v, "name");
    if (!name)
        FAIL("tenants[%d].name: missing", i);
    if (!json_is_string(name) || !valid_tenant_name(json_string_value(name)))
        FAIL("tenants[%d].name: must be 1 to %d printable ASCII characters without '\"' or '\\'", i,
             SL_TENANT_NAME_MAX);
    snprintf(tn->name, sizeof tn->name, "%s", json_string_value(name));
    json_t *key = json_object_get(v, "key_sha256");
    if (!key)
        FAIL("tenants[%d].key_sha256: missing (the SHA-256 of the tenant's API key, e.g. from "
             "`printf %%s KEY | sha256sum`)",
             i);
    /* The value is never echoed: even a malformed hash may be a pasted key. */
    if (!json_is_string(key) || !sl_tenant_hex_decode(json_string_value(key), tn->key_sha256))
        FAIL("tenants[%d].key_sha256: must be 64 hex digits (the SHA-256 of the key, not the "
             "key)",
             i);
    json_t *tiers = json_object_get(v, "tiers");
    if (!tiers)
        FAIL("tenants[%d].tiers: missing", i);
    if (!json_is_array(tiers) || json_array_size(tiers) == 0)
        FAIL("tenants[%d].tiers: must be a non-empty array of tier names", i);
    size_t j;
    json_t *tv;
    json_array_foreach(tiers, j, tv)
    {
        int k2;
        snprintf(path, sizeof path, "tenants[%d].tiers[%zu]", i, j);
        int st = tier_ref(t, tv, path, &k2, err, errlen);
        if (st)
            return st;
        if (tn->tiers >> k2 & 1u)
            FAIL("%s: \"%s\" is listed twice", path, t->tiers[k2].sched.name);
        tn->tiers |= 1u << k2;
    }
    json_t *def = json_object_get(v, "default_tier");
    if (!def)
        FAIL("tenants[%d].default_tier: missing", i);
    snprintf(path, sizeof path, "tenants[%d].default_tier", i);
    int st = tier_ref(t, def, path, &tn->default_tier, err, errlen);
    if (st)
        return st;
    if (!(tn->tiers >> tn->default_tier & 1u))
        FAIL("tenants[%d].default_tier: \"%s\" is not in tenants[%d].tiers", i,
             t->tiers[tn->default_tier].sched.name, i);
    snprintf(path, sizeof path, "tenants[%d]", i);
    if ((st = opt_int(v, path, "rpm", 0, 1000000000LL, false, 0, &tn->rpm, err, errlen)) ||
        (st = opt_int(v, path, "tpm", 0, 1000000000000LL, false, 0, &tn->tpm, err, errlen)) ||
        (st = load_budget(tn, json_object_get(v, "budget"), i, err, errlen)))
        return st;
    tn->share = 1;
    if ((st = opt_num(v, path, "share", 0, false, 1000, &tn->share, err, errlen)))
        return st;
    for (int o = 0; o < i; o++) {
        if (strcmp(t->tenants[o].name, tn->name) == 0)
            FAIL("tenants[%d].name: \"%s\" is also tenants[%d].name", i, tn->name, o);
        if (CRYPTO_memcmp(t->tenants[o].key_sha256, tn->key_sha256, 32) == 0)
            FAIL("tenants[%d].key_sha256: the same key as tenants[%d] (\"%s\")", i, o,
                 t->tenants[o].name);
    }
    return SL_OK;
}

static int load_tenants(struct tenancy *t, json_t *v, char *err, size_t errlen)
{
    if (!json_is_array(v))
        FAIL("tenants: must be an array of tenants");
    if (json_array_size(v) > TENANTS_MAX)
        FAIL("tenants: %zu tenants, at most %d", json_array_size(v), TENANTS_MAX);
    t->n_tenants = (int)json_array_size(v);
    t->tenants = t->n_tenants ? sl_xcalloc((size_t)t->n_tenants, sizeof *t->tenants) : NULL;
    for (int i = 0; i < t->n_tenants; i++) {
        int st = load_tenant(t, i, json_array_get(v, (size_t)i), err, errlen);
        if (st)
            return st;
    }
    return SL_OK;
}

/* The only key of a one-key rule, or NULL when there are others (comments aside). */
static const char *other_key(json_t *rule, const char *mine)
{
    const char *k;
    json_t *v;
    json_object_foreach(rule, k, v)
    {
        if (!is_comment(k) && strcmp(k, mine) != 0)
            return k;
    }
    return NULL;
}

static int load_rule(struct tenancy *t, int i, json_t *v, int *seen_header, int *seen_st, char *err,
                     size_t errlen)
{
    char b[48], path[96];
    struct sl_tier_rule *r = &t->classify[i];
    r->stream = -1;
    r->max_tokens_above = -1;
    r->tier = -1;
    if (!json_is_object(v))
        FAIL("classify[%d]: must be an object (a rule)", i);
    const char *other;
    json_t *x;
    if ((x = json_object_get(v, "header"))) {
        if ((other = other_key(v, "header")))
            FAIL("classify[%d].%s: a \"header\" rule takes no other key", i, shown(other, b));
        if (!json_is_string(x) || strcasecmp(json_string_value(x), SL_TIER_HEADER) != 0)
            FAIL("classify[%d].header: must be \"" SL_TIER_HEADER "\" (the one tier header)", i);
        if (*seen_header >= 0)
            FAIL("classify[%d]: a second \"header\" rule (after classify[%d]) never matches", i,
                 *seen_header);
        *seen_header = i;
        r->kind = SL_RULE_HEADER;
        return SL_OK;
    }
    if ((x = json_object_get(v, "service_tier"))) {
        if ((other = other_key(v, "service_tier")))
            FAIL("classify[%d].%s: a \"service_tier\" rule takes no other key", i, shown(other, b));
        if (!json_is_object(x))
            FAIL("classify[%d].service_tier: must be an object mapping service_tier values to "
                 "tier names (or null for no preference)",
                 i);
        if (json_object_size(x) > MAP_MAX)
            FAIL("classify[%d].service_tier: at most %d values", i, MAP_MAX);
        if (*seen_st >= 0)
            FAIL("classify[%d]: a second \"service_tier\" rule (after classify[%d]) never "
                 "matches",
                 i, *seen_st);
        *seen_st = i;
        r->kind = SL_RULE_SERVICE_TIER;
        r->map = json_object_size(x) ? sl_xcalloc(json_object_size(x), sizeof *r->map) : NULL;
        const char *k;
        json_t *mv;
        json_object_foreach(x, k, mv)
        {
            if (is_comment(k))
                continue;
            if (!k[0] || strlen(k) > SL_TIER_NAME_MAX)
                FAIL("classify[%d].service_tier: a value must be 1 to %d characters", i,
                     SL_TIER_NAME_MAX);
            struct sl_service_tier_map *m = &r->map[r->n_map];
            snprintf(m->value, sizeof m->value, "%s", k);
            m->tier = -1;
            snprintf(path, sizeof path, "classify[%d].service_tier.%s", i, shown(k, b));
            if (!json_is_null(mv)) {
                int st = tier_ref(t, mv, path, &m->tier, err, errlen);
                if (st)
                    return st;
            }
            r->n_map++;
        }
        return SL_OK;
    }
    if ((x = json_object_get(v, "tenant_default"))) {
        if ((other = other_key(v, "tenant_default")))
            FAIL("classify[%d].%s: a \"tenant_default\" rule takes no other key", i,
                 shown(other, b));
        if (!json_is_true(x))
            FAIL("classify[%d].tenant_default: must be true", i);
        r->kind = SL_RULE_TENANT_DEFAULT;
        return SL_OK;
    }
    r->kind = SL_RULE_MATCH;
    const char *k;
    json_object_foreach(v, k, x)
    {
        if (is_comment(k))
            continue;
        if (strcmp(k, "tier") == 0) {
            snprintf(path, sizeof path, "classify[%d].tier", i);
            int st = tier_ref(t, x, path, &r->tier, err, errlen);
            if (st)
                return st;
        } else if (strcmp(k, "path") == 0) {
            if (!json_is_string(x) || json_string_value(x)[0] != '/' ||
                json_string_length(x) > SL_RULE_PATH_MAX)
                FAIL("classify[%d].path: must be a path starting with '/', at most %d bytes", i,
                     SL_RULE_PATH_MAX);
            r->path = sl_xstrdup(json_string_value(x));
        } else if (strcmp(k, "stream") == 0) {
            if (!json_is_boolean(x))
                FAIL("classify[%d].stream: must be true or false", i);
            r->stream = json_is_true(x);
        } else if (strcmp(k, "max_tokens_above") == 0) {
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                json_integer_value(x) > (1 << 30))
                FAIL("classify[%d].max_tokens_above: must be an integer from 0 to %d", i, 1 << 30);
            r->max_tokens_above = json_integer_value(x);
        } else {
            FAIL("classify[%d].%s: unknown key (a rule is {\"header\"}, {\"service_tier\"}, "
                 "{\"tenant_default\"}, or \"tier\" with conditions \"path\", \"stream\", "
                 "\"max_tokens_above\")",
                 i, shown(k, b));
        }
    }
    if (r->tier < 0)
        FAIL("classify[%d].tier: missing (a rule with conditions \"path\", \"stream\" or "
             "\"max_tokens_above\" names the tier they give)",
             i);
    return SL_OK;
}

static int load_rules(struct tenancy *t, json_t *v, char *err, size_t errlen)
{
    if (!json_is_array(v))
        FAIL("classify: must be an array of rules, tried in order");
    if (json_array_size(v) > RULES_MAX)
        FAIL("classify: %zu rules, at most %d", json_array_size(v), RULES_MAX);
    size_t n = json_array_size(v);
    t->classify = n ? sl_xcalloc(n, sizeof *t->classify) : NULL;
    int seen_header = -1, seen_st = -1, end = -1;
    for (size_t i = 0; i < n; i++) {
        if (end >= 0)
            FAIL("classify[%zu]: never reached, \"tenant_default\" at classify[%d] ends the list",
                 i, end);
        /* Counted before parsing so a failure frees what this rule allocated. */
        t->n_classify = (int)i + 1;
        int st = load_rule(t, (int)i, json_array_get(v, i), &seen_header, &seen_st, err, errlen);
        if (st)
            return st;
        if (t->classify[i].kind == SL_RULE_TENANT_DEFAULT)
            end = (int)i;
    }
    return SL_OK;
}

/* Tenants kept across a change of tiers: the same names, new indexes. */
static int remap_tenants(struct tenancy *t, const struct sl_tenancy *old, char *err, size_t errlen)
{
    t->n_tenants = old->n_tenants;
    t->tenants = t->n_tenants ? sl_xmalloc(sizeof *t->tenants * (size_t)t->n_tenants) : NULL;
    for (int i = 0; i < old->n_tenants; i++) {
        struct sl_tenant *tn = &t->tenants[i];
        *tn = old->tenants[i];
        tn->tiers = 0;
        for (int k = 0; k < old->n_tiers; k++) {
            if (!(old->tenants[i].tiers >> k & 1u))
                continue;
            int nk = find_in(t, old->tiers[k].sched.name);
            if (nk < 0)
                FAIL("tenants[%d].tiers: tier \"%s\" is not among the new \"tiers\"", i,
                     old->tiers[k].sched.name);
            tn->tiers |= 1u << nk;
        }
        tn->default_tier = find_in(t, old->tiers[old->tenants[i].default_tier].sched.name);
    }
    return SL_OK;
}

static struct sl_tier_rule *rules_copy(const struct sl_tier_rule *r, int n)
{
    if (!n)
        return NULL;
    struct sl_tier_rule *c = sl_xmalloc(sizeof *c * (size_t)n);
    memcpy(c, r, sizeof *c * (size_t)n);
    for (int i = 0; i < n; i++) {
        if (r[i].path)
            c[i].path = sl_xstrdup(r[i].path);
        if (r[i].n_map) {
            c[i].map = sl_xmalloc(sizeof *c[i].map * (size_t)r[i].n_map);
            memcpy(c[i].map, r[i].map, sizeof *c[i].map * (size_t)r[i].n_map);
        } else {
            c[i].map = NULL;
        }
    }
    return c;
}

static int build(struct tenancy *t, const struct sl_tenancy *c, const struct models *models,
                 json_t *tiers, json_t *tenants, json_t *classify, json_t *admin, char *err,
                 size_t errlen)
{
    int st;
    if (tiers) {
        if ((st = load_tiers(t, tiers, models, err, errlen)))
            return st;
    } else {
        t->n_tiers = c->n_tiers;
        t->tiers = sl_xmalloc(sizeof *t->tiers * (size_t)c->n_tiers);
        memcpy(t->tiers, c->tiers, sizeof *t->tiers * (size_t)c->n_tiers);
    }
    if (tenants)
        st = load_tenants(t, tenants, err, errlen);
    else if (tiers)
        st = remap_tenants(t, c, err, errlen);
    else {
        t->n_tenants = c->n_tenants;
        t->tenants = c->n_tenants ? sl_xmalloc(sizeof *t->tenants * (size_t)c->n_tenants) : NULL;
        if (c->n_tenants)
            memcpy(t->tenants, c->tenants, sizeof *t->tenants * (size_t)c->n_tenants);
        st = SL_OK;
    }
    if (st)
        return st;
    if (classify)
        st = load_rules(t, classify, err, errlen);
    else if (tiers)
        default_rules(t);
    else {
        t->classify = rules_copy(c->classify, c->n_classify);
        t->n_classify = c->n_classify;
    }
    if (st)
        return st;
    t->has_admin_key = c->has_admin_key;
    memcpy(t->admin_key_sha256, c->admin_key_sha256, 32);
    if (admin) {
        if (json_is_null(admin)) {
            t->has_admin_key = false;
            memset(t->admin_key_sha256, 0, 32);
        } else if (!json_is_string(admin) ||
                   !sl_tenant_hex_decode(json_string_value(admin), t->admin_key_sha256)) {
            FAIL("admin_key_sha256: must be 64 hex digits (the SHA-256 of the admin key, not the "
                 "key) or null");
        } else {
            t->has_admin_key = true;
        }
    }
    if (t->has_admin_key) {
        long k =
            sl_tenant_hash_find(t->admin_key_sha256, t->n_tenants ? t->tenants[0].key_sha256 : NULL,
                                sizeof t->tenants[0], (size_t)t->n_tenants);
        if (k >= 0)
            FAIL("admin_key_sha256: the same key as tenants[%ld] (\"%s\"); the admin key must be "
                 "a key of its own",
                 k, t->tenants[k].name);
    }
    return SL_OK;
}

enum sl_status sl_tenancy_load(struct sl_tenancy *c, const char *const *models, int n_models,
                               json_t *tiers, json_t *tenants, json_t *classify,
                               json_t *admin_key_sha256, char *err, size_t errlen)
{
    if (!tiers && !tenants && !classify && !admin_key_sha256)
        return SL_OK;
    struct tenancy t = {0};
    struct models m = {models, n_models};
    int st = build(&t, c, &m, tiers, tenants, classify, admin_key_sha256, err, errlen);
    if (st) {
        tenancy_dispose(&t);
        return st;
    }
    sections_free(c);
    c->tiers = t.tiers;
    c->n_tiers = t.n_tiers;
    c->tenants = t.tenants;
    c->n_tenants = t.n_tenants;
    c->classify = t.classify;
    c->n_classify = t.n_classify;
    c->has_admin_key = t.has_admin_key;
    memcpy(c->admin_key_sha256, t.admin_key_sha256, 32);
    return SL_OK;
}

enum sl_status sl_tenancy_validate(const struct sl_tenancy *c, const char *const *models,
                                   int n_models, char *err, size_t errlen)
{
    struct models m = {models, n_models};
    if (c->n_tiers < 1 || c->n_tiers > SL_TIERS_MAX || !c->tiers)
        FAIL("tiers: between 1 and %d tiers are needed", SL_TIERS_MAX);
    uint32_t all = c->n_tiers == 32 ? UINT32_MAX : (1u << c->n_tiers) - 1;
    for (int i = 0; i < c->n_tenants; i++) {
        const struct sl_tenant *t = &c->tenants[i];
        if (!t->tiers || (t->tiers & ~all))
            FAIL("tenants[%d].tiers: every tier must be one of \"tiers\"", i);
        if (t->default_tier < 0 || t->default_tier >= c->n_tiers ||
            !(t->tiers >> t->default_tier & 1u))
            FAIL("tenants[%d].default_tier: must be one of tenants[%d].tiers", i, i);
    }
    for (int i = 0; i < c->n_tiers; i++) {
        const struct sl_tier *t = &c->tiers[i];
        if (t->n_overload < 1 || t->n_overload > SL_OVERLOAD_MAX)
            FAIL("tiers.%s.overload: 1 to %d steps", t->sched.name, SL_OVERLOAD_MAX);
        for (int k = 0; k < t->n_overload; k++) {
            const struct sl_overload_step *step = &t->overload[k];
            if (step->kind == SL_OVERLOAD_DEMOTE &&
                (step->arg < 0 || step->arg >= c->n_tiers || step->arg == i))
                FAIL("tiers.%s.overload[%d]: demote: must name another of \"tiers\"", t->sched.name,
                     k);
            if (step->kind == SL_OVERLOAD_MODEL && !model_named(&m, step->model))
                FAIL("tiers.%s.overload[%d]: \"model:%s\": no model named \"%s\" in "
                     "\"models\"",
                     t->sched.name, k, step->model, step->model);
        }
        if (t->overload_status != 429 && t->overload_status != 503)
            FAIL("tiers.%s.overload_status: must be 503 or 429", t->sched.name);
    }
    for (int i = 0; i < c->n_classify; i++) {
        const struct sl_tier_rule *r = &c->classify[i];
        if (r->kind == SL_RULE_MATCH && (r->tier < 0 || r->tier >= c->n_tiers))
            FAIL("classify[%d].tier: must be one of \"tiers\"", i);
        for (int j = 0; j < r->n_map; j++)
            if (r->map[j].tier < -1 || r->map[j].tier >= c->n_tiers)
                FAIL("classify[%d].service_tier.%s: must be one of \"tiers\"", i, r->map[j].value);
    }
    return SL_OK;
}

void sl_tenancy_to_json(const struct sl_tenancy *c, json_t *root)
{
    json_t *tiers = json_object();
    for (int i = 0; i < c->n_tiers; i++) {
        const struct sl_tier *t = &c->tiers[i];
        json_t *o = json_pack("{s:i, s:i, s:i, s:i}", "priority", t->sched.priority, "weight",
                              t->sched.weight, "ttft_slo_ms", t->sched.ttft_slo_ms, "tpot_slo_ms",
                              t->sched.tpot_slo_ms);
        json_object_set_new(o, "token_rate", json_integer(t->token_rate));
        if (t->token_rate)
            json_object_set_new(o, "burst", json_integer(t->burst));
        json_object_set_new(o, "max_queue_requests",
                            t->max_queue_requests < 0 ? json_null()
                                                      : json_integer(t->max_queue_requests));
        json_object_set_new(o, "max_queue_tokens",
                            t->max_queue_tokens < 0 ? json_null()
                                                    : json_integer(t->max_queue_tokens));
        json_t *ov = json_array();
        for (int k = 0; k < t->n_overload; k++) {
            char step[128];
            sl_tier_overload_format(c, &t->overload[k], step, sizeof step);
            json_array_append_new(ov, json_string(step));
        }
        json_object_set_new(o, "overload", ov);
        json_object_set_new(o, "overload_status", json_integer(t->overload_status));
        json_object_set_new(o, "isolation_ms", json_real(t->sched.isolation_ms));
        json_object_set_new(o, "fairness",
                            json_string(t->sched.fairness == SL_SCHED_FCFS ? "fcfs" : "vtc"));
        json_object_set_new(o, "vtc_weights",
                            json_pack("{s:f,s:f,s:f}", "input", (double)t->sched.w_in, "output",
                                      (double)t->sched.w_out, "cached", (double)t->sched.w_cached));
        json_object_set_new(tiers, t->sched.name, o);
    }
    json_object_set_new(root, "tiers", tiers);

    json_t *tenants = json_array();
    for (int i = 0; i < c->n_tenants; i++) {
        const struct sl_tenant *t = &c->tenants[i];
        json_t *allowed_tiers = json_array();
        for (int k = 0; k < c->n_tiers; k++)
            if (t->tiers >> k & 1u)
                json_array_append_new(allowed_tiers, json_string(c->tiers[k].sched.name));
        json_t *o =
            json_pack("{s:s, s:s, s:o, s:s}", "name", t->name, "key_sha256", "<redacted>", "tiers",
                      allowed_tiers, "default_tier", c->tiers[t->default_tier].sched.name);
        if (t->rpm)
            json_object_set_new(o, "rpm", json_integer(t->rpm));
        if (t->tpm)
            json_object_set_new(o, "tpm", json_integer(t->tpm));
        json_object_set_new(o, "share", json_real(t->share));
        if (t->budget)
            json_object_set_new(
                o, "budget",
                json_pack("{s:f,s:s,s:i,s:i}", "amount", (double)t->budget / SL_USAGE_NANO,
                          "period", sl_usage_period_name((enum sl_usage_period)t->budget_period),
                          "soft_pct", t->budget_soft_pct, "month_day", t->budget_month_day));
        json_array_append_new(tenants, o);
    }
    json_object_set_new(root, "tenants", tenants);

    json_t *rules = json_array();
    for (int i = 0; i < c->n_classify; i++) {
        const struct sl_tier_rule *r = &c->classify[i];
        json_t *o = json_object();
        switch (r->kind) {
        case SL_RULE_HEADER: json_object_set_new(o, "header", json_string(SL_TIER_HEADER)); break;
        case SL_RULE_SERVICE_TIER: {
            json_t *m = json_object();
            for (int j = 0; j < r->n_map; j++)
                json_object_set_new(m, r->map[j].value,
                                    r->map[j].tier < 0
                                        ? json_null()
                                        : json_string(c->tiers[r->map[j].tier].sched.name));
            json_object_set_new(o, "service_tier", m);
            break;
        }
        case SL_RULE_MATCH:
            if (r->path)
                json_object_set_new(o, "path", json_string(r->path));
            if (r->stream >= 0)
                json_object_set_new(o, "stream", json_boolean(r->stream));
            if (r->max_tokens_above >= 0)
                json_object_set_new(o, "max_tokens_above", json_integer(r->max_tokens_above));
            json_object_set_new(o, "tier", json_string(c->tiers[r->tier].sched.name));
            break;
        case SL_RULE_TENANT_DEFAULT: json_object_set_new(o, "tenant_default", json_true()); break;
        }
        json_array_append_new(rules, o);
    }
    json_object_set_new(root, "classify", rules);
    json_object_set_new(root, "admin_key_sha256",
                        c->has_admin_key ? json_string("<redacted>") : json_null());
}

void sl_tier_overload_format(const struct sl_tenancy *c, const struct sl_overload_step *s,
                             char *out, size_t outlen)
{
    switch (s->kind) {
    case SL_OVERLOAD_CAP_MAX_TOKENS: snprintf(out, outlen, "cap_max_tokens:%d", s->arg); return;
    case SL_OVERLOAD_DEMOTE:
        snprintf(out, outlen, "demote:%s",
                 s->arg >= 0 && s->arg < c->n_tiers ? c->tiers[s->arg].sched.name : "?");
        return;
    case SL_OVERLOAD_MODEL: snprintf(out, outlen, "model:%s", s->model); return;
    case SL_OVERLOAD_QUEUE: snprintf(out, outlen, "queue:%d", s->arg); return;
    case SL_OVERLOAD_REJECT: break;
    }
    snprintf(out, outlen, "reject");
}
