/* What the model-loader targets check once a loader has accepted a file: every weight it points
 * at is read whole (ASan reports a view that runs past the input, which libFuzzer hands over as
 * an exact-size heap copy), the shapes agree with the configuration, and the tokenizer it built
 * encodes and decodes. */
#ifndef SLUICE_TESTS_FUZZ_MODEL_H
#define SLUICE_TESTS_FUZZ_MODEL_H

#include "worker_impl.h"

#include "fuzz.h"

#include <math.h>

/* Files whose weights are larger than this are only checked for shapes (a fuzzed header can
 * describe a large model only when the input is as large, so this bounds time, not coverage). */
#define FUZZ_TOUCH_MAX_VALUES (1 << 22)

static inline float fuzz_mat_touch(const struct sl_mat *w, int rows, int cols, const char *what)
{
    fuzz_check(w->data != NULL, "%s has no data", what);
    fuzz_check(w->rows == rows && w->cols == cols, "%s is (%d, %d), not (%d, %d)", what, w->rows,
               w->cols, rows, cols);
    size_t rb = sl_dtype_row_bytes(w->type, cols);
    fuzz_check(rb != 0, "%s: %d columns are not valid for %s", what, cols, sl_dtype_name(w->type));
    if ((uint64_t)rows * (uint64_t)cols > FUZZ_TOUCH_MAX_VALUES)
        return 0;
    float *row = malloc(sizeof *row * (size_t)cols);
    float sum = 0;
    for (int r = 0; r < rows; r++) {
        sl_model_row_to_f32(w->type, (const char *)w->data + (size_t)r * rb, row, cols);
        sum += row[0] + row[cols - 1];
    }
    free(row);
    return sum;
}

static inline float fuzz_vec_touch(const float *v, int n, const char *what)
{
    fuzz_check(v != NULL, "%s is missing", what);
    if (n > FUZZ_TOUCH_MAX_VALUES)
        return 0;
    volatile float sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    return sum;
}

/* Reads every weight of an accepted model. */
static inline void fuzz_model_touch(const struct sl_model *m)
{
    const struct sl_model_config *c = &m->cfg;
    fuzz_check(sl_model_body_floats(c) != 0, "accepted a shape the loaders refuse");
    int dim = c->dim, hid = c->hidden_dim, kv = dim / c->n_heads * c->n_kv_heads;
    const struct sl_model_weights *w = &m->w;
    volatile float sum = 0;
    sum += fuzz_mat_touch(&w->token_embedding, c->vocab_size, dim, "token_embedding");
    sum += fuzz_mat_touch(&w->wcls, c->vocab_size, dim, "wcls");
    sum += fuzz_vec_touch(w->rms_final, dim, "rms_final");
    fuzz_check(w->layers != NULL, "no layers");
    for (int l = 0; l < c->n_layers; l++) {
        const struct sl_layer_weights *L = &w->layers[l];
        sum += fuzz_vec_touch(L->rms_att, dim, "rms_att");
        sum += fuzz_vec_touch(L->rms_ffn, dim, "rms_ffn");
        sum += fuzz_mat_touch(&L->wq, dim, dim, "wq");
        sum += fuzz_mat_touch(&L->wk, kv, dim, "wk");
        sum += fuzz_mat_touch(&L->wv, kv, dim, "wv");
        sum += fuzz_mat_touch(&L->wo, dim, dim, "wo");
        sum += fuzz_mat_touch(&L->w1, hid, dim, "w1");
        sum += fuzz_mat_touch(&L->w2, dim, hid, "w2");
        sum += fuzz_mat_touch(&L->w3, hid, dim, "w3");
    }
    (void)sum;
    fuzz_check(m->n_stop_tokens >= 0 && m->n_stop_tokens <= SL_MODEL_MAX_STOP, "%d stop tokens",
               m->n_stop_tokens);
}

/* Encodes text (any bytes: invalid UTF-8 must be refused, not tokenized), decodes what came out
 * and runs it through the incremental detokenizer, whose output must be valid UTF-8. */
