/* Tenants and classification on their own: the tenancy sections (every error names its path and
 * never a key), key lookup and redaction, and the rules that put a request into a tier. The
 * HTTP and OpenAI words for classification's refusals are the gateway's (tests/gateway). */
#include <criterion/criterion.h>

#include "admission_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SHA-256 of the keys below, from `printf %s KEY | sha256sum` (not from the code under test). */
#define KEY_A "sk-alice-0123456789abcdefXYZ"
#define HASH_A "4e3cf284f86ed2e2912a406e093fde194fffbfc71792276277eb201998cc4cfe"
#define KEY_B "sk-bob-0123456789abcdefXYZ"
#define HASH_B "ca94e0a18defaf16a73804c392e6898bd1b71c8a2fdf1ec61e574517dadbedca"
#define KEY_C "sk-carol-0123456789abcdefXYZ"
#define HASH_C "ce548d28bf71aa9d30cf3e8667a790d9244416b551883d5c1d8753b04686d643"
#define KEY_ADMIN "admin-secret-key-0123456789"
#define HASH_ADMIN "4863aec637069806d797219f620402072ed601f239fbc9cb3533c91cc53c1611"

/* Applies the tenancy sections of a configuration file's text, as the configuration loader does
 * (its other keys, and models for "model:NAME" steps, are the gateway's). */
static int load(struct sl_tenancy *c, const char *content, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loads(content, JSON_REJECT_DUPLICATES, &je);
    cr_assert_not_null(root, "%s: %s", content, je.text);
    int st = sl_tenancy_load(c, NULL, 0, json_object_get(root, "tiers"),
                             json_object_get(root, "tenants"), json_object_get(root, "classify"),
                             json_object_get(root, "admin_key_sha256"), err, errlen);
    json_decref(root);
    return st;
}

static int validate(const struct sl_tenancy *c, char *err, size_t errlen)
{
    return sl_tenancy_validate(c, NULL, 0, err, errlen);
}

static const char tiers3[] =
    "\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,\"ttft_slo_ms\":1000,"
    "\"tpot_slo_ms\":100},\"batch\":{\"priority\":2,\"weight\":1,\"ttft_slo_ms\":60000,"
    "\"tpot_slo_ms\":1000},\"gold\":{\"priority\":1,\"weight\":2,\"ttft_slo_ms\":500,"
    "\"tpot_slo_ms\":50}}";

/* Three tiers, tenants alice (interactive, batch; default interactive), bob (batch only) and
 * carol (gold, batch; default gold), and the given rules. */
