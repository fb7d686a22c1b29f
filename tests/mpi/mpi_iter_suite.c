/* More of the MPI layer's tests, run under mpirun by tests/mpi/run.sh as
 * mpi_suite is: the pool over ranks' lazy and async calls, and queues
 * across ranks as JoinableQueues. A failed check ends the job at once
 * (MPI_Abort) with its text.
 *
 *   imap       imap in order with a failing task in the middle (the
 *              iteration goes on), imap_unordered (each item once), an
 *              imap timeout (poll and timed) on a slow task, map_async with
 *              per-item access, starmap, an iterator dropped early and one
 *              that outlives its pool, map_array (array tasks and ordinary
 *              ones, a failing chunk, the async form)
 *   joinable   a JoinableQueue homed on rank 1: three ranks put, two take,
 *              qsize/empty, join timing out while messages are outstanding,
 *              task_done from two ranks ends the joins of two others, one
 *              task_done too many, a plain queue refuses task_done/join;
 *              what a cross-rank queue or conn cannot do (in a message,
 *              fileno, mp_wait: MP_ENOTSUP), mp_conn_poll, send_bytes and
 *              recv_bytes on an mp_mpi_pipe
 *   join_kill  rank 2 takes a message and is SIGKILLed while every other
 *              rank joins: each join errors out, the job ends non-zero
 *   raise_after_pool
 *              rank 1 serves pool tasks, then its entry calls mp_raise:
 *              still caught and reported with its text and exit code 1
 *              (a served task must not leave the entry's catcher unset)
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi_check.h"

#include <mproc/wait.h>

static mp_msg *int_msg(int64_t x)
{
    mp_msg *m = NULL;
    OK(mp_msg_create(&m));
    OK(mp_msg_set_payload(m, &x, sizeof x));
    return m;
}

static int64_t msg_int(const mp_msg *m)
{
    int64_t x = -1;
    size_t len = 0;
    const void *p = mp_msg_payload(m, &len);
    if (len == sizeof x)
        memcpy(&x, p, sizeof x);
    return x;
}

static void nap(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* x * x; x == 13 raises. */
MP_TASK(square)
{
    int64_t x = msg_int(in);
    if (x == 13)
        mp_raise("unlucky %lld", (long long)x);
    x *= x;
    return mp_msg_set_payload(out, &x, sizeof x);
}

/* Sleeps x milliseconds, answers x. */
MP_TASK(slow)
{
    int64_t x = msg_int(in);
    nap((double)x / 1000);
    return mp_msg_set_payload(out, &x, sizeof x);
}

/* starmap: the sum of its arguments' integers, and their count. */
MP_TASK(add)
{
    int n = mp_task_nargs(in);
    int64_t r[2] = {0, n};
    if (n < 0)
        return n;
    for (int j = 0; j < n; j++) {
        mp_msg *a = NULL;
        int rc = mp_task_arg(in, (size_t)j, &a);
        if (rc)
            return rc;
        r[0] += msg_int(a);
        mp_msg_destroy(a);
    }
    return mp_msg_set_payload(out, r, sizeof r);
}

static void imap_ordered(mp_pool *p, mp_msg **in, size_t n)
{
    mp_imap *it = NULL;
    mp_msg *o = NULL;
    size_t idx = 99;
    OK(mp_pool_imap(p, "square", (const mp_msg *const *)in, n, 0, &it));
    for (size_t i = 0; i < n; i++) {
        int rc = mp_imap_next(it, 30, &o, &idx);
        CHECK(idx == i, "imap index %zu, want %zu", idx, i);
        if (i == 13) {
            CHECK(rc == MP_ECHILD && o == NULL, "the raising item: %s", mp_err_name(rc));
            CHECK(strstr(mp_last_error(), "unlucky 13") && strstr(mp_last_error(), "rank"),
                  "its sentence: %s", mp_last_error());
            continue;
        }
        OK(rc);
        CHECK(msg_int(o) == (int64_t)(i * i), "imap item %zu: %lld", i, (long long)msg_int(o));
        mp_msg_destroy(o);
    }
    CHECK(mp_imap_next(it, 1, &o, &idx) == MP_ECLOSED, "after the last item");
    mp_imap_destroy(it);
}

