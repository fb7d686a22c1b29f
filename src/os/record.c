/* One record = one SOCK_SEQPACKET message with its fds (SCM_RIGHTS). The
 * common case is one sendmsg/recvmsg; poll runs only after EAGAIN. */
#include "os/os.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

int mp__wait_fd(int sock, short events, double deadline, const char *what)
{
    struct pollfd p = {.fd = sock, .events = events};
    for (;;) {
        int ms, n;
        /* A timeout of 0 polls: "not ready" is a timeout that has passed,
         * one code for every blocking call (docs/errors.md). */
        if (deadline == 0)
            return mp__error(MP_ETIMEDOUT, "%s: not ready (timeout 0)", what);
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
    mp__fd_cmsg cbuf;

    /* A zero-byte record would read as EOF at the receiver. */
    if (sock < 0 || !buf || len == 0 || nfds < 0 || nfds > MP__MAX_FDS || (nfds > 0 && !fds))
        return mp__error(MP_EINVAL,
                         "mp__send_record: need a socket, 1+ bytes and "
                         "0..%d fds (got len %zu, nfds %d)",
                         MP__MAX_FDS, len, nfds);
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
        /* Without a deadline one blocking sendmsg sleeps in the kernel while
         * the socket is full: one system call where MSG_DONTWAIT + poll
         * would take three. A non-blocking socket still gets EAGAIN and
         * falls through to poll. */
        int flags = MSG_NOSIGNAL | (deadline < 0 ? 0 : MSG_DONTWAIT);
        ssize_t n = mp__sys.sendmsg(sock, &msg, flags);
        int rc;
        if (n >= 0) {
            /* SEQPACKET sends whole records or nothing. */
            if ((size_t)n != len)
                return mp__error(MP_ESYS, "sendmsg: sent %zd of %zu bytes of a record", n, len);
            return 0;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return mp__errno_error(errno, "sendmsg(%zu bytes, %d fds)", len, nfds);
        rc = mp__wait_fd(sock, POLLOUT, deadline, "sendmsg");
        if (rc < 0)
            return rc;
    }
}

int mp__received_fds(struct msghdr *msg, int *out, int cap, bool close_them)
{
    int n = 0;
    if (msg->msg_controllen == 0)
        return 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        size_t k;
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++, n++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (out && n < cap)
                out[n] = fd;
            if (close_them)
                mp__close(fd);
        }
    }
    return n;
}

/* Checks one received message; closes every fd on failure. */
static int check_received(struct msghdr *msg, ssize_t n, size_t cap, int ngot, int maxfds)
{
    int rc = 0;
    if (msg->msg_flags & MSG_CTRUNC)
        /* Our buffer holds SCM_MAX_FD fds, so the kernel dropped fds it could
         * not install: the open-files limit (RLIMIT_NOFILE) was reached. */
        rc = mp__errno_error(EMFILE,
                             "recvmsg: the record's fds did not fit (%d received, "
                             "the rest dropped by the kernel)",
                             ngot);
    else if (msg->msg_flags & MSG_TRUNC)
        rc = mp__error(MP_EPROTO,
                       "recvmsg: record longer than the %zu-byte buffer "
                       "(%zd received)",
                       cap, n);
    else if (ngot > maxfds)
        rc = mp__error(MP_EPROTO, "recvmsg: record carried %d fds, at most %d expected", ngot,
                       maxfds);
    else if (n == 0)
        rc = mp__error(MP_ECLOSED, "recvmsg: the peer closed the connection");
    if (rc < 0)
        mp__received_fds(msg, NULL, 0, true);
    return rc;
}

int mp__recv_record(int sock, void *buf, size_t cap, size_t *len, int *fds, int maxfds, int *nfds,
                    double deadline)
{
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    mp__fd_cmsg cbuf;

    if (sock < 0 || !buf || cap == 0 || !len || maxfds < 0 || (maxfds > 0 && !fds) || !nfds)
        return mp__error(MP_EINVAL,
                         "mp__recv_record: need a socket, a buffer, len and "
                         "nfds (maxfds %d)",
                         maxfds);
    for (;;) {
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = cbuf.buf,
                             .msg_controllen = sizeof cbuf.buf};
        ssize_t n = mp__sys.recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        int rc, ngot;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return mp__errno_error(errno, "recvmsg");
            rc = mp__wait_fd(sock, POLLIN, deadline, "recvmsg");
            if (rc < 0)
                return rc;
            continue;
        }
        /* one pass: copies at most maxfds, counts all, so a record with
         * too many is refused (and its fds closed) by check_received */
        ngot = mp__received_fds(&msg, fds, maxfds, false);
        rc = check_received(&msg, n, cap, ngot, maxfds);
        if (rc < 0)
            return rc;
        *len = (size_t)n;
        *nfds = ngot;
        return 0;
    }
}
