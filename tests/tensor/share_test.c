/* The storage suite, run once under each sharing strategy: tensors created
 * in or moved to shared memory, views that follow the move, grads, forked
 * children writing into shared tensors, and segments handed to another
 * process over a socket (with the sender gone before the receiver opens). */
#include "mp_test.h"
#include "tensor/tensor_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *strategy;

static int group_fd(void **state)
{
    strategy = "file_descriptor";
    return mp_set_sharing_strategy(strategy);
}
static int group_fs(void **state)
{
    strategy = "file_system";
    return mp_set_sharing_strategy(strategy);
}
static int teardown(void **state)
{
    assert_int_equal(mp__segment_count(), 0);
    return mp_test_teardown(state);
}

static bool fs(void)
{
    return strcmp(strategy, "file_system") == 0;
}

static void fill(mp_tensor *t, int32_t v)
{
    int32_t *p = mp_tensor_data(t);
    for (int64_t i = 0; i < mp_tensor_numel(t); i++)
        p[i] = v + (int32_t)i;
}

static bool holds(const mp_tensor *t, int32_t v)
{
    const int32_t *p = mp_tensor_data(t);
    for (int64_t i = 0; i < mp_tensor_numel(t); i++)
        if (p[i] != v + (int32_t)i)
            return false;
    return true;
}

static void wait_ok(pid_t pid)
{
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child failed: status 0x%x", status);
}

static void test_empty_shared(void **state)
{
    int64_t n = 1000;
    int base = mp_test_count_shm();
    uint64_t copies = mp_test_tensor_stats().shared_copies;
    mp_tensor *t;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &n, &t));
    assert_true(mp_tensor_is_shared(t));
    assert_string_equal(mp_tensor_sharing_strategy(t), strategy);
    assert_int_equal(mp_test_tensor_stats().shared_copies, copies); /* created there: no copy */
    for (int i = 0; i < n; i++)
        assert_int_equal(((int32_t *)mp_tensor_data(t))[i], 0);
    assert_int_equal(mp__segment_count(), 1);
    assert_int_equal(mp_test_count_shm(), base + (fs() ? 1 : 0));
    assert_mp_ok(mp_tensor_share_memory_(t)); /* no-op */
    assert_int_equal(mp_test_tensor_stats().shared_copies, copies);
    mp_tensor_release(t);
    assert_int_equal(mp__segment_count(), 0);
    assert_int_equal(mp_test_count_shm(), base);
}

static void test_share_moves_views_and_grad(void **state)
{
    int64_t shape[2] = {4, 5};
    mp_tensor *t, *v, *tr, *g;
    uint64_t copies = mp_test_tensor_stats().shared_copies;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 2, shape, &t));
    fill(t, 100);
    assert_mp_ok(mp_tensor_narrow(t, 0, 1, 2, &v));
    assert_mp_ok(mp_tensor_transpose(t, 0, 1, &tr));
    assert_mp_ok(mp_tensor_empty(MP_INT32, 2, shape, &g));
    fill(g, 7);
    assert_mp_ok(mp_tensor_set_grad(t, g));
    void *before = mp_tensor_data(v);
    assert_mp_ok(mp_tensor_share_memory_(t));
    assert_int_equal(mp_test_tensor_stats().shared_copies, copies + 2); /* t and its grad, once */
    assert_true(mp_tensor_is_shared(v) && mp_tensor_is_shared(tr) && mp_tensor_is_shared(g));
    assert_ptr_not_equal(mp_tensor_data(v), before);
    assert_ptr_equal(mp_tensor_data(v), (char *)mp_tensor_data(t) + 20);
    assert_true(holds(t, 100));
    assert_true(holds(g, 7));
    assert_int_equal(((int32_t *)mp_tensor_data(v))[0], 105);
    assert_int_equal(((int32_t *)mp_tensor_data(tr))[mp_tensor_strides(tr)[1]], 105);
    assert_mp_ok(mp_tensor_share_memory_(v)); /* already shared through t */
    assert_mp_ok(mp_tensor_share_memory_(t));
    assert_int_equal(mp_test_tensor_stats().shared_copies, copies + 2);
    assert_int_equal(mp__segment_count(), 2);
    mp_tensor_release(g);
    mp_tensor_release(t);
    mp_tensor_release(tr);
    assert_int_equal(mp__segment_count(), 1); /* v keeps t's storage */
    mp_tensor_release(v);
}

