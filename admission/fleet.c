/* The fleet's buckets: GCRA in Redis, so that every replica charges the same tenant and tier
 * budgets. One script call checks every bucket a request touches and charges them all or none,
 * on Redis's clock (TIME), so the decision is atomic across replicas and their clocks never
 * matter. The arithmetic is gcra.c's, in microseconds, on integers that stay below 2^53 (Lua's
 * numbers are doubles): a per-minute bucket of a million tokens puts 6e13 in a product.
 *
 * A bucket is a hash: t, the time it is full again (its TAT, µs of Redis time); l and p, the
 * rate that wrote t (a reload that changes the rate rescales what is owed, as
 * sl_gcra_bucket_rescale does). It expires when it would be full, so idle tenants cost no memory.
 */
#include "admission_impl.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* KEYS: the buckets. ARGV: per bucket limit, period (µs), burst, cost.
 * Returns {1, now, remaining and reset of each bucket after the take} when all had room, else
 * {0, now, the 1-based index of the first without, its retry (µs, -1: never), remaining, reset}
 * and charges nothing.
 * A bucket of limit 0 is money (a tenant's budget for one period): a counter of what was spent,
 * burst the budget, cost the request's worst case, period the time until the period ends (µs; 0:
 * never), a day after which the key expires. It has room while spent + cost <= budget; its retry
 * is the period's end; remaining is what is left of the budget, reset the time to the period's
 * end. Amounts are nano-units in Lua's doubles: exact below 2^53 (nine million units). */
const char sl_fleet_take_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local function ceildiv(a, b) local r = a % b; return (a - r) / b + (r > 0 and 1 or 0) end\n"
    "local function floordiv(a, b) return (a - a % b) / b end\n"
    "local function load(k, limit, period)\n"
    "  local h = redis.call('HMGET', k, 't', 'l', 'p')\n"
    "  local tat, l, p = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])\n"
    "  if not tat or tat <= now then return now end\n"
    "  if l and p and (l ~= limit or p ~= period) then\n"
    "    return now + ceildiv(ceildiv((tat - now) * l, p) * period, limit)\n"
    "  end\n"
    "  return tat\n"
    "end\n"
    "local out, nxt = {1, now}, {}\n"
    "for i = 1, #KEYS do\n"
    "  local a = (i - 1) * 4\n"
    "  local limit, period = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])\n"
    "  local burst, cost = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])\n"
    "  if limit == 0 then\n"
    "    local spent = tonumber(redis.call('GET', KEYS[i]) or '0')\n"
    "    if spent + cost > burst then\n"
    "      return {0, now, i, period > 0 and period or -1, math.max(burst - spent, 0), period}\n"
    "    end\n"
    "    nxt[i] = -1\n"
    "    out[#out + 1] = burst - spent - cost\n"
    "    out[#out + 1] = period\n"
    "  else\n"
    "    local tat = load(KEYS[i], limit, period)\n"
    "    local inc, cap = ceildiv(cost * period, limit), ceildiv(burst * period, limit)\n"
    "    local debt = tat + inc - now\n"
    "    if debt > cap then\n"
    "      local owed = tat - now\n"
    "      local rem = cap > owed and floordiv((cap - owed) * limit, period) or 0\n"
    "      return {0, now, i, inc > cap and -1 or debt - cap, rem, owed}\n"
    "    end\n"
    "    nxt[i] = tat + inc\n"
    "    out[#out + 1] = cap > debt and floordiv((cap - debt) * limit, period) or 0\n"
    "    out[#out + 1] = debt\n"
    "  end\n"
    "end\n"
    "for i = 1, #KEYS do\n"
    "  local a = (i - 1) * 4\n"
    "  if nxt[i] == -1 then\n"
    "    redis.call('INCRBY', KEYS[i], ARGV[a + 4])\n"
    "    local period = tonumber(ARGV[a + 2])\n"
    "    if period > 0 then redis.call('PEXPIRE', KEYS[i], ceildiv(period, 1000) + 86400000) end\n"
    "  elseif nxt[i] > now then\n"
    "    redis.call('HSET', KEYS[i], 't', nxt[i], 'l', ARGV[a + 1], 'p', ARGV[a + 2])\n"
    "    redis.call('PEXPIRE', KEYS[i], ceildiv(nxt[i] - now, 1000))\n"
    "  end\n"
    "end\n"
    "return out\n";

