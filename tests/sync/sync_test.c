/* src/sync: Lock, RLock, Semaphore, Event and Condition across forked
 * processes, misuse errors, robustness when holders die. */
#include "helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* ---- Lock ------------------------------------------------------------------ */

struct counter_arg {
    mp_lock *lock;
    volatile long *counter;
    int n;
};

static int increment(void *p)
{
    struct counter_arg *a = p;
    for (int i = 0; i < a->n; i++) {
        if (mp_lock_lock(a->lock, 30) != 0)
            return 1;
        long v = *a->counter; /* a non-atomic read-modify-write */
        *a->counter = v + 1;
        if (mp_lock_unlock(a->lock) != 0)
            return 2;
    }
    return 0;
}

static void test_lock_mutual_exclusion(void **state)
{
    enum { PROCS = 4, N = 100000 };
    struct counter_arg a = {NULL, shared_page(), N};
    pid_t pids[PROCS];
    assert_mp_ok(mp_lock_create(&a.lock));
    for (int i = 0; i < PROCS; i++)
        pids[i] = fork_child(increment, &a);
    for (int i = 0; i < PROCS; i++)
        assert_int_equal(reap(pids[i]), 0);
    assert_int_equal(*a.counter, (long)PROCS * N);
    assert_int_equal(mp_lock_locked(a.lock), 0);
    mp_lock_release(a.lock);
    munmap((void *)a.counter, 4096);
}

static void *unlock_lock_thread(void *p)
{
    return (void *)(intptr_t)mp_lock_unlock(p);
}

static void *unlock_rlock_thread(void *p)
{
    return (void *)(intptr_t)mp_rlock_unlock(p);
}

static void test_lock_misuse(void **state)
{
    mp_lock *l;
    pthread_t th;
    void *ret;
    assert_mp_err(mp_lock_create(NULL), MP_EINVAL);
    assert_mp_err(mp_lock_lock(NULL, 1), MP_EINVAL);
    assert_mp_ok(mp_lock_create(&l));
    assert_mp_err(mp_lock_lock(l, NAN), MP_EINVAL);
    assert_mp_err(mp_lock_unlock(l), MP_ESTATE);
    assert_non_null(strstr(mp_last_error(), "not held"));
    assert_mp_ok(mp_lock_lock(l, 0));
    assert_int_equal(mp_lock_locked(l), 1);
    assert_mp_err(mp_lock_lock(l, 0), MP_ESTATE); /* not recursive */
    assert_non_null(strstr(mp_last_error(), "RLock"));
    assert_mp_err(mp_lock_consistent(l), MP_ESTATE);
    assert_int_equal(pthread_create(&th, NULL, unlock_lock_thread, l), 0);
    pthread_join(th, &ret);
    assert_int_equal((int)(intptr_t)ret, MP_EPERM);
    assert_mp_ok(mp_lock_unlock(l));
    mp_lock_release(NULL);
    mp_lock_release(mp_lock_retain(l));
    mp_lock_release(l);
}

static int hold_briefly(void *p)
{
    if (mp_lock_lock(p, 5) != 0)
        return 1;
    nap(0.3);
    return mp_lock_unlock(p) == 0 ? 0 : 2;
}

static void test_lock_timeout(void **state)
{
    mp_lock *l;
    double t0;
    pid_t pid;
    assert_mp_ok(mp_lock_create(&l));
    pid = fork_child(hold_briefly, l);
    while (!mp_lock_locked(l))
        nap(0.001);
    t0 = mp__now();
    assert_mp_err(mp_lock_lock(l, 0.05), MP_ETIMEDOUT);
    assert_true(mp__now() - t0 >= 0.04);
    assert_mp_err(mp_lock_unlock(l), MP_EPERM); /* the child holds it */
    assert_mp_ok(mp_lock_lock(l, 10)); /* blocks until the child lets go */
    assert_mp_ok(mp_lock_unlock(l));
    assert_int_equal(reap(pid), 0);
    mp_lock_release(l);
}

/* ---- RLock ----------------------------------------------------------------- */

