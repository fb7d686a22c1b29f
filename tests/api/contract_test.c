/* The API's common contract, checked across areas: predicates share one
 * type (bool, false for NULL), "list all names" calls share one shape (a
 * static NULL-terminated list, the default first), a NaN timeout is refused
 * before a call acts. */
#include "mp_test.h"
#include "os/os.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

MP_ENTRY(contract_exit3)
{
    return 3;
}

MP_TASK(contract_echo)
{
    size_t len;
    const void *p = mp_msg_payload(in, &len);
    return mp_msg_set_payload(out, p, len);
}

static void test_predicates_are_bool(void **state)
{
    /* one type: each of these is a bool, and NULL is simply false */
    _Static_assert(__builtin_types_compatible_p(__typeof__(mp_lock_locked(NULL)), bool), "");
    _Static_assert(__builtin_types_compatible_p(__typeof__(mp_event_is_set(NULL)), bool), "");
    _Static_assert(__builtin_types_compatible_p(__typeof__(mp_barrier_broken(NULL)), bool), "");
    _Static_assert(__builtin_types_compatible_p(__typeof__(mp_async_result_ready(NULL)), bool),
                   "");
    _Static_assert(__builtin_types_compatible_p(__typeof__(mp_queue_empty(NULL)), bool), "");
    _Static_assert(__builtin_types_compatible_p(__typeof__(mp_process_is_alive(NULL)), bool),
                   "");
    _Static_assert(__builtin_types_compatible_p(__typeof__(mp_tensor_is_shared(NULL)), bool),
                   "");
    assert_false(mp_lock_locked(NULL));
    assert_non_null(strstr(mp_last_error(), "mp_lock_locked"));
    assert_false(mp_event_is_set(NULL));
    assert_false(mp_barrier_broken(NULL));
    assert_false(mp_async_result_ready(NULL));

    mp_event *e = NULL;
    assert_mp_ok(mp_event_create(&e));
    assert_false(mp_event_is_set(e));
    assert_mp_ok(mp_event_set(e));
    assert_true(mp_event_is_set(e));
    mp_event_release(e);
}

static void test_name_lists(void **state)
{
    const char *const *lists[] = {mp_get_all_start_methods(), mp_get_all_sharing_strategies()};
    const char *defaults[] = {"fork", "file_descriptor"};
    for (size_t i = 0; i < 2; i++) {
        size_t n = 0;
        assert_non_null(lists[i]);
        while (lists[i][n])
            n++;
        assert_true(n >= 1);
        assert_string_equal(lists[i][0], defaults[i]);
    }
    assert_string_equal(mp_get_all_sharing_strategies()[1], "file_system");
}

/* The one helper every options struct goes through. */
static void test_struct_in_rule(void **state)
{
    /* v2 grew v1 past v1's sizeof (never into its tail padding) */
    struct v1 { size_t size; int a; } old;
    struct v2 { size_t size; int a; int pad; long b; long c; } cur;
    memset(&old, 0xee, sizeof old); /* padding of an old struct may hold anything */
    old.size = sizeof old;
    old.a = 7;
    struct v3 { size_t size; int a; int pad; long b; long c; long d; } big = {
        sizeof big, 1, 0, 2, 3, 0};
    /* older, smaller: the tail is zero-filled */
    memset(&cur, 0xff, sizeof cur);
    assert_mp_ok(mp__struct_in(&cur, sizeof cur, &old, "t", "struct v2"));
    assert_int_equal(cur.size, sizeof cur);
    assert_int_equal(cur.a, 7);
    assert_int_equal(cur.b, 0);
    assert_int_equal(cur.c, 0);
    /* newer, larger, unknown tail zero: accepted */
    assert_mp_ok(mp__struct_in(&cur, sizeof cur, &big, "t", "struct v2"));
    assert_int_equal(cur.b, 2);
    assert_int_equal(cur.c, 3);
    /* newer, larger, a field we do not know is set: refused, naming it */
    big.d = 5;
    assert_mp_err(mp__struct_in(&cur, sizeof cur, &big, "t", "struct v2"), MP_ENOTSUP);
    assert_non_null(strstr(mp_last_error(), "struct v2"));
    /* not initialized */
    old.size = 0;
    assert_mp_err(mp__struct_in(&cur, sizeof cur, &old, "t", "struct v2"), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "sizeof(struct v2)"));
    old.size = 1u << 20;
    assert_mp_err(mp__struct_in(&cur, sizeof cur, &old, "t", "struct v2"), MP_EINVAL);
}

