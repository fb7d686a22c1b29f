/* mproc — ranks as processes across hosts, on MPI (libmproc_mpi).
 *
 * A program started by `mpirun -np N prog` calls mp_setup, then
 * mp_mpi_init; every rank is then one mproc process. This header is served
 * by the separate library libmproc_mpi (CMake target mproc_mpi), which links
 * MPI; libmproc itself never depends on MPI. Built without MPI (CMake
 * -DMPROC_MPI=OFF, or Open MPI not installed), every call here fails with
 * MP_ENOTSUP and a sentence saying how to enable it.
 *
 * Ranks on one host (found with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED))
 * exchange tensors through mproc's own local path: a real mproc pipe whose
 * tensors travel as shared-memory handles. Ranks on different hosts (or
 * every pair when the environment has MPROC_MPI_LOCAL=0) exchange them over
 * MPI: payload and tensor metadata in one MPI message, then each tensor's
 * storage by a non-blocking send straight from its memory; the receiver
 * gets each tensor in mproc shared memory (as mp_tensor_empty_shared
 * makes) with the bytes received into it directly, so it can be passed on
 * locally. The memory of a received tensor that was dropped without ever
 * leaving the process is reused for the next one of its size.
 *
 * Host-local things: queues, connections and sync objects attached to a
 * message cross only between ranks of one host; sending one to another host
 * fails with MP_ENOTSUP naming the attachment. docs/mpi.md tells more.
 *
 * Failure contract: every blocking call here watches the job. When any
 * rank fails (its mp_mpi_spawn entry returns non-zero or calls mp_raise, it
 * dies of a signal, or a rank on this host vanishes), every other rank's
 * blocking call returns MP_ECHILD within a bounded time (a few ms for a
 * reported failure, a poll period for a vanished local rank) and
 * mp_mpi_failure gives the record. Ranks lost on other hosts are reported by
 * mpirun, which ends the job.
 *
 * Threads: mp_mpi_init asks MPI for MPI_THREAD_MULTIPLE; one conn end is
 * used by one thread at a time. No call starts a thread but a queue's
 * broker (below).
 */
#ifndef MPROC_MPI_H
#define MPROC_MPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mproc/error.h"
#include "mproc/msg.h"
#include "mproc/pool.h"
#include "mproc/queue.h"
#include "mproc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the job --------------------------------------------------------------- */

/* Initializes MPI (unless the program already did) and the job: ranks,
 * hosts, pids and the same-host sockets. Collective: every rank calls it.
 * Call after mp_setup. MP_ENOTSUP without MPI; MP_ESTATE when called twice;
 * MP_ESYS when MPI or a socket failed (the sentence says which). */
int mp_mpi_init(int *argc, char ***argv);
/* Waits for every rank, closes the sockets and finalizes MPI when
 * mp_mpi_init initialized it. Collective. No-op before init. After a
 * failure it returns MP_ECHILD without finalizing (a collective finalize
 * would wait for the dead rank): exit non-zero and mpirun ends the job.
 * Ranks other than 0 first wait up to 10 s for rank 0 to end it, so rank
 * 0's report is not cut off. */
int mp_mpi_finalize(void);

/* This rank, the number of ranks, this rank's index among the ranks of its
 * host and their number. MP_ESTATE before mp_mpi_init. */
int mp_mpi_rank(void);
int mp_mpi_size(void);
int mp_mpi_local_rank(void);
int mp_mpi_local_size(void);
/* The host name and pid of rank. MP_EINVAL for a bad rank. */
int mp_mpi_rank_info(int rank, const char **host, pid_t *pid);
/* 1 when messages to rank take mproc's same-host path, 0 when they go over
 * MPI (another host, or MPROC_MPI_LOCAL=0), or a negative error. */
int mp_mpi_is_local(int rank);

/* ---- launch and failures ---------------------------------------------------- */

/* A failed rank: what mp_spawn's mp_child_error says of a child, plus host.
 * Set size before the call (mp_mpi_error e = {.size = sizeof e};): the
 * library writes no more than that, so the record can grow. */
typedef struct mp_mpi_error {
    size_t size;             /* sizeof(mp_mpi_error), set by the caller */
    int rank;
    pid_t pid;
    const char *host;
    int exitcode;            /* the entry's return value, 1 after mp_raise, -signal */
    int signal;              /* the signal that killed it, or 0 */
    const char *message;     /* the mp_raise text, or a sentence of what was seen */
} mp_mpi_error;

/* Runs the entry registered as `entry` (MP_ENTRY) on this rank with args
 * (borrowed; NULL: an empty message) as entry(rank, args). Collective: every
 * rank calls it. Returns 0 once the entry returned 0 on every rank.
 * MP_ECHILD when any rank failed: its entry returned non-zero or called
 * mp_raise (caught here; the call returns instead of exiting), or it died;
 * *err (may be NULL) gets the record, the same on every rank that learns
 * of it, and mp_last_error a sentence. A rank whose entry failed tells every
 * other rank at once, then (unless it is rank 0) waits up to 10 s for rank 0
 * to report and end the job, so rank 0's report is never cut off by mpirun.
 * MP_ENOENT: no entry of that name. Rank 0 should print the record and exit
 * non-zero, which makes mpirun end the whole job (mp_mpi_finalize then
 * returns MP_ECHILD). */
