/* The "device" key end to end: "auto" serves on a CUDA device when there is one and otherwise
 * falls back to the CPU with one log line; an explicit "cuda:0" without a device is a clear
 * start-up error, not a crash. Both outcomes are checked, whichever this machine allows. */
#include <criterion/criterion.h>

#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* A config file holding `json`; the caller unlinks and frees the returned path. */
static char *config_file(const char *json)
{
    char *path = strdup("/tmp/sluice-device-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    return path;
}

/* One greedy completion: the server answers 200 with text. */
static void complete_once(int port)
{
    char out[8192];
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}";
    int st = client_try_request(port, "POST", "/v1/completions", NULL, body, out, sizeof out);
    cr_assert_eq(st, 200, "completion: %d\n%s", st, out);
    cr_assert(strstr(out, "\"text_completion\""), "%s", out);
}

static bool served_on_cuda(const struct server *s)
{
    return strstr(s->log, "device auto: cuda:") != NULL;
}

Test(device, auto_serves_on_cpu_with_one_log_line_when_no_cuda_device_is_present)
{
    char *cfg = config_file("{\"device\":\"auto\"}");
    const char *args[] = {"--config", cfg, NULL};
    struct server s;
    server_start(&s, args);
    if (served_on_cuda(&s)) {
        cr_log_info("a CUDA device is present: auto chose it");
    } else {
        const char *line = strstr(s.log, "device auto: ");
        cr_assert_not_null(line, "no device line in the log:\n%s", s.log);
        cr_assert(strstr(line, "; running on the CPU\n"), "%s", s.log);
        cr_assert(strstr(line, "no CUDA"), "the line says why: %s", s.log);
        cr_assert_null(strstr(line + 1, "device auto: "), "one line, not more:\n%s", s.log);
    }
    complete_once(s.port);
    server_stop(&s);
    unlink(cfg);
    free(cfg);
}

Test(device, explicit_cuda_fails_at_start_with_a_message_when_no_device_is_present)
{
    char *cfg = config_file("{\"device\":\"cuda:0\"}");
    /* Is there a device? auto says so in its log line, without failing either way. */
    char *probe = config_file("{\"device\":\"auto\"}");
    const char *pargs[] = {"--config", probe, NULL};
    struct server s;
    server_start(&s, pargs);
    bool cuda = served_on_cuda(&s);
    server_stop(&s);
    if (cuda) {
        const char *args[] = {"--config", cfg, NULL};
        server_start(&s, args);
        cr_assert(strstr(s.log, "device cuda:0: cuda:0 ("), "%s", s.log);
        complete_once(s.port);
        server_stop(&s);
    } else {
        char cmd[1024], out[4096];
        snprintf(cmd, sizeof cmd, "'%s' --config '%s' --listen 127.0.0.1:0 2>&1",
                 getenv("SLUICE_BIN"), cfg);
        FILE *f = popen(cmd, "r");
        cr_assert_not_null(f);
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = '\0';
        int st = pclose(f);
        cr_assert(WIFEXITED(st), "sluice died of a signal: %s", out);
        cr_assert_neq(WEXITSTATUS(st), 0, "sluice started without a device: %s", out);
        cr_assert(strstr(out, "sluice: models[0] (synthetic:tiny): device \"cuda:0\": "), "%s",
                  out);
        cr_assert(strstr(out, "no CUDA device") || strstr(out, "no CUDA support"), "%s", out);
        cr_assert_null(strstr(out, "listening on"), "%s", out);
    }
    unlink(cfg);
    unlink(probe);
    free(cfg);
    free(probe);
}

/* The text of a completion's first choice in a raw response (static buffer). */
static const char *choice_text(const char *raw)
{
    static char text[1024];
    const char *p = strstr(raw, "\"text\":\"");
    cr_assert_not_null(p, "%s", raw);
    p += 8;
    size_t n = 0;
    while (p[n] && !(p[n] == '"' && p[n - 1] != '\\') && n < sizeof text - 1)
        n++;
    snprintf(text, sizeof text, "%.*s", (int)n, p);
    return text;
}

/* "devices" starts one worker and scheduler per entry over the same weights; a request goes to
 * the replica with the fewest requests in flight, and greedy output does not depend on which. Two
 * CPU replicas stand in for two GPUs here. */
Test(device, each_device_of_devices_runs_a_replica_and_requests_go_to_the_least_loaded)
{
    char *cfg = config_file("{\"devices\":[\"cpu\",\"cpu\"],\"threads\":1}");
    const char *args[] = {"--config", cfg, NULL};
    struct server s;
    server_start(&s, args);
    cr_assert(strstr(s.log, "2 workers"), "%s", s.log);

    /* A long stream holds replica 0. */
    int fd = client_connect(s.port);
    client_request(fd, "POST", "/v1/completions",
                   "{\"prompt\":\"Once\",\"max_tokens\":400,\"stream\":true,\"temperature\":0}",
                   true);
    char buf[16384];
    cr_assert(client_read_until(fd, "data: {", buf, sizeof buf), "%s", buf);

    /* The next request goes to the idle replica... */
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0}";
    char out[16384], first[1024];
    cr_assert_eq(client_try_request(s.port, "POST", "/v1/completions", NULL, body, out, sizeof out),
                 200, "%s", out);
    snprintf(first, sizeof first, "%s", choice_text(out));
    server_wait_log(&s, "\"replica\":1,");

    /* ...and once the stream is gone (its client hung up), replica 0 is the first again, with the
     * same greedy text. */
    close(fd);
    size_t at = server_wait_log_from(&s, 0, "\"status\":499");
    cr_assert_eq(client_try_request(s.port, "POST", "/v1/completions", NULL, body, out, sizeof out),
                 200, "%s", out);
    cr_assert_str_eq(choice_text(out), first);
    at = server_wait_log_from(&s, at, "\"status\":200,");
    const char *line = s.log + at;
    static const char want[] = "\"model\":\"synthetic:tiny\",\"replica\":0,";
    cr_assert(strncmp(strstr(line, "\"model\""), want, sizeof want - 1) == 0, "%s", line);

    /* Each replica's scheduler has its own series. */
    char *m = malloc(1 << 20);
    cr_assert_eq(client_try_request(s.port, "GET", "/metrics", NULL, NULL, m, 1 << 20), 200);
    for (int r = 0; r < 2; r++) {
        char series[128];
        snprintf(series, sizeof series,
                 "sluice:scheduler_steps_total{model=\"synthetic:tiny\",replica=\"%d\"} ", r);
        const char *p = strstr(m, series);
        cr_assert_not_null(p, "no %s in\n%s", series, m);
        cr_assert_gt(strtod(p + strlen(series), NULL), 0, "%s", series);
    }
    free(m);
    server_stop(&s);
    unlink(cfg);
    free(cfg);
}
