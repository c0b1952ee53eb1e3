#include "worker_test.h"

#include <math.h>
#include <unistd.h>

static struct sl_model *const SENTINEL = (struct sl_model *)0x1;

/* Loads spec/tok expecting failure; checks *out is untouched and err names `name`. */
static int expect_reject(const char *spec, const char *tok, const char *name)
{
    struct sl_model *m = SENTINEL;
    char err[512] = "";
    int rc = sl_model_load(spec, tok, &m, err, sizeof(err));
    cr_assert_lt(rc, 0, "%s was accepted", spec);
    cr_assert_eq(m, SENTINEL, "*out was written on failure");
    cr_assert(strstr(err, name) != NULL, "error \"%s\" does not name %s", err, name);
    return rc;
}

Test(worker, model_loads_when_checkpoint_is_stories260k)
{
    WT_REQUIRE_MODELS(dir);
    char *mp = wt_path(dir, "stories260K.bin"), *tp = wt_path(dir, "tok512.bin");
    struct sl_model *m = wt_load(mp, tp);
    const struct sl_model_config *c = sl_model_config(m);
    cr_assert_eq(c->dim, 64);
    cr_assert_eq(c->hidden_dim, 172);
    cr_assert_eq(c->n_layers, 5);
    cr_assert_eq(c->n_heads, 8);
    cr_assert_eq(c->n_kv_heads, 4);
    cr_assert_eq(c->vocab_size, 512);
    cr_assert_eq(c->seq_len, 512);
    cr_assert(c->shared_classifier);
    cr_assert_float_eq(c->rms_eps, 1e-5f, 1e-12);
    cr_assert_float_eq(c->rope_theta, 10000.0f, 1e-3);
    cr_assert_str_eq(sl_model_id(m), "stories260K");
    cr_assert_eq(sl_tok_vocab_size(sl_model_tok(m)), 512);
    cr_assert_eq(sl_tok_bos(sl_model_tok(m)), 1);
    cr_assert(m->w.wcls.data == m->w.token_embedding.data);
    /* The last weight (rms_final) ends right where the freq_cis blocks begin. */
    size_t body = (1056540 - 28) / 4;
    cr_assert_eq((size_t)(m->w.rms_final + 64 + 512 * 8 - (const float *)m->w.token_embedding.data),
                 body);
    cr_assert_eq(sl_model_kv_block_bytes(m, 16, SL_KV_F32), (size_t)2 * 5 * 16 * 32 * 4);
    cr_assert(sl_model_is_stop_token(m, 1));
    cr_assert(sl_model_is_stop_token(m, 2));
    cr_assert(!sl_model_is_stop_token(m, 0));
    cr_assert(!sl_model_is_stop_token(m, 3));
    sl_model_free(m);
    free(mp);
    free(tp);
}

Test(worker, model_load_fails_when_checkpoint_is_truncated)
{
    WT_REQUIRE_MODELS(dir);
    char *mp = wt_path(dir, "stories260K.bin"), *tp = wt_path(dir, "tok512.bin");
    size_t len;
    unsigned char *data = wt_read(mp, &len);
    size_t cuts[] = {0, 1, 12, 27, 28, 29, 1000, len / 2, len - 4096 * 4, len - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        char *tmp = wt_write_temp(data, cuts[i]);
        int rc = expect_reject(tmp, tp, tmp);
        cr_assert(rc == SL_EFORMAT, "cut at %zu: %s", cuts[i], sl_status_str(rc));
        unlink(tmp);
        free(tmp);
    }
    /* One byte too many is as wrong as one too few: the header does not describe this file. */
    unsigned char *longer = malloc(len + 1);
    memcpy(longer, data, len);
    longer[len] = 0;
    char *tmp = wt_write_temp(longer, len + 1);
    expect_reject(tmp, tp, tmp);
    unlink(tmp);
    free(tmp);
    free(longer);
    free(data);
    free(mp);
    free(tp);
}

