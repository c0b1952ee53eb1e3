/* sched-bench: the scheduling core's own cost per step, with a worker that computes nothing.
 *
 * N sequences decode (two tiers, the interactive ones with a TPOT objective so the guard's
 * prediction runs every step) while a backlog of batch requests waits for slots that never free
 * (so every step also tries to start one and decides not to preempt). The worker writes a one-hot
 * logits row per sampled row over a vocabulary of 8, so sampling costs next to nothing; what is
 * timed is building the batch, block growth, the guard, sampling and the sink calls. Prints one
 * JSON object.
 */
#include <sluice/sched.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 8

static int noop_forward(void *ctx, const struct sl_batch *b, float *logits)
{
    (void)ctx;
    for (int i = 0; i < b->n_logits; i++) {
        float *row = logits + (size_t)i * VOCAB;
        memset(row, 0, sizeof(float) * VOCAB);
        row[3 + (b->logit_rows[i] & 3)] = 1.f;
    }
    return SL_OK;
}

static bool never_stop(void *ctx, int32_t token)
{
    (void)ctx;
    (void)token;
    return false;
}

static bool sink_token(void *ctx, struct sl_req *r, int32_t token)
{
    (void)r;
    (void)token;
    (*(long *)ctx)++;
    return false;
}

static void sink_done(void *ctx, struct sl_req *r, enum sl_finish why, int status, int n)
{
    (void)ctx;
    (void)r;
    (void)why;
    (void)status;
    (void)n;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int n_seqs = 256, steps = 20000, backlog = 1000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--seqs") == 0)
            n_seqs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--backlog") == 0)
            backlog = atoi(argv[i + 1]);
    }
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || n_seqs < 1 || steps < 1 || backlog < 0)) {
        fprintf(stderr, "usage: sched-bench [--seqs N (256)] [--steps N (20000)] "
                        "[--backlog N (1000)]\n");
        return 2;
    }
    static const struct sl_sched_tier tiers[2] = {
        {.name = "interactive",
         .priority = 0,
         .weight = 4,
         .ttft_slo_ms = 1000,
         .tpot_slo_ms = 100},
        {.name = "batch", .priority = 1, .weight = 1, .ttft_slo_ms = 60000, .tpot_slo_ms = 1000},
    };
    const int prompt = 16, block = 16, warm = 64;
    int max_tokens = steps + 2 * warm;
    int per_seq = (prompt + max_tokens + block - 1) / block;
    struct sl_sched_limits lim = {
        .vocab = VOCAB,
        .max_ctx = prompt + max_tokens,
        .max_seqs = n_seqs,
        .max_batch_tokens = n_seqs + 512,
        .n_blocks = per_seq * n_seqs + 64,
        .block_size = block,
        .tiers = tiers,
        .n_tiers = 2,
    };
    long tokens = 0;
    struct sl_sched_worker w = {.forward = noop_forward, .is_stop_token = never_stop};
    struct sl_sched_sink sink = {.ctx = &tokens, .token = sink_token, .done = sink_done};
    struct sl_sched_core *c = sl_sched_core_new(&lim, &w, &sink);
    if (!c) {
        fprintf(stderr, "sched-bench: bad limits\n");
        return 1;
    }
    int32_t ids[16];
    for (int k = 0; k < prompt; k++)
        ids[k] = 3 + k % 5;
    uint64_t now = 0;
    for (int i = 0; i < n_seqs + backlog; i++) {
        int t = i < n_seqs ? i % 2 : 1;
        struct sl_req_params p = {
            .max_tokens = max_tokens, .top_p = 1.f, .tier = t, .sched_tier = tiers[t]};
        struct sl_req *r = sl_req_new(sl_req_prompt_copy(ids, prompt), &p);
        if (sl_sched_core_submit(c, r, now) != SL_OK) {
            fprintf(stderr, "sched-bench: submit refused\n");
            return 1;
        }
        sl_req_unref(r);
        now++;
    }
    /* Warm up: every prompt prefilled, every sequence decoding; a 20 ms step for the guard. */
    for (int k = 0; k < warm; k++, now += 20000000)
        sl_sched_core_step(c, now);
    if (sl_sched_core_running(c) != n_seqs) {
        fprintf(stderr, "sched-bench: %d of %d sequences running\n", sl_sched_core_running(c),
                n_seqs);
        return 1;
    }
    uint64_t *ns = malloc(sizeof *ns * (size_t)steps);
    long tokens0 = tokens;
    uint64_t t_all = sl_clock_ns();
    for (int k = 0; k < steps; k++, now += 20000000) {
        uint64_t t0 = sl_clock_ns();
        int rows = sl_sched_core_step(c, now);
        ns[k] = sl_clock_ns() - t0;
        if (rows != n_seqs) {
            fprintf(stderr, "sched-bench: step %d ran %d rows\n", k, rows);
            return 1;
        }
    }
    t_all = sl_clock_ns() - t_all;
    qsort(ns, (size_t)steps, sizeof *ns, cmp_u64);
    printf("{\"seqs\": %d, \"backlog\": %d, \"steps\": %d, \"tokens\": %ld, "
           "\"step_us_mean\": %.2f, \"step_us_p50\": %.2f, \"step_us_p99\": %.2f, "
           "\"step_us_min\": %.2f}\n",
           n_seqs, backlog, steps, tokens - tokens0, (double)t_all / steps / 1e3,
           (double)ns[steps / 2] / 1e3, (double)ns[(size_t)(0.99 * steps)] / 1e3,
           (double)ns[0] / 1e3);
    free(ns);
    sl_sched_core_free(c);
    return 0;
}
