/* mp_process and mp_spawn: every test runs under fork, spawn and
 * forkserver, and checks that no child, zombie or fd outlives it. The
 * start machinery itself (methods, contexts, the forkserver, threads,
 * daemon children) is process_start_test.c's. */
#include "process/process_internal.h"
#include "process_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Registered in main after mp_setup: children started by exec lack it. */
static int t_late(int rank, mp_msg *args)
{
    return 0;
}

/* ---- tests --------------------------------------------------------------- */

static void test_exitcodes(void **state)
{
    const char *m = mp_test_method(state);
    mp_process *p = run_op(m, (targ){OP_RETURN, 7, 0, 0});
    mp_child_error e = {.size = sizeof e};
    assert_int_equal(exitcode_of(p), 7);
    assert_false(mp_process_is_alive(p));
    assert_true(mp_process_pid(p) > 0);
    assert_mp_ok(mp_process_error(p, &e));
    assert_int_equal(e.signal, 0);
    assert_string_equal(e.message, "");
    assert_mp_ok(mp_process_destroy(p));

    p = run_op(m, (targ){OP_RETURN, 0, 0, 0});
    assert_int_equal(exitcode_of(p), 0);
    assert_mp_ok(mp_process_destroy(p));

    p = run_op(m, (targ){OP_SIGNAL, SIGTERM, 0, 0});
    assert_int_equal(exitcode_of(p), -SIGTERM);
    assert_mp_ok(mp_process_error(p, &e));
    assert_string_equal(e.signal_name, "SIGTERM");
    assert_mp_ok(mp_process_destroy(p));

    p = run_op(m, (targ){OP_SIGNAL, SIGKILL, 0, 0});
    assert_int_equal(exitcode_of(p), -SIGKILL);
    assert_mp_ok(mp_process_destroy(p));
}

/* Payload and a tensor reach the child; what it writes, the parent sees
 * (a private tensor is moved into shared memory when sent). */
static void test_tensor_arg(void **state)
{
    int64_t shape[1] = {4};
    int value = 100;
    mp_tensor *priv = NULL, *shared = NULL;
    mp_msg *m = NULL;
    mp_process_options o;
    mp_process *p = NULL;
    int32_t *d;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 1, shape, &priv));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, &value, sizeof value));
    assert_mp_ok(mp_msg_add_tensor(m, "t", priv));
    mp_process_options_init(&o);
    o.start_method = mp_test_method(state);
    assert_mp_ok(mp_process_create("t_tensor", m, &o, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_int_equal(exitcode_of(p), 0);
    assert_mp_ok(mp_process_destroy(p));
    assert_int_equal(((int32_t *)mp_tensor_data(priv))[0], 100);
    mp_msg_destroy(m);

    /* mp_spawn: four ranks each write their own element of a shared tensor */
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, shape, &shared));
    assert_mp_ok(mp_msg_create(&m));
    value = 10;
    assert_mp_ok(mp_msg_set_payload(m, &value, sizeof value));
    assert_mp_ok(mp_msg_add_tensor(m, "t", shared));
    assert_mp_ok(mp_spawn("t_tensor", m, 4, true, false, mp_test_method(state), NULL));
    d = mp_tensor_data(shared);
    for (int i = 0; i < 4; i++)
        assert_int_equal(d[i], 10 + i);
    mp_msg_destroy(m);
    mp_tensor_release(shared);
    mp_tensor_release(priv);
}

static void test_raise_and_segv(void **state)
{
    const char *m = mp_test_method(state);
    mp_child_error e = {.size = sizeof e};
    mp_process *p = run_op(m, (targ){OP_RAISE, 7, 0, 0});
    assert_int_equal(exitcode_of(p), 1);
    assert_mp_ok(mp_process_error(p, &e));
    assert_string_equal(e.message, "bad batch 7");
    assert_mp_ok(mp_process_destroy(p));

    p = run_op(m, (targ){OP_SEGV, 0, 0, 0});
    assert_int_equal(exitcode_of(p), -SIGSEGV);
    assert_mp_ok(mp_process_error(p, &e));
    assert_string_equal(e.signal_name, "SIGSEGV");
    assert_non_null(strchr(e.backtrace, '\n'));
    assert_non_null(strstr(e.backtrace, "process_test"));
    assert_mp_ok(mp_process_destroy(p));
}

