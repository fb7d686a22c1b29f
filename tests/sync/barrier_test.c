/* src/sync: Barrier rounds and deaths, objects passed to a child as
 * message attachments, and shared-memory set-up failures. */
#include "helpers.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "ipc/kinds.h"
#include "wire/wire.h"

/* ---- Barrier --------------------------------------------------------------- */

struct barrier_arg {
    mp_barrier *b;
    _Atomic int *rounds; /* per process: rounds passed */
    int me, n, procs;
};

static int barrier_member(void *p)
{
    struct barrier_arg *a = p;
    for (int r = 0; r < a->n; r++) {
        atomic_store(&a->rounds[a->me], r + 1);
        if (mp_barrier_wait(a->b, 20, NULL) != 0)
            return 1;
        /* Nobody may be past this round before everybody reached it. */
        for (int i = 0; i < a->procs; i++)
            if (atomic_load(&a->rounds[i]) < r + 1)
                return 2;
    }
    return 0;
}

static void test_barrier_rounds(void **state)
{
    enum { PROCS = 4, ROUNDS = 1000 };
    struct barrier_arg a = {NULL, shared_page(), 0, ROUNDS, PROCS};
    pid_t pids[PROCS];
    assert_mp_err(mp_barrier_create(0, &a.b), MP_EINVAL);
    assert_mp_ok(mp_barrier_create(PROCS, &a.b));
    assert_int_equal(mp_barrier_parties(a.b), PROCS);
    for (int i = 0; i < PROCS; i++) {
        a.me = i;
        pids[i] = fork_child(barrier_member, &a);
    }
    for (int i = 0; i < PROCS; i++)
        assert_int_equal(reap(pids[i]), 0);
    assert_int_equal(mp_barrier_broken(a.b), 0);
    mp_barrier_release(a.b);
    munmap((void *)a.rounds, 4096);
}

static void test_barrier_timeout_abort_reset(void **state)
{
    mp_barrier *b;
    unsigned idx = 99;
    assert_mp_ok(mp_barrier_create(1, &b));
    assert_mp_ok(mp_barrier_wait(b, 0, &idx));
    assert_int_equal(idx, 0);
    mp_barrier_release(b);

    assert_mp_ok(mp_barrier_create(2, &b));
    assert_mp_err(mp_barrier_wait(b, 0.02, NULL), MP_ETIMEDOUT);
    assert_int_equal(mp_barrier_broken(b), 1);
    assert_mp_err(mp_barrier_wait(b, 1, NULL), MP_EBROKEN);
    assert_mp_ok(mp_barrier_reset(b));
    assert_int_equal(mp_barrier_broken(b), 0);
    assert_mp_ok(mp_barrier_abort(b));
    assert_mp_err(mp_barrier_wait(b, 1, NULL), MP_EBROKEN);
    assert_mp_ok(mp_barrier_reset(b));
    mp_barrier_release(b);
}

static int barrier_two_rounds(void *p)
{
    if (mp_barrier_wait(p, 20, NULL) != 0)
        return 1;
    int rc = mp_barrier_wait(p, 20, NULL);
    return rc == MP_EBROKEN ? 10 : 11;
}

static int barrier_round_then_die(void *p)
{
    if (mp_barrier_wait(p, 20, NULL) != 0)
        return 1;
    nap(0.3); /* the others are asleep in round 2 when we die */
    raise(SIGKILL);
    return 3;
}

static void test_barrier_member_killed(void **state)
{
    mp_barrier *b;
    pid_t other, victim;
    double t0;
    assert_mp_ok(mp_barrier_create(3, &b));
    victim = fork_child(barrier_round_then_die, b);
    other = fork_child(barrier_two_rounds, b);
    assert_mp_ok(mp_barrier_wait(b, 20, NULL)); /* round 1: all three */
    t0 = mp__now();
    assert_mp_err(mp_barrier_wait(b, 20, NULL), MP_EBROKEN); /* victim dies meanwhile */
    assert_true(mp__now() - t0 < 10);                          /* not the timeout */
    assert_int_equal(reap(victim), 128 + SIGKILL);
    assert_int_equal(reap(other), 10);
    assert_int_equal(mp_barrier_broken(b), 1);
    /* reset forgets the dead member: two live parties + a newcomer pass */
    assert_mp_ok(mp_barrier_reset(b));
    other = fork_child(barrier_two_rounds, b);
    victim = fork_child(barrier_round_then_die, b);
    assert_mp_ok(mp_barrier_wait(b, 20, NULL));
    assert_int_equal(reap(victim), 128 + SIGKILL);
    assert_int_equal(reap(other), 10);
    mp_barrier_release(b);
}

