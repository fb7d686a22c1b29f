/* Chaos under the file_system strategy: SIGKILL one or all processes at each
 * phase (after create; after put, before get; after get, while mapped;
 * during a 4-process exchange). Within grace + 1 s /dev/shm holds no
 * segment of the test, and nobody hangs. Each case runs again with the
 * daemon SIGKILLed in between: the next client restarts it, and the
 * segments of dead owners are reclaimed then.
 *
 * The test process itself never touches a segment (it is not a client): it
 * creates the queue, forks workers and drives them over pipes. */
#include "mgr_test.h"

#include "mproc/queue.h"

#define ELEMS 1024
#define WORKERS 4

static mp_queue *q;

typedef struct worker {
    pid_t pid;
    int to, from;
} worker;

/* Commands: c create, p put (and drop our reference), g get (keep it
 * mapped), e exchange (create/put/get/check/release until told to stop),
 * q quit. Each answers 'k' or 'x' (failed). */
static int worker_main(int in, int out)
{
    mp_tensor *held[64];
    int n = 0;
    for (;;) {
        char c = mgr_get(in, 60);
        bool ok = true;
        mp_tensor *t = NULL;
        int64_t shape[1] = {ELEMS};
        switch (c) {
        case 'c':
            ok = n < 64 && mp_tensor_empty_shared(MP_FLOAT32, 1, shape, &t) == 0;
            if (ok) {
                ((float *)mp_tensor_data(t))[0] = 7.0f;
                held[n++] = t;
            }
            break;
        case 'p':
            ok = n > 0 && mp_queue_put_tensor(q, held[n - 1], 5) == 0;
            if (ok)
                mp_tensor_release(held[--n]);
            break;
        case 'g':
            if (n >= 64) {
                ok = false;
                break;
            }
            ok = mp_queue_get_tensor(q, &t, 5) == 0 && ((float *)mp_tensor_data(t))[0] == 7.0f;
            if (t)
                held[n++] = t;
            break;
        case 'e': {
            int fl = fcntl(in, F_GETFL);
            fcntl(in, F_SETFL, fl | O_NONBLOCK);
            mgr_put(out, 'k');
            for (char stop = 0; read(in, &stop, 1) < 0 && errno == EAGAIN;) { /* 'q' */
                if (mp_tensor_empty_shared(MP_FLOAT32, 1, shape, &t) == 0) {
                    ((float *)mp_tensor_data(t))[0] = 7.0f;
                    mp_queue_put_tensor(q, t, 0.2);
                    mp_tensor_release(t);
                }
                t = NULL;
                if (mp_queue_get_tensor(q, &t, 0.2) == 0)
                    mp_tensor_release(t);
            }
            while (n > 0)
                mp_tensor_release(held[--n]);
            return 0;
        }
        default: /* 'q', EOF or the parent gone */
            while (n > 0)
                mp_tensor_release(held[--n]);
            return 0;
        }
        mgr_put(out, ok ? 'k' : 'x');
    }
}

static worker worker_start(void)
{
    int a[2], b[2];
    worker w;
    assert_int_equal(pipe2(a, O_CLOEXEC), 0);
    assert_int_equal(pipe2(b, O_CLOEXEC), 0);
    w.pid = fork();
    assert_true(w.pid >= 0);
    if (w.pid == 0) {
        close(a[1]);
        close(b[0]);
        _exit(worker_main(a[0], b[1]));
    }
    close(a[0]);
    close(b[1]);
    w.to = a[1];
    w.from = b[0];
    return w;
}

static void order(worker *w, char cmd)
{
    mgr_put(w->to, cmd);
    assert_int_equal(mgr_get(w->from, 10), 'k');
}

static void worker_end(worker *w, bool kill_it)
{
    int status = 0;
    /* Stop by a byte, not by EOF: later workers inherited the pipe's end. */
    if (kill_it)
        kill(w->pid, SIGKILL);
    else
        mgr_put(w->to, 'q');
    /* no hang: a worker told to stop must be gone within seconds */
    for (int i = 0; i < 1000 && waitpid(w->pid, &status, WNOHANG) == 0; i++)
        mgr_sleep(0.01);
    if (kill(w->pid, 0) == 0 && waitpid(w->pid, &status, WNOHANG) == 0) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, NULL, 0);
        fail_msg("worker %d hung", (int)w->pid);
    }
    close(w->to);
    close(w->from);
}

