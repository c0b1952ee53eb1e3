/* sluice — server: the composition root (server/). `main` builds a configuration, starts an
 * engine per served model (its weights, workers and schedulers), the API over them and the HTTP
 * server that hands the API its requests; SIGHUP reloads, SIGTERM drains. `sluice simulate`
 * replays a trace against a configuration instead.
 */
#ifndef SLUICE_SERVER_H
#define SLUICE_SERVER_H

#include <sluice/common.h>
#include <sluice/config.h>
#include <sluice/sched.h>
#include <sluice/worker.h>

#include <stdio.h>

/* `sluice simulate ARGS` (argv[0] is "simulate"): replays a trace of requests against a
 * configuration's tiers and limits with the scheduler under a virtual clock (gateway/simulate.c
 * documents the arguments and the trace format) and prints the report to out, errors to err.
 * Returns the process exit status: 0, 1 when the simulation failed, 2 for bad arguments, a bad
 * configuration or a bad trace line (named by its line number). */
int sl_simulate_main(int argc, char **argv, FILE *out, FILE *err);

/* ---------------------------------------------------------------------------------------------
 * Served models (gateway/engine.c)
 */

/* One served model: its weights, worker and scheduler, owned together. */
struct sl_engine {
    const char *name; /* the configuration's name for it (points into the configuration), or the
                         model's own id */
    struct sl_model *model; /* shared by the replicas */
    int n_replicas;         /* one per device: models[i].device, else "devices", else "device" */
    struct sl_worker *worker[SL_REPLICAS_MAX];
    struct sl_sched *sched[SL_REPLICAS_MAX];
    char device[SL_REPLICAS_MAX][16]; /* "cpu" or "cuda:N" */
};

/* Loads cfg->models[idx] once and starts a worker on each of its devices (models[idx].device,
 * else each of "devices", else "device": sl_worker_device_select), each with its own KV pool
 * (max_seqs contexts within kv_cache_mib or kv_cache_fraction) and its own scheduler with cfg's
 * tiers and limits. cpu_ops, when not NULL,
 * replaces the CPU backend (the fault-injection test build); NULL in sluice. On failure e is
 * empty and err names the model. Main thread, at start. */
int sl_engine_start(const struct sl_config *cfg, int idx, const struct sl_backend_ops *cpu_ops,
                    struct sl_engine *e, char *err, size_t errlen);
/* Stops the scheduler (its requests finish CANCELLED), frees worker and model. Call after the
 * HTTP server has stopped and before it is freed (the scheduler posts to its outboxes). */
void sl_engine_stop(struct sl_engine *e);

#endif
