/* The pool: worker processes, each behind its own SOCK_SEQPACKET socket,
 * and the one result-handler thread that feeds them chunk by chunk,
 * collects results, replaces the dead and runs callbacks. */
#include "pool/pool_internal.h"
#include "process/process_internal.h"
#include "wire/wire.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mproc/process.h"

void mp__chunk_free(mp__chunk *c)
{
    if (!c)
        return;
    mp_msg_destroy(c->frame);
    mp_async_result_release(c->r);
    free(c);
}

static void wake(mp_pool *p)
{
    uint64_t one = 1;
    (void)!write(p->wake_fd, &one, sizeof one);
}

/* ---- workers ------------------------------------------------------------------ */

static void push_ready(mp_pool *p, mp_async_result *r)
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

static void fail_chunk(mp_pool *p, mp__chunk *c, int rc, const char *why)
{
    bool ready = false;
    pthread_mutex_lock(&c->r->mu);
    ready = mp__result_range_locked(c->r, c->start, c->count, rc, why);
    mp__result_publish(c->r);
    if (ready)
        push_ready(p, c->r);
    mp__chunk_free(c);
}

/* ---- chunks in flight ------------------------------------------------------------ */

static void push_cur(worker *w, mp__chunk *c)
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
static mp__chunk *pop_cur(worker *w)
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
static void worker_reap(mp_pool *p, int slot)
{
    worker *w = &p->w[slot];
    char how[MP__WHY_MAX], why[MP__WHY_MAX + 160];
    mp__worker_reap(p, slot, how, sizeof how);
    if (w->cur) {
        mp__chunk *c = pop_cur(w);
        snprintf(why, sizeof why, "pool worker %d %s while running task '%s'", slot, how,
                 c->r->task);
        fail_chunk(p, c, MP_ECHILD, why);
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
        push_ready(p, r);
    }
}

/* A result pack for the worker's current chunk. */
static void worker_result(mp_pool *p, worker *w, mp_msg *m)
{
    mp__chunk *c = pop_cur(w);
    mp_async_result *r = c->r;
    mp__pack_view v;
    size_t want = r->kind == MP__JOB_VEC ? 1 : c->count;
    int rc = mp__pack_open(m, &v);
    if (rc == 0 && (v.magic != MP__PACK_RESULT || v.count != want))
        rc = mp__error(MP_EPROTO, "pool: worker answered %u items for a chunk of %zu",
                       v.count, want);
    if (rc) {
        fail_chunk(p, c, rc, mp_last_error());
        mp__pack_close(&v);
        return;
    }
    bool ready = false;
    if (r->kind == MP__JOB_VEC) {
        vec_result(p, c, &v);
        goto done;
    }
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < v.count; i++) {
        const mp__pack_entry *e = &v.entries[i];
        mp_msg *out = NULL;
        char err[MP__WHY_MAX];
        int irc = e->rc;
        err[0] = '\0'; /* not "= {0}": 2 KiB cleared per item shows in profiles */
        if (irc) {
            snprintf(err, sizeof err, "%.*s", (int)e->err_len, v.payloads[i] + e->len);
        } else if (r->kind == MP__JOB_ARRAY) {
            if (e->len != r->out_size) {
                irc = MP_EPROTO;
                snprintf(err, sizeof err, "task '%s' set a %llu-byte result; the array wants "
                         "%zu bytes per item", r->task, (unsigned long long)e->len,
                         r->out_size);
            } else {
                memcpy((char *)r->out_array + (c->start + i) * r->out_size, v.payloads[i],
                       e->len);
            }
        } else if ((irc = mp__pack_item(&v, i, &out)) != 0) {
            snprintf(err, sizeof err, "%s", mp_last_error());
        }
        ready |= mp__result_item_locked(r, c->start + i, irc, out, err);
    }
    mp__result_publish(r);
    if (ready)
        push_ready(p, r);
done:
    mp__pack_close(&v);
    note_answer(w, c);
    mp__chunk_free(c);
    w->chunks++;
}

/* ---- the handler thread -------------------------------------------------------- */

static void run_callbacks(mp_pool *p)
{
    for (size_t i = 0; i < p->nready; i++) {
        mp__result_callback(p->ready[i]);
        mp_async_result_release(p->ready[i]);
    }
    p->nready = 0;
}

