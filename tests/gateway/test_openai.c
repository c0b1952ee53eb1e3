/* The OpenAI JSON layer: request decoding and validation, the context check, and the response,
 * chunk, error and model encoders (parsed back with jansson). */
#include "gateway_impl.h"

#include <criterion/criterion.h>
#include <string.h>

#define MODEL "synthetic:tiny"

static struct sl_model *tiny_model(void)
{
    struct sl_model *m = NULL;
    char err[256];
    cr_assert_eq(sl_model_load("synthetic:tiny", NULL, &m, err, sizeof err), SL_OK, "%s", err);
    return m;
}

static int decode(struct sl_openai_completion *c, const char *body, struct sl_openai_error *err)
{
    memset(err, 0, sizeof *err);
    return sl_openai_completion_decode(c, body, strlen(body), MODEL, 16, err);
}

/* Decodes a body that must fail, and checks the HTTP status and param it names. */
static void expect_error(const char *body, int http, const char *param, const char *code)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    int st = decode(&c, body, &err);
    cr_assert_lt(st, 0, "accepted %s", body);
    cr_assert_eq(err.http, http, "%s: http %d, message %s", body, err.http, err.message);
    cr_assert_str_eq(err.param, param ? param : "", "%s: param %s", body, err.param);
    if (code)
        cr_assert(err.code && strcmp(err.code, code) == 0, "%s: code %s", body,
                  err.code ? err.code : "(null)");
    cr_assert_null(c.root);
    cr_assert(err.message[0]);
}

static json_t *parse(const struct sl_str *s)
{
    json_error_t je;
    json_t *j = json_loadb(s->p, s->len, 0, &je);
    cr_assert_not_null(j, "not JSON (%s at %d:%d): %s", je.text, je.line, je.column, s->p);
    return j;
}

static const char *str_at(json_t *j, const char *path0, const char *path1)
{
    json_t *v = json_object_get(j, path0);
    if (path1)
        v = json_object_get(v, path1);
    cr_assert(json_is_string(v), "%s.%s is not a string", path0, path1 ? path1 : "");
    return json_string_value(v);
}

Test(gateway, decodes_defaults_when_only_prompt_is_given)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":\"Once upon\"}", &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.prompt_len, 9);
    cr_assert_eq(memcmp(c.prompt, "Once upon", 9), 0);
    cr_assert_eq(c.params.max_tokens, 16);
    cr_assert_float_eq(c.params.temperature, 1.0f, 1e-6);
    cr_assert_float_eq(c.params.top_p, 1.0f, 1e-6);
    cr_assert_not(c.has_seed);
    cr_assert_eq(c.params.n_stop, 0);
    cr_assert_not(c.stream);
    cr_assert_not(c.include_usage);
    sl_openai_completion_dispose(&c);
}

Test(gateway, decodes_every_field_when_all_are_valid)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    const char *body = "{\"model\":\"" MODEL "\",\"prompt\":\"hi\",\"max_tokens\":7,"
                       "\"temperature\":0,\"top_p\":0.5,\"seed\":-3,\"stop\":[\"\\n\",\"END\"],"
                       "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"user\":\"x\",\"logit_bias\":{},\"n\":1}";
    cr_assert_eq(decode(&c, body, &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.params.max_tokens, 7);
    cr_assert_float_eq(c.params.temperature, 0.0f, 1e-6);
    cr_assert_float_eq(c.params.top_p, 0.5f, 1e-6);
    cr_assert(c.has_seed);
    cr_assert_eq(c.params.seed, (uint64_t)-3);
    cr_assert_eq(c.params.n_stop, 2);
    cr_assert_str_eq(c.params.stop[0], "\n");
    cr_assert_str_eq(c.params.stop[1], "END");
    cr_assert(c.stream);
    cr_assert(c.include_usage);
    sl_openai_completion_dispose(&c);
}

Test(gateway, treats_null_as_absent_when_optional_fields_are_null)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    const char *body = "{\"model\":null,\"prompt\":\"a\",\"max_tokens\":null,\"temperature\":null,"
                       "\"top_p\":null,\"seed\":null,\"stop\":null,\"stream\":null}";
    cr_assert_eq(decode(&c, body, &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.params.max_tokens, 16);
    cr_assert_not(c.has_seed);
    cr_assert_eq(c.params.n_stop, 0);
    cr_assert_not(c.stream);
    sl_openai_completion_dispose(&c);
}

Test(gateway, accepts_a_single_stop_string_when_stop_is_a_string)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":\"a\",\"stop\":\"\\u00e9t\\u00e9\"}", &err), SL_OK);
    cr_assert_eq(c.params.n_stop, 1);
    cr_assert_str_eq(c.params.stop[0], "\xc3\xa9t\xc3\xa9");
    sl_openai_completion_dispose(&c);
}

Test(gateway, accepts_four_stops_when_stop_array_is_at_the_limit)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\"]}", &err), SL_OK);
    cr_assert_eq(c.params.n_stop, 4);
    cr_assert_str_eq(c.params.stop[3], "4");
    sl_openai_completion_dispose(&c);
}

Test(gateway, names_the_param_when_a_field_has_the_wrong_type)
{
    expect_error("{\"prompt\":\"a\",\"model\":3}", 400, "model", "invalid_type");
    expect_error("{\"prompt\":7}", 400, "prompt", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"max_tokens\":\"5\"}", 400, "max_tokens", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"max_tokens\":5.5}", 400, "max_tokens", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"temperature\":\"hot\"}", 400, "temperature", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"top_p\":true}", 400, "top_p", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"seed\":1.5}", 400, "seed", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"stop\":5}", 400, "stop", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"stop\":[\"x\",5]}", 400, "stop", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "stream", "invalid_type");
    expect_error("{\"prompt\":\"a\",\"stream_options\":[]}", 400, "stream_options", "invalid_type");
}

Test(gateway, mentions_the_type_when_a_field_has_the_wrong_type)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    decode(&c, "{\"prompt\":\"a\",\"max_tokens\":\"5\"}", &err);
    cr_assert_str_eq(err.message, "Invalid type for 'max_tokens': expected an integer, but got a "
                                  "string instead.");
}

