/* The further models of "models": each loaded with its own worker and scheduler, as main.c does
 * for the first, so that a tier's "model:NAME" step sends a request to a model that really is
 * cheaper to run. */
#include "gateway_impl.h"

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

/* The KV pool as main.c sizes the first model's: max_seqs full contexts, capped by kv_cache_mib
 * or kv_cache_fraction (each model has a pool of its own). */
static int kv_blocks(const struct sl_config *cfg, const struct sl_model *m, char *err,
                     size_t errlen)
{
    const struct sl_model_config *mc = sl_model_config(m);
    long per_seq = (mc->seq_len + cfg->block_size - 1) / cfg->block_size;
    long want = per_seq * cfg->max_seqs;
    size_t block_bytes = sl_model_kv_block_bytes(m, cfg->block_size);
    size_t cap_bytes = (size_t)cfg->kv_cache_mib << 20;
    if (cfg->kv_cache_fraction > 0) {
        size_t avail = mem_available();
        if (avail == 0) {
            snprintf(err, errlen, "\"kv_cache_fraction\": available memory is unknown");
            return -1;
        }
        cap_bytes = (size_t)((double)avail * cfg->kv_cache_fraction);
    }
    long cap = (long)(cap_bytes / block_bytes);
    if (cap < per_seq) {
        snprintf(err, errlen, "the KV cap allows %ld blocks of %d tokens, fewer than one context",
                 cap, cfg->block_size);
        return -1;
    }
    return (int)(want < cap ? want : cap);
}

int sl_engine_start(const struct sl_config *cfg, int idx, struct sl_engine *e, char *err,
                    size_t errlen)
{
    memset(e, 0, sizeof *e);
    if (idx < 0 || idx >= cfg->n_models) {
        snprintf(err, errlen, "models[%d]: no such model", idx);
        return SL_EINVAL;
    }
    const struct sl_config_model *cm = &cfg->models[idx];
    char why[512] = "";
    int st = sl_model_load(cm->spec, cm->tokenizer, &e->model, why, sizeof why);
    if (st != SL_OK) {
        snprintf(err, errlen, "models[%d] (%s): %s", idx, cm->name ? cm->name : cm->spec, why);
        return st;
    }
    e->name = cm->name ? cm->name : sl_model_id(e->model);
    int n_blocks = kv_blocks(cfg, e->model, why, sizeof why);
    if (n_blocks < 0) {
        snprintf(err, errlen, "models[%d] (%s): %s", idx, e->name, why);
        sl_engine_stop(e);
        return SL_EINVAL;
    }
    struct sl_backend_opts bo = {
        .n_kv_blocks = n_blocks,
        .block_size = cfg->block_size,
        .max_batch_tokens = cfg->max_batch_tokens,
        .max_seqs = cfg->max_seqs,
        .threads = cm->threads >= 0 ? cm->threads : cfg->threads,
    };
    if ((st = sl_worker_new(e->model, &sl_cpu_backend_ops, &bo, &e->worker)) != SL_OK) {
        snprintf(err, errlen, "models[%d] (%s): worker: %s", idx, e->name, sl_status_str(st));
        sl_engine_stop(e);
        return st;
    }
    const struct sl_model_config *mc = sl_model_config(e->model);
    struct sl_sched_tier tiers[SL_SCHED_MAX_TIERS];
    struct sl_sched_limits lim = {
        .vocab = mc->vocab_size,
        .max_ctx = mc->seq_len,
        .max_seqs = cfg->max_seqs,
        .max_batch_tokens = cfg->max_batch_tokens,
        .n_blocks = n_blocks,
        .block_size = cfg->block_size,
        .tiers = tiers,
        .n_tiers = sl_config_sched_tiers(cfg, tiers, SL_SCHED_MAX_TIERS),
    };
    if ((st = sl_sched_new(e->worker, &lim, &e->sched)) != SL_OK) {
        snprintf(err, errlen, "models[%d] (%s): scheduler: %s", idx, e->name, sl_status_str(st));
        sl_engine_stop(e);
        return st;
    }
    sl_log(SL_LOG_INFO,
           "model %s (%s): dim %d, %d layers, vocab %d, context %d; KV %d blocks (%.1f MiB), "
           "%d threads",
           e->name, sl_model_id(e->model), mc->dim, mc->n_layers, mc->vocab_size, mc->seq_len,
           n_blocks, (double)sl_worker_kv_bytes(e->worker) / (1 << 20), bo.threads);
    return SL_OK;
}

void sl_engine_stop(struct sl_engine *e)
{
    sl_sched_free(e->sched);
    sl_worker_free(e->worker);
    sl_model_free(e->model);
    memset(e, 0, sizeof *e);
}
