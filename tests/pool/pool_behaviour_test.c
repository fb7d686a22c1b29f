/* Pool behaviours Python users rely on, under fork, spawn and forkserver:
 * an initializer learns its worker's index (a replacement gets the index of
 * the worker it replaces), and a result that cannot be sent fails its item
 * with the cause while the worker keeps serving. */
#include "helpers.h"

#include <dlpack/dlpack.h>

/* In a worker: the index its initializer was given, and the shared counts
 * tensor from initargs (int32[4]: one init count per index, then the index
 * of the worker that crashed). */
static int my_rank = -1;
static mp_tensor *counts;

MP_ENTRY(rank_init)
{
    if (mp_msg_find_tensor(args, "counts", &counts) != 0)
        mp_raise("rank_init: no counts tensor: %s", mp_last_error());
    my_rank = rank;
    if (rank < 0 || rank >= 3)
        mp_raise("rank_init: index %d outside 0..2", rank);
    __atomic_fetch_add((int32_t *)mp_tensor_data(counts) + rank, 1, __ATOMIC_SEQ_CST);
    return 0;
}

MP_TASK(my_index)
{
    span s = {0, 0, getpid(), my_rank};
    return mp_msg_set_payload(out, &s, sizeof s);
}

/* Records which index dies, then dies. */
MP_TASK(die_recorded)
{
    __atomic_store_n((int32_t *)mp_tensor_data(counts) + 3, my_rank, __ATOMIC_SEQ_CST);
    raise(SIGKILL);
    return 0;
}

/* A result whose tensor is exported through DLPack (a consumer holds its
 * address) cannot be moved to shared memory, so it cannot be sent. The
 * export is kept until the next call. */
static DLManagedTensor *held;

MP_TASK(unsendable)
{
    int64_t n = 4;
    if (in_i64(in) == 7)
        return mp_msg_set_payload(out, &n, sizeof n); /* a good one */
    mp_tensor *t = NULL;
    int rc;
    if (held) {
        held->deleter(held);
        held = NULL;
    }
    rc = mp_tensor_empty(MP_FLOAT32, 1, &n, &t);
    if (!rc)
        rc = mp_tensor_to_dlpack(t, &held);
    if (!rc)
        rc = mp_msg_add_tensor(out, "t", t);
    mp_tensor_release(t);
    return rc;
}

static int32_t count_at(mp_tensor *c, int i)
{
    return __atomic_load_n((int32_t *)mp_tensor_data(c) + i, __ATOMIC_SEQ_CST);
}

static void check_initializer_index(const char *method)
{
    mp_pool_options o;
    mp_pool *p = NULL;
    mp_tensor *c = NULL;
    mp_msg *args = NULL, *in = msg_i64(0), *out = NULL;
    int64_t four = 4;
    int dead;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &four, &c));
    ((int32_t *)mp_tensor_data(c))[3] = -1;
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_tensor(args, "counts", c));
    mp_pool_options_init(&o);
    o.start_method = method;
    o.initializer = "rank_init";
    o.initargs = args;
    assert_mp_ok(mp_pool_create(3, &o, &p));
    /* create waits until every worker ran its initializer: 0, 1, 2 once each */
    for (int i = 0; i < 3; i++)
        assert_int_equal(count_at(c, i), 1);
    /* a worker dies: its replacement is initialized with the same index */
    assert_mp_err(mp_pool_apply(p, "die_recorded", in, &out), MP_ECHILD);
    dead = count_at(c, 3);
    assert_true(dead >= 0 && dead < 3);
    for (int i = 0; i < 500 && count_at(c, dead) != 2; i++)
        usleep(10000);
    for (int i = 0; i < 3; i++)
        assert_int_equal(count_at(c, i), i == dead ? 2 : 1);
    /* the tasks see the index too */
    assert_mp_ok(mp_pool_apply(p, "my_index", in, &out));
    assert_true(out_span(out).value >= 0 && out_span(out).value < 3);
    mp_msg_destroy(out);
    mp_pool_destroy(p);
    mp_msg_destroy(args);
    mp_msg_destroy(in);
    mp_tensor_release(c);
}

static void check_unsendable_result(const char *method)
{
    mp_pool *p = pool_new_method(1, 0, method);
    mp_msg *in[3], *one = NULL;
    const mp_msg *item = NULL;
    mp_async_result *r = NULL;
    int32_t pid = apply_span(p, "whoami", 0).pid;
    for (int i = 0; i < 3; i++)
        in[i] = msg_i64(i);
    assert_mp_err(mp_pool_apply(p, "unsendable", in[0], &one), MP_ESTATE);
    if (!strstr(mp_last_error(), "cannot be sent") || !strstr(mp_last_error(), "DLPack"))
        fail_msg("%s", mp_last_error());
    assert_null(one);
    /* the same worker serves on */
    assert_int_equal(apply_span(p, "whoami", 0).pid, pid);
    /* in a chunk, only that item fails: the others of the chunk arrive */
    mp_msg_destroy(in[1]);
    in[1] = msg_i64(7);
    assert_mp_ok(mp_pool_map_async(p, "unsendable", (const mp_msg *const *)in, 3, 3, NULL, &r));
    assert_mp_ok(mp_async_result_wait(r, 20));
    assert_mp_err(mp_async_result_item(r, 0, &item), MP_ESTATE);
    assert_mp_ok(mp_async_result_item(r, 1, &item));
    assert_int_equal(in_i64(item), 4);
    assert_mp_err(mp_async_result_item(r, 2, &item), MP_ESTATE);
    assert_null(item); /* a failed item leaves no stale pointer */
    mp_async_result_release(r);
    assert_int_equal(apply_span(p, "whoami", 0).pid, pid);
    for (int i = 0; i < 3; i++)
        mp_msg_destroy(in[i]);
    mp_pool_destroy(p);
}

#define EACH(name, fn)                                                                            \
    static void name##_fork(void **s) { fn("fork"); }                                             \
    static void name##_spawn(void **s) { fn("spawn"); }                                           \
    static void name##_forkserver(void **s)                                                       \
    {                                                                                              \
        fn("forkserver");                                                                          \
        mp_forkserver_stop();                                                                      \
    }

EACH(initializer_index, check_initializer_index)
EACH(unsendable_result, check_unsendable_result)

#define T(t) cmocka_unit_test_setup_teardown(t, setup, teardown)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(initializer_index_fork),  T(initializer_index_spawn),  T(initializer_index_forkserver),
        T(unsendable_result_fork),  T(unsendable_result_spawn),  T(unsendable_result_forkserver),
    };
    if (pool_tests_begin(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
