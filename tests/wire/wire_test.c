/* Messages and the wire: attachments, names, state_dicts, send/recv across
 * fork under both strategies, dedup of views, grads, spilled payloads, and
 * a received tensor sent back travelling as the same storage. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define MP_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MP_TEST_ASAN 1
#endif
#endif

#include "mp_test.h"
#include "ipc/kinds.h"
#include "tensor/tensor_internal.h"
#include "wire/frame.h"
#include "wire/objects.h"
#include "wire/wire.h"

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state)
{
    mp_set_sharing_strategy("file_descriptor");
    return mp_test_teardown(state);
}

static mp_tensor *iota(int64_t rows, int64_t cols, float base)
{
    int64_t shape[2] = {rows, cols};
    mp_tensor *t = NULL;
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 2, shape, &t));
    float *p = mp_tensor_data(t);
    for (int64_t i = 0; i < rows * cols; i++)
        p[i] = base + (float)i;
    return t;
}

/* Payload buffers of 4-256 KiB go back to a cache for the next payloads
 * (src/wire/msg.c): one freed is handed out again for a payload of up to
 * its size and at least half of it, not for a smaller one. Under
 * AddressSanitizer the cache is off (every free must be seen). */
static void test_payload_buffers(void **state)
{
    static char bytes[64 * 1024];
    mp_msg *m = NULL;
    (void)state;
    void *big = mp__msg_buf_get(sizeof bytes);
    assert_non_null(big);
    mp__msg_buf_put(big);
    /* kept, not freed: malloc cannot hand its memory out meanwhile */
    void *other = malloc(sizeof bytes);
    void *again = mp__msg_buf_get(sizeof bytes - 4096);
    void *small = mp__msg_buf_get(8 * 1024);
    assert_non_null(other);
    assert_non_null(again);
    assert_non_null(small);
    assert_ptr_not_equal(small, big); /* a small payload does not pin a big one */
#ifndef MP_TEST_ASAN
    assert_ptr_not_equal(other, big);
    assert_ptr_equal(again, big);
#endif
    free(other);
    mp__msg_buf_put(small);
    mp__msg_buf_put(again);
    /* a message's payload takes the same way */
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, bytes, sizeof bytes));
    const void *first = mp_msg_payload(m, NULL);
    mp_msg_destroy(m);
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, bytes, sizeof bytes));
#ifndef MP_TEST_ASAN
    assert_ptr_equal(mp_msg_payload(m, NULL), first);
#else
    (void)first;
#endif
    assert_memory_equal(mp_msg_payload(m, NULL), bytes, sizeof bytes);
    mp_msg_destroy(m);
}

static void test_msg_basics(void **state)
{
    mp_msg *m = NULL;
    mp_tensor *a = iota(2, 3, 0), *b = iota(4, 1, 10), *got = NULL;
    size_t len = 1;
    (void)state;
    assert_mp_err(mp_msg_create(NULL), MP_EINVAL);
    assert_mp_ok(mp_msg_create(&m));
    assert_null(mp_msg_payload(m, &len));
    assert_int_equal(len, 0);
    assert_mp_ok(mp_msg_set_payload(m, "hello", 5));
    assert_memory_equal(mp_msg_payload(m, &len), "hello", 5);
    assert_int_equal(len, 5);
    assert_mp_err(mp_msg_set_payload(m, NULL, 3), MP_EINVAL);
    assert_mp_ok(mp_msg_add_tensor(m, "a", a));
    assert_mp_ok(mp_msg_add_tensor(m, NULL, b));
    assert_mp_err(mp_msg_add_tensor(m, "x", NULL), MP_EINVAL);
    char longname[300];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_mp_err(mp_msg_add_tensor(m, longname, a), MP_EINVAL);
    assert_int_equal(mp_msg_count(m), 2);
    assert_int_equal(mp_msg_kind(m, 0), MP_ATTACH_TENSOR);
    assert_mp_err(mp_msg_kind(m, 2), MP_EINVAL);
    assert_string_equal(mp_msg_name(m, 0), "a");
    assert_null(mp_msg_name(m, 1));
    assert_int_equal(mp_msg_find(m, "a"), 0);
    assert_mp_err(mp_msg_find(m, "zz"), MP_ENOENT);
    assert_mp_ok(mp_msg_get_tensor(m, 1, &got));
    assert_ptr_equal(got, b);
    mp_tensor_release(got);
    assert_mp_err(mp_msg_get_tensor(m, 5, &got), MP_EINVAL);
    assert_null(got);
    assert_mp_ok(mp_msg_find_tensor(m, "a", &got));
    assert_ptr_equal(got, a);
    mp_tensor_release(got);
    void *obj = &obj;
    assert_mp_err(mp__msg_get_object(m, 0, &mp__queue_kind, &obj, "test"), MP_EINVAL);
    assert_null(obj);
    assert_non_null(strstr(mp_last_error(), "kind 'tensor', not 'queue'"));
    mp_msg_destroy(m);
    mp_msg_destroy(NULL);

    const char *names[] = {"w", "w"};
    mp_tensor *ts[] = {a, b};
    assert_mp_err(mp_msg_from_state_dict(2, names, ts, &m), MP_EINVAL);
    names[1] = "b";
    assert_mp_ok(mp_msg_from_state_dict(2, names, ts, &m));
    assert_mp_ok(mp_msg_find_tensor(m, "b", &got));
    assert_ptr_equal(got, b);
    mp_tensor_release(got);
    mp_msg_destroy(m);
    mp_tensor_release(a);
    mp_tensor_release(b);
}

