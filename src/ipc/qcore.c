/* The engine under SimpleQueue, Queue and JoinableQueue. A queue is one
 * SOCK_SEQPACKET socket pair (puts write one end, gets read the other; every
 * process holds both, so a queued message outlives its producer) plus a
 * control segment. Readers take the robust reader lock (mp__rx) around
 * mp__wire_recv_rx, whose peek-then-consume must not interleave with another
 * reader's; a reader killed while holding it leaves the lock EOWNERDEAD, and
 * the next reader makes it consistent and goes on (a peeked record is still
 * queued). Small messages without fds go through the ring in the control
 * segment instead of the socket (src/ipc/ring.c), in one order with it. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "ipc/ipc.h"
#include "ipc/remote.h"
#include "wire/frame.h"

static int init_ctl(mp__qctl *c, int kind, int64_t maxsize)
{
    int rc;
    c->magic = MP__QCTL_MAGIC;
    c->version = MP__QCTL_VERSION;
    c->kind = (uint32_t)kind;
    c->maxsize = maxsize > 0 ? maxsize : 0;
    if ((rc = mp__rx_init(&c->rx, "mp_queue_create")) < 0)
        return rc;
    if ((rc = mp__ring_init(&c->ring, "mp_queue_create")) < 0)
        return rc;
    mp__ring_unpolled(&c->ring);
    return 0;
}

int mp__queue_create(int kind, int64_t maxsize, mp__queue **out)
{
    mp__queue *q;
    int sv[2] = {-1, -1}, rc;
    *out = NULL;
    if (!(q = calloc(1, sizeof *q)))
        return mp__error(MP_ENOMEM, "mp_queue_create: out of memory");
    q->rsock = q->wsock = -1;
    if (mp__sys.socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = mp__errno_error(errno, "mp_queue_create: socketpair");
        goto out_free;
    }
    q->wsock = sv[0];
    q->rsock = sv[1];
    /* The control block always uses a memfd: it travels as one more fd. */
    if ((rc = mp__segment_create(sizeof(mp__qctl), MP__STRATEGY_FD, &q->seg)) < 0)
        goto out_socks;
    q->ctl = mp__segment_data(q->seg);
    if ((rc = init_ctl(q->ctl, kind, maxsize)) < 0)
        goto out_seg;
    if ((rc = mp__pins_attach(&q->ctl->rx.pins)) < 0)
        goto out_seg;
    q->kind = kind;
    atomic_init(&q->refs, 1);
    *out = q;
    return 0;
out_seg:
    mp__segment_release(q->seg);
out_socks:
    mp__close(q->wsock);
    mp__close(q->rsock);
out_free:
    free(q);
    return rc;
}

mp__queue *mp__queue_retain(mp__queue *q)
{
    if (q)
        atomic_fetch_add(&q->refs, 1);
    return q;
}

void mp__queue_release(mp__queue *q)
{
    if (!q || atomic_fetch_sub(&q->refs, 1) != 1)
        return;
    if (q->ops) {
        q->ops->destroy(q->impl);
        free(q);
        return;
    }
    mp__close(q->rsock);
    mp__close(q->wsock);
    mp__pins_detach(&q->ctl->rx.pins);
    mp__segment_release(q->seg);
    free(q);
}

static void wake_space(mp__qctl *c)
{
    atomic_fetch_add(&c->space_seq, 1);
    if (atomic_load(&c->space_waiters))
        mp__futex_wake((uint32_t *)&c->space_seq, 1 << 30, true);
}

int64_t mp__queue_size(const mp__queue *q)
{
    int64_t gets = atomic_load(&q->ctl->gets), n = atomic_load(&q->ctl->puts) - gets;
    return n > 0 ? n : 0;
}

/* Reserves one of maxsize slots, waiting for a get to free one. */
static int reserve_slot(mp__qctl *c, double deadline, const char *fn)
{
    if (c->maxsize == 0) {
        if (atomic_load(&c->closed))
            return mp__error(MP_ECLOSED, "%s: the queue is closed", fn);
        atomic_fetch_add(&c->puts, 1);
        return 0;
    }
    for (;;) {
        int64_t n = atomic_load(&c->puts);
        uint32_t seq;
        int rc;
        if (atomic_load(&c->closed))
            return mp__error(MP_ECLOSED, "%s: the queue is closed", fn);
        if (n - atomic_load(&c->gets) < c->maxsize) {
            if (atomic_compare_exchange_weak(&c->puts, &n, n + 1))
                return 0;
            continue;
        }
        if (deadline == 0)
            return mp__error(MP_ETIMEDOUT, "%s: the queue is full (maxsize %lld)", fn,
                             (long long)c->maxsize);
        seq = atomic_load(&c->space_seq);
        if (atomic_load(&c->puts) - atomic_load(&c->gets) < c->maxsize ||
            atomic_load(&c->closed))
            continue;
        atomic_fetch_add(&c->space_waiters, 1);
        rc = mp__futex_wait((uint32_t *)&c->space_seq, seq, deadline, true);
        atomic_fetch_sub(&c->space_waiters, 1);
        if (rc == MP_ETIMEDOUT)
            return mp__error(MP_ETIMEDOUT, "%s: timed out: the queue stayed full (maxsize "
                                           "%lld)", fn, (long long)c->maxsize);
    }
}

