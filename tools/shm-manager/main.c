/* mproc-shm-manager: one per user, started on demand by the library (or by
 * `mproc shm-manager start`). Tracks the file_system segments its clients
 * report and unlinks them once nobody can use them (see table.c and
 * docs/cli.md). Liveness comes from the kernel: a client is gone when its
 * connection reads EOF or its pidfd becomes readable.
 *
 *   mproc-shm-manager [--foreground] [--grace SECONDS] [--persistent]
 *   mproc-shm-manager --help | --version
 *
 * Without --foreground it detaches (new session, double fork, stdio to
 * /dev/null and the log file in the runtime directory) and the starting
 * process exits 0 once the daemon listens, or once it finds another daemon
 * already listening (exactly one holds the lock file). */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loop.h"

void dlog(const char *fmt, ...)
{
    char when[32];
    struct timespec ts;
    struct tm tm;
    va_list ap;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ldZ mproc-shm-manager[%d]: ", when, ts.tv_nsec / 1000000,
            (int)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mproc-shm-manager [--foreground] [--grace SECONDS] [--persistent]\n"
               "       mproc-shm-manager --help | --version\n"
               "  Normally started by libmproc on demand; see `mproc help shm-manager`.\n"
               "  -f, --foreground   do not detach; log to stderr\n"
               "  -g, --grace S      seconds to wait after the last client is gone before\n"
               "                     reclaiming what is left and exiting: a number from 0\n"
               "                     to %.0f (default %.0f, or $MPROC_SHM_MANAGER_GRACE)\n"
               "  -p, --persistent   reclaim after the grace period but do not exit\n"
               "  -h, --help         this text\n"
               "  -V, --version      print the version\n"
               "  Exit status: 0 running (or another daemon already serves), 1 failure,\n"
               "  2 bad arguments or a bad environment variable.\n",
            MP__MGR_GRACE_MAX, MP__MGR_GRACE_DEFAULT);
}

/* Returns the write end of a pipe the final daemon reports readiness on;
 * the calling process never returns (it exits with the daemon's verdict). */
static int detach(const char *log_path)
{
    int p[2], fd;
    char verdict = 0;
    pid_t pid;

    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid = fork();
    if (pid < 0)
        return -1;
    if (pid > 0) {
        close(p[1]);
        while (read(p[0], &verdict, 1) < 0 && errno == EINTR)
            ;
        waitpid(pid, NULL, 0);
        _exit(verdict == 'R' || verdict == 'A' ? 0 : 1);
    }
    close(p[0]);
    setsid();
    pid = fork();
    if (pid != 0)
        _exit(pid < 0);
    if (chdir("/") != 0)
        _exit(1);
    fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
        dup2(fd, 0);
        dup2(fd, 1);
        if (fd > 1)
            close(fd);
    }
    /* Keep the log small: start afresh when it passed 1 MiB. */
    struct stat st;
    int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC;
    if (stat(log_path, &st) == 0 && st.st_size > (1 << 20))
        flags |= O_TRUNC;
    fd = open(log_path, flags, 0600);
    if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
    } else {
        dup2(1, 2);
    }
    return p[1];
}

void starter_tell(int ready_fd, char verdict)
{
    if (ready_fd >= 0) {
        (void)!write(ready_fd, &verdict, 1);
        close(ready_fd);
    }
}

/* Exactly one daemon: the one holding the lock. A loser waits a little in
 * case the holder is exiting, and leaves as soon as a daemon answers. */
static int take_lock(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        dlog("open(%s): %s", path, strerror(errno));
        return -1;
    }
    for (int i = 0; i < 300; i++) {
        int c;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
                dlog("cannot record our pid in %s: %s", path, strerror(errno));
            return fd;
        }
        if (errno != EWOULDBLOCK && errno != EINTR)
            break;
        if (mp__mgr_connect(&c) == 0) {
            close(c);
            close(fd);
            return -2; /* another daemon serves */
        }
        usleep(10000);
    }
    dlog("lock %s held by a daemon that does not answer", path);
    close(fd);
    return -1;
}

/* getopt_long's '?' or ':' for arg: says which option and why; exit 2. */
static int bad_option(int c, const char *arg)
{
    const char *what = c == ':' ? "a value is missing after" : "unknown option";
    if (optopt && strncmp(arg, "--", 2) != 0) /* optopt names a short option */
        fprintf(stderr, "mproc-shm-manager: %s -%c\n", what, optopt);
    else
        fprintf(stderr, "mproc-shm-manager: %s %.*s\n", what, (int)strcspn(arg, "="), arg);
    usage(stderr);
    return 2;
}

/* Options and $MPROC_SHM_MANAGER_GRACE into cfg; -1 to go on, else the
 * exit status (0 after --help/--version, 2 on a bad value). A bad variable
 * is refused even with --grace: it would bite the next start without one. */
static int parse_args(int argc, char **argv, loop_config *cfg, bool *foreground)
{
    static const struct option opts[] = {{"foreground", no_argument, 0, 'f'},
                                         {"grace", required_argument, 0, 'g'},
                                         {"persistent", no_argument, 0, 'p'},
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    int c;
    if (mp__mgr_grace_env(&cfg->grace) < 0) {
        fprintf(stderr, "mproc-shm-manager: refusing to start: %s\n", mp_last_error());
        return 2;
    }
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":fg:phV", opts, NULL)) != -1) {
        switch (c) {
        case 'f':
            *foreground = true;
            break;
        case 'g':
            if (mp__parse_double("--grace", optarg, 0, MP__MGR_GRACE_MAX, &cfg->grace) < 0) {
                fprintf(stderr, "mproc-shm-manager: %s\n", mp_last_error());
                return 2;
            }
            break;
        case 'p':
            cfg->persistent = true;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("mproc-shm-manager %s (libmproc %s)\n", MP_VERSION_STRING, mp_version());
            return 0;
        default:
            return bad_option(c, argv[optind - 1]);
        }
    }
    if (optind != argc) {
        fprintf(stderr, "mproc-shm-manager: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

int main(int argc, char **argv)
{
    loop_config cfg = {.grace = MP__MGR_GRACE_DEFAULT};
    char lock_path[4096], log_path[4096];
    int ready_fd = -1, lock_fd, rc;
    bool foreground = false;

    if ((rc = parse_args(argc, argv, &cfg, &foreground)) >= 0)
        return rc;
    /* Whatever the starter left open is not ours to keep alive. */
    syscall(SYS_close_range, 3u, ~0u, 0u);
    signal(SIGPIPE, SIG_IGN);
    umask(077);
    if ((rc = mp__mgr_path(lock_path, sizeof lock_path, MP__MGR_LOCK, true)) < 0 ||
        (rc = mp__mgr_path(log_path, sizeof log_path, MP__MGR_LOG, true)) < 0) {
        fprintf(stderr, "mproc-shm-manager: %s\n", mp_last_error());
        return 1;
    }
    if (!foreground && (ready_fd = detach(log_path)) < 0) {
        perror("mproc-shm-manager: detach");
        return 1;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max; /* one fd + one pidfd per client */
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    lock_fd = take_lock(lock_path);
    if (lock_fd == -2) {
        starter_tell(ready_fd, 'A');
        return 0;
    }
    if (lock_fd < 0) {
        starter_tell(ready_fd, 'F');
        return 1;
    }
    rc = loop_run(&cfg, ready_fd);
    close(lock_fd);
    return rc;
}
