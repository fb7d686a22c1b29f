/* mproc-shm-manager and its library client: start on demand, one daemon for
 * concurrent starters, reclaiming by the rule (holders, messages in flight),
 * restart and re-adoption, dead owners at start, another uid refused. */
#include <linux/capability.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>

#include "mgr_test.h"

/* Child: creates `n` segments, says 'r' and waits; 'y' creates one more. */
static int creator(int in, int out, void *arg)
{
    mp__segment *s[8];
    int n = (int)(intptr_t)arg, k = 0;
    for (; k < n; k++)
        if (mp__segment_create(4096, MP__STRATEGY_FS, &s[k]) != 0)
            return 10;
    mgr_put(out, 'r');
    for (;;) {
        char c = mgr_get(in, 30);
        if (c == 'y' && k < 8) {
            if (mp__segment_create(4096, MP__STRATEGY_FS, &s[k++]) != 0)
                return 11;
            mgr_put(out, 'r');
        } else if (c == 'q') {
            while (k > 0)
                mp__segment_release(s[--k]);
            return 0;
        } else if (c == 'u') { /* a message carrying the last one, never sent */
            mp__segment_handle h;
            if (k == 0 || mp__segment_export(s[k - 1], &h) != 0)
                return 14;
            mp__segment_handle_drop(&h, false);
            mgr_put(out, 'r');
        } else if (c == 'f') { /* fork a grandchild that keeps the mappings */
            int ready[2];
            pid_t g;
            if (pipe2(ready, O_CLOEXEC) != 0)
                return 13;
            if ((g = fork()) == 0) {
                mp__segment *t;
                if (mp__segment_create(4096, MP__STRATEGY_FS, &t) != 0)
                    _exit(12);
                mgr_put(ready[1], 'g');
                mgr_get(in, 30); /* until killed */
                _exit(0);
            }
            close(ready[1]);
            /* Its pid first, then 'g' once it has reported: one writer. */
            (void)!write(out, &g, sizeof g);
            mgr_put(out, mgr_get(ready[0], 10));
            close(ready[0]);
        } else {
            return 0;
        }
    }
}

static void test_sigkill_after_create(void **state)
{
    child c = child_start(creator, (void *)(intptr_t)3);
    assert_int_equal(mgr_get(c.from, 10), 'r');
    assert_true(mgr_shm_of(c.pid));
    assert_true(mgr_daemon_pid() > 0); /* started on demand */
    child_end(&c, true);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
}

/* A send that failed (the name never left) ends the message's flight: a
 * holder killed afterwards leaves a segment the daemon reclaims at once,
 * while another client keeps the grace period from starting. */
static void test_unsent_not_in_flight(void **state)
{
    child keeper = child_start(creator, (void *)(intptr_t)1), c;
    assert_int_equal(mgr_get(keeper.from, 10), 'r');
    c = child_start(creator, (void *)(intptr_t)1);
    assert_int_equal(mgr_get(c.from, 10), 'r');
    mgr_put(c.to, 'u');
    assert_int_equal(mgr_get(c.from, 10), 'r');
    child_end(&c, true);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
    child_end(&keeper, true);
    assert_true(mgr_wait_clean(&keeper.pid, 1, MGR_GRACE + 1));
}

static void test_release_and_exit(void **state)
{
    child c = child_start(creator, (void *)(intptr_t)2);
    assert_int_equal(mgr_get(c.from, 10), 'r');
    mgr_put(c.to, 'q');
    child_end(&c, false);
    assert_false(mgr_shm_of(c.pid));
}

static int starter(int in, int out, void *arg)
{
    mgr_get(in, 10); /* all start at once: the parent closes the pipe */
    return mp__mgr_spawn(NULL, 10) == 0 ? 0 : 1;
}

