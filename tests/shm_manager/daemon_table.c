/* The daemon's segment table: its name index stays right through thousands
 * of adds and removals in scrambled order (a lookup that missed would add a
 * second entry for the name, which table_count shows), a report that would
 * start tracking a name gone from /dev/shm is dropped, and a line of any
 * other shape than the client's is refused without tracking anything. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon.h"
#include "mp_test.h"

void dlog(const char *fmt, ...)
{
    (void)fmt;
}

enum { N = 3000 };
static char names[N][MP__SHM_NAME_MAX];

static void report(uint64_t id, const char *verb, const char *name)
{
    char line[MP__MGR_LINE_MAX];
    /* The precision bounds the name for gcc's -Wformat-truncation (Release). */
    snprintf(line, sizeof line, "%s %.*s%s", verb, MP__SHM_NAME_MAX - 1, name,
             verb[0] == 'C' ? " 4096" : "");
    assert_int_equal(table_report(id, getpid(), line), 0);
}

static void make_files(void)
{
    char path[sizeof "/dev/shm" + MP__SHM_NAME_MAX];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "/mproc-%d-%016llx", (int)getpid(),
                 (unsigned long long)(i + 1) * 0x9e3779b97f4a7c15ull);
        snprintf(path, sizeof path, "/dev/shm%.*s", MP__SHM_NAME_MAX - 1, names[i]);
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        close(fd);
    }
}

static void remove_files(void)
{
    char path[sizeof "/dev/shm" + MP__SHM_NAME_MAX];
    for (int i = 0; i < N; i++) {
        snprintf(path, sizeof path, "/dev/shm%.*s", MP__SHM_NAME_MAX - 1, names[i]);
        unlink(path);
    }
}

/* i-th of a fixed scrambled order of 0..N-1 (N is not a multiple of 7). */
static int scrambled(int i) { return (int)(((long)i * 7 + 3) % N); }

static void test_index(void **state)
{
    int removed = 0;
    (void)state;
    make_files();
    table_init(2.0, "/nonexistent/socket");
    for (int i = 0; i < N; i++)
        report(1, "C", names[i]);
    assert_int_equal(table_count(), N);
    for (int i = 0; i < N; i++) {
        int k = scrambled(i);
        if (k % 3 == 0) {
            report(1, "U", names[k]);
            removed++;
        }
    }
    assert_int_equal(table_count(), N - removed);
    for (int i = 0; i < N; i++) /* every one left is found, none added */
        if (i % 3)
            report(2, "O", names[i]);
    assert_int_equal(table_count(), N - removed);
    for (int i = 0; i < N; i += 3)
        report(1, "C", names[i]);
    assert_int_equal(table_count(), N);
    for (int i = N - 1; i >= 0; i--)
        report(1, "U", names[i]);
    assert_int_equal(table_count(), 0);
    remove_files();
}

/* A late "S" for a segment that is gone (its receiver unlinked it and its
 * "U" was read first) must not bring it back. */
static void test_late_report_of_gone_name(void **state)
{
    (void)state;
    make_files();
    table_init(2.0, "/nonexistent/socket");
    remove_files();
    report(1, "S", names[0]);
    report(1, "C", names[1]);
    report(2, "R", names[2]);
    assert_int_equal(table_count(), 0);
}

/* Lines a client never writes: each refused (-1), nothing tracked; the
 * well-formed ones around them still count. */
static void test_malformed_lines(void **state)
{
    char line[MP__MGR_LINE_MAX], long_name[MP__SHM_NAME_MAX + 8];
    const char *bad[] = {"",
                         "C",
                         "C ",
                         "C  /x",
                         "CC /mproc-1-a 4096",
                         "S/mproc-1-a",
                         "C %s 4096x",
                         "C %s 12 13",
                         "C %s ",
                         "C %s -1",
                         "C %s 99999999999999999999",
                         "O %s/",
                         "O mproc-1-a",
                         "C %s  4096"};
    (void)state;
    make_files();
    table_init(2.0, "/nonexistent/socket");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(line, sizeof line, bad[i], names[0]);
        if (table_report(1, getpid(), line) != -1)
            fail_msg("accepted \"%s\"", line);
    }
    memset(long_name, 'a', sizeof long_name - 1);
    memcpy(long_name, "/mproc-", 7);
    long_name[sizeof long_name - 1] = '\0';
    snprintf(line, sizeof line, "O %s", long_name);
    assert_int_equal(table_report(1, getpid(), line), -1);
    assert_int_equal(table_count(), 0);
    report(1, "C", names[0]);
    report(2, "S", names[0]);
    assert_int_equal(table_count(), 1);
    report(1, "U", names[0]);
    remove_files();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_index, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_late_report_of_gone_name, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_malformed_lines, mp_test_setup, mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
