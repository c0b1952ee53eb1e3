/* Hugging Face folders: config.json, model.safetensors, tokenizer.json. */
#include "worker_impl.h"

#include <stdio.h>

int sl_model_load_hf(struct sl_model *m, const char *dir, char *err, size_t errlen)
{
    (void)m;
    snprintf(err, errlen, "%s: Hugging Face model folders are not supported yet", dir);
    return SL_EINVAL;
}