/* With the daemon killed in between, a later client restarts it; its scan
 * reclaims what the dead left. */
static void next_client(void)
{
    worker w = worker_start();
    order(&w, 'c');
    worker_end(&w, false);
}

static void expect_clean(worker *ws, int n, bool daemon_killed)
{
    pid_t pids[WORKERS];
    for (int i = 0; i < n; i++)
        pids[i] = ws[i].pid;
    if (daemon_killed)
        next_client();
    if (!mgr_wait_clean(pids, n, MGR_GRACE + 1)) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "ls -l /dev/shm | grep mproc- >&2; tail -5 %s/%s >&2", mgr_dir,
                 MP__MGR_LOG);
        (void)!system(cmd);
        fail_msg("segments of the test left in /dev/shm after grace + 1 s");
    }
}

static void phase_after_create(bool all, bool kill_daemon)
{
    worker w[2] = {worker_start(), worker_start()};
    order(&w[0], 'c');
    order(&w[0], 'c');
    order(&w[1], 'c');
    if (kill_daemon)
        mgr_kill_daemon();
    worker_end(&w[0], true);
    worker_end(&w[1], all);
    expect_clean(w, 2, kill_daemon);
}

static void phase_after_put(bool all, bool kill_daemon)
{
    worker w[2] = {worker_start(), worker_start()};
    order(&w[0], 'c');
    order(&w[0], 'p'); /* in the queue; the producer holds nothing now */
    if (kill_daemon)
        mgr_kill_daemon();
    worker_end(&w[0], true);
    if (!all)
        order(&w[1], 'g'); /* the consumer still gets it */
    worker_end(&w[1], all);
    expect_clean(w, 2, kill_daemon);
}

static void phase_after_get(bool all, bool kill_daemon)
{
    worker w[2] = {worker_start(), worker_start()};
    order(&w[0], 'c');
    order(&w[0], 'p');
    order(&w[1], 'g'); /* mapped by the consumer */
    if (kill_daemon)
        mgr_kill_daemon();
    worker_end(&w[1], true);
    worker_end(&w[0], all);
    expect_clean(w, 2, kill_daemon);
}

static void phase_exchange(bool all, bool kill_daemon)
{
    worker w[WORKERS];
    for (int i = 0; i < WORKERS; i++)
        w[i] = worker_start();
    for (int i = 0; i < WORKERS; i++)
        order(&w[i], 'e');
    mgr_sleep(0.15);
    if (kill_daemon)
        mgr_kill_daemon();
    mgr_sleep(0.05);
    worker_end(&w[1], true);
    for (int i = 0; i < WORKERS; i++)
        if (i != 1)
            worker_end(&w[i], all);
    expect_clean(w, WORKERS, kill_daemon);
}

/* A fresh queue per run: what killed producers left queued goes with it
 * (the test process must not get it: it would become a client). */
static void run(void (*phase)(bool all, bool kill_daemon), bool all, bool kill_daemon)
{
    assert_mp_ok(mp_queue_create(0, &q));
    phase(all, kill_daemon);
    mp_queue_release(q);
    q = NULL;
}

#define CASE(phase)                                                                      \
    static void test_##phase(void **state)                                               \
    {                                                                                    \
        run(phase_##phase, false, false);                                                \
        run(phase_##phase, true, false);                                                 \
    }                                                                                    \
    static void test_##phase##_daemon_killed(void **state)                               \
    {                                                                                    \
        run(phase_##phase, false, true);                                                 \
        run(phase_##phase, true, true);                                                  \
    }

CASE(after_create)
CASE(after_put)
CASE(after_get)
CASE(exchange)

int main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(test_##name, mp_test_setup, mp_test_teardown)
    const struct CMUnitTest tests[] = {
        T(after_create), T(after_create_daemon_killed), T(after_put), T(after_put_daemon_killed),
        T(after_get),    T(after_get_daemon_killed),    T(exchange),  T(exchange_daemon_killed),
    };
    int rc;
    mgr_test_env();
    if (mp_set_sharing_strategy("file_system") != 0) {
        fprintf(stderr, "chaos_test: %s\n", mp_last_error());
        return 1;
    }
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    mgr_test_cleanup();
    return rc;
}
