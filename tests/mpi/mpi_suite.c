/* The MPI layer's tests, run under mpirun by tests/mpi/run.sh (one ctest
 * per case and transport). Every rank runs the case named by argv[1]; a
 * failed check ends the job at once (MPI_Abort) with the check's text, so
 * a broken rank never leaves the others waiting.
 *
 *   roundtrip  tensors of 0 B .. 64 MiB (plus 0-d, strided, named, several
 *              per message) to a partner rank and back, bytes checked;
 *              timeouts; close; host-local objects; a peer that closes
 *              without taking a large message
 *   alltoall   every rank sends to every other at once (MPMC over pipes):
 *              each message arrives once, in order per sender
 *   allreduce  sum and mean of float32/float64/int32 tensors
 *   raise      rank 1's entry calls mp_raise: rank 0 reports it
 *   kill       rank 2 SIGKILLs itself mid-run: every rank errors out
 *   queue      one queue, every rank a producer and a consumer (MPMC):
 *              each message taken exactly once, FIFO per producer
 *   queue_full puts to a full queue: poll, timeout, wait forever
 *   pool       a pool over ranks: map, apply with a tensor, per-task failure
 *   host_lost  (tests/mpi/hosts.sh) rank 1 takes its host off the network
 *              while rank 0 waits for its message: the job still ends
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi_check.h"

/* Sentence check: mp_last_error() equals want. */
#define SAYS(want) CHECK(!strcmp(mp_last_error(), want), "said: %s", mp_last_error())

static mp_tensor *pattern_tensor(int64_t nbytes, unsigned seed)
{
    mp_tensor *t = NULL;
    OK(mp_tensor_empty(MP_UINT8, 1, &nbytes, &t));
    unsigned char *p = mp_tensor_data(t);
    for (int64_t i = 0; i < nbytes; i++)
        p[i] = (unsigned char)(i * 31 + seed);
    return t;
}

static void check_pattern(mp_tensor *t, int64_t nbytes, unsigned seed)
{
    const unsigned char *p = mp_tensor_data(t);
    CHECK(mp_tensor_numel(t) == nbytes, "numel %lld want %lld", (long long)mp_tensor_numel(t),
          (long long)nbytes);
    for (int64_t i = 0; i < nbytes; i++)
        CHECK(p[i] == (unsigned char)(i * 31 + seed), "byte %lld of %lld", (long long)i,
              (long long)nbytes);
}

/* Even ranks send and check the echo; odd ranks echo. */
static void echo_sizes(mp_conn *c, bool sender)
{
    static const int64_t sizes[] = {0, 1, 7, 4096, 65536 + 3, 1 << 20, 64 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        mp_msg *m = NULL, *back = NULL;
        mp_tensor *t = NULL;
        if (sender) {
            t = pattern_tensor(sizes[k], (unsigned)k);
            OK(mp_msg_create(&m));
            OK(mp_msg_set_payload(m, &k, sizeof k));
            OK(mp_msg_add_tensor(m, "data", t));
            OK(mp_conn_send(c, m, 30));
            OK(mp_conn_recv(c, &back, 30));
            size_t len = 0;
            const void *pl = mp_msg_payload(back, &len);
            CHECK(len == sizeof k && memcmp(pl, &k, len) == 0, "payload of echo %zu", k);
            mp_tensor_release(t);
            OK(mp_msg_find_tensor(back, "data", &t));
            /* A 0-byte tensor has no storage to share on mproc's local path. */
            CHECK(sizes[k] == 0 || mp_tensor_is_shared(t), "received tensor not in shared memory");
            check_pattern(t, sizes[k], (unsigned)k);
        } else {
            OK(mp_conn_recv(c, &m, 30));
            OK(mp_conn_send(c, m, 30));
        }
        mp_tensor_release(t);
        mp_msg_destroy(m);
        mp_msg_destroy(back);
    }
}

