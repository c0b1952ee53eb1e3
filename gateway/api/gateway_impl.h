/* Private layouts of the API's codecs (gateway/api/): OpenAI's JSON (openai_decode.c,
 * openai_encode.c), chat templates (chat.c) and metrics (metrics.c). Its tests include this
 * header; nothing outside gateway/api/ may.
 *
 * Threads: everything here is plain data and pure functions unless it says otherwise.
 */
#ifndef SLUICE_GATEWAY_IMPL_H
#define SLUICE_GATEWAY_IMPL_H

#include <sluice/config.h>
#include <sluice/http.h>

#include <jansson.h>

/* ---------------------------------------------------------------------------------------------
 * OpenAI JSON layer
 */

/* An error as OpenAI reports it: {"error":{"message","type","param","code"}}, sent with `http`.
 * type comes from sl_openai_error_type(http). */
struct sl_openai_error {
    int http;
    const char *code; /* static, or NULL for JSON null */
    char param[64];   /* "" for JSON null; long enough for "messages[N].content[M].type" */
    char message[512];
};

/* OpenAI's error `type` for an HTTP status ("invalid_request_error", "rate_limit_error", …). */
const char *sl_openai_error_type(int http_code);
void sl_openai_error_set(struct sl_openai_error *e, int http, const char *param, const char *code,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Admission's refusal as OpenAI's error: its status through sl_http_status_code, its code, param
 * and message as they are. */
void sl_openai_error_from_admit(struct sl_openai_error *e, const struct sl_admit_error *a);

/* Who wrote a chat message. OpenAI's "developer" is read as system (it replaces system for newer
 * models); "tool" and "function" messages are refused at decode. */
enum sl_chat_role {
    SL_CHAT_ROLE_SYSTEM,
    SL_CHAT_ROLE_USER,
    SL_CHAT_ROLE_ASSISTANT,
};

/* One decoded chat message. */
struct sl_chat_msg {
    enum sl_chat_role role;
    const char *content; /* UTF-8; into the request's root, or owned when joined from parts */
    size_t len;
    bool owned; /* content was joined from text parts: freed with the request */
};

/* m's content: the "text" members of parts (an array of checked text parts), joined with "\n"
 * (as vLLM joins them), owned by m. */
void sl_chat_msg_join(struct sl_chat_msg *m, json_t *parts);

/* A decoded POST /v1/completions or /v1/chat/completions body. Strings point into `root`, which
 * owns them. */
/* One prompt of a completion: text, or token ids. */
struct sl_openai_prompt {
    const char *text; /* points into the request's JSON; NULL when given as ids */
    size_t len;
    int32_t *ids; /* owned; NULL when given as text */
    int n_ids;
};

struct sl_openai_completion {
    json_t *root;
    const char *model; /* "model" as sent, or NULL */
    /* Completions: every prompt sent (n_prompts >= 1; OpenAI's array of prompts gives one
     * answer per prompt and choice), and the one selected (sl_openai_prompt_select; the first
     * after decoding) in the four fields below. */
    struct sl_openai_prompt *prompts;
    int n_prompts;
    const char *prompt; /* the selected prompt as text, or NULL when given as token ids */
    size_t prompt_len;
    const int32_t *prompt_ids; /* the selected prompt as token ids (prompts' own), or NULL */
    int n_prompt_ids;
    struct sl_req_params params; /* stop[] points into root; seed valid only when has_seed */
    bool has_seed;
    bool max_tokens_open; /* chat without max_tokens and no configured default: to the context */
    int n;                /* choices to generate (OpenAI's n, 1 .. SL_OPENAI_N_MAX) */
    int best_of;          /* completions' best_of as sent; 0 when absent */
    bool stream;
    bool include_usage;       /* stream_options.include_usage: a final chunk carries usage */
    bool echo;                /* completions: the prompt's text goes before the completion's */
    const char *service_tier; /* OpenAI's service_tier ("auto", "default", "flex", "priority",
                                 …) as sent, or NULL; the gateway maps it to a tier */
    const char *user;         /* the end user's id as sent, or NULL */
    /* The prefix cache's salts: OpenAI's prompt_cache_key and vLLM's cache_salt as sent (1 to
     * SL_OPENAI_CACHE_SALT_MAX bytes, into root), or {NULL, 0}. Each narrows the cached prefixes
     * the request may share to those of requests that sent the same (sl_api_cache_key). */
    struct sl_strv prompt_cache_key, cache_salt;
    /* Chat only (prompt is then NULL): the messages in order, at least one. */
    struct sl_chat_msg *messages;
    int n_messages;
    int32_t *bias_ids; /* logit_bias, owned: params.bias_ids and params.bias point here */
    float *bias;
    int32_t *stop_ids; /* stop_token_ids, owned: params.stop_ids points here */
};

/* The longest prompt_cache_key or cache_salt, in bytes. */
#define SL_OPENAI_CACHE_SALT_MAX 256

/* Decodes and validates a completion request. `model_id` is the served model: a different
 * `model` is a 404; NULL accepts any (the caller routes by c->model). Returns SL_OK, or a
 * negative status with err filled (c is then empty). */
int sl_openai_completion_decode(struct sl_openai_completion *c, const char *body, size_t len,
                                const char *model_id, int default_max_tokens,
                                struct sl_openai_error *err);
void sl_openai_completion_dispose(struct sl_openai_completion *c);
/* Decodes and validates a chat completion request into c (messages instead of prompt), with the
 * same fields and errors as a completion plus max_completion_tokens (which wins over max_tokens
 * when both are given). Messages: role system, developer, user or assistant; content a string or
 * an array of {"type": "text", "text"} parts (joined with "\n"); assistant content may be null.
 * Refused with a 400 naming the param: tool and function messages, tool calls, non-text content
 * parts, non-empty `tools`, a response_format other than text. Dispose with
 * sl_openai_completion_dispose. */
int sl_openai_chat_decode(struct sl_openai_completion *c, const char *body, size_t len,
                          const char *model_id, int default_max_tokens,
                          struct sl_openai_error *err);

/* Checks the token ids a request names (logit_bias's keys, stop_token_ids, a prompt of ids) against
 * a model's vocabulary: a 400 naming the param when one is not below vocab. */
int sl_openai_check_vocab(const struct sl_openai_completion *c, int vocab,
                          struct sl_openai_error *err);

/* Tokenizes the prompt with BOS into ids (capacity seq_len) and checks that the prompt plus
 * max_tokens fits the context. Returns SL_OK with *n_ids set, or fills err. */
int sl_openai_prompt_encode(const struct sl_tok *tok, int seq_len, const char *prompt, size_t len,
                            int max_tokens, int32_t *ids, int *n_ids, struct sl_openai_error *err);
/* A completion's prompt ids for a model: its token ids as given, or its text tokenized as
 * sl_openai_prompt_encode does; checked against the context for max_tokens either way. */
/* vLLM's POST /tokenize ({"model", "prompt": text, "add_special_tokens"} or {"model",
 * "messages"}: the ids a completion or chat would see) and POST /detokenize ({"model",
 * "tokens": ids}). */
struct sl_openai_tokenize {
    struct sl_openai_completion c; /* root and model; messages for a chat, prompt for text */
    bool chat;                     /* messages were given */
    bool add_special;              /* add_special_tokens (default true): a BOS before the text */
    int32_t *tokens;               /* detokenize: the ids (owned), checked >= 0 only */
    int n_tokens;
};
/* SL_OK, or an error (400, naming the param) in err. */
int sl_openai_tokenize_decode(struct sl_openai_tokenize *t, const char *body, size_t len,
                              bool detokenize, struct sl_openai_error *err);
void sl_openai_tokenize_dispose(struct sl_openai_tokenize *t);
/* {"count": n, "max_model_len": max_len, "tokens": [...]} and {"prompt": text}. */
void sl_openai_tokens_encode(struct sl_str *out, const int32_t *ids, int n, int max_len);
void sl_openai_detokenized_encode(struct sl_str *out, const char *text, size_t len);

/* Makes prompt i (0 .. n_prompts - 1) the selected one. */
void sl_openai_prompt_select(struct sl_openai_completion *c, int i);
int sl_openai_prompt_ids(const struct sl_openai_completion *c, const struct sl_tok *tok,
                         int seq_len, int max_tokens, int32_t *ids, int *n_ids,
                         struct sl_openai_error *err);
/* The context check alone. n_prompt is exact, or a lower bound when at_least. The error's param
 * is prompt_param ("prompt" or "messages") when the prompt alone fills the context, else
 * "max_tokens". */
int sl_openai_check_context(int seq_len, long long n_prompt, bool at_least, long long max_tokens,
                            const char *prompt_param, struct sl_openai_error *err);

/* The prefix cache's key of a request (struct sl_req_params' cache_key): the first 64 bits
 * (big-endian) of the SHA-256 of a length-prefixed encoding of model (the served model's name),
 * the scope's identity (tenant, the tenant's name, in SL_CONFIG_PREFIX_TENANT scope; a marker no
 * name can equal in SL_CONFIG_PREFIX_GLOBAL scope, where tenant is not read) and each salt that
 * was sent (prompt_cache_key and cache_salt, {NULL, 0} when not, told apart from each other and
 * from absence). Requests share cached prefixes only under equal keys. Any thread. */
uint64_t sl_api_cache_key(const char *model, enum sl_config_prefix_scope scope, const char *tenant,
                          struct sl_strv prompt_cache_key, struct sl_strv cache_salt);

/* Which API a response belongs to: the encoders below write its objects. */
enum sl_openai_api {
    SL_OPENAI_API_COMPLETIONS, /* "text_completion" objects and chunks */
    SL_OPENAI_API_CHAT,        /* "chat.completion" and "chat.completion.chunk" */
};

/* What every object of one completion repeats. */
struct sl_openai_ident {
    char id[48]; /* "cmpl-…", or "chatcmpl-…" */
    int64_t created;
    const char *model;
    enum sl_openai_api api;
    bool include_usage; /* stream_options.include_usage: every chunk has "usage": null */
    int index;          /* the choice a chunk or role chunk belongs to (0 .. n - 1) */
    const char *cost;   /* what the request cost (a decimal), or NULL: the usage objects of the
                           whole answer and of the final usage chunk add it as "cost" */
    int cached_tokens;  /* of the prompt tokens, those the prefix cache gave: OpenAI's usage
                           prompt_tokens_details.cached_tokens, Anthropic's cache_read_input_tokens
                           (which its input_tokens leaves out) */
};

/* The log probabilities of the tokens a completion or chunk covers, written as the API's
 * "logprobs" object (token texts from tok, after each token's prev); NULL writes null. */
struct sl_openai_logprobs {
    const struct sl_tok *tok;
    const struct sl_token_logprobs *e;
    int n;
    size_t text_offset; /* completions: the first token's offset into the whole text */
};

/* Most choices one request may ask for (OpenAI's limit for n). */
#define SL_OPENAI_N_MAX 128

/* One choice of a non-streaming answer. */
struct sl_openai_choice {
    const char *text; /* valid UTF-8 */
    size_t len;
    enum sl_finish finish;
    const struct sl_openai_logprobs *lp; /* NULL: "logprobs": null */
};

/* Encoders append one JSON document (no trailing newline) to out. Text must be valid UTF-8.
 * Each writes the shape of id->api: completion and chunk are a text_completion with
 * choices[0].text, or a chat.completion with choices[0].message / a chat.completion.chunk with
 * choices[0].delta ({"content"} while the stream goes on, {} with the finish_reason). */
void sl_openai_completion_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                 const char *text, size_t len, enum sl_finish finish,
                                 int prompt_tokens, int completion_tokens,
                                 const struct sl_openai_logprobs *lp);
