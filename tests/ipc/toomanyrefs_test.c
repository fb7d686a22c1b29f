/* The kernel's limit on fds in flight (ETOOMANYREFS, "Too many references:
 * cannot splice") gives MP_ETOOMANYREFS and a sentence naming the limit and
 * the fixes: injected through mp__sys, and for real in a child that runs as
 * an unprivileged user with a small RLIMIT_NOFILE (started by fork, spawn
 * and forkserver). */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "mp_test.h"
#include "os/os.h"

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state)
{
    mp__sys_fault_reset();
    mp_forkserver_stop(); /* the server is a child too */
    return mp_test_teardown(state);
}

static bool names_fixes(const char *s)
{
    return strstr(s, "RLIMIT_NOFILE") && strstr(s, "file_system") &&
           strstr(s, "fewer tensors in flight") && strstr(s, "ulimit -n");
}

static mp_msg *tensor_msg(void)
{
    mp_msg *m = NULL;
    mp_tensor *t = NULL;
    int64_t n = 16;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_tensor_empty(MP_UINT8, 1, &n, &t));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    mp_tensor_release(t);
    return m;
}

static void test_injected(void **state)
{
    mp_queue *q = NULL;
    mp_conn *a = NULL, *b = NULL;
    mp_msg *m = tensor_msg();
    assert_string_equal(mp_err_name(MP_ETOOMANYREFS), "MP_ETOOMANYREFS");
    assert_string_equal(mp_strerror(MP_ETOOMANYREFS), "too many file descriptors in flight");
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_pipe(false, &a, &b));
    assert_mp_ok(mp__sys_fault("sendmsg", ETOOMANYREFS, 0, 1));
    assert_mp_err(mp_queue_put(q, m, 5), MP_ETOOMANYREFS);
    if (!names_fixes(mp_last_error()))
        fail_msg("%s", mp_last_error());
    assert_mp_ok(mp__sys_fault("sendmsg", ETOOMANYREFS, 0, 1));
    assert_mp_err(mp_conn_send(b, m, 5), MP_ETOOMANYREFS);
    if (!names_fixes(mp_last_error()))
        fail_msg("%s", mp_last_error());
    mp__sys_fault_reset();
    assert_mp_ok(mp_conn_send(b, m, 5)); /* nothing broke */
    mp_msg_destroy(m);
    assert_mp_ok(mp_conn_recv(a, &m, 5));
    mp_msg_destroy(m);
    mp_queue_release(q);
    mp_conn_release(a);
    mp_conn_release(b);
}

/* Exit codes of the real-kernel child. */
enum { REAL_OK = 0, REAL_SKIP = 77, REAL_WRONG_CODE = 3, REAL_NO_LIMIT = 4, REAL_BAD_TEXT = 5 };

/* As an unprivileged user (root drops to nobody: root's CAP_SYS_RESOURCE is
 * exempt from the limit) with RLIMIT_NOFILE 32, sends tensors on a pipe that
 * nobody reads until the kernel refuses. */
MP_ENTRY(toomany_child)
{
    struct rlimit rl = {32, 32};
    mp_conn *a = NULL, *b = NULL;
    int rc = 0;
    if (geteuid() == 0 && (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
                           setresuid(65534, 65534, 65534) < 0))
        return REAL_SKIP;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || mp_pipe(false, &a, &b) != 0)
        return REAL_SKIP;
    for (int i = 0; i < 4096 && rc == 0; i++) {
        mp_msg *m = NULL;
        mp_tensor *t = NULL;
        int64_t n = 64;
        if (mp_msg_create(&m) || mp_tensor_empty_shared(MP_UINT8, 1, &n, &t) ||
            mp_msg_add_tensor(m, NULL, t))
            return REAL_SKIP;
        mp_tensor_release(t); /* the message holds the only fd now */
        rc = mp_conn_send(b, m, 0);
        mp_msg_destroy(m);
    }
    if (rc == 0)
        return REAL_NO_LIMIT;
    if (rc != MP_ETOOMANYREFS) {
        fprintf(stderr, "toomany_child: %s: %s\n", mp_err_name(rc), mp_last_error());
        return REAL_WRONG_CODE;
    }
    if (!names_fixes(mp_last_error()) || !strstr(mp_last_error(), "RLIMIT_NOFILE = 32"))
        return REAL_BAD_TEXT;
    mp_conn_release(a);
    mp_conn_release(b);
    return REAL_OK;
}

static void run_real(const char *method)
{
    mp_process_options o;
    mp_process *p = NULL;
    int code = -1;
    mp_process_options_init(&o);
    o.start_method = method;
    assert_mp_ok(mp_process_create("toomany_child", NULL, &o, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 60));
    assert_mp_ok(mp_process_exitcode(p, &code));
    assert_mp_ok(mp_process_destroy(p));
    if (code == REAL_SKIP)
        skip();
    assert_int_equal(code, REAL_OK);
}

static void test_real_fork(void **state) { run_real("fork"); }
static void test_real_spawn(void **state) { run_real("spawn"); }
static void test_real_forkserver(void **state) { run_real("forkserver"); }

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_injected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_spawn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_forkserver, setup, teardown),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
