/* CUDA tensors across processes on a real GPU. Skips, saying why, when this
 * build has no CUDA or no device is visible. Helper processes are this binary
 * re-executed with a role (posix_spawn: exec, so the CUDA runtime starts fresh
 * in each, as spawn and forkserver guarantee). Scenarios: a child adds 1 in
 * place and the parent sees it; views at offsets inside one allocation; 1000
 * tensors sent and released with the pending list back to empty; the producer
 * frees early and the memory stays valid until the consumer releases; re-send
 * to a third process; the producer exits first (the warning, no hang); a
 * consumer SIGKILLed while holding a tensor (the count drops, and
 * mp_cuda_ipc_collect frees the allocation); a sender with work still queued
 * (an event orders the receiver; the driver's event file goes at exit). Exit
 * 77 (skipped) without a device. MPROC_TEST_FAKE_CUDA=1 runs it all on the
 * fake runtime. */
#include "mp_test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>

#ifdef MPROC_HAVE_CUDA
#include "cuda/gpu.h"
#include "cuda_helpers.h"
#include "fake_device.h"

extern char **environ;

/* ---- helper processes ---------------------------------------------------- */

static void say(int fd, const char *what)
{
    CHECK(mp__send_record(fd, what, 1, NULL, 0, -1) == 0);
}

static void hear(int fd, char want)
{
    char c = 0;
    size_t len = 0;
    int nfds = 0;
    CHECK(mp__recv_record(fd, &c, 1, &len, NULL, 0, &nfds, mp__deadline(60)) == 0 && c == want);
}

static void log_to_fd(int level, const char *line, void *user)
{
    int fd = *(int *)user;
    if (level == MP_LOG_WARN && write(fd, line, strlen(line)) < 0)
        _exit(101);
}

/* The busy sender's tensor: big enough that its fill is still running when
 * it is sent (1 GiB takes about 0.4 ms on an H100); small on the fake. */
static int64_t busy_floats(void) { return fake ? 1 << 18 : 1 << 28; }

typedef struct files_of {
    pid_t pid;
    int n;
} files_of;

static int count_if_of(const char *name, void *ctx)
{
    files_of *f = ctx;
    f->n += mp__cuda_event_file_pid(name) == f->pid;
    return 0;
}

/* The CUDA driver's event files (cuda.shm.*) of process pid in /dev/shm. */
static int event_files_of(pid_t pid)
{
    files_of f = {pid, 0};
    mp__cuda_event_files_each(count_if_of, &f);
    return f.n;
}

