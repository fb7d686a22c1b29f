/* The rows of blocking_calls.h: per call, its setup, the call, and what
 * makes it ready. */
#include "blocking_calls.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static mp_msg *one_byte(void) { return mp_test_payload_msg("x", 1); }

static mp_msg *with_event(mp_event *e)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_event(m, "go", e));
    return m;
}

/* A child (process or spawn) and a pool task that wait for the event. */
MP_ENTRY(timeout_wait_event)
{
    mp_event *e = NULL;
    int rc = mp_msg_get_event(args, 0, &e);
    if (!rc)
        rc = mp_event_wait(e, 60);
    mp_event_release(e);
    return rc ? 1 : 0;
}

MP_TASK(timeout_task)
{
    mp_event *e = NULL;
    int rc = mp_msg_get_event(in, 0, &e);
    if (!rc)
        rc = mp_event_wait(e, 60);
    mp_event_release(e);
    return rc ? rc : mp_msg_set_payload(out, "ok", 2);
}

/* ---- queues and pipes ---------------------------------------------------- */

static void r_put(fx *f)
{
    mp_msg *m = one_byte();
    assert_mp_ok(mp_queue_put(f->q, m, -1));
    mp_msg_destroy(m);
}

static void r_get(fx *f)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_queue_get(f->q, &m, 10));
    mp_msg_destroy(m);
}

static void s_queue(fx *f) { assert_mp_ok(mp_queue_create(0, &f->q)); }
static void s_queue_full(fx *f)
{
    assert_mp_ok(mp_queue_create(1, &f->q));
    r_put(f);
}
static void s_joinable(fx *f)
{
    assert_mp_ok(mp_joinable_queue_create(0, &f->q));
    r_put(f);
    r_get(f); /* taken, not task_done: join must wait */
}
static void s_simple(fx *f) { assert_mp_ok(mp_simple_queue_create(&f->sq)); }
static void s_pipe(fx *f) { assert_mp_ok(mp_pipe(true, &f->a, &f->b)); }

static int c_queue_get(fx *f, double t)
{
    mp_msg *m = NULL;
    int rc = mp_queue_get(f->q, &m, t);
    mp_msg_destroy(m);
    return rc;
}
static int c_queue_put(fx *f, double t)
{
    mp_msg *m = one_byte();
    int rc = mp_queue_put(f->q, m, t);
    mp_msg_destroy(m);
    return rc;
}
static int c_queue_get_nowait(fx *f, double t)
{
    mp_msg *m = NULL;
    int rc = t == 0 ? mp_queue_get_nowait(f->q, &m) : mp_queue_get(f->q, &m, t);
    mp_msg_destroy(m);
    return rc;
}
static int c_join(fx *f, double t) { return mp_queue_join(f->q, t); }
static int c_simple_get(fx *f, double t)
{
    mp_msg *m = NULL;
    int rc = mp_simple_queue_get(f->sq, &m);
    mp_msg_destroy(m);
    return rc;
}
static int c_recv(fx *f, double t)
{
    mp_msg *m = NULL;
    int rc = mp_conn_recv(f->b, &m, t);
    mp_msg_destroy(m);
    return rc;
}
static int c_recv_bytes(fx *f, double t)
{
    void *buf = NULL;
    size_t len = 0;
    int rc = mp_conn_recv_bytes(f->b, &buf, &len, t);
    free(buf);
    return rc;
}
static int c_wait(fx *f, double t)
{
    mp_wait_item it = {.kind = MP_WAIT_CONN, .u.conn = f->b};
    int rc = mp_wait(&it, 1, t);
    return rc == 1 && it.ready ? 0 : rc;
}
static int c_get_tensor(fx *f, double t)
{
    mp_tensor *x = NULL;
    int rc = mp_queue_get_tensor(f->q, &x, t);
    mp_tensor_release(x);
    return rc;
}
/* A pipe whose socket buffer is full: one more send must wait. */
static mp_msg *four_k(void)
{
    static char page[4096];
    return mp_test_payload_msg(page, sizeof page);
}
static void s_pipe_full(fx *f)
{
    mp_msg *m = four_k();
    int rc, n = 0;
    assert_mp_ok(mp_pipe(true, &f->a, &f->b));
    while ((rc = mp_conn_send(f->a, m, 0)) == 0 && n < 100000)
        n++;
    assert_int_equal(rc, MP_ETIMEDOUT);
    mp_msg_destroy(m);
}
static int c_send(fx *f, double t)
{
    mp_msg *m = four_k();
    int rc = mp_conn_send(f->a, m, t);
    mp_msg_destroy(m);
    return rc;
}
static int c_poll(fx *f, double t)
{
    /* the query answers 1 (ready) or 0 (not ready), as documented: map
     * them to the table's 0 and POLL_NOT_READY */
    int rc = mp_conn_poll(f->b, t);
    return rc == 1 ? 0 : rc == 0 ? POLL_NOT_READY : rc;
}

