/* Pipe / Connection: one end of a SOCK_SEQPACKET socket pair, and a ring
 * per direction in the pipe's control segment (src/ipc/ring.c): small
 * messages without fds take the ring, the rest the socket. */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ipc/ipc.h"
#include "ipc/remote.h"
#include "ipc/ring.h"
#include "mproc/wait.h"

enum { CONN_READ = 1, CONN_WRITE = 2 };

#define CONN_CTL_MAGIC 0x6c74636e6e6f636dull /* "mconnctl" */

#define CONN_CTL_VERSION 8u /* 8: the ring's wait flags hold the position waited for */

/* Shared by the two ends of a pipe (a sealed memfd): the receive side of
 * each end, so several threads or processes receiving on one end take turns
 * instead of interleaving their receives, and the ring of messages arriving
 * at each end. */
typedef struct conn_ctl {
    uint64_t magic;
    uint32_t version;
    uint32_t reserved;
    mp__rx rx[2];
    mp__ring ring[2];
} conn_ctl;

struct mp_conn {
    _Atomic int refs;
    int sock;
    int mode;              /* CONN_READ | CONN_WRITE */
    int end;               /* 0 or 1: which of ctl->rx this end receives on */
    mp__segment *seg;      /* holds conn_ctl */
    const mp__conn_ops *ops; /* NULL: the local pipe above; else ops serve it */
    void *impl;
};

/* What this end receives on, and what its peer end receives on (where this
 * end's sends arrive). */
static mp__rx *conn_rx(const mp_conn *c, bool peer)
{
    return &((conn_ctl *)mp__segment_data(c->seg))->rx[peer ? 1 - c->end : c->end];
}

static int conn_new(int sock, int mode, int end, mp__segment *seg, mp_conn **out)
{
    mp_conn *c = calloc(1, sizeof *c);
    if (!c)
        return mp__error(MP_ENOMEM, "mp_pipe: out of memory");
    atomic_init(&c->refs, 1);
    c->sock = sock;
    c->mode = mode;
    c->end = end;
    c->seg = mp__segment_retain(seg);
    if ((mode & CONN_READ) && mp__pins_attach(&conn_rx(c, false)->pins) < 0) {
        mp__segment_release(c->seg);
        free(c);
        return MP_ENOMEM;
    }
    *out = c;
    return 0;
}

static mp__ring *conn_ring(const mp_conn *c, bool peer)
{
    return &((conn_ctl *)mp__segment_data(c->seg))->ring[peer ? 1 - c->end : c->end];
}

static int conn_send(mp_conn *c, const mp_msg *m, double timeout, const char *fn)
{
    return mp__ring_send(conn_ring(c, true), c->sock, conn_rx(c, true), m,
                         mp__ipc_deadline(timeout), true, fn);
}

static int ctl_create(mp__segment **out)
{
    conn_ctl *ctl;
    int rc = mp__segment_create(sizeof(conn_ctl), MP__STRATEGY_FD, out);
    if (rc < 0)
        return rc;
    ctl = mp__segment_data(*out);
    ctl->magic = CONN_CTL_MAGIC;
    ctl->version = CONN_CTL_VERSION;
    if ((rc = mp__rx_init(&ctl->rx[0], "mp_pipe")) < 0 ||
        (rc = mp__rx_init(&ctl->rx[1], "mp_pipe")) < 0 ||
        (rc = mp__ring_init(&ctl->ring[0], "mp_pipe")) < 0 ||
        (rc = mp__ring_init(&ctl->ring[1], "mp_pipe")) < 0) {
        mp__segment_release(*out);
        *out = NULL;
    }
    return rc;
}

