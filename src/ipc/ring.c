/* The shared-memory ring beside a pipe's or a queue's socket.
 *
 * Order. The ring is the one order authority. A message without fds that
 * fits in a slot is copied into the next slot; any other message (fds, a
 * big body) is sent on the socket as a record whose frame header carries a
 * tag, and a MARK slot with that tag follows it in the ring. Producers take
 * turns under plock (a robust process-shared mutex) from taking a slot to
 * publishing it: the store of the slot's `seq` word (the position it
 * holds) is the commit, and tail moves after it (for producers and
 * sleepers). Consumers look for the message at head in its slot, never at
 * tail, so a consumer that waits for a producer, or runs behind it, does
 * not pull tail's cache line away from it message by message (which halved
 * 1->1 streaming across CPUs). A consumer copies the slot at head, then
 * claims it by a compare-and-swap of head (a loser drops its copy and looks
 * again; a slot is refilled only after head passed it, so a winner's copy
 * is whole). A payload slot is taken so without any lock (mp__ring_take:
 * consumers do not queue for the small-message path); everything else is
 * received under the socket's reader lock (mp__rx), so a consumer meets
 * marks in the order their records were sent, and lock-free takers leave
 * marks alone.
 *
 * Commits. Publishing (the store to the slot's seq) is a producer's commit,
 * and the claim is a consumer's: whoever dies before it did nothing, whoever
 * dies after it is done. A producer that died between publishing and moving
 * tail left tail one short: whoever finds plock EOWNERDEAD moves it
 * (plock_recover) before making the lock consistent. A consumer that finds
 * its head's slot already holding a later lap read head too early (another
 * consumer took it since) and reads head again. The socket path has two
 * steps that cannot be one, and the tag settles them:
 *   - a producer that died between sending a record and writing its mark
 *     left an orphan: a tagged record with no mark. A consumer at a mark
 *     whose head record has an older tag delivers that orphan first; a
 *     consumer that finds the ring empty and a record at the socket's head
 *     while no producer holds plock delivers it too.
 *   - a consumer that died between taking a mark's record and moving head
 *     left a mark without a record: its head record is missing or newer, and
 *     the mark is skipped.
 * A record left queued by MP_EMFILE keeps its mark in place, so it is
 * delivered in order once fds fit.
 *
 * Wake-ups. A consumer that finds the ring empty sets `spinning` (only
 * where doorbells ring: it spares one) and watches its head's slot briefly,
 * then sets `sleeping` and sleeps on tail (a futex)
 * for a slice at a time, looking at the socket between slices (EOF, a
 * queue's end marker, an orphan); closing a pipe end or a queue wakes it at
 * once. After publishing, a producer that sees `sleeping` set for its slot
 * or an earlier one clears it and wakes the futex; one that sees
 * `spinning` clears it. Dekker's two flags:
 * the consumer stores its flag before it looks at tail and the slot, the
 * producer publishes and stores tail before it looks at the flags; a
 * consumer looks at the slot once more after it clears `spinning`.
 *
 * Readiness. The socket's fd is what users poll (mp_wait, a select loop on
 * mp_conn_fileno), so a message that no consumer inside a receive is sure
 * to see must make it readable: a producer that saw neither flag sends a
 * NUDGE record (a doorbell; every reader drops it) when its message is
 * still the only one in the ring. A producer killed between publishing and
 * waking delays an mproc sleeper by one slice at most (a user's own poll
 * waits for the next message).
 * `bells` counts doorbells sent and not yet dropped: a consumer that takes
 * the last message of the ring while some are queued drops them, so a
 * user's poll does not report a message that was already taken (a
 * lock-free taker only when the reader lock is free; else the holder drops
 * them once it finds the ring empty). A `quiet`
 * ring (mp__ring_quiet: an end nobody polls, such as the same-host pipe
 * under an MPI conn, which looks only after MPI said a message is there)
 * rings no bells at all.
 *
 * A queue's ring starts unpolled (MP__RING_UNPOLLED): no doorbells until
 * its fd is handed out (mp_queue_fileno, mp_wait), since most programs only
 * get, and a bell costs a sendmsg and a recvmsg per message that finds its
 * consumer between two receives (streaming 16-byte messages went 1.7x
 * faster without them). The first hand-out turns bells on for good and
 * rings one if a message is already waiting: Dekker again, the producer
 * stores tail before it reads the state, the poller swaps the state before
 * it reads tail, so one of them rings. A pipe end can be polled without
 * asking (its fd is the connection's own) and rings from the start.
 *
 * A full ring makes producers wait on head (a futex, in slices); the
 * consumer that moves head past the one the producer saw wakes it
 * (`space_wait`). Every flag a side clears is cleared by an exchange or a
 * compare-and-swap: a load and a store would erase a flag set again in
 * between, and lose that wait's wake-up. The two wait flags also hold the
 * position waited for (wait_flag), so that a process that ran late cannot
 * take down a later wait's flag. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "ipc/ring.h"
#include "ipc/ring_impl.h"
#include "sync/fastlock.h"
#include "wire/frame.h"

#define PEER_CHECK_EVERY 64u  /* a pipe's producer checks for a gone reader this often */

