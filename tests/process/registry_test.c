/* One registry for MP_ENTRY and MP_TASK: shared limits, and a registration
 * that fails at load time (here: the same entry name twice, as two files
 * of one program can do) is kept and reported by mp_setup and by every
 * start, with the name in the sentence, never dropped. */
#include "mp_test.h"

#include <stdio.h>
#include <string.h>

MP_ENTRY(reg_dup)
{
    return 0;
}

static int other_dup(int rank, mp_msg *args)
{
    (void)rank;
    (void)args;
    return 1;
}

/* What a second MP_ENTRY(reg_dup) in another file of the program does. */
__attribute__((constructor)) static void second_definition(void)
{
    mp_register_entry_at_load("reg_dup", other_dup);
}

MP_TASK(reg_task)
{
    (void)in;
    (void)out;
    return 0;
}

static void test_load_failure_is_reported(void **state)
{
    int argc = 1;
    char *args[] = {"registry_test", NULL}, **argv = args;
    mp_process *p = NULL;
    mp_pool *pool = NULL;
    mp_spawn_context *ctx = NULL;
    /* mp_setup says so first, naming the entry */
    assert_mp_err(mp_setup(&argc, &argv), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "mp_setup"));
    assert_non_null(strstr(mp_last_error(), "'reg_dup'"));
    assert_non_null(strstr(mp_last_error(), "MP_ENTRY"));
    /* and every start, so a program without mp_setup hears it too */
    assert_mp_ok(mp_process_create("reg_dup", NULL, NULL, &p));
    assert_mp_err(mp_process_start(p), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "'reg_dup'"));
    assert_mp_ok(mp_process_destroy(p));
    assert_mp_err(mp_spawn("reg_dup", NULL, 1, true, false, "fork", &ctx), MP_EINVAL);
    assert_null(ctx);
    assert_mp_err(mp_pool_create(1, NULL, &pool), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "'reg_dup'"));
    assert_null(pool);
}

static void test_one_registry(void **state)
{
    char name[MP_ENTRY_NAME_MAX + 2];
    int added = 0, rc = 0;
    /* a direct call gets its failure back (and nothing is kept) */
    assert_mp_err(mp_register_entry("reg_dup", other_dup), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "'reg_dup'"));
    assert_mp_err(mp_register_task("reg_task", reg_task), MP_EINVAL);
    /* names are per kind: a task may share an entry's name */
    assert_mp_ok(mp_register_task("reg_dup", reg_task));
    /* one name limit for both kinds */
    memset(name, 'n', sizeof name);
    name[MP_ENTRY_NAME_MAX] = '\0';
    assert_mp_ok(mp_register_task(name, reg_task));
    name[MP_ENTRY_NAME_MAX] = 'n';
    name[MP_ENTRY_NAME_MAX + 1] = '\0';
    assert_mp_err(mp_register_entry(name, other_dup), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "mp_register_entry: the entry name 'nnnn"));
    assert_non_null(strstr(mp_last_error(), "...' is 128 bytes; names are 1..127 bytes"));
    assert_mp_err(mp_register_task(name, reg_task), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "the task name"));
    /* a name too long to be registered is refused as such, not looked up */
    assert_mp_err(mp_process_create(name, NULL, NULL, &(mp_process *){NULL}), MP_EINVAL);
    assert_mp_err(mp_register_entry("reg_null_fn", NULL), MP_EINVAL);
    assert_string_equal(mp_last_error(),
                        "mp_register_entry: the function to register as 'reg_null_fn' is NULL");
    /* one capacity for both kinds, public, named in the sentence */
    for (int i = 0; i < MP_REGISTRY_MAX + 1 && rc == 0; i++) {
        snprintf(name, sizeof name, "fill_%d", i);
        rc = i % 2 ? mp_register_task(name, reg_task) : mp_register_entry(name, other_dup);
        added += rc == 0;
    }
    assert_mp_err(rc, MP_EOVERFLOW);
    assert_non_null(strstr(mp_last_error(), "MP_REGISTRY_MAX"));
    assert_true(added < MP_REGISTRY_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_failure_is_reported, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_one_registry, mp_test_setup, mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
