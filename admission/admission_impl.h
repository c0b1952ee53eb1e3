/* Private to the admission module: what its files share beyond include/sluice/admission.h. Its
 * tests may include this header; nothing outside admission/ may. */
#ifndef SLUICE_ADMISSION_IMPL_H
#define SLUICE_ADMISSION_IMPL_H

#include <sluice/admission.h>

/* Frees a tenancy's state (admission.c; sl_tenancy_dispose calls it). NULL is fine. */
void sl_admit_state_free(struct sl_admit_state *st);

#endif
