/* Fuzz target: the GGUF loader (sl_model_gguf_parse, worker/gguf.c): header, metadata, the
 * vocabulary, hyper-parameters and the tensor table, over the input as the mapped file. A file is
 * refused with a message naming it, or accepted; an accepted model's weights are read whole and
 * its tokenizer encodes, decodes and detokenizes. */
#include "fuzz_model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    sl_log_set_level(SL_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sl_model *m = sl_xcalloc(1, sizeof *m);
    char err[512];
    err[0] = '\0';
    int st = sl_model_gguf_parse(m, data, size, "fuzz.gguf", err, sizeof err);
    if (st != SL_OK) {
        fuzz_note("refused", err);
        fuzz_check(strncmp(err, "fuzz.gguf: ", 11) == 0, "message does not name the file: %s", err);
    } else {
        fuzz_model_touch(m);
        fuzz_note("accepted", "");
        fuzz_check(m->tok != NULL, "no tokenizer");
        fuzz_check(sl_tok_vocab_size(m->tok) == m->cfg.vocab_size, "vocab %d, model %d",
                   sl_tok_vocab_size(m->tok), m->cfg.vocab_size);
        fuzz_tok_decode_all(m->tok);
        static const char text[] = "Once upon a time, \xc3\xa9t\xc3\xa9 <s> \xe2\x96\x81 end";
        fuzz_tok_roundtrip(m->tok, text, sizeof text - 1, NULL, 0);
    }
    sl_model_free(m);
    return 0;
}
