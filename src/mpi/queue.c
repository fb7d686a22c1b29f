/* mp_mpi_queue_create: one mproc Queue shared by every rank, served to its
 * user as an mp_queue (mp_queue_put, mp_queue_get... go through the ops
 * table below) (any producers, any
 * consumers). It lives on its home rank. Ranks of the home's host get the
 * real mp_queue (handed over their bootstrap socket) and use it directly,
 * so they share it as mproc processes do. Ranks on other hosts talk to a
 * broker thread on the home rank, the one thread this layer starts:
 *
 *   put:  [header {req}] + message on tag+0; the broker puts it into the
 *         queue and answers {req, rc} on tag+2. While the queue has no
 *         room (its socket buffer is full) the broker keeps the message
 *         parked, in order, and answers once it went in: it never blocks,
 *         so it goes on serving the gets that make room.
 *   get:  {req, GET} on tag+1; the broker parks it until the queue yields
 *         a message, then answers {req, 0} + the message on tag+2 (or
 *         {req, rc} when the queue is closed and drained).
 *   a get that times out sends {req, CANCEL}: the broker drops a request
 *   still parked and answers {req, MP_ETIMEDOUT}; one already answered is
 *   received after all (no message is lost or delivered twice).
 *   a put that times out sends {req, CANCEL_PUT}: the broker drops the
 *   message if it is still parked, or remembers to drop it if it has not
 *   arrived yet (another tag: the cancel may overtake it), and answers
 *   MP_ETIMEDOUT; a put already queued keeps its answer, 0.
 *   close: {req, CLOSE} closes the queue for everyone.
 *
 * A message of payload bytes alone that fits MP__MPI_SMALL travels inside
 * its put's header or its get's answer (qframe): one MPI message, not two.
 * The broker's work is done, one round at a time per queue, by its thread
 * or by a home thread at hand (queue_broker.c): a home get spins serving
 * every homed queue before it blocks, and takes a remote put into its own
 * queue directly when nothing is ahead of it; a home put hands its message
 * to a parked remote get when the queue is empty. Each short cut is a put
 * followed at once by the get that takes it, under the queue's broker
 * lock: order per producer, exactly-once delivery and the answers above
 * are the queue's own. A get that times out after its answer left
 * receives it all the same, as above.
 */
#include "ipc/ipc.h"
#include "ipc/kinds.h"
#include "ipc/remote.h"
#include "mpi/queue_mpi.h"
#include "wire/wire.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

static uint32_t nqueues; /* mp_mpi_queue_create calls: every rank counts alike */

static void queue_free(mp_mpi_queue *mq)
{
    mp__mpi_qbroker_stop(mq);
    for (int i = 0; i < 64; i++) {
        if (mq->sends[i] && !mp__mpi.failed)
            while (!mp__mpi_inflight_test(mq->sends[i]) && mp__mpi_check("mp_queue_release") == 0)
                ;
        if (mq->sends[i] && mp__mpi_inflight_test(mq->sends[i]))
            mp__mpi_inflight_free(mq->sends[i]);
    }
    for (int i = 0; i < mq->gets.n && !mp__mpi.failed; i++)
        mp__mpi_qanswer(mq, mq->gets.v[i].src, mq->gets.v[i].req, MP_ECLOSED, 0, NULL);
    for (int i = 0; i < mq->joins.n && !mp__mpi.failed; i++)
        mp__mpi_qanswer(mq, mq->joins.v[i].src, mq->joins.v[i].req, MP_ECLOSED, 0, NULL);
    for (int i = 0; i < mq->puts.n; i++)
        mp_msg_destroy(mq->puts.v[i].m); /* every rank left: nobody waits */
    for (int i = 0; i < MAX_PENDING; i++)
        if (mq->pending[i] && !mp__mpi_inflight_busy(mq->pending[i]))
            mp__mpi_inflight_free(mq->pending[i]);
    free(mq->gets.v), free(mq->puts.v), free(mq->dropped.v), free(mq->joins.v);
    free(mq->last_put), free(mq->ahead_counts);
    mp_queue_release(mq->q);
    pthread_mutex_destroy(&mq->lock);
    free(mq);
}

/* ---- creation ----------------------------------------------------------------- */

