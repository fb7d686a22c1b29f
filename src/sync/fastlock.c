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
 * thread, and glibc registered it), so the steps on the word, the list and
 * the pending slot must be exactly glibc's
 * (nptl/descr.h ENQUEUE_MUTEX_BOTH / DEQUEUE_MUTEX: a list linked through
 * the __next field of each mutex's __list, with __prev links that glibc
 * follows and the kernel ignores, and the head's own __prev just before
 * it). Nothing here relies on that on faith: before the first fast
 * acquisition of a process, one thread locks and unlocks a probe mutex
 * through glibc and checks every link it expects glibc to have written,
 * then checks that glibc unlocks a probe this code locked and the other
 * way round. Where any check
 * fails (another libc, another layout, a sanitizer that must see the
 * pthread calls) every lock goes through glibc as before.
 *
 * Anything but a free, consistent mutex (held, owner died, not recoverable,
 * waiters) takes glibc's path, which handles it. */
#include "sync/fastlock.h"

#include <errno.h>

#if MP__FAST_LOCKS

mp__fast_layout mp__fast_proc;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A forked child has a new pid (and its thread a new tid, which glibc
 * wrote into its struct pthread, and a fresh robust list): check again. No
 * lock is taken, so the order against the library's other fork handlers
 * (src/os/atfork.c) does not matter. */
static void forked_child(void) { __atomic_store_n(&mp__fast_proc.ready, 0, __ATOMIC_RELEASE); }
static void register_atfork(void) { pthread_atfork(NULL, NULL, forked_child); }

void mp__fast_wake(pthread_mutex_t *m, mp__rhead *h)
{
    /* Shared mutex: a non-private wake, as glibc gives a pshared one. */
    syscall(SYS_futex, &m->__data.__lock, FUTEX_WAKE, 1, NULL, NULL, 0);
    MP__BARRIER();
    h->list_op_pending = NULL;
}

/* PTHREAD_MUTEX_NOTRECOVERABLE: give the word back (waking anyone who
 * queued meanwhile); glibc's lock then says ENOTRECOVERABLE. */
bool mp__fast_give_back(pthread_mutex_t *m, mp__rhead *h)
{
    if (__atomic_exchange_n(&m->__data.__lock, 0, __ATOMIC_RELEASE) & FUTEX_WAITERS) {
        mp__fast_wake(m, h);
        return false;
    }
    MP__BARRIER();
    h->list_op_pending = NULL;
    return false;
}

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
    return probe->__data.__lock == 0;
}

/* Finds the robust-list head and the tid of the calling thread at fixed
 * offsets from its thread pointer (glibc's struct pthread: the tid lies 16
 * bytes before the head, with robust_prev between) and checks them: the
 * head is the one registered with the kernel and the tid is gettid's. */
static bool find_layout(mp__fast_layout *lay, mp__rhead **head)
{
    mp__rhead *h = NULL;
    size_t len = 0;
    char *tp = mp__thread_pointer();
    if (syscall(SYS_get_robust_list, 0, &h, &len) != 0 || !h || len != sizeof *h ||
        h->futex_offset != (long)offsetof(pthread_mutex_t, __data.__lock) -
                               (long)offsetof(pthread_mutex_t, __data.__list.__next) ||
        h->list_op_pending != NULL)
        return false;
    lay->head_off = (char *)h - tp;
    lay->tid_off = lay->head_off - (long)(sizeof(void *) + 2 * sizeof(pid_t));
    lay->pid = mp__pid();
    *head = h;
    return *(const pid_t *)(tp + lay->tid_off) == mp__tid() && lay->head_off > -65536 &&
           lay->head_off < 65536;
}

/* ThreadSanitizer's runtime, when this process has it: present even where
 * libmproc itself was built without -fsanitize=thread (a TSan program
 * linking the ordinary library, or tests that instrument one layer).
 * TSan intercepts pthread_mutex_* and would see a fast lock's glibc
 * unlock as the release of a mutex nobody locked, starting with the probe
 * below. */
extern void __tsan_init(void) __attribute__((weak));

static int check_layout(void)
{
    mp__fast_layout lay;
    mp__fast_thread t;
    mp__rhead *h;
    pthread_mutexattr_t a;
    pthread_mutex_t probe;
    bool ok = false;
    if (__tsan_init || !find_layout(&lay, &h))
        return -1;
    t.head = h;
    t.pid = lay.pid;
    t.tid = mp__tid();
    if (pthread_mutexattr_init(&a) != 0)
        return -1;
    if (pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) == 0 &&
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK) == 0 &&
        pthread_mutex_init(&probe, &a) == 0) {
        ok = probe_glibc_links(h, &probe, t.tid) && probe_mixed(h, &probe, &t);
        pthread_mutex_destroy(&probe);
    }
    pthread_mutexattr_destroy(&a);
    if (!ok)
        return -1;
    mp__fast_proc.head_off = lay.head_off;
    mp__fast_proc.tid_off = lay.tid_off;
    mp__fast_proc.pid = lay.pid;
    return 1;
}

/* One thread checks (ready 0 -> 2 -> 1 or -1); others meanwhile take
 * glibc's path. */
const mp__fast_thread *mp__fast_thread_check(mp__fast_thread *t)
{
    int ready = 0;
    pthread_once(&atfork_once, register_atfork);
    if (__atomic_compare_exchange_n(&mp__fast_proc.ready, &ready, 2, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        ready = check_layout();
        __atomic_store_n(&mp__fast_proc.ready, ready, __ATOMIC_RELEASE);
    }
    return ready == 1 ? mp__fast_fill(t) : NULL;
}

bool mp__robust_fast_available(void)
{
    mp__fast_thread t;
    return mp__fast_self(&t) != NULL;
}

#else

bool mp__robust_fast_available(void) { return false; }

#endif
