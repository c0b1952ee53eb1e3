/* Chat templates: recognising a model's Jinja template, rendering messages in C, and tokenizing
 * the result with its markers as special tokens.
 *
 * Jinja templates are programs; running them needs a Jinja engine, which sluice does not have
 * and does not want on the request path. What models ship is a handful of well-known formats,
 * so, like llama.cpp's llm_chat_detect_template, a template is recognised by markers only it has
 * and rendered by a few lines of C per format. A template that is not recognised is rendered
 * with the plain default, and the operator is told once at start-up; the config key
 * chat_template names a builtin to override the model's.
 *
 * Rendering records which bytes are markers so that tokenizing can turn them into the special
 * tokens the model was trained with. Message content is never searched for markers: a user who
 * types "<|im_start|>" gets those characters, not a forged turn (except that a Hugging Face
 * tokenizer matches its added tokens in any text, as it does for /v1/completions prompts).
 */
#include "gateway_impl.h"

#include <stdlib.h>
#include <string.h>

/* The names are the configuration's (what "chat_template" may say), in this enum's order. */
_Static_assert(SL_CHAT_TEMPLATE_COUNT == SL_CONFIG_CHAT_TEMPLATES,
               "every builtin chat template is named in config.c, in order");

const char *sl_chat_template_name(enum sl_chat_template t)
{
    return (unsigned)t < SL_CHAT_TEMPLATE_COUNT ? sl_config_chat_templates[t] : "unknown";
}

int sl_chat_template_from_name(const char *name)
{
    for (int i = 0; i < SL_CHAT_TEMPLATE_COUNT; i++)
        if (strcmp(sl_config_chat_templates[i], name) == 0)
            return i;
    return -1;
}

int sl_chat_template_detect(const char *jinja)
{
    if (!jinja)
        return -1;
#define HAS(s) (strstr(jinja, (s)) != NULL)
    /* Order matters where formats share a marker: Phi-3 also has <|user|> (Zephyr's); Llama-2
     * and Mistral share [INST], and only Llama-2 wraps the system prompt in <<SYS>>. */
    if (HAS("<|im_start|>"))
        return SL_CHAT_TEMPLATE_CHATML;
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>"))
        return SL_CHAT_TEMPLATE_LLAMA3;
    if (HAS("[INST]"))
        return HAS("<<SYS>>") ? SL_CHAT_TEMPLATE_LLAMA2 : SL_CHAT_TEMPLATE_MISTRAL;
    if (HAS("<start_of_turn>"))
        return SL_CHAT_TEMPLATE_GEMMA;
    if (HAS("<|assistant|>") && HAS("<|end|>"))
        return SL_CHAT_TEMPLATE_PHI3;
    if (HAS("<|user|>"))
        return SL_CHAT_TEMPLATE_ZEPHYR;
#undef HAS
    return -1;
}

enum sl_chat_template sl_chat_template_of_model(const struct sl_model *m)
{
    const char *jinja = sl_model_chat_template(m);
    int t = sl_chat_template_detect(jinja);
    if (t >= 0) {
        sl_log(SL_LOG_INFO,
               "model %s: chat template recognised as \"%s\" (the config key chat_template may "
               "name another)",
               sl_model_id(m), sl_config_chat_templates[t]);
        return (enum sl_chat_template)t;
    }
    if (jinja)
        sl_log(SL_LOG_WARN,
               "model %s: its chat template (%zu bytes, starting \"%.40s\") is not one sluice "
               "recognises; chat requests use the default \"plain\" template unless the config "
               "key chat_template names another",
               sl_model_id(m), strlen(jinja), jinja);
    else
        sl_log(SL_LOG_INFO,
               "model %s has no chat template: chat requests use the default \"plain\" (the "
               "config key chat_template may name another)",
               sl_model_id(m));
    return SL_CHAT_TEMPLATE_PLAIN;
}

