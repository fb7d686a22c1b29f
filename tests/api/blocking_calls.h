/* The blocking calls of the public API, one row each, with what makes
 * each block and what lets it finish: timeout_test runs every row with
 * each kind of timeout, and again with signals arriving throughout. */
#ifndef MPROC_TESTS_API_BLOCKING_CALLS_H
#define MPROC_TESTS_API_BLOCKING_CALLS_H

#include "mp_test.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stddef.h>


/* Everything a row may need; zeroed per case, released by one teardown. */
typedef struct fx {
    mp_queue *q;
    mp_simple_queue *sq;
    mp_conn *a, *b;
    mp_lock *lock;
    mp_rlock *rlock;
    mp_semaphore *sem;
    mp_event *ev;
    mp_condition *cond;
    mp_barrier *bar;
    mp_process *proc;
    mp_spawn_context *ctx;
    mp_pool *pool;
    mp_async_result *res;
    mp_imap *it;
    pthread_t holder;
    bool has_holder;
    sem_t held, go;
    int flag;
} fx;

typedef struct row {
    const char *name;
    void (*setup)(fx *f);
    int (*call)(fx *f, double timeout);
    void (*ready)(fx *f); /* makes the call able to complete */
    int not_ready;        /* what a poll or an expired wait returns */
    enum {
        FOREVER_ONLY,     /* the call takes no timeout */
        TIMED,            /* it takes one; NaN is refused */
        TIMED_NAN_DEFAULT /* NaN asks for the object's default timeout */
    } timeouts;
} row;

/* What conn poll's row returns when not ready (the query answers 0). */
enum { POLL_NOT_READY = 1 };

extern const row blocking_calls[];
extern const size_t blocking_calls_n;

/* Zeroes f and sets up r's objects, blocking the call. */
void setup_fx(fx *f, const row *r);
/* Joins the holder thread and children, releases every object. */
void teardown_fx(fx *f);

#endif