int mp_mpi_spawn(const char *entry, mp_msg *args, mp_mpi_error *err);
/* The first failure this rank learned of: 0 and *err, or MP_ESTATE.
 * Both calls: MP_EINVAL, before anything else, when err's size is not set. */
int mp_mpi_failure(mp_mpi_error *err);

/* ---- pipes and queues between ranks ------------------------------------------
 * Only the constructors are MPI calls: what they make is an ordinary
 * mp_conn or mp_queue (mproc/queue.h), used with mp_conn_send, mp_conn_recv,
 * mp_conn_poll, mp_conn_close, mp_conn_release, mp_queue_put, mp_queue_get,
 * mp_queue_close, mp_queue_qsize, mp_queue_empty, mp_queue_task_done,
 * mp_queue_join, mp_queue_release... with their documented meaning (order,
 * exactly once, timeouts: 0 polls and is MP_ETIMEDOUT when nothing is
 * ready, MP_ECLOSED after close), and besides: every blocking call watches
 * the job and returns MP_ECHILD when a rank failed. What cannot work across
 * ranks fails with MP_ENOTSUP and a sentence saying what to do instead:
 * attaching such a conn or queue to a message (mp_msg_add_conn,
 * mp_msg_add_queue: it cannot travel to a child process or another rank),
 * mp_conn_fileno, mp_queue_fileno and mp_wait (MPI gives no fd to poll).
 * Such objects belong to the rank (and the thread of it, for a conn end)
 * that made them: do not use them in a forked child. */

/* A duplex connection between this rank and peer, as an mp_conn. Both
 * ranks call it, each naming the other, in the same order as their other
 * mp_mpi_pipe calls for that pair. Blocks until the peer has called it
 * (same-host path). Release it with mp_conn_release (it closes this end,
 * then waits for the sends MPI still carries).
 *
 * Its calls: mp_conn_send hands the message to MPI and returns; the conn
 * keeps its tensors until MPI is done with them. Same host: a message with
 * attachments goes over an mproc pipe (tensors as shared-memory handles)
 * and MPI carries a marker after it; bytes alone go over MPI. It blocks
 * (up to timeout) only while the previous message on this conn is still
 * being transferred (one in flight) or the same-host pipe is full, then
 * MP_ETIMEDOUT with nothing sent. MP_ECLOSED once this end closed, or once
 * the peer's close notice arrived (asked every 8th send); MP_ENOTSUP for an
 * attachment that cannot leave its host. mp_conn_recv: FIFO, exactly once;
 * MP_ECLOSED when the peer closed and everything it sent was received;
 * MP_ENOSPC when /dev/shm cannot hold a received tensor (the message is
 * dropped). mp_conn_poll: 1 when a message or the end is ready. One conn
 * end is used by one thread at a time. */
int mp_mpi_pipe(int peer, mp_conn **out);
/* 1 when c (made by mp_mpi_pipe) takes the same-host path, 0 when it goes
 * over MPI; MP_EINVAL for NULL or a conn not made by mp_mpi_pipe. */
int mp_mpi_conn_is_local(const mp_conn *c);

/* An unbounded mproc Queue that lives on rank `home`, as an mp_queue: any
 * rank puts, any rank gets, each message goes to exactly one getter, FIFO
 * per producer. Ranks on the home's host use the real queue (shared
 * memory, as mproc processes do); ranks on other hosts go through a broker
 * thread on the home rank (the one thread this layer starts, only when
 * some rank is on another host), with tensors over MPI. Collective: every
 * rank calls it, queues in the same order everywhere; blocks until every
 * rank has its handle. The LAST mp_queue_release of it is collective too:
 * every rank releases it (it waits for every rank, then stops the broker).
 *
 * Its calls: mp_queue_put from another host returns once the home has
 * queued it; a put waits while the queue's socket buffer is full (as
 * mp_queue_put does): MP_ETIMEDOUT when there is no room in time (timeout 0:
 * within one round trip to the home), and then nothing was put.
 * mp_queue_get: MP_ETIMEDOUT (none in time; timeout 0: none within one
 * round trip to the home), MP_ECLOSED (closed and drained); a get that
 * times out from another host never loses a message. mp_queue_close closes
 * it for every rank. mp_queue_qsize counts at the home (from another host:
 * one round trip) and returns a negative error (MP_ECHILD) instead of a
 * size when the job failed; mp_queue_empty is then true.
 * mp_queue_maxsize is 0 and mp_queue_full false (unbounded). */
int mp_mpi_queue_create(int home, mp_queue **out);
/* The same as a JoinableQueue: the home's queue counts every message put
 * and not yet task_done'd, from any rank. mp_queue_task_done (from another
 * host it waits for the home's answer; MP_ESTATE when called more times
 * than messages were put, over every rank) and mp_queue_join (MP_ETIMEDOUT
 * while messages are outstanding; timeout 0 from another host: within one
 * round trip; MP_ECHILD when a rank failed meanwhile, so no join hangs on
 * a dead rank) work from any rank. Collective. */
