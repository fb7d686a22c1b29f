/* mproc — cross-process synchronization: Lock, RLock, Semaphore,
 * BoundedSemaphore, Event, Condition, Barrier.
 *
 * Each object lives in its own small shared-memory segment (a sealed memfd)
 * and works between every process that reaches it: children inherit it
 * under fork, and it travels as a message attachment (mp_msg_add_lock, ...)
 * under every start method — the segment's fd crosses, never a pointer.
 *
 * Handles are refcounted per process, as every refcounted mproc object:
 * _create returns one reference, _retain adds one, _release drops one (the
 * last unmaps the segment in this process; the object itself lives on
 * while any process maps it). All calls are safe from several threads, and
 * a handle is usable in a forked child. NULL passed to _release is a
 * no-op. So _release never unlocks: Python's acquire()/release() are
 * _lock/_unlock here (C11's mtx_lock/mtx_unlock), and a semaphore's are
 * _wait/_post (POSIX sem_wait/sem_post).
 *
 * Timeouts are in seconds: negative waits forever, 0 tries once. A wait
 * that runs out returns MP_ETIMEDOUT. Nothing busy-waits: waiters sleep in
 * the kernel (futexes, process-shared robust pthread mutexes). A signal
 * handler that runs during a wait does not end it (docs/errors.md).
 *
 * Robust to death. Locks are held by a thread (the one that locked
 * them); when the holder's process dies, the kernel marks the lock and the
 * next thread to lock it gets it with MP_EOWNERDEAD: the data it protects
 * may be half-updated. Repair it, then call mp_*_consistent(); unlocking
 * without doing so leaves the lock permanently unusable (MP_EBROKEN), as
 * POSIX robust mutexes do. Semaphore permits are held by the thread that
 * took them too; a dead holder's permits are returned and the waiter that
 * takes one of them gets MP_EOWNERDEAD (nothing to mark). A Barrier whose member
 * dies is broken: every waiter returns MP_EBROKEN. Death is noticed through
 * kernel-held tokens (a robust mutex per holder or member), never through
 * heartbeats.
 */
#ifndef MPROC_SYNC_H
#define MPROC_SYNC_H

#include <stdbool.h>
#include <stddef.h>

#include "mproc/error.h"
#include "mproc/msg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_lock mp_lock;
typedef struct mp_rlock mp_rlock;
typedef struct mp_semaphore mp_semaphore;
typedef struct mp_event mp_event;
typedef struct mp_condition mp_condition;
typedef struct mp_barrier mp_barrier;

/* How many threads may hold permits of one semaphore at once, and how many
 * threads may be members of one barrier over its life at once. */
#define MP_SYNC_HOLDERS_MAX 64

/* ---- Lock: a non-recursive mutual-exclusion lock ------------------------ */

/* Creates an unlocked lock. MP_ENOMEM, MP_EMFILE, MP_ENOSPC, MP_ESYS. */
MP_API int mp_lock_create(mp_lock **out);
MP_API mp_lock *mp_lock_retain(mp_lock *l);
/* Drops a reference; it never unlocks (that is mp_lock_unlock). */
MP_API void mp_lock_release(mp_lock *l);
/* Locks it (Python's acquire), blocking up to timeout seconds. 0; MP_EOWNERDEAD: held
 * now, but its previous holder died holding it (call mp_lock_consistent
 * once the protected data is repaired); MP_ETIMEDOUT; MP_ESTATE: the
 * calling thread holds it already (use an RLock); MP_EBROKEN: the lock was
 * left unrecoverable; MP_EINVAL. */
MP_API int mp_lock_lock(mp_lock *l, double timeout);
/* Unlocks it (Python's release). Only the thread that locked it may: MP_EPERM when
 * another thread or process holds it, MP_ESTATE when nobody does. Never
 * blocks. */
MP_API int mp_lock_unlock(mp_lock *l);
/* After MP_EOWNERDEAD: marks the lock consistent again. MP_ESTATE when the
 * caller does not hold it or it was not inconsistent. */
MP_API int mp_lock_consistent(mp_lock *l);
/* Whether the lock is taken now (a snapshot; false for NULL). A lock whose holder
 * died holding it counts as taken until someone locks it (that
 * lock returns MP_EOWNERDEAD); unlocking it meanwhile fails with
 * MP_EPERM naming the dead holder. */
MP_API bool mp_lock_locked(const mp_lock *l);

/* ---- RLock: a recursive lock, owned by a thread ------------------------- */

