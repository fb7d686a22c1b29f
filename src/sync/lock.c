/* Lock and RLock: a robust, error-checking, process-shared pthread mutex
 * plus the owner and depth written beside it, so that misuse (unlock of an
 * unheld lock, unlock by another thread) gets a precise sentence and an
 * RLock counts its depth without a second mutex. */
#include "sync/fastlock.h"

#include <errno.h>
#include <math.h>
#include <unistd.h>

struct mp_lock {
    mp__sync s;
};
struct mp_rlock {
    mp__sync s;
};

/* The lock starts a cache line of its own: the mutex word, the robust-list
 * links and the owner fields (56 bytes) are all written by every acquire
 * and release, and split over two lines they cost a second line move
 * between CPUs per acquisition when two processes take turns. */
typedef struct lock_shared {
    mp__sync_hdr hdr;
    _Alignas(64) mp__olock lock;
} lock_shared;
_Static_assert(sizeof(mp__olock) <= 64, "an olock fits one cache line");

/* ---- the owned lock ----------------------------------------------------- */

int mp__olock_init(mp__olock *l, const char *call)
{
    l->depth = 1; /* a free lock's depth: the fast acquire need not write it */
    return mp__robust_init(&l->mutex, MP__MUTEX_ERRORCHECK, call);
}

MP__FAST_INLINE uint64_t owner_word(pid_t pid, pid_t tid)
{
    return (uint64_t)(uint32_t)pid << 32 | (uint32_t)tid;
}

static pid_t owner_pid(const mp__olock *l)
{
    return (pid_t)(atomic_load_explicit(&l->owner, memory_order_relaxed) >> 32);
}

static pid_t owner_tid(const mp__olock *l)
{
    return (pid_t)(uint32_t)atomic_load_explicit(&l->owner, memory_order_relaxed);
}

/* Whether the calling thread holds l. The owner field says who took it
 * last; the fast release leaves it (a store fewer on the path every
 * acquisition takes), so with fast locks the futex word, which holds the
 * holder's tid, says whether that holder still holds it. */
bool mp__olock_mine(const mp__olock *l)
{
    mp__fast_thread me;
    const mp__fast_thread *t = mp__fast_self(&me);
    pid_t pid = t ? t->pid : mp__pid(), tid = t ? t->tid : mp__tid();
    return atomic_load_explicit(&l->owner, memory_order_relaxed) == owner_word(pid, tid) &&
           (!MP__FAST_LOCKS || mp__mutex_holder_tid(&l->mutex) == tid);
}

static void set_owner(mp__olock *l, pid_t pid, pid_t tid)
{
    atomic_store_explicit(&l->owner, owner_word(pid, tid), memory_order_relaxed);
}

/* The uncontended acquire, inline in the public calls: a free lock needs
 * no owner check (the swap fails when the caller holds it already), and
 * its depth is 1 already (every release leaves it so). The owner field is
 * written only when it changed: a lock taken again by the thread that
 * released it last (the usual case) costs no store beyond the robust
 * mutex's own. Returns as mp__fast_try. */
MP__FAST_INLINE int fast_try_acquire(mp__olock *l, const mp__fast_thread *t)
{
    int r = mp__fast_try(&l->mutex, t);
    if (__builtin_expect(r != MP__FAST_TAKEN, 0))
        return r;
    uint64_t me = owner_word(t->pid, t->tid);
    if (__builtin_expect(atomic_load_explicit(&l->owner, memory_order_relaxed) != me, 0))
        atomic_store_explicit(&l->owner, me, memory_order_relaxed);
    return MP__FAST_TAKEN;
}

static bool fast_acquire(mp__olock *l, const mp__fast_thread *t)
{
    int r = fast_try_acquire(l, t);
    if (r == MP__FAST_GIVE_BACK)
        mp__fast_give_back(&l->mutex, t->head);
    return r == MP__FAST_TAKEN;
}

enum { FAST_RELEASED = 0, FAST_WAKE = 1, FAST_NO = -1 };

/* The release of a lock the calling thread holds once, inline. It leaves
 * the owner field and the depth of 1 (mp__olock_mine checks the word). The
 * word says whether this thread holds it (its tid); a Lock held is always
 * at depth 1, an RLock's depth is checked. FAST_WAKE: released, a waiter
 * must be woken (mp__fast_wake); FAST_NO: the general path must release
 * it. */
MP__FAST_INLINE int fast_try_release(mp__olock *l, const mp__fast_thread *t, bool recursive)
{
    if (!t || (recursive && l->depth != 1) || !mp__fast_holds(&l->mutex, t))
        return FAST_NO;
    return mp__fast_release_held(&l->mutex, t) ? FAST_WAKE : FAST_RELEASED;
}