static void test_process_options_sizes(void **state)
{
    struct {
        mp_process_options o;
        uint64_t newer;
    } big;
    mp_process_options small;
    mp_process *p = NULL;
    /* an older caller that knew only size and name: daemon etc. read as 0 */
    memset(&small, 0xab, sizeof small);
    small.size = offsetof(mp_process_options, daemon);
    small.name = "small-opts";
    assert_mp_ok(mp_process_create("contract_exit3", NULL, &small, &p));
    assert_string_equal(mp_process_name(p), "small-opts");
    assert_false(mp_process_daemon(p));
    assert_mp_ok(mp_process_destroy(p));
    /* a newer caller: accepted while its extra field is zero */
    memset(&big, 0, sizeof big);
    mp_process_options_init(&big.o);
    big.o.size = sizeof big;
    assert_mp_ok(mp_process_create("contract_exit3", NULL, &big.o, &p));
    assert_mp_ok(mp_process_destroy(p));
    big.newer = 1;
    p = NULL;
    assert_mp_err(mp_process_create("contract_exit3", NULL, &big.o, &p), MP_ENOTSUP);
    assert_null(p);
    mp_process_options_init(&small);
    small.size = 0;
    assert_mp_err(mp_process_create("contract_exit3", NULL, &small, &p), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_process_create: mp_process_options.size is 0: "
                                         "set it to sizeof(mp_process_options) before the "
                                         "call (mp_process_options_init does)");
    mp_process_options_init(&small);
    small.start_method = "bogus";
    assert_mp_err(mp_process_create("contract_exit3", NULL, &small, &p), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_process_create: unknown start method 'bogus': "
                                         "use \"fork\", \"spawn\" or \"forkserver\"");
    assert_null(p);
}

static void test_spawn_and_pool_options_sizes(void **state)
{
    struct {
        mp_spawn_options o;
        uint64_t newer;
    } sbig;
    struct {
        mp_pool_options o;
        uint64_t newer;
    } pbig;
    mp_spawn_context *ctx = NULL;
    mp_pool *pool = NULL;
    memset(&sbig, 0, sizeof sbig);
    mp_spawn_options_init(&sbig.o);
    sbig.o.size = sizeof sbig;
    sbig.newer = 2;
    assert_mp_err(mp_spawn_ex("contract_exit3", NULL, &sbig.o, &ctx), MP_ENOTSUP);
    sbig.o.size = 3;
    assert_mp_err(mp_spawn_ex("contract_exit3", NULL, &sbig.o, &ctx), MP_EINVAL);
    assert_null(ctx);
    memset(&pbig, 0, sizeof pbig);
    mp_pool_options_init(&pbig.o);
    pbig.o.size = sizeof pbig;
    pbig.newer = 1;
    assert_mp_err(mp_pool_create(1, &pbig.o, &pool), MP_ENOTSUP);
    assert_null(pool);
    /* an older, smaller pool options struct: only size and start_method */
    pbig.o.size = offsetof(mp_pool_options, initializer);
    pbig.o.start_method = "fork";
    pbig.o.initializer = (const char *)1; /* beyond the caller's size: ignored */
    assert_mp_ok(mp_pool_create(1, &pbig.o, &pool));
    mp_pool_destroy(pool);
}

static void *barrier_default_wait(void *b)
{
    return (void *)(intptr_t)mp_barrier_wait(b, MP_BARRIER_DEFAULT_TIMEOUT, NULL);
}

/* mp_barrier_options reads the same way: a newer caller's unknown field is
 * refused, an older one's missing timeout is its default (wait forever,
 * not the 0 of a zero fill: that would poll). */
