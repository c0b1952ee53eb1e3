/* sluice-stub: a tiny OpenAI-compatible server with scripted behaviour, for sluice-bench's tests
 * and for measuring the generator against a trivial endpoint. One thread, libevent + llhttp.
 *
 * It streams `max_tokens` chunks (or --tokens), each carrying one word, the first --ttft-ms after
 * the request has arrived whole and the rest --itl-ms apart; answers the statuses of --statuses
 * in turn (429 and 503 with Retry-After headers); and logs one line per request to --log, with
 * its arrival time and how many requests were being answered, so a test can check what the
 * generator did from the server's side. */
#include <sluice/common.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <jansson.h>
#include <llhttp.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

struct opts {
    double ttft_ms, itl_ms;
    long tokens; /* 0: the request's max_tokens */
    int statuses[32];
    int n_statuses;
    double retry_after_s, retry_after_ms; /* < 0: no header */
    long drop_after;                      /* close after this many chunks; < 0: never */
    bool no_usage;
    FILE *log;
};

struct conn {
    struct server *srv;
    struct bufferevent *bev;
    llhttp_t ll;
    struct sl_str body, url, field, value, tier, auth;
    bool in_field, done, keep_alive, answering, dead;
    struct event *timer;
    /* the response being streamed */
    long left, sent;
    bool chat, usage;
    uint32_t prompt_tokens;
    char id[32];
    struct conn *next_dead;
    struct conn *prev, *next; /* every open connection, for the exit */
};

struct server {
    struct opts o;
    struct event_base *base;
    uint64_t t0;
    unsigned long seq;
    unsigned inflight;
    struct conn *dead;
    struct conn *all;
    struct event *reap;
};

static struct conn *conn_of(llhttp_t *ll)
{
    return (struct conn *)((char *)ll - offsetof(struct conn, ll));
}

static void conn_close(struct conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    if (c->answering)
        c->srv->inflight--;
    c->answering = false;
    bufferevent_disable(c->bev, EV_READ | EV_WRITE);
    bufferevent_setcb(c->bev, NULL, NULL, NULL, NULL);
    evtimer_del(c->timer);
    if (c->prev)
        c->prev->next = c->next;
    else
        c->srv->all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->next_dead = c->srv->dead;
    c->srv->dead = c;
    event_active(c->srv->reap, EV_TIMEOUT, 0);
}

static void conn_free(struct conn *c)
{
    bufferevent_free(c->bev);
    event_free(c->timer);
    sl_str_dispose(&c->body);
    sl_str_dispose(&c->url);
    sl_str_dispose(&c->field);
    sl_str_dispose(&c->value);
    sl_str_dispose(&c->tier);
    sl_str_dispose(&c->auth);
    free(c);
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct server *s = arg;
    while (s->dead) {
        struct conn *c = s->dead;
        s->dead = c->next_dead;
        conn_free(c);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Responses
 */

static void send_head(struct conn *c, int status, const char *type, long content_length)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    const char *reason = status == 200   ? "OK"
                         : status == 429 ? "Too Many Requests"
                         : status == 503 ? "Service Unavailable"
                         : status == 404 ? "Not Found"
                                         : "Error";
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\nServer: sluice-stub\r\nContent-Type: %s\r\n",
                        status, reason, type);
    if (status != 200 && c->srv->o.retry_after_ms >= 0)
        evbuffer_add_printf(out, "retry-after-ms: %g\r\n", c->srv->o.retry_after_ms);
    if (status != 200 && c->srv->o.retry_after_s >= 0)
        evbuffer_add_printf(out, "Retry-After: %g\r\n", c->srv->o.retry_after_s);
    if (content_length >= 0)
        evbuffer_add_printf(out, "Content-Length: %ld\r\n", content_length);
    else
        evbuffer_add_printf(out, "Transfer-Encoding: chunked\r\n");
    evbuffer_add_printf(out, "Connection: %s\r\n\r\n", c->keep_alive ? "keep-alive" : "close");
}

