/* The wire: one message = one SOCK_SEQPACKET record with its fds. Frame
 * encode/decode, the object-attachment registry, and send/recv on a socket. */
#ifndef MPROC_WIRE_H
#define MPROC_WIRE_H

#include <pthread.h>
#include <stdatomic.h>

#include "mproc/msg.h"
#include "os/os.h"
#include "shm/pins.h"
#include "wire/objects.h"

/* The receive side of one socket end, in shared memory that every process
 * reading or writing that socket maps (a queue's or a pipe's control
 * segment). Readers hold the lock around a receive; with it, a record that
 * carries no fds is taken in one recvmsg instead of a peek and a consume
 * (src/wire/rx.c tells how). */
typedef struct mp__rx {
    pthread_mutex_t lock;          /* robust, process-shared: one reader at a time */
    _Atomic uint32_t fd_records;   /* set for good before the first record with fds */
    _Atomic uint32_t fast_inside;  /* a reader is in a one-call receive */
    mp__pins pins;                 /* storages the end's receiver keeps mapped (shm/pins.h) */
} mp__rx;

int mp__rx_init(mp__rx *rx, const char *fn);
/* Takes the reader lock until deadline (< 0 forever, 0 try once; not
 * taken in time -> MP_ETIMEDOUT). A holder that died leaves it EOWNERDEAD: it is made consistent
 * and the caller goes on (nothing is left half-done under the lock). */
int mp__rx_lock(mp__rx *rx, double deadline, const char *fn);
/* Takes the reader lock if it is free (as mp__rx_lock with deadline 0,
 * leaving the last error alone): true when taken. */
bool mp__rx_trylock(mp__rx *rx);
void mp__rx_unlock(mp__rx *rx);

/* Sends m as one record on a SOCK_SEQPACKET socket, waiting for room until
 * deadline (absolute mp__now() seconds; < 0 forever; 0 try once; no room
 * in time -> MP_ETIMEDOUT). Private tensors are shared first. A payload above the spill
 * threshold travels in a sealed segment. */
int mp__wire_send(int sock, const mp_msg *m, double deadline);
/* As mp__wire_send, to a socket whose readers share rx. */
int mp__wire_send_rx(int sock, mp__rx *rx, const mp_msg *m, double deadline);
/* Receives one message. MP_ECLOSED at EOF, MP_ETIMEDOUT as above, MP_EPROTO
 * for any malformed frame (every fd received is closed), MP_EMFILE when the
 * fds did not fit under RLIMIT_NOFILE. */
int mp__wire_recv(int sock, mp_msg **out, double deadline);
/* As mp__wire_recv, by a reader that holds rx's lock; every sender to sock
 * must use mp__wire_send_rx with the same rx. *taken says whether a record
 * left the socket, which is also true when decoding it failed (the message
 * is then dropped). Queues count a get by it, so a dropped message frees its
 * slot. */
int mp__wire_recv_rx(int sock, mp__rx *rx, mp_msg **out, double deadline, bool *taken);

/* Takes a NUDGE record (src/wire/rx.c) off the head of sock, if one is
 * there and no reader holds rx's lock: true when it did. For poll-style
 * calls, which must not report a wake-up record as a message. */
bool mp__wire_drop_nudge(int sock, mp__rx *rx);


/* Encode/decode without a socket, for the fuzzer and tests: encode writes
 * the frame into *buf (malloc'd) and the fds to send into fds (borrowed).
 * decode takes ownership of fds (closes them on error). */
#define MP__WIRE_MAX_FDS MP__MAX_FDS
int mp__wire_encode(const mp_msg *m, void **buf, size_t *len, int *fds, int *nfds);
int mp__wire_decode(const void *buf, size_t len, int *fds, int nfds, mp_msg **out);
/* As mp__wire_decode, for a message taken off the end whose receive side is
 * rx (NULL: none): storages named by a pin of rx are resolved, and storages
 * that arrived by fd may be pinned. */
int mp__wire_decode_rx(mp__rx *rx, const void *buf, size_t len, int *fds, int nfds,
                       mp_msg **out);

#endif
