/* bench_sync: mproc's Lock and Semaphore beside raw futexes, same run.
 *
 *   lock acquire+release, uncontended      vs a futex mutex (Drepper's), uncontended
 *   lock acquire+release, 2 procs contend  vs the futex mutex, 2 procs contend
 *   semaphore handoff round trip, 2 procs  vs a futex ping-pong round trip
 */
#include "bench.h"
#include "mproc.h"

#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct shared {
    _Atomic uint32_t mutex;   /* raw futex mutex: 0 free, 1 locked, 2 contended */
    _Atomic uint32_t turn;    /* raw ping-pong word */
    _Atomic uint32_t go;      /* start line for the contending child */
    _Atomic uint32_t stop;
    long counter;
} shared;

static shared *sh;
static mp_lock *lock;
static mp_semaphore *ping, *pong;

static void futex_wait(_Atomic uint32_t *w, uint32_t v)
{
    syscall(SYS_futex, w, FUTEX_WAIT, v, NULL, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *w, int n)
{
    syscall(SYS_futex, w, FUTEX_WAKE, n, NULL, NULL, 0);
}

static void raw_lock(_Atomic uint32_t *m)
{
    uint32_t c = 0;
    if (atomic_compare_exchange_strong(m, &c, 1))
        return;
    if (c != 2)
        c = atomic_exchange(m, 2);
    while (c != 0) {
        futex_wait(m, 2);
        c = atomic_exchange(m, 2);
    }
}

static void raw_unlock(_Atomic uint32_t *m)
{
    if (atomic_fetch_sub(m, 1) != 1) {
        atomic_store(m, 0);
        futex_wake(m, 1);
    }
}

static int mp_lock_loop(void *ctx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (mp_lock_acquire(lock, -1) != 0)
            return 1;
        sh->counter++;
        mp_lock_release(lock);
    }
    return 0;
}

static int raw_lock_loop(void *ctx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        raw_lock(&sh->mutex);
        sh->counter++;
        raw_unlock(&sh->mutex);
    }
    return 0;
}

/* A child that contends with the parent until told to stop. */
static pid_t contender(bool raw)
{
    pid_t pid = fork();
    if (pid == 0) {
        bench_pin_cpu(1);
        while (!atomic_load(&sh->stop)) {
            if (raw)
                raw_lock_loop(NULL, 64);
            else
                mp_lock_loop(NULL, 64);
        }
        _exit(0);
    }
    return pid;
}

static double contended(bool raw, size_t n, const bench_opts *o)
{
    pid_t pid;
    double us;
    atomic_store(&sh->stop, 0);
    pid = contender(raw);
    us = bench_measure_us(raw ? raw_lock_loop : mp_lock_loop, NULL, n, o);
    atomic_store(&sh->stop, 1);
    waitpid(pid, NULL, 0);
    return us;
}

/* Ping-pong: the parent hands a token to the child and waits for it back. */
static int mp_pingpong(void *ctx, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (mp_semaphore_release(ping) || mp_semaphore_acquire(pong, 10))
            return 1;
    return 0;
}

static int raw_pingpong(void *ctx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        atomic_store(&sh->turn, 1);
        futex_wake(&sh->turn, 1);
        while (atomic_load(&sh->turn) == 1)
            futex_wait(&sh->turn, 1);
    }
    return 0;
}

static pid_t ponger(bool raw)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    bench_pin_cpu(1);
    for (;;) {
        if (raw) {
            while (atomic_load(&sh->turn) == 0)
                futex_wait(&sh->turn, 0);
            if (atomic_load(&sh->turn) == 2)
                _exit(0);
            atomic_store(&sh->turn, 0);
            futex_wake(&sh->turn, 1);
        } else {
            if (mp_semaphore_acquire(ping, -1) != 0)
                _exit(1);
            if (atomic_load(&sh->stop))
                _exit(0);
            mp_semaphore_release(pong);
        }
    }
}

static double pingpong(bool raw, size_t n, const bench_opts *o)
{
    pid_t pid;
    double us;
    atomic_store(&sh->stop, 0);
    atomic_store(&sh->turn, 0);
    pid = ponger(raw);
    us = bench_measure_us(raw ? raw_pingpong : mp_pingpong, NULL, n, o);
    atomic_store(&sh->stop, 1);
    if (raw) {
        atomic_store(&sh->turn, 2);
        futex_wake(&sh->turn, 1);
    } else {
        mp_semaphore_release(ping);
    }
    waitpid(pid, NULL, 0);
    return us;
}

int main(int argc, char **argv)
{
    bench_opts o;
    int rc = bench_parse_args(argc, argv, "Lock/Semaphore beside raw futexes", &o);
    if (rc)
        return rc < 0 ? 2 : 0;
    /* Parent on one CPU, each child on the other: see bench_pin_cpu. */
    if (bench_pin_cpu(0) != 0)
        fprintf(stderr, "bench_sync: not pinned (fewer than 2 CPUs)\n");
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || mp_lock_create(&lock) || mp_semaphore_create(0, &ping) ||
        mp_semaphore_create(0, &pong)) {
        fprintf(stderr, "bench_sync: set-up failed: %s\n", mp_last_error());
        return 1;
    }
    size_t n = bench_iters(&o, 1000000), nc = bench_iters(&o, 200000),
           np = bench_iters(&o, 20000);

    double m = bench_measure_us(mp_lock_loop, NULL, n, &o);
    double p = bench_measure_us(raw_lock_loop, NULL, n, &o);
    bench_emit("lock acquire+release, uncontended", m, "futex mutex, uncontended", p);
    fprintf(stderr, "uncontended: mproc %.3f us, futex %.3f us\n", m, p);

    m = contended(false, nc, &o);
    p = contended(true, nc, &o);
    bench_emit("lock acquire+release, 2 processes contending", m,
               "futex mutex, 2 processes contending", p);
    fprintf(stderr, "contended: mproc %.3f us, futex %.3f us\n", m, p);

    m = pingpong(false, np, &o);
    p = pingpong(true, np, &o);
    bench_emit("semaphore handoff round trip, 2 processes", m, "futex ping-pong round trip",
               p);
    fprintf(stderr, "handoff: mproc %.3f us, futex %.3f us\n", m, p);

    mp_semaphore_destroy(ping);
    mp_semaphore_destroy(pong);
    mp_lock_destroy(lock);
    munmap(sh, sizeof *sh);
    return 0;
}
