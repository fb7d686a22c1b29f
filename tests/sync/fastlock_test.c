/* src/sync/fastlock: the inline robust-mutex fast path shares glibc's
 * robust list, so a process or thread that dies holding any mix of locks
 * taken through it and through glibc leaves every one of them
 * EOWNERDEAD, and the ones it released free. */
#include "helpers.h"
#include "sync/sync_internal.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

/* Robust, process-shared glibc mutexes in a shared page, beside two
 * mp_locks (taken inline). */
typedef struct mixed {
    pthread_mutex_t g[3];
    mp_lock *l[2];
} mixed;

static void init_glibc(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    assert_int_equal(pthread_mutexattr_init(&a), 0);
    assert_int_equal(pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED), 0);
    assert_int_equal(pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST), 0);
    assert_int_equal(pthread_mutex_init(m, &a), 0);
    pthread_mutexattr_destroy(&a);
}

static mixed *mixed_new(void)
{
    mixed *x = shared_page();
    for (int i = 0; i < 3; i++)
        init_glibc(&x->g[i]);
    assert_mp_ok(mp_lock_create(&x->l[0]));
    assert_mp_ok(mp_lock_create(&x->l[1]));
    return x;
}

static void mixed_free(mixed *x)
{
    for (int i = 0; i < 3; i++)
        pthread_mutex_destroy(&x->g[i]);
    mp_lock_release(x->l[0]);
    mp_lock_release(x->l[1]);
    munmap(x, 4096);
}

/* Takes g0, l0, g1, l1, g2 interleaved, releases l0 and g1 (from the
 * middle of the list, each through the other implementation's neighbours),
 * and dies holding g0, g2 and l1. */
static int take_mixed_and_die(void *p)
{
    mixed *x = p;
    if (!mp__robust_fast_available())
        return 10;
    if (pthread_mutex_lock(&x->g[0]) || mp_lock_lock(x->l[0], 0) ||
        pthread_mutex_lock(&x->g[1]) || mp_lock_lock(x->l[1], 0) ||
        pthread_mutex_lock(&x->g[2]))
        return 1;
    if (mp_lock_unlock(x->l[0]) || pthread_mutex_unlock(&x->g[1]))
        return 2;
    raise(SIGKILL);
    return 3;
}

static void assert_dead_then_free(pthread_mutex_t *m)
{
    assert_int_equal(pthread_mutex_trylock(m), EOWNERDEAD);
    assert_int_equal(pthread_mutex_consistent(m), 0);
    assert_int_equal(pthread_mutex_unlock(m), 0);
}

