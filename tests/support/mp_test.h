/* Shared test helpers: leak snapshots (fds, /dev/shm segments, mappings,
 * children) and cleanup of helper processes. Used with cmocka:
 *
 *   static int setup(void **state) { return mp_test_setup(state); }
 *   static int teardown(void **state) { return mp_test_teardown(state); }
 *   cmocka_unit_test_setup_teardown(test_x, setup, teardown)
 *
 * teardown kills and reaps every child still alive, then fails the test if
 * any fd, mproc /dev/shm segment, mapping or child outlived it. */
#ifndef MP_TEST_H
#define MP_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "mproc.h"

typedef struct mp_test_snapshot {
    int fds;       /* entries in /proc/self/fd */
    int shm;       /* /dev/shm "mproc-" entries created by this process or its children */
    int maps;      /* shared-memory mappings (memfd, /dev/shm) in /proc/self/maps */
    int children;  /* live or zombie processes whose parent is us */
} mp_test_snapshot;

void mp_test_snapshot_take(mp_test_snapshot *s);
/* Waits up to 2 s for the counts to return to `before`; fails the current
 * cmocka test naming what leaked. maps may shrink (never grow). */
void mp_test_assert_no_leaks(const mp_test_snapshot *before);

int mp_test_setup(void **state);
int mp_test_teardown(void **state);
/* mp_test_setup, then the file_descriptor strategy (for tests that count
 * fds or send segments whatever MPROC_SHARING_STRATEGY says). */
int mp_test_setup_fd(void **state);

/* Fixtures for a test run once per start method: the prestate is the
 * method's name ("fork", ...), mp_test_method(state) gives it back; teardown
 * also stops the forkserver (its server is a child too) before the leak check.
 *   cmocka_unit_test_prestate_setup_teardown(t, mp_test_method_setup,
 *                                            mp_test_method_teardown, "spawn") */
int mp_test_method_setup(void **state);
int mp_test_method_teardown(void **state);
const char *mp_test_method(void **state);
/* The cmocka entry of test t run with one start method, and with each. */
#define MP_TEST_ON(t, method)                                                                      \
    cmocka_unit_test_prestate_setup_teardown(t, mp_test_method_setup, mp_test_method_teardown,     \
                                             (void *)(method))
#define MP_TEST_EACH_METHOD(t)                                                                     \
    MP_TEST_ON(t, "fork"), MP_TEST_ON(t, "spawn"), MP_TEST_ON(t, "forkserver")
/* Creates and starts a process running entry(args) with method (default
 * options otherwise); fails the current test on any error. */
mp_process *mp_test_start(const char *entry, mp_msg *args, const char *method);
/* A new message whose payload is a copy of bytes[0..n); fails the test on
 * error. The caller destroys it. */
mp_msg *mp_test_payload_msg(const void *bytes, size_t n);
/* This process's mp_tensor_stats_get counters now; fails the test on error. */
mp_tensor_stats mp_test_tensor_stats(void);

/* One end under test (tests/support/endpoint.c), so that a test runs
 * against a queue and a pipe alike: a queue, or a pipe whose messages are
 * sent on tx and received on rx (duplex: either way). */
typedef struct mp_test_ep {
    mp_queue *q;
    mp_conn *rx, *tx;
} mp_test_ep;
void mp_test_ep_open(mp_test_ep *e, bool queue, bool duplex);
void mp_test_ep_close(mp_test_ep *e);
/* Sends m and destroys it, whatever the outcome. */
int mp_test_ep_send(mp_test_ep *e, mp_msg *m, double timeout);
int mp_test_ep_recv(mp_test_ep *e, mp_msg **m, double timeout);

/* A pipe to say "go" between processes (fork children): pass writes a
 * byte, wait reads one, 0, or -1 after 10 s. */
typedef struct mp_test_gate {
    int fd[2];
} mp_test_gate;
void mp_test_gate_open(mp_test_gate *g);
void mp_test_gate_pass(mp_test_gate *g);
int mp_test_gate_wait(mp_test_gate *g);
void mp_test_gate_close(mp_test_gate *g);

/* Waits for child pid: its wait status. */
int mp_test_reap(pid_t pid);
/* Waits for child pid and fails the test unless it exited with 0. */
void mp_test_expect_exit0(pid_t pid);
/* The same, for at most `seconds`: a child still running then fails the
 * test with a sentence naming it as `what` (the teardown kills it). */
void mp_test_expect_exit0_within(pid_t pid, double seconds, const char *what);
/* pid's state letter from /proc/<pid>/stat ('R', 'S', 'Z', ...); 0 when
 * it cannot be read (the process is gone). */
char mp_test_proc_state(pid_t pid);
/* pid's parent from /proc/<pid>/stat; 0 when it cannot be read. */
pid_t mp_test_parent_of(pid_t pid);

/* SIGKILLs and reaps every child of this process. */
void mp_test_kill_children(void);
int mp_test_count_children(void);
int mp_test_count_fds(void);
int mp_test_count_shm(void);
int mp_test_count_maps(void);

/* assert_int_equal with mp_last_error() in the failure message. A public
 * call's sentence is for its user, so it must not name an internal mp__
 * function (docs/errors.md: the call the user made, the cause, the fix). */
#define assert_mp_ok(expr)                                                         \
    do {                                                                           \
        int mp_test_rc_ = (expr);                                                  \
        if (mp_test_rc_ != 0)                                                      \
            fail_msg("%s -> %s: %s", #expr, mp_err_name(mp_test_rc_), mp_last_error()); \
    } while (0)
#define assert_mp_err(expr, code)                                                  \
    do {                                                                           \
        int mp_test_rc_ = (expr);                                                  \
        if (mp_test_rc_ != (code))                                                 \
            fail_msg("%s -> %s (wanted %s): %s", #expr, mp_err_name(mp_test_rc_),  \
                     mp_err_name(code), mp_last_error());                          \
        if (strncmp(#expr, "mp__", 4) != 0 && strstr(mp_last_error(), "mp__"))    \
            fail_msg("%s: the sentence names an internal function: %s", #expr,     \
                     mp_last_error());                                             \
    } while (0)

#endif
