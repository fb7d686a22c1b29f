/* Faults injected through mp__sys into the shm manager's client and its
 * daemon launch: each failure gives a clear error or a warning, leaks no
 * fd or child, and the crash-recovery path still protects the segments
 * once the fault is gone. */
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "mgr_test.h"

/* Child: its first report registers with the daemon and makes the report
 * ring, whose system calls go through mp__sys like every other: a failed
 * memfd_create there is injected, the client reports without a ring, and
 * the segment is still reclaimed after a SIGKILL. */
static int ring_fault_creator(int in, int out, void *arg)
{
    mp__segment *s;
    int fd;
    (void)arg;
    if (mp__sys_fault("memfd_create", ENOMEM, 0, 1) != 0)
        return 20;
    if (mp__segment_create(4096, MP__STRATEGY_FS, &s) != 0)
        return 21;
    /* the injected failure was used up by the ring, not left pending */
    if ((fd = mp__sys.memfd_create("probe", MFD_CLOEXEC)) < 0)
        return 22;
    close(fd);
    mgr_put(out, 'r');
    mgr_get(in, 30); /* until killed */
    return 0;
}

static void test_ring_fault_injected(void **state)
{
    child c = child_start(ring_fault_creator, NULL);
    assert_int_equal(mgr_get(c.from, 10), 'r');
    assert_true(mgr_shm_of(c.pid));
    child_end(&c, true);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
}

/* Child: its connection to the daemon goes through mp__sys too. The first
 * connect is refused as if no daemon listened (it died): the client starts
 * one (the running daemon stays the one), connects again and registers, so
 * the segment is still reclaimed after a SIGKILL. */
static int connect_fault_creator(int in, int out, void *arg)
{
    mp__segment *s;
    (void)arg;
    mp__mgr_client_reset(); /* no connection inherited: the report must connect */
    if (mp__sys_fault("connect", ECONNREFUSED, 0, 1) != 0)
        return 20;
    if (mp__segment_create(4096, MP__STRATEGY_FS, &s) != 0)
        return 21;
    /* the refusal was used up by the client (a probe gets the real EBADF) */
    struct sockaddr sa = {.sa_family = AF_UNIX};
    if (mp__sys.connect(-1, &sa, sizeof sa) == 0 || errno != EBADF)
        return 22;
    mp__sys_fault_reset();
    mgr_put(out, 'r');
    mgr_get(in, 30); /* until killed */
    return 0;
}

static void test_connect_fault_recovers(void **state)
{
    child c = child_start(connect_fault_creator, NULL);
    assert_int_equal(mgr_get(c.from, 10), 'r');
    assert_true(mgr_shm_of(c.pid));
    child_end(&c, true);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
}

/* Child: the first report finds no daemon (or cannot connect) because the
 * named call fails once: the segment works, the log hook hears that it is
 * unprotected, and a report after RETRY_AFTER starts (or reaches) the
 * daemon and registers both segments, so a SIGKILL leaks neither. */
static atomic_int unprotected;

static void count_unprotected(int level, const char *line, void *user)
{
    (void)level, (void)user;
    if (strstr(line, "not protected against leaks"))
        atomic_fetch_add(&unprotected, 1);
}

static int fault_then_recover(int in, int out, void *arg)
{
    const char *call = arg;
    mp__segment *s[2];
    mp_set_log_hook(count_unprotected, NULL);
    mp__mgr_client_reset(); /* no connection inherited: the report must connect */
    if (mp__sys_fault(call, strcmp(call, "posix_spawn") == 0 ? EAGAIN : EINVAL, 0, 1) != 0)
        return 20;
    if (mp__segment_create(4096, MP__STRATEGY_FS, &s[0]) != 0)
        return 21;
    if (atomic_load(&unprotected) != 1)
        return 22;
    mp__sys_fault_reset();
    mgr_sleep(1.2); /* the client drops reports for a second after a failure */
    if (mp__segment_create(4096, MP__STRATEGY_FS, &s[1]) != 0)
        return 23;
    if (atomic_load(&unprotected) != 1)
        return 24;
    mgr_put(out, 'r');
    mgr_get(in, 30); /* until killed */
    return 0;
}

