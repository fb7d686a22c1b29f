/* Queues, connections and tensors passed to children as attachments of the
 * argument message under every start method (fork, spawn, forkserver). */
#include <string.h>
#include <stdlib.h>

#include "mp_test.h"

MP_ENTRY(attach_child)
{
    mp_queue *q = NULL;
    mp_conn *c = NULL;
    mp_simple_queue *sq = NULL;
    mp_tensor *t = NULL;
    mp_msg *in = NULL;
    int rc;
    (void)rank;
    if ((rc = mp_msg_get_queue(args, 0, &q)) || (rc = mp_msg_get_conn(args, 1, &c)) ||
        (rc = mp_msg_get_simple_queue(args, 2, &sq)) || (rc = mp_msg_find_tensor(args, "t", &t)))
        mp_raise("attachments: %s", mp_last_error());
    ((float *)mp_tensor_data(t))[0] += 1.0f;             /* shared with the parent */
    if ((rc = mp_queue_put_tensor(q, t, 10)) || (rc = mp_simple_queue_get(sq, &in)) ||
        (rc = mp_conn_send(c, in, 10)))
        mp_raise("messaging: %s", mp_last_error());
    mp_msg_destroy(in);
    mp_tensor_release(t);
    mp_queue_release(q);
    mp_conn_release(c);
    mp_simple_queue_release(sq);
    return 0;
}

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

static void run_method(const char *method)
{
    mp_queue *q = NULL;
    mp_conn *r = NULL, *w = NULL;
    mp_simple_queue *sq = NULL;
    mp_tensor *t = NULL, *back = NULL;
    mp_msg *args = NULL, *hello = NULL, *got = NULL;
    mp_process *p = NULL;
    mp_process_options opts;
    int64_t shape[1] = {32};
    int code = -1;
    size_t len = 0;
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_pipe(false, &r, &w));
    assert_mp_ok(mp_simple_queue_create(&sq));
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &t));
    ((float *)mp_tensor_data(t))[0] = 41.0f;
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_queue(args, "q", q));
    assert_mp_ok(mp_msg_add_conn(args, "w", w));
    assert_mp_ok(mp_msg_add_simple_queue(args, "sq", sq));
    assert_mp_ok(mp_msg_add_tensor(args, "t", t));
    mp_process_options_init(&opts);
    opts.start_method = method;
    assert_mp_ok(mp_process_create("attach_child", args, &opts, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_msg_create(&hello));
    assert_mp_ok(mp_msg_set_payload(hello, "hello", 5));
    assert_mp_ok(mp_simple_queue_put(sq, hello));
    assert_mp_ok(mp_queue_get_tensor(q, &back, 20));
    assert_true(mp_tensor_same_storage(back, t));
    assert_true(((float *)mp_tensor_data(t))[0] == 42.0f);
    assert_mp_ok(mp_conn_recv(r, &got, 20));
    assert_memory_equal(mp_msg_payload(got, &len), "hello", 5);
    assert_mp_ok(mp_process_join(p, 20));
    assert_mp_ok(mp_process_exitcode(p, &code));
    assert_int_equal(code, 0);
    mp_process_destroy(p);
    mp_msg_destroy(got);
    mp_msg_destroy(hello);
    mp_msg_destroy(args);
    mp_tensor_release(back);
    mp_tensor_release(t);
    mp_queue_release(q);
    mp_conn_release(r);
    mp_conn_release(w);
    mp_simple_queue_release(sq);
}

static void test_fork(void **state) { (void)state; run_method("fork"); }
static void test_spawn(void **state) { (void)state; run_method("spawn"); }
static void test_forkserver(void **state)
{
    (void)state;
    run_method("forkserver");
    assert_mp_ok(mp_forkserver_stop());   /* the server is our child */
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spawn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forkserver, setup, teardown),
    };
    int rc;
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    mp_forkserver_stop();
    return rc;
}
