/* Handoff without an fd (src/shm/pins.c): a storage sent again to the same
 * end crosses with no fd, the receiver's fds stay flat, the storage
 * outlives its sender while a message names it, a failed send gives its
 * count back, a second receiving process turns pins off and still gets
 * every message (or MP_EBROKEN, named, when nobody holds the storage any
 * more), and a producer or consumer SIGKILLed at every step of a pinned
 * handoff leaves the others working and nothing mapped. */
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/ipc.h"
#include "mp_test.h"
#include "shm/pins.h"

static int setup(void **state) { return mp_test_setup_fd(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

#define N 20

static uint64_t by_pin(void) { return mp_test_tensor_stats().segments_received_by_pin; }

/* One end for the tests: a queue, or a one-way pipe (sent on tx, received
 * on rx). */
typedef mp_test_ep ep;
static void ep_open(ep *e, bool queue) { mp_test_ep_open(e, queue, false); }
#define ep_close mp_test_ep_close
#define ep_recv mp_test_ep_recv

static mp__pins *ep_pins(const ep *e)
{
    return e->q ? &((mp__queue *)e->q)->ctl->rx.pins : mp__conn_pins(e->rx);
}

static int ep_send(ep *e, mp_msg *m) { return mp_test_ep_send(e, m, 5); }

/* A message of t, whose first element is set to seq first. */
static mp_msg *with(mp_tensor *t, int32_t seq)
{
    mp_msg *m = NULL;
    ((int32_t *)mp_tensor_data(t))[0] = seq;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, &seq, sizeof seq));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    return m;
}

static mp_msg *note(int32_t seq)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, &seq, sizeof seq));
    return m;
}

/* 0 when m carries seq (and, with a tensor, a tensor starting with it). */
static int seq_of(mp_msg *m, int32_t *seq)
{
    size_t len = 0;
    const void *p = mp_msg_payload(m, &len);
    mp_tensor *t = NULL;
    int bad = len != sizeof *seq;
    if (!bad)
        memcpy(seq, p, sizeof *seq);
    if (!bad && mp_msg_count(m) == 1) {
        bad = mp_msg_get_tensor(m, 0, &t) != 0 || ((int32_t *)mp_tensor_data(t))[0] != *seq;
        mp_tensor_release(t);
    }
    mp_msg_destroy(m);
    return bad;
}

static int recv_seq(ep *e, int32_t want, double timeout)
{
    mp_msg *m = NULL;
    int32_t seq = -1;
    int rc = ep_recv(e, &m, timeout);
    if (rc < 0)
        return rc;
    return seq_of(m, &seq) || seq != want ? 100 + want : 0;
}

static mp_tensor *tensor(void)
{
    int64_t n = 1024;
    mp_tensor *t = NULL;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &n, &t));
    return t;
}


/* ---- repeated handoffs ---------------------------------------------------- */

/* The child receives N messages of one storage: from the third on with no
 * fd (the second pinned it), with the data of each, and with as many fds
 * open after the last as after the third. */
static int receive_repeated(ep *e, mp_test_gate *ack)
{
    uint64_t pinned0 = by_pin();
    int fds = 0;
    for (int32_t i = 0; i < N; i++) {
        if (recv_seq(e, i, 10) != 0)
            return 10;
        if (i == 2)
            fds = mp_test_count_fds();
        mp_test_gate_pass(ack);
    }
    if (by_pin() - pinned0 != N - 2)
        return 11;
    if (mp_test_count_fds() != fds || mp__pins_held() != 1 ||
        atomic_load(&ep_pins(e)->owner) != getpid())
        return 12;
    ep_close(e);
    return mp__pins_held() == 0 ? 0 : 13;
}

static void repeated(bool queue)
{
    mp_tensor *t = tensor();
    mp_test_gate ack;
    pid_t pid;
    ep e;
    ep_open(&e, queue);
    mp_test_gate_open(&ack);
    if ((pid = fork()) == 0)
        _exit(receive_repeated(&e, &ack));
    for (int32_t i = 0; i < N; i++) {
        assert_mp_ok(ep_send(&e, with(t, i)));
        assert_int_equal(mp_test_gate_wait(&ack), 0); /* t is written only once received */
    }
    mp_test_expect_exit0(pid);
    assert_int_equal(atomic_load(&ep_pins(&e)->owner), 0); /* let go cleanly */
    mp_test_gate_close(&ack);
    ep_close(&e);
    mp_tensor_release(t);
}