/* ---------------------------------------------------------------------------------------------
 * Rendering
 */

void sl_chat_prompt_init(struct sl_chat_prompt *p)
{
    memset(p, 0, sizeof *p);
    sl_str_init(&p->text);
}

void sl_chat_prompt_dispose(struct sl_chat_prompt *p)
{
    sl_str_dispose(&p->text);
    free(p->segs);
    memset(p, 0, sizeof *p);
}

static void put(struct sl_chat_prompt *p, const char *s, size_t n, bool special)
{
    if (n == 0)
        return;
    struct sl_chat_seg *last = p->n_segs ? &p->segs[p->n_segs - 1] : NULL;
    if (last && !special && !last->special) {
        last->len += n;
    } else {
        if (p->n_segs == p->cap_segs) {
            p->cap_segs = p->cap_segs ? 2 * p->cap_segs : 16;
            p->segs = sl_xrealloc(p->segs, (size_t)p->cap_segs * sizeof *p->segs);
        }
        p->segs[p->n_segs++] = (struct sl_chat_seg){p->text.len, n, special};
    }
    sl_str_append(&p->text, s, n);
}

static void text(struct sl_chat_prompt *p, const char *s)
{
    put(p, s, strlen(s), false);
}

static void mark(struct sl_chat_prompt *p, const char *s)
{
    put(p, s, strlen(s), true);
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* The message's content, with surrounding whitespace removed when trim (Jinja's trim, Python's
 * strip(), which the templates that use it apply). */
static void content(struct sl_chat_prompt *p, const struct sl_chat_msg *m, bool trim)
{
    const char *s = m->content;
    size_t n = m->len;
    while (trim && n && is_space(s[0]))
        s++, n--;
    while (trim && n && is_space(s[n - 1]))
        n--;
    put(p, s, n, false);
}

static const char *role_name(enum sl_chat_role r)
{
    switch (r) {
    case SL_CHAT_ROLE_SYSTEM: return "system";
    case SL_CHAT_ROLE_USER: return "user";
    case SL_CHAT_ROLE_ASSISTANT: break;
    }
    return "assistant";
}

static void render_plain(struct sl_chat_prompt *p, const struct sl_chat_msg *msgs, int n)
{
    for (int i = 0; i < n; i++) {
        text(p, role_name(msgs[i].role));
        text(p, ": ");
        content(p, &msgs[i], false);
        text(p, "\n");
    }
    text(p, "assistant:");
}

static void render_chatml(struct sl_chat_prompt *p, const struct sl_chat_msg *msgs, int n)
{
    for (int i = 0; i < n; i++) {
        mark(p, "<|im_start|>");
        text(p, role_name(msgs[i].role));
        text(p, "\n");
        content(p, &msgs[i], false);
        mark(p, "<|im_end|>");
        text(p, "\n");
    }
    mark(p, "<|im_start|>");
    text(p, "assistant\n");
}

static void render_llama3(struct sl_chat_prompt *p, const struct sl_chat_msg *msgs, int n)
{
    for (int i = 0; i < n; i++) {
        mark(p, "<|start_header_id|>");
        text(p, role_name(msgs[i].role));
        mark(p, "<|end_header_id|>");
        text(p, "\n\n");
        content(p, &msgs[i], true);
        mark(p, "<|eot_id|>");
    }
    mark(p, "<|start_header_id|>");
    text(p, "assistant");
    mark(p, "<|end_header_id|>");
    text(p, "\n\n");
}

/* Phi-3 and Zephyr: a role marker on its own line, the content, an end marker. */
static void render_role_marked(struct sl_chat_prompt *p, const struct sl_chat_msg *msgs, int n,
                               const char *end)
{
    static const char *const markers[] = {
        [SL_CHAT_ROLE_SYSTEM] = "<|system|>",
        [SL_CHAT_ROLE_USER] = "<|user|>",
        [SL_CHAT_ROLE_ASSISTANT] = "<|assistant|>",
    };
    for (int i = 0; i < n; i++) {
        mark(p, markers[msgs[i].role]);
        text(p, "\n");
        content(p, &msgs[i], false);
        mark(p, end);
        text(p, "\n");
    }
    mark(p, "<|assistant|>");
    text(p, "\n");
}

