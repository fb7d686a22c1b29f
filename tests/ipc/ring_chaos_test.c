/* Random SIGKILLs against one queue, then one pipe: producers and consumers
 * (plain fork children, several on each end) stream messages of three
 * kinds (16-byte payloads through the ring, 1000-byte payloads on the
 * socket with a mark, tensors with an fd) while the parent kills one of
 * them every few milliseconds and starts a replacement. Checked: no message
 * arrives twice, none is corrupted, each consumer sees each producer's
 * messages in order, none arrives that was never put, at most one message
 * is lost per consumer killed (the one it held), the survivors never
 * stall, and the parent leaks nothing.
 *
 * MP_CHAOS_SECONDS (default 2, per endpoint) sets the length, MP_CHAOS_SEED
 * the seed (printed, to reproduce a failure). ring_test kills at each
 * named step of the protocol; this one kills anywhere. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mp_test.h"
#include "os/os.h"

#define PRODUCERS 3
#define CONSUMERS 3
#define MAX_IDS 32768         /* producer ids over a run (a run ends when they are used up) */
#define SEQS (1u << 16)       /* messages per producer id, then it gets a new one */
#define BIG 1000              /* bytes: too big for a slot, so socket and mark */
#define ELEMS 8               /* a tensor message's uint32 elements */

typedef struct msg_head {
    uint32_t id, seq, kind;
} msg_head;

enum { KIND_SMALL, KIND_BIG, KIND_TENSOR };
enum { ERR_DUP, ERR_CORRUPT, ERR_ORDER, ERR_GET, ERR_PUT, ERR_NOMEM, NERR };
static const char *const err_names[NERR] = {"duplicates", "corrupted", "out of order",
                                            "get errors", "put errors", "out of memory"};

typedef struct chaos {
    _Atomic uint32_t stop;                      /* producers: finish now */
    _Atomic uint64_t err[NERR];
    _Alignas(64) _Atomic uint64_t taken[CONSUMERS * 8]; /* one line per consumer */
    _Alignas(64) _Atomic uint32_t sent[MAX_IDS][16]; /* [id][0]: put returned for seq < it */
    _Atomic uint64_t bits[MAX_IDS][SEQS / 64];  /* received (id, seq) */
} chaos;

static uint32_t kind_of(uint32_t seq)
{
    return seq % 61 == 7 ? KIND_TENSOR : seq % 7 == 3 ? KIND_BIG : KIND_SMALL;
}

static unsigned char pattern(uint32_t id, uint32_t seq, uint32_t i)
{
    return (unsigned char)(id * 131u + seq * 7u + i);
}

static mp_msg *build(uint32_t id, uint32_t seq)
{
    unsigned char buf[BIG];
    msg_head h = {id, seq, kind_of(seq)};
    size_t len = h.kind == KIND_BIG ? BIG : 16;
    mp_tensor *t = NULL;
    mp_msg *m = NULL;
    int64_t shape[1] = {ELEMS};
    for (uint32_t i = 0; i < len; i++)
        buf[i] = pattern(id, seq, i);
    memcpy(buf, &h, sizeof h);
    if (mp_msg_create(&m) || mp_msg_set_payload(m, buf, len))
        goto fail;
    if (h.kind == KIND_TENSOR) {
        uint32_t *d;
        if (mp_tensor_empty(MP_UINT32, 1, shape, &t))
            goto fail;
        d = mp_tensor_data(t);
        for (uint32_t k = 0; k < ELEMS; k++)
            d[k] = id ^ seq * 31u ^ k;
        if (mp_msg_add_tensor(m, "t", t))
            goto fail;
        mp_tensor_release(t);
    }
    return m;
fail:
    mp_tensor_release(t);
    mp_msg_destroy(m);
    return NULL;
}

static _Noreturn void produce(chaos *s, mp_test_ep *e, uint32_t id)
{
    if (e->rx)
        mp_conn_close(e->rx);
    for (uint32_t seq = 0; seq < SEQS && !atomic_load_explicit(&s->stop, memory_order_relaxed);
         seq++) {
        mp_msg *m = build(id, seq);
        int rc;
        if (!m) {
            atomic_fetch_add(&s->err[ERR_NOMEM], 1);
            _exit(1);
        }
        while ((rc = e->q ? mp_queue_put(e->q, m, 0.1) : mp_conn_send(e->tx, m, 0.1)) ==
                   MP_ETIMEDOUT &&
               !atomic_load_explicit(&s->stop, memory_order_relaxed))
            ;
        mp_msg_destroy(m);
        if (rc == MP_ETIMEDOUT)
            break;
        if (rc) {
            fprintf(stderr, "producer %u: %s\n", id, mp_last_error());
            atomic_fetch_add(&s->err[ERR_PUT], 1);
            _exit(1);
        }
        atomic_store_explicit(&s->sent[id][0], seq + 1, memory_order_release);
    }
    _exit(0);
}

