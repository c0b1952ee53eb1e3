/* Hugging Face folders: config.json, model.safetensors, tokenizer.json.
 *
 * model.safetensors is mmap'd and weights point into it in their own type (F32, F16, BF16),
 * except q_proj/k_proj: HF stores their rows in the rotate-half RoPE layout, the CPU backend
 * rotates llama2.c's interleaved pairs, so those two are copied with their rows permuted (the
 * inverse of llama2.c export.py's permute). Norm weights that are not fp32 are converted.
 */
#include "worker_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_HEADER (100u << 20) /* the safetensors spec's bound on the JSON header */
#define MAX_JSON_FILE (64u << 20)

static int set_err(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int set_err(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * safetensors
 */

struct st_tensor {
    const char *name;
    enum sl_dtype type;
    bool usable; /* a dtype the kernels read (F32, F16, BF16) */
    const char *dtype;
    int64_t shape[8];
    int n_dims;
    const void *data;
};

struct st_file {
    const char *file;
    json_t *header;
    const json_t *meta; /* __metadata__ or NULL */
    const unsigned char *body;
    uint64_t body_len;
    char *err;
    size_t errlen;
};

/* Element size of a safetensors dtype, 0 when unknown. */
static int dtype_size(const char *d, enum sl_dtype *t, bool *usable)
{
    static const struct {
        const char *name;
        int size;
    } known[] = {{"F64", 8}, {"I64", 8}, {"U64", 8}, {"I32", 4},  {"U32", 4},     {"I16", 2},
                 {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E4M3", 1}};
    *usable = true;
    if (strcmp(d, "F32") == 0)
        return *t = SL_DTYPE_F32, 4;
    if (strcmp(d, "F16") == 0)
        return *t = SL_DTYPE_F16, 2;
    if (strcmp(d, "BF16") == 0)
        return *t = SL_DTYPE_BF16, 2;
    *usable = false;
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (strcmp(d, known[i].name) == 0)
            return known[i].size;
    return 0;
}

/* Validates one header entry; fills out. */
static bool st_entry(struct st_file *f, const char *name, const json_t *e, struct st_tensor *out)
{
    const char *d = json_string_value(json_object_get(e, "dtype"));
    const json_t *shape = json_object_get(e, "shape");
    const json_t *offs = json_object_get(e, "data_offsets");
    if (!json_is_object(e) || !d || !json_is_array(shape) || !json_is_array(offs) ||
        json_array_size(offs) != 2) {
        set_err(f->err, f->errlen, 0, "%s: tensor %.80s: entry needs dtype, shape, data_offsets",
                f->file, name);
        return false;
    }
    memset(out, 0, sizeof(*out));
    out->name = name;
    out->dtype = d;
    int size = dtype_size(d, &out->type, &out->usable);
    if (size == 0) {
        set_err(f->err, f->errlen, 0, "%s: tensor %.80s has unknown dtype \"%.16s\"", f->file, name,
                d);
        return false;
    }
    if (json_array_size(shape) > 8) {
        set_err(f->err, f->errlen, 0, "%s: tensor %.80s has %zu dimensions", f->file, name,
                json_array_size(shape));
        return false;
    }
    uint64_t elems = 1;
    for (size_t i = 0; i < json_array_size(shape); i++) {
        const json_t *x = json_array_get(shape, i);
        json_int_t v = json_integer_value(x);
        if (!json_is_integer(x) || v < 0 || v > INT32_MAX ||
            (v > 0 && elems > (UINT64_C(1) << 60) / (uint64_t)v)) {
            set_err(f->err, f->errlen, 0, "%s: tensor %.80s has a bad dimension", f->file, name);
            return false;
        }
        elems *= (uint64_t)v;
        out->shape[i] = v;
    }
    out->n_dims = (int)json_array_size(shape);
    const json_t *b = json_array_get(offs, 0), *en = json_array_get(offs, 1);
    json_int_t bv = json_integer_value(b), ev = json_integer_value(en);
    if (!json_is_integer(b) || !json_is_integer(en) || bv < 0 || ev < bv ||
        (uint64_t)ev > f->body_len) {
        set_err(f->err, f->errlen, 0,
                "%s: tensor %.80s: data_offsets [%lld, %lld] are outside the %llu data bytes",
                f->file, name, (long long)bv, (long long)ev, (unsigned long long)f->body_len);
        return false;
    }
    if ((uint64_t)(ev - bv) != elems * (uint64_t)size) {
        set_err(f->err, f->errlen, 0, "%s: tensor %.80s: %lld data bytes for %llu elements of %s",
                f->file, name, (long long)(ev - bv), (unsigned long long)elems, d);
        return false;
    }
    out->data = f->body + bv;
    return true;
}

/* The tensor `name`, following a __metadata__ alias ("model.embed_tokens.weight":
 * "lm_head.weight" when tied weights were saved once). Returns false without a message when
 * absent, false with one when malformed. */
static bool st_find(struct st_file *f, const char *name, struct st_tensor *out, bool *bad)
{
    const json_t *e = json_object_get(f->header, name);
    *bad = false;
    if (!e && f->meta) {
        const char *alias = json_string_value(json_object_get(f->meta, name));
        if (alias && strcmp(alias, "__metadata__") != 0)
            e = json_object_get(f->header, alias);
    }
    if (!e)
        return false;
    if (!st_entry(f, name, e, out)) {
        *bad = true;
        return false;
    }
    return true;
}

/* A required tensor of shape (rows, cols) (rows 0: a vector of cols). */
static bool st_want(struct st_file *f, const char *name, int rows, int cols, struct st_tensor *out)
{
    bool bad;
    if (!st_find(f, name, out, &bad)) {
        if (!bad)
            set_err(f->err, f->errlen, 0, "%s: tensor %s is missing", f->file, name);
        return false;
    }
    bool ok = rows ? out->n_dims == 2 && out->shape[0] == rows && out->shape[1] == cols
                   : out->n_dims == 1 && out->shape[0] == cols;
    if (!ok) {
        set_err(f->err, f->errlen, 0,
                "%s: tensor %s has shape [%lld, %lld] (%d dims), the config says [%d, %d]", f->file,
                name, (long long)out->shape[0], (long long)(out->n_dims > 1 ? out->shape[1] : 0),
                out->n_dims, rows ? rows : cols, rows ? cols : 0);
        return false;
    }
    if (!out->usable) {
        set_err(f->err, f->errlen, 0, "%s: tensor %s has dtype %s; sluice reads F32, F16, BF16",
                f->file, name, out->dtype);
        return false;
    }
    return true;
}

static bool st_mat(struct st_file *f, struct sl_model *m, const char *name, int rows, int cols,
                   struct sl_mat *out)
{
    struct st_tensor t;
    if (!st_want(f, name, rows, cols, &t))
        return false;
    *out = sl_model_mat_place(m, t.type, t.data, rows, cols);
    return true;
}

/* q_proj/k_proj (n_heads * head_size, cols) into llama2.c's interleaved RoPE layout: within a
 * head, HF keeps the first halves of all pairs, then the second halves; llama2.c keeps each pair
 * together. Row h*hs + 2i + p of the result is HF row h*hs + p*hs/2 + i. */
static bool st_rope_mat(struct st_file *f, struct sl_model *m, const char *name, int n_heads,
                        int hs, int cols, struct sl_mat *out)
{
    struct st_tensor t;
    if (!st_want(f, name, n_heads * hs, cols, &t))
        return false;
    size_t rb = sl_dtype_row_bytes(t.type, cols);
    unsigned char *dst = sl_model_own(m, sl_xmalloc(rb * (size_t)n_heads * (size_t)hs));
    const unsigned char *src = t.data;
    for (int h = 0; h < n_heads; h++)
        for (int i = 0; i < hs / 2; i++)
            for (int p = 0; p < 2; p++)
                memcpy(dst + rb * (size_t)(h * hs + 2 * i + p),
                       src + rb * (size_t)(h * hs + p * hs / 2 + i), rb);
    *out = (struct sl_mat){t.type, dst, n_heads * hs, cols};
    return true;
}

static bool st_norm(struct st_file *f, struct sl_model *m, const char *name, int dim,
                    const float **out)
{
    struct st_tensor t;
    if (!st_want(f, name, 0, dim, &t))
        return false;
    *out = sl_model_norm_f32(m, t.type, t.data, dim);
    return true;
}

static bool st_weights(struct st_file *f, struct sl_model *m)
{
    const struct sl_model_config *c = &m->cfg;
    int dim = c->dim, hid = c->hidden_dim, hs = dim / c->n_heads, kv = hs * c->n_kv_heads;
    struct sl_model_weights *w = &m->w;
    struct st_tensor t;
    bool bad;
    /* Tied weights may be stored under either name; an alias in __metadata__ or the tie flag
     * says the other one is the same matrix. */
    bool have_embed = st_find(f, "model.embed_tokens.weight", &t, &bad);
    if (bad)
        return false;
    bool have_head = st_find(f, "lm_head.weight", &t, &bad);
    if (bad)
        return false;
    const char *embed = have_embed ? "model.embed_tokens.weight" : "lm_head.weight";
    const char *head = have_head ? "lm_head.weight" : "model.embed_tokens.weight";
    if (!have_embed && !have_head)
        return set_err(f->err, f->errlen, 0,
                       "%s: neither model.embed_tokens.weight nor lm_head.weight is stored",
                       f->file),
               false;
    if ((!have_embed || !have_head) && !c->shared_classifier)
        return set_err(f->err, f->errlen, 0, "%s: %s is missing and tie_word_embeddings is false",
                       f->file, have_embed ? "lm_head.weight" : "model.embed_tokens.weight"),
               false;
    if (!st_mat(f, m, embed, c->vocab_size, dim, &w->token_embedding) ||
        !st_mat(f, m, head, c->vocab_size, dim, &w->wcls) ||
        !st_norm(f, m, "model.norm.weight", dim, &w->rms_final))
        return false;
    w->layers = sl_model_own(m, sl_xcalloc((size_t)c->n_layers, sizeof(*w->layers)));
    for (int l = 0; l < c->n_layers; l++) {
        struct sl_layer_weights *L = &w->layers[l];
        char n[9][80];
        static const char *const parts[9] = {
            "input_layernorm",  "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
            "self_attn.v_proj", "self_attn.o_proj",         "mlp.gate_proj",    "mlp.down_proj",
            "mlp.up_proj"};
        for (int i = 0; i < 9; i++)
            snprintf(n[i], sizeof(n[i]), "model.layers.%d.%s.weight", l, parts[i]);
        if (!st_norm(f, m, n[0], dim, &L->rms_att) || !st_norm(f, m, n[1], dim, &L->rms_ffn) ||
            !st_rope_mat(f, m, n[2], c->n_heads, hs, dim, &L->wq) ||
            !st_rope_mat(f, m, n[3], c->n_kv_heads, hs, dim, &L->wk) ||
            !st_mat(f, m, n[4], kv, dim, &L->wv) || !st_mat(f, m, n[5], dim, dim, &L->wo) ||
            !st_mat(f, m, n[6], hid, dim, &L->w1) || !st_mat(f, m, n[7], dim, hid, &L->w2) ||
            !st_mat(f, m, n[8], hid, dim, &L->w3))
            return false;
    }
    return true;
}

int sl_model_safetensors_parse(struct sl_model *m, const void *data, size_t len, const char *name,
                               char *err, size_t errlen)
{
    const unsigned char *p = data;
    if (len < 8)
        return set_err(err, errlen, SL_EFORMAT,
                       "%s: truncated: %zu bytes, shorter than the 8-byte header length", name,
                       len);
    uint64_t hlen;
    memcpy(&hlen, p, 8);
    if (hlen < 2 || hlen > MAX_HEADER || hlen > len - 8)
        return set_err(err, errlen, SL_EFORMAT,
                       "%s: header length %llu does not fit the %zu-byte file", name,
                       (unsigned long long)hlen, len);
    json_error_t je;
    json_t *h = json_loadb((const char *)p + 8, (size_t)hlen, 0, &je);
    if (!h || !json_is_object(h)) {
        int rc = set_err(err, errlen, SL_EFORMAT, "%s: bad JSON header: %s", name,
                         h ? "not an object" : je.text);
        json_decref(h);
        return rc;
    }
    struct st_file f = {.file = name,
                        .header = h,
                        .meta = json_object_get(h, "__metadata__"),
                        .body = p + 8 + hlen,
                        .body_len = len - 8 - hlen,
                        .err = err,
                        .errlen = errlen};
    if (f.meta && !json_is_object(f.meta)) {
        json_decref(h);
        return set_err(err, errlen, SL_EFORMAT, "%s: __metadata__ is not an object", name);
    }
    /* Every entry is validated, not only the ones used: a corrupt file is rejected whole. */
    const char *key;
    json_t *e;
    json_object_foreach(h, key, e)
    {
        struct st_tensor t;
        if (strcmp(key, "__metadata__") != 0 && !st_entry(&f, key, e, &t)) {
            json_decref(h);
            return SL_EFORMAT;
        }
    }
    bool ok = st_weights(&f, m);
    json_decref(h);
    return ok ? SL_OK : SL_EFORMAT;
}

/* ---------------------------------------------------------------------------------------------
 * config.json, generation_config.json, tokenizer.json
 */

static char *join(const char *dir, const char *file)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = sl_xmalloc(n);
    snprintf(p, n, "%s/%s", dir, file);
    return p;
}

/* An integer config field in [lo, hi]; def < lo means required. */
static bool cfg_int(const json_t *cfg, const char *key, long long lo, long long hi, long long def,
                    int *out, const char *path, char *err, size_t errlen)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        if (def < lo) {
            set_err(err, errlen, 0, "%s: %s is missing", path, key);
            return false;
        }
        *out = (int)def;
        return true;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        set_err(err, errlen, 0, "%s: %s must be an integer in [%lld, %lld]", path, key, lo, hi);
        return false;
    }
    *out = (int)json_integer_value(v);
    return true;
}

static bool cfg_real(const json_t *cfg, const char *key, double lo, double hi, double def,
                     float *out, const char *path, char *err, size_t errlen)
{
    const json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) {
        *out = (float)def;
        return true;
    }
    if (!json_is_number(v) || !(json_number_value(v) > lo && json_number_value(v) < hi)) {
        set_err(err, errlen, 0, "%s: %s must be a number in (%g, %g)", path, key, lo, hi);
        return false;
    }
    *out = (float)json_number_value(v);
    return true;
}

