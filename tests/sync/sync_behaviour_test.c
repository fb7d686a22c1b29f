/* Sync behaviours Python users rely on, with the other parties started by
 * fork, spawn and forkserver: a Barrier's action runs exactly once per
 * round (in whichever process arrives last), a failing action breaks the
 * barrier, a default timeout set at creation; and mp_lock_locked tells the
 * truth after the holder died. */
#include "helpers.h"

#include <signal.h>
#include <string.h>

/* The counts tensor of this process (int32[4]): [0] actions run, [1] the
 * pid that ran the last one, [2] the action's verdict (0 ok, else its
 * return). The action has no argument, as Python's: it uses this global. */
static mp_tensor *counts;

static int32_t *cnt(void) { return mp_tensor_data(counts); }

static int count_action(void)
{
    __atomic_fetch_add(&cnt()[0], 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&cnt()[1], (int32_t)getpid(), __ATOMIC_SEQ_CST);
    return __atomic_load_n(&cnt()[2], __ATOMIC_SEQ_CST);
}

enum { ROUNDS = 20 };

/* A party: waits ROUNDS rounds; after each, the action ran exactly once
 * per round so far. Then waits for the failing round. */
MP_ENTRY(barrier_party)
{
    mp_barrier *b = NULL;
    if (mp_msg_find_tensor(args, "counts", &counts) != 0 ||
        mp_msg_get_barrier(args, 1, &b) != 0)
        mp_raise("barrier_party: bad arguments: %s", mp_last_error());
    for (int r = 0; r < ROUNDS; r++) {
        int rc = mp_barrier_wait(b, 20, NULL);
        if (rc)
            mp_raise("round %d: %s", r, mp_last_error());
        if (__atomic_load_n(&cnt()[0], __ATOMIC_SEQ_CST) < r + 1)
            mp_raise("round %d passed before its action ran", r);
    }
    /* the parent makes the action fail: every party sees the break */
    if (mp_barrier_wait(b, 20, NULL) != MP_EBROKEN)
        mp_raise("a failing action did not break the barrier");
    mp_barrier_release(b);
    mp_tensor_release(counts);
    counts = NULL;
    return 0;
}

static void join_ok(mp_process *p)
{
    mp_child_error e = {.size = sizeof e};
    assert_mp_ok(mp_process_join(p, 30));
    assert_mp_ok(mp_process_error(p, &e));
    if (e.exitcode != 0)
        fail_msg("child exited %d: %s", e.exitcode, e.message);
    assert_mp_ok(mp_process_destroy(p));
}

static void check_barrier_action(const char *method)
{
    mp_barrier_options o;
    mp_barrier *b = NULL;
    mp_msg *args = NULL;
    mp_process *kids[2];
    int64_t four = 4;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &four, &counts));
    mp_barrier_options_init(&o);
    o.action = count_action;
    assert_mp_ok(mp_barrier_create_ex(3, &o, &b));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_tensor(args, "counts", counts));
    assert_mp_ok(mp_msg_add_barrier(args, "b", b));
    for (int i = 0; i < 2; i++)
        kids[i] = mp_test_start("barrier_party", args, method);
    mp_msg_destroy(args);
    for (int r = 0; r < ROUNDS; r++) {
        assert_mp_ok(mp_barrier_wait(b, 20, NULL));
        assert_true(cnt()[0] >= r + 1);
    }
    /* all parties are past round ROUNDS-1 only after its action: exactly
     * one action per round, whoever ran it */
    for (int i = 0; i < 200 && mp_barrier_n_waiting(b) < 2; i++)
        nap(0.01);
    assert_int_equal(cnt()[0], ROUNDS);
    cnt()[2] = 7; /* the next action fails */
    assert_mp_err(mp_barrier_wait(b, 20, NULL), MP_EBROKEN);
    assert_int_equal(mp_barrier_broken(b), 1);
    for (int i = 0; i < 2; i++)
        join_ok(kids[i]);
    assert_int_equal(cnt()[0], ROUNDS + 1);
    mp_barrier_release(b);
    mp_tensor_release(counts);
    counts = NULL;
}