/* Whether m is whole: its payload's pattern and its tensor's values. */
static bool intact(const mp_msg *m, msg_head *h)
{
    size_t len;
    const unsigned char *p = mp_msg_payload(m, &len);
    mp_tensor *t = NULL;
    bool ok;
    if (len < sizeof *h)
        return false;
    memcpy(h, p, sizeof *h);
    if (h->id >= MAX_IDS || h->seq >= SEQS || h->kind != kind_of(h->seq) ||
        len != (h->kind == KIND_BIG ? BIG : 16u) ||
        mp_msg_count(m) != (h->kind == KIND_TENSOR ? 1u : 0u))
        return false;
    for (uint32_t i = sizeof *h; i < len; i++)
        if (p[i] != pattern(h->id, h->seq, i))
            return false;
    if (h->kind != KIND_TENSOR)
        return true;
    ok = mp_msg_get_tensor(m, 0, &t) == 0 && mp_tensor_numel(t) == ELEMS;
    for (uint32_t k = 0; ok && k < ELEMS; k++)
        ok = ((const uint32_t *)mp_tensor_data(t))[k] == (h->id ^ h->seq * 31u ^ k);
    mp_tensor_release(t);
    return ok;
}

static _Noreturn void consume(chaos *s, mp_test_ep *e, int slot)
{
    static int32_t last[MAX_IDS];
    if (e->tx) /* the pipe's EOF comes once the parent closes its end */
        mp_conn_close(e->tx);
    for (uint32_t i = 0; i < MAX_IDS; i++)
        last[i] = -1;
    for (;;) {
        mp_msg *m = NULL;
        msg_head h;
        uint64_t bit, old;
        int rc = mp_test_ep_recv(e, &m, 0.2);
        if (rc == MP_ECLOSED)
            _exit(0);
        if (rc == MP_ETIMEDOUT)
            continue;
        if (rc) {
            fprintf(stderr, "consumer: %s\n", mp_last_error());
            atomic_fetch_add(&s->err[ERR_GET], 1);
            _exit(1);
        }
        if (!intact(m, &h)) {
            atomic_fetch_add(&s->err[ERR_CORRUPT], 1);
            mp_msg_destroy(m);
            continue;
        }
        mp_msg_destroy(m);
        if ((int32_t)h.seq <= last[h.id])
            atomic_fetch_add(&s->err[ERR_ORDER], 1);
        last[h.id] = (int32_t)h.seq;
        bit = 1ull << (h.seq % 64);
        old = atomic_fetch_or(&s->bits[h.id][h.seq / 64], bit);
        if (old & bit)
            atomic_fetch_add(&s->err[ERR_DUP], 1);
        atomic_fetch_add_explicit(&s->taken[slot * 8], 1, memory_order_relaxed);
    }
}

typedef struct run {
    chaos *s;
    mp_test_ep e;
    pid_t prod[PRODUCERS], cons[CONSUMERS];
    uint32_t next_id;
    int kills_p, kills_c, finished;
} run;

static void start_producer(run *r, int i)
{
    uint32_t id = r->next_id++;
    if ((r->prod[i] = fork()) == 0)
        produce(r->s, &r->e, id);
    assert_true(r->prod[i] > 0);
}

static void start_consumer(run *r, int i)
{
    if ((r->cons[i] = fork()) == 0)
        consume(r->s, &r->e, i);
    assert_true(r->cons[i] > 0);
}

/* Producers that reached SEQS exit 0: each gets a successor. */
static void replace_finished(run *r)
{
    for (int i = 0; i < PRODUCERS; i++) {
        int status;
        if (waitpid(r->prod[i], &status, WNOHANG) != r->prod[i])
            continue;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("producer pid %d ended with status 0x%x", (int)r->prod[i], status);
        r->finished++;
        start_producer(r, i);
    }
}

static void kill_one(run *r, unsigned *seed)
{
    int k = rand_r(seed) % (PRODUCERS + CONSUMERS), status;
    pid_t *pid = k < PRODUCERS ? &r->prod[k] : &r->cons[k - PRODUCERS];
    kill(*pid, SIGKILL);
    assert_int_equal(waitpid(*pid, &status, 0), *pid);
    if (k >= PRODUCERS) {
        if (!WIFSIGNALED(status))
            fail_msg("consumer pid %d ended with status 0x%x before its kill", (int)*pid, status);
        r->kills_c++;
        start_consumer(r, k - PRODUCERS);
    } else if (WIFSIGNALED(status)) {
        r->kills_p++;
        start_producer(r, k);
    } else { /* it finished just before the kill */
        if (WEXITSTATUS(status) != 0)
            fail_msg("producer pid %d ended with status 0x%x", (int)*pid, status);
        r->finished++;
        start_producer(r, k);
    }
}

