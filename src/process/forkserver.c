/* The forkserver: a single-threaded copy of the program, exec'd on first use
 * (so it starts clean even when the parent already has threads), that forks
 * children on request. Requests carry the child's status-channel end as an
 * fd.
 *
 * The children are the parent's, not the server's, as if the parent had
 * forked them: the server forks an intermediate process, which forks the
 * child and exits at once. The parent is a child subreaper
 * (PR_SET_CHILD_SUBREAPER) while it starts the server and while each request
 * runs, so the orphaned child is re-parented to it, not to init. Only then
 * does the child arm PR_SET_PDEATHSIG (the parent's death, not the
 * intermediate's, kills it) and check that its parent is the one that asked.
 * So the parent waits for, reaps and signals the child exactly like one it
 * forked, reads its real exit code, and the child keeps running when the
 * server dies (as CPython's forkserver children do). The parent stops being
 * a subreaper between requests, so orphans of its other descendants go on
 * to init as before (except during the microseconds of a request).
 *
 * The server itself watches its connection: it is started by whichever
 * thread first needs it, and a PDEATHSIG would fire when that thread exits,
 * not the process. When the parent dies, the kernel closes the connection
 * and the server sees EOF. Nobody else holds the parent's end: it is
 * O_CLOEXEC and forked copies close it (mp__atfork_register). */
#include "process/process_internal.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct fs_rec {
    char type; /* 'F' fork request, 'P' its reply */
    int32_t pid;
    int32_t value; /* 'P': errno of a failed fork */
    uint32_t seq;  /* 'F' and its 'P': a late reply is never taken for a new one */
} fs_rec;

static struct {
    pthread_mutex_t lock;
    pid_t pid;   /* the server; 0 when none */
    pid_t owner; /* the process that started it */
    int pidfd;
    int ctl;
    uint32_t seq; /* of the last fork request */
} fs = {PTHREAD_MUTEX_INITIALIZER, 0, 0, -1, -1, 0};

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
}

/* Makes this process a child subreaper for the duration of a launch;
 * *was says whether it was one before (then it stays one). */
static int subreaper_on(int *was, const char *call)
{
    *was = 0;
    if (prctl(PR_GET_CHILD_SUBREAPER, was) < 0 || (!*was && prctl(PR_SET_CHILD_SUBREAPER, 1) < 0))
        return mp__errno_error(errno, "%s: prctl(PR_SET_CHILD_SUBREAPER)", call);
    return 0;
}

static void subreaper_off(int was)
{
    if (!was)
        prctl(PR_SET_CHILD_SUBREAPER, 0);
}

/* call: the public call that starts it, mp_forkserver_start or the first
 * forkserver mp_process_start; the sentences name it, then what failed. */
static int start_locked(const char *call)
{
    int sv[2] = {-1, -1}, rc, was;
    char what[64];
    pthread_once(&atfork_once, register_atfork);
    if (running_locked())
        return 0;
    snprintf(what, sizeof what, "%s: starting the forkserver", call);
    if (mp__sys.socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return mp__errno_error(errno, "%s: socketpair", what);
    /* The kernel looks for a subreaper among the ancestors of an orphan only
     * in processes forked while an ancestor was one: so during this fork. */
    rc = subreaper_on(&was, what);
    if (rc == 0) {
        rc = mp__launch_exec(sv[1], "MPROC_FORKSERVER", false, &fs.pid, &fs.pidfd, what);
        subreaper_off(was);
    }
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
    int rc = mp__setup_check("mp_forkserver_start");
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&fs.lock);
    rc = start_locked("mp_forkserver_start");
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

/* Both sides watch for the other's record a moment before they sleep,
 * since a sleeping wait costs a cross-CPU wake-up (15-35 us on a VM): the
 * parent for the reply, which comes 200-300 us after its request (two
 * forks); the server for a next request that comes at once (a program
 * starting several processes in a row), but not longer, so that it does not
 * take a CPU from what the parent does next. */
#define REPLY_SPIN_S 1e-3
#define NEXT_SPIN_S 100e-6

/* Reads server records until the reply to request seq arrives. */
static int read_reply_locked(uint32_t seq, double deadline, fs_rec *out)
{
    (void)mp__spin_readable(fs.ctl, REPLY_SPIN_S);
    for (;;) {
        fs_rec r;
        size_t len;
        int nfds = 0, fd = -1;
        int rc = mp__recv_record(fs.ctl, &r, sizeof r, &len, &fd, 1, &nfds, deadline);
        if (rc < 0)
            return rc;
        if (nfds)
            mp__close(fd); /* the server sends none */
        if (len != sizeof r)
            return mp__error(MP_EPROTO, "forkserver: malformed record (%zu bytes)", len);
        if (r.type == 'P' && r.seq == seq) {
            *out = r;
            return 0;
        }
        /* The reply to a request that timed out: nobody supervises that
         * child (it is ours: the subreaper took it), so it must not run. */
        if (r.type == 'P' && r.pid > 0 && r.value == 0) {
            kill(r.pid, SIGKILL);
            waitpid(r.pid, NULL, 0);
        }
    }
}

/* The child the server made must be ours now (re-parented to this
 * subreaper): then it is waited for like one we forked. */
static int adopt(pid_t pid, int *pidfd)
{
    siginfo_t si;
    int err;
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0) {
        err = errno;
        kill(pid, SIGKILL);
        return mp__errno_error(err, "mp_process_start: the forkserver's child %d is not "
                               "this process's child (PR_SET_CHILD_SUBREAPER did not take)",
                               (int)pid);
    }
    if ((*pidfd = mp__pidfd_open(pid)) < 0) {
        err = errno;
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return mp__errno_error(err, "mp_process_start: pidfd_open (needs Linux >= 5.3)");
    }
    return 0;
}