Test(gateway, rejects_out_of_range_values_when_limits_are_crossed)
{
    expect_error("{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens",
                 "integer_below_min_value");
    expect_error("{\"prompt\":\"a\",\"max_tokens\":-4}", 400, "max_tokens", NULL);
    expect_error("{\"prompt\":\"a\",\"temperature\":2.01}", 400, "temperature",
                 "decimal_above_max_value");
    expect_error("{\"prompt\":\"a\",\"temperature\":-0.1}", 400, "temperature",
                 "decimal_below_min_value");
    expect_error("{\"prompt\":\"a\",\"top_p\":0}", 400, "top_p", "decimal_below_min_value");
    expect_error("{\"prompt\":\"a\",\"top_p\":1.5}", 400, "top_p", "decimal_above_max_value");
    expect_error("{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\"]}", 400, "stop",
                 "array_above_max_length");
    expect_error("{\"prompt\":\"a\",\"n\":0}", 400, "n", NULL);
    expect_error("{\"prompt\":\"a\",\"n\":129}", 400, "n", NULL);
    expect_error("{\"prompt\":\"a\",\"n\":2,\"best_of\":3}", 400, "best_of", NULL);
    expect_error("{\"prompt\":\"a\",\"n\":3,\"best_of\":2}", 400, "best_of", NULL);
}

Test(gateway, accepts_boundary_values_when_they_are_inclusive)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(
        decode(&c, "{\"prompt\":\"a\",\"temperature\":2,\"top_p\":1,\"max_tokens\":1}", &err),
        SL_OK, "%s", err.message);
    cr_assert_float_eq(c.params.temperature, 2.0f, 1e-6);
    cr_assert_eq(c.params.max_tokens, 1);
    sl_openai_completion_dispose(&c);
}

Test(gateway, decodes_a_prompt_given_as_token_ids_or_a_one_element_array)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":[1,0,511]}", &err), SL_OK, "%s", err.message);
    cr_assert_null(c.prompt);
    cr_assert_eq(c.n_prompt_ids, 3);
    cr_assert_eq(c.prompt_ids[0], 1);
    cr_assert_eq(c.prompt_ids[1], 0);
    cr_assert_eq(c.prompt_ids[2], 511);
    cr_assert_eq(sl_openai_check_vocab(&c, 512, &err), SL_OK);
    cr_assert_eq(sl_openai_check_vocab(&c, 511, &err), SL_EINVAL);
    cr_assert_str_eq(err.param, "prompt");
    sl_openai_completion_dispose(&c);

    cr_assert_eq(decode(&c, "{\"prompt\":[[7,8]]}", &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.n_prompt_ids, 2);
    cr_assert_eq(c.prompt_ids[1], 8);
    sl_openai_completion_dispose(&c);

    cr_assert_eq(decode(&c, "{\"prompt\":[\"hello\"]}", &err), SL_OK, "%s", err.message);
    cr_assert_str_eq(c.prompt, "hello");
    cr_assert_null(c.prompt_ids);
    sl_openai_completion_dispose(&c);
}

/* An array of prompts: each a string or ids, kept in order, the first selected; selecting
 * another gives its fields. */
Test(gateway, takes_several_prompts_in_order_when_prompt_is_an_array_of_them)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":[\"ab\",[4,5,6],\"c\"],\"n\":2}", &err), SL_OK, "%s",
                 err.message);
    cr_assert_eq(c.n_prompts, 3);
    cr_assert_eq(c.n, 2);
    cr_assert_eq(c.prompt_len, 2);
    cr_assert_eq(memcmp(c.prompt, "ab", 2), 0);
    cr_assert_null(c.prompt_ids);
    sl_openai_prompt_select(&c, 1);
    cr_assert_null(c.prompt);
    cr_assert_eq(c.n_prompt_ids, 3);
    cr_assert_eq(c.prompt_ids[2], 6);
    sl_openai_prompt_select(&c, 2);
    cr_assert_eq(c.prompt_len, 1);
    cr_assert_eq(c.prompt[0], 'c');
    sl_openai_completion_dispose(&c);
    /* prompts × n choices at most SL_OPENAI_N_MAX. */
    expect_error("{\"prompt\":[\"a\",\"b\"],\"n\":65}", 400, "n", "invalid_value");
    cr_assert_eq(decode(&c, "{\"prompt\":[\"a\",\"b\"],\"n\":64}", &err), SL_OK, "%s", err.message);
    sl_openai_completion_dispose(&c);
}

Test(gateway, rejects_bad_prompts_or_ids_naming_the_element)
{
    expect_error("{\"prompt\":[]}", 400, "prompt", "invalid_value");
    expect_error("{\"prompt\":[[]]}", 400, "prompt[0]", "invalid_value");
    expect_error("{\"prompt\":[1,\"x\"]}", 400, "prompt[1]", "invalid_type");
    expect_error("{\"prompt\":[1,-2]}", 400, "prompt[1]", "invalid_value");
    expect_error("{\"prompt\":[[1,2.5]]}", 400, "prompt[0][1]", "invalid_type");
    expect_error("{\"prompt\":[{}]}", 400, "prompt[0]", "invalid_type");
    expect_error("{\"prompt\":7}", 400, "prompt", "invalid_type");
}

Test(gateway, uses_prompt_ids_as_given_and_checks_their_context)
{
    struct sl_model *m = tiny_model();
    int seq = sl_model_config(m)->seq_len;
    int32_t *ids = sl_xmalloc(sizeof(int32_t) * (size_t)seq);
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":[5,6,7]}", &err), SL_OK);
    int n = 0;
    cr_assert_eq(sl_openai_prompt_ids(&c, sl_model_tok(m), seq, 16, ids, &n, &err), SL_OK);
    cr_assert_eq(n, 3, "no BOS added");
    cr_assert_eq(ids[0], 5);
    cr_assert_eq(ids[2], 7);
    cr_assert_eq(sl_openai_prompt_ids(&c, sl_model_tok(m), seq, seq - 2, ids, &n, &err), SL_ERANGE);
    cr_assert_str_eq(err.code, "context_length_exceeded");
    sl_openai_completion_dispose(&c);
    /* Text goes through the tokenizer, with BOS. */
    cr_assert_eq(decode(&c, "{\"prompt\":\"hello\"}", &err), SL_OK);
    cr_assert_eq(sl_openai_prompt_ids(&c, sl_model_tok(m), seq, 16, ids, &n, &err), SL_OK);
    cr_assert_eq(ids[0], sl_tok_bos(sl_model_tok(m)));
    sl_openai_completion_dispose(&c);
    free(ids);
    sl_model_free(m);
}

Test(gateway, requires_prompt_when_it_is_missing)
{
    expect_error("{\"max_tokens\":3}", 400, "prompt", "missing_required_parameter");
}

Test(gateway, answers_404_model_not_found_when_model_differs)
{
    expect_error("{\"model\":\"gpt-4\",\"prompt\":\"a\"}", 404, "model", "model_not_found");
}

Test(gateway, reports_line_and_column_when_json_is_malformed)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    const char *body = "{\n  \"prompt\": \"a\",\n  \"max_tokens\": 5,,\n}";
    cr_assert_lt(decode(&c, body, &err), 0);
    cr_assert_eq(err.http, 400);
    cr_assert_str_eq(err.param, "");
    cr_assert(strstr(err.message, "line 3"), "%s", err.message);
    cr_assert(strstr(err.message, "column"), "%s", err.message);
    cr_assert_null(c.root);
}

