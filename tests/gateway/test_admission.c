/* Admission on the gateway: its configuration (every error names its path), tenant budgets with
 * exact 429s and refunds, tier buckets and queue caps, the SLO guard, each overload step, the
 * headers, and budgets that carry over a reload. The scheduler's figures come from a fake, so
 * every decision here is deterministic. */
#include <criterion/criterion.h>

#include "config_impl.h"
#include "gateway_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SEC 1000000000LL
#define MS 1000000LL
#define HASH_A "4e3cf284f86ed2e2912a406e093fde194fffbfc71792276277eb201998cc4cfe"
#define HASH_B "ca94e0a18defaf16a73804c392e6898bd1b71c8a2fdf1ec61e574517dadbedca"

static int load(struct sl_config *c, const char *content, char *err, size_t errlen)
{
    char path[] = "/tmp/sluice-admission-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    close(fd);
    int st = sl_config_load_file(c, path, err, errlen);
    unlink(path);
    if (st == SL_OK)
        st = sl_config_validate(c, err, errlen);
    return st;
}

static void load_ok(struct sl_config *c, const char *content)
{
    char err[768] = "";
    sl_config_init(c);
    cr_assert_eq(load(c, content, err, sizeof err), SL_OK, "%s", err);
}

static void expect_error(const char *content, const char *want)
{
    struct sl_config c;
    char err[768] = "";
    sl_config_init(&c);
    cr_assert_neq(load(&c, content, err, sizeof err), SL_OK, "accepted: %s", content);
    cr_assert(strstr(err, want), "error \"%s\" does not contain \"%s\"", err, want);
    sl_config_dispose(&c);
}

#define TIER(name, prio, weight, ttft, extra)                                                      \
    "\"" name "\":{\"priority\":" #prio ",\"weight\":" #weight ",\"ttft_slo_ms\":" #ttft           \
    ",\"tpot_slo_ms\":1000" extra "}"

/* ---- configuration ---- */

Test(gateway, admission_keys_load_with_their_defaults_when_absent)
{
    struct sl_config c;
    load_ok(&c, "{\"tiers\":{" TIER("a", 0, 1, 1000, "") "}}");
    cr_assert(c.tenancy.admission);
    cr_assert_eq(c.tenancy.tiers[0].token_rate, 0);
    cr_assert_eq(c.tenancy.tiers[0].max_queue_requests, -1);
    cr_assert_eq(c.tenancy.tiers[0].max_queue_tokens, -1);
    cr_assert_eq(c.tenancy.tiers[0].n_overload, 1);
    cr_assert_eq(c.tenancy.tiers[0].overload[0].kind, SL_OVERLOAD_REJECT);
    cr_assert_eq(c.tenancy.tiers[0].overload_status, 503);
    cr_assert_eq(c.engine.n_models, 1);
    cr_assert_str_eq(c.engine.models[0].spec, "synthetic");
    cr_assert_null(c.engine.models[0].name);
    sl_config_dispose(&c);
}

Test(gateway, admission_keys_load_when_given)
{
    struct sl_config c;
    load_ok(&c, "{\"models\":[{\"model\":\"synthetic\",\"name\":\"big\"},"
                "{\"model\":\"synthetic:tiny\",\"name\":\"small\",\"threads\":1}],"
                "\"tiers\":{" TIER(
                    "fast", 0, 4, 1000,
                    ",\"token_rate\":5000,\"max_queue_requests\":8,"
                    "\"max_queue_tokens\":4096,\"overload\":[\"cap_max_tokens:64\","
                    "\"demote:slow\",\"model:small\",\"queue:1500\",\"reject\"],"
                    "\"overload_status\":429") "," TIER("slow", 1, 1, 60000,
                                                        ",\"burst\":1,\"token_rate\":"
                                                        "10") "},"
                                                              "\"tenants\":[{\"name\":\"a\",\"key_"
                                                              "sha256\":\"" HASH_A
                                                              "\",\"tiers\":[\"fast\"],"
                                                              "\"default_tier\":\"fast\",\"rpm\":"
                                                              "60,\"tpm\":100000}],"
                                                              "\"admission\":false}");
    cr_assert_not(c.tenancy.admission);
    cr_assert_eq(c.engine.n_models, 2);
    cr_assert_str_eq(c.model, "synthetic", "models[0] is \"model\"");
    cr_assert_str_eq(c.engine.models[1].name, "small");
    cr_assert_eq(c.engine.models[1].threads, 1);
    const struct sl_tier *f = &c.tenancy.tiers[0];
    cr_assert_eq(f->token_rate, 5000);
    cr_assert_eq(f->burst, 5000, "a second's worth by default");
    cr_assert_eq(f->max_queue_requests, 8);
    cr_assert_eq(f->max_queue_tokens, 4096);
    cr_assert_eq(f->overload_status, 429);
    cr_assert_eq(f->n_overload, 5);
    cr_assert_eq(f->overload[0].kind, SL_OVERLOAD_CAP_MAX_TOKENS);
    cr_assert_eq(f->overload[0].arg, 64);
    cr_assert_eq(f->overload[1].kind, SL_OVERLOAD_DEMOTE);
    cr_assert_eq(f->overload[1].arg, 1);
    cr_assert_eq(f->overload[2].kind, SL_OVERLOAD_MODEL);
    cr_assert_str_eq(f->overload[2].model, "small");
    cr_assert_eq(f->overload[3].kind, SL_OVERLOAD_QUEUE);
    cr_assert_eq(f->overload[3].arg, 1500);
    cr_assert_eq(f->overload[4].kind, SL_OVERLOAD_REJECT);
    cr_assert_eq(c.tenancy.tiers[1].burst, 1);
    cr_assert_eq(c.tenancy.tenants[0].rpm, 60);
    cr_assert_eq(c.tenancy.tenants[0].tpm, 100000);
    /* /admin/config shows them as the file spells them. */
    json_t *j = sl_config_to_json(&c);
    char *s = json_dumps(j, JSON_SORT_KEYS);
    cr_assert(strstr(s, "\"overload\": [\"cap_max_tokens:64\", \"demote:slow\", \"model:small\", "
                        "\"queue:1500\", \"reject\"]"),
              "%s", s);
    cr_assert(strstr(s, "\"rpm\": 60"), "%s", s);
    cr_assert(strstr(s, "\"admission\": false"), "%s", s);
    cr_assert(strstr(s, "\"name\": \"small\""), "%s", s);
    free(s);
    json_decref(j);
    sl_config_dispose(&c);
}

Test(gateway, admission_errors_name_the_path_when_keys_are_wrong)
{
    expect_error("{\"tiers\":{" TIER("batch", 1, 1, 1000, ",\"overload\":[\"reject\"]") "," TIER(
                     "b2", 1, 1, 1000, ",\"overload\":[\"queue:10\",\"demte:interactive\"]") "}}",
                 "tiers.b2.overload[1]: unknown step \"demte:interactive\"");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload\":[\"demote:nowhere\"]") "}}",
                 "tiers.a.overload[0]: \"demote:nowhere\": no tier \"nowhere\"");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload\":[\"demote:a\"]") "}}",
                 "tiers.a.overload[0]: \"demote:a\" demotes the tier to itself");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload\":[\"model:small\"]") "}}",
                 "tiers.a.overload[0]: \"model:small\": no model named \"small\"");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload\":[\"cap_max_tokens:0\"]") "}}",
                 "tiers.a.overload[0]: \"cap_max_tokens:0\": the cap must be an integer");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload\":[\"queue:x\"]") "}}",
                 "tiers.a.overload[0]: \"queue:x\": the wait must be 1 to 600000 ms");
    expect_error(
        "{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload\":[\"reject\",\"queue:5\"]") "}}",
        "tiers.a.overload[1]: never reached");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload\":[]") "}}",
                 "tiers.a.overload: must be an array of 1 to 8 steps");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload\":[7]") "}}",
                 "tiers.a.overload[0]: must be a string");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"overload_status\":500") "}}",
                 "tiers.a.overload_status: must be 503");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"burst\":5") "}}",
                 "tiers.a.burst: needs token_rate");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"token_rate\":-1") "}}",
                 "tiers.a.token_rate: must be an integer from 0");
    expect_error("{\"tiers\":{" TIER("a", 0, 1, 1000, ",\"max_queue_requests\":\"8\"") "}}",
                 "tiers.a.max_queue_requests: must be an integer from 0 to 1000000, or null");
    expect_error("{\"tenants\":[{\"name\":\"a\",\"key_sha256\":\"" HASH_A
                 "\",\"tiers\":[\"batch\"],\"default_tier\":\"batch\",\"rpm\":-5}]}",
                 "tenants[0].rpm: must be an integer from 0");
    expect_error("{\"tenants\":[{\"name\":\"a\",\"key_sha256\":\"" HASH_A
                 "\",\"tiers\":[\"batch\"],\"default_tier\":\"batch\",\"tpm\":1.5}]}",
                 "tenants[0].tpm: must be an integer");
    expect_error("{\"models\":[{\"model\":\"synthetic\"},{\"model\":\"synthetic\"}]}",
                 "models[1].name: missing");
    expect_error("{\"models\":[{\"model\":\"synthetic\",\"name\":\"x\"},{\"model\":\"synthetic\","
                 "\"name\":\"x\"}]}",
                 "models[1].name: \"x\" is also models[0].name");
    expect_error("{\"models\":[{\"name\":\"x\"}]}", "models[0].model: missing");
    expect_error("{\"models\":[{\"model\":\"synthetic\",\"device\":\"gpu0\"}]}",
                 "models[0].device: must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
    expect_error("{\"models\":[{\"model\":\"synthetic\",\"device\":\"cuda:x\"}]}",
                 "models[0].device: must be");
    expect_error("{\"models\":[{\"model\":\"synthetic\",\"gpu\":1}]}",
                 "models[0]: unknown key \"gpu\"");
    expect_error("{\"models\":[], \"x\":1}", "\"models\" must be an array of 1 to 8 models");
    expect_error("{\"model\":\"synthetic\",\"models\":[{\"model\":\"synthetic\"}]}",
                 "\"model\" and \"tokenizer\" name one model and \"models\" several");
    expect_error("{\"admission\":1}", "\"admission\" must be true or false");
}

