/* A queue shared by every rank as a JoinableQueue, and its size. The counts live where the
 * queue lives: in the home's mp_queue (its shared control block counts
 * every message put and not yet task_done'd, whoever put it). Ranks of the
 * home's host call mp_queue_task_done/join/qsize on the real queue; ranks on
 * other hosts ask the home's broker:
 *
 *   task_done: {req, TASK_DONE} on tag+1, answered {req, rc};
 *   join:      {req, JOIN}, parked by the broker until the count is zero,
 *              then answered {req, 0}; a join that times out sends
 *              {req, CANCEL} (as a get does) and the broker answers a join
 *              still parked with MP_ETIMEDOUT;
 *   qsize:     {req, QSIZE}, answered {req, 0, size}.
 *
 * A rank that dies while others join ends the job as everywhere in the
 * layer: every join watches the job and returns MP_ECHILD. */
#include "mpi/queue_mpi.h"
#include "os/os.h"

#include <string.h>

/* ---- the broker's side (home rank, broker thread) ------------------------------ */

bool mp__mpi_qbroker_join_op(mp_mpi_queue *b, int src, const qreq *r)
{
    if (r->op == OP_TASK_DONE) {
        mp__mpi_qanswer(b, src, r->req, mp_queue_task_done(b->q), 0, NULL);
    } else if (r->op == OP_QSIZE) {
        mp__mpi_qanswer(b, src, r->req, 0, mp_queue_qsize(b->q), NULL);
    } else if (r->op == OP_JOIN) {
        if (!mp_queue_is_joinable(b->q))
            mp__mpi_qanswer(b, src, r->req, MP_ESTATE, 0, NULL);
        else if (mp__mpi_qpush(&b->joins, (parked){src, r->req, NULL, 0}) != 0)
            mp__mpi_qanswer(b, src, r->req, MP_ENOMEM, 0, NULL);
    } else {
        return false;
    }
    return true;
}

bool mp__mpi_qbroker_joins(mp_mpi_queue *b)
{
    if (b->joins.n == 0 || mp_queue_join(b->q, 0) != 0)
        return false;
    while (b->joins.n > 0) {
        parked p = mp__mpi_qtake(&b->joins, 0);
        mp__mpi_qanswer(b, p.src, p.req, 0, 0, NULL);
    }
    return true;
}

/* ---- the calls ------------------------------------------------------------------ */

static int need(mp_mpi_queue *mq, bool joinable, const char *fn)
{
    int rc;
    if (!mq)
        return mp__error(MP_EINVAL, "%s: q is NULL", fn);
    if ((rc = mp__mpi_own(fn)) != 0)
        return rc;
    if (mp__mpi.failed)
        return mp__mpi_fail_error(fn);
    if (joinable && !mq->joinable)
        return mp__error(MP_ESTATE, "%s: not a JoinableQueue (create it with "
                                    "mp_mpi_joinable_queue_create)", fn);
    return 0;
}

void mp__mpi_qrequest(mp_mpi_queue *mq, uint64_t req, int op)
{
    qreq r = {req, op, 0, 0};
    MPI_Send(&r, sizeof r, MPI_BYTE, mq->home, mq->tag + 1, mp__mpi.comm);
}

/* One request to the home's broker and its answer, waiting until deadline. */
static int ask(mp_mpi_queue *mq, int op, double deadline, qreq *a, const char *fn)
{
    int rc = mp__mpi_qahead_settle(mq, deadline, fn);
    if (rc)
        return rc;
    uint64_t req = ++mq->next_req;
    mp__mpi_qrequest(mq, req, op);
    return mp__mpi_qawait(mq, req, deadline, OP_CANCEL, a, NULL, fn);
}

int mp__mpi_qtask_done(void *impl, const char *fn)
{
    mp_mpi_queue *mq = impl;
    qreq a;
    int rc = need(mq, true, fn);
    if (rc || mq->q)
        return rc ? rc : mp_queue_task_done(mq->q);
    if ((rc = ask(mq, OP_TASK_DONE, -1, &a, fn)) != 0)
        return rc;
    if (a.op == MP_ESTATE)
        return mp__error(MP_ESTATE, "%s: called more times than messages were put", fn);
    return a.op ? mp__error(a.op, "%s: the queue on rank %d answered %s", fn, mq->home,
                            mp_err_name(a.op))
                : 0;
}

/* The same-host join in slices, with the failure check between them. */
static int local_join(mp_mpi_queue *mq, double deadline, const char *fn)
{
    for (;;) {
        int rc = mp_queue_join(mq->q, mp__mpi_slice(deadline));
        if (rc != MP_ETIMEDOUT)
            return rc;
        if ((rc = mp__mpi_check(fn)) != 0 ||
            (rc = mp__mpi_expired(deadline, fn, "messages are not yet task_done")) != 0)
            return rc;
    }
}

int mp__mpi_qjoin(void *impl, double deadline, const char *fn)
{
    mp_mpi_queue *mq = impl;
    qreq a;
    int rc = need(mq, true, fn);
    if (rc || mq->q)
        return rc ? rc : local_join(mq, deadline, fn);
    /* A poll still gets one round trip to the home's broker. */
    double until = deadline >= 0 && deadline < mp__now() + 0.005 ? mp__now() + 0.005
                                                                 : deadline;
    if ((rc = ask(mq, OP_JOIN, until, &a, fn)) != 0)
        return rc;
    if (a.op == MP_ETIMEDOUT)
        return mp__error(MP_ETIMEDOUT, "%s: %s", fn, deadline == 0 ? "messages are not yet "
                                                                     "task_done" : "timed out");
    return a.op ? mp__error(a.op, "%s: the queue on rank %d answered %s", fn, mq->home,
                            mp_err_name(a.op))
                : 0;
}

int64_t mp__mpi_qsize(void *impl, const char *fn)
{
    mp_mpi_queue *mq = impl;
    qreq a;
    int rc = need(mq, false, fn);
    if (rc || mq->q)
        return rc ? rc : mp_queue_qsize(mq->q);
    rc = ask(mq, OP_QSIZE, -1, &a, fn);
    return rc ? rc : a.val;
}
