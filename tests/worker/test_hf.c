/* Hugging Face folders: the real TinyStories-656K (checked against its llama2.c conversion),
 * synthetic folders with F16/BF16 tensors written here, and truncated or corrupted copies of
 * model.safetensors, config.json and tokenizer.json. */
#include "fmt_test.h"

#include <jansson.h>
#include <sys/stat.h>

#define HF_DIR "tinystories-656K/hf"

/* ---------------------------------------------------------------------------------------------
 * Temporary folders
 */

static char *tmp_dir(void)
{
    char *d = strdup("/tmp/sluice-hf-test-XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

static void put_file(const char *dir, const char *name, const void *data, size_t len)
{
    char *p = wt_path(dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "%s", p);
    if (len)
        cr_assert_eq(fwrite(data, 1, len, f), len);
    fclose(f);
    free(p);
}

static void put_text(const char *dir, const char *name, const char *text)
{
    put_file(dir, name, text, strlen(text));
}

static void link_file(const char *dir, const char *name, const char *target)
{
    char *p = wt_path(dir, name);
    cr_assert_eq(symlink(target, p), 0, "symlink %s", p);
    free(p);
}

static void rm_dir(char *dir)
{
    static const char *const names[] = {"config.json", "model.safetensors", "tokenizer.json",
                                        "generation_config.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char *p = wt_path(dir, names[i]);
        unlink(p);
        free(p);
    }
    rmdir(dir);
    free(dir);
}

/* Loads dir expecting failure; the message must contain needle. */
static void expect_reject_dir(const char *dir, const char *needle)
{
    struct sl_model *m = (struct sl_model *)0x1;
    char err[512] = "";
    int rc = sl_model_load(dir, NULL, &m, err, sizeof(err));
    cr_assert_lt(rc, 0, "%s accepted (want \"%s\")", dir, needle);
    cr_assert_eq(m, (struct sl_model *)0x1);
    cr_assert(strstr(err, needle) != NULL, "\"%s\" does not say \"%s\"", err, needle);
}

/* ---------------------------------------------------------------------------------------------
 * The real model
 */

static bool inside_map(const struct sl_model *m, const void *p)
{
    const unsigned char *a = m->map, *x = p;
    return x >= a && x < a + m->map_len;
}

Test(worker, hf_matches_llama2c_conversion_when_model_is_tinystories656k)
{
    WT_REQUIRE_MODELS(dir);
    char *hp = wt_path(dir, HF_DIR), *bp = wt_path(dir, "tinystories-656K/llama2c/model.bin");
    char *tp = wt_path(dir, "tinystories-656K/llama2c/tokenizer.bin");
    struct sl_model *h = wt_load(hp, NULL), *b = wt_load(bp, tp);
    const struct sl_model_config *hc = sl_model_config(h), *bc = sl_model_config(b);
    cr_assert_str_eq(sl_model_id(h), "hf");
    cr_assert_eq(hc->dim, 128);
    cr_assert_eq(hc->hidden_dim, 384);
    cr_assert_eq(hc->n_layers, 2);
    cr_assert_eq(hc->n_heads, 8);
    cr_assert_eq(hc->n_kv_heads, 4);
    cr_assert_eq(hc->vocab_size, 2048);
    cr_assert_eq(hc->seq_len, bc->seq_len);
    cr_assert_eq(hc->rms_eps, 1e-6f);
    cr_assert_eq(hc->rope_theta, 10000.0f);
    cr_assert(hc->shared_classifier);
    int dim = 128, kv = 64, hid = 384;
    size_t V = 2048;
    /* Tied through the __metadata__ alias: one matrix, in the mapping. */
    cr_assert_eq(h->w.token_embedding.data, h->w.wcls.data);
    cr_assert(inside_map(h, h->w.token_embedding.data));
    cr_assert_eq(memcmp(h->w.token_embedding.data, b->w.token_embedding.data, V * dim * 4), 0);
    cr_assert_eq(memcmp(h->w.rms_final, b->w.rms_final, (size_t)dim * 4), 0);
    for (int l = 0; l < 2; l++) {
        const struct sl_layer_weights *x = &h->w.layers[l], *y = &b->w.layers[l];
        cr_assert_eq(memcmp(x->rms_att, y->rms_att, (size_t)dim * 4), 0);
        cr_assert_eq(memcmp(x->rms_ffn, y->rms_ffn, (size_t)dim * 4), 0);
        /* q/k are permuted at load into model-owned buffers, byte-identical to the converter's
         * un-permuted llama2.c layout. */
        cr_assert(!inside_map(h, x->wq.data) && !inside_map(h, x->wk.data));
        cr_assert_eq(x->wq.rows, dim);
        cr_assert_eq(x->wk.rows, kv);
        cr_assert_eq(memcmp(x->wq.data, y->wq.data, (size_t)dim * dim * 4), 0, "layer %d q", l);
        cr_assert_eq(memcmp(x->wk.data, y->wk.data, (size_t)kv * dim * 4), 0, "layer %d k", l);
        cr_assert(inside_map(h, x->wv.data) && inside_map(h, x->w2.data));
        cr_assert_eq(memcmp(x->wv.data, y->wv.data, (size_t)kv * dim * 4), 0);
        cr_assert_eq(memcmp(x->wo.data, y->wo.data, (size_t)dim * dim * 4), 0);
        cr_assert_eq(memcmp(x->w1.data, y->w1.data, (size_t)hid * dim * 4), 0);
        cr_assert_eq(memcmp(x->w2.data, y->w2.data, (size_t)hid * dim * 4), 0);
        cr_assert_eq(memcmp(x->w3.data, y->w3.data, (size_t)hid * dim * 4), 0);
    }
    /* HF generation stops on EOS (<|end_story|>) only. */
    cr_assert(sl_model_is_stop_token(h, 2));
    cr_assert(!sl_model_is_stop_token(h, 1));
    cr_assert_eq(sl_tok_bos(sl_model_tok(h)), 1);
    sl_model_free(h);
    sl_model_free(b);
    free(hp);
    free(bp);
    free(tp);
}

Test(worker, hf_decode_matches_reference_text_when_ids_are_golden)
{
    WT_REQUIRE_MODELS(dir);
    char *hp = wt_path(dir, HF_DIR), *gp = wt_path(dir, "golden/tinystories-656K.json");
    struct sl_model *m = wt_load(hp, NULL);
    json_error_t je;
    json_t *root = json_load_file(gp, 0, &je);
    cr_assert_not_null(root, "%s", je.text);
    size_t i;
    json_t *c;
    json_array_foreach(root, i, c)
    {
        json_t *ids = json_object_get(c, "all_token_ids");
        const char *want = json_string_value(json_object_get(c, "hf_reference_text"));
        struct sl_str s;
        sl_str_init(&s);
        sl_str_append(&s, "", 0);
        for (size_t k = 1; k < json_array_size(ids); k++) {
            size_t n;
            const char *p = sl_tok_decode(sl_model_tok(m),
                                          (int32_t)json_integer_value(json_array_get(ids, k - 1)),
                                          (int32_t)json_integer_value(json_array_get(ids, k)), &n);
            sl_str_append(&s, p, n);
        }
        cr_assert_str_eq(s.p, want);
        sl_str_dispose(&s);
    }
    json_decref(root);
    sl_model_free(m);
    free(hp);
    free(gp);
}

/* ---------------------------------------------------------------------------------------------
 * Corrupt copies of the real model.safetensors, parsed in memory against a guard page
 */

struct real {
    unsigned char *data;
    size_t len;
    char *hdr; /* the JSON header, NUL-terminated */
    size_t hlen;
    struct sl_model_config cfg;
};

static void real_load(struct real *r, const char *dir)
{
    char *sp = wt_path(dir, HF_DIR "/model.safetensors"), *hp = wt_path(dir, HF_DIR);
    r->data = wt_read(sp, &r->len);
    uint64_t h;
    memcpy(&h, r->data, 8);
    r->hlen = (size_t)h;
    r->hdr = strndup((const char *)r->data + 8, r->hlen);
    struct sl_model *m = wt_load(hp, NULL);
    r->cfg = *sl_model_config(m);
    sl_model_free(m);
    free(sp);
    free(hp);
}

static void real_dispose(struct real *r)
{
    free(r->data);
    free(r->hdr);
}

static int parse_st(const struct sl_model_config *cfg, const void *data, size_t len, char *err,
                    size_t errlen)
{
    struct ft_guard gd;
    ft_guard_init(&gd, len);
    const void *p = ft_guard_put(&gd, data, len);
    struct sl_model *m = sl_xcalloc(1, sizeof(*m));
    m->cfg = *cfg;
    err[0] = '\0';
    int rc = sl_model_safetensors_parse(m, p, len, "mem.safetensors", err, errlen);
    sl_model_free(m);
    ft_guard_dispose(&gd);
    return rc;
}

/* The real file with its header text edited: `from` (which must occur) becomes `to`. */
static unsigned char *edit_header(const struct real *r, const char *from, const char *to,
                                  size_t *len)
{
    const char *at = strstr(r->hdr, from);
    cr_assert_not_null(at, "\"%s\" is not in the header", from);
    struct sl_str h;
    sl_str_init(&h);
    sl_str_append(&h, r->hdr, (size_t)(at - r->hdr));
    sl_str_append(&h, to, strlen(to));
    sl_str_append(&h, at + strlen(from), strlen(at + strlen(from)));
    size_t body = r->len - 8 - r->hlen;
    *len = 8 + h.len + body;
    unsigned char *out = malloc(*len);
    uint64_t n = h.len;
    memcpy(out, &n, 8);
    memcpy(out + 8, h.p, h.len);
    memcpy(out + 8 + h.len, r->data + 8 + r->hlen, body);
    sl_str_dispose(&h);
    return out;
}

static void expect_bad_edit(const struct real *r, const struct sl_model_config *cfg,
                            const char *from, const char *to, const char *needle)
{
    size_t len;
    unsigned char *d = edit_header(r, from, to, &len);
    char err[512];
    int rc = parse_st(cfg, d, len, err, sizeof(err));
    cr_assert_eq(rc, SL_EFORMAT, "edit \"%s\" → \"%s\" accepted", from, to);
    cr_assert(strstr(err, "mem.safetensors") && strstr(err, needle),
              "edit \"%s\": message \"%s\" does not say \"%s\"", from, err, needle);
    free(d);
}

Test(worker, safetensors_rejects_every_cut_when_file_is_truncated)
{
    WT_REQUIRE_MODELS(dir);
    struct real r;
    real_load(&r, dir);
    char err[512];
    for (size_t n = 0; n < r.len; n += n < r.hlen + 200 ? 1 : 4099) {
        int rc = parse_st(&r.cfg, r.data, n, err, sizeof(err));
        cr_assert_eq(rc, SL_EFORMAT, "cut at %zu accepted", n);
        cr_assert(strstr(err, "mem.safetensors") != NULL, "cut at %zu: \"%s\"", n, err);
    }
    cr_assert_eq(parse_st(&r.cfg, r.data, r.len - 1, err, sizeof(err)), SL_EFORMAT);
    cr_assert_eq(parse_st(&r.cfg, r.data, r.len, err, sizeof(err)), SL_OK, "%s", err);
    real_dispose(&r);
}

Test(worker, safetensors_rejects_file_when_header_is_corrupt)
{
    WT_REQUIRE_MODELS(dir);
    struct real r;
    real_load(&r, dir);
    char err[512];
    /* The header length itself. */
    unsigned char *d = malloc(r.len);
    uint64_t bad_len[] = {0, 1, r.len - 7, UINT64_C(1) << 40, UINT64_MAX};
    for (size_t i = 0; i < sizeof(bad_len) / sizeof(bad_len[0]); i++) {
        memcpy(d, r.data, r.len);
        memcpy(d, &bad_len[i], 8);
        cr_assert_eq(parse_st(&r.cfg, d, r.len, err, sizeof(err)), SL_EFORMAT, "length %llu",
                     (unsigned long long)bad_len[i]);
    }
    /* Not JSON, or JSON that is not an object. */
    memcpy(d, r.data, r.len);
    d[8] = '#';
    cr_assert_eq(parse_st(&r.cfg, d, r.len, err, sizeof(err)), SL_EFORMAT);
    cr_assert(strstr(err, "bad JSON header") != NULL, "%s", err);
    free(d);
    expect_bad_edit(&r, &r.cfg, "{\"__metadata__\"", "[{\"__metadata__\"", "JSON");
    expect_bad_edit(&r, &r.cfg, "\"format\":\"pt\",", "\"format\":\"pt\"", "JSON");
    /* Entries. */
    const char *lm = "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2048,128],"
                     "\"data_offsets\":[0,1048576]}";
    expect_bad_edit(&r, &r.cfg, "\"lm_head.weight\":{\"dtype\":\"F32\"",
                    "\"lm_head.weight\":{\"dtype\":\"F33\"", "unknown dtype");
    expect_bad_edit(&r, &r.cfg, "\"lm_head.weight\":{\"dtype\":\"F32\"",
                    "\"lm_head.weight\":{\"dtype\":7", "dtype");
    expect_bad_edit(&r, &r.cfg, "\"model.norm.weight\":{\"dtype\":\"F32\"",
                    "\"model.norm.weight\":{\"dtype\":\"I32\"", "dtype I32");
    expect_bad_edit(&r, &r.cfg, lm,
                    "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2048,128],"
                    "\"data_offsets\":[0,1048572]}",
                    "data bytes");
    expect_bad_edit(&r, &r.cfg, lm,
                    "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2048,-128],"
                    "\"data_offsets\":[0,1048576]}",
                    "dimension");
    expect_bad_edit(&r, &r.cfg, lm,
                    "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2048,128],"
                    "\"data_offsets\":[-4,1048572]}",
                    "outside");
    expect_bad_edit(&r, &r.cfg, lm, "\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2048,128]}",
                    "data_offsets");
    expect_bad_edit(&r, &r.cfg, "[2623488,2624000]", "[2624000,2624512]", "outside");
    expect_bad_edit(&r, &r.cfg, "[2623488,2624000]", "[2623488,99999999999]", "outside");
    /* Consistent entries that do not fit the config. */
    expect_bad_edit(&r, &r.cfg,
                    "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"F32\","
                    "\"shape\":[128,128]",
                    "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"F32\","
                    "\"shape\":[64,256]",
                    "shape");
    expect_bad_edit(&r, &r.cfg, "model.layers.1.mlp.up_proj.weight",
                    "model.layers.1.mlp.up_projX.weight", "up_proj.weight is missing");
    expect_bad_edit(&r, &r.cfg,
                    "{\"format\":\"pt\",\"model.embed_tokens.weight\":\"lm_head.weight\"}", "7",
                    "__metadata__");
    /* Without the alias the tie flag still says where the embedding is; without either, no. */
    size_t len;
    d = edit_header(&r, "\"model.embed_tokens.weight\":\"lm_head.weight\"", "\"x\":\"y\"", &len);
    cr_assert_eq(parse_st(&r.cfg, d, len, err, sizeof(err)), SL_OK, "%s", err);
    struct sl_model_config untied = r.cfg;
    untied.shared_classifier = false;
    cr_assert_eq(parse_st(&untied, d, len, err, sizeof(err)), SL_EFORMAT);
    cr_assert(strstr(err, "tie_word_embeddings") != NULL, "%s", err);
    free(d);
    /* A bigger config than the file: every shape check names a tensor. */
    struct sl_model_config wide = r.cfg;
    wide.hidden_dim = 512;
    cr_assert_eq(parse_st(&wide, r.data, r.len, err, sizeof(err)), SL_EFORMAT);
    cr_assert(strstr(err, "shape") != NULL, "%s", err);
    real_dispose(&r);
}

/* config.json and tokenizer.json next to links to the real weights. */
Test(worker, hf_rejects_folder_when_config_or_tokenizer_is_bad)
{
    WT_REQUIRE_MODELS(dir);
    char *src = wt_path(dir, HF_DIR);
    char *st = wt_path(src, "model.safetensors"), *tj = wt_path(src, "tokenizer.json");
    char *cj = wt_path(src, "config.json");
    size_t clen;
    unsigned char *cfg = wt_read(cj, &clen);
    cfg[clen] = '\0';
    struct {
        const char *from, *to, *needle;
    } cfg_cases[] = {
        {"LlamaForCausalLM", "MistralForCausalLM", "LlamaForCausalLM"},
        {"\"hidden_size\": 128", "\"hidden_size\": 130", "inconsistent"},
        {"\"hidden_size\": 128", "\"hidden_sizes\": 128", "hidden_size is missing"},
        {"\"num_key_value_heads\": 4", "\"num_key_value_heads\": 3", "inconsistent"},
        {"\"intermediate_size\": 384", "\"intermediate_size\": 385", "shape"},
        {"\"vocab_size\": 2048", "\"vocab_size\": \"2048\"", "vocab_size"},
        {"\"vocab_size\": 2048", "\"vocab_size\": 1024", "shape"},
        {"\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": -1", "rms_norm_eps"},
        {"\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\"}", "rope_scaling"},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "gelu"},
        {"{", "[", "config.json: ']' expected"},
        {"\"architectures\"", "\"architectures\" ]", "config.json"},
    };
    for (size_t i = 0; i < sizeof(cfg_cases) / sizeof(cfg_cases[0]); i++) {
        const char *at = strstr((const char *)cfg, cfg_cases[i].from);
        cr_assert_not_null(at, "\"%s\" not in config.json", cfg_cases[i].from);
        struct sl_str s;
        sl_str_init(&s);
        sl_str_append(&s, cfg, (size_t)(at - (const char *)cfg));
        sl_str_append(&s, cfg_cases[i].to, strlen(cfg_cases[i].to));
        sl_str_append(&s, at + strlen(cfg_cases[i].from), strlen(at + strlen(cfg_cases[i].from)));
        char *d = tmp_dir();
        put_text(d, "config.json", s.p);
        link_file(d, "model.safetensors", st);
        link_file(d, "tokenizer.json", tj);
        expect_reject_dir(d, cfg_cases[i].needle);
        rm_dir(d);
        sl_str_dispose(&s);
    }
    struct {
        const char *json, *needle;
    } tok_cases[] = {
        {"{", "bad JSON"},
        {"[]", "JSON object"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "not BPE"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]}}",
         "not in the vocab"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
         "ByteLevel"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "normalizer"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}", "bad id"},
    };
    for (size_t i = 0; i < sizeof(tok_cases) / sizeof(tok_cases[0]); i++) {
        char *d = tmp_dir();
        link_file(d, "config.json", cj);
        link_file(d, "model.safetensors", st);
        put_text(d, "tokenizer.json", tok_cases[i].json);
        expect_reject_dir(d, tok_cases[i].needle);
        rm_dir(d);
    }
    /* Each file missing in turn. */
    const char *files[3] = {cj, st, tj};
    const char *names[3] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (int miss = 0; miss < 3; miss++) {
        char *d = tmp_dir();
        for (int k = 0; k < 3; k++)
            if (k != miss)
                link_file(d, names[k], files[k]);
        expect_reject_dir(d, names[miss]);
        rm_dir(d);
    }
    free(cfg);
    free(src);
    free(st);
    free(tj);
    free(cj);
}

