/* Configuration: built-in defaults, a JSON file, then command-line flags. */
#include "config_impl.h"

#include <sluice/fleet.h>

#include <event2/http.h>
#include <jansson.h>
#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Admission keeps queue counts for every served model, and a "model:NAME" step holds any name. */
_Static_assert(SL_MODELS_MAX <= SL_ADMIT_MODELS_MAX, "admission counts every model's queues");
_Static_assert(SL_MODEL_NAME_MAX <= SL_ADMIT_MODEL_NAME_MAX, "overload steps hold model names");

void sl_config_init(struct sl_config *c)
{
    memset(c, 0, sizeof *c);
    c->http.listen_host = sl_xstrdup("127.0.0.1");
    c->http.listen_port = 8080;
    c->http.listen_backlog = 4096;
    c->http.io_threads = 1;
    c->http.max_body_bytes = 1 << 20;
    c->http.max_header_bytes = 16 << 10;
    c->http.header_timeout_ms = 10000;
    c->http.idle_timeout_ms = 60000;
    c->http.max_connections = 4096;
    c->http.write_high_water_bytes = 64 << 10;
    c->http.write_hard_cap_bytes = 1 << 20;
    c->http.tcp_send_buffer_bytes = 0;
    c->http.drain_timeout_ms = 30000;
    c->model = sl_xstrdup("synthetic");
    c->tokenizer = NULL;
    c->engine.n_models = 1;
    c->engine.models = sl_xcalloc(1, sizeof *c->engine.models);
    c->engine.models[0].spec = sl_xstrdup(c->model);
    c->engine.models[0].threads = -1; /* device NULL: "device" */
    c->engine.device = sl_xstrdup("auto");
    c->engine.threads = 0;
    c->engine.pin_threads = true;
    c->engine.cpu_isa = sl_xstrdup("auto");
    c->engine.max_seqs = 32;
    c->engine.max_batch_tokens = 512;
    c->engine.block_size = 16;
    c->engine.kv_cache_mib = 512;
    c->engine.kv_dtype = SL_KV_F16;        /* as llama.cpp's default cache type; f32 on request */
    c->engine.cpu_int8_activations = true; /* integer dot products, as llama.cpp's CPU backend */
    c->api.default_max_tokens = 16;
    c->api.default_max_tokens_chat = 0;
    c->api.prefix_cache.enabled = true;
    c->api.prefix_cache.scope = SL_CONFIG_PREFIX_TENANT;
    c->fleet.key_prefix = sl_xstrdup("sluice:");
    c->fleet.timeout_ms = 20;
    c->fleet.password_env = sl_xstrdup("SLUICE_REDIS_PASSWORD");
    c->log_level = sl_xstrdup("info");
    c->metering.currency = sl_xstrdup("USD");
    sl_tenancy_init(&c->tenancy);
}

static void tls_clear(struct sl_config_tls *t)
{
    free(t->listen_host);
    free(t->cert);
    free(t->key);
    memset(t, 0, sizeof *t);
}

static void models_free(struct sl_config_model *m, int n)
{
    for (int i = 0; i < n; i++) {
        free(m[i].name);
        free(m[i].spec);
        free(m[i].tokenizer);
        free(m[i].device);
    }
    free(m);
}

static void devices_free(char **d, int n)
{
    for (int i = 0; i < n; i++)
        free(d[i]);
    free(d);
}

void sl_config_dispose(struct sl_config *c)
{
    models_free(c->engine.models, c->engine.n_models);
    devices_free(c->engine.devices, c->engine.n_devices);
    tls_clear(&c->http.tls);
    free(c->http.listen_host);
    free(c->model);
    free(c->tokenizer);
    free(c->served_model_name);
    free(c->engine.device);
    free(c->api.chat_template);
    free(c->fleet.url);
    free(c->fleet.key_prefix);
    free(c->fleet.password_env);
    free(c->metering.currency);
    free(c->metering.state_dir);
    free(c->metering.budget_webhook);
    free(c->log_level);
    free(c->engine.cpu_isa);
    sl_tenancy_dispose(&c->tenancy);
    memset(c, 0, sizeof *c);
}

/* A heap configuration and its reference count. */
struct config_box {
    atomic_int refs;
    struct sl_config c;
};

static struct config_box *box_of(struct sl_config *c)
{
    return (struct config_box *)((char *)c - offsetof(struct config_box, c));
}

struct sl_config *sl_config_new(void)
{
    struct config_box *b = sl_xcalloc(1, sizeof *b);
    atomic_init(&b->refs, 1);
    sl_config_init(&b->c);
    return &b->c;
}

struct sl_config *sl_config_ref(struct sl_config *c)
{
    if (c)
        atomic_fetch_add_explicit(&box_of(c)->refs, 1, memory_order_relaxed);
    return c;
}

void sl_config_unref(struct sl_config *c)
{
    if (!c)
        return;
    struct config_box *b = box_of(c);
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        sl_config_dispose(&b->c);
        free(b);
    }
}

const struct sl_config_http *sl_config_http(const struct sl_config *c)
{
    return &c->http;
}

const struct sl_config_engine *sl_config_engine(const struct sl_config *c)
{
    return &c->engine;
}

const struct sl_config_api *sl_config_api(const struct sl_config *c)
{
    return &c->api;
}

const struct sl_config_fleet *sl_config_fleet(const struct sl_config *c)
{
    return &c->fleet;
}

const struct sl_config_metering *sl_config_metering(const struct sl_config *c)
{
    return &c->metering;
}

const struct sl_usage_price *sl_config_model_price(const struct sl_config *c, int i)
{
    if (i >= 0 && i < c->engine.n_models && c->engine.models[i].has_price)
        return &c->engine.models[i].price;
    return &c->metering.price;
}

const struct sl_tenancy *sl_config_tenancy(const struct sl_config *c)
{
    return &c->tenancy;
}

struct sl_tenancy *sl_config_tenancy_mut(struct sl_config *c)
{
    return &c->tenancy;
}

const char *sl_config_log_level(const struct sl_config *c)
{
    return c->log_level;
}

static void replace(char **dst, const char *src)
{
    free(*dst);
    *dst = src ? sl_xstrdup(src) : NULL;
}

/* Splits "HOST:PORT" (or "[V6]:PORT") into *host and *port. */
static int parse_listen(char **host, int *port_out, const char *v, char *err, size_t errlen,
                        const char *what)
{
    const char *colon = strrchr(v, ':');
    if (!colon || colon == v) {
        snprintf(err, errlen, "%s: \"%s\" is not HOST:PORT", what, v);
        return SL_EINVAL;
    }
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || port < 0 || port > 65535) {
        snprintf(err, errlen, "%s: port in \"%s\" must be 0..65535", what, v);
        return SL_EINVAL;
    }
    const char *h = v;
    size_t hl = (size_t)(colon - v);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']') {
            snprintf(err, errlen, "%s: \"%s\" has an unclosed '['", what, v);
            return SL_EINVAL;
        }
        h++;
        hl -= 2;
    }
    free(*host);
    *host = sl_xstrndup(h, hl);
    *port_out = (int)port;
    return SL_OK;
}

static const char *const log_levels[] = {"debug", "info", "warn", "error"};

static int check_log_level(const char *v)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(v, log_levels[i]) == 0)
            return i;
    return -1;
}

