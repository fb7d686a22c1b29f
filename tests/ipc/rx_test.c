/* What a receive costs in recvmsg calls: a small message without fds none
 * of its own (it comes through the ring, src/ipc/ring.c), a big one without
 * fds a look at the socket's head and one recvmsg (the one-call receive,
 * src/wire/rx.c), one that may carry fds a look, a peek and a consume. Here
 * every message reaches a consumer that is not waiting inside a receive, so
 * a ring message rang a doorbell that made the fd readable for pollers, and
 * the receive that empties the ring drops it (a look and a take); a socket
 * message needs none, its record makes the fd readable. A reader asleep on
 * an empty ring is woken by a message of either kind, and one killed there
 * does not block senders. */
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipc/ipc.h"
#include "mp_test.h"

static int setup(void **state) { return mp_test_setup_fd(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

static ssize_t (*real_recvmsg)(int, struct msghdr *, int);
static int recvmsg_calls;

static ssize_t counting_recvmsg(int fd, struct msghdr *m, int flags)
{
    recvmsg_calls++;
    return real_recvmsg(fd, m, flags);
}

static void count_start(void)
{
    real_recvmsg = mp__sys.recvmsg;
    mp__sys.recvmsg = counting_recvmsg;
    recvmsg_calls = 0;
}

static int count_stop(void)
{
    mp__sys.recvmsg = real_recvmsg;
    return recvmsg_calls;
}

static mp_msg *small_msg(void)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, "0123456789abcdef", 16));
    return m;
}

static mp_msg *tensor_msg(int32_t v)
{
    int64_t shape[1] = {4};
    mp_tensor *t = NULL;
    mp_msg *m = NULL;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 1, shape, &t));
    ((int32_t *)mp_tensor_data(t))[0] = v;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    mp_tensor_release(t);
    return m;
}

static mp_msg *big_msg(void)
{
    static char bytes[4096];
    return mp_test_payload_msg(bytes, sizeof bytes);
}

static int queue_get(void *q, mp_msg **out) { return mp_queue_get(q, out, 5); }
static int conn_recv(void *c, mp_msg **out) { return mp_conn_recv(c, out, 5); }

/* recvmsg calls that one receive takes. */
static int recv_calls(int (*recv)(void *, mp_msg **), void *from)
{
    mp_msg *r = NULL;
    int rc, n;
    count_start();
    rc = recv(from, &r);
    n = count_stop();
    assert_mp_ok(rc);
    mp_msg_destroy(r);
    return n;
}

static int queue_get_calls(mp_queue *q, mp_msg *m)
{
    assert_mp_ok(mp_queue_put(q, m, 5));
    return recv_calls(queue_get, q);
}

static int conn_recv_calls(mp_conn *from, mp_conn *to, mp_msg *m)
{
    assert_mp_ok(mp_conn_send(from, m, 5));
    return recv_calls(conn_recv, to);
}

/* A queue whose fd nobody asked for rings no doorbell (docs/messaging.md):
 * a ring message costs no system call. Once its fd is handed out, each
 * ring message put into an empty queue also rings one, which the get peeks
 * and drops (2 calls). A message that takes the socket rings none: its
 * record wakes a poll itself. Its get peeks the head for the mark's record
 * and takes it (2 calls), peeking first once fds may travel (3). */
static void test_queue_calls(void **state)
{
    mp_msg *s = small_msg(), *t = tensor_msg(1), *b = big_msg();
    (void)state;
    for (int polled = 0; polled < 2; polled++) {
        mp_queue *q = NULL;
        int bell = polled ? 2 : 0;
        assert_mp_ok(mp_queue_create(0, &q));
        if (polled)
            assert_true(mp_queue_fileno(q) >= 0);
        assert_int_equal(queue_get_calls(q, s), bell);
        assert_int_equal(queue_get_calls(q, b), 2);
        /* fds may travel from now on: peek and consume, for good */
        assert_int_equal(queue_get_calls(q, t), 3);
        assert_int_equal(queue_get_calls(q, b), 3);
        assert_int_equal(queue_get_calls(q, s), bell);
        mp_queue_release(q);
    }
    mp_msg_destroy(s);
    mp_msg_destroy(b);
    mp_msg_destroy(t);
}