static void load_world(struct sl_tenancy *c, const char *classify)
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
    sl_tenancy_init(c);
    char err[512] = "";
    cr_assert_eq(load(c, buf, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(validate(c, err, sizeof err), SL_OK, "%s", err);
}

static void hex(const unsigned char h[32], char out[65])
{
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", h[i]);
}

/* ---- keys ---- */

Test(admission, sha256_matches_known_digests_when_hashing)
{
    unsigned char h[32];
    char x[65];
    sl_tenant_sha256("abc", 3, h);
    hex(h, x);
    cr_assert_str_eq(x, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sl_tenant_sha256("", 0, h);
    hex(h, x);
    cr_assert_str_eq(x, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sl_tenant_sha256(KEY_A, strlen(KEY_A), h);
    hex(h, x);
    cr_assert_str_eq(x, HASH_A);
}

Test(admission, hex_decode_accepts_only_64_hex_digits_when_parsing_hashes)
{
    unsigned char h[32], u[32];
    cr_assert(sl_tenant_hex_decode(HASH_A, h));
    char upper[65];
    for (int i = 0; i < 65; i++)
        upper[i] = (char)(HASH_A[i] >= 'a' && HASH_A[i] <= 'f' ? HASH_A[i] - 32 : HASH_A[i]);
    cr_assert(sl_tenant_hex_decode(upper, u));
    cr_assert_eq(memcmp(h, u, 32), 0);
    char x[65];
    hex(h, x);
    cr_assert_str_eq(x, HASH_A);
    cr_assert_not(sl_tenant_hex_decode(NULL, h));
    cr_assert_not(sl_tenant_hex_decode("", h));
    cr_assert_not(sl_tenant_hex_decode(HASH_A "0", h));
    char bad[65];
    memcpy(bad, HASH_A, 65);
    bad[63] = 'g';
    cr_assert_not(sl_tenant_hex_decode(bad, h));
    bad[63] = '\0';
    cr_assert_not(sl_tenant_hex_decode(bad, h));
}

Test(admission, lookup_finds_each_tenant_by_key_when_keys_are_known)
{
    struct sl_tenancy c;
    load_world(&c, NULL);
    const struct sl_tenant *t = sl_tenant_lookup(&c, KEY_A, strlen(KEY_A));
    cr_assert(t && strcmp(t->name, "alice") == 0);
    t = sl_tenant_lookup(&c, KEY_B, strlen(KEY_B));
    cr_assert(t && strcmp(t->name, "bob") == 0);
    t = sl_tenant_lookup(&c, KEY_C, strlen(KEY_C));
    cr_assert(t && strcmp(t->name, "carol") == 0, "the last tenant is found too");
    cr_assert_null(sl_tenant_lookup(&c, "sk-nobody", 9));
    cr_assert_null(sl_tenant_lookup(&c, KEY_A, strlen(KEY_A) - 1), "a prefix is not the key");
    cr_assert_null(sl_tenant_lookup(&c, NULL, 0));
    cr_assert_null(sl_tenant_lookup(&c, "", 0));
    /* The hash is not a key. */
    cr_assert_null(sl_tenant_lookup(&c, HASH_A, strlen(HASH_A)));
    /* Tenant keys do not open /admin/, and the admin key is nobody's API key. */
    cr_assert(sl_tenant_admin_check(&c, KEY_ADMIN, strlen(KEY_ADMIN)));
    cr_assert_not(sl_tenant_admin_check(&c, KEY_A, strlen(KEY_A)));
    cr_assert_not(sl_tenant_admin_check(&c, NULL, 0));
    cr_assert_null(sl_tenant_lookup(&c, KEY_ADMIN, strlen(KEY_ADMIN)));
    sl_tenancy_dispose(&c);
}

Test(admission, lookup_gives_anonymous_tenant_when_no_tenants_are_configured)
{
    struct sl_tenancy c;
    sl_tenancy_init(&c);
    const struct sl_tenant *t = sl_tenant_lookup(&c, NULL, 0);
    cr_assert_eq(t, &sl_tenant_anonymous);
    cr_assert_eq(sl_tenant_lookup(&c, "whatever", 8), &sl_tenant_anonymous);
    cr_assert_not(sl_tenant_admin_check(&c, KEY_ADMIN, strlen(KEY_ADMIN)),
                  "no admin key configured: nothing opens /admin/");
    sl_tenancy_dispose(&c);
}

Test(admission, redacted_key_shows_at_most_ends_when_shown_to_client)
{
    char out[32];
    sl_tenant_key_redact("sk-abcdefghijklmnopwxyz", 23, out, sizeof out);
    cr_assert_str_eq(out, "sk-ab****wxyz");
    sl_tenant_key_redact("short-key", 9, out, sizeof out);
    cr_assert_str_eq(out, "****");
    sl_tenant_key_redact("sk-abcdefghijklmno\"pwxyz", 24, out, sizeof out);
    cr_assert_str_eq(out, "****", "a key that would need escaping is not quoted at all");
    sl_tenant_key_redact("sk-abcdefghij\x01klmnopwxyz", 24, out, sizeof out);
    cr_assert_str_eq(out, "****");
}

/* ---- configuration ---- */

Test(admission, tenancy_sections_load_when_valid)
{
    struct sl_tenancy c;
    load_world(&c, "[{\"header\":\"x-sluice-tier\"},{\"service_tier\":{\"flex\":\"batch\","
                   "\"auto\":null}},{\"path\":\"/v1/completions\",\"stream\":true,"
                   "\"tier\":\"gold\"},{\"max_tokens_above\":100,\"tier\":\"batch\"},"
                   "{\"tenant_default\":true}]");
    cr_assert_eq(c.n_tiers, 3);
    cr_assert_str_eq(c.tiers[0].sched.name, "interactive");
    cr_assert_str_eq(c.tiers[1].sched.name, "batch");
    cr_assert_str_eq(c.tiers[2].sched.name, "gold");
    cr_assert_eq(c.tiers[2].sched.priority, 1);
    cr_assert_eq(c.tiers[2].sched.weight, 2);
    cr_assert_eq(c.tiers[2].sched.ttft_slo_ms, 500);
    cr_assert_eq(c.tiers[2].sched.tpot_slo_ms, 50);
    cr_assert_eq(c.n_tenants, 3);
    cr_assert_str_eq(c.tenants[2].name, "carol");
    cr_assert_eq(c.tenants[2].tiers, (1u << 2) | (1u << 1));
    cr_assert_eq(c.tenants[2].default_tier, 2);
    unsigned char h[32];
    sl_tenant_hex_decode(HASH_C, h);
    cr_assert_eq(memcmp(c.tenants[2].key_sha256, h, 32), 0);
    cr_assert(c.has_admin_key);
    cr_assert_eq(c.n_classify, 5);
    cr_assert_eq(c.classify[0].kind, SL_RULE_HEADER);
    cr_assert_eq(c.classify[1].kind, SL_RULE_SERVICE_TIER);
    cr_assert_eq(c.classify[1].n_map, 2);
    cr_assert_eq(c.classify[1].map[1].tier, -1, "null maps to no preference");
    cr_assert_eq(c.classify[2].kind, SL_RULE_MATCH);
    cr_assert_str_eq(c.classify[2].path, "/v1/completions");
    cr_assert_eq(c.classify[2].stream, 1);
    cr_assert_eq(c.classify[2].max_tokens_above, -1);
    cr_assert_eq(c.classify[2].tier, 2);
    cr_assert_eq(c.classify[3].max_tokens_above, 100);
    cr_assert_eq(c.classify[4].kind, SL_RULE_TENANT_DEFAULT);
    sl_tenancy_dispose(&c);
}

Test(admission, defaults_have_two_tiers_and_openai_mapping_when_no_file)
{
    struct sl_tenancy c;
    sl_tenancy_init(&c);
    cr_assert_eq(c.n_tiers, 2);
    cr_assert_str_eq(c.tiers[0].sched.name, "interactive");
    cr_assert_str_eq(c.tiers[1].sched.name, "batch");
    cr_assert_eq(c.n_tenants, 0);
    cr_assert_not(c.has_admin_key);
    struct sl_tier_request rq = {.service_tier = "flex", .path = "/v1/completions", .path_len = 15};
    struct sl_admit_error err;
    int tier = -1;
    cr_assert_eq(sl_tier_classify(&c, &sl_tenant_anonymous, &rq, &tier, &err), SL_OK);
    cr_assert_eq(tier, 1);
    rq.service_tier = "priority";
    cr_assert_eq(sl_tier_classify(&c, &sl_tenant_anonymous, &rq, &tier, &err), SL_OK);
    cr_assert_eq(tier, 0);
    rq.service_tier = NULL;
    rq.header = "batch";
    rq.header_len = 5;
    cr_assert_eq(sl_tier_classify(&c, &sl_tenant_anonymous, &rq, &tier, &err), SL_OK);
    cr_assert_eq(tier, 1);
    sl_tenancy_dispose(&c);
}

Test(admission, tenants_may_refer_to_tiers_defined_later_in_the_file_when_loading)
{
    struct sl_tenancy c;
    sl_tenancy_init(&c);
    char err[512] = "";
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"tenants\":[{\"name\":\"carol\",\"key_sha256\":\"" HASH_C "\","
             "\"tiers\":[\"gold\"],\"default_tier\":\"gold\"}],%s}",
             tiers3);
    cr_assert_eq(load(&c, buf, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(c.tenants[0].default_tier, 2);
    sl_tenancy_dispose(&c);
}

Test(admission, replaced_tiers_remap_tenants_and_reset_rules_when_only_tiers_change)
{
    struct sl_tenancy c;
    load_world(&c, "[{\"max_tokens_above\":5,\"tier\":\"gold\"}]");
    char err[512] = "";
    /* A second file with other tiers: tenants follow by name; the old rules named "gold",
     * which is gone, so the default rules return. */
    cr_assert_eq(load(&c,
                      "{\"tiers\":{\"batch\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":9,"
                      "\"tpot_slo_ms\":9},\"gold\":{\"priority\":0,\"weight\":1,"
                      "\"ttft_slo_ms\":9,\"tpot_slo_ms\":9},\"interactive\":{\"priority\":0,"
                      "\"weight\":1,\"ttft_slo_ms\":9,\"tpot_slo_ms\":9}}}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert_str_eq(c.tenants[0].name, "alice");
    cr_assert_eq(c.tenants[0].tiers, (1u << 2) | (1u << 0), "interactive is now 2, batch 0");
    cr_assert_eq(c.tenants[0].default_tier, 2);
    cr_assert_eq(c.n_classify, 3);
    cr_assert_eq(c.classify[0].kind, SL_RULE_HEADER);
    cr_assert_eq(c.classify[2].kind, SL_RULE_TENANT_DEFAULT);
    /* Tiers that drop one a tenant uses are refused, and nothing changes. */
    cr_assert_eq(load(&c,
                      "{\"tiers\":{\"batch\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":9,"
                      "\"tpot_slo_ms\":9}}}",
                      err, sizeof err),
                 SL_EINVAL);
    cr_assert(strstr(err, "tenants[0].tiers: tier \"gold\"") ||
                  strstr(err, "tenants[0].tiers: tier \"interactive\""),
              "%s", err);
    cr_assert_eq(c.n_tiers, 3);
    sl_tenancy_dispose(&c);
}

/* Loads `body` (a JSON object's members) over the three-tier world and expects an error that
 * contains `want`. */
static void expect_error(const char *body, const char *want)
{
    struct sl_tenancy c;
    load_world(&c, NULL);
    char buf[4096], err[768] = "";
    snprintf(buf, sizeof buf, "{%s}", body);
    int st = load(&c, buf, err, sizeof err);
    cr_assert_neq(st, SL_OK, "accepted: %s", body);
    cr_assert(strstr(err, want), "error \"%s\" does not contain \"%s\"", err, want);
    /* A refused file changes nothing. */
    cr_assert_eq(c.n_tiers, 3);
    cr_assert_eq(c.n_tenants, 3);
    cr_assert_str_eq(c.tenants[1].name, "bob");
    /* Neither keys nor hashes ever appear in an error. */
    cr_assert_null(strstr(err, "4e3cf284"), "%s", err);
    cr_assert_null(strstr(err, "ca94e0a1"), "%s", err);
    cr_assert_null(strstr(err, "4863aec6"), "%s", err);
    cr_assert_null(strstr(err, "sk-"), "%s", err);
    sl_tenancy_dispose(&c);
}

#define TIER(n) "\"" n "\":{\"priority\":0,\"weight\":1,\"ttft_slo_ms\":1,\"tpot_slo_ms\":1}"
#define TENANT(name, hash, tiers, def)                                                             \
    "{\"name\":\"" name "\",\"key_sha256\":\"" hash "\",\"tiers\":" tiers                          \
    ",\"default_tier\":\"" def "\"}"

Test(admission, tier_errors_name_the_path_when_tiers_are_invalid)
{
    expect_error("\"tiers\":[]", "tiers: must be a non-empty object");
    expect_error("\"tiers\":{}", "tiers: must be a non-empty object");
    expect_error("\"tiers\":{\"//\":\"only a comment\"}", "tiers: must be a non-empty object");
    expect_error("\"tiers\":{\"bad name\":{}}", "tiers.bad name: a tier name is");
    expect_error("\"tiers\":{" TIER("x") ",\"y\":3}", "tiers.y: must be an object");
    expect_error("\"tiers\":{\"x\":{\"priority\":0,\"weight\":1,\"ttft_slo_ms\":1}}",
                 "tiers.x.tpot_slo_ms: missing");
    expect_error("\"tiers\":{\"x\":{\"priority\":0,\"weight\":0,\"ttft_slo_ms\":1,"
                 "\"tpot_slo_ms\":1}}",
                 "tiers.x.weight: must be an integer from 1 to 1000");
    expect_error("\"tiers\":{\"x\":{\"priority\":\"high\",\"weight\":1,\"ttft_slo_ms\":1,"
                 "\"tpot_slo_ms\":1}}",
                 "tiers.x.priority: must be an integer");
    expect_error("\"tiers\":{\"x\":{\"priority\":0,\"weight\":1,\"ttft_slo_ms\":1,"
                 "\"tpot_slo_ms\":1,\"brust\":3}}",
                 "tiers.x.brust: unknown key");
    char many[8192];
    size_t n = (size_t)snprintf(many, sizeof many, "\"tiers\":{");
    for (int i = 0; i < 33; i++)
        n += (size_t)snprintf(many + n, sizeof many - n,
                              "%s\"t%d\":{\"priority\":0,\"weight\":1,\"ttft_slo_ms\":1,"
                              "\"tpot_slo_ms\":1}",
                              i ? "," : "", i);
    snprintf(many + n, sizeof many - n, "}");
    expect_error(many, "tiers: 33 tiers, at most 32");
}

Test(admission, tenant_errors_name_the_path_when_tenants_are_invalid)
{
    expect_error("\"tenants\":{}", "tenants: must be an array");
    expect_error("\"tenants\":[3]", "tenants[0]: must be an object");
    expect_error(
        "\"tenants\":[" TENANT("a", HASH_A, "[\"batch\"]", "batch") ",{\"name\":\"b\","
                                                                    "\"key\":\"sk-oops\"}]",
        "tenants[1].key: unknown key");
    expect_error("\"tenants\":[{\"key_sha256\":\"" HASH_A "\"}]", "tenants[0].name: missing");
    expect_error("\"tenants\":[" TENANT("", HASH_A, "[\"batch\"]", "batch") "]",
                 "tenants[0].name: must be 1 to 64 printable");
    expect_error("\"tenants\":[" TENANT("a\\\"b", HASH_A, "[\"batch\"]", "batch") "]",
                 "tenants[0].name: must be 1 to 64 printable");
    expect_error("\"tenants\":[{\"name\":\"a\",\"tiers\":[\"batch\"],\"default_tier\":\"batch\"}]",
                 "tenants[0].key_sha256: missing");
    /* A pasted key instead of its hash is refused without echoing it. */
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[\"batch\"]",
                                        "batch") "," TENANT("b", KEY_B, "[\"batch\"]", "batch") "]",
                 "tenants[1].key_sha256: must be 64 hex digits");
    expect_error("\"tenants\":[" TENANT("a",
                                        "4e3cf284f86ed2e2912a406e093fde194fffbfc71792276277eb2"
                                        "01998cc4cfz",
                                        "[\"batch\"]", "batch") "]",
                 "tenants[0].key_sha256: must be 64 hex digits");
    expect_error("\"tenants\":[{\"name\":\"a\",\"key_sha256\":\"" HASH_A "\","
                 "\"default_tier\":\"batch\"}]",
                 "tenants[0].tiers: missing");
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[]", "batch") "]",
                 "tenants[0].tiers: must be a non-empty array");
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[\"batch\",\"platinum\"]", "batch") "]",
                 "tenants[0].tiers[1]: unknown tier \"platinum\"");
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[\"batch\",7]", "batch") "]",
                 "tenants[0].tiers[1]: must be a tier name");
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[\"batch\",\"batch\"]", "batch") "]",
                 "tenants[0].tiers[1]: \"batch\" is listed twice");
    expect_error("\"tenants\":[{\"name\":\"a\",\"key_sha256\":\"" HASH_A "\","
                 "\"tiers\":[\"batch\"]}]",
                 "tenants[0].default_tier: missing");
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[\"batch\"]", "platinum") "]",
                 "tenants[0].default_tier: unknown tier \"platinum\"");
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[\"batch\"]", "gold") "]",
                 "tenants[0].default_tier: \"gold\" is not in tenants[0].tiers");
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[\"batch\"]", "batch") "," TENANT(
                     "a", HASH_B, "[\"batch\"]", "batch") "]",
                 "tenants[1].name: \"a\" is also tenants[0].name");
    expect_error("\"tenants\":[" TENANT("a", HASH_A, "[\"batch\"]", "batch") "," TENANT(
                     "b", HASH_B, "[\"batch\"]", "batch") "," TENANT("c", HASH_A, "[\"batch\"]",
                                                                     "batch") "]",
                 "tenants[2].key_sha256: the same key as tenants[0] (\"a\")");
}