static void test_two_starters_one_daemon(void **state)
{
    for (int round = 0; round < 2; round++) {
        child c[4];
        mgr_kill_daemon();
        for (int i = 0; i < 4; i++)
            c[i] = child_start(starter, NULL);
        for (int i = 0; i < 4; i++)
            close(c[i].to), c[i].to = -1;
        for (int i = 0; i < 4; i++) {
            c[i].to = open("/dev/null", O_RDONLY | O_CLOEXEC);
            child_end(&c[i], false);
        }
        assert_true(mgr_wait_one_daemon(5));
        assert_true(mgr_daemon_pid() > 0);
    }
    /* The same through the client: four processes create at once. */
    mgr_kill_daemon();
    child c[4];
    pid_t pids[4];
    for (int i = 0; i < 4; i++) {
        c[i] = child_start(creator, (void *)(intptr_t)1);
        pids[i] = c[i].pid;
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(mgr_get(c[i].from, 10), 'r');
    assert_true(mgr_wait_one_daemon(5));
    assert_true(mgr_wait_stat("clients", 4, 5));
    for (int i = 0; i < 4; i++)
        child_end(&c[i], true);
    assert_true(mgr_wait_clean(pids, 4, MGR_GRACE + 1));
}

/* Child: receives the name from the parent, opens it (the "received" and
 * "opened" reports), checks the byte, releases it. */
static int receiver(int in, int out, void *arg)
{
    mp__segment_handle h = {.strategy = MP__STRATEGY_FS, .fd = -1, .size = 4096};
    mp__segment *s = NULL;
    int ok;
    if (read(in, h.name, sizeof h.name) != (ssize_t)sizeof h.name)
        return 10;
    if (mp__segment_open(&h, &s) != 0)
        return 11;
    ok = ((char *)mp__segment_data(s))[0] == 42;
    mp__segment_release(s);
    return ok ? 0 : 12;
}

static void test_in_flight_kept_until_received(void **state)
{
    char name[MP__SHM_NAME_MAX];
    child keeper = child_start(creator, (void *)(intptr_t)1); /* a live client */
    child c = child_start(mgr_sender, NULL), r;

    assert_int_equal(mgr_get(keeper.from, 10), 'r');
    assert_int_equal(read(c.from, name, sizeof name), (ssize_t)sizeof name);
    child_end(&c, true);
    /* The creator is dead and holds nothing, but the message is in flight. */
    mgr_sleep(MGR_GRACE + 0.5);
    assert_true(mgr_exists(name));
    r = child_start(receiver, NULL);
    assert_int_equal(write(r.to, name, sizeof name), (ssize_t)sizeof name);
    child_end(&r, false);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
    assert_false(mgr_exists(name));
    child_end(&keeper, true);
}

/* A daemon of another runtime directory (same uid, same /dev/shm) starts
 * while a segment is in flight: it adopts it (creator dead, nobody maps
 * it), but leaves it to our daemon, which tracks the message. */
static void test_other_daemon_leaves_tracked(void **state)
{
    char name[MP__SHM_NAME_MAX], dir[] = "/tmp/mproc-test2.XXXXXX", path[PATH_MAX + 64];
    char log[4096] = "";
    child keeper = child_start(creator, (void *)(intptr_t)1), c = child_start(mgr_sender, NULL), r;
    pid_t d2;
    int status = -1;

    assert_int_equal(mgr_get(keeper.from, 10), 'r');
    assert_int_equal(read(c.from, name, sizeof name), (ssize_t)sizeof name);
    child_end(&c, true);
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/daemon.log", dir);
    if ((d2 = fork()) == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        char bin[PATH_MAX + 32];
        snprintf(bin, sizeof bin, "%s/mproc-shm-manager", mgr_bindir);
        setenv("MPROC_RUNTIME_DIR", dir, 1);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(126);
        execl(bin, bin, "--foreground", "--grace", "0.3", (char *)NULL);
        _exit(127);
    }
    assert_true(d2 > 0);
    /* Its quarantine (0.3 s) ends, it asks us, forgets it and exits. */
    for (int i = 0; i < 1000 && waitpid(d2, &status, WNOHANG) == 0; i++)
        mgr_sleep(0.01);
    if (status == -1) {
        kill(d2, SIGKILL);
        waitpid(d2, NULL, 0);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)!read(fd, log, sizeof log - 1);
        close(fd);
    }
    unlink(path);
    snprintf(path, sizeof path, "%s/" MP__MGR_LOCK, dir);
    unlink(path);
    rmdir(dir);
    assert_int_equal(status, 0);
    if (!mgr_exists(name) || !strstr(log, "left ") || !strstr(log, name))
        fail_msg("the other daemon took %s (exists: %d); its log:\n%s", name,
                 mgr_exists(name), log);
    r = child_start(receiver, NULL);
    assert_int_equal(write(r.to, name, sizeof name), (ssize_t)sizeof name);
    child_end(&r, false);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
    child_end(&keeper, true);
}

