/* Prefix caching on the real server (issue 31): what the responses, the ledger and /metrics say
 * about the prompt tokens the cache gave, and who may share whose prefixes.
 *
 * Requests are sent one after the other: a request's blocks are cached once it has computed
 * them, so the next one's figure does not depend on timing. Prompts are given as token ids, so
 * their length (and so their full blocks) is exact; outputs are greedy. */
#include <criterion/criterion.h>
#include <jansson.h>

#include "harness.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALICE "sk-alice-0123456789abcdefXYZ"
#define ALICE_SHA "4e3cf284f86ed2e2912a406e093fde194fffbfc71792276277eb201998cc4cfe"
#define BOB "sk-bob-0123456789abcdefXYZ"
#define BOB_SHA "ca94e0a18defaf16a73804c392e6898bd1b71c8a2fdf1ec61e574517dadbedca"
#define ADMIN "admin-secret-key-0123456789"
#define ADMIN_SHA "4863aec637069806d797219f620402072ed601f239fbc9cb3533c91cc53c1611"
#define AUTH(key) "Authorization: Bearer " key "\r\n"

#define BLOCK 16
/* Two tenants; prices in credits per million tokens: input 1, cached input 0.1, output 2, so a
 * token is 1,000, 100 and 2,000 nano-units. `extra` goes last (",\"prefix_cache\":..."). */
#define CONFIG(extra)                                                                              \
    "{" HARNESS_TIERS_WITHOUT_GUARD ",\"threads\":1,\"block_size\":16,\"currency\":\"credits\","   \
    "\"price\":{\"input_per_mtok\":1,\"cached_input_per_mtok\":0.1,\"output_per_mtok\":2},"        \
    "\"admin_key_sha256\":\"" ADMIN_SHA                                                            \
    "\",\"tenants\":[{\"name\":\"alice\",\"key_sha256\":\"" ALICE_SHA                              \
    "\",\"tiers\":[\"interactive\"],\"default_tier\":\"interactive\"},{\"name\":"                  \
    "\"bob\",\"key_sha256\":\"" BOB_SHA "\",\"tiers\":[\"interactive\"],\"default_tier\":"         \
    "\"interactive\"}]" extra "}"

static struct server srv;

static void stop(void)
{
    server_stop(&srv);
}

TestSuite(prefix, .fini = stop, .timeout = 300);

/* A prompt of n token ids, seed choosing which: "[a,b,...]". */
static char *prompt_ids(int n, int seed)
{
    size_t cap = (size_t)n * 8 + 8, len = 0;
    char *s = malloc(cap);
    cr_assert_not_null(s);
    s[len++] = '[';
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len, "%s%d", i ? "," : "",
                                1 + (i * 37 + seed * 101) % 500);
    snprintf(s + len, cap - len, "]");
    return s;
}

struct answer {
    int status;
    json_t *j;       /* the body, parsed (NULL when it is not JSON) */
    long long cost;  /* x-sluice-cost in nano-units, -1 when absent */
    char body[4096]; /* the start of the raw body, for messages */
};

static void post(struct answer *a, const char *path, const char *headers, const char *body)
{
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", path, headers, body, false);
    struct response r;
    cr_assert(client_read_response(fd, &r), "no answer to %s", path);
    close(fd);
    a->status = r.status;
    a->j = json_loads(r.body, 0, NULL);
    const char *c = response_header(&r, "x-sluice-cost");
    a->cost = c ? nano_of(c) : -1;
    snprintf(a->body, sizeof a->body, "%s", r.body);
    response_dispose(&r);
}

static void answer_dispose(struct answer *a)
{
    json_decref(a->j);
    a->j = NULL;
}

static long long usage_int(const struct answer *a, const char *key)
{
    json_t *u = json_object_get(a->j, "usage");
    cr_assert_not_null(u, "%s", a->body);
    json_t *v = json_object_get(u, key);
    cr_assert(json_is_integer(v), "usage.%s in %s", key, a->body);
    return json_integer_value(v);
}