Test(admission, admin_key_errors_name_the_key_when_invalid)
{
    expect_error("\"admin_key_sha256\":\"" KEY_ADMIN "\"",
                 "admin_key_sha256: must be 64 hex digits");
    expect_error("\"admin_key_sha256\":42", "admin_key_sha256: must be 64 hex digits");
    expect_error("\"admin_key_sha256\":\"" HASH_B "\"",
                 "admin_key_sha256: the same key as tenants[1] (\"bob\")");
    struct sl_tenancy c;
    load_world(&c, NULL);
    char err[512] = "";
    cr_assert_eq(load(&c, "{\"admin_key_sha256\":null}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_not(c.has_admin_key);
    cr_assert_not(sl_tenant_admin_check(&c, KEY_ADMIN, strlen(KEY_ADMIN)));
    sl_tenancy_dispose(&c);
}

Test(admission, classify_errors_name_the_path_when_rules_are_invalid)
{
    expect_error("\"classify\":{}", "classify: must be an array");
    expect_error("\"classify\":[\"header\"]", "classify[0]: must be an object");
    expect_error("\"classify\":[{\"header\":\"x-tier\"}]",
                 "classify[0].header: must be \"x-sluice-tier\"");
    expect_error("\"classify\":[{\"header\":\"x-sluice-tier\",\"tier\":\"batch\"}]",
                 "classify[0].tier: a \"header\" rule takes no other key");
    expect_error("\"classify\":[{\"header\":\"x-sluice-tier\"},{\"header\":\"x-sluice-tier\"}]",
                 "classify[1]: a second \"header\" rule (after classify[0]) never matches");
    expect_error("\"classify\":[{\"service_tier\":[\"flex\"]}]",
                 "classify[0].service_tier: must be an object");
    expect_error("\"classify\":[{\"service_tier\":{\"flex\":\"bulk\"}}]",
                 "classify[0].service_tier.flex: unknown tier \"bulk\"");
    expect_error("\"classify\":[{\"service_tier\":{\"flex\":1}}]",
                 "classify[0].service_tier.flex: must be a tier name");
    expect_error("\"classify\":[{\"service_tier\":{}},{\"service_tier\":{}}]",
                 "classify[1]: a second \"service_tier\" rule");
    expect_error("\"classify\":[{\"service_tier\":{},\"path\":\"/x\"}]",
                 "classify[0].path: a \"service_tier\" rule takes no other key");
    expect_error("\"classify\":[{\"tenant_default\":false}]",
                 "classify[0].tenant_default: must be true");
    expect_error("\"classify\":[{\"tenant_default\":true,\"tier\":\"batch\"}]",
                 "classify[0].tier: a \"tenant_default\" rule takes no other key");
    expect_error("\"classify\":[{\"tenant_default\":true},{\"stream\":true,\"tier\":\"gold\"}]",
                 "classify[1]: never reached, \"tenant_default\" at classify[0] ends the list");
    expect_error("\"classify\":[{\"stream\":true}]", "classify[0].tier: missing");
    expect_error("\"classify\":[{\"stream\":true,\"tier\":\"bulk\"}]",
                 "classify[0].tier: unknown tier \"bulk\"");
    expect_error("\"classify\":[{\"stream\":\"yes\",\"tier\":\"batch\"}]",
                 "classify[0].stream: must be true or false");
    expect_error("\"classify\":[{\"path\":\"v1/completions\",\"tier\":\"batch\"}]",
                 "classify[0].path: must be a path starting with '/'");
    expect_error("\"classify\":[{\"max_tokens_above\":-1,\"tier\":\"batch\"}]",
                 "classify[0].max_tokens_above: must be an integer from 0");
    expect_error("\"classify\":[{\"max_tokens\":10,\"tier\":\"batch\"}]",
                 "classify[0].max_tokens: unknown key");
}

Test(admission, validate_rejects_inconsistent_tenancy_when_built_in_code)
{
    struct sl_tenancy c;
    load_world(&c, NULL);
    char err[512] = "";
    c.tenants[1].default_tier = 0; /* bob may not use interactive */
    cr_assert_eq(validate(&c, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "tenants[1].default_tier"), "%s", err);
    c.tenants[1].default_tier = 1;
    c.tenants[1].tiers |= 1u << 5; /* a tier that does not exist */
    cr_assert_eq(validate(&c, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "tenants[1].tiers"), "%s", err);
    sl_tenancy_dispose(&c);
}

/* ---- classification ---- */

struct cls {
    int st;
    int tier;
    struct sl_admit_error err;
};

static struct cls run_classify(const struct sl_tenancy *c, const char *tenant, const char *header,
                               const char *service_tier, const char *path, bool stream,
                               int max_tokens)
{
    const struct sl_tenant *t = NULL;
    for (int i = 0; i < c->n_tenants; i++)
        if (strcmp(c->tenants[i].name, tenant) == 0)
            t = &c->tenants[i];
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
    memset(&r.err, 0, sizeof r.err);
    r.st = sl_tier_classify(c, t, &rq, &r.tier, &r.err);
    return r;
}

static const char *tier_of(const struct sl_tenancy *c, struct cls r)
{
    cr_assert_eq(r.st, SL_OK, "%d %s", r.err.status, r.err.message);
    cr_assert(r.tier >= 0 && r.tier < c->n_tiers);
    return c->tiers[r.tier].sched.name;
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

Test(admission, classify_takes_first_matching_rule_when_several_match)
{
    struct sl_tenancy c;
    load_world(&c, rules);
    /* Header first, even when service_tier and shape say otherwise. */
    cr_assert_str_eq(tier_of(&c, CL("alice", "batch", "priority", P, true, 5)), "batch");
    cr_assert_str_eq(tier_of(&c, CL("alice", " \tbatch ", NULL, P, false, 5)), "batch");
    /* An empty header asks for nothing. */
    cr_assert_str_eq(tier_of(&c, CL("alice", "", "flex", P, false, 5)), "batch");
    /* service_tier through the map, before shape rules. */
    cr_assert_str_eq(tier_of(&c, CL("alice", NULL, "flex", P, true, 5)), "batch");
    cr_assert_str_eq(tier_of(&c, CL("alice", NULL, "priority", P, false, 500)), "interactive");
    cr_assert_str_eq(tier_of(&c, CL("carol", NULL, "scale", P, false, 5)), "gold");
    /* A value not in the map may name a tier directly. */
    cr_assert_str_eq(tier_of(&c, CL("alice", NULL, "interactive", P, false, 500)), "interactive");
    /* Mapped to null, or OpenAI's "auto": no preference, the shape rules decide. */
    cr_assert_str_eq(tier_of(&c, CL("alice", NULL, "default", P, false, 500)), "batch");
    cr_assert_str_eq(tier_of(&c, CL("alice", NULL, "auto", P, true, 500)), "interactive");
    /* Path rule before stream and max_tokens. */
    cr_assert_str_eq(tier_of(&c, CL("carol", NULL, NULL, "/v1/chat/completions", true, 500)),
                     "gold");
    /* Stream before max_tokens. */
    cr_assert_str_eq(tier_of(&c, CL("alice", NULL, NULL, P, true, 500)), "interactive");
    /* max_tokens_above is strict. */
    cr_assert_str_eq(tier_of(&c, CL("alice", NULL, NULL, P, false, 100)), "interactive");
    cr_assert_str_eq(tier_of(&c, CL("alice", NULL, NULL, P, false, 101)), "batch");
    /* Nothing matches: the tenant default. */
    cr_assert_str_eq(tier_of(&c, CL("carol", NULL, NULL, P, false, 5)), "gold");
    sl_tenancy_dispose(&c);
}

Test(admission, shape_rule_falls_through_when_tenant_may_not_use_its_tier)
{
    struct sl_tenancy c;
    load_world(&c, rules);
    /* bob may only use batch: the path (gold) and stream (interactive) rules skip to the next. */
    cr_assert_str_eq(tier_of(&c, CL("bob", NULL, NULL, "/v1/chat/completions", true, 5)), "batch");
    /* carol: stream → interactive is not hers, so max_tokens_above decides. */
    cr_assert_str_eq(tier_of(&c, CL("carol", NULL, NULL, P, true, 500)), "batch");
    cr_assert_str_eq(tier_of(&c, CL("carol", NULL, NULL, P, true, 5)), "gold");
    sl_tenancy_dispose(&c);
}

Test(admission, tenant_default_decides_when_no_rules_or_rules_exhausted)
{
    struct sl_tenancy c;
    load_world(&c, "[]");
    cr_assert_eq(c.n_classify, 0);
    cr_assert_str_eq(tier_of(&c, CL("alice", "batch", "flex", P, true, 500)), "interactive",
                     "no header rule: the header is ignored");
    cr_assert_str_eq(tier_of(&c, CL("bob", NULL, NULL, P, false, 5)), "batch");
    sl_tenancy_dispose(&c);
    load_world(&c, "[{\"stream\":true,\"tier\":\"batch\"}]");
    cr_assert_str_eq(tier_of(&c, CL("carol", NULL, NULL, P, false, 5)), "gold");
    cr_assert_str_eq(tier_of(&c, CL("carol", NULL, NULL, P, true, 5)), "batch");
    sl_tenancy_dispose(&c);
}

Test(admission, anonymous_tenant_may_use_every_tier_when_no_tenants)
{
    struct sl_tenancy c;
    sl_tenancy_init(&c);
    char err[512] = "";
    char buf[2048];
    snprintf(buf, sizeof buf, "{%s,\"classify\":%s}", tiers3, rules);
    cr_assert_eq(load(&c, buf, err, sizeof err), SL_OK, "%s", err);
    const struct sl_tenant *t = sl_tenant_lookup(&c, NULL, 0);
    struct sl_tier_request rq = {.header = "gold", .header_len = 4, .path = P, .path_len = 15};
    struct sl_admit_error e;
    int tier = -1;
    cr_assert_eq(sl_tier_classify(&c, t, &rq, &tier, &e), SL_OK, "%s", e.message);
    cr_assert_str_eq(c.tiers[tier].sched.name, "gold");
    rq.header = NULL;
    rq.header_len = 0;
    cr_assert_eq(sl_tier_classify(&c, t, &rq, &tier, &e), SL_OK);
    cr_assert_eq(tier, 0, "the first tier listed is the anonymous default");
    sl_tenancy_dispose(&c);
}

Test(admission, classify_refuses_with_a_status_code_and_param_when_an_explicit_tier_is_wrong)
{
    struct sl_tenancy c;
    load_world(&c, rules);
    struct cls r = CL("alice", "platinum", NULL, P, false, 5);
    cr_assert_eq(r.st, SL_EINVAL);
    cr_assert_eq(r.err.status, SL_EINVAL);
    cr_assert_str_eq(r.err.code, "invalid_tier");
    cr_assert_str_eq(r.err.param, SL_TIER_HEADER);
    cr_assert(strstr(r.err.message, "platinum") && strstr(r.err.message, "gold"), "%s",
              r.err.message);
    r = CL("bob", NULL, "priority", P, false, 5);
    cr_assert_eq(r.st, SL_EPERM);
    cr_assert_eq(r.err.status, SL_EPERM);
    cr_assert_str_eq(r.err.code, "tier_not_allowed");
    cr_assert_str_eq(r.err.param, "service_tier");
    cr_assert(strstr(r.err.message, "bob") && strstr(r.err.message, "interactive"), "%s",
              r.err.message);
    sl_tenancy_dispose(&c);
}
