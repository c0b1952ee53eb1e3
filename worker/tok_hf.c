/* Hugging Face tokenizer.json → a SL_TOK_KIND_HF_BPE tokenizer.
 *
 * Only the SentencePiece-like family is accepted (Llama 2, Mistral, TinyStories): a BPE model,
 * a normalizer that replaces spaces with "▁" (and may prepend one), no pre-tokenizer, and a
 * decoder built from Replace/ByteFallback/Fuse/Strip. Anything else is rejected by name rather
 * than tokenized differently from the reference. */
#include "worker_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VOCAB (1 << 24)
#define MAX_MERGES (1 << 24) /* ranks are ordered through a float: exact below 2^24 */

static const char *type_of(const json_t *o)
{
    const char *s = json_string_value(json_object_get(o, "type"));
    return s ? s : "(none)";
}

static bool str_is(const json_t *v, const char *s)
{
    const char *x = json_string_value(v);
    return x && strcmp(x, s) == 0;
}

/* Reads one normalizer; sets *replace when it is Replace(" " → "▁"). */
static bool parse_normalizer_one(struct sl_tok *t, const json_t *n, bool *replace, char *err,
                                 size_t errlen)
{
    const char *ty = type_of(n);
    if (strcmp(ty, "Prepend") == 0 && str_is(json_object_get(n, "prepend"), "\u2581")) {
        t->prepend_space = true;
        return true;
    }
    if (strcmp(ty, "Replace") == 0 &&
        str_is(json_object_get(json_object_get(n, "pattern"), "String"), " ") &&
        str_is(json_object_get(n, "content"), "\u2581")) {
        *replace = true;
        return true;
    }
    snprintf(err, errlen, "unsupported normalizer %s", ty);
    return false;
}

static bool parse_normalizer(struct sl_tok *t, const json_t *n, char *err, size_t errlen)
{
    bool replace = false;
    if (json_is_object(n) && strcmp(type_of(n), "Sequence") == 0) {
        const json_t *list = json_object_get(n, "normalizers");
        size_t i;
        const json_t *x;
        if (!json_is_array(list)) {
            snprintf(err, errlen, "normalizer Sequence without a normalizers array");
            return false;
        }
        json_array_foreach(list, i, x)
        {
            if (!parse_normalizer_one(t, x, &replace, err, errlen))
                return false;
        }
    } else if (json_is_object(n)) {
        if (!parse_normalizer_one(t, n, &replace, err, errlen))
            return false;
    }
    /* Pieces are stored with "▁" read as a space; that is only the same tokenizer when the
     * input's spaces become "▁" too. */
    if (!replace) {
        snprintf(err, errlen, "unsupported normalizer: spaces are not replaced by \"\u2581\"");
        return false;
    }
    return true;
}

static bool parse_decoder_one(struct sl_tok *t, const json_t *d, char *err, size_t errlen)
{
    const char *ty = type_of(d);
    if (strcmp(ty, "Strip") == 0) {
        if (str_is(json_object_get(d, "content"), " ") &&
            json_integer_value(json_object_get(d, "start")) >= 1)
            t->strip_leading = true;
        return true;
    }
    if (strcmp(ty, "Replace") == 0 || strcmp(ty, "ByteFallback") == 0 || strcmp(ty, "Fuse") == 0)
        return true;
    snprintf(err, errlen, "unsupported decoder %s", ty);
    return false;
}

static bool parse_decoder(struct sl_tok *t, const json_t *d, char *err, size_t errlen)
{
    if (!json_is_object(d))
        return true;
    if (strcmp(type_of(d), "Sequence") != 0)
        return parse_decoder_one(t, d, err, errlen);
    const json_t *list = json_object_get(d, "decoders");
    size_t i;
    const json_t *x;
    json_array_foreach(list, i, x)
    {
        if (!parse_decoder_one(t, x, err, errlen))
            return false;
    }
    return true;
}

/* The first special token of the post-processor's single-sequence template (its BOS), or -1. */
static int32_t template_bos(const json_t *pp)
{
    if (!json_is_object(pp) || strcmp(type_of(pp), "TemplateProcessing") != 0)
        return -1;
    const json_t *first = json_array_get(json_object_get(pp, "single"), 0);
    const json_t *st = json_object_get(first, "SpecialToken");
    const char *name = json_string_value(json_object_get(st, "id"));
    if (!name)
        return -1;
    const json_t *spec = json_object_get(json_object_get(pp, "special_tokens"), name);
    const json_t *id = json_array_get(json_object_get(spec, "ids"), 0);
    return json_is_integer(id) ? (int32_t)json_integer_value(id) : -1;
}

