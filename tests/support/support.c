#include "mp_test.h"
#include "os/os.h"
#include "shm/manager.h"

#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The library's own fd count (src/os/util.c). */
int mp__count_open_fds(void);

/* The shm manager client's socket is the library's, kept for the process's
 * lifetime once the first file_system segment is reported: not a leak. */
int mp__mgr_client_fd(void);

int mp_test_count_fds(void)
{
    return mp__count_open_fds() - (mp__mgr_client_fd() >= 0);
}
/* /dev/shm is shared by every process of the user (and by tests running in
 * parallel), so only the mproc segments this test's processes created count:
 * names carry the creator's pid, and every process forked from here records
 * its pid in a shared log (an atfork handler, inherited by grandchildren).
 * A segment whose creator is gone but was one of ours still counts (a child
 * that leaked and died); one of an unrelated process never does. */
#define PIDLOG_MAX 4096
static struct pidlog {
    unsigned n;
    pid_t pids[PIDLOG_MAX];
} *pidlog;
static pthread_once_t pidlog_once = PTHREAD_ONCE_INIT;

static void pidlog_child(void)
{
    unsigned i = __atomic_fetch_add(&pidlog->n, 1, __ATOMIC_RELAXED);
    pidlog->pids[i % PIDLOG_MAX] = getpid();
}

static void pidlog_init(void)
{
    void *p = mmap(NULL, sizeof *pidlog, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED)
        return;
    pidlog = p;
    pthread_atfork(NULL, NULL, pidlog_child);
}

/* Fields 3 and 4 of /proc/<pid>/stat (state, parent); false when it cannot
 * be read (the process is gone). */
static bool proc_stat(pid_t pid, char *state, pid_t *ppid)
{
    char path[64], buf[512];
    bool ok = false;
    int parent;
    FILE *f;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "r")))
        return false;
    if (fgets(buf, sizeof buf, f)) {
        const char *p = strrchr(buf, ')'); /* the name may hold spaces and ')' */
        ok = p && sscanf(p + 1, " %c %d", state, &parent) == 2;
        *ppid = ok ? (pid_t)parent : 0;
    }
    fclose(f);
    return ok;
}

pid_t mp_test_parent_of(pid_t pid)
{
    char state;
    pid_t ppid;
    return proc_stat(pid, &state, &ppid) ? ppid : 0;
}

static bool pid_ours(pid_t pid)
{
    if (pid == getpid())
        return true;
    if (pidlog) {
        unsigned n = __atomic_load_n(&pidlog->n, __ATOMIC_RELAXED);
        for (unsigned i = 0; i < n && i < PIDLOG_MAX; i++)
            if (pidlog->pids[i] == pid)
                return true;
    }
    /* a live child started some other way (clone, posix_spawn) */
    return mp_test_parent_of(pid) == getpid();
}

static bool shm_entry_ours(const char *name)
{
    long pid;
    pthread_once(&pidlog_once, pidlog_init);
    if (sscanf(name, "mproc-%ld-", &pid) != 1 || pid <= 0)
        return true;
    return pid_ours((pid_t)pid);
}

int mp_test_count_shm(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;
    if (!d)
        return -1;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "mproc-", 6) == 0 && shm_entry_ours(e->d_name))
            n++;
    closedir(d);
    return n;
}

/* Shared-memory mappings only (memfd and /dev/shm files): what mproc maps.
 * Private mappings come and go with malloc arenas, thread stacks and the
 * sanitizers' allocators, so counting them would only measure noise. The
 * shm manager client's report ring is the library's, like its socket: kept
 * for the process's lifetime once the first file_system segment is
 * reported, so not a leak (its memfd is named MP__MGR_RING_NAME). Nor are
 * the CUDA driver's cuda.shm.* files: it maps each sending peer's file when
 * an event of that peer is first opened, and keeps it for the process's life
 * (src/cuda/event_files.c). */
static int count_maps(FILE *show)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int n = 0;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        bool shared = (strstr(line, "/memfd:") && !strstr(line, "/memfd:" MP__MGR_RING_NAME)) ||
                      (strstr(line, "/dev/shm/") && !strstr(line, "/dev/shm/cuda.shm."));
        n += shared;
        if (shared && show)
            fprintf(show, "  mapped: %s", line);
    }
    fclose(f);
    return n;
}

int mp_test_count_maps(void) { return count_maps(NULL); }

/* Children of ours: /proc/<pid>/stat field 4 (ppid) equals getpid(). */
static int for_each_child(void (*fn)(pid_t))
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    pid_t self = getpid();
    if (!d)
        return -1;
    while ((e = readdir(d))) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0 || mp_test_parent_of(pid) != self)
            continue;
        n++;
        if (fn)
            fn(pid);
    }
    closedir(d);
    return n;
}

int mp_test_count_children(void)
{
    return for_each_child(NULL);
}

static void kill_and_reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

void mp_test_kill_children(void)
{
    for_each_child(kill_and_reap);
}

void mp_test_snapshot_take(mp_test_snapshot *s)
{
    s->fds = mp_test_count_fds();
    s->shm = mp_test_count_shm();
    s->maps = mp_test_count_maps();
    s->children = mp_test_count_children();
}

