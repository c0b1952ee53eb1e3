/* sluice — config: the layout of struct sl_config, private to config/ and its tests (everyone
 * else reads its sections through include/sluice/config.h's accessors). */
#ifndef SLUICE_CONFIG_IMPL_H
#define SLUICE_CONFIG_IMPL_H

#include <sluice/config.h>

struct sl_config {
    struct sl_config_http http;
    struct sl_config_engine engine;
    struct sl_config_api api;
    struct sl_config_fleet fleet;
    struct sl_config_metering metering;
    /* Tenants, tiers, classification, keys and admission control (reloadable). The server that
     * adopts this configuration (sl_api_new, or a reload) gives it its admission state
     * (sl_admit_adopt) before any request sees it. */
    struct sl_tenancy tenancy;
    /* The single-model keys: models[0] stays in step with them (models_sync). */
    char *model;             /* "synthetic", "synthetic:NAME" or a llama2.c .bin path */
    char *tokenizer;         /* llama2.c tokenizer.bin path, or NULL */
    char *served_model_name; /* the id of "model" (vLLM's --served-model-name), or NULL */
    char *log_level;         /* "debug", "info", "warn", "error" */
};

#endif