/* A strided view, a 0-d float, several tensors and a long payload. */
static void shapes(mp_conn *c, bool sender)
{
    mp_msg *m = NULL;
    if (sender) {
        int64_t shape[2] = {4, 6}, zero = 0;
        mp_tensor *a = NULL, *at = NULL, *s = NULL, *e = NULL;
        OK(mp_tensor_empty(MP_FLOAT64, 2, shape, &a));
        for (int i = 0; i < 24; i++)
            ((double *)mp_tensor_data(a))[i] = i;
        OK(mp_tensor_transpose(a, 0, 1, &at));
        OK(mp_tensor_empty(MP_FLOAT32, 0, NULL, &s));
        *(float *)mp_tensor_data(s) = 2.5f;
        OK(mp_tensor_empty(MP_INT32, 1, &zero, &e));
        char big[100000];
        memset(big, 'x', sizeof big);
        OK(mp_msg_create(&m));
        OK(mp_msg_set_payload(m, big, sizeof big));
        OK(mp_msg_add_tensor(m, "t", at));
        OK(mp_msg_add_tensor(m, NULL, s));
        OK(mp_msg_add_tensor(m, "empty", e));
        OK(mp_conn_send(c, m, 30));
        mp_tensor_release(a), mp_tensor_release(at), mp_tensor_release(s), mp_tensor_release(e);
    } else {
        mp_tensor *t = NULL;
        size_t len = 0;
        OK(mp_conn_recv(c, &m, 30));
        CHECK(mp_msg_count(m) == 3, "count %zu", mp_msg_count(m));
        mp_msg_payload(m, &len);
        CHECK(len == 100000, "payload %zu", len);
        OK(mp_msg_find_tensor(m, "t", &t));
        CHECK(mp_tensor_shape(t)[0] == 6 && mp_tensor_shape(t)[1] == 4, "shape");
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 4; j++) {
                mp_tensor *row = NULL, *el = NULL;
                OK(mp_tensor_select(t, 0, i, &row));
                OK(mp_tensor_select(row, 0, j, &el));
                CHECK(*(double *)mp_tensor_data(el) == j * 6 + i, "element %d,%d", i, j);
                mp_tensor_release(row), mp_tensor_release(el);
            }
        mp_tensor_release(t);
        OK(mp_msg_get_tensor(m, 1, &t));
        CHECK(mp_tensor_ndim(t) == 0 && *(float *)mp_tensor_data(t) == 2.5f, "0-d tensor");
        CHECK(mp_msg_name(m, 1) == NULL, "unnamed stays unnamed");
        mp_tensor_release(t);
        OK(mp_msg_find_tensor(m, "empty", &t));
        CHECK(mp_tensor_numel(t) == 0, "empty tensor");
        mp_tensor_release(t);
    }
    mp_msg_destroy(m);
}

/* Timeouts, host-local objects, close. */
static void edges(mp_conn *c, bool sender, bool local)
{
    mp_msg *m = NULL;
    mp_queue *q = NULL;
    if (sender) {
        CHECK(mp_conn_recv(c, &m, 0) == MP_ETIMEDOUT, "poll of an empty conn");
        CHECK(mp_conn_recv(c, &m, 0.05) == MP_ETIMEDOUT, "timed recv");
        OK(mp_queue_create(0, &q));
        OK(mp_msg_create(&m));
        OK(mp_msg_add_queue(m, "q", q));
        int rc = mp_conn_send(c, m, 30);
        CHECK(rc == (local ? 0 : MP_ENOTSUP), "queue attachment: %s", mp_err_name(rc));
        mp_msg_destroy(m), m = NULL;
        mp_queue_release(q);
        for (int i = 0; i < 3; i++)
            OK(mp_conn_send(c, NULL == m ? (mp_msg_create(&m), m) : m, 30));
        OK(mp_conn_close(c));
        CHECK(mp_conn_send(c, m, 1) == MP_ECLOSED, "send after close");
    } else {
        if (local) {
            OK(mp_conn_recv(c, &m, 30));
            OK(mp_msg_get_queue(m, 0, &q));
            mp_queue_release(q);
            mp_msg_destroy(m);
        }
        for (int i = 0; i < 3; i++) {
            OK(mp_conn_recv(c, &m, 30));
            mp_msg_destroy(m);
        }
        int rc = mp_conn_recv(c, &m, 30);
        CHECK(rc == MP_ECLOSED, "recv after the peer closed: %s", mp_err_name(rc));
        m = NULL;
    }
    mp_msg_destroy(m);
}

