#include "progress.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <mproc.h>

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
    p->columns = 0;
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

int progress_columns(int fd)
{
    struct winsize ws;
    const char *env = getenv("COLUMNS");
    char *end;
    long v;
    if (ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    if (env && *env) {
        errno = 0;
        v = strtol(env, &end, 10);
        if (errno == 0 && *end == '\0' && v >= 1 && v <= 10000)
            return (int)v;
    }
    return 80;
}

/* snprintf at buf + *n that stops at cap instead of running past it. */
static void append(char *buf, size_t cap, int *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, int *n, const char *fmt, ...)
{
    va_list ap;
    int k;
    if ((size_t)*n >= cap - 1)
        return;
    va_start(ap, fmt);
    k = vsnprintf(buf + *n, cap - (size_t)*n, fmt, ap);
    va_end(ap);
    if (k > 0)
        *n = (size_t)(*n + k) >= cap ? (int)cap - 1 : *n + k;
}

/* The figures after the bar, at a level from 4 (all) down to 0 (none):
 * samples/s go first as the width shrinks, then the count, the loss, the
 * ETA, so the bar (the point of it) stays longest. */
static int tail_text(char *buf, size_t cap, const progress_figures *f, int level)
{
    int n = 0;
    buf[0] = '\0';
    if (level >= 3)
        append(buf, cap, &n, " %6lld/%lld", (long long)f->done, (long long)f->total);
    if (level >= 4)
        append(buf, cap, &n, "  %7.0f samples/s", f->rate);
    if (level >= 2)
        append(buf, cap, &n, "  loss %.4f", f->loss);
    if (level >= 1)
        append(buf, cap, &n, "  ETA %4.1fs", f->eta);
    return n;
}

int progress_format(char *buf, size_t cap, int width, const progress_figures *f)
{
    enum { BAR_MAX = 24, BAR_MIN = 8 };
    char head[96], tail[160], bar[BAR_MAX + 1];
    int level = 4, room = width > 0 ? width - 1 : 1 << 20, hn, tn, bw, fill, n;
    /* Narrowing drops the figures after the bar, then the label, then the
     * word "epoch": the bar and the epoch number stay longest. */
    tn = tail_text(tail, sizeof tail, f, level);
    for (int form = 0; form < 3; form++) {
        hn = snprintf(head, sizeof head, form == 0 ? "%.40sepoch %d/%d " : form == 1 ?
                      "%.0sepoch %d/%d " : "%.0s%d/%d ", f->label ? f->label : "",
                      f->epoch + 1, f->epochs);
        while (level > 0 && hn + 2 + BAR_MIN + tn > room)
            tn = tail_text(tail, sizeof tail, f, --level);
        if (hn + 2 + BAR_MIN + tn <= room)
            break;
    }
    bw = room - hn - 2 - tn;
    bw = bw > BAR_MAX ? BAR_MAX : bw;
    if (bw < BAR_MIN) /* not even a short bar: the figures alone, cut to fit */
        n = snprintf(buf, cap, "%s%s", head, tail);
    else {
        fill = f->total ? (int)(bw * f->done / f->total) : bw;
        for (int i = 0; i < bw; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[bw] = '\0';
        n = snprintf(buf, cap, "%s[%s]%s", head, bar, tail);
    }
    if (n < 0)
        n = 0;
    if ((size_t)n >= cap)
        n = (int)cap - 1;
    if (n > room) {
        n = room;
        buf[n] = '\0';
    }
    return n;
}

static void line(progress *p, int64_t done, double loss, const char *end)
{
    double dt = progress_now() - p->start;
    double rate = dt > 0 ? (double)done / dt : 0;
    progress_figures f = {p->label, p->epoch, p->epochs, done, p->total, rate, loss,
                          rate > 0 ? (double)(p->total - done) / rate : 0};
    char text[512];
    int width = p->columns ? p->columns : p->bar ? progress_columns(fileno(p->out)) : 0;
    progress_format(text, sizeof text, width, &f);
    fprintf(p->out, "%s%s%s", p->bar ? "\r" : "", text, end);
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

/* text on f, broken at spaces into lines narrower than width (<= 0: one
 * line), so the terminal never wraps it; a word longer than a line is cut. */
static void put_wrapped(FILE *f, const char *text, int width)
{
    int room = width > 0 ? width - 1 : 1 << 20, col = 0;
    while (*text) {
        int word = (int)strcspn(text, " "), gap = col ? 1 : 0;
        if (word == 0) { /* runs of spaces: one at most between words */
            text++;
            continue;
        }
        if (col && col + gap + word > room) {
            fputc('\n', f);
            col = gap = 0;
        }
        if (word > room - col - gap)
            word = room - col - gap;
        fprintf(f, "%s%.*s", gap ? " " : "", word, text);
        col += gap + word;
        text += strcspn(text, " ");
    }
    fputc('\n', f);
}

void progress_end(progress *p, int64_t done, double loss, double test_acc, double test_loss)
{
    char text[256];
    if (p->quiet)
        return;
    line(p, done, loss, p->bar ? "\033[K\n" : "\n");
    snprintf(text, sizeof text, "%sepoch %d/%d  test accuracy %.4f  test loss %.4f  (%.1fs)",
             p->label, p->epoch + 1, p->epochs, test_acc, test_loss, progress_now() - p->start);
    if (p->bar) /* a terminal: no line wider than it */
        put_wrapped(p->out, text, p->columns ? p->columns : progress_columns(fileno(p->out)));
    else
        fprintf(p->out, "%s\n", text);
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
