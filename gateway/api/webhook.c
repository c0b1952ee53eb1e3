/* The budget webhook: when a request takes its tenant past the budget's soft_pct (once a period,
 * admission says which request), a JSON body is POSTed to the configuration's budget_webhook
 * from the request's I/O thread, asynchronously (libevent's HTTP client and DNS resolver on the
 * thread's loop), and retried with backoff (1, 2, 4, 8 s) until a 2xx, at most five times.
 * Nothing a request waits for: the request goes on at once.
 *
 * https:// goes over OpenSSL (a bufferevent of libevent's), verifying the server's chain against
 * the default CA store and its name (or IP address) against the URL's host. With a fleet, each
 * replica that sees the crossing first claims it in Redis (sl_fleet_once), so the fleet sends one;
 * when Redis cannot say, the replica sends it anyway: a duplicate notice beats a lost one. */
#include "api_impl.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/http.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ATTEMPTS 5
#define TIMEOUT_S 10

struct api_webhook {
    struct api_thread *t;
    struct api_webhook *next; /* the thread's list, freed with it */
    char *host, *path;
    int port;
    bool tls;
    struct sl_str body;
    char tenant[SL_TENANT_NAME_MAX + 1];
    int attempt;
    bool done;
    struct evhttp_connection *conn; /* the attempt in flight */
    struct event *timer;            /* the next attempt, or the free after the last */
};

static void hook_free(struct api_webhook *h)
{
    struct api_webhook **p = &h->t->webhooks;
    while (*p != h)
        p = &(*p)->next;
    *p = h->next;
    if (h->conn)
        evhttp_connection_free(h->conn);
    event_free(h->timer);
    sl_str_dispose(&h->body);
    free(h->host);
    free(h->path);
    free(h);
}

void api_webhooks_free(struct api_thread *t)
{
    while (t->webhooks)
        hook_free(t->webhooks);
    if (t->dns)
        evdns_base_free(t->dns, 0);
    t->dns = NULL;
    SSL_CTX_free(t->webhook_tls);
    t->webhook_tls = NULL;
}

static void hook_send(struct api_webhook *h);

/* A connection is not freed inside its own callback: the timer does it, then sends again or
 * frees the hook. */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    struct api_webhook *h = arg;
    if (h->conn) {
        evhttp_connection_free(h->conn);
        h->conn = NULL;
    }
    if (h->done)
        hook_free(h);
    else
        hook_send(h);
}

static void later(struct api_webhook *h, int seconds)
{
    struct timeval tv = {seconds, 0};
    evtimer_add(h->timer, &tv);
}

static void on_answer(struct evhttp_request *req, void *arg)
{
    struct api_webhook *h = arg;
    int code = req ? evhttp_request_get_response_code(req) : 0;
    if (code == 0 && h->tls && h->conn) { /* say why TLS failed: a certificate, most often */
        struct bufferevent *bev = evhttp_connection_get_bufferevent(h->conn);
        unsigned long e = bev ? bufferevent_get_openssl_error(bev) : 0;
        if (e) {
            char why[256];
            ERR_error_string_n(e, why, sizeof why);
            sl_log(SL_LOG_WARN, "budget: webhook for tenant '%s': TLS: %s", h->tenant, why);
        }
    }
    if (code >= 200 && code < 300) {
        sl_log(SL_LOG_INFO, "budget: webhook for tenant '%s' answered %d", h->tenant, code);
        h->done = true;
        later(h, 0);
        return;
    }
    if (++h->attempt >= ATTEMPTS) {
        sl_log(SL_LOG_ERROR,
               "budget: webhook for tenant '%s' failed %d times (last: %s%d); "
               "given up",
               h->tenant, ATTEMPTS, code ? "HTTP " : "no answer ", code);
        h->done = true;
        later(h, 0);
        return;
    }
    int wait = 1 << (h->attempt - 1);
    sl_log(SL_LOG_WARN, "budget: webhook for tenant '%s': %s%d; again in %d s", h->tenant,
           code ? "HTTP " : "no answer ", code, wait);
    later(h, wait);
}

