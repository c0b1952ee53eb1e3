/* Device selection: the "device" key's syntax, and what "auto", "cpu" and "cuda:N" resolve to on
 * this machine, with or without a CUDA device (both outcomes are checked, whichever applies). */
#include "worker_test.h"

#include "sl_build_config.h"

Test(worker, device_spec_parses_when_auto_cpu_or_cuda)
{
    struct {
        const char *spec;
        int index;
    } ok[] = {{"auto", -2},  {"cpu", -1},   {"cuda", 0},
              {"cuda:0", 0}, {"cuda:3", 3}, {"cuda:1023", 1023}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int ix = 99;
        cr_assert_eq(sl_worker_device_parse(ok[i].spec, &ix), SL_OK, "%s", ok[i].spec);
        cr_assert_eq(ix, ok[i].index, "%s", ok[i].spec);
    }
    const char *bad[] = {"",           "gpu",     "CUDA",    "cuda:", "cuda:-1", "cuda:1024",
                         "cuda:01234", "cuda:1x", "cuda:0 ", " cpu",  "cpu:0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_eq(sl_worker_device_parse(bad[i], NULL), SL_EINVAL, "\"%s\"", bad[i]);
    cr_assert_eq(sl_worker_device_parse(NULL, NULL), SL_EINVAL);
}

/* Whether CUDA device 0 can be used here, and if not why. */
static bool have_cuda(char *why, size_t len)
{
#if SL_HAVE_CUDA
    return sl_cuda_device_probe(0, NULL, why, len) == SL_OK;
#else
    snprintf(why, len, "built without CUDA");
    return false;
#endif
}

Test(worker, device_auto_falls_back_to_cpu_when_no_cuda_device_is_present)
{
    char why[256] = "", err[256] = "";
    bool cuda = have_cuda(why, sizeof why);
    struct sl_worker_device d;
    cr_assert_eq(sl_worker_device_select("auto", &d, err, sizeof err), SL_OK, "%s", err);
    if (cuda) {
        cr_assert_eq(d.index, 0);
        cr_assert_str_eq(d.ops->name, "cuda");
        cr_assert(strncmp(d.name, "cuda:0 (", 8) == 0, "%s", d.name);
        cr_assert_gt(d.mem_free, 0);
    } else {
        cr_log_info("no CUDA device here (%s): auto must be the CPU", why);
        cr_assert_eq(d.index, -1);
        cr_assert_eq(d.ops, &sl_cpu_backend_ops);
        cr_assert_str_eq(d.name, "cpu");
    }
    cr_assert_eq(sl_worker_device_select("cpu", &d, err, sizeof err), SL_OK);
    cr_assert_eq(d.ops, &sl_cpu_backend_ops);
    cr_assert_eq(d.index, -1);
    cr_assert_eq(sl_worker_device_kv_room(&d, NULL, 64, 4), 0, "the CPU's room is MemAvailable");
}

Test(worker, device_cuda_is_an_error_when_no_cuda_device_is_present)
{
    char why[256] = "", err[256] = "";
    struct sl_worker_device d;
    if (have_cuda(why, sizeof why)) {
        cr_assert_eq(sl_worker_device_select("cuda:0", &d, err, sizeof err), SL_OK, "%s", err);
        cr_assert_eq(d.index, 0);
        /* An ordinal past the last device is refused, naming how many there are. */
        cr_assert_eq(sl_worker_device_select("cuda:1023", &d, err, sizeof err), SL_ENOENT);
        cr_assert(strstr(err, "no CUDA device 1023"), "%s", err);
        return;
    }
    cr_assert_eq(sl_worker_device_select("cuda:0", &d, err, sizeof err), SL_ENOENT);
    cr_assert(strstr(err, "device \"cuda:0\": "), "%s", err);
#if SL_HAVE_CUDA
    cr_assert(strstr(err, "no CUDA device"), "%s", err);
#else
    cr_assert(strstr(err, "no CUDA support"), "%s", err);
#endif
    cr_assert_eq(d.ops, &sl_cpu_backend_ops, "a failed selection leaves the CPU in *out");
    cr_assert_eq(sl_worker_device_select("gpu", &d, err, sizeof err), SL_EINVAL);
    cr_assert(strstr(err, "\"gpu\""), "%s", err);
}

/* "cpu_isa": every level up to this CPU's best is taken and reported; a level above it, an
 * unknown name and NULL are refused with the reason; "auto" is the best. Whatever the outcome,
 * the kernels are left on the best level for the tests that follow. */
Test(worker, cpu_isa_is_forced_when_this_cpu_has_it_and_refused_when_not)
{
    const char *names[] = {"scalar", "avx2", "avx512"}; /* enum sl_cpu_isa order */
    enum sl_cpu_isa best = sl_cpu_isa_best();
    char err[256];
    const char *used = NULL;
    for (int i = 0; i < 3; i++) {
        err[0] = '\0';
        int st = sl_worker_set_cpu_isa(names[i], &used, err, sizeof err);
        if (i <= (int)best) {
            cr_assert_eq(st, SL_OK, "%s: %s", names[i], err);
            cr_assert_str_eq(used, names[i]);
            cr_assert_eq((int)sl_cpu_isa(), i, "%s", names[i]);
        } else {
            cr_assert_eq(st, SL_EINVAL, "%s", names[i]);
            cr_assert(strstr(err, "this CPU has no"), "%s", err);
            cr_assert_eq((int)sl_cpu_isa(), (int)best, "a refused level changes nothing");
        }
    }
    cr_assert_eq(sl_worker_set_cpu_isa("auto", &used, err, sizeof err), SL_OK, "%s", err);
    cr_assert_str_eq(used, sl_cpu_isa_name(best));
    cr_assert_eq(sl_cpu_isa(), best);
    const char *bad[] = {"", "AVX2", "avx", "sse4", "avx2 ", "native"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert(!sl_worker_cpu_isa_valid(bad[i]), "\"%s\"", bad[i]);
        err[0] = '\0';
        cr_assert_eq(sl_worker_set_cpu_isa(bad[i], NULL, err, sizeof err), SL_EINVAL, "\"%s\"",
                     bad[i]);
        cr_assert(strstr(err, "must be"), "%s", err);
    }
    cr_assert_eq(sl_worker_set_cpu_isa(NULL, NULL, err, sizeof err), SL_EINVAL);
    cr_assert_eq(sl_cpu_isa(), best);
}