static int child(const char *role, int fd, int fd2)
{
    mp_tensor *t = NULL, *u = NULL;
    int count = 0;
    if (!strcmp(role, "add_one")) {
        CHECK(recv_tensor(fd, &t) == 0);
        CHECK(mp_tensor_is_cuda(t) && values_are(t, 0, 1, 16));
        add_one(t);
        CHECK(mp_cuda_synchronize(mp_tensor_device(t).device_id) == 0);
        mp_tensor_release(t);
        say(fd, "d");
    } else if (!strcmp(role, "views")) {
        CHECK(recv_tensor(fd, &t) == 0 && recv_tensor(fd, &u) == 0);
        CHECK(values_are(t, 32, 1, 48) && values_are(u, 5, 16, 8));
        CHECK(mp__cuda_import_count() == 1); /* one allocation, opened once */
        mp_tensor_release(t);
        mp_tensor_release(u);
        CHECK(mp__cuda_import_count() == 0);
        say(fd, "d");
    } else if (!strcmp(role, "hold")) {
        CHECK(recv_tensor(fd, &t) == 0);
        CHECK(values_are(t, 0, 1, 64));
        say(fd, "h");
        hear(fd, 'x');
        CHECK(values_are(t, 0, 1, 64)); /* still valid after the producer freed */
        mp_tensor_release(t);
        say(fd, "r");
    } else if (!strcmp(role, "sink")) {
        for (int i = 0; i < 1000; i++) {
            CHECK(recv_tensor(fd, &t) == 0);
            mp_tensor_release(t);
        }
        say(fd, "d");
    } else if (!strcmp(role, "relay")) {
        CHECK(recv_tensor(fd, &t) == 0);
        CHECK(send_tensor(fd2, t) == 0);
        mp_tensor_release(t);
        say(fd, "d");
        /* The message's reference is ours until the third has taken it. */
        hear(fd, 'x');
    } else if (!strcmp(role, "third")) {
        CHECK(recv_tensor(fd, &t) == 0);
        CHECK(mp_tensor_cuda_share_count(t, &count) == 0 && count >= 1);
        CHECK(values_are(t, 0, 1, 16));
        add_one(t);
        CHECK(mp_cuda_synchronize(mp_tensor_device(t).device_id) == 0);
        mp_tensor_release(t); /* the exit status tells the parent */
    } else if (!strcmp(role, "busy")) {
        int64_t n = busy_floats();
        CHECK(mp_tensor_empty_cuda(0, MP_FLOAT32, 1, &n, &t) == 0);
        CHECK(mp__cuda.Memset(mp_tensor_data(t), 0x3f, (size_t)n * 4) == cudaSuccess);
        if (fake)
            fake->stream_busy = 1; /* the fake's fill is synchronous */
        CHECK(send_tensor(fd, t) == 0);
        hear(fd, 'x');
        mp_tensor_release(t);
        exit(0); /* atexit: its event file goes */
    } else if (!strcmp(role, "producer")) {
        static int logfd;
        logfd = fd2;
        mp_set_log_hook(log_to_fd, &logfd);
        t = iota_cuda(0, 1, 8);
        CHECK(t && send_tensor(fd, t) == 0);
        hear(fd, 'x');
        exit(0); /* atexit: the warning; t stays shared */
    } else {
        return 2;
    }
    return 0;
}

/* ---- the parent's side ----------------------------------------------------- */

static pid_t spawn_role(const char *role, int fd, int fd2)
{
    char a[16], b[16];
    char *argv[] = {"/proc/self/exe", "--cuda-child", (char *)role, a, b, NULL};
    pid_t pid = -1;
    snprintf(a, sizeof a, "%d", fd);
    snprintf(b, sizeof b, "%d", fd2);
    /* The child's ends must survive exec. */
    mp__set_cloexec(fd, false);
    if (fd2 >= 0)
        mp__set_cloexec(fd2, false);
    int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ);
    mp__set_cloexec(fd, true);
    if (fd2 >= 0)
        mp__set_cloexec(fd2, true);
    if (rc != 0)
        fail_msg("posix_spawn: %s", strerror(rc));
    return pid;
}

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void reap(pid_t pid)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("helper %d: status %#x", (int)pid, status);
}

static void expect(int fd, char want)
{
    char c = 0;
    size_t len = 0;
    int nfds = 0;
    assert_mp_ok(mp__recv_record(fd, &c, 1, &len, NULL, 0, &nfds, mp__deadline(60)));
    assert_int_equal(c, want);
}

static int teardown(void **state)
{
    size_t pending = 9;
    assert_mp_ok(mp_cuda_ipc_collect(NULL));
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    return mp_test_teardown(state);
}

static void test_add_one(void **state)
{
    int sv[2];
    mp_tensor *d = iota_cuda(0, 4, 4);
    assert_non_null(d);
    pair(sv);
    pid_t pid = spawn_role("add_one", sv[1], -1);
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], d));
    expect(sv[0], 'd');
    reap(pid);
    assert_true(values_are(d, 1, 1, 16));
    mp_tensor_release(d);
    close(sv[0]);
}

static void test_views(void **state)
{
    int sv[2];
    mp_tensor *d = iota_cuda(0, 8, 16), *rows = NULL, *col = NULL;
    assert_non_null(d);
    assert_mp_ok(mp_tensor_narrow(d, 0, 2, 3, &rows));
    assert_mp_ok(mp_tensor_select(d, 1, 5, &col));
    pair(sv);
    pid_t pid = spawn_role("views", sv[1], -1);
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], rows));
    assert_mp_ok(send_tensor(sv[0], col));
    expect(sv[0], 'd');
    reap(pid);
    mp_tensor_release(rows);
    mp_tensor_release(col);
    mp_tensor_release(d);
    close(sv[0]);
}

