/* engine-bench: throughput of the engine against this machine's own ceilings, on the CPU or
 * (--device cuda[:N]) on a CUDA device.
 *
 * Prints one JSON object: prefill and decode tokens/s of a model (default synthetic:stories15M)
 * through the real worker interface (paged KV, varlen batches), and, measured in the same run,
 * the streaming read bandwidth and fp32 FMA peak (at the widest vectors the CPU has: fma_isa)
 * over the same number of threads, with the ceilings they imply:
 *   decode batch-1 ceiling = mem_bw / bytes of weights read per step (memory's rate, a 1 GiB
 *                            read), and step_bytes_bw / the same (a read of that many bytes:
 *                            the rate when a cache holds the weights between steps)
 *   FMA ceiling            = fma_gflops / (2 · weights multiplied per token)
 * A decode token multiplies every layer matrix and the classifier; a prefill token multiplies the
 * layer matrices only (the classifier runs for the prompt's last row alone). Both also pay for
 * attention: a row attending c positions does 2·c·head_size multiply-adds per query head and
 * layer (scores, then values), 4·c·dim flops per layer. A decode row at context C attends C
 * positions; prompt row p attends p + 1, (P + 1) / 2 on average. Softmax, norms and the other
 * element-wise work are not counted. The CPU backend runs the last layer past its QKV for the
 * sampled row alone, so it executes fewer flops than that count: the CPU JSON gives both
 * ("flops_per_prefill_token_executed", and "prefill_executed_vs_fma" beside "prefill_vs_fma").
 * With --isa forcing narrower kernels (AVX2 on an AVX-512 CPU), the peak of that instruction set
 * is measured too ("isa_fma_gflops") and the batch-32 and prefill rates are given against it as
 * well ("decode_32_vs_isa_fma", "prefill_vs_isa_fma"): how near the kernels come to what their
 * own vectors can do, beside how near to the machine's.
 *
 * On a CUDA device the same loops run through the CUDA backend, decode steps sampling greedily on
 * the device (only ids come back, as when serving), at batch 1, 16, 64 and 256; the ceilings are
 * the device's, measured in the same run: HBM bandwidth by a copy kernel (bytes read + written
 * over time) and dense BF16 GEMM throughput by cuBLAS (8192³, fp32 accumulate). Without a device
 * it fails at once with the reason. */
#include <sluice/kernels.h>
#include <sluice/worker.h>

#include "sl_build_config.h"

#if SL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    fprintf(stderr,
            "usage: engine-bench [--model SPEC] [--device cpu|cuda[:N]] [--threads N]\n"
            "                    [--prompt N] [--ctx N] [--isa scalar|avx2|avx512] [--reps N]\n"
            "                    [--kv-dtype f32|f16] [--no-pin] [--fp32-activations]\n"
            "  --model   model spec (default synthetic:stories15M)\n"
            "  --device  cpu (default) or a CUDA device: decode at batch 1, 16, 64, 256\n"
            "            against the device's copy bandwidth and BF16 GEMM ceilings\n"
            "  --threads kernel threads, 0 = one per CPU of the affinity mask (default 0)\n"
            "  --prompt  prefill prompt length (default min(512, seq_len); 2048 on CUDA)\n"
            "  --ctx     context of each decoding sequence (default 128)\n"
            "  --isa     force the kernels' instruction set (the ceilings stay the\n"
            "            machine's: the FMA peak is measured at its widest vectors;\n"
            "            isa_fma_gflops and the *_vs_isa_fma ratios are the forced one's)\n"
            "  --kv-dtype how the CPU backend stores K and V (default f16, the server's default)\n"
            "  --fp32-activations  quantized weights in the exact fp32 matmul, not 8-bit\n"
            "            activations (the server's cpu_int8_activations false)\n"
            "  --no-pin  leave the kernel threads unpinned (the server's pin_threads false)\n"
            "  --reps    timed repetitions per figure, best reported (default 5)\n"
            "  --only-decode B  run only decode at batch B (1, 4, 16, 32 or 64; on CUDA 1, 16,\n"
            "                   64 or 256), for a profiler\n"
            "  --only-prefill N run only N prefills of the prompt (mean and fastest), for a\n"
            "                   profiler or an A/B comparison\n"
            "  --batches LIST   CUDA: the decode batch sizes measured, ascending, at most 4 of\n"
            "                   them, each 1 to 256 (default 1,16,64,256)\n"
            "  --only-ceilings  CUDA: print the device's properties and ceilings, load no model\n"
            "  --profile        CUDA: time every launch (steps run without graphs) and print, for\n"
            "                   the prefill and each decode batch, the device ms per step by\n"
            "                   kind of launch instead of the figures\n");
    exit(2);
}

static double now_s(void)
{
    return (double)sl_clock_ns() * 1e-9;
}

