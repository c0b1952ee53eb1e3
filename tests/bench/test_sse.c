/* Unit tests of stream reading: every split of an event stream gives the same events (the
 * parser rule of STYLE.md: feed every prefix), OpenAI chunks of both endpoints, and Retry-After. */
#include <criterion/criterion.h>

#include "bench_impl.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct events {
    char all[4096];
    int n;
};

static int collect(void *arg, const char *data, size_t len)
{
    struct events *e = arg;
    cr_assert_eq(strlen(data), len, "NUL-terminated at len");
    size_t used = strlen(e->all);
    snprintf(e->all + used, sizeof e->all - used, "[%s]", data);
    e->n++;
    return 0;
}

static const char *const streams[] = {
    "data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n",
    "data: {\"a\":1}\r\n\r\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\r\n\r\n",
    ": keep-alive comment\nevent: message\nid: 7\ndata: {\"a\":1}\n\nretry: 10\n\n"
    "data:{\"b\":2}\n\ndata: [DONE]\n\n",
    "data: {\"a\":1}\r\rdata: {\"b\":2}\r\rdata: [DONE]\r\r",
};

Test(bench, sse_gives_the_same_events_when_split_anywhere)
{
    for (size_t s = 0; s < sizeof streams / sizeof streams[0]; s++) {
        const char *in = streams[s];
        size_t n = strlen(in);
        for (size_t cut1 = 0; cut1 <= n; cut1++) {
            for (size_t cut2 = cut1; cut2 <= n; cut2 += 3) {
                struct sl_bench_sse p;
                sl_bench_sse_init(&p);
                struct events e = {{0}, 0};
                cr_assert_eq(sl_bench_sse_feed(&p, in, cut1, collect, &e), 0);
                cr_assert_eq(sl_bench_sse_feed(&p, in + cut1, cut2 - cut1, collect, &e), 0);
                cr_assert_eq(sl_bench_sse_feed(&p, in + cut2, n - cut2, collect, &e), 0);
                cr_assert_str_eq(e.all, "[{\"a\":1}][{\"b\":2}][[DONE]]",
                                 "stream %zu cut at %zu and %zu", s, cut1, cut2);
                sl_bench_sse_dispose(&p);
            }
        }
    }
}

Test(bench, sse_joins_data_lines_when_an_event_has_several)
{
    struct sl_bench_sse p;
    sl_bench_sse_init(&p);
    struct events e = {{0}, 0};
    const char *in = "data: one\ndata\ndata: two\n\n\n\ndata: x\n";
    sl_bench_sse_feed(&p, in, strlen(in), collect, &e);
    cr_expect_str_eq(e.all, "[one\n\ntwo]", "an event without its blank line is not dispatched");
    sl_bench_sse_dispose(&p);
}

static int stop_at_second(void *arg, const char *data, size_t len)
{
    (void)data;
    (void)len;
    return ++*(int *)arg == 2 ? 7 : 0;
}

Test(bench, sse_stops_when_the_callback_says_so)
{
    struct sl_bench_sse p;
    sl_bench_sse_init(&p);
    int count = 0;
    cr_expect_eq(sl_bench_sse_feed(&p, streams[0], strlen(streams[0]), stop_at_second, &count), 7);
    cr_expect_eq(count, 2);
    sl_bench_sse_dispose(&p);
}

/* A page whose last bytes hold the input, followed by an unmapped page: an over-read crashes. */
static const char *at_page_end(const char *text, void **map, size_t *maplen)
{
    long page = sysconf(_SC_PAGESIZE);
    *maplen = (size_t)page * 2;
    char *m = mmap(NULL, *maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED);
    cr_assert_eq(mprotect(m + page, (size_t)page, PROT_NONE), 0);
    size_t n = strlen(text);
    memcpy(m + page - n, text, n);
    *map = m;
    return m + page - n;
}

Test(bench, sse_reads_no_further_when_input_ends_at_a_page)
{
    void *map;
    size_t maplen;
    const char *text = "data: {\"a\":1}\n\ndata: partial";
    const char *p = at_page_end(text, &map, &maplen);
    for (size_t n = 0; n <= strlen(text); n++) {
        struct sl_bench_sse s;
        sl_bench_sse_init(&s);
        struct events e = {{0}, 0};
        sl_bench_sse_feed(&s, p + strlen(text) - n, n, collect, &e);
        sl_bench_sse_dispose(&s);
    }
    struct sl_bench_chunk ch;
    const char *chunk = "{\"choices\":[{\"text\":\"x\"}]}";
    const char *q = at_page_end(chunk, &map, &maplen);
    cr_expect_eq(sl_bench_chunk_read(q, strlen(chunk), &ch), SL_OK);
    cr_expect(ch.text);
    munmap(map, maplen);
}

static struct sl_bench_chunk read_chunk(const char *s)
{
    struct sl_bench_chunk ch;
    int rc = sl_bench_chunk_read(s, strlen(s), &ch);
    cr_assert_eq(rc, SL_OK, "%s: %s", s, ch.message);
    return ch;
}

