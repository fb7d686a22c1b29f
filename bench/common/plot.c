/* bench_all's picture: latency.png from the handoff figures, drawn by
 * gnuplot (log-log, a tic at every decade and half-decade, the date and
 * load of the run in the title), and the helpers it needs. */
#include "plot.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The 1-minute load average, or -1. */
double bench_load_average(void)
{
    double load = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1)
            load = -1;
        fclose(f);
    }
    return load;
}

/* The tensor size in an op name like "queue handoff 4 KiB" or
 * "handoff_1MiB", in bytes; 0 when it names none. */
double bench_op_size_bytes(const char *op)
{
    const char *p = op;
    while (*p && !(*p >= '0' && *p <= '9'))
        p++;
    if (!*p)
        return 0;
    char *end;
    double v = strtod(p, &end);
    while (*end == ' ' || *end == '_')
        end++;
    switch (*end) {
    case 'k': case 'K': return v * 1024;
    case 'M': return v * 1024 * 1024;
    case 'G': return v * 1024 * 1024 * 1024;
    default: return v;
    }
}

static int cmp_size(const void *a, const void *b)
{
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return (x > y) - (x < y);
}

void bench_sort_points(double (*pts)[3], int n)
{
    qsort(pts, (size_t)n, sizeof *pts, cmp_size);
}

/* Whether name is an executable file in a $PATH folder. */
static bool in_path(const char *name)
{
    const char *path = getenv("PATH");
    char dir[PATH_MAX + 64];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s/%s", (int)(n < PATH_MAX ? n : PATH_MAX), path, name);
        if (n && access(dir, X_OK) == 0)
            return true;
        path += n + (path[n] == ':');
    }
    return false;
}

/* "2026-11-24 02:30 UTC, load 1.52 / 2 CPUs": when and under what the
 * figures were taken, for the plot's title. */
static void run_stamp(char *buf, size_t cap)
{
    char stamp[40];
    double load = bench_load_average();
    time_t now = time(NULL);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    if (load >= 0)
        snprintf(buf, cap, "%s, load %.2f / %ld CPUs", stamp, load,
                 sysconf(_SC_NPROCESSORS_ONLN));
    else
        snprintf(buf, cap, "%s", stamp);
}

/* Writes the y tics: every decade and half-decade (0.1, 0.5, 1, 5, ...)
 * from the decade below the lowest point to past the largest, so a reader
 * can place any value. The range reaches the first tic above the largest
 * point: points between 0.1 and 0.3 would otherwise show one tic only. */
static void plot_ytics(FILE *g, double (*pts)[3], int n)
{
    double top = 0, low = 1e300, bottom = 1, above;
    for (int i = 0; i < n; i++)
        for (int j = 1; j < 3; j++) {
            top = pts[i][j] > top ? pts[i][j] : top;
            low = pts[i][j] > 0 && pts[i][j] < low ? pts[i][j] : low;
        }
    while (bottom > low && bottom > 1e-6)
        bottom /= 10;
    fprintf(g, "set ytics (");
    for (double d = bottom; d <= top * 10; d *= 10)
        fprintf(g, "%s\"%g\" %g, \"%g\" %g", d > bottom ? ", " : "", d, d, 5 * d, 5 * d);
    for (above = bottom; above <= top; above *= 10)
        if (5 * above > top) {
            above *= 5;
            break;
        }
    fprintf(g, ")\nset yrange [%g:%g]\n", bottom, above > top * 3 ? above : top * 3);
}

/* Draws png from dat (pts: n points) with gnuplot; without gnuplot, says
 * so and returns 0: the JSON matters more than the picture. */
int bench_plot_latency(const char *png, const char *dat, const char *prim, double (*pts)[3],
                       int n)
{
    int rc = 0;
    char stamp[96];
    if (!in_path("gnuplot")) {
        fprintf(stderr, "bench_all: gnuplot is not installed: %s not drawn (the data is in %s;"
                        " apt-get install gnuplot-nox, or run scripts/deps)\n", png, dat);
        return 0;
    }
    FILE *g = popen("gnuplot 2>&1", "w");
    if (!g) {
        fprintf(stderr, "bench_all: cannot start gnuplot: %s\n", strerror(errno));
        return -1;
    }
    /* a tic at each measured size, named in binary units */
    fprintf(g, "set xtics (");
    for (int i = 0; i < n; i++) {
        double b = pts[i][0];
        int k = b >= 1 << 30 ? 3 : b >= 1 << 20 ? 2 : b >= 1 << 10 ? 1 : 0;
        const char *u = (const char *[]){"B", "KiB", "MiB", "GiB"}[k];
        double d = (double)(1u << (10 * k));
        fprintf(g, "%s\"%g %s\" %.0f", i ? ", " : "", b / d, u, b);
    }
    fprintf(g, ")\nset xrange [%g:%g]\n", pts[0][0] / 2, pts[n - 1][0] * 2);
    plot_ytics(g, pts, n);
    run_stamp(stamp, sizeof stamp);
    /* The legend sits inside the plot's top left, boxed and opaque, clear
     * of both axis labels (below the plot it ran into the x label). */
    fprintf(g,
            "set terminal pngcairo size 900,560 noenhanced\n"
            "set output '%s'\n"
            "set title \"Tensor handoff latency between processes (median)\\n%s\"\n"
            "set xlabel 'tensor size (bytes)'\nset ylabel 'latency (us, log scale)'\n"
            "set logscale xy\nset grid xtics ytics\n"
            "set key top left inside box opaque spacing 1.3\n"
            "plot '%s' using 1:2 with linespoints lw 2 "
            "title 'mproc Pipe, shared tensor sent again (pinned, no fd; one way)', "
            "'' using 1:3 with linespoints lw 2 title '%s'\n",
            png, stamp, dat, prim);
    if (pclose(g) != 0) {
        fprintf(stderr, "bench_all: gnuplot failed: latency.png not drawn\n");
        rc = -1;
    } else {
        fprintf(stderr, "bench_all: drew %s\n", png);
    }
    return rc;
}

