/* GGUF loader: the real stories260K.gguf, synthetic files with F16/BF16/Q8_0 tensors written
 * here, and truncated or corrupted copies of both (every one rejected with a message, none read
 * past its end). */
#include "fmt_test.h"

enum {
    GT_F32 = 0,
    GT_F16 = 1,
    GT_Q4_0 = 2,
    GT_Q8_0 = 8,
    GT_Q3_K = 11,
    GT_Q4_K = 12,
    GT_Q5_K = 13,
    GT_Q6_K = 14,
    GT_BF16 = 30
};

/* ---------------------------------------------------------------------------------------------
 * A small GGUF writer
 */

#define GW_MAX_T 64

struct gw {
    struct sl_str kv, ti, data;
    uint64_t n_kv, n_t;
    uint32_t align;
    char names[GW_MAX_T][64];
    size_t off_field[GW_MAX_T]; /* where each tensor's offset field is in ti */
    size_t data_off[GW_MAX_T];  /* each tensor's offset in the data section */
};

static void put(struct sl_str *s, const void *p, size_t n)
{
    sl_str_append(s, p, n);
}

static void put_u32(struct sl_str *s, uint32_t v)
{
    put(s, &v, 4);
}

static void put_u64(struct sl_str *s, uint64_t v)
{
    put(s, &v, 8);
}

static void put_str(struct sl_str *s, const char *str)
{
    put_u64(s, strlen(str));
    put(s, str, strlen(str));
}

static void gw_init(struct gw *g, uint32_t align)
{
    memset(g, 0, sizeof(*g));
    sl_str_init(&g->kv);
    sl_str_init(&g->ti);
    sl_str_init(&g->data);
    g->align = align;
}

static void gw_dispose(struct gw *g)
{
    sl_str_dispose(&g->kv);
    sl_str_dispose(&g->ti);
    sl_str_dispose(&g->data);
}

static void kv_key(struct gw *g, const char *k, uint32_t type)
{
    put_str(&g->kv, k);
    put_u32(&g->kv, type);
    g->n_kv++;
}

static void kv_u32(struct gw *g, const char *k, uint32_t v)
{
    kv_key(g, k, 4);
    put_u32(&g->kv, v);
}

static void kv_f32(struct gw *g, const char *k, float v)
{
    kv_key(g, k, 6);
    put(&g->kv, &v, 4);
}

static void kv_str(struct gw *g, const char *k, const char *v)
{
    kv_key(g, k, 8);
    put_str(&g->kv, v);
}

static void gw_tensor(struct gw *g, const char *name, uint32_t type, uint64_t ne0, uint64_t ne1,
                      const void *bytes, size_t n)
{
    cr_assert_lt(g->n_t, GW_MAX_T);
    while (g->data.len % g->align)
        put(&g->data, "", 1);
    size_t i = (size_t)g->n_t++;
    snprintf(g->names[i], sizeof(g->names[i]), "%s", name);
    g->data_off[i] = g->data.len;
    put(&g->data, bytes, n);
    put_str(&g->ti, name);
    put_u32(&g->ti, ne1 ? 2 : 1);
    put_u64(&g->ti, ne0);
    if (ne1)
        put_u64(&g->ti, ne1);
    put_u32(&g->ti, type);
    g->off_field[i] = g->ti.len;
    put_u64(&g->ti, g->data_off[i]);
}

/* The whole file; *ti_at is where the tensor infos start, *data_at the data section. */
static unsigned char *gw_finish(struct gw *g, uint32_t version, size_t *len, size_t *ti_at,
                                size_t *data_at)
{
    struct sl_str f;
    sl_str_init(&f);
    put(&f, "GGUF", 4);
    put_u32(&f, version);
    put_u64(&f, g->n_t);
    put_u64(&f, g->n_kv);
    put(&f, g->kv.p, g->kv.len);
    *ti_at = f.len;
    put(&f, g->ti.p, g->ti.len);
    while (f.len % g->align)
        put(&f, "", 1);
    *data_at = f.len;
    put(&f, g->data.p, g->data.len);
    *len = f.len;
    return (unsigned char *)f.p;
}

/* ---------------------------------------------------------------------------------------------
 * A synthetic llama: dim 64, hidden 96, 2 layers, 4 heads, 2 kv heads, vocab 264, context 128,
 * with every tensor type sluice reads.
 */

#define SD 64
#define SH 96
#define SL 2
#define SKV 32
#define SV 264

struct spec {
    uint32_t version;
    uint32_t align; /* 0: default 32, not written */
    const char *arch;
    const char *drop;     /* tensor left out */
    const char *q4k;      /* tensor stored as Q4_K */
    const char *q3k;      /* tensor stored as Q3_K (not read by sluice) */
    bool kquants;         /* widths of whole super-blocks (256, 512, 128) and the K-quant types */
    const char *wide;     /* tensor stored with ne0 doubled */
    bool dup;             /* token_embd twice */
    bool output;          /* explicit F32 output.weight */
    bool extra_keys;      /* unknown keys of every value type */
    int embedding_length; /* 0: SD */
    uint32_t eps_type;    /* 0: F32 */

    const char *chat_template;     /* tokenizer.chat_template, or NULL: not written */
    bool chat_template_not_string; /* tokenizer.chat_template written as a u32 */
};