/* Child: receives the message the parent built in send_views, checks it,
 * doubles every element of "w" in place, and sends "w" back. */
static int child_views(int sock)
{
    mp_msg *m = NULL, *back = NULL;
    mp_tensor *w = NULL, *wt = NULL, *row = NULL;
    size_t len;
    int bad = 0;
    if (mp__wire_recv(sock, &m, mp__deadline(10)) < 0)
        return 10;
    if (mp_msg_find_tensor(m, "w", &w) || mp_msg_find_tensor(m, "wt", &wt) ||
        mp_msg_find_tensor(m, "row", &row))
        return 11;
    bad |= !mp_tensor_same_storage(w, wt) << 0;
    bad |= !mp_tensor_same_storage(w, row) << 1;
    bad |= (mp_tensor_size(wt, 0) != 4 || mp_tensor_size(wt, 1) != 3) << 2;
    bad |= (((float *)mp_tensor_data(row))[0] != 4.0f) << 3;   /* row 1 of iota(3,4) */
    bad |= (!mp_tensor_grad(w) || ((float *)mp_tensor_data(mp_tensor_grad(w)))[5] != 105.0f) << 4;
    bad |= (strcmp(mp_msg_payload(m, &len), "payload") != 0) << 5;
    if (bad)
        return 20 + bad;
    float *p = mp_tensor_data(w);
    for (int i = 0; i < 12; i++)
        p[i] *= 2;
    if (mp_msg_create(&back) || mp_msg_add_tensor(back, "w", w) ||
        mp__wire_send(sock, back, mp__deadline(10)))
        return 12;
    mp_msg_destroy(back);
    mp_tensor_release(w);
    mp_tensor_release(wt);
    mp_tensor_release(row);
    mp_msg_destroy(m);
    return 0;
}

static void roundtrip(const char *strategy)
{
    int sv[2], status;
    mp_tensor *w = iota(3, 4, 0), *wt = NULL, *row = NULL, *g = iota(3, 4, 100), *back = NULL;
    mp_msg *m = NULL, *r = NULL;
    uint64_t copies;
    pid_t pid;
    assert_mp_ok(mp_set_sharing_strategy(strategy));
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp_tensor_transpose(w, 0, 1, &wt));
    assert_mp_ok(mp_tensor_select(w, 0, 1, &row));
    assert_mp_ok(mp_tensor_set_grad(w, g));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, "payload", 8));
    assert_mp_ok(mp_msg_add_tensor(m, "w", w));
    assert_mp_ok(mp_msg_add_tensor(m, "wt", wt));
    assert_mp_ok(mp_msg_add_tensor(m, "row", row));
    assert_false(mp_tensor_is_shared(w));
    pid = fork();
    if (pid == 0) {
        close(sv[0]);
        _exit(child_views(sv[1]));
    }
    close(sv[1]);
    copies = mp_test_tensor_stats().shared_copies;
    assert_mp_ok(mp__wire_send(sv[0], m, mp__deadline(10)));
    /* storage + grad: two copies, views of w cost nothing */
    assert_int_equal(mp_test_tensor_stats().shared_copies - copies, 2);
    assert_true(mp_tensor_is_shared(w));
    assert_mp_ok(mp__wire_recv(sv[0], &r, mp__deadline(10)));
    assert_mp_ok(mp_msg_find_tensor(r, "w", &back));
    /* the child's "w" came back as our storage: same memory, no new copy */
    assert_true(mp_tensor_same_storage(back, w));
    assert_int_equal(mp_test_tensor_stats().shared_copies - copies, 2);
    assert_true(((float *)mp_tensor_data(w))[11] == 22.0f);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(sv[0]);
    mp_msg_destroy(r);
    mp_msg_destroy(m);
    mp_tensor_release(back);
    mp_tensor_release(w);
    mp_tensor_release(wt);
    mp_tensor_release(row);
    mp_tensor_release(g);
}