void mp_test_assert_no_leaks(const mp_test_snapshot *before)
{
    mp_test_snapshot now;
    struct timespec ts = {0, 20 * 1000 * 1000};
    for (int i = 0; i < 100; i++) {
        mp_test_snapshot_take(&now);
        if (now.fds == before->fds && now.shm <= before->shm && now.maps <= before->maps &&
            now.children == before->children)
            return;
        nanosleep(&ts, NULL);
    }
    if (now.maps > before->maps) /* say which, so a rare leak can be traced */
        count_maps(stderr);
    fail_msg("leak: fds %d -> %d, /dev/shm mproc segments %d -> %d, mappings %d -> %d, "
             "children %d -> %d",
             before->fds, now.fds, before->shm, now.shm, before->maps, now.maps, before->children,
             now.children);
}

int mp_test_setup(void **state)
{
    pthread_once(&pidlog_once, pidlog_init);
    mp_test_snapshot *s = malloc(sizeof *s);
    if (!s)
        return -1;
    mp_test_snapshot_take(s);
    *state = s;
    return 0;
}

int mp_test_setup_fd(void **state)
{
    int rc = mp_test_setup(state);
    if (rc == 0)
        rc = mp_set_sharing_strategy("file_descriptor");
    return rc;
}

int mp_test_teardown(void **state)
{
    mp_test_snapshot s = *(mp_test_snapshot *)*state;
    int children = mp_test_count_children();
    free(*state); /* before any failure: fail_msg does not return */
    *state = NULL;
    mp_test_kill_children();
    if (children > s.children)
        fail_msg("%d child process(es) outlived the test", children - s.children);
    mp_test_assert_no_leaks(&s);
    return 0;
}

typedef struct method_state {
    const char *method;
    void *snap;
} method_state;

int mp_test_method_setup(void **state)
{
    method_state *t = malloc(sizeof *t);
    if (!t)
        return -1;
    t->method = *state;
    *state = t;
    return mp_test_setup(&t->snap);
}

int mp_test_method_teardown(void **state)
{
    method_state *t = *state;
    int rc;
    mp_forkserver_stop();
    rc = mp_test_teardown(&t->snap);
    free(t);
    return rc;
}

const char *mp_test_method(void **state) { return ((method_state *)*state)->method; }

mp_msg *mp_test_payload_msg(const void *bytes, size_t n)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, bytes, n));
    return m;
}

mp_process *mp_test_start(const char *entry, mp_msg *args, const char *method)
{
    mp_process_options o;
    mp_process *p = NULL;
    int rc;
    mp_process_options_init(&o);
    o.start_method = method;
    if ((rc = mp_process_create(entry, args, &o, &p)) != 0 || (rc = mp_process_start(p)) != 0) {
        mp_process_destroy(p);
        fail_msg("starting '%s' with %s: %s: %s", entry,
                 method ? method : "the default method", mp_err_name(rc), mp_last_error());
    }
    return p;
}

mp_tensor_stats mp_test_tensor_stats(void)
{
    mp_tensor_stats st = {.size = sizeof st};
    int rc = mp_tensor_stats_get(&st);
    if (rc != 0)
        fail_msg("mp_tensor_stats_get: %s: %s", mp_err_name(rc), mp_last_error());
    return st;
}

int mp_test_reap(pid_t pid)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void expect_exit0_status(int status, pid_t pid, const char *what)
{
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("%s (pid %d) failed: status 0x%x (exit %d)", what, (int)pid, status,
                 WEXITSTATUS(status));
}

void mp_test_expect_exit0(pid_t pid)
{
    expect_exit0_status(mp_test_reap(pid), pid, "child");
}

void mp_test_expect_exit0_within(pid_t pid, double seconds, const char *what)
{
    struct timespec nap = {0, 1000000};
    double until = mp__now() + seconds;
    int status = 0;
    pid_t got;
    while ((got = waitpid(pid, &status, WNOHANG)) == 0) {
        if (mp__now() > until)
            fail_msg("%s (pid %d) still running after %g s", what, (int)pid, seconds);
        nanosleep(&nap, NULL);
    }
    assert_int_equal(got, pid);
    expect_exit0_status(status, pid, what);
}

char mp_test_proc_state(pid_t pid)
{
    char state;
    pid_t ppid;
    return proc_stat(pid, &state, &ppid) ? state : 0;
}

void mp_test_gate_open(mp_test_gate *g) { assert_int_equal(pipe(g->fd), 0); }
void mp_test_gate_pass(mp_test_gate *g)
{
    char c = 1;
    assert_int_equal(write(g->fd[1], &c, 1), 1);
}
int mp_test_gate_wait(mp_test_gate *g)
{
    struct pollfd p = {.fd = g->fd[0], .events = POLLIN};
    char c;
    return poll(&p, 1, 10000) == 1 && read(g->fd[0], &c, 1) == 1 ? 0 : -1;
}
void mp_test_gate_close(mp_test_gate *g)
{
    close(g->fd[0]);
    close(g->fd[1]);
}
