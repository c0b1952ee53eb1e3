/* The official OpenAI and Anthropic Node SDKs (npm packages "openai" and "@anthropic-ai/sdk",
 * pinned in tests/sdk/package-lock.json) drive the real server: tests/sdk/check.mjs runs
 * completions and chat, streaming and not, a prompt of token ids with echo, vLLM's ignore_eos and
 * min_tokens, and a bad request; tests/sdk/anthropic.mjs runs messages, streamed and not, a stop
 * sequence, a system prompt, bad requests, a wrong key and a 429. Each exits non-zero on any
 * mismatch. scripts/setup.sh installs Node and the packages; without them these tests fail and
 * say so, they do not skip. */
#include <criterion/criterion.h>

#include "harness.h"

#include <errno.h>
#include <openssl/sha.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* True when an executable `name` is on PATH. */
static bool on_path(const char *name)
{
    const char *path = getenv("PATH");
    if (!path)
        return false;
    char dir[4096];
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s/%s", (int)n, p, name);
        if (access(dir, X_OK) == 0)
            return true;
        p += n;
        if (*p == ':')
            p++;
    }
    return false;
}

/* Runs argv with stdout and stderr into out (NUL-terminated, truncated at cap); returns the
 * wait status. A child silent for 120 s is killed (a failure guard, not a timing). */
static int run(char *const argv[], char *out, size_t cap)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    for (;;) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        if (poll(&p, 1, 120000) <= 0) {
            kill(pid, SIGKILL);
            snprintf(out + len, cap - len, "\n[test_sdk: no output for 120 s; killed]\n");
            len = strlen(out);
            break;
        }
        char buf[4096];
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n <= 0)
            break;
        size_t take = (size_t)n < cap - 1 - len ? (size_t)n : cap - 1 - len;
        memcpy(out + len, buf, take);
        len += take;
    }
    out[len] = '\0';
    close(fds[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return status;
}

/* The path of tests/sdk/NAME in the source tree; fails (does not skip) without node or without
 * the npm package `package`. */
static void sdk_script(const char *name, const char *package, char *script, size_t len)
{
    const char *root = getenv("SL_SOURCE_ROOT");
    cr_assert_not_null(root, "SL_SOURCE_ROOT is not set (run through meson test)");
    char pkg[4096];
    snprintf(script, len, "%s/tests/sdk/%s", root, name);
    snprintf(pkg, sizeof pkg, "%s/tests/sdk/node_modules/%s/package.json", root, package);
    cr_assert(on_path("node"),
              "node is not installed: scripts/setup.sh installs nodejs and npm (Debian packages) "
              "and the pinned SDK packages; this test needs them and does not skip");
    struct stat st;
    cr_assert_eq(stat(pkg, &st), 0,
                 "the %s npm package is not installed (%s is missing): run scripts/setup.sh, "
                 "or `npm ci` in %s/tests/sdk",
                 package, pkg, root);
}

/* Runs node on argv (its script's report stays in the test log) and checks it passed. */
static void sdk_run(char *const argv[])
{
    static char out[1 << 16];
    int status = run(argv, out, sizeof out);
    fprintf(stderr, "%s", out);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "node %s %s failed (%s %d):\n%s",
              argv[1], argv[2], WIFEXITED(status) ? "exit status" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), out);
}

Test(sdk, official_openai_node_sdk_passes_every_check_when_driving_sluice, .timeout = 300)
{
    char script[4096];
    sdk_script("check.mjs", "openai", script, sizeof script);
    struct server srv;
    server_start(&srv, NULL);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", srv.port);
    char *argv[] = {"node", script, url, NULL};
    sdk_run(argv);
    server_stop(&srv);
}

#define SDK_KEY "sk-sdk-0123456789abcdefXYZ"
#define TIGHT_KEY "sk-tight-0123456789abcdefXYZ"

Test(sdk, official_anthropic_node_sdk_passes_every_check_when_driving_sluice, .timeout = 300)
{
    char script[4096];
    sdk_script("anthropic.mjs", "@anthropic-ai/sdk", script, sizeof script);
    /* Two tenants: one without limits, one allowed a request a minute (the 429). */
    char cfg[8192], path[64];
    unsigned char h[2][32];
    char hex[2][65];
    SHA256((const unsigned char *)SDK_KEY, strlen(SDK_KEY), h[0]);
    SHA256((const unsigned char *)TIGHT_KEY, strlen(TIGHT_KEY), h[1]);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 32; i++)
            snprintf(hex[k] + 2 * i, 3, "%02x", h[k][i]);
    snprintf(cfg, sizeof cfg,
             "{" HARNESS_TIERS_WITHOUT_GUARD ",\"tenants\":["
             "{\"name\":\"sdk\",\"key_sha256\":\"%s\",\"tiers\":[\"interactive\"],"
             "\"default_tier\":\"interactive\"},"
             "{\"name\":\"tight\",\"key_sha256\":\"%s\",\"tiers\":[\"interactive\"],"
             "\"default_tier\":\"interactive\",\"rpm\":1}]}",
             hex[0], hex[1]);
    snprintf(path, sizeof path, "/tmp/sluice-sdk-%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(cfg, 1, strlen(cfg), f), strlen(cfg));
    cr_assert_eq(fclose(f), 0);
    const char *args[] = {"--config", path, NULL};
    struct server srv;
    server_start(&srv, args);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", srv.port);
    char *argv[] = {"node", script, url, SDK_KEY, TIGHT_KEY, NULL};
    sdk_run(argv);
    server_stop(&srv);
    unlink(path);
}

#define BROKE_KEY "sk-broke-0123456789abcdefXYZ"

/* A spent budget: the SDK raises insufficient_quota after one request, without its retries. */
Test(sdk, official_openai_node_sdk_raises_its_quota_error_without_retrying, .timeout = 300)
{
    char script[4096];
    sdk_script("quota.mjs", "openai", script, sizeof script);
    unsigned char h[32];
    char hex[65], cfg[4096], path[64];
    SHA256((const unsigned char *)BROKE_KEY, strlen(BROKE_KEY), h);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
    /* Any request's worst case (16 tokens out at 1 a token) is more than the budget. */
    snprintf(cfg, sizeof cfg,
             "{" HARNESS_TIERS_WITHOUT_GUARD ",\"price\":{\"output_per_mtok\":1000000},"
             "\"tenants\":[{\"name\":\"broke\",\"key_sha256\":\"%s\",\"tiers\":[\"interactive\"],"
             "\"default_tier\":\"interactive\",\"budget\":{\"amount\":1,\"period\":\"total\"}}]}",
             hex);
    snprintf(path, sizeof path, "/tmp/sluice-sdk-quota-%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(cfg, 1, strlen(cfg), f), strlen(cfg));
    cr_assert_eq(fclose(f), 0);
    const char *args[] = {"--config", path, NULL};
    struct server srv;
    server_start(&srv, args);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", srv.port);
    char *argv[] = {"node", script, url, BROKE_KEY, NULL};
    sdk_run(argv);
    cr_assert_eq(metrics_fetch_sum(srv.port, "sluice:admission_decisions_total"), 1,
                 "one request: the SDK did not retry");
    server_stop(&srv);
    unlink(path);
}
