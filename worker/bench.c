/* Benchmark hooks (worker.h): what bench/engine_bench.c needs to know of a model and a CPU
 * worker, so that it can stay outside the module's private layouts. */
#include "worker_impl.h"

#include "sl_build_config.h"

#include <stdlib.h>
#include <string.h>

static void add_mat(struct sl_model_work *s, const struct sl_mat *m, bool layer)
{
    s->weight_bytes += (double)m->rows * (double)sl_dtype_row_bytes(m->type, m->cols);
    double n = (double)m->rows * m->cols;
    s->decode_params += n;
    if (layer)
        s->layer_params += n;
}

void sl_model_bench_work(const struct sl_model *m, struct sl_model_work *out)
{
    *out = (struct sl_model_work){.weight_type = sl_dtype_name(m->w.layers[0].wq.type)};
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const struct sl_layer_weights *L = &m->w.layers[l];
        const struct sl_mat *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w2, &L->w3};
        for (int i = 0; i < 7; i++)
            add_mat(out, ms[i], true);
    }
    add_mat(out, &m->w.wcls, false);
    const struct sl_layer_weights *last = &m->w.layers[m->cfg.n_layers - 1];
    const struct sl_mat *tail[] = {&last->wo, &last->w1, &last->w2, &last->w3};
    for (int i = 0; i < 4; i++)
        out->last_tail_params += (double)tail[i]->rows * tail[i]->cols;
}

/* One batch and the arrays it points to, (cap) rows and (seqs) sequences. */
struct bench_batch {
    struct sl_batch b;
    int32_t *pos, *seq, *rows; /* (cap) */
    const int32_t **tables;    /* (seqs) */
    int32_t *ctx_len;          /* (seqs) */
};

struct sl_worker_bench {
    int max_seqs, ctx, prompt, block_size;
    int per_seq;     /* blocks of one decoding sequence */
    int n_blocks;    /* every sequence's and the prompt's */
    int cap;         /* rows of the largest batch: max(prompt, max_seqs, ctx - 1) */
    int32_t *tokens; /* (cap) drawn once; every batch reads its first rows */
    int32_t *blocks; /* (n_blocks) block ids 0, 1, …: sequence s's table starts at s · per_seq,
                      * the prompt's at max_seqs · per_seq */
    struct bench_batch prompt_b, context_b, decode_b;
};

static void batch_init(struct bench_batch *bb, int cap, int seqs, const int32_t *tokens)
{
    bb->pos = sl_xcalloc((size_t)cap, sizeof(int32_t));
    bb->seq = sl_xcalloc((size_t)cap, sizeof(int32_t));
    bb->rows = sl_xcalloc((size_t)cap, sizeof(int32_t));
    bb->tables = sl_xcalloc((size_t)seqs, sizeof(*bb->tables));
    bb->ctx_len = sl_xcalloc((size_t)seqs, sizeof(int32_t));
    bb->b = (struct sl_batch){.tokens = tokens,
                              .pos = bb->pos,
                              .seq = bb->seq,
                              .block_tables = bb->tables,
                              .ctx_len = bb->ctx_len,
                              .logit_rows = bb->rows};
}

static void batch_dispose(struct bench_batch *bb)
{
    free(bb->pos);
    free(bb->seq);
    free(bb->rows);
    free(bb->tables);
    free(bb->ctx_len);
}

int sl_worker_bench_new(const struct sl_model *m, int max_seqs, int ctx, int prompt, int block_size,
                        struct sl_worker_bench **out)
{
    int seq_len = m->cfg.seq_len;
    if (block_size < 1 || max_seqs < 1 || ctx < 1 || ctx > seq_len || prompt < 1 ||
        prompt > seq_len)
        return SL_EINVAL;
    struct sl_worker_bench *b = sl_xcalloc(1, sizeof(*b));
    b->max_seqs = max_seqs;
    b->ctx = ctx;
    b->prompt = prompt;
    b->block_size = block_size;
    b->per_seq = (ctx + block_size - 1) / block_size;
    b->n_blocks = max_seqs * b->per_seq + (prompt + block_size - 1) / block_size;
    b->cap = prompt > max_seqs ? prompt : max_seqs;
    b->cap = ctx - 1 > b->cap ? ctx - 1 : b->cap;
    b->tokens = sl_xcalloc((size_t)b->cap, sizeof(int32_t));
    uint64_t rng = 0x5eed;
    for (int i = 0; i < b->cap; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        b->tokens[i] = (int32_t)((rng >> 33) % (uint64_t)m->cfg.vocab_size);
    }
    b->blocks = sl_xcalloc((size_t)b->n_blocks, sizeof(int32_t));
    for (int i = 0; i < b->n_blocks; i++)
        b->blocks[i] = i;
    batch_init(&b->prompt_b, b->cap, 1, b->tokens);
    batch_init(&b->context_b, b->cap, max_seqs, b->tokens);
    batch_init(&b->decode_b, b->cap, max_seqs, b->tokens);
    *out = b;
    return SL_OK;
}