void (*mp__ring_fault)(int step);

int mp__ring_init(mp__ring *r, const char *fn)
{
    pthread_mutexattr_t a;
    int err;
    atomic_init(&r->tag, 0);
    atomic_init(&r->tail, 0);
    atomic_init(&r->head_seen, 0);
    atomic_init(&r->closes_seen, 0);
    atomic_init(&r->closes, 0);
    atomic_init(&r->head, 0);
    atomic_init(&r->space_wait, 0);
    atomic_init(&r->sleeping, 0);
    atomic_init(&r->spinning, 0);
    atomic_init(&r->bells, 0);
    atomic_init(&r->pcpu, UINT32_MAX);
    atomic_init(&r->bell_mode, MP__RING_BELLS);
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    err = pthread_mutex_init(&r->plock, &a);
    pthread_mutexattr_destroy(&a);
    return err ? mp__errno_error(err, "%s: pthread_mutex_init", fn) : 0;
}

uint32_t mp__ring_count(const mp__ring *r)
{
    uint32_t h = atomic_load(&r->head), t = atomic_load(&r->tail);
    /* a producer that died between publishing and moving tail left one */
    return t - h + slot_ready(&r->slot[t & MASK], t);
}

/* ---- producers -------------------------------------------------------------- */

/* A free, consistent plock is taken by the inline fast path of the sync
 * layer's robust mutexes: glibc's protocol without the dispatch of its
 * generic robust path (about 2 ns of a producer's 33 per message).
 * Everything else goes through glibc. A deadline of 0 still waits a
 * moment: the holder is usually a few stores from unlocking, and "try
 * once" must not fail for that. Timed waits try first and wait on the
 * clock only when contended (ThreadSanitizer does not intercept
 * pthread_mutex_clocklock). */
static int plock(mp__ring *r, double deadline, const char *fn)
{
    struct timespec ts;
    mp__fast_thread self;
    int err;
    if (mp__fast_lock(&r->plock, mp__fast_self(&self)))
        return 0;
    if (deadline < 0)
        err = pthread_mutex_lock(&r->plock);
    else
        err = pthread_mutex_trylock(&r->plock);
    /* The clock is read only when contended: a poll that finds the lock
     * free costs no clock read (callers above try a poll first for that). */
    if (err == EBUSY && deadline == 0) {
        double until = mp__now() + 0.002;
        while (err == EBUSY && mp__now() < until) {
            sched_yield();
            err = pthread_mutex_trylock(&r->plock);
        }
    }
    if (err == EBUSY && deadline > 0) {
        ts = mp__deadline_timespec(deadline);
        err = pthread_mutex_clocklock(&r->plock, CLOCK_MONOTONIC, &ts);
    }
    if (err == EOWNERDEAD) {
        plock_recover(r);
        err = 0;
    }
    if (err == ETIMEDOUT || err == EBUSY)
        return mp__error(MP_ETIMEDOUT, "%s: timed out waiting for another sender", fn);
    return err ? mp__errno_error(err, "%s: locking the sender lock", fn) : 0;
}

static void punlock(mp__ring *r)
{
    mp__fast_thread self;
    if (!mp__fast_unlock(&r->plock, mp__fast_self(&self)))
        pthread_mutex_unlock(&r->plock);
}

/* Every reader of the pipe is gone: nothing sent now would be received. */
static int peer_gone(int sock, const char *fn)
{
    struct pollfd p = {.fd = sock, .events = POLLOUT};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR)))
        return mp__error(MP_ECLOSED, "%s: the receiving end was closed", fn);
    return 0;
}

