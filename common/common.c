/* common: status strings, logging, clocks, byte strings, UTF-8 helpers. */
#include <sluice/common.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *sl_status_str(int status)
{
    switch (status) {
    case SL_OK: return "ok";
    case SL_EINVAL: return "invalid argument";
    case SL_ENOMEM: return "out of memory";
    case SL_EAGAIN: return "try again";
    case SL_EBUSY: return "busy";
    case SL_ETIMEDOUT: return "timed out";
    case SL_ECANCELED: return "cancelled";
    case SL_EIO: return "I/O error";
    case SL_EBACKEND: return "backend failure";
    case SL_ENOENT: return "not found";
    case SL_ERANGE: return "out of range";
    case SL_EFORMAT: return "malformed input";
    case SL_EPERM: return "not permitted";
    }
    return "unknown status";
}

static enum sl_log_level log_min = SL_LOG_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void sl_log_set_level(enum sl_log_level level)
{
    log_min = level;
}

size_t sl_log_prefix(char *buf, enum sl_log_level level)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    /* The date and time to the second, formatted once per second per thread. */
    static _Thread_local time_t sec = -1;
    static _Thread_local char stamp[48];
    if (level < log_min)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec != sec) {
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        sec = ts.tv_sec;
    }
    /* No printf: the access log calls this once per request. */
    size_t n = strlen(stamp), nl = strlen(names[level]);
    long ms = ts.tv_nsec / 1000000;
    memcpy(buf, stamp, n);
    buf[n++] = '.';
    buf[n++] = (char)('0' + ms / 100);
    buf[n++] = (char)('0' + ms / 10 % 10);
    buf[n++] = (char)('0' + ms % 10);
    buf[n++] = 'Z';
    buf[n++] = ' ';
    memcpy(buf + n, names[level], nl);
    n += nl;
    buf[n++] = ' ';
    buf[n] = '\0';
    return n;
}

void sl_log_write(const char *lines, size_t len)
{
    /* One fwrite under a lock so lines from different threads never interleave. */
    pthread_mutex_lock(&log_lock);
    fwrite(lines, 1, len, stderr);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
}

void sl_log(enum sl_log_level level, const char *fmt, ...)
{
    char line[1024];
    size_t n = sl_log_prefix(line, level);
    if (n == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    size_t len = n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    sl_log_write(line, len);
}

uint64_t sl_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t sl_clock_unix(void)
{
    return (int64_t)time(NULL);
}

static void oom(size_t n)
{
    fprintf(stderr, "sluice: out of memory allocating %zu bytes\n", n);
    abort();
}

void *sl_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *sl_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        oom(n * size);
    return p;
}

void *sl_xmalloc_aligned(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0)
        oom(n);
    return p;
}

void *sl_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *sl_xstrdup(const char *s)
{
    return sl_xstrndup(s, strlen(s));
}

char *sl_xstrndup(const char *s, size_t n)
{
    char *p = sl_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void sl_str_init(struct sl_str *s)
{
    memset(s, 0, sizeof *s);
}

void sl_str_dispose(struct sl_str *s)
{
    free(s->p);
    sl_str_init(s);
}

void sl_str_reserve(struct sl_str *s, size_t extra)
{
    size_t need = s->len + extra + 1;
    if (need <= s->cap)
        return;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < need)
        cap *= 2;
    s->p = sl_xrealloc(s->p, cap);
    s->cap = cap;
}

void sl_str_append(struct sl_str *s, const void *data, size_t len)
{
    sl_str_reserve(s, len);
    if (len)
        memcpy(s->p + s->len, data, len);
    s->len += len;
    s->p[s->len] = '\0';
}

void sl_str_appendf(struct sl_str *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        sl_str_append(s, small, (size_t)n);
        return;
    }
    sl_str_reserve(s, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(s->p + s->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->len += (size_t)n;
}

/* Bytes JSON strings take as they are: not a quote, a backslash or a control byte. */
static bool json_plain(unsigned char c)
{
    return c >= 0x20 && c != '"' && c != '\\';
}

void sl_str_append_int(struct sl_str *s, long long v)
{
    char d[24];
    size_t i = sizeof d;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do
        d[--i] = (char)('0' + u % 10);
    while ((u /= 10) != 0);
    if (v < 0)
        d[--i] = '-';
    sl_str_append(s, d + i, sizeof d - i);
}

char *sl_json_escape(char *dst, const char *data, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)data[i];
        if (json_plain(c)) {
            *dst++ = (char)c;
            continue;
        }
        *dst++ = '\\';
        switch (c) {
        case '"': *dst++ = '"'; break;
        case '\\': *dst++ = '\\'; break;
        case '\n': *dst++ = 'n'; break;
        case '\r': *dst++ = 'r'; break;
        case '\t': *dst++ = 't'; break;
        default:
            *dst++ = 'u';
            *dst++ = '0';
            *dst++ = '0';
            *dst++ = hex[c >> 4];
            *dst++ = hex[c & 15];
        }
    }
    return dst;
}

