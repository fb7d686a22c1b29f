/* bench_process: process start-up and failure notification.
 *
 * - start+join of 1 and of 8 processes under each start method, beside the
 *   bare primitive under it: fork+waitpid (fork, forkserver) and
 *   posix_spawn+waitpid of this same binary (spawn);
 * - failure notification: from a child's mp_raise to the return of the
 *   parent's mp_spawn_context_join (the sibling terminated and everything
 *   reaped), beside a child writing one record to a socket and the parent's
 *   poll waking on it.
 */
#include "bench.h"

#include <mproc.h>

#include <poll.h>
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

/* rank 0 fails at once, stamping the time into its message; rank 1 waits. */
MP_ENTRY(b_fail)
{
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
    uint64_t t1;
    if (mp_spawn("b_fail", NULL, 2, false, false, method, &ctx) != 0)
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

/* The bare primitive: a child writes one stamped record, the parent's poll
 * wakes and reads it, then reaps the child. */
static double record_latency_us(void)
{
    int sv[2];
    uint64_t t0 = 0, t1;
    struct pollfd p;
    pid_t pid;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return -1;
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
    waitpid(pid, NULL, 0);
    close(sv[0]);
    close(sv[1]);
    return (double)(t1 - t0) / 1e3;
}

static void latency(const char *method, const bench_opts *o)
{
    int reps = o->quick ? 3 : 21;
    double m[21], p[21];
    char op[96];
    for (int i = 0; i < reps; i++) {
        m[i] = failure_latency_us(method);
        p[i] = record_latency_us();
        if (m[i] < 0 || p[i] < 0) {
            fprintf(stderr, "bench_process: latency (%s) failed: %s\n", method, mp_last_error());
            return;
        }
    }
    snprintf(op, sizeof op, "failure notification, mp_raise -> join returns (%s, 2 procs)", method);
    bench_emit(op, bench_median(m, (size_t)reps), "child record -> poll wakes",
               bench_median(p, (size_t)reps));
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
        size_t iters = bench_iters(o, 20);
        char op[96];
        double mp = bench_measure_us(mproc_start_join, &r, iters, o);
        double pr = bench_measure_us(i == 0 ? fork_waitpid : posix_spawn_waitpid, &r, iters, o);
        if (mp < 0 || pr < 0)
            break;
        snprintf(op, sizeof op, "start+join 1 process (%s, parent with %zu MiB touched heap)",
                 r.method, bytes >> 20);
        bench_emit(op, mp, i == 0 ? "fork+waitpid" : "posix_spawn+waitpid", pr);
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
    if (bench_parse_args(argc, argv,
                         "process start+join per start method, and failure "
                         "notification latency",
                         &o) != 0)
        return 2;
    self_argv0 = argv[0];
    if (mp_forkserver_start() != 0) {
        fprintf(stderr, "bench_process: %s\n", mp_last_error());
        return 1;
    }
    for (int n = 1; n <= 8; n += 7)
        for (int i = 0; i < 3; i++) {
            run r = {methods[i], n};
            bool exec = strcmp(methods[i], "spawn") == 0;
            size_t iters = bench_iters(&o, (exec ? 40 : 100) / (size_t)n + 2);
            char op[64];
            double mp = bench_measure_us(mproc_start_join, &r, iters, &o);
            double pr = bench_measure_us(exec ? posix_spawn_waitpid : fork_waitpid, &r, iters, &o);
            if (mp < 0 || pr < 0)
                return 1;
            snprintf(op, sizeof op, "start+join %d process%s (%s)", n, n > 1 ? "es" : "",
                     methods[i]);
            bench_emit(op, mp, exec ? "posix_spawn+waitpid" : "fork+waitpid", pr);
        }
    for (int i = 0; i < 3; i++)
        latency(methods[i], &o);
    big_heap(&o);
    mp_forkserver_stop();
    return 0;
}