static void test_thousand(void **state)
{
    int sv[2];
    size_t pending = 0;
    pair(sv);
    pid_t pid = spawn_role("sink", sv[1], -1);
    close(sv[1]);
    for (int i = 0; i < 1000; i++) {
        mp_tensor *d = iota_cuda(0, 1, 16);
        assert_non_null(d);
        assert_mp_ok(send_tensor(sv[0], d));
        mp_tensor_release(d); /* freed early: pending until the sink lets go */
    }
    expect(sv[0], 'd');
    reap(pid);
    assert_mp_ok(mp_cuda_ipc_collect(NULL));
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    close(sv[0]);
}

static void test_free_early(void **state)
{
    int sv[2];
    size_t pending = 0, freed = 9;
    mp_tensor *d = iota_cuda(0, 1, 64);
    pair(sv);
    pid_t pid = spawn_role("hold", sv[1], -1);
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], d));
    mp_tensor_release(d);
    expect(sv[0], 'h');
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 1);
    assert_mp_ok(mp_cuda_ipc_collect(&freed));
    assert_int_equal(freed, 0);
    assert_mp_ok(mp__send_record(sv[0], "x", 1, NULL, 0, -1));
    expect(sv[0], 'r');
    reap(pid);
    assert_mp_ok(mp_cuda_ipc_collect(&freed));
    assert_int_equal(freed, 1);
    close(sv[0]);
}

static void test_resend(void **state)
{
    int ab[2], bc[2];
    mp_tensor *d = iota_cuda(0, 2, 8);
    pair(ab);
    pair(bc);
    pid_t b = spawn_role("relay", ab[1], bc[0]);
    pid_t c = spawn_role("third", bc[1], -1);
    close(ab[1]);
    close(bc[0]);
    close(bc[1]);
    assert_mp_ok(send_tensor(ab[0], d));
    expect(ab[0], 'd');
    reap(c);
    assert_mp_ok(mp__send_record(ab[0], "x", 1, NULL, 0, -1));
    reap(b);
    assert_true(values_are(d, 1, 1, 16));
    int count = -1;
    assert_mp_ok(mp_tensor_cuda_share_count(d, &count));
    assert_int_equal(count, 0);
    mp_tensor_release(d);
    close(ab[0]);
}

/* A consumer killed while holding: its reference is reclaimed, so the count
 * drops to zero and collect frees the allocation the producer let go of. */
static void test_killed_consumer(void **state)
{
    int sv[2], count = -1;
    size_t pending = 0, freed = 9;
    mp_tensor *d = iota_cuda(0, 1, 64);
    assert_non_null(d);
    pair(sv);
    pid_t pid = spawn_role("hold", sv[1], -1);
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], d));
    expect(sv[0], 'h');
    assert_mp_ok(mp_tensor_cuda_share_count(d, &count));
    assert_int_equal(count, 1);
    mp_tensor_release(d);
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 1);
    assert_int_equal(kill(pid, SIGKILL), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    assert_mp_ok(mp_cuda_ipc_collect(&freed));
    assert_int_equal(freed, 1);
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    close(sv[0]);
}

static void test_producer_exits_first(void **state)
{
    int sv[2], logp[2];
    char line[512] = {0};
    mp_tensor *t = NULL;
    pair(sv);
    assert_int_equal(pipe2(logp, O_CLOEXEC), 0);
    pid_t pid = spawn_role("producer", sv[1], logp[1]);
    close(sv[1]);
    close(logp[1]);
    assert_mp_ok(recv_tensor(sv[0], &t));
    assert_mp_ok(mp__send_record(sv[0], "x", 1, NULL, 0, -1));
    reap(pid);
    assert_true(read(logp[0], line, sizeof line - 1) > 0);
    if (!strstr(line, "1 CUDA allocation is still shared"))
        fail_msg("warning line: %s", line);
    int count = 0;
    assert_mp_err(mp_tensor_cuda_share_count(t, &count), MP_ECLOSED);
    mp_tensor_release(t); /* no hang, no crash */
    close(sv[0]);
    close(logp[0]);
}

