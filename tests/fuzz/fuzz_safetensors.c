/* Fuzz target: the safetensors loader (sl_model_safetensors_parse, worker/hf.c): the 8-byte
 * header length, the JSON header (dtypes, shapes, data offsets, __metadata__ aliases) and the
 * tensor table against a model shape that config.json would have given. A file is refused with a
 * message naming it, or accepted, and then every weight it points at is read whole.
 *
 * Input: byte 0 picks the shape (and whether embeddings are tied), the rest is the file. */
#include "fuzz_model.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    sl_log_set_level(SL_LOG_ERROR);
    return 0;
}

/* The shapes of the seed corpus (tests/fuzz/gen_corpus.py). */
static const struct sl_model_config shapes[] = {
    {.dim = 8,
     .hidden_dim = 16,
     .n_layers = 1,
     .n_heads = 2,
     .n_kv_heads = 1,
     .vocab_size = 8,
     .seq_len = 16,
     .rms_eps = 1e-5f,
     .rope_theta = 10000.0f},
    {.dim = 8,
     .hidden_dim = 8,
     .n_layers = 2,
     .n_heads = 2,
     .n_kv_heads = 2,
     .vocab_size = 4,
     .seq_len = 8,
     .rms_eps = 1e-5f,
     .rope_theta = 10000.0f},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct sl_model *m = sl_xcalloc(1, sizeof *m);
    m->cfg = shapes[data[0] % 2];
    m->cfg.shared_classifier = data[0] & 2;
    char err[512];
    err[0] = '\0';
    int st = sl_model_safetensors_parse(m, data + 1, size - 1, "fuzz.safetensors", err, sizeof err);
    if (st != SL_OK) {
        fuzz_note("refused", err);
        fuzz_check(strncmp(err, "fuzz.safetensors: ", 18) == 0,
                   "message does not name the file: %s", err);
    } else {
        fuzz_note("accepted", "");
        fuzz_model_touch(m);
    }
    sl_model_free(m);
    return 0;
}
