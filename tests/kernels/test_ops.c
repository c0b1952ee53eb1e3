/* CPU kernels against scalar double-precision references, over odd shapes, every weight type and
 * every instruction set this CPU has; plus the invariances the forward pass relies on (a row's
 * result does not depend on its batch, its tile or the thread count). */
#include <sluice/kernels.h>

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rs = 12345;
static float frand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static float *rand_vec(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

/* The instruction sets to test: scalar always, then every level up to the best this CPU has
 * (AVX2, AVX-512). */
static int isas(enum sl_cpu_isa *out)
{
    int n = 0;
    for (enum sl_cpu_isa i = SL_CPU_ISA_SCALAR; i <= sl_cpu_isa_best(); i++)
        out[n++] = i;
    return n;
}

static enum sl_cpu_isa use_isa(enum sl_cpu_isa isa)
{
    cr_assert_eq(sl_cpu_set_isa(isa), SL_OK);
    return isa;
}

/* Runs the block once per instruction set, with the kernels forced onto it. */
#define FOR_EACH_ISA(isa)                                                                          \
    enum sl_cpu_isa isa##_list[SL_CPU_ISA_AVX512 + 1];                                             \
    int isa##_n = isas(isa##_list);                                                                \
    for (int isa##_i = 0; isa##_i < isa##_n; isa##_i++)                                            \
        for (int isa##_k = 1; isa##_k; isa##_k = 0)                                                \
            for (enum sl_cpu_isa isa = use_isa(isa##_list[isa##_i]); isa##_k; isa##_k = 0)

static void assert_close(const float *got, const double *want, size_t n, double tol,
                         const char *what, enum sl_cpu_isa isa)
{
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])),
                  "%s [%s] [%zu]: got %.9g want %.9g", what, sl_cpu_isa_name(isa), i, got[i],
                  want[i]);
}

/* A typed (rows, cols) matrix from fp32 values; *deq gets the values it really holds. */
static struct sl_mat make_mat(enum sl_dtype t, const float *src, int rows, int cols, float **deq,
                              void **buf)
{
    size_t rb = sl_dtype_row_bytes(t, cols);
    unsigned char *p = malloc(rb * (size_t)rows);
    for (int i = 0; i < rows; i++)
        sl_cpu_quantize_row(t, p + rb * (size_t)i, src + (size_t)i * cols, cols);
    struct sl_mat m = {t, p, rows, cols};
    *deq = malloc((size_t)rows * cols * sizeof(float));
    for (int i = 0; i < rows; i++)
        sl_cpu_mat_row(*deq + (size_t)i * cols, &m, i);
    *buf = p;
    return m;
}

static const enum sl_dtype dtypes[] = {SL_DTYPE_F32, SL_DTYPE_F16, SL_DTYPE_BF16, SL_DTYPE_Q8_0};
static const int ns[] = {1, 2, 3, 4, 5, 7, 9, 33, 65};
static const int ds[] = {1, 2, 3, 5, 13, 37, 50};
static const int ks[] = {1, 3, 7, 8, 9, 31, 33, 65, 100};
static const int ks_q8[] = {32, 64, 96, 288};
#define LEN(a) (int)(sizeof(a) / sizeof((a)[0]))

/* |got - exact| <= γ_(k+8) · Σ|x w|: the textbook bound for any order of fp32 summation of k
 * products, with room for the 8-lane tree. */
static void check_matmul(enum sl_cpu_isa isa, enum sl_dtype t, int n, int d, int k)
{
    float *x = rand_vec((size_t)n * k), *src = rand_vec((size_t)d * k), *deq;
    void *buf;
    struct sl_mat w = make_mat(t, src, d, k, &deq, &buf);
    float *out = malloc((size_t)n * d * sizeof(float));
    sl_cpu_matmul(out, x, &w, n);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < d; i++) {
            double s = 0, a = 0;
            for (int j = 0; j < k; j++) {
                double p = (double)x[(size_t)r * k + j] * deq[(size_t)i * k + j];
                s += p;
                a += fabs(p);
            }
            double bound = (k + 8) * 0x1p-23 * a + 1e-30;
            float got = out[(size_t)r * d + i];
            cr_assert(fabs(got - s) <= bound, "matmul %s %s n=%d d=%d k=%d [%d,%d]: %.9g vs %.9g",
                      sl_cpu_isa_name(isa), sl_dtype_name(t), n, d, k, r, i, got, s);
        }
    free(x);
    free(src);
    free(deq);
    free(buf);
    free(out);
}

Test(kernels, matmul_matches_reference_when_shapes_are_odd)
{
    FOR_EACH_ISA(isa)
    {
        for (int ti = 0; ti < LEN(dtypes); ti++) {
            enum sl_dtype t = dtypes[ti];
            for (int a = 0; a < LEN(ns); a++)
                for (int b = 0; b < LEN(ds); b++) {
                    if (t == SL_DTYPE_Q8_0)
                        for (int c = 0; c < LEN(ks_q8); c++)
                            check_matmul(isa, t, ns[a], ds[b], ks_q8[c]);
                    else
                        for (int c = 0; c < LEN(ks); c++)
                            check_matmul(isa, t, ns[a], ds[b], ks[c]);
                }
        }
    }
}

/* A matrix of several MiB takes the kernel's far-prefetch path (the classifier's); prefetching
 * must change neither a value nor read past the matrix. */
Test(kernels, matmul_matches_reference_when_matrix_exceeds_the_caches)
{
    FOR_EACH_ISA(isa)
    {
        for (int ti = 0; ti < LEN(dtypes); ti++) {
            int ns_big[] = {3, 33};
            for (int a = 0; a < LEN(ns_big); a++)
                check_matmul(isa, dtypes[ti], ns_big[a], 8003, 288);
        }
    }
}

/* The far-prefetch path (4 × 3 register tiles) and the small-batch paths (3 × 4 tiles, 1 or 2
 * rows) must give a row the same bits. */
Test(kernels, matmul_is_bitwise_equal_when_a_large_matrix_takes_other_paths)
{
    FOR_EACH_ISA(isa)
    {
        int n = 37, d = 8003, k = 291;
        float *x = rand_vec((size_t)n * k), *src = rand_vec((size_t)d * k);
        struct sl_mat w = {SL_DTYPE_F32, src, d, k};
        float *all = malloc((size_t)n * d * sizeof(float));
        float *part = malloc((size_t)n * d * sizeof(float));
        sl_cpu_matmul(all, x, &w, n);
        int groups[] = {1, 2, 7, 24};
        for (int g = 0; g < LEN(groups); g++) {
            for (int r = 0; r < n; r += groups[g]) {
                int m = n - r < groups[g] ? n - r : groups[g];
                sl_cpu_matmul(part + (size_t)r * d, x + (size_t)r * k, &w, m);
            }
            cr_assert(memcmp(all, part, (size_t)n * d * sizeof(float)) == 0,
                      "%s: rows in groups of %d differ from one batch", sl_cpu_isa_name(isa),
                      groups[g]);
        }
        free(x);
        free(src);
        free(all);
        free(part);
    }
}

/* The batch-invariance contract: a row's outputs are the same bits whether it is computed alone,
 * in a batch of any size at any offset, and a typed matrix gives the bits of its dequantized fp32
 * twin. */