int mp_mpi_joinable_queue_create(int home, mp_queue **out);
/* 1 when this rank uses q's real queue (home's host, same-host path on),
 * 0 when it goes over MPI; MP_EINVAL for NULL or another queue. */
int mp_mpi_queue_is_local(const mp_queue *q);
/* Lets this rank's puts to q from another host run ahead of the home's
 * answers: from now on mp_queue_put sends the message and returns without
 * waiting for the home to queue it (one MPI message where a confirmed put
 * takes a round trip), with up to `window` (1 to 1024) such puts not yet
 * confirmed; a put past that waits for the home's confirmations (its
 * timeout applies: MP_ETIMEDOUT, nothing put). The home confirms them in
 * batches of half a window. Order per producer and exactly-once delivery
 * hold; what changes is the put's answer: a put the home refuses after it
 * returned (the queue was closed before the message came) is lost, and
 * this rank's next mp_queue_put or mp_mpi_queue_flush on q returns that
 * error (MP_ECLOSED) saying how many were lost. This rank's other calls on
 * q (get, close, qsize, join, task_done) first wait until its puts are
 * confirmed, so they see them. window 0 (the default) goes back to
 * confirmed puts, after flushing (returns mp_mpi_queue_flush's result).
 * On the home's host puts go straight into the queue: no effect there.
 * Not collective. Errors: MP_EINVAL (NULL, not a queue made by
 * mp_mpi_queue_create, window out of range). */
int mp_mpi_queue_put_ahead(mp_queue *q, int window);
/* Waits until the home confirmed every put of this rank to q
 * (timeout in seconds, < 0 forever, 0: one round trip). 0 (also on the
 * home's host, and with nothing outstanding), MP_ECLOSED (some puts were
 * refused: the sentence says how many), MP_ETIMEDOUT, MP_ECHILD (the job
 * failed), MP_EINVAL. */
int mp_mpi_queue_flush(mp_queue *q, double timeout);

/* ---- a pool over ranks ------------------------------------------------------
 * The mpi4py.futures shape: rank 0 submits, every other rank serves. */

/* Collective. On rank 0: *out is an ordinary mp_pool (mproc/pool.h) whose
 * workers are the other ranks (rank 0 itself runs no task): mp_pool_apply,
 * mp_pool_apply_async, mp_pool_map, mp_pool_map_async, mp_pool_starmap,
 * mp_pool_starmap_async, mp_pool_map_array, mp_pool_map_array_async,
 * mp_pool_imap, mp_pool_imap_unordered, mp_imap_next, mp_async_result_wait,
 * _get, _ready, _successful, _count, _item, _error, _retain, _release,
 * mp_pool_size (the worker ranks), mp_pool_close, mp_pool_join and
 * mp_pool_destroy work on it with their documented meaning. On the other
 * ranks: serves tasks until rank 0 destroys the pool, then returns 0 with
 * *out NULL (or MP_ECHILD when a rank failed). MP_EINVAL with fewer than 2
 * ranks.
 *
 * Tasks are MP_TASK functions (MP_ARRAY_TASK for map_array), registered in
 * every rank; a task's message may carry bytes and tensors. Each item is
 * one task: chunksize is ignored except by map_array (chunks of chunksize
 * items, 0: about four per worker rank; a result's items are then its
 * chunks). Rank 0 hands a task to a worker rank only when that rank is
 * idle, and work moves while rank 0 is inside a pool, result or iterator
 * call (no thread): so callbacks are refused (MP_ENOTSUP; wait on the
 * result instead), and the async map_array writes out only while rank 0
 * waits. A task that returns non-zero or calls mp_raise fails that item
 * only (its sentence: "task on rank N: ..."; the worker serves on); a
 * worker rank that dies fails the job (every call: MP_ECHILD).
 * mp_pool_terminate cannot kill a rank: queued tasks fail with MP_ECLOSED,
 * running ones finish. mp_pool_destroy lets queued and running tasks
 * finish, then stops the workers; results and iterators stay valid. Pool,
 * results and iterators are used from one thread of rank 0. */
int mp_mpi_pool_create(mp_pool **out);

/* ---- collectives ----------------------------------------------------------- */

typedef enum mp_mpi_op { MP_MPI_SUM = 0, MP_MPI_MEAN = 1 } mp_mpi_op;

/* Reduces t over every rank, in place: the sum or the mean (float types)
 * lands in every rank's t. Collective: same dtype and numel everywhere.
 * t must be a contiguous CPU tensor of a float or integer dtype (MEAN:
 * float32 or float64). Blocks; MP_ECHILD when a rank failed. */
int mp_mpi_allreduce_tensor(mp_tensor *t, mp_mpi_op op);
/* Blocks until every rank called it (MP_ECHILD when a rank failed). */
int mp_mpi_barrier(void);

#ifdef __cplusplus
}
#endif
#endif