/* A paired build (kernels.h; bench/paired.sh) on the CPU: forwards alternate between the old
 * kernels and this tree's (odd forwards new, even ones old), each side's forward time is summed,
 * and for decode steps its time per phase (worker.h); paired_report prints them on stderr at
 * exit. The JSON's figures are then those of both sides together. */
static struct {
    bool on;
    long n;                              /* forwards run */
    double fw_s[2];                      /* [old, new]: seconds in forwards */
    long fws[2];                         /* forwards */
    double phase_s[2][SL_WORKER_PHASES]; /* seconds per phase over decode steps */
    long steps[2];                       /* decode steps */
} paired;

static void paired_report(void)
{
    fflush(stdout); /* the JSON first, as when both go to a terminal */
    if (!paired.fws[0] || !paired.fws[1])
        return;
    double o = paired.fw_s[0] / paired.fws[0], n = paired.fw_s[1] / paired.fws[1];
    fprintf(stderr,
            "paired: forward old %.4f ms  new %.4f ms  new/old %.4f  (%ld / %ld forwards)\n",
            o * 1e3, n * 1e3, n / o, paired.fws[0], paired.fws[1]);
    if (!paired.steps[0] || !paired.steps[1])
        return;
    for (int p = 0; p < SL_WORKER_PHASES; p++) {
        o = paired.phase_s[0][p] / paired.steps[0];
        n = paired.phase_s[1][p] / paired.steps[1];
        fprintf(stderr, "paired: %-10s old %.3f ms  new %.3f ms  new/old %.3f\n",
                sl_worker_phase_name(p), o * 1e3, n * 1e3, n / o);
    }
}

/* sl_worker_forward, alternated and timed in a paired build; decode: b is a decode step. */
static int forward(struct sl_worker *w, const struct sl_batch *b, float *logits, bool decode)
{
    if (!paired.on)
        return sl_worker_forward(w, b, logits);
    int side = (int)(++paired.n & 1);
    sl_cpu_paired_use_old(side == 0);
    double t0 = now_s();
    int rc = sl_worker_forward(w, b, logits);
    paired.fw_s[side] += now_s() - t0;
    paired.fws[side]++;
    uint64_t ns[SL_WORKER_PHASES];
    sl_worker_bench_phases(w, ns);
    if (decode) {
        paired.steps[side]++;
        for (int p = 0; p < SL_WORKER_PHASES; p++)
            paired.phase_s[side][p] += (double)ns[p] * 1e-9;
    }
    return rc;
}

/* Best-of-reps GB/s of a streaming read of a buffer of `bytes` (a multiple of 256), read once
 * before the timed reads: 1 GiB is beyond any cache (memory's rate); a decode step's weight
 * bytes are what a cache that holds them between steps gives. */
static double measure_bw(struct sl_cpu_pool *p, int reps, size_t bytes)
{
    float *buf = aligned_alloc(64, bytes);
    if (!buf)
        return 0;
    for (size_t i = 0; i < bytes / sizeof(float); i++)
        buf[i] = 1.0f;
    double best = 1e30;
    volatile float sink = 0;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        sink += sl_cpu_bench_read(p, buf, bytes);
        double t = now_s() - t0;
        if (r > 0 && t < best)
            best = t;
    }
    free(buf);
    return (double)bytes / best / 1e9;
}

/* The fp32 FMA peak with isa's vectors (the kernels' ISA is put back after). */
static double measure_fma(struct sl_cpu_pool *p, int reps, enum sl_cpu_isa isa)
{
    long iters = 20000000;
    double best = 0;
    enum sl_cpu_isa kernels = sl_cpu_isa();
    sl_cpu_set_isa(isa);
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        double flops = sl_cpu_bench_fma(p, iters);
        double g = flops / (now_s() - t0) / 1e9;
        if (r > 0 && g > best)
            best = g;
    }
    sl_cpu_set_isa(kernels);
    return best;
}

