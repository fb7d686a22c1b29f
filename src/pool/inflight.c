/* Chunks in flight: the pool's bookkeeping of what each worker holds, its
 * answers (results back into the async results), and its end (the chunk it
 * ran fails, the ones it never read go back to the queue). Handler thread. */
#include "pool/pool_internal.h"
#include "process/process_internal.h"
#include "wire/objects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mp__pool_push_ready(mp_pool *p, mp_async_result *r)
{
    if (p->nready == p->ready_cap) {
        size_t cap = p->ready_cap ? p->ready_cap * 2 : 16;
        mp_async_result **q = realloc(p->ready, cap * sizeof *q);
        if (!q)
            return; /* the result is ready; only its callback is lost */
        p->ready = q;
        p->ready_cap = cap;
    }
    p->ready[p->nready++] = mp_async_result_retain(r);
}

void mp__chunk_fail(mp_pool *p, mp__chunk *c, int rc, const char *why)
{
    bool ready = false;
    pthread_mutex_lock(&c->r->mu);
    ready = mp__result_range_locked(c->r, c->start, c->count, rc, why);
    mp__result_publish(c->r);
    if (ready)
        mp__pool_push_ready(p, c->r);
    mp__chunk_free(c);
}

/* ---- chunks in flight ------------------------------------------------------------ */

void mp__cur_push(worker *w, mp__chunk *c)
{
    c->next = NULL;
    c->sent = false;
    if (w->last)
        w->last->next = c;
    else
        w->cur = c;
    w->last = c;
    w->inflight++;
}

/* Takes the oldest chunk in flight (the one the worker runs) off w. */
mp__chunk *mp__cur_pop(worker *w)
{
    mp__chunk *c = w->cur;
    if (c) {
        w->cur = c->next;
        if (!w->cur)
            w->last = NULL;
        c->next = NULL;
        w->inflight--;
    }
    return c;
}

/* Puts w's chunks in flight back at the head of the queue, in order. Only
 * for chunks the worker never read: those after the one it ran. */
static void requeue(mp_pool *p, worker *w)
{
    mp__chunk *first = w->cur, *last = w->last;
    if (!first)
        return;
    for (mp__chunk *c = first; c; c = c->next)
        c->sent = false;
    w->cur = w->last = NULL;
    w->inflight = 0;
    pthread_mutex_lock(&p->mu);
    last->next = p->head;
    p->head = first;
    if (!p->tail)
        p->tail = last;
    pthread_mutex_unlock(&p->mu);
}

/* Reaps the worker in slot (its process has ended), failing the chunk it
 * was running with how it ended; the chunks queued behind it go to others. */
void mp__worker_ended(mp_pool *p, int slot)
{
    worker *w = &p->w[slot];
    char how[MP__WHY_MAX], why[MP__WHY_MAX + MP__TASK_NAME_MAX + 64];
    mp__worker_reap(p, slot, how, sizeof how);
    if (w->cur) {
        mp__chunk *c = mp__cur_pop(w);
        snprintf(why, sizeof why, "pool worker %d %s while running task '%s'", slot, how,
                 c->r->task);
        mp__chunk_fail(p, c, MP_ECHILD, why);
        requeue(p, w);
    }
    w->blocked = false;
    if (!w->ready) {
        /* died before it could serve: remember why, stop after a few tries */
        snprintf(p->start_error, sizeof p->start_error, "pool worker %d %s before it was "
                 "ready", slot, how);
        w->failures++;
    } else {
        w->failures = 0;
    }
}

/* Learns how long w takes per chunk and sets how many it may hold. A chunk
 * starts when it was sent or when the one before it was answered,
 * whichever is later. */
static void note_answer(worker *w, const mp__chunk *c)
{
    double now = mp__now(), start = c->t_sent > w->t_done ? c->t_sent : w->t_done;
    double s = now - start, d;
    w->svc = w->svc > 0 ? 0.75 * w->svc + 0.25 * s : s;
    w->t_done = now;
    d = 1 + MP__POOL_HIDE / (w->svc + 1e-9);
    if (w->svc < MP__POOL_SHORT && d < 2)
        d = 2;
    w->depth = d >= MP__POOL_DEPTH_MAX ? MP__POOL_DEPTH_MAX : (unsigned)d;
}

mp_tensor *mp__pool_vec_take(mp_pool *p, int which, size_t bytes)
{
    mp_tensor *t = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->vcache[which] && mp_tensor_nbytes(p->vcache[which]) >= bytes) {
        t = p->vcache[which];
        p->vcache[which] = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    return t;
}

/* VEC: a finished call's shared arrays go to the cache (every chunk was
 * answered: no worker reads or writes them any more); the larger pair wins. */
static void vec_recycle(mp_pool *p, mp_async_result *r)
{
    mp_tensor *t[2] = {r->vin, r->vout}, *old[2] = {NULL, NULL};
    r->vin = r->vout = NULL;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < 2; i++) {
        if (p->vcache[i] && mp_tensor_nbytes(p->vcache[i]) >= mp_tensor_nbytes(t[i])) {
            old[i] = t[i];
        } else {
            old[i] = p->vcache[i];
            p->vcache[i] = t[i];
        }
    }
    pthread_mutex_unlock(&p->mu);
    mp_tensor_release(old[0]);
    mp_tensor_release(old[1]);
}

