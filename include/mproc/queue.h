/* mproc — Pipe/Connection, SimpleQueue, Queue and JoinableQueue.
 *
 * Every pipe and queue is an AF_UNIX SOCK_SEQPACKET socket pair: one message
 * is one kernel record with its fds, so any number of producers and
 * consumers in any processes share one queue, and each message is delivered
 * whole, exactly once, to one consumer, FIFO per producer. Tensors travel as
 * handles to shared memory (see mproc/msg.h). A message put by a producer
 * that exits or is killed afterwards is still delivered: its fds are held
 * by the kernel while it is queued.
 *
 * No call starts a thread, so every object here is fork-safe: after fork
 * the child may use the objects it inherited. Queues and connections can
 * also travel to other processes as message attachments (mp_msg_add_queue,
 * ...), which is how children started by spawn or forkserver get them.
 *
 * Timeouts are in seconds and mean the same in every mproc call: a
 * negative timeout waits forever, 0 polls (tries once), a positive one
 * waits that long; not ready in time, 0 included, is MP_ETIMEDOUT. The
 * _nowait calls are the timeout-0 calls. (mp_conn_poll, a query, returns
 * 0 instead.) A NaN timeout is MP_EINVAL, refused before the call acts.
 * A signal handler that runs during a wait does not end it: the call
 * waits on until its deadline (docs/errors.md, "Signals").
 *
 * Queues and connections are refcounted: _create returns one reference,
 * _retain adds one, _release drops one (NULL is a no-op) and frees the
 * process's handle with the last. Calls on one object may come from several
 * threads, except where a function says otherwise.
 *
 * To wait on several pipes, queues and processes at once, or to watch them
 * from your own poll/epoll loop, see mproc/wait.h (mp_wait, the _fileno
 * calls).
 *
 * Receiving fds can hit the open-files limit: then the receiving call fails
 * with MP_EMFILE, names the limit and the two fixes (raise it, or use the
 * file_system strategy), and the message stays queued, whole.
 */
#ifndef MPROC_QUEUE_H
#define MPROC_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mproc/error.h"
#include "mproc/msg.h"
#include "mproc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Pipe / Connection --------------------------------------------------- */

typedef struct mp_conn mp_conn;

/* Creates a connected pair. duplex: both ends send and receive; otherwise
 * *a only receives and *b only sends (Python's `r, w = Pipe(False)`).
 * Errors: MP_EINVAL, MP_EMFILE, MP_ENOMEM. */
MP_API int mp_pipe(bool duplex, mp_conn **a, mp_conn **b);
MP_API mp_conn *mp_conn_retain(mp_conn *c);
MP_API void mp_conn_release(mp_conn *c);

/* Sends m (not consumed; the caller still owns it). Blocks while the socket
 * buffer is full, up to timeout. Errors: MP_EINVAL, MP_ESTATE (receive-only
 * end), MP_ECLOSED (this end closed, or the peer is gone: at once when
 * its last reader closed, within 64 small messages when it exited without
 * closing; docs/messaging.md), MP_ETIMEDOUT
 * (no room in time), MP_ENOSPC/MP_EMFILE (sharing a private tensor),
 * MP_ETOOMANYREFS (the kernel's limit on fds in flight; nothing was sent). */
MP_API int mp_conn_send(mp_conn *c, const mp_msg *m, double timeout);
/* Receives one message into *out (caller owns it). Several threads or
 * processes may receive on one end: they take turns through the end's
 * robust reader lock (so each message goes to exactly one of them; timeout
 * covers the wait for the lock). Errors:
 * MP_ECLOSED (peer closed: every end in every process), MP_ETIMEDOUT
 * (nothing in time), MP_EPROTO (malformed message, dropped), MP_EMFILE
 * (message kept). */
MP_API int mp_conn_recv(mp_conn *c, mp_msg **out, double timeout);
/* Sends len bytes as a message without attachments (any length: large
 * payloads spill into shared memory). */
MP_API int mp_conn_send_bytes(mp_conn *c, const void *buf, size_t len, double timeout);
/* Receives a message's bytes into a malloc'd *out (free() it; NULL when
 * *len is 0). A message with attachments fails with MP_EPROTO and is dropped. */
MP_API int mp_conn_recv_bytes(mp_conn *c, void **out, size_t *len, double timeout);
/* 1 when a message (or EOF) is ready to receive, 0 when the timeout passed. */
MP_API int mp_conn_poll(mp_conn *c, double timeout);
/* Closes this handle's socket; later calls on it fail with MP_ECLOSED. The
 * peer sees EOF once every copy of this end (in every process) is closed. */
MP_API int mp_conn_close(mp_conn *c);

/* ---- SimpleQueue ----------------------------------------------------------- */

typedef struct mp_simple_queue mp_simple_queue;

/* Creates a SimpleQueue (one reference); retain adds a reference, release
 * drops one and the last closes it (NULL is a no-op). MP_EMFILE, MP_ESYS. */
