/* Parsing what describes a run: length distributions, arrival shapes, classes (from --class or a
 * JSON file), --goodput, traces; and filling in what classes leave to the run. Every error names
 * the flag, key or file line it comes from. */
#include "bench_impl.h"

#include <jansson.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return SL_EINVAL;
}

/* A finite number that uses the whole string. */
static bool parse_num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static bool parse_rate(const char *s, double *out)
{
    if (strcasecmp(s, "inf") == 0 || strcasecmp(s, "infinity") == 0) {
        *out = INFINITY;
        return true;
    }
    return parse_num(s, out) && *out > 0;
}

static uint32_t *read_len_file(const char *path, size_t *n, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fail(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    uint32_t *v = NULL;
    size_t cap = 0, count = 0, line_no = 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        line_no++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *p = line + strspn(line, " \t\r\n");
        if (!*p)
            continue;
        char *end;
        errno = 0;
        unsigned long x = strtoul(p, &end, 10);
        end += strspn(end, " \t\r\n");
        if (*end || errno || x < 1 || x > SL_BENCH_LEN_MAX || *p == '-') {
            fail(err, errlen, "%s:%zu: expected a token count from 1 to %u", path, line_no,
                 SL_BENCH_LEN_MAX);
            free(v);
            fclose(f);
            return NULL;
        }
        if (count == cap) {
            cap = cap ? cap * 2 : 256;
            v = sl_xrealloc(v, cap * sizeof *v);
        }
        v[count++] = (uint32_t)x;
    }
    fclose(f);
    if (!count) {
        fail(err, errlen, "%s: no token counts in the file", path);
        free(v);
        return NULL;
    }
    *n = count;
    return v;
}

int sl_bench_len_parse(struct sl_bench_config *c, struct sl_bench_len *d, const char *text,
                       char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    snprintf(d->text, sizeof d->text, "%s", text);
    const char *usage = "expected fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA or file:PATH";
    if (strncmp(text, "file:", 5) == 0) {
        d->kind = SL_BENCH_LEN_FILE;
        uint32_t *v = read_len_file(text + 5, &d->n_values, err, errlen);
        if (!v)
            return SL_EINVAL;
        c->len_files = sl_xrealloc(c->len_files, (c->n_len_files + 1) * sizeof *c->len_files);
        c->len_files[c->n_len_files++] = v;
        d->values = v;
        return SL_OK;
    }
    char buf[96];
    snprintf(buf, sizeof buf, "%s", text);
    char *parts[4] = {0};
    int n = 0;
    for (char *save, *tok = strtok_r(buf, ":", &save); tok && n < 4;
         tok = strtok_r(NULL, ":", &save))
        parts[n++] = tok;
    double a = 0, b = 0;
    /* A bare number is fixed:N (so --input-len 128 reads naturally). */
    if (n == 1 && parse_num(parts[0], &a)) {
        d->kind = SL_BENCH_LEN_FIXED;
    } else if (n == 2 && strcmp(parts[0], "fixed") == 0 && parse_num(parts[1], &a)) {
        d->kind = SL_BENCH_LEN_FIXED;
    } else if (n == 3 && strcmp(parts[0], "uniform") == 0 && parse_num(parts[1], &a) &&
               parse_num(parts[2], &b)) {
        d->kind = SL_BENCH_LEN_UNIFORM;
        if (b < a)
            return fail(err, errlen, "%s: HI must be at least LO", text);
    } else if (n == 3 && strcmp(parts[0], "lognormal") == 0 && parse_num(parts[1], &a) &&
               parse_num(parts[2], &b)) {
        d->kind = SL_BENCH_LEN_LOGNORMAL;
        if (b < 0 || b > 5)
            return fail(err, errlen, "%s: SIGMA must be from 0 to 5", text);
    } else {
        return fail(err, errlen, "%s: %s", text, usage);
    }
    if (a < 1 || a > SL_BENCH_LEN_MAX || b > SL_BENCH_LEN_MAX * 1.0)
        return fail(err, errlen, "%s: token counts must be from 1 to %u", text, SL_BENCH_LEN_MAX);
    d->a = a;
    d->b = b;
    return SL_OK;
}