static void r_task_done(fx *f) { assert_mp_ok(mp_queue_task_done(f->q)); }
static void r_simple_put(fx *f)
{
    mp_msg *m = one_byte();
    assert_mp_ok(mp_simple_queue_put(f->sq, m));
    mp_msg_destroy(m);
}
static void r_send(fx *f)
{
    mp_msg *m = one_byte();
    assert_mp_ok(mp_conn_send(f->a, m, -1));
    mp_msg_destroy(m);
}
static void r_drain(fx *f)
{
    mp_msg *m = NULL;
    while (mp_conn_recv(f->b, &m, 0) == 0)
        mp_msg_destroy(m);
}
static void r_put_tensor(fx *f)
{
    int64_t n = 4;
    mp_tensor *x = NULL;
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, &n, &x));
    assert_mp_ok(mp_queue_put_tensor(f->q, x, -1));
    mp_tensor_release(x);
}

/* ---- sync objects -------------------------------------------------------- */

/* sem_wait, which a signal handler interrupts (timeout_test sends the
 * waiting thread one every millisecond). */
static void sem_wait_through_signals(sem_t *s)
{
    while (sem_wait(s) != 0)
        assert_int_equal(errno, EINTR);
}

/* Lock, RLock and a Condition's lock are owned by a thread: a holder
 * thread takes one and gives it back when told. */
static void *holder_main(void *arg)
{
    fx *f = arg;
    int rc = f->lock    ? mp_lock_lock(f->lock, -1)
             : f->rlock ? mp_rlock_lock(f->rlock, -1)
                        : mp_condition_lock(f->cond, -1);
    sem_post(&f->held);
    sem_wait_through_signals(&f->go);
    if (!rc)
        rc = f->lock    ? mp_lock_unlock(f->lock)
             : f->rlock ? mp_rlock_unlock(f->rlock)
                        : mp_condition_unlock(f->cond);
    return (void *)(intptr_t)rc;
}
static void start_holder(fx *f)
{
    assert_int_equal(pthread_create(&f->holder, NULL, holder_main, f), 0);
    f->has_holder = true;
    sem_wait_through_signals(&f->held);
}
static void s_lock(fx *f)
{
    assert_mp_ok(mp_lock_create(&f->lock));
    start_holder(f);
}
static void s_rlock(fx *f)
{
    assert_mp_ok(mp_rlock_create(&f->rlock));
    start_holder(f);
}
static void s_sem(fx *f) { assert_mp_ok(mp_semaphore_create(0, &f->sem)); }
static void s_event(fx *f) { assert_mp_ok(mp_event_create(&f->ev)); }
static void s_cond(fx *f) { assert_mp_ok(mp_condition_create(&f->cond)); }
static void s_cond_held(fx *f)
{
    s_cond(f);
    start_holder(f);
}
static void s_barrier(fx *f) { assert_mp_ok(mp_barrier_create(2, &f->bar)); }

