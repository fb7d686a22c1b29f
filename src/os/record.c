/* One record = one SOCK_SEQPACKET message with its fds (SCM_RIGHTS). The
 * common case is one sendmsg/recvmsg; poll runs only after EAGAIN. */
#include "os/os.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_FDS 253 /* SCM_MAX_FD: the kernel's limit per message */

/* Room for every fd the kernel can attach to one message, so MSG_CTRUNC can
 * only mean that installing the fds failed (the open-files limit), never
 * that our buffer was short. */
typedef union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
} fd_cmsg;

/* Waits for `events` on sock until deadline. 0 when ready. */
static int wait_ready(int sock, short events, double deadline, const char *what)
{
    struct pollfd p = {.fd = sock, .events = events};
    for (;;) {
        int ms, n;
        if (deadline == 0)
            return mp__error(MP_EAGAIN, "%s: would block", what);
        ms = mp__poll_ms(deadline);
        if (ms == 0)
            return mp__error(MP_ETIMEDOUT, "%s: timed out", what);
        n = poll(&p, 1, ms);
        if (n > 0)
            return 0; /* ready, or an error/hangup the next call reports */
        if (n < 0 && errno != EINTR)
            return mp__errno_error(errno, "%s: poll", what);
    }
}

int mp__send_record(int sock, const void *buf, size_t len, const int *fds, int nfds,
                    double deadline)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    fd_cmsg cbuf;

    /* A zero-byte record would read as EOF at the receiver. */
    if (sock < 0 || !buf || len == 0 || nfds < 0 || nfds > MAX_FDS || (nfds > 0 && !fds))
        return mp__error(MP_EINVAL, "mp__send_record: need a socket, 1+ bytes and "
                                    "0..%d fds (got len %zu, nfds %d)", MAX_FDS, len, nfds);
    if (nfds > 0) {
        struct cmsghdr *c;
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    for (;;) {
        ssize_t n = mp__sys.sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        int rc;
        if (n >= 0) {
            /* SEQPACKET sends whole records or nothing. */
            if ((size_t)n != len)
                return mp__error(MP_ESYS, "sendmsg: sent %zd of %zu bytes of a record",
                                 n, len);
            return 0;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return mp__errno_error(errno, "sendmsg(%zu bytes, %d fds)", len, nfds);
        rc = wait_ready(sock, POLLOUT, deadline, "sendmsg");
        if (rc < 0)
            return rc;
    }
}

static void close_all(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        mp__close(fds[i]);
}

/* Collects the SCM_RIGHTS fds of msg into got (room for MAX_FDS). */
static int collect_fds(struct msghdr *msg, int *got)
{
    int n = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        size_t k;
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        if (k > (size_t)(MAX_FDS - n))
            k = (size_t)(MAX_FDS - n);
        memcpy(got + n, CMSG_DATA(c), k * sizeof(int));
        n += (int)k;
    }
    return n;
}

/* Checks one received message; closes every fd on failure. */
static int check_received(struct msghdr *msg, ssize_t n, size_t cap, int *got, int ngot,
                          int maxfds)
{
    if (msg->msg_flags & MSG_CTRUNC) {
        /* Our buffer holds SCM_MAX_FD fds, so the kernel dropped fds it could
         * not install: the open-files limit (RLIMIT_NOFILE) was reached. */
        close_all(got, ngot);
        return mp__errno_error(EMFILE, "recvmsg: the record's fds did not fit (%d received, "
                                       "the rest dropped by the kernel)", ngot);
    }
    if (msg->msg_flags & MSG_TRUNC) {
        close_all(got, ngot);
        return mp__error(MP_EPROTO, "recvmsg: record longer than the %zu-byte buffer "
                                    "(%zd received)", cap, n);
    }
    if (ngot > maxfds) {
        close_all(got, ngot);
        return mp__error(MP_EPROTO, "recvmsg: record carried %d fds, at most %d expected",
                         ngot, maxfds);
    }
    if (n == 0) {
        close_all(got, ngot);
        return mp__error(MP_ECLOSED, "recvmsg: the peer closed the connection");
    }
    return 0;
}

int mp__recv_record(int sock, void *buf, size_t cap, size_t *len, int *fds, int maxfds,
                    int *nfds, double deadline)
{
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    fd_cmsg cbuf;
    int got[MAX_FDS];

    if (sock < 0 || !buf || cap == 0 || !len || maxfds < 0 || (maxfds > 0 && !fds) || !nfds)
        return mp__error(MP_EINVAL, "mp__recv_record: need a socket, a buffer, len and "
                                    "nfds (maxfds %d)", maxfds);
    for (;;) {
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                             .msg_controllen = sizeof cbuf.buf};
        ssize_t n = mp__sys.recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        int rc, ngot;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return mp__errno_error(errno, "recvmsg");
            rc = wait_ready(sock, POLLIN, deadline, "recvmsg");
            if (rc < 0)
                return rc;
            continue;
        }
        ngot = msg.msg_controllen > 0 ? collect_fds(&msg, got) : 0;
        rc = check_received(&msg, n, cap, got, ngot, maxfds);
        if (rc < 0)
            return rc;
        if (ngot > 0)
            memcpy(fds, got, sizeof(int) * (size_t)ngot);
        *len = (size_t)n;
        *nfds = ngot;
        return 0;
    }
}
