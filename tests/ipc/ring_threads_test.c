/* Threads sharing one endpoint: 4 producer and 4 consumer threads on a
 * queue and on a pipe end, ring and socket messages mixed, among them a
 * shared tensor per producer sent again and again (pinned by the end: the
 * compact records, taken by whichever consumer thread comes). Every message
 * arrives once, and each consumer sees each producer's messages in order.
 * Also built with ThreadSanitizer (tests/ipc/tsan.cmake). Calls wait
 * forever (CTest's timeout catches a hang): TSan does not intercept
 * pthread_mutex_clocklock, which timed waits use, and would report its
 * unlock as one of an unlocked mutex. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "mp_test.h"

static int setup(void **state) { return mp_test_setup_fd(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

#define NP 4
#define NC 4
#define PER 400

typedef struct shared {
    mp_queue *q;
    mp_conn *rx, *tx;
    mp_tensor *reused[NP]; /* one shared tensor per producer, sent repeatedly */
    _Atomic int got[NP * PER];
    _Atomic int bad;
} shared;

typedef struct arg {
    shared *s;
    uint32_t id;
} arg;

static int put(shared *s, uint32_t producer, uint32_t seq)
{
    static const char big[1024];
    uint32_t t[2] = {producer, seq};
    mp_msg *m = NULL;
    int rc = mp_msg_create(&m);
    if (rc == 0 && seq % 5 == 3) {
        char b[sizeof big];
        memcpy(b, big, sizeof b);
        memcpy(b, t, sizeof t);
        rc = mp_msg_set_payload(m, b, sizeof b);
    } else if (rc == 0) {
        rc = mp_msg_set_payload(m, t, sizeof t);
    }
    if (rc == 0 && seq % 7 == 2) {
        int64_t shape[1] = {2};
        mp_tensor *x = NULL;
        if ((rc = mp_tensor_empty(MP_INT32, 1, shape, &x)) == 0)
            rc = mp_msg_add_tensor(m, NULL, x);
        mp_tensor_release(x);
    } else if (rc == 0 && seq % 3 == 1 && producer < NP) {
        rc = mp_msg_add_tensor(m, "r", s->reused[producer]);
    }
    if (rc == 0)
        rc = s->q ? mp_queue_put(s->q, m, -1) : mp_conn_send(s->tx, m, -1);
    mp_msg_destroy(m);
    return rc;
}

static void *producer(void *p)
{
    arg *a = p;
    for (uint32_t i = 0; i < PER; i++)
        if (put(a->s, a->id, i))
            atomic_store(&a->s->bad, 1);
    return NULL;
}

static void *consumer(void *p)
{
    arg *a = p;
    int64_t last[NP];
    for (int i = 0; i < NP; i++)
        last[i] = -1;
    for (;;) {
        mp_msg *m = NULL;
        uint32_t t[2];
        size_t len = 0;
        const void *b;
        int rc = a->s->q ? mp_queue_get(a->s->q, &m, -1) : mp_conn_recv(a->s->rx, &m, -1);
        if (rc) {
            atomic_store(&a->s->bad, 1);
            return NULL;
        }
        b = mp_msg_payload(m, &len);
        memcpy(t, b, sizeof t);
        mp_msg_destroy(m);
        if (t[0] == NP)
            return NULL;
        if (t[0] > NP || t[1] >= PER || (int64_t)t[1] <= last[t[0]])
            atomic_store(&a->s->bad, 1);
        else
            atomic_fetch_add(&a->s->got[t[0] * PER + t[1]], 1);
        last[t[0]] = t[1];
    }
}

static void run(shared *s)
{
    pthread_t th[NP + NC];
    arg args[NP + NC];
    int64_t n = 256;
    mp_tensor_stats before = {.size = sizeof before}, after = {.size = sizeof after};
    assert_mp_ok(mp_tensor_stats_get(&before));
    for (int i = 0; i < NP; i++)
        assert_mp_ok(mp_tensor_empty_shared(MP_UINT8, 1, &n, &s->reused[i]));
    for (int i = 0; i < NP + NC; i++) {
        args[i] = (arg){s, (uint32_t)(i < NP ? i : i - NP)};
        assert_int_equal(pthread_create(&th[i], NULL, i < NP ? producer : consumer, &args[i]),
                         0);
    }
    for (int i = 0; i < NP; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < NC; i++)
        assert_mp_ok(put(s, NP, 0));
    for (int i = NP; i < NP + NC; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&s->bad), 0);
    for (int i = 0; i < NP * PER; i++)
        assert_int_equal(atomic_load(&s->got[i]), 1);
    for (int i = 0; i < NP; i++)
        mp_tensor_release(s->reused[i]);
    /* the reused tensors came by their pins (compact records); not all of
     * them: a producer kept off the CPU while the others send 1024 messages
     * finds its pin let go as idle, and sends by fd until it is pinned again */
    assert_mp_ok(mp_tensor_stats_get(&after));
    assert_true(after.segments_received_by_pin > before.segments_received_by_pin);
}

static void test_queue_threads(void **state)
{
    static shared s;
    (void)state;
    memset(&s, 0, sizeof s);
    assert_mp_ok(mp_queue_create(0, &s.q));
    run(&s);
    mp_queue_release(s.q);
}

static void test_pipe_threads(void **state)
{
    static shared s;
    (void)state;
    memset(&s, 0, sizeof s);
    assert_mp_ok(mp_pipe(false, &s.rx, &s.tx));
    run(&s);
    mp_conn_release(s.rx);
    mp_conn_release(s.tx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_queue_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipe_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
