/* Fairness between tenants inside a tier on the real server (issue 30): which request the
 * scheduler serves next when one slot frees, under fairness "vtc" and "fcfs".
 *
 * One slot (max_seqs 1), one tier, tenants a and b. a sends four long requests; once the server's
 * own metrics show the first running and three waiting, b sends one. Under vtc a's counter has
 * grown by what its first request prefilled and generated, b joined at a's count and a's counter
 * kept growing while its first request ran: b's request runs next, second of five. Under fcfs it
 * runs last. The order is the scheduler's decision from the state the test waits for, not a race:
 * a's first request has hundreds of tokens left when b's arrives. */
#include <criterion/criterion.h>

#include "harness.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define KEY_A "sk-fair-a-0123456789abcdef"
#define SHA_A "e956cd7f403e83e14c874f183ee3de275b7ac3499a9280d6df140629eee104e5"
#define KEY_B "sk-fair-b-0123456789abcdef"
#define SHA_B "794a2a3f845d4786e7a77db5718cab83bdfe53314f2f3ce5e091b4217f1c14f0"

static struct server srv;

static void stop(void)
{
    server_stop(&srv);
}

TestSuite(fairness, .fini = stop, .timeout = 300);

struct sender {
    const char *key;
    int port;
    int status;
    int finished; /* its place among the five answers, from 0 */
};

static atomic_int n_finished;

static void *send_one(void *arg)
{
    struct sender *s = arg;
    char auth[128], raw[4096];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", s->key);
    s->status = client_try_request(s->port, "POST", "/v1/completions", auth,
                                   "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,"
                                   "\"ignore_eos\":true}",
                                   raw, sizeof raw);
    s->finished = atomic_fetch_add(&n_finished, 1);
    return NULL;
}

/* Runs the scene under `fairness`; returns the place b's answer came in (0 to 4). */
static int place_of_b(const char *fairness)
{
    char config[2048];
    snprintf(config, sizeof config,
             "{\"model\":\"synthetic:stories15M\",\"threads\":1,\"max_seqs\":1,"
             "\"tiers\":{\"batch\":{\"priority\":1,\"weight\":1,\"ttft_slo_ms\":600000,"
             "\"tpot_slo_ms\":60000,\"fairness\":\"%s\"}},\"tenants\":["
             "{\"name\":\"a\",\"key_sha256\":\"%s\",\"tiers\":[\"batch\"],\"default_tier\":"
             "\"batch\"},{\"name\":\"b\",\"key_sha256\":\"%s\",\"tiers\":[\"batch\"],"
             "\"default_tier\":\"batch\"}]}",
             fairness, SHA_A, SHA_B);
    server_start_config(&srv, config);
    atomic_store(&n_finished, 0);
    struct sender s[5];
    pthread_t th[5];
    for (int i = 0; i < 5; i++)
        s[i] = (struct sender){.key = i < 4 ? KEY_A : KEY_B, .port = srv.port};
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, send_one, &s[i]);
    /* a's first running, the other three waiting: a bounded poll of the server's own figures. */
    bool ready = false;
    for (int k = 0; k < 3000 && !ready; k++) {
        ready = metrics_fetch_sum(srv.port, "sluice:num_requests_running") == 1 &&
                metrics_fetch_sum(srv.port, "sluice:num_requests_waiting") == 3;
        if (!ready)
            usleep(2000);
    }
    cr_assert(ready, "a's four requests never stood one running, three waiting");
    pthread_create(&th[4], NULL, send_one, &s[4]);
    for (int i = 0; i < 5; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(s[i].status, 200, "request %d answered %d", i, s[i].status);
    server_stop(&srv);
    return s[4].finished;
}

Test(fairness, with_vtc_the_other_tenant_runs_next_and_with_fcfs_last)
{
    cr_assert_eq(place_of_b("vtc"), 1, "vtc: b's request is served as soon as the slot frees");
    cr_assert_eq(place_of_b("fcfs"), 4, "fcfs: b's request waits for all of a's");
}
