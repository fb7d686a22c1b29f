/* Issue 5's "done when": examples/producer_consumer --strategy file_system
 * SIGKILLed (its whole process group) at random points twenty times in a
 * row, three times with the daemon SIGKILLed just before; afterwards
 * `mproc shm ls` lists no file_system segment and /dev/shm holds no mproc
 * segment. The seed and kill points are printed to reproduce a failure. */
#include "mgr_test.h"

#define RUNS 20
#define MAX_PIDS 1024

static pid_t seen[MAX_PIDS]; /* every process of every run (for a shared /dev/shm) */
static int nseen;

/* Records the members of process group pgid. */
static void record_group(pid_t pgid)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d)) && nseen < MAX_PIDS) {
        char path[300], buf[512], *p;
        int pid = atoi(e->d_name), pgrp = 0;
        FILE *f;
        if (pid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        if (!(f = fopen(path, "re")))
            continue;
        /* "pid (comm) state ppid pgrp ..." */
        if (fgets(buf, sizeof buf, f) && (p = strrchr(buf, ')')) &&
            sscanf(p + 1, " %*c %*d %d", &pgrp) == 1 && pgrp == (int)pgid)
            seen[nseen++] = (pid_t)pid;
        fclose(f);
    }
    if (d)
        closedir(d);
}

static pid_t start_example(const char *bin)
{
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        setsid(); /* its own process group: killed as one */
        dup2(null, 1);
        dup2(null, 2);
        execl(bin, bin, "--producers", "2", "--consumers", "2", "--count", "100000000",
              "--size", "65536", "--strategy", "file_system", (char *)NULL);
        _exit(127);
    }
    assert_true(pid > 0);
    return pid;
}

/* Whether /dev/shm holds an mproc segment (of a recorded pid, unless the
 * /dev/shm is this binary's own). */
static bool mproc_left(bool private_shm)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    bool found = false;
    while (d && !found && (e = readdir(d))) {
        if (strncmp(e->d_name, MP__SHM_PREFIX, strlen(MP__SHM_PREFIX)) != 0)
            continue;
        if (private_shm)
            found = true;
        for (int i = 0; i < nseen && !found; i++)
            found = atoi(e->d_name + strlen(MP__SHM_PREFIX)) == (int)seen[i];
    }
    if (d)
        closedir(d);
    return found;
}

/* Whether mgr_test_env gave us a /dev/shm of our own (another mount
 * namespace than our parent's). */
static bool private_dev_shm(void)
{
    char self[64], parent[64], path[64];
    ssize_t a = readlink("/proc/self/ns/mnt", self, sizeof self - 1), b;
    snprintf(path, sizeof path, "/proc/%d/ns/mnt", (int)getppid());
    b = readlink(path, parent, sizeof parent - 1);
    if (a <= 0 || b <= 0)
        return false;
    self[a] = parent[b] = 0;
    return strcmp(self, parent) != 0;
}

static void test_sigkill_twenty_times(void **state)
{
    char bin[PATH_MAX + 32], cmd[PATH_MAX + 64];
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    bool private_shm = private_dev_shm();
    double t0;

    snprintf(bin, sizeof bin, "%s/producer_consumer", mgr_bindir);
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "skipped: %s not built (MPROC_BUILD_EXAMPLES=OFF)\n", bin);
        skip();
    }
    fprintf(stderr, "seed %u, %s /dev/shm; kill points (ms):", seed,
            private_shm ? "private" : "shared");
    for (int run = 0; run < RUNS; run++) {
        int ms = 20 + (int)(rand_r(&seed) % 400), status;
        pid_t pid = start_example(bin);
        fprintf(stderr, " %d%s", ms, run % 6 == 3 ? "+daemon" : "");
        mgr_sleep(ms / 1000.0);
        if (run % 6 == 3) /* runs 3, 9, 15: the daemon dies first */
            mgr_kill_daemon();
        record_group(pid);
        kill(-pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
    }
    fprintf(stderr, "\n");
    /* Everything is dead: the daemon reclaims within its grace period (plus
     * a quarantine for what nobody could report). Generous bound. */
    t0 = mgr_now();
    while (mproc_left(private_shm) && mgr_now() - t0 < 10)
        mgr_sleep(0.05);
    fprintf(stderr, "clean after %.2f s\n", mgr_now() - t0);
    if (mproc_left(private_shm)) {
        snprintf(cmd, sizeof cmd, "ls -l /dev/shm >&2; tail -20 %s/%s >&2", mgr_dir,
                 MP__MGR_LOG);
        (void)!system(cmd);
        fail_msg("mproc segments left in /dev/shm 10 s after the last kill");
    }
    /* `mproc shm ls` agrees: no file_system segment (on a shared machine:
     * none of ours). */
    snprintf(cmd, sizeof cmd, "%s/mproc shm ls --json", mgr_bindir);
    FILE *f = popen(cmd, "re");
    char out[65536];
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = 0;
    assert_non_null(f);
    assert_int_equal(pclose(f), 0);
    if (private_shm && strstr(out, "\"file_system\""))
        fail_msg("mproc shm ls still lists segments:\n%s", out);
    for (int i = 0; i < nseen; i++) {
        char want[48];
        snprintf(want, sizeof want, "\"creator\":%d,", (int)seen[i]);
        if (strstr(out, want))
            fail_msg("mproc shm ls lists a segment of pid %d:\n%s", (int)seen[i], out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sigkill_twenty_times, mp_test_setup, mp_test_teardown),
    };
    return mgr_run_tests(tests);
}