static void test_barrier_options_sizes(void **state)
{
    struct {
        mp_barrier_options o;
        uint64_t newer;
    } big;
    mp_barrier *b = NULL;
    memset(&big, 0, sizeof big);
    mp_barrier_options_init(&big.o);
    big.o.size = sizeof big;
    assert_mp_ok(mp_barrier_create_ex(1, &big.o, &b));
    mp_barrier_release(b);
    big.newer = 1;
    assert_mp_err(mp_barrier_create_ex(1, &big.o, &b), MP_ENOTSUP);
    assert_null(b);
    big.o.size = offsetof(mp_barrier_options, timeout);
    big.o.timeout = 0; /* past the caller's size: ignored */
    assert_mp_ok(mp_barrier_create_ex(2, &big.o, &b));
    /* The first party waits with the default: -1 waits for the second,
     * which comes 0.1 s later; a 0 would have failed it at once. */
    pthread_t t;
    void *first;
    assert_int_equal(pthread_create(&t, NULL, barrier_default_wait, b), 0);
    usleep(100000);
    assert_mp_ok(mp_barrier_wait(b, 30, NULL));
    pthread_join(t, &first);
    assert_int_equal((int)(intptr_t)first, 0);
    mp_barrier_release(b);
    big.o.size = 0;
    assert_mp_err(mp_barrier_create_ex(1, &big.o, &b), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "mp_barrier_options.size is 0"));
}

static int cb_calls;
static void on_done(mp_async_result *r, void *user)
{
    (void)r;
    (void)user;
    __atomic_add_fetch(&cb_calls, 1, __ATOMIC_SEQ_CST);
}

static void test_callbacks_sizes(void **state)
{
    struct {
        mp_pool_callbacks cb;
        void *newer;
    } big = {{sizeof big, on_done, on_done, NULL}, NULL};
    mp_pool_callbacks unset = {0, on_done, on_done, NULL};
    mp_pool_options o;
    mp_pool *pool = NULL;
    mp_msg *in = NULL;
    mp_async_result *r = NULL;
    mp_pool_options_init(&o);
    o.start_method = "fork";
    assert_mp_ok(mp_pool_create(1, &o, &pool));
    assert_mp_ok(mp_msg_create(&in));
    assert_mp_err(mp_pool_apply_async(pool, "contract_echo", in, &unset, &r), MP_EINVAL);
    assert_null(r);
    big.newer = &big;
    assert_mp_err(mp_pool_apply_async(pool, "contract_echo", in, &big.cb, &r), MP_ENOTSUP);
    big.newer = NULL;
    cb_calls = 0;
    assert_mp_ok(mp_pool_apply_async(pool, "contract_echo", in, &big.cb, &r));
    assert_mp_ok(mp_async_result_wait(r, 30));
    mp_async_result_release(r);
    assert_mp_ok(mp_pool_close(pool));
    assert_mp_ok(mp_pool_join(pool)); /* callbacks have run once the handler is done */
    assert_int_equal(__atomic_load_n(&cb_calls, __ATOMIC_SEQ_CST), 1);
    mp_pool_destroy(pool);
    mp_msg_destroy(in);
}

static void test_child_error_sizes(void **state)
{
    mp_process *p = NULL;
    mp_child_error e;
    assert_mp_ok(mp_process_create("contract_exit3", NULL, NULL, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 30));
    /* not set: refused */
    memset(&e, 0, sizeof e);
    assert_mp_err(mp_process_error(p, &e), MP_EINVAL);
    /* a record has no _init: the sentence shows how to set its size */
    assert_string_equal(mp_last_error(), "mp_process_error: mp_child_error.size is 0: set it "
                                         "to sizeof(mp_child_error) before the call "
                                         "(mp_child_error s = {.size = sizeof s};)");
    /* an older, smaller record: nothing past its size is written */
    memset(&e, 0x5a, sizeof e);
    e.size = offsetof(mp_child_error, signal);
    assert_mp_ok(mp_process_error(p, &e));
    assert_int_equal(e.size, offsetof(mp_child_error, signal));
    assert_int_equal(e.exitcode, 3);
    assert_int_equal(e.pid, mp_process_pid(p));
    assert_int_equal(e.signal, 0x5a5a5a5a);
    /* a newer, larger one: ours in full, its tail zeroed */
    struct {
        mp_child_error e;
        uint64_t newer;
    } big;
    memset(&big, 0x5a, sizeof big);
    big.e.size = sizeof big;
    assert_mp_ok(mp_process_error(p, &big.e));
    assert_int_equal(big.e.size, sizeof big);
    assert_int_equal(big.e.signal, 0);
    assert_string_equal(big.e.signal_name, "");
    assert_true(big.newer == 0);
    assert_mp_ok(mp_process_destroy(p));
}

