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
    char *chat_template; /* Jinja chat template from the model's files, or NULL */
    int32_t stop_tokens[SL_MODEL_MAX_STOP]; /* sampling one of these ends a sequence */
    int n_stop_tokens;
    void *map;      /* mmap'd file, or NULL */
    size_t map_len; /* bytes of map */
    void *
        *allocs; /* buffers the model owns (synthetic weights, converted tensors), freed with it */
    int n_allocs, cap_allocs;
};

/* mmaps the regular file at path read-only into m->map (sl_model_free unmaps it, also after a
 * later failure); files shorter than min_len are refused as truncated. */
int sl_model_map_file(struct sl_model *m, const char *path, size_t min_len, char *err,
                      size_t errlen);
/* Reads a whole file of at most max_len bytes into a NUL-terminated buffer the caller frees. */
int sl_model_read_file(const char *path, size_t max_len, char **data, size_t *len, char *err,
                       size_t errlen);
/* True when every weight matrix has the shape the config says (any element type): what a
 * backend checks before it runs the model. */
bool sl_model_weights_ok(const struct sl_model *m);
/* The served id of a model file: its base name without `suffix` ("a/b.gguf" → "b"). */
char *sl_model_id_from_path(const char *path, const char *suffix);

/* Hands buf to m (freed by sl_model_free) and returns it. */
void *sl_model_own(struct sl_model *m, void *buf);

/* Format loaders, called by sl_model_load on a zeroed model. Each fills cfg, w, tok, id and the
 * stop tokens, or returns a negative status with err naming the file and what is wrong. */
int sl_model_load_gguf(struct sl_model *m, const char *path, char *err, size_t errlen);
/* dir: a Hugging Face folder with config.json, model.safetensors and tokenizer.json. */
int sl_model_load_hf(struct sl_model *m, const char *dir, char *err, size_t errlen);

enum sl_tok_kind {
    /* llama2.c tokenizer.bin and GGUF "llama" vocabularies: a dummy-prefix space, merges of any
     * two adjacent pieces whose concatenation is a piece, highest score first. */
    SL_TOK_KIND_LLAMA2C,
    /* Hugging Face tokenizers BPE: added tokens split the input first, the normalizer prepends
     * "▁" and turns spaces into "▁", and only listed merges apply, lowest rank first. */
    SL_TOK_KIND_HF_BPE,
};

/* One listed HF merge: left ‖ right → merged, applied in rank order (0 first). */
struct sl_tok_merge {
    int32_t left, right; /* -1 left marks an empty slot of the hash table */
    int32_t rank;
    int32_t merged;
};

/* An HF added token: matched in the input before BPE runs. */
struct sl_tok_added {
    const char *s; /* content bytes, points into the tokenizer's blob */
    uint32_t len;
    int32_t id;
    bool normalized; /* matched in the normalized text rather than the raw input */
};

/* Pieces are stored as the text they decode to: a SentencePiece/HF "▁" (U+2581) is stored as a
 * space, which is what the llama2.c format stores too. */
