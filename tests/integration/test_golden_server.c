/* Golden: the server's completion for a real tiny model equals llama2.c's greedy output. */
#include <criterion/criterion.h>
#include <jansson.h>

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

Test(golden, text_matches_llama2c_when_serving_stories260K, .timeout = 300)
{
    char bin[4096], tok[4096], golden[4096];
    snprintf(bin, sizeof bin, "%s/stories260K.bin", models_dir());
    snprintf(tok, sizeof tok, "%s/tok512.bin", models_dir());
    snprintf(golden, sizeof golden, "%s/golden/stories260K.json", models_dir());
    if (!have(bin) || !have(tok) || !have(golden))
        cr_skip_test("../shared/models not found (SL_MODELS_DIR=%s): golden server test skipped",
                     models_dir());

    json_error_t e;
    json_t *cases = json_load_file(golden, 0, &e);
    cr_assert_not_null(cases, "%s: %s", golden, e.text);
    json_t *c = NULL;
    size_t i;
    json_t *v;
    json_array_foreach(cases, i, v) if (strcmp(json_string_value(json_object_get(v, "prompt")),
                                               "Once upon a time") == 0) c = v;
    cr_assert_not_null(c, "golden case \"Once upon a time\"");
    const char *prompt = json_string_value(json_object_get(c, "prompt"));
    const char *text = json_string_value(json_object_get(c, "text"));
    int n_gen = (int)json_integer_value(json_object_get(c, "n_generated"));
    cr_assert_eq(n_gen, 60);
    /* llama2.c printed the prompt, the completion, then one "\n" of its own. */
    size_t pl = strlen(prompt), tl = strlen(text);
    cr_assert_eq(strncmp(text, prompt, pl), 0);
    char *want = strndup(text + pl, tl - pl - 1);

    struct server srv;
    const char *args[] = {"--model", bin, "--tokenizer", tok, NULL};
    server_start(&srv, args);
    int fd = client_connect(srv.port);
    client_request(fd, "POST", "/v1/completions",
                   "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"max_tokens\":60,"
                   "\"temperature\":0}",
                   false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    close(fd);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = json_loads(r.body, 0, &e);
    cr_assert_not_null(j, "%s", r.body);
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(choice, "text")), want);
    cr_assert_str_eq(json_string_value(json_object_get(choice, "finish_reason")), "length");
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 60);
    json_decref(j);
    response_dispose(&r);
    server_stop(&srv);
    free(want);
    json_decref(cases);
}
