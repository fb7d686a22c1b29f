/* Shared machinery of the sync objects: one sealed memfd segment per object,
 * robust process-shared mutexes, holder/member tokens, and a vectored futex
 * wait that wakes when a token's owner dies. */
#ifndef MPROC_SYNC_INTERNAL_H
#define MPROC_SYNC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "mproc/sync.h"
#include "os/os.h"

#define MP__SYNC_MAGIC 0x6d7073796e63ull /* "mpsync" */
#define MP__SYNC_VERSION 1u

/* First bytes of every segment; decode checks them before trusting more. */
typedef struct mp__sync_hdr {
    uint64_t magic;
    uint32_t version;
    uint32_t kind; /* mp_attach_kind */
    uint64_t size; /* bytes the segment was created with */
} mp__sync_hdr;

/* The process-local handle. The public types are this struct under their
 * own names (struct mp_lock is defined as it in each .c). */
typedef struct mp__sync {
    atomic_int refs;
    int kind;
    int fd; /* the segment, kept open to send it on */
    size_t size;
    void *base; /* the shared mapping; starts with mp__sync_hdr */
} mp__sync;

/* Every handle sits MP__SYNC_GAP bytes below its shared mapping (object.c),
 * so s->base == mp__sync_base(s), computed without a load. */
#define MP__SYNC_GAP 64
_Static_assert(sizeof(mp__sync) <= MP__SYNC_GAP, "a handle fits below its mapping");
static inline void *mp__sync_base(const mp__sync *s) { return (char *)s + MP__SYNC_GAP; }

/* Creates a zeroed segment of at least `size` bytes holding `kind` and a
 * handle over it. `call` names the public call for error sentences. */
int mp__sync_new(int kind, size_t size, const char *call, mp__sync **out);
void mp__sync_retain(mp__sync *s);
/* Drops one reference; the last one runs `unmap_hook` (may be NULL) with
 * the mapping still valid, then unmaps and closes. */
void mp__sync_release(mp__sync *s, void (*unmap_hook)(mp__sync *s));

/* The object-attachment descriptors (src/sync/object.c), and their
 * registration with the wire layer (idempotent; src/ipc/kinds.c calls it
 * before any message is decoded). */
extern const struct mp__objkind mp__lock_kind, mp__rlock_kind, mp__semaphore_kind,
    mp__event_kind, mp__condition_kind, mp__barrier_kind;
int mp__sync_kinds_register(void);

/* ---- robust mutexes ------------------------------------------------------ */

enum { MP__MUTEX_NORMAL = 0, MP__MUTEX_ERRORCHECK = 1, MP__MUTEX_RECURSIVE = 2 };
/* Initialises a process-shared robust mutex of the given type. */
int mp__robust_init(pthread_mutex_t *m, int type, const char *call);
/* pthread_mutex_clocklock(CLOCK_MONOTONIC) until deadline (< 0: forever,
 * 0: trylock). Returns the pthread code (0, EOWNERDEAD, ETIMEDOUT, ...). */
int mp__robust_lock(pthread_mutex_t *m, double deadline);
/* Locks an internal guard mutex (short critical sections only): a guard
 * left by a dead process is marked consistent at once, since every guarded
 * update is written so that a half-done one is harmless. */
void mp__guard_lock(pthread_mutex_t *m);
void mp__guard_unlock(pthread_mutex_t *m);

/* Whether the calling thread takes free robust mutexes inline instead of
 * through glibc (fastlock.h); tests check which path they exercised. */
bool mp__robust_fast_available(void);

/* Whether some live thread holds m (a racy snapshot). */
bool mp__mutex_held(const pthread_mutex_t *m);
/* Held by a live thread / left held by a holder that died (the kernel marked
 * the word FUTEX_OWNER_DIED and nobody took it since). mp__mutex_held: either. */
bool mp__mutex_live_holder(const pthread_mutex_t *m);
/* The tid in m's futex word: its live holder's, or 0 (free, or its holder
 * died); 0 where the word's layout is unknown (not glibc). */
pid_t mp__mutex_holder_tid(const pthread_mutex_t *m);
bool mp__mutex_dead_holder(const pthread_mutex_t *m);


/* ---- owned locks: the body of Lock, RLock and Condition ------------------ */
typedef struct mp__olock {
    pthread_mutex_t mutex; /* robust, error-checking */
    /* The last holder, pid << 32 | tid (mp__olock_mine): one word, so
     * that the fast acquire checks it with one load and compare. */
    _Atomic uint64_t owner;
    uint32_t depth; /* written by the owner only; 1 while the lock is free */
    uint32_t inconsistent;                 /* set on EOWNERDEAD until marked */
} mp__olock;

int mp__olock_init(mp__olock *l, const char *call);
/* Takes the lock; `recursive` lets the owner take it again. */
int mp__olock_lock(mp__olock *l, bool recursive, double timeout, const char *call);
int mp__olock_unlock(mp__olock *l, const char *call);
int mp__olock_consistent(mp__olock *l, const char *call);
/* Whether the calling thread owns l. */
bool mp__olock_mine(const mp__olock *l);
/* Checks a public call's handle argument: MP_EINVAL with a sentence. */
#define MP__CHECK_HANDLE(h, call)                                               \
    do {                                                                        \
        if (!(h))                                                               \
            return mp__error(MP_EINVAL, "%s: the handle is NULL", call);        \
    } while (0)

/* ---- tokens: one robust mutex per holder/member thread -------------------
 * A thread that holds semaphore permits, or is a barrier member, keeps its
 * token mutex locked. If its process dies, the kernel marks the mutex
 * owner-dead and wakes one futex waiter on it: that is how waiters learn of
 * the death without polling. Token tables are only changed under the
 * object's guard. */
typedef struct mp__token {
    pthread_mutex_t mutex;
    uint32_t used;
    int32_t pid, tid;
    uint32_t count; /* permits held (semaphore) */
} mp__token;

/* Initialises n tokens' mutexes. */
int mp__tokens_init(mp__token *t, int n, const char *call);
/* The caller thread's token, or -1. */
int mp__token_self(mp__token *t, int n);
/* Claims a free token for the calling thread (locks it): index or -1. */
int mp__token_claim(mp__token *t, int n);
/* Frees the calling thread's token i (unlocks it). */
void mp__token_drop(mp__token *t, int i);
/* Finds tokens whose owner died: frees each, adding its count to
 * *reclaimed; returns how many died. */
int mp__tokens_reap(mp__token *t, int n, uint32_t *reclaimed);
/* Drops every token of the calling thread; returns those of other live
 * threads of this process (which keep the mapping in use). */
int mp__tokens_leave(mp__token *t, int n);

/* ---- waiting ------------------------------------------------------------- */

/* Sleeps until *word != expected, or one of the other used tokens' owners
 * unlocks or dies, or the deadline (MP_ETIMEDOUT). Spurious returns of 0
 * happen: callers re-check their state under the guard. Must be called
 * with the guard held (it is released during the sleep and taken again). */
int mp__sync_sleep(pthread_mutex_t *guard, _Atomic uint32_t *word, uint32_t expected,
                   mp__token *t, int n, double deadline);

#endif
