/* Outboxes: many events in, one wake-up per step out. Events are recycled: the consumer gives a
 * whole wake-up's batch back at once (one lock), producers take spares one by one, and short
 * texts travel inside their event, so a streamed token costs no malloc or free on either side. */
#include "sched_impl.h"

#include <stdlib.h>
#include <string.h>

struct sl_outbox {
    pthread_mutex_t lock;
    struct sl_out_event *head, *tail;
    struct sl_out_event *spare; /* (n_spare) events to fill again */
    int n_spare;
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
    for (int list = 0; list < 2; list++) {
        struct sl_out_event *e = list ? o->spare : o->head;
        while (e) {
            struct sl_out_event *next = e->next;
            sl_out_event_free(e);
            e = next;
        }
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

/* What an event holds besides itself: its request reference, long text, log probabilities. */
static void event_release(struct sl_out_event *e)
{
    sl_req_unref(e->req);
    if (e->text != e->inline_text)
        free(e->text);
    free(e->lp);
    e->req = NULL;
    e->text = NULL;
    e->lp = NULL;
}

void sl_out_event_free(struct sl_out_event *e)
{
    if (!e)
        return;
    event_release(e);
    free(e);
}

void sl_outbox_recycle(struct sl_outbox *o, struct sl_out_event *list)
{
    if (!list)
        return;
    struct sl_out_event *last = NULL;
    int n = 0;
    for (struct sl_out_event *e = list; e; e = e->next) {
        event_release(e);
        last = e;
        n++;
    }
    pthread_mutex_lock(&o->lock);
    bool keep = o->n_spare + n <= SL_OUTBOX_SPARE;
    if (keep) {
        last->next = o->spare;
        o->spare = list;
        o->n_spare += n;
    }
    pthread_mutex_unlock(&o->lock);
    if (keep)
        return;
    /* A burst left more than the outbox keeps: the rest go back to the allocator. */
    while (list) {
        struct sl_out_event *next = list->next;
        free(list);
        list = next;
    }
}

struct sl_out_event *sl_outbox_event(struct sl_outbox *o)
{
    pthread_mutex_lock(&o->lock);
    struct sl_out_event *e = o->spare;
    if (e) {
        o->spare = e->next;
        o->n_spare--;
    }
    pthread_mutex_unlock(&o->lock);
    if (!e)
        return sl_xcalloc(1, sizeof *e);
    memset(e, 0, offsetof(struct sl_out_event, inline_text));
    e->inline_text[0] = '\0';
    return e;
}

void sl_out_event_set_text(struct sl_out_event *e, const char *text, size_t len)
{
    if (len <= SL_OUT_INLINE) {
        memcpy(e->inline_text, text, len);
        e->inline_text[len] = '\0';
        e->text = e->inline_text;
    } else {
        e->text = sl_xstrndup(text, len);
    }
    e->len = len;
}