/* The same with n choices (index 0 .. n - 1 in order); completion_tokens is their sum. */
void sl_openai_completion_encode_choices(struct sl_str *out, const struct sl_openai_ident *id,
                                         const struct sl_openai_choice *ch, int n,
                                         int prompt_tokens, int completion_tokens);
/* A streaming chunk of choice id->index; finish SL_FINISH_NONE gives "finish_reason": null. */
void sl_openai_chunk_encode(struct sl_str *out, const struct sl_openai_ident *id, const char *text,
                            size_t len, enum sl_finish finish, const struct sl_openai_logprobs *lp);
/* The parts of choice id->index's chunks of text without log probabilities or a finish that
 * do not change from one to the next: such a chunk is pre, the text as the inside of a JSON
 * string (sl_json_escape), then post, as sl_openai_chunk_encode writes it. Appends pre then post
 * to out (empty) and returns pre's length. */
size_t sl_openai_chunk_affixes(const struct sl_openai_ident *id, struct sl_str *out);
/* Bytes of token id's text after prev (what completions' text_offset advances by). */
size_t sl_openai_token_len(const struct sl_tok *tok, int32_t prev, int32_t id);
/* The first chunk of a chat stream's choice id->index: delta {"role": "assistant",
 * "content": ""}. */
void sl_openai_chunk_role_encode(struct sl_str *out, const struct sl_openai_ident *id);
/* The stream_options.include_usage chunk: "choices": [] and the usage. */
void sl_openai_usage_chunk_encode(struct sl_str *out, const struct sl_openai_ident *id,
                                  int prompt_tokens, int completion_tokens);