Test(kernels, matmul_is_bitwise_equal_when_rows_are_batched_differently)
{
    FOR_EACH_ISA(isa)
    {
        for (int ti = 0; ti < LEN(dtypes); ti++) {
            enum sl_dtype t = dtypes[ti];
            int n = 37, d = 29, k = t == SL_DTYPE_Q8_0 ? 96 : 75;
            float *x = rand_vec((size_t)n * k), *src = rand_vec((size_t)d * k), *deq;
            void *buf;
            struct sl_mat w = make_mat(t, src, d, k, &deq, &buf);
            struct sl_mat wf = {SL_DTYPE_F32, deq, d, k};
            float *all = malloc((size_t)n * d * sizeof(float));
            float *part = malloc((size_t)n * d * sizeof(float));
            float *f32 = malloc((size_t)n * d * sizeof(float));
            sl_cpu_matmul(all, x, &w, n);
            sl_cpu_matmul(f32, x, &wf, n);
            cr_assert(memcmp(all, f32, (size_t)n * d * sizeof(float)) == 0,
                      "%s %s differs from its dequantized f32 twin", sl_cpu_isa_name(isa),
                      sl_dtype_name(t));
            int groups[] = {1, 2, 3, 5, 6, 64};
            for (int g = 0; g < LEN(groups); g++) {
                for (int r = 0; r < n; r += groups[g]) {
                    int m = n - r < groups[g] ? n - r : groups[g];
                    sl_cpu_matmul(part + (size_t)r * d, x + (size_t)r * k, &w, m);
                }
                cr_assert(memcmp(all, part, (size_t)n * d * sizeof(float)) == 0,
                          "%s %s: rows in groups of %d differ from one batch", sl_cpu_isa_name(isa),
                          sl_dtype_name(t), groups[g]);
            }
            /* Any split of the output columns (how threads divide a matmul). */
            int cuts[] = {0, 1, 5, 12, 13, 29};
            for (int c = 0; c + 1 < LEN(cuts); c++)
                sl_cpu_matmul_cols(part, x, &w, n, cuts[c], cuts[c + 1]);
            cr_assert(memcmp(all, part, (size_t)n * d * sizeof(float)) == 0,
                      "%s %s: column split differs", sl_cpu_isa_name(isa), sl_dtype_name(t));
            free(x);
            free(src);
            free(deq);
            free(buf);
            free(all);
            free(part);
            free(f32);
        }
    }
}

/* The _mt matmuls against one-thread sl_cpu_matmul, bit for bit, for each thread count, with and
 * without room reserved for x packed whole (AVX-512: then packed once per job, by unit, on any
 * thread; room for one row fewer than the job falls back to packing call by call). Shapes: one
 * row block; three row blocks (the last of 11 rows, odd) over three k blocks; a k % 8 tail. */
static void check_mt(enum sl_cpu_isa isa, enum sl_dtype t, int n, int d, int k, int hid)
{
    float *x = rand_vec((size_t)n * k), *src = rand_vec((size_t)d * k);
    float *src1 = rand_vec((size_t)hid * k), *src3 = rand_vec((size_t)hid * k);
    float *deq, *deq1, *deq3;
    void *buf, *buf1, *buf3;
    struct sl_mat w = make_mat(t, src, d, k, &deq, &buf);
    struct sl_mat w1 = make_mat(t, src1, hid, k, &deq1, &buf1);
    struct sl_mat w3 = make_mat(t, src3, hid, k, &deq3, &buf3);
    float *ref = malloc((size_t)n * d * sizeof(float));
    float *h1 = malloc((size_t)n * hid * sizeof(float));
    float *h3 = malloc((size_t)n * hid * sizeof(float));
    float *out = malloc((size_t)n * d * sizeof(float));
    float *o1 = malloc((size_t)n * hid * sizeof(float));
    float *o3 = malloc((size_t)n * hid * sizeof(float));
    sl_cpu_matmul(ref, x, &w, n);
    sl_cpu_matmul(h1, x, &w1, n);
    sl_cpu_matmul(h3, x, &w3, n);
    float *gated = malloc((size_t)n * hid * sizeof(float));
    memcpy(gated, h1, (size_t)n * hid * sizeof(float));
    sl_cpu_swiglu(gated, h3, n * hid);
    for (int room = 0; room < 3; room++)
        for (int th = 1; th <= 4; th++) {
            struct sl_cpu_pool *p = sl_cpu_pool_new(th, true);
            cr_assert_not_null(p);
            if (room)
                cr_assert_eq(sl_cpu_pool_reserve(p, room == 1 ? n : n - 1, k), SL_OK);
            const char *what[] = {"no room", "room", "room for n - 1"};
            memset(out, 0xff, (size_t)n * d * sizeof(float));
            sl_cpu_matmul_mt(p, out, x, &w, n);
            cr_assert(memcmp(ref, out, (size_t)n * d * sizeof(float)) == 0,
                      "[%s] %s %dx%dx%d mt, %s, threads %d", sl_cpu_isa_name(isa), sl_dtype_name(t),
                      n, d, k, what[room], th);
            float *const outs[3] = {out, o1, o3};
            const struct sl_mat ws[3] = {w, w1, w3};
            sl_cpu_matmul_multi_mt(p, 3, outs, x, ws, n);
            cr_assert(memcmp(ref, out, (size_t)n * d * sizeof(float)) == 0 &&
                          memcmp(h1, o1, (size_t)n * hid * sizeof(float)) == 0 &&
                          memcmp(h3, o3, (size_t)n * hid * sizeof(float)) == 0,
                      "[%s] %s %dx%dx%d multi, %s, threads %d", sl_cpu_isa_name(isa),
                      sl_dtype_name(t), n, d, k, what[room], th);
            sl_cpu_matmul_swiglu_mt(p, o1, o3, x, &w1, &w3, n);
            cr_assert(memcmp(gated, o1, (size_t)n * hid * sizeof(float)) == 0,
                      "[%s] %s %dx%dx%d swiglu, %s, threads %d", sl_cpu_isa_name(isa),
                      sl_dtype_name(t), n, d, k, what[room], th);
            sl_cpu_pool_free(p);
        }
    free(deq);
    free(deq1);
    free(deq3);
    free(buf);
    free(buf1);
    free(buf3);
    free(ref);
    free(h1);
    free(h3);
    free(out);
    free(o1);
    free(o3);
    free(gated);
    free(x);
    free(src);
    free(src1);
    free(src3);
}

Test(kernels, matmul_mt_is_bitwise_equal_when_thread_count_or_packing_changes)
{
    FOR_EACH_ISA(isa)
    for (int ti = 0; ti < LEN(dtypes); ti++) {
        check_mt(isa, dtypes[ti], 19, 301, 96, 130);
        check_mt(isa, dtypes[ti], 75, 61, 800, 50);
        if (dtypes[ti] != SL_DTYPE_Q8_0) /* whole 32-column blocks only */
            check_mt(isa, dtypes[ti], 37, 29, 803, 27);
    }
}