/* The peer closes without taking a large message: later sends fail with
 * MP_ECLOSED (not a hang on the transfer that will never finish), and
 * destroying the conn returns. */
static void abandoned(int partner, bool sender)
{
    mp_conn *c = NULL;
    OK(mp_mpi_pipe(partner, &c));
    if (!sender)
        OK(mp_conn_close(c));
    OK(mp_mpi_barrier());
    if (sender) {
        mp_tensor *t = pattern_tensor(1 << 20, 5);
        mp_msg *m = NULL;
        OK(mp_msg_create(&m));
        OK(mp_msg_add_tensor(m, NULL, t));
        int rc = mp_conn_send(c, m, 10);
        CHECK(rc == 0 || rc == MP_ECLOSED, "first send to a closed peer: %s", mp_err_name(rc));
        double t0 = MPI_Wtime();
        rc = mp_conn_send(c, m, 10);
        CHECK(rc == MP_ECLOSED, "second send to a closed peer: %s after %.2f s",
              mp_err_name(rc), MPI_Wtime() - t0);
        mp_msg_destroy(m);
        mp_tensor_release(t);
    }
    mp_conn_release(c);
}

MP_ENTRY(case_roundtrip)
{
    int partner = rank ^ 1;
    mp_conn *c = NULL;
    if (partner >= size)
        return mp_mpi_barrier(); /* abandoned()'s, alone */
    bool want_local = local_to(partner);
    OK(mp_mpi_pipe(partner, &c));
    CHECK(mp_mpi_conn_is_local(c) == want_local, "local path %d", mp_mpi_conn_is_local(c));
    echo_sizes(c, rank % 2 == 0);
    shapes(c, rank % 2 == 0);
    edges(c, rank % 2 == 0, want_local);
    mp_conn_release(c);
    abandoned(partner, rank % 2 == 0);
    return 0;
}

MP_ENTRY(case_alltoall)
{
    enum { N = 50 };
    mp_conn **c = calloc((size_t)size, sizeof *c);
    int64_t len = 256;
    for (int r = 0; r < size; r++)
        if (r != rank)
            OK(mp_mpi_pipe(r, &c[r]));
    /* Interleave: a message to each peer, then take one from each. */
    for (int i = 0; i < N; i++) {
        for (int r = 0; r < size; r++) {
            if (r == rank)
                continue;
            mp_msg *m = NULL;
            mp_tensor *t = pattern_tensor(len, (unsigned)(rank * 1000 + i));
            int hdr[2] = {rank, i};
            OK(mp_msg_create(&m));
            OK(mp_msg_set_payload(m, hdr, sizeof hdr));
            OK(mp_msg_add_tensor(m, NULL, t));
            OK(mp_conn_send(c[r], m, 30));
            mp_msg_destroy(m);
            mp_tensor_release(t);
        }
        for (int r = 0; r < size; r++) {
            if (r == rank)
                continue;
            mp_msg *m = NULL;
            mp_tensor *t = NULL;
            int hdr[2];
            OK(mp_conn_recv(c[r], &m, 30));
            memcpy(hdr, mp_msg_payload(m, NULL), sizeof hdr);
            CHECK(hdr[0] == r && hdr[1] == i, "from %d got %d/%d, want %d/%d", r, hdr[0], hdr[1],
                  r, i);
            OK(mp_msg_get_tensor(m, 0, &t));
            check_pattern(t, len, (unsigned)(r * 1000 + i));
            mp_tensor_release(t);
            mp_msg_destroy(m);
        }
    }
    for (int r = 0; r < size; r++)
        mp_conn_release(c[r]);
    free(c);
    return 0;
}

