/* /metrics on the real server: after known traffic, the scrape's counters, histogram counts and
 * scheduler gauges agree with what the responses themselves reported; the gauges under vLLM's
 * names (vllm_metrics) come and go with the switch and agree with sluice's own. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct response get(int port, const char *method, const char *path, const char *body)
{
    int fd = client_connect(port);
    client_request(fd, method, path, body, false);
    struct response r;
    cr_assert(client_read_response(fd, &r), "no response to %s %s", method, path);
    close(fd);
    return r;
}

/* The value of the sample whose name and labels are exactly `series` (as the server writes them),
 * NAN when absent. Also checks that the sample's family was declared with # HELP and # TYPE. */
static double metric(const char *body, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = body; *p;) {
        const char *nl = strchr(p, '\n');
        cr_assert_not_null(nl, "every line ends with a newline");
        if (strncmp(p, series, n) == 0 && p[n] == ' ') {
            char fam[256], decl[300];
            size_t fl = strcspn(series, "{");
            snprintf(fam, sizeof fam, "%.*s", (int)fl, series);
            /* A histogram's samples carry a suffix its family name does not. */
            snprintf(decl, sizeof decl, "# TYPE %s ", fam);
            if (!strstr(body, decl)) {
                static const char *const sfx[] = {"_bucket", "_sum", "_count"};
                for (int i = 0; i < 3; i++) {
                    size_t sl = strlen(sfx[i]);
                    if (fl > sl && strncmp(fam + fl - sl, sfx[i], sl) == 0) {
                        fam[fl - sl] = '\0';
                        break;
                    }
                }
                snprintf(decl, sizeof decl, "# TYPE %s histogram\n", fam);
            }
            cr_assert(strstr(body, decl), "%s has a # TYPE", series);
            snprintf(decl, sizeof decl, "# HELP %s ", fam);
            cr_assert(strstr(body, decl), "%s has a # HELP", series);
            char *end;
            double v = strtod(p + n + 1, &end);
            cr_assert_eq(end, nl, "a plain number: %.*s", (int)(nl - p), p);
            return v;
        }
        p = nl + 1;
    }
    return NAN;
}

/* A counter that may not exist yet (a label set is exposed once it happened). */
static double count_of(const char *body, const char *series)
{
    double v = metric(body, series);
    return isnan(v) ? 0 : v;
}

static char *scrape(int port)
{
    struct response r = get(port, "GET", "/metrics", NULL);
    cr_assert_eq(r.status, 200);
    const char *ct = response_header(&r, "content-type");
    cr_assert(ct && strncmp(ct, "text/plain; version=0.0.4", 25) == 0, "content-type %s", ct);
    return r.body; /* the caller frees */
}

struct usage {
    int prompt, completion;
    char finish[16];
};

static void take_usage(json_t *j, struct usage *u)
{
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage)) {
        u->prompt = (int)json_integer_value(json_object_get(usage, "prompt_tokens"));
        u->completion = (int)json_integer_value(json_object_get(usage, "completion_tokens"));
    }
    json_t *f = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason");
    if (json_is_string(f))
        snprintf(u->finish, sizeof u->finish, "%s", json_string_value(f));
}

/* Runs one completion and returns the usage and finish reason its response reported. */
static struct usage complete(int port, const char *body, bool stream)
{
    struct response r = get(port, "POST", "/v1/completions", body);
    cr_assert_eq(r.status, 200, "%s", r.body);
    struct usage u = {-1, -1, ""};
    json_error_t e;
    if (!stream) {
        json_t *j = json_loads(r.body, 0, &e);
        cr_assert_not_null(j, "%s", r.body);
        take_usage(j, &u);
        json_decref(j);
    } else {
        for (char *ev = r.body; (ev = strstr(ev, "data: {"));) {
            char *end = strstr(ev, "\n\n");
            cr_assert_not_null(end);
            *end = '\0';
            json_t *j = json_loads(ev + 6, 0, &e);
            cr_assert_not_null(j, "%s", ev);
            take_usage(j, &u);
            json_decref(j);
            ev = end + 2;
        }
    }
    cr_assert_geq(u.prompt, 1, "usage reported: %s", r.body);
    cr_assert_geq(u.completion, 1);
    cr_assert(strcmp(u.finish, "stop") == 0 || strcmp(u.finish, "length") == 0);
    response_dispose(&r);
    return u;
}

