/* mp_process: create, start with a start method, join, signal, reap; and the
 * exit handler that terminates daemon children and reaps every child. */
#include "process/process_internal.h"
#include "wire/wire.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef enum pstate { ST_CREATED, ST_STARTED, ST_REAPED } pstate;

struct mp_process {
    char *entry;
    char *name;
    mp_msg *args; /* borrowed until start */
    bool daemon;
    mp__method method;
    int rank;
    pstate state;
    pid_t pid;
    pid_t owner; /* the process that started it: only it may wait */
    int pidfd;
    int chan; /* our end of the status channel */
    bool chan_roomy; /* the child's end can never block: join waits on the pidfd alone */
    int exitcode;
    mp__status status;
    char signame[16];
    mp__link link; /* in `live`, for the exit handler */
};

/* ---- live list and exit handler ------------------------------------------ */

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static mp__link *live;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static atomic_int name_counter;
static void (*exit_hooks[4])(void); /* under list_lock */
static int n_exit_hooks;

static void list_add(mp_process *p)
{
    pthread_mutex_lock(&list_lock);
    mp__link_push(&live, &p->link, p);
    pthread_mutex_unlock(&list_lock);
}

static void list_remove(mp_process *p)
{
    pthread_mutex_lock(&list_lock);
    mp__link_remove(&live, &p->link);
    pthread_mutex_unlock(&list_lock);
}

/* Python's _exit_function: run the finalizers (mp__process_on_exit: a
 * pool's terminate), terminate daemons, then join every child. */
static void at_exit(void)
{
    mp_process *batch[256];
    void (*hooks[4])(void);
    int n;
    pthread_mutex_lock(&list_lock);
    n = n_exit_hooks;
    memcpy(hooks, exit_hooks, sizeof hooks);
    pthread_mutex_unlock(&list_lock);
    while (n > 0)
        hooks[--n]();
    do {
        n = 0;
        pthread_mutex_lock(&list_lock);
        for (mp__link *l = live; l && n < 256; l = l->next) {
            mp_process *p = l->self;
            if (p->state == ST_STARTED && p->owner == getpid())
                batch[n++] = p;
        }
        pthread_mutex_unlock(&list_lock);
        for (int i = 0; i < n; i++)
            if (batch[i]->daemon)
                mp__pidfd_signal(batch[i]->pidfd, SIGTERM, "mproc exit handler");
        for (int i = 0; i < n; i++)
            mp__process_reap(batch[i], true);
    } while (n == 256);
    mp_forkserver_stop();
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&list_lock);
}
static void atfork_release(void)
{
    pthread_mutex_unlock(&list_lock);
}

static void init_once_fn(void)
{
    mp__child_prime(); /* before any fork: children inherit libgcc_s, resolved symbols */
    atexit(at_exit);
    static const mp__fork_handlers h = {atfork_prepare, atfork_release, atfork_release};
    mp__atfork_register(MP__FORK_PROCESS_LIST, &h);
}

void mp__process_on_exit(void (*fn)(void))
{
    pthread_once(&init_once, init_once_fn);
    pthread_mutex_lock(&list_lock);
    if (n_exit_hooks < 4)
        exit_hooks[n_exit_hooks++] = fn;
    else
        mp__log(MP_LOG_ERROR, "mproc: more than 4 exit hooks; one is not run");
    pthread_mutex_unlock(&list_lock);
}

/* ---- create ------------------------------------------------------------- */

void mp_process_options_init(mp_process_options *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->size = sizeof *opts;
}

static int resolve_method(const mp_process_options *o, mp__method *m)
{
    if (o && o->start_method)
        return mp__method_parse(o->start_method, m, "mp_process_create");
    *m = o && o->context ? o->context->method : mp__method_default();
    return 0;
}

int mp__process_create(const char *entry, mp_msg *args, const mp_process_options *opts, int rank,
                       mp_process **out)
{
    mp_process *p;
    char defname[32];
    mp__method m = MP__FORK; /* set by mp__method_parse or the default */
    mp_process_options copy;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_process_create: out is NULL");
    *out = NULL;
    if ((rc = mp__entry_check(entry, "entry", "mp_process_create")) < 0)
        return rc;
    if (opts) {
        rc = mp__struct_in(&copy, sizeof copy, opts, "mp_process_create", "mp_process_options");
        if (rc)
            return rc;
        opts = &copy;
    }
    if (resolve_method(opts, &m) < 0)
        return MP_EINVAL;
    pthread_once(&init_once, init_once_fn);
    p = calloc(1, sizeof *p);
    if (!p)
        return mp__error(MP_ENOMEM, "mp_process_create: out of memory");
    snprintf(defname, sizeof defname, "Process-%d", atomic_fetch_add(&name_counter, 1) + 1);
    p->entry = strdup(entry);
    p->name = strdup(opts && opts->name ? opts->name : defname);
    if (!p->entry || !p->name) {
        free(p->entry);
        free(p->name);
        free(p);
        return mp__error(MP_ENOMEM, "mp_process_create: out of memory");
    }
    p->args = args;
    p->daemon = opts && opts->daemon;
    p->method = m;
    p->rank = rank;
    p->pidfd = p->chan = -1;
    *out = p;
    return 0;
}

