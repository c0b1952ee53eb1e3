/* The chat API's JSON layer: decoding /v1/chat/completions bodies (every error path), chat
 * template detection and rendering for each builtin, tokenizing rendered prompts, and the chat
 * response, chunk and usage encoders (parsed back with jansson). */
#include "gateway_impl.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../models.h"

#define MODEL "synthetic:tiny"

static int decode(struct sl_openai_completion *c, const char *body, struct sl_openai_error *err)
{
    memset(err, 0, sizeof *err);
    return sl_openai_chat_decode(c, body, strlen(body), MODEL, 16, err);
}

/* Decodes a body that must fail, and checks the status, param and code it names. */
static void expect_error(const char *body, int http, const char *param, const char *code)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    int st = decode(&c, body, &err);
    cr_assert_lt(st, 0, "accepted %s", body);
    cr_assert_eq(err.http, http, "%s: http %d, message %s", body, err.http, err.message);
    cr_assert_str_eq(err.param, param ? param : "", "%s: param %s", body, err.param);
    if (code)
        cr_assert(err.code && strcmp(err.code, code) == 0, "%s: code %s, message %s", body,
                  err.code ? err.code : "(null)", err.message);
    cr_assert(err.message[0]);
    cr_assert_null(c.root);
    cr_assert_null(c.messages);
    cr_assert_eq(c.n_messages, 0);
}

#define USER_HI "{\"role\":\"user\",\"content\":\"hi\"}"

/* ---- decoding ---- */

Test(gateway, chat_decodes_defaults_when_only_messages_are_given)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"messages\":[" USER_HI "]}", &err), SL_OK, "%s", err.message);
    cr_assert_null(c.prompt);
    cr_assert_eq(c.n_messages, 1);
    cr_assert_eq(c.messages[0].role, SL_CHAT_ROLE_USER);
    cr_assert_eq(c.messages[0].len, 2);
    cr_assert_eq(memcmp(c.messages[0].content, "hi", 2), 0);
    cr_assert_not(c.messages[0].owned);
    cr_assert_eq(c.params.max_tokens, 16);
    cr_assert_float_eq(c.params.temperature, 1.0f, 1e-6);
    cr_assert_float_eq(c.params.top_p, 1.0f, 1e-6);
    cr_assert_not(c.has_seed);
    cr_assert_not(c.stream);
    cr_assert_not(c.include_usage);
    cr_assert_null(c.service_tier);
    cr_assert_null(c.user);
    sl_openai_completion_dispose(&c);
}

Test(gateway, chat_decodes_every_role_and_field_when_all_are_valid)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    const char *body =
        "{\"model\":\"" MODEL "\",\"messages\":["
        "{\"role\":\"system\",\"content\":\"S\"},"
        "{\"role\":\"developer\",\"content\":\"D\",\"name\":\"ops\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\\u00e9\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]},"
        "{\"role\":\"user\",\"content\":[]}],"
        "\"max_tokens\":9,\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
        "\"seed\":11,\"stop\":[\"x\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"service_tier\":\"flex\",\"user\":\"u-1\",\"n\":1,\"tools\":[],"
        "\"response_format\":{\"type\":\"text\"},\"logit_bias\":{}}";
    cr_assert_eq(decode(&c, body, &err), SL_OK, "%s", err.message);
    cr_assert_eq(c.n_messages, 5);
    cr_assert_eq(c.messages[0].role, SL_CHAT_ROLE_SYSTEM);
    cr_assert_eq(c.messages[1].role, SL_CHAT_ROLE_SYSTEM, "developer reads as system");
    cr_assert_eq(c.messages[2].role, SL_CHAT_ROLE_USER);
    cr_assert(c.messages[2].owned);
    cr_assert_eq(c.messages[2].len, 5, "text parts are joined with a newline");
    cr_assert_str_eq(c.messages[2].content, "a\nb\xc3\xa9");
    cr_assert_eq(c.messages[3].role, SL_CHAT_ROLE_ASSISTANT);
    cr_assert_eq(c.messages[3].len, 0, "null assistant content is empty");
    cr_assert_eq(c.messages[4].len, 0);
    cr_assert_str_eq(c.messages[4].content, "");
    cr_assert_eq(c.params.max_tokens, 7, "max_completion_tokens wins over max_tokens");
    cr_assert_float_eq(c.params.temperature, 0.5f, 1e-6);
    cr_assert_float_eq(c.params.top_p, 0.9f, 1e-6);
    cr_assert(c.has_seed);
    cr_assert_eq(c.params.seed, 11);
    cr_assert_eq(c.params.n_stop, 1);
    cr_assert_str_eq(c.params.stop[0], "x");
    cr_assert(c.stream);
    cr_assert(c.include_usage);
    cr_assert_str_eq(c.service_tier, "flex");
    cr_assert_str_eq(c.user, "u-1");
    sl_openai_completion_dispose(&c);
    cr_assert_null(c.messages);
}

