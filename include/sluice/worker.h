/* sluice — worker: a model replica on one device.
 *
 * Owns model formats (llama2.c checkpoints, synthetic weights), the tokenizer, sampling, the
 * incremental detokenizer (text deltas + stop strings), the backend interface and the CPU
 * backend with its paged KV storage. It decides nothing about who runs next: the scheduler
 * builds each batch and owns block allocation; the worker only reads and writes the blocks it is
 * told to.
 *
 * Threads: a loaded struct sl_model and its struct sl_tok are immutable and may be read from any
 * thread (the gateway tokenizes on I/O threads). A struct sl_worker, a struct sl_detok and a
 * struct sl_rng belong to one thread at a time (the scheduler thread).
 */
#ifndef SLUICE_WORKER_H
#define SLUICE_WORKER_H

#include <sluice/common.h>

/* ---------------------------------------------------------------------------------------------
 * Models
 */

struct sl_model_config {
    int dim;        /* model width */
    int hidden_dim; /* SwiGLU hidden width */
    int n_layers;
    int n_heads;    /* query heads; head_size = dim / n_heads */
    int n_kv_heads; /* key/value heads (GQA: n_heads % n_kv_heads == 0) */
    int vocab_size;
    int seq_len; /* context length in tokens */
    float rms_eps;
    float rope_theta;
    bool shared_classifier; /* classifier weights == token embedding */
};

struct sl_model;

/* Loads a model. `spec` is one of:
 *   "synthetic"            the default tiny synthetic model ("synthetic:tiny")
 *   "synthetic:NAME[:TYPE]" deterministic random weights of a named shape: "tiny"
 *                          (dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512,
 *                          seq 512), "stories15M" (dim 288, hidden 768, 6 layers, 6 heads,
 *                          6 kv heads, vocab 32000, seq 256), "llama-1b" (dim 2048, hidden
 *                          8192, 16 layers, 32 heads, 8 kv heads, vocab 32000, seq 2048) or
 *                          "llama-8b" (dim 4096, hidden 14336, 32 layers, 32 heads, 8 kv heads,
 *                          vocab 128256, seq 8192, RoPE theta 500000); TYPE is
 *                          f32 (default), f16, bf16 or q8_0 for the projections; with the
 *                          synthetic tokenizer of the same vocab size (round-trips any UTF-8)
 *   a path to a llama2.c checkpoint (.bin, legacy fp32 format, mmap'd); `tokenizer_path` is its
 *                          llama2.c tokenizer.bin (required for a .bin; ignored otherwise)
 *   a path ending ".gguf"  GGUF v2/v3, llama architecture, F32/F16/BF16/Q8_0 tensors mmap'd as
 *                          they are (Q8_0 is not expanded), vocabulary from its metadata
 *   a folder               Hugging Face LlamaForCausalLM: config.json, model.safetensors
 *                          (F32/F16/BF16, tied embeddings through the metadata alias) and
 *                          tokenizer.json (HF BPE with rank-ordered merges); an optional
 *                          tokenizer_config.json gives the chat template
 * On failure returns a negative status and writes a one-line reason naming the file and what is
 * wrong into err (NUL-terminated, at most errlen bytes); *out is untouched. A truncated or
 * inconsistent file is an error, never a crash. */
int sl_model_load(const char *spec, const char *tokenizer_path, struct sl_model **out, char *err,
                  size_t errlen);
/* What sl_model_load would say of spec, without making weights: a synthetic shape and type are
 * looked up; a file is opened, its header, tensor table and tokenizer parsed and checked (its
 * weights are mapped, not read), and closed. */
int sl_model_check(const char *spec, const char *tokenizer_path, char *err, size_t errlen);
void sl_model_free(struct sl_model *m);

const struct sl_model_config *sl_model_config(const struct sl_model *m);
/* The name of synthetic shape i (0, 1, ...: "tiny", "stories15M", ...), NULL past the last. */
const char *sl_model_synthetic_shape(int i);
/* The model's public id for /v1/models: "synthetic:tiny", the file's base name without ".bin"
 * or ".gguf" ("stories260K"), or the folder's base name. */
