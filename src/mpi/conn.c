/* mp_mpi_pipe: a pipe between two ranks, served to its user as an mp_conn
 * (mp_conn_send, mp_conn_recv... go through the ops table at the end).
 *
 * Between ranks of one host every message goes over a real mproc pipe
 * whose end was handed over the ranks' bootstrap socket: tensors by
 * handle (pinned when sent again), queues, locks..., and bytes alone
 * through its shared-memory ring, which a spinning receiver takes as fast
 * as MPI's own shared-memory transport. The pipe alone orders them. Its
 * ends are this file's own (nobody polls their fds), so its ring rings no
 * doorbells. MPI carries only the close notice, sent before the pipe is
 * closed, so that a receiver meeting the pipe's end tells a close from a
 * death.
 *
 * Across hosts every message is ordered by one MPI stream on the conn's
 * own tag, with a close notice on the next tag that says how many messages
 * were sent, so the peer drains them before MP_ECLOSED. The stream goes
 * into a receive of MP__MPI_SMALL bytes the conn keeps posted, as a plain
 * MPI_Recv waits: a small message arrives whole there, a larger one (or
 * any with tensors) sends a notice there and itself on the third tag,
 * where it is probed for. */
#include "ipc/ipc.h"
#include "ipc/kinds.h"
#include "ipc/remote.h"
#include "mpi/mpi_internal.h"
#include "mproc/queue.h"
#include "wire/wire.h"

#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

struct mp_mpi_conn {
    int peer;
    bool local;           /* same host: attachments go over lc */
    bool closed;          /* this end */
    mp_conn *lc;          /* same host */
    int tag;              /* small stream; tag + 1: close notice; tag + 2: large */
    char *small;          /* the posted receive's buffer (MP__MPI_SMALL) */
    MPI_Request small_req;
    bool repost;          /* small_req completed and is posted again later */
    uint64_t received;
    bool small_done;      /* small_req completed (a poll saw it), status below */
    MPI_Status small_st;
    mp__mpi_inflight *out; /* the last message sent, until MPI is done */
    mp__mpi_buf in;        /* headers received */
    MPI_Request close_in_req; /* the peer's close notice */
    uint64_t close_in;        /* ... its count of messages sent */
    bool peer_closed;
    uint64_t sent;
    MPI_Request close_out_req;
    uint64_t close_out;
};

/* Hands the peer one end of a fresh mproc pipe, or takes it. */
static int local_handshake(mp_mpi_conn *c, const char *fn)
{
    int sock = mp__mpi.peers[c->peer].sock, rc;
    mp_conn *a = NULL, *b = NULL;
    mp_msg *m = NULL;
    if (mp__mpi.rank < c->peer) {
        if ((rc = mp_pipe(true, &a, &b)) != 0)
            return rc;
        if ((rc = mp_msg_create(&m)) == 0 && (rc = mp_msg_add_conn(m, NULL, b)) == 0)
            rc = mp__wire_send(sock, m, mp__deadline(30));
        mp_msg_destroy(m);
        mp_conn_release(b);
        if (rc != 0) {
            mp_conn_release(a);
            return rc;
        }
        c->lc = a;
        return 0;
    }
    if ((rc = mp__objkinds_ensure(fn)) < 0)
        return rc;
    for (;;) {
        rc = mp__wire_recv(sock, &m, mp__deadline(mp__mpi_slice(-1)));
        if (rc != MP_ETIMEDOUT)
            break;
        if ((rc = mp__mpi_check(fn)) != 0)
            return rc;
    }
    if (rc == 0) {
        if (mp_msg_count(m) != 1 || mp_msg_get_conn(m, 0, &c->lc) != 0)
            rc = mp__error(MP_EPROTO, "%s: rank %d sent no connection; do both ranks "
                                      "call mp_mpi_pipe in the same order?", fn, c->peer);
        mp_msg_destroy(m);
    }
    return rc;
}

static void cancel(MPI_Request *r)
{
    if (*r != MPI_REQUEST_NULL) {
        MPI_Cancel(r);
        MPI_Wait(r, MPI_STATUS_IGNORE);
    }
}

