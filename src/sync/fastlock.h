/* The inline uncontended fast path of the robust mutexes (fastlock.c says
 * why and how it stays glibc's own protocol). Included by the sync files
 * whose lock and unlock are on a hot path, and by the ring's producers
 * (src/ipc/ring.c), which take their sender lock once per message. */
#ifndef MPROC_SYNC_FASTLOCK_H
#define MPROC_SYNC_FASTLOCK_H

#include "sync/sync_internal.h"

#include <linux/futex.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MP__TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define MP__TSAN 1
#endif

#if defined(__GLIBC__) && defined(__PTHREAD_MUTEX_HAVE_PREV) && !defined(MP__TSAN) &&          \
    (defined(__x86_64__) || defined(__aarch64__))
#define MP__FAST_LOCKS 1
#else
#define MP__FAST_LOCKS 0
#endif

/* The fast paths are a few instructions each: inlined wherever they are
 * called, or the call would cost what they save. */
#define MP__FAST_INLINE static inline __attribute__((always_inline))

#if MP__FAST_LOCKS

/* The kernel's struct robust_list_head (linux/futex.h), as registered by
 * glibc for every thread. */
typedef struct mp__rhead {
    void *list;
    long futex_offset;
    void *list_op_pending;
} mp__rhead;

/* The calling thread as the fast paths need it. */
typedef struct mp__fast_thread {
    mp__rhead *head;
    pid_t pid, tid;
} mp__fast_thread;

/* Where glibc keeps each thread's robust-list head and tid: at fixed
 * offsets from the thread pointer (inside glibc's struct pthread, the same
 * for every thread of the process), found and checked once per process
 * (fastlock.c). The fast paths read them there, with no thread-local
 * variable: a thread-local in a library that may be dlopened is reached
 * through __tls_get_addr, which the compiler treats as a call, and the
 * registers saved around it cost as much as the rest of an uncontended
 * lock. */
typedef struct mp__fast_layout {
    long head_off, tid_off;
    pid_t pid; /* of this process (a forked child checks again) */
    int ready; /* 1 checked and usable, -1 not usable, 0 unchecked, 2 being
                * checked by another thread */
} mp__fast_layout;
extern mp__fast_layout mp__fast_proc;

/* Checks the layout (once per process and per fork); NULL when the fast
 * paths are not usable, else t filled in. */
const mp__fast_thread *mp__fast_thread_check(mp__fast_thread *t);

MP__FAST_INLINE char *mp__thread_pointer(void)
{
#if defined(__x86_64__)
    char *tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#else
    return __builtin_thread_pointer();
#endif
}

MP__FAST_INLINE const mp__fast_thread *mp__fast_fill(mp__fast_thread *t)
{
    char *tp = mp__thread_pointer();
    t->head = (mp__rhead *)(tp + mp__fast_proc.head_off);
    t->tid = *(const pid_t *)(tp + mp__fast_proc.tid_off);
    t->pid = mp__fast_proc.pid;
    return t;
}

/* The calling thread when the layout is checked and usable, else NULL
 * without checking it: the public fast paths call nothing, and their slow
 * paths run the check (mp__fast_self) and try the fast path again. */
MP__FAST_INLINE const mp__fast_thread *mp__fast_ready(mp__fast_thread *t)
{
    return __builtin_expect(__atomic_load_n(&mp__fast_proc.ready, __ATOMIC_ACQUIRE) == 1, 1)
               ? mp__fast_fill(t)
               : NULL;
}

MP__FAST_INLINE const mp__fast_thread *mp__fast_self(mp__fast_thread *t)
{
    int ready = __atomic_load_n(&mp__fast_proc.ready, __ATOMIC_ACQUIRE);
    if (__builtin_expect(ready == 1, 1))
        return mp__fast_fill(t);
    return ready == 0 ? mp__fast_thread_check(t) : NULL;
}

/* A mutex's node is the address of its __list.__next; the list links hold
 * such addresses (bit 0 set marks a PI mutex), MP__LIST_OF gives back the
 * __pthread_list_t around one. */