Test(worker, model_load_fails_when_header_is_corrupted)
{
    WT_REQUIRE_MODELS(dir);
    char *mp = wt_path(dir, "stories260K.bin"), *tp = wt_path(dir, "tok512.bin");
    size_t len;
    unsigned char *data = wt_read(mp, &len);
    struct {
        int field;
        int32_t value;
    } bad[] = {
        {0, 0}, {0, -64},    {0, 1 << 30}, {0, 63},   {1, 0},         {1, -1},
        {2, 0}, {2, 100000}, {3, 0},       {3, 7},    {3, 128},       {4, 0},
        {4, 3}, {4, 16},     {5, 0},       {5, -512}, {5, INT32_MIN}, {5, 1 << 30},
        {6, 0}, {6, -1},     {6, 513},     {2, 6},    {1, 173},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        unsigned char *copy = malloc(len);
        memcpy(copy, data, len);
        memcpy(copy + 4 * bad[i].field, &bad[i].value, 4);
        char *tmp = wt_write_temp(copy, len);
        expect_reject(tmp, tp, tmp);
        unlink(tmp);
        free(tmp);
        free(copy);
    }
    free(data);
    free(mp);
    free(tp);
}

Test(worker, model_load_fails_when_tokenizer_is_truncated_or_corrupted)
{
    WT_REQUIRE_MODELS(dir);
    char *mp = wt_path(dir, "stories260K.bin"), *tp = wt_path(dir, "tok512.bin");
    size_t len;
    unsigned char *data = wt_read(tp, &len);
    size_t cuts[] = {0, 3, 4, 11, 100, len - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        char *tmp = wt_write_temp(data, cuts[i]);
        cr_assert_eq(expect_reject(mp, tmp, tmp), SL_EFORMAT);
        unlink(tmp);
        free(tmp);
    }
    /* Entry 0 starts at offset 4: score (4 bytes), then its length. */
    int32_t bad_len[] = {-1, 8, 1 << 30};
    for (size_t i = 0; i < sizeof(bad_len) / sizeof(bad_len[0]); i++) {
        unsigned char *copy = malloc(len);
        memcpy(copy, data, len);
        memcpy(copy + 8, &bad_len[i], 4);
        char *tmp = wt_write_temp(copy, len);
        expect_reject(mp, tmp, tmp);
        unlink(tmp);
        free(tmp);
        free(copy);
    }
    float nan = NAN;
    unsigned char *copy = malloc(len + 9);
    memcpy(copy, data, len);
    memcpy(copy + 4, &nan, 4);
    char *tmp = wt_write_temp(copy, len);
    expect_reject(mp, tmp, tmp);
    unlink(tmp);
    free(tmp);
    /* An extra entry: the tokenizer belongs to a bigger vocabulary than the model's. */
    memcpy(copy, data, len);
    memcpy(copy + len, "\0\0\0\0\1\0\0\0z", 9);
    tmp = wt_write_temp(copy, len + 9);
    expect_reject(mp, tmp, tmp);
    unlink(tmp);
    free(tmp);
    free(copy);
    free(data);
    free(mp);
    free(tp);
}

Test(worker, model_load_fails_when_file_is_missing_or_tokenizer_absent)
{
    cr_assert_eq(expect_reject("/nonexistent/sluice/model.bin", "/nonexistent/tok.bin",
                               "/nonexistent/sluice/model.bin"),
                 SL_ENOENT);
    cr_assert_eq(expect_reject("/nonexistent/sluice/model.bin", NULL, "model.bin"), SL_EINVAL);
    cr_assert_eq(expect_reject("synthetic:nope", NULL, "nope"), SL_EINVAL);
}

/* A tiny hand-made checkpoint with an unshared classifier (negative vocab_size) and a matching
 * 259-entry tokenizer, written from scratch. */
Test(worker, model_uses_separate_classifier_when_vocab_size_is_negative)
{
    struct sl_model_config c = {8, 16, 1, 2, 1, 259, 4, 1e-5f, 1e4f, false};
    uint64_t floats = sl_model_body_floats(&c);
    cr_assert_gt(floats, 0);
    size_t mlen = 28 + (size_t)floats * 4;
    unsigned char *mbuf = calloc(1, mlen);
    int32_t hdr[7] = {8, 16, 1, 2, 1, -259, 4};
    memcpy(mbuf, hdr, 28);
    float *body = (float *)(mbuf + 28);
    for (uint64_t i = 0; i < floats; i++)
        body[i] = (float)i;
    char *mfile = wt_write_temp(mbuf, mlen);

    struct sl_str tok;
    sl_str_init(&tok);
    int32_t mtl = 6;
    sl_str_append(&tok, &mtl, 4);
    for (int i = 0; i < 259; i++) {
        char p[8];
        int32_t l = i < 3 ? 3 : 6;
        if (i < 3)
            memcpy(p, i == 0 ? "unk" : i == 1 ? "bos" : "eos", 3);
        else
            snprintf(p, sizeof(p), "<0x%02X>", i - 3);
        float s = 0.0f;
        sl_str_append(&tok, &s, 4);
        sl_str_append(&tok, &l, 4);
        sl_str_append(&tok, p, (size_t)l);
    }
    char *tfile = wt_write_temp(tok.p, tok.len);

    struct sl_model *m = wt_load(mfile, tfile);
    cr_assert(!sl_model_config(m)->shared_classifier);
    cr_assert_eq(sl_model_config(m)->vocab_size, 259);
    cr_assert(m->w.wcls.data != m->w.token_embedding.data);
    const float *wcls = m->w.wcls.data;
    cr_assert_float_eq(wcls[0], (float)(floats - 259 * 8), 0.5f);
    cr_assert_float_eq(wcls[259 * 8 - 1], (float)(floats - 1), 0.5f);
    sl_model_free(m);

    /* The same body with a positive vocab_size is 259 * 8 floats too long. */
    hdr[5] = 259;
    memcpy(mbuf, hdr, 28);
    char *m2 = wt_write_temp(mbuf, mlen);
    expect_reject(m2, tfile, m2);
    unlink(m2);
    free(m2);
    unlink(mfile);
    unlink(tfile);
    free(mfile);
    free(tfile);
    free(mbuf);
    sl_str_dispose(&tok);
}

