/* sluice: start-up, signals, orderly shutdown. The main thread only waits for a signal:
 * SIGHUP reloads the configuration, SIGTERM or SIGINT drains and exits. */
#include <sluice/api.h>
#include <sluice/config.h>
#include <sluice/fleet.h>
#include <sluice/http.h>
#include <sluice/server.h>
#include <sluice/usage.h>

#include <event2/thread.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static enum sl_log_level level_of(const char *name)
{
    if (strcmp(name, "debug") == 0)
        return SL_LOG_DEBUG;
    if (strcmp(name, "warn") == 0)
        return SL_LOG_WARN;
    if (strcmp(name, "error") == 0)
        return SL_LOG_ERROR;
    return SL_LOG_INFO;
}

/* SIGHUP: the configuration is read again from the same command line (the file, then the flags
 * over it) and handed to the server; a configuration that fails to load keeps the old one. */
static void reload(struct sl_http_server *http, int argc, char **argv)
{
    char err[1024] = "";
    enum sl_cli_action action;
    struct sl_config *next = sl_config_new();
    int st = sl_config_from_args(next, argc, argv, &action, err, sizeof err);
    if (st == SL_OK) /* it hands every model's scheduler the new tiers */
        st = sl_http_server_reload(http, next, err, sizeof err);
    if (st == SL_OK) {
        sl_log_set_level(level_of(sl_config_log_level(next)));
        sl_log(SL_LOG_INFO, "SIGHUP: configuration reloaded");
    } else {
        sl_log(SL_LOG_ERROR, "SIGHUP: configuration refused, the old one keeps serving: %s", err);
    }
    sl_config_unref(next);
}

/* Every connection is a descriptor: raise the soft limit to the hard one so that
 * max_connections, not EMFILE, is what refuses clients. */
static void raise_fd_limit(const struct sl_config_http *hc)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    rlim_t want = (rlim_t)hc->max_connections + 64;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
        sl_log(SL_LOG_WARN,
               "open-file limit %llu is below max_connections (%d) plus what the server needs; "
               "accept will fail before max_connections is reached",
               (unsigned long long)rl.rlim_cur, hc->max_connections);
}

/* --check-config: whatever start-up would find wrong before serving, without serving: every
 * model (its synthetic shape, or its files' headers, tensor tables and tokenizer: no weights are
 * read or made), the TLS certificate and key, the listen addresses (free now). */
static int check_start(const struct sl_config *cfg, char *err, size_t errlen)
{
    const struct sl_config_engine *ec = sl_config_engine(cfg);
    for (int i = 0; i < ec->n_models; i++) {
        const struct sl_config_model *m = &ec->models[i];
        char why[768];
        if (sl_model_check(m->spec, m->tokenizer, why, sizeof why) != SL_OK) {
            if (m->name)
                snprintf(err, errlen, "models[%d] (%s): %s", i, m->name, why);
            else
                snprintf(err, errlen, "models[%d]: %s", i, why);
            return SL_EINVAL;
        }
    }
    int st = sl_http_tls_check(cfg, err, errlen);
    if (st == SL_OK)
        st = sl_http_listen_check(cfg, err, errlen);
    return st;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "simulate") == 0)
        return sl_simulate_main(argc - 1, argv + 1, stdout, stderr);
    if (argc > 1 && strcmp(argv[1], "usage") == 0)
        return sl_usage_export_main(argc - 1, argv + 1, stdout, stderr);
    char err[1024] = "";
    enum sl_cli_action action;
    struct sl_config *cfg = sl_config_new();
    if (sl_config_from_args(cfg, argc, argv, &action, err, sizeof err) != SL_OK) {
        fprintf(stderr, "sluice: %s\n", err);
        sl_config_unref(cfg);
        return 2;
    }
    if (action == SL_CLI_HELP) {
        sl_config_usage(stdout);
        sl_config_unref(cfg);
        return 0;
    }
    if (action == SL_CLI_VERSION) {
        printf("sluice %s\n", SL_VERSION);
        sl_config_unref(cfg);
        return 0;
    }
    if (action == SL_CLI_CHECK) {
        int st = check_start(cfg, err, sizeof err);
        sl_config_unref(cfg);
        if (st != SL_OK) {
            fprintf(stderr, "sluice: %s\n", err);
            return 2;
        }
        printf("sluice: configuration is valid: the server can start with it\n");
        return 0;
    }
    sl_log_set_level(level_of(sl_config_log_level(cfg)));
    evthread_use_pthreads();
    const struct sl_config_http *hc = sl_config_http(cfg);
    const struct sl_config_engine *ec = sl_config_engine(cfg);
    raise_fd_limit(hc);

    /* Signals are taken by sigwait() here; every thread created later inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    struct sl_http_server *http = NULL;
    struct sl_api *api = sl_api_new(cfg);
    struct sl_usage_journal *journal = NULL;
    struct sl_engine *engines[SL_MODELS_MAX]; /* ec->models: each its workers and schedulers */
    int n_engines = 0;