/* System messages of the formats without a system turn (Llama-2 wraps them, Mistral and Gemma
 * prepend them) go into the next user turn: their text, joined by blank lines. Returns the
 * index of the first message after a run of system messages starting at i, and sets the run. */
static int system_run(const struct sl_chat_msg *msgs, int n, int i, int *first)
{
    *first = i;
    while (i < n && msgs[i].role == SL_CHAT_ROLE_SYSTEM)
        i++;
    return i;
}

static void system_text(struct sl_chat_prompt *p, const struct sl_chat_msg *msgs, int from, int to,
                        bool trim)
{
    for (int k = from; k < to; k++) {
        if (k > from)
            text(p, "\n\n");
        content(p, &msgs[k], trim);
    }
}

/* The Llama-2-chat template: "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant}
 * </s><s>[INST] …", contents stripped. The first <s> is the BOS the tokenizer adds. */
static void render_llama2(struct sl_chat_prompt *p, const struct sl_chat_msg *msgs, int n)
{
    bool first = true;
    for (int i = 0; i < n;) {
        int s0, s1 = system_run(msgs, n, i, &s0);
        if (s1 > s0 || msgs[i].role == SL_CHAT_ROLE_USER) {
            /* A user turn, with the system messages before it (or alone when none follows). */
            if (!first)
                mark(p, "<s>");
            text(p, "[INST] ");
            if (s1 > s0) {
                text(p, "<<SYS>>\n");
                system_text(p, msgs, s0, s1, true);
                text(p, "\n<</SYS>>\n\n");
            }
            i = s1;
            if (i < n && msgs[i].role == SL_CHAT_ROLE_USER)
                content(p, &msgs[i++], true);
            text(p, " [/INST]");
        } else {
            text(p, " ");
            content(p, &msgs[i++], true);
            text(p, " ");
            mark(p, "</s>");
        }
        first = false;
    }
}

/* Mistral-7B-Instruct: "[INST] {user} [/INST]{assistant}</s>[INST] …"; system text opens the next
 * user turn. */
static void render_mistral(struct sl_chat_prompt *p, const struct sl_chat_msg *msgs, int n)
{
    for (int i = 0; i < n;) {
        int s0, s1 = system_run(msgs, n, i, &s0);
        if (s1 > s0 || msgs[i].role == SL_CHAT_ROLE_USER) {
            text(p, "[INST] ");
            system_text(p, msgs, s0, s1, false);
            i = s1;
            if (i < n && msgs[i].role == SL_CHAT_ROLE_USER) {
                if (s1 > s0)
                    text(p, "\n\n");
                content(p, &msgs[i++], false);
            }
            text(p, " [/INST]");
        } else {
            content(p, &msgs[i++], false);
            mark(p, "</s>");
        }
    }
}

/* Gemma: user and model turns only; system text opens the next user turn. Contents trimmed. */
static void render_gemma(struct sl_chat_prompt *p, const struct sl_chat_msg *msgs, int n)
{
    for (int i = 0; i < n;) {
        int s0, s1 = system_run(msgs, n, i, &s0);
        mark(p, "<start_of_turn>");
        if (s1 > s0 || msgs[i].role == SL_CHAT_ROLE_USER) {
            text(p, "user\n");
            system_text(p, msgs, s0, s1, true);
            i = s1;
            if (i < n && msgs[i].role == SL_CHAT_ROLE_USER) {
                if (s1 > s0)
                    text(p, "\n\n");
                content(p, &msgs[i++], true);
            }
        } else {
            text(p, "model\n");
            content(p, &msgs[i++], true);
        }
        mark(p, "<end_of_turn>");
        text(p, "\n");
    }
    mark(p, "<start_of_turn>");
    text(p, "model\n");
}