enum key_type {
    K_INT,
    K_SIZE,
    K_FRACTION,
    K_STR,
    K_STR_OR_NULL,
    K_LISTEN,
    K_LOG_LEVEL,
    K_CPU_ISA,
    K_TLS,
    K_REDIS, /* null or {"url", "key_prefix", "timeout_ms", "password_env"} */
    K_BOOL,
    K_MODELS,
    K_DEVICES,
    K_KV_DTYPE,
    K_KEY_SHA256,   /* 64 hex digits or null: a struct sl_key_sha256 */
    K_MODEL_NAME,   /* a model id (valid_model_name) or null */
    K_PRICE,        /* {"input_per_mtok", "cached_input_per_mtok", "output_per_mtok",
                       "device_second"}: a struct sl_usage_price */
    K_CURRENCY,     /* 1 to 16 printable ASCII characters */
    K_WEBHOOK,      /* null or an http:// or https:// URL with a host */
    K_PREFIX_CACHE, /* {"enabled", "scope"}: a struct sl_config_prefix_cache */
};

struct key {
    const char *name;
    enum key_type type;
    size_t off;
    long min, max;
};

#define OFF(f) offsetof(struct sl_config, f)
static const struct key keys[] = {
    {"listen", K_LISTEN, 0, 0, 0},
    {"listen_backlog", K_INT, OFF(http.listen_backlog), 1, 65535},
    {"tls", K_TLS, 0, 0, 0},
    {"model", K_STR, OFF(model), 0, 0},
    {"tokenizer", K_STR_OR_NULL, OFF(tokenizer), 0, 0},
    {"served_model_name", K_MODEL_NAME, OFF(served_model_name), 0, 0},
    {"device", K_STR, OFF(engine.device), 0, 0},
    {"chat_template", K_STR_OR_NULL, OFF(api.chat_template), 0, 0},
    {"io_threads", K_INT, OFF(http.io_threads), 1, 64},
    {"threads", K_INT, OFF(engine.threads), 0, 1024},
    {"pin_threads", K_BOOL, OFF(engine.pin_threads), 0, 0},
    {"cpu_isa", K_CPU_ISA, OFF(engine.cpu_isa), 0, 0},
    {"max_seqs", K_INT, OFF(engine.max_seqs), 1, 4096},
    {"max_batch_tokens", K_INT, OFF(engine.max_batch_tokens), 1, 1 << 20},
    {"block_size", K_INT, OFF(engine.block_size), 1, 1024},
    {"kv_cache_mib", K_INT, OFF(engine.kv_cache_mib), 1, 1 << 24},
    {"kv_cache_fraction", K_FRACTION, OFF(engine.kv_cache_fraction), 0, 0},
    {"kv_dtype", K_KV_DTYPE, OFF(engine.kv_dtype), 0, 0},
    {"cpu_int8_activations", K_BOOL, OFF(engine.cpu_int8_activations), 0, 0},
    {"default_max_tokens", K_INT, OFF(api.default_max_tokens), 1, 1 << 20},
    {"default_max_tokens_chat", K_INT, OFF(api.default_max_tokens_chat), 0, 1 << 20},
    {"max_body_bytes", K_SIZE, OFF(http.max_body_bytes), 64, 1L << 30},
    {"max_header_bytes", K_SIZE, OFF(http.max_header_bytes), 256, 1L << 20},
    {"header_timeout_ms", K_INT, OFF(http.header_timeout_ms), 1, 3600000},
    {"idle_timeout_ms", K_INT, OFF(http.idle_timeout_ms), 1, 86400000},
    {"max_connections", K_INT, OFF(http.max_connections), 1, 1000000},
    {"write_high_water_bytes", K_SIZE, OFF(http.write_high_water_bytes), 0, 1L << 30},
    {"write_hard_cap_bytes", K_SIZE, OFF(http.write_hard_cap_bytes), 1024, 1L << 34},
    {"tcp_send_buffer_bytes", K_SIZE, OFF(http.tcp_send_buffer_bytes), 0, 1L << 28},
    {"drain_timeout_ms", K_INT, OFF(http.drain_timeout_ms), 0, 3600000},
    {"log_level", K_LOG_LEVEL, OFF(log_level), 0, 0},
    {"models", K_MODELS, 0, 0, 0},
    {"devices", K_DEVICES, 0, 0, 0},
    {"admission", K_BOOL, OFF(tenancy.admission), 0, 0},
    {"metrics_key_sha256", K_KEY_SHA256, OFF(tenancy.metrics_key), 0, 0},
    {"vllm_metrics", K_BOOL, OFF(api.vllm_metrics), 0, 0},
    {"prefix_cache", K_PREFIX_CACHE, OFF(api.prefix_cache), 0, 0},
    {"redis", K_REDIS, 0, 0, 0},
    {"currency", K_CURRENCY, OFF(metering.currency), 0, 0},
    {"price", K_PRICE, OFF(metering.price), 0, 0},
    {"state_dir", K_STR_OR_NULL, OFF(metering.state_dir), 0, 0},
    {"budget_webhook", K_WEBHOOK, OFF(metering.budget_webhook), 0, 0},
};

#define PRICE_MAX 1e6 /* per million tokens or per second: far above any real price */

/* A price object, at `what` ("price", "models[1].price") for errors. A missing
 * cached_input_per_mtok is the input price (no discount); the others are 0. */
static int parse_price(struct sl_usage_price *out, json_t *v, char *err, size_t errlen,
                       const char *where, const char *what)
{
    if (!json_is_object(v)) {
        snprintf(err, errlen,
                 "%s: %s must be an object {\"input_per_mtok\", \"cached_input_per_mtok\", "
                 "\"output_per_mtok\", \"device_second\"}",
                 where, what);
        return SL_EINVAL;
    }
    struct sl_usage_price p = {0};
    bool cached = false;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x)
    {
        if (strncmp(k, "//", 2) == 0)
            continue;
        double *dst = strcmp(k, "input_per_mtok") == 0          ? &p.input_per_mtok
                      : strcmp(k, "cached_input_per_mtok") == 0 ? &p.cached_input_per_mtok
                      : strcmp(k, "output_per_mtok") == 0       ? &p.output_per_mtok
                      : strcmp(k, "device_second") == 0         ? &p.device_second
                                                                : NULL;
        if (!dst) {
            snprintf(err, errlen,
                     "%s: %s: unknown key \"%.40s\" (input_per_mtok, cached_input_per_mtok, "
                     "output_per_mtok, device_second)",
                     where, what, k);
            return SL_EINVAL;
        }
        double d = json_is_number(x) ? json_number_value(x) : -1;
        if (!(d >= 0 && d <= PRICE_MAX)) {
            snprintf(err, errlen, "%s: %s.%s must be a number from 0 to %g", where, what, k,
                     PRICE_MAX);
            return SL_EINVAL;
        }
        *dst = d;
        cached |= dst == &p.cached_input_per_mtok;
    }
    if (!cached)
        p.cached_input_per_mtok = p.input_per_mtok;
    *out = p;
    return SL_OK;
}

static json_t *price_json(const struct sl_usage_price *p)
{
    return json_pack("{s:f,s:f,s:f,s:f}", "input_per_mtok", p->input_per_mtok,
                     "cached_input_per_mtok", p->cached_input_per_mtok, "output_per_mtok",
                     p->output_per_mtok, "device_second", p->device_second);
}

static const char *const prefix_scopes[] = {
    [SL_CONFIG_PREFIX_TENANT] = "tenant",
    [SL_CONFIG_PREFIX_GLOBAL] = "global",
};

/* "prefix_cache": {"enabled": true|false, "scope": "tenant"|"global"}, keys starting with "//"
 * being comments. A key left out keeps its value, as every top-level key does when a file leaves
 * it out; nothing changes unless the whole object is valid. */
