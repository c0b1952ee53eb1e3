/* fleet-bench: what the fleet's budget script costs one Redis (issue 28). CLIENTS connections,
 * each a thread sending takes as fast as Redis answers them (PIPELINE at a time), every take
 * touching three buckets as a completion does (a tenant's requests and tokens, a tier's tokens),
 * the tenant drawn from TENANTS. Prints takes per second, the share admitted, the round trip seen
 * by a client (p50, p99, for pipeline 1), and Redis's own time per call (INFO commandstats).
 *
 *   fleet-bench --port PORT [--clients 4] [--tenants 1] [--seconds 5] [--pipeline 1]
 *
 * Start a redis-server first (bench/scenarios/fleet-redis.sh does, on a free port). */
#include <sluice/admission.h>

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct opts {
    int port, clients, tenants, seconds, pipeline;
};

struct worker {
    const struct opts *o;
    unsigned seed;
    long calls, admitted, errors;
    double *lat_us; /* pipeline 1: one round trip per call */
    long n_lat, cap_lat;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void send_take(redisContext *c, const char *sha, int tenant)
{
    char k[3][64];
    snprintf(k[0], sizeof k[0], "bench:t:%d:rpm", tenant);
    snprintf(k[1], sizeof k[1], "bench:t:%d:tpm", tenant);
    snprintf(k[2], sizeof k[2], "bench:tier:interactive");
    /* Generous budgets: the cost measured is the script's, admitted or not. */
    struct sl_fleet_bucket b[3] = {
        {k[0], {.limit = 6000, .period_ns = 60000000000LL, .burst = 6000}, 1},
        {k[1], {.limit = 6000000, .period_ns = 60000000000LL, .burst = 6000000}, 300},
        {k[2], {.limit = 100000000, .period_ns = 1000000000LL, .burst = 100000000}, 300},
    };
    char num[12][24];
    int nargs = sl_fleet_take_args(b, 3, num);
    const char *argv[3 + 3 + 12];
    int argc = 0;
    argv[argc++] = "EVALSHA";
    argv[argc++] = sha;
    argv[argc++] = "3";
    for (int i = 0; i < 3; i++)
        argv[argc++] = k[i];
    for (int i = 0; i < nargs; i++)
        argv[argc++] = num[i];
    redisAppendCommandArgv(c, argc, argv, NULL);
}

static void *run(void *arg)
{
    struct worker *w = arg;
    const struct opts *o = w->o;
    redisContext *c = redisConnect("127.0.0.1", o->port);
    if (!c || c->err) {
        fprintf(stderr, "fleet-bench: connect: %s\n", c ? c->errstr : "no memory");
        exit(1);
    }
    char sha[SL_FLEET_SHA_LEN + 1];
    sl_fleet_script_sha(sl_fleet_take_lua, sha);
    double end = now_s() + o->seconds;
    while (now_s() < end) {
        double t0 = now_s();
        for (int i = 0; i < o->pipeline; i++)
            send_take(c, sha, (int)(rand_r(&w->seed) % (unsigned)o->tenants));
        for (int i = 0; i < o->pipeline; i++) {
            redisReply *r;
            if (redisGetReply(c, (void **)&r) != REDIS_OK) {
                fprintf(stderr, "fleet-bench: %s\n", c->errstr);
                exit(1);
            }
            struct sl_fleet_take t;
            char err[256];
            if (sl_fleet_take_parse(r, 3, &t, err, sizeof err) != SL_OK) {
                if (w->errors++ == 0)
                    fprintf(stderr, "fleet-bench: %s\n", err);
            } else {
                w->admitted += t.admitted;
            }
            w->calls++;
            freeReplyObject(r);
        }
        if (o->pipeline == 1) {
            if (w->n_lat == w->cap_lat) {
                w->cap_lat = w->cap_lat ? 2 * w->cap_lat : 4096;
                w->lat_us = realloc(w->lat_us, sizeof *w->lat_us * (size_t)w->cap_lat);
            }
            w->lat_us[w->n_lat++] = (now_s() - t0) * 1e6;
        }
    }
    redisFree(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static const char *arg_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "fleet-bench: %s needs a value\n", argv[*i]);
        exit(2);
    }
    return argv[++*i];
}