/* The end of a request. KEYS: the buckets, then, when ARGV has more than 3 values per key, the
 * usage hash of the request's hour and the ledger's index of hours. ARGV: per bucket limit,
 * period (µs), tokens to give back; then the usage's field prefix ("tenant\tmodel\ttier"), its
 * requests, prompt, cached and completion tokens, device ns and cost, each added to the hash's
 * field "<prefix>\t<name>", and the hour, added to the index. A bucket that is full, or has
 * expired, takes nothing back; a money bucket (limit 0) adds the signed amount to what was spent
 * while its period's key lives. Returns the number of buckets given to. */
const char sl_fleet_refund_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"
    "local function ceildiv(a, b) local r = a % b; return (a - r) / b + (r > 0 and 1 or 0) end\n"
    "local n, nb = 0, #KEYS\n"
    "if #ARGV > 3 * #KEYS then\n"
    "  nb = #KEYS - 2\n"
    "  local u = 3 * nb\n"
    "  local names = {'requests', 'prompt_tokens', 'cached_tokens', 'completion_tokens', "
    "'device_ns',\n"
    "                 'cost'}\n"
    "  for j = 1, 6 do\n"
    "    local v = tonumber(ARGV[u + 1 + j])\n"
    "    if v ~= 0 then redis.call('HINCRBY', KEYS[nb + 1], ARGV[u + 1] .. '\\t' .. names[j], v) "
    "end\n"
    "  end\n"
    "  redis.call('ZADD', KEYS[nb + 2], ARGV[u + 8], ARGV[u + 8])\n"
    "end\n"
    "for i = 1, nb do\n"
    "  local a = (i - 1) * 3\n"
    "  if tonumber(ARGV[a + 1]) == 0 then\n"
    "    if redis.call('EXISTS', KEYS[i]) == 1 then\n"
    "      redis.call('INCRBY', KEYS[i], ARGV[a + 3])\n"
    "      n = n + 1\n"
    "    end\n"
    "  else\n"
    "    local h = redis.call('HMGET', KEYS[i], 't', 'l', 'p')\n"
    "    local tat = tonumber(h[1])\n"
    "    if tat and tat > now then\n"
    "      local limit = tonumber(h[2]) or tonumber(ARGV[a + 1])\n"
    "      local period = tonumber(h[3]) or tonumber(ARGV[a + 2])\n"
    "      local back = tat - ceildiv(tonumber(ARGV[a + 3]) * period, limit)\n"
    "      if back <= now then\n"
    "        redis.call('DEL', KEYS[i])\n"
    "      else\n"
    "        redis.call('HSET', KEYS[i], 't', back)\n"
    "        redis.call('PEXPIRE', KEYS[i], ceildiv(back - now, 1000))\n"
    "      end\n"
    "      n = n + 1\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return n\n";

/* KEYS[1]: the fleet's replicas (a sorted set: member a replica's id, score the last time it said
 * it was alive, ms of Redis time). ARGV: this replica's id, the time after which a replica that
 * has not said so again counts as gone (ms). Records this one, forgets the gone, and returns how
 * many are alive, this one included. The set expires with its last replica. */
const char sl_fleet_beat_lua[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local ttl = tonumber(ARGV[2])\n"
    "redis.call('ZADD', KEYS[1], now, ARGV[1])\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)\n"
    "redis.call('PEXPIRE', KEYS[1], ttl)\n"
    "return redis.call('ZCARD', KEYS[1])\n";

/* The fleet's ledger, read a page at a time. KEYS[1]: the index of hours; KEYS[2], when given, a
 * budget's key. ARGV: the key prefix, the range of hours as ZRANGEBYSCORE bounds, the most hours
 * to answer. Returns {the budget key's spend (-1: not asked, or no key), then for each hour with
 * usage in the range, ascending: the hour, {field, value, ...} of its hash}. */
const char sl_fleet_usage_lua[] =
    "local hours = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[2], ARGV[3], 'LIMIT', 0, ARGV[4])\n"
    "local out = {-1}\n"
    "if #KEYS > 1 then out[1] = tonumber(redis.call('GET', KEYS[2]) or '-1') end\n"
    "for _, h in ipairs(hours) do\n"
    "  out[#out + 1] = tonumber(h)\n"
    "  out[#out + 1] = redis.call('HGETALL', ARGV[1] .. 'usage:' .. h)\n"
    "end\n"
    "return out\n";

void sl_fleet_script_sha(const char *script, char sha[SL_FLEET_SHA_LEN + 1])
{
    unsigned char d[SHA_DIGEST_LENGTH];
    SHA1((const unsigned char *)script, strlen(script), d);
    for (int i = 0; i < SHA_DIGEST_LENGTH; i++)
        snprintf(sha + 2 * i, 3, "%02x", d[i]);
}

/* Each bucket's limit, period (µs), burst when `burst`, and cost, as decimal strings. */
static int args(const struct sl_fleet_bucket *b, int n, char (*num)[24], bool burst)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        const struct sl_gcra_rate *r = &b[i].rate;
        snprintf(num[k++], 24, "%lld", (long long)r->limit);
        snprintf(num[k++], 24, "%lld", (long long)(r->period_ns / 1000));
        if (burst)
            snprintf(num[k++], 24, "%lld", (long long)r->burst);
        snprintf(num[k++], 24, "%lld", (long long)b[i].cost);
    }
    return k;
}