/* ---- as message attachments ---------------------------------------------- */

/* The child receives the objects through a socket (fresh mappings from the
 * fds, as under spawn), takes the lock, sets the event, passes the barrier. */
static int attach_child(void *p)
{
    int sock = *(int *)p, rc = 10;
    mp_msg *m = NULL;
    mp_lock *l = NULL;
    mp_event *e = NULL;
    mp_barrier *b = NULL;
    mp_semaphore *s = NULL;
    if (mp__objkinds_ensure("attach_child") != 0 ||
        mp__wire_recv(sock, &m, mp__deadline(10)) != 0) {
        fprintf(stderr, "attach_child: recv: %s\n", mp_last_error());
        return 1;
    }
    if (mp_msg_get_lock(m, 0, &l) || mp_msg_get_event(m, 1, &e) ||
        mp_msg_get_barrier(m, 2, &b) || mp_msg_get_semaphore(m, 3, &s))
        goto out;
    rc = 11;
    mp_lock *wrong = NULL;
    if (mp_msg_get_lock(m, 1, &wrong) != MP_EINVAL) /* an event is not a lock */
        goto out;
    rc = 12;
    if (mp_lock_lock(l, 10) != 0 || mp_semaphore_wait(s, 0) != 0)
        goto out;
    mp_event_set(e);
    rc = mp_barrier_wait(b, 10, NULL) == 0 ? 0 : 13;
    mp_lock_unlock(l);
out:
    mp_lock_release(l);
    mp_event_release(e);
    mp_barrier_release(b);
    mp_semaphore_release(s);
    if (rc)
        fprintf(stderr, "attach_child: step %d: %s\n", rc, mp_last_error());
    mp_msg_destroy(m);
    return rc;
}

static void test_attachments(void **state)
{
    int sv[2];
    mp_msg *m;
    mp_lock *l;
    mp_event *e;
    mp_barrier *b;
    mp_semaphore *s;
    pid_t pid;
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    assert_mp_ok(mp_lock_create(&l));
    assert_mp_ok(mp_event_create(&e));
    assert_mp_ok(mp_barrier_create(2, &b));
    assert_mp_ok(mp_semaphore_create(1, &s));
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_err(mp_msg_add_lock(m, "l", NULL), MP_EINVAL);
    assert_mp_ok(mp_msg_add_lock(m, "lock", l));
    assert_mp_ok(mp_msg_add_event(m, "ready", e));
    assert_mp_ok(mp_msg_add_barrier(m, NULL, b));
    assert_mp_ok(mp_msg_add_semaphore(m, NULL, s));
    assert_int_equal(mp_msg_kind(m, 0), MP_ATTACH_LOCK);
    pid = fork_child(attach_child, &sv[1]);
    assert_mp_ok(mp__wire_send(sv[0], m, mp__deadline(10)));
    mp_msg_destroy(m); /* the objects live on in the child's mappings */
    assert_mp_ok(mp_event_wait(e, 10));
    assert_mp_ok(mp_barrier_wait(b, 10, NULL));
    assert_int_equal(reap(pid), 0);
    /* the child took the permit; dropping its handle gave it back */
    assert_int_equal(mp_semaphore_value(s), 1);
    assert_mp_ok(mp_lock_lock(l, 5));        /* and released the lock */
    assert_mp_ok(mp_lock_unlock(l));
    mp_lock_release(l);
    mp_event_release(e);
    mp_barrier_release(b);
    mp_semaphore_release(s);
    close(sv[0]);
    close(sv[1]);
}

