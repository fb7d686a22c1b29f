/* Barrier: a generation counter under a robust guard, and a token per
 * member thread. A sleeper waits on `seq` and on every other member's
 * token at once, so a member's death wakes it and breaks the barrier. */
#include "sync/sync_internal.h"

#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

struct mp_barrier {
    mp__sync s;
};

typedef struct barrier_shared {
    mp__sync_hdr hdr;
    pthread_mutex_t guard;
    _Atomic uint32_t seq; /* bumped on every completion, break and reset: the futex word */
    uint32_t parties;
    uint32_t count;    /* arrived in this generation */
    uint32_t gen;      /* generation number */
    uint32_t broken;   /* the barrier is broken until reset */
    /* Bit g % 64 tells whether generation g ended by completing (set) or by
     * a reset (clear), for waiters that look after it ended. */
    uint64_t ended_ok;
    double timeout;      /* the default of mp_barrier_wait (NaN passed) */
    mp__coderef action;  /* run by the last arrival before the others go */
    mp__token members[MP_SYNC_HOLDERS_MAX];
} barrier_shared;

static barrier_shared *bar(const mp_barrier *b) { return b->s.base; }

static void unmap_hook(mp__sync *s)
{
    barrier_shared *sh = s->base;
    mp__guard_lock(&sh->guard);
    /* A thread of ours that waited and has ended since left its token: it
     * is no member keeping the mapping in use. */
    mp__tokens_reap(sh->members, MP_SYNC_HOLDERS_MAX, NULL);
    int others = mp__tokens_leave(sh->members, MP_SYNC_HOLDERS_MAX);
    mp__guard_unlock(&sh->guard);
    if (others) {
        mp__log(MP_LOG_WARN, "mp_barrier_release: %d other thread(s) of this process are "
                "members; the mapping is kept", others);
        s->base = NULL;
    }
}

void mp__barrier_obj_release(void *obj) { mp__sync_release(obj, unmap_hook); }

void mp_barrier_options_init(mp_barrier_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
    o->timeout = -1;
}

/* Reads the caller's options into *o the extensible-struct way (NULL: the
 * defaults), and checks them. */
static int check_options(unsigned parties, const mp_barrier_options *user, mp_barrier_options *o,
                         mp__coderef *action)
{
    const char *call = "mp_barrier_create";
    int rc;
    memset(action, 0, sizeof *action);
    mp_barrier_options_init(o);
    if (parties == 0 || parties > MP_SYNC_HOLDERS_MAX)
        return mp__error(MP_EINVAL, "%s: parties = %u, want 1 .. %d", call, parties,
                         MP_SYNC_HOLDERS_MAX);
    if (!user)
        return 0;
    if ((rc = mp__struct_in(o, sizeof *o, user, call, "mp_barrier_options")) < 0)
        return rc;
    if (user->size < offsetof(mp_barrier_options, timeout) + sizeof o->timeout)
        o->timeout = -1; /* a struct without the field: its default */
    if (isnan(o->timeout))
        return mp__error(MP_EINVAL, "%s: the default timeout is NaN (negative waits "
                         "forever)", call);
    return o->action ? mp__coderef_make((void (*)(void))o->action, action, call) : 0;
}

int mp_barrier_create_ex(unsigned parties, const mp_barrier_options *opts, mp_barrier **out)
{
    mp_barrier_options o[1];
    mp__coderef action;
    mp__sync *s;
    barrier_shared *sh;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_barrier_create: out is NULL");
    *out = NULL;
    if ((rc = check_options(parties, opts, o, &action)) < 0)
        return rc;
    rc = mp__sync_new(MP_ATTACH_BARRIER, sizeof(barrier_shared), "mp_barrier_create", &s);
    if (rc)
        return rc;
    sh = s->base;
    rc = mp__robust_init(&sh->guard, MP__MUTEX_NORMAL, "mp_barrier_create");
    if (!rc)
        rc = mp__tokens_init(sh->members, MP_SYNC_HOLDERS_MAX, "mp_barrier_create");
    if (rc) {
        mp__sync_release(s, NULL);
        return rc;
    }
    sh->parties = parties;
    sh->timeout = o->timeout;
    sh->action = action;
    *out = (mp_barrier *)s;
    return 0;
}

