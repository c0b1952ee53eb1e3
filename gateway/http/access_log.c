/* The access log: one JSON line per request, built from the exchange's fields (struct
 * sl_http_log, which the handler fills) and buffered per I/O thread, written once per loop
 * iteration (sl_http_io_log_flush, from the flush) or every LOG_FLUSH_BYTES.
 */
#include "http_impl.h"

#include <string.h>

/* Access-log bytes an I/O thread buffers before writing them out within an iteration. */
#define LOG_FLUSH_BYTES (16 << 10)

static void str_add(struct sl_str *w, const char *lit)
{
    sl_str_append(w, lit, strlen(lit));
}

/* Access-log lines are buffered per I/O thread and written once per loop iteration (or every
 * LOG_FLUSH_BYTES): a write(2) per request would cost as much as serving a small one. */
static void access_log_add(struct io *io, const struct sl_str *line)
{
    char prefix[SL_LOG_PREFIX_MAX];
    size_t n = sl_log_prefix(prefix, SL_LOG_INFO);
    if (n == 0)
        return;
    sl_str_append(&io->log, prefix, n);
    sl_str_append(&io->log, line->p, line->len);
    sl_str_append(&io->log, "\n", 1);
    if (io->log.len >= LOG_FLUSH_BYTES) {
        sl_log_write(io->log.p, io->log.len);
        sl_str_clear(&io->log);
    } else {
        sl_http_io_flush_later(io);
    }
}

/* Appends ns as milliseconds with three decimals. */
static void str_add_ms(struct sl_str *w, uint64_t ns)
{
    uint64_t us = ns / 1000;
    char frac[5] = {'.', (char)('0' + us / 100 % 10), (char)('0' + us / 10 % 10),
                    (char)('0' + us % 10), 0};
    sl_str_append_int(w, us / 1000);
    sl_str_append(w, frac, 4);
}

static void str_add_field(struct sl_str *l, const char *name, const char *value)
{
    str_add(l, ",\"");
    str_add(l, name);
    str_add(l, "\":\"");
    str_add(l, value);
    sl_str_append(l, "\"", 1);
}

static void str_add_int(struct sl_str *l, const char *name, long long v)
{
    str_add(l, ",\"");
    str_add(l, name);
    str_add(l, "\":");
    sl_str_append_int(l, v);
}

/* One JSON line per request, written where its outcome is decided: its response is complete,
 * or its client left. */
void sl_http_log_access(struct sl_exchange *x)
{
    if (x->logged)
        return;
    x->logged = true;
    struct sl_http_conn *c = x->conn;
    const struct sl_http_log *g = &x->log;
    uint64_t now = x->t_end_ns ? x->t_end_ns : sl_clock_ns();
    struct sl_str *l = &c->io->line;
    sl_str_clear(l);
    str_add(l, "access {\"io\":");
    sl_str_append_int(l, c->io->idx);
    str_add(l, ",\"method\":\"");
    str_add(l, x->parsed ? x->method_name : "");
    str_add(l, "\",\"path\":\"");
    if (x->parsed)
        sl_str_append_json(l, x->path.p, x->path.len > 200 ? 200 : x->path.len);
    str_add(l, "\",\"status\":");
    sl_str_append_int(l, x->status);
    /* Names are checked at load to need no escaping; keys never get this far. */
    if (g->tenant)
        str_add_field(l, "tenant", g->tenant);
    if (g->tier)
        str_add_field(l, "tier", g->tier);
    if (g->admission) {
        str_add_field(l, "admission", g->admission);
        if (g->predicted_ttft_ms >= 0)
            sl_str_appendf(l, ",\"predicted_ttft_ms\":%.0f", g->predicted_ttft_ms);
    }
    if (g->engine) {
        str_add_field(l, "model", g->model);
        if (g->replica >= 0)
            str_add_int(l, "replica", g->replica);
        str_add_field(l, "id", g->id ? g->id : "");
        str_add_int(l, "prompt_tokens", g->prompt_tokens);
        str_add_int(l, "completion_tokens", g->completion_tokens);
        str_add_field(l, "finish", g->finish ? g->finish : "none");
        if (g->n > 1)
            str_add_int(l, "n", g->n);
        if (g->ttft_ns) {
            str_add(l, ",\"ttft_ms\":");
            str_add_ms(l, g->ttft_ns);
        }
        if (g->slo) {
            static const char *const met[] = {"null", "false", "true"};
            str_add(l, ",\"ttft_met\":");
            str_add(l, met[g->ttft_met < 0 ? 0 : g->ttft_met ? 2 : 1]);
            str_add(l, ",\"tpot_met\":");
            str_add(l, met[g->tpot_met < 0 ? 0 : g->tpot_met ? 2 : 1]);
        }
        if (g->cost) {
            str_add(l, ",\"cost\":");
            str_add(l, g->cost);
            str_add(l, ",\"device_ms\":");
            str_add_ms(l, g->device_ns);
        }
    }
    str_add(l, ",\"e2e_ms\":");
    str_add_ms(l, now - x->t_start_ns);
    sl_str_append(l, "}", 1);
    access_log_add(c->io, l);
}

void sl_http_io_log_flush(struct io *io)
{
    if (io->log.len) {
        sl_log_write(io->log.p, io->log.len);
        sl_str_clear(&io->log);
    }
}