static int request_locked(int chan, pid_t *pid, int *pidfd)
{
    fs_rec req = {.type = 'F', .seq = ++fs.seq}, rep = {0};
    double deadline = mp__deadline(10);
    int was, rc = subreaper_on(&was, "mp_process_start");
    if (rc < 0)
        return rc;
    rc = mp__send_record(fs.ctl, &req, sizeof req, &chan, 1, deadline);
    if (rc == 0)
        rc = read_reply_locked(req.seq, deadline, &rep);
    /* The server replies once the intermediate is gone: the child is ours. */
    subreaper_off(was);
    if (rc < 0)
        return rc;
    if (rep.value != 0 || rep.pid <= 0)
        return mp__fork_error(rep.value ? rep.value : EPROTO,
                              "mp_process_start: the forkserver could not fork");
    rc = adopt(rep.pid, pidfd);
    if (rc == 0)
        *pid = rep.pid;
    return rc;
}

int mp__forkserver_launch(int chan, pid_t *pid, int *pidfd)
{
    int rc;
    pthread_mutex_lock(&fs.lock);
    for (int attempt = 0; attempt < 2; attempt++) {
        rc = start_locked("mp_process_start");
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

/* ---- the server ---------------------------------------------------------- */

/* The child, forked by the intermediate: waits until the intermediate has
 * exited (it does at once, so this is a few yields, not a sleep until the
 * server wakes it), by which time the child has been re-parented; then dies
 * with its parent. Exits when anyone else adopted it: the parent died
 * meanwhile. */
static _Noreturn void child_main(int chan, pid_t middle, pid_t parent)
{
    pid_t pp;
    while ((pp = getppid()) == middle)
        sched_yield();
    if (pp != parent)
        _exit(1);
    mp__child_die_with_parent(parent);
    mp__child_run(chan);
}

/* What the intermediate leaves for the server: it shares the server's
 * memory (vfork), so no pipe is needed. */
typedef struct fork_result {
    pid_t child;
    int err;
} fork_result;

/* Makes the intermediate with vfork, which forks the child and exits: the
 * server resumes only then, so the child has been re-parented by the time
 * its pid is read. vfork spares copying the server's page tables a second
 * time; the intermediate's fork() is safe here because the server is
 * single-threaded and suspended until the intermediate is gone, and what
 * fork changes in the memory they share (atfork handlers, stdio and malloc
 * locks) it takes and gives back before returning. 0 or an errno. */
static int server_fork(int ctl, int chan, pid_t parent, pid_t *child)
{
    volatile fork_result res = {-1, 0};
    int status;
    pid_t middle = vfork();
    if (middle == 0) {
        pid_t self = getpid();
        pid_t c = fork();
        if (c == 0) {
            close(ctl);
            signal(SIGINT, SIG_DFL);
            child_main(chan, self, parent);
        }
        res.child = c;
        res.err = c < 0 ? errno : 0;
        _exit(0);
    }
    if (middle < 0) {
        res.err = errno;
    } else {
        while (waitpid(middle, &status, 0) < 0 && errno == EINTR)
            ;
    }
    *child = res.child;
    return res.err;
}

_Noreturn void mp__forkserver_main(int ctl, pid_t parent)
{
    /* Ctrl-C reaches the whole process group: the parent decides. */
    signal(SIGINT, SIG_IGN);
    mp__backtrace_prime(); /* once here, not once in every child */
    for (;;) {
        fs_rec req = {0}, rep; /* req filled even when the fd did not fit (EMFILE) */
        size_t len;
        int chan = -1, nfds = 0;
        int rc = mp__recv_record(ctl, &req, sizeof req, &len, &chan, 1, &nfds, -1);
        if (rc == MP_ECLOSED || (rc < 0 && rc != MP_EPROTO && rc != MP_EMFILE))
            break;
        /* Answer every request, or the parent waits for nothing. */
        rep = (fs_rec){.type = 'P', .pid = -1, .seq = req.seq};
        if (rc == 0 && len == sizeof req && req.type == 'F' && nfds == 1)
            rep.value = server_fork(ctl, chan, parent, &rep.pid);
        else
            rep.value = rc == MP_EMFILE ? EMFILE : EPROTO;
        mp__send_record(ctl, &rep, sizeof rep, NULL, 0, -1);
        if (nfds)
            mp__close(chan);
        (void)mp__spin_readable(ctl, NEXT_SPIN_S); /* a next request at once */
    }
    /* The parent is gone or closed us; its children are not ours. */
    _exit(0);
}
