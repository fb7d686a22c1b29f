/* A program that never calls mp_setup: every call that would re-execute it
 * (spawn, forkserver) refuses at once, in its own name, saying to call
 * mp_setup, and leaves nothing behind; fork needs no mp_setup and works. */
#include "mp_test.h"

#include <string.h>

MP_ENTRY(ns_ok)
{
    (void)rank;
    (void)args;
    return 0;
}

static void says_setup(const char *call)
{
    const char *e = mp_last_error();
    if (strncmp(e, call, strlen(call)) != 0 || e[strlen(call)] != ':' ||
        !strstr(e, "call mp_setup(&argc, &argv) first in main"))
        fail_msg("%s said: %s", call, e);
}

static void test_reexecuting_calls_refuse(void **state)
{
    mp_process_options o;
    mp_pool_options po;
    mp_process *p = NULL;
    mp_pool *pool = NULL;
    mp_spawn_context *ctx = NULL;
    (void)state;
    assert_mp_err(mp_forkserver_start(), MP_ESTATE);
    says_setup("mp_forkserver_start");
    assert_mp_err(mp_spawn("ns_ok", NULL, 2, true, false, "spawn", &ctx), MP_ESTATE);
    says_setup("mp_spawn");
    assert_null(ctx);
    assert_mp_err(mp_spawn("ns_ok", NULL, 2, true, false, "forkserver", NULL), MP_ESTATE);
    says_setup("mp_spawn");
    mp_pool_options_init(&po);
    po.start_method = "spawn";
    assert_mp_err(mp_pool_create(2, &po, &pool), MP_ESTATE);
    says_setup("mp_pool_create");
    assert_null(pool);
    mp_process_options_init(&o);
    o.start_method = "forkserver";
    assert_mp_ok(mp_process_create("ns_ok", NULL, &o, &p));
    assert_mp_err(mp_process_start(p), MP_ESTATE);
    says_setup("mp_process_start");
    assert_int_equal(mp_process_pid(p), 0);
    assert_mp_ok(mp_process_destroy(p));
}

static void test_fork_needs_no_setup(void **state)
{
    (void)state;
    assert_mp_ok(mp_spawn("ns_ok", NULL, 2, true, false, "fork", NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reexecuting_calls_refuse, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_fork_needs_no_setup, mp_test_setup,
                                        mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
