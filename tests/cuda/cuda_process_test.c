/* CUDA with the process layer: the fork guard (simulated CUDA start-up)
 * refuses the fork start method and names spawn and forkserver; and, on the
 * fake device (CUDA builds), a CUDA tensor passed as an argument to a spawned
 * child that adds 1 in place, and a spawned producer whose exit warning
 * reaches its log hook while the parent still holds its tensor. */
#include "mp_test.h"
#include "cuda/cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef MPROC_HAVE_CUDA
#include "cuda_helpers.h"
#include "fake_device.h"
#endif

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state)
{
    mp__cuda_simulate_initialized(false);
    return mp_test_teardown(state);
}

MP_ENTRY(t_nothing) { return 0; }

static int start(const char *method, const char *entry, mp_msg *args, mp_process **p)
{
    mp_process_options o;
    mp_process_options_init(&o);
    o.start_method = method;
    int rc = mp_process_create(entry, args, &o, p);
    if (rc == 0 && (rc = mp_process_start(*p)) < 0) {
        mp_process_destroy(*p);
        *p = NULL;
    }
    return rc;
}

static void join_ok(mp_process *p)
{
    int code = -1;
    assert_mp_ok(mp_process_join(p, 30));
    assert_mp_ok(mp_process_exitcode(p, &code));
    if (code != 0) {
        mp_child_error e;
        mp_process_error(p, &e);
        fail_msg("child exit %d: %s", code, e.message);
    }
    assert_mp_ok(mp_process_destroy(p));
}

static void test_fork_guard(void **state)
{
    mp_process *p = NULL;
    if (mp__cuda_initialized())
        skip(); /* a real GPU made it so: covered by the MP_ESTATE check below */
    assert_mp_ok(start("fork", "t_nothing", NULL, &p));
    join_ok(p);
    mp__cuda_simulate_initialized(true);
    assert_mp_err(start("fork", "t_nothing", NULL, &p), MP_ESTATE);
    assert_null(p);
    assert_non_null(strstr(mp_last_error(), "CUDA"));
    assert_non_null(strstr(mp_last_error(), "spawn"));
    assert_non_null(strstr(mp_last_error(), "forkserver"));
    /* spawn execs a fresh program: allowed (forkserver too; its server is a
     * long-lived child that the leak checks here would kill). */
    assert_mp_ok(start("spawn", "t_nothing", NULL, &p));
    join_ok(p);
    mp__cuda_simulate_initialized(false);
}

#ifdef MPROC_HAVE_CUDA
MP_ENTRY(t_add_one)
{
    mp_tensor *t = NULL;
    if (mp_msg_get_cuda_tensor(args, 0, &t) < 0)
        mp_raise("get: %s", mp_last_error());
    if (!values_are(t, 0, 1, 16))
        mp_raise("wrong values on arrival");
    add_one(t);
    mp_tensor_release(t);
    return 0;
}

static void send_line(int level, const char *line, void *user)
{
    if (level == MP_LOG_WARN)
        mp_conn_send_bytes(user, line, strlen(line), 5);
}

MP_ENTRY(t_producer)
{
    mp_conn *c = NULL;
    mp_msg *m = NULL;
    if (mp_msg_get_conn(args, 0, &c) < 0)
        mp_raise("get conn: %s", mp_last_error());
    mp_set_log_hook(send_line, c);
    mp_tensor *t = iota_cuda(0, 1, 8);
    if (!t || mp_msg_create(&m) < 0 || mp_msg_add_cuda_tensor(m, "t", t) < 0 ||
        mp_conn_send(c, m, 10) < 0)
        mp_raise("send: %s", mp_last_error());
    mp_msg_destroy(m);
    /* The fake device opens the handle through our /proc/<pid>/fd: stay
     * until the parent has it. */
    void *ack = NULL;
    size_t len = 0;
    if (mp_conn_recv_bytes(c, &ack, &len, 30) < 0)
        mp_raise("ack: %s", mp_last_error());
    free(ack);
    /* Returns holding t; the runtime's exit path warns through the hook. */
    return 0;
}

static void test_tensor_argument(void **state)
{
    mp_process *p = NULL;
    mp_msg *args = NULL;
    mp_tensor *d = iota_cuda(0, 4, 4);
    assert_non_null(d);
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_cuda_tensor(args, "t", d));
    assert_mp_err(mp_msg_add_tensor(args, "cpu?", d), MP_EINVAL); /* CUDA has its own kind */
    assert_mp_ok(start("spawn", "t_add_one", args, &p));
    mp_msg_destroy(args);
    join_ok(p);
    assert_true(values_are(d, 1, 1, 16));
    mp_tensor_release(d);
    size_t pending = 9;
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
}

static void test_producer_exit_warning(void **state)
{
    mp_conn *a = NULL, *b = NULL;
    mp_msg *args = NULL, *m = NULL;
    mp_process *p = NULL;
    mp_tensor *t = NULL;
    void *line = NULL;
    size_t len = 0;
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_conn(args, "c", b));
    assert_mp_ok(start("spawn", "t_producer", args, &p));
    mp_msg_destroy(args);
    mp_conn_release(b);
    assert_mp_ok(mp_conn_recv(a, &m, 30));
    assert_mp_ok(mp_msg_get_cuda_tensor(m, 0, &t));
    mp_msg_destroy(m);
    assert_mp_ok(mp_conn_send_bytes(a, "ok", 2, 10));
    assert_mp_ok(mp_conn_recv_bytes(a, &line, &len, 30));
    if (!strstr(line, "1 CUDA allocation is still shared"))
        fail_msg("warning: %.*s", (int)len, (char *)line);
    free(line);
    join_ok(p);
    int count = 0;
    assert_mp_err(mp_tensor_cuda_share_count(t, &count), MP_ECLOSED);
    mp_tensor_release(t);
    mp_conn_release(a);
}
#endif

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fork_guard, setup, teardown),
#ifdef MPROC_HAVE_CUDA
        cmocka_unit_test_setup_teardown(test_tensor_argument, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_exit_warning, setup, teardown),
#endif
    };
#ifdef MPROC_HAVE_CUDA
    /* Above mp_init: spawned children run it too, before their arguments
     * (CUDA tensors among them) are decoded. */
    fake_device_install();
#endif
    if (mp_init(&argc, &argv) != 0)
        return 1;
#ifdef MPROC_HAVE_CUDA
    /* Process-lifetime state before the leak snapshots. */
    mp__refseg *own;
    mp__cuda_lock();
    int rc = mp__cuda_own_segment(&own);
    mp__cuda_unlock();
    if (rc < 0)
        return 1;
#endif
    return cmocka_run_group_tests(tests, NULL, NULL);
}
