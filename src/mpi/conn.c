/* mp_mpi_conn: a pipe between two ranks. Same host: a real mproc pipe, one
 * end handed over the ranks' bootstrap socket. Across hosts: messages over
 * MPI on the conn's own tag, and a close notice on the next tag that says
 * how many messages were sent, so the peer drains them before MP_ECLOSED. */
#include "ipc/kinds.h"
#include "mpi/mpi_internal.h"
#include "mproc/queue.h"
#include "wire/wire.h"

#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

struct mp_mpi_conn {
    int peer;
    bool local;
    bool closed;          /* this end */
    mp_conn *lc;          /* same host */
    int tag;              /* across hosts: data; tag + 1: close notice */
    uint64_t received;
    mp__mpi_inflight *inflight; /* the last message sent, until MPI is done */
    MPI_Request close_in_req;   /* the peer's close notice */
    uint64_t close_in;          /* ... its count of messages sent */
    bool peer_closed;
    uint64_t sent;
    MPI_Request close_out_req;
    uint64_t close_out;
};

/* Hands the peer one end of a fresh mproc pipe, or takes it. */
static int local_handshake(mp_mpi_conn *c)
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
    if ((rc = mp__objkinds_ensure("mp_mpi_pipe")) < 0)
        return rc;
    for (;;) {
        rc = mp__wire_recv(sock, &m, mp__deadline(mp__mpi_slice(-1)));
        if (rc != MP_ETIMEDOUT)
            break;
        if ((rc = mp__mpi_check("mp_mpi_pipe")) != 0)
            return rc;
    }
    if (rc == 0) {
        if (mp_msg_count(m) != 1 || mp_msg_get_conn(m, 0, &c->lc) != 0)
            rc = mp__error(MP_EPROTO, "mp_mpi_pipe: rank %d sent no connection; do both ranks "
                                      "call mp_mpi_pipe in the same order?", c->peer);
        mp_msg_destroy(m);
    }
    return rc;
}

