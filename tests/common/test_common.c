#include <criterion/criterion.h>
#include <sluice/common.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char *sanitized(const char *in, size_t len)
{
    struct sl_str s;
    sl_str_init(&s);
    sl_utf8_sanitize(&s, in, len);
    sl_str_append(&s, "", 0);
    return s.p;
}

Test(common, json_escape_covers_quotes_backslash_and_controls_when_appending)
{
    struct sl_str s;
    sl_str_init(&s);
    const char in[] = "a\"b\\c\nd\te\x01\x1f f\xc3\xa9";
    sl_str_append_json(&s, in, sizeof in - 1);
    cr_assert_str_eq(s.p, "a\\\"b\\\\c\\nd\\te\\u0001\\u001f f\xc3\xa9");
    sl_str_dispose(&s);
}

/* Long texts are escaped in pieces: an escape on either side of a piece's edge comes out whole,
 * and the in-place escaper writes the same bytes. */
Test(common, json_escape_of_a_long_text_is_whole_across_the_pieces_it_is_done_in)
{
    enum { N = 3 * 4096 + 7 };
    char *in = malloc(N);
    for (int i = 0; i < N; i++)
        in[i] = (i % 4096 == 4095 || i % 4096 == 0) ? '\n' : (char)('a' + i % 26);
    struct sl_str s;
    sl_str_init(&s);
    sl_str_append(&s, "[", 1);
    sl_str_append_json(&s, in, N);
    size_t newlines = 0;
    for (int i = 0; i < N; i++)
        newlines += in[i] == '\n';
    cr_assert_eq(s.len, 1 + N + newlines, "each newline becomes two bytes");
    cr_assert_eq(s.p[s.len], '\0');
    char *direct = malloc(SL_JSON_ESCAPED_MAX(N));
    size_t n = (size_t)(sl_json_escape(direct, in, N) - direct);
    cr_assert_eq(n, s.len - 1);
    cr_assert_eq(memcmp(direct, s.p + 1, n), 0);
    cr_assert_eq(memcmp(s.p + 1 + 4096, "\\n\\n", 4), 0, "the escapes at the first edge");
    free(direct);
    free(in);
    sl_str_dispose(&s);
}

Test(common, appendf_grows_past_small_buffer_when_output_is_long)
{
    struct sl_str s;
    sl_str_init(&s);
    char big[600];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    sl_str_appendf(&s, "<%s>%d", big, 42);
    cr_assert_eq(s.len, sizeof big - 1 + 4);
    cr_assert_eq(s.p[0], '<');
    cr_assert_str_eq(s.p + s.len - 3, ">42");
    sl_str_dispose(&s);
}

Test(common, complete_prefix_holds_back_split_character_when_truncated)
{
    const char euro[] = "a\xe2\x82\xac"; /* "a€" */
    cr_assert_eq(sl_utf8_complete_prefix(euro, 4), 4);
    cr_assert_eq(sl_utf8_complete_prefix(euro, 3), 1);
    cr_assert_eq(sl_utf8_complete_prefix(euro, 2), 1);
    cr_assert_eq(sl_utf8_complete_prefix(euro, 1), 1);
    /* An invalid byte is complete: it will be replaced, not waited for. */
    cr_assert_eq(sl_utf8_complete_prefix("\xff", 1), 1);
    const char emoji[] = "\xf0\x9f\x98\x80";
    for (size_t i = 1; i < 4; i++)
        cr_assert_eq(sl_utf8_complete_prefix(emoji, i), 0, "prefix %zu", i);
    cr_assert_eq(sl_utf8_complete_prefix(emoji, 4), 4);
}

Test(common, sanitize_replaces_invalid_bytes_when_input_is_not_utf8)
{
    char *out = sanitized("ok\xff!", 4);
    cr_assert_str_eq(out, "ok\xef\xbf\xbd!");
    free(out);
    out = sanitized("\xc3\xa9", 2);
    cr_assert_str_eq(out, "\xc3\xa9");
    free(out);
    /* Truncated at the end, overlong, and a UTF-16 surrogate. */
    out = sanitized("x\xe2\x82", 3);
    cr_assert_str_eq(out, "x\xef\xbf\xbd");
    free(out);
    out = sanitized("\xc0\xaf", 2);
    cr_assert_str_eq(out, "\xef\xbf\xbd\xef\xbf\xbd");
    free(out);
    out = sanitized("\xed\xa0\x80", 3);
    cr_assert_eq(strstr(out, "\xed") == NULL, 1);
    free(out);
}

Test(common, utf8_valid_accepts_whole_characters_only_when_checking)
{
    cr_assert(sl_utf8_valid("", 0));
    cr_assert(sl_utf8_valid("a\xe2\x82\xac \xf0\x9f\x98\x80", 9));
    cr_assert_not(sl_utf8_valid("a\xe2\x82", 3), "a truncated character");
    cr_assert_not(sl_utf8_valid("\xe2", 1), "a lone lead byte");
    cr_assert_not(sl_utf8_valid("\x82", 1), "a lone continuation byte");
    cr_assert_not(sl_utf8_valid("\xc0\xaf", 2), "an overlong");
    cr_assert_not(sl_utf8_valid("\xed\xa0\x80", 3), "a surrogate");
    cr_assert_not(sl_utf8_valid("ok\xff", 3));
}

Test(common, status_str_names_every_status_when_asked)
{
    for (int st = SL_OK; st >= SL_EPERM; st--)
        cr_assert_str_neq(sl_status_str(st), "unknown status", "status %d", st);
    cr_assert_str_eq(sl_status_str(-1000), "unknown status");
}

Test(common, arena_keeps_every_allocation_apart_when_chunks_fill)
{
    struct sl_arena a;
    sl_arena_init(&a);
    char *p[200];
    for (int i = 0; i < 200; i++) {
        size_t n = (size_t)(i * 37 % 300) + 1;
        p[i] = sl_arena_alloc(&a, n);
        cr_assert_eq((uintptr_t)p[i] % 16, 0, "aligned for any type");
        memset(p[i], i, n);
    }
    /* One larger than a chunk, then small ones again. */
    char *big = sl_arena_calloc(&a, 5, 4096);
    for (int i = 0; i < 5 * 4096; i++)
        cr_assert_eq(big[i], 0);
    char *s = sl_arena_strndup(&a, "hello world", 5);
    cr_assert_str_eq(s, "hello");
    for (int i = 0; i < 200; i++) {
        size_t n = (size_t)(i * 37 % 300) + 1;
        for (size_t j = 0; j < n; j++)
            cr_assert_eq((unsigned char)p[i][j], (unsigned char)i, "allocation %d intact", i);
    }
    sl_arena_dispose(&a);
}

Test(common, arena_reuses_its_first_chunk_when_reset)
{
    struct sl_arena a;
    sl_arena_init(&a);
    void *first = sl_arena_alloc(&a, 64);
    for (int i = 0; i < 100; i++)
        sl_arena_alloc(&a, 1000); /* several chunks */
    sl_arena_reset(&a);
    cr_assert_eq(sl_arena_alloc(&a, 64), first, "the same memory serves the next use");
    sl_arena_reset(&a);
    sl_arena_reset(&a); /* idempotent */
    sl_arena_dispose(&a);
    sl_arena_dispose(&a); /* an empty arena disposes to nothing */
}