const char *sl_model_id(const struct sl_model *m);
const struct sl_tok *sl_model_tok(const struct sl_model *m);
/* The model's chat template as its files give it (Jinja source, NUL-terminated), or NULL when
 * they give none: GGUF metadata tokenizer.chat_template; in a Hugging Face folder,
 * tokenizer_config.json's chat_template (a string, or the entry named "default" of a list of
 * {name, template}). llama2.c checkpoints and synthetic models have none. Valid as long as the
 * model; the gateway decides how to render it. */
const char *sl_model_chat_template(const struct sl_model *m);
/* True when sampling `token` ends generation: llama2.c and synthetic models stop on BOS (1) and
 * EOS (2); GGUF on its EOS, BOS and end-of-turn ids; HF folders on config's eos_token_id(s). */
bool sl_model_is_stop_token(const struct sl_model *m, int32_t token);

/* ---------------------------------------------------------------------------------------------
 * Tokenizer: two kinds behind one interface. SentencePiece-style BPE with byte fallback (llama2.c
 * tokenizer.bin and GGUF vocabularies: merges by score) and Hugging Face BPE (tokenizer.json:
 * merges by rank, normalizer, added tokens matched first, byte fallback only where the vocabulary
 * has byte tokens). BOS comes from the model.
 */

struct sl_tok;

int sl_tok_vocab_size(const struct sl_tok *t);
int32_t sl_tok_bos(const struct sl_tok *t);
/* Encodes UTF-8 text: for the SentencePiece kind exactly as llama2.c encode(text, bos, eos=0)
 * (optional BOS, the dummy-prefix space when text is non-empty, merges by score, byte fallback);
 * for the HF kind as HF tokenizers would (plus BOS when asked). Writes at most max_out ids.
 * Returns SL_OK and sets *n_out, or SL_ERANGE when more than max_out ids would be needed (*n_out
 * then holds max_out + 1 as a lower bound), or SL_EINVAL when text is not valid UTF-8.
 * Thread-safe (no shared mutable state). */
int sl_tok_encode(const struct sl_tok *t, const char *text, size_t len, bool bos, int32_t *out,
                  int max_out, int *n_out);
/* The bytes token `id` decodes to when it follows token `prev` (llama2.c decode(): a leading
 * space is dropped after BOS; "<0xAB>" pieces become the raw byte; control and special tokens
 * decode to ""). The bytes are not
 * necessarily valid UTF-8 on their own. Returns a pointer into the tokenizer (valid as long as
 * the model) and sets *len; an out-of-range id gives "". */
const char *sl_tok_decode(const struct sl_tok *t, int32_t prev, int32_t id, size_t *len);
/* Whether id is a control or special token (one sl_tok_decode gives no text), and its text as
 * the vocabulary spells it (e.g. "</s>", "<|im_end|>"): what vLLM's skip_special_tokens: false
 * shows. Not special: false. */
bool sl_tok_special_text(const struct sl_tok *t, int32_t id, const char **text, size_t *len);
/* The id of the special token whose text is exactly s[0..len): a control token of a GGUF
 * vocabulary (token_type 3, e.g. "<s>") or an added token of tokenizer.json (e.g.
 * "<|im_start|>"); -1 when the vocabulary has no such special token (ordinary pieces do not
 * count). Chat templates encode their markers with it. Thread-safe. */
int32_t sl_tok_special_id(const struct sl_tok *t, const char *s, size_t len);

/* Incremental detokenizer of one sequence: token ids in, valid UTF-8 text deltas out.
 * It holds back bytes that are an incomplete UTF-8 character or that could still be the start of
 * a stop string; invalid sequences become U+FFFD. When a stop string completes, the text before it
 * is released, the stop string itself is not, and *stopped becomes true. */
struct sl_detok;

/* stops: n_stops NUL-terminated strings (copied; empty strings and strings that are not valid
 * UTF-8, which cannot occur in the text, are ignored). `prev` is the last prompt token (for the
 * after-BOS space rule). */
struct sl_detok *sl_detok_new(const struct sl_tok *t, int32_t prev, const char *const *stops,
                              int n_stops);