MP_API int mp_simple_queue_create(mp_simple_queue **out);
MP_API mp_simple_queue *mp_simple_queue_retain(mp_simple_queue *q);
MP_API void mp_simple_queue_release(mp_simple_queue *q);
/* Blocks while the socket buffer is full (about 200 KiB of records). */
MP_API int mp_simple_queue_put(mp_simple_queue *q, const mp_msg *m);
/* Blocks until a message arrives; MP_ECLOSED once closed and drained. */
MP_API int mp_simple_queue_get(mp_simple_queue *q, mp_msg **out);
MP_API bool mp_simple_queue_empty(mp_simple_queue *q);
/* Closes the queue for every process: puts fail with MP_ECLOSED; gets
 * drain what is queued, then fail with MP_ECLOSED. Idempotent. */
MP_API int mp_simple_queue_close(mp_simple_queue *q);

/* ---- Queue and JoinableQueue ------------------------------------------------ */

typedef struct mp_queue mp_queue;

/* maxsize <= 0: unbounded (puts still block while the ring, 512 messages,
 * or the kernel's socket buffer is full, since no thread buffers them). */
MP_API int mp_queue_create(int64_t maxsize, mp_queue **out);
/* A queue whose consumers call mp_queue_task_done, so mp_queue_join can wait
 * until every message put has been processed. */
MP_API int mp_joinable_queue_create(int64_t maxsize, mp_queue **out);
MP_API mp_queue *mp_queue_retain(mp_queue *q);
MP_API void mp_queue_release(mp_queue *q);

/* Puts m (not consumed). Blocks while the queue holds maxsize messages or
 * the socket buffer is full. Errors: MP_ECLOSED (closed), MP_ETIMEDOUT
 * (still full in time; put_nowait: full now), MP_EINVAL, sharing errors,
 * MP_ETOOMANYREFS (the kernel's limit on fds in flight; nothing was put). */
MP_API int mp_queue_put(mp_queue *q, const mp_msg *m, double timeout);
MP_API int mp_queue_put_nowait(mp_queue *q, const mp_msg *m);
/* Takes the oldest message. Errors: MP_ECLOSED (closed and drained),
 * MP_ETIMEDOUT (still empty in time; get_nowait: empty now), MP_EMFILE (kept queued),
 * MP_EPROTO (a malformed message, dropped). */
MP_API int mp_queue_get(mp_queue *q, mp_msg **out, double timeout);
MP_API int mp_queue_get_nowait(mp_queue *q, mp_msg **out);
/* Approximate: counts messages put and not yet taken, across processes;
 * a producer killed between counting and sending leaves it one too high. */
MP_API int64_t mp_queue_qsize(mp_queue *q);
MP_API bool mp_queue_empty(mp_queue *q);
MP_API bool mp_queue_full(mp_queue *q);
MP_API int64_t mp_queue_maxsize(mp_queue *q);
/* As mp_simple_queue_close. Also wakes producers blocked on maxsize. */
MP_API int mp_queue_close(mp_queue *q);
MP_API bool mp_queue_is_joinable(mp_queue *q);
/* JoinableQueue: marks one message taken by get as processed. MP_ESTATE
 * when called more times than messages were put, or on a plain Queue. */
MP_API int mp_queue_task_done(mp_queue *q);
/* JoinableQueue: waits until every message put has been task_done'd.
 * Errors: MP_ETIMEDOUT (messages still outstanding in time, 0
 * included), MP_ESTATE on a plain Queue. */
MP_API int mp_queue_join(mp_queue *q, double timeout);

/* Convenience: a message carrying one tensor, or a state_dict. */
MP_API int mp_queue_put_tensor(mp_queue *q, mp_tensor *t, double timeout);
/* MP_EPROTO when the message is not exactly one tensor (it is dropped). */
MP_API int mp_queue_get_tensor(mp_queue *q, mp_tensor **out, double timeout);
MP_API int mp_queue_put_state_dict(mp_queue *q, size_t n, const char *const *names,
                                   mp_tensor *const *tensors, double timeout);
/* The state_dict as a message of named tensors (mp_msg_find_tensor). */
MP_API int mp_queue_get_state_dict(mp_queue *q, mp_msg **out, double timeout);

/* ---- as message attachments (retained by the message) ----------------------
 * A queue or conn between MPI ranks (mproc/mpi.h) cannot travel in a
 * message: adding one fails with MP_ENOTSUP. */
MP_API int mp_msg_add_queue(mp_msg *m, const char *name, mp_queue *q);
/* New reference; MP_EINVAL if attachment index is not a (joinable) queue. */
MP_API int mp_msg_get_queue(const mp_msg *m, size_t index, mp_queue **out);
MP_API int mp_msg_add_simple_queue(mp_msg *m, const char *name, mp_simple_queue *q);
MP_API int mp_msg_get_simple_queue(const mp_msg *m, size_t index, mp_simple_queue **out);
MP_API int mp_msg_add_conn(mp_msg *m, const char *name, mp_conn *c);
MP_API int mp_msg_get_conn(const mp_msg *m, size_t index, mp_conn **out);

#ifdef __cplusplus
}
#endif
#endif
