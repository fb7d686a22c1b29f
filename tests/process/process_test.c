/* mp_process, start methods, mp_spawn: every test runs under fork, spawn and
 * forkserver, and checks that no child, zombie or fd outlives it. */
#include "mp_test.h"
#include "process/process_internal.h"

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

/* ---- entries ------------------------------------------------------------- */

typedef struct targ {
    int op; /* what the child does */
    int value;
    int rank_to_fail;
    int stubborn; /* the ranks that hang ignore SIGTERM */
} targ;

enum { OP_RETURN, OP_SIGNAL, OP_HANG, OP_RAISE, OP_SEGV, OP_FD_CLOSED, OP_SLEEP_MS };

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int do_op(const targ *a)
{
    switch (a->op) {
    case OP_RETURN:
        return a->value;
    case OP_SIGNAL:
        raise(a->value);
        return 99;
    case OP_HANG:
        for (;;)
            pause();
    case OP_RAISE:
        mp_raise("bad batch %d", a->value);
    case OP_SEGV:
        raise(SIGSEGV);
        return 98;
    case OP_FD_CLOSED:
        return fcntl(a->value, F_GETFD) < 0 && errno == EBADF ? 0 : 3;
    case OP_SLEEP_MS:
        sleep_ms(a->value);
        return 0;
    default:
        return 97;
    }
}

MP_ENTRY(t_op)
{
    size_t len;
    const targ *a = mp_msg_payload(args, &len);
    if (len != sizeof *a)
        mp_raise("t_op: payload of %zu bytes", len);
    return do_op(a);
}

/* Under mp_spawn: rank_to_fail does op, the others hang. */
MP_ENTRY(t_rank)
{
    size_t len;
    const targ *a = mp_msg_payload(args, &len);
    targ hang = {.op = OP_HANG};
    if (len != sizeof *a)
        mp_raise("t_rank: payload of %zu bytes", len);
    if (a->rank_to_fail < 0)
        return rank == 0 ? 0 : do_op(&(targ){.op = OP_SLEEP_MS, .value = 20 * rank});
    if (a->stubborn) {
        /* "ready" (shared int32[1]): the others ignore SIGTERM before the
         * failing rank fails. */
        mp_tensor *t = NULL;
        volatile int32_t *ready;
        if (mp_msg_find_tensor(args, "ready", &t) != 0)
            mp_raise("t_rank: no ready tensor");
        ready = mp_tensor_data(t);
        if (rank != a->rank_to_fail) {
            signal(SIGTERM, SIG_IGN);
            __atomic_fetch_add(ready, 1, __ATOMIC_SEQ_CST);
        } else {
            for (int i = 0; i < 2000 && __atomic_load_n(ready, __ATOMIC_SEQ_CST) == 0; i++)
                sleep_ms(5);
        }
        mp_tensor_release(t);
    }
    return do_op(rank == a->rank_to_fail ? a : &hang);
}

/* Writes payload value + rank into element rank of the tensor "t". */
MP_ENTRY(t_tensor)
{
    size_t len;
    const int *v = mp_msg_payload(args, &len);
    mp_tensor *t = NULL;
    if (len != sizeof *v || mp_msg_find_tensor(args, "t", &t) != 0)
        mp_raise("t_tensor: bad arguments (%zu bytes): %s", len, mp_last_error());
    if (rank >= mp_tensor_numel(t))
        mp_raise("t_tensor: rank %d out of range", rank);
    ((int32_t *)mp_tensor_data(t))[rank] = *v + rank;
    mp_tensor_release(t);
    return 0;
}

/* Registered in main after mp_setup: children started by exec lack it. */
static int t_late(int rank, mp_msg *args)
{
    return 0;
}


static mp_msg *make_args(targ a)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, &a, sizeof a));
    return m;
}

/* Runs t_op with a under method to the end; returns the process. */
static mp_process *run_op(const char *method, targ a)
{
    mp_process_options o;
    mp_process *p = NULL;
    mp_msg *m = make_args(a);
    mp_process_options_init(&o);
    o.start_method = method;
    assert_mp_ok(mp_process_create("t_op", m, &o, &p));
    assert_mp_ok(mp_process_start(p));
    mp_msg_destroy(m);
    assert_mp_ok(mp_process_join(p, 20));
    return p;
}

