/* The pool: worker processes, each behind its own SOCK_SEQPACKET socket,
 * and the one result-handler thread that feeds them chunk by chunk,
 * collects results, replaces the dead and runs callbacks. */
#include "pool/pool_internal.h"
#include "wire/wire.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

enum { RUN = 0, CLOSED = 1, TERMINATED = 2 };

typedef struct worker {
    pid_t pid;     /* 0: no process in this slot */
    int sock;      /* parent's end */
    int pidfd;     /* readable when the process has ended; -1 if unsupported */
    mp__chunk *cur;
    unsigned chunks; /* completed, for maxtasksperchild */
    bool exiting;    /* asked to exit (retired or closing) */
} worker;

struct mp_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nprocs;
    unsigned maxtasks;
    int state;        /* under mu */
    bool finished;    /* handler thread done (under mu) */
    bool joined;      /* pthread_join done (under mu) */
    int start_rc;     /* the first start's outcome (under mu) */
    bool started;
    mp__chunk *head, *tail; /* queued (under mu) */
    int wake_fd;
    pthread_t thread;
    worker *w;        /* handler thread only */
    mp_async_result **ready; /* handler thread: completed results awaiting callbacks */
    size_t nready, ready_cap;
};

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

/* ---- workers ----------------------------------------------------------------- */

static int worker_start(mp_pool *p, int slot)
{
    worker *w = &p->w[slot];
    int sv[2] = {-1, -1}, rc;
    pid_t parent = getpid(), pid;

    if (mp__sys.socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return mp__errno_error(errno, "mp_pool: socketpair for worker %d", slot);
    pid = fork();
    if (pid < 0) {
        rc = mp__errno_error(errno, "mp_pool: fork of worker %d", slot);
        mp__close(sv[0]);
        mp__close(sv[1]);
        return rc;
    }
    if (pid == 0) {
        /* Die with the handler thread's process; close the parent's ends. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        close(p->wake_fd);
        for (int i = 0; i < p->nprocs; i++) {
            if (p->w[i].pid) {
                close(p->w[i].sock);
                if (p->w[i].pidfd >= 0)
                    close(p->w[i].pidfd);
            }
        }
        close(sv[0]);
        /* A crash must end the worker, so the pool can report its signal:
         * handlers inherited from the parent (a test runner's, say) go. */
        static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS};
        for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
            signal(fatal[i], SIG_DFL);
        _exit(mp__pool_worker_main(sv[1]));
    }
    mp__close(sv[1]);
    w->pid = pid;
    w->sock = sv[0];
    w->pidfd = mp__pidfd_open(pid);
    w->cur = NULL;
    w->chunks = 0;
    w->exiting = false;
    return 0;
}

/* Names how a worker ended, e.g. "was killed by signal 9 (SIGKILL)". */
static void describe_status(int st, char *buf, size_t cap)
{
    if (WIFSIGNALED(st)) {
        int sig = WTERMSIG(st);
        const char *abbrev = sigabbrev_np(sig);
        snprintf(buf, cap, "was killed by signal %d (SIG%s)", sig, abbrev ? abbrev : "?");
    } else {
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(st));
    }
}

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
    for (size_t i = 0; i < c->count; i++)
        if (mp__result_item(c->r, c->start + i, rc, NULL, why))
            push_ready(p, c->r);
    mp__chunk_free(c);
}

/* Reaps the worker in slot (its process has ended or is ending), failing
 * the chunk it was running. */
static void worker_reap(mp_pool *p, int slot, const char *context)
{
    worker *w = &p->w[slot];
    char how[96], why[256];
    int st = 0;
    while (waitpid(w->pid, &st, 0) < 0 && errno == EINTR)
        ;
    describe_status(st, how, sizeof how);
    if (w->cur) {
        snprintf(why, sizeof why, "pool worker %d (pid %d) %s while running task '%s'%s",
                 slot, (int)w->pid, how, w->cur->r->task, context);
        fail_chunk(p, w->cur, MP_ECHILD, why);
        w->cur = NULL;
    }
    mp__close(w->sock);
    mp__close(w->pidfd);
    w->pid = 0;
    w->sock = w->pidfd = -1;
}

