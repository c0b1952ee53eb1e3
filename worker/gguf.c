/* GGUF v3 models (llama architecture). */
#include "worker_impl.h"

#include <stdio.h>

int sl_model_load_gguf(struct sl_model *m, const char *path, char *err, size_t errlen)
{
    (void)m;
    snprintf(err, errlen, "%s: GGUF models are not supported yet", path);
    return SL_EINVAL;
}