static void test_misuse_and_timeout(void **state)
{
    mp_process_options o;
    mp_process *p = NULL;
    mp_msg *m = make_args((targ){OP_HANG, 0, 0, 0});
    int code;
    mp_process_options_init(&o);
    o.start_method = mp_test_method(state);
    o.name = "hanger";
    assert_mp_ok(mp_process_create("t_op", m, &o, &p));
    assert_string_equal(mp_process_name(p), "hanger");
    assert_mp_err(mp_process_join(p, 0), MP_ESTATE);
    assert_mp_err(mp_process_exitcode(p, &code), MP_ESTATE);
    assert_mp_err(mp_process_terminate(p), MP_ESTATE);
    assert_false(mp_process_is_alive(p));
    assert_int_equal(mp_process_pid(p), 0);
    assert_mp_ok(mp_process_start(p));
    mp_msg_destroy(m);
    assert_mp_err(mp_process_start(p), MP_ESTATE);
    assert_true(mp_process_is_alive(p));
    {
        struct pollfd pf = {.fd = mp_process_sentinel(p), .events = POLLIN};
        assert_true(pf.fd >= 0);
        assert_int_equal(poll(&pf, 1, 0), 0); /* running: not readable */
    }
    assert_mp_err(mp_process_join(p, 0.1), MP_ETIMEDOUT);
    assert_mp_err(mp_process_exitcode(p, &code), MP_ESTATE);
    assert_mp_err(mp_process_destroy(p), MP_ESTATE);
    assert_mp_ok(mp_process_terminate(p));
    {
        struct pollfd pf = {.fd = mp_process_sentinel(p), .events = POLLIN};
        assert_int_equal(poll(&pf, 1, 20000), 1); /* readable once it exits */
    }
    assert_mp_ok(mp_process_join(p, -1));
    assert_int_equal(exitcode_of(p), -SIGTERM);
    assert_int_equal(mp_process_sentinel(p), -1);
    assert_mp_ok(mp_process_kill(p)); /* no-op once finished */
    assert_mp_ok(mp_process_destroy(p));
    assert_mp_ok(mp_process_destroy(NULL));
    assert_mp_err(mp_process_start(NULL), MP_EINVAL);
}

