/* The ring beside the socket of pipes and queues (src/ipc/ring.c): order
 * per producer across the ring and the socket, exactly-once delivery with
 * several producers and consumers, a full ring, timeouts, EOF, readiness of
 * the fd (and none for a quiet end), MP_EMFILE, small messages taken
 * without the reader lock, and a producer or consumer
 * SIGKILLed at every step of the protocol (through the mp__ring_fault
 * hook). */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/ipc.h"
#include "mp_test.h"

static int setup(void **state) { return mp_test_setup_fd(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

/* ---- messages: who sent it, its number, and a kind chosen by the number -- */

enum { SMALL, TENSOR, BIG, EMPTY_TENSOR, KINDS };
typedef struct tag { uint32_t producer, seq; } tag;

static mp_msg *make(uint32_t producer, uint32_t seq, int kind)
{
    static unsigned char big[4096];
    tag t = {producer, seq};
    mp_tensor *x = NULL;
    mp_msg *m = NULL;
    int64_t shape[1] = {kind == EMPTY_TENSOR ? 0 : 4};
    assert_mp_ok(mp_msg_create(&m));
    memcpy(big, &t, sizeof t);
    assert_mp_ok(mp_msg_set_payload(m, big, kind == BIG ? sizeof big : sizeof t));
    if (kind == TENSOR || kind == EMPTY_TENSOR) {
        assert_mp_ok(mp_tensor_empty(MP_INT32, 1, shape, &x));
        if (kind == TENSOR)
            ((int32_t *)mp_tensor_data(x))[0] = (int32_t)seq;
        assert_mp_ok(mp_msg_add_tensor(m, "t", x));
        mp_tensor_release(x);
    }
    return m;
}

/* The tag of a received message, checking that its body matches. */
static int parse(mp_msg *m, tag *t)
{
    size_t len = 0;
    const void *p = mp_msg_payload(m, &len);
    mp_tensor *x = NULL;
    if (len < sizeof *t)
        return -1;
    memcpy(t, p, sizeof *t);
    if (mp_msg_count(m) == 1 && mp_msg_get_tensor(m, 0, &x) == 0) {
        bool ok = mp_tensor_numel(x) == 0 || ((int32_t *)mp_tensor_data(x))[0] == (int32_t)t->seq;
        mp_tensor_release(x);
        if (!ok)
            return -1;
    }
    return 0;
}

/* One endpoint under test: a queue, or a duplex pipe (send on tx, receive
 * on rx). */
typedef mp_test_ep ep;
static void ep_open(ep *e, bool queue) { mp_test_ep_open(e, queue, true); }
#define ep_close mp_test_ep_close
#define ep_send mp_test_ep_send

static int ep_recv(ep *e, tag *t, double timeout)
{
    mp_msg *m = NULL;
    int rc = mp_test_ep_recv(e, &m, timeout);
    if (rc == 0) {
        rc = parse(m, t);
        mp_msg_destroy(m);
    }
    return rc;
}

static int conn_send(mp_conn *c, mp_msg *m)
{
    int rc = mp_conn_send(c, m, 5);
    mp_msg_destroy(m);
    return rc;
}

static void *shared(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    return p;
}

/* An attachment without fds (an empty tensor) makes a frame that fits in a
 * slot, so the tests below cover the ring's frame slots too. */
static void test_kinds_take_their_paths(void **state)
{
    int fds[MP__WIRE_MAX_FDS], nfds = -1;
    void *buf = NULL;
    size_t len = 0;
    mp_msg *m = make(1, 0, EMPTY_TENSOR);
    (void)state;
    assert_mp_ok(mp__wire_encode(m, &buf, &len, fds, &nfds));
    assert_int_equal(nfds, 0);
    assert_true(len > 0 && len <= MP__RING_DATA);
    free(buf);
    mp_msg_destroy(m);
}

/* ---- order and exactly-once ------------------------------------------------- */

#define NMSG 3000   /* many times the ring */

static void order_one(bool queue)
{
    ep e;
    pid_t pid;
    ep_open(&e, queue);
    if ((pid = fork()) == 0) {
        for (uint32_t i = 0; i < NMSG; i++)
            if (ep_send(&e, make(1, i, (int)(i * 7 % 11) % KINDS), 10))
                _exit(1);
        _exit(0);
    }
    for (uint32_t i = 0; i < NMSG; i++) {
        tag t;
        assert_mp_ok(ep_recv(&e, &t, 10));
        assert_int_equal(t.seq, i);
    }
    assert_int_equal(mp_test_reap(pid), 0);
    ep_close(&e);
}

static void test_order_pipe(void **state) { (void)state; order_one(false); }
static void test_order_queue(void **state) { (void)state; order_one(true); }

#define NP 4
#define NC 3
#define PER 600

/* NP producer and NC consumer processes on one endpoint: every message
 * arrives once, and each consumer sees each producer's messages in order. */
static void mpmc(bool queue)
{
    int *got = shared(sizeof(int) * NP * PER + sizeof(int));
    int *bad = got + NP * PER;
    pid_t pids[NP + NC];
    ep e;
    ep_open(&e, queue);
    for (int c = 0; c < NC; c++)
        if ((pids[NP + c] = fork()) == 0) {
            int64_t last[NP];
            tag t;
            for (int p = 0; p < NP; p++)
                last[p] = -1;
            while (ep_recv(&e, &t, 30) == 0 && t.producer < NP) {
                if ((int64_t)t.seq <= last[t.producer] || t.seq >= PER)
                    __atomic_store_n(bad, 1, __ATOMIC_SEQ_CST);
                else
                    __atomic_add_fetch(&got[t.producer * PER + t.seq], 1, __ATOMIC_SEQ_CST);
                last[t.producer] = t.seq;
            }
            _exit(t.producer == NP ? 0 : 1);
        }
    for (int p = 0; p < NP; p++)
        if ((pids[p] = fork()) == 0) {
            for (uint32_t i = 0; i < PER; i++)
                if (ep_send(&e, make((uint32_t)p, i, (int)(i + (uint32_t)p) % KINDS), 30))
                    _exit(1);
            _exit(0);
        }
    for (int p = 0; p < NP; p++)
        assert_int_equal(mp_test_reap(pids[p]), 0);
    for (int c = 0; c < NC; c++)
        assert_mp_ok(ep_send(&e, make(NP, 0, SMALL), 10));
    for (int c = 0; c < NC; c++)
        assert_int_equal(mp_test_reap(pids[NP + c]), 0);
    assert_int_equal(*bad, 0);
    for (int i = 0; i < NP * PER; i++)
        assert_int_equal(got[i], 1);
    munmap(got, sizeof(int) * NP * PER + sizeof(int));
    ep_close(&e);
}

static void test_mpmc_pipe(void **state) { (void)state; mpmc(false); }
static void test_mpmc_queue(void **state) { (void)state; mpmc(true); }

/* ---- full ring, timeouts, EOF, readiness ------------------------------------- */

static void test_full_and_timeouts(void **state)
{
    ep e;
    tag t;
    double t0;
    int n = 0, rc;
    (void)state;
    for (int queue = 0; queue < 2; queue++) {
        ep_open(&e, queue);
        assert_mp_err(ep_recv(&e, &t, 0), MP_ETIMEDOUT);
        t0 = mp__now();
        assert_mp_err(ep_recv(&e, &t, 0.05), MP_ETIMEDOUT);
        assert_true(mp__now() - t0 >= 0.045);
        for (n = 0; (rc = ep_send(&e, make(1, (uint32_t)n, SMALL), 0)) == 0; n++)
            ;
        assert_mp_err(rc, MP_ETIMEDOUT);
        assert_int_equal(n, MP__RING_SLOTS);
        t0 = mp__now();
        assert_mp_err(ep_send(&e, make(1, 0, SMALL), 0.05), MP_ETIMEDOUT);
        assert_true(mp__now() - t0 >= 0.045);
        assert_mp_ok(ep_recv(&e, &t, 0));
        assert_int_equal(t.seq, 0);
        assert_mp_ok(ep_send(&e, make(1, (uint32_t)n, SMALL), 0));
        for (int i = 1; i <= n; i++) {
            assert_mp_ok(ep_recv(&e, &t, 0));
            assert_int_equal(t.seq, (uint32_t)i);
        }
        ep_close(&e);
    }
}

/* The reader learns that every writer is gone once it took what they sent;
 * a writer learns that the reader is gone. */
static void test_eof(void **state)
{
    mp_conn *r = NULL, *w = NULL;
    mp_msg *m = NULL;
    pid_t pid;
    int rc = 0, i;
    (void)state;
    assert_mp_ok(mp_pipe(false, &r, &w));
    if ((pid = fork()) == 0) {
        for (uint32_t k = 0; k < 10; k++)
            if (conn_send(w, make(1, k, (int)k % KINDS)))
                _exit(1);
        _exit(0);
    }
    mp_conn_close(w);
    assert_int_equal(mp_test_reap(pid), 0);
    for (i = 0; i < 10; i++) {
        assert_mp_ok(mp_conn_recv(r, &m, 5));
        mp_msg_destroy(m);
    }
    assert_mp_err(mp_conn_recv(r, &m, 5), MP_ECLOSED);
    mp_conn_release(r);
    mp_conn_release(w);
    assert_mp_ok(mp_pipe(false, &r, &w));
    mp_conn_close(r);
    for (i = 0; i <= 64 && (rc = conn_send(w, make(1, 0, SMALL))) == 0; i++)
        ;
    assert_mp_err(rc, MP_ECLOSED);
    mp_conn_release(r);
    mp_conn_release(w);
}

/* A user polling the fd wakes when a ring message arrives (also one sent
 * before the fd was asked for), and a message taken leaves mp_conn_poll /
 * mp_wait answering "not ready". */
static void test_fd_readiness(void **state)
{
    (void)state;
    for (int queue = 0; queue < 2; queue++) {
        ep e;
        tag t;
        pid_t pid;
        struct pollfd p = {.events = POLLIN};
        ep_open(&e, queue);
        p.fd = queue ? mp_queue_fileno(e.q) : mp_conn_fileno(e.rx);
        /* sent before anyone polled: readable all the same */
        assert_int_equal(poll(&p, 1, 0), 0);
        assert_mp_ok(ep_send(&e, make(1, 9, SMALL), 5));
        assert_int_equal(poll(&p, 1, 0), 1);
        assert_mp_ok(ep_recv(&e, &t, 0));
        assert_int_equal(t.seq, 9);
        for (int round = 0; round < 3; round++) {
            if ((pid = fork()) == 0) {
                usleep(50000);
                _exit(ep_send(&e, make(1, (uint32_t)round, SMALL), 5) ? 1 : 0);
            }
            assert_int_equal(poll(&p, 1, 10000), 1);
            assert_mp_ok(ep_recv(&e, &t, 0));
            assert_int_equal(t.seq, (uint32_t)round);
            assert_int_equal(mp_test_reap(pid), 0);
            if (queue)
                assert_int_equal(mp__queue_poll((mp__queue *)e.q), 0);
            else
                assert_int_equal(mp_conn_poll(e.rx, 0), 0);
        }
        ep_close(&e);
    }
}

static void put_one(mp_queue *q, uint32_t seq)
{
    mp_msg *m = make(1, seq, SMALL);
    assert_mp_ok(mp_queue_put(q, m, 0));
    mp_msg_destroy(m);
}

static void get_one(mp_queue *q, uint32_t seq)
{
    mp_msg *m = NULL;
    tag t;
    assert_mp_ok(mp_queue_get(q, &m, 0));
    assert_int_equal(parse(m, &t), 0);
    assert_int_equal(t.seq, seq);
    mp_msg_destroy(m);
}

/* A queue rings no doorbell until its fd is handed out (nobody can poll it
 * before): a put leaves its socket empty. Handing the fd out makes it
 * readable at once for the message already waiting, and every later put
 * into an empty queue rings; mp_wait hands it out too. */
static void test_queue_bells_once_polled(void **state)
{
    struct pollfd p = {.events = POLLIN};
    mp_queue *q = NULL;
    mp_simple_queue *sq = NULL;
    (void)state;
    for (int simple = 0; simple < 2; simple++) {
        if (simple) {
            assert_mp_ok(mp_simple_queue_create(&sq));
            q = (mp_queue *)sq; /* the same object underneath (put_one, get_one) */
        } else {
            assert_mp_ok(mp_queue_create(0, &q));
        }
        p.fd = ((mp__queue *)q)->rsock; /* looked at without handing it out */
        put_one(q, 0);
        put_one(q, 1);
        assert_int_equal(poll(&p, 1, 0), 0); /* no doorbell */
        assert_int_equal(simple ? mp_simple_queue_fileno(sq) : mp_queue_fileno(q), p.fd);
        assert_int_equal(poll(&p, 1, 0), 1); /* rung for the messages waiting */
        get_one(q, 0);
        get_one(q, 1);
        assert_int_equal(poll(&p, 1, 0), 0); /* its bell dropped with the last */
        put_one(q, 2);
        assert_int_equal(poll(&p, 1, 0), 1); /* bells on for good */
        get_one(q, 2);
        assert_int_equal(poll(&p, 1, 0), 0);
        if (simple)
            mp_simple_queue_release(sq);
        else
            mp_queue_release(q);
    }
    assert_mp_ok(mp_queue_create(0, &q));
    p.fd = ((mp__queue *)q)->rsock;
    put_one(q, 0);
    mp_wait_item it = {.kind = MP_WAIT_QUEUE, .u.queue = q};
    assert_int_equal(mp_wait(&it, 1, 0), 1);
    assert_int_equal(poll(&p, 1, 0), 1);
    get_one(q, 0);
    mp_queue_release(q);
}

/* A quiet end (mp__conn_quiet: nobody polls it, as under an MPI conn) gets
 * no doorbell for a ring message, yet receives every message in order, and
 * a receiver asleep in mp_conn_recv is still woken; the other end of the
 * same pipe keeps its doorbells. */
static void test_quiet_end_rings_no_bell(void **state)
{
    mp_conn *a = NULL, *b = NULL;
    struct pollfd pa = {.events = POLLIN}, pb = {.events = POLLIN};
    mp_msg *m = NULL;
    tag t;
    pid_t pid;
    (void)state;
    assert_mp_err(mp__conn_quiet(NULL), MP_EINVAL);
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp__conn_quiet(b));
    pa.fd = mp_conn_fileno(a), pb.fd = mp_conn_fileno(b);
    for (uint32_t i = 0; i < 3; i++)
        assert_mp_ok(conn_send(a, make(1, i, SMALL)));
    assert_int_equal(poll(&pb, 1, 0), 0); /* no doorbell on the socket */
    assert_mp_ok(conn_send(b, make(2, 0, SMALL)));
    assert_int_equal(poll(&pa, 1, 0), 1);           /* the other end's still rings */
    assert_mp_ok(conn_send(a, make(1, 3, TENSOR))); /* its fd takes the socket */
    for (uint32_t i = 0; i < 4; i++) {
        assert_mp_ok(mp_conn_recv(b, &m, 0));
        assert_int_equal(parse(m, &t), 0);
        assert_int_equal(t.seq, i);
        mp_msg_destroy(m);
    }
    assert_mp_err(mp_conn_recv(b, &m, 0), MP_ETIMEDOUT);
    if ((pid = fork()) == 0) {
        usleep(100000); /* past the receiver's spin: it sleeps on the ring */
        _exit(conn_send(a, make(1, 4, SMALL)) ? 1 : 0);
    }
    assert_mp_ok(mp_conn_recv(b, &m, 10));
    assert_int_equal(parse(m, &t), 0);
    assert_int_equal(t.seq, 4);
    mp_msg_destroy(m);
    assert_int_equal(mp_test_reap(pid), 0);
    assert_mp_ok(mp_conn_recv(a, &m, 0));
    mp_msg_destroy(m);
    mp_conn_release(a);
    mp_conn_release(b);
}

/* mp__conn_waiting and mp__queue_waiting (what the MPI layer looks at
 * before it tries a receive without a clock) count every message the
 * ring orders, marks of socket records included, for the receiving end
 * only. */
static void test_waiting_counts(void **state)
{
    mp_conn *a = NULL, *b = NULL;
    mp_queue *q = NULL;
    mp_msg *m = NULL;
    (void)state;
    assert_int_equal(mp__conn_waiting(NULL), 0);
    assert_int_equal(mp__queue_waiting(NULL), 0);
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_int_equal(mp__conn_waiting(b), 0);
    assert_mp_ok(conn_send(a, make(1, 0, SMALL)));
    assert_mp_ok(conn_send(a, make(1, 1, TENSOR)));
    assert_mp_ok(conn_send(a, make(1, 2, BIG)));
    assert_int_equal(mp__conn_waiting(b), 3);
    assert_int_equal(mp__conn_waiting(a), 0); /* a's own receiving ring */
    assert_mp_ok(mp_conn_recv(b, &m, 0));
    mp_msg_destroy(m);
    assert_int_equal(mp__conn_waiting(b), 2);
    assert_mp_ok(mp_queue_create(0, &q));
    m = make(1, 0, SMALL);
    assert_mp_ok(mp_queue_put(q, m, 0));
    mp_msg_destroy(m);
    assert_int_equal(mp__queue_waiting((mp__queue *)q), 1);
    assert_mp_ok(mp_queue_get(q, &m, 0));
    mp_msg_destroy(m);
    assert_int_equal(mp__queue_waiting((mp__queue *)q), 0);
    mp_queue_release(q);
    mp_conn_release(a);
    mp_conn_release(b);
}

/* A message with fds that cannot be installed stays at its place: what was
 * sent after it waits, and arrives after it once the limit is raised. */
static void test_emfile_keeps_order(void **state)
{
    struct rlimit old, low;
    ep e;
    tag t;
    int fd = 0, free_slots = 1;
    (void)state;
    ep_open(&e, false);
    assert_mp_ok(ep_send(&e, make(1, 0, TENSOR), 5));
    assert_mp_ok(ep_send(&e, make(1, 1, SMALL), 5));
    for (; free_slots > 0; fd++)
        if (fcntl(fd, F_GETFD) < 0)
            free_slots--;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)fd - 1; /* no fd number left */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    assert_mp_err(ep_recv(&e, &t, 0), MP_EMFILE);
    assert_mp_err(ep_recv(&e, &t, 0), MP_EMFILE);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    assert_mp_ok(ep_recv(&e, &t, 0));
    assert_int_equal(t.seq, 0);
    assert_mp_ok(ep_recv(&e, &t, 0));
    assert_int_equal(t.seq, 1);
    ep_close(&e);
}

