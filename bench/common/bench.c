#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bench.h"

#include <sched.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int bench_parse_args(int argc, char **argv, const char *what, bench_opts *o)
{
    o->quick = false;
    o->reps = 0;
    o->warmup = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            o->quick = true;
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1000) {
                fprintf(stderr, "%s: --reps wants 1..1000, got '%s'\n", argv[0], argv[i]);
                return -1;
            }
            o->reps = (int)v;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fprintf(stderr,
                    "%s\n"
                    "usage: %s [--quick] [--reps N]\n"
                    "  --quick   tiny counts: a smoke test, the figures mean nothing\n"
                    "  --reps N  timed repetitions per figure (default 7; 2 with --quick)\n"
                    "Prints one JSON line per figure on stdout; see docs/performance.md.\n",
                    what, argv[0]);
            return 1;
        } else {
            fprintf(stderr, "%s: unknown argument '%s' (try --help)\n", argv[0], argv[i]);
            return -1;
        }
    }
    if (o->reps == 0)
        o->reps = o->quick ? 2 : 7;
    return 0;
}

size_t bench_iters(const bench_opts *o, size_t full)
{
    size_t n = o->quick ? full / 1000 : full;
    return n ? n : 1;
}

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double bench_measure_us(bench_fn fn, void *ctx, size_t iters, const bench_opts *o)
{
    double samples[1000];
    int reps = o->reps < 1 ? 1 : o->reps > 1000 ? 1000 : o->reps;
    if (iters == 0)
        iters = 1;
    for (int i = 0; i < o->warmup; i++)
        if (fn(ctx, iters) != 0)
            return -1;
    for (int i = 0; i < reps; i++) {
        uint64_t t0 = bench_now_ns();
        if (fn(ctx, iters) != 0)
            return -1;
        samples[i] = (double)(bench_now_ns() - t0) / 1e3 / (double)iters;
    }
    return bench_median(samples, (size_t)reps);
}

size_t bench_json_string(char *buf, size_t cap, const char *s)
{
    size_t n = 0;
    if (cap < 3) {
        if (cap)
            buf[0] = '\0';
        return 0;
    }
    buf[n++] = '"';
    for (; s && *s && n + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            n += (size_t)snprintf(buf + n, cap - n, "\\%c", c);
        else if (c < 0x20)
            n += (size_t)snprintf(buf + n, cap - n, "\\u%04x", c);
        else
            buf[n++] = (char)c;
    }
    buf[n++] = '"';
    buf[n] = '\0';
    return n;
}

void bench_emit(const char *op, double mproc_us, const char *primitive_name,
                double primitive_us)
{
    char o[512], p[512], where[300], wj[640];
    bench_json_string(o, sizeof o, op);
    bench_json_string(p, sizeof p, primitive_name);
    bench_placement_text(where, sizeof where);
    bench_json_string(wj, sizeof wj, where);
    printf("{\"op\":%s,\"unit\":\"us\",\"mproc\":%.6g,\"primitive_name\":%s,"
           "\"primitive\":%.6g,\"ratio\":%.6g,\"placement\":%s}\n",
           o, mproc_us, p, primitive_us, primitive_us > 0 ? mproc_us / primitive_us : 0.0, wj);
    fflush(stdout);
}

static cpu_set_t unpinned;
static bool pinned;

int bench_pin_cpu(int slot)
{
    cpu_set_t allowed, one;
    int seen = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        return -1;
    /* Slots count among the CPUs allowed before the first pin: a helper
     * forked by a pinned parent inherits the parent's single CPU, and
     * counting among those would leave it there, beside the parent. */
    if (pinned)
        allowed = unpinned;
    if (CPU_COUNT(&allowed) < 2)
        return -1;
    if (!pinned) {
        unpinned = allowed;
        pinned = true;
    }
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &allowed) || seen++ != slot)
            continue;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        return sched_setaffinity(0, sizeof one, &one) == 0 ? 0 : -1;
    }
    return -1;
}

int bench_cpu_of_slot(int slot)
{
    cpu_set_t set;
    int seen = 0;
    if (pinned)
        set = unpinned; /* slots count among the CPUs allowed before pinning */
    else if (sched_getaffinity(0, sizeof set, &set) != 0)
        return -1;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &set) && seen++ == slot)
            return cpu;
    return -1;
}

void bench_unpin(void)
{
    if (pinned && sched_setaffinity(0, sizeof unpinned, &unpinned) == 0)
        pinned = false;
}
