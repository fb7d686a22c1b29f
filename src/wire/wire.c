/* Send and receive one message as one SOCK_SEQPACKET record.
 *
 * A plain recvmsg that hits the open-files limit while the kernel installs
 * the fds sets MSG_CTRUNC, drops the fds it could not install and consumes
 * the record: the message would be lost. So a record that may carry fds is
 * read with MSG_PEEK (which installs copies of its fds without consuming
 * it); if that runs out of fds, the copies are closed, the call fails with
 * MP_EMFILE and the message stays queued. Otherwise a second, zero-length
 * recvmsg without a control buffer consumes the record, and the kernel drops
 * that call's second set of fd references. The two calls are one atomic step
 * only if a single reader uses the socket at a time: queues and pipe ends
 * hold their reader lock (mp__rx) around mp__wire_recv_rx.
 *
 * A record that cannot carry fds is taken in one recvmsg, as the bare
 * primitive would: the mp__rx handshake (rx.c) tells the reader when no
 * record with fds can be at the head of the socket. */
#include <errno.h>
#include <poll.h>
#include <stdalign.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "wire/frame.h"

/* Room for the largest inline record plus one byte, so a longer record shows
 * up as MSG_TRUNC. Per thread: receivers in several threads do not share. */
static _Thread_local alignas(8) unsigned char rbuf[sizeof(mp__frame_header) +
                                                   MP__WIRE_INLINE_MAX + 8];

int mp__wire_send(int sock, const mp_msg *m, double deadline)
{
    return mp__wire_send_rx(sock, NULL, m, deadline);
}

int mp__wire_send_rx(int sock, mp__rx *rx, const mp_msg *m, double deadline)
{
    mp__frame_out o;
    int rc;
    if (sock < 0 || !m)
        return mp__error(MP_EINVAL, "sending a message: %s",
                         sock < 0 ? "bad socket" : "NULL message");
    if ((rc = mp__frame_encode(m, rx ? &rx->pins : NULL, &o)) < 0)
        return rc;
    if (rx && o.nfds > 0)
        mp__rx_announce_fds(rx, sock);
    rc = mp__send_record(sock, o.buf, o.len, o.fds, o.nfds, deadline);
    mp__frame_out_done(&o, rc == 0);
    return rc;
}

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        fds[i] = mp__close(fds[i]);
}

static int emfile_error(const unsigned char *buf, size_t len, int got)
{
    struct rlimit rl = {0, 0};
    mp__frame_header h = {0};
    if (len >= sizeof h)
        memcpy(&h, buf, sizeof h);
    getrlimit(RLIMIT_NOFILE, &rl);
    return mp__error(MP_EMFILE,
                     "receiving a message: the message carries %u fds but only %d fit under the "
                     "open-files limit (RLIMIT_NOFILE = %llu); the message stays queued. "
                     "Raise the limit (ulimit -n, setrlimit) or switch to the file_system "
                     "strategy (mp_set_sharing_strategy(\"file_system\"))",
                     h.nfds, got, (unsigned long long)rl.rlim_cur);
}

/* One recvmsg into rbuf, the fds it brings into fds; -1 and errno on failure. */
static ssize_t read_record(int sock, int flags, int *fds, int *nfds, int *mflags)
{
    mp__fd_cmsg cbuf;
    struct iovec iov = {.iov_base = rbuf, .iov_len = sizeof rbuf};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                        .msg_controllen = sizeof cbuf.buf};
    ssize_t n = mp__sys.recvmsg(sock, &mh, flags | MSG_CMSG_CLOEXEC);
    if (n >= 0) {
        *nfds = mp__received_fds(&mh, fds, MP__WIRE_MAX_FDS, false);
        *mflags = mh.msg_flags;
    }
    return n;
}

/* Reads the next record into rbuf and fds: taken off the socket in one call
 * when rx proves that it carries no fds, peeked (left queued) otherwise. */
static ssize_t next_record(int sock, mp__rx *rx, int *fds, int *nfds, int *mflags,
                           double deadline, bool *peeked)
{
    for (;;) {
        /* Without a deadline the call itself sleeps (no poll round trip). */
        int flags = deadline < 0 ? 0 : MSG_DONTWAIT;
        ssize_t n;
        int rc;
        *peeked = !(rx && mp__rx_fast_begin(rx));
        n = read_record(sock, flags | (*peeked ? MSG_PEEK : 0), fds, nfds, mflags);
        if (!*peeked)
            mp__rx_fast_end(rx);
        if (n >= 0)
            return n;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return mp__errno_error(errno, "receiving a message: recvmsg");
        rc = mp__wait_fd(sock, POLLIN, deadline, "receiving a message: waiting for a message");
        if (rc < 0)
            return rc;
    }
}