Test(gateway, rejects_the_body_when_it_is_empty_or_not_an_object)
{
    expect_error("", 400, NULL, NULL);
    expect_error("[1]", 400, NULL, NULL);
    expect_error("{\"prompt\":\"a\"} trailing", 400, NULL, NULL);
}

Test(gateway, accepts_the_request_when_it_exactly_fills_the_context)
{
    struct sl_openai_error err;
    cr_assert_eq(sl_openai_check_context(512, 500, false, 12, "prompt", &err), SL_OK);
}

Test(gateway, explains_the_sizes_when_the_context_length_is_exceeded)
{
    struct sl_openai_error err;
    cr_assert_eq(sl_openai_check_context(512, 500, false, 13, "prompt", &err), SL_ERANGE);
    cr_assert_eq(err.http, 400);
    cr_assert_str_eq(err.code, "context_length_exceeded");
    cr_assert_str_eq(err.param, "max_tokens", "the prompt fits: max_tokens is what to reduce");
    cr_assert(strstr(err.message, "This model's maximum context length is 512 tokens. However, "
                                  "you requested 513 tokens (500 in the prompt, 13 for the "
                                  "completion)."),
              "%s", err.message);
}

Test(gateway, says_at_least_when_the_prompt_alone_overflows)
{
    struct sl_openai_error err;
    cr_assert_eq(sl_openai_check_context(512, 513, true, 16, "messages", &err), SL_ERANGE);
    cr_assert_str_eq(err.param, "messages");
    cr_assert(strstr(err.message, "at least 529 tokens (at least 513 in the prompt, 16 for"), "%s",
              err.message);
    cr_assert_eq(sl_openai_check_context(512, 512, false, 1, "prompt", &err), SL_ERANGE);
    cr_assert_str_eq(err.param, "prompt", "a prompt that fills the context is what to reduce");
}

/* The tokenizer path, against the embedded synthetic model. */

Test(gateway, tokenizes_with_bos_when_the_prompt_fits)
{
    struct sl_model *m = tiny_model();
    int seq = sl_model_config(m)->seq_len;
    int32_t *ids = sl_xmalloc(sizeof(int32_t) * (size_t)seq);
    int n = 0;
    struct sl_openai_error err;
    cr_assert_eq(sl_openai_prompt_encode(sl_model_tok(m), seq, "hello", 5, 16, ids, &n, &err),
                 SL_OK, "%s", err.message);
    cr_assert_geq(n, 2);
    cr_assert_eq(ids[0], sl_tok_bos(sl_model_tok(m)));
    free(ids);
    sl_model_free(m);
}

Test(gateway, rejects_with_context_length_exceeded_when_the_prompt_is_too_long)
{
    struct sl_model *m = tiny_model();
    int seq = sl_model_config(m)->seq_len;
    int32_t *ids = sl_xmalloc(sizeof(int32_t) * (size_t)seq);
    /* Distinct characters so no merge can make them fit. */
    size_t len = (size_t)seq * 4;
    char *text = sl_xmalloc(len);
    for (size_t i = 0; i < len; i++)
        text[i] = (char)('a' + (i * 7) % 26);
    int n = 0;
    struct sl_openai_error err;
    cr_assert_eq(sl_openai_prompt_encode(sl_model_tok(m), seq, text, len, 16, ids, &n, &err),
                 SL_ERANGE);
    cr_assert_eq(err.http, 400);
    cr_assert_str_eq(err.code, "context_length_exceeded");
    /* A short prompt with a completion that does not fit is refused the same way. */
    cr_assert_eq(sl_openai_prompt_encode(sl_model_tok(m), seq, "hi", 2, seq, ids, &n, &err),
                 SL_ERANGE);
    cr_assert_str_eq(err.code, "context_length_exceeded");
    free(text);
    free(ids);
    sl_model_free(m);
}

Test(gateway, rejects_the_prompt_when_it_is_not_utf8)
{
    struct sl_model *m = tiny_model();
    int seq = sl_model_config(m)->seq_len;
    int32_t *ids = sl_xmalloc(sizeof(int32_t) * (size_t)seq);
    int n = 0;
    struct sl_openai_error err;
    cr_assert_eq(sl_openai_prompt_encode(sl_model_tok(m), seq, "a\xff", 2, 4, ids, &n, &err),
                 SL_EINVAL);
    cr_assert_eq(err.http, 400);
    cr_assert_str_eq(err.param, "prompt");
    free(ids);
    sl_model_free(m);
}

/* ---- encoders ---- */

static const struct sl_openai_ident ident = {
    .id = "cmpl-0123", .created = 1700000000, .model = MODEL};

/* Quotes, backslashes, newlines, every control byte, multi-byte UTF-8 and a 4-byte emoji. */
static const char tricky[] = "say \"hi\"\\ \n\r\t\x01\x1f\x7f caf\xc3\xa9 \xe2\x82\xac "
                             "\xf0\x9f\x98\x80 </script>";

