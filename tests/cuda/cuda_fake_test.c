/* CUDA IPC end to end on the fake CUDA runtime (tests/cuda/fake_cudart.c,
 * loaded by mproc's own loader through MPROC_CUDART: tests/cuda/fake_device.h),
 * so the whole path — the runtime table, IPC handles, events, the shared
 * count, the pending list, the handle cache, re-sending, dead consumers, a
 * producer that exits first, and the device count asked once per process —
 * runs on machines without a GPU. Processes are forked (the fake device,
 * unlike CUDA, survives fork) and attachments cross a SOCK_SEQPACKET pair
 * through the kind's own encode/decode. The same scenarios on a real GPU are
 * in cuda_gpu_test.c. */
#include "mp_test.h"

#include <stdio.h>

#ifdef MPROC_HAVE_CUDA
#include "cuda_helpers.h"
#include "fake_device.h"

#include <errno.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

static int setup(void **state)
{
    if (fake_device_install() < 0)
        return -1;
    return mp_test_setup(state);
}

static int teardown(void **state)
{
    size_t pending = 9;
    mp_cuda_ipc_collect(NULL);
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    assert_int_equal(fake->mallocs, fake->frees);
    assert_int_equal(fake->opens, fake->closes);
    assert_int_equal(fake->events, fake->event_frees);
    assert_int_equal(mp__cuda_import_count(), 0);
    assert_int_equal(mp__refseg_open_count(), 1); /* our own, for the process's life */
    return mp_test_teardown(state);
}

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void reap(pid_t pid, int want)
{
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != want)
        fail_msg("child %d: status %#x, wanted exit %d", (int)pid, status, want);
}

static void sync_byte(int fd, char want)
{
    char c = 0;
    CHECK(read(fd, &c, 1) == 1 && c == want);
}

/* The device count is asked of the runtime once per process (this test
 * runs first), not on every send and receive; a forked child asks once for
 * itself instead of trusting its parent's answer. */
static void test_device_count_cached(void **state)
{
    int n = 0, sv[2];
    assert_mp_ok(mp_cuda_device_count(&n));
    assert_int_equal(n, 2);
    assert_int_equal(fake->count_calls, 1);
    mp_tensor *d = iota_cuda(1, 1, 4);
    assert_non_null(d);
    pair(sv);
    for (int i = 0; i < 20; i++) {
        mp_tensor *t = NULL;
        assert_mp_ok(send_tensor(sv[0], d));
        assert_mp_ok(recv_tensor(sv[1], &t));
        assert_mp_ok(mp_cuda_synchronize(mp_tensor_device(t).device_id));
        mp_tensor_release(t);
    }
    assert_true(mp_cuda_is_available());
    assert_int_equal(fake->count_calls, 1);
    pid_t pid = fork();
    if (pid == 0) {
        int m = 0, before = fake->count_calls;
        CHECK(mp_cuda_device_count(&m) == 0 && m == 2);
        CHECK(fake->count_calls == before + 1);
        CHECK(mp_cuda_synchronize(1) == 0 && mp_cuda_device_count(&m) == 0);
        CHECK(fake->count_calls == before + 1);
        _exit(0);
    }
    reap(pid, 0);
    assert_int_equal(fake->count_calls, 1);
    mp_tensor_release(d);
    close(sv[0]);
    close(sv[1]);
}

/* The child adds 1 in place; the parent sees it. The parent's stream has
 * work queued, so the message carries an event and the child waits on it. */
static void test_add_one(void **state)
{
    int sv[2];
    mp_tensor *d = iota_cuda(1, 4, 4);
    assert_non_null(d);
    assert_true(mp_tensor_is_cuda(d));
    assert_int_equal(mp_tensor_device(d).device_id, 1);
    fake->stream_busy = 1;
    pair(sv);
    pid_t pid = fork();
    if (pid == 0) {
        mp_tensor *t = NULL;
        close(sv[0]);
        CHECK(recv_tensor(sv[1], &t) == 0);
        CHECK(mp_tensor_is_cuda(t) && mp_tensor_device(t).device_id == 1);
        CHECK(values_are(t, 0, 1, 16));
        add_one(t);
        CHECK(mp__cuda_import_count() == 1);
        mp_tensor_release(t);
        CHECK(mp__cuda_import_count() == 0 && fake->opens == 1 && fake->closes == 1);
        CHECK(fake->waits == 1); /* ordered after the producer's event */
        _exit(0);
    }
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], d));
    assert_int_equal(fake->records, 1);
    reap(pid, 0);
    assert_true(values_are(d, 1, 1, 16));
    int count = -1;
    assert_mp_ok(mp_tensor_cuda_share_count(d, &count));
    assert_int_equal(count, 0);
    mp_tensor_release(d);
    assert_int_equal(fake->frees, 1); /* nobody holds it: freed at once */
    close(sv[0]);
}

