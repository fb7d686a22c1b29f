/* The pool: worker processes, each behind its own SOCK_SEQPACKET socket,
 * and the one result-handler thread that feeds them chunk by chunk,
 * collects results, replaces the dead and runs callbacks. */
#include "pool/pool_internal.h"
#include "wire/objects.h"
#include "process/process_internal.h"

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
    mp_msg_destroy(c->frame); /* its buffer is kept for the next chunks */
    mp_async_result_release(c->r);
    free(c);
}

static void wake(mp_pool *p)
{
    uint64_t one = 1;
    (void)!write(p->wake_fd, &one, sizeof one);
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
 * than the depth was learnt for (a long task among short ones: more than
 * twice its usual time, and more than MP__POOL_HIDE). */
static unsigned depth_now(const worker *w, bool starting, double now)
{
    if (starting)
        return 1;
    if (w->cur && w->cur->sent) {
        double start = w->cur->t_sent > w->t_done ? w->cur->t_sent : w->t_done;
        if (now - start > MP__POOL_HIDE + 2 * w->svc)
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
            mp__cur_push(w, c);
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
        mp__chunk_fail(p, orphans, MP_ECHILD, p->start_error);
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
        mp__chunk_fail(p, c, MP_ECLOSED, "the pool was terminated before this task ran");
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
        while ((c = mp__cur_pop(&p->w[i])) != NULL) {
            mp__chunk_fail(p, c, MP_ECLOSED, first ? "the pool was terminated while this task "
                       "ran" : "the pool was terminated before this task ran");
            first = false;
        }
        mp__worker_ended(p, i);
    }
}

/* Reads every message waiting on a worker's socket. */
static void drain(mp_pool *p, worker *w)
{
    mp_msg *m;
    while (w->proc && mp_conn_recv(w->conn, &m, 0) == 0) {
        if (!w->ready)
            w->ready = true; /* its first message: the initializer ran */
        else if (w->cur) {
            mp__worker_answer(p, w, m); /* takes m */
            continue;
        }
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
            mp__worker_ended(p, i);
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
                    mp__worker_ended(p, i);
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
    o->size = sizeof *o;
}

static int check_options(const mp_pool_options *o)
{
    mp_context *ctx = NULL;
    int rc;
    if (o->start_method && mp_get_context(o->start_method, &ctx) != 0)
        return mp__error(MP_ENOENT, "mp_pool_create: unknown start method '%s' (fork, spawn "
                         "or forkserver)", o->start_method);
    if (o->initializer &&
        (rc = mp__entry_check(o->initializer, "initializer", "mp_pool_create")) < 0)
        return rc;
    if ((o->start_method ? ctx->method : mp__method_default()) == MP__FORK)
        return 0;
    return mp__setup_check("mp_pool_create");
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
    mp__pool_untrack(p);
    mp_tensor_release(p->vcache[0]);
    mp_tensor_release(p->vcache[1]);
    free(p->ready);
    free(p->scratch);
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
    mp_pool_options copy;
    mp_pool *p = NULL;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_pool_create: out is NULL");
    *out = NULL;
    if (!opts)
        mp_pool_options_init(&copy);
    else if ((rc = mp__struct_in(&copy, sizeof copy, opts, "mp_pool_create",
                                 "mp_pool_options")) != 0)
        return rc;
    opts = &copy;
    if ((rc = mp__registry_check("mp_pool_create")) != 0 || (rc = check_options(opts)) != 0 ||
        (rc = mp__sigchld_check("mp_pool_create")) != 0)
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
    mp__pool_track(p);
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

int mp_pool_close(mp_pool *p)
{
    if (p && p->ops)
        return p->ops->close(p->impl, "mp_pool_close");
    return set_state(p, MP__POOL_CLOSED, "mp_pool_close");
}

int mp_pool_terminate(mp_pool *p)
{
    if (p && p->ops)
        return p->ops->terminate(p->impl, "mp_pool_terminate");
    return set_state(p, MP__POOL_TERMINATED, "mp_pool_terminate");
}

int mp_pool_join(mp_pool *p)
{
    bool do_join;
    if (!p)
        return mp__error(MP_EINVAL, "mp_pool_join: pool is NULL");
    if (p->ops)
        return p->ops->join(p->impl, "mp_pool_join");
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
    return p->ops ? p->ops->size(p->impl) : p->nprocs;
}

void mp_pool_destroy(mp_pool *p)
{
    if (!p)
        return;
    if (p->ops) {
        p->ops->destroy(p->impl);
        free(p);
        return;
    }
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

int mp__pool_submit(mp_pool *p, mp__chunk *head, mp__chunk *tail, const char *call)
{
    pthread_mutex_lock(&p->mu);
    if (p->state != MP__POOL_RUN) {
        bool closed = p->state == MP__POOL_CLOSED;
        pthread_mutex_unlock(&p->mu);
        while (head) {
            mp__chunk *next = head->next;
            mp__chunk_free(head);
            head = next;
        }
        return mp__error(MP_ESTATE, "%s: the pool was %s; submit work before that, or "
                                    "create a new pool", call,
                         closed ? "closed (mp_pool_close)" : "terminated (mp_pool_terminate)");
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

size_t mp__pool_chunksize(const mp_pool *p, size_t n, size_t chunksize, size_t item_bytes)
{
    size_t div = 4 * (size_t)p->nprocs;
    if (chunksize)
        return chunksize;
    chunksize = (n + div - 1) / div;
    /* Small items: at most as many as keep the chunk's record inline (no
     * spill segment to create, fault in and unmap on each side, which cost
     * more CPU than the items themselves), when that still leaves enough
     * items per chunk to amortize its round trip. */
    if (item_bytes) {
        size_t cap = MP__POOL_INLINE_BUDGET / (sizeof(mp__pack_entry) + item_bytes);
        if (cap >= MP__POOL_INLINE_MIN_ITEMS && chunksize > cap)
            chunksize = cap;
    }
    return chunksize ? chunksize : 1;
}
