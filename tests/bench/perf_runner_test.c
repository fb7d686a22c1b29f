/* bench/all.c and bench/common/record.c: the record parser on good and bad
 * lines; the runner on fake benchmarks (a malformed line is a failure, a
 * benchmark that measures nothing is a skip); and a --quick run of the real
 * benchmarks whose latest.json must carry every field on every line. Not a
 * timing test: no figure is compared with anything. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp_test.h"
#include "record.h"

/* bench.cmake points this at bench_all's folder; without the benchmarks
 * (MPROC_BUILD_EXAMPLES=OFF) only the parser is tested. */
#ifndef BENCH_BIN_DIR
#define BENCH_BIN_DIR ""
#endif

/* ---- helpers ----------------------------------------------------------------- */

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = NULL;
    long n;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1))) {
        size_t got = fread(buf, 1, (size_t)n, f);
        buf[got] = '\0';
    }
    fclose(f);
    return buf;
}

static void write_script(const char *dir, const char *name, const char *body)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\n%s\n", body);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, 0755), 0);
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[PATH_MAX + 256];
    while (d && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

/* Runs BENCH_BIN_DIR/bench_all with args (stdout and stderr to /dev/null
 * unless verbose); returns its exit status, -1 if it died of a signal. */
static int run_runner(const char *const *args, int nargs, int verbose)
{
    char exe[PATH_MAX];
    char *argv[16];
    int status;
    snprintf(exe, sizeof exe, "%s/bench_all", BENCH_BIN_DIR);
    argv[0] = exe;
    for (int i = 0; i < nargs && i < 14; i++)
        argv[i + 1] = (char *)args[i];
    argv[nargs + 1] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, STDOUT_FILENO);
        if (!verbose)
            dup2(fd, STDERR_FILENO);
        execv(exe, argv);
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The lines of latest.json that hold one result each (they start with
 * {"bench":), checked with the parser bench_all itself uses; returns how
 * many, and counts the distinct benchmarks in *nbench. */
static int check_results(const char *json, int *nbench)
{
    char seen[16][64] = {{0}};
    int n = 0;
    *nbench = 0;
    for (const char *p = json; (p = strstr(p, "\n{\"bench\":\"")); p++) {
        char line[2048], err[128], bench[64];
        bench_record r;
        size_t len = strcspn(p + 1, "\n");
        assert_true(len < sizeof line);
        memcpy(line, p + 1, len);
        line[len] = '\0';
        if (line[len - 1] == ',')
            line[len - 1] = '\0';
        if (bench_record_parse(line, &r, err, sizeof err) != 0)
            fail_msg("latest.json line %d: %s: %s", n, err, line);
        assert_string_equal(r.unit, "us");
        assert_true(r.op[0] && r.primitive_name[0]);
        assert_true(isfinite(r.mproc) && r.mproc > 0);
        assert_true(isfinite(r.primitive) && r.primitive > 0);
        assert_true(fabs(r.ratio - r.mproc / r.primitive) <= 1e-3 * r.ratio + 1e-6);
        /* Where the processes ran is stated on every line; a figure with
         * its spread has both p99s, each at least its p50. */
        assert_true(r.placement[0] != '\0');
        if (r.kind[0]) {
            assert_true(!strcmp(r.kind, "latency") || !strcmp(r.kind, "throughput"));
            assert_true(r.mproc_p99 >= r.mproc && r.primitive_p99 >= r.primitive);
            assert_true(r.samples >= 1);
        }
        assert_int_equal(sscanf(line, "{\"bench\":\"%63[^\"]\"", bench), 1);
        /* these take both sides alternately and report the spread */
        if (!strcmp(bench, "messaging") || !strcmp(bench, "process") || !strcmp(bench, "sync"))
            if (!r.kind[0])
                fail_msg("a bench_%s line without its spread: %s", bench, line);
        int k = 0;
        while (k < *nbench && strcmp(seen[k], bench))
            k++;
        if (k == *nbench && k < 16)
            snprintf(seen[(*nbench)++], sizeof seen[0], "%s", bench);
        n++;
    }
    return n;
}

/* ---- the record parser ------------------------------------------------------- */

static void test_record_parse(void **state)
{
    (void)state;
    bench_record r;
    char err[128];
    assert_int_equal(bench_record_parse("{\"ratio\":2,\"op\":\"a \\\"b\\\"\",\"unit\":\"us\","
                                        "\"x\":\"skipped\",\"mproc\":1.5e1,"
                                        "\"primitive_name\":\"raw\\u0041\",\"primitive\":7.5}",
                                        &r, err, sizeof err), 0);
    assert_string_equal(r.op, "a \"b\"");
    assert_string_equal(r.primitive_name, "rawA");
    assert_true(r.mproc == 15 && r.primitive == 7.5 && r.ratio == 2);
    assert_true(r.kind[0] == '\0' && r.placement[0] == '\0' && r.samples == 0);

    /* bench_emit_stats's optional fields */
    assert_int_equal(bench_record_parse("{\"op\":\"a\",\"unit\":\"us\",\"mproc\":2,"
                                        "\"primitive_name\":\"p\",\"primitive\":1,\"ratio\":2,"
                                        "\"kind\":\"latency\",\"mproc_p99\":9,"
                                        "\"primitive_p99\":3,\"samples\":41,"
                                        "\"placement\":\"parent on cpu 0\"}",
                                        &r, err, sizeof err), 0);
    assert_string_equal(r.kind, "latency");
    assert_string_equal(r.placement, "parent on cpu 0");
    assert_true(r.mproc_p99 == 9 && r.primitive_p99 == 3 && r.samples == 41);

    static const char *const bad[] = {
        "{\"op\":\"a\",\"unit\":\"us\",\"mproc\":1,\"primitive_name\":\"p\",\"primitive\":1,"
        "\"ratio\":1,\"mproc_p99\":\"9\"}",
        "{\"op\":\"a\",\"unit\":\"us\",\"mproc\":1,\"primitive_name\":\"p\",\"primitive\":1,"
        "\"ratio\":1,\"placement\":0}",
        "[1]",
        "{\"op\":\"a\",\"unit\":\"us\",\"mproc\":1,\"primitive_name\":\"p\",\"primitive\":1}",
        "{\"op\":1,\"unit\":\"us\",\"mproc\":1,\"primitive_name\":\"p\",\"primitive\":1,"
        "\"ratio\":1}",
        "{\"op\":\"a\",\"unit\":\"us\",\"mproc\":\"1\",\"primitive_name\":\"p\","
        "\"primitive\":1,\"ratio\":1}",
        "{\"op\":\"a\\q\",\"unit\":\"us\",\"mproc\":1,\"primitive_name\":\"p\","
        "\"primitive\":1,\"ratio\":1}",
        "{\"op\":\"a\",\"unit\":\"us\",\"mproc\":1,\"primitive_name\":\"p\",\"primitive\":1,"
        "\"ratio\":1} trailing",
        "{\"op\":\"a\" \"unit\":\"us\"}",
        "{\"op\":\"unterminated",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        if (bench_record_parse(bad[i], &r, err, sizeof err) != -1)
            fail_msg("accepted: %s", bad[i]);
        assert_true(err[0] != '\0');
    }
}

/* ---- the runner on fake benchmarks ------------------------------------------- */

static void test_runner_fake_benchmarks(void **state)
{
    (void)state;
    if (!BENCH_BIN_DIR[0])
        skip();
    char bin[] = "/tmp/mproc_bench_bin_XXXXXX", out[] = "/tmp/mproc_bench_out_XXXXXX";
    char path[PATH_MAX];
    assert_non_null(mkdtemp(bin));
    assert_non_null(mkdtemp(out));
    write_script(bin, "bench_good",
                 "echo 'human text'; echo '{\"op\":\"handoff 4 KiB\",\"unit\":\"us\","
                 "\"mproc\":3,\"primitive_name\":\"raw\",\"primitive\":2,\"ratio\":1.5}'");
    write_script(bin, "bench_none", "echo 'nothing to measure here' >&2");
    const char *args[] = {"--quick", "--bin", bin, "--out", out};
    assert_int_equal(run_runner(args, 5, 0), 0);
    snprintf(path, sizeof path, "%s/latest.json", out);
    char *json = read_all(path);
    assert_non_null(json);
    int nbench, n = check_results(json, &nbench);
    assert_int_equal(n, 1);
    assert_non_null(strstr(json, "\"skipped\":[\"bench_none\"]"));
    assert_non_null(strstr(json, "\"failures\":[]"));
    assert_non_null(strstr(json, "\"quick\":true"));
    free(json);

    /* a malformed line, a crash and a hang are failures: exit 1, named in
     * the JSON; the hung script's own child dies with it (its group) */
    write_script(bin, "bench_bad", "echo '{\"op\":\"x\",\"unit\":\"us\"}'");
    write_script(bin, "bench_crash", "kill -SEGV $$");
    write_script(bin, "bench_hang", "exec >&-; sleep 60");
    write_script(bin, "bench_neg",
                 "echo '{\"op\":\"y\",\"unit\":\"us\",\"mproc\":-1,"
                 "\"primitive_name\":\"raw\",\"primitive\":2,\"ratio\":-0.5}'");
    const char *args2[] = {"--quick", "--bin", bin, "--out", out, "--timeout", "1"};
    assert_int_equal(run_runner(args2, 7, 0), 1);
    json = read_all(path);
    assert_non_null(json);
    assert_non_null(strstr(json, "bench_bad: malformed result line (missing field"));
    assert_non_null(strstr(json, "bench_crash: died of signal"));
    assert_non_null(strstr(json, "bench_hang: killed after the 1 s timeout"));
    assert_non_null(strstr(json, "bench_neg: a failed measurement"));
    assert_int_equal(check_results(json, &nbench), 1);
    free(json);
    remove_tree(bin);
    remove_tree(out);
}

/* ---- the real benchmarks, --quick ------------------------------------------- */

static void test_runner_quick(void **state)
{
    (void)state;
    if (!BENCH_BIN_DIR[0])
        skip();
    char out[] = "/tmp/mproc_bench_out_XXXXXX", path[PATH_MAX];
    static const char *const facts[] = {"{\"date\":\"", "\"quick\":true", "\"nproc\":",
                                        "\"cpu_model\":\"", "\"kernel\":\"", "\"machine\":\"",
                                        "\"failures\":[]"};
    static const char *const benches[] = {"messaging", "process", "sync", "pool"};
    assert_non_null(mkdtemp(out));
    const char *args[] = {"--quick", "--out", out};
    assert_int_equal(run_runner(args, 3, 1), 0);
    snprintf(path, sizeof path, "%s/latest.json", out);
    char *json = read_all(path);
    assert_non_null(json);
    for (size_t i = 0; i < sizeof facts / sizeof facts[0]; i++)
        if (!strstr(json, facts[i]))
            fail_msg("latest.json lacks %s", facts[i]);
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "{\"bench\":\"%s\"", benches[i]);
        if (!strstr(json, key))
            fail_msg("latest.json has no line from bench_%s", benches[i]);
    }
    int nbench, n = check_results(json, &nbench);
    assert_true(n >= 10);
    assert_true(nbench >= 4);
    free(json);
    /* the plot's data: the three repeated-handoff sizes of bench_messaging,
     * each once (the first-handoff rows are not plotted) */
    snprintf(path, sizeof path, "%s/latency.dat", out);
    char *dat = read_all(path);
    assert_non_null(dat);
    int rows = 0;
    for (char *p = dat; (p = strchr(p, '\n')); p++)
        rows++;
    assert_int_equal(rows, 4);   /* header + 3 sizes */
    free(dat);
    snprintf(path, sizeof path, "%s/latest.md", out);
    assert_int_equal(access(path, R_OK), 0);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
        snprintf(path, sizeof path, "%s/latency.png", out);
        char *png = read_all(path);
        assert_non_null(png);
        assert_memory_equal(png, "\x89PNG", 4);
        free(png);
    }
    remove_tree(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_record_parse, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_runner_fake_benchmarks, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_runner_quick, mp_test_setup, mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
