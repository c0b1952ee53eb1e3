/* qmatmul-bench: the CPU matmul of one quantized matrix against a batch of activation rows,
 * through the kernel thread pool as the engine calls it (sl_cpu_matmul_mt), on random weights.
 * It isolates the kernels from the rest of a forward pass: a matrix that fits the caches shows
 * what the instructions cost, one larger than the caches what streaming it from memory adds.
 * Prints one JSON object: multiply-adds per second and weight bytes read per second.
 */
#include <sluice/kernels.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(void)
{
    fprintf(stderr,
            "usage: qmatmul-bench [--type f32|f16|bf16|q8_0|q4_0|q4_k|q5_k|q6_k] [--rows N]\n"
            "                     [--cols K] [--batch N] [--threads N] [--reps N]\n"
            "                     [--fp32-activations] [--no-pin]\n"
            "  --type     weight type (default q8_0)\n"
            "  --rows     output rows of the matrix (default 5632: TinyLlama's ffn; 64 fits L2)\n"
            "  --cols     inner dimension, a multiple of 256 (default 2048)\n"
            "  --batch    activation rows (default 1: a decode step of one sequence)\n"
            "  --threads  kernel threads (default 1)\n"
            "  --reps     timed passes of about 0.3 s each, best reported (default 3)\n"
            "  --fp32-activations  quantized weights through the exact fp32 matmul\n"
            "  --no-pin   leave the kernel threads unpinned\n");
    exit(2);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int parse_int(const char *flag, const char *v, int lo, int hi)
{
    char *end;
    long n = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || n < lo || n > hi) {
        fprintf(stderr, "qmatmul-bench: %s wants an integer in [%d, %d]\n", flag, lo, hi);
        exit(2);
    }
    return (int)n;
}

/* A uniform value in [-1, 1) from a 64-bit LCG: the same matrix on every run. */
static float rnd(unsigned long long *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(*s >> 40) / (float)(1 << 23) - 1.0f;
}

int main(int argc, char **argv)
{
    enum sl_dtype type = SL_DTYPE_Q8_0;
    int rows = 5632, cols = 2048, batch = 1, threads = 1, reps = 3;
    bool int8 = true, pin = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--type")) {
            int t = 0;
            while (t < SL_DTYPE_COUNT && (!v || strcmp(v, sl_dtype_name((enum sl_dtype)t))))
                t++;
            if (t == SL_DTYPE_COUNT) {
                fprintf(stderr, "qmatmul-bench: unknown --type %s\n", v ? v : "(none)");
                return 2;
            }
            type = (enum sl_dtype)t;
            i++;
        } else if (!strcmp(a, "--rows")) {
            rows = parse_int(a, v, 1, 1 << 20);
            i++;
        } else if (!strcmp(a, "--cols")) {
            cols = parse_int(a, v, 256, 1 << 16);
            i++;
        } else if (!strcmp(a, "--batch")) {
            batch = parse_int(a, v, 1, 4096);
            i++;
        } else if (!strcmp(a, "--threads")) {
            threads = parse_int(a, v, 1, 256);
            i++;
        } else if (!strcmp(a, "--reps")) {
            reps = parse_int(a, v, 1, 1000);
            i++;
        } else if (!strcmp(a, "--fp32-activations")) {
            int8 = false;
        } else if (!strcmp(a, "--no-pin")) {
            pin = false;
        } else {
            usage();
        }
    }
    if (cols % 256) {
        fprintf(stderr, "qmatmul-bench: --cols must be a multiple of 256 (whole super-blocks)\n");
        return 2;
    }

    size_t rb = sl_dtype_row_bytes(type, cols), wbytes = rb * (size_t)rows;
    unsigned char *w = aligned_alloc(64, (wbytes + 63) / 64 * 64);
    float *src = malloc(sizeof(float) * (size_t)cols);
    float *x = malloc(sizeof(float) * (size_t)cols * (size_t)batch);
    float *out = malloc(sizeof(float) * (size_t)rows * (size_t)batch);
    struct sl_cpu_pool *pool = sl_cpu_pool_new(threads, pin);
    if (!w || !src || !x || !out || !pool) {
        fprintf(stderr, "qmatmul-bench: out of memory\n");
        return 1;
    }
    unsigned long long seed = 42;
    for (int r = 0; r < rows; r++) {
        for (int j = 0; j < cols; j++)
            src[j] = rnd(&seed) * 0.05f;
        sl_cpu_quantize_row(type, w + rb * (size_t)r, src, cols);
    }
    for (size_t j = 0; j < (size_t)cols * (size_t)batch; j++)
        x[j] = rnd(&seed);
    sl_cpu_pool_set_int8(pool, int8);
    if (sl_cpu_pool_reserve(pool, batch, cols > rows ? cols : rows) != SL_OK) {
        fprintf(stderr, "qmatmul-bench: cannot reserve the pool's room\n");
        return 1;
    }
    struct sl_mat m = {.type = type, .data = w, .rows = rows, .cols = cols};

    /* Calls per pass: about 0.3 s, from one timed call. */
    double t0 = now_s();
    sl_cpu_matmul_mt(pool, out, x, &m, batch);
    double one = now_s() - t0;
    long calls = one > 0 ? (long)(0.3 / one) : 1000;
    calls = calls < 1 ? 1 : calls;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        t0 = now_s();
        for (long c = 0; c < calls; c++)
            sl_cpu_matmul_mt(pool, out, x, &m, batch);
        double dt = (now_s() - t0) / (double)calls;
        best = dt < best ? dt : best;
    }
    double checksum = 0;
    for (size_t i = 0; i < (size_t)rows * (size_t)batch; i++)
        checksum += out[i];
    printf("{\"type\": \"%s\", \"rows\": %d, \"cols\": %d, \"batch\": %d, \"threads\": %d, "
           "\"activations\": \"%s\", \"isa\": \"%s\", \"ms_per_call\": %.4f, "
           "\"gmac_s\": %.2f, \"weight_gb_s\": %.2f, \"weight_mib\": %.1f, \"checksum\": %.6g}\n",
           sl_dtype_name(type), rows, cols, batch, threads,
           int8 && sl_dtype_quantized(type) ? "int8" : "fp32", sl_cpu_isa_name(sl_cpu_isa()),
           best * 1e3, (double)rows * cols * batch / best / 1e9, (double)wbytes / best / 1e9,
           (double)wbytes / (1 << 20), checksum);
    sl_cpu_pool_free(pool);
    free(w);
    free(src);
    free(x);
    free(out);
    return 0;
}
