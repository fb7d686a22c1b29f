/* The pool over ranks as an mp_pool: the ops tables of src/pool/remote.h
 * over pool.c, pool_iter.c and pool_array.c, so rank 0 calls mp_pool_map,
 * mp_async_result_get, mp_imap_next... on it as on a local pool. */
#include "mpi/pool_mpi.h"
#include "pool/remote.h"

#include <stdlib.h>

/* ---- results ---------------------------------------------------------------- */

static mp_mpi_result *item_of(mp_mpi_result *r, size_t i)
{
    return r->group ? r->items[i] : r;
}

static void r_release(void *r) { mp__mpi_result_release(r); }
static int r_wait(void *r, double timeout, const char *fn)
{
    int rc = mp__mpi_own(fn);
    return rc ? rc : mp__mpi_result_wait(r, timeout, fn);
}
static bool r_ready(void *r) { return mp__mpi_result_ready(r); }
static size_t r_count(void *r) { return mp__mpi_result_count(r); }

static int r_item(void *impl, size_t i, const mp_msg **out, const char *fn)
{
    mp_mpi_result *r = impl, *it = item_of(r, i);
    *out = NULL;
    if (it->rc && r->group)
        return mp__error(it->rc, "%s: %s %zu: %s", fn, r->arr ? "chunk" : "item", i, it->error);
    if (it->rc)
        return mp__error(it->rc, "%s: %s", fn, it->error);
    if (!r->arr) /* a map_array chunk's bytes are in the caller's out */
        *out = it->out;
    return 0;
}

static mp_msg *r_take(void *impl, size_t i)
{
    mp_mpi_result *it = item_of(impl, i);
    mp_msg *m = it->out;
    it->out = NULL;
    return m;
}

static size_t r_first_bad(void *impl)
{
    mp_mpi_result *r = impl;
    size_t n = mp__mpi_result_count(r);
    for (size_t i = 0; i < n; i++)
        if (item_of(r, i)->rc)
            return i;
    return n;
}

static const char *r_error(void *impl, size_t i) { return item_of(impl, i)->error; }

static const mp__result_ops result_ops = {r_release, r_wait,      r_ready, r_count,
                                          r_item,    r_take, r_first_bad, r_error};

static int i_next(void *it, double timeout, mp_msg **out, size_t *index)
{
    int rc = mp__mpi_own("mp_imap_next");
    return rc ? rc : mp__mpi_imap_next(it, timeout, out, index);
}
static void i_destroy(void *it) { mp__mpi_imap_destroy(it); }

static const mp__imap_ops imap_ops = {i_next, i_destroy};

/* ---- the pool --------------------------------------------------------------------- */

static int p_size(void *p) { return ((mp_mpi_pool *)p)->nworkers; }

static int p_close(void *p, const char *fn)
{
    (void)fn;
    ((mp_mpi_pool *)p)->closed = true;
    return 0;
}

/* A worker rank cannot be killed without ending the MPI job: the tasks it
 * runs finish, the ones still queued fail with MP_ECLOSED. */
static int p_terminate(void *p, const char *fn)
{
    (void)fn;
    ((mp_mpi_pool *)p)->closed = true;
    mp__mpi_pool_drop_queued(p, "the pool was terminated");
    return 0;
}

static int p_join(void *p, const char *fn)
{
    int rc = mp__mpi_own(fn);
    if (rc)
        return rc;
    if (!((mp_mpi_pool *)p)->closed)
        return mp__error(MP_ESTATE, "%s: call mp_pool_close or mp_pool_terminate first", fn);
    return mp__mpi_pool_drain(p);
}

static void p_destroy(void *p)
{
    if (!mp__mpi_forked()) /* forked: no MPI here, the memory goes with it */
        mp__mpi_pool_destroy(p);
}

static int p_submit(void *impl, const char *task, const mp_msg *const *in, size_t n,
                    size_t nargs, bool one, void **res, const char *fn)
{
    mp_mpi_result **r = (mp_mpi_result **)res;
    int rc = mp__mpi_own(fn);
    if (rc)
        return rc;
    if (one)
        return mp__mpi_pool_apply_async(impl, task, in[0], r, fn);
    return mp__mpi_pool_group(impl, task, in, n, nargs, r, fn);
}

static int p_map_array(void *impl, const char *task, const void *in, size_t n, size_t in_size,
                       void *out, size_t out_size, size_t chunksize, void **res, const char *fn)
{
    int rc = mp__mpi_own(fn);
    if (rc)
        return rc;
    return mp__mpi_pool_map_array(impl, task, in, n, in_size, out, out_size, chunksize,
                                  (mp_mpi_result **)res, fn);
}

static int p_imap(void *impl, const char *task, const mp_msg *const *in, size_t n,
                  bool unordered, void **it, const char *fn)
{
    int rc = mp__mpi_own(fn);
    if (rc)
        return rc;
    return mp__mpi_pool_imap(impl, task, in, n, !unordered, (mp_mpi_imap **)it, fn);
}

static const mp__pool_ops pool_ops = {
    "a pool over MPI ranks (mp_mpi_pool_create)", &result_ops, &imap_ops, p_size, p_close,
    p_terminate, p_join, p_destroy, p_submit, p_map_array, p_imap};

int mp_mpi_pool_create(mp_pool **out)
{
    mp_mpi_pool *p = NULL;
    if (out)
        *out = NULL;
    int rc = mp__mpi_pool_create(out ? &p : NULL);
    if (rc == 0 && p && (rc = mp__pool_wrap(&pool_ops, p, out)) != 0)
        mp__mpi_pool_destroy(p);
    return rc;
}
