/* Fuzz target: the Hugging Face tokenizer (worker/tok_hf.c parses tokenizer.json, the HF BPE path
 * of worker/tokenizer.c encodes). Input byte 0 picks the mode:
 *   parse:  the rest is a tokenizer.json; one that is accepted must decode every id and encode,
 *           decode and detokenize a fixed text (ids in range, output valid UTF-8);
 *   encode: the rest is text for a fixed tokenizer.json with added tokens (special and not,
 *           normalized and not), byte fallback, <unk> fusing and ranked merges; invalid UTF-8
 *           must be refused, and the detokenized ids must be valid UTF-8;
 *   ids:    the rest is a sequence of 16-bit ids to decode and detokenize. */
#include "fuzz_model.h"

static struct sl_tok *fixed;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    char *json = fuzz_hf_tokenizer_json();
    char err[256];
    fixed = sl_tok_hf_parse(json, strlen(json), -1, err, sizeof err);
    if (!fixed) {
        fprintf(stderr, "fuzz_tok_hf: the fixed tokenizer.json does not load: %s\n", err);
        abort();
    }
    free(json);
    return 0;
}

static void id_mode(const struct sl_tok *t, const uint8_t *p, size_t len)
{
    int vocab = sl_tok_vocab_size(t);
    static const char *const stops[] = {"ab", "\xc3\xa9"};
    struct sl_detok *d = sl_detok_new(t, sl_tok_bos(t), stops, 2);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    for (size_t i = 0; i + 1 < len; i += 2)
        sl_detok_push(d, (int32_t)((p[i] | p[i + 1] << 8) % (vocab + 4)) - 2, &out, &stopped);
    sl_detok_finish(d, &out);
    struct sl_str clean;
    sl_str_init(&clean);
    sl_utf8_sanitize(&clean, out.p ? out.p : "", out.len);
    fuzz_check(clean.len == out.len && (out.len == 0 || memcmp(clean.p, out.p, out.len) == 0),
               "detokenized ids are not valid UTF-8");
    sl_str_dispose(&clean);
    sl_str_dispose(&out);
    sl_detok_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t len = size - 1;
    switch (data[0] % 3) {
    case 0: {
        char err[256];
        err[0] = '\0';
        struct sl_tok *t = sl_tok_hf_parse(rest, len, (data[0] & 8) ? 1 : -1, err, sizeof err);
        if (!t) {
            fuzz_note("refused", err);
            fuzz_check(err[0] != '\0', "refused without a message");
            return 0;
        }
        fuzz_note("accepted", "");
        fuzz_tok_decode_all(t);
        static const char text[] = "hello  world <|im_start|>\xc3\xa9 ab\xf0\x9f\x98\x80 <s>";
        fuzz_tok_roundtrip(t, text, sizeof text - 1, NULL, 0);
        uint8_t idbuf[64];
        for (size_t i = 0; i < sizeof idbuf; i++)
            idbuf[i] = (uint8_t)(i * 37 + data[0]);
        id_mode(t, idbuf, sizeof idbuf);
        sl_tok_free(t);
        break;
    }
    case 1: {
        static const char *const stops[] = {"lo", " \xc3\xa9"};
        fuzz_tok_roundtrip(fixed, rest, len, stops, 2);
        break;
    }
    default: id_mode(fixed, (const uint8_t *)rest, len); break;
    }
    return 0;
}
