/* TLS: the server context of the TLS listener, built from the configuration at start, by
 * --check-config and again on every reload. A context that does not build changes nothing, so a
 * bad certificate on SIGHUP leaves the previous one serving.
 *
 * Policy: TLS 1.2 and later, OpenSSL's default (secure) cipher list and groups, no compression
 * (CRIME), no renegotiation, the server's cipher order. An encrypted key fails to load rather
 * than prompting on the terminal.
 */
#include "http_impl.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>

/* The reason of the first queued OpenSSL error, the root cause ("No such file or directory",
 * "bad base64 decode", "key values mismatch"), and the queue cleared so it cannot be blamed on
 * the next connection. */
static const char *ssl_reason(void)
{
    unsigned long e = ERR_peek_error();
    /* A system error (a file that does not open) has no reason string of OpenSSL's own. */
    const char *r = !e                    ? NULL
                    : ERR_SYSTEM_ERROR(e) ? strerror(ERR_GET_REASON(e))
                                          : ERR_reason_error_string(e);
    ERR_clear_error();
    return r ? r : "unknown OpenSSL error";
}

static int no_passphrase(char *buf, int size, int rwflag, void *arg)
{
    (void)buf, (void)size, (void)rwflag, (void)arg;
    return 0;
}

struct ssl_ctx_st *sl_tls_ctx_new(const struct sl_config_tls *t, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) {
        snprintf(err, errlen, "tls: cannot create a context: %s", ssl_reason());
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    /* Idle kept-alive connections give their read and write buffers back. */
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
    static const unsigned char sid_ctx[] = "sluice";
    SSL_CTX_set_session_id_context(ctx, sid_ctx, sizeof sid_ctx - 1);
    if (SSL_CTX_use_certificate_chain_file(ctx, t->cert) != 1) {
        snprintf(err, errlen, "tls: certificate \"%s\" does not load: %s", t->cert, ssl_reason());
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, t->key, SSL_FILETYPE_PEM) != 1) {
        /* OpenSSL checks the key against the certificate as it loads it. */
        unsigned long e = ERR_peek_error();
        bool mismatch =
            ERR_GET_LIB(e) == ERR_LIB_X509 && ERR_GET_REASON(e) == X509_R_KEY_VALUES_MISMATCH;
        snprintf(err, errlen, "tls: key \"%s\" %s: %s", t->key,
                 mismatch ? "does not match the certificate" : "does not load", ssl_reason());
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, errlen, "tls: key \"%s\" does not match certificate \"%s\": %s", t->key,
                 t->cert, ssl_reason());
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

enum sl_status sl_http_tls_check(const struct sl_config *cfg, char *err, size_t errlen)
{
    const struct sl_config_tls *t = &sl_config_http(cfg)->tls;
    if (!t->cert)
        return SL_OK;
    SSL_CTX *ctx = sl_tls_ctx_new(t, err, errlen);
    if (!ctx)
        return SL_EINVAL;
    SSL_CTX_free(ctx);
    return SL_OK;
}