/* Creates an unlocked RLock; _retain/_release as for every object here. */
MP_API int mp_rlock_create(mp_rlock **out);
MP_API mp_rlock *mp_rlock_retain(mp_rlock *l);
MP_API void mp_rlock_release(mp_rlock *l);
/* As mp_lock_lock, but the owner may lock again (depth + 1). */
MP_API int mp_rlock_lock(mp_rlock *l, double timeout);
/* Drops one level; the last one unlocks. MP_EPERM: owned by another thread
 * or process; MP_ESTATE: not owned at all. */
MP_API int mp_rlock_unlock(mp_rlock *l);
MP_API int mp_rlock_consistent(mp_rlock *l);
/* The calling thread's depth (0 when it does not own the lock). */
MP_API int mp_rlock_depth(const mp_rlock *l);

/* ---- Semaphore and BoundedSemaphore ------------------------------------- */

/* A counting semaphore with `value` permits: mp_semaphore_wait takes one
 * (Python's acquire), mp_semaphore_post gives one (Python's release). A
 * bounded one refuses a post that would take the count above `value`
 * (MP_EOVERFLOW). Posting without having waited is allowed (it adds a
 * permit), but a permit taken by a thread counts as held by it until it
 * posts one: if its process dies first, the permit is returned. So to
 * signal between processes use an Event, a Condition or a queue rather
 * than post-here/wait-there. */
MP_API int mp_semaphore_create(unsigned value, mp_semaphore **out);
MP_API int mp_bounded_semaphore_create(unsigned value, mp_semaphore **out);
MP_API mp_semaphore *mp_semaphore_retain(mp_semaphore *s);
MP_API void mp_semaphore_release(mp_semaphore *s);
/* Takes one permit, blocking up to timeout seconds. 0; MP_EOWNERDEAD: got a
 * permit after permits of a dead holder were returned; MP_ETIMEDOUT;
 * MP_EOVERFLOW: MP_SYNC_HOLDERS_MAX other threads hold permits already. */
MP_API int mp_semaphore_wait(mp_semaphore *s, double timeout);
/* Gives one permit back and wakes one waiter; never blocks. MP_EOVERFLOW:
 * a bounded semaphore would exceed its initial value, or the count would
 * pass INT32_MAX. */
MP_API int mp_semaphore_post(mp_semaphore *s);
/* Permits available now (a snapshot), or a negative mp_error. */
MP_API int mp_semaphore_value(const mp_semaphore *s);

/* ---- Event: a flag that waiters sleep on -------------------------------- */

/* Creates a clear Event; _retain/_release as for every object here. */
MP_API int mp_event_create(mp_event **out);
MP_API mp_event *mp_event_retain(mp_event *e);
MP_API void mp_event_release(mp_event *e);
/* Sets the flag and wakes every waiter. Never blocks. */
MP_API int mp_event_set(mp_event *e);
/* Clears the flag. */
MP_API int mp_event_clear(mp_event *e);
/* Whether the flag is set (a snapshot); false for NULL. */
MP_API bool mp_event_is_set(const mp_event *e);
/* Blocks until the flag is set: 0, or MP_ETIMEDOUT. */
MP_API int mp_event_wait(mp_event *e, double timeout);

/* ---- Condition: a condition variable with its own recursive lock -------- */

/* Creates a Condition; _retain/_release as for every object here. */
MP_API int mp_condition_create(mp_condition **out);
MP_API mp_condition *mp_condition_retain(mp_condition *c);
MP_API void mp_condition_release(mp_condition *c);
/* The lock, as mp_rlock_lock / _unlock / _consistent. */
MP_API int mp_condition_lock(mp_condition *c, double timeout);
MP_API int mp_condition_unlock(mp_condition *c);
MP_API int mp_condition_consistent(mp_condition *c);
/* Releases the lock (every level), sleeps until notified or timeout, then
 * takes the lock back at the same depth, whatever the outcome. 0 when
 * notified; MP_ETIMEDOUT; MP_EOWNERDEAD when the lock came back from a
 * dead holder; MP_EPERM when the caller does not hold the lock. Wake-ups
 * are not FIFO and, rarely, spurious: wait in a loop over your predicate
 * (or use mp_condition_wait_for). */
MP_API int mp_condition_wait(mp_condition *c, double timeout);
/* Waits until pred(arg) returns true (checked with the lock held, first
 * before waiting) or timeout seconds pass in all: 0 or MP_ETIMEDOUT, or an
 * error of mp_condition_wait. */
MP_API int mp_condition_wait_for(mp_condition *c, bool (*pred)(void *arg), void *arg,
                                 double timeout);
/* Wakes up to n waiters / every waiter. The caller must hold the lock
 * (MP_EPERM otherwise). Never blocks. */
MP_API int mp_condition_notify(mp_condition *c, int n);
MP_API int mp_condition_notify_all(mp_condition *c);

/* ---- Barrier: `parties` threads meet, round after round ----------------- */

