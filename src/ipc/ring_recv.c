/* The consumers' half of the shared-memory ring: takes small messages
 * without a lock, receives the rest in ring order under the socket's reader
 * lock (src/ipc/ring.c tells the protocol). */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ipc/ring_impl.h"
#include "wire/frame.h"

enum { HEAD_EMPTY, HEAD_EOF, HEAD_BELL, HEAD_CLOSED, HEAD_DATA };

/* ---- consumers ---------------------------------------------------------------- */

/* What is at the socket's head, peeked without taking it or its fds. */
static int peek_head(int sock, mp__frame_header *h)
{
    struct iovec iov = {.iov_base = h, .iov_len = sizeof *h};
    for (;;) {
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        ssize_t n;
        memset(h, 0, sizeof *h);
        n = mp__sys.recvmsg(sock, &mh, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0)
            return HEAD_EOF;
        if (n > 0) {
            bool bare = n == (ssize_t)sizeof *h && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
                        h->magic == MP__FRAME_MAGIC && h->body_len == 0;
            if (bare && h->flags == MP__FRAME_NUDGE)
                return HEAD_BELL;
            return bare && h->flags == MP__FRAME_CLOSED ? HEAD_CLOSED : HEAD_DATA;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return HEAD_EMPTY;
        if (errno != EINTR)
            return mp__errno_error(errno, "receiving a message: recvmsg");
    }
}

/* Takes the record at the head (a doorbell) without looking at it. */
static void drop_head(int sock)
{
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    while (mp__sys.recvmsg(sock, &mh, MSG_DONTWAIT) < 0 && errno == EINTR)
        ;
}

static void uncount_bell(mp__ring *r)
{
    uint32_t n = atomic_load(&r->bells);
    while (n && !atomic_compare_exchange_weak(&r->bells, &n, n - 1))
        ;
}

/* Drops the doorbells at the socket's head; the count is right again. */
static void drop_bells(mp__ring *r, int sock)
{
    mp__frame_header hd;
    while (atomic_load(&r->bells)) {
        if (peek_head(sock, &hd) != HEAD_BELL) {
            atomic_store(&r->bells, 0); /* counted, never sent (its sender died) */
            return;
        }
        drop_head(sock);
        uncount_bell(r);
    }
}

/* Slot h was just taken: when it was the last, nothing is left to announce.
 * Dropping needs rx's lock; a taker without it drops them only if the lock is
 * free, else leaves them to the holder, who drops them when it finds the
 * ring empty (a poll until then may report one message too many). */
static void settle_bells(mp__ring *r, int sock, mp__rx *rx, uint32_t h, bool locked)
{
    if (!atomic_load_explicit(&r->bells, memory_order_relaxed) ||
        !slot_empty(&r->slot[(h + 1) & MASK], h + 1))
        return;
    if (locked) {
        drop_bells(r, sock);
    } else if (mp__rx_trylock(rx)) {
        drop_bells(r, sock);
        mp__rx_unlock(rx);
    }
}

/* Moves head from h to h + 1 unless another consumer moved it first: the
 * commit of a take. */
static bool claim(mp__ring *r, uint32_t h)
{
    if (!atomic_compare_exchange_strong(&r->head, &h, h + 1))
        return false;
    STEP(CLAIMED);
    if (wake_due(&r->space_wait, h))
        mp__futex_wake((uint32_t *)&r->head, INT_MAX, true);
    return true;
}

/* Slot h holds a message: copy it, claim it, then decode. Built before
 * the claim where it can be (a payload), so that running out of memory
 * leaves it queued. 0 with *taken false: another consumer claimed it first.
 * locked: the caller holds rx's lock (and so may read the socket). */
static int take_slot(mp__ring *r, int sock, mp__rx *rx, uint32_t h, bool locked, mp_msg **out,
                     bool *taken)
{
    const mp__ring_slot *s = &r->slot[h & MASK];
    unsigned char buf[MP__RING_DATA];
    uint32_t type = slot_type(s), len = slot_len(s);
    bool valid = len <= MP__RING_DATA &&
                 (type == RING_PAYLOAD || type == RING_FRAME || type == RING_COMPACT);
    mp_msg *m = NULL;
    int rc;
    if (valid)
        slot_read(s, len, buf);
    if (valid && type == RING_PAYLOAD &&
        ((rc = mp_msg_create(&m)) < 0 || (rc = mp_msg_set_payload(m, buf, len)) < 0)) {
        mp_msg_destroy(m);
        return rc;
    }
    STEP(COPIED);
    if (!claim(r, h)) {
        mp_msg_destroy(m);
        return 0;
    }
    *taken = true;
    STEP(TAKEN);
    settle_bells(r, sock, rx, h, locked);
    if (!valid)
        return mp__error(MP_EPROTO, "receiving a message: ring slot of type %u and %u bytes "
                                    "(the message was dropped)", type, len);
    if (m) {
        *out = m;
        return 0;
    }
    if (type == RING_COMPACT)
        return mp__compact_decode(&rx->pins, buf, len, out);
    return mp__wire_decode_rx(rx, buf, len, NULL, 0, out);
}

int mp__ring_take(mp__ring *r, int sock, mp__rx *rx, mp_msg **out, bool *taken)
{
    *taken = false;
    *out = NULL;
    for (;;) {
        uint32_t h = atomic_load_explicit(&r->head, memory_order_acquire);
        int32_t lag = slot_lag(&r->slot[h & MASK], h);
        int rc;
        if (lag > 0)
            continue; /* h was taken and its slot refilled since we read it */
        if (lag < 0 || slot_type(&r->slot[h & MASK]) != RING_PAYLOAD)
            return 0;
        rc = take_slot(r, sock, rx, h, false, out, taken);
        if (rc < 0 || *taken)
            return rc < 0 ? rc : 1;
    }
}

int mp__ring_get(mp__ring *r, int sock, mp__rx *rx, mp_msg **out, double deadline,
                 const _Atomic uint32_t *closed, const char *fn, bool *taken)
{
    int rc = mp__ring_take(r, sock, rx, out, taken);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    if ((rc = mp__rx_lock(rx, deadline, fn)) < 0)
        return rc;
    if (closed && atomic_load(closed))
        deadline = 0;
    rc = mp__ring_recv(r, sock, rx, out, deadline, taken);
    mp__rx_unlock(rx);
    return rc;
}

/* Slot h is a mark: receive its record. *done is false when the mark was
 * stale (skipped) and the caller should look at the ring again. */
static int take_mark(mp__ring *r, int sock, mp__rx *rx, uint32_t h, mp_msg **out,
                     bool *taken, bool *done)
{
    uint32_t tag = slot_tag(&r->slot[h & MASK]);
    mp__frame_header hd;
    int k, rc;
    *done = false;
    while ((k = peek_head(sock, &hd)) == HEAD_BELL) {
        drop_head(sock);
        uncount_bell(r);
    }
    if (k < 0)
        return k;
    if (k != HEAD_DATA || (int32_t)(hd.tag - tag) > 0) {
        claim(r, h); /* a consumer died after taking this mark's record */
        return 0;
    }
    /* The head is this mark's record, or an orphan sent before it. */
    rc = mp__wire_recv_rx(sock, rx, out, 0, taken);
    if (*taken && hd.tag == tag) {
        STEP(MARK_RECEIVED);
        claim(r, h); /* lock-free takers leave marks alone: it is ours */
        settle_bells(r, sock, rx, h, true);
    }
    *done = *taken || rc != MP_ETIMEDOUT;
    return rc;
}

/* Watches an empty ring for a moment: true when something arrived. The
 * caller looks at the ring again after this returns false. */
static bool spin(mp__ring *r, uint32_t h, double *until)
{
    /* The flag only spares a doorbell: without bells, no cache line
     * written per message for it. */
    bool flag = atomic_load_explicit(&r->bell_mode, memory_order_relaxed) == MP__RING_BELLS;
    bool arrived = false;
    if (*until < 0)
        return false;
    /* The last producer runs on our CPU: it cannot publish while we spin. */
    if (*until == 0 && (int)atomic_load_explicit(&r->pcpu, memory_order_relaxed) ==
                           sched_getcpu()) {
        *until = -1;
        return false;
    }
    if (*until == 0)
        *until = mp__now() + SPIN_S;
    if (flag)
        atomic_store(&r->spinning, 1);
    while (!arrived) {
        for (int i = 0; i < 64 && !arrived; i++) {
            arrived = !slot_empty(&r->slot[h & MASK], h);
            __builtin_ia32_pause();
        }
        if (!arrived && mp__now() >= *until) {
            *until = -1;
            break;
        }
    }
    if (flag)
        atomic_store(&r->spinning, 0);
    return arrived;
}

static bool expired(double deadline)
{
    return deadline == 0 || (deadline > 0 && mp__now() >= deadline);
}

/* A record sits at the socket's head and the ring is empty at h: either a
 * producer is between its send and its mark, or one died there. */
static int orphan(mp__ring *r, int sock, mp__rx *rx, uint32_t h, double deadline,
                  mp_msg **out, bool *taken)
{
    int err = pthread_mutex_trylock(&r->plock);
    bool alone;
    if (err == EBUSY) {
        if (expired(deadline))
            return mp__error(MP_ETIMEDOUT, "receiving a message: a message is on its way");
        nanosleep(&(struct timespec){0, 20000}, NULL);
        return 1;
    }
    if (err == EOWNERDEAD)
        plock_recover(r);
    else if (err)
        return mp__errno_error(err, "receiving a message: locking the sender lock");
    alone = slot_empty(&r->slot[h & MASK], h);
    pthread_mutex_unlock(&r->plock);
    if (!alone)
        return 1;
    return mp__wire_recv_rx(sock, rx, out, 0, taken); /* its sender died before the mark */
}

/* Sleeps on tail, at most one slice. 1: look again. */
static int nap(mp__ring *r, uint32_t h, double deadline)
{
    double until;
    uint32_t t;
    if (!slot_empty(&r->slot[h & MASK], h))
        return 1;
    if (expired(deadline))
        return mp__error(MP_ETIMEDOUT, deadline == 0 ? "receiving a message: none waiting"
                                                     : "receiving a message: timed out "
                                                       "waiting for a message");
    atomic_store(&r->sleeping, wait_flag(h));
    STEP(SLEEPING);
    /* Dekker on tail: a producer publishes, moves tail, then looks at the
     * flag. tail is h, or h - 1 after a producer died before moving it. */
    t = atomic_load(&r->tail);
    if (!slot_empty(&r->slot[h & MASK], h))
        return 1;
    until = mp__now() + SLICE_MS / 1000.0;
    if (deadline > 0 && deadline < until)
        until = deadline;
    mp__futex_wait((uint32_t *)&r->tail, t, until, true);
    return 1;
}

void mp__ring_wake(mp__ring *r)
{
    mp__futex_wake((uint32_t *)&r->tail, INT_MAX, true);
}

/* The ring is empty at h. 1: look again; otherwise the receive's answer. */
static int idle(mp__ring *r, int sock, mp__rx *rx, uint32_t h, double deadline,
                double *spun, mp_msg **out, bool *taken)
{
    mp__frame_header hd;
    int k;
    if (deadline != 0 && spin(r, h, spun))
        return 1;
    if ((k = peek_head(sock, &hd)) < 0)
        return k;
    switch (k) {
    case HEAD_BELL:
        drop_head(sock);
        uncount_bell(r);
        return 1;
    case HEAD_DATA:
        return orphan(r, sock, rx, h, deadline, out, taken);
    case HEAD_CLOSED: /* a queue's end marker: it stays for every reader */
        return mp__error(MP_ECLOSED, "receiving a message: closed and drained");
    case HEAD_EOF: /* published before the last writer closed: seen now */
        return !slot_empty(&r->slot[h & MASK], h)
                   ? 1
                   : mp__error(MP_ECLOSED, "receiving a message: the peer closed the "
                                           "connection");
    default: /* HEAD_EMPTY */
        return nap(r, h, deadline);
    }
}

int mp__ring_recv(mp__ring *r, int sock, mp__rx *rx, mp_msg **out, double deadline,
                  bool *taken)
{
    double spun = 0;
    *taken = false;
    *out = NULL;
    for (;;) {
        uint32_t h = atomic_load_explicit(&r->head, memory_order_acquire);
        int32_t lag = slot_lag(&r->slot[h & MASK], h);
        int rc;
        bool done;
        if (lag < 0) {
            if ((rc = idle(r, sock, rx, h, deadline, &spun, out, taken)) != 1)
                return rc;
            continue;
        }
        if (lag > 0)
            continue; /* a lock-free taker took h, and its slot was refilled */
        if (slot_type(&r->slot[h & MASK]) != RING_MARK) {
            rc = take_slot(r, sock, rx, h, true, out, taken);
            if (rc < 0 || *taken)
                return rc;
            continue; /* a lock-free taker was first */
        }
        rc = take_mark(r, sock, rx, h, out, taken, &done);
        if (done || rc < 0)
            return rc;
    }
}

int mp__ring_poll(mp__ring *r, int sock, mp__rx *rx, double deadline, const char *fn)
{
    struct pollfd p = {.fd = sock, .events = POLLIN};
    for (;;) {
        int ms = deadline == 0 ? 0 : mp__poll_ms(deadline), n;
        if (mp__ring_count(r))
            return 1;
        /* Slices: a message published just before this poll rang no bell
         * if a consumer was spinning; it shows in the ring at the next look. */
        if (deadline != 0 && (ms < 0 || ms > SLICE_MS))
            ms = SLICE_MS;
        n = poll(&p, 1, ms);
        if (n > 0 && mp__wire_drop_nudge(sock, rx))
            continue; /* a doorbell, not a message: look again */
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return mp__errno_error(errno, "%s: poll", fn);
        if (n == 0 && expired(deadline))
            return mp__ring_count(r) != 0;
    }
}