void sl_detok_free(struct sl_detok *d);
/* vLLM's stop-string options: a stop string completed by one of the first min_tokens tokens
 * pushed does not count (held-back text may still begin one completed later), and with
 * include_stop the stop string's own text is released too (nothing after it). Call before the
 * first push. */
void sl_detok_stop_options(struct sl_detok *d, int min_tokens, bool include_stop);
/* The stop string that ended the text: its index among the stops sl_detok_new was given, or -1
 * while none has. */
int sl_detok_stop_index(const struct sl_detok *d);
/* Control and special tokens add their own text (sl_tok_special_text) instead of none. Call
 * before the first push. */
void sl_detok_keep_special(struct sl_detok *d);
/* Feeds one sampled token; appends the newly released text to out. Returns the number of bytes
 * appended. After *stopped is set, further pushes are ignored. */
size_t sl_detok_push(struct sl_detok *d, int32_t token, struct sl_str *out, bool *stopped);
/* End of sequence: releases whatever is held back (a dangling partial character becomes
 * U+FFFD). Returns bytes appended. */
size_t sl_detok_finish(struct sl_detok *d, struct sl_str *out);

/* ---------------------------------------------------------------------------------------------
 * Sampling
 */

struct sl_sampling {
    float temperature; /* 0 = greedy (argmax, lowest id wins ties) */
    float top_p;       /* nucleus mass in (0, 1]; 1 = off */
    int top_k;         /* keep the k most likely; 0 = off, 1 = greedy */
    float min_p;       /* drop tokens below min_p * the best probability; 0 = off */
};

/* xorshift64* state; one per sequence, seeded per request (same seed → same output). */
struct sl_rng {
    uint64_t state;
};
void sl_rng_seed(struct sl_rng *r, uint64_t seed);
/* Uniform float in [0, 1). */
float sl_rng_f32(struct sl_rng *r);

/* Bytes of scratch sl_sample needs for a vocabulary of `vocab` entries. */
size_t sl_sample_scratch_size(int vocab);
/* Picks the next token from logits (vocab) for the given parameters: logits / temperature, softmax,
 * then min-p, top-k and top-p filters in that order (each renormalising what is left), then one
 * draw from rng. logits may be modified.
 * scratch: at least sl_sample_scratch_size(vocab) bytes. Never allocates. */
int32_t sl_sample(float *logits, int vocab, const struct sl_sampling *p, struct sl_rng *rng,
                  void *scratch);
/* sl_sample in two halves, for a backend that samples on its device: the coin sl_sample would
 * draw from rng (it draws one only when p is not greedy and vocab > 1; otherwise 0, rng
 * untouched), then the pick from logits with that coin. For any logits,
 * sl_sample(l, v, p, rng, s) == sl_sample_with_coin(l, v, p, sl_sample_coin(p, v, rng), s), and
 * rng ends in the same state. */
float sl_sample_coin(const struct sl_sampling *p, int vocab, struct sl_rng *rng);
int32_t sl_sample_with_coin(float *logits, int vocab, const struct sl_sampling *p, float coin,
                            void *scratch);

/* What a request asks to change in its logits before sampling, after OpenAI and vLLM:
 *  - repetition (vLLM's repetition_penalty, > 0; 1 or 0 = off): for every token of the prompt or
 *    generated so far, a positive logit is divided by it, a negative one multiplied;
 *  - frequency and presence (OpenAI's, in [-2, 2]): each token generated so far loses
 *    frequency × its count + presence;
 *  - bias (OpenAI's logit_bias, each in [-100, 100]): added to its token's logit;
 * in that order, before temperature and the filters. ids are in [0, vocab). */
struct sl_penalties {
    float repetition;
    float frequency;
    float presence;
    int n_bias;
    const int32_t *bias_ids; /* (n_bias) */
    const float *bias;       /* (n_bias) */
};

/* True when p changes any logit. */
bool sl_penalties_active(const struct sl_penalties *p);
/* Applies p to logits (vocab) for a sequence with prompt (n_prompt) and generated (n_gen) ids.
 * counts: vocab ints, all zero, left all zero. O(n_prompt + n_gen + n_bias); never allocates. */
void sl_penalties_apply(float *logits, int vocab, const struct sl_penalties *p,
                        const int32_t *prompt, int n_prompt, const int32_t *gen, int n_gen,
                        int32_t *counts);

