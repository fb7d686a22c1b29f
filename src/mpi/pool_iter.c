/* The rest of the pool over ranks' calls, over mp__mpi_pool_apply_async:
 * map_async and starmap (a group result: one task result per item), and
 * the lazy iterators imap and imap_unordered. Every item is one task, so
 * a failed item (a task that returns non-zero or calls mp_raise) fails
 * alone and the others, the iteration included, go on. Like the rest of
 * the pool, work moves only while rank 0 is inside a pool call. */
#include "mpi/pool_mpi.h"
#include "pool/pool_internal.h"

#include <stdlib.h>
#include <string.h>

struct mp_mpi_imap {
    mp_mpi_pool *p;
    bool ordered;
    size_t n, taken;     /* items, and items returned by next */
    mp_mpi_result **rs;  /* one per item */
    size_t *done, ndone; /* unordered: finished items, in completion order */
};

/* ---- group results -------------------------------------------------------- */

bool mp__mpi_result_ready(mp_mpi_result *r)
{
    if (!r->group)
        return r->ready;
    while (r->cursor < r->n && r->items[r->cursor]->ready) {
        if (r->arr)
            mp__mpi_array_land(r, r->cursor);
        r->cursor++;
    }
    return r->ready = r->cursor == r->n;
}

void mp__mpi_group_free(mp_mpi_result *r)
{
    for (size_t i = 0; r->group && i < r->n; i++)
        mp__mpi_result_release(r->items[i]);
    free(r->items);
    r->items = NULL;
    mp__mpi_array_free(r);
}

/* Hands over a finished task result's message (once), or its error. */
static int take_out(mp_mpi_result *r, size_t i, mp_msg **out, const char *fn)
{
    if (r->rc)
        return mp__error(r->rc, "item %zu: %s", i, r->error);
    if (!r->out)
        return mp__error(MP_ESTATE, "%s: item %zu was taken already", fn, i);
    *out = r->out;
    r->out = NULL;
    return 0;
}

int mp__mpi_group_get(mp_mpi_result *r, mp_msg **out)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->items[i]->rc)
            return mp__error(r->items[i]->rc, "%s %zu: %s", r->arr ? "chunk" : "item", i,
                             r->items[i]->error);
    if (!out)
        return 0;
    *out = NULL;
    return r->n && !r->arr ? take_out(r->items[0], 0, out, "mp_async_result_get") : 0;
}

size_t mp__mpi_result_count(const mp_mpi_result *r)
{
    return !r ? 0 : r->group ? r->n : 1;
}

/* ---- submitting ----------------------------------------------------------------- */

static int check(mp_mpi_pool *p, const char *task, const void *in, size_t n, const void *res,
                 const char *fn)
{
    if (!p || !task || !res || (n && !in))
        return mp__error(MP_EINVAL, "%s: p, task, in and the result pointer are required", fn);
    if (!mp__task_lookup(task))
        return mp__error(MP_ENOENT, "%s: no task '%s' is registered (MP_TASK)", fn, task);
    return mp__mpi.failed ? mp__mpi_fail_error(fn) : 0;
}

/* Item i of a starmap: its nargs messages packed into one (mp_task_arg
 * unpacks them in the task, whatever rank runs it). */
static int pack_star(const mp_msg *const *args, size_t nargs, mp_msg **out)
{
    mp__packer pk;
    int rc = mp__packer_init(&pk, MP__PACK_STAR, NULL, nargs);
    for (size_t j = 0; rc == 0 && j < nargs; j++) {
        size_t len = 0;
        const void *pl = args[j] ? mp_msg_payload(args[j], &len) : NULL;
        rc = mp__packer_add(&pk, pl, len, args[j], 0, NULL);
    }
    if (rc == 0)
        return mp__packer_finish(&pk, out);
    mp__packer_drop(&pk);
    return rc;
}