int mp__queue_put(mp__queue *q, const mp_msg *m, double deadline, const char *fn)
{
    mp__qctl *c;
    int rc;
    if (!q || !m)
        return mp__error(MP_EINVAL, "%s: %s is NULL", fn, q ? "message" : "queue");
    if (q->ops)
        return q->ops->put(q->impl, m, deadline, fn);
    c = q->ctl;
    if ((rc = reserve_slot(c, deadline, fn)) < 0)
        return rc;
    /* Counted before it is sent, so join() never sees zero while it flies. */
    if (q->kind == MP_ATTACH_JOINABLE_QUEUE)
        atomic_fetch_add(&c->unfinished, 1);
    rc = mp__ring_send(&c->ring, q->wsock, &c->rx, m, deadline, false, fn);
    if (rc < 0) {
        if (q->kind == MP_ATTACH_JOINABLE_QUEUE && atomic_fetch_sub(&c->unfinished, 1) == 1)
            mp__qctl_wake_join(c);
        atomic_fetch_sub(&c->puts, 1);
        wake_space(c);
    }
    return rc;
}

int mp__queue_get(mp__queue *q, mp_msg **out, double deadline, const char *fn)
{
    mp__qctl *c;
    bool taken;
    int rc;
    if (out)
        *out = NULL;
    if (!q || !out)
        return mp__error(MP_EINVAL, "%s: %s is NULL", fn, q ? "out" : "queue");
    if (q->ops)
        return q->ops->get(q->impl, out, deadline, fn);
    if ((rc = mp__objkinds_ensure(fn)) < 0)
        return rc;
    c = q->ctl;
    rc = mp__ring_get(&c->ring, q->rsock, &c->rx, out, deadline, &c->closed, fn, &taken);
    /* A message taken off the socket frees its slot even when it could not
     * be decoded (MP_EPROTO, or mapping it failed): it is gone either way. */
    if (taken) {
        atomic_fetch_add(&c->gets, 1);
        if (c->maxsize)
            wake_space(c);
    } else if (rc == MP_ECLOSED || (rc == MP_ETIMEDOUT && atomic_load(&c->closed))) {
        rc = mp__error(MP_ECLOSED, "%s: the queue is closed and drained", fn);
    } else if (rc == MP_ETIMEDOUT && deadline == 0) {
        rc = mp__error(MP_ETIMEDOUT, "%s: the queue is empty", fn);
    } else if (rc == MP_ETIMEDOUT) {
        rc = mp__error(MP_ETIMEDOUT, "%s: timed out waiting for a message", fn);
    }
    return rc;
}

int mp__queue_close(mp__queue *q)
{
    mp__qctl *c;
    if (!q)
        return mp__error(MP_EINVAL, "mp_queue_close: queue is NULL");
    if (q->ops)
        return q->ops->close(q->impl, "mp_queue_close");
    c = q->ctl;
    if (atomic_exchange(&c->closed, 1))
        return 0;
    wake_space(c);
    /* Wakes a consumer blocked in get. When the socket is full this may not
     * fit; then consumers are not blocked, and they see the flag instead. */
    mp__wire_send_closed(q->wsock, 0);
    mp__ring_wake(&c->ring);
    return 0;
}

bool mp__queue_empty(mp__queue *q) { return !q || mp__queue_size(q) == 0; }

uint32_t mp__queue_waiting(const mp__queue *q)
{
    return q && !q->ops ? mp__ring_count(&q->ctl->ring) : 0;
}

int mp__queue_wrap(int kind, const mp__queue_ops *ops, void *impl, mp_queue **out)
{
    mp__queue *q = calloc(1, sizeof *q);
    if (!q)
        return mp__error(MP_ENOMEM, "mp_queue: out of memory");
    atomic_init(&q->refs, 1);
    q->kind = kind;
    q->ops = ops;
    q->impl = impl;
    q->rsock = q->wsock = -1;
    *out = (mp_queue *)q;
    return 0;
}

void *mp__queue_impl(const mp_queue *q, const mp__queue_ops *ops)
{
    return q && ((const mp__queue *)q)->ops == ops ? ((const mp__queue *)q)->impl : NULL;
}

bool mp__queue_is_remote(const mp_queue *q)
{
    return q && ((const mp__queue *)q)->ops;
}

int mp__queue_poll(mp__queue *q)
{
    /* Closed: a get answers at once (a message, or MP_ECLOSED), even after
     * a reader took the end-of-stream record off the socket. */
    if (atomic_load(&q->ctl->closed))
        return 1;
    mp__ring_polled(&q->ctl->ring, q->wsock);
    return mp__ring_poll(&q->ctl->ring, q->rsock, &q->ctl->rx, 0, "mp_wait");
}