void sl_str_append_json(struct sl_str *s, const char *data, size_t len)
{
    /* In pieces, so that a long text reserves a little over its size, not six times it. */
    enum { PIECE = 4096 };
    do {
        size_t n = len < PIECE ? len : PIECE;
        sl_str_reserve(s, SL_JSON_ESCAPED_MAX(n));
        s->len = (size_t)(sl_json_escape(s->p + s->len, data, n) - s->p);
        data += n;
        len -= n;
    } while (len > 0);
    s->p[s->len] = '\0';
}

void sl_str_clear(struct sl_str *s)
{
    s->len = 0;
    if (s->p)
        s->p[0] = '\0';
}

/* Length of the valid UTF-8 sequence starting at s (1..4), 0 when s[0..len) is a valid but
 * incomplete prefix of one, -1 when invalid. */
static int utf8_seq(const unsigned char *s, size_t len)
{
    unsigned char c = s[0];
    int need;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
    } else
        return -1;
    for (int i = 1; i < need; i++) {
        if ((size_t)i >= len)
            break;
        if ((s[i] & 0xc0) != 0x80)
            return -1;
        /* Reject overlongs, surrogates and > U+10FFFF as early as the second byte allows. */
        if (i == 1) {
            if (c == 0xe0 && s[1] < 0xa0)
                return -1;
            if (c == 0xed && s[1] > 0x9f)
                return -1;
            if (c == 0xf0 && s[1] < 0x90)
                return -1;
            if (c == 0xf4 && s[1] > 0x8f)
                return -1;
        }
    }
    if (len < (size_t)need)
        return 0;
    return need;
}

size_t sl_utf8_complete_prefix(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        int n = utf8_seq(u + i, len - i);
        if (n == 0)
            return i;
        i += n < 0 ? 1 : (size_t)n;
    }
    return len;
}

bool sl_utf8_valid(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        int n = utf8_seq(u + i, len - i);
        if (n <= 0)
            return false;
        i += (size_t)n;
    }
    return true;
}

void sl_utf8_sanitize(struct sl_str *out, const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    sl_str_reserve(out, len);
    size_t i = 0;
    while (i < len) {
        /* Runs of valid sequences in one copy. */
        size_t run = i;
        int n;
        while (run < len && (n = utf8_seq(u + run, len - run)) > 0)
            run += (size_t)n;
        if (run > i) {
            sl_str_append(out, s + i, run - i);
            i = run;
            continue;
        }
        /* An invalid byte becomes one U+FFFD; a truncated sequence at the end, one. */
        n = utf8_seq(u + i, len - i);
        sl_str_append(out, "\xef\xbf\xbd", 3);
        i = n == 0 ? len : i + 1;
    }
}

/* ---- arena ---- */

/* Chunks hold ARENA_CHUNK bytes of payload, or one larger allocation alone. */
#define ARENA_CHUNK 8192
#define ARENA_ALIGN 16

struct sl_arena_chunk {
    struct sl_arena_chunk *next; /* older */
    size_t size;                 /* payload bytes */
    _Alignas(ARENA_ALIGN) char data[];
};

void sl_arena_init(struct sl_arena *a)
{
    a->head = NULL;
    a->p = a->end = NULL;
}

void *sl_arena_alloc(struct sl_arena *a, size_t n)
{
    n = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (n == 0)
        n = ARENA_ALIGN;
    if ((size_t)(a->end - a->p) < n) {
        size_t size = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        if (size > SIZE_MAX - sizeof(struct sl_arena_chunk))
            abort();
        struct sl_arena_chunk *c = sl_xmalloc(sizeof *c + size);
        c->size = size;
        c->next = a->head;
        a->head = c;
        a->p = c->data;
        a->end = c->data + size;
    }
    void *r = a->p;
    a->p += n;
    return r;
}

void *sl_arena_calloc(struct sl_arena *a, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        abort();
    void *r = sl_arena_alloc(a, n * size);
    memset(r, 0, n * size);
    return r;
}

char *sl_arena_strndup(struct sl_arena *a, const char *s, size_t n)
{
    char *r = sl_arena_alloc(a, n + 1);
    memcpy(r, s, n);
    r[n] = '\0';
    return r;
}

void sl_arena_reset(struct sl_arena *a)
{
    struct sl_arena_chunk *c = a->head;
    if (!c)
        return;
    while (c->next) {
        struct sl_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = c;
    a->p = c->data;
    a->end = c->data + c->size;
}

void sl_arena_dispose(struct sl_arena *a)
{
    sl_arena_reset(a);
    free(a->head);
    sl_arena_init(a);
}
