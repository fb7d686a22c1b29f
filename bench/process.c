/* bench_process: process start-up and failure notification.
 *
 * - start+join of 1 and of 8 processes under each start method, beside the
 *   bare primitive under it: fork+waitpid (fork, forkserver) and
 *   posix_spawn+waitpid of this same binary (spawn);
 * - failure notification: from a child's mp_raise to the return of the
 *   parent's mp_spawn_context_join (the failure recorded, the sibling
 *   terminated and both reaped), beside the same work done with bare system
 *   calls: one child writes a record to a socket and exits, the parent's
 *   poll wakes, reads it, SIGTERMs the other child and reaps both.
 *
 * Every figure is a latency: one sample is one start+join (or one failure),
 * mproc's and the primitive's samples alternate, p50 and p99 are reported.
 * Nothing is pinned: the parent and its children go where the scheduler
 * puts them, as they would in a program (see docs/performance.md).
 */
#include "bench.h"

#include <mproc.h>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static char *self_argv0;

MP_ENTRY(b_noop)
{
    return 0;
}

/* Once both ranks run (the barrier in args: so the parent is done starting
 * them), rank 0 fails, stamping the time into its message; rank 1 waits. */
MP_ENTRY(b_fail)
{
    mp_barrier *b = NULL;
    if (mp_msg_get_barrier(args, 0, &b) != 0 || mp_barrier_wait(b, 30, NULL) < 0)
        return 3;
    mp_barrier_release(b);
    if (rank == 0)
        mp_raise("%llu", (unsigned long long)bench_now_ns());
    for (;;)
        pause();
}

typedef struct run {
    const char *method;
    int n;
} run;

static int mproc_start_join(void *ctx, size_t iters)
{
    run *r = ctx;
    mp_process_options o;
    mp_process *ps[8];
    mp_process_options_init(&o);
    o.start_method = r->method;
    for (size_t it = 0; it < iters; it++) {
        int code = -1;
        for (int k = 0; k < r->n; k++)
            if (mp_process_create("b_noop", NULL, &o, &ps[k]) || mp_process_start(ps[k]))
                goto fail;
        for (int k = 0; k < r->n; k++) {
            if (mp_process_join(ps[k], -1) || mp_process_exitcode(ps[k], &code) || code)
                goto fail;
            mp_process_destroy(ps[k]);
        }
    }
    return 0;
fail:
    fprintf(stderr, "bench_process: %s start+join failed: %s\n", r->method, mp_last_error());
    return -1;
}

static int fork_waitpid(void *ctx, size_t iters)
{
    run *r = ctx;
    pid_t pids[8];
    for (size_t it = 0; it < iters; it++) {
        for (int k = 0; k < r->n; k++)
            if ((pids[k] = fork()) == 0)
                _exit(0);
        for (int k = 0; k < r->n; k++)
            waitpid(pids[k], NULL, 0);
    }
    return 0;
}

static int posix_spawn_waitpid(void *ctx, size_t iters)
{
    run *r = ctx;
    pid_t pids[8];
    char *argv[] = {self_argv0, "--noop", NULL};
    for (size_t it = 0; it < iters; it++) {
        for (int k = 0; k < r->n; k++)
            if (posix_spawn(&pids[k], "/proc/self/exe", NULL, NULL, argv, environ) != 0) {
                perror("posix_spawn");
                return -1;
            }
        for (int k = 0; k < r->n; k++)
            waitpid(pids[k], NULL, 0);
    }
    return 0;
}

/* Microseconds from mp_raise in a child to the parent's join returning. */
static double failure_latency_us(const char *method)
{
    mp_spawn_context *ctx = NULL;
    mp_child_error e = {.size = sizeof e};
    mp_barrier *b = NULL;
    mp_msg *args = NULL;
    uint64_t t1;
    int rc = mp_barrier_create(2, &b) || mp_msg_create(&args) ||
             mp_msg_add_barrier(args, "go", b) ||
             mp_spawn("b_fail", args, 2, false, false, method, &ctx);
    mp_msg_destroy(args);
    mp_barrier_release(b);
    if (rc != 0)
        return -1;
    if (mp_spawn_context_join(ctx, 30) != MP_ECHILD) {
        mp_spawn_context_destroy(ctx);
        return -1;
    }
    t1 = bench_now_ns();
    mp_spawn_context_error(ctx, &e);
    mp_spawn_context_destroy(ctx);
    return (double)(t1 - strtoull(e.message, NULL, 10)) / 1e3;
}

/* The same work with bare calls: two forked children, one stamps and
 * writes a record then exits 1, the other waits; the parent's poll wakes on
 * the record, it reads it, SIGTERMs the other and reaps both. wake_us gets
 * the part up to the poll's wake-up alone. */
