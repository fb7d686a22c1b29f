/* The public CUDA API on a machine without a GPU, in both builds: the fork
 * guard (simulated), argument checks, MP_ENOTSUP from a build without CUDA,
 * and a clean "no device" from a CUDA build; the removal of the driver's
 * event files at exit, on files named as the driver names them. */
#include "mp_test.h"
#include "cuda/cuda_internal.h"
#include "ipc/kinds.h"
#include "os/os.h"
#include "wire/wire.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int teardown(void **state)
{
    mp__cuda_simulate_initialized(false);
    return mp_test_teardown(state);
}

static void test_fork_guard(void **state)
{
    bool real = mp__cuda_initialized();
    if (!real)
        assert_mp_ok(mp__cuda_fork_check("mp_process_start"));
    mp__cuda_simulate_initialized(true);
    assert_true(mp__cuda_initialized());
    assert_mp_err(mp__cuda_fork_check("mp_process_start"), MP_ESTATE);
    const char *why = mp_last_error();
    assert_non_null(strstr(why, "mp_process_start"));
    assert_non_null(strstr(why, "spawn"));
    assert_non_null(strstr(why, "forkserver"));
    assert_mp_err(mp__cuda_fork_check(NULL), MP_ESTATE);
    mp__cuda_simulate_initialized(false);
    assert_int_equal(mp__cuda_initialized(), real);
}

static void test_cpu_tensor_is_not_cuda(void **state)
{
    mp_tensor *t = NULL;
    int64_t shape[1] = {4};
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &t));
    assert_false(mp_tensor_is_cuda(t));
    assert_false(mp_tensor_is_cuda(NULL));
    int count = -1;
    assert_mp_err(mp_tensor_cuda_share_count(t, &count), mp_cuda_device_count(&count) == MP_ENOTSUP
                                                             ? MP_ENOTSUP
                                                             : MP_EINVAL);
    mp_tensor_release(t);
}