/* Adds eos_token_id (an int or a list of ints) to the stop tokens. */
static void add_stops(struct sl_model *m, const json_t *v)
{
    const json_t *one = v;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        if (json_is_array(v))
            one = json_array_get(v, i);
        if (!json_is_integer(one))
            continue;
        json_int_t id = json_integer_value(one);
        if (id < 0 || id >= m->cfg.vocab_size || sl_model_is_stop_token(m, (int32_t)id) ||
            m->n_stop_tokens == SL_MODEL_MAX_STOP)
            continue;
        m->stop_tokens[m->n_stop_tokens++] = (int32_t)id;
    }
}

static int load_config(struct sl_model *m, const char *path, int *bos, char *err, size_t errlen)
{
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg) {
        bool missing = access(path, F_OK) != 0;
        return set_err(err, errlen, missing ? SL_ENOENT : SL_EFORMAT, "%s: %s", path,
                       missing ? "cannot open" : je.text);
    }
    int rc = SL_EFORMAT;
    struct sl_model_config *c = &m->cfg;
    const json_t *arch = json_object_get(cfg, "architectures");
    bool llama = false;
    for (size_t i = 0; i < json_array_size(arch); i++) {
        const char *a = json_string_value(json_array_get(arch, i));
        llama = llama || (a && strcmp(a, "LlamaForCausalLM") == 0);
    }
    if (!json_is_object(cfg) || !llama) {
        set_err(err, errlen, 0, "%s: architectures does not list LlamaForCausalLM", path);
        goto out;
    }
    const json_t *scaling = json_object_get(cfg, "rope_scaling");
    const char *act = json_string_value(json_object_get(cfg, "hidden_act"));
    if (scaling && !json_is_null(scaling)) {
        set_err(err, errlen, 0, "%s: rope_scaling is not supported", path);
        goto out;
    }
    if (act && strcmp(act, "silu") != 0) {
        set_err(err, errlen, 0, "%s: hidden_act %s is not silu", path, act);
        goto out;
    }
    if (json_is_true(json_object_get(cfg, "attention_bias")) ||
        json_is_true(json_object_get(cfg, "mlp_bias"))) {
        set_err(err, errlen, 0, "%s: biases are not supported", path);
        goto out;
    }
    if (!cfg_int(cfg, "hidden_size", 1, 65536, -1, &c->dim, path, err, errlen) ||
        !cfg_int(cfg, "intermediate_size", 1, 1 << 20, -1, &c->hidden_dim, path, err, errlen) ||
        !cfg_int(cfg, "num_hidden_layers", 1, 1024, -1, &c->n_layers, path, err, errlen) ||
        !cfg_int(cfg, "num_attention_heads", 1, 65536, -1, &c->n_heads, path, err, errlen) ||
        !cfg_int(cfg, "num_key_value_heads", 1, 65536, c->n_heads, &c->n_kv_heads, path, err,
                 errlen) ||
        !cfg_int(cfg, "vocab_size", 1, 1 << 24, -1, &c->vocab_size, path, err, errlen) ||
        !cfg_int(cfg, "max_position_embeddings", 1, 1 << 20, -1, &c->seq_len, path, err, errlen) ||
        !cfg_int(cfg, "bos_token_id", 0, c->vocab_size - 1, 1, bos, path, err, errlen) ||
        !cfg_real(cfg, "rms_norm_eps", 0.0, 1.0, 1e-6, &c->rms_eps, path, err, errlen) ||
        !cfg_real(cfg, "rope_theta", 1.0, 1e12, 10000.0, &c->rope_theta, path, err, errlen))
        goto out;
    c->shared_classifier = json_is_true(json_object_get(cfg, "tie_word_embeddings"));
    if (sl_model_body_floats(c) == 0) {
        set_err(err, errlen, 0,
                "%s: inconsistent config: hidden %d intermediate %d layers %d heads %d kv_heads "
                "%d vocab %d positions %d",
                path, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                c->seq_len);
        goto out;
    }
    const json_t *hd = json_object_get(cfg, "head_dim");
    if (json_is_integer(hd) && json_integer_value(hd) != c->dim / c->n_heads) {
        set_err(err, errlen, 0, "%s: head_dim %lld is not hidden_size / num_attention_heads", path,
                (long long)json_integer_value(hd));
        goto out;
    }
    add_stops(m, json_object_get(cfg, "eos_token_id"));
    rc = SL_OK;
