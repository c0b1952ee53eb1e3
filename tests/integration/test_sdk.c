/* The official OpenAI Node SDK (npm package "openai", pinned in tests/sdk/package-lock.json)
 * drives the real server: tests/sdk/check.mjs runs completions and chat, streaming and not, a
 * prompt of token ids with echo, vLLM's ignore_eos and min_tokens, and a bad request, and exits
 * non-zero on any mismatch. scripts/setup.sh installs Node and the
 * package; without them this test fails and says so, it does not skip. */
#include <criterion/criterion.h>

#include "harness.h"

#include <errno.h>
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

Test(sdk, official_openai_node_sdk_passes_every_check_when_driving_sluice, .timeout = 300)
{
    const char *root = getenv("SL_SOURCE_ROOT");
    cr_assert_not_null(root, "SL_SOURCE_ROOT is not set (run through meson test)");
    char script[4096], pkg[4096];
    snprintf(script, sizeof script, "%s/tests/sdk/check.mjs", root);
    snprintf(pkg, sizeof pkg, "%s/tests/sdk/node_modules/openai/package.json", root);
    cr_assert(on_path("node"),
              "node is not installed: scripts/setup.sh installs nodejs and npm (Debian packages) "
              "and the pinned openai package; this test needs them and does not skip");
    struct stat st;
    cr_assert_eq(stat(pkg, &st), 0,
                 "the openai npm package is not installed (%s is missing): run scripts/setup.sh, "
                 "or `npm ci` in %s/tests/sdk",
                 pkg, root);

    struct server srv;
    server_start(&srv, NULL);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1", srv.port);
    char *argv[] = {"node", script, url, NULL};
    static char out[1 << 16];
    int status = run(argv, out, sizeof out);
    server_stop(&srv);
    fprintf(stderr, "%s", out); /* the script's report stays in the test log */
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "node %s %s failed (%s %d):\n%s",
              script, url, WIFEXITED(status) ? "exit status" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), out);
}