static int blob_released;
static void blob_release(void *data, void *ctx)
{
    blob_released++;
    free(data);
}

static void test_share_blob(void **state)
{
    int64_t n = 16;
    int32_t *buf = malloc(64);
    mp_tensor *t;
    for (int i = 0; i < 16; i++)
        buf[i] = 50 + i;
    blob_released = 0;
    assert_mp_ok(mp_tensor_from_blob(buf, 64, MP_INT32, 1, &n, NULL, blob_release, NULL, &t));
    assert_mp_ok(mp_tensor_share_memory_(t));
    assert_int_equal(blob_released, 1); /* the borrowed memory is handed back at once */
    assert_true(holds(t, 50));
    mp_tensor_release(t);
    assert_int_equal(blob_released, 1);
}

/* A forked child writes into a shared tensor: the parent sees it. It writes
 * into a private one: the parent does not. */
static void test_fork_child_writes(void **state)
{
    int64_t n = 4096;
    mp_tensor *shared, *priv;
    pid_t pid;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 1, &n, &shared));
    assert_mp_ok(mp_tensor_share_memory_(shared));
    assert_mp_ok(mp_tensor_empty(MP_INT32, 1, &n, &priv));
    fill(priv, 1);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        fill(shared, 1000);
        fill(priv, 2000);
        /* a child dropping its inherited references must not unlink (FS) */
        mp_tensor_release(shared);
        mp_tensor_release(priv);
        _exit(0);
    }
    wait_ok(pid);
    assert_true(holds(shared, 1000));
    assert_true(holds(priv, 1));
    assert_false(mp_tensor_is_shared(priv));
    if (fs()) /* the name is still there for later receivers */
        assert_int_equal(mp_test_count_shm(), 1 + ((mp_test_snapshot *)*state)->shm);
    mp_tensor_release(shared);
    mp_tensor_release(priv);
}

/* Exports seg and sends its handle (and fd) as one record. */
static int send_segment(int sock, mp__segment *seg)
{
    mp__segment_handle h;
    int rc = mp__segment_export(seg, &h);
    return rc ? rc : mp__send_record(sock, &h, sizeof h, &h.fd, h.fd >= 0 ? 1 : 0, -1);
}

/* Receives one record of send_segment and opens the segment it names;
 * no cmocka asserts, so that a forked child's threads may call it. */
static int recv_segment(int sock, mp__segment **out)
{
    mp__segment_handle h;
    size_t len;
    int fds[1], nfds = 0;
    int rc = mp__recv_record(sock, &h, sizeof h, &len, fds, 1, &nfds, mp__deadline(30));
    if (rc < 0)
        return rc;
    h.fd = nfds ? fds[0] : -1;
    if (len != sizeof h) {
        mp__close(h.fd);
        return mp__error(MP_EPROTO, "share_test: a record of %zu bytes, not a handle", len);
    }
    return mp__segment_open(&h, out);
}

/* Child: creates a shared tensor, sends its segment, then either exits at
 * once (the message alone keeps the segment alive) or waits for the
 * parent's write and checks it. */
static int child_send(int sock, bool exit_early)
{
    int64_t n = 1024;
    mp_tensor *t;
    char ack[1];
    size_t len;
    int nfds, fds[1];
    if (mp_tensor_empty_shared(MP_INT32, 1, &n, &t) != 0)
        return 10;
    fill(t, 7);
    if (send_segment(sock, mp__storage_segment(mp__tensor_storage(t))) != 0)
        return 12;
    if (exit_early) {
        mp_tensor_release(t);
        return 0;
    }
    if (mp__recv_record(sock, ack, sizeof ack, &len, fds, 1, &nfds, mp__deadline(30)) != 0)
        return 13;
    if (!holds(t, 9))
        return 14;
    mp_tensor_release(t);
    return 0;
}

