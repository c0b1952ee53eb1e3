/* Reading GET /admin/slo's body in tests (tests/gateway's of the renderer, tests/integration's of
 * the server): one tenant's window of one tier. */
#ifndef SLUICE_TEST_SLO_JSON_H
#define SLUICE_TEST_SLO_JSON_H

#include <jansson.h>

/* The window w ("1m", "5m", "60m") of tenant in tier, borrowed from slo; NULL when the tier or the
 * tenant is not there. */
json_t *slo_json_window(json_t *slo, const char *tier, const char *tenant, const char *w);

#endif