Test(gateway, encodes_a_completion_object_when_the_request_finished)
{
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_completion_encode(&s, &ident, tricky, sizeof tricky - 1, SL_FINISH_LENGTH, 5, 7,
                                NULL);
    json_t *j = parse(&s);
    cr_assert_str_eq(str_at(j, "id", NULL), "cmpl-0123");
    cr_assert_str_eq(str_at(j, "object", NULL), "text_completion");
    cr_assert_eq(json_integer_value(json_object_get(j, "created")), 1700000000);
    cr_assert_str_eq(str_at(j, "model", NULL), MODEL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert_eq(json_array_size(json_object_get(j, "choices")), 1);
    json_t *text = json_object_get(ch, "text");
    cr_assert_eq(json_string_length(text), sizeof tricky - 1);
    cr_assert_eq(memcmp(json_string_value(text), tricky, sizeof tricky - 1), 0);
    cr_assert_eq(json_integer_value(json_object_get(ch, "index")), 0);
    cr_assert(json_is_null(json_object_get(ch, "logprobs")));
    cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "length");
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 5);
    cr_assert_eq(json_integer_value(json_object_get(u, "completion_tokens")), 7);
    cr_assert_eq(json_integer_value(json_object_get(u, "total_tokens")), 12);
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, encodes_a_chunk_with_null_finish_when_the_stream_goes_on)
{
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_chunk_encode(&s, &ident, tricky, sizeof tricky - 1, SL_FINISH_NONE, NULL);
    cr_assert_null(memchr(s.p, '\n', s.len), "a raw newline would end the SSE event");
    json_t *j = parse(&s);
    cr_assert_str_eq(str_at(j, "id", NULL), "cmpl-0123");
    cr_assert_str_eq(str_at(j, "object", NULL), "text_completion");
    cr_assert_str_eq(str_at(j, "model", NULL), MODEL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert_eq(memcmp(json_string_value(json_object_get(ch, "text")), tricky, sizeof tricky - 1),
                 0);
    cr_assert(json_is_null(json_object_get(ch, "finish_reason")));
    cr_assert_null(json_object_get(j, "usage"));
    json_decref(j);
    sl_str_dispose(&s);
}

/* The stream's fast path writes pre, the escaped text, post: the same bytes as the encoder. */
Test(gateway, chunk_affixes_around_the_escaped_text_make_the_encoders_chunk)
{
    const char *texts[] = {"x", "hello world", tricky, "\"\\\n\x01", "\xc3\xa9t\xc3\xa9"};
    struct sl_str want, got;
    sl_str_init(&want);
    sl_str_init(&got);
    for (int api = 0; api < 2; api++)
        for (int usage = 0; usage < 2; usage++)
            for (int index = 0; index < 3; index++)
                for (size_t t = 0; t < sizeof texts / sizeof *texts; t++) {
                    struct sl_openai_ident id = ident;
                    id.api = api ? SL_OPENAI_API_CHAT : SL_OPENAI_API_COMPLETIONS;
                    id.include_usage = usage;
                    id.index = index;
                    size_t len = strlen(texts[t]);
                    sl_str_clear(&want);
                    sl_openai_chunk_encode(&want, &id, texts[t], len, SL_FINISH_NONE, NULL);
                    sl_str_clear(&got);
                    size_t n_pre = sl_openai_chunk_affixes(&id, &got);
                    char *post = strndup(got.p + n_pre, got.len - n_pre);
                    got.len = n_pre;
                    sl_str_reserve(&got, SL_JSON_ESCAPED_MAX(len) + strlen(post));
                    got.len = (size_t)(sl_json_escape(got.p + got.len, texts[t], len) - got.p);
                    sl_str_append(&got, post, strlen(post));
                    free(post);
                    cr_assert_eq(got.len, want.len, "api %d, usage %d, index %d: %s vs %s", api,
                                 usage, index, got.p, want.p);
                    cr_assert_eq(memcmp(got.p, want.p, want.len), 0, "%s vs %s", got.p, want.p);
                }
    sl_str_dispose(&want);
    sl_str_dispose(&got);
}

Test(gateway, encodes_null_usage_in_every_chunk_when_include_usage_is_set)
{
    struct sl_openai_ident id = ident;
    id.include_usage = true;
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_chunk_encode(&s, &id, "x", 1, SL_FINISH_NONE, NULL);
    json_t *j = parse(&s);
    json_t *u = json_object_get(j, "usage");
    cr_assert(u && json_is_null(u), "usage: null, as OpenAI sends it: %s", s.p);
    json_decref(j);
    sl_str_clear(&s);
    sl_openai_chunk_encode(&s, &id, "", 0, SL_FINISH_LENGTH, NULL);
    j = parse(&s);
    u = json_object_get(j, "usage");
    cr_assert(u && json_is_null(u), "the finishing chunk too: %s", s.p);
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, encodes_an_empty_final_chunk_when_the_stream_stops)
{
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_chunk_encode(&s, &ident, "", 0, SL_FINISH_STOP, NULL);
    json_t *j = parse(&s);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "text")), "");
    cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, encodes_usage_with_no_choices_when_include_usage_is_set)
{
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_usage_chunk_encode(&s, &ident, 3, 4);
    json_t *j = parse(&s);
    cr_assert_eq(json_array_size(json_object_get(j, "choices")), 0);
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "total_tokens")), 7);
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, encodes_the_openai_error_object_when_a_request_fails)
{
    struct sl_openai_error e;
    sl_openai_error_set(&e, 400, "max_tokens", "invalid_type", "bad \"%s\"\n", "x\x01");
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_error_encode(&s, &e);
    json_t *j = parse(&s);
    cr_assert_str_eq(str_at(j, "error", "message"), "bad \"x\x01\"\n");
    cr_assert_str_eq(str_at(j, "error", "type"), "invalid_request_error");
    cr_assert_str_eq(str_at(j, "error", "param"), "max_tokens");
    cr_assert_str_eq(str_at(j, "error", "code"), "invalid_type");
    json_decref(j);

    sl_str_clear(&s);
    sl_openai_error_set(&e, 500, NULL, NULL, "engine \xff broke");
    sl_openai_error_encode(&s, &e);
    j = parse(&s);
    cr_assert_str_eq(str_at(j, "error", "type"), "server_error");
    cr_assert(json_is_null(json_object_get(json_object_get(j, "error"), "param")));
    cr_assert(json_is_null(json_object_get(json_object_get(j, "error"), "code")));
    cr_assert_str_eq(str_at(j, "error", "message"), "engine \xef\xbf\xbd broke");
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, lists_the_one_model_when_models_are_listed)
{
    struct sl_str s;
    sl_str_init(&s);
    const char *ids[1] = {MODEL};
    const int lens[1] = {2048};
    sl_openai_models_encode(&s, ids, lens, 1, 1234);
    json_t *j = parse(&s);
    cr_assert_str_eq(str_at(j, "object", NULL), "list");
    json_t *data = json_object_get(j, "data");
    cr_assert_eq(json_array_size(data), 1);
    json_t *m = json_array_get(data, 0);
    cr_assert_str_eq(json_string_value(json_object_get(m, "id")), MODEL);
    cr_assert_str_eq(json_string_value(json_object_get(m, "object")), "model");
    cr_assert_eq(json_integer_value(json_object_get(m, "created")), 1234);
    cr_assert_str_eq(json_string_value(json_object_get(m, "owned_by")), "sluice");
    cr_assert_eq(json_integer_value(json_object_get(m, "max_model_len")), 2048);
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, decodes_vllm_sampling_extensions_when_top_k_and_min_p_are_given)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":\"x\",\"top_k\":40,\"min_p\":0.05}", &err), SL_OK, "%s",
                 err.message);
    cr_assert_eq(c.params.top_k, 40);
    cr_assert_float_eq(c.params.min_p, 0.05f, 1e-6);
    sl_openai_completion_dispose(&c);
    cr_assert_eq(decode(&c, "{\"prompt\":\"x\",\"top_k\":-1}", &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.params.top_k, 0, "-1 means off, as in vLLM");
    cr_assert_float_eq(c.params.min_p, 0.0f, 1e-9);
    sl_openai_completion_dispose(&c);
    expect_error("{\"prompt\":\"x\",\"top_k\":-2}", 400, "top_k", NULL);
    expect_error("{\"prompt\":\"x\",\"top_k\":2.5}", 400, "top_k", NULL);
    expect_error("{\"prompt\":\"x\",\"min_p\":1.5}", 400, "min_p", NULL);
}