static void test_repeated_pipe(void **state) { (void)state; repeated(false); }
static void test_repeated_queue(void **state) { (void)state; repeated(true); }

/* The sender lets go of the storage while a message names it: the
 * receiver's pin keeps it, with its data. */
static void test_pin_outlives_sender(void **state)
{
    mp_tensor *t = tensor();
    mp_test_gate ack, go;
    pid_t pid;
    ep e;
    (void)state;
    ep_open(&e, false);
    mp_test_gate_open(&ack);
    mp_test_gate_open(&go);
    if ((pid = fork()) == 0) {
        uint64_t pinned0 = by_pin();
        for (int32_t i = 0; i < 2; i++) {
            if (recv_seq(&e, i, 10))
                _exit(10);
            mp_test_gate_pass(&ack);
        }
        if (mp_test_gate_wait(&go) || recv_seq(&e, 77, 10))
            _exit(11);
        _exit(by_pin() - pinned0 == 1 ? 0 : 12);
    }
    for (int32_t i = 0; i < 2; i++) {
        assert_mp_ok(ep_send(&e, with(t, i)));
        assert_int_equal(mp_test_gate_wait(&ack), 0);
    }
    assert_mp_ok(ep_send(&e, with(t, 77)));
    mp_tensor_release(t); /* the last reference here: unmapped, fd closed */
    mp_test_gate_pass(&go);
    mp_test_expect_exit0(pid);
    mp_test_gate_close(&ack);
    mp_test_gate_close(&go);
    ep_close(&e);
}

/* In one process: a send that times out on a full ring gives its count
 * back, so the owner's last handle lets go of the pin cleanly. */
