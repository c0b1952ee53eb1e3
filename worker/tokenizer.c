/* Tokenizer: llama2.c tokenizer.bin semantics (SentencePiece-style BPE by score, byte fallback
 * +3), the synthetic vocabulary of the synthetic models, GGUF "llama" vocabularies (the same
 * semantics) and Hugging Face BPE (merges by rank; tokenizer.json is parsed in tok_hf.c). */
#include "worker_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BOS_ID 1 /* llama2.c hard-codes it */

/* FNV-1a over s, continuing from h: a piece's hash is the same whether it is hashed whole or as
 * the two pieces a merge would join. */
static uint32_t hash_more(uint32_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

#define HASH_SEED 2166136261u

/* Lowest id whose piece is a ‖ b, or -1. */
static int32_t lookup2(const struct sl_tok *t, const char *a, size_t alen, const char *b,
                       size_t blen)
{
    uint32_t slot = hash_more(hash_more(HASH_SEED, a, alen), b, blen) & t->index_mask;
    for (uint32_t v; (v = t->index[slot]) != 0; slot = (slot + 1) & t->index_mask) {
        int32_t id = (int32_t)(v - 1);
        const char *p = t->pieces[id];
        if (t->piece_len[id] == alen + blen && memcmp(p, a, alen) == 0 &&
            memcmp(p + alen, b, blen) == 0)
            return id;
    }
    return -1;
}

int32_t sl_tok_lookup(const struct sl_tok *t, const char *s, size_t len)
{
    return lookup2(t, s, len, "", 0);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

void sl_tok_index(struct sl_tok *t)
{
    int n = t->vocab_size;
    uint32_t slots = 16;
    while (slots < 2u * (uint32_t)n)
        slots *= 2;
    t->index = sl_xcalloc(slots, sizeof *t->index);
    t->index_mask = slots - 1;
    t->byte_piece = sl_xmalloc((size_t)n * sizeof(*t->byte_piece));
    t->max_token_length = 0;
    for (int i = 0; i < n; i++) {
        const char *p = t->pieces[i];
        uint32_t len = t->piece_len[i];
        if (lookup2(t, p, len, "", 0) < 0) { /* ids in order: the lowest one stays */
            uint32_t slot = hash_more(HASH_SEED, p, len) & t->index_mask;
            while (t->index[slot])
                slot = (slot + 1) & t->index_mask;
            t->index[slot] = (uint32_t)i + 1;
        }
        if ((int)len > t->max_token_length)
            t->max_token_length = (int)len;
        t->byte_piece[i] = -1;
        if (len == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && hexval(p[3]) >= 0 &&
            hexval(p[4]) >= 0)
            t->byte_piece[i] = (int16_t)(hexval(p[3]) * 16 + hexval(p[4]));
    }
    for (int b = 0; b < 256; b++) {
        t->bytes[b] = (unsigned char)b;
        t->byte_id[b] = -1;
    }
    for (int i = n - 1; i >= 0; i--)
        if (t->byte_piece[i] >= 0)
            t->byte_id[t->byte_piece[i]] = i; /* the lowest id wins, like the piece lookup */
    t->space_id = sl_tok_lookup(t, " ", 1);
}

void sl_tok_free(struct sl_tok *t)
{
    if (!t)
        return;
    free(t->blob);
    free(t->pieces);
    free(t->piece_len);
    free(t->scores);
    free(t->index);
    free(t->byte_piece);
    free(t->special);
    free(t->merges);
    free(t->added);
    free(t);
}

struct sl_tok *sl_tok_alloc(int vocab)
{
    struct sl_tok *t = sl_xcalloc(1, sizeof(*t));
    t->kind = SL_TOK_KIND_LLAMA2C;
    t->vocab_size = vocab;
    t->bos_id = BOS_ID;
    t->unk_id = 0;
    t->pieces = sl_xcalloc((size_t)vocab, sizeof(*t->pieces));
    t->piece_len = sl_xcalloc((size_t)vocab, sizeof(*t->piece_len));
    t->scores = sl_xcalloc((size_t)vocab, sizeof(*t->scores));
    return t;
}

static int32_t rd_i32(const unsigned char *p)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t r;
    memcpy(&r, &v, 4);
    return r;
}

static float rd_f32(const unsigned char *p)
{
    int32_t i = rd_i32(p);
    float f;
    memcpy(&f, &i, 4);
    return f;
}

/* A SentencePiece vocabulary without token types (llama2.c's tokenizer.bin, the synthetic one, a
 * GGUF without token_type) still has llama's control tokens at ids 1 and 2: <s> and </s> (llama2.c
 * writes them "\n<s>\n" and "\n</s>\n"). Marked special, they decode to nothing, as GGUF's
 * type-3 tokens do: generated text never shows them (ignore_eos, an echoed prompt). <unk> (id 0)
 * stays text, as GGUF's type-2 token does. */
static void mark_llama_controls(struct sl_tok *t)
{
    static const char *const names[] = {"<s>", "</s>", "\n<s>\n", "\n</s>\n"};
    for (int i = 1; i < 3 && i < t->vocab_size; i++)
        for (size_t k = 0; k < sizeof names / sizeof *names; k++)
            if (t->piece_len[i] == strlen(names[k]) &&
                memcmp(t->pieces[i], names[k], t->piece_len[i]) == 0) {
                if (!t->special)
                    t->special = sl_xcalloc((size_t)t->vocab_size, 1);
                t->special[i] = 1;
            }
}

struct sl_tok *sl_tok_parse(const unsigned char *data, size_t len, int vocab, char *err,
                            size_t errlen)
{
    if (vocab < 259) {
        snprintf(err, errlen, "vocab_size %d is below 259 (3 specials + 256 byte tokens)", vocab);
        return NULL;
    }
    if (len < 4) {
        snprintf(err, errlen, "truncated: %zu bytes, no max_token_length header", len);
        return NULL;
    }
    int32_t mtl = rd_i32(data);
    if (mtl < 1 || mtl > 65536) {
        snprintf(err, errlen, "max_token_length %d out of range [1, 65536]", (int)mtl);
        return NULL;
    }
    /* First pass validates every offset, so the copy below cannot read past the end. */
    size_t off = 4, total = 0;
    for (int i = 0; i < vocab; i++) {
        if (len - off < 8) {
            snprintf(err, errlen, "truncated at token %d of %d (offset %zu of %zu)", i, vocab, off,
                     len);
            return NULL;
        }
        float score = rd_f32(data + off);
        int32_t plen = rd_i32(data + off + 4);
        if (!isfinite(score)) {
            snprintf(err, errlen, "token %d has a non-finite score", i);
            return NULL;
        }
        if (plen < 0 || plen > mtl) {
            snprintf(err, errlen, "token %d has length %d outside [0, max_token_length %d]", i,
                     (int)plen, (int)mtl);
            return NULL;
        }
        off += 8;
        if (len - off < (size_t)plen) {
            snprintf(err, errlen, "truncated inside token %d (needs %d bytes at offset %zu of %zu)",
                     i, (int)plen, off, len);
            return NULL;
        }
        off += (size_t)plen;
        total += (size_t)plen + 1;
    }
    if (off != len) {
        snprintf(err, errlen,
                 "%zu trailing bytes after %d tokens (tokenizer does not match the model's vocab)",
                 len - off, vocab);
        return NULL;
    }
    struct sl_tok *t = sl_tok_alloc(vocab);
    t->blob = sl_xmalloc(total);
    off = 4;
    size_t at = 0;
    for (int i = 0; i < vocab; i++) {
        t->scores[i] = rd_f32(data + off);
        uint32_t plen = (uint32_t)rd_i32(data + off + 4);
        off += 8;
        memcpy(t->blob + at, data + off, plen);
        t->blob[at + plen] = '\0';
        t->pieces[i] = t->blob + at;
        t->piece_len[i] = plen;
        off += plen;
        at += plen + 1;
    }
    mark_llama_controls(t);
    sl_tok_index(t);
    return t;
}

size_t sl_tok_unescape(char *dst, const char *src, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (len - i >= 3 && memcmp(src + i, "\xe2\x96\x81", 3) == 0) {
            dst[n++] = ' ';
            i += 2;
        } else {
            dst[n++] = src[i];
        }
    }
    return n;
}