static void response_end(struct conn *c)
{
    c->answering = false;
    c->srv->inflight--;
    if (!c->keep_alive) {
        /* Close once the bytes are out. */
        bufferevent_disable(c->bev, EV_READ);
        c->done = true;
    }
}

static void send_json(struct conn *c, int status, const char *json)
{
    send_head(c, status, "application/json", (long)strlen(json));
    evbuffer_add(bufferevent_get_output(c->bev), json, strlen(json));
    response_end(c);
}

static void sse_chunk(struct conn *c, const char *data)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    size_t n = strlen(data);
    evbuffer_add_printf(out, "%zx\r\ndata: %s\n\n\r\n", n + 8, data);
}

static void stream_step(struct conn *c)
{
    char buf[512];
    if (c->left > 0) {
        if (c->srv->o.drop_after >= 0 && c->sent >= c->srv->o.drop_after) {
            conn_close(c);
            return;
        }
        if (c->chat)
            snprintf(buf, sizeof buf,
                     "{\"id\":\"%s\",\"object\":\"chat.completion.chunk\",\"model\":\"stub\","
                     "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"},"
                     "\"finish_reason\":null}],\"usage\":null}",
                     c->id);
        else
            snprintf(buf, sizeof buf,
                     "{\"id\":\"%s\",\"object\":\"text_completion\",\"model\":\"stub\","
                     "\"choices\":[{\"index\":0,\"text\":\" word\",\"finish_reason\":null}],"
                     "\"usage\":null}",
                     c->id);
        sse_chunk(c, buf);
        c->left--;
        c->sent++;
        return;
    }
    snprintf(buf, sizeof buf,
             "{\"id\":\"%s\",\"object\":\"%s\",\"model\":\"stub\",\"choices\":[{\"index\":0,%s,"
             "\"finish_reason\":\"length\"}],\"usage\":null}",
             c->id, c->chat ? "chat.completion.chunk" : "text_completion",
             c->chat ? "\"delta\":{}" : "\"text\":\"\"");
    sse_chunk(c, buf);
    if (c->usage && !c->srv->o.no_usage) {
        snprintf(buf, sizeof buf,
                 "{\"id\":\"%s\",\"object\":\"%s\",\"model\":\"stub\",\"choices\":[],"
                 "\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%ld,"
                 "\"total_tokens\":%ld}}",
                 c->id, c->chat ? "chat.completion.chunk" : "text_completion", c->prompt_tokens,
                 c->sent, c->prompt_tokens + c->sent);
        sse_chunk(c, buf);
    }
    sse_chunk(c, "[DONE]");
    evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5);
    response_end(c);
}

static void arm(struct conn *c, double ms)
{
    struct timeval tv = {.tv_sec = (time_t)(ms / 1000),
                         .tv_usec = (suseconds_t)(fmod(ms, 1000.0) * 1000)};
    evtimer_add(c->timer, &tv);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct conn *c = arg;
    /* Without a gap between tokens, everything after the first goes out at once. */
    do {
        stream_step(c);
    } while (!c->dead && c->answering && c->srv->o.itl_ms <= 0);
    if (!c->dead && c->answering)
        arm(c, c->srv->o.itl_ms);
}

static uint32_t count_words(const char *s)
{
    uint32_t n = 0;
    bool in = false;
    for (; s && *s; s++) {
        bool sp = *s == ' ' || *s == '\n' || *s == '\t';
        if (!sp && !in)
            n++;
        in = !sp;
    }
    return n;
}

