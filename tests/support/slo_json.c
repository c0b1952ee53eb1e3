#include "slo_json.h"

#include <string.h>

/* The member of array `list` whose `key` is the string `name`, or NULL. */
static json_t *named(json_t *list, const char *key, const char *name)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *v = json_string_value(json_object_get(json_array_get(list, i), key));
        if (v && strcmp(v, name) == 0)
            return json_array_get(list, i);
    }
    return NULL;
}

json_t *slo_json_window(json_t *slo, const char *tier, const char *tenant, const char *w)
{
    json_t *t = named(json_object_get(slo, "tiers"), "tier", tier);
    json_t *n = t ? named(json_object_get(t, "tenants"), "tenant", tenant) : NULL;
    return n ? json_object_get(n, w) : NULL;
}
