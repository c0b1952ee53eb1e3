/* The real models of ../shared/models (SL_MODELS_DIR, set by tests/meson.build) in the tests
 * that need them, whatever their module. */
#ifndef SLUICE_TESTS_MODELS_H
#define SLUICE_TESTS_MODELS_H

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* True when SLUICE_REQUIRE_MODELS=1 (CI sets it: it always has ../shared beside the checkout). */
static inline bool models_required(void)
{
    const char *v = getenv("SLUICE_REQUIRE_MODELS");
    return v && strcmp(v, "1") == 0;
}

/* Ends a test whose real models are not there: skipped with the message, or failed with it when
 * SLUICE_REQUIRE_MODELS=1, so that a green run then always includes the forward-pass goldens.
 * `fmt` is a string literal with at least one argument. */
#define MODELS_MISSING(fmt, ...)                                                                   \
    do {                                                                                           \
        if (models_required())                                                                     \
            cr_assert_fail("SLUICE_REQUIRE_MODELS=1, and " fmt, __VA_ARGS__);                      \
        cr_skip_test(fmt, __VA_ARGS__);                                                            \
    } while (0)

#endif