static void fault_case(const char *call)
{
    child c;
    mgr_kill_daemon(); /* the first report has to start one */
    c = child_start(fault_then_recover, (void *)call);
    if (mgr_get(c.from, 10) != 'r') {
        child_end(&c, false); /* fails with the child's exit code */
        fail_msg("the child did not get ready");
    }
    assert_true(mgr_wait_tracked(c.pid, 2, 5));
    child_end(&c, true);
    assert_true(mgr_wait_clean(&c.pid, 1, MGR_GRACE + 1));
}

static void test_spawn_fault_recovers(void **state) { fault_case("posix_spawn"); }
static void test_setsockopt_fault_recovers(void **state) { fault_case("setsockopt"); }

/* Starting the daemon directly: a failed posix_spawn names the call and
 * the binary, and leaves no child; a failed waitpid kills and reaps the
 * launcher (the teardown counts children and fds). */
static void test_spawn_errors(void **state)
{
    mgr_kill_daemon();
    assert_mp_ok(mp__sys_fault("posix_spawn", EAGAIN, 0, 1));
    assert_true(mp__mgr_spawn(NULL, 10) < 0);
    assert_non_null(strstr(mp_last_error(), "posix_spawn("));
    assert_non_null(strstr(mp_last_error(), "mproc-shm-manager"));
    assert_int_equal(mgr_daemon_pid(), 0);
    assert_mp_ok(mp__sys_fault("waitpid", EINVAL, 0, 1));
    assert_true(mp__mgr_spawn(NULL, 10) < 0);
    assert_non_null(strstr(mp_last_error(), "waitpid"));
    mp__sys_fault_reset();
    assert_mp_ok(mp__mgr_spawn(NULL, 10));
    assert_true(mgr_daemon_pid() > 0);
}

/* Inspecting a segment (what `mproc shm-manager list` and the daemon's
 * adoption read): a failed open is an error naming the path, a failed
 * fstat closes the fd it opened. */
static void test_inspect_faults(void **state)
{
    /* Written by hand: a segment of the library would make this process a
     * client of the daemon, with a connection the leak count would see. */
    mp__fs_header hdr = {MP__FS_MAGIC, MP__FS_VERSION, (uint32_t)getpid(), 100, 1, 0};
    mp__seg_info info;
    char name[64], path[96];
    int fd;
    snprintf(name, sizeof name, "/mproc-%d-00c0ffee00c0ffee", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm%s", name);
    fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &hdr, sizeof hdr, 0), (ssize_t)sizeof hdr);
    close(fd);
    assert_mp_ok(mp__sys_fault("open", EMFILE, 0, 1));
    assert_true(mp__seg_inspect(name, NULL, &info) < 0);
    assert_non_null(strstr(mp_last_error(), "open(/dev/shm/"));
    assert_mp_ok(mp__sys_fault("fstat", EIO, 0, 1));
    assert_true(mp__seg_inspect(name, NULL, &info) < 0);
    assert_non_null(strstr(mp_last_error(), "fstat("));
    mp__sys_fault_reset();
    assert_mp_ok(mp__seg_inspect(name, NULL, &info));
    assert_true(info.has_header && info.creator == getpid() && info.refcount == 1);
    assert_int_equal(shm_unlink(name), 0);
}

static int teardown(void **state)
{
    mp__sys_fault_reset();
    mp_set_log_hook(NULL, NULL);
    return mp_test_teardown(state);
}

#define T(f) cmocka_unit_test_setup_teardown(f, mp_test_setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_ring_fault_injected),
        T(test_connect_fault_recovers),
        T(test_spawn_fault_recovers),
        T(test_setsockopt_fault_recovers),
        T(test_spawn_errors),
        T(test_inspect_faults),
    };
    return mgr_run_tests(tests);
}
