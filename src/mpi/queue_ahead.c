/* Puts that run ahead of the home's answers (mp_mpi_queue_put_ahead): a
 * rank of another host sends its put and goes on, so a stream of puts
 * costs one MPI message each instead of a round trip. Protocol (beside
 * queue.c's):
 *
 *   put:     [header {req, POSTED, window}] + message on tag+0, as any
 *            put; the broker answers nothing on tag+2. Once it took the
 *            put (queued it, handed it to a get, or refused it) it counts
 *            it, and confirms on tag+3 with {0, rc, -, done}, done being
 *            how many of the rank's puts it took so far: at once for a
 *            refusal (rc != 0), else once half a window came since the
 *            last confirmation.
 *   flush:   {req, FLUSH, -, sent} on tag+1: the broker confirms once it
 *            took `sent` of the rank's puts (the request travels on another
 *            tag than the puts and may overtake them).
 *
 * A put that waits for its window, and a rank's other calls on the queue
 * (which first settle: wait until every put is confirmed), never leave a
 * receive posted on return. The same tags' order per rank keeps the
 * queue's order per producer: every put, running ahead or not, is taken
 * in the order it was sent. */
#include "mpi/queue_mpi.h"

/* ---- the home ------------------------------------------------------------------ */

static void confirm(mp_mpi_queue *b, int src, int rc)
{
    ahead_count *c = &b->ahead_counts[src];
    qreq a = {0, rc, 0, c->done};
    MPI_Send(&a, sizeof a, MPI_BYTE, src, b->tag + 3, mp__mpi.comm);
    c->told = c->done;
    if (c->want && c->done >= c->want)
        c->want = 0;
}

void mp__mpi_qahead_taken(mp_mpi_queue *b, int src, int window, int rc)
{
    ahead_count *c = &b->ahead_counts[src];
    int64_t batch = window > 1 ? window / 2 : 1;
    c->done++;
    if (rc != 0 || c->done - c->told >= batch || (c->want && c->done >= c->want))
        confirm(b, src, rc);
}

void mp__mpi_qahead_flush_request(mp_mpi_queue *b, int src, const qreq *r)
{
    ahead_count *c = &b->ahead_counts[src];
    if (c->done >= r->val)
        confirm(b, src, 0);
    else
        c->want = r->val;
}

/* ---- a rank of another host ------------------------------------------------------ */

static void absorb(mp_mpi_queue *mq, const qreq *a)
{
    if (a->val > mq->ahead_done)
        mq->ahead_done = a->val;
    if (a->op != 0) {
        mq->ahead_refused++;
        mq->ahead_rc = a->op;
    }
}

/* Confirmations already here, without waiting. */
static void take_confirmations(mp_mpi_queue *mq)
{
    for (;;) {
        MPI_Status st;
        qreq a;
        int found = 0;
        MPI_Iprobe(mq->home, mq->tag + 3, mp__mpi.comm, &found, &st);
        if (!found)
            return;
        MPI_Recv(&a, sizeof a, MPI_BYTE, mq->home, mq->tag + 3, mp__mpi.comm, &st);
        absorb(mq, &a);
    }
}

/* One confirmation by the deadline (serving this rank's homed queues
 * meanwhile, as any wait for a broker does). */
static int wait_confirmation(mp_mpi_queue *mq, double deadline, const char *fn)
{
    MPI_Request r;
    MPI_Status st;
    qreq a;
    MPI_Irecv(&a, sizeof a, MPI_BYTE, mq->home, mq->tag + 3, mp__mpi.comm, &r);
    int rc = mp__mpi_qbroker_wait(&r, deadline, &st, fn);
    if (rc == 0 || mp__mpi_qrecv_cancel(&r, &st))
        absorb(mq, &a);
    return rc;
}

static int report_refusals(mp_mpi_queue *mq, const char *fn)
{
    if (mq->ahead_refused == 0)
        return 0;
    int n = mq->ahead_refused, rc = mq->ahead_rc;
    mq->ahead_refused = 0;
    mq->ahead_closed = rc == MP_ECLOSED;
    return mp__error(rc, "%s: %d earlier put%s of this rank that ran ahead "
                         "(mp_mpi_queue_put_ahead) %s refused by the queue on rank %d (%s%s) "
                         "and lost",
                     fn, n, n == 1 ? "" : "s", n == 1 ? "was" : "were", mq->home,
                     mp_err_name(rc), rc == MP_ECLOSED ? ": it was closed first" : "");
}

int mp__mpi_qahead_room(mp_mpi_queue *mq, double deadline, const char *fn)
{
    int rc;
    /* A look for confirmations costs a turn of MPI's progress (a system
     * call over TCP): taken when one is due (half a window out), or the
     * put would wait for it anyway. A refusal thus comes back within half
     * a window of puts. */
    if (2 * (mq->ahead_sent - mq->ahead_done) >= mq->ahead)
        take_confirmations(mq);
    if ((rc = report_refusals(mq, fn)) != 0)
        return rc;
    if (mq->ahead_closed)
        return mp__error(MP_ECLOSED, "%s: the queue on rank %d is closed", fn, mq->home);
    while (mq->ahead_sent - mq->ahead_done >= mq->ahead) {
        rc = wait_confirmation(mq, deadline, fn);
        if (rc == MP_ETIMEDOUT)
            return mp__error(MP_ETIMEDOUT, "%s: %d puts are on their way to rank %d, "
                                           "unconfirmed (the window of "
                                           "mp_mpi_queue_put_ahead); nothing was put (a "
                                           "longer timeout or a wider window waits for "
                                           "the home)",
                             fn, mq->ahead, mq->home);
        if (rc != 0 || (rc = report_refusals(mq, fn)) != 0)
            return rc;
    }
    return 0;
}

int mp__mpi_qahead_settle(mp_mpi_queue *mq, double deadline, const char *fn)
{
    if (mq->ahead_sent == mq->ahead_done)
        return 0;
    take_confirmations(mq);
    if (mq->ahead_sent == mq->ahead_done)
        return 0;
    qreq r = {++mq->next_req, OP_FLUSH, 0, mq->ahead_sent};
    MPI_Send(&r, sizeof r, MPI_BYTE, mq->home, mq->tag + 1, mp__mpi.comm);
    int rc = 0;
    while (rc == 0 && mq->ahead_sent > mq->ahead_done)
        rc = wait_confirmation(mq, deadline, fn);
    return rc;
}

int mp__mpi_qahead_flush(mp_mpi_queue *mq, double deadline, const char *fn)
{
    int rc = mp__mpi_qahead_settle(mq, deadline, fn);
    return rc ? rc : report_refusals(mq, fn);
}