static bool any_worker(const mp_pool *p)
{
    for (int i = 0; i < p->nprocs; i++)
        if (p->w[i].proc)
            return true;
    return false;
}

/* How many chunks w may hold now: its learnt depth, but one while another
 * worker is still starting (it will be free soon: queued work waits for it,
 * as without pipelining) or while w's current chunk has already run longer
 * than the depth was learnt for (a long task among short ones). */
static unsigned depth_now(const worker *w, bool starting, double now)
{
    if (starting)
        return 1;
    if (w->cur && w->cur->sent) {
        double start = w->cur->t_sent > w->t_done ? w->cur->t_sent : w->t_done;
        if (now - start > MP__POOL_HIDE)
            return 1;
    }
    return w->depth;
}

/* Whether w may take one more chunk while filling workers to `level`. */
static bool can_take(const mp_pool *p, const worker *w, unsigned level, unsigned depth)
{
    return w->proc && w->ready && !w->exiting && w->inflight < level && level <= depth &&
           (!p->maxtasks || w->chunks + w->inflight < p->maxtasks);
}

/* Sends w's chunks not sent yet. The first to an idle worker may wait (it
 * reads at once); one behind it must not, since the worker may itself be
 * blocked writing an answer that this thread reads: on a full socket w waits
 * for POLLOUT. Any other failure means the worker died: its pidfd reports
 * it, and the chunks fail or go again there. */
static void send_pending(worker *w)
{
    for (mp__chunk *c = w->cur; c && !w->blocked; c = c->next) {
        if (c->sent)
            continue;
        int rc = mp_conn_send(w->conn, c->frame, c == w->cur ? -1 : 0);
        if (rc == MP_EAGAIN || rc == MP_ETIMEDOUT) {
            w->blocked = true;
            break;
        }
        c->sent = true;
        c->t_sent = mp__now();
    }
}

/* Hands queued chunks to ready workers, level by level so that they spread
 * evenly, each up to its depth; returns whether work remains anywhere
 * (queued or running). With no worker left at all (every slot failed to
 * start), queued work fails with the reason. */
static bool dispatch(mp_pool *p, int *state)
{
    mp__chunk *orphans = NULL;
    bool busy, starting = false;
    double now = mp__now();
    for (int i = 0; i < p->nprocs; i++)
        starting |= p->w[i].proc && !p->w[i].ready;
    pthread_mutex_lock(&p->mu);
    *state = p->state;
    for (unsigned lv = 1; lv <= MP__POOL_DEPTH_MAX && p->head; lv++) {
        for (int i = 0; i < p->nprocs && p->head && *state != MP__POOL_TERMINATED; i++) {
            worker *w = &p->w[i];
            if (!can_take(p, w, lv, depth_now(w, starting, now)))
                continue;
            mp__chunk *c = p->head;
            p->head = c->next;
            if (!p->head)
                p->tail = NULL;
            push_cur(w, c);
        }
    }
    if (p->started && !any_worker(p)) {
        orphans = p->head;
        p->head = p->tail = NULL;
    }
    busy = p->head != NULL;
    pthread_mutex_unlock(&p->mu);
    while (orphans) {
        mp__chunk *next = orphans->next;
        fail_chunk(p, orphans, MP_ECHILD, p->start_error);
        orphans = next;
    }
    for (int i = 0; i < p->nprocs; i++) {
        worker *w = &p->w[i];
        if (w->proc)
            send_pending(w);
        busy = busy || w->cur;
    }
    return busy;
}

static void terminate_all(mp_pool *p)
{
    mp__chunk *c;
    pthread_mutex_lock(&p->mu);
    c = p->head;
    p->head = p->tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (c) {
        mp__chunk *next = c->next;
        fail_chunk(p, c, MP_ECLOSED, "the pool was terminated before this task ran");
        c = next;
    }
    for (int i = 0; i < p->nprocs; i++)
        if (p->w[i].proc)
            mp_process_kill(p->w[i].proc);
    for (int i = 0; i < p->nprocs; i++) {
        if (!p->w[i].proc)
            continue;
        mp__chunk *c;
        bool first = true;
        while ((c = pop_cur(&p->w[i])) != NULL) {
            fail_chunk(p, c, MP_ECLOSED, first ? "the pool was terminated while this task "
                       "ran" : "the pool was terminated before this task ran");
            first = false;
        }
        worker_reap(p, i);
    }
}

