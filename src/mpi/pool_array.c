/* mp_pool_map_array on a pool over ranks. The input is copied
 * once into a shared uint8 tensor; each chunk is one task whose message
 * holds {start, count, in_size, out_size} and a view of the chunk's slice.
 * The layer moves that view as any tensor: to a rank of this host as a
 * shared-memory handle (nothing copied), to another host as the slice's
 * bytes alone by MPI. When every worker rank is on rank 0's host (same-host
 * path), the message also holds a view of a shared output array that the
 * worker writes in place; otherwise the worker answers with a shared
 * tensor of the chunk's out bytes. Rank 0 copies each chunk into the
 * caller's array when it sees it done. The pool keeps the two shared
 * arrays of its last finished map_array for the next one (as mp_pool
 * does: fresh pages cost more than the copy). An array task (MP_ARRAY_TASK) runs once over the
 * slice; an ordinary task runs once per item, its payload the item, and
 * must answer out_size bytes. A failure fails its chunk. */
#include "mpi/pool_mpi.h"
#include "pool/pool_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mp__mpi_array {
    char *out;
    size_t n, out_size, chunk; /* items, bytes per out item, items per chunk */
    mp_tensor *in_t;  /* the shared input */
    mp_tensor *out_t; /* the shared output the workers write in place, or
                       * NULL (some worker on another host: each chunk's
                       * answer carries its bytes) */
} mp__mpi_array;

typedef struct slice_hdr {
    uint64_t start, count, in_size, out_size;
} slice_hdr;

/* ---- the worker side -------------------------------------------------------------- */

struct array_call {
    const char *name; /* without the kind byte */
    bool array;
    const char *in;
    char *out;
    slice_hdr h;
    char *err;
    size_t cap;
    mp_msg *item, *o; /* the item in progress: freed by the caller after an mp_raise */
};

static int call_items(struct array_call *a)
{
    mp_task_fn fn = mp__task_lookup(a->name);
    for (uint64_t i = 0; i < a->h.count; i++) {
        size_t len = 0;
        int rc = mp_msg_create(&a->item);
        if (rc == 0)
            rc = mp_msg_set_payload(a->item, a->in + i * a->h.in_size, a->h.in_size);
        if (rc == 0)
            rc = mp_msg_create(&a->o);
        if (rc == 0)
            rc = fn(a->item, a->o);
        const void *pl = rc == 0 ? mp_msg_payload(a->o, &len) : NULL;
        if (rc == 0 && len != a->h.out_size)
            rc = MP_EPROTO, snprintf(a->err, a->cap, "item %llu: the task set %zu bytes, "
                                     "map_array wants out_size = %llu",
                                     (unsigned long long)(a->h.start + i), len,
                                     (unsigned long long)a->h.out_size);
        if (rc == 0 && len)
            memcpy(a->out + i * a->h.out_size, pl, len);
        mp_msg_destroy(a->item), mp_msg_destroy(a->o);
        a->item = a->o = NULL;
        if (rc)
            return rc;
    }
    return 0;
}

static int call_array(void *ctx)
{
    struct array_call *a = ctx;
    mp__error_clear();
    if (!a->array)
        return call_items(a);
    return mp__array_task_lookup(a->name)(a->in, a->out, (size_t)a->h.count);
}

int mp__mpi_array_run(const char *name, const mp_msg *in, mp_msg *out, char *err, size_t cap)
{
    struct array_call a = {.name = name + 1, .array = name[0] == MP__MPI_ARRAY_KIND,
                           .err = err, .cap = cap};
    mp_tensor *tin = NULL, *tout = NULL;
    size_t len = 0;
    const void *pl = mp_msg_payload(in, &len);
    bool known = a.array ? mp__array_task_lookup(a.name) != NULL
                         : mp__task_lookup(a.name) != NULL;
    if (!known) {
        snprintf(err, cap, "no %stask '%s' is registered here", a.array ? "array " : "", a.name);
        return MP_ENOENT;
    }
    if (len != sizeof a.h || mp_msg_get_tensor(in, 0, &tin) != 0) {
        snprintf(err, cap, "malformed map_array chunk");
        return MP_EPROTO;
    }
    memcpy(&a.h, pl, sizeof a.h);
    int64_t nbytes = (int64_t)(a.h.count * a.h.out_size);
    /* A second tensor is rank 0's shared output, mapped here too (same
     * host): the chunk is written in place and the answer carries none. */
    bool in_place = mp_msg_count(in) == 2 && mp_msg_get_tensor(in, 1, &tout) == 0;
    int rc = mp_tensor_nbytes(tin) == a.h.count * a.h.in_size &&
             (!in_place || mp_tensor_nbytes(tout) == (size_t)nbytes) ? 0 : MP_EPROTO;
    if (rc)
        snprintf(err, cap, "map_array chunk of %zu bytes, want %llu", mp_tensor_nbytes(tin),
                 (unsigned long long)(a.h.count * a.h.in_size));
    else if (!in_place && (rc = mp_tensor_empty_shared(MP_UINT8, 1, &nbytes, &tout)) != 0)
        snprintf(err, cap, "%s", mp_last_error());
    if (rc == 0) {
        a.in = mp_tensor_data(tin), a.out = mp_tensor_data(tout);
        rc = mp__mpi_run_caught(call_array, &a, err, cap);
        mp_msg_destroy(a.item), mp_msg_destroy(a.o);
    }
    if (rc == 0 && !in_place && (rc = mp_msg_add_tensor(out, NULL, tout)) != 0)
        snprintf(err, cap, "%s", mp_last_error());
    mp_tensor_release(tin), mp_tensor_release(tout);
    return rc;
}