Test(bench, chunks_are_read_when_completions_or_chat)
{
    struct sl_bench_chunk ch = read_chunk(
        "{\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"text\":\" fri\",\"index\":0,"
        "\"finish_reason\":null}],\"usage\":null}");
    cr_expect(ch.text && !ch.usage && !ch.finish && !ch.done && !ch.error);
    ch = read_chunk("{\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],\"usage\":null}");
    cr_expect(!ch.text && ch.finish, "an empty text is not a token");
    ch = read_chunk("{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}");
    cr_expect(!ch.text, "the role chunk carries no token");
    ch = read_chunk("{\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}");
    cr_expect(ch.text);
    ch = read_chunk("{\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}");
    cr_expect(ch.text, "reasoning tokens are tokens");
    ch = read_chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":17,\"completion_tokens\":3,"
                    "\"total_tokens\":20}}");
    cr_expect(ch.usage && !ch.text);
    cr_expect_eq(ch.prompt_tokens, 17);
    cr_expect_eq(ch.completion_tokens, 3);
    ch = read_chunk("  [DONE]");
    cr_expect(ch.done);
    ch = read_chunk("{\"error\":{\"message\":\"engine died\",\"type\":\"server_error\"}}");
    cr_expect(ch.error);
    cr_expect_str_eq(ch.message, "engine died");
    /* A whole non-streamed chat response. */
    ch = read_chunk("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"ok\"},"
                    "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,"
                    "\"completion_tokens\":1}}");
    cr_expect(ch.text && ch.usage && ch.finish);
    struct sl_bench_chunk bad;
    cr_expect_eq(sl_bench_chunk_read("{\"choices\":", 11, &bad), SL_EFORMAT);
    cr_expect(strstr(bad.message, "not a JSON object"), "%s", bad.message);
    cr_expect_eq(sl_bench_chunk_read("[1]", 3, &bad), SL_EFORMAT);
}

Test(bench, cached_tokens_are_read_when_usage_details_give_them)
{
    struct sl_bench_chunk ch =
        read_chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":1050,\"completion_tokens\":16,"
                   "\"prompt_tokens_details\":{\"cached_tokens\":992}}}");
    cr_expect(ch.usage);
    cr_expect_eq(ch.cached_tokens, 992);
    ch = read_chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":17,\"completion_tokens\":3}}");
    cr_expect_eq(ch.cached_tokens, 0, "no details: nothing cached");
    ch = read_chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":17,\"completion_tokens\":3,"
                    "\"prompt_tokens_details\":{\"cached_tokens\":18}}}");
    cr_expect_eq(ch.cached_tokens, 0, "more cached than prompt tokens is not believed");
}

Test(bench, chunk_text_counts_when_it_is_a_nul_byte)
{
    /* A random-weight model emits the byte token <0x00>; the server escapes it as \u0000,
     * which jansson refuses unless asked. It is a token the server sent, not a broken stream. */
    struct sl_bench_chunk ch = read_chunk("{\"choices\":[{\"text\":\"\\u0000\",\"index\":0}]}");
    cr_expect(ch.text && !ch.error);
    ch = read_chunk("{\"choices\":[{\"delta\":{\"content\":\"\\u0000\"}}]}");
    cr_expect(ch.text, "a chat delta of one NUL is a token too");
    ch = read_chunk("{\"error\":{\"message\":\"bad\\u0000byte\"}}");
    cr_expect(ch.error);
    cr_expect_str_eq(ch.message, "bad", "a message is cut at its NUL, not refused");
}

Test(bench, retry_after_is_read_when_seconds_or_a_date)
{
    cr_expect_float_eq(sl_bench_retry_after_parse("2", 0), 2, 1e-12);
    cr_expect_float_eq(sl_bench_retry_after_parse(" 1.5 ", 0), 1.5, 1e-12);
    /* Thu, 01 Jan 1970 00:01:40 GMT is 100 s after the epoch. */
    cr_expect_float_eq(sl_bench_retry_after_parse("Thu, 01 Jan 1970 00:01:40 GMT", 90), 10, 1e-9);
    cr_expect_float_eq(sl_bench_retry_after_parse("Thu, 01 Jan 1970 00:01:40 GMT", 200), 0, 1e-9);
    cr_expect_lt(sl_bench_retry_after_parse("soon", 0), 0);
    cr_expect_lt(sl_bench_retry_after_parse("-3", 0), 0);
    cr_expect_lt(sl_bench_retry_after_parse("3 s", 0), 0);
}

Test(bench, sse_refuses_a_line_when_it_outgrows_the_bound)
{
    struct sl_bench_sse p;
    sl_bench_sse_init(&p);
    struct events e = {{0}, 0};
    static char block[65536];
    memset(block, 'x', sizeof block);
    cr_assert_eq(sl_bench_sse_feed(&p, "data: ", 6, collect, &e), 0);
    int rc = 0;
    size_t fed = 0;
    while (rc == 0 && fed <= SL_BENCH_SSE_MAX) {
        rc = sl_bench_sse_feed(&p, block, sizeof block, collect, &e);
        fed += sizeof block;
    }
    cr_expect_eq(rc, SL_ERANGE, "a line without end is refused past the bound");
    cr_expect_eq(e.n, 0);
    sl_bench_sse_dispose(&p);
}
