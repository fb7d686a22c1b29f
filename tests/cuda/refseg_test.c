/* The shared reference-count segment of CUDA IPC (no GPU needed): slots,
 * references, reuse, dead consumers, producer death, hostile segments. */
#include "mp_test.h"
#include "cuda/refseg.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int teardown(void **state)
{
    mp__sys_fault_reset();
    assert_int_equal(mp__refseg_open_count(), 0);
    return mp_test_teardown(state);
}

static uint32_t self(void) { return (uint32_t)getpid(); }

static void test_create_and_identity(void **state)
{
    mp__refseg *seg = NULL;
    assert_mp_err(mp__refseg_create(0, 16, &seg), MP_EINVAL);
    assert_mp_err(mp__refseg_create(4, 0, &seg), MP_EINVAL);
    assert_mp_err(mp__refseg_create(MP__REFSEG_MAX_SLOTS + 1, 16, &seg), MP_EINVAL);
    assert_mp_ok(mp__refseg_create(4, 16, &seg));
    assert_true(mp__refseg_fd(seg) >= 0);
    assert_true(mp__refseg_is_owner(seg));
    assert_int_equal(mp__refseg_producer_pid(seg), self());
    assert_int_equal(mp__refseg_nslots(seg), 4);
    assert_true(mp__refseg_producer_alive(seg));
    assert_mp_ok(mp__refseg_check_producer(seg, "t"));
    assert_int_equal(mp__refseg_open_count(), 1);
    /* Sealed: nobody can shrink it under a reader. */
    assert_int_equal(ftruncate(mp__refseg_fd(seg), 0), -1);
    /* Opening our own fd again finds the same object. */
    mp__refseg *again = NULL;
    assert_mp_ok(mp__refseg_open(dup(mp__refseg_fd(seg)), &again));
    assert_ptr_equal(again, seg);
    assert_int_equal(mp__refseg_open_count(), 1);
    mp__refseg_release(again);
    mp__refseg_release(seg);
    mp__refseg_release(NULL);
}

static void test_slots_and_reuse(void **state)
{
    mp__refseg *seg = NULL;
    uint32_t slot[3], gen[3], s, g;
    assert_mp_ok(mp__refseg_create(3, 16, &seg));
    for (int i = 0; i < 3; i++)
        assert_mp_ok(mp__refseg_slot_alloc(seg, &slot[i], &gen[i]));
    assert_int_equal(mp__refseg_slots_in_use(seg), 3);
    assert_mp_err(mp__refseg_slot_alloc(seg, &s, &g), MP_ENOSPC);
    assert_non_null(strstr(mp_last_error(), "release received tensors"));
    /* A freed slot is reused with its next generation. */
    mp__refseg_slot_free(seg, slot[1]);
    mp__refseg_slot_free(seg, slot[1]); /* twice: harmless */
    assert_int_equal(mp__refseg_slots_in_use(seg), 2);
    assert_mp_ok(mp__refseg_slot_alloc(seg, &s, &g));
    assert_int_equal(s, slot[1]);
    assert_int_equal(g, gen[1] + 1);
    mp__refseg_release(seg);
}