Test(metrics, scrape_agrees_with_the_responses_when_requests_have_finished, .timeout = 300)
{
    struct server srv;
    server_start(&srv, NULL);

    char *before = scrape(srv.port);
    double steps0 = metric(before, "sluice:scheduler_steps_total");
    double kv_total = metric(before, "sluice:kv_blocks_capacity");
    cr_assert_gt(kv_total, 0, "the pool is published before the first step");
    cr_assert_eq(metric(before, "sluice:kv_blocks_used"), 0);
    cr_assert_null(strstr(before, "vllm:"), "vllm_metrics is off by default");
    free(before);

    /* A client that leaves mid-stream: counted once, as cancelled, with the tokens it got. */
    int fd = client_connect(srv.port);
    client_request(fd, "POST", "/v1/completions",
                   "{\"prompt\":\"Tell me a long story\",\"max_tokens\":400,\"stream\":true}",
                   false);
    char buf[8192];
    cr_assert(client_read_until(fd, "data: {", buf, sizeof buf), "a first chunk arrives");
    close(fd);
    server_wait_log(&srv, "\"finish\":\"cancelled\"");
    char *m = scrape(srv.port);
    const char *req = "sluice:requests_total{tier=\"interactive\",tenant=\"anonymous\",outcome=";
    char key[512];
    snprintf(key, sizeof key, "%s\"cancelled\"}", req);
    cr_assert_eq(metric(m, key), 1, "%s", m);
    cr_assert_eq(metric(m, "sluice:http_requests_total{route=\"/v1/completions\",code=\"499\"}"),
                 1);
    cr_assert_eq(metric(m, "sluice:time_to_first_token_seconds_count{tier=\"interactive\"}"), 1);
    cr_assert_eq(metric(m, "sluice:request_queue_time_seconds_count{tier=\"interactive\"}"), 1);
    cr_assert_eq(metric(m, "sluice:e2e_request_latency_seconds_count{tier=\"interactive\"}"), 0,
                 "only finished requests have an end-to-end latency");
    double gen0 = metric(m, "sluice:generation_tokens_total{tenant=\"anonymous\"}");
    double prompt0 = metric(m, "sluice:prompt_tokens_total{tenant=\"anonymous\"}");
    double itl0 = metric(m, "sluice:inter_token_latency_seconds_count{tier=\"interactive\"}");
    cr_assert_geq(gen0, 1);
    cr_assert_geq(prompt0, 1);
    free(m);

    static const struct {
        const char *body;
        bool stream;
    } reqs[] = {
        {"{\"prompt\":\"Hello there\",\"max_tokens\":8,\"temperature\":0}", false},
        {"{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"seed\":3}", false},
        {"{\"prompt\":\"a b c\",\"max_tokens\":1}", false},
        {"{\"prompt\":\"The cat\",\"max_tokens\":12,\"stream\":true,"
         "\"stream_options\":{\"include_usage\":true}}",
         true},
        {"{\"prompt\":\"x\",\"max_tokens\":30,\"seed\":9,\"stream\":true,"
         "\"stream_options\":{\"include_usage\":true}}",
         true},
    };
    const int n = (int)(sizeof reqs / sizeof reqs[0]);
    int n_stop = 0, n_length = 0, n_multi = 0;
    long prompt = 0, completion = 0;
    for (int i = 0; i < n; i++) {
        struct usage u = complete(srv.port, reqs[i].body, reqs[i].stream);
        prompt += u.prompt;
        completion += u.completion;
        n_stop += strcmp(u.finish, "stop") == 0;
        n_length += strcmp(u.finish, "length") == 0;
        n_multi += u.completion > 1;
    }
    struct response r = get(srv.port, "GET", "/v1/nothing", NULL);
    cr_assert_eq(r.status, 404);
    response_dispose(&r);
    r = get(srv.port, "POST", "/v1/completions", "{\"prompt\": ");
    cr_assert_eq(r.status, 400);
    response_dispose(&r);

    m = scrape(srv.port);
    /* Requests: each counted once, by outcome. */
    snprintf(key, sizeof key, "%s\"stop\"}", req);
    cr_assert_eq(count_of(m, key), n_stop, "%s", m);
    snprintf(key, sizeof key, "%s\"length\"}", req);
    cr_assert_eq(count_of(m, key), n_length);
    /* The malformed body is refused before classification: no tier. */
    cr_assert_eq(count_of(m, "sluice:requests_total{tier=\"none\",tenant=\"anonymous\","
                             "outcome=\"invalid\"}"),
                 1, "the malformed completion");
    snprintf(key, sizeof key, "%s\"cancelled\"}", req);
    cr_assert_eq(count_of(m, key), 1);
    for (const char *o = "error\0rejected\0"; *o; o += strlen(o) + 1) {
        snprintf(key, sizeof key, "%s\"%s\"}", req, o);
        cr_assert(isnan(metric(m, key)), "no %s request happened", o);
    }
    cr_assert_eq(metric(m, "sluice:http_requests_total{route=\"/v1/completions\",code=\"200\"}"),
                 n);
    cr_assert_eq(metric(m, "sluice:http_requests_total{route=\"/v1/completions\",code=\"400\"}"),
                 1);
    cr_assert_eq(metric(m, "sluice:http_requests_total{route=\"other\",code=\"404\"}"), 1,
                 "the unknown route");
    cr_assert_eq(metric(m, "sluice:http_requests_total{route=\"/metrics\",code=\"200\"}"), 2,
                 "the earlier scrapes (this one is counted once answered)");

    /* Latencies: one observation per finished request (and the cancelled one's first token and
     * queue time). */
    cr_assert_eq(metric(m, "sluice:time_to_first_token_seconds_count{tier=\"interactive\"}"),
                 n + 1);
    cr_assert_eq(metric(m, "sluice:e2e_request_latency_seconds_count{tier=\"interactive\"}"), n);
    cr_assert_eq(metric(m, "sluice:request_queue_time_seconds_count{tier=\"interactive\"}"), n + 1);
    cr_assert_eq(metric(m, "sluice:time_per_output_token_seconds_count{tier=\"interactive\"}"),
                 n_multi, "TPOT needs two tokens");
    cr_assert_eq(
        metric(m, "sluice:e2e_request_latency_seconds_bucket{tier=\"interactive\",le=\"+Inf\"}"),
        n);
    double itl = metric(m, "sluice:inter_token_latency_seconds_count{tier=\"interactive\"}") - itl0;
    cr_assert_leq(itl, completion - n, "at most one per token after each first");
    cr_assert_gt(itl, 0);

    /* Tokens: what the responses' usage said. */
    cr_assert_eq(metric(m, "sluice:prompt_tokens_total{tenant=\"anonymous\"}") - prompt0, prompt);
    cr_assert_eq(metric(m, "sluice:generation_tokens_total{tenant=\"anonymous\"}") - gen0,
                 completion);

    /* The scheduler, idle again. */
    cr_assert_eq(metric(m, "sluice:kv_blocks_capacity"), kv_total);
    cr_assert_eq(metric(m, "sluice:kv_blocks_used"), 0, "every block came back");
    cr_assert_eq(metric(m, "sluice:num_requests_running{tier=\"interactive\"}"), 0);
    cr_assert_eq(metric(m, "sluice:num_requests_waiting{tier=\"interactive\"}"), 0);
    cr_assert_eq(metric(m, "sluice:num_prompt_tokens_waiting{tier=\"interactive\"}"), 0);
    cr_assert_geq(metric(m, "sluice:scheduler_steps_total") - steps0, completion + gen0,
                  "requests ran one after another: a step per token");
    cr_assert_geq(metric(m, "sluice:step_batch_tokens"), 1);
    /* Measured by the scheduler from consecutive steps of the requests above. */
    cr_assert_gt(metric(m, "sluice:decode_step_seconds"), 0);
    cr_assert_gt(metric(m, "sluice:prefill_tokens_per_second"), 0);
    cr_assert_eq(metric(m, "sluice:num_preemptions_total{tier=\"interactive\"}"), 0);
    cr_assert_eq(metric(m, "sluice:step_batch_sequences"), 1);
    double busy = metric(m, "sluice:worker_busy_ratio");
    cr_assert(busy >= 0 && busy <= 1, "busy ratio %f", busy);
    cr_assert_gt(metric(m, "sluice:worker_busy_seconds_total"), 0);
    free(m);
    server_stop(&srv);
}