struct sl_tok {
    enum sl_tok_kind kind;
    int vocab_size;
    int max_token_length; /* longest piece in bytes */
    char *blob;           /* all pieces back to back, each followed by a NUL */
    const char **pieces;  /* (vocab) piece start in blob */
    uint32_t *piece_len;  /* (vocab) piece bytes */
    float *scores;        /* (vocab) merge scores: higher merges first */
    /* The pieces by their bytes: an open-addressed hash table of index_mask + 1 slots (at least
     * twice the vocabulary), each 0 or a piece's id + 1; a piece spelled twice has its lowest id
     * there. */
    uint32_t *index;
    uint32_t index_mask;
    int16_t *byte_piece;      /* (vocab) raw byte a "<0xAB>" piece stands for, -1 otherwise */
    unsigned char bytes[256]; /* bytes[b] == b: storage that decode of "<0xAB>" points into */
    int32_t space_id;         /* id of " " (the dummy prefix), -1 when absent */
    int32_t bos_id;           /* prepended by encode(bos); decode drops a space after it */
    int32_t byte_id[256];     /* id of the "<0xAB>" piece of byte b, -1 when absent */
    uint8_t *special;         /* (vocab) or NULL: 1 for control tokens, which decode to "" */
    int32_t unk_id;           /* id for characters outside the vocab, -1 = drop them */
    /* SL_TOK_KIND_HF_BPE only */
    bool byte_fallback;          /* a character's "<0xAB>" ids, when all exist, before <unk> */
    bool fuse_unk;               /* consecutive unknown characters give one <unk> */
    bool ignore_merges;          /* a whole word that is a piece is taken as is */
    bool prepend_space;          /* normalizer prepends "▁" to every non-empty segment */
    bool strip_leading;          /* decoder strips one leading space (applied after BOS) */
    struct sl_tok_merge *merges; /* (merge_mask + 1) open-addressing table by (left, right) */
    size_t merge_mask;
    struct sl_tok_added *added; /* (n_added) longest first */
    int n_added;
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

/* Builds a SL_TOK_KIND_LLAMA2C tokenizer from SentencePiece pieces as GGUF stores them: pieces[i]
 * (lens[i] bytes, "▁" for a space), scores (NULL: all 0), GGUF token types (NULL: all normal; 3 =
 * control decodes to ""). Returns NULL with a reason in err when the vocabulary is empty, a
 * piece is longer than 64 KiB or a score is not finite. */
struct sl_tok *sl_tok_from_spm(int vocab, const char *const *pieces, const uint64_t *lens,
                               const float *scores, const int32_t *types, int32_t bos_id, char *err,
                               size_t errlen);
/* Parses a Hugging Face tokenizer.json (BPE model, Prepend/Replace normalizer, no
 * pre-tokenizer). bos_id: the id encode(bos) prepends (-1: from the post-processor template).
 * Returns NULL with a reason (without the file name) in err for anything it does not support. */
struct sl_tok *sl_tok_hf_parse(const char *json, size_t len, int32_t bos_id, char *err,
                               size_t errlen);
/* Shared by the tokenizer builders: zeroed tables for `vocab` pieces, then the derived indexes
 * once blob, pieces, piece_len and scores are filled. */
struct sl_tok *sl_tok_alloc(int vocab);
void sl_tok_index(struct sl_tok *t);
/* Copies len bytes to dst with every "▁" (U+2581) turned into a space; returns bytes written. */
size_t sl_tok_unescape(char *dst, const char *src, size_t len);
/* Enters the HF merge left ‖ right → merged of this rank in t->merges (a later duplicate pair
 * replaces the earlier one, as tokenizers' map does). The table must have a free slot. */
void sl_tok_merge_add(struct sl_tok *t, int32_t a, int32_t b, int32_t rank, int32_t merged);

/* GGUF and safetensors images already in memory (the loaders mmap the file; tests feed buffers
 * directly). `name` is the file name used in messages. Neither takes ownership of data, which
 * must outlive m: the weights point into it. */
int sl_model_gguf_parse(struct sl_model *m, const void *data, size_t len, const char *name,
                        char *err, size_t errlen);
/* Fills m->w from a safetensors image for the shape already in m->cfg (from config.json). */
int sl_model_safetensors_parse(struct sl_model *m, const void *data, size_t len, const char *name,
                               char *err, size_t errlen);
/* IEEE half and bfloat16 to fp32, and one row of any weight type to fp32. */
float sl_model_f16_to_f32(uint16_t h);
float sl_model_bf16_to_f32(uint16_t h);
void sl_model_row_to_f32(enum sl_dtype t, const void *row, float *out, int cols);
/* A borrowed tensor as a matrix; copied into a model-owned buffer only when data is not aligned
 * for its type. */
struct sl_mat sl_model_mat_place(struct sl_model *m, enum sl_dtype t, const void *data, int rows,
                                 int cols);
/* A norm weight (n) as aligned fp32: data itself when it already is, else a model-owned copy. */
const float *sl_model_norm_f32(struct sl_model *m, enum sl_dtype t, const void *data, int n);

/* Checks everything a forward reads before any of it is used, so that a bad batch changes
 * nothing: SL_OK, or SL_EINVAL for a batch over the limits of o or of the model (shared by the
 * backends). */
int sl_worker_batch_check(const struct sl_batch *b, const struct sl_model_config *cfg,
                          const struct sl_backend_opts *o);

/* CUDA backend helpers (worker/cuda_backend.c; only in a build with CUDA). */
/* Checks that CUDA device `index` exists and can run this build's code; fills out (when not
 * NULL) with its backend, name and free memory. Otherwise returns SL_ENOENT with the reason in
 * why, starting "no CUDA device" when the driver or device is absent. */
int sl_cuda_device_probe(int index, struct sl_worker_device *out, char *why, size_t whylen);
/* Device bytes the CUDA backend allocates for m with these limits, KV pool excepted, plus a
 * margin for the CUDA context. */
size_t sl_cuda_backend_mem_need(const struct sl_model *m, int max_batch_tokens, int max_seqs);

/* The backend context of w when w runs on ops, else NULL (for backend-private calls such as
 * sl_worker_bench_profile). */
void *sl_worker_backend_ctx(struct sl_worker *w, const struct sl_backend_ops *ops);

/* The CPU backend's context. Every buffer is sized at init from sl_backend_opts. */
#define SL_CPU_MAX_BUFS 16

struct sl_cpu_ctx {
    const struct sl_model *m;
    struct sl_model_config cfg;
    struct sl_backend_opts o;
    int head_size;
    int kv_dim; /* n_kv_heads * head_size */
    struct sl_cpu_pool *pool;
    int n_threads; /* threads of pool, caller included */
    /* activations, T = max_batch_tokens rows */
    float *x;    /* (T, dim) residual stream */
    float *xb;   /* (T, dim) normed input / attention output */
    float *xb2;  /* (T, dim) projection output */
    float *q;    /* (T, n_heads * head_size) */
    float *k;    /* (T, kv_dim) */
    float *v;    /* (T, kv_dim) */
    float *hb;   /* (T, hidden_dim) gated FFN hidden state */
    float *hb2;  /* (T, hidden_dim) up-projection scratch */
    float *att;  /* (n_threads, max(SL_CPU_ATTN_MAX_Q, n_heads), seq_len) each thread's scores */
    float *rope; /* (T, head_size) cos/sin pairs of each row's position */
    float *xl;   /* (T, dim) final-normed rows that want logits */
    /* forward_sample: the step's logits, and each thread's sampling scratch */
    float *slogits;      /* (max_seqs, vocab) */
    float *sscratch;     /* (n_threads, sscratch_len) */
    size_t sscratch_len; /* floats: sl_sample_scratch_size(vocab) rounded up to 64 bytes */
    int *attn_rows;      /* (T + 1) first row of each attention row group, then n_tokens */
    int *attn_tasks; /* (T · n_kv_heads) group · (n_kv_heads + 1) + KV head + 1; 0: every head */
    /* sl_worker_bench_time_phases: when on, nanoseconds per enum sl_worker_phase so far, and
     * the clock at the end of the last phase timed */
    bool time_phases;
    uint64_t phase_ns[SL_WORKER_PHASES];
    uint64_t phase_t;
    /* paged KV pool, elements of kv_type (F32, or F16 for o.kv_dtype == SL_KV_F16) */
    void *key_cache;   /* (n_kv_blocks, layer, n_kv_heads, block_size, head_size) */
    void *value_cache; /* (n_kv_blocks, layer, n_kv_heads, block_size, head_size) */
    enum sl_dtype kv_type;
    size_t kv_bytes;
    void *kv_map; /* the mapping behind key_cache and value_cache */
    size_t kv_map_bytes;
    void *bufs[SL_CPU_MAX_BUFS]; /* the allocations behind the buffers above (aligned within) */
    int n_bufs;
};

#endif
