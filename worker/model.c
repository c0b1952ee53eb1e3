/* Model loading: llama2.c legacy checkpoints (mmap'd) and synthetic weights. */
#include "worker_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_BYTES 28 /* 7 little-endian int32 */
/* A llama2.c tokenizer.bin of a 256k vocabulary is a few MiB; this only bounds nonsense. */
#define MAX_TOKENIZER_BYTES ((size_t)256 << 20)

uint64_t sl_model_body_floats(const struct sl_model_config *c)
{
    /* Bounds keep every product below 2^62 and reject nonsense headers early. */
    if (c->dim < 1 || c->dim > 65536 || c->hidden_dim < 1 || c->hidden_dim > 1 << 20 ||
        c->n_layers < 1 || c->n_layers > 1024 || c->n_heads < 1 || c->n_heads > c->dim ||
        c->n_kv_heads < 1 || c->n_kv_heads > c->n_heads || c->vocab_size < 1 ||
        c->vocab_size > 1 << 24 || c->seq_len < 1 || c->seq_len > 1 << 20)
        return 0;
    if (c->dim % c->n_heads || c->n_heads % c->n_kv_heads || (c->dim / c->n_heads) % 2)
        return 0;
    uint64_t dim = (uint64_t)c->dim, hid = (uint64_t)c->hidden_dim, L = (uint64_t)c->n_layers;
    uint64_t hs = dim / (uint64_t)c->n_heads, kv = hs * (uint64_t)c->n_kv_heads;
    uint64_t V = (uint64_t)c->vocab_size;
    uint64_t n = V * dim;                  /* token_embedding */
    n += L * dim;                          /* rms_att */
    n += L * dim * dim + 2 * L * kv * dim; /* wq, wk, wv */
    n += L * dim * dim;                    /* wo */
    n += L * dim;                          /* rms_ffn */
    n += 3 * L * hid * dim;                /* w1, w2, w3 */
    n += dim;                              /* rms_final */
    n += (uint64_t)c->seq_len * hs;        /* freq_cis_real + imag: seq_len*hs/2 each */
    if (!c->shared_classifier)
        n += V * dim; /* wcls */
    return n;
}

