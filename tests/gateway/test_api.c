/* The API's route table (gateway/api/routes.c): exact paths and prefixes, the key each needs
 * and the label metrics count it under. */
#include "api_impl.h"

#include <criterion/criterion.h>
#include <string.h>

/* An exchange with just a path, parsed. */
static struct sl_exchange at(const char *path)
{
    return (struct sl_exchange){.path = {path, strlen(path)}, .parsed = true};
}

Test(gateway, route_table_finds_exact_paths_and_prefixes_when_looked_up)
{
    static const struct {
        const char *path, *label;
        int kind; /* -1: no route */
    } cases[] = {
        {"/v1/chat/completions", "/v1/chat/completions", API_OPENAI},
        {"/v1/messages", "/v1/messages", API_ANTHROPIC},
        {"/v1/models", "/v1/models", API_OPENAI},
        {"/v1/models/", SL_METRICS_OTHER, -1},
        {"/v1/models/x", "/v1/models/{id}", API_OPENAI},
        {"/admin/config", "/admin/config", API_OPENAI},
        {"/admin/other", SL_METRICS_OTHER, API_OPENAI},
        {"/admin/", SL_METRICS_OTHER, API_OPENAI},
        {"/v1/messagesx", SL_METRICS_OTHER, -1},
        {"/", SL_METRICS_OTHER, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sl_exchange x = at(cases[i].path);
        const struct api_route *r = api_route_find(&x);
        if (cases[i].kind < 0) {
            cr_assert_null(r, "%s", cases[i].path);
        } else {
            cr_assert_not_null(r, "%s", cases[i].path);
            cr_assert_eq((int)r->kind, cases[i].kind, "%s", cases[i].path);
        }
        struct api_exchange a = {.x = &x, .route = r};
        cr_assert_str_eq(api_route_label(&a), cases[i].label, "%s", cases[i].path);
    }
    struct sl_exchange x = at("/admin/other");
    cr_assert_eq(api_route_find(&x)->guard, GUARD_ADMIN, "unknown admin URLs need the admin key");
    x = at("/healthz");
    cr_assert_eq(api_route_find(&x)->guard, GUARD_NONE);
}