void sl_openai_error_encode(struct sl_str *out, const struct sl_openai_error *e);
/* Response headers for admission's decision on a request: x-sluice-admission, and for a refusal
 * Retry-After (seconds, rounded up) and retry-after-ms. Appended as "Name: value\r\n" lines;
 * nothing when admission did not run. */
void sl_openai_admission_headers(const struct sl_admit *a, struct sl_str *out);
/* OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} of tenant t of ten (nothing
 * for a tenant without rpm or tpm), as the buckets are at now_ns. */
void sl_openai_ratelimit_headers(const struct sl_tenancy *ten, const struct sl_tenant *t,
                                 int64_t now_ns, struct sl_str *out);
/* OpenAI's duration format, as in x-ratelimit-reset-*: "0s", "120ms", "1s", "6m0s", "1.5s",
 * "1h2m3s" (milliseconds rounded up). */
void sl_openai_duration_format(int64_t ns, char *out, size_t outlen);
/* GET /v1/models (the n served ids, the default first) and GET /v1/models/{id}. */
/* Each model card has vLLM's max_model_len (the model's context, max_lens[i]). */
void sl_openai_models_encode(struct sl_str *out, const char *const *ids, const int *max_lens, int n,
                             int64_t created);
void sl_openai_model_encode(struct sl_str *out, const char *model_id, int max_len, int64_t created);