static int parse_prefix_cache(struct sl_config_prefix_cache *out, json_t *v, char *err,
                              size_t errlen, const char *where)
{
    if (!json_is_object(v)) {
        snprintf(err, errlen,
                 "%s: \"prefix_cache\" must be an object {\"enabled\": true or false, "
                 "\"scope\": \"tenant\" or \"global\"}",
                 where);
        return SL_EINVAL;
    }
    struct sl_config_prefix_cache p = *out;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x)
    {
        if (strncmp(k, "//", 2) == 0)
            continue;
        if (strcmp(k, "enabled") == 0) {
            if (!json_is_boolean(x)) {
                snprintf(err, errlen, "%s: \"prefix_cache\".\"enabled\" must be true or false",
                         where);
                return SL_EINVAL;
            }
            p.enabled = json_is_true(x);
        } else if (strcmp(k, "scope") == 0) {
            const char *s = json_is_string(x) ? json_string_value(x) : "";
            int i = 0;
            while (i < 2 && strcmp(s, prefix_scopes[i]) != 0)
                i++;
            if (i == 2) {
                snprintf(err, errlen,
                         "%s: \"prefix_cache\".\"scope\" must be \"tenant\" (each tenant's "
                         "requests share only their own cached prefixes) or \"global\"",
                         where);
                return SL_EINVAL;
            }
            p.scope = (enum sl_config_prefix_scope)i;
        } else {
            snprintf(err, errlen, "%s: unknown key \"prefix_cache\".\"%.40s\" (enabled, scope)",
                     where, k);
            return SL_EINVAL;
        }
    }
    *out = p;
    return SL_OK;
}

/* "tls": null (no TLS listener) or {"listen": "HOST:PORT", "cert": FILE, "key": FILE}, keys
 * starting with "//" being comments. The files are read by the server, not here. */
static int parse_tls(struct sl_config *c, json_t *v, char *err, size_t errlen, const char *where)
{
    struct sl_config_tls t = {0};
    if (json_is_null(v)) {
        tls_clear(&c->http.tls);
        return SL_OK;
    }
    if (!json_is_object(v)) {
        snprintf(err, errlen,
                 "%s: \"tls\" must be null or an object {\"listen\", \"cert\", \"key\"}", where);
        return SL_EINVAL;
    }
    const char *name;
    json_t *x;
    int st = SL_OK;
    json_object_foreach(v, name, x)
    {
        if (strncmp(name, "//", 2) == 0)
            continue;
        char **dst = strcmp(name, "cert") == 0 ? &t.cert : strcmp(name, "key") == 0 ? &t.key : NULL;
        if (strcmp(name, "listen") == 0) {
            char what[512];
            snprintf(what, sizeof what, "%s: \"tls\".\"listen\"", where);
            if (!json_is_string(x)) {
                snprintf(err, errlen, "%s must be a string \"HOST:PORT\"", what);
                st = SL_EINVAL;
            } else {
                st = parse_listen(&t.listen_host, &t.listen_port, json_string_value(x), err, errlen,
                                  what);
            }
        } else if (dst) {
            if (!json_is_string(x) || json_string_length(x) == 0) {
                snprintf(err, errlen, "%s: \"tls\".\"%s\" must be a non-empty file name", where,
                         name);
                st = SL_EINVAL;
            } else {
                replace(dst, json_string_value(x));
            }
        } else {
            snprintf(err, errlen, "%s: unknown key \"tls\".\"%s\" (listen, cert, key)", where,
                     name);
            st = SL_EINVAL;
        }
        if (st != SL_OK)
            break;
    }
    if (st == SL_OK && (!t.listen_host || !t.cert || !t.key)) {
        snprintf(err, errlen, "%s: \"tls\" needs \"listen\", \"cert\" and \"key\"", where);
        st = SL_EINVAL;
    }
    if (st != SL_OK) {
        tls_clear(&t);
        return st;
    }
    tls_clear(&c->http.tls);
    c->http.tls = t;
    return SL_OK;
}

/* "redis": null (budgets are local) or {"url": "redis://...", "key_prefix", "timeout_ms",
 * "password_env"}, keys starting with "//" being comments; only "url" is required. */
static int parse_redis(struct sl_config *c, json_t *v, char *err, size_t errlen, const char *where)
{
    if (json_is_null(v)) {
        free(c->fleet.url);
        c->fleet.url = NULL;
        return SL_OK;
    }
    if (!json_is_object(v)) {
        snprintf(err, errlen, "%s: \"redis\" must be null or an object {\"url\", ...}", where);
        return SL_EINVAL;
    }
    struct sl_config_fleet f = {.timeout_ms = c->fleet.timeout_ms};
    const char *name;
    json_t *x;
    int st = SL_OK;
    json_object_foreach(v, name, x)
    {
        if (strncmp(name, "//", 2) == 0)
            continue;
        if (strcmp(name, "timeout_ms") == 0) {
            if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 60000) {
                snprintf(err, errlen,
                         "%s: \"redis\".\"timeout_ms\" must be an integer from 1 "
                         "to 60000",
                         where);
                st = SL_EINVAL;
            } else {
                f.timeout_ms = (int)json_integer_value(x);
            }
            continue;
        }
        char **dst = strcmp(name, "url") == 0            ? &f.url
                     : strcmp(name, "key_prefix") == 0   ? &f.key_prefix
                     : strcmp(name, "password_env") == 0 ? &f.password_env
                                                         : NULL;
        if (!dst) {
            snprintf(err, errlen,
                     "%s: unknown key \"redis\".\"%s\" (url, key_prefix, timeout_ms, "
                     "password_env)",
                     where, name);
            st = SL_EINVAL;
        } else if (!json_is_string(x) ||
                   json_string_length(x) > (dst == &f.key_prefix ? SL_FLEET_PREFIX_MAX : 256) ||
                   (dst != &f.key_prefix && json_string_length(x) == 0)) {
            snprintf(err, errlen, "%s: \"redis\".\"%s\" must be a%s string of at most %d bytes",
                     where, name, dst == &f.key_prefix ? "" : " non-empty",
                     dst == &f.key_prefix ? SL_FLEET_PREFIX_MAX : 256);
            st = SL_EINVAL;
        } else {
            replace(dst, json_string_value(x));
        }
        if (st != SL_OK)
            break;
    }
    struct sl_fleet_addr addr;
    char why[256];
    if (st == SL_OK && !f.url) {
        snprintf(err, errlen, "%s: \"redis\" needs \"url\"", where);
        st = SL_EINVAL;
    } else if (st == SL_OK && sl_fleet_addr_parse(f.url, &addr, why, sizeof why) != SL_OK) {
        snprintf(err, errlen, "%s: \"redis\".\"url\": %s", where, why);
        st = SL_EINVAL;
    }
    if (st != SL_OK) {
        free(f.url);
        free(f.key_prefix);
        free(f.password_env);
        return st;
    }
    free(c->fleet.url);
    c->fleet.url = f.url;
    c->fleet.timeout_ms = f.timeout_ms;
    if (f.key_prefix) {
        free(c->fleet.key_prefix);
        c->fleet.key_prefix = f.key_prefix;
    }
    if (f.password_env) {
        free(c->fleet.password_env);
        c->fleet.password_env = f.password_env;
    }
    return SL_OK;
}

static bool valid_model_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > SL_MODEL_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] >= 0x7f || s[i] == '"' || s[i] == '\\' || s[i] == '/')
            return false;
    return true;
}

/* What a model id must be, for an error naming where it was given ("models[1].name"). */
#define MODEL_NAME_RULE "1 to %d printable ASCII characters without spaces, quotes, '\\' or '/'"

