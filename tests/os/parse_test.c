/* One strict parser for every number people type (options, environment
 * variables): what it refuses and the sentence it gives; the environment
 * variables read through it (MPROC_SHM_MANAGER_GRACE before the library
 * starts a daemon, MPROC_SPAWN in mp_setup). */
#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_test.h"
#include "os/os.h"
#include "shm/manager.h"

static void expect_ll_bad(const char *text, long long min, long long max, const char *why)
{
    long long v = 77;
    int rc = mp__parse_ll("--n", text, min, max, &v);
    if (rc != MP_EINVAL || v != 77 || !strstr(mp_last_error(), why) ||
        strncmp(mp_last_error(), "--n \"", 5) != 0)
        fail_msg("\"%s\": rc %d, v %lld, \"%s\" (want \"%s\")", text ? text : "(null)", rc, v,
                 mp_last_error(), why);
}

static void expect_double_bad(const char *text, const char *why)
{
    double v = 77;
    int rc = mp__parse_double("--grace", text, 0, 100, &v);
    if (rc != MP_EINVAL || v != 77 || !strstr(mp_last_error(), why))
        fail_msg("\"%s\": rc %d, v %g, \"%s\" (want \"%s\")", text ? text : "(null)", rc, v,
                 mp_last_error(), why);
}

static void test_whole_numbers(void **state)
{
    long long v = 0;
    assert_mp_ok(mp__parse_ll("--n", "0", 0, 10, &v));
    assert_int_equal(v, 0);
    assert_mp_ok(mp__parse_ll("--n", "+10", 0, 10, &v));
    assert_int_equal(v, 10);
    assert_mp_ok(mp__parse_ll("--n", "-3", -5, 10, &v));
    assert_int_equal(v, -3);
    assert_mp_ok(mp__parse_ll("--n", "9223372036854775807", 0, LLONG_MAX, &v));
    assert_true(v == LLONG_MAX);
    expect_ll_bad("", 0, 10, "it is empty");
    expect_ll_bad(NULL, 0, 10, "it is empty");
    expect_ll_bad("12x", 0, 100, "not a whole decimal number");
    expect_ll_bad(" 7", 0, 10, "not a whole decimal number");
    expect_ll_bad("7 ", 0, 10, "not a whole decimal number");
    expect_ll_bad("0x10", 0, 100, "not a whole decimal number");
    expect_ll_bad("1.5", 0, 10, "not a whole decimal number");
    expect_ll_bad("nan", 0, 10, "not a whole decimal number");
    expect_ll_bad("-1", 0, 10, "it is negative");
    expect_ll_bad("11", 0, 10, "out of range");
    expect_ll_bad("9223372036854775808", 0, LLONG_MAX, "out of range");
    expect_ll_bad("-9223372036854775809", LLONG_MIN, 0, "out of range");
    expect_ll_bad("99999999999999999999999", 0, 1000000000, "from 0 to 1000000000");
}

static void test_real_numbers(void **state)
{
    double v = 0;
    assert_mp_ok(mp__parse_double("--grace", "2.5", 0, 100, &v));
    assert_true(v == 2.5);
    assert_mp_ok(mp__parse_double("--grace", ".5", 0, 100, &v));
    assert_true(v == 0.5);
    assert_mp_ok(mp__parse_double("--grace", "1e1", 0, 100, &v));
    assert_true(v == 10);
    assert_mp_ok(mp__parse_double("--grace", "-0", 0, 100, &v));
    assert_true(v == 0);
    expect_double_bad("", "it is empty");
    expect_double_bad("nan", "not a decimal number");
    expect_double_bad("NaN", "not a decimal number");
    expect_double_bad("inf", "not a decimal number");
    expect_double_bad("-infinity", "not a decimal number");
    expect_double_bad("0x1p3", "not a decimal number");
    expect_double_bad("1e", "not a decimal number");
    expect_double_bad("abc", "not a decimal number");
    expect_double_bad("2s", "not a decimal number");
    expect_double_bad("-5", "it is negative");
    expect_double_bad("101", "out of range");
    expect_double_bad("1e999", "out of range");
    expect_double_bad("-1e999", "out of range");
}

static void test_environment(void **state)
{
    long long n = 5;
    double d = 5;
    unsetenv("MP_TEST_NUM");
    assert_int_equal(mp__env_ll("MP_TEST_NUM", 0, 10, &n), 0);
    assert_int_equal(n, 5); /* unset: the default holds */
    setenv("MP_TEST_NUM", "", 1);
    assert_int_equal(mp__env_double("MP_TEST_NUM", 0, 10, &d), 0);
    assert_true(d == 5); /* empty counts as unset */
    setenv("MP_TEST_NUM", "7", 1);
    assert_int_equal(mp__env_ll("MP_TEST_NUM", 0, 10, &n), 1);
    assert_int_equal(n, 7);
    setenv("MP_TEST_NUM", "abc", 1);
    assert_int_equal(mp__env_ll("MP_TEST_NUM", 0, 10, &n), MP_EINVAL);
    assert_int_equal(n, 7);
    assert_string_equal(mp_last_error(),
                        "environment variable MP_TEST_NUM \"abc\": it is not a whole decimal "
                        "number; give a whole number from 0 to 10 (unset it to get the default)");
    unsetenv("MP_TEST_NUM");
}

/* A bad MPROC_SHM_MANAGER_GRACE is an error, not 0: reading it, and
 * starting a daemon (the failing call says why through mp_last_error). */
static void test_grace_variable(void **state)
{
    static const char *const bad[] = {"abc", "-5", "nan", "inf", "1e999", "2x"};
    double g = MP__MGR_GRACE_DEFAULT;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MPROC_SHM_MANAGER_GRACE", bad[i], 1);
        assert_int_equal(mp__mgr_grace_env(&g), MP_EINVAL);
        assert_true(g == MP__MGR_GRACE_DEFAULT);
        assert_non_null(strstr(mp_last_error(), "MPROC_SHM_MANAGER_GRACE"));
        assert_int_equal(mp__mgr_spawn("--persistent", 5.0), MP_EINVAL);
        if (!strstr(mp_last_error(), "cannot start the daemon: environment variable "
                                     "MPROC_SHM_MANAGER_GRACE"))
            fail_msg("%s: %s", bad[i], mp_last_error());
    }
    setenv("MPROC_SHM_MANAGER_GRACE", "0.25", 1);
    assert_int_equal(mp__mgr_grace_env(&g), 0);
    assert_true(g == 0.25);
    unsetenv("MPROC_SHM_MANAGER_GRACE");
}

/* mp_setup: a malformed MPROC_SPAWN is reported, not taken for "parent". */
static void test_boot_variable(void **state)
{
    static const char *const bad[] = {"abc", "3", "3,", ",5", "3,0", "-1,5", "3,5x",
                                      "99999999999,5"};
    int argc = 1;
    char *args[] = {(char *)"parse_test", NULL}, **argv = args;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MPROC_SPAWN", bad[i], 1);
        assert_int_equal(mp_setup(&argc, &argv), MP_EINVAL);
        if (!strstr(mp_last_error(), "MPROC_SPAWN") || !strstr(mp_last_error(), "unset it"))
            fail_msg("%s: %s", bad[i], mp_last_error());
    }
    unsetenv("MPROC_SPAWN");
    assert_mp_ok(mp_setup(&argc, &argv));
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_numbers),  cmocka_unit_test(test_real_numbers),
        cmocka_unit_test(test_environment),    cmocka_unit_test(test_grace_variable),
        cmocka_unit_test(test_boot_variable),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
