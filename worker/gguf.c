/* GGUF v3 models (llama architecture).
 *
 * The file is mmap'd and every weight points into the mapping in its own type (F32, F16, BF16,
 * Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): nothing is expanded at load. Only norm weights that are not fp32
 * are converted. Every count, length and offset is checked against the bytes that remain before it
 * is used, so a truncated or corrupt file is an error message, never a read past the end.
 *
 * q/k rows are used as stored: GGUF llama files carry them in llama2.c's interleaved RoPE layout
 * (llama.cpp's converter permutes HF weights into it; stories260K.gguf is byte-identical to the
 * llama2.c checkpoint), which is the layout the CPU backend uses.
 */
#include "worker_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGN 32
#define MAX_TENSORS (1u << 16)
#define MAX_KV (1u << 20)
#define MAX_KEY 65535   /* the spec's bound on key length */
#define MAX_NAME 256    /* tensor names (ggml itself allows 63 bytes) */
#define MAX_DEPTH 4     /* nested arrays */
#define MAX_ALIGN 65536 /* general.alignment */

enum gguf_type {
    GT_U8,
    GT_I8,
    GT_U16,
    GT_I16,
    GT_U32,
    GT_I32,
    GT_F32,
    GT_BOOL,
    GT_STRING,
    GT_ARRAY,
    GT_U64,
    GT_I64,
    GT_F64,
    GT_COUNT,
};