void sl_model_llama2c_map(struct sl_llama2c_weights *w, const struct sl_model_config *c,
                          const float *p)
{
    size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t hs = dim / (size_t)c->n_heads, kv = hs * (size_t)c->n_kv_heads;
    w->token_embedding = p;
    p += (size_t)c->vocab_size * dim;
    w->rms_att = p;
    p += L * dim;
    w->wq = p;
    p += L * dim * dim;
    w->wk = p;
    p += L * kv * dim;
    w->wv = p;
    p += L * kv * dim;
    w->wo = p;
    p += L * dim * dim;
    w->rms_ffn = p;
    p += L * dim;
    w->w1 = p;
    p += L * hid * dim;
    w->w2 = p;
    p += L * dim * hid;
    w->w3 = p;
    p += L * hid * dim;
    w->rms_final = p;
    p += dim;
    p += (size_t)c->seq_len * hs; /* freq_cis: RoPE is computed, not read */
    w->wcls = c->shared_classifier ? w->token_embedding : p;
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void *sl_model_own(struct sl_model *m, void *buf)
{
    if (m->n_allocs == m->cap_allocs) {
        m->cap_allocs = m->cap_allocs ? 2 * m->cap_allocs : 8;
        m->allocs = sl_xrealloc(m->allocs, sizeof(*m->allocs) * (size_t)m->cap_allocs);
    }
    m->allocs[m->n_allocs++] = buf;
    return buf;
}

static struct sl_mat f32_mat(const float *data, int rows, int cols)
{
    return (struct sl_mat){SL_DTYPE_F32, data, rows, cols};
}

/* The forward pass's view of a llama2.c-layout fp32 body. */
static void use_llama2c_body(struct sl_model *m, const float *body)
{
    const struct sl_model_config *c = &m->cfg;
    struct sl_llama2c_weights lw;
    sl_model_llama2c_map(&lw, c, body);
    int dim = c->dim, hid = c->hidden_dim, kv = dim / c->n_heads * c->n_kv_heads;
    size_t ld = (size_t)dim * dim, lkv = (size_t)kv * dim, lh = (size_t)hid * dim;
    struct sl_model_weights *w = &m->w;
    w->token_embedding = f32_mat(lw.token_embedding, c->vocab_size, dim);
    w->wcls = f32_mat(lw.wcls, c->vocab_size, dim);
    w->rms_final = lw.rms_final;
    w->layers = sl_model_own(m, sl_xcalloc((size_t)c->n_layers, sizeof(*w->layers)));
    for (int l = 0; l < c->n_layers; l++) {
        struct sl_layer_weights *L = &w->layers[l];
        L->rms_att = lw.rms_att + (size_t)l * dim;
        L->rms_ffn = lw.rms_ffn + (size_t)l * dim;
        L->wq = f32_mat(lw.wq + l * ld, dim, dim);
        L->wk = f32_mat(lw.wk + l * lkv, kv, dim);
        L->wv = f32_mat(lw.wv + l * lkv, kv, dim);
        L->wo = f32_mat(lw.wo + l * ld, dim, dim);
        L->w1 = f32_mat(lw.w1 + l * lh, hid, dim);
        L->w2 = f32_mat(lw.w2 + l * lh, dim, hid);
        L->w3 = f32_mat(lw.w3 + l * lh, hid, dim);
    }
}

/* llama2.c's run.c stops on BOS; EOS ends a story too. */
static void set_llama_stops(struct sl_model *m)
{
    m->stop_tokens[0] = 1;
    m->stop_tokens[1] = 2;
    m->n_stop_tokens = 2;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Opens a regular file for reading and reports its size. */
static int open_regular(const char *path, int *fd_out, size_t *size, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(e));
        return e == ENOENT ? SL_ENOENT : SL_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        set_err(err, errlen, "%s: not a regular file", path);
        close(fd);
        return SL_EIO;
    }
    *fd_out = fd;
    *size = (size_t)st.st_size;
    return SL_OK;
}

int sl_model_read_file(const char *path, size_t max_len, char **data, size_t *len, char *err,
                       size_t errlen)
{
    int fd;
    size_t n;
    int rc = open_regular(path, &fd, &n, err, errlen);
    if (rc != SL_OK)
        return rc;
    if (n > max_len) {
        set_err(err, errlen, "%s: larger than %zu bytes", path, max_len);
        close(fd);
        return SL_EFORMAT;
    }
    char *buf = sl_xmalloc(n + 1);
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            set_err(err, errlen, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "EOF");
            free(buf);
            close(fd);
            return SL_EIO;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return SL_OK;
}

int sl_model_map_file(struct sl_model *m, const char *path, size_t min_len, char *err,
                      size_t errlen)
{
    int fd;
    size_t len;
    int rc = open_regular(path, &fd, &len, err, errlen);
    if (rc != SL_OK)
        return rc;
    if (len < min_len) {
        set_err(err, errlen, "%s: truncated: %zu bytes, shorter than the %zu-byte header", path,
                len, min_len);
        close(fd);
        return SL_EFORMAT;
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        set_err(err, errlen, "%s: mmap failed: %s", path, strerror(errno));
        return SL_EIO;
    }
    m->map = map;
    m->map_len = len;
    return SL_OK;
}

char *sl_model_id_from_path(const char *path, const char *suffix)
{
    const char *b = base_name(path);
    size_t n = strlen(b), k = strlen(suffix);
    if (n > k && strcmp(b + n - k, suffix) == 0)
        n -= k;
    return sl_xstrndup(b, n);
}