static mp_tensor *receive_tensor(int sock)
{
    mp__segment *seg;
    mp__storage *st;
    mp_tensor *t;
    int64_t n = 1024, stride = 1;
    assert_mp_ok(recv_segment(sock, &seg));
    assert_mp_ok(mp__storage_from_segment(seg, &st));
    mp__segment_release(seg);
    assert_mp_ok(mp__tensor_make("test", st, MP_INT32, 1, &n, &stride, 0, &t));
    mp__storage_release(st);
    return t;
}

/* Forks a child running child_send; returns its pid, *sock our end. */
static pid_t fork_sender(bool exit_early, int *sock)
{
    int sv[2];
    pid_t pid;
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        mp__close(sv[0]);
        _exit(child_send(sv[1], exit_early));
    }
    mp__close(sv[1]);
    *sock = sv[0];
    return pid;
}

static void test_send_segment_to_other_process(void **state)
{
    int sv[1];
    pid_t pid = fork_sender(false, &sv[0]);
    mp_tensor *t = receive_tensor(sv[0]);
    assert_true(mp_tensor_is_shared(t));
    assert_string_equal(mp_tensor_sharing_strategy(t), strategy);
    assert_true(holds(t, 7));
    fill(t, 9);
    assert_mp_ok(mp__send_record(sv[0], "k", 1, NULL, 0, -1));
    wait_ok(pid);
    assert_true(holds(t, 9));
    mp_tensor_release(t);
    mp__close(sv[0]);
}

/* The sender releases everything and exits before the receiver opens: the
 * message keeps the segment alive (fd in flight, or the FS in-flight ref),
 * and the receiver's release then frees it for good. */
static void test_segment_outlives_sender(void **state)
{
    int sock;
    mp_tensor *t;
    wait_ok(fork_sender(true, &sock));
    t = receive_tensor(sock);
    assert_true(holds(t, 7));
    mp_tensor_release(t);
    mp__close(sock);
}

/* Receiving one segment twice maps it once and wraps it in one storage. */
static void test_one_storage_per_segment(void **state)
{
    int64_t n = 64;
    mp_tensor *t;
    mp__segment_handle h1, h2;
    mp__segment *s1, *s2, *seg;
    mp__storage *a, *b;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &n, &t));
    seg = mp__storage_segment(mp__tensor_storage(t));
    assert_mp_ok(mp__segment_export(seg, &h1));
    assert_mp_ok(mp__segment_export(seg, &h2));
    if (h1.fd >= 0) {
        h1.fd = dup(h1.fd);
        h2.fd = dup(h2.fd);
    }
    assert_mp_ok(mp__segment_open(&h1, &s1));
    assert_mp_ok(mp__segment_open(&h2, &s2));
    assert_ptr_equal(s1, seg);
    assert_ptr_equal(s2, seg);
    assert_int_equal(mp__segment_count(), 1);
    assert_mp_ok(mp__storage_from_segment(s1, &a));
    assert_mp_ok(mp__storage_from_segment(s2, &b));
    assert_ptr_equal(a, mp__tensor_storage(t));
    assert_ptr_equal(b, a);
    mp__storage_release(a);
    mp__storage_release(b);
    mp__segment_release(s1);
    mp__segment_release(s2);
    mp_tensor_release(t);
}

/* Parent side of the inherited cases: sends seg n times to the child pid
 * (sock), which must exit 0; then (FS) the parent's header reference is
 * the only one left. */
static void send_to_child(int sock, mp__segment *seg, int n, pid_t pid)
{
    for (int i = 0; i < n; i++)
        assert_mp_ok(send_segment(sock, seg));
    wait_ok(pid);
    if (fs())
        assert_int_equal(
            ((mp__fs_header *)((char *)mp__segment_data(seg) - MP__FS_HEADER_SIZE))->refcount, 1);
}

/* Makes a shared tensor *t (1024 int32) and a socket pair sv, then forks:
 * returns the child's pid, 0 in the child, which inherits both. */
static pid_t fork_holding(mp_tensor **t, int sv[2])
{
    int64_t n = 1024;
    pid_t pid;
    assert_mp_ok(mp_tensor_empty_shared(MP_INT32, 1, &n, t));
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    pid = fork();
    assert_true(pid >= 0);
    return pid;
}

