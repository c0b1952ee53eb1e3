/* Golden end-to-end: greedy generation through the batch interface and the paged KV cache
 * reproduces llama2.c run.c's token ids exactly (see ../shared/models/README.md), from the
 * llama2.c checkpoints and from the same weights as GGUF and as a Hugging Face folder. */
#include "worker_test.h"

#include <jansson.h>

#define BLOCK 16
#define POOL 128
#define MAX_SEQS 4

struct gen {
    int32_t prompt[512];
    int n_prompt;
    int steps;
    int32_t table[512 / BLOCK];
    int32_t pos;      /* position of the next token to feed */
    int32_t next;     /* token to feed at pos */
    int32_t out[512]; /* generated ids */
    int n_out;
    bool done;
    const struct sl_model *stops; /* stop on its stop tokens; NULL: on BOS only, as run.c */
};

/* Block i of sequence s: a scrambled bijection over the pool, so neighbours in a sequence are
 * far apart in memory and sequences never share a block. */
static void gen_init(struct gen *g, int s, const int32_t *prompt, int n_prompt, int steps)
{
    memset(g, 0, sizeof(*g));
    memcpy(g->prompt, prompt, (size_t)n_prompt * sizeof(int32_t));
    g->n_prompt = n_prompt;
    g->steps = steps;
    for (int i = 0; i < 512 / BLOCK; i++)
        g->table[i] = (int32_t)(((s * (512 / BLOCK) + i) * 37 + 11) % POOL);
}

/* Runs every sequence to completion, in steps that mix prefills and decodes: step 1 prefills all
 * prompts at once, every later step decodes one token per live sequence. Stopping is llama2.c's:
 * at most `steps` positions including BOS, or when BOS is sampled. */
static void generate(struct sl_worker *w, struct gen *g, int n, bool on_device)
{
    /* A backend that samples on its device picks the greedy ids itself (only ids come back). */
    cr_assert(!on_device || sl_worker_can_sample(w));
    struct sl_sample_row greedy[MAX_SEQS];
    int32_t ids[MAX_SEQS];
    for (int i = 0; i < MAX_SEQS; i++)
        greedy[i] = (struct sl_sample_row){{.temperature = 0.0f, .top_p = 1.0f}, 0.0f};
    const struct sl_model_config *c = sl_model_config(sl_worker_model(w));
    int V = c->vocab_size, cap = sl_worker_opts(w)->max_batch_tokens;
    int32_t *tokens = malloc((size_t)cap * sizeof(int32_t)), *pos = malloc((size_t)cap * 4);
    int32_t *seq = malloc((size_t)cap * 4), rows[MAX_SEQS], ctx[MAX_SEQS], owner[MAX_SEQS];
    const int32_t *tables[MAX_SEQS];
    float *logits = malloc((size_t)MAX_SEQS * V * sizeof(float));
    bool first = true;
    for (;;) {
        int nt = 0, ns = 0;
        for (int s = 0; s < n; s++) {
            struct gen *q = &g[s];
            if (q->done)
                continue;
            if (first) {
                for (int i = 0; i < q->n_prompt; i++) {
                    tokens[nt] = q->prompt[i];
                    pos[nt] = i;
                    seq[nt++] = ns;
                }
                q->pos = q->n_prompt - 1;
            } else {
                tokens[nt] = q->next;
                pos[nt] = q->pos;
                seq[nt++] = ns;
            }
            rows[ns] = nt - 1;
            ctx[ns] = q->pos + 1;
            tables[ns] = q->table;
            owner[ns++] = s;
        }
        if (ns == 0)
            break;
        first = false;
        struct sl_batch b = {.n_tokens = nt,
                             .tokens = tokens,
                             .pos = pos,
                             .seq = seq,
                             .n_seqs = ns,
                             .block_tables = tables,
                             .ctx_len = ctx,
                             .n_logits = ns,
                             .logit_rows = rows};
        if (on_device)
            cr_assert_eq(sl_worker_forward_sample(w, &b, greedy, ids), SL_OK);
        else
            cr_assert_eq(sl_worker_forward(w, &b, logits), SL_OK);
        for (int i = 0; i < ns; i++) {
            struct gen *q = &g[owner[i]];
            int32_t next = on_device ? ids[i] : wt_argmax(logits + (size_t)i * V, V);
            q->pos++;
            if (q->stops ? sl_model_is_stop_token(q->stops, next) : next == 1) {
                q->done = true;
                continue;
            }
            q->out[q->n_out++] = next;
            q->next = next;
            if (q->pos >= q->steps)
                q->done = true;
        }
    }
    free(tokens);
    free(pos);
    free(seq);
    free(logits);
}