/* Same-host ranks: the home hands its queue over each bootstrap socket. */
static int share_local(mp_mpi_queue *mq, const char *fn)
{
    int rc = 0;
    if (mp__mpi.rank == mq->home) {
        mp_msg *m = NULL;
        if ((rc = mp_msg_create(&m)) == 0)
            rc = mp_msg_add_queue(m, NULL, mq->q);
        for (int r = 0; r < mp__mpi.size && rc == 0; r++)
            if (r != mq->home && mp_mpi_is_local(r) == 1)
                rc = mp__wire_send(mp__mpi.peers[r].sock, m, mp__deadline(30));
        mp_msg_destroy(m);
        return rc;
    }
    mp_msg *m = NULL;
    if ((rc = mp__objkinds_ensure(fn)) < 0)
        return rc;
    for (;;) {
        rc = mp__wire_recv(mp__mpi.peers[mq->home].sock, &m, mp__deadline(0.05));
        if (rc != MP_ETIMEDOUT)
            break;
        if ((rc = mp__mpi_check(fn)) != 0)
            return rc;
    }
    if (rc == 0 && (mp_msg_count(m) != 1 || mp_msg_get_queue(m, 0, &mq->q) != 0))
        rc = mp__error(MP_EPROTO, "%s: rank %d sent no queue; do all ranks create queues "
                                  "and pipes in the same order?", fn, mq->home);
    mp_msg_destroy(m);
    return rc;
}

/* Whether any rank reaches the home's queue over MPI: with none, no
 * broker thread runs (it would only take CPU from the ranks). */
static bool remote_ranks(void)
{
    for (int r = 0; r < mp__mpi.size; r++)
        if (mp_mpi_is_local(r) != 1)
            return true;
    return false;
}

static int create(int home, bool joinable, mp_mpi_queue **out, const char *fn)
{
    int rc = mp__mpi_own(fn), *ub = NULL, flag = 0;
    /* refused in a forked child before anything else can set the sentence */
    if (rc || (rc = mp__mpi_rank_check(home, "home", fn)) < 0)
        return rc;
    if (!out)
        return mp__error(MP_EINVAL, "%s: out is NULL", fn);
    mp_mpi_queue *mq = calloc(1, sizeof *mq);
    if (!mq)
        return mp__error(MP_ENOMEM, "%s: out of memory", fn);
    pthread_mutex_init(&mq->lock, NULL);
    mq->home = home;
    mq->joinable = joinable;
    mq->tag = MP__TAG_QUEUE + 4 * (int)nqueues++;
    MPI_Comm_get_attr(mp__mpi.comm, MPI_TAG_UB, &ub, &flag);
    if (flag && mq->tag + 3 > *ub)
        rc = mp__error(MP_EOVERFLOW, "%s: MPI's largest tag (%d) is too small for "
                                     "another queue", fn, *ub);
    else if (mp__mpi.thread_level < MPI_THREAD_MULTIPLE)
        rc = mp__error(MP_ENOTSUP, "%s: the queue's broker thread needs "
                                   "MPI_THREAD_MULTIPLE, which this MPI did not provide", fn);
    else if (mp__mpi.rank == home &&
             (!(mq->last_put = calloc((size_t)mp__mpi.size, sizeof *mq->last_put)) ||
              !(mq->ahead_counts = calloc((size_t)mp__mpi.size, sizeof *mq->ahead_counts))))
        rc = mp__error(MP_ENOMEM, "%s: out of memory", fn);
    else if (mp__mpi.rank == home)
        rc = joinable ? mp_joinable_queue_create(0, &mq->q) : mp_queue_create(0, &mq->q);
    else
        rc = 0;
    /* Only this layer reaches the queue (a cross-rank queue has no fd to
     * poll), so its ring never rings a doorbell: a queue's rings only once
     * its fd is handed out (ipc/ring.c). */
    if (rc == 0 && (mp__mpi.rank == home || mp_mpi_is_local(home) == 1))
        rc = share_local(mq, fn);
    if (rc == 0 && mp__mpi.rank == home && remote_ranks())
        rc = mp__mpi_qbroker_start(mq, fn);
    if (rc == 0)
        rc = mp_mpi_barrier();
    if (rc != 0) {
        queue_free(mq);
        return rc;
    }
    *out = mq;
    return 0;
}

/* ---- operations ------------------------------------------------------------ */

/* How long a get that finds the local queue empty watches it before its
 * first slice (microseconds, added to the local get's own spin before it
 * sleeps). */
