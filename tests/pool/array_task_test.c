/* src/pool: map_array over an array task (MP_ARRAY_TASK): one call per
 * chunk over its slice of the shared arrays; failures, mp_raise and a
 * killed worker fail exactly the items of that chunk; the shared arrays
 * are reused by the next call; misuse is refused. */
#include "helpers.h"

MP_ARRAY_TASK(squares)
{
    const int64_t *x = in;
    int64_t *y = out;
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] * x[i];
    return 0;
}

/* Fails a slice holding the value 13, raises on one holding 17 and kills
 * its worker on one holding 23 (values as given); squares the rest. */
MP_ARRAY_TASK(picky)
{
    const int64_t *x = in;
    int64_t *y = out;
    for (size_t i = 0; i < n; i++) {
        if (x[i] == 13)
            return mp__error(MP_EINVAL, "picky: 13 is unlucky");
        if (x[i] == 17)
            mp_raise("picky: 17 raised");
        if (x[i] == 23)
            raise(SIGKILL);
        y[i] = x[i] * x[i];
    }
    return 0;
}

static void check_squares(mp_pool *p, size_t n, size_t chunksize)
{
    int64_t *in = malloc(n * sizeof *in), *out = calloc(n, sizeof *out);
    assert_non_null(in);
    assert_non_null(out);
    for (size_t i = 0; i < n; i++)
        in[i] = (int64_t)i - 1000;
    assert_mp_ok(mp_pool_map_array(p, "squares", in, n, sizeof *in, out, sizeof *out,
                                   chunksize));
    for (size_t i = 0; i < n; i++)
        if (out[i] != in[i] * in[i])
            fail_msg("item %zu of %zu (chunksize %zu): %lld", i, n, chunksize,
                     (long long)out[i]);
    free(in);
    free(out);
}

static void test_squares(void **state)
{
    mp_pool *p = pool_new(2, 0);
    check_squares(p, 100003, 0);
    check_squares(p, 1000, 7);
    check_squares(p, 5, 1);
    check_squares(p, 200000, 0); /* larger: new shared arrays */
    check_squares(p, 3000, 0);   /* smaller: the cached ones, stale bytes beyond n */
    check_squares(p, 1, 0);
    assert_mp_ok(mp_pool_map_array(p, "squares", NULL, 0, 8, NULL, 8, 0));
    mp_pool_destroy(p);
}

/* Chunks of 10 items over 0..99: the chunk of items 13 and 17 fails with
 * the task's code (13 comes first), that of 23 with MP_ECHILD naming
 * SIGKILL; every other item is squared, on the replacement worker too.
 * Then mp_raise alone (17). */
static void test_failures_fail_their_chunk(void **state)
{
    enum { N = 100 };
    mp_pool *p = pool_new(2, 0);
    int64_t in[N], out[N];
    mp_async_result *r;
    const mp_msg *m;
    for (int i = 0; i < N; i++) {
        in[i] = i;
        out[i] = -1;
    }
    assert_mp_ok(mp_pool_map_array_async(p, "picky", in, N, sizeof *in, out, sizeof *out, 10,
                                         NULL, &r));
    assert_mp_ok(mp_async_result_wait(r, 60));
    assert_int_equal(mp_async_result_successful(r), 0);
    for (int i = 0; i < N; i++) {
        int rc = mp_async_result_item(r, (size_t)i, &m);
        if (i / 10 == 1) { /* 13 comes before 17 in that slice */
            assert_int_equal(rc, MP_EINVAL);
            assert_non_null(strstr(mp_last_error(), "13 is unlucky"));
            continue;
        }
        if (i / 10 == 2) {
            assert_int_equal(rc, MP_ECHILD);
            assert_non_null(strstr(mp_last_error(), "SIGKILL"));
            continue;
        }
        assert_mp_ok(rc);
        assert_null(m);
        assert_int_equal(out[i], (int64_t)i * i);
    }
    mp_async_result_release(r);
    /* one item each: the task's code; mp_raise */
    assert_mp_err(mp_pool_map_array(p, "picky", in + 13, 1, 8, out, 8, 0), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "13 is unlucky"));
    assert_mp_err(mp_pool_map_array(p, "picky", in + 17, 1, 8, out, 8, 0), MP_ECHILD);
    assert_non_null(strstr(mp_last_error(), "17 raised"));
    check_squares(p, 1000, 0); /* the pool serves on */
    mp_pool_destroy(p);
}

static void test_misuse(void **state)
{
    mp_pool *p = pool_new(1, 0);
    mp_msg *in = msg_i64(2), *out = NULL;
    assert_mp_err(mp_pool_apply(p, "squares", in, &out), MP_ENOENT);
    assert_non_null(strstr(mp_last_error(), "mp_pool_map_array only"));
    assert_mp_err(mp_pool_map(p, "squares", (const mp_msg *const *)&in, 1, 0, &out),
                  MP_ENOENT);
    assert_mp_err(mp_register_array_task("squares", squares), MP_EINVAL);
    assert_mp_err(mp_register_task("squares", NULL), MP_EINVAL);
    /* Tasks and array tasks share one name space in the registry. */
    assert_mp_err(mp_register_task("squares", square), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "array task 'squares' is registered already"));
    assert_mp_err(mp_register_array_task("square", squares), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "task 'square' is registered already"));
    assert_mp_err(mp_register_array_task("", squares), MP_EINVAL);
    assert_mp_err(mp_register_array_task("x", NULL), MP_EINVAL);
    mp_msg_destroy(in);
    mp_pool_destroy(p);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_squares, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failures_fail_their_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_misuse, setup, teardown),
    };
    if (pool_tests_begin(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
