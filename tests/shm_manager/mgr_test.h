/* Helpers for the shm-manager tests (header-only: every *_test.c is its own
 * binary). Each binary runs its own daemon in a private runtime directory
 * with a short grace period, so tests neither see nor disturb the user's. */
#ifndef MGR_TEST_H
#define MGR_TEST_H

/* Not every test binary uses every helper. */
#pragma GCC diagnostic ignored "-Wunused-function"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mp_test.h"
#include "shm/manager.h"
#include "shm/shm.h"

#define MGR_GRACE 0.5
static char mgr_dir[64];          /* private runtime directory */
static char mgr_bindir[PATH_MAX]; /* where the test binary, the daemon and mproc are */

static double mgr_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void mgr_sleep(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* As root, the binary gets a /dev/shm of its own (a tmpfs in a private
 * mount namespace, inherited by its children and its daemon): every shm
 * manager of the uid judges every /dev/shm/mproc-* segment, so another
 * test's daemon, or another checkout's on a shared machine, would adopt
 * and reclaim the segments these tests leave "leaked" on purpose. Without
 * root the shared /dev/shm is used (a fresh CI machine runs no foreign
 * daemon; ours leave what other daemons track to them, see peers.c). */
static void mgr_private_dev_shm(void)
{
    if (geteuid() != 0 || unshare(CLONE_NEWNS) != 0)
        return;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=1g") != 0)
        fprintf(stderr, "note: no private /dev/shm (%s); using the shared one\n",
                strerror(errno));
}

/* Call first in main. */
static void mgr_test_env(void)
{
    char exe[PATH_MAX], path[PATH_MAX + 32], grace[16];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        abort();
    exe[n] = 0;
    mgr_private_dev_shm();
    snprintf(mgr_bindir, sizeof mgr_bindir, "%s", dirname(exe));
    snprintf(mgr_dir, sizeof mgr_dir, "/tmp/mproc-test.XXXXXX");
    if (!mkdtemp(mgr_dir))
        abort();
    snprintf(path, sizeof path, "%s/mproc-shm-manager", mgr_bindir);
    snprintf(grace, sizeof grace, "%g", MGR_GRACE);
    setenv("MPROC_RUNTIME_DIR", mgr_dir, 1);
    setenv("MPROC_SHM_MANAGER", path, 1);
    setenv("MPROC_SHM_MANAGER_GRACE", grace, 1);
}

/* Stops our daemon (if any) and removes the runtime directory. */
static void mgr_test_cleanup(void)
{
    char *reply = NULL;
    char path[PATH_MAX + 32];
    if (mp__mgr_control("STOP", &reply, 2.0) == 0)
        free(reply);
    for (int i = 0; i < 200; i++) {
        int fd;
        if (mp__mgr_connect(&fd) != 0)
            break;
        close(fd);
        mgr_sleep(0.01);
    }
    const char *files[] = {MP__MGR_LOCK, MP__MGR_LOG, MP__MGR_SOCKET, MP__MGR_DGRAM};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", mgr_dir, files[i]);
        unlink(path);
    }
    rmdir(mgr_dir);
}

static int mgr_test_finish(int rc)
{
    mgr_test_cleanup();
    return rc;
}

/* main's body: the group's tests, against a daemon of a private runtime
 * directory made first and removed after. */
#define mgr_run_tests(tests)                                                                       \
    (mgr_test_env(), mgr_test_finish(cmocka_run_group_tests(tests, NULL, NULL)))

/* The daemon's pid from the lock file, if that process is alive; else 0. */
static pid_t mgr_daemon_pid(void)
{
    char path[PATH_MAX + 32];
    int pid = 0;
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", mgr_dir, MP__MGR_LOCK);
    if (!(f = fopen(path, "re")))
        return 0;
    if (fscanf(f, "%d", &pid) != 1)
        pid = 0;
    fclose(f);
    return pid > 0 && mp__pid_alive(pid) ? (pid_t)pid : 0;
}

/* Daemons serving our runtime directory, counted from /proc (environ). */
static int mgr_count_daemons(void)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    char want[PATH_MAX + 32];
    int n = 0;
    snprintf(want, sizeof want, "MPROC_RUNTIME_DIR=%s", mgr_dir);
    while (d && (e = readdir(d))) {
        char path[300], comm[64] = "", env[8192];
        int pid = atoi(e->d_name), fd;
        FILE *f;
        ssize_t len;
        if (pid <= 0 || !mp__pid_alive(pid))
            continue;
        snprintf(path, sizeof path, "/proc/%d/comm", pid);
        if (!(f = fopen(path, "re")))
            continue;
        if (!fgets(comm, sizeof comm, f))
            comm[0] = 0;
        fclose(f);
        if (strncmp(comm, "mproc-shm-manag", 15) != 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        len = read(fd, env, sizeof env - 1);
        close(fd);
        for (ssize_t i = 0; i < len; i += (ssize_t)strlen(env + i) + 1) {
            env[len] = 0;
            if (strcmp(env + i, want) == 0) {
                n++;
                break;
            }
        }
    }
    if (d)
        closedir(d);
    return n;
}

/* Whether /dev/shm holds a segment named after pid ("mproc-<pid>-..."). */
static bool mgr_shm_of(pid_t pid)
{
    char prefix[32];
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    bool found = false;
    snprintf(prefix, sizeof prefix, "mproc-%d-", (int)pid);
    while (d && !found && (e = readdir(d)))
        found = strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return found;
}

