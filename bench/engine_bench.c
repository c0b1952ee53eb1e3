/* engine-bench: throughput of the CPU engine against this machine's own ceilings.
 *
 * Prints one JSON object: prefill and decode tokens/s of a model (default synthetic:stories15M)
 * through the real worker interface (paged KV, varlen batches), and, measured in the same run,
 * the streaming read bandwidth and fp32 FMA peak over the same number of threads, with the
 * ceilings they imply:
 *   decode batch-1 ceiling = mem_bw / bytes of weights read per step
 *   FMA ceiling            = fma_gflops / (2 · weights multiplied per token)
 * A decode token multiplies every layer matrix and the classifier; a prefill token multiplies the
 * layer matrices only (the classifier runs for the prompt's last row alone). Both also pay for
 * attention: a row attending c positions does 2·c·head_size multiply-adds per query head and
 * layer (scores, then values), 4·c·dim flops per layer. A decode row at context C attends C
 * positions; prompt row p attends p + 1, (P + 1) / 2 on average. Softmax, norms and the other
 * element-wise work are not counted. */
#include "worker_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    fprintf(stderr,
            "usage: engine-bench [--model SPEC] [--threads N] [--prompt N] [--ctx N]\n"
            "                    [--isa scalar|avx2] [--reps N]\n"
            "  --model   model spec (default synthetic:stories15M)\n"
            "  --threads kernel threads, 0 = all cores (default 0)\n"
            "  --prompt  prefill prompt length (default min(512, seq_len))\n"
            "  --ctx     context of each decoding sequence (default 128)\n"
            "  --isa     force the kernels' instruction set\n"
            "  --reps    timed repetitions per figure, best reported (default 5)\n"
            "  --only-decode B  run only decode at batch B, for a profiler\n"
            "  --only-prefill N run only N prefills of the prompt (mean and fastest), for a\n"
            "                   profiler or an A/B comparison\n");
    exit(2);
}

static double now_s(void)
{
    return (double)sl_clock_ns() * 1e-9;
}

/* Best-of-reps GB/s of a streaming read of a 1 GiB buffer (far beyond any cache). */
static double measure_bw(struct sl_cpu_pool *p, int reps)
{
    size_t bytes = (size_t)1 << 30;
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

static double measure_fma(struct sl_cpu_pool *p, int reps)
{
    long iters = 20000000;
    double best = 0;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        double flops = sl_cpu_bench_fma(p, iters);
        double g = flops / (now_s() - t0) / 1e9;
        if (r > 0 && g > best)
            best = g;
    }
    return best;
}

struct mat_sums {
    double bytes;  /* bytes read per decode step */
    double layer;  /* layer-matrix weights */
    double decode; /* weights multiplied per decode token */
};

static void add_mat(struct mat_sums *s, const struct sl_mat *m, bool layer)
{
    s->bytes += (double)m->rows * (double)sl_dtype_row_bytes(m->type, m->cols);
    double n = (double)m->rows * m->cols;
    s->decode += n;
    if (layer)
        s->layer += n;
}

static struct mat_sums weight_sums(const struct sl_model *m)
{
    struct mat_sums s = {0};
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct sl_layer_weights *L = &m->w.layers[l];
        const struct sl_mat *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3};
        for (int i = 0; i < 7; i++)
            add_mat(&s, ms[i], true);
    }
    add_mat(&s, &m->w.wcls, false);
    return s;
}

#define BLOCK 16
#define MAX_B 64

