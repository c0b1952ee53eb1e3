#include "worker_test.h"

#include <jansson.h>
#include <pthread.h>

/* Decodes ids[1..n) (ids[0] is BOS) the way a streaming client would, prev by prev. */
static void decode_all(const struct sl_tok *t, const int32_t *ids, int n, struct sl_str *out)
{
    for (int i = 1; i < n; i++) {
        size_t len;
        const char *p = sl_tok_decode(t, ids[i - 1], ids[i], &len);
        sl_str_append(out, p, len);
    }
}

static void check_round_trip(const struct sl_tok *t, const char *text, size_t len)
{
    int32_t ids[1024];
    int n = -1;
    cr_assert_eq(sl_tok_encode(t, text, len, true, ids, 1024, &n), SL_OK, "encode \"%s\"", text);
    cr_assert_eq(ids[0], 1);
    for (int i = 0; i < n; i++)
        cr_assert(ids[i] >= 0 && ids[i] < sl_tok_vocab_size(t));
    struct sl_str s;
    sl_str_init(&s);
    sl_str_append(&s, "", 0);
    decode_all(t, ids, n, &s);
    cr_assert_eq(s.len, len, "\"%s\" decoded to %zu bytes \"%s\"", text, s.len, s.p);
    cr_assert(memcmp(s.p, text, len) == 0, "\"%s\" decoded to \"%s\"", text, s.p);
    sl_str_dispose(&s);
}

static const char *const texts[] = {
    "Once upon a time, there was a little girl named Lily.",
    "Hello, world!",
    "a",
    " ",
    "  two leading spaces and trailing  ",
    "tabs\tand\nnew lines\n\n",
    "héllo wörld — “quoted” … 5€",
    "日本語のテキストと中文",
    "emoji 😀🎉👍🏽 mixed with text",
    "<0x41> looks like a byte token",
    "\xf4\x8f\xbf\xbf max code point",
    "ÿ",
};

Test(worker, synthetic_tokenizer_round_trips_when_text_is_any_utf8)
{
    struct sl_tok *tiny = sl_tok_synthetic(512);
    struct sl_tok *big = sl_tok_synthetic(32000);
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        check_round_trip(tiny, texts[i], strlen(texts[i]));
        check_round_trip(big, texts[i], strlen(texts[i]));
    }
    check_round_trip(tiny, "nul\0inside", 10); /* a NUL byte is valid UTF-8 */
    sl_tok_free(tiny);
    sl_tok_free(big);
}