Test(gateway, decodes_penalties_and_logit_bias_when_they_are_given)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    const char *body = "{\"prompt\":\"x\",\"presence_penalty\":-2,\"frequency_penalty\":1.5,"
                       "\"repetition_penalty\":1.3,\"logit_bias\":{\"0\":-100,\"511\":2.5,"
                       "\"42\":100}}";
    cr_assert_eq(decode(&c, body, &err), SL_OK, "%s", err.message);
    cr_assert_float_eq(c.params.presence_penalty, -2.0f, 1e-6);
    cr_assert_float_eq(c.params.frequency_penalty, 1.5f, 1e-6);
    cr_assert_float_eq(c.params.repetition_penalty, 1.3f, 1e-6);
    cr_assert_eq(c.params.n_bias, 3);
    float got[512] = {0};
    for (int i = 0; i < c.params.n_bias; i++)
        got[c.params.bias_ids[i]] = c.params.bias[i];
    cr_assert_float_eq(got[0], -100.0f, 1e-6);
    cr_assert_float_eq(got[511], 2.5f, 1e-6);
    cr_assert_float_eq(got[42], 100.0f, 1e-6);
    /* The vocabulary check, once the model is known: 511 fits 512 ids, not 511. */
    cr_assert_eq(sl_openai_check_vocab(&c, 512, &err), SL_OK);
    cr_assert_eq(sl_openai_check_vocab(&c, 511, &err), SL_EINVAL);
    cr_assert_str_eq(err.param, "logit_bias");
    cr_assert(strstr(err.message, "511"), "names the id: %s", err.message);
    sl_openai_completion_dispose(&c);

    /* Defaults, and an empty bias, change nothing. */
    cr_assert_eq(decode(&c, "{\"prompt\":\"x\",\"logit_bias\":{},\"presence_penalty\":0}", &err),
                 SL_OK);
    cr_assert_eq(c.params.n_bias, 0);
    cr_assert_float_eq(c.params.repetition_penalty, 0.0f, 1e-6);
    sl_openai_completion_dispose(&c);
}

Test(gateway, rejects_penalties_and_logit_bias_when_they_are_invalid)
{
    expect_error("{\"prompt\":\"x\",\"presence_penalty\":2.5}", 400, "presence_penalty",
                 "decimal_above_max_value");
    expect_error("{\"prompt\":\"x\",\"frequency_penalty\":-3}", 400, "frequency_penalty",
                 "decimal_below_min_value");
    expect_error("{\"prompt\":\"x\",\"frequency_penalty\":\"1\"}", 400, "frequency_penalty",
                 "invalid_type");
    expect_error("{\"prompt\":\"x\",\"repetition_penalty\":0}", 400, "repetition_penalty",
                 "decimal_below_min_value");
    expect_error("{\"prompt\":\"x\",\"logit_bias\":[1]}", 400, "logit_bias", "invalid_type");
    expect_error("{\"prompt\":\"x\",\"logit_bias\":{\"7\":\"1\"}}", 400, "logit_bias.7",
                 "invalid_type");
    expect_error("{\"prompt\":\"x\",\"logit_bias\":{\"7\":100.5}}", 400, "logit_bias.7",
                 "decimal_above_max_value");
    expect_error("{\"prompt\":\"x\",\"logit_bias\":{\"7\":-101}}", 400, "logit_bias.7",
                 "decimal_below_min_value");
    expect_error("{\"prompt\":\"x\",\"logit_bias\":{\"-1\":1}}", 400, "logit_bias",
                 "invalid_value");
    expect_error("{\"prompt\":\"x\",\"logit_bias\":{\"a\":1}}", 400, "logit_bias", "invalid_value");
    expect_error("{\"prompt\":\"x\",\"logit_bias\":{\"\":1}}", 400, "logit_bias", "invalid_value");
    expect_error("{\"prompt\":\"x\",\"logit_bias\":{\"99999999999\":1}}", 400, "logit_bias",
                 "invalid_value");
    /* More entries than a request may carry. */
    struct sl_str body;
    sl_str_init(&body);
    sl_str_append(&body, "{\"prompt\":\"x\",\"logit_bias\":{", 28);
    for (int i = 0; i <= SL_REQ_MAX_LOGIT_BIAS; i++) {
        char e[24];
        int n = snprintf(e, sizeof e, "%s\"%d\":1", i ? "," : "", i);
        sl_str_append(&body, e, (size_t)n);
    }
    sl_str_append(&body, "}}", 2);
    expect_error(body.p, 400, "logit_bias", "object_above_max_size");
    sl_str_dispose(&body);
}

/* Fields whose silent omission would change the answer are refused by name; their defaults, which
 * clients that fill in every field send, are accepted. */
Test(gateway, refuses_completion_fields_it_does_not_implement_when_they_ask_for_something)
{
    expect_error("{\"prompt\":\"x\",\"echo\":true,\"logprobs\":0}", 400, "echo",
                 "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"echo\":1}", 400, "echo", "invalid_type");
    expect_error("{\"prompt\":\"x\",\"best_of\":3}", 400, "best_of", "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"suffix\":\"end\"}", 400, "suffix", "unsupported_value");
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c,
                        "{\"prompt\":\"x\",\"logprobs\":null,\"echo\":false,\"best_of\":1,"
                        "\"suffix\":\"\",\"frequency_penalty\":0,\"presence_penalty\":0}",
                        &err),
                 SL_OK, "%s", err.message);
    cr_assert_not(c.params.logprobs);
    cr_assert_not(c.echo);
    sl_openai_completion_dispose(&c);
    cr_assert_eq(decode(&c, "{\"prompt\":\"x\",\"echo\":true}", &err), SL_OK, "%s", err.message);
    cr_assert(c.echo);
    sl_openai_completion_dispose(&c);
}