/* A connection to h's host over TLS that checks who answers, or NULL. */
static struct evhttp_connection *tls_connection(struct api_webhook *h)
{
    struct api_thread *t = h->t;
    if (!t->webhook_tls) {
        t->webhook_tls = SSL_CTX_new(TLS_client_method());
        if (!t->webhook_tls)
            return NULL;
        SSL_CTX_set_min_proto_version(t->webhook_tls, TLS1_2_VERSION);
        SSL_CTX_set_verify(t->webhook_tls, SSL_VERIFY_PEER, NULL);
        if (SSL_CTX_set_default_verify_paths(t->webhook_tls) != 1)
            sl_log(SL_LOG_WARN, "budget: webhook: no CA store found; https:// will fail");
    }
    SSL *ssl = SSL_new(t->webhook_tls);
    if (!ssl)
        return NULL;
    unsigned char ip[16];
    bool is_ip = inet_pton(AF_INET, h->host, ip) == 1 || inet_pton(AF_INET6, h->host, ip) == 1;
    X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
    int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, h->host) : SSL_set1_host(ssl, h->host);
    if (!is_ip)
        ok &= SSL_set_tlsext_host_name(ssl, h->host);
    struct bufferevent *bev =
        ok == 1 ? bufferevent_openssl_socket_new(t->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                 BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS)
                : NULL;
    if (!bev) {
        SSL_free(ssl);
        return NULL;
    }
    /* Many servers close without TLS's close_notify once their answer is complete. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    struct evhttp_connection *conn = evhttp_connection_base_bufferevent_new(
        t->base, t->dns, bev, h->host, (unsigned short)h->port);
    if (!conn)
        bufferevent_free(bev);
    return conn;
}

static void hook_send(struct api_webhook *h)
{
    struct api_thread *t = h->t;
    if (!t->dns)
        t->dns = evdns_base_new(t->base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
    h->conn = h->tls
                  ? tls_connection(h)
                  : evhttp_connection_base_new(t->base, t->dns, h->host, (unsigned short)h->port);
    struct evhttp_request *req = h->conn ? evhttp_request_new(on_answer, h) : NULL;
    if (!req) {
        on_answer(NULL, h);
        return;
    }
    evhttp_connection_set_timeout(h->conn, TIMEOUT_S);
    struct evkeyvalq *hd = evhttp_request_get_output_headers(req);
    evhttp_add_header(hd, "Host", h->host);
    evhttp_add_header(hd, "Content-Type", "application/json");
    evhttp_add_header(hd, "User-Agent", "sluice/" SL_VERSION);
    evbuffer_add(evhttp_request_get_output_buffer(req), h->body.p, h->body.len);
    if (evhttp_make_request(h->conn, req, EVHTTP_REQ_POST, h->path) != 0)
        on_answer(NULL, h); /* libevent freed req */
}

static void on_claim(void *arg, enum sl_status st, bool claimed)
{
    struct api_webhook *h = arg;
    if (st == SL_ECANCELED) { /* the thread is ending */
        hook_free(h);
        return;
    }
    if (st == SL_OK && !claimed) {
        sl_log(SL_LOG_INFO, "budget: webhook for tenant '%s' is another replica's to send",
               h->tenant);
        hook_free(h);
        return;
    }
    if (st != SL_OK)
        sl_log(SL_LOG_WARN,
               "budget: webhook for tenant '%s': redis could not say whether another replica "
               "sends it (%s); sending",
               h->tenant, sl_status_str(st));
    hook_send(h);
}

void api_budget_webhook(struct api_exchange *a)
{
    const struct sl_config_metering *mc = sl_config_metering(a->cfg);
    const struct sl_tenant *tn = a->adm.tenant;
    if (!mc->budget_webhook || !tn)
        return;
    struct evhttp_uri *u = evhttp_uri_parse(mc->budget_webhook);
    if (!u) /* the configuration checked it */
        return;
    struct api_webhook *h = sl_xcalloc(1, sizeof *h);
    h->t = a->t;
    h->host = sl_xstrdup(evhttp_uri_get_host(u));
    h->tls = strcmp(evhttp_uri_get_scheme(u), "https") == 0;
    h->port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : h->tls ? 443 : 80;
    const char *path = evhttp_uri_get_path(u), *query = evhttp_uri_get_query(u);
    size_t n = strlen(path && *path ? path : "/") + (query ? strlen(query) + 1 : 0) + 1;
    h->path = sl_xmalloc(n);
    snprintf(h->path, n, "%s%s%s", path && *path ? path : "/", query ? "?" : "",
             query ? query : "");
    evhttp_uri_free(u);
    snprintf(h->tenant, sizeof h->tenant, "%s", tn->name);
    h->timer = evtimer_new(a->t->base, on_timer, h);
    if (!h->timer)
        abort();
    /* What an operator's hook needs to act: who, how much of what, which period. */
    char spent[32], budget[32], start[32];
    sl_usage_money_format(a->adm.budget_spent, spent, sizeof spent);
    sl_usage_money_format(tn->budget, budget, sizeof budget);
    sl_usage_time_format(a->adm.budget_period_start, start);
    sl_str_init(&h->body);
    sl_str_appendf(&h->body,
                   "{\"type\":\"budget.soft_limit\",\"tenant\":\"%s\",\"used\":%.4f,"
                   "\"soft_pct\":%d,\"spent\":%s,\"budget\":%s,\"currency\":\"",
                   tn->name, a->adm.budget_used, tn->budget_soft_pct, spent, budget);
    sl_str_append_json(&h->body, mc->currency, strlen(mc->currency));
    sl_str_appendf(&h->body, "\",\"period\":\"%s\",\"period_start\":",
                   sl_usage_period_name((enum sl_usage_period)tn->budget_period));
    if (tn->budget_period == SL_USAGE_TOTAL)
        sl_str_appendf(&h->body, "null}");
    else
        sl_str_appendf(&h->body, "\"%s\"}", start);
    h->next = a->t->webhooks;
    a->t->webhooks = h;
    if (!a->t->fleet) {
        hook_send(h);
        return;
    }
    /* One for the fleet: the replica that claims the period's crossing sends it. */
    char key[SL_ADMIT_FLEET_KEY_MAX + 16];
    snprintf(key, sizeof key, "%.*sbudget-warned:%s:%lld", SL_FLEET_PREFIX_MAX,
             a->t->api->fleet_prefix, tn->name, (long long)a->adm.budget_period_start);
    int64_t ttl_ms = 0; /* a total budget's period never ends */
    if (a->adm.budget_period_end != INT64_MAX)
        ttl_ms = (a->adm.budget_period_end - sl_clock_unix() + 86400) * 1000;
    sl_fleet_once(a->t->fleet, key, ttl_ms, on_claim, h);
}
