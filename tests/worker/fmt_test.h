/* Helpers of the model-format tests (GGUF, safetensors). */
#ifndef SLUICE_TESTS_WORKER_FMT_TEST_H
#define SLUICE_TESTS_WORKER_FMT_TEST_H

#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

#include "worker_test.h"

/* A buffer whose end touches a PROT_NONE page, so a parser that reads one byte past its input
 * crashes the test instead of passing (picohttpparser's trick). */
struct ft_guard {
    unsigned char *base;
    size_t room; /* bytes before the guard page */
    size_t map_len;
};

static inline void ft_guard_init(struct ft_guard *g, size_t cap)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    g->room = (cap + page - 1) / page * page;
    if (g->room == 0)
        g->room = page;
    g->map_len = g->room + page;
    g->base = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(g->base != MAP_FAILED);
    cr_assert_eq(mprotect(g->base + g->room, page, PROT_NONE), 0);
}

/* Copies data so that its last byte is the last readable one; returns where it starts. */
static inline const void *ft_guard_put(struct ft_guard *g, const void *data, size_t len)
{
    cr_assert_leq(len, g->room);
    unsigned char *p = g->base + g->room - len;
    if (len)
        memcpy(p, data, len);
    return p;
}

static inline void ft_guard_dispose(struct ft_guard *g)
{
    munmap(g->base, g->map_len);
}

/* The IEEE half value of h, computed independently of the loader's converter. */
static inline float ft_half(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0    ? ldexpf((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : ldexpf((float)(1024 + m), e - 25);
    return s ? -v : v;
}

/* A deterministic stream for synthetic weights. */
static inline uint32_t ft_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* A random normal half in about ±[2^-6, 2^2). */
static inline uint16_t ft_rand_half(uint64_t *s)
{
    uint32_t r = ft_rand(s);
    return (uint16_t)((r & 0x8000) | (uint32_t)(9 + (r >> 16) % 8) << 10 | (r & 0x3ff));
}

#endif
