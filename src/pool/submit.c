/* Submission: cut the input into chunks (one pack each), queue them; the
 * blocking forms wait on the result. Also the lazy iterators. */
#include "pool/pool_internal.h"
#include "wire/objects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SRC_MSGS, SRC_STAR, SRC_ARRAY, SRC_VEC };
#define PREFETCH_AHEAD 8 /* items */

typedef struct source {
    int type;
    const mp_msg *const *msgs; /* MSGS, STAR */
    size_t nargs;              /* STAR */
    const char *bytes;         /* ARRAY */
    size_t in_size;
    void *out;                 /* ARRAY, VEC */
    size_t out_size;
    mp_msg *vatt;              /* VEC: the shared in and out arrays */
    bool order;                /* MSGS: keep the completion order (imap_unordered) */
} source;

static int add_item(mp__packer *pk, const source *s, size_t i)
{
    const void *pl;
    size_t len;
    switch (s->type) {
    case SRC_MSGS:
        pl = mp_msg_payload(s->msgs[i], &len);
        return mp__packer_add(pk, pl, len, s->msgs[i], 0, NULL);
    case SRC_STAR:
        return mp__packer_add_star(pk, s->msgs + i * s->nargs, s->nargs);
    default:
        return mp__packer_add(pk, s->bytes + i * s->in_size, s->in_size, NULL, 0, NULL);
    }
}

/* VEC: the chunk is one item, its slice of the shared arrays. */
static int add_slice(mp__packer *pk, const source *s, size_t start, size_t count)
{
    mp__vec_slice v = {start, count, s->in_size, s->out_size};
    return mp__packer_add(pk, &v, sizeof v, s->vatt, 0, NULL);
}

static int make_chunk(mp_async_result *r, const source *s, size_t start, size_t count,
                      mp__chunk **out)
{
    mp__packer pk;
    mp__chunk *c = calloc(1, sizeof *c);
    int rc = c ? mp__packer_init(&pk, MP__PACK_TASK, r->task, count)
               : mp__error(MP_ENOMEM, "mp_pool: out of memory for a chunk");
    if (rc) {
        free(c);
        return rc;
    }
    if (s->type == SRC_VEC)
        rc = add_slice(&pk, s, start, count);
    for (size_t i = start; i < start + count && !rc && s->type != SRC_VEC; i++) {
        /* Each item is a message of its own somewhere in the heap: asked
         * for ahead, its cache line is there when its turn comes. */
        if (s->type == SRC_MSGS && i + PREFETCH_AHEAD < start + count)
            __builtin_prefetch(s->msgs[i + PREFETCH_AHEAD]);
        rc = add_item(&pk, s, i);
    }
    if (rc) {
        mp__packer_drop(&pk);
        free(c);
        return rc;
    }
    rc = mp__packer_finish(&pk, &c->frame);
    if (rc) {
        free(c);
        return rc;
    }
    c->r = mp_async_result_retain(r);
    c->start = start;
    c->count = count;
    *out = c;
    return 0;
}

/* VEC: the shared copies of the input and output arrays, held by r, and
 * the message that attaches them to every chunk (freed with s). */
static int vec_arrays(mp_pool *p, mp_async_result *r, source *s, size_t n, const char *call)
{
    int64_t ib, ob;
    int rc = 0;
    if (n > (size_t)INT64_MAX / s->in_size || n > (size_t)INT64_MAX / s->out_size)
        return mp__error(MP_EOVERFLOW, "%s: %zu items are too many bytes", call, n);
    ib = (int64_t)(n * s->in_size);
    ob = (int64_t)(n * s->out_size);
    r->vin = mp__pool_vec_take(p, 0, (size_t)ib);
    r->vout = mp__pool_vec_take(p, 1, (size_t)ob);
    if (!r->vin)
        rc = mp_tensor_empty_shared(MP_UINT8, 1, &ib, &r->vin);
    if (!rc && !r->vout)
        rc = mp_tensor_empty_shared(MP_UINT8, 1, &ob, &r->vout);
    if (!rc)
        rc = mp_msg_create(&s->vatt);
    if (!rc)
        rc = mp_msg_add_tensor(s->vatt, "in", r->vin);
    if (!rc)
        rc = mp_msg_add_tensor(s->vatt, "out", r->vout);
    if (!rc)
        memcpy(mp_tensor_data(r->vin), s->bytes, (size_t)ib);
    return rc;
}