/* Most alternatives a token's log probabilities list (OpenAI's chat allows 20). */
#define SL_MAX_TOP_LOGPROBS 20

/* A sampled token's log probability under the model's distribution (the log-softmax of its raw
 * logits: before penalties, temperature and filters, as vLLM reports them), and the n_top most
 * likely tokens with theirs, most likely first (the lower id first among equals). */
struct sl_token_logprobs {
    int32_t token;
    int32_t prev; /* the token before it in the sequence, which its text may depend on */
    float logprob;
    int n_top;
    int32_t top_ids[SL_MAX_TOP_LOGPROBS];
    float top_logprobs[SL_MAX_TOP_LOGPROBS];
};

/* Fills out (but prev) for token from raw logits (vocab); n_top in [0, SL_MAX_TOP_LOGPROBS]. */
void sl_logprobs(const float *logits, int vocab, int32_t token, int n_top,
                 struct sl_token_logprobs *out);

/* A logit row to be sampled by the backend (struct sl_backend_ops.forward_sample). */
struct sl_sample_row {
    struct sl_sampling p;
    float coin; /* sl_sample_coin(&p, vocab, the sequence's rng) */
};

/* ---------------------------------------------------------------------------------------------
 * Batches and backends (see DESIGN.md "The worker interface")
 *
 * A varlen batch: n_tokens rows, each row a token of one sequence at one position. Rows of the
 * same sequence are contiguous and in position order. KV storage is paged: block b of the
 * backend's pool holds block_size consecutive positions of one sequence; the token at position
 * p of sequence s lives in block block_tables[s][p / block_size], slot p % block_size.
 */
struct sl_batch {
    int n_tokens;
    const int32_t *tokens; /* (n_tokens) token ids */
    const int32_t *pos;    /* (n_tokens) position of each row in its sequence */
    const int32_t *seq;    /* (n_tokens) index of each row's sequence, in [0, n_seqs) */
    int n_seqs;
    const int32_t *const *block_tables; /* (n_seqs) each (ceil(ctx_len / block_size)) block ids */
    const int32_t *ctx_len; /* (n_seqs) context length of each sequence after this batch */
    int n_logits;
    const int32_t *logit_rows; /* (n_logits) rows whose logits are wanted, ascending */
};

/* How a backend stores K and V. The CPU backend honours it; the CUDA backend stores them in its
 * compute type (F32, or 16-bit for 16-bit and Q8_0 weights) whatever is asked. Zeroed options
 * mean F32; the server's configuration defaults to F16 (sl_config_init). */
enum sl_kv_dtype {
    SL_KV_F32, /* exact: the reference implementations' fp32 */
    SL_KV_F16, /* IEEE half, rounded to nearest even when written: half the bytes per block */
};

/* "f32", "f16". */
const char *sl_kv_dtype_name(enum sl_kv_dtype t);

struct sl_backend_opts {
    int n_kv_blocks;      /* blocks in the KV pool */
    int block_size;       /* positions per block */
    int max_batch_tokens; /* most rows in one forward */
    int max_seqs;         /* most sequences in one forward */
    int threads;          /* CPU threads for kernels (0 = one per CPU the process may use) */
    bool no_pin;          /* CPU: leave the kernel threads unpinned (see sl_cpu_pool_new) */
    int device;           /* CUDA device ordinal (the CPU backend ignores it) */
    bool eager;           /* CUDA: never capture decode steps as CUDA graphs (tests, profiling) */
    bool profile;         /* CUDA: time every launch of every step (eagerly; see
                           * sl_worker_bench_profile) */
    enum sl_kv_dtype kv_dtype; /* K and V storage (see enum sl_kv_dtype) */
    /* CPU: multiply Q8_0, Q4_0 and K-quant weights in exact fp32 instead of with 8-bit
     * activations and integer dot products (the config's cpu_int8_activations false; see
     * "Integer matmul" in kernels.h). */
    bool float_activations;
};