static void test_rlock_recursion(void **state)
{
    mp_rlock *r;
    pthread_t th;
    void *ret;
    assert_mp_ok(mp_rlock_create(&r));
    assert_mp_err(mp_rlock_unlock(r), MP_ESTATE);
    for (int i = 1; i <= 3; i++) {
        assert_mp_ok(mp_rlock_lock(r, 0));
        assert_int_equal(mp_rlock_depth(r), i);
    }
    assert_int_equal(pthread_create(&th, NULL, unlock_rlock_thread, r), 0);
    pthread_join(th, &ret);
    assert_int_equal((int)(intptr_t)ret, MP_EPERM);
    for (int i = 2; i >= 0; i--) {
        assert_mp_ok(mp_rlock_unlock(r));
        assert_int_equal(mp_rlock_depth(r), i);
    }
    assert_mp_err(mp_rlock_unlock(r), MP_ESTATE);
    /* every release leaves a free lock at depth 1 (the inline acquire does
     * not write it): taken again after the recursive releases, it is one
     * deep, and one release frees it */
    for (int round = 0; round < 2; round++) {
        assert_mp_ok(mp_rlock_lock(r, 0));
        assert_int_equal(mp_rlock_depth(r), 1);
        assert_mp_ok(mp_rlock_lock(r, 0));
        assert_int_equal(mp_rlock_depth(r), 2);
        assert_mp_ok(mp_rlock_unlock(r));
        assert_mp_ok(mp_rlock_unlock(r));
        assert_int_equal(mp_rlock_depth(r), 0);
        assert_mp_err(mp_rlock_unlock(r), MP_ESTATE);
    }
    mp_rlock_release(r);
}

/* ---- robustness: holders that die -------------------------------------- */

struct die_arg {
    void *obj;
    int fd; /* write end: one byte once acquired */
    double delay;
};

static int lock_and_die(void *p)
{
    struct die_arg *a = p;
    if (mp_lock_lock(a->obj, 5) != 0)
        return 1;
    (void)!write(a->fd, "x", 1);
    nap(a->delay);
    raise(SIGKILL);
    return 3;
}

static int rlock_and_die(void *p)
{
    struct die_arg *a = p;
    for (int i = 0; i < 2; i++)
        if (mp_rlock_lock(a->obj, 5) != 0)
            return 1;
    (void)!write(a->fd, "x", 1);
    raise(SIGKILL);
    return 3;
}

/* The pipe a dying child writes its byte to once it holds the object. */
static void open_pipe(struct die_arg *a, int p[2])
{
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    a->fd = p[1];
}

static void close_pipe(int p[2])
{
    close(p[0]);
    close(p[1]);
}

static void wait_byte(int fd)
{
    char c;
    assert_int_equal(read(fd, &c, 1), 1);
}

static void test_lock_owner_dead(void **state)
{
    struct die_arg a = {NULL, -1, 0.2};
    int p[2];
    double t0;
    pid_t pid;
    open_pipe(&a, p);
    assert_mp_ok(mp_lock_create((mp_lock **)&a.obj));
    pid = fork_child(lock_and_die, &a);
    wait_byte(p[0]);
    /* Block while the holder is alive: its death must wake us. */
    t0 = mp__now();
    assert_mp_err(mp_lock_lock(a.obj, 20), MP_EOWNERDEAD);
    assert_true(mp__now() - t0 < 10);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_non_null(strstr(mp_last_error(), "died"));
    assert_mp_ok(mp_lock_consistent(a.obj));
    assert_mp_ok(mp_lock_unlock(a.obj));
    assert_mp_ok(mp_lock_lock(a.obj, 0));
    assert_mp_ok(mp_lock_unlock(a.obj));

    /* Released without being marked consistent: unrecoverable. */
    a.delay = 0;
    pid = fork_child(lock_and_die, &a);
    wait_byte(p[0]);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_mp_err(mp_lock_lock(a.obj, 5), MP_EOWNERDEAD);
    assert_mp_ok(mp_lock_unlock(a.obj));
    assert_mp_err(mp_lock_lock(a.obj, 0), MP_EBROKEN);
    mp_lock_release(a.obj);
    close_pipe(p);
}

static void test_rlock_owner_dead(void **state)
{
    struct die_arg a = {NULL, -1, 0};
    int p[2];
    pid_t pid;
    open_pipe(&a, p);
    assert_mp_ok(mp_rlock_create((mp_rlock **)&a.obj));
    pid = fork_child(rlock_and_die, &a);
    wait_byte(p[0]);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_mp_err(mp_rlock_lock(a.obj, 5), MP_EOWNERDEAD);
    assert_int_equal(mp_rlock_depth(a.obj), 1); /* the dead owner's depth is gone */
    assert_mp_ok(mp_rlock_consistent(a.obj));
    assert_mp_ok(mp_rlock_unlock(a.obj));
    assert_int_equal(mp_rlock_depth(a.obj), 0);
    assert_mp_ok(mp_rlock_lock(a.obj, 0)); /* inline: 1 deep, not the dead owner's 2 */
    assert_int_equal(mp_rlock_depth(a.obj), 1);
    assert_mp_ok(mp_rlock_unlock(a.obj));
    assert_mp_err(mp_rlock_unlock(a.obj), MP_ESTATE);
    mp_rlock_release(a.obj);
    close_pipe(p);
}

