#include "worker_test.h"

static struct sl_tok *tok;

static void setup(void)
{
    tok = sl_tok_synthetic(512);
}

static void teardown(void)
{
    sl_tok_free(tok);
}

static int32_t piece(const char *s)
{
    int32_t id = sl_tok_lookup(tok, s, strlen(s));
    cr_assert_geq(id, 0, "\"%s\" is not a piece", s);
    return id;
}

static int32_t byte_tok(unsigned char b)
{
    return (int32_t)b + 3;
}

Test(worker, detok_streams_text_when_no_stop_is_set, .init = setup, .fini = teardown)
{
    const char *text = "Once upon a time, there was a little girl.";
    int32_t ids[64];
    int n;
    cr_assert_eq(sl_tok_encode(tok, text, strlen(text), true, ids, 64, &n), SL_OK);
    struct sl_detok *d = sl_detok_new(tok, ids[0], NULL, 0);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    for (int i = 1; i < n; i++) {
        size_t before = out.len, plen;
        sl_tok_decode(tok, ids[i - 1], ids[i], &plen);
        size_t got = sl_detok_push(d, ids[i], &out, &stopped);
        cr_assert_eq(got, out.len - before);
        cr_assert_eq(got, plen, "token %d: %zu bytes released of %zu", i, got, plen);
    }
    sl_detok_finish(d, &out);
    cr_assert(!stopped);
    cr_assert_str_eq(out.p, text);
    sl_detok_free(d);
    sl_str_dispose(&out);
}

Test(worker, detok_stops_when_stop_string_spans_tokens, .init = setup, .fini = teardown)
{
    const char *stops[] = {"", "a li"};
    const char *text = "Once upon a time there was a little girl.";
    int32_t ids[64];
    int n;
    cr_assert_eq(sl_tok_encode(tok, text, strlen(text), true, ids, 64, &n), SL_OK);
    struct sl_detok *d = sl_detok_new(tok, ids[0], stops, 2);
    struct sl_str out;
    sl_str_init(&out);
    sl_str_append(&out, "", 0);
    bool stopped = false;
    int i;
    for (i = 1; i < n && !stopped; i++) {
        sl_detok_push(d, ids[i], &out, &stopped);
        /* Released text never contains the stop, and never ends in a piece of it. */
        cr_assert_null(strstr(out.p, "a li"));
    }
    cr_assert(stopped);
    cr_assert_str_eq(out.p, "Once upon a time there was ");
    cr_assert_lt(i, n, "stopped only at the end");
    /* The stop that ended it is named by its index among those given, the empty one counted. */
    cr_assert_eq(sl_detok_stop_index(d), 1);
    /* Further pushes are ignored. */
    cr_assert_eq(sl_detok_push(d, piece("x"), &out, &stopped), 0);
    cr_assert_eq(sl_detok_finish(d, &out), 0);
    sl_detok_free(d);
    sl_str_dispose(&out);
}

Test(worker, detok_holds_back_prefix_when_stop_may_follow, .init = setup, .fini = teardown)
{
    const char *stops[] = {"END"};
    struct sl_detok *d = sl_detok_new(tok, 42, stops, 1);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    cr_assert_eq(sl_detok_push(d, piece("x"), &out, &stopped), 1);
    cr_assert_eq(sl_detok_push(d, piece("E"), &out, &stopped), 0);
    cr_assert_eq(sl_detok_push(d, piece("N"), &out, &stopped), 0);
    cr_assert_eq(sl_detok_push(d, piece("o"), &out, &stopped), 3);
    cr_assert_str_eq(out.p, "xENo");
    cr_assert_eq(sl_detok_push(d, piece("E"), &out, &stopped), 0);
    cr_assert_eq(sl_detok_finish(d, &out), 1); /* the end: a dangling prefix is just text */
    cr_assert_str_eq(out.p, "xENoE");
    cr_assert(!stopped);
    sl_detok_free(d);
    sl_str_dispose(&out);
}

Test(worker, detok_releases_earliest_stop_when_several_match, .init = setup, .fini = teardown)
{
    const char *stops[] = {"cd", "bcde"};
    struct sl_detok *d = sl_detok_new(tok, 42, stops, 2);
    struct sl_str out;
    sl_str_init(&out);
    sl_str_append(&out, "", 0);
    bool stopped = false;
    const char *seq[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < 5 && !stopped; i++)
        sl_detok_push(d, piece(seq[i]), &out, &stopped);
    cr_assert(stopped);
    cr_assert_str_eq(out.p, "ab");
    sl_detok_free(d);
    sl_str_dispose(&out);
}

