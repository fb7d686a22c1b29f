/* The cross-rank queue's short cuts on its home rank (src/mpi/queue_broker.c),
 * under mpirun by tests/mpi/run.sh, 4 ranks, home rank 0:
 *
 *   qping      ping-pong through two queues, home putting and remote
 *              getting, and the reverse: a put handed straight to a parked
 *              remote get, a remote put handed straight to the home's
 *              waiting get; then through a queue homed on each rank, each
 *              rank putting to its own and then to the other's (a rank
 *              waiting for another's broker serves its own broker's
 *              requests); every message checked
 *   qraces     home puts (paced irregularly) against remote gets with
 *              timeouts of 0 to 1 ms, then remote puts against home gets
 *              with such timeouts: every message that was put is taken
 *              exactly once, in order per producer, none lost by a get
 *              that timed out while its message was on its way
 *   qclose     a message holding a queue, taken on another host: that
 *              get fails with MP_ENOTSUP; then gets parked on every rank
 *              while the home waits in a get: a close ends every one with
 *              MP_ECLOSED
 *   qkill      rank 2 is SIGKILLed while the home spins in a get serving
 *              the others' gets: every rank errors out, nothing hangs
 *   qkill_home the home is SIGKILLed while every other rank waits in a
 *              get on its queue: the same
 *   qfork      a process forked from a rank (which must not call MPI)
 *              refuses every call on the cross-rank queue and pipe it
 *              inherited, with MP_ESTATE naming the fork, and releases
 *              them without touching MPI; the rank's own handles go on
 */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpi_check.h"

static void nap_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* A message of two ints: producer, sequence number. */
static mp_msg *pair_msg(int a, int b)
{
    mp_msg *m = NULL;
    int v[2] = {a, b};
    OK(mp_msg_create(&m));
    OK(mp_msg_set_payload(m, v, sizeof v));
    return m;
}

static void pair_of(const mp_msg *m, int v[2])
{
    size_t len = 0;
    const void *p = mp_msg_payload(m, &len);
    CHECK(len == 2 * sizeof(int), "payload of %zu bytes", len);
    memcpy(v, p, 2 * sizeof(int));
}

static mp_tensor *zeros(int64_t n)
{
    mp_tensor *t = NULL;
    OK(mp_tensor_empty(MP_INT32, 1, &n, &t));
    memset(mp_tensor_data(t), 0, (size_t)n * sizeof(int32_t));
    return t;
}

/* Rank 0 and rank 1 trade n messages through qa (0 -> 1) and qb (back);
 * reverse: rank 1 starts. */
static void ping(mp_queue *qa, mp_queue *qb, int n, bool reverse)
{
    bool sender = (rank == 0) != reverse;
    mp_queue *out = (rank == 0) ? qa : qb, *in = (rank == 0) ? qb : qa;
    for (int i = 0; i < n; i++) {
        mp_msg *m = NULL;
        int v[2];
        if (sender) {
            mp_msg *p = pair_msg(rank, i);
            OK(mp_queue_put(out, p, 30));
            mp_msg_destroy(p);
        }
        OK(mp_queue_get(in, &m, 30));
        pair_of(m, v);
        CHECK(v[0] == (rank ^ 1) && v[1] == i, "got %d/%d, want %d/%d", v[0], v[1], rank ^ 1, i);
        mp_msg_destroy(m);
        if (!sender) {
            mp_msg *p = pair_msg(rank, i);
            OK(mp_queue_put(out, p, 30));
            mp_msg_destroy(p);
        }
    }
}

