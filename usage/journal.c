/* The journal: the ledger on disk, one JSON line per record, appended by the I/O threads with
 * one write(2) per batch (O_APPEND, so the threads' lines never interleave) and fdatasynced by a
 * thread of its own at most once a second. At open it is replayed and compacted: the ledger's
 * totals, one line per (tenant, model, tier, hour), are written to a new file that is synced and
 * renamed over the old one, so the file holds hourly totals plus what came since the start.
 */
#include "usage_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FILE_NAME "usage.jsonl"

struct sl_usage_journal {
    int fd;
    char path[4096];
    pthread_t syncer;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool dirty, stop, failing;
};

/* ---- lines ---- */

void sl_usage_journal_record(struct sl_str *buf, const struct sl_usage_key *k,
                             const struct sl_usage *u)
{
    sl_str_append(buf, "{\"tenant\":\"", 11);
    sl_str_append_json(buf, k->tenant, strlen(k->tenant));
    sl_str_append(buf, "\",\"model\":\"", 11);
    sl_str_append_json(buf, k->model, strlen(k->model));
    sl_str_append(buf, "\",\"tier\":\"", 10);
    sl_str_append_json(buf, k->tier, strlen(k->tier));
    sl_str_appendf(
        buf,
        "\",\"hour\":%lld,\"requests\":%lld,\"prompt_tokens\":%lld,\"cached_tokens\":%lld,"
        "\"completion_tokens\":%lld,\"device_ns\":%lld,\"cost\":%lld}\n",
        (long long)k->hour, (long long)u->requests, (long long)u->prompt_tokens,
        (long long)u->cached_tokens, (long long)u->completion_tokens, (long long)u->device_ns,
        (long long)u->cost);
}

static bool get_name(json_t *o, const char *name, char *out, size_t max)
{
    json_t *v = json_object_get(o, name);
    if (!json_is_string(v) || json_string_length(v) > max)
        return false;
    const char *s = json_string_value(v);
    if (strlen(s) != json_string_length(v)) /* an escaped NUL */
        return false;
    memcpy(out, s, json_string_length(v) + 1);
    return true;
}

static bool get_int(json_t *o, const char *name, int64_t *out, bool nonneg)
{
    json_t *v = json_object_get(o, name);
    if (!json_is_integer(v))
        return false;
    *out = json_integer_value(v);
    return !nonneg || *out >= 0;
}

enum sl_status sl_usage_journal_parse(const char *line, size_t len, struct sl_usage_key *k,
                                      struct sl_usage *u)
{
    memset(k, 0, sizeof *k);
    memset(u, 0, sizeof *u);
    json_error_t e;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &e);
    if (!json_is_object(o)) {
        json_decref(o);
        return SL_EINVAL;
    }
    bool ok = get_name(o, "tenant", k->tenant, SL_USAGE_TENANT_MAX) &&
              get_name(o, "model", k->model, SL_USAGE_MODEL_MAX) &&
              get_name(o, "tier", k->tier, SL_USAGE_TIER_MAX) &&
              get_int(o, "hour", &k->hour, false) && k->hour % 3600 == 0 &&
              get_int(o, "requests", &u->requests, true) &&
              get_int(o, "prompt_tokens", &u->prompt_tokens, true) &&
              get_int(o, "cached_tokens", &u->cached_tokens, true) &&
              get_int(o, "completion_tokens", &u->completion_tokens, true) &&
              get_int(o, "device_ns", &u->device_ns, true) && get_int(o, "cost", &u->cost, false);
    json_decref(o);
    return ok ? SL_OK : SL_EINVAL;
}

/* Replays the file at fd into l; *bad: lines skipped; *torn: the last one had no newline and did
 * not parse (a write cut short). */
static enum sl_status replay(FILE *f, struct sl_usage_ledger *l, int *bad, bool *torn)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    *bad = 0;
    *torn = false;
    while ((n = getline(&line, &cap, f)) >= 0) {
        bool whole = n > 0 && line[n - 1] == '\n';
        size_t len = (size_t)n - (whole ? 1 : 0);
        if (len == 0)
            continue;
        struct sl_usage_key k;
        struct sl_usage u;
        if (sl_usage_journal_parse(line, len, &k, &u) == SL_OK) {
            sl_usage_ledger_add(l, &k, &u);
        } else {
            (*bad)++;
            *torn = !whole;
        }
    }
    bool err = ferror(f);
    free(line);
    return err ? SL_EIO : SL_OK;
}

enum sl_status sl_usage_journal_read(const char *path, struct sl_usage_ledger *l, int *bad,
                                     char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return errno == ENOENT ? SL_ENOENT : SL_EIO;
    }
    bool torn;
    enum sl_status st = replay(f, l, bad, &torn);
    fclose(f);
    if (st != SL_OK)
        snprintf(err, errlen, "%s: read error", path);
    return st;
}

/* ---- compaction ---- */

struct compact {
    struct sl_str buf;
    int fd;
    bool failed;
};

