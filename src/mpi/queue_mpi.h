/* The state of a queue shared by every rank (mp_mpi_queue_create serves it
 * to its user as an mp_queue), shared by queue.c (put, get, close),
 * queue_broker.c (the home's broker) and queue_join.c (JoinableQueue counts,
 * sizes). */
#ifndef MPROC_MPI_QUEUE_H
#define MPROC_MPI_QUEUE_H

#include "mpi/mpi_internal.h"
#include "mproc/queue.h"

#include <pthread.h>
#include <stdatomic.h>

#define MP__TAG_QUEUE (1 << 20) /* queue k: tags MP__TAG_QUEUE + 4k .. + 3 */
enum {
    OP_GET = 1, OP_CANCEL = 2, OP_CLOSE = 3, OP_CANCEL_PUT = 4,
    OP_TASK_DONE = 5, OP_JOIN = 6, OP_QSIZE = 7, /* queue_join.c */
    OP_POSTED = 8, OP_FLUSH = 9                  /* queue_ahead.c */
};
#define MAX_PENDING 64

typedef struct qreq {
    uint64_t req;
    int32_t op; /* OP_* in requests; the result code in answers */
    int32_t pad;
    int64_t val; /* OP_QSIZE's answer: the queue's size */
} qreq;

/* What travels on a queue's tags: a request, answer or put header, and
 * after it, for a message of payload bytes alone that fits, the message
 * itself (mp__mpi_xfer_pack): one MPI message where two would be. */
typedef struct qframe {
    qreq h;
    char msg[MP__MPI_SMALL];
} qframe;
/* The message inside a frame of count bytes received from src. */
int mp__mpi_qframe_msg(const qframe *f, int count, int src, int tag, mp_msg **out);

typedef struct parked {
    int src;
    uint64_t req;
    mp_msg *m; /* a put waiting for room; NULL otherwise */
    int window; /* a put that ran ahead (OP_POSTED): its window; else 0 */
} parked;

typedef struct plist {
    parked *v;
    int n, cap;
} plist;

typedef struct mp_mpi_queue mp_mpi_queue;

/* The home's count of one rank's puts that ran ahead (queue_ahead.c). */
typedef struct ahead_count {
    int64_t done; /* taken: queued, handed to a get, or refused */
    int64_t told; /* done as of the last confirmation sent */
    int64_t want; /* a flush waits until done reaches it */
} ahead_count;

struct mp_mpi_queue {
    int home, tag;
    bool joinable;          /* a JoinableQueue (task_done, join) */
    mp_queue *q;            /* home and same-host ranks, else NULL */
    uint64_t next_req;
    /* the broker (home rank only); lock: one round at a time, and the
     * fields below it */
    pthread_t thread;
    bool running;
    _Atomic bool stop;
    _Atomic bool kick;       /* a put came while the lock was held: go round again */
    pthread_mutex_t lock;
    mp_mpi_queue *next_homed; /* the rank's homed queues (queue_broker.c) */
    mp_msg **taker;          /* during a waiting home get's round: its message */
    double missed_at;        /* mp__now() of the last home put no get took at once */
    bool hand_wait;          /* a get came right after it: the next waits for one */
    plist gets;      /* parked gets, oldest first */
    plist puts;      /* puts waiting for room, oldest first */
    plist dropped;   /* puts cancelled before they arrived */
    plist joins;     /* parked joins (JoinableQueue), oldest first */
    uint64_t *last_put; /* per rank: the newest put request received */
    ahead_count *ahead_counts; /* per rank (home): puts that ran ahead */
    /* a rank on another host: its puts that run ahead (queue_ahead.c) */
    int ahead;             /* the window; 0: every put waits for its answer */
    int64_t ahead_sent;    /* such puts sent */
    int64_t ahead_done;    /* ... of which the home confirmed taking */
    int ahead_refused;     /* refused, not yet reported */
    int ahead_rc;          /* the refusal's code */
    bool ahead_closed;     /* a refusal said the queue is closed */
    mp__mpi_inflight *sends[64]; /* answers MPI still carries */
    /* a rank on another host: puts that timed out while MPI still
     * carries their bytes (progressed by every later call) */
    mp__mpi_inflight *pending[MAX_PENDING];
};

int mp__mpi_qpush(plist *l, parked p);
parked mp__mpi_qtake(plist *l, int i);
int mp__mpi_qfind(const plist *l, int src, uint64_t req);
/* The broker (queue_broker.c). start: its thread, and the queue among the
 * homed ones that waiting home threads serve; stop undoes both. */
