/* src/os: the syscall table and fault injection, clocks, fds, futexes,
 * pidfds and SCM_RIGHTS records. */
#include "mp_test.h"
#include "os/os.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int teardown(void **state)
{
    mp__sys_fault_reset();
    return mp_test_teardown(state);
}

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void test_fault_injection(void **state)
{
    void *p;
    int fd;
    assert_mp_err(mp__sys_fault("no_such_call", EIO, 0, 1), MP_ENOENT);
    assert_non_null(strstr(mp_last_error(), "no_such_call"));
    assert_mp_err(mp__sys_fault("mmap", 0, 0, 1), MP_EINVAL);

    /* skip one call, fail the next two, then pass through */
    assert_mp_ok(mp__sys_fault("mmap", ENOMEM, 1, 2));
    p = mp__sys.mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    munmap(p, 4096);
    for (int i = 0; i < 2; i++) {
        errno = 0;
        assert_true(mp__sys.mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
                    MAP_FAILED);
        assert_int_equal(errno, ENOMEM);
    }
    p = mp__sys.mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    munmap(p, 4096);

    /* posix_fallocate returns its error instead of setting errno */
    fd = memfd_create("t", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_mp_ok(mp__sys_fault("posix_fallocate", ENOSPC, 0, 1));
    errno = 0;
    assert_int_equal(mp__sys.posix_fallocate(fd, 0, 4096), ENOSPC);
    assert_int_equal(errno, 0);
    assert_int_equal(mp__sys.posix_fallocate(fd, 0, 4096), 0);

    /* an injected close failure still closes (as Linux does) */
    assert_mp_ok(mp__sys_fault("close", EINTR, 0, 1));
    assert_int_equal(mp__sys.close(fd), -1);
    assert_int_equal(errno, EINTR);
    assert_int_equal(fcntl(fd, F_GETFD), -1);

    mp__sys_fault_reset();
    assert_true(memcmp(&mp__sys, &mp__sys_real, sizeof mp__sys) == 0);
}

static void test_clock(void **state)
{
    double t0 = mp__now(), d;
    assert_true(t0 > 0);
    assert_int_equal(mp__poll_ms(-1), -1);
    assert_int_equal(mp__poll_ms(mp__deadline(-5)), -1);
    assert_int_equal(mp__poll_ms(0), 0);
    assert_int_equal(mp__poll_ms(t0 - 1), 0);
    d = mp__deadline(10);
    assert_true(d >= t0 + 10);
    assert_in_range(mp__poll_ms(d), 5000, 10000);
    assert_true(mp__now() >= t0);
}

static void test_close_cloexec(void **state)
{
    int fd = open("/dev/null", O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    assert_mp_ok(mp__set_cloexec(fd, true));
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    assert_mp_ok(mp__set_cloexec(fd, false));
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    errno = E2BIG;
    fd = mp__close(fd);
    assert_int_equal(fd, -1);
    assert_int_equal(errno, E2BIG);
    assert_int_equal(mp__close(-1), -1);
    assert_mp_err(mp__set_cloexec(-1, true), MP_ESYS);
    assert_non_null(strstr(mp_last_error(), "F_GETFD"));
}

static void test_count_fds(void **state)
{
    int n = mp__count_open_fds(), fd;
    assert_int_equal(n, mp_test_count_fds());
    fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_int_equal(mp__count_open_fds(), n + 1);
    mp__close(fd);
    assert_int_equal(mp__count_open_fds(), n);
}

static uint32_t word;

static void *waker(void *arg)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    __atomic_store_n(&word, 1, __ATOMIC_SEQ_CST);
    mp__futex_wake(&word, 1, false);
    return NULL;
}

static void test_futex(void **state)
{
    pthread_t th;
    uint32_t *shared;
    pid_t pid;
    int status;

    word = 5;
    /* value differs: returns at once */
    assert_mp_ok(mp__futex_wait(&word, 4, -1, false));
    assert_mp_err(mp__futex_wait(&word, 5, mp__deadline(0.02), false), MP_ETIMEDOUT);
    assert_mp_err(mp__futex_wait(&word, 5, 0, false), MP_ETIMEDOUT);
    assert_int_equal(mp__futex_wake(&word, 1, false), 0);

    word = 0;
    assert_int_equal(pthread_create(&th, NULL, waker, NULL), 0);
    while (__atomic_load_n(&word, __ATOMIC_SEQ_CST) == 0)
        assert_mp_ok(mp__futex_wait(&word, 0, mp__deadline(30), false));
    pthread_join(th, NULL);

    /* across processes, on a shared mapping */
    shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(shared != MAP_FAILED);
    *shared = 0;
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        __atomic_store_n(shared, 7, __ATOMIC_SEQ_CST);
        mp__futex_wake(shared, 1, true);
        _exit(0);
    }
    while (__atomic_load_n(shared, __ATOMIC_SEQ_CST) == 0)
        assert_mp_ok(mp__futex_wait(shared, 0, mp__deadline(30), true));
    assert_int_equal(*shared, 7);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    munmap(shared, 4096);
}

