/* The MPI layer's state: the job (ranks, hosts, pids), the same-host
 * sockets, the failure watch, and the helpers every blocking call uses. */
#ifndef MPROC_MPI_INTERNAL_H
#define MPROC_MPI_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "mproc/mpi.h"
#include "os/os.h"

#define MP__MPI_HOST_MAX 64
#define MP__MPI_TEXT_MAX 1024

/* Tags on the layer's communicator. Conn k of a pair uses the three tags
 * from MP__TAG_CONN + 3k: small messages and notices, its close notice,
 * large messages. */
enum {
    MP__TAG_FAIL = 1,     /* a failure record, to every rank */
    MP__TAG_RELEASE = 2,  /* rank 0 to a failed rank: reported, you may go */
    MP__TAG_CONN = 16
};

/* A failure record as it travels (fixed size: one eager MPI message). */
typedef struct mp__mpi_fail {
    int32_t rank;
    int32_t pid;
    int32_t exitcode;
    int32_t signal;
    char host[MP__MPI_HOST_MAX];
    char message[MP__MPI_TEXT_MAX];
} mp__mpi_fail;

typedef struct mp__mpi_peer {
    char host[MP__MPI_HOST_MAX];
    pid_t pid;
    int local;        /* index among this host's ranks, or -1 on another host */
    int sock;         /* same-host bootstrap socket to this rank, or -1 */
    int pidfd;        /* same-host: readable once it exited, or -1 */
    uint32_t nconns;  /* mp_mpi_pipe calls made with this peer */
} mp__mpi_peer;

typedef struct mp__mpi_job {
    bool up;
    bool owns_mpi;          /* mp_mpi_init called MPI_Init */
    bool local_path;        /* same-host shared memory (MPROC_MPI_LOCAL != 0) */
    MPI_Comm comm;          /* our duplicate of MPI_COMM_WORLD */
    MPI_Comm node;          /* the ranks of this host */
    int rank, size, local_rank, local_size;
    mp__mpi_peer *peers;    /* size of them */
    MPI_Request fail_req;   /* posted receive of a failure record */
    mp__mpi_fail fail_in;   /* its buffer */
    bool failed;            /* a failure is known: every blocking call fails */
    mp__mpi_fail failure;   /* the first one */
    double next_pid_check;  /* mp__now() of the next pidfd poll */
    int thread_level;       /* what MPI_Init_thread provided */
    pthread_t main_thread;  /* the one that initialized: the failure watch is its */
    pid_t pid;              /* the rank's process (a process forked from it differs) */
} mp__mpi_job;

extern mp__mpi_job mp__mpi;

/* MP_ESTATE with a sentence naming fn when the job is not initialized. */
int mp__mpi_need(const char *fn);
/* As need, then MP_EINVAL when rank is not one of the job's; what names
 * the argument ("peer", "home"). */
int mp__mpi_rank_check(int rank, const char *what, const char *fn);
/* Whether this is a process forked from the rank: MPI must not be called
 * there, so the cross-rank objects it inherited refuse every call (own:
 * MP_ESTATE with a sentence naming fn and the fix) and their release frees
 * nothing (the child's memory goes with it). */
bool mp__mpi_forked(void);
int mp__mpi_own(const char *fn);
/* The failure check every blocking loop makes: 0, or MP_ECHILD with the
 * sentence set (a record arrived, or a same-host rank vanished). Cheap:
 * one MPI_Test, and a poll of the pidfds at most every few ms. */
int mp__mpi_check(const char *fn);
/* Records a failure seen here and tells every other rank. */
void mp__mpi_fail_report(const mp__mpi_fail *f);
/* MP_ECHILD with the failure's sentence, prefixed by fn. */
int mp__mpi_fail_error(const char *fn);
/* Waits for req until deadline (< 0 forever, 0 one test), running the
 * failure check: 0, MP_ETIMEDOUT (req still pending), MP_ECHILD,
 * MP_ESYS (MPI error). st may be NULL. */
int mp__mpi_wait(MPI_Request *req, double deadline, MPI_Status *st, const char *fn);
/* As mp__mpi_wait for a transfer of data: yields instead of napping, since
 * MPI moves the bytes (TCP fragments, rendezvous) only while it is called. */
int mp__mpi_wait_data(MPI_Request *req, double deadline, MPI_Status *st, const char *fn);
/* One step of a polling loop: spin (MP__MPI_SPINS rounds), then yield
 * (as many), then nap. */