/* ---------------------------------------------------------------------------------------------
 * Chat templates (chat.c)
 *
 * Models ship their chat template as Jinja. Like llama.cpp (llm_chat_detect_template) sluice has
 * no Jinja engine: it recognises the well-known templates by distinctive markers and renders
 * them in C. A marker is encoded as one special token where the vocabulary has it as one
 * (sl_tok_special_id), else as the text it is.
 */

enum sl_chat_template {
    /* The default, for models without a (recognised) template, which here are base models:
     * "system: …", "user: …", "assistant: …" lines (developer reads as system), then
     * "assistant:" for the model to continue. No special tokens. */
    SL_CHAT_TEMPLATE_PLAIN,
    SL_CHAT_TEMPLATE_CHATML,  /* <|im_start|>role\ncontent<|im_end|>\n */
    SL_CHAT_TEMPLATE_LLAMA2,  /* [INST] <<SYS>>…<</SYS>>\n\nuser [/INST] reply </s><s>… */
    SL_CHAT_TEMPLATE_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> */
    SL_CHAT_TEMPLATE_MISTRAL, /* [INST] user [/INST]assistant</s>; system joins the next user */
    SL_CHAT_TEMPLATE_ZEPHYR,  /* <|role|>\ncontent</s>\n */
    SL_CHAT_TEMPLATE_GEMMA,   /* <start_of_turn>user|model\ncontent<end_of_turn>\n */
    SL_CHAT_TEMPLATE_PHI3,    /* <|role|>\ncontent<|end|>\n */
    SL_CHAT_TEMPLATE_COUNT,
};

/* "plain", "chatml", "llama2", "llama3", "mistral", "zephyr", "gemma", "phi3". */
const char *sl_chat_template_name(enum sl_chat_template t);
/* The builtin called `name`, or -1. */
int sl_chat_template_from_name(const char *name);
/* The builtin a model's Jinja template is, recognised by its markers; -1 when jinja is NULL or
 * not recognised. */
int sl_chat_template_detect(const char *jinja);
/* The template chat requests to this model use when the configuration names none: its own when
 * recognised, else plain. Logs the choice once, as a warning when the model has a template that
 * is not recognised. Call at start-up. */
enum sl_chat_template sl_chat_template_of_model(const struct sl_model *m);

/* A rendered prompt: text, and the same bytes as runs of text and of special markers. */
struct sl_chat_seg {
    size_t off, len; /* into text */
    bool special;
};
struct sl_chat_prompt {
    struct sl_str text;
    struct sl_chat_seg *segs; /* (n_segs) in order, covering text exactly */
    int n_segs, cap_segs;
};
void sl_chat_prompt_init(struct sl_chat_prompt *p);
void sl_chat_prompt_dispose(struct sl_chat_prompt *p);
/* Renders the messages with template t, ending with the assistant's generation prompt, into p
 * (cleared first). */