int mp_pipe(bool duplex, mp_conn **a, mp_conn **b)
{
    int sv[2] = {-1, -1}, rc;
    mp__segment *seg = NULL;
    if (!a || !b)
        return mp__error(MP_EINVAL, "mp_pipe: %s is NULL", a ? "b" : "a");
    if (a == b)
        return mp__error(MP_EINVAL, "mp_pipe: a and b are the same pointer; the second end "
                         "would overwrite the first: pass two");
    *a = *b = NULL;
    if ((rc = ctl_create(&seg)) < 0)
        return rc;
    if (mp__sys.socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = mp__errno_error(errno, "mp_pipe: socketpair");
        goto out_seg;
    }
    if ((rc = conn_new(sv[0], duplex ? CONN_READ | CONN_WRITE : CONN_READ, 0, seg, a)) < 0)
        goto out_socks;
    if ((rc = conn_new(sv[1], duplex ? CONN_READ | CONN_WRITE : CONN_WRITE, 1, seg, b)) < 0) {
        mp_conn_release(*a);   /* closes sv[0] */
        *a = NULL;
        sv[0] = -1;
        goto out_socks;
    }
    if (!duplex) {
        /* A write on the read end would otherwise queue silently forever. */
        shutdown(sv[0], SHUT_WR);
        shutdown(sv[1], SHUT_RD);
    }
    mp__segment_release(seg);
    return 0;
out_socks:
    mp__close(sv[0]);
    mp__close(sv[1]);
out_seg:
    mp__segment_release(seg);
    return rc;
}

mp_conn *mp_conn_retain(mp_conn *c)
{
    if (c)
        atomic_fetch_add(&c->refs, 1);
    return c;
}

void mp_conn_release(mp_conn *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    if (c->ops) {
        c->ops->destroy(c->impl);
        free(c);
        return;
    }
    if (c->sock >= 0)
        mp_conn_close(c);
    if (c->mode & CONN_READ)
        mp__pins_detach(&conn_rx(c, false)->pins);
    mp__segment_release(c->seg);
    free(c);
}

static int usable(mp_conn *c, int mode, const char *fn)
{
    if (!c)
        return mp__error(MP_EINVAL, "%s: connection is NULL", fn);
    if (c->sock < 0)
        return mp__error(MP_ECLOSED, "%s: this connection was closed", fn);
    if (!(c->mode & mode))
        return mp__error(MP_ESTATE, "%s: this end of a one-way pipe only %s", fn,
                         mode == CONN_READ ? "sends" : "receives");
    return 0;
}

int mp__conn_wrap(const mp__conn_ops *ops, void *impl, mp_conn **out)
{
    mp_conn *c = calloc(1, sizeof *c);
    if (!c)
        return mp__error(MP_ENOMEM, "mp_conn: out of memory");
    atomic_init(&c->refs, 1);
    c->sock = -1;
    c->mode = CONN_READ | CONN_WRITE;
    c->ops = ops;
    c->impl = impl;
    *out = c;
    return 0;
}

void *mp__conn_impl(const mp_conn *c, const mp__conn_ops *ops)
{
    return c && c->ops == ops ? c->impl : NULL;
}

bool mp__conn_is_remote(const mp_conn *c) { return c && c->ops; }

int mp_conn_send(mp_conn *c, const mp_msg *m, double timeout)
{
    int rc = mp__check_timeout(timeout, "mp_conn_send");
    if (rc < 0)
        return rc;
    if (c && c->ops)
        return m ? c->ops->send(c->impl, m, mp__ipc_deadline(timeout), "mp_conn_send")
                 : mp__error(MP_EINVAL, "mp_conn_send: message is NULL");
    if ((rc = usable(c, CONN_WRITE, "mp_conn_send")) < 0)
        return rc;
    if (!m)
        return mp__error(MP_EINVAL, "mp_conn_send: message is NULL");
    return conn_send(c, m, timeout, "mp_conn_send");
}

int mp_conn_recv(mp_conn *c, mp_msg **out, double timeout)
{
    bool taken;
    int rc;
    if (out)
        *out = NULL;
    if ((rc = mp__check_timeout(timeout, "mp_conn_recv")) < 0)
        return rc;
    if (c && c->ops)
        return out ? c->ops->recv(c->impl, out, mp__ipc_deadline(timeout), "mp_conn_recv")
                   : mp__error(MP_EINVAL, "mp_conn_recv: out is NULL");
    if ((rc = usable(c, CONN_READ, "mp_conn_recv")) < 0)
        return rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_conn_recv: out is NULL");
    if ((rc = mp__objkinds_ensure("mp_conn_recv")) < 0)
        return rc;
    return mp__ring_get(conn_ring(c, false), c->sock, conn_rx(c, false), out,
                        mp__ipc_deadline(timeout), NULL, "mp_conn_recv", &taken);
}