struct built {
    unsigned char *p;
    size_t len, ti_at, data_at;
    struct gw g;
};

static void fill_bytes(unsigned char *p, size_t n, uint32_t type, uint64_t *s)
{
    if (type == GT_F32) {
        for (size_t i = 0; i + 4 <= n; i += 4) {
            float f = (float)((int)(ft_rand(s) % 2001) - 1000) / 1000.0f;
            memcpy(p + i, &f, 4);
        }
    } else if (type == GT_F16 || type == GT_BF16) {
        for (size_t i = 0; i + 2 <= n; i += 2) {
            uint16_t h = ft_rand_half(s);
            if (type == GT_BF16) {
                float f = ft_half(h);
                uint32_t bits;
                memcpy(&bits, &f, 4);
                h = (uint16_t)(bits >> 16); /* exact: a half's value fits in bf16's range */
            }
            memcpy(p + i, &h, 2);
        }
    } else if (type == GT_Q8_0) {
        for (size_t b = 0; b + 34 <= n; b += 34) {
            uint16_t d = ft_rand_half(s);
            memcpy(p + b, &d, 2);
            for (int i = 0; i < 32; i++)
                p[b + 2 + i] = (unsigned char)ft_rand(s);
        }
    } else if (type == GT_Q4_0 || type == GT_Q4_K || type == GT_Q5_K || type == GT_Q6_K) {
        /* Random bytes with finite fp16 scales where each block keeps them. */
        size_t bb = type == GT_Q4_0 ? 18 : type == GT_Q4_K ? 144 : type == GT_Q5_K ? 176 : 210;
        for (size_t i = 0; i < n; i++)
            p[i] = (unsigned char)ft_rand(s);
        for (size_t b = 0; b + bb <= n; b += bb) {
            uint16_t d[2] = {(uint16_t)(ft_rand_half(s) & 0x3bff), /* below 1: sane logits */
                             (uint16_t)(ft_rand_half(s) & 0x3bff)};
            memcpy(p + b + (type == GT_Q6_K ? 208 : 0), d,
                   type == GT_Q4_K || type == GT_Q5_K ? 4 : 2);
        }
    } else {
        for (size_t i = 0; i < n; i++)
            p[i] = (unsigned char)ft_rand(s);
    }
}

static size_t tbytes(uint32_t type, uint64_t ne0, uint64_t ne1)
{
    uint64_t e = ne0 * (ne1 ? ne1 : 1);
    switch (type) {
    case GT_F32: return (size_t)e * 4;
    case GT_F16:
    case GT_BF16: return (size_t)e * 2;
    case GT_Q8_0: return (size_t)e / 32 * 34;
    case GT_Q4_0: return (size_t)e / 32 * 18;
    case GT_Q3_K: return (size_t)e / 256 * 110;
    case GT_Q5_K: return (size_t)e / 256 * 176;
    case GT_Q6_K: return (size_t)e / 256 * 210;
    default: return (size_t)e / 256 * 144; /* Q4_K */
    }
}

static void add_t(struct built *b, const struct spec *sp, const char *name, uint32_t type,
                  uint64_t ne0, uint64_t ne1, uint64_t *s)
{
    if (sp->drop && strcmp(sp->drop, name) == 0)
        return;
    if (sp->q4k && strcmp(sp->q4k, name) == 0)
        type = GT_Q4_K;
    if (sp->q3k && strcmp(sp->q3k, name) == 0)
        type = GT_Q3_K;
    if (sp->wide && strcmp(sp->wide, name) == 0)
        ne0 *= 2;
    size_t n = tbytes(type, ne0, ne1);
    unsigned char *p = malloc(n ? n : 1);
    fill_bytes(p, n, type, s);
    gw_tensor(&b->g, name, type, ne0, ne1, p, n);
    free(p);
}

static const char *const vocab_extra[] = {"\xe2\x96\x81", "a",
                                          "\xe2\x96\x81"
                                          "a",
                                          "b", "ab"};