/* ---------------------------------------------------------------------------------------------
 * A synthetic folder with F16 and BF16 tensors
 */

#define XD 64
#define XH 96
#define XKV 32
#define XV 16

static const char *const x_tokenizer =
    "{\"version\": \"1.0\", \"added_tokens\": ["
    "{\"id\": 0, \"content\": \"<unk>\", \"special\": true, \"normalized\": false},"
    "{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
    "{\"id\": 2, \"content\": \"</s>\", \"special\": true, \"normalized\": false}],"
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["
    "{\"type\": \"Prepend\", \"prepend\": \"\u2581\"},"
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\u2581\"}]},"
    "\"pre_tokenizer\": null, \"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
    "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"}, \"content\": \" \"},"
    "{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
    "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true,"
    "\"byte_fallback\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2,"
    "\"\u2581\": 3, \"a\": 4, \"b\": 5, \"\u2581a\": 6, \"ab\": 7},"
    "\"merges\": [\"a b\", \"\u2581 a\"]}}";

static void x_tensor(struct sl_str *hdr, struct sl_str *body, const char *name, const char *dtype,
                     int rows, int cols, uint64_t *s)
{
    int esz = strcmp(dtype, "F32") == 0 ? 4 : 2;
    size_t n = (size_t)(rows ? rows : 1) * (size_t)cols;
    size_t at = body->len;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = ft_rand_half(s);
        if (esz == 4) {
            float f = ft_half(h);
            sl_str_append(body, &f, 4);
        } else {
            if (strcmp(dtype, "BF16") == 0) {
                float f = ft_half(h);
                uint32_t bits;
                memcpy(&bits, &f, 4);
                h = (uint16_t)(bits >> 16);
            }
            sl_str_append(body, &h, 2);
        }
    }
    if (rows)
        sl_str_appendf(hdr,
                       ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                       name, dtype, rows, cols, at, body->len);
    else
        sl_str_appendf(hdr, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                       name, dtype, cols, at, body->len);
}

