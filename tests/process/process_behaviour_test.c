/* Process behaviours users of Python's multiprocessing and torch rely on,
 * under fork, spawn and forkserver: buffered stdio is not printed twice, a
 * child reports the start method it was started with, mp_spawn's
 * grace_period lets the others finish before SIGTERM, and a forkserver
 * child outlives the server (joined, with its real exit code). */
#include "mp_test.h"
#include "process/process_internal.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int payload_int(mp_msg *args)
{
    size_t len = 0;
    const void *p = mp_msg_payload(args, &len);
    int v = -1;
    if (len == sizeof v)
        memcpy(&v, p, sizeof v);
    return v;
}

static mp_msg *int_msg(int v)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, &v, sizeof v));
    return m;
}

static int join_code(mp_process *p)
{
    int code = -12345;
    assert_mp_ok(mp_process_join(p, 30));
    assert_mp_ok(mp_process_exitcode(p, &code));
    assert_mp_ok(mp_process_destroy(p));
    return code;
}


/* ---- stdio is flushed before fork ------------------------------------------ */

MP_ENTRY(quiet) { return 0; }

/* In a helper whose stdout is a pipe (fully buffered), prints a line
 * without flushing, then starts and joins a child. */
static void test_no_double_output(void **state)
{
    const char *method = mp_test_method(state);
    int pfd[2], st = 0;
    char buf[256] = {0};
    size_t got = 0;
    ssize_t n;
    pid_t helper;
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    helper = fork();
    assert_true(helper >= 0);
    if (helper == 0) {
        mp_process *p = NULL;
        mp_process_options o;
        int code = -1;
        close(pfd[0]);
        if (dup2(pfd[1], STDOUT_FILENO) < 0)
            _exit(10);
        close(pfd[1]);
        setvbuf(stdout, NULL, _IOFBF, 4096);
        printf("buffered line\n"); /* still in this process's buffer */
        mp_process_options_init(&o);
        o.start_method = method;
        if (mp_process_create("quiet", NULL, &o, &p) || mp_process_start(p) ||
            mp_process_join(p, 20) || mp_process_exitcode(p, &code) || code != 0)
            _exit(11);
        mp_process_destroy(p);
        mp_forkserver_stop();
        fflush(stdout);
        _exit(0);
    }
    close(pfd[1]);
    while (got < sizeof buf - 1 && (n = read(pfd[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)n;
    close(pfd[0]);
    assert_int_equal(waitpid(helper, &st, 0), helper);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_string_equal(buf, "buffered line\n"); /* once, not twice */
}

/* ---- the child's start method ---------------------------------------------- */

/* Exits 0 when mp_get_start_method() names the method in the payload. */
MP_ENTRY(report_method)
{
    static const char *const names[] = {"fork", "spawn", "forkserver"};
    int want = payload_int(args);
    if (want < 0 || want > 2)
        return 3;
    if (strcmp(mp_get_start_method(), names[want]) != 0) {
        mp_raise("started with %s, mp_get_start_method() says %s", names[want],
                 mp_get_start_method());
    }
    return 0;
}

static void test_child_start_method(void **state)
{
    const char *method = mp_test_method(state);
    int idx = strcmp(method, "fork") == 0 ? 0 : strcmp(method, "spawn") == 0 ? 1 : 2;
    mp_msg *m = int_msg(idx);
    mp_process *p;
    mp_child_error e = {.size = sizeof e};
    /* the parent's default stays fork; the child reports its own method */
    assert_mp_ok(mp_set_start_method("fork", true));
    p = mp_test_start("report_method", m, method);
    assert_mp_ok(mp_process_join(p, 30));
    assert_mp_ok(mp_process_error(p, &e));
    if (e.exitcode != 0)
        fail_msg("exit %d: %s", e.exitcode, e.message);
    assert_mp_ok(mp_process_destroy(p));
    assert_string_equal(mp_get_start_method(), "fork");
    /* and with the method as the parent's default */
    assert_mp_ok(mp_set_start_method(method, true));
    assert_int_equal(join_code(mp_test_start("report_method", m, NULL)), 0);
    assert_mp_ok(mp_set_start_method(NULL, true));
    mp_msg_destroy(m);
}

/* ---- mp_spawn's grace period ------------------------------------------------- */

/* Rank 1 fails at once; rank 0 works 300 ms, then marks "done" and exits 0
 * (SIGTERM kills it before that unless the grace period lets it finish). */
MP_ENTRY(grace_rank)
{
    mp_tensor *done = NULL;
    if (rank == 1)
        mp_raise("rank 1 fails");
    if (mp_msg_find_tensor(args, "done", &done) != 0)
        mp_raise("no done tensor");
    sleep_ms(300);
    ((volatile int32_t *)mp_tensor_data(done))[0] = 1;
    mp_tensor_release(done);
    return 0;
}

static double run_grace(const char *method, double grace, int32_t *finished)
{
    mp_spawn_options o;
    mp_spawn_context *ctx = NULL;
    mp_tensor *done = NULL;
    mp_msg *m = NULL;
    int64_t one = 1;
    double t0;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &one, &done));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "done", done));
    mp_spawn_options_init(&o);
    assert_true(o.grace_period == 0 && o.kill_timeout == 1.0); /* the defaults */
    o.nprocs = 2;
    o.join = false;
    o.start_method = method;
    o.grace_period = grace;
    assert_mp_ok(mp_spawn_ex("grace_rank", m, &o, &ctx));
    t0 = mp__now();
    assert_mp_err(mp_spawn_context_join(ctx, 30), MP_ECHILD);
    t0 = mp__now() - t0;
    assert_non_null(strstr(mp_last_error(), "rank 1 fails"));
    mp_spawn_context_destroy(ctx);
    *finished = ((int32_t *)mp_tensor_data(done))[0];
    mp_msg_destroy(m);
    mp_tensor_release(done);
    return t0;
}