void sl_fleet_usage_key(char *out, size_t outlen, const char *prefix, int64_t hour)
{
    snprintf(out, outlen, "%susage:%lld", prefix, (long long)hour);
}

void sl_fleet_usage_field(char *out, size_t outlen, const struct sl_usage_key *k)
{
    snprintf(out, outlen, "%s\t%s\t%s", k->tenant, k->model, k->tier);
}

void sl_fleet_usage_index(char *out, size_t outlen, const char *prefix)
{
    snprintf(out, outlen, "%susage-hours", prefix);
}

int sl_fleet_usage_args(const struct sl_usage *u, int64_t hour, char (*num)[24])
{
    const int64_t v[7] = {u->requests,
                          u->prompt_tokens,
                          u->cached_tokens,
                          u->completion_tokens,
                          u->device_ns,
                          u->cost,
                          hour};
    for (int i = 0; i < 7; i++)
        snprintf(num[i], 24, "%lld", (long long)v[i]);
    return 7;
}

int sl_fleet_usage_read_args(int64_t from, int64_t to, int limit, char (*num)[24])
{
    if (from == INT64_MIN)
        snprintf(num[0], 24, "-inf");
    else
        snprintf(num[0], 24, "%lld", (long long)from);
    if (to == INT64_MAX)
        snprintf(num[1], 24, "+inf");
    else
        snprintf(num[1], 24, "(%lld", (long long)to);
    snprintf(num[2], 24, "%d", limit > 0 ? limit : 1);
    return 3;
}

/* One field of an hour's hash, "tenant\tmodel\ttier\tcounter" = v, added to l; false when it
 * is not one. */
static bool usage_field(struct sl_usage_ledger *l, int64_t hour, const char *f, size_t n,
                        const char *v, size_t vn)
{
    char buf[SL_USAGE_TENANT_MAX + SL_USAGE_MODEL_MAX + SL_USAGE_TIER_MAX + 32], num[24];
    if (n >= sizeof buf || vn == 0 || vn >= sizeof num || memchr(f, '\0', n))
        return false;
    memcpy(buf, f, n);
    buf[n] = '\0';
    memcpy(num, v, vn);
    num[vn] = '\0';
    char *part[4], *p = buf;
    for (int i = 0; i < 4; i++) {
        part[i] = p;
        char *tab = strchr(p, '\t');
        if ((i < 3) != (tab != NULL))
            return false;
        if (tab) {
            *tab = '\0';
            p = tab + 1;
        }
    }
    char *end;
    errno = 0;
    long long x = strtoll(num, &end, 10);
    if (*end != '\0' || errno)
        return false;
    static const char *const names[] = {"requests",          "prompt_tokens", "cached_tokens",
                                        "completion_tokens", "device_ns",     "cost"};
    struct sl_usage u = {0};
    int64_t *dst[] = {&u.requests,          &u.prompt_tokens, &u.cached_tokens,
                      &u.completion_tokens, &u.device_ns,     &u.cost};
    for (int i = 0; i < 6; i++)
        if (strcmp(part[3], names[i]) == 0) {
            *dst[i] = x;
            struct sl_usage_key k;
            sl_usage_key_set(&k, part[0], part[1], part[2], hour);
            sl_usage_ledger_add(l, &k, &u);
            return true;
        }
    return false;
}