/* "models": [{"name", "model", "tokenizer", "threads", "device"}, ...], at least one; every
 * entry but the first needs a name. The first one also becomes "model" and "tokenizer". */
static int parse_models(struct sl_config *c, json_t *v, char *err, size_t errlen, const char *where)
{
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > SL_MODELS_MAX) {
        snprintf(err, errlen, "%s: \"models\" must be an array of 1 to %d models", where,
                 SL_MODELS_MAX);
        return SL_EINVAL;
    }
    int n = (int)json_array_size(v);
    struct sl_config_model *m = sl_xcalloc((size_t)n, sizeof *m);
    int st = SL_OK;
    for (int i = 0; i < n && st == SL_OK; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        m[i].threads = -1;
        if (!json_is_object(e)) {
            snprintf(err, errlen, "%s: models[%d]: must be an object with \"name\" and \"model\"",
                     where, i);
            st = SL_EINVAL;
            break;
        }
        const char *k;
        json_t *x;
        json_object_foreach(e, k, x)
        {
            if (strncmp(k, "//", 2) == 0)
                continue;
            if (strcmp(k, "name") == 0) {
                if (!json_is_string(x) || !valid_model_name(json_string_value(x))) {
                    snprintf(err, errlen, "%s: models[%d].name: must be " MODEL_NAME_RULE, where, i,
                             SL_MODEL_NAME_MAX);
                    st = SL_EINVAL;
                } else {
                    replace(&m[i].name, json_string_value(x));
                }
            } else if (strcmp(k, "model") == 0) {
                if (!json_is_string(x) || json_string_length(x) == 0) {
                    snprintf(err, errlen,
                             "%s: models[%d].model: must be a non-empty string (as \"model\": "
                             "synthetic[:SHAPE], a .gguf, an HF folder or a .bin)",
                             where, i);
                    st = SL_EINVAL;
                } else {
                    replace(&m[i].spec, json_string_value(x));
                }
            } else if (strcmp(k, "tokenizer") == 0) {
                if (json_is_null(x)) {
                    replace(&m[i].tokenizer, NULL);
                } else if (!json_is_string(x) || json_string_length(x) == 0) {
                    snprintf(err, errlen, "%s: models[%d].tokenizer: must be a path or null", where,
                             i);
                    st = SL_EINVAL;
                } else {
                    replace(&m[i].tokenizer, json_string_value(x));
                }
            } else if (strcmp(k, "threads") == 0) {
                if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                    json_integer_value(x) > 1024) {
                    snprintf(err, errlen,
                             "%s: models[%d].threads: must be an integer from 0 (one per CPU) "
                             "to 1024",
                             where, i);
                    st = SL_EINVAL;
                } else {
                    m[i].threads = (int)json_integer_value(x);
                }
            } else if (strcmp(k, "price") == 0) {
                char what[32];
                snprintf(what, sizeof what, "models[%d].price", i);
                st = parse_price(&m[i].price, x, err, errlen, where, what);
                m[i].has_price = st == SL_OK;
            } else if (strcmp(k, "device") == 0) {
                if (!json_is_string(x) ||
                    sl_worker_device_parse(json_string_value(x), NULL) != SL_OK) {
                    snprintf(err, errlen,
                             "%s: models[%d].device: must be \"auto\", \"cpu\", \"cuda\" or "
                             "\"cuda:N\"",
                             where, i);
                    st = SL_EINVAL;
                } else {
                    replace(&m[i].device, json_string_value(x));
                }
            } else {
                snprintf(err, errlen,
                         "%s: models[%d]: unknown key \"%.40s\" (name, model, tokenizer, "
                         "threads, device, price)",
                         where, i, k);
                st = SL_EINVAL;
            }
            if (st != SL_OK)
                break;
        }
        if (st != SL_OK)
            break;
        if (!m[i].spec) {
            snprintf(err, errlen, "%s: models[%d].model: missing", where, i);
            st = SL_EINVAL;
        } else if (!m[i].name && i > 0) {
            snprintf(err, errlen,
                     "%s: models[%d].name: missing (every model but the first needs a name for "
                     "requests to route by)",
                     where, i);
            st = SL_EINVAL;
        }
        for (int o = 0; o < i && st == SL_OK; o++)
            if (m[i].name && m[o].name && strcmp(m[i].name, m[o].name) == 0) {
                snprintf(err, errlen, "%s: models[%d].name: \"%s\" is also models[%d].name", where,
                         i, m[i].name, o);
                st = SL_EINVAL;
            }
    }
    if (st != SL_OK) {
        models_free(m, n);
        return st;
    }
    models_free(c->engine.models, c->engine.n_models);
    c->engine.models = m;
    c->engine.n_models = n;
    replace(&c->model, m[0].spec);
    replace(&c->tokenizer, m[0].tokenizer);
    return SL_OK;
}

/* "devices": [0, 1, "cuda:2", "cpu", ...], 1 to SL_REPLICAS_MAX entries: an integer N is
 * "cuda:N", a string is as "device". Each model without a "device" of its own runs one worker and
 * scheduler on each. */
static int parse_devices(struct sl_config *c, json_t *v, char *err, size_t errlen,
                         const char *where)
{
    if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > SL_REPLICAS_MAX) {
        snprintf(err, errlen,
                 "%s: \"devices\" must be an array of 1 to %d devices (CUDA ordinals, or strings "
                 "as \"device\")",
                 where, SL_REPLICAS_MAX);
        return SL_EINVAL;
    }
    int n = (int)json_array_size(v);
    char **d = sl_xcalloc((size_t)n, sizeof *d);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        char buf[32];
        if (json_is_integer(e) && json_integer_value(e) >= 0 && json_integer_value(e) < 1024) {
            snprintf(buf, sizeof buf, "cuda:%d", (int)json_integer_value(e));
            d[i] = sl_xstrdup(buf);
        } else if (json_is_string(e) &&
                   sl_worker_device_parse(json_string_value(e), NULL) == SL_OK) {
            d[i] = sl_xstrdup(json_string_value(e));
        } else {
            snprintf(err, errlen,
                     "%s: devices[%d]: must be a CUDA ordinal from 0 to 1023 or \"auto\", "
                     "\"cpu\", \"cuda\" or \"cuda:N\"",
                     where, i);
            devices_free(d, n);
            return SL_EINVAL;
        }
    }
    devices_free(c->engine.devices, c->engine.n_devices);
    c->engine.devices = d;
    c->engine.n_devices = n;
    return SL_OK;
}

void sl_config_models_copy(struct sl_config *dst, const struct sl_config *src)
{
    struct sl_config_model *m = sl_xcalloc((size_t)src->engine.n_models, sizeof *m);
    for (int i = 0; i < src->engine.n_models; i++) {
        const struct sl_config_model *o = &src->engine.models[i];
        m[i].name = o->name ? sl_xstrdup(o->name) : NULL;
        m[i].spec = o->spec ? sl_xstrdup(o->spec) : NULL;
        m[i].tokenizer = o->tokenizer ? sl_xstrdup(o->tokenizer) : NULL;
        m[i].device = o->device ? sl_xstrdup(o->device) : NULL;
        m[i].threads = o->threads;
        /* Prices are reloadable: dst's stay, by position. */
        const struct sl_config_model *p = i < dst->engine.n_models ? &dst->engine.models[i] : NULL;
        m[i].price = p ? p->price : (struct sl_usage_price){0};
        m[i].has_price = p && p->has_price;
    }
    models_free(dst->engine.models, dst->engine.n_models);
    dst->engine.models = m;
    dst->engine.n_models = src->engine.n_models;
    char **d = src->engine.n_devices ? sl_xcalloc((size_t)src->engine.n_devices, sizeof *d) : NULL;
    for (int i = 0; i < src->engine.n_devices; i++)
        d[i] = sl_xstrdup(src->engine.devices[i]);
    devices_free(dst->engine.devices, dst->engine.n_devices);
    dst->engine.devices = d;
    dst->engine.n_devices = src->engine.n_devices;
}