static void ids_from_json(json_t *a, int32_t *out, int *n)
{
    *n = (int)json_array_size(a);
    for (int i = 0; i < *n; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
}

/* tokfile NULL: the model file carries its vocabulary. model_stops: stop on the model's own stop
 * tokens (GGUF, HF) rather than on BOS only (llama2.c). The goldens have no stop token within
 * their steps, so both rules must give the golden's full length. */
static void check_golden(const char *model, const char *tokfile, const char *golden, bool batched,
                         bool model_stops)
{
    wt_check_golden(&sl_cpu_backend_ops, false, model, tokfile, golden, batched, model_stops);
}

enum sl_kv_dtype wt_kv_dtype = SL_KV_F32;

void wt_check_golden(const struct sl_backend_ops *ops, bool on_device, const char *model,
                     const char *tokfile, const char *golden, bool batched, bool model_stops)
{
    WT_REQUIRE_MODELS(dir);
    char *mp = wt_path(dir, model), *tp = tokfile ? wt_path(dir, tokfile) : NULL;
    char *gp = wt_path(dir, golden);
    struct sl_model *m = wt_load(mp, tp);
    json_error_t jerr;
    json_t *root = json_load_file(gp, 0, &jerr);
    cr_assert_not_null(root, "%s: %s", gp, jerr.text);
    size_t n_cases = json_array_size(root);
    cr_assert(n_cases >= 1 && n_cases <= MAX_SEQS);
    struct sl_backend_opts o = {.n_kv_blocks = POOL,
                                .block_size = BLOCK,
                                .max_batch_tokens = 64,
                                .max_seqs = MAX_SEQS,
                                .threads = 1,
                                .kv_dtype = wt_kv_dtype};
    struct gen *g = calloc(n_cases, sizeof(*g));
    for (size_t i = 0; i < n_cases; i++) {
        json_t *c = json_array_get(root, i);
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        int32_t ids[512];
        int n = 0;
        cr_assert_eq(sl_tok_encode(sl_model_tok(m), prompt, strlen(prompt), true, ids, 512, &n),
                     SL_OK);
        json_t *want = json_object_get(c, "prompt_token_ids");
        cr_assert_eq((size_t)n, json_array_size(want), "%s \"%s\": %d prompt ids", model, prompt,
                     n);
        for (int k = 0; k < n; k++)
            cr_assert_eq(ids[k], json_integer_value(json_array_get(want, (size_t)k)),
                         "%s \"%s\": prompt id %d", model, prompt, k);
        gen_init(&g[i], (int)i, ids, n, (int)json_integer_value(json_object_get(c, "steps")));
        g[i].stops = model_stops ? m : NULL;
        if (!batched) {
            struct sl_worker *w = NULL;
            cr_assert_eq(sl_worker_new(m, ops, &o, &w), SL_OK);
            generate(w, &g[i], 1, on_device);
            sl_worker_free(w);
        }
    }
    if (batched) {
        struct sl_worker *w = NULL;
        cr_assert_eq(sl_worker_new(m, ops, &o, &w), SL_OK);
        generate(w, g, (int)n_cases, on_device);
        sl_worker_free(w);
    }
    for (size_t i = 0; i < n_cases; i++) {
        json_t *c = json_array_get(root, i);
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        int32_t want[512];
        int n_want;
        ids_from_json(json_object_get(c, "token_ids"), want, &n_want);
        for (int k = 0; k < n_want && k < g[i].n_out; k++)
            cr_assert_eq(g[i].out[k], want[k], "%s \"%s\": token %d is %d, llama2.c gave %d", model,
                         prompt, k, g[i].out[k], want[k]);
        cr_assert_eq(g[i].n_out, n_want, "%s \"%s\": %d tokens, llama2.c gave %d", model, prompt,
                     g[i].n_out, n_want);
    }
    free(g);
    json_decref(root);
    sl_model_free(m);
    free(mp);
    free(tp);
    free(gp);
}

Test(worker, greedy_ids_match_llama2c_when_model_is_stories260k)
{
    check_golden("stories260K.bin", "tok512.bin", "golden/stories260K.json", false, false);
}

Test(worker, greedy_ids_match_llama2c_when_prompt_is_empty_for_200_steps)
{
    check_golden("stories260K.bin", "tok512.bin", "golden/stories260K.testall.json", false, false);
}

Test(worker, greedy_ids_match_llama2c_when_prompts_share_every_batch)
{
    check_golden("stories260K.bin", "tok512.bin", "golden/stories260K.json", true, false);
}

Test(worker, greedy_ids_match_llama2c_when_model_is_tinystories656k)
{
    check_golden("tinystories-656K/llama2c/model.bin", "tinystories-656K/llama2c/tokenizer.bin",
                 "golden/tinystories-656K.json", true, false);
}

Test(worker, greedy_ids_match_llama2c_when_model_is_stories260k_gguf)
{
    check_golden("stories260K.gguf", NULL, "golden/stories260K.json", false, true);
    check_golden("stories260K.gguf", NULL, "golden/stories260K.json", true, true);
}

Test(worker, greedy_ids_match_llama2c_when_gguf_prompt_is_empty_for_200_steps)
{
    check_golden("stories260K.gguf", NULL, "golden/stories260K.testall.json", false, true);
}

/* K and V stored as fp16 (kv_dtype "f16") round every cached value once; on these models the
 * greedy ids stay llama2.c's (fp32) all the same, alone and batched. */
Test(worker, greedy_ids_match_llama2c_when_kv_cache_is_f16)
{
    wt_kv_dtype = SL_KV_F16;
    check_golden("stories260K.bin", "tok512.bin", "golden/stories260K.json", false, false);
    check_golden("stories260K.bin", "tok512.bin", "golden/stories260K.testall.json", false, false);
    check_golden("stories260K.gguf", NULL, "golden/stories260K.json", true, true);
    check_golden("tinystories-656K/llama2c/model.bin", "tinystories-656K/llama2c/tokenizer.bin",
                 "golden/tinystories-656K.json", true, false);
    check_golden("tinystories-656K/hf", NULL, "golden/tinystories-656K.json", true, true);
}

/* HF semantics end to end: tokenizer.json BPE, permuted q/k, eps 1e-6, EOS stops. */
Test(worker, greedy_ids_match_reference_when_model_is_tinystories656k_hf)
{
    check_golden("tinystories-656K/hf", NULL, "golden/tinystories-656K.json", true, true);
}

/* llama.cpp's llama-simple on the same GGUF: its prompt ids, n_predict tokens, and its text
 * (which starts with the "<s> " it prints for BOS). */
Test(worker, greedy_text_matches_llamacpp_when_model_is_stories260k_gguf)
{
    WT_REQUIRE_MODELS(dir);
    char *mp = wt_path(dir, "stories260K.gguf");
    char *gp = wt_path(dir, "golden/stories260K.gguf.llamacpp.json");
    struct sl_model *m = wt_load(mp, NULL);
    const struct sl_tok *t = sl_model_tok(m);
    json_error_t jerr;
    json_t *root = json_load_file(gp, 0, &jerr);
    cr_assert_not_null(root, "%s: %s", gp, jerr.text);
    struct sl_backend_opts o = {.n_kv_blocks = POOL,
                                .block_size = BLOCK,
                                .max_batch_tokens = 64,
                                .max_seqs = MAX_SEQS,
                                .threads = 1};
    size_t i;
    json_t *c;
    json_array_foreach(root, i, c)
    {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        const char *text = json_string_value(json_object_get(c, "text"));
        int n_predict = (int)json_integer_value(json_object_get(c, "n_predict"));
        int32_t ids[512];
        int n = 0, n_want;
        cr_assert_eq(sl_tok_encode(t, prompt, strlen(prompt), true, ids, 512, &n), SL_OK);
        int32_t want[512];
        ids_from_json(json_object_get(c, "prompt_token_ids"), want, &n_want);
        cr_assert_eq(n, n_want);
        cr_assert_eq(memcmp(ids, want, (size_t)n * sizeof(int32_t)), 0, "\"%s\" prompt", prompt);
        struct gen *g = calloc(1, sizeof(*g));
        gen_init(g, 0, ids, n, n - 1 + n_predict);
        g->stops = m;
        struct sl_worker *w = NULL;
        cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w), SL_OK);
        generate(w, g, 1, false);
        sl_worker_free(w);
        cr_assert_eq(g->n_out, n_predict);
        struct sl_str s;
        sl_str_init(&s);
        sl_str_append(&s, "<s> ", 4);
        sl_str_append(&s, prompt, strlen(prompt));
        struct sl_detok *d = sl_detok_new(t, ids[n - 1], NULL, 0);
        bool stopped = false;
        for (int k = 0; k < g->n_out; k++)
            sl_detok_push(d, g->out[k], &s, &stopped);
        sl_detok_finish(d, &s);
        sl_detok_free(d);
        sl_str_append(&s, "\n", 1);
        cr_assert_str_eq(s.p, text);
        sl_str_dispose(&s);
        free(g);
    }
    json_decref(root);
    sl_model_free(m);
    free(mp);
    free(gp);
}
