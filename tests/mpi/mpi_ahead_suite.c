/* Puts that run ahead of the home's answers (mp_mpi_queue_put_ahead,
 * src/mpi/queue_ahead.c), under mpirun by tests/mpi/run.sh, 4 ranks:
 *
 *   ahead       bad arguments; ranks 1 to 3 stream puts ahead (windows 1,
 *               8 and 64; a tensor now and then, whose bytes follow the
 *               header) into a queue homed on rank 0 while rank 0 gets:
 *               every message exactly once, in order per producer, each
 *               flush 0; a rank's get, qsize and close after puts ahead
 *               see them; puts ahead into a queue closed meanwhile: flush
 *               says how many were lost (MP_ECLOSED), once, and later puts
 *               fail at once
 *   ahead_kill  rank 2 is SIGKILLed while it streams puts ahead and rank 0
 *               gets them: every rank errors out (MP_ECHILD), nothing hangs
 *
 * On one host (the same-host path) the puts go straight into the queue:
 * the same checks hold with nothing running ahead. */
#include <math.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "mpi_check.h"

enum { N = 3000 };

/* A message of two ints, producer and sequence number; every 97th also
 * holds a tensor of 1000 int32 filled with the sequence number. */
static mp_msg *numbered(int producer, int i)
{
    mp_msg *m = NULL;
    int v[2] = {producer, i};
    OK(mp_msg_create(&m));
    OK(mp_msg_set_payload(m, v, sizeof v));
    if (i >= 0 && i % 97 == 0) {
        mp_tensor *t = NULL;
        int64_t n = 1000;
        OK(mp_tensor_empty(MP_INT32, 1, &n, &t));
        for (int k = 0; k < n; k++)
            ((int32_t *)mp_tensor_data(t))[k] = i;
        OK(mp_msg_add_tensor(m, NULL, t));
        mp_tensor_release(t);
    }
    return m;
}

static void number_of(const mp_msg *m, int v[2])
{
    size_t len = 0;
    const void *p = mp_msg_payload(m, &len);
    CHECK(len == sizeof(int[2]), "payload of %zu bytes", len);
    memcpy(v, p, sizeof(int[2]));
    if (v[1] >= 0 && v[1] % 97 == 0) {
        mp_tensor *t = NULL;
        OK(mp_msg_get_tensor(m, 0, &t));
        const int32_t *d = mp_tensor_data(t);
        CHECK(mp_tensor_numel(t) == 1000 && d[0] == v[1] && d[999] == v[1],
              "tensor of message %d/%d", v[0], v[1]);
        mp_tensor_release(t);
    }
}

static void bad_arguments(mp_queue *q)
{
    mp_queue *plain = NULL;
    CHECK(mp_mpi_queue_put_ahead(NULL, 8) == MP_EINVAL, "put_ahead(NULL)");
    CHECK(mp_mpi_queue_put_ahead(q, -1) == MP_EINVAL && strstr(mp_last_error(), "window -1"),
          "window -1");
    CHECK(mp_mpi_queue_put_ahead(q, 1025) == MP_EINVAL, "window 1025");
    CHECK(mp_mpi_queue_flush(NULL, 1) == MP_EINVAL, "flush(NULL)");
    CHECK(mp_mpi_queue_flush(q, NAN) == MP_EINVAL && strstr(mp_last_error(), "NaN"), "NaN");
    OK(mp_queue_create(0, &plain));
    CHECK(mp_mpi_queue_put_ahead(plain, 8) == MP_EINVAL &&
              strstr(mp_last_error(), "mp_mpi_queue_create"),
          "put_ahead of a local queue");
    CHECK(mp_mpi_queue_flush(plain, 1) == MP_EINVAL, "flush of a local queue");
    mp_queue_release(plain);
    OK(mp_mpi_queue_flush(q, 0)); /* nothing outstanding */
}

/* Ranks 1.. put N each, running ahead, then an end (-1); rank 0 takes them. */
static void stream(mp_queue *q)
{
    static const int windows[] = {0, 1, 8, 64};
    if (rank != 0) {
        OK(mp_mpi_queue_put_ahead(q, windows[rank % 4]));
        for (int i = 0; i < N; i++) {
            mp_msg *m = numbered(rank, i);
            OK(mp_queue_put(q, m, 30));
            mp_msg_destroy(m);
        }
        mp_msg *end = numbered(rank, -1);
        OK(mp_queue_put(q, end, 30));
        mp_msg_destroy(end);
        OK(mp_mpi_queue_flush(q, 30));
        OK(mp_mpi_queue_put_ahead(q, 0)); /* back to confirmed puts */
        return;
    }
    int last[64], ends = 0;
    for (int r = 0; r < 64; r++)
        last[r] = -1;
    while (ends < size - 1) {
        mp_msg *m = NULL;
        int v[2];
        OK(mp_queue_get(q, &m, 30));
        number_of(m, v);
        mp_msg_destroy(m);
        CHECK(v[0] > 0 && v[0] < size && last[v[0]] != -2, "producer %d", v[0]);
        if (v[1] < 0) {
            CHECK(last[v[0]] == N - 1, "rank %d ended after %d of %d", v[0], last[v[0]] + 1, N);
            last[v[0]] = -2, ends++;
            continue;
        }
        CHECK(v[1] == last[v[0]] + 1, "from %d: %d after %d", v[0], v[1], last[v[0]]);
        last[v[0]] = v[1];
    }
}