/* A backend: a static table of functions over an opaque context (ggml-backend style). */
struct sl_backend_ops {
    const char *name;
    /* Allocates weights views, activations and the KV pool for the given limits. */
    int (*init)(const struct sl_model *m, const struct sl_backend_opts *o, void **ctx);
    /* Runs the batch, writing KV for every row and logits (n_logits, vocab) for logit_rows.
     * Allocates nothing. Returns SL_OK, SL_EINVAL for a batch over the limits, SL_EBACKEND. */
    int (*forward)(void *ctx, const struct sl_batch *b, float *logits);
    /* Optional (NULL when the backend only returns logits; the caller then samples them): runs
     * the batch as forward does, then samples row logit_rows[i] with rows[i] where the logits
     * are, writing ids (n_logits): only ids leave the device. n_logits <= max_seqs. The ids are
     * what sl_sample_with_coin(row's logits, vocab, &rows[i].p, rows[i].coin) gives, but for a
     * coin within rounding of the boundary between two tokens. Returns as forward does. */
    int (*forward_sample)(void *ctx, const struct sl_batch *b, const struct sl_sample_row *rows,
                          int32_t *ids);
    void (*free)(void *ctx);
    /* Bytes of KV storage allocated. */
    size_t (*kv_bytes)(void *ctx);
    /* Bytes one KV block of block_size positions takes on this backend for this model (keys and
     * values, all layers) when asked to store them as kv, before init: for sizing the pool. */
    size_t (*kv_block_bytes)(const struct sl_model *m, int block_size, enum sl_kv_dtype kv);
};

/* The CPU backend. forward_sample runs forward, then samples the rows over its thread pool. */
extern const struct sl_backend_ops sl_cpu_backend_ops;
/* Test builds only (worker/fault_backend.c, linked into tests/integration's sluice-fault, never
 * into sluice): the CPU backend whose forward fails with SL_EBACKEND on the calls that the
 * environment variable SLUICE_FAULT_FORWARD lists ("3,7": the third and seventh, from 1). */
extern const struct sl_backend_ops sl_fault_backend_ops;
/* The CUDA backend: present when the build has CUDA (sl_build_config.h: SL_HAVE_CUDA 1). Weights
 * are uploaded once at init, converted for cuBLAS: projections from F32 sources stay F32, F16 and
 * BF16 stay as they are, Q8_0 becomes F16; the KV cache holds the same type (F32 or 16-bit). One
 * stream per worker; decode-only steps are captured as CUDA graphs the second time their shape
 * comes (unless opts.eager). Rows depend on their batch within rounding (cuBLAS picks its kernels
 * by shape), not bit for bit as on the CPU. forward_sample is implemented. */
extern const struct sl_backend_ops sl_cuda_backend_ops;

/* Bytes one KV block takes for this model on the CPU backend (keys and values, all layers, as
 * kv). */
size_t sl_model_kv_block_bytes(const struct sl_model *m, int block_size, enum sl_kv_dtype kv);

/* A worker: a model replica bound to a backend. The model must outlive it. */
struct sl_worker;
int sl_worker_new(const struct sl_model *m, const struct sl_backend_ops *ops,
                  const struct sl_backend_opts *o, struct sl_worker **out);
void sl_worker_free(struct sl_worker *w);
int sl_worker_forward(struct sl_worker *w, const struct sl_batch *b, float *logits);
/* True when the worker's backend samples where its logits are (forward_sample: the CPU backend
 * over its thread pool, the CUDA backend on the device). */
bool sl_worker_can_sample(const struct sl_worker *w);
/* The backend's forward_sample; SL_EINVAL when it has none. */
int sl_worker_forward_sample(struct sl_worker *w, const struct sl_batch *b,
                             const struct sl_sample_row *rows, int32_t *ids);
const struct sl_model *sl_worker_model(const struct sl_worker *w);
const struct sl_backend_opts *sl_worker_opts(const struct sl_worker *w);
size_t sl_worker_kv_bytes(const struct sl_worker *w);

/* ---------------------------------------------------------------------------------------------
 * Devices: where a worker runs (configuration key "device")
 */

struct sl_worker_device {
    const struct sl_backend_ops *ops; /* &sl_cpu_backend_ops or &sl_cuda_backend_ops */
    int index;                        /* CUDA device ordinal; -1 for the CPU */
    char name[160];                   /* "cpu", or "cuda:0 (NVIDIA H200, compute 9.0, 139.8 GiB)" */
    size_t mem_free;                  /* device memory free at selection, bytes; 0 for the CPU */
};