out:
    json_decref(cfg);
    return rc;
}

/* tokenizer_config.json, when the folder has one: its chat_template, either a string or a list
 * of {"name", "template"} (transformers then uses the one named "default"). Nothing else of it
 * is read. A file that is there but malformed is an error rather than a silent loss of the
 * template. */
static int load_tokenizer_config(struct sl_model *m, const char *path, char *err, size_t errlen)
{
    if (access(path, F_OK) != 0)
        return SL_OK;
    char *text = NULL;
    size_t len = 0;
    int rc = sl_model_read_file(path, MAX_JSON_FILE, &text, &len, err, errlen);
    if (rc != SL_OK)
        return rc;
    json_error_t je;
    /* INT_AS_REAL: transformers writes model_max_length as 1e30 spelled as an integer, which
     * would overflow jansson's integers. */
    json_t *root = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je);
    free(text);
    if (!root)
        return set_err(err, errlen, SL_EFORMAT, "%s: line %d, column %d: %s", path, je.line,
                       je.column, je.text);
    rc = SL_EFORMAT;
    const json_t *t = json_object_get(root, "chat_template");
    if (!json_is_object(root)) {
        set_err(err, errlen, 0, "%s: the top level is not a JSON object", path);
        goto out;
    }
    if (json_is_array(t)) {
        size_t i;
        const json_t *e, *found = NULL;
        json_array_foreach(t, i, e)
        {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (!name || !json_is_string(json_object_get(e, "template"))) {
                set_err(err, errlen, 0, "%s: chat_template[%zu] is not a {name, template} object",
                        path, i);
                goto out;
            }
            if (strcmp(name, "default") == 0)
                found = json_object_get(e, "template");
        }
        t = found; /* a list without "default" gives no template */
    } else if (t && !json_is_null(t) && !json_is_string(t)) {
        set_err(err, errlen, 0, "%s: chat_template is neither a string nor a list", path);
        goto out;
    }
    if (json_is_string(t) && json_string_length(t) > 0)
        m->chat_template = sl_xstrndup(json_string_value(t), json_string_length(t));
    rc = SL_OK;
