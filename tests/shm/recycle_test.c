/* src/shm/recycle.c and src/tensor/recycle.c: the pool of reusable
 * segments. A released reusable tensor's memory comes back for the next
 * one of its size; anything that let it leave the process (a message, a
 * DLPack export, a fork while it was mapped) keeps it out of the pool, so a
 * reused segment is never one another process still maps. */
#include "mp_test.h"
#include "shm/recycle.h"
#include "shm/shm.h"
#include "tensor/recycle.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int setup(void **state)
{
    mp_set_sharing_strategy("file_descriptor");
    mp__segment_recycle_drain();
    return mp_test_setup(state);
}

static int teardown(void **state)
{
    mp__segment_recycle_drain();
    mp_set_sharing_strategy("file_descriptor");
    assert_int_equal(mp__segment_count(), 0);
    return mp_test_teardown(state);
}

static mp_tensor *reusable(int64_t nbytes, int fill)
{
    mp_tensor *t = NULL;
    assert_mp_ok(mp__tensor_empty_reusable(MP_UINT8, 1, &nbytes, &t));
    assert_true(mp_tensor_is_shared(t));
    memset(mp_tensor_data(t), fill, (size_t)nbytes);
    return t;
}

static void test_reuse(void **state)
{
    (void)state;
    int64_t n = (1 << 20) + 100;
    mp_tensor *t = reusable(n, 0xab);
    unsigned char *p = mp_tensor_data(t);
    mp_tensor_release(t);
    assert_int_equal(mp__segment_pooled(), 1);
    assert_int_equal(mp__segment_count(), 1); /* still mapped, for the next one */
    /* Same page-rounded size: the same memory, its old bytes, a zeroed tail. */
    int64_t n2 = n + 50;
    assert_mp_ok(mp__tensor_empty_reusable(MP_UINT8, 1, &n2, &t));
    assert_int_equal(mp__segment_pooled(), 0);
    assert_ptr_equal(mp_tensor_data(t), p);
    assert_int_equal(p[0], 0xab);
    assert_int_equal(p[n - 1], 0xab);
    for (int64_t i = n2; i % 4096; i++)
        assert_int_equal(p[i], 0);
    /* Another size: a new segment; both come back. */
    mp_tensor *u = reusable(4096 * 3, 1);
    assert_ptr_not_equal(mp_tensor_data(u), p);
    mp_tensor_release(t);
    mp_tensor_release(u);
    assert_int_equal(mp__segment_pooled(), 2);
    mp__segment_recycle_drain();
    assert_int_equal(mp__segment_pooled(), 0);
    assert_int_equal(mp__segment_count(), 0);
}

static void expect_all(const mp_tensor *t, int64_t off, int64_t n, int fill)
{
    const unsigned char *p = mp_tensor_data(t);
    for (int64_t i = 0; i < n; i++)
        if (p[off + i] != fill)
            fail_msg("byte %lld is %d, not %d", (long long)(off + i), p[off + i], fill);
}

/* Memory still held in this process, by the tensor or by a view of it
 * alone, never comes back: a same-size tensor made meanwhile gets other
 * memory, and filling it leaves the held bytes as they were. */
static void test_held_never_reused(void **state)
{
    (void)state;
    int64_t n = 1 << 20;
    mp_tensor *a = reusable(n, 0xab), *view = NULL;
    mp_tensor *b = reusable(n, 0xcd);
    assert_ptr_not_equal(mp_tensor_data(b), mp_tensor_data(a));
    expect_all(a, 0, n, 0xab);
    assert_mp_ok(mp_tensor_narrow(a, 0, 4096, 4096, &view));
    mp_tensor_release(a); /* the view holds the storage */
    mp_tensor_release(b); /* pooled */
    assert_int_equal(mp__segment_pooled(), 1);
    mp_tensor *c = reusable(n, 0xef); /* b's memory again */
    assert_int_equal(mp__segment_pooled(), 0);
    expect_all(view, 0, 4096, 0xab);
    mp_tensor *d = reusable(n, 0x11); /* nothing pooled fits: new memory */
    expect_all(view, 0, 4096, 0xab);
    expect_all(c, 0, n, 0xef);
    mp_tensor_release(view); /* the last of a: pooled now */
    assert_int_equal(mp__segment_pooled(), 1);
    mp_tensor_release(c), mp_tensor_release(d);
    assert_int_equal(mp__segment_pooled(), 3);
}

/* The receiving process holds the tensor; the sender must never reuse it. */
MP_ENTRY(hold_and_check)
{
    mp_conn *c = NULL;
    mp_msg *m = NULL, *ok = NULL;
    mp_tensor *t = NULL;
    int rc = mp_msg_get_conn(args, 0, &c);
    if (rc == 0)
        rc = mp_conn_recv(c, &m, 30);
    if (rc == 0)
        rc = mp_msg_get_tensor(m, 0, &t);
    mp_msg_destroy(m), m = NULL;
    if (rc == 0 && (rc = mp_msg_create(&ok)) == 0)
        rc = mp_conn_send(c, ok, 30); /* holding it */
    mp_msg_destroy(ok);
    if (rc == 0)
        rc = mp_conn_recv(c, &m, 30); /* the sender reused what it could */
    mp_msg_destroy(m);
    const unsigned char *p = t ? mp_tensor_data(t) : NULL;
    for (int64_t i = 0; rc == 0 && i < mp_tensor_numel(t); i++)
        if (p[i] != 0xab)
            rc = MP_EPROTO;
    mp_tensor_release(t);
    mp_conn_release(c);
    return rc;
}