#define LOCAL_WATCH_PAUSES 512

/* Whether a message is in the ring of the local queue q, or reached it
 * while a get watched it, without reading the clock. It watches the ring,
 * not the queue's size: a put counts before it publishes, and a poll that
 * comes too early looks at the socket. (A closed queue is seen by the
 * call after the watch.) */
static bool local_watch(mp_queue *q)
{
    for (int i = 0; i < LOCAL_WATCH_PAUSES; i++) {
        if (mp__queue_waiting((mp__queue *)q) > 0)
            return true;
        __builtin_ia32_pause();
    }
    return false;
}

/* A local queue call in slices, with the failure check between them. A
 * slice's deadline is a clock read (20-25 ns on a VM, a sixth of a
 * same-host round trip), so a put, or a get with a message waiting, is
 * first tried as a poll, and a get that finds the queue empty first
 * watches it (a same-host answer comes within a microsecond) before a
 * timed call, which pays that read while it waits anyway. */
static int local_call(mp_mpi_queue *mq, const mp_msg *in, mp_msg **out, double deadline,
                      const char *fn)
{
    if (deadline != 0 && (in || local_watch(mq->q))) {
        int rc = in ? mp_queue_put(mq->q, in, 0) : mp_queue_get(mq->q, out, 0);
        if (rc != MP_ETIMEDOUT)
            return rc;
    }
    for (;;) {
        double slice = mp__mpi_slice(deadline);
        int rc = in ? mp_queue_put(mq->q, in, slice) : mp_queue_get(mq->q, out, slice);
        if (rc != MP_ETIMEDOUT)
            return rc;
        if ((rc = mp__mpi_check(fn)) != 0 ||
            (rc = mp__mpi_expired(deadline, fn,
                                  in ? "the queue is full" : "the queue is empty")) != 0)
            return rc;
    }
}

/* A get on the home of a queue that ranks of other hosts use. For a while
 * it runs every homed queue's broker round between looks at its queue, so
 * what those ranks put reaches it, and their gets are answered, with no
 * broker nap in between; then it waits on the queue as any same-host get
 * does, the broker thread serving. */
static int home_get(mp_mpi_queue *mq, mp_msg **out, double deadline, const char *fn)
{
    int rc = MP_ETIMEDOUT;
    bool done = false;
    mp__mpi_qbroker_spinning(1);
    *out = NULL;
    for (unsigned spins = 0; spins < 2 * MP__MPI_SPINS && !done; spins++) {
        mp__mpi_qbroker_all(mq, out);
        if (*out) {
            rc = 0, done = true;
            break;
        }
        if (mp__mpi_qready(mq->q))
            done = (rc = mp_queue_get(mq->q, out, 0)) != MP_ETIMEDOUT;
        if (!done && spins % 16 == 0)
            done = (rc = mp__mpi_check(fn)) != 0 ||
                   (rc = mp__mpi_expired(deadline, fn, "the queue is empty")) != 0;
        if (!done && spins >= MP__MPI_SPINS)
            sched_yield();
    }
    mp__mpi_qbroker_spinning(-1);
    if (done)
        return rc;
    mp__mpi_qbroker_hand_back(); /* its broker thread serves while it blocks */
    return local_call(mq, NULL, out, deadline, fn);
}

bool mp__mpi_qrecv_cancel(MPI_Request *r, MPI_Status *st)
{
    int cancelled = 0;
    MPI_Cancel(r);
    MPI_Wait(r, st);
    MPI_Test_cancelled(st, &cancelled);
    return !cancelled;
}

/* The broker's answer to request req (waits, watching the job). A request
 * not answered by the deadline is cancelled with op; the broker then
 * answers it (MP_ETIMEDOUT) unless its answer was already on the way. */
