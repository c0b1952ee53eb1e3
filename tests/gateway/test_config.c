#include <criterion/criterion.h>
#include <jansson.h>
#include <sluice/config.h>
#include <sluice/server.h>

#include "config_impl.h"
#include "gateway_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *write_tmp(const char *content)
{
    char *path = strdup("/tmp/sluice-config-XXXXXX");
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

Test(gateway, defaults_serve_synthetic_on_8080_when_nothing_given)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_OK, "%s", err);
    cr_assert_str_eq(c.http.listen_host, "127.0.0.1");
    cr_assert_eq(c.http.listen_port, 8080);
    cr_assert_str_eq(c.model, "synthetic");
    sl_config_dispose(&c);
}

Test(gateway, shipped_example_config_loads_when_read)
{
    const char *root = getenv("SL_SOURCE_ROOT");
    cr_assert_not_null(root);
    char path[4096];
    snprintf(path, sizeof path, "%s/conf/sluice.json", root);
    struct sl_config c;
    sl_config_init(&c);
    char err[512] = "";
    cr_assert_eq(sl_config_load_file(&c, path, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_OK, "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, file_values_apply_when_valid)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(load(&c,
                      "{\"listen\":\"[::1]:9000\",\"max_seqs\":4,\"tokenizer\":\"t.bin\","
                      "\"//\":\"comment\"}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert_str_eq(c.http.listen_host, "::1");
    cr_assert_eq(c.http.listen_port, 9000);
    cr_assert_eq(c.engine.max_seqs, 4);
    cr_assert_str_eq(c.tokenizer, "t.bin");
    sl_config_dispose(&c);
}

Test(gateway, syntax_error_names_line_and_column_when_json_is_broken)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\n  \"max_seqs\": 4,\n  \"model\" \"x\"\n}", err, sizeof err),
                 SL_EFORMAT);
    cr_assert(strstr(err, "line 3"), "%s", err);
    cr_assert(strstr(err, "column"), "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, unreadable_file_is_named_without_position_when_missing)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_neq(sl_config_load_file(&c, "/nonexistent/sluice.json", err, sizeof err), SL_OK);
    cr_assert(strstr(err, "/nonexistent/sluice.json"), "%s", err);
    cr_assert_null(strstr(err, "line -1"), "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, bad_key_is_named_when_unknown_mistyped_or_out_of_range)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"max_seq\":4}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"max_seq\""), "%s", err);
    cr_assert_eq(load(&c, "{\"max_seqs\":\"4\"}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"max_seqs\""), "%s", err);
    cr_assert_eq(load(&c, "{\"block_size\":0}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"block_size\""), "%s", err);
    cr_assert_eq(load(&c, "{\"listen\":\"localhost\"}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"listen\""), "%s", err);
    cr_assert_eq(load(&c, "{\"log_level\":\"loud\"}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"log_level\""), "%s", err);
    cr_assert_eq(load(&c, "[1,2]", err, sizeof err), SL_EFORMAT);
    sl_config_dispose(&c);
}