#define MP__NODE(m) ((void *)&(m)->__data.__list.__next)
#define MP__LIST_OF(p)                                                                     \
    ((__pthread_list_t *)((char *)((uintptr_t)(p) & ~(uintptr_t)1) -                      \
                          offsetof(__pthread_list_t, __next)))

/* MP__HEAD_PREV: glibc keeps a __prev slot for the list head too (its
 * struct pthread's robust_prev, just before the head), writes it when the
 * first node changes, and never reads it: a node's __prev is read only
 * when that node is unlinked, and the head is never unlinked (the kernel
 * follows __next only). The fast paths leave it, a store fewer each way;
 * every link that is read is written as glibc writes it. */

/* Compiler barriers where glibc has them: the kernel reads the list and
 * the pending slot only when this thread dies, so only the order of the
 * stores as this thread issues them matters. */
#define MP__BARRIER() atomic_signal_fence(memory_order_seq_cst)

/* The rare ends of the fast paths, out of line (fastlock.c) so that the
 * fast paths call nothing: mp__fast_wake wakes one waiter on m's word,
 * which the caller just released, then clears h's pending slot;
 * mp__fast_give_back releases m, just taken but not recoverable, the same
 * way and returns false. */
void mp__fast_wake(pthread_mutex_t *m, mp__rhead *h);
bool mp__fast_give_back(pthread_mutex_t *m, mp__rhead *h);

/* glibc's __owner holds a tid, 0, or (above any tid) one of its markers
 * PTHREAD_MUTEX_INCONSISTENT (held after EOWNERDEAD, not yet made
 * consistent) and PTHREAD_MUTEX_NOTRECOVERABLE (free, but unusable). For a
 * robust mutex that is not recursive, glibc compares __owner only with
 * those markers (and pthread_mutex_consistent with the first), never with
 * a tid, and reads __count and __nusers only for recursive and non-robust
 * mutexes. So the fast paths leave those three fields alone: a free mutex
 * may keep a stale tid in __owner, which nothing reads. Every field that
 * the kernel reads at a thread's death (the word, the list, the pending
 * slot) is written exactly as glibc writes it. */
#define MP__OWNER_MARKER(m) ((uint32_t)(m)->__data.__owner > FUTEX_TID_MASK)

enum { MP__FAST_BUSY = 0, MP__FAST_TAKEN = 1, MP__FAST_GIVE_BACK = -1 };

/* Takes m (made by mp__robust_init: robust, not recursive) when it is free
 * and consistent: MP__FAST_TAKEN. MP__FAST_BUSY: not free (nothing done);
 * MP__FAST_GIVE_BACK: taken but not recoverable, and the caller must give
 * it back with mp__fast_give_back. In both cases glibc's
 * pthread_mutex_*lock must take it. (Callers whose fast path must call
 * nothing hand the give-back to their slow path; others use
 * mp__fast_lock.) */
MP__FAST_INLINE int mp__fast_try(pthread_mutex_t *m, const mp__fast_thread *t)
{
    if (!t)
        return MP__FAST_BUSY;
    mp__rhead *h = t->head;
    int zero = 0;
    h->list_op_pending = MP__NODE(m);
    MP__BARRIER();
    if (__builtin_expect(!__atomic_compare_exchange_n(&m->__data.__lock, &zero, t->tid, false,
                                                      __ATOMIC_ACQUIRE, __ATOMIC_RELAXED),
                         0)) {
        h->list_op_pending = NULL;
        return MP__FAST_BUSY;
    }
    if (__builtin_expect(MP__OWNER_MARKER(m), 0))
        return MP__FAST_GIVE_BACK;
    void *first = h->list;
    /* glibc links the old first node (or the head itself, its unread
     * robust_prev, see MP__HEAD_PREV) back to m, and m to them; m's own
     * links, which a fast release leaves, are usually right already: a
     * load instead of a store, which the release's swap would wait for. */
    if (first != (void *)h)
        MP__LIST_OF(first)->__prev = MP__NODE(m);
    if (m->__data.__list.__next != first || m->__data.__list.__prev != (void *)h) {
        m->__data.__list.__next = first;
        m->__data.__list.__prev = (void *)h;
    }
    MP__BARRIER();
    h->list = MP__NODE(m);
    MP__BARRIER();
    h->list_op_pending = NULL;
    return MP__FAST_TAKEN;
}