Test(worker, synthetic_model_is_deterministic_when_loaded_twice)
{
    struct sl_model *a = wt_load("synthetic", NULL);
    struct sl_model *b = wt_load("synthetic:tiny", NULL);
    cr_assert_str_eq(sl_model_id(a), "synthetic:tiny");
    const struct sl_model_config *c = sl_model_config(a);
    cr_assert_eq(c->dim, 64);
    cr_assert_eq(c->hidden_dim, 172);
    cr_assert_eq(c->n_layers, 5);
    cr_assert_eq(c->n_heads, 8);
    cr_assert_eq(c->n_kv_heads, 4);
    cr_assert_eq(c->vocab_size, 512);
    cr_assert_eq(c->seq_len, 512);
    uint64_t n = sl_model_body_floats(c);
    /* The synthetic body starts with the token embedding. */
    const float *wa = a->w.token_embedding.data, *wb = b->w.token_embedding.data;
    cr_assert(memcmp(wa, wb, (size_t)n * sizeof(float)) == 0);
    for (uint64_t i = 0; i < n; i++)
        cr_assert(isfinite(wa[i]) && fabsf(wa[i]) <= 1.0f);
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < c->dim; i++)
            cr_assert_eq(a->w.layers[l].rms_att[i], 1.0f);
    cr_assert_eq(sl_tok_vocab_size(sl_model_tok(a)), 512);
    sl_model_free(a);
    sl_model_free(b);
}

Test(worker, synthetic_model_has_stories15m_shape_when_named)
{
    struct sl_model *m = wt_load("synthetic:stories15M", NULL);
    const struct sl_model_config *c = sl_model_config(m);
    cr_assert_str_eq(sl_model_id(m), "synthetic:stories15M");
    cr_assert_eq(c->dim, 288);
    cr_assert_eq(c->hidden_dim, 768);
    cr_assert_eq(c->n_layers, 6);
    cr_assert_eq(c->n_heads, 6);
    cr_assert_eq(c->n_kv_heads, 6);
    cr_assert_eq(c->vocab_size, 32000);
    cr_assert_eq(c->seq_len, 256);
    cr_assert_eq(sl_tok_vocab_size(sl_model_tok(m)), 32000);
    cr_assert_eq(sl_model_kv_block_bytes(m, 16, SL_KV_F32), (size_t)2 * 6 * 16 * 288 * 4);
    sl_model_free(m);
}

Test(worker, worker_reports_kv_bytes_when_created)
{
    struct sl_model *m = wt_load("synthetic", NULL);
    struct sl_backend_opts o = {
        .n_kv_blocks = 10, .block_size = 16, .max_batch_tokens = 32, .max_seqs = 4, .threads = 1};
    struct sl_worker *w = NULL;
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w), SL_OK);
    cr_assert_eq(sl_worker_kv_bytes(w), 10 * sl_model_kv_block_bytes(m, 16, SL_KV_F32));
    cr_assert_eq(sl_worker_model(w), m);
    cr_assert_eq(sl_worker_opts(w)->max_seqs, 4);
    sl_worker_free(w);
    struct sl_backend_opts bad = o;
    bad.block_size = 0;
    w = NULL;
    cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &bad, &w), SL_EINVAL);
    cr_assert_null(w);
    sl_model_free(m);
}
