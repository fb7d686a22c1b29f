/* Robust process-shared mutexes, holder/member tokens, and the sleep that
 * wakes on a token owner's death.
 *
 * Death detection: a token is a robust mutex its thread keeps locked. When
 * the thread's process dies, the kernel walks the robust list, sets
 * FUTEX_OWNER_DIED in the mutex word and, when FUTEX_WAITERS is set, wakes
 * one futex waiter on that word. A sleeper sets FUTEX_WAITERS on each token
 * word itself (what a blocked pthread_mutex_lock would do; the owner's
 * unlock then wakes too, which is harmless) and waits on the object's word
 * and all token words at once with futex_waitv (Linux >= 5.16). Without
 * futex_waitv it sleeps on the object's word alone and a death is noticed at
 * the next wake-up or at the deadline. */
#include "sync/fastlock.h"

#include <errno.h>
#include <linux/futex.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
#ifndef FUTEX_32
#define FUTEX_32 2
#endif
#ifndef FUTEX_WAITV_MAX
#define FUTEX_WAITV_MAX 128
struct futex_waitv {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t __reserved;
};
#endif

/* glibc keeps the robust futex word first in pthread_mutex_t. */
#if defined(__GLIBC__)
#define TOKEN_WORDS 1
_Static_assert(offsetof(pthread_mutex_t, __data.__lock) == 0, "robust word first");
#else
#define TOKEN_WORDS 0
#endif

static atomic_int waitv_missing; /* set once futex_waitv said ENOSYS */


int mp__robust_init(pthread_mutex_t *m, int type, const char *call)
{
    pthread_mutexattr_t a;
    int kinds[] = {PTHREAD_MUTEX_NORMAL, PTHREAD_MUTEX_ERRORCHECK, PTHREAD_MUTEX_RECURSIVE};
    int err = pthread_mutexattr_init(&a);
    if (!err)
        err = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (!err)
        err = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    if (!err)
        err = pthread_mutexattr_settype(&a, kinds[type]);
    if (!err)
        err = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return err ? mp__errno_error(err, "%s: pthread_mutex_init", call) : 0;
}

int mp__robust_lock(pthread_mutex_t *m, double deadline)
{
    struct timespec ts;
    if (deadline < 0)
        return pthread_mutex_lock(m);
    /* An expired deadline still takes a free mutex: glibc tries first. */
    ts = mp__deadline_timespec(deadline);
    return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts);
}

void mp__guard_lock(pthread_mutex_t *m)
{
    mp__fast_thread t;
    if (mp__fast_lock(m, mp__fast_self(&t)))
        return;
    if (pthread_mutex_lock(m) == EOWNERDEAD)
        pthread_mutex_consistent(m);
}

void mp__guard_unlock(pthread_mutex_t *m)
{
    mp__fast_thread t;
    if (!mp__fast_unlock(m, mp__fast_self(&t)))
        pthread_mutex_unlock(m);
}

bool mp__mutex_held(const pthread_mutex_t *m)
{
    return mp__mutex_dead_holder(m) || mp__mutex_live_holder(m);
}

pid_t mp__mutex_holder_tid(const pthread_mutex_t *m)
{
#if TOKEN_WORDS
    const _Atomic uint32_t *w = (const _Atomic uint32_t *)(const void *)m;
    return (pid_t)(atomic_load_explicit(w, memory_order_relaxed) & FUTEX_TID_MASK);
#else
    (void)m;
    return 0;
#endif
}

bool mp__mutex_live_holder(const pthread_mutex_t *m) { return mp__mutex_holder_tid(m) != 0; }

bool mp__mutex_dead_holder(const pthread_mutex_t *m)
{
#if TOKEN_WORDS
    /* The kernel clears the owner's tid when it marks the owner dead, and
     * sets FUTEX_OWNER_DIED until the next locker takes the word: the lock
     * is still taken (the next acquire gets MP_EOWNERDEAD). */
    const _Atomic uint32_t *w = (const _Atomic uint32_t *)(const void *)m;
    uint32_t v = atomic_load_explicit(w, memory_order_relaxed);
    return (v & FUTEX_OWNER_DIED) && !(v & FUTEX_TID_MASK);
#else
    (void)m;
    return false;
#endif
}

/* ---- tokens --------------------------------------------------------------- */

int mp__tokens_init(mp__token *t, int n, const char *call)
{
    for (int i = 0; i < n; i++) {
        int rc = mp__robust_init(&t[i].mutex, MP__MUTEX_NORMAL, call);
        if (rc)
            return rc;
    }
    return 0;
}

int mp__token_self(mp__token *t, int n)
{
    pid_t pid = mp__pid(), tid = mp__tid();
    for (int i = 0; i < n; i++)
        if (t[i].used && t[i].pid == pid && t[i].tid == tid)
            return i;
    return -1;
}