static void imap_unordered(mp_pool *p, mp_msg **in, size_t n)
{
    mp_imap *it = NULL;
    mp_msg *o = NULL;
    int seen[64] = {0};
    OK(mp_pool_imap_unordered(p, "square", (const mp_msg *const *)in, n, 0, &it));
    for (size_t k = 0; k < n; k++) {
        size_t i = 99;
        int rc = mp_imap_next(it, 30, &o, &i);
        CHECK(i < n && seen[i]++ == 0, "unordered index %zu", i);
        CHECK(rc == (i == 13 ? MP_ECHILD : 0), "unordered item %zu: %s", i, mp_err_name(rc));
        if (rc == 0)
            CHECK(msg_int(o) == (int64_t)(i * i), "unordered item %zu", i);
        mp_msg_destroy(o), o = NULL;
    }
    CHECK(mp_imap_next(it, 0, &o, NULL) == MP_ECLOSED, "after the last item");
    mp_imap_destroy(it);
}

/* A slow item: next polls and times out, then waits for it. */
static void imap_timeout(mp_pool *p)
{
    mp_msg *in[2] = {int_msg(600), int_msg(1)}, *o = NULL;
    mp_imap *it = NULL;
    OK(mp_pool_imap(p, "slow", (const mp_msg *const *)in, 2, 0, &it));
    CHECK(mp_imap_next(it, 0, &o, NULL) == MP_ETIMEDOUT, "poll of a slow item");
    double t0 = MPI_Wtime();
    int rc = mp_imap_next(it, 0.1, &o, NULL);
    double dt = MPI_Wtime() - t0;
    CHECK(rc == MP_ETIMEDOUT && dt >= 0.09 && dt < 5, "timed next: %s after %.3f s",
          mp_err_name(rc), dt);
    OK(mp_imap_next(it, 30, &o, NULL));
    CHECK(msg_int(o) == 600, "the slow item");
    mp_msg_destroy(o);
    OK(mp_imap_next(it, 30, &o, NULL));
    CHECK(msg_int(o) == 1, "the quick item");
    mp_msg_destroy(o);
    mp_imap_destroy(it);
    mp_msg_destroy(in[0]), mp_msg_destroy(in[1]);
}

static void map_async_items(mp_pool *p, mp_msg **in, size_t n)
{
    mp_async_result *r = NULL;
    const mp_msg *o = NULL, *again = NULL;
    OK(mp_pool_map_async(p, "square", (const mp_msg *const *)in, n, 0, NULL, &r));
    CHECK(mp_async_result_count(r) == n, "count %zu", mp_async_result_count(r));
    CHECK(mp_async_result_get(r, 30, &o) == MP_ECHILD, "map_async get: the failed item");
    CHECK(strstr(mp_last_error(), "item 13") && strstr(mp_async_result_error(r), "unlucky"),
          "map_async error: %s / %s", mp_last_error(), mp_async_result_error(r));
    CHECK(mp_async_result_ready(r), "ready after get");
    for (size_t i = 0; i < n; i++) {
        int rc = mp_async_result_item(r, i, &o);
        CHECK(rc == (i == 13 ? MP_ECHILD : 0), "item %zu: %s", i, mp_err_name(rc));
        if (rc == 0)
            CHECK(msg_int(o) == (int64_t)(i * i), "map_async item %zu", i);
        o = NULL;
    }
    OK(mp_async_result_item(r, 0, &o));
    OK(mp_async_result_item(r, 0, &again));
    CHECK(o == again, "an item is borrowed: the same message each time");
    CHECK(mp_async_result_successful(r) == 0, "a failed item");
    CHECK(mp_async_result_item(r, n, &o) == MP_EINVAL, "an item out of range");
    mp_async_result_release(r);
}