Test(gateway, chat_takes_max_tokens_when_max_completion_tokens_is_absent)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c, "{\"messages\":[" USER_HI "],\"max_tokens\":3}", &err), SL_OK);
    cr_assert_eq(c.params.max_tokens, 3);
    sl_openai_completion_dispose(&c);
    cr_assert_eq(decode(&c, "{\"messages\":[" USER_HI "],\"max_completion_tokens\":4}", &err),
                 SL_OK);
    cr_assert_eq(c.params.max_tokens, 4);
    sl_openai_completion_dispose(&c);
}

/* With no configured default (0), a chat without either limit is left open for the server to
 * fill from the context; either field, or null ones, decide as usual. */
Test(gateway, chat_leaves_max_tokens_open_when_no_limit_or_default_is_given)
{
    struct {
        const char *extra;
        bool open;
        int max_tokens;
    } cases[] = {{"", true, 1},
                 {",\"max_tokens\":null,\"max_completion_tokens\":null", true, 1},
                 {",\"max_tokens\":6", false, 6},
                 {",\"max_completion_tokens\":2", false, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"messages\":[" USER_HI "]%s}", cases[i].extra);
        struct sl_openai_completion c;
        struct sl_openai_error err;
        cr_assert_eq(sl_openai_chat_decode(&c, body, strlen(body), MODEL, 0, &err), SL_OK, "%s",
                     err.message);
        cr_assert_eq(c.max_tokens_open, cases[i].open, "%s", body);
        cr_assert_eq(c.params.max_tokens, cases[i].max_tokens, "%s", body);
        sl_openai_completion_dispose(&c);
        /* A configured default closes it. */
        cr_assert_eq(sl_openai_chat_decode(&c, body, strlen(body), MODEL, 16, &err), SL_OK);
        cr_assert(!c.max_tokens_open, "%s", body);
        cr_assert_eq(c.params.max_tokens, cases[i].open ? 16 : cases[i].max_tokens, "%s", body);
        sl_openai_completion_dispose(&c);
    }
}

Test(gateway, chat_rejects_the_body_when_it_is_not_a_json_object)
{
    expect_error("", 400, NULL, "invalid_json");
    expect_error("{\"messages\":[", 400, NULL, "invalid_json");
    expect_error("[" USER_HI "]", 400, NULL, "invalid_json");
}

Test(gateway, chat_names_messages_when_they_are_missing_or_not_a_list)
{
    expect_error("{}", 400, "messages", "missing_required_parameter");
    expect_error("{\"messages\":null}", 400, "messages", "missing_required_parameter");
    expect_error("{\"prompt\":\"hi\"}", 400, "messages", "missing_required_parameter");
    expect_error("{\"messages\":\"hi\"}", 400, "messages", "invalid_type");
    expect_error("{\"messages\":{}}", 400, "messages", "invalid_type");
    expect_error("{\"messages\":[]}", 400, "messages", "empty_array");
}

Test(gateway, chat_names_the_message_when_a_message_is_bad)
{
    expect_error("{\"messages\":[\"hi\"]}", 400, "messages[0]", "invalid_type");
    expect_error("{\"messages\":[" USER_HI ",7]}", 400, "messages[1]", "invalid_type");
    expect_error("{\"messages\":[{\"content\":\"x\"}]}", 400, "messages[0].role",
                 "missing_required_parameter");
    expect_error("{\"messages\":[{\"role\":null,\"content\":\"x\"}]}", 400, "messages[0].role",
                 "missing_required_parameter");
    expect_error("{\"messages\":[{\"role\":3,\"content\":\"x\"}]}", 400, "messages[0].role",
                 "invalid_type");
    expect_error("{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400, "messages[0].role",
                 "invalid_value");
    expect_error("{\"messages\":[{\"role\":\"user\"}]}", 400, "messages[0].content",
                 "missing_required_parameter");
    expect_error("{\"messages\":[{\"role\":\"system\",\"content\":null}]}", 400,
                 "messages[0].content", "missing_required_parameter");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content",
                 "invalid_type");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":{\"text\":\"x\"}}]}", 400,
                 "messages[0].content", "invalid_type");
}