/* Parses a device spec: "auto", "cpu", "cuda" (= "cuda:0") or "cuda:N" (N a decimal ordinal
 * below 1024). Sets *index (when index is not NULL) to -2 for auto, -1 for cpu, else N. Returns
 * SL_OK or SL_EINVAL. Touches no device. */
int sl_worker_device_parse(const char *spec, int *index);

/* The CPU kernels' instruction set, process-wide: "auto" (the best this CPU has), or "avx512",
 * "avx2" or "scalar" to force that level. A forced level below the best is slower, never
 * different: avx512 and avx2 give the same bits; scalar sums in llama2.c's order. Sets *used
 * (when not NULL) to the name of the level in use. SL_EINVAL with the reason in err for a name
 * that is none of these (a NULL name included) or a level this CPU lacks. Call before any worker
 * starts. */
int sl_worker_set_cpu_isa(const char *name, const char **used, char *err, size_t errlen);
/* Whether name is "auto", "avx512", "avx2" or "scalar" (a configuration check; no CPU query). */
bool sl_worker_cpu_isa_valid(const char *name);

/* Resolves a device spec to a backend: "cpu" is the CPU; "cuda:N" is CUDA device N, or SL_ENOENT
 * with err saying why ("no CUDA device: cudaGetDeviceCount: CUDA driver version is insufficient
 * …", "this build has no CUDA support", a device too old for the build's sm_90 code);
 * "auto" is CUDA device 0 when it can be used, else the CPU, saying why in one log line. A bad
 * spec is SL_EINVAL. Logs the device chosen. Call from the thread that starts the workers. */
int sl_worker_device_select(const char *spec, struct sl_worker_device *out, char *err,
                            size_t errlen);

/* Bytes a KV pool may take on d for model m with these step limits when sized as a fraction of
 * free memory: for CUDA, the device memory free at selection less what the backend will
 * allocate for the weights, activations, workspaces and a margin for the CUDA context; 0 for
 * the CPU (the caller reads MemAvailable). */
size_t sl_worker_device_kv_room(const struct sl_worker_device *d, const struct sl_model *m,
                                int max_batch_tokens, int max_seqs);

/* ---------------------------------------------------------------------------------------------
 * Benchmark hooks (bench/engine_bench.c): the work in a model's weights, ready-made batches over
 * a fixed KV layout, and where a forward's time goes. Nothing that serves calls them.
 */

/* The weights a token multiplies, for ceilings: the layer matrices (wq, wk, wv, wo, w1, w2, w3
 * of every layer) and the classifier, each counted once even where the classifier is the
 * token embedding. */
struct sl_model_work {
    double weight_bytes;     /* bytes of all of them as stored: what a decode step reads */
    double decode_params;    /* weights multiplied per decode token: all of them */
    double layer_params;     /* per prefill token: the layer matrices alone (the classifier
                              * runs for a prompt's last row only) */
    double last_tail_params; /* the last layer's wo, w1, w2 and w3: what the CPU backend
                              * multiplies only for the rows that sample */
    const char *weight_type; /* the projections' element type as stored: "f32", "f16", "bf16",
                              * "q8_0" (layer 0's wq) */
};

/* Fills out for m. Never fails. */
void sl_model_bench_work(const struct sl_model *m, struct sl_model_work *out);

/* A benchmark's batches over one fixed KV layout: max_seqs decoding sequences of ctx positions
 * each (sequence s owns blocks [s · per_seq, (s + 1) · per_seq), per_seq = ceil(ctx /
 * block_size)), then one prompt of `prompt` positions in the blocks after them. Tokens are drawn
 * from a fixed seed, the same on every run. A worker made with sl_worker_bench_opts's options
 * accepts every batch it hands out. Belongs to one thread at a time. */
struct sl_worker_bench;

/* SL_EINVAL when block_size or max_seqs is below 1, or ctx or prompt is outside [1, seq_len] of
 * m; otherwise SL_OK and *out (freed with sl_worker_bench_free), which needs m only while it is
 * made. */
