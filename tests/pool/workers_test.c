/* src/pool: workers that die (SIGKILL, SIGSEGV), tasks that fail or call
 * mp_raise, maxtasksperchild, initializers, and the spawn and forkserver
 * start methods. */
#include "helpers.h"

#include <errno.h>

static void test_worker_killed(void **state)
{
    mp_pool *p = pool_new(2, 0);
    check_crash(p, SIGKILL, "SIGKILL");
    check_crash(p, SIGSEGV, "SIGSEGV");
    /* the pool keeps serving, with two live workers */
    check_map(p, 1);
    mp_async_result *r[2];
    mp_msg *in = msg_i64(100);
    const mp_msg *out;
    span s[2];
    for (int i = 0; i < 2; i++)
        assert_mp_ok(mp_pool_apply_async(p, "nap_ms", in, NULL, &r[i]));
    for (int i = 0; i < 2; i++) {
        assert_mp_ok(mp_async_result_get(r[i], 10, &out));
        s[i] = out_span(out);
        mp_async_result_release(r[i]);
    }
    assert_true(overlap(s[0], s[1]));
    mp_msg_destroy(in);
    mp_pool_destroy(p);
}

/* Kills its worker on item 7 (SIGKILL), answers like whoami otherwise. */
MP_TASK(kill_at_7)
{
    span s = {0, 0, getpid(), in_i64(in)};
    if (s.value == 7)
        raise(SIGKILL);
    return mp_msg_set_payload(out, &s, sizeof s);
}

/* Pipelining: chunks queued behind the one a killed worker ran were never
 * read; they run on the replacement and only item 7 fails. */
static void check_killed_pipelined(int nprocs)
{
    enum { N = 200 };
    mp_pool *p = pool_new(nprocs, 0);
    mp_msg *in[N];
    mp_async_result *r;
    const mp_msg *out;
    for (int i = 0; i < N; i++)
        in[i] = msg_i64(i);
    assert_mp_ok(mp_pool_map_async(p, "kill_at_7", (const mp_msg *const *)in, N, 1, NULL, &r));
    assert_mp_ok(mp_async_result_wait(r, 60));
    assert_int_equal(mp_async_result_successful(r), 0);
    for (int i = 0; i < N; i++) {
        int rc = mp_async_result_item(r, (size_t)i, &out);
        if (i == 7) {
            assert_int_equal(rc, MP_ECHILD);
            assert_non_null(strstr(mp_async_result_error(r), "SIGKILL"));
            continue;
        }
        assert_mp_ok(rc);
        assert_int_equal(out_span(out).value, i);
    }
    mp_async_result_release(r);
    for (int i = 0; i < N; i++)
        mp_msg_destroy(in[i]);
    mp_pool_destroy(p);
}

static void test_worker_killed_pipelined(void **state)
{
    check_killed_pipelined(1);
    check_killed_pipelined(2);
}

static void test_task_error_keeps_worker(void **state)
{
    mp_pool *p = pool_new(1, 0);
    mp_msg *in = msg_i64(3), *out = NULL;
    int32_t pid = apply_span(p, "whoami", 0).pid;
    assert_mp_err(mp_pool_apply(p, "refuse", in, &out), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "3 is not welcome"));
    assert_int_equal(apply_span(p, "whoami", 0).pid, pid); /* same worker */
    assert_mp_err(mp_pool_apply(p, "no_such_task", in, &out), MP_ENOENT);
    mp_msg_destroy(in);
    mp_pool_destroy(p);
}

static void test_raise_keeps_worker(void **state)
{
    mp_pool *p = pool_new(1, 0);
    mp_msg *in = msg_i64(5), *out = NULL;
    int32_t pid = apply_span(p, "whoami", 0).pid;
    assert_mp_err(mp_pool_apply(p, "raiser", in, &out), MP_ECHILD);
    if (!strstr(mp_last_error(), "bad input 5"))
        fail_msg("%s", mp_last_error());
    assert_int_equal(apply_span(p, "whoami", 0).pid, pid); /* the worker lives on */
    mp_msg_destroy(in);
    mp_pool_destroy(p);
}

static void check_method(const char *method)
{
    mp_pool *p = pool_new_method(2, 0, method);
    check_map(p, 1);
    check_crash(p, SIGKILL, "SIGKILL");
    check_map(p, 0);
    mp_msg *in = msg_i64(9), *out = NULL;
    assert_mp_err(mp_pool_apply(p, "raiser", in, &out), MP_ECHILD);
    assert_non_null(strstr(mp_last_error(), "bad input 9"));
    mp_msg_destroy(in);
    assert_mp_ok(mp_pool_close(p));
    assert_mp_ok(mp_pool_join(p));
    mp_pool_destroy(p);
}