/* VEC: the chunk's one answer covers its slice: copy the slice out of the
 * shared array into the caller's, or fail every item of it. */
static void vec_result(mp_pool *p, const mp__chunk *c, const mp__pack_view *v)
{
    mp_async_result *r = c->r;
    const mp__pack_entry *e = &v->entries[0];
    char err[MP__WHY_MAX];
    bool ready = false;
    err[0] = '\0';
    if (e->rc)
        snprintf(err, sizeof err, "%.*s", (int)e->err_len, v->payloads[0] + e->len);
    else
        memcpy((char *)r->out_array + c->start * r->out_size,
               (const char *)mp_tensor_data(r->vout) + c->start * r->out_size,
               c->count * r->out_size);
    pthread_mutex_lock(&r->mu);
    ready = mp__result_range_locked(r, c->start, c->count, e->rc, err);
    mp__result_publish(r);
    if (ready) {
        vec_recycle(p, r);
        mp__pool_push_ready(p, r);
    }
}

/* Records the items of an answered chunk (under r->mu): failures with
 * their sentences; ARRAY results copied to the caller's array; MSG results
 * stay in the answer, which r keeps (f, NULL when nothing succeeded). */
static bool record_items(mp_async_result *r, const mp__chunk *c, const mp__pack_view *v,
                         mp__result_frame *f)
{
    bool ready = false;
    uint32_t bad = 0;
    if (f)
        r->frames[c->start / r->chunk] = f;
    if (r->kind == MP__JOB_MSG) { /* all succeeded, the common case: one range */
        while (bad < v->count && v->entries[bad].rc == 0)
            bad++;
        if (bad == v->count)
            return mp__result_range_locked(r, c->start, v->count, 0, NULL);
    }
    for (uint32_t i = 0; i < v->count; i++) {
        const mp__pack_entry *e = &v->entries[i];
        char err[MP__WHY_MAX];
        int irc = e->rc;
        err[0] = '\0'; /* not "= {0}": 2 KiB cleared per item shows in profiles */
        if (irc) {
            snprintf(err, sizeof err, "%.*s", (int)e->err_len, v->payloads[i] + e->len);
        } else if (r->kind == MP__JOB_ARRAY) {
            if (e->len != r->out_size) {
                irc = MP_EPROTO;
                snprintf(err, sizeof err, "task '%s' set a %llu-byte result; the array wants "
                         "%zu bytes per item", r->task, (unsigned long long)e->len,
                         r->out_size);
            } else {
                memcpy((char *)r->out_array + (c->start + i) * r->out_size, v->payloads[i],
                       e->len);
            }
        }
        ready |= mp__result_item_locked(r, c->start + i, irc, err);
    }
    return ready;
}

/* MSG: the answer kept whole (f takes m), for a chunk with
 * some item that succeeded; NULL with *rc set when it cannot be kept. */
static mp__result_frame *keep_answer(const mp_async_result *r, const mp__chunk *c, mp_msg *m,
                                     const mp__pack_view *v, int *rc)
{
    size_t k = c->start / r->chunk;
    mp__result_frame *f = NULL;
    if (r->frames && k < r->nframes && !r->frames[k] && (f = malloc(sizeof *f)) != NULL) {
        f->msg = m;
        f->next = 0;
        f->off = (size_t)(v->payloads[0] - (const char *)mp_msg_payload(m, NULL));
        f->att = 0;
        f->open = false; /* the taker opens it if need be: its memory, not ours */
        return f;
    }
    *rc = mp__error(MP_ENOMEM, "pool: out of memory keeping a chunk's results");
    return NULL;
}

static bool any_success(const mp__pack_view *v)
{
    for (uint32_t i = 0; i < v->count; i++)
        if (v->entries[i].rc == 0)
            return true;
    return false;
}

/* A result pack for the worker's current chunk (takes m). */
void mp__worker_answer(mp_pool *p, worker *w, mp_msg *m)
{
    mp__chunk *c = mp__cur_pop(w);
    mp_async_result *r = c->r;
    mp__pack_view v;
    mp__result_frame *f = NULL;
    size_t want = r->kind == MP__JOB_VEC ? 1 : c->count;
    /* the tables in the handler's scratch: no allocation per answer here */
    int rc = mp__pack_open_into(m, &v, &p->scratch, &p->scratch_cap);
    if (rc == 0 && (v.magic != MP__PACK_RESULT || v.count != want))
        rc = mp__error(MP_EPROTO, "pool: worker answered %u items for a chunk of %zu",
                       v.count, want);
    if (rc == 0 && r->kind == MP__JOB_MSG && any_success(&v))
        f = keep_answer(r, c, m, &v, &rc);
    if (rc) {
        mp__chunk_fail(p, c, rc, mp_last_error());
        mp__pack_close(&v);
        mp_msg_destroy(m);
        return;
    }
    if (r->kind == MP__JOB_VEC) {
        vec_result(p, c, &v);
    } else {
        pthread_mutex_lock(&r->mu);
        bool ready = record_items(r, c, &v, f);
        mp__result_publish(r);
        if (ready)
            mp__pool_push_ready(p, r);
    }
    mp__pack_close(&v);
    if (!f) /* else r keeps it */
        mp_msg_destroy(m);
    note_answer(w, c);
    mp__chunk_free(c);
    w->chunks++;
}
