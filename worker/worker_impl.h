/* Private layouts of the worker module; its tests may include this header. */
#ifndef SLUICE_WORKER_IMPL_H
#define SLUICE_WORKER_IMPL_H

#include <sluice/kernels.h>
#include <sluice/worker.h>

/* Views into one contiguous fp32 block laid out exactly like a llama2.c legacy checkpoint after
 * its header. Matrices are (out, in), so a row of W is one output feature. */
struct sl_llama2c_weights {
    const float *token_embedding; /* (vocab, dim) */
    const float *rms_att;         /* (layer, dim) */
    const float *wq;              /* (layer, n_heads * head_size, dim) */
    const float *wk;              /* (layer, n_kv_heads * head_size, dim) */
    const float *wv;              /* (layer, n_kv_heads * head_size, dim) */
    const float *wo;              /* (layer, dim, n_heads * head_size) */
    const float *rms_ffn;         /* (layer, dim) */
    const float *w1;              /* (layer, hidden_dim, dim) gate */
    const float *w2;              /* (layer, dim, hidden_dim) down */
    const float *w3;              /* (layer, hidden_dim, dim) up */
    const float *rms_final;       /* (dim) */
    const float *wcls;            /* (vocab, dim); == token_embedding when shared */
};

/* Number of floats of the legacy checkpoint body (weights and the skipped freq_cis blocks) for a
 * config; 0 when the shape is out of the bounds the loader accepts. */
uint64_t sl_model_body_floats(const struct sl_model_config *c);

/* Points w into body (sl_model_body_floats(c) floats). */
void sl_model_llama2c_map(struct sl_llama2c_weights *w, const struct sl_model_config *c,
                          const float *body);

/* One transformer layer. Norm weights are always fp32 (loaders convert them); projections keep
 * the file's type. RoPE layout: llama2.c's interleaved pairs (loaders of HF-layout q/k weights
 * permute rows at load, as llama.cpp's converter does). */
struct sl_layer_weights {
    const float *rms_att; /* (dim) */
    const float *rms_ffn; /* (dim) */
    struct sl_mat wq;     /* (n_heads * head_size, dim) */
    struct sl_mat wk;     /* (n_kv_heads * head_size, dim) */
    struct sl_mat wv;     /* (n_kv_heads * head_size, dim) */
    struct sl_mat wo;     /* (dim, n_heads * head_size) */
    struct sl_mat w1;     /* (hidden_dim, dim) gate */
    struct sl_mat w2;     /* (dim, hidden_dim) down */
    struct sl_mat w3;     /* (hidden_dim, dim) up */
};

/* What the forward pass reads, whatever the file format. */
struct sl_model_weights {
    struct sl_mat token_embedding;   /* (vocab, dim); rows are looked up, then dequantized */
    struct sl_layer_weights *layers; /* (n_layers), owned by the model */
    const float *rms_final;          /* (dim) */
    struct sl_mat wcls;              /* (vocab, dim); may alias token_embedding (tied) */
};

#define SL_MODEL_MAX_STOP 8

struct sl_model {
    struct sl_model_config cfg;
    struct sl_model_weights w;
    char *id;
    struct sl_tok *tok;
    int32_t stop_tokens[SL_MODEL_MAX_STOP]; /* sampling one of these ends a sequence */
    int n_stop_tokens;
    void *map;      /* mmap'd file, or NULL */
    size_t map_len; /* bytes of map */
    void *
        *allocs; /* buffers the model owns (synthetic weights, converted tensors), freed with it */
    int n_allocs, cap_allocs;
};

/* Hands buf to m (freed by sl_model_free) and returns it. */
void *sl_model_own(struct sl_model *m, void *buf);

/* Format loaders, called by sl_model_load on a zeroed model. Each fills cfg, w, tok, id and the
 * stop tokens, or returns a negative status with err naming the file and what is wrong. */
int sl_model_load_gguf(struct sl_model *m, const char *path, char *err, size_t errlen);
/* dir: a Hugging Face folder with config.json, model.safetensors and tokenizer.json. */
int sl_model_load_hf(struct sl_model *m, const char *dir, char *err, size_t errlen);

struct sl_tok_entry {
    const char *s; /* piece bytes (not NUL-terminated) */
    uint32_t len;
    int32_t id;
};

struct sl_tok {
    int vocab_size;
    int max_token_length;        /* longest piece in bytes */
    char *blob;                  /* all pieces back to back, each followed by a NUL */
    const char **pieces;         /* (vocab) piece start in blob */
    uint32_t *piece_len;         /* (vocab) piece bytes */
    float *scores;               /* (vocab) merge scores: higher merges first */
    struct sl_tok_entry *sorted; /* (vocab) pieces in byte order, for bsearch */
    int16_t *byte_piece;         /* (vocab) raw byte a "<0xAB>" piece stands for, -1 otherwise */
    unsigned char bytes[256];    /* bytes[b] == b: storage that decode of "<0xAB>" points into */
    int32_t space_id;            /* id of " " (the dummy prefix), -1 when absent */
};

/* Parses a llama2.c tokenizer.bin image of `vocab` entries. On failure returns NULL and writes a
 * reason (without the file name) into err. */
struct sl_tok *sl_tok_parse(const unsigned char *data, size_t len, int vocab, char *err,
                            size_t errlen);
/* Builds the deterministic synthetic tokenizer of `vocab` entries (vocab >= 512). */
struct sl_tok *sl_tok_synthetic(int vocab);
void sl_tok_free(struct sl_tok *t);
/* Id of the piece with exactly these bytes, or -1. */
int32_t sl_tok_lookup(const struct sl_tok *t, const char *s, size_t len);

/* The CPU backend's context. Every buffer is sized at init from sl_backend_opts. */
struct sl_cpu_ctx {
    const struct sl_model *m;
    struct sl_model_config cfg;
    struct sl_backend_opts o;
    int head_size;
    int kv_dim; /* n_kv_heads * head_size */
    struct sl_cpu_pool *pool;
    /* activations, T = max_batch_tokens rows */
    float *x;   /* (T, dim) residual stream */
    float *xb;  /* (T, dim) normed input / attention output */
    float *xb2; /* (T, dim) projection output */
    float *q;   /* (T, n_heads * head_size) */
    float *k;   /* (T, kv_dim) */
    float *v;   /* (T, kv_dim) */
    float *hb;  /* (T, hidden_dim) */
    float *hb2; /* (T, hidden_dim) */
    float *att; /* (seq_len) scores of one head of one row */
    float *xl;  /* (T, dim) final-normed rows that want logits */
    /* paged KV pool, fp32 */
    float *key_cache;   /* (n_kv_blocks, layer, block_size, kv_dim) */
    float *value_cache; /* (n_kv_blocks, layer, block_size, kv_dim) */
    size_t kv_bytes;
};

#endif
