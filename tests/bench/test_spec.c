/* Unit tests of what describes a run: classes, lengths, arrivals, --goodput, traces, the command
 * line, and the rules that fill in what a class leaves unset. Errors must name their source. */
#include <criterion/criterion.h>

#include "bench_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct sl_bench_config cfg;
static char err[512];

static void setup(void)
{
    unsetenv("OPENAI_API_KEY");
    sl_bench_config_init(&cfg);
    err[0] = '\0';
}

static void teardown(void)
{
    sl_bench_config_dispose(&cfg);
}

TestSuite(bench_spec, .init = setup, .fini = teardown);

/* Parses argv (NULL-terminated, without the program name). */
static int parse(const char *const *args)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = "sluice-bench";
    for (int i = 0; args[i]; i++)
        argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    return sl_bench_cli_parse(&cfg, argc, argv, err, sizeof err);
}

static char *temp_file(const char *content)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/sluice-bench-test-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    close(fd);
    return path;
}

Test(bench_spec, class_keys_are_set_when_spec_names_them)
{
    int rc = sl_bench_class_parse(&cfg,
                                  "chatty,rate=5,weight=2,arrival=onoff:3:7,tier=interactive,"
                                  "service_tier=flex,tenant=acme,key=sk-1,model=m,endpoint=chat,"
                                  "prompt=lognormal:200:0.5,output=fixed:64,ignore_eos=1,"
                                  "temperature=0.5,n=10,ttft_slo=500,tpot_slo=50,e2el_slo=9000",
                                  err, sizeof err);
    cr_assert_eq(rc, SL_OK, "%s", err);
    cr_assert_eq(cfg.n_classes, 1);
    struct sl_bench_class *k = &cfg.classes[0];
    cr_expect_str_eq(k->name, "chatty");
    cr_expect_eq(k->rate, 5);
    cr_expect(k->rate_set);
    cr_expect_eq(k->weight, 2);
    cr_expect_eq(k->arrival.kind, SL_BENCH_ARRIVAL_ONOFF);
    cr_expect_eq(k->arrival.on_s, 3);
    cr_expect_eq(k->arrival.off_s, 7);
    cr_expect_str_eq(k->tier, "interactive");
    cr_expect_str_eq(k->service_tier, "flex");
    cr_expect_str_eq(k->tenant, "acme");
    cr_expect_str_eq(k->key, "sk-1");
    cr_expect_str_eq(k->model, "m");
    cr_expect_eq(k->chat, 1);
    cr_expect_eq(k->prompt.kind, SL_BENCH_LEN_LOGNORMAL);
    cr_expect_eq(k->prompt.a, 200);
    cr_expect_eq(k->prompt.b, 0.5);
    cr_expect_eq(k->output.kind, SL_BENCH_LEN_FIXED);
    cr_expect_eq(k->output.a, 64);
    cr_expect_eq(k->ignore_eos, 1);
    cr_expect_eq(k->temperature, 0.5);
    cr_expect_eq(k->max_requests, 10);
    cr_expect_eq(k->slo_ms[SL_BENCH_SLO_TTFT], 500);
    cr_expect_eq(k->slo_ms[SL_BENCH_SLO_TPOT], 50);
    cr_expect_eq(k->slo_ms[SL_BENCH_SLO_E2EL], 9000);
}

