/* Semaphore and BoundedSemaphore: a count under a robust guard, and one
 * token per holder thread, so that permits held by a process that dies are
 * returned (see robust.c for how sleepers learn of the death). */
#include "sync/sync_internal.h"

#include <limits.h>
#include <unistd.h>

struct mp_semaphore {
    mp__sync s;
};

typedef struct sem_shared {
    mp__sync_hdr hdr;
    pthread_mutex_t guard;
    _Atomic uint32_t value; /* permits available; the futex word sleepers wait on */
    uint32_t bound;         /* bounded: the initial value; else 0 */
    uint32_t bounded;
    uint32_t sleepers;
    mp__token holders[MP_SYNC_HOLDERS_MAX];
} sem_shared;

static sem_shared *shared(const mp_semaphore *s) { return s->s.base; }

static void unmap_hook(mp__sync *s)
{
    sem_shared *sh = s->base;
    mp__guard_lock(&sh->guard);
    /* Permits held by this thread go back; another thread of this process
     * that still holds some keeps its token, whose robust-list entry would
     * then point into an unmapped page: keep the mapping in that case. */
    int self = mp__token_self(sh->holders, MP_SYNC_HOLDERS_MAX);
    if (self >= 0) {
        uint32_t n = sh->holders[self].count;
        atomic_fetch_add(&sh->value, n);
        mp__token_drop(sh->holders, self);
        if (sh->sleepers)
            mp__futex_wake((uint32_t *)&sh->value, (int)n, true);
    }
    int others = mp__tokens_leave(sh->holders, MP_SYNC_HOLDERS_MAX);
    mp__guard_unlock(&sh->guard);
    if (others) {
        mp__log(MP_LOG_WARN, "mp_semaphore_release: %d other thread(s) of this process "
                "hold permits; the mapping is kept", others);
        s->base = NULL;
    }
}

void mp__semaphore_obj_release(void *obj) { mp__sync_release(obj, unmap_hook); }

static int create(unsigned value, bool bounded, const char *call, mp_semaphore **out)
{
    mp__sync *s;
    sem_shared *sh;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "%s: out is NULL", call);
    *out = NULL;
    if (value > INT32_MAX)
        return mp__error(MP_EINVAL, "%s: value %u is above INT32_MAX", call, value);
    rc = mp__sync_new(MP_ATTACH_SEMAPHORE, sizeof(sem_shared), call, &s);
    if (rc)
        return rc;
    sh = s->base;
    rc = mp__robust_init(&sh->guard, MP__MUTEX_NORMAL, call);
    if (!rc)
        rc = mp__tokens_init(sh->holders, MP_SYNC_HOLDERS_MAX, call);
    if (rc) {
        mp__sync_release(s, NULL);
        return rc;
    }
    atomic_store(&sh->value, value);
    sh->bound = value;
    sh->bounded = bounded;
    *out = (mp_semaphore *)s;
    return 0;
}

int mp_semaphore_create(unsigned value, mp_semaphore **out)
{
    return create(value, false, "mp_semaphore_create", out);
}

int mp_bounded_semaphore_create(unsigned value, mp_semaphore **out)
{
    return create(value, true, "mp_bounded_semaphore_create", out);
}

mp_semaphore *mp_semaphore_retain(mp_semaphore *s)
{
    if (s)
        mp__sync_retain(&s->s);
    return s;
}

void mp_semaphore_release(mp_semaphore *s) { mp__sync_release(s ? &s->s : NULL, unmap_hook); }

/* Takes a permit for the calling thread (guard held, value > 0). */
static int take(sem_shared *sh)
{
    int self = mp__token_self(sh->holders, MP_SYNC_HOLDERS_MAX);
    if (self < 0)
        self = mp__token_claim(sh->holders, MP_SYNC_HOLDERS_MAX);
    if (self < 0)
        return mp__error(MP_EOVERFLOW, "mp_semaphore_wait: %d threads hold permits "
                         "already (MP_SYNC_HOLDERS_MAX)", MP_SYNC_HOLDERS_MAX);
    sh->holders[self].count++;
    atomic_fetch_sub(&sh->value, 1);
    return 0;
}