#if SL_HAVE_CUDA
/* Milliseconds between two events recorded around `reps` launches of fn, best of 3 rounds. */
static double time_device(cudaStream_t st, int reps, int (*fn)(void *arg), void *arg)
{
    cudaEvent_t a, b;
    if (cudaEventCreate(&a) != cudaSuccess || cudaEventCreate(&b) != cudaSuccess)
        return 0;
    double best = 1e30;
    for (int round = 0; round < 4; round++) {
        cudaEventRecord(a, st);
        for (int i = 0; i < reps; i++)
            if (fn(arg) != SL_OK)
                return 0;
        cudaEventRecord(b, st);
        float ms = 0;
        if (cudaEventSynchronize(b) != cudaSuccess ||
            cudaEventElapsedTime(&ms, a, b) != cudaSuccess)
            return 0;
        if (round > 0 && ms / reps < best) /* round 0 warms up */
            best = ms / reps;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

struct copy_arg {
    void *dst, *src;
    size_t bytes;
    cudaStream_t st;
};

static int copy_once(void *arg)
{
    struct copy_arg *c = arg;
    return sl_cuda_bench_copy(c->dst, c->src, c->bytes, c->st);
}

struct gemm_arg {
    struct sl_cuda_blas *blas;
    float *out;
    void *x, *w;
    int n;
};

static int gemm_once(void *arg)
{
    struct gemm_arg *g = arg;
    return sl_cuda_gemm(g->blas, g->out, g->x, g->w, SL_DTYPE_BF16, g->n, g->n, g->n);
}

/* Fills dst, a device (rows, cols) bf16 matrix, with uniform values in [-1, 1) from seed: the
 * GEMM ceiling is measured on random operands, as constant ones switch fewer bits and run
 * faster than any model's weights would. */
static bool random_bf16(void *dst, size_t rows, size_t cols, uint64_t seed, cudaStream_t st)
{
    size_t n = rows * cols;
    float *h = malloc(n * sizeof(float)), *d = NULL;
    bool ok = h && cudaMalloc((void **)&d, n * sizeof(float)) == cudaSuccess;
    uint64_t r = seed * 0x9e3779b97f4a7c15ull | 1;
    for (size_t i = 0; ok && i < n; i++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        h[i] = (float)(r >> 40) * (2.0f / 16777216.0f) - 1.0f;
    }
    ok = ok && cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess &&
         sl_cuda_convert(dst, SL_DTYPE_BF16, d, SL_DTYPE_F32, rows, (int)cols, st) == SL_OK &&
         cudaStreamSynchronize(st) == cudaSuccess;
    cudaFree(d);
    free(h);
    return ok;
}

/* The device's ceilings: copy bandwidth in GB/s (2 GiB read and written) and dense BF16 GEMM
 * TFLOP/s (8192³). Returns false, with a message, when the device cannot run them. */
static bool device_ceilings(int device, double *gbs, double *tflops)
{
    cudaStream_t st;
    size_t bytes = (size_t)2 << 30;
    int n = 8192;
    void *a = NULL, *b = NULL, *x = NULL, *w = NULL;
    float *out = NULL;
    struct sl_cuda_blas *blas = NULL;
    bool ok = cudaSetDevice(device) == cudaSuccess && cudaStreamCreate(&st) == cudaSuccess &&
              cudaMalloc(&a, bytes) == cudaSuccess && cudaMalloc(&b, bytes) == cudaSuccess &&
              cudaMemset(a, 0, bytes) == cudaSuccess;
    if (ok) {
        struct copy_arg c = {b, a, bytes, st};
        double ms = time_device(st, 10, copy_once, &c);
        *gbs = ms > 0 ? 2.0 * (double)bytes / (ms * 1e-3) / 1e9 : 0;
        ok = ms > 0;
    }
    cudaFree(a);
    cudaFree(b);
    size_t sq = (size_t)n * n;
    ok = ok && cudaMalloc(&x, sq * 2) == cudaSuccess && cudaMalloc(&w, sq * 2) == cudaSuccess &&
         cudaMalloc((void **)&out, sq * 4) == cudaSuccess && random_bf16(x, n, n, 1, st) &&
         random_bf16(w, n, n, 2, st) && sl_cuda_blas_new(st, &blas) == SL_OK;
    if (ok) {
        struct gemm_arg g = {blas, out, x, w, n};
        double ms = time_device(st, 10, gemm_once, &g);
        *tflops = ms > 0 ? 2.0 * (double)sq * n / (ms * 1e-3) / 1e12 : 0;
        ok = ms > 0;
    }
    sl_cuda_blas_free(blas);
    cudaFree(x);
    cudaFree(w);
    cudaFree(out);
    if (!ok)
        fprintf(stderr, "engine-bench: device ceilings: %s / %s\n",
                cudaGetErrorString(cudaGetLastError()), sl_cuda_last_error());
    return ok;
}

/* --only-ceilings: the device's properties and its two ceilings as one JSON object. */
static int print_ceilings(int device)
{
    struct cudaDeviceProp p;
    int clock_khz = 0, mem_clock_khz = 0, bus_bits = 0;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) != cudaSuccess) {
        fprintf(stderr, "engine-bench: device %d: %s\n", device,
                cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    double gbs = 0, tflops = 0;
    if (!device_ceilings(device, &gbs, &tflops))
        return 1;
    printf("{\"name\": \"%.64s\", \"compute\": \"%d.%d\", \"sm_count\": %d, "
           "\"memory_gib\": %.1f, \"l2_mib\": %.1f, \"sm_clock_mhz\": %d, "
           "\"memory_clock_mhz\": %d, \"memory_bus_bits\": %d, \"driver_cuda\": \"%d.%d\", "
           "\"runtime_cuda\": \"%d.%d\", \"hbm_copy_gbs\": %.1f, \"bf16_gemm_tflops\": %.1f}\n",
           p.name, p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30),
           (double)p.l2CacheSize / (1 << 20), clock_khz / 1000, mem_clock_khz / 1000, bus_bits,
           driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10, gbs, tflops);
    return 0;
}

/* --profile: one member of "profile": the device ms per step of each kind of launch, the
 * launches per step, and the step's device ms and tokens/s by that measure. */
static void print_profile(const char *label, const struct sl_worker_profile *p, int tokens,
                          bool last)
{
    double steps = p->steps > 0 ? (double)p->steps : 1.0;
    printf("    \"%s\": {\"steps\": %ld, \"step_ms\": %.4f, \"tok_s\": %.1f, \"kinds\": {", label,
           p->steps, p->step_ms / steps, p->step_ms > 0 ? tokens * steps / (p->step_ms * 1e-3) : 0);
    for (int k = 0; k < p->n_kinds; k++)
        printf("%s\n      \"%s\": {\"ms\": %.4f, \"share\": %.3f, \"calls\": %.0f}", k ? "," : "",
               p->k[k].kind, p->k[k].ms / steps, p->step_ms > 0 ? p->k[k].ms / p->step_ms : 0,
               (double)p->k[k].calls / steps);
    printf("}}%s\n", last ? "" : ",");
}
#endif

/* The measured figures both devices report: "load_s" through "decode_tok_s_worst" over the
 * first nb batch sizes. */
static void print_runs(double t_load, int prompt, int ctx, double prefill, double prefill_worst,
                       const int *batches, const double *dec, const double *dec_worst, int nb)
{
    printf("  \"load_s\": %.3f,\n", t_load);
    printf("  \"prompt_tokens\": %d,\n", prompt);
    printf("  \"decode_context\": %d,\n", ctx);
    printf("  \"prefill_tok_s\": %.1f,\n", prefill);
    printf("  \"prefill_tok_s_worst\": %.1f,\n", prefill_worst);
    printf("  \"decode_tok_s\": {");
    for (int bi = 0; bi < nb; bi++)
        printf("%s\"%d\": %.1f", bi ? ", " : "", batches[bi], dec[bi]);
    printf("},\n  \"decode_tok_s_worst\": {");
    for (int bi = 0; bi < nb; bi++)
        printf("%s\"%d\": %.1f", bi ? ", " : "", batches[bi], dec_worst[bi]);
    printf("},\n");
}

/* The work per step and token the ceilings divide: "weight_bytes_per_step" through
 * "flops_per_prefill_token". */
static void print_work(const struct sl_model_work *ws, double flops_decode_tok,
                       double flops_prefill_tok)
{
    printf("  \"weight_bytes_per_step\": %.0f,\n", ws->weight_bytes);
    printf("  \"params_per_decode_token\": %.0f,\n", ws->decode_params);
    printf("  \"params_per_prefill_token\": %.0f,\n", ws->layer_params);
    printf("  \"flops_per_decode_token\": %.0f,\n", flops_decode_tok);
    printf("  \"flops_per_prefill_token\": %.0f,\n", flops_prefill_tok);
}

/* "name": v as a JSON member line, null where nothing was measured (v not positive). */
static void print_num(const char *name, double v)
{
    if (isfinite(v) && v > 0)
        printf("  \"%s\": %.1f,\n", name, v);
    else
        printf("  \"%s\": null,\n", name);
}

/* "name": num / den inside the ratios object, null where den is not positive. */
static void print_ratio(const char *name, double num, double den)
{
    if (den > 0 && isfinite(num / den))
        printf("\"%s\": %.3f", name, num / den);
    else
        printf("\"%s\": null", name);
}

#define BLOCK 16
#define NB 5 /* decode batch sizes measured */

/* --batches LIST into out[NB]: 1 to NB - 1 ascending sizes in [1, 256], zeros after. */
static bool parse_batches(const char *list, int *out)
{
    int n = 0;
    const char *p = list;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || n == NB - 1 || (n > 0 && v <= out[n - 1]))
            return false;
        out[n++] = (int)v;
        if (*end == ',' && end[1])
            end++;
        else if (*end)
            return false;
        p = end;
    }
    for (int i = n; i < NB; i++)
        out[i] = 0;
    return n > 0;
}

