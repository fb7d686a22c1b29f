/* Shared timing helpers for the programs in bench/ (linked into every
 * build/bench_<name>). Each benchmark measures mproc's operation beside the
 * bare OS primitive in the same run, several repetitions after a warm-up, and
 * prints one JSON line per figure on stdout (bench_emit); human text goes to
 * stderr. bench_all runs every bench_* program and collects those lines.
 *
 *   bench_opts o;
 *   if (bench_parse_args(argc, argv, "what this measures", &o) != 0) return 2;
 *   double m = bench_measure_us(my_op, &ctx, bench_iters(&o, 10000), &o);
 *   double p = bench_measure_us(raw_op, &ctx, bench_iters(&o, 10000), &o);
 *   bench_emit("queue handoff 4 KiB", m, "socketpair SCM_RIGHTS", p);
 *
 * Better, with both sides taken alternately and their spread:
 *
 *   bench_stats m, p;
 *   bench_set_placement("parent cpu %d, echo child cpu %d", bench_cpu_of_slot(0), ...);
 *   if (bench_latency_pair(my_op, &ctx, raw_op, &ctx, bench_iters(&o, 2000), &o, &m, &p) == 0)
 *       bench_emit_stats("queue handoff 4 KiB", "latency", &m, "socketpair SCM_RIGHTS", &p);
 */
#ifndef MPROC_BENCH_H
#define MPROC_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bench_opts {
    bool quick;   /* --quick: tiny counts, a smoke test (figures meaningless) */
    int reps;     /* --reps N: timed repetitions (default 7, quick 2) */
    int warmup;   /* untimed repetitions before them (default 1) */
} bench_opts;

/* Parses --quick, --reps N and --help (which prints `what` and the flags to
 * stderr). Returns 0, 1 after --help (exit 0), or -1 on a bad flag (message
 * on stderr; exit 2). Unknown flags are errors. */
int bench_parse_args(int argc, char **argv, const char *what, bench_opts *o);

/* full under a normal run, a tiny count (>= 1) under --quick. */
size_t bench_iters(const bench_opts *o, size_t full);

/* Monotonic clock in nanoseconds. */
uint64_t bench_now_ns(void);

/* Median of n values (n >= 1); sorts v in place. 0 when n == 0. */
double bench_median(double *v, size_t n);

/* One repetition: perform the operation iters times. Returns 0, or non-zero
 * to abort the measurement (the function says why on stderr). */
typedef int (*bench_fn)(void *ctx, size_t iters);

/* Runs fn o->warmup times untimed, then o->reps times timed; returns the
 * median time per operation in microseconds, or a negative value if fn
 * failed. */
double bench_measure_us(bench_fn fn, void *ctx, size_t iters, const bench_opts *o);

/* Prints the JSON line of the brief on stdout and flushes:
 * {"op":...,"unit":"us","mproc":...,"primitive_name":...,"primitive":...,"ratio":...,
 *  "placement":...}
 * Strings are JSON-escaped; a primitive of 0 gives ratio 0. */
void bench_emit(const char *op, double mproc_us, const char *primitive_name,
                double primitive_us);

/* Pins the calling process to the slot-th CPU it may run on (slot 0 or 1),
 * when it may run on at least two; in a process forked after a pin, the
 * slots are those of the pinning process before it pinned (so a helper
 * pinned to slot 1 really runs beside a parent pinned to slot 0). Ping-pong
 * benchmarks pin the parent to slot 0 and every echo child to slot 1, so
 * mproc and the primitive are both measured across cores: left to the
 * scheduler, one pair can land on one core and the other on two, and a
 * cross-core wake-up costs ~25 us more on this kind of VM, which swamps what
 * is being compared. Returns 0, or -1 when not pinned (one CPU, or
 * sched_setaffinity failed). */
int bench_pin_cpu(int slot);
/* Gives the calling process back the CPUs it had before bench_pin_cpu, so
 * that processes it starts later are free to move. */
void bench_unpin(void);

/* ---- figures with their spread ------------------------------------------ */

/* One side of a figure, in microseconds per operation. Latency: p50 and p99
 * of n single-operation samples. Throughput: p50 is the median of n timed
 * repetitions, p99 the slowest repetition. */
typedef struct bench_stats {
    double p50, p99;
    int n;
} bench_stats;

/* Latency of a beside b: n samples of one operation each (fn(ctx, 1)),
 * a and b taken alternately and in alternating order (a b, b a, a b ...)
 * after n/20 + 1 untimed warm-ups of each, so that both see the same load
 * at the same moment. Returns 0, or -1 when a function failed. */
int bench_latency_pair(bench_fn a, void *actx, bench_fn b, void *bctx, size_t n,
                       const bench_opts *o, bench_stats *sa, bench_stats *sb);

/* Throughput of a beside b: o->reps repetitions of iters operations each,
 * alternately and in alternating order, after o->warmup of each. */
int bench_throughput_pair(bench_fn a, void *actx, bench_fn b, void *bctx, size_t iters,
                          const bench_opts *o, bench_stats *sa, bench_stats *sb);

/* p50 and p99 (nearest rank) of n values; sorts v. */
bench_stats bench_stats_of(double *v, size_t n);

/* Which CPUs the measured processes ran on, printed in every JSON line
 * emitted from now on as "placement" (printf-style; at most 200 bytes).
 * Until it is called the line describes this process's own affinity at
 * the time of the emit ("unpinned (cpus 0-1)" or "main process on cpu 0;
 * helpers: not stated"). */
void bench_set_placement(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The CPU bench_pin_cpu(slot) pins to (-1: fewer CPUs than that). */
int bench_cpu_of_slot(int slot);
/* The placement text of the next line into buf (bench_emit uses it). */
size_t bench_placement_text(char *buf, size_t cap);

/* bench_emit's line plus "kind" ("latency" or "throughput"), "mproc_p99",
 * "primitive_p99", "samples" (per side) and "placement"; "mproc" and
 * "primitive" are the p50s, and "ratio" their ratio. */
void bench_emit_stats(const char *op, const char *kind, const bench_stats *m,
                      const char *primitive_name, const bench_stats *p);

/* Writes s as a JSON string literal (quotes included) into buf; returns the
 * length, truncating (but still quoting) when buf is too small. */
size_t bench_json_string(char *buf, size_t cap, const char *s);

#endif