/* A sender whose stream is still filling the tensor when it sends: the
 * message carries an event, so the receiver's copy sees the whole fill; the
 * driver made the sender an event file, which is gone once it has exited. */
static void test_busy_sender(void **state)
{
    int sv[2];
    int64_t n = 0;
    mp_tensor *t = NULL, *tail = NULL, *h = NULL;
    pair(sv);
    pid_t pid = spawn_role("busy", sv[1], -1);
    close(sv[1]);
    assert_mp_ok(recv_tensor(sv[0], &t));
    n = mp_tensor_numel(t);
    assert_int_equal(n, busy_floats());
    assert_mp_ok(mp_tensor_narrow(t, 0, n - 4, 4, &tail));
    assert_mp_ok(mp_tensor_to_cpu(tail, &h));
    const unsigned char *b = mp_tensor_data(h);
    for (int i = 0; i < 16; i++)
        assert_int_equal(b[i], 0x3f);
    if (!fake)
        assert_int_equal(event_files_of(pid), 1); /* it did record an event */
    mp_tensor_release(h);
    mp_tensor_release(tail);
    mp_tensor_release(t);
    assert_mp_ok(mp__send_record(sv[0], "x", 1, NULL, 0, -1));
    reap(pid);
    assert_int_equal(event_files_of(pid), 0);
    close(sv[0]);
}

/* One full round before the leak snapshots: the driver opens its own fds
 * and mappings lazily on first use of each feature (the event file at the
 * first send with work queued, hence the fill of a scratch tensor). */
static void warm_up(void)
{
    int sv[2];
    int64_t n = busy_floats();
    mp_tensor *scratch = NULL;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return;
    mp_tensor *d = iota_cuda(0, 4, 4);
    pid_t pid = spawn_role("add_one", sv[1], -1);
    close(sv[1]);
    if (mp_tensor_empty_cuda(0, MP_FLOAT32, 1, &n, &scratch) == 0)
        mp__cuda.Memset(mp_tensor_data(scratch), 0, (size_t)n * 4);
    if (d && send_tensor(sv[0], d) == 0) {
        char c;
        size_t len;
        int nfds;
        mp__recv_record(sv[0], &c, 1, &len, NULL, 0, &nfds, mp__deadline(60));
    }
    waitpid(pid, NULL, 0);
    mp_tensor_release(d);
    mp_tensor_release(scratch);
    close(sv[0]);
    /* ... and the receiving side in this process (IPC open and close). */
    int logp[2];
    mp_tensor *t = NULL;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return;
    if (pipe2(logp, O_CLOEXEC) == 0) {
        pid = spawn_role("producer", sv[1], logp[1]);
        close(logp[1]);
        if (recv_tensor(sv[0], &t) == 0)
            mp__send_record(sv[0], "x", 1, NULL, 0, -1);
        waitpid(pid, NULL, 0);
        mp_tensor_release(t);
        close(logp[0]);
    }
    close(sv[0]);
    close(sv[1]);
}

int main(int argc, char **argv)
{
    int n = 0, rc;
    /* MPROC_TEST_FAKE_CUDA=1 (CTest's cuda_gpu_test_fake): the same
     * scenarios on the fake device, so this file runs without a GPU too. */
    const char *fake_env = getenv("MPROC_TEST_FAKE_CUDA");
    if (fake_env && !strcmp(fake_env, "1") && fake_device_install() < 0)
        return 1;
    if (argc == 5 && !strcmp(argv[1], "--cuda-child"))
        return child(argv[2], atoi(argv[3]), atoi(argv[4]));
    if ((rc = mp_cuda_device_count(&n)) < 0 || n == 0) {
        printf("skipped: no CUDA device (%s)\n", rc < 0 ? mp_last_error() : "0 devices visible");
        return 77;
    }
    warm_up();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_add_one, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_views, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_thousand, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_early, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_resend, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_exits_first, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_consumer, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_busy_sender, mp_test_setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("skipped: built without the CUDA headers (rebuild with -DMPROC_CUDA=ON and the "
           "CUDA toolkit's headers)\n");
    return 77;
}
#endif