/* A merge as "a b" (one space) or ["a", "b"]. Copies both halves into buf (NUL-separated). */
static bool merge_halves(const json_t *m, char **buf, size_t *cap, const char **a, const char **b)
{
    const char *x, *y;
    size_t xl, yl;
    if (json_is_string(m)) {
        const char *s = json_string_value(m);
        const char *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return false;
        x = s, xl = (size_t)(sp - s), y = sp + 1, yl = strlen(sp + 1);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        x = json_string_value(json_array_get(m, 0));
        y = json_string_value(json_array_get(m, 1));
        xl = strlen(x), yl = strlen(y);
    } else {
        return false;
    }
    if (xl == 0 || yl == 0)
        return false;
    /* Layout: a \0 b \0 a b \0 (the last is the merged piece's key). */
    size_t need = 2 * (xl + yl) + 3;
    if (need > *cap) {
        *cap = need * 2;
        *buf = sl_xrealloc(*buf, *cap);
    }
    char *p = *buf;
    memcpy(p, x, xl);
    p[xl] = '\0';
    memcpy(p + xl + 1, y, yl);
    p[xl + 1 + yl] = '\0';
    *a = p;
    *b = p + xl + 1;
    return true;
}

static int cmp_added(const void *pa, const void *pb)
{
    const struct sl_tok_added *a = pa, *b = pb;
    if (a->len != b->len)
        return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int32_t vocab_id(const json_t *vocab, const char *key)
{
    const json_t *v = json_object_get(vocab, key);
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
}

struct sl_tok *sl_tok_hf_parse(const char *json, size_t len, int32_t bos_id, char *err,
                               size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    struct sl_tok *t = NULL;
    char *mbuf = NULL;
    size_t mcap = 0;
    if (!root || !json_is_object(root)) {
        if (root)
            snprintf(err, errlen, "not a JSON object");
        else
            snprintf(err, errlen, "bad JSON at line %d column %d: %s", je.line, je.column, je.text);
        goto fail;
    }
    const json_t *model = json_object_get(root, "model");
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model) || strcmp(type_of(model), "BPE") != 0) {
        snprintf(err, errlen, "model type %s is not BPE",
                 json_is_object(model) ? type_of(model) : "(missing)");
        goto fail;
    }
    if (!json_is_object(vocab) || json_object_size(vocab) == 0 || !json_is_array(merges)) {
        snprintf(err, errlen, "BPE model without a vocab object and a merges array");
        goto fail;
    }
    if (added && !json_is_array(added)) {
        snprintf(err, errlen, "added_tokens is not an array");
        goto fail;
    }
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    if (pre && !json_is_null(pre)) {
        snprintf(err, errlen, "unsupported pre_tokenizer %s", type_of(pre));
        goto fail;
    }
    const json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0.0) {
        snprintf(err, errlen, "BPE dropout is not supported");
        goto fail;
    }
    const char *cont = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *eow = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((cont && *cont) || (eow && *eow)) {
        snprintf(err, errlen, "BPE subword prefixes and suffixes are not supported");
        goto fail;
    }
    if (json_array_size(merges) > MAX_MERGES || json_object_size(vocab) > MAX_VOCAB) {
        snprintf(err, errlen, "too many tokens or merges");
        goto fail;
    }

    /* Ids may have gaps and added tokens may extend the vocab: size it by the largest id. */
    int32_t max_id = -1;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)vocab, key, v)
    {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= MAX_VOCAB) {
            snprintf(err, errlen, "vocab entry \"%.40s\" has a bad id", key);
            goto fail;
        }
        if (id > max_id)
            max_id = (int32_t)id;
    }
    size_t i;
    const json_t *a;
    json_array_foreach(added, i, a)
    {
        const json_t *id = json_object_get(a, "id");
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= MAX_VOCAB || !content || !*content) {
            snprintf(err, errlen, "added token %zu has no valid id and content", i);
            goto fail;
        }
        if (json_integer_value(id) > max_id)
            max_id = (int32_t)json_integer_value(id);
    }
    int n = max_id + 1;
    t = sl_tok_alloc(n);
    t->kind = SL_TOK_KIND_HF_BPE;
    const char **src = sl_xcalloc((size_t)n, sizeof(*src)); /* (n) unconverted piece per id */
    size_t total = 0;
    json_object_foreach((json_t *)vocab, key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        if (src[id]) {
            snprintf(err, errlen, "vocab entries \"%.40s\" and \"%.40s\" share id %d", src[id], key,
                     (int)id);
            free(src);
            goto fail;
        }
        src[id] = key;
        total += strlen(key) + 1;
    }
    json_array_foreach(added, i, a)
    {
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!src[id]) {
            src[id] = content;
            total += strlen(content) + 1;
        }
        total += strlen(content) + 1; /* the match copy */
    }
    for (int id = 0; id < n; id++)
        if (!src[id])
            total++;
    t->blob = sl_xmalloc(total);
    size_t at = 0;
    for (int id = 0; id < n; id++) {
        const char *s = src[id] ? src[id] : "";
        size_t l = sl_tok_unescape(t->blob + at, s, strlen(s));
        t->blob[at + l] = '\0';
        t->pieces[id] = t->blob + at;
        t->piece_len[id] = (uint32_t)l;
        at += l + 1;
    }
    free(src);

    t->n_added = (int)json_array_size(added);
    if (t->n_added > 0)
        t->added = sl_xcalloc((size_t)t->n_added, sizeof(*t->added));
    json_array_foreach(added, i, a)
    {
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        const char *content = json_string_value(json_object_get(a, "content"));
        /* A normalized token is matched in the normalized text, where "▁" reads as a space. */
        const json_t *norm = json_object_get(a, "normalized");
        bool normalized = json_is_boolean(norm) ? json_is_true(norm) : true;
        size_t l =
            normalized ? sl_tok_unescape(t->blob + at, content, strlen(content)) : strlen(content);
        if (!normalized)
            memcpy(t->blob + at, content, l);
        t->blob[at + l] = '\0';
        t->added[i] = (struct sl_tok_added){t->blob + at, (uint32_t)l, id, normalized};
        at += l + 1;
        if (json_is_true(json_object_get(a, "special"))) {
            if (!t->special)
                t->special = sl_xcalloc((size_t)n, 1);
            t->special[id] = 1;
        }
    }
    if (t->n_added > 1)
        qsort(t->added, (size_t)t->n_added, sizeof(*t->added), cmp_added);

    /* Open addressing at most half full. */
    size_t cap = 16;
    while (cap < 2 * json_array_size(merges))
        cap <<= 1;
    t->merges = sl_xmalloc(cap * sizeof(*t->merges));
    memset(t->merges, 0xff, cap * sizeof(*t->merges));
    t->merge_mask = cap - 1;
    const json_t *m;
    json_array_foreach(merges, i, m)
    {
        const char *x, *y;
        if (!merge_halves(m, &mbuf, &mcap, &x, &y)) {
            snprintf(err, errlen, "merge %zu is not a pair of tokens", i);
            goto fail;
        }
        size_t xl = strlen(x), yl = strlen(y);
        char *xy = mbuf + xl + yl + 2;
        memcpy(xy, x, xl);
        memcpy(xy + xl, y, yl);
        xy[xl + yl] = '\0';
        int32_t ia = vocab_id(vocab, x), ib = vocab_id(vocab, y), im = vocab_id(vocab, xy);
        if (ia < 0 || ib < 0 || im < 0) {
            snprintf(err, errlen, "merge %zu (\"%.40s\" \"%.40s\") names a token not in the vocab",
                     i, x, y);
            goto fail;
        }
        sl_tok_merge_add(t, ia, ib, (int32_t)i, im);
    }

    if (!parse_normalizer(t, json_object_get(root, "normalizer"), err, errlen) ||
        !parse_decoder(t, json_object_get(root, "decoder"), err, errlen))
        goto fail;
    t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    t->unk_id = unk ? vocab_id(vocab, unk) : -1;
    t->bos_id = bos_id >= 0 ? bos_id : template_bos(json_object_get(root, "post_processor"));
    if (t->bos_id >= n) {
        snprintf(err, errlen, "BOS id %d is outside the vocabulary of %d", (int)t->bos_id, n);
        goto fail;
    }
    sl_tok_index(t);
    free(mbuf);
    json_decref(root);
    return t;
fail:
    free(mbuf);
    sl_tok_free(t);
    json_decref(root);
    return NULL;
}
