/* `sluice simulate`: arguments, the trace format and its errors, the table and the JSON report,
 * and the shipped flood trace against the shipped configuration. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "gateway_impl.h"

#include <sluice/server.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct run {
    int rc;
    char *out, *err;
    size_t out_len, err_len;
};

static char trace_path[64], config_path[64];

static void write_file(const char *path, const char *content)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(content, f);
    cr_assert_eq(fclose(f), 0);
}

static void setup(void)
{
    snprintf(trace_path, sizeof trace_path, "/tmp/sluice-trace-%d.jsonl", (int)getpid());
    snprintf(config_path, sizeof config_path, "/tmp/sluice-sim-%d.json", (int)getpid());
}

static void teardown(void)
{
    unlink(trace_path);
    unlink(config_path);
}

/* Runs `sluice simulate` with args (NULL-terminated, without "simulate"). */
static struct run simulate(const char *const *args)
{
    char *argv[16] = {"simulate"};
    int argc = 1;
    for (; args[argc - 1]; argc++)
        argv[argc] = (char *)args[argc - 1];
    struct run r = {0};
    FILE *out = open_memstream(&r.out, &r.out_len), *err = open_memstream(&r.err, &r.err_len);
    r.rc = sl_simulate_main(argc, argv, out, err);
    fclose(out);
    fclose(err);
    return r;
}

static void run_dispose(struct run *r)
{
    free(r->out);
    free(r->err);
}

static json_t *report_json(const char *trace, const char *config)
{
    write_file(trace_path, trace);
    const char *with[] = {"--trace", trace_path, "--json", "--config", config, NULL};
    const char *without[] = {"--trace", trace_path, "--json", NULL};
    struct run r = simulate(config ? with : without);
    cr_assert_eq(r.rc, 0, "%s", r.err);
    json_error_t e;
    json_t *j = json_loads(r.out, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, r.out);
    run_dispose(&r);
    return j;
}

static double field(json_t *j, const char *tier, const char *key)
{
    json_t *v = json_object_get(json_object_get(json_object_get(j, "tiers"), tier), key);
    cr_assert(json_is_number(v), "tiers.%s.%s missing", tier, key);
    return json_number_value(v);
}

Test(gateway, simulate_json_report_has_every_tier_and_figure_when_trace_is_valid, .init = setup,
     .fini = teardown)
{
    json_t *j = report_json(
        "{\"arrival\": 0, \"tier\": \"interactive\", \"prompt_tokens\": 20, \"output_tokens\": "
        "10}\n"
        "\n"
        "{\"arrival\": 0.5, \"tier\": \"batch\", \"tenant\": \"x\", \"prompt_tokens\": 300,"
        " \"output_tokens\": 50, \"id\": \"ignored\"}\n"
        "{\"arrival\": 0.25, \"tier\": \"interactive\", \"prompt_tokens\": 5, \"output_tokens\": "
        "3}\n",
        NULL);
    static const char *const keys[] = {
        "requests",    "completed",      "refused",        "p50_ttft_ms",         "p90_ttft_ms",
        "p99_ttft_ms", "p50_tpot_ms",    "p99_tpot_ms",    "p50_e2e_ms",          "p99_e2e_ms",
        "p99_itl_ms",  "slo_attainment", "throughput_rps", "output_tokens_per_s", "preemptions",
        "ttft_slo_ms", "tpot_slo_ms",
    };
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        field(j, "interactive", keys[k]);
        field(j, "batch", keys[k]);
    }
    cr_assert_eq(field(j, "interactive", "requests"), 2);
    cr_assert_eq(field(j, "interactive", "completed"), 2);
    cr_assert_eq(field(j, "batch", "requests"), 1);
    cr_assert_gt(field(j, "interactive", "p99_ttft_ms"), 0);
    cr_assert_geq(field(j, "interactive", "p99_ttft_ms"), field(j, "interactive", "p50_ttft_ms"));
    cr_assert_gt(field(j, "batch", "p99_e2e_ms"), field(j, "batch", "p99_ttft_ms"));
    cr_assert_eq(field(j, "interactive", "slo_attainment"), 1.0, "a light load meets it");
    cr_assert_eq(field(j, "interactive", "ttft_slo_ms"), 1000);
    cr_assert_gt(field(j, "batch", "throughput_rps"), 0);
    cr_assert_eq(json_integer_value(json_object_get(j, "requests")), 3);
    cr_assert_eq(json_integer_value(json_object_get(j, "output_tokens")), 63);
    json_decref(j);
}

/* Requests naming the same prefix share it through the prefix cache; another prefix's requests
 * find nothing of it. */