int mp_mpi_pipe(int peer, mp_mpi_conn **out)
{
    int rc = mp_mpi_is_local(peer), *ub = NULL, flag = 0;
    mp_mpi_conn *c;
    if (rc < 0)
        return rc;
    if (!out || peer == mp__mpi.rank)
        return mp__error(MP_EINVAL, "mp_mpi_pipe: %s", !out ? "out is NULL"
                                                           : "peer is this rank; use mp_pipe");
    if (mp__mpi.failed)
        return mp__mpi_fail_error("mp_mpi_pipe");
    if (!(c = calloc(1, sizeof *c)))
        return mp__error(MP_ENOMEM, "mp_mpi_pipe: out of memory");
    c->peer = peer;
    c->local = rc == 1;
    c->close_in_req = c->close_out_req = MPI_REQUEST_NULL;
    c->tag = MP__TAG_CONN + 2 * (int)mp__mpi.peers[peer].nconns++;
    MPI_Comm_get_attr(mp__mpi.comm, MPI_TAG_UB, &ub, &flag);
    if (flag && c->tag + 1 > *ub)
        rc = mp__error(MP_EOVERFLOW, "mp_mpi_pipe: more pipes with rank %d than MPI has tags "
                                     "(%d)", peer, *ub);
    else if (c->local)
        rc = local_handshake(c);
    else
        rc = MPI_Irecv(&c->close_in, 1, MPI_UINT64_T, peer, c->tag + 1, mp__mpi.comm,
                       &c->close_in_req) == MPI_SUCCESS ? 0
             : mp__error(MP_ESYS, "mp_mpi_pipe: MPI_Irecv failed");
    if (rc != 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int mp_mpi_conn_is_local(const mp_mpi_conn *c)
{
    return c && c->local ? 1 : 0;
}

/* A local call's MP_ECLOSED may be the peer dying: its socket closes a
 * moment before its pidfd turns readable, so give that a second. */
static int local_result(mp_mpi_conn *c, int rc, const char *fn)
{
    if (rc == MP_ECLOSED) {
        int pidfd = mp__mpi.peers[c->peer].pidfd;
        struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
        if (pidfd >= 0 && poll(&pfd, 1, 1000) == 1) {
            mp__mpi.next_pid_check = 0;
            int frc = mp__mpi_check(fn);
            if (frc)
                return frc;
        }
    }
    return rc;
}

/* A send or receive on the same-host mproc pipe, in slices with the
 * failure check between them. */
static int local_call(mp_mpi_conn *c, const mp_msg *m, mp_msg **out, double deadline)
{
    const char *fn = m ? "mp_mpi_conn_send" : "mp_mpi_conn_recv";
    for (;;) {
        double slice = mp__mpi_slice(deadline);
        int rc = m ? mp_conn_send(c->lc, m, slice) : mp_conn_recv(c->lc, out, slice);
        if (rc != MP_ETIMEDOUT)
            return local_result(c, rc, fn);
        if ((rc = mp__mpi_check(fn)) != 0 ||
            (rc = mp__mpi_expired(deadline, fn, m ? "would block" : "nothing to receive")) != 0)
            return rc;
    }
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

int mp_mpi_conn_send(mp_mpi_conn *c, const mp_msg *m, double timeout)
{
    double deadline = timeout == 0 ? 0 : mp__deadline(timeout);
    int rc;
    if (!c || !m)
        return mp__error(MP_EINVAL, "mp_mpi_conn_send: %s is NULL", !c ? "c" : "m");
    if (c->closed)
        return mp__error(MP_ECLOSED, "mp_mpi_conn_send: this end is closed");
    if (mp__mpi.failed)
        return mp__mpi_fail_error("mp_mpi_conn_send");
    if (c->local)
        return local_call(c, m, NULL, deadline);
    if (peer_closed(c))
        return mp__error(MP_ECLOSED, "mp_mpi_conn_send: rank %d closed its end", c->peer);
    if (c->inflight) {
        rc = mp__mpi_inflight_wait(c->inflight, deadline, "mp_mpi_conn_send");
        if (rc == 0)
            return mp__error(MP_ETIMEDOUT,
                             "mp_mpi_conn_send: the previous message to rank %d is still "
                             "being transferred; nothing was sent", c->peer);
        if (rc < 0)
            return rc;
        mp__mpi_inflight_free(c->inflight);
        c->inflight = NULL;
    }
    mp__mpi_inflight *f = NULL;
    rc = mp__mpi_xfer_send(m, c->peer, c->tag, &f);
    if (f) {
        c->inflight = f;
        c->sent++;
        if (mp__mpi_inflight_wait(f, 0, "mp_mpi_conn_send") == 1) {
            mp__mpi_inflight_free(f);
            c->inflight = NULL;
        }
    }
    return rc;
}

int mp_mpi_conn_recv(mp_mpi_conn *c, mp_msg **out, double timeout)
{
    double deadline = timeout == 0 ? 0 : mp__deadline(timeout);
    unsigned spins = 0;
    if (!c || !out)
        return mp__error(MP_EINVAL, "mp_mpi_conn_recv: %s is NULL", !c ? "c" : "out");
    if (c->closed)
        return mp__error(MP_ECLOSED, "mp_mpi_conn_recv: this end is closed");
    if (mp__mpi.failed)
        return mp__mpi_fail_error("mp_mpi_conn_recv");
    if (c->local)
        return local_call(c, NULL, out, deadline);
    for (;;) {
        MPI_Message msg;
        MPI_Status st;
        int found = 0, rc;
        if (c->inflight && mp__mpi_inflight_wait(c->inflight, 0, "mp_mpi_conn_recv") == 1) {
            mp__mpi_inflight_free(c->inflight);
            c->inflight = NULL;
        }
        rc = MPI_Improbe(c->peer, c->tag, mp__mpi.comm, &found, &msg, &st);
        if (rc != MPI_SUCCESS)
            return mp__mpi_error(rc, "mp_mpi_conn_recv", "MPI_Improbe");
        if (found) {
            rc = mp__mpi_xfer_recv(&msg, &st, c->tag, out);
            c->received++; /* taken, even when it could not be rebuilt */
            return rc;
        }
        if (peer_closed(c) && c->received >= c->close_in)
            return mp__error(MP_ECLOSED, "mp_mpi_conn_recv: rank %d closed its end and "
                                         "everything it sent was received", c->peer);
        if ((rc = mp__mpi_check("mp_mpi_conn_recv")) != 0)
            return rc;
        if ((rc = mp__mpi_expired(deadline, "mp_mpi_conn_recv", "nothing to receive")) != 0)
            return rc;
        if (c->inflight && spins >= 500)
            sched_yield(); /* our own send still moves only while MPI is called */
        else
            mp__mpi_backoff(&spins);
    }
}

int mp_mpi_conn_close(mp_mpi_conn *c)
{
    if (!c)
        return mp__error(MP_EINVAL, "mp_mpi_conn_close: c is NULL");
    if (c->closed)
        return 0;
    c->closed = true;
    if (c->local)
        return mp_conn_close(c->lc);
    c->close_out = c->sent;
    if (MPI_Isend(&c->close_out, 1, MPI_UINT64_T, c->peer, c->tag + 1, mp__mpi.comm,
                  &c->close_out_req) != MPI_SUCCESS)
        return mp__error(MP_ESYS, "mp_mpi_conn_close: MPI_Isend of the close notice failed");
    return 0;
}

void mp_mpi_conn_destroy(mp_mpi_conn *c)
{
    if (!c)
        return;
    mp__error_saved saved;
    mp__error_save(&saved);
    mp_mpi_conn_close(c);
    if (c->inflight) {
        int rc = 0;
        while (!mp__mpi.failed && rc == 0)
            rc = mp__mpi_inflight_wait(c->inflight, -1, "mp_mpi_conn_destroy");
        /* In a failed job MPI may still read the tensors: they stay (the
         * job is ending: mp_mpi_finalize aborts it). */
        if (rc == 1)
            mp__mpi_inflight_free(c->inflight);
    }
    if (c->close_out_req != MPI_REQUEST_NULL && !mp__mpi.failed)
        mp__mpi_wait(&c->close_out_req, -1, NULL, "mp_mpi_conn_destroy");
    if (c->close_in_req != MPI_REQUEST_NULL) {
        MPI_Cancel(&c->close_in_req);
        MPI_Wait(&c->close_in_req, MPI_STATUS_IGNORE);
    }
    mp_conn_release(c->lc);
    mp__error_restore(&saved);
    free(c);
}
