/* bench_all: runs every other build/bench_* program, collects the JSON lines
 * they print, prints one table (operation, mproc median, primitive median,
 * ratio), writes <out>/latest.json and draws <out>/latency.png with gnuplot
 * (handoff latency against tensor size, mproc beside the primitive).
 * `make bench` runs it; docs/performance.md explains the figures. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "plot.h"
#include "record.h"

#define MAX_PROGRAMS 64
#define MAX_RESULTS 1024

typedef struct result {
    char bench[64];
    bench_record rec;
} result;

typedef struct runner {
    bool quick;
    int timeout_s;
    char bin[PATH_MAX];
    char out[PATH_MAX];
    char names[MAX_PROGRAMS][64];
    int nprograms;
    result *results;
    int nresults;
    char failures[MAX_PROGRAMS][400];
    int nfailures;
    char skipped[MAX_PROGRAMS][64];   /* exited 0 without a figure: nothing to measure */
    int nskipped;
    double load_start; /* 1-minute load average when the run began */
} runner;

static int usage(const char *argv0, int rc)
{
    fprintf(rc ? stderr : stdout,
            "usage: %s [--quick] [--out DIR] [--bin DIR] [--timeout S]\n"
            "Runs every bench_* program beside this one and reports mproc's operations\n"
            "against the bare OS primitives, measured in the same run.\n"
            "  --quick      tiny counts, passed to every benchmark (a smoke test)\n"
            "  --out DIR    where latest.json and latency.png go (default bench/results)\n"
            "  --bin DIR    where the bench_* programs are (default: this program's folder)\n"
            "  --timeout S  seconds one benchmark may run before it is killed (default 300)\n",
            argv0);
    return rc;
}

static int parse_args(runner *r, int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", r->bin, sizeof r->bin - 1);
    if (n <= 0) {
        fprintf(stderr, "bench_all: readlink /proc/self/exe: %s\n", strerror(errno));
        return 2;
    }
    r->bin[n] = '\0';
    *strrchr(r->bin, '/') = '\0';
    snprintf(r->out, sizeof r->out, "bench/results");
    r->timeout_s = 300;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            r->quick = true;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            exit(usage(argv[0], 0));
        } else if (v && !strcmp(a, "--out")) {
            snprintf(r->out, sizeof r->out, "%s", v), i++;
        } else if (v && !strcmp(a, "--bin")) {
            snprintf(r->bin, sizeof r->bin, "%s", v), i++;
        } else if (v && !strcmp(a, "--timeout") && atoi(v) > 0) {
            r->timeout_s = atoi(v), i++;
        } else {
            fprintf(stderr, "bench_all: bad argument '%s'\n", a);
            return usage(argv[0], 2);
        }
    }
    return 0;
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

/* Every executable bench_<name> in r->bin except this runner, sorted. */
static int find_programs(runner *r)
{
    DIR *d = opendir(r->bin);
    struct dirent *e;
    if (!d) {
        fprintf(stderr, "bench_all: cannot list %s: %s\n", r->bin, strerror(errno));
        return -1;
    }
    while ((e = readdir(d)) && r->nprograms < MAX_PROGRAMS) {
        char path[PATH_MAX + 64];
        struct stat st;
        if (strncmp(e->d_name, "bench_", 6) != 0 || !strcmp(e->d_name, "bench_all") ||
            strchr(e->d_name, '.') || strlen(e->d_name) >= sizeof r->names[0] ||
            strstr(e->d_name, "_test"))   /* a test binary is no benchmark */
            continue;
        size_t len = strlen(e->d_name);
        snprintf(path, sizeof path, "%s/", r->bin);
        if (strlen(path) + len >= sizeof path)
            continue;
        memcpy(path + strlen(path), e->d_name, len + 1);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || access(path, X_OK) != 0)
            continue;
        memcpy(r->names[r->nprograms++], e->d_name, len + 1);
    }
    closedir(d);
    qsort(r->names, (size_t)r->nprograms, sizeof r->names[0], cmp_name);
    return 0;
}