static void test_mixed_death(void **state)
{
    mixed *x = mixed_new();
    (void)state;
    assert_true(mp__robust_fast_available());
    assert_int_equal(reap(fork_child(take_mixed_and_die, x)), 128 + SIGKILL);
    assert_dead_then_free(&x->g[0]);
    assert_dead_then_free(&x->g[2]);
    assert_int_equal(pthread_mutex_trylock(&x->g[1]), 0); /* released: free */
    assert_int_equal(pthread_mutex_unlock(&x->g[1]), 0);
    assert_mp_ok(mp_lock_lock(x->l[0], 0));
    assert_mp_ok(mp_lock_unlock(x->l[0]));
    assert_mp_err(mp_lock_lock(x->l[1], 0), MP_EOWNERDEAD);
    assert_mp_ok(mp_lock_consistent(x->l[1]));
    assert_mp_ok(mp_lock_unlock(x->l[1]));
    /* This thread's own list is whole: it takes and gives back all five. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_mutex_lock(&x->g[i]), 0);
    assert_mp_ok(mp_lock_lock(x->l[0], 0));
    assert_mp_ok(mp_lock_lock(x->l[1], 0));
    assert_int_equal(pthread_mutex_unlock(&x->g[1]), 0);
    assert_mp_ok(mp_lock_unlock(x->l[0]));
    assert_int_equal(pthread_mutex_unlock(&x->g[0]), 0);
    assert_mp_ok(mp_lock_unlock(x->l[1]));
    assert_int_equal(pthread_mutex_unlock(&x->g[2]), 0);
    mixed_free(x);
}

/* A thread that ends holding a lock: the kernel walks its robust list at
 * thread exit too. */
static void *hold_and_exit(void *p)
{
    mp_lock *l = p;
    return (void *)(intptr_t)(mp__robust_fast_available() ? mp_lock_lock(l, 0) : -1);
}

static void test_thread_exit_holding(void **state)
{
    mp_lock *l;
    pthread_t th;
    void *rc;
    (void)state;
    assert_mp_ok(mp_lock_create(&l));
    assert_int_equal(pthread_create(&th, NULL, hold_and_exit, l), 0);
    assert_int_equal(pthread_join(th, &rc), 0);
    assert_int_equal((intptr_t)rc, 0);
    assert_mp_err(mp_lock_lock(l, 0), MP_EOWNERDEAD);
    assert_mp_ok(mp_lock_consistent(l));
    assert_mp_ok(mp_lock_unlock(l));
    mp_lock_release(l);
}

/* A forked child is a new thread to the fast path (new tid, fresh list):
 * its lock carries its own pid, and its death is seen. */
static int lock_report_die(void *p)
{
    mp_lock *l = p;
    if (mp_lock_lock(l, 0) != 0)
        return 1;
    raise(SIGKILL);
    return 2;
}

static void test_fork_child_rechecks(void **state)
{
    mp_lock *l;
    pid_t pid;
    char want[32];
    (void)state;
    assert_mp_ok(mp_lock_create(&l));
    assert_mp_ok(mp_lock_lock(l, 0)); /* the parent used the fast path first */
    assert_mp_ok(mp_lock_unlock(l));
    pid = fork_child(lock_report_die, l);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_mp_err(mp_lock_lock(l, 0), MP_EOWNERDEAD);
    snprintf(want, sizeof want, "pid %d", (int)pid);
    assert_non_null(strstr(mp_last_error(), want));
    assert_mp_ok(mp_lock_consistent(l));
    assert_mp_ok(mp_lock_unlock(l));
    mp_lock_release(l);
}

static int take_guard_and_die(void *p)
{
    pthread_mutex_t *m = p;
    if (pthread_mutex_lock(m) != 0 || pthread_mutex_unlock(m) != 0)
        return 1;
    mp__guard_lock(m);
    raise(SIGKILL);
    return 2;
}

/* A waiter queued in the kernel (FUTEX_WAITERS set by glibc's slow path)
 * is woken by the fast release, which hands the wake to its slow path. */
static void *acquire_waiting(void *p)
{
    mp_lock *l = p;
    int rc = mp_lock_lock(l, 10);
    if (rc == 0)
        rc = mp_lock_unlock(l);
    return (void *)(intptr_t)rc;
}

static void test_fast_release_wakes_waiter(void **state)
{
    mp_lock *l;
    pthread_t th;
    void *rc;
    (void)state;
    assert_mp_ok(mp_lock_create(&l));
    assert_mp_ok(mp_lock_lock(l, 0));
    assert_int_equal(pthread_create(&th, NULL, acquire_waiting, l), 0);
    nap(0.1); /* long enough for the waiter to sleep in the kernel, usually */
    assert_mp_ok(mp_lock_unlock(l));
    assert_int_equal(pthread_join(th, &rc), 0);
    assert_int_equal((intptr_t)rc, 0);
    assert_false(mp_lock_locked(l));
    mp_lock_release(l);
}

/* The fast paths leave glibc's __owner, __count and __nusers alone (a
 * free mutex may keep a stale tid in __owner): glibc's own calls must
 * still see the right state through every mix, in this thread and another
 * one (whose tid is not the stale one). */
static void *glibc_then_fast(void *p)
{
    pthread_mutex_t *m = p;
    int bad = pthread_mutex_trylock(m) != 0 || pthread_mutex_trylock(m) != EDEADLK ||
              pthread_mutex_unlock(m) != 0;
    mp__guard_lock(m);
    bad |= pthread_mutex_trylock(m) != EDEADLK;
    mp__guard_unlock(m);
    return (void *)(intptr_t)bad;
}

static void test_glibc_fields_left_alone(void **state)
{
    pthread_mutex_t *m = shared_page();
    pthread_t th;
    void *bad;
    (void)state;
    assert_mp_ok(mp__robust_init(m, MP__MUTEX_ERRORCHECK, "test"));
    assert_true(mp__robust_fast_available());
    /* fast lock, glibc unlock; glibc lock (writes __owner), fast unlock */
    mp__guard_lock(m);
    assert_int_equal(pthread_mutex_trylock(m), EDEADLK);
    assert_int_equal(pthread_mutex_unlock(m), 0);
    assert_int_equal(pthread_mutex_lock(m), 0);
    mp__guard_unlock(m);
    assert_false(mp__mutex_held(m));
    /* another thread over the stale __owner */
    assert_int_equal(pthread_create(&th, NULL, glibc_then_fast, m), 0);
    assert_int_equal(pthread_join(th, &bad), 0);
    assert_int_equal((intptr_t)bad, 0);
    /* a holder that dies after such a mix still leaves it EOWNERDEAD */
    assert_int_equal(reap(fork_child(take_guard_and_die, m)), 128 + SIGKILL);
    assert_int_equal(pthread_mutex_trylock(m), EOWNERDEAD);
    assert_int_equal(pthread_mutex_consistent(m), 0);
    mp__guard_unlock(m); /* consistent again: the fast release takes it */
    assert_false(mp__mutex_held(m));
    pthread_mutex_destroy(m);
    munmap(m, 4096);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mixed_death, setup, teardown),
        cmocka_unit_test_setup_teardown(test_thread_exit_holding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork_child_rechecks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fast_release_wakes_waiter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_glibc_fields_left_alone, setup, teardown),
    };
#if !defined(__GLIBC__) || !defined(__PTHREAD_MUTEX_HAVE_PREV) || defined(__SANITIZE_THREAD__)
    fprintf(stderr, "fastlock_test: no inline fast path on this libc or under TSan\n");
    return 77;
#endif
    warm_up();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