Test(kernels, pool_reserve_refuses_nonsense_and_keeps_working)
{
    struct sl_cpu_pool *p = sl_cpu_pool_new(2, true);
    cr_assert_not_null(p);
    cr_assert_eq(sl_cpu_pool_reserve(NULL, 4, 4), SL_EINVAL);
    cr_assert_eq(sl_cpu_pool_reserve(p, 0, 4), SL_EINVAL);
    cr_assert_eq(sl_cpu_pool_reserve(p, 4, -1), SL_EINVAL);
    cr_assert_eq(sl_cpu_pool_reserve(p, 64, 64), SL_OK);
    cr_assert_eq(sl_cpu_pool_reserve(p, 8, 8), SL_OK); /* smaller: keeps what it has */
    sl_cpu_pool_free(p);
}

/* Each pool thread's affinity, as the thread sees it: the CPUs in its mask and the first one. */
struct affinity_job {
    int count[8], first[8];
};

static void affinity_task(void *arg, int ith, int nth)
{
    (void)nth;
    struct affinity_job *j = arg;
    cpu_set_t s;
    j->count[ith] = -1;
    if (ith < 8 && pthread_getaffinity_np(pthread_self(), sizeof s, &s) == 0) {
        j->count[ith] = CPU_COUNT(&s);
        for (int c = CPU_SETSIZE - 1; c >= 0; c--)
            if (CPU_ISSET(c, &s))
                j->first[ith] = c;
    }
}

/* The CPUs this thread may run on, in order; returns how many (at most max). */
static int allowed_cpus(int *cpus, int max)
{
    cpu_set_t s;
    int n = 0;
    cr_assert_eq(sched_getaffinity(0, sizeof s, &s), 0);
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &s))
            cpus[n++] = c;
    return n;
}

Test(kernels, pool_threads_run_on_cpus_of_their_own_when_pinned)
{
    int cpus[8], n = allowed_cpus(cpus, 8);
    if (n < 2)
        cr_skip_test("needs two CPUs in this process's affinity mask (it has %d)", n);
    struct sl_cpu_pool *p = sl_cpu_pool_new(2, true);
    cr_assert_not_null(p);
    cr_assert_eq(sl_cpu_pool_pinned(p), 1);
    struct affinity_job j = {{0}, {0}};
    sl_cpu_pool_run(p, affinity_task, &j);
    cr_assert_eq(j.count[1], 1, "the pool thread may run on %d CPUs", j.count[1]);
    cr_assert_eq(j.first[1], cpus[1], "pinned to CPU %d, not the mask's second (%d)", j.first[1],
                 cpus[1]);
    cr_assert_eq(j.count[0], 1, "the caller may run on %d CPUs", j.count[0]);
    cr_assert_eq(j.first[0], cpus[0], "the caller on CPU %d, not the mask's first (%d)", j.first[0],
                 cpus[0]);
    sl_cpu_pool_free(p);
    cpu_set_t now;
    cr_assert_eq(sched_getaffinity(0, sizeof now, &now), 0);
    cr_assert_eq(CPU_COUNT(&now), n, "freeing the pool gives the caller its mask back");

    /* Unpinned, a pool thread keeps the mask it was started with. */
    p = sl_cpu_pool_new(2, false);
    cr_assert_eq(sl_cpu_pool_pinned(p), 0);
    sl_cpu_pool_run(p, affinity_task, &j);
    cr_assert_eq(j.count[1], n);
    cr_assert_eq(j.count[0], n);
    sl_cpu_pool_free(p);

    /* More threads than CPUs: none is pinned (two on one CPU would wait on each other). */
    if (n < 8) {
        p = sl_cpu_pool_new(n + 1, true);
        cr_assert_eq(sl_cpu_pool_threads(p), n + 1);
        cr_assert_eq(sl_cpu_pool_pinned(p), 0);
        sl_cpu_pool_free(p);
    }
}

/* A thread one pool has pinned (the engine's, between forward passes) that makes another pool:
 * the new one counts and uses the thread's own CPUs, not the one it is pinned to. */
Test(kernels, pool_made_by_a_pinned_caller_sizes_itself_by_the_callers_own_mask)
{
    int cpus[8], n = allowed_cpus(cpus, 8);
    if (n < 2)
        cr_skip_test("needs two CPUs in this process's affinity mask (it has %d)", n);
    struct sl_cpu_pool *outer = sl_cpu_pool_new(2, true);
    struct affinity_job j = {{0}, {0}};
    sl_cpu_pool_run(outer, affinity_task, &j);
    cr_assert_eq(j.count[0], 1, "the caller is pinned by the first pool");
    cpu_set_t all;
    CPU_ZERO(&all);
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    struct sl_cpu_pool *inner = sl_cpu_pool_new(0, true);
    cr_assert_gt(sl_cpu_pool_threads(inner), 1, "sized by the one CPU the caller is pinned to");
    sl_cpu_pool_run(inner, affinity_task, &j);
    cr_assert_eq(j.count[1], 1);
    cr_assert_eq(j.first[1], cpus[1]);
    sl_cpu_pool_free(inner);
    struct sl_cpu_pool *loose = sl_cpu_pool_new(2, false);
    sl_cpu_pool_run(loose, affinity_task, &j);
    cr_assert_eq(j.count[1], n, "an unpinned pool thread gets the caller's own mask");
    sl_cpu_pool_free(loose);
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    cr_assert_eq(CPU_COUNT(&all), 1, "the first pool's pin holds until that pool is freed");
    sl_cpu_pool_free(outer);
    cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
    cr_assert_eq(CPU_COUNT(&all), n);
}

