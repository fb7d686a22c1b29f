/* The API's common contract, checked across areas: predicates share one
 * type (bool, false for NULL), "list all names" calls share one shape (a
 * static NULL-terminated list, the default first). */
#include "mp_test.h"

#include <string.h>

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
    mp_event_destroy(e);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_predicates_are_bool, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_name_lists, mp_test_setup, mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