static void test_barrier_action_timeout(void **state)
{
    mp_barrier_options o;
    mp_barrier *b = NULL;
    int64_t four = 4;
    unsigned idx = 9;
    double t0;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &four, &counts));
    /* one party: the action runs on every wait, in this thread */
    mp_barrier_options_init(&o);
    o.action = count_action;
    assert_mp_ok(mp_barrier_create_ex(1, &o, &b));
    assert_mp_ok(mp_barrier_wait(b, MP_BARRIER_DEFAULT_TIMEOUT, &idx));
    assert_int_equal(idx, 0);
    assert_int_equal(cnt()[0], 1);
    assert_int_equal(cnt()[1], getpid());
    mp_barrier_release(b);
    /* a default timeout: waits without one use it */
    mp_barrier_options_init(&o);
    o.timeout = 0.2;
    assert_mp_ok(mp_barrier_create_ex(2, &o, &b));
    t0 = mp__now();
    assert_mp_err(mp_barrier_wait(b, MP_BARRIER_DEFAULT_TIMEOUT, NULL), MP_ETIMEDOUT);
    assert_true(mp__now() - t0 >= 0.19 && mp__now() - t0 < 10);
    assert_int_equal(mp_barrier_broken(b), 1);
    mp_barrier_release(b);
    /* misuse */
    assert_mp_err(mp_barrier_create_ex(2, &(mp_barrier_options){0}, &b), MP_EINVAL);
    o.timeout = MP_BARRIER_DEFAULT_TIMEOUT;
    assert_mp_err(mp_barrier_create_ex(2, &o, &b), MP_EINVAL);
    mp_barrier_options_init(&o);
    o.action = (mp_barrier_action_fn)(void *)&four;  /* a stack address: refused */
    assert_mp_err(mp_barrier_create_ex(2, &o, &b), MP_EINVAL);
    assert_null(b);
    mp_tensor_release(counts);
    counts = NULL;
}

/* ---- the lock's holder dies ------------------------------------------------ */

MP_ENTRY(lock_and_die)
{
    mp_lock *l = NULL;
    if (mp_msg_get_lock(args, 0, &l) != 0 || mp_lock_lock(l, 20) != 0)
        mp_raise("lock_and_die: %s", mp_last_error());
    _exit(0); /* holding it */
}

static void check_lock_dead_holder(const char *method)
{
    mp_lock *l = NULL;
    mp_msg *args = NULL;
    mp_process *p;
    assert_mp_ok(mp_lock_create(&l));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_lock(args, NULL, l));
    p = mp_test_start("lock_and_die", args, method);
    mp_msg_destroy(args);
    join_ok(p);
    assert_int_equal(mp_lock_locked(l), 1); /* left taken by the dead */
    assert_mp_err(mp_lock_unlock(l), MP_EPERM);
    assert_non_null(strstr(mp_last_error(), "died holding it"));
    assert_mp_err(mp_lock_lock(l, 5), MP_EOWNERDEAD);
    assert_int_equal(mp_lock_locked(l), 1); /* now ours */
    assert_mp_ok(mp_lock_consistent(l));
    assert_mp_ok(mp_lock_unlock(l));
    assert_int_equal(mp_lock_locked(l), 0);
    assert_mp_err(mp_lock_unlock(l), MP_ESTATE);
    mp_lock_release(l);
}

#define EACH(name, fn)                                                                            \
    static void name##_fork(void **s) { fn("fork"); }                                             \
    static void name##_spawn(void **s) { fn("spawn"); }                                           \
    static void name##_forkserver(void **s)                                                       \
    {                                                                                              \
        fn("forkserver");                                                                          \
        mp_forkserver_stop();                                                                      \
    }

EACH(barrier_action, check_barrier_action)
EACH(lock_dead_holder, check_lock_dead_holder)

#define T(t) cmocka_unit_test_setup_teardown(t, setup, teardown)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(test_barrier_action_timeout), T(barrier_action_fork),   T(barrier_action_spawn),
        T(barrier_action_forkserver),   T(lock_dead_holder_fork), T(lock_dead_holder_spawn),
        T(lock_dead_holder_forkserver),
    };
    if (mp_setup(&argc, &argv) != 0) /* spawned children run from here */
        return 1;
    warm_up();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
