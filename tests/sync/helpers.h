/* Helpers shared by the tests in tests/sync: forked helper children, a
 * shared page, naps, and the warm-up that keeps leak snapshots honest. */
#ifndef MP_SYNC_TEST_HELPERS_H
#define MP_SYNC_TEST_HELPERS_H

#include "mp_test.h"
#include "os/os.h"

#include <math.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline int setup(void **state) { return mp_test_setup(state); }
static inline int teardown(void **state)
{
    mp__sys_fault_reset();
    return mp_test_teardown(state);
}

/* ---- helpers ------------------------------------------------------------- */

static inline pid_t fork_child(int (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn(arg));
    return pid;
}

/* Exit code, or 128 + signal. */
static inline int reap(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static inline void *shared_page(void)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

static inline void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

static inline void *warm_thread(void *p) { return p; }

/* glibc caches a joined thread's stack, ASan maps allocator regions on
 * first use, and the first fork sets up more: do all of it before the leak
 * snapshots, so that tests which start threads or children do not look
 * leaky. */
static inline void warm_up(void)
{
    pthread_t th;
    mp_lock *warm;
    pid_t pid;
    if (pthread_create(&th, NULL, warm_thread, NULL) == 0)
        pthread_join(th, NULL);
    if (mp_lock_create(&warm) == 0) {
        mp_lock_lock(warm, 0);
        mp_lock_unlock(warm);
        mp_lock_release(warm);
    }
    pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

#endif
