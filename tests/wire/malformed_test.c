/* The decoder trusts nothing: each malformed frame, crafted by hand and sent
 * as a raw record on a socketpair, fails with MP_EPROTO and a sentence
 * naming what is wrong, and every fd that arrived with it is closed. */
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipc/kinds.h"
#include "mp_test.h"
#include "wire/frame.h"

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

/* A frame of one 4x4 float32 tensor "t" over storage 0 (fd 0). */
typedef struct raw {
    mp__frame_header h;
    mp__frame_storage s;
    mp__frame_attach a;
    char name[8];
    mp__frame_tensor t;
    int64_t shape[2];
    int64_t strides[2];
} raw;

static raw good_frame(uint64_t storage_size)
{
    raw r;
    memset(&r, 0, sizeof r);
    r.h.magic = MP__FRAME_MAGIC;
    r.h.version = MP__FRAME_VERSION;
    r.h.nfds = 1;
    r.h.nstorages = 1;
    r.h.nattach = 1;
    r.h.body_len = sizeof r - sizeof r.h;
    r.s.strategy = MP__STRATEGY_FD;
    r.s.ref = 0;
    r.s.size = storage_size;
    r.a.kind = MP_ATTACH_TENSOR;
    r.a.name_len = 1;
    r.a.body_len = sizeof r.t + 32;
    r.name[0] = 't';
    r.t.dtype = MP_FLOAT32;
    r.t.ndim = 2;
    r.shape[0] = r.shape[1] = 4;
    r.strides[0] = 4;
    r.strides[1] = 1;
    return r;
}

