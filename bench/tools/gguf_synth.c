/* gguf-synth: writes a GGUF v3 model of the llama architecture with random weights, for measuring
 * sluice against llama.cpp on the same file (issue 32; bench/scenarios/peer.sh). The default shape
 * is TinyLlama-1.1B's; the tokenizer is copied at run time from a vocabulary GGUF (llama.cpp's
 * models/ggml-vocab-llama-spm.gguf: a real 32,000-token Llama vocabulary), never committed.
 *
 *   gguf-synth --vocab VOCAB.gguf --out MODEL.gguf [--type f16|f32] [--seed N] [--dim N]
 *              [--ffn N] [--layers N] [--heads N] [--kv-heads N] [--ctx N] [--eps X]
 *              [--rope-base X] [--name S]
 *
 * Tensors carry llama.cpp's names and shapes (token_embd, output_norm, output, blk.N.attn_norm,
 * attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down), 2-D ones in --type,
 * norms in F32 (llama.cpp's convention), so llama-quantize makes Q8_0 and Q4_K_M files from it.
 * Every metadata key of the vocabulary file that starts with "tokenizer." is copied byte for byte;
 * the vocabulary size is its tokenizer.ggml.tokens count.
 *
 * Weights are uniform in ±sqrt(3 / fan_in) (fan_in: a row's length), so a product of a unit-RMS
 * activation row has unit variance and the activations stay sane through the layers; norms are
 * 1. The classifier's rows of tokens that are not normal (tokenizer.ggml.token_type other than 1:
 * unknown, control, byte) are zero, so that greedy decoding, whose maximum logit is some 4 sigma
 * above 0 over 32,000 tokens, never picks them: a random model otherwise emits byte tokens that
 * make invalid UTF-8, which llama-server's output parser rejects mid-stream ("does not match the
 * expected Content-only format"), and an end of sequence only ignore_eos would hold back. q/k rows
 * have no RoPE layout to keep (random), so llama.cpp's permutation of HF weights does not matter.
 * Deterministic for a seed. The file is written under OUT.tmp and renamed at the end.
 */
#include "sluice/kernels.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN 32    /* GGUF's default general.alignment */
#define MAX_DEPTH 4 /* nested metadata arrays */
#define CHUNK 65536 /* values generated per write */
#define MAX_TENSORS 4096

enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 };
enum { GGML_F32 = 0, GGML_F16 = 1 };

static const size_t fixed_size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

struct buf {
    unsigned char *p;
    size_t len, cap;
};

struct rd {
    const unsigned char *p;
    size_t len, off;
    const char *file;
};

