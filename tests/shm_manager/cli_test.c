/* The mproc CLI: golden text and JSON output of each subcommand on a known
 * set of segments, exit codes, usage errors, doctor on a lowered
 * RLIMIT_NOFILE; option syntax (getopt_long) and the strict number rule in
 * mproc and mproc-shm-manager, bad environment variables, doctor's fix
 * line for each runtime-directory problem. Runs build/mproc with a private
 * runtime directory. */
#include <sys/resource.h>

#include "mgr_test.h"

static char out[65536], err[65536];

/* Runs program prog of the build folder with args (NULL-terminated);
 * captures stdout/stderr. With nofile > 0 the child's open-files soft
 * limit is lowered first. */
static int run_prog(const char *prog, long nofile, const char *const *args)
{
    char bin[PATH_MAX + 32];
    char *argv[16];
    int o[2], e[2], status = 0, n = 0;
    pid_t pid;
    snprintf(bin, sizeof bin, "%s/%s", mgr_bindir, prog);
    argv[n++] = bin;
    for (int i = 0; args[i] && n < 15; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    assert_int_equal(pipe2(o, O_CLOEXEC), 0);
    assert_int_equal(pipe2(e, O_CLOEXEC), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(o[1], 1);
        dup2(e[1], 2);
        if (nofile > 0) {
            struct rlimit rl;
            getrlimit(RLIMIT_NOFILE, &rl);
            rl.rlim_cur = (rlim_t)nofile;
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        execv(bin, argv);
        _exit(127);
    }
    close(o[1]);
    close(e[1]);
    /* Outputs are small: read both to EOF (stdout first; stderr fits a pipe). */
    size_t lo = 0, le = 0;
    ssize_t r;
    while ((r = read(o[0], out + lo, sizeof out - 1 - lo)) > 0)
        lo += (size_t)r;
    while ((r = read(e[0], err + le, sizeof err - 1 - le)) > 0)
        le += (size_t)r;
    out[lo] = err[le] = 0;
    close(o[0]);
    close(e[0]);
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run_mproc(long nofile, const char *const *args)
{
    return run_prog("mproc", nofile, args);
}

#define MPROC(...) run_mproc(0, (const char *const[]){__VA_ARGS__, NULL})
#define DAEMON(...) run_prog("mproc-shm-manager", 0, (const char *const[]){__VA_ARGS__, NULL})

static void assert_out(const char *want)
{
    if (strcmp(out, want) != 0)
        fail_msg("output differs.\n--- want\n%s--- got\n%s--- stderr\n%s", want, out, err);
}

/* The known set: A, created by us (alive), held open by a child (1 user),
 * refcount 1; B, created by a dead process, refcount 2 left by killed
 * users, nobody maps it: leaked. */
static char name_a[64], name_b[64], prefix[48];
static pid_t holder = -1, dead = -1;

static void make_segment(const char *name, pid_t creator, uint32_t refs, uint64_t size)
{
    char path[128];
    mp__fs_header h = {MP__FS_MAGIC, MP__FS_VERSION, (uint32_t)creator, size, refs, 0};
    int fd;
    snprintf(path, sizeof path, "/dev/shm%s", name);
    fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)(MP__FS_HEADER_SIZE + size)), 0);
    assert_int_equal(pwrite(fd, &h, sizeof h, 0), (ssize_t)sizeof h);
    close(fd);
}

static int setup_segments(void **state)
{
    int p[2];
    char c;
    assert_int_equal(mp_test_setup(state), 0);
    dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    snprintf(prefix, sizeof prefix, "/mproc-%d-golden", (int)getpid());
    snprintf(name_a, sizeof name_a, "%sA", prefix);
    snprintf(name_b, sizeof name_b, "%sB", prefix);
    make_segment(name_a, getpid(), 1, 4096);
    make_segment(name_b, dead, 2, 100);
    assert_int_equal(pipe(p), 0);
    holder = fork();
    if (holder == 0) {
        int fd = shm_open(name_a, O_RDWR, 0);
        close(p[0]);
        mgr_put(p[1], fd >= 0 ? 'k' : 'x');
        pause();
        _exit(0);
    }
    close(p[1]);
    c = mgr_get(p[0], 10);
    close(p[0]);
    assert_int_equal(c, 'k');
    return 0;
}