int main(int argc, char **argv)
{
    const char *spec = "synthetic:stories15M", *device = "cpu";
    int threads = 0, prompt = 0, ctx = 128, reps = 5, only = 0, only_prefill = 0;
    enum sl_kv_dtype kv_dtype = SL_KV_F16;
    bool pin = true, only_ceilings = false, profile = false, fp32_act = false;
    const char *batch_list = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--no-pin") == 0) {
            pin = false;
            continue;
        }
        if (strcmp(a, "--only-ceilings") == 0) {
            only_ceilings = true;
            continue;
        }
        if (strcmp(a, "--profile") == 0) {
            profile = true;
            continue;
        }
        if (strcmp(a, "--fp32-activations") == 0) {
            fp32_act = true;
            continue;
        }
        if (!v)
            usage();
        if (strcmp(a, "--model") == 0)
            spec = v;
        else if (strcmp(a, "--device") == 0)
            device = v;
        else if (strcmp(a, "--threads") == 0)
            threads = atoi(v);
        else if (strcmp(a, "--prompt") == 0)
            prompt = atoi(v);
        else if (strcmp(a, "--ctx") == 0)
            ctx = atoi(v);
        else if (strcmp(a, "--only-decode") == 0)
            only = atoi(v);
        else if (strcmp(a, "--only-prefill") == 0)
            only_prefill = atoi(v) > 0 ? atoi(v) : 1;
        else if (strcmp(a, "--batches") == 0)
            batch_list = v;
        else if (strcmp(a, "--reps") == 0)
            reps = atoi(v) > 0 ? atoi(v) : 1;
        else if (strcmp(a, "--kv-dtype") == 0) {
            if (strcmp(v, "f32") != 0 && strcmp(v, "f16") != 0)
                usage();
            kv_dtype = strcmp(v, "f32") == 0 ? SL_KV_F32 : SL_KV_F16;
        } else if (strcmp(a, "--isa") == 0) {
            enum sl_cpu_isa isa = SL_CPU_ISA_SCALAR;
            while (isa <= SL_CPU_ISA_AVX512 && strcmp(v, sl_cpu_isa_name(isa)) != 0)
                isa++;
            if (isa > SL_CPU_ISA_AVX512)
                usage();
            if (sl_cpu_set_isa(isa) != SL_OK) {
                fprintf(stderr, "engine-bench: this CPU has no %s\n", v);
                return 1;
            }
        } else
            usage();
        i++;
    }
    char err[512];
    struct sl_worker_device dev;
    if (sl_worker_device_select(device, &dev, err, sizeof err) != SL_OK) {
        fprintf(stderr, "engine-bench: %s\n", err);
        return 1;
    }
    bool cuda = dev.index >= 0;
    if ((only_ceilings || batch_list || profile) && !cuda) {
        fprintf(stderr, "engine-bench: --only-ceilings, --batches and --profile need --device "
                        "cuda\n");
        return 2;
    }
