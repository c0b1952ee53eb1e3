/* A test backend: the CPU backend whose forward fails on chosen calls, for the fault tests of
 * tests/integration. Only the test build of the server (tests/integration's sluice-fault, built
 * from server/main.c with SL_FAULT_INJECTION) links this file; the sluice binary has none of it,
 * so neither a request nor the environment can make a served model fail this way.
 *
 * SLUICE_FAULT_FORWARD is read once, at init: a comma-separated list of forward calls (forward
 * and forward_sample alike, counting from 1 over the life of the backend) that return SL_EBACKEND
 * without computing anything, the way a device error would. Each failure is logged (warn) with
 * its call number.
 *
 * SLUICE_FAULT_FORWARD_MS, also read once: every forward call first sleeps that many
 * milliseconds (0 to 10000; absent or 0: none), a device that slow, so that a test knows a lower
 * bound of every step's time (the SLO tests: a TTFT objective of 1 ms is then always missed). */
#include <sluice/worker.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAULTS_MAX 64

struct fault_ctx {
    void *inner;     /* the CPU backend's context */
    uint64_t calls;  /* forward calls so far */
    uint64_t *fails; /* (n_fails) calls that fail */
    int n_fails;
    long sleep_ms; /* before every forward call */
};

/* Parses "3,7,12"; false for anything else (an empty or absent variable is no failures). */
static bool parse_steps(const char *v, struct fault_ctx *f)
{
    f->fails = sl_xcalloc(FAULTS_MAX, sizeof *f->fails);
    while (v && *v) {
        char *end;
        unsigned long long n = strtoull(v, &end, 10);
        if (end == v || n == 0 || f->n_fails == FAULTS_MAX || (*end && *end != ','))
            return false;
        f->fails[f->n_fails++] = n;
        v = *end ? end + 1 : end;
    }
    return true;
}

static void fault_free(void *ctx)
{
    struct fault_ctx *f = ctx;
    if (!f)
        return;
    sl_cpu_backend_ops.free(f->inner);
    free(f->fails);
    free(f);
}

static int fault_init(const struct sl_model *m, const struct sl_backend_opts *o, void **out)
{
    struct fault_ctx *f = sl_xcalloc(1, sizeof *f);
    const char *v = getenv("SLUICE_FAULT_FORWARD");
    if (!parse_steps(v, f)) {
        sl_log(SL_LOG_ERROR, "SLUICE_FAULT_FORWARD=\"%s\" is not a list of forward calls", v);
        fault_free(f);
        return SL_EINVAL;
    }
    const char *ms = getenv("SLUICE_FAULT_FORWARD_MS");
    if (ms && *ms) {
        char *end;
        f->sleep_ms = strtol(ms, &end, 10);
        if (*end || f->sleep_ms < 0 || f->sleep_ms > 10000) {
            sl_log(SL_LOG_ERROR, "SLUICE_FAULT_FORWARD_MS=\"%s\" is not 0 to 10000 ms", ms);
            fault_free(f);
            return SL_EINVAL;
        }
    }
    int st = sl_cpu_backend_ops.init(m, o, &f->inner);
    if (st != SL_OK) {
        fault_free(f);
        return st;
    }
    sl_log(SL_LOG_WARN,
           "fault injection: %d forward calls will fail (SLUICE_FAULT_FORWARD), each takes %ld ms "
           "more (SLUICE_FAULT_FORWARD_MS)",
           f->n_fails, f->sleep_ms);
    *out = f;
    return SL_OK;
}

/* True when this forward call (counted across forward and forward_sample) is to fail. Sleeps
 * sleep_ms first, whole: nanosleep resumes after a signal. */
static bool fault_now(struct fault_ctx *f, const struct sl_batch *b)
{
    struct timespec left = {f->sleep_ms / 1000, f->sleep_ms % 1000 * 1000000};
    while (f->sleep_ms > 0 && nanosleep(&left, &left) != 0 && errno == EINTR)
        ;
    uint64_t call = ++f->calls;
    for (int i = 0; i < f->n_fails; i++)
        if (f->fails[i] == call) {
            sl_log(SL_LOG_WARN, "fault injection: forward call %llu fails (%d rows)",
                   (unsigned long long)call, b->n_tokens);
            return true;
        }
    return false;
}

static int fault_forward(void *ctx, const struct sl_batch *b, float *logits)
{
    struct fault_ctx *f = ctx;
    return fault_now(f, b) ? SL_EBACKEND : sl_cpu_backend_ops.forward(f->inner, b, logits);
}

/* The CPU backend samples its rows itself, as the server runs it; the same calls fail. */
static int fault_forward_sample(void *ctx, const struct sl_batch *b,
                                const struct sl_sample_row *rows, int32_t *ids)
{
    struct fault_ctx *f = ctx;
    return fault_now(f, b) ? SL_EBACKEND
                           : sl_cpu_backend_ops.forward_sample(f->inner, b, rows, ids);
}

static size_t fault_kv_bytes(void *ctx)
{
    return sl_cpu_backend_ops.kv_bytes(((struct fault_ctx *)ctx)->inner);
}

const struct sl_backend_ops sl_fault_backend_ops = {
    .name = "cpu+faults",
    .init = fault_init,
    .forward = fault_forward,
    .forward_sample = fault_forward_sample,
    .free = fault_free,
    .kv_bytes = fault_kv_bytes,
    .kv_block_bytes = sl_model_kv_block_bytes, /* the CPU backend's layout */
};