Test(gateway, decodes_vllm_stop_controls_when_they_are_given)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c,
                        "{\"prompt\":\"x\",\"max_tokens\":40,\"ignore_eos\":true,\"min_tokens\":40,"
                        "\"stop_token_ids\":[2,0,511],\"include_stop_str_in_output\":true}",
                        &err),
                 SL_OK, "%s", err.message);
    cr_assert(c.params.ignore_eos);
    cr_assert(c.params.include_stop_str);
    cr_assert_eq(c.params.min_tokens, 40);
    cr_assert_eq(c.params.n_stop_ids, 3);
    cr_assert_eq(c.params.stop_ids[0], 2);
    cr_assert_eq(c.params.stop_ids[1], 0);
    cr_assert_eq(c.params.stop_ids[2], 511);
    /* The vocabulary check, once the model is known. */
    cr_assert_eq(sl_openai_check_vocab(&c, 512, &err), SL_OK);
    cr_assert_eq(sl_openai_check_vocab(&c, 511, &err), SL_EINVAL);
    cr_assert_str_eq(err.param, "stop_token_ids");
    cr_assert(strstr(err.message, "511"), "names the id: %s", err.message);
    sl_openai_completion_dispose(&c);

    /* Absent, null or empty: nothing changes. */
    cr_assert_eq(decode(&c,
                        "{\"prompt\":\"x\",\"ignore_eos\":null,\"min_tokens\":0,"
                        "\"stop_token_ids\":[],\"include_stop_str_in_output\":false}",
                        &err),
                 SL_OK, "%s", err.message);
    cr_assert_not(c.params.ignore_eos);
    cr_assert_eq(c.params.min_tokens, 0);
    cr_assert_eq(c.params.n_stop_ids, 0);
    sl_openai_completion_dispose(&c);

    expect_error("{\"prompt\":\"x\",\"ignore_eos\":1}", 400, "ignore_eos", "invalid_type");
    expect_error("{\"prompt\":\"x\",\"include_stop_str_in_output\":\"yes\"}", 400,
                 "include_stop_str_in_output", "invalid_type");
    expect_error("{\"prompt\":\"x\",\"min_tokens\":-1}", 400, "min_tokens",
                 "integer_below_min_value");
    /* At most max_tokens (the default 16 here when none is given). */
    expect_error("{\"prompt\":\"x\",\"min_tokens\":17}", 400, "min_tokens",
                 "integer_above_max_value");
    expect_error("{\"prompt\":\"x\",\"max_tokens\":4,\"min_tokens\":5}", 400, "min_tokens",
                 "integer_above_max_value");
    expect_error("{\"prompt\":\"x\",\"min_tokens\":1.5}", 400, "min_tokens", "invalid_type");
    expect_error("{\"prompt\":\"x\",\"stop_token_ids\":2}", 400, "stop_token_ids", "invalid_type");
    expect_error("{\"prompt\":\"x\",\"stop_token_ids\":[2,\"3\"]}", 400, "stop_token_ids[1]",
                 "invalid_type");
    expect_error("{\"prompt\":\"x\",\"stop_token_ids\":[-1]}", 400, "stop_token_ids[0]",
                 "invalid_value");
    expect_error("{\"prompt\":\"x\",\"stop_token_ids\":[4294967296]}", 400, "stop_token_ids[0]",
                 "invalid_value");
    char body[4096] = "{\"prompt\":\"x\",\"stop_token_ids\":[";
    for (int i = 0; i <= SL_REQ_MAX_STOP_IDS; i++)
        snprintf(body + strlen(body), sizeof body - strlen(body), "%s%d", i ? "," : "", i);
    strcat(body, "]}");
    expect_error(body, 400, "stop_token_ids", "array_above_max_length");
}

Test(gateway, refuses_vllm_extensions_it_does_not_implement_when_they_ask_for_something)
{
    expect_error("{\"prompt\":\"x\",\"guided_json\":{\"type\":\"object\"}}", 400, "guided_json",
                 "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"guided_choice\":[\"a\",\"b\"]}", 400, "guided_choice",
                 "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"guided_regex\":\"a+\"}", 400, "guided_regex",
                 "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"guided_grammar\":\"root ::= x\"}", 400, "guided_grammar",
                 "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"structured_outputs\":{\"json\":{}}}", 400,
                 "structured_outputs", "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"use_beam_search\":true}", 400, "use_beam_search",
                 "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"prompt_logprobs\":0}", 400, "prompt_logprobs",
                 "unsupported_value");
    expect_error("{\"prompt\":\"x\",\"skip_special_tokens\":0}", 400, "skip_special_tokens",
                 "invalid_type");
    /* Their defaults, as clients that fill in every field send them. */
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c,
                        "{\"prompt\":\"x\",\"guided_json\":null,\"guided_choice\":[],"
                        "\"use_beam_search\":false,\"prompt_logprobs\":null,"
                        "\"skip_special_tokens\":true}",
                        &err),
                 SL_OK, "%s", err.message);
    cr_assert(!c.params.keep_special);
    sl_openai_completion_dispose(&c);
    /* skip_special_tokens: false keeps control tokens' text. */
    cr_assert_eq(decode(&c, "{\"prompt\":\"x\",\"skip_special_tokens\":false}", &err), SL_OK, "%s",
                 err.message);
    cr_assert(c.params.keep_special);
    sl_openai_completion_dispose(&c);
}

Test(gateway, decodes_logprobs_as_the_number_of_alternatives_when_completions_ask)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":\"x\",\"logprobs\":0}", &err), SL_OK, "%s", err.message);
    cr_assert(c.params.logprobs);
    cr_assert_eq(c.params.top_logprobs, 0);
    sl_openai_completion_dispose(&c);
    cr_assert_eq(decode(&c, "{\"prompt\":\"x\",\"logprobs\":20}", &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.params.top_logprobs, 20);
    sl_openai_completion_dispose(&c);
    expect_error("{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs", "integer_above_max_value");
    expect_error("{\"prompt\":\"x\",\"logprobs\":-1}", 400, "logprobs", "integer_below_min_value");
    expect_error("{\"prompt\":\"x\",\"logprobs\":true}", 400, "logprobs", "invalid_type");
}

/* ---- log probabilities ---- */

/* Entries for the tokens of "hello world" (after BOS) with made-up log probabilities: token i
 * has -(i + 1) / 4, and two alternatives, itself and id 0. */
static int hello_entries(const struct sl_tok *tok, struct sl_token_logprobs *e, int max)
{
    int32_t ids[32];
    int n = 0;
    cr_assert_eq(sl_tok_encode(tok, "hello world", 11, false, ids, 32, &n), SL_OK);
    cr_assert(n >= 2 && n <= max);
    for (int i = 0; i < n; i++) {
        e[i] = (struct sl_token_logprobs){.token = ids[i],
                                          .prev = i ? ids[i - 1] : sl_tok_bos(tok),
                                          .logprob = -(float)(i + 1) / 4.0f,
                                          .n_top = 2,
                                          .top_ids = {ids[i], 0},
                                          .top_logprobs = {-(float)(i + 1) / 4.0f, -9.5f}};
    }
    return n;
}