static void starmap(mp_pool *p)
{
    enum { N = 10, K = 3 };
    mp_msg *args[N * K], *out[N];
    for (int i = 0; i < N * K; i++)
        args[i] = int_msg(i);
    OK(mp_pool_starmap(p, "add", (const mp_msg *const *)args, N, K, 0, out));
    for (int i = 0; i < N; i++) {
        int64_t r[2];
        memcpy(r, mp_msg_payload(out[i], NULL), sizeof r);
        CHECK(r[0] == 3 * i * K + 3 && r[1] == K, "starmap item %d: %lld/%lld", i,
              (long long)r[0], (long long)r[1]);
        mp_msg_destroy(out[i]);
    }
    CHECK(mp_pool_starmap(p, "add", (const mp_msg *const *)args, N, 0, 0, out) == MP_EINVAL,
          "nargs 0");
    CHECK(mp_pool_imap(p, "nosuch", (const mp_msg *const *)args, 1, 0, &(mp_imap *){0})
          == MP_ENOENT, "imap of an unknown task");
    for (int i = 0; i < N * K; i++)
        mp_msg_destroy(args[i]);
}

/* y = x * x over int64; x == 2^40 raises (fails its chunk). */
MP_ARRAY_TASK(squares)
{
    const int64_t *x = in;
    int64_t *y = out;
    for (size_t i = 0; i < n; i++) {
        if (x[i] == (int64_t)1 << 40)
            mp_raise("unlucky slice");
        y[i] = x[i] * x[i];
    }
    return 0;
}

/* An ordinary task whose answer is one byte too short for map_array. */
MP_TASK(short_answer)
{
    (void)in;
    return mp_msg_set_payload(out, "1234567", 7);
}

static void map_array(mp_pool *p)
{
    enum { N = 1000 };
    static int64_t x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = i - 500;
    size_t chunks[] = {0, 7, N + 5};
    for (size_t c = 0; c < 3; c++) {
        memset(y, 0, sizeof y);
        OK(mp_pool_map_array(p, "squares", x, N, 8, y, 8, chunks[c]));
        for (int i = 0; i < N; i++)
            CHECK(y[i] == x[i] * x[i], "array task, chunksize %zu, item %d", chunks[c], i);
    }
    /* An ordinary task item by item; item 513 (x = 13) raises and fails
     * its chunk of 10 (items 510..519), the others land. */
    memset(y, 0, sizeof y);
    int rc = mp_pool_map_array(p, "square", x, N, 8, y, 8, 10);
    CHECK(rc == MP_ECHILD && strstr(mp_last_error(), "chunk 51") &&
          strstr(mp_last_error(), "unlucky 13"), "a failing chunk: %s", mp_err_name(rc));
    for (int i = 0; i < N; i++)
        CHECK((i >= 510 && i < 520) || y[i] == x[i] * x[i], "task item by item: item %d", i);
    /* The async form: one item per chunk; an array task that raises. */
    mp_async_result *r = NULL;
    const mp_msg *o = NULL;
    mp_msg *om = NULL, *arg = NULL;
    x[700] = (int64_t)1 << 40;
    OK(mp_pool_map_array_async(p, "squares", x, N, 8, y, 8, 100, NULL, &r));
    CHECK(mp_async_result_count(r) == 10, "chunks %zu", mp_async_result_count(r));
    CHECK(mp_async_result_get(r, 30, &o) == MP_ECHILD && o == NULL, "async, raising chunk");
    CHECK(mp_async_result_item(r, 7, &o) == MP_ECHILD, "chunk 7 failed");
    OK(mp_async_result_item(r, 6, &o));
    CHECK(y[699] == 199 * 199, "a landed item");
    mp_async_result_release(r);
    x[700] = 200;
    CHECK(mp_pool_map_array(p, "short_answer", x, N, 8, y, 8, 0) == MP_EPROTO,
          "an answer of the wrong size");
    CHECK(mp_pool_map_array(p, "nosuch", x, N, 8, y, 8, 0) == MP_ENOENT, "unknown task");
    OK(mp_msg_create(&arg));
    CHECK(mp_pool_apply(p, "squares", arg, &om) == MP_ENOENT, "array task by apply");
    mp_msg_destroy(arg);
    OK(mp_pool_map_array(p, "squares", x, 0, 8, y, 8, 0));
}