static long long cached_of(const struct answer *a)
{
    json_t *d = json_object_get(json_object_get(a->j, "usage"), "prompt_tokens_details");
    json_t *v = json_object_get(d, "cached_tokens");
    cr_assert(json_is_integer(v), "usage.prompt_tokens_details.cached_tokens in %s", a->body);
    return json_integer_value(v);
}

static const char *text_of(const struct answer *a)
{
    json_t *ch = json_array_get(json_object_get(a->j, "choices"), 0);
    json_t *t = json_object_get(ch, "text");
    if (!t)
        t = json_object_get(json_object_get(ch, "message"), "content");
    cr_assert(json_is_string(t), "%s", a->body);
    return json_string_value(t);
}

/* A greedy completion of prompt (ids, as JSON) for key, with `extra` fields (",\"...\":..."). */
static void complete(struct answer *a, const char *key_header, const char *prompt,
                     const char *extra)
{
    char *body = malloc(strlen(prompt) + strlen(extra) + 128);
    cr_assert_not_null(body);
    sprintf(body, "{\"prompt\":%s,\"max_tokens\":8,\"temperature\":0%s}", prompt, extra);
    post(a, "/v1/completions", key_header, body);
    free(body);
    cr_assert_eq(a->status, 200, "%s", a->body);
}

/* The cached tokens of a completion of prompt by key_header's tenant, with extra fields. */
static long long cached_after(const char *key_header, const char *prompt, const char *extra)
{
    struct answer a;
    complete(&a, key_header, prompt, extra);
    long long n = cached_of(&a);
    answer_dispose(&a);
    return n;
}

/* Cached figures the scheduler may give a prompt of n tokens: whole blocks, never the last
 * token (its logits are computed). */
static void assert_cached_blocks(long long cached, int n)
{
    cr_assert_gt(cached, 0, "the second request finds the first's blocks");
    cr_assert_eq(cached % BLOCK, 0, "%lld is whole blocks of %d", cached, BLOCK);
    cr_assert_leq(cached, n - 1, "%lld of %d: the last token is always computed", cached, n);
}

Test(prefix, a_repeated_prompt_reads_its_blocks_and_answers_the_same)
{
    server_start_config(&srv, CONFIG(""));
    const int n = 100; /* 6 full blocks and 4 tokens */
    char *p = prompt_ids(n, 1);
    struct answer first, second;
    complete(&first, AUTH(ALICE), p, "");
    cr_assert_eq(usage_int(&first, "prompt_tokens"), n);
    cr_assert_eq(cached_of(&first), 0, "nothing was cached before it");
    complete(&second, AUTH(ALICE), p, "");
    cr_assert_eq(usage_int(&second, "prompt_tokens"), n, "cached tokens are prompt tokens too");
    assert_cached_blocks(cached_of(&second), n);
    cr_assert_eq(cached_of(&second), 96, "every full block of the prompt");
    cr_assert_str_eq(text_of(&second), text_of(&first), "the same greedy answer from the cache");
    /* Streamed, its final usage chunk says the same. */
    char *body = malloc(strlen(p) + 256);
    sprintf(body,
            "{\"prompt\":%s,\"max_tokens\":8,\"temperature\":0,\"stream\":true,"
            "\"stream_options\":{\"include_usage\":true}}",
            p);
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/completions", AUTH(ALICE), body, false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    close(fd);
    cr_assert_eq(r.status, 200);
    const char *u = strstr(r.body, "\"prompt_tokens_details\":{\"cached_tokens\":96}");
    cr_assert_not_null(u, "the usage chunk: %s", r.body);
    response_dispose(&r);
    free(body);
    answer_dispose(&first);
    answer_dispose(&second);
    free(p);

    /* A chat's rendered prompt is cached the same way. */
    static const char chat[] =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"You are a careful assistant who "
        "answers every question about the three little pigs, the big bad wolf, their houses of "
        "straw, sticks and bricks, and what the pigs did after the wolf came down the chimney, in "
        "plain words and short sentences.\"},{\"role\":\"user\",\"content\":\"What happened to "
        "the house of straw?\"}],\"max_tokens\":6,\"temperature\":0}";
    post(&first, "/v1/chat/completions", AUTH(ALICE), chat);
    cr_assert_eq(first.status, 200, "%s", first.body);
    post(&second, "/v1/chat/completions", AUTH(ALICE), chat);
    cr_assert_eq(second.status, 200, "%s", second.body);
    cr_assert_eq(cached_of(&first), 0);
    assert_cached_blocks(cached_of(&second), (int)usage_int(&second, "prompt_tokens"));
    cr_assert_str_eq(text_of(&second), text_of(&first));
    answer_dispose(&first);
    answer_dispose(&second);
}