static void test_pidfd(void **state)
{
    pid_t pid = fork();
    int fd, status;
    assert_true(pid >= 0);
    if (pid == 0) {
        pause();
        _exit(0);
    }
    fd = mp__pidfd_open(pid);
    if (fd < 0) {
        assert_int_equal(errno, ENOSYS); /* old kernel */
    } else {
        assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
        mp__close(fd);
    }
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(mp__pidfd_open(-5), -1);
}

/* ---- records ------------------------------------------------------------- */

static void test_record_roundtrip(void **state)
{
    int sv[2], fds[2], got[4], nfds = -1, p[2];
    char buf[64];
    size_t len = 0;
    struct stat a, b;
    pair(sv);
    assert_int_equal(pipe(p), 0);
    fds[0] = p[0];
    fds[1] = p[1];
    assert_mp_ok(mp__send_record(sv[0], "hello", 5, fds, 2, -1));
    assert_mp_ok(mp__send_record(sv[0], "x", 1, NULL, 0, -1));
    assert_mp_ok(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 4, &nfds, -1));
    assert_int_equal(len, 5);
    assert_memory_equal(buf, "hello", 5);
    assert_int_equal(nfds, 2);
    for (int i = 0; i < 2; i++) {
        assert_true(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
        fstat(got[i], &a);
        fstat(fds[i], &b);
        assert_int_equal(a.st_ino, b.st_ino);
        mp__close(got[i]);
    }
    /* records stay separate */
    assert_mp_ok(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 4, &nfds, -1));
    assert_int_equal(len, 1);
    assert_int_equal(nfds, 0);
    mp__close(p[0]);
    mp__close(p[1]);
    mp__close(sv[0]);
    mp__close(sv[1]);
}

static void test_record_errors(void **state)
{
    int sv[2], fds[3], got[4], nfds = 0;
    char buf[64] = {0}, big[200] = {0};
    size_t len;
    pair(sv);
    assert_mp_err(mp__send_record(sv[0], buf, 0, NULL, 0, -1), MP_EINVAL);
    assert_mp_err(mp__send_record(sv[0], buf, 1, NULL, 254, -1), MP_EINVAL);
    assert_mp_err(mp__send_record(-1, buf, 1, NULL, 0, -1), MP_EINVAL);
    assert_mp_err(mp__recv_record(sv[1], buf, 0, &len, got, 4, &nfds, -1), MP_EINVAL);

    /* nothing to read: try once, then a deadline */
    assert_mp_err(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 4, &nfds, 0), MP_ETIMEDOUT);
    assert_mp_err(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 4, &nfds, mp__deadline(0.05)),
                  MP_ETIMEDOUT);

    /* a record longer than the buffer: MP_EPROTO, its fds closed */
    for (int i = 0; i < 3; i++)
        fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int before = mp__count_open_fds();
    assert_mp_ok(mp__send_record(sv[0], big, sizeof big, fds, 1, -1));
    assert_mp_err(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 4, &nfds, -1), MP_EPROTO);
    assert_int_equal(mp__count_open_fds(), before);

    /* more fds than the caller wants: MP_EPROTO, all closed */
    assert_mp_ok(mp__send_record(sv[0], buf, 8, fds, 3, -1));
    assert_mp_err(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 2, &nfds, -1), MP_EPROTO);
    assert_int_equal(mp__count_open_fds(), before);
    for (int i = 0; i < 3; i++)
        mp__close(fds[i]);

    /* orderly EOF */
    mp__close(sv[0]);
    assert_mp_err(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 4, &nfds, -1), MP_ECLOSED);
    mp__close(sv[1]);
    /* send to a closed peer */
    pair(sv);
    mp__close(sv[1]);
    assert_mp_err(mp__send_record(sv[0], buf, 1, NULL, 0, -1), MP_ECLOSED);
    mp__close(sv[0]);
}

static void test_record_eintr_and_faults(void **state)
{
    int sv[2], got[2], nfds;
    char buf[16];
    size_t len;
    pair(sv);
    /* EINTR is retried on both sides */
    assert_mp_ok(mp__sys_fault("sendmsg", EINTR, 0, 3));
    assert_mp_ok(mp__send_record(sv[0], "abc", 3, NULL, 0, -1));
    assert_mp_ok(mp__sys_fault("recvmsg", EINTR, 0, 3));
    assert_mp_ok(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 2, &nfds, -1));
    assert_int_equal(len, 3);
    /* other errors are mapped with the call named */
    assert_mp_ok(mp__sys_fault("sendmsg", ENOMEM, 0, 1));
    assert_mp_err(mp__send_record(sv[0], "abc", 3, NULL, 0, -1), MP_ENOMEM);
    assert_non_null(strstr(mp_last_error(), "sendmsg"));
    assert_mp_ok(mp__sys_fault("recvmsg", EMFILE, 0, 1));
    assert_mp_err(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 2, &nfds, -1), MP_EMFILE);
    assert_non_null(strstr(mp_last_error(), "ulimit"));
    mp__close(sv[0]);
    mp__close(sv[1]);
}