/* Writes a 1-layer model; returns the safetensors image too (for offsets). */
static unsigned char *x_folder(const char *dir, size_t *len, size_t *body_at)
{
    struct sl_str hdr, body;
    sl_str_init(&hdr);
    sl_str_init(&body);
    const char *meta = "{\"__metadata__\":{\"format\":\"pt\"}";
    sl_str_append(&hdr, meta, strlen(meta));
    uint64_t s = 7;
    x_tensor(&hdr, &body, "model.embed_tokens.weight", "BF16", XV, XD, &s);
    x_tensor(&hdr, &body, "lm_head.weight", "F16", XV, XD, &s);
    x_tensor(&hdr, &body, "model.norm.weight", "F32", 0, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.input_layernorm.weight", "F16", 0, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.post_attention_layernorm.weight", "BF16", 0, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.self_attn.q_proj.weight", "F16", XD, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.self_attn.k_proj.weight", "BF16", XKV, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.self_attn.v_proj.weight", "F16", XKV, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.self_attn.o_proj.weight", "F32", XD, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.mlp.gate_proj.weight", "F16", XH, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.mlp.up_proj.weight", "BF16", XH, XD, &s);
    x_tensor(&hdr, &body, "model.layers.0.mlp.down_proj.weight", "F32", XD, XH, &s);
    sl_str_append(&hdr, "}", 1);
    while ((8 + hdr.len) % 8)
        sl_str_append(&hdr, " ", 1); /* keeps fp32 data 4-aligned, as writers do */
    *len = 8 + hdr.len + body.len;
    *body_at = 8 + hdr.len;
    unsigned char *img = malloc(*len);
    uint64_t hl = hdr.len;
    memcpy(img, &hl, 8);
    memcpy(img + 8, hdr.p, hdr.len);
    memcpy(img + 8 + hdr.len, body.p, body.len);
    put_file(dir, "model.safetensors", img, *len);
    put_text(dir, "config.json",
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
             "\"intermediate_size\": 96, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
             "\"num_key_value_heads\": 2, \"vocab_size\": 16, \"max_position_embeddings\": 64, "
             "\"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, \"bos_token_id\": 1, "
             "\"eos_token_id\": [2, 5], \"tie_word_embeddings\": false}");
    put_text(dir, "generation_config.json", "{\"eos_token_id\": 7}");
    put_text(dir, "tokenizer.json", x_tokenizer);
    sl_str_dispose(&hdr);
    sl_str_dispose(&body);
    return img;
}