static void add_failure(runner *r, const char *name, const char *what)
{
    if (r->nfailures < MAX_PROGRAMS)
        snprintf(r->failures[r->nfailures++], sizeof r->failures[0], "%.60s: %.330s", name,
                 what);
    fprintf(stderr, "bench_all: %s: %s\n", name, what);
}

/* One line of a benchmark's stdout: a result, or a complaint. */
static void take_line(runner *r, const char *name, const char *line)
{
    char err[128];
    result *res;
    if (line[0] != '{')
        return;   /* not a result line; benchmarks should print these to stderr */
    if (r->nresults == MAX_RESULTS) {
        add_failure(r, name, "too many results");
        return;
    }
    res = &r->results[r->nresults];
    if (bench_record_parse(line, &res->rec, err, sizeof err) != 0) {
        char what[320];
        snprintf(what, sizeof what, "malformed result line (%s): %.120s", err, line);
        add_failure(r, name, what);
        return;
    }
    if (!(isfinite(res->rec.mproc) && res->rec.mproc > 0 && isfinite(res->rec.primitive) &&
          res->rec.primitive > 0)) {
        char what[320];
        snprintf(what, sizeof what, "a failed measurement (time <= 0 or not finite) in \"%.200s\"",
                 res->rec.op);
        add_failure(r, name, what);
        return;
    }
    snprintf(res->bench, sizeof res->bench, "%s", name + 6);
    r->nresults++;
}

/* Reads the child's stdout until EOF or the deadline; splits it into lines. */
static bool read_output(runner *r, const char *name, int fd, double deadline)
{
    char buf[8192];
    size_t len = 0;
    for (;;) {
        double left = deadline - (double)bench_now_ns() / 1e9;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0)
            return false;
        int rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc == 0)
            continue;   /* the deadline check above ends the wait */
        if (rc < 0) {
            /* poll itself failed: stop now rather than spin to the deadline */
            fprintf(stderr, "bench_all: %s: poll: %s\n", name, strerror(errno));
            return false;
        }
        ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        buf[len] = '\0';
        char *start = buf, *nl;
        while ((nl = strchr(start, '\n'))) {
            *nl = '\0';
            take_line(r, name, start);
            start = nl + 1;
        }
        len -= (size_t)(start - buf);
        memmove(buf, start, len);
        if (len == sizeof buf - 1) {   /* one absurdly long line */
            add_failure(r, name, "an output line longer than 8 KiB");
            len = 0;
        }
    }
    if (len) {
        buf[len] = '\0';
        take_line(r, name, buf);
    }
    return true;
}

/* Reaps pid into *status; false if it is still running at the deadline (a
 * benchmark that closed its stdout but hangs). */
