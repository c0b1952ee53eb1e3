/* Streamed answers: the head and each API's opening events, one event per text the scheduler
 * sends (OpenAI's chunks, Anthropic's content_block_delta), log probabilities, back-pressure
 * (text held back from a slow client, a hard cap past which its request is cancelled), and the
 * stream's end.
 */
#include "api_impl.h"

#include <string.h>

/* ---- log probabilities ---- */

void api_lp_append(struct api_exchange *a, struct choice *ch, const struct sl_token_logprobs *e,
                   int n)
{
    if (!a->want_lp || n <= 0)
        return;
    if (ch->n_lp + n > ch->cap_lp) {
        while (ch->n_lp + n > ch->cap_lp)
            ch->cap_lp = ch->cap_lp ? 2 * ch->cap_lp : 64;
        ch->lp = sl_xrealloc(ch->lp, sizeof *ch->lp * (size_t)ch->cap_lp);
    }
    memcpy(ch->lp + ch->n_lp, e, sizeof *e * (size_t)n);
    ch->n_lp += n;
}

const struct sl_openai_logprobs *api_lp_pending(struct api_exchange *a, const struct choice *ch,
                                                struct sl_openai_logprobs *buf)
{
    if (!a->want_lp)
        return NULL;
    *buf = (struct sl_openai_logprobs){.tok = sl_model_tok(a->t->api->engines[a->engine].model),
                                       .e = ch->lp,
                                       .n = ch->n_lp,
                                       .text_offset = ch->lp_offset};
    return buf;
}

/* The pending entries went out in a chunk: the next chunk's offsets start after their text. */
static void lp_sent(struct choice *ch, const struct sl_openai_logprobs *lp)
{
    for (int i = 0; lp && i < lp->n; i++)
        ch->lp_offset += sl_openai_token_len(lp->tok, lp->e[i].prev, lp->e[i].token);
    ch->n_lp = 0;
}

/* ---- events ---- */

static void send_payload(struct api_exchange *a, const char *event, const struct sl_str *b)
{
    if (event)
        sl_http_send_sse_event(a->x, event, b->p ? b->p : "", b->len);
    else
        sl_http_send_sse(a->x, b->p ? b->p : "", b->len);
}

/* An event whose data never changes. */
static void send_fixed(struct api_exchange *a, const char *event, const char *data)
{
    sl_http_send_sse_event(a->x, event, data, strlen(data));
}

static char *put(char *p, struct sl_strv s)
{
    memcpy(p, s.p, s.len);
    return p + s.len;
}

/* The common event, a text with no log probabilities and no finish: its JSON is written straight
 * into the connection's output, between parts made once per stream. */
static void send_text(struct api_exchange *a, const char *event, struct sl_strv pre,
                      const char *text, size_t len, struct sl_strv post)
{
    char *p = sl_http_sse_begin(a->x, event, pre.len + SL_JSON_ESCAPED_MAX(len) + post.len);
    p = put(p, pre);
    p = sl_json_escape(p, text, len);
    sl_http_sse_commit(a->x, put(p, post));
}

void api_stream_chunk(struct api_exchange *a, struct choice *ch, const char *text, size_t len,
                      enum sl_finish finish, bool lp_all)
{
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    if (a->kind == API_ANTHROPIC) {
        /* The finish goes in message_delta at the end; a chunk without text says nothing. */
        if (len == 0)
            return;
        if (sl_utf8_valid(text, len)) {
            send_text(a, "content_block_delta", sl_anthropic_delta_pre, text, len,
                      sl_anthropic_delta_post);
            return;
        }
        sl_anthropic_delta_encode(b, text, len);
        send_payload(a, "content_block_delta", b);
        sl_str_clear(b);
        return;
    }
    struct sl_openai_logprobs lpb;
    const struct sl_openai_logprobs *lp =
        lp_all && ch->n_lp == 0 ? NULL : api_lp_pending(a, ch, &lpb);
    if (!lp && finish == SL_FINISH_NONE && ch->chunk_pre.len > 0) {
        send_text(a, NULL, ch->chunk_pre, text, len, ch->chunk_post);
        return;
    }
    a->ident.index = (int)(ch - a->ch);
    sl_openai_chunk_encode(b, &a->ident, text, len, finish, lp);
    lp_sent(ch, lp);
    send_payload(a, NULL, b);
    sl_str_clear(b);
}