Test(worker, hf_keeps_f16_bf16_and_permutes_qk_when_folder_is_synthetic)
{
    char *d = tmp_dir();
    size_t len, body_at;
    unsigned char *img = x_folder(d, &len, &body_at);
    struct sl_model *m = wt_load(d, NULL);
    const struct sl_model_config *c = sl_model_config(m);
    cr_assert_eq(c->dim, XD);
    cr_assert_eq(c->hidden_dim, XH);
    cr_assert_eq(c->n_layers, 1);
    cr_assert_eq(c->n_kv_heads, 2);
    cr_assert_eq(c->vocab_size, XV);
    cr_assert_eq(c->seq_len, 64);
    cr_assert_eq(c->rms_eps, 1e-5f);
    cr_assert_eq(c->rope_theta, 500000.0f);
    cr_assert(!c->shared_classifier);
    cr_assert_str_eq(sl_model_id(m), strrchr(d, '/') + 1);
    /* Stops: config's list plus generation_config's id. */
    cr_assert(sl_model_is_stop_token(m, 2) && sl_model_is_stop_token(m, 5));
    cr_assert(sl_model_is_stop_token(m, 7) && !sl_model_is_stop_token(m, 1));
    const struct sl_model_weights *w = &m->w;
    cr_assert_eq(w->token_embedding.type, SL_DTYPE_BF16);
    cr_assert_eq(w->wcls.type, SL_DTYPE_F16);
    cr_assert_neq(w->wcls.data, w->token_embedding.data);
    cr_assert(inside_map(m, w->token_embedding.data) && inside_map(m, w->wcls.data));
    const struct sl_layer_weights *L = &w->layers[0];
    cr_assert_eq(L->wq.type, SL_DTYPE_F16);
    cr_assert_eq(L->wk.type, SL_DTYPE_BF16);
    cr_assert_eq(L->wv.type, SL_DTYPE_F16);
    cr_assert_eq(L->wo.type, SL_DTYPE_F32);
    cr_assert_eq(L->w1.type, SL_DTYPE_F16);
    cr_assert_eq(L->w3.type, SL_DTYPE_BF16);
    cr_assert_eq(L->w2.type, SL_DTYPE_F32);
    cr_assert_eq(L->w2.rows, XD);
    cr_assert_eq(L->w2.cols, XH);
    cr_assert_eq(L->wk.rows, XKV);
    cr_assert(inside_map(m, L->wv.data) && inside_map(m, L->w3.data));
    /* q: 4 heads of 16 rows; row h*16 + 2i + p is the file's row h*16 + 8p + i. */
    const unsigned char *map = m->map;
    /* body: embed BF16, lm_head F16, norm F32 (4 B), ln1 F16, ln2 BF16, then q_proj. */
    size_t qoff = body_at + (size_t)XV * XD * 2 * 2 + (size_t)XD * 4 + (size_t)XD * 2 * 2;
    size_t koff = qoff + (size_t)XD * XD * 2;
    size_t rb = XD * 2;
    for (int h = 0; h < 4; h++)
        for (int i = 0; i < 8; i++)
            for (int p = 0; p < 2; p++)
                cr_assert_eq(memcmp((const unsigned char *)L->wq.data + rb * (h * 16 + 2 * i + p),
                                    map + qoff + rb * (h * 16 + 8 * p + i), rb),
                             0, "q row %d", h * 16 + 2 * i + p);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 8; i++)
            for (int p = 0; p < 2; p++)
                cr_assert_eq(memcmp((const unsigned char *)L->wk.data + rb * (h * 16 + 2 * i + p),
                                    map + koff + rb * (h * 16 + 8 * p + i), rb),
                             0, "k row %d", h * 16 + 2 * i + p);
    /* Norms: F32 used in place, F16 and BF16 converted exactly. */
    size_t noff = body_at + (size_t)XV * XD * 2 * 2;
    cr_assert_eq((const void *)w->rms_final, (const void *)(map + noff));
    for (int i = 0; i < XD; i++) {
        uint16_t h;
        memcpy(&h, map + noff + XD * 4 + 2 * i, 2);
        cr_assert_eq(L->rms_att[i], ft_half(h));
        memcpy(&h, map + noff + XD * 4 + XD * 2 + 2 * i, 2);
        uint32_t bits = (uint32_t)h << 16;
        float f;
        memcpy(&f, &bits, 4);
        cr_assert_eq(L->rms_ffn[i], f);
    }
    sl_model_free(m);
    free(img);
    rm_dir(d);
}