void sl_worker_bench_free(struct sl_worker_bench *b)
{
    if (!b)
        return;
    batch_dispose(&b->prompt_b);
    batch_dispose(&b->context_b);
    batch_dispose(&b->decode_b);
    free(b->tokens);
    free(b->blocks);
    free(b);
}

void sl_worker_bench_opts(const struct sl_worker_bench *b, struct sl_backend_opts *o)
{
    o->n_kv_blocks = b->n_blocks;
    o->block_size = b->block_size;
    o->max_batch_tokens = b->cap;
    o->max_seqs = b->max_seqs;
}

const struct sl_batch *sl_worker_bench_prompt(struct sl_worker_bench *b)
{
    struct bench_batch *bb = &b->prompt_b;
    for (int i = 0; i < b->prompt; i++) {
        bb->pos[i] = i;
        bb->seq[i] = 0;
    }
    bb->tables[0] = b->blocks + (size_t)b->max_seqs * b->per_seq;
    bb->ctx_len[0] = b->prompt;
    bb->rows[0] = b->prompt - 1;
    bb->b.n_tokens = b->prompt;
    bb->b.n_seqs = 1;
    bb->b.n_logits = 1;
    return &bb->b;
}

const struct sl_batch *sl_worker_bench_context(struct sl_worker_bench *b, int first, int *n_seqs)
{
    *n_seqs = 0;
    if (first < 0 || first >= b->max_seqs || b->ctx == 1)
        return NULL;
    struct bench_batch *bb = &b->context_b;
    int nt = 0, ns = 0, len = b->ctx - 1;
    while (first + ns < b->max_seqs && nt + len <= b->cap) {
        for (int i = 0; i < len; i++) {
            bb->pos[nt] = i;
            bb->seq[nt++] = ns;
        }
        bb->tables[ns] = b->blocks + (size_t)(first + ns) * b->per_seq;
        bb->ctx_len[ns] = len;
        ns++;
    }
    if (ns == 0) /* not with cap >= ctx - 1, as sl_worker_bench_new makes it */
        return NULL;
    bb->b.n_tokens = nt;
    bb->b.n_seqs = ns;
    bb->b.n_logits = 0;
    *n_seqs = ns;
    return &bb->b;
}

const struct sl_batch *sl_worker_bench_decode(struct sl_worker_bench *b, int n_seqs)
{
    if (n_seqs < 1 || n_seqs > b->max_seqs)
        return NULL;
    struct bench_batch *bb = &b->decode_b;
    for (int s = 0; s < n_seqs; s++) {
        bb->pos[s] = b->ctx - 1;
        bb->seq[s] = s;
        bb->rows[s] = s;
        bb->tables[s] = b->blocks + (size_t)s * b->per_seq;
        bb->ctx_len[s] = b->ctx;
    }
    bb->b.n_tokens = n_seqs;
    bb->b.n_seqs = n_seqs;
    bb->b.n_logits = n_seqs;
    return &bb->b;
}

const char *sl_worker_phase_name(enum sl_worker_phase p)
{
    static const char *const names[SL_WORKER_PHASES] = {
        "qkv", "kv_glue", "attention", "wo", "norm", "w1_w3", "w2", "norm2", "classifier"};
    return (unsigned)p < SL_WORKER_PHASES ? names[p] : "?";
}

int sl_worker_bench_time_phases(struct sl_worker *w, bool on)
{
    struct sl_cpu_ctx *c = sl_worker_backend_ctx(w, &sl_cpu_backend_ops);
    if (!c)
        return SL_EINVAL;
    c->time_phases = on;
    return SL_OK;
}

int sl_worker_bench_phases(struct sl_worker *w, uint64_t *ns)
{
    struct sl_cpu_ctx *c = sl_worker_backend_ctx(w, &sl_cpu_backend_ops);
    if (!c)
        return SL_EINVAL;
    memcpy(ns, c->phase_ns, sizeof c->phase_ns);
    memset(c->phase_ns, 0, sizeof c->phase_ns);
    return SL_OK;
}

#if !SL_HAVE_CUDA
int sl_worker_bench_profile(struct sl_worker *w, struct sl_worker_profile *out)
{
    (void)w;
    (void)out;
    return SL_EINVAL;
}
#endif