bool sl_config_models_equal(const struct sl_config *a, const struct sl_config *b)
{
    if (a->engine.n_models != b->engine.n_models || a->engine.n_devices != b->engine.n_devices)
        return false;
    for (int i = 0; i < a->engine.n_devices; i++)
        if (strcmp(a->engine.devices[i], b->engine.devices[i]) != 0)
            return false;
    for (int i = 0; i < a->engine.n_models; i++) {
        const struct sl_config_model *x = &a->engine.models[i], *y = &b->engine.models[i];
        const char *xs[4] = {x->name, x->spec, x->tokenizer, x->device};
        const char *ys[4] = {y->name, y->spec, y->tokenizer, y->device};
        for (int k = 0; k < 4; k++)
            if (!(xs[k] == ys[k] || (xs[k] && ys[k] && strcmp(xs[k], ys[k]) == 0)))
                return false;
        if (x->threads != y->threads)
            return false;
    }
    return true;
}

/* Keys read only at start: a reload keeps the running value and says so. */
void sl_config_keep_start_keys(struct sl_config *next, const struct sl_config *cur)
{
#define KEEP_STR(f, name)                                                                          \
    if (!(next->f == cur->f || (next->f && cur->f && strcmp(next->f, cur->f) == 0))) {             \
        sl_log(SL_LOG_WARN, "reload: \"" name "\" changes only on restart; keeping \"%s\"",        \
               cur->f ? cur->f : "null");                                                          \
        free(next->f);                                                                             \
        next->f = cur->f ? sl_xstrdup(cur->f) : NULL;                                              \
    }
#define KEEP_NUM(f, name)                                                                          \
    if (next->f != cur->f) {                                                                       \
        sl_log(SL_LOG_WARN, "reload: \"" name "\" changes only on restart; keeping %g",            \
               (double)cur->f);                                                                    \
        next->f = cur->f;                                                                          \
    }
    KEEP_STR(http.listen_host, "listen_host")
    KEEP_NUM(http.listen_port, "listen_port")
    KEEP_NUM(http.listen_backlog, "listen_backlog")
    KEEP_STR(model, "model")
    KEEP_STR(tokenizer, "tokenizer")
    KEEP_STR(engine.device, "device")
    KEEP_NUM(http.io_threads, "io_threads")
    KEEP_NUM(engine.threads, "threads")
    KEEP_NUM(engine.pin_threads, "pin_threads")
    KEEP_NUM(engine.cpu_int8_activations, "cpu_int8_activations")
    KEEP_STR(engine.cpu_isa, "cpu_isa")
    KEEP_NUM(engine.max_seqs, "max_seqs")
    KEEP_NUM(engine.max_batch_tokens, "max_batch_tokens")
    KEEP_NUM(engine.block_size, "block_size")
    KEEP_NUM(engine.kv_cache_mib, "kv_cache_mib")
    KEEP_NUM(engine.kv_cache_fraction, "kv_cache_fraction")
    if (next->engine.kv_dtype != cur->engine.kv_dtype) {
        sl_log(SL_LOG_WARN, "reload: \"kv_dtype\" changes only on restart; keeping %s",
               sl_kv_dtype_name(cur->engine.kv_dtype));
        next->engine.kv_dtype = cur->engine.kv_dtype;
    }
    /* The TLS listener exists or not from the start; its certificate and key are reloadable. */
    const struct sl_config_tls *ct = &cur->http.tls;
    struct sl_config_tls *nt = &next->http.tls;
    if (!ct->cert != !nt->cert) {
        sl_log(SL_LOG_WARN, "reload: \"tls\" can be %s only on restart; keeping it %s",
               ct->cert ? "removed" : "added", ct->cert ? "as it was" : "off");
        tls_clear(nt);
        nt->listen_host = ct->listen_host ? sl_xstrdup(ct->listen_host) : NULL;
        nt->listen_port = ct->listen_port;
        nt->cert = ct->cert ? sl_xstrdup(ct->cert) : NULL;
        nt->key = ct->key ? sl_xstrdup(ct->key) : NULL;
    }
    /* The URL may hold a password: a reload that changes it says so without writing either. */
    if (!(next->fleet.url == cur->fleet.url ||
          (next->fleet.url && cur->fleet.url && strcmp(next->fleet.url, cur->fleet.url) == 0))) {
        sl_log(SL_LOG_WARN, "reload: \"redis.url\" changes only on restart; keeping the one the "
                            "server started with");
        free(next->fleet.url);
        next->fleet.url = cur->fleet.url ? sl_xstrdup(cur->fleet.url) : NULL;
    }
    KEEP_STR(fleet.key_prefix, "redis.key_prefix")
    KEEP_NUM(fleet.timeout_ms, "redis.timeout_ms")
    KEEP_STR(fleet.password_env, "redis.password_env")
    KEEP_STR(metering.state_dir, "state_dir")
    KEEP_STR(http.tls.listen_host, "tls.listen_host")
    KEEP_NUM(http.tls.listen_port, "tls.listen_port")
#undef KEEP_STR
#undef KEEP_NUM
    /* Each model has its worker and scheduler from the start. */
    if (!sl_config_models_equal(next, cur)) {
        sl_log(SL_LOG_WARN, "reload: \"models\" change only on restart; keeping the %d served",
               cur->engine.n_models);
        sl_config_models_copy(next, cur);
    }
}

/* models[0] is "model" and "tokenizer": a flag or key that set those sets it. */
static void models_sync(struct sl_config *c)
{
    replace(&c->engine.models[0].spec, c->model);
    replace(&c->engine.models[0].tokenizer, c->tokenizer);
    if (c->served_model_name)
        replace(&c->engine.models[0].name, c->served_model_name);
}

