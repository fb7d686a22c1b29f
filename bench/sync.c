/* bench_sync: mproc's Lock and Semaphore beside raw futexes, same run, the
 * two sides taken alternately.
 *
 *   lock acquire+release, uncontended      vs a futex mutex (Drepper's), uncontended
 *   lock acquire+release, 2 procs contend  vs the futex mutex, 2 procs contend
 *   semaphore handoff round trip, 2 procs  vs a futex ping-pong round trip
 *
 * Contention is checked, not assumed: both processes hammer the lock for
 * the same window (the parent waits until the child is in its loop), the
 * figure is the time per acquisition over the acquisitions of both, and
 * stderr reports how often the raw mutex was found held and how many times
 * each process slept (voluntary context switches), which is what makes a
 * contended lock slower than an uncontended one. */
#include "bench.h"
#include "mproc.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

enum { GO_IDLE = 0, GO_MP = 1, GO_RAW = 2, GO_EXIT = 3 };

typedef struct shared {
    _Atomic uint32_t mutex;   /* raw futex mutex: 0 free, 1 locked, 2 contended */
    char pad0[60];
    _Atomic uint32_t turn;    /* raw ping-pong word */
    char pad1[60];
    _Atomic uint32_t go;      /* what the contending child does (GO_*) */
    _Atomic uint32_t running; /* the child is in its loop */
    _Atomic uint64_t child_ops;
    _Atomic uint64_t held;    /* raw mutex found held (both processes) */
    _Atomic long child_sleeps;
    long counter;
} shared;

static shared *sh;
/* Work done while holding the lock in the contended runs: 0, or enough to
 * keep the lock held for a while, so that the other process finds it held
 * and must sleep (the futex slow path, which a 0-length hold rarely
 * reaches: then only the cache line moves between the CPUs). */
static volatile unsigned hold_work;

static void hold(void)
{
    for (unsigned k = hold_work; k > 0; k--)
        __asm__ volatile("" ::: "memory");
}
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

/* Called through a function, as a library's lock is. */
__attribute__((noinline)) static void raw_lock(_Atomic uint32_t *m, uint64_t *held)
{
    uint32_t c = 0;
    if (atomic_compare_exchange_strong(m, &c, 1))
        return;
    (*held)++;
    if (c != 2)
        c = atomic_exchange(m, 2);
    while (c != 0) {
        futex_wait(m, 2);
        c = atomic_exchange(m, 2);
    }
}

__attribute__((noinline)) static void raw_unlock(_Atomic uint32_t *m)
{
    if (atomic_fetch_sub(m, 1) != 1) {
        atomic_store(m, 0);
        futex_wake(m, 1);
    }
}

static int mp_lock_loop(void *ctx, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        if (mp_lock_lock(lock, -1) != 0)
            return 1;
        sh->counter++;
        hold();
        mp_lock_unlock(lock);
    }
    return 0;
}

static int raw_lock_loop(void *ctx, size_t n)
{
    uint64_t held = 0;
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        raw_lock(&sh->mutex, &held);
        sh->counter++;
        hold();
        raw_unlock(&sh->mutex);
    }
    atomic_fetch_add(&sh->held, held);
    return 0;
}

static long sleeps(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_nvcsw;
}

/* The contending child: waits for a GO_* word, hammers that lock in
 * batches of 64 until the word changes, counts what it did. */
static pid_t contender(void)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    bench_pin_cpu(1);
    for (;;) {
        uint32_t go = atomic_load(&sh->go);
        if (go == GO_EXIT)
            _exit(0);
        if (go == GO_IDLE) {
            futex_wait(&sh->go, GO_IDLE);
            continue;
        }
        long s0 = sleeps();
        atomic_store(&sh->running, 1);
        while (atomic_load(&sh->go) == go) {
            if ((go == GO_RAW ? raw_lock_loop : mp_lock_loop)(NULL, 64) != 0) {
                fprintf(stderr, "bench_sync: contending child: %s\n", mp_last_error());
                _exit(1);
            }
            atomic_fetch_add(&sh->child_ops, 64);
        }
        atomic_fetch_add(&sh->child_sleeps, sleeps() - s0);
        atomic_store(&sh->running, 0);
    }
}

typedef struct contention {
    double us;    /* per acquisition, both processes together */
    double share; /* of the acquisitions, the child's */
    long sleeps;  /* both processes */
} contention;

/* One window: the child starts, the parent does n acquisitions once the
 * child is in its loop; the child's acquisitions in the window count. */
static pid_t contender_pid;

static int contend_once(bool raw, size_t n, contention *c)
{
    long s0 = sleeps(), cs0 = atomic_load(&sh->child_sleeps);
    atomic_store(&sh->go, raw ? GO_RAW : GO_MP);
    futex_wake(&sh->go, 1);
    /* Timed only once the child has made progress: started is not running. */
    uint64_t start = atomic_load(&sh->child_ops);
    while (!atomic_load(&sh->running) || atomic_load(&sh->child_ops) == start) {
        if (waitpid(contender_pid, NULL, WNOHANG) != 0) {
            fprintf(stderr, "bench_sync: the contending child is gone\n");
            return -1;
        }
        sched_yield();
    }
    uint64_t c0 = atomic_load(&sh->child_ops), t0 = bench_now_ns();
    int rc = (raw ? raw_lock_loop : mp_lock_loop)(NULL, n);
    uint64_t t1 = bench_now_ns(), c1 = atomic_load(&sh->child_ops);
    atomic_store(&sh->go, GO_IDLE);
    while (atomic_load(&sh->running))
        sched_yield();
    c->us = (double)(t1 - t0) / 1e3 / (double)(n + (c1 - c0));
    c->share = (double)(c1 - c0) / (double)(n + (c1 - c0));
    c->sleeps = sleeps() - s0 + atomic_load(&sh->child_sleeps) - cs0;
    return rc;
}