Test(kernels, pool_takes_one_thread_per_allowed_cpu_when_threads_is_0)
{
    cpu_set_t one, old;
    cr_assert_eq(sched_getaffinity(0, sizeof old, &old), 0);
    struct sl_cpu_pool *p = sl_cpu_pool_new(0, true);
    cr_assert_eq(sl_cpu_pool_threads(p), CPU_COUNT(&old));
    cr_assert_eq(sl_cpu_pool_pinned(p), CPU_COUNT(&old) - 1);
    sl_cpu_pool_free(p);
    /* Under a one-CPU mask (taskset -c N), one thread: the caller alone. */
    int cpus[8], n = allowed_cpus(cpus, 8);
    CPU_ZERO(&one);
    CPU_SET(cpus[n - 1], &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
    p = sl_cpu_pool_new(0, true);
    int threads = sl_cpu_pool_threads(p), pinned = sl_cpu_pool_pinned(p);
    sl_cpu_pool_free(p);
    sched_setaffinity(0, sizeof old, &old);
    cr_assert_eq(threads, 1);
    cr_assert_eq(pinned, 0);
}

/* A pool's matmul packs x once for a job's calls (avx512.c): a new job, or a direct call, over
 * the same buffer with new contents must see the new rows. */
Test(kernels, matmul_sees_new_rows_when_x_changes_in_place_between_jobs)
{
    FOR_EACH_ISA(isa)
    for (int ti = 0; ti < LEN(dtypes); ti++) {
        int n = 19, d = 301, k = 96;
        float *xa = rand_vec((size_t)n * k), *xb = rand_vec((size_t)n * k);
        float *x = malloc((size_t)n * k * sizeof(float)), *src = rand_vec((size_t)d * k);
        float *deq, *ra = malloc((size_t)n * d * 4), *rb = malloc((size_t)n * d * 4);
        float *out = malloc((size_t)n * d * 4);
        void *buf;
        struct sl_mat w = make_mat(dtypes[ti], src, d, k, &deq, &buf);
        sl_cpu_matmul(ra, xa, &w, n);
        sl_cpu_matmul(rb, xb, &w, n);
        for (int th = 1; th <= 3; th++) {
            struct sl_cpu_pool *p = sl_cpu_pool_new(th, true);
            cr_assert_not_null(p);
            if (th != 2) /* x packed whole for each job, or (2 threads) call by call */
                cr_assert_eq(sl_cpu_pool_reserve(p, n, k), SL_OK);
            const float *want[] = {ra, rb, rb, ra, ra};
            for (int step = 0; step < LEN(want); step++) {
                memcpy(x, want[step] == ra ? xa : xb, (size_t)n * k * sizeof(float));
                if (step == 2 || step == 3)
                    sl_cpu_matmul_cols(out, x, &w, n, 0, d);
                else
                    sl_cpu_matmul_mt(p, out, x, &w, n);
                cr_assert(memcmp(want[step], out, (size_t)n * d * sizeof(float)) == 0,
                          "[%s] %s threads %d step %d: rows of an earlier x", sl_cpu_isa_name(isa),
                          sl_dtype_name(dtypes[ti]), th, step);
            }
            sl_cpu_pool_free(p);
        }
        free(xa);
        free(xb);
        free(x);
        free(src);
        free(deq);
        free(buf);
        free(ra);
        free(rb);
        free(out);
    }
}

Test(kernels, conversions_round_trip_when_values_are_representable)
{
    /* Every half is exactly representable in fp32 and comes back unchanged. */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = sl_cpu_f16_to_f32((uint16_t)h);
        if (isnan(f))
            continue;
        cr_assert_eq(sl_cpu_f32_to_f16(f), h, "half %04x", h);
        cr_assert_eq(sl_cpu_f32_to_bf16(sl_cpu_bf16_to_f32((uint16_t)h)), h, "bf16 %04x", h);
    }
    cr_assert_eq(sl_cpu_f16_to_f32(0x3c00), 1.0f);
    cr_assert_eq(sl_cpu_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(sl_cpu_f16_to_f32(0x7bff), 65504.0f);
    cr_assert_eq(sl_cpu_f32_to_f16(65519.0f), 0x7bff);
    cr_assert_eq(sl_cpu_f32_to_f16(65520.0f), 0x7c00);
    cr_assert_eq(sl_cpu_f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    cr_assert_eq(sl_cpu_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    cr_assert_eq(sl_cpu_f32_to_f16(0x1p-25f), 0x0000); /* tie to even: 0 */
    cr_assert_eq(sl_cpu_f32_to_f16(3 * 0x1p-25f), 0x0002);
    cr_assert(isnan(sl_cpu_f16_to_f32(sl_cpu_f32_to_f16(NAN))));
    cr_assert_eq(sl_cpu_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80); /* tie to even */
    cr_assert_eq(sl_cpu_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    /* Rounding to nearest: the error is at most half a unit in the last place. */
    for (int i = 0; i < 100000; i++) {
        float f = frand() * 1000.0f;
        double e16 = fabs((double)sl_cpu_f16_to_f32(sl_cpu_f32_to_f16(f)) - f);
        double eb = fabs((double)sl_cpu_bf16_to_f32(sl_cpu_f32_to_bf16(f)) - f);
        cr_assert(e16 <= fabs(f) * 0x1p-11 + 0x1p-25, "f16 of %g", f);
        cr_assert(eb <= fabs(f) * 0x1p-8, "bf16 of %g", f);
    }
}

Test(kernels, f16_row_conversion_equals_scalar_when_values_span_every_exponent)
{
    /* Random bit patterns (every exponent: subnormal halves, overflow to inf, ties), the halfway
     * points between neighbouring halves, and lengths that are not a multiple of 8. */
    enum { N = 1 << 16 };
    float *src = malloc(N * sizeof(float));
    uint16_t *got = malloc(N * sizeof(uint16_t));
    uint32_t r = 12345;
    for (int i = 0; i < N; i++) {
        uint32_t bits;
        if (i % 2) {
            r = r * 1664525u + 1013904223u;
            bits = r;
        } else {
            /* halfway between half i/2 and the next, as fp32 (exact) */
            uint16_t h = (uint16_t)(i / 2 * 2 + (r >> 7) % 2);
            float a = sl_cpu_f16_to_f32(h), b = sl_cpu_f16_to_f32((uint16_t)(h + 1));
            float mid = (float)(((double)a + (double)b) / 2);
            memcpy(&bits, &mid, 4);
        }
        memcpy(&src[i], &bits, 4);
    }
    FOR_EACH_ISA(isa)
    {
        int lens[] = {N, N - 1, 7, 1};
        for (int l = 0; l < LEN(lens); l++) {
            memset(got, 0xa5, N * sizeof(uint16_t));
            sl_cpu_f32_to_f16_row(got, src, lens[l]);
            for (int i = 0; i < lens[l]; i++) {
                uint16_t want = sl_cpu_f32_to_f16(src[i]);
                if (isnan(src[i]))
                    cr_assert((got[i] & 0x7c00) == 0x7c00 && (got[i] & 0x3ff),
                              "[%s] NaN %08x gave %04x", sl_cpu_isa_name(isa),
                              (unsigned)((const uint32_t *)src)[i], got[i]);
                else
                    cr_assert_eq(got[i], want, "[%s] %a: %04x, scalar %04x", sl_cpu_isa_name(isa),
                                 (double)src[i], got[i], want);
            }
            if (lens[l] < N)
                cr_assert_eq(got[lens[l]], 0xa5a5, "wrote past the end");
        }
    }
    free(src);
    free(got);
}

Test(kernels, q8_0_rows_hold_values_within_half_a_step_when_quantized)
{
    int cols = 96;
    float *src = rand_vec((size_t)cols), out[96];
    src[5] = 0.0f;
    unsigned char q[3 * SL_Q8_0_BYTES];
    cr_assert_eq(sl_dtype_row_bytes(SL_DTYPE_Q8_0, cols), sizeof(q));
    cr_assert_eq(sl_dtype_row_bytes(SL_DTYPE_Q8_0, 33), 0);
    sl_cpu_quantize_row(SL_DTYPE_Q8_0, q, src, cols);
    struct sl_mat m = {SL_DTYPE_Q8_0, q, 1, cols};
    sl_cpu_mat_row(out, &m, 0);
    for (int b = 0; b < 3; b++) {
        uint16_t h;
        memcpy(&h, q + b * SL_Q8_0_BYTES, 2);
        float d = sl_cpu_f16_to_f32(h);
        for (int j = 0; j < 32; j++) {
            int8_t qv = (int8_t)q[b * SL_Q8_0_BYTES + 2 + j];
            cr_assert_eq(out[b * 32 + j], d * (float)qv);
            cr_assert(fabsf(out[b * 32 + j] - src[b * 32 + j]) <= 0.51f * d + 1e-3f * d,
                      "block %d value %d", b, j);
        }
    }
    cr_assert_eq(out[5], 0.0f);
    /* An all-zero block quantizes to scale 0, not NaN. */
    float zeros[32] = {0};
    sl_cpu_quantize_row(SL_DTYPE_Q8_0, q, zeros, 32);
    m.cols = 32;
    sl_cpu_mat_row(out, &m, 0);
    for (int j = 0; j < 32; j++)
        cr_assert_eq(out[j], 0.0f);
    free(src);
}

static const int shapes[] = {1, 2, 3, 5, 7, 8, 9, 16, 17, 33, 64, 65, 300};
#define NSHAPES LEN(shapes)

Test(kernels, dot_and_elementwise_match_reference_when_shapes_are_odd)
{
    FOR_EACH_ISA(isa)
    {
        for (int b = 0; b < NSHAPES; b++) {
            int n = shapes[b];
            float *h = rand_vec((size_t)n), *g = rand_vec((size_t)n), *y = rand_vec((size_t)n);
            for (int i = 0; i < n; i++)
                h[i] *= 20.0f; /* reach SiLU's tails */
            double *ref = malloc((size_t)n * sizeof(double));
            double dot = 0, adot = 0;
            for (int i = 0; i < n; i++) {
                dot += (double)g[i] * y[i];
                adot += fabs((double)g[i] * y[i]);
            }
            cr_assert(fabs(sl_cpu_dot(g, y, n) - dot) <= (n + 8) * 0x1p-23 * adot, "dot");
            for (int i = 0; i < n; i++)
                ref[i] = h[i] / (1.0 + exp(-(double)h[i])) * g[i];
            sl_cpu_swiglu(h, g, n);
            assert_close(h, ref, (size_t)n, 2e-6, "swiglu", isa);
            for (int i = 0; i < n; i++)
                ref[i] = (double)y[i] + 0.5 * g[i];
            sl_cpu_axpy(y, 0.5f, g, n);
            assert_close(y, ref, (size_t)n, 1e-6, "axpy", isa);
            for (int i = 0; i < n; i++)
                ref[i] = (double)y[i] + g[i];
            sl_cpu_add(y, g, n);
            assert_close(y, ref, (size_t)n, 1e-6, "add", isa);
            free(h);
            free(g);
            free(y);
            free(ref);
        }
    }
}

Test(kernels, swiglu_is_bitwise_equal_when_split_anywhere)
{
    FOR_EACH_ISA(isa)
    {
        int n = 77;
        float *h = rand_vec((size_t)n), *g = rand_vec((size_t)n);
        float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
        memcpy(a, h, (size_t)n * sizeof(float));
        memcpy(b, h, (size_t)n * sizeof(float));
        sl_cpu_swiglu(a, g, n);
        sl_cpu_swiglu(b, g, 3);
        sl_cpu_swiglu(b + 3, g + 3, 11);
        sl_cpu_swiglu(b + 14, g + 14, n - 14);
        cr_assert(memcmp(a, b, (size_t)n * sizeof(float)) == 0, "%s", sl_cpu_isa_name(isa));
        free(h);
        free(g);
        free(a);
        free(b);
    }
}

/* The AVX-512 softmax and SwiGLU take avx2.c's arithmetic lane for lane and its sum order, so
 * their bits are AVX2's at every length (16-lane bodies, 8-lane chunks and padded tails), with
 * values that underflow e^x and values past its clamp. */
Test(kernels, softmax_and_swiglu_give_avx2_bits_when_isa_is_avx512)
{
    if (sl_cpu_isa_best() < SL_CPU_ISA_AVX512)
        cr_skip_test("no AVX-512 on this CPU");
    for (int n = 1; n <= 140; n += n < 40 ? 1 : 13)
        for (int wide = 0; wide < 2; wide++) {
            float *x = rand_vec((size_t)n), *g = rand_vec((size_t)n);
            for (int i = 0; i < n; i++)
                x[i] = x[i] * (wide ? (i % 3 ? 30.0f : 150.0f) : 2.0f);
            float *out[2][2];
            for (int v = 0; v < 2; v++) {
                use_isa(v ? SL_CPU_ISA_AVX512 : SL_CPU_ISA_AVX2);
                out[v][0] = malloc((size_t)n * sizeof(float));
                out[v][1] = malloc((size_t)n * sizeof(float));
                memcpy(out[v][0], x, (size_t)n * sizeof(float));
                memcpy(out[v][1], x, (size_t)n * sizeof(float));
                sl_cpu_softmax(out[v][0], n);
                sl_cpu_swiglu(out[v][1], g, n);
            }
            cr_assert(memcmp(out[0][0], out[1][0], (size_t)n * sizeof(float)) == 0,
                      "softmax n %d wide %d", n, wide);
            cr_assert(memcmp(out[0][1], out[1][1], (size_t)n * sizeof(float)) == 0,
                      "swiglu n %d wide %d", n, wide);
            for (int v = 0; v < 2; v++) {
                free(out[v][0]);
                free(out[v][1]);
            }
            free(x);
            free(g);
        }
    use_isa(sl_cpu_isa_best());
}

Test(kernels, rmsnorm_matches_reference_when_shapes_are_odd)
{
    FOR_EACH_ISA(isa)
    {
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < NSHAPES; b++) {
                int n = shapes[a], dim = shapes[b];
                float *x = rand_vec((size_t)n * dim), *w = rand_vec((size_t)dim);
                float *out = malloc((size_t)n * dim * sizeof(float));
                double *ref = malloc((size_t)n * dim * sizeof(double));
                for (int r = 0; r < n; r++) {
                    double ss = 0;
                    for (int j = 0; j < dim; j++)
                        ss += (double)x[r * dim + j] * x[r * dim + j];
                    double inv = 1.0 / sqrt(ss / dim + 1e-5);
                    for (int j = 0; j < dim; j++)
                        ref[r * dim + j] = w[j] * x[r * dim + j] * inv;
                }
                sl_cpu_rmsnorm(out, x, w, n, dim, 1e-5f);
                assert_close(out, ref, (size_t)n * dim, 1e-5, "rmsnorm", isa);
                sl_cpu_rmsnorm(x, x, w, n, dim, 1e-5f); /* in place */
                assert_close(x, ref, (size_t)n * dim, 1e-5, "rmsnorm in place", isa);
                free(x);
                free(w);
                free(out);
                free(ref);
            }
    }
}

Test(kernels, softmax_matches_reference_when_values_are_large)
{
    FOR_EACH_ISA(isa)
    {
        for (int b = 0; b < NSHAPES; b++) {
            int n = shapes[b];
            float *x = rand_vec((size_t)n);
            for (int i = 0; i < n; i++)
                x[i] = x[i] * 50.0f + (i % 2 ? 1000.0f : 0.0f);
            double *ref = malloc((size_t)n * sizeof(double));
            double max = x[0], sum = 0;
            for (int i = 1; i < n; i++)
                max = x[i] > max ? x[i] : max;
            for (int i = 0; i < n; i++)
                sum += ref[i] = exp(x[i] - max);
            for (int i = 0; i < n; i++)
                ref[i] /= sum;
            sl_cpu_softmax(x, n);
            assert_close(x, ref, (size_t)n, 1e-5, "softmax", isa);
            free(x);
            free(ref);
        }
    }
}

Test(kernels, div_gives_the_bits_of_scalar_division_when_shapes_vary)
{
    FOR_EACH_ISA(isa)
    {
        for (int b = 0; b < NSHAPES; b++) {
            int n = shapes[b];
            float *x = rand_vec((size_t)n), *want = malloc(sizeof(float) * (size_t)n);
            for (int i = 0; i < n; i++)
                want[i] = (x[i] *= 37.0f) / 0.7f;
            sl_cpu_div(x, n, 0.7f);
            cr_assert_eq(memcmp(x, want, sizeof(float) * (size_t)n), 0, "%s: n %d",
                         sl_cpu_isa_name(isa), n);
            free(x);
            free(want);
        }
    }
}

/* The reference: the first index of the largest number; all NaN gives 0. */
static int32_t argmax_ref(const float *x, int n)
{
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best]))
            best = i;
    return best < 0 ? 0 : best;
}

