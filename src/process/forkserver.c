/* The forkserver: a single-threaded copy of the program, exec'd on first use
 * (so it starts clean even when the parent already has threads), that forks
 * children on request. Requests carry the child's status-channel end as an
 * fd. The children are the server's, not ours, so the server relays each
 * child's wait status back; it also sends a pidfd per child, which the
 * parent polls and signals exactly like one of its own children. The
 * server dies with its parent and its children with it (PR_SET_PDEATHSIG
 * on the server's one thread). The server itself watches its connection
 * instead: it is started by whichever thread first needs it, and a
 * PDEATHSIG would fire when that thread exits, not the process. When the
 * parent dies, the kernel closes the connection and the server sees EOF.
 * Nobody else holds the parent's end: it is O_CLOEXEC and forked copies
 * close it (mp__atfork_register). */
#include "process/process_internal.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct fs_rec {
    char type; /* 'F' fork request, 'P' its reply (+ pidfd), 'X' a child exited */
    int32_t pid;
    int32_t value; /* 'P': errno of a failed fork, 'X': the wait status */
    uint32_t seq;  /* 'F' and its 'P': a late reply is never taken for a new one */
} fs_rec;

typedef struct fs_exit {
    pid_t pid;
    int status;
} fs_exit;

static struct {
    pthread_mutex_t lock;
    pid_t pid;   /* the server; 0 when none */
    pid_t owner; /* the process that started it */
    int pidfd;
    int ctl;
    fs_exit *exits; /* statuses relayed before anyone asked */
    size_t n_exits, cap_exits;
    uint32_t seq;   /* of the last fork request */
} fs = {PTHREAD_MUTEX_INITIALIZER, 0, 0, -1, -1, NULL, 0, 0, 0};

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void)
{
    pthread_mutex_lock(&fs.lock);
}
static void atfork_parent(void)
{
    pthread_mutex_unlock(&fs.lock);
}
static void atfork_child(void)
{
    /* The server belongs to the parent. Drop our copy of its connection, or
     * the server would not see EOF when the parent closes it. */
    fs.ctl = mp__close(fs.ctl);
    fs.pidfd = mp__close(fs.pidfd);
    fs.pid = 0;
    free(fs.exits);
    fs.exits = NULL;
    fs.n_exits = fs.cap_exits = 0;
    pthread_mutex_unlock(&fs.lock);
}

static void register_atfork(void)
{
    static const mp__fork_handlers h = {atfork_prepare, atfork_parent, atfork_child};
    mp__atfork_register(MP__FORK_FORKSERVER, &h);
}

static bool running_locked(void)
{
    return fs.pid > 0 && fs.owner == getpid();
}

/* Closes the connection and reaps the server (SIGKILL after 2 s). */
static void stop_locked(void)
{
    struct pollfd p = {.fd = fs.pidfd, .events = POLLIN};
    if (!running_locked())
        return;
    fs.ctl = mp__close(fs.ctl);
    if (poll(&p, 1, 2000) <= 0)
        mp__pidfd_signal(fs.pidfd, SIGKILL, "mp_forkserver_stop");
    while (waitpid(fs.pid, NULL, 0) < 0 && errno == EINTR)
        ;
    fs.pidfd = mp__close(fs.pidfd);
    fs.pid = 0;
    fs.n_exits = 0;
}

