/* mproc — a pool of worker processes (Python's multiprocessing.Pool).
 *
 * Tasks are functions registered by name with MP_TASK, so a worker started
 * by spawn or the forkserver finds them. A task takes a message and fills
 * one in; tensors attached travel zero-copy both ways.
 *
 *   MP_TASK(square) {
 *       int64_t x; memcpy(&x, mp_msg_payload(in, NULL), 8); x *= x;
 *       return mp_msg_set_payload(out, &x, 8);
 *   }
 *
 * Threads: the pool starts one thread in the calling process, the
 * result-handler thread. It hands chunks of work to idle workers, collects
 * results, notices dead workers and starts their replacements, and runs
 * every callback, one at a time, in the order the results completed. A
 * callback must not block on the pool (no mp_pool_join, no blocking get of
 * another result): the handler would wait on itself.
 *
 * Scheduling: the parent hands chunks to each worker, several at a time
 * (pipelined: a worker finds its next chunk waiting when it answers one;
 * how many depends on how long its chunks take: one when they take longer
 * than about 50 us, so long tasks spread over the workers), and a worker
 * reads a chunk only after answering the one before, so the parent always
 * knows which task a worker was running. A worker that dies (any signal,
 * any exit) fails exactly the items of that chunk with an error naming the
 * signal or status; the chunks it had not read yet run on other workers; it
 * is replaced and the pool keeps serving. A task that calls mp_raise, or
 * returns non-zero, fails that item only; the worker carries on. So does a
 * result that cannot be sent back (a tensor that cannot be moved to shared
 * memory, a device tensor): that item fails with the send's error code and
 * a sentence naming the cause, the other items of its chunk arrive.
 *
 * Chunks: map-like calls cut their n items into chunks of `chunksize`; 0
 * picks Python's rule, chunksize = ceil(n / (4 * nprocs)) (at least 1), so
 * each worker gets about four chunks. A chunk is one record to a worker and
 * one back; items of a chunk run one after the other in one worker.
 *
 * Lifecycle (as Python's): close() stops new submissions and lets the queued
 * work finish; terminate() stops the workers at once, failing unfinished
 * work with MP_ECLOSED; join() waits for the workers to exit and needs
 * close() or terminate() first (MP_ESTATE otherwise). destroy() terminates
 * if needed, joins and frees; results and iterators stay valid after it.
 */
#ifndef MPROC_POOL_H
#define MPROC_POOL_H

#include <stdbool.h>
#include <stddef.h>

#include "mproc/error.h"
#include "mproc/msg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_pool mp_pool;
typedef struct mp_async_result mp_async_result;
typedef struct mp_imap mp_imap;

/* A task: reads `in`, writes its result into `out` (an empty message the
 * runtime owns). 0 on success; non-zero fails the item (a negative mp_error
 * is passed on as such, anything else as MP_ECHILD). */
typedef int (*mp_task_fn)(const mp_msg *in, mp_msg *out);

/* Registers fn under name (1..MP_ENTRY_NAME_MAX bytes) in the registry
 * entries use (mproc/process.h: one capacity, MP_REGISTRY_MAX, for both).
 * MP_EINVAL on a duplicate or bad name, MP_EOVERFLOW when full. */
MP_API int mp_register_task(const char *name, mp_task_fn fn);
/* What MP_TASK calls from its constructor; a failure is kept and reported
 * as for mp_register_entry_at_load. */
MP_API void mp_register_task_at_load(const char *name, mp_task_fn fn);

/* Defines and registers a task called NAME:
 *   MP_TASK(square) { ... use in, fill out ...; return 0; } */