/* Consumes the record just peeked; the kernel drops its fd references. */
static int consume(int sock)
{
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    for (;;) {
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        ssize_t n = mp__sys.recvmsg(sock, &mh, MSG_DONTWAIT);
        if (n >= 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return mp__errno_error(errno, "receiving a message: recvmsg consuming a peeked "
                                          "message");
        return mp__error(MP_ESTATE, "receiving a message: the peeked message vanished: another "
                                    "reader took it (one reader at a time per socket)");
    }
}

/* MP__FRAME_CLOSED or MP__FRAME_NUDGE when the record is that marker. */
static unsigned marker(const unsigned char *buf, size_t len, int nfds)
{
    mp__frame_header h;
    if (len != sizeof h || nfds)
        return 0;
    memcpy(&h, buf, sizeof h);
    if (h.magic != MP__FRAME_MAGIC || h.body_len)
        return 0;
    return h.flags == MP__FRAME_CLOSED || h.flags == MP__FRAME_NUDGE ? h.flags : 0;
}

/* A record came with more fds than the open-files limit let in. */
static int ctrunc_error(const unsigned char *buf, size_t len, int *fds, int nfds, bool peeked)
{
    int rc = peeked ? emfile_error(buf, len, nfds)
                    : mp__error(MP_EMFILE, "receiving a message: a message was lost: it "
                                           "carried fds its sender did not announce (it "
                                           "bypassed mp__wire_send_rx), and they did not fit "
                                           "under the open-files limit");
    close_fds(fds, nfds);
    return rc;
}

int mp__wire_recv(int sock, mp_msg **out, double deadline)
{
    bool taken;
    return mp__wire_recv_rx(sock, NULL, out, deadline, &taken);
}

int mp__wire_recv_rx(int sock, mp__rx *rx, mp_msg **out, double deadline, bool *taken)
{
    int fds[MP__WIRE_MAX_FDS];
    int nfds = 0, mflags = 0, rc;
    bool peeked;
    ssize_t n;
    *taken = false;
    if (out)
        *out = NULL;
    if (sock < 0 || !out)
        return mp__error(MP_EINVAL, "receiving a message: %s",
                         sock < 0 ? "bad socket" : "out is NULL");
    for (;;) {
        if ((n = next_record(sock, rx, fds, &nfds, &mflags, deadline, &peeked)) < 0)
            return (int)n;
        if (n == 0 && nfds == 0)
            return mp__error(MP_ECLOSED, "receiving a message: the peer closed the connection");
        *taken = !peeked;
        if (mflags & MSG_CTRUNC)
            return ctrunc_error(rbuf, (size_t)n, fds, nfds, peeked);
        switch (marker(rbuf, (size_t)n, nfds)) {
        case MP__FRAME_CLOSED:
            /* Peeked, it stays queued for every other reader. */
            *taken = false;
            return mp__error(MP_ECLOSED, "receiving a message: closed and drained");
        case MP__FRAME_NUDGE:
            *taken = false;
            if (peeked && (rc = consume(sock)) < 0)
                return rc;
            continue;
        }
        if (peeked && (rc = consume(sock)) < 0) {
            close_fds(fds, nfds);
            return rc;
        }
        *taken = true;
        if (mflags & MSG_TRUNC) {
            close_fds(fds, nfds);
            return mp__error(MP_EPROTO, "receiving a message: malformed frame: record longer than "
                                        "the %zu bytes a frame may have inline",
                             sizeof rbuf - 8);
        }
        return mp__wire_decode_rx(rx, rbuf, (size_t)n, fds, nfds, out);
    }
}

bool mp__wire_drop_nudge(int sock, mp__rx *rx)
{
    unsigned char head[sizeof(mp__frame_header)];
    struct iovec iov = {.iov_base = head, .iov_len = sizeof head};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    bool dropped = false;
    ssize_t n;
    /* Once: a busy reader will see the nudge itself. A holder that died
     * leaves the lock to us, made consistent, like any reader. */
    if (mp__rx_lock(rx, 0, "mp_conn_poll") < 0)
        return false;
    /* No control buffer: a record with fds shows MSG_CTRUNC, installs none. */
    n = mp__sys.recvmsg(sock, &mh, MSG_PEEK | MSG_DONTWAIT);
    if (n == (ssize_t)sizeof head && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
        marker(head, sizeof head, 0) == MP__FRAME_NUDGE)
        dropped = consume(sock) == 0;
    mp__rx_unlock(rx);
    return dropped;
}

int mp__wire_send_closed(int sock, double deadline)
{
    mp__frame_header h = {.magic = MP__FRAME_MAGIC, .version = MP__FRAME_VERSION,
                          .flags = MP__FRAME_CLOSED};
    return mp__send_record(sock, &h, sizeof h, NULL, 0, deadline);
}