Test(gateway, encodes_completion_logprobs_with_tokens_offsets_and_alternatives)
{
    struct sl_model *m = tiny_model();
    const struct sl_tok *tok = sl_model_tok(m);
    struct sl_token_logprobs e[32];
    int n = hello_entries(tok, e, 32);
    struct sl_openai_logprobs lp = {.tok = tok, .e = e, .n = n, .text_offset = 3};
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_completion_encode(&s, &ident, "hello world", 11, SL_FINISH_LENGTH, 2, n, &lp);
    json_t *j = parse(&s);
    json_t *l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *tokens = json_object_get(l, "tokens"), *tlp = json_object_get(l, "token_logprobs");
    json_t *top = json_object_get(l, "top_logprobs"), *off = json_object_get(l, "text_offset");
    cr_assert_eq(json_array_size(tokens), (size_t)n);
    cr_assert_eq(json_array_size(tlp), (size_t)n);
    cr_assert_eq(json_array_size(top), (size_t)n);
    cr_assert_eq(json_array_size(off), (size_t)n);
    size_t at = 3;
    struct sl_str joined;
    sl_str_init(&joined);
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const char *piece = sl_tok_decode(tok, e[i].prev, e[i].token, &len);
        const char *t = json_string_value(json_array_get(tokens, (size_t)i));
        cr_assert_eq(strlen(t), len);
        cr_assert_eq(memcmp(t, piece, len), 0, "token %d: '%s'", i, t);
        sl_str_append(&joined, t, len);
        cr_assert_float_eq(json_number_value(json_array_get(tlp, (size_t)i)), -(i + 1) / 4.0, 1e-6);
        cr_assert_eq(json_integer_value(json_array_get(off, (size_t)i)), (json_int_t)at);
        at += len;
        json_t *alt = json_array_get(top, (size_t)i);
        cr_assert_float_eq(json_number_value(json_object_get(alt, t)), -(i + 1) / 4.0, 1e-6);
        cr_assert_leq(json_object_size(alt), 2);
    }
    cr_assert_str_eq(joined.p, "hello world", "the tokens spell the text");
    sl_str_dispose(&joined);
    json_decref(j);
    sl_str_dispose(&s);
    sl_model_free(m);
}

Test(gateway, encodes_chat_logprobs_with_bytes_and_top_logprobs)
{
    struct sl_model *m = tiny_model();
    const struct sl_tok *tok = sl_model_tok(m);
    struct sl_token_logprobs e[32];
    int n = hello_entries(tok, e, 32);
    struct sl_openai_logprobs lp = {.tok = tok, .e = e, .n = n};
    struct sl_openai_ident chat = ident;
    chat.api = SL_OPENAI_API_CHAT;
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_chunk_encode(&s, &chat, "hello world", 11, SL_FINISH_NONE, &lp);
    json_t *j = parse(&s);
    json_t *l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    cr_assert(json_is_null(json_object_get(l, "refusal")));
    json_t *content = json_object_get(l, "content");
    cr_assert_eq(json_array_size(content), (size_t)n);
    for (int i = 0; i < n; i++) {
        json_t *c = json_array_get(content, (size_t)i);
        size_t len = 0;
        const char *piece = sl_tok_decode(tok, e[i].prev, e[i].token, &len);
        cr_assert_str_eq(json_string_value(json_object_get(c, "token")), piece);
        cr_assert_float_eq(json_number_value(json_object_get(c, "logprob")), -(i + 1) / 4.0, 1e-6);
        json_t *bytes = json_object_get(c, "bytes");
        cr_assert_eq(json_array_size(bytes), len);
        for (size_t b = 0; b < len; b++)
            cr_assert_eq(json_integer_value(json_array_get(bytes, b)), (unsigned char)piece[b]);
        json_t *alts = json_object_get(c, "top_logprobs");
        cr_assert_eq(json_array_size(alts), 2);
        cr_assert_float_eq(json_number_value(json_object_get(json_array_get(alts, 1), "logprob")),
                           -9.5, 1e-6);
    }
    json_decref(j);
    sl_str_dispose(&s);
    sl_model_free(m);
}

/* A token that is not UTF-8 on its own (a byte of a multi-byte character) is spelled
 * "bytes:\xNN" (OpenAI's form) where a text is expected, and its bytes are exact. */
Test(gateway, spells_a_partial_character_token_as_bytes_when_encoding_logprobs)
{
    struct sl_model *m = tiny_model();
    const struct sl_tok *tok = sl_model_tok(m);
    /* A byte-fallback token of a lead byte (the synthetic vocabulary has all 256). */
    int32_t byte_id = -1, prev = sl_tok_bos(tok) + 1;
    unsigned char byte = 0;
    for (int32_t id = 0; id < sl_tok_vocab_size(tok) && byte_id < 0; id++) {
        size_t len = 0;
        const char *piece = sl_tok_decode(tok, prev, id, &len);
        if (len == 1 && (unsigned char)piece[0] >= 0xc2 && (unsigned char)piece[0] <= 0xf4) {
            byte_id = id;
            byte = (unsigned char)piece[0];
        }
    }
    cr_assert_geq(byte_id, 0, "the synthetic vocabulary has lost its byte tokens");
    char want[16];
    snprintf(want, sizeof want, "bytes:\\x%02x", byte);
    struct sl_token_logprobs e = {.token = byte_id, .prev = prev, .logprob = -1.0f};
    struct sl_openai_logprobs lp = {.tok = tok, .e = &e, .n = 1};
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_chunk_encode(&s, &ident, "", 0, SL_FINISH_NONE, &lp);
    json_t *j = parse(&s);
    json_t *l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(l, "tokens"), 0)), want);
    json_decref(j);
    sl_str_clear(&s);
    struct sl_openai_ident chat = ident;
    chat.api = SL_OPENAI_API_CHAT;
    sl_openai_chunk_encode(&s, &chat, "", 0, SL_FINISH_NONE, &lp);
    j = parse(&s);
    json_t *c = json_array_get(
        json_object_get(
            json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"),
            "content"),
        0);
    cr_assert_str_eq(json_string_value(json_object_get(c, "token")), want);
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(c, "bytes"), 0)), byte);
    json_decref(j);
    sl_str_dispose(&s);
    sl_model_free(m);
}

Test(gateway, admission_refusals_become_openai_errors_with_their_status_when_converted)
{
    struct sl_admit_error a = {.status = SL_EPERM, .code = "tier_not_allowed"};
    snprintf(a.param, sizeof a.param, "service_tier");
    snprintf(a.message, sizeof a.message, "Tenant 'bob' may not use tier 'gold'.");
    struct sl_openai_error e;
    sl_openai_error_from_admit(&e, &a);
    cr_assert_eq(e.http, 403);
    cr_assert_str_eq(sl_openai_error_type(e.http), "permission_error");
    cr_assert_str_eq(e.code, "tier_not_allowed");
    cr_assert_str_eq(e.param, "service_tier");
    cr_assert_str_eq(e.message, a.message);
    a = (struct sl_admit_error){.status = SL_EINVAL, .code = "invalid_tier"};
    sl_openai_error_from_admit(&e, &a);
    cr_assert_eq(e.http, 400);
    cr_assert_str_eq(e.param, "", "no param: JSON null");
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_error_encode(&s, &e);
    cr_assert(strstr(s.p, "\"param\":null") && strstr(s.p, "\"code\":\"invalid_tier\""), "%s", s.p);
    sl_str_dispose(&s);
}