static void contended(const char *op, const char *prim, size_t n, const bench_opts *o)
{
    int reps = o->reps < 1 ? 1 : o->reps > 1000 ? 1000 : o->reps;
    double m[1000], p[1000], mshare = 0, pshare = 0;
    long msl = 0, psl = 0;
    contention c;
    atomic_store(&sh->go, GO_IDLE); /* not a previous run's GO_EXIT */
    atomic_store(&sh->running, 0);
    pid_t pid = contender_pid = contender();
    uint64_t held0;
    if (contend_once(false, n, &c) != 0 || contend_once(true, n, &c) != 0) /* warm-up */
        goto out;
    held0 = atomic_load(&sh->held);
    for (int i = 0; i < reps; i++) {
        for (int k = 0; k < 2; k++) {
            bool raw = (i + k) % 2 == 1;
            if (contend_once(raw, n, &c) != 0)
                goto out;
            (raw ? p : m)[i] = c.us;
            *(raw ? &pshare : &mshare) += c.share / reps;
            *(raw ? &psl : &msl) += c.sleeps;
        }
    }
    bench_stats sm = bench_stats_of(m, (size_t)reps), sp = bench_stats_of(p, (size_t)reps);
    bench_emit_stats(op, "throughput", &sm, prim, &sp);
    fprintf(stderr,
            "%s: mproc %.3f us, futex %.3f us per acquisition (both processes); the "
            "child made %.0f%% / %.0f%% of them; sleeps per 1000 acquisitions: mproc %.2f, "
            "futex %.2f; the raw mutex was found held in %.1f%% of its acquisitions\n",
            op, sm.p50, sp.p50, 100 * mshare, 100 * pshare,
            1000.0 * (double)msl / ((double)reps * (double)n / (1 - mshare)),
            1000.0 * (double)psl / ((double)reps * (double)n / (1 - pshare)),
            100.0 * (double)(atomic_load(&sh->held) - held0) /
                ((double)reps * (double)n / (1 - pshare)));
out:
    atomic_store(&sh->go, GO_EXIT);
    futex_wake(&sh->go, 1);
    waitpid(pid, NULL, 0);
}

/* Ping-pong: the parent hands a token to the child and waits for it back. */
static int mp_pingpong(void *ctx, size_t n)
{
    (void)ctx;
    for (size_t i = 0; i < n; i++)
        if (mp_semaphore_post(ping) || mp_semaphore_wait(pong, 10))
            return 1;
    return 0;
}

static int raw_pingpong(void *ctx, size_t n)
{
    (void)ctx;
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
            if (mp_semaphore_wait(ping, -1) != 0)
                _exit(1);
            if (atomic_load(&sh->go) == GO_EXIT)
                _exit(0);
            mp_semaphore_post(pong);
        }
    }
}

static void pingpong(size_t n, const bench_opts *o)
{
    bench_stats m, p;
    pid_t pm, pr;
    atomic_store(&sh->go, GO_IDLE);
    atomic_store(&sh->turn, 0);
    pm = ponger(false);
    pr = ponger(true);
    if (bench_latency_pair(mp_pingpong, NULL, raw_pingpong, NULL, n, o, &m, &p) == 0) {
        bench_emit_stats("semaphore handoff round trip, 2 processes", "latency", &m,
                         "futex ping-pong round trip", &p);
        fprintf(stderr, "handoff: mproc p50 %.3f p99 %.3f us, futex p50 %.3f p99 %.3f us\n",
                m.p50, m.p99, p.p50, p.p99);
    }
    atomic_store(&sh->go, GO_EXIT);
    mp_semaphore_post(ping);
    atomic_store(&sh->turn, 2);
    futex_wake(&sh->turn, 1);
    waitpid(pm, NULL, 0);
    waitpid(pr, NULL, 0);
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_stats m, p;
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
    size_t n = bench_iters(&o, 1000000), nc = bench_iters(&o, 2000000),
           np = bench_iters(&o, 5000);

    bench_set_placement("one process, on cpu %d", bench_cpu_of_slot(0));
    if (bench_throughput_pair(mp_lock_loop, NULL, raw_lock_loop, NULL, n, &o, &m, &p) != 0)
        return 1;
    bench_emit_stats("lock acquire+release, uncontended", "throughput", &m,
                     "futex mutex, uncontended", &p);
    fprintf(stderr, "uncontended: mproc %.4f us, futex %.4f us (median of %d)\n", m.p50, p.p50,
            m.n);

    bench_set_placement("parent on cpu %d, contending child on cpu %d", bench_cpu_of_slot(0),
                        bench_cpu_of_slot(1));
    contended("lock acquire+release, 2 processes contending",
              "futex mutex, 2 processes contending", nc, &o);
    hold_work = 400; /* about 0.2-0.4 us held */
    contended("lock acquire+release, 2 processes contending, ~0.3 us held",
              "futex mutex, same", nc / 20, &o);
    hold_work = 0;

    bench_set_placement("parent on cpu %d, echo child on cpu %d", bench_cpu_of_slot(0),
                        bench_cpu_of_slot(1));
    pingpong(np, &o);

    mp_semaphore_release(ping);
    mp_semaphore_release(pong);
    mp_lock_release(lock);
    munmap(sh, sizeof *sh);
    return 0;
}
