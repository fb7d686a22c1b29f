/* Event (a flag and a futex) and Condition (an owned recursive lock plus a
 * futex word that packs waiters and pending wake-ups). */
#include "sync/sync_internal.h"

#include <limits.h>
#include <unistd.h>

struct mp_event {
    mp__sync s;
};
struct mp_condition {
    mp__sync s;
};

/* ---- Event ----------------------------------------------------------------- */

typedef struct event_shared {
    mp__sync_hdr hdr;
    _Atomic uint32_t flag; /* the futex word */
    _Atomic uint32_t sleepers;
} event_shared;

static event_shared *ev(const mp_event *e) { return e->s.base; }

void mp__event_obj_release(void *obj) { mp__sync_release(obj, NULL); }

int mp_event_create(mp_event **out)
{
    if (!out)
        return mp__error(MP_EINVAL, "mp_event_create: out is NULL");
    *out = NULL;
    return mp__sync_new(MP_ATTACH_EVENT, sizeof(event_shared), "mp_event_create",
                        (mp__sync **)out);
}

mp_event *mp_event_retain(mp_event *e)
{
    if (e)
        mp__sync_retain(&e->s);
    return e;
}

void mp_event_release(mp_event *e) { mp__sync_release(e ? &e->s : NULL, NULL); }

int mp_event_set(mp_event *e)
{
    MP__CHECK_HANDLE(e, "mp_event_set");
    event_shared *sh = ev(e);
    if (atomic_exchange(&sh->flag, 1) == 0 && atomic_load(&sh->sleepers))
        mp__futex_wake((uint32_t *)&sh->flag, INT_MAX, true);
    return 0;
}

int mp_event_clear(mp_event *e)
{
    MP__CHECK_HANDLE(e, "mp_event_clear");
    atomic_store(&ev(e)->flag, 0);
    return 0;
}

bool mp_event_is_set(const mp_event *e)
{
    if (!e) {
        mp__error(MP_EINVAL, "mp_event_is_set: the handle is NULL");
        return false;
    }
    return atomic_load(&ev(e)->flag) != 0;
}

int mp_event_wait(mp_event *e, double timeout)
{
    MP__CHECK_HANDLE(e, "mp_event_wait");
    int rc = mp__check_timeout(timeout, "mp_event_wait");
    event_shared *sh = ev(e);
    double deadline = mp__deadline(timeout);
    if (rc)
        return rc;
    /* sleepers is raised before the flag is read again, and set() swaps the
     * flag before reading sleepers (both sequentially consistent), so a
     * wake-up is never skipped. */
    atomic_fetch_add(&sh->sleepers, 1);
    while (atomic_load(&sh->flag) == 0) {
        rc = mp__futex_wait((uint32_t *)&sh->flag, 0, deadline, true);
        if (rc == MP_ETIMEDOUT && atomic_load(&sh->flag) == 0) {
            rc = mp__error(MP_ETIMEDOUT, "mp_event_wait: not set within %g s", timeout);
            break;
        }
        if (rc && rc != MP_ETIMEDOUT)
            break;
        rc = 0;
    }
    atomic_fetch_sub(&sh->sleepers, 1);
    return rc;
}

/* ---- Condition ------------------------------------------------------------ */

/* word = waiters << 16 | pending. A waiter registers (waiters + 1) with the
 * lock held; notify turns up to n registered waiters into pending wake-ups
 * with the lock held; a waiter consumes one (waiters - 1, pending - 1) in a
 * single compare-and-swap, so notify never counts a wake-up twice. A waiter
 * that times out withdraws with the lock held again. */
#define W_ONE (1u << 16)
#define P_MASK (W_ONE - 1)

typedef struct cond_shared {
    mp__sync_hdr hdr;
    mp__olock lock;
    _Atomic uint32_t word;
} cond_shared;

static cond_shared *cv(const mp_condition *c) { return c->s.base; }

static void cond_unmap_hook(mp__sync *s)
{
    cond_shared *sh = s->base;
    if (mp__olock_mine(&sh->lock)) {
        sh->lock.depth = 1;
        mp__olock_unlock(&sh->lock, "mp_condition_release");
    }
}

void mp__condition_obj_release(void *obj) { mp__sync_release(obj, cond_unmap_hook); }

int mp_condition_create(mp_condition **out)
{
    mp__sync *s;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_condition_create: out is NULL");
    *out = NULL;
    rc = mp__sync_new(MP_ATTACH_CONDITION, sizeof(cond_shared), "mp_condition_create", &s);
    if (rc)
        return rc;
    rc = mp__olock_init(&((cond_shared *)s->base)->lock, "mp_condition_create");
    if (rc) {
        mp__sync_release(s, NULL);
        return rc;
    }
    *out = (mp_condition *)s;
    return 0;
}

mp_condition *mp_condition_retain(mp_condition *c)
{
    if (c)
        mp__sync_retain(&c->s);
    return c;
}

void mp_condition_release(mp_condition *c)
{
    mp__sync_release(c ? &c->s : NULL, cond_unmap_hook);
}