static void test_spawn_grace(void **state)
{
    const char *method = mp_test_method(state);
    int32_t finished = -1;
    /* a grace period: rank 0 finishes its work; join returns when it did,
     * not at the end of the grace period */
    double took = run_grace(method, 10, &finished);
    assert_int_equal(finished, 1);
    assert_true(took < 9);
    /* none (the default): rank 0 gets SIGTERM at once and never finishes */
    run_grace(method, 0, &finished);
    assert_int_equal(finished, 0);
}

/* ---- a forkserver child outlives the server ------------------------------------ */

MP_ENTRY(exit_later)
{
    sleep_ms(payload_int(args));
    return 7;
}

/* Our children other than except. */
static pid_t other_child(pid_t except)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (d && (e = readdir(d))) {
        pid_t pid = atoi(e->d_name);
        if (pid > 0 && pid != except && mp_test_parent_of(pid) == getpid())
            found = pid;
    }
    if (d)
        closedir(d);
    return found;
}

static void test_forkserver_child_outlives_server(void **state)
{
    mp_msg *m = int_msg(400);
    mp_process *p;
    pid_t server;
    int st;
    (void)state;
    p = mp_test_start("exit_later", m, "forkserver");
    /* the child is ours, as if we had forked it */
    assert_int_equal(mp_test_parent_of(mp_process_pid(p)), getpid());
    server = other_child(mp_process_pid(p));
    assert_true(server > 0);
    assert_int_equal(kill(server, SIGKILL), 0);
    assert_int_equal(waitpid(server, &st, 0), server);
    assert_true(mp_process_is_alive(p));
    assert_int_equal(join_code(p), 7); /* its real exit code */
    /* the next start brings a new server */
    p = mp_test_start("exit_later", m, "forkserver");
    assert_int_equal(join_code(p), 7);
    /* stopping the server does not stop its children either */
    mp_msg_destroy(m);
    m = int_msg(300);
    p = mp_test_start("exit_later", m, "forkserver");
    assert_mp_ok(mp_forkserver_stop());
    assert_true(mp_process_is_alive(p));
    assert_int_equal(join_code(p), 7);
    mp_msg_destroy(m);
}

/* A parent (a forked helper) starts a forkserver child and is SIGKILLed:
 * the child dies with it even though the server is gone first. */
static void test_forkserver_child_dies_with_parent(void **state)
{
    int pfd[2];
    pid_t mid, child = 0;
    (void)state;
    assert_int_equal(pipe(pfd), 0);
    fflush(NULL);
    mid = fork();
    assert_true(mid >= 0);
    if (mid == 0) {
        mp_msg *m = int_msg(60000);
        mp_process *p = NULL;
        mp_process_options o;
        pid_t pid;
        close(pfd[0]);
        mp_process_options_init(&o);
        o.start_method = "forkserver";
        if (mp_process_create("exit_later", m, &o, &p) || mp_process_start(p))
            _exit(10);
        pid = mp_process_pid(p);
        if (write(pfd[1], &pid, sizeof pid) != sizeof pid)
            _exit(11);
        for (;;)
            pause();
    }
    close(pfd[1]);
    assert_int_equal(read(pfd[0], &child, sizeof child), sizeof child);
    close(pfd[0]);
    assert_int_equal(mp_test_parent_of(child), mid);
    assert_int_equal(kill(mid, SIGKILL), 0);
    assert_int_equal(waitpid(mid, NULL, 0), mid);
    for (int i = 0; i < 300 && kill(child, 0) == 0; i++)
        sleep_ms(10); /* re-parented to init, which reaps it */
    assert_int_equal(kill(child, 0), -1);
}

#define EACH(t) MP_TEST_EACH_METHOD(t)
#define ONCE(t) MP_TEST_ON(t, "forkserver")

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        EACH(test_no_double_output),
        EACH(test_child_start_method),
        EACH(test_spawn_grace),
        ONCE(test_forkserver_child_outlives_server),
        ONCE(test_forkserver_child_dies_with_parent),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
