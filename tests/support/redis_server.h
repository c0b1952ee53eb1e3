/* A redis-server for a test: started on a free loopback port with no persistence, its output
 * discarded, and waited for until it answers PING. Tests that need one skip, saying so, when
 * redis-server is not installed (scripts/setup.sh installs it). */
#ifndef SLUICE_TESTS_REDIS_SERVER_H
#define SLUICE_TESTS_REDIS_SERVER_H

#include <stdbool.h>
#include <sys/types.h>

struct redis_server {
    pid_t pid;
    int port;
};

/* Starts one (on s->port when it is set, else on a free port it picks); false when
 * redis-server is not installed. Fails the test when it does not come up. */
bool redis_server_start(struct redis_server *s);
/* SIGTERM, and waits for it. */
void redis_server_stop(struct redis_server *s);

#endif