static void answer(struct conn *c)
{
    struct server *s = c->srv;
    double t_ms = (double)(sl_clock_ns() - s->t0) / 1e6;
    unsigned long seq = s->seq++;
    s->inflight++;
    c->answering = true;
    const char *path = c->url.p ? c->url.p : "";
    int method = llhttp_get_method(&c->ll);
    int status = s->o.statuses[seq % (unsigned long)s->o.n_statuses];
    json_t *req = c->body.len ? json_loadb(c->body.p, c->body.len, 0, NULL) : NULL;
    json_t *mt = json_object_get(req, "max_completion_tokens");
    if (!json_is_integer(mt))
        mt = json_object_get(req, "max_tokens");
    long max_tokens = json_is_integer(mt) ? (long)json_integer_value(mt) : 16;
    c->chat = strstr(path, "/chat/completions") != NULL;
    uint32_t words = 0;
    /* The first message's text (a chat's system prompt) or the prompt, hashed (FNV-1a), so that a
     * test can tell shared prefixes from unique ones. */
    const char *first = c->chat
                            ? json_string_value(json_object_get(
                                  json_array_get(json_object_get(req, "messages"), 0), "content"))
                            : json_string_value(json_object_get(req, "prompt"));
    uint32_t first_hash = 2166136261u;
    for (const char *p = first; p && *p; p++)
        first_hash = (first_hash ^ (unsigned char)*p) * 16777619u;
    if (c->chat) {
        /* Every message's words: a system message counts as the user's does. */
        json_t *msgs = json_object_get(req, "messages");
        for (size_t i = 0; i < json_array_size(msgs); i++)
            words +=
                count_words(json_string_value(json_object_get(json_array_get(msgs, i), "content")));
    } else {
        words = count_words(json_string_value(json_object_get(req, "prompt")));
    }
    if (s->o.log) {
        fprintf(s->o.log,
                "seq=%lu t_ms=%.3f method=%s path=%s status=%d max_tokens=%ld words=%u "
                "tier=%s auth=%s inflight=%u ignore_eos=%d first=%08x\n",
                seq, t_ms, llhttp_method_name(method), path, status, max_tokens, words,
                c->tier.p ? c->tier.p : "-", c->auth.p ? c->auth.p : "-", s->inflight,
                json_is_true(json_object_get(req, "ignore_eos")), first_hash);
        fflush(s->o.log);
    }
    if (method == HTTP_GET && !strcmp(path, "/v1/models")) {
        json_decref(req);
        send_json(c, 200,
                  "{\"object\":\"list\",\"data\":[{\"id\":\"stub\",\"object\":\"model\","
                  "\"owned_by\":\"sluice\"}]}");
        return;
    }
    if (method != HTTP_POST || (!strstr(path, "/completions"))) {
        json_decref(req);
        send_json(c, 404,
                  "{\"error\":{\"message\":\"no such route\",\"type\":\"invalid_request_"
                  "error\",\"param\":null,\"code\":null}}");
        return;
    }
    if (status != 200) {
        json_decref(req);
        char buf[256];
        snprintf(buf, sizeof buf,
                 "{\"error\":{\"message\":\"stub says %d\",\"type\":\"%s\",\"param\":null,"
                 "\"code\":null}}",
                 status, status == 429 ? "rate_limit_exceeded" : "overloaded");
        send_json(c, status, buf);
        return;
    }
    c->left = s->o.tokens ? s->o.tokens : max_tokens;
    c->sent = 0;
    c->prompt_tokens = words + 1;
    snprintf(c->id, sizeof c->id, "stub-%lu", seq);
    bool stream = json_is_true(json_object_get(req, "stream"));
    c->usage =
        json_is_true(json_object_get(json_object_get(req, "stream_options"), "include_usage"));
    json_decref(req);
    if (!stream) {
        char buf[512];
        snprintf(buf, sizeof buf,
                 "{\"id\":\"%s\",\"object\":\"%s\",\"model\":\"stub\",\"choices\":[{\"index\":0,"
                 "%s,\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":%u,"
                 "\"completion_tokens\":%ld,\"total_tokens\":%ld}}",
                 c->id, c->chat ? "chat.completion" : "text_completion",
                 c->chat ? "\"message\":{\"role\":\"assistant\",\"content\":\"words\"}"
                         : "\"text\":\"words\"",
                 c->prompt_tokens, c->left, c->prompt_tokens + c->left);
        send_json(c, 200, buf);
        return;
    }
    send_head(c, 200, "text/event-stream", -1);
    if (s->o.ttft_ms > 0)
        arm(c, s->o.ttft_ms);
    else
        timer_cb(-1, 0, c);
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 */

static int on_message_begin(llhttp_t *ll)
{
    struct conn *c = conn_of(ll);
    sl_str_clear(&c->body);
    sl_str_clear(&c->url);
    sl_str_clear(&c->tier);
    sl_str_clear(&c->auth);
    return 0;
}

static int on_url(llhttp_t *ll, const char *at, size_t len)
{
    sl_str_append(&conn_of(ll)->url, at, len);
    return 0;
}

static int on_header_field(llhttp_t *ll, const char *at, size_t len)
{
    sl_str_append(&conn_of(ll)->field, at, len);
    return 0;
}

static int on_header_value(llhttp_t *ll, const char *at, size_t len)
{
    sl_str_append(&conn_of(ll)->value, at, len);
    return 0;
}

static int on_header_value_complete(llhttp_t *ll)
{
    struct conn *c = conn_of(ll);
    const char *f = c->field.p ? c->field.p : "";
    if (!strcasecmp(f, "x-sluice-tier"))
        sl_str_append(&c->tier, c->value.p, c->value.len);
    else if (!strcasecmp(f, "authorization"))
        sl_str_append(&c->auth, c->value.p, c->value.len);
    /* Log-friendly: no spaces in the logged value ("Bearer k" -> "Bearer:k"). */
    for (size_t i = 0; i < c->auth.len; i++)
        if (c->auth.p[i] == ' ')
            c->auth.p[i] = ':';
    sl_str_clear(&c->field);
    sl_str_clear(&c->value);
    return 0;
}

static int on_body(llhttp_t *ll, const char *at, size_t len)
{
    sl_str_append(&conn_of(ll)->body, at, len);
    return 0;
}

static int on_message_complete(llhttp_t *ll)
{
    struct conn *c = conn_of(ll);
    c->keep_alive = llhttp_should_keep_alive(ll);
    /* One request at a time: parse the next only after this one is answered. */
    return HPE_PAUSED;
}

static const llhttp_settings_t settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_header_value_complete = on_header_value_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void parse(struct conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (!c->answering && !c->done && !c->dead && evbuffer_get_length(in)) {
        size_t n = evbuffer_get_contiguous_space(in);
        const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)n);
        llhttp_errno_t e = llhttp_execute(&c->ll, p, n);
        if (e == HPE_PAUSED) {
            size_t used = (size_t)(llhttp_get_error_pos(&c->ll) - p);
            evbuffer_drain(in, used);
            llhttp_resume(&c->ll);
            answer(c);
            continue;
        }
        if (e != HPE_OK) {
            conn_close(c);
            return;
        }
        evbuffer_drain(in, n);
    }
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    parse(arg);
}