int mp__mpi_qawait(mp_mpi_queue *mq, uint64_t req, double deadline, int op, qreq *a,
                   mp_msg **inl, const char *fn)
{
    qframe f;
    MPI_Request r;
    MPI_Status st;
    int count = 0;
    MPI_Irecv(&f, sizeof f, MPI_BYTE, mq->home, mq->tag + 2, mp__mpi.comm, &r);
    int rc = mp__mpi_qbroker_wait(&r, deadline, &st, fn);
    if (rc == MP_ETIMEDOUT) {
        qreq c = {req, op, 0, 0};
        MPI_Send(&c, sizeof c, MPI_BYTE, mq->home, mq->tag + 1, mp__mpi.comm);
        rc = mp__mpi_qbroker_wait(&r, -1, &st, fn);
    }
    if (rc != 0) { /* the job failed: nothing stays posted on f */
        mp__mpi_qrecv_cancel(&r, &st);
        return rc;
    }
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (f.h.req != req || count < (int)sizeof f.h)
        return mp__error(MP_EPROTO, "%s: answer %llu from rank %d, wanted %llu", fn,
                         (unsigned long long)f.h.req, mq->home, (unsigned long long)req);
    *a = f.h;
    if (count > (int)sizeof f.h)
        rc = inl ? mp__mpi_qframe_msg(&f, count, mq->home, mq->tag + 2, inl)
                 : mp__error(MP_EPROTO, "%s: rank %d answered with a message", fn, mq->home);
    return rc;
}

static int check_args(mp_mpi_queue *mq, const void *m, const char *fn)
{
    int rc;
    if (!mq || !m)
        return mp__error(MP_EINVAL, "%s: %s is NULL", fn, !mq ? "q" : "the message");
    if ((rc = mp__mpi_own(fn)) != 0)
        return rc;
    return mp__mpi.failed ? mp__mpi_fail_error(fn) : 0;
}

double mp__mpi_qdeadline(double deadline)
{
    double soon = mp__now() + 0.005;
    return deadline >= 0 && deadline < soon ? soon : deadline;
}

/* Frees the timed-out puts MPI is done with; a free slot's index, or -1. */
static int settle_pending(mp_mpi_queue *mq)
{
    int free_slot = -1;
    for (int i = 0; i < MAX_PENDING; i++) {
        if (mq->pending[i] && mp__mpi_inflight_test(mq->pending[i])) {
            mp__mpi_inflight_free(mq->pending[i]);
            mq->pending[i] = NULL;
        }
        if (!mq->pending[i] && free_slot < 0)
            free_slot = i;
    }
    return free_slot;
}

/* A slot for a put's bytes that MPI still carries after the put returns.
 * A put that runs ahead waits for one (by the deadline); a confirmed put
 * finds them taken only by puts that timed out: MP_ETIMEDOUT. */
static int pending_slot(mp_mpi_queue *mq, bool ahead, double deadline, const char *fn)
{
    int slot, w = 1;
    while ((slot = settle_pending(mq)) < 0 && ahead && w == 1)
        w = mp__mpi_inflight_wait(mq->pending[0], deadline, fn);
    if (slot >= 0 || w < 0)
        return slot >= 0 ? slot : w;
    return mp__error(MP_ETIMEDOUT, "%s: %d earlier puts are still being transferred to rank "
                                   "%d; nothing was sent", fn, MAX_PENDING, mq->home);
}

/* A put from another host: header and message to the broker, then its
 * answer, all by the deadline; a put whose bytes are still moving when
 * it times out leaves them to MPI (pending) and sends no more. A put that
 * runs ahead (queue_ahead.c) returns once it is sent, its bytes left to
 * MPI the same way. */
static int remote_put(mp_mpi_queue *mq, const mp_msg *m, double until, const char *fn)
{
    double deadline = mp__mpi_qdeadline(until);
    bool ahead = mq->ahead > 0;
    int rc = ahead ? mp__mpi_qahead_room(mq, deadline, fn) : 0;
    int slot = rc ? rc : pending_slot(mq, ahead, deadline, fn);
    qreq h = {++mq->next_req, ahead ? OP_POSTED : 0, ahead ? mq->ahead : 0, 0}, a;
    qframe small;
    size_t len = 0;
    mp__mpi_inflight *f = NULL;
    if (slot < 0)
        return slot;
    if (mp__mpi_xfer_pack(m, small.msg, sizeof small.msg, &len) == 0) {
        small.h = h; /* bytes alone: header and message in one */
        MPI_Send(&small, (int)(sizeof h + len), MPI_BYTE, mq->home, mq->tag, mp__mpi.comm);
    } else if ((rc = mp__mpi_xfer_check(m)) != 0) {
        return rc; /* checked first: once the header is out, the message must follow */
    } else {
        MPI_Send(&h, sizeof h, MPI_BYTE, mq->home, mq->tag, mp__mpi.comm);
        rc = mp__mpi_xfer_send(m, mq->home, mq->tag, &f);
    }
    if (rc == 0 && f && !ahead) {
        int w = mp__mpi_inflight_wait(f, deadline, fn);
        rc = w < 0 ? w : 0; /* not sent by the deadline: the answer decides */
    }
    if (f && mp__mpi_inflight_busy(f))
        mq->pending[slot] = f, f = NULL; /* the broker takes it, or drops it */
    mp__mpi_inflight_free(f);
    if (rc == 0 && ahead) {
        mq->ahead_sent++;
        return 0;
    }
    if (rc == 0)
        rc = mp__mpi_qawait(mq, h.req, deadline, OP_CANCEL_PUT, &a, NULL, fn);
    if (rc == 0 && a.op == MP_ETIMEDOUT)
        return mp__error(MP_ETIMEDOUT, "%s: %s", fn, until == 0 ? "the queue is full"
                                                                : "timed out");
    if (rc == 0 && a.op != 0)
        rc = mp__error(a.op, "%s: the queue on rank %d refused the message (%s)", fn, mq->home,
                       mp_err_name(a.op));
    return rc;
}