static void make_event_file(char *name, size_t cap, pid_t pid)
{
    snprintf(name, cap, "/dev/shm/cuda.shm.%x.%x.1", (unsigned)geteuid(), (unsigned)pid);
    int fd = open(name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
}

/* A process that made an event removes its own event file when it exits,
 * by exit or (as an mproc child does) by _exit after the exit work, and
 * leaves another process's alone. */
static void test_event_files_removed_at_exit(void **state)
{
    char ours[96], theirs[96];
    make_event_file(theirs, sizeof theirs, getpid());
    for (int by_exit = 0; by_exit < 2; by_exit++) {
        int p[2];
        char c = 0;
        assert_int_equal(pipe2(p, O_CLOEXEC), 0);
        pid_t pid = fork();
        if (pid == 0) {
            make_event_file(ours, sizeof ours, getpid());
            mp__cuda_event_files_remove_at_exit();
            mp__cuda_event_files_remove_at_exit(); /* idempotent */
            if (write(p[1], "m", 1) != 1)
                _exit(1);
            if (by_exit)
                exit(0);
            mp__child_exit_run(); /* what an mproc child runs before _exit */
            _exit(0);
        }
        close(p[1]);
        assert_int_equal(read(p[0], &c, 1), 1);
        close(p[0]);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        snprintf(ours, sizeof ours, "/dev/shm/cuda.shm.%x.%x.1", (unsigned)geteuid(),
                 (unsigned)pid);
        assert_int_equal(access(ours, F_OK), -1);
    }
    assert_int_equal(access(theirs, F_OK), 0);
    unlink(theirs);
}

/* A child forked after its parent made an event inherits the exit hook but
 * made none itself (CUDA does not survive a fork): its exit scans nothing,
 * so a file named with its pid, which the scan would remove, stays. */
static void test_forked_child_skips_the_scan(void **state)
{
    char grandchild_file[96];
    int p[2];
    pid_t grandchild = 0;
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = fork();
    if (pid == 0) {
        mp__cuda_event_files_remove_at_exit();
        pid_t g = fork();
        if (g == 0) {
            make_event_file(grandchild_file, sizeof grandchild_file, getpid());
            exit(0);
        }
        int status = 0;
        if (waitpid(g, &status, 0) != g || write(p[1], &g, sizeof g) != sizeof g)
            _exit(1);
        exit(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1);
    }
    close(p[1]);
    assert_int_equal(read(p[0], &grandchild, sizeof grandchild), (ssize_t)sizeof grandchild);
    close(p[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    snprintf(grandchild_file, sizeof grandchild_file, "/dev/shm/cuda.shm.%x.%x.1",
             (unsigned)geteuid(), (unsigned)grandchild);
    assert_int_equal(access(grandchild_file, F_OK), 0);
    unlink(grandchild_file);
}

static void test_kind_registered(void **state)
{
    const mp__objkind *k;
    assert_mp_ok(mp__objkinds_ensure("test"));
    k = mp__objkind_lookup(MP_ATTACH_CUDA_TENSOR);
    assert_ptr_equal(k, &mp__cuda_tensor_kind);
    assert_int_equal(k->kind, MP_ATTACH_CUDA_TENSOR);
    /* Garbage with an fd: refused, and the fd is closed. */
    int fds[1] = {open("/dev/null", O_RDONLY | O_CLOEXEC)};
    void *obj = NULL;
    assert_true(k->decode("junk", 4, fds, 1, &obj) < 0);
    assert_null(obj);
    assert_int_equal(fcntl(fds[0], F_GETFD), -1);
}

#ifndef MPROC_HAVE_CUDA
static void check_enotsup(int rc, const char *call)
{
    if (rc != MP_ENOTSUP)
        fail_msg("%s -> %s, wanted MP_ENOTSUP", call, mp_err_name(rc));
    if (!strstr(mp_last_error(), call) || !strstr(mp_last_error(), "-DMPROC_CUDA=ON"))
        fail_msg("%s: sentence does not say how to enable CUDA: %s", call, mp_last_error());
}

static void test_stub(void **state)
{
    int n = 5;
    size_t z = 5;
    int64_t shape[1] = {4};
    mp_tensor *t = (mp_tensor *)&n;
    assert_false(mp_cuda_is_available());
    check_enotsup(mp_cuda_device_count(&n), "mp_cuda_device_count");
    assert_int_equal(n, 0);
    check_enotsup(mp_cuda_synchronize(0), "mp_cuda_synchronize");
    check_enotsup(mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, &t), "mp_tensor_empty_cuda");
    assert_null(t);
    check_enotsup(mp_tensor_to_cuda(NULL, 0, &t), "mp_tensor_to_cuda");
    check_enotsup(mp_tensor_to_cpu(NULL, &t), "mp_tensor_to_cpu");
    check_enotsup(mp_tensor_copy_cuda_(NULL, NULL), "mp_tensor_copy_cuda_");
    check_enotsup(mp_msg_add_cuda_tensor(NULL, NULL, NULL), "mp_msg_add_cuda_tensor");
    check_enotsup(mp_msg_get_cuda_tensor(NULL, 0, &t), "mp_msg_get_cuda_tensor");
    check_enotsup(mp_cuda_ipc_collect(&z), "mp_cuda_ipc_collect");
    assert_int_equal(z, 0);
    check_enotsup(mp_cuda_ipc_pending(&z), "mp_cuda_ipc_pending");
    check_enotsup(mp_tensor_cuda_share_count(NULL, &n), "mp_tensor_cuda_share_count");
    assert_false(mp__cuda_initialized());
}
#else
static void test_no_device(void **state)
{
    int n = -1;
    size_t z = 7;
    int64_t shape[1] = {4};
    mp_tensor *t = NULL;
    int rc = mp_cuda_device_count(&n);
    if (rc < 0) {
        /* No driver (MP_ESYS), or no CUDA runtime to load (MP_ENOTSUP): a
         * sentence that says what is missing, not a crash. */
        if (rc != MP_ESYS && rc != MP_ENOTSUP)
            fail_msg("mp_cuda_device_count -> %s: %s", mp_err_name(rc), mp_last_error());
        assert_non_null(strstr(mp_last_error(), "mp_cuda_device_count"));
        assert_int_equal(n, 0);
    }
    if (rc < 0 || n == 0) {
        assert_false(mp_cuda_is_available());
        assert_false(mp__cuda_initialized());
        assert_true(mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, &t) < 0);
        assert_null(t);
    }
    if (rc == MP_ENOTSUP)
        return; /* some argument checks come after loading the runtime */
    assert_mp_err(mp_cuda_device_count(NULL), MP_EINVAL);
    assert_mp_err(mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, NULL), MP_EINVAL);
    assert_mp_err(mp_tensor_empty_cuda(0, MP_DTYPE_COUNT, 1, shape, &t), MP_EINVAL);
    assert_mp_err(mp_tensor_to_cpu(NULL, &t), MP_EINVAL);
    assert_mp_err(mp_tensor_copy_cuda_(NULL, NULL), MP_EINVAL);
    assert_mp_err(mp_cuda_ipc_pending(NULL), MP_EINVAL);
    assert_mp_ok(mp_cuda_ipc_pending(&z));
    assert_int_equal(z, 0);
    assert_mp_ok(mp_cuda_ipc_collect(&z));
    assert_int_equal(z, 0);
}
#endif

int main(void)
{
    /* With a GPU, the runtime opens its own fds (/dev/nvidia*, kept for the
     * process's life) at its first call: make it before the leak snapshots. */
    int devices = 0;
    mp_cuda_device_count(&devices);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fork_guard, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_cpu_tensor_is_not_cuda, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_kind_registered, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_files_removed_at_exit, mp_test_setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_forked_child_skips_the_scan, mp_test_setup,
                                        teardown),
#ifndef MPROC_HAVE_CUDA
        cmocka_unit_test_setup_teardown(test_stub, mp_test_setup, teardown),
#else
        cmocka_unit_test_setup_teardown(test_no_device, mp_test_setup, teardown),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