Test(kernels, argmax_is_the_first_largest_number_when_values_tie_or_are_not_numbers)
{
    FOR_EACH_ISA(isa)
    {
        /* Up to 70, and past the AVX-512 kernel's 64-float blocks (ties across its chains). */
        for (int n = 1; n <= 257; n += n < 70 ? 1 : 31)
            for (int pattern = 0; pattern < 8; pattern++)
                for (int where = 0; where<n; where += n> 8 ? 3 : 1) {
                    float *x = rand_vec((size_t)n);
                    switch (pattern) {
                    case 0: break; /* distinct values */
                    case 1:        /* ties with the maximum after `where` */
                        for (int i = where; i < n; i += 5)
                            x[i] = 2.0f;
                        break;
                    case 2: /* NaN at and after `where`, numbers elsewhere */
                        for (int i = where; i < n; i += 2)
                            x[i] = NAN;
                        break;
                    case 3: /* all -inf but one */
                        for (int i = 0; i < n; i++)
                            x[i] = i == where ? -1e30f : -INFINITY;
                        break;
                    case 4: /* all -inf, or -inf and NaN */
                        for (int i = 0; i < n; i++)
                            x[i] = i % 3 == where % 3 ? NAN : -INFINITY;
                        break;
                    case 5: /* all NaN */
                        for (int i = 0; i < n; i++)
                            x[i] = NAN;
                        break;
                    case 6: /* +inf twice, and -0 ties +0 */
                        for (int i = 0; i < n; i++)
                            x[i] = i % 2 ? 0.0f : -0.0f;
                        x[where] = INFINITY;
                        x[n - 1] = INFINITY;
                        break;
                    case 7: /* all equal */
                        for (int i = 0; i < n; i++)
                            x[i] = -3.5f;
                        break;
                    }
                    cr_assert_eq(sl_cpu_argmax(x, n), argmax_ref(x, n),
                                 "%s: n %d, pattern %d, where %d", sl_cpu_isa_name(isa), n, pattern,
                                 where);
                    free(x);
                }
        /* A logits row of the classifier's size. */
        float *x = rand_vec(32000);
        x[31999] = 9.0f;
        x[17] = 9.0f;
        cr_assert_eq(sl_cpu_argmax(x, 32000), 17, "%s", sl_cpu_isa_name(isa));
        free(x);
    }
}