Test(worker, encode_gives_only_bos_when_text_is_empty)
{
    struct sl_tok *t = sl_tok_synthetic(512);
    int32_t ids[4];
    int n = -1;
    cr_assert_eq(sl_tok_encode(t, "", 0, true, ids, 4, &n), SL_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(sl_tok_encode(t, "", 0, false, ids, 4, &n), SL_OK);
    cr_assert_eq(n, 0);
    sl_tok_free(t);
}

Test(worker, synthetic_tokenizer_merges_when_pieces_exist)
{
    struct sl_tok *t = sl_tok_synthetic(512);
    const char *text = "Once upon a time the little girl was happy";
    int32_t ids[128];
    int n = 0;
    cr_assert_eq(sl_tok_encode(t, text, strlen(text), false, ids, 128, &n), SL_OK);
    /* " Once" " upon" " a" " time" ... are all pieces: far fewer ids than characters. */
    cr_assert_lt(n, (int)strlen(text) / 3, "only %d merges", (int)strlen(text) + 1 - n);
    cr_assert_eq(ids[0], sl_tok_lookup(t, " Once", 5) >= 0 ? sl_tok_lookup(t, " Once", 5) : ids[0]);
    sl_tok_free(t);
}

Test(worker, synthetic_vocab_has_llama2c_layout_when_built)
{
    struct sl_tok *t = sl_tok_synthetic(512);
    size_t len;
    cr_assert_eq(sl_tok_vocab_size(t), 512);
    cr_assert_eq(t->piece_len[0], 5);
    cr_assert(memcmp(t->pieces[0], "<unk>", 5) == 0);
    cr_assert(memcmp(t->pieces[3], "<0x00>", 6) == 0);
    cr_assert(memcmp(t->pieces[258], "<0xFF>", 6) == 0);
    const char *p = sl_tok_decode(t, 5, 3 + 0xAB, &len);
    cr_assert_eq(len, 1);
    cr_assert_eq((unsigned char)p[0], 0xAB);
    /* Every piece is unique, and every multi-character text piece is two pieces merged. */
    for (int i = 0; i < 512; i++)
        for (int j = i + 1; j < 512; j++)
            cr_assert(!(t->piece_len[i] == t->piece_len[j] &&
                        memcmp(t->pieces[i], t->pieces[j], t->piece_len[i]) == 0),
                      "pieces %d and %d are equal", i, j);
    int merged = 0;
    for (int i = 259; i < 512; i++) {
        const char *s = t->pieces[i];
        uint32_t l = t->piece_len[i];
        if (l < 2 || sl_utf8_complete_prefix(s, l) != l || ((unsigned char)s[0] >= 0x80 && l <= 4))
            continue;
        bool ok = false;
        for (uint32_t k = 1; k < l && !ok; k++)
            ok = sl_tok_lookup(t, s, k) >= 0 && sl_tok_lookup(t, s + k, l - k) >= 0;
        cr_assert(ok, "piece %d \"%.*s\" is not a merge of two pieces", i, (int)l, s);
        merged++;
    }
    cr_assert_gt(merged, 50);
    sl_tok_free(t);
}

Test(worker, encode_falls_back_to_bytes_when_char_is_not_in_vocab)
{
    struct sl_tok *t = sl_tok_synthetic(512);
    int32_t ids[16];
    int n = 0;
    cr_assert_eq(sl_tok_encode(t, "日", 3, false, ids, 16, &n), SL_OK);
    cr_assert_eq(n, 4);
    cr_assert_eq(ids[0], sl_tok_lookup(t, " ", 1));
    cr_assert_eq(ids[1], 0xE6 + 3);
    cr_assert_eq(ids[2], 0x97 + 3);
    cr_assert_eq(ids[3], 0xA5 + 3);
    sl_tok_free(t);
}

Test(worker, encode_rejects_text_when_utf8_is_invalid)
{
    static const char *const bad[] = {
        "\xff",         "abc\xc3",          "\xc3\x28",    "\xc0\xaf", "\xe0\x80\xaf",
        "\xed\xa0\x80", "\xf4\x90\x80\x80", "ok \xe2\x82", "\x80",     "\xf8\x88\x80\x80\x80",
    };
    struct sl_tok *t = sl_tok_synthetic(512);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int32_t ids[64];
        int n = 0;
        cr_assert_eq(sl_tok_encode(t, bad[i], strlen(bad[i]), true, ids, 64, &n), SL_EINVAL,
                     "case %zu accepted", i);
    }
    sl_tok_free(t);
}

Test(worker, encode_returns_erange_when_max_out_is_too_small)
{
    struct sl_tok *t = sl_tok_synthetic(512);
    const char *text = "Hello, world! 😀";
    int32_t ids[64];
    int n = 0;
    cr_assert_eq(sl_tok_encode(t, text, strlen(text), true, ids, 64, &n), SL_OK);
    int need = n;
    cr_assert_gt(need, 3);
    cr_assert_eq(sl_tok_encode(t, text, strlen(text), true, ids, need, &n), SL_OK);
    cr_assert_eq(n, need);
    cr_assert_eq(sl_tok_encode(t, text, strlen(text), true, ids, need - 1, &n), SL_ERANGE);
    cr_assert_eq(n, need);
    cr_assert_eq(sl_tok_encode(t, text, strlen(text), true, ids, 0, &n), SL_ERANGE);
    cr_assert_eq(n, 1);
    sl_tok_free(t);
}