int mp__olock_lock(mp__olock *l, bool recursive, double timeout, const char *call)
{
    int err, dead_pid;
    mp__fast_thread me;
    if (fast_acquire(l, mp__fast_self(&me)))
        return 0;
    if (mp__olock_mine(l)) {
        if (!recursive)
            return mp__error(MP_ESTATE, "%s: the calling thread holds this lock already; "
                             "it is not recursive (use an RLock)", call);
        if (l->depth == UINT32_MAX)
            return mp__error(MP_EOVERFLOW, "%s: recursion depth overflow", call);
        l->depth++;
        return 0;
    }
    dead_pid = owner_pid(l);
    err = mp__robust_lock(&l->mutex, mp__deadline(timeout));
    switch (err) {
    case 0:
    case EOWNERDEAD:
        set_owner(l, mp__pid(), mp__tid());
        l->depth = 1;
        if (err == 0)
            return 0;
        l->inconsistent = 1;
        return mp__error(MP_EOWNERDEAD, "%s: locked, but the previous holder (pid %d) "
                         "died holding it; repair what it protects, then mark it "
                         "consistent", call, dead_pid);
    case ETIMEDOUT:
        return mp__error(MP_ETIMEDOUT, "%s: not locked within %g s", call, timeout);
    case ENOTRECOVERABLE:
        return mp__error(MP_EBROKEN, "%s: the lock is unrecoverable: after its holder died "
                         "it was unlocked without being marked consistent", call);
    case EDEADLK:
        return mp__error(MP_ESTATE, "%s: the calling thread holds this lock already", call);
    default:
        return mp__errno_error(err, "%s: pthread_mutex_clocklock", call);
    }
}

int mp__olock_unlock(mp__olock *l, const char *call)
{
    int err;
    if (!mp__olock_mine(l)) {
        pid_t pid = owner_pid(l);
        if (mp__mutex_dead_holder(&l->mutex))
            return mp__error(MP_EPERM, "%s: the lock's holder (pid %d) died holding it; "
                             "lock it (MP_EOWNERDEAD), repair the data it protects and "
                             "call the _consistent function", call, pid);
        if (owner_tid(l) == 0 ||
            !mp__mutex_live_holder(&l->mutex))
            return mp__error(MP_ESTATE, "%s: the lock is not held", call);
        return mp__error(MP_EPERM, "%s: the lock is held by another thread (pid %d); only "
                         "the thread that locked it may unlock it", call, pid);
    }
    if (l->depth > 1) {
        l->depth--;
        return 0;
    }
    set_owner(l, 0, 0); /* the depth stays 1, a free lock's */
    err = pthread_mutex_unlock(&l->mutex);
    if (err)
        return mp__errno_error(err, "%s: pthread_mutex_unlock", call);
    return 0;
}

int mp__olock_consistent(mp__olock *l, const char *call)
{
    int err;
    if (!mp__olock_mine(l))
        return mp__error(MP_ESTATE, "%s: the calling thread does not hold the lock", call);
    if (!l->inconsistent)
        return mp__error(MP_ESTATE, "%s: the lock is not inconsistent (only after "
                         "MP_EOWNERDEAD)", call);
    err = pthread_mutex_consistent(&l->mutex);
    if (err)
        return mp__errno_error(err, "%s: pthread_mutex_consistent", call);
    l->inconsistent = 0;
    return 0;
}

/* ---- Lock ------------------------------------------------------------------ */

static mp__olock *olock_of(const mp__sync *s)
{
    return &((lock_shared *)mp__sync_base(s))->lock;
}

static int create(int kind, const char *call, mp__sync **out)
{
    mp__sync *s;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "%s: out is NULL", call);
    *out = NULL;
    rc = mp__sync_new(kind, sizeof(lock_shared), call, &s);
    if (rc)
        return rc;
    rc = mp__olock_init(olock_of(s), call);
    if (rc) {
        mp__sync_release(s, NULL);
        return rc;
    }
    *out = s;
    return 0;
}

/* A handle dropped while its thread holds the lock would leave a robust
 * list entry pointing into an unmapped page: unlock it first. */
static void unmap_hook(mp__sync *s)
{
    mp__olock *l = olock_of(s);
    if (mp__olock_mine(l)) {
        l->depth = 1;
        mp__olock_unlock(l, "mp_(r)lock_release");
    }
}

void mp__lock_obj_release(void *obj) { mp__sync_release(obj, unmap_hook); }
void mp__rlock_obj_release(void *obj) { mp__sync_release(obj, unmap_hook); }

int mp_lock_create(mp_lock **out)
{
    return create(MP_ATTACH_LOCK, "mp_lock_create", (mp__sync **)out);
}

mp_lock *mp_lock_retain(mp_lock *l)
{
    if (l)
        mp__sync_retain(&l->s);
    return l;
}

void mp_lock_release(mp_lock *l) { mp__sync_release(l ? &l->s : NULL, unmap_hook); }

