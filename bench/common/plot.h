/* latency.png for bench_all (plot.c). */
#ifndef MPROC_BENCH_PLOT_H
#define MPROC_BENCH_PLOT_H

/* The 1-minute load average, or -1. */
double bench_load_average(void);
/* The tensor size an op names ("queue handoff 4 KiB", "handoff_1MiB") in
 * bytes; 0 when it names none. */
double bench_op_size_bytes(const char *op);
/* Sorts n points (bytes, mproc us, primitive us) by size. */
void bench_sort_points(double (*pts)[3], int n);
/* Draws png from dat (the points, already written in order) with gnuplot;
 * prim names the primitive's line.
 * Without gnuplot it says so on stderr and returns 0; -1 when gnuplot
 * failed. */
int bench_plot_latency(const char *png, const char *dat, const char *prim, double (*pts)[3],
                       int n);

#endif