Test(gateway, chat_says_tools_are_unsupported_when_tool_messages_are_sent)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    expect_error("{\"messages\":[" USER_HI ",{\"role\":\"tool\",\"content\":\"42\","
                 "\"tool_call_id\":\"c1\"}]}",
                 400, "messages[1].role", "unsupported_value");
    decode(&c, "{\"messages\":[{\"role\":\"tool\",\"content\":\"42\"}]}", &err);
    cr_assert(strstr(err.message, "not supported"), "%s", err.message);
    expect_error("{\"messages\":[{\"role\":\"function\",\"content\":\"42\"}]}", 400,
                 "messages[0].role", "unsupported_value");
    expect_error("{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
                 "[{\"id\":\"c1\",\"type\":\"function\"}]}]}",
                 400, "messages[0].tool_calls", "unsupported_value");
    expect_error("{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\","
                 "\"function_call\":{\"name\":\"f\"}}]}",
                 400, "messages[0].function_call", "unsupported_value");
    expect_error("{\"messages\":[" USER_HI "],\"tools\":[{\"type\":\"function\"}]}", 400, "tools",
                 "unsupported_value");
    expect_error("{\"messages\":[" USER_HI "],\"tools\":{}}", 400, "tools", "unsupported_value");
    expect_error("{\"messages\":[" USER_HI "],\"functions\":[{\"name\":\"f\"}]}", 400, "functions",
                 "unsupported_value");
    /* tool_choice can only say that no tool is called. */
    expect_error("{\"messages\":[" USER_HI "],\"tool_choice\":\"required\"}", 400, "tool_choice",
                 "unsupported_value");
    expect_error("{\"messages\":[" USER_HI "],\"tool_choice\":{\"type\":\"function\","
                 "\"function\":{\"name\":\"f\"}}}",
                 400, "tool_choice", "unsupported_value");
    expect_error("{\"messages\":[" USER_HI "],\"web_search_options\":{}}", 400,
                 "web_search_options", "unsupported_value");
    cr_assert_eq(decode(&c,
                        "{\"messages\":[" USER_HI "],\"tool_choice\":\"none\",\"tools\":[],"
                        "\"parallel_tool_calls\":false}",
                        &err),
                 SL_OK, "%s", err.message);
    sl_openai_completion_dispose(&c);
    cr_assert_eq(decode(&c, "{\"messages\":[" USER_HI "],\"tool_choice\":\"auto\"}", &err), SL_OK,
                 "%s", err.message);
    sl_openai_completion_dispose(&c);
}

Test(gateway, chat_names_the_content_part_when_a_part_is_bad)
{
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[\"x\"]}]}", 400,
                 "messages[0].content[0]", "invalid_type");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}", 400,
                 "messages[0].content[0].type", "missing_required_parameter");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":1,\"text\":\"x\"}]}]}",
                 400, "messages[0].content[0].type", "invalid_type");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", 400,
                 "messages[0].content[0].text", "missing_required_parameter");
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                 "\"text\":[]}]}]}",
                 400, "messages[0].content[0].text", "invalid_type");
    /* The third message's second part: both indexes are named. */
    expect_error("{\"messages\":[" USER_HI "," USER_HI ",{\"role\":\"user\",\"content\":["
                 "{\"type\":\"text\",\"text\":\"a\"},"
                 "{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x/y.png\"}}]}]}",
                 400, "messages[2].content[1].type", "unsupported_value");
    struct sl_openai_completion c;
    struct sl_openai_error err;
    decode(&c, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}]}",
           &err);
    cr_assert(strstr(err.message, "'input_audio'"), "names the type: %s", err.message);
}

Test(gateway, chat_refuses_structured_output_when_response_format_is_not_text)
{
    expect_error("{\"messages\":[" USER_HI "],\"response_format\":\"json\"}", 400,
                 "response_format", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"response_format\":{}}", 400, "response_format.type",
                 "missing_required_parameter");
    expect_error("{\"messages\":[" USER_HI "],\"response_format\":{\"type\":2}}", 400,
                 "response_format.type", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"response_format\":{\"type\":\"json_object\"}}", 400,
                 "response_format.type", "unsupported_value");
}

Test(gateway, chat_rejects_shared_fields_when_they_are_invalid)
{
    expect_error("{\"model\":\"gpt-4o\",\"messages\":[" USER_HI "]}", 404, "model",
                 "model_not_found");
    expect_error("{\"messages\":[" USER_HI "],\"n\":0}", 400, "n", "integer_below_min_value");
    expect_error("{\"messages\":[" USER_HI "],\"n\":129}", 400, "n", "integer_above_max_value");
    expect_error("{\"messages\":[" USER_HI "],\"n\":\"2\"}", 400, "n", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"max_completion_tokens\":\"5\"}", 400,
                 "max_completion_tokens", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"max_completion_tokens\":0}", 400,
                 "max_completion_tokens", "integer_below_min_value");
    expect_error("{\"messages\":[" USER_HI "],\"max_tokens\":0,\"max_completion_tokens\":5}", 400,
                 "max_tokens", "integer_below_min_value");
    expect_error("{\"messages\":[" USER_HI "],\"temperature\":3}", 400, "temperature",
                 "decimal_above_max_value");
    expect_error("{\"messages\":[" USER_HI "],\"top_p\":0}", 400, "top_p",
                 "decimal_below_min_value");
    expect_error("{\"messages\":[" USER_HI "],\"seed\":\"x\"}", 400, "seed", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"stop\":[1]}", 400, "stop", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"stream\":1}", 400, "stream", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"stream_options\":{\"include_usage\":1}}", 400,
                 "stream_options.include_usage", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"service_tier\":1}", 400, "service_tier",
                 "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"user\":[]}", 400, "user", "invalid_type");
}

