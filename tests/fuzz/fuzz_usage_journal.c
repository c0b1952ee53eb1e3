/* Fuzz target: the usage journal's reader (usage/journal.c), as a server reads its state_dir at
 * start: any bytes (a torn write, a disk that returns garbage, a file someone edited) give lines
 * that parse or are skipped, never a crash, and a line that parses writes back as a line that
 * parses to the same record.
 *
 * Input: the file's content, read by sl_usage_journal_read from a temporary file; and each line
 * of it by sl_usage_journal_parse directly. */
#include <sluice/usage.h>

#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    snprintf(path, sizeof path, "/tmp/sluice-fuzz-journal-%d.jsonl", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "w");
    if (!f)
        abort();
    fwrite(data, 1, size, f);
    fclose(f);
    struct sl_usage_ledger *l = sl_usage_ledger_new();
    int bad = 0;
    char err[256];
    if (sl_usage_journal_read(path, l, &bad, err, sizeof err) != SL_OK)
        abort(); /* a readable file always reads */
    sl_usage_ledger_free(l);
    unlink(path);
    /* Line by line: a record that parses survives a write and a read unchanged. */
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        struct sl_usage_key k, k2;
        struct sl_usage u, u2;
        if (sl_usage_journal_parse(p, len, &k, &u) == SL_OK) {
            struct sl_str s;
            sl_str_init(&s);
            sl_usage_journal_record(&s, &k, &u);
            if (sl_usage_journal_parse(s.p, s.len - 1, &k2, &u2) != SL_OK ||
                memcmp(&k, &k2, sizeof k) != 0 || memcmp(&u, &u2, sizeof u) != 0)
                abort();
            sl_str_dispose(&s);
        }
        p += len + 1;
    }
    return 0;
}