/* Waits until no segment of any of the pids remains; false at the timeout. */
static bool mgr_wait_clean(const pid_t *pids, int n, double timeout)
{
    double end = mgr_now() + timeout;
    for (;;) {
        bool any = false;
        for (int i = 0; i < n && !any; i++)
            any = mgr_shm_of(pids[i]);
        if (!any)
            return true;
        if (mgr_now() > end)
            return false;
        mgr_sleep(0.01);
    }
}

static bool mgr_exists(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%s", name[0] == '/' ? name + 1 : name);
    return access(path, F_OK) == 0;
}

/* A daemon statistic from STATUS ("clients", "segments"); -1 if none runs. */
static int mgr_stat(const char *key)
{
    char *reply = NULL, *p, want[64];
    int v = -1;
    if (mp__mgr_control("STATUS", &reply, 2.0) != 0)
        return -1;
    snprintf(want, sizeof want, "\n%s ", key);
    if ((p = strstr(reply, want)))
        v = atoi(p + strlen(want));
    free(reply);
    return v;
}

/* Waits for the condition mgr_stat(key) == want. */
static bool mgr_wait_stat(const char *key, int want, double timeout)
{
    double end = mgr_now() + timeout;
    while (mgr_stat(key) != want)
        if (mgr_now() > end)
            return false;
        else
            mgr_sleep(0.01);
    return true;
}

/* Kills our daemon (SIGKILL) and waits until it is gone. */
/* Segments the daemon tracks from reports of pid (not merely adopted);
 * -1 if no daemon answers. Other tests' segments may be adopted too. */
static int mgr_tracked(pid_t pid)
{
    char *reply = NULL, *p, want[48];
    int n = 0;
    if (mp__mgr_control("LIST", &reply, 2.0) != 0)
        return -1;
    snprintf(want, sizeof want, "SEG /mproc-%d-", (int)pid);
    for (p = reply; (p = strstr(p, want)); p++) {
        char *eol = strchr(p, '\n');
        if (eol && eol - p > 8 && strncmp(eol - 7, "tracked", 7) == 0)
            n++;
    }
    free(reply);
    return n;
}

static bool mgr_wait_tracked(pid_t pid, int want, double timeout)
{
    double end = mgr_now() + timeout;
    while (mgr_tracked(pid) != want)
        if (mgr_now() > end)
            return false;
        else
            mgr_sleep(0.01);
    return true;
}

/* Exactly one daemon once the losers of a race have left. */
static bool mgr_wait_one_daemon(double timeout)
{
    double end = mgr_now() + timeout;
    while (mgr_count_daemons() != 1)
        if (mgr_now() > end)
            return false;
        else
            mgr_sleep(0.01);
    return true;
}

static void mgr_kill_daemon(void)
{
    pid_t pid = mgr_daemon_pid();
    if (pid > 0) {
        kill(pid, SIGKILL);
        for (int i = 0; i < 500 && mp__pid_alive(pid); i++)
            mgr_sleep(0.01);
    }
}

/* Pipe helpers: a one-byte "go"/"ready" between parent and child. */
static void mgr_put(int fd, char c)
{
    while (write(fd, &c, 1) < 0 && errno == EINTR)
        ;
}

static char mgr_get(int fd, double timeout)
{
    char c = 0;
    struct timespec ts = {0, 1000000};
    double end = mgr_now() + timeout;
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    for (;;) {
        ssize_t r = read(fd, &c, 1);
        if (r == 1 || r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            break;
        if (mgr_now() > end)
            break;
        nanosleep(&ts, NULL);
    }
    fcntl(fd, F_SETFL, fl);
    return c;
}

typedef struct child {
    pid_t pid;
    int to, from; /* pipe ends: parent -> child, child -> parent */
} child;

/* Forks a child running fn(to_read, from_write); it _exits with fn's value. */
static child child_start(int (*fn)(int in, int out, void *arg), void *arg)
{
    int a[2], b[2];
    child c = {-1, -1, -1};
    assert_int_equal(pipe2(a, O_CLOEXEC), 0);
    assert_int_equal(pipe2(b, O_CLOEXEC), 0);
    c.pid = fork();
    assert_true(c.pid >= 0);
    if (c.pid == 0) {
        close(a[1]);
        close(b[0]);
        _exit(fn(a[0], b[1], arg));
    }
    close(a[0]);
    close(b[1]);
    c.to = a[1];
    c.from = b[0];
    return c;
}

static void child_end(child *c, bool kill_it)
{
    int status = 0;
    if (kill_it)
        kill(c->pid, SIGKILL);
    waitpid(c->pid, &status, 0);
    close(c->to);
    close(c->from);
    if (!kill_it && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        fail_msg("child %d ended with status 0x%x", (int)c->pid, (unsigned)status);
}

/* Child: creates a segment holding 42, exports it (the "sent" report: a
 * message now carries it), gives the name to the parent, releases its own
 * reference and waits. */
static int mgr_sender(int in, int out, void *arg)
{
    mp__segment *s;
    mp__segment_handle h;
    if (mp__segment_create(4096, MP__STRATEGY_FS, &s) != 0 || mp__segment_export(s, &h) != 0)
        return 10;
    ((char *)mp__segment_data(s))[0] = 42;
    mp__segment_release(s);
    (void)!write(out, h.name, sizeof h.name);
    mgr_get(in, 30);
    return 0;
}

#endif
