/* AsyncResult, the submission calls (apply/map/starmap/map_array) and the
 * lazy iterators (imap, imap_unordered). */
#include "pool/pool_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- results --------------------------------------------------------------------- */

int mp__result_new(const char *call, int kind, size_t n, bool order, const char *task,
                   const mp_pool_callbacks *user_cb, mp_async_result **out)
{
    mp_pool_callbacks copy, *cb = NULL;
    if (user_cb) {
        int rc = mp__struct_in(&copy, sizeof copy, user_cb, call, "mp_pool_callbacks");
        if (rc)
            return rc;
        cb = &copy;
    }
    mp_async_result *r = calloc(1, sizeof *r);
    size_t m = n ? n : 1;
    /* outs comes with the first borrow; order only for imap_unordered */
    if (!r || !(r->rcs = calloc(m, sizeof(int))) || !(r->done = calloc(m, 1)) ||
        (order && !(r->order = calloc(m, sizeof(size_t))))) {
        if (r) {
            free(r->rcs);
            free(r->done);
        }
        free(r);
        return mp__error(MP_ENOMEM, "mp_pool: out of memory for a result of %zu items", n);
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&r->mu, NULL);
    atomic_init(&r->refs, 1);
    r->kind = kind;
    r->n = n;
    r->first_bad = n;
    r->ready = n == 0;
    snprintf(r->task, sizeof r->task, "%s", task);
    if (cb && (cb->on_success || cb->on_error)) {
        r->cb = *cb;
        r->has_cb = true;
    }
    *out = r;
    return 0;
}

mp_async_result *mp_async_result_retain(mp_async_result *r)
{
    if (r)
        atomic_fetch_add(&r->refs, 1);
    return r;
}