int sl_bench_arrival_parse(struct sl_bench_arrival *a, const char *text, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->burstiness = 1;
    double x, y;
    char buf[64];
    if (strcmp(text, "poisson") == 0) {
        a->kind = SL_BENCH_ARRIVAL_POISSON;
    } else if (strcmp(text, "constant") == 0) {
        a->kind = SL_BENCH_ARRIVAL_CONSTANT;
    } else if (strncmp(text, "gamma:", 6) == 0 && parse_num(text + 6, &x) && x > 0) {
        a->kind = SL_BENCH_ARRIVAL_GAMMA;
        a->burstiness = x;
    } else if (strncmp(text, "onoff:", 6) == 0 && strlen(text) < sizeof buf) {
        snprintf(buf, sizeof buf, "%s", text + 6);
        char *colon = strchr(buf, ':');
        if (!colon)
            return fail(err, errlen, "%s: expected onoff:ON_S:OFF_S", text);
        *colon = '\0';
        if (!parse_num(buf, &x) || !parse_num(colon + 1, &y) || x <= 0 || y < 0)
            return fail(err, errlen, "%s: ON_S must be above 0 and OFF_S at least 0", text);
        a->kind = SL_BENCH_ARRIVAL_ONOFF;
        a->on_s = x;
        a->off_s = y;
    } else {
        return fail(err, errlen,
                    "%s: expected poisson, constant, gamma:BURSTINESS or onoff:ON_S:OFF_S", text);
    }
    return SL_OK;
}

void sl_bench_class_init(struct sl_bench_class *k, const char *name)
{
    memset(k, 0, sizeof *k);
    k->name = name ? sl_xstrdup(name) : NULL;
    k->weight = 1;
    k->chat = -1;
    k->ignore_eos = -1;
    k->temperature = NAN;
    k->shared_prefix = -1;
    for (int i = 0; i < 3; i++)
        k->slo_ms[i] = NAN;
}

void sl_bench_class_dispose(struct sl_bench_class *k)
{
    free(k->name);
    free(k->tier);
    free(k->service_tier);
    free(k->tenant);
    free(k->key);
    free(k->model);
    free(k->path);
    memset(k, 0, sizeof *k);
}

static void set_str(char **dst, const char *v)
{
    free(*dst);
    *dst = sl_xstrdup(v);
}

/* Names that can be printed, put in a CSV cell and used as a JSON key without escaping. */
static bool valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return false;
    for (const char *p = s; *p; p++)
        if (!(('a' <= *p && *p <= 'z') || ('A' <= *p && *p <= 'Z') || ('0' <= *p && *p <= '9') ||
              strchr("_.-@/:", *p)))
            return false;
    return true;
}

/* Header values must not break the request head. */
static bool valid_header_value(const char *s)
{
    if (!*s || strlen(s) > 1024)
        return false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

static bool parse_bool(const char *v, int *out)
{
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes")) {
        *out = 1;
        return true;
    }
    if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no")) {
        *out = 0;
        return true;
    }
    return false;
}