static void test_roundtrip_fd(void **state) { (void)state; roundtrip("file_descriptor"); }
static void test_roundtrip_fs(void **state) { (void)state; roundtrip("file_system"); }

static void test_spill(void **state)
{
    size_t n = 3u << 20, len = 0;
    unsigned char *big = malloc(n);
    mp_msg *m = NULL, *r = NULL;
    mp_tensor *t = iota(2, 2, 1), *got = NULL;
    int sv[2];
    (void)state;
    for (size_t i = 0; i < n; i++)
        big[i] = (unsigned char)(i * 7 + 3);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, big, n));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    assert_mp_ok(mp__wire_send(sv[0], m, 0));
    assert_mp_ok(mp__wire_recv(sv[1], &r, 0));
    const unsigned char *p = mp_msg_payload(r, &len);
    assert_int_equal(len, n);
    assert_memory_equal(p, big, n);
    assert_mp_ok(mp_msg_find_tensor(r, "t", &got));
    assert_true(mp_tensor_same_storage(got, t));
    mp_msg_destroy(r);
    assert_mp_err(mp__wire_recv(sv[1], &r, 0), MP_ETIMEDOUT);
    assert_null(r);
    close(sv[0]);
    assert_mp_err(mp__wire_recv(sv[1], &r, 0), MP_ECLOSED);
    close(sv[1]);
    mp_tensor_release(got);
    mp_tensor_release(t);
    mp_msg_destroy(m);
    free(big);
}

/* A borrowed payload is sent as it is and never freed nor kept for reuse
 * by the message: replaced, reset or destroyed, the caller's memory stays
 * the caller's (a static buffer here: freeing it would abort). */
static void test_borrowed_payload(void **state)
{
    static unsigned char lent[128 * 1024];
    mp_msg *m = NULL, *r = NULL;
    size_t len = 0;
    int sv[2];
    (void)state;
    for (size_t i = 0; i < sizeof lent; i++)
        lent[i] = (unsigned char)(i * 13 + 1);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp_msg_create(&m));
    mp__msg_borrow_payload(m, lent, sizeof lent);
    assert_ptr_equal(mp_msg_payload(m, &len), lent);
    assert_mp_ok(mp__wire_send(sv[0], m, 0)); /* spilled: over 60 KiB */
    assert_mp_ok(mp__wire_recv(sv[1], &r, 0));
    assert_int_equal(mp_msg_count(r), 0);
    assert_memory_equal(mp_msg_payload(r, &len), lent, sizeof lent);
    assert_int_equal(len, sizeof lent);
    mp_msg_destroy(r);
    assert_mp_ok(mp_msg_set_payload(m, "own", 3)); /* replaces, frees nothing */
    mp__msg_borrow_payload(m, lent, 64 * 1024);
    mp__msg_reset(m);
    assert_null(mp_msg_payload(m, &len));
    mp__msg_borrow_payload(m, lent, 64 * 1024);
    mp_msg_destroy(m);
    void *next = mp__msg_buf_get(64 * 1024); /* the cache never got lent */
    assert_ptr_not_equal(next, lent);
    mp__msg_buf_put(next);
    close(sv[0]);
    close(sv[1]);
}