static int start_locked(void)
{
    int sv[2] = {-1, -1}, rc;
    pthread_once(&atfork_once, register_atfork);
    if (running_locked())
        return 0;
    if (mp__sys.socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return mp__errno_error(errno, "mp_forkserver_start: socketpair");
    rc = mp__launch_exec(sv[1], "MPROC_FORKSERVER", false, &fs.pid, &fs.pidfd);
    mp__close(sv[1]);
    if (rc < 0) {
        fs.pid = 0;
        mp__close(sv[0]);
        return rc;
    }
    fs.ctl = sv[0];
    fs.owner = getpid();
    return 0;
}

int mp_forkserver_start(void)
{
    int rc;
    pthread_mutex_lock(&fs.lock);
    rc = start_locked();
    pthread_mutex_unlock(&fs.lock);
    return rc;
}

int mp_forkserver_stop(void)
{
    pthread_mutex_lock(&fs.lock);
    stop_locked();
    pthread_mutex_unlock(&fs.lock);
    return 0;
}

static int remember_exit(pid_t pid, int status)
{
    if (fs.n_exits == fs.cap_exits) {
        size_t cap = fs.cap_exits ? fs.cap_exits * 2 : 16;
        fs_exit *e = realloc(fs.exits, cap * sizeof *e);
        if (!e)
            return mp__error(MP_ENOMEM, "forkserver: out of memory");
        fs.exits = e;
        fs.cap_exits = cap;
    }
    fs.exits[fs.n_exits++] = (fs_exit){pid, status};
    return 0;
}

/* Reads server records until one of `type` (for pid, when pid > 0) arrives;
 * exit records on the way are remembered. */
static int read_until_locked(char type, pid_t pid, uint32_t seq, double deadline, fs_rec *out,
                             int *fd)
{
    for (;;) {
        fs_rec r;
        size_t len;
        int nfds = 0, fds[1] = {-1};
        int rc = mp__recv_record(fs.ctl, &r, sizeof r, &len, fds, 1, &nfds, deadline);
        if (rc < 0)
            return rc;
        if (len != sizeof r) {
            if (nfds)
                mp__close(fds[0]);
            return mp__error(MP_EPROTO, "forkserver: malformed record (%zu bytes)", len);
        }
        if (r.type == type && (pid <= 0 || r.pid == pid) && (type != 'P' || r.seq == seq)) {
            *out = r;
            if (fd)
                *fd = nfds ? fds[0] : -1;
            else if (nfds)
                mp__close(fds[0]);
            return 0;
        }
        /* The reply to a request that timed out: nobody supervises that
         * child, so it must not run the entry. */
        if (r.type == 'P' && nfds)
            mp__pidfd_signal(fds[0], SIGKILL, "forkserver");
        if (nfds)
            mp__close(fds[0]);
        if (r.type == 'X' && remember_exit(r.pid, r.value) < 0)
            return MP_ENOMEM;
    }
}

static int request_locked(int chan, pid_t *pid, int *pidfd)
{
    fs_rec req = {.type = 'F', .seq = ++fs.seq}, rep;
    double deadline = mp__deadline(10);
    int rc = mp__send_record(fs.ctl, &req, sizeof req, &chan, 1, deadline);
    if (rc == 0)
        rc = read_until_locked('P', 0, req.seq, deadline, &rep, pidfd);
    if (rc < 0)
        return rc;
    if (rep.value != 0 || *pidfd < 0) {
        *pidfd = mp__close(*pidfd);
        return mp__errno_error(rep.value ? rep.value : EPROTO,
                               "mp_process_start: the forkserver could not fork");
    }
    *pid = rep.pid;
    return 0;
}

int mp__forkserver_launch(int chan, pid_t *pid, int *pidfd)
{
    int rc;
    pthread_mutex_lock(&fs.lock);
    for (int attempt = 0; attempt < 2; attempt++) {
        rc = start_locked();
        if (rc < 0)
            break;
        rc = request_locked(chan, pid, pidfd);
        if (rc != MP_ECLOSED)
            break;
        stop_locked(); /* the server died (killed?): start a new one once */
    }
    pthread_mutex_unlock(&fs.lock);
    return rc;
}

int mp__forkserver_status(pid_t pid, double deadline, int *wstatus)
{
    fs_rec r;
    int rc = 0;
    pthread_mutex_lock(&fs.lock);
    for (size_t i = 0; i < fs.n_exits; i++)
        if (fs.exits[i].pid == pid) {
            *wstatus = fs.exits[i].status;
            fs.exits[i] = fs.exits[--fs.n_exits];
            goto out_unlock;
        }
    if (!running_locked()) {
        rc = mp__error(MP_ECLOSED,
                       "forkserver: the server is gone; its child %d died "
                       "with it",
                       (int)pid);
        goto out_unlock;
    }
    rc = read_until_locked('X', pid, 0, deadline, &r, NULL);
    if (rc == 0)
        *wstatus = r.value;
    else if (rc == MP_ECLOSED)
        stop_locked();
out_unlock:
    pthread_mutex_unlock(&fs.lock);
    return rc;
}

/* ---- the server ---------------------------------------------------------- */

static void server_reap(int ctl)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        fs_rec x = {.type = 'X', .pid = pid, .value = status};
        mp__send_record(ctl, &x, sizeof x, NULL, 0, -1);
    }
}

static void server_fork(int ctl, int sfd, int chan, uint32_t seq, const sigset_t *chld)
{
    pid_t self = getpid();
    fs_rec rep = {.type = 'P', .seq = seq};
    int pidfd = -1;
    pid_t child = fork();
    if (child == 0) {
        close(ctl);
        close(sfd);
        signal(SIGINT, SIG_DFL);
        sigprocmask(SIG_UNBLOCK, chld, NULL);
        mp__child_die_with_parent(self);
        mp__child_run(chan);
    }
    if (child < 0)
        rep.value = errno;
    else if ((pidfd = mp__pidfd_open(child)) < 0) {
        rep.value = errno;
        /* Told the start failed, nobody would supervise it: it must not
         * run the entry. Its exit is still relayed. */
        kill(child, SIGKILL);
    }
    rep.pid = child;
    mp__send_record(ctl, &rep, sizeof rep, &pidfd, pidfd >= 0 ? 1 : 0, -1);
    mp__close(pidfd);
}

_Noreturn void mp__forkserver_main(int ctl)
{
    sigset_t chld;
    int sfd;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        _exit(1);
    /* Ctrl-C reaches the whole process group: the parent decides. */
    signal(SIGINT, SIG_IGN);
    mp__backtrace_prime(); /* once here, not once in every child */
    for (;;) {
        struct pollfd p[2] = {{.fd = ctl, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0)
                ;
            server_reap(ctl);
        }
        if (p[0].revents) {
            fs_rec req = {0}; /* filled even when the fd did not fit (EMFILE) */
            size_t len;
            int chan = -1, nfds = 0;
            int rc = mp__recv_record(ctl, &req, sizeof req, &len, &chan, 1, &nfds, -1);
            if (rc == MP_ECLOSED || (rc < 0 && rc != MP_EPROTO && rc != MP_EMFILE))
                break;
            if (rc == 0 && len == sizeof req && req.type == 'F' && nfds == 1) {
                server_fork(ctl, sfd, chan, req.seq, &chld);
            } else {
                /* Answer every request, or the parent waits for nothing. */
                fs_rec rep = {.type = 'P', .pid = -1, .value = rc == MP_EMFILE ? EMFILE : EPROTO,
                              .seq = req.seq};
                mp__send_record(ctl, &rep, sizeof rep, NULL, 0, -1);
            }
            if (nfds)
                mp__close(chan);
        }
    }
    /* The parent is gone or closed us: our children die with us. */
    _exit(0);
}
