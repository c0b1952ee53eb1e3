/* Classification: the ordered rules that put a request into a tier (conf/sluice.json's
 * "classify"). An explicit request for a tier (the tier header, OpenAI's service_tier) is
 * honoured or refused, never silently replaced; a shape rule only suggests, and one whose tier
 * the tenant may not use lets the next rule decide. Refusals are a status and a reason, in no
 * API's words: the gateway words them for its API.
 */
#include "admission_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool is_space(char c)
{
    return c == ' ' || c == '\t';
}

_Static_assert(SL_TIER_NAME_MAX == SL_SCHED_TIER_NAME_MAX, "tier names fit the scheduler's");
_Static_assert(SL_TIERS_MAX <= SL_SCHED_MAX_TIERS, "every configured tier reaches the scheduler");

int sl_tier_find(const struct sl_tenancy *cfg, const char *name, size_t len)
{
    for (int i = 0; i < cfg->n_tiers; i++)
        if (strlen(cfg->tiers[i].sched.name) == len &&
            memcmp(cfg->tiers[i].sched.name, name, len) == 0)
            return i;
    return -1;
}

static bool allowed(const struct sl_tenant *t, int tier)
{
    return tier >= 0 && tier < SL_TIERS_MAX && (t->tiers >> tier & 1u);
}

void sl_admit_quote(char *out, size_t outlen, const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < outlen && i < 40; i++)
        out[n++] = s[i] >= ' ' && s[i] < 0x7f ? s[i] : '?';
    out[n] = '\0';
}

static void tier_list(const struct sl_tenancy *cfg, const struct sl_tenant *t, char *out,
                      size_t outlen)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < cfg->n_tiers && n < outlen; i++)
        if (!t || allowed(t, i))
            n += (size_t)snprintf(out + n, outlen - n, "%s%s", n ? ", " : "",
                                  cfg->tiers[i].sched.name);
}

static int error_set(struct sl_admit_error *e, enum sl_status status, const char *param,
                     const char *code, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Fills e and returns its status. */
static int error_set(struct sl_admit_error *e, enum sl_status status, const char *param,
                     const char *code, const char *fmt, ...)
{
    e->status = status;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

/* An explicit request for `tier` through `param`: a tier the tenant may not use is refused
 * rather than silently replaced, so the client learns it did not get what it asked for. */
static int explicit_tier(const struct sl_tenancy *cfg, const struct sl_tenant *t, int tier,
                         const char *param, int *out, struct sl_admit_error *err)
{
    char list[256];
    if (!allowed(t, tier)) {
        tier_list(cfg, t, list, sizeof list);
        return error_set(err, SL_EPERM, param, "tier_not_allowed",
                         "Tenant '%s' may not use tier '%s' (requested by '%s'); its tiers "
                         "are: %s.",
                         t->name, cfg->tiers[tier].sched.name, param, list);
    }
    *out = tier;
    return SL_OK;
}

static int unknown_tier(const struct sl_tenancy *cfg, const char *param, const char *v, size_t len,
                        struct sl_admit_error *err)
{
    char q[48], list[256];
    sl_admit_quote(q, sizeof q, v, len);
    tier_list(cfg, NULL, list, sizeof list);
    return error_set(err, SL_EINVAL, param, "invalid_tier",
                     "Invalid '%s': unknown tier '%s'; this server's tiers are: %s.", param, q,
                     list);
}

bool sl_tier_classify_needs_body(const struct sl_tenancy *cfg)
{
    for (int i = 0; i < cfg->n_classify; i++) {
        const struct sl_tier_rule *r = &cfg->classify[i];
        if (r->kind == SL_RULE_SERVICE_TIER ||
            (r->kind == SL_RULE_MATCH && (r->stream >= 0 || r->max_tokens_above >= 0)))
            return true;
    }
    return false;
}

enum sl_status sl_tier_classify(const struct sl_tenancy *cfg, const struct sl_tenant *t,
                                const struct sl_tier_request *rq, int *tier,
                                struct sl_admit_error *err)
{
    for (int i = 0; i < cfg->n_classify; i++) {
        const struct sl_tier_rule *r = &cfg->classify[i];
        switch (r->kind) {
        case SL_RULE_HEADER: {
            const char *v = rq->header;
            size_t n = rq->header_len;
            while (n && is_space(*v))
                v++, n--;
            while (n && is_space(v[n - 1]))
                n--;
            if (!v || !n)
                break;
            int k = sl_tier_find(cfg, v, n);
            if (k < 0)
                return unknown_tier(cfg, SL_TIER_HEADER, v, n, err);
            return explicit_tier(cfg, t, k, SL_TIER_HEADER, tier, err);
        }
        case SL_RULE_SERVICE_TIER: {
            const char *v = rq->service_tier;
            if (!v)
                break;
            int k = -1;
            bool mapped = false;
            for (int j = 0; j < r->n_map && !mapped; j++)
                if (strcmp(r->map[j].value, v) == 0) {
                    k = r->map[j].tier;
                    mapped = true;
                }
            if (!mapped)
                k = sl_tier_find(cfg, v, strlen(v));
            /* Mapped to null, or OpenAI's own "auto" and "default" left unmapped: no
             * preference, the next rule decides. */
            if (k < 0 && (mapped || strcmp(v, "auto") == 0 || strcmp(v, "default") == 0))
                break;
            if (k < 0)
                return unknown_tier(cfg, "service_tier", v, strlen(v), err);
            return explicit_tier(cfg, t, k, "service_tier", tier, err);
        }
        case SL_RULE_MATCH:
            if (r->path &&
                !(strlen(r->path) == rq->path_len && memcmp(r->path, rq->path, rq->path_len) == 0))
                break;
            if (r->stream >= 0 && r->stream != (int)rq->stream)
                break;
            if (r->max_tokens_above >= 0 && rq->max_tokens <= r->max_tokens_above)
                break;
            /* A shape says what suits the request, not what the client asked for: a tier the
             * tenant may not use just lets the next rule decide. */
            if (!allowed(t, r->tier) || r->tier >= cfg->n_tiers)
                break;
            *tier = r->tier;
            return SL_OK;
        case SL_RULE_TENANT_DEFAULT: *tier = t->default_tier; return SL_OK;
        }
    }
    *tier = t->default_tier;
    return SL_OK;
}