MP_ENTRY(case_imap)
{
    enum { N = 30 };
    mp_pool *p = NULL;
    mp_msg *in[N], *o = NULL;
    OK(mp_mpi_pool_create(&p));
    if (rank != 0)
        return 0;
    for (int i = 0; i < N; i++)
        in[i] = int_msg(i);
    imap_ordered(p, in, N);
    imap_unordered(p, in, N);
    imap_timeout(p);
    map_async_items(p, in, N);
    starmap(p);
    map_array(p);
    /* Dropped early: its items still run and are dropped. */
    mp_imap *early = NULL, *late = NULL;
    OK(mp_pool_imap(p, "square", (const mp_msg *const *)in, N, 0, &early));
    OK(mp_imap_next(early, 30, &o, NULL));
    mp_msg_destroy(o);
    mp_imap_destroy(early);
    /* One that outlives its pool: destroy finishes its items first. */
    OK(mp_pool_imap_unordered(p, "square", (const mp_msg *const *)in, 5, 0, &late));
    mp_pool_destroy(p);
    for (int k = 0; k < 5; k++) {
        OK(mp_imap_next(late, 0, &o, NULL));
        mp_msg_destroy(o);
    }
    CHECK(mp_imap_next(late, 0, &o, NULL) == MP_ECLOSED, "after the pool's end");
    mp_imap_destroy(late);
    for (int i = 0; i < N; i++)
        mp_msg_destroy(in[i]);
    return 0;
}

static void take(mp_queue *q, int count)
{
    for (int i = 0; i < count; i++) {
        mp_msg *m = NULL;
        OK(mp_queue_get(q, &m, 30));
        mp_msg_destroy(m);
    }
}

/* What a queue shared by ranks cannot do as a local one does: each fails
 * with MP_ENOTSUP saying why (it cannot travel in a message, so neither to
 * a child process nor to another rank; it has no fd to poll). */
static void queue_limits(mp_queue *q)
{
    mp_msg *m = NULL;
    mp_queue *local = NULL;
    OK(mp_msg_create(&m));
    CHECK(mp_msg_add_queue(m, NULL, q) == MP_ENOTSUP && strstr(mp_last_error(), "MPI ranks"),
          "a cross-rank queue attached to a message");
    CHECK(mp_msg_count(m) == 0, "nothing attached");
    CHECK(mp_queue_fileno(q) == MP_ENOTSUP && strstr(mp_last_error(), "mp_queue_get"),
          "fileno of a cross-rank queue");
    mp_wait_item w = {.kind = MP_WAIT_QUEUE, .u.queue = q};
    CHECK(mp_wait(&w, 1, 0) == MP_ENOTSUP, "mp_wait on a cross-rank queue");
    CHECK(mp_queue_maxsize(q) == 0 && !mp_queue_full(q), "unbounded");
    OK(mp_queue_create(0, &local));
    CHECK(mp_mpi_queue_is_local(local) == MP_EINVAL, "is_local of a local queue");
    CHECK(mp_mpi_queue_is_local(NULL) == MP_EINVAL, "is_local of NULL");
    mp_queue_release(local);
    mp_msg_destroy(m);
}