static int make_memfd(size_t size, bool seal)
{
    int fd = memfd_create("malformed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    if (seal)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    return fd;
}

/* Sends len bytes of frame with nfds fresh fds (kind: 0 sealed 64-byte memfd,
 * 1 unsealed memfd, 2 a pipe), receives, and checks the error and fds. */
static void expect_eproto(const void *frame, size_t len, int nfds, int fdkind,
                          const char *needle)
{
    int sv[2], fds[4] = {-1, -1, -1, -1}, p[2] = {-1, -1}, before;
    mp_msg *m = NULL;
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    before = mp_test_count_fds();
    for (int i = 0; i < nfds; i++) {
        if (fdkind == 2) {
            assert_int_equal(pipe2(p, O_CLOEXEC), 0);
            fds[i] = p[0];
            close(p[1]);
        } else {
            fds[i] = make_memfd(64, fdkind == 0);
        }
    }
    assert_mp_ok(mp__send_record(sv[0], frame, len, fds, nfds, 1));
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    assert_mp_err(mp__wire_recv(sv[1], &m, 1), MP_EPROTO);
    assert_null(m);
    if (!strstr(mp_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", mp_last_error(), needle);
    assert_int_equal(mp_test_count_fds(), before);
    /* the record was consumed: the socket is empty and still works */
    assert_mp_err(mp__wire_recv(sv[1], &m, 0), MP_ETIMEDOUT);
    close(sv[0]);
    close(sv[1]);
}

static void test_header(void **state)
{
    raw r = good_frame(64);
    (void)state;
    expect_eproto(&r, 20, 1, 0, "truncated");
    r.h.magic = 0x12345678;
    expect_eproto(&r, sizeof r, 1, 0, "magic");
    r = good_frame(64);
    r.h.version = 9;
    expect_eproto(&r, sizeof r, 1, 0, "version 9");
    r = good_frame(64);
    r.h.flags = 0x80;
    expect_eproto(&r, sizeof r, 1, 0, "flags");
    r = good_frame(64);
    expect_eproto(&r, sizeof r, 0, 0, "announces 1 fds but 0 arrived");
    expect_eproto(&r, sizeof r, 2, 0, "announces 1 fds but 2 arrived");
    expect_eproto(&r, sizeof r - 8, 1, 0, "body");
    r.h.flags = MP__FRAME_SPILLED;
    expect_eproto(&r, sizeof r, 1, 0, "spilled");
    r = good_frame(64);
    r.h.nattach = 1000;
    expect_eproto(&r, sizeof r, 1, 0, "attachments cannot fit");
    r = good_frame(64);
    r.h.flags = MP__FRAME_NUDGE;   /* a wake-up record with a body and an fd */
    expect_eproto(&r, sizeof r, 1, 0, "NUDGE");
}

static void test_fds(void **state)
{
    raw r = good_frame(64);
    (void)state;
    expect_eproto(&r, sizeof r, 1, 1, "sealed");          /* unsealed memfd */
    expect_eproto(&r, sizeof r, 1, 2, "not a segment");   /* a pipe */
    r = good_frame(4096);                                  /* a 64-byte segment */
    r.shape[0] = 256;
    expect_eproto(&r, sizeof r, 1, 0, "not a segment of 4096 bytes");
    r = good_frame(64);
    r.s.ref = 3;
    expect_eproto(&r, sizeof r, 1, 0, "refers to fds [3, 4)");
    r = good_frame(64);
    r.h.nfds = 2;
    expect_eproto(&r, sizeof r, 2, 0, "fd 1 arrived but no storage");
    r = good_frame(64);
    r.s.strategy = 7;
    expect_eproto(&r, sizeof r, 1, 0, "unknown sharing strategy");
    r.s.strategy = MP__STRATEGY_FD;
    r.s.size = 0;
    expect_eproto(&r, sizeof r, 1, 0, "size 0");
    /* a pinned entry off an end's receive side: nothing to resolve it by
     * (nothing to give a count back to either) */
    r = good_frame(64);
    r.h.nfds = 0;
    r.s.strategy = MP__FRAME_STORAGE_PINNED;
    expect_eproto(&r, sizeof r, 0, 0, "names a pin, but it did not arrive");
}

static void test_tensor(void **state)
{
    raw r = good_frame(64);
    (void)state;
    r.t.dtype = 99;
    expect_eproto(&r, sizeof r, 1, 0, "unknown dtype 99");
    r = good_frame(64);
    r.t.ndim = 17;
    expect_eproto(&r, sizeof r, 1, 0, "ndim 17");
    r = good_frame(64);
    r.t.storage = 1;
    expect_eproto(&r, sizeof r, 1, 0, "storage index 1");
    r = good_frame(64);
    r.shape[0] = INT64_MAX / 2;
    expect_eproto(&r, sizeof r, 1, 0, "outside");
    r = good_frame(64);
    r.strides[0] = 5;                   /* last element at byte 76 of 64 */
    expect_eproto(&r, sizeof r, 1, 0, "outside its 64-byte storage");
    r = good_frame(64);
    r.strides[1] = -1;                  /* reaches below byte 0 */
    expect_eproto(&r, sizeof r, 1, 0, "outside");
    r = good_frame(64);
    r.t.byte_offset = UINT64_MAX - 3;
    expect_eproto(&r, sizeof r, 1, 0, "outside");
    r = good_frame(32);                 /* declared storage too small */
    expect_eproto(&r, sizeof r, 1, 0, "32-byte storage");
    r = good_frame(64);
    r.t.flags = 4;
    expect_eproto(&r, sizeof r, 1, 0, "tensor flags");
    r = good_frame(64);
    r.t.flags = MP__FRAME_TENSOR_GRAD;  /* grad record missing */
    expect_eproto(&r, sizeof r, 1, 0, "truncated");
}

static void test_attachments(void **state)
{
    raw r = good_frame(64);
    unsigned char big[sizeof r + 8];
    (void)state;
    assert_mp_ok(mp__objkinds_ensure("test")); /* what every receive path does first */
    r.a.kind = 77;
    expect_eproto(&r, sizeof r, 1, 0, "attachment 0 has object kind 77");
    expect_eproto(&r, sizeof r, 1, 0, "newer or another build of mproc");
    r = good_frame(64);
    r.name[0] = '\0';
    expect_eproto(&r, sizeof r, 1, 0, "NUL");
    r = good_frame(64);
    r.a.name_len = 300;
    expect_eproto(&r, sizeof r, 1, 0, "name of 300 bytes");
    r = good_frame(64);
    r.a.body_len = 1000;
    expect_eproto(&r, sizeof r, 1, 0, "truncated");
    r = good_frame(64);
    r.a.body_len += 8;
    r.h.body_len += 8;
    memcpy(big, &r, sizeof r);
    memset(big + sizeof r, 0, 8);
    expect_eproto(big, sizeof big, 1, 0, "unexplained bytes");
    r = good_frame(64);
    r.h.body_len += 8;
    memcpy(big, &r, sizeof r);
    expect_eproto(big, sizeof big, 1, 0, "trailing bytes");
    r = good_frame(64);
    r.h.payload_len = 4096;
    expect_eproto(&r, sizeof r, 1, 0, "payload");
    r = good_frame(64);
    r.a.kind = MP_ATTACH_QUEUE;   /* a queue record needs 3 sockets */
    expect_eproto(&r, sizeof r, 1, 0, "refers to fds");
}

/* A well-formed frame built the same way is accepted (the tests above
 * fail for the reason they name, not because the base frame is wrong). */
static void test_good_frame(void **state)
{
    raw r = good_frame(64);
    int sv[2], fd = make_memfd(64, true);
    mp_msg *m = NULL;
    mp_tensor *t = NULL;
    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp__send_record(sv[0], &r, sizeof r, &fd, 1, 1));
    close(fd);
    assert_mp_ok(mp__wire_recv(sv[1], &m, 1));
    assert_mp_ok(mp_msg_find_tensor(m, "t", &t));
    assert_int_equal(mp_tensor_numel(t), 16);
    mp_tensor_release(t);
    mp_msg_destroy(m);
    close(sv[0]);
    close(sv[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_good_frame, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attachments, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