/* ---- vLLM's names (vllm_metrics) ---- */

static void write_config(const char *path, const char *content)
{
    char tmp[96];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    FILE *f = fopen(tmp, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(content, 1, strlen(content), f), strlen(content));
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(rename(tmp, path), 0); /* a reload never reads half a file */
}

/* Within one scrape, the vLLM gauges of the lone model "m1" agree with sluice's own (one
 * snapshot of the scheduler feeds both); enable_prefix_caching is caching ("True", "False"). */
static void check_vllm_agrees(const char *m, const char *caching)
{
    cr_assert_eq(metric(m, "vllm:num_requests_waiting{model_name=\"m1\"}"),
                 metrics_sum(m, "sluice:num_requests_waiting"), "%s", m);
    cr_assert_eq(metric(m, "vllm:num_requests_running{model_name=\"m1\"}"),
                 metrics_sum(m, "sluice:num_requests_running"));
    double used = metric(m, "sluice:kv_blocks_used"),
           total = metric(m, "sluice:kv_blocks_capacity");
    cr_assert_gt(total, 0);
    cr_assert_float_eq(metric(m, "vllm:kv_cache_usage_perc{model_name=\"m1\"}"), used / total, 1e-6,
                       "a fraction of the blocks, not a percentage");
    cr_assert_float_eq(metric(m, "vllm:gpu_cache_usage_perc{model_name=\"m1\"}"), used / total,
                       1e-6);
    char info[256];
    snprintf(info, sizeof info,
             "vllm:cache_config_info{model_name=\"m1\",block_size=\"16\",num_gpu_blocks=\"%.0f\","
             "enable_prefix_caching=\"%s\"}",
             total, caching);
    cr_assert_eq(metric(m, info), 1, "%s", m);
}