struct tensor {
    char name[64];
    uint64_t ne[2]; /* ne[0]: row length (fan_in), ne[1]: rows; ne[1] 1 for a vector */
    int ndims;
    uint32_t type;
    uint64_t off; /* from the start of the data section */
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("gguf-synth: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void put(struct buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p)
            die("out of memory");
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

/* GGUF is little-endian, as is every machine this runs on (x86-64, aarch64). */
static void put_u32(struct buf *b, uint32_t v)
{
    put(b, &v, 4);
}
static void put_u64(struct buf *b, uint64_t v)
{
    put(b, &v, 8);
}

static void put_str(struct buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

static void kv_u32(struct buf *b, const char *key, uint32_t v)
{
    put_str(b, key);
    put_u32(b, T_U32);
    put_u32(b, v);
}

static void kv_f32(struct buf *b, const char *key, float v)
{
    put_str(b, key);
    put_u32(b, T_F32);
    put(b, &v, 4);
}

static void kv_str(struct buf *b, const char *key, const char *v)
{
    put_str(b, key);
    put_u32(b, T_STR);
    put_str(b, v);
}

static void need(struct rd *r, size_t n)
{
    if (n > r->len - r->off)
        die("%s: truncated at byte %zu", r->file, r->off);
}

static uint32_t rd_u32(struct rd *r)
{
    uint32_t v;
    need(r, 4);
    memcpy(&v, r->p + r->off, 4);
    r->off += 4;
    return v;
}

static uint64_t rd_u64(struct rd *r)
{
    uint64_t v;
    need(r, 8);
    memcpy(&v, r->p + r->off, 8);
    r->off += 8;
    return v;
}

static void skip_value(struct rd *r, uint32_t type, int depth)
{
    if (type > T_F64)
        die("%s: metadata value of unknown type %u", r->file, type);
    if (type == T_STR) {
        uint64_t n = rd_u64(r);
        need(r, n);
        r->off += n;
    } else if (type == T_ARR) {
        if (depth >= MAX_DEPTH)
            die("%s: metadata arrays nested too deep", r->file);
        uint32_t at = rd_u32(r);
        uint64_t n = rd_u64(r);
        if (at <= T_F64 && fixed_size[at]) {
            if (n > (r->len - r->off) / fixed_size[at])
                die("%s: truncated array at byte %zu", r->file, r->off);
            r->off += n * fixed_size[at];
        } else {
            for (uint64_t i = 0; i < n; i++)
                skip_value(r, at, depth + 1);
        }
    } else {
        need(r, fixed_size[type]);
        r->off += fixed_size[type];
    }
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("%s: %s", path, strerror(errno));
    struct buf b = {0};
    unsigned char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        put(&b, tmp, n);
    if (ferror(f))
        die("%s: read error", path);
    fclose(f);
    *len = b.len;
    return b.p;
}

/* Appends the vocabulary file's tokenizer.* entries to kvs; returns how many, the token count in
 * *vocab and, in *types, a copy of tokenizer.ggml.token_type (NULL when absent; the caller frees
 * it). */
static uint64_t copy_tokenizer(const char *path, struct buf *kvs, uint64_t *vocab, int32_t **types)
{
    struct rd r = {.file = path};
    unsigned char *data = slurp(path, &r.len);
    r.p = data;
    need(&r, 4);
    if (memcmp(r.p, "GGUF", 4) != 0)
        die("%s: not a GGUF file", path);
    r.off = 4;
    uint32_t version = rd_u32(&r);
    if (version < 2 || version > 3)
        die("%s: GGUF version %u (2 or 3 expected)", path, version);
    rd_u64(&r); /* tensors: a vocabulary file has none we want */
    uint64_t n_kv = rd_u64(&r), copied = 0;
    uint64_t n_types = 0;
    *vocab = 0;
    *types = NULL;
    for (uint64_t i = 0; i < n_kv; i++) {
        size_t start = r.off;
        uint64_t klen = rd_u64(&r);
        need(&r, klen);
        const char *key = (const char *)r.p + r.off;
        r.off += klen;
        uint32_t type = rd_u32(&r);
        size_t vstart = r.off;
        skip_value(&r, type, 0);
        if (klen < 10 || memcmp(key, "tokenizer.", 10) != 0)
            continue;
        put(kvs, r.p + start, r.off - start);
        copied++;
        static const char tokens[] = "tokenizer.ggml.tokens";
        if (klen == sizeof tokens - 1 && memcmp(key, tokens, klen) == 0 && type == T_ARR) {
            struct rd a = r;
            a.off = vstart + 4;
            *vocab = rd_u64(&a);
        }
        static const char ttype[] = "tokenizer.ggml.token_type";
        if (klen == sizeof ttype - 1 && memcmp(key, ttype, klen) == 0 && type == T_ARR) {
            struct rd a = r;
            a.off = vstart;
            if (rd_u32(&a) != T_I32)
                die("%s: tokenizer.ggml.token_type is not an array of int32", path);
            n_types = rd_u64(&a); /* skip_value checked that the elements are there */
            *types = malloc(n_types * sizeof(int32_t) + 1);
            if (!*types)
                die("out of memory");
            memcpy(*types, a.p + a.off, n_types * sizeof(int32_t));
        }
    }
    free(data);
    if (*vocab == 0)
        die("%s: no tokenizer.ggml.tokens array", path);
    if (*types && n_types != *vocab)
        die("%s: %llu token types for %llu tokens", path, (unsigned long long)n_types,
            (unsigned long long)*vocab);
    return copied;
}

/* splitmix64: fast, and every seed gives a full-period stream. */
static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void add(struct tensor *t, int *n, const char *name, uint64_t cols, uint64_t rows,
                uint32_t type)
{
    if (*n >= MAX_TENSORS)
        die("too many tensors");
    struct tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->ne[0] = cols;
    x->ne[1] = rows ? rows : 1;
    x->ndims = rows ? 2 : 1;
    x->type = rows ? type : GGML_F32;
}

/* Writes t's values. row_type (NULL: none) gives each row's token type: rows of tokens that are
 * not normal (1) are written as zeros. */
static void write_tensor(FILE *f, const struct tensor *t, const int32_t *row_type, uint64_t *seed,
                         const char *out)
{
    static float vals[CHUNK];
    static unsigned char bytes[CHUNK * 4];
    uint64_t total = t->ne[0] * t->ne[1];
    float a = t->ndims == 1 ? 0.0f : sqrtf(3.0f / (float)t->ne[0]);
    for (uint64_t done = 0; done < total;) {
        size_t n = total - done < CHUNK ? (size_t)(total - done) : CHUNK;
        for (size_t i = 0; i < n; i++) {
            /* top 24 bits: a uniform in [0, 1) with every value exact in a float */
            float u = (float)(next(seed) >> 40) * (1.0f / 16777216.0f);
            vals[i] = t->ndims == 1 ? 1.0f : a * (2.0f * u - 1.0f);
            if (row_type && row_type[(done + i) / t->ne[0]] != 1)
                vals[i] = 0.0f;
        }
        size_t nb;
        if (t->type == GGML_F16) {
            for (size_t i = 0; i < n; i++) {
                uint16_t h = sl_cpu_f32_to_f16(vals[i]);
                memcpy(bytes + 2 * i, &h, 2);
            }
            nb = 2 * n;
        } else {
            memcpy(bytes, vals, 4 * n);
            nb = 4 * n;
        }
        if (fwrite(bytes, 1, nb, f) != nb)
            die("%s: write: %s", out, strerror(errno));
        done += n;
    }
}

static void usage(void)
{
    fputs("usage: gguf-synth --vocab VOCAB.gguf --out MODEL.gguf [--type f16|f32] [--seed N]\n"
          "                  [--dim N] [--ffn N] [--layers N] [--heads N] [--kv-heads N]\n"
          "                  [--ctx N] [--eps X] [--rope-base X] [--name S]\n"
          "defaults: TinyLlama-1.1B's shape (dim 2048, ffn 5632, 22 layers, 32 heads, 4 KV heads,\n"
          "context 2048, eps 1e-5, rope base 10000), f16, seed 1\n",
          stderr);
    exit(2);
}

static long arg_int(const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        die("%s: an integer from %ld to %ld expected", s, lo, hi);
    return v;
}

int main(int argc, char **argv)
{
    const char *vocab_path = NULL, *out = NULL, *name = "gguf-synth tinyllama-1.1b random";
    long dim = 2048, ffn = 5632, layers = 22, heads = 32, kv_heads = 4, ctx = 2048;
    double eps = 1e-5, rope_base = 10000.0;
    uint32_t type = GGML_F16;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        const char *k = argv[i], *v = argv[++i];
        if (strcmp(k, "--vocab") == 0)
            vocab_path = v;
        else if (strcmp(k, "--out") == 0)
            out = v;
        else if (strcmp(k, "--name") == 0)
            name = v;
        else if (strcmp(k, "--type") == 0 && strcmp(v, "f16") == 0)
            type = GGML_F16;
        else if (strcmp(k, "--type") == 0 && strcmp(v, "f32") == 0)
            type = GGML_F32;
        else if (strcmp(k, "--seed") == 0)
            seed = (uint64_t)arg_int(v, 0, INT64_MAX);
        else if (strcmp(k, "--dim") == 0)
            dim = arg_int(v, 1, 65536);
        else if (strcmp(k, "--ffn") == 0)
            ffn = arg_int(v, 1, 1 << 20);
        else if (strcmp(k, "--layers") == 0)
            layers = arg_int(v, 1, 1024);
        else if (strcmp(k, "--heads") == 0)
            heads = arg_int(v, 1, 65536);
        else if (strcmp(k, "--kv-heads") == 0)
            kv_heads = arg_int(v, 1, 65536);
        else if (strcmp(k, "--ctx") == 0)
            ctx = arg_int(v, 1, 1 << 20);
        else if (strcmp(k, "--eps") == 0)
            eps = atof(v);
        else if (strcmp(k, "--rope-base") == 0)
            rope_base = atof(v);
        else
            usage();
    }
    if (!vocab_path || !out)
        usage();
    if (dim % heads || heads % kv_heads || (dim / heads) % 2)
        die("dim %ld, heads %ld, kv heads %ld: heads must divide dim into even head sizes and "
            "kv heads divide heads",
            dim, heads, kv_heads);
    if (!(eps > 0 && eps < 1) || !(rope_base > 1))
        die("eps must be in (0, 1) and rope base above 1");

    struct buf kvs = {0};
    uint64_t vocab;
    int32_t *token_type;
    uint64_t n_kv = copy_tokenizer(vocab_path, &kvs, &vocab, &token_type);
    uint64_t n_special = 0;
    for (uint64_t i = 0; token_type && i < vocab; i++)
        n_special += token_type[i] != 1;
    kv_str(&kvs, "general.architecture", "llama");
    kv_str(&kvs, "general.name", name);
    kv_u32(&kvs, "general.file_type", type == GGML_F16 ? 1 : 0); /* MOSTLY_F16, ALL_F32 */
    kv_u32(&kvs, "llama.context_length", (uint32_t)ctx);
    kv_u32(&kvs, "llama.embedding_length", (uint32_t)dim);
    kv_u32(&kvs, "llama.feed_forward_length", (uint32_t)ffn);
    kv_u32(&kvs, "llama.block_count", (uint32_t)layers);
    kv_u32(&kvs, "llama.attention.head_count", (uint32_t)heads);
    kv_u32(&kvs, "llama.attention.head_count_kv", (uint32_t)kv_heads);
    kv_f32(&kvs, "llama.attention.layer_norm_rms_epsilon", (float)eps);
    kv_f32(&kvs, "llama.rope.freq_base", (float)rope_base);
    kv_u32(&kvs, "llama.rope.dimension_count", (uint32_t)(dim / heads));
    kv_u32(&kvs, "llama.vocab_size", (uint32_t)vocab);
    n_kv += 13;

    static struct tensor t[MAX_TENSORS];
    int nt = 0;
    uint64_t kv_dim = (uint64_t)(dim / heads * kv_heads);
    add(t, &nt, "token_embd.weight", dim, vocab, type);
    add(t, &nt, "output_norm.weight", dim, 0, type);
    add(t, &nt, "output.weight", dim, vocab, type);
    for (long l = 0; l < layers; l++) {
        static const char *const part[] = {"attn_norm", "attn_q",      "attn_k",
                                           "attn_v",    "attn_output", "ffn_norm",
                                           "ffn_gate",  "ffn_up",      "ffn_down"};
        const uint64_t cols[] = {dim, dim, dim, dim, dim, dim, dim, dim, ffn};
        const uint64_t rows[] = {0, dim, kv_dim, kv_dim, dim, 0, ffn, ffn, dim};
        for (int i = 0; i < 9; i++) {
            char n[64];
            snprintf(n, sizeof n, "blk.%ld.%s.weight", l, part[i]);
            add(t, &nt, n, cols[i], rows[i], type);
        }
    }

    struct buf head = {0};
    put(&head, "GGUF", 4);
    put_u32(&head, 3);
    put_u64(&head, (uint64_t)nt);
    put_u64(&head, n_kv);
    put(&head, kvs.p, kvs.len);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        t[i].off = off;
        put_str(&head, t[i].name);
        put_u32(&head, (uint32_t)t[i].ndims);
        for (int d = 0; d < t[i].ndims; d++)
            put_u64(&head, t[i].ne[d]);
        put_u32(&head, t[i].type);
        put_u64(&head, t[i].off);
        uint64_t bytes = t[i].ne[0] * t[i].ne[1] * (t[i].type == GGML_F16 ? 2 : 4);
        off = (off + bytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    static const unsigned char zeros[ALIGN];
    put(&head, zeros, (ALIGN - head.len % ALIGN) % ALIGN);

    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", out) >= sizeof tmp)
        die("%s: path too long", out);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        die("%s: %s", tmp, strerror(errno));
    if (fwrite(head.p, 1, head.len, f) != head.len)
        die("%s: write: %s", tmp, strerror(errno));
    uint64_t written = 0;
    for (int i = 0; i < nt; i++) {
        if (written < t[i].off) {
            size_t pad = (size_t)(t[i].off - written);
            if (fwrite(zeros, 1, pad, f) != pad)
                die("%s: write: %s", tmp, strerror(errno));
            written = t[i].off;
        }
        bool cls = strcmp(t[i].name, "output.weight") == 0;
        write_tensor(f, &t[i], cls ? token_type : NULL, &seed, tmp);
        written += t[i].ne[0] * t[i].ne[1] * (t[i].type == GGML_F16 ? 2 : 4);
    }
    if (fclose(f) != 0)
        die("%s: %s", tmp, strerror(errno));
    if (rename(tmp, out) != 0)
        die("rename %s to %s: %s", tmp, out, strerror(errno));
    printf("%s: %d tensors, %llu metadata keys (%llu from %s), vocabulary %llu (classifier rows "
           "of %llu special tokens zero), %.2f GB\n",
           out, nt, (unsigned long long)n_kv, (unsigned long long)(n_kv - 13), vocab_path,
           (unsigned long long)vocab, (unsigned long long)n_special,
           (double)(head.len + written) / 1e9);
    free(token_type);
    free(head.p);
    free(kvs.p);
    return 0;
}
