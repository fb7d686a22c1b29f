/* Pools whose workers are not this host's processes: a higher layer (the
 * MPI layer) makes an mp_pool whose calls go through an ops table it fills,
 * so its users call mp_pool_map, mp_async_result_get, mp_imap_next... as on
 * a local pool. The pool layer never names that layer. A local pool,
 * result or iterator has no table (ops NULL): one predictable branch. */
#ifndef MPROC_POOL_REMOTE_H
#define MPROC_POOL_REMOTE_H

#include <stdbool.h>
#include <stddef.h>

#include "mproc/pool.h"

/* A result's calls. Waiting may move the pool's work (no handler thread);
 * the others only look. item, first_bad and take are asked of a ready
 * result only. */
typedef struct mp__result_ops {
    void (*release)(void *r);
    /* 0 once ready, or MP_ETIMEDOUT / MP_ECHILD with the sentence set. */
    int (*wait)(void *r, double timeout, const char *fn);
    bool (*ready)(void *r);
    size_t (*count)(void *r);
    /* Item i: 0 and *out borrowed (NULL for map_array chunks), or its
     * error with the sentence "fn: [item i: ]why". */
    int (*item)(void *r, size_t i, const mp_msg **out, const char *fn);
    /* Item i's message handed over (the result no longer holds it). */
    mp_msg *(*take)(void *r, size_t i);
    /* The first failed item, or count when none; its sentence. */
    size_t (*first_bad)(void *r);
    const char *(*error)(void *r, size_t i);
} mp__result_ops;

typedef struct mp__imap_ops {
    int (*next)(void *it, double timeout, mp_msg **out, size_t *index);
    void (*destroy)(void *it);
} mp__imap_ops;

/* A pool's calls; fn names the public call for sentences. A submission
 * fills *res (a result of ops->result) or *it (of ops->imap). */
typedef struct mp__pool_ops {
    const char *what; /* "a pool over MPI ranks (mp_mpi_pool_create)" */
    const mp__result_ops *result;
    const mp__imap_ops *iter;
    int (*size)(void *impl);
    int (*close)(void *impl, const char *fn);
    int (*terminate)(void *impl, const char *fn);
    int (*join)(void *impl, const char *fn);
    void (*destroy)(void *impl);
    /* apply (one: a result of one item), map (nargs 0) or starmap. */
    int (*submit)(void *impl, const char *task, const mp_msg *const *in, size_t n,
                  size_t nargs, bool one, void **res, const char *fn);
    int (*map_array)(void *impl, const char *task, const void *in, size_t n, size_t in_size,
                     void *out, size_t out_size, size_t chunksize, void **res, const char *fn);
    int (*imap)(void *impl, const char *task, const mp_msg *const *in, size_t n,
                bool unordered, void **it, const char *fn);
} mp__pool_ops;

/* A pool served by ops over impl; mp_pool_destroy calls ops->destroy. */
int mp__pool_wrap(const mp__pool_ops *ops, void *impl, mp_pool **out);

/* The pool layer's side of a served pool (remote.c), called by the public
 * calls when p->ops (r->ops, it->ops) is set. */
int mp__remote_submit(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                      size_t nargs, bool one, const mp_pool_callbacks *cb,
                      mp_async_result **res, const char *fn);
int mp__remote_map_array(mp_pool *p, const char *task, const void *in, size_t n,
                         size_t in_size, void *out, size_t out_size, size_t chunksize,
                         const mp_pool_callbacks *cb, mp_async_result **res, const char *fn);
int mp__remote_imap(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                    bool unordered, mp_imap **it, const char *fn);
int mp__remote_get(mp_async_result *r, double timeout, const mp_msg **out, const char *fn);
int mp__remote_successful(const mp_async_result *r);
int mp__remote_item(const mp_async_result *r, size_t i, const mp_msg **out);
const char *mp__remote_error(const mp_async_result *r);
/* Waits for r, hands its messages to out (may be NULL), releases r. */
int mp__remote_finish(mp_async_result *r, mp_msg **out, const char *fn);
int mp__remote_imap_next(mp_imap *it, double timeout, mp_msg **out, size_t *index);
void mp__remote_imap_destroy(mp_imap *it);

#endif