/* Queues item i (its message, or its nargs packed arguments). */
static int submit(mp_mpi_pool *p, const char *task, const mp_msg *const *in, size_t i,
                  size_t nargs, mp_mpi_result **res, const char *fn)
{
    mp_msg *packed = NULL;
    int rc = 0;
    if (nargs && (rc = pack_star(in + i * nargs, nargs, &packed)) != 0)
        return rc;
    rc = mp__mpi_pool_apply_async(p, task, nargs ? packed : in[i], res, fn);
    mp_msg_destroy(packed);
    return rc;
}

int mp__mpi_pool_group(mp_mpi_pool *p, const char *task, const mp_msg *const *in, size_t n,
                       size_t nargs, mp_mpi_result **res, const char *fn)
{
    int rc = check(p, task, in, n, res, fn);
    if (rc == 0 && nargs > 1024)
        rc = mp__error(MP_EINVAL, "%s: nargs = %zu, want 1..1024", fn, nargs);
    if (rc)
        return rc;
    mp_mpi_result *g = calloc(1, sizeof *g);
    if (!g || !(g->items = calloc(n ? n : 1, sizeof *g->items))) {
        free(g);
        return mp__error(MP_ENOMEM, "%s: out of memory", fn);
    }
    g->refs = 1, g->group = true, g->n = n, g->pool = p;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = submit(p, task, in, i, nargs, &g->items[i], fn);
    if (rc) {
        mp__mpi_result_release(g); /* items never submitted are NULL */
        return rc;
    }
    *res = g;
    return 0;
}

/* ---- iterators -------------------------------------------------------------------- */

void mp__mpi_imap_done(mp_mpi_imap *it, size_t index)
{
    it->done[it->ndone++] = index;
}

int mp__mpi_pool_imap(mp_mpi_pool *p, const char *task, const mp_msg *const *in, size_t n,
                      bool ordered, mp_mpi_imap **out, const char *fn)
{
    int rc = check(p, task, in, n, out, fn);
    if (rc)
        return rc;
    mp_mpi_imap *it = calloc(1, sizeof *it);
    if (!it || !(it->rs = calloc(n ? n : 1, sizeof *it->rs)) ||
        !(it->done = calloc(n ? n : 1, sizeof *it->done))) {
        if (it)
            free(it->rs);
        free(it);
        return mp__error(MP_ENOMEM, "%s: out of memory", fn);
    }
    it->p = p, it->ordered = ordered, it->n = n;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = mp__mpi_pool_apply_async(p, task, in[i], &it->rs[i], fn);
        if (rc == 0 && it->rs[i]->ready)
            mp__mpi_imap_done(it, i);
        else if (rc == 0)
            it->rs[i]->it = it, it->rs[i]->index = i;
    }
    if (rc) {
        mp__mpi_imap_destroy(it);
        return rc;
    }
    *out = it;
    return 0;
}

static bool next_ready(void *arg)
{
    mp_mpi_imap *it = arg;
    return it->ordered ? it->rs[it->taken]->ready : it->ndone > it->taken;
}

int mp__mpi_imap_next(mp_mpi_imap *it, double timeout, mp_msg **out, size_t *index)
{
    static const char *fn = "mp_imap_next";
    if (!it || !out)
        return mp__error(MP_EINVAL, "%s: it and out are required", fn);
    *out = NULL;
    if (it->taken == it->n)
        return mp__error(MP_ECLOSED, "%s: every item was returned", fn);
    int rc = mp__mpi_pool_wait(it->p, next_ready, it, timeout, fn, "the next item is not ready");
    if (rc)
        return rc;
    size_t i = it->ordered ? it->taken : it->done[it->taken];
    it->taken++;
    if (index)
        *index = i;
    return take_out(it->rs[i], i, out, fn);
}

void mp__mpi_imap_destroy(mp_mpi_imap *it)
{
    if (!it)
        return;
    for (size_t i = 0; i < it->n; i++) {
        if (it->rs[i])
            it->rs[i]->it = NULL;
        mp__mpi_result_release(it->rs[i]);
    }
    free(it->rs), free(it->done), free(it);
}