#ifdef SL_FAULT_INJECTION
    /* tests/integration's sluice-fault: forward fails where SLUICE_FAULT_FORWARD says. */
    const struct sl_backend_ops *cpu_ops = &sl_fault_backend_ops;
#else
    const struct sl_backend_ops *cpu_ops = NULL;
#endif

    /* Usage from before the restart, before anything new is added to it. */
    const char *state_dir = sl_config_metering(cfg)->state_dir;
    if (state_dir) {
        if (sl_usage_journal_open(state_dir, sl_api_ledger(api), &journal, err, sizeof err) !=
            SL_OK) {
            fprintf(stderr, "sluice: %s\n", err);
            goto out;
        }
        struct sl_usage u;
        sl_usage_ledger_sum(sl_api_ledger(api), NULL, INT64_MIN, INT64_MAX, &u);
        sl_log(SL_LOG_INFO, "usage: %s/usage.jsonl: %lld requests on record", state_dir,
               (long long)u.requests);
        sl_api_set_journal(api, journal);
    }

    const char *isa;
    if (sl_worker_set_cpu_isa(ec->cpu_isa, &isa, err, sizeof err) != SL_OK) {
        fprintf(stderr, "sluice: %s\n", err);
        goto out;
    }
    sl_log(SL_LOG_INFO, "CPU kernels: %s%s", isa,
           strcmp(ec->cpu_isa, "auto") == 0 ? " (the best this CPU has)" : " (cpu_isa)");
    for (int i = 0; i < ec->n_models; i++, n_engines++)
        if (sl_engine_start(cfg, i, cpu_ops, &engines[i], err, sizeof err) != SL_OK) {
            fprintf(stderr, "sluice: %s\n", err);
            goto out;
        }
    /* The first model keeps the name the configuration gives it, or its own id. */
    for (int i = 0; i < n_engines; i++) {
        const struct sl_engine *e = engines[i];
        const char *name = sl_engine_name(e);
        if (sl_api_add_model(api, i > 0 ? name : NULL, sl_engine_model(e), sl_engine_sched(e, 0),
                             err, sizeof err) != SL_OK) {
            fprintf(stderr, "sluice: %s\n", err);
            goto out;
        }
        for (int r = 1; r < sl_engine_replicas(e); r++)
            if (sl_api_add_replica(api, name, sl_engine_sched(e, r), err, sizeof err) != SL_OK) {
                fprintf(stderr, "sluice: %s\n", err);
                goto out;
            }
    }
    if (sl_http_server_new(cfg, sl_api_handler(api), &http, err, sizeof err) != SL_OK) {
        fprintf(stderr, "sluice: %s\n", err);
        goto out;
    }
    sl_api_set_server(api, http);
    int st = sl_http_server_start(http);
    if (st != SL_OK) {
        fprintf(stderr, "sluice: cannot start I/O threads: %s\n", sl_status_str(st));
        goto out;
    }
    sl_log(SL_LOG_INFO, "listening on http://%s%s%s:%d", strchr(hc->listen_host, ':') ? "[" : "",
           hc->listen_host, strchr(hc->listen_host, ':') ? "]" : "", sl_http_server_port(http));
    if (hc->tls.cert) {
        const char *h = hc->tls.listen_host;
        sl_log(SL_LOG_INFO, "listening on https://%s%s%s:%d", strchr(h, ':') ? "[" : "", h,
               strchr(h, ':') ? "]" : "", sl_http_server_tls_port(http));
    }

    struct sl_fleet_addr fa;
    if (sl_config_fleet(cfg)->url &&
        sl_fleet_addr_parse(sl_config_fleet(cfg)->url, &fa, err, sizeof err) == SL_OK)
        sl_log(SL_LOG_INFO,
               "fleet: tenant and tier budgets are shared through redis %s:%d/%d (key prefix "
               "\"%s\"); queue caps and the SLO guard stay this replica's",
               fa.host, fa.port, fa.db, sl_config_fleet(cfg)->key_prefix);

    int sig = 0;
    while (sigwait(&sigs, &sig) == 0 && sig == SIGHUP)
        reload(http, argc, argv);
    /* Drain: requests in flight finish (within drain_timeout_ms), new ones are turned away. */
    sl_log(SL_LOG_INFO, "%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    sl_http_server_drain(http, -1);
    rc = 0;

out:
    /* Order matters: I/O threads stop (cancelling their requests) before the scheduler, and the
     * outboxes the scheduler posts to are freed only after it has stopped. */
    if (http)
        sl_http_server_stop(http);
    for (int i = 0; i < n_engines; i++)
        sl_engine_free(engines[i]);
    sl_http_server_free(http);
    sl_usage_journal_close(journal); /* after the I/O threads wrote their last records */
    sl_api_free(api);
    sl_config_unref(cfg);
    return rc;
}