/* Refused even where the call would finish at once, and nothing moves: no
 * message is put, taken or sent, no exited child is reaped. */
static void assert_nan_refused(int rc, const char *call)
{
    assert_int_equal(rc, MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), call));
    assert_non_null(strstr(mp_last_error(), "timeout is NaN"));
}

static void test_nan_timeout_refused_before_acting(void **state)
{
    mp_queue *q = NULL;
    mp_conn *a = NULL, *b = NULL;
    mp_msg *m = NULL, *got = NULL;
    mp_tensor *t = NULL, *tg = NULL;
    mp_process *p = NULL;
    void *bytes = NULL;
    size_t len = 1;
    const int64_t shape[] = {4};
    const char *names[] = {"w"};
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, "x", 1));
    assert_mp_ok(mp_tensor_empty_shared(MP_FLOAT32, 1, shape, &t));

    assert_nan_refused(mp_queue_put(q, m, NAN), "mp_queue_put");
    assert_nan_refused(mp_queue_put_tensor(q, t, NAN), "mp_queue_put_tensor");
    assert_nan_refused(mp_queue_put_state_dict(q, 1, names, &t, NAN), "mp_queue_put_state_dict");
    assert_mp_err(mp_queue_get_nowait(q, &got), MP_ETIMEDOUT); /* none was put */
    assert_mp_ok(mp_queue_put_tensor(q, t, -1));
    got = m; /* a get that fails sets *out to NULL */
    assert_nan_refused(mp_queue_get(q, &got, NAN), "mp_queue_get");
    assert_null(got);
    assert_nan_refused(mp_queue_get_tensor(q, &tg, NAN), "mp_queue_get_tensor");
    assert_nan_refused(mp_queue_get_state_dict(q, &got, NAN), "mp_queue_get_state_dict");
    assert_mp_ok(mp_queue_get_tensor(q, &tg, 0)); /* still there */

    assert_nan_refused(mp_conn_send(a, m, NAN), "mp_conn_send");
    assert_nan_refused(mp_conn_send_bytes(a, "x", 1, NAN), "mp_conn_send_bytes");
    assert_int_equal(mp_conn_poll(b, 0), 0); /* none was sent */
    assert_mp_ok(mp_conn_send(a, m, -1));
    mp_wait_item it = {.kind = MP_WAIT_CONN, .u.conn = b};
    assert_nan_refused(mp_wait(&it, 1, NAN), "mp_wait");
    assert_nan_refused(mp_conn_poll(b, NAN), "mp_conn_poll");
    assert_nan_refused(mp_conn_recv(b, &got, NAN), "mp_conn_recv");
    assert_nan_refused(mp_conn_recv_bytes(b, &bytes, &len, NAN), "mp_conn_recv_bytes");
    assert_true(bytes == NULL && len == 0);
    assert_mp_ok(mp_conn_recv(b, &got, 0)); /* still there */
    mp_msg_destroy(got);

    assert_mp_ok(mp_process_create("contract_exit3", NULL, NULL, &p));
    assert_mp_ok(mp_process_start(p));
    assert_nan_refused(mp_process_join(p, NAN), "mp_process_join");
    assert_mp_ok(mp_process_join(p, 30));
    assert_nan_refused(mp_process_join(p, NAN), "mp_process_join");
    assert_mp_ok(mp_process_destroy(p));

    mp_tensor_release(tg);
    mp_tensor_release(t);
    mp_msg_destroy(m);
    mp_conn_release(a);
    mp_conn_release(b);
    mp_queue_release(q);
}