/* A sender whose stream is idle sends no event: it records none (nor makes
 * one) and the receiver waits on none. A busy stream on the next send of the
 * same allocation brings the event back. */
static void test_idle_stream_sends_no_event(void **state)
{
    int sv[2];
    mp_tensor *d = iota_cuda(0, 1, 8);
    assert_non_null(d);
    pair(sv);
    pid_t pid = fork();
    if (pid == 0) {
        mp_tensor *t = NULL, *u = NULL;
        close(sv[0]);
        CHECK(recv_tensor(sv[1], &t) == 0 && values_are(t, 0, 1, 8));
        CHECK(fake->waits == 0 && fake->events == 0);
        CHECK(recv_tensor(sv[1], &u) == 0 && values_are(u, 0, 1, 8));
        CHECK(fake->waits == 1);
        mp_tensor_release(t);
        mp_tensor_release(u);
        _exit(0);
    }
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], d));
    assert_int_equal(fake->records, 0);
    assert_int_equal(fake->events, 0);
    fake->stream_busy = 1;
    assert_mp_ok(send_tensor(sv[0], d));
    assert_int_equal(fake->records, 1);
    reap(pid, 0);
    mp_tensor_release(d);
    close(sv[0]);
}

/* Views at offsets inside one allocation arrive right, over one mapping. */
static void test_views(void **state)
{
    int sv[2];
    mp_tensor *d = iota_cuda(0, 8, 16), *rows = NULL, *col = NULL;
    assert_mp_ok(mp_tensor_narrow(d, 0, 2, 3, &rows));   /* rows 2..4 */
    assert_mp_ok(mp_tensor_select(d, 1, 5, &col));       /* column 5, stride 16 */
    mp_tensor *tr = NULL, *empty = NULL, *scalar = NULL;
    int64_t zero[1] = {0};
    assert_mp_ok(mp_tensor_transpose(d, 0, 1, &tr));     /* 16x8, strides (1, 16) */
    assert_mp_ok(mp_tensor_empty_cuda(1, MP_INT64, 1, zero, &empty));
    assert_mp_ok(mp_tensor_empty_cuda(0, MP_FLOAT64, 0, NULL, &scalar));
    pair(sv);
    pid_t pid = fork();
    if (pid == 0) {
        mp_tensor *a = NULL, *b = NULL;
        close(sv[0]);
        CHECK(recv_tensor(sv[1], &a) == 0 && recv_tensor(sv[1], &b) == 0);
        CHECK(mp_tensor_byte_offset(a) == 2 * 16 * 4);
        CHECK(values_are(a, 32, 1, 48));
        CHECK(values_are(b, 5, 16, 8));
        CHECK(mp__cuda_import_count() == 1 && fake->opens == 1); /* opened once */
        mp_tensor_release(a);
        CHECK(fake->closes == 0);
        mp_tensor_release(b);
        CHECK(fake->closes == 1);
        mp_tensor *c = NULL, *e = NULL, *z = NULL, *h = NULL;
        CHECK(recv_tensor(sv[1], &c) == 0 && recv_tensor(sv[1], &e) == 0 &&
              recv_tensor(sv[1], &z) == 0);
        CHECK(!mp_tensor_is_contiguous(c) && mp_tensor_size(c, 0) == 16);
        CHECK(mp_tensor_to_cpu(c, &h) == 0);
        CHECK(((float *)mp_tensor_data(h))[1] == 16 && ((float *)mp_tensor_data(h))[8] == 1);
        CHECK(mp_tensor_numel(e) == 0 && mp_tensor_device(e).device_id == 1);
        CHECK(mp_tensor_ndim(z) == 0 && mp_tensor_numel(z) == 1);
        mp_tensor_release(h);
        mp_tensor_release(c);
        mp_tensor_release(e);
        mp_tensor_release(z);
        CHECK(mp__cuda_import_count() == 0);
        _exit(0);
    }
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], rows));
    assert_mp_ok(send_tensor(sv[0], col));
    assert_mp_ok(send_tensor(sv[0], tr));
    assert_mp_ok(send_tensor(sv[0], empty));
    assert_mp_ok(send_tensor(sv[0], scalar));
    reap(pid, 0);
    mp_tensor_release(tr);
    mp_tensor_release(empty);
    mp_tensor_release(scalar);
    mp_tensor_release(rows);
    mp_tensor_release(col);
    mp_tensor_release(d);
    close(sv[0]);
}