int sl_worker_bench_new(const struct sl_model *m, int max_seqs, int ctx, int prompt, int block_size,
                        struct sl_worker_bench **out);
void sl_worker_bench_free(struct sl_worker_bench *b);
/* Sets the fields of o that the layout fixes and leaves the others: n_kv_blocks (every
 * sequence's blocks and the prompt's), block_size, max_seqs, and max_batch_tokens (the largest
 * of prompt, max_seqs and ctx - 1, so that one batch can write a whole context). */
void sl_worker_bench_opts(const struct sl_worker_bench *b, struct sl_backend_opts *o);
/* Each batch below points into b and stays valid until b is freed or the next call for a batch
 * of the same kind, which rewrites it; the three kinds share no arrays. */

/* The whole prompt as one sequence, logits for its last row only. */
const struct sl_batch *sl_worker_bench_prompt(struct sl_worker_bench *b);
/* Writes the context of sequences first, first + 1, …: positions 0 .. ctx - 2 of each, as many
 * sequences as one batch holds (at least one, none at or past max_seqs), no logits. Sets
 * *n_seqs to how many. NULL (and *n_seqs 0) when first is outside [0, max_seqs) or ctx is 1
 * (nothing to write). */
const struct sl_batch *sl_worker_bench_context(struct sl_worker_bench *b, int first, int *n_seqs);
/* One decode step of sequences 0 .. n_seqs - 1: row i is sequence i's token at position ctx - 1,
 * and every row wants logits. NULL when n_seqs is outside [1, max_seqs]. */
const struct sl_batch *sl_worker_bench_decode(struct sl_worker_bench *b, int n_seqs);

/* Where a CPU forward's time goes, in step order, each phase summed over the layers: the QKV
 * projection (the embedding and the first norm count here too), RoPE of K and the KV writes,
 * attention, the output projection, the residual add and the FFN norm, gate and up with SwiGLU,
 * down, the residual add and the next layer's norm; then the final norm and the classifier. */
enum sl_worker_phase {
    SL_WORKER_PHASE_QKV,
    SL_WORKER_PHASE_KV,
    SL_WORKER_PHASE_ATTENTION,
    SL_WORKER_PHASE_WO,
    SL_WORKER_PHASE_NORM,
    SL_WORKER_PHASE_W1_W3,
    SL_WORKER_PHASE_W2,
    SL_WORKER_PHASE_NORM2,
    SL_WORKER_PHASE_CLASSIFIER,
    SL_WORKER_PHASES /* how many */
};

/* "qkv", "kv_glue", "attention", "wo", "norm", "w1_w3", "w2", "norm2", "classifier"; "?" past
 * the last. */
const char *sl_worker_phase_name(enum sl_worker_phase p);
/* Times (on) or stops timing the phases of w's forwards: one clock read at the end of each
 * phase of each layer. Off when a worker is made. SL_EINVAL when w does not run on the CPU
 * backend. Call between forwards, from w's thread. */
int sl_worker_bench_time_phases(struct sl_worker *w, bool on);
/* Writes the nanoseconds timed in each phase since the last call (or since timing started) to
 * ns (SL_WORKER_PHASES) and starts again from zero. SL_EINVAL when w does not run on the CPU
 * backend. */
int sl_worker_bench_phases(struct sl_worker *w, uint64_t *ns);

/* Where a CUDA worker made with sl_backend_opts.profile spent its steps: device time between
 * events recorded around each launch, summed by kind of launch ("attention_decode", "gemm_qkv",
 * …, in the order first seen). */
#define SL_WORKER_PROFILE_KINDS 24
struct sl_worker_profile {
    long steps;     /* steps timed */
    double step_ms; /* their device time, first launch to last */
    int n_kinds;
    struct {
        const char *kind; /* a static string */
        double ms;
        long calls;
    } k[SL_WORKER_PROFILE_KINDS];
};
/* Copies the figures gathered since the last call into out and starts again from zero.
 * SL_EINVAL when w is not a CUDA worker made with profile set (always, in a build without
 * CUDA). */
int sl_worker_bench_profile(struct sl_worker *w, struct sl_worker_profile *out);

#endif
