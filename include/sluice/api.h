/* sluice — api: what sluice's HTTP routes mean (gateway/api/).
 *
 * OpenAI's completions, chat completions and models, Anthropic's messages, vLLM's tokenize and
 * detokenize, and the operator's routes (/metrics, /healthz, /readyz, /admin/): a route table
 * and its handlers, the request and response codecs, SSE and chat templates. It is the handler
 * (struct sl_http_handler) of the HTTP server; it decides nothing about admission itself
 * (admission/ does) and speaks to the engines only through their schedulers.
 */
#ifndef SLUICE_API_H
#define SLUICE_API_H

#include <sluice/common.h>
#include <sluice/config.h>
#include <sluice/http.h>
#include <sluice/sched.h>
#include <sluice/worker.h>

struct sl_api;

/* The API of a server whose configuration is cfg (a reference is not taken: the server holds
 * it): admission's state is set up for cfg. io_threads metrics shards. */
struct sl_api *sl_api_new(struct sl_config *cfg);
void sl_api_free(struct sl_api *a);
/* Serves a model: requests whose "model" is `name` run on `sched` (NULL: no engine, for tests
 * of the front end alone), and /v1/models lists it. The first model added is the default; when
 * models[0] of cfg (sl_config_engine) has no name, the first is named by the model's own id and
 * answers to its configured spec too. The model and scheduler must outlive the API. SL_EINVAL (err
 * says why) when the name is taken, SL_MODELS_MAX are served, or the server has started. */
enum sl_status sl_api_add_model(struct sl_api *a, const char *name, const struct sl_model *model,
                                struct sl_sched *sched, char *err, size_t errlen);
/* Serves model `name` on one more scheduler: a replica of the same weights on another device.
 * Each completion goes to the replica with the fewest requests in flight. At most
 * SL_REPLICAS_MAX per model, before the server starts. */
enum sl_status sl_api_add_replica(struct sl_api *a, const char *name, struct sl_sched *sched,
                                  char *err, size_t errlen);
/* The handler to give sl_http_server_new. */
const struct sl_http_handler *sl_api_handler(struct sl_api *a);
/* The server it answers for (readiness says when it drains). */
void sl_api_set_server(struct sl_api *a, struct sl_http_server *s);
/* The ledger every finished request's usage is added to (the API's; /admin/usage and /v1/usage
 * read it). A journal opened on it before the server starts (sl_usage_journal_open) is handed
 * over with sl_api_set_journal: the I/O threads append to it, before their responses reach
 * the sockets. The caller closes it after the server has stopped. */
struct sl_usage_ledger *sl_api_ledger(struct sl_api *a);
void sl_api_set_journal(struct sl_api *a, struct sl_usage_journal *j);

#endif
