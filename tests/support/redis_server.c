#include "redis_server.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static bool answers_ping(int port)
{
    redisContext *c = redisConnect("127.0.0.1", port);
    bool up = false;
    if (c && !c->err) {
        redisReply *r = redisCommand(c, "PING");
        up = r && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
    }
    redisFree(c);
    return up;
}

bool redis_server_start(struct redis_server *s)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        return false;
    if (!s->port)
        s->port = free_port();
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    s->pid = fork();
    if (s->pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    cr_assert_gt(s->pid, 0);
    for (int i = 0; i < 500; i++) { /* up to 5 s for it to listen */
        if (answers_ping(s->port))
            return true;
        int st;
        cr_assert_eq(waitpid(s->pid, &st, WNOHANG), 0, "redis-server exited");
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    cr_assert_fail("redis-server did not answer PING on port %d", s->port);
    return false;
}

void redis_server_stop(struct redis_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGCONT); /* a test may have paused it */
        kill(s->pid, SIGTERM);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
}