/* ---- SIGKILL at every step ------------------------------------------------- */

static int kill_step, kill_left;
static void killer(int step)
{
    if (step == kill_step && --kill_left == 0)
        raise(SIGKILL);
}

/* ---- small messages without the reader lock ----------------------------------- */

/* A payload alone is taken without the reader lock (mp__ring_take), so a
 * consumer does not wait behind another that holds it, asleep in a receive
 * say. A message that needs the lock still waits, and one behind it too:
 * the ring's order holds. */
static void test_small_messages_skip_the_reader_lock(void **state)
{
    mp__rx *rx;
    tag t;
    ep e;
    (void)state;
    ep_open(&e, true);
    rx = &e.q->q.ctl->rx;
    assert_mp_ok(mp__rx_lock(rx, -1, "ring_test"));
    assert_mp_ok(ep_send(&e, make(1, 0, SMALL), 5));
    assert_mp_ok(ep_recv(&e, &t, 0));
    assert_int_equal(t.seq, 0);
    assert_mp_ok(ep_send(&e, make(1, 1, TENSOR), 5));
    assert_mp_ok(ep_send(&e, make(1, 2, SMALL), 5));
    assert_mp_err(ep_recv(&e, &t, 0), MP_ETIMEDOUT);
    assert_mp_err(ep_recv(&e, &t, 0.05), MP_ETIMEDOUT);
    mp__rx_unlock(rx);
    for (uint32_t i = 1; i <= 2; i++) {
        assert_mp_ok(ep_recv(&e, &t, 0));
        assert_int_equal(t.seq, i);
    }
    ep_close(&e);
}