/* Reads every message waiting on a worker's socket. */
static void drain(mp_pool *p, worker *w)
{
    mp_msg *m;
    while (w->proc && mp_conn_recv(w->conn, &m, 0) == 0) {
        if (!w->ready)
            w->ready = true; /* its first message: the initializer ran */
        else if (w->cur)
            worker_result(p, w, m);
        mp_msg_destroy(m);
    }
}

static void replace(mp_pool *p, int slot)
{
    worker *w = &p->w[slot];
    if (w->failures >= MP__POOL_START_TRIES) {
        mp__log(MP_LOG_ERROR, "mp_pool: giving up worker %d: %s", slot, p->start_error);
        return;
    }
    if (mp__worker_start(p, slot) != 0) {
        snprintf(p->start_error, sizeof p->start_error, "could not start pool worker %d: %s",
                 slot, mp_last_error());
        w->failures++;
        mp__log(MP_LOG_ERROR, "mp_pool: %s", p->start_error);
    }
}

static void handle_events(mp_pool *p, struct pollfd *fds, bool running)
{
    for (int i = 0; i < p->nprocs; i++) {
        worker *w = &p->w[i];
        struct pollfd *s = &fds[1 + 2 * i], *d = &fds[2 + 2 * i];
        if (!w->proc)
            continue;
        if (s->revents & POLLOUT)
            w->blocked = false;
        if (s->revents & POLLIN)
            drain(p, w);
        if (!w->exiting && p->maxtasks && w->chunks >= p->maxtasks && !w->cur)
            mp__worker_send_exit(w);
        if (d->revents & POLLIN) { /* its pidfd: the worker ended */
            drain(p, w);
            worker_reap(p, i);
            if (running)
                replace(p, i);
        }
    }
}

/* Waits for and polls the workers once. */
static void poll_once(mp_pool *p, struct pollfd *fds, bool running)
{
    fds[0] = (struct pollfd){p->wake_fd, POLLIN, 0};
    for (int i = 0; i < p->nprocs; i++) {
        worker *w = &p->w[i];
        short ev = (short)(POLLIN | (w->blocked ? POLLOUT : 0));
        fds[1 + 2 * i] = (struct pollfd){w->proc ? w->sock : -1, ev, 0};
        fds[2 + 2 * i] = (struct pollfd){w->proc ? w->pidfd : -1, POLLIN, 0};
    }
    if (poll(fds, 1 + 2 * (nfds_t)p->nprocs, -1) < 0)
        return; /* EINTR */
    if (fds[0].revents & POLLIN) {
        uint64_t v;
        (void)!read(p->wake_fd, &v, sizeof v);
    }
    handle_events(p, fds, running);
}

/* Starts every worker and waits until all are ready: 0, or the error of
 * the first that could not start or died first. */
static int start_all(mp_pool *p, struct pollfd *fds)
{
    int rc = 0, ready;
    for (int i = 0; i < p->nprocs && !rc; i++)
        rc = mp__worker_start(p, i);
    if (rc)
        return rc;
    for (;;) {
        ready = 0;
        for (int i = 0; i < p->nprocs; i++) {
            if (!p->w[i].proc)
                return mp__error(MP_ECHILD, "%s", p->start_error);
            ready += p->w[i].ready;
        }
        if (ready == p->nprocs)
            return 0;
        poll_once(p, fds, false);
    }
}