MP_ENTRY(case_allreduce)
{
    int64_t n = 1000;
    mp_tensor *f = NULL, *d = NULL, *i32 = NULL, *h = NULL;
    OK(mp_tensor_empty_shared(MP_FLOAT32, 1, &n, &f));
    OK(mp_tensor_empty(MP_FLOAT64, 1, &n, &d));
    OK(mp_tensor_empty(MP_INT32, 1, &n, &i32));
    OK(mp_tensor_empty(MP_FLOAT16, 1, &n, &h));
    for (int64_t k = 0; k < n; k++) {
        ((float *)mp_tensor_data(f))[k] = (float)(rank + k);
        ((double *)mp_tensor_data(d))[k] = rank * 0.5;
        ((int32_t *)mp_tensor_data(i32))[k] = rank + 1;
    }
    OK(mp_mpi_allreduce_tensor(f, MP_MPI_MEAN));
    OK(mp_mpi_allreduce_tensor(d, MP_MPI_SUM));
    OK(mp_mpi_allreduce_tensor(i32, MP_MPI_SUM));
    double mean_rank = (size - 1) / 2.0;
    for (int64_t k = 0; k < n; k++) {
        CHECK(((float *)mp_tensor_data(f))[k] == (float)(mean_rank + k), "mean at %lld",
              (long long)k);
        CHECK(((double *)mp_tensor_data(d))[k] == 0.5 * size * (size - 1) / 2, "sum f64");
        CHECK(((int32_t *)mp_tensor_data(i32))[k] == size * (size + 1) / 2, "sum i32");
    }
    CHECK(mp_mpi_allreduce_tensor(h, MP_MPI_MEAN) == MP_ENOTSUP, "float16 mean");
    CHECK(mp_mpi_allreduce_tensor(NULL, MP_MPI_SUM) == MP_EINVAL, "NULL tensor");
    CHECK(mp_mpi_allreduce_tensor(f, (mp_mpi_op)7) == MP_EINVAL, "op 7");
    SAYS("mp_mpi_allreduce_tensor: op 7 is not MP_MPI_SUM or MP_MPI_MEAN");
    mp_tensor_release(f), mp_tensor_release(d), mp_tensor_release(i32), mp_tensor_release(h);
    return 0;
}

MP_ENTRY(case_raise)
{
    if (rank == 1)
        mp_raise("rank %d gives up on purpose", rank);
    /* The others wait on a message that never comes: the failure ends it. */
    mp_conn *c = NULL;
    mp_msg *m = NULL;
    int rc = mp_mpi_pipe(1, &c);
    if (rc == 0)
        rc = mp_conn_recv(c, &m, -1);
    mp_conn_release(c);
    return rc;
}

MP_ENTRY(case_kill)
{
    /* Rank 2 trades a few messages with rank 3, then is SIGKILLed while
     * every other rank blocks: in recv (rank 3) or in a barrier. Its
     * tensors are named segments (file_system), one still held when it
     * dies: only its host's shm manager can remove it (hosts.sh checks
     * that it did: each of its hosts has a /dev/shm of its own). */
    if (rank >= 2) {
        mp_conn *c = NULL;
        mp_msg *m = NULL;
        if (rank == 2)
            OK(mp_set_sharing_strategy("file_system"));
        OK(mp_mpi_pipe(rank ^ 1, &c));
        for (int i = 0; i < 5; i++) {
            mp_tensor *t = pattern_tensor(1 << 16, 1);
            OK(mp_msg_create(&m));
            OK(mp_msg_add_tensor(m, NULL, t));
            mp_tensor_release(t);
            if (rank == 2)
                OK(mp_conn_send(c, m, 30));
            mp_msg_destroy(m), m = NULL;
            if (rank == 3)
                OK(mp_conn_recv(c, &m, 30));
            mp_msg_destroy(m), m = NULL;
        }
        if (rank == 2) {
            mp_tensor *held = pattern_tensor(1 << 16, 2);
            OK(mp_tensor_share_memory_(held)); /* a named segment; dies holding it */
            kill(getpid(), SIGKILL);
        }
        int rc = mp_conn_recv(c, &m, -1);
        mp_conn_release(c);
        return rc;
    }
    return mp_mpi_barrier();
}