/* Loads the synthetic folder with the given tokenizer_config.json (NULL: none) and returns its
 * chat template (copied; NULL when none). */
static char *x_chat_template(const char *tokenizer_config)
{
    char *d = tmp_dir();
    size_t len, body_at;
    unsigned char *img = x_folder(d, &len, &body_at);
    if (tokenizer_config)
        put_text(d, "tokenizer_config.json", tokenizer_config);
    struct sl_model *m = wt_load(d, NULL);
    const char *t = sl_model_chat_template(m);
    char *copy = t ? strdup(t) : NULL;
    sl_model_free(m);
    free(img);
    rm_dir(d);
    return copy;
}

Test(worker, hf_reads_the_chat_template_when_tokenizer_config_has_one)
{
    cr_assert_null(x_chat_template(NULL), "no tokenizer_config.json, no template");
    cr_assert_null(x_chat_template("{\"bos_token\": \"<s>\"}"));
    cr_assert_null(x_chat_template("{\"chat_template\": null}"));
    char *t = x_chat_template("{\"model_max_length\": 1000000000000000019884624838656, "
                              "\"chat_template\": \"{{ bos_token }}<|user|>\\n\"}");
    cr_assert_not_null(t, "an integer too large for int64 elsewhere in the file is fine");
    cr_assert_str_eq(t, "{{ bos_token }}<|user|>\n");
    free(t);
    /* transformers' list form: the entry named "default". */
    t = x_chat_template("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, "
                        "{\"name\": \"default\", \"template\": \"D\"}]}");
    cr_assert_not_null(t);
    cr_assert_str_eq(t, "D");
    free(t);
    cr_assert_null(x_chat_template("{\"chat_template\": [{\"name\": \"rag\", \"template\": "
                                   "\"R\"}]}"));
}

