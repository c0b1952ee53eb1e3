/* The further models of "models": each loaded with its own worker and scheduler, as main.c does
 * for the first, so that a tier's "model:NAME" step sends a request to a model that really is
 * cheaper to run. */
#include <sluice/config.h>
#include <sluice/sched.h>
#include <sluice/server.h>
#include <sluice/worker.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The KV pool of one model: enough blocks for max_seqs full contexts, capped by kv_cache_mib or,
 * when set, kv_cache_fraction of the memory available now (on a CUDA device: its free memory less
 * what the weights and activations will take). Each model has a pool of its own. */
static int kv_blocks(const struct sl_config_engine *ec, const struct sl_model *m,
                     const struct sl_worker_device *dev, char *err, size_t errlen)
{
    const struct sl_model_config *mc = sl_model_config(m);
    long per_seq = (mc->seq_len + ec->block_size - 1) / ec->block_size;
    long want = per_seq * ec->max_seqs;
    size_t block_bytes = dev->ops->kv_block_bytes(m, ec->block_size, ec->kv_dtype);
    size_t cap_bytes = (size_t)ec->kv_cache_mib << 20;
    const char *what = "\"kv_cache_mib\"";
    if (ec->kv_cache_fraction > 0) {
        size_t avail = dev->index >= 0
                           ? sl_worker_device_kv_room(dev, m, ec->max_batch_tokens, ec->max_seqs)
                           : mem_available();
        if (avail == 0 && dev->index < 0) {
            snprintf(err, errlen,
                     "\"kv_cache_fraction\": available memory is unknown "
                     "(no MemAvailable in /proc/meminfo); set \"kv_cache_mib\"");
            return -1;
        }
        cap_bytes = (size_t)((double)avail * ec->kv_cache_fraction);
        what = "\"kv_cache_fraction\"";
    }
    long cap = (long)(cap_bytes / block_bytes);
    if (cap < per_seq) {
        snprintf(err, errlen,
                 "%s allows %.1f MiB: %ld blocks of %d tokens, fewer than one full context of %d "
                 "tokens needs (%ld)",
                 what, (double)cap_bytes / (1 << 20), cap, ec->block_size, mc->seq_len, per_seq);
        return -1;
    }
    return (int)(want < cap ? want : cap);
}

struct sl_engine {
    const char *name;       /* the configuration's name, or the model's own id */
    struct sl_model *model; /* shared by the replicas */
    int n_replicas;
    struct sl_worker *worker[SL_REPLICAS_MAX];
    struct sl_sched *sched[SL_REPLICAS_MAX];
    char device[SL_REPLICAS_MAX][16]; /* "cpu" or "cuda:N" */
};

/* Starts replica r of e on the device spec names: its worker (with its own KV pool) and its
 * scheduler. */
static int replica_start(const struct sl_config *cfg, const struct sl_config_model *cm,
                         const char *spec, const struct sl_backend_ops *cpu_ops,
                         struct sl_engine *e, int r, char *err, size_t errlen)
{
    const struct sl_config_engine *ec = sl_config_engine(cfg);
    struct sl_worker_device dev;
    int st = sl_worker_device_select(spec, &dev, err, errlen);
    if (st != SL_OK)
        return st;
    if (dev.index < 0 && cpu_ops)
        dev.ops = cpu_ops;
    if (dev.index >= 0)
        snprintf(e->device[r], sizeof e->device[r], "cuda:%d", dev.index);
    else
        snprintf(e->device[r], sizeof e->device[r], "cpu");
    int n_blocks = kv_blocks(ec, e->model, &dev, err, errlen);
    if (n_blocks < 0)
        return SL_EINVAL;
    struct sl_backend_opts bo = {
        .n_kv_blocks = n_blocks,
        .block_size = ec->block_size,
        .max_batch_tokens = ec->max_batch_tokens,
        .max_seqs = ec->max_seqs,
        .threads = cm->threads >= 0 ? cm->threads : ec->threads,
        .no_pin = !ec->pin_threads,
        .device = dev.index,
        .kv_dtype = ec->kv_dtype,
        .float_activations = !ec->cpu_int8_activations,
    };
    if ((st = sl_worker_new(e->model, dev.ops, &bo, &e->worker[r])) != SL_OK) {
        snprintf(err, errlen, "worker on %s: %s", e->device[r], sl_status_str(st));
        return st;
    }
    const struct sl_model_config *mc = sl_model_config(e->model);
    struct sl_sched_tier tiers[SL_SCHED_MAX_TIERS];
    struct sl_sched_limits lim = {
        .vocab = mc->vocab_size,
        .max_ctx = mc->seq_len,
        .max_seqs = ec->max_seqs,
        .max_batch_tokens = ec->max_batch_tokens,
        .n_blocks = n_blocks,
        .block_size = ec->block_size,
        .tiers = tiers,
        .n_tiers = sl_config_sched_tiers(cfg, tiers, SL_SCHED_MAX_TIERS),
    };
    if ((st = sl_sched_new(e->worker[r], &lim, &e->sched[r])) != SL_OK) {
        snprintf(err, errlen, "scheduler on %s: %s", e->device[r], sl_status_str(st));
        return st;
    }
    sl_log(SL_LOG_INFO, "model %s on %s (threads %d): KV %d blocks of %d (%.1f MiB%s)", e->name,
           dev.name, bo.threads, n_blocks, ec->block_size,
           (double)sl_worker_kv_bytes(e->worker[r]) / (1 << 20),
           dev.index < 0 && ec->kv_dtype == SL_KV_F16 ? ", f16" : "");
    return SL_OK;
}

