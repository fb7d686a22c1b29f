/* The object-kind registry (src/wire/kinds.c) and the one call that fills it
 * (src/ipc/kinds.c): a decoder knows a kind only once it is registered;
 * mp__objkinds_ensure registers every kind of this build, from any number of
 * threads at once; registering is idempotent, bounded, refuses a second
 * descriptor for an id and keeps that refusal for every later receive. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda/cuda_internal.h"
#include "ipc/kinds.h"
#include "mp_test.h"
#include "sync/sync_internal.h"
#include "wire/wire.h"

static int setup(void **state)
{
    return mp_test_setup(state);
}
static int teardown(void **state)
{
    return mp_test_teardown(state);
}

/* Runs fn in a forked child: its registrations (and a refusal kept there)
 * stay in the child. The child exits 0 when fn returns 0. */
static void in_child(int (*fn)(void))
{
    int status = 0;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn());
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* A message holding one lock and one queue, encoded: the frame and its fds
 * (dup'ed, so the caller owns them as a receiver would). */
typedef struct frame {
    void *buf;
    size_t len;
    int fds[MP__WIRE_MAX_FDS];
    int nfds;
} frame;

static int encode_lock_queue(frame *f)
{
    mp_msg *m = NULL;
    mp_lock *l = NULL;
    mp_queue *q = NULL;
    int borrowed[MP__WIRE_MAX_FDS], rc;
    if ((rc = mp_msg_create(&m)) || (rc = mp_lock_create(&l)) || (rc = mp_queue_create(0, &q)) ||
        (rc = mp_msg_add_lock(m, "l", l)) || (rc = mp_msg_add_queue(m, "q", q)) ||
        (rc = mp__wire_encode(m, &f->buf, &f->len, borrowed, &f->nfds)) == 0)
        for (int i = 0; i < f->nfds; i++)
            f->fds[i] = dup(borrowed[i]);
    mp_lock_release(l);
    mp_queue_release(q);
    mp_msg_destroy(m);
    return rc;
}

/* Nothing in this process registered a kind yet (no receive, no mp_setup):
 * sending works (a message carries its descriptors), decoding the same
 * frame fails with a sentence saying no kind is known, closing every fd;
 * after mp__objkinds_ensure it decodes. */
static int unregistered_then_ensured(void)
{
    frame f = {0};
    mp_msg *m = NULL;
    mp_lock *l = NULL;
    int fds0 = mp_test_count_fds(), rc;
    if (mp__objkind_lookup(MP_ATTACH_LOCK) || encode_lock_queue(&f) < 0)
        return 10;
    rc = mp__wire_decode(f.buf, f.len, f.fds, f.nfds, &m);
    if (rc != MP_EPROTO || !strstr(mp_last_error(), "object kind 4") ||
        !strstr(mp_last_error(), "no kind is registered") || m)
        return 11;
    free(f.buf);
    if (mp_test_count_fds() != fds0 || mp__objkinds_ensure("test") < 0 || encode_lock_queue(&f) < 0)
        return 12;
    if (mp__wire_decode(f.buf, f.len, f.fds, f.nfds, &m) < 0 || mp_msg_get_lock(m, 0, &l) < 0)
        return 13;
    mp_lock_release(l);
    mp_msg_destroy(m);
    free(f.buf);
    return 0;
}

static void test_unregistered_then_ensured(void **state)
{
    (void)state;
    in_child(unregistered_then_ensured);
}

/* Every public object kind, with the descriptor its layer defines. */
static void test_every_kind(void **state)
{
    const mp__objkind *const want[] = {
        &mp__queue_kind,       &mp__conn_kind,         &mp__lock_kind,          &mp__rlock_kind,
        &mp__semaphore_kind,   &mp__event_kind,        &mp__condition_kind,     &mp__barrier_kind,
        &mp__cuda_tensor_kind, &mp__simple_queue_kind, &mp__joinable_queue_kind};
    char list[512];
    (void)state;
    assert_mp_ok(mp__objkinds_ensure("test"));
    assert_mp_ok(mp__objkinds_ensure("test")); /* idempotent */
    for (int id = MP_ATTACH_QUEUE; id <= MP_ATTACH_JOINABLE_QUEUE; id++) {
        assert_ptr_equal(mp__objkind_lookup(id), want[id - MP_ATTACH_QUEUE]);
        assert_int_equal(want[id - MP_ATTACH_QUEUE]->kind, id);
    }
    assert_null(mp__objkind_lookup(MP_ATTACH_TENSOR));
    assert_null(mp__objkind_lookup(0));
    assert_null(mp__objkind_lookup(-1));
    assert_null(mp__objkind_lookup(MP__OBJKIND_MAX));
    assert_null(mp__objkind_lookup(MP_ATTACH_JOINABLE_QUEUE + 1));
    mp__objkind_list(list, sizeof list);
    assert_non_null(strstr(list, "2 (queue), 3 (connection), 4 (lock)"));
    assert_non_null(strstr(list, "10 (CUDA tensor)"));
    assert_int_equal(mp__objkind_list(list, 8), 7); /* truncated, terminated */
    assert_int_equal(strlen(list), 7);
    assert_mp_ok(mp__objkind_check("test"));
}

static void *ensure_thread(void *arg)
{
    (void)arg;
    return (void *)(intptr_t)mp__objkinds_ensure("thread");
}

/* Eight threads race to register everything in a process that has nothing. */
static int concurrent(void)
{
    pthread_t t[8];
    int bad = 0;
    for (int i = 0; i < 8; i++)
        if (pthread_create(&t[i], NULL, ensure_thread, NULL) != 0)
            return 20;
    for (int i = 0; i < 8; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        bad |= rc != NULL;
    }
    for (int id = MP_ATTACH_QUEUE; id <= MP_ATTACH_JOINABLE_QUEUE; id++)
        bad |= !mp__objkind_lookup(id);
    return bad ? 21 : 0;
}

static void test_concurrent(void **state)
{
    (void)state;
    in_child(concurrent);
}

/* Refusals: an incomplete descriptor, an id out of range, a second
 * descriptor for a taken id. The first is kept: mp__objkind_check and every
 * receive report it from then on. */
static int refusals(void)
{
    mp__objkind other = mp__lock_kind, bad = mp__lock_kind;
    mp_conn *a = NULL, *b = NULL;
    mp_msg *m = NULL;
    int rc;
    if (mp__objkinds_ensure("test") < 0 || mp__objkind_register(&mp__lock_kind) != 0)
        return 30;
    bad.decode = NULL;
    if (mp__objkind_register(&bad) != MP_EINVAL || !strstr(mp_last_error(), "incomplete"))
        return 31;
    /* The first refusal is the one kept. */
    if ((rc = mp__objkind_check("later")) != MP_EINVAL || !strstr(mp_last_error(), "later: ") ||
        !strstr(mp_last_error(), "incomplete"))
        return 32;
    bad = mp__lock_kind;
    for (int i = 0; i < 3; i++) {
        bad.kind = (int[]){0, MP_ATTACH_TENSOR, MP__OBJKIND_MAX}[i];
        if (mp__objkind_register(&bad) != MP_EINVAL || !strstr(mp_last_error(), "outside"))
            return 33;
    }
    if (mp__objkind_register(&other) != MP_EINVAL ||
        !strstr(mp_last_error(), "lock cannot take kind id 4: lock holds it already"))
        return 34;
    if (mp__objkind_lookup(MP_ATTACH_LOCK) != &mp__lock_kind)
        return 35; /* the first descriptor stays */
    if (mp_pipe(true, &a, &b) < 0)
        return 36;
    rc = mp_conn_recv(a, &m, 0);
    mp_conn_release(a);
    mp_conn_release(b);
    if (rc != MP_EINVAL || !strstr(mp_last_error(), "mp_conn_recv: an attachment kind was "
                                                    "refused at registration"))
        return 37;
    return 0;
}

static void test_refusals(void **state)
{
    (void)state;
    in_child(refusals);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unregistered_then_ensured, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_kind, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