static void test_daemon_killed_readopts(void **state)
{
    child c = child_start(creator, (void *)(intptr_t)2);
    pid_t first;
    assert_int_equal(mgr_get(c.from, 10), 'r');
    first = mgr_daemon_pid();
    assert_true(first > 0);
    mgr_kill_daemon();
    mgr_put(c.to, 'y'); /* the next report restarts it and re-registers */
    assert_int_equal(mgr_get(c.from, 10), 'r');
    assert_true(mgr_daemon_pid() > 0 && mgr_daemon_pid() != first);
    if (!mgr_wait_tracked(c.pid, 3, 5)) {
        char *reply = NULL;
        mp__mgr_control("LIST", &reply, 2);
        fail_msg("daemon tracks %d of the child's 3 segments:\n%s", mgr_tracked(c.pid),
                 reply ? reply : "(no answer)");
    }
    /* Re-registered, not merely adopted: it reclaims at once, no grace. */
    child_end(&c, true);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
}

/* A daemon killed before it read a client's HELLO never held the client's
 * ring's robust mutex, so the kernel marks nothing there: the client must
 * still notice at its next report and start a new daemon, not write into a
 * ring nobody will read. (Stopping the daemon makes the slow start that
 * once left this to chance certain.) */
static void test_daemon_killed_before_hello(void **state)
{
    child c;
    pid_t first;
    mgr_kill_daemon();
    assert_mp_ok(mp__mgr_spawn(NULL, 10));
    first = mgr_daemon_pid();
    assert_true(first > 0);
    assert_int_equal(kill(first, SIGSTOP), 0); /* it reads nothing from now on */
    c = child_start(creator, (void *)(intptr_t)1);
    assert_int_equal(mgr_get(c.from, 10), 'r');
    mgr_kill_daemon();
    mgr_put(c.to, 'y');
    assert_int_equal(mgr_get(c.from, 10), 'r');
    assert_true(mgr_daemon_pid() > 0 && mgr_daemon_pid() != first);
    assert_true(mgr_wait_tracked(c.pid, 2, 5));
    child_end(&c, true);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
}

/* Writes a file_system segment by hand, as a process `creator` would. */
static void make_segment(const char *name, pid_t creator, uint32_t refs)
{
    char path[128];
    mp__fs_header h = {MP__FS_MAGIC, MP__FS_VERSION, (uint32_t)creator, 100, refs, 0};
    int fd;
    snprintf(path, sizeof path, "/dev/shm%s", name);
    fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, MP__FS_HEADER_SIZE + 4096), 0);
    assert_int_equal(pwrite(fd, &h, sizeof h, 0), (ssize_t)sizeof h);
    close(fd);
}