int sl_fleet_usage_parse(const struct redisReply *r, struct sl_usage_ledger *l, int64_t *spent,
                         int64_t *last_hour, int *bad, char *err, size_t errlen)
{
    if (!r) {
        snprintf(err, errlen, "no reply");
        return -1;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (r->str && r->len > 0 && r->str[0])
            snprintf(err, errlen, "%.*s", (int)r->len, r->str);
        else
            snprintf(err, errlen, "an error reply without a message");
        return -1;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 1 || !r->element[0] ||
        r->element[0]->type != REDIS_REPLY_INTEGER) {
        snprintf(err, errlen, "the usage script answered something else than its pages");
        return -1;
    }
    *spent = r->element[0]->integer;
    int hours = 0;
    for (size_t i = 1; i + 1 < r->elements; i += 2) {
        const redisReply *h = r->element[i], *f = r->element[i + 1];
        if (!h || h->type != REDIS_REPLY_INTEGER || h->integer % 3600 != 0 || !f ||
            f->type != REDIS_REPLY_ARRAY || f->elements % 2 != 0) {
            snprintf(err, errlen, "the usage script answered an hour that is not one");
            return -1;
        }
        for (size_t j = 0; j < f->elements; j += 2) {
            const redisReply *k = f->element[j], *v = f->element[j + 1];
            if (!k || !v || k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
                !usage_field(l, h->integer, k->str, k->len, v->str, v->len))
                (*bad)++;
        }
        *last_hour = h->integer;
        hours++;
    }
    return hours;
}

int sl_fleet_take_args(const struct sl_fleet_bucket *b, int n, char (*num)[24])
{
    return args(b, n, num, true);
}

int sl_fleet_refund_args(const struct sl_fleet_bucket *b, int n, char (*num)[24])
{
    return args(b, n, num, false);
}

/* A duration the script answered, µs to ns: false when it is not one (negative but for -1
 * where allowed, or too long to be nanoseconds). */
static bool duration(long long us, bool never_ok, int64_t *ns)
{
    if (us == -1 && never_ok) {
        *ns = -1;
        return true;
    }
    if (us < 0 || us > INT64_MAX / 1000)
        return false;
    *ns = us * 1000;
    return true;
}

static bool all_integers(const redisReply *r, size_t from)
{
    for (size_t i = from; i < r->elements; i++)
        if (!r->element[i] || r->element[i]->type != REDIS_REPLY_INTEGER)
            return false;
    return true;
}

enum sl_status sl_fleet_take_parse(const struct redisReply *r, int n, struct sl_fleet_take *out,
                                   char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->failed = -1;
    if (!r) {
        snprintf(err, errlen, "no reply");
        return SL_EIO;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (r->str && r->len > 0 && r->str[0])
            snprintf(err, errlen, "%.*s", (int)r->len, r->str);
        else
            snprintf(err, errlen, "an error reply without a message");
        return SL_EIO;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || !all_integers(r, 0)) {
        snprintf(err, errlen, "the script answered something else than an array of integers");
        return SL_EIO;
    }
    out->now_us = r->element[1]->integer;
    if (r->element[0]->integer == 1) {
        if (r->elements != 2 + 2 * (size_t)n) {
            snprintf(err, errlen, "the script answered %zu values for %d buckets", r->elements, n);
            return SL_EIO;
        }
        out->admitted = true;
        for (int i = 0; i < n; i++) {
            out->view[i].remaining = r->element[2 + 2 * i]->integer;
            if (out->view[i].remaining < 0 ||
                !duration(r->element[3 + 2 * i]->integer, false, &out->view[i].reset_ns))
                goto range;
        }
        return SL_OK;
    }
    long long i = r->elements == 6 ? r->element[2]->integer : 0;
    if (r->element[0]->integer != 0 || i < 1 || i > n) {
        snprintf(err, errlen, "the script answered a refusal that names no bucket of %d", n);
        return SL_EIO;
    }
    out->failed = (int)i - 1;
    struct sl_gcra_view *v = &out->view[out->failed];
    v->remaining = r->element[4]->integer;
    if (v->remaining >= 0 && duration(r->element[3]->integer, true, &v->retry_ns) &&
        duration(r->element[5]->integer, false, &v->reset_ns))
        return SL_OK;
range:
    memset(out, 0, sizeof *out);
    out->failed = -1;
    snprintf(err, errlen, "the script answered a count or a time out of range");
    return SL_EIO;
}

int sl_fleet_beat_parse(const struct redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_INTEGER || r->integer < 1 || r->integer > 1000000)
        return -1;
    return (int)r->integer;
}