Test(worker, detok_joins_character_when_utf8_is_split_across_tokens, .init = setup,
     .fini = teardown)
{
    struct sl_detok *d = sl_detok_new(tok, 42, NULL, 0);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    const unsigned char emoji[] = {0xF0, 0x9F, 0x98, 0x80}; /* 😀 */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sl_detok_push(d, byte_tok(emoji[i]), &out, &stopped), 0);
    cr_assert_eq(sl_detok_push(d, byte_tok(emoji[3]), &out, &stopped), 4);
    cr_assert_eq(sl_detok_push(d, byte_tok(0xC3), &out, &stopped), 0);
    cr_assert_eq(sl_detok_push(d, byte_tok(0xA9), &out, &stopped), 2);
    cr_assert_str_eq(out.p, "😀é");
    sl_detok_free(d);
    sl_str_dispose(&out);
}

Test(worker, detok_emits_replacement_when_bytes_are_invalid, .init = setup, .fini = teardown)
{
    struct sl_detok *d = sl_detok_new(tok, 42, NULL, 0);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    sl_detok_push(d, byte_tok(0xFF), &out, &stopped);
    cr_assert_str_eq(out.p, "\xEF\xBF\xBD");
    /* A lead byte followed by a non-continuation: the lead becomes U+FFFD, the rest survives. */
    sl_detok_push(d, byte_tok(0xE2), &out, &stopped);
    sl_detok_push(d, piece("a"), &out, &stopped);
    cr_assert_str_eq(out.p, "\xEF\xBF\xBD\xEF\xBF\xBD"
                            "a");
    /* A character cut short by the end of the sequence. */
    sl_detok_push(d, byte_tok(0xE2), &out, &stopped);
    sl_detok_push(d, byte_tok(0x82), &out, &stopped);
    cr_assert_str_eq(out.p, "\xEF\xBF\xBD\xEF\xBF\xBD"
                            "a");
    cr_assert_eq(sl_detok_finish(d, &out), 3);
    cr_assert_str_eq(out.p, "\xEF\xBF\xBD\xEF\xBF\xBD"
                            "a\xEF\xBF\xBD");
    sl_detok_free(d);
    sl_str_dispose(&out);
}

Test(worker, detok_stops_when_stop_string_is_non_ascii, .init = setup, .fini = teardown)
{
    const char *stops[] = {"é!"};
    struct sl_detok *d = sl_detok_new(tok, 42, stops, 1);
    struct sl_str out;
    sl_str_init(&out);
    sl_str_append(&out, "", 0);
    bool stopped = false;
    sl_detok_push(d, piece("a"), &out, &stopped);
    sl_detok_push(d, byte_tok(0xC3), &out, &stopped);
    sl_detok_push(d, byte_tok(0xA9), &out, &stopped);
    cr_assert_str_eq(out.p, "a");
    sl_detok_push(d, piece("!"), &out, &stopped);
    cr_assert(stopped);
    cr_assert_str_eq(out.p, "a");
    sl_detok_free(d);
    sl_str_dispose(&out);
}

/* Found by tests/fuzz/fuzz_tok_spm: the stop "\xA9" matched the second byte of "é" and the
 * text before it, ending in a lone 0xC3, was released. */
Test(worker, detok_ignores_stop_string_when_it_is_not_utf8, .init = setup, .fini = teardown)
{
    const char *stops[] = {"\xA9", "\xC3"};
    struct sl_detok *d = sl_detok_new(tok, 42, stops, 2);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    sl_detok_push(d, piece("a"), &out, &stopped);
    sl_detok_push(d, byte_tok(0xC3), &out, &stopped);
    sl_detok_push(d, byte_tok(0xA9), &out, &stopped);
    sl_detok_push(d, piece("!"), &out, &stopped);
    sl_detok_finish(d, &out);
    cr_assert(!stopped);
    cr_assert_str_eq(out.p, "a\xC3\xA9!");
    sl_detok_free(d);
    sl_str_dispose(&out);
}

Test(worker, detok_drops_leading_space_when_prompt_ends_with_bos, .init = setup, .fini = teardown)
{
    struct sl_detok *d = sl_detok_new(tok, 1, NULL, 0);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    sl_detok_push(d, piece(" the"), &out, &stopped);
    sl_detok_push(d, piece(" the"), &out, &stopped);
    cr_assert_str_eq(out.p, "the the");
    sl_detok_free(d);
    sl_str_dispose(&out);
}

/* vLLM's options. min_tokens: a stop string completed by one of the first min_tokens tokens does
 * not count (its text is released as any other); from the next token on they match, including
 * one begun by held-back text of earlier tokens. */
