/* Fuzz target: the fleet's reading of Redis replies (sl_fleet_take_parse, sl_fleet_beat_parse and
 * sl_fleet_usage_parse, admission/fleet.c) behind hiredis's own protocol reader, as an I/O thread
 * gets them: any bytes a server (or something pretending to be one) sends must give either an error
 * or a verdict that stays inside what the script can answer (a refusal names one of the call's
 * buckets; counts are what was sent), and never a crash or a read out of bounds.
 *
 * Input: byte 0 picks how many buckets the call had (1 .. SL_FLEET_BUCKETS_MAX), the rest is
 * what the server sent, fed to the reader in two pieces split at byte 1's position.
 *
 * hiredis 0.14's reader allocates an array's elements as its header announces them, so a server
 * that announces a billion takes gigabytes: Redis is trusted like the configuration (SECURITY.md).
 * Inputs with an array or string length of more than four digits are skipped, to keep the
 * fuzzer on our code. */
#include <sluice/admission.h>

#include "fuzz.h"

#include <hiredis/hiredis.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int n = 1 + data[0] % SL_FLEET_BUCKETS_MAX;
    size_t split = data[1] % (size - 1);
    data += 2;
    size -= 2;
    for (size_t i = 0; i < size; i++) { /* "*N" and "$N": at most four digits */
        if (data[i] != '*' && data[i] != '$')
            continue;
        size_t j = i + 1;
        while (j < size && data[j] >= '0' && data[j] <= '9')
            j++;
        if (j - i - 1 > 4)
            return 0;
    }
    redisReader *rd = redisReaderCreate();
    fuzz_check(rd, "no reader");
    redisReaderFeed(rd, (const char *)data, split < size ? split : size);
    redisReaderFeed(rd, (const char *)data + (split < size ? split : size),
                    size - (split < size ? split : size));
    for (;;) {
        void *reply = NULL;
        if (redisReaderGetReply(rd, &reply) != REDIS_OK || !reply)
            break;
        struct sl_fleet_take t;
        char err[256];
        enum sl_status st = sl_fleet_take_parse(reply, n, &t, err, sizeof err);
        if (st == SL_OK) {
            fuzz_check(t.admitted || (t.failed >= 0 && t.failed < n), "failed %d of %d", t.failed,
                       n);
            fuzz_check(!t.admitted || t.failed == -1, "admitted names bucket %d", t.failed);
            fuzz_check(t.admitted || t.view[t.failed].retry_ns >= -1, "retry %lld",
                       (long long)t.view[t.failed].retry_ns);
        } else {
            fuzz_check(st == SL_EIO && err[0], "status %d without a reason", st);
        }
        int alive = sl_fleet_beat_parse(reply);
        fuzz_check(alive == -1 || alive >= 1, "beat answered %d replicas", alive);
        /* A page of the ledger: whatever it holds lands in a ledger, hours on the hour. */
        struct sl_usage_ledger *l = sl_usage_ledger_new();
        int64_t spent = 0, last = 0;
        int bad = 0;
        int hours = sl_fleet_usage_parse(reply, l, &spent, &last, &bad, err, sizeof err);
        fuzz_check(hours >= -1, "usage answered %d hours", hours);
        fuzz_check(hours <= 0 || last % 3600 == 0, "an hour %lld off the hour", (long long)last);
        fuzz_check(hours >= 0 || err[0], "a usage failure without a reason");
        struct sl_usage sum;
        sl_usage_ledger_sum(l, NULL, INT64_MIN, INT64_MAX, &sum);
        sl_usage_ledger_free(l);
        freeReplyObject(reply);
    }
    redisReaderFree(rd);
    return 0;
}
