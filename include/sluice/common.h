/* sluice — common: status codes, logging, the monotonic clock, a growable byte string.
 *
 * Every module may include this header; it depends on nothing else in sluice.
 * All functions here are thread-safe unless said otherwise.
 */
#ifndef SLUICE_COMMON_H
#define SLUICE_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_VERSION "0.1.0"

/* Functions that can fail return SL_OK (0) or a negative status. */
enum sl_status {
    SL_OK = 0,
    SL_EINVAL = -1,    /* bad argument or input */
    SL_ENOMEM = -2,    /* out of memory (or of a bounded pool) */
    SL_EAGAIN = -3,    /* try again later */
    SL_EBUSY = -4,     /* resource busy / over capacity */
    SL_ETIMEDOUT = -5, /* deadline passed */
    SL_ECANCELED = -6, /* cancelled by its owner */
    SL_EIO = -7,       /* I/O error (errno says more) */
    SL_EBACKEND = -8,  /* the compute backend failed */
    SL_ENOENT = -9,    /* no such file, route or object */
    SL_ERANGE = -10,   /* a size or value out of its allowed range */
    SL_EFORMAT = -11,  /* a file or message is malformed */
    SL_EPERM = -12,    /* not permitted: the caller may not do or use this */
};

/* A static English description of a status ("invalid argument"). Never NULL. */
const char *sl_status_str(int status);

enum sl_log_level { SL_LOG_DEBUG, SL_LOG_INFO, SL_LOG_WARN, SL_LOG_ERROR };

/* Sets the lowest level that is printed (default SL_LOG_INFO). Call before threads start. */
void sl_log_set_level(enum sl_log_level level);

/* Writes one line "TIME LEVEL message\n" to stderr, atomically with respect to other threads. */
void sl_log(enum sl_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* For a thread that batches its lines (the access log: one write per event-loop iteration
 * instead of one per request). sl_log_prefix writes the "TIME LEVEL " that sl_log would begin a
 * line with now into buf (SL_LOG_PREFIX_MAX bytes) and returns its length, or 0 when `level` is
 * not printed. sl_log_write writes whole lines to stderr under the lock sl_log takes. */
#define SL_LOG_PREFIX_MAX 96
size_t sl_log_prefix(char *buf, enum sl_log_level level);
void sl_log_write(const char *lines, size_t len);

/* Monotonic time in nanoseconds (CLOCK_MONOTONIC). Only thread adapters and the gateway read the
 * clock; the scheduler core is given `now`. */
uint64_t sl_clock_ns(void);

/* Wall-clock time in seconds since the epoch (for OpenAI `created`). */
int64_t sl_clock_unix(void);

/* A growable byte string, always NUL-terminated when p != NULL. Embedded: _init/_dispose.
 * Allocation failure aborts (see STYLE.md: sizes a client controls are bounded before this). */
struct sl_str {
    char *p;
    size_t len;
    size_t cap;
};

void sl_str_init(struct sl_str *s);
void sl_str_dispose(struct sl_str *s);
void sl_str_reserve(struct sl_str *s, size_t extra);
void sl_str_append(struct sl_str *s, const void *data, size_t len);
void sl_str_appendf(struct sl_str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends v in decimal: what "%lld" gives, without printf (hot paths write numbers this way). */
void sl_str_append_int(struct sl_str *s, long long v);
/* Appends the bytes as the body of a JSON string (no quotes): escapes ", \ and control bytes.
 * The input must be valid UTF-8; it is copied as is otherwise. */
void sl_str_append_json(struct sl_str *s, const char *data, size_t len);
/* The same written at dst, which has room for SL_JSON_ESCAPED_MAX(len) bytes; returns the end. */
char *sl_json_escape(char *dst, const char *data, size_t len);
#define SL_JSON_ESCAPED_MAX(len) (6 * (size_t)(len)) /* a control byte becomes \u00XX */
void sl_str_clear(struct sl_str *s);

/* Aborting allocators: never return NULL. */
void *sl_xmalloc(size_t n);
void *sl_xcalloc(size_t n, size_t size);
void *sl_xrealloc(void *p, size_t n);
/* n bytes at a 64-byte (cache line) boundary; free with free(). Weight and activation buffers:
 * an AVX2 load that straddles two cache lines costs twice. */
void *sl_xmalloc_aligned(size_t n);
char *sl_xstrdup(const char *s);
char *sl_xstrndup(const char *s, size_t n);

/* An arena (h2o's and nginx's pools): memory handed out in order from chunks and given back all
 * at once. sl_arena_reset keeps the first chunk for the next use, so an arena reused for one
 * request after another allocates nothing once it has grown to their size. Allocation failure
 * aborts. Not thread-safe. */
struct sl_arena_chunk;
struct sl_arena {
    struct sl_arena_chunk *head; /* the newest chunk; the first is last in the list */
    char *p, *end;               /* the free part of head */
};

void sl_arena_init(struct sl_arena *a);
/* n bytes aligned for any type, uninitialised. */
void *sl_arena_alloc(struct sl_arena *a, size_t n);
/* n zeroed elements of size bytes (n * size checked for overflow). */
void *sl_arena_calloc(struct sl_arena *a, size_t n, size_t size);
/* s[0..n) and a NUL. */
char *sl_arena_strndup(struct sl_arena *a, const char *s, size_t n);
/* Gives everything back; keeps the first chunk. */
void sl_arena_reset(struct sl_arena *a);
void sl_arena_dispose(struct sl_arena *a);

/* UTF-8 helpers. */
/* Length of the longest prefix of s[0..len) that is complete, valid UTF-8 (so a caller can hold
 * back a split multi-byte character). Invalid sequences count as complete (they are replaced). */
size_t sl_utf8_complete_prefix(const char *s, size_t len);
/* Appends s[0..len) to out with every invalid or truncated sequence replaced by U+FFFD. */
void sl_utf8_sanitize(struct sl_str *out, const char *s, size_t len);
/* True when s[0..len) is valid UTF-8 as a whole (no invalid byte, no truncated character). */
bool sl_utf8_valid(const char *s, size_t len);

#endif