MP_ENTRY(case_host_lost)
{
    /* Rank 1's host drops off the network (its only interface down, as a
     * pulled cable or a host that froze: no process exits, no connection
     * is closed) while rank 0 waits for rank 1's message and the others
     * wait in a barrier. */
    mp_conn *c = NULL;
    mp_msg *m = NULL;
    if (rank <= 1)
        OK(mp_mpi_pipe(rank ^ 1, &c));
    OK(mp_mpi_barrier());
    if (rank == 1) {
        /* Never on a real machine's interface: only on a host hosts.sh made
         * (it sets MPROC_HOSTS_DIR), apart from rank 0's. */
        CHECK(getenv("MPROC_HOSTS_DIR") && !same_host(0),
              "host_lost takes its host off the network: run it on the hosts "
              "tests/mpi/hosts.sh makes");
        CHECK(system("ip link set eth0 down") == 0, "eth0 down");
        sleep(600);
    }
    int rc = rank == 0 ? mp_conn_recv(c, &m, -1) : mp_mpi_barrier();
    mp_conn_release(c);
    return rc;
}

MP_ENTRY(case_queue)
{
    enum { K = 30 };
    mp_queue *q = NULL;
    mp_msg *m = NULL;
    int64_t total = (int64_t)size * K, len = 1000;
    mp_tensor *seen = NULL;
    int last[64];
    OK(mp_mpi_queue_create(0, &q));
    CHECK(mp_mpi_queue_is_local(q) == (rank == 0 || local_to(0)), "is_local");
    CHECK(mp_queue_get(q, &m, 0) == MP_ETIMEDOUT, "poll of the empty queue");
    CHECK(mp_queue_get(q, &m, 0.05) == MP_ETIMEDOUT, "timed get");
    OK(mp_mpi_barrier());
    for (int i = 0; i < K; i++) {
        mp_tensor *t = pattern_tensor(len, (unsigned)(rank * 100 + i));
        int hdr[2] = {rank, i};
        OK(mp_msg_create(&m));
        OK(mp_msg_set_payload(m, hdr, sizeof hdr));
        OK(mp_msg_add_tensor(m, "t", t));
        OK(mp_queue_put(q, m, 30));
        mp_msg_destroy(m), m = NULL;
        mp_tensor_release(t);
    }
    if (!mp_mpi_queue_is_local(q)) {
        mp_queue *local = NULL;
        OK(mp_queue_create(0, &local));
        OK(mp_msg_create(&m));
        OK(mp_msg_add_queue(m, NULL, local));
        CHECK(mp_queue_put(q, m, 30) == MP_ENOTSUP, "a queue sent to another host");
        mp_msg_destroy(m), m = NULL;
        mp_queue_release(local);
    }
    OK(mp_mpi_barrier()); /* every put is in */
    if (rank == size - 1)
        OK(mp_queue_close(q));
    OK(mp_mpi_barrier());
    CHECK(mp_queue_put(q, NULL == m ? (mp_msg_create(&m), m) : m, 1) == MP_ECLOSED,
          "put after close");
    mp_msg_destroy(m), m = NULL;
    OK(mp_tensor_empty(MP_INT32, 1, &total, &seen));
    for (int r = 0; r < 64; r++)
        last[r] = -1;
    for (;;) {
        int rc = mp_queue_get(q, &m, 30), hdr[2];
        mp_tensor *t = NULL;
        if (rc == MP_ECLOSED)
            break;
        OK(rc);
        memcpy(hdr, mp_msg_payload(m, NULL), sizeof hdr);
        CHECK(hdr[0] >= 0 && hdr[0] < size && hdr[1] > last[hdr[0]], "order from %d: %d after %d",
              hdr[0], hdr[1], last[hdr[0]]);
        last[hdr[0]] = hdr[1];
        OK(mp_msg_find_tensor(m, "t", &t));
        check_pattern(t, len, (unsigned)(hdr[0] * 100 + hdr[1]));
        ((int32_t *)mp_tensor_data(seen))[hdr[0] * K + hdr[1]]++;
        mp_tensor_release(t);
        mp_msg_destroy(m), m = NULL;
    }
    OK(mp_mpi_allreduce_tensor(seen, MP_MPI_SUM));
    for (int64_t i = 0; i < total; i++)
        CHECK(((int32_t *)mp_tensor_data(seen))[i] == 1, "message %lld taken %d times",
              (long long)i, ((int32_t *)mp_tensor_data(seen))[i]);
    mp_tensor_release(seen);
    mp_queue_release(q);
    return 0;
}