Test(gateway, chat_frees_joined_parts_when_a_later_message_fails)
{
    /* The first message owns a joined string when the second fails: ASan's leak check and the
     * cleared struct say it was freed. */
    expect_error(
        "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
        "\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"bot\",\"content\":\"\"}]}",
        400, "messages[1].role", "invalid_value");
}

/* ---- templates ---- */

static const char *const jinja[SL_CHAT_TEMPLATE_COUNT] = {
    [SL_CHAT_TEMPLATE_CHATML] =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
        "%}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    [SL_CHAT_TEMPLATE_LLAMA2] =
        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
        "system_message = messages[0]['content'] %}{% endif %}{% for message in loop_messages "
        "%}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
        "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% endif %}{% if "
        "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' "
        "}}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token "
        "}}{% endif %}{% endfor %}",
    [SL_CHAT_TEMPLATE_LLAMA3] =
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
        "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = "
        "bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt "
        "%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    [SL_CHAT_TEMPLATE_MISTRAL] =
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ "
        "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' "
        "%}{{ message['content'] + eos_token}}{% endif %}{% endfor %}",
    [SL_CHAT_TEMPLATE_ZEPHYR] =
        "{% for message in messages %}\\n{% if message['role'] == 'user' %}\\n{{ '<|user|>\\n' "
        "+ message['content'] + eos_token }}\\n{% elif message['role'] == 'assistant' %}\\n{{ "
        "'<|assistant|>\\n'  + message['content'] + eos_token }}\\n{% endif %}\\n{% if loop.last "
        "and add_generation_prompt %}\\n{{ '<|assistant|>' }}\\n{% endif %}\\n{% endfor %}",
    [SL_CHAT_TEMPLATE_GEMMA] =
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% "
        "set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ "
        "'<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% "
        "endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
    [SL_CHAT_TEMPLATE_PHI3] =
        "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + "
        "message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' "
        "+ message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'assistant' "
        "%}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor %}{% "
        "if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}",
};

Test(gateway, chat_template_is_recognised_when_the_model_ships_a_known_one)
{
    for (int t = 1; t < SL_CHAT_TEMPLATE_COUNT; t++)
        cr_assert_eq(sl_chat_template_detect(jinja[t]), t, "%s detected as %d",
                     sl_chat_template_name(t), sl_chat_template_detect(jinja[t]));
}

Test(gateway, chat_template_is_unrecognised_when_absent_or_unknown)
{
    cr_assert_eq(sl_chat_template_detect(NULL), -1);
    cr_assert_eq(sl_chat_template_detect(""), -1);
    cr_assert_eq(sl_chat_template_detect("{% for m in messages %}{{ m['role'] }}: "
                                         "{{ m['content'] }}\\n{% endfor %}"),
                 -1);
}

Test(gateway, chat_template_names_round_trip_when_looked_up)
{
    static const char *const want[] = {"plain",   "chatml", "llama2", "llama3",
                                       "mistral", "zephyr", "gemma",  "phi3"};
    cr_assert_eq(sizeof want / sizeof want[0], SL_CHAT_TEMPLATE_COUNT);
    for (int t = 0; t < SL_CHAT_TEMPLATE_COUNT; t++) {
        cr_assert_str_eq(sl_chat_template_name(t), want[t]);
        cr_assert_eq(sl_chat_template_from_name(want[t]), t);
    }
    cr_assert_eq(sl_chat_template_from_name("ChatML"), -1);
    cr_assert_eq(sl_chat_template_from_name(""), -1);
    cr_assert_eq(sl_chat_template_from_name("jinja"), -1);
}

/* A conversation that exercises every rule: a system prompt, untrimmed user text, an assistant
 * turn, a second user turn. */
static const struct sl_chat_msg convo[] = {
    {SL_CHAT_ROLE_SYSTEM, "Be brief.", 9, false},
    {SL_CHAT_ROLE_USER, " Hi ", 4, false},
    {SL_CHAT_ROLE_ASSISTANT, "Hello!", 6, false},
    {SL_CHAT_ROLE_USER, "Bye", 3, false},
};
#define N_CONVO ((int)(sizeof convo / sizeof convo[0]))

/* Renders msgs with t; checks the text, that the segments cover it in order, and that the
 * special segments are exactly `specials` ("|"-separated, in order). */
static void expect_render(enum sl_chat_template t, const struct sl_chat_msg *msgs, int n,
                          const char *text, const char *specials)
{
    struct sl_chat_prompt p;
    sl_chat_prompt_init(&p);
    sl_chat_render(&p, t, msgs, n);
    cr_assert_str_eq(p.text.p, text, "%s rendered:\n%s", sl_chat_template_name(t), p.text.p);
    char got[512] = "";
    size_t at = 0;
    for (int i = 0; i < p.n_segs; i++) {
        cr_assert_eq(p.segs[i].off, at, "%s: segment %d does not follow the last",
                     sl_chat_template_name(t), i);
        at += p.segs[i].len;
        if (i > 0)
            cr_assert(p.segs[i].special || p.segs[i - 1].special, "text runs are merged");
        if (p.segs[i].special)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%.*s", got[0] ? "|" : "",
                     (int)p.segs[i].len, p.text.p + p.segs[i].off);
    }
    cr_assert_eq(at, p.text.len, "segments cover the text");
    cr_assert_str_eq(got, specials, "%s specials", sl_chat_template_name(t));
    sl_chat_prompt_dispose(&p);
}