/* A result pack for the worker's current chunk. */
static void worker_result(mp_pool *p, worker *w, mp_msg *m)
{
    mp__chunk *c = w->cur;
    mp_async_result *r = c->r;
    mp__pack_view v;
    int rc = mp__pack_open(m, &v);
    if (rc == 0 && (v.magic != MP__PACK_RESULT || v.count != c->count))
        rc = mp__error(MP_EPROTO, "pool: worker answered %u items for a chunk of %zu",
                       v.count, c->count);
    if (rc) {
        fail_chunk(p, c, rc, mp_last_error());
        mp__pack_close(&v);
        w->cur = NULL;
        return;
    }
    for (uint32_t i = 0; i < v.count; i++) {
        const mp__pack_entry *e = &v.entries[i];
        mp_msg *out = NULL;
        char err[512] = "";
        int irc = e->rc;
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
        if (mp__result_item(r, c->start + i, irc, out, err))
            push_ready(p, r);
    }
    mp__pack_close(&v);
    mp__chunk_free(c);
    w->cur = NULL;
    w->chunks++;
}

static int send_exit(worker *w)
{
    mp__packer pk;
    mp_msg *m = NULL;
    int rc = mp__packer_init(&pk, MP__PACK_EXIT, NULL, 0);
    if (!rc)
        rc = mp__packer_finish(&pk, &m);
    if (!rc)
        rc = mp__wire_send(w->sock, m, -1);
    mp_msg_destroy(m);
    w->exiting = true;
    return rc;
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

/* Hands queued chunks to idle workers; returns whether work remains
 * anywhere (queued or running). */
static bool dispatch(mp_pool *p, int *state)
{
    bool busy = false;
    pthread_mutex_lock(&p->mu);
    *state = p->state;
    for (int i = 0; i < p->nprocs && *state != TERMINATED; i++) {
        worker *w = &p->w[i];
        if (w->pid && !w->cur && !w->exiting && p->head) {
            w->cur = p->head;
            p->head = p->head->next;
            if (!p->head)
                p->tail = NULL;
        }
    }
    busy = p->head != NULL;
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nprocs; i++) {
        worker *w = &p->w[i];
        if (w->cur && w->cur->frame) {
            /* A send that fails means the worker died: its pidfd reports it
             * and the chunk fails there. */
            mp__wire_send(w->sock, w->cur->frame, -1);
            mp_msg_destroy(w->cur->frame);
            w->cur->frame = NULL;
        }
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
        if (p->w[i].pid)
            kill(p->w[i].pid, SIGKILL);
    for (int i = 0; i < p->nprocs; i++) {
        if (!p->w[i].pid)
            continue;
        if (p->w[i].cur) {
            fail_chunk(p, p->w[i].cur, MP_ECLOSED, "the pool was terminated while this task "
                       "ran");
            p->w[i].cur = NULL;
        }
        worker_reap(p, i, "");
    }
}

/* Reads every result waiting on a worker's socket. */
static void drain(mp_pool *p, worker *w)
{
    mp_msg *m;
    while (w->cur && mp__wire_recv(w->sock, &m, 0) == 0) {
        worker_result(p, w, m);
        mp_msg_destroy(m);
    }
}

static void handle_events(mp_pool *p, struct pollfd *fds, bool running)
{
    for (int i = 0; i < p->nprocs; i++) {
        worker *w = &p->w[i];
        struct pollfd *s = &fds[1 + 2 * i], *d = &fds[2 + 2 * i];
        if (!w->pid)
            continue;
        if (s->revents & POLLIN)
            drain(p, w);
        if (!w->exiting && p->maxtasks && w->chunks >= p->maxtasks && !w->cur)
            send_exit(w);
        bool dead = (d->revents & POLLIN) ||
                    (w->pidfd < 0 && (s->revents & (POLLHUP | POLLERR)));
        if (dead) {
            drain(p, w);
            worker_reap(p, i, "");
            if (running && worker_start(p, i) != 0)
                mp__log(MP_LOG_ERROR, "mp_pool: could not replace worker %d: %s", i,
                        mp_last_error());
        }
    }
}

static void *handler_main(void *arg)
{
    mp_pool *p = arg;
    struct pollfd *fds = calloc(1 + 2 * (size_t)p->nprocs, sizeof *fds);
    int state = RUN, rc = fds ? 0 : mp__error(MP_ENOMEM, "mp_pool_create: out of memory");

    for (int i = 0; i < p->nprocs && !rc; i++)
        rc = worker_start(p, i);
    pthread_mutex_lock(&p->mu);
    p->start_rc = rc;
    p->started = true;
    if (rc)
        p->state = TERMINATED;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);

    for (;;) {
        bool busy = dispatch(p, &state);
        run_callbacks(p);
        if (state == TERMINATED) {
            terminate_all(p);
            break;
        }
        if (state == CLOSED && !busy) {
            for (int i = 0; i < p->nprocs; i++)
                if (p->w[i].pid && !p->w[i].exiting)
                    send_exit(&p->w[i]);
            for (int i = 0; i < p->nprocs; i++)
                if (p->w[i].pid)
                    worker_reap(p, i, "");
            break;
        }
        fds[0] = (struct pollfd){p->wake_fd, POLLIN, 0};
        for (int i = 0; i < p->nprocs; i++) {
            worker *w = &p->w[i];
            fds[1 + 2 * i] = (struct pollfd){w->pid ? w->sock : -1, POLLIN, 0};
            fds[2 + 2 * i] = (struct pollfd){w->pid ? w->pidfd : -1, POLLIN, 0};
        }
        if (poll(fds, 1 + 2 * (nfds_t)p->nprocs, -1) < 0)
            continue; /* EINTR */
        if (fds[0].revents & POLLIN) {
            uint64_t v;
            (void)!read(p->wake_fd, &v, sizeof v);
        }
        handle_events(p, fds, state == RUN || busy);
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
    if (o->version != MP_POOL_OPTIONS_VERSION)
        return mp__error(MP_EINVAL, "mp_pool_create: options not set up by "
                         "mp_pool_options_init (version %u)", o->version);
    if (o->start_method && strcmp(o->start_method, "fork") != 0)
        return mp__error(MP_ENOTSUP, "mp_pool_create: start method '%s' is not available "
                         "to pools yet (use \"fork\")", o->start_method);
    if (o->initializer)
        return mp__error(MP_ENOTSUP, "mp_pool_create: initializers are not available yet");
    return 0;
}

int mp_pool_create(int nprocs, const mp_pool_options *opts, mp_pool **out)
{
    mp_pool_options defaults;
    mp_pool *p;
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
    p = calloc(1, sizeof *p);
    if (!p || !(p->w = calloc((size_t)nprocs, sizeof *p->w))) {
        free(p);
        return mp__error(MP_ENOMEM, "mp_pool_create: out of memory");
    }
    p->nprocs = nprocs;
    p->maxtasks = opts->maxtasksperchild;
    for (int i = 0; i < nprocs; i++)
        p->w[i].sock = p->w[i].pidfd = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->wake_fd < 0) {
        rc = mp__errno_error(errno, "mp_pool_create: eventfd");
        goto out_free;
    }
    rc = pthread_create(&p->thread, NULL, handler_main, p);
    if (rc) {
        rc = mp__errno_error(rc, "mp_pool_create: pthread_create");
        goto out_close;
    }
    pthread_mutex_lock(&p->mu);
    while (!p->started)
        pthread_cond_wait(&p->cv, &p->mu);
    rc = p->start_rc;
    pthread_mutex_unlock(&p->mu);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", mp_last_error());
        mp_pool_join(p);
        mp_pool_destroy(p);
        return mp__error(rc, "mp_pool_create: starting the workers: %s", why);
    }
    *out = p;
    return 0;

out_close:
    mp__close(p->wake_fd);
out_free:
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->w);
    free(p);
    return rc;
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

int mp_pool_close(mp_pool *p) { return set_state(p, CLOSED, "mp_pool_close"); }

int mp_pool_terminate(mp_pool *p) { return set_state(p, TERMINATED, "mp_pool_terminate"); }

int mp_pool_join(mp_pool *p)
{
    bool do_join;
    if (!p)
        return mp__error(MP_EINVAL, "mp_pool_join: pool is NULL");
    if (pthread_equal(pthread_self(), p->thread))
        return mp__error(MP_ESTATE, "mp_pool_join: called from a callback (the handler "
                         "thread would wait for itself)");
    pthread_mutex_lock(&p->mu);
    if (p->state == RUN) {
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
    pthread_mutex_lock(&p->mu);
    bool run = p->state == RUN;
    pthread_mutex_unlock(&p->mu);
    if (run)
        mp_pool_terminate(p);
    mp_pool_join(p);
    free(p->ready);
    mp__close(p->wake_fd);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->w);
    free(p);
}

int mp__pool_submit(mp_pool *p, mp__chunk *head, mp__chunk *tail)
{
    pthread_mutex_lock(&p->mu);
    if (p->state != RUN) {
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