#define MP_TASK(NAME)                                                           \
    static int NAME(const mp_msg *in, mp_msg *out);                             \
    __attribute__((constructor)) static void mp__register_task_##NAME(void)     \
    {                                                                           \
        mp_register_task_at_load(#NAME, NAME);                                  \
    }                                                                           \
    static int NAME(const mp_msg *in, mp_msg *out)

/* An array task: runs once over a slice of n items, in[0..n) to out[0..n),
 * whose item types it knows. 0 on success; non-zero (or mp_raise) fails
 * every item of the slice. Used by mp_pool_map_array only. */
typedef int (*mp_array_task_fn)(const void *in, void *out, size_t n);

/* Registers an array task, as mp_register_task: the same registry, and one
 * name space with tasks (a name is a task or an array task, not both). */
MP_API int mp_register_array_task(const char *name, mp_array_task_fn fn);
/* What MP_ARRAY_TASK calls from its constructor; a failure is kept and
 * reported as for mp_register_task_at_load. */
MP_API void mp_register_array_task_at_load(const char *name, mp_array_task_fn fn);

/* Defines and registers an array task called NAME:
 *   MP_ARRAY_TASK(squares) { const int64_t *x = in; int64_t *y = out;
 *                            for (size_t i = 0; i < n; i++) y[i] = x[i] * x[i];
 *                            return 0; } */
#define MP_ARRAY_TASK(NAME)                                                     \
    static int NAME(const void *in, void *out, size_t n);                       \
    __attribute__((constructor)) static void mp__register_array_task_##NAME(void) \
    {                                                                           \
        mp_register_array_task_at_load(#NAME, NAME);                            \
    }                                                                           \
    static int NAME(const void *in, void *out, size_t n)

/* Extensible (docs/api-stability.md): size first, set by _init. */
typedef struct mp_pool_options {
    size_t size;               /* sizeof(mp_pool_options), set by _init */
    const char *start_method;  /* "fork", "spawn", "forkserver"; NULL: the default */
    const char *initializer;   /* MP_ENTRY run in each worker first, or NULL; its
                                * rank is the worker's index 0..nprocs-1, and a
                                * replacement worker gets the index of the one
                                * it replaces */
    const mp_msg *initargs;    /* its argument message (copied), or NULL */
    unsigned maxtasksperchild; /* replace a worker after this many chunks; 0: never */
} mp_pool_options;

/* Fills defaults: default start method, no initializer, no limit. */
MP_API void mp_pool_options_init(mp_pool_options *o);

/* (mp_mpi_pool_create, mproc/mpi.h, makes an mp_pool whose workers are MPI
 * ranks; the calls below work on it too, see that header.)
 *
 * Starts nprocs workers (0: the number of online CPUs) and the handler
 * thread. opts may be NULL (defaults). Blocks until the workers run.
 * MP_EINVAL, MP_ENOENT (unknown start method or initializer), MP_ESTATE
 * (spawn or forkserver before mp_setup; SIGCHLD ignored), MP_ENOMEM,
 * MP_EMFILE, MP_ECHILD (a worker failed to start), MP_ESYS. */
MP_API int mp_pool_create(int nprocs, const mp_pool_options *opts, mp_pool **out);
/* Terminates unless closed, joins, frees. NULL is a no-op. Blocks. */
MP_API void mp_pool_destroy(mp_pool *p);
/* No more submissions (MP_ESTATE after); queued work still runs. */
MP_API int mp_pool_close(mp_pool *p);
/* Kills the workers now; unfinished results fail with MP_ECLOSED. */
MP_API int mp_pool_terminate(mp_pool *p);
/* Waits until every worker has exited (after close: once all work is done).
 * MP_ESTATE unless closed or terminated first. Must not be called from a
 * callback. */
MP_API int mp_pool_join(mp_pool *p);
/* Number of worker processes. */
MP_API int mp_pool_size(const mp_pool *p);

/* ---- results ---------------------------------------------------------- */

/* Called on the handler thread when a result completes: on_success when
 * every item succeeded, else on_error. user is passed through. The result
 * is borrowed for the call (retain it to keep it). */
typedef void (*mp_result_fn)(mp_async_result *r, void *user);
typedef struct mp_pool_callbacks {
    size_t size; /* sizeof(mp_pool_callbacks): set it, e.g. {.size = sizeof cb, ...} */
    mp_result_fn on_success;
    mp_result_fn on_error;
    void *user;
} mp_pool_callbacks;

/* Results are refcounted and thread-safe: any thread may wait on or read
 * one; the pool holds its own reference while it works. retain adds a
 * reference; release drops one (the last frees the result and its
 * messages). NULL is a no-op for both. */
MP_API mp_async_result *mp_async_result_retain(mp_async_result *r);
MP_API void mp_async_result_release(mp_async_result *r);
/* Blocks until ready: 0, or MP_ETIMEDOUT. */
MP_API int mp_async_result_wait(mp_async_result *r, double timeout);
/* Blocks until ready, then: 0 and (out may be NULL) a borrowed pointer to
 * the first item's result, valid while r lives; or the error of the first
 * failed item (MP_ECHILD for a dead worker or mp_raise, the task's own code,
 * MP_ECLOSED after terminate), with mp_last_error() set to its sentence.
 * MP_ETIMEDOUT when not ready in time. *out is NULL on every failure. */
MP_API int mp_async_result_get(mp_async_result *r, double timeout, const mp_msg **out);
/* Whether the result is ready (false for NULL). */
MP_API bool mp_async_result_ready(const mp_async_result *r);
/* 1 when ready and every item succeeded, 0 when ready and some failed,
 * MP_ESTATE when not ready yet. */
MP_API int mp_async_result_successful(const mp_async_result *r);
/* Items in the result (1 for apply). */
MP_API size_t mp_async_result_count(const mp_async_result *r);
/* Borrowed result of item i once ready: 0, MP_ESTATE (not ready), MP_EINVAL
 * (i out of range), or the item's own error (mp_last_error says why); *out
 * is NULL on failure. */
MP_API int mp_async_result_item(const mp_async_result *r, size_t i, const mp_msg **out);
/* The sentence of the first failed item, "" when none. */
MP_API const char *mp_async_result_error(const mp_async_result *r);

/* ---- submitting ------------------------------------------------------- *
 * Inputs are copied at submission (the caller may destroy them at once);
 * attached tensors and objects are retained until sent. cb may be NULL.
 * Common errors: MP_EINVAL, MP_ENOENT (task not registered in this
 * process), MP_ESTATE (closed or terminated), MP_EOVERFLOW (the item
 * count times nargs or the item sizes overflow a size_t), MP_ENOMEM. The
 * sentence names the call made (mp_pool_map, not mp_pool_map_async). */

/* Runs task on one worker and waits: *out is a new message (destroy it). */
MP_API int mp_pool_apply(mp_pool *p, const char *task, const mp_msg *in, mp_msg **out);
MP_API int mp_pool_apply_async(mp_pool *p, const char *task, const mp_msg *in,
                               const mp_pool_callbacks *cb, mp_async_result **res);

/* Runs task over in[0..n-1]; out[i] gets a new message per item (destroy
 * each). On failure returns the first failed item's error and sets no out.
 * chunksize 0: the default rule (file comment). */
MP_API int mp_pool_map(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                       size_t chunksize, mp_msg **out);
MP_API int mp_pool_map_async(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                             size_t chunksize, const mp_pool_callbacks *cb, mp_async_result **res);

/* Like map, but item i has nargs argument messages args[i*nargs ..
 * i*nargs+nargs-1]; the task receives them packed in one message and
 * unpacks them with mp_task_nargs / mp_task_arg (Python's f(*args)). */
MP_API int mp_pool_starmap(mp_pool *p, const char *task, const mp_msg *const *args, size_t n,
                           size_t nargs, size_t chunksize, mp_msg **out);
MP_API int mp_pool_starmap_async(mp_pool *p, const char *task, const mp_msg *const *args, size_t n,
                                 size_t nargs, size_t chunksize, const mp_pool_callbacks *cb,
                                 mp_async_result **res);
/* In a starmap task: the number of arguments, and a new message holding
 * argument j (destroy it). MP_EINVAL when `in` is not a starmap item or j
 * is out of range. */
MP_API int mp_task_nargs(const mp_msg *in);
MP_API int mp_task_arg(const mp_msg *in, size_t j, mp_msg **out);

/* The typed fast path: n fixed-size items of in_size bytes at `in`; the
 * task sees each as a message whose payload is the item and must set an
 * out payload of exactly out_size bytes, written to out + i * out_size.
 * No per-item message crosses the wire: a chunk is one record each way.
 * With an array task (MP_ARRAY_TASK) nothing per item is built at all: the
 * input is copied once into shared memory, each chunk is one call of the
 * task over its slice there, and the handler copies each finished slice to
 * `out` (memory speed); a failing call fails the items of its chunk.
 * The async form writes `out` from the handler thread: keep it alive and
 * untouched until the result is ready. */
MP_API int mp_pool_map_array(mp_pool *p, const char *task, const void *in, size_t n, size_t in_size,
                             void *out, size_t out_size, size_t chunksize);
MP_API int mp_pool_map_array_async(mp_pool *p, const char *task, const void *in, size_t n,
                                   size_t in_size, void *out, size_t out_size, size_t chunksize,
                                   const mp_pool_callbacks *cb, mp_async_result **res);

/* Lazy results: imap yields items in input order as each becomes
 * available; imap_unordered in completion order. Errors as map_async. An
 * iterator is used by one thread at a time. */
MP_API int mp_pool_imap(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                        size_t chunksize, mp_imap **it);
MP_API int mp_pool_imap_unordered(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                                  size_t chunksize, mp_imap **it);
/* Next result: 0 with *out a new message (destroy it) and *index (may be
 * NULL) its input index; the item's error (the iteration goes on after
 * it); MP_ETIMEDOUT; MP_ECLOSED when every item was returned. */
MP_API int mp_imap_next(mp_imap *it, double timeout, mp_msg **out, size_t *index);
/* NULL is a no-op; unfinished items are still computed, then dropped. */
MP_API void mp_imap_destroy(mp_imap *it);

#ifdef __cplusplus
}
#endif
#endif