void sl_chat_render(struct sl_chat_prompt *p, enum sl_chat_template t,
                    const struct sl_chat_msg *msgs, int n_msgs);
/* Tokenizes p like sl_openai_prompt_encode does a prompt: BOS, then each run of text encoded on
 * its own and each special marker as its special token (as text when the vocabulary has none),
 * into ids (capacity seq_len), with the context check for max_tokens. */
int sl_chat_prompt_encode(const struct sl_tok *tok, int seq_len, const struct sl_chat_prompt *p,
                          int max_tokens, int32_t *ids, int *n_ids, struct sl_openai_error *err);

/* ---------------------------------------------------------------------------------------------
 * SLO attainment (slo.c): whether each finished request met its tier's objectives, and a ring of
 * what happened in each of the last 300 seconds and 60 minutes, from which GET /admin/slo reads
 * the last 1, 5 and 60 minutes. Nothing here reads a clock: every call takes `now` (sl_clock_ns,
 * monotonic), so tests drive it with a fake one.
 *
 * Which requests count: those that reached an engine and ended, finished (stop or length) or
 * failed (an error). A cancelled request (its client left, or a drain ended it) is not counted:
 * it says nothing about the promise. A refused request never ran: it is counted apart, by
 * admission's reason, and a degraded one by the kind of step that changed it (as well as by its
 * attainment, when it ran).
 *
 * The objectives are its tier's (the tier it ran in, after a demotion), ttft_slo_ms and
 * tpot_slo_ms; an objective of 0 (none: a configuration cannot set it, a tier table built in code
 * can) is not counted for the tier's requests.
 *  - ttft: met when the time from its arrival to its first token is at most ttft_slo_ms (a request
 *    that ended without a token with text has its end as its first token, as the TTFT histogram);
 *  - tpot: met when (e2e - ttft) <= tpot_slo_ms * (completion_tokens - 1), i.e. its time per
 *    output token, as sluice:time_per_output_token_seconds defines it, is within the objective;
 *    not counted for a request with fewer than two completion tokens, which has no TPOT;
 *  - both: met when every objective counted for it was met; a request for which none was counted
 *    meets it. A request that met `both` is goodput.
 * A failed request misses every objective its tier has, and both, whatever its latencies.
 */

enum sl_slo_objective {
    SL_SLO_OBJECTIVE_TTFT,
    SL_SLO_OBJECTIVE_TPOT,
    SL_SLO_OBJECTIVE_BOTH,
    SL_SLO_N_OBJECTIVES,
};
/* The objective label: "ttft", "tpot", "both". */
const char *sl_slo_objective_str(enum sl_slo_objective o);

/* How one objective went for one request. Zero is "not counted", so a zeroed verdict counts
 * nothing. */
enum sl_slo_mark {
    SL_SLO_MARK_NONE,
    SL_SLO_MARK_MISSED,
    SL_SLO_MARK_MET,
};

struct sl_slo_verdict {
    enum sl_slo_mark mark[SL_SLO_N_OBJECTIVES];
    /* Its TTFT and TPOT for the windows' quantiles, read only when mark[BOTH] counts it; < 0:
     * none (a failed request's latencies are not in them, nor the TPOT of one token). */
    int64_t ttft_ns, tpot_ns;
};

/* A request at its end, as the SLO judges it. */
struct sl_slo_request {
    bool failed;           /* it ended in an error */
    int64_t ttft_ns;       /* arrival to the first token with text; < 0: none (its end is taken) */
    int64_t e2e_ns;        /* arrival to its end */
    int completion_tokens; /* all its choices together */
};

/* Judges r against objectives of ttft_slo_ms and tpot_slo_ms (0: none), as above. */
void sl_slo_judge(int ttft_slo_ms, int tpot_slo_ms, const struct sl_slo_request *r,
                  struct sl_slo_verdict *v);

/* What one request adds to one (tier, tenant) series. */
struct sl_slo_event {
    struct sl_slo_verdict v;      /* all NONE: it did not run to an end that counts */
    enum sl_admit_reason refused; /* why admission refused it; NONE: not refused */
    unsigned degraded;            /* struct sl_admit's degraded_by: 0 when not degraded */
};