Test(worker, hf_rejects_folder_when_tokenizer_config_is_malformed)
{
    static const struct {
        const char *json, *needle;
    } cases[] = {
        {"{\"chat_template\": ", "tokenizer_config.json: line 1"},
        {"[1]", "tokenizer_config.json: the top level is not a JSON object"},
        {"{\"chat_template\": 5}", "chat_template is neither a string nor a list"},
        {"{\"chat_template\": [\"x\"]}", "chat_template[0] is not a {name, template} object"},
        {"{\"chat_template\": [{\"name\": \"default\"}]}", "chat_template[0]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *d = tmp_dir();
        size_t len, body_at;
        unsigned char *img = x_folder(d, &len, &body_at);
        put_text(d, "tokenizer_config.json", cases[i].json);
        expect_reject_dir(d, cases[i].needle);
        free(img);
        rm_dir(d);
    }
}

Test(worker, hf_finds_added_tokens_as_special_when_asked_by_text)
{
    char *d = tmp_dir();
    size_t len, body_at;
    unsigned char *img = x_folder(d, &len, &body_at);
    struct sl_model *m = wt_load(d, NULL);
    const struct sl_tok *t = sl_model_tok(m);
    cr_assert_eq(sl_tok_special_id(t, "<s>", 3), 1);
    cr_assert_eq(sl_tok_special_id(t, "</s>", 4), 2);
    cr_assert_eq(sl_tok_special_id(t, "ab", 2), -1, "an ordinary piece is not special");
    cr_assert_eq(sl_tok_special_id(t, "</s", 3), -1);
    sl_model_free(m);
    free(img);
    rm_dir(d);
}

Test(worker, hf_has_no_chat_template_when_model_is_tinystories656k)
{
    WT_REQUIRE_MODELS(dir);
    char *hp = wt_path(dir, HF_DIR);
    struct sl_model *h = wt_load(hp, NULL);
    cr_assert_null(sl_model_chat_template(h), "a base model's tokenizer_config.json has none");
    cr_assert_eq(sl_tok_special_id(sl_model_tok(h), "<|end_story|>", 13), 2);
    sl_model_free(h);
    free(hp);
}