void api_stream_head(struct api_exchange *a)
{
    if (a->x->head_sent)
        return;
    /* Chunked (HTTP/1.1): what the request cost follows the last chunk as a trailer. */
    sl_http_send_head(a->x, 200, "text/event-stream",
                      api_headers(a, sl_exchange_chunked(a->x)
                                         ? "Cache-Control: no-cache\r\nTrailer: x-sluice-cost\r\n"
                                         : "Cache-Control: no-cache\r\n"));
    struct sl_str *b = &a->t->out;
    if (a->kind == API_ANTHROPIC) {
        sl_str_clear(b);
        /* Its first token is out: the prefix cache's part of the prompt is final. */
        a->ident.cached_tokens = api_cached_tokens(a);
        sl_anthropic_message_start_encode(b, &a->ident, a->n_prompt);
        send_payload(a, "message_start", b);
        sl_str_clear(b);
        send_fixed(a, "content_block_start",
                   "{\"type\":\"content_block_start\",\"index\":0,"
                   "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}");
        return;
    }
    for (int i = 0; i < a->n_ch; i++) {
        struct choice *ch = &a->ch[i];
        a->ident.index = i;
        sl_str_clear(b);
        size_t n_pre = sl_openai_chunk_affixes(&a->ident, b);
        const char *both = sl_arena_strndup(&a->x->arena, b->p, b->len);
        ch->chunk_pre = (struct sl_strv){both, n_pre};
        ch->chunk_post = (struct sl_strv){both + n_pre, b->len - n_pre};
        if (a->ident.api == SL_OPENAI_API_CHAT) {
            /* A chat stream opens each choice with the assistant's role. */
            sl_str_clear(b);
            sl_openai_chunk_role_encode(b, &a->ident);
            send_payload(a, NULL, b);
            sl_str_clear(b); /* callers encode into the same scratch next */
        }
        if (ch->echo_pending) {
            /* echo: the prompt goes out as each choice's first chunk (as vLLM sends it). */
            ch->echo_pending = false;
            sl_str_clear(b);
            sl_openai_chunk_encode(b, &a->ident, ch->text.p ? ch->text.p : "", ch->text.len,
                                   SL_FINISH_NONE, NULL);
            send_payload(a, NULL, b);
            sl_str_clear(b);
            sl_str_clear(&ch->text);
        }
    }
}

/* The last chunk, with what the request cost as a trailer (announced in the head). */
static void stream_close(struct api_exchange *a)
{
    char t[64];
    if (a->metered)
        snprintf(t, sizeof t, "x-sluice-cost: %s\r\n", a->cost);
    sl_http_end_trailers(a->x, a->metered ? t : NULL);
}

void api_stream_end(struct api_exchange *a, const struct sl_openai_error *err)
{
    struct sl_str *b = &a->t->out;
    sl_str_clear(b);
    if (a->kind == API_ANTHROPIC) {
        if (err) {
            sl_anthropic_error_encode(b, err);
            send_payload(a, "error", b);
        } else {
            send_fixed(a, "content_block_stop", "{\"type\":\"content_block_stop\",\"index\":0}");
            sl_anthropic_message_delta_encode(b, &a->ident, a->ch[0].finish, api_stop_sequence(a),
                                              a->n_prompt, a->n_gen);
            send_payload(a, "message_delta", b);
            send_fixed(a, "message_stop", "{\"type\":\"message_stop\"}");
        }
        stream_close(a);
        return;
    }
    if (err) {
        sl_openai_error_encode(b, err);
        send_payload(a, NULL, b);
    } else if (a->include_usage) {
        sl_openai_usage_chunk_encode(b, &a->ident, a->n_prompt, a->n_gen);
        send_payload(a, NULL, b);
    }
    sl_http_send_sse(a->x, "[DONE]", 6);
    stream_close(a);
}

/* ---- back-pressure ---- */

void api_stream_release(struct api_exchange *a)
{
    for (int i = 0; i < a->n_ch; i++) {
        struct choice *ch = &a->ch[i];
        if (ch->held.len == 0)
            continue;
        api_stream_chunk(a, ch, ch->held.p, ch->held.len, SL_FINISH_NONE, false);
        sl_str_clear(&ch->held);
    }
}

static size_t held_bytes(const struct api_exchange *a)
{
    size_t n = 0;
    for (int i = 0; i < a->n_ch; i++)
        n += a->ch[i].held.len;
    return n;
}

/* Redis-style output limits for a stream. Above write_high_water_bytes queued for the client,
 * text is held and later sent as one chunk per choice (clients concatenate chunks), so a slow
 * reader costs its text, not a JSON chunk per token. Past write_hard_cap_bytes (queued + held)
 * the client is not reading: the request is cancelled in the scheduler and the connection
 * closed. "Queued" is what the kernel has not taken yet (tcp_send_buffer_bytes bounds the
 * kernel's part). */
bool api_stream_hold(struct api_exchange *a, struct choice *ch, const char *text, size_t len)
{
    const struct sl_config_http *hc = sl_config_http(a->cfg);
    size_t queued = sl_http_queued(a->x);
    size_t high = hc->write_high_water_bytes;
    if (held_bytes(a) == 0 && queued <= high)
        return false;
    sl_str_append(&ch->held, text, len);
    if (queued <= high) {
        api_stream_release(a);
        return true;
    }
    size_t held = held_bytes(a);
    if (queued + held > hc->write_hard_cap_bytes) {
        sl_log(SL_LOG_WARN,
               "io %d: %s: client is %zu bytes behind the stream (write_hard_cap_bytes %zu); "
               "cancelling",
               a->t->idx, a->ident.id, queued + held, hc->write_hard_cap_bytes);
        sl_http_abort(a->x);
    }
    return true;
}
