/* The inline uncontended fast path of the robust mutexes (fastlock.c says
 * why and how it stays glibc's own protocol). Included by the sync files
 * whose lock and unlock are on a hot path. */
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

#if defined(__GLIBC__) && defined(__PTHREAD_MUTEX_HAVE_PREV) && !defined(MP__TSAN)
#define MP__FAST_LOCKS 1
#else
#define MP__FAST_LOCKS 0
#endif

#if MP__FAST_LOCKS

/* The kernel's struct robust_list_head (linux/futex.h), as registered by
 * glibc for every thread. */
typedef struct mp__rhead {
    void *list;
    long futex_offset;
    void *list_op_pending;
} mp__rhead;

typedef struct mp__fast_thread {
    mp__rhead *head;
    pid_t pid, tid;
    int usable; /* 1 checked and usable, -1 not usable, 0 unchecked (a forked
                 * child's thread is unchecked again: new tid, new list) */
} mp__fast_thread;

extern _Thread_local mp__fast_thread mp__fast_me;
/* Checks the calling thread (once per thread and per fork). */
const mp__fast_thread *mp__fast_thread_check(void);

static inline const mp__fast_thread *mp__fast_self(void)
{
    if (__builtin_expect(mp__fast_me.usable > 0, 1))
        return &mp__fast_me;
    return mp__fast_me.usable < 0 ? NULL : mp__fast_thread_check();
}

/* A mutex's node is the address of its __list.__next; the list links hold
 * such addresses (bit 0 set marks a PI mutex), MP__LIST_OF gives back the
 * __pthread_list_t around one. */
#define MP__NODE(m) ((void *)&(m)->__data.__list.__next)
#define MP__LIST_OF(p)                                                                     \
    ((__pthread_list_t *)((char *)((uintptr_t)(p) & ~(uintptr_t)1) -                      \
                          offsetof(__pthread_list_t, __next)))

/* Compiler barriers where glibc has them: the kernel reads the list and
 * the pending slot only when this thread dies, so only the order of the
 * stores as this thread issues them matters. */
#define MP__BARRIER() atomic_signal_fence(memory_order_seq_cst)

/* Takes m (made by mp__robust_init) when it is free and consistent;
 * false otherwise: then glibc's pthread_mutex_*lock must take it. */
static inline bool mp__fast_lock(pthread_mutex_t *m, const mp__fast_thread *t)
{
    if (!t)
        return false;
    mp__rhead *h = t->head;
    int zero = 0;
    h->list_op_pending = MP__NODE(m);
    MP__BARRIER();
    if (!__atomic_compare_exchange_n(&m->__data.__lock, &zero, t->tid, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED)) {
        h->list_op_pending = NULL;
        return false;
    }
    if (__builtin_expect(m->__data.__owner != 0, 0)) {
        /* PTHREAD_MUTEX_NOTRECOVERABLE: give the word back (waking anyone
         * who queued meanwhile) and let glibc say ENOTRECOVERABLE. */
        if (__atomic_exchange_n(&m->__data.__lock, 0, __ATOMIC_RELEASE) & FUTEX_WAITERS)
            syscall(SYS_futex, &m->__data.__lock, FUTEX_WAKE, 1, NULL, NULL, 0);
        MP__BARRIER();
        h->list_op_pending = NULL;
        return false;
    }
    m->__data.__count = 1;
    __pthread_list_t *next = MP__LIST_OF(h->list);
    next->__prev = MP__NODE(m);
    m->__data.__list.__next = h->list;
    m->__data.__list.__prev = (void *)h;
    MP__BARRIER();
    h->list = MP__NODE(m);
    MP__BARRIER();
    h->list_op_pending = NULL;
    m->__data.__owner = t->tid;
    m->__data.__nusers++;
    return true;
}

/* Releases m when t holds it consistently; false otherwise: then
 * pthread_mutex_unlock must release it (and report what is wrong). */
static inline bool mp__fast_unlock(pthread_mutex_t *m, const mp__fast_thread *t)
{
    if (!t)
        return false;
    mp__rhead *h = t->head;
    /* Not ours, or owner-died and not made consistent: glibc's unlock
     * (EPERM, or marking it not recoverable). */
    if (m->__data.__owner != t->tid ||
        ((uint32_t)__atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED) & FUTEX_TID_MASK) !=
            (uint32_t)t->tid)
        return false;
    h->list_op_pending = MP__NODE(m);
    MP__BARRIER();
    __pthread_list_t *next = MP__LIST_OF(m->__data.__list.__next);
    __pthread_list_t *prev = MP__LIST_OF(m->__data.__list.__prev);
    next->__prev = m->__data.__list.__prev;
    prev->__next = m->__data.__list.__next;
    MP__BARRIER();
    /* (glibc also clears the node's own links; nothing reads them before
     * the next lock writes them, and every store here delays the swap) */
    m->__data.__owner = 0;
    m->__data.__nusers--;
    /* Shared mutex: a non-private wake, as glibc gives a pshared one. */
    if (__atomic_exchange_n(&m->__data.__lock, 0, __ATOMIC_RELEASE) & FUTEX_WAITERS)
        syscall(SYS_futex, &m->__data.__lock, FUTEX_WAKE, 1, NULL, NULL, 0);
    MP__BARRIER();
    h->list_op_pending = NULL;
    return true;
}

#else /* !MP__FAST_LOCKS: every lock through glibc */

typedef struct mp__fast_thread {
    pid_t pid, tid;
} mp__fast_thread;

static inline const mp__fast_thread *mp__fast_self(void) { return NULL; }
static inline bool mp__fast_lock(pthread_mutex_t *m, const mp__fast_thread *t)
{
    (void)m, (void)t;
    return false;
}
static inline bool mp__fast_unlock(pthread_mutex_t *m, const mp__fast_thread *t)
{
    (void)m, (void)t;
    return false;
}

#endif /* MP__FAST_LOCKS */

#endif