Test(gateway, model_flag_sets_the_first_model_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    char *argv[] = {"sluice", "--model", "synthetic:stories15M", NULL};
    enum sl_cli_action act;
    char err[256];
    cr_assert_eq(sl_config_from_args(&c, 3, argv, &act, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(c.engine.n_models, 1);
    cr_assert_str_eq(c.engine.models[0].spec, "synthetic:stories15M");
    sl_config_dispose(&c);
}

/* ---- a fake engine ---- */

struct fake {
    struct sl_sched_stats st[2];
    int n_prompt_of[2]; /* what a re-encode for each model gives; < 0: does not fit */
    int n_cached_of[2]; /* of them, what each model's prefix cache is predicted to hold */
    int encodes;
};

static void fake_stats(void *ctx, int model, struct sl_sched_stats *out)
{
    struct fake *f = ctx;
    *out = f->st[model];
}

static int fake_encode(void *ctx, int model, int max_tokens, int *n_prompt, int *n_cached)
{
    (void)max_tokens;
    struct fake *f = ctx;
    f->encodes++;
    if (f->n_prompt_of[model] < 0)
        return SL_ERANGE;
    *n_prompt = f->n_prompt_of[model];
    *n_cached = f->n_cached_of[model];
    return SL_OK;
}

static const char *const model_names[2] = {"big", "small"};

static struct sl_admit_env env_of(struct fake *f)
{
    return (struct sl_admit_env){.n_models = 2,
                                 .model_names = model_names,
                                 .ctx = f,
                                 .stats = fake_stats,
                                 .encode = fake_encode};
}

/* Two tiers as the scheduler publishes them; `rate` tokens/s of prefill, nothing queued. */
static void fake_init(struct fake *f, double rate)
{
    memset(f, 0, sizeof *f);
    for (int m = 0; m < 2; m++) {
        struct sl_sched_stats *st = &f->st[m];
        st->n_tiers = 2;
        st->max_batch_tokens = 512;
        st->prefill_capacity_tokens_per_s = rate;
        snprintf(st->tiers[0].name, sizeof st->tiers[0].name, "interactive");
        st->tiers[0].weight = 4;
        snprintf(st->tiers[1].name, sizeof st->tiers[1].name, "batch");
        st->tiers[1].weight = 1;
        f->n_prompt_of[m] = 100;
    }
}

#define MODELS2                                                                                    \
    "\"models\":[{\"model\":\"synthetic\",\"name\":\"big\"},{\"model\":\"synthetic\","             \
    "\"name\":\"small\"}]"

/* The configuration, not adopted yet (no admission state). */
static void world_load(struct sl_config *c, const char *interactive_extra, const char *batch_extra,
                       const char *tenant_extra)
{
    char buf[4096];
    snprintf(buf, sizeof buf,
             "{" MODELS2 ",\"tiers\":{\"interactive\":{\"priority\":0,\"weight\":4,"
             "\"ttft_slo_ms\":1000,\"tpot_slo_ms\":100%s},\"batch\":{\"priority\":1,"
             "\"weight\":1,\"ttft_slo_ms\":60000,\"tpot_slo_ms\":1000%s}},"
             "\"tenants\":[{\"name\":\"a\",\"key_sha256\":\"" HASH_A "\",\"tiers\":"
             "[\"interactive\",\"batch\"],\"default_tier\":\"interactive\"%s},"
             "{\"name\":\"b\",\"key_sha256\":\"" HASH_B "\",\"tiers\":[\"interactive\","
             "\"batch\"],\"default_tier\":\"interactive\"}]}",
             interactive_extra, batch_extra, tenant_extra);
    load_ok(c, buf);
}

static void world(struct sl_config *c, const char *interactive_extra, const char *batch_extra,
                  const char *tenant_extra)
{
    world_load(c, interactive_extra, batch_extra, tenant_extra);
    sl_admit_adopt(&c->tenancy, NULL, 0);
}

static enum sl_admit_verdict begin(struct sl_admit *a, struct fake *f, const struct sl_config *c,
                                   int tenant, int tier, int model, int n_prompt, int max_tokens,
                                   int64_t now)
{
    struct sl_admit_env env = env_of(f);
    sl_admit_init(a);
    return sl_admit_begin(a, &env, &c->tenancy, &c->tenancy.tenants[tenant], tier, model, n_prompt,
                          max_tokens, now);
}

static const char *header(const struct sl_admit *a, const struct sl_config *c,
                          const struct sl_tenant *t, int64_t now, const char *name, char *buf,
                          size_t len)
{
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_admission_headers(a, &s);
    sl_openai_ratelimit_headers(&c->tenancy, t, now, &s);
    const char *p = s.p ? strstr(s.p, name) : NULL;
    buf[0] = '\0';
    if (p) {
        p += strlen(name) + 2;
        size_t n = strcspn(p, "\r");
        snprintf(buf, len, "%.*s", (int)n, p);
    }
    sl_str_dispose(&s);
    return p ? buf : NULL;
}

/* ---- tenants ---- */

Test(gateway, admission_answers_429_with_exact_retry_when_a_tenant_is_over_its_requests)
{
    struct sl_config c;
    world(&c, "", "", ",\"rpm\":3");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a;
    char h[64];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 10, 10, 0), SL_ADMIT_OK);
        cr_assert_str_eq(a.note, "admitted");
        sl_admit_end(&a, 10, 0);
    }
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-requests", h, sizeof h),
        "0");
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-limit-requests", h, sizeof h), "3");
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-reset-requests", h, sizeof h),
        "1m0s");
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 10, 10, 5 * SEC), SL_ADMIT_RATE_LIMITED);
    cr_assert_eq(a.reason, SL_ADMIT_REASON_TENANT_REQUESTS);
    cr_assert_eq(a.retry_ns, 15 * SEC, "one request every 20 s, 5 s gone");
    cr_assert_str_eq(a.note, "rejected; reason=tenant_requests");
    cr_assert_str_eq(header(&a, &c, &c.tenancy.tenants[0], 5 * SEC, "Retry-After", h, sizeof h),
                     "15");
    cr_assert_str_eq(header(&a, &c, &c.tenancy.tenants[0], 5 * SEC, "retry-after-ms", h, sizeof h),
                     "15000");
    cr_assert(strstr(a.why, "Rate limit reached for tenant 'a' on requests per minute"));
    /* Another tenant is not touched, and has no rate headers (it has no limits). */
    cr_assert_eq(begin(&a, &f, &c, 1, 0, 0, 10, 10, 5 * SEC), SL_ADMIT_OK);
    cr_assert_null(header(&a, &c, &c.tenancy.tenants[1], 5 * SEC, "x-ratelimit", h, sizeof h));
    sl_admit_end(&a, 10, 5 * SEC);
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 10, 10, 20 * SEC), SL_ADMIT_OK, "and on time");
    sl_admit_end(&a, 10, 20 * SEC);
    sl_config_dispose(&c);
}

Test(gateway, admission_refunds_unused_tokens_exactly_once_when_requests_end)
{
    struct sl_config c;
    world(&c, "", "", ",\"tpm\":1000");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a, b;
    char h[64];
    /* Charged prompt + max_tokens = 100 + 500. */
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 100, 500, 0), SL_ADMIT_OK);
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "400");
    cr_assert_eq(begin(&b, &f, &c, 0, 0, 0, 100, 500, 0), SL_ADMIT_RATE_LIMITED);
    cr_assert_eq(b.reason, SL_ADMIT_REASON_TENANT_TOKENS);
    cr_assert_eq(b.retry_ns, 12 * SEC, "200 tokens short at 1000 a minute");
    /* It generated 50 of its 500: 450 come back, once however often the end is reported. */
    sl_admit_end(&a, 50, 0);
    sl_admit_end(&a, 50, 0);
    sl_admit_end(&a, 0, 0);
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "850");
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-reset-tokens", h, sizeof h), "9s");
    /* A request cut short (its client left after 20 tokens) pays for what it used. */
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 100, 500, 0), SL_ADMIT_OK);
    sl_admit_end(&a, 20, 0);
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "730");
    /* A request that never reached the engine pays nothing. */
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 100, 500, 0), SL_ADMIT_OK);
    sl_admit_end(&a, -1, 0);
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "730");
    /* One larger than the whole budget is refused for good: no retry time. */
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 900, 200, 0), SL_ADMIT_RATE_LIMITED);
    cr_assert_eq(a.retry_ns, -1);
    cr_assert(strstr(a.why, "Request too large"), "%s", a.why);
    cr_assert_null(header(&a, &c, &c.tenancy.tenants[0], 0, "Retry-After", h, sizeof h));
    sl_config_dispose(&c);
}

/* n choices are n sequences: n times the prompt and max_tokens charged, n times the prompt in the
 * queue, and what the choices together did not use refunded. */