/* ---- Semaphore ------------------------------------------------------------- */

static void test_semaphore_counts(void **state)
{
    mp_semaphore *s, *b;
    assert_mp_err(mp_semaphore_create(0, NULL), MP_EINVAL);
    assert_mp_ok(mp_semaphore_create(2, &s));
    assert_int_equal(mp_semaphore_value(s), 2);
    assert_mp_ok(mp_semaphore_wait(s, 0));
    assert_mp_ok(mp_semaphore_wait(s, 0));
    assert_int_equal(mp_semaphore_value(s), 0);
    assert_mp_err(mp_semaphore_wait(s, 0.02), MP_ETIMEDOUT);
    assert_mp_ok(mp_semaphore_post(s));
    assert_mp_ok(mp_semaphore_post(s));
    assert_mp_ok(mp_semaphore_post(s)); /* unbounded: a third permit */
    assert_int_equal(mp_semaphore_value(s), 3);
    mp_semaphore_release(s);

    assert_mp_ok(mp_bounded_semaphore_create(1, &b));
    assert_mp_err(mp_semaphore_post(b), MP_EOVERFLOW);
    assert_non_null(strstr(mp_last_error(), "more times than waited"));
    assert_mp_ok(mp_semaphore_wait(b, 0));
    assert_mp_ok(mp_semaphore_post(b));
    assert_int_equal(mp_semaphore_value(b), 1);
    mp_semaphore_release(b);
}

static int sem_post_later(void *p)
{
    nap(0.1);
    return mp_semaphore_post(p) == 0 ? 0 : 1;
}

static int sem_take_and_die(void *p)
{
    struct die_arg *a = p;
    if (mp_semaphore_wait(a->obj, 5) != 0 || mp_semaphore_wait(a->obj, 5) != 0)
        return 1;
    (void)!write(a->fd, "x", 1);
    nap(a->delay);
    raise(SIGKILL);
    return 3;
}

static void test_semaphore_processes(void **state)
{
    struct die_arg a = {NULL, -1, 0.2};
    int p[2];
    double t0;
    pid_t pid;
    open_pipe(&a, p);
    assert_mp_ok(mp_semaphore_create(0, (mp_semaphore **)&a.obj));
    pid = fork_child(sem_post_later, a.obj);
    assert_mp_ok(mp_semaphore_wait(a.obj, 10)); /* the child's permit */
    assert_int_equal(reap(pid), 0);
    assert_mp_ok(mp_semaphore_post(a.obj));
    assert_mp_ok(mp_semaphore_post(a.obj));

    /* A holder of both permits dies while we wait: they come back. */
    pid = fork_child(sem_take_and_die, &a);
    wait_byte(p[0]);
    t0 = mp__now();
    assert_mp_err(mp_semaphore_wait(a.obj, 20), MP_EOWNERDEAD);
    assert_true(mp__now() - t0 < 10);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_int_equal(mp_semaphore_value(a.obj), 1);
    assert_mp_ok(mp_semaphore_wait(a.obj, 0));
    assert_mp_ok(mp_semaphore_post(a.obj));
    assert_mp_ok(mp_semaphore_post(a.obj));
    assert_int_equal(mp_semaphore_value(a.obj), 2);
    mp_semaphore_release(a.obj);
    close_pipe(p);
}

/* Many hand-offs between two processes, each side asleep when the other
 * releases: a wake-up lost by release shows as a timeout. */
#define PINGPONG_ROUNDS 20000
static mp_semaphore *ping, *pong;

static int ponger(void *p)
{
    (void)p;
    for (int i = 0; i < PINGPONG_ROUNDS; i++)
        if (mp_semaphore_wait(ping, 10) || mp_semaphore_post(pong))
            return 1;
    return 0;
}

