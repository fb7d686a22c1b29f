/* The receive side of a socket that several processes read: the reader lock,
 * and the handshake that lets a reader take a record in one recvmsg.
 *
 * A plain recvmsg loses a message when the open-files limit stops the kernel
 * from installing its fds (see wire.c), so a record that may carry fds is
 * peeked first and consumed second: two system calls. A record without fds
 * cannot hit that limit, so a reader may take it in one call, provided it
 * knows that no record with fds can be at the head. fd_records says so: a
 * sender sets it (for good) before its first record with fds, then waits
 * until no reader is between its look at fd_records and the end of its
 * recvmsg (fast_inside). These are Dekker's two flags: either the reader
 * sees fd_records set and peeks, or the sender sees fast_inside set and
 * waits, so its record reaches the socket only after that reader's call.
 * A reader may be asleep inside that call on an empty socket; the sender
 * wakes it with a NUDGE record, which every reader drops. */
#include <errno.h>
#include <sys/socket.h>
#include <time.h>

#include "wire/frame.h"

int mp__rx_init(mp__rx *rx, const char *fn)
{
    pthread_mutexattr_t a;
    int err;
    atomic_init(&rx->fd_records, 0);
    atomic_init(&rx->fast_inside, 0);
    mp__pins_init(&rx->pins);
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    err = pthread_mutex_init(&rx->lock, &a);
    pthread_mutexattr_destroy(&a);
    return err ? mp__errno_error(err, "%s: pthread_mutex_init", fn) : 0;
}

/* The holder died: whatever it was doing under the lock is over. A peeked
 * record is still queued; a consumed one was delivered to it and is gone. */
static void recover(mp__rx *rx)
{
    atomic_store(&rx->fast_inside, 0);
    pthread_mutex_consistent(&rx->lock);
}

int mp__rx_lock(mp__rx *rx, double deadline, const char *fn)
{
    struct timespec ts;
    int err;
    if (deadline < 0) {
        err = pthread_mutex_lock(&rx->lock);
    } else if (deadline == 0) {
        err = pthread_mutex_trylock(&rx->lock);
    } else {
        ts = mp__deadline_timespec(deadline);
        err = pthread_mutex_clocklock(&rx->lock, CLOCK_MONOTONIC, &ts);
    }
    if (err == EBUSY) /* only with a deadline of 0: a poll that found it busy */
        return mp__error(MP_ETIMEDOUT, "%s: another consumer is receiving", fn);
    if (err == ETIMEDOUT)
        return mp__error(MP_ETIMEDOUT, "%s: timed out waiting for a message", fn);
    if (err == EOWNERDEAD) {
        recover(rx);
        err = 0;
    }
    return err ? mp__errno_error(err, "%s: locking the reader lock", fn) : 0;
}

bool mp__rx_trylock(mp__rx *rx)
{
    int err = pthread_mutex_trylock(&rx->lock);
    if (err == EOWNERDEAD)
        recover(rx);
    return err == 0 || err == EOWNERDEAD;
}

void mp__rx_unlock(mp__rx *rx) { pthread_mutex_unlock(&rx->lock); }

bool mp__rx_fast_begin(mp__rx *rx)
{
    /* Once set, fd_records stays set: skip the store senders would see. */
    if (atomic_load(&rx->fd_records))
        return false;
    atomic_store(&rx->fast_inside, 1);
    if (!atomic_load(&rx->fd_records))
        return true;
    atomic_store(&rx->fast_inside, 0);
    return false;
}

void mp__rx_fast_end(mp__rx *rx) { atomic_store(&rx->fast_inside, 0); }

static void nudge(int sock)
{
    mp__frame_header h = {.magic = MP__FRAME_MAGIC, .version = MP__FRAME_VERSION,
                          .flags = MP__FRAME_NUDGE};
    struct iovec iov = {.iov_base = &h, .iov_len = sizeof h};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    /* Failing is harmless: a full socket means the reader is not asleep in
     * it, and a socket nobody reads has no reader to wake. */
    (void)mp__sys.sendmsg(sock, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void mp__rx_announce_fds(mp__rx *rx, int sock)
{
    bool nudged = false;
    if (!atomic_load(&rx->fd_records))
        atomic_store(&rx->fd_records, 1);
    while (atomic_load(&rx->fast_inside)) {
        int err = pthread_mutex_trylock(&rx->lock);
        if (err == 0 || err == EOWNERDEAD) {
            /* Nobody holds the lock, so nobody is inside; a reader that died
             * inside left fast_inside set. */
            if (err == EOWNERDEAD)
                recover(rx);
            atomic_store(&rx->fast_inside, 0);
            pthread_mutex_unlock(&rx->lock);
            return;
        }
        if (err != EBUSY)
            return; /* not recoverable: no reader can take the lock again */
        if (!nudged) {
            nudge(sock);
            nudged = true;
        }
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
}