/* Ring and socket messages mixed, so every step happens at least 3 times. */
static const int kinds[] = {SMALL, TENSOR, SMALL, BIG, TENSOR, SMALL, EMPTY_TENSOR, TENSOR};
#define NK ((uint32_t)(sizeof kinds / sizeof kinds[0]))

/* Receives until the endpoint stays empty: producer 1's numbers into seqs. */
static int drain(ep *e, uint32_t *seqs, uint32_t *n, int *other)
{
    tag t;
    int rc;
    while ((rc = ep_recv(e, &t, 0.5)) == 0) {
        if (t.producer == 1)
            seqs[(*n)++] = t.seq;
        else if (*n > NK || (uint32_t)*other != t.seq)
            return -1; /* the second producer's, in order, after the first's */
        else
            ++*other;
    }
    return rc;
}

/* The child sends kinds[] and is killed at the 3rd time it reaches step.
 * What it published arrives once and in order (an orphaned socket record
 * too), what it did not never does, and a second producer is not held up. */
static void producer_killed(bool queue, int step)
{
    volatile uint32_t *cur = shared(4096);
    uint32_t seqs[2 * NK], n = 0, k;
    int other = 0, status;
    bool delivered;
    pid_t pid;
    ep e;
    ep_open(&e, queue);
    if ((pid = fork()) == 0) {
        mp__ring_fault = killer;
        kill_step = step;
        kill_left = 3;
        for (uint32_t i = 0; i < NK; i++) {
            *cur = i;
            if (ep_send(&e, make(1, i, kinds[i]), 5))
                _exit(1);
        }
        _exit(0);
    }
    status = mp_test_reap(pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    k = *cur;
    assert_mp_ok(ep_send(&e, make(2, 0, TENSOR), 5));
    assert_mp_ok(ep_send(&e, make(2, 1, SMALL), 5));
    assert_mp_err(drain(&e, seqs, &n, &other), MP_ETIMEDOUT);
    assert_int_equal(other, 2);
    delivered = step == MP__RING_STEP_PUBLISHED || step == MP__RING_STEP_UNLOCKED ||
                step == MP__RING_STEP_SENT;
    if (n != k + delivered)
        fail_msg("step %d, killed sending #%u: %u messages arrived", step, k, n);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(seqs[i], i);
    munmap((void *)cur, 4096);
    ep_close(&e);
}

static void test_producer_killed_at_every_step(void **state)
{
    static const int steps[] = {MP__RING_STEP_LOCKED, MP__RING_STEP_FILLED,
                                MP__RING_STEP_PUBLISHED, MP__RING_STEP_UNLOCKED,
                                MP__RING_STEP_TAGGED, MP__RING_STEP_SENT};
    (void)state;
    for (int queue = 0; queue < 2; queue++)
        for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++)
            producer_killed(queue, steps[i]);
}

