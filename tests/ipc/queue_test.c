/* Queue, JoinableQueue, SimpleQueue in one process and across fork:
 * nowait/timeouts, maxsize, close semantics, task_done/join, convenience
 * calls, producer exiting before get, SIGKILL of a consumer mid-stream,
 * queues passed as attachments. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/ipc.h"
#include "mp_test.h"
#include "os/os.h"

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

static mp_msg *msg_u32(uint32_t v)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, &v, sizeof v));
    return m;
}

static uint32_t msg_value(const mp_msg *m)
{
    uint32_t v = 0;
    size_t len = 0;
    const void *p = mp_msg_payload(m, &len);
    assert_int_equal(len, sizeof v);
    memcpy(&v, p, sizeof v);
    return v;
}

static void put_u32(mp_queue *q, uint32_t v)
{
    mp_msg *m = msg_u32(v);
    assert_mp_ok(mp_queue_put(q, m, 5));
    mp_msg_destroy(m);
}

static uint32_t get_u32(mp_queue *q)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_queue_get(q, &m, 5));
    uint32_t v = msg_value(m);
    mp_msg_destroy(m);
    return v;
}

static void test_basics(void **state)
{
    mp_queue *q = NULL;
    mp_msg *m = msg_u32(1), *r = NULL;
    (void)state;
    assert_mp_err(mp_queue_create(0, NULL), MP_EINVAL);
    assert_mp_ok(mp_queue_create(2, &q));
    assert_int_equal(mp_queue_maxsize(q), 2);
    assert_true(mp_queue_empty(q));
    assert_mp_err(mp_queue_get_nowait(q, &r), MP_ETIMEDOUT);
    assert_mp_err(mp_queue_get(q, &r, 0.05), MP_ETIMEDOUT);
    assert_mp_err(mp_queue_put(q, NULL, 1), MP_EINVAL);
    assert_mp_ok(mp_queue_put_nowait(q, m));
    put_u32(q, 2);
    assert_true(mp_queue_full(q));
    assert_int_equal(mp_queue_qsize(q), 2);
    assert_mp_err(mp_queue_put_nowait(q, m), MP_ETIMEDOUT);
    assert_mp_err(mp_queue_put(q, m, 0.05), MP_ETIMEDOUT);
    assert_int_equal(get_u32(q), 1);
    assert_int_equal(get_u32(q), 2);
    assert_mp_err(mp_queue_task_done(q), MP_ESTATE);
    assert_mp_err(mp_queue_join(q, 0), MP_ESTATE);
    /* close: puts fail, gets drain then fail */
    put_u32(q, 3);
    assert_mp_ok(mp_queue_close(q));
    assert_mp_ok(mp_queue_close(q));
    assert_mp_err(mp_queue_put(q, m, 1), MP_ECLOSED);
    assert_int_equal(get_u32(q), 3);
    assert_mp_err(mp_queue_get(q, &r, -1), MP_ECLOSED);
    assert_mp_err(mp_queue_get_nowait(q, &r), MP_ECLOSED);
    mp_msg_destroy(m);
    mp_queue_release(q);
}