/* A message's limits are refused with the public call's name and the fix,
 * and a refused put leaves the queue as it was: a name over MP_MSG_NAME_MAX
 * bytes, more fd-carrying attachments than one message carries. */
static void test_message_limits(void **state)
{
    char name[MP_MSG_NAME_MAX + 2];
    mp_event *e = NULL;
    mp_queue *q = NULL;
    mp_msg *m = NULL, *got = NULL;
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    assert_mp_ok(mp_event_create(&e));
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_err(mp_msg_add_event(m, name, e), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "mp_msg_add_event: name longer than"));
    assert_int_equal(mp_msg_count(m), 0);
    for (int i = 0; i < 300; i++)
        assert_mp_ok(mp_msg_add_event(m, NULL, e));
    int fds = mp_test_count_fds();
    assert_mp_err(mp_queue_put(q, m, 1), MP_EOVERFLOW);
    assert_non_null(strstr(mp_last_error(), "event attachment 252 does not fit"));
    assert_non_null(strstr(mp_last_error(), "send them in several messages"));
    assert_int_equal(mp_test_count_fds(), fds);
    assert_mp_err(mp_queue_get_nowait(q, &got), MP_ETIMEDOUT);
    mp_msg_destroy(m);
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_event(m, "e", e));
    assert_mp_ok(mp_queue_put(q, m, 1));
    assert_mp_ok(mp_queue_get(q, &got, 5));
    assert_int_equal(mp_msg_count(got), 1);
    mp_msg_destroy(got);
    mp_msg_destroy(m);
    mp_queue_release(q);
    mp_event_release(e);
}

/* A get of the wrong kind or index names the public call, the kind found
 * and where to look, and leaves *out NULL. */
static void test_message_get_errors(void **state)
{
    mp_event *e = NULL, *got_e = NULL;
    mp_lock *got_l = (mp_lock *)&got_l; /* not NULL: the failed get must clear it */
    mp_tensor *got_t = (mp_tensor *)&got_t;
    mp_msg *m = NULL;
    (void)state;
    assert_mp_ok(mp_event_create(&e));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_event(m, "e", e));
    assert_mp_err(mp_msg_get_lock(m, 0, &got_l), MP_EINVAL);
    assert_null(got_l);
    assert_string_equal(mp_last_error(), "mp_msg_get_lock: attachment 0 is of kind 'event', "
                                         "not 'lock' (mp_msg_kind tells each attachment's "
                                         "kind)");
    assert_mp_err(mp_msg_get_event(m, 1, &got_e), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_msg_get_event: index 1 is out of range: the "
                                         "message has 1 attachment (mp_msg_count)");
    assert_mp_err(mp_msg_get_tensor(m, 0, &got_t), MP_EINVAL);
    assert_null(got_t);
    assert_non_null(strstr(mp_last_error(), "mp_msg_get_tensor: attachment 0 is of kind "
                                            "'event', not 'tensor'"));
    assert_mp_err(mp_msg_get_event(NULL, 0, &got_e), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_msg_get_event: the message is NULL");
    assert_mp_err(mp_msg_get_event(m, 0, NULL), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_msg_get_event: out is NULL");
    assert_mp_ok(mp_msg_get_event(m, 0, &got_e));
    assert_ptr_equal(got_e, e);
    mp_event_release(got_e);
    mp_msg_destroy(m);
    mp_event_release(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_predicates_are_bool, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_name_lists, mp_test_setup, mp_test_teardown),
        cmocka_unit_test(test_struct_in_rule),
        cmocka_unit_test_setup_teardown(test_process_options_sizes, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_spawn_and_pool_options_sizes, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_callbacks_sizes, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_barrier_options_sizes, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_child_error_sizes, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_nan_timeout_refused_before_acting, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_message_limits, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_message_get_errors, mp_test_setup,
                                        mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