/* The producer frees first: the memory stays until the consumer lets go. */
static void test_free_early(void **state)
{
    int sv[2], go[2], back[2];
    size_t pending = 0, freed = 9;
    mp_tensor *d = iota_cuda(0, 1, 64);
    pair(sv);
    assert_int_equal(pipe(go), 0);
    assert_int_equal(pipe(back), 0);
    pid_t pid = fork();
    if (pid == 0) {
        mp_tensor *t = NULL;
        close(sv[0]);
        sync_byte(go[0], 'r');
        CHECK(recv_tensor(sv[1], &t) == 0);
        CHECK(values_are(t, 0, 1, 64));
        CHECK(write(back[1], "h", 1) == 1);
        sync_byte(go[0], 'x');
        mp_tensor_release(t);
        CHECK(write(back[1], "x", 1) == 1);
        _exit(0);
    }
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], d));
    mp_tensor_release(d); /* the message in flight holds it */
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 1);
    assert_int_equal(fake->frees, 0);
    assert_int_equal(write(go[1], "r", 1), 1);
    sync_byte(back[0], 'h');
    assert_mp_ok(mp_cuda_ipc_collect(&freed));
    assert_int_equal(freed, 0);
    assert_int_equal(write(go[1], "x", 1), 1);
    sync_byte(back[0], 'x');
    assert_mp_ok(mp_cuda_ipc_collect(&freed));
    assert_int_equal(freed, 1);
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    reap(pid, 0);
    close(sv[0]);
    close(go[0]), close(go[1]), close(back[0]), close(back[1]);
}

/* A received tensor sent on to a third process: same allocation, same
 * counter; the producer's free waits for both. */
static void test_resend(void **state)
{
    int ab[2], bc[2];
    mp_tensor *d = iota_cuda(0, 2, 8);
    pair(ab);
    pair(bc);
    pid_t b = fork();
    if (b == 0) {
        mp_tensor *t = NULL;
        int count = 0;
        close(ab[0]);
        close(bc[0]);
        CHECK(recv_tensor(ab[1], &t) == 0);
        CHECK(mp_tensor_cuda_share_count(t, &count) == 0 && count == 1);
        CHECK(send_tensor(bc[1], t) == 0);
        mp_tensor_release(t); /* the message to C holds the allocation now */
        _exit(0);
    }
    pid_t c = fork();
    if (c == 0) {
        mp_tensor *t = NULL;
        int count = 0;
        close(ab[0]);
        close(ab[1]);
        close(bc[1]);
        CHECK(recv_tensor(bc[0], &t) == 0);
        CHECK(mp_tensor_cuda_share_count(t, &count) == 0 && count >= 1);
        CHECK(values_are(t, 0, 1, 16));
        add_one(t);
        mp_tensor_release(t);
        _exit(0);
    }
    close(ab[1]);
    close(bc[0]);
    close(bc[1]);
    assert_mp_ok(send_tensor(ab[0], d));
    reap(b, 0);
    reap(c, 0);
    assert_true(values_are(d, 1, 1, 16));
    int count = -1;
    assert_mp_ok(mp_tensor_cuda_share_count(d, &count));
    assert_int_equal(count, 0);
    mp_tensor_release(d);
    assert_int_equal(fake->frees, 1);
    close(ab[0]);
}

/* A consumer killed while holding: its reference does not pin the memory. */
static void test_killed_consumer(void **state)
{
    int sv[2];
    size_t pending = 9;
    mp_tensor *d = iota_cuda(0, 1, 8);
    pair(sv);
    pid_t pid = fork();
    if (pid == 0) {
        mp_tensor *t = NULL;
        close(sv[0]);
        CHECK(recv_tensor(sv[1], &t) == 0);
        raise(SIGKILL);
        _exit(1);
    }
    close(sv[1]);
    assert_mp_ok(send_tensor(sv[0], d));
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    mp_tensor_release(d);
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    assert_int_equal(fake->frees, 1);
    close(sv[0]);
}