enum sl_slo_window {
    SL_SLO_WINDOW_1M,  /* the 60 seconds up to now's, now's included */
    SL_SLO_WINDOW_5M,  /* the 300 seconds up to now's */
    SL_SLO_WINDOW_60M, /* now's minute so far and the 59 before it */
    SL_SLO_N_WINDOWS,
};
/* "1m", "5m", "60m". */
const char *sl_slo_window_str(enum sl_slo_window w);

/* What a window holds. Quantiles come from log-scale histograms: 64 bins, the first everything up
 * to 100 us, each next one 2^(1/3) (26 %) wider, the last everything past 166 s. A quantile is the
 * nearest-rank value's bin, interpolated geometrically inside it (so within 26 % of the exact
 * value, usually much closer); one past the last bound reads as that bound, 166 s. */
struct sl_slo_summary {
    uint64_t counted[SL_SLO_N_OBJECTIVES]; /* requests counted for each objective */
    uint64_t met[SL_SLO_N_OBJECTIVES];
    double ttft_p50, ttft_p99, tpot_p50, tpot_p99; /* seconds; < 0 when none was observed */
    uint64_t refused[SL_ADMIT_N_REASONS];          /* by reason ([NONE] stays 0) */
    uint64_t degraded[SL_OVERLOAD_N_KINDS];        /* by kind of step; one request may count in
                                                      several */
};

/* The windows of one series: a fixed ring of 300 one-second slots (the 1m and 5m windows) and
 * 60 one-minute slots (the 60m window), each with its counts and two histograms, about 210 KiB
 * whatever the traffic (sl_slo_ring_bytes). Per-second slots for the whole hour would be 3600 of
 * them, twelve times the memory, for a precision of the 60m window's start that no one reads;
 * per-minute slots alone would make the 1m window anything from 1 to 2 minutes long.
 *
 * A slot is recycled by the first event of its next second (or minute), so nothing ever expires
 * by a timer. An event older than what its slot now holds (5 minutes older than the newest of the
 * second ring, or an hour of the minute ring: only a caller's clock running backwards) is dropped
 * there. Not thread-safe: its owner locks. */
struct sl_slo_ring;

struct sl_slo_ring *sl_slo_ring_new(void);
void sl_slo_ring_free(struct sl_slo_ring *r);
/* Bytes of one ring (its whole memory, allocated by sl_slo_ring_new). */
size_t sl_slo_ring_bytes(void);
/* Counts e in the second and the minute of now_ns. */
void sl_slo_ring_add(struct sl_slo_ring *r, uint64_t now_ns, const struct sl_slo_event *e);
/* Window w as it stands at now_ns. */
void sl_slo_ring_read(const struct sl_slo_ring *r, uint64_t now_ns, enum sl_slo_window w,
                      struct sl_slo_summary *s);
/* A window summed over several rings (one tier's series, one per tenant): init it, add each
 * ring's window (its owner locking it), then read the sum's summary, whose quantiles are those of
 * the merged histograms (not an average of each ring's). */
#define SL_SLO_BINS 64
struct sl_slo_acc {
    struct sl_slo_summary s; /* counts so far; quantiles filled by sl_slo_acc_summary */
    uint64_t ttft[SL_SLO_BINS], tpot[SL_SLO_BINS], n_ttft, n_tpot;
};
void sl_slo_acc_init(struct sl_slo_acc *acc);
void sl_slo_ring_accumulate(const struct sl_slo_ring *r, uint64_t now_ns, enum sl_slo_window w,
                            struct sl_slo_acc *acc);
void sl_slo_acc_summary(const struct sl_slo_acc *acc, struct sl_slo_summary *s);
/* Appends s as a JSON object: requests, ttft_requests, ttft_met, tpot_requests, tpot_met,
 * both_met, attainment (both_met / requests, null without requests), ttft_p50, ttft_p99,
 * tpot_p50, tpot_p99 (seconds, null without observations), refused {reason: n} and degraded
 * {kind: n} (only those not zero). */
void sl_slo_summary_json(struct sl_str *out, const struct sl_slo_summary *s);

