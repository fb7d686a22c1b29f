/* src/sync: Lock, RLock, Semaphore, Event, Condition, Barrier across forked
 * processes, misuse errors, robustness when holders and members die. */
#include "mp_test.h"
#include "os/os.h"
#include "wire/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state)
{
    mp__sys_fault_reset();
    return mp_test_teardown(state);
}

/* ---- helpers ------------------------------------------------------------- */

static pid_t fork_child(int (*fn)(void *), void *arg)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn(arg));
    return pid;
}

/* Exit code, or 128 + signal. */
static int reap(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void *shared_page(void)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

static void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- Lock ------------------------------------------------------------------ */

struct counter_arg {
    mp_lock *lock;
    volatile long *counter;
    int n;
};

static int increment(void *p)
{
    struct counter_arg *a = p;
    for (int i = 0; i < a->n; i++) {
        if (mp_lock_acquire(a->lock, 30) != 0)
            return 1;
        long v = *a->counter; /* a non-atomic read-modify-write */
        *a->counter = v + 1;
        if (mp_lock_release(a->lock) != 0)
            return 2;
    }
    return 0;
}

static void test_lock_mutual_exclusion(void **state)
{
    enum { PROCS = 4, N = 100000 };
    struct counter_arg a = {NULL, shared_page(), N};
    pid_t pids[PROCS];
    assert_mp_ok(mp_lock_create(&a.lock));
    for (int i = 0; i < PROCS; i++)
        pids[i] = fork_child(increment, &a);
    for (int i = 0; i < PROCS; i++)
        assert_int_equal(reap(pids[i]), 0);
    assert_int_equal(*a.counter, (long)PROCS * N);
    assert_int_equal(mp_lock_locked(a.lock), 0);
    mp_lock_destroy(a.lock);
    munmap((void *)a.counter, 4096);
}

static void *release_lock_thread(void *p)
{
    return (void *)(intptr_t)mp_lock_release(p);
}

static void *release_rlock_thread(void *p)
{
    return (void *)(intptr_t)mp_rlock_release(p);
}

static void test_lock_misuse(void **state)
{
    mp_lock *l;
    pthread_t th;
    void *ret;
    assert_mp_err(mp_lock_create(NULL), MP_EINVAL);
    assert_mp_err(mp_lock_acquire(NULL, 1), MP_EINVAL);
    assert_mp_ok(mp_lock_create(&l));
    assert_mp_err(mp_lock_acquire(l, NAN), MP_EINVAL);
    assert_mp_err(mp_lock_release(l), MP_ESTATE);
    assert_non_null(strstr(mp_last_error(), "not held"));
    assert_mp_ok(mp_lock_acquire(l, 0));
    assert_int_equal(mp_lock_locked(l), 1);
    assert_mp_err(mp_lock_acquire(l, 0), MP_ESTATE); /* not recursive */
    assert_non_null(strstr(mp_last_error(), "RLock"));
    assert_mp_err(mp_lock_consistent(l), MP_ESTATE);
    assert_int_equal(pthread_create(&th, NULL, release_lock_thread, l), 0);
    pthread_join(th, &ret);
    assert_int_equal((int)(intptr_t)ret, MP_EPERM);
    assert_mp_ok(mp_lock_release(l));
    mp_lock_destroy(NULL);
    mp_lock_destroy(mp_lock_retain(l));
    mp_lock_destroy(l);
}

static int hold_briefly(void *p)
{
    if (mp_lock_acquire(p, 5) != 0)
        return 1;
    nap(0.3);
    return mp_lock_release(p) == 0 ? 0 : 2;
}

static void test_lock_timeout(void **state)
{
    mp_lock *l;
    double t0;
    pid_t pid;
    assert_mp_ok(mp_lock_create(&l));
    pid = fork_child(hold_briefly, l);
    while (!mp_lock_locked(l))
        nap(0.001);
    t0 = mp__now();
    assert_mp_err(mp_lock_acquire(l, 0.05), MP_ETIMEDOUT);
    assert_true(mp__now() - t0 >= 0.04);
    assert_mp_err(mp_lock_release(l), MP_EPERM); /* the child holds it */
    assert_mp_ok(mp_lock_acquire(l, 10)); /* blocks until the child lets go */
    assert_mp_ok(mp_lock_release(l));
    assert_int_equal(reap(pid), 0);
    mp_lock_destroy(l);
}

/* ---- RLock ----------------------------------------------------------------- */

static void test_rlock_recursion(void **state)
{
    mp_rlock *r;
    pthread_t th;
    void *ret;
    assert_mp_ok(mp_rlock_create(&r));
    assert_mp_err(mp_rlock_release(r), MP_ESTATE);
    for (int i = 1; i <= 3; i++) {
        assert_mp_ok(mp_rlock_acquire(r, 0));
        assert_int_equal(mp_rlock_depth(r), i);
    }
    assert_int_equal(pthread_create(&th, NULL, release_rlock_thread, r), 0);
    pthread_join(th, &ret);
    assert_int_equal((int)(intptr_t)ret, MP_EPERM);
    for (int i = 2; i >= 0; i--) {
        assert_mp_ok(mp_rlock_release(r));
        assert_int_equal(mp_rlock_depth(r), i);
    }
    assert_mp_err(mp_rlock_release(r), MP_ESTATE);
    mp_rlock_destroy(r);
}

/* ---- robustness: holders that die -------------------------------------- */

struct die_arg {
    void *obj;
    int fd; /* write end: one byte once acquired */
    double delay;
};

static int lock_and_die(void *p)
{
    struct die_arg *a = p;
    if (mp_lock_acquire(a->obj, 5) != 0)
        return 1;
    (void)!write(a->fd, "x", 1);
    nap(a->delay);
    raise(SIGKILL);
    return 3;
}

static int rlock_and_die(void *p)
{
    struct die_arg *a = p;
    for (int i = 0; i < 2; i++)
        if (mp_rlock_acquire(a->obj, 5) != 0)
            return 1;
    (void)!write(a->fd, "x", 1);
    raise(SIGKILL);
    return 3;
}

static void wait_byte(int fd)
{
    char c;
    assert_int_equal(read(fd, &c, 1), 1);
}

static void test_lock_owner_dead(void **state)
{
    struct die_arg a = {NULL, -1, 0.2};
    int p[2];
    double t0;
    pid_t pid;
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    a.fd = p[1];
    assert_mp_ok(mp_lock_create((mp_lock **)&a.obj));
    pid = fork_child(lock_and_die, &a);
    wait_byte(p[0]);
    /* Block while the holder is alive: its death must wake us. */
    t0 = mp__now();
    assert_mp_err(mp_lock_acquire(a.obj, 20), MP_EOWNERDEAD);
    assert_true(mp__now() - t0 < 10);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_non_null(strstr(mp_last_error(), "died"));
    assert_mp_ok(mp_lock_consistent(a.obj));
    assert_mp_ok(mp_lock_release(a.obj));
    assert_mp_ok(mp_lock_acquire(a.obj, 0));
    assert_mp_ok(mp_lock_release(a.obj));

    /* Released without being marked consistent: unrecoverable. */
    a.delay = 0;
    pid = fork_child(lock_and_die, &a);
    wait_byte(p[0]);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_mp_err(mp_lock_acquire(a.obj, 5), MP_EOWNERDEAD);
    assert_mp_ok(mp_lock_release(a.obj));
    assert_mp_err(mp_lock_acquire(a.obj, 0), MP_EBROKEN);
    mp_lock_destroy(a.obj);
    close(p[0]);
    close(p[1]);
}

static void test_rlock_owner_dead(void **state)
{
    struct die_arg a = {NULL, -1, 0};
    int p[2];
    pid_t pid;
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    a.fd = p[1];
    assert_mp_ok(mp_rlock_create((mp_rlock **)&a.obj));
    pid = fork_child(rlock_and_die, &a);
    wait_byte(p[0]);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_mp_err(mp_rlock_acquire(a.obj, 5), MP_EOWNERDEAD);
    assert_int_equal(mp_rlock_depth(a.obj), 1); /* the dead owner's depth is gone */
    assert_mp_ok(mp_rlock_consistent(a.obj));
    assert_mp_ok(mp_rlock_release(a.obj));
    assert_int_equal(mp_rlock_depth(a.obj), 0);
    mp_rlock_destroy(a.obj);
    close(p[0]);
    close(p[1]);
}

/* ---- Semaphore ------------------------------------------------------------- */

static void test_semaphore_counts(void **state)
{
    mp_semaphore *s, *b;
    assert_mp_err(mp_semaphore_create(0, NULL), MP_EINVAL);
    assert_mp_ok(mp_semaphore_create(2, &s));
    assert_int_equal(mp_semaphore_value(s), 2);
    assert_mp_ok(mp_semaphore_acquire(s, 0));
    assert_mp_ok(mp_semaphore_acquire(s, 0));
    assert_int_equal(mp_semaphore_value(s), 0);
    assert_mp_err(mp_semaphore_acquire(s, 0.02), MP_ETIMEDOUT);
    assert_mp_ok(mp_semaphore_release(s));
    assert_mp_ok(mp_semaphore_release(s));
    assert_mp_ok(mp_semaphore_release(s)); /* unbounded: a third permit */
    assert_int_equal(mp_semaphore_value(s), 3);
    mp_semaphore_destroy(s);

    assert_mp_ok(mp_bounded_semaphore_create(1, &b));
    assert_mp_err(mp_semaphore_release(b), MP_EOVERFLOW);
    assert_non_null(strstr(mp_last_error(), "more times than acquired"));
    assert_mp_ok(mp_semaphore_acquire(b, 0));
    assert_mp_ok(mp_semaphore_release(b));
    assert_int_equal(mp_semaphore_value(b), 1);
    mp_semaphore_destroy(b);
}

static int sem_release_later(void *p)
{
    nap(0.1);
    return mp_semaphore_release(p) == 0 ? 0 : 1;
}

static int sem_take_and_die(void *p)
{
    struct die_arg *a = p;
    if (mp_semaphore_acquire(a->obj, 5) != 0 || mp_semaphore_acquire(a->obj, 5) != 0)
        return 1;
    (void)!write(a->fd, "x", 1);
    nap(a->delay);
    raise(SIGKILL);
    return 3;
}

static void test_semaphore_processes(void **state)
{
    struct die_arg a = {NULL, -1, 0.2};
    int p[2];
    double t0;
    pid_t pid;
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    a.fd = p[1];
    assert_mp_ok(mp_semaphore_create(0, (mp_semaphore **)&a.obj));
    pid = fork_child(sem_release_later, a.obj);
    assert_mp_ok(mp_semaphore_acquire(a.obj, 10)); /* the child's permit */
    assert_int_equal(reap(pid), 0);
    assert_mp_ok(mp_semaphore_release(a.obj));
    assert_mp_ok(mp_semaphore_release(a.obj));

    /* A holder of both permits dies while we wait: they come back. */
    pid = fork_child(sem_take_and_die, &a);
    wait_byte(p[0]);
    t0 = mp__now();
    assert_mp_err(mp_semaphore_acquire(a.obj, 20), MP_EOWNERDEAD);
    assert_true(mp__now() - t0 < 10);
    assert_int_equal(reap(pid), 128 + SIGKILL);
    assert_int_equal(mp_semaphore_value(a.obj), 1);
    assert_mp_ok(mp_semaphore_acquire(a.obj, 0));
    assert_mp_ok(mp_semaphore_release(a.obj));
    assert_mp_ok(mp_semaphore_release(a.obj));
    assert_int_equal(mp_semaphore_value(a.obj), 2);
    mp_semaphore_destroy(a.obj);
    close(p[0]);
    close(p[1]);
}

/* ---- Event ------------------------------------------------------------------ */

static int event_set_later(void *p)
{
    nap(0.1);
    return mp_event_set(p) == 0 ? 0 : 1;
}

static void test_event(void **state)
{
    mp_event *e;
    pid_t pid;
    assert_mp_ok(mp_event_create(&e));
    assert_int_equal(mp_event_is_set(e), 0);
    assert_mp_err(mp_event_wait(e, 0), MP_ETIMEDOUT);
    assert_mp_err(mp_event_wait(e, 0.02), MP_ETIMEDOUT);
    pid = fork_child(event_set_later, e);
    assert_mp_ok(mp_event_wait(e, 10));
    assert_int_equal(reap(pid), 0);
    assert_int_equal(mp_event_is_set(e), 1);
    assert_mp_ok(mp_event_wait(e, 0));
    assert_mp_ok(mp_event_clear(e));
    assert_int_equal(mp_event_is_set(e), 0);
    assert_mp_err(mp_event_wait(e, 0.01), MP_ETIMEDOUT);
    assert_mp_err(mp_event_set(NULL), MP_EINVAL);
    mp_event_destroy(e);
}

/* ---- Condition ------------------------------------------------------------- */

struct cond_arg {
    mp_condition *c;
    _Atomic int *woken;
};

static int cond_waiter(void *p)
{
    struct cond_arg *a = p;
    int rc;
    if (mp_condition_acquire(a->c, 5) != 0)
        return 1;
    rc = mp_condition_wait(a->c, 20);
    if (rc == 0)
        atomic_fetch_add(a->woken, 1);
    if (mp_condition_release(a->c) != 0)
        return 2;
    return rc == 0 ? 0 : 3;
}

static void test_condition(void **state)
{
    enum { N = 3 };
    struct cond_arg a = {NULL, shared_page()};
    pid_t pids[N];
    assert_mp_ok(mp_condition_create(&a.c));
    assert_mp_err(mp_condition_wait(a.c, 0), MP_EPERM);
    assert_mp_err(mp_condition_notify(a.c, 1), MP_EPERM);
    assert_mp_ok(mp_condition_acquire(a.c, 1));
    assert_mp_ok(mp_condition_acquire(a.c, 1)); /* depth 2 survives a wait */
    assert_mp_err(mp_condition_wait(a.c, 0.02), MP_ETIMEDOUT);
    assert_mp_ok(mp_condition_release(a.c));
    assert_mp_ok(mp_condition_release(a.c));
    assert_mp_err(mp_condition_release(a.c), MP_ESTATE);

    for (int i = 0; i < N; i++)
        pids[i] = fork_child(cond_waiter, &a);
    /* Wait until all three sleep in the wait (waiters counted in the word):
     * retry notify(1) until exactly one has woken. */
    for (int tries = 0; atomic_load(a.woken) == 0 && tries < 2000; tries++) {
        nap(0.005);
        assert_mp_ok(mp_condition_acquire(a.c, 5));
        assert_mp_ok(mp_condition_notify(a.c, 1));
        assert_mp_ok(mp_condition_release(a.c));
        nap(0.05);
    }
    assert_int_equal(atomic_load(a.woken), 1);
    nap(0.1);
    assert_int_equal(atomic_load(a.woken), 1); /* notify(1) woke one only */
    assert_mp_ok(mp_condition_acquire(a.c, 5));
    assert_mp_ok(mp_condition_notify_all(a.c));
    assert_mp_ok(mp_condition_release(a.c));
    for (int i = 0; i < N; i++)
        assert_int_equal(reap(pids[i]), 0);
    assert_int_equal(atomic_load(a.woken), N);
    mp_condition_destroy(a.c);
    munmap((void *)a.woken, 4096);
}

static bool flag_set(void *p) { return atomic_load((_Atomic int *)p) != 0; }

static void test_condition_wait_for(void **state)
{
    mp_condition *c;
    _Atomic int flag = 0;
    assert_mp_ok(mp_condition_create(&c));
    assert_mp_ok(mp_condition_acquire(c, 1));
    assert_mp_err(mp_condition_wait_for(c, flag_set, &flag, 0.03), MP_ETIMEDOUT);
    atomic_store(&flag, 1);
    assert_mp_ok(mp_condition_wait_for(c, flag_set, &flag, 0.03));
    assert_mp_ok(mp_condition_release(c));
    mp_condition_destroy(c);
}

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
    mp_barrier_destroy(a.b);
    munmap((void *)a.rounds, 4096);
}