int mp_semaphore_wait(mp_semaphore *s, double timeout)
{
    MP__CHECK_HANDLE(s, "mp_semaphore_wait");
    int rc = mp__check_timeout(timeout, "mp_semaphore_wait");
    if (rc)
        return rc;
    sem_shared *sh = shared(s);
    double deadline = mp__deadline(timeout);
    uint32_t reclaimed = 0;

    mp__guard_lock(&sh->guard);
    for (bool late = false;;) {
        uint32_t got = 0;
        /* Only an empty semaphore looks for dead holders: the fast path
         * costs no probe. */
        if (atomic_load(&sh->value) == 0 &&
            mp__tokens_reap(sh->holders, MP_SYNC_HOLDERS_MAX, &got) > 0 && got) {
            reclaimed += got;
            atomic_fetch_add(&sh->value, got);
            if (sh->sleepers) /* the others may take the rest */
                mp__futex_wake((uint32_t *)&sh->value, INT_MAX, true);
        }
        if (atomic_load(&sh->value) > 0) {
            rc = take(sh);
            break;
        }
        if (late) {
            rc = mp__error(MP_ETIMEDOUT, "mp_semaphore_wait: no permit within %g s",
                           timeout);
            break;
        }
        sh->sleepers++;
        rc = mp__sync_sleep(&sh->guard, &sh->value, 0, sh->holders, MP_SYNC_HOLDERS_MAX,
                            deadline);
        sh->sleepers--;
        /* After the deadline take one last look: a release or a death may
         * have raced it. */
        if (rc == MP_ETIMEDOUT)
            late = true;
        else if (rc)
            break;
    }
    mp__guard_unlock(&sh->guard);
    if (rc == 0 && reclaimed)
        return mp__error(MP_EOWNERDEAD, "mp_semaphore_wait: got a permit returned "
                         "by %u permit(s) of a holder that died; what it protected may be "
                         "inconsistent", reclaimed);
    return rc;
}

int mp_semaphore_post(mp_semaphore *s)
{
    MP__CHECK_HANDLE(s, "mp_semaphore_post");
    sem_shared *sh = shared(s);
    uint32_t v;
    int rc = 0, self;
    bool wake;

    mp__guard_lock(&sh->guard);
    v = atomic_load(&sh->value);
    if (sh->bounded && v >= sh->bound) {
        rc = mp__error(MP_EOVERFLOW, "mp_semaphore_post: bounded semaphore posted more "
                       "times than waited (value %u is its bound)", sh->bound);
        goto out;
    }
    if (v >= INT32_MAX) {
        rc = mp__error(MP_EOVERFLOW, "mp_semaphore_post: count would pass INT32_MAX");
        goto out;
    }
    self = mp__token_self(sh->holders, MP_SYNC_HOLDERS_MAX);
    if (self >= 0 && --sh->holders[self].count == 0)
        mp__token_drop(sh->holders, self);
    atomic_fetch_add(&sh->value, 1);
    wake = sh->sleepers > 0;
    mp__guard_unlock(&sh->guard);
    /* Woken after the guard is free, the sleeper takes it at once instead
     * of waking, finding it held and sleeping again on the guard. Nothing
     * is lost: a sleeper that has not reached futex_waitv yet sees value
     * != 0 there and returns at once. */
    if (wake)
        mp__futex_wake((uint32_t *)&sh->value, 1, true);
    return 0;
out:
    mp__guard_unlock(&sh->guard);
    return rc;
}

int mp_semaphore_value(const mp_semaphore *s)
{
    MP__CHECK_HANDLE(s, "mp_semaphore_value");
    return (int)atomic_load(&shared(s)->value);
}