static int c_lock(fx *f, double t)
{
    int rc = mp_lock_lock(f->lock, t);
    if (!rc)
        assert_mp_ok(mp_lock_unlock(f->lock));
    return rc;
}
static int c_rlock(fx *f, double t)
{
    int rc = mp_rlock_lock(f->rlock, t);
    if (!rc)
        assert_mp_ok(mp_rlock_unlock(f->rlock));
    return rc;
}
static int c_sem(fx *f, double t)
{
    int rc = mp_semaphore_wait(f->sem, t);
    if (!rc)
        assert_mp_ok(mp_semaphore_post(f->sem));
    return rc;
}
static int c_event(fx *f, double t) { return mp_event_wait(f->ev, t); }
static bool flag_set(void *arg) { return __atomic_load_n((int *)arg, __ATOMIC_SEQ_CST) != 0; }
static int c_cond(fx *f, double t)
{
    assert_mp_ok(mp_condition_lock(f->cond, -1));
    int rc = mp_condition_wait_for(f->cond, flag_set, &f->flag, t);
    assert_mp_ok(mp_condition_unlock(f->cond));
    return rc;
}
static int c_barrier(fx *f, double t) { return mp_barrier_wait(f->bar, t, NULL); }
static int c_cond_lock(fx *f, double t)
{
    int rc = mp_condition_lock(f->cond, t);
    if (rc == 0)
        assert_mp_ok(mp_condition_unlock(f->cond));
    return rc;
}

static void r_holder(fx *f) { sem_post(&f->go); }
static void r_sem(fx *f) { assert_mp_ok(mp_semaphore_post(f->sem)); }
static void r_event(fx *f) { assert_mp_ok(mp_event_set(f->ev)); }
static void r_cond(fx *f)
{
    assert_mp_ok(mp_condition_lock(f->cond, -1));
    __atomic_store_n(&f->flag, 1, __ATOMIC_SEQ_CST);
    assert_mp_ok(mp_condition_notify_all(f->cond));
    assert_mp_ok(mp_condition_unlock(f->cond));
}
static void r_barrier(fx *f)
{
    /* the second party; after a timeout the barrier is broken, which is
     * that call's documented effect */
    int rc = mp_barrier_wait(f->bar, 10, NULL);
    assert_true(rc == 0 || rc == MP_EBROKEN);
}

/* ---- processes and pool results ------------------------------------------ */

static void s_process(fx *f)
{
    assert_mp_ok(mp_event_create(&f->ev));
    mp_msg *args = with_event(f->ev);
    assert_mp_ok(mp_process_create("timeout_wait_event", args, NULL, &f->proc));
    assert_mp_ok(mp_process_start(f->proc));
    mp_msg_destroy(args);
}
static void s_spawn(fx *f)
{
    assert_mp_ok(mp_event_create(&f->ev));
    mp_msg *args = with_event(f->ev);
    assert_mp_ok(mp_spawn("timeout_wait_event", args, 1, false, false, NULL, &f->ctx));
    mp_msg_destroy(args);
}
static void s_pool(fx *f)
{
    assert_mp_ok(mp_event_create(&f->ev));
    mp_msg *in = with_event(f->ev);
    assert_mp_ok(mp_pool_create(1, NULL, &f->pool));
    assert_mp_ok(mp_pool_apply_async(f->pool, "timeout_task", in, NULL, &f->res));
    mp_msg_destroy(in);
}
static void s_imap(fx *f)
{
    assert_mp_ok(mp_event_create(&f->ev));
    mp_msg *in = with_event(f->ev);
    const mp_msg *ins[1] = {in};
    assert_mp_ok(mp_pool_create(1, NULL, &f->pool));
    assert_mp_ok(mp_pool_imap(f->pool, "timeout_task", ins, 1, 1, &f->it));
    mp_msg_destroy(in);
}

static int c_process(fx *f, double t) { return mp_process_join(f->proc, t); }
static int c_spawn(fx *f, double t) { return mp_spawn_context_join(f->ctx, t); }
static int c_result_wait(fx *f, double t) { return mp_async_result_wait(f->res, t); }
static int c_result_get(fx *f, double t) { return mp_async_result_get(f->res, t, NULL); }
static int c_imap(fx *f, double t)
{
    mp_msg *m = NULL;
    int rc = mp_imap_next(f->it, t, &m, NULL);
    mp_msg_destroy(m);
    return rc;
}

