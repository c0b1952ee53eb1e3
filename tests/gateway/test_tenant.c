/* Tenants and tiers in the gateway: Bearer keys and the tier header, the scheduler's tier table
 * from a configuration, classification's refusals as OpenAI errors, and what /admin/config shows.
 * Tenants and classification on their own are tests/admission's. */
#include <criterion/criterion.h>

#include "config_impl.h"
#include "gateway_impl.h"
#include "http_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* SHA-256 of the keys below, from `printf %s KEY | sha256sum` (not from the code under test). */
#define KEY_A "sk-alice-0123456789abcdefXYZ"
#define HASH_A "4e3cf284f86ed2e2912a406e093fde194fffbfc71792276277eb201998cc4cfe"
#define KEY_B "sk-bob-0123456789abcdefXYZ"
#define HASH_B "ca94e0a18defaf16a73804c392e6898bd1b71c8a2fdf1ec61e574517dadbedca"
#define KEY_C "sk-carol-0123456789abcdefXYZ"
#define HASH_C "ce548d28bf71aa9d30cf3e8667a790d9244416b551883d5c1d8753b04686d643"
#define KEY_ADMIN "admin-secret-key-0123456789"
#define HASH_ADMIN "4863aec637069806d797219f620402072ed601f239fbc9cb3533c91cc53c1611"