/* A pipe between ranks 0-1 and 2-3 through the plain mp_conn calls. */
static void conn_calls(void)
{
    int peer = rank ^ 1;
    mp_conn *c = NULL, *a = NULL, *b = NULL;
    mp_msg *m = NULL;
    void *bytes = NULL;
    size_t len = 0;
    OK(mp_mpi_pipe(peer, &c));
    CHECK(mp_mpi_conn_is_local(c) == mp_mpi_is_local(peer), "is_local");
    CHECK(mp_conn_poll(c, 0) == 0, "poll of an empty conn");
    CHECK(mp_conn_recv(c, &m, 0) == MP_ETIMEDOUT, "recv poll of an empty conn");
    OK(mp_mpi_barrier());
    if (rank & 1) {
        nap(0.05);
        OK(mp_conn_send_bytes(c, "hello", 5, 30));
        OK(mp_conn_send_bytes(c, "again", 5, 30));
    } else {
        CHECK(mp_conn_poll(c, 30) == 1, "poll waits for the message");
        CHECK(mp_conn_poll(c, 0) == 1, "a poll does not take it");
        OK(mp_conn_recv_bytes(c, &bytes, &len, 30));
        CHECK(len == 5 && memcmp(bytes, "hello", 5) == 0, "the bytes");
        free(bytes);
        /* The second likely came while no receive was posted for it (a
         * receive is posted again at the next call): a poll still sees it.
         * It waits: a loaded machine may not have sent it yet. */
        nap(0.05);
        CHECK(mp_conn_poll(c, 10) == 1, "a message that came before the next receive");
        OK(mp_conn_recv_bytes(c, &bytes, &len, 0));
        CHECK(len == 5 && memcmp(bytes, "again", 5) == 0, "the second message's bytes");
        free(bytes);
        CHECK(mp_conn_poll(c, 0) == 0, "taken");
    }
    OK(mp_mpi_barrier()); /* no close before the poll above */
    OK(mp_msg_create(&m));
    CHECK(mp_msg_add_conn(m, NULL, c) == MP_ENOTSUP && strstr(mp_last_error(), "mp_mpi_pipe"),
          "a cross-rank conn attached to a message");
    CHECK(mp_conn_fileno(c) == MP_ENOTSUP, "fileno of a cross-rank conn");
    mp_wait_item w = {.kind = MP_WAIT_CONN, .u.conn = c};
    CHECK(mp_wait(&w, 1, 0) == MP_ENOTSUP, "mp_wait on a cross-rank conn");
    mp_msg_destroy(m);
    OK(mp_pipe(true, &a, &b));
    CHECK(mp_mpi_conn_is_local(a) == MP_EINVAL, "is_local of a local pipe");
    mp_conn_release(a), mp_conn_release(b);
    if (rank & 1) {
        OK(mp_conn_close(c));
        CHECK(mp_conn_send(c, NULL, 1) == MP_EINVAL, "NULL message");
    } else {
        CHECK(mp_conn_poll(c, 30) == 1, "the peer's close is ready to receive");
        CHECK(mp_conn_recv(c, &m, 0) == MP_ECLOSED, "then recv says closed");
    }
    mp_conn_release(c);
}

