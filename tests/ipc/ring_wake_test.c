/* The ring's wait flags (src/ipc/ring_impl.h, wait_flag): a process that
 * runs late must not take down the flag of a later wait. Each test stops
 * processes at chosen steps of the protocol (the mp__ring_fault hook) to
 * build the interleaving that lost the wake-up before the flags held a
 * position, checks that the late process left the flag up, then times the
 * wake-up: it must come at once, not at the end of the sleeper's 50-ms
 * slice.
 *
 *   sleeping:    a producer that published slot 0 and stopped before its
 *                wake-up runs on while a consumer flags itself asleep for
 *                slot 1; the producer of slot 1 must then wake it.
 *   space_wait:  a consumer that took slot 0 and stopped before looking at
 *                the flag runs on while a producer flags itself waiting for
 *                room at head 1; the consumer that takes slot 1 must then
 *                wake it. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/ipc.h"
#include "mp_test.h"
#include "os/os.h"

/* A wake-up that works takes microseconds; a lost one waits out the
 * sleeper's slice (50 ms). */
#define WAKE_LIMIT_S 0.040

/* What the parent and its stopped children share. */
typedef struct stops {
    _Atomic int stopped; /* the step a child stopped at, 0 when none */
    _Atomic int go;      /* the parent lets the child stopped at this step go on */
    _Atomic int left;    /* the child has left the hook */
    _Atomic double woke; /* when the waiter's call returned (mp__now) */
} stops;

static stops *sh;
static int stop_step;

/* The hook: stops the first time the child reaches stop_step, until the
 * parent says go. */
static void stopper(int step)
{
    struct timespec nap = {0, 200000};
    if (step != stop_step)
        return;
    stop_step = 0;
    atomic_store(&sh->stopped, step);
    while (atomic_load(&sh->go) != step)
        nanosleep(&nap, NULL);
    atomic_store(&sh->left, 1);
}

static pid_t child_stopping_at(int step)
{
    pid_t pid;
    atomic_store(&sh->stopped, 0);
    atomic_store(&sh->left, 0);
    atomic_store(&sh->go, 0);
    if ((pid = fork()) == 0) {
        stop_step = step;
        mp__ring_fault = stopper;
    }
    return pid;
}

/* Waits (10 s at most) until the child stopped at step. */
static void wait_stopped(int step)
{
    double until = mp__now() + 10;
    while (atomic_load(&sh->stopped) != step) {
        if (mp__now() > until)
            fail_msg("no child stopped at ring step %d within 10 s", step);
        usleep(200);
    }
}

/* Lets the stopped child go on and waits (10 s at most) until it has left
 * the hook and sleeps again: in the wait the test is about. */
static void let_go_to_sleep(pid_t pid, int step)
{
    double until = mp__now() + 10;
    atomic_store(&sh->left, 0); /* the other child's, which has exited */
    atomic_store(&sh->go, step);
    while (!atomic_load(&sh->left) || mp_test_proc_state(pid) != 'S') {
        if (mp__now() > until)
            fail_msg("child %d did not go to sleep within 10 s", (int)pid);
        usleep(200);
    }
    usleep(2000); /* well inside the futex, not on its way there */
}

static void let_go(int step)
{
    atomic_store(&sh->go, step);
}

/* The ring e's messages go through. */
static mp__ring *ring_of(mp_test_ep *e)
{
    mp__ring *r = e->q ? &((mp__queue *)e->q)->ctl->ring : mp__conn_ring(e->rx);
    assert_non_null(r);
    return r;
}

/* After the late process ran: the waiter's flag must still be up. */
static void expect_flag_up(_Atomic uint64_t *flag, const char *which, const char *late)
{
    if (!atomic_load(flag))
        fail_msg("%s took down %s, set for a later wait", late, which);
}

static mp_msg *small(int i)
{
    return mp_test_payload_msg(&i, sizeof i);
}

static int recv_one(mp_test_ep *e, int *value)
{
    mp_msg *m = NULL;
    size_t len = 0;
    int rc = mp_test_ep_recv(e, &m, 5);
    if (rc == 0) {
        const void *p = mp_msg_payload(m, &len);
        if (len == sizeof *value)
            memcpy(value, p, sizeof *value);
        mp_msg_destroy(m);
    }
    return rc;
}

static void expect_woken_within(double since, const char *who)
{
    double waited = atomic_load(&sh->woke) - since;
    printf("ring_wake: %s woke %.2f ms after its wake-up was sent\n", who, waited * 1e3);
    if (waited > WAKE_LIMIT_S)
        fail_msg("%s slept %.1f ms after its wake-up was due (lost wake-up; limit %.0f ms)", who,
                 waited * 1e3, WAKE_LIMIT_S * 1e3);
}