/* A full queue (its socket buffer holds no more): puts honour their
 * timeouts from every rank (0 polls, a timeout gives up and puts nothing),
 * a put that waits forever goes in once the home drains, and every message
 * that was put is taken exactly once. */
MP_ENTRY(case_queue_full)
{
    mp_queue *q = NULL;
    mp_msg *m = NULL;
    mp_tensor *counts = NULL;
    int64_t two = 2, *n;
    char pad[512];
    memset(pad, 'p', sizeof pad);
    OK(mp_mpi_queue_create(0, &q));
    OK(mp_msg_create(&m));
    OK(mp_msg_set_payload(m, pad, sizeof pad));
    OK(mp_tensor_empty(MP_INT64, 1, &two, &counts));
    n = mp_tensor_data(counts); /* [0]: puts that went in, [1]: messages taken */
    if (rank == 1) {
        int rc = 0;
        for (int i = 0; i < 200000 && rc == 0; i++)
            if ((rc = mp_queue_put(q, m, 0.2)) == 0)
                n[0]++;
        CHECK(rc == MP_ETIMEDOUT, "filling: %s after %lld puts", mp_err_name(rc),
              (long long)n[0]);
        CHECK(mp_queue_put(q, m, 0) == MP_ETIMEDOUT, "poll of a full queue");
        double t0 = MPI_Wtime();
        rc = mp_queue_put(q, m, 0.1);
        CHECK(rc == MP_ETIMEDOUT && MPI_Wtime() - t0 >= 0.09, "timed put to a full queue: %s "
              "after %.3f s", mp_err_name(rc), MPI_Wtime() - t0);
    }
    OK(mp_mpi_barrier()); /* the queue is full */
    if (rank == 1) {
        double t0 = MPI_Wtime();
        OK(mp_queue_put(q, m, -1)); /* waits until rank 0 drains */
        n[0]++;
        CHECK(MPI_Wtime() - t0 >= 0.2, "the put waited for room: %.3f s", MPI_Wtime() - t0);
    }
    if (rank == 0) {
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
        mp_msg *got = NULL;
        while (mp_queue_get(q, &got, 1) == 0) {
            n[1]++;
            mp_msg_destroy(got), got = NULL;
        }
    }
    OK(mp_mpi_allreduce_tensor(counts, MP_MPI_SUM));
    CHECK(n[0] > 0 && n[0] == n[1], "%lld puts went in, %lld messages were taken",
          (long long)n[0], (long long)n[1]);
    mp_tensor_release(counts);
    mp_msg_destroy(m);
    mp_queue_release(q);
    return 0;
}