static int teardown_segments(void **state)
{
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    shm_unlink(name_a);
    shm_unlink(name_b);
    return mp_test_teardown(state);
}

/* Columns as wide as their widest cell (the names here are the widest of
 * their column; the sizes 4096 and 100 fit "SIZE", the pids "CREATOR"). */
static void test_shm_ls_text(void **state)
{
    char want[2048];
    int n = 0, wn = (int)(strlen(name_a) > strlen(name_b) ? strlen(name_a) : strlen(name_b));
    n += snprintf(want + n, sizeof want - (size_t)n, "%-*s %4s %7s %-5s %4s %5s %s\n", wn,
                  "NAME", "SIZE", "CREATOR", "ALIVE", "REFS", "USERS", "LEAKED");
    n += snprintf(want + n, sizeof want - (size_t)n, "%-*s %4s %7d %-5s %4s %5s %s\n", wn,
                  name_a, "4096", (int)getpid(), "yes", "1", "1", "no");
    snprintf(want + n, sizeof want - (size_t)n, "%-*s %4s %7d %-5s %4s %5s %s\n", wn, name_b,
             "100", (int)dead, "no", "2", "0", "yes");
    assert_int_equal(MPROC("shm", "ls", "--prefix", prefix), 0);
    assert_out(want);
}

/* The widest common row, a 7-digit creator pid (pid_max 4194304, systemd's
 * default) and a 10-digit size, fits an 80-column terminal. */
static void test_shm_ls_fits_80_columns(void **state)
{
    const char *name = "/mproc-4194303-0123456789abcdef";
    char path[64];
    mp__fs_header h = {MP__FS_MAGIC, MP__FS_VERSION, 4194303, 9999999999ull, 1, 0};
    int fd, lines = 0;
    snprintf(path, sizeof path, "/dev/shm%s", name);
    make_segment(name, 4194303, 1, 0);
    fd = open(path, O_RDWR | O_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &h, sizeof h, 0), (ssize_t)sizeof h);
    close(fd);
    assert_int_equal(MPROC("shm", "ls", "--prefix", "/mproc-4194303-"), 0);
    shm_unlink(name);
    assert_non_null(strstr(out, "9999999999"));
    for (const char *line = out; *line; line = strchr(line, '\n') + 1, lines++) {
        assert_non_null(strchr(line, '\n'));
        if (strchr(line, '\n') - line > 80)
            fail_msg("wider than 80 columns: %.*s", (int)(strchr(line, '\n') - line), line);
    }
    assert_int_equal(lines, 2);
}

static void test_shm_ls_json(void **state)
{
    char want[2048];
    snprintf(want, sizeof want,
             "{\"segments\":[\n"
             "{\"name\":\"%s\",\"size\":4096,\"strategy\":\"file_system\",\"creator\":%d,"
             "\"creator_alive\":true,\"refcount\":1,\"users\":1,\"in_flight\":0,"
             "\"leaked\":false},\n"
             "{\"name\":\"%s\",\"size\":100,\"strategy\":\"file_system\",\"creator\":%d,"
             "\"creator_alive\":false,\"refcount\":2,\"users\":0,\"in_flight\":0,"
             "\"leaked\":true}\n"
             "]}\n",
             name_a, (int)getpid(), name_b, (int)dead);
    assert_int_equal(MPROC("shm", "ls", "--json", "--prefix", prefix), 0);
    assert_out(want);
    assert_int_equal(MPROC("shm", "ls", "--json", "--prefix", "/mproc-0-none"), 0);
    assert_out("{\"segments\":[]}\n");
}

static void test_shm_gc(void **state)
{
    char want[512];
    unsigned long long bytes = MP__FS_HEADER_SIZE + 100;
    snprintf(want, sizeof want,
             "would free %s (%llu bytes)\nwould free 1 segment, %llu bytes\n", name_b, bytes,
             bytes);
    assert_int_equal(MPROC("shm", "gc", "--dry-run", "--prefix", prefix), 0);
    assert_out(want);
    assert_true(mgr_exists(name_b));
    snprintf(want, sizeof want,
             "freed %s (%llu bytes)\nfreed 1 segment, %llu bytes\n", name_b, bytes, bytes);
    assert_int_equal(MPROC("shm", "gc", "--prefix", prefix), 0);
    assert_out(want);
    assert_false(mgr_exists(name_b));
    assert_true(mgr_exists(name_a)); /* alive creator, in use: kept */
    assert_int_equal(MPROC("shm", "gc", "--prefix", prefix), 0);
    assert_out("freed 0 segments, 0 bytes\n");
}