/* ---- rank 0 ------------------------------------------------------------------------ */

void mp__mpi_array_land(mp_mpi_result *g, size_t i)
{
    mp__mpi_array *arr = g->arr;
    mp_mpi_result *r = g->items[i];
    mp_tensor *t = NULL;
    size_t start = i * arr->chunk, count = arr->n - start < arr->chunk ? arr->n - start
                                                                        : arr->chunk;
    if (r->rc)
        return;
    if (arr->out_t && mp_msg_count(r->out) == 0) /* written in place */
        t = mp_tensor_retain(arr->out_t);
    else if (mp_msg_count(r->out) != 1 || mp_msg_get_tensor(r->out, 0, &t) != 0)
        t = NULL;
    const char *src = t ? mp_tensor_data(t) : NULL;
    if (t && t == arr->out_t)
        src += start * arr->out_size;
    if (!t || (t != arr->out_t && mp_tensor_nbytes(t) != count * arr->out_size)) {
        r->rc = MP_EPROTO;
        snprintf(r->error, sizeof r->error, "items %zu..%zu: the worker's answer does not "
                 "hold %zu bytes", start, start + count - 1, count * arr->out_size);
    } else if (count) {
        memcpy(arr->out + start * arr->out_size, src, count * arr->out_size);
    }
    mp_tensor_release(t);
    mp_msg_destroy(r->out); /* landed: the group's items have no message */
    r->out = NULL;
}

void mp__mpi_array_free(mp_mpi_result *g)
{
    if (g->arr)
        mp_tensor_release(g->arr->in_t), mp_tensor_release(g->arr->out_t);
    free(g->arr);
    g->arr = NULL;
}

static int check(mp_mpi_pool *p, const char *task, const void *in, size_t n, size_t in_size,
                 void *out, size_t out_size, const void *res, char *kind, const char *fn)
{
    if (!p || !task || !res || (n && (!in || !out)) || !in_size || !out_size)
        return mp__error(MP_EINVAL, "%s: p, task, in, out, in_size, out_size and the result "
                                    "pointer are required", fn);
    if (n > SIZE_MAX / in_size || n > SIZE_MAX / out_size || n * in_size > INT64_MAX)
        return mp__error(MP_EINVAL, "%s: %zu items are too many", fn, n);
    if (strlen(task) + 1 > 63)
        return mp__error(MP_EINVAL, "%s: the task name is too long", fn);
    *kind = mp__array_task_lookup(task) ? MP__MPI_ARRAY_KIND
            : mp__task_lookup(task)     ? MP__MPI_ITEMS_KIND : 0;
    if (!*kind)
        return mp__error(MP_ENOENT, "%s: no task or array task '%s' is registered", fn, task);
    return mp__mpi.failed ? mp__mpi_fail_error(fn) : 0;
}

/* The chunk [start, start + count) as a task message: its input slice,
 * and where its output goes when the workers write in place. */
static int chunk_msg(const mp__mpi_array *arr, slice_hdr h, mp_msg **out)
{
    mp_tensor *view = NULL, *oview = NULL;
    mp_msg *m = NULL;
    int rc = mp_tensor_narrow(arr->in_t, 0, (int64_t)(h.start * h.in_size),
                              (int64_t)(h.count * h.in_size), &view);
    if (rc == 0 && arr->out_t)
        rc = mp_tensor_narrow(arr->out_t, 0, (int64_t)(h.start * h.out_size),
                              (int64_t)(h.count * h.out_size), &oview);
    if (rc == 0)
        rc = mp_msg_create(&m);
    if (rc == 0)
        rc = mp_msg_set_payload(m, &h, sizeof h);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "slice", view);
    if (rc == 0 && oview)
        rc = mp_msg_add_tensor(m, "out", oview);
    mp_tensor_release(view), mp_tensor_release(oview);
    if (rc)
        mp_msg_destroy(m);
    else
        *out = m;
    return rc;
}

