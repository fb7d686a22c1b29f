/* Pipe / Connection: send/recv of messages and bytes, poll, one-way ends,
 * close, EOF when the peer goes, and a connection passed as an attachment
 * (and refused when its control block has another build's layout). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/ipc.h"
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
    assert_string_equal(mp_last_error(), "mp_pipe: a is NULL");
    /* one pointer for both ends would leak the first: refused, nothing made */
    assert_mp_err(mp_pipe(false, &a, &a), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "a and b are the same pointer"));
    assert_mp_ok(mp_pipe(true, &a, &b));
    m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_err(mp_msg_add_conn(m, "c", NULL), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_msg_add_conn: connection is NULL");
    mp_msg_destroy(m);
    m = NULL;
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
    assert_mp_err(mp_conn_recv(b, &r, 0), MP_ETIMEDOUT);
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
    mp_msg *m = NULL, *got = NULL;
    (void)state;
    assert_mp_ok(mp_pipe(false, &r, &w));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_err(mp_conn_send(r, m, -1), MP_ESTATE);
    assert_mp_err(mp_conn_recv(w, &got, -1), MP_ESTATE);
    assert_null(got);
    mp_msg_destroy(m);
    assert_mp_err(mp_conn_poll(w, 0), MP_ESTATE);
    mp_conn_release(r);
    mp_conn_release(w);
}

/* A send after the last reader closed its end fails at once (not only at
 * the every-64-messages look), and a reader's close that leaves another
 * reader (the parent closing its copy after fork) costs nothing. */
static void test_send_after_reader_closed(void **state)
{
    mp_conn *r = NULL, *w = NULL;
    void *bytes = NULL;
    size_t len = 0;
    int status = -1;
    pid_t pid;
    (void)state;
    assert_mp_ok(mp_pipe(false, &r, &w));
    for (int i = 0; i < 5; i++) { /* past slot 0, which is always looked at */
        assert_mp_ok(mp_conn_send_bytes(w, "x", 1, -1));
        assert_mp_ok(mp_conn_recv_bytes(r, &bytes, &len, 1));
        free(bytes);
    }
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int ok = mp_conn_recv_bytes(r, &bytes, &len, 10) == 0 && len == 1;
        mp_conn_close(r);
        _exit(ok ? 0 : 1);
    }
    assert_mp_ok(mp_conn_close(r)); /* the child still reads */
    assert_mp_ok(mp_conn_send_bytes(w, "y", 1, -1));
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    assert_mp_err(mp_conn_send_bytes(w, "z", 1, -1), MP_ECLOSED);
    assert_non_null(strstr(mp_last_error(), "the receiving end was closed"));
    assert_mp_err(mp_conn_send_bytes(w, "z", 1, 0), MP_ECLOSED); /* and again */
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

/* Several processes receiving on one end take turns (the end's reader lock):
 * every message is received exactly once. */
static void test_concurrent_receivers(void **state)
{
    enum { N = 3000, R = 3 };
    mp_conn *a = NULL, *b = NULL;
    _Atomic uint8_t *seen = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                                 -1, 0);
    pid_t pids[R];
    int status;
    (void)state;
    assert_true(seen != MAP_FAILED);
    assert_mp_ok(mp_pipe(false, &b, &a));
    for (int r = 0; r < R; r++) {
        if ((pids[r] = fork()) == 0) {
            mp_conn_release(a);
            for (;;) {
                void *buf = NULL;
                size_t len = 0;
                uint32_t v;
                if (mp_conn_recv_bytes(b, &buf, &len, 20) || len != sizeof v)
                    _exit(1);
                memcpy(&v, buf, sizeof v);
                free(buf);
                if (v == UINT32_MAX)
                    _exit(0);
                if (v >= N)
                    _exit(2);
                atomic_fetch_add(&seen[v], 1);
            }
        }
    }
    for (uint32_t i = 0; i < N + R; i++) {
        uint32_t v = i < N ? i : UINT32_MAX;
        assert_mp_ok(mp_conn_send_bytes(a, &v, sizeof v, 20));
    }
    for (int r = 0; r < R; r++) {
        assert_int_equal(waitpid(pids[r], &status, 0), pids[r]);
        assert_int_equal(status, 0);
    }
    for (int i = 0; i < N; i++)
        if (seen[i] != 1)
            fail_msg("message %d received %u times", i, (unsigned)seen[i]);
    munmap((void *)seen, N);
    mp_conn_release(a);
    mp_conn_release(b);
}

/* A connection whose control block has another layout (a process of
 * another mproc build sent it) is refused with the versions and the fix,
 * and the refused attachment leaves no fd or mapping behind (teardown). */
static void test_conn_attachment_of_another_build(void **state)
{
    mp_conn *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    mp_msg *m = NULL, *r = NULL;
    uint32_t *version, ours;
    (void)state;
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp_pipe(true, &c, &d));
    version = mp__conn_layout_version(d); /* shared: the receiving side reads it */
    assert_non_null(version);
    ours = *version;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_conn(m, "d", d));
    *version = ours - 1;
    assert_mp_ok(mp_conn_send(a, m, 5));
    assert_mp_err(mp_conn_recv(b, &r, 5), MP_EPROTO);
    assert_null(r);
    if (!strstr(mp_last_error(), "another layout") ||
        !strstr(mp_last_error(), "the same mproc build"))
        fail_msg("unexpected sentence: %s", mp_last_error());
    *version = ours;
    /* the pipe carried nothing else and still works */
    assert_mp_ok(mp_conn_send(a, m, 5));
    assert_mp_ok(mp_conn_recv(b, &r, 5));
    mp_msg_destroy(r);
    mp_msg_destroy(m);
    mp_conn_release(a), mp_conn_release(b), mp_conn_release(c), mp_conn_release(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_duplex, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_way, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_after_reader_closed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conn_attachment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_receivers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conn_attachment_of_another_build, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