MP_ENTRY(case_qping)
{
    mp_queue *qa = NULL, *qb = NULL, *qc = NULL;
    OK(mp_mpi_queue_create(0, &qa));
    OK(mp_mpi_queue_create(0, &qb));
    OK(mp_mpi_queue_create(1, &qc));
    /* Ranks 0 and 1 ping-pong; a barrier after each round: its last getter
     * may still wait on a queue the next round has the other rank get
     * from, and either get may take the message (any consumer may). */
    struct { mp_queue *a, *b; bool reverse; } rounds[4] = {
        {qa, qb, false}, {qa, qb, true},
        {qa, qc, false}, /* each rank puts to the queue it homes */
        {qc, qa, true},  /* each rank puts to the other's */
    };
    for (int k = 0; k < 4; k++) {
        if (rank <= 1)
            ping(rounds[k].a, rounds[k].b, 3000, rounds[k].reverse);
        OK(mp_mpi_barrier());
    }
    mp_msg *m = NULL;
    CHECK(mp_queue_get(qa, &m, 0) == MP_ETIMEDOUT && mp_queue_get(qb, &m, 0) == MP_ETIMEDOUT &&
              mp_queue_get(qc, &m, 0) == MP_ETIMEDOUT,
          "nothing left over");
    OK(mp_mpi_barrier());
    mp_queue_release(qa), mp_queue_release(qb), mp_queue_release(qc);
    return 0;
}

/* Timeouts of 0, 10 us, 100 us, 1 ms, in turn. */
static double short_timeout(int i)
{
    static const double t[4] = {0, 1e-5, 1e-4, 1e-3};
    return t[i % 4];
}

/* Part 1: rank 0 puts n messages, irregularly paced, then closes; every
 * other rank gets with short timeouts until closed and drained. */
static void home_puts(mp_queue *q, int n, mp_tensor *taken)
{
    int32_t *seen = mp_tensor_data(taken);
    if (rank == 0) {
        unsigned seed = 7;
        for (int i = 0; i < n; i++) {
            mp_msg *m = pair_msg(0, i);
            OK(mp_queue_put(q, m, 30));
            mp_msg_destroy(m);
            if (rand_r(&seed) % 4 == 0)
                nap_us(rand_r(&seed) % 200);
        }
        OK(mp_queue_close(q));
        return;
    }
    int last = -1, rc;
    for (int i = 0;; i++) {
        mp_msg *m = NULL;
        int v[2];
        if ((rc = mp_queue_get(q, &m, short_timeout(i))) == MP_ETIMEDOUT)
            continue;
        if (rc == MP_ECLOSED)
            break;
        OK(rc);
        pair_of(m, v);
        CHECK(v[0] == 0 && v[1] > last && v[1] < n, "got %d/%d after %d", v[0], v[1], last);
        last = v[1];
        seen[v[1]]++;
        mp_msg_destroy(m);
    }
}

/* Part 2: every other rank puts n messages (some with a poll's timeout:
 * those that time out must never arrive) and a last one saying so; rank 0
 * gets with short timeouts until it has every last one. */
static void remote_puts(mp_queue *q, int n, mp_tensor *put, mp_tensor *taken)
{
    int32_t *ok = mp_tensor_data(put), *seen = mp_tensor_data(taken);
    if (rank != 0) {
        for (int i = 0; i < n; i++) {
            mp_msg *m = pair_msg(rank, i);
            int rc = mp_queue_put(q, m, i % 3 == 0 ? 0 : 30);
            CHECK(rc == 0 || rc == MP_ETIMEDOUT, "put: %s", mp_err_name(rc));
            ok[rank * n + i] += rc == 0;
            mp_msg_destroy(m);
        }
        mp_msg *end = pair_msg(rank, -1);
        OK(mp_queue_put(q, end, 30));
        mp_msg_destroy(end);
        return;
    }
    int last[64], ends = 0, rc;
    for (int r = 0; r < 64; r++)
        last[r] = -1;
    for (int i = 0; ends < size - 1; i++) {
        mp_msg *m = NULL;
        int v[2];
        if ((rc = mp_queue_get(q, &m, short_timeout(i))) == MP_ETIMEDOUT)
            continue;
        OK(rc);
        pair_of(m, v);
        mp_msg_destroy(m);
        CHECK(v[0] > 0 && v[0] < size, "producer %d", v[0]);
        if (v[1] < 0) {
            CHECK(last[v[0]] != -2, "two ends from %d", v[0]);
            last[v[0]] = -2, ends++;
            continue;
        }
        CHECK(last[v[0]] != -2 && v[1] > last[v[0]] && v[1] < n, "from %d: %d after %d",
              v[0], v[1], last[v[0]]);
        last[v[0]] = v[1];
        seen[v[0] * n + v[1]]++;
    }
}