/* The mean payload of the first items, for the default chunk size; 0 when
 * unknown (starmap, slices) or when an item carries attachments (their fds
 * and segments, not the bytes, decide the chunk's cost). */
static size_t item_bytes(const source *s, size_t n)
{
    size_t sum = 0, k = n < 256 ? n : 256, len;
    if (s->type == SRC_ARRAY)
        return s->in_size;
    if (s->type != SRC_MSGS)
        return 0;
    for (size_t i = 0; i < k; i++) {
        if (!s->msgs[i] || mp_msg_count(s->msgs[i]))
            return 0;
        mp_msg_payload(s->msgs[i], &len);
        sum += len;
    }
    return k ? sum / k + 1 : 0;
}

static int submit(mp_pool *p, const char *task, int kind, source *s, size_t n,
                  size_t chunksize, const mp_pool_callbacks *cb, mp_async_result **res,
                  const char *call)
{
    mp_async_result *r;
    mp__chunk *head = NULL, *tail = NULL, *c;
    int rc;
    if (!res)
        return mp__error(MP_EINVAL, "%s: the result pointer is NULL", call);
    *res = NULL;
    if (!p || !task)
        return mp__error(MP_EINVAL, "%s: %s is NULL", call, p ? "task" : "pool");
    if (kind != MP__JOB_VEC && !mp__task_lookup(task))
        return mp__error(MP_ENOENT, "%s: no task called '%s' (define it with MP_TASK%s)",
                         call, task, mp__array_task_lookup(task)
                                         ? "; an MP_ARRAY_TASK runs with mp_pool_map_array only"
                                         : "");
    if ((rc = mp__result_new(call, kind, n, s->order, task, cb, &r)) != 0)
        return rc;
    r->out_array = s->out; /* set before the handler can see r */
    r->out_size = s->out_size;
    if (kind == MP__JOB_VEC && n && (rc = vec_arrays(p, r, s, n, call)) != 0)
        goto out_release;
    chunksize = mp__pool_chunksize(p, n, chunksize, item_bytes(s, n));
    if (kind == MP__JOB_MSG && (rc = mp__result_set_chunks(r, chunksize)) != 0)
        goto out_release;
    for (size_t start = 0, made = 0, next_flush = 1; start < n; start += chunksize) {
        size_t count = n - start < chunksize ? n - start : chunksize;
        rc = make_chunk(r, s, start, count, &c);
        if (rc)
            goto out_free;
        if (tail)
            tail->next = c;
        else
            head = c;
        tail = c;
        /* The first chunks go at once, then batches of doubling size: the
         * workers start while the rest are packed, at a handler wake-up
         * per batch. (VEC: all at the end, see below.) */
        if (++made == next_flush && kind != MP__JOB_VEC && start + count < n) {
            next_flush *= 2;
            rc = mp__pool_submit(p, head, tail, call); /* frees the chunks on failure */
            head = tail = NULL;
            if (rc)
                goto out_release;
        }
    }
    /* VEC: every chunk holds the arrays now; dropping this hold before the
     * handler can see them keeps the last release of an array out of this
     * thread while the handler encodes it. */
    mp_msg_destroy(s->vatt);
    s->vatt = NULL;
    if (n == 0) /* nothing to hand the handler: done now, in this thread */
        mp__result_callback(r);
    else if (head && (rc = mp__pool_submit(p, head, tail, call)) != 0) /* frees the chunks */
        goto out_release;
    *res = r;
    return 0;

out_free:
    while (head) {
        c = head->next;
        mp__chunk_free(head);
        head = c;
    }
out_release:
    mp_async_result_release(r);
    return rc;
}

static int check_msgs(const mp_msg *const *in, size_t n, const char *call)
{
    if (n && !in)
        return mp__error(MP_EINVAL, "%s: in is NULL", call);
    for (size_t i = 0; i < n; i++)
        if (!in[i])
            return mp__error(MP_EINVAL, "%s: in[%zu] is NULL", call, i);
    return 0;
}

/* The submission calls below, each with `call` the public one made: the
 * _async calls name themselves, the blocking forms and imap theirs. */