static bool write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

static void compact_row(void *arg, const struct sl_usage_key *k, const struct sl_usage *u)
{
    struct compact *c = arg;
    sl_usage_journal_record(&c->buf, k, u);
    if (c->buf.len >= 1 << 16) {
        c->failed |= !write_all(c->fd, c->buf.p, c->buf.len);
        sl_str_clear(&c->buf);
    }
}

/* Writes the ledger to path.new, syncs it and renames it over path; then syncs the directory. */
static enum sl_status compact(const char *dir, const char *path, struct sl_usage_ledger *l,
                              char *err, size_t errlen)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    struct compact c = {.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640)};
    if (c.fd < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return SL_EIO;
    }
    sl_str_init(&c.buf);
    sl_usage_ledger_each(l, compact_row, &c);
    if (c.buf.len)
        c.failed |= !write_all(c.fd, c.buf.p, c.buf.len);
    sl_str_dispose(&c.buf);
    c.failed |= fsync(c.fd) != 0;
    c.failed |= close(c.fd) != 0;
    if (c.failed || rename(tmp, path) != 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        unlink(tmp);
        return SL_EIO;
    }
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        fsync(d);
        close(d);
    }
    return SL_OK;
}

/* ---- the sync thread ---- */

static void *sync_main(void *arg)
{
    struct sl_usage_journal *j = arg;
    pthread_mutex_lock(&j->lock);
    while (!j->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&j->cond, &j->lock, &ts);
        if (!j->dirty)
            continue;
        j->dirty = false;
        pthread_mutex_unlock(&j->lock);
        if (fdatasync(j->fd) != 0)
            sl_log(SL_LOG_ERROR, "usage: fdatasync %s: %s", j->path, strerror(errno));
        pthread_mutex_lock(&j->lock);
    }
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

/* ---- open, write, close ---- */

enum sl_status sl_usage_journal_open(const char *dir, struct sl_usage_ledger *l,
                                     struct sl_usage_journal **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        snprintf(err, errlen, "state_dir %s: %s", dir, strerror(errno));
        return SL_ENOENT;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "state_dir %s: not a directory", dir);
        return SL_ENOENT;
    }
    struct sl_usage_journal *j = sl_xcalloc(1, sizeof *j);
    snprintf(j->path, sizeof j->path, "%s/" FILE_NAME, dir);
    FILE *f = fopen(j->path, "r");
    if (f) {
        int bad;
        bool torn;
        enum sl_status st = replay(f, l, &bad, &torn);
        fclose(f);
        if (st != SL_OK) {
            snprintf(err, errlen, "%s: read error", j->path);
            free(j);
            return st;
        }
        if (torn)
            sl_log(SL_LOG_WARN,
                   "usage: %s: its last line was cut short (a crash while it was written): "
                   "dropped",
                   j->path);
        if (bad > (torn ? 1 : 0))
            sl_log(SL_LOG_WARN, "usage: %s: %d line%s that do not parse skipped", j->path,
                   bad - (torn ? 1 : 0), bad - (torn ? 1 : 0) == 1 ? "" : "s");
    } else if (errno != ENOENT) {
        snprintf(err, errlen, "%s: %s", j->path, strerror(errno));
        free(j);
        return SL_EIO;
    }
    enum sl_status st = compact(dir, j->path, l, err, errlen);
    if (st != SL_OK) {
        free(j);
        return st;
    }
    j->fd = open(j->path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (j->fd < 0) {
        snprintf(err, errlen, "%s: %s", j->path, strerror(errno));
        free(j);
        return SL_EIO;
    }
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->cond, NULL);
    if (pthread_create(&j->syncer, NULL, sync_main, j) != 0)
        abort();
    *out = j;
    return SL_OK;
}

enum sl_status sl_usage_journal_write(struct sl_usage_journal *j, struct sl_str *buf)
{
    if (!buf->len)
        return SL_OK;
    bool ok = write_all(j->fd, buf->p, buf->len);
    int e = errno;
    sl_str_clear(buf);
    pthread_mutex_lock(&j->lock);
    j->dirty = true;
    bool was = j->failing;
    j->failing = !ok;
    pthread_mutex_unlock(&j->lock);
    if (!ok && !was)
        sl_log(SL_LOG_ERROR, "usage: cannot append to %s: %s (usage stays in memory only)", j->path,
               strerror(e));
    else if (ok && was)
        sl_log(SL_LOG_INFO, "usage: appending to %s again", j->path);
    return ok ? SL_OK : SL_EIO;
}

void sl_usage_journal_close(struct sl_usage_journal *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->lock);
    j->stop = true;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->lock);
    pthread_join(j->syncer, NULL);
    if (fdatasync(j->fd) != 0)
        sl_log(SL_LOG_ERROR, "usage: fdatasync %s: %s", j->path, strerror(errno));
    close(j->fd);
    pthread_cond_destroy(&j->cond);
    pthread_mutex_destroy(&j->lock);
    free(j);
}