static void *handler_main(void *arg)
{
    mp_pool *p = arg;
    struct pollfd *fds = calloc(1 + 2 * (size_t)p->nprocs, sizeof *fds);
    int state = MP__POOL_RUN;
    int rc = fds ? start_all(p, fds) : mp__error(MP_ENOMEM, "mp_pool_create: out of memory");
    char why[MP__WHY_MAX + 64];

    snprintf(why, sizeof why, "%s", mp_last_error());
    pthread_mutex_lock(&p->mu);
    p->start_rc = rc;
    p->started = true;
    if (rc) {
        p->state = MP__POOL_TERMINATED;
        snprintf(p->start_error, sizeof p->start_error, "%s", why);
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);

    for (;;) {
        bool busy = dispatch(p, &state);
        run_callbacks(p);
        if (state == MP__POOL_TERMINATED) {
            terminate_all(p);
            break;
        }
        if (state == MP__POOL_CLOSED && !busy) {
            for (int i = 0; i < p->nprocs; i++)
                if (p->w[i].proc && !p->w[i].exiting)
                    mp__worker_send_exit(&p->w[i]);
            for (int i = 0; i < p->nprocs; i++)
                if (p->w[i].proc)
                    worker_reap(p, i);
            break;
        }
        poll_once(p, fds, state == MP__POOL_RUN || busy);
    }
    run_callbacks(p);
    free(fds);
    pthread_mutex_lock(&p->mu);
    p->finished = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the public lifecycle -------------------------------------------------------- */

void mp_pool_options_init(mp_pool_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->version = MP_POOL_OPTIONS_VERSION;
}

static int check_options(const mp_pool_options *o)
{
    mp_context *ctx;
    if (o->version != MP_POOL_OPTIONS_VERSION)
        return mp__error(MP_EINVAL, "mp_pool_create: options not set up by "
                         "mp_pool_options_init (version %u)", o->version);
    if (o->start_method && mp_get_context(o->start_method, &ctx) != 0)
        return mp__error(MP_ENOENT, "mp_pool_create: unknown start method '%s' (fork, spawn "
                         "or forkserver)", o->start_method);
    if (o->initializer && !mp__entry_lookup(o->initializer))
        return mp__error(MP_ENOENT, "mp_pool_create: no entry called '%s' for the "
                         "initializer (define it with MP_ENTRY)", o->initializer);
    return 0;
}

/* Copies what the options point to: the pool outlives the caller's strings. */
static int copy_options(mp_pool *p, const mp_pool_options *o)
{
    p->maxtasks = o->maxtasksperchild;
    if ((o->start_method && !(p->start_method = strdup(o->start_method))) ||
        (o->initializer && !(p->initializer = strdup(o->initializer))))
        return mp__error(MP_ENOMEM, "mp_pool_create: out of memory copying the options");
    if (o->initargs) {
        size_t len;
        const void *pl = mp_msg_payload(o->initargs, &len);
        int rc = mp_msg_create(&p->initargs);
        if (!rc)
            rc = mp_msg_set_payload(p->initargs, pl, len);
        if (!rc)
            rc = mp__msg_copy_attachments(o->initargs, 0, mp_msg_count(o->initargs),
                                          p->initargs);
        return rc;
    }
    return 0;
}

static void pool_free(mp_pool *p)
{
    mp_tensor_release(p->vcache[0]);
    mp_tensor_release(p->vcache[1]);
    free(p->ready);
    mp__close(p->wake_fd);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->start_method);
    free(p->initializer);
    mp_msg_destroy(p->initargs);
    free(p->w);
    free(p);
}