static int apply_async(mp_pool *p, const char *task, const mp_msg *in,
                       const mp_pool_callbacks *cb, mp_async_result **res, const char *call)
{
    const mp_msg *one[1] = {in};
    source s = {SRC_MSGS, one, 0, NULL, 0, NULL, 0, NULL, false};
    if (!in)
        return mp__error(MP_EINVAL, "%s: in is NULL", call);
    if (p && p->ops && res && task)
        return mp__remote_submit(p, task, one, 1, 0, true, cb, res, call);
    return submit(p, task, MP__JOB_MSG, &s, 1, 1, cb, res, call);
}

int mp_pool_apply_async(mp_pool *p, const char *task, const mp_msg *in,
                        const mp_pool_callbacks *cb, mp_async_result **res)
{
    return apply_async(p, task, in, cb, res, "mp_pool_apply_async");
}

static int map_async(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                     size_t chunksize, const mp_pool_callbacks *cb, mp_async_result **res,
                     bool order, const char *call)
{
    source s = {SRC_MSGS, in, 0, NULL, 0, NULL, 0, NULL, order};
    int rc = check_msgs(in, n, call);
    if (!rc && p && p->ops && res && task)
        return mp__remote_submit(p, task, in, n, 0, false, cb, res, call);
    return rc ? rc : submit(p, task, MP__JOB_MSG, &s, n, chunksize, cb, res, call);
}

int mp_pool_map_async(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                      size_t chunksize, const mp_pool_callbacks *cb, mp_async_result **res)
{
    return map_async(p, task, in, n, chunksize, cb, res, false, "mp_pool_map_async");
}

static int starmap_async(mp_pool *p, const char *task, const mp_msg *const *args, size_t n,
                         size_t nargs, size_t chunksize, const mp_pool_callbacks *cb,
                         mp_async_result **res, const char *call)
{
    source s = {SRC_STAR, args, nargs, NULL, 0, NULL, 0, NULL, false};
    int rc = 0;
    if (nargs == 0 || nargs > 1024)
        rc = mp__error(MP_EINVAL, "%s: nargs = %zu, want 1..1024", call, nargs);
    else if (n && n * nargs / n != nargs)
        rc = mp__error(MP_EOVERFLOW, "%s: %zu items of %zu arguments overflow a size_t", call,
                       n, nargs);
    if (!rc)
        rc = check_msgs(args, n * nargs, call);
    if (!rc && p && p->ops && res && task)
        return mp__remote_submit(p, task, args, n, nargs, false, cb, res, call);
    return rc ? rc : submit(p, task, MP__JOB_MSG, &s, n, chunksize, cb, res, call);
}

int mp_pool_starmap_async(mp_pool *p, const char *task, const mp_msg *const *args, size_t n,
                          size_t nargs, size_t chunksize, const mp_pool_callbacks *cb,
                          mp_async_result **res)
{
    return starmap_async(p, task, args, n, nargs, chunksize, cb, res, "mp_pool_starmap_async");
}

static int check_arrays(const void *in, size_t n, size_t in_size, const void *out,
                        size_t out_size, const char *call)
{
    if (n && (!in || !out))
        return mp__error(MP_EINVAL, "%s: %s is NULL for %zu items", call, in ? "out" : "in", n);
    if (n && (in_size == 0 || out_size == 0))
        return mp__error(MP_EINVAL, "%s: %s is 0; give each item's size in bytes", call,
                         in_size ? "out_size" : "in_size");
    if (n && (n > SIZE_MAX / in_size || n > SIZE_MAX / out_size))
        return mp__error(MP_EOVERFLOW, "%s: %zu items of %zu and %zu bytes overflow a size_t",
                         call, n, in_size, out_size);
    return 0;
}

static int map_array_async(mp_pool *p, const char *task, const void *in, size_t n,
                           size_t in_size, void *out, size_t out_size, size_t chunksize,
                           const mp_pool_callbacks *cb, mp_async_result **res, const char *call)
{
    bool vec = task && mp__array_task_lookup(task);
    source s = {vec ? SRC_VEC : SRC_ARRAY, NULL, 0, in, in_size, out, out_size, NULL, false};
    int rc = check_arrays(in, n, in_size, out, out_size, call);
    if (rc)
        return rc;
    if (p && p->ops && res && task)
        return mp__remote_map_array(p, task, in, n, in_size, out, out_size, chunksize, cb, res,
                                    call);
    rc = submit(p, task, vec ? MP__JOB_VEC : MP__JOB_ARRAY, &s, n, chunksize, cb, res, call);
    mp_msg_destroy(s.vatt);
    return rc;
}