/* The CUDA driver's event file of a dead process of ours goes; one of a live
 * process stays. Each is picked with --prefix, so other files are safe. */
static void test_shm_gc_cuda_event_files(void **state)
{
    char dead_file[64], live_file[64], want[256];
    snprintf(dead_file, sizeof dead_file, "/cuda.shm.%x.%x.1", (unsigned)geteuid(),
             (unsigned)dead);
    snprintf(live_file, sizeof live_file, "/cuda.shm.%x.%x.1", (unsigned)geteuid(),
             (unsigned)getpid());
    make_segment(dead_file, dead, 1, 100);
    make_segment(live_file, getpid(), 1, 100);
    unsigned long long bytes = MP__FS_HEADER_SIZE + 100;
    snprintf(want, sizeof want, "would free %s (%llu bytes)\nwould free 1 segment, %llu bytes\n",
             dead_file, bytes, bytes);
    assert_int_equal(MPROC("shm", "gc", "--dry-run", "--prefix", dead_file), 0);
    assert_out(want);
    assert_true(mgr_exists(dead_file));
    snprintf(want, sizeof want, "freed %s (%llu bytes)\nfreed 1 segment, %llu bytes\n",
             dead_file, bytes, bytes);
    assert_int_equal(MPROC("shm", "gc", "--prefix", dead_file), 0);
    assert_out(want);
    assert_false(mgr_exists(dead_file));
    assert_int_equal(MPROC("shm", "gc", "--prefix", live_file), 0);
    assert_out("freed 0 segments, 0 bytes\n");
    assert_true(mgr_exists(live_file));
    shm_unlink(live_file);
}

/* One `shm ls` row of a CUDA driver event file (no header: REFS is "-"). */
static int cuda_row(char *buf, size_t cap, const char *name, pid_t pid, bool alive, int users,
                    bool leaked)
{
    char size[24];
    snprintf(size, sizeof size, "%llu", (unsigned long long)(MP__FS_HEADER_SIZE + 100));
    return snprintf(buf, cap, "%-*s %*s %7d %-5s %4s %5d %s\n", (int)strlen(name), name,
                    (int)strlen(size) > 4 ? (int)strlen(size) : 4, size, (int)pid,
                    alive ? "yes" : "no", "-", users, leaked ? "yes" : "no");
}

/* `shm ls` shows the driver's event files beside mproc's segments, with the
 * processes that map them: those of a dead process are leaked even while a
 * peer maps them (it never opens them again), and gc takes them; one of a
 * live process is not. */