/* Holding plock, before slot t: a reader that closed its end since the
 * last look (one load of a line the send reads anyway), or every
 * PEER_CHECK_EVERY slots for one that exited or was killed without
 * closing. closes_seen moves only when a reader is still there, so a send
 * that failed fails again. */
static int check_peer(mp__ring *r, int sock, uint32_t t, const char *fn)
{
    uint32_t closes = atomic_load_explicit(&r->closes, memory_order_acquire);
    int rc;
    if (closes == atomic_load_explicit(&r->closes_seen, memory_order_relaxed) &&
        t % PEER_CHECK_EVERY != 0)
        return 0;
    if ((rc = peer_gone(sock, fn)) == 0)
        atomic_store_explicit(&r->closes_seen, closes, memory_order_relaxed);
    return rc;
}

void mp__ring_reader_closed(mp__ring *r)
{
    atomic_fetch_add_explicit(&r->closes, 1, memory_order_release);
}

/* Waits (holding plock) until the ring has a free slot. */
static int room(mp__ring *r, int sock, double deadline, bool pipe, const char *fn)
{
    uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    /* head as last seen: it only grows, so room by it is room (and the
     * consumers' cache line stays theirs) */
    if (t - atomic_load_explicit(&r->head_seen, memory_order_relaxed) < MP__RING_SLOTS)
        return pipe ? check_peer(r, sock, t, fn) : 0;
    for (;;) {
        uint32_t h = atomic_load(&r->head);
        double until = deadline;
        int rc;
        atomic_store_explicit(&r->head_seen, h, memory_order_relaxed);
        if (t - h < MP__RING_SLOTS)
            return pipe ? check_peer(r, sock, t, fn) : 0;
        if (pipe && (rc = peer_gone(sock, fn)) < 0)
            return rc;
        if (deadline == 0)
            return mp__error(MP_ETIMEDOUT, "%s: no room: the receiver is not taking messages "
                                           "(%u waiting)", fn, MP__RING_SLOTS);
        atomic_store(&r->space_wait, wait_flag(h));
        if (atomic_load(&r->head) != h)
            continue;
        STEP(SPACE_WAIT);
        /* In slices: a pipe's reader may go away while we wait. */
        if (deadline < 0 || deadline > mp__now() + SLICE_MS / 1000.0)
            until = mp__now() + SLICE_MS / 1000.0;
        if (mp__futex_wait((uint32_t *)&r->head, h, until, true) == MP_ETIMEDOUT &&
            until == deadline)
            return mp__error(MP_ETIMEDOUT, "%s: timed out: the receiver is not taking "
                                           "messages (%u waiting)", fn, MP__RING_SLOTS);
    }
}