struct sl_tok *sl_tok_from_spm(int vocab, const char *const *pieces, const uint64_t *lens,
                               const float *scores, const int32_t *types, int32_t bos_id, char *err,
                               size_t errlen)
{
    if (vocab < 1) {
        snprintf(err, errlen, "empty vocabulary");
        return NULL;
    }
    size_t total = 0;
    for (int i = 0; i < vocab; i++) {
        if (lens[i] > 65536) {
            snprintf(err, errlen, "token %d is %llu bytes long", i, (unsigned long long)lens[i]);
            return NULL;
        }
        if (scores && !isfinite(scores[i])) {
            snprintf(err, errlen, "token %d has a non-finite score", i);
            return NULL;
        }
        total += (size_t)lens[i] + 1;
    }
    struct sl_tok *t = sl_tok_alloc(vocab);
    t->bos_id = bos_id;
    t->blob = sl_xmalloc(total);
    size_t at = 0;
    for (int i = 0; i < vocab; i++) {
        size_t n = sl_tok_unescape(t->blob + at, pieces[i], (size_t)lens[i]);
        t->blob[at + n] = '\0';
        t->pieces[i] = t->blob + at;
        t->piece_len[i] = (uint32_t)n;
        t->scores[i] = scores ? scores[i] : 0.0f;
        at += n + 1;
        /* GGUF token type 3 is a control token (<s>, </s>): text nobody should see. */
        if (types && types[i] == 3) {
            if (!t->special)
                t->special = sl_xcalloc((size_t)vocab, 1);
            t->special[i] = 1;
        }
    }
    if (!types)
        mark_llama_controls(t);
    sl_tok_index(t);
    return t;
}

