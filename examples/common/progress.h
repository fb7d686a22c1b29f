/* What a person watches during training: on a terminal one progress bar per
 * epoch, redrawn in place (samples done, samples/s, running loss, ETA) and
 * always narrower than the terminal, so a redraw never wraps (the width is
 * asked with TIOCGWINSZ at each redraw, $COLUMNS when that fails); fields
 * are dropped, then the bar shrinks, as the terminal narrows. Otherwise
 * plain lines at each quarter of an epoch, for logs: no carriage returns,
 * no escape codes. */
#ifndef HOGWILD_PROGRESS_H
#define HOGWILD_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct progress {
    FILE *out;
    const char *label; /* "" or a prefix for every line */
    bool bar;          /* redraw in place (a tty) */
    bool quiet;
    int epoch, epochs;
    int64_t total; /* samples this epoch */
    double start;  /* mp clock at the epoch's start, seconds */
    int quarter;   /* last quarter printed (lines mode) */
    int columns;   /* fixed width, or 0: ask the terminal at each redraw */
} progress;

/* The figures of one line. */
typedef struct progress_figures {
    const char *label;
    int epoch, epochs; /* epoch counts from 0 */
    int64_t done, total;
    double rate, loss, eta; /* samples/s, running loss, seconds left */
} progress_figures;

/* Formats one progress line into buf (no newline, no control characters)
 * at most width - 1 columns wide; width <= 0: no limit. Returns its length. */
int progress_format(char *buf, size_t cap, int width, const progress_figures *f);
/* Columns of the terminal behind fd: TIOCGWINSZ, else $COLUMNS (a whole
 * number from 1 to 10000), else 80. */
int progress_columns(int fd);

/* out: where to draw; mode: 0 auto (bar on a tty), 1 bar, 2 lines, 3 quiet;
 * label: NULL, or a prefix for every line (the run's name). */
void progress_init(progress *p, FILE *out, int mode, const char *label);
void progress_begin(progress *p, int epoch, int epochs, int64_t total);
/* samples done so far, mean loss of the batches so far. */
void progress_update(progress *p, int64_t done, double loss);
/* Ends the epoch's bar and prints the test figures on their own line. */
void progress_end(progress *p, int64_t done, double loss, double test_acc, double test_loss);

/* Prints a failed child's record (mp_spawn's error: rank, pid, exit code,
 * signal, mp_raise message, backtrace) to f, one field a line; what is the
 * worker called in the first line. */
struct mp_child_error;
void progress_child_error(FILE *f, const char *what, const struct mp_child_error *e);

/* Monotonic seconds. */
double progress_now(void);

#endif