static void build(struct built *b, const struct spec *sp)
{
    struct gw *g = &b->g;
    gw_init(g, sp->align ? sp->align : 32);
    uint64_t s = 42;
    /* Widths, and for kquants a Q4_K_M-like mix of every type. */
    uint64_t D = sp->kquants ? 256 : SD, H = sp->kquants ? 512 : SH, KV = sp->kquants ? 128 : SKV;
    uint32_t t_emb = sp->kquants ? GT_Q4_K : GT_Q8_0, t_q = sp->kquants ? GT_Q4_K : GT_F16;
    uint32_t t_k = sp->kquants ? GT_Q4_0 : GT_Q8_0, t_v = sp->kquants ? GT_Q6_K : GT_F32;
    uint32_t t_o = sp->kquants ? GT_Q5_K : GT_F16, t_gate = sp->kquants ? GT_Q4_K : GT_Q8_0;
    uint32_t t_down = sp->kquants ? GT_Q6_K : GT_Q8_0, t_up = sp->kquants ? GT_Q8_0 : GT_BF16;
    kv_str(g, "general.architecture", sp->arch ? sp->arch : "llama");
    if (sp->align)
        kv_u32(g, "general.alignment", sp->align);
    if (sp->extra_keys) {
        /* One unknown key of every value type, arrays nested two deep. */
        static const uint8_t sizes[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
        for (uint32_t t = 0; t < 13; t++) {
            if (t == 8 || t == 9)
                continue;
            char k[32];
            snprintf(k, sizeof(k), "x.unknown.%u", t);
            kv_key(g, k, t);
            put(&g->kv, "\1\0\0\0\0\0\0\0", sizes[t]);
        }
        kv_str(g, "x.unknown.string", "hello");
        kv_key(g, "x.unknown.array", 9);
        put_u32(&g->kv, 9); /* array of arrays */
        put_u64(&g->kv, 2);
        put_u32(&g->kv, 8); /* of strings */
        put_u64(&g->kv, 2);
        put_str(&g->kv, "x");
        put_str(&g->kv, "yz");
        put_u32(&g->kv, 12); /* of f64 */
        put_u64(&g->kv, 3);
        put(&g->kv, "\0\0\0\0\0\0\xf0?\0\0\0\0\0\0\0@\0\0\0\0\0\0\x08@", 24);
    }
    kv_u32(g, "llama.context_length", 128);
    kv_u32(g, "llama.embedding_length",
           sp->embedding_length ? (uint32_t)sp->embedding_length : (uint32_t)D);
    kv_u32(g, "llama.feed_forward_length", (uint32_t)H);
    kv_u32(g, "llama.block_count", SL);
    kv_u32(g, "llama.attention.head_count", 4);
    kv_u32(g, "llama.attention.head_count_kv", 2);
    kv_u32(g, "llama.rope.dimension_count",
           (sp->embedding_length ? (uint32_t)sp->embedding_length : (uint32_t)D) / 4);
    if (sp->eps_type == 8)
        kv_str(g, "llama.attention.layer_norm_rms_epsilon", "1e-5");
    else
        kv_f32(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_f32(g, "llama.rope.freq_base", 500000.0f);
    kv_str(g, "tokenizer.ggml.model", "llama");
    kv_key(g, "tokenizer.ggml.tokens", 9);
    put_u32(&g->kv, 8);
    put_u64(&g->kv, SV);
    for (int i = 0; i < SV; i++) {
        char p[16];
        if (i < 3)
            put_str(&g->kv, i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(p, sizeof(p), "<0x%02X>", i - 3), put_str(&g->kv, p);
        else
            put_str(&g->kv, vocab_extra[i - 259]);
    }
    kv_key(g, "tokenizer.ggml.scores", 9);
    put_u32(&g->kv, 6);
    put_u64(&g->kv, SV);
    for (int i = 0; i < SV; i++) {
        float sc = i < 259 ? 0.0f : -(float)(i - 258);
        put(&g->kv, &sc, 4);
    }
    kv_key(g, "tokenizer.ggml.token_type", 9);
    put_u32(&g->kv, 5);
    put_u64(&g->kv, SV);
    for (int i = 0; i < SV; i++)
        put_u32(&g->kv, i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
    kv_u32(g, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(g, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(g, "tokenizer.ggml.unknown_token_id", 0);
    if (sp->chat_template)
        kv_str(g, "tokenizer.chat_template", sp->chat_template);
    if (sp->chat_template_not_string)
        kv_u32(g, "tokenizer.chat_template", 7);

    add_t(b, sp, "token_embd.weight", t_emb, D, SV, &s);
    if (sp->dup)
        add_t(b, sp, "token_embd.weight", t_emb, D, SV, &s);
    add_t(b, sp, "output_norm.weight", GT_F16, D, 0, &s);
    if (sp->output)
        add_t(b, sp, "output.weight", sp->kquants ? GT_Q6_K : GT_F32, D, SV, &s);
    for (int l = 0; l < SL; l++) {
        char n[64];
#define T(part, type, ne0, ne1)                                                                    \
    snprintf(n, sizeof(n), "blk.%d." part ".weight", l);                                           \
    add_t(b, sp, n, type, ne0, ne1, &s)
        T("attn_norm", GT_F32, D, 0);
        T("ffn_norm", GT_BF16, D, 0);
        T("attn_q", t_q, D, D);
        T("attn_k", t_k, D, KV);
        T("attn_v", t_v, D, KV);
        T("attn_output", t_o, D, D);
        T("ffn_gate", t_gate, D, H);
        T("ffn_down", t_down, H, D);
        T("ffn_up", t_up, D, H);
#undef T
    }
    b->p = gw_finish(g, sp->version ? sp->version : 3, &b->len, &b->ti_at, &b->data_at);
}

static void built_dispose(struct built *b)
{
    free(b->p);
    gw_dispose(&b->g);
}

/* File offset of the data of the tensor `name`, or (size_t)-1. */
static size_t file_off(const struct built *b, const char *name)
{
    for (uint64_t i = 0; i < b->g.n_t; i++)
        if (strcmp(b->g.names[i], name) == 0)
            return b->data_at + b->g.data_off[i];
    return (size_t)-1;
}

static char *write_gguf(const void *data, size_t len)
{
    char *path = strdup("/tmp/sluice-gguf-test-XXXXXX.gguf");
    int fd = mkstemps(path, 5);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, data, len), (ssize_t)len);
    close(fd);
    return path;
}

/* Parses an in-memory image placed against a guard page. Returns the status; err gets the
 * message. */
static int parse_guarded(struct ft_guard *gd, const void *data, size_t len, char *err,
                         size_t errlen)
{
    const void *p = ft_guard_put(gd, data, len);
    struct sl_model *m = sl_xcalloc(1, sizeof(*m));
    err[0] = '\0';
    int rc = sl_model_gguf_parse(m, p, len, "mem.gguf", err, errlen);
    sl_model_free(m);
    return rc;
}

static void expect_bad(const void *data, size_t len, const char *what)
{
    struct ft_guard gd;
    ft_guard_init(&gd, len);
    char err[512];
    int rc = parse_guarded(&gd, data, len, err, sizeof(err));
    cr_assert_eq(rc, SL_EFORMAT, "%s: accepted (%s)", what, sl_status_str(rc));
    cr_assert(strstr(err, "mem.gguf") != NULL, "%s: message \"%s\" names no file", what, err);
    ft_guard_dispose(&gd);
}

static void expect_bad_msg(const void *data, size_t len, const char *what, const char *needle)
{
    struct ft_guard gd;
    ft_guard_init(&gd, len);
    char err[512];
    int rc = parse_guarded(&gd, data, len, err, sizeof(err));
    cr_assert_eq(rc, SL_EFORMAT, "%s: accepted", what);
    cr_assert(strstr(err, needle) != NULL, "%s: message \"%s\" does not say \"%s\"", what, err,
              needle);
    ft_guard_dispose(&gd);
}

static bool inside_map(const struct sl_model *m, const void *p)
{
    const unsigned char *a = m->map, *x = p;
    return x >= a && x < a + m->map_len;
}

/* ---------------------------------------------------------------------------------------------
 * Synthetic files
 */

static void check_mat(const struct sl_model *m, const struct built *b, const struct sl_mat *w,
                      const char *name, enum sl_dtype type, int rows, int cols)
{
    cr_assert_eq(w->type, type, "%s: type %d, want %d", name, w->type, type);
    cr_assert_eq(w->rows, rows, "%s: rows %d, want %d", name, w->rows, rows);
    cr_assert_eq(w->cols, cols, "%s: cols %d, want %d", name, w->cols, cols);
    cr_assert(inside_map(m, w->data), "%s was copied out of the mapping", name);
    cr_assert_eq((size_t)((const unsigned char *)w->data - (const unsigned char *)m->map),
                 file_off(b, name), "%s points at the wrong bytes", name);
}

Test(worker, gguf_keeps_f16_bf16_q8_0_in_the_mapping_when_loaded)
{
    struct built b;
    build(&b, &(struct spec){0});
    char *path = write_gguf(b.p, b.len);
    struct sl_model *m = wt_load(path, NULL);
    const struct sl_model_config *c = sl_model_config(m);
    cr_assert_eq(c->dim, SD);
    cr_assert_eq(c->hidden_dim, SH);
    cr_assert_eq(c->n_layers, SL);
    cr_assert_eq(c->n_heads, 4);
    cr_assert_eq(c->n_kv_heads, 2);
    cr_assert_eq(c->vocab_size, SV);
    cr_assert_eq(c->seq_len, 128);
    cr_assert_float_eq(c->rms_eps, 1e-5f, 1e-12);
    cr_assert_float_eq(c->rope_theta, 500000.0f, 1e-1);
    cr_assert(c->shared_classifier, "no output.weight: the classifier is the embedding");
    const char *base = strrchr(path, '/') + 1;
    cr_assert_eq(strlen(sl_model_id(m)), strlen(base) - 5);
    cr_assert(strncmp(sl_model_id(m), base, strlen(base) - 5) == 0);

    check_mat(m, &b, &m->w.token_embedding, "token_embd.weight", SL_DTYPE_Q8_0, SV, SD);
    cr_assert_eq(m->w.wcls.data, m->w.token_embedding.data);
    cr_assert_eq(m->w.wcls.type, SL_DTYPE_Q8_0);
    for (int l = 0; l < SL; l++) {
        const struct sl_layer_weights *L = &m->w.layers[l];
        char n[64];
#define M(field, part, type, rows, cols)                                                           \
    snprintf(n, sizeof(n), "blk.%d." part ".weight", l);                                           \
    check_mat(m, &b, &L->field, n, type, rows, cols)
        M(wq, "attn_q", SL_DTYPE_F16, SD, SD);
        M(wk, "attn_k", SL_DTYPE_Q8_0, SKV, SD);
        M(wv, "attn_v", SL_DTYPE_F32, SKV, SD);
        M(wo, "attn_output", SL_DTYPE_F16, SD, SD);
        M(w1, "ffn_gate", SL_DTYPE_Q8_0, SH, SD);
        M(w2, "ffn_down", SL_DTYPE_Q8_0, SD, SH);
        M(w3, "ffn_up", SL_DTYPE_BF16, SH, SD);
#undef M
        /* fp32 norms are used in place; BF16 ones are converted, exactly. */
        snprintf(n, sizeof(n), "blk.%d.attn_norm.weight", l);
        cr_assert_eq((const void *)L->rms_att,
                     (const void *)((const char *)m->map + file_off(&b, n)));
        snprintf(n, sizeof(n), "blk.%d.ffn_norm.weight", l);
        cr_assert(!inside_map(m, L->rms_ffn));
        for (int i = 0; i < SD; i++) {
            uint16_t h;
            memcpy(&h, b.p + file_off(&b, n) + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            float want;
            memcpy(&want, &bits, 4);
            cr_assert_eq(L->rms_ffn[i], want);
        }
    }
    for (int i = 0; i < SD; i++) {
        uint16_t h;
        memcpy(&h, b.p + file_off(&b, "output_norm.weight") + 2 * i, 2);
        cr_assert_eq(m->w.rms_final[i], ft_half(h));
    }
    /* A Q8_0 row dequantizes to d * q per block. */
    float row[SD];
    const unsigned char *q = (const unsigned char *)m->w.token_embedding.data + 5 * 68;
    sl_model_row_to_f32(SL_DTYPE_Q8_0, q, row, SD);
    for (int i = 0; i < SD; i++) {
        uint16_t d;
        memcpy(&d, q + (i / 32) * 34, 2);
        cr_assert_eq(row[i], ft_half(d) * (float)(int8_t)q[(i / 32) * 34 + 2 + i % 32]);
    }

    /* The vocabulary: "▁" reads as a space, control tokens decode to nothing. */
    const struct sl_tok *t = sl_model_tok(m);
    cr_assert_eq(sl_tok_vocab_size(t), SV);
    cr_assert_eq(sl_tok_bos(t), 1);
    int32_t ids[8];
    int nid = 0;
    cr_assert_eq(sl_tok_encode(t, "a b", 3, true, ids, 8, &nid), SL_OK);
    cr_assert_eq(nid, 4);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(ids[1], 261); /* " a" */
    cr_assert_eq(ids[2], 259); /* " " */
    cr_assert_eq(ids[3], 262); /* "b" */
    size_t len;
    cr_assert_eq(memcmp(sl_tok_decode(t, 1, 261, &len), "a", 1), 0);
    cr_assert_eq(len, 1);
    cr_assert_eq(memcmp(sl_tok_decode(t, 261, 261, &len), " a", 2), 0);
    sl_tok_decode(t, 5, 2, &len);
    cr_assert_eq(len, 0, "</s> is a control token");
    cr_assert_eq((unsigned char)*sl_tok_decode(t, 5, 3 + 0xC3, &len), 0xC3);
    cr_assert(sl_model_is_stop_token(m, 2));
    cr_assert(sl_model_is_stop_token(m, 1));
    cr_assert(!sl_model_is_stop_token(m, 0));
    sl_model_free(m);
    unlink(path);
    free(path);
    built_dispose(&b);
}

/* A Q4_K_M-like mix (Q4_K, Q4_0, Q5_K, Q6_K, Q8_0): every tensor in place in the mapping, typed,
 * and a forward pass over it gives finite logits with either kind of activations. */
Test(worker, gguf_keeps_k_quant_tensors_in_the_mapping_and_runs_them)
{
    struct built b;
    build(&b, &(struct spec){.kquants = true, .output = true});
    char *path = write_gguf(b.p, b.len);
    struct sl_model *m = wt_load(path, NULL);
    const struct sl_model_config *c = sl_model_config(m);
    cr_assert_eq(c->dim, 256);
    cr_assert_eq(c->hidden_dim, 512);
    check_mat(m, &b, &m->w.token_embedding, "token_embd.weight", SL_DTYPE_Q4_K, SV, 256);
    check_mat(m, &b, &m->w.wcls, "output.weight", SL_DTYPE_Q6_K, SV, 256);
    for (int l = 0; l < SL; l++) {
        const struct sl_layer_weights *L = &m->w.layers[l];
        char n[64];
#define M(field, part, type, rows, cols)                                                           \
    snprintf(n, sizeof(n), "blk.%d." part ".weight", l);                                           \
    check_mat(m, &b, &L->field, n, type, rows, cols)
        M(wq, "attn_q", SL_DTYPE_Q4_K, 256, 256);
        M(wk, "attn_k", SL_DTYPE_Q4_0, 128, 256);
        M(wv, "attn_v", SL_DTYPE_Q6_K, 128, 256);
        M(wo, "attn_output", SL_DTYPE_Q5_K, 256, 256);
        M(w1, "ffn_gate", SL_DTYPE_Q4_K, 512, 256);
        M(w2, "ffn_down", SL_DTYPE_Q6_K, 256, 512);
        M(w3, "ffn_up", SL_DTYPE_Q8_0, 512, 256);
#undef M
    }
    for (int f = 0; f < 2; f++) {
        struct sl_backend_opts o = {.n_kv_blocks = 8,
                                    .block_size = 16,
                                    .max_batch_tokens = 8,
                                    .max_seqs = 1,
                                    .threads = 2,
                                    .float_activations = f == 1};
        struct sl_worker *w = NULL;
        cr_assert_eq(sl_worker_new(m, &sl_cpu_backend_ops, &o, &w), SL_OK);
        int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
        const int32_t *tables[1] = {table};
        int32_t ctx[1] = {4};
        struct wt_step st = {0};
        for (int i = 0; i < 4; i++)
            wt_step_add(&st, 0, 259 + i, i);
        float *l = malloc((size_t)4 * SV * sizeof(float));
        wt_run_step(w, &st, 1, tables, ctx, l);
        for (int i = 0; i < 4 * SV; i++)
            cr_assert(isfinite(l[i]), "%s activations: logit %d is %g", f ? "fp32" : "int8", i,
                      l[i]);
        free(l);
        sl_worker_free(w);
    }
    sl_model_free(m);
    unlink(path);
    free(path);
    built_dispose(&b);
}

Test(worker, gguf_reads_the_chat_template_when_metadata_has_one)
{
    static const char tmpl[] =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
    struct built b;
    build(&b, &(struct spec){.chat_template = tmpl});
    char *path = write_gguf(b.p, b.len);
    struct sl_model *m = wt_load(path, NULL);
    cr_assert_not_null(sl_model_chat_template(m));
    cr_assert_str_eq(sl_model_chat_template(m), tmpl);
    sl_model_free(m);
    unlink(path);
    free(path);
    built_dispose(&b);

    /* Without the key there is no template. */
    build(&b, &(struct spec){0});
    path = write_gguf(b.p, b.len);
    m = wt_load(path, NULL);
    cr_assert_null(sl_model_chat_template(m));
    sl_model_free(m);
    unlink(path);
    free(path);
    built_dispose(&b);
}

Test(worker, gguf_rejects_the_file_when_chat_template_is_not_a_string)
{
    struct built b;
    build(&b, &(struct spec){.chat_template_not_string = true});
    expect_bad_msg(b.p, b.len, "u32 chat_template", "tokenizer.chat_template is not a string");
    built_dispose(&b);
}

Test(worker, gguf_finds_control_tokens_as_special_when_asked_by_text)
{
    struct built b;
    build(&b, &(struct spec){0});
    char *path = write_gguf(b.p, b.len);
    struct sl_model *m = wt_load(path, NULL);
    const struct sl_tok *t = sl_model_tok(m);
    cr_assert_eq(sl_tok_special_id(t, "<s>", 3), 1);
    cr_assert_eq(sl_tok_special_id(t, "</s>", 4), 2);
    /* Ordinary pieces, unknown text and prefixes of a special token are not special. */
    cr_assert_eq(sl_tok_special_id(t, "ab", 2), -1);
    cr_assert_eq(sl_tok_special_id(t, "<unk>", 5), -1, "<unk> has type 2 (unknown), not control");
    cr_assert_eq(sl_tok_special_id(t, "<s", 2), -1);
    cr_assert_eq(sl_tok_special_id(t, "<|im_start|>", 12), -1);
    cr_assert_eq(sl_tok_special_id(t, "", 0), -1);
    sl_model_free(m);
    unlink(path);
    free(path);
    built_dispose(&b);
}

Test(worker, gguf_loads_when_unknown_keys_of_every_type_are_present)
{
    struct built b;
    build(&b, &(struct spec){.extra_keys = true, .output = true, .align = 64});
    char *path = write_gguf(b.p, b.len);
    struct sl_model *m = wt_load(path, NULL);
    cr_assert(!sl_model_config(m)->shared_classifier);
    cr_assert_eq(m->w.wcls.type, SL_DTYPE_F32);
    cr_assert_eq((uintptr_t)m->w.token_embedding.data % 64, 0);
    sl_model_free(m);
    unlink(path);
    free(path);
    built_dispose(&b);
}

Test(worker, gguf_copies_only_misaligned_tensors_when_alignment_is_one)
{
    struct built b;
    build(&b, &(struct spec){.align = 1});
    struct sl_model *m = sl_xcalloc(1, sizeof(*m));
    /* At an odd address every fp32 and 16-bit tensor is misaligned; Q8_0 (2-aligned) too. */
    unsigned char *buf = malloc(b.len + 1);
    memcpy(buf + 1, b.p, b.len);
    char err[256];
    cr_assert_eq(sl_model_gguf_parse(m, buf + 1, b.len, "odd.gguf", err, sizeof(err)), SL_OK, "%s",
                 err);
    const struct sl_layer_weights *L = &m->w.layers[0];
    cr_assert_eq((uintptr_t)L->wv.data % 4, 0);
    cr_assert_eq((uintptr_t)L->rms_att % 4, 0);
    cr_assert_eq((uintptr_t)L->wq.data % 2, 0);
    cr_assert_eq(memcmp(L->wv.data, buf + 1 + file_off(&b, "blk.0.attn_v.weight"), SKV * SD * 4),
                 0);
    sl_model_free(m);
    free(buf);
    built_dispose(&b);
}

Test(worker, gguf_rejects_every_prefix_when_file_is_truncated)
{
    struct built b;
    build(&b, &(struct spec){.extra_keys = true});
    struct ft_guard gd;
    ft_guard_init(&gd, b.len);
    char err[512];
    for (size_t n = 0; n < b.len; n += n < b.data_at + 1000 ? 1 : 97) {
        int rc = parse_guarded(&gd, b.p, n, err, sizeof(err));
        cr_assert_eq(rc, SL_EFORMAT, "prefix of %zu of %zu bytes accepted", n, b.len);
        cr_assert(strstr(err, "mem.gguf") != NULL, "prefix %zu: \"%s\"", n, err);
    }
    cr_assert_eq(parse_guarded(&gd, b.p, b.len, err, sizeof(err)), SL_OK, "%s", err);
    ft_guard_dispose(&gd);
    built_dispose(&b);
}

static void patch_u64(unsigned char *p, size_t at, uint64_t v)
{
    memcpy(p + at, &v, 8);
}

Test(worker, gguf_rejects_file_when_header_or_tensor_info_is_corrupt)
{
    struct built b;
    build(&b, &(struct spec){0});
    unsigned char *c = malloc(b.len);
#define FRESH() memcpy(c, b.p, b.len)
    FRESH();
    memcpy(c, "GGUX", 4);
    expect_bad_msg(c, b.len, "bad magic", "magic");
    FRESH();
    c[4] = 1;
    expect_bad_msg(c, b.len, "version 1", "version");
    FRESH();
    c[4] = 99;
    expect_bad_msg(c, b.len, "version 99", "version");
    FRESH();
    patch_u64(c, 8, UINT64_C(1) << 40);
    expect_bad(c, b.len, "huge tensor count");
    FRESH();
    patch_u64(c, 8, 0);
    expect_bad(c, b.len, "no tensors");
    FRESH();
    patch_u64(c, 16, UINT64_C(1) << 60);
    expect_bad(c, b.len, "huge kv count");
    FRESH();
    patch_u64(c, 24, UINT64_C(1) << 62);
    expect_bad(c, b.len, "huge key length");
    FRESH();
    patch_u64(c, 24, 0);
    expect_bad(c, b.len, "empty key");
    /* The first key is "general.architecture" (20 bytes); its type follows. */
    FRESH();
    c[24 + 8 + 20] = 77;
    expect_bad_msg(c, b.len, "unknown value type", "type");
    FRESH();
    patch_u64(c, 24 + 8 + 20 + 4, UINT64_C(1) << 50);
    expect_bad(c, b.len, "huge string value");
    /* Tensor 0 is token_embd: its offset, moved past the end or off the alignment. */
    FRESH();
    patch_u64(c, b.ti_at + b.g.off_field[0], UINT64_C(1) << 40);
    expect_bad_msg(c, b.len, "offset past the end", "past the end");
    /* The last tensor (blk.1.ffn_up, 12 KiB) moved to start 32 bytes before the end. */
    FRESH();
    patch_u64(c, b.ti_at + b.g.off_field[b.g.n_t - 1], (b.len - b.data_at - 32) / 32 * 32);
    expect_bad_msg(c, b.len, "tensor overlapping the end", "blk.1.ffn_up.weight");
    FRESH();
    patch_u64(c, b.ti_at + b.g.off_field[1], b.g.data_off[1] + 1);
    expect_bad_msg(c, b.len, "misaligned offset", "alignment");
    /* Its name length, then its dimension count. */
    FRESH();
    patch_u64(c, b.ti_at, UINT64_C(1) << 40);
    expect_bad(c, b.len, "huge tensor name");
    FRESH();
    c[b.ti_at + 8 + 17] = 9;
    expect_bad_msg(c, b.len, "9 dimensions", "dimensions");
    FRESH();
    patch_u64(c, b.ti_at + 8 + 17 + 4, 0);
    expect_bad_msg(c, b.len, "zero dimension", "dimension");
    FRESH();
    patch_u64(c, b.ti_at + 8 + 17 + 4, UINT64_C(1) << 40);
    expect_bad(c, b.len, "huge dimension");
#undef FRESH
    free(c);
    built_dispose(&b);

    struct {
        struct spec sp;
        const char *needle;
    } cases[] = {
        {{.drop = "blk.1.ffn_up.weight"}, "blk.1.ffn_up.weight is missing"},
        {{.drop = "output_norm.weight"}, "output_norm.weight"},
        {{.wide = "blk.0.attn_k.weight"}, "shape"},
        {{.wide = "token_embd.weight"}, "shape"},
        {{.q4k = "blk.0.ffn_down.weight"}, "Q4_K with rows of 96 values (not a multiple of 256)"},
        {{.q3k = "blk.0.ffn_down.weight"}, "type Q3_K (11)"},
        {{.dup = true}, "twice"},
        {{.arch = "gpt2"}, "llama"},
        {{.align = 3}, "alignment"},
        {{.embedding_length = 65}, "hyper-parameters"},
        {{.embedding_length = 128}, "shape"},
        {{.eps_type = 8}, "not a float"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct built x;
        build(&x, &cases[i].sp);
        char what[32];
        snprintf(what, sizeof(what), "case %zu", i);
        expect_bad_msg(x.p, x.len, what, cases[i].needle);
        built_dispose(&x);
    }
}

Test(worker, f16_and_bf16_convert_exactly_when_every_value_is_tried)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float got = sl_model_f16_to_f32((uint16_t)h), want = ft_half((uint16_t)h);
        if (isnan(want))
            cr_assert(isnan(got), "half %04x", h);
        else
            cr_assert(got == want && signbit(got) == signbit(want), "half %04x: %g, want %g", h,
                      got, want);
        float b = sl_model_bf16_to_f32((uint16_t)h);
        uint32_t bits;
        memcpy(&bits, &b, 4);
        cr_assert_eq(bits, h << 16);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The real stories260K.gguf
 */

Test(worker, gguf_matches_llama2c_checkpoint_when_model_is_stories260k)
{
    WT_REQUIRE_MODELS(dir);
    char *gp = wt_path(dir, "stories260K.gguf"), *bp = wt_path(dir, "stories260K.bin");
    char *tp = wt_path(dir, "tok512.bin");
    struct sl_model *g = wt_load(gp, NULL), *b = wt_load(bp, tp);
    const struct sl_model_config *gc = sl_model_config(g), *bc = sl_model_config(b);
    cr_assert_str_eq(sl_model_id(g), "stories260K");
    cr_assert_eq(gc->dim, bc->dim);
    cr_assert_eq(gc->hidden_dim, bc->hidden_dim);
    cr_assert_eq(gc->n_layers, bc->n_layers);
    cr_assert_eq(gc->n_heads, bc->n_heads);
    cr_assert_eq(gc->n_kv_heads, bc->n_kv_heads);
    cr_assert_eq(gc->vocab_size, bc->vocab_size);
    cr_assert_eq(gc->seq_len, 2048, "the GGUF says 2048 where the .bin says 512");
    cr_assert_eq(gc->rms_eps, 1e-5f);
    cr_assert_eq(gc->rope_theta, 10000.0f);
    int dim = gc->dim, kv = dim / gc->n_heads * gc->n_kv_heads, hid = gc->hidden_dim;
    size_t V = (size_t)gc->vocab_size;
    cr_assert_eq(memcmp(g->w.token_embedding.data, b->w.token_embedding.data, V * dim * 4), 0);
    cr_assert_eq(memcmp(g->w.wcls.data, b->w.wcls.data, V * dim * 4), 0);
    cr_assert_eq(memcmp(g->w.rms_final, b->w.rms_final, (size_t)dim * 4), 0);
    for (int l = 0; l < gc->n_layers; l++) {
        const struct sl_layer_weights *x = &g->w.layers[l], *y = &b->w.layers[l];
        cr_assert(inside_map(g, x->wq.data) && inside_map(g, x->rms_att));
        cr_assert_eq(memcmp(x->rms_att, y->rms_att, (size_t)dim * 4), 0);
        cr_assert_eq(memcmp(x->rms_ffn, y->rms_ffn, (size_t)dim * 4), 0);
        cr_assert_eq(memcmp(x->wq.data, y->wq.data, (size_t)dim * dim * 4), 0, "layer %d q", l);
        cr_assert_eq(memcmp(x->wk.data, y->wk.data, (size_t)kv * dim * 4), 0, "layer %d k", l);
        cr_assert_eq(memcmp(x->wv.data, y->wv.data, (size_t)kv * dim * 4), 0);
        cr_assert_eq(memcmp(x->wo.data, y->wo.data, (size_t)dim * dim * 4), 0);
        cr_assert_eq(memcmp(x->w1.data, y->w1.data, (size_t)hid * dim * 4), 0);
        cr_assert_eq(memcmp(x->w2.data, y->w2.data, (size_t)hid * dim * 4), 0);
        cr_assert_eq(memcmp(x->w3.data, y->w3.data, (size_t)hid * dim * 4), 0);
    }
    /* The embedded vocabulary is tok512 with "▁" read as a space (control tokens aside). */
    const struct sl_tok *gt = sl_model_tok(g), *bt = sl_model_tok(b);
    cr_assert_eq(sl_tok_vocab_size(gt), 512);
    for (int i = 3; i < 512; i++) {
        cr_assert_eq(gt->piece_len[i], bt->piece_len[i], "token %d", i);
        cr_assert_eq(memcmp(gt->pieces[i], bt->pieces[i], gt->piece_len[i]), 0, "token %d", i);
        cr_assert_eq(gt->scores[i], bt->scores[i], "token %d", i);
    }
    cr_assert(sl_model_is_stop_token(g, 1) && sl_model_is_stop_token(g, 2));
    sl_model_free(g);
    sl_model_free(b);
    free(gp);
    free(bp);
    free(tp);
}

Test(worker, gguf_rejects_real_file_when_cut_anywhere)
{
    WT_REQUIRE_MODELS(dir);
    char *gp = wt_path(dir, "stories260K.gguf");
    size_t len;
    unsigned char *data = wt_read(gp, &len);
    struct ft_guard gd;
    ft_guard_init(&gd, len);
    char err[512];
    /* Every cut inside the header, metadata and tensor infos (14,176 bytes), then a stride
     * through the data. */
    for (size_t n = 0; n < len; n += n < 14400 ? 1 : 997) {
        int rc = parse_guarded(&gd, data, n, err, sizeof(err));
        cr_assert_eq(rc, SL_EFORMAT, "cut at %zu accepted", n);
    }
    cr_assert_eq(parse_guarded(&gd, data, len - 1, err, sizeof(err)), SL_EFORMAT);
    cr_assert_eq(parse_guarded(&gd, data, len, err, sizeof(err)), SL_OK, "%s", err);
    ft_guard_dispose(&gd);
    /* Through the file path too: the message names the file. */
    size_t cuts[] = {0, 3, 23, 24, 5000, len / 2, len - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        char *tmp = write_gguf(data, cuts[i]);
        struct sl_model *m = (struct sl_model *)0x1;
        int rc = sl_model_load(tmp, NULL, &m, err, sizeof(err));
        cr_assert_eq(rc, SL_EFORMAT, "cut at %zu", cuts[i]);
        cr_assert_eq(m, (struct sl_model *)0x1);
        cr_assert(strstr(err, tmp) != NULL, "\"%s\" does not name %s", err, tmp);
        unlink(tmp);
        free(tmp);
    }
    free(data);
    free(gp);
}