static void log_to_fd(int level, const char *line, void *user)
{
    int fd = *(int *)user;
    if (level == MP_LOG_WARN && write(fd, line, strlen(line)) < 0)
        _exit(101);
}

/* The producer exits while we hold its tensor: it says so once, we get a
 * clear error on the next use of the count, and nothing hangs. */
static void test_producer_exits_first(void **state)
{
    int sv[2], logp[2], go[2];
    char line[512] = {0};
    pair(sv);
    assert_int_equal(pipe(logp), 0);
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    if (pid == 0) {
        static int fd;
        close(sv[0]);
        close(logp[0]);
        fd = logp[1];
        mp_set_log_hook(log_to_fd, &fd);
        mp_tensor *d = iota_cuda(0, 1, 8), *e = iota_cuda(0, 1, 8);
        CHECK(d && e && send_tensor(sv[1], d) == 0 && send_tensor(sv[1], e) == 0);
        sync_byte(go[0], 'x');
        exit(0); /* atexit: the warning */
    }
    close(sv[1]);
    close(logp[1]);
    mp_tensor *t = NULL, *u = NULL;
    assert_mp_ok(recv_tensor(sv[0], &t));
    assert_mp_ok(recv_tensor(sv[0], &u));
    assert_int_equal(write(go[1], "x", 1), 1);
    reap(pid, 0);
    assert_true(read(logp[0], line, sizeof line - 1) > 0);
    if (!strstr(line, "2 CUDA allocations are still shared"))
        fail_msg("warning line: %s", line);
    int count = 0;
    assert_mp_err(mp_tensor_cuda_share_count(t, &count), MP_ECLOSED);
    assert_non_null(strstr(mp_last_error(), "has exited"));
    mp_tensor_release(t);
    mp_tensor_release(u);
    close(sv[0]);
    close(logp[0]);
    close(go[0]);
    close(go[1]);
}

/* A tensor still in flight when its producer exits cannot be received: a
 * clear MP_ECLOSED, the fds closed, nothing left mapped. */
static void test_producer_gone_before_receive(void **state)
{
    int sv[2];
    mp_tensor *t = NULL;
    pair(sv);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        mp_tensor *d = iota_cuda(0, 1, 8);
        CHECK(d && send_tensor(sv[1], d) == 0);
        _exit(0);
    }
    close(sv[1]);
    reap(pid, 0);
    assert_mp_err(recv_tensor(sv[0], &t), MP_ECLOSED);
    assert_non_null(strstr(mp_last_error(), "has exited"));
    assert_null(t);
    assert_int_equal(mp__refseg_open_count(), 1);
    close(sv[0]);
}

/* 1000 tensors sent and released (to ourselves: the producer's own path,
 * no IPC open) with the pending list back to empty. */
static void test_thousand_to_self(void **state)
{
    size_t pending = 9;
    int sv[2];
    pair(sv);
    for (int i = 0; i < 1000; i++) {
        mp_tensor *d = iota_cuda(0, 1, 4), *t = NULL;
        assert_non_null(d);
        assert_mp_ok(send_tensor(sv[0], d));
        mp_tensor_release(d);
        assert_mp_ok(recv_tensor(sv[1], &t));
        assert_true(mp_tensor_is_cuda(t));
        if (i == 0)
            assert_true(values_are(t, 0, 1, 4));
        mp_tensor_release(t);
    }
    assert_mp_ok(mp_cuda_ipc_pending(&pending));
    assert_int_equal(pending, 0);
    assert_int_equal(fake->mallocs, 1000);
    assert_int_equal(fake->frees, 1000);
    assert_int_equal(fake->opens, 0);
    close(sv[0]);
    close(sv[1]);
}

/* Many sends of one allocation: one slot, one mapping, references balance. */
static void test_repeated_sends(void **state)
{
    int sv[2];
    mp_tensor *d = iota_cuda(0, 1, 4);
    pair(sv);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        for (int i = 0; i < 50; i++) {
            mp_tensor *t = NULL;
            CHECK(recv_tensor(sv[1], &t) == 0);
            mp_tensor_release(t);
        }
        CHECK(fake->opens == 50 && fake->closes == 50);
        _exit(0);
    }
    close(sv[1]);
    for (int i = 0; i < 50; i++)
        assert_mp_ok(send_tensor(sv[0], d));
    reap(pid, 0);
    int count = -1;
    assert_mp_ok(mp_tensor_cuda_share_count(d, &count));
    assert_int_equal(count, 0);
    mp_tensor_release(d);
    close(sv[0]);
}