static int load_tokenizer(struct sl_model *m, const char *path, char *err, size_t errlen)
{
    char *data;
    size_t len;
    int rc = sl_model_read_file(path, MAX_TOKENIZER_BYTES, &data, &len, err, errlen);
    if (rc != SL_OK)
        return rc;
    char why[256];
    m->tok = sl_tok_parse((const unsigned char *)data, len, m->cfg.vocab_size, why, sizeof(why));
    free(data);
    if (!m->tok) {
        set_err(err, errlen, "%s: bad tokenizer: %s", path, why);
        return SL_EFORMAT;
    }
    return SL_OK;
}

static int load_checkpoint(struct sl_model *m, const char *path, char *err, size_t errlen)
{
    /* sl_model_free unmaps the file, on failure too. */
    int rc = sl_model_map_file(m, path, HEADER_BYTES, err, errlen);
    if (rc != SL_OK)
        return rc;
    const void *map = m->map;
    size_t flen = m->map_len;
    int32_t h[7];
    memcpy(h, map, sizeof(h)); /* little-endian hosts only, like llama2.c */
    struct sl_model_config *c = &m->cfg;
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    /* A negative vocab_size is llama2.c's flag for a separate classifier matrix. */
    c->shared_classifier = h[5] > 0;
    c->vocab_size = h[5] == INT32_MIN ? 0 : abs(h[5]);
    c->seq_len = h[6];
    c->rms_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    uint64_t floats = sl_model_body_floats(c);
    if (floats == 0) {
        set_err(err, errlen,
                "%s: inconsistent header: dim %d hidden_dim %d n_layers %d n_heads %d "
                "n_kv_heads %d vocab_size %d seq_len %d",
                path, h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
        return SL_EFORMAT;
    }
    uint64_t want = HEADER_BYTES + floats * sizeof(float);
    if ((uint64_t)flen != want) {
        set_err(err, errlen, "%s: %s: header implies %llu bytes, file has %zu", path,
                (uint64_t)flen < want ? "truncated" : "trailing data", (unsigned long long)want,
                flen);
        return SL_EFORMAT;
    }
    use_llama2c_body(m, (const float *)((const char *)map + HEADER_BYTES));
    set_llama_stops(m);
    return SL_OK;
}

/* Synthetic weights are one splitmix64 stream over every uniform value of the model in llama2.c
 * order, so they are the same everywhere. Value i of the stream is a pure function of i, which
 * lets threads fill disjoint ranges and a typed variant quantize exactly the fp32 model's values.
 */
#define SYNTH_SEED 0x511ce5eedull

static float synth_uniform(uint64_t i)
{
    uint64_t z = SYNTH_SEED + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    return 2.0f * u - 1.0f;
}

/* One tensor of `rows` rows of `cols` uniform values in [-a, a), stream values first.. onwards,
 * stored as type t at dst. */
struct synth_fill {
    void *dst;
    enum sl_dtype t;
    int64_t rows;
    int cols;
    float a;
    uint64_t first;
};

static void synth_fill_task(void *arg, int ith, int nth)
{
    const struct synth_fill *f = arg;
    int64_t r0 = f->rows * ith / nth, r1 = f->rows * (ith + 1) / nth;
    size_t rb = sl_dtype_row_bytes(f->t, f->cols);
    float *tmp = f->t == SL_DTYPE_F32 ? NULL : sl_xmalloc((size_t)f->cols * sizeof(float));
    for (int64_t r = r0; r < r1; r++) {
        float *row = f->t == SL_DTYPE_F32 ? (float *)((char *)f->dst + (size_t)r * rb) : tmp;
        uint64_t base = f->first + (uint64_t)r * (uint64_t)f->cols;
        for (int j = 0; j < f->cols; j++)
            row[j] = synth_uniform(base + (uint64_t)j) * f->a;
        if (tmp)
            sl_cpu_quantize_row(f->t, (char *)f->dst + (size_t)r * rb, tmp, f->cols);
    }
    free(tmp);
}

struct synth {
    struct sl_model *m;
    struct sl_cpu_pool *pool;
    enum sl_dtype t;
    uint64_t next; /* stream index of the next tensor */
};

/* Fills (layers · rows, cols) values of a ±a tensor, in type s->t (or fp32 into dst when dst is
 * given), advancing the stream. Returns the tensor's storage. */
static void *synth_tensor(struct synth *s, float *dst, int layers, int rows, int cols, float a)
{
    struct synth_fill f = {dst,    dst ? SL_DTYPE_F32 : s->t, (int64_t)layers * rows, cols, a,
                           s->next};
    if (!f.dst)
        f.dst =
            sl_model_own(s->m, sl_xmalloc_aligned((size_t)f.rows * sl_dtype_row_bytes(f.t, cols)));
    sl_cpu_pool_run(s->pool, synth_fill_task, &f);
    s->next += (uint64_t)f.rows * (uint64_t)cols;
    return f.dst;
}

static void fill_const(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

static const struct {
    const char *name;
    struct sl_model_config cfg;
} synth_shapes[] = {
    {"tiny", {64, 172, 5, 8, 4, 512, 512, 1e-5f, 10000.0f, true}},
    {"stories15M", {288, 768, 6, 6, 6, 32000, 256, 1e-5f, 10000.0f, true}},
    /* stories15M's width with a 4,096-token context, for prompts longer than 256 tokens
     * (bench/scenarios/prefix.sh's 1,050-token chats). */
    {"stories15M-4k", {288, 768, 6, 6, 6, 32000, 4096, 1e-5f, 10000.0f, true}},
    /* Small, with widths of whole 256-value super-blocks: the K-quants' tests. */
    {"tiny256", {256, 512, 2, 4, 2, 512, 256, 1e-5f, 10000.0f, true}},
    /* TinyLlama-1.1B's shape (tied here, like every synthetic model: the classifier's work per
     * step is the same), for the comparison with llama.cpp (bench/scenarios/peer.sh). */
    {"tinyllama", {2048, 5632, 22, 32, 4, 32000, 2048, 1e-5f, 10000.0f, true}},
    /* Llama-3.2-1B-like width and depth with a llama2-sized vocabulary, for scale tests. */
    {"llama-1b", {2048, 8192, 16, 32, 8, 32000, 2048, 1e-5f, 10000.0f, true}},
    /* Llama-3-8B's shape (its vocabulary and RoPE base; tied here, which changes no step's
     * work), for GPU benchmarks: 8 G values, 16 GB as bf16. */
    {"llama-8b", {4096, 14336, 32, 32, 8, 128256, 8192, 1e-5f, 500000.0f, true}},
};

const char *sl_model_synthetic_shape(int i)
{
    return i >= 0 && (size_t)i < sizeof synth_shapes / sizeof synth_shapes[0] ? synth_shapes[i].name
                                                                              : NULL;
}

/* name is "SHAPE" or "SHAPE:TYPE" with TYPE one of f32 (default), f16, bf16, q8_0, q4_0, q4_k,
 * q5_k, q6_k: projections, embedding and classifier are stored in TYPE (the fp32 model's values,
 * rounded by sl_cpu_quantize_row); norms stay fp32. */
static int synthetic_shape(const char *name, struct sl_model_config *c, enum sl_dtype *type,
                           char *err, size_t errlen)
{
    const char *colon = strchr(name, ':');
    size_t shape_len = colon ? (size_t)(colon - name) : strlen(name);
    enum sl_dtype t = SL_DTYPE_F32;
    if (colon) {
        static const enum sl_dtype types[] = {SL_DTYPE_F32,  SL_DTYPE_F16,  SL_DTYPE_BF16,
                                              SL_DTYPE_Q8_0, SL_DTYPE_Q4_0, SL_DTYPE_Q4_K,
                                              SL_DTYPE_Q5_K, SL_DTYPE_Q6_K};
        bool found = false;
        for (size_t i = 0; i < sizeof types / sizeof types[0] && !found; i++)
            if (strcmp(colon + 1, sl_dtype_name(types[i])) == 0) {
                t = types[i];
                found = true;
            }
        if (!found) {
            set_err(err, errlen,
                    "synthetic:%s: unknown weight type (known: f32, f16, bf16, q8_0, q4_0, q4_k, "
                    "q5_k, q6_k)",
                    name);
            return SL_EINVAL;
        }
    }
    bool known = false;
    for (size_t i = 0; i < sizeof synth_shapes / sizeof synth_shapes[0] && !known; i++)
        if (strlen(synth_shapes[i].name) == shape_len &&
            strncmp(name, synth_shapes[i].name, shape_len) == 0) {
            *c = synth_shapes[i].cfg;
            known = true;
        }
    if (!known) {
        char names[128];
        size_t n = 0;
        names[0] = '\0';
        for (int i = 0; sl_model_synthetic_shape(i) && n < sizeof names; i++)
            n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", i ? ", " : "",
                                  sl_model_synthetic_shape(i));
        set_err(err, errlen, "synthetic:%s: unknown synthetic model (known: %s)", name, names);
        return SL_EINVAL;
    }
    int blk = sl_dtype_block(t);
    if (c->dim % blk || c->hidden_dim % blk) {
        set_err(err, errlen, "synthetic:%s: %s needs dim and hidden_dim multiples of %d", name,
                sl_dtype_name(t), blk);
        return SL_EINVAL;
    }
    *type = t;
    return SL_OK;
}

static int load_synthetic(struct sl_model *m, const char *name, char *err, size_t errlen)
{
    struct sl_model_config *c = &m->cfg;
    enum sl_dtype t;
    int st = synthetic_shape(name, c, &t, err, errlen);
    if (st != SL_OK)
        return st;
    int dim = c->dim, hid = c->hidden_dim, L = c->n_layers;
    int kv = dim / c->n_heads * c->n_kv_heads;
    /* Uniform ±sqrt(3/fan_in) has variance 1/fan_in: every projection keeps the scale of its
     * input, so activations stay O(1) through the layers and logits stay soft. */
    float a_dim = sqrtf(3.0f / (float)dim), a_hid = sqrtf(3.0f / (float)hid);
    struct synth s = {m, sl_cpu_pool_new(0, true), t, 0};
    if (!s.pool) {
        set_err(err, errlen, "synthetic:%s: cannot start threads", name);
        return SL_EBACKEND;
    }
    if (t == SL_DTYPE_F32) {
        /* One llama2.c-layout body, exactly what a checkpoint of this shape would map, but at a
         * cache-line boundary: a mapped checkpoint's weights start 28 bytes into the file, and
         * rows that straddle cache lines cost the batched matmul a tenth of its speed. */
        uint64_t floats = sl_model_body_floats(c);
        float *body = sl_model_own(m, sl_xmalloc_aligned((size_t)floats * sizeof(float)));
        struct sl_llama2c_weights lw;
        sl_model_llama2c_map(&lw, c, body);
        synth_tensor(&s, (float *)lw.token_embedding, 1, c->vocab_size, dim, 1.0f);
        fill_const((float *)lw.rms_att, (size_t)L * dim, 1.0f);
        synth_tensor(&s, (float *)lw.wq, L, dim, dim, a_dim);
        synth_tensor(&s, (float *)lw.wk, L, kv, dim, a_dim);
        synth_tensor(&s, (float *)lw.wv, L, kv, dim, a_dim);
        synth_tensor(&s, (float *)lw.wo, L, dim, dim, a_dim);
        fill_const((float *)lw.rms_ffn, (size_t)L * dim, 1.0f);
        synth_tensor(&s, (float *)lw.w1, L, hid, dim, a_dim);
        synth_tensor(&s, (float *)lw.w2, L, dim, hid, a_hid);
        synth_tensor(&s, (float *)lw.w3, L, hid, dim, a_dim);
        fill_const((float *)lw.rms_final, (size_t)dim, 1.0f);
        /* The freq_cis region is never read; zero it so the buffer is fully defined. */
        float *freq = (float *)lw.rms_final + dim;
        fill_const(freq, (size_t)c->seq_len * (size_t)(dim / c->n_heads), 0.0f);
        use_llama2c_body(m, body);
    } else {
        /* Same stream order as the fp32 body, so this is that model rounded to type t. */
        struct sl_model_weights *w = &m->w;
        const unsigned char *emb = synth_tensor(&s, NULL, 1, c->vocab_size, dim, 1.0f);
        const unsigned char *wq = synth_tensor(&s, NULL, L, dim, dim, a_dim);
        const unsigned char *wk = synth_tensor(&s, NULL, L, kv, dim, a_dim);
        const unsigned char *wv = synth_tensor(&s, NULL, L, kv, dim, a_dim);
        const unsigned char *wo = synth_tensor(&s, NULL, L, dim, dim, a_dim);
        const unsigned char *w1 = synth_tensor(&s, NULL, L, hid, dim, a_dim);
        const unsigned char *w2 = synth_tensor(&s, NULL, L, dim, hid, a_hid);
        const unsigned char *w3 = synth_tensor(&s, NULL, L, hid, dim, a_dim);
        /* (2 · layer + 1, dim) ones: rms_att and rms_ffn of every layer, then rms_final. */
        float *ones = sl_model_own(m, sl_xmalloc((size_t)(2 * L + 1) * dim * sizeof(float)));
        fill_const(ones, (size_t)(2 * L + 1) * dim, 1.0f);
        size_t rd = sl_dtype_row_bytes(t, dim), rh = sl_dtype_row_bytes(t, hid);
        w->token_embedding = (struct sl_mat){t, emb, c->vocab_size, dim};
        w->wcls = w->token_embedding;
        w->rms_final = ones + (size_t)2 * L * dim;
        w->layers = sl_model_own(m, sl_xcalloc((size_t)L, sizeof(*w->layers)));
        for (int l = 0; l < L; l++) {
            struct sl_layer_weights *y = &w->layers[l];
            y->rms_att = ones + (size_t)l * dim;
            y->rms_ffn = ones + (size_t)(L + l) * dim;
            y->wq = (struct sl_mat){t, wq + (size_t)l * dim * rd, dim, dim};
            y->wk = (struct sl_mat){t, wk + (size_t)l * kv * rd, kv, dim};
            y->wv = (struct sl_mat){t, wv + (size_t)l * kv * rd, kv, dim};
            y->wo = (struct sl_mat){t, wo + (size_t)l * dim * rd, dim, dim};
            y->w1 = (struct sl_mat){t, w1 + (size_t)l * hid * rd, hid, dim};
            y->w2 = (struct sl_mat){t, w2 + (size_t)l * dim * rh, dim, hid};
            y->w3 = (struct sl_mat){t, w3 + (size_t)l * hid * rd, hid, dim};
        }
    }
    sl_cpu_pool_free(s.pool);
    set_llama_stops(m);
    m->tok = sl_tok_synthetic(c->vocab_size);
    size_t idlen = strlen(name) + 11;
    m->id = sl_xmalloc(idlen);
    snprintf(m->id, idlen, "synthetic:%s", name);
    return SL_OK;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

int sl_model_load(const char *spec, const char *tokenizer_path, struct sl_model **out, char *err,
                  size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!spec || !*spec) {
        set_err(err, errlen, "empty model spec");
        return SL_EINVAL;
    }
    struct sl_model *m = sl_xcalloc(1, sizeof(*m));
    int rc;
    if (strcmp(spec, "synthetic") == 0) {
        rc = load_synthetic(m, "tiny", err, errlen);
    } else if (strncmp(spec, "synthetic:", 10) == 0) {
        rc = load_synthetic(m, spec + 10, err, errlen);
    } else if (is_dir(spec)) {
        rc = sl_model_load_hf(m, spec, err, errlen);
    } else if (has_suffix(spec, ".gguf")) {
        rc = sl_model_load_gguf(m, spec, err, errlen);
    } else if (!tokenizer_path || !*tokenizer_path) {
        set_err(err, errlen, "%s: a llama2.c checkpoint needs a tokenizer path", spec);
        rc = SL_EINVAL;
    } else {
        rc = load_checkpoint(m, spec, err, errlen);
        if (rc == SL_OK)
            rc = load_tokenizer(m, tokenizer_path, err, errlen);
        if (rc == SL_OK)
            m->id = sl_model_id_from_path(spec, ".bin"); /* served as "stories260K" */
    }
    if (rc != SL_OK) {
        sl_model_free(m);
        return rc;
    }
    *out = m;
    return SL_OK;
}

int sl_model_check(const char *spec, const char *tokenizer_path, char *err, size_t errlen)
{
    if (spec && strncmp(spec, "synthetic:", 10) == 0) {
        struct sl_model_config c;
        enum sl_dtype t;
        return synthetic_shape(spec + 10, &c, &t, err, errlen);
    }
    /* Files are mapped, not read: loading parses headers, tensor tables and the tokenizer. */
    struct sl_model *m = NULL;
    int st = sl_model_load(spec, tokenizer_path, &m, err, errlen);
    sl_model_free(m);
    return st;
}

void sl_model_free(struct sl_model *m)
{
    if (!m)
        return;
    if (m->map)
        munmap(m->map, m->map_len);
    for (int i = 0; i < m->n_allocs; i++)
        free(m->allocs[i]);
    free(m->allocs);
    sl_tok_free(m->tok);
    free(m->id);
    free(m->chat_template);
    free(m);
}

const struct sl_model_config *sl_model_config(const struct sl_model *m)
{
    return &m->cfg;
}

const char *sl_model_id(const struct sl_model *m)
{
    return m->id;
}

const struct sl_tok *sl_model_tok(const struct sl_model *m)
{
    return m->tok;
}

const char *sl_model_chat_template(const struct sl_model *m)
{
    return m->chat_template;
}

bool sl_model_is_stop_token(const struct sl_model *m, int32_t token)
{
    for (int i = 0; i < m->n_stop_tokens; i++)
        if (m->stop_tokens[i] == token)
            return true;
    return false;
}

const char *sl_kv_dtype_name(enum sl_kv_dtype t)
{
    return t == SL_KV_F16 ? "f16" : "f32";
}

size_t sl_model_kv_block_bytes(const struct sl_model *m, int block_size, enum sl_kv_dtype kv)
{
    const struct sl_model_config *c = &m->cfg;
    size_t kvd = (size_t)(c->dim / c->n_heads) * (size_t)c->n_kv_heads;
    size_t es = kv == SL_KV_F16 ? sizeof(uint16_t) : sizeof(float);
    return 2 * (size_t)c->n_layers * (size_t)block_size * kvd * es;
}

static bool mat_ok(const struct sl_mat *w, int rows, int cols)
{
    return w->data && w->rows == rows && w->cols == cols && sl_dtype_row_bytes(w->type, cols) != 0;
}

bool sl_model_weights_ok(const struct sl_model *m)
{
    const struct sl_model_config *c = &m->cfg;
    const struct sl_model_weights *w = &m->w;
    int dim = c->dim, hid = c->hidden_dim, kv_dim = dim / c->n_heads * c->n_kv_heads;
    if (!mat_ok(&w->token_embedding, c->vocab_size, dim) || !mat_ok(&w->wcls, c->vocab_size, dim))
        return false;
    for (int l = 0; l < c->n_layers; l++) {
        const struct sl_layer_weights *L = &w->layers[l];
        if (!mat_ok(&L->wq, dim, dim) || !mat_ok(&L->wk, kv_dim, dim) ||
            !mat_ok(&L->wv, kv_dim, dim) || !mat_ok(&L->wo, dim, dim) ||
            !mat_ok(&L->w1, hid, dim) || !mat_ok(&L->w2, dim, hid) || !mat_ok(&L->w3, hid, dim))
            return false;
    }
    return true;
}