enum sl_status sl_engine_start(const struct sl_config *cfg, int idx,
                               const struct sl_backend_ops *cpu_ops, struct sl_engine **out,
                               char *err, size_t errlen)
{
    *out = NULL;
    uint64_t t0 = sl_clock_ns();
    const struct sl_config_engine *ec = sl_config_engine(cfg);
    if (idx < 0 || idx >= ec->n_models) {
        snprintf(err, errlen, "models[%d]: no such model", idx);
        return SL_EINVAL;
    }
    struct sl_engine *e = sl_xcalloc(1, sizeof *e);
    const struct sl_config_model *cm = &ec->models[idx];
    /* Its own device, else one replica per entry of "devices", else "device". */
    const char *const *specs = (const char *const *)&cm->device;
    int n = 1;
    if (!cm->device && ec->n_devices > 0) {
        specs = (const char *const *)ec->devices;
        n = ec->n_devices;
    } else if (!cm->device) {
        specs = (const char *const *)&ec->device;
    }
    char why[512] = "";
    int st = sl_model_load(cm->spec, cm->tokenizer, &e->model, why, sizeof why);
    if (st != SL_OK) {
        snprintf(err, errlen, "models[%d] (%s): %s", idx, cm->name ? cm->name : cm->spec, why);
        free(e);
        return st;
    }
    e->name = cm->name ? cm->name : sl_model_id(e->model);
    for (int r = 0; r < n; r++, e->n_replicas++)
        if ((st = replica_start(cfg, cm, specs[r], cpu_ops, e, r, why, sizeof why)) != SL_OK) {
            snprintf(err, errlen, "models[%d] (%s): %s", idx, e->name, why);
            e->n_replicas++; /* what replica_start made is freed with the rest */
            sl_engine_free(e);
            return st;
        }
    const struct sl_model_config *mc = sl_model_config(e->model);
    sl_log(SL_LOG_INFO,
           "model %s (%s): dim %d, %d layers, %d heads (%d kv), vocab %d, context %d; %d "
           "worker%s; loaded in %.0f ms",
           e->name, sl_model_id(e->model), mc->dim, mc->n_layers, mc->n_heads, mc->n_kv_heads,
           mc->vocab_size, mc->seq_len, n, n == 1 ? "" : "s", (double)(sl_clock_ns() - t0) / 1e6);
    *out = e;
    return SL_OK;
}

const char *sl_engine_name(const struct sl_engine *e)
{
    return e->name;
}

const struct sl_model *sl_engine_model(const struct sl_engine *e)
{
    return e->model;
}

int sl_engine_replicas(const struct sl_engine *e)
{
    return e->n_replicas;
}

struct sl_sched *sl_engine_sched(const struct sl_engine *e, int r)
{
    return r >= 0 && r < e->n_replicas ? e->sched[r] : NULL;
}

void sl_engine_free(struct sl_engine *e)
{
    if (!e)
        return;
    for (int r = 0; r < e->n_replicas; r++) {
        sl_sched_free(e->sched[r]);
        sl_worker_free(e->worker[r]);
    }
    sl_model_free(e->model);
    memset(e, 0, sizeof *e);
    free(e);
}
