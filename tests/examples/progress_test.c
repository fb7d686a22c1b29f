/* The examples' progress bar never wraps: every line it draws is narrower
 * than the terminal, from 200 columns down to 20 (and the formatting
 * function down to 1); on a pseudo-terminal with a set window size it
 * redraws in place at that width; on a pipe it writes plain lines (no
 * carriage return, no escape codes). */
#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp_test.h"
#include "progress.h"

static const progress_figures busy = {"4 workers: ", 2, 10, 123456, 600000, 98765.4, 0.12345,
                                      1234.5};

static void test_format_widths(void **state)
{
    static const int widths[] = {1, 2, 10, 20, 30, 40, 60, 79, 80, 81, 100, 120, 200};
    char buf[512];
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
        int w = widths[i], n = progress_format(buf, sizeof buf, w, &busy);
        assert_int_equal(n, (int)strlen(buf));
        if (n >= w)
            fail_msg("width %d: %d columns: \"%s\"", w, n, buf);
        /* what matters most survives the narrowing */
        if (w >= 40 && (!strstr(buf, "epoch 3/10") || !strchr(buf, '[')))
            fail_msg("width %d lost the epoch or the bar: \"%s\"", w, buf);
        if (w >= 120 && (!strstr(buf, "samples/s") || !strstr(buf, "ETA")))
            fail_msg("width %d lost a figure: \"%s\"", w, buf);
        for (const char *c = buf; *c; c++)
            assert_true(*c >= ' ' && *c < 127);
    }
    /* no limit: everything, as before */
    progress_format(buf, sizeof buf, 0, &busy);
    assert_non_null(strstr(buf, "123456/600000"));
    assert_non_null(strstr(buf, "loss 0.1235"));
}

/* Reads what is waiting on fd (the pty master or a pipe) into buf. */
static size_t drain(int fd, char *buf, size_t cap)
{
    size_t have = 0;
    ssize_t r;
    while (have + 1 < cap && (r = read(fd, buf + have, cap - 1 - have)) > 0)
        have += (size_t)r;
    buf[have] = '\0';
    return have;
}

/* One epoch drawn on out: updates, then the end lines. */
static void draw_epoch(FILE *out, int mode)
{
    progress p;
    progress_init(&p, out, mode, "2 workers: ");
    progress_begin(&p, 0, 3, 60000);
    for (int64_t done = 0; done <= 60000; done += 1500)
        progress_update(&p, done, 0.5);
    progress_end(&p, 60000, 0.4, 0.85, 0.41);
}

/* Draws one epoch on a pseudo-terminal cols wide, in a child (so the
 * parent drains the master while it writes), and checks every line. */
static void check_pty_width(unsigned short cols)
{
    struct winsize ws = {.ws_row = 24, .ws_col = cols};
    static char text[1 << 18];
    int master, slave, status;
    size_t len = 0, redraws = 0;
    ssize_t r;
    pid_t pid;
    assert_int_equal(openpty(&master, &slave, NULL, NULL, &ws), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *out = fdopen(slave, "w");
        close(master);
        if (!out)
            _exit(1);
        draw_epoch(out, 0); /* auto: a tty, so the bar */
        fclose(out);
        _exit(0);
    }
    close(slave);
    /* EIO once the child is gone and the slave closed. */
    while (len + 1 < sizeof text &&
           ((r = read(master, text + len, sizeof text - 1 - len)) > 0 ||
            (r < 0 && errno == EINTR)))
        len += r > 0 ? (size_t)r : 0;
    text[len] = '\0';
    close(master);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(len > 0);
    /* Each redraw starts with \r; the line discipline turns \n into \r\n.
     * The erase-to-end code takes no column. */
    for (char *seg = strtok(text, "\r\n"); seg; seg = strtok(NULL, "\r\n")) {
        char *esc = strstr(seg, "\033[K");
        size_t used = esc ? (size_t)(esc - seg) : strlen(seg);
        if (strstr(seg, "1/3 [") && strchr(seg, ']'))
            redraws++;
        if (used >= cols)
            fail_msg("%u columns: a line of %zu: \"%.*s\"", cols, used, (int)used, seg);
    }
    if (redraws < 10)
        fail_msg("%u columns: %zu bar redraws seen, want >= 10", cols, redraws);
}

static void test_pty_never_wraps(void **state)
{
    static const unsigned short widths[] = {20, 40, 80, 200};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        check_pty_width(widths[i]);
}

static void test_pipe_gets_plain_lines(void **state)
{
    static char text[1 << 16];
    int p[2];
    FILE *out;
    assert_int_equal(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    out = fdopen(p[1], "w");
    assert_non_null(out);
    draw_epoch(out, 0); /* auto: not a tty, so lines */
    fclose(out);
    drain(p[0], text, sizeof text);
    close(p[0]);
    assert_null(strchr(text, '\r'));
    assert_null(strchr(text, '\033'));
    /* three quarter lines, the end line, the test figures */
    int lines = 0;
    for (char *c = text; *c; c++)
        lines += *c == '\n';
    assert_int_equal(lines, 5);
    assert_non_null(strstr(text, "2 workers: epoch 1/3 ["));
    assert_non_null(strstr(text, "samples/s"));
}

static void test_columns_fallback(void **state)
{
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    setenv("COLUMNS", "33", 1);
    assert_int_equal(progress_columns(p[1]), 33);
    setenv("COLUMNS", "33x", 1); /* junk: ignored */
    assert_int_equal(progress_columns(p[1]), 80);
    setenv("COLUMNS", "-4", 1);
    assert_int_equal(progress_columns(p[1]), 80);
    unsetenv("COLUMNS");
    assert_int_equal(progress_columns(p[1]), 80);
    close(p[0]);
    close(p[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_widths),
        cmocka_unit_test(test_pty_never_wraps),
        cmocka_unit_test(test_pipe_gets_plain_lines),
        cmocka_unit_test(test_columns_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