static int pool_alloc(int nprocs, const mp_pool_options *opts, mp_pool **out)
{
    mp_pool *p = calloc(1, sizeof *p);
    if (!p)
        return mp__error(MP_ENOMEM, "mp_pool_create: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->wake_fd = -1;
    p->nprocs = nprocs;
    p->w = calloc((size_t)nprocs, sizeof *p->w);
    /* copy_options' sentence stands: copying initargs' attachments can fail
     * for other reasons than memory (a tensor that cannot be shared). */
    int rc = p->w ? copy_options(p, opts)
                  : mp__error(MP_ENOMEM, "mp_pool_create: out of memory");
    if (rc) {
        pool_free(p);
        return rc;
    }
    for (int i = 0; i < nprocs; i++)
        p->w[i].sock = p->w[i].pidfd = -1;
    p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->wake_fd < 0) {
        rc = mp__errno_error(errno, "mp_pool_create: eventfd");
        pool_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int mp_pool_create(int nprocs, const mp_pool_options *opts, mp_pool **out)
{
    mp_pool_options defaults;
    mp_pool *p = NULL;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_pool_create: out is NULL");
    *out = NULL;
    if (!opts) {
        mp_pool_options_init(&defaults);
        opts = &defaults;
    }
    if ((rc = check_options(opts)) != 0)
        return rc;
    if (nprocs < 0 || nprocs > 4096)
        return mp__error(MP_EINVAL, "mp_pool_create: nprocs = %d, want 0 (one per CPU) .. "
                         "4096", nprocs);
    if (nprocs == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nprocs = n > 0 ? (int)n : 1;
    }
    if ((rc = pool_alloc(nprocs, opts, &p)) != 0)
        return rc;
    rc = pthread_create(&p->thread, NULL, handler_main, p);
    if (rc) {
        rc = mp__errno_error(rc, "mp_pool_create: pthread_create");
        pool_free(p);
        return rc;
    }
    pthread_mutex_lock(&p->mu);
    while (!p->started)
        pthread_cond_wait(&p->cv, &p->mu);
    rc = p->start_rc;
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        char why[sizeof p->start_error];
        snprintf(why, sizeof why, "%s", p->start_error);
        mp_pool_destroy(p);
        return mp__error(rc, "mp_pool_create: starting the workers: %s", why);
    }
    *out = p;
    return 0;
}

static int set_state(mp_pool *p, int state, const char *call)
{
    if (!p)
        return mp__error(MP_EINVAL, "%s: pool is NULL", call);
    pthread_mutex_lock(&p->mu);
    if (p->state < state)
        p->state = state;
    pthread_mutex_unlock(&p->mu);
    wake(p);
    return 0;
}

int mp_pool_close(mp_pool *p) { return set_state(p, MP__POOL_CLOSED, "mp_pool_close"); }

int mp_pool_terminate(mp_pool *p)
{
    return set_state(p, MP__POOL_TERMINATED, "mp_pool_terminate");
}

int mp_pool_join(mp_pool *p)
{
    bool do_join;
    if (!p)
        return mp__error(MP_EINVAL, "mp_pool_join: pool is NULL");
    if (pthread_equal(pthread_self(), p->thread))
        return mp__error(MP_ESTATE, "mp_pool_join: called from a callback (the handler "
                         "thread would wait for itself)");
    pthread_mutex_lock(&p->mu);
    if (p->state == MP__POOL_RUN) {
        pthread_mutex_unlock(&p->mu);
        return mp__error(MP_ESTATE, "mp_pool_join: call mp_pool_close or mp_pool_terminate "
                         "first");
    }
    while (!p->finished)
        pthread_cond_wait(&p->cv, &p->mu);
    do_join = !p->joined;
    p->joined = true;
    pthread_mutex_unlock(&p->mu);
    if (do_join)
        pthread_join(p->thread, NULL);
    return 0;
}

int mp_pool_size(const mp_pool *p)
{
    if (!p)
        return mp__error(MP_EINVAL, "mp_pool_size: pool is NULL");
    return p->nprocs;
}

void mp_pool_destroy(mp_pool *p)
{
    if (!p)
        return;
    if (pthread_equal(pthread_self(), p->thread)) {
        /* From a callback the handler would free itself: refuse (and leak). */
        mp__log(MP_LOG_ERROR, "mp_pool_destroy: called from a callback; ignored");
        return;
    }
    pthread_mutex_lock(&p->mu);
    bool run = p->state == MP__POOL_RUN;
    pthread_mutex_unlock(&p->mu);
    if (run)
        mp_pool_terminate(p);
    mp_pool_join(p);
    pool_free(p);
}

int mp__pool_submit(mp_pool *p, mp__chunk *head, mp__chunk *tail)
{
    pthread_mutex_lock(&p->mu);
    if (p->state != MP__POOL_RUN) {
        pthread_mutex_unlock(&p->mu);
        while (head) {
            mp__chunk *next = head->next;
            mp__chunk_free(head);
            head = next;
        }
        return mp__error(MP_ESTATE, "mp_pool: the pool is closed or terminated");
    }
    if (p->tail)
        p->tail->next = head;
    else
        p->head = head;
    p->tail = tail;
    pthread_mutex_unlock(&p->mu);
    wake(p);
    return 0;
}

size_t mp__pool_chunksize(const mp_pool *p, size_t n, size_t chunksize)
{
    size_t div = 4 * (size_t)p->nprocs;
    if (chunksize)
        return chunksize;
    chunksize = (n + div - 1) / div;
    return chunksize ? chunksize : 1;
}
