/* sluice: start-up, signals, orderly shutdown. The main thread only waits for a signal:
 * SIGHUP reloads the configuration, SIGTERM or SIGINT drains and exits. */
#include <sluice/gateway.h>

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

/* MemAvailable from /proc/meminfo in bytes, 0 when unknown. */
static size_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
            break;
    fclose(f);
    return (size_t)kib << 10;
}

/* KV pool: enough blocks for max_seqs full contexts, capped by kv_cache_mib or, when set,
 * kv_cache_fraction of the memory available now (on a CUDA device: its free memory less what the
 * weights and activations will take). */
static int kv_blocks(const struct sl_config *cfg, const struct sl_model *m,
                     const struct sl_worker_device *dev, char *err, size_t errlen)
{
    const struct sl_model_config *mc = sl_model_config(m);
    long per_seq = (mc->seq_len + cfg->block_size - 1) / cfg->block_size;
    long want = per_seq * cfg->max_seqs;
    size_t block_bytes = dev->ops->kv_block_bytes(m, cfg->block_size);
    size_t cap_bytes = (size_t)cfg->kv_cache_mib << 20;
    const char *what = "\"kv_cache_mib\"";
    if (cfg->kv_cache_fraction > 0) {
        size_t avail = dev->index >= 0
                           ? sl_worker_device_kv_room(dev, m, cfg->max_batch_tokens, cfg->max_seqs)
                           : mem_available();
        if (avail == 0 && dev->index < 0) {
            snprintf(err, errlen,
                     "\"kv_cache_fraction\": available memory is unknown "
                     "(no MemAvailable in /proc/meminfo); set \"kv_cache_mib\"");
            return -1;
        }
        cap_bytes = (size_t)((double)avail * cfg->kv_cache_fraction);
        what = "\"kv_cache_fraction\"";
    }
    long cap = (long)(cap_bytes / block_bytes);
    if (cap < per_seq) {
        snprintf(err, errlen,
                 "%s allows %.1f MiB: %ld blocks of %d tokens, fewer than one full context of %d "
                 "tokens needs (%ld)",
                 what, (double)cap_bytes / (1 << 20), cap, cfg->block_size, mc->seq_len, per_seq);
        return -1;
    }
    return (int)(want < cap ? want : cap);
}

/* SIGHUP: the configuration is read again from the same command line (the file, then the flags
 * over it) and handed to the server; a configuration that fails to load keeps the old one. */
static void reload(struct sl_http_server *http, struct sl_sched *sched, int argc, char **argv)
{
    char err[1024] = "";
    enum sl_cli_action action;
    struct sl_config *next = sl_config_new();
    int st = sl_config_from_args(next, argc, argv, &action, err, sizeof err);
    if (st == SL_OK)
        st = sl_http_server_reload(http, next, err, sizeof err);
    if (st == SL_OK) {
        struct sl_sched_tier tiers[SL_SCHED_MAX_TIERS];
        sl_sched_set_tiers(sched, tiers, sl_config_sched_tiers(next, tiers, SL_SCHED_MAX_TIERS));
        sl_log_set_level(level_of(next->log_level));
        sl_log(SL_LOG_INFO, "SIGHUP: configuration reloaded");
    } else {
        sl_log(SL_LOG_ERROR, "SIGHUP: configuration refused, the old one keeps serving: %s", err);
    }
    sl_config_unref(next);
}

/* Every connection is a descriptor: raise the soft limit to the hard one so that
 * max_connections, not EMFILE, is what refuses clients. */