Test(gateway, chat_renders_plain_lines_when_the_template_is_the_default)
{
    expect_render(SL_CHAT_TEMPLATE_PLAIN, convo, N_CONVO,
                  "system: Be brief.\nuser:  Hi \nassistant: Hello!\nuser: Bye\nassistant:", "");
    expect_render(SL_CHAT_TEMPLATE_PLAIN, convo + 3, 1, "user: Bye\nassistant:", "");
}

Test(gateway, chat_renders_chatml_when_the_template_is_chatml)
{
    expect_render(SL_CHAT_TEMPLATE_CHATML, convo, N_CONVO,
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                  "<|im_start|>assistant\n",
                  "<|im_start|>|<|im_end|>|<|im_start|>|<|im_end|>|<|im_start|>|<|im_end|>|"
                  "<|im_start|>|<|im_end|>|<|im_start|>");
}

Test(gateway, chat_renders_llama2_when_the_template_is_llama2)
{
    expect_render(SL_CHAT_TEMPLATE_LLAMA2, convo, N_CONVO,
                  "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye "
                  "[/INST]",
                  "</s>|<s>");
    /* Without a system prompt, and a system prompt with no user turn after it. */
    expect_render(SL_CHAT_TEMPLATE_LLAMA2, convo + 1, 1, "[INST] Hi [/INST]", "");
    expect_render(SL_CHAT_TEMPLATE_LLAMA2, convo, 1,
                  "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n [/INST]", "");
}

Test(gateway, chat_renders_llama3_when_the_template_is_llama3)
{
    expect_render(SL_CHAT_TEMPLATE_LLAMA3, convo, N_CONVO,
                  "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n",
                  "<|start_header_id|>|<|end_header_id|>|<|eot_id|>|"
                  "<|start_header_id|>|<|end_header_id|>|<|eot_id|>|"
                  "<|start_header_id|>|<|end_header_id|>|<|eot_id|>|"
                  "<|start_header_id|>|<|end_header_id|>|<|eot_id|>|"
                  "<|start_header_id|>|<|end_header_id|>");
}

Test(gateway, chat_renders_mistral_when_the_template_is_mistral)
{
    expect_render(SL_CHAT_TEMPLATE_MISTRAL, convo, N_CONVO,
                  "[INST] Be brief.\n\n Hi  [/INST]Hello!</s>[INST] Bye [/INST]", "</s>");
}

Test(gateway, chat_renders_zephyr_when_the_template_is_zephyr)
{
    expect_render(SL_CHAT_TEMPLATE_ZEPHYR, convo, N_CONVO,
                  "<|system|>\nBe brief.</s>\n<|user|>\n Hi </s>\n<|assistant|>\nHello!</s>\n"
                  "<|user|>\nBye</s>\n<|assistant|>\n",
                  "<|system|>|</s>|<|user|>|</s>|<|assistant|>|</s>|<|user|>|</s>|<|assistant|>");
}

Test(gateway, chat_renders_gemma_when_the_template_is_gemma)
{
    expect_render(SL_CHAT_TEMPLATE_GEMMA, convo, N_CONVO,
                  "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                  "<start_of_turn>model\nHello!<end_of_turn>\n"
                  "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
                  "<start_of_turn>|<end_of_turn>|<start_of_turn>|<end_of_turn>|"
                  "<start_of_turn>|<end_of_turn>|<start_of_turn>");
}

Test(gateway, chat_renders_phi3_when_the_template_is_phi3)
{
    expect_render(SL_CHAT_TEMPLATE_PHI3, convo, N_CONVO,
                  "<|system|>\nBe brief.<|end|>\n<|user|>\n Hi <|end|>\n<|assistant|>\nHello!"
                  "<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n",
                  "<|system|>|<|end|>|<|user|>|<|end|>|<|assistant|>|<|end|>|<|user|>|<|end|>|"
                  "<|assistant|>");
}

Test(gateway, chat_joins_system_prompts_when_the_format_has_no_system_turn)
{
    static const struct sl_chat_msg two_sys[] = {
        {SL_CHAT_ROLE_SYSTEM, "A", 1, false},
        {SL_CHAT_ROLE_SYSTEM, "B", 1, false},
        {SL_CHAT_ROLE_USER, "q", 1, false},
    };
    expect_render(SL_CHAT_TEMPLATE_MISTRAL, two_sys, 3, "[INST] A\n\nB\n\nq [/INST]", "");
    expect_render(SL_CHAT_TEMPLATE_GEMMA, two_sys, 3,
                  "<start_of_turn>user\nA\n\nB\n\nq<end_of_turn>\n<start_of_turn>model\n",
                  "<start_of_turn>|<end_of_turn>|<start_of_turn>");
}

