/* Fuzz target: the llama2.c loaders (worker/model.c): the checkpoint's 7-int32 header and the
 * weight table it implies against the file's size, and tokenizer.bin (max_token_length, then a
 * score and a length-prefixed piece per token). Both go through sl_model_load as the server
 * loads them, from in-memory files. A pair is refused with a message, or accepted, and then every
 * weight is read whole and the tokenizer encodes, decodes and detokenizes.
 *
 * Input: the checkpoint, the separator "\n==tokenizer.bin==\n", then tokenizer.bin. */
#include "fuzz_model.h"

#define SEP "\n==tokenizer.bin==\n"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    sl_log_set_level(SL_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *ck, *tk;
    size_t cklen, tklen;
    fuzz_split(data, size, SEP, &ck, &cklen, &tk, &tklen);
    char ckpath[64], tkpath[64], err[512];
    int ckfd = fuzz_memfd(ck, cklen, ckpath, sizeof ckpath);
    int tkfd = fuzz_memfd(tk, tklen, tkpath, sizeof tkpath);
    fuzz_check(ckfd >= 0 && tkfd >= 0, "memfd_create failed");
    struct sl_model *m = NULL;
    err[0] = '\0';
    int st = sl_model_load(ckpath, tkpath, &m, err, sizeof err);
    close(ckfd);
    close(tkfd);
    if (st != SL_OK) {
        fuzz_note("refused", err);
        fuzz_check(err[0] != '\0' && m == NULL, "refused without a message");
        return 0;
    }
    fuzz_note("accepted", "");
    fuzz_model_touch(m);
    fuzz_check(sl_tok_vocab_size(m->tok) == m->cfg.vocab_size, "vocab %d, model %d",
               sl_tok_vocab_size(m->tok), m->cfg.vocab_size);
    fuzz_tok_decode_all(m->tok);
    static const char text[] = "Once upon a time, \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80 end";
    static const char *const stops[] = {"time", "\xc3\xa9"};
    fuzz_tok_roundtrip(m->tok, text, sizeof text - 1, stops, 2);
    sl_model_free(m);
    return 0;
}
