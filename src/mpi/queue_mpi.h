/* The state of a queue shared by every rank (mp_mpi_queue_create serves it
 * to its user as an mp_queue), shared by queue.c (put, get, close, the broker)
 * and queue_join.c (JoinableQueue counts, sizes). */
#ifndef MPROC_MPI_QUEUE_H
#define MPROC_MPI_QUEUE_H

#include "mpi/mpi_internal.h"
#include "mproc/queue.h"

#include <stdatomic.h>

#define MP__TAG_QUEUE (1 << 20) /* queue k: tags MP__TAG_QUEUE + 4k .. + 3 */
enum {
    OP_GET = 1, OP_CANCEL = 2, OP_CLOSE = 3, OP_CANCEL_PUT = 4,
    OP_TASK_DONE = 5, OP_JOIN = 6, OP_QSIZE = 7 /* queue_join.c */
};
#define MAX_PENDING 64

typedef struct qreq {
    uint64_t req;
    int32_t op; /* OP_* in requests; the result code in answers */
    int32_t pad;
    int64_t val; /* OP_QSIZE's answer: the queue's size */
} qreq;

typedef struct parked {
    int src;
    uint64_t req;
    mp_msg *m; /* a put waiting for room; NULL otherwise */
} parked;

typedef struct plist {
    parked *v;
    int n, cap;
} plist;

typedef struct mp_mpi_queue mp_mpi_queue;

struct mp_mpi_queue {
    int home, tag;
    bool joinable;          /* a JoinableQueue (task_done, join) */
    mp_queue *q;            /* home and same-host ranks, else NULL */
    uint64_t next_req;
    /* the broker (home rank only) */
    pthread_t thread;
    bool running;
    _Atomic bool stop;
    plist gets;      /* parked gets, oldest first */
    plist puts;      /* puts waiting for room, oldest first */
    plist dropped;   /* puts cancelled before they arrived */
    plist joins;     /* parked joins (JoinableQueue), oldest first */
    uint64_t *last_put; /* per rank: the newest put request received */
    mp__mpi_inflight *sends[64]; /* answers MPI still carries */
    /* a rank on another host: puts that timed out while MPI still
     * carries their bytes (progressed by every later call) */
    mp__mpi_inflight *pending[MAX_PENDING];
};

int mp__mpi_qpush(plist *l, parked p);
parked mp__mpi_qtake(plist *l, int i);
int mp__mpi_qfind(const plist *l, int src, uint64_t req);
/* Sends the answer {req, rc, val} (then m, when not NULL) to dest. */
void mp__mpi_qanswer(mp_mpi_queue *b, int dest, uint64_t req, int rc, int64_t val, mp_msg *m);
/* The broker's part of queue_join.c: a request of op OP_TASK_DONE, OP_JOIN
 * or OP_QSIZE (false for any other op), and the parked joins answered
 * once every message was task_done'd. */
bool mp__mpi_qbroker_join_op(mp_mpi_queue *b, int src, const qreq *r);
bool mp__mpi_qbroker_joins(mp_mpi_queue *b);
/* The broker's answer to request req, cancelled with op at the deadline. */
int mp__mpi_qawait(mp_mpi_queue *mq, uint64_t req, double deadline, int op, qreq *a,
                   const char *fn);
/* A request {req, op} to the home's broker (rank on another host). */
void mp__mpi_qrequest(mp_mpi_queue *mq, uint64_t req, int op);
/* The JoinableQueue and size calls of the ops table (queue_join.c). */
int mp__mpi_qtask_done(void *impl, const char *fn);
int mp__mpi_qjoin(void *impl, double deadline, const char *fn);
int64_t mp__mpi_qsize(void *impl, const char *fn);

#endif