int mp__mpi_qbroker_start(mp_mpi_queue *b, const char *fn);
void mp__mpi_qbroker_stop(mp_mpi_queue *b);
/* After a put on the home: gets parked by remote ranks take the queue's
 * oldest messages now (or the lock's holder goes round again). */
void mp__mpi_qbroker_push(mp_mpi_queue *b);
/* Instead of a put on the home: the message goes straight to the oldest
 * get parked by a remote rank, when the queue is empty (true then). */
bool mp__mpi_qbroker_hand_over(mp_mpi_queue *b, const mp_msg *m);
/* Whether a get on the real queue lq would not wait: a message is put (or
 * on its way in) or it is closed. Two counters and a flag, no system call. */
bool mp__mpi_qready(const mp_queue *lq);
/* One round of every homed queue's broker whose lock is free; whether any
 * did work. From a home thread waiting in a get on mine, between
 * mp__mpi_qbroker_spinning(+1) and (-1) (broker threads stand back); a put
 * that may skip mine's queue lands in *got (which must be NULL before). */
bool mp__mpi_qbroker_all(mp_mpi_queue *mine, mp_msg **got);
void mp__mpi_qbroker_spinning(int delta);
/* A home thread that served the rounds goes on to block: the broker
 * threads stop standing back and wake from their naps at once. */
void mp__mpi_qbroker_hand_back(void);
/* mp__mpi_wait for a thread of a rank that homes queues (waiting for a
 * broker's answer from another rank): while it spins it runs their rounds
 * as a home get does, so a request to this rank is not left to the broker
 * thread's naps. */
int mp__mpi_qbroker_wait(MPI_Request *req, double deadline, MPI_Status *st, const char *fn);
/* Sends the answer {req, rc, val} (then m, when not NULL) to dest. */
void mp__mpi_qanswer(mp_mpi_queue *b, int dest, uint64_t req, int rc, int64_t val,
                     const mp_msg *m);
/* The broker's part of queue_join.c: a request of op OP_TASK_DONE, OP_JOIN
 * or OP_QSIZE (false for any other op), and the parked joins answered
 * once every message was task_done'd. */
bool mp__mpi_qbroker_join_op(mp_mpi_queue *b, int src, const qreq *r);
bool mp__mpi_qbroker_joins(mp_mpi_queue *b);
/* After a wait on a receive r that failed: cancels it, so no buffer of the
 * caller's frame stays posted; whether its message came all the same. */
bool mp__mpi_qrecv_cancel(MPI_Request *r, MPI_Status *st);
/* The broker's answer to request req, cancelled with op at the deadline;
 * a message that came inside the answer lands in *inl (NULL: none may). */
int mp__mpi_qawait(mp_mpi_queue *mq, uint64_t req, double deadline, int op, qreq *a,
                   mp_msg **inl, const char *fn);
/* A request {req, op} to the home's broker (rank on another host). */
void mp__mpi_qrequest(mp_mpi_queue *mq, uint64_t req, int op);
/* Puts that run ahead (queue_ahead.c). On the home: one of rank src's
 * was taken (rc 0: queued or handed over; else refused), and a flush
 * request; each confirms on tag+3 when due. */
void mp__mpi_qahead_taken(mp_mpi_queue *b, int src, int window, int rc);
void mp__mpi_qahead_flush_request(mp_mpi_queue *b, int src, const qreq *r);
/* On a rank of another host: whether the next put runs ahead, after
 * waiting (until deadline) for room in the window; the refusals not yet
 * reported come back first, as the put's error. */
int mp__mpi_qahead_room(mp_mpi_queue *mq, double deadline, const char *fn);
/* Before any other call on the queue: waits until the home confirmed
 * this rank's puts (refusals stay for the next put or flush). */
int mp__mpi_qahead_settle(mp_mpi_queue *mq, double deadline, const char *fn);
/* mp_mpi_queue_flush: settle, then report the refusals. */
int mp__mpi_qahead_flush(mp_mpi_queue *mq, double deadline, const char *fn);
/* A call's deadline to the home: a poll still gets one round trip. */
double mp__mpi_qdeadline(double deadline);
/* The JoinableQueue and size calls of the ops table (queue_join.c). */
int mp__mpi_qtask_done(void *impl, const char *fn);
int mp__mpi_qjoin(void *impl, double deadline, const char *fn);
int64_t mp__mpi_qsize(void *impl, const char *fn);

#endif