/* ---------------------------------------------------------------------------------------------
 * Synthetic vocabulary: the llama2.c layout (specials, 256 byte tokens) followed by single
 * characters and then multi-byte pieces that are each the concatenation of two earlier pieces, so
 * BPE merges really happen and every piece is reachable. Scores fall with the id, which makes
 * earlier (shorter, more common) merges win, as in a trained SentencePiece model.
 */

#define SYN_MAX_PIECE 16

struct syn_builder {
    struct sl_str blob;
    size_t *off;   /* (vocab) offset of each piece in blob */
    uint32_t *len; /* (vocab) */
    int n, cap;
    int32_t *hash; /* open addressing over piece bytes, -1 = empty */
    size_t hmask;
};

static uint64_t fnv1a(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Adds the piece unless it exists or the vocabulary is full. Returns true when added. */
static bool syn_add(struct syn_builder *b, const char *s, size_t len)
{
    if (b->n >= b->cap)
        return false;
    size_t h = (size_t)fnv1a(s, len) & b->hmask;
    while (b->hash[h] >= 0) {
        int32_t id = b->hash[h];
        if (b->len[id] == len && memcmp(b->blob.p + b->off[id], s, len) == 0)
            return false;
        h = (h + 1) & b->hmask;
    }
    b->hash[h] = b->n;
    b->off[b->n] = b->blob.len;
    b->len[b->n] = (uint32_t)len;
    sl_str_append(&b->blob, s, len);
    sl_str_append(&b->blob, "", 1); /* keep every piece NUL-terminated */
    b->n++;
    return true;
}

static uint64_t syn_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct sl_tok *sl_tok_synthetic(int vocab)
{
    static const char *const words[] = {
        " the",  " a",     " and",   " to",   " was",  " he",  " she",   " it",     " of",
        " in",   " time",  " upon",  " once", " Once", "Once", " there", " little", " girl",
        " boy",  " day",   " play",  " with", " her",  " his", " they",  " said",   " big",
        " mom",  " saw",   " happy", " is",   "ing",   "ed",   "er",     "es",      "th",
        "in",    "an",     "on",     "at",    "en",    "re",   "or",     "ou",      "ll",
        ". ",    ", ",     ".\n",    " The",  " She",  " He",  " One",   " friend", " wanted",
        " very", " would", " could", " that", " for",  " you", " not",   " what",   " had",
        " were", " all",
    };
    /* A few common non-ASCII characters as whole pieces, so multi-byte lookup is exercised. */
    static const char *const chars[] = {"é", "ü", "ö", "ñ", "—", "’", "“", "”", "…", "€"};

    struct syn_builder b = {0};
    sl_str_init(&b.blob);
    b.cap = vocab;
    b.off = sl_xmalloc((size_t)vocab * sizeof(*b.off));
    b.len = sl_xmalloc((size_t)vocab * sizeof(*b.len));
    size_t hcap = 1;
    while (hcap < (size_t)vocab * 2)
        hcap <<= 1;
    b.hmask = hcap - 1;
    b.hash = sl_xmalloc(hcap * sizeof(*b.hash));
    memset(b.hash, 0xff, hcap * sizeof(*b.hash));

    syn_add(&b, "<unk>", 5);
    syn_add(&b, "\n<s>\n", 5);
    syn_add(&b, "\n</s>\n", 6);
    for (int i = 0; i < 256; i++) {
        char p[8];
        snprintf(p, sizeof(p), "<0x%02X>", i);
        syn_add(&b, p, 6);
    }
    int first_text = b.n;
    syn_add(&b, " ", 1);
    syn_add(&b, "\n", 1);
    syn_add(&b, "\t", 1);
    for (int c = 0x21; c < 0x7f; c++) {
        char p = (char)c;
        syn_add(&b, &p, 1);
    }
    for (size_t i = 0; i < sizeof(chars) / sizeof(chars[0]); i++)
        syn_add(&b, chars[i], strlen(chars[i]));
    /* Every prefix of a word, shortest first: each is an earlier piece plus one character. */
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        size_t wl = strlen(words[i]);
        for (size_t l = 2; l <= wl; l++)
            syn_add(&b, words[i], l);
    }
    /* Fill the rest with concatenations of two earlier text pieces. '<' is left out so that no
     * piece can read as a "<0xAB>" byte token. */
    uint64_t rng = 0x5eed5eedull;
    int multi_from = first_text;
    long tries = 0;
    while (b.n < vocab && tries < 1000L * vocab) {
        tries++;
        int span = b.n - multi_from;
        int a = multi_from + (int)(syn_next(&rng) % (uint64_t)span);
        int c = multi_from + (int)(syn_next(&rng) % (uint64_t)span);
        size_t la = b.len[a], lc = b.len[c];
        if (la + lc > SYN_MAX_PIECE)
            continue;
        char p[2 * SYN_MAX_PIECE];
        memcpy(p, b.blob.p + b.off[a], la);
        memcpy(p + la, b.blob.p + b.off[c], lc);
        if (memchr(p, '<', la + lc))
            continue;
        syn_add(&b, p, la + lc);
    }
    /* Unreachable in practice; keeps the vocabulary full whatever the size. */
    for (int i = 0; b.n < vocab; i++) {
        char p[32];
        int l = snprintf(p, sizeof(p), "#%d", i);
        syn_add(&b, p, (size_t)l);
    }

    struct sl_tok *t = sl_tok_alloc(vocab);
    t->blob = b.blob.p; /* ownership moves to the tokenizer */
    for (int i = 0; i < vocab; i++) {
        t->pieces[i] = t->blob + b.off[i];
        t->piece_len[i] = b.len[i];
        t->scores[i] = i < first_text ? 0.0f : -(float)(i - first_text);
    }
    free(b.off);
    free(b.len);
    free(b.hash);
    mark_llama_controls(t);
    sl_tok_index(t);
    return t;
}