/* A forked child receives a segment it already inherited: the cache hit
 * reuses the inherited mapping. FS: through an alias that adopts the
 * message's reference and gives it back when the child releases what it
 * received, whether or not it ever releases its copy of the parent's handle
 * (a worker usually does not): the parent's reference is then the only one
 * left, and the parent's release unlinks the name. */
static void child_receives_inherited(bool child_releases_parents)
{
    int sv[2];
    mp_tensor *t;
    pid_t pid = fork_holding(&t, sv);
    mp__segment *seg = mp__storage_segment(mp__tensor_storage(t));
    if (pid == 0) {
        mp__close(sv[0]);
        /* two uses at once (the second folds into the first's alias),
         * then one more after both ended (a new alias) */
        mp_tensor *r = receive_tensor(sv[1]), *r2 = receive_tensor(sv[1]);
        int rc = mp_tensor_data(r) == mp_tensor_data(t) && holds(r, 3) &&
                         mp_tensor_data(r2) == mp_tensor_data(t) ? 0 : 1;
        mp_tensor_release(r2);
        mp_tensor_release(r);
        r = receive_tensor(sv[1]);
        rc |= mp_tensor_data(r) == mp_tensor_data(t) ? 0 : 2;
        fill(r, 4);
        mp_tensor_release(r);
        if (child_releases_parents)
            mp_tensor_release(t);
        _exit(rc);
    }
    mp__close(sv[1]);
    fill(t, 3); /* the child checks it after its first receive */
    send_to_child(sv[0], seg, 3, pid);
    assert_true(holds(t, 4));
    mp_tensor_release(t); /* the teardown checks that /dev/shm has no name left */
    mp__close(sv[0]);
}

static void test_child_receives_inherited(void **state)
{
    child_receives_inherited(true);
}

static void test_child_keeps_parents_handle(void **state)
{
    child_receives_inherited(false);
}

/* The same with four threads of the child receiving at once, so that
 * aliases are made, shared and given up concurrently (FS). */
enum { RECV_THREADS = 4, RECV_EACH = 200 };

typedef struct receiver {
    int sock;
    void *want; /* the inherited mapping's data */
    int bad;
} receiver;

static void *receive_many(void *arg)
{
    receiver *r = arg;
    for (int i = 0; i < RECV_EACH && !r->bad; i++) {
        mp__segment *s = NULL;
        if (recv_segment(r->sock, &s) < 0)
            r->bad = 1;
        else if (mp__segment_data(s) != r->want)
            r->bad = 2;
        mp__segment_release(s);
    }
    return NULL;
}

static void test_child_threads_receive_inherited(void **state)
{
    int sv[2];
    mp_tensor *t;
    pid_t pid = fork_holding(&t, sv);
    mp__segment *seg = mp__storage_segment(mp__tensor_storage(t));
    if (pid == 0) {
        pthread_t th[RECV_THREADS];
        receiver r[RECV_THREADS];
        int bad = 0;
        mp__close(sv[0]);
        for (int i = 0; i < RECV_THREADS; i++) {
            r[i] = (receiver){sv[1], mp__segment_data(seg), 0};
            if (pthread_create(&th[i], NULL, receive_many, &r[i]) != 0)
                _exit(9);
        }
        for (int i = 0; i < RECV_THREADS; i++) {
            pthread_join(th[i], NULL);
            bad |= r[i].bad;
        }
        _exit(bad);
    }
    mp__close(sv[1]);
    send_to_child(sv[0], seg, RECV_THREADS * RECV_EACH, pid);
    mp_tensor_release(t);
    mp__close(sv[0]);
}

#define T(f) cmocka_unit_test_setup_teardown(f, mp_test_setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_empty_shared),
        T(test_share_moves_views_and_grad),
        T(test_share_blob),
        T(test_fork_child_writes),
        T(test_send_segment_to_other_process),
        T(test_segment_outlives_sender),
        T(test_one_storage_per_segment),
        T(test_child_receives_inherited),
        T(test_child_keeps_parents_handle),
        T(test_child_threads_receive_inherited),
    };
    int failed = cmocka_run_group_tests_name("file_descriptor", tests, group_fd, NULL);
    failed += cmocka_run_group_tests_name("file_system", tests, group_fs, NULL);
    return failed;
}
