/* One meaning of a timeout for every blocking call (docs/errors.md#timeouts):
 * 0 polls and fails with MP_ETIMEDOUT when not ready, 0.05 waits that long
 * and fails with MP_ETIMEDOUT, a negative timeout (or +inf) waits until
 * another thread or process makes the object ready, NaN fails with
 * MP_EINVAL at once and leaves the object as it was. One table, one row per
 * call (blocking_calls.c). Then the same calls with a signal handler
 * running every millisecond in the waiting thread: no call ends early or
 * fails for it (docs/errors.md#signals). */
#include "blocking_calls.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct later {
    const row *r;
    fx *f;
} later;

static void *ready_later(void *arg)
{
    later *l = arg;
    usleep(100 * 1000);
    l->r->ready(l->f);
    return NULL;
}

/* Each check cleans up before it reports, so that a failing row cannot
 * leave a blocked thread or child behind to hang the run. */
static char failures[4096];

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    size_t n = strlen(failures);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failures + n, sizeof failures - n, fmt, ap);
    va_end(ap);
}

static void check_finite(const row *r, double timeout)
{
    fx f;
    setup_fx(&f, r);
    double t0 = now();
    int rc = r->call(&f, timeout);
    double took = now() - t0;
    if (rc != r->not_ready)
        note("%s, timeout %g: %d %s (wanted %d): %s\n", r->name, timeout, rc, mp_err_name(rc),
             r->not_ready, mp_last_error());
    /* generous upper bound: a loaded machine may be slow, never early */
    else if (timeout > 0 && took < timeout * 0.9)
        note("%s, timeout %g: gave up after %.3f s\n", r->name, timeout, took);
    else if (took > timeout + 5)
        note("%s, timeout %g: took %.3f s\n", r->name, timeout, took);
    r->ready(&f);
    teardown_fx(&f);
}

/* NaN is refused before the call acts: a second call that polls still
 * finds the object not ready (nothing was taken, put or broken). */
static void check_nan(const row *r)
{
    fx f;
    setup_fx(&f, r);
    double t0 = now();
    int rc = r->call(&f, NAN);
    double took = now() - t0;
    if (rc != MP_EINVAL || !strstr(mp_last_error(), "NaN"))
        note("%s, timeout NaN: %d %s (wanted MP_EINVAL): %s\n", r->name, rc, mp_err_name(rc),
             mp_last_error());
    else if (took > 1)
        note("%s, timeout NaN: took %.3f s to refuse it\n", r->name, took);
    else if ((rc = r->call(&f, 0)) != r->not_ready)
        note("%s, poll after NaN: %s (wanted %d): %s\n", r->name, mp_err_name(rc),
             r->not_ready, mp_last_error());
    r->ready(&f);
    teardown_fx(&f);
}

static void check_forever(const row *r, double timeout)
{
    fx f;
    pthread_t th;
    setup_fx(&f, r);
    later l = {r, &f};
    assert_int_equal(pthread_create(&th, NULL, ready_later, &l), 0);
    int rc = r->call(&f, timeout);
    pthread_join(th, NULL);
    if (rc != 0)
        note("%s, timeout %g: %s: %s\n", r->name, timeout, mp_err_name(rc), mp_last_error());
    teardown_fx(&f);
}

/* A row whose objects left a shared mapping behind names itself, instead
 * of the whole test failing in teardown with a bare count (it did once,
 * under load, and could not be traced to a row). */
static void check_maps(const row *r, int before)
{
    int now = mp_test_count_maps();
    for (int i = 0; i < 100 && now > before; i++) {
        usleep(20 * 1000);
        now = mp_test_count_maps();
    }
    if (now > before)
        note("%s: shared mappings %d -> %d after its objects were released\n", r->name,
             before, now);
}

/* The library's warnings (a mapping kept, a cleanup that failed) go into
 * the test's output, where they explain a leak the teardown finds. */
static void print_warning(int level, const char *line, void *user)
{
    (void)user;
    if (level <= MP_LOG_WARN)
        fprintf(stderr, "mproc log: %s\n", line);
}

static void test_every_blocking_call(void **state)
{
    failures[0] = '\0';
    mp_set_log_hook(print_warning, NULL);
    for (size_t i = 0; i < blocking_calls_n; i++) {
        const row *r = &blocking_calls[i];
        int maps = mp_test_count_maps();
        if (r->timeouts != FOREVER_ONLY) {
            check_finite(r, 0);
            check_finite(r, 0.05);
        }
        if (r->timeouts == TIMED)
            check_nan(r);
        check_forever(r, -1);
        if (r->timeouts != FOREVER_ONLY)
            check_forever(r, INFINITY);
        check_maps(r, maps);
    }
    mp_set_log_hook(NULL, NULL);
    if (failures[0])
        fail_msg("%s", failures);
}

/* A thread that interrupts the waiting thread with SIGUSR1 every
 * millisecond. The handler is installed without SA_RESTART, so each
 * signal makes the system call under the wait fail with EINTR. */
static volatile sig_atomic_t signals_seen;
static volatile int storm_on;

static void count_signal(int sig)
{
    (void)sig;
    signals_seen++;
}

static void *storm_main(void *arg)
{
    pthread_t target = *(pthread_t *)arg;
    while (__atomic_load_n(&storm_on, __ATOMIC_SEQ_CST)) {
        pthread_kill(target, SIGUSR1);
        usleep(1000);
    }
    return NULL;
}

static void test_every_blocking_call_under_signals(void **state)
{
    struct sigaction sa = {.sa_handler = count_signal}, old;
    pthread_t self = pthread_self(), storm;
    failures[0] = '\0';
    assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
    __atomic_store_n(&storm_on, 1, __ATOMIC_SEQ_CST);
    assert_int_equal(pthread_create(&storm, NULL, storm_main, &self), 0);
    for (size_t i = 0; i < blocking_calls_n; i++) {
        const row *r = &blocking_calls[i];
        sig_atomic_t before = signals_seen;
        if (r->timeouts != FOREVER_ONLY)
            check_finite(r, 0.2);
        check_forever(r, -1);
        if (signals_seen - before < 20)
            note("%s: only %d signals arrived while it waited\n", r->name,
                 (int)(signals_seen - before));
    }
    __atomic_store_n(&storm_on, 0, __ATOMIC_SEQ_CST);
    pthread_join(storm, NULL);
    assert_int_equal(sigaction(SIGUSR1, &old, NULL), 0);
    if (failures[0])
        fail_msg("%s", failures);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_blocking_call, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_every_blocking_call_under_signals, mp_test_setup,
                                        mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
