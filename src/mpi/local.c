/* The same-host bootstrap: one AF_UNIX SOCK_SEQPACKET socket between every
 * two ranks of a host, over which mp_mpi_pipe hands one end of a real mproc
 * pipe (so tensors then travel as shared-memory handles, as between mproc
 * processes), and a pidfd per same-host rank for the failure watch.
 *
 * The sockets are found by name in the abstract namespace, named after a
 * random per-job token from rank 0; every accepted peer is checked with
 * SO_PEERCRED against the pid its rank announced over MPI, so no stranger
 * can slip in. Abstract names vanish with their socket: nothing to clean. */
#include "mpi/mpi_internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static socklen_t abstract_addr(struct sockaddr_un *a, const char *token, int rank)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "mproc-mpi-%s-%d", token, rank);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int open_listener(const char *token, int *out)
{
    struct sockaddr_un a;
    socklen_t len = abstract_addr(&a, token, mp__mpi.rank);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mp__errno_error(errno, "mp_mpi_init: socket");
    if (bind(fd, (struct sockaddr *)&a, len) < 0 || listen(fd, mp__mpi.local_size) < 0) {
        int rc = mp__errno_error(errno, "mp_mpi_init: binding the same-host socket @%s",
                                 a.sun_path + 1);
        mp__close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

static int connect_to(const char *token, int rank)
{
    struct sockaddr_un a;
    socklen_t len = abstract_addr(&a, token, rank);
    int32_t me = mp__mpi.rank;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mp__errno_error(errno, "mp_mpi_init: socket");
    if (connect(fd, (struct sockaddr *)&a, len) < 0 || send(fd, &me, sizeof me, MSG_NOSIGNAL) < 0) {
        int rc = mp__errno_error(errno, "mp_mpi_init: connecting to rank %d's same-host socket",
                                 rank);
        mp__close(fd);
        return rc;
    }
    mp__mpi.peers[rank].sock = fd;
    return 0;
}

/* Accepts one higher local rank: its first record names it, and the
 * kernel's credentials must match the pid that rank announced. */
static int accept_one(int lfd)
{
    struct ucred cred;
    socklen_t clen = sizeof cred;
    int32_t who = -1;
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return mp__errno_error(errno, "mp_mpi_init: accept on the same-host socket");
    if (recv(fd, &who, sizeof who, 0) != (ssize_t)sizeof who || who <= mp__mpi.rank ||
        who >= mp__mpi.size || mp__mpi.peers[who].local < 0 || mp__mpi.peers[who].sock >= 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
        cred.pid != mp__mpi.peers[who].pid) {
        mp__close(fd);
        return mp__error(MP_EPERM, "mp_mpi_init: a process that is not a rank of this job "
                                   "(or a rank announcing another) connected to the "
                                   "same-host socket");
    }
    mp__mpi.peers[who].sock = fd;
    return 0;
}

static int connect_pairs(const char *token)
{
    int lfd = -1, rc, higher = 0;
    if ((rc = open_listener(token, &lfd)) != 0)
        return rc;
    /* Every listener exists before anyone connects. */
    MPI_Barrier(mp__mpi.node);
    for (int r = 0; r < mp__mpi.size && rc == 0; r++) {
        if (mp__mpi.peers[r].local < 0 || r == mp__mpi.rank)
            continue;
        if (r < mp__mpi.rank)
            rc = connect_to(token, r);
        else
            higher++;
    }
    for (int i = 0; i < higher && rc == 0; i++)
        rc = accept_one(lfd);
    mp__close(lfd);
    return rc;
}

int mp__mpi_local_connect(const char *token)
{
    int rc = 0, ok, all = 0;
    mp__mpi.next_pid_check = 0;
    for (int r = 0; r < mp__mpi.size; r++)
        if (r != mp__mpi.rank && mp__mpi.peers[r].local >= 0)
            mp__mpi.peers[r].pidfd = mp__pidfd_open(mp__mpi.peers[r].pid);
    if (mp__mpi.local_path && mp__mpi.local_size > 1)
        rc = connect_pairs(token);
    /* Every rank learns whether every other rank got its sockets. */
    ok = rc == 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, mp__mpi.comm);
    if (rc == 0 && !all)
        rc = mp__error(MP_ESYS, "mp_mpi_init: another rank of this host could not set up its "
                                "same-host sockets; run with MPROC_MPI_LOCAL=0 to use MPI only");
    return rc;
}

void mp__mpi_local_close(void)
{
    for (int r = 0; mp__mpi.peers && r < mp__mpi.size; r++) {
        mp__mpi.peers[r].sock = mp__close(mp__mpi.peers[r].sock);
        mp__mpi.peers[r].pidfd = mp__close(mp__mpi.peers[r].pidfd);
    }
}