static void test_failed_send_gives_count_back(void **state)
{
    mp_tensor *t = tensor();
    mp__pins *p;
    uint64_t pinned0 = by_pin(), inflight = 0;
    int n = 0;
    ep e;
    (void)state;
    ep_open(&e, false);
    p = ep_pins(&e);
    for (int32_t i = 0; i < 2; i++) {
        assert_mp_ok(ep_send(&e, with(t, i)));
        assert_int_equal(recv_seq(&e, i, 5), 0);
    }
    assert_int_equal(mp__pins_held(), 1);
    mp_msg *small = note(0);
    while (mp_conn_send(e.tx, small, 0) == 0)
        n++;
    mp_msg_destroy(small);
    assert_true(n >= (int)MP__RING_SLOTS - 1);
    small = with(t, 5);
    assert_mp_err(mp_conn_send(e.tx, small, 0), MP_ETIMEDOUT);
    mp_msg_destroy(small);
    for (unsigned i = 0; i < MP__PIN_SLOTS; i++)
        inflight += (atomic_load(&p->slot[i].state) & MP__PIN_SENT) - atomic_load(&p->done[i]);
    assert_int_equal(inflight, 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(recv_seq(&e, 0, 5), 0);
    assert_mp_ok(ep_send(&e, with(t, 6)));
    assert_int_equal(recv_seq(&e, 6, 5), 0);
    assert_int_equal(by_pin() - pinned0, 1);
    mp_conn_release(e.rx);
    e.rx = NULL;
    assert_int_equal(mp__pins_held(), 0);
    assert_int_equal(atomic_load(&p->owner), 0); /* let go cleanly: free to claim */
    ep_close(&e);
    mp_tensor_release(t);
}

/* A pin that no message named for over 1024 storages received on its end
 * is let go (so a stream that moved on does not keep old storages mapped);
 * the one in use stays. */
static void test_idle_pin_is_let_go(void **state)
{
    mp_tensor *old = tensor(), *cur = tensor();
    ep e;
    (void)state;
    ep_open(&e, false);
    for (int32_t i = 0; i < 2; i++) {
        assert_mp_ok(ep_send(&e, with(old, i)));
        assert_int_equal(recv_seq(&e, i, 5), 0);
    }
    assert_int_equal(mp__pins_held(), 1);
    for (int32_t i = 0; i < 1200; i++) {
        assert_mp_ok(ep_send(&e, with(cur, i)));
        assert_int_equal(recv_seq(&e, i, 5), 0);
    }
    assert_int_equal(mp__pins_held(), 1); /* cur's; old's was let go */
    assert_mp_ok(ep_send(&e, with(old, 7))); /* with its fd again */
    assert_int_equal(recv_seq(&e, 7, 5), 0);
    ep_close(&e);
    assert_int_equal(mp__pins_held(), 0);
    mp_tensor_release(old);
    mp_tensor_release(cur);
}

/* ---- a second receiving process ------------------------------------------- */

/* O (the owner) pins t, then R takes a message naming O's pin: R's cache
 * does not have t (made after the fork), so R opens it through O's fd,
 * and the queue's pins are off from then on. With kill_owner, the sender
 * lets go of t and O is killed first: nobody holds t any more, and R gets
 * MP_EBROKEN for that message and the next one normally. */
static void second_receiver(bool kill_owner)
{
    mp_test_gate ack, go_r, done_r;
    pid_t owner, reader;
    mp_tensor *t;
    mp_msg *m;
    ep e;
    ep_open(&e, true);
    mp_test_gate_open(&ack);
    mp_test_gate_open(&go_r);
    mp_test_gate_open(&done_r);
    if ((owner = fork()) == 0) {
        for (int32_t i = 0; i < 2; i++) {
            if (recv_seq(&e, i, 10))
                _exit(10);
            mp_test_gate_pass(&ack);
        }
        pause(); /* holds the pin until killed */
        _exit(0);
    }
    if ((reader = fork()) == 0) {
        uint64_t pinned0 = by_pin();
        if (mp_test_gate_wait(&go_r))
            _exit(20);
        if (kill_owner) {
            if (ep_recv(&e, &m, 10) != MP_EBROKEN || !strstr(mp_last_error(), "has exited"))
                _exit(21);
        } else if (recv_seq(&e, 2, 10) || by_pin() - pinned0 != 1) {
            _exit(22);
        }
        if (atomic_load(&ep_pins(&e)->owner) != MP__PINS_OFF)
            _exit(23);
        mp_test_gate_pass(&done_r);
        if (recv_seq(&e, 3, 10) || by_pin() - pinned0 != !kill_owner)
            _exit(24); /* pins off: 3 came with its fd */
        _exit(0);
    }
    t = tensor();
    for (int32_t i = 0; i < 2; i++) {
        assert_mp_ok(ep_send(&e, with(t, i)));
        assert_int_equal(mp_test_gate_wait(&ack), 0);
    }
    assert_int_equal(atomic_load(&ep_pins(&e)->owner), owner);
    assert_mp_ok(ep_send(&e, with(t, 2)));
    if (kill_owner) {
        mp_tensor_release(t);
        t = NULL;
        kill(owner, SIGKILL);
        assert_int_equal(WTERMSIG(mp_test_reap(owner)), SIGKILL);
    }
    mp_test_gate_pass(&go_r);
    assert_int_equal(mp_test_gate_wait(&done_r), 0);
    assert_mp_ok(ep_send(&e, kill_owner ? note(3) : with(t, 3)));
    mp_test_expect_exit0(reader);
    if (!kill_owner) {
        kill(owner, SIGKILL);
        mp_test_reap(owner);
    }
    mp_tensor_release(t);
    mp_test_gate_close(&ack);
    mp_test_gate_close(&go_r);
    mp_test_gate_close(&done_r);
    ep_close(&e);
}

static void test_second_receiver_turns_pins_off(void **state)
{
    (void)state;
    second_receiver(false);
}

static void test_broken_when_nobody_holds_it(void **state)
{
    (void)state;
    second_receiver(true);
}

/* ---- SIGKILL at every step ------------------------------------------------ */

static int kill_step;
static void killer(int step)
{
    if (step == kill_step)
        raise(SIGKILL);
}

/* The child sends t twice (the parent pins it), then a third time by the
 * pin and is killed at step: the message arrives iff it was published,
 * and the parent's own pinned send still works, a count the child left or
 * not. Teardown finds nothing mapped. */
static void producer_killed(int step)
{
    mp_tensor *t = tensor();
    uint64_t pinned0;
    bool published = step == MP__RING_STEP_PUBLISHED || step == MP__RING_STEP_UNLOCKED;
    mp_test_gate ack;
    pid_t pid;
    ep e;
    ep_open(&e, false);
    mp_test_gate_open(&ack);
    if ((pid = fork()) == 0) {
        for (int32_t i = 0; i < 2; i++)
            if (ep_send(&e, with(t, i)) || mp_test_gate_wait(&ack))
                _exit(10);
        kill_step = step;
        mp__ring_fault = killer;
        (void)ep_send(&e, with(t, 2));
        _exit(11);
    }
    for (int32_t i = 0; i < 2; i++) {
        assert_int_equal(recv_seq(&e, i, 10), 0);
        mp_test_gate_pass(&ack);
    }
    assert_int_equal(WTERMSIG(mp_test_reap(pid)), SIGKILL);
    pinned0 = by_pin();
    if (published)
        assert_int_equal(recv_seq(&e, 2, 5), 0);
    else
        assert_mp_err(recv_seq(&e, 2, 0.3), MP_ETIMEDOUT);
    assert_mp_ok(ep_send(&e, with(t, 3)));
    assert_int_equal(recv_seq(&e, 3, 5), 0);
    assert_int_equal(by_pin() - pinned0, 1u + published);
    mp_test_gate_close(&ack);
    ep_close(&e);
    assert_int_equal(mp__pins_held(), 0);
    mp_tensor_release(t);
}

static void test_producer_killed_at_every_step(void **state)
{
    (void)state;
    producer_killed(MP__RING_STEP_LOCKED);
    producer_killed(MP__RING_STEP_FILLED);
    producer_killed(MP__RING_STEP_PUBLISHED);
    producer_killed(MP__RING_STEP_UNLOCKED);
}

/* The child pins t and is killed taking a message that names the pin:
 * before it moved the ring's head the message is still there and the
 * parent gets it (from its own mapping, pins now off), after it the
 * message is lost; the next messages arrive either way. */
static void consumer_killed(int step)
{
    mp_tensor *t = tensor();
    bool kept = step == MP__RING_STEP_COPIED;
    uint64_t pinned0;
    mp_test_gate ack;
    pid_t pid;
    ep e;
    ep_open(&e, false);
    mp_test_gate_open(&ack);
    if ((pid = fork()) == 0) {
        mp_msg *m = NULL;
        for (int32_t i = 0; i < 2; i++) {
            if (recv_seq(&e, i, 10))
                _exit(10);
            mp_test_gate_pass(&ack);
        }
        kill_step = step;
        mp__ring_fault = killer;
        (void)ep_recv(&e, &m, 10);
        _exit(11);
    }
    for (int32_t i = 0; i < 2; i++) {
        assert_mp_ok(ep_send(&e, with(t, i)));
        assert_int_equal(mp_test_gate_wait(&ack), 0);
    }
    assert_mp_ok(ep_send(&e, with(t, 2)));
    assert_int_equal(WTERMSIG(mp_test_reap(pid)), SIGKILL);
    assert_mp_ok(ep_send(&e, note(3)));
    pinned0 = by_pin();
    if (kept)
        assert_int_equal(recv_seq(&e, 2, 5), 0);
    assert_int_equal(recv_seq(&e, 3, 5), 0);
    assert_int_equal(by_pin() - pinned0, kept);
    assert_int_equal(atomic_load(&ep_pins(&e)->owner), kept ? MP__PINS_OFF : pid);
    /* Kept: pins are off, 4 comes with its fd. Lost: nobody took a pinned
     * message since, so 4 still names the dead owner's pin; taking it turns
     * pins off. Either way 5 comes with its fd. */
    assert_mp_ok(ep_send(&e, with(t, 4)));
    assert_int_equal(recv_seq(&e, 4, 5), 0);
    assert_int_equal(by_pin() - pinned0, 1);
    assert_int_equal(atomic_load(&ep_pins(&e)->owner), MP__PINS_OFF);
    assert_mp_ok(ep_send(&e, with(t, 5)));
    assert_int_equal(recv_seq(&e, 5, 5), 0);
    assert_int_equal(by_pin() - pinned0, 1);
    mp_test_gate_close(&ack);
    ep_close(&e);
    mp_tensor_release(t);
}

static void test_consumer_killed_at_every_step(void **state)
{
    (void)state;
    consumer_killed(MP__RING_STEP_COPIED);
    consumer_killed(MP__RING_STEP_TAKEN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_repeated_pipe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repeated_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_outlives_sender, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_send_gives_count_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_pin_is_let_go, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_receiver_turns_pins_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broken_when_nobody_holds_it, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_killed_at_every_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_consumer_killed_at_every_step, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