int mp_barrier_create(unsigned parties, mp_barrier **out)
{
    return mp_barrier_create_ex(parties, NULL, out);
}

mp_barrier *mp_barrier_retain(mp_barrier *b)
{
    if (b)
        mp__sync_retain(&b->s);
    return b;
}

void mp_barrier_release(mp_barrier *b) { mp__sync_release(b ? &b->s : NULL, unmap_hook); }

static void wake_all(barrier_shared *sh)
{
    atomic_fetch_add(&sh->seq, 1);
    mp__futex_wake((uint32_t *)&sh->seq, INT_MAX, true);
}

/* After the guard is released, so the woken do not find it held and sleep
 * on it again (seq was bumped under the guard: nobody misses the wake). */
static void wake_after_unlock(barrier_shared *sh)
{
    mp__futex_wake((uint32_t *)&sh->seq, INT_MAX, true);
}

/* Guard held. Waiters of the current generation fail; later ones too. */
static void do_break(barrier_shared *sh)
{
    if (!sh->broken) {
        sh->broken = 1;
        wake_all(sh);
    }
}

/* Guard held. Ends the current generation, completed or not; the caller
 * wakes the sleepers with wake_after_unlock. */
static void next_gen(barrier_shared *sh, bool ok)
{
    uint64_t bit = 1ull << (sh->gen % 64);
    sh->ended_ok = ok ? sh->ended_ok | bit : sh->ended_ok & ~bit;
    sh->gen++;
    sh->count = 0;
    atomic_fetch_add(&sh->seq, 1);
}

/* Guard held, after waking or timing out: 1 when our generation completed,
 * MP_EBROKEN when it failed, 0 when it still waits. */
static int outcome(barrier_shared *sh, uint32_t my_gen)
{
    if (sh->gen != my_gen)
        return (sh->ended_ok >> (my_gen % 64)) & 1 ? 1 : MP_EBROKEN;
    return sh->broken ? MP_EBROKEN : 0;
}

/* Guard held: sleeps until generation my_gen completes (0), breaks
 * (MP_EBROKEN), or this waiter's deadline passes (MP_ETIMEDOUT, which
 * breaks it for the others). A dead member found on waking breaks it. */
static int sleep_round(barrier_shared *sh, uint32_t my_gen, double deadline, double timeout)
{
    for (;;) {
        uint32_t seq = atomic_load(&sh->seq);
        int rc = mp__sync_sleep(&sh->guard, &sh->seq, seq, sh->members, MP_SYNC_HOLDERS_MAX,
                                deadline);
        if (mp__tokens_reap(sh->members, MP_SYNC_HOLDERS_MAX, NULL) > 0 &&
            sh->gen == my_gen)
            do_break(sh);
        int o = outcome(sh, my_gen);
        if (o == 1)
            return 0;
        if (o < 0)
            return mp__error(MP_EBROKEN, "mp_barrier_wait: the barrier broke while waiting "
                             "(a member died, timed out, or it was aborted or reset)");
        if (rc == MP_ETIMEDOUT) {
            do_break(sh);
            return mp__error(MP_ETIMEDOUT, "mp_barrier_wait: %u of %u parties arrived "
                             "within %g s; the barrier is now broken", sh->count,
                             sh->parties, timeout);
        }
        if (rc)
            return rc;
    }
}

/* Guard held, by the last arrival: runs the action. Non-zero (the action
 * failed, or it cannot be found in this process) breaks the barrier. */
