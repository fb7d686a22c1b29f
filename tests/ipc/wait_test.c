/* mp_wait over connections, queues, processes and fds, with children
 * started by fork, spawn and forkserver; the fds behind each object; true
 * readiness (a wake-up record is not a message, a closed queue is ready). */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipc/ipc.h"
#include "mp_test.h"
#include "wire/frame.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state)
{
    mp_forkserver_stop(); /* the server is a child too */
    return mp_test_teardown(state);
}

/* Sends on the pipe, waits for the go, puts on the queue, waits, exits. */
MP_ENTRY(wait_child)
{
    mp_conn *c = NULL;
    mp_queue *q = NULL;
    mp_msg *m = NULL, *go = NULL;
    if (mp_msg_get_conn(args, 0, &c) || mp_msg_get_queue(args, 1, &q) || mp_msg_create(&m) ||
        mp_msg_set_payload(m, "c", 1) || mp_conn_send(c, m, 20) ||
        mp_conn_recv(c, &go, 20) || mp_queue_put(q, m, 20) || mp_conn_recv(c, &go, 20))
        mp_raise("wait_child: %s", mp_last_error());
    mp_msg_destroy(m);
    mp_msg_destroy(go);
    mp_conn_release(c);
    mp_queue_release(q);
    return 0;
}

static void expect(const mp_wait_item *it, bool c, bool q, bool p)
{
    assert_int_equal(it[0].ready, c);
    assert_int_equal(it[1].ready, q);
    assert_int_equal(it[2].ready, p);
}

static void run(const char *method)
{
    mp_conn *a = NULL, *b = NULL;
    mp_queue *q = NULL;
    mp_msg *args = NULL, *m = NULL;
    mp_process_options o;
    mp_process *p = NULL;
    mp_wait_item it[3];
    int code = -1;
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_conn(args, "c", b));
    assert_mp_ok(mp_msg_add_queue(args, "q", q));
    mp_process_options_init(&o);
    o.start_method = method;
    assert_mp_ok(mp_process_create("wait_child", args, &o, &p));
    it[0] = (mp_wait_item){.kind = MP_WAIT_CONN, .u.conn = a};
    it[1] = (mp_wait_item){.kind = MP_WAIT_QUEUE, .u.queue = q};
    it[2] = (mp_wait_item){.kind = MP_WAIT_PROCESS, .u.process = p};
    assert_mp_err(mp_wait(it, 3, 0), MP_EINVAL); /* not started */
    assert_mp_ok(mp_process_start(p));
    mp_msg_destroy(args);
    mp_conn_release(b); /* the child holds the other end now */
    assert_true(mp_conn_fileno(a) >= 0 && mp_queue_fileno(q) >= 0);
    /* the pipe first */
    assert_int_equal(mp_wait(it, 3, 20), 1);
    expect(it, true, false, false);
    assert_int_equal(mp_wait(it, 3, 0), 1); /* still there: nothing was received */
    assert_mp_ok(mp_conn_recv(a, &m, 5));
    assert_mp_err(mp_wait(it, 3, 0), MP_ETIMEDOUT);
    assert_mp_err(mp_wait(it, 3, 0.05), MP_ETIMEDOUT);
    /* then the queue */
    assert_mp_ok(mp_conn_send(a, m, 5));
    assert_int_equal(mp_wait(it, 3, 20), 1);
    expect(it, false, true, false);
    mp_msg_destroy(m);
    assert_mp_ok(mp_queue_get(q, &m, 5));
    /* then the process's exit */
    assert_mp_ok(mp_conn_send(a, m, 5));
    mp_msg_destroy(m);
    for (int i = 0; i < 100; i++) { /* the pipe's EOF may come first */
        assert_true(mp_wait(it, 3, 20) >= 1);
        if (it[2].ready && it[0].ready)
            break;
        sleep_ms(10);
    }
    assert_true(it[2].ready);
    assert_true(it[0].ready); /* the child's end is closed: EOF is "ready" */
    assert_false(it[1].ready);
    assert_mp_ok(mp_process_join(p, 20));
    assert_mp_ok(mp_process_exitcode(p, &code));
    assert_int_equal(code, 0);
    assert_int_equal(mp_wait(&it[2], 1, -1), 1); /* reaped: still ready */
    mp_process_destroy(p);
    mp_conn_release(a);
    mp_queue_release(q);
}

static void test_fork(void **state) { run("fork"); }
static void test_spawn(void **state) { run("spawn"); }
static void test_forkserver(void **state) { run("forkserver"); }