static char *write_tmp(const char *content)
{
    char *path = strdup("/tmp/sluice-tenant-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    close(fd);
    return path;
}

static int load(struct sl_config *c, const char *content, char *err, size_t errlen)
{
    char *path = write_tmp(content);
    int st = sl_config_load_file(c, path, err, errlen);
    unlink(path);
    free(path);
    return st;
}

static const char tiers3[] =
    "\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,\"ttft_slo_ms\":1000,"
    "\"tpot_slo_ms\":100},\"batch\":{\"priority\":2,\"weight\":1,\"ttft_slo_ms\":60000,"
    "\"tpot_slo_ms\":1000},\"gold\":{\"priority\":1,\"weight\":2,\"ttft_slo_ms\":500,"
    "\"tpot_slo_ms\":50}}";

/* Three tiers, tenants alice (interactive, batch; default interactive), bob (batch only) and
 * carol (gold, batch; default gold), and the given rules. */
static void load_world(struct sl_config *c, const char *classify)
{
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{%s,\"tenants\":["
             "{\"name\":\"alice\",\"key_sha256\":\"" HASH_A "\",\"tiers\":[\"interactive\","
             "\"batch\"],\"default_tier\":\"interactive\"},"
             "{\"name\":\"bob\",\"key_sha256\":\"" HASH_B "\",\"tiers\":[\"batch\"],"
             "\"default_tier\":\"batch\"},"
             "{\"name\":\"carol\",\"key_sha256\":\"" HASH_C "\",\"tiers\":[\"gold\",\"batch\"],"
             "\"default_tier\":\"gold\"}],"
             "\"admin_key_sha256\":\"" HASH_ADMIN "\"%s%s}",
             tiers3, classify ? ",\"classify\":" : "", classify ? classify : "");
    sl_config_init(c);
    char err[512] = "";
    cr_assert_eq(load(c, buf, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(sl_config_validate(c, err, sizeof err), SL_OK, "%s", err);
}

static bool bearer(const char *v, const char *want)
{
    const char *k = NULL;
    size_t n = 0;
    bool ok = sl_http_bearer(v, v ? strlen(v) : 0, &k, &n);
    if (!want)
        return !ok;
    return ok && n == strlen(want) && memcmp(k, want, n) == 0;
}

Test(gateway, bearer_key_is_extracted_when_scheme_is_bearer)
{
    cr_assert(bearer("Bearer sk-1", "sk-1"));
    cr_assert(bearer("bearer sk-1", "sk-1"));
    cr_assert(bearer("BEARER \t sk-1  ", "sk-1"));
    cr_assert(bearer("  Bearer sk-1", "sk-1"));
    cr_assert(bearer("Bearer a b", "a b"));
    cr_assert(bearer(NULL, NULL));
    cr_assert(bearer("", NULL));
    cr_assert(bearer("Bearer", NULL));
    cr_assert(bearer("Bearer    ", NULL));
    cr_assert(bearer("Bearersk-1", NULL));
    cr_assert(bearer("Basic c2s6MQ==", NULL));
    cr_assert(bearer("sk-1", NULL));
}

Test(gateway, parser_records_key_and_tier_headers_when_present_and_forgets_them_after)
{
    const char first[] = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer sk-1 "
                         "\r\nX-SLUICE-TIER: batch\r\nContent-Length: 2\r\n\r\n{}";
    const char second[] = "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
    /* Whole, then one byte at a time (every split of the head). */
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        struct sl_http_parser p;
        sl_http_parser_init(&p, 16384, 1 << 20);
        enum sl_http_parse st = SL_HTTP_PARSE_MORE;
        if (bytewise)
            for (size_t i = 0; i < sizeof first - 1; i++)
                st = sl_http_parser_feed(&p, first + i, 1);
        else
            st = sl_http_parser_feed(&p, first, sizeof first - 1);
        cr_assert_eq(st, SL_HTTP_PARSE_DONE);
        cr_assert(sl_http_span_eq(&p, p.authorization, "Bearer sk-1"));
        struct sl_http_span tier;
        cr_assert(sl_http_parser_header(&p, SL_TIER_HEADER, &tier));
        cr_assert(sl_http_span_eq(&p, tier, "batch"));
        sl_http_parser_feed(&p, second, sizeof second - 1);
        /* A kept-alive connection's next request must not inherit the previous one's key. */
        cr_assert_eq(sl_http_parser_next(&p), SL_HTTP_PARSE_DONE);
        cr_assert(sl_http_span_eq(&p, sl_http_parser_path(&p), "/v1/models"));
        cr_assert_eq(p.authorization.len, 0);
        cr_assert_not(sl_http_parser_header(&p, SL_TIER_HEADER, &tier));
        sl_http_parser_dispose(&p);
    }
}

Test(gateway, scheduler_gets_every_tier_in_order_when_config_is_converted)
{
    struct sl_config c;
    load_world(&c, "[{\"tenant_default\":true}]");
    struct sl_sched_tier t[SL_SCHED_MAX_TIERS];
    cr_assert_eq(sl_config_sched_tiers(&c, t, SL_SCHED_MAX_TIERS), 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_str_eq(t[i].name, c.tenancy.tiers[i].sched.name,
                         "same order: a request's index holds");
        cr_assert_eq(t[i].priority, c.tenancy.tiers[i].sched.priority);
        cr_assert_eq(t[i].weight, c.tenancy.tiers[i].sched.weight);
        cr_assert_eq(t[i].ttft_slo_ms, c.tenancy.tiers[i].sched.ttft_slo_ms);
        cr_assert_eq(t[i].tpot_slo_ms, c.tenancy.tiers[i].sched.tpot_slo_ms);
    }
    cr_assert_eq(t[2].weight, 2);
    cr_assert_eq(sl_config_sched_tiers(&c, t, 1), 1, "bounded by the caller's array");
    sl_config_dispose(&c);
}

struct cls {
    int st;
    int tier;
    struct sl_openai_error err;
};

static struct cls run_classify(const struct sl_config *c, const char *tenant, const char *header,
                               const char *service_tier, const char *path, bool stream,
                               int max_tokens)
{
    const struct sl_tenant *t = NULL;
    for (int i = 0; i < c->tenancy.n_tenants; i++)
        if (strcmp(c->tenancy.tenants[i].name, tenant) == 0)
            t = &c->tenancy.tenants[i];
    cr_assert_not_null(t, "no tenant %s", tenant);
    struct sl_tier_request rq = {
        .header = header,
        .header_len = header ? strlen(header) : 0,
        .service_tier = service_tier,
        .path = path,
        .path_len = strlen(path),
        .stream = stream,
        .max_tokens = max_tokens,
    };
    struct cls r = {.tier = -7};
    struct sl_admit_error why;
    memset(&r.err, 0, sizeof r.err);
    r.st = sl_tier_classify(&c->tenancy, t, &rq, &r.tier, &why);
    /* What a client sees: the gateway's OpenAI error for admission's refusal. */
    if (r.st != SL_OK)
        sl_openai_error_from_admit(&r.err, &why);
    return r;
}

static const char rules[] =
    "[{\"header\":\"x-sluice-tier\"},"
    "{\"service_tier\":{\"priority\":\"interactive\",\"flex\":\"batch\",\"scale\":\"gold\","
    "\"default\":null}},"
    "{\"path\":\"/v1/chat/completions\",\"tier\":\"gold\"},"
    "{\"stream\":true,\"tier\":\"interactive\"},"
    "{\"max_tokens_above\":100,\"tier\":\"batch\"},"
    "{\"tenant_default\":true}]";

#define CL(tenant, header, st, path, stream, mt)                                                   \
    run_classify(&c, tenant, header, st, path, stream, mt)
#define P "/v1/completions"

Test(gateway, explicit_tier_is_refused_when_unknown_or_not_allowed)
{
    struct sl_config c;
    load_world(&c, rules);
    struct cls r = CL("alice", "platinum", NULL, P, false, 5);
    cr_assert_eq(r.st, SL_EINVAL);
    cr_assert_eq(r.err.http, 400);
    cr_assert_str_eq(r.err.param, "x-sluice-tier");
    cr_assert(strstr(r.err.message, "platinum"), "%s", r.err.message);
    r = CL("alice", NULL, "turbo", P, false, 5);
    cr_assert_eq(r.err.http, 400);
    cr_assert_str_eq(r.err.param, "service_tier");
    cr_assert(strstr(r.err.message, "turbo"), "%s", r.err.message);
    /* Known tiers the tenant may not use: 403, even when a later rule would have placed it. */
    r = CL("bob", "interactive", NULL, P, false, 5);
    cr_assert_eq(r.st, SL_EPERM);
    cr_assert_eq(r.err.http, 403);
    cr_assert_str_eq(r.err.param, "x-sluice-tier");
    cr_assert_str_eq(sl_openai_error_type(r.err.http), "permission_error");
    cr_assert(strstr(r.err.message, "bob"), "%s", r.err.message);
    r = CL("bob", NULL, "priority", P, false, 5);
    cr_assert_eq(r.err.http, 403);
    cr_assert_str_eq(r.err.param, "service_tier");
    r = CL("alice", NULL, "scale", P, false, 5);
    cr_assert_eq(r.err.http, 403, "scale maps to gold, which alice may not use");
    /* Client text in a message is clipped to printable ASCII. */
    r = CL("alice", "x\x01y\xff", NULL, P, false, 5);
    cr_assert_eq(r.err.http, 400);
    cr_assert(strstr(r.err.message, "'x?y?'"), "%s", r.err.message);
    sl_config_dispose(&c);
}

/* ---- the effective configuration ---- */

Test(gateway, config_json_redacts_every_hash_when_reported)
{
    struct sl_config c;
    load_world(&c, rules);
    json_t *j = sl_config_to_json(&c);
    char *s = json_dumps(j, JSON_COMPACT);
    cr_assert_null(strstr(s, HASH_A), "%s", s);
    cr_assert_null(strstr(s, HASH_B), "%s", s);
    cr_assert_null(strstr(s, HASH_C), "%s", s);
    cr_assert_null(strstr(s, HASH_ADMIN), "%s", s);
    cr_assert_str_eq(json_string_value(json_object_get(j, "admin_key_sha256")), "<redacted>");
    json_t *tenants = json_object_get(j, "tenants");
    cr_assert_eq(json_array_size(tenants), 3);
    json_t *bob = json_array_get(tenants, 1);
    cr_assert_str_eq(json_string_value(json_object_get(bob, "name")), "bob");
    cr_assert_str_eq(json_string_value(json_object_get(bob, "key_sha256")), "<redacted>");
    cr_assert_str_eq(json_string_value(json_object_get(bob, "default_tier")), "batch");
    /* Rules come back as they were written. */
    json_t *want = json_loads(rules, 0, NULL);
    cr_assert(json_equal(json_object_get(j, "classify"), want), "%s", s);
    json_decref(want);
    json_t *gold = json_object_get(json_object_get(j, "tiers"), "gold");
    cr_assert_eq(json_integer_value(json_object_get(gold, "ttft_slo_ms")), 500);
    /* The plain keys are there too. */
    cr_assert_str_eq(json_string_value(json_object_get(j, "listen")), "127.0.0.1:8080");
    cr_assert_eq(json_integer_value(json_object_get(j, "max_seqs")), 32);
    free(s);
    json_decref(j);
    sl_config_dispose(&c);
}

Test(gateway, shipped_example_defines_interactive_and_batch_when_read)
{
    const char *root = getenv("SL_SOURCE_ROOT");
    cr_assert_not_null(root);
    char path[4096];
    snprintf(path, sizeof path, "%s/conf/sluice.json", root);
    struct sl_config c;
    sl_config_init(&c);
    char err[512] = "";
    cr_assert_eq(sl_config_load_file(&c, path, err, sizeof err), SL_OK, "%s", err);
    cr_assert_geq(sl_tier_find(&c.tenancy, "interactive", 11), 0);
    cr_assert_geq(sl_tier_find(&c.tenancy, "batch", 5), 0);
    cr_assert_eq(c.tenancy.n_tenants, 0, "the shipped file has no tenant keys to leak");
    cr_assert_gt(c.tenancy.n_classify, 0);
    sl_config_dispose(&c);
}

Test(gateway, query_parameters_are_found_and_decoded_or_refused_when_bad)
{
    struct sl_exchange x;
    memset(&x, 0, sizeof x);
    const char *q =
        "from=2026-11-01&tenant=a%20b+c&group_by=model%2Ctier&empty=&flag&bad=%4&nul=%00";
    x.query = (struct sl_strv){q, strlen(q)};
    char v[32];
    cr_assert_eq(sl_exchange_query_param(&x, "from", v, sizeof v), 1);
    cr_assert_str_eq(v, "2026-11-01");
    cr_assert_eq(sl_exchange_query_param(&x, "tenant", v, sizeof v), 1);
    cr_assert_str_eq(v, "a b c");
    cr_assert_eq(sl_exchange_query_param(&x, "group_by", v, sizeof v), 1);
    cr_assert_str_eq(v, "model,tier");
    cr_assert_eq(sl_exchange_query_param(&x, "empty", v, sizeof v), 1);
    cr_assert_str_eq(v, "");
    cr_assert_eq(sl_exchange_query_param(&x, "flag", v, sizeof v), 1);
    cr_assert_eq(sl_exchange_query_param(&x, "to", v, sizeof v), 0);
    cr_assert_eq(sl_exchange_query_param(&x, "fro", v, sizeof v), 0, "whole names only");
    cr_assert_eq(sl_exchange_query_param(&x, "bad", v, sizeof v), -1);
    cr_assert_eq(sl_exchange_query_param(&x, "nul", v, sizeof v), -1);
    cr_assert_eq(sl_exchange_query_param(&x, "from", v, 5), -1, "too long for the buffer");
}