static void test_encode_decode(void **state)
{
    mp_msg *m = NULL, *r = NULL;
    mp_tensor *t = iota(5, 5, 0), *v = NULL, *got = NULL;
    void *buf = NULL;
    size_t len = 0;
    int fds[MP__WIRE_MAX_FDS], nfds = 0;
    (void)state;
    assert_mp_ok(mp_tensor_narrow(t, 1, 1, 3, &v));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    assert_mp_ok(mp_msg_add_tensor(m, "", v));
    assert_mp_ok(mp__wire_encode(m, &buf, &len, fds, &nfds));
    assert_int_equal(nfds, 1);
    fds[0] = dup(fds[0]);   /* encode lends the storage's own fd */
    assert_mp_ok(mp__wire_decode(buf, len, fds, nfds, &r));
    assert_int_equal(mp_msg_count(r), 2);
    assert_string_equal(mp_msg_name(r, 1), "");
    assert_mp_ok(mp_msg_get_tensor(r, 1, &got));
    assert_true(mp_tensor_same_storage(got, t));
    assert_int_equal(mp_tensor_byte_offset(got), 4);
    assert_int_equal(mp_tensor_strides(got)[0], 5);
    mp_tensor_release(got);
    mp_msg_destroy(r);
    mp_msg_destroy(m);
    free(buf);
    mp_tensor_release(v);
    mp_tensor_release(t);
}

/* A send that fails gives back what the export took: under file_system the
 * in-flight reference, so the segment is unlinked with its last user. */
static void test_send_fault_fs(void **state)
{
    mp_tensor *t = iota(8, 8, 0);
    mp_msg *m = NULL, *r = NULL;
    int sv[2];
    (void)state;
    assert_mp_ok(mp_set_sharing_strategy("file_system"));
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    assert_mp_ok(mp__sys_fault("sendmsg", EIO, 0, 1));
    assert_mp_err(mp__wire_send(sv[0], m, 1), MP_ESYS);
    mp__sys_fault_reset();
    assert_mp_err(mp__wire_recv(sv[1], &r, 0), MP_ETIMEDOUT);
    assert_true(mp_tensor_is_shared(t));
    mp_msg_destroy(m);
    mp_tensor_release(t);   /* last user: the teardown checks /dev/shm is clean */
    close(sv[0]);
    close(sv[1]);
}

/* A receive whose consuming recvmsg fails (after the peek worked) reports
 * the system error, not "another reader took it", closes the peeked fds,
 * and leaves the message queued for the next receive. */
static void test_consume_fault(void **state)
{
    mp_tensor *t = iota(4, 4, 3), *got = NULL;
    mp_msg *m = NULL, *r = NULL;
    int sv[2], before;
    (void)state;
    assert_mp_ok(mp_set_sharing_strategy("file_descriptor"));
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    assert_mp_ok(mp__wire_send(sv[0], m, 1));
    before = mp_test_count_fds();
    assert_mp_ok(mp__sys_fault("recvmsg", EIO, 1, 1));
    assert_mp_err(mp__wire_recv(sv[1], &r, 1), MP_ESYS);
    mp__sys_fault_reset();
    assert_null(r);
    assert_non_null(strstr(mp_last_error(), "consuming"));
    assert_int_equal(mp_test_count_fds(), before);
    assert_mp_ok(mp__wire_recv(sv[1], &r, 1));
    assert_mp_ok(mp_msg_find_tensor(r, "t", &got));
    assert_true(((float *)mp_tensor_data(got))[15] == 18.0f);
    mp_tensor_release(got);
    mp_msg_destroy(r);
    mp_msg_destroy(m);
    mp_tensor_release(t);
    close(sv[0]);
    close(sv[1]);
}