const row blocking_calls[] = {
    {"queue get (empty)", s_queue, c_queue_get, r_put, MP_ETIMEDOUT, TIMED},
    {"queue get_nowait / get", s_queue, c_queue_get_nowait, r_put, MP_ETIMEDOUT, TIMED},
    {"queue put (full)", s_queue_full, c_queue_put, r_get, MP_ETIMEDOUT, TIMED},
    {"joinable queue join", s_joinable, c_join, r_task_done, MP_ETIMEDOUT, TIMED},
    {"simple queue get", s_simple, c_simple_get, r_simple_put, MP_ETIMEDOUT, FOREVER_ONLY},
    {"conn recv", s_pipe, c_recv, r_send, MP_ETIMEDOUT, TIMED},
    {"conn poll", s_pipe, c_poll, r_send, POLL_NOT_READY, TIMED},
    {"conn recv_bytes", s_pipe, c_recv_bytes, r_send, MP_ETIMEDOUT, TIMED},
    {"conn send (full)", s_pipe_full, c_send, r_drain, MP_ETIMEDOUT, TIMED},
    {"wait (a conn)", s_pipe, c_wait, r_send, MP_ETIMEDOUT, TIMED},
    {"queue get_tensor", s_queue, c_get_tensor, r_put_tensor, MP_ETIMEDOUT, TIMED},
    {"lock lock", s_lock, c_lock, r_holder, MP_ETIMEDOUT, TIMED},
    {"rlock lock", s_rlock, c_rlock, r_holder, MP_ETIMEDOUT, TIMED},
    {"semaphore wait", s_sem, c_sem, r_sem, MP_ETIMEDOUT, TIMED},
    {"event wait", s_event, c_event, r_event, MP_ETIMEDOUT, TIMED},
    {"condition lock", s_cond_held, c_cond_lock, r_holder, MP_ETIMEDOUT, TIMED},
    {"condition wait", s_cond, c_cond, r_cond, MP_ETIMEDOUT, TIMED},
    {"barrier wait", s_barrier, c_barrier, r_barrier, MP_ETIMEDOUT, TIMED_NAN_DEFAULT},
    {"process join", s_process, c_process, r_event, MP_ETIMEDOUT, TIMED},
    {"spawn join", s_spawn, c_spawn, r_event, MP_ETIMEDOUT, TIMED},
    {"pool result wait", s_pool, c_result_wait, r_event, MP_ETIMEDOUT, TIMED},
    {"pool result get", s_pool, c_result_get, r_event, MP_ETIMEDOUT, TIMED},
    {"pool imap next", s_imap, c_imap, r_event, MP_ETIMEDOUT, TIMED},
};
const size_t blocking_calls_n = sizeof blocking_calls / sizeof blocking_calls[0];

void teardown_fx(fx *f)
{
    if (f->has_holder) {
        void *ret;
        pthread_join(f->holder, &ret);
        assert_int_equal((int)(intptr_t)ret, 0);
    }
    if (f->proc) {
        assert_mp_ok(mp_process_join(f->proc, 30));
        assert_mp_ok(mp_process_destroy(f->proc));
    }
    if (f->ctx) {
        assert_mp_ok(mp_spawn_context_join(f->ctx, 30));
        mp_spawn_context_destroy(f->ctx);
    }
    if (f->res)
        assert_mp_ok(mp_async_result_wait(f->res, 30));
    mp_async_result_release(f->res);
    mp_imap_destroy(f->it);
    mp_pool_destroy(f->pool);
    mp_queue_release(f->q);
    mp_simple_queue_release(f->sq);
    mp_conn_release(f->a);
    mp_conn_release(f->b);
    mp_lock_release(f->lock);
    mp_rlock_release(f->rlock);
    mp_semaphore_release(f->sem);
    mp_event_release(f->ev);
    mp_condition_release(f->cond);
    mp_barrier_release(f->bar);
    sem_destroy(&f->held);
    sem_destroy(&f->go);
}

void setup_fx(fx *f, const row *r)
{
    memset(f, 0, sizeof *f);
    sem_init(&f->held, 0, 0);
    sem_init(&f->go, 0, 0);
    r->setup(f);
}