int mp_process_create(const char *entry, mp_msg *args, const mp_process_options *opts,
                      mp_process **out)
{
    return mp__process_create(entry, args, opts, 0, out);
}

/* ---- start --------------------------------------------------------------- */

/* The boot record and the argument message go into the channel before the
 * child exists: it finds them waiting and nobody blocks. Without arguments
 * only the boot record goes: the child makes its own empty message, which
 * spares a frame, a send and two receives on every start. */
static int send_args(mp_process *p, int sock)
{
    mp__boot boot = {.magic = MP__BOOT_MAGIC,
                     .rank = p->rank,
                     .method = (int32_t)p->method,
                     .has_args = p->args != NULL};
    int rc;
    strncpy(boot.entry, p->entry, MP_ENTRY_NAME_MAX);
    rc = mp__send_record(sock, &boot, sizeof boot, NULL, 0, 0);
    if (rc < 0 || !p->args)
        return rc;
    rc = mp__wire_send(sock, p->args, 0);
    if (rc == MP_ETIMEDOUT) /* a timeout of 0: the socket buffer is full */
        return mp__error(MP_EOVERFLOW, "mp_process_start: the argument message does not "
                                       "fit in the socket buffer; send big data as "
                                       "tensors or through a queue");
    return rc;
}

static int launch(mp_process *p, int sv[2])
{
    switch (p->method) {
    case MP__FORK:
        return mp__launch_fork(sv[1], sv[0], &p->pid, &p->pidfd);
    case MP__SPAWN:
        return mp__launch_exec(sv[1], "MPROC_SPAWN", true, &p->pid, &p->pidfd,
                               "mp_process_start");
    default:
        return mp__forkserver_launch(sv[1], &p->pid, &p->pidfd);
    }
}

/* Gives the child's end room for everything it may ever write (normally it
 * has it already). Then the parent's join need not watch the channel: the
 * child's exit closes it a moment before the pidfd says it exited, and
 * waking on both meant two trips through the scheduler per join. Where the
 * system caps the buffer lower, join watches both as before. */
static bool make_roomy(int child_end)
{
    int want = MP__STATUS_BYTES_MAX, got = 0;
    socklen_t len = sizeof got;
    if (getsockopt(child_end, SOL_SOCKET, SO_SNDBUF, &got, &len) == 0 && got >= want)
        return true;
    if (setsockopt(child_end, SOL_SOCKET, SO_SNDBUF, &want, sizeof want) != 0)
        return false;
    len = sizeof got;
    return getsockopt(child_end, SOL_SOCKET, SO_SNDBUF, &got, &len) == 0 && got >= want;
}