/* A receive whose mmap fails reports it and closes every fd it got. */
static void test_recv_fault(void **state)
{
    mp_tensor *got = NULL;
    mp_msg *r = NULL;
    int sv[2], before;
    pid_t pid;
    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    pid = fork();
    if (pid == 0) {   /* a segment this process has never mapped */
        mp_tensor *x = iota(4, 4, 7);
        mp_msg *xm = NULL;
        if (mp_msg_create(&xm) || mp_msg_add_tensor(xm, "x", x) || mp__wire_send(sv[0], xm, 5) ||
            mp__wire_send(sv[0], xm, 5))
            _exit(1);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    before = mp_test_count_fds();
    assert_mp_ok(mp__sys_fault("mmap", ENOMEM, 0, 1));
    assert_mp_err(mp__wire_recv(sv[1], &r, 1), MP_ENOMEM);
    mp__sys_fault_reset();
    assert_null(r);
    assert_int_equal(mp_test_count_fds(), before);
    /* the second copy of the message arrives fine */
    assert_mp_ok(mp__wire_recv(sv[1], &r, 1));
    assert_mp_ok(mp_msg_find_tensor(r, "x", &got));
    assert_true(((float *)mp_tensor_data(got))[15] == 22.0f);
    mp_tensor_release(got);
    mp_msg_destroy(r);
    close(sv[0]);
    close(sv[1]);
}

static void send_marker(int sock, unsigned flags)
{
    mp__frame_header h = {.magic = MP__FRAME_MAGIC, .version = MP__FRAME_VERSION,
                          .flags = (uint16_t)flags};
    assert_mp_ok(mp__send_record(sock, &h, sizeof h, NULL, 0, 1));
}

/* Readers drop a NUDGE wherever it is. A peeking reader leaves the CLOSED
 * marker queued; a one-call receive (with an mp__rx) takes it, uncounted. */
static void test_markers(void **state)
{
    mp__rx rx;
    mp_msg *m = NULL, *r = NULL;
    bool taken = true;
    size_t len = 0;
    int sv[2];
    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp__rx_init(&rx, "test"));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, "x", 1));
    for (int fast = 0; fast < 2; fast++) {
        mp__rx *which = fast ? &rx : NULL;
        send_marker(sv[0], MP__FRAME_NUDGE);
        assert_mp_ok(mp__wire_send_rx(sv[0], which, m, 1));
        send_marker(sv[0], MP__FRAME_NUDGE);
        send_marker(sv[0], MP__FRAME_CLOSED);
        assert_mp_ok(mp__rx_lock(&rx, 1, "test"));
        assert_mp_ok(mp__wire_recv_rx(sv[1], which, &r, 1, &taken));
        assert_true(taken);
        assert_memory_equal(mp_msg_payload(r, &len), "x", 1);
        mp_msg_destroy(r);
        assert_mp_err(mp__wire_recv_rx(sv[1], which, &r, 1, &taken), MP_ECLOSED);
        assert_false(taken);
        /* peeked: still there for the next reader; taken: gone */
        assert_mp_err(mp__wire_recv_rx(sv[1], which, &r, 0, &taken),
                      fast ? MP_ETIMEDOUT : MP_ECLOSED);
        if (!fast) /* empty the socket for the second round */
            assert_int_equal(recv(sv[1], &len, 1, 0), 1);
        mp__rx_unlock(&rx);
    }
    /* What poll-style calls use: a nudge at the head goes, nothing else. */
    send_marker(sv[0], MP__FRAME_NUDGE);
    assert_mp_ok(mp__wire_send(sv[0], m, 1));
    assert_mp_ok(mp__rx_lock(&rx, 1, "test"));
    assert_false(mp__wire_drop_nudge(sv[1], &rx)); /* a reader holds the lock */
    mp__rx_unlock(&rx);
    assert_true(mp__wire_drop_nudge(sv[1], &rx));
    assert_false(mp__wire_drop_nudge(sv[1], &rx)); /* a message is at the head */
    assert_mp_ok(mp__wire_recv(sv[1], &r, 1));
    assert_memory_equal(mp_msg_payload(r, &len), "x", 1);
    mp_msg_destroy(r);
    assert_false(mp__wire_drop_nudge(sv[1], &rx)); /* empty */
    close(sv[0]);
    close(sv[1]);
    pthread_mutex_destroy(&rx.lock);
    mp_msg_destroy(m);
}

/* A poll that finds the reader lock left by a dead reader takes it over,
 * made consistent, and gives it back: later readers are not locked out. */