int mp_conn_send_bytes(mp_conn *c, const void *buf, size_t len, double timeout)
{
    mp_msg *m = NULL;
    int rc = mp__check_timeout(timeout, "mp_conn_send_bytes");
    if (rc == 0 && !(c && c->ops))
        rc = usable(c, CONN_WRITE, "mp_conn_send_bytes");
    if (rc < 0)
        return rc;
    if (len && !buf)
        return mp__error(MP_EINVAL, "mp_conn_send_bytes: buf is NULL");
    if ((rc = mp_msg_create(&m)) < 0)
        return rc;
    if ((rc = mp_msg_set_payload(m, buf, len)) == 0)
        rc = c->ops ? c->ops->send(c->impl, m, mp__ipc_deadline(timeout), "mp_conn_send_bytes")
                    : conn_send(c, m, timeout, "mp_conn_send_bytes");
    mp_msg_destroy(m);
    return rc;
}

int mp_conn_recv_bytes(mp_conn *c, void **out, size_t *len, double timeout)
{
    mp_msg *m = NULL;
    const void *p;
    int rc;
    if (out)
        *out = NULL;
    if (len)
        *len = 0;
    if (!out || !len)
        return mp__error(MP_EINVAL, "mp_conn_recv_bytes: out or len is NULL");
    if ((rc = mp__check_timeout(timeout, "mp_conn_recv_bytes")) < 0)
        return rc;
    if ((rc = mp_conn_recv(c, &m, timeout)) < 0)
        return rc;
    if (mp_msg_count(m)) {
        rc = mp__error(MP_EPROTO, "mp_conn_recv_bytes: the message has %zu attachments "
                                  "(it was dropped); use mp_conn_recv", mp_msg_count(m));
    } else if ((p = mp_msg_payload(m, len)) && *len) {
        if (!(*out = malloc(*len))) {
            rc = mp__error(MP_ENOMEM, "mp_conn_recv_bytes: cannot allocate %zu bytes", *len);
            *len = 0;
        } else {
            memcpy(*out, p, *len);
        }
    }
    mp_msg_destroy(m);
    return rc;
}

int mp_conn_poll(mp_conn *c, double timeout)
{
    int rc = mp__check_timeout(timeout, "mp_conn_poll");
    if (rc < 0)
        return rc;
    if (c && c->ops)
        return c->ops->poll(c->impl, mp__ipc_deadline(timeout), "mp_conn_poll");
    if ((rc = usable(c, CONN_READ, "mp_conn_poll")) < 0)
        return rc;
    return mp__ring_poll(conn_ring(c, false), c->sock, conn_rx(c, false),
                         mp__ipc_deadline(timeout), "mp_conn_poll");
}

int mp__conn_fd(const mp_conn *c) { return c->sock; }

int mp_conn_fileno(const mp_conn *c)
{
    if (c && c->ops)
        return mp__error(MP_ENOTSUP, "mp_conn_fileno: %s has no fd to poll (its messages "
                                     "arrive by MPI); call mp_conn_poll with a timeout "
                                     "instead", c->ops->what);
    return c ? c->sock : -1;
}

mp__pins *mp__conn_pins(const mp_conn *c)
{
    return c && !c->ops ? &conn_rx(c, false)->pins : NULL;
}

mp__ring *mp__conn_ring(const mp_conn *c)
{
    return c && !c->ops && (c->mode & CONN_READ) ? conn_ring(c, false) : NULL;
}

uint32_t *mp__conn_layout_version(const mp_conn *c)
{
    return c && !c->ops ? &((conn_ctl *)mp__segment_data(c->seg))->version : NULL;
}

uint32_t mp__conn_waiting(const mp_conn *c)
{
    return c && !c->ops && (c->mode & CONN_READ) ? mp__ring_count(conn_ring(c, false)) : 0;
}

int mp__conn_quiet(mp_conn *c)
{
    if (!c || c->ops || !(c->mode & CONN_READ))
        return mp__error(MP_EINVAL, "mp__conn_quiet: %s",
                         !c ? "c is NULL" : "not a local receiving end");
    mp__ring_quiet(conn_ring(c, false));
    return 0;
}

int mp_conn_close(mp_conn *c)
{
    if (!c)
        return mp__error(MP_EINVAL, "mp_conn_close: connection is NULL");
    if (c->ops)
        return c->ops->close(c->impl, "mp_conn_close");
    if (c->sock < 0)
        return 0;
    c->sock = mp__close(c->sock);
    /* A reader asleep on the ring looks at the socket now: EOF if this was
     * the last writer. */
    if (c->mode & CONN_WRITE)
        mp__ring_wake(conn_ring(c, true));
    /* After the fd is gone, so a sender that sees the count change and
     * looks at the socket finds it hung up if this was the last reader. */
    if (c->mode & CONN_READ)
        mp__ring_reader_closed(conn_ring(c, false));
    return 0;
}