static void ring_bell(mp__ring *r, int sock)
{
    mp__frame_header h = {.magic = MP__FRAME_MAGIC, .version = MP__FRAME_VERSION,
                          .flags = MP__FRAME_NUDGE};
    struct iovec iov = {.iov_base = &h, .iov_len = sizeof h};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    /* Counted first: a count too high costs a consumer one look, too low a
     * spurious wake-up. Failing is harmless: a full socket wakes a poll. */
    atomic_fetch_add(&r->bells, 1);
    (void)mp__sys.sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Slot t (a mark when mark) was just published: wake whoever needs to
 * know (a consumer asleep for slot t or an earlier one). A mark needs no
 * doorbell: its record is on the socket, which wakes a poll by itself. */
static void wake_consumers(mp__ring *r, int sock, uint32_t t, bool mark)
{
    if (wake_due(&r->sleeping, t)) {
        mp__futex_wake((uint32_t *)&r->tail, INT_MAX, true);
    } else if (mark || atomic_load(&r->bell_mode) != MP__RING_BELLS) {
        /* no doorbell: `spinning` is not looked at (nor set) */
    } else if (atomic_load(&r->spinning) && atomic_exchange(&r->spinning, 0)) {
        /* it sees the message: no fd needs to */
    } else {
        uint32_t h = atomic_load(&r->head);
        atomic_store_explicit(&r->head_seen, h, memory_order_relaxed);
        if (h == t)
            ring_bell(r, sock); /* this message made the ring non-empty */
    }
}

void mp__ring_quiet(mp__ring *r)
{
    atomic_store(&r->bell_mode, MP__RING_QUIET);
}

void mp__ring_unpolled(mp__ring *r)
{
    atomic_store(&r->bell_mode, MP__RING_UNPOLLED);
}

void mp__ring_polled(mp__ring *r, int sock)
{
    uint32_t unpolled = MP__RING_UNPOLLED;
    if (atomic_load_explicit(&r->bell_mode, memory_order_relaxed) == MP__RING_UNPOLLED &&
        atomic_compare_exchange_strong(&r->bell_mode, &unpolled, MP__RING_BELLS) &&
        mp__ring_count(r) > 0)
        ring_bell(r, sock);
}

/* Publishes the slot filled at t and lets go of plock. */
static void publish(mp__ring *r, int sock, uint32_t t)
{
    uint32_t cpu = (uint32_t)sched_getcpu();
    /* read while the slot is still ours: once published it may be taken */
    bool mark = slot_type(&r->slot[t & MASK]) == RING_MARK;
    if (atomic_load_explicit(&r->pcpu, memory_order_relaxed) != cpu)
        atomic_store_explicit(&r->pcpu, cpu, memory_order_relaxed);
    STEP(FILLED);
    slot_publish(&r->slot[t & MASK], t);
    STEP(PUBLISHED);
    atomic_store(&r->tail, t + 1);
    punlock(r);
    STEP(UNLOCKED);
    wake_consumers(r, sock, t, mark);
}

static int send_inline(mp__ring *r, int sock, uint32_t type, const void *data, size_t len,
                       double deadline, bool pipe, const char *fn)
{
    uint32_t t;
    int rc;
    if ((rc = plock(r, deadline, fn)) < 0)
        return rc;
    STEP(LOCKED);
    if ((rc = room(r, sock, deadline, pipe, fn)) < 0) {
        punlock(r);
        return rc;
    }
    t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    slot_write(&r->slot[t & MASK], type, data, (uint32_t)len); /* data may be NULL if len 0 */
    publish(r, sock, t);
    return 0;
}

/* The record goes on the socket with the next tag, then its mark. */
static int send_marked(mp__ring *r, int sock, mp__rx *rx, mp__frame_out *o, double deadline,
                       bool pipe, const char *fn)
{
    mp__frame_header *h = o->buf;
    uint32_t t, tag;
    int rc;
    if ((rc = plock(r, deadline, fn)) < 0)
        return rc;
    STEP(LOCKED);
    if ((rc = room(r, sock, deadline, pipe, fn)) < 0)
        goto out;
    tag = atomic_load_explicit(&r->tag, memory_order_relaxed) + 1;
    atomic_store(&r->tag, tag);
    h->tag = tag;
    STEP(TAGGED);
    if (o->nfds > 0)
        mp__rx_announce_fds(rx, sock);
    if ((rc = mp__send_record(sock, o->buf, o->len, o->fds, o->nfds, deadline)) < 0)
        goto out;
    STEP(SENT);
    t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    slot_write(&r->slot[t & MASK], RING_MARK, &tag, sizeof tag);
    publish(r, sock, t);
    return 0;
out:
    punlock(r);
    return rc;
}

int mp__ring_send(mp__ring *r, int sock, mp__rx *rx, const mp_msg *m, double deadline,
                  bool pipe, const char *fn)
{
    mp__frame_out o;
    unsigned char compact[MP__RING_DATA];
    mp__pin_ref ref;
    size_t len;
    int rc;
    /* Payload only: the slot holds the bytes themselves, no frame. */
    if (m->count == 0 && m->len <= MP__RING_DATA)
        return send_inline(r, sock, RING_PAYLOAD, m->payload, m->len, deadline, pipe, fn);
    /* One tensor the receiver pinned: its compact record (wire/compact.c). */
    if (mp__compact_encode(m, &rx->pins, compact, sizeof compact, &len, &ref) == 1) {
        rc = send_inline(r, sock, RING_COMPACT, compact, len, deadline, pipe, fn);
        if (rc < 0)
            mp__pins_unreserve(&rx->pins, &ref);
        return rc;
    }
    if ((rc = mp__frame_encode(m, &rx->pins, &o)) < 0)
        return rc;
    if (o.nfds == 0 && o.len <= MP__RING_DATA)
        rc = send_inline(r, sock, RING_FRAME, o.buf, o.len, deadline, pipe, fn);
    else
        rc = send_marked(r, sock, rx, &o, deadline, pipe, fn);
    mp__frame_out_done(&o, rc == 0);
    return rc;
}