Test(gateway, simulate_shared_prefixes_are_cached_when_requests_name_them, .init = setup,
     .fini = teardown)
{
    json_t *j = report_json(
        "{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 300, \"output_tokens\": 4, "
        "\"prefix\": \"a\", \"prefix_tokens\": 200}\n"
        "{\"arrival\": 5, \"tier\": \"batch\", \"prompt_tokens\": 300, \"output_tokens\": 4, "
        "\"prefix\": \"a\", \"prefix_tokens\": 200}\n"
        "{\"arrival\": 10, \"tier\": \"batch\", \"prompt_tokens\": 300, \"output_tokens\": 4, "
        "\"prefix\": \"b\", \"prefix_tokens\": 200}\n",
        NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "prompt_tokens")), 900);
    /* The second request finds the first's 12 full blocks of 16 within the 201 shared tokens
     * (BOS and 200); the third, another prefix, nothing. */
    cr_assert_eq(json_integer_value(json_object_get(j, "cached_prompt_tokens")), 192);
    json_decref(j);
    write_file(config_path, "{\"prefix_cache\": {\"enabled\": false}}");
    j = report_json(
        "{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 300, \"output_tokens\": 4, "
        "\"prefix\": \"a\", \"prefix_tokens\": 200}\n"
        "{\"arrival\": 5, \"tier\": \"batch\", \"prompt_tokens\": 300, \"output_tokens\": 4, "
        "\"prefix\": \"a\", \"prefix_tokens\": 200}\n",
        config_path);
    cr_assert_eq(json_integer_value(json_object_get(j, "cached_prompt_tokens")), 0,
                 "the configuration turned the cache off");
    json_decref(j);
}

Test(gateway, simulate_table_names_each_tier_when_not_json, .init = setup, .fini = teardown)
{
    write_file(trace_path, "{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 9, "
                           "\"output_tokens\": 4}\n");
    struct run r = simulate((const char *const[]){"--trace", trace_path, NULL});
    cr_assert_eq(r.rc, 0, "%s", r.err);
    cr_assert_not_null(strstr(r.out, "TTFT p50/p90/p99 ms"), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "\ninteractive "), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "\nbatch "), "%s", r.out);
    cr_assert_not_null(strstr(r.out, "1 requests"), "%s", r.out);
    run_dispose(&r);
}

