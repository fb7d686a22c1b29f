/* What Connection, SimpleQueue, Queue and JoinableQueue share: a socket
 * pair, and a small control segment in shared memory holding the reader
 * side (mp__rx) and, for queues, the counters and the closed flag. */
#ifndef MPROC_IPC_H
#define MPROC_IPC_H

#include <pthread.h>
#include <stdatomic.h>

#include "ipc/kinds.h"
#include "ipc/ring.h"
#include "mproc/queue.h"
#include "shm/shm.h"
#include "wire/wire.h"

#define MP__QCTL_MAGIC 0x6c7463716f72706dull /* "mproqctl" */
#define MP__QCTL_VERSION 9u /* 9: the ring's wait flags hold the position waited for */

/* Lives in a sealed memfd segment that every process holding the queue maps.
 * What producers write and what consumers write sit on separate cache lines,
 * so a producer and a consumer on two cores do not bounce one line per
 * message: the queue length is puts - gets, never one shared counter. */
typedef struct mp__qctl {
    uint64_t magic;
    uint32_t version;
    uint32_t kind;                  /* mp_attach_kind of the queue */
    int64_t maxsize;                /* <= 0: unbounded */
    _Atomic uint32_t closed;
    _Atomic uint32_t space_seq;     /* futex: bumped when a slot frees or on close */
    _Atomic uint32_t space_waiters;
    _Atomic uint32_t join_seq;      /* futex: bumped when unfinished reaches 0 */
    _Alignas(64) _Atomic int64_t puts;   /* producers: slots reserved (sent or sending) */
    _Atomic int64_t unfinished;     /* JoinableQueue: put and not yet task_done */
    _Alignas(64) _Atomic int64_t gets;   /* consumers: messages taken */
    mp__rx rx;                      /* the reader lock and the one-call receive */
    mp__ring ring;                  /* small messages without fds (src/ipc/ring.c) */
} mp__qctl;

/* What a queue that is not this host's shared-memory queue does instead
 * (src/ipc/remote.h: a queue shared by MPI ranks). NULL for every local
 * queue, so the local path costs one predictable branch. */
typedef struct mp__queue_ops mp__queue_ops;

/* One process's handle of a queue of any of the three kinds. */
typedef struct mp__queue {
    _Atomic int refs;
    int kind;
    const mp__queue_ops *ops;       /* NULL: the local queue below */
    void *impl;                     /* ops' object */
    int rsock;                      /* gets read here */
    int wsock;                      /* puts write here */
    mp__segment *seg;
    mp__qctl *ctl;
} mp__queue;

struct mp_queue { mp__queue q; };
struct mp_simple_queue { mp__queue q; };

int mp__queue_create(int kind, int64_t maxsize, mp__queue **out);
mp__queue *mp__queue_retain(mp__queue *q);
void mp__queue_release(mp__queue *q);
int mp__queue_put(mp__queue *q, const mp_msg *m, double deadline, const char *fn);
int mp__queue_get(mp__queue *q, mp_msg **out, double deadline, const char *fn);
int mp__queue_close(mp__queue *q);
bool mp__queue_empty(mp__queue *q);
/* 1 when a get would not block (a message is at the head, or the queue is
 * closed), 0 when not; drops a wake-up record found at the head. */
int mp__queue_poll(mp__queue *q);
/* Messages put and not yet taken (approximate, >= 0). */
int64_t mp__queue_size(const mp__queue *q);
/* Messages in q's ring (no system call; a record still on the socket
 * alone is not counted), 0 for a queue of another layer: what a caller
 * that must not wait looks at before it tries a get (the ring's cache
 * line, which the get reads next, not the put and get counters'). */
uint32_t mp__queue_waiting(const mp__queue *q);

/* JoinableQueue: unfinished just reached 0; wakes every mp_queue_join. */
static inline void mp__qctl_wake_join(mp__qctl *c)
{
    atomic_fetch_add(&c->join_seq, 1);
    mp__futex_wake((uint32_t *)&c->join_seq, 1 << 30, true);
}

/* Deadline for the wire layer: 0 stays 0 ("try once"). */
static inline double mp__ipc_deadline(double timeout)
{
    return timeout == 0 ? 0 : mp__deadline(timeout);
}

/* The socket under a connection, borrowed (for poll sets). */
int mp__conn_fd(const mp_conn *c);
/* The pins of the end c receives on (tests), NULL for a remote connection. */
mp__pins *mp__conn_pins(const mp_conn *c);
/* The ring the end c receives on (tests), NULL for a remote connection or
 * an end that only sends. */
mp__ring *mp__conn_ring(const mp_conn *c);
/* Checks a received queue's or connection's control block (what: "queue",
 * "connection"): 0 when its magic and layout version are this build's, else
 * MP_EPROTO with a sentence naming both versions and the fix. */
int mp__ipc_ctl_check(const char *what, uint64_t magic, uint64_t want_magic, uint32_t version,
                      uint32_t want_version);
/* The layout version in the control block c shares with its peer (tests:
 * an attachment from another build), NULL for a remote connection. */
uint32_t *mp__conn_layout_version(const mp_conn *c);
/* Messages to the end c receives on ring no doorbell (mp__ring_quiet): for
 * an end its owner keeps to itself and never polls (no mp_conn_fileno,
 * mp_wait or mp_conn_poll on it). A local connection only; 0, or MP_EINVAL. */
int mp__conn_quiet(mp_conn *c);
/* Messages in the ring the end c receives on (no system call: a record
 * still on the socket alone is not counted); 0 for a remote connection. */
uint32_t mp__conn_waiting(const mp_conn *c);

/* Checks that fd is an AF_UNIX SOCK_SEQPACKET socket (for decoders). */
int mp__check_seqpacket(int fd, const char *what);

#endif
