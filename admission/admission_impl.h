/* Private to the admission module: what its files share beyond include/sluice/admission.h. Its
 * tests may include this header; nothing outside admission/ may. */
#ifndef SLUICE_ADMISSION_IMPL_H
#define SLUICE_ADMISSION_IMPL_H

#include <sluice/admission.h>

/* Compares h with every hash (n of them, stride bytes apart) in constant time and returns the
 * index of the one equal to it, or -1 (tenant.c). */
long sl_tenant_hash_find(const unsigned char h[32], const unsigned char *hashes, size_t stride,
                         size_t n);
/* Text quoted in a message (client text, a configuration's name): printable ASCII only, '?' for
 * any other byte, at most 40 bytes, NUL-terminated in out (classify.c). */
void sl_admit_quote(char *out, size_t outlen, const char *s, size_t len);

/* Frees a tenancy's state (admission.c; sl_tenancy_dispose calls it). NULL is fine. */
void sl_admit_state_free(struct sl_admit_state *st);

#endif
