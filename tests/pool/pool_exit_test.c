/* A program that exits with a pool still running ends, as in Python (whose
 * Pool finalizer terminates it at exit): the exit handler terminates the
 * pool before it joins the children, instead of waiting forever for workers
 * that wait for tasks. Each case runs in a forked child that calls exit(3)
 * the way a program would; the test waits for it and checks that its
 * workers are gone. */
#include "helpers.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

enum { MAX_WORKERS = 4 };

typedef struct report {
    int32_t pids[MAX_WORKERS];
    int n;
} report;

typedef void (*exit_case)(mp_pool *p);

/* Every worker's pid: one "whoami" per worker, each held until all ran. */
static void learn_workers(mp_pool *p, report *r)
{
    mp_msg *in[2] = {msg_i64(200), msg_i64(200)}, *out[2];
    assert_mp_ok(mp_pool_map(p, "nap_ms", (const mp_msg *const *)in, 2, 1, out));
    for (int i = 0; i < 2; i++) {
        r->pids[r->n++] = out_span(out[i]).pid;
        mp_msg_destroy(out[i]);
        mp_msg_destroy(in[i]);
    }
}

static void exit_idle(mp_pool *p) { (void)p; }

static void exit_busy(mp_pool *p)
{
    mp_msg *in = msg_i64(60 * 1000);
    mp_async_result *res = NULL;
    assert_mp_ok(mp_pool_apply_async(p, "nap_ms", in, NULL, &res)); /* never collected */
    mp_msg_destroy(in);
    usleep(100 * 1000);
}

static void exit_closed(mp_pool *p)
{
    assert_mp_ok(mp_pool_close(p)); /* closed, never joined */
}

static void exit_in_callback(mp_async_result *res, void *user)
{
    (void)res, (void)user;
    exit(3); /* on the pool's own handler thread */
}

static void exit_from_callback(mp_pool *p)
{
    mp_msg *in = msg_i64(0);
    mp_pool_callbacks cb = {.size = sizeof cb, .on_success = exit_in_callback};
    mp_async_result *res = NULL;
    assert_mp_ok(mp_pool_apply_async(p, "whoami", in, &cb, &res));
    sleep(30); /* the callback ends the program first (the result is ready before it runs) */
    _exit(1);
}

static _Atomic int go;

static void *destroy_when_told(void *arg)
{
    while (!atomic_load(&go))
        ;
    mp_pool_destroy(arg);
    return NULL;
}

/* Another thread destroys the pool while exit's handler stops it: the
 * destroy waits for the handler, so neither uses a freed pool (ASan and
 * TSan see it when it does). */
static void exit_racing_destroy(mp_pool *p)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, destroy_when_told, p), 0);
    pthread_detach(t);
    atomic_store(&go, 1);
}

/* A child that reports its workers on fd, runs c, then exits (3). */
static _Noreturn void child_main(const char *method, exit_case c, int fd)
{
    report r = {0};
    mp_pool *p = pool_new_method(2, 0, method);
    learn_workers(p, &r);
    if (write(fd, &r, sizeof r) != (ssize_t)sizeof r)
        _exit(2);
    c(p);
    exit(3);
}

/* The child ends within 20 s with code 3 and leaves no worker alive. */
static void check_exit(const char *method, exit_case c)
{
    int fds[2];
    report r = {0};
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        child_main(method, c, fds[1]);
    }
    close(fds[1]);
    int status = 0, waited = 0;
    while (waitpid(pid, &status, WNOHANG) == 0 && waited < 2000) {
        usleep(10 * 1000);
        waited++;
    }
    if (waited == 2000) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        close(fds[0]);
        fail_msg("%s: the program did not end within 20 s of exit()", method);
    }
    ssize_t got = read(fds[0], &r, sizeof r);
    close(fds[0]);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3);
    assert_int_equal(got, (ssize_t)sizeof r);
    for (int i = 0; i < r.n; i++)
        if (kill(r.pids[i], 0) == 0 || errno != ESRCH)
            fail_msg("%s: worker %d (pid %d) outlived the program", method, i, r.pids[i]);
}

static void idle_fork(void **s) { check_exit("fork", exit_idle); }
static void idle_spawn(void **s) { check_exit("spawn", exit_idle); }
static void idle_forkserver(void **s)
{
#ifdef __SANITIZE_THREAD__
    /* TSan runs vfork as fork, so the fork handlers run, and one of them
     * takes the lock the forkserver's launch holds around its vfork. */
    skip();
#endif
    check_exit("forkserver", exit_idle);
}
static void busy_fork(void **s) { check_exit("fork", exit_busy); }
static void closed_fork(void **s) { check_exit("fork", exit_closed); }
static void from_callback_fork(void **s) { check_exit("fork", exit_from_callback); }
static void racing_destroy_fork(void **s)
{
    for (int i = 0; i < 8; i++) /* the race lands anywhere in exit's handler */
        check_exit("fork", exit_racing_destroy);
}

#define T(t) cmocka_unit_test_setup_teardown(t, setup, teardown)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(idle_fork), T(idle_spawn), T(idle_forkserver),
        T(busy_fork), T(closed_fork), T(from_callback_fork), T(racing_destroy_fork),
    };
    if (pool_tests_begin(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