static double record_latency_us(double *wake_us)
{
    int sv[2];
    uint64_t t0 = 0, t1, t2;
    struct pollfd p;
    pid_t pid, other;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return -1;
    other = fork();
    if (other == 0)
        for (;;)
            pause();
    pid = fork();
    if (pid == 0) {
        t0 = bench_now_ns();
        (void)!write(sv[1], &t0, sizeof t0);
        _exit(1);
    }
    p = (struct pollfd){.fd = sv[0], .events = POLLIN};
    poll(&p, 1, -1);
    t1 = bench_now_ns();
    (void)!read(sv[0], &t0, sizeof t0);
    kill(other, SIGTERM);
    waitpid(pid, NULL, 0);
    waitpid(other, NULL, 0);
    t2 = bench_now_ns();
    close(sv[0]);
    close(sv[1]);
    *wake_us = (double)(t1 - t0) / 1e3;
    return (double)(t2 - t0) / 1e3;
}

static void latency(const char *method, const bench_opts *o)
{
    enum { MAX = 41 };
    int reps = o->quick ? 3 : MAX;
    double m[MAX], p[MAX], w[MAX];
    char op[96];
    for (int i = 0; i < reps; i++) {
        m[i] = failure_latency_us(method);
        p[i] = record_latency_us(&w[i]);
        if (m[i] < 0 || p[i] < 0) {
            fprintf(stderr, "bench_process: latency (%s) failed: %s\n", method, mp_last_error());
            return;
        }
    }
    bench_stats sm = bench_stats_of(m, (size_t)reps), sp = bench_stats_of(p, (size_t)reps),
                sw = bench_stats_of(w, (size_t)reps);
    snprintf(op, sizeof op, "failure notification, mp_raise -> join returns (%s, 2 procs)", method);
    bench_emit_stats(op, "latency", &sm, "record -> poll wakes, SIGTERM the other, reap both",
                     &sp);
    fprintf(stderr, "failure (%s): mproc p50 %.1f us; bare record -> poll wake-up alone p50 "
                    "%.1f us (ratio %.2f against it)\n",
            method, sm.p50, sw.p50, sm.p50 / sw.p50);
}

/* With 128 MiB of touched heap, fork pays for copying the page tables;
 * spawn (vfork + exec) does not. */
static void big_heap(const bench_opts *o)
{
    size_t bytes = (size_t)(o->quick ? 8 : 128) << 20;
    char *heap = malloc(bytes);
    if (!heap)
        return;
    memset(heap, 1, bytes);
    for (int i = 0; i < 2; i++) {
        run r = {i == 0 ? "fork" : "spawn", 1};
        bench_stats m, p;
        char op[96];
        if (bench_latency_pair(mproc_start_join, &r, i == 0 ? fork_waitpid : posix_spawn_waitpid,
                               &r, bench_iters(o, 60), o, &m, &p) != 0)
            break;
        snprintf(op, sizeof op, "start+join 1 process (%s, parent with %zu MiB touched heap)",
                 r.method, bytes >> 20);
        bench_emit_stats(op, "latency", &m, i == 0 ? "fork+waitpid" : "posix_spawn+waitpid", &p);
    }
    free(heap);
}

int main(int argc, char **argv)
{
    static const char *const methods[] = {"fork", "spawn", "forkserver"};
    bench_opts o;
    if (mp_setup(&argc, &argv) != 0)
        return 2;
    if (argc == 2 && strcmp(argv[1], "--noop") == 0)
        return 0; /* the posix_spawn primitive's child */
    int rc = bench_parse_args(argc, argv,
                              "process start+join per start method, and failure "
                              "notification latency",
                              &o);
    if (rc)
        return rc > 0 ? 0 : 2;
    self_argv0 = argv[0];
    char cpus[32];
    snprintf(cpus, sizeof cpus, "%d-%d", bench_cpu_of_slot(0), bench_cpu_of_slot(1));
    if (mp_forkserver_start() != 0) {
        fprintf(stderr, "bench_process: %s\n", mp_last_error());
        return 1;
    }
    bench_set_placement("unpinned (cpus %s): parent and children where the scheduler puts "
                        "them", cpus);
    for (int n = 1; n <= 8; n += 7)
        for (int i = 0; i < 3; i++) {
            run r = {methods[i], n};
            bool exec = strcmp(methods[i], "spawn") == 0;
            size_t samples = bench_iters(&o, (exec ? 300 : 800) / (size_t)n);
            bench_stats m, p;
            char op[64];
            if (bench_latency_pair(mproc_start_join, &r, exec ? posix_spawn_waitpid : fork_waitpid,
                                   &r, samples, &o, &m, &p) != 0)
                return 1;
            snprintf(op, sizeof op, "start+join %d process%s (%s)", n, n > 1 ? "es" : "",
                     methods[i]);
            bench_emit_stats(op, "latency", &m, exec ? "posix_spawn+waitpid" : "fork+waitpid",
                             &p);
        }
    for (int i = 0; i < 3; i++)
        latency(methods[i], &o);
    big_heap(&o);
    mp_forkserver_stop();
    return 0;
}