static void raise_fd_limit(const struct sl_config *cfg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    rlim_t want = (rlim_t)cfg->max_connections + 64;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
        sl_log(SL_LOG_WARN,
               "open-file limit %llu is below max_connections (%d) plus what the server needs; "
               "accept will fail before max_connections is reached",
               (unsigned long long)rl.rlim_cur, cfg->max_connections);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "simulate") == 0)
        return sl_simulate_main(argc - 1, argv + 1, stdout, stderr);
    char err[1024] = "";
    enum sl_cli_action action;
    struct sl_config *cfg = sl_config_new();
    if (sl_config_from_args(cfg, argc, argv, &action, err, sizeof err) != SL_OK) {
        fprintf(stderr, "sluice: %s\n", err);
        sl_config_unref(cfg);
        return 2;
    }
    if (action == SL_CLI_HELP) {
        fputs(sl_config_usage(), stdout);
        sl_config_unref(cfg);
        return 0;
    }
    if (action == SL_CLI_VERSION) {
        printf("sluice %s\n", SL_VERSION);
        sl_config_unref(cfg);
        return 0;
    }
    if (action == SL_CLI_CHECK) {
        if (sl_http_tls_check(cfg, err, sizeof err) != SL_OK) {
            fprintf(stderr, "sluice: %s\n", err);
            sl_config_unref(cfg);
            return 2;
        }
        printf("sluice: configuration is valid\n");
        sl_config_unref(cfg);
        return 0;
    }
    sl_log_set_level(level_of(cfg->log_level));
    evthread_use_pthreads();
    raise_fd_limit(cfg);

    /* Signals are taken by sigwait() here; every thread created later inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    struct sl_model *model = NULL;
    struct sl_worker *worker = NULL;
    struct sl_sched *sched = NULL;
    struct sl_http_server *http = NULL;

    uint64_t t0 = sl_clock_ns();
    struct sl_worker_device dev;
    if (sl_worker_device_select(cfg->device, &dev, err, sizeof err) != SL_OK) {
        fprintf(stderr, "sluice: %s\n", err);
        goto out;
    }
    if (sl_model_load(cfg->model, cfg->tokenizer, &model, err, sizeof err) != SL_OK) {
        fprintf(stderr, "sluice: model: %s\n", err);
        goto out;
    }
    const struct sl_model_config *mc = sl_model_config(model);
    int n_blocks = kv_blocks(cfg, model, &dev, err, sizeof err);
    if (n_blocks < 0) {
        fprintf(stderr, "sluice: %s\n", err);
        goto out;
    }
    struct sl_backend_opts bo = {
        .n_kv_blocks = n_blocks,
        .block_size = cfg->block_size,
        .max_batch_tokens = cfg->max_batch_tokens,
        .max_seqs = cfg->max_seqs,
        .threads = cfg->threads,
        .device = dev.index,
    };
    int st = sl_worker_new(model, dev.ops, &bo, &worker);
    if (st != SL_OK) {
        fprintf(stderr, "sluice: worker: %s\n", sl_status_str(st));
        goto out;
    }
    struct sl_sched_limits lim = {
        .vocab = mc->vocab_size,
        .max_ctx = mc->seq_len,
        .max_seqs = cfg->max_seqs,
        .max_batch_tokens = cfg->max_batch_tokens,
        .n_blocks = n_blocks,
        .block_size = cfg->block_size,
    };
    struct sl_sched_tier tiers[SL_SCHED_MAX_TIERS];
    lim.tiers = tiers;
    lim.n_tiers = sl_config_sched_tiers(cfg, tiers, SL_SCHED_MAX_TIERS);
    if ((st = sl_sched_new(worker, &lim, &sched)) != SL_OK) {
        fprintf(stderr, "sluice: scheduler: %s\n", sl_status_str(st));
        goto out;
    }
    if (sl_http_server_new(cfg, model, sched, &http, err, sizeof err) != SL_OK) {
        fprintf(stderr, "sluice: %s\n", err);
        goto out;
    }
    if ((st = sl_http_server_start(http)) != SL_OK) {
        fprintf(stderr, "sluice: cannot start I/O threads: %s\n", sl_status_str(st));
        goto out;
    }
    sl_log(SL_LOG_INFO,
           "model %s: dim %d, %d layers, %d heads (%d kv), vocab %d, context %d; "
           "KV %d blocks of %d (%.1f MiB); loaded in %.0f ms",
           sl_model_id(model), mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->vocab_size,
           mc->seq_len, n_blocks, cfg->block_size, (double)sl_worker_kv_bytes(worker) / (1 << 20),
           (double)(sl_clock_ns() - t0) / 1e6);
    sl_log(SL_LOG_INFO, "listening on http://%s%s%s:%d", strchr(cfg->listen_host, ':') ? "[" : "",
           cfg->listen_host, strchr(cfg->listen_host, ':') ? "]" : "", sl_http_server_port(http));
    if (cfg->tls.cert) {
        const char *h = cfg->tls.listen_host;
        sl_log(SL_LOG_INFO, "listening on https://%s%s%s:%d", strchr(h, ':') ? "[" : "", h,
               strchr(h, ':') ? "]" : "", sl_http_server_tls_port(http));
    }

    int sig = 0;
    while (sigwait(&sigs, &sig) == 0 && sig == SIGHUP)
        reload(http, sched, argc, argv);
    /* Drain: requests in flight finish (within drain_timeout_ms), new ones are turned away. */
    sl_log(SL_LOG_INFO, "%s: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    sl_http_server_drain(http, -1);
    rc = 0;

out:
    /* Order matters: I/O threads stop (cancelling their requests) before the scheduler, and the
     * outboxes the scheduler posts to are freed only after it has stopped. */
    if (http)
        sl_http_server_stop(http);
    sl_sched_free(sched);
    sl_http_server_free(http);
    sl_worker_free(worker);
    sl_model_free(model);
    sl_config_unref(cfg);
    return rc;
}