static void test_spawn(void **state) { check_method("spawn"); }
#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

static void test_forkserver(void **state)
{
#ifdef UNDER_TSAN
    /* TSan turns the forkserver launch's vfork into a fork, whose atfork
     * handler takes the lock the launcher holds: a TSan-only self-deadlock
     * in src/process, not in the pool's threads. */
    skip();
#endif
    check_method("forkserver");
    mp_forkserver_stop(); /* the server is a child too */
}

static void test_initializer(void **state)
{
    mp_pool_options o;
    mp_pool *p = NULL;
    mp_msg *args = msg_i64(42), *in = msg_i64(0), *out;
    mp_pool_options_init(&o);
    o.initializer = "pool_init";
    o.initargs = args;
    assert_mp_ok(mp_pool_create(2, &o, &p));
    mp_msg_destroy(args); /* copied */
    assert_mp_ok(mp_pool_apply(p, "read_init", in, &out));
    assert_int_equal(in_i64(out), 42);
    mp_msg_destroy(out);
    mp_pool_destroy(p);

    /* an initializer name that cannot be registered, or is not */
    o.initargs = NULL;
    o.initializer = "";
    assert_mp_err(mp_pool_create(1, &o, &p), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_create: the initializer name '' is 0 bytes; "
                        "names are 1..127 bytes (MP_ENTRY_NAME_MAX)");
    o.initializer = "no_init";
    assert_mp_err(mp_pool_create(1, &o, &p), MP_ENOENT);
    assert_string_equal(mp_last_error(), "mp_pool_create: no entry called 'no_init' for the "
                        "initializer (define it with MP_ENTRY(no_init))");
    assert_null(p);
    o.initializer = "pool_init";

    /* an initializer that fails: the pool does not start, and says why */
    args = msg_i64(666);
    o.initargs = args;
    assert_mp_err(mp_pool_create(1, &o, &p), MP_ECHILD);
    assert_non_null(strstr(mp_last_error(), "refuses 666"));
    assert_null(p);
    mp_msg_destroy(args);

    /* initargs whose private tensor cannot be moved to shared memory: the
     * sentence says so, it does not claim the pool ran out of memory */
    {
        int64_t shape[1] = {16};
        mp_tensor *t;
        args = msg_i64(42);
        assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &t));
        assert_mp_ok(mp_msg_add_tensor(args, "t", t));
        mp_tensor_release(t);
        o.initargs = args;
        assert_mp_ok(mp__sys_fault("memfd_create", ENOSPC, 0, 100));
        assert_mp_ok(mp__sys_fault("shm_open", ENOSPC, 0, 100));
        int rc = mp_pool_create(1, &o, &p);
        mp__sys_fault_reset();
        assert_true(rc < 0);
        assert_null(p);
        assert_null(strstr(mp_last_error(), "out of memory"));
    }
    o.initializer = "no_such_entry";
    assert_mp_err(mp_pool_create(1, &o, &p), MP_ENOENT);
    o.initializer = NULL;
    o.start_method = "teleport";
    assert_mp_err(mp_pool_create(1, &o, &p), MP_ENOENT);
    mp_msg_destroy(args);
    mp_msg_destroy(in);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void test_maxtasksperchild(void **state)
{
    enum { N = 100 };
    mp_pool *p = pool_new(2, 1);
    mp_msg *in[N], *out[N];
    int32_t pids[N];
    int distinct = 1;
    for (int i = 0; i < N; i++)
        in[i] = msg_i64(i);
    assert_mp_ok(mp_pool_map(p, "whoami", (const mp_msg *const *)in, N, 1, out));
    for (int i = 0; i < N; i++) {
        span s = out_span(out[i]);
        assert_int_equal(s.value, i); /* nothing lost or reordered */
        pids[i] = s.pid;
        mp_msg_destroy(out[i]);
        mp_msg_destroy(in[i]);
    }
    qsort(pids, N, sizeof pids[0], cmp_i32);
    for (int i = 1; i < N; i++)
        distinct += pids[i] != pids[i - 1];
    assert_true(distinct >= N / 2); /* one chunk per worker life (pids may recycle) */
    mp_pool_destroy(p);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_worker_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_worker_killed_pipelined, setup, teardown),
        cmocka_unit_test_setup_teardown(test_task_error_keeps_worker, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maxtasksperchild, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raise_keeps_worker, setup, teardown),
        cmocka_unit_test_setup_teardown(test_initializer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spawn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forkserver, setup, teardown),
    };
    if (pool_tests_begin(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