Test(prefix, a_tenant_never_reads_another_s_blocks_in_tenant_scope)
{
    server_start_config(&srv, CONFIG(""));
    const int n = 80;
    char *p = prompt_ids(n, 2);
    cr_assert_eq(cached_after(AUTH(ALICE), p, ""), 0);
    cr_assert_eq(cached_after(AUTH(BOB), p, ""), 0, "bob computes alice's prompt again");
    assert_cached_blocks(cached_after(AUTH(ALICE), p, ""), n);
    /* His own blocks, from his first request. */
    assert_cached_blocks(cached_after(AUTH(BOB), p, ""), n);
    free(p);

    /* A reload to the global scope takes effect for the requests that start after it. */
    cr_assert(server_reload_config(&srv, CONFIG(",\"prefix_cache\":{\"scope\":\"global\"}")), "%s",
              srv.log);
    p = prompt_ids(n, 3);
    cr_assert_eq(cached_after(AUTH(ALICE), p, ""), 0);
    assert_cached_blocks(cached_after(AUTH(BOB), p, ""), n);
    free(p);
}

Test(prefix, every_tenant_shares_the_cache_in_global_scope)
{
    server_start_config(&srv, CONFIG(",\"prefix_cache\":{\"enabled\":true,\"scope\":\"global\"}"));
    const int n = 64;
    char *p = prompt_ids(n, 4);
    struct answer a;
    cr_assert_eq(cached_after(AUTH(ALICE), p, ""), 0);
    complete(&a, AUTH(BOB), p, "");
    assert_cached_blocks(cached_of(&a), n);
    cr_assert_eq(cached_of(&a), 48, "3 of the 4 blocks: the last token is computed");
    answer_dispose(&a);
    free(p);
}

Test(prefix, a_salt_keeps_its_requests_apart_from_the_rest)
{
    server_start_config(&srv, CONFIG(""));
    const int n = 50;
    char *p = prompt_ids(n, 5);
    struct answer a;
    cr_assert_eq(cached_after(AUTH(ALICE), p, ""), 0);
    cr_assert_eq(cached_after(AUTH(ALICE), p, ",\"cache_salt\":\"conversation-7\""), 0,
                 "another salt, another cache");
    assert_cached_blocks(cached_after(AUTH(ALICE), p, ",\"cache_salt\":\"conversation-7\""), n);
    cr_assert_eq(cached_after(AUTH(ALICE), p, ",\"prompt_cache_key\":\"conversation-7\""), 0,
                 "the same string as OpenAI's key is another key");
    cr_assert_eq(
        cached_after(AUTH(ALICE), p,
                     ",\"prompt_cache_key\":\"conversation-7\",\"cache_salt\":\"conversation-7\""),
        0, "both together, yet another");
    assert_cached_blocks(cached_after(AUTH(ALICE), p, ""), n);
    /* A salt that is not a short string is refused, by name. */
    char *body = malloc(strlen(p) + 512);
    sprintf(body, "{\"prompt\":%s,\"max_tokens\":2,\"cache_salt\":7}", p);
    post(&a, "/v1/completions", AUTH(ALICE), body);
    cr_assert_eq(a.status, 400, "%s", a.body);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(a.j, "error"), "param")),
                     "cache_salt");
    answer_dispose(&a);
    sprintf(body, "{\"prompt\":%s,\"max_tokens\":2,\"prompt_cache_key\":\"%0300d\"}", p, 0);
    post(&a, "/v1/completions", AUTH(ALICE), body);
    cr_assert_eq(a.status, 400, "%s", a.body);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(a.j, "error"), "param")),
                     "prompt_cache_key");
    answer_dispose(&a);
    free(body);
    free(p);
}

