/* The pool layer's side of a pool served by an ops table (src/pool/remote.h):
 * shells for the pool, its results and iterators, and the result calls in
 * terms of the table, with the meaning the local ones document. */
#include <stdlib.h>

#include "pool/pool_internal.h"

int mp__pool_wrap(const mp__pool_ops *ops, void *impl, mp_pool **out)
{
    mp_pool *p = calloc(1, sizeof *p);
    if (!p)
        return mp__error(MP_ENOMEM, "mp_pool: out of memory");
    p->ops = ops;
    p->impl = impl;
    p->wake_fd = -1;
    *out = p;
    return 0;
}

/* Callbacks run on the local pool's handler thread; a served pool has
 * none, so they are refused rather than never called. */
static int no_callbacks(const mp_pool *p, const mp_pool_callbacks *cb, const char *fn)
{
    if (!cb)
        return 0;
    return mp__error(MP_ENOTSUP, "%s: %s runs no handler thread, so it cannot call "
                                 "callbacks; pass NULL and wait on the result (or use "
                                 "mp_pool_imap_unordered)", fn, p->ops->what);
}

static int wrap_result(const mp__result_ops *ops, void *impl, mp_async_result **res)
{
    mp_async_result *r = calloc(1, sizeof *r);
    if (!r) {
        ops->release(impl);
        return mp__error(MP_ENOMEM, "mp_pool: out of memory");
    }
    atomic_init(&r->refs, 1);
    r->ops = ops;
    r->impl = impl;
    r->n = ops->count(impl);
    *res = r;
    return 0;
}

int mp__remote_submit(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                      size_t nargs, bool one, const mp_pool_callbacks *cb,
                      mp_async_result **res, const char *fn)
{
    void *impl = NULL;
    int rc = no_callbacks(p, cb, fn);
    if (!rc)
        rc = p->ops->submit(p->impl, task, in, n, nargs, one, &impl, fn);
    return rc ? rc : wrap_result(p->ops->result, impl, res);
}

int mp__remote_map_array(mp_pool *p, const char *task, const void *in, size_t n,
                         size_t in_size, void *out, size_t out_size, size_t chunksize,
                         const mp_pool_callbacks *cb, mp_async_result **res, const char *fn)
{
    void *impl = NULL;
    int rc = no_callbacks(p, cb, fn);
    if (!rc)
        rc = p->ops->map_array(p->impl, task, in, n, in_size, out, out_size, chunksize, &impl,
                               fn);
    return rc ? rc : wrap_result(p->ops->result, impl, res);
}

int mp__remote_imap(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                    bool unordered, mp_imap **it, const char *fn)
{
    mp_imap *m = calloc(1, sizeof *m);
    if (!m)
        return mp__error(MP_ENOMEM, "%s: out of memory", fn);
    int rc = p->ops->imap(p->impl, task, in, n, unordered, &m->impl, fn);
    if (rc) {
        free(m);
        return rc;
    }
    m->ops = p->ops->iter;
    m->unordered = unordered;
    *it = m;
    return 0;
}

/* 0 when every item succeeded, else the first failed one's error. */
static int first_error(const mp_async_result *r, const char *fn)
{
    size_t bad = r->ops->first_bad(r->impl);
    const mp_msg *unused;
    return bad < r->n ? r->ops->item(r->impl, bad, &unused, fn) : 0;
}

int mp__remote_get(mp_async_result *r, double timeout, const mp_msg **out, const char *fn)
{
    int rc = r->ops->wait(r->impl, timeout, fn);
    if (!rc)
        rc = first_error(r, fn);
    if (!rc && out && r->n) /* *out: NULL from the caller */
        rc = r->ops->item(r->impl, 0, out, fn);
    return rc;
}

int mp__remote_successful(const mp_async_result *r)
{
    if (!r->ops->ready(r->impl))
        return mp__error(MP_ESTATE, "mp_async_result_successful: not ready yet");
    return r->ops->first_bad(r->impl) >= r->n;
}

int mp__remote_item(const mp_async_result *r, size_t i, const mp_msg **out)
{
    if (!r->ops->ready(r->impl))
        return mp__error(MP_ESTATE, "mp_async_result_item: not ready yet");
    if (i >= r->n)
        return mp__error(MP_EINVAL, "mp_async_result_item: item %zu of %zu", i, r->n);
    return r->ops->item(r->impl, i, out, "mp_async_result_item");
}

const char *mp__remote_error(const mp_async_result *r)
{
    if (!r->ops->ready(r->impl))
        return "";
    size_t bad = r->ops->first_bad(r->impl);
    return bad < r->n ? r->ops->error(r->impl, bad) : "";
}

int mp__remote_finish(mp_async_result *r, mp_msg **out, const char *fn)
{
    int rc = r->ops->wait(r->impl, -1, fn);
    if (!rc)
        rc = first_error(r, fn);
    for (size_t i = 0; !rc && out && i < r->n; i++)
        out[i] = r->ops->take(r->impl, i);
    mp_async_result_release(r);
    return rc;
}

int mp__remote_imap_next(mp_imap *it, double timeout, mp_msg **out, size_t *index)
{
    return it->ops->next(it->impl, timeout, out, index);
}

void mp__remote_imap_destroy(mp_imap *it)
{
    it->ops->destroy(it->impl);
    free(it);
}