Test(gateway, admission_charges_each_choice_when_n_is_above_one)
{
    struct sl_config c;
    world(&c, ",\"max_queue_tokens\":250", "", ",\"tpm\":1000");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit_env env = env_of(&f);
    struct sl_admit a, b;
    char h[64];
    /* 3 choices of 100 + 200: 900 of the tenant's 1000 a minute. */
    sl_admit_init(&a);
    a.n = 3;
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 100, 200, 0),
                 SL_ADMIT_OK, "%s", a.why);
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "100");
    /* They generated 150 tokens together: 3 × 100 + 150 used, 450 back. */
    sl_admit_end(&a, 150, 0);
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "550");
    /* Each choice prefills the prompt: n × prompt tokens in the tier's queue (cap 250). */
    sl_admit_init(&a);
    a.n = 2;
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 100, 10, 0),
                 SL_ADMIT_OK);
    int n;
    long tok;
    sl_admit_queue(&c.tenancy, 0, 0, &n, &tok);
    cr_assert_eq(n, 1, "one request");
    cr_assert_eq(tok, 200, "its two prompts");
    sl_admit_init(&b);
    b.n = 2; /* 200 + 2 × 100 > 250 */
    cr_assert_neq(sl_admit_begin(&b, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 100, 10, 0),
                  SL_ADMIT_OK);
    cr_assert_eq(b.reason, SL_ADMIT_REASON_TIER_QUEUE_TOKENS, "%s", b.why);
    sl_admit_end(&b, -1, 0);
    sl_admit_init(&b); /* 200 + 50 */
    cr_assert_eq(sl_admit_begin(&b, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 50, 10, 0),
                 SL_ADMIT_OK, "%s", b.why);
    sl_admit_end(&b, 10, 0);
    sl_admit_end(&a, 20, 0);
    sl_admit_queue(&c.tenancy, 0, 0, &n, &tok);
    cr_assert_eq(tok, 0, "all of it leaves the queue");
    sl_config_dispose(&c);
}

/* An array of prompts: n_prompt is all of them together, and every prompt's n choices may each
 * generate max_tokens. */
Test(gateway, admission_charges_each_prompt_and_choice_when_prompts_are_an_array)
{
    struct sl_config c;
    world(&c, "", "", ",\"tpm\":1000");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit_env env = env_of(&f);
    struct sl_admit a;
    char h[64];
    sl_admit_init(&a);
    a.n = 2;
    a.prompts = 3; /* 2 × (90 + 3 × 100) = 780 */
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 90, 100, 0),
                 SL_ADMIT_OK, "%s", a.why);
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "220");
    sl_admit_end(&a, 60, 0); /* 2 × 90 + 60 used */
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "760");
    sl_config_dispose(&c);
}

/* ---- the tier ---- */