/* Each direction of a duplex pipe has its own receive side. */
static void test_pipe_calls(void **state)
{
    mp_conn *a = NULL, *b = NULL;
    mp_msg *s = small_msg(), *t = tensor_msg(1), *g = big_msg();
    (void)state;
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_int_equal(conn_recv_calls(a, b, s), 2); /* a pipe's ring rings */
    assert_int_equal(conn_recv_calls(b, a, g), 2); /* a socket record, no bell */
    assert_int_equal(conn_recv_calls(a, b, t), 3);
    assert_int_equal(conn_recv_calls(a, b, g), 3);
    assert_int_equal(conn_recv_calls(b, a, g), 2);
    mp_msg_destroy(g);
    mp_msg_destroy(s);
    mp_msg_destroy(t);
    mp_conn_release(a);
    mp_conn_release(b);
}

/* A message that takes the socket makes the receiving end's fd readable by
 * its own record, and its receive leaves the fd quiet: no doorbell was sent
 * to be left behind. */
static void test_socket_message_wakes_poll(void **state)
{
    mp_conn *a = NULL, *b = NULL;
    mp_msg *g = big_msg(), *t = tensor_msg(1), *r = NULL;
    struct pollfd p = {.events = POLLIN};
    (void)state;
    assert_mp_ok(mp_pipe(true, &a, &b));
    p.fd = mp_conn_fileno(b);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(poll(&p, 1, 0), 0);
        assert_mp_ok(mp_conn_send(a, k ? t : g, 5));
        assert_int_equal(poll(&p, 1, 0), 1);
        mp_wait_item it = {.kind = MP_WAIT_CONN, .u.conn = b};
        assert_int_equal(mp_wait(&it, 1, 0), 1);
        assert_mp_ok(mp_conn_recv(b, &r, 0));
        assert_int_equal(mp_msg_count(r), (size_t)k);
        mp_msg_destroy(r);
        assert_int_equal(poll(&p, 1, 0), 0);
    }
    mp_msg_destroy(g);
    mp_msg_destroy(t);
    mp_conn_release(a);
    mp_conn_release(b);
}

/* Waits until a reader sleeps on q's empty ring, then a little more so that
 * it is inside poll. */
static void wait_sleeping_reader(mp_queue *q)
{
    mp__ring *r = &((mp__queue *)q)->ctl->ring;
    double deadline = mp__deadline(10);
    while (!atomic_load(&r->sleeping)) {
        if (mp__now() > deadline)
            fail_msg("the child never went to sleep on the empty ring");
        usleep(1000);
    }
    usleep(20000);
}

/* The child sleeps on the empty ring; the first tensor must wake it (the
 * doorbell) and arrive through the peeking receive, intact. */
static void test_sleeping_reader_gets_tensor(void **state)
{
    mp_queue *q = NULL;
    mp_msg *t = tensor_msg(42);
    int status;
    pid_t pid;
    (void)state;
    assert_mp_ok(mp_queue_create(0, &q));
    pid = fork();
    if (pid == 0) {
        mp_tensor *r = NULL;
        if (mp_queue_get_tensor(q, &r, -1) != 0)
            _exit(1);
        _exit(((int32_t *)mp_tensor_data(r))[0] == 42 ? 0 : 2);
    }
    wait_sleeping_reader(q);
    assert_mp_ok(mp_queue_put(q, t, 5));
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    mp_msg_destroy(t);
    mp_queue_release(q);
}

/* A reader killed asleep leaves the reader lock EOWNERDEAD and `sleeping`
 * set; a sender of fds is not held up, and the next reader recovers. */
static void test_reader_killed_asleep(void **state)
{
    mp_queue *q = NULL;
    mp_msg *t = tensor_msg(7), *r = NULL;
    mp_tensor *x = NULL;
    double t0;
    int status;
    pid_t pid;
    (void)state;
    assert_mp_ok(mp_queue_create(0, &q));
    pid = fork();
    if (pid == 0) {
        mp_msg *m = NULL;
        mp_queue_get(q, &m, -1);
        _exit(3);
    }
    wait_sleeping_reader(q);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    t0 = mp__now();
    assert_mp_ok(mp_queue_put(q, t, 5));
    assert_true(mp__now() - t0 < 2.0);
    /* The nudge nobody took is dropped on the way. */
    assert_mp_ok(mp_queue_get(q, &r, 5));
    assert_mp_ok(mp_msg_get_tensor(r, 0, &x));
    assert_int_equal(((int32_t *)mp_tensor_data(x))[0], 7);
    mp_tensor_release(x);
    mp_msg_destroy(r);
    mp_msg_destroy(t);
    mp_queue_release(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_queue_calls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipe_calls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_socket_message_wakes_poll, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sleeping_reader_gets_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_killed_asleep, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