static int q_put(void *impl, const mp_msg *m, double deadline, const char *fn)
{
    mp_mpi_queue *mq = impl;
    int rc = check_args(mq, m, fn);
    if (rc || !mq->q)
        return rc ? rc : remote_put(mq, m, deadline, fn);
    if (mq->running && mp__mpi_qbroker_hand_over(mq, m))
        return 0;
    if ((rc = local_call(mq, m, NULL, deadline, fn)) == 0 && mq->running)
        mp__mpi_qbroker_push(mq); /* a rank of another host may wait for it */
    return rc;
}

static int q_get(void *impl, mp_msg **out, double deadline, const char *fn)
{
    mp_mpi_queue *mq = impl;
    int rc = check_args(mq, out, fn);
    if (rc || mq->q)
        return rc ? rc : mq->running ? home_get(mq, out, deadline, fn)
                                     : local_call(mq, NULL, out, deadline, fn);
    if ((rc = mp__mpi_qahead_settle(mq, mp__mpi_qdeadline(deadline), fn)) != 0)
        return rc;
    qreq r = {++mq->next_req, OP_GET, 0, 0}, a;
    MPI_Send(&r, sizeof r, MPI_BYTE, mq->home, mq->tag + 1, mp__mpi.comm);
    /* A poll gets one round trip to the home's broker. */
    settle_pending(mq);
    rc = mp__mpi_qawait(mq, r.req, mp__mpi_qdeadline(deadline), OP_CANCEL, &a, out, fn);
    if (rc || *out)
        return rc;
    if (a.op == MP_ETIMEDOUT && deadline == 0)
        return mp__error(MP_ETIMEDOUT, "%s: the queue is empty", fn);
    if (a.op == MP_ETIMEDOUT)
        return mp__error(MP_ETIMEDOUT, "%s: timed out", fn);
    if (a.op == MP_ENOTSUP)
        return mp__error(a.op, "%s: the message taken for this rank holds an object that "
                               "stays on rank %d's host (a queue, connection, lock or CUDA "
                               "tensor); it was dropped", fn, mq->home);
    if (a.op != 0)
        return mp__error(a.op, "%s: %s", fn, a.op == MP_ECLOSED ? "the queue is closed and "
                                                                  "drained" : mp_strerror(a.op));
    MPI_Message msg;
    MPI_Status st;
    int found = 0;
    unsigned spins = 0;
    while (!found && (rc = mp__mpi_check(fn)) == 0) {
        MPI_Improbe(mq->home, mq->tag + 2, mp__mpi.comm, &found, &msg, &st);
        if (!found)
            mp__mpi_backoff(&spins);
    }
    return rc ? rc : mp__mpi_xfer_recv_msg(&msg, &st, mq->tag + 2, out);
}

static int q_close(void *impl, const char *fn)
{
    mp_mpi_queue *mq = impl;
    int rc = check_args(mq, mq, fn);
    if (rc || mq->q)
        return rc ? rc : mp_queue_close(mq->q);
    if ((rc = mp__mpi_qahead_settle(mq, -1, fn)) != 0)
        return rc;
    qreq r = {++mq->next_req, OP_CLOSE, 0, 0}, a;
    MPI_Send(&r, sizeof r, MPI_BYTE, mq->home, mq->tag + 1, mp__mpi.comm);
    rc = mp__mpi_qawait(mq, r.req, -1, OP_CANCEL, &a, NULL, fn);
    return rc ? rc : a.op;
}