static int apply_key(struct sl_config *c, const struct key *k, json_t *v, char *err, size_t errlen,
                     const char *where)
{
    char *base = (char *)c;
    switch (k->type) {
    case K_INT:
    case K_SIZE: {
        if (!json_is_integer(v)) {
            snprintf(err, errlen, "%s: \"%s\" must be an integer", where, k->name);
            return SL_EINVAL;
        }
        json_int_t x = json_integer_value(v);
        if (x < k->min || x > k->max) {
            snprintf(err, errlen, "%s: \"%s\" must be between %ld and %ld, not %lld", where,
                     k->name, k->min, k->max, (long long)x);
            return SL_EINVAL;
        }
        if (k->type == K_INT)
            *(int *)(base + k->off) = (int)x;
        else
            *(size_t *)(base + k->off) = (size_t)x;
        return SL_OK;
    }
    case K_FRACTION: {
        double x = json_is_number(v) ? json_number_value(v) : -1.0;
        if (x < 0.0 || x > 0.95) {
            snprintf(err, errlen, "%s: \"%s\" must be a number from 0 (off) to 0.95", where,
                     k->name);
            return SL_EINVAL;
        }
        *(double *)(base + k->off) = x;
        return SL_OK;
    }
    case K_STR_OR_NULL:
        if (json_is_null(v)) {
            replace((char **)(base + k->off), NULL);
            return SL_OK;
        }
        /* fall through */
    case K_STR:
        if (!json_is_string(v) || json_string_length(v) == 0) {
            snprintf(err, errlen, "%s: \"%s\" must be a non-empty string", where, k->name);
            return SL_EINVAL;
        }
        replace((char **)(base + k->off), json_string_value(v));
        return SL_OK;
    case K_LISTEN: {
        if (!json_is_string(v)) {
            snprintf(err, errlen, "%s: \"listen\" must be a string \"HOST:PORT\"", where);
            return SL_EINVAL;
        }
        char what[512];
        snprintf(what, sizeof what, "%s: \"listen\"", where);
        return parse_listen(&c->http.listen_host, &c->http.listen_port, json_string_value(v), err,
                            errlen, what);
    }
    case K_TLS: return parse_tls(c, v, err, errlen, where);
    case K_PREFIX_CACHE:
        return parse_prefix_cache((struct sl_config_prefix_cache *)(base + k->off), v, err, errlen,
                                  where);
    case K_REDIS: return parse_redis(c, v, err, errlen, where);
    case K_PRICE:
        return parse_price((struct sl_usage_price *)(base + k->off), v, err, errlen, where,
                           "\"price\"");
    case K_WEBHOOK: {
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        if (json_is_null(v)) {
            replace((char **)(base + k->off), NULL);
            return SL_OK;
        }
        struct evhttp_uri *u = s ? evhttp_uri_parse(s) : NULL;
        const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL;
        bool ok = scheme && (strcmp(scheme, "http") == 0 || strcmp(scheme, "https") == 0) &&
                  evhttp_uri_get_host(u) && evhttp_uri_get_host(u)[0] && strlen(s) <= 1024;
        if (u)
            evhttp_uri_free(u);
        if (!ok) {
            snprintf(err, errlen,
                     "%s: \"%s\" must be null or an http:// or https:// URL with a host", where,
                     k->name);
            return SL_EINVAL;
        }
        replace((char **)(base + k->off), s);
        return SL_OK;
    }
    case K_CURRENCY: {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        bool ok = json_is_string(v) && strlen(s) >= 1 && strlen(s) <= 16 &&
                  strlen(s) == json_string_length(v);
        for (const char *p = s; ok && *p; p++)
            ok = *p > ' ' && *p < 0x7f && *p != '"' && *p != '\\';
        if (!ok) {
            snprintf(err, errlen,
                     "%s: \"currency\" must be 1 to 16 printable ASCII characters without spaces "
                     "or quotes (\"USD\", \"EUR\", \"credits\")",
                     where);
            return SL_EINVAL;
        }
        replace((char **)(base + k->off), s);
        return SL_OK;
    }
    case K_MODELS: return parse_models(c, v, err, errlen, where);
    case K_DEVICES: return parse_devices(c, v, err, errlen, where);
    case K_BOOL:
        if (!json_is_boolean(v)) {
            snprintf(err, errlen, "%s: \"%s\" must be true or false", where, k->name);
            return SL_EINVAL;
        }
        *(bool *)(base + k->off) = json_is_true(v);
        return SL_OK;
    case K_MODEL_NAME:
        if (!json_is_null(v) && !(json_is_string(v) && valid_model_name(json_string_value(v)))) {
            snprintf(err, errlen, "%s: \"%s\" must be null or " MODEL_NAME_RULE, where, k->name,
                     SL_MODEL_NAME_MAX);
            return SL_EINVAL;
        }
        replace((char **)(base + k->off), json_is_null(v) ? NULL : json_string_value(v));
        return SL_OK;
    case K_KEY_SHA256: {
        struct sl_key_sha256 *key = (struct sl_key_sha256 *)(base + k->off);
        unsigned char h[32];
        if (json_is_null(v)) {
            *key = (struct sl_key_sha256){0};
            return SL_OK;
        }
        if (!json_is_string(v) || !sl_tenant_hex_decode(json_string_value(v), h)) {
            snprintf(err, errlen,
                     "%s: \"%s\" must be 64 hex digits (the SHA-256 of the key, not the key) or "
                     "null",
                     where, k->name);
            return SL_EINVAL;
        }
        key->set = true;
        memcpy(key->sha256, h, 32);
        return SL_OK;
    }
    case K_KV_DTYPE: {
        const char *s = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(s, "f32") != 0 && strcmp(s, "f16") != 0) {
            snprintf(err, errlen, "%s: \"kv_dtype\" must be \"f32\" or \"f16\"", where);
            return SL_EINVAL;
        }
        *(enum sl_kv_dtype *)(base + k->off) = strcmp(s, "f16") == 0 ? SL_KV_F16 : SL_KV_F32;
        return SL_OK;
    }
    case K_LOG_LEVEL:
        if (!json_is_string(v) || check_log_level(json_string_value(v)) < 0) {
            snprintf(err, errlen, "%s: \"log_level\" must be one of debug, info, warn, error",
                     where);
            return SL_EINVAL;
        }
        replace((char **)(base + k->off), json_string_value(v));
        return SL_OK;
    case K_CPU_ISA:
        if (!json_is_string(v) || !sl_worker_cpu_isa_valid(json_string_value(v))) {
            snprintf(err, errlen, "%s: \"cpu_isa\" must be one of auto, avx512, avx2, scalar",
                     where);
            return SL_EINVAL;
        }
        replace((char **)(base + k->off), json_string_value(v));
        return SL_OK;
    }
    return SL_EINVAL;
}

/* In the order sl_tenancy_load takes them. */
static const char *const tenancy_keys[4] = {"tiers", "tenants", "classify", "admin_key_sha256"};

/* The names of c's models, for the overload steps that name one (NULL for a model without one):
 * fills names (SL_MODELS_MAX) and returns how many. */
static int model_names(const struct sl_config *c, const char *names[SL_MODELS_MAX])
{
    int n = c->engine.n_models < SL_MODELS_MAX ? c->engine.n_models : SL_MODELS_MAX;
    for (int i = 0; i < n; i++)
        names[i] = c->engine.models[i].name;
    return n;
}

enum sl_status sl_config_load_file(struct sl_config *c, const char *path, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line < 1) /* not a syntax error: the file could not be read */
            snprintf(err, errlen, "%s: %s", path, je.text);
        else
            snprintf(err, errlen, "%s: line %d, column %d: %s", path, je.line, je.column, je.text);
        return SL_EFORMAT;
    }
    if (!json_is_object(root)) {
        snprintf(err, errlen, "%s: the top level must be a JSON object", path);
        json_decref(root);
        return SL_EFORMAT;
    }
    const char *name;
    json_t *v;
    int st = SL_OK;
    /* Tenants, tiers and classify refer to each other: applied together after the loop. */
    json_t *tenancy[4] = {NULL, NULL, NULL, NULL};
    json_object_foreach(root, name, v)
    {
        /* Keys starting with "//" are comments, so the shipped example can document itself. */
        if (strncmp(name, "//", 2) == 0)
            continue;
        bool section = false;
        for (int i = 0; i < 4; i++)
            if (strcmp(name, tenancy_keys[i]) == 0) {
                tenancy[i] = v;
                section = true;
            }
        if (section)
            continue;
        const struct key *k = NULL;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (strcmp(keys[i].name, name) == 0)
                k = &keys[i];
        if (!k) {
            snprintf(err, errlen, "%s: unknown key \"%s\"", path, name);
            st = SL_EINVAL;
            break;
        }
        if ((st = apply_key(c, k, v, err, errlen, path)) != SL_OK)
            break;
    }
    if (st == SL_OK && json_object_get(root, "models") &&
        (json_object_get(root, "model") || json_object_get(root, "tokenizer"))) {
        snprintf(err, errlen,
                 "%s: \"model\" and \"tokenizer\" name one model and \"models\" several: give "
                 "one or the other (the first of \"models\" is the default model)",
                 path);
        st = SL_EINVAL;
    }
    if (st == SL_OK && json_object_get(root, "models") &&
        json_object_get(root, "served_model_name")) {
        snprintf(err, errlen,
                 "%s: \"served_model_name\" names the one \"model\": with \"models\", give each "
                 "its \"name\"",
                 path);
        st = SL_EINVAL;
    }
    if (st == SL_OK && json_object_get(root, "devices") && json_object_get(root, "device")) {
        snprintf(err, errlen,
                 "%s: \"device\" names one device and \"devices\" several: give one or the other",
                 path);
        st = SL_EINVAL;
    }
    if (st == SL_OK)
        models_sync(c);
    char why[768];
    const char *names[SL_MODELS_MAX];
    if (st == SL_OK &&
        (st = sl_tenancy_load(&c->tenancy, names, model_names(c, names), tenancy[0], tenancy[1],
                              tenancy[2], tenancy[3], why, sizeof why)) != SL_OK)
        snprintf(err, errlen, "%s: %s", path, why);
    json_decref(root);
    return st;
}