int sl_bench_class_set(struct sl_bench_config *c, struct sl_bench_class *k, const char *key,
                       const char *value, char *err, size_t errlen)
{
    const char *cn = k->name ? k->name : "?";
    double x;
    if (!strcmp(key, "rate")) {
        if (!parse_rate(value, &k->rate))
            return fail(err, errlen, "class %s: rate: expected requests/s above 0, or inf", cn);
        k->rate_set = true;
    } else if (!strcmp(key, "weight")) {
        if (!parse_num(value, &x) || x <= 0)
            return fail(err, errlen, "class %s: weight: expected a number above 0", cn);
        k->weight = x;
    } else if (!strcmp(key, "arrival")) {
        char e2[200];
        if (sl_bench_arrival_parse(&k->arrival, value, e2, sizeof e2))
            return fail(err, errlen, "class %s: arrival: %s", cn, e2);
        k->arrival_set = true;
    } else if (!strcmp(key, "tier") || !strcmp(key, "service_tier") || !strcmp(key, "tenant")) {
        if (!valid_header_value(value) || strchr(value, '"') || strchr(value, '\\'))
            return fail(err, errlen, "class %s: %s: expected printable text without quotes", cn,
                        key);
        set_str(!strcmp(key, "tier")           ? &k->tier
                : !strcmp(key, "service_tier") ? &k->service_tier
                                               : &k->tenant,
                value);
    } else if (!strcmp(key, "key")) {
        /* key=env:NAME keeps the key off the command line (and out of `ps`). */
        const char *v = value;
        if (!strncmp(value, "env:", 4)) {
            v = getenv(value + 4);
            if (!v)
                return fail(err, errlen, "class %s: key: environment variable %s is not set", cn,
                            value + 4);
        }
        if (!valid_header_value(v))
            return fail(err, errlen, "class %s: key: expected printable text", cn);
        set_str(&k->key, v);
    } else if (!strcmp(key, "model")) {
        if (!valid_header_value(value) || strchr(value, '"') || strchr(value, '\\'))
            return fail(err, errlen, "class %s: model: expected printable text without quotes", cn);
        set_str(&k->model, value);
    } else if (!strcmp(key, "endpoint")) {
        if (!strcmp(value, "completions")) {
            k->chat = 0;
            free(k->path);
            k->path = NULL;
        } else if (!strcmp(value, "chat")) {
            k->chat = 1;
            free(k->path);
            k->path = NULL;
        } else if (value[0] == '/' && valid_header_value(value) && !strchr(value, ' ')) {
            set_str(&k->path, value);
            k->chat = -1;
        } else {
            return fail(err, errlen, "class %s: endpoint: expected completions, chat or a /path",
                        cn);
        }
    } else if (!strcmp(key, "prompt") || !strcmp(key, "output")) {
        char e2[300];
        bool prompt = !strcmp(key, "prompt");
        if (sl_bench_len_parse(c, prompt ? &k->prompt : &k->output, value, e2, sizeof e2))
            return fail(err, errlen, "class %s: %s: %s", cn, key, e2);
        *(prompt ? &k->prompt_set : &k->output_set) = true;
    } else if (!strcmp(key, "shared_prefix")) {
        if (!parse_num(value, &x) || x < 0 || x != floor(x) || x > SL_BENCH_LEN_MAX)
            return fail(err, errlen, "class %s: shared_prefix: expected tokens, 0 to %u", cn,
                        SL_BENCH_LEN_MAX);
        k->shared_prefix = (long)x;
    } else if (!strcmp(key, "ignore_eos")) {
        if (!parse_bool(value, &k->ignore_eos))
            return fail(err, errlen, "class %s: ignore_eos: expected 0 or 1", cn);
    } else if (!strcmp(key, "temperature")) {
        if (!parse_num(value, &x) || x < 0 || x > 2)
            return fail(err, errlen, "class %s: temperature: expected 0 to 2", cn);
        k->temperature = x;
    } else if (!strcmp(key, "n")) {
        if (!parse_num(value, &x) || x < 1 || x != floor(x) || x > 1e12)
            return fail(err, errlen, "class %s: n: expected a positive whole number", cn);
        k->max_requests = (long)x;
    } else if (!strcmp(key, "ttft_slo") || !strcmp(key, "tpot_slo") || !strcmp(key, "e2el_slo")) {
        if (!parse_num(value, &x) || x < 0)
            return fail(err, errlen, "class %s: %s: expected milliseconds, at least 0", cn, key);
        k->slo_ms[key[0] == 't' ? (key[1] == 't' ? SL_BENCH_SLO_TTFT : SL_BENCH_SLO_TPOT)
                                : SL_BENCH_SLO_E2EL] = x;
    } else {
        return fail(err, errlen,
                    "class %s: unknown key '%s' (rate, weight, arrival, tier, service_tier, "
                    "tenant, key, model, endpoint, prompt, output, shared_prefix, ignore_eos, "
                    "temperature, n, ttft_slo, tpot_slo, e2el_slo)",
                    cn, key);
    }
    return SL_OK;
}

static struct sl_bench_class *class_find(struct sl_bench_config *c, const char *name)
{
    for (size_t i = 0; i < c->n_classes; i++)
        if (!strcmp(c->classes[i].name, name))
            return &c->classes[i];
    return NULL;
}