static bool wait_until(pid_t pid, int *status, double deadline)
{
    for (;;) {
        pid_t got = waitpid(pid, status, WNOHANG);
        if (got == pid || (got < 0 && errno != EINTR))
            return true;
        if ((double)bench_now_ns() / 1e9 >= deadline)
            return false;
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
}

/* Runs one benchmark with stdout to us, its lines into r->results; a crash,
 * a timeout, a non-zero exit or a bad line goes into r->failures. */
static void run_program(runner *r, const char *name)
{
    char path[PATH_MAX + 64], what[160];
    int out[2];
    int before = r->nresults, status = 0;
    snprintf(path, sizeof path, "%s/%s", r->bin, name);
    fprintf(stderr, "bench_all: running %s%s\n", name, r->quick ? " --quick" : "");
    if (pipe2(out, O_CLOEXEC) != 0) {
        add_failure(r, name, strerror(errno));
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        add_failure(r, name, strerror(errno));
        close(out[0]);
        close(out[1]);
        return;
    }
    if (pid == 0) {
        char *argv[] = {path, r->quick ? "--quick" : NULL, NULL};
        setpgid(0, 0);               /* a timeout kills its helpers too */
        signal(SIGPIPE, SIG_DFL);    /* an ignored signal would survive exec */
        dup2(out[1], STDOUT_FILENO);
        execv(path, argv);
        fprintf(stderr, "bench_all: exec %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    close(out[1]);
    double deadline = (double)bench_now_ns() / 1e9 + r->timeout_s;
    setpgid(pid, pid);   /* either side may run first */
    bool done = read_output(r, name, out[0], deadline) && wait_until(pid, &status, deadline);
    close(out[0]);
    if (!done) {
        kill(-pid, SIGKILL);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        snprintf(what, sizeof what, "killed after the %d s timeout", r->timeout_s);
        add_failure(r, name, what);
    }
    if (done && WIFSIGNALED(status)) {
        snprintf(what, sizeof what, "died of signal %d (%s)", WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
        add_failure(r, name, what);
    } else if (done && WEXITSTATUS(status) != 0) {
        snprintf(what, sizeof what, "exited with status %d", WEXITSTATUS(status));
        add_failure(r, name, what);
    } else if (done && r->nresults == before) {
        /* A benchmark with nothing to measure here (bench_cuda without a GPU)
         * says why on stderr and exits 0: a skip, not a failure. */
        fprintf(stderr, "bench_all: %s measured nothing here (skipped)\n", name);
        snprintf(r->skipped[r->nskipped++], sizeof r->skipped[0], "%s", name);
    }
}

/* Microseconds with about four significant digits. */
static void fmt_us(char *buf, size_t cap, double us)
{
    snprintf(buf, cap, us < 10 ? "%.3f" : us < 1000 ? "%.1f" : "%.0f", us);
}

/* A p99 cell: "-" when the benchmark gave none (bench_emit). */
static void fmt_p99(char *buf, size_t cap, double us)
{
    if (us > 0)
        fmt_us(buf, cap, us);
    else
        snprintf(buf, cap, "-");
}

/* The table on stdout, columns as wide as their longest entry; with
 * markdown, a GitHub table (latest.md, pasted into README.md).
 * p99: of single-operation samples for a latency; the slowest repetition
 * for a throughput (whose p50 is the median of the repetitions). */
static void print_table(const runner *r, FILE *f, bool markdown)
{
    int wop = 9, wprim = 9;
    char m[32], m99[32], p[32], p99[32];
    for (int i = 0; i < r->nresults; i++) {
        int a = (int)strlen(r->results[i].rec.op);
        int b = (int)strlen(r->results[i].rec.primitive_name);
        wop = a > wop ? a : wop;
        wprim = b > wprim ? b : wprim;
    }
    if (markdown) {
        char stamp[96];
        time_t now = time(NULL);
        strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M UTC", gmtime(&now));
        fprintf(f, "Run of %s on %ld CPUs, 1-minute load average %.2f at the start and %.2f "
                   "at the end.\n\n", stamp, sysconf(_SC_NPROCESSORS_ONLN), r->load_start,
                bench_load_average());
        fprintf(f, "| operation | mproc p50 (us) | p99 | primitive | primitive p50 (us) | p99 | "
                   "ratio (p50) | placement |\n|---|--:|--:|---|--:|--:|--:|---|\n");
    } else {
        fprintf(f, "%-*s %10s %10s  %-*s %10s %10s %7s  %s\n", wop, "operation", "mproc p50",
                "p99", wprim, "primitive", "prim. p50", "p99", "ratio", "placement");
    }
    for (int i = 0; i < r->nresults; i++) {
        const bench_record *x = &r->results[i].rec;
        const char *where = x->placement[0] ? x->placement : "not stated";
        fmt_us(m, sizeof m, x->mproc);
        fmt_us(p, sizeof p, x->primitive);
        fmt_p99(m99, sizeof m99, x->mproc_p99);
        fmt_p99(p99, sizeof p99, x->primitive_p99);
        if (markdown)
            fprintf(f, "| %s | %s | %s | %s | %s | %s | %.2f | %s |\n", x->op, m, m99,
                    x->primitive_name, p, p99, x->ratio, where);
        else
            fprintf(f, "%-*s %10s %10s  %-*s %10s %10s %7.2f  %s\n", wop, x->op, m, m99, wprim,
                    x->primitive_name, p, p99, x->ratio, where);
    }
    if (!markdown)
        fprintf(f, "1-minute load average %.2f at the start, %.2f now; p99: of single "
                   "samples for a latency, the slowest repetition for a throughput\n",
                r->load_start, bench_load_average());
    if (!markdown && r->nfailures)
        fprintf(f, "%d benchmark problem%s (see above)\n", r->nfailures,
                r->nfailures == 1 ? "" : "s");
}

static int mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0777) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return mkdir(tmp, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

/* The CPU's "model name" from /proc/cpuinfo, or "unknown". */
static void cpu_model(char *buf, size_t cap)
{
    char line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(buf, cap, "unknown");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !colon)
            continue;
        colon += 1 + (colon[1] == ' ');
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(buf, cap, "%s", colon);
        break;
    }
    if (f)
        fclose(f);
}

/* A result's optional fields, those its benchmark gave. */
static void json_optional(FILE *f, const bench_record *x)
{
    char s[600];
    if (x->kind[0]) {
        bench_json_string(s, sizeof s, x->kind);
        fprintf(f, ",\"kind\":%s", s);
    }
    if (x->mproc_p99 > 0 && x->primitive_p99 > 0)
        fprintf(f, ",\"mproc_p99\":%.6g,\"primitive_p99\":%.6g", x->mproc_p99,
                x->primitive_p99);
    if (x->samples > 0)
        fprintf(f, ",\"samples\":%d", x->samples);
    bench_json_string(s, sizeof s, x->placement[0] ? x->placement : "not stated");
    fprintf(f, ",\"placement\":%s", s);
}

/* The machine facts, then each result on its own line in "results". */
static void json_body(const runner *r, FILE *f)
{
    char s1[600], s2[600], s3[200], stamp[64];
    struct utsname u;
    time_t now = time(NULL);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    uname(&u);
    cpu_model(s3, sizeof s3);
    bench_json_string(s1, sizeof s1, s3);
    bench_json_string(s2, sizeof s2, u.release);
    fprintf(f, "{\"date\":\"%s\",\"quick\":%s,\"nproc\":%ld,\"cpu_model\":%s,\"kernel\":%s,",
            stamp, r->quick ? "true" : "false", sysconf(_SC_NPROCESSORS_ONLN), s1, s2);
    bench_json_string(s1, sizeof s1, u.machine);
    fprintf(f, "\"machine\":%s,\"load_start\":%.2f,\"load_end\":%.2f,\n\"results\":[\n", s1,
            r->load_start, bench_load_average());
    for (int i = 0; i < r->nresults; i++) {
        const result *x = &r->results[i];
        bench_json_string(s3, sizeof s3, x->bench);
        bench_json_string(s1, sizeof s1, x->rec.op);
        bench_json_string(s2, sizeof s2, x->rec.primitive_name);
        fprintf(f,
                "{\"bench\":%s,\"op\":%s,\"unit\":\"us\",\"mproc\":%.6g,\"primitive_name\":%s,"
                "\"primitive\":%.6g,\"ratio\":%.6g",
                s3, s1, x->rec.mproc, s2, x->rec.primitive, x->rec.ratio);
        json_optional(f, &x->rec);
        fprintf(f, "}%s\n", i + 1 < r->nresults ? "," : "");
    }
    fprintf(f, "],\n\"skipped\":[");
    for (int i = 0; i < r->nskipped; i++) {
        bench_json_string(s1, sizeof s1, r->skipped[i]);
        fprintf(f, "%s%s", i ? "," : "", s1);
    }
    fprintf(f, "],\n\"failures\":[");
    for (int i = 0; i < r->nfailures; i++) {
        bench_json_string(s1, sizeof s1, r->failures[i]);
        fprintf(f, "%s%s", i ? "," : "", s1);
    }
    fprintf(f, "]}\n");
}

/* Writes <out>/<name> through a temporary file and rename, so a killed run
 * leaves the previous file whole. */
static int write_file(const runner *r, const char *name, bool markdown)
{
    char path[PATH_MAX + 32], tmp[PATH_MAX + 40];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", r->out, name);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", r->out, name);
    if (!(f = fopen(tmp, "w"))) {
        fprintf(stderr, "bench_all: cannot write %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    if (markdown)
        print_table(r, f, true);
    else
        json_body(r, f);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "bench_all: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    fprintf(stderr, "bench_all: wrote %s\n", path);
    return 0;
}

/* latency.png: bench_messaging's repeated-handoff results (one per size),
 * by the size in the op. */
static int draw_latency(const runner *r)
{
    double (*pts)[3] = calloc((size_t)r->nresults + 1, sizeof *pts);
    char dat[PATH_MAX + 32], png[PATH_MAX + 32], prim[256] = "bare primitive";
    int n = 0, rc = 0;
    if (!pts)
        return -1;
    for (int i = 0; i < r->nresults; i++) {
        const bench_record *x = &r->results[i].rec;
        double size = bench_op_size_bytes(x->op);
        if (!strcmp(r->results[i].bench, "messaging") && strstr(x->op, "handoff") &&
            strstr(x->op, "repeated") && size > 0) {
            pts[n][0] = size;
            pts[n][1] = x->mproc;
            pts[n][2] = x->primitive;
            snprintf(prim, sizeof prim, "%s", x->primitive_name);
            for (char *q = prim; *q; q++)
                *q = *q == '\'' ? '"' : *q;   /* it goes inside '' below */
            n++;
        }
    }
    if (n == 0) {
        fprintf(stderr, "bench_all: no handoff results with sizes: latency.png not drawn\n");
        free(pts);
        return 0;
    }
    bench_sort_points(pts, n);
    snprintf(dat, sizeof dat, "%s/latency.dat", r->out);
    snprintf(png, sizeof png, "%s/latency.png", r->out);
    FILE *f = fopen(dat, "w");
    if (!f) {
        fprintf(stderr, "bench_all: cannot write %s: %s\n", dat, strerror(errno));
        free(pts);
        return -1;
    }
    fprintf(f, "# bytes mproc_us primitive_us\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "%.0f %g %g\n", pts[i][0], pts[i][1], pts[i][2]);
    fclose(f);
    rc = bench_plot_latency(png, dat, prim, pts, n);
    free(pts);
    return rc;
}

int main(int argc, char **argv)
{
    static runner r;
    int rc = parse_args(&r, argc, argv);
    if (rc != 0)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    if (find_programs(&r) != 0)
        return 2;
    if (r.nprograms == 0) {
        fprintf(stderr, "bench_all: no bench_* programs in %s (build first)\n", r.bin);
        return 2;
    }
    if (!(r.results = calloc(MAX_RESULTS, sizeof *r.results)))
        return 2;
    r.load_start = bench_load_average();
    for (int i = 0; i < r.nprograms; i++)
        run_program(&r, r.names[i]);
    print_table(&r, stdout, false);
    if (mkdirs(r.out) != 0) {
        fprintf(stderr, "bench_all: cannot create %s: %s\n", r.out, strerror(errno));
        rc = 1;
    } else if (write_file(&r, "latest.json", false) != 0 ||
               write_file(&r, "latest.md", true) != 0 || draw_latency(&r) != 0) {
        rc = 1;
    }
    free(r.results);
    return rc != 0 || r.nfailures ? 1 : 0;
}