static double metric(const char *name)
{
    double v = metrics_fetch_sum(srv.port, name);
    cr_assert_geq(v, 0, "%s is exposed", name);
    return v;
}

Test(prefix, metrics_count_the_tokens_looked_up_and_found)
{
    server_start_config(&srv, CONFIG(""));
    cr_assert_eq(metric("sluice:prefix_cache_queries_total"), 0);
    cr_assert_eq(metric("sluice:prefix_cache_hits_total"), 0);
    cr_assert_eq(metric("sluice:prefix_cache_evictions_total"), 0);
    cr_assert_eq(metric("sluice:kv_blocks_cached"), 0);
    long long prompt = 0, cached = 0;
    for (int i = 0; i < 3; i++) {
        char *p = prompt_ids(40 + 16 * i, 6);
        for (int k = 0; k < 2; k++) {
            struct answer a;
            complete(&a, AUTH(ALICE), p, "");
            prompt += usage_int(&a, "prompt_tokens");
            cached += cached_of(&a);
            answer_dispose(&a);
        }
        free(p);
    }
    cr_assert_gt(cached, 0);
    cr_assert_eq(metric("sluice:prefix_cache_queries_total"), (double)prompt,
                 "every prompt token was looked up");
    cr_assert_eq(metric("sluice:prefix_cache_hits_total"), (double)cached,
                 "and the hits are what the responses said");
    cr_assert_gt(metric("sluice:kv_blocks_cached"), 0, "the blocks stay cached after the requests");
    cr_assert_eq(metric("sluice:prefix_cache_evictions_total"), 0, "a pool this large evicts none");
}