Test(bench_spec, errors_name_the_class_and_key_when_spec_is_wrong)
{
    static const struct {
        const char *spec, *needle;
    } bad[] = {
        {"a,colour=red", "unknown key 'colour'"},
        {"a,rate=-1", "class a: rate"},
        {"a,rate", "'rate': expected key=value"},
        {"a,prompt=gaussian:3", "class a: prompt: gaussian:3"},
        {"a,output=uniform:9:3", "HI must be at least LO"},
        {"a,output=fixed:0", "from 1 to"},
        {"a,arrival=bursty", "class a: arrival"},
        {"a,endpoint=embeddings", "class a: endpoint"},
        {"a,ignore_eos=maybe", "ignore_eos"},
        {"a,tier=x\"y", "class a: tier"},
        {"a,key=env:SLUICE_BENCH_NO_SUCH_VAR", "SLUICE_BENCH_NO_SUCH_VAR is not set"},
        {"bad name,rate=1", "class name 'bad name'"},
        {",rate=1", "class name ''"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_bench_config_dispose(&cfg);
        sl_bench_config_init(&cfg);
        err[0] = '\0';
        cr_expect_eq(sl_bench_class_parse(&cfg, bad[i].spec, err, sizeof err), SL_EINVAL, "%s",
                     bad[i].spec);
        cr_expect(strstr(err, bad[i].needle), "%s: message \"%s\" lacks \"%s\"", bad[i].spec, err,
                  bad[i].needle);
    }
    sl_bench_config_dispose(&cfg);
    sl_bench_config_init(&cfg);
    cr_assert_eq(sl_bench_class_parse(&cfg, "a,rate=1", err, sizeof err), SL_OK);
    cr_expect_eq(sl_bench_class_parse(&cfg, "a,rate=2", err, sizeof err), SL_EINVAL);
    cr_expect(strstr(err, "defined twice"), "%s", err);
}

Test(bench_spec, length_file_is_sampled_when_given)
{
    char *path = temp_file("# prompt lengths\n12\n\n 40 \n7 # short\n");
    char spec[128];
    snprintf(spec, sizeof spec, "file:%s", path);
    struct sl_bench_len d;
    cr_assert_eq(sl_bench_len_parse(&cfg, &d, spec, err, sizeof err), SL_OK, "%s", err);
    cr_expect_eq(d.n_values, 3);
    cr_expect_eq(d.values[0], 12);
    cr_expect_eq(d.values[1], 40);
    cr_expect_eq(d.values[2], 7);
    unlink(path);
    path = temp_file("12\nlots\n");
    snprintf(spec, sizeof spec, "file:%s", path);
    cr_expect_eq(sl_bench_len_parse(&cfg, &d, spec, err, sizeof err), SL_EINVAL);
    cr_expect(strstr(err, ":2: expected a token count"), "%s", err);
    unlink(path);
}

Test(bench_spec, classes_file_is_read_when_json_lists_them)
{
    char *path = temp_file("{\"classes\": [\n"
                           " {\"name\": \"interactive\", \"rate\": 5, \"tier\": \"interactive\","
                           "  \"endpoint\": \"chat\", \"prompt\": \"lognormal:200:0.5\","
                           "  \"output\": \"fixed:64\", \"ignore_eos\": true},\n"
                           " {\"name\": \"batch\", \"rate\": 0.5, \"n\": 20}\n]}");
    cr_assert_eq(sl_bench_classes_load(&cfg, path, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(cfg.n_classes, 2);
    cr_expect_str_eq(cfg.classes[0].name, "interactive");
    cr_expect_eq(cfg.classes[0].rate, 5);
    cr_expect_eq(cfg.classes[0].chat, 1);
    cr_expect_eq(cfg.classes[0].ignore_eos, 1);
    cr_expect_eq(cfg.classes[1].rate, 0.5);
    cr_expect_eq(cfg.classes[1].max_requests, 20);
    unlink(path);
    path = temp_file("[{\"name\": \"x\", \"rate\": [1]}]");
    cr_expect_eq(sl_bench_classes_load(&cfg, path, err, sizeof err), SL_EINVAL);
    cr_expect(strstr(err, "classes[0].rate"), "%s", err);
    unlink(path);
}

Test(bench_spec, goodput_reads_vllm_words_when_given_several)
{
    const char *args[] = {"--goodput",      "ttft:500", "tpot:50", "e2el:9000",
                          "--num-requests", "3",        NULL};
    cr_assert_eq(parse(args), SL_OK, "%s", err);
    cr_expect_eq(cfg.slo_ms[SL_BENCH_SLO_TTFT], 500);
    cr_expect_eq(cfg.slo_ms[SL_BENCH_SLO_TPOT], 50);
    cr_expect_eq(cfg.slo_ms[SL_BENCH_SLO_E2EL], 9000);
    cr_expect_eq(cfg.num_requests, 3);
    /* Classes inherit the objectives. */
    cr_expect_eq(cfg.classes[0].slo_ms[SL_BENCH_SLO_TPOT], 50);
    double slo[3] = {NAN, NAN, NAN};
    cr_expect_eq(sl_bench_goodput_parse(slo, "ttft:100,e2el:200", err, sizeof err), SL_OK);
    cr_expect_eq(slo[0], 100);
    cr_expect(isnan(slo[1]));
    cr_expect_eq(slo[2], 200);
    cr_expect_eq(sl_bench_goodput_parse(slo, "itl:5", err, sizeof err), SL_EINVAL);
    cr_expect(strstr(err, "unknown objective 'itl'"), "%s", err);
}

Test(bench_spec, url_parts_are_split_when_url_has_port_and_prefix)
{
    const char *a1[] = {"--url", "http://10.0.0.1:9000/v1/", NULL};
    cr_assert_eq(parse(a1), SL_OK, "%s", err);
    cr_expect_str_eq(cfg.host, "10.0.0.1");
    cr_expect_str_eq(cfg.port, "9000");
    cr_expect_str_eq(cfg.prefix, "", "/v1 is not said twice before /v1/completions");
    cr_expect_eq(cfg.num_requests, 1000, "vLLM's default count");
    sl_bench_config_dispose(&cfg);
    sl_bench_config_init(&cfg);
    const char *a2[] = {"--url", "http://[::1]/proxy", "--backend", "openai-chat", NULL};
    cr_assert_eq(parse(a2), SL_OK, "%s", err);
    cr_expect_str_eq(cfg.host, "[::1]");
    cr_expect_str_eq(cfg.port, "80");
    cr_expect_str_eq(cfg.prefix, "/proxy");
    cr_expect_str_eq(cfg.classes[0].path, "/v1/chat/completions");
    cr_expect_eq(cfg.classes[0].chat, 1);
    sl_bench_config_dispose(&cfg);
    sl_bench_config_init(&cfg);
    const char *a3[] = {"--host", "example.org", "--port", "8000", NULL};
    cr_assert_eq(parse(a3), SL_OK, "%s", err);
    cr_expect_str_eq(cfg.url, "http://example.org:8000");
    cr_expect_str_eq(cfg.port, "8000");
}

Test(bench_spec, command_line_errors_name_the_flag)
{
    static const struct {
        const char *args[6];
        const char *needle;
    } bad[] = {
        {{"--url", "https://x", NULL}, "https is not supported"},
        {{"--url", "ftp://x", NULL}, "expected http://"},
        {{"--url", "http://x:99999", NULL}, "bad port"},
        {{"--request-rate", "fast", NULL}, "--request-rate fast"},
        {{"--concurrency", "0", NULL}, "--concurrency 0"},
        {{"--concurrency", "4", "--max-concurrency", "2", NULL}, "--max-concurrency caps"},
        {{"--duration", "10", NULL}, "needs --num-requests"},
        {{"--frobnicate", NULL}, "unknown option --frobnicate"},
        {{"--num-requests", NULL}, "--num-requests: expected a value"},
        {{"--extra-body", "[1]", NULL}, "--extra-body"},
        {{"--warmup", "2", "--num-warmups", "3", NULL}, "not both"},
        {{"--metric-percentiles", "50,101", NULL}, "--metric-percentiles"},
        {{"--input-len", "0", NULL}, "--input-len"},
        {{"--shared-prefix-tokens", "-1", NULL}, "--shared-prefix-tokens -1"},
        {{"--class", "a,shared_prefix=1.5", NULL}, "class a: shared_prefix"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_bench_config_dispose(&cfg);
        sl_bench_config_init(&cfg);
        err[0] = '\0';
        cr_expect_eq(parse(bad[i].args), SL_EINVAL, "case %zu", i);
        cr_expect(strstr(err, bad[i].needle), "case %zu: \"%s\" lacks \"%s\"", i, err,
                  bad[i].needle);
    }
}

Test(bench_spec, plot_fails_early_when_gnuplot_is_missing)
{
    char *old = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
    setenv("PATH", "/nonexistent-sluice-bench", 1);
    const char *args[] = {"--plot", "/tmp/x", NULL};
    int rc = parse(args);
    if (old) {
        setenv("PATH", old, 1);
        free(old);
    }
    cr_expect_eq(rc, SL_EINVAL);
    cr_expect(strstr(err, "--plot needs gnuplot"), "%s", err);
}

Test(bench_spec, rates_are_shared_by_weight_when_classes_give_none)
{
    const char *args[] = {"--request-rate", "10",         "--class", "a,weight=1",
                          "--class",        "b,weight=3", NULL};
    const char *more[] = {"--class", "c,rate=2", NULL};
    char *argv[16];
    int argc = 0;
    argv[argc++] = "sluice-bench";
    for (int i = 0; args[i]; i++)
        argv[argc++] = (char *)args[i];
    for (int i = 0; more[i]; i++)
        argv[argc++] = (char *)more[i];
    cr_assert_eq(sl_bench_cli_parse(&cfg, argc, argv, err, sizeof err), SL_OK, "%s", err);
    cr_expect_float_eq(cfg.classes[0].rate, 2.5, 1e-12);
    cr_expect_float_eq(cfg.classes[1].rate, 7.5, 1e-12);
    cr_expect_eq(cfg.classes[2].rate, 2, "a class's own rate stays");
    cr_expect_str_eq(cfg.classes[0].path, "/v1/completions");
    cr_expect_str_eq(cfg.classes[0].prompt.text, "fixed:128");
}

Test(bench_spec, trace_lines_make_classes_when_tier_and_tenant_differ)
{
    char *path = temp_file(
        "{\"t\": 0.5, \"tier\": \"batch\", \"tenant\": \"acme\", \"prompt_tokens\": 100, "
        "\"output_tokens\": 10}\n"
        "# a comment\n"
        "{\"t\": 0.0, \"tier\": \"interactive\", \"tenant\": \"acme\", \"prompt_tokens\": 128, "
        "\"output_tokens\": 64}\n"
        "\n"
        "{\"t\": 0.5, \"tier\": \"interactive\", \"prompt_tokens\": 8, \"output_tokens\": 4, "
        "\"extra\": 1}\n"
        "{\"t\": 0.2, \"tier\": \"batch\", \"tenant\": \"acme\", \"prompt_tokens\": 7, "
        "\"output_tokens\": 3}\n");
    const char *args[] = {"--trace", path, "--tenant-key", "acme=sk-acme", NULL};
    cr_assert_eq(parse(args), SL_OK, "%s", err);
    cr_assert_eq(cfg.n_trace, 4);
    /* Sorted by time; equal times keep file order. */
    cr_expect_eq(cfg.trace[0].t, 0.0);
    cr_expect_eq(cfg.trace[1].t, 0.2);
    cr_expect_eq(cfg.trace[2].prompt_tokens, 100);
    cr_expect_eq(cfg.trace[3].prompt_tokens, 8);
    cr_assert_eq(cfg.n_classes, 3);
    cr_expect_str_eq(cfg.classes[cfg.trace[2].cls].name, "batch@acme");
    cr_expect_str_eq(cfg.classes[cfg.trace[0].cls].name, "interactive@acme");
    cr_expect_str_eq(cfg.classes[cfg.trace[3].cls].name, "interactive");
    cr_expect_str_eq(cfg.classes[cfg.trace[2].cls].key, "sk-acme");
    cr_expect_str_eq(cfg.classes[cfg.trace[2].cls].tier, "batch");
    cr_expect_null(cfg.classes[cfg.trace[3].cls].key);
    cr_expect_eq(cfg.trace[1].cls, cfg.trace[2].cls);
    cr_expect_eq(cfg.num_requests, 0, "a trace ends by itself");
    unlink(path);
}

Test(bench_spec, trace_errors_name_the_line_when_a_field_is_wrong)
{
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"{\"t\": 0, \"prompt_tokens\": 1, \"output_tokens\": 1}\n{\"t\": -1, \"prompt_tokens\": "
         "1, "
         "\"output_tokens\": 1}\n",
         ":2: t:"},
        {"{\"t\": 0, \"prompt_tokens\": 0, \"output_tokens\": 1}\n", ":1: prompt_tokens"},
        {"{\"t\": 0, \"prompt_tokens\": 5}\n", ":1: output_tokens"},
        {"{\"t\": 0, \"tier\": 3, \"prompt_tokens\": 1, \"output_tokens\": 1}\n", ":1: tier"},
        {"not json\n", ":1: expected a JSON object"},
        {"\n# nothing\n", "no requests"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sl_bench_config_dispose(&cfg);
        sl_bench_config_init(&cfg);
        char *path = temp_file(bad[i].text);
        const char *args[] = {"--trace", path, NULL};
        cr_expect_eq(parse(args), SL_EINVAL, "case %zu", i);
        cr_expect(strstr(err, bad[i].needle), "case %zu: \"%s\" lacks \"%s\"", i, err,
                  bad[i].needle);
        unlink(path);
    }
}

Test(bench_spec, trace_lines_use_a_defined_class_when_tier_matches)
{
    char *path = temp_file("{\"t\": 0, \"tier\": \"batch\", \"tenant\": \"x\", \"prompt_tokens\": "
                           "5, \"output_tokens\": 5}\n");
    const char *args[] = {"--class", "bulk,tier=batch,key=sk-b", "--trace", path, NULL};
    cr_assert_eq(parse(args), SL_OK, "%s", err);
    cr_expect_eq(cfg.n_classes, 1);
    cr_expect_str_eq(cfg.classes[cfg.trace[0].cls].name, "bulk");
    unlink(path);
}

Test(bench_spec, shared_prefix_is_the_runs_unless_a_class_gives_its_own)
{
    const char *args[] = {
        "--shared-prefix-tokens", "1000", "--class", "a", "--class", "b,shared_prefix=0", "--class",
        "c,shared_prefix=30",     NULL};
    cr_assert_eq(parse(args), SL_OK, "%s", err);
    cr_expect_eq(cfg.classes[0].shared_prefix, 1000);
    cr_expect_eq(cfg.classes[1].shared_prefix, 0, "0 opts a class out");
    cr_expect_eq(cfg.classes[2].shared_prefix, 30);
    sl_bench_config_dispose(&cfg);
    sl_bench_config_init(&cfg);
    const char *none[] = {"--num-requests", "1", NULL};
    cr_assert_eq(parse(none), SL_OK, "%s", err);
    cr_expect_eq(cfg.classes[0].shared_prefix, 0, "prompts share nothing by default");
}
