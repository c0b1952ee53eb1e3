/* TLS material for tests (the transport's certificates, the budget webhook's receiver): a P-256
 * key, and a self-signed certificate of it naming cn and, when ip is not NULL, that address as its
 * subjectAltName, valid for a day. Failures fail the test. */
#ifndef SLUICE_TEST_TLS_CERT_H
#define SLUICE_TEST_TLS_CERT_H

#include <openssl/types.h>

EVP_PKEY *tls_key_new(void);
X509 *tls_cert_new(EVP_PKEY *k, const char *cn, long serial, const char *ip);

#endif
