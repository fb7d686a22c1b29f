/* mp_tensor_stats_get, under each sharing strategy: every counter moves
 * exactly when its event happens (a copy into shared memory and its bytes,
 * a segment created, received over a new or a reused mapping, unmapped),
 * failures count nothing, and the struct is read the extensible way. */
#include "mp_test.h"
#include "os/os.h"
#include "shm/pins.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int group_fd(void **state)
{
    (void)state;
    return mp_set_sharing_strategy("file_descriptor");
}
static int group_fs(void **state)
{
    (void)state;
    return mp_set_sharing_strategy("file_system");
}
static int setup(void **state)
{
    return mp_test_setup(state);
}
static int teardown(void **state)
{
    return mp_test_teardown(state);
}

/* now - before, field by field. */
static mp_tensor_stats since(const mp_tensor_stats *before)
{
    mp_tensor_stats d = mp_test_tensor_stats();
    d.shared_copies -= before->shared_copies;
    d.shared_copy_bytes -= before->shared_copy_bytes;
    d.segments_created -= before->segments_created;
    d.segments_received -= before->segments_received;
    d.segments_mapped -= before->segments_mapped;
    d.segments_unmapped -= before->segments_unmapped;
    d.segments_live -= before->segments_live;
    return d;
}

#define ASSERT_STATS(d, copies, bytes, created, received, mapped, unmapped, live)                  \
    do {                                                                                           \
        assert_int_equal((d).shared_copies, copies);                                               \
        assert_int_equal((d).shared_copy_bytes, bytes);                                            \
        assert_int_equal((d).segments_created, created);                                           \
        assert_int_equal((d).segments_received, received);                                         \
        assert_int_equal((d).segments_mapped, mapped);                                             \
        assert_int_equal((d).segments_unmapped, unmapped);                                         \
        assert_int_equal((d).segments_live, live);                                                 \
    } while (0)

/* share_memory_ copies once (its bytes), views and a second call do not;
 * empty_shared creates without copying; a failed share counts nothing;
 * releasing unmaps. */
static void test_local(void **state)
{
    int64_t n = 1000, shape[2] = {10, 100};
    mp_tensor *t, *v, *e;
    mp_tensor_stats s0 = mp_test_tensor_stats(), d;
    (void)state;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 1, &n, &t));
    assert_mp_ok(mp_tensor_narrow(t, 0, 10, 20, &v));
    assert_mp_ok(mp__sys_fault("pwritev", ENOSPC, 0, 1));
    assert_mp_err(mp_tensor_share_memory_(t), MP_ENOSPC);
    d = since(&s0);
    ASSERT_STATS(d, 0, 0, 0, 0, 0, 0, 0);
    assert_mp_ok(mp_tensor_share_memory_(v)); /* moves t's storage: one copy */
    assert_mp_ok(mp_tensor_share_memory_(t));
    d = since(&s0);
    ASSERT_STATS(d, 1, 4000, 1, 0, 0, 0, 1);
    assert_mp_ok(mp_tensor_empty_shared(MP_FLOAT64, 2, shape, &e));
    d = since(&s0);
    ASSERT_STATS(d, 1, 4000, 2, 0, 0, 0, 2);
    mp_tensor_release(t);
    d = since(&s0);
    assert_int_equal(d.segments_unmapped, 0); /* v still holds the storage */
    mp_tensor_release(v);
    mp_tensor_release(e);
    d = since(&s0);
    ASSERT_STATS(d, 1, 4000, 2, 0, 0, 2, 0);
}

/* The receiving child: the first message maps the segment, the second
 * reuses the mapping; a file_descriptor segment that arrived twice is
 * pinned by the end (src/shm/pins.c), so it is unmapped once both messages
 * and the end are released. Exit 0 when all holds. */
static int child_receives(mp_conn *in)
{
    mp_tensor_stats s0 = mp_test_tensor_stats(), d;
    mp_msg *m1 = NULL, *m2 = NULL;
    bool pinned;
    if (mp_conn_recv(in, &m1, 30) != 0 || mp_conn_recv(in, &m2, 30) != 0)
        return 10;
    d = since(&s0);
    if (d.segments_received != 2 || d.segments_mapped != 1 || d.segments_live != 1 ||
        d.segments_created != 0 || d.shared_copies != 0)
        return 11;
    mp_msg_destroy(m1);
    if (since(&s0).segments_unmapped != 0)
        return 12; /* m2's tensor still maps it */
    mp_msg_destroy(m2);
    /* file_descriptor: the end pinned it; file_system: named segments are
     * never pinned (a name needs no fd) */
    pinned = mp__shm_strategy() == MP__STRATEGY_FD;
    if (since(&s0).segments_unmapped != (pinned ? 0u : 1u) || mp__pins_held() != (int)pinned)
        return 13;
    mp_conn_release(in);
    d = since(&s0);
    return d.segments_unmapped == 1 && d.segments_live == 0 && mp__pins_held() == 0 ? 0 : 14;
}