/* A shared array of at least nbytes: the pool's cached one when it fits
 * (fresh pages cost more than the copy), else a new one. */
static int shared_array(mp_tensor **cache, size_t nbytes, mp_tensor **out)
{
    int64_t len = (int64_t)nbytes;
    if (*cache && mp_tensor_nbytes(*cache) >= nbytes) {
        *out = *cache;
        *cache = NULL;
        return 0;
    }
    mp_tensor_release(*cache);
    *cache = NULL;
    return mp_tensor_empty_shared(MP_UINT8, 1, &len, out);
}

/* Whether every worker rank maps rank 0's shared memory. */
static bool all_local(const mp_mpi_pool *p)
{
    for (int w = 1; w <= p->nworkers; w++)
        if (mp_mpi_is_local(w) != 1)
            return false;
    return true;
}

static int submit_chunks(mp_mpi_pool *p, mp_mpi_result *g, const char *wire, const void *in,
                         size_t in_size, const char *fn)
{
    mp__mpi_array *arr = g->arr;
    if (g->n == 0)
        return 0;
    int rc = shared_array(&p->cache_in, arr->n * in_size, &arr->in_t);
    if (rc == 0 && all_local(p))
        rc = shared_array(&p->cache_out, arr->n * arr->out_size, &arr->out_t);
    if (rc == 0)
        memcpy(mp_tensor_data(arr->in_t), in, arr->n * in_size);
    for (size_t i = 0; i < g->n && rc == 0; i++) {
        slice_hdr h = {i * arr->chunk, arr->chunk, in_size, arr->out_size};
        mp_msg *m = NULL;
        if (h.start + h.count > arr->n)
            h.count = arr->n - h.start;
        if ((rc = chunk_msg(arr, h, &m)) == 0)
            rc = mp__mpi_pool_submit(p, wire, m, &g->items[i], fn);
        mp_msg_destroy(m);
    }
    return rc;
}

static int map_array_async(mp_mpi_pool *p, const char *task, const void *in, size_t n,
                           size_t in_size, void *out, size_t out_size, size_t chunksize,
                           mp_mpi_result **res, const char *fn)
{
    char wire[64];
    int rc = check(p, task, in, n, in_size, out, out_size, res, wire, fn);
    if (rc)
        return rc;
    snprintf(wire + 1, sizeof wire - 1, "%s", task);
    size_t workers = (size_t)p->nworkers;
    size_t chunk = chunksize ? chunksize : (n + 4 * workers - 1) / (4 * workers);
    chunk = chunk ? chunk : 1;
    mp_mpi_result *g = calloc(1, sizeof *g);
    if (!g || !(g->arr = calloc(1, sizeof *g->arr)) ||
        !(g->items = calloc(n / chunk + 1, sizeof *g->items))) {
        if (g)
            free(g->arr);
        free(g);
        return mp__error(MP_ENOMEM, "%s: out of memory", fn);
    }
    *g->arr = (mp__mpi_array){.out = out, .n = n, .out_size = out_size, .chunk = chunk};
    g->refs = 1, g->group = true, g->n = (n + chunk - 1) / chunk, g->pool = p;
    if ((rc = submit_chunks(p, g, wire, in, in_size, fn)) != 0) {
        mp__mpi_result_release(g);
        return rc;
    }
    *res = g;
    return 0;
}

int mp__mpi_pool_map_array(mp_mpi_pool *p, const char *task, const void *in, size_t n,
                           size_t in_size, void *out, size_t out_size, size_t chunksize,
                           mp_mpi_result **res, const char *fn)
{
    mp_mpi_result *g = NULL;
    if (res)
        return map_array_async(p, task, in, n, in_size, out, out_size, chunksize, res, fn);
    int rc = map_array_async(p, task, in, n, in_size, out, out_size, chunksize, &g, fn);
    if (rc == 0)
        rc = mp__mpi_result_wait(g, -1, fn);
    if (rc == 0 && (rc = mp__mpi_group_get(g, NULL)) != 0) {
        char why[MP__MPI_TEXT_MAX + 128]; /* the sentence is rewritten below */
        snprintf(why, sizeof why, "%s", mp_last_error());
        rc = mp__error(rc, "%s: %s", fn, why);
    }
    /* Every chunk is done: the next call may reuse the shared arrays. Not
     * after an async call, whose result may outlive the pool. */
    if (rc == 0 && g->arr && g->arr->in_t) {
        mp_tensor_release(p->cache_in), mp_tensor_release(p->cache_out);
        p->cache_in = g->arr->in_t, p->cache_out = g->arr->out_t;
        g->arr->in_t = g->arr->out_t = NULL;
    }
    mp__mpi_result_release(g);
    return rc;
}