/* ---- tokenizing ---- */

static struct sl_model *load(const char *spec)
{
    struct sl_model *m = NULL;
    char err[256];
    cr_assert_eq(sl_model_load(spec, NULL, &m, err, sizeof err), SL_OK, "%s", err);
    return m;
}

/* Encodes the rendering of msgs with t; returns the ids (caller frees) and their count. */
static int32_t *encode(const struct sl_model *m, enum sl_chat_template t,
                       const struct sl_chat_msg *msgs, int n, int *n_ids)
{
    int seq = sl_model_config(m)->seq_len;
    int32_t *ids = sl_xmalloc(sizeof(int32_t) * (size_t)seq);
    struct sl_chat_prompt p;
    sl_chat_prompt_init(&p);
    sl_chat_render(&p, t, msgs, n);
    struct sl_openai_error err;
    cr_assert_eq(sl_chat_prompt_encode(sl_model_tok(m), seq, &p, 8, ids, n_ids, &err), SL_OK, "%s",
                 err.message);
    sl_chat_prompt_dispose(&p);
    return ids;
}

/* Appends the ids of text (no BOS) to ids at *n. */
static void append_text(const struct sl_tok *tok, const char *text, int32_t *ids, int *n, int cap)
{
    int k = 0;
    cr_assert_eq(sl_tok_encode(tok, text, strlen(text), false, ids + *n, cap - *n, &k), SL_OK);
    *n += k;
}

Test(gateway, chat_encodes_like_a_prompt_when_the_vocabulary_has_no_markers)
{
    /* The synthetic vocabulary has no special tokens: every marker is text, so the whole
     * rendering is one run, encoded as /v1/completions would encode it as a prompt. */
    struct sl_model *m = load("synthetic:tiny");
    int seq = sl_model_config(m)->seq_len;
    for (int t = 0; t < SL_CHAT_TEMPLATE_COUNT; t++) {
        int n = 0, want_n = 0;
        int32_t *ids = encode(m, t, convo, N_CONVO, &n);
        struct sl_chat_prompt p;
        sl_chat_prompt_init(&p);
        sl_chat_render(&p, t, convo, N_CONVO);
        int32_t *want = sl_xmalloc(sizeof(int32_t) * (size_t)seq);
        struct sl_openai_error err;
        cr_assert_eq(sl_openai_prompt_encode(sl_model_tok(m), seq, p.text.p, p.text.len, 8, want,
                                             &want_n, &err),
                     SL_OK);
        cr_assert_eq(n, want_n, "%s: %d ids, want %d", sl_chat_template_name(t), n, want_n);
        cr_assert_eq(memcmp(ids, want, sizeof(int32_t) * (size_t)n), 0, "%s",
                     sl_chat_template_name(t));
        cr_assert_eq(ids[0], sl_tok_bos(sl_model_tok(m)));
        free(want);
        free(ids);
        sl_chat_prompt_dispose(&p);
    }
    sl_model_free(m);
}

Test(gateway, chat_encodes_markers_as_special_tokens_when_the_vocabulary_has_them)
{
    const char *dir = getenv("SL_MODELS_DIR");
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/stories260K.gguf", dir ? dir : "");
    if (!dir || stat(path, &st) != 0)
        MODELS_MISSING("needs ../shared/models/stories260K.gguf (SL_MODELS_DIR=%s)",
                       dir ? dir : "(unset)");
    struct sl_model *m = load(path);
    const struct sl_tok *tok = sl_model_tok(m);
    cr_assert_eq(sl_tok_special_id(tok, "</s>", 4), 2, "</s> is a control token there");
    cr_assert_eq(sl_tok_special_id(tok, "<s>", 3), 1);
    int n = 0;
    int32_t *ids = encode(m, SL_CHAT_TEMPLATE_LLAMA2, convo + 1, 3, &n);
    /* BOS, the first turn, </s> and <s> as ids 2 and 1, the second turn: each run of text
     * encoded on its own (with SentencePiece's leading space, as llama.cpp does after a special
     * token). */
    int32_t want[512];
    int wn = 0;
    want[wn++] = 1;
    append_text(tok, "[INST] Hi [/INST] Hello! ", want, &wn, 512);
    want[wn++] = 2;
    want[wn++] = 1;
    append_text(tok, "[INST] Bye [/INST]", want, &wn, 512);
    cr_assert_eq(n, wn, "%d ids, want %d", n, wn);
    cr_assert_eq(memcmp(ids, want, sizeof(int32_t) * (size_t)n), 0);
    free(ids);
    /* A marker the vocabulary lacks (ChatML's) stays text. */
    ids = encode(m, SL_CHAT_TEMPLATE_CHATML, convo + 3, 1, &n);
    wn = 0;
    want[wn++] = 1;
    append_text(tok, "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", want, &wn, 512);
    cr_assert_eq(n, wn);
    cr_assert_eq(memcmp(ids, want, sizeof(int32_t) * (size_t)n), 0);
    free(ids);
    sl_model_free(m);
}