static uint64_t taken_total(const chaos *s)
{
    uint64_t n = 0;
    for (int c = 0; c < CONSUMERS; c++)
        n += atomic_load(&s->taken[c * 8]);
    return n;
}

/* Kills until the end; fails when nothing was taken for 3 s. */
static void chaos_loop(run *r, double seconds, unsigned *seed)
{
    double end = mp__now() + seconds, progress_at = mp__now();
    uint64_t seen = 0;
    while (mp__now() < end) {
        uint64_t n;
        if (r->next_id + PRODUCERS + 1 >= MAX_IDS) { /* a round starts up to 4 */
            printf("chaos: producer ids used up: the run ends early\n");
            return;
        }
        nanosleep(&(struct timespec){0, (long)(rand_r(seed) % 4000) * 1000}, NULL);
        kill_one(r, seed);
        replace_finished(r);
        if ((n = taken_total(r->s)) != seen) {
            seen = n;
            progress_at = mp__now();
        } else if (mp__now() - progress_at > 3) {
            fail_msg("stalled: no message taken for 3 s (%llu taken so far)",
                     (unsigned long long)n);
        }
    }
}

/* The producers stop, the queue closes (the pipe's last sending end), the
 * consumers drain it and exit: each within DRAIN_S, or the test fails
 * saying which hung (a put or get that never returns after the kills). */
enum { DRAIN_S = 30 };

static void finish(run *r)
{
    atomic_store(&r->s->stop, 1);
    for (int i = 0; i < PRODUCERS; i++)
        mp_test_expect_exit0_within(r->prod[i], DRAIN_S, "chaos: a producer told to stop");
    if (r->e.q)
        assert_mp_ok(mp_queue_close(r->e.q));
    else
        assert_mp_ok(mp_conn_close(r->e.tx));
    for (int i = 0; i < CONSUMERS; i++)
        mp_test_expect_exit0_within(r->cons[i], DRAIN_S, "chaos: a consumer draining the "
                                                         "closed endpoint");
}

/* Every (id, seq) put was taken, except at most one per consumer killed;
 * nothing was taken that was never put. */
static void check(const run *r)
{
    uint64_t lost = 0, sent = 0;
    for (int e = 0; e < NERR; e++)
        if (atomic_load(&r->s->err[e]))
            fail_msg("%llu %s", (unsigned long long)atomic_load(&r->s->err[e]), err_names[e]);
    for (uint32_t id = 0; id < r->next_id; id++) {
        uint32_t n = atomic_load(&r->s->sent[id][0]);
        sent += n;
        for (uint32_t seq = 0; seq < SEQS; seq++) {
            bool got = atomic_load_explicit(&r->s->bits[id][seq / 64], memory_order_relaxed) >>
                           (seq % 64) & 1;
            if (seq < n && !got)
                lost++;
            if (seq > n && got) /* seq == n: put when its producer was killed */
                fail_msg("producer %u's message %u arrived but was never put (%u put)", id,
                         seq, n);
            if (seq > n + 64)
                break;
        }
    }
    printf("chaos: %u producers (%d ran to the end), %llu messages put, %llu taken, %d "
           "producers and %d consumers killed, %llu lost\n", r->next_id, r->finished,
           (unsigned long long)sent, (unsigned long long)taken_total(r->s), r->kills_p,
           r->kills_c, (unsigned long long)lost);
    if (lost > (uint64_t)r->kills_c)
        fail_msg("%llu messages lost, but only %d consumers were killed (at most one each)",
                 (unsigned long long)lost, r->kills_c);
}

static void random_kills(bool queue)
{
    const char *sec = getenv("MP_CHAOS_SECONDS"), *sd = getenv("MP_CHAOS_SEED");
    unsigned seed = sd ? (unsigned)strtoul(sd, NULL, 10)
                       : (unsigned)time(NULL) ^ (unsigned)getpid();
    run r = {0};
    printf("chaos: %s, MP_CHAOS_SEED=%u\n", queue ? "queue" : "pipe", seed);
    r.s = mmap(NULL, sizeof *r.s, PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(r.s != MAP_FAILED);
    mp_test_ep_open(&r.e, queue, false);
    for (int i = 0; i < CONSUMERS; i++)
        start_consumer(&r, i);
    for (int i = 0; i < PRODUCERS; i++)
        start_producer(&r, i);
    chaos_loop(&r, sec ? atof(sec) : 2.0, &seed);
    finish(&r);
    check(&r);
    mp_test_ep_close(&r.e);
    munmap(r.s, sizeof *r.s);
}

static void test_queue(void **state)
{
    (void)state;
    random_kills(true);
}

static void test_pipe(void **state)
{
    (void)state;
    random_kills(false);
}

static int setup(void **state) { return mp_test_setup_fd(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_queue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipe, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