/* Bytes of a fixed-size value type, 0 for strings and arrays. */
static const uint8_t gt_size[GT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* GGML tensor types sluice reads, and the names of the others for messages. */
enum {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_BF16 = 30
};
static const char *const ggml_names[] = {
    "F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
    "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
    "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16",
};

static enum sl_dtype to_dtype(uint32_t t)
{
    switch (t) {
    case GGML_F16: return SL_DTYPE_F16;
    case GGML_BF16: return SL_DTYPE_BF16;
    case GGML_Q8_0: return SL_DTYPE_Q8_0;
    case GGML_Q4_0: return SL_DTYPE_Q4_0;
    case GGML_Q4_K: return SL_DTYPE_Q4_K;
    case GGML_Q5_K: return SL_DTYPE_Q5_K;
    case GGML_Q6_K: return SL_DTYPE_Q6_K;
    default: return SL_DTYPE_F32;
    }
}

static const char *ggml_name(uint32_t t)
{
    return t < sizeof(ggml_names) / sizeof(ggml_names[0]) ? ggml_names[t] : "unknown";
}

/* A bounds-checked little-endian reader over the mapped file (little-endian hosts only, like the
 * llama2.c loader). */
struct rd {
    const unsigned char *p;
    size_t len, off;
};

static bool rd_skip(struct rd *r, uint64_t n)
{
    if (n > r->len - r->off)
        return false;
    r->off += (size_t)n;
    return true;
}

static bool rd_u32(struct rd *r, uint32_t *v)
{
    if (r->len - r->off < 4)
        return false;
    memcpy(v, r->p + r->off, 4);
    r->off += 4;
    return true;
}

static bool rd_u64(struct rd *r, uint64_t *v)
{
    if (r->len - r->off < 8)
        return false;
    memcpy(v, r->p + r->off, 8);
    r->off += 8;
    return true;
}

/* A string: u64 length, then that many bytes (no NUL). */
static bool rd_str(struct rd *r, const char **s, uint64_t *n)
{
    if (!rd_u64(r, n) || *n > r->len - r->off)
        return false;
    *s = (const char *)r->p + r->off;
    r->off += (size_t)*n;
    return true;
}

struct kv {
    const char *key;
    uint64_t klen;
    uint32_t type;
    size_t val;     /* file offset of the value (arrays: of the first element) */
    uint32_t atype; /* arrays: element type */
    uint64_t n;     /* arrays: element count */
};

struct tinfo {
    const char *name;
    uint64_t nlen;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    uint64_t off;   /* relative to the data section */
    uint64_t bytes; /* computed from ne and type */
};

struct gguf {
    const char *file;
    struct rd r;
    struct kv *kvs; /* (n_kv) */
    uint64_t n_kv;
    struct tinfo *ts; /* (n_tensors) */
    uint32_t *order;  /* (n_tensors) indexes of ts sorted by name */
    uint64_t n_tensors;
    size_t data; /* file offset of the data section */
    char *err;
    size_t errlen;
};

static bool fail(struct gguf *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(struct gguf *g, const char *fmt, ...)
{
    char why[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(g->err, g->errlen, "%s: %s", g->file, why);
    return false;
}

static bool skip_value(struct gguf *g, uint32_t type, int depth, const char *key, int klen)
{
    struct rd *r = &g->r;
    if (type >= GT_COUNT)
        return fail(g, "metadata %.*s has unknown value type %u", klen, key, type);
    if (gt_size[type])
        return rd_skip(r, gt_size[type]) ||
               fail(g, "truncated in the value of metadata %.*s", klen, key);
    if (type == GT_STRING) {
        const char *s;
        uint64_t n;
        return rd_str(r, &s, &n) || fail(g, "truncated in the string of metadata %.*s", klen, key);
    }
    uint32_t at;
    uint64_t n;
    if (depth >= MAX_DEPTH)
        return fail(g, "metadata %.*s nests arrays more than %d deep", klen, key, MAX_DEPTH);
    if (!rd_u32(r, &at) || !rd_u64(r, &n))
        return fail(g, "truncated in the array header of metadata %.*s", klen, key);
    if (at >= GT_COUNT)
        return fail(g, "metadata %.*s is an array of unknown type %u", klen, key, at);
    if (gt_size[at]) {
        if (n > (r->len - r->off) / gt_size[at])
            return fail(g, "metadata %.*s: array of %llu elements runs past the end of the file",
                        klen, key, (unsigned long long)n);
        r->off += (size_t)n * gt_size[at];
        return true;
    }
    /* Every string or array element takes at least 8 bytes: a cheap bound before the walk. */
    if (n > (r->len - r->off) / 8)
        return fail(g, "metadata %.*s: array of %llu elements runs past the end of the file", klen,
                    key, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++)
        if (!skip_value(g, at, depth + 1, key, klen))
            return false;
    return true;
}

static bool parse_header(struct gguf *g)
{
    struct rd *r = &g->r;
    uint32_t version;
    if (r->len < 4 || memcmp(r->p, GGUF_MAGIC, 4) != 0)
        return fail(g, "not a GGUF file (bad magic)");
    r->off = 4;
    if (!rd_u32(r, &version) || !rd_u64(r, &g->n_tensors) || !rd_u64(r, &g->n_kv))
        return fail(g, "truncated: %zu bytes, shorter than the 24-byte header", r->len);
    /* v2 and v3 share the little-endian layout; v1 had 32-bit counts. */
    if (version != 2 && version != 3)
        return fail(g, "unsupported GGUF version %u (2 and 3 are read)", version);
    if (g->n_kv > MAX_KV || g->n_kv > (r->len - r->off) / 13)
        return fail(g, "implausible metadata count %llu for a %zu-byte file",
                    (unsigned long long)g->n_kv, r->len);
    if (g->n_tensors == 0 || g->n_tensors > MAX_TENSORS)
        return fail(g, "implausible tensor count %llu", (unsigned long long)g->n_tensors);
    g->kvs = sl_xcalloc((size_t)g->n_kv ? (size_t)g->n_kv : 1, sizeof(*g->kvs));
    for (uint64_t i = 0; i < g->n_kv; i++) {
        struct kv *k = &g->kvs[i];
        if (!rd_str(r, &k->key, &k->klen))
            return fail(g, "truncated in the key of metadata entry %llu", (unsigned long long)i);
        if (k->klen == 0 || k->klen > MAX_KEY)
            return fail(g, "metadata entry %llu has a key of %llu bytes", (unsigned long long)i,
                        (unsigned long long)k->klen);
        if (!rd_u32(r, &k->type))
            return fail(g, "truncated after metadata key %.*s", (int)k->klen, k->key);
        k->val = r->off;
        if (k->type == GT_ARRAY && r->len - r->off >= 12) {
            memcpy(&k->atype, r->p + r->off, 4);
            memcpy(&k->n, r->p + r->off + 4, 8);
            k->val += 12;
        }
        if (!skip_value(g, k->type, 0, k->key, (int)k->klen))
            return false;
    }
    return true;
}

static const struct kv *find_kv(const struct gguf *g, const char *key)
{
    size_t n = strlen(key);
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kvs[i].klen == n && memcmp(g->kvs[i].key, key, n) == 0)
            return &g->kvs[i];
    return NULL;
}

/* An integer metadata value of any integer type. Returns 0 when absent, 1 when read, -1 (after
 * fail) when present but not an integer in [0, max]. */
static int get_uint(struct gguf *g, const char *key, uint64_t max, uint64_t *out)
{
    const struct kv *k = find_kv(g, key);
    if (!k)
        return 0;
    const unsigned char *p = g->r.p + k->val;
    int64_t s = 0;
    uint64_t u = 0;
    bool neg = false;
    switch (k->type) {
    case GT_U8: u = p[0]; break;
    case GT_I8: s = (int8_t)p[0], neg = s < 0, u = (uint64_t)s; break;
    case GT_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        u = v;
        break;
    }
    case GT_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        neg = v < 0, u = (uint64_t)v;
        break;
    }
    case GT_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        u = v;
        break;
    }
    case GT_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        neg = v < 0, u = (uint64_t)v;
        break;
    }
    case GT_U64: memcpy(&u, p, 8); break;
    case GT_I64: memcpy(&s, p, 8), neg = s < 0, u = (uint64_t)s; break;
    default: fail(g, "metadata %s is not an integer", key); return -1;
    }
    if (neg || u > max) {
        fail(g, "metadata %s is out of range", key);
        return -1;
    }
    *out = u;
    return 1;
}