#if SL_HAVE_CUDA
    if (only_ceilings)
        return print_ceilings(dev.index);
#endif
    /* Decode batch sizes: the CPU's up to 64, a GPU's up to 256 (or --batches). */
    static const int cpu_batches[NB] = {1, 4, 16, 32, 64};
    int gpu_batches[NB] = {1, 16, 64, 256, 0};
    if (batch_list && !parse_batches(batch_list, gpu_batches)) {
        fprintf(stderr,
                "engine-bench: --batches \"%s\": 1 to 4 ascending sizes from 1 to 256, "
                "separated by commas\n",
                batch_list);
        return 2;
    }
    const int *batches = cuda ? gpu_batches : cpu_batches;
    int n_gpu = 0;
    while (n_gpu < NB && gpu_batches[n_gpu])
        n_gpu++;
    int MAX_B = cuda ? gpu_batches[n_gpu - 1] : 64;
    int only_bi = 0; /* --only-decode's index in batches */
    while (only && only_bi < NB && batches[only_bi] != only)
        only_bi++;
    if (only && (only_bi == NB || only <= 0)) {
        fprintf(stderr, "engine-bench: --only-decode takes one of the batch sizes measured:");
        for (int bi = 0; bi < NB && batches[bi]; bi++)
            fprintf(stderr, " %d", batches[bi]);
        fprintf(stderr, "\n");
        return 2;
    }
#if SL_HAVE_CUDA
    struct sl_worker_profile prof_prefill = {0}, prof_dec[NB] = {0};