/* A thread becomes a member at its first wait and stays one until it drops
 * its process's last handle; a member that dies (its process ends) while
 * others wait breaks the barrier. */
MP_API int mp_barrier_create(unsigned parties, mp_barrier **out);

/* Python's Barrier(parties, action, timeout). The action is run by exactly
 * one party, the last to arrive, before any party of that round is
 * released, in whichever process that party lives; it takes no argument
 * (Python's action neither) and must not use the barrier itself. It must
 * live in the program or in a library that every process using the barrier
 * loads (it is found again by its place in that file, so spawn and
 * forkserver children run their own copy). Non-zero from the action breaks
 * the barrier: every party of the round gets MP_EBROKEN. */
typedef int (*mp_barrier_action_fn)(void);
typedef struct mp_barrier_options {
    size_t size;                 /* sizeof(mp_barrier_options), set by _init */
    mp_barrier_action_fn action; /* NULL: none (default) */
    double timeout; /* what mp_barrier_wait(b, MP_BARRIER_DEFAULT_TIMEOUT, ..)
                     * waits: seconds, negative forever (default -1) */
} mp_barrier_options;
/* Passed as mp_barrier_wait's timeout: the barrier's default (Python's
 * wait(timeout=None)). */
#define MP_BARRIER_DEFAULT_TIMEOUT (__builtin_nan(""))
/* Fills *o with the defaults (no action, wait forever) and sets its size. */
MP_API void mp_barrier_options_init(mp_barrier_options *o);
/* As mp_barrier_create, with options (NULL: the defaults). MP_EINVAL: bad
 * parties, options not initialized, a NaN timeout, or an action that is
 * not in the code of a loaded program or library. */
MP_API int mp_barrier_create_ex(unsigned parties, const mp_barrier_options *o, mp_barrier **out);
MP_API mp_barrier *mp_barrier_retain(mp_barrier *b);
MP_API void mp_barrier_release(mp_barrier *b);
/* Waits until `parties` threads have called it; *index (may be NULL) gets
 * the arrival order, 0 .. parties-1. MP_EBROKEN: the barrier is or became
 * broken (a member died, another waiter timed out, mp_barrier_abort or
 * mp_barrier_reset); MP_ETIMEDOUT: this waiter ran out of time, and broke
 * the barrier for the others; MP_EOVERFLOW: too many members. timeout
 * MP_BARRIER_DEFAULT_TIMEOUT waits the barrier's default timeout. The last
 * party to arrive runs the barrier's action first (MP_EBROKEN for every
 * party when it fails). */
MP_API int mp_barrier_wait(mp_barrier *b, double timeout, unsigned *index);
/* Breaks the barrier: current and later waiters get MP_EBROKEN until reset. */
MP_API int mp_barrier_abort(mp_barrier *b);
/* Back to the initial state; threads waiting now get MP_EBROKEN. */
MP_API int mp_barrier_reset(mp_barrier *b);
/* parties; threads waiting now (or a negative mp_error for NULL); whether
 * it is broken (false for NULL). */
MP_API int mp_barrier_parties(const mp_barrier *b);
MP_API int mp_barrier_n_waiting(const mp_barrier *b);
MP_API bool mp_barrier_broken(const mp_barrier *b);

/* ---- as message attachments ---------------------------------------------
 * add retains the object; get returns a new reference (release it), and
 * MP_EINVAL when attachment `index` is of another kind. The receiver maps
 * the same shared object. */
MP_API int mp_msg_add_lock(mp_msg *m, const char *name, mp_lock *l);
MP_API int mp_msg_get_lock(const mp_msg *m, size_t index, mp_lock **out);
MP_API int mp_msg_add_rlock(mp_msg *m, const char *name, mp_rlock *l);
MP_API int mp_msg_get_rlock(const mp_msg *m, size_t index, mp_rlock **out);
MP_API int mp_msg_add_semaphore(mp_msg *m, const char *name, mp_semaphore *s);
MP_API int mp_msg_get_semaphore(const mp_msg *m, size_t index, mp_semaphore **out);
MP_API int mp_msg_add_event(mp_msg *m, const char *name, mp_event *e);
MP_API int mp_msg_get_event(const mp_msg *m, size_t index, mp_event **out);
MP_API int mp_msg_add_condition(mp_msg *m, const char *name, mp_condition *c);
MP_API int mp_msg_get_condition(const mp_msg *m, size_t index, mp_condition **out);
MP_API int mp_msg_add_barrier(mp_msg *m, const char *name, mp_barrier *b);
MP_API int mp_msg_get_barrier(const mp_msg *m, size_t index, mp_barrier **out);

#ifdef __cplusplus
}
#endif
#endif