Test(prefix, anthropic_messages_report_cache_reads_apart_from_input_tokens)
{
    server_start_config(&srv, CONFIG(""));
    static const char body[] =
        "{\"model\":\"synthetic\",\"max_tokens\":6,\"temperature\":0,\"system\":[{\"type\":"
        "\"text\",\"text\":\"You are a careful assistant who answers every question about the "
        "three little pigs, the big bad wolf, their houses of straw, sticks and bricks, and what "
        "the pigs did after the wolf came down the chimney.\",\"cache_control\":{\"type\":"
        "\"ephemeral\"}}],\"messages\":[{\"role\":\"user\",\"content\":\"Who built the house of "
        "bricks?\"}]}";
    struct answer first, second;
    post(&first, "/v1/messages", "x-api-key: " ALICE "\r\n", body);
    cr_assert_eq(first.status, 200, "%s", first.body);
    long long prompt = usage_int(&first, "input_tokens");
    cr_assert_eq(usage_int(&first, "cache_read_input_tokens"), 0);
    cr_assert_eq(usage_int(&first, "cache_creation_input_tokens"), 0);
    cr_assert_gt(prompt, 2 * BLOCK, "a prompt of several blocks");
    post(&second, "/v1/messages", "x-api-key: " ALICE "\r\n", body);
    cr_assert_eq(second.status, 200, "%s", second.body);
    long long read = usage_int(&second, "cache_read_input_tokens");
    assert_cached_blocks(read, (int)prompt);
    cr_assert_eq(usage_int(&second, "input_tokens") + read, prompt,
                 "input_tokens counts what was not read from the cache");
    json_t *t1 = json_object_get(json_array_get(json_object_get(first.j, "content"), 0), "text");
    json_t *t2 = json_object_get(json_array_get(json_object_get(second.j, "content"), 0), "text");
    cr_assert_str_eq(json_string_value(t2), json_string_value(t1));
    answer_dispose(&first);
    answer_dispose(&second);

    /* Streamed: message_start and the final message_delta say the same. */
    char streamed[sizeof body + 32];
    snprintf(streamed, sizeof streamed, "{\"stream\":true,%s", body + 1);
    int fd = client_connect(srv.port);
    client_request_h(fd, "POST", "/v1/messages", "x-api-key: " ALICE "\r\n", streamed, false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    close(fd);
    cr_assert_eq(r.status, 200);
    char want[128];
    snprintf(want, sizeof want,
             "\"input_tokens\":%lld,\"cache_creation_input_tokens\":0,"
             "\"cache_read_input_tokens\":%lld",
             prompt - read, read);
    const char *start = strstr(r.body, "event: message_start");
    const char *delta = strstr(r.body, "event: message_delta");
    cr_assert(start && delta, "%s", r.body);
    cr_assert(strstr(start, want) && strstr(start, want) < delta, "message_start: %s", r.body);
    cr_assert(strstr(delta, want), "message_delta: %s", r.body);
    response_dispose(&r);
}

Test(prefix, cached_tokens_cost_the_cached_price_in_the_header_the_usage_and_the_ledger)
{
    server_start_config(&srv, CONFIG(""));
    const int n = 120;
    char *p = prompt_ids(n, 7);
    struct answer a;
    long long prompt = 0, cached = 0, cost = 0;
    for (int k = 0; k < 2; k++) {
        complete(&a, AUTH(BOB), p, "");
        long long pt = usage_int(&a, "prompt_tokens"), ct = usage_int(&a, "completion_tokens"),
                  c = cached_of(&a);
        long long want = (pt - c) * 1000 + c * 100 + ct * 2000;
        cr_assert_eq(a.cost, want, "x-sluice-cost: %lld nano, want %lld", a.cost, want);
        json_t *uc = json_object_get(json_object_get(a.j, "usage"), "cost");
        cr_assert(json_is_number(uc), "%s", a.body);
        cr_assert_eq(llround(json_number_value(uc) * 1e9), want, "usage.cost");
        prompt += pt;
        cached += c;
        cost += want;
        answer_dispose(&a);
    }
    cr_assert_gt(cached, 0);
    free(p);
    /* The ledger has the cached tokens and the tenant's hit ratio. */
    int fd = client_connect(srv.port);
    client_request_h(fd, "GET", "/admin/usage?group_by=tenant", AUTH(ADMIN), NULL, false);
    struct response r;
    cr_assert(client_read_response(fd, &r));
    close(fd);
    cr_assert_eq(r.status, 200, "%s", r.body);
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *rows = json_object_get(j, "data");
    json_t *bob = NULL;
    for (size_t i = 0; i < json_array_size(rows); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(rows, i), "tenant")), "bob") ==
            0)
            bob = json_array_get(rows, i);
    cr_assert_not_null(bob, "%s", r.body);
    cr_assert_eq(json_integer_value(json_object_get(bob, "prompt_tokens")), prompt);
    cr_assert_eq(json_integer_value(json_object_get(bob, "cached_tokens")), cached);
    cr_assert_float_eq(json_number_value(json_object_get(bob, "cache_hit_ratio")),
                       (double)cached / (double)prompt, 1e-6);
    cr_assert_eq(llround(json_number_value(json_object_get(bob, "cost")) * 1e9), cost,
                 "the ledger prices them alike");
    json_decref(j);
    response_dispose(&r);
}

Test(prefix, nothing_is_cached_when_the_cache_is_off)
{
    server_start_config(&srv, CONFIG(",\"prefix_cache\":{\"enabled\":false}"));
    char *p = prompt_ids(64, 8);
    for (int k = 0; k < 2; k++)
        cr_assert_eq(cached_after(AUTH(ALICE), p, ""), 0, "request %d", k);
    free(p);
    cr_assert_eq(metric("sluice:prefix_cache_queries_total"), 0, "nothing looked up");
    cr_assert_eq(metric("sluice:kv_blocks_cached"), 0);
}
