/* The library's one pthread_atfork handler. Layers register what they must
 * do around fork (hold a mutex across it so no child inherits it locked,
 * forget cached ids) at a fixed level, and the handler runs them in the
 * written lock order of mp__fork_level, whatever order the layers were first
 * used in: prepare takes the locks outermost first, parent and child
 * release them in reverse. */
#include "os/os.h"

#include <pthread.h>
#include <stdatomic.h>

static const mp__fork_handlers *_Atomic table[MP__FORK_LEVELS];
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* The handlers this thread's fork ran prepare for: parent and child run
 * those, not the table's, so a level registered by another thread while
 * the fork is under way is not released without having been taken. */
static _Thread_local const mp__fork_handlers *prepared[MP__FORK_LEVELS];

static void prepare(void)
{
    for (int i = 0; i < MP__FORK_LEVELS; i++) {
        const mp__fork_handlers *h = atomic_load(&table[i]);
        prepared[i] = h;
        if (h && h->prepare)
            h->prepare();
    }
}

static void parent(void)
{
    for (int i = MP__FORK_LEVELS - 1; i >= 0; i--) {
        const mp__fork_handlers *h = prepared[i];
        if (h && h->parent)
            h->parent();
    }
}

static void child(void)
{
    for (int i = MP__FORK_LEVELS - 1; i >= 0; i--) {
        const mp__fork_handlers *h = prepared[i];
        if (h && h->child)
            h->child();
    }
}

static void install(void) { pthread_atfork(prepare, parent, child); }

void mp__atfork_register(mp__fork_level level, const mp__fork_handlers *h)
{
    pthread_once(&once, install);
    atomic_store(&table[level], h);
}