static void sleeping_consumer(bool queue)
{
    pid_t producer, consumer;
    double sent_at;
    mp_test_ep e;
    mp_test_ep_open(&e, queue, false);
    /* A producer publishes slot 0 and stops before its wake-up. */
    if ((producer = child_stopping_at(MP__RING_STEP_UNLOCKED)) == 0)
        _exit(mp_test_ep_send(&e, small(0), 5) == 0 ? 0 : 1);
    wait_stopped(MP__RING_STEP_UNLOCKED);
    /* A consumer takes it, then flags itself asleep for slot 1 and stops. */
    if ((consumer = child_stopping_at(MP__RING_STEP_SLEEPING)) == 0) {
        int a = -1, b = -1;
        if (recv_one(&e, &a) != 0 || a != 0 || recv_one(&e, &b) != 0 || b != 1)
            _exit(1);
        atomic_store(&sh->woke, mp__now());
        _exit(0);
    }
    wait_stopped(MP__RING_STEP_SLEEPING);
    let_go(MP__RING_STEP_UNLOCKED); /* the late producer looks at the flag now */
    mp_test_expect_exit0_within(producer, 10, "ring_wake: the stopped producer");
    expect_flag_up(&ring_of(&e)->sleeping, "`sleeping`", "the late producer");
    let_go_to_sleep(consumer, MP__RING_STEP_SLEEPING);
    sent_at = mp__now();
    assert_mp_ok(mp_test_ep_send(&e, small(1), 5));
    mp_test_expect_exit0_within(consumer, 10, "ring_wake: the sleeping consumer");
    expect_woken_within(sent_at, queue ? "a queue's consumer" : "a pipe's consumer");
    mp_test_ep_close(&e);
}

static void waiting_producer(bool queue)
{
    pid_t consumer, producer;
    double took_at;
    int v = -1;
    mp_test_ep e;
    mp_test_ep_open(&e, queue, false);
    for (int i = 0; i < (int)MP__RING_SLOTS; i++)
        assert_mp_ok(mp_test_ep_send(&e, small(i), 0));
    /* A consumer takes slot 0 and stops before looking at space_wait. */
    if ((consumer = child_stopping_at(MP__RING_STEP_CLAIMED)) == 0)
        _exit(recv_one(&e, &v) == 0 && v == 0 ? 0 : 1);
    wait_stopped(MP__RING_STEP_CLAIMED);
    assert_mp_ok(mp_test_ep_send(&e, small(MP__RING_SLOTS), 0)); /* full again, at head 1 */
    /* A producer finds it full, flags itself waiting for head 1, stops. */
    if ((producer = child_stopping_at(MP__RING_STEP_SPACE_WAIT)) == 0) {
        if (mp_test_ep_send(&e, small(MP__RING_SLOTS + 1), 5) != 0)
            _exit(1);
        atomic_store(&sh->woke, mp__now());
        _exit(0);
    }
    wait_stopped(MP__RING_STEP_SPACE_WAIT);
    let_go(MP__RING_STEP_CLAIMED); /* the late consumer looks at the flag now */
    mp_test_expect_exit0_within(consumer, 10, "ring_wake: the stopped consumer");
    expect_flag_up(&ring_of(&e)->space_wait, "`space_wait`", "the late consumer");
    let_go_to_sleep(producer, MP__RING_STEP_SPACE_WAIT);
    took_at = mp__now();
    assert_mp_ok(recv_one(&e, &v));
    assert_int_equal(v, 1);
    mp_test_expect_exit0_within(producer, 10, "ring_wake: the waiting producer");
    expect_woken_within(took_at, queue ? "a queue's producer" : "a pipe's producer");
    for (int i = 2; i <= (int)MP__RING_SLOTS + 1; i++) {
        assert_mp_ok(recv_one(&e, &v));
        assert_int_equal(v, i);
    }
    mp_test_ep_close(&e);
}

static void test_sleeping_queue(void **state) { (void)state; sleeping_consumer(true); }
static void test_sleeping_pipe(void **state) { (void)state; sleeping_consumer(false); }
static void test_space_wait_queue(void **state) { (void)state; waiting_producer(true); }
static void test_space_wait_pipe(void **state) { (void)state; waiting_producer(false); }

static int setup(void **state)
{
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return -1;
    return mp_test_setup_fd(state);
}

static int teardown(void **state)
{
    int rc = mp_test_teardown(state);
    munmap(sh, sizeof *sh);
    return rc;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sleeping_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sleeping_pipe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_space_wait_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_space_wait_pipe, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