MP_ENTRY(case_joinable)
{
    enum { K = 20 };
    mp_queue *q = NULL, *plain = NULL;
    OK(mp_mpi_joinable_queue_create(1, &q));
    OK(mp_mpi_queue_create(0, &plain));
    CHECK(mp_queue_is_joinable(q) == 1 && mp_queue_is_joinable(plain) == 0, "joinable");
    CHECK(mp_queue_empty(q) == 1 && mp_queue_qsize(q) == 0, "a new queue is empty");
    queue_limits(q);
    conn_calls();
    OK(mp_mpi_barrier());
    if (rank >= 1 && rank <= 3)
        for (int i = 0; i < K; i++) {
            mp_msg *m = int_msg(rank * 100 + i);
            OK(mp_queue_put(q, m, 30));
            mp_msg_destroy(m);
        }
    OK(mp_mpi_barrier());
    CHECK(mp_queue_qsize(q) == 3 * K, "qsize %lld", (long long)mp_queue_qsize(q));
    CHECK(mp_queue_empty(q) == 0, "not empty");
    CHECK(mp_queue_join(q, 0) == MP_ETIMEDOUT, "join poll with messages outstanding");
    double t0 = MPI_Wtime();
    int rc = mp_queue_join(q, 0.05);
    CHECK(rc == MP_ETIMEDOUT && MPI_Wtime() - t0 >= 0.045, "timed join: %s after %.3f s",
          mp_err_name(rc), MPI_Wtime() - t0);
    OK(mp_mpi_barrier());
    if (rank == 0 || rank == 2)
        take(q, 3 * K / 2);
    OK(mp_mpi_barrier());
    CHECK(mp_queue_qsize(q) == 0 && mp_queue_empty(q) == 1, "drained");
    CHECK(mp_queue_join(q, 0) == MP_ETIMEDOUT, "taken but not task_done");
    if (rank == 0 || rank == 2)
        for (int i = 0; i < 3 * K / 2 - 1; i++)
            OK(mp_queue_task_done(q));
    OK(mp_mpi_barrier());
    CHECK(mp_queue_join(q, 0.05) == MP_ETIMEDOUT, "two still outstanding");
    OK(mp_mpi_barrier());
    if (rank == 0 || rank == 2) {
        nap(0.3);
        OK(mp_queue_task_done(q));
    } else {
        t0 = MPI_Wtime();
        OK(mp_queue_join(q, 30)); /* ends with the last two task_done */
        CHECK(MPI_Wtime() - t0 >= 0.2, "the join waited: %.3f s", MPI_Wtime() - t0);
    }
    OK(mp_queue_join(q, 30));
    OK(mp_mpi_barrier());
    if (rank == 3)
        CHECK(mp_queue_task_done(q) == MP_ESTATE, "task_done more than put");
    CHECK(mp_queue_task_done(plain) == MP_ESTATE, "task_done on a plain queue");
    CHECK(mp_queue_join(plain, 0) == MP_ESTATE, "join on a plain queue");
    CHECK(mp_queue_task_done(NULL) == MP_EINVAL, "NULL queue");
    OK(mp_mpi_barrier());
    mp_queue_release(plain);
    mp_queue_release(q);
    return 0;
}

MP_ENTRY(case_join_kill)
{
    mp_queue *q = NULL;
    OK(mp_mpi_joinable_queue_create(0, &q));
    if (rank == 0)
        for (int i = 0; i < 3; i++) {
            mp_msg *m = int_msg(i);
            OK(mp_queue_put(q, m, 30));
            mp_msg_destroy(m);
        }
    OK(mp_mpi_barrier());
    if (rank == 2) {
        take(q, 1);
        kill(getpid(), SIGKILL); /* dies holding a message it never marks done */
    }
    int rc = mp_queue_join(q, -1);
    CHECK(rc == MP_ECHILD, "join while a rank died: %s", mp_err_name(rc));
    mp_queue_release(q);
    return rc;
}

MP_ENTRY(case_raise_after_pool)
{
    enum { N = 12 };
    mp_pool *p = NULL;
    mp_msg *in[N], *out[N] = {0};
    OK(mp_mpi_pool_create(&p)); /* the other ranks serve until rank 0 destroys it */
    if (rank == 0) {
        /* 10 ms each: every worker is idle at the start, so each gets one */
        for (int i = 0; i < N; i++)
            in[i] = int_msg(10);
        OK(mp_pool_map(p, "slow", (const mp_msg *const *)in, N, 1, out));
        for (int i = 0; i < N; i++)
            mp_msg_destroy(in[i]), mp_msg_destroy(out[i]);
        mp_pool_destroy(p);
    }
    if (rank == 1)
        mp_raise("rank %d raised after serving a pool", rank);
    int rc = mp_mpi_barrier();
    CHECK(rc == MP_ECHILD, "barrier after rank 1 raised: %s", mp_err_name(rc));
    return rc;
}

int main(int argc, char **argv)
{
    return mpi_suite_main("mpi_iter_suite", argc, argv, NULL);
}
