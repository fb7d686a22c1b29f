/* Launchers: fork, and vfork + exec of the running program (spawn and the
 * forkserver). Plus small helpers on pids and wait statuses. */
#include "process/process_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

const char *mp__exec_path = "/proc/self/exe";

int mp__exitcode(int wstatus)
{
    if (WIFSIGNALED(wstatus))
        return -WTERMSIG(wstatus);
    return WEXITSTATUS(wstatus);
}

const char *mp__signal_name(int sig, char *buf, size_t cap)
{
    const char *abbrev = sig > 0 ? sigabbrev_np(sig) : NULL;
    if (abbrev)
        snprintf(buf, cap, "SIG%s", abbrev);
    else if (sig > 0)
        snprintf(buf, cap, "signal %d", sig);
    else
        snprintf(buf, cap, "%s", "");
    return buf;
}

int mp__pidfd_signal(int pidfd, int sig, const char *call)
{
    if (mp__pidfd_send_signal(pidfd, sig) == 0 || errno == ESRCH)
        return 0;
    return mp__errno_error(errno, "%s: pidfd_send_signal(%d)", call, sig);
}

/* A pidfd for our own child: its pid cannot be recycled before we reap it. */
static int open_pidfd(pid_t pid, int *pidfd, const char *call)
{
    *pidfd = mp__pidfd_open(pid);
    if (*pidfd < 0) {
        int err = errno;
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return mp__errno_error(err, "%s: pidfd_open (needs Linux >= 5.3)", call);
    }
    return 0;
}

int mp__launch_fork(int chan, int parent_end, pid_t *pid, int *pidfd)
{
    pid_t parent = getpid();
    pid_t child;
    /* Output buffered by stdio would be written once by each copy: flush it
     * first, as CPython does before fork. (spawn and the forkserver do not
     * copy our buffers.) */
    fflush(NULL);
    child = fork(); /* mp_process_create primed backtrace() already */
    if (child < 0)
        return mp__fork_error(errno, "mp_process_start: fork");
    if (child == 0) {
        close(parent_end);
        mp__child_die_with_parent(parent);
        mp__child_run(chan);
    }
    *pid = child;
    return open_pidfd(child, pidfd, "mp_process_start");
}

/* ---- vfork + exec -------------------------------------------------------- */

/* What the vfork child needs, all prepared by the parent: the child may
 * only make raw system calls (it shares the parent's memory, and a libc or
 * sanitizer wrapper could take a lock or touch shared state). */
typedef struct exec_plan {
    const char *path;
    char *const *argv;
    char **envp;
    int chan;  /* >= 10, becomes fd 3 */
    int errfd; /* >= 10, becomes fd 4, O_CLOEXEC */
    pid_t parent;
    bool pdeathsig;
    sigset_t mask; /* the parent's mask, restored before exec */
} exec_plan;

/* The kernel's struct sigaction, enough to install SIG_DFL. */
struct ksigaction {
    void *handler;
    unsigned long flags;
    void *restorer;
    unsigned long mask;
};

static _Noreturn void exec_child(const exec_plan *pl)
{
    long err;
    struct ksigaction dfl = {0};
    /* Handlers are the parent's code: reset them before unblocking. */
    for (int s = 1; s < 65; s++)
        if (s != SIGKILL && s != SIGSTOP)
            syscall(SYS_rt_sigaction, s, &dfl, NULL, 8);
    if (syscall(SYS_dup3, pl->chan, 3, 0) < 0 || syscall(SYS_dup3, pl->errfd, 4, O_CLOEXEC) < 0)
        goto fail;
    /* Nothing else is inherited: no fd the parent forgot to mark CLOEXEC. */
    if (syscall(SYS_close_range, 5, ~0U, 0) < 0)
        goto fail;
    if (pl->pdeathsig)
        syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (syscall(SYS_getppid) != pl->parent)
        syscall(SYS_exit_group, 1);
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &pl->mask, NULL, 8);
    syscall(SYS_execve, pl->path, pl->argv, pl->envp);