static int run_action(barrier_shared *sh)
{
    void (*fn)(void) = NULL;
    int rc = mp__coderef_resolve(&sh->action, &fn, "mp_barrier_wait");
    if (rc == 0 && fn && (rc = ((mp_barrier_action_fn)fn)()) != 0)
        rc = mp__error(MP_EBROKEN, "mp_barrier_wait: the barrier action returned %d; the "
                       "barrier is now broken", rc);
    else if (rc < 0)
        rc = mp__error(MP_EBROKEN, "%s; the barrier is now broken", mp_last_error());
    if (rc)
        do_break(sh);
    return rc;
}

int mp_barrier_wait(mp_barrier *b, double timeout, unsigned *index)
{
    MP__CHECK_HANDLE(b, "mp_barrier_wait");
    barrier_shared *sh = bar(b);
    if (isnan(timeout))
        timeout = sh->timeout; /* MP_BARRIER_DEFAULT_TIMEOUT */
    double deadline = mp__deadline(timeout);
    uint32_t arrival;
    int rc;

    mp__guard_lock(&sh->guard);
    if (mp__tokens_reap(sh->members, MP_SYNC_HOLDERS_MAX, NULL) > 0)
        do_break(sh);
    if (sh->broken) {
        rc = mp__error(MP_EBROKEN, "mp_barrier_wait: the barrier is broken (a member died, "
                       "timed out or aborted); mp_barrier_reset makes it usable again");
        goto out;
    }
    if (mp__token_self(sh->members, MP_SYNC_HOLDERS_MAX) < 0 &&
        mp__token_claim(sh->members, MP_SYNC_HOLDERS_MAX) < 0) {
        rc = mp__error(MP_EOVERFLOW, "mp_barrier_wait: %d member threads already "
                       "(MP_SYNC_HOLDERS_MAX)", MP_SYNC_HOLDERS_MAX);
        goto out;
    }
    arrival = sh->count++;
    if (index)
        *index = arrival;
    if (sh->count == sh->parties) {
        if ((rc = run_action(sh)) != 0)
            goto out;
        next_gen(sh, true);
        mp__guard_unlock(&sh->guard);
        wake_after_unlock(sh);
        return 0;
    }
    rc = sleep_round(sh, sh->gen, deadline, timeout);
out:
    mp__guard_unlock(&sh->guard);
    return rc;
}

int mp_barrier_abort(mp_barrier *b)
{
    MP__CHECK_HANDLE(b, "mp_barrier_abort");
    barrier_shared *sh = bar(b);
    mp__guard_lock(&sh->guard);
    do_break(sh);
    mp__guard_unlock(&sh->guard);
    return 0;
}

int mp_barrier_reset(mp_barrier *b)
{
    MP__CHECK_HANDLE(b, "mp_barrier_reset");
    barrier_shared *sh = bar(b);
    mp__guard_lock(&sh->guard);
    /* The dead are forgotten: a reset barrier gets new members. */
    mp__tokens_reap(sh->members, MP_SYNC_HOLDERS_MAX, NULL);
    sh->broken = 0;
    next_gen(sh, false);
    mp__guard_unlock(&sh->guard);
    wake_after_unlock(sh);
    return 0;
}

int mp_barrier_parties(const mp_barrier *b)
{
    MP__CHECK_HANDLE(b, "mp_barrier_parties");
    return (int)bar(b)->parties;
}

int mp_barrier_n_waiting(const mp_barrier *b)
{
    MP__CHECK_HANDLE(b, "mp_barrier_n_waiting");
    barrier_shared *sh = bar(b);
    mp__guard_lock(&sh->guard);
    int n = sh->broken ? 0 : (int)sh->count;
    mp__guard_unlock(&sh->guard);
    return n;
}

bool mp_barrier_broken(const mp_barrier *b)
{
    if (!b) {
        mp__error(MP_EINVAL, "mp_barrier_broken: the handle is NULL");
        return false;
    }
    barrier_shared *sh = bar(b);
    mp__guard_lock(&sh->guard);
    bool broken = sh->broken != 0;
    mp__guard_unlock(&sh->guard);
    return broken;
}
