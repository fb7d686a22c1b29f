/* Figures with their spread: mproc's operation and its primitive taken
 * alternately (so a burst of load hits both), p50/p99 of single-operation
 * samples for latencies, the median of repetitions for throughputs, and the
 * CPUs the processes ran on, stated in every line. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench.h"

#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char placement[256];

void bench_set_placement(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(placement, sizeof placement, fmt, ap);
    va_end(ap);
}

/* "0-1" or "0,2,5" */
static void cpu_list(const cpu_set_t *set, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE && n + 16 < cap; c++) {
        if (!CPU_ISSET(c, set))
            continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
            e++;
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", n ? "," : "", c);
        if (e > c)
            n += (size_t)snprintf(buf + n, cap - n, "-%d", e);
        c = e;
    }
}

size_t bench_placement_text(char *buf, size_t cap)
{
    cpu_set_t set;
    char cpus[128];
    if (placement[0])
        return (size_t)snprintf(buf, cap, "%s", placement);
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return (size_t)snprintf(buf, cap, "not stated");
    cpu_list(&set, cpus, sizeof cpus);
    if (CPU_COUNT(&set) == 1)
        return (size_t)snprintf(buf, cap, "main process on cpu %s; helpers: not stated", cpus);
    return (size_t)snprintf(buf, cap, "unpinned (cpus %s)", cpus);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

bench_stats bench_stats_of(double *v, size_t n)
{
    bench_stats s = {0, 0, (int)n};
    if (n == 0)
        return s;
    qsort(v, n, sizeof *v, cmp_double);
    s.p50 = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    size_t rank = (size_t)ceil(0.99 * (double)n);
    s.p99 = v[rank ? rank - 1 : 0];
    return s;
}

/* One timed call of fn (iters operations): us per operation, or -1. */
static double timed(bench_fn fn, void *ctx, size_t iters)
{
    uint64_t t0 = bench_now_ns();
    if (fn(ctx, iters) != 0)
        return -1;
    return (double)(bench_now_ns() - t0) / 1e3 / (double)iters;
}

/* n timed calls of a and of b, alternating which goes first. */
static int alternate(bench_fn a, void *actx, bench_fn b, void *bctx, size_t iters, size_t n,
                     double *va, double *vb)
{
    for (size_t i = 0; i < n; i++) {
        bool a_first = i % 2 == 0;
        double x = timed(a_first ? a : b, a_first ? actx : bctx, iters);
        double y = timed(a_first ? b : a, a_first ? bctx : actx, iters);
        if (x < 0 || y < 0)
            return -1;
        va[i] = a_first ? x : y;
        vb[i] = a_first ? y : x;
    }
    return 0;
}

static int pair(bench_fn a, void *actx, bench_fn b, void *bctx, size_t iters, size_t n,
                size_t warm, bench_stats *sa, bench_stats *sb)
{
    double *va = malloc(n * sizeof *va), *vb = malloc(n * sizeof *vb);
    int rc = -1;
    if (!va || !vb)
        goto out;
    for (size_t i = 0; i < warm; i++)
        if (a(actx, iters) != 0 || b(bctx, iters) != 0)
            goto out;
    if (alternate(a, actx, b, bctx, iters, n, va, vb) != 0)
        goto out;
    *sa = bench_stats_of(va, n);
    *sb = bench_stats_of(vb, n);
    rc = 0;
out:
    free(va);
    free(vb);
    return rc;
}

int bench_latency_pair(bench_fn a, void *actx, bench_fn b, void *bctx, size_t n,
                       const bench_opts *o, bench_stats *sa, bench_stats *sb)
{
    (void)o;
    if (n == 0)
        n = 1;
    return pair(a, actx, b, bctx, 1, n, n / 20 + 1, sa, sb);
}

int bench_throughput_pair(bench_fn a, void *actx, bench_fn b, void *bctx, size_t iters,
                          const bench_opts *o, bench_stats *sa, bench_stats *sb)
{
    size_t reps = o->reps < 1 ? 1 : (size_t)o->reps;
    return pair(a, actx, b, bctx, iters ? iters : 1, reps, (size_t)o->warmup, sa, sb);
}

void bench_emit_stats(const char *op, const char *kind, const bench_stats *m,
                      const char *primitive_name, const bench_stats *p)
{
    char o[512], pn[512], k[64], where[300], wj[640];
    bench_json_string(o, sizeof o, op);
    bench_json_string(pn, sizeof pn, primitive_name);
    bench_json_string(k, sizeof k, kind);
    bench_placement_text(where, sizeof where);
    bench_json_string(wj, sizeof wj, where);
    printf("{\"op\":%s,\"unit\":\"us\",\"mproc\":%.6g,\"primitive_name\":%s,"
           "\"primitive\":%.6g,\"ratio\":%.6g,\"kind\":%s,\"mproc_p99\":%.6g,"
           "\"primitive_p99\":%.6g,\"samples\":%d,\"placement\":%s}\n",
           o, m->p50, pn, p->p50, p->p50 > 0 ? m->p50 / p->p50 : 0.0, k, m->p99, p->p99,
           m->n < p->n ? m->n : p->n, wj);
    fflush(stdout);
}