static void test_sent_never_reused(void **state)
{
    (void)state;
    int64_t n = 1 << 20;
    mp_conn *a = NULL, *b = NULL;
    mp_msg *m = NULL, *args = NULL;
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_conn(args, NULL, b));
    mp_process *p = mp_test_start("hold_and_check", args, "spawn");
    mp_msg_destroy(args);
    mp_conn_release(b);
    mp_tensor *t = reusable(n, 0xab);
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, NULL, t));
    assert_mp_ok(mp_conn_send(a, m, 30));
    mp_msg_destroy(m), m = NULL;
    mp_tensor_release(t);
    assert_mp_ok(mp_conn_recv(a, &m, 30)); /* the child holds it now */
    mp_msg_destroy(m), m = NULL;
    assert_int_equal(mp__segment_pooled(), 0);
    /* New memory (perhaps at the old address: the old mapping is gone
     * here), whose bytes the child must not see. */
    t = reusable(n, 0xcd);
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_conn_send(a, m, 30));
    mp_msg_destroy(m);
    int code = -1;
    assert_mp_ok(mp_process_join(p, 30));
    assert_mp_ok(mp_process_exitcode(p, &code));
    assert_int_equal(code, 0);
    mp_process_destroy(p);
    mp_tensor_release(t);
    mp_conn_release(a);
}

static void test_dlpack_never_reused(void **state)
{
    (void)state;
    DLManagedTensor *dl = NULL;
    mp_tensor *t = reusable(8192, 1);
    assert_mp_ok(mp_tensor_to_dlpack(t, &dl));
    mp_tensor_release(t);
    dl->deleter(dl);
    assert_int_equal(mp__segment_pooled(), 0);
    assert_int_equal(mp__segment_count(), 0);
}

/* A segment mapped at fork time is mapped by the child too: never reused.
 * The child drops the pool it inherited (the parent reuses those). */
static void test_fork(void **state)
{
    (void)state;
    mp_tensor *pooled = reusable(4096, 1), *live = reusable(8192, 2);
    void *pooled_data = mp_tensor_data(pooled);
    mp_tensor_release(pooled);
    assert_int_equal(mp__segment_pooled(), 1);
    pid_t pid = fork();
    if (pid == 0) {
        bool dropped = mp__segment_pooled() == 0;
        mp_tensor_release(live); /* the child's copy: not pooled either */
        _exit(dropped && mp__segment_pooled() == 0 ? 0 : 1);
    }
    assert_true(pid > 0);
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    mp_tensor_release(live);
    assert_int_equal(mp__segment_pooled(), 1); /* only the one pooled before */
    pooled = reusable(4096, 3);
    assert_ptr_equal(mp_tensor_data(pooled), pooled_data);
    mp_tensor_release(pooled);
}

static void test_bounds(void **state)
{
    (void)state;
    enum { N = MP__RECYCLE_MAX + 4 };
    mp_tensor *t[N];
    for (int i = 0; i < N; i++)
        t[i] = reusable(4096, i);
    for (int i = 0; i < N; i++)
        mp_tensor_release(t[i]);
    assert_int_equal(mp__segment_pooled(), MP__RECYCLE_MAX);
    assert_int_equal(mp__segment_count(), MP__RECYCLE_MAX);
    mp__segment_recycle_drain();
    /* Bytes: 60 MiB each, at most 256 MiB kept. */
    int64_t big = (int64_t)60 << 20;
    for (int i = 0; i < 5; i++)
        assert_mp_ok(mp__tensor_empty_reusable(MP_UINT8, 1, &big, &t[i]));
    for (int i = 0; i < 5; i++)
        mp_tensor_release(t[i]);
    assert_int_equal(mp__segment_pooled(), (int)(MP__RECYCLE_BYTES / (size_t)big));
    /* Larger than the whole pool: never kept. */
    int64_t huge = (int64_t)MP__RECYCLE_BYTES + 1;
    mp__segment_recycle_drain();
    assert_mp_ok(mp__tensor_empty_reusable(MP_UINT8, 1, &huge, &t[0]));
    mp_tensor_release(t[0]);
    assert_int_equal(mp__segment_pooled(), 0);
}

static void test_file_system_not_pooled(void **state)
{
    (void)state;
    int64_t n = 4096;
    mp_tensor *t = NULL;
    assert_mp_ok(mp_set_sharing_strategy("file_system"));
    assert_mp_ok(mp__tensor_empty_reusable(MP_UINT8, 1, &n, &t));
    assert_true(mp_tensor_is_shared(t));
    assert_int_equal(((unsigned char *)mp_tensor_data(t))[0], 0);
    mp_tensor_release(t);
    assert_int_equal(mp__segment_pooled(), 0);
    assert_mp_err(mp__tensor_empty_reusable(MP_UINT8, 1, &n, NULL), MP_EINVAL);
}

int main(int argc, char **argv)
{
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_never_reused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sent_never_reused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dlpack_never_reused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fork, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_system_not_pooled, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