static void test_barrier_timeout_abort_reset(void **state)
{
    mp_barrier *b;
    unsigned idx = 99;
    assert_mp_ok(mp_barrier_create(1, &b));
    assert_mp_ok(mp_barrier_wait(b, 0, &idx));
    assert_int_equal(idx, 0);
    mp_barrier_destroy(b);

    assert_mp_ok(mp_barrier_create(2, &b));
    assert_mp_err(mp_barrier_wait(b, 0.02, NULL), MP_ETIMEDOUT);
    assert_int_equal(mp_barrier_broken(b), 1);
    assert_mp_err(mp_barrier_wait(b, 1, NULL), MP_EBROKEN);
    assert_mp_ok(mp_barrier_reset(b));
    assert_int_equal(mp_barrier_broken(b), 0);
    assert_mp_ok(mp_barrier_abort(b));
    assert_mp_err(mp_barrier_wait(b, 1, NULL), MP_EBROKEN);
    assert_mp_ok(mp_barrier_reset(b));
    mp_barrier_destroy(b);
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
    mp_barrier_destroy(b);
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
    if (mp__wire_recv(sock, &m, mp__deadline(10)) != 0) {
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
    if (mp_lock_acquire(l, 10) != 0 || mp_semaphore_acquire(s, 0) != 0)
        goto out;
    mp_event_set(e);
    rc = mp_barrier_wait(b, 10, NULL) == 0 ? 0 : 13;
    mp_lock_release(l);
out:
    mp_lock_destroy(l);
    mp_event_destroy(e);
    mp_barrier_destroy(b);
    mp_semaphore_destroy(s);
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
    assert_mp_ok(mp_lock_acquire(l, 5));        /* and released the lock */
    assert_mp_ok(mp_lock_release(l));
    mp_lock_destroy(l);
    mp_event_destroy(e);
    mp_barrier_destroy(b);
    mp_semaphore_destroy(s);
    close(sv[0]);
    close(sv[1]);
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
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lock_mutual_exclusion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_misuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rlock_recursion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lock_owner_dead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rlock_owner_dead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_semaphore_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_semaphore_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event, setup, teardown),
        cmocka_unit_test_setup_teardown(test_condition, setup, teardown),
        cmocka_unit_test_setup_teardown(test_condition_wait_for, setup, teardown),
        cmocka_unit_test_setup_teardown(test_barrier_rounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_barrier_timeout_abort_reset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_barrier_member_killed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attachments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_faults, setup, teardown),
    };
    pthread_t th;
    (void)argc;
    (void)argv;
    /* glibc caches a joined thread's stack: make that mapping before the
     * leak snapshots, so tests that start a thread do not look leaky. */
    pthread_create(&th, NULL, release_lock_thread, NULL);
    pthread_join(th, NULL);
    /* Likewise the first allocations of a size (ASan's allocator maps
     * regions on first use). */
    mp_lock *warm;
    if (mp_lock_create(&warm) == 0) {
        mp_lock_acquire(warm, 0);
        mp_lock_release(warm);
        mp_lock_destroy(warm);
    }
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