/* ---- the prefix cache ---- */

Test(gateway, decodes_the_prefix_cache_salts_when_openai_or_vllm_sends_them)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"prompt\":\"x\"}", &err), SL_OK, "%s", err.message);
    cr_assert_null(c.prompt_cache_key.p, "none unless sent");
    cr_assert_null(c.cache_salt.p);
    sl_openai_completion_dispose(&c);
    cr_assert_eq(decode(&c,
                        "{\"prompt\":\"x\",\"prompt_cache_key\":\"user-42\",\"cache_salt\":"
                        "\"s\\u00e9l\"}",
                        &err),
                 SL_OK, "%s", err.message);
    cr_assert_eq(c.prompt_cache_key.len, 7);
    cr_assert_eq(memcmp(c.prompt_cache_key.p, "user-42", 7), 0);
    cr_assert_eq(c.cache_salt.len, 4, "bytes, not characters");
    sl_openai_completion_dispose(&c);
    cr_assert_eq(
        decode(&c, "{\"prompt\":\"x\",\"prompt_cache_key\":null,\"cache_salt\":null}", &err), SL_OK,
        "%s", err.message);
    cr_assert_null(c.prompt_cache_key.p, "null is absent");
    sl_openai_completion_dispose(&c);
    /* Chat takes them too. */
    const char *chat =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":\"t\"}";
    cr_assert_eq(sl_openai_chat_decode(&c, chat, strlen(chat), NULL, 0, &err), SL_OK, "%s",
                 err.message);
    cr_assert_eq(c.cache_salt.len, 1);
    sl_openai_completion_dispose(&c);
    /* At the bound: 256 bytes. */
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"x\",\"cache_salt\":\"%0256d\"}", 0);
    cr_assert_eq(decode(&c, body, &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.cache_salt.len, 256);
    sl_openai_completion_dispose(&c);
}

Test(gateway, refuses_a_prefix_cache_salt_naming_it_when_not_a_short_string)
{
    expect_error("{\"prompt\":\"x\",\"prompt_cache_key\":7}", 400, "prompt_cache_key",
                 "invalid_type");
    expect_error("{\"prompt\":\"x\",\"cache_salt\":{\"a\":1}}", 400, "cache_salt", "invalid_type");
    expect_error("{\"prompt\":\"x\",\"cache_salt\":[\"a\"]}", 400, "cache_salt", "invalid_type");
    expect_error("{\"prompt\":\"x\",\"cache_salt\":\"\"}", 400, "cache_salt", "empty_string");
    expect_error("{\"prompt\":\"x\",\"prompt_cache_key\":\"\"}", 400, "prompt_cache_key",
                 "empty_string");
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"x\",\"prompt_cache_key\":\"%0257d\"}", 0);
    expect_error(body, 400, "prompt_cache_key", "string_above_max_length");
    snprintf(body, sizeof body, "{\"prompt\":\"x\",\"cache_salt\":\"%0257d\"}", 0);
    expect_error(body, 400, "cache_salt", "string_above_max_length");
}

static uint64_t key(const char *model, enum sl_config_prefix_scope scope, const char *tenant,
                    const char *pck, const char *salt)
{
    struct sl_strv k = {pck, pck ? strlen(pck) : 0}, s = {salt, salt ? strlen(salt) : 0};
    return sl_api_cache_key(model, scope, tenant, k, s);
}

/* The key isolates what must not share: models, tenants (in tenant scope), salts, and which
 * field a salt came in; and it is the same for equal inputs, whatever the process. */
Test(gateway, prefix_cache_key_differs_exactly_when_what_isolates_differs)
{
    const enum sl_config_prefix_scope T = SL_CONFIG_PREFIX_TENANT, G = SL_CONFIG_PREFIX_GLOBAL;
    uint64_t base = key("m", T, "a", NULL, NULL);
    cr_assert_eq(base, key("m", T, "a", NULL, NULL), "deterministic");
    cr_assert_neq(base, 0);
    cr_assert_neq(base, key("m", T, "b", NULL, NULL), "another tenant");
    cr_assert_neq(base, key("n", T, "a", NULL, NULL), "another model");
    cr_assert_neq(base, key("m", G, "a", NULL, NULL), "global scope is no tenant's");
    cr_assert_eq(key("m", G, "a", NULL, NULL), key("m", G, "b", NULL, NULL),
                 "global scope: every tenant alike");
    cr_assert_neq(key("m", G, "", NULL, NULL), key("m", T, "", NULL, NULL),
                  "not even a tenant with an empty name is global");
    cr_assert_neq(base, key("m", T, "a", "k", NULL), "a prompt_cache_key narrows it");
    cr_assert_neq(base, key("m", T, "a", NULL, "k"), "so does a cache_salt");
    cr_assert_neq(key("m", T, "a", "k", NULL), key("m", T, "a", NULL, "k"),
                  "the same salt in the other field is another key");
    cr_assert_neq(key("m", T, "a", "k", "s"), key("m", T, "a", "s", "k"));
    cr_assert_neq(key("m", T, "a", "k", "s"), key("m", T, "a", "k", NULL), "both go in");
    cr_assert_eq(key("m", T, "a", "k", "s"), key("m", T, "a", "k", "s"));
    cr_assert_neq(key("ab", T, "c", NULL, NULL), key("a", T, "bc", NULL, NULL),
                  "fields are length-prefixed");
    cr_assert_neq(key("m", T, "a", "bc", NULL), key("m", T, "ab", "c", NULL));
    /* A salt of any size still hashes (the heap path past the stack buffer). */
    static char big[2000];
    memset(big, 'x', sizeof big - 1);
    cr_assert_neq(key("m", T, "a", big, NULL), key("m", T, "a", big + 1, NULL));
    cr_assert_eq(key("m", T, "a", big, NULL), key("m", T, "a", big, NULL));
}

Test(gateway, encodes_cached_tokens_in_the_usage_details_when_the_request_finished)
{
    struct sl_openai_ident id = ident;
    id.cached_tokens = 64;
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_completion_encode(&s, &id, "ok", 2, SL_FINISH_STOP, 80, 2, NULL);
    json_t *j = parse(&s);
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 80);
    cr_assert_eq(json_integer_value(
                     json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")),
                 64);
    json_decref(j);
    sl_str_clear(&s);
    id.cached_tokens = 0;
    id.api = SL_OPENAI_API_CHAT;
    sl_openai_usage_chunk_encode(&s, &id, 3, 4);
    j = parse(&s);
    u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(
                     json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")),
                 0, "OpenAI's field is there when nothing was cached");
    cr_assert(json_is_integer(
        json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens")));
    json_decref(j);
    sl_str_dispose(&s);
}