static int exitcode_of(mp_process *p)
{
    int code = 12345;
    assert_mp_ok(mp_process_exitcode(p, &code));
    return code;
}

static bool pid_gone(pid_t pid)
{
    char path[64], buf[256], state = '?';
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (!f)
        return true;
    if (fgets(buf, sizeof buf, f)) {
        char *p = strrchr(buf, ')');
        if (p)
            state = p[2];
    }
    fclose(f);
    return state == 'Z' || state == 'X'; /* dead, waiting for init to reap it */
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

/* The first child of ours found in /proc, or 0. */
static pid_t find_child(void)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (d && !found && (e = readdir(d))) {
        char path[300], buf[512];
        int ppid = 0;
        FILE *f;
        if (atoi(e->d_name) <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        if (fgets(buf, sizeof buf, f)) {
            char *p = strrchr(buf, ')');
            if (p && sscanf(p + 2, "%*c %d", &ppid) == 1 && ppid == getpid())
                found = atoi(e->d_name);
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    return found;
}

/* A forkserver that died (killed) is replaced on the next start. */
static void test_forkserver_restart(void **state)
{
    mp_process *p;
    pid_t server;
    int st;
    assert_mp_ok(mp_forkserver_start());
    assert_mp_ok(mp_forkserver_start()); /* idempotent */
    server = find_child();
    assert_true(server > 0);
    assert_int_equal(kill(server, SIGKILL), 0);
    assert_int_equal(waitpid(server, &st, 0), server); /* as a careless test would */
    p = run_op("forkserver", (targ){OP_RETURN, 6, 0, 0});
    assert_int_equal(exitcode_of(p), 6);
    assert_mp_ok(mp_process_destroy(p));
    assert_mp_ok(mp_forkserver_stop());
    assert_mp_ok(mp_forkserver_stop()); /* no-op */
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

static void test_exec_failure(void **state)
{
    mp_process_options o;
    mp_process *p = NULL;
    const char *saved = mp__exec_path;
    mp_process_options_init(&o);
    o.start_method = "spawn";
    assert_mp_ok(mp_process_create("t_op", NULL, &o, &p));
    mp__exec_path = "/nonexistent/mproc-test";
    assert_mp_err(mp_process_start(p), MP_ENOENT);
    mp__exec_path = saved;
    assert_non_null(strstr(mp_last_error(), "exec of /nonexistent/mproc-test failed"));
    assert_mp_ok(mp_process_destroy(p));
}

static void test_start_methods(void **state)
{
    const char *const *all = mp_get_all_start_methods();
    mp_context *ctx = NULL;
    assert_string_equal(all[0], "fork");
    assert_string_equal(all[1], "spawn");
    assert_string_equal(all[2], "forkserver");
    assert_null(all[3]);
    assert_mp_ok(mp_set_start_method(NULL, true));
    assert_mp_ok(mp_set_start_method("spawn", false));
    assert_mp_err(mp_set_start_method("fork", false), MP_ESTATE);
    assert_string_equal(mp_get_start_method(), "spawn");
    assert_mp_ok(mp_set_start_method("forkserver", true));
    assert_mp_ok(mp_get_context(NULL, &ctx));
    assert_string_equal(mp_context_start_method(ctx), "forkserver");
    assert_mp_ok(mp_get_context("spawn", &ctx));
    assert_string_equal(mp_context_start_method(ctx), "spawn");
    assert_mp_err(mp_get_context("thread", &ctx), MP_EINVAL);
    assert_mp_err(mp_set_start_method("thread", true), MP_EINVAL);
    assert_mp_ok(mp_set_start_method(NULL, true));
    assert_string_equal(mp_get_start_method(), "fork"); /* the default, now fixed */
    assert_mp_err(mp_set_start_method("spawn", false), MP_ESTATE);
}

static void test_context_and_default(void **state)
{
    mp_process_options o;
    mp_process *p = NULL;
    mp_context *ctx = NULL;
    mp_msg *m = make_args((targ){OP_FD_CLOSED, 0, 0, 0});
    int fd0 = open("/dev/null", O_RDONLY), fd = fcntl(fd0, F_DUPFD, 20);
    targ a = {OP_FD_CLOSED, fd, 0, 0};
    close(fd0);
    assert_mp_ok(mp_msg_set_payload(m, &a, sizeof a));
    assert_mp_ok(mp_get_context("spawn", &ctx));
    mp_process_options_init(&o);
    o.context = ctx; /* spawn through the context: fd not inherited -> 0 */
    assert_mp_ok(mp_process_create("t_op", m, &o, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_int_equal(exitcode_of(p), 0);
    assert_mp_ok(mp_process_destroy(p));
    assert_mp_ok(mp_process_create("t_op", m, NULL, &p)); /* default: fork */
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_int_equal(exitcode_of(p), 3);
    assert_mp_ok(mp_process_destroy(p));
    mp_msg_destroy(m);
    close(fd);
}

static void *sleeper(void *arg)
{
    int fd = *(int *)arg;
    char c;
    (void)!read(fd, &c, 1);
    return NULL;
}

static void test_fork_hazard(void **state)
{
    bool hazard = true;
    int n = 0, pfd[2];
    pthread_t th;
    mp_process_options o;
    mp_process *p = NULL;
    assert_mp_ok(mp_fork_hazard(&hazard, &n));
    assert_false(hazard);
    assert_int_equal(n, 1);
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    assert_int_equal(pthread_create(&th, NULL, sleeper, &pfd[0]), 0);
    assert_mp_ok(mp_fork_hazard(&hazard, &n));
    assert_true(hazard);
    assert_int_equal(n, 2);
    mp_set_fork_refuse_threads(true);
    mp_process_options_init(&o);
    o.start_method = "fork";
    assert_mp_ok(mp_process_create("t_op", NULL, &o, &p));
    assert_mp_err(mp_process_start(p), MP_ESTATE);
    assert_non_null(strstr(mp_last_error(), "spawn"));
    assert_mp_ok(mp_process_destroy(p));
    o.start_method = "spawn"; /* the safe method still works */
    assert_mp_ok(mp_process_create("t_op", NULL, &o, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_int_equal(exitcode_of(p), 1); /* empty payload: t_op raises */
    assert_mp_ok(mp_process_destroy(p));
    mp_set_fork_refuse_threads(false);
    close(pfd[1]);
    pthread_join(th, NULL);
    close(pfd[0]);
}

/* Several threads start and join processes at once: the forkserver
 * connection, its relayed exit statuses and the live list are shared. */
typedef struct thread_job {
    const char *method;
    int base;
    int bad; /* exit codes that came back wrong */
    char why[256];
} thread_job;

static void *start_many(void *arg)
{
    thread_job *j = arg;
    mp_process_options o;
    mp_process_options_init(&o);
    o.start_method = j->method;
    for (int i = 0; i < 5; i++) {
        targ a = {OP_RETURN, j->base + i, 0, 0};
        mp_msg *m = NULL;
        mp_process *p = NULL;
        int code = -1;
        if (mp_msg_create(&m) || mp_msg_set_payload(m, &a, sizeof a) ||
            mp_process_create("t_op", m, &o, &p) || mp_process_start(p) || mp_process_join(p, 20) ||
            mp_process_exitcode(p, &code) || code != j->base + i) {
            if (!j->bad++)
                snprintf(j->why, sizeof j->why, "%s: exit %d: %s", j->method, code,
                         mp_last_error());
        }
        mp_process_destroy(p);
        mp_msg_destroy(m);
    }
    return NULL;
}

static void test_threads(void **state)
{
    thread_job jobs[4] = {{"fork", 10, 0, ""},
                          {"spawn", 20, 0, ""},
                          {"forkserver", 30, 0, ""},
                          {"forkserver", 40, 0, ""}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, start_many, &jobs[i]), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].bad)
            fail_msg("%d failures, first: %s", jobs[i].bad, jobs[i].why);
    }
}

/* At normal exit, a daemon child gets SIGTERM (not the PDEATHSIG SIGKILL). */
static int daemon_fd = -1;
static void on_term(int sig)
{
    (void)!write(daemon_fd, "t", 1);
    _exit(42);
}

MP_ENTRY(t_daemon)
{
    size_t len;
    const int *fd = mp_msg_payload(args, &len);
    daemon_fd = *fd;
    signal(SIGTERM, on_term);
    if (write(*fd, "r", 1) != 1)
        return 2;
    for (;;)
        pause();
}

static void test_daemon_at_exit(void **state)
{
    int pfd[2];
    char c;
    pid_t mid;
    assert_int_equal(pipe(pfd), 0);
    mid = fork();
    if (mid == 0) {
        mp_process_options o;
        mp_process *p = NULL;
        mp_msg *m = NULL;
        mp_process_options_init(&o);
        o.start_method = "fork";
        o.daemon = true;
        close(pfd[0]);
        if (mp_msg_create(&m) || mp_msg_set_payload(m, &pfd[1], sizeof pfd[1]) ||
            mp_process_create("t_daemon", m, &o, &p) || mp_process_start(p))
            _exit(1);
        mp_msg_destroy(m);
        close(pfd[1]);
        sleep_ms(100);
        exit(0); /* the exit handler terminates and reaps the daemon */
    }
    close(pfd[1]);
    assert_int_equal(read(pfd[0], &c, 1), 1);
    assert_int_equal(c, 'r');
    assert_int_equal(read(pfd[0], &c, 1), 1);
    assert_int_equal(c, 't');
    {
        int st = 0;
        assert_int_equal(waitpid(mid, &st, 0), mid);
        /* exited normally (under LSan the status may be its leak report's) */
        assert_true(WIFEXITED(st));
    }
    close(pfd[0]);
}

#define EACH(t) MP_TEST_EACH_METHOD(t)
#define ONCE(t) MP_TEST_ON(t, "fork")

/* Sanitizer allocators map size classes on first use: exercise every path
 * once before the tests, so their leak checks see only real growth. */
static void warm_up(void)
{
    static const char *const methods[] = {"fork", "spawn", "forkserver"};
    for (int i = 0; i < 3; i++) {
        mp_spawn_context *ctx = NULL;
        static const int ops[] = {OP_RETURN, OP_RAISE, OP_SEGV};
        for (int k = 0; k < 3; k++) {
            targ a = {ops[k], 1, ops[k] == OP_RETURN ? -1 : 1, 0};
            mp_msg *m = NULL;
            mp_msg_create(&m);
            mp_msg_set_payload(m, &a, sizeof a);
            mp_spawn("t_rank", m, 3, true, false, methods[i], &ctx);
            mp_spawn_context_destroy(ctx);
            mp_spawn("t_rank", m, 4, false, false, methods[i], &ctx);
            mp_spawn_context_join(ctx, 0);
            mp_spawn_context_destroy(ctx);
            mp_msg_destroy(m);
        }
        mp_forkserver_stop();
    }
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        EACH(test_exitcodes),          EACH(test_tensor_arg),
        EACH(test_raise_and_segv),     EACH(test_misuse_and_timeout),
        EACH(test_unknown_entry),      EACH(test_spawn_ok),
        EACH(test_spawn_failures),     EACH(test_spawn_join_mode_failure),
        EACH(test_spawn_grace_period), EACH(test_start_faults),
        EACH(test_parent_killed),      EACH(test_no_fd_inherited),
        ONCE(test_exec_failure),       ONCE(test_forkserver_restart),
        ONCE(test_start_methods),      ONCE(test_context_and_default),
        ONCE(test_fork_hazard),        ONCE(test_threads),
        ONCE(test_daemon_at_exit),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    if (mp_register_entry("t_late", t_late) != 0)
        return 1;
    {
        /* glibc caches a joined thread's stack: map it now, not in a test */
        int pfd[2];
        pthread_t th;
        if (pipe2(pfd, O_CLOEXEC) || pthread_create(&th, NULL, sleeper, &pfd[0]))
            return 1;
        close(pfd[1]);
        pthread_join(th, NULL);
        close(pfd[0]);
    }
    warm_up();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
