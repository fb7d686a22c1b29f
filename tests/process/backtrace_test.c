/* A child killed by SIGSEGV: mp_spawn's error record carries a symbolized
 * backtrace (function, file:line) under every start method, resolved by the
 * parent with libdw from the test binary's own symbols and DWARF (the
 * binary is not linked with -rdynamic). Also: the raw fallback for an
 * address outside every file, and a frame list cut short by the child's
 * death still yields what arrived. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mp_test.h"
#include "process/process_internal.h"

/* noinline + a volatile pointer: the NULL store stays a real store in this
 * function at -O2 (no trap instruction, no inlining into the entry). Under
 * UBSan its null check would end the child first (exit 1, no signal):
 * no_sanitize keeps the path under test, a real SIGSEGV, in every build.
 * ASan does not check NULL and leaves SIGSEGV to our handler. The store is
 * CRASH_LINE. */
enum { CRASH_LINE = __LINE__ + 4 };
__attribute__((noinline, no_sanitize("undefined"))) static void crash_in_named_function(void)
{
    volatile int *volatile p = NULL;
    *p = 42;
}

MP_ENTRY(t_crash)
{
    if (rank == 1)
        crash_in_named_function();
    return 0;
}

/* Whether this binary carries DWARF line tables (every build type but
 * Release and MinSizeRel, which have no -g). */
static bool has_line_info(void)
{
    char cmd[128]; /* our exe: /proc/self would be the shell's */
    snprintf(cmd, sizeof cmd, "readelf -S --wide /proc/%d/exe | grep -q ' \\.debug_line '",
             (int)getpid());
    return system(cmd) == 0;
}

static void test_segv_record_is_symbolized(void **state)
{
    const char *method = mp_test_method(state);
    mp_spawn_context *ctx = NULL;
    mp_child_error e = {.size = sizeof e};
    mp_msg *m = NULL;
    char want[64], *first;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_spawn("t_crash", m, 2, false, false, method, &ctx));
    assert_mp_err(mp_spawn_context_join(ctx, 60), MP_ECHILD);
    assert_mp_ok(mp_spawn_context_error(ctx, &e));
    assert_int_equal(e.rank, 1);
    assert_string_equal(e.signal_name, "SIGSEGV");
    /* Frame #0 is the faulting store, with its function and exact line;
     * the library's own frames below it are resolved too. A build without
     * DWARF (Release: no -g) has names only. */
    first = strstr(e.backtrace, "#0 ");
    if (has_line_info()) {
        snprintf(want, sizeof want, "backtrace_test.c:%d ", CRASH_LINE);
        if (!first || strncmp(first, "#0  crash_in_named_function at ", 31) != 0 ||
            !strstr(first, want) || !strstr(first, "(backtrace_test+0x") ||
            !strstr(e.backtrace, "mp__child_run at ") || !strstr(e.backtrace, "child.c:"))
            fail_msg("want frame #0 crash_in_named_function at .../%s(backtrace_test+0x...) "
                     "and mp__child_run at .../child.c:N; got:\n%s", want, e.backtrace);
    } else if (!first || strncmp(first, "#0  crash_in_named_function (backtrace_test+0x", 46) ||
               !strstr(e.backtrace, "mp__child_run (backtrace_test+0x")) {
        fail_msg("want frame #0 crash_in_named_function (backtrace_test+0x...) and "
                 "mp__child_run (no DWARF in this build); got:\n%s", e.backtrace);
    }
    mp_spawn_context_destroy(ctx);
    mp_msg_destroy(m);
}

/* What libdw cannot resolve keeps its raw form: an address in no file, a
 * file that is gone. A trace cut short (no end record) still shows. */
static void test_raw_fallback(void **state)
{
    mp__status st = {0};
    char rec[128];
    snprintf(rec, sizeof rec, "%lx 0 ", 0xdeadbeefUL);
    mp__backtrace_add_frame(&st, rec, strlen(rec));
    snprintf(rec, sizeof rec, "%lx %lx /nonexistent/dir/libgone.so", 0x7f0000001234UL,
             0x7f0000000000UL);
    mp__backtrace_add_frame(&st, rec, strlen(rec));
    mp__backtrace_add_frame(&st, "junk", 4); /* ignored */
    assert_int_equal(st.nframes, 2);
    mp__backtrace_finish(&st);
    assert_non_null(st.backtrace);
    assert_string_equal(st.backtrace, "#0  ?? (0xdeadbeef)\n"
                                      "#1  ?? (libgone.so+0x1234)\n");
    mp__status_free(&st);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        MP_TEST_EACH_METHOD(test_segv_record_is_symbolized),
        cmocka_unit_test(test_raw_fallback),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