static void test_convenience(void **state)
{
    mp_queue *q = NULL;
    mp_tensor *t = NULL, *got = NULL, *ts[2];
    mp_msg *sd = NULL;
    int64_t shape[1] = {16};
    const char *names[2] = {"weight", "bias"};
    (void)state;
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_tensor_empty(MP_FLOAT64, 1, shape, &t));
    ((double *)mp_tensor_data(t))[3] = 2.5;
    assert_mp_ok(mp_queue_put_tensor(q, t, 1));
    assert_mp_ok(mp_queue_get_tensor(q, &got, 1));
    assert_true(mp_tensor_same_storage(got, t));
    assert_true(((double *)mp_tensor_data(got))[3] == 2.5);
    ts[0] = t;
    ts[1] = got;
    got = NULL;
    assert_mp_ok(mp_queue_put_state_dict(q, 2, names, ts, 1));
    assert_mp_err(mp_queue_get_tensor(q, &got, 1), MP_EPROTO);   /* two tensors: dropped */
    assert_null(got);
    assert_mp_ok(mp_queue_put_state_dict(q, 2, names, ts, 1));
    /* a bad state_dict is refused in the name of the call made */
    assert_mp_err(mp_queue_put_state_dict(q, 2, (const char *const[]){"w", "w"}, ts, 1),
                  MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_queue_put_state_dict: name \"w\" appears twice "
                        "(entries 0 and 1)");
    assert_mp_err(mp_queue_put_state_dict(q, 2, names, NULL, 1), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_queue_put_state_dict: tensors is NULL");
    assert_mp_ok(mp_queue_get_state_dict(q, &sd, 1));
    assert_mp_ok(mp_msg_find_tensor(sd, "bias", &got));
    assert_true(mp_tensor_same_storage(got, t));
    mp_tensor_release(got);
    mp_msg_destroy(sd);
    mp_tensor_release(ts[1]);
    mp_tensor_release(t);
    mp_queue_release(q);
}

static void test_joinable(void **state)
{
    mp_queue *q = NULL;
    pid_t pid;
    int status;
    (void)state;
    assert_mp_ok(mp_joinable_queue_create(0, &q));
    assert_true(mp_queue_is_joinable(q));
    assert_mp_ok(mp_queue_join(q, 0));
    for (uint32_t i = 0; i < 5; i++)
        put_u32(q, i);
    assert_mp_err(mp_queue_join(q, 0.05), MP_ETIMEDOUT);
    pid = fork();
    if (pid == 0) {
        for (int i = 0; i < 5; i++) {
            mp_msg *m = NULL;
            if (mp_queue_get(q, &m, 10) || mp_queue_task_done(q))
                _exit(1);
            mp_msg_destroy(m);
            usleep(2000);
        }
        _exit(0);
    }
    assert_mp_ok(mp_queue_join(q, 20));
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    assert_mp_err(mp_queue_task_done(q), MP_ESTATE);
    mp_queue_release(q);
}

static void test_simple_queue(void **state)
{
    mp_simple_queue *q = NULL;
    mp_msg *m = msg_u32(7), *r = NULL;
    (void)state;
    assert_mp_ok(mp_simple_queue_create(&q));
    assert_true(mp_simple_queue_empty(q));
    assert_mp_ok(mp_simple_queue_put(q, m));
    assert_false(mp_simple_queue_empty(q));
    assert_mp_ok(mp_simple_queue_get(q, &r));
    assert_int_equal(msg_value(r), 7);
    mp_msg_destroy(r);
    assert_mp_ok(mp_simple_queue_close(q));
    assert_mp_err(mp_simple_queue_put(q, m), MP_ECLOSED);
    assert_mp_err(mp_simple_queue_get(q, &r), MP_ECLOSED);
    mp_msg_destroy(m);
    mp_simple_queue_release(q);
}

/* A blocked get wakes with MP_ECLOSED when another process closes. */
static void test_close_wakes_getter(void **state)
{
    mp_queue *q = NULL;
    mp_msg *r = NULL;
    pid_t pid;
    int status;
    (void)state;
    assert_mp_ok(mp_queue_create(0, &q));
    pid = fork();
    if (pid == 0) {
        usleep(50000);
        _exit(mp_queue_close(q) ? 1 : 0);
    }
    assert_mp_err(mp_queue_get(q, &r, 20), MP_ECLOSED);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    mp_queue_release(q);
}

/* Every getter blocked on an empty queue wakes with MP_ECLOSED: the first
 * takes the end-of-stream marker, the others find the closed flag. */
