/* Tenants and their keys: lookup by API key, the admin and metrics keys, redaction.
 *
 * Keys are never kept, only their SHA-256: a leaked configuration or /admin/config answer gives
 * nobody a key, and a lookup hashes the presented key and compares hashes. The comparison runs
 * against every tenant with CRYPTO_memcmp and no early exit, so the time of a lookup says
 * nothing about which hash (or how much of it) matched. Error messages and logs name tenants and
 * tiers, never keys or their hashes.
 */
#include "admission_impl.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct sl_tenant sl_tenant_anonymous = {
    .name = "anonymous",
    .tiers = UINT32_MAX,
    .default_tier = 0,
    .share = 1,
};

/* Fetched once: EVP_sha256() makes OpenSSL 3 look the implementation up on every call, which
 * costs more than hashing a key (the 401 path is one hash). Never freed; it lives as long as
 * the process. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

void sl_tenant_sha256(const void *data, size_t len, unsigned char out[32])
{
    pthread_once(&sha256_once, sha256_fetch);
    unsigned int n = 0;
    /* Fails only without memory or a SHA-256 implementation: nothing to recover. */
    if (EVP_Digest(data, len, out, &n, sha256_md ? sha256_md : EVP_sha256(), NULL) != 1 ||
        n != 32) {
        sl_log(SL_LOG_ERROR, "SHA-256 is unavailable in this OpenSSL");
        abort();
    }
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool sl_tenant_hex_decode(const char *s, unsigned char out[32])
{
    if (!s || strlen(s) != 64)
        return false;
    for (int i = 0; i < 32; i++) {
        int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return true;
}

/* The loop always runs to the end and picks the index with masks rather than a branch on the
 * match. */
long sl_tenant_hash_find(const unsigned char h[32], const unsigned char *hashes, size_t stride,
                         size_t n)
{
    size_t idx = 0, found = 0;
    for (size_t i = 0; i < n; i++) {
        size_t eq = (size_t)(CRYPTO_memcmp(h, hashes + i * stride, 32) == 0);
        size_t mask = (size_t)0 - eq;
        idx |= mask & i;
        found |= eq;
    }
    return found ? (long)idx : -1;
}

const struct sl_tenant *sl_tenant_lookup(const struct sl_tenancy *cfg, const char *key, size_t len)
{
    if (cfg->n_tenants == 0)
        return &sl_tenant_anonymous;
    if (!key || !len)
        return NULL;
    unsigned char h[32];
    sl_tenant_sha256(key, len, h);
    long i = sl_tenant_hash_find(h, cfg->tenants[0].key_sha256, sizeof cfg->tenants[0],
                                 (size_t)cfg->n_tenants);
    return i < 0 ? NULL : &cfg->tenants[i];
}

bool sl_tenant_admin_check(const struct sl_tenancy *cfg, const char *key, size_t len)
{
    if (!cfg->has_admin_key || !key || !len)
        return false;
    unsigned char h[32];
    sl_tenant_sha256(key, len, h);
    return CRYPTO_memcmp(h, cfg->admin_key_sha256, 32) == 0;
}

bool sl_tenant_metrics_check(const struct sl_tenancy *cfg, const char *key, size_t len)
{
    if (!cfg->metrics_key.set)
        return true;
    if (!key || !len)
        return false;
    unsigned char h[32];
    sl_tenant_sha256(key, len, h);
    /* both compared, so the time does not say which key it was */
    bool metrics = CRYPTO_memcmp(h, cfg->metrics_key.sha256, 32) == 0;
    bool admin = cfg->has_admin_key && CRYPTO_memcmp(h, cfg->admin_key_sha256, 32) == 0;
    return metrics | admin;
}

void sl_tenant_key_redact(const char *key, size_t len, char *out, size_t outlen)
{
    bool printable = len >= 20;
    for (size_t i = 0; printable && i < len; i++)
        printable = key[i] > ' ' && key[i] < 0x7f && key[i] != '"' && key[i] != '\\';
    if (!printable)
        snprintf(out, outlen, "****");
    else
        snprintf(out, outlen, "%.5s****%.4s", key, key + len - 4);
}