out:
    json_decref(root);
    return rc;
}

static int load_safetensors(struct sl_model *m, const char *path, char *err, size_t errlen)
{
    int rc = sl_model_map_file(m, path, 8, err, errlen); /* 8: the header length */
    if (rc != SL_OK)
        return rc;
    return sl_model_safetensors_parse(m, m->map, m->map_len, path, err, errlen);
}

int sl_model_load_hf(struct sl_model *m, const char *dir, char *err, size_t errlen)
{
    char *cfg = join(dir, "config.json"), *st = join(dir, "model.safetensors");
    char *tj = join(dir, "tokenizer.json"), *gen = join(dir, "generation_config.json");
    char *tc = join(dir, "tokenizer_config.json");
    char *text = NULL;
    size_t tlen = 0;
    int bos = 1;
    int rc = load_config(m, cfg, &bos, err, errlen);
    if (rc == SL_OK)
        rc = load_safetensors(m, st, err, errlen);
    if (rc == SL_OK)
        rc = sl_model_read_file(tj, MAX_JSON_FILE, &text, &tlen, err, errlen);
    if (rc == SL_OK) {
        char why[256];
        m->tok = sl_tok_hf_parse(text, tlen, bos, why, sizeof(why));
        if (!m->tok)
            rc = set_err(err, errlen, SL_EFORMAT, "%s: %s", tj, why);
        else if (sl_tok_vocab_size(m->tok) > m->cfg.vocab_size)
            rc = set_err(err, errlen, SL_EFORMAT,
                         "%s: %d token ids, more than the model's vocab_size %d", tj,
                         sl_tok_vocab_size(m->tok), m->cfg.vocab_size);
    }
    if (rc == SL_OK)
        rc = load_tokenizer_config(m, tc, err, errlen);
    if (rc == SL_OK) {
        /* generation_config.json is optional; its eos_token_id adds to config.json's. */
        json_t *g = json_load_file(gen, 0, NULL);
        if (g)
            add_stops(m, json_object_get(g, "eos_token_id"));
        json_decref(g);
        /* "models/TinyStories-656K/" is served as "TinyStories-656K". */
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/')
            n--;
        size_t b = n;
        while (b > 0 && dir[b - 1] != '/')
            b--;
        m->id = sl_xstrndup(dir + b, n - b);
    }
    free(text);
    free(cfg);
    free(st);
    free(tj);
    free(gen);
    free(tc);
    return rc;
}