#endif
    struct sl_model *m = NULL;
    double t_load = now_s();
    if (sl_model_load(spec, NULL, &m, err, sizeof(err)) != SL_OK) {
        fprintf(stderr, "engine-bench: %s\n", err);
        return 1;
    }
    t_load = now_s() - t_load;
    const struct sl_model_config *cfg = sl_model_config(m);
    if (prompt <= 0) {
        int want = cuda ? 2048 : 512;
        prompt = cfg->seq_len < want ? cfg->seq_len : want;
    }
    if (prompt > cfg->seq_len || ctx < 1 || ctx > cfg->seq_len) {
        fprintf(stderr, "engine-bench: --prompt and --ctx must be within seq_len %d\n",
                cfg->seq_len);
        return 1;
    }

    int nth = 0;
    double bw = 0, gflops = 0, isa_gflops = 0;
    if (cuda) {
#if SL_HAVE_CUDA
        /* bw: GB/s of the copy kernel; gflops: GFLOP/s of the BF16 GEMM. */
        double tflops = 0;
        if (!only && !only_prefill && !profile && !device_ceilings(dev.index, &bw, &tflops))
            return 1;
        gflops = tflops * 1e3;
#endif
    } else {
        struct sl_cpu_pool *pool = sl_cpu_pool_new(threads, pin);
        nth = sl_cpu_pool_threads(pool);
        bool skip = only || only_prefill;
        bw = skip ? 0 : measure_bw(pool, reps, (size_t)1 << 30);
        /* The machine's peak at its widest vectors, whatever ISA the kernels were forced onto,
         * so that a forced narrower path is measured against the same ceiling; and the peak of
         * the kernels' own ISA beside it. */
        gflops = skip ? 0 : measure_fma(pool, reps, sl_cpu_isa_best());
        isa_gflops = skip                                ? 0
                     : sl_cpu_isa() == sl_cpu_isa_best() ? gflops
                                                         : measure_fma(pool, reps, sl_cpu_isa());
        sl_cpu_pool_free(pool);
    }

    /* MAX_B decoding sequences of ctx positions and one prompt, in a KV pool that holds them. */
    struct sl_worker_bench *bench = NULL;
    if (sl_worker_bench_new(m, MAX_B, ctx, prompt, BLOCK, &bench) != SL_OK) {
        fprintf(stderr, "engine-bench: bad batch layout\n");
        return 1;
    }
    struct sl_backend_opts o = {.threads = threads,
                                .no_pin = !pin,
                                .device = dev.index,
                                .profile = profile,
                                .kv_dtype = kv_dtype,
                                .float_activations = fp32_act};
    sl_worker_bench_opts(bench, &o);
    struct sl_worker *w = NULL;
    int rc = sl_worker_new(m, dev.ops, &o, &w);
    if (rc != SL_OK) {
        fprintf(stderr, "engine-bench: worker: %s\n", sl_status_str(rc));
        return 1;
    }
    if (!cuda && sl_cpu_paired_built()) {
        paired.on = true;
        sl_worker_bench_time_phases(w, true);
        atexit(paired_report);
    }
    int32_t *ids = malloc((size_t)MAX_B * sizeof(int32_t));
    struct sl_sample_row *greedy = calloc((size_t)MAX_B, sizeof(*greedy));
    for (int i = 0; i < MAX_B; i++)
        greedy[i].p = (struct sl_sampling){.temperature = 0.0f, .top_p = 1.0f};
    /* Logits for the most rows a batch samples: a decode step's. */
    float *logits = malloc((size_t)MAX_B * (size_t)cfg->vocab_size * sizeof(float));

    /* Prefill: one prompt, logits for its last row. */
    const struct sl_batch *pb = sl_worker_bench_prompt(bench);
    double best = 1e30, worst = 0;
    for (int r = 0; r < (only ? 0 : reps + 1); r++) {
        double t0 = now_s();
        if (forward(w, pb, logits, false) != SL_OK)
            return 1;
        double t = now_s() - t0;
        if (r > 0) {
            best = t < best ? t : best;
            worst = t > worst ? t : worst;
        }
#if SL_HAVE_CUDA
        if (profile && r == 0) /* the first (modules load, cuBLAS chooses) is not counted */
            sl_worker_bench_profile(w, &prof_prefill);
#endif
    }
    double prefill = prompt / best, prefill_worst = prompt / worst;
#if SL_HAVE_CUDA
    if (profile)
        sl_worker_bench_profile(w, &prof_prefill);