/* ---------------------------------------------------------------------------------------------
 * Metrics (metrics.c): counters and histograms that GET /metrics exposes in Prometheus text
 * format 0.0.4, with the scheduler's gauges.
 *
 * Recording is lock-free and cheap: every cell is a relaxed atomic counter, and there is one
 * shard of cells per I/O thread, so a thread recording into its own shard never shares a cache
 * line with another. Any thread may record into any shard (totals stay exact); a scrape sums the
 * shards. Durations are kept as integer nanoseconds, so bucket edges are exact and inclusive
 * (an observation equal to a bound counts in that bucket, as Prometheus' `le` says).
 *
 * Labels come from names given as strings (tiers and tenants come from configuration), interned
 * on first use into fixed tables: SL_METRICS_MAX_TIERS tier names, SL_METRICS_MAX_TENANTS tenant
 * names and SL_METRICS_MAX_ROUTES route names, for the life of the process (a reload that renames
 * a tier keeps the old series). A name past its table's cap, longer than SL_METRICS_MAX_NAME
 * bytes, empty or NULL is counted under SL_METRICS_OTHER ("other"), as is the name "other"
 * itself, so no series is ever exposed twice. Only a name not seen before takes a mutex.
 */

#define SL_METRICS_MAX_TIERS 16
#define SL_METRICS_MAX_TENANTS 128
#define SL_METRICS_MAX_MODELS 8  /* as SL_MODELS_MAX */
#define SL_METRICS_MAX_ROUTES 24 /* the route table has 16 labels: room for more */
#define SL_METRICS_MAX_NAME 128
#define SL_METRICS_OTHER "other"
/* (tier, tenant) pairs with SLO windows (sl_slo_ring_bytes each, about 210 KiB): past this many a
 * new pair's events go to its tier's "other" tenant, whose series are not capped (one per tier at
 * most), so the windows never take more than about 56 MiB. */
#define SL_METRICS_MAX_SLO_SERIES 256

/* How an inference request ended: the `outcome` label of sluice:requests_total. */
enum sl_metrics_outcome {
    SL_METRICS_OUTCOME_STOP,      /* finished: stop token or stop string */
    SL_METRICS_OUTCOME_LENGTH,    /* finished: max_tokens or the context */
    SL_METRICS_OUTCOME_CANCELLED, /* the client left, or the server shut down */
    SL_METRICS_OUTCOME_ERROR,     /* a 5xx, or the engine failed mid-stream */
    SL_METRICS_OUTCOME_INVALID,   /* a 4xx other than 429: the request cannot be served as sent */
    SL_METRICS_OUTCOME_REJECTED,  /* 429 or 503 before the engine ran it: over capacity */
    SL_METRICS_N_OUTCOMES,
};

/* The label value ("stop", …, "rejected"). */
const char *sl_metrics_outcome_str(enum sl_metrics_outcome o);
/* The outcome of a request that ended with `finish` (sl_finish_str(), or NULL when the engine
 * never finished it) and HTTP status `http_status`. */
enum sl_metrics_outcome sl_metrics_outcome_of(const char *finish, int http_status);

struct sl_metrics;

/* n_shards >= 1 (one per I/O thread). Allocation failure aborts. */
struct sl_metrics *sl_metrics_new(int n_shards);
void sl_metrics_free(struct sl_metrics *m);

/* Recording: any thread, `shard` is the caller's I/O thread index (taken modulo the number of
 * shards). Durations in seconds; negative or NaN durations count as 0. */

/* Time to first token of one request of `tier`. */
void sl_metrics_observe_ttft(struct sl_metrics *m, int shard, const char *tier, double seconds);
/* Inter-token latency: `gap_seconds` passed since the previous text of the request and the new
 * text carries n_tokens >= 1 tokens, so each of them is observed at gap / n_tokens (the sum grows
 * by the whole gap, the count by n_tokens). */
void sl_metrics_observe_itl(struct sl_metrics *m, int shard, const char *tier, double gap_seconds,
                            int n_tokens);

/* One inference request at its end, counted once. */
struct sl_metrics_request {
    const char *tier;
    const char *tenant;
    enum sl_metrics_outcome outcome;
    bool engine;           /* it was handed to the engine: the fields below count */
    int prompt_tokens;     /* added to sluice:prompt_tokens_total */
    int completion_tokens; /* added to sluice:generation_tokens_total */
    double ttft_seconds;   /* < 0 when no token came back (only used for TPOT here) */
    double e2e_seconds;    /* observed when the outcome is STOP or LENGTH */
    double queue_seconds;  /* < 0 when it never ran */
    /* Metering, when it reached an engine: its model, cost (nano-units) and device time. */
    const char *model;
    int64_t cost;
    int64_t device_ns;
    /* SLO attainment: its verdict (sl_slo_judge; zeroed when it is not counted), and what
     * admission did: refused (its reason; NONE when not refused) and degraded (struct
     * sl_admit's degraded_by), both counted under policy_tier (the tier whose overload policy
     * decided; NULL: tier). now_ns is its end (sl_clock_ns): the second /admin/slo counts it in. */
    struct sl_slo_verdict slo;
    enum sl_admit_reason refused;
    unsigned degraded;
    const char *policy_tier;
    uint64_t now_ns;
};

