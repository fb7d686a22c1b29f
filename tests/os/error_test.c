/* The error model: one list (MP_ERROR_MAP) gives every code its value, name
 * and text; MP_ERROR_LAST bounds it; mp_last_errno keeps a system call's
 * errno. */
#include "mp_test.h"
#include "os/os.h"

#include <errno.h>
#include <string.h>

static void test_codes_from_one_list(void **state)
{
    int n = 0, expect = 0;
#define CHECK(name, value, text)                                                                   \
    assert_int_equal(value, expect--);                                                             \
    assert_string_equal(mp_err_name(value), #name);                                                \
    assert_string_equal(mp_strerror(value), text);                                                 \
    n++;
    MP_ERROR_MAP(CHECK)
#undef CHECK
    /* dense from 0 down to the last code, which the bound names */
    assert_int_equal(n, 1 - MP_ERROR_LAST);
    assert_int_equal(expect, MP_ERROR_LAST - 1);
    assert_string_equal(mp_err_name(MP_ERROR_LAST - 1), "MP_E?");
    assert_string_equal(mp_strerror(MP_ERROR_LAST - 1), "unknown error code");
    assert_string_equal(mp_err_name(1), "MP_E?");
    /* codes never move: spot-check values that programs may have stored */
    assert_int_equal(MP_EINVAL, -1);
    assert_int_equal(MP_ESYS, -3);
    assert_int_equal(MP_ETIMEDOUT, -4);
    assert_int_equal(MP_EAGAIN, -10);
    assert_int_equal(MP_EOVERFLOW, -17);
}

static void test_last_errno(void **state)
{
    mp__error_saved saved;
    /* an errno that maps to MP_ESYS keeps the errno */
    assert_int_equal(mp__errno_error(EIO, "test: read"), MP_ESYS);
    assert_int_equal(mp_last_errno(), EIO);
    assert_non_null(strstr(mp_last_error(), strerror(EIO)));
    mp__error_save(&saved);
    /* a failure of the library's own (no errno) resets it */
    assert_int_equal(mp__error(MP_EINVAL, "test: bad"), MP_EINVAL);
    assert_int_equal(mp_last_errno(), 0);
    mp__error_restore(&saved);
    assert_int_equal(mp_last_errno(), EIO);
    /* through a public call: an injected socketpair failure */
    assert_mp_ok(mp__sys_fault("socketpair", EPROTONOSUPPORT, 0, 1));
    mp_conn *a = NULL, *b = NULL;
    assert_mp_err(mp_pipe(true, &a, &b), MP_ESYS);
    assert_int_equal(mp_last_errno(), EPROTONOSUPPORT);
    mp__sys_fault_reset();
    assert_mp_ok(mp_pipe(true, &a, &b));
    mp_conn_release(a);
    mp_conn_release(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes_from_one_list),
        cmocka_unit_test_setup_teardown(test_last_errno, mp_test_setup, mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
