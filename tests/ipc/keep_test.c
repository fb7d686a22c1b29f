/* Kept file_system mappings (src/shm/pins_keep.c): a file_system storage that
 * arrives at a pipe's or queue's end a second time stays mapped there, so a
 * receiver that lets go of it between arrivals maps it twice in all, not
 * once per message; the kept mapping holds no reference, so the name leaves
 * /dev/shm as soon as its last user releases it (a SIGKILLed keeper
 * included); a kept storage whose name is gone is let go at the end's next
 * sweep; MPROC_PINS=0 turns keeping off. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp_test.h"
#include "shm/pins.h"

#define N 20
#define SWEEP 64 /* storages a sweep waits for (SWEEP_EVERY in src/shm/pins.c) */

static int setup(void **state)
{
    int rc = mp_test_setup(state);
    return rc ? rc : mp_set_sharing_strategy("file_system");
}
static int teardown(void **state) { return mp_test_teardown(state); }

static uint64_t mapped(void) { return mp_test_tensor_stats().segments_mapped; }


static mp_tensor *tensor(void)
{
    int64_t n = 1024;
    mp_tensor *t = NULL;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &n, &t));
    return t;
}

static void send_seq(mp_test_ep *e, mp_tensor *t, int32_t seq)
{
    mp_msg *m = NULL;
    ((int32_t *)mp_tensor_data(t))[0] = seq;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    assert_mp_ok(mp_test_ep_send(e, m, 5));
}

/* Sends t starting with seq and waits until it was received (and checked:
 * t is written again only then). */
static void send_acked(mp_test_ep *e, mp_tensor *t, int32_t seq, mp_test_gate *ack)
{
    send_seq(e, t, seq);
    assert_int_equal(mp_test_gate_wait(ack), 0);
}

/* Receives a tensor starting with seq: into *held, or released at once. */
static int recv_seq(mp_test_ep *e, int32_t seq, mp_tensor **held)
{
    mp_msg *m = NULL;
    mp_tensor *t = NULL;
    int bad = mp_test_ep_recv(e, &m, 10) != 0 || mp_msg_get_tensor(m, 0, &t) != 0 ||
              ((int32_t *)mp_tensor_data(t))[0] != seq;
    mp_msg_destroy(m);
    if (held && !bad)
        *held = t;
    else
        mp_tensor_release(t);
    return bad;
}

/* ---- the receiver maps a storage twice, however often it arrives --------- */

/* Receives arrivals first..first+n-1, releasing each; false on a bad one. */
static bool recv_acked(mp_test_ep *e, int32_t first, int32_t n, mp_test_gate *ack)
{
    for (int32_t i = first; i < first + n; i++) {
        if (recv_seq(e, i, NULL))
            return false;
        mp_test_gate_pass(ack);
    }
    return true;
}

/* Receives N arrivals of one storage, releasing each: mapped at the first
 * and kept at the second, never again. With MPROC_PINS=0, every time. */
static int receive_released(mp_test_ep *e, mp_test_gate *ack, bool keeping)
{
    uint64_t before = mapped();
    if (!recv_acked(e, 0, N, ack))
        return 10;
    if (mapped() - before != (keeping ? 2u : (uint64_t)N))
        return 11;
    if (mp__pins_held() != (keeping ? 1 : 0))
        return 12;
    mp_test_ep_close(e);
    return mp__pins_held() == 0 ? 0 : 13;
}

static void released(bool queue, bool keeping)
{
    mp_tensor *t;
    mp_test_ep e;
    mp_test_gate ack;
    pid_t pid;
    mp_test_ep_open(&e, queue, false);
    mp_test_gate_open(&ack);
    if ((pid = fork()) == 0) { /* before the storage: nothing is inherited */
        if (!keeping)
            setenv("MPROC_PINS", "0", 1);
        _exit(receive_released(&e, &ack, keeping));
    }
    t = tensor();
    for (int32_t i = 0; i < N; i++)
        send_acked(&e, t, i, &ack);
    mp_test_expect_exit0(pid);
    mp_test_gate_close(&ack);
    mp_test_ep_close(&e);
    mp_tensor_release(t);
}