const char *const sl_config_chat_templates[SL_CONFIG_CHAT_TEMPLATES] = {
    "plain", "chatml", "llama2", "llama3", "mistral", "zephyr", "gemma", "phi3",
};

enum sl_status sl_config_validate(const struct sl_config *c, char *err, size_t errlen)
{
    if (c->engine.max_batch_tokens < c->engine.max_seqs) {
        snprintf(err, errlen,
                 "\"max_batch_tokens\" (%d) must be at least \"max_seqs\" (%d) so every running "
                 "sequence can decode in one step",
                 c->engine.max_batch_tokens, c->engine.max_seqs);
        return SL_EINVAL;
    }
    bool known = !c->api.chat_template;
    for (int i = 0; !known && i < SL_CONFIG_CHAT_TEMPLATES; i++)
        known = strcmp(sl_config_chat_templates[i], c->api.chat_template) == 0;
    if (!known) {
        snprintf(err, errlen,
                 "\"chat_template\" must be null (the model's own) or one of plain, chatml, "
                 "llama2, llama3, mistral, zephyr, gemma, phi3, not \"%.40s\"",
                 c->api.chat_template);
        return SL_EINVAL;
    }
    if (sl_worker_device_parse(c->engine.device, NULL) != SL_OK) {
        snprintf(err, errlen,
                 "\"device\" must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", not \"%.40s\"",
                 c->engine.device);
        return SL_EINVAL;
    }
    if (check_log_level(c->log_level) < 0) {
        snprintf(err, errlen, "\"log_level\" must be one of debug, info, warn, error");
        return SL_EINVAL;
    }
    if (!sl_worker_cpu_isa_valid(c->engine.cpu_isa)) {
        snprintf(err, errlen, "\"cpu_isa\" must be one of auto, avx512, avx2, scalar");
        return SL_EINVAL;
    }
    if (c->http.write_hard_cap_bytes <= c->http.write_high_water_bytes) {
        snprintf(err, errlen,
                 "\"write_hard_cap_bytes\" (%zu) must be above \"write_high_water_bytes\" (%zu)",
                 c->http.write_hard_cap_bytes, c->http.write_high_water_bytes);
        return SL_EINVAL;
    }
    if (c->http.tls.cert && (!c->http.tls.key || !c->http.tls.listen_host)) {
        snprintf(err, errlen, "\"tls\" needs \"listen\", \"cert\" and \"key\"");
        return SL_EINVAL;
    }
    if (c->http.tls.cert && c->http.tls.listen_port != 0 &&
        c->http.tls.listen_port == c->http.listen_port &&
        strcmp(c->http.tls.listen_host, c->http.listen_host) == 0) {
        snprintf(err, errlen, "\"tls\".\"listen\" must differ from \"listen\" (%s:%d)",
                 c->http.listen_host, c->http.listen_port);
        return SL_EINVAL;
    }
    if (c->engine.n_models < 1 || c->engine.n_models > SL_MODELS_MAX || !c->engine.models) {
        snprintf(err, errlen, "\"models\": between 1 and %d models are needed", SL_MODELS_MAX);
        return SL_EINVAL;
    }
    for (int i = 0; i < c->engine.n_models; i++) {
        if (!c->engine.models[i].spec || (i > 0 && !c->engine.models[i].name)) {
            snprintf(err, errlen, "models[%d]: needs \"model\"%s", i, i > 0 ? " and \"name\"" : "");
            return SL_EINVAL;
        }
        for (int o = 0; o < i; o++)
            if (c->engine.models[i].name && c->engine.models[o].name &&
                strcmp(c->engine.models[i].name, c->engine.models[o].name) == 0) {
                snprintf(err, errlen, "models[%d].name: \"%s\" is also models[%d].name", i,
                         c->engine.models[i].name, o);
                return SL_EINVAL;
            }
    }
    const char *names[SL_MODELS_MAX];
    return sl_tenancy_validate(&c->tenancy, names, model_names(c, names), err, errlen);
}

struct json_t *sl_config_to_json(const struct sl_config *c)
{
    json_t *root = json_object();
    const char *base = (const char *)c;
    /* From the key table, so a key added there is reported here too. */
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const struct key *k = &keys[i];
        json_t *v = NULL;
        switch (k->type) {
        case K_INT: v = json_integer(*(const int *)(base + k->off)); break;
        case K_SIZE: v = json_integer((json_int_t) * (const size_t *)(base + k->off)); break;
        case K_FRACTION: v = json_real(*(const double *)(base + k->off)); break;
        case K_STR:
        case K_STR_OR_NULL:
        case K_MODEL_NAME:
        case K_CPU_ISA:
        case K_CURRENCY:
        case K_WEBHOOK:
        case K_LOG_LEVEL: {
            const char *s = *(char *const *)(base + k->off);
            v = s ? json_string(s) : json_null();
            break;
        }
        case K_LISTEN: {
            bool v6 = strchr(c->http.listen_host, ':') != NULL;
            v = json_sprintf("%s%s%s:%d", v6 ? "[" : "", c->http.listen_host, v6 ? "]" : "",
                             c->http.listen_port);
            break;
        }
        case K_BOOL: v = json_boolean(*(const bool *)(base + k->off)); break;
        case K_PRICE: v = price_json((const struct sl_usage_price *)(base + k->off)); break;
        case K_PREFIX_CACHE: {
            const struct sl_config_prefix_cache *p =
                (const struct sl_config_prefix_cache *)(base + k->off);
            v = json_pack("{s:b,s:s}", "enabled", p->enabled, "scope", prefix_scopes[p->scope]);
            break;
        }
        case K_KEY_SHA256:
            v = ((const struct sl_key_sha256 *)(base + k->off))->set ? json_string("<redacted>")
                                                                     : json_null();
            break;
        case K_KV_DTYPE:
            v = json_string(sl_kv_dtype_name(*(const enum sl_kv_dtype *)(base + k->off)));
            break;
        case K_MODELS:
            v = json_array();
            for (int i = 0; i < c->engine.n_models; i++) {
                const struct sl_config_model *m = &c->engine.models[i];
                json_t *o =
                    json_pack("{s:s, s:s}", "model", m->spec, "name", m->name ? m->name : "");
                /* null: on "devices", or else "device" */
                json_object_set_new(o, "device", m->device ? json_string(m->device) : json_null());
                if (!m->name)
                    json_object_set_new(o, "name", json_null());
                json_object_set_new(o, "tokenizer",
                                    m->tokenizer ? json_string(m->tokenizer) : json_null());
                json_object_set_new(o, "threads",
                                    m->threads >= 0 ? json_integer(m->threads) : json_null());
                json_object_set_new(o, "price", m->has_price ? price_json(&m->price) : json_null());
                json_array_append_new(v, o);
            }
            break;
        case K_DEVICES:
            v = c->engine.n_devices ? json_array() : json_null();
            for (int i = 0; i < c->engine.n_devices; i++)
                json_array_append_new(v, json_string(c->engine.devices[i]));
            break;
        case K_REDIS:
            if (!c->fleet.url) {
                v = json_null();
            } else {
                /* The URL without its password, if it has one. */
                const char *at = strrchr(c->fleet.url, '@');
                v = json_pack("{s:o,s:s,s:i,s:s}", "url",
                              at ? json_sprintf("redis://<redacted>%s", at)
                                 : json_string(c->fleet.url),
                              "key_prefix", c->fleet.key_prefix, "timeout_ms", c->fleet.timeout_ms,
                              "password_env", c->fleet.password_env);
            }
            break;
        case K_TLS:
            if (!c->http.tls.cert) {
                v = json_null();
            } else {
                /* File paths only: the key's contents never leave the file. */
                bool v6 = strchr(c->http.tls.listen_host, ':') != NULL;
                v = json_pack("{s:o,s:s,s:s}", "listen",
                              json_sprintf("%s%s%s:%d", v6 ? "[" : "", c->http.tls.listen_host,
                                           v6 ? "]" : "", c->http.tls.listen_port),
                              "cert", c->http.tls.cert, "key", c->http.tls.key);
            }
            break;
        }
        json_object_set_new(root, k->name, v);
    }
    sl_tenancy_to_json(&c->tenancy, root);
    return root;
}

