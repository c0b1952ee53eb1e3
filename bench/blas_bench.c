/* blas-bench: the engine's fp32 matmul (sl_cpu_matmul_mt) against a system BLAS's cblas_sgemm on
 * the same products, in one process, calls alternated so both see the same host.
 *
 * The product is the engine's: out (rows, outputs) = x (rows, k) · Wᵀ with W (outputs, k) row
 * major, i.e. cblas_sgemm(RowMajor, NoTrans, Trans). Built only where meson finds a BLAS
 * (Debian: libopenblas-dev, or libblis-dev through the libblas.so.3 alternative); which library
 * answered is printed ("blas", the file cblas_sgemm came from). Its threads follow its own
 * variables (OPENBLAS_NUM_THREADS, BLIS_NUM_THREADS); --threads sets the engine's pool. Prints one
 * JSON object: per shape the best and mean GFLOPS of each and the largest difference between
 * their outputs against the largest output (both sum in fp32, in different orders).
 *
 *   build/bench/blas-bench [--threads N] [--reps N] [ROWSxKxOUTPUTS ...]
 */
#include <sluice/common.h>
#include <sluice/kernels.h>

#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(void)
{
    fprintf(stderr, "usage: blas-bench [--threads N] [--reps N] [ROWSxKxOUTPUTS ...]\n"
                    "  default shapes: stories15M's 32x288x864 (QKV at batch 32), 256x288x864,\n"
                    "  256x768x288 (a prompt's QKV and down) and 32x288x32000 (the classifier)\n");
    exit(2);
}

struct shape {
    int rows, k, out;
};

struct times {
    double best, sum;
};

static void time_call(struct times *t, double secs)
{
    t->sum += secs;
    if (secs < t->best)
        t->best = secs;
}

/* One shape: both products `reps` times each, alternated; false when memory runs out. */
static bool run_shape(struct sl_cpu_pool *pool, struct shape s, int reps, bool first)
{
    size_t nx = (size_t)s.rows * s.k, nw = (size_t)s.out * s.k, no = (size_t)s.rows * s.out;
    float *x = malloc(nx * sizeof(float)), *w = aligned_alloc(64, (nw * sizeof(float) + 63) & ~63);
    float *o1 = malloc(no * sizeof(float)), *o2 = malloc(no * sizeof(float));
    if (!x || !w || !o1 || !o2 || sl_cpu_pool_reserve(pool, s.rows, s.k) != SL_OK) {
        free(x), free(w), free(o1), free(o2);
        return false;
    }
    srand(1);
    for (size_t i = 0; i < nx; i++)
        x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < nw; i++)
        w[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    struct sl_mat m = {.type = SL_DTYPE_F32, .data = w, .rows = s.out, .cols = s.k};
    /* In rounds, each a run of calls to one side then a run to the other: both sides' idle
     * threads spin for a while after a call (this pool's for SPIN_NS, OpenBLAS's for up to about
     * 2^28 cycles), and calls alternated one by one each ran beside the other's spinning threads
     * (a two-thread product of either lost up to half its rate). So each run starts after a
     * pause that outlasts them, then calls untimed for WARM seconds: on this project's VM the
     * first 10-20 ms of work after an idle pause ran up to ten times slower. Rounds alternate so
     * that both sides see the same drift of a shared host. */
    enum { ROUNDS = 5 };
    const double WARM = 0.03;
    const struct timespec pause = {0, 200 * 1000 * 1000};
    struct times ts = {1e30, 0}, tb = {1e30, 0};
    int rounds = reps < ROUNDS ? reps : ROUNDS, done = 0;
    for (int round = 0; round < rounds; round++) {
        int calls = (reps - done) / (rounds - round);
        for (int side = 0; side < 2; side++) {
            nanosleep(&pause, NULL);
            double warm_end = (double)sl_clock_ns() * 1e-9 + WARM;
            for (int c = 0; c < calls;) {
                double t0 = (double)sl_clock_ns() * 1e-9;
                if (side == 0)
                    sl_cpu_matmul_mt(pool, o1, x, &m, s.rows);
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.rows, s.out, s.k, 1.0f,
                                x, s.k, w, s.k, 0.0f, o2, s.out);
                double t1 = (double)sl_clock_ns() * 1e-9;
                if (t0 >= warm_end) {
                    time_call(side == 0 ? &ts : &tb, t1 - t0);
                    c++;
                }
            }
        }
        done += calls;
    }
    /* The largest difference between the two outputs against the largest output. */
    double diff = 0, top = 0;
    for (size_t i = 0; i < no; i++) {
        diff = fmax(diff, fabs((double)o1[i] - o2[i]));
        top = fmax(top, fabs((double)o2[i]));
    }
    diff = top > 0 ? diff / top : diff;
    double flops = 2.0 * s.rows * s.k * s.out;
    printf("%s    {\"rows\": %d, \"k\": %d, \"outputs\": %d, \"sluice_gflops\": %.1f, "
           "\"sluice_gflops_mean\": %.1f, \"blas_gflops\": %.1f, \"blas_gflops_mean\": %.1f, "
           "\"max_diff_vs_max\": %.2e}",
           first ? "" : ",\n", s.rows, s.k, s.out, flops / ts.best / 1e9,
           flops / (ts.sum / reps) / 1e9, flops / tb.best / 1e9, flops / (tb.sum / reps) / 1e9,
           diff);
    free(x), free(w), free(o1), free(o2);
    return true;
}

int main(int argc, char **argv)
{
    int threads = 0, reps = 100, n = 0;
    struct shape shapes[64];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1)
                usage();
        } else {
            struct shape s;
            char tail;
            if (n == 64 || sscanf(argv[i], "%dx%dx%d%c", &s.rows, &s.k, &s.out, &tail) != 3 ||
                s.rows < 1 || s.k < 1 || s.out < 1)
                usage();
            shapes[n++] = s;
        }
    }
    if (n == 0) {
        static const struct shape def[] = {
            {32, 288, 864}, {256, 288, 864}, {256, 768, 288}, {32, 288, 32000}};
        memcpy(shapes, def, sizeof def);
        n = 4;
    }
    struct sl_cpu_pool *pool = sl_cpu_pool_new(threads, true);
    Dl_info info = {0};
    const char *lib = dladdr((void *)cblas_sgemm, &info) && info.dli_fname ? info.dli_fname : "?";
    printf("{\n  \"blas\": \"%s\",\n  \"isa\": \"%s\",\n  \"threads\": %d,\n  \"reps\": %d,\n"
           "  \"shapes\": [\n",
           lib, sl_cpu_isa_name(sl_cpu_isa()), sl_cpu_pool_threads(pool), reps);
    for (int i = 0; i < n; i++)
        if (!run_shape(pool, shapes[i], reps, i == 0)) {
            fprintf(stderr, "blas-bench: out of memory at %dx%dx%d\n", shapes[i].rows, shapes[i].k,
                    shapes[i].out);
            return 1;
        }
    printf("\n  ]\n}\n");
    sl_cpu_pool_free(pool);
    return 0;
}
