/* Fuzz target: the configuration loader (sl_config_load_file, config/config.c, with the tenants,
 * tiers and classify sections of admission/tenancy_config.c), given the input as the file through
 * an in-memory file. A file is refused with a message or loaded; a loaded one is validated, turned
 * into the scheduler's tier table and into /admin/config's JSON, where every key hash must read
 * "<redacted>"; no two tenants may share a key hash. */
#include "gateway_impl.h"

#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    sl_log_set_level(SL_LOG_ERROR);
    return 0;
}

/* A key hash where /admin/config shows one must be "<redacted>" (or null without one). */
static bool redacted(json_t *v, bool present)
{
    return present ? json_is_string(v) && strcmp(json_string_value(v), "<redacted>") == 0
                   : json_is_null(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64], err[1024];
    int fd = fuzz_memfd(data, size, path, sizeof path);
    if (fd < 0)
        return 0;
    struct sl_config *c = sl_config_new();
    err[0] = '\0';
    int st = sl_config_load_file(c, path, err, sizeof err);
    close(fd);
    if (st != SL_OK) {
        fuzz_note("refused", err);
        fuzz_check(st < 0 && err[0] != '\0', "refused without a message (%d)", st);
        sl_config_unref(c);
        return 0;
    }
    fuzz_note("accepted", "");
    const struct sl_tenancy *ten = sl_config_tenancy(c);
    fuzz_check(ten->n_tiers >= 1 && ten->n_tiers <= SL_TIERS_MAX, "%d tiers", ten->n_tiers);
    if (sl_config_validate(c, err, sizeof err) == SL_OK) {
        struct sl_sched_tier tiers[SL_SCHED_MAX_TIERS];
        int n = sl_config_sched_tiers(c, tiers, SL_SCHED_MAX_TIERS);
        fuzz_check(n >= 1 && n <= SL_SCHED_MAX_TIERS, "%d scheduler tiers", n);
    }
    json_t *j = sl_config_to_json(c);
    char *text = json_dumps(j, JSON_COMPACT);
    fuzz_check(text != NULL, "/admin/config does not serialise");
    free(text);
    json_t *tenants = json_object_get(j, "tenants");
    fuzz_check(json_array_size(tenants) == (size_t)ten->n_tenants, "%zu tenants shown, %d loaded",
               json_array_size(tenants), ten->n_tenants);
    for (int i = 0; i < ten->n_tenants; i++) {
        json_t *shown = json_object_get(json_array_get(tenants, (size_t)i), "key_sha256");
        fuzz_check(redacted(shown, true), "tenant %d's hash is shown", i);
        const struct sl_tenant *t = &ten->tenants[i];
        fuzz_check(t->default_tier >= 0 && t->default_tier < ten->n_tiers, "default tier %d",
                   t->default_tier);
        for (int k = 0; k < i; k++)
            fuzz_check(memcmp(ten->tenants[k].key_sha256, t->key_sha256, 32) != 0,
                       "tenants %d and %d share a key", k, i);
    }
    fuzz_check(redacted(json_object_get(j, "admin_key_sha256"), ten->has_admin_key),
               "the admin hash is shown");
    json_decref(j);
    sl_config_unref(c);
    return 0;
}