/* The public calls' paths past the inline one: the handle and timeout
 * checks, the calling thread's first check (mp__fast_self), a lock that is
 * held, recursive, not recoverable or left by a dead holder, a waiter to
 * wake. Out of line and reached by tail calls only, so that the fast paths
 * call nothing and save no register. */
static __attribute__((noinline)) int acquire_slow(mp__sync *s, int fast, bool recursive,
                                                  double timeout, const char *call)
{
    mp__fast_thread me;
    if (fast == MP__FAST_GIVE_BACK)
        mp__fast_give_back(&olock_of(s)->mutex, mp__fast_self(&me)->head);
    MP__CHECK_HANDLE(s, call);
    int rc = mp__check_timeout(timeout, call);
    return rc ? rc : mp__olock_lock(olock_of(s), recursive, timeout, call);
}

static __attribute__((noinline)) int release_slow(mp__sync *s, int fast, bool recursive,
                                                  const char *call)
{
    mp__fast_thread me;
    const mp__fast_thread *t = mp__fast_self(&me);
    if (fast == FAST_WAKE) {
        mp__fast_wake(&olock_of(s)->mutex, t->head);
        return 0;
    }
    MP__CHECK_HANDLE(s, call);
    fast = fast_try_release(olock_of(s), t, recursive);
    if (fast == FAST_WAKE)
        mp__fast_wake(&olock_of(s)->mutex, t->head);
    if (fast != FAST_NO)
        return 0;
    return mp__olock_unlock(olock_of(s), call);
}

/* A NaN timeout is an error even for a free lock: checked before taking. */
MP__FAST_INLINE int public_fast_acquire(mp__sync *s, double timeout)
{
    mp__fast_thread me;
    const mp__fast_thread *t = mp__fast_ready(&me);
    if (__builtin_expect(!s || !t || isnan(timeout), 0))
        return MP__FAST_BUSY;
    return fast_try_acquire(olock_of(s), t);
}

MP__FAST_INLINE int public_fast_release(mp__sync *s, bool recursive)
{
    mp__fast_thread me;
    return s ? fast_try_release(olock_of(s), mp__fast_ready(&me), recursive) : FAST_NO;
}

int mp_lock_lock(mp_lock *l, double timeout)
{
    int fast = public_fast_acquire((mp__sync *)l, timeout);
    if (__builtin_expect(fast == MP__FAST_TAKEN, 1))
        return 0;
    return acquire_slow((mp__sync *)l, fast, false, timeout, "mp_lock_lock");
}

int mp_lock_unlock(mp_lock *l)
{
    int fast = public_fast_release((mp__sync *)l, false);
    if (__builtin_expect(fast == FAST_RELEASED, 1))
        return 0;
    return release_slow((mp__sync *)l, fast, false, "mp_lock_unlock");
}

int mp_lock_consistent(mp_lock *l)
{
    MP__CHECK_HANDLE(l, "mp_lock_consistent");
    return mp__olock_consistent(olock_of(&l->s), "mp_lock_consistent");
}

bool mp_lock_locked(const mp_lock *l)
{
    if (!l) {
        mp__error(MP_EINVAL, "mp_lock_locked: the handle is NULL");
        return false;
    }
    return mp__mutex_held(&olock_of(&l->s)->mutex);
}

/* ---- RLock ----------------------------------------------------------------- */

int mp_rlock_create(mp_rlock **out)
{
    return create(MP_ATTACH_RLOCK, "mp_rlock_create", (mp__sync **)out);
}

mp_rlock *mp_rlock_retain(mp_rlock *l)
{
    if (l)
        mp__sync_retain(&l->s);
    return l;
}

void mp_rlock_release(mp_rlock *l) { mp__sync_release(l ? &l->s : NULL, unmap_hook); }

int mp_rlock_lock(mp_rlock *l, double timeout)
{
    int fast = public_fast_acquire((mp__sync *)l, timeout);
    if (__builtin_expect(fast == MP__FAST_TAKEN, 1))
        return 0;
    return acquire_slow((mp__sync *)l, fast, true, timeout, "mp_rlock_lock");
}

int mp_rlock_unlock(mp_rlock *l)
{
    int fast = public_fast_release((mp__sync *)l, true);
    if (__builtin_expect(fast == FAST_RELEASED, 1))
        return 0;
    return release_slow((mp__sync *)l, fast, true, "mp_rlock_unlock");
}

int mp_rlock_consistent(mp_rlock *l)
{
    MP__CHECK_HANDLE(l, "mp_rlock_consistent");
    return mp__olock_consistent(olock_of(&l->s), "mp_rlock_consistent");
}

int mp_rlock_depth(const mp_rlock *l)
{
    MP__CHECK_HANDLE(l, "mp_rlock_depth");
    const mp__olock *o = olock_of(&l->s);
    return mp__olock_mine(o) ? (int)o->depth : 0;
}