static int class_add(struct sl_bench_config *c, const char *name, char *err, size_t errlen,
                     struct sl_bench_class **out)
{
    if (!valid_name(name))
        return fail(err, errlen, "class name '%s': expected 1-63 of A-Z a-z 0-9 _ . - @ / :", name);
    if (class_find(c, name))
        return fail(err, errlen, "class %s: defined twice", name);
    if (c->n_classes == SL_BENCH_MAX_CLASSES)
        return fail(err, errlen, "at most %d classes", SL_BENCH_MAX_CLASSES);
    c->classes = sl_xrealloc(c->classes, (c->n_classes + 1) * sizeof *c->classes);
    *out = &c->classes[c->n_classes++];
    sl_bench_class_init(*out, name);
    return SL_OK;
}

int sl_bench_class_parse(struct sl_bench_config *c, const char *spec, char *err, size_t errlen)
{
    char *buf = sl_xstrdup(spec);
    char *rest = strchr(buf, ',');
    if (rest)
        *rest++ = '\0';
    struct sl_bench_class *k;
    int rc = class_add(c, buf, err, errlen, &k);
    char *save = NULL;
    for (char *kv = rest ? strtok_r(rest, ",", &save) : NULL; rc == SL_OK && kv;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            rc = fail(err, errlen, "class %s: '%s': expected key=value", k->name, kv);
            break;
        }
        *eq = '\0';
        rc = sl_bench_class_set(c, k, kv, eq + 1, err, errlen);
    }
    free(buf);
    return rc;
}

static int class_from_json(struct sl_bench_config *c, json_t *o, const char *where, char *err,
                           size_t errlen)
{
    if (!json_is_object(o))
        return fail(err, errlen, "%s: expected an object", where);
    json_t *jn = json_object_get(o, "name");
    if (!json_is_string(jn))
        return fail(err, errlen, "%s.name: expected a string", where);
    struct sl_bench_class *k;
    int rc = class_add(c, json_string_value(jn), err, errlen, &k);
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        if (rc || !strcmp(key, "name") || !strncmp(key, "//", 2))
            continue;
        char num[64];
        const char *s;
        if (json_is_string(v))
            s = json_string_value(v);
        else if (json_is_integer(v))
            s = (snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)), num);
        else if (json_is_real(v))
            s = (snprintf(num, sizeof num, "%.17g", json_real_value(v)), num);
        else if (json_is_boolean(v))
            s = json_is_true(v) ? "1" : "0";
        else
            return fail(err, errlen, "%s.%s: expected a string, number or boolean", where, key);
        rc = sl_bench_class_set(c, k, key, s, err, errlen);
    }
    return rc;
}

int sl_bench_classes_load(struct sl_bench_config *c, const char *path, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return fail(err, errlen, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    json_t *arr = json_is_object(root) ? json_object_get(root, "classes") : root;
    int rc = SL_OK;
    if (!json_is_array(arr) || json_array_size(arr) == 0) {
        rc = fail(err, errlen, "%s: expected a non-empty array of classes, or {\"classes\": [...]}",
                  path);
    } else {
        size_t i;
        json_t *o;
        json_array_foreach(arr, i, o)
        {
            char where[300];
            snprintf(where, sizeof where, "%s: classes[%zu]", path, i);
            if ((rc = class_from_json(c, o, where, err, errlen)))
                break;
        }
    }
    json_decref(root);
    return rc;
}

int sl_bench_goodput_parse(double slo_ms[3], const char *text, char *err, size_t errlen)
{
    char *buf = sl_xstrdup(text), *save = NULL;
    int rc = SL_OK;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        char *colon = strchr(tok, ':');
        double v;
        if (!colon || !parse_num(colon + 1, &v) || v < 0) {
            rc = fail(err, errlen, "--goodput: '%s': expected ttft:MS, tpot:MS or e2el:MS", tok);
            break;
        }
        *colon = '\0';
        if (!strcmp(tok, "ttft"))
            slo_ms[SL_BENCH_SLO_TTFT] = v;
        else if (!strcmp(tok, "tpot"))
            slo_ms[SL_BENCH_SLO_TPOT] = v;
        else if (!strcmp(tok, "e2el"))
            slo_ms[SL_BENCH_SLO_E2EL] = v;
        else {
            rc = fail(err, errlen, "--goodput: unknown objective '%s' (ttft, tpot or e2el)", tok);
            break;
        }
    }
    free(buf);
    return rc;
}

static bool opt_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

