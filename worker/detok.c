/* Incremental detokenizer: bytes → valid UTF-8 deltas, with stop strings. */
#include "worker_impl.h"

#include <stdlib.h>
#include <string.h>

struct sl_detok {
    const struct sl_tok *tok;
    int32_t prev;
    char **stops;
    size_t *stop_len;
    int *stop_arg; /* (n_stops) each stop string's index among those sl_detok_new was given */
    int n_stops;
    int hit;            /* the argument index of the stop string that matched, or -1 */
    struct sl_str raw;  /* decoded bytes that do not yet form a complete character */
    struct sl_str text; /* valid UTF-8 held back because it may begin a stop string */
    bool stopped;
    int pushed;     /* tokens pushed so far */
    int min_tokens; /* stop strings match once more tokens than this were pushed */
    bool include_stop;
    bool keep_special; /* special tokens add their text */
};

struct sl_detok *sl_detok_new(const struct sl_tok *t, int32_t prev, const char *const *stops,
                              int n_stops)
{
    struct sl_detok *d = sl_xcalloc(1, sizeof(*d));
    d->tok = t;
    d->prev = prev;
    if (n_stops > 0) {
        d->stops = sl_xcalloc((size_t)n_stops, sizeof(*d->stops));
        d->stop_len = sl_xcalloc((size_t)n_stops, sizeof(*d->stop_len));
        d->stop_arg = sl_xcalloc((size_t)n_stops, sizeof(*d->stop_arg));
    }
    d->hit = -1;
    for (int i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0] || !sl_utf8_valid(stops[i], strlen(stops[i])))
            continue;
        d->stops[d->n_stops] = sl_xstrdup(stops[i]);
        d->stop_len[d->n_stops] = strlen(stops[i]);
        d->stop_arg[d->n_stops] = i;
        d->n_stops++;
    }
    sl_str_init(&d->raw);
    sl_str_init(&d->text);
    return d;
}

void sl_detok_stop_options(struct sl_detok *d, int min_tokens, bool include_stop)
{
    d->min_tokens = min_tokens;
    d->include_stop = include_stop;
}

int sl_detok_stop_index(const struct sl_detok *d)
{
    return d->hit;
}

void sl_detok_keep_special(struct sl_detok *d)
{
    d->keep_special = true;
}

void sl_detok_free(struct sl_detok *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->n_stops; i++)
        free(d->stops[i]);
    free(d->stops);
    free(d->stop_len);
    free(d->stop_arg);
    sl_str_dispose(&d->raw);
    sl_str_dispose(&d->text);
    free(d);
}

/* Start of the earliest complete stop string in text, or -1; *len: its length, *which: its
 * index in d->stops. */
static ptrdiff_t find_stop(const struct sl_detok *d, size_t *len, int *which)
{
    ptrdiff_t best = -1;
    if (d->text.len == 0)
        return -1;
    for (int i = 0; i < d->n_stops; i++) {
        const char *hit = memmem(d->text.p, d->text.len, d->stops[i], d->stop_len[i]);
        if (hit && (best < 0 || hit - d->text.p < best)) {
            best = hit - d->text.p;
            *len = d->stop_len[i];
            *which = i;
        }
    }
    return best;
}

/* Bytes at the end of text that are a proper prefix of some stop string (the most that could
 * still turn into a stop once more text arrives). */
static size_t stop_prefix_tail(const struct sl_detok *d)
{
    size_t keep = 0;
    for (int i = 0; i < d->n_stops; i++) {
        size_t max = d->stop_len[i] - 1;
        if (max > d->text.len)
            max = d->text.len;
        for (size_t l = max; l > keep; l--) {
            if (memcmp(d->text.p + d->text.len - l, d->stops[i], l) == 0) {
                keep = l;
                break;
            }
        }
    }
    /* Never split a character, even for a stop string that is not valid UTF-8. */
    while (keep < d->text.len && ((unsigned char)d->text.p[d->text.len - keep] & 0xc0) == 0x80)
        keep++;
    return keep;
}

/* Moves text[0..n) to out and drops it from text. */
static size_t release(struct sl_detok *d, size_t n, struct sl_str *out)
{
    if (n == 0)
        return 0;
    sl_str_append(out, d->text.p, n);
    memmove(d->text.p, d->text.p + n, d->text.len - n);
    d->text.len -= n;
    d->text.p[d->text.len] = '\0';
    return n;
}

/* Releases what can no longer be part of a stop string, or everything before a completed one. */
static size_t settle(struct sl_detok *d, struct sl_str *out, bool final, bool *stopped)
{
    size_t len = 0;
    int which = -1;
    ptrdiff_t at = d->pushed > d->min_tokens ? find_stop(d, &len, &which) : -1;
    if (at >= 0) {
        d->hit = d->stop_arg[which];
        size_t n = release(d, (size_t)at + (d->include_stop ? len : 0), out);
        sl_str_clear(&d->text);
        d->stopped = true;
        if (stopped)
            *stopped = true;
        return n;
    }
    size_t keep = final ? 0 : stop_prefix_tail(d);
    return release(d, d->text.len - keep, out);
}

size_t sl_detok_push(struct sl_detok *d, int32_t token, struct sl_str *out, bool *stopped)
{
    if (d->stopped) {
        if (stopped)
            *stopped = true;
        return 0;
    }
    size_t n;
    const char *piece;
    if (!d->keep_special || !sl_tok_special_text(d->tok, token, &piece, &n))
        piece = sl_tok_decode(d->tok, d->prev, token, &n);
    d->prev = token;
    d->pushed++;
    sl_str_append(&d->raw, piece, n);
    size_t done = sl_utf8_complete_prefix(d->raw.p, d->raw.len);
    if (done > 0) {
        sl_utf8_sanitize(&d->text, d->raw.p, done);
        memmove(d->raw.p, d->raw.p + done, d->raw.len - done);
        d->raw.len -= done;
        d->raw.p[d->raw.len] = '\0';
    }
    return settle(d, out, false, stopped);
}

size_t sl_detok_finish(struct sl_detok *d, struct sl_str *out)
{
    if (d->stopped)
        return 0;
    if (d->raw.len > 0) {
        sl_utf8_sanitize(&d->text, d->raw.p, d->raw.len);
        sl_str_clear(&d->raw);
    }
    size_t n = settle(d, out, true, NULL);
    d->stopped = true; /* the sequence is over: later pushes are ignored */
    return n;
}