Test(worker, decode_drops_leading_space_only_after_bos)
{
    struct sl_tok *t = sl_tok_synthetic(512);
    int32_t id = sl_tok_lookup(t, " the", 4);
    cr_assert_geq(id, 0);
    size_t len;
    const char *p = sl_tok_decode(t, 1, id, &len);
    cr_assert_eq(len, 3);
    cr_assert(memcmp(p, "the", 3) == 0);
    p = sl_tok_decode(t, 42, id, &len);
    cr_assert_eq(len, 4);
    cr_assert(memcmp(p, " the", 4) == 0);
    p = sl_tok_decode(t, 1, 512, &len);
    cr_assert_eq(len, 0);
    p = sl_tok_decode(t, 1, -1, &len);
    cr_assert_eq(len, 0);
    sl_tok_free(t);
}

struct enc_job {
    const struct sl_tok *t;
    const char *text;
    int32_t ids[256];
    int n;
};

static void *enc_thread(void *arg)
{
    struct enc_job *j = arg;
    for (int it = 0; it < 200; it++) {
        int32_t ids[256];
        int n = 0;
        if (sl_tok_encode(j->t, j->text, strlen(j->text), true, ids, 256, &n) != SL_OK ||
            n != j->n || memcmp(ids, j->ids, (size_t)n * sizeof(int32_t)) != 0) {
            j->n = -1;
            break;
        }
    }
    return NULL;
}

Test(worker, encode_gives_same_ids_when_called_from_many_threads)
{
    struct sl_tok *t = sl_tok_synthetic(32000);
    struct enc_job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i].t = t;
        jobs[i].text = texts[i % 3 == 0 ? 0 : i];
        cr_assert_eq(sl_tok_encode(t, jobs[i].text, strlen(jobs[i].text), true, jobs[i].ids, 256,
                                   &jobs[i].n),
                     SL_OK);
        pthread_create(&th[i], NULL, enc_thread, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        cr_assert_neq(jobs[i].n, -1, "thread %d saw different ids", i);
    }
    sl_tok_free(t);
}

/* The golden prompts with the real tokenizers: llama2.c's encode() output, BOS included (tok
 * NULL: the vocabulary inside a GGUF file or an HF folder). */
static void check_golden_prompts(const char *dir, const char *model, const char *tok,
                                 const char *golden)
{
    char *mp = wt_path(dir, model), *tp = tok ? wt_path(dir, tok) : NULL;
    char *gp = wt_path(dir, golden);
    struct sl_model *m = wt_load(mp, tp);
    json_error_t jerr;
    json_t *root = json_load_file(gp, 0, &jerr);
    cr_assert_not_null(root, "%s: %s", gp, jerr.text);
    size_t i;
    json_t *c;
    json_array_foreach(root, i, c)
    {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        json_t *want = json_object_get(c, "prompt_token_ids");
        int32_t ids[512];
        int n = 0;
        cr_assert_eq(sl_tok_encode(sl_model_tok(m), prompt, strlen(prompt), true, ids, 512, &n),
                     SL_OK);
        cr_assert_eq((size_t)n, json_array_size(want), "\"%s\": %d ids, want %zu", prompt, n,
                     json_array_size(want));
        for (int k = 0; k < n; k++)
            cr_assert_eq(ids[k], json_integer_value(json_array_get(want, (size_t)k)),
                         "\"%s\": id %d differs", prompt, k);
    }
    json_decref(root);
    sl_model_free(m);
    free(mp);
    free(tp);
    free(gp);
}

Test(worker, encode_matches_llama2c_when_prompts_are_golden)
{
    WT_REQUIRE_MODELS(dir);
    check_golden_prompts(dir, "stories260K.bin", "tok512.bin", "golden/stories260K.json");
    check_golden_prompts(dir, "tinystories-656K/llama2c/model.bin",
                         "tinystories-656K/llama2c/tokenizer.bin", "golden/tinystories-656K.json");
}

