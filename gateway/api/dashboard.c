/* GET /dashboard: the operator's page, its script and its style, compiled into the binary
 * (gateway/api/dashboard/, made into byte arrays by embed.py at build time), so the page needs
 * nothing from anywhere else. No key opens them: the page itself asks for the admin key and
 * sends it to /admin/stats, whose guard checks it.
 *
 * The script and the style are files of their own so that the page's Content-Security-Policy
 * allows no inline script or style at all: what a tenant name could smuggle into the page (were
 * it ever inserted as markup) would not run.
 */
#include "api_impl.h"

extern const unsigned char sl_api_dashboard_index_html[];
extern const size_t sl_api_dashboard_index_html_len;
extern const unsigned char sl_api_dashboard_app_js[];
extern const size_t sl_api_dashboard_app_js_len;
extern const unsigned char sl_api_dashboard_app_css[];
extern const size_t sl_api_dashboard_app_css_len;

#define SECURITY_HEADERS                                                                           \
    "Content-Security-Policy: default-src 'none'; script-src 'self'; style-src 'self'; "           \
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "                    \
    "frame-ancestors 'none'\r\n"                                                                   \
    "X-Content-Type-Options: nosniff\r\n"                                                          \
    "X-Frame-Options: DENY\r\n"                                                                    \
    "Referrer-Policy: no-referrer\r\n"                                                             \
    "Cache-Control: no-cache\r\n"

void api_serve_dashboard(struct api_exchange *a)
{
    const struct sl_exchange *x = a->x;
    if (sl_exchange_path_is(x, "/dashboard/app.js"))
        api_send(a, 200, "text/javascript; charset=utf-8", SECURITY_HEADERS,
                 (const char *)sl_api_dashboard_app_js, sl_api_dashboard_app_js_len);
    else if (sl_exchange_path_is(x, "/dashboard/app.css"))
        api_send(a, 200, "text/css; charset=utf-8", SECURITY_HEADERS,
                 (const char *)sl_api_dashboard_app_css, sl_api_dashboard_app_css_len);
    else
        api_send(a, 200, "text/html; charset=utf-8", SECURITY_HEADERS,
                 (const char *)sl_api_dashboard_index_html, sl_api_dashboard_index_html_len);
}
