/* The ledger: usage totals by (tenant, model, tier, hour) in an open-addressing table under one
 * mutex. An add is one finished request; queries copy what they need and group it apart. */
#include "usage_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    struct sl_usage_key k;
    struct sl_usage u;
};

/* A table of entries, slots holding index + 1 (0: empty). Grows at half full. */
struct table {
    struct entry *e;
    int n, cap_e;
    int *slot;
    size_t cap; /* a power of two */
};

struct sl_usage_ledger {
    pthread_mutex_t lock;
    struct table t;
};

static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t key_hash(const struct sl_usage_key *k)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = mix(h, k->tenant, strlen(k->tenant) + 1);
    h = mix(h, k->model, strlen(k->model) + 1);
    h = mix(h, k->tier, strlen(k->tier) + 1);
    return mix(h, &k->hour, sizeof k->hour);
}

static bool key_eq(const struct sl_usage_key *a, const struct sl_usage_key *b)
{
    return a->hour == b->hour && strcmp(a->tenant, b->tenant) == 0 &&
           strcmp(a->model, b->model) == 0 && strcmp(a->tier, b->tier) == 0;
}

static void table_rehash(struct table *t, size_t cap)
{
    free(t->slot);
    t->cap = cap;
    t->slot = sl_xcalloc(cap, sizeof *t->slot);
    for (int i = 0; i < t->n; i++) {
        size_t s = key_hash(&t->e[i].k) & (cap - 1);
        while (t->slot[s])
            s = (s + 1) & (cap - 1);
        t->slot[s] = i + 1;
    }
}

/* The totals of k, created zero when absent. */
static struct sl_usage *table_get(struct table *t, const struct sl_usage_key *k)
{
    if (2 * (size_t)(t->n + 1) > t->cap)
        table_rehash(t, t->cap ? 2 * t->cap : 64);
    size_t s = key_hash(k) & (t->cap - 1);
    for (; t->slot[s]; s = (s + 1) & (t->cap - 1))
        if (key_eq(&t->e[t->slot[s] - 1].k, k))
            return &t->e[t->slot[s] - 1].u;
    if (t->n == t->cap_e) {
        t->cap_e = t->cap_e ? 2 * t->cap_e : 64;
        t->e = sl_xrealloc(t->e, sizeof *t->e * (size_t)t->cap_e);
    }
    struct entry *e = &t->e[t->n];
    e->k = *k;
    memset(&e->u, 0, sizeof e->u);
    t->slot[s] = ++t->n;
    return &e->u;
}

static void table_dispose(struct table *t)
{
    free(t->e);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

struct sl_usage_ledger *sl_usage_ledger_new(void)
{
    struct sl_usage_ledger *l = sl_xcalloc(1, sizeof *l);
    pthread_mutex_init(&l->lock, NULL);
    return l;
}

void sl_usage_ledger_free(struct sl_usage_ledger *l)
{
    if (!l)
        return;
    table_dispose(&l->t);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

void sl_usage_ledger_add(struct sl_usage_ledger *l, const struct sl_usage_key *k,
                         const struct sl_usage *u)
{
    pthread_mutex_lock(&l->lock);
    sl_usage_add(table_get(&l->t, k), u);
    pthread_mutex_unlock(&l->lock);
}

static bool selected(const struct sl_usage_key *k, const char *tenant, int64_t from, int64_t to)
{
    return k->hour >= from && k->hour < to && (!tenant || strcmp(k->tenant, tenant) == 0);
}

void sl_usage_ledger_sum(struct sl_usage_ledger *l, const char *tenant, int64_t from, int64_t to,
                         struct sl_usage *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < l->t.n; i++)
        if (selected(&l->t.e[i].k, tenant, from, to))
            sl_usage_add(out, &l->t.e[i].u);
    pthread_mutex_unlock(&l->lock);
}

static int row_cmp(const void *pa, const void *pb)
{
    const struct sl_usage_key *a = &((const struct entry *)pa)->k,
                              *b = &((const struct entry *)pb)->k;
    int c = strcmp(a->tenant, b->tenant);
    if (!c)
        c = strcmp(a->model, b->model);
    if (!c)
        c = strcmp(a->tier, b->tier);
    if (!c)
        c = (a->hour > b->hour) - (a->hour < b->hour);
    return c;
}

int sl_usage_ledger_query(struct sl_usage_ledger *l, const char *tenant, int64_t from, int64_t to,
                          unsigned group, sl_usage_row_fn fn, void *arg)
{
    struct table g = {0};
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < l->t.n; i++) {
        const struct entry *e = &l->t.e[i];
        if (!selected(&e->k, tenant, from, to))
            continue;
        struct sl_usage_key k = e->k;
        if (!(group & SL_USAGE_BY_TENANT))
            k.tenant[0] = '\0';
        if (!(group & SL_USAGE_BY_MODEL))
            k.model[0] = '\0';
        if (!(group & SL_USAGE_BY_TIER))
            k.tier[0] = '\0';
        if (!(group & SL_USAGE_BY_HOUR))
            k.hour = -1;
        sl_usage_add(table_get(&g, &k), &e->u);
    }
    pthread_mutex_unlock(&l->lock);
    if (g.n > 1)
        qsort(g.e, (size_t)g.n, sizeof *g.e, row_cmp);
    for (int i = 0; i < g.n; i++)
        fn(arg, &g.e[i].k, &g.e[i].u);
    int n = g.n;
    table_dispose(&g);
    return n;
}

void sl_usage_ledger_each(struct sl_usage_ledger *l, sl_usage_row_fn fn, void *arg)
{
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < l->t.n; i++)
        fn(arg, &l->t.e[i].k, &l->t.e[i].u);
    pthread_mutex_unlock(&l->lock);
}