/* Counts r in sluice:requests_total and, when r->engine, its tokens; observes its queue time;
 * for STOP and LENGTH observes e2e and, with more than one completion token and a TTFT, the time
 * per output token (e2e - ttft) / (completion_tokens - 1). Its SLO verdict goes to
 * sluice:slo_requests_total and, with its refusal or degradation, to the windows of /admin/slo. */
void sl_metrics_request_done(struct sl_metrics *m, int shard, const struct sl_metrics_request *r);
/* Any HTTP request at its end (every request once, whatever its route): sluice:http_requests_total
 * by route (a name from a fixed set chosen by the caller, never a client's path) and status. */
void sl_metrics_http_done(struct sl_metrics *m, int shard, const char *route, int code);

/* Appends the whole exposition: every family with # HELP and # TYPE, then the scheduler's gauges
 * from st (omitted when st is NULL). Any thread; concurrent recording may or may not be seen. */
void sl_metrics_render(struct sl_metrics *m, const struct sl_sched_stats *st, struct sl_str *out);
/* The same with the gauges of n schedulers, one per served model and replica (names[i] labels
 * st[i] as model="NAME" when n > 1; one scheduler's gauges carry no model label; replicas, when
 * not NULL, adds replica="R", the scheduler's index among its model's). */
void sl_metrics_render_models(struct sl_metrics *m, const char *const *names, const int *replicas,
                              const struct sl_sched_stats *st, int n, struct sl_str *out);
/* The gauges the Gateway API Inference Extension's endpoint picker reads, under vLLM's names
 * (the config key vllm_metrics): of n schedulers, st[i] serving the model names[i] (a model's
 * replicas share its name), one series per model labelled model_name="NAME", its replicas summed:
 * vllm:num_requests_waiting and vllm:num_requests_running (requests), vllm:kv_cache_usage_perc
 * and vllm:gpu_cache_usage_perc (blocks used over blocks, a fraction in 0..1; 0 without blocks),
 * and vllm:cache_config_info{block_size, num_gpu_blocks, enable_prefix_caching} 1
 * (enable_prefix_caching "True" or "False" as prefix_caching says), each family with # HELP and
 * # TYPE gauge. Any thread. */
void sl_metrics_render_vllm(const char *const *names, const struct sl_sched_stats *st, int n,
                            bool prefix_caching, struct sl_str *out);
/* GET /admin/slo's body: {"object": "slo", "windows": ["1m", "5m", "60m"], "tiers": [...]}, each
 * tier {"tier", "ttft_slo_ms", "tpot_slo_ms", "tenants": [...]} (the configuration ten's tiers in
 * its order, then any other with windows, its objectives null), each tenant with windows
 * {"tenant", "1m": {...}, "5m": {...}, "60m": {...}} as sl_slo_summary_json writes them, read at
 * now_ns. Any thread. */
void sl_metrics_slo_json(struct sl_metrics *m, const struct sl_tenancy *ten, uint64_t now_ns,
                         struct sl_str *out);
/* GET /admin/stats' figures of one tier of the configuration, as the members of a JSON object
 * (no braces): "ttft_slo_ms", "tpot_slo_ms", "windows" {"1m", "5m"} (each as sl_slo_summary_json
 * writes it, over every tenant's series of the tier: the same windows /admin/slo shows per
 * tenant) and "decisions" {"admitted", "degraded", "rejected"}, each {reason: count} of
 * sluice:admission_decisions_total since start (only counts above 0). Any thread. */
void sl_metrics_tier_json(struct sl_metrics *m, const struct sl_tier *cfg, uint64_t now_ns,
                          struct sl_str *out);
/* One admission decision on a request classified into `tier`:
 * sluice:admission_decisions_total{tier, decision, reason}. */
void sl_metrics_admission(struct sl_metrics *m, int shard, const char *tier,
                          enum sl_admit_decision d, enum sl_admit_reason r);

#endif