Test(worker, detok_matches_stop_strings_only_after_min_tokens, .init = setup, .fini = teardown)
{
    const char *stops[] = {"ab"};
    const char *seq[] = {"a", "b", "x", "a", "b", "y"};
    for (int min = 0; min <= 6; min++) {
        struct sl_detok *d = sl_detok_new(tok, 42, stops, 1);
        sl_detok_stop_options(d, min, false);
        struct sl_str out;
        sl_str_init(&out);
        sl_str_append(&out, "", 0);
        bool stopped = false;
        for (int i = 0; i < 6 && !stopped; i++)
            sl_detok_push(d, piece(seq[i]), &out, &stopped);
        sl_detok_finish(d, &out);
        /* "ab" completes with tokens 2 and 5 (counting from 1). */
        const char *want = min <= 1 ? "" : min <= 4 ? "abx" : "abxaby";
        cr_assert_str_eq(out.p, want, "min_tokens %d", min);
        cr_assert_eq(stopped, min <= 4, "min_tokens %d", min);
        sl_detok_free(d);
        sl_str_dispose(&out);
    }
}

/* include_stop: the stop string is released too, and nothing after it. */
Test(worker, detok_includes_the_stop_string_when_asked, .init = setup, .fini = teardown)
{
    const char *stops[] = {"ut", "tim"};
    struct sl_detok *d = sl_detok_new(tok, 42, stops, 2);
    sl_detok_stop_options(d, 0, true);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    const char *seq[] = {"b", "u", " time", "x"};
    for (int i = 0; i < 4 && !stopped; i++)
        sl_detok_push(d, piece(seq[i]), &out, &stopped);
    cr_assert(stopped);
    cr_assert_str_eq(out.p, "bu tim");
    sl_detok_free(d);
    sl_str_dispose(&out);
}

/* skip_special_tokens: false. The synthetic vocabulary's <s> and </s> (ids 1, 2) are control
 * tokens: no text by default, their own text when kept; ordinary tokens are unchanged. */
Test(worker, detok_shows_control_tokens_only_when_asked_to_keep_them, .init = setup,
     .fini = teardown)
{
    const char *t1, *t2;
    size_t l1, l2;
    cr_assert(sl_tok_special_text(tok, 1, &t1, &l1));
    cr_assert(sl_tok_special_text(tok, 2, &t2, &l2));
    cr_assert_gt(l1, 0);
    cr_assert_gt(l2, 0);
    cr_assert(!sl_tok_special_text(tok, piece("a"), &t1, &l1), "an ordinary piece");
    cr_assert(!sl_tok_special_text(tok, -1, &t1, &l1));
    int32_t seq[] = {piece("a"), 2, piece("a"), 1};
    struct sl_str plain, kept, want;
    sl_str_init(&plain);
    sl_str_init(&kept);
    sl_str_init(&want);
    struct sl_detok *d = sl_detok_new(tok, 42, NULL, 0), *k = sl_detok_new(tok, 42, NULL, 0);
    sl_detok_keep_special(k);
    for (int i = 0; i < 4; i++) {
        sl_detok_push(d, seq[i], &plain, NULL);
        sl_detok_push(k, seq[i], &kept, NULL);
    }
    sl_detok_finish(d, &plain);
    sl_detok_finish(k, &kept);
    cr_assert_str_eq(plain.p, "aa");
    sl_tok_special_text(tok, 2, &t2, &l2);
    sl_tok_special_text(tok, 1, &t1, &l1);
    sl_str_append(&want, "a", 1);
    sl_str_append(&want, t2, l2);
    sl_str_append(&want, "a", 1);
    sl_str_append(&want, t1, l1);
    cr_assert_str_eq(kept.p, want.p);
    sl_detok_free(d);
    sl_detok_free(k);
    sl_str_dispose(&plain);
    sl_str_dispose(&kept);
    sl_str_dispose(&want);
}

Test(worker, detok_names_the_earliest_stop_when_several_match, .init = setup, .fini = teardown)
{
    const char *stops[] = {"girl", "was", "time"};
    const char *text = "Once upon a time there was a little girl.";
    int32_t ids[64];
    int n;
    cr_assert_eq(sl_tok_encode(tok, text, strlen(text), true, ids, 64, &n), SL_OK);
    struct sl_detok *d = sl_detok_new(tok, ids[0], stops, 3);
    struct sl_str out;
    sl_str_init(&out);
    bool stopped = false;
    cr_assert_eq(sl_detok_stop_index(d), -1);
    for (int i = 1; i < n && !stopped; i++)
        sl_detok_push(d, ids[i], &out, &stopped);
    cr_assert(stopped);
    cr_assert_eq(sl_detok_stop_index(d), 2, "\"time\" comes first in the text");
    sl_detok_free(d);
    sl_str_dispose(&out);
}