Test(gateway, chat_rejects_with_context_length_exceeded_when_messages_are_too_long)
{
    struct sl_model *m = load("synthetic:tiny");
    int seq = sl_model_config(m)->seq_len;
    int32_t *ids = sl_xmalloc(sizeof(int32_t) * (size_t)seq);
    size_t len = (size_t)seq * 4;
    char *text = sl_xmalloc(len);
    for (size_t i = 0; i < len; i++)
        text[i] = (char)('a' + (i * 7) % 26);
    struct sl_chat_msg long_msg = {SL_CHAT_ROLE_USER, text, len, false};
    struct sl_chat_prompt p;
    sl_chat_prompt_init(&p);
    sl_chat_render(&p, SL_CHAT_TEMPLATE_CHATML, &long_msg, 1);
    int n = 0;
    struct sl_openai_error err;
    cr_assert_eq(sl_chat_prompt_encode(sl_model_tok(m), seq, &p, 16, ids, &n, &err), SL_ERANGE);
    cr_assert_eq(err.http, 400);
    cr_assert_str_eq(err.code, "context_length_exceeded");
    cr_assert(strstr(err.message, "at least"), "%s", err.message);
    /* A short conversation whose completion does not fit is refused the same way. */
    sl_chat_render(&p, SL_CHAT_TEMPLATE_PLAIN, convo, N_CONVO);
    cr_assert_eq(sl_chat_prompt_encode(sl_model_tok(m), seq, &p, seq, ids, &n, &err), SL_ERANGE);
    cr_assert_str_eq(err.code, "context_length_exceeded");
    cr_assert_null(strstr(err.message, "at least"), "%s", err.message);
    sl_chat_prompt_dispose(&p);
    free(text);
    free(ids);
    sl_model_free(m);
}

/* ---- encoders ---- */

static json_t *parse(const struct sl_str *s)
{
    json_error_t je;
    cr_assert_null(memchr(s->p, '\n', s->len), "a raw newline would end an SSE event");
    json_t *j = json_loadb(s->p, s->len, 0, &je);
    cr_assert_not_null(j, "not JSON (%s): %s", je.text, s->p);
    return j;
}

static struct sl_openai_ident chat_ident(bool include_usage)
{
    return (struct sl_openai_ident){.id = "chatcmpl-42",
                                    .created = 1700000001,
                                    .model = MODEL,
                                    .api = SL_OPENAI_API_CHAT,
                                    .include_usage = include_usage};
}

static json_t *choice0(json_t *j)
{
    json_t *ch = json_object_get(j, "choices");
    cr_assert_eq(json_array_size(ch), 1);
    json_t *c = json_array_get(ch, 0);
    cr_assert_eq(json_integer_value(json_object_get(c, "index")), 0);
    cr_assert(json_is_null(json_object_get(c, "logprobs")));
    return c;
}

static void expect_head(json_t *j, const char *object)
{
    cr_assert_str_eq(json_string_value(json_object_get(j, "id")), "chatcmpl-42");
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), object);
    cr_assert_eq(json_integer_value(json_object_get(j, "created")), 1700000001);
    cr_assert_str_eq(json_string_value(json_object_get(j, "model")), MODEL);
}