static pid_t dead_pid(void)
{
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

static void test_dead_owner_reclaimed_at_start(void **state)
{
    char dead[64], alive[64];
    pid_t d = dead_pid();
    mgr_kill_daemon();
    snprintf(dead, sizeof dead, "/mproc-%d-0123456789abcdef", (int)d);
    snprintf(alive, sizeof alive, "/mproc-%d-fedcba9876543210", (int)getpid());
    make_segment(dead, d, 2);     /* refcount left by killed users */
    make_segment(alive, getpid(), 1);
    assert_mp_ok(mp__mgr_spawn(NULL, 10));
    /* Adopted, then reclaimed once unused for the quarantine (the grace). */
    for (int i = 0; i < (int)((MGR_GRACE + 1) * 100) && mgr_exists(dead); i++)
        mgr_sleep(0.01);
    assert_false(mgr_exists(dead));
    mgr_sleep(0.5); /* its creator lives: adopted, kept */
    assert_true(mgr_exists(alive));
    assert_int_equal(shm_unlink(alive), 0);
}

static void test_fork_child_registers_inherited(void **state)
{
    child c = child_start(creator, (void *)(intptr_t)1);
    pid_t g, pids[2];
    assert_int_equal(mgr_get(c.from, 10), 'r');
    mgr_put(c.to, 'f');
    assert_int_equal(read(c.from, &g, sizeof g), (ssize_t)sizeof g);
    assert_int_equal(mgr_get(c.from, 10), 'g');
    pids[0] = c.pid;
    pids[1] = g;
    kill(c.pid, SIGKILL); /* the grandchild still maps the child's segment */
    mgr_sleep(MGR_GRACE + 0.3);
    assert_true(mgr_shm_of(c.pid));
    kill(g, SIGKILL);
    child_end(&c, true);
    assert_true(mgr_wait_clean(pids, 2, MGR_GRACE + 1));
}

static void test_grace_exit(void **state)
{
    child c = child_start(creator, (void *)(intptr_t)1);
    pid_t daemon;
    assert_int_equal(mgr_get(c.from, 10), 'r');
    daemon = mgr_daemon_pid();
    assert_true(daemon > 0);
    child_end(&c, true);
    for (int i = 0; i < 150 && mp__pid_alive(daemon); i++)
        mgr_sleep(0.01);
    assert_false(mp__pid_alive(daemon));
    assert_false(mgr_shm_of(c.pid));
}

/* In a child: drop to uid 65534 but keep CAP_DAC_OVERRIDE, so the 0700
 * directory does not stop us and only the daemon's own check can. */
static int other_uid(int in, int out, void *arg)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    char reply[256], *dummy = NULL, msg[] = "C /mproc-1-0000000000000001 1\n";
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd, rc;
    if (prctl(PR_SET_KEEPCAPS, 1) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
        return 20;
    data[0].effective = data[0].permitted = 1u << CAP_DAC_OVERRIDE;
    if (syscall(SYS_capset, &hdr, data) != 0)
        return 21;
    /* Raw, since our own client would already refuse the root-owned dir. */
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%s", mgr_dir, MP__MGR_SOCKET);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        return 22;
    (void)!send(fd, "STATUS\n", 7, MSG_NOSIGNAL); /* it may have hung up already */
    memset(reply, 0, sizeof reply);
    for (size_t len = 0; len < sizeof reply - 1;) {
        ssize_t r = read(fd, reply + len, sizeof reply - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    if (strncmp(reply, "ERR uid 65534 refused", 21) != 0)
        return 23;
    rc = mp__mgr_control("STATUS", &dummy, 5); /* and the client refuses the dir */
    free(dummy);
    if (rc != MP_EPERM || !strstr(mp_last_error(), "belongs to uid 0"))
        return 24;
    /* Reports from another uid are ignored (and logged). */
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%s", mgr_dir, MP__MGR_DGRAM);
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sendto(fd, msg, strlen(msg), 0, (struct sockaddr *)&sa, sizeof sa) < 0)
        return 25;
    close(fd);
    return 0;
}

static void test_other_uid_refused(void **state)
{
    child keeper;
    if (geteuid() != 0) {
        fprintf(stderr, "skipped: needs root to switch uid in a child\n");
        skip();
    }
    keeper = child_start(creator, (void *)(intptr_t)1);
    assert_int_equal(mgr_get(keeper.from, 10), 'r');
    child c = child_start(other_uid, NULL);
    child_end(&c, false);
    mgr_sleep(0.1);
    assert_int_equal(mgr_tracked(1), 0); /* the foreign report was ignored */
    assert_int_equal(mgr_tracked(keeper.pid), 1);
    child_end(&keeper, true);
    assert_true(mgr_wait_clean(&keeper.pid, 1, MGR_GRACE + 1));
}

/* Child: one report first (registers), 'r'; on 'g' creates and releases
 * RING_ROUNDS segments (two ring lines each: more than the ring holds),
 * creates one more, 'r' again and waits: 'q' releases it and exits. */
#define RING_ROUNDS 5000
static int ring_filler(int in, int out, void *arg)
{
    mp__segment *s;
    (void)arg;
    if (mp__segment_create(4096, MP__STRATEGY_FS, &s) != 0)
        return 10;
    mp__segment_release(s);
    mgr_put(out, 'r');
    if (mgr_get(in, 30) != 'g')
        return 11;
    for (int i = 0; i < RING_ROUNDS; i++) {
        if (mp__segment_create(4096, MP__STRATEGY_FS, &s) != 0)
            return 12;
        mp__segment_release(s);
    }
    if (mp__segment_create(4096, MP__STRATEGY_FS, &s) != 0)
        return 13;
    mgr_put(out, 'r');
    if (mgr_get(in, 30) == 'q')
        mp__segment_release(s);
    return 0;
}

/* A stopped daemon reads no ring: the client fills its ring, asks for a
 * read (WAKE) and waits, and once the daemon runs again every report gets
 * through in order: nothing tracked but the one live segment, no
 * malformed line in the log. */
static void test_full_ring_waits(void **state)
{
    child c = child_start(ring_filler, NULL);
    char path[PATH_MAX + 32], log[65536] = "";
    double t0;
    pid_t d;
    int fd;
    assert_int_equal(mgr_get(c.from, 10), 'r');
    assert_true((d = mgr_daemon_pid()) > 0);
    kill(d, SIGSTOP);
    t0 = mgr_now();
    mgr_put(c.to, 'g');
    mgr_sleep(0.5);
    kill(d, SIGCONT);
    assert_int_equal(mgr_get(c.from, 20), 'r');
    assert_true(mgr_now() - t0 >= 0.5); /* it did wait for the daemon */
    assert_true(mgr_wait_tracked(c.pid, 1, 5));
    snprintf(path, sizeof path, "%s/%s", mgr_dir, MP__MGR_LOG);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
        (void)!read(fd, log, sizeof log - 1);
        close(fd);
    }
    if (strstr(log, "malformed") || strstr(log, "ignored from now on"))
        fail_msg("the daemon's log:\n%s", log);
    child_end(&c, true);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
}

/* A daemon that predates rings: reads datagrams, counts "C " lines, never
 * takes a ring (the fd is dropped, as its recvmsg had no room for it). */
typedef struct old_daemon {
    int sock;
    _Atomic int created;
    _Atomic bool stop;
    bool running;
    pthread_t th;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
} old_daemon;

/* Not on the test's stack: a failed assertion leaves the test function,
 * and the thread must not read a dead frame until the teardown stops it. */
static old_daemon old_d = {.sock = -1};

static void old_daemon_stop(old_daemon *d)
{
    if (d->running) {
        atomic_store(&d->stop, true);
        pthread_join(d->th, NULL);
        d->running = false;
    }
    if (d->sock >= 0) {
        close(d->sock);
        unlink(d->path);
    }
    d->sock = -1;
}

static int old_daemon_teardown(void **state)
{
    old_daemon_stop(&old_d);
    return mp_test_teardown(state);
}

static void *old_daemon_run(void *p)
{
    old_daemon *d = p;
    char buf[65536];
    while (!atomic_load(&d->stop)) {
        ssize_t n = recv(d->sock, buf, sizeof buf - 1, MSG_DONTWAIT);
        if (n <= 0) {
            mgr_sleep(0.001);
            continue;
        }
        buf[n] = 0;
        for (char *p = buf; (p = strstr(p, "C /mproc-")); p++)
            atomic_fetch_add(&d->created, 1);
    }
    return NULL;
}

/* Nobody takes the ring: when it is full and no daemon holds its mutex,
 * the client gives up on rings and reports in datagrams. */
static void test_ring_refused_falls_back(void **state)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    old_daemon *d = &old_d;
    child c;
    char *reply = NULL;
    mp__mgr_control("STOP", &reply, 5);
    free(reply);
    for (int i = 0; i < 500 && mgr_daemon_pid() > 0; i++)
        mgr_sleep(0.01);
    assert_int_equal(mgr_daemon_pid(), 0);
    assert_mp_ok(mp__mgr_path(sa.sun_path, sizeof sa.sun_path, MP__MGR_DGRAM, true));
    unlink(sa.sun_path);
    memset(d, 0, sizeof *d);
    d->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(d->sock >= 0);
    snprintf(d->path, sizeof d->path, "%s", sa.sun_path);
    assert_int_equal(bind(d->sock, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(pthread_create(&d->th, NULL, old_daemon_run, d), 0);
    d->running = true;
    c = child_start(ring_filler, NULL);
    assert_int_equal(mgr_get(c.from, 10), 'r');
    mgr_put(c.to, 'g');
    assert_int_equal(mgr_get(c.from, 30), 'r');
    mgr_put(c.to, 'q');
    child_end(&c, false);
    old_daemon_stop(d);
    /* the reports after the fall-back came as datagrams */
    assert_true(atomic_load(&d->created) > 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, mp_test_setup, mp_test_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_sigkill_after_create),
        T(test_release_and_exit),
        T(test_unsent_not_in_flight),
        T(test_two_starters_one_daemon),
        T(test_in_flight_kept_until_received),
        T(test_other_daemon_leaves_tracked),
        T(test_daemon_killed_readopts),
        T(test_daemon_killed_before_hello),
        T(test_dead_owner_reclaimed_at_start),
        T(test_fork_child_registers_inherited),
        T(test_grace_exit),
        T(test_other_uid_refused),
        T(test_full_ring_waits),
        cmocka_unit_test_setup_teardown(test_ring_refused_falls_back, mp_test_setup,
                                        old_daemon_teardown),
    };
    return mgr_run_tests(tests);
}