/* Under every start method: the child gets the objects in its argument
 * message, holds the lock while it sets the event, and meets us at the
 * barrier; we wait for the event and see the lock held meanwhile. */
MP_ENTRY(sync_child)
{
    mp_lock *l = NULL;
    mp_event *e = NULL;
    mp_barrier *b = NULL;
    int rc = 1;
    if (mp_msg_get_lock(args, 0, &l) || mp_msg_get_event(args, 1, &e) ||
        mp_msg_get_barrier(args, 2, &b))
        goto out;
    rc = 2;
    if (mp_lock_lock(l, 10) != 0)
        goto out;
    mp_event_set(e);
    rc = mp_barrier_wait(b, 10, NULL) == 0 ? 0 : 3; /* the parent checks the lock */
    mp_barrier_wait(b, 10, NULL);
    mp_lock_unlock(l);
out:
    mp_lock_release(l);
    mp_event_release(e);
    mp_barrier_release(b);
    return rc;
}

static void check_start_method(const char *method)
{
    mp_process_options o;
    mp_process *proc;
    mp_msg *args;
    mp_lock *l;
    mp_event *e;
    mp_barrier *b;
    int code = -1;
    assert_mp_ok(mp_lock_create(&l));
    assert_mp_ok(mp_event_create(&e));
    assert_mp_ok(mp_barrier_create(2, &b));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_add_lock(args, NULL, l));
    assert_mp_ok(mp_msg_add_event(args, NULL, e));
    assert_mp_ok(mp_msg_add_barrier(args, NULL, b));
    mp_process_options_init(&o);
    o.start_method = method;
    assert_mp_ok(mp_process_create("sync_child", args, &o, &proc));
    assert_mp_ok(mp_process_start(proc));
    mp_msg_destroy(args);
    assert_mp_ok(mp_event_wait(e, 20));
    assert_mp_ok(mp_barrier_wait(b, 20, NULL));
    assert_int_equal(mp_lock_locked(l), 1);         /* held by the child */
    assert_mp_err(mp_lock_unlock(l), MP_EPERM);
    assert_mp_ok(mp_barrier_wait(b, 20, NULL));
    assert_mp_ok(mp_process_join(proc, 20));
    assert_mp_ok(mp_process_exitcode(proc, &code));
    assert_int_equal(code, 0);
    assert_mp_ok(mp_lock_lock(l, 10));
    assert_mp_ok(mp_lock_unlock(l));
    assert_mp_ok(mp_process_destroy(proc));
    mp_lock_release(l);
    mp_event_release(e);
    mp_barrier_release(b);
}

static void test_start_methods(void **state)
{
    check_start_method("fork");
    check_start_method("spawn");
    check_start_method("forkserver");
    mp_forkserver_stop();
}

/* ---- shared-memory set-up failures ---------------------------------------- */

static void test_create_faults(void **state)
{
    mp_lock *l = (mp_lock *)1;
    mp_event *e = NULL;
    assert_mp_ok(mp__sys_fault("memfd_create", EMFILE, 0, 1));
    assert_mp_err(mp_lock_create(&l), MP_EMFILE);
    assert_null(l);
    assert_non_null(strstr(mp_last_error(), "mp_lock_create"));
    assert_mp_ok(mp__sys_fault("posix_fallocate", ENOSPC, 0, 1));
    assert_mp_err(mp_event_create(&e), MP_ENOSPC);
    assert_mp_ok(mp__sys_fault("mmap", ENOMEM, 0, 1));
    assert_mp_err(mp_event_create(&e), MP_ENOMEM);
    assert_null(e);
    /* the segment's own mapping, into the reservation that holds the
     * handle: the reservation goes too (the teardown counts mappings) */
    assert_mp_ok(mp__sys_fault("mmap", ENOMEM, 1, 1));
    assert_mp_err(mp_lock_create(&l), MP_ENOMEM);
    assert_null(l);
}


int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_barrier_rounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_barrier_timeout_abort_reset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_barrier_member_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attachments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_methods, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_faults, setup, teardown),
    };
    if (mp_setup(&argc, &argv) != 0) /* spawned children run from here */
        return 1;
    warm_up();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