static void test_close_wakes_every_getter(void **state)
{
    enum { N = 3 };
    mp_queue *q = NULL;
    pid_t pids[N];
    (void)state;
    assert_mp_ok(mp_queue_create(0, &q));
    for (int i = 0; i < N; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            mp_msg *r = NULL;
            _exit(mp_queue_get(q, &r, -1) == MP_ECLOSED ? 0 : 1);
        }
    }
    usleep(50000);
    assert_mp_ok(mp_queue_close(q));
    for (int i = 0; i < N; i++) {
        int status;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    mp_queue_release(q);
}

/* A producer blocked on maxsize wakes when another process takes a message,
 * and with MP_ECLOSED when another process closes the queue. */
static void test_maxsize_blocking(void **state)
{
    mp_queue *q = NULL;
    mp_msg *m = msg_u32(5);
    pid_t pid;
    int status;
    (void)state;
    assert_mp_ok(mp_queue_create(1, &q));
    assert_mp_ok(mp_queue_put(q, m, 1));
    pid = fork();
    if (pid == 0) {
        mp_msg *r = NULL;
        usleep(50000);
        if (mp_queue_get(q, &r, 5))
            _exit(1);
        mp_msg_destroy(r);
        usleep(50000);
        _exit(mp_queue_close(q) ? 2 : 0);
    }
    assert_mp_ok(mp_queue_put(q, m, 20));          /* woken by the get */
    assert_mp_err(mp_queue_put(q, m, 20), MP_ECLOSED);   /* woken by the close */
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    assert_int_equal(get_u32(q), 5);
    mp_msg_destroy(m);
    mp_queue_release(q);
}

/* A get that takes a message off the socket but cannot map it (mmap fails)
 * reports the error, drops the message, and frees its maxsize slot: the
 * queue is empty and takes a new put at once. */
