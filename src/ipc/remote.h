/* Queues and connections whose other side is not reached through this
 * host's sockets and shared memory: a higher layer (the MPI layer) makes
 * an mp_queue or mp_conn whose calls go through an ops table it fills, so
 * its users call mp_queue_put, mp_conn_recv... as on local objects. ipc
 * never names that layer: it only calls the table. A local object has no
 * table (ops NULL), and calls that only a local object can serve (fds for
 * poll loops, travelling in a message) fail with MP_ENOTSUP and ops->what
 * in the sentence. */
#ifndef MPROC_IPC_REMOTE_H
#define MPROC_IPC_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include "mproc/queue.h"

typedef struct mp__queue_ops mp__queue_ops;

/* Deadlines are mp__now() times (< 0 forever, 0 poll); fn names the
 * public call for the error sentence. */
struct mp__queue_ops {
    const char *what; /* "a queue shared by MPI ranks (mp_mpi_queue_create)" */
    int (*put)(void *impl, const mp_msg *m, double deadline, const char *fn);
    int (*get)(void *impl, mp_msg **out, double deadline, const char *fn);
    int (*close)(void *impl, const char *fn);
    int64_t (*qsize)(void *impl, const char *fn);
    int (*task_done)(void *impl, const char *fn);
    int (*join)(void *impl, double deadline, const char *fn);
    void (*destroy)(void *impl); /* the last release */
};

typedef struct mp__conn_ops {
    const char *what;
    int (*send)(void *impl, const mp_msg *m, double deadline, const char *fn);
    int (*recv)(void *impl, mp_msg **out, double deadline, const char *fn);
    /* 1 when a message (or the end) is ready, 0 when not by deadline. */
    int (*poll)(void *impl, double deadline, const char *fn);
    int (*close)(void *impl, const char *fn);
    void (*destroy)(void *impl);
} mp__conn_ops;

/* A queue (kind MP_ATTACH_QUEUE or MP_ATTACH_JOINABLE_QUEUE) or a duplex
 * connection served by ops over impl: one reference, whose last release
 * calls ops->destroy(impl). On failure nothing is kept (impl untouched). */
int mp__queue_wrap(int kind, const mp__queue_ops *ops, void *impl, mp_queue **out);
int mp__conn_wrap(const mp__conn_ops *ops, void *impl, mp_conn **out);
/* impl when q (c) is served by ops, else NULL. */
void *mp__queue_impl(const mp_queue *q, const mp__queue_ops *ops);
void *mp__conn_impl(const mp_conn *c, const mp__conn_ops *ops);
/* Whether q (c) is served by an ops table (not this host's own object). */
bool mp__queue_is_remote(const mp_queue *q);
bool mp__conn_is_remote(const mp_conn *c);

#endif