static void write_cb(struct bufferevent *bev, void *arg)
{
    (void)bev;
    struct conn *c = arg;
    if (c->done) {
        conn_close(c);
        return;
    }
    /* A response just ended: requests that arrived meanwhile can go on. */
    parse(c);
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    (void)bev;
    (void)what;
    conn_close(arg);
}

static void accept_cb(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa, int len,
                      void *arg)
{
    (void)l;
    (void)sa;
    (void)len;
    struct server *s = arg;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct conn *c = sl_xcalloc(1, sizeof *c);
    c->srv = s;
    c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->timer = evtimer_new(s->base, timer_cb, c);
    sl_str_init(&c->body);
    sl_str_init(&c->url);
    sl_str_init(&c->field);
    sl_str_init(&c->value);
    sl_str_init(&c->tier);
    sl_str_init(&c->auth);
    llhttp_init(&c->ll, HTTP_REQUEST, &settings);
    c->next = s->all;
    if (s->all)
        s->all->prev = c;
    s->all = c;
    bufferevent_setcb(c->bev, read_cb, write_cb, event_cb, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

static void stop_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    event_base_loopbreak(arg);
}

static void usage(FILE *f)
{
    fputs(
        "usage: sluice-stub [--listen HOST:PORT] [--ttft-ms MS] [--itl-ms MS] [--tokens N]\n"
        "                   [--statuses 200,429,...] [--retry-after S] [--retry-after-ms MS]\n"
        "                   [--drop-after N] [--no-usage] [--log FILE]\n"
        "A scripted OpenAI-compatible server for testing load generators (see bench/README.md).\n",
        f);
}

int main(int argc, char **argv)
{
    struct server s;
    memset(&s, 0, sizeof s);
    s.o.statuses[0] = 200;
    s.o.n_statuses = 1;
    s.o.retry_after_s = s.o.retry_after_ms = -1;
    s.o.drop_after = -1;
    const char *listen = "127.0.0.1:0";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-usage")) {
            s.o.no_usage = true;
            continue;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--listen"))
            listen = v;
        else if (!strcmp(a, "--ttft-ms"))
            s.o.ttft_ms = atof(v);
        else if (!strcmp(a, "--itl-ms"))
            s.o.itl_ms = atof(v);
        else if (!strcmp(a, "--tokens"))
            s.o.tokens = atol(v);
        else if (!strcmp(a, "--retry-after"))
            s.o.retry_after_s = atof(v);
        else if (!strcmp(a, "--retry-after-ms"))
            s.o.retry_after_ms = atof(v);
        else if (!strcmp(a, "--drop-after"))
            s.o.drop_after = atol(v);
        else if (!strcmp(a, "--statuses")) {
            s.o.n_statuses = 0;
            char *buf = sl_xstrdup(v), *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t && s.o.n_statuses < 32;
                 t = strtok_r(NULL, ",", &save))
                s.o.statuses[s.o.n_statuses++] = atoi(t);
            free(buf);
            if (!s.o.n_statuses) {
                usage(stderr);
                return 2;
            }
        } else if (!strcmp(a, "--log")) {
            s.o.log = fopen(v, "w");
            if (!s.o.log) {
                fprintf(stderr, "sluice-stub: %s: %s\n", v, strerror(errno));
                return 1;
            }
        } else {
            usage(stderr);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    char host[64];
    const char *colon = strrchr(listen, ':');
    if (!colon || (size_t)(colon - listen) >= sizeof host) {
        usage(stderr);
        return 2;
    }
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1) {
        fprintf(stderr, "sluice-stub: --listen %s: expected IPv4:PORT\n", listen);
        return 2;
    }
    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    s.base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    s.t0 = sl_clock_ns();
    s.reap = event_new(s.base, -1, 0, reap_cb, &s);
    struct evconnlistener *l =
        evconnlistener_new_bind(s.base, accept_cb, &s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                1024, (struct sockaddr *)&sin, sizeof sin);
    if (!l) {
        fprintf(stderr, "sluice-stub: cannot listen on %s: %s\n", listen, strerror(errno));
        return 1;
    }
    struct sockaddr_in bound;
    socklen_t bl = sizeof bound;
    getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&bound, &bl);
    fprintf(stderr, "sluice-stub: listening on http://%s:%d\n", host, ntohs(bound.sin_port));
    struct event *sigint = evsignal_new(s.base, SIGINT, stop_cb, s.base);
    struct event *sigterm = evsignal_new(s.base, SIGTERM, stop_cb, s.base);
    event_add(sigint, NULL);
    event_add(sigterm, NULL);
    event_base_dispatch(s.base);
    evconnlistener_free(l);
    event_free(sigint);
    event_free(sigterm);
    /* Connections still open at the stop are closed and freed. */
    while (s.all)
        conn_close(s.all);
    reap_cb(-1, 0, &s);
    event_free(s.reap);
    event_base_free(s.base);
    if (s.o.log)
        fclose(s.o.log);
    fprintf(stderr, "sluice-stub: stopped after %lu requests\n", s.seq);
    return 0;
}