static void test_drop_nudge_dead_reader(void **state)
{
    mp__rx *rx = mmap(NULL, sizeof *rx, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
    int sv[2], status;
    pid_t pid;
    (void)state;
    assert_true(rx != MAP_FAILED);
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp__rx_init(rx, "test"));
    if ((pid = fork()) == 0) {
        mp__rx_lock(rx, -1, "test");
        _exit(0); /* dies holding it */
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    send_marker(sv[0], MP__FRAME_NUDGE);
    assert_true(mp__wire_drop_nudge(sv[1], rx));
    assert_mp_ok(mp__rx_lock(rx, 1, "test"));
    mp__rx_unlock(rx);
    close(sv[0]);
    close(sv[1]);
    munmap(rx, sizeof *rx);
}

/* A frame whose second file_system storage entry is malformed gives back
 * the first entry's in-flight reference: only the bad entry's own (its name
 * never parsed) stays with the segment. */
static void test_decode_fault_drops_parsed_fs(void **state)
{
    mp_tensor *a = iota(4, 4, 0), *b = iota(4, 4, 1);
    mp_msg *m = NULL, *r = NULL;
    unsigned char *buf = NULL, *e;
    size_t len = 0;
    int fds[MP__WIRE_MAX_FDS], nfds = 0, base = mp_test_count_shm();
    mp__frame_storage st;
    char leftover[MP__SHM_NAME_MAX];
    (void)state;
    assert_mp_ok(mp_set_sharing_strategy("file_system"));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "a", a));
    assert_mp_ok(mp_msg_add_tensor(m, "b", b));
    assert_mp_ok(mp__wire_encode(m, (void **)&buf, &len, fds, &nfds));
    assert_int_equal(nfds, 0);
    /* the second entry: after the first one and its padded name */
    e = buf + sizeof(mp__frame_header);
    memcpy(&st, e, sizeof st);
    e += sizeof st + mp__pad8(st.ref);
    memcpy(&st, e, sizeof st);
    memcpy(leftover, e + sizeof st, st.ref);
    leftover[st.ref] = '\0';
    st.size = 0;
    memcpy(e, &st, sizeof st);
    assert_mp_err(mp__wire_decode(buf, len, fds, nfds, &r), MP_EPROTO);
    free(buf);
    mp_msg_destroy(m);
    mp_tensor_release(a);
    mp_tensor_release(b);
    /* a is gone with its last user; b still counts the lost message */
    assert_int_equal(mp_test_count_shm(), base + 1);
    assert_int_equal(shm_unlink(leftover), 0);
}

/* One rule for file_system names, the shm manager's: a name with a byte
 * outside [A-Za-z0-9_-] is refused by the decoder (the manager would not
 * track it), not mapped. */
static void test_decode_refuses_bad_fs_name(void **state)
{
    mp_tensor *a = iota(2, 2, 0);
    mp_msg *m = NULL, *r = NULL;
    unsigned char *buf = NULL, *e;
    size_t len = 0;
    int fds[MP__WIRE_MAX_FDS], nfds = 0, base = mp_test_count_shm();
    mp__frame_storage st;
    char name[MP__SHM_NAME_MAX];
    (void)state;
    assert_mp_ok(mp_set_sharing_strategy("file_system"));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "a", a));
    assert_mp_ok(mp__wire_encode(m, (void **)&buf, &len, fds, &nfds));
    e = buf + sizeof(mp__frame_header);
    memcpy(&st, e, sizeof st);
    memcpy(name, e + sizeof st, st.ref);
    name[st.ref] = '\0';
    e[sizeof st + st.ref - 1] = '.';
    assert_mp_err(mp__wire_decode(buf, len, fds, nfds, &r), MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "letters, digits"));
    free(buf);
    mp_msg_destroy(m);
    mp_tensor_release(a);
    /* the refused message's reference stays with the segment */
    assert_int_equal(mp_test_count_shm(), base + 1);
    assert_int_equal(shm_unlink(name), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_msg_basics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_payload_buffers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_fs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_borrowed_payload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_encode_decode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_send_fault_fs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_recv_fault, setup, teardown),
        cmocka_unit_test_setup_teardown(test_consume_fault, setup, teardown),
        cmocka_unit_test_setup_teardown(test_markers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decode_refuses_bad_fs_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decode_fault_drops_parsed_fs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drop_nudge_dead_reader, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
