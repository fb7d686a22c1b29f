/* The shared-memory ring beside a pipe's or a queue's socket: small
 * messages without fds travel through it; the socket stays for fds, big
 * messages, wake-ups and liveness (src/ipc/ring.c tells the protocol). */
#ifndef MPROC_IPC_RING_H
#define MPROC_IPC_RING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "wire/wire.h"

#define MP__RING_SLOTS 512u    /* a power of two; 128 KiB a ring */
#define MP__RING_SLOT 256u     /* bytes per slot, header included */
#define MP__RING_DATA (MP__RING_SLOT - 8u)

typedef struct mp__ring_slot {
    uint32_t seq;    /* p + 1 once the message at position p is in it (published) */
    uint16_t type;   /* RING_PAYLOAD, RING_FRAME, RING_COMPACT or RING_MARK (ring_impl.h) */
    uint16_t len;    /* data bytes (a mark's: its record's 4-byte tag) */
    _Alignas(8) unsigned char data[MP__RING_DATA]; /* moved in words (ring_impl.h) */
} mp__ring_slot;
_Static_assert(MP__RING_DATA % 8 == 0, "a slot's data is whole words");
_Static_assert(sizeof(mp__ring_slot) == MP__RING_SLOT, "a slot is MP__RING_SLOT bytes");
/* The wait flags are shared between processes: a lock inside the atomic
 * would be each process's own. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics without a lock");

/* Lives in the endpoint's control segment (a sealed memfd), so it travels
 * wherever the control segment's fd travels. Producers write one cache line
 * and consumers another; the third holds what each side reads of the other
 * rarely. */
typedef struct mp__ring {
    pthread_mutex_t plock;             /* robust, process-shared: one producer at a time */
    _Atomic uint32_t tag;              /* the last socket record's tag (under plock) */
    _Alignas(64) _Atomic uint32_t tail; /* slots published, as producers count them */
    _Atomic uint32_t head_seen;        /* head as a producer last read it (<= head) */
    _Atomic uint32_t closes_seen;      /* `closes` when a producer last found a reader */
    _Alignas(64) _Atomic uint32_t head; /* slots taken (consumers, by compare-and-swap) */
    _Atomic uint64_t space_wait;       /* a producer sleeps on head, the ring full at the
                                        * head in it (ring_impl.h's wait_flag); or 0 */
    _Alignas(64) _Atomic uint64_t sleeping; /* a consumer sleeps on tail, waiting for the
                                             * slot in it (wait_flag); or 0 */
    _Atomic uint32_t spinning;         /* a consumer watches its slot (rings with doorbells) */
    _Atomic uint32_t bells;            /* doorbells sent and not yet dropped (about) */
    _Atomic uint32_t pcpu;             /* the CPU the last producer ran on */
    _Atomic uint32_t bell_mode;        /* doorbells: an mp__ring_bells state */
    _Atomic uint32_t closes;           /* receiving ends closed (mp__ring_reader_closed) */
    _Alignas(64) mp__ring_slot slot[MP__RING_SLOTS];
} mp__ring;

/* Whether producers ring doorbells (the bell_mode field). */
enum mp__ring_bells {
    MP__RING_BELLS = 0,   /* always (a pipe end: its fd may be polled at any time) */
    MP__RING_QUIET = 1,   /* never (mp__ring_quiet) */
    MP__RING_UNPOLLED = 2 /* not until the fd is handed out (mp__ring_polled) */
};

int mp__ring_init(mp__ring *r, const char *fn);
/* Sends m: through the ring when it carries no fds and fits in a slot,
 * otherwise as a tagged record on sock with a mark in the ring. rx is the
 * receive side of sock (for the fd handshake). Deadline as mp__wire_send.
 * pipe: sock's peer may go away (a pipe, not a queue): a send then fails
 * with MP_ECLOSED, checked after a receiving end was closed
 * (mp__ring_reader_closed), every 64 messages (a reader that exited or was
 * killed) and whenever the ring is full. */
int mp__ring_send(mp__ring *r, int sock, mp__rx *rx, const mp_msg *m, double deadline,
                  bool pipe, const char *fn);