int mp_process_start(mp_process *p)
{
    int sv[2] = {-1, -1}, rc;
    if (!p)
        return mp__error(MP_EINVAL, "mp_process_start: process is NULL");
    if (p->state != ST_CREATED)
        return mp__error(MP_ESTATE,
                         "mp_process_start: process '%s' was already started; "
                         "a process can be started only once",
                         p->name);
    if ((rc = mp__registry_check("mp_process_start")) < 0 ||
        (rc = mp__sigchld_check("mp_process_start")) < 0)
        return rc;
    if (p->method == MP__FORK && (rc = mp__fork_check("mp_process_start")) < 0)
        return rc;
    if (mp__sys.socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return mp__errno_error(errno, "mp_process_start: socketpair");
    p->chan_roomy = make_roomy(sv[1]);
    rc = send_args(p, sv[0]);
    if (rc == 0)
        rc = launch(p, sv);
    mp__close(sv[1]);
    if (rc < 0) {
        mp__close(sv[0]);
        p->pid = 0;
        return rc;
    }
    p->chan = sv[0];
    p->owner = getpid();
    p->state = ST_STARTED;
    p->args = NULL;
    list_add(p);
    return 0;
}

/* ---- wait ---------------------------------------------------------------- */

int mp__sigchld_check(const char *call)
{
    struct sigaction sa;
    if (sigaction(SIGCHLD, NULL, &sa) != 0 ||
        (sa.sa_handler != SIG_IGN && !(sa.sa_flags & SA_NOCLDWAIT)))
        return 0;
    return mp__error(MP_ESTATE,
                     "%s: SIGCHLD is ignored in this process (%s), so the kernel reaps "
                     "each child the moment it exits and its exit status is lost; set "
                     "it back with signal(SIGCHLD, SIG_DFL), or give it a handler "
                     "without SA_NOCLDWAIT, before starting processes",
                     call, sa.sa_handler == SIG_IGN ? "SIG_IGN" : "SA_NOCLDWAIT");
}

/* Every child is ours, forkserver ones included (forkserver.c). */
static int wait_status(mp_process *p)
{
    int wstatus = 0;
    pid_t r;
    do
        r = waitpid(p->pid, &wstatus, 0);
    while (r < 0 && errno == EINTR);
    if (r == p->pid)
        return wstatus;
    /* Reaped by someone else (a test's kill-all, a waitpid(-1) elsewhere):
     * the exit status is lost; report a SIGKILL. */
    return SIGKILL;
}

int mp__process_reap(mp_process *p, bool block)
{
    struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};
    int n;
    if (p->state == ST_REAPED)
        return 1;
    if (p->state != ST_STARTED || p->owner != getpid())
        return 0;
    do
        n = poll(&pf, 1, block ? -1 : 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return 0;
    p->exitcode = mp__exitcode(wait_status(p));
    mp__status_drain(p->chan, &p->status); /* what it wrote before dying */
    p->pidfd = mp__close(p->pidfd);
    p->chan = mp__close(p->chan);
    p->state = ST_REAPED;
    list_remove(p);
    return 1;
}

bool mp__process_poll_status(mp_process *p)
{
    mp__status_drain(p->chan, &p->status);
    return p->status.failed;
}

static int check_waitable(mp_process *p, const char *call)
{
    if (!p)
        return mp__error(MP_EINVAL, "%s: process is NULL", call);
    if (p->state == ST_CREATED)
        return mp__error(MP_ESTATE, "%s: process '%s' has not been started", call, p->name);
    if (p->owner != getpid())
        return mp__error(MP_ESTATE,
                         "%s: process '%s' belongs to pid %d; only the process "
                         "that started it can wait for or signal it",
                         call, p->name, (int)p->owner);
    return 0;
}

int mp_process_join(mp_process *p, double timeout)
{
    double deadline = mp__deadline(timeout);
    int rc = mp__check_timeout(timeout, "mp_process_join");
    if (rc == 0)
        rc = check_waitable(p, "mp_process_join");
    if (rc < 0 || p->state == ST_REAPED)
        return rc;
    for (;;) {
        bool chan = !p->status.eof && !p->chan_roomy;
        struct pollfd pf[2] = {{.fd = p->pidfd, .events = POLLIN},
                               {.fd = chan ? p->chan : -1, .events = POLLIN}};
        int n = poll(pf, 2, mp__poll_ms(deadline));
        if (n < 0 && errno != EINTR)
            return mp__errno_error(errno, "mp_process_join: poll");
        if (n > 0 && pf[1].revents)
            mp__status_drain(p->chan, &p->status);
        if (n > 0 && pf[0].revents) {
            mp__process_reap(p, true);
            return 0;
        }
        if (n == 0)
            return mp__error(MP_ETIMEDOUT,
                             "mp_process_join: process '%s' (pid %d) still "
                             "running after %g s",
                             p->name, (int)p->pid, timeout);
    }
}

bool mp_process_is_alive(mp_process *p)
{
    if (!p || p->state != ST_STARTED || p->owner != getpid())
        return false;
    return mp__process_reap(p, false) == 0;
}

int mp_process_sentinel(const mp_process *p)
{
    return p && p->state == ST_STARTED ? p->pidfd : -1;
}

pid_t mp_process_pid(const mp_process *p)
{
    return p && p->state != ST_CREATED ? p->pid : 0;
}
const char *mp_process_name(const mp_process *p)
{
    return p ? p->name : "";
}
bool mp_process_daemon(const mp_process *p)
{
    return p && p->daemon;
}
int mp__process_wait_fd(const mp_process *p, int *fd, const char *call)
{
    if (!p || p->state == ST_CREATED)
        return mp__error(MP_EINVAL, "%s: process %s", call,
                         p ? "has not been started" : "is NULL");
    if (p->owner != getpid())
        return mp__error(MP_EINVAL, "%s: process '%s' belongs to pid %d; only the process "
                         "that started it can wait for it", call, p->name, (int)p->owner);
    *fd = p->state == ST_STARTED ? p->pidfd : -1;
    return 0;
}

int mp__process_pidfd(const mp_process *p)
{
    return p->pidfd;
}
int mp__process_chan(const mp_process *p)
{
    return p->status.eof ? -1 : p->chan;
}
bool mp__process_reaped(const mp_process *p)
{
    return p->state == ST_REAPED;
}

static int check_finished(mp_process *p, const char *call)
{
    int rc = check_waitable(p, call);
    if (rc < 0)
        return rc;
    if (mp__process_reap(p, false) == 0)
        return mp__error(MP_ESTATE,
                         "%s: process '%s' (pid %d) is still running; join it "
                         "first",
                         call, p->name, (int)p->pid);
    return 0;
}

int mp_process_exitcode(mp_process *p, int *exitcode)
{
    int rc;
    if (!exitcode)
        return mp__error(MP_EINVAL, "mp_process_exitcode: exitcode is NULL");
    rc = check_finished(p, "mp_process_exitcode");
    if (rc == 0)
        *exitcode = p->exitcode;
    return rc;
}

int mp_process_error(mp_process *p, mp_child_error *out)
{
    int rc;
    mp_child_error e = {.size = sizeof e};
    if (!out)
        return mp__error(MP_EINVAL, "mp_process_error: out is NULL");
    rc = check_finished(p, "mp_process_error");
    if (rc < 0)
        return rc;
    e.rank = p->rank;
    e.pid = p->pid;
    e.exitcode = p->exitcode;
    e.signal = p->exitcode < 0 ? -p->exitcode : 0;
    e.signal_name = mp__signal_name(e.signal, p->signame, sizeof p->signame);
    e.message = p->status.message;
    /* Symbolized here, once, not when the frames arrive: it reads DWARF
     * (tens of ms), which the failure notification should not wait for. */
    mp__backtrace_finish(&p->status);
    e.backtrace = p->status.backtrace ? p->status.backtrace : "";
    e.name = p->name;
    return mp__struct_out(out, &e, sizeof e, "mp_process_error", "mp_child_error");
}

/* ---- signals and destroy --------------------------------------------------- */

static int send_signal(mp_process *p, int sig, const char *call)
{
    int rc = check_waitable(p, call);
    if (rc < 0 || p->state == ST_REAPED)
        return rc;
    return mp__pidfd_signal(p->pidfd, sig, call);
}

int mp_process_terminate(mp_process *p)
{
    return send_signal(p, SIGTERM, "mp_process_terminate");
}

int mp_process_kill(mp_process *p)
{
    return send_signal(p, SIGKILL, "mp_process_kill");
}

int mp_process_destroy(mp_process *p)
{
    if (!p)
        return 0;
    if (p->state == ST_STARTED && p->owner == getpid() && mp__process_reap(p, false) == 0)
        return mp__error(MP_ESTATE,
                         "mp_process_destroy: process '%s' (pid %d) is still "
                         "running; join, terminate or kill it first",
                         p->name, (int)p->pid);
    if (p->state == ST_STARTED) /* a copy inherited through fork: not ours */
        list_remove(p);
    mp__close(p->pidfd);
    mp__close(p->chan);
    mp__status_free(&p->status);
    free(p->entry);
    free(p->name);
    free(p);
    return 0;
}

/* Reaps the children of ps that exit before deadline; true when none is
 * left running. */
static bool reap_until(mp_process **ps, int n, double deadline)
{
    for (;;) {
        struct pollfd pf[n > 0 ? n : 1];
        int waiting = 0;
        for (int i = 0; i < n; i++) {
            pf[i].fd = ps[i]->state == ST_STARTED ? ps[i]->pidfd : -1;
            pf[i].events = POLLIN;
            pf[i].revents = 0;
            waiting += pf[i].fd >= 0;
        }
        if (!waiting)
            return true;
        if (poll(pf, (nfds_t)n, mp__poll_ms(deadline)) == 0)
            return false;
        for (int i = 0; i < n; i++)
            if (pf[i].revents)
                mp__process_reap(ps[i], true);
    }
}

void mp__process_stop_all(mp_process **ps, int n, int except, double grace, double kill_timeout)
{
    if (grace > 0 && reap_until(ps, n, mp__deadline(grace)))
        return;
    for (int i = 0; i < n; i++)
        if (i != except && ps[i]->state == ST_STARTED)
            mp__pidfd_signal(ps[i]->pidfd, SIGTERM, "mp_spawn");
    if (reap_until(ps, n, mp__deadline(kill_timeout)))
        return;
    for (int i = 0; i < n; i++)
        if (ps[i]->state == ST_STARTED) {
            mp__pidfd_signal(ps[i]->pidfd, SIGKILL, "mp_spawn");
            mp__process_reap(ps[i], true);
        }
}
