#include "sim_trace.h"

#include <math.h>
#include <stdlib.h>

const struct sl_sched_tier sim_tiers[2] = {
    {.name = "interactive", .priority = 0, .weight = 4, .ttft_slo_ms = 1000, .tpot_slo_ms = 100},
    {.name = "batch", .priority = 1, .weight = 1, .ttft_slo_ms = 60000, .tpot_slo_ms = 1000},
};

struct sl_sim_config sim_config(void)
{
    struct sl_sim_config c = {
        .lim = {.max_ctx = 8192,
                .max_seqs = 32,
                .max_batch_tokens = 512,
                .block_size = 16,
                .tiers = sim_tiers,
                .n_tiers = 2},
        .cost = sl_sim_cost_stories15m_cpu,
    };
    c.lim.n_blocks = (int)((512u << 20) / (c.cost.kv_bytes_per_token * 16));
    return c;
}

double trace_uniform(struct trace *t)
{
    t->rng = t->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(t->rng >> 11) / 9007199254740992.0;
}

int trace_between(struct trace *t, int lo, int hi)
{
    return lo + (int)(trace_uniform(t) * (hi - lo + 1));
}

void trace_add(struct trace *t, double at, int tier, int prompt, int output)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->r = realloc(t->r, sizeof *t->r * (size_t)t->cap);
    }
    t->r[t->n++] = (struct sl_sim_request){
        .arrival_s = at, .tier = tier, .prompt_tokens = prompt, .output_tokens = output};
}

void trace_poisson(struct trace *t, double from, double to, double rate, int tier, int p_lo,
                   int p_hi, int o_lo, int o_hi)
{
    for (double at = from - log(1 - trace_uniform(t)) / rate; at < to;
         at -= log(1 - trace_uniform(t)) / rate) {
        /* In this order on every compiler (not as two arguments of one call). */
        int prompt = trace_between(t, p_lo, p_hi);
        int output = trace_between(t, o_lo, o_hi);
        trace_add(t, at, tier, prompt, output);
    }
}