/* Each bad line is refused with its line number and what is wrong. */
Test(gateway, simulate_bad_trace_line_is_an_error_naming_its_line_when_read, .init = setup,
     .fini = teardown)
{
    static const struct {
        const char *line, *want;
    } bad[] = {
        {"{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 9}", "\"output_tokens\""},
        {"{\"arrival\": -1, \"tier\": \"batch\", \"prompt_tokens\": 9, \"output_tokens\": 1}",
         "\"arrival\""},
        {"{\"arrival\": \"soon\", \"tier\": \"batch\", \"prompt_tokens\": 9, \"output_tokens\": 1}",
         "\"arrival\""},
        {"{\"arrival\": 0, \"tier\": \"gold\", \"prompt_tokens\": 9, \"output_tokens\": 1}",
         "no tier \"gold\""},
        {"{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 0, \"output_tokens\": 1}",
         "\"prompt_tokens\""},
        {"{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 2.5, \"output_tokens\": 1}",
         "\"prompt_tokens\""},
        {"{\"arrival\": 0, \"tier\": 3, \"prompt_tokens\": 1, \"output_tokens\": 1}", "\"tier\""},
        {"{\"arrival\": 0, \"tier\": \"batch\", \"tenant\": 7, \"prompt_tokens\": 1, "
         "\"output_tokens\": 1}",
         "\"tenant\""},
        {"{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 9, \"output_tokens\": 1, "
         "\"prefix\": \"sys\"}",
         "\"prefix_tokens\""},
        {"{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 9, \"output_tokens\": 1, "
         "\"prefix\": \"sys\", \"prefix_tokens\": 10}",
         "\"prefix_tokens\""},
        {"{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 9, \"output_tokens\": 1, "
         "\"prefix_tokens\": 4}",
         "\"prefix\""},
        {"[1, 2]", "JSON object"},
        {"{\"arrival\": 0, \"tier\": ", "not JSON"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char trace[512];
        snprintf(trace, sizeof trace,
                 "{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 9, "
                 "\"output_tokens\": 4}\n\n%s\n{\"arrival\": 1}\n",
                 bad[k].line);
        write_file(trace_path, trace);
        struct run r = simulate((const char *const[]){"--trace", trace_path, NULL});
        char want[128];
        snprintf(want, sizeof want, "%s:3: ", trace_path);
        cr_assert_eq(r.rc, 2, "line %s", bad[k].line);
        cr_assert_not_null(strstr(r.err, want), "%s: %s", bad[k].line, r.err);
        cr_assert_not_null(strstr(r.err, bad[k].want), "%s: %s", bad[k].line, r.err);
        cr_assert_eq(r.out_len, 0, "no report from a bad trace");
        run_dispose(&r);
    }
}

Test(gateway, simulate_tenant_gives_the_tier_and_limits_it_when_the_config_has_tenants,
     .init = setup, .fini = teardown)
{
    write_file(config_path, "{\"tenants\": [{\"name\": \"acme\", \"key_sha256\": "
                            "\"1c2e47dcd313828d6a4ad999a108b8cddc2eded08680b482bab006f9b410212f\", "
                            "\"tiers\": [\"batch\"], \"default_tier\": \"batch\"}]}");
    json_t *j = report_json("{\"arrival\": 0, \"tenant\": \"acme\", \"prompt_tokens\": 9, "
                            "\"output_tokens\": 4}\n",
                            config_path);
    cr_assert_eq(field(j, "batch", "requests"), 1, "the tenant's default tier");
    cr_assert_eq(field(j, "interactive", "requests"), 0);
    json_decref(j);
    write_file(trace_path, "{\"arrival\": 0, \"tenant\": \"acme\", \"tier\": \"interactive\", "
                           "\"prompt_tokens\": 9, \"output_tokens\": 4}\n");
    struct run r =
        simulate((const char *const[]){"--trace", trace_path, "--config", config_path, NULL});
    cr_assert_eq(r.rc, 2);
    cr_assert_not_null(strstr(r.err, ":1: \"tier\": tenant \"acme\" may not use"), "%s", r.err);
    run_dispose(&r);
    write_file(trace_path, "{\"arrival\": 0, \"tenant\": \"nobody\", \"prompt_tokens\": 9, "
                           "\"output_tokens\": 4}\n");
    r = simulate((const char *const[]){"--trace", trace_path, "--config", config_path, NULL});
    cr_assert_eq(r.rc, 2);
    cr_assert_not_null(strstr(r.err, "no tenant \"nobody\""), "%s", r.err);
    run_dispose(&r);
}

Test(gateway, simulate_request_longer_than_the_context_is_refused_when_simulated, .init = setup,
     .fini = teardown)
{
    write_file(trace_path, "{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 100, "
                           "\"output_tokens\": 28}\n"
                           "{\"arrival\": 0, \"tier\": \"batch\", \"prompt_tokens\": 100, "
                           "\"output_tokens\": 29}\n");
    struct run r =
        simulate((const char *const[]){"--trace", trace_path, "--json", "--context", "128", NULL});
    cr_assert_eq(r.rc, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_eq(field(j, "batch", "completed"), 1);
    cr_assert_eq(field(j, "batch", "refused"), 1);
    cr_assert_eq(field(j, "batch", "slo_attainment"), 0.5);
    json_decref(j);
    run_dispose(&r);
}

Test(gateway, simulate_arguments_are_checked_when_wrong, .init = setup, .fini = teardown)
{
    struct run r = simulate((const char *const[]){"--json", NULL});
    cr_assert_eq(r.rc, 2);
    cr_assert_not_null(strstr(r.err, "--trace is required"));
    run_dispose(&r);
    r = simulate((const char *const[]){"--trace", "/nonexistent/trace.jsonl", NULL});
    cr_assert_eq(r.rc, 2);
    cr_assert_not_null(strstr(r.err, "/nonexistent/trace.jsonl: No such file"), "%s", r.err);
    run_dispose(&r);
    r = simulate((const char *const[]){"--trace", trace_path, "--context", "abc", NULL});
    cr_assert_eq(r.rc, 2);
    run_dispose(&r);
    r = simulate((const char *const[]){"--bogus", NULL});
    cr_assert_eq(r.rc, 2);
    run_dispose(&r);
    write_file(config_path, "{\"max_seqs\": \"many\"}");
    write_file(trace_path, "");
    r = simulate((const char *const[]){"--trace", trace_path, "--config", config_path, NULL});
    cr_assert_eq(r.rc, 2);
    cr_assert_not_null(strstr(r.err, "max_seqs"), "%s", r.err);
    run_dispose(&r);
    r = simulate((const char *const[]){"--help", NULL});
    cr_assert_eq(r.rc, 0);
    cr_assert_not_null(strstr(r.out, "usage: sluice simulate"));
    run_dispose(&r);
}

/* The shipped flood (batch at 3x capacity, interactive at 30 %) against the shipped tiers. */
Test(gateway, simulate_shipped_flood_keeps_interactive_p99_ttft_when_run_on_shipped_config,
     .init = setup, .fini = teardown)
{
    const char *root = getenv("SL_SOURCE_ROOT");
    cr_assert_not_null(root);
    char trace[512], conf[512];
    snprintf(trace, sizeof trace, "%s/bench/traces/flood.jsonl", root);
    snprintf(conf, sizeof conf, "%s/conf/sluice.json", root);
    struct run r =
        simulate((const char *const[]){"--trace", trace, "--config", conf, "--json", NULL});
    cr_assert_eq(r.rc, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j);
    double b = field(j, "batch", "requests"), i = field(j, "interactive", "requests");
    cr_assert_gt(b, 2 * i, "a flood of batch");
    double p99 = field(j, "interactive", "p99_ttft_ms");
    cr_log_info("flood.jsonl: interactive p99 TTFT %.0f ms, SLO attainment %.3f; batch %.3f", p99,
                field(j, "interactive", "slo_attainment"), field(j, "batch", "slo_attainment"));
    cr_assert_leq(p99, field(j, "interactive", "ttft_slo_ms"));
    cr_assert_leq(field(j, "interactive", "p99_tpot_ms"), field(j, "interactive", "tpot_slo_ms"));
    cr_assert_geq(field(j, "interactive", "slo_attainment"), 0.99);
    json_decref(j);
    run_dispose(&r);
}