static void test_record_full_socket(void **state)
{
    int sv[2], got[1], nfds, rc = 0, sent = 0;
    char buf[1024] = {0};
    size_t len;
    pair(sv);
    while ((rc = mp__send_record(sv[0], buf, sizeof buf, NULL, 0, 0)) == 0)
        sent++;
    assert_int_equal(rc, MP_ETIMEDOUT);
    assert_true(sent > 0);
    assert_mp_err(mp__send_record(sv[0], buf, sizeof buf, NULL, 0, mp__deadline(0.05)),
                  MP_ETIMEDOUT);
    /* draining one record makes room */
    assert_mp_ok(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 1, &nfds, -1));
    assert_mp_ok(mp__send_record(sv[0], buf, sizeof buf, NULL, 0, mp__deadline(5)));
    mp__close(sv[0]);
    mp__close(sv[1]);
}

/* MSG_CTRUNC because the receiver hit RLIMIT_NOFILE: MP_EMFILE, no fd kept. */
static void test_record_emfile(void **state)
{
    int sv[2], fds[4], got[4], nfds, before;
    char buf[8] = {0};
    size_t len;
    struct rlimit old, low;
    pair(sv);
    for (int i = 0; i < 4; i++)
        fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_mp_ok(mp__send_record(sv[0], buf, sizeof buf, fds, 4, -1));
    for (int i = 0; i < 4; i++)
        mp__close(fds[i]);
    before = mp__count_open_fds();
    getrlimit(RLIMIT_NOFILE, &old);
    /* room for about one more fd: fd numbers are dense from 0 here */
    low = old;
    low.rlim_cur = (rlim_t)before + 1;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    int rc = mp__recv_record(sv[1], buf, sizeof buf, &len, got, 4, &nfds, -1);
    setrlimit(RLIMIT_NOFILE, &old);
    assert_mp_err(rc, MP_EMFILE);
    assert_int_equal(mp__count_open_fds(), before);
    mp__close(sv[0]);
    mp__close(sv[1]);
}

/* The kernel's maximum of 253 fds in one record round-trips whole. */
static void test_record_max_fds(void **state)
{
    int sv[2], fds[253], *got = malloc(253 * sizeof(int)), nfds;
    char buf[4] = "max";
    size_t len;
    pair(sv);
    for (int i = 0; i < 253; i++)
        fds[i] = i % 2 ? sv[0] : sv[1];
    assert_mp_ok(mp__send_record(sv[0], buf, sizeof buf, fds, 253, -1));
    assert_mp_ok(mp__recv_record(sv[1], buf, sizeof buf, &len, got, 253, &nfds, -1));
    assert_int_equal(nfds, 253);
    for (int i = 0; i < 253; i++) {
        assert_true(fcntl(got[i], F_GETFD) & FD_CLOEXEC);
        mp__close(got[i]);
    }
    free(got);
    mp__close(sv[0]);
    mp__close(sv[1]);
}

/* A peer killed mid-conversation: the waiting side gets MP_ECLOSED at once
 * (no hang), on receive and on send. */
static void test_record_peer_killed(void **state)
{
    int sv[2], nfds, fds[1], status;
    char buf[8];
    size_t len;
    pid_t pid;
    pair(sv);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        mp__close(sv[0]);
        pause();
        _exit(0);
    }
    mp__close(sv[1]);
    kill(pid, SIGKILL);
    assert_mp_err(mp__recv_record(sv[0], buf, sizeof buf, &len, fds, 1, &nfds, mp__deadline(30)),
                  MP_ECLOSED);
    assert_mp_err(mp__send_record(sv[0], "x", 1, NULL, 0, mp__deadline(30)), MP_ECLOSED);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    mp__close(sv[0]);
}

/* What a hook does inside a library call leaves the call's sentence and
 * errno as they were. */
static void test_error_save_restore(void **state)
{
    mp__error_saved saved;
    (void)state;
    mp__error(MP_EPROTO, "the call's own sentence");
    errno = EBADF;
    mp__error_save(&saved);
    mp__errno_error(ENOENT, "the hook's failure");
    errno = EPIPE;
    mp__error_restore(&saved);
    assert_string_equal(mp_last_error(), "the call's own sentence");
    assert_int_equal(errno, EBADF);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_save_restore),
        cmocka_unit_test_setup_teardown(test_fault_injection, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_clock, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_cloexec, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_count_fds, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_futex, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_pidfd, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_roundtrip, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_errors, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_eintr_and_faults, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_full_socket, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_emfile, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_max_fds, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_peer_killed, mp_test_setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
