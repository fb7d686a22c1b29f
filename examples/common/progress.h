/* What a person watches during training: on a terminal one progress bar per
 * epoch, redrawn in place (samples done, samples/s, running loss, ETA);
 * otherwise plain lines at each quarter of an epoch, for logs. */
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
} progress;

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