MP_TASK(square)
{
    int64_t x;
    size_t len = 0;
    const void *p = mp_msg_payload(in, &len);
    if (len != sizeof x)
        return MP_EINVAL;
    memcpy(&x, p, sizeof x);
    if (x == 13)
        mp_raise("unlucky %lld", (long long)x);
    x *= x;
    return mp_msg_set_payload(out, &x, sizeof x);
}

/* Doubles the tensor's elements into a new tensor. */
MP_TASK(twice)
{
    mp_tensor *t = NULL, *r = NULL;
    int rc = mp_msg_get_tensor(in, 0, &t);
    if (rc == 0)
        rc = mp_tensor_clone(t, &r);
    for (int64_t i = 0; rc == 0 && i < mp_tensor_numel(r); i++)
        ((float *)mp_tensor_data(r))[i] *= 2;
    if (rc == 0)
        rc = mp_msg_add_tensor(out, "r", r);
    mp_tensor_release(t), mp_tensor_release(r);
    return rc;
}

static mp_msg *int_msg(int64_t x)
{
    mp_msg *m = NULL;
    OK(mp_msg_create(&m));
    OK(mp_msg_set_payload(m, &x, sizeof x));
    return m;
}

MP_ENTRY(case_pool)
{
    enum { N = 40 };
    mp_pool *p = NULL;
    mp_msg *in[N], *out[N];
    OK(mp_mpi_pool_create(&p));
    if (rank != 0) {
        CHECK(p == NULL, "a worker rank got a pool");
        return 0;
    }
    CHECK(mp_pool_size(p) == size - 1, "size %d", mp_pool_size(p));
    for (int i = 0; i < N; i++)
        in[i] = int_msg(i + 100);
    OK(mp_pool_map(p, "square", (const mp_msg *const *)in, N, 0, out));
    for (int i = 0; i < N; i++) {
        int64_t v;
        memcpy(&v, mp_msg_payload(out[i], NULL), sizeof v);
        CHECK(v == (int64_t)(i + 100) * (i + 100), "item %d: %lld", i, (long long)v);
        mp_msg_destroy(out[i]), mp_msg_destroy(in[i]);
    }
    /* A failing task fails alone; the others and the worker carry on. */
    mp_async_result *r[3];
    for (int i = 0; i < 3; i++) {
        mp_msg *m = int_msg(12 + i);
        OK(mp_pool_apply_async(p, "square", m, NULL, &r[i]));
        mp_msg_destroy(m);
    }
    const mp_msg *b = NULL; /* borrowed from the result, as with a local pool */
    OK(mp_async_result_get(r[0], 30, &b));
    int64_t v0 = 0;
    memcpy(&v0, mp_msg_payload(b, NULL), sizeof v0);
    CHECK(v0 == 144, "apply_async result %lld", (long long)v0);
    CHECK(mp_async_result_get(r[1], 30, &b) == MP_ECHILD, "the raising task");
    CHECK(strstr(mp_last_error(), "unlucky 13") != NULL, "error text: %s", mp_last_error());
    CHECK(strstr(mp_async_result_error(r[1]), "unlucky 13") != NULL, "result error");
    CHECK(mp_async_result_successful(r[1]) == 0 && mp_async_result_successful(r[0]) == 1,
          "successful");
    OK(mp_async_result_wait(r[2], 30));
    OK(mp_async_result_get(r[2], 0, &b));
    OK(mp_async_result_get(r[2], 0, &b)); /* borrowed: as often as wanted */
    CHECK(mp_async_result_retain(r[2]) == r[2], "retain");
    mp_async_result_release(r[2]);
    for (int i = 0; i < 3; i++)
        mp_async_result_release(r[i]);
    /* No handler thread: callbacks are refused, with the reason. */
    mp_pool_callbacks cb = {.size = sizeof cb};
    mp_async_result *cr = NULL;
    mp_msg *o = NULL;
    OK(mp_msg_create(&o));
    CHECK(mp_pool_apply_async(p, "square", o, &cb, &cr) == MP_ENOTSUP && cr == NULL &&
          strstr(mp_last_error(), "callbacks"), "callbacks on a pool over ranks");
    mp_msg_destroy(o), o = NULL;
    /* Tensors both ways. */
    int64_t n = 1 << 16;
    mp_tensor *t = NULL, *back = NULL;
    mp_msg *m = NULL;
    OK(mp_tensor_empty(MP_FLOAT32, 1, &n, &t));
    for (int64_t i = 0; i < n; i++)
        ((float *)mp_tensor_data(t))[i] = (float)i;
    OK(mp_msg_create(&m));
    OK(mp_msg_add_tensor(m, NULL, t));
    OK(mp_pool_apply(p, "twice", m, &o));
    OK(mp_msg_find_tensor(o, "r", &back));
    for (int64_t i = 0; i < n; i++)
        CHECK(((float *)mp_tensor_data(back))[i] == 2.0f * (float)i, "tensor item %lld",
              (long long)i);
    mp_msg_destroy(o), o = NULL;
    CHECK(mp_pool_apply(p, "nosuch", m, &o) == MP_ENOENT && o == NULL, "unknown task");
    mp_tensor_release(t), mp_tensor_release(back), mp_msg_destroy(m);
    /* close, join: queued work still runs; later submissions are refused. */
    m = int_msg(3);
    OK(mp_pool_apply_async(p, "square", m, NULL, &r[0]));
    OK(mp_pool_close(p));
    CHECK(mp_pool_apply(p, "square", m, &o) == MP_ESTATE, "apply after close");
    OK(mp_pool_join(p));
    CHECK(mp_async_result_ready(r[0]), "join ran the queued task");
    mp_async_result_release(r[0]);
    mp_msg_destroy(m);
    mp_pool_destroy(p);
    return 0;
}