int mp_pool_map_array_async(mp_pool *p, const char *task, const void *in, size_t n,
                            size_t in_size, void *out, size_t out_size, size_t chunksize,
                            const mp_pool_callbacks *cb, mp_async_result **res)
{
    return map_array_async(p, task, in, n, in_size, out, out_size, chunksize, cb, res,
                           "mp_pool_map_array_async");
}

/* ---- blocking forms ------------------------------------------------------------- */

static bool is_done(mp_async_result *r, void *arg)
{
    return r->ready || r->done[*(const size_t *)arg];
}

/* The messages of a map's results come in blocks (one malloc each,
 * mp__msg_create_block): a message kept by the caller keeps its block's
 * 16 KiB. */
#define OUT_BLOCK MP__MSG_BLOCK

/* Builds items [*pos, end) of r's results into out, from their chunks'
 * answers, taking their messages in blocks. */
static int build_run(mp_async_result *r, size_t *pos, size_t end, mp_msg **out)
{
    mp_msg *blk[OUT_BLOCK];
    size_t nb = 0, used = 0, k = *pos / r->chunk, j = *pos - k * r->chunk;
    int rc = 0;
    for (; *pos < end && rc == 0; (*pos)++) {
        if (used == nb) {
            nb = end - *pos < OUT_BLOCK ? end - *pos : OUT_BLOCK;
            used = 0;
            if ((rc = mp__msg_create_block(nb, blk)) != 0) {
                nb = 0;
                break;
            }
        }
        rc = mp__result_take_into(r, k, (uint32_t)j, blk[used], &out[*pos]);
        if (rc == 0 && out[*pos] == blk[used])
            used++;
        if (rc == 0 && (++j == r->chunk || *pos + 1 == r->n)) {
            mp__result_drop_frame(r, k++); /* its last item */
            j = 0;
        }
    }
    while (used < nb) /* unused, or holding part of the item that failed */
        mp_msg_destroy(blk[used++]);
    return rc;
}

/* MSG: waits for the items in order and builds each one's message from its
 * chunk's answer as the chunk arrives, here, beside the workers: the
 * handler thread only moves chunks. r is the caller's alone (the handler
 * writes no outs and never drops a kept answer), so the building runs
 * unlocked. Stops at the first failed item; 0 when all n were built. */