/* mp__fast_try, giving back what it must: true when it took m. */
MP__FAST_INLINE bool mp__fast_lock(pthread_mutex_t *m, const mp__fast_thread *t)
{
    int r = mp__fast_try(m, t);
    if (__builtin_expect(r == MP__FAST_GIVE_BACK, 0))
        return mp__fast_give_back(m, t->head);
    return r == MP__FAST_TAKEN;
}

/* Whether t holds m consistently: its tid in the word, and __owner no
 * marker (held after EOWNERDEAD and not made consistent: glibc's unlock
 * marks it not recoverable). */
MP__FAST_INLINE bool mp__fast_holds(const pthread_mutex_t *m, const mp__fast_thread *t)
{
    return ((uint32_t)__atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED) & FUTEX_TID_MASK) ==
               (uint32_t)t->tid &&
           !MP__OWNER_MARKER(m);
}

/* Releases m, which t holds consistently (mp__fast_holds said so). True
 * when a waiter must be woken: then the caller must call mp__fast_wake
 * (which also clears the pending slot). */
MP__FAST_INLINE bool mp__fast_release_held(pthread_mutex_t *m, const mp__fast_thread *t)
{
    mp__rhead *h = t->head;
    h->list_op_pending = MP__NODE(m);
    MP__BARRIER();
    void *nx = m->__data.__list.__next, *pv = m->__data.__list.__prev;
    if (nx != (void *)h) /* the head's robust_prev is never read (MP__HEAD_PREV) */
        MP__LIST_OF(nx)->__prev = pv;
    MP__LIST_OF(pv)->__next = nx;
    MP__BARRIER();
    /* (glibc also clears the node's own links, __owner and __nusers;
     * nothing reads them before the next lock writes them, see above, and
     * every store here delays the swap) */
    if (__builtin_expect(__atomic_exchange_n(&m->__data.__lock, 0, __ATOMIC_RELEASE) &
                             FUTEX_WAITERS,
                         0))
        return true;
    MP__BARRIER();
    h->list_op_pending = NULL;
    return false;
}

/* Releases m when t holds it consistently, waking a waiter itself; false
 * otherwise: then pthread_mutex_unlock must release it (and report what is
 * wrong). */
MP__FAST_INLINE bool mp__fast_unlock(pthread_mutex_t *m, const mp__fast_thread *t)
{
    if (!t || !mp__fast_holds(m, t))
        return false;
    if (mp__fast_release_held(m, t))
        mp__fast_wake(m, t->head);
    return true;
}

#else /* !MP__FAST_LOCKS: every lock through glibc */

typedef struct mp__fast_thread {
    pid_t pid, tid;
} mp__fast_thread;

MP__FAST_INLINE const mp__fast_thread *mp__fast_self(mp__fast_thread *t)
{
    (void)t;
    return NULL;
}
MP__FAST_INLINE const mp__fast_thread *mp__fast_ready(mp__fast_thread *t)
{
    (void)t;
    return NULL;
}
MP__FAST_INLINE bool mp__fast_holds(const pthread_mutex_t *m, const mp__fast_thread *t)
{
    (void)m, (void)t;
    return false;
}
MP__FAST_INLINE bool mp__fast_release_held(pthread_mutex_t *m, const mp__fast_thread *t)
{
    (void)m, (void)t;
    return false;
}
enum { MP__FAST_BUSY = 0, MP__FAST_TAKEN = 1, MP__FAST_GIVE_BACK = -1 };
MP__FAST_INLINE int mp__fast_try(pthread_mutex_t *m, const mp__fast_thread *t)
{
    (void)m, (void)t;
    return MP__FAST_BUSY;
}
MP__FAST_INLINE bool mp__fast_lock(pthread_mutex_t *m, const mp__fast_thread *t)
{
    (void)m, (void)t;
    return false;
}
MP__FAST_INLINE bool mp__fast_unlock(pthread_mutex_t *m, const mp__fast_thread *t)
{
    (void)m, (void)t;
    return false;
}

#endif /* MP__FAST_LOCKS */

#endif