/* A float metadata value (F32 or F64); same returns as get_uint. */
static int get_float(struct gguf *g, const char *key, double *out)
{
    const struct kv *k = find_kv(g, key);
    if (!k)
        return 0;
    if (k->type == GT_F32) {
        float f;
        memcpy(&f, g->r.p + k->val, 4);
        *out = f;
    } else if (k->type == GT_F64) {
        memcpy(out, g->r.p + k->val, 8);
    } else {
        fail(g, "metadata %s is not a float", key);
        return -1;
    }
    return 1;
}

/* A string metadata value: 1 when read (s, n into the file), 0 when absent, -1 when not a
 * string. */
static int get_str(struct gguf *g, const char *key, const char **s, uint64_t *n)
{
    const struct kv *k = find_kv(g, key);
    if (!k)
        return 0;
    if (k->type != GT_STRING) {
        fail(g, "metadata %s is not a string", key);
        return -1;
    }
    struct rd r = {g->r.p, g->r.len, k->val};
    rd_str(&r, s, n); /* validated by parse_header */
    return 1;
}

static bool str_eq(const char *s, uint64_t n, const char *lit)
{
    return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

static int cmp_name(const void *pa, const void *pb, void *ctx)
{
    const struct tinfo *ts = ctx;
    const struct tinfo *a = &ts[*(const uint32_t *)pa], *b = &ts[*(const uint32_t *)pb];
    size_t n = a->nlen < b->nlen ? a->nlen : b->nlen;
    int c = memcmp(a->name, b->name, n);
    if (c)
        return c;
    return a->nlen < b->nlen ? -1 : a->nlen > b->nlen;
}

static bool parse_tensors(struct gguf *g)
{
    struct rd *r = &g->r;
    uint64_t align = GGUF_DEFAULT_ALIGN;
    int got = get_uint(g, "general.alignment", MAX_ALIGN, &align);
    if (got < 0)
        return false;
    if (align == 0 || (align & (align - 1)))
        return fail(g, "general.alignment %llu is not a power of two", (unsigned long long)align);
    if (g->n_tensors > (r->len - r->off) / 24)
        return fail(g, "truncated: %llu tensor infos cannot fit in the rest of the file",
                    (unsigned long long)g->n_tensors);
    g->ts = sl_xcalloc((size_t)g->n_tensors, sizeof(*g->ts));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct tinfo *t = &g->ts[i];
        if (!rd_str(r, &t->name, &t->nlen))
            return fail(g, "truncated in the name of tensor %llu", (unsigned long long)i);
        if (t->nlen == 0 || t->nlen > MAX_NAME)
            return fail(g, "tensor %llu has a name of %llu bytes", (unsigned long long)i,
                        (unsigned long long)t->nlen);
        int nl = (int)t->nlen;
        if (!rd_u32(r, &t->n_dims))
            return fail(g, "truncated in tensor %.*s", nl, t->name);
        if (t->n_dims < 1 || t->n_dims > 4)
            return fail(g, "tensor %.*s has %u dimensions", nl, t->name, t->n_dims);
        uint64_t elems = 1;
        for (uint32_t d = 0; d < 4; d++) {
            t->ne[d] = 1;
            if (d < t->n_dims && !rd_u64(r, &t->ne[d]))
                return fail(g, "truncated in tensor %.*s", nl, t->name);
            if (t->ne[d] == 0 || t->ne[d] > INT32_MAX || elems > (UINT64_C(1) << 61) / t->ne[d])
                return fail(g, "tensor %.*s has a bad dimension %llu", nl, t->name,
                            (unsigned long long)t->ne[d]);
            elems *= t->ne[d];
        }
        if (!rd_u32(r, &t->type) || !rd_u64(r, &t->off))
            return fail(g, "truncated in tensor %.*s", nl, t->name);
        switch (t->type) {
        case GGML_F32: t->bytes = elems * 4; break;
        case GGML_F16:
        case GGML_BF16: t->bytes = elems * 2; break;
        case GGML_Q8_0:
        case GGML_Q4_0:
        case GGML_Q4_K:
        case GGML_Q5_K:
        case GGML_Q6_K: {
            enum sl_dtype dt = to_dtype(t->type);
            int blk = sl_dtype_block(dt);
            if (t->ne[0] % (uint64_t)blk)
                return fail(g,
                            "tensor %.*s is %s with rows of %llu values (not a multiple of "
                            "%d)",
                            nl, t->name, ggml_name(t->type), (unsigned long long)t->ne[0], blk);
            t->bytes = elems / (uint64_t)blk * sl_dtype_row_bytes(dt, blk);
            break;
        }
        default:
            return fail(g,
                        "tensor %.*s has type %s (%u); sluice reads F32, F16, BF16, Q8_0, Q4_0, "
                        "Q4_K, Q5_K and Q6_K",
                        nl, t->name, ggml_name(t->type), t->type);
        }
        if (t->off % align)
            return fail(g, "tensor %.*s: offset %llu is not a multiple of the alignment %llu", nl,
                        t->name, (unsigned long long)t->off, (unsigned long long)align);
    }
    uint64_t data = (r->off + align - 1) / align * align;
    if (data > r->len)
        return fail(g, "truncated: the data section would start at %llu, past the end (%zu)",
                    (unsigned long long)data, r->len);
    g->data = (size_t)data;
    uint64_t room = r->len - g->data;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const struct tinfo *t = &g->ts[i];
        if (t->off > room || t->bytes > room - t->off)
            return fail(g,
                        "tensor %.*s: %llu bytes at data offset %llu run past the end of the "
                        "file (%llu bytes of data)",
                        (int)t->nlen, t->name, (unsigned long long)t->bytes,
                        (unsigned long long)t->off, (unsigned long long)room);
    }
    g->order = sl_xmalloc((size_t)g->n_tensors * sizeof(*g->order));
    for (uint32_t i = 0; i < g->n_tensors; i++)
        g->order[i] = i;
    qsort_r(g->order, (size_t)g->n_tensors, sizeof(*g->order), cmp_name, g->ts);
    for (uint64_t i = 1; i < g->n_tensors; i++)
        if (cmp_name(&g->order[i - 1], &g->order[i], g->ts) == 0)
            return fail(g, "tensor %.*s appears twice", (int)g->ts[g->order[i]].nlen,
                        g->ts[g->order[i]].name);
    return true;
}