/* The last mp_queue_release: collective (every rank releases its queue). */
static void q_destroy(void *impl)
{
    mp_mpi_queue *mq = impl;
    mp__error_saved saved;
    if (mp__mpi_forked())
        return; /* no MPI here: the memory goes with this process */
    mp__error_save(&saved);
    /* Timed-out puts still moving reach the broker (which drops them)
     * before it stops; every rank is done with it after the barrier. */
    for (int i = 0; i < MAX_PENDING && !mp__mpi.failed; i++)
        while (mq->pending[i] &&
               mp__mpi_inflight_wait(mq->pending[i], -1, "mp_queue_release") == 0)
            ;
    if (!mp__mpi.failed)
        mp_mpi_barrier();
    queue_free(mq);
    mp__error_restore(&saved);
}

/* ---- as an mp_queue ------------------------------------------------------------ */

static const mp__queue_ops queue_ops = {
    "a queue shared by MPI ranks (mp_mpi_queue_create)", q_put, q_get, q_close,
    mp__mpi_qsize, mp__mpi_qtask_done, mp__mpi_qjoin, q_destroy};

static int create_queue(int home, bool joinable, mp_queue **out, const char *fn)
{
    mp_mpi_queue *mq = NULL;
    if (!out)
        return mp__error(MP_EINVAL, "%s: out is NULL", fn);
    *out = NULL;
    int rc = create(home, joinable, &mq, fn);
    if (rc)
        return rc;
    /* Every rank made its handle: a failure here is this rank's alone, so
     * its release is the collective part the others wait in. */
    if ((rc = mp__queue_wrap(joinable ? MP_ATTACH_JOINABLE_QUEUE : MP_ATTACH_QUEUE, &queue_ops,
                             mq, out)) != 0)
        q_destroy(mq);
    return rc;
}

int mp_mpi_queue_create(int home, mp_queue **out)
{
    return create_queue(home, false, out, "mp_mpi_queue_create");
}

int mp_mpi_joinable_queue_create(int home, mp_queue **out)
{
    return create_queue(home, true, out, "mp_mpi_joinable_queue_create");
}

#define MAX_AHEAD 1024

static mp_mpi_queue *queue_of(const mp_queue *q, const char *fn)
{
    mp_mpi_queue *mq = mp__queue_impl(q, &queue_ops);
    if (!mq)
        mp__error(MP_EINVAL, "%s: %s", fn,
                  q ? "not a queue made by mp_mpi_queue_create" : "q is NULL");
    return mq;
}

int mp_mpi_queue_is_local(const mp_queue *q)
{
    const mp_mpi_queue *mq = queue_of(q, "mp_mpi_queue_is_local");
    return !mq ? MP_EINVAL : mq->q ? 1 : 0;
}

int mp_mpi_queue_put_ahead(mp_queue *q, int window)
{
    const char *fn = "mp_mpi_queue_put_ahead";
    mp_mpi_queue *mq = queue_of(q, fn);
    int rc = mq ? check_args(mq, mq, fn) : MP_EINVAL;
    if (rc)
        return rc;
    if (window < 0 || window > MAX_AHEAD)
        return mp__error(MP_EINVAL, "%s: window %d is out of range: 0 (every put waits for "
                                    "the home) to %d", fn, window, MAX_AHEAD);
    if (window == 0 && !mq->q && (rc = mp__mpi_qahead_flush(mq, -1, fn)) != 0)
        return rc;
    mq->ahead = mq->q ? 0 : window;
    return 0;
}

int mp_mpi_queue_flush(mp_queue *q, double timeout)
{
    const char *fn = "mp_mpi_queue_flush";
    mp_mpi_queue *mq = queue_of(q, fn);
    int rc = mq ? check_args(mq, mq, fn) : MP_EINVAL;
    if (rc == 0)
        rc = mp__check_timeout(timeout, fn);
    if (rc || mq->q)
        return rc;
    return mp__mpi_qahead_flush(mq, mp__mpi_qdeadline(mp__deadline(timeout)), fn);
}