/* Bad arguments are refused before any message moves, on every rank alike
 * (so no rank is left alone in a collective): a record whose size was not
 * set, a rank that is not the job's, an unknown entry, a NULL out. */
static void check_bad_arguments(const char *entry)
{
    mp_mpi_error unset = {0};
    mp_conn *c = NULL;
    mp_queue *q = NULL;
    char want[160];
    CHECK(mp_mpi_spawn(entry, NULL, &unset) == MP_EINVAL, "an unset mp_mpi_error.size");
    CHECK(mp_mpi_failure(&unset) == MP_EINVAL, "an unset mp_mpi_error.size");
    CHECK(mp_mpi_spawn("no_such_case", NULL, NULL) == MP_ENOENT, "an unknown entry");
    SAYS("mp_mpi_spawn: no entry called 'no_such_case' is registered (define it with "
         "MP_ENTRY(no_such_case))");
    CHECK(mp_mpi_pipe((rank + 1) % size, NULL) == MP_EINVAL, "a pipe to NULL");
    SAYS("mp_mpi_pipe: out is NULL");
    CHECK(mp_mpi_pipe(size, &c) == MP_EINVAL && !c, "a pipe to rank size");
    snprintf(want, sizeof want, "mp_mpi_pipe: peer %d is not a rank of this job (0..%d)", size,
             size - 1);
    SAYS(want);
    CHECK(mp_mpi_queue_create(-1, &q) == MP_EINVAL && !q, "a queue homed at rank -1");
    snprintf(want, sizeof want, "mp_mpi_queue_create: home -1 is not a rank of this job "
             "(0..%d)", size - 1);
    SAYS(want);
    CHECK(mp_mpi_is_local(size) == MP_EINVAL, "is_local of rank size");
    CHECK(!strncmp(mp_last_error(), "mp_mpi_is_local: ", 17), "said: %s", mp_last_error());
}

int main(int argc, char **argv)
{
    return mpi_suite_main("mpi_suite", argc, argv, check_bad_arguments);
}