static const struct tinfo *find_tensor(const struct gguf *g, const char *name)
{
    size_t lo = 0, hi = (size_t)g->n_tensors, n = strlen(name);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const struct tinfo *t = &g->ts[g->order[mid]];
        size_t k = t->nlen < n ? (size_t)t->nlen : n;
        int c = memcmp(t->name, name, k);
        if (c == 0)
            c = t->nlen < n ? -1 : t->nlen > n;
        if (c == 0)
            return t;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The tensor `name` with GGML shape [cols, rows] (rows 0: a vector of cols), or NULL after fail.
 * optional: absent is not an error (returns NULL without fail). */
static const struct tinfo *want(struct gguf *g, const char *name, int cols, int rows, bool optional)
{
    const struct tinfo *t = find_tensor(g, name);
    if (!t) {
        if (!optional)
            fail(g, "tensor %s is missing", name);
        return NULL;
    }
    uint64_t r = rows ? (uint64_t)rows : 1;
    if (t->ne[0] != (uint64_t)cols || t->ne[1] != r || t->ne[2] != 1 || t->ne[3] != 1) {
        fail(g, "tensor %s has shape [%llu, %llu, %llu, %llu], the hyper-parameters say [%d, %llu]",
             name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
             (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], cols,
             (unsigned long long)r);
        return NULL;
    }
    return t;
}

static const void *tdata(const struct gguf *g, const struct tinfo *t)
{
    return g->r.p + g->data + t->off;
}

static bool mat(struct gguf *g, struct sl_model *m, struct sl_mat *out, const char *name, int cols,
                int rows)
{
    const struct tinfo *t = want(g, name, cols, rows, false);
    if (!t)
        return false;
    *out = sl_model_mat_place(m, to_dtype(t->type), tdata(g, t), rows, cols);
    return true;
}

static bool norm(struct gguf *g, struct sl_model *m, const float **out, const char *name, int dim)
{
    const struct tinfo *t = want(g, name, dim, 0, false);
    if (!t)
        return false;
    *out = sl_model_norm_f32(m, to_dtype(t->type), tdata(g, t), dim);
    return true;
}

/* Reads a required or optional llama.* integer into an int bounded by max. */
static bool hparam(struct gguf *g, const char *key, int max, bool required, int *out)
{
    char full[96];
    snprintf(full, sizeof(full), "llama.%s", key);
    uint64_t v;
    int got = get_uint(g, full, (uint64_t)max, &v);
    if (got < 0)
        return false;
    if (got == 0) {
        if (required)
            return fail(g, "metadata %s is missing", full);
        return true;
    }
    *out = (int)v;
    return true;
}

static bool load_config(struct gguf *g, struct sl_model_config *c, int vocab)
{
    const char *arch;
    uint64_t alen;
    int got = get_str(g, "general.architecture", &arch, &alen);
    if (got < 0)
        return false;
    if (got == 0)
        return fail(g, "metadata general.architecture is missing");
    if (!str_eq(arch, alen, "llama"))
        return fail(g, "architecture \"%.*s\" is not llama", (int)(alen > 64 ? 64 : alen), arch);
    c->n_kv_heads = -1;
    c->rope_theta = 10000.0f;
    if (!hparam(g, "context_length", 1 << 20, true, &c->seq_len) ||
        !hparam(g, "embedding_length", 65536, true, &c->dim) ||
        !hparam(g, "feed_forward_length", 1 << 20, true, &c->hidden_dim) ||
        !hparam(g, "block_count", 1024, true, &c->n_layers) ||
        !hparam(g, "attention.head_count", 65536, true, &c->n_heads) ||
        !hparam(g, "attention.head_count_kv", 65536, false, &c->n_kv_heads))
        return false;
    if (c->n_kv_heads < 0)
        c->n_kv_heads = c->n_heads;
    double eps, theta;
    got = get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps);
    if (got < 0)
        return false;
    if (got == 0)
        return fail(g, "metadata llama.attention.layer_norm_rms_epsilon is missing");
    if (!(eps > 0.0 && eps < 1.0))
        return fail(g, "rms epsilon %g is out of range", eps);
    c->rms_eps = (float)eps;
    got = get_float(g, "llama.rope.freq_base", &theta);
    if (got < 0)
        return false;
    if (got == 1) {
        if (!(theta > 1.0 && theta < 1e12))
            return fail(g, "rope.freq_base %g is out of range", theta);
        c->rope_theta = (float)theta;
    }
    c->vocab_size = vocab;
    uint64_t v;
    got = get_uint(g, "llama.vocab_size", 1 << 24, &v);
    if (got < 0)
        return false;
    if (got == 1 && v != (uint64_t)vocab)
        return fail(g, "llama.vocab_size %llu differs from the %d tokens of the vocabulary",
                    (unsigned long long)v, vocab);
    if (sl_model_body_floats(c) == 0)
        return fail(g,
                    "inconsistent hyper-parameters: dim %d hidden %d layers %d heads %d "
                    "kv_heads %d vocab %d context %d",
                    c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, vocab,
                    c->seq_len);
    got = get_uint(g, "llama.rope.dimension_count", 1 << 20, &v);
    if (got < 0)
        return false;
    if (got == 1 && v != (uint64_t)(c->dim / c->n_heads))
        return fail(g, "partial RoPE (rope.dimension_count %llu, head size %d) is not supported",
                    (unsigned long long)v, c->dim / c->n_heads);
    return true;
}