Test(kernels, rope_matches_complex_rotation_when_heads_vary)
{
    FOR_EACH_ISA(isa)
    {
        int heads[] = {1, 3, 8}, sizes[] = {2, 6, 8, 10, 16, 48, 64},
            positions[] = {0, 1, 7, 255, 511};
        for (int a = 0; a < LEN(heads); a++)
            for (int b = 0; b < LEN(sizes); b++)
                for (int c = 0; c < 5; c++) {
                    int nh = heads[a], hs = sizes[b], pos = positions[c];
                    float *x = rand_vec((size_t)nh * hs), *y = malloc((size_t)nh * hs * 4);
                    memcpy(y, x, (size_t)nh * hs * 4);
                    double *ref = malloc((size_t)nh * hs * sizeof(double));
                    for (int h = 0; h < nh; h++)
                        for (int i = 0; i < hs; i += 2) {
                            double ang = pos * pow(10000.0, -(double)i / hs);
                            double re = x[h * hs + i], im = x[h * hs + i + 1];
                            ref[h * hs + i] = re * cos(ang) - im * sin(ang);
                            ref[h * hs + i + 1] = re * sin(ang) + im * cos(ang);
                        }
                    sl_cpu_rope(x, nh, hs, pos, 10000.0f);
                    /* fp32 angles at position 511 are only good to ~1e-4 radians. */
                    assert_close(x, ref, (size_t)nh * hs, 2e-4, "rope", SL_CPU_ISA_SCALAR);
                    float cs[64];
                    sl_cpu_rope_table(cs, hs, pos, 10000.0f);
                    sl_cpu_rope_apply(y, nh, hs, cs);
                    cr_assert(memcmp(x, y, (size_t)nh * hs * 4) == 0, "%s: table differs from rope",
                              sl_cpu_isa_name(isa));
                    free(x);
                    free(y);
                    free(ref);
                }
    }
}

/* A KV cache of n floats stored as t (F32 or F16): kc is rounded to what the F16 copy holds, so
 * a reference computed from kc sees the stored values; returns the storage to hand the kernels
 * (kc itself for F32). */
static void *kv_store(enum sl_dtype t, float *kc, size_t n)
{
    if (t == SL_DTYPE_F32)
        return kc;
    uint16_t *h = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        h[i] = sl_cpu_f32_to_f16(kc[i]);
        kc[i] = sl_cpu_f16_to_f32(h[i]);
    }
    return h;
}

/* Frees a KV cache from kv_store: its storage (when a copy) and the floats behind it. */
static void kv_free(enum sl_dtype t, void *store, float *kc)
{
    if (t != SL_DTYPE_F32)
        free(store);
    free(kc);
}

static const enum sl_dtype kv_types[] = {SL_DTYPE_F32, SL_DTYPE_F16};

Test(kernels, attention_matches_reference_when_pages_are_scattered)
{
    FOR_EACH_ISA(isa)
    for (int ti = 0; ti < 2; ti++) {
        enum sl_dtype kt = kv_types[ti];
        size_t es = kt == SL_DTYPE_F16 ? 2 : 4;
        int sizes[] = {2, 6, 8, 10, 48, 64, 72, 130}, ctxs[] = {1, 3, 4, 5, 17, 40};
        for (int a = 0; a < LEN(sizes); a++)
            for (int b = 0; b < LEN(ctxs); b++) {
                int hs = sizes[a], n_ctx = ctxs[b], ps = 3, n_pages = 20;
                /* (n_pages, ps, 2 heads * hs): the head under test is the second one. */
                size_t row = 2 * (size_t)hs, page = (size_t)ps * row;
                float *kc = rand_vec(n_pages * page), *vc = rand_vec(n_pages * page);
                char *ks = kv_store(kt, kc, n_pages * page), *vs = kv_store(kt, vc, n_pages * page);
                float *q = rand_vec((size_t)hs), *out = malloc((size_t)hs * 4);
                float *att = malloc((size_t)n_ctx * 4);
                for (int j = 0; j < hs; j++)
                    q[j] *= 3.0f;
                int32_t pages[20];
                for (int i = 0; i < n_pages; i++)
                    pages[i] = (i * 7 + 3) % n_pages;
                struct sl_cpu_pages kp = {ks + hs * es, pages, page, row, ps, kt};
                struct sl_cpu_pages vp = {vs + hs * es, pages, page, row, ps, kt};
                sl_cpu_attention(out, q, &kp, &vp, n_ctx, hs, att);
                double sc[40], max = -1e300, sum = 0, ref[130] = {0};
                for (int t = 0; t < n_ctx; t++) {
                    const float *k = kc + (size_t)pages[t / ps] * page + (size_t)(t % ps) * row;
                    double s = 0;
                    for (int j = 0; j < hs; j++)
                        s += (double)q[j] * k[hs + j];
                    sc[t] = s / sqrt(hs);
                    max = sc[t] > max ? sc[t] : max;
                }
                for (int t = 0; t < n_ctx; t++)
                    sum += sc[t] = exp(sc[t] - max);
                for (int t = 0; t < n_ctx; t++) {
                    const float *v = vc + (size_t)pages[t / ps] * page + (size_t)(t % ps) * row;
                    for (int j = 0; j < hs; j++)
                        ref[j] += sc[t] / sum * v[hs + j];
                }
                assert_close(out, ref, (size_t)hs, 1e-5,
                             kt == SL_DTYPE_F16 ? "attention, f16 KV" : "attention", isa);
                kv_free(kt, ks, kc);
                kv_free(kt, vs, vc);
                free(q);
                free(out);
                free(att);
            }
    }
}