#endif
    if (only_prefill) {
        double t0 = now_s(), fastest = 1e30;
        for (int r = 0; r < only_prefill; r++) {
            double t1 = now_s();
            if (forward(w, pb, logits, false) != SL_OK)
                return 1;
            t1 = now_s() - t1;
            fastest = t1 < fastest ? t1 : fastest;
        }
        printf("{\"prefill_tok_s\": %.1f, \"prefill_tok_s_best\": %.1f}\n",
               prompt * only_prefill / (now_s() - t0), prompt / fastest);
        return 0;
    }

    /* Decode contexts: every sequence prefilled to ctx - 1 positions, a few at a time. */
    for (int s0 = 0, ns = 0; s0 < (only ? only : MAX_B); s0 += ns) {
        const struct sl_batch *cb = sl_worker_bench_context(bench, s0, &ns);
        if (!cb)
            break;
        if (forward(w, cb, logits, false) != SL_OK)
            return 1;
    }
    double dec[NB] = {0}, dec_worst[NB] = {0};
    for (int bi = 0; bi < NB; bi++) {
        int B = batches[bi];
        if (B == 0 || (only && B != only)) {
            dec[bi] = dec_worst[bi] = 0;
            continue;
        }
        const struct sl_batch *b = sl_worker_bench_decode(bench, B);
        /* On a device, decode steps sample there (ids only come back), as when serving. The
         * first two steps also capture the step as a CUDA graph. */
#define STEP() (cuda ? sl_worker_forward_sample(w, b, greedy, ids) : forward(w, b, logits, true))
        /* Steps per repetition: about 0.3 s of work at the expected rate, at least 3. */
        if (STEP() != SL_OK || STEP() != SL_OK)
            return 1;
        double t0 = now_s();
        if (STEP() != SL_OK)
            return 1;
        double one = now_s() - t0;
        int steps = (int)((only ? 3.0 : 0.3) / (one > 1e-6 ? one : 1e-6));
        steps = steps < 3 ? 3 : steps;
        double bt = 1e30, wt = 0;
#if SL_HAVE_CUDA
        if (profile) /* the steps before these are not counted */
            sl_worker_bench_profile(w, &prof_dec[bi]);
#endif
        for (int r = 0; r < reps; r++) {
            t0 = now_s();
            for (int i = 0; i < steps; i++)
                if (STEP() != SL_OK)
                    return 1;
            double t = (now_s() - t0) / steps;
            bt = t < bt ? t : bt;
            wt = t > wt ? t : wt;
        }
#undef STEP
        dec[bi] = B / bt;
        dec_worst[bi] = B / wt;
#if SL_HAVE_CUDA
        if (profile)
            sl_worker_bench_profile(w, &prof_dec[bi]);
#endif
    }

    if (only) {
        /* The one figure measured, as --only-prefill prints its own. */
        printf("{\"decode_tok_s\": {\"%d\": %.1f}, \"decode_tok_s_worst\": {\"%d\": %.1f}}\n", only,
               dec[only_bi], only, dec_worst[only_bi]);
        return 0;
    }

#if SL_HAVE_CUDA
    if (profile) {
        printf("{\n  \"model\": \"%s\",\n  \"device\": \"%s\",\n  \"decode_context\": %d,\n",
               sl_model_id(m), dev.name, ctx);
        printf("  \"profile\": {\n");
        char label[32];
        snprintf(label, sizeof label, "prefill_%d", prompt);
        print_profile(label, &prof_prefill, prompt, n_gpu == 0);
        for (int bi = 0; bi < n_gpu; bi++) {
            snprintf(label, sizeof label, "decode_%d", batches[bi]);
            print_profile(label, &prof_dec[bi], batches[bi], bi == n_gpu - 1);
        }
        printf("  }\n}\n");
        sl_worker_free(w);
        sl_model_free(m);
        return 0;
    }