Test(worker, encode_matches_golden_when_vocab_is_gguf_or_hf)
{
    WT_REQUIRE_MODELS(dir);
    check_golden_prompts(dir, "stories260K.gguf", NULL, "golden/stories260K.json");
    check_golden_prompts(dir, "stories260K.gguf", NULL, "golden/stories260K.gguf.llamacpp.json");
    check_golden_prompts(dir, "tinystories-656K/hf", NULL, "golden/tinystories-656K.json");
}

/* <s> and </s> (ids 1, 2) of a vocabulary with or without token types decode to nothing; <unk>
 * (id 0) and every other piece to its text. */
static void check_controls_silent(const struct sl_tok *t)
{
    for (int32_t id = 1; id < 3; id++) {
        size_t len = 99;
        sl_tok_decode(t, 5, id, &len);
        cr_assert_eq(len, 0, "id %d decodes to %zu bytes", id, len);
    }
    size_t len = 0;
    const char *p = sl_tok_decode(t, 5, 0, &len);
    cr_assert(len == 5 && memcmp(p, "<unk>", 5) == 0, "<unk> stays text");
    sl_tok_decode(t, 5, 3 + 'A', &len);
    cr_assert_eq(len, 1, "a byte token still decodes");
}

Test(worker, llama_control_tokens_decode_to_nothing_when_the_vocab_has_no_types)
{
    struct sl_tok *t = sl_tok_synthetic(512);
    check_controls_silent(t);
    sl_tok_free(t);
    WT_REQUIRE_MODELS(dir);
    char *mp = wt_path(dir, "stories260K.bin"), *tp = wt_path(dir, "tok512.bin");
    char *gp = wt_path(dir, "stories260K.gguf");
    struct sl_model *b = wt_load(mp, tp), *g = wt_load(gp, NULL);
    check_controls_silent(sl_model_tok(b));
    check_controls_silent(sl_model_tok(g));
    sl_model_free(b);
    sl_model_free(g);
    free(mp);
    free(tp);
    free(gp);
}

/* The GGUF vocabulary is tok512 with "▁" for spaces: the same ids for any text. */
Test(worker, gguf_vocab_encodes_like_tok512_when_text_is_any_utf8)
{
    WT_REQUIRE_MODELS(dir);
    char *gp = wt_path(dir, "stories260K.gguf"), *bp = wt_path(dir, "stories260K.bin");
    char *tp = wt_path(dir, "tok512.bin");
    struct sl_model *g = wt_load(gp, NULL), *b = wt_load(bp, tp);
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        int32_t x[1024], y[1024];
        int nx = 0, ny = 0;
        const char *s = texts[i];
        cr_assert_eq(sl_tok_encode(sl_model_tok(g), s, strlen(s), true, x, 1024, &nx), SL_OK);
        cr_assert_eq(sl_tok_encode(sl_model_tok(b), s, strlen(s), true, y, 1024, &ny), SL_OK);
        cr_assert_eq(nx, ny, "\"%s\"", s);
        cr_assert_eq(memcmp(x, y, (size_t)nx * sizeof(int32_t)), 0, "\"%s\"", s);
        check_round_trip(sl_model_tok(g), s, strlen(s));
    }
    sl_model_free(g);
    sl_model_free(b);
    free(gp);
    free(bp);
    free(tp);
}

/* The HF vocabulary has no byte tokens: text it can spell round-trips, other characters become
 * one fused <unk>. */
