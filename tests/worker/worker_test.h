/* Helpers shared by the worker tests. */
#ifndef SLUICE_TESTS_WORKER_TEST_H
#define SLUICE_TESTS_WORKER_TEST_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../models.h"
#include "worker_impl.h"

/* The shared models folder, or NULL when it is absent (tests that need it skip, or fail when
 * SLUICE_REQUIRE_MODELS=1: ../models.h). */
static inline const char *wt_models_dir(void)
{
    const char *d = getenv("SL_MODELS_DIR");
    struct stat st;
    if (!d || stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
        return NULL;
    return d;
}

#define WT_REQUIRE_MODELS(dir)                                                                     \
    const char *dir = wt_models_dir();                                                             \
    do {                                                                                           \
        if (!dir) {                                                                                \
            const char *e_ = getenv("SL_MODELS_DIR");                                              \
            MODELS_MISSING("needs real models: ../shared/models not found (SL_MODELS_DIR=%s)",     \
                           e_ ? e_ : "(unset)");                                                   \
        }                                                                                          \
    } while (0)

static inline char *wt_path(const char *dir, const char *name)
{
    /* Copied by hand: gcc's -Wformat-truncation cannot see that n fits under ASan. */
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static inline struct sl_model *wt_load(const char *spec, const char *tok)
{
    struct sl_model *m = NULL;
    char err[512];
    int rc = sl_model_load(spec, tok, &m, err, sizeof(err));
    cr_assert_eq(rc, SL_OK, "load %s: %s", spec, err);
    return m;
}

/* Reads a whole file; aborts the test when it cannot. */
static inline unsigned char *wt_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *p = malloc((size_t)n + 1);
    cr_assert_eq(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* Writes bytes to a fresh temporary file and returns its path (caller unlinks and frees). */
static inline char *wt_write_temp(const void *data, size_t len)
{
    char *path = strdup("/tmp/sluice-worker-test-XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp failed");
    FILE *f = fdopen(fd, "wb");
    cr_assert_not_null(f);
    if (len)
        cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
    return path;
}

/* The golden end-to-end check of test_golden.c on any backend: greedy ids of `model` (a file in
 * the models folder, with `tokfile` or NULL) equal `golden`'s, each prompt alone or all in one
 * batch; stopping on the model's stop tokens or on BOS only. on_device: the ids come from the
 * backend's forward_sample instead of an argmax of its logits. */
/* One row per token of a forward step: (seq, token, pos); every row gets logits. */
struct wt_step {
    int n;
    int32_t tokens[48], pos[48], seq[48], rows[48];
};

static inline void wt_step_add(struct wt_step *s, int seq, int32_t token, int32_t pos)
{
    s->tokens[s->n] = token;
    s->pos[s->n] = pos;
    s->seq[s->n] = seq;
    s->rows[s->n] = s->n;
    s->n++;
}

/* s as a batch where sequence i owns tables[i] and has ctx[i] positions after the step. */
static inline struct sl_batch wt_batch_of(const struct wt_step *s, int n_seqs,
                                          const int32_t *const *tables, const int32_t *ctx)
{
    return (struct sl_batch){.n_tokens = s->n,
                             .tokens = s->tokens,
                             .pos = s->pos,
                             .seq = s->seq,
                             .n_seqs = n_seqs,
                             .block_tables = tables,
                             .ctx_len = ctx,
                             .n_logits = s->n,
                             .logit_rows = s->rows};
}

/* Runs the step on w, logits (s->n, vocab). */
static inline void wt_run_step(struct sl_worker *w, const struct wt_step *s, int n_seqs,
                               const int32_t *const *tables, const int32_t *ctx, float *logits)
{
    struct sl_batch b = wt_batch_of(s, n_seqs, tables, ctx);
    cr_assert_eq(sl_worker_forward(w, &b, logits), SL_OK);
}

/* The first index of the largest of l (n). */
static inline int32_t wt_argmax(const float *l, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* Two token sequences the forward tests run (test_forward.c). */
extern const int32_t wt_seq_a[20], wt_seq_b[10];

/* Logits (20, vocab) of every position of wt_seq_a, prefilled in one chunk on w (a fresh worker
 * with at least 8 KV blocks). The caller frees them. */
static inline float *wt_prefill_seq_a(struct sl_worker *w, int vocab)
{
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const int32_t *tables[1] = {table};
    int32_t ctx[1] = {20};
    struct wt_step s = {0};
    for (int i = 0; i < 20; i++)
        wt_step_add(&s, 0, wt_seq_a[i], i);
    float *logits = malloc((size_t)20 * vocab * sizeof(float));
    wt_run_step(w, &s, 1, tables, ctx, logits);
    return logits;
}

/* How wt_check_golden's workers store K and V (default SL_KV_F32; a test may set it first). */
extern enum sl_kv_dtype wt_kv_dtype;
void wt_check_golden(const struct sl_backend_ops *ops, bool on_device, const char *model,
                     const char *tokfile, const char *golden, bool batched, bool model_stops);

#endif