static void test_semaphore_pingpong(void **state)
{
    pid_t pid;
    (void)state;
    assert_mp_ok(mp_semaphore_create(0, &ping));
    assert_mp_ok(mp_semaphore_create(0, &pong));
    pid = fork_child(ponger, NULL);
    for (int i = 0; i < PINGPONG_ROUNDS; i++) {
        assert_mp_ok(mp_semaphore_post(ping));
        assert_mp_ok(mp_semaphore_wait(pong, 10));
    }
    assert_int_equal(reap(pid), 0);
    assert_int_equal(mp_semaphore_value(ping), 0);
    assert_int_equal(mp_semaphore_value(pong), 0);
    mp_semaphore_release(ping);
    mp_semaphore_release(pong);
}

/* ---- Event ------------------------------------------------------------------ */

static int event_set_later(void *p)
{
    nap(0.1);
    return mp_event_set(p) == 0 ? 0 : 1;
}

static void test_event(void **state)
{
    mp_event *e;
    pid_t pid;
    assert_mp_ok(mp_event_create(&e));
    assert_int_equal(mp_event_is_set(e), 0);
    assert_mp_err(mp_event_wait(e, 0), MP_ETIMEDOUT);
    assert_mp_err(mp_event_wait(e, 0.02), MP_ETIMEDOUT);
    pid = fork_child(event_set_later, e);
    assert_mp_ok(mp_event_wait(e, 10));
    assert_int_equal(reap(pid), 0);
    assert_int_equal(mp_event_is_set(e), 1);
    assert_mp_ok(mp_event_wait(e, 0));
    assert_mp_ok(mp_event_clear(e));
    assert_int_equal(mp_event_is_set(e), 0);
    assert_mp_err(mp_event_wait(e, 0.01), MP_ETIMEDOUT);
    assert_mp_err(mp_event_set(NULL), MP_EINVAL);
    mp_event_release(e);
}

/* ---- Condition ------------------------------------------------------------- */

struct cond_arg {
    mp_condition *c;
    _Atomic int *woken; /* woken[0]: returned from the wait; woken[1]: about to wait */
};

static int cond_waiter(void *p)
{
    struct cond_arg *a = p;
    int rc;
    if (mp_condition_lock(a->c, 5) != 0)
        return 1;
    /* Counted under the lock, which only the wait below gives back. */
    atomic_fetch_add(&a->woken[1], 1);
    rc = mp_condition_wait(a->c, 20);
    if (rc == 0)
        atomic_fetch_add(a->woken, 1);
    if (mp_condition_unlock(a->c) != 0)
        return 2;
    return rc == 0 ? 0 : 3;
}

static void test_condition(void **state)
{
    enum { N = 3 };
    struct cond_arg a = {NULL, shared_page()};
    pid_t pids[N];
    assert_mp_ok(mp_condition_create(&a.c));
    assert_mp_err(mp_condition_wait(a.c, 0), MP_EPERM);
    assert_mp_err(mp_condition_notify(a.c, 1), MP_EPERM);
    assert_mp_ok(mp_condition_lock(a.c, 1));
    assert_mp_ok(mp_condition_lock(a.c, 1)); /* depth 2 survives a wait */
    assert_mp_err(mp_condition_wait(a.c, 0.02), MP_ETIMEDOUT);
    assert_mp_ok(mp_condition_unlock(a.c));
    assert_mp_ok(mp_condition_unlock(a.c));
    assert_mp_err(mp_condition_unlock(a.c), MP_ESTATE);

    for (int i = 0; i < N; i++)
        pids[i] = fork_child(cond_waiter, &a);
    /* All three counted themselves holding the lock, and a waiter gives the
     * lock back only inside the wait, registered: once we hold the lock,
     * all three wait. One notify(1) then, never a retry: a waiter woken but
     * not yet running (a loaded machine) would make a second notify wake a
     * second waiter. */
    for (int i = 0; i < 2000 && atomic_load(&a.woken[1]) < N; i++)
        nap(0.005);
    assert_int_equal(atomic_load(&a.woken[1]), N);
    assert_mp_ok(mp_condition_lock(a.c, 5));
    assert_mp_ok(mp_condition_notify(a.c, 1));
    assert_mp_ok(mp_condition_unlock(a.c));
    for (int i = 0; i < 2000 && atomic_load(a.woken) == 0; i++)
        nap(0.005);
    assert_int_equal(atomic_load(a.woken), 1);
    nap(0.1);
    assert_int_equal(atomic_load(a.woken), 1); /* notify(1) woke one only */
    assert_mp_ok(mp_condition_lock(a.c, 5));
    assert_mp_ok(mp_condition_notify_all(a.c));
    assert_mp_ok(mp_condition_unlock(a.c));
    for (int i = 0; i < N; i++)
        assert_int_equal(reap(pids[i]), 0);
    assert_int_equal(atomic_load(a.woken), N);
    mp_condition_release(a.c);
    munmap((void *)a.woken, 4096);
}

