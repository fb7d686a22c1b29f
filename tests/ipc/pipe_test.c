/* Pipe / Connection: send/recv of messages and bytes, poll, one-way ends,
 * close, EOF when the peer goes, and a connection passed as an attachment. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp_test.h"

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

static void test_duplex(void **state)
{
    mp_conn *a = NULL, *b = NULL;
    mp_msg *m = NULL, *r = NULL;
    void *bytes = NULL;
    size_t len = 0;
    (void)state;
    assert_mp_err(mp_pipe(true, NULL, &b), MP_EINVAL);
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_int_equal(mp_conn_poll(a, 0), 0);
    assert_mp_ok(mp_conn_send_bytes(b, "ping", 4, -1));
    assert_int_equal(mp_conn_poll(a, 1), 1);
    assert_mp_ok(mp_conn_recv_bytes(a, &bytes, &len, 1));
    assert_int_equal(len, 4);
    assert_memory_equal(bytes, "ping", 4);
    free(bytes);
    assert_mp_ok(mp_conn_send_bytes(a, NULL, 0, -1));
    assert_mp_ok(mp_conn_recv_bytes(b, &bytes, &len, 1));
    assert_int_equal(len, 0);
    assert_null(bytes);
    /* a message with an attachment is not bytes */
    int64_t shape[1] = {8};
    mp_tensor *t = NULL;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 1, shape, &t));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    assert_mp_ok(mp_conn_send(a, m, -1));
    assert_mp_err(mp_conn_recv_bytes(b, &bytes, &len, 1), MP_EPROTO);
    assert_mp_ok(mp_conn_send(a, m, -1));
    assert_mp_ok(mp_conn_recv(b, &r, 1));
    assert_int_equal(mp_msg_count(r), 1);
    mp_msg_destroy(r);
    assert_mp_err(mp_conn_recv(b, &r, 0), MP_EAGAIN);
    assert_mp_err(mp_conn_recv(b, &r, 0.05), MP_ETIMEDOUT);
    assert_mp_ok(mp_conn_close(a));
    assert_mp_err(mp_conn_send(a, m, -1), MP_ECLOSED);
    assert_mp_err(mp_conn_recv(b, &r, 1), MP_ECLOSED);
    assert_mp_err(mp_conn_send(b, m, 1), MP_ECLOSED);
    mp_msg_destroy(m);
    mp_tensor_release(t);
    mp_conn_release(a);
    mp_conn_release(b);
    mp_conn_release(NULL);
}

static void test_one_way(void **state)
{
    mp_conn *r = NULL, *w = NULL;
    mp_msg *m = NULL;
    (void)state;
    assert_mp_ok(mp_pipe(false, &r, &w));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_err(mp_conn_send(r, m, -1), MP_ESTATE);
    mp_msg *got = m; /* recv clears its out-parameter: keep m to destroy it */
    assert_mp_err(mp_conn_recv(w, &got, -1), MP_ESTATE);
    assert_null(got);
    mp_msg_destroy(m);
    assert_mp_err(mp_conn_poll(w, 0), MP_ESTATE);
    mp_conn_release(r);
    mp_conn_release(w);
}

/* A connection travels to a forked child inside a message on another one. */
static void test_conn_attachment(void **state)
{
    mp_conn *a = NULL, *b = NULL, *c = NULL, *d = NULL, *got = NULL;
    mp_msg *m = NULL, *r = NULL;
    int status;
    pid_t pid;
    (void)state;
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp_pipe(true, &c, &d));
    pid = fork();
    if (pid == 0) {
        mp_msg *in = NULL;
        mp_conn *via = NULL;
        if (mp_conn_recv(b, &in, 10) || mp_msg_get_conn(in, 0, &via) ||
            mp_conn_send_bytes(via, "over", 4, 10))
            _exit(1);
        mp_conn_release(via);
        mp_msg_destroy(in);
        _exit(0);
    }
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_conn(m, "back", d));
    assert_int_equal(mp_msg_kind(m, 0), MP_ATTACH_CONN);
    assert_mp_err(mp_msg_get_queue(m, 0, (mp_queue **)&got), MP_EINVAL);
    assert_mp_ok(mp_conn_send(a, m, 5));
    void *bytes = NULL;
    size_t len = 0;
    assert_mp_ok(mp_conn_recv_bytes(c, &bytes, &len, 10));
    assert_memory_equal(bytes, "over", 4);
    free(bytes);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    mp_msg_destroy(m);
    mp_msg_destroy(r);
    mp_conn_release(a);
    mp_conn_release(b);
    mp_conn_release(c);
    mp_conn_release(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_duplex, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_way, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conn_attachment, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