/* ---------------------------------------------------------------------------------------------
 * Encode / decode
 */

int sl_tok_vocab_size(const struct sl_tok *t)
{
    return t->vocab_size;
}

int32_t sl_tok_bos(const struct sl_tok *t)
{
    return t->bos_id;
}

/* Length of the valid UTF-8 character at s[0..len), or 0 when invalid or truncated. */
static size_t utf8_char(const unsigned char *s, size_t len)
{
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        need = 2;
    else if (c == 0xe0)
        need = 3, lo = 0xa0;
    else if (c == 0xed)
        need = 3, hi = 0x9f;
    else if (c >= 0xe1 && c <= 0xef)
        need = 3;
    else if (c == 0xf0)
        need = 4, lo = 0x90;
    else if (c == 0xf4)
        need = 4, hi = 0x8f;
    else if (c >= 0xf1 && c <= 0xf3)
        need = 4;
    else
        return 0;
    if (len < need)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < need; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return need;
}

struct sym {
    int32_t id; /* -1 once merged into its left neighbour */
    int prev, next;
};

/* A candidate merge of symbols left and right, valid while both still hold lid and rid. */
struct cand {
    float score;
    int left, right;
    int32_t lid, rid, merged;
};

/* The order llama2.c's scan picks: highest score, then leftmost. */
static bool cand_before(const struct cand *a, const struct cand *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(struct cand *h, int *n, struct cand c)
{
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_before(&c, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, int *n)
{
    struct cand top = h[0];
    struct cand last = h[--(*n)];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        const struct cand *best = &last;
        if (l < *n && cand_before(&h[l], best))
            m = l, best = &h[l];
        if (r < *n && cand_before(&h[r], best))
            m = r;
        if (m == i)
            break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

static size_t merge_slot(int32_t a, int32_t b, size_t mask)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9e3779b97f4a7c15ull;
    return (size_t)(k >> 32) & mask;
}

static const struct sl_tok_merge *merge_find(const struct sl_tok *t, int32_t a, int32_t b)
{
    for (size_t h = merge_slot(a, b, t->merge_mask);; h = (h + 1) & t->merge_mask) {
        const struct sl_tok_merge *m = &t->merges[h];
        if (m->left < 0)
            return NULL;
        if (m->left == a && m->right == b)
            return m;
    }
}

void sl_tok_merge_add(struct sl_tok *t, int32_t a, int32_t b, int32_t rank, int32_t merged)
{
    size_t h = merge_slot(a, b, t->merge_mask);
    while (t->merges[h].left >= 0 && !(t->merges[h].left == a && t->merges[h].right == b))
        h = (h + 1) & t->merge_mask;
    t->merges[h] = (struct sl_tok_merge){a, b, rank, merged};
}

static void try_pair(const struct sl_tok *t, const struct sym *sy, int l, int r, struct cand *h,
                     int *nh)
{
    if (l < 0 || r < 0)
        return;
    int32_t a = sy[l].id, b = sy[r].id;
    if (t->kind == SL_TOK_KIND_HF_BPE) {
        /* Only listed pairs merge; a lower rank goes first, which a negated score orders the
         * same way (ranks stay below 2^24, exact in a float). */
        const struct sl_tok_merge *m = merge_find(t, a, b);
        if (m)
            heap_push(h, nh, (struct cand){-(float)m->rank, l, r, a, b, m->merged});
        return;
    }
    int32_t m = lookup2(t, t->pieces[a], t->piece_len[a], t->pieces[b], t->piece_len[b]);
    if (m >= 0)
        heap_push(h, nh, (struct cand){t->scores[m], l, r, a, b, m});
}

/* Merges the linked symbols sy[0..ns) in place; heap holds at least 3 * ns candidates. */
static void bpe_merge(const struct sl_tok *t, struct sym *sy, int ns, struct cand *heap)
{
    int nh = 0;
    for (int i = 0; i < ns; i++) {
        sy[i].prev = i - 1;
        sy[i].next = i + 1 < ns ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < ns; i++)
        try_pair(t, sy, i, i + 1, heap, &nh);
    while (nh > 0) {
        struct cand c = heap_pop(heap, &nh);
        /* Stale when either side has merged since: a symbol that merged spells a longer piece,
         * so equal ids mean unchanged. */
        if (sy[c.left].id != c.lid || sy[c.right].id != c.rid || sy[c.left].next != c.right)
            continue;
        sy[c.left].id = c.merged;
        sy[c.right].id = -1;
        int nx = sy[c.right].next;
        sy[c.left].next = nx;
        if (nx >= 0)
            sy[nx].prev = c.left;
        try_pair(t, sy, sy[c.left].prev, c.left, heap, &nh);
        try_pair(t, sy, c.left, nx, heap, &nh);
    }
}

/* Output ids past max_out are counted, not written, so the caller learns the size it needs. */
struct emit {
    int32_t *out;
    int max_out;
    int n;
};

static void emit_id(struct emit *e, int32_t id)
{
    if (e->n < e->max_out)
        e->out[e->n] = id;
    e->n++;
}

static int emit_done(const struct emit *e, int *n_out)
{
    if (e->n > e->max_out) {
        *n_out = e->max_out + 1;
        return SL_ERANGE;
    }
    *n_out = e->n;
    return SL_OK;
}

/* The id llama2.c's byte fallback gives byte b: its "<0xAB>" piece, else b + 3 as run.c
 * computes it (the same id for every llama2.c vocabulary), else <unk>. */
static int32_t llama_byte_id(const struct sl_tok *t, unsigned char b)
{
    if (t->byte_id[b] >= 0)
        return t->byte_id[b];
    return (int32_t)b + 3 < t->vocab_size ? (int32_t)b + 3 : t->unk_id;
}

static int hf_encode(const struct sl_tok *t, const char *text, size_t len, bool bos,
                     struct emit *e);

int sl_tok_encode(const struct sl_tok *t, const char *text, size_t len, bool bos, int32_t *out,
                  int max_out, int *n_out)
{
    const unsigned char *u = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t n = utf8_char(u + i, len - i);
        if (n == 0)
            return SL_EINVAL;
        i += n;
    }
    struct emit e = {out, max_out, 0};
    if (t->kind == SL_TOK_KIND_HF_BPE) {
        int rc = hf_encode(t, text, len, bos, &e);
        return rc != SL_OK ? rc : emit_done(&e, n_out);
    }
    /* At most one symbol per byte plus the dummy prefix; each merge pushes at most 2 candidates. */
    size_t cap = len + 1;
    struct sym *sy = sl_xmalloc(cap * sizeof(*sy));
    struct cand *heap = sl_xmalloc(3 * cap * sizeof(*heap));
    int ns = 0;
    if (len > 0)
        sy[ns++].id = t->space_id >= 0 ? t->space_id : llama_byte_id(t, ' ');
    for (size_t i = 0; i < len;) {
        size_t n = utf8_char(u + i, len - i);
        int32_t id = sl_tok_lookup(t, text + i, n);
        if (id >= 0) {
            sy[ns++].id = id;
        } else {
            for (size_t j = 0; j < n; j++)
                sy[ns++].id = llama_byte_id(t, u[i + j]);
        }
        i += n;
    }
    bpe_merge(t, sy, ns, heap);
    if (bos)
        emit_id(&e, t->bos_id);
    for (int i = ns > 0 ? 0 : -1; i >= 0; i = sy[i].next)
        emit_id(&e, sy[i].id);
    free(sy);
    free(heap);
    return emit_done(&e, n_out);
}

/* ---------------------------------------------------------------------------------------------
 * Hugging Face BPE encode (tokenizers' BPE model over the whole normalized segment, as with no
 * pre-tokenizer): added tokens split the input, then each piece between them is normalized,
 * mapped to one symbol per character (or byte tokens, or <unk>) and merged by rank.
 */

struct hf_scratch {
    char *norm;        /* (len + 1) normalized segment */
    struct sym *sy;    /* (len + 1) */
    struct cand *heap; /* (3 * (len + 1)) */
};

/* Leftmost, then longest added token with the given `normalized` flag in s[from..len). */
static const struct sl_tok_added *find_added(const struct sl_tok *t, const char *s, size_t len,
                                             size_t from, bool normalized, size_t *at)
{
    if (t->n_added == 0)
        return NULL;
    for (size_t p = from; p < len; p++) {
        for (int k = 0; k < t->n_added; k++) {
            const struct sl_tok_added *a = &t->added[k];
            if (a->normalized == normalized && a->len <= len - p && s[p] == a->s[0] &&
                memcmp(s + p, a->s, a->len) == 0) {
                *at = p;
                return a; /* added tokens are sorted longest first */
            }
        }
    }
    return NULL;
}

/* BPE of one normalized piece with no added token inside. */
static void hf_bpe(const struct sl_tok *t, const char *s, size_t len, struct hf_scratch *w,
                   struct emit *e)
{
    if (len == 0)
        return;
    if (t->ignore_merges) {
        int32_t id = sl_tok_lookup(t, s, len);
        if (id >= 0) {
            emit_id(e, id);
            return;
        }
    }
    const unsigned char *u = (const unsigned char *)s;
    struct sym *sy = w->sy;
    int ns = 0;
    bool in_unk = false; /* the last symbol is an <unk> that may absorb the next character */
    for (size_t i = 0; i < len;) {
        size_t n = utf8_char(u + i, len - i);
        int32_t id = sl_tok_lookup(t, s + i, n);
        bool bytes = false;
        if (id < 0 && t->byte_fallback) {
            bytes = true;
            for (size_t j = 0; j < n && bytes; j++)
                bytes = t->byte_id[u[i + j]] >= 0;
        }
        if (id >= 0) {
            sy[ns++].id = id;
            in_unk = false;
        } else if (bytes) {
            for (size_t j = 0; j < n; j++)
                sy[ns++].id = t->byte_id[u[i + j]];
            in_unk = false;
        } else if (t->unk_id >= 0 && !(in_unk && t->fuse_unk)) {
            sy[ns++].id = t->unk_id;
            in_unk = true;
        }
        i += n;
    }
    bpe_merge(t, sy, ns, w->heap);
    for (int i = ns > 0 ? 0 : -1; i >= 0; i = sy[i].next)
        emit_id(e, sy[i].id);
}

/* Normalizes raw[0..len) (prepend "▁" when non-empty; a literal "▁" is a space, since pieces
 * store "▁" as a space) and encodes it, splitting on normalized added tokens. */
static void hf_segment(const struct sl_tok *t, const char *raw, size_t len, struct hf_scratch *w,
                       struct emit *e)
{
    if (len == 0)
        return;
    size_t n = 0;
    if (t->prepend_space)
        w->norm[n++] = ' ';
    n += sl_tok_unescape(w->norm + n, raw, len);
    size_t from = 0, at;
    const struct sl_tok_added *a;
    while ((a = find_added(t, w->norm, n, from, true, &at)) != NULL) {
        hf_bpe(t, w->norm + from, at - from, w, e);
        emit_id(e, a->id);
        from = at + a->len;
    }
    hf_bpe(t, w->norm + from, n - from, w, e);
}

static int hf_encode(const struct sl_tok *t, const char *text, size_t len, bool bos, struct emit *e)
{
    if (bos && t->bos_id >= 0)
        emit_id(e, t->bos_id);
    struct hf_scratch w;
    size_t cap = len + 1;
    w.norm = sl_xmalloc(cap);
    w.sy = sl_xmalloc(cap * sizeof(*w.sy));
    w.heap = sl_xmalloc(3 * cap * sizeof(*w.heap));
    size_t from = 0, at;
    const struct sl_tok_added *a;
    while ((a = find_added(t, text, len, from, false, &at)) != NULL) {
        hf_segment(t, text + from, at - from, &w, e);
        emit_id(e, a->id);
        from = at + a->len;
    }
    hf_segment(t, text + from, len - from, &w, e);
    free(w.norm);
    free(w.sy);
    free(w.heap);
    return SL_OK;
}

const char *sl_tok_decode(const struct sl_tok *t, int32_t prev, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->vocab_size) {
        *len = 0;
        return "";
    }
    if (t->special && t->special[id]) {
        *len = 0;
        return "";
    }
    if (t->byte_piece[id] >= 0) {
        *len = 1;
        return (const char *)&t->bytes[t->byte_piece[id]];
    }
    const char *p = t->pieces[id];
    size_t n = t->piece_len[id];
    /* llama2.c drops the space after BOS; HF's Strip decoder drops the first one of the text,
     * which in a sequence that starts with BOS is the same space. */
    bool strip = t->kind == SL_TOK_KIND_LLAMA2C || t->strip_leading;
    if (strip && prev == t->bos_id && n > 0 && p[0] == ' ') {
        p++;
        n--;
    }
    *len = n;
    return p;
}

bool sl_tok_special_text(const struct sl_tok *t, int32_t id, const char **text, size_t *len)
{
    if (id < 0 || id >= t->vocab_size || !t->special || !t->special[id])
        return false;
    *text = t->pieces[id];
    *len = t->piece_len[id];
    return true;
}

int32_t sl_tok_special_id(const struct sl_tok *t, const char *s, size_t len)
{
    if (len == 0)
        return -1;
    /* HF added tokens are matched whole by encode already; a template marker is one of them. */
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].len == len && memcmp(t->added[k].s, s, len) == 0)
            return t->added[k].id;
    if (!t->special)
        return -1;
    int32_t id = sl_tok_lookup(t, s, len);
    return id >= 0 && t->special[id] ? id : -1;
}
