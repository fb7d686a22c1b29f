/* Pools still running when the program exits normally are terminated before
 * the process layer's exit handler joins the children, as Python's Pool
 * finalizer does: otherwise that handler would wait forever for workers
 * that wait for tasks. Their unfinished tasks are lost, as in Python;
 * close and join a pool to finish them. */
#include "pool/pool_internal.h"
#include "process/process_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t live_released = PTHREAD_COND_INITIALIZER;
static mp__link *live;

/* Held only around list updates, never around a fork or a wait, so a fork
 * in another thread cannot leave a child with it locked. */
static void atfork_prepare(void) { pthread_mutex_lock(&live_lock); }
static void atfork_release(void) { pthread_mutex_unlock(&live_lock); }

/* Exit from one of p's callbacks runs on p's handler thread, which cannot
 * wait for itself: its workers are killed instead, and the process layer
 * reaps them. */
static void stop_from_own_handler(mp_pool *p)
{
    for (int i = 0; i < p->nprocs; i++)
        if (p->w[i].proc)
            mp_process_kill(p->w[i].proc);
}

static void terminate_live_pools(void)
{
    mp_pool **mine = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&live_lock);
    for (mp__link *l = live; l; l = l->next) {
        mp_pool *p = l->self;
        if (p->owner != getpid())
            continue; /* a pool of the parent this process was forked from */
        if (n == cap) {
            mp_pool **bigger = realloc(mine, (cap = cap ? 2 * cap : 8) * sizeof *mine);
            if (!bigger)
                break;
            mine = bigger;
        }
        p->exit_hold = true; /* another thread's mp_pool_destroy waits for us */
        mine[n++] = p;
    }
    pthread_mutex_unlock(&live_lock);
    for (size_t i = 0; i < n; i++) {
        if (pthread_equal(pthread_self(), mine[i]->thread)) {
            stop_from_own_handler(mine[i]);
        } else {
            mp_pool_terminate(mine[i]);
            mp_pool_join(mine[i]); /* the pool stays the user's to destroy */
        }
        pthread_mutex_lock(&live_lock);
        mine[i]->exit_hold = false;
        pthread_cond_broadcast(&live_released);
        pthread_mutex_unlock(&live_lock);
    }
    free(mine);
}

static void register_once(void)
{
    static const mp__fork_handlers h = {atfork_prepare, atfork_release, atfork_release};
    mp__atfork_register(MP__FORK_POOL_LIST, &h);
    mp__process_on_exit(terminate_live_pools);
}

void mp__pool_track(mp_pool *p)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_once);
    pthread_mutex_lock(&live_lock);
    p->owner = getpid();
    mp__link_push(&live, &p->live_link, p);
    pthread_mutex_unlock(&live_lock);
}

void mp__pool_untrack(mp_pool *p)
{
    pthread_mutex_lock(&live_lock);
    /* A destroy racing the exit handler (another thread, while the program
     * exits) frees p only once the handler is done with it. A child forked
     * meanwhile inherits the flag, but no handler of its own will clear it. */
    while (p->exit_hold && p->owner == getpid())
        pthread_cond_wait(&live_released, &live_lock);
    mp__link_remove(&live, &p->live_link);
    pthread_mutex_unlock(&live_lock);
}