Test(gateway, flags_override_config_file_when_both_given)
{
    char *path = write_tmp("{\"listen\":\"127.0.0.1:9001\",\"model\":\"synthetic:stories15M\"}");
    char *argv[] = {"sluice", "--listen", "0.0.0.0:7000", "--config", path, "--model=synthetic",
                    NULL};
    struct sl_config c;
    sl_config_init(&c);
    enum sl_cli_action act;
    char err[256] = "";
    cr_assert_eq(sl_config_from_args(&c, 6, argv, &act, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(act, SL_CLI_SERVE);
    cr_assert_str_eq(c.http.listen_host, "0.0.0.0");
    cr_assert_eq(c.http.listen_port, 7000);
    cr_assert_str_eq(c.model, "synthetic");
    sl_config_dispose(&c);
    unlink(path);
    free(path);
}

Test(gateway, bad_flag_is_named_when_unknown_or_missing_value)
{
    struct sl_config c;
    sl_config_init(&c);
    enum sl_cli_action act;
    char err[256] = "";
    char *a1[] = {"sluice", "--port", "80", NULL};
    cr_assert_eq(sl_config_from_args(&c, 3, a1, &act, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "--port"), "%s", err);
    char *a2[] = {"sluice", "--model", NULL};
    cr_assert_eq(sl_config_from_args(&c, 2, a2, &act, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "--model"), "%s", err);
    char *a3[] = {"sluice", "--listen", "127.0.0.1:99999", NULL};
    cr_assert_eq(sl_config_from_args(&c, 3, a3, &act, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "--listen"), "%s", err);
    char *a4[] = {"sluice", "--version", NULL};
    cr_assert_eq(sl_config_from_args(&c, 2, a4, &act, err, sizeof err), SL_OK);
    cr_assert_eq(act, SL_CLI_VERSION);
    sl_config_dispose(&c);
}

Test(gateway, cross_field_check_fails_when_batch_smaller_than_seqs)
{
    struct sl_config c;
    sl_config_init(&c);
    c.engine.max_seqs = 64;
    c.engine.max_batch_tokens = 8;
    char err[256] = "";
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "max_batch_tokens"), "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, kv_cache_fraction_is_checked_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"kv_cache_fraction\":0.25}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_float_eq(c.engine.kv_cache_fraction, 0.25, 1e-12);
    cr_assert_eq(load(&c, "{\"kv_cache_fraction\":1.5}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"kv_cache_fraction\""), "%s", err);
    cr_assert_eq(load(&c, "{\"kv_cache_fraction\":\"half\"}", err, sizeof err), SL_EINVAL);
    sl_config_dispose(&c);
}

Test(gateway, kv_dtype_defaults_to_f16_and_is_checked_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    cr_assert_eq(c.engine.kv_dtype, SL_KV_F16);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"kv_dtype\":\"f32\"}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(c.engine.kv_dtype, SL_KV_F32);
    json_t *j = sl_config_to_json(&c);
    cr_assert_str_eq(json_string_value(json_object_get(j, "kv_dtype")), "f32");
    json_decref(j);
    cr_assert_eq(load(&c, "{\"kv_dtype\":\"f16\"}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(c.engine.kv_dtype, SL_KV_F16);
    cr_assert_eq(load(&c, "{\"kv_dtype\":\"bf16\"}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"kv_dtype\" must be \"f32\" or \"f16\""), "%s", err);
    cr_assert_eq(load(&c, "{\"kv_dtype\":16}", err, sizeof err), SL_EINVAL);
    cr_assert_eq(load(&c, "{\"kv_dtype\":\"f32\"}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(c.engine.kv_dtype, SL_KV_F32);
    sl_config_dispose(&c);
}

Test(gateway, cpu_int8_activations_defaults_to_true_and_is_checked_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    cr_assert(c.engine.cpu_int8_activations);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"cpu_int8_activations\":false}", err, sizeof err), SL_OK, "%s", err);
    cr_assert(!c.engine.cpu_int8_activations);
    json_t *j = sl_config_to_json(&c);
    cr_assert(json_is_false(json_object_get(j, "cpu_int8_activations")));
    json_decref(j);
    cr_assert_eq(load(&c, "{\"cpu_int8_activations\":1}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "cpu_int8_activations"), "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, pin_threads_defaults_to_true_and_is_checked_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    cr_assert(c.engine.pin_threads);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"pin_threads\":false}", err, sizeof err), SL_OK, "%s", err);
    cr_assert(!c.engine.pin_threads);
    json_t *j = sl_config_to_json(&c);
    cr_assert(json_is_false(json_object_get(j, "pin_threads")));
    json_decref(j);
    cr_assert_eq(load(&c, "{\"pin_threads\":\"yes\"}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"pin_threads\" must be true or false"), "%s", err);
    cr_assert(!c.engine.pin_threads, "a refused value leaves the last one");
    cr_assert_eq(load(&c, "{\"pin_threads\":true}", err, sizeof err), SL_OK, "%s", err);
    cr_assert(c.engine.pin_threads);
    sl_config_dispose(&c);
}

Test(gateway, vllm_metrics_defaults_to_false_and_is_checked_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    cr_assert(!sl_config_api(&c)->vllm_metrics, "off unless asked for");
    json_t *j = sl_config_to_json(&c);
    cr_assert(json_is_false(json_object_get(j, "vllm_metrics")), "/admin/config shows it");
    json_decref(j);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"vllm_metrics\":true}", err, sizeof err), SL_OK, "%s", err);
    cr_assert(sl_config_api(&c)->vllm_metrics);
    j = sl_config_to_json(&c);
    cr_assert(json_is_true(json_object_get(j, "vllm_metrics")));
    json_decref(j);
    static const char *const bad[] = {"{\"vllm_metrics\":1}", "{\"vllm_metrics\":\"true\"}",
                                      "{\"vllm_metrics\":null}", "{\"vllm_metrics\":[\"vllm\"]}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(load(&c, bad[i], err, sizeof err), SL_EINVAL, "%s", bad[i]);
        cr_assert(strstr(err, "\"vllm_metrics\" must be true or false"), "%s", err);
    }
    cr_assert(sl_config_api(&c)->vllm_metrics, "a refused value leaves the last one");
    cr_assert_eq(load(&c, "{\"vllm_metrics\":false}", err, sizeof err), SL_OK, "%s", err);
    cr_assert(!sl_config_api(&c)->vllm_metrics);
    sl_config_dispose(&c);
}

Test(gateway, cpu_isa_defaults_to_auto_and_is_checked_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    cr_assert_str_eq(c.engine.cpu_isa, "auto");
    char err[256] = "";
    const char *ok[] = {"avx512", "avx2", "scalar", "auto"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char doc[64];
        snprintf(doc, sizeof doc, "{\"cpu_isa\":\"%s\"}", ok[i]);
        cr_assert_eq(load(&c, doc, err, sizeof err), SL_OK, "%s: %s", ok[i], err);
        cr_assert_str_eq(c.engine.cpu_isa, ok[i]);
        json_t *j = sl_config_to_json(&c);
        cr_assert_str_eq(json_string_value(json_object_get(j, "cpu_isa")), ok[i]);
        json_decref(j);
    }
    cr_assert_eq(load(&c, "{\"cpu_isa\":\"avx1024\"}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"cpu_isa\" must be one of auto, avx512, avx2, scalar"), "%s", err);
    cr_assert_eq(load(&c, "{\"cpu_isa\":2}", err, sizeof err), SL_EINVAL);
    cr_assert_eq(load(&c, "{\"cpu_isa\":null}", err, sizeof err), SL_EINVAL);
    cr_assert_str_eq(c.engine.cpu_isa, "auto", "a refused value leaves the last one");
    sl_config_dispose(&c);
}

Test(gateway, default_max_tokens_chat_defaults_to_the_context_and_is_checked_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    cr_assert_eq(c.api.default_max_tokens_chat, 0, "0: up to the model's context");
    cr_assert_eq(c.api.default_max_tokens, 16);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"default_max_tokens_chat\":64}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(c.api.default_max_tokens_chat, 64);
    cr_assert_eq(c.api.default_max_tokens, 16, "the completions default is its own key");
    cr_assert_eq(load(&c, "{\"default_max_tokens_chat\":-1}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"default_max_tokens_chat\""), "%s", err);
    cr_assert_eq(load(&c, "{\"default_max_tokens\":0}", err, sizeof err), SL_EINVAL,
                 "a completion's default stays at least 1");
    sl_config_dispose(&c);
}

Test(gateway, transport_limits_default_and_load_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    cr_assert_eq(c.http.listen_backlog, 4096);
    cr_assert_eq(c.http.header_timeout_ms, 10000);
    cr_assert_eq(c.http.idle_timeout_ms, 60000);
    cr_assert_eq(c.http.max_connections, 4096);
    cr_assert_eq(c.http.write_high_water_bytes, 65536);
    cr_assert_eq(c.http.write_hard_cap_bytes, 1 << 20);
    cr_assert_eq(c.http.tcp_send_buffer_bytes, 0);
    cr_assert_eq(c.http.drain_timeout_ms, 30000);
    cr_assert_null(c.http.tls.cert);
    char err[256] = "";
    cr_assert_eq(load(&c,
                      "{\"listen_backlog\":16,\"header_timeout_ms\":250,\"idle_timeout_ms\":500,"
                      "\"max_connections\":3,\"write_high_water_bytes\":0,"
                      "\"write_hard_cap_bytes\":2048,\"tcp_send_buffer_bytes\":4096,"
                      "\"drain_timeout_ms\":0}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(c.http.listen_backlog, 16);
    cr_assert_eq(c.http.header_timeout_ms, 250);
    cr_assert_eq(c.http.idle_timeout_ms, 500);
    cr_assert_eq(c.http.max_connections, 3);
    cr_assert_eq(c.http.write_high_water_bytes, 0);
    cr_assert_eq(c.http.write_hard_cap_bytes, 2048);
    cr_assert_eq(c.http.tcp_send_buffer_bytes, 4096);
    cr_assert_eq(c.http.drain_timeout_ms, 0);
    sl_config_dispose(&c);
}

Test(gateway, transport_limit_is_named_when_out_of_range_or_inconsistent)
{
    const char *bad[][2] = {
        {"{\"listen_backlog\":0}", "\"listen_backlog\""},
        {"{\"header_timeout_ms\":0}", "\"header_timeout_ms\""},
        {"{\"idle_timeout_ms\":-5}", "\"idle_timeout_ms\""},
        {"{\"max_connections\":0}", "\"max_connections\""},
        {"{\"write_hard_cap_bytes\":100}", "\"write_hard_cap_bytes\""},
        {"{\"drain_timeout_ms\":\"30s\"}", "\"drain_timeout_ms\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct sl_config c;
        sl_config_init(&c);
        char err[256] = "";
        cr_assert_eq(load(&c, bad[i][0], err, sizeof err), SL_EINVAL, "%s", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
        sl_config_dispose(&c);
    }
    /* The hard cap must be above the high-water mark: a cross-field check. */
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"write_high_water_bytes\":8192,\"write_hard_cap_bytes\":4096}", err,
                      sizeof err),
                 SL_OK, "%s", err);
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "write_hard_cap_bytes"), "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, tls_listener_loads_when_listen_cert_and_key_are_given)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(load(&c,
                      "{\"tls\":{\"// note\":\"a comment\",\"listen\":\"[::1]:8443\","
                      "\"cert\":\"/etc/c.pem\",\"key\":\"/etc/k.pem\"}}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_OK, "%s", err);
    cr_assert_str_eq(c.http.tls.listen_host, "::1");
    cr_assert_eq(c.http.tls.listen_port, 8443);
    cr_assert_str_eq(c.http.tls.cert, "/etc/c.pem");
    cr_assert_str_eq(c.http.tls.key, "/etc/k.pem");
    /* null turns it off again. */
    cr_assert_eq(load(&c, "{\"tls\":null}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_null(c.http.tls.cert);
    cr_assert_null(c.http.tls.listen_host);
    sl_config_dispose(&c);
}

Test(gateway, redis_section_loads_with_its_defaults_and_shows_no_password)
{
    struct sl_config c;
    sl_config_init(&c);
    cr_assert_null(sl_config_fleet(&c)->url, "budgets are local by default");
    char err[256] = "";
    cr_assert_eq(load(&c, "{\"redis\":{\"// note\":\"x\",\"url\":\"redis://:pw@10.0.0.5:6380/1\"}}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    const struct sl_config_fleet *f = sl_config_fleet(&c);
    cr_assert_str_eq(f->url, "redis://:pw@10.0.0.5:6380/1");
    cr_assert_str_eq(f->key_prefix, "sluice:");
    cr_assert_eq(f->timeout_ms, 20);
    cr_assert_str_eq(f->password_env, "SLUICE_REDIS_PASSWORD");
    json_t *j = sl_config_to_json(&c);
    char *text = json_dumps(j, JSON_SORT_KEYS);
    cr_assert(strstr(text, "redis://<redacted>@10.0.0.5:6380/1"), "%s", text);
    cr_assert_null(strstr(text, "pw@"), "%s", text);
    free(text);
    json_decref(j);
    cr_assert_eq(load(&c,
                      "{\"redis\":{\"url\":\"redis://r\",\"key_prefix\":\"\",\"timeout_ms\":"
                      "250,\"password_env\":\"REDIS_PW\"}}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert_str_eq(f->key_prefix, "", "an empty prefix is allowed");
    cr_assert_eq(f->timeout_ms, 250);
    cr_assert_str_eq(f->password_env, "REDIS_PW");
    cr_assert_eq(load(&c, "{\"redis\":null}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_null(f->url);
    sl_config_dispose(&c);
}

Test(gateway, reload_keeps_the_redis_section_the_server_started_with)
{
    struct sl_config cur, next;
    sl_config_init(&cur);
    sl_config_init(&next);
    char err[256] = "";
    cr_assert_eq(load(&cur, "{\"redis\":{\"url\":\"redis://a\"}}", err, sizeof err), SL_OK);
    cr_assert_eq(
        load(&next, "{\"redis\":{\"url\":\"redis://b\",\"timeout_ms\":99}}", err, sizeof err),
        SL_OK);
    sl_config_keep_start_keys(&next, &cur);
    cr_assert_str_eq(sl_config_fleet(&next)->url, "redis://a");
    cr_assert_eq(sl_config_fleet(&next)->timeout_ms, 20);
    /* Nor can a reload turn it off. */
    cr_assert_eq(load(&next, "{\"redis\":null}", err, sizeof err), SL_OK);
    sl_config_keep_start_keys(&next, &cur);
    cr_assert_str_eq(sl_config_fleet(&next)->url, "redis://a");
    sl_config_dispose(&cur);
    sl_config_dispose(&next);
}

Test(gateway, redis_error_names_the_field_when_wrong)
{
    const char *bad[][2] = {
        {"{\"redis\":\"redis://h\"}", "\"redis\" must be null or an object"},
        {"{\"redis\":{}}", "needs \"url\""},
        {"{\"redis\":{\"url\":\"rediss://h\"}}", "\"redis\".\"url\": rediss:// (TLS)"},
        {"{\"redis\":{\"url\":\"redis://h:70000\"}}", "port"},
        {"{\"redis\":{\"url\":\"\"}}", "\"redis\".\"url\" must be a non-empty string"},
        {"{\"redis\":{\"url\":\"redis://h\",\"timeout_ms\":0}}", "\"redis\".\"timeout_ms\""},
        {"{\"redis\":{\"url\":\"redis://h\",\"timeout_ms\":\"20\"}}", "\"timeout_ms\""},
        {"{\"redis\":{\"url\":\"redis://h\",\"db\":1}}", "unknown key \"redis\".\"db\""},
        {"{\"redis\":{\"url\":\"redis://h\",\"password_env\":5}}", "\"redis\".\"password_env\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct sl_config c;
        sl_config_init(&c);
        char err[256] = "";
        cr_assert_eq(load(&c, bad[i][0], err, sizeof err), SL_EINVAL, "%s", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
        cr_assert_null(sl_config_fleet(&c)->url, "a refused \"redis\" leaves budgets local");
        sl_config_dispose(&c);
    }
}

Test(gateway, tls_error_names_the_field_when_incomplete_or_wrong)
{
    const char *bad[][2] = {
        {"{\"tls\":\"127.0.0.1:8443\"}", "\"tls\" must be null or an object"},
        {"{\"tls\":{\"listen\":\"127.0.0.1:8443\",\"cert\":\"c.pem\"}}", "needs"},
        {"{\"tls\":{\"listen\":\"8443\",\"cert\":\"c\",\"key\":\"k\"}}", "\"tls\".\"listen\""},
        {"{\"tls\":{\"listen\":\"h:1\",\"cert\":\"\",\"key\":\"k\"}}", "\"tls\".\"cert\""},
        {"{\"tls\":{\"listen\":\"h:1\",\"cert\":\"c\",\"key\":\"k\",\"ca\":\"x\"}}",
         "unknown key \"tls\".\"ca\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct sl_config c;
        sl_config_init(&c);
        char err[256] = "";
        cr_assert_eq(load(&c, bad[i][0], err, sizeof err), SL_EINVAL, "%s", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
        /* A refused "tls" leaves the configuration without one. */
        cr_assert_null(c.http.tls.cert);
        sl_config_dispose(&c);
    }
    /* The same address as the plain listener cannot work. */
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(load(&c,
                      "{\"listen\":\"127.0.0.1:9000\",\"tls\":{\"listen\":\"127.0.0.1:9000\","
                      "\"cert\":\"c\",\"key\":\"k\"}}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "must differ"), "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, tls_check_names_the_file_when_it_does_not_load)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[512] = "";
    cr_assert_eq(sl_http_tls_check(&c, err, sizeof err), SL_OK, "no TLS: nothing to check");
    c.http.tls.listen_host = strdup("127.0.0.1");
    c.http.tls.cert = strdup("/nonexistent/cert.pem");
    c.http.tls.key = strdup("/nonexistent/key.pem");
    cr_assert_eq(sl_http_tls_check(&c, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "/nonexistent/cert.pem") && strstr(err, "No such file or directory"),
              "%s", err);
    char *junk = write_tmp("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n");
    free(c.http.tls.cert);
    c.http.tls.cert = junk;
    cr_assert_eq(sl_http_tls_check(&c, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, junk), "%s", err);
    unlink(junk);
    sl_config_dispose(&c);
}

Test(gateway, chat_template_is_a_builtin_name_or_null_when_configured)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_null(c.api.chat_template, "the model's own by default");
    cr_assert_eq(load(&c, "{\"chat_template\":\"chatml\"}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_OK, "%s", err);
    cr_assert_str_eq(c.api.chat_template, "chatml");
    cr_assert_eq(load(&c, "{\"chat_template\":null}", err, sizeof err), SL_OK, "%s", err);
    cr_assert_null(c.api.chat_template);
    /* An unknown name is refused at validation, naming the key and the builtins. */
    cr_assert_eq(load(&c, "{\"chat_template\":\"{{ messages }}\"}", err, sizeof err), SL_OK);
    cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"chat_template\""), "%s", err);
    cr_assert(strstr(err, "llama3"), "%s", err);
    cr_assert_eq(load(&c, "{\"chat_template\":3}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"chat_template\""), "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, device_is_auto_cpu_or_cuda_when_configured)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_str_eq(c.engine.device, "auto");
    const char *ok[] = {"{\"device\":\"cpu\"}", "{\"device\":\"cuda\"}", "{\"device\":\"cuda:0\"}",
                        "{\"device\":\"cuda:7\"}", "{\"device\":\"auto\"}"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cr_assert_eq(load(&c, ok[i], err, sizeof err), SL_OK, "%s: %s", ok[i], err);
        cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_OK, "%s: %s", ok[i], err);
    }
    cr_assert_str_eq(c.engine.device, "auto");
    /* A device the server could never use is refused before anything starts. */
    const char *bad[] = {"{\"device\":\"gpu\"}", "{\"device\":\"cuda:\"}",
                         "{\"device\":\"cuda:-1\"}", "{\"device\":\"cuda:1024\"}",
                         "{\"device\":\"cuda:0x1\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(load(&c, bad[i], err, sizeof err), SL_OK, "%s: %s", bad[i], err);
        cr_assert_eq(sl_config_validate(&c, err, sizeof err), SL_EINVAL, "%s", bad[i]);
        cr_assert(strstr(err, "\"device\""), "%s", err);
    }
    cr_assert_eq(load(&c, "{\"device\":0}", err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"device\""), "%s", err);
    sl_config_dispose(&c);
}

Test(gateway, devices_list_one_replica_per_entry_when_configured)
{
    struct sl_config c;
    sl_config_init(&c);
    char err[256] = "";
    cr_assert_eq(c.engine.n_devices, 0);
    cr_assert_eq(load(&c, "{\"devices\":[0,1,\"cuda:3\",\"cpu\"]}", err, sizeof err), SL_OK, "%s",
                 err);
    cr_assert_eq(c.engine.n_devices, 4);
    cr_assert_str_eq(c.engine.devices[0], "cuda:0");
    cr_assert_str_eq(c.engine.devices[1], "cuda:1");
    cr_assert_str_eq(c.engine.devices[2], "cuda:3");
    cr_assert_str_eq(c.engine.devices[3], "cpu");
    /* /admin/config shows them as loaded. */
    json_t *j = sl_config_to_json(&c);
    char *dump = json_dumps(json_object_get(j, "devices"), JSON_COMPACT);
    cr_assert_str_eq(dump, "[\"cuda:0\",\"cuda:1\",\"cuda:3\",\"cpu\"]");
    free(dump);
    json_decref(j);
    struct {
        const char *json, *err;
    } bad[] = {
        {"{\"devices\":[]}", "\"devices\" must be an array of 1 to 8 devices"},
        {"{\"devices\":[0,1,2,3,4,5,6,7,8]}", "\"devices\" must be an array of 1 to 8 devices"},
        {"{\"devices\":\"cuda:0\"}", "\"devices\" must be an array"},
        {"{\"devices\":[0,-1]}", "devices[1]: must be a CUDA ordinal from 0 to 1023"},
        {"{\"devices\":[\"gpu\"]}", "devices[0]: must be a CUDA ordinal"},
        {"{\"devices\":[0],\"device\":\"cuda:1\"}",
         "\"device\" names one device and \"devices\" several"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(load(&c, bad[i].json, err, sizeof err), SL_EINVAL, "%s", bad[i].json);
        cr_assert(strstr(err, bad[i].err), "%s: %s", bad[i].json, err);
    }
    sl_config_dispose(&c);
}

Test(gateway, metering_keys_load_with_their_defaults_and_a_model_may_price_itself)
{
    struct sl_config c;
    sl_config_init(&c);
    const struct sl_config_metering *m = sl_config_metering(&c);
    cr_assert_str_eq(m->currency, "USD");
    cr_assert_null(m->state_dir, "usage in memory unless a state_dir is given");
    cr_assert_eq(sl_config_model_price(&c, 0)->output_per_mtok, 0, "free unless priced");
    char err[512] = "";
    cr_assert_eq(load(&c,
                      "{\"currency\":\"EUR\",\"state_dir\":\"/var/lib/sluice\",\"price\":"
                      "{\"input_per_mtok\":0.15,\"output_per_mtok\":0.6,\"// x\":1},\"models\":"
                      "[{\"model\":\"synthetic\"},{\"name\":\"big\",\"model\":\"synthetic\","
                      "\"price\":{\"input_per_mtok\":3,\"cached_input_per_mtok\":0.3,"
                      "\"output_per_mtok\":15,\"device_second\":0.01}}]}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert_str_eq(m->currency, "EUR");
    cr_assert_str_eq(m->state_dir, "/var/lib/sluice");
    const struct sl_usage_price *p0 = sl_config_model_price(&c, 0),
                                *p1 = sl_config_model_price(&c, 1);
    cr_assert_eq(p0->input_per_mtok, 0.15);
    cr_assert_eq(p0->cached_input_per_mtok, 0.15, "no cached price: no discount");
    cr_assert_eq(p0->output_per_mtok, 0.6);
    cr_assert_eq(p1->cached_input_per_mtok, 0.3);
    cr_assert_eq(p1->device_second, 0.01);
    json_t *j = sl_config_to_json(&c);
    cr_assert_eq(json_real_value(json_object_get(json_object_get(j, "price"), "output_per_mtok")),
                 0.6);
    cr_assert_eq(json_number_value(json_object_get(
                     json_object_get(json_array_get(json_object_get(j, "models"), 1), "price"),
                     "output_per_mtok")),
                 15);
    json_decref(j);
    sl_config_dispose(&c);
}

Test(gateway, metering_errors_name_the_key_at_fault)
{
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"price\":{\"input_per_mtok\":-1}}", "\"price\".input_per_mtok must be a number"},
        {"{\"price\":{\"input\":1}}", "unknown key \"input\""},
        {"{\"price\":3}", "\"price\" must be an object"},
        {"{\"models\":[{\"model\":\"synthetic\",\"price\":{\"output_per_mtok\":\"1\"}}]}",
         "models[0].price.output_per_mtok must be a number"},
        {"{\"currency\":\"US D\"}", "\"currency\" must be 1 to 16 printable"},
        {"{\"currency\":\"\"}", "\"currency\" must be 1 to 16 printable"},
        {"{\"state_dir\":\"\"}", "\"state_dir\" must be a non-empty string"},
        {"{\"budget_webhook\":\"ftp://hooks.example/b\"}",
         "\"budget_webhook\" must be null or an http:// or https:// URL with a host"},
        {"{\"budget_webhook\":\"http:///b\"}", "\"budget_webhook\" must be null or an http://"},
        {"{\"budget_webhook\":7}", "\"budget_webhook\" must be null or an http://"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sl_config c;
        sl_config_init(&c);
        char err[512] = "";
        cr_assert_neq(load(&c, cases[i].json, err, sizeof err), SL_OK, "%s", cases[i].json);
        cr_assert(strstr(err, cases[i].want), "\"%s\" lacks \"%s\"", err, cases[i].want);
        sl_config_dispose(&c);
    }
}

Test(gateway, reload_changes_prices_but_keeps_the_state_dir)
{
    struct sl_config cur, next;
    sl_config_init(&cur);
    sl_config_init(&next);
    char err[256] = "";
    cr_assert_eq(load(&cur, "{\"state_dir\":\"/a\",\"models\":[{\"model\":\"synthetic\"}]}", err,
                      sizeof err),
                 SL_OK, "%s", err);
    cr_assert_eq(load(&next,
                      "{\"state_dir\":\"/b\",\"models\":[{\"model\":\"synthetic:stories15M\","
                      "\"price\":{\"output_per_mtok\":2}}]}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    sl_config_keep_start_keys(&next, &cur);
    cr_assert_str_eq(sl_config_metering(&next)->state_dir, "/a");
    cr_assert_str_eq(sl_config_engine(&next)->models[0].spec, "synthetic", "models stay");
    cr_assert_eq(sl_config_model_price(&next, 0)->output_per_mtok, 2, "prices change");
    sl_config_dispose(&cur);
    sl_config_dispose(&next);
}

Test(gateway, prefix_cache_defaults_to_tenant_scope_and_loads_when_given)
{
    struct sl_config c;
    sl_config_init(&c);
    const struct sl_config_prefix_cache *p = &sl_config_api(&c)->prefix_cache;
    cr_assert(p->enabled, "on unless turned off");
    cr_assert_eq(p->scope, SL_CONFIG_PREFIX_TENANT, "a tenant's prefixes are its own by default");
    json_t *j = sl_config_to_json(&c);
    json_t *o = json_object_get(j, "prefix_cache");
    cr_assert(json_is_true(json_object_get(o, "enabled")), "/admin/config shows it");
    cr_assert_str_eq(json_string_value(json_object_get(o, "scope")), "tenant");
    json_decref(j);

    char err[256] = "";
    cr_assert_eq(load(&c, "{\"prefix_cache\":{\"scope\":\"global\",\"// why\":\"one tenant\"}}",
                      err, sizeof err),
                 SL_OK, "%s", err);
    cr_assert(p->enabled, "a key left out keeps its value");
    cr_assert_eq(p->scope, SL_CONFIG_PREFIX_GLOBAL);
    cr_assert_eq(load(&c, "{\"prefix_cache\":{\"enabled\":false}}", err, sizeof err), SL_OK, "%s",
                 err);
    cr_assert(!p->enabled);
    cr_assert_eq(p->scope, SL_CONFIG_PREFIX_GLOBAL);
    j = sl_config_to_json(&c);
    o = json_object_get(j, "prefix_cache");
    cr_assert(json_is_false(json_object_get(o, "enabled")));
    cr_assert_str_eq(json_string_value(json_object_get(o, "scope")), "global");
    json_decref(j);
    cr_assert_eq(
        load(&c, "{\"prefix_cache\":{\"enabled\":true,\"scope\":\"tenant\"}}", err, sizeof err),
        SL_OK, "%s", err);
    cr_assert(p->enabled);
    cr_assert_eq(p->scope, SL_CONFIG_PREFIX_TENANT);
    sl_config_dispose(&c);
}

Test(gateway, prefix_cache_error_names_the_field_when_wrong)
{
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"prefix_cache\":true}", "\"prefix_cache\" must be an object {\"enabled\""},
        {"{\"prefix_cache\":null}", "\"prefix_cache\" must be an object"},
        {"{\"prefix_cache\":[]}", "\"prefix_cache\" must be an object"},
        {"{\"prefix_cache\":{\"enabled\":1}}",
         "\"prefix_cache\".\"enabled\" must be true or false"},
        {"{\"prefix_cache\":{\"enabled\":\"yes\"}}",
         "\"prefix_cache\".\"enabled\" must be true or false"},
        {"{\"prefix_cache\":{\"scope\":\"tenants\"}}",
         "\"prefix_cache\".\"scope\" must be \"tenant\""},
        {"{\"prefix_cache\":{\"scope\":null}}", "\"prefix_cache\".\"scope\" must be \"tenant\""},
        {"{\"prefix_cache\":{\"scope\":\"\"}}", "\"prefix_cache\".\"scope\" must be \"tenant\""},
        {"{\"prefix_cache\":{\"enable\":true}}",
         "unknown key \"prefix_cache\".\"enable\" (enabled, scope)"},
        {"{\"prefix_cache\":{\"enabled\":true,\"scope\":\"global\",\"salt\":\"x\"}}",
         "unknown key \"prefix_cache\".\"salt\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sl_config c;
        sl_config_init(&c);
        char err[512] = "";
        cr_assert_eq(load(&c, cases[i].json, err, sizeof err), SL_EINVAL, "%s", cases[i].json);
        cr_assert(strstr(err, cases[i].want), "\"%s\" lacks \"%s\"", err, cases[i].want);
        cr_assert(strstr(err, "/tmp/sluice-config-"), "names the file: %s", err);
        const struct sl_config_prefix_cache *p = &sl_config_api(&c)->prefix_cache;
        cr_assert(p->enabled && p->scope == SL_CONFIG_PREFIX_TENANT,
                  "a refused object changes nothing: %s", cases[i].json);
        sl_config_dispose(&c);
    }
}

Test(gateway, reload_changes_the_prefix_cache_when_the_file_does)
{
    struct sl_config cur, next;
    sl_config_init(&cur);
    sl_config_init(&next);
    char err[256] = "";
    cr_assert_eq(
        load(&next, "{\"prefix_cache\":{\"enabled\":false,\"scope\":\"global\"}}", err, sizeof err),
        SL_OK, "%s", err);
    sl_config_keep_start_keys(&next, &cur);
    cr_assert(!sl_config_api(&next)->prefix_cache.enabled, "not a start-only key");
    cr_assert_eq(sl_config_api(&next)->prefix_cache.scope, SL_CONFIG_PREFIX_GLOBAL);
    sl_config_dispose(&cur);
    sl_config_dispose(&next);
}
