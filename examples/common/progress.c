#include "progress.h"

#include <time.h>

#include <mproc.h>
#include <unistd.h>

double progress_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void progress_init(progress *p, FILE *out, int mode, const char *label)
{
    p->out = out;
    p->label = label ? label : "";
    p->quiet = mode == 3;
    p->bar = mode == 1 || (mode == 0 && isatty(fileno(out)));
}

void progress_begin(progress *p, int epoch, int epochs, int64_t total)
{
    p->epoch = epoch;
    p->epochs = epochs;
    p->total = total;
    p->start = progress_now();
    p->quarter = 0;
}

static void line(progress *p, int64_t done, double loss, const char *end)
{
    double dt = progress_now() - p->start;
    double rate = dt > 0 ? (double)done / dt : 0;
    double eta = rate > 0 ? (double)(p->total - done) / rate : 0;
    int width = 24, fill = p->total ? (int)(width * done / p->total) : width;
    char bar[32];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(p->out, "%s%sepoch %d/%d [%s] %6lld/%lld  %7.0f samples/s  loss %.4f  ETA %4.1fs%s",
            p->bar ? "\r" : "", p->label, p->epoch + 1, p->epochs, bar, (long long)done,
            (long long)p->total, rate, loss, eta, end);
    fflush(p->out);
}

void progress_update(progress *p, int64_t done, double loss)
{
    if (p->quiet || p->total <= 0)
        return;
    if (p->bar) {
        line(p, done, loss, "\033[K");
        return;
    }
    int q = (int)(4 * done / p->total);
    if (q > p->quarter && q < 4) {
        p->quarter = q;
        line(p, done, loss, "\n");
    }
}

void progress_end(progress *p, int64_t done, double loss, double test_acc, double test_loss)
{
    if (p->quiet)
        return;
    line(p, done, loss, p->bar ? "\033[K\n" : "\n");
    fprintf(p->out, "%sepoch %d/%d  test accuracy %.4f  test loss %.4f  (%.1fs)\n", p->label,
            p->epoch + 1, p->epochs, test_acc, test_loss, progress_now() - p->start);
    fflush(p->out);
}

void progress_child_error(FILE *f, const char *what, const mp_child_error *e)
{
    fprintf(f, "  %s %d (pid %d, %s): exit code %d", what, e->rank, (int)e->pid, e->name,
            e->exitcode);
    if (e->signal)
        fprintf(f, ", killed by %s (signal %d)", e->signal_name, e->signal);
    fprintf(f, "\n");
    if (e->message[0])
        fprintf(f, "  message: %s\n", e->message);
    if (e->backtrace[0])
        fprintf(f, "  backtrace:\n%s\n", e->backtrace);
}