Test(worker, hf_tokenizer_round_trips_when_text_is_in_vocab)
{
    WT_REQUIRE_MODELS(dir);
    char *hp = wt_path(dir, "tinystories-656K/hf");
    struct sl_model *m = wt_load(hp, NULL);
    const struct sl_tok *t = sl_model_tok(m);
    static const char *const ok[] = {
        "Once upon a time, there was a little girl named Lily.",
        "Hello, world!",
        "a",
        " ",
        "  two leading spaces and trailing  ",
        "new lines\n\nand \"quotes\" and 'apostrophes'",
        "Lily wanted to play. She said: \"Yes!\"",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        check_round_trip(t, ok[i], strlen(ok[i]));
    int32_t ids[64];
    int n = 0;
    cr_assert_eq(sl_tok_encode(t, "日本語", strlen("日本語"), false, ids, 64, &n), SL_OK);
    cr_assert_eq(n, 2, "%d ids", n);
    cr_assert_eq(ids[0], 80); /* the prepended "▁" */
    cr_assert_eq(ids[1], 0);  /* "日本語" fused into one <unk> */
    /* A literal "▁" in the input is the same as a space after normalization. */
    int32_t a[64], b[64];
    int na = 0, nb = 0;
    cr_assert_eq(sl_tok_encode(t, "the cat", 7, true, a, 64, &na), SL_OK);
    cr_assert_eq(sl_tok_encode(t,
                               "the\xe2\x96\x81"
                               "cat",
                               9, true, b, 64, &nb),
                 SL_OK);
    cr_assert_eq(na, nb);
    cr_assert_eq(memcmp(a, b, (size_t)na * 4), 0);
    /* Special tokens in the text are matched before BPE: "▁Once", <|end_story|>, "▁upon". */
    cr_assert_eq(sl_tok_encode(t, "Once", 4, false, a, 64, &na), SL_OK);
    cr_assert_eq(sl_tok_encode(t, "upon", 4, false, a + na, 64 - na, &nb), SL_OK);
    na += nb;
    int32_t c[64];
    int nc = 0;
    const char *sp = "Once<|end_story|> upon";
    cr_assert_eq(sl_tok_encode(t, sp, strlen(sp), false, c, 64, &nc), SL_OK);
    int k = 0;
    cr_assert_eq(sl_tok_encode(t, "Once", 4, false, ids, 64, &k), SL_OK);
    cr_assert_eq(nc, na + 1);
    cr_assert_eq(memcmp(c, ids, (size_t)k * 4), 0);
    cr_assert_eq(c[k], 2);
    cr_assert_eq(memcmp(c + k + 1, a + k, (size_t)(na - k) * 4), 0);
    /* Special tokens decode to nothing. */
    size_t len;
    sl_tok_decode(t, 57, 2, &len);
    cr_assert_eq(len, 0);
    sl_model_free(m);
    free(hp);
}

/* A llama2.c tokenizer image: <unk>, <s>, </s>, the 256 byte tokens, then `extra` pieces with
 * their scores. */
static struct sl_tok *tok_from(const char *const *extra, const float *scores, int n_extra)
{
    struct sl_str img;
    sl_str_init(&img);
    int32_t mtl = 16;
    sl_str_append(&img, &mtl, 4);
    for (int i = 0; i < 259 + n_extra; i++) {
        char p[17];
        const char *s = p;
        if (i < 3)
            s = i == 0 ? "<unk>" : i == 1 ? "\n<s>\n" : "\n</s>\n";
        else if (i < 259)
            snprintf(p, sizeof(p), "<0x%02X>", i - 3);
        else
            s = extra[i - 259];
        float sc = i < 259 ? 0.0f : scores[i - 259];
        int32_t l = (int32_t)strlen(s);
        sl_str_append(&img, &sc, 4);
        sl_str_append(&img, &l, 4);
        sl_str_append(&img, s, (size_t)l);
    }
    char err[256];
    struct sl_tok *t =
        sl_tok_parse((const unsigned char *)img.p, img.len, 259 + n_extra, err, sizeof(err));
    cr_assert_not_null(t, "%s", err);
    sl_str_dispose(&img);
    return t;
}

static void expect_ids(const struct sl_tok *t, const char *text, const int32_t *want, int n_want)
{
    int32_t ids[64];
    int n = 0;
    cr_assert_eq(sl_tok_encode(t, text, strlen(text), false, ids, 64, &n), SL_OK);
    cr_assert_eq(n, n_want, "\"%s\": %d ids, want %d", text, n, n_want);
    for (int i = 0; i < n; i++)
        cr_assert_eq(ids[i], want[i], "\"%s\": id %d is %d, want %d", text, i, ids[i], want[i]);
}

Test(worker, encode_merges_leftmost_pair_when_scores_tie)
{
    /* 259 " ", 260 "a", 261 "aa" */
    const char *const extra[] = {" ", "a", "aa"};
    const float scores[] = {-10.0f, -10.0f, -1.0f};
    struct sl_tok *t = tok_from(extra, scores, 3);
    expect_ids(t, "aaa", (const int32_t[]){259, 261, 260}, 3);
    expect_ids(t, "aaaa", (const int32_t[]){259, 261, 261}, 3);
    sl_tok_free(t);
}

Test(worker, encode_merges_best_score_first_when_pairs_overlap)
{
    /* 259 " ", 260 "a", 261 "b", 262 "c", 263 "ab", 264 "bc", 265 " a", 266 "abc" */
    const char *const extra[] = {" ", "a", "b", "c", "ab", "bc", " a", "abc"};
    const float scores[] = {0, 0, 0, 0, -2.0f, -1.0f, -3.0f, 5.0f};
    struct sl_tok *t = tok_from(extra, scores, 8);
    /* "bc" (-1) beats "ab" (-2) and " a" (-3); the new pair "a"+"bc" spells "abc" (5), which
     * then beats " a". Had "ab" merged first, " ab" would be no piece either: same end. */
    expect_ids(t, "abc", (const int32_t[]){259, 266}, 2);
    /* In " ab", "ab" (-2) beats " a" (-3). */
    expect_ids(t, "ab", (const int32_t[]){259, 263}, 2);
    /* "é" is not a piece: its two bytes fall back to byte tokens and never merge. */
    expect_ids(t, "bé", (const int32_t[]){259, 261, 0xC3 + 3, 0xA9 + 3}, 4);
    sl_tok_free(t);
}

Test(worker, encode_takes_the_lowest_id_when_a_piece_is_spelled_twice)
{
    /* 259 " ", 260 "a", 261 "b", 262 "ab", 263 "ab" again (a higher score, unused: the lowest
     * id's score decides, as llama2.c's sorted lookup finds it), 264 "x" */
    const char *const extra[] = {" ", "a", "b", "ab", "ab", "x"};
    const float scores[] = {0, 0, 0, -1.0f, 9.0f, 0};
    struct sl_tok *t = tok_from(extra, scores, 6);
    expect_ids(t, "ab", (const int32_t[]){259, 262}, 2);
    expect_ids(t, "xab", (const int32_t[]){259, 264, 262}, 3);
    cr_assert_eq(sl_tok_lookup(t, "ab", 2), 262);
    cr_assert_eq(sl_tok_lookup(t, "abx", 3), -1);
    cr_assert_eq(sl_tok_lookup(t, "", 0), -1);
    sl_tok_free(t);
}

/* ---------------------------------------------------------------------------------------------
 * HF BPE semantics on small tokenizer.json texts
 */

static struct sl_tok *hf_tok(const char *vocab, const char *merges, const char *extra)
{
    char json[8192];
    snprintf(json, sizeof(json),
             "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"
             "{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
             "{\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}%s],"
             "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
             "{\"type\": \"Prepend\", \"prepend\": \"\u2581\"},"
             "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]},"
             "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"},"
             "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
             "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": %s,"
             "\"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, %s},"
             "\"merges\": [%s]}}",
             extra ? extra : "", extra && strstr(extra, "nofuse") ? "false" : "true", vocab,
             merges);
    char err[256];
    struct sl_tok *t = sl_tok_hf_parse(json, strlen(json), 1, err, sizeof(err));
    cr_assert_not_null(t, "%s", err);
    return t;
}

