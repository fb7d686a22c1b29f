/* mproc — waiting on many connections, queues and processes at once
 * (Python's multiprocessing.connection.wait), and the fd behind each, for
 * programs that run their own poll/epoll loop (libuv, libevent, ...).
 *
 * Readiness is true readiness: a connection or queue is ready when a
 * receive would not block (a message is there, or EOF / closed), a process
 * when it has exited. docs/messaging.md tells how to use the fds in your
 * own loop.
 */
#ifndef MPROC_WAIT_H
#define MPROC_WAIT_H

#include <stdbool.h>
#include <stddef.h>

#include "mproc/error.h"
#include "mproc/process.h"
#include "mproc/queue.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_wait_kind {
    MP_WAIT_CONN = 1,         /* conn: a message or EOF to receive */
    MP_WAIT_QUEUE = 2,        /* queue: a message to get, or closed */
    MP_WAIT_SIMPLE_QUEUE = 3, /* simple_queue: the same */
    MP_WAIT_PROCESS = 4,      /* process: the child has exited */
    MP_WAIT_FD = 5            /* fd: readable, hung up or in error */
} mp_wait_kind;

typedef struct mp_wait_item {
    int kind; /* mp_wait_kind */
    union {
        mp_conn *conn;
        mp_queue *queue;
        mp_simple_queue *simple_queue;
        mp_process *process;
        int fd;
    } u;
    bool ready; /* out: set by mp_wait */
} mp_wait_item;

/* Waits until at least one of items[0..n-1] is ready, or timeout seconds
 * pass (negative: forever). Sets every item's `ready` and returns how many
 * are ready (>= 1). None ready: MP_ETIMEDOUT (timeout 0 polls, as every
 * blocking call's does). Other errors: MP_EINVAL (a NaN timeout, n == 0,
 * NULL items, an unknown kind, a NULL object, an fd that is not open, a
 * process not started or started by another process), MP_ESTATE (a
 * send-only connection end), MP_ECLOSED (a closed connection handle),
 * MP_ESYS (poll). An item's error names it: "mp_wait: item 2: ...". Never
 * receives, gets or reaps: a ready item is then received from or joined by
 * the caller. Wake-up records that mproc's
 * queues and pipes use internally are dropped on the way, never reported.
 * Thread-safe (several threads may wait on the same objects). */
MP_API int mp_wait(mp_wait_item *items, size_t n, double timeout);

/* The fd to watch for the object in your own poll/epoll loop (level- or
 * edge-triggered, POLLIN / EPOLLIN); -1 for NULL or a closed handle. Owned
 * by the object: do not close it or read from it. Readable means "look":
 * call the object's non-blocking receive (mp_conn_poll(c, 0) or
 * mp_conn_recv(c, &m, 0), mp_queue_get_nowait) until it says MP_ETIMEDOUT;
 * it may find nothing, since the fd also carries wake-up records (which
 * that call drops) and other consumers may take the message first. Closing
 * a queue queues an end-of-stream record, which makes the fd readable; a
 * consumer that got MP_ECLOSED should stop watching it (mp_wait checks the
 * queue's closed flag itself). For a process, mp_process_sentinel (its
 * pidfd, readable once the child has exited). */
MP_API int mp_conn_fileno(const mp_conn *c);
MP_API int mp_queue_fileno(const mp_queue *q);
/* (A conn or queue between MPI ranks, mproc/mpi.h, has no fd: the two
 * _fileno calls and mp_wait fail on it with MP_ENOTSUP.) */
MP_API int mp_simple_queue_fileno(const mp_simple_queue *q);

#ifdef __cplusplus
}
#endif
#endif