static void test_get_fault_frees_slot(void **state)
{
    mp_queue *q = NULL;
    mp_msg *m = NULL;
    mp_tensor *t = NULL;
    pid_t pid;
    int status;
    (void)state;
    assert_mp_ok(mp_set_sharing_strategy("file_descriptor"));
    assert_mp_ok(mp_queue_create(1, &q));
    pid = fork();
    if (pid == 0) {   /* a segment the parent has never mapped */
        int64_t shape[1] = {16};
        mp_tensor *x = NULL;
        if (mp_tensor_empty(MP_INT32, 1, shape, &x) || mp_queue_put_tensor(q, x, 5))
            _exit(1);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    assert_int_equal(mp_queue_qsize(q), 1);
    assert_mp_ok(mp__sys_fault("mmap", ENOMEM, 0, 1));
    assert_mp_err(mp_queue_get_tensor(q, &t, 5), MP_ENOMEM);
    mp__sys_fault_reset();
    assert_null(t);
    assert_int_equal(mp_queue_qsize(q), 0);
    assert_true(mp_queue_empty(q));
    m = msg_u32(9);
    assert_mp_ok(mp_queue_put_nowait(q, m));
    assert_int_equal(get_u32(q), 9);
    mp_msg_destroy(m);
    mp_queue_release(q);
}

/* The producer puts a tensor and exits (or is SIGKILLed); the message is
 * still whole. */
static void producer_gone(const char *strategy, bool kill_self)
{
    mp_queue *q = NULL;
    mp_tensor *t = NULL;
    pid_t pid;
    int status;
    assert_mp_ok(mp_set_sharing_strategy(strategy));
    assert_mp_ok(mp_queue_create(0, &q));
    pid = fork();
    if (pid == 0) {
        int64_t shape[1] = {1024};
        mp_tensor *x = NULL;
        if (mp_tensor_empty(MP_INT32, 1, shape, &x))
            _exit(1);
        for (int i = 0; i < 1024; i++)
            ((int32_t *)mp_tensor_data(x))[i] = i * 3;
        if (mp_queue_put_tensor(q, x, 5))
            _exit(2);
        if (kill_self)
            raise(SIGKILL);   /* no exit handlers, no cleanup of any kind */
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (kill_self)
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    else
        assert_int_equal(status, 0);
    assert_mp_ok(mp_queue_get_tensor(q, &t, 5));
    for (int i = 0; i < 1024; i++)
        assert_int_equal(((int32_t *)mp_tensor_data(t))[i], i * 3);
    mp_tensor_release(t);
    mp_queue_release(q);
}

static void test_producer_exits(void **state)
{
    (void)state;
    producer_gone("file_descriptor", false);
    producer_gone("file_descriptor", true);
    producer_gone("file_system", false);
    producer_gone("file_system", true);
    mp_set_sharing_strategy("file_descriptor");
}

/* A consumer SIGKILLed while it holds the reader lock (blocked in get) does
 * not stop the others. */
static void test_consumer_killed(void **state)
{
    mp_queue *q = NULL;
    int p[2], status;
    char c;
    pid_t victim, other;
    (void)state;
    assert_mp_ok(mp_queue_create(0, &q));
    assert_int_equal(pipe(p), 0);
    for (uint32_t i = 0; i < 10; i++)
        put_u32(q, i);
    victim = fork();
    if (victim == 0) {
        mp_msg *m = NULL;
        for (int i = 0; i < 10; i++) {
            if (mp_queue_get(q, &m, 5))
                _exit(1);
            mp_msg_destroy(m);
        }
        if (write(p[1], "k", 1) != 1)
            _exit(2);
        mp_queue_get(q, &m, -1);   /* blocks holding the reader lock */
        _exit(3);
    }
    assert_int_equal(read(p[0], &c, 1), 1);
    usleep(20000);
    kill(victim, SIGKILL);
    assert_int_equal(waitpid(victim, &status, 0), victim);
    assert_true(WIFSIGNALED(status));
    other = fork();
    if (other == 0) {
        for (uint32_t i = 100; i < 200; i++) {
            mp_msg *m = NULL;
            if (mp_queue_get(q, &m, 10) || msg_value(m) != i)
                _exit(1);
            mp_msg_destroy(m);
        }
        _exit(0);
    }
    for (uint32_t i = 100; i < 200; i++)
        put_u32(q, i);
    assert_int_equal(waitpid(other, &status, 0), other);
    assert_int_equal(status, 0);
    close(p[0]);
    close(p[1]);
    mp_queue_release(q);
}

/* A consumer SIGKILLed while messages stream: the other consumer goes on,
 * nothing is received twice, and at most the one message the victim had
 * taken but not yet recorded is missing. */
static void test_consumer_killed_streaming(void **state)
{
    enum { N = 4000 };
    _Atomic uint8_t *seen = mmap(NULL, N, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                                 -1, 0);
    mp_queue *q = NULL;
    pid_t victim, other;
    int status, missing = 0;
    (void)state;
    assert_true(seen != MAP_FAILED);
    assert_mp_ok(mp_queue_create(64, &q));
    for (int c = 0; c < 2; c++) {
        pid_t pid = fork();
        if (pid == 0) {
            for (;;) {
                mp_msg *m = NULL;
                int rc = mp_queue_get(q, &m, 20);
                if (rc == MP_ECLOSED)
                    _exit(0);
                if (rc)
                    _exit(1);
                uint32_t v = msg_value(m);
                mp_msg_destroy(m);
                if (v >= N)
                    _exit(2);
                atomic_fetch_add(&seen[v], 1);
                if (c == 0)
                    usleep(100);   /* the victim is slow, so it is caught mid-stream */
            }
        }
        if (c == 0)
            victim = pid;
        else
            other = pid;
    }
    for (uint32_t i = 0; i < N; i++) {
        put_u32(q, i);
        if (i == N / 4)
            kill(victim, SIGKILL);
    }
    assert_int_equal(waitpid(victim, &status, 0), victim);
    assert_true(WIFSIGNALED(status));
    assert_mp_ok(mp_queue_close(q));
    assert_int_equal(waitpid(other, &status, 0), other);
    assert_int_equal(status, 0);
    for (int i = 0; i < N; i++) {
        if (seen[i] > 1)
            fail_msg("message %d received %u times", i, (unsigned)seen[i]);
        missing += seen[i] == 0;
    }
    assert_true(missing <= 1);
    munmap((void *)seen, N);
    mp_queue_release(q);
}

/* Queues as attachments: a joinable queue and a simple queue travel over a
 * plain queue to a forked child that uses them. */
static void test_queue_attachment(void **state)
{
    mp_queue *carrier = NULL, *jq = NULL;
    mp_simple_queue *sq = NULL;
    mp_msg *m = NULL, *r = NULL;
    pid_t pid;
    int status;
    (void)state;
    assert_mp_ok(mp_queue_create(0, &carrier));
    assert_mp_ok(mp_joinable_queue_create(4, &jq));
    assert_mp_ok(mp_simple_queue_create(&sq));
    pid = fork();
    if (pid == 0) {
        mp_msg *in = NULL, *one = msg_u32(42);
        mp_queue *j = NULL;
        mp_simple_queue *s = NULL;
        if (mp_queue_get(carrier, &in, 10) || mp_msg_get_queue(in, 0, &j) ||
            mp_msg_get_simple_queue(in, 1, &s) || !mp_queue_is_joinable(j) ||
            mp_queue_maxsize(j) != 4 || mp_queue_put(j, one, 5) || mp_simple_queue_put(s, one))
            _exit(1);
        mp_msg_destroy(one);
        mp_msg_destroy(in);
        mp_queue_release(j);
        mp_simple_queue_release(s);
        _exit(0);
    }
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_queue(m, "jobs", jq));
    assert_mp_ok(mp_msg_add_simple_queue(m, "done", sq));
    assert_int_equal(mp_msg_kind(m, 0), MP_ATTACH_JOINABLE_QUEUE);
    assert_mp_ok(mp_queue_put(carrier, m, 5));
    assert_int_equal(get_u32(jq), 42);
    assert_mp_ok(mp_queue_task_done(jq));
    assert_mp_ok(mp_queue_join(jq, 5));
    assert_mp_ok(mp_simple_queue_get(sq, &r));
    assert_int_equal(msg_value(r), 42);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    mp_msg_destroy(r);
    mp_msg_destroy(m);
    mp_queue_release(carrier);
    mp_queue_release(jq);
    mp_simple_queue_release(sq);
}

/* A queue whose control block another mproc build laid out (another
 * version) is refused when it arrives, with a sentence that says so, and
 * nothing of it stays open. */
static void test_attachment_of_another_build(void **state)
{
    mp_queue *carrier = NULL, *q = NULL;
    mp__qctl *ctl;
    mp_msg *m = NULL, *r = NULL;
    (void)state;
    assert_mp_ok(mp_queue_create(0, &carrier));
    assert_mp_ok(mp_queue_create(0, &q));
    ctl = ((mp__queue *)q)->ctl; /* shared: the receiving side reads this block */
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_queue(m, "q", q));
    ctl->version = MP__QCTL_VERSION - 1;
    assert_mp_ok(mp_queue_put(carrier, m, 5));
    assert_mp_err(mp_queue_get(carrier, &r, 5), MP_EPROTO);
    assert_null(r);
    if (!strstr(mp_last_error(), "another layout") ||
        !strstr(mp_last_error(), "the same mproc build"))
        fail_msg("unexpected sentence: %s", mp_last_error());
    ctl->version = MP__QCTL_VERSION;
    mp_msg_destroy(m);
    mp_queue_release(q);
    mp_queue_release(carrier);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_basics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_convenience, setup, teardown),
        cmocka_unit_test_setup_teardown(test_joinable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_simple_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_wakes_getter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_wakes_every_getter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maxsize_blocking, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_fault_frees_slot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_exits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_consumer_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_consumer_killed_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_attachment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attachment_of_another_build, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