Test(worker, hf_bpe_applies_only_listed_merges_by_rank_when_encoding)
{
    /* 3 "▁", 4 "a", 5 "b", 6 "ab", 7 "▁a", 8 "▁ab", 9 "c", 10 "bc", 11 "abc" */
    struct sl_tok *t = hf_tok("\"\u2581\": 3, \"a\": 4, \"b\": 5, \"ab\": 6, \"\u2581a\": 7, "
                              "\"\u2581ab\": 8, \"c\": 9, \"bc\": 10, \"abc\": 11",
                              "\"b c\", \"a b\", \"\u2581 a\", \"\u2581a b\", \"a bc\"", NULL);
    /* "▁ab": (a,b) rank 1 beats (▁,a) rank 2; then (▁,ab) is no merge, though "▁ab" is a piece
     * (llama2.c's rule would take it). */
    expect_ids(t, "ab", (const int32_t[]){3, 6}, 2);
    /* "▁abc": (b,c) rank 0 first; then (▁,a) rank 2 beats (a,bc) rank 4, and (▁a,bc) is no
     * merge, so "abc" never forms. */
    expect_ids(t, "abc", (const int32_t[]){7, 10}, 2);
    expect_ids(t, "a abc", (const int32_t[]){7, 7, 10}, 3);
    /* "▁a": (▁,a) rank 2. */
    expect_ids(t, "a", (const int32_t[]){7}, 1);
    /* A token that is not normalized splits the raw input, and each side is normalized on its
     * own, so each gets its "▁" (tokenizers' behaviour: "<s>Hello" gives <s> "▁Hello"). */
    expect_ids(t, "a<s>a", (const int32_t[]){7, 1, 7}, 3);
    int32_t ids[8];
    int n = 0;
    cr_assert_eq(sl_tok_encode(t, "", 0, true, ids, 8, &n), SL_OK);
    cr_assert_eq(n, 1);
    cr_assert_eq(ids[0], 1);
    size_t len;
    const char *p = sl_tok_decode(t, 1, 7, &len);
    cr_assert_eq(len, 1, "Strip drops the space after BOS");
    cr_assert_eq(p[0], 'a');
    p = sl_tok_decode(t, 4, 7, &len);
    cr_assert_eq(len, 2);
    sl_tok_decode(t, 4, 2, &len);
    cr_assert_eq(len, 0);
    sl_tok_free(t);
}

