/* The calling process's and thread's ids, cached: getpid() and gettid() are
 * system calls in glibc >= 2.25, and they sat on hot paths (every lock
 * acquire, every segment export and release, every shm manager report).
 * Cached per thread and forgotten in a forked child (its only thread is the
 * one that called fork). A child made by a raw clone() or _Fork() skips
 * atfork handlers and must not call into mproc before it execs. */
#include "os/os.h"

#include <pthread.h>
#include <unistd.h>

static _Thread_local pid_t cached_tid, cached_pid;

static void forget_ids(void) { cached_tid = cached_pid = 0; }

static void register_atfork(void)
{
    static const mp__fork_handlers h = {NULL, NULL, forget_ids};
    mp__atfork_register(MP__FORK_IDS, &h);
}

static void cache_ids(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_atfork);
    cached_pid = getpid();
    cached_tid = gettid();
}

pid_t mp__tid(void)
{
    if (!cached_tid)
        cache_ids();
    return cached_tid;
}

pid_t mp__pid(void)
{
    if (!cached_tid)
        cache_ids();
    return cached_pid;
}