Test(kernels, isa_is_forced_when_set_and_refused_when_unsupported)
{
    for (enum sl_cpu_isa i = SL_CPU_ISA_SCALAR; i <= SL_CPU_ISA_AVX512; i++) {
        if (i <= sl_cpu_isa_best()) {
            cr_assert_eq(sl_cpu_set_isa(i), SL_OK, "%s", sl_cpu_isa_name(i));
            cr_assert_eq(sl_cpu_isa(), i);
        } else {
            cr_assert_eq(sl_cpu_set_isa(i), SL_EINVAL, "%s", sl_cpu_isa_name(i));
            cr_assert_eq(sl_cpu_isa(), i - 1, "a refused level leaves the last one set");
        }
    }
    cr_assert_eq(sl_cpu_set_isa((enum sl_cpu_isa)(SL_CPU_ISA_AVX512 + 1)), SL_EINVAL);
    cr_assert_eq(sl_cpu_set_isa((enum sl_cpu_isa) - 1), SL_EINVAL);
    cr_assert_str_eq(sl_cpu_isa_name(SL_CPU_ISA_AVX512), "avx512");
}

/* Only a paired build (meson -Dpaired_avx2, bench/paired.sh) has an old side to switch to. */
Test(kernels, paired_switch_is_refused_when_build_has_no_old_side)
{
    int want = sl_cpu_paired_built() ? SL_OK : SL_EINVAL;
    cr_assert_eq(sl_cpu_paired_use_old(true), want);
    cr_assert_eq(sl_cpu_paired_use_old(false), want);
}

/* The AVX-512 matmul packs two activation rows per register and reduces both at once: each row's
 * sums must still be AVX2's bits, for every shape the packing and tiling can meet (odd rows, a
 * pair's missing row, partial register tiles, weight rows past the last whole tile, more than one
 * k block, a k % 8 tail, more rows than a packed block) and any split of the columns. */
Test(kernels, avx512_matmul_gives_the_bits_of_avx2_when_shapes_vary)
{
    if (sl_cpu_isa_best() < SL_CPU_ISA_AVX512)
        cr_skip_test("this CPU has no AVX-512F/VL: the AVX-512 kernels are not used here");
    const int rows[] = {3, 4, 5, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70};
    const int cols[] = {1, 5, 6, 7, 13, 97, 203};
    const int depth[] = {1, 7, 8, 9, 40, 288, 291, 385, 768, 801};
    for (int ti = 0; ti < LEN(dtypes); ti++)
        for (int a = 0; a < LEN(rows); a++)
            for (int b = 0; b < LEN(cols); b++)
                for (int c = 0; c < LEN(depth); c++) {
                    enum sl_dtype t = dtypes[ti];
                    int n = rows[a], d = cols[b], k = depth[c];
                    if (t == SL_DTYPE_Q8_0)
                        k = (k + 31) / 32 * 32;
                    float *x = rand_vec((size_t)n * k), *src = rand_vec((size_t)d * k), *deq;
                    void *buf;
                    struct sl_mat w = make_mat(t, src, d, k, &deq, &buf);
                    float *want = malloc((size_t)n * d * sizeof(float));
                    float *got = malloc((size_t)n * d * sizeof(float));
                    use_isa(SL_CPU_ISA_AVX2);
                    sl_cpu_matmul(want, x, &w, n);
                    use_isa(SL_CPU_ISA_AVX512);
                    int cut = d / 3;
                    sl_cpu_matmul_cols(got, x, &w, n, 0, cut);
                    sl_cpu_matmul_cols(got, x, &w, n, cut, d);
                    for (size_t i = 0; i < (size_t)n * d; i++)
                        cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                                  "%s n=%d d=%d k=%d [%zu]: avx512 %.9g avx2 %.9g",
                                  sl_dtype_name(t), n, d, k, i, got[i], want[i]);
                    free(x);
                    free(src);
                    free(deq);
                    free(buf);
                    free(want);
                    free(got);
                }
}

struct count_job {
    int hits[8];
};

static void count_task(void *arg, int ith, int nth)
{
    struct count_job *j = arg;
    cr_assert(ith >= 0 && ith < nth && nth <= 8);
    __atomic_fetch_add(&j->hits[ith], 1, __ATOMIC_RELAXED);
}

struct grab_job {
    _Atomic int next;
    int total, min_chunk;
    _Atomic int hits[1000];
    _Atomic int bad; /* chunks below min_chunk that were not the job's last items */
};

static void grab_task(void *arg, int ith, int nth)
{
    (void)ith;
    struct grab_job *j = arg;
    int end;
    for (int a; (a = sl_cpu_grab(&j->next, j->total, nth, j->min_chunk, &end)) < j->total;) {
        if (end <= a || (end - a < j->min_chunk && end != j->total))
            atomic_fetch_add(&j->bad, 1);
        for (int i = a; i < end; i++)
            atomic_fetch_add(&j->hits[i], 1);
    }
}

Test(kernels, grab_hands_out_every_item_once_when_threads_compete)
{
    int totals[] = {0, 1, 7, 72, 1000};
    for (int th = 1; th <= 4; th++)
        for (int t = 0; t < LEN(totals); t++)
            for (int mc = 1; mc <= 5; mc += 4) {
                struct sl_cpu_pool *p = sl_cpu_pool_new(th, true);
                struct grab_job *j = calloc(1, sizeof(*j));
                j->total = totals[t];
                j->min_chunk = mc;
                sl_cpu_pool_run(p, grab_task, j);
                cr_assert_eq(j->bad, 0);
                for (int i = 0; i < j->total; i++)
                    cr_assert_eq(j->hits[i], 1, "threads %d total %d item %d: %d", th, j->total, i,
                                 j->hits[i]);
                free(j);
                sl_cpu_pool_free(p);
            }
}

