/* The pool over ranks' state (mp_mpi_pool_create serves it to rank 0 as an
 * mp_pool), shared by pool.c (workers, tasks), pool_iter.c (map_async and
 * starmap results, imap iterators), pool_array.c (map_array) and
 * pool_ops.c (the ops tables of src/pool/remote.h). */
#ifndef MPROC_MPI_POOL_H
#define MPROC_MPI_POOL_H

#include "mpi/mpi_internal.h"

typedef struct mp_mpi_pool mp_mpi_pool;
typedef struct mp_mpi_result mp_mpi_result;
typedef struct mp_mpi_imap mp_mpi_imap;

struct mp_mpi_result {
    int refs;           /* the caller's, the pool's while pending, an imap's */
    bool ready;
    int rc;
    mp_msg *in;         /* the task message, until sent */
    mp_msg *out;
    char error[MP__MPI_TEXT_MAX + 64]; /* "task on rank N: " + the text */
    uint64_t id;
    mp_mpi_pool *pool;   /* whose work a wait moves (never touched once ready) */
    mp_mpi_result *next; /* pool's pending list */
    /* A group (map_async, starmap_async): n item results, no task itself. */
    bool group;
    size_t n;
    mp_mpi_result **items;
    size_t cursor;      /* items before it are known ready */
    struct mp__mpi_array *arr; /* a map_array group: where its chunks land */
    /* An imap_unordered waiting for this item, told when it finishes. */
    mp_mpi_imap *it;
    size_t index;
};

struct mp_mpi_pool {
    int nworkers;
    mp_mpi_conn **conn;     /* [rank - 1] */
    mp_mpi_result **busy;   /* [rank - 1]: the task that worker runs, or NULL */
    mp_mpi_result *queue, *tail;
    uint64_t next_id;
    bool closed;            /* mp_pool_close or _terminate: no more submissions */
    mp_tensor *cache_in, *cache_out; /* map_array's shared arrays, kept */
};

/* Moves p's work (rank 0) until ready(arg) holds: 0, MP_ETIMEDOUT (with
 * "fn: what" for a poll, "fn: timed out" else), or MP_ECHILD. ready is
 * asked first, so nothing touches p when it already holds (an iterator or
 * result outliving its pool). */
int mp__mpi_pool_wait(mp_mpi_pool *p, bool (*ready)(void *), void *arg, double timeout,
                      const char *fn, const char *what);
/* Whether r (a task or a group) is ready. */
bool mp__mpi_result_ready(mp_mpi_result *r);
/* A group's get: its first failed item's error, else 0 and item 0's message. */
int mp__mpi_group_get(mp_mpi_result *r, mp_msg **out);
/* Drops a group's items (its last reference is going). */
void mp__mpi_group_free(mp_mpi_result *r);
/* map_array's chunks travel as tasks whose name starts with one of these
 * bytes (no registered name does): an array task over the chunk's slice,
 * or an ordinary task run once per item of it. */
#define MP__MPI_ARRAY_KIND '\1'
#define MP__MPI_ITEMS_KIND '\2'
/* Queues the task message in under the wire name (not looked up). */
int mp__mpi_pool_submit(mp_mpi_pool *p, const char *name, const mp_msg *in,
                        mp_mpi_result **res, const char *fn);
/* Worker side: call(ctx) with mp_raise caught: its code (an mp_raise is
 * MP_ECHILD; positive and unknown codes too) and, on failure, err. */
int mp__mpi_run_caught(int (*call)(void *), void *ctx, char *err, size_t cap);
/* Worker side: one map_array chunk (name starts with a kind byte). */
int mp__mpi_array_run(const char *name, const mp_msg *in, mp_msg *out, char *err, size_t cap);
/* Rank 0: copies a finished map_array chunk into the caller's out (or
 * fails the chunk when its answer does not fit); frees the group's arr. */
void mp__mpi_array_land(mp_mpi_result *g, size_t i);
void mp__mpi_array_free(mp_mpi_result *g);

/* Called when an item an unordered iterator waits for finishes. */
void mp__mpi_imap_done(mp_mpi_imap *it, size_t index);

/* The calls behind the ops tables (pool_ops.c). fn names the public call.
 * On rank 0: *out the pool; elsewhere: serves until rank 0 destroys it. */
int mp__mpi_pool_create(mp_mpi_pool **out);
int mp__mpi_pool_apply_async(mp_mpi_pool *p, const char *task, const mp_msg *in,
                             mp_mpi_result **res, const char *fn);
/* Moves p's work until every queued and running task is done. */
int mp__mpi_pool_drain(mp_mpi_pool *p);
/* Fails the queued tasks no worker took yet with MP_ECLOSED and why. */
void mp__mpi_pool_drop_queued(mp_mpi_pool *p, const char *why);
void mp__mpi_pool_destroy(mp_mpi_pool *p);
int mp__mpi_result_wait(mp_mpi_result *r, double timeout, const char *fn);
void mp__mpi_result_release(mp_mpi_result *r);
size_t mp__mpi_result_count(const mp_mpi_result *r);
int mp__mpi_pool_group(mp_mpi_pool *p, const char *task, const mp_msg *const *in, size_t n,
                       size_t nargs, mp_mpi_result **res, const char *fn);
int mp__mpi_pool_imap(mp_mpi_pool *p, const char *task, const mp_msg *const *in, size_t n,
                      bool ordered, mp_mpi_imap **out, const char *fn);
int mp__mpi_imap_next(mp_mpi_imap *it, double timeout, mp_msg **out, size_t *index);
void mp__mpi_imap_destroy(mp_mpi_imap *it);
/* res NULL: the blocking form (which reuses the pool's shared arrays). */
int mp__mpi_pool_map_array(mp_mpi_pool *p, const char *task, const void *in, size_t n,
                           size_t in_size, void *out, size_t out_size, size_t chunksize,
                           mp_mpi_result **res, const char *fn);

#endif