int main(int argc, char **argv)
{
    const char *spec = "synthetic:stories15M";
    int threads = 0, prompt = 0, ctx = 128, reps = 5, only = 0, only_prefill = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        if (strcmp(a, "--model") == 0)
            spec = v;
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
        else if (strcmp(a, "--reps") == 0)
            reps = atoi(v) > 0 ? atoi(v) : 1;
        else if (strcmp(a, "--isa") == 0) {
            enum sl_cpu_isa isa = strcmp(v, "scalar") == 0 ? SL_CPU_ISA_SCALAR : SL_CPU_ISA_AVX2;
            if (sl_cpu_set_isa(isa) != SL_OK) {
                fprintf(stderr, "engine-bench: this CPU has no %s\n", v);
                return 1;
            }
        } else
            usage();
        i++;
    }
    struct sl_model *m = NULL;
    char err[512];
    double t_load = now_s();
    if (sl_model_load(spec, NULL, &m, err, sizeof(err)) != SL_OK) {
        fprintf(stderr, "engine-bench: %s\n", err);
        return 1;
    }
    t_load = now_s() - t_load;
    const struct sl_model_config *cfg = sl_model_config(m);
    if (prompt <= 0)
        prompt = cfg->seq_len < 512 ? cfg->seq_len : 512;
    if (prompt > cfg->seq_len || ctx < 1 || ctx > cfg->seq_len) {
        fprintf(stderr, "engine-bench: --prompt and --ctx must be within seq_len %d\n",
                cfg->seq_len);
        return 1;
    }

    struct sl_cpu_pool *pool = sl_cpu_pool_new(threads);
    int nth = sl_cpu_pool_threads(pool);
    bool skip = only || only_prefill;
    double bw = skip ? 0 : measure_bw(pool, reps), gflops = skip ? 0 : measure_fma(pool, reps);
    sl_cpu_pool_free(pool);

    /* Sequence s owns blocks [s·per_seq, (s+1)·per_seq); the prefill sequence comes after. */
    int per_seq = (ctx + BLOCK - 1) / BLOCK, prompt_blocks = (prompt + BLOCK - 1) / BLOCK;
    int cap = prompt > MAX_B ? prompt : MAX_B;
    struct sl_backend_opts o = {.n_kv_blocks = MAX_B * per_seq + prompt_blocks,
                                .block_size = BLOCK,
                                .max_batch_tokens = cap,
                                .max_seqs = MAX_B,
                                .threads = threads};
    struct sl_worker *w = NULL;
    int rc = sl_worker_new(m, &sl_cpu_backend_ops, &o, &w);
    if (rc != SL_OK) {
        fprintf(stderr, "engine-bench: worker: %s\n", sl_status_str(rc));
        return 1;
    }
    int V = cfg->vocab_size;
    int32_t *tokens = malloc((size_t)cap * 4), *pos = malloc((size_t)cap * 4);
    int32_t *seq = malloc((size_t)cap * 4), *rows = malloc((size_t)cap * 4);
    int32_t *tables = malloc((size_t)(MAX_B + 1) * (size_t)(per_seq + prompt_blocks) * 4);
    const int32_t *tab[MAX_B];
    int32_t ctx_len[MAX_B];
    float *logits = malloc((size_t)cap * (size_t)V * sizeof(float));
    uint64_t rng = 0x5eed;
    for (int i = 0; i < cap; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((rng >> 33) % (uint64_t)V);
    }

    /* Prefill: one prompt, logits for its last row. */
    int32_t *ptable = tables + (size_t)MAX_B * per_seq;
    for (int i = 0; i < prompt_blocks; i++)
        ptable[i] = MAX_B * per_seq + i;
    for (int i = 0; i < prompt; i++) {
        pos[i] = i;
        seq[i] = 0;
    }
    tab[0] = ptable;
    ctx_len[0] = prompt;
    rows[0] = prompt - 1;
    struct sl_batch pb = {.n_tokens = prompt,
                          .tokens = tokens,
                          .pos = pos,
                          .seq = seq,
                          .n_seqs = 1,
                          .block_tables = tab,
                          .ctx_len = ctx_len,
                          .n_logits = 1,
                          .logit_rows = rows};
    double best = 1e30, worst = 0;
    for (int r = 0; r < (only ? 0 : reps + 1); r++) {
        double t0 = now_s();
        if (sl_worker_forward(w, &pb, logits) != SL_OK)
            return 1;
        double t = now_s() - t0;
        if (r > 0) {
            best = t < best ? t : best;
            worst = t > worst ? t : worst;
        }
    }
    double prefill = prompt / best, prefill_worst = prompt / worst;
    if (only_prefill) {
        double t0 = now_s(), fastest = 1e30;
        for (int r = 0; r < only_prefill; r++) {
            double t1 = now_s();
            if (sl_worker_forward(w, &pb, logits) != SL_OK)
                return 1;
            t1 = now_s() - t1;
            fastest = t1 < fastest ? t1 : fastest;
        }
        printf("{\"prefill_tok_s\": %.1f, \"prefill_tok_s_best\": %.1f}\n",
               prompt * only_prefill / (now_s() - t0), prompt / fastest);
        return 0;
    }

    /* Decode contexts: every sequence prefilled to ctx - 1 positions, a few at a time. */
    for (int s = 0; s < MAX_B; s++)
        for (int i = 0; i < per_seq; i++)
            tables[(size_t)s * per_seq + i] = s * per_seq + i;
    for (int s0 = 0; s0 < (only ? only : MAX_B);) {
        int nt = 0, ns = 0;
        while (s0 + ns < MAX_B && nt + (ctx - 1) <= cap && ns < MAX_B) {
            for (int i = 0; i < ctx - 1; i++) {
                pos[nt] = i;
                seq[nt++] = ns;
            }
            tab[ns] = tables + (size_t)(s0 + ns) * per_seq;
            ctx_len[ns] = ctx - 1;
            ns++;
        }
        if (ns == 0 || ctx == 1) {
            s0 = MAX_B;
            break;
        }
        struct sl_batch b = {.n_tokens = nt,
                             .tokens = tokens,
                             .pos = pos,
                             .seq = seq,
                             .n_seqs = ns,
                             .block_tables = tab,
                             .ctx_len = ctx_len,
                             .n_logits = 0,
                             .logit_rows = rows};
        if (sl_worker_forward(w, &b, logits) != SL_OK)
            return 1;
        s0 += ns;
    }
    static const int batches[] = {1, 4, 16, 32, 64};
    double dec[5], dec_worst[5];
    for (int bi = 0; bi < 5; bi++) {
        int B = batches[bi];
        if (only && B != only) {
            dec[bi] = dec_worst[bi] = 0;
            continue;
        }
        for (int s = 0; s < B; s++) {
            pos[s] = ctx - 1;
            seq[s] = s;
            rows[s] = s;
            tab[s] = tables + (size_t)s * per_seq;
            ctx_len[s] = ctx;
        }
        struct sl_batch b = {.n_tokens = B,
                             .tokens = tokens,
                             .pos = pos,
                             .seq = seq,
                             .n_seqs = B,
                             .block_tables = tab,
                             .ctx_len = ctx_len,
                             .n_logits = B,
                             .logit_rows = rows};
        /* Steps per repetition: about 0.3 s of work at the expected rate, at least 3. */
        if (sl_worker_forward(w, &b, logits) != SL_OK)
            return 1;
        double t0 = now_s();
        if (sl_worker_forward(w, &b, logits) != SL_OK)
            return 1;
        double one = now_s() - t0;
        int steps = (int)((only ? 3.0 : 0.3) / (one > 1e-6 ? one : 1e-6));
        steps = steps < 3 ? 3 : steps;
        double bt = 1e30, wt = 0;
        for (int r = 0; r < reps; r++) {
            t0 = now_s();
            for (int i = 0; i < steps; i++)
                if (sl_worker_forward(w, &b, logits) != SL_OK)
                    return 1;
            double t = (now_s() - t0) / steps;
            bt = t < bt ? t : bt;
            wt = t > wt ? t : wt;
        }
        dec[bi] = B / bt;
        dec_worst[bi] = B / wt;
    }

    struct mat_sums ws = weight_sums(m);
    double attn = 4.0 * cfg->dim * cfg->n_layers; /* flops per attended position of a row */
    double flops_decode = 2 * ws.decode + attn * ctx;
    double flops_prefill = 2 * ws.layer + attn * (prompt + 1) / 2.0;
    double bw_ceiling = bw * 1e9 / ws.bytes;
    double fma_decode = gflops * 1e9 / flops_decode;
    double fma_prefill = gflops * 1e9 / flops_prefill;
    printf("{\n");
    printf("  \"model\": \"%s\",\n", sl_model_id(m));
    printf("  \"weight_type\": \"%s\",\n", sl_dtype_name(m->w.layers[0].wq.type));
    printf("  \"isa\": \"%s\",\n", sl_cpu_isa_name(sl_cpu_isa()));
    printf("  \"threads\": %d,\n", nth);
    printf("  \"load_s\": %.3f,\n", t_load);
    printf("  \"prompt_tokens\": %d,\n", prompt);
    printf("  \"decode_context\": %d,\n", ctx);
    printf("  \"prefill_tok_s\": %.1f,\n", prefill);
    printf("  \"prefill_tok_s_worst\": %.1f,\n", prefill_worst);
    printf("  \"decode_tok_s\": {");
    for (int bi = 0; bi < 5; bi++)
        printf("%s\"%d\": %.1f", bi ? ", " : "", batches[bi], dec[bi]);
    printf("},\n  \"decode_tok_s_worst\": {");
    for (int bi = 0; bi < 5; bi++)
        printf("%s\"%d\": %.1f", bi ? ", " : "", batches[bi], dec_worst[bi]);
    printf("},\n");
    printf("  \"mem_bw_gbs\": %.2f,\n", bw);
    printf("  \"fma_gflops\": %.1f,\n", gflops);
    printf("  \"weight_bytes_per_step\": %.0f,\n", ws.bytes);
    printf("  \"params_per_decode_token\": %.0f,\n", ws.decode);
    printf("  \"params_per_prefill_token\": %.0f,\n", ws.layer);
    printf("  \"flops_per_decode_token\": %.0f,\n", flops_decode);
    printf("  \"flops_per_prefill_token\": %.0f,\n", flops_prefill);
    printf("  \"decode_bw_ceiling_tok_s\": %.1f,\n", bw_ceiling);
    printf("  \"decode_fma_ceiling_tok_s\": %.1f,\n", fma_decode);
    printf("  \"prefill_fma_ceiling_tok_s\": %.1f,\n", fma_prefill);
    printf("  \"ratios\": {\"decode_1_vs_bw\": %.3f, \"decode_32_vs_fma\": %.3f, "
           "\"decode_64_vs_fma\": %.3f, \"prefill_vs_fma\": %.3f}\n",
           dec[0] / bw_ceiling, dec[3] / fma_decode, dec[4] / fma_decode, prefill / fma_prefill);
    printf("}\n");
    sl_worker_free(w);
    sl_model_free(m);
    free(tokens);
    free(pos);
    free(seq);
    free(rows);
    free(tables);
    free(logits);
    return 0;
}