int main(int argc, char **argv)
{
    struct opts o = {.port = 0, .clients = 4, .tenants = 1, .seconds = 5, .pipeline = 1};
    for (int i = 1; i < argc; i++) {
        int *dst = strcmp(argv[i], "--port") == 0       ? &o.port
                   : strcmp(argv[i], "--clients") == 0  ? &o.clients
                   : strcmp(argv[i], "--tenants") == 0  ? &o.tenants
                   : strcmp(argv[i], "--seconds") == 0  ? &o.seconds
                   : strcmp(argv[i], "--pipeline") == 0 ? &o.pipeline
                                                        : NULL;
        if (!dst) {
            fprintf(stderr, "usage: fleet-bench --port PORT [--clients N] [--tenants N] "
                            "[--seconds N] [--pipeline N]\n");
            return 2;
        }
        *dst = atoi(arg_value(argc, argv, &i));
    }
    if (o.port < 1 || o.clients < 1 || o.clients > 256 || o.tenants < 1 || o.seconds < 1 ||
        o.pipeline < 1 || o.pipeline > 1024) {
        fprintf(stderr, "fleet-bench: --port is required; the counts must be positive\n");
        return 2;
    }
    redisContext *c = redisConnect("127.0.0.1", o.port);
    if (!c || c->err) {
        fprintf(stderr, "fleet-bench: connect: %s\n", c ? c->errstr : "no memory");
        return 1;
    }
    freeReplyObject(redisCommand(c, "SCRIPT LOAD %s", sl_fleet_take_lua));
    freeReplyObject(redisCommand(c, "CONFIG RESETSTAT"));
    struct worker *w = calloc((size_t)o.clients, sizeof *w);
    pthread_t *th = calloc((size_t)o.clients, sizeof *th);
    double t0 = now_s();
    for (int i = 0; i < o.clients; i++) {
        w[i] = (struct worker){.o = &o, .seed = 12345u + (unsigned)i};
        pthread_create(&th[i], NULL, run, &w[i]);
    }
    long calls = 0, admitted = 0, errors = 0, n_lat = 0;
    for (int i = 0; i < o.clients; i++) {
        pthread_join(th[i], NULL);
        calls += w[i].calls;
        admitted += w[i].admitted;
        errors += w[i].errors;
        n_lat += w[i].n_lat;
    }
    double secs = now_s() - t0;
    double *lat = malloc(sizeof *lat * (size_t)(n_lat ? n_lat : 1));
    long k = 0;
    for (int i = 0; i < o.clients; i++) {
        memcpy(lat + k, w[i].lat_us, sizeof *lat * (size_t)w[i].n_lat);
        k += w[i].n_lat;
        free(w[i].lat_us);
    }
    qsort(lat, (size_t)n_lat, sizeof *lat, cmp_double);
    /* Redis's own time per call of the script. */
    double usec_per_call = -1;
    redisReply *r = redisCommand(c, "INFO commandstats");
    if (r && r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, "cmdstat_evalsha:");
        const char *u = p ? strstr(p, "usec_per_call=") : NULL;
        if (u)
            usec_per_call = atof(u + strlen("usec_per_call="));
    }
    freeReplyObject(r);
    redisFree(c);
    printf("clients %d  pipeline %d  tenants %d  %.1f s: %ld takes, %.0f takes/s, %.1f %% "
           "admitted, %ld errors; redis %.2f us per call",
           o.clients, o.pipeline, o.tenants, secs, calls, (double)calls / secs,
           calls ? 100.0 * (double)admitted / (double)calls : 0.0, errors, usec_per_call);
    if (n_lat)
        printf("; round trip p50 %.0f us, p99 %.0f us", lat[n_lat / 2], lat[n_lat * 99 / 100]);
    printf("\n");
    free(lat);
    free(w);
    free(th);
    return errors ? 1 : 0;
}