static void test_kept_pipe(void **state) { (void)state; released(false, true); }
static void test_kept_queue(void **state) { (void)state; released(true, true); }
static void test_pins_off_maps_every_time(void **state) { (void)state; released(true, false); }

/* ---- the kept mapping holds no reference -------------------------------------- */

/* Keeps the storage, then holds one arrival until told to let go; then
 * receives SWEEP arrivals of another storage, after which the first (its
 * name gone) is no longer kept. */
static int keep_then_hold(mp_test_ep *e, mp_test_gate *ack, mp_test_gate *go)
{
    mp_tensor *held = NULL;
    if (!recv_acked(e, 0, 2, ack) || recv_seq(e, 2, &held))
        return 10;
    mp_test_gate_pass(ack);          /* holding arrival 2 */
    if (mp_test_gate_wait(go) != 0)  /* the sender released its own */
        return 11;
    mp_tensor_release(held); /* the last user: the name goes now */
    mp_test_gate_pass(ack);
    if (!recv_acked(e, 1000, SWEEP, ack))
        return 12;
    if (mp__pins_held() != 1) /* the second storage, not the dead first */
        return 13;
    mp_test_ep_close(e);
    return 0;
}

static void test_kept_mapping_holds_no_reference(void **state)
{
    mp_tensor *t, *other;
    mp_test_ep e;
    mp_test_gate ack, go;
    pid_t pid;
    int shm0;
    (void)state;
    mp_test_ep_open(&e, true, false);
    mp_test_gate_open(&ack);
    mp_test_gate_open(&go);
    if ((pid = fork()) == 0)
        _exit(keep_then_hold(&e, &ack, &go));
    shm0 = mp_test_count_shm();
    t = tensor();
    for (int32_t i = 0; i < 3; i++)
        send_acked(&e, t, i, &ack);
    mp_tensor_release(t);
    assert_int_equal(mp_test_count_shm(), shm0 + 1); /* the receiver holds arrival 2 */
    mp_test_gate_pass(&go);
    assert_int_equal(mp_test_gate_wait(&ack), 0);
    assert_int_equal(mp_test_count_shm(), shm0); /* gone, though the receiver keeps it */
    other = tensor();
    for (int32_t i = 0; i < SWEEP; i++)
        send_acked(&e, other, 1000 + i, &ack);
    mp_test_expect_exit0(pid);
    mp_test_gate_close(&ack);
    mp_test_gate_close(&go);
    mp_test_ep_close(&e);
    mp_tensor_release(other);
}

/* A keeper SIGKILLed while it keeps (and holds nothing) leaves nothing: the
 * name goes when the sender releases the storage, with no shm manager. */
static void test_killed_keeper_leaves_nothing(void **state)
{
    mp_tensor *t;
    mp_test_ep e;
    mp_test_gate ack;
    pid_t pid;
    int shm0, status = 0;
    (void)state;
    mp_test_ep_open(&e, false, false);
    mp_test_gate_open(&ack);
    if ((pid = fork()) == 0) {
        if (!recv_acked(&e, 0, 3, &ack) || mp__pins_held() != 1)
            _exit(10);
        mp_test_gate_pass(&ack);
        pause();
        _exit(0);
    }
    shm0 = mp_test_count_shm();
    t = tensor();
    for (int32_t i = 0; i < 3; i++)
        send_acked(&e, t, i, &ack);
    assert_int_equal(mp_test_gate_wait(&ack), 0); /* kept */
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    mp_tensor_release(t);
    assert_int_equal(mp_test_count_shm(), shm0);
    mp_test_gate_close(&ack);
    mp_test_ep_close(&e);
}

int main(void)
{
    setenv("MPROC_SHM_MANAGER", "none", 1); /* what is left behind is the library's */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kept_pipe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kept_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pins_off_maps_every_time, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kept_mapping_holds_no_reference, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_keeper_leaves_nothing, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