#define MP__MPI_SPINS 4096u
void mp__mpi_backoff(unsigned *spins);
/* How long one slice of a blocking local call may wait (the failure check
 * runs between slices): 0 for a poll, else at most 50 ms and never past
 * deadline (< 0 forever, 0 poll, else an mp__now() time). */
double mp__mpi_slice(double deadline);
/* MP_ETIMEDOUT with "fn: what" (a poll) or "fn: timed out" when a call with
 * this deadline must stop now; 0 while it may go on waiting. */
int mp__mpi_expired(double deadline, const char *fn, const char *what);
/* An MPI error code as an mproc error with MPI's text. */
int mp__mpi_error(int mpirc, const char *fn, const char *what);

/* A pipe between two ranks (conn.c): what mp_mpi_pipe's mp_conn serves,
 * used directly by the pool over ranks. Deadlines as mp__mpi_wait's; fn
 * names the public call in sentences. */
typedef struct mp_mpi_conn mp_mpi_conn;
int mp__mpi_pipe(int peer, mp_mpi_conn **out, const char *fn);
int mp__mpi_conn_send(mp_mpi_conn *c, const mp_msg *m, double deadline, const char *fn);
int mp__mpi_conn_recv(mp_mpi_conn *c, mp_msg **out, double deadline, const char *fn);
int mp__mpi_conn_close(mp_mpi_conn *c, const char *fn);
void mp__mpi_conn_destroy(mp_mpi_conn *c);

/* Same-host bootstrap (local.c): sockets to every rank of this host. */
int mp__mpi_local_connect(const char *token);
void mp__mpi_local_close(void);

/* Message over MPI (xfer.c): the cross-host encoding. An inflight keeps
 * a message's requests and tensors until MPI is done with them; its
 * buffers stay for the next message (a conn has one). */
typedef struct mp__mpi_inflight mp__mpi_inflight;
int mp__mpi_inflight_new(mp__mpi_inflight **out);
/* Starts sending m to rank dest with tag on an idle f: header, then each
 * tensor's bytes. small_tag >= 0 (conns): a message without tensors whose
 * header fits MP__MPI_SMALL goes whole on small_tag; any other sends a
 * notice on small_tag, then itself on tag. */
#define MP__MPI_SMALL 1024
int mp__mpi_xfer_post(mp__mpi_inflight *f, const mp_msg *m, int dest, int tag, int small_tag);
/* As post, on a new inflight (*out, NULL when nothing was posted). */
int mp__mpi_xfer_send(const mp_msg *m, int dest, int tag, mp__mpi_inflight **out);
/* A message of payload bytes alone whose header fits in cap: its header
 * (as mp__mpi_xfer_parse reads it) into buf, 0 and *len; else 1, nothing
 * written (queues send such a message inside their own MPI message). */
int mp__mpi_xfer_pack(const mp_msg *m, char *buf, size_t cap, size_t *len);
/* 0 when every attachment of m can cross hosts, else MP_ENOTSUP naming it. */
int mp__mpi_xfer_check(const mp_msg *m);
/* 1 when every request completed (f is idle again), 0 while pending;
 * waits until deadline as mp__mpi_wait does. */
int mp__mpi_inflight_wait(mp__mpi_inflight *f, double deadline, const char *fn);
/* Whether f has requests posted (not yet seen complete). */
bool mp__mpi_inflight_busy(const mp__mpi_inflight *f);
void mp__mpi_inflight_free(mp__mpi_inflight *f);
/* 1 when every request completed (f is idle again), else 0: one
 * MPI_Testall, no failure check (safe from the queue broker's thread). */
int mp__mpi_inflight_test(mp__mpi_inflight *f);
/* A receive buffer kept between messages. */
typedef struct mp__mpi_buf {
    char *p;
    size_t cap;
} mp__mpi_buf;
/* What the receiving calls return for a notice that the message follows
 * on the conn's tag of large messages. */
#define MP__MPI_FOLLOWS 2
/* Builds the message of a received header of count bytes (its tensors'
 * bodies are then received from src on tag): 0 and *out, a notice
 * (above), or an error. */
int mp__mpi_xfer_parse(const char *buf, int count, int src, int tag, mp_msg **out);
/* Receives one message whose header is matched on (src, tag), through
 * scratch (NULL: a buffer of its own): as mp__mpi_xfer_parse. */
int mp__mpi_xfer_recv(MPI_Message *msg, MPI_Status *st, int tag, mp__mpi_buf *scratch,
                      mp_msg **out);
/* As mp__mpi_xfer_recv where no notice may come (queues): 0 or an error. */
int mp__mpi_xfer_recv_msg(MPI_Message *msg, MPI_Status *st, int tag, mp_msg **out);

#endif