static bool flag_set(void *p) { return atomic_load((_Atomic int *)p) != 0; }

static void test_condition_wait_for(void **state)
{
    mp_condition *c;
    _Atomic int flag = 0;
    assert_mp_ok(mp_condition_create(&c));
    assert_mp_ok(mp_condition_lock(c, 1));
    assert_mp_err(mp_condition_wait_for(c, flag_set, &flag, 0.03), MP_ETIMEDOUT);
    atomic_store(&flag, 1);
    assert_mp_ok(mp_condition_wait_for(c, flag_set, &flag, 0.03));
    assert_mp_ok(mp_condition_unlock(c));
    mp_condition_release(c);
}


/* A waiter's lock comes back from a holder that died meanwhile. */
static int cond_hold_and_die(void *p)
{
    struct die_arg *a = p;
    if (mp_condition_lock(a->obj, 5) != 0)
        return 1;
    mp_condition_notify_all(a->obj);
    (void)!write(a->fd, "x", 1);
    raise(SIGKILL);
    return 3;
}

static void test_condition_owner_dead(void **state)
{
    struct die_arg a = {NULL, -1, 0};
    int p[2];
    pid_t pid;
    open_pipe(&a, p);
    assert_mp_ok(mp_condition_create((mp_condition **)&a.obj));
    assert_mp_ok(mp_condition_lock(a.obj, 1));
    pid = fork_child(cond_hold_and_die, &a);
    /* wait releases the lock; the child takes it, notifies and dies */
    assert_mp_err(mp_condition_wait(a.obj, 20), MP_EOWNERDEAD);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_mp_ok(mp_condition_consistent(a.obj));
    assert_mp_ok(mp_condition_unlock(a.obj));
    mp_condition_release(a.obj);
    close_pipe(p);
}

/* More holder threads than MP_SYNC_HOLDERS_MAX: the extra one is refused.
 * Run in a child, whose thread stacks the leak check does not count. */
struct hold_arg {
    mp_semaphore *s;
    pthread_barrier_t held, done;
    atomic_int refused, failed;
};

static void *hold_permit(void *p)
{
    struct hold_arg *a = p;
    int rc = mp_semaphore_wait(a->s, 5);
    if (rc == MP_EOVERFLOW)
        atomic_fetch_add(&a->refused, 1);
    else if (rc != 0)
        atomic_fetch_add(&a->failed, 1);
    pthread_barrier_wait(&a->held); /* everyone tried while the others hold */
    pthread_barrier_wait(&a->done);
    if (rc == 0 && mp_semaphore_post(a->s) != 0)
        atomic_fetch_add(&a->failed, 1);
    return NULL;
}

static int many_holders(void *p)
{
    enum { N = MP_SYNC_HOLDERS_MAX + 1 };
    struct hold_arg *a = p;
    pthread_t th[N];
    pthread_barrier_init(&a->held, NULL, N);
    pthread_barrier_init(&a->done, NULL, N);
    for (int i = 0; i < N; i++)
        if (pthread_create(&th[i], NULL, hold_permit, a) != 0)
            return 1;
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    if (atomic_load(&a->failed))
        return 2;
    if (atomic_load(&a->refused) != 1)
        return 3;
    return mp_semaphore_value(a->s) == N ? 0 : 4;
}

static void test_semaphore_holders_max(void **state)
{
    struct hold_arg a;
    memset(&a, 0, sizeof a);
    assert_mp_ok(mp_semaphore_create(MP_SYNC_HOLDERS_MAX + 1, &a.s));
    assert_int_equal(reap(fork_child(many_holders, &a)), 0);
    mp_semaphore_release(a.s);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lock_mutual_exclusion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_misuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rlock_recursion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_owner_dead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rlock_owner_dead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_semaphore_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_semaphore_pingpong, setup, teardown),
        cmocka_unit_test_setup_teardown(test_semaphore_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event, setup, teardown),
        cmocka_unit_test_setup_teardown(test_condition, setup, teardown),
        cmocka_unit_test_setup_teardown(test_condition_wait_for, setup, teardown),
        cmocka_unit_test_setup_teardown(test_condition_owner_dead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_semaphore_holders_max, setup, teardown),
    };
    (void)argc;
    (void)argv;
    warm_up();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