void sl_chat_render(struct sl_chat_prompt *p, enum sl_chat_template t,
                    const struct sl_chat_msg *msgs, int n_msgs)
{
    sl_str_clear(&p->text);
    p->n_segs = 0;
    switch (t) {
    case SL_CHAT_TEMPLATE_CHATML: render_chatml(p, msgs, n_msgs); break;
    case SL_CHAT_TEMPLATE_LLAMA2: render_llama2(p, msgs, n_msgs); break;
    case SL_CHAT_TEMPLATE_LLAMA3: render_llama3(p, msgs, n_msgs); break;
    case SL_CHAT_TEMPLATE_MISTRAL: render_mistral(p, msgs, n_msgs); break;
    case SL_CHAT_TEMPLATE_ZEPHYR: render_role_marked(p, msgs, n_msgs, "</s>"); break;
    case SL_CHAT_TEMPLATE_GEMMA: render_gemma(p, msgs, n_msgs); break;
    case SL_CHAT_TEMPLATE_PHI3: render_role_marked(p, msgs, n_msgs, "<|end|>"); break;
    case SL_CHAT_TEMPLATE_PLAIN:
    case SL_CHAT_TEMPLATE_COUNT: render_plain(p, msgs, n_msgs); break;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Tokenizing
 */

/* Encodes text[off, off + len) after the n ids already in ids. Returns SL_OK, or SL_ERANGE with
 * *n a lower bound past seq_len. */
static int encode_run(const struct sl_tok *tok, const struct sl_chat_prompt *p, size_t off,
                      size_t len, int32_t *ids, int seq_len, int *n)
{
    if (len == 0)
        return SL_OK;
    int k = 0;
    int st = sl_tok_encode(tok, p->text.p + off, len, false, ids + *n, seq_len - *n, &k);
    *n += k;
    return st;
}

int sl_chat_prompt_encode(const struct sl_tok *tok, int seq_len, const struct sl_chat_prompt *p,
                          int max_tokens, int32_t *ids, int *n_ids, struct sl_openai_error *err)
{
    int n = 0;
    if (sl_tok_bos(tok) >= 0 && n < seq_len)
        ids[n++] = sl_tok_bos(tok);
    /* Consecutive text, and markers the vocabulary lacks, are encoded as one run, as a prompt of
     * that text would be. */
    size_t run_off = 0, run_len = 0;
    int st = SL_OK;
    for (int i = 0; i < p->n_segs && st == SL_OK; i++) {
        const struct sl_chat_seg *s = &p->segs[i];
        int32_t id = s->special ? sl_tok_special_id(tok, p->text.p + s->off, s->len) : -1;
        if (id < 0) {
            if (run_len == 0)
                run_off = s->off;
            run_len += s->len;
            continue;
        }
        st = encode_run(tok, p, run_off, run_len, ids, seq_len, &n);
        run_len = 0;
        if (st == SL_OK && n < seq_len)
            ids[n++] = id;
        else if (st == SL_OK)
            n++, st = SL_ERANGE;
    }
    if (st == SL_OK)
        st = encode_run(tok, p, run_off, run_len, ids, seq_len, &n);
    if (st == SL_ERANGE)
        return sl_openai_check_context(seq_len, n, true, max_tokens, "messages", err);
    if (st != SL_OK) {
        /* Content comes from JSON, which jansson has checked is UTF-8: not expected. */
        sl_openai_error_set(err, 400, "messages", "invalid_value",
                            "The rendered messages could not be tokenized: %s.", sl_status_str(st));
        return st;
    }
    if ((st = sl_openai_check_context(seq_len, n, false, max_tokens, "messages", err)) != SL_OK)
        return st;
    *n_ids = n;
    return SL_OK;
}