static void test_references(void **state)
{
    mp__refseg *seg = NULL;
    uint32_t slot, gen, r1, r2, r3;
    uint64_t w1, w2, w3, adopted;
    assert_mp_ok(mp__refseg_create(4, 8, &seg));
    assert_mp_ok(mp__refseg_slot_alloc(seg, &slot, &gen));
    assert_int_equal(mp__refseg_count(seg, slot, gen), 0);
    assert_mp_ok(mp__refseg_ref_add(seg, slot, gen, self(), &r1, &w1));
    assert_mp_ok(mp__refseg_ref_add(seg, slot, gen, self(), &r2, &w2));
    assert_int_not_equal(r1, r2);
    assert_int_equal(mp__refword_pid(w1), self());
    assert_int_equal(mp__refword_slot(w1), slot);
    assert_int_equal(mp__refseg_count(seg, slot, gen), 2);
    /* A stale generation does not count. */
    assert_int_equal(mp__refseg_count(seg, slot, gen + 1), 0);

    /* Adoption hands a word over exactly once. */
    assert_mp_ok(mp__refseg_ref_adopt(seg, r1, w1, self(), &adopted));
    assert_int_equal(adopted, w1); /* same pid: same word */
    assert_mp_err(mp__refseg_ref_adopt(seg, r1, mp__refword(self() + 1, slot, gen), self(),
                                       &adopted), MP_ECLOSED);
    assert_non_null(strstr(mp_last_error(), "exited before it was received"));
    assert_mp_err(mp__refseg_ref_adopt(seg, 999, w1, self(), &adopted), MP_EPROTO);

    assert_mp_ok(mp__refseg_ref_drop(seg, r1, adopted));
    assert_mp_err(mp__refseg_ref_drop(seg, r1, adopted), MP_ESTATE);
    assert_int_equal(mp__refseg_count(seg, slot, gen), 1);
    assert_mp_ok(mp__refseg_ref_drop(seg, r2, w2));
    assert_int_equal(mp__refseg_count(seg, slot, gen), 0);

    /* Dropped words are reused; a full table is a clear error. */
    uint32_t refs[8];
    uint64_t words[8];
    for (int i = 0; i < 8; i++)
        assert_mp_ok(mp__refseg_ref_add(seg, slot, gen, self(), &refs[i], &words[i]));
    assert_mp_err(mp__refseg_ref_add(seg, slot, gen, self(), &r3, &w3), MP_ENOSPC);
    assert_mp_err(mp__refseg_ref_add(seg, slot, gen, 0, &r3, &w3), MP_EINVAL);
    assert_mp_err(mp__refseg_ref_add(seg, 77, gen, self(), &r3, &w3), MP_EINVAL);
    assert_int_equal(mp__refseg_count(seg, slot, gen), 8);
    for (int i = 0; i < 8; i++)
        assert_mp_ok(mp__refseg_ref_drop(seg, refs[i], words[i]));
    mp__refseg_release(seg);
}

/* A consumer process takes references and dies without dropping them: the
 * producer's scan reclaims them (zombie or reaped). */
static void test_dead_consumer(void **state)
{
    mp__refseg *seg = NULL;
    uint32_t slot, gen, r;
    uint64_t w;
    size_t reclaimed = 99;
    assert_mp_ok(mp__refseg_create(4, 64, &seg));
    assert_mp_ok(mp__refseg_slot_alloc(seg, &slot, &gen));
    assert_mp_ok(mp__refseg_ref_add(seg, slot, gen, self(), &r, &w));
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint32_t cr;
        uint64_t cw;
        for (int i = 0; i < 5; i++)
            if (mp__refseg_ref_add(seg, slot, gen, (uint32_t)getpid(), &cr, &cw) < 0)
                _exit(1);
        char c = 1;
        _exit(write(go[1], &c, 1) == 1 ? 0 : 2);
    }
    close(go[1]);
    char c;
    assert_int_equal(read(go[0], &c, 1), 1);
    close(go[0]);
    /* Wait for the child to be a zombie: its words already count for nothing. */
    for (int i = 0; i < 2000; i++) {
        siginfo_t si = {0};
        if (waitid(P_PID, pid, &si, WEXITED | WNOWAIT) == 0 && si.si_pid == pid)
            break;
        usleep(1000);
    }
    assert_int_equal(mp__refseg_count(seg, slot, gen), 1);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_mp_ok(mp__refseg_scan(seg, &reclaimed));
    assert_int_equal(reclaimed, 5);
    assert_int_equal(mp__refseg_tally(seg, slot), 1);
    assert_int_equal(mp__refseg_referenced_slots(seg), 1);
    assert_mp_ok(mp__refseg_ref_drop(seg, r, w));
    assert_mp_ok(mp__refseg_scan(seg, &reclaimed));
    assert_int_equal(reclaimed, 0);
    assert_int_equal(mp__refseg_tally(seg, slot), 0);
    assert_int_equal(mp__refseg_referenced_slots(seg), 0);
    mp__refseg_release(seg);
}

/* A producer in another process: it creates its segment, sends the fd, and
 * on "x" marks it exited and exits (on anything else exits unmarked, and
 * without a word stays until killed). Returns its pid; *seg is our mapping. */