void sl_config_usage(FILE *out)
{
    fputs("usage: sluice [--config FILE] [--listen HOST:PORT] [--model SPEC]\n"
          "              [--served-model-name NAME] [--tokenizer PATH] [--check-config FILE]\n"
          "              [--help] [--version]\n"
          "       sluice simulate --trace TRACE.jsonl [...]   (sluice simulate --help)\n"
          "       sluice usage export --state-dir DIR [...]   (sluice usage export --help)\n"
          "\n"
          "  --config FILE       JSON configuration (see conf/sluice.json); flags override it;\n"
          "                      SIGHUP reloads it\n"
          "  --check-config FILE check that the server can start with FILE (and the other\n"
          "                      flags): every model's header and tensor table and its tokenizer\n"
          "                      load, TLS certificate and key load, the listen addresses are\n"
          "                      free; exit 0 when it can, 2 naming what fails\n"
          "  --listen HOST:PORT  address to serve HTTP on (default 127.0.0.1:8080; port 0 picks "
          "one)\n"
          "  --model SPEC        synthetic[:SHAPE][:f32|f16|bf16|q8_0] with SHAPE one of\n"
          "                      ",
          out);
    for (int i = 0; sl_model_synthetic_shape(i); i++)
        fprintf(out, "%s%s", i ? ", " : "", sl_model_synthetic_shape(i));
    fputs(" (default tiny),\n"
          "                      a GGUF file (.gguf), a Hugging Face folder (config.json,\n"
          "                      model.safetensors, tokenizer.json), or a llama2.c checkpoint\n"
          "                      (.bin) (default synthetic)\n"
          "  --served-model-name NAME\n"
          "                      the id requests send as \"model\" and /v1/models lists\n"
          "                      (default: the model's own id; SPEC as given is accepted too)\n"
          "  --tokenizer PATH    llama2.c tokenizer.bin, for a .bin model only\n"
          "  --help              print this help and exit\n"
          "  --version           print the version and exit\n"
          "\n"
          "  simulate            replay a request trace through the scheduler under a virtual\n"
          "                      clock, on a cost model instead of the engine (simulate --help)\n",
          out);
}

/* Returns the value of flag argv[*i] ("--f V" or "--f=V"), advancing *i, or NULL. */
static const char *flag_value(int argc, char **argv, int *i, const char *flag, char *err,
                              size_t errlen)
{
    const char *a = argv[*i];
    size_t fl = strlen(flag);
    if (a[fl] == '=')
        return a + fl + 1;
    if (*i + 1 >= argc) {
        snprintf(err, errlen, "%s needs a value", flag);
        return NULL;
    }
    return argv[++*i];
}

static bool is_flag(const char *a, const char *flag)
{
    size_t fl = strlen(flag);
    return strncmp(a, flag, fl) == 0 && (a[fl] == '\0' || a[fl] == '=');
}

enum sl_status sl_config_from_args(struct sl_config *c, int argc, char **argv,
                                   enum sl_cli_action *action, char *err, size_t errlen)
{
    *action = SL_CLI_SERVE;
    /* The file first, wherever --config stands, so flags always override it. */
    for (int i = 1; i < argc; i++) {
        bool check = is_flag(argv[i], "--check-config");
        if (check || is_flag(argv[i], "--config")) {
            const char *v =
                flag_value(argc, argv, &i, check ? "--check-config" : "--config", err, errlen);
            if (!v)
                return SL_EINVAL;
            if (check)
                *action = SL_CLI_CHECK;
            int st = sl_config_load_file(c, v, err, errlen);
            if (st != SL_OK)
                return st;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = SL_CLI_HELP;
            return SL_OK;
        } else if (strcmp(a, "--version") == 0) {
            *action = SL_CLI_VERSION;
            return SL_OK;
        } else if (is_flag(a, "--config") || is_flag(a, "--check-config")) {
            if (!flag_value(argc, argv, &i,
                            a[2] == 'c' && a[3] == 'h' ? "--check-config" : "--config", err,
                            errlen))
                return SL_EINVAL;
        } else if (is_flag(a, "--listen")) {
            if (!(v = flag_value(argc, argv, &i, "--listen", err, errlen)))
                return SL_EINVAL;
            if (parse_listen(&c->http.listen_host, &c->http.listen_port, v, err, errlen,
                             "--listen") != SL_OK)
                return SL_EINVAL;
        } else if (is_flag(a, "--model")) {
            if (!(v = flag_value(argc, argv, &i, "--model", err, errlen)))
                return SL_EINVAL;
            if (!*v) {
                snprintf(err, errlen, "--model needs a non-empty value");
                return SL_EINVAL;
            }
            replace(&c->model, v);
        } else if (is_flag(a, "--served-model-name")) {
            if (!(v = flag_value(argc, argv, &i, "--served-model-name", err, errlen)))
                return SL_EINVAL;
            if (!valid_model_name(v)) {
                snprintf(err, errlen, "--served-model-name: must be " MODEL_NAME_RULE,
                         SL_MODEL_NAME_MAX);
                return SL_EINVAL;
            }
            replace(&c->served_model_name, v);
        } else if (is_flag(a, "--tokenizer")) {
            if (!(v = flag_value(argc, argv, &i, "--tokenizer", err, errlen)))
                return SL_EINVAL;
            replace(&c->tokenizer, *v ? v : NULL);
        } else {
            snprintf(err, errlen, "unknown flag \"%s\" (see --help)", a);
            return SL_EINVAL;
        }
    }
    models_sync(c);
    return sl_config_validate(c, err, errlen);
}

int sl_config_sched_tiers(const struct sl_config *c, struct sl_sched_tier *out, int max)
{
    int n = c->tenancy.n_tiers < max ? c->tenancy.n_tiers : max;
    for (int i = 0; i < n; i++)
        out[i] = c->tenancy.tiers[i].sched;
    return n;
}