#endif
    struct sl_model_work ws;
    sl_model_bench_work(m, &ws);
    double attn = 4.0 * cfg->dim * cfg->n_layers; /* flops per attended position of a row */
    double flops_decode_tok = 2 * ws.decode_params + attn * ctx;
    double flops_prefill_tok = 2 * ws.layer_params + attn * (prompt + 1) / 2.0;
    if (cuda) {
        /* The device holds an all-F32 model as F32 and any other as 16-bit values; its KV
         * blocks are in the same type, which tells which. */
        bool f32 =
            dev.ops->kv_block_bytes(m, 1, SL_KV_F32) == sl_model_kv_block_bytes(m, 1, SL_KV_F32);
        ws.weight_bytes = ws.decode_params * (f32 ? 4 : 2);
        double bw_ceiling = bw * 1e9 / ws.weight_bytes;
        double flops_decode = gflops * 1e9 / flops_decode_tok;
        double flops_prefill = gflops * 1e9 / flops_prefill_tok;
        printf("{\n");
        printf("  \"model\": \"%s\",\n", sl_model_id(m));
        printf("  \"device\": \"%s\",\n", dev.name);
        printf("  \"weight_type\": \"%s\",\n", f32 ? "f32" : ws.weight_type);
        print_runs(t_load, prompt, ctx, prefill, prefill_worst, batches, dec, dec_worst, n_gpu);
        printf("  \"hbm_copy_gbs\": %.1f,\n", bw);
        printf("  \"bf16_gemm_tflops\": %.1f,\n", gflops / 1e3);
        print_work(&ws, flops_decode_tok, flops_prefill_tok);
        /* Batch B decodes cannot beat reading the weights once per step (B · bw ceiling) nor
         * the GEMM rate (flops ceiling): the lower of the two. */
        printf("  \"decode_ceiling_tok_s\": {");
        for (int bi = 0; bi < n_gpu; bi++) {
            double c = batches[bi] * bw_ceiling;
            printf("%s\"%d\": %.1f", bi ? ", " : "", batches[bi],
                   c < flops_decode ? c : flops_decode);
        }
        printf("},\n");
        printf("  \"prefill_gemm_ceiling_tok_s\": %.1f,\n", flops_prefill);
        printf("  \"ratios\": {");
        print_ratio("decode_1_vs_bw", batches[0] == 1 ? dec[0] : NAN, bw_ceiling);
        printf(", \"prefill_vs_gemm\": %.3f}\n", prefill / flops_prefill);
        printf("}\n");
    } else {
        double bw_ceiling = bw * 1e9 / ws.weight_bytes;
        /* The same read over the step's weight bytes: on a host whose cache holds them (this
         * one's L3 was reported as 480 MiB), batch 1 is bound by that rate, not memory's. */
        double ws_bw = 0;
        if (!only && !only_prefill) {
            struct sl_cpu_pool *pool = sl_cpu_pool_new(threads, pin);
            ws_bw = measure_bw(pool, reps, ((size_t)ws.weight_bytes + 255) / 256 * 256);
            sl_cpu_pool_free(pool);
        }
        double ws_ceiling = ws_bw * 1e9 / ws.weight_bytes;
        double fma_decode = gflops * 1e9 / flops_decode_tok;
        double fma_prefill = gflops * 1e9 / flops_prefill_tok;
        /* The CPU backend runs the last layer past its QKV only for the row that samples: per
         * prompt token, the flops it does not execute of those counted above. */
        double skipped =
            (prompt - 1.0) / prompt * 2 * ws.last_tail_params + 4.0 * cfg->dim * (prompt - 1) / 2.0;
        double flops_prefill_run = flops_prefill_tok - skipped;
        printf("{\n");
        printf("  \"model\": \"%s\",\n", sl_model_id(m));
        printf("  \"weight_type\": \"%s\",\n", ws.weight_type);
        printf("  \"isa\": \"%s\",\n", sl_cpu_isa_name(sl_cpu_isa()));
        printf("  \"threads\": %d,\n", nth);
        printf("  \"kv_dtype\": \"%s\",\n", sl_kv_dtype_name(kv_dtype));
        printf("  \"int8_activations\": %s,\n", fp32_act ? "false" : "true");
        print_runs(t_load, prompt, ctx, prefill, prefill_worst, batches, dec, dec_worst, NB);
        printf("  \"mem_bw_gbs\": %.2f,\n", bw);
        printf("  \"step_bytes_bw_gbs\": %.2f,\n", ws_bw);
        printf("  \"fma_gflops\": %.1f,\n", gflops);
        printf("  \"fma_isa\": \"%s\",\n", sl_cpu_isa_name(sl_cpu_isa_best()));
        /* The peak of the kernels' own instruction set (fma_gflops unless --isa forced a
         * narrower one; null for the scalar kernels, which have no FMA loop to measure). */
        print_num("isa_fma_gflops", isa_gflops);
        print_work(&ws, flops_decode_tok, flops_prefill_tok);
        printf("  \"decode_bw_ceiling_tok_s\": %.1f,\n", bw_ceiling);
        printf("  \"decode_step_bytes_bw_ceiling_tok_s\": %.1f,\n", ws_ceiling);
        printf("  \"decode_fma_ceiling_tok_s\": %.1f,\n", fma_decode);
        printf("  \"prefill_fma_ceiling_tok_s\": %.1f,\n", fma_prefill);
        printf("  \"flops_per_prefill_token_executed\": %.0f,\n", flops_prefill_run);
        printf("  \"ratios\": {\"decode_1_vs_bw\": %.3f, \"decode_1_vs_step_bytes_bw\": %.3f, "
               "\"decode_32_vs_fma\": %.3f, \"decode_64_vs_fma\": %.3f, \"prefill_vs_fma\": %.3f, "
               "\"prefill_executed_vs_fma\": %.3f, ",
               dec[0] / bw_ceiling, dec[0] / ws_ceiling, dec[3] / fma_decode, dec[4] / fma_decode,
               prefill / fma_prefill, prefill * flops_prefill_run / (gflops * 1e9));
        double isa_fma = isa_gflops * 1e9;
        print_ratio("decode_32_vs_isa_fma", dec[3] * flops_decode_tok, isa_fma);
        printf(", ");
        print_ratio("prefill_vs_isa_fma", prefill * flops_prefill_tok, isa_fma);
        printf("}\n");
        printf("}\n");
    }
    sl_worker_free(w);
    sl_worker_bench_free(bench);
    sl_model_free(m);
    free(logits);
    free(ids);
    free(greedy);
    return 0;
}
