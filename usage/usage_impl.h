/* Private to the usage module: what its files share beyond include/sluice/usage.h. Its tests may
 * include this header; nothing outside usage/ may. */
#ifndef SLUICE_USAGE_IMPL_H
#define SLUICE_USAGE_IMPL_H

#include <sluice/usage.h>

/* Calls fn for every entry of the ledger, in no order, under its lock (the journal's
 * compaction). fn must not use the ledger. */
void sl_usage_ledger_each(struct sl_usage_ledger *l, sl_usage_row_fn fn, void *arg);

#endif