Test(kernels, pool_runs_every_part_once_when_jobs_come_fast_or_slow)
{
    for (int th = 1; th <= 5; th++) {
        struct sl_cpu_pool *p = sl_cpu_pool_new(th, true);
        cr_assert_eq(sl_cpu_pool_threads(p), th);
        struct count_job j = {{0}};
        for (int it = 0; it < 2000; it++)
            sl_cpu_pool_run(p, count_task, &j);
        /* Past the spin window the workers sleep; a job must still wake them. */
        for (int it = 0; it < 3; it++) {
            usleep(2000);
            sl_cpu_pool_run(p, count_task, &j);
        }
        for (int i = 0; i < th; i++)
            cr_assert_eq(j.hits[i], 2003, "threads %d part %d ran %d times", th, i, j.hits[i]);
        sl_cpu_pool_free(p);
    }
    struct count_job j = {{0}};
    sl_cpu_pool_run(NULL, count_task, &j);
    cr_assert_eq(j.hits[0], 1);
}

Test(kernels, attention_multi_equals_attention_when_queries_share_pages)
{
    FOR_EACH_ISA(isa)
    for (int ti = 0; ti < 2; ti++) {
        enum sl_dtype kt = kv_types[ti];
        size_t es = kt == SL_DTYPE_F16 ? 2 : 4;
        int sizes[] = {2, 6, 8, 10, 48, 64, 72, 130};
        int ctxs[][SL_CPU_ATTN_MAX_Q] = {
            {1, 1, 1, 1, 1, 1, 1, 1},        {3, 4, 5, 6, 7, 8, 9, 10},
            {4, 8, 12, 16, 20, 24, 28, 32},  {17, 5, 40, 9, 33, 2, 21, 14},
            {40, 40, 1, 40, 40, 39, 38, 40}, {13, 14, 15, 16, 17, 18, 19, 20},
            {7, 40, 23, 1, 2, 3, 36, 11},    {2, 1, 3, 4, 1, 2, 5, 6}};
        for (int a = 0; a < LEN(sizes); a++)
            for (int b = 0; b < LEN(ctxs); b++)
                for (int nq = 1; nq <= SL_CPU_ATTN_MAX_Q; nq++) {
                    int hs = sizes[a], ps = 3, n_pages = 20, *n_ctx = ctxs[b];
                    size_t row = 2 * (size_t)hs, page = (size_t)ps * row, stride = 41;
                    float *kc = rand_vec(n_pages * page), *vc = rand_vec(n_pages * page);
                    char *ks = kv_store(kt, kc, n_pages * page);
                    char *vs = kv_store(kt, vc, n_pages * page);
                    enum { M = SL_CPU_ATTN_MAX_Q };
                    float *q = rand_vec(M * (size_t)hs), *out = malloc(M * (size_t)hs * 4);
                    float *want = malloc((size_t)hs * 4), *att = malloc(M * stride * 4);
                    for (int j = 0; j < M * hs; j++)
                        q[j] *= 3.0f;
                    int32_t pages[20];
                    for (int i = 0; i < n_pages; i++)
                        pages[i] = (i * 7 + 3) % n_pages;
                    struct sl_cpu_pages kp = {ks + hs * es, pages, page, row, ps, kt};
                    struct sl_cpu_pages vp = {vs + hs * es, pages, page, row, ps, kt};
                    float *outs[M];
                    const float *qs[M];
                    for (int i = 0; i < M; i++) {
                        outs[i] = out + (size_t)i * hs;
                        qs[i] = q + (size_t)i * hs;
                    }
                    sl_cpu_attention_multi(nq, outs, qs, n_ctx, &kp, &vp, hs, att, stride);
                    for (int i = 0; i < nq; i++) {
                        sl_cpu_attention(want, qs[i], &kp, &vp, n_ctx[i], hs, att);
                        cr_assert(memcmp(want, outs[i], (size_t)hs * 4) == 0,
                                  "[%s, %s KV] hs %d nq %d query %d (n_ctx %d) differs from alone",
                                  sl_cpu_isa_name(isa), sl_dtype_name(kt), hs, nq, i, n_ctx[i]);
                    }
                    kv_free(kt, ks, kc);
                    kv_free(kt, vs, vc);
                    free(q);
                    free(out);
                    free(want);
                    free(att);
                }
    }
}

Test(kernels, attention_row_equals_attention_of_each_head)
{
    FOR_EACH_ISA(isa)
    for (int ti = 0; ti < 2; ti++) {
        enum sl_dtype kt = kv_types[ti];
        size_t es = kt == SL_DTYPE_F16 ? 2 : 4;
        int sizes[] = {6, 8, 48, 64, 72, 128};
        int heads[][2] = {{1, 1}, {6, 6}, {4, 2}, {8, 1}, {6, 3}};
        int ctxs[] = {1, 3, 4, 5, 16, 17, 40, 59};
        /* Pages of 4 rows, and of 16 (the default block, whole groups of 8 rows), and of 5. */
        int page_sizes[] = {4, 16, 5};
        for (int pi = 0; pi < LEN(page_sizes); pi++)
            for (int a = 0; a < LEN(sizes); a++)
                for (int g = 0; g < LEN(heads); g++)
                    for (int b = 0; b < LEN(ctxs); b++) {
                        int hs = sizes[a], nh = heads[g][0], nkv = heads[g][1], n_ctx = ctxs[b];
                        int ps = page_sizes[pi], n_pages = 16;
                        /* A page: (nkv, ps, hs) of this layer, inside a page_stride of two layers.
                         */
                        size_t head = (size_t)ps * (size_t)hs, page = 2 * (size_t)nkv * head;
                        size_t stride = 61;
                        float *kc = rand_vec(n_pages * page), *vc = rand_vec(n_pages * page);
                        char *ks = kv_store(kt, kc, n_pages * page);
                        char *vs = kv_store(kt, vc, n_pages * page);
                        float *q = rand_vec((size_t)nh * hs), *out = malloc((size_t)nh * hs * 4);
                        float *want = malloc((size_t)hs * 4),
                              *att = malloc((size_t)nh * stride * 4);
                        for (int j = 0; j < nh * hs; j++)
                            q[j] *= 3.0f;
                        int32_t pages[16];
                        for (int i = 0; i < n_pages; i++)
                            pages[i] = (i * 5 + 3) % n_pages;
                        size_t layer = (size_t)nkv * head; /* the second layer of each page */
                        struct sl_cpu_pages kp = {ks + layer * es, pages, page, (size_t)hs, ps, kt};
                        struct sl_cpu_pages vp = {vs + layer * es, pages, page, (size_t)hs, ps, kt};
                        sl_cpu_attention_row(out, q, nh, nkv, &kp, &vp, n_ctx, hs, att, stride);
                        for (int h = 0; h < nh; h++) {
                            struct sl_cpu_pages kh = kp, vh = vp;
                            kh.base = ks + (layer + (size_t)(h / (nh / nkv)) * head) * es;
                            vh.base = vs + (layer + (size_t)(h / (nh / nkv)) * head) * es;
                            sl_cpu_attention(want, q + (size_t)h * hs, &kh, &vh, n_ctx, hs, att);
                            cr_assert(memcmp(want, out + (size_t)h * hs, (size_t)hs * 4) == 0,
                                      "[%s, %s KV] hs %d heads %d/%d n_ctx %d page %d: head %d "
                                      "differs from alone",
                                      sl_cpu_isa_name(isa), sl_dtype_name(kt), hs, nh, nkv, n_ctx,
                                      ps, h);
                        }
                        kv_free(kt, ks, kc);
                        kv_free(kt, vs, vc);
                        free(q);
                        free(out);
                        free(want);
                        free(att);
                    }
    }
}