/* A rank's other calls see its puts that ran ahead. */
static void later_calls(mp_queue *q)
{
    if (rank == 1) { /* nobody else gets: the get must find its own */
        OK(mp_mpi_queue_put_ahead(q, 64));
        for (int i = 0; i < 5; i++) {
            mp_msg *m = numbered(rank, i + 1);
            OK(mp_queue_put(q, m, 30));
            mp_msg_destroy(m);
        }
        CHECK(mp_queue_qsize(q) == 5, "qsize after 5 puts ahead: %lld",
              (long long)mp_queue_qsize(q));
        mp_msg *m = NULL;
        int v[2];
        OK(mp_queue_get(q, &m, 0));
        number_of(m, v);
        CHECK(v[0] == 1 && v[1] == 1, "the first put ahead: %d/%d", v[0], v[1]);
        mp_msg_destroy(m);
        OK(mp_queue_close(q));
    }
    OK(mp_mpi_barrier());
    mp_msg *m = NULL;
    int got = 0, rc;
    while ((rc = mp_queue_get(q, &m, 30)) == 0)
        mp_msg_destroy(m), got++;
    CHECK(rc == MP_ECLOSED, "get on the closed queue: %s", mp_err_name(rc));
    int all = 0;
    MPI_Allreduce(&got, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all == 4, "the 4 messages left when the queue was closed were taken %d times", all);
}

/* Puts ahead into a queue that was closed: lost, and said so once. */
static void refused(mp_queue *q)
{
    if (rank == 0)
        OK(mp_queue_close(q));
    OK(mp_mpi_barrier());
    if (mp_mpi_queue_is_local(q) == 1) {
        mp_msg *m = numbered(rank, 1);
        CHECK(mp_queue_put(q, m, 30) == MP_ECLOSED, "a put on the closed queue");
        mp_msg_destroy(m);
        return;
    }
    OK(mp_mpi_queue_put_ahead(q, 64));
    for (int i = 0; i < 3; i++) {
        mp_msg *m = numbered(rank, i + 1);
        OK(mp_queue_put(q, m, 30)); /* on its way: the home refuses it */
        mp_msg_destroy(m);
    }
    int rc = mp_mpi_queue_flush(q, 30);
    CHECK(rc == MP_ECLOSED && strstr(mp_last_error(), "3 earlier puts") &&
              strstr(mp_last_error(), "closed"),
          "flush after 3 refused puts: %s, \"%s\"", mp_err_name(rc), mp_last_error());
    OK(mp_mpi_queue_flush(q, 30)); /* said once */
    mp_msg *m = numbered(rank, 9);
    rc = mp_queue_put(q, m, 30);
    CHECK(rc == MP_ECLOSED, "a put after the refusals: %s", mp_err_name(rc));
    mp_msg_destroy(m);
}

MP_ENTRY(case_ahead)
{
    mp_queue *q = NULL, *own = NULL, *closed = NULL;
    OK(mp_mpi_queue_create(0, &q));
    OK(mp_mpi_queue_create(0, &own));
    OK(mp_mpi_queue_create(0, &closed));
    bad_arguments(q);
    stream(q);
    OK(mp_mpi_barrier());
    later_calls(own);
    refused(closed);
    OK(mp_mpi_barrier());
    mp_queue_release(q), mp_queue_release(own), mp_queue_release(closed);
    return 0;
}

MP_ENTRY(case_ahead_kill)
{
    mp_queue *q = NULL;
    int rc = 0;
    OK(mp_mpi_queue_create(0, &q));
    if (rank == 2) {
        OK(mp_mpi_queue_put_ahead(q, 16));
        for (int i = 0; i < 200; i++) {
            mp_msg *m = numbered(2, i);
            OK(mp_queue_put(q, m, 30));
            mp_msg_destroy(m);
        }
        kill(getpid(), SIGKILL);
    } else if (rank == 0) {
        mp_msg *m = NULL;
        while ((rc = mp_queue_get(q, &m, -1)) == 0)
            mp_msg_destroy(m);
    } else { /* put ahead, then wait for the confirmations */
        OK(mp_mpi_queue_put_ahead(q, 8));
        mp_msg *m = numbered(rank, 1);
        double t0 = MPI_Wtime();
        while (rc == 0 && (rc = mp_queue_put(q, m, 30)) == 0 &&
               (rc = mp_mpi_queue_flush(q, -1)) == 0) {
            CHECK(MPI_Wtime() - t0 < 60, "no error 60 s after rank 2 died");
            usleep(1000); /* a same-host put never waits: rank 0 reports */
        }
        mp_msg_destroy(m);
    }
    CHECK(rc == MP_ECHILD, "a call while rank 2 died: %s", mp_err_name(rc));
    mp_queue_release(q);
    return rc;
}

int main(int argc, char **argv)
{
    return mpi_suite_main("mpi_ahead_suite", argc, argv, NULL);
}