int mp__token_claim(mp__token *t, int n)
{
    for (int i = 0; i < n; i++) {
        if (t[i].used)
            continue;
        /* A free token is unlocked; EOWNERDEAD cannot occur since a token
         * is freed only after its owner-dead state was cleared, but be
         * tolerant of a process that died between claim steps. */
        int err = pthread_mutex_trylock(&t[i].mutex);
        if (err == EOWNERDEAD)
            pthread_mutex_consistent(&t[i].mutex);
        else if (err)
            continue;
        t[i].used = 1;
        t[i].pid = mp__pid();
        t[i].tid = mp__tid();
        t[i].count = 0;
        return i;
    }
    return -1;
}

void mp__token_drop(mp__token *t, int i)
{
    t[i].used = 0;
    t[i].count = 0;
    pthread_mutex_unlock(&t[i].mutex);
}

int mp__tokens_reap(mp__token *t, int n, uint32_t *reclaimed)
{
    int dead = 0;
    pid_t pid = mp__pid(), tid = mp__tid();
    for (int i = 0; i < n; i++) {
        if (!t[i].used || (t[i].pid == pid && t[i].tid == tid))
            continue;
        int err = pthread_mutex_trylock(&t[i].mutex);
        if (err == EBUSY)
            continue; /* its owner lives */
        if (err == EOWNERDEAD) {
            pthread_mutex_consistent(&t[i].mutex);
            dead++;
        } else if (err) {
            continue;
        }
        /* Owner dead, or (err == 0) a slot whose owner vanished without
         * unlocking through us (its thread ended): reclaim either way. */
        if (reclaimed)
            *reclaimed += t[i].count;
        if (err == 0)
            dead++;
        t[i].used = 0;
        t[i].count = 0;
        pthread_mutex_unlock(&t[i].mutex);
    }
    return dead;
}

int mp__tokens_leave(mp__token *t, int n)
{
    int others = 0;
    pid_t pid = mp__pid(), tid = mp__tid();
    for (int i = 0; i < n; i++) {
        if (!t[i].used || t[i].pid != pid)
            continue;
        if (t[i].tid == tid)
            mp__token_drop(t, i);
        else
            others++;
    }
    return others;
}

/* ---- sleeping ------------------------------------------------------------- */

/* Sets FUTEX_WAITERS on a live owner's token word; returns the word's value
 * to wait for, or 0 when the token is unlocked or its owner already died
 * (nothing to wait on: the caller should re-check at once). */
static uint32_t token_arm(mp__token *tok)
{
    _Atomic uint32_t *w = (_Atomic uint32_t *)(void *)&tok->mutex;
    uint32_t v = atomic_load(w);
    for (;;) {
        if ((v & FUTEX_TID_MASK) == 0 || (v & FUTEX_OWNER_DIED))
            return 0;
        if (v & FUTEX_WAITERS)
            return v;
        if (atomic_compare_exchange_weak(w, &v, v | FUTEX_WAITERS))
            return v | FUTEX_WAITERS;
    }
}

static int sleep_waitv(_Atomic uint32_t *word, uint32_t expected, mp__token *t, int n,
                       double deadline, pthread_mutex_t *guard)
{
    struct futex_waitv wv[FUTEX_WAITV_MAX];
    struct timespec ts, *tsp = NULL;
    pid_t pid = mp__pid(), tid = mp__tid();
    int nw = 1;
    long r;

    wv[0] = (struct futex_waitv){expected, (uintptr_t)word, FUTEX_32, 0};
    for (int i = 0; i < n && nw < FUTEX_WAITV_MAX; i++) {
        if (!t[i].used || (t[i].pid == pid && t[i].tid == tid))
            continue;
        uint32_t v = token_arm(&t[i]);
        if (v == 0) {
            mp__guard_unlock(guard);
            mp__guard_lock(guard);
            return 0; /* a death to reap now */
        }
        wv[nw++] = (struct futex_waitv){v, (uintptr_t)&t[i].mutex, FUTEX_32, 0};
    }
    if (deadline >= 0) {
        ts = mp__deadline_timespec(deadline);
        tsp = &ts;
    }
    mp__guard_unlock(guard);
    r = syscall(SYS_futex_waitv, wv, nw, 0, tsp, CLOCK_MONOTONIC);
    int err = r < 0 ? errno : 0;
    mp__guard_lock(guard);
    if (r >= 0 || err == EAGAIN || err == EINTR)
        return 0;
    if (err == ETIMEDOUT)
        return MP_ETIMEDOUT;
    if (err == ENOSYS) {
        atomic_store(&waitv_missing, 1);
        return 0;
    }
    return mp__errno_error(err, "futex_waitv");
}

int mp__sync_sleep(pthread_mutex_t *guard, _Atomic uint32_t *word, uint32_t expected,
                   mp__token *t, int n, double deadline)
{
    int rc;
    if (deadline >= 0 && mp__now() >= deadline)
        return MP_ETIMEDOUT;
    if (TOKEN_WORDS && n > 0 && !atomic_load(&waitv_missing))
        return sleep_waitv(word, expected, t, n, deadline, guard);
    mp__guard_unlock(guard);
    rc = mp__futex_wait((uint32_t *)word, expected, deadline, true);
    mp__guard_lock(guard);
    return rc;
}