/* An array metadata value of the given element type with exactly n elements; NULL if absent
 * (required: fail). */
static const struct kv *get_array(struct gguf *g, const char *key, uint32_t atype, uint64_t n,
                                  bool required)
{
    const struct kv *k = find_kv(g, key);
    if (!k) {
        if (required)
            fail(g, "metadata %s is missing", key);
        return NULL;
    }
    if (k->type != GT_ARRAY || k->atype != atype) {
        fail(g, "metadata %s is not an array of the expected type", key);
        return NULL;
    }
    if (n != UINT64_MAX && k->n != n) {
        fail(g, "metadata %s has %llu entries, the vocabulary %llu", key, (unsigned long long)k->n,
             (unsigned long long)n);
        return NULL;
    }
    return k;
}

/* Vocabulary of a "llama" (SentencePiece) tokenizer, with llama2.c semantics. */
static bool load_vocab(struct gguf *g, struct sl_model *m, int *vocab)
{
    const char *model;
    uint64_t mlen;
    int got = get_str(g, "tokenizer.ggml.model", &model, &mlen);
    if (got < 0)
        return false;
    if (got == 0)
        return fail(g, "no embedded vocabulary (tokenizer.ggml.model is missing)");
    if (!str_eq(model, mlen, "llama"))
        return fail(g, "tokenizer model \"%.*s\" is not supported (only \"llama\")",
                    (int)(mlen > 64 ? 64 : mlen), model);
    const struct kv *tk = get_array(g, "tokenizer.ggml.tokens", GT_STRING, UINT64_MAX, true);
    if (!tk)
        return false;
    if (tk->n < 1 || tk->n > (1 << 24))
        return fail(g, "vocabulary of %llu tokens", (unsigned long long)tk->n);
    int n = (int)tk->n;
    const struct kv *sk = get_array(g, "tokenizer.ggml.scores", GT_F32, tk->n, false);
    if (!sk && find_kv(g, "tokenizer.ggml.scores"))
        return false;
    const struct kv *yk = get_array(g, "tokenizer.ggml.token_type", GT_I32, tk->n, false);
    if (!yk && find_kv(g, "tokenizer.ggml.token_type"))
        return false;
    const char **pieces = sl_xmalloc((size_t)n * sizeof(*pieces));
    uint64_t *lens = sl_xmalloc((size_t)n * sizeof(*lens));
    float *scores = sk ? sl_xmalloc((size_t)n * sizeof(*scores)) : NULL;
    int32_t *types = yk ? sl_xmalloc((size_t)n * sizeof(*types)) : NULL;
    struct rd r = {g->r.p, g->r.len, tk->val};
    for (int i = 0; i < n; i++)
        rd_str(&r, &pieces[i], &lens[i]); /* validated by parse_header */
    if (sk)
        memcpy(scores, g->r.p + sk->val, (size_t)n * 4);
    if (yk)
        memcpy(types, g->r.p + yk->val, (size_t)n * 4);
    uint64_t bos = 1, eos = 2, unk = 0;
    bool ok = get_uint(g, "tokenizer.ggml.bos_token_id", (uint64_t)n - 1, &bos) >= 0 &&
              get_uint(g, "tokenizer.ggml.eos_token_id", (uint64_t)n - 1, &eos) >= 0 &&
              get_uint(g, "tokenizer.ggml.unknown_token_id", (uint64_t)n - 1, &unk) >= 0;
    if (ok && (bos >= (uint64_t)n || eos >= (uint64_t)n))
        ok = fail(g, "BOS %llu or EOS %llu is outside the vocabulary of %d",
                  (unsigned long long)bos, (unsigned long long)eos, n);
    if (ok) {
        char why[256];
        m->tok = sl_tok_from_spm(n, pieces, lens, scores, types, (int32_t)bos, why, sizeof(why));
        if (!m->tok)
            ok = fail(g, "bad vocabulary: %s", why);
    }
    free(pieces);
    free(lens);
    free(scores);
    free(types);
    if (!ok)
        return false;
    m->tok->unk_id = (int32_t)unk;
    /* Stops: EOS ends a story; BOS too, because a llama-vocabulary model that samples BOS has
     * started a new document (llama2.c's rule). An end-of-turn token, when the file names one,
     * ends a turn. */
    m->stop_tokens[m->n_stop_tokens++] = (int32_t)eos;
    if (bos != eos)
        m->stop_tokens[m->n_stop_tokens++] = (int32_t)bos;
    uint64_t eot;
    got = get_uint(g, "tokenizer.ggml.eot_token_id", (uint64_t)n - 1, &eot);
    if (got < 0)
        return false;
    if (got == 1 && eot != eos && eot != bos)
        m->stop_tokens[m->n_stop_tokens++] = (int32_t)eot;
    *vocab = n;
    return true;
}