static void test_unknown_entry(void **state)
{
    const char *method = mp_test_method(state);
    mp_process_options o;
    mp_process *p = NULL;
    mp_child_error e = {.size = sizeof e};
    mp_process_options_init(&o);
    o.start_method = method;
    assert_mp_err(mp_process_create("no_such_entry", NULL, &o, &p), MP_ENOENT);
    assert_null(p);
    /* mp_spawn checks the entry before it starts anyone, in its own name */
    assert_mp_err(mp_spawn("no_such_entry", NULL, 2, true, false, method, NULL), MP_ENOENT);
    assert_string_equal(mp_last_error(), "mp_spawn: no entry called 'no_such_entry' is "
                        "registered (define it with MP_ENTRY(no_such_entry))");
    assert_mp_err(mp_spawn(NULL, NULL, 2, true, false, method, NULL), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_spawn: the entry name is NULL");
    /* t_late exists here but not in a program started by exec. */
    assert_mp_ok(mp_process_create("t_late", NULL, &o, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_mp_ok(mp_process_error(p, &e));
    if (strcmp(method, "fork") == 0) {
        assert_int_equal(e.exitcode, 0);
    } else {
        assert_int_equal(e.exitcode, 1);
        if (!strstr(e.message, "no entry called 't_late'"))
            fail_msg("message: %s", e.message);
    }
    assert_mp_ok(mp_process_destroy(p));
}

static void test_spawn_ok(void **state)
{
    mp_msg *m = make_args((targ){OP_RETURN, 0, -1, 0});
    mp_spawn_context *ctx = NULL;
    assert_mp_ok(mp_spawn("t_rank", m, 4, true, false, mp_test_method(state), &ctx));
    assert_null(ctx);
    /* without join: not done yet, then done */
    assert_mp_ok(mp_spawn("t_rank", m, 3, false, false, mp_test_method(state), &ctx));
    assert_int_equal(mp_spawn_context_nprocs(ctx), 3);
    assert_true(mp_spawn_context_pid(ctx, 2) > 0);
    assert_int_equal(mp_spawn_context_pid(ctx, 3), 0);
    assert_mp_err(mp_spawn_context_join(ctx, 0), MP_ETIMEDOUT);
    assert_mp_ok(mp_spawn_context_join(ctx, 20));
    assert_mp_ok(mp_spawn_context_join(ctx, 0));
    mp_spawn_context_destroy(ctx);
    mp_msg_destroy(m);
    assert_mp_err(mp_spawn("t_rank", NULL, 0, true, false, NULL, NULL), MP_EINVAL);
    assert_mp_err(mp_spawn("t_rank", NULL, 1, false, false, NULL, NULL), MP_EINVAL);
    assert_mp_err(mp_spawn("t_rank", NULL, 1, true, false, "vfork", NULL), MP_EINVAL);
}

/* rank 1 fails with op; ranks 0 and 2 hang and must be killed. */
static void spawn_failure(const char *method, targ a, int want_exit, const char *want_msg)
{
    mp_msg *m = make_args(a);
    mp_spawn_context *ctx = NULL;
    mp_child_error e = {.size = sizeof e};
    pid_t pids[3];
    double t0 = mp__now();
    assert_mp_err(mp_spawn("t_rank", m, 3, false, false, method, &ctx), 0);
    for (int i = 0; i < 3; i++)
        pids[i] = mp_spawn_context_pid(ctx, i);
    assert_mp_err(mp_spawn_context_join(ctx, 20), MP_ECHILD);
    assert_true(mp__now() - t0 < 10);
    assert_mp_ok(mp_spawn_context_error(ctx, &e));
    assert_int_equal(e.rank, 1);
    assert_int_equal(e.pid, pids[1]);
    assert_int_equal(e.exitcode, want_exit);
    assert_non_null(strstr(e.message, want_msg));
    assert_non_null(strstr(mp_last_error(), "process 1"));
    for (int i = 0; i < 3; i++)
        assert_true(pid_gone(pids[i]) || kill(pids[i], 0) < 0);
    assert_mp_err(mp_spawn_context_join(ctx, 0), MP_ECHILD); /* sticky */
    if (want_exit == -SIGSEGV) {
        assert_string_equal(e.signal_name, "SIGSEGV");
        assert_non_null(strchr(e.backtrace, '\n'));
    }
    mp_spawn_context_destroy(ctx);
    mp_msg_destroy(m);
}

static void test_spawn_failures(void **state)
{
    const char *m = mp_test_method(state);
    spawn_failure(m, (targ){OP_RAISE, 7, 1, 0}, 1, "bad batch 7");
    spawn_failure(m, (targ){OP_SEGV, 0, 1, 0}, -SIGSEGV, "");
    spawn_failure(m, (targ){OP_RETURN, 5, 1, 0}, 5, "");
}

static void test_spawn_join_mode_failure(void **state)
{
    mp_msg *m = make_args((targ){OP_RAISE, 3, 2, 0});
    mp_spawn_context *ctx = NULL;
    mp_child_error e = {.size = sizeof e};
    assert_mp_err(mp_spawn("t_rank", m, 3, true, false, mp_test_method(state), NULL), MP_ECHILD);
    assert_non_null(strstr(mp_last_error(), "bad batch 3"));
    assert_mp_err(mp_spawn("t_rank", m, 3, true, false, mp_test_method(state), &ctx), MP_ECHILD);
    assert_non_null(ctx);
    assert_mp_ok(mp_spawn_context_error(ctx, &e));
    assert_int_equal(e.rank, 2);
    mp_spawn_context_destroy(ctx);
    mp_msg_destroy(m);
}

/* A sibling that ignores SIGTERM is SIGKILLed kill_timeout after it. */
static void test_spawn_grace_period(void **state)
{
    mp_msg *m = make_args((targ){OP_RAISE, 1, 0, 1});
    mp_spawn_options o;
    mp_spawn_context *ctx = NULL;
    mp_tensor *ready = NULL;
    int64_t one = 1;
    pid_t sibling;
    double t0;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &one, &ready));
    assert_mp_ok(mp_msg_add_tensor(m, "ready", ready));
    mp_spawn_options_init(&o);
    o.nprocs = 2;
    o.join = false;
    o.start_method = mp_test_method(state);
    o.kill_timeout = 0.3;
    assert_mp_ok(mp_spawn_ex("t_rank", m, &o, &ctx));
    sibling = mp_spawn_context_pid(ctx, 1);
    t0 = mp__now();
    assert_mp_err(mp_spawn_context_join(ctx, 20), MP_ECHILD);
    assert_true(mp__now() - t0 >= 0.3);
    assert_true(pid_gone(sibling) || kill(sibling, 0) < 0);
    assert_mp_err(mp_spawn_context_set_grace_period(ctx, -1), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_spawn_context_set_grace_period: grace_period is "
                        "-1; want seconds >= 0");
    assert_mp_err(mp_spawn_context_set_kill_timeout(ctx, NAN), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_spawn_context_set_kill_timeout: kill_timeout is "
                        "nan; want seconds >= 0");
    assert_mp_err(mp_spawn_context_set_kill_timeout(NULL, 1), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_spawn_context_set_kill_timeout: context is NULL");
    assert_mp_err(mp_spawn_context_error(ctx, NULL), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_spawn_context_error: out is NULL");
    o.kill_timeout = -0.5;
    assert_mp_err(mp_spawn_ex("t_rank", m, &o, &ctx), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_spawn: kill_timeout is -0.5; want seconds >= 0");
    mp_spawn_context_destroy(ctx);
    mp_msg_destroy(m);
    mp_tensor_release(ready);
}

/* A failing system call leaves no child, fd or socket behind, and the
 * process can be started afterwards. */
static void test_start_faults(void **state)
{
    mp_process_options o;
    mp_process *p = NULL;
    mp_msg *m = make_args((targ){OP_RETURN, 4, 0, 0});
    mp_process_options_init(&o);
    o.start_method = mp_test_method(state);
    assert_mp_ok(mp_process_create("t_op", m, &o, &p));
    assert_mp_ok(mp__sys_fault("socketpair", EMFILE, 0, 1));
    assert_mp_err(mp_process_start(p), MP_EMFILE);
    assert_mp_ok(mp__sys_fault("sendmsg", ENOBUFS, 0, 1));
    assert_true(mp_process_start(p) < 0);
    if (strcmp(o.start_method, "spawn") == 0) {
        /* exec's outcome unknown: the child is killed, not waited for */
        assert_mp_ok(mp__sys_fault("read", EIO, 0, 1));
        assert_true(mp_process_start(p) < 0);
        assert_non_null(strstr(mp_last_error(), "exec status"));
    }
    mp__sys_fault_reset();
    assert_int_equal(mp_process_pid(p), 0);
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_int_equal(exitcode_of(p), 4);
    assert_mp_ok(mp_process_destroy(p));
    mp_msg_destroy(m);
}

/* An intermediate parent starts a hanging child, then is SIGKILLed. */
static void test_parent_killed(void **state)
{
    int pfd[2];
    pid_t mid, pids[2] = {0, 0};
    assert_int_equal(pipe(pfd), 0);
    mid = fork();
    assert_true(mid >= 0);
    if (mid == 0) {
        mp_process_options o;
        mp_process *p = NULL;
        mp_msg *m = NULL;
        targ a = {OP_HANG, 0, 0, 0};
        mp_process_options_init(&o);
        o.start_method = mp_test_method(state);
        if (mp_msg_create(&m) || mp_msg_set_payload(m, &a, sizeof a) ||
            mp_process_create("t_op", m, &o, &p) || mp_process_start(p))
            _exit(1);
        pids[0] = mp_process_pid(p);
        pids[1] = getpid();
        if (write(pfd[1], pids, sizeof pids) != sizeof pids)
            _exit(1);
        for (;;)
            pause();
    }
    close(pfd[1]);
    assert_int_equal(read(pfd[0], pids, sizeof pids), (int)sizeof pids);
    close(pfd[0]);
    assert_true(kill(pids[0], 0) == 0);
    kill(mid, SIGKILL);
    waitpid(mid, NULL, 0);
    for (int i = 0; i < 100 && !pid_gone(pids[0]); i++)
        sleep_ms(10);
    assert_true(pid_gone(pids[0]));
}

static void test_no_fd_inherited(void **state)
{
    const char *method = mp_test_method(state);
    /* No O_CLOEXEC on purpose; above 4, which the child uses itself. */
    int fd0 = open("/dev/null", O_RDONLY), fd = fcntl(fd0, F_DUPFD, 20);
    mp_process *p;
    close(fd0);
    assert_true(fd >= 0);
    p = run_op(method, (targ){OP_FD_CLOSED, fd, 0, 0});
    /* fork copies every fd; spawn and forkserver children get none. */
    assert_int_equal(exitcode_of(p), strcmp(method, "fork") == 0 ? 3 : 0);
    assert_mp_ok(mp_process_destroy(p));
    close(fd);
}

#define EACH(t) MP_TEST_EACH_METHOD(t)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        EACH(test_exitcodes),          EACH(test_tensor_arg),
        EACH(test_raise_and_segv),     EACH(test_misuse_and_timeout),
        EACH(test_unknown_entry),      EACH(test_spawn_ok),
        EACH(test_spawn_failures),     EACH(test_spawn_join_mode_failure),
        EACH(test_spawn_grace_period), EACH(test_start_faults),
        EACH(test_parent_killed),      EACH(test_no_fd_inherited),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    if (mp_register_entry("t_late", t_late) != 0)
        return 1;
    warm_up();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