int mp__mpi_pipe(int peer, mp_mpi_conn **out, const char *fn)
{
    int rc = mp__mpi_own(fn), *ub = NULL, flag = 0;
    mp_mpi_conn *c;
    /* refused in a forked child before anything else can set the sentence */
    if (rc || (rc = mp__mpi_rank_check(peer, "peer", fn)) < 0 ||
        (rc = mp_mpi_is_local(peer)) < 0)
        return rc;
    if (peer == mp__mpi.rank)
        return mp__error(MP_EINVAL, "%s: peer %d is this rank; a pipe within one process is "
                         "mp_pipe", fn, peer);
    if (mp__mpi.failed)
        return mp__mpi_fail_error(fn);
    if (!(c = calloc(1, sizeof *c)))
        return mp__error(MP_ENOMEM, "%s: out of memory", fn);
    c->peer = peer;
    c->local = rc == 1;
    c->close_in_req = c->close_out_req = c->small_req = MPI_REQUEST_NULL;
    c->tag = MP__TAG_CONN + 3 * (int)mp__mpi.peers[peer].nconns++;
    MPI_Comm_get_attr(mp__mpi.comm, MPI_TAG_UB, &ub, &flag);
    if (flag && c->tag + 2 > *ub)
        rc = mp__error(MP_EOVERFLOW, "%s: more pipes with rank %d than MPI has tags (%d)", fn,
                       peer, *ub);
    else if ((rc = mp__mpi_inflight_new(&c->out)) == 0 && c->local &&
             (rc = local_handshake(c, fn)) == 0)
        /* Nobody polls this end's fd (a poll looks at its ring): no
         * doorbell per message that finds no receiver waiting (a sendmsg
         * here and a recvmsg there). */
        rc = mp__conn_quiet(c->lc);
    if (rc == 0 && (MPI_Irecv(&c->close_in, 1, MPI_UINT64_T, peer, c->tag + 1, mp__mpi.comm,
                              &c->close_in_req) != MPI_SUCCESS ||
                    !(c->small = malloc(MP__MPI_SMALL)) ||
                    MPI_Irecv(c->small, MP__MPI_SMALL, MPI_BYTE, peer, c->tag, mp__mpi.comm,
                              &c->small_req) != MPI_SUCCESS))
        rc = mp__error(MP_ESYS, "%s: posting the conn's receives failed", fn);
    if (rc != 0) {
        cancel(&c->close_in_req), cancel(&c->small_req);
        free(c->small);
        mp_conn_release(c->lc);
        mp__mpi_inflight_free(c->out);
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

static bool peer_closed(mp_mpi_conn *c)
{
    int done = 0;
    if (!c->peer_closed && c->close_in_req != MPI_REQUEST_NULL) {
        MPI_Test(&c->close_in_req, &done, MPI_STATUS_IGNORE);
        c->peer_closed = done;
    }
    return c->peer_closed;
}

/* A local call's MP_ECLOSED is the peer's close, whose MPI notice it sent
 * before closing the pipe (so it arrives within microseconds), or the peer
 * dying: its socket closes a moment before its pidfd turns readable. A
 * second to tell which. */
static int local_result(mp_mpi_conn *c, int rc, const char *fn)
{
    if (rc != MP_ECLOSED) /* before any clock read: this is every call's way out */
        return rc;
    int pidfd = mp__mpi.peers[c->peer].pidfd;
    double until = mp__now() + 1;
    while (!peer_closed(c) && mp__now() < until) {
        struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
        if (poll(&pfd, pidfd >= 0 ? 1 : 0, 1) == 1) {
            mp__mpi.next_pid_check = 0;
            int frc = mp__mpi_check(fn);
            return frc ? frc : rc;
        }
    }
    return rc;
}

/* Slices of a wait on the same-host pipe: the failure check runs between
 * them, so another rank's failure ends the wait within a few ms. */
#define LOCAL_SLICE 0.005

/* A send or receive on the same-host mproc pipe, in slices with the
 * failure check between them; first as a poll when it need not wait, as
 * the queue's local_call does (mpi/queue.c says why). */
static int local_call(mp_mpi_conn *c, const mp_msg *m, mp_msg **out, double deadline,
                      const char *fn)
{
    if (deadline != 0 && (m || mp__conn_waiting(c->lc) > 0)) {
        int rc = m ? mp_conn_send(c->lc, m, 0) : mp_conn_recv(c->lc, out, 0);
        if (rc != MP_ETIMEDOUT)
            return local_result(c, rc, fn);
    }
    for (;;) {
        double slice = mp__mpi_slice(deadline);
        slice = slice < LOCAL_SLICE ? slice : LOCAL_SLICE;
        int rc = m ? mp_conn_send(c->lc, m, slice) : mp_conn_recv(c->lc, out, slice);
        if (rc != MP_ETIMEDOUT)
            return local_result(c, rc, fn);
        if ((rc = mp__mpi_check(fn)) != 0 ||
            (rc = mp__mpi_expired(deadline, fn, m ? "would block" : "nothing to receive")) != 0)
            return rc;
    }
}

/* Whether a message (or the end of the stream) waits on the same-host
 * pipe: 1, 0 by deadline, or an error. Its ring rings no doorbell, so the
 * ring is looked at, not only the fd. */
static int local_poll(mp_mpi_conn *c, double deadline, const char *fn)
{
    unsigned spins = 0;
    for (;;) {
        int rc = mp_conn_poll(c->lc, 0);
        if (rc != 0)
            return rc;
        if (spins % 16 == 0 || deadline == 0) {
            if ((rc = mp__mpi_check(fn)) != 0 ||
                (rc = mp__mpi_expired(deadline, fn, "nothing to receive")) != 0)
                return rc;
        }
        mp__mpi_backoff(&spins);
    }
}

/* The peer closed and did not take what is still in flight: it never
 * will (it received every message it took before closing). */
static bool abandoned(mp_mpi_conn *c)
{
    return peer_closed(c) && !mp__mpi_inflight_test(c->out);
}

/* Waits (until deadline) for the previous message to leave: one in
 * flight. In slices, so that a peer that closed without taking it ends
 * the wait. */
static int previous_sent(mp_mpi_conn *c, double deadline, const char *fn)
{
    while (mp__mpi_inflight_busy(c->out)) {
        double slice = mp__mpi_slice(deadline);
        int rc = mp__mpi_inflight_wait(c->out, slice > 0 ? mp__deadline(slice) : 0, fn);
        if (rc != 0)
            return rc < 0 ? rc : 0;
        if (abandoned(c))
            return mp__error(MP_ECLOSED, "%s: rank %d closed its end before taking the "
                                         "previous message", fn, c->peer);
        if (mp__mpi_expired(deadline, fn, "") != 0)
            return mp__error(MP_ETIMEDOUT, "%s: the previous message to rank %d is still "
                                           "being transferred; nothing was sent", fn, c->peer);
    }
    return 0;
}

/* Posts the receive for the next small message. Not at once when one was
 * taken: a receiver that answers would post it on the way to its answer,
 * so the next send or wait does (a message that came first waits in MPI,
 * in order). */
static int post_small(mp_mpi_conn *c, const char *fn)
{
    if (MPI_Irecv(c->small, MP__MPI_SMALL, MPI_BYTE, c->peer, c->tag, mp__mpi.comm,
                  &c->small_req) != MPI_SUCCESS) {
        c->small_req = MPI_REQUEST_NULL;
        return mp__error(MP_ESYS, "%s: posting the receive for rank %d's next message "
                                  "failed; release the conn", fn, c->peer);
    }
    c->repost = false;
    return 0;
}

int mp__mpi_conn_send(mp_mpi_conn *c, const mp_msg *m, double deadline, const char *fn)
{
    int rc;
    if (!c || !m)
        return mp__error(MP_EINVAL, "%s: %s is NULL", fn, !c ? "c" : "m");
    if ((rc = mp__mpi_own(fn)) != 0)
        return rc;
    if (c->closed)
        return mp__error(MP_ECLOSED, "%s: this end is closed", fn);
    if (mp__mpi.failed)
        return mp__mpi_fail_error(fn);
    /* Every 8th send asks MPI whether the peer closed (each ask runs its
     * progress engine once): a close is seen a few sends later at most,
     * as if its notice had been that much slower. */
    if ((c->sent % 8 == 0 || c->peer_closed) && peer_closed(c))
        return mp__error(MP_ECLOSED, "%s: rank %d closed its end", fn, c->peer);
    if (c->local) { /* every message: the pipe alone orders them */
        if ((rc = local_call(c, m, NULL, deadline, fn)) == 0)
            c->sent++;
        return rc;
    }
    if ((rc = previous_sent(c, deadline, fn)) != 0)
        return rc;
    rc = mp__mpi_xfer_post(c->out, m, c->peer, c->tag + 2, c->tag);
    if (mp__mpi_inflight_busy(c->out)) {
        c->sent++;
        mp__mpi_inflight_test(c->out); /* a small message leaves at once */
    }
    if (c->repost)
        (void)post_small(c, fn); /* failing, the next wait says so */
    return rc;
}

/* The large message a notice announced: sent right after it. */
static int take_large(mp_mpi_conn *c, mp_msg **out, const char *fn)
{
    unsigned spins = 0;
    for (;;) {
        MPI_Message msg;
        MPI_Status st;
        int found = 0, rc = MPI_Improbe(c->peer, c->tag + 2, mp__mpi.comm, &found, &msg, &st);
        if (rc != MPI_SUCCESS)
            return mp__mpi_error(rc, fn, "MPI_Improbe");
        if (found) {
            rc = mp__mpi_xfer_recv(&msg, &st, c->tag + 2, &c->in, out);
            return rc > 0 ? mp__error(MP_EPROTO, "%s: rank %d sent a notice where a message "
                                                 "belongs", fn, c->peer)
                          : rc;
        }
        if ((rc = mp__mpi_check(fn)) != 0)
            return rc;
        if (++spins > MP__MPI_SPINS)
            sched_yield(); /* it is on its way: never nap */
    }
}

/* A message (or notice) arrived in the posted receive. */
static int take_small(mp_mpi_conn *c, MPI_Status *st, mp_msg **out, const char *fn)
{
    int count = 0, rc;
    MPI_Get_count(st, MPI_BYTE, &count);
    c->received++; /* taken, even when it could not be rebuilt */
    rc = mp__mpi_xfer_parse(c->small, count, c->peer, c->tag, out);
    c->repost = true;
    return rc == MP__MPI_FOLLOWS ? take_large(c, out, fn) : rc;
}

/* Waits until deadline for the posted receive to complete (its status is
 * kept in c->small_st, c->small_done set, until recv takes it): 1 then, or
 * MP_ECLOSED (the peer closed and everything it sent was received),
 * MP_ETIMEDOUT, MP_ECHILD, another error. */
static int wait_small(mp_mpi_conn *c, double deadline, const char *fn)
{
    unsigned spins = 0;
    int rc;
    if (c->closed)
        return mp__error(MP_ECLOSED, "%s: this end is closed", fn);
    if (mp__mpi.failed)
        return mp__mpi_fail_error(fn);
    if (c->small_done)
        return 1;
    if (c->repost && (rc = post_small(c, fn)) < 0)
        return rc;
    if (c->small_req == MPI_REQUEST_NULL)
        return mp__error(MP_ESYS, "%s: the conn lost its posted receive to an MPI error", fn);
    for (;;) {
        int done = 0;
        bool sending = mp__mpi_inflight_busy(c->out);
        if (sending)
            mp__mpi_inflight_test(c->out);
        if ((rc = MPI_Test(&c->small_req, &done, &c->small_st)) != MPI_SUCCESS)
            return mp__mpi_error(rc, fn, "MPI_Test");
        if (done)
            return c->small_done = true, 1;
        /* The rest every 16 rounds (and at once for a poll): a receiver
         * that only tests answers sooner. */
        if (spins % 16 == 15 || deadline == 0) {
            if (peer_closed(c) && c->received >= c->close_in)
                return mp__error(MP_ECLOSED, "%s: rank %d closed its end and everything it "
                                             "sent was received", fn, c->peer);
            if ((rc = mp__mpi_check(fn)) != 0 ||
                (rc = mp__mpi_expired(deadline, fn, "nothing to receive")) != 0)
                return rc;
        }
        if (sending && spins >= MP__MPI_SPINS)
            sched_yield(), spins++; /* our own send moves only while MPI is called */
        else
            mp__mpi_backoff(&spins);
    }
}

/* What a same-host conn's receive and poll check first. */
static int local_ready(mp_mpi_conn *c, const char *fn)
{
    if (c->closed)
        return mp__error(MP_ECLOSED, "%s: this end is closed", fn);
    return mp__mpi.failed ? mp__mpi_fail_error(fn) : 0;
}

int mp__mpi_conn_recv(mp_mpi_conn *c, mp_msg **out, double deadline, const char *fn)
{
    if (!c || !out)
        return mp__error(MP_EINVAL, "%s: %s is NULL", fn, !c ? "c" : "out");
    *out = NULL;
    int rc = mp__mpi_own(fn);
    if (rc == 0 && c->local && (rc = local_ready(c, fn)) == 0 &&
        (rc = local_call(c, NULL, out, deadline, fn)) == 0)
        c->received++;
    if (c->local || rc < 0)
        return rc;
    if ((rc = wait_small(c, deadline, fn)) < 0)
        return rc;
    c->small_done = false;
    return take_small(c, &c->small_st, out, fn);
}

static int conn_poll(void *impl, double deadline, const char *fn)
{
    mp_mpi_conn *c = impl;
    int rc = mp__mpi_own(fn);
    if (rc == 0)
        rc = c->local ? local_ready(c, fn) : wait_small(c, deadline, fn);
    if (rc == 0 && c->local)
        rc = local_poll(c, deadline, fn);
    /* The end of the stream is ready to receive (as EOF is for mp_pipe). */
    return rc == 1 || rc == MP_ECLOSED ? 1 : rc == MP_ETIMEDOUT ? 0 : rc;
}

int mp__mpi_conn_close(mp_mpi_conn *c, const char *fn)
{
    if (!c)
        return mp__error(MP_EINVAL, "%s: c is NULL", fn);
    if (mp__mpi_forked())
        return mp__mpi_own(fn);
    if (c->closed)
        return 0;
    c->closed = true;
    c->close_out = c->sent;
    /* The notice first: a peer that meets the pipe's end finds it soon
     * after and knows the end is a close, not a death. */
    int rc = MPI_Isend(&c->close_out, 1, MPI_UINT64_T, c->peer, c->tag + 1, mp__mpi.comm,
                       &c->close_out_req);
    if (c->local)
        mp_conn_close(c->lc);
    if (rc != MPI_SUCCESS)
        return mp__error(MP_ESYS, "%s: MPI_Isend of the close notice failed", fn);
    return 0;
}

void mp__mpi_conn_destroy(mp_mpi_conn *c)
{
    if (!c || mp__mpi_forked()) /* forked: no MPI here, the memory goes with it */
        return;
    mp__error_saved saved;
    mp__error_save(&saved);
    mp__mpi_conn_close(c, "mp_conn_release");
    int rc = 0;
    while (!mp__mpi.failed && rc == 0 && !abandoned(c))
        rc = mp__mpi_inflight_wait(c->out, mp__deadline(0.05), "mp_conn_release");
    /* In a failed job, or when the peer closed without taking the last
     * message, MPI may still hold its tensors: they stay (an abandoned
     * send never completes; a failed job is ending). */
    if (!mp__mpi_inflight_busy(c->out))
        mp__mpi_inflight_free(c->out);
    if (c->close_out_req != MPI_REQUEST_NULL && !mp__mpi.failed)
        mp__mpi_wait(&c->close_out_req, -1, NULL, "mp_conn_release");
    cancel(&c->close_in_req);
    cancel(&c->small_req);
    mp_conn_release(c->lc);
    free(c->in.p);
    free(c->small);
    mp__error_restore(&saved);
    free(c);
}

/* ---- as an mp_conn ---------------------------------------------------------- */

static int conn_send(void *impl, const mp_msg *m, double deadline, const char *fn)
{
    return mp__mpi_conn_send(impl, m, deadline, fn);
}
static int conn_recv(void *impl, mp_msg **out, double deadline, const char *fn)
{
    return mp__mpi_conn_recv(impl, out, deadline, fn);
}
static int conn_close(void *impl, const char *fn) { return mp__mpi_conn_close(impl, fn); }
static void conn_destroy(void *impl) { mp__mpi_conn_destroy(impl); }

static const mp__conn_ops conn_ops = {
    "a connection between MPI ranks (mp_mpi_pipe)", conn_send, conn_recv, conn_poll,
    conn_close, conn_destroy};

int mp_mpi_pipe(int peer, mp_conn **out)
{
    mp_mpi_conn *c = NULL;
    if (!out)
        return mp__error(MP_EINVAL, "mp_mpi_pipe: out is NULL");
    *out = NULL;
    int rc = mp__mpi_pipe(peer, &c, "mp_mpi_pipe");
    if (rc == 0 && (rc = mp__conn_wrap(&conn_ops, c, out)) != 0)
        mp__mpi_conn_destroy(c);
    return rc;
}

int mp_mpi_conn_is_local(const mp_conn *c)
{
    const mp_mpi_conn *mc = mp__conn_impl(c, &conn_ops);
    if (!mc)
        return mp__error(MP_EINVAL, "mp_mpi_conn_is_local: %s", c ? "not a connection made by "
                                                                    "mp_mpi_pipe"
                                                                  : "c is NULL");
    return mc->local ? 1 : 0;
}