/* The child receives and is killed at the 2nd time it reaches step: it
 * loses at most the message it held, every other arrives once, in order. */
static void consumer_killed(bool queue, int step, uint32_t lost)
{
    uint32_t *log = shared(4096), seqs[2 * NK], n = 0;
    int other = 0, status;
    bool sleeping = step == MP__RING_STEP_SLEEPING;
    pid_t pid;
    ep e;
    ep_open(&e, queue);
    for (uint32_t i = 0; i < NK && !sleeping; i++)
        assert_mp_ok(ep_send(&e, make(1, i, kinds[i]), 5));
    if ((pid = fork()) == 0) {
        tag t;
        mp__ring_fault = killer;
        kill_step = step;
        kill_left = sleeping ? 1 : 2;
        while (ep_recv(&e, &t, 5) == 0)
            log[++log[0]] = t.seq;
        _exit(0);
    }
    status = mp_test_reap(pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    for (uint32_t i = 0; i < NK && sleeping; i++)
        assert_mp_ok(ep_send(&e, make(1, i, kinds[i]), 5));
    assert_mp_err(drain(&e, seqs, &n, &other), MP_ETIMEDOUT);
    if (log[0] + n + lost != NK)
        fail_msg("step %d: the killed consumer took %u, the next %u of %u", step, log[0], n,
                 NK);
    for (uint32_t i = 0; i < log[0]; i++)
        assert_int_equal(log[1 + i], i);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(seqs[i], log[0] + lost + i);
    munmap(log, 4096);
    ep_close(&e);
}

static void test_consumer_killed_at_every_step(void **state)
{
    (void)state;
    for (int queue = 0; queue < 2; queue++) {
        consumer_killed(queue, MP__RING_STEP_COPIED, 0);
        consumer_killed(queue, MP__RING_STEP_TAKEN, 1);
        consumer_killed(queue, MP__RING_STEP_MARK_RECEIVED, 1);
        consumer_killed(queue, MP__RING_STEP_SLEEPING, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kinds_take_their_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_pipe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mpmc_pipe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mpmc_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_and_timeouts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_eof, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_readiness, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quiet_end_rings_no_bell, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_bells_once_polled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_waiting_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_emfile_keeps_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_messages_skip_the_reader_lock, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_producer_killed_at_every_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_consumer_killed_at_every_step, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