static int build_outs(mp_async_result *r, mp_msg **out)
{
    size_t pos = 0, end;
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    while (pos < r->n && rc == 0) {
        mp__result_wait_locked(r, is_done, &pos, -1);
        for (end = pos; end < r->n && r->done[end] && !r->rcs[end]; end++)
            ;
        if (end == pos)
            break; /* item pos failed */
        pthread_mutex_unlock(&r->mu);
        rc = build_run(r, &pos, end, out);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    if (rc == 0 && pos == r->n)
        return 0;
    for (size_t i = 0; i < pos; i++) { /* the failed one was not built: NULL */
        mp_msg_destroy(out[i]);
        out[i] = NULL;
    }
    return rc ? rc : 1;
}

/* Waits for r, moves its messages to out (may be NULL), releases r. */
static int finish(mp_async_result *r, mp_msg **out, const char *call)
{
    if (r->ops)
        return mp__remote_finish(r, out, call);
    char why[MP__WHY_MAX];
    int built = out && r->kind == MP__JOB_MSG ? build_outs(r, out) : 1;
    if (built < 0)
        snprintf(why, sizeof why, "%s", mp_last_error());
    int rc = mp_async_result_wait(r, -1);
    pthread_mutex_lock(&r->mu);
    if (!rc)
        rc = mp__result_first_error(r, call);
    if (!rc && built < 0)
        rc = mp__error(built, "%s: %s", call, why);
    pthread_mutex_unlock(&r->mu);
    mp_async_result_release(r);
    return rc;
}

int mp_pool_apply(mp_pool *p, const char *task, const mp_msg *in, mp_msg **out)
{
    mp_async_result *r;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_pool_apply: out is NULL");
    *out = NULL;
    rc = apply_async(p, task, in, NULL, &r, "mp_pool_apply");
    return rc ? rc : finish(r, out, "mp_pool_apply");
}

int mp_pool_map(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                size_t chunksize, mp_msg **out)
{
    mp_async_result *r;
    int rc;
    if (n && !out)
        return mp__error(MP_EINVAL, "mp_pool_map: out is NULL");
    rc = map_async(p, task, in, n, chunksize, NULL, &r, false, "mp_pool_map");
    return rc ? rc : finish(r, out, "mp_pool_map");
}

int mp_pool_starmap(mp_pool *p, const char *task, const mp_msg *const *args, size_t n,
                    size_t nargs, size_t chunksize, mp_msg **out)
{
    mp_async_result *r;
    int rc;
    if (n && !out)
        return mp__error(MP_EINVAL, "mp_pool_starmap: out is NULL");
    rc = starmap_async(p, task, args, n, nargs, chunksize, NULL, &r, "mp_pool_starmap");
    return rc ? rc : finish(r, out, "mp_pool_starmap");
}

int mp_pool_map_array(mp_pool *p, const char *task, const void *in, size_t n, size_t in_size,
                      void *out, size_t out_size, size_t chunksize)
{
    mp_async_result *r;
    if (p && p->ops && task && (!n || (in && out && in_size && out_size)))
        return p->ops->map_array(p->impl, task, in, n, in_size, out, out_size, chunksize, NULL,
                                 "mp_pool_map_array");
    int rc = map_array_async(p, task, in, n, in_size, out, out_size, chunksize, NULL, &r,
                             "mp_pool_map_array");
    return rc ? rc : finish(r, NULL, "mp_pool_map_array");
}

/* ---- lazy iterators ---------------------------------------------------------------- */

static int imap_create(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                       size_t chunksize, bool unordered, mp_imap **it, const char *call)
{
    mp_imap *m;
    int rc;
    if (!it)
        return mp__error(MP_EINVAL, "%s: it is NULL", call);
    *it = NULL;
    if (p && p->ops && task && !check_msgs(in, n, call))
        return mp__remote_imap(p, task, in, n, unordered, it, call);
    m = calloc(1, sizeof *m);
    if (!m)
        return mp__error(MP_ENOMEM, "%s: out of memory", call);
    rc = map_async(p, task, in, n, chunksize, NULL, &m->r, unordered, call);
    if (rc) {
        free(m);
        return rc;
    }
    m->unordered = unordered;
    *it = m;
    return 0;
}

int mp_pool_imap(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                 size_t chunksize, mp_imap **it)
{
    return imap_create(p, task, in, n, chunksize, false, it, "mp_pool_imap");
}

int mp_pool_imap_unordered(mp_pool *p, const char *task, const mp_msg *const *in, size_t n,
                           size_t chunksize, mp_imap **it)
{
    return imap_create(p, task, in, n, chunksize, true, it, "mp_pool_imap_unordered");
}

static bool next_ready(mp_async_result *r, void *arg)
{
    const mp_imap *m = arg;
    return m->unordered ? r->ndone > m->pos : r->done[m->pos] != 0;
}

int mp_imap_next(mp_imap *it, double timeout, mp_msg **out, size_t *index)
{
    mp_async_result *r;
    size_t i;
    int rc;
    if (!it || !out)
        return mp__error(MP_EINVAL, "mp_imap_next: %s is NULL", it ? "out" : "it");
    *out = NULL;
    if ((rc = mp__check_timeout(timeout, "mp_imap_next")) < 0)
        return rc;
    if (it->ops)
        return mp__remote_imap_next(it, timeout, out, index);
    r = it->r;
    if (it->pos >= r->n)
        return mp__error(MP_ECLOSED, "mp_imap_next: all %zu items were returned", r->n);
    pthread_mutex_lock(&r->mu);
    rc = mp__result_wait_locked(r, next_ready, it, timeout);
    if (rc) {
        pthread_mutex_unlock(&r->mu);
        return mp__error(rc, "mp_imap_next: no result within %g s", timeout);
    }
    i = it->unordered ? r->order[it->pos] : it->pos;
    it->pos++;
    if (index)
        *index = i;
    if (r->rcs[i])
        rc = mp__error(r->rcs[i], "mp_imap_next: item %zu: %s", i, mp__result_err(r, i));
    else
        rc = mp__result_take(r, i, out);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void mp_imap_destroy(mp_imap *it)
{
    if (!it)
        return;
    if (it->ops) {
        mp__remote_imap_destroy(it);
        return;
    }
    mp_async_result_release(it->r);
    free(it);
}