int mp_condition_lock(mp_condition *c, double timeout)
{
    MP__CHECK_HANDLE(c, "mp_condition_lock");
    int rc = mp__check_timeout(timeout, "mp_condition_lock");
    return rc ? rc : mp__olock_lock(&cv(c)->lock, true, timeout, "mp_condition_lock");
}

int mp_condition_unlock(mp_condition *c)
{
    MP__CHECK_HANDLE(c, "mp_condition_unlock");
    return mp__olock_unlock(&cv(c)->lock, "mp_condition_unlock");
}

int mp_condition_consistent(mp_condition *c)
{
    MP__CHECK_HANDLE(c, "mp_condition_consistent");
    return mp__olock_consistent(&cv(c)->lock, "mp_condition_consistent");
}

/* Consumes one pending wake-up if there is one. */
static bool consume(_Atomic uint32_t *word)
{
    uint32_t w = atomic_load(word);
    while (w & P_MASK)
        if (atomic_compare_exchange_weak(word, &w, w - W_ONE - 1))
            return true;
    return false;
}

int mp_condition_wait(mp_condition *c, double timeout)
{
    MP__CHECK_HANDLE(c, "mp_condition_wait");
    int rc = mp__check_timeout(timeout, "mp_condition_wait"), lrc;
    if (rc)
        return rc;
    cond_shared *sh = cv(c);
    double deadline = mp__deadline(timeout);
    uint32_t depth, w;
    bool woken = false;

    if (!mp__olock_mine(&sh->lock))
        return mp__error(MP_EPERM, "mp_condition_wait: the calling thread does not hold "
                         "the condition's lock");
    if ((atomic_load(&sh->word) >> 16) == (P_MASK))
        return mp__error(MP_EOVERFLOW, "mp_condition_wait: 65535 waiters already");
    atomic_fetch_add(&sh->word, W_ONE);
    depth = sh->lock.depth;
    sh->lock.depth = 1;
    mp__olock_unlock(&sh->lock, "mp_condition_wait");
    for (;;) {
        if (consume(&sh->word)) {
            woken = true;
            break;
        }
        w = atomic_load(&sh->word);
        if (w & P_MASK)
            continue;
        rc = mp__futex_wait((uint32_t *)&sh->word, w, deadline, true);
        if (rc)
            break;
    }
    /* Take the lock back at the same depth whatever happened. */
    do
        lrc = mp__olock_lock(&sh->lock, true, -1, "mp_condition_wait");
    while (lrc == MP_ETIMEDOUT);
    if (lrc == 0 || lrc == MP_EOWNERDEAD)
        sh->lock.depth = depth;
    if (!woken) {
        /* Withdraw under the lock: a notify that counted us meanwhile
         * left a pending wake-up, which is ours. */
        if (consume(&sh->word))
            rc = 0;
        else
            atomic_fetch_sub(&sh->word, W_ONE);
    }
    if (lrc)
        return lrc;
    if (rc == MP_ETIMEDOUT)
        return mp__error(MP_ETIMEDOUT, "mp_condition_wait: not notified within %g s",
                         timeout);
    return rc;
}

int mp_condition_wait_for(mp_condition *c, bool (*pred)(void *arg), void *arg,
                          double timeout)
{
    MP__CHECK_HANDLE(c, "mp_condition_wait_for");
    if (!pred)
        return mp__error(MP_EINVAL, "mp_condition_wait_for: pred is NULL");
    int rc = mp__check_timeout(timeout, "mp_condition_wait_for");
    double deadline = mp__deadline(timeout);
    while (rc == 0 && !pred(arg)) {
        double left = deadline < 0 ? -1 : deadline - mp__now();
        if (deadline >= 0 && left <= 0)
            return mp__error(MP_ETIMEDOUT, "mp_condition_wait_for: predicate still false "
                             "after %g s", timeout);
        rc = mp_condition_wait(c, left);
        if (rc == MP_ETIMEDOUT && pred(arg))
            rc = 0;
    }
    return rc;
}

int mp_condition_notify(mp_condition *c, int n)
{
    MP__CHECK_HANDLE(c, "mp_condition_notify");
    cond_shared *sh = cv(c);
    uint32_t w, waiters, pending, k;
    if (n < 0)
        return mp__error(MP_EINVAL, "mp_condition_notify: n = %d is negative", n);
    if (!mp__olock_mine(&sh->lock))
        return mp__error(MP_EPERM, "mp_condition_notify: the calling thread does not hold "
                         "the condition's lock");
    w = atomic_load(&sh->word);
    do {
        waiters = w >> 16;
        pending = w & P_MASK;
        k = waiters - pending < (uint32_t)n ? waiters - pending : (uint32_t)n;
        if (k == 0)
            return 0;
    } while (!atomic_compare_exchange_weak(&sh->word, &w, w + k));
    mp__futex_wake((uint32_t *)&sh->word, (int)k, true);
    return 0;
}

int mp_condition_notify_all(mp_condition *c) { return mp_condition_notify(c, INT_MAX); }