Test(metrics, vllm_gauges_follow_the_switch_and_sluices_gauges_when_on_and_reloaded, .timeout = 300)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/sluice-metrics-%d.json", (int)getpid());
    write_config(path, "{\"served_model_name\":\"m1\",\"vllm_metrics\":true}");
    const char *args[] = {"--config", path, NULL};
    struct server srv;
    server_start(&srv, args);

    /* Before any request: nothing waits, runs or holds a block. */
    char *m = scrape(srv.port);
    cr_assert_eq(metric(m, "vllm:num_requests_waiting{model_name=\"m1\"}"), 0, "%s", m);
    cr_assert_eq(metric(m, "vllm:num_requests_running{model_name=\"m1\"}"), 0);
    cr_assert_eq(metric(m, "vllm:kv_cache_usage_perc{model_name=\"m1\"}"), 0);
    check_vllm_agrees(m, "True");
    cr_assert_gt(metric(m, "sluice:kv_blocks_capacity"), 0, "sluice's own names stay");
    free(m);

    /* While a stream is open (running, or already done: either way), the two agree. */
    int fd = client_connect(srv.port);
    client_request(fd, "POST", "/v1/completions",
                   "{\"prompt\":\"Tell me a long story\",\"max_tokens\":200,\"stream\":true}",
                   false);
    char buf[8192];
    cr_assert(client_read_until(fd, "data: {", buf, sizeof buf), "a first chunk arrives");
    m = scrape(srv.port);
    check_vllm_agrees(m, "True");
    free(m);
    close(fd);
    static const char *const ends[] = {"\"finish\":\"cancelled\"", "\"finish\":\"length\"",
                                       "\"finish\":\"stop\"", NULL};
    server_wait_log_any(&srv, ends);

    /* After a request that ran to its end, idle again. */
    complete(srv.port, "{\"prompt\":\"Hello there\",\"max_tokens\":8,\"temperature\":0}", false);
    m = scrape(srv.port);
    cr_assert_eq(metric(m, "vllm:num_requests_waiting{model_name=\"m1\"}"), 0, "%s", m);
    cr_assert_eq(metric(m, "vllm:num_requests_running{model_name=\"m1\"}"), 0);
    cr_assert_eq(metric(m, "vllm:kv_cache_usage_perc{model_name=\"m1\"}"), 0, "every block back");
    check_vllm_agrees(m, "True");
    free(m);

    /* The prefix cache turned off by a reload: the picker is told so at the next scrape. */
    static const char *const reload[] = {"SIGHUP: configuration reloaded",
                                         "SIGHUP: configuration refused", NULL};
    write_config(path, "{\"served_model_name\":\"m1\",\"vllm_metrics\":true,"
                       "\"prefix_cache\":{\"enabled\":false}}");
    server_log_clear(&srv);
    cr_assert_eq(kill(srv.pid, SIGHUP), 0);
    cr_assert_eq(server_wait_log_any(&srv, reload), 0, "%s", srv.log);
    m = scrape(srv.port);
    check_vllm_agrees(m, "False");
    free(m);

    /* Switched off by a reload: gone from the next scrape, sluice's own names unchanged. */
    write_config(path, "{\"served_model_name\":\"m1\"}");
    server_log_clear(&srv);
    cr_assert_eq(kill(srv.pid, SIGHUP), 0);
    cr_assert_eq(server_wait_log_any(&srv, reload), 0, "%s", srv.log);
    m = scrape(srv.port);
    cr_assert_null(strstr(m, "vllm:"), "%s", m);
    cr_assert_eq(metric(m, "sluice:kv_blocks_used"), 0);
    free(m);
    server_stop(&srv);
    unlink(path);
}
