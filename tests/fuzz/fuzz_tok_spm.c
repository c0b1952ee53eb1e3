/* Fuzz target: the SentencePiece-style tokenizer (worker/tokenizer.c, llama2.c and GGUF "llama"
 * vocabularies) and the incremental detokenizer (worker/detok.c), on arbitrary bytes. Two
 * vocabularies: the synthetic one of the synthetic models, and a small GGUF-style one built with
 * sl_tok_from_spm (byte pieces, "▁" pieces, merges by score, control tokens).
 *
 * Input: byte 0 picks the vocabulary and the mode; byte 1 the length of a stop string taken from
 * the front of the rest. Text mode: the rest is text to encode; invalid UTF-8 must be refused,
 * valid UTF-8 must decode back to itself exactly (both vocabularies have every byte), and the
 * detokenizer must give that text up to the first stop string. Id mode: the rest is a sequence
 * of 16-bit ids (some outside the vocabulary) to decode and detokenize, whose output must be
 * valid UTF-8 and must not contain the stop string. */
#include "fuzz_model.h"

static struct sl_tok *toks[2];

static struct sl_tok *small_spm(void)
{
    static const char *const words[] = {
        "\xe2\x96\x81",
        "a",
        "b",
        "\xe2\x96\x81"
        "a",
        "ab",
        "\xe2\x96\x81"
        "ab",
        "\xc3\xa9",
        "\xe2\x96\x81\xc3\xa9",
        "ba",
        "aba",
        "\xe2\x96\x81\xe2\x96\x81",
        "<|im_start|>",
    };
    enum { N_WORDS = sizeof words / sizeof words[0], N = 3 + 256 + N_WORDS };
    const char *pieces[N];
    uint64_t lens[N];
    float scores[N];
    int32_t types[N];
    char bytes[256][8];
    pieces[0] = "<unk>", pieces[1] = "<s>", pieces[2] = "</s>";
    for (int i = 0; i < 3; i++)
        types[i] = i == 0 ? 2 : 3;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        pieces[3 + b] = bytes[b];
        types[3 + b] = 6;
    }
    for (int w = 0; w < N_WORDS; w++) {
        pieces[259 + w] = words[w];
        types[259 + w] = w == N_WORDS - 1 ? 3 : 1;
    }
    for (int i = 0; i < N; i++) {
        lens[i] = strlen(pieces[i]);
        scores[i] = i < 259 ? 0.0f : -(float)(i - 259);
    }
    char err[256];
    struct sl_tok *t = sl_tok_from_spm(N, pieces, lens, scores, types, 1, err, sizeof err);
    if (!t) {
        fprintf(stderr, "fuzz_tok_spm: %s\n", err);
        abort();
    }
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    toks[0] = sl_tok_synthetic(512);
    toks[1] = small_spm();
    return 0;
}

/* Text mode: the exact round trip, then the detokenizer with the stop string. */
static void text_mode(const struct sl_tok *t, const char *text, size_t len, const char *stop)
{
    fuzz_tok_roundtrip(t, text, len, stop[0] ? &stop : NULL, stop[0] ? 1 : 0);
    int max = (int)len + 2;
    int32_t *ids = malloc(sizeof *ids * (size_t)max);
    int n = 0;
    if (sl_tok_encode(t, text, len, true, ids, max, &n) == SL_OK) {
        fuzz_check(n >= 1 && ids[0] == sl_tok_bos(t), "no BOS first");
        struct sl_str back;
        sl_str_init(&back);
        for (int i = 1; i < n; i++) {
            size_t l;
            const char *p = sl_tok_decode(t, ids[i - 1], ids[i], &l);
            sl_str_append(&back, p, l);
        }
        fuzz_check(back.len == len && (len == 0 || memcmp(back.p, text, len) == 0),
                   "decode(encode(text)) differs from the text (%zu vs %zu bytes)", back.len, len);
        /* Without a stop string the detokenizer releases exactly that text. */
        struct sl_detok *d = sl_detok_new(t, ids[0], NULL, 0);
        struct sl_str out;
        sl_str_init(&out);
        bool stopped = false;
        for (int i = 1; i < n; i++)
            sl_detok_push(d, ids[i], &out, &stopped);
        sl_detok_finish(d, &out);
        fuzz_check(!stopped && out.len == len && (len == 0 || memcmp(out.p, text, len) == 0),
                   "the detokenizer does not release the text");
        sl_str_dispose(&out);
        sl_detok_free(d);
        sl_str_dispose(&back);
    }
    free(ids);
}

/* Id mode: any id sequence detokenizes to valid UTF-8 that stops before the stop string. */
static void id_mode(const struct sl_tok *t, const uint8_t *p, size_t len, const char *stop)
{
    int vocab = sl_tok_vocab_size(t);
    struct sl_detok *d = sl_detok_new(t, sl_tok_bos(t), stop[0] ? &stop : NULL, stop[0] ? 1 : 0);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    for (size_t i = 0; i + 1 < len; i += 2) {
        int32_t id = (int32_t)((p[i] | p[i + 1] << 8) % (vocab + 4)) - 2;
        size_t n = sl_detok_push(d, id, &out, &stopped);
        fuzz_check(!stopped || n <= out.len, "pushed more than the output");
    }
    sl_detok_finish(d, &out);
    struct sl_str clean;
    sl_str_init(&clean);
    sl_utf8_sanitize(&clean, out.p ? out.p : "", out.len);
    fuzz_check(clean.len == out.len && (out.len == 0 || memcmp(clean.p, out.p, out.len) == 0),
               "detokenized ids are not valid UTF-8");
    /* A stop that is not valid UTF-8 is ignored (it could only match inside a character). */
    sl_str_clear(&clean);
    sl_utf8_sanitize(&clean, stop, strlen(stop));
    bool valid = clean.len == strlen(stop) && memcmp(clean.p ? clean.p : "", stop, clean.len) == 0;
    if (stop[0] && valid && out.len)
        fuzz_check(memmem(out.p, out.len, stop, strlen(stop)) == NULL,
                   "the stop string was released");
    sl_str_dispose(&clean);
    sl_str_dispose(&out);
    sl_detok_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const struct sl_tok *t = toks[data[0] & 1];
    bool ids = data[0] & 2;
    size_t sl = data[1] % 8;
    if (sl > size - 2)
        sl = size - 2;
    char stop[8];
    memcpy(stop, data + 2, sl);
    stop[sl] = '\0';
    const uint8_t *rest = data + 2 + sl;
    size_t len = size - 2 - sl;
    if (ids)
        id_mode(t, rest, len, stop);
    else
        text_mode(t, (const char *)rest, len, stop);
    return 0;
}