static void test_shm_ls_cuda_event_files(void **state)
{
    char leaked[80], mapped[80], live[80], prefix_dead[64], want[1024], path[96];
    int n, fd, ready[2];
    pid_t mapper;
    snprintf(prefix_dead, sizeof prefix_dead, "/cuda.shm.%x.%x.", (unsigned)geteuid(),
             (unsigned)dead);
    snprintf(leaked, sizeof leaked, "%s1", prefix_dead);
    snprintf(mapped, sizeof mapped, "%s2", prefix_dead);
    snprintf(live, sizeof live, "/cuda.shm.%x.%x.1", (unsigned)geteuid(), (unsigned)getpid());
    make_segment(leaked, dead, 1, 100);
    make_segment(mapped, dead, 1, 100);
    make_segment(live, getpid(), 1, 100);
    snprintf(path, sizeof path, "/dev/shm%s", mapped);
    assert_int_equal(pipe(ready), 0);
    if ((mapper = fork()) == 0) { /* maps the file, as a receiver of its events does */
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0 || mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED)
            _exit(1);
        (void)!write(ready[1], "r", 1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    assert_int_equal(read(ready[0], want, 1), 1);
    close(ready[0]);

    n = snprintf(want, sizeof want, "%-*s %*s %7s %-5s %4s %5s %s\n", (int)strlen(leaked),
                 "NAME", MP__FS_HEADER_SIZE + 100 > 9999 ? 5 : 4, "SIZE", "CREATOR", "ALIVE",
                 "REFS", "USERS", "LEAKED");
    n += cuda_row(want + n, sizeof want - (size_t)n, leaked, dead, false, 0, true);
    cuda_row(want + n, sizeof want - (size_t)n, mapped, dead, false, 1, true);
    assert_int_equal(MPROC("shm", "ls", "--prefix", prefix_dead), 0);
    assert_out(want);
    assert_int_equal(MPROC("shm", "ls", "--json", "--prefix", live), 0);
    snprintf(want, sizeof want,
             "{\"segments\":[\n{\"name\":\"%s\",\"size\":%llu,\"strategy\":\"cuda_event\","
             "\"creator\":%d,\"creator_alive\":true,\"refcount\":null,\"users\":0,"
             "\"in_flight\":0,\"leaked\":false}\n]}\n",
             live, (unsigned long long)(MP__FS_HEADER_SIZE + 100), (int)getpid());
    assert_out(want);
    assert_int_equal(MPROC("shm", "gc", "--prefix", prefix_dead), 0);
    unsigned long long bytes = MP__FS_HEADER_SIZE + 100;
    snprintf(want, sizeof want,
             "freed %s (%llu bytes)\nfreed %s (%llu bytes)\nfreed 2 segments, %llu bytes\n",
             leaked, bytes, mapped, bytes, 2 * bytes);
    assert_out(want);
    assert_false(mgr_exists(leaked));
    assert_false(mgr_exists(mapped));
    assert_true(mgr_exists(live));
    kill(mapper, SIGKILL);
    waitpid(mapper, NULL, 0);
    shm_unlink(live);
}

static void test_doctor_low_nofile(void **state)
{
    assert_int_equal(run_mproc(64, (const char *const[]){"doctor", NULL}), 1);
    if (!strstr(out, "[warn] open_files   open-files limit is 64 (soft)") ||
        !strstr(out, "too low for 1000 shared tensors") || !strstr(out, "fix: "))
        fail_msg("doctor did not flag the open-files limit:\n%s", out);
    assert_int_equal(run_mproc(64, (const char *const[]){"doctor", "--json", NULL}), 1);
    if (!strstr(out, "{\"ok\":false,\"checks\":[\n{\"name\":\"open_files\",\"status\":\"warn\","
                     "\"detail\":\"open-files limit is 64 (soft)"))
        fail_msg("doctor --json did not flag the open-files limit:\n%s", out);
    /* Enough for 10 tensors: that check passes. */
    run_mproc(4096, (const char *const[]){"doctor", "--tensors", "10", NULL});
    if (!strstr(out, "[ok]   open_files   open-files limit is 4096 (soft)"))
        fail_msg("doctor --tensors 10 with 4096 fds:\n%s", out);
    const char *names[] = {"dev_shm", "memfd", "scm_rights", "shm_manager", "ptrace_scope"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strstr(out, names[i]))
            fail_msg("doctor does not report %s:\n%s", names[i], out);
}

static void test_shm_manager_commands(void **state)
{
    char want[128];
    pid_t pid;
    assert_int_equal(MPROC("shm-manager", "status"), 3);
    assert_out("mproc-shm-manager is not running\n");
    assert_int_equal(MPROC("shm-manager", "status", "--json"), 3);
    assert_out("{\"running\":false}\n");
    assert_int_equal(MPROC("shm-manager", "start"), 0);
    pid = mgr_daemon_pid();
    assert_true(pid > 0);
    snprintf(want, sizeof want, "pid          %d\nprotocol     %d\nclients      0\n", (int)pid,
             MP__MGR_PROTOCOL);
    assert_int_equal(strncmp(out, want, strlen(want)), 0);
    assert_int_equal(MPROC("shm-manager", "start"), 0); /* already running: fine */
    assert_int_equal(mgr_daemon_pid(), pid);
    assert_int_equal(MPROC("shm-manager", "status", "--json"), 0);
    snprintf(want, sizeof want, "{\"running\":true,\"pid\":%d,\"protocol\":%d,\"clients\":0,",
             (int)pid, MP__MGR_PROTOCOL);
    assert_int_equal(strncmp(out, want, strlen(want)), 0);
    mgr_sleep(MGR_GRACE + 0.3); /* started explicitly: stays past the grace period */
    assert_true(mp__pid_alive(pid));
    assert_int_equal(MPROC("doctor"), 0);
    assert_non_null(strstr(out, "[ok]   shm_manager  mproc-shm-manager runs"));
    assert_int_equal(MPROC("shm-manager", "stop"), 0);
    assert_out("mproc-shm-manager stopped\n");
    for (int i = 0; i < 200 && mp__pid_alive(pid); i++)
        mgr_sleep(0.01);
    assert_false(mp__pid_alive(pid));
    assert_int_equal(MPROC("shm-manager", "stop"), 0);
    assert_out("mproc-shm-manager is not running\n");
}

static void test_usage_and_help(void **state)
{
    const char *const bad[][4] = {
        {NULL},           {"bogus"},           {"shm"},          {"shm", "rm"},
        {"shm", "ls", "--bogus"}, {"shm", "gc", "--json"}, {"doctor", "--tensors", "x"},
        {"shm-manager"},  {"shm-manager", "restart"}, {"version", "extra"}, {"help", "nope"},
    };
    const char *const help[][4] = {
        {"--help"},           {"help"},        {"help", "shm", "ls"}, {"shm", "--help"},
        {"shm", "ls", "--help"}, {"shm", "gc", "-h"}, {"doctor", "--help"},
        {"shm-manager", "--help"}, {"version", "--help"}, {"help", "--help"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run_mproc(0, bad[i][0] ? bad[i] : (const char *const[]){NULL});
        if (rc != 2 || strncmp(err, "mproc: ", 7) != 0 || !strstr(err, "usage: mproc"))
            fail_msg("bad arguments #%zu: exit %d, stderr:\n%s", i, rc, err);
    }
    for (size_t i = 0; i < sizeof help / sizeof help[0]; i++) {
        int rc = run_mproc(0, help[i]);
        if (rc != 0 || strncmp(out, "usage: mproc", 12) != 0)
            fail_msg("help #%zu: exit %d, stdout:\n%s", i, rc, out);
    }
    assert_int_equal(MPROC("version"), 0);
    assert_out("mproc " MP_VERSION_STRING " (libmproc " MP_VERSION_STRING ")\n");
}

/* exit 2, "mproc: " + what + the usage on stderr. */
static void expect_usage_error(const char *const *args, const char *what)
{
    int rc = run_mproc(0, args);
    if (rc != 2 || strncmp(err, "mproc: ", 7) != 0 || !strstr(err, what) ||
        !strstr(err, "usage: mproc"))
        fail_msg("mproc %s ...: exit %d, want 2 and \"%s\"; stderr:\n%s", args[0], rc, what,
                 err);
}
#define BAD(what, ...) expect_usage_error((const char *const[]){__VA_ARGS__, NULL}, what)

static void test_option_syntax(void **state)
{
    BAD("--tensors \"9223372036854775807\": it is out of range; give a whole number from 0 "
        "to 1000000000", "doctor", "--tensors", "9223372036854775807");
    BAD("--tensors \"-1\": it is negative", "doctor", "--tensors=-1");
    BAD("--tensors \"\": it is empty", "doctor", "--tensors=");
    BAD("--tensors \"12x\": it is not a whole decimal number", "doctor", "--tensors", "12x");
    BAD("--tensors \"nan\": it is not a whole decimal number", "doctor", "--tensors", "nan");
    BAD("--tensors \"1e3\": it is not a whole decimal number", "doctor", "--tensors", "1e3");
    BAD("a value is missing after --tensors", "doctor", "--tensors");
    BAD("a value is missing after --prefix", "shm", "ls", "--prefix");
    BAD("no value goes with --json", "doctor", "--json=yes");
    BAD("unknown option -Z", "doctor", "-Z");
    BAD("unknown option --bogus", "shm", "gc", "--bogus=1");
    BAD("unknown option -x", "-x");
    BAD("--json goes with status only", "shm-manager", "--json", "stop");
    /* both spellings of a value; the sum no longer overflows */
    run_mproc(0, (const char *const[]){"doctor", "--tensors=1000000000", NULL});
    if (!strstr(out, "1000000000 shared tensors") || !strstr(out, "about 1000000064 fds"))
        fail_msg("doctor --tensors=1000000000:\n%s", out);
    run_mproc(0, (const char *const[]){"doctor", "--json", "--tensors", "7", NULL});
    assert_non_null(strstr(out, "7 shared tensors"));
    assert_int_equal(MPROC("shm", "ls", "--prefix=/mproc-0-none", "--json"), 0);
    assert_out("{\"segments\":[]}\n");
    /* -V / --version anywhere a command is expected */
    const char *const version[][4] = {{"-V"}, {"--version"}, {"version", "-V"}, {"doctor", "-V"},
                                      {"shm", "ls", "--version"}};
    for (size_t i = 0; i < sizeof version / sizeof version[0]; i++) {
        assert_int_equal(run_mproc(0, version[i]), 0);
        assert_out("mproc " MP_VERSION_STRING " (libmproc " MP_VERSION_STRING ")\n");
    }
}

static void expect_daemon_refuses(const char *const *args, const char *what)
{
    int rc = run_prog("mproc-shm-manager", 0, args);
    if (rc != 2 || strncmp(err, "mproc-shm-manager: ", 19) != 0 || !strstr(err, what))
        fail_msg("mproc-shm-manager %s: exit %d, want 2 and \"%s\"; stderr:\n%s",
                 args[0] ? args[0] : "", rc, what, err);
}
#define DAEMON_BAD(what, ...) expect_daemon_refuses((const char *const[]){__VA_ARGS__}, what)

/* The daemon's options, and MPROC_SHM_MANAGER_GRACE: a bad value is an
 * error (it used to become 0, or a negative grace). */
static void test_daemon_numbers(void **state)
{
    char *saved = strdup(getenv("MPROC_SHM_MANAGER_GRACE"));
    DAEMON_BAD("--grace \"nan\": it is not a decimal number", "--grace", "nan", NULL);
    DAEMON_BAD("--grace \"-5\": it is negative", "--grace=-5", NULL);
    DAEMON_BAD("--grace \"abc\": it is not a decimal number", "-g", "abc", NULL);
    DAEMON_BAD("--grace \"\": it is empty", "--grace=", NULL);
    DAEMON_BAD("--grace \"1e999\": it is out of range", "--grace", "1e999", NULL);
    DAEMON_BAD("--grace \"inf\"", "--grace", "inf", NULL);
    DAEMON_BAD("a value is missing after --grace", "--grace", NULL);
    DAEMON_BAD("unknown option --bogus", "--bogus", NULL);
    assert_int_equal(DAEMON("--version"), 0);
    assert_out("mproc-shm-manager " MP_VERSION_STRING " (libmproc " MP_VERSION_STRING ")\n");
    assert_int_equal(DAEMON("-h"), 0);
    assert_non_null(strstr(out, "-g, --grace S"));
    static const char *const bad[] = {"abc", "-5", "nan", "2x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MPROC_SHM_MANAGER_GRACE", bad[i], 1);
        DAEMON_BAD("refusing to start: environment variable MPROC_SHM_MANAGER_GRACE", "-f",
                   NULL);
        /* the CLI says it too, before starting anything */
        assert_int_equal(MPROC("shm-manager", "start"), 1);
        if (!strstr(err, "cannot start the daemon: environment variable "
                         "MPROC_SHM_MANAGER_GRACE"))
            fail_msg("shm-manager start with GRACE=%s:\n%s", bad[i], err);
        assert_int_equal(MPROC("doctor"), 1);
        if (!strstr(out, "[fail] grace_env") ||
            !strstr(out, "fix: set MPROC_SHM_MANAGER_GRACE to a number of seconds"))
            fail_msg("doctor with GRACE=%s:\n%s", bad[i], out);
    }
    setenv("MPROC_SHM_MANAGER_GRACE", saved, 1);
    free(saved);
}

/* doctor's runtime_dir line and fix for dir, run with MPROC_RUNTIME_DIR
 * (or, when env is false, XDG_RUNTIME_DIR) pointing there. */
static void doctor_dir(const char *var, const char *value, const char *detail, const char *fix)
{
    char *saved = strdup(getenv("MPROC_RUNTIME_DIR"));
    if (strcmp(var, "MPROC_RUNTIME_DIR") != 0)
        unsetenv("MPROC_RUNTIME_DIR");
    setenv(var, value, 1);
    assert_int_equal(MPROC("doctor"), 1);
    if (!strstr(out, "[fail] runtime_dir") || !strstr(out, detail) || !strstr(out, fix) ||
        !strstr(out, "[fail] shm_manager  mproc-shm-manager cannot run: its runtime directory"))
        fail_msg("%s=%s: want \"%s\" and fix \"%s\":\n%s", var, value, detail, fix, out);
    if (strcmp(var, "MPROC_RUNTIME_DIR") == 0 && (strstr(out, "remove") || strstr(out, "rm ")))
        fail_msg("doctor tells to remove a path the user chose:\n%s", out);
    unsetenv(var);
    setenv("MPROC_RUNTIME_DIR", saved, 1);
    free(saved);
}

static void test_runtime_dir_fixes(void **state)
{
    char dir[128], fix[256], file[160];
    snprintf(dir, sizeof dir, "%s/rt", mgr_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(chmod(dir, 0755), 0); /* past the umask */
    snprintf(fix, sizeof fix, "fix: chmod 700 %s", dir);
    doctor_dir("MPROC_RUNTIME_DIR", dir, "is mode 0755", fix);
    if (geteuid() == 0) { /* only root can give it away */
        assert_int_equal(chmod(dir, 0700), 0);
        assert_int_equal(chown(dir, 12345, (gid_t)-1), 0);
        doctor_dir("MPROC_RUNTIME_DIR", dir, "belongs to uid 12345, not to you",
                   "fix: set MPROC_RUNTIME_DIR to a directory you own");
    }
    assert_int_equal(rmdir(dir), 0);
    doctor_dir("MPROC_RUNTIME_DIR", "/etc/passwd",
               "MPROC_RUNTIME_DIR=/etc/passwd is a regular file, not a directory mproc made",
               "fix: set MPROC_RUNTIME_DIR to a private directory (yours, mode 0700) or unset "
               "it");
    /* relative: it would name another folder in each working directory */
    doctor_dir("MPROC_RUNTIME_DIR", "rt",
               "MPROC_RUNTIME_DIR=rt is not an absolute path",
               "fix: set MPROC_RUNTIME_DIR to an absolute path, or unset it");
    /* mproc's own default name taken by a file: removing that is fine */
    snprintf(file, sizeof file, "%s/mproc", mgr_dir);
    close(open(file, O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    snprintf(fix, sizeof fix, "remove it (rm %s)", file);
    doctor_dir("XDG_RUNTIME_DIR", mgr_dir, "is a regular file, not a directory mproc made", fix);
    unlink(file);
    /* shm-manager status names the variable and never says remove */
    char *saved = strdup(getenv("MPROC_RUNTIME_DIR"));
    setenv("MPROC_RUNTIME_DIR", "/etc/passwd", 1);
    assert_int_equal(MPROC("shm-manager", "status"), 1);
    if (!strstr(err, "MPROC_RUNTIME_DIR=/etc/passwd is a regular file, not a directory mproc "
                     "made; set MPROC_RUNTIME_DIR to a private directory") ||
        strstr(err, "remove"))
        fail_msg("shm-manager status with MPROC_RUNTIME_DIR=/etc/passwd:\n%s", err);
    setenv("MPROC_RUNTIME_DIR", saved, 1);
    free(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_shm_ls_text, setup_segments, teardown_segments),
        cmocka_unit_test_setup_teardown(test_shm_ls_fits_80_columns, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_shm_ls_json, setup_segments, teardown_segments),
        cmocka_unit_test_setup_teardown(test_shm_gc, setup_segments, teardown_segments),
        cmocka_unit_test_setup_teardown(test_shm_gc_cuda_event_files, setup_segments,
                                        teardown_segments),
        cmocka_unit_test_setup_teardown(test_shm_ls_cuda_event_files, setup_segments,
                                        teardown_segments),
        cmocka_unit_test(test_doctor_low_nofile),
        cmocka_unit_test(test_shm_manager_commands),
        cmocka_unit_test(test_usage_and_help),
        cmocka_unit_test(test_option_syntax),
        cmocka_unit_test(test_daemon_numbers),
        cmocka_unit_test(test_runtime_dir_fixes),
    };
    return mgr_run_tests(tests);
}
