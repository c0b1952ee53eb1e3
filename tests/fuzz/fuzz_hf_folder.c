/* Fuzz target: a Hugging Face folder as sl_model_load reads it (worker/hf.c): config.json (shape,
 * RoPE, biases, eos_token_id), tokenizer_config.json (chat_template as a string or a named list)
 * and generation_config.json, next to a fixed model.safetensors and tokenizer.json of the shape
 * the seed corpus's config.json gives. A folder is refused with a message, or loaded, and then
 * every weight is read whole.
 *
 * Input: config.json, "\n==tokenizer_config.json==\n", tokenizer_config.json,
 * "\n==generation_config.json==\n", generation_config.json (an empty part: no such file). */
#include "fuzz_model.h"
#include "gateway_impl.h"

#include <fcntl.h>
#include <sys/stat.h>

#define SEP1 "\n==tokenizer_config.json==\n"
#define SEP2 "\n==generation_config.json==\n"

/* The safetensors shape: hidden 8, intermediate 16, 1 layer, 2 heads, 1 KV head, vocab 300,
 * tied embeddings (only model.embed_tokens.weight is stored). */
enum { DIM = 8, HID = 16, KV = 4, VOCAB = 300 };

static char dir[64];

static void put_file(const char *name, const void *data, size_t len)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (len == 0) {
        unlink(path);
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    fuzz_check(fd >= 0, "cannot write %s", path);
    fuzz_check(write(fd, data, len) == (ssize_t)len, "short write to %s", path);
    close(fd);
}

static void add_tensor(struct sl_str *h, size_t *off, const char *name, int rows, int cols)
{
    size_t bytes = (size_t)(rows ? rows : 1) * (size_t)cols * 4;
    if (rows)
        sl_str_appendf(h,
                       "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}",
                       h->len > 1 ? "," : "", name, rows, cols, *off, *off + bytes);
    else
        sl_str_appendf(h, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]}",
                       h->len > 1 ? "," : "", name, cols, *off, *off + bytes);
    *off += bytes;
}

static void write_safetensors(void)
{
    struct sl_str h;
    sl_str_init(&h);
    sl_str_append(&h, "{", 1);
    size_t off = 0;
    add_tensor(&h, &off, "model.embed_tokens.weight", VOCAB, DIM);
    add_tensor(&h, &off, "model.norm.weight", 0, DIM);
    add_tensor(&h, &off, "model.layers.0.input_layernorm.weight", 0, DIM);
    add_tensor(&h, &off, "model.layers.0.post_attention_layernorm.weight", 0, DIM);
    add_tensor(&h, &off, "model.layers.0.self_attn.q_proj.weight", DIM, DIM);
    add_tensor(&h, &off, "model.layers.0.self_attn.k_proj.weight", KV, DIM);
    add_tensor(&h, &off, "model.layers.0.self_attn.v_proj.weight", KV, DIM);
    add_tensor(&h, &off, "model.layers.0.self_attn.o_proj.weight", DIM, DIM);
    add_tensor(&h, &off, "model.layers.0.mlp.gate_proj.weight", HID, DIM);
    add_tensor(&h, &off, "model.layers.0.mlp.down_proj.weight", DIM, HID);
    add_tensor(&h, &off, "model.layers.0.mlp.up_proj.weight", HID, DIM);
    sl_str_append(&h, "}", 1);
    while (h.len % 8)
        sl_str_append(&h, " ", 1);
    struct sl_str f;
    sl_str_init(&f);
    uint64_t hl = h.len;
    sl_str_append(&f, &hl, 8);
    sl_str_append(&f, h.p, h.len);
    float *body = calloc(off / 4, sizeof *body);
    for (size_t i = 0; i < off / 4; i++)
        body[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    sl_str_append(&f, body, off);
    free(body);
    put_file("model.safetensors", f.p, f.len);
    sl_str_dispose(&h);
    sl_str_dispose(&f);
}

static void remove_dir(void)
{
    static const char *const names[] = {"config.json", "tokenizer_config.json",
                                        "generation_config.json", "model.safetensors",
                                        "tokenizer.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        put_file(names[i], "", 0);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    sl_log_set_level(SL_LOG_ERROR);
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/sluice-fuzz-hf-XXXXXX", base);
    fuzz_check(mkdtemp(dir) != NULL, "mkdtemp");
    atexit(remove_dir);
    write_safetensors();
    /* A small tokenizer.json: it is parsed on every input, and tok_hf fuzzes it on its own. */
    static const char tok[] =
        "{\"added_tokens\":[{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
        "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},"
        "\"content\":\"\\u2581\"},\"pre_tokenizer\":null,\"model\":{\"type\":\"BPE\","
        "\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"\\u2581\":3,"
        "\"a\":4,\"\\u2581a\":5},\"merges\":[\"\\u2581 a\"]}}";
    put_file("tokenizer.json", tok, sizeof tok - 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *cfg, *rest, *tc, *gen;
    size_t cfglen, restlen, tclen, genlen;
    fuzz_split(data, size, SEP1, &cfg, &cfglen, &rest, &restlen);
    fuzz_split(rest, restlen, SEP2, &tc, &tclen, &gen, &genlen);
    put_file("config.json", cfg, cfglen);
    put_file("tokenizer_config.json", tc, tclen);
    put_file("generation_config.json", gen, genlen);
    struct sl_model *m = NULL;
    char err[512];
    err[0] = '\0';
    int st = sl_model_load(dir, NULL, &m, err, sizeof err);
    if (st != SL_OK) {
        fuzz_note("refused", err);
        fuzz_check(err[0] != '\0' && m == NULL, "refused without a message");
        return 0;
    }
    fuzz_note("accepted", "");
    fuzz_model_touch(m);
    fuzz_check(sl_tok_vocab_size(m->tok) <= m->cfg.vocab_size, "tokenizer larger than the model");
    for (int i = 0; i < m->n_stop_tokens; i++)
        fuzz_check(m->stop_tokens[i] >= 0 && m->stop_tokens[i] < m->cfg.vocab_size, "stop token %d",
                   (int)m->stop_tokens[i]);
    const char *tmpl = sl_model_chat_template(m);
    fuzz_check(tmpl == NULL || tmpl[0] != '\0', "an empty chat template");
    (void)sl_chat_template_detect(tmpl);
    sl_model_free(m);
    return 0;
}