static inline void fuzz_tok_roundtrip(const struct sl_tok *t, const char *text, size_t len,
                                      const char *const *stops, int n_stops)
{
    int vocab = sl_tok_vocab_size(t);
    fuzz_check(vocab >= 1, "an empty vocabulary");
    int max = 2 * (int)len + 8;
    int32_t *ids = malloc(sizeof *ids * (size_t)max);
    int n = 0;
    int st = sl_tok_encode(t, text, len, true, ids, max, &n);
    fuzz_check(st == SL_OK || st == SL_EINVAL || st == SL_ERANGE, "encode: %d", st);
    if (st == SL_ERANGE)
        fuzz_check(n == max + 1, "ERANGE with %d ids", n);
    if (st == SL_OK) {
        fuzz_check(n >= 0 && n <= max, "%d ids for %zu bytes", n, len);
        int32_t bos = sl_tok_bos(t);
        for (int i = 0; i < n; i++)
            fuzz_check((ids[i] >= 0 && ids[i] < vocab) || (i == 0 && ids[i] == bos),
                       "id %d of %d is %d (vocab %d)", i, n, (int)ids[i], vocab);
        struct sl_detok *d = sl_detok_new(t, n > 0 ? ids[0] : bos, stops, n_stops);
        struct sl_str out;
        sl_str_init(&out);
        bool stopped = false;
        for (int i = 1; i < n; i++) {
            size_t l = 0;
            const char *p = sl_tok_decode(t, ids[i - 1], ids[i], &l);
            fuzz_check(p != NULL, "decode gave NULL");
            sl_detok_push(d, ids[i], &out, &stopped);
        }
        sl_detok_finish(d, &out);
        fuzz_check(sl_utf8_complete_prefix(out.p ? out.p : "", out.len) == out.len,
                   "detokenized text ends in a partial character");
        struct sl_str clean;
        sl_str_init(&clean);
        sl_utf8_sanitize(&clean, out.p ? out.p : "", out.len);
        fuzz_check(clean.len == out.len && (out.len == 0 || memcmp(clean.p, out.p, out.len) == 0),
                   "detokenized text is not valid UTF-8");
        sl_str_dispose(&clean);
        sl_str_dispose(&out);
        sl_detok_free(d);
    } else if (st == SL_EINVAL) {
        /* Invalid UTF-8 is the only refusal: sanitizing must change the text. */
        struct sl_str clean;
        sl_str_init(&clean);
        sl_utf8_sanitize(&clean, text, len);
        fuzz_check(clean.len != len || memcmp(clean.p, text, len) != 0,
                   "valid UTF-8 refused by encode");
        sl_str_dispose(&clean);
    }
    free(ids);
}

/* Decodes every id of the vocabulary (and a few outside it) after every kind of predecessor. */
static inline void fuzz_tok_decode_all(const struct sl_tok *t)
{
    int vocab = sl_tok_vocab_size(t);
    if (vocab > 1 << 16)
        vocab = 1 << 16;
    int32_t bos = sl_tok_bos(t);
    for (int32_t id = -2; id < vocab + 2; id++) {
        size_t l = 0;
        const char *p = sl_tok_decode(t, bos, id, &l);
        fuzz_check(p != NULL, "decode(%d) is NULL", (int)id);
        volatile char sink = l ? p[l - 1] : 0;
        (void)sink;
        p = sl_tok_decode(t, -1, id, &l);
        sink = l ? p[l - 1] : 0;
    }
}

/* A Llama-2-style tokenizer.json (274 ids), small but with every feature the parser accepts: added
 * tokens (special and not, normalized and not), byte fallback with gaps, <unk> fusing, merges as
 * strings and as pairs, a post-processor BOS. The caller frees it. */
static inline char *fuzz_hf_tokenizer_json(void)
{
    struct sl_str s;
    sl_str_init(&s);
    sl_str_appendf(&s, "{\"version\":\"1.0\",\"added_tokens\":["
                       "{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},"
                       "{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
                       "{\"id\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false},"
                       "{\"id\":272,\"content\":\"<|im_start|>\",\"special\":true,"
                       "\"normalized\":false},"
                       "{\"id\":273,\"content\":\"\\u2581hello\",\"special\":false,"
                       "\"normalized\":true}],");
    sl_str_appendf(&s, "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":["
                       "{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
                       "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
                       "\"content\":\"\\u2581\"}]},\"pre_tokenizer\":null,"
                       "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
                       "{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
                       "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                       "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1]}}},");
    sl_str_appendf(&s, "\"decoder\":{\"type\":\"Sequence\",\"decoders\":["
                       "{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},"
                       "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
                       "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},");
    sl_str_appendf(&s, "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\","
                       "\"fuse_unk\":true,\"byte_fallback\":true,\"vocab\":{"
                       "\"<unk>\":0,\"<s>\":1,\"</s>\":2");
    /* Byte tokens for every byte but a few, so some characters fall back to <unk>. */
    for (int b = 0; b < 256; b++)
        if (b != 0xf0 && b != 0x9f)
            sl_str_appendf(&s, ",\"<0x%02X>\":%d", b, 3 + b);
    static const char *const words[] = {
        "\\u2581", "a", "b",  "\\u2581a", "ab",   "\\u2581ab", "h",       "e",
        "l",       "o", "he", "ll",       "hell", "hello",     "\\u00e9", "\\u2581\\u00e9",
    };
    for (int w = 0; w < (int)(sizeof words / sizeof words[0]); w++)
        sl_str_appendf(&s, ",\"%s\":%d", words[w], 259 + w);
    sl_str_appendf(&s, "},\"merges\":[\"\\u2581 a\",\"a b\",\"\\u2581a b\",\"h e\",\"l l\","
                       "[\"he\",\"ll\"],\"hell o\",\"\\u2581 \\u00e9\"]}}");
    return s.p;
}

#endif
