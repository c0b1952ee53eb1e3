/* Devices: which backend a worker runs on ("device": auto | cpu | cuda[:N]). */
#include "worker_impl.h"

#include "sl_build_config.h"

#include <stdio.h>
#include <string.h>

int sl_worker_device_parse(const char *spec, int *index)
{
    int ix;
    if (!spec)
        return SL_EINVAL;
    if (strcmp(spec, "auto") == 0) {
        ix = -2;
    } else if (strcmp(spec, "cpu") == 0) {
        ix = -1;
    } else if (strcmp(spec, "cuda") == 0) {
        ix = 0;
    } else if (strncmp(spec, "cuda:", 5) == 0) {
        const char *d = spec + 5;
        size_t len = strlen(d);
        if (len < 1 || len > 4)
            return SL_EINVAL;
        ix = 0;
        for (size_t i = 0; i < len; i++) {
            if (d[i] < '0' || d[i] > '9')
                return SL_EINVAL;
            ix = ix * 10 + (d[i] - '0');
        }
        if (ix >= 1024)
            return SL_EINVAL;
    } else {
        return SL_EINVAL;
    }
    if (index)
        *index = ix;
    return SL_OK;
}

/* The level named `name` as sl_cpu_isa_name spells it, or -1 ("auto" included). */
static int isa_of(const char *name)
{
    for (int i = SL_CPU_ISA_SCALAR; name && i <= SL_CPU_ISA_AVX512; i++)
        if (strcmp(name, sl_cpu_isa_name((enum sl_cpu_isa)i)) == 0)
            return i;
    return -1;
}

bool sl_worker_cpu_isa_valid(const char *name)
{
    return name && (strcmp(name, "auto") == 0 || isa_of(name) >= 0);
}

int sl_worker_set_cpu_isa(const char *name, const char **used, char *err, size_t errlen)
{
    if (!sl_worker_cpu_isa_valid(name)) {
        snprintf(err, errlen,
                 "cpu_isa \"%.40s\": must be \"auto\", \"avx512\", \"avx2\" or \"scalar\"",
                 name ? name : "(null)");
        return SL_EINVAL;
    }
    enum sl_cpu_isa best = sl_cpu_isa_best();
    enum sl_cpu_isa want = strcmp(name, "auto") == 0 ? best : (enum sl_cpu_isa)isa_of(name);
    if (sl_cpu_set_isa(want) != SL_OK) {
        snprintf(err, errlen, "cpu_isa \"%s\": this CPU has no %s (the best it has is %s)", name,
                 name, sl_cpu_isa_name(best));
        return SL_EINVAL;
    }
    if (used)
        *used = sl_cpu_isa_name(want);
    return SL_OK;
}

static void set_cpu(struct sl_worker_device *out)
{
    memset(out, 0, sizeof *out);
    out->ops = &sl_cpu_backend_ops;
    out->index = -1;
    snprintf(out->name, sizeof out->name, "cpu");
}

int sl_worker_device_select(const char *spec, struct sl_worker_device *out, char *err,
                            size_t errlen)
{
    int ix;
    set_cpu(out);
    if (sl_worker_device_parse(spec, &ix) != SL_OK) {
        snprintf(err, errlen, "device \"%.40s\": must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"",
                 spec ? spec : "(null)");
        return SL_EINVAL;
    }
    if (ix == -1)
        return SL_OK;
    char why[256];
#if SL_HAVE_CUDA
    if (sl_cuda_device_probe(ix < 0 ? 0 : ix, out, why, sizeof why) == SL_OK) {
        sl_log(SL_LOG_INFO, "device %s: %s, %.1f GiB free", spec, out->name,
               (double)out->mem_free / (1 << 30));
        return SL_OK;
    }
    set_cpu(out);
#else
    snprintf(why, sizeof why,
             "this build has no CUDA support (configured with -Dcuda=disabled or without nvcc)");
#endif
    if (ix >= 0) {
        snprintf(err, errlen, "device \"%s\": %s", spec, why);
        return SL_ENOENT;
    }
    sl_log(SL_LOG_INFO, "device auto: %s; running on the CPU", why);
    return SL_OK;
}

size_t sl_worker_device_kv_room(const struct sl_worker_device *d, const struct sl_model *m,
                                int max_batch_tokens, int max_seqs)
{
#if SL_HAVE_CUDA
    if (d->index >= 0) {
        size_t need = sl_cuda_backend_mem_need(m, max_batch_tokens, max_seqs);
        return d->mem_free > need ? d->mem_free - need : 0;
    }
#else
    (void)m;
    (void)max_batch_tokens;
    (void)max_seqs;
#endif
    (void)d;
    return 0;
}