MP_ENTRY(case_qraces)
{
    enum { N = 3000, M = 1000 };
    mp_queue *q1 = NULL, *q2 = NULL;
    mp_tensor *taken1 = zeros(N), *put2 = zeros((int64_t)size * M), *taken2 = zeros(size * M);
    OK(mp_mpi_queue_create(0, &q1));
    OK(mp_mpi_queue_create(0, &q2));
    home_puts(q1, N, taken1);
    OK(mp_mpi_allreduce_tensor(taken1, MP_MPI_SUM));
    for (int i = 0; i < N; i++)
        CHECK(((int32_t *)mp_tensor_data(taken1))[i] == 1, "home message %d taken %d times", i,
              ((int32_t *)mp_tensor_data(taken1))[i]);
    remote_puts(q2, M, put2, taken2);
    OK(mp_mpi_allreduce_tensor(put2, MP_MPI_SUM));
    OK(mp_mpi_allreduce_tensor(taken2, MP_MPI_SUM));
    int32_t *ok = mp_tensor_data(put2), *seen = mp_tensor_data(taken2);
    for (int i = 0; i < size * M; i++)
        CHECK(ok[i] == seen[i], "message %d/%d: put %d, taken %d", i / M, i % M, ok[i],
              seen[i]);
    mp_tensor_release(taken1), mp_tensor_release(put2), mp_tensor_release(taken2);
    mp_queue_release(q1), mp_queue_release(q2);
    return 0;
}

MP_ENTRY(case_qclose)
{
    mp_queue *q = NULL;
    mp_msg *m = NULL;
    OK(mp_mpi_queue_create(0, &q));
    /* A message holding a host-local object, put on the home and taken on
     * another host: that get fails (it never waits for a message that
     * cannot come) and the message is gone. */
    if (rank == 0) {
        mp_queue *lq = NULL;
        OK(mp_queue_create(0, &lq));
        OK(mp_msg_create(&m));
        OK(mp_msg_add_queue(m, NULL, lq));
        OK(mp_queue_put(q, m, 30));
        mp_msg_destroy(m), m = NULL;
        mp_queue_release(lq);
    }
    OK(mp_mpi_barrier());
    if (rank == 1) {
        int rc = mp_queue_get(q, &m, 30);
        CHECK(mp_mpi_queue_is_local(q) ? rc == 0 : rc == MP_ENOTSUP && !m,
              "a host-local object taken from rank %d's host: %s", rank, mp_err_name(rc));
        mp_msg_destroy(m), m = NULL;
    }
    OK(mp_mpi_barrier());
    if (rank == size - 1) {
        nap_us(200000); /* the others are waiting by now */
        OK(mp_queue_close(q));
    }
    double t0 = MPI_Wtime();
    int rc = mp_queue_get(q, &m, 30);
    CHECK(rc == MP_ECLOSED && MPI_Wtime() - t0 < 20, "get on a closed queue: %s after %.2f s",
          mp_err_name(rc), MPI_Wtime() - t0);
    OK(mp_mpi_barrier());
    mp_queue_release(q);
    return 0;
}

MP_ENTRY(case_qkill)
{
    mp_queue *q = NULL, *back = NULL, *idle = NULL;
    OK(mp_mpi_queue_create(0, &q));
    OK(mp_mpi_queue_create(0, &back));
    OK(mp_mpi_queue_create(0, &idle)); /* nobody puts: ranks 1 and 3 wait on it */
    if (rank == 2) {
        /* A few trips through the home, then death with a get parked. */
        for (int i = 0; i < 50; i++) {
            mp_msg *m = pair_msg(2, i);
            OK(mp_queue_put(q, m, 30));
            mp_msg_destroy(m), m = NULL;
            OK(mp_queue_get(back, &m, 30));
            mp_msg_destroy(m);
        }
        kill(getpid(), SIGKILL);
    }
    int rc = 0;
    for (int i = 0; rc == 0; i++) {
        mp_msg *m = NULL;
        if (rank == 0) { /* echoes rank 2's messages, then waits in a get */
            if ((rc = mp_queue_get(q, &m, -1)) == 0)
                rc = mp_queue_put(back, m, 30);
        } else {
            rc = mp_queue_get(idle, &m, i % 2 ? -1 : 0.01);
            CHECK(rc != 0, "rank %d took a message from a queue nobody put into", rank);
            rc = rc == MP_ETIMEDOUT ? 0 : rc;
        }
        mp_msg_destroy(m);
    }
    CHECK(rc == MP_ECHILD, "a call while rank 2 died: %s", mp_err_name(rc));
    mp_queue_release(idle), mp_queue_release(back), mp_queue_release(q);
    return rc;
}