fail:
    err = errno;
    syscall(SYS_write, 4, &err, sizeof err);
    syscall(SYS_exit_group, 127);
    __builtin_unreachable();
}

/* environ without other MPROC_SPAWN/MPROC_FORKSERVER values, plus var. */
static char **build_env(const char *var_value, const char *var)
{
    size_t n = 0, k = 0, vlen = strlen(var);
    char **envp;
    while (environ && environ[n])
        n++;
    envp = calloc(n + 2, sizeof *envp);
    if (!envp)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(environ[i], "MPROC_SPAWN=", 12) == 0 ||
            strncmp(environ[i], "MPROC_FORKSERVER=", 17) == 0 ||
            (strncmp(environ[i], var, vlen) == 0 && environ[i][vlen] == '='))
            continue;
        envp[k++] = environ[i];
    }
    envp[k] = (char *)var_value;
    return envp;
}

/* Parent side after vfork returned: did exec succeed? */
static int check_exec(pid_t child, int errread, const char *path, const char *call)
{
    long err = 0;
    ssize_t n;
    do
        n = mp__sys.read(errread, &err, sizeof err);
    while (n < 0 && errno == EINTR);
    if (n == 0)
        return 0; /* closed by exec: the program runs */
    if (n < 0) {
        /* Whether exec ran is unknown: the child may be running it, so a
         * plain waitpid could block for as long as it runs. */
        int err = errno;
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        return mp__errno_error(err, "%s: reading the exec status of %s", call, path);
    }
    waitpid(child, NULL, 0);
    if (n != (ssize_t)sizeof err)
        return mp__error(MP_ESYS, "%s: exec of %s failed (no error code)", call,
                         path);
    return mp__errno_error((int)err, "%s: exec of %s failed", call, path);
}

int mp__launch_exec(int chan, const char *var, bool pdeathsig, pid_t *pid, int *pidfd,
                    const char *call)
{
    char value[64];
    exec_plan pl = {.path = mp__exec_path,
                    .argv = mp__saved_argv(),
                    .chan = -1,
                    .errfd = -1,
                    .parent = getpid(),
                    .pdeathsig = pdeathsig};
    int errpipe[2] = {-1, -1}, rc = 0;
    sigset_t all;
    pid_t child;

    if (!pl.argv)
        return mp__setup_check(call);
    snprintf(value, sizeof value, "%s=3,%d", var, (int)pl.parent);
    pl.envp = build_env(value, var);
    if (!pl.envp)
        return mp__error(MP_ENOMEM, "%s: out of memory", call);
    if (pipe2(errpipe, O_CLOEXEC) < 0) {
        rc = mp__errno_error(errno, "%s: pipe2", call);
        goto out_env;
    }
    /* High copies, so the child's dup3 onto 3 and 4 never clobbers a source. */
    pl.chan = fcntl(chan, F_DUPFD_CLOEXEC, 10);
    pl.errfd = fcntl(errpipe[1], F_DUPFD_CLOEXEC, 10);
    if (pl.chan < 0 || pl.errfd < 0) {
        rc = mp__errno_error(errno, "%s: fcntl(F_DUPFD_CLOEXEC)", call);
        goto out_fds;
    }
    /* No handler may run in the child while it shares our memory. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &pl.mask);
    child = vfork();
    if (child == 0)
        exec_child(&pl);
    pthread_sigmask(SIG_SETMASK, &pl.mask, NULL);
    if (child < 0) {
        rc = mp__fork_error(errno, "%s: vfork", call);
        goto out_fds;
    }
    errpipe[1] = mp__close(errpipe[1]);
    pl.errfd = mp__close(pl.errfd);
    rc = check_exec(child, errpipe[0], pl.path, call);
    if (rc == 0) {
        *pid = child;
        rc = open_pidfd(child, pidfd, call);
    }
out_fds:
    mp__close(pl.chan);
    mp__close(pl.errfd);
    mp__close(errpipe[0]);
    mp__close(errpipe[1]);
out_env:
    free(pl.envp);
    return rc;
}