/* A segment created after the fork is new to the child; sending it twice
 * costs the sender nothing more. */
static void test_received(void **state)
{
    int64_t n = 64;
    mp_conn *r, *w;
    mp_tensor *t;
    mp_msg *m;
    int status = 0;
    pid_t pid;
    (void)state;
    assert_mp_ok(mp_pipe(false, &r, &w));
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        mp_conn_release(w);
        _exit(child_receives(r));
    }
    mp_conn_release(r);
    mp_tensor_stats s0 = mp_test_tensor_stats(), d;
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, &n, &t));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, "t", t));
    assert_mp_ok(mp_conn_send(w, m, 30)); /* shares t: the one copy */
    assert_mp_ok(mp_conn_send(w, m, 30));
    d = since(&s0);
    ASSERT_STATS(d, 1, 256, 1, 0, 0, 0, 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    mp_msg_destroy(m);
    mp_tensor_release(t);
    mp_conn_release(w);
    d = since(&s0);
    ASSERT_STATS(d, 1, 256, 1, 0, 0, 1, 0);
}

/* A tensor sent to this process itself comes back over its own mapping. */
static void test_received_own(void **state)
{
    int64_t n = 8;
    mp_conn *a, *b;
    mp_tensor *t, *back;
    mp_msg *m, *got;
    (void)state;
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp_tensor_empty_shared(MP_INT64, 1, &n, &t));
    mp_tensor_stats s0 = mp_test_tensor_stats(), d;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_add_tensor(m, NULL, t));
    assert_mp_ok(mp_conn_send(a, m, 30));
    assert_mp_ok(mp_conn_recv(b, &got, 30));
    assert_mp_ok(mp_msg_get_tensor(got, 0, &back));
    assert_true(mp_tensor_same_storage(back, t));
    d = since(&s0);
    ASSERT_STATS(d, 0, 0, 0, 1, 0, 0, 0);
    mp_tensor_release(back);
    mp_msg_destroy(got);
    mp_msg_destroy(m);
    mp_tensor_release(t);
    mp_conn_release(a);
    mp_conn_release(b);
    assert_int_equal(since(&s0).segments_unmapped, 1);
}

/* copy_struct_from_user rules: a smaller struct gets its prefix, a larger
 * one zeros past ours; a missing or unset size is refused with a sentence. */
static void test_struct(void **state)
{
    unsigned char big[sizeof(mp_tensor_stats) + 16];
    mp_tensor_stats st, full = mp_test_tensor_stats();
    (void)state;
    assert_mp_err(mp_tensor_stats_get(NULL), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "sizeof st"));
    memset(&st, 0, sizeof st);
    assert_mp_err(mp_tensor_stats_get(&st), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "mp_tensor_stats.size is 0"));
    memset(&st, 0xab, sizeof st);
    st.size = offsetof(mp_tensor_stats, segments_created);
    assert_mp_ok(mp_tensor_stats_get(&st));
    assert_int_equal(st.size, offsetof(mp_tensor_stats, segments_created));
    assert_int_equal(st.shared_copies, full.shared_copies);
    assert_int_equal(st.segments_created, 0xababababababababull); /* not written */
    memset(big, 0xcd, sizeof big);
    size_t size = sizeof big;
    memcpy(big, &size, sizeof size);
    assert_mp_ok(mp_tensor_stats_get((mp_tensor_stats *)big));
    for (size_t i = sizeof(mp_tensor_stats); i < sizeof big; i++)
        assert_int_equal(big[i], 0);
}

#define T(t) cmocka_unit_test_setup_teardown(t, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_local),
        T(test_received),
        T(test_received_own),
        T(test_struct),
    };
    int failed = cmocka_run_group_tests_name("file_descriptor", tests, group_fd, NULL);
    failed += cmocka_run_group_tests_name("file_system", tests, group_fs, NULL);
    return failed;
}
