/* Helpers shared by the libFuzzer targets (tests/fuzz/README.md says how they are built and run).
 *
 * A target is one LLVMFuzzerTestOneInput per executable. Each must be deterministic for a given
 * input, must not leak, and reports a broken invariant with fuzz_check(), which aborts so that
 * libFuzzer records the input as a crash. */
#ifndef SLUICE_TESTS_FUZZ_H
#define SLUICE_TESTS_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Aborts with a message when cond is false: the input is a crash. */
#define fuzz_check(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_check failed: %s (%s:%d): ", #cond, __FILE__, __LINE__);         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* With SLUICE_FUZZ_VERBOSE set, prints why an input was refused (for keeping the seeds useful:
 * `SLUICE_FUZZ_VERBOSE=1 build-fuzz/tests/fuzz/fuzz_gguf tests/fuzz/corpus/gguf/SEED`). */
static inline void fuzz_note(const char *what, const char *why)
{
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("SLUICE_FUZZ_VERBOSE") != NULL;
    if (verbose)
        fprintf(stderr, "%s: %s\n", what, why);
}

/* An anonymous in-memory file holding data, for loaders that only take a path; *path is
 * "/proc/self/fd/N". Returns the descriptor (close it when done), or -1. */
static inline int fuzz_memfd(const void *data, size_t len, char *path, size_t pathlen)
{
    int fd = memfd_create("sluice-fuzz", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t n = write(fd, p, left);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        p += n;
        left -= (size_t)n;
    }
    snprintf(path, pathlen, "/proc/self/fd/%d", fd);
    return fd;
}

/* Splits data at the first occurrence of sep: the part before it goes to *a, the rest (after
 * sep) to *b. Without sep, everything is *a and *b is empty. */
static inline void fuzz_split(const uint8_t *data, size_t size, const char *sep, const uint8_t **a,
                              size_t *alen, const uint8_t **b, size_t *blen)
{
    size_t k = strlen(sep);
    const uint8_t *hit = k && size >= k ? memmem(data, size, sep, k) : NULL;
    *a = data;
    if (!hit) {
        *alen = size;
        *b = data + size;
        *blen = 0;
        return;
    }
    *alen = (size_t)(hit - data);
    *b = hit + k;
    *blen = size - *alen - k;
}

#endif
