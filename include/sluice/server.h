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
 * configuration's tiers and limits with the scheduler under a virtual clock (server/simulate.c
 * documents the arguments and the trace format) and prints the report to out, errors to err.
 * Returns the process exit status: 0, 1 when the simulation failed, 2 for bad arguments, a bad
 * configuration or a bad trace line (named by its line number). */
int sl_simulate_main(int argc, char **argv, FILE *out, FILE *err);
/* `sluice usage export ARGS` (argv[0] is "usage"): the usage journal of a state_dir as CSV or
 * JSON for chargeback (server/usage_export.c documents the arguments). Returns the exit status:
 * 0, 1 when the journal cannot be read, 2 for bad arguments. */
int sl_usage_export_main(int argc, char **argv, FILE *out, FILE *err);

/* ---------------------------------------------------------------------------------------------
 * Served models (server/engine.c)
 */

/* One served model: its weights, and a worker and a scheduler per device, owned together. */
struct sl_engine;

/* Loads sl_config_engine(cfg)->models[idx] once and starts a worker on each of its devices
 * (models[idx].device, else each of "devices", else "device": sl_worker_device_select), each with
 * its own KV pool (max_seqs contexts within kv_cache_mib or kv_cache_fraction) and its own
 * scheduler with cfg's tiers and limits. cpu_ops, when not NULL, replaces the CPU backend (the
 * fault-injection test build); NULL in sluice. On failure e is empty and err names the model. Main
 * thread, at start. */
enum sl_status sl_engine_start(const struct sl_config *cfg, int idx,
                               const struct sl_backend_ops *cpu_ops, struct sl_engine **out,
                               char *err, size_t errlen);
/* Stops the schedulers (their requests finish CANCELLED), frees workers and model. Call after
 * the HTTP server has stopped and before it is freed (the schedulers post to its outboxes). */
void sl_engine_free(struct sl_engine *e);
/* The configuration's name for it (pointing into the configuration), or the model's own id. */
const char *sl_engine_name(const struct sl_engine *e);
const struct sl_model *sl_engine_model(const struct sl_engine *e);
/* Its replicas (one per device: models[i].device, else "devices", else "device") and the
 * scheduler of replica r. */
int sl_engine_replicas(const struct sl_engine *e);
struct sl_sched *sl_engine_sched(const struct sl_engine *e, int r);

#endif
