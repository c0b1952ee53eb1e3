#include "tls_cert.h"

#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>

EVP_PKEY *tls_key_new(void)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    cr_assert_not_null(k);
    return k;
}

X509 *tls_cert_new(EVP_PKEY *k, const char *cn, long serial, const char *ip)
{
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
    X509_set_pubkey(x, k);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(x, n);
    if (ip) {
        char san[64];
        snprintf(san, sizeof san, "IP:%s", ip);
        X509V3_CTX ctx;
        X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
        X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, NID_subject_alt_name, san);
        cr_assert_not_null(e);
        X509_add_ext(x, e, -1);
        X509_EXTENSION_free(e);
    }
    cr_assert_gt(X509_sign(x, k, EVP_sha256()), 0);
    return x;
}