void mp_async_result_release(mp_async_result *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    if (r->ops) {
        r->ops->release(r->impl);
        free(r);
        return;
    }
    for (size_t i = 0; i < r->n; i++) {
        if (r->outs)
            mp_msg_destroy(r->outs[i]);
        if (r->errs)
            free(r->errs[i]);
    }
    for (size_t k = 0; r->frames && k < r->nframes; k++)
        mp__result_drop_frame(r, k);
    free(r->frames);
    free(r->outs);
    free(r->rcs);
    free(r->errs);
    free(r->done);
    free(r->order);
    mp_tensor_release(r->vin);
    mp_tensor_release(r->vout);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

int mp__result_set_chunks(mp_async_result *r, size_t chunk)
{
    r->chunk = chunk;
    r->nframes = r->n ? (r->n - 1) / chunk + 1 : 0;
    if (r->nframes && !(r->frames = calloc(r->nframes, sizeof *r->frames)))
        return mp__error(MP_ENOMEM, "mp_pool: out of memory for a result of %zu chunks",
                         r->nframes);
    return 0;
}

void mp__result_drop_frame(mp_async_result *r, size_t k)
{
    mp__result_frame *f = r->frames[k];
    if (!f)
        return;
    r->frames[k] = NULL;
    if (f->open)
        mp__pack_close(&f->v);
    mp_msg_destroy(f->msg);
    free(f);
}

/* Item j of f, at or after its cursor: walks the entries up to it, builds
 * it into m, moves the cursor past it. No table: the handler checked the
 * frame. */
static int frame_next(mp__result_frame *f, uint32_t j, mp_msg *m)
{
    const char *pl = mp_msg_payload(f->msg, NULL);
    mp__pack_entry e;
    int rc;
    for (;;) {
        memcpy(&e, pl + sizeof(mp__pack_hdr) + (size_t)f->next * sizeof e, sizeof e);
        if (f->next == j)
            break;
        f->off += e.len + e.err_len;
        f->att += e.nattach;
        f->next++;
    }
    rc = mp__pack_build_into(f->msg, pl + f->off, e.len, f->att, e.nattach, m);
    if (rc)
        return rc;
    f->off += e.len + e.err_len;
    f->att += e.nattach;
    f->next++;
    return 0;
}

int mp__result_take(mp_async_result *r, size_t i, mp_msg **out)
{
    size_t k = i / r->chunk;
    return mp__result_take_at(r, k, (uint32_t)(i - k * r->chunk), out);
}

int mp__result_take_into(mp_async_result *r, size_t k, uint32_t j, mp_msg *m, mp_msg **out)
{
    size_t i = k * r->chunk + j;
    mp__result_frame *f = k < r->nframes ? r->frames[k] : NULL;
    int rc;
    *out = r->outs ? r->outs[i] : NULL;
    if (*out) {
        r->outs[i] = NULL;
        return 0;
    }
    if (!f) /* cannot happen: a successful item's chunk answer is kept */
        return mp__error(MP_EPROTO, "mp_pool: item %zu has no result", i);
    if (!f->open && j >= f->next) {
        rc = frame_next(f, j, m);
    } else {
        if (!f->open) {
            if ((rc = mp__pack_open(f->msg, &f->v)) != 0)
                return rc;
            f->open = true;
        }
        rc = mp__pack_item_into(&f->v, j, m);
    }
    if (!rc)
        *out = m;
    return rc;
}

int mp__result_take_at(mp_async_result *r, size_t k, uint32_t j, mp_msg **out)
{
    mp_msg *m, *got;
    int rc = mp_msg_create(&m);
    if (rc)
        return rc;
    rc = mp__result_take_into(r, k, j, m, &got);
    if (rc || got != m)
        mp_msg_destroy(m);
    if (!rc)
        *out = got;
    return rc;
}

int mp__result_borrow(mp_async_result *r, size_t i, const mp_msg **out)
{
    mp_msg *m;
    int rc;
    *out = NULL;
    if (!r->outs && !(r->outs = calloc(r->n, sizeof *r->outs)))
        return mp__error(MP_ENOMEM, "mp_pool: out of memory for a result of %zu items", r->n);
    if (!r->outs[i]) {
        if ((rc = mp__result_take(r, i, &m)) != 0)
            return rc;
        r->outs[i] = m;
    }
    *out = r->outs[i];
    return 0;
}

bool mp__result_item_locked(mp_async_result *r, size_t i, int rc, const char *err)
{
    if (r->done[i]) /* cannot happen: each item is answered once */
        return false;
    r->done[i] = 1;
    r->rcs[i] = rc;
    if (rc) {
        /* sentences are rare: their table comes with the first */
        if (!r->errs)
            r->errs = calloc(r->n, sizeof *r->errs);
        if (r->errs)
            r->errs[i] = strdup(err && err[0] ? err : mp_strerror(rc));
        if (i < r->first_bad)
            r->first_bad = i;
    }
    if (r->order)
        r->order[r->ndone] = i;
    r->ndone++;
    return r->ready = r->ndone == r->n;
}

bool mp__result_range_locked(mp_async_result *r, size_t start, size_t count, int rc,
                             const char *err)
{
    bool ready = false;
    if (rc || r->order) {
        for (size_t i = 0; i < count; i++)
            ready |= mp__result_item_locked(r, start + i, rc, err);
        return ready;
    }
    /* success of a whole slice of an array: rcs stay 0 */
    memset(r->done + start, 1, count);
    r->ndone += count;
    return r->ready = r->ndone == r->n;
}

const char *mp__result_err(const mp_async_result *r, size_t i)
{
    return r->errs && r->errs[i] ? r->errs[i] : mp_strerror(r->rcs[i]);
}

void mp__result_publish(mp_async_result *r)
{
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void mp__result_callback(mp_async_result *r)
{
    if (!r->has_cb)
        return;
    mp_result_fn fn = r->first_bad < r->n ? r->cb.on_error : r->cb.on_success;
    if (fn)
        fn(r, r->cb.user);
}

/* Waits under r->mu until pred holds or the deadline passes. */
int mp__result_wait_locked(mp_async_result *r, bool (*pred)(mp_async_result *, void *),
                           void *arg, double timeout)
{
    struct timespec ts;
    double deadline = mp__deadline(timeout);
    int rc = 0;
    if (deadline >= 0) {
        /* r->cv waits on CLOCK_MONOTONIC, the clock of mp__deadline */
        ts = mp__deadline_timespec(deadline);
    }
    while (!pred(r, arg) && rc == 0)
        rc = deadline < 0 ? pthread_cond_wait(&r->cv, &r->mu)
                          : pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    return pred(r, arg) ? 0 : MP_ETIMEDOUT;
}

static bool is_ready(mp_async_result *r, void *arg) { return r->ready; }

int mp_async_result_wait(mp_async_result *r, double timeout)
{
    int rc = mp__check_timeout(timeout, "mp_async_result_wait");
    if (rc < 0)
        return rc;
    if (!r)
        return mp__error(MP_EINVAL, "mp_async_result_wait: result is NULL");
    if (r->ops)
        return r->ops->wait(r->impl, timeout, "mp_async_result_wait");
    pthread_mutex_lock(&r->mu);
    rc = mp__result_wait_locked(r, is_ready, NULL, timeout);
    pthread_mutex_unlock(&r->mu);
    return rc ? mp__error(rc, "mp_async_result_wait: not ready within %g s", timeout) : 0;
}

int mp__result_first_error(const mp_async_result *r, const char *call)
{
    size_t i = r->first_bad;
    if (i >= r->n)
        return 0;
    if (r->n == 1)
        return mp__error(r->rcs[i], "%s: %s", call, mp__result_err(r, i));
    return mp__error(r->rcs[i], "%s: item %zu: %s", call, i, mp__result_err(r, i));
}

int mp_async_result_get(mp_async_result *r, double timeout, const mp_msg **out)
{
    int rc;
    if (out) /* NULL on every failure, as a queue's get */
        *out = NULL;
    if ((rc = mp__check_timeout(timeout, "mp_async_result_get")) < 0)
        return rc;
    if (!r)
        return mp__error(MP_EINVAL, "mp_async_result_get: result is NULL");
    if (r->ops)
        return mp__remote_get(r, timeout, out, "mp_async_result_get");
    pthread_mutex_lock(&r->mu);
    rc = mp__result_wait_locked(r, is_ready, NULL, timeout);
    if (rc)
        rc = mp__error(rc, "mp_async_result_get: not ready within %g s", timeout);
    else
        rc = mp__result_first_error(r, "mp_async_result_get");
    if (!rc && out && r->n && r->kind == MP__JOB_MSG)
        rc = mp__result_borrow(r, 0, out);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

bool mp_async_result_ready(const mp_async_result *r)
{
    if (!r) {
        mp__error(MP_EINVAL, "mp_async_result_ready: result is NULL");
        return false;
    }
    if (r->ops)
        return r->ops->ready(r->impl);
    mp_async_result *w = (mp_async_result *)r;
    pthread_mutex_lock(&w->mu);
    bool ready = w->ready;
    pthread_mutex_unlock(&w->mu);
    return ready;
}

int mp_async_result_successful(const mp_async_result *r)
{
    if (!r)
        return mp__error(MP_EINVAL, "mp_async_result_successful: result is NULL");
    if (r->ops)
        return mp__remote_successful(r);
    mp_async_result *w = (mp_async_result *)r;
    pthread_mutex_lock(&w->mu);
    int rc = !w->ready ? mp__error(MP_ESTATE, "mp_async_result_successful: not ready yet")
                       : w->first_bad >= w->n;
    pthread_mutex_unlock(&w->mu);
    return rc;
}

size_t mp_async_result_count(const mp_async_result *r) { return r ? r->n : 0; }

int mp_async_result_item(const mp_async_result *r, size_t i, const mp_msg **out)
{
    if (!r || !out)
        return mp__error(MP_EINVAL, "mp_async_result_item: %s is NULL", r ? "out" : "result");
    *out = NULL;
    if (r->ops)
        return mp__remote_item(r, i, out);
    mp_async_result *w = (mp_async_result *)r;
    int rc = 0;
    pthread_mutex_lock(&w->mu);
    if (!w->ready)
        rc = mp__error(MP_ESTATE, "mp_async_result_item: not ready yet");
    else if (i >= w->n)
        rc = mp__error(MP_EINVAL, "mp_async_result_item: item %zu of %zu", i, w->n);
    else if (w->rcs[i])
        rc = mp__error(w->rcs[i], "mp_async_result_item: item %zu: %s", i,
                       mp__result_err(w, i));
    else if (w->kind == MP__JOB_MSG)
        rc = mp__result_borrow(w, i, out);
    pthread_mutex_unlock(&w->mu);
    return rc;
}

const char *mp_async_result_error(const mp_async_result *r)
{
    if (!r)
        return "";
    if (r->ops)
        return mp__remote_error(r);
    mp_async_result *w = (mp_async_result *)r;
    pthread_mutex_lock(&w->mu);
    const char *e = w->ready && w->first_bad < w->n ? mp__result_err(w, w->first_bad) : "";
    pthread_mutex_unlock(&w->mu);
    return e;
}
