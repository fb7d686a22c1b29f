/* The uncontended fast path of the robust mutexes: the same steps glibc's
 * pthread_mutex_lock and _unlock take for a free robust mutex, inline.
 *
 * Why: glibc reaches a robust mutex through __pthread_mutex_lock_full, a
 * switch over every mutex kind, and its unlock through the matching
 * _unlock_full; for an uncontended lock that dispatch cost as much as the
 * lock itself (an acquire+release took 2x a bare futex mutex). The work a
 * robust lock must do is small: announce the mutex in the thread's
 * list_op_pending slot, take the futex word with one compare-and-swap, link
 * the mutex into the thread's robust list (which the kernel walks when the
 * thread dies, marking each held word FUTEX_OWNER_DIED), clear the slot.
 *
 * The list and the slot are glibc's (the kernel keeps one robust list per
 * thread, and glibc registered it), so the steps must be exactly glibc's
 * (nptl/descr.h ENQUEUE_MUTEX_BOTH / DEQUEUE_MUTEX: a list linked through
 * the __next field of each mutex's __list, with __prev links that glibc
 * follows and the kernel ignores, and the head's own __prev just before
 * it). Nothing here relies on that on faith: each thread, before its first
 * fast acquisition, locks and unlocks a probe mutex through glibc and checks
 * every link it expects glibc to have written, then checks that glibc
 * unlocks a probe this code locked and the other way round. Where any check
 * fails (another libc, another layout, a sanitizer that must see the
 * pthread calls) every lock goes through glibc as before.
 *
 * Anything but a free, consistent mutex (held, owner died, not recoverable,
 * waiters) takes glibc's path, which handles it. */
#include "sync/fastlock.h"

#include <errno.h>

#if MP__FAST_LOCKS

_Thread_local mp__fast_thread mp__fast_me;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A forked child's one thread (the one that called fork) has a new tid and
 * a fresh robust list: check it again. No lock is taken, so the order
 * against the library's other fork handlers (src/os/atfork.c) does not
 * matter. */
static void forked_child(void) { mp__fast_me.usable = 0; }
static void register_atfork(void) { pthread_atfork(NULL, NULL, forked_child); }

/* glibc locks a probe: the links must be what mp__fast_lock writes. */
static bool probe_glibc_links(mp__rhead *h, pthread_mutex_t *probe, pid_t tid)
{
    void *old = h->list;
    __pthread_list_t *first = MP__LIST_OF(old);
    bool ok;
    if (pthread_mutex_lock(probe) != 0)
        return false;
    ok = h->list == MP__NODE(probe) && probe->__data.__list.__next == old &&
         probe->__data.__list.__prev == (void *)h && first->__prev == MP__NODE(probe) &&
         probe->__data.__owner == tid && (uint32_t)probe->__data.__lock == (uint32_t)tid &&
         h->list_op_pending == NULL;
    if (pthread_mutex_unlock(probe) != 0)
        return false;
    return ok && h->list == old && first->__prev == (void *)h;
}

/* Each implementation releases what the other took. */
static bool probe_mixed(mp__rhead *h, pthread_mutex_t *probe, const mp__fast_thread *t)
{
    void *old = h->list;
    if (!mp__fast_lock(probe, t) || h->list != MP__NODE(probe) ||
        pthread_mutex_unlock(probe) != 0 || h->list != old)
        return false;
    if (pthread_mutex_lock(probe) != 0 || !mp__fast_unlock(probe, t) || h->list != old)
        return false;
    return probe->__data.__lock == 0 && probe->__data.__owner == 0;
}

static int check_thread(mp__fast_thread *t)
{
    mp__rhead *h = NULL;
    size_t len = 0;
    pthread_mutexattr_t a;
    pthread_mutex_t probe;
    bool ok = false;
    t->pid = mp__pid();
    t->tid = mp__tid();
    if (syscall(SYS_get_robust_list, 0, &h, &len) != 0 || !h || len != sizeof *h ||
        h->futex_offset != (long)offsetof(pthread_mutex_t, __data.__lock) -
                               (long)offsetof(pthread_mutex_t, __data.__list.__next) ||
        h->list_op_pending != NULL)
        return -1;
    t->head = h;
    if (pthread_mutexattr_init(&a) != 0)
        return -1;
    if (pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) == 0 &&
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK) == 0 &&
        pthread_mutex_init(&probe, &a) == 0) {
        ok = probe_glibc_links(h, &probe, t->tid) && probe_mixed(h, &probe, t);
        pthread_mutex_destroy(&probe);
    }
    pthread_mutexattr_destroy(&a);
    return ok ? 1 : -1;
}

const mp__fast_thread *mp__fast_thread_check(void)
{
    if (mp__fast_me.usable == 0) {
        pthread_once(&atfork_once, register_atfork);
        mp__fast_me.usable = check_thread(&mp__fast_me);
    }
    return mp__fast_me.usable > 0 ? &mp__fast_me : NULL;
}

bool mp__robust_fast_available(void) { return mp__fast_self() != NULL; }

#else

bool mp__robust_fast_available(void) { return false; }

#endif
