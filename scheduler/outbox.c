/* Outboxes: many events in, one wake-up per step out. */
#include "sched_impl.h"

#include <stdlib.h>

struct sl_outbox {
    pthread_mutex_t lock;
    struct sl_out_event *head, *tail;
    void (*wake)(void *arg);
    void *arg;
};

struct sl_outbox *sl_outbox_new(void (*wake)(void *arg), void *arg)
{
    struct sl_outbox *o = sl_xcalloc(1, sizeof *o);
    pthread_mutex_init(&o->lock, NULL);
    o->wake = wake;
    o->arg = arg;
    return o;
}

void sl_outbox_free(struct sl_outbox *o)
{
    if (!o)
        return;
    struct sl_out_event *e = o->head;
    while (e) {
        struct sl_out_event *next = e->next;
        sl_out_event_free(e);
        e = next;
    }
    pthread_mutex_destroy(&o->lock);
    free(o);
}

/* Producer side (scheduler thread); see sched.c. */
void sl_outbox_push(struct sl_outbox *o, struct sl_out_event *e)
{
    e->next = NULL;
    pthread_mutex_lock(&o->lock);
    if (o->tail)
        o->tail->next = e;
    else
        o->head = e;
    o->tail = e;
    pthread_mutex_unlock(&o->lock);
}

void sl_outbox_wake(struct sl_outbox *o)
{
    if (o->wake)
        o->wake(o->arg);
}

struct sl_out_event *sl_outbox_take(struct sl_outbox *o)
{
    pthread_mutex_lock(&o->lock);
    struct sl_out_event *e = o->head;
    o->head = o->tail = NULL;
    pthread_mutex_unlock(&o->lock);
    return e;
}

void sl_out_event_free(struct sl_out_event *e)
{
    if (!e)
        return;
    sl_req_unref(e->req);
    free(e->text);
    free(e->lp);
    free(e);
}