/* The home itself dies while every other rank waits on its queue (from
 * another host: gets parked at its broker): they error out, nothing hangs. */
MP_ENTRY(case_qkill_home)
{
    mp_queue *q = NULL;
    mp_msg *m = NULL;
    OK(mp_mpi_queue_create(0, &q));
    for (int i = 0; i < 20; i++) { /* some traffic through the home first */
        if (rank == 0) {
            for (int r = 1; r < size; r++) {
                mp_msg *p = pair_msg(0, i);
                OK(mp_queue_put(q, p, 30));
                mp_msg_destroy(p);
            }
        } else {
            OK(mp_queue_get(q, &m, 30));
            mp_msg_destroy(m), m = NULL;
        }
    }
    OK(mp_mpi_barrier());
    if (rank == 0) {
        nap_us(100000); /* the others are waiting by now */
        kill(getpid(), SIGKILL);
    }
    int rc = mp_queue_get(q, &m, -1);
    CHECK(rc == MP_ECHILD, "a get while the home died: %s", mp_err_name(rc));
    mp_queue_release(q);
    return rc;
}

/* What a process forked from a rank gets from an inherited cross-rank
 * object: 0 when every call refused with MP_ESTATE naming the fork. */
static int forked_calls(mp_queue *q, mp_conn *c)
{
    mp_msg *m = pair_msg(9, 9), *in = NULL;
    int bad = 0;
#define REFUSED(call) (bad |= (call) != MP_ESTATE || !strstr(mp_last_error(), "forked"))
    REFUSED(mp_queue_put(q, m, 1));
    REFUSED(mp_queue_get(q, &in, 1));
    REFUSED(mp_mpi_barrier());
    if (c) {
        REFUSED(mp_conn_send(c, m, 1));
        REFUSED(mp_conn_recv(c, &in, 1));
    }
#undef REFUSED
    mp_msg_destroy(m);
    mp_queue_release(q); /* no MPI, no barrier: returns at once */
    mp_conn_release(c);
    return bad;
}

MP_ENTRY(case_qfork)
{
    mp_queue *q = NULL;
    mp_conn *c = NULL;
    mp_msg *m = NULL;
    int status = 0;
    OK(mp_mpi_queue_create(0, &q));
    if (rank < 2)
        OK(mp_mpi_pipe(1 - rank, &c));
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0)
        _exit(forked_calls(q, c)); /* skips MPI's exit handlers */
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the forked child's calls were not all refused (status 0x%x)", status);
    /* The rank's own handles are untouched. */
    if (rank == 0) {
        for (int r = 1; r < size; r++) {
            m = pair_msg(0, r);
            OK(mp_queue_put(q, m, 30));
            mp_msg_destroy(m), m = NULL;
        }
    } else {
        OK(mp_queue_get(q, &m, 30));
        mp_msg_destroy(m), m = NULL;
    }
    if (c) {
        OK(mp_conn_send(c, (m = pair_msg(rank, 1)), 30));
        mp_msg_destroy(m), m = NULL;
        OK(mp_conn_recv(c, &m, 30));
        mp_msg_destroy(m), m = NULL;
        mp_conn_release(c);
    }
    OK(mp_mpi_barrier());
    mp_queue_release(q);
    return 0;
}

int main(int argc, char **argv)
{
    return mpi_suite_main("mpi_queue_suite", argc, argv, NULL);
}