/* A wake-up record (NUDGE) at the head of a queue is not a message: mp_wait
 * does not report it, drops it, and the fd is quiet afterwards. A closed
 * queue is ready even when its end-of-stream record was taken. */
static void test_true_readiness(void **state)
{
    mp_queue *q = NULL;
    mp_simple_queue *sq = NULL;
    mp__frame_header h = {.magic = MP__FRAME_MAGIC, .version = MP__FRAME_VERSION,
                          .flags = MP__FRAME_NUDGE};
    struct pollfd pf;
    mp_wait_item it[2];
    mp_msg *m = NULL;
    int pfd[2];
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_simple_queue_create(&sq));
    assert_int_equal(send(((mp__queue *)q)->wsock, &h, sizeof h, 0), (ssize_t)sizeof h);
    pf = (struct pollfd){.fd = mp_queue_fileno(q), .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 0), 1); /* the fd says "look" */
    it[0] = (mp_wait_item){.kind = MP_WAIT_QUEUE, .u.queue = q};
    it[1] = (mp_wait_item){.kind = MP_WAIT_SIMPLE_QUEUE, .u.simple_queue = sq};
    assert_mp_err(mp_wait(it, 2, 0.05), MP_ETIMEDOUT);
    assert_false(it[0].ready);
    assert_int_equal(poll(&pf, 1, 0), 0); /* dropped */
    /* closed, and the end-of-stream record already taken by a reader */
    assert_mp_ok(mp_simple_queue_close(sq));
    assert_int_equal(mp_wait(it, 2, 0), 1);
    assert_true(it[1].ready);
    assert_mp_err(mp_simple_queue_get(sq, &m), MP_ECLOSED);
    assert_int_equal(mp_wait(it, 2, 0), 1);
    assert_true(it[1].ready);
    /* a plain fd */
    assert_int_equal(pipe(pfd), 0);
    it[0] = (mp_wait_item){.kind = MP_WAIT_FD, .u.fd = pfd[0]};
    assert_mp_err(mp_wait(it, 1, 0), MP_ETIMEDOUT);
    assert_int_equal(write(pfd[1], "x", 1), 1);
    assert_int_equal(mp_wait(it, 1, -1), 1);
    close(pfd[0]);
    close(pfd[1]);
    mp_queue_release(q);
    mp_simple_queue_release(sq);
}

static void test_misuse(void **state)
{
    mp_conn *r = NULL, *w = NULL;
    mp_wait_item it[2] = {{.kind = 99}};
    int fds[2];
    assert_mp_err(mp_wait(NULL, 1, 0), MP_EINVAL);
    assert_mp_err(mp_wait(it, 0, 0), MP_EINVAL);
    assert_mp_err(mp_wait(it, 1, 0), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_wait: item 0: unknown kind 99 (want an "
                                         "mp_wait_kind)");
    it[0] = (mp_wait_item){.kind = MP_WAIT_CONN};
    assert_mp_err(mp_wait(it, 1, 0), MP_EINVAL); /* NULL object */
    assert_string_equal(mp_last_error(), "mp_wait: item 0: its conn is NULL");
    it[0] = (mp_wait_item){.kind = MP_WAIT_FD, .u.fd = -1};
    assert_mp_err(mp_wait(it, 1, 0), MP_EINVAL);
    /* a closed fd: poll would call it ready (POLLNVAL) on every call */
    assert_int_equal(pipe(fds), 0);
    close(fds[0]);
    close(fds[1]);
    it[0] = (mp_wait_item){.kind = MP_WAIT_FD, .u.fd = fds[1]};
    assert_mp_err(mp_wait(it, 1, 0), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "is not open"));
    assert_mp_ok(mp_pipe(false, &r, &w));
    it[0] = (mp_wait_item){.kind = MP_WAIT_CONN, .u.conn = r};
    it[1] = (mp_wait_item){.kind = MP_WAIT_CONN, .u.conn = w};
    assert_mp_err(mp_wait(it, 2, 0), MP_ESTATE); /* send-only end */
    assert_string_equal(mp_last_error(), "mp_wait: item 1: this end of a one-way pipe only "
                                         "sends");
    assert_mp_ok(mp_conn_close(r));
    assert_mp_err(mp_wait(it, 1, 0), MP_ECLOSED);
    assert_non_null(strstr(mp_last_error(), "mp_wait: item 0: "));
    assert_int_equal(mp_conn_fileno(r), -1);
    assert_int_equal(mp_conn_fileno(NULL), -1);
    assert_int_equal(mp_queue_fileno(NULL), -1);
    mp_conn_release(r);
    mp_conn_release(w);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_misuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_true_readiness, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spawn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forkserver, setup, teardown),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
