/* CUDA with the process layer: the fork guard (simulated CUDA start-up)
 * refuses the fork start method (processes and pool workers) and names
 * spawn and forkserver. In CUDA builds, on the fake device (installed before
 * mp_setup, so the spawned children use it too), with spawned children and
 * mp_queue: a CUDA tensor passed as an argument to a child that adds 1 in
 * place; a received tensor sent on to a third process; a consumer killed
 * while holding a tensor (its reference does not pin the memory); 1000
 * tensors through a queue with the pending list back to empty; a producer
 * whose exit warning reaches its log hook while the parent still holds its
 * tensor. */
#include "mp_test.h"
#include "cuda/cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MPROC_HAVE_CUDA
#include "cuda_helpers.h"
#include "fake_device.h"
#endif

static int teardown(void **state)
{
    mp__cuda_simulate_initialized(false);
#ifdef MPROC_HAVE_CUDA
    size_t pending = 9;
    assert_mp_ok(mp_cuda_ipc_collect(NULL));
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    assert_int_equal(mp__cuda_import_count(), 0);
#endif
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
        mp_child_error e = {.size = sizeof e};
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
    /* A pool's workers are processes too. */
    mp_pool_options po;
    mp_pool *pool = NULL;
    mp_pool_options_init(&po);
    po.start_method = "fork";
    assert_mp_err(mp_pool_create(1, &po, &pool), MP_ESTATE);
    assert_null(pool);
    assert_non_null(strstr(mp_last_error(), "CUDA"));
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

static mp_queue *arg_queue(mp_msg *args, size_t index)
{
    mp_queue *q = NULL;
    if (mp_msg_get_queue(args, index, &q) < 0)
        mp_raise("queue argument %zu: %s", index, mp_last_error());
    return q;
}

static mp_tensor *get_cuda(mp_queue *q, const char *who)
{
    mp_msg *m = NULL;
    mp_tensor *t = NULL;
    if (mp_queue_get(q, &m, 30) < 0 || mp_msg_get_cuda_tensor(m, 0, &t) < 0)
        mp_raise("%s: get: %s", who, mp_last_error());
    mp_msg_destroy(m);
    return t;
}

/* One CUDA tensor as a message on q. */
static int put_cuda(mp_queue *q, mp_tensor *t)
{
    mp_msg *m = NULL;
    int rc = mp_msg_create(&m);
    if (rc == 0 && (rc = mp_msg_add_cuda_tensor(m, "t", t)) == 0)
        rc = mp_queue_put(q, m, 30);
    mp_msg_destroy(m);
    return rc;
}

/* B: takes the tensor from A's queue and sends it on to C. The reference
 * of a message in flight belongs to its sender, so B stays until C has
 * taken it (the joinable queue's task_done). */
MP_ENTRY(t_relay)
{
    mp_queue *in = arg_queue(args, 0), *out = arg_queue(args, 1);
    mp_tensor *t = get_cuda(in, "relay");
    int count = 0;
    if (mp_tensor_cuda_share_count(t, &count) < 0 || count != 1)
        mp_raise("relay: count %d (%s)", count, mp_last_error());
    if (put_cuda(out, t) < 0)
        mp_raise("relay: put: %s", mp_last_error());
    mp_tensor_release(t); /* the message to C holds the allocation now */
    if (mp_queue_join(out, 30) < 0)
        mp_raise("relay: join: %s", mp_last_error());
    mp_queue_release(in);
    mp_queue_release(out);
    return 0;
}

/* C: the third process adds 1 in place to A's memory. */
MP_ENTRY(t_third)
{
    mp_queue *in = arg_queue(args, 0);
    mp_tensor *t = get_cuda(in, "third");
    int count = 0;
    if (mp_queue_task_done(in) < 0)
        mp_raise("third: task_done: %s", mp_last_error());
    if (mp_tensor_cuda_share_count(t, &count) < 0 || count < 1)
        mp_raise("third: count %d (%s)", count, mp_last_error());
    if (!values_are(t, 0, 1, 16))
        mp_raise("third: wrong values on arrival");
    add_one(t);
    mp_tensor_release(t);
    mp_queue_release(in);
    return 0;
}

/* Takes one tensor, says so, and waits to be killed while holding it. */
MP_ENTRY(t_holder)
{
    mp_queue *in = arg_queue(args, 0), *back = arg_queue(args, 1);
    mp_tensor *t = get_cuda(in, "holder");
    if (!values_are(t, 0, 1, 8))
        mp_raise("holder: wrong values on arrival");
    mp_msg *m = NULL;
    if (mp_msg_create(&m) < 0 || mp_queue_put(back, m, 30) < 0)
        mp_raise("holder: ack: %s", mp_last_error());
    mp_msg_destroy(m);
    for (;;)
        pause();
}

/* Takes and releases 1000 tensors, each filled with its index. */
MP_ENTRY(t_sink)
{
    mp_queue *in = arg_queue(args, 0);
    for (int i = 0; i < 1000; i++) {
        mp_tensor *t = get_cuda(in, "sink");
        if (!values_are(t, (float)i, 0, 4))
            mp_raise("sink: tensor %d has wrong values", i);
        mp_tensor_release(t);
    }
    mp_queue_release(in);
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
    /* Wait until the parent has mapped it (a tensor whose producer is gone
     * before it was received cannot be opened), then return holding t: the
     * runtime's exit path warns through the hook. */
    void *ack = NULL;
    size_t len = 0;
    if (mp_conn_recv_bytes(c, &ack, &len, 30) < 0)
        mp_raise("ack: %s", mp_last_error());
    free(ack);
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

/* A -> B -> C over two queues: C's write lands in A's memory, and A's count
 * covered every hop (zero once both are done). */
static void test_resend_third(void **state)
{
    mp_queue *ab = NULL, *bc = NULL;
    mp_msg *args = NULL;
    mp_process *b = NULL, *c = NULL;
    mp_tensor *d = iota_cuda(0, 2, 8);
    int count = -1;
    assert_non_null(d);
    assert_mp_ok(mp_queue_create(0, &ab));
    assert_mp_ok(mp_joinable_queue_create(0, &bc));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_queue(args, "in", ab));
    assert_mp_ok(mp_msg_add_queue(args, "out", bc));
    assert_mp_ok(start("spawn", "t_relay", args, &b));
    mp_msg_destroy(args);
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_queue(args, "in", bc));
    assert_mp_ok(start("spawn", "t_third", args, &c));
    mp_msg_destroy(args);
    assert_mp_ok(put_cuda(ab, d));
    join_ok(b);
    join_ok(c);
    assert_true(values_are(d, 1, 1, 16));
    assert_mp_ok(mp_tensor_cuda_share_count(d, &count));
    assert_int_equal(count, 0);
    int frees = fake->frees;
    mp_tensor_release(d);
    assert_int_equal(fake->frees, frees + 1); /* nobody holds it: freed at once */
    mp_queue_release(ab);
    mp_queue_release(bc);
}