static void test_refusals(void **state)
{
    mp_tensor *h = NULL, *d = NULL;
    int64_t shape[1] = {4};
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &h));
    assert_mp_err(mp_tensor_to_cuda(h, 7, &d), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "device 7 does not exist"));
    assert_memory_equal(mp_last_error(), "mp_tensor_to_cuda: ", 19);
    assert_null(d);
    int sv[2];
    pair(sv);
    assert_mp_err(send_tensor(sv[0], h), MP_EINVAL); /* a CPU tensor */
    /* A DLPack import of device memory has no mproc allocation behind it. */
    mp_tensor *c = iota_cuda(0, 1, 4), *imp = NULL;
    DLManagedTensor *m = NULL;
    assert_mp_ok(mp_tensor_to_dlpack(c, &m));
    assert_int_equal(m->dl_tensor.device.device_type, kDLCUDA);
    assert_mp_ok(mp_tensor_from_dlpack(m, &imp));
    assert_int_equal(mp_tensor_device(imp).device_type, kDLCUDA);
    /* the CPU-only calls name the device and the CUDA call to use */
    mp_tensor *x = h, *h2 = NULL;
    int64_t shape2[2] = {1, 4};
    assert_mp_err(mp_tensor_clone(imp, &x), MP_ENOTSUP);
    assert_string_equal(mp_last_error(), "mp_tensor_clone: the tensor is on cuda:0; copy it "
                                         "with mp_tensor_to_cuda or mp_tensor_to_cpu");
    assert_null(x);
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 2, shape2, &h2));
    assert_mp_err(mp_tensor_copy_(h2, imp), MP_ENOTSUP);
    assert_string_equal(mp_last_error(), "mp_tensor_copy_: src is on cuda:0; use "
                                         "mp_tensor_copy_cuda_");
    assert_mp_err(mp_tensor_copy_cuda_(h, imp), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_tensor_copy_cuda_: dst has shape [4], src [1, 4]; "
                                         "copy between tensors of one shape");
    mp_msg *msg = NULL;
    assert_mp_ok(mp_msg_create(&msg));
    assert_mp_err(mp_msg_add_cuda_tensor(msg, "h", h2), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_msg_add_cuda_tensor: the tensor is on cpu, not on "
                                         "a CUDA device (a CPU tensor travels with "
                                         "mp_msg_add_tensor)");
    mp_msg_destroy(msg);
    mp_tensor_release(h2);
    assert_mp_err(mp_tensor_share_memory_(imp), MP_ENOTSUP);
    assert_non_null(strstr(mp_last_error(), "the tensor is on cuda:0 and stays there"));
    assert_mp_err(send_tensor(sv[0], imp), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "mp_tensor_to_cuda"));
    mp_tensor_release(imp);
    mp_tensor_release(c);
    mp_tensor_release(h);
    close(sv[0]);
    close(sv[1]);
}

static void test_fork_guard_after_init(void **state)
{
    int n = 0;
    assert_mp_ok(mp_cuda_device_count(&n));
    assert_int_equal(n, 2);
    assert_true(mp__cuda_initialized());
    assert_mp_err(mp__cuda_fork_check("mp_process_start"), MP_ESTATE);
}

int main(void)
{
    /* The own reference segment lives as long as the process: create it
     * before the leak snapshots. */
    mp__refseg *own;
    mp__cuda_lock();
    int rc = mp__cuda_own_segment(&own);
    mp__cuda_unlock();
    if (rc < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_device_count_cached, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_one, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_stream_sends_no_event, setup, teardown),
        cmocka_unit_test_setup_teardown(test_views, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_early, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resend, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_consumer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_exits_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_gone_before_receive, setup, teardown),
        cmocka_unit_test_setup_teardown(test_thousand_to_self, setup, teardown),
        cmocka_unit_test_setup_teardown(test_repeated_sends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork_guard_after_init, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("skipped: built without CUDA (-DMPROC_CUDA=OFF), no fake-device path to test\n");
    return 77; /* ctest's SKIP_RETURN_CODE: reported as skipped, not passed */
}
#endif