/* ---- as an attachment: 1 fd plus the mode --------------------------------- */

static void *conn_retain(void *o) { return mp_conn_retain(o); }
static void conn_release(void *o) { mp_conn_release(o); }

static int conn_encode(void *obj, void *buf, size_t cap, size_t *len, int *fds, int maxfds,
                       int *nfds)
{
    mp_conn *c = obj;
    uint32_t w[2] = {(uint32_t)c->mode, (uint32_t)c->end};
    mp__segment_handle h;
    int rc;
    if (c->sock < 0)
        return mp__error(MP_ECLOSED, "mp_msg: cannot send a closed connection");
    if (cap < sizeof w || maxfds < 2)
        return mp__error(MP_EOVERFLOW, "mp_msg: no room for a connection attachment");
    if ((rc = mp__segment_export(c->seg, &h)) < 0)
        return rc;
    memcpy(buf, w, sizeof w);
    *len = sizeof w;
    fds[0] = c->sock;
    fds[1] = h.fd;
    *nfds = 2;
    return 0;
}

int mp__ipc_ctl_check(const char *what, uint64_t magic, uint64_t want_magic, uint32_t version,
                      uint32_t want_version)
{
    if (magic == want_magic && version == want_version)
        return 0;
    return mp__error(MP_EPROTO, "%s attachment: control block %s (version %u, this mproc "
                                "reads %u): every process sharing a %s must run the same "
                                "mproc build",
                     what, magic != want_magic ? "of another kind" : "of another layout",
                     version, want_version, what);
}

static int conn_decode(const void *buf, size_t len, int *fds, int nfds, void **obj)
{
    uint32_t w[2] = {0, 0};
    mp__segment_handle h = {.strategy = MP__STRATEGY_FD, .fd = -1, .size = sizeof(conn_ctl)};
    mp__segment *seg = NULL;
    const conn_ctl *ctl;
    mp_conn *c = NULL;
    int rc;
    *obj = NULL;
    if (len != sizeof w || nfds != 2) {
        rc = mp__error(MP_EPROTO, "connection attachment: %zu bytes and %d fds (want 8 and 2)",
                       len, nfds);
        goto out_fds;
    }
    memcpy(w, buf, sizeof w);
    if (w[0] == 0 || w[0] > (CONN_READ | CONN_WRITE) || w[1] > 1) {
        rc = mp__error(MP_EPROTO, "connection attachment: bad mode %u or end %u", w[0], w[1]);
        goto out_fds;
    }
    if ((rc = mp__check_seqpacket(fds[0], "connection attachment")) < 0)
        goto out_fds;
    h.fd = fds[1];
    fds[1] = -1;
    if ((rc = mp__segment_open(&h, &seg)) < 0)
        goto out_fds;
    ctl = mp__segment_data(seg);
    rc = mp__ipc_ctl_check("connection", ctl->magic, CONN_CTL_MAGIC, ctl->version,
                           CONN_CTL_VERSION);
    if (rc < 0)
        goto out_seg;
    if ((rc = conn_new(fds[0], (int)w[0], (int)w[1], seg, &c)) < 0)
        goto out_seg;
    mp__segment_release(seg);
    *obj = c;
    return 0;
out_seg:
    mp__segment_release(seg);
out_fds:
    for (int i = 0; i < nfds; i++)
        fds[i] = mp__close(fds[i]);
    return rc;
}

const mp__objkind mp__conn_kind = {MP_ATTACH_CONN, "connection", conn_retain, conn_release,
                                   conn_encode, conn_decode};

int mp_msg_add_conn(mp_msg *m, const char *name, mp_conn *c)
{
    if (c && c->ops)
        return mp__error(MP_ENOTSUP, "mp_msg_add_conn: %s cannot travel in a message (it "
                                     "is not an object of this host); keep it in the rank "
                                     "that made it, or make a pipe between the ranks that "
                                     "need it", c->ops->what);
    return mp__msg_add_object(m, name, &mp__conn_kind, c, "mp_msg_add_conn");
}

int mp_msg_get_conn(const mp_msg *m, size_t index, mp_conn **out)
{
    return mp__msg_get_object(m, index, &mp__conn_kind, (void **)out, "mp_msg_get_conn");
}