/* Takes the message at the ring's head without rx's lock when it is a
 * payload alone (the small-message path), so that consumers do not queue
 * on the lock for it: 1 taken (*out), 0 nothing such at the head (receive
 * with the lock), or an error with *taken as below. */
int mp__ring_take(mp__ring *r, int sock, mp__rx *rx, mp_msg **out, bool *taken);
/* Receives the next message, as a consumer does: a payload alone by
 * mp__ring_take, anything else by mp__ring_recv under rx's lock. `closed`,
 * when not NULL, is read once the lock is held: set, nothing more can
 * arrive, so the call does not wait for it. Returns and *taken as
 * mp__ring_recv. */
int mp__ring_get(mp__ring *r, int sock, mp__rx *rx, mp_msg **out, double deadline,
                 const _Atomic uint32_t *closed, const char *fn, bool *taken);
/* Receives the next message in ring order; the caller holds rx's lock.
 * *taken as mp__wire_recv_rx: true when a message left the endpoint, even if
 * it could not be decoded. MP_ECLOSED at EOF or at a queue's end marker. */
int mp__ring_recv(mp__ring *r, int sock, mp__rx *rx, mp_msg **out, double deadline,
                  bool *taken);
/* 1 when a receive would not block, 0 when not by deadline; drops wake-up
 * records. Takes rx's lock only to look at the socket's head. */
int mp__ring_poll(mp__ring *r, int sock, mp__rx *rx, double deadline, const char *fn);
/* The consumers of r never poll its socket's fd (an end a higher layer
 * keeps to itself and only receives on when it knows a message is there):
 * producers stop sending doorbells, which cost a sendmsg per message that
 * finds no consumer inside a receive, and a recvmsg to drop it. A poll of
 * such an end sees a ring message only at its next slice (50 ms). */
void mp__ring_quiet(mp__ring *r);
/* For a ring whose fd nobody may have asked for yet (a queue's): no
 * doorbells until mp__ring_polled. */
void mp__ring_unpolled(mp__ring *r);
/* r's fd is handed out (to a user's poll, select or mp_wait): an unpolled
 * ring rings doorbells from now on, and rings one now on sock (a socket
 * whose sends r's fd reads) when a message is already waiting. Sticky. */
void mp__ring_polled(mp__ring *r, int sock);
/* Wakes consumers asleep on the ring (a pipe end or a queue was closed:
 * they look at the socket at once). */
void mp__ring_wake(mp__ring *r);
/* A receiving end of r's pipe closed its fd: the next send looks whether
 * it was the last one (and fails then) instead of sending into a ring
 * nobody will read. Call after the close. */
void mp__ring_reader_closed(mp__ring *r);
/* Messages in the ring (marks included), approximate. */
uint32_t mp__ring_count(const mp__ring *r);

/* Fault injection for tests: called at every step of the protocol with the
 * step's number (MP__RING_STEP_*); NULL in normal runs. */
enum {
    MP__RING_STEP_LOCKED = 1,     /* producer holds plock */
    MP__RING_STEP_FILLED,         /* slot written, not published */
    MP__RING_STEP_PUBLISHED,      /* slot published, tail not yet moved, plock held */
    MP__RING_STEP_UNLOCKED,       /* plock released, wake-up not yet sent */
    MP__RING_STEP_TAGGED,         /* socket path: tag taken, record not sent */
    MP__RING_STEP_SENT,           /* socket path: record sent, mark not written */
    MP__RING_STEP_COPIED,         /* consumer copied a slot, head not moved */
    MP__RING_STEP_TAKEN,          /* consumer moved head, message not returned */
    MP__RING_STEP_MARK_RECEIVED,  /* consumer took a mark's record, head not moved */
    MP__RING_STEP_SLEEPING,       /* consumer flagged itself asleep, not yet in poll */
    MP__RING_STEP_CLAIMED,        /* consumer moved head, space_wait not yet looked at */
    MP__RING_STEP_SPACE_WAIT,     /* producer flagged itself waiting for room, not asleep */
    MP__RING_STEPS
};
extern void (*mp__ring_fault)(int step);

#endif