Test(gateway, admission_counts_the_tier_queue_until_the_first_token_when_capped)
{
    struct sl_config c;
    world(&c, "", ",\"max_queue_requests\":2,\"max_queue_tokens\":250", "");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a[4];
    cr_assert_eq(begin(&a[0], &f, &c, 0, 1, 0, 100, 10, 0), SL_ADMIT_OK);
    cr_assert_eq(begin(&a[1], &f, &c, 0, 1, 0, 100, 10, 0), SL_ADMIT_OK);
    cr_assert_eq(begin(&a[2], &f, &c, 0, 1, 0, 10, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(a[2].reason, SL_ADMIT_REASON_TIER_QUEUE_REQUESTS);
    cr_assert_str_eq(a[2].note, "rejected; reason=tier_queue_requests");
    cr_assert_gt(a[2].retry_ns, 0);
    /* Each model's scheduler has a queue of its own. */
    cr_assert_eq(begin(&a[3], &f, &c, 0, 1, 1, 100, 10, 0), SL_ADMIT_OK);
    sl_admit_end(&a[3], 1, 0);
    int n;
    long tok;
    sl_admit_queue(&c.tenancy, 1, 0, &n, &tok);
    cr_assert_eq(n, 2);
    cr_assert_eq(tok, 200);
    sl_admit_started(&a[0]);
    sl_admit_started(&a[0]);
    sl_admit_queue(&c.tenancy, 1, 0, &n, &tok);
    cr_assert_eq(n, 1, "a first token leaves the queue, once");
    cr_assert_eq(begin(&a[2], &f, &c, 0, 1, 0, 200, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(a[2].reason, SL_ADMIT_REASON_TIER_QUEUE_TOKENS, "100 + 200 over 250");
    cr_assert_eq(begin(&a[2], &f, &c, 0, 1, 0, 150, 10, 0), SL_ADMIT_OK);
    for (int i = 0; i < 3; i++)
        sl_admit_end(&a[i], 5, 0);
    sl_admit_queue(&c.tenancy, 1, 0, &n, &tok);
    cr_assert_eq(n, 0);
    cr_assert_eq(tok, 0);
    sl_config_dispose(&c);
}

Test(gateway, admission_tier_bucket_refuses_with_its_retry_time_when_empty)
{
    struct sl_config c;
    world(&c, "", ",\"token_rate\":100,\"burst\":300", "");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a, b;
    cr_assert_eq(begin(&a, &f, &c, 0, 1, 0, 100, 150, 0), SL_ADMIT_OK);
    cr_assert_eq(begin(&b, &f, &c, 0, 1, 0, 50, 50, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(b.reason, SL_ADMIT_REASON_TIER_TOKEN_RATE);
    cr_assert_eq(b.retry_ns, 500 * MS, "50 tokens short at 100 a second");
    /* The first used 10 of its 150 max_tokens: 140 back, and the second fits. */
    sl_admit_end(&a, 10, 0);
    cr_assert_eq(begin(&b, &f, &c, 0, 1, 0, 50, 50, 0), SL_ADMIT_OK);
    sl_admit_end(&b, 50, 0);
    sl_config_dispose(&c);
}

Test(gateway, admission_guard_rejects_with_the_drain_time_when_the_objective_would_break)
{
    struct sl_config c;
    world(&c, "", "", "");
    struct fake f;
    fake_init(&f, 10000);
    /* 12,000 interactive prompt tokens queued: 1.2 s at 10,000 tokens/s, over 1 s. */
    f.st[0].tiers[0].queued_prompt_tokens = 12000;
    struct sl_admit a;
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 100, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(a.reason, SL_ADMIT_REASON_TIER_TTFT_SLO);
    cr_assert_str_eq(a.note, "rejected; reason=tier_ttft_slo");
    cr_assert_float_eq(a.predicted_ttft_s, 1.21, 1e-9);
    cr_assert_eq(a.retry_ns, 210 * MS);
    char h[64];
    cr_assert_str_eq(header(&a, &c, &c.tenancy.tenants[0], 0, "Retry-After", h, sizeof h), "1");
    cr_assert_str_eq(header(&a, &c, &c.tenancy.tenants[0], 0, "retry-after-ms", h, sizeof h),
                     "210");
    cr_assert(strstr(a.why, "predicted time to first token, 1.2 s"), "%s", a.why);
    /* Prompts admitted here and not yet in the scheduler's figures count too. */
    f.st[0].tiers[0].queued_prompt_tokens = 0;
    struct sl_admit held[9];
    for (int i = 0; i < 9; i++)
        cr_assert_eq(begin(&held[i], &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OK, "%d", i);
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OK, "10,000 is 1.0 s");
    struct sl_admit over;
    cr_assert_eq(begin(&over, &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OVERLOADED);
    /* Admission off: everything goes, as it comes. */
    c.tenancy.admission = false;
    cr_assert_eq(begin(&over, &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OK);
    cr_assert_str_eq(over.note, "admitted");
    cr_assert_not(over.active);
    c.tenancy.admission = true;
    for (int i = 0; i < 9; i++)
        sl_admit_end(&held[i], 1, 0);
    sl_admit_end(&a, 1, 0);
    sl_config_dispose(&c);
}

/* The guard predicts from the prompt tokens a request will compute: a long prompt whose prefix the
 * engine has cached waits for its uncached tail only. Charges still count every prompt token. */
Test(gateway, admission_guard_admits_a_long_prompt_when_most_of_it_is_cached)
{
    struct sl_config c;
    world(&c, "", "", ",\"tpm\":100000");
    struct fake f;
    fake_init(&f, 10000);
    f.st[0].tiers[0].queued_prompt_tokens = 5000; /* 0.5 s ahead */
    struct sl_admit_env env = env_of(&f);
    struct sl_admit a;
    /* 8,000 tokens computed: (5,000 + 8,000) / 10,000 = 1.3 s, over the 1 s objective. */
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 8000, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(a.reason, SL_ADMIT_REASON_TIER_TTFT_SLO);
    cr_assert_float_eq(a.predicted_ttft_s, 1.3, 1e-9);
    /* The same prompt with 7,936 of its tokens (496 blocks of 16) in the prefix cache. */
    sl_admit_init(&a);
    a.n_cached = 7936;
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 8000, 10, 0),
                 SL_ADMIT_OK, "%s", a.why);
    cr_assert_float_eq(a.predicted_ttft_s, 0.5064, 1e-9, "(5,000 + 64) / 10,000");
    int n;
    long tok;
    sl_admit_queue(&c.tenancy, 0, 0, &n, &tok);
    cr_assert_eq(tok, 64, "the tier's queue counts what it will compute");
    char h[64];
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "91990", "the tenant is charged every prompt token and max_tokens");
    sl_admit_end(&a, 10, 0);
    sl_admit_queue(&c.tenancy, 0, 0, &n, &tok);
    cr_assert_eq(tok, 0, "and it all leaves the queue");
    /* Two choices each compute the uncached tail; a figure past the prompt is the prompt. */
    sl_admit_init(&a);
    a.n = 2;
    a.n_cached = 9000;
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 8000, 10, 0),
                 SL_ADMIT_OK, "%s", a.why);
    sl_admit_queue(&c.tenancy, 0, 0, &n, &tok);
    cr_assert_eq(tok, 0, "nothing to compute but what the scheduler always computes");
    sl_admit_end(&a, 10, 0);
    sl_config_dispose(&c);
}

Test(gateway, admission_guard_admits_a_prompt_with_nothing_queued_ahead_whatever_its_prediction)
{
    struct sl_config c;
    world(&c, "", "", "");
    struct fake f;
    /* A rate measured in a stall: 20 tokens a second, so a 100-token prompt alone is 5 s. */
    fake_init(&f, 20);
    struct sl_admit a;
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 100, 10, 0), SL_ADMIT_OK,
                 "nothing queued ahead in any tier: no wait would shorten its prediction");
    cr_assert_str_eq(a.note, "admitted");
    cr_assert_float_eq(a.predicted_ttft_s, 5.0, 1e-9, "the prediction is still recorded");
    /* The admitted prompt is now ahead of the next one: 200 tokens, 10 s. */
    struct sl_admit b;
    cr_assert_eq(begin(&b, &f, &c, 0, 0, 0, 100, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(b.reason, SL_ADMIT_REASON_TIER_TTFT_SLO);
    cr_assert_eq(b.retry_ns, 9 * SEC);
    sl_admit_end(&a, 10, 0);
    /* A prompt queued in another tier is ahead too (it shares the step). */
    f.st[0].tiers[1].queued_prompt_tokens = 1;
    cr_assert_eq(begin(&b, &f, &c, 0, 0, 0, 100, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(b.reason, SL_ADMIT_REASON_TIER_TTFT_SLO);
    f.st[0].tiers[1].queued_prompt_tokens = 0;
    cr_assert_eq(begin(&b, &f, &c, 0, 0, 0, 100, 10, 0), SL_ADMIT_OK);
    sl_admit_end(&b, 10, 0);
    sl_config_dispose(&c);
}

/* The guard learns from its tier's first tokens: predictions that keep coming true 1.5 times
 * later are taken 1.54 times longer (the upper edge of the ratio's bin), so that what it admits
 * up to the objective meets it. */
Test(gateway, admission_guard_learns_how_late_its_tier_comes_against_its_predictions)
{
    struct sl_config c;
    world(&c, "", "", "");
    struct fake f;
    fake_init(&f, 10000);
    /* 7,000 tokens queued and 1,000 of its own at 10,000 a second: 0.8 s, under the 1 s. */
    f.st[0].tiers[0].queued_prompt_tokens = 7000;
    struct sl_admit a;
    for (int i = 0; i < SL_GUARD_CALIBRATION_MIN_OBS; i++) {
        cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OK, "%d", i);
        cr_assert_float_eq(a.predicted_ttft_s, 0.8, 1e-9, "%d: not calibrated yet", i);
        sl_admit_started(&a);
        sl_admit_first_token(&a, 1.2);
        sl_admit_first_token(&a, 100); /* once per request */
        sl_admit_end(&a, 1, 0);
    }
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(a.reason, SL_ADMIT_REASON_TIER_TTFT_SLO);
    cr_assert_float_eq(a.raw_ttft_s, 0.8, 1e-9);
    cr_assert_float_eq(a.predicted_ttft_s, 0.8 * exp2(5.0 / 8), 1e-9);
    /* Short predictions teach it nothing: the batch tier has learnt nothing. */
    cr_assert_eq(begin(&a, &f, &c, 0, 1, 0, 100, 10, 0), SL_ADMIT_OK);
    sl_admit_end(&a, 1, 0);
    sl_config_dispose(&c);
}

/* In a tier whose tenants are served by virtual token counters, a request waits for its own
 * tenant's queue and a fair share of the others', not for the whole tier's: another tenant's
 * backlog does not refuse it, its own tenant's does. */
Test(gateway, admission_guard_predicts_a_fair_share_of_the_tier_for_each_tenant_under_vtc)
{
    for (int fcfs = 0; fcfs < 2; fcfs++) {
        struct sl_config c;
        world(&c, fcfs ? ",\"fairness\":\"fcfs\"" : "", "", "");
        struct fake f;
        fake_init(&f, 10000);
        /* Tenant a: ten prompts of 1,000 queued, 1.0 s of prefill at 10,000 tokens/s. */
        struct sl_admit held[10];
        for (int i = 0; i < 10; i++)
            cr_assert_eq(begin(&held[i], &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OK, "%d", i);
        struct sl_admit b, a;
        enum sl_admit_verdict vb = begin(&b, &f, &c, 1, 0, 0, 1000, 10, 0);
        cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OVERLOADED,
                     "a's own backlog is ahead of a's next prompt");
        if (fcfs) {
            cr_assert_eq(vb, SL_ADMIT_OVERLOADED, "fcfs: b waits for a's 10,000 tokens");
            cr_assert_float_eq(b.predicted_ttft_s, 1.1, 1e-9);
        } else {
            cr_assert_eq(vb, SL_ADMIT_OK, "vtc: b's 1,000 and as much of a's");
            cr_assert_float_eq(b.predicted_ttft_s, 0.2, 1e-9);
            sl_admit_end(&b, 1, 0);
        }
        /* Once a's prompts have started, its queue is gone from the table. */
        for (int i = 0; i < 10; i++) {
            sl_admit_started(&held[i]);
            sl_admit_end(&held[i], 1, 0);
        }
        cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 1000, 10, 0), SL_ADMIT_OK);
        sl_admit_end(&a, 1, 0);
        sl_config_dispose(&c);
    }
}

/* ---- the overload steps ---- */

Test(gateway, overload_cap_max_tokens_admits_degraded_when_the_cap_makes_it_fit)
{
    struct sl_config c;
    world(&c, "",
          ",\"token_rate\":100,\"burst\":400,\"overload\":[\"cap_max_tokens:64\","
          "\"reject\"]",
          ",\"tpm\":100000");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a, b;
    cr_assert_eq(begin(&a, &f, &c, 0, 1, 0, 100, 200, 0), SL_ADMIT_OK);
    /* 100 + 256 does not fit the 100 left; 100 + 64 still does not; rejected. */
    cr_assert_eq(begin(&b, &f, &c, 0, 1, 0, 100, 256, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(b.reason, SL_ADMIT_REASON_TIER_TOKEN_RATE);
    /* 36 + 256 → 36 + 64 = 100 fits exactly. */
    cr_assert_eq(begin(&b, &f, &c, 0, 1, 0, 36, 256, 0), SL_ADMIT_OK);
    cr_assert_str_eq(b.note, "degraded; cap_max_tokens=64");
    cr_assert_eq(b.max_tokens, 64);
    cr_assert(b.degraded);
    cr_assert_eq(b.degraded_by, 1u << SL_OVERLOAD_CAP_MAX_TOKENS);
    cr_assert_str_eq(sl_overload_kind_str(SL_OVERLOAD_CAP_MAX_TOKENS), "cap_max_tokens");
    cr_assert_eq(b.reason, SL_ADMIT_REASON_TIER_TOKEN_RATE);
    char h[64];
    cr_assert_str_eq(header(&b, &c, &c.tenancy.tenants[0], 0, "x-sluice-admission", h, sizeof h),
                     "degraded; cap_max_tokens=64");
    /* The tenant was charged 36 + 256 and got the 192 above the cap back at once: with a's 300,
     * 364 of 100,000 are used. */
    cr_assert_str_eq(
        header(&b, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "99600");
    sl_admit_end(&a, 200, 0);
    sl_admit_end(&b, 64, 0);
    sl_config_dispose(&c);
}

Test(gateway, overload_demote_runs_in_the_lower_tier_when_it_has_room)
{
    struct sl_config c;
    world(&c, ",\"max_queue_requests\":1,\"overload\":[\"demote:batch\",\"reject\"]",
          ",\"max_queue_requests\":1", "");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a, b, d;
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 10, 10, 0), SL_ADMIT_OK);
    cr_assert_eq(begin(&b, &f, &c, 0, 0, 0, 10, 10, 0), SL_ADMIT_OK);
    cr_assert_eq(b.tier, 1);
    cr_assert_eq(b.policy_tier, 0);
    cr_assert_str_eq(b.note, "degraded; demote=batch");
    cr_assert_eq(b.degraded_by, 1u << SL_OVERLOAD_DEMOTE);
    cr_assert_eq(a.degraded_by, 0u, "admitted as it was");
    /* Both full now. */
    cr_assert_eq(begin(&d, &f, &c, 0, 0, 0, 10, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(d.reason, SL_ADMIT_REASON_TIER_QUEUE_REQUESTS);
    sl_admit_end(&a, 1, 0);
    sl_admit_end(&b, 1, 0);
    sl_config_dispose(&c);
}

Test(gateway, overload_model_step_moves_to_the_cheaper_model_when_it_has_room)
{
    struct sl_config c;
    world(&c, ",\"overload\":[\"model:small\",\"reject\"]", "", "");
    struct fake f;
    fake_init(&f, 10000);
    f.st[0].tiers[0].queued_prompt_tokens = 20000; /* big: 2 s of prompts queued */
    f.n_prompt_of[1] = 120;                        /* small's tokenizer makes 120 of them */
    f.n_cached_of[1] = 32;                         /* and small's cache holds 32 */
    struct sl_admit a;
    struct sl_admit_env env = env_of(&f);
    sl_admit_init(&a);
    a.n_cached = 96; /* of big's cache: not small's */
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 100, 10, 0),
                 SL_ADMIT_OK);
    cr_assert_eq(a.model, 1);
    cr_assert_eq(a.n_prompt, 120);
    cr_assert_eq(a.n_cached, 32);
    cr_assert_str_eq(a.note, "degraded; model=small");
    cr_assert_eq(a.degraded_by, 1u << SL_OVERLOAD_MODEL);
    cr_assert_eq(a.reason, SL_ADMIT_REASON_TIER_TTFT_SLO);
    int n;
    long tok;
    sl_admit_queue(&c.tenancy, 0, 1, &n, &tok);
    cr_assert_eq(n, 1);
    cr_assert_eq(tok, 88, "queued on small's scheduler, in small's uncached tokens");
    sl_admit_end(&a, 1, 0);
    f.n_cached_of[1] = 0;
    /* A prompt that does not fit the cheaper model skips the step. */
    f.n_prompt_of[1] = -1;
    cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 100, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(a.model, 0);
    sl_config_dispose(&c);
}

Test(gateway, overload_queue_parks_then_admits_when_room_comes_before_the_deadline)
{
    struct sl_config c;
    world(&c, "", ",\"max_queue_requests\":1,\"overload\":[\"queue:1000\",\"reject\"]", "");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit_env env = env_of(&f);
    struct sl_admit a, b;
    cr_assert_eq(begin(&a, &f, &c, 0, 1, 0, 10, 10, 0), SL_ADMIT_OK);
    cr_assert_eq(begin(&b, &f, &c, 0, 1, 0, 10, 10, 0), SL_ADMIT_PARK);
    cr_assert(b.active, "a parked request holds its place");
    cr_assert_eq(b.deadline_ns, 1000 * MS);
    cr_assert_gt(b.recheck_ns, 0);
    cr_assert_leq(b.recheck_ns, b.deadline_ns);
    cr_assert_eq(sl_admit_resume(&b, &env, 100 * MS), SL_ADMIT_PARK, "still full");
    cr_assert_eq(b.degraded_by, 0u, "parked is not yet degraded");
    sl_admit_started(&a); /* a's first token: the queue has room */
    cr_assert_eq(sl_admit_resume(&b, &env, 300 * MS), SL_ADMIT_OK);
    cr_assert_str_eq(b.note, "degraded; queued_ms=300");
    cr_assert_eq(b.degraded_by, 1u << SL_OVERLOAD_QUEUE);
    sl_admit_end(&a, 10, 0);
    sl_admit_end(&b, 10, 0);
    sl_config_dispose(&c);
}

Test(gateway, overload_queue_goes_on_with_the_policy_when_the_deadline_passes)
{
    struct sl_config c;
    world(&c, "", ",\"max_queue_requests\":1,\"overload\":[\"queue:500\",\"reject\"]", "");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit_env env = env_of(&f);
    struct sl_admit a, b, d;
    cr_assert_eq(begin(&a, &f, &c, 0, 1, 0, 10, 10, 0), SL_ADMIT_OK);
    cr_assert_eq(begin(&b, &f, &c, 0, 1, 0, 10, 10, 0), SL_ADMIT_PARK);
    /* The waiting room holds max_queue_requests too: the next one goes straight on. */
    cr_assert_eq(begin(&d, &f, &c, 0, 1, 0, 10, 10, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(sl_admit_resume(&b, &env, 500 * MS), SL_ADMIT_OVERLOADED);
    cr_assert_str_eq(b.note, "rejected; reason=tier_queue_requests");
    cr_assert_not(b.active);
    /* Its place in the waiting room is free again. */
    cr_assert_eq(begin(&d, &f, &c, 0, 1, 0, 10, 10, 600 * MS), SL_ADMIT_PARK);
    sl_admit_end(&d, -1, 700 * MS); /* its client left while it waited */
    cr_assert_not(d.active);
    cr_assert_eq(begin(&d, &f, &c, 0, 1, 0, 10, 10, 800 * MS), SL_ADMIT_PARK);
    sl_admit_end(&d, -1, 900 * MS);
    sl_admit_end(&a, 10, 0);
    sl_config_dispose(&c);
}

Test(gateway, overload_reject_refunds_the_tenant_when_the_server_says_no)
{
    struct sl_config c;
    world(&c, ",\"max_queue_requests\":0", "", ",\"rpm\":2,\"tpm\":1000");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a;
    char h[64];
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(begin(&a, &f, &c, 0, 0, 0, 100, 100, 0), SL_ADMIT_OVERLOADED);
        cr_assert_eq(a.reason, SL_ADMIT_REASON_TIER_QUEUE_REQUESTS);
        cr_assert_eq(a.retry_ns, SEC, "a closed tier predicts no drain: 1 s");
        sl_admit_end(&a, -1, 0);
    }
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-requests", h, sizeof h),
        "2");
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "1000");
    sl_config_dispose(&c);
}

Test(gateway, overload_policy_ends_in_a_rejection_when_no_step_helps)
{
    struct sl_config c;
    world(&c, "", ",\"max_queue_requests\":0,\"overload\":[\"cap_max_tokens:8\"]", "");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a;
    cr_assert_eq(begin(&a, &f, &c, 0, 1, 0, 10, 100, 0), SL_ADMIT_OVERLOADED);
    cr_assert_str_eq(a.note, "rejected; reason=tier_queue_requests");
    sl_config_dispose(&c);
}

/* ---- headers and reloads ---- */

Test(gateway, durations_are_written_as_openai_writes_them)
{
    static const struct {
        int64_t ns;
        const char *want;
    } cases[] = {
        {0, "0s"},
        {1, "1ms"},
        {120 * MS, "120ms"},
        {999 * MS, "999ms"},
        {SEC, "1s"},
        {1500 * MS, "1.5s"},
        {17280 * MS, "17.28s"},
        {360 * SEC, "6m0s"},
        {(2 * 60 + 59) * SEC + 560 * MS, "2m59.56s"},
        {3723 * SEC, "1h2m3s"},
        {3600 * SEC, "1h0m0s"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[32];
        sl_openai_duration_format(cases[i].ns, out, sizeof out);
        cr_assert_str_eq(out, cases[i].want, "%lld ns", (long long)cases[i].ns);
    }
}

Test(gateway, admission_budgets_carry_over_a_reload_when_the_names_stay)
{
    struct sl_config a, b, d;
    world(&a, "", ",\"token_rate\":100,\"burst\":100", ",\"rpm\":10");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit x[10];
    for (int i = 0; i < 10; i++)
        cr_assert_eq(begin(&x[i], &f, &a, 0, 0, 0, 1, 1, 0), SL_ADMIT_OK);
    struct sl_admit batch;
    cr_assert_eq(begin(&batch, &f, &a, 1, 1, 0, 50, 50, 0), SL_ADMIT_OK);
    /* The same tenant and tier, the rpm doubled: still 10 short, now refilling at 20 a minute. */
    world_load(&b, "", ",\"token_rate\":100,\"burst\":100", ",\"rpm\":20");
    sl_admit_adopt(&b.tenancy, &a.tenancy, 0);
    char h[64];
    cr_assert_str_eq(
        header(&x[0], &b, &b.tenancy.tenants[0], 0, "x-ratelimit-remaining-requests", h, sizeof h),
        "10");
    cr_assert_str_eq(
        header(&x[0], &b, &b.tenancy.tenants[0], 0, "x-ratelimit-reset-requests", h, sizeof h),
        "30s");
    struct sl_admit y;
    cr_assert_eq(begin(&y, &f, &b, 1, 1, 0, 50, 50, 0), SL_ADMIT_OVERLOADED,
                 "the tier's bucket is the same bucket");
    /* A request of the old configuration ends after the reload: its refund reaches the bucket the
     * new one uses. */
    sl_admit_end(&batch, 0, 0); /* 50 of its 100 come back */
    cr_assert_eq(begin(&y, &f, &b, 1, 1, 0, 25, 25, 0), SL_ADMIT_OK);
    sl_admit_end(&y, 50, 0);
    /* A tenant renamed away starts afresh. */
    world_load(&d, "", "", "");
    snprintf(d.tenancy.tenants[0].name, sizeof d.tenancy.tenants[0].name, "a2");
    d.tenancy.tenants[0].rpm = 10;
    sl_admit_adopt(&d.tenancy, &b.tenancy, 0);
    cr_assert_str_eq(
        header(&x[0], &d, &d.tenancy.tenants[0], 0, "x-ratelimit-remaining-requests", h, sizeof h),
        "10");
    for (int i = 0; i < 10; i++)
        sl_admit_end(&x[i], 1, 0);
    sl_config_dispose(&a);
    sl_config_dispose(&b);
    sl_config_dispose(&d);
}

Test(gateway, admission_refuses_before_tokenizing_when_the_tier_takes_nothing_anyway)
{
    struct sl_config c;
    world(&c, ",\"max_queue_requests\":0,\"overload\":[\"cap_max_tokens:4\",\"reject\"]",
          ",\"max_queue_requests\":0,\"overload\":[\"queue:100\",\"reject\"]", ",\"rpm\":5");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit_env env = env_of(&f);
    struct sl_admit a;
    sl_admit_init(&a);
    /* Tenant b (no budgets), interactive (closed, nothing but a cap before the rejection). */
    cr_assert_eq(sl_admit_precheck(&a, &env, &c.tenancy, &c.tenancy.tenants[1], 0, 0, 100, 0),
                 SL_ADMIT_OVERLOADED);
    cr_assert_str_eq(a.note, "rejected; reason=tier_queue_requests");
    cr_assert_eq(a.retry_ns, SEC);
    cr_assert_not(a.active);
    /* The same request through sl_admit_begin gets the same answer. */
    struct sl_admit b;
    cr_assert_eq(begin(&b, &f, &c, 1, 0, 0, 10, 100, 0), SL_ADMIT_OVERLOADED);
    cr_assert_str_eq(b.note, a.note);
    cr_assert_eq(b.retry_ns, a.retry_ns);
    /* A tier whose policy may still find room (queue:MS), a tenant with budgets to charge, a
     * tier with room: the full decision, after tokenizing. */
    sl_admit_init(&a);
    cr_assert_eq(sl_admit_precheck(&a, &env, &c.tenancy, &c.tenancy.tenants[1], 1, 0, 100, 0),
                 SL_ADMIT_OK);
    cr_assert_not(a.ran);
    cr_assert_eq(sl_admit_precheck(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 100, 0),
                 SL_ADMIT_OK);
    c.tenancy.tiers[0].max_queue_requests = 1;
    cr_assert_eq(sl_admit_precheck(&a, &env, &c.tenancy, &c.tenancy.tenants[1], 0, 0, 100, 0),
                 SL_ADMIT_OK);
    sl_config_dispose(&c);
}

/* ---- the fleet's buckets (Redis) ---- */

static enum sl_admit_verdict begin_fleet(struct sl_admit *a, struct fake *f,
                                         const struct sl_config *c, int tenant, int tier,
                                         int n_prompt, int max_tokens, int64_t now)
{
    struct sl_admit_env env = env_of(f);
    sl_admit_init(a);
    a->fleet = true;
    return sl_admit_begin(a, &env, &c->tenancy, &c->tenancy.tenants[tenant], tier, 0, n_prompt,
                          max_tokens, now);
}

static enum sl_admit_verdict answer(struct sl_admit *a, struct fake *f,
                                    const struct sl_fleet_take *t, int replicas, int64_t now)
{
    struct sl_admit_env env = env_of(f);
    return sl_admit_fleet_answer(a, &env, t, replicas, now);
}

static int queued_requests(const struct sl_config *c, int tier)
{
    int n;
    long tok;
    sl_admit_queue(&c->tenancy, tier, 0, &n, &tok);
    return n;
}

Test(gateway, fleet_admission_takes_every_bucket_in_one_call_when_the_replica_has_room)
{
    struct sl_config c;
    world(&c, ",\"token_rate\":5000", "", ",\"rpm\":3,\"tpm\":1000");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a;
    cr_assert_eq(begin_fleet(&a, &f, &c, 0, 0, 10, 100, 0), SL_ADMIT_FLEET);
    cr_assert_eq(queued_requests(&c, 0), 1, "the replica's queue slot is held meanwhile");
    struct sl_admit_fleet_call call;
    cr_assert_eq(sl_admit_fleet_take(&a, "sl:", &call), 3);
    cr_assert_str_eq(call.b[0].key, "sl:tenant:a:rpm");
    cr_assert_eq(call.b[0].cost, 1);
    cr_assert_eq(call.b[0].rate.limit, 3);
    cr_assert_eq(call.b[0].rate.period_ns, 60 * SEC);
    cr_assert_str_eq(call.b[1].key, "sl:tenant:a:tpm");
    cr_assert_eq(call.b[1].cost, 110, "prompt plus max_tokens");
    cr_assert_str_eq(call.b[2].key, "sl:tier:interactive");
    cr_assert_eq(call.b[2].cost, 110);
    cr_assert_eq(call.b[2].rate.limit, 5000);
    cr_assert_eq(call.b[2].rate.burst, 5000);
    /* The fleet has room: admitted, and the headers show the fleet's budget as Redis said. */
    struct sl_fleet_take t = {.admitted = true, .failed = -1};
    t.view[0] = (struct sl_gcra_view){.remaining = 1, .reset_ns = 40 * SEC};
    t.view[1] = (struct sl_gcra_view){.remaining = 670, .reset_ns = 330 * 60 * MS};
    t.view[2] = (struct sl_gcra_view){.remaining = 4890, .reset_ns = 22 * MS};
    cr_assert_eq(answer(&a, &f, &t, 3, 0), SL_ADMIT_OK);
    cr_assert_str_eq(a.note, "admitted");
    char h[64];
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-requests", h, sizeof h),
        "1");
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "670");
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-reset-tokens", h, sizeof h), "19.8s");
    /* It generated 30 of its 100: 70 go back to the tenant's tokens and the tier's, once; the
     * request stays counted. */
    sl_admit_end(&a, 30, 0);
    sl_admit_end(&a, 30, 0);
    cr_assert_eq(queued_requests(&c, 0), 0);
    cr_assert_eq(sl_admit_fleet_refund(&a, "sl:", &call), 2);
    cr_assert_str_eq(call.b[0].key, "sl:tenant:a:tpm");
    cr_assert_eq(call.b[0].cost, 70);
    cr_assert_str_eq(call.b[1].key, "sl:tier:interactive");
    cr_assert_eq(call.b[1].cost, 70);
    cr_assert_eq(sl_admit_fleet_refund(&a, "sl:", &call), 0, "exactly once");
    /* One that never reached an engine gets its request back too. */
    cr_assert_eq(begin_fleet(&a, &f, &c, 0, 0, 10, 100, 0), SL_ADMIT_FLEET);
    cr_assert_eq(answer(&a, &f, &t, 3, 0), SL_ADMIT_OK);
    sl_admit_end(&a, -1, 0);
    cr_assert_eq(sl_admit_fleet_refund(&a, "sl:", &call), 3);
    cr_assert_eq(call.b[0].cost, 1);
    cr_assert_eq(call.b[1].cost, 110);
    /* A tenant without budgets in a tier without a rate has nothing to ask the fleet. */
    cr_assert_eq(begin_fleet(&a, &f, &c, 1, 1, 10, 100, 0), SL_ADMIT_OK);
    sl_admit_end(&a, 1, 0);
    cr_assert_eq(sl_admit_fleet_refund(&a, "sl:", &call), 0);
    sl_config_dispose(&c);
}

Test(gateway, fleet_refusal_of_the_tenant_answers_429_with_the_fleet_retry)
{
    struct sl_config c;
    world(&c, "", "", ",\"rpm\":3,\"tpm\":1000");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a;
    cr_assert_eq(begin_fleet(&a, &f, &c, 0, 0, 10, 100, 0), SL_ADMIT_FLEET);
    struct sl_fleet_take t = {.admitted = false, .failed = 1};
    t.view[1] = (struct sl_gcra_view){.remaining = 50, .reset_ns = 57 * SEC, .retry_ns = 3600 * MS};
    cr_assert_eq(answer(&a, &f, &t, 3, 0), SL_ADMIT_RATE_LIMITED);
    cr_assert_eq(a.reason, SL_ADMIT_REASON_TENANT_TOKENS);
    cr_assert_eq(a.retry_ns, 3600 * MS);
    cr_assert_str_eq(a.note, "rejected; reason=tenant_tokens");
    cr_assert(strstr(a.why, "remaining 50, requested 110"), "%s", a.why);
    cr_assert_not(a.active);
    cr_assert_eq(queued_requests(&c, 0), 0, "its queue slot went back");
    char h[64];
    cr_assert_str_eq(header(&a, &c, &c.tenancy.tenants[0], 0, "retry-after-ms", h, sizeof h),
                     "3600");
    cr_assert_str_eq(
        header(&a, &c, &c.tenancy.tenants[0], 0, "x-ratelimit-remaining-tokens", h, sizeof h),
        "50");
    sl_admit_end(&a, -1, 0);
    struct sl_admit_fleet_call call;
    cr_assert_eq(sl_admit_fleet_refund(&a, "sl:", &call), 0, "nothing was charged");
    sl_config_dispose(&c);
}

Test(gateway, fleet_refusal_of_the_tier_walks_its_overload_policy)
{
    struct sl_config c;
    world(&c, ",\"token_rate\":100,\"overload\":[\"demote:batch\",\"reject\"]",
          ",\"token_rate\":1000", ",\"rpm\":10");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a;
    cr_assert_eq(begin_fleet(&a, &f, &c, 0, 0, 10, 100, 0), SL_ADMIT_FLEET);
    struct sl_fleet_take t = {.admitted = false, .failed = 1};
    t.view[1] = (struct sl_gcra_view){.remaining = 5, .reset_ns = 950 * MS, .retry_ns = 50 * MS};
    /* Demoted: the fleet is asked again, for the batch tier's bucket. */
    cr_assert_eq(answer(&a, &f, &t, 3, 0), SL_ADMIT_FLEET);
    cr_assert_eq(queued_requests(&c, 0), 0);
    cr_assert_eq(queued_requests(&c, 1), 1);
    struct sl_admit_fleet_call call;
    cr_assert_eq(sl_admit_fleet_take(&a, "", &call), 2);
    cr_assert_str_eq(call.b[0].key, "tenant:a:rpm");
    cr_assert_str_eq(call.b[1].key, "tier:batch");
    struct sl_fleet_take ok = {.admitted = true, .failed = -1};
    cr_assert_eq(answer(&a, &f, &ok, 3, 0), SL_ADMIT_OK);
    cr_assert_eq(a.tier, 1);
    cr_assert_str_eq(a.note, "degraded; demote=batch");
    sl_admit_end(&a, 100, 0);
    /* Refused again in batch: the policy ends in a rejection, and nothing is held. */
    cr_assert_eq(begin_fleet(&a, &f, &c, 0, 0, 10, 100, 0), SL_ADMIT_FLEET);
    cr_assert_eq(answer(&a, &f, &t, 3, 0), SL_ADMIT_FLEET);
    cr_assert_eq(answer(&a, &f, &t, 3, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(a.reason, SL_ADMIT_REASON_TIER_TOKEN_RATE);
    cr_assert_eq(a.retry_ns, 50 * MS);
    cr_assert_not(a.active);
    cr_assert_eq(queued_requests(&c, 0) + queued_requests(&c, 1), 0);
    sl_config_dispose(&c);
}

/* Without Redis's answer, a replica admits against its share of each bucket: limit ÷ replicas,
 * starting from where the fleet stood at its last answer. */
Test(gateway, fleet_without_an_answer_admits_the_replica_share_from_the_fleet_state)
{
    struct sl_config c;
    world(&c, "", "", ",\"rpm\":30");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a[12];
    /* A fresh bucket, three replicas: 10 each at once, then one every 6 s. */
    int admitted = 0;
    for (int i = 0; i < 12; i++) {
        cr_assert_eq(begin_fleet(&a[i], &f, &c, 0, 0, 1, 1, 0), SL_ADMIT_FLEET);
        enum sl_admit_verdict v = answer(&a[i], &f, NULL, 3, 0);
        if (v == SL_ADMIT_OK) {
            admitted++;
            cr_assert_str_eq(a[i].note, "admitted; budget=local");
        } else {
            cr_assert_eq(v, SL_ADMIT_RATE_LIMITED);
            cr_assert_str_eq(a[i].note, "rejected; reason=tenant_requests; budget=local");
            cr_assert_eq(a[i].retry_ns, 6 * SEC, "one of 30 a minute, per 3 replicas");
        }
    }
    cr_assert_eq(admitted, 10);
    for (int i = 0; i < 12; i++)
        sl_admit_end(&a[i], 1, 0);
    struct sl_admit_fleet_call call;
    cr_assert_eq(sl_admit_fleet_refund(&a[0], "", &call), 0, "charged here, refunded here");
    /* Back to Redis at 2 min: the fleet says 9 remain (21 taken: full again in 42 s). Should Redis
     * go again, this replica's share is 3 of them. */
    int64_t now = 120 * SEC;
    cr_assert_eq(begin_fleet(&a[0], &f, &c, 0, 0, 1, 1, now), SL_ADMIT_FLEET);
    struct sl_fleet_take t = {.admitted = true, .failed = -1};
    t.view[0] = (struct sl_gcra_view){.remaining = 9, .reset_ns = 42 * SEC};
    cr_assert_eq(answer(&a[0], &f, &t, 3, now), SL_ADMIT_OK);
    cr_assert_str_eq(a[0].note, "admitted");
    admitted = 0;
    for (int i = 1; i < 6; i++) {
        cr_assert_eq(begin_fleet(&a[i], &f, &c, 0, 0, 1, 1, now), SL_ADMIT_FLEET);
        admitted += answer(&a[i], &f, NULL, 3, now) == SL_ADMIT_OK;
    }
    cr_assert_eq(admitted, 3);
    for (int i = 0; i < 6; i++)
        sl_admit_end(&a[i], 1, now);
    sl_config_dispose(&c);
}

Test(gateway, fleet_share_admits_a_request_larger_than_itself_only_when_full)
{
    struct sl_config c;
    world(&c, ",\"token_rate\":300", "", "");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit a, b;
    /* Share of 3: 100 tokens at once, 100 a second; a request of 250 passes on a full share. */
    cr_assert_eq(begin_fleet(&a, &f, &c, 1, 0, 50, 200, 0), SL_ADMIT_FLEET);
    cr_assert_eq(answer(&a, &f, NULL, 3, 0), SL_ADMIT_OK);
    cr_assert_eq(begin_fleet(&b, &f, &c, 1, 0, 1, 1, 0), SL_ADMIT_FLEET);
    cr_assert_eq(answer(&b, &f, NULL, 3, 0), SL_ADMIT_OVERLOADED);
    cr_assert_eq(b.retry_ns, 1520 * MS, "250 owed at 100/s: 2 tokens fit once 152 came back");
    sl_admit_end(&a, 200, 0);
    sl_config_dispose(&c);
}

/* ---- money budgets ---- */

static struct sl_usage_price budget_price = {.input_per_mtok = 1, .output_per_mtok = 2};
static int64_t ledger_spent; /* what the fake ledger says the tenant spent in a new period */
static int64_t ledger_reads;

static const struct sl_usage_price *fake_price(void *ctx, int model)
{
    (void)ctx, (void)model;
    return &budget_price; /* 1,000 nano-units a prompt token, 2,000 a generated one */
}

static int64_t fake_spent(void *ctx, const char *tenant, int64_t from, int64_t to)
{
    (void)ctx, (void)from, (void)to;
    cr_assert_str_eq(tenant, "a");
    ledger_reads++;
    return ledger_spent;
}

static enum sl_admit_verdict begin_money(struct sl_admit *a, struct fake *f,
                                         const struct sl_config *c, int64_t unix_s, int n_prompt,
                                         int max_tokens)
{
    struct sl_admit_env env = env_of(f);
    env.price = fake_price;
    env.spent = fake_spent;
    env.unix_s = unix_s;
    sl_admit_init(a);
    return sl_admit_begin(a, &env, &c->tenancy, &c->tenancy.tenants[0], 0, 0, n_prompt, max_tokens,
                          0);
}

/* 2026-11-27 06:30 UTC; the day ends 17.5 hours later. */
#define NOON_ISH 1795761000LL
#define DAY_END 1795824000LL

Test(gateway, budget_reserves_the_worst_case_and_refuses_exactly_when_it_would_not_fit)
{
    struct sl_config c;
    /* 0.001 of the currency: 1,000,000 nano-units a day, warned about past 50 %. */
    world(&c, "", "",
          ",\"budget\":{\"amount\":0.001,\"period\":\"day\",\"soft_pct\":50,\"// x\":0}");
    struct fake f;
    fake_init(&f, 10000);
    ledger_spent = 0;
    ledger_reads = 0;
    struct sl_admit a, b, d;
    char h[64];
    /* Worst case: 100 prompt tokens and 100 generated, 300,000. */
    cr_assert_eq(begin_money(&a, &f, &c, NOON_ISH, 100, 100), SL_ADMIT_OK);
    cr_assert_eq(ledger_reads, 1, "the period's spend read once");
    cr_assert_eq(a.budget_reserved, 300000);
    cr_assert_not(a.budget_warn);
    cr_assert_null(header(&a, &c, &c.tenancy.tenants[0], 0, "x-sluice-budget", h, sizeof h));
    cr_assert_eq(begin_money(&b, &f, &c, NOON_ISH, 100, 100), SL_ADMIT_OK);
    cr_assert(b.budget_warn, "600,000 of 1,000,000: past 50 %%");
    cr_assert_str_eq(header(&b, &c, &c.tenancy.tenants[0], 0, "x-sluice-budget", h, sizeof h),
                     "warning; used=0.60");
    /* 600,000 + 300,000 fits; 900,000 + 300,000 would not. */
    cr_assert(b.budget_crossed, "b crossed the soft threshold: the webhook's turn");
    cr_assert_eq(begin_money(&d, &f, &c, NOON_ISH, 100, 100), SL_ADMIT_OK);
    cr_assert(d.budget_warn);
    cr_assert_not(d.budget_crossed, "once a period");
    struct sl_admit e;
    cr_assert_eq(begin_money(&e, &f, &c, NOON_ISH, 100, 100), SL_ADMIT_OVER_BUDGET);
    cr_assert_eq(e.reason, SL_ADMIT_REASON_TENANT_BUDGET);
    cr_assert_str_eq(e.note, "rejected; reason=tenant_budget");
    cr_assert_eq(e.retry_ns, (DAY_END - NOON_ISH) * SEC, "when the day resets");
    cr_assert(strstr(e.why, "has used 0.0009 of its budget of 0.001 for this day"), "%s", e.why);
    cr_assert_str_eq(header(&e, &c, &c.tenancy.tenants[0], 0, "x-should-retry", h, sizeof h),
                     "false");
    cr_assert_str_eq(header(&e, &c, &c.tenancy.tenants[0], 0, "Retry-After", h, sizeof h), "63000");
    cr_assert_str_eq(header(&e, &c, &c.tenancy.tenants[0], 0, "x-sluice-budget", h, sizeof h),
                     "exhausted; used=0.90");
    sl_admit_end(&e, -1, 0); /* holds nothing */
    /* a cost 50,000 of its 300,000; d never ran: 900,000 - 250,000 - 300,000 = 350,000. */
    a.cost = 50000;
    sl_admit_end(&a, 10, 0);
    sl_admit_end(&a, 10, 0);
    sl_admit_end(&d, -1, 0);
    struct sl_str s;
    sl_str_init(&s);
    sl_admit_render(&c.tenancy, &s);
    cr_assert(strstr(s.p, "sluice:tenant_budget_used_ratio{tenant=\"a\"} 0.350000"), "%s", s.p);
    cr_assert(strstr(s.p, "sluice:tenant_budget_remaining{tenant=\"a\"} 0.00065"), "%s", s.p);
    sl_str_dispose(&s);
    /* The next day starts from what the ledger has recorded in it; b, reserved yesterday, adds
     * what it cost to today's. */
    ledger_spent = 123;
    cr_assert_eq(begin_money(&a, &f, &c, DAY_END + 60, 100, 100), SL_ADMIT_OK);
    cr_assert_eq(ledger_reads, 2);
    cr_assert_eq(a.budget_used, (123.0 + 300000.0) / 1e6);
    b.cost = 40000;
    sl_admit_end(&b, 20, 0);
    cr_assert_eq(begin_money(&d, &f, &c, DAY_END + 60, 0, 1), SL_ADMIT_OK);
    cr_assert_eq(d.budget_used, (123.0 + 300000.0 + 40000.0 + 2000.0) / 1e6);
    sl_admit_end(&a, -1, 0);
    sl_admit_end(&d, -1, 0);
    sl_config_dispose(&c);
}

Test(gateway, budget_of_the_whole_time_never_resets_and_says_not_to_retry)
{
    struct sl_config c;
    world(&c, "", "", ",\"budget\":{\"amount\":0.0001,\"period\":\"total\"}");
    struct fake f;
    fake_init(&f, 10000);
    ledger_spent = 90000;
    struct sl_admit a;
    char h[64];
    cr_assert_eq(begin_money(&a, &f, &c, NOON_ISH, 1, 4), SL_ADMIT_OK, "90,000 + 9,000 fit");
    sl_admit_end(&a, -1, 0);
    cr_assert_eq(begin_money(&a, &f, &c, NOON_ISH, 10, 1), SL_ADMIT_OVER_BUDGET);
    cr_assert_eq(a.retry_ns, -1);
    cr_assert_null(header(&a, &c, &c.tenancy.tenants[0], 0, "Retry-After", h, sizeof h));
    cr_assert(strstr(a.why, "the budget does not reset"), "%s", a.why);
    sl_config_dispose(&c);
}

#define BUDGET_TENANT(budget)                                                                      \
    "{\"tenants\":[{\"name\":\"a\",\"key_sha256\":\"" HASH_A "\",\"tiers\":[\"interactive\"],"     \
    "\"default_tier\":\"interactive\",\"budget\":" budget "}]}"

Test(gateway, budget_keys_load_with_their_defaults_and_errors_name_the_path)
{
    struct sl_config c;
    load_ok(&c, BUDGET_TENANT("{\"amount\":12.5}"));
    const struct sl_tenant *t = &c.tenancy.tenants[0];
    cr_assert_eq(t->budget, 12500000000LL);
    cr_assert_eq(t->budget_period, SL_USAGE_MONTH);
    cr_assert_eq(t->budget_soft_pct, 80);
    cr_assert_eq(t->budget_month_day, 1);
    json_t *j = sl_config_to_json(&c);
    json_t *b = json_object_get(json_array_get(json_object_get(j, "tenants"), 0), "budget");
    cr_assert_eq(json_real_value(json_object_get(b, "amount")), 12.5);
    cr_assert_str_eq(json_string_value(json_object_get(b, "period")), "month");
    json_decref(j);
    sl_config_dispose(&c);
    load_ok(&c, BUDGET_TENANT("{\"amount\":1,\"period\":\"week\",\"soft_pct\":95,"
                              "\"month_day\":28}"));
    cr_assert_eq(c.tenancy.tenants[0].budget_period, SL_USAGE_WEEK);
    cr_assert_eq(c.tenancy.tenants[0].budget_soft_pct, 95);
    sl_config_dispose(&c);
    expect_error(BUDGET_TENANT("{\"amount\":0}"), "tenants[0].budget.amount: must be a number");
    expect_error(BUDGET_TENANT("{\"amount\":\"5\"}"), "tenants[0].budget.amount");
    expect_error(BUDGET_TENANT("{\"amount\":5,\"period\":\"year\"}"),
                 "tenants[0].budget.period: must be \"day\", \"week\", \"month\" or \"total\"");
    expect_error(BUDGET_TENANT("{\"amount\":5,\"soft_pct\":0}"),
                 "tenants[0].budget.soft_pct: must be an integer from 1 to 100");
    expect_error(BUDGET_TENANT("{\"amount\":5,\"month_day\":29}"),
                 "tenants[0].budget.month_day: must be an integer from 1 to 28");
    expect_error(BUDGET_TENANT("{\"amount\":5,\"currency\":\"EUR\"}"),
                 "tenants[0].budget.currency: unknown key");
    expect_error(BUDGET_TENANT("50"), "tenants[0].budget: must be null or an object");
}

#define FAIR_TIER(extra)                                                                           \
    "{\"tiers\":{\"batch\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":60000,"                    \
    "\"tpot_slo_ms\":1000" extra "}},\"tenants\":[{\"name\":\"a\",\"key_sha256\":\"" HASH_A        \
    "\",\"tiers\":[\"batch\"],\"default_tier\":\"batch\",\"share\":2.5}]}"

Test(gateway, fairness_keys_load_with_their_defaults_and_errors_name_the_path)
{
    struct sl_config c;
    load_ok(&c, FAIR_TIER(""));
    const struct sl_sched_tier *t = &c.tenancy.tiers[0].sched;
    cr_assert_eq(t->fairness, SL_SCHED_VTC, "virtual token counters by default");
    cr_assert_eq(t->w_in, 1);
    cr_assert_eq(t->w_out, 2);
    cr_assert_eq(c.tenancy.tenants[0].share, 2.5f);
    cr_assert_eq(t->isolation_ms, 7, "isolation from lower tiers by default");
    json_t *j = sl_config_to_json(&c);
    json_t *tj = json_object_get(json_object_get(j, "tiers"), "batch");
    cr_assert_str_eq(json_string_value(json_object_get(tj, "fairness")), "vtc");
    cr_assert_eq(json_real_value(json_object_get(json_object_get(tj, "vtc_weights"), "output")),
                 2.0);
    cr_assert_eq(
        json_real_value(json_object_get(json_array_get(json_object_get(j, "tenants"), 0), "share")),
        2.5);
    json_decref(j);
    sl_config_dispose(&c);
    load_ok(&c, FAIR_TIER(",\"fairness\":\"fcfs\",\"vtc_weights\":{\"input\":0,\"output\":3}"));
    cr_assert_eq(c.tenancy.tiers[0].sched.fairness, SL_SCHED_FCFS);
    cr_assert_eq(c.tenancy.tiers[0].sched.w_in, 0);
    cr_assert_eq(c.tenancy.tiers[0].sched.w_out, 3);
    sl_config_dispose(&c);
    expect_error(FAIR_TIER(",\"fairness\":\"wfq\""),
                 "tiers.batch.fairness: must be \"vtc\" (virtual token counters between its "
                 "tenants) or \"fcfs\"");
    expect_error(FAIR_TIER(",\"vtc_weights\":{\"input\":0,\"output\":0}"),
                 "tiers.batch.vtc_weights: input and output cannot both be 0");
    expect_error(FAIR_TIER(",\"vtc_weights\":{\"input\":-1}"),
                 "tiers.batch.vtc_weights.input: must be a number from 0 and at most 1000");
    expect_error(FAIR_TIER(",\"vtc_weights\":{\"cache\":0}"),
                 "tiers.batch.vtc_weights.cache: unknown key (input, output, cached)");
    expect_error(FAIR_TIER(",\"vtc_weights\":{\"cached\":-0.5}"),
                 "tiers.batch.vtc_weights.cached: must be a number from 0 and at most 1000");
    load_ok(&c, FAIR_TIER(",\"vtc_weights\":{\"cached\":0.25}"));
    cr_assert_eq(c.tenancy.tiers[0].sched.w_cached, 0.25f);
    cr_assert_eq(c.tenancy.tiers[0].sched.w_in, 1, "the others keep their defaults");
    sl_config_dispose(&c);
    expect_error(FAIR_TIER(",\"vtc_weights\":[1,2]"), "tiers.batch.vtc_weights: must be an object");
    expect_error(FAIR_TIER(",\"isolation_ms\":-1"),
                 "tiers.batch.isolation_ms: must be a number from 0 and at most 10000");
    load_ok(&c, FAIR_TIER(",\"isolation_ms\":0"));
    cr_assert_eq(c.tenancy.tiers[0].sched.isolation_ms, 0, "0 turns it off");
    sl_config_dispose(&c);
    const char *zero_share = "{\"tiers\":{\"batch\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":"
                             "60000,\"tpot_slo_ms\":1000}},\"tenants\":[{\"name\":\"a\","
                             "\"key_sha256\":\"" HASH_A "\",\"tiers\":[\"batch\"],"
                             "\"default_tier\":\"batch\",\"share\":0}]}";
    expect_error(zero_share, "tenants[0].share: must be a number above 0 and at most 1000");
}

/* With a fleet, the budget is one more bucket of the take (Redis's money counter). */
Test(gateway, fleet_budget_is_reserved_in_the_take_and_settled_by_the_refund)
{
    struct sl_config c;
    world(&c, "", "", ",\"budget\":{\"amount\":0.001,\"period\":\"day\",\"soft_pct\":50}");
    struct fake f;
    fake_init(&f, 10000);
    struct sl_admit_env env = env_of(&f);
    env.price = fake_price;
    env.spent = fake_spent;
    env.unix_s = NOON_ISH;
    struct sl_admit a;
    sl_admit_init(&a);
    a.fleet = true;
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 100, 100, 0),
                 SL_ADMIT_FLEET);
    struct sl_admit_fleet_call call;
    cr_assert_eq(sl_admit_fleet_take(&a, "sl:", &call), 1);
    cr_assert_str_eq(call.b[0].key, "sl:budget:a:1795737600", "the day's key");
    cr_assert_eq(call.b[0].rate.limit, 0, "money");
    cr_assert_eq(call.b[0].rate.burst, 1000000);
    cr_assert_eq(call.b[0].rate.period_ns, (DAY_END - NOON_ISH) * SEC);
    cr_assert_eq(call.b[0].cost, 300000, "the worst case");
    /* Redis had 300,000 spent before: 400,000 left after it, 60 %: the warning. */
    struct sl_fleet_take t = {.admitted = true, .failed = -1};
    t.view[0] = (struct sl_gcra_view){.remaining = 400000, .reset_ns = 1};
    cr_assert_eq(answer(&a, &f, &t, 2, 0), SL_ADMIT_OK);
    cr_assert(a.budget_warn);
    cr_assert_eq(a.budget_used, 0.6);
    /* It cost 50,000: the refund takes 250,000 off the fleet's spend, once. */
    a.cost = 50000;
    sl_admit_end(&a, 10, 0);
    cr_assert_eq(sl_admit_fleet_refund(&a, "sl:", &call), 1);
    cr_assert_str_eq(call.b[0].key, "sl:budget:a:1795737600");
    cr_assert_eq(call.b[0].cost, -250000);
    cr_assert_eq(sl_admit_fleet_refund(&a, "sl:", &call), 0);
    /* Refused by the fleet's budget: 429 insufficient_quota until the day's end. */
    sl_admit_init(&a);
    a.fleet = true;
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 100, 100, 0),
                 SL_ADMIT_FLEET);
    struct sl_fleet_take no = {.admitted = false, .failed = 0};
    no.view[0] = (struct sl_gcra_view){
        .remaining = 100000, .reset_ns = 5 * SEC, .retry_ns = (DAY_END - NOON_ISH) * SEC};
    cr_assert_eq(answer(&a, &f, &no, 2, 0), SL_ADMIT_OVER_BUDGET);
    cr_assert_eq(a.retry_ns, (DAY_END - NOON_ISH) * SEC);
    cr_assert(strstr(a.why, "has used 0.0009 of its budget of 0.001"), "%s", a.why);
    cr_assert_eq(queued_requests(&c, 0), 0);
    sl_admit_end(&a, -1, 0);
    cr_assert_eq(sl_admit_fleet_refund(&a, "sl:", &call), 0, "nothing was reserved");
    /* No answer: this replica's share, half the budget of two replicas, from the ledger. */
    ledger_spent = 400000;
    sl_admit_init(&a);
    a.fleet = true;
    cr_assert_eq(sl_admit_begin(&a, &env, &c.tenancy, &c.tenancy.tenants[0], 0, 0, 100, 100, 0),
                 SL_ADMIT_FLEET);
    enum sl_admit_verdict v = sl_admit_fleet_answer(&a, &env, NULL, 2, 0);
    cr_assert_eq(v, SL_ADMIT_OVER_BUDGET, "400,000 + 300,000 > 500,000: %d %s", v, a.note);
    cr_assert_str_eq(a.note, "rejected; reason=tenant_budget; budget=local");
    sl_config_dispose(&c);
}