static int trace_class(struct sl_bench_config *c, const char *tier, const char *tenant,
                       uint32_t *out, char *err, size_t errlen)
{
    for (size_t i = 0; i < c->n_classes; i++) {
        struct sl_bench_class *k = &c->classes[i];
        bool match = k->from_trace ? opt_eq(k->tier, tier) && opt_eq(k->tenant, tenant)
                                   : (!k->tier || opt_eq(k->tier, tier)) &&
                                         (!k->tenant || opt_eq(k->tenant, tenant));
        if (match) {
            *out = (uint32_t)i;
            return SL_OK;
        }
    }
    char name[160];
    snprintf(name, sizeof name, "%s%s%s", tier ? tier : "default", tenant ? "@" : "",
             tenant ? tenant : "");
    struct sl_bench_class *k;
    int rc = class_add(c, name, err, errlen, &k);
    if (rc)
        return rc;
    k->from_trace = true;
    if (tier)
        k->tier = sl_xstrdup(tier);
    if (tenant)
        k->tenant = sl_xstrdup(tenant);
    *out = (uint32_t)(c->n_classes - 1);
    return SL_OK;
}

static const char *trace_str(json_t *line, const char *field, bool *bad)
{
    json_t *v = json_object_get(line, field);
    if (!v || json_is_null(v))
        return NULL;
    if (!json_is_string(v) || !valid_name(json_string_value(v))) {
        *bad = true;
        return NULL;
    }
    return json_string_value(v);
}

static bool trace_count(json_t *line, const char *field, uint32_t *out)
{
    json_t *v = json_object_get(line, field);
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        json_integer_value(v) > SL_BENCH_LEN_MAX)
        return false;
    *out = (uint32_t)json_integer_value(v);
    return true;
}

static int cmp_entry(const void *a, const void *b)
{
    const struct sl_bench_trace_entry *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq); /* equal times keep file order */
}

int sl_bench_trace_load(struct sl_bench_config *c, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return fail(err, errlen, "--trace %s: %s", path, strerror(errno));
    struct sl_str line;
    sl_str_init(&line);
    size_t line_no = 0, cap = 0;
    int rc = SL_OK;
    char buf[4096];
    bool eof = false;
    while (rc == SL_OK && !eof) {
        sl_str_clear(&line);
        /* Read one whole line, however long. */
        for (;;) {
            if (!fgets(buf, sizeof buf, f)) {
                eof = true;
                break;
            }
            sl_str_append(&line, buf, strlen(buf));
            if (line.len && line.p[line.len - 1] == '\n')
                break;
        }
        if (eof && line.len == 0)
            break;
        line_no++;
        const char *p = line.p + strspn(line.p, " \t\r\n");
        if (!*p || *p == '#')
            continue;
        json_error_t je;
        json_t *o = json_loads(p, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(o)) {
            rc = fail(err, errlen, "%s:%zu: expected a JSON object (%s)", path, line_no,
                      o ? "not an object" : je.text);
            json_decref(o);
            break;
        }
        struct sl_bench_trace_entry e = {0};
        json_t *t = json_object_get(o, "t");
        bool bad = false;
        const char *tier = trace_str(o, "tier", &bad);
        const char *tenant = trace_str(o, "tenant", &bad);
        if (!json_is_number(t) || json_number_value(t) < 0 || !isfinite(json_number_value(t)))
            rc = fail(err, errlen, "%s:%zu: t: expected seconds, at least 0", path, line_no);
        else if (bad)
            rc = fail(err, errlen, "%s:%zu: tier and tenant: expected names (A-Z a-z 0-9 _ . -)",
                      path, line_no);
        else if (!trace_count(o, "prompt_tokens", &e.prompt_tokens))
            rc = fail(err, errlen, "%s:%zu: prompt_tokens: expected a whole number from 1 to %u",
                      path, line_no, SL_BENCH_LEN_MAX);
        else if (!trace_count(o, "output_tokens", &e.output_tokens))
            rc = fail(err, errlen, "%s:%zu: output_tokens: expected a whole number from 1 to %u",
                      path, line_no, SL_BENCH_LEN_MAX);
        else
            rc = trace_class(c, tier, tenant, &e.cls, err, errlen);
        if (rc == SL_OK) {
            e.t = json_number_value(t);
            e.seq = (uint32_t)c->n_trace;
            if (c->n_trace == cap) {
                cap = cap ? cap * 2 : 1024;
                c->trace = sl_xrealloc(c->trace, cap * sizeof *c->trace);
            }
            c->trace[c->n_trace++] = e;
        }
        json_decref(o);
    }
    sl_str_dispose(&line);
    fclose(f);
    if (rc == SL_OK && c->n_trace == 0)
        rc = fail(err, errlen, "--trace %s: no requests in the file", path);
    if (rc == SL_OK) {
        /* A trace may be written out of order (merged from several sources). */
        bool ordered = true;
        for (size_t i = 1; i < c->n_trace; i++)
            ordered &= c->trace[i - 1].t <= c->trace[i].t;
        if (!ordered)
            qsort(c->trace, c->n_trace, sizeof *c->trace, cmp_entry);
    }
    return rc;
}

