/* Golden: the server's completion for a real tiny model, in each file format it loads, equals
 * llama2.c's greedy output. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "../models.h"
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *models_dir(void)
{
    const char *d = getenv("SL_MODELS_DIR");
    return d ? d : "../shared/models";
}

static bool have(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* POSTs a greedy completion of n_gen tokens with `prompt` (a JSON string or array of ids), with
 * `echo` as given, and checks its text is `want`. */
static void check_completion(struct server *srv, const char *model, json_t *prompt, int n_gen,
                             bool echo, const char *want)
{
    json_t *req = json_pack("{s:O, s:i, s:f, s:b}", "prompt", prompt, "max_tokens", n_gen,
                            "temperature", 0.0, "echo", echo);
    char *body = json_dumps(req, 0);
    int fd = client_connect(srv->port);
    client_request(fd, "POST", "/v1/completions", body, false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    close(fd);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_error_t e;
    json_t *j = json_loads(r.body, 0, &e);
    cr_assert_not_null(j, "%s", r.body);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(choice, "text")), want, "%s: %s", model,
                     body);
    cr_assert_str_eq(json_string_value(json_object_get(choice, "finish_reason")), "length");
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")),
        n_gen);
    json_decref(j);
    response_dispose(&r);
    free(body);
    json_decref(req);
}

/* Serves `model` (and `tokenizer`, or NULL) and checks every prompt of the golden file: the
 * completion of n_generated greedy tokens is llama2.c's text after the prompt, without the "\n"
 * run.c prints at the end; the same when the prompt is sent as the reference's token ids. */
static void check_golden(const char *model, const char *tokenizer, const char *golden_name)
{
    char golden[4096];
    snprintf(golden, sizeof golden, "%s/golden/%s", models_dir(), golden_name);
    if (!have(model) || (tokenizer && !have(tokenizer)) || !have(golden))
        MODELS_MISSING(
            "../shared/models not found (SL_MODELS_DIR=%s): the golden server test needs it",
            models_dir());
    json_error_t e;
    json_t *cases = json_load_file(golden, 0, &e);
    cr_assert_not_null(cases, "%s: %s", golden, e.text);

    struct server srv;
    const char *args[] = {"--model", model, tokenizer ? "--tokenizer" : NULL, tokenizer, NULL};
    server_start(&srv, args);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        const char *text = json_string_value(json_object_get(c, "text"));
        int n_gen = (int)json_integer_value(json_object_get(c, "n_generated"));
        size_t pl = strlen(prompt), tl = strlen(text);
        cr_assert_eq(strncmp(text, prompt, pl), 0);
        char *want = strndup(text + pl, tl - pl - 1);
        check_completion(&srv, model, json_object_get(c, "prompt"), n_gen, false, want);
        json_t *ids = json_object_get(c, "prompt_token_ids");
        cr_assert(json_is_array(ids), "%s has prompt_token_ids", golden_name);
        check_completion(&srv, model, ids, n_gen, false, want);
        /* echo: the ids decode to the prompt's text (BOS to nothing), then the completion. */
        char *whole = strndup(text, tl - 1);
        check_completion(&srv, model, ids, n_gen, true, whole);
        free(whole);
        free(want);
    }
    server_stop(&srv);
    json_decref(cases);
}

Test(golden, text_matches_llama2c_when_serving_stories260K_bin, .timeout = 300)
{
    char bin[4096], tok[4096];
    snprintf(bin, sizeof bin, "%s/stories260K.bin", models_dir());
    snprintf(tok, sizeof tok, "%s/tok512.bin", models_dir());
    check_golden(bin, tok, "stories260K.json");
}

Test(golden, text_matches_llama2c_when_serving_stories260K_gguf, .timeout = 300)
{
    char gguf[4096];
    snprintf(gguf, sizeof gguf, "%s/stories260K.gguf", models_dir());
    check_golden(gguf, NULL, "stories260K.json");
}

Test(golden, text_matches_reference_when_serving_tinystories656K_hf_folder, .timeout = 300)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tinystories-656K/hf", models_dir());
    check_golden(dir, NULL, "tinystories-656K.json");
}
