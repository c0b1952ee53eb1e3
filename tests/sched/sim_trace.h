/* Shared by the simulator tests (test_sim.c, tests/admission/test_gcra.c): conf/sluice.json's two
 * tiers and limits over the stories15M CPU cost model, and request traces drawn from a seeded
 * generator. */
#ifndef SLUICE_TESTS_SIM_TRACE_H
#define SLUICE_TESTS_SIM_TRACE_H

#include <sluice/sched.h>

#include <stdint.h>

extern const struct sl_sched_tier sim_tiers[2];
enum { INTERACTIVE, BATCH };

/* conf/sluice.json's limits, the 512 MiB KV cap over stories15M's 13.5 KiB per token, and a
 * longer context than stories15M's so that long prompts can be tried. */
struct sl_sim_config sim_config(void);

struct trace {
    struct sl_sim_request *r; /* (n), in arrival order as added; the caller frees r */
    int n, cap;
    uint64_t rng; /* the generator's state: the seed */
};

/* Uniform in [0, 1). */
double trace_uniform(struct trace *t);
/* Uniform integer in [lo, hi]. */
int trace_between(struct trace *t, int lo, int hi);
void trace_add(struct trace *t, double at, int tier, int prompt, int output);
/* Poisson arrivals at `rate` per second over [from, to), prompt and output lengths uniform in
 * [p_lo, p_hi] and [o_lo, o_hi]. */
void trace_poisson(struct trace *t, double from, double to, double rate, int tier, int p_lo,
                   int p_hi, int o_lo, int o_hi);

#endif