Test(worker, hf_bpe_falls_back_to_bytes_or_unk_when_char_is_unknown)
{
    /* "é" is C3 A9: both bytes exist. "ü" is C3 BC: BC does not, so it is <unk>. */
    struct sl_tok *t = hf_tok("\"\u2581\": 3, \"a\": 4, \"<0xC3>\": 5, \"<0xA9>\": 6", "", NULL);
    expect_ids(t, "aé", (const int32_t[]){3, 4, 5, 6}, 4);
    expect_ids(t, "üü a", (const int32_t[]){3, 0, 3, 4}, 4);
    size_t len;
    cr_assert_eq((unsigned char)*sl_tok_decode(t, 4, 5, &len), 0xC3);
    cr_assert_eq(len, 1);
    sl_tok_free(t);
    /* Without fuse_unk every unknown character is its own <unk>. */
    t = hf_tok("\"\u2581\": 3, \"a\": 4", "",
               ",{\"id\": 5, \"content\": \"nofuse\", \"special\": false}");
    expect_ids(t, "üü", (const int32_t[]){3, 0, 0}, 3);
    expect_ids(t, "anofusea", (const int32_t[]){3, 4, 5, 4}, 4);
    sl_tok_free(t);
}

Test(worker, tok512_round_trips_when_text_is_any_utf8)
{
    WT_REQUIRE_MODELS(dir);
    char *mp = wt_path(dir, "stories260K.bin"), *tp = wt_path(dir, "tok512.bin");
    struct sl_model *m = wt_load(mp, tp);
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
        check_round_trip(sl_model_tok(m), texts[i], strlen(texts[i]));
    sl_model_free(m);
    free(mp);
    free(tp);
}