Test(gateway, chat_encodes_a_chat_completion_when_the_request_finished)
{
    struct sl_openai_ident id = chat_ident(false);
    struct sl_str s;
    sl_str_init(&s);
    static const char text[] = "line \"1\"\nline\t2 \xe2\x82\xac";
    sl_openai_completion_encode(&s, &id, text, sizeof text - 1, SL_FINISH_STOP, 9, 4, NULL);
    json_t *j = parse(&s);
    expect_head(j, "chat.completion");
    json_t *c = choice0(j);
    json_t *msg = json_object_get(c, "message");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "role")), "assistant");
    cr_assert_str_eq(json_string_value(json_object_get(msg, "content")), text);
    cr_assert_null(json_object_get(c, "text"));
    cr_assert_str_eq(json_string_value(json_object_get(c, "finish_reason")), "stop");
    json_t *u = json_object_get(j, "usage");
    cr_assert_eq(json_integer_value(json_object_get(u, "prompt_tokens")), 9);
    cr_assert_eq(json_integer_value(json_object_get(u, "completion_tokens")), 4);
    cr_assert_eq(json_integer_value(json_object_get(u, "total_tokens")), 13);
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, chat_encodes_role_then_content_then_finish_when_streaming)
{
    struct sl_openai_ident id = chat_ident(false);
    struct sl_str s;
    sl_str_init(&s);

    sl_openai_chunk_role_encode(&s, &id);
    json_t *j = parse(&s);
    expect_head(j, "chat.completion.chunk");
    json_t *c = choice0(j);
    json_t *d = json_object_get(c, "delta");
    cr_assert_str_eq(json_string_value(json_object_get(d, "role")), "assistant");
    cr_assert_str_eq(json_string_value(json_object_get(d, "content")), "");
    cr_assert(json_is_null(json_object_get(c, "finish_reason")));
    cr_assert_null(json_object_get(j, "usage"), "no usage member without include_usage");
    json_decref(j);

    sl_str_clear(&s);
    sl_openai_chunk_encode(&s, &id, "ab\n", 3, SL_FINISH_NONE, NULL);
    j = parse(&s);
    expect_head(j, "chat.completion.chunk");
    c = choice0(j);
    d = json_object_get(c, "delta");
    cr_assert_str_eq(json_string_value(json_object_get(d, "content")), "ab\n");
    cr_assert_null(json_object_get(d, "role"), "the role comes in the first chunk only");
    cr_assert(json_is_null(json_object_get(c, "finish_reason")));
    json_decref(j);

    sl_str_clear(&s);
    sl_openai_chunk_encode(&s, &id, "", 0, SL_FINISH_LENGTH, NULL);
    j = parse(&s);
    c = choice0(j);
    d = json_object_get(c, "delta");
    cr_assert(json_is_object(d));
    cr_assert_eq(json_object_size(d), 0, "the last delta is empty");
    cr_assert_str_eq(json_string_value(json_object_get(c, "finish_reason")), "length");
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, chat_chunks_carry_null_usage_when_include_usage_is_set)
{
    struct sl_openai_ident id = chat_ident(true);
    struct sl_str s;
    sl_str_init(&s);
    sl_openai_chunk_role_encode(&s, &id);
    json_t *j = parse(&s);
    cr_assert(json_is_null(json_object_get(j, "usage")), "%s", s.p);
    json_decref(j);
    sl_str_clear(&s);
    sl_openai_chunk_encode(&s, &id, "x", 1, SL_FINISH_NONE, NULL);
    j = parse(&s);
    cr_assert(json_is_null(json_object_get(j, "usage")), "%s", s.p);
    json_decref(j);
    sl_str_clear(&s);
    sl_openai_usage_chunk_encode(&s, &id, 5, 6);
    j = parse(&s);
    expect_head(j, "chat.completion.chunk");
    cr_assert(json_is_array(json_object_get(j, "choices")));
    cr_assert_eq(json_array_size(json_object_get(j, "choices")), 0);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")),
                 11);
    json_decref(j);
    sl_str_dispose(&s);
}

Test(gateway, chat_refuses_fields_it_does_not_implement_when_they_ask_for_something)
{
    expect_error("{\"messages\":[" USER_HI "],\"modalities\":[\"text\",\"audio\"]}", 400,
                 "modalities", "unsupported_value");
    expect_error("{\"messages\":[" USER_HI "],\"modalities\":\"text\"}", 400, "modalities",
                 "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"audio\":{\"voice\":\"alloy\"}}", 400, "audio",
                 "unsupported_value");
    expect_error("{\"messages\":[" USER_HI "],\"logit_bias\":{\"3\":200}}", 400, "logit_bias.3",
                 "decimal_above_max_value");
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(decode(&c,
                        "{\"messages\":[" USER_HI "],\"logprobs\":false,\"top_logprobs\":0,"
                        "\"modalities\":[\"text\"],\"audio\":null,\"presence_penalty\":0.5,"
                        "\"logit_bias\":{\"3\":1}}",
                        &err),
                 SL_OK, "%s", err.message);
    cr_assert_float_eq(c.params.presence_penalty, 0.5f, 1e-6);
    cr_assert_eq(c.params.n_bias, 1);
    cr_assert_not(c.params.logprobs);
    sl_openai_completion_dispose(&c);
}

Test(gateway, chat_decodes_logprobs_and_top_logprobs_when_asked)
{
    struct sl_openai_completion c;
    struct sl_openai_error err;
    cr_assert_eq(
        decode(&c, "{\"messages\":[" USER_HI "],\"logprobs\":true,\"top_logprobs\":3}", &err),
        SL_OK, "%s", err.message);
    cr_assert(c.params.logprobs);
    cr_assert_eq(c.params.top_logprobs, 3);
    sl_openai_completion_dispose(&c);
    expect_error("{\"messages\":[" USER_HI "],\"logprobs\":1}", 400, "logprobs", "invalid_type");
    expect_error("{\"messages\":[" USER_HI "],\"top_logprobs\":3}", 400, "top_logprobs",
                 "invalid_value");
    expect_error("{\"messages\":[" USER_HI "],\"logprobs\":true,\"top_logprobs\":21}", 400,
                 "top_logprobs", "integer_above_max_value");
}