static pid_t start_producer(int *sock, mp__refseg **seg)
{
    int sv[2], fd = -1, nfds = 0;
    size_t len;
    char buf[8];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        mp__refseg *own = NULL;
        close(sv[0]);
        if (mp__refseg_create(4, 16, &own) < 0)
            _exit(1);
        int f = mp__refseg_fd(own);
        if (mp__send_record(sv[1], "s", 1, &f, 1, -1) < 0 || read(sv[1], buf, 1) != 1)
            _exit(2);
        if (buf[0] == 'x')
            mp__refseg_mark_exited(own);
        _exit(0);
    }
    close(sv[1]);
    assert_mp_ok(mp__recv_record(sv[0], buf, sizeof buf, &len, &fd, 1, &nfds, -1));
    assert_int_equal(nfds, 1);
    assert_mp_ok(mp__refseg_open(fd, seg));
    *sock = sv[0];
    return pid;
}

/* Once the producer has exited, the consumer's next use of the count is a
 * clear MP_ECLOSED. */
static void test_producer_death(void **state)
{
    mp__refseg *seg = NULL;
    int sock, status;
    pid_t pid = start_producer(&sock, &seg);
    assert_false(mp__refseg_is_owner(seg));
    assert_int_equal(mp__refseg_producer_pid(seg), (uint32_t)pid);
    assert_true(mp__refseg_producer_alive(seg));
    uint32_t s, g;
    assert_mp_err(mp__refseg_slot_alloc(seg, &s, &g), MP_ESTATE);
    assert_mp_err(mp__refseg_scan(seg, NULL), MP_ESTATE);
    /* Clean exit: the mark alone is enough, even before the pid is gone. */
    assert_int_equal(write(sock, "x", 1), 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_false(mp__refseg_producer_alive(seg));
    assert_mp_err(mp__refseg_check_producer(seg, "mp_tensor_cuda_share_count"), MP_ECLOSED);
    assert_non_null(strstr(mp_last_error(), "has exited"));
    assert_non_null(strstr(mp_last_error(), "mp_tensor_cuda_share_count"));
    mp__refseg_release(seg);
    close(sock);
}

/* Killed without a chance to mark anything: its pid is gone. */
static void test_killed_producer(void **state)
{
    mp__refseg *seg = NULL;
    int sock;
    pid_t pid = start_producer(&sock, &seg);
    assert_true(mp__refseg_producer_alive(seg));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_mp_err(mp__refseg_check_producer(seg, "t"), MP_ECLOSED);
    mp__refseg_release(seg);
    close(sock);
}

/* What a hostile or confused peer might send instead of a segment. */
static void test_hostile_fds(void **state)
{
    mp__refseg *seg = NULL;
    assert_mp_err(mp__refseg_open(-1, &seg), MP_EINVAL);
    /* Not sealed. */
    int fd = memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_mp_err(mp__refseg_open(fd, &seg), MP_EPROTO);
    /* Sealed, but garbage inside. */
    fd = memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd, 8192), 0);
    assert_int_equal(write(fd, "garbage!", 8), 8);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    assert_mp_err(mp__refseg_open(fd, &seg), MP_EPROTO);
    /* Sealed and too small. */
    fd = memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_int_equal(ftruncate(fd, 100), 0);
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    assert_mp_err(mp__refseg_open(fd, &seg), MP_EPROTO);
    /* A pipe. */
    int p[2];
    assert_int_equal(pipe(p), 0);
    close(p[1]);
    assert_mp_err(mp__refseg_open(p[0], &seg), MP_EPROTO);
    assert_null(seg);
}

static void test_faults(void **state)
{
    mp__refseg *seg = NULL;
    assert_mp_ok(mp__sys_fault("memfd_create", EMFILE, 0, 1));
    assert_mp_err(mp__refseg_create(4, 16, &seg), MP_EMFILE);
    assert_mp_ok(mp__sys_fault("posix_fallocate", ENOSPC, 0, 1));
    assert_mp_err(mp__refseg_create(4, 16, &seg), MP_ENOSPC);
    assert_mp_ok(mp__sys_fault("mmap", ENOMEM, 0, 1));
    assert_mp_err(mp__refseg_create(4, 16, &seg), MP_ENOMEM);
    assert_null(seg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_and_identity, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_slots_and_reuse, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_references, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_consumer, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_producer_death, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_producer, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostile_fds, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_faults, mp_test_setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