/* A consumer killed while holding a tensor: its slot's reference is
 * reclaimed, so the producer's free is not held up. */
static void test_dead_consumer(void **state)
{
    mp_queue *to = NULL, *back = NULL;
    mp_msg *args = NULL, *ack = NULL;
    mp_process *p = NULL;
    mp_tensor *d = iota_cuda(0, 1, 8);
    int count = -1;
    size_t pending = 9;
    assert_non_null(d);
    assert_mp_ok(mp_queue_create(0, &to));
    assert_mp_ok(mp_queue_create(0, &back));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_queue(args, "in", to));
    assert_mp_ok(mp_msg_add_queue(args, "back", back));
    assert_mp_ok(start("spawn", "t_holder", args, &p));
    mp_msg_destroy(args);
    assert_mp_ok(put_cuda(to, d));
    assert_mp_ok(mp_queue_get(back, &ack, 30));
    mp_msg_destroy(ack);
    assert_mp_ok(mp_tensor_cuda_share_count(d, &count));
    assert_int_equal(count, 1);
    assert_mp_ok(mp_process_kill(p));
    assert_mp_ok(mp_process_join(p, 30));
    assert_false(mp_process_is_alive(p));
    assert_mp_ok(mp_process_destroy(p));
    assert_mp_ok(mp_tensor_cuda_share_count(d, &count));
    assert_int_equal(count, 0);
    int frees = fake->frees;
    mp_tensor_release(d);
    assert_int_equal(fake->frees, frees + 1);
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    mp_queue_release(to);
    mp_queue_release(back);
}

/* 1000 new allocations through a bounded queue, each released by the
 * producer right after the put (pending until the sink lets go), with the
 * pending list back to empty at the end and every allocation freed. */
static void test_thousand_queue(void **state)
{
    mp_queue *q = NULL;
    mp_msg *args = NULL;
    mp_process *p = NULL;
    mp_tensor *h = NULL;
    int64_t shape[1] = {4};
    size_t pending = 9;
    int mallocs = fake->mallocs, frees = fake->frees;
    assert_mp_ok(mp_queue_create(16, &q));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_queue(args, "in", q));
    assert_mp_ok(start("spawn", "t_sink", args, &p));
    mp_msg_destroy(args);
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &h));
    for (int i = 0; i < 1000; i++) {
        mp_tensor *d = NULL;
        for (int k = 0; k < 4; k++)
            ((float *)mp_tensor_data(h))[k] = (float)i;
        assert_mp_ok(mp_tensor_to_cuda(h, 0, &d));
        assert_mp_ok(put_cuda(q, d));
        mp_tensor_release(d);
    }
    mp_tensor_release(h);
    join_ok(p);
    assert_mp_ok(mp_cuda_ipc_collect(NULL));
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    assert_int_equal(fake->mallocs - mallocs, 1000);
    assert_int_equal(fake->frees - frees, 1000);
    mp_queue_release(q);
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
    assert_mp_ok(mp_conn_send_bytes(a, "k", 1, 5));
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
        cmocka_unit_test_setup_teardown(test_fork_guard, mp_test_setup, teardown),
#ifdef MPROC_HAVE_CUDA
        cmocka_unit_test_setup_teardown(test_tensor_argument, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_resend_third, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_consumer, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_thousand_queue, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_exit_warning, mp_test_setup, teardown),
#endif
    };
#ifdef MPROC_HAVE_CUDA
    /* Above mp_setup: spawned children run it too, before their arguments
     * (CUDA tensors among them) are decoded. */
    if (fake_device_install() < 0)
        return 1;
#endif
    if (mp_setup(&argc, &argv) != 0)
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