static bool is_chat_path(const char *path)
{
    size_t n = strlen(path), m = strlen("/chat/completions");
    return n >= m && !strcmp(path + n - m, "/chat/completions");
}

int sl_bench_config_finish(struct sl_bench_config *c, char *err, size_t errlen)
{
    int rc;
    if (c->trace_path) {
        if (c->concurrency)
            return fail(err, errlen, "--trace replays arrival times; it excludes --concurrency");
        if ((rc = sl_bench_trace_load(c, c->trace_path, err, errlen)))
            return rc;
    }
    if (c->n_classes == 0) {
        struct sl_bench_class *k;
        if ((rc = class_add(c, "default", err, errlen, &k)))
            return rc;
    }
    const struct sl_bench_class *d = &c->defaults;
    double shared_weight = 0;
    for (size_t i = 0; i < c->n_classes; i++) {
        struct sl_bench_class *k = &c->classes[i];
        if (!k->path)
            k->path = sl_xstrdup(k->chat == 1   ? "/v1/chat/completions"
                                 : k->chat == 0 ? "/v1/completions"
                                                : c->endpoint);
        if (k->chat < 0)
            k->chat = is_chat_path(k->path);
        if (!k->key && k->tenant)
            for (size_t j = 0; j < c->n_tenant_keys; j++)
                if (!strcmp(c->tenant_keys[j].tenant, k->tenant))
                    k->key = sl_xstrdup(c->tenant_keys[j].key);
        if (!k->key && c->api_key)
            k->key = sl_xstrdup(c->api_key);
        if (!k->model && c->model)
            k->model = sl_xstrdup(c->model);
        if (!k->prompt_set)
            k->prompt = d->prompt;
        if (!k->output_set)
            k->output = d->output;
        if (!k->arrival_set)
            k->arrival = c->arrival;
        if (k->shared_prefix < 0)
            k->shared_prefix = c->shared_prefix;
        if (k->ignore_eos < 0)
            k->ignore_eos = c->ignore_eos;
        if (isnan(k->temperature))
            k->temperature = c->temperature;
        for (int s = 0; s < 3; s++)
            if (isnan(k->slo_ms[s]))
                k->slo_ms[s] = c->slo_ms[s];
        if (!k->rate_set)
            shared_weight += k->weight;
    }
    if (c->concurrency && c->max_concurrency)
        return fail(err, errlen, "--max-concurrency caps an open loop; --concurrency is closed");
    if (!c->trace_path && !c->num_requests && c->duration_s <= 0) {
        bool all_capped = true;
        for (size_t i = 0; i < c->n_classes; i++)
            all_capped &= c->classes[i].max_requests > 0;
        if (!all_capped)
            c->num_requests = 1000; /* vLLM's default --num-prompts */
    }
    if (!c->trace_path && !c->concurrency) {
        for (size_t i = 0; i < c->n_classes; i++) {
            struct sl_bench_class *k = &c->classes[i];
            if (!k->rate_set)
                k->rate = c->request_rate * k->weight / shared_weight;
            if (isinf(k->rate) && !c->num_requests && !k->max_requests)
                return fail(err, errlen,
                            "class %s: an infinite rate sends everything at once: it needs "
                            "--num-requests (or n=), not only --duration",
                            k->name);
        }
    }
    if (c->num_warmups && c->warmup_s > 0)
        return fail(err, errlen, "give --warmup (seconds) or --num-warmups (requests), not both");
    return SL_OK;
}