/* tokenizer.chat_template: the Jinja source, kept for the gateway (which recognises it). */
static bool load_chat_template(struct gguf *g, struct sl_model *m)
{
    const char *s;
    uint64_t n;
    int got = get_str(g, "tokenizer.chat_template", &s, &n);
    if (got < 0)
        return false;
    if (got == 1 && n > 0)
        m->chat_template = sl_xstrndup(s, (size_t)n);
    return true;
}

static bool load_weights(struct gguf *g, struct sl_model *m)
{
    const struct sl_model_config *c = &m->cfg;
    int dim = c->dim, hid = c->hidden_dim, kv = dim / c->n_heads * c->n_kv_heads;
    struct sl_model_weights *w = &m->w;
    if (!mat(g, m, &w->token_embedding, "token_embd.weight", dim, c->vocab_size) ||
        !norm(g, m, &w->rms_final, "output_norm.weight", dim))
        return false;
    const struct tinfo *out = want(g, "output.weight", dim, c->vocab_size, true);
    if (!out && find_tensor(g, "output.weight"))
        return false;
    if (out) {
        w->wcls = sl_model_mat_place(m, to_dtype(out->type), tdata(g, out), c->vocab_size, dim);
    } else {
        w->wcls = w->token_embedding; /* tied */
        m->cfg.shared_classifier = true;
    }
    w->layers = sl_model_own(m, sl_xcalloc((size_t)c->n_layers, sizeof(*w->layers)));
    for (int l = 0; l < c->n_layers; l++) {
        struct sl_layer_weights *L = &w->layers[l];
        char n[9][64];
        static const char *const parts[9] = {"attn_norm", "ffn_norm", "attn_q",
                                             "attn_k",    "attn_v",   "attn_output",
                                             "ffn_gate",  "ffn_down", "ffn_up"};
        for (int i = 0; i < 9; i++)
            snprintf(n[i], sizeof(n[i]), "blk.%d.%s.weight", l, parts[i]);
        if (!norm(g, m, &L->rms_att, n[0], dim) || !norm(g, m, &L->rms_ffn, n[1], dim) ||
            !mat(g, m, &L->wq, n[2], dim, dim) || !mat(g, m, &L->wk, n[3], dim, kv) ||
            !mat(g, m, &L->wv, n[4], dim, kv) || !mat(g, m, &L->wo, n[5], dim, dim) ||
            !mat(g, m, &L->w1, n[6], dim, hid) || !mat(g, m, &L->w2, n[7], hid, dim) ||
            !mat(g, m, &L->w3, n[8], dim, hid))
            return false;
    }
    return true;
}

int sl_model_gguf_parse(struct sl_model *m, const void *data, size_t len, const char *name,
                        char *err, size_t errlen)
{
    struct gguf g = {.file = name, .r = {data, len, 0}, .err = err, .errlen = errlen};
    int vocab = 0;
    bool ok = parse_header(&g) && parse_tensors(&g) && load_vocab(&g, m, &vocab) &&
              load_chat_template(&g, m) && load_config(&g, &m->cfg, vocab) && load_weights(&g, m);
    free(g.kvs);
    free(g.ts);
    free(g.order);
    return ok ? SL_OK : SL_EFORMAT;
}

int sl_model_load_gguf(struct sl_model *m, const char *path, char *err, size_t errlen)
{
    int rc = sl_model_map_file(m, path, 24, err, errlen); /* 24: the GGUF header */
    if (rc != SL_OK)
        return rc;
    rc = sl_model_gguf_parse(m, m->map, m->map_len, path, err, errlen);
    if (rc != SL_OK)
        return rc;
    m->id = sl_model_id_from_path(path, ".gguf"); /* served as "stories260K" */
    return SL_OK;
}
