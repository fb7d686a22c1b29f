/* mp_tensor_adopt_fd: foreign shared memory (an unlinked POSIX segment as
 * torch makes them, a sealed memfd) becomes an mproc tensor without a copy,
 * is refused with a clear sentence when it is not shared memory or can be
 * shrunk by name, and travels through a queue to a process that outlives
 * its producer. Every test checks that no fd, mapping or segment leaks. */
#include "mp_test.h"
#include "tensor/tensor_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int setup(void **state)
{
    return mp_test_setup(state);
}
static int teardown(void **state)
{
    assert_int_equal(mp__segment_count(), 0);
    return mp_test_teardown(state);
}

/* What torch's file_descriptor strategy makes: shm_open, size, unlink. */
static int torch_like(size_t size, bool unlink)
{
    char name[64];
    snprintf(name, sizeof name, "/adopt-test-%d-%zu", (int)getpid(), size);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    if (unlink)
        shm_unlink(name);
    return fd;
}

static void expect_einval(int fd, uint64_t offset, size_t nbytes, const char *needle)
{
    mp_tensor *t = (mp_tensor *)&t;
    assert_mp_err(mp_tensor_adopt_fd(fd, offset, nbytes, &t), MP_EINVAL);
    assert_null(t);
    if (!strstr(mp_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", mp_last_error(), needle);
}

static uint64_t shared_copies(void)
{
    mp_tensor_stats st = {.size = sizeof st};
    assert_mp_ok(mp_tensor_stats_get(&st));
    return st.shared_copies;
}

static void test_adopts_without_copy(void **state)
{
    (void)state;
    uint64_t copies = shared_copies();
    int fd = torch_like(8192, true);
    int32_t *mine = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(mine != MAP_FAILED);
    mine[0] = 41;
    mp_tensor *t, *u;
    assert_mp_ok(mp_tensor_adopt_fd(fd, 0, 8192, &t));
    assert_mp_ok(mp_tensor_adopt_fd(fd, 4096, 100, &u));
    close(fd); /* adopt dup'ed it: the tensors do not need ours */
    assert_int_equal(mp_tensor_nbytes(t), 8192);
    assert_int_equal(mp_tensor_dtype(t), MP_UINT8);
    assert_int_equal(mp_tensor_byte_offset(u), 4096);
    assert_true(mp_tensor_same_storage(t, u)); /* one file, one storage */
    assert_true(mp_tensor_is_shared(t));
    assert_string_equal(mp_tensor_sharing_strategy(t), "file_descriptor");
    assert_int_equal(((int32_t *)mp_tensor_data(t))[0], 41);
    ((int32_t *)mp_tensor_data(u))[0] = 7; /* written through: no copy */
    assert_int_equal(mine[1024], 7);
    assert_mp_ok(mp_tensor_share_memory_(t)); /* already shared: a no-op */
    assert_int_equal(shared_copies(), copies);
    munmap(mine, 8192);
    mp_tensor_release(u);
    mp_tensor_release(t);
}

static void test_sealed_memfd(void **state)
{
    (void)state;
    int fd = memfd_create("adopt", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 4096), 0);
    expect_einval(fd, 0, 4096, "F_SEAL_SHRINK");
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    mp_tensor *t;
    assert_mp_ok(mp_tensor_adopt_fd(fd, 0, 4096, &t));
    close(fd);
    mp_tensor_release(t);
}

static void test_refuses(void **state)
{
    (void)state;
    int p[2], fd;
    expect_einval(-1, 0, 1, "not an open file descriptor");
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    close(p[1]);
    expect_einval(p[1], 0, 1, "not an open file descriptor"); /* just closed */
    expect_einval(p[0], 0, 1, "a pipe");
    close(p[0]);
    fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC); /* a file on disk */
    assert_true(fd >= 0);
    expect_einval(fd, 0, 1, "not shared memory");
    close(fd);
    fd = torch_like(4096, false); /* still named: anyone may truncate it */
    expect_einval(fd, 0, 1, "shm_unlink");
    char name[64];
    snprintf(name, sizeof name, "/adopt-test-%d-4096", (int)getpid());
    shm_unlink(name);
    expect_einval(fd, 0, 4097, "fewer than"); /* wrong size */
    expect_einval(fd, 4096, 1, "fewer than");
    mp_tensor *t = NULL;
    assert_mp_err(mp_tensor_adopt_fd(fd, UINT64_MAX, 2, &t), MP_EOVERFLOW);
    assert_null(t);
    assert_mp_err(mp_tensor_adopt_fd(fd, 0, 1, NULL), MP_EINVAL);
    close(fd);
}

/* /proc/self/fd unreadable (a sandbox, an injected failure): an unlinked
 * POSIX segment cannot be told from a disk file, so it is refused, and the
 * sentence says the path was not readable instead of naming "". */
static void test_path_unknown(void **state)
{
    (void)state;
    int fd = torch_like(4096, true);
    assert_mp_ok(mp__sys_fault("readlink", EACCES, 0, 100));
    expect_einval(fd, 0, 4096, "path unknown: readlink /proc/self/fd/");
    mp__sys_fault_reset();
    mp_tensor *t;
    assert_mp_ok(mp_tensor_adopt_fd(fd, 0, 4096, &t)); /* readable again: adopted */
    mp_tensor_release(t);
    close(fd);
}

/* The adopted memory crosses a queue as an fd: the receiver sees writes
 * through the foreign owner's mapping, and a producer that adopted, sent and
 * exited leaves its tensor alive in the queue. */
static void test_travels_and_outlives_producer(void **state)
{
    (void)state;
    mp_queue *q;
    mp_tensor *t, *got;
    int status;
    assert_mp_ok(mp_queue_create(0, &q));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = torch_like(4096, true);
        int rc = mp_tensor_adopt_fd(fd, 0, 4096, &t);
        close(fd);
        if (rc == 0) {
            memcpy(mp_tensor_data(t), "mproc", 6);
            rc = mp_queue_put_tensor(q, t, 10);
            mp_tensor_release(t);
        }
        _exit(rc == 0 ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_mp_ok(mp_queue_get_tensor(q, &got, 10)); /* its producer is gone */
    assert_string_equal((char *)mp_tensor_data(got), "mproc");
    /* and the other way: our adopted tensor, written by a child */
    int fd = torch_like(4096, true);
    int32_t *mine = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(mine != MAP_FAILED);
    assert_mp_ok(mp_tensor_adopt_fd(fd, 0, 4096, &t));
    close(fd);
    assert_mp_ok(mp_queue_put_tensor(q, t, 10));
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        mp_tensor *c;
        if (mp_queue_get_tensor(q, &c, 10) != 0)
            _exit(1);
        ((int32_t *)mp_tensor_data(c))[3] = 99;
        mp_tensor_release(c);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(mine[3], 99);
    munmap(mine, 4096);
    mp_tensor_release(t);
    mp_tensor_release(got);
    mp_queue_release(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_adopts_without_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sealed_memfd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_path_unknown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_travels_and_outlives_producer, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
