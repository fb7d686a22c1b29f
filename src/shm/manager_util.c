/* What the shm manager's client, daemon and CLI share: the runtime
 * directory, connecting, starting the daemon, and inspecting segments. */
#include "shm/manager.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* The daemon's folder relative to the library's (libdir -> libexecdir/mproc)
 * and, for a program that linked libmproc.a, to the program's (bindir ->
 * libexecdir/mproc); set by CMakeLists.txt from the GNUInstallDirs layout.
 * Relative, so an installed tree can be moved anywhere. */
#ifndef MPROC_LIBEXEC_FROM_LIBDIR
#define MPROC_LIBEXEC_FROM_LIBDIR "../libexec/mproc"
#endif
#ifndef MPROC_LIBEXEC_FROM_BINDIR
#define MPROC_LIBEXEC_FROM_BINDIR "../libexec/mproc"
#endif
#define DAEMON_NAME "mproc-shm-manager"

/* Where the runtime directory is and who chose it. */
static int runtime_dir_path(char *buf, size_t cap, bool *from_env)
{
    const char *env = getenv("MPROC_RUNTIME_DIR");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    int n;
    *from_env = env && *env;
    /* a relative one would name another folder in each working directory */
    if (*from_env && env[0] != '/')
        return mp__error(MP_EINVAL, "shm manager: MPROC_RUNTIME_DIR=%s is not an absolute "
                         "path; set it to a private directory's full path (yours, mode "
                         "0700) or unset it", env);
    if (*from_env)
        n = snprintf(buf, cap, "%s", env);
    else if (xdg && xdg[0] == '/')
        n = snprintf(buf, cap, "%s/mproc", xdg);
    else
        n = snprintf(buf, cap, "/tmp/mproc-%u", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= cap - sizeof(MP__MGR_SOCKET) - 1)
        return mp__error(MP_EOVERFLOW,
                         "shm manager: runtime directory path too long: %s; set "
                         "MPROC_RUNTIME_DIR to a shorter private directory", buf);
    return 0;
}

static const char *file_kind(mode_t m)
{
    return S_ISLNK(m) ? "a symbolic link" : S_ISREG(m) ? "a regular file"
         : S_ISSOCK(m) ? "a socket" : S_ISFIFO(m) ? "a FIFO" : "not a directory";
}

/* problem/fix for a directory that exists but must not be used. mproc only
 * ever suggests removing the path it chose itself; a path the user chose
 * through $MPROC_RUNTIME_DIR may be anything (/etc/passwd), so the fix is
 * to point the variable elsewhere. */
static int runtime_dir_judge(const char *dir, const struct stat *st, bool env, char *problem,
                             size_t pcap, char *fix, size_t fcap)
{
    const char *var = env ? "MPROC_RUNTIME_DIR=" : "";
    if (!S_ISDIR(st->st_mode)) {
        snprintf(problem, pcap, "%s%s is %s, not a directory mproc made", var, dir,
                 file_kind(st->st_mode));
        if (env)
            snprintf(fix, fcap, "set MPROC_RUNTIME_DIR to a private directory (yours, mode "
                     "0700) or unset it");
        else
            snprintf(fix, fcap, "mproc keeps its socket in %s: if nothing of yours uses that "
                     "name, remove it (rm %s); or set MPROC_RUNTIME_DIR to a private directory",
                     dir, dir);
        return MP_EPERM;
    }
    if (st->st_uid != geteuid()) {
        snprintf(problem, pcap, "%s%s belongs to uid %u, not to you (uid %u)", var, dir,
                 (unsigned)st->st_uid, (unsigned)geteuid());
        snprintf(fix, fcap, env ? "set MPROC_RUNTIME_DIR to a directory you own (mode 0700) "
                                  "or unset it"
                                : "another user made it, so it cannot be trusted with mproc's "
                                  "socket; set MPROC_RUNTIME_DIR to a private directory");
        return MP_EPERM;
    }
    if (st->st_mode & 077) {
        snprintf(problem, pcap, "%s%s is mode %04o; other users can reach mproc's socket "
                 "there, it must be 0700", var, dir, (unsigned)(st->st_mode & 07777));
        snprintf(fix, fcap, env ? "chmod 700 %s (if it is meant for mproc alone), or set "
                                  "MPROC_RUNTIME_DIR to a private directory"
                                : "chmod 700 %s", dir);
        return MP_EPERM;
    }
    return 0;
}

int mp__mgr_runtime_dir_diagnose(char *buf, size_t cap, bool create, bool *exists,
                                 char *problem, size_t pcap, char *fix, size_t fcap)
{
    struct stat st;
    bool env;
    int rc = runtime_dir_path(buf, cap, &env);
    *exists = false;
    if (rc < 0) {
        snprintf(problem, pcap, "%s", mp_last_error());
        snprintf(fix, fcap, rc == MP_EINVAL ? "set MPROC_RUNTIME_DIR to an absolute path, or "
                                              "unset it"
                                            : "set MPROC_RUNTIME_DIR to a shorter private "
                                              "directory");
        return rc;
    }
    if (create && mp__sys.mkdir(buf, 0700) != 0 && errno != EEXIST) {
        rc = mp__errno_error(errno, "shm manager: mkdir(%s)", buf);
        snprintf(problem, pcap, "%s", mp_last_error());
        snprintf(fix, fcap, env ? "set MPROC_RUNTIME_DIR to a directory that can be created, "
                                  "or unset it" : "check that its parent directory exists "
                                  "and is writable, or set MPROC_RUNTIME_DIR");
        return rc;
    }
    if (mp__sys.lstat(buf, &st) != 0) {
        if (errno == ENOENT && !create)
            return 0;
        rc = mp__errno_error(errno, "shm manager: runtime directory %s", buf);
        snprintf(problem, pcap, "%s", mp_last_error());
        snprintf(fix, fcap, "set MPROC_RUNTIME_DIR to a private directory");
        return rc;
    }
    *exists = true;
    rc = runtime_dir_judge(buf, &st, env, problem, pcap, fix, fcap);
    if (rc < 0)
        return mp__error(rc, "shm manager: %s; %s", problem, fix);
    return 0;
}

int mp__mgr_runtime_dir(char *buf, size_t cap, bool create)
{
    char problem[512], fix[512];
    bool exists;
    int rc = mp__mgr_runtime_dir_diagnose(buf, cap, create, &exists, problem, sizeof problem,
                                          fix, sizeof fix);
    if (rc == 0 && !exists)
        return mp__error(MP_ENOENT, "shm manager: runtime directory %s does not exist", buf);
    return rc;
}

int mp__mgr_grace_env(double *out)
{
    int rc = mp__env_double("MPROC_SHM_MANAGER_GRACE", 0, MP__MGR_GRACE_MAX, out);
    return rc < 0 ? rc : 0;
}

int mp__mgr_path(char *buf, size_t cap, const char *file, bool create)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int rc = mp__mgr_runtime_dir(dir, sizeof dir, create);
    if (rc < 0)
        return rc;
    if ((size_t)snprintf(buf, cap, "%s/%s", dir, file) >= cap)
        return mp__error(MP_EOVERFLOW, "shm manager: path too long: %s/%s", dir, file);
    return 0;
}

int mp__mgr_connect(int *out)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int rc = mp__mgr_path(path, sizeof path, MP__MGR_SOCKET, false);
    *out = -1;
    return rc < 0 ? rc : mp__mgr_connect_at(path, out);
}

int mp__mgr_connect_at(const char *path, int *out)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = -1;
    *out = -1;
    if (snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path) >= (int)sizeof sa.sun_path)
        return mp__error(MP_EOVERFLOW, "shm manager: socket path too long: %s", path);
    /* Non-blocking: a blocking connect to a hung daemon whose backlog is
     * full would wait forever (a daemon asking its peers must not). */
    fd = mp__sys.socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return mp__errno_error(errno, "shm manager: socket");
    while (mp__sys.connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int err = errno;
        if (err == EINTR)
            continue;
        mp__close(fd);
        if (err == ECONNREFUSED || err == ENOENT)
            return mp__error(MP_ENOENT, "shm manager: no daemon listens on %s", sa.sun_path);
        if (err == EAGAIN)
            return mp__error(MP_EAGAIN, "shm manager: the daemon on %s does not accept "
                             "connections (backlog full); is it hung?", sa.sun_path);
        return mp__errno_error(err, "shm manager: connect(%s)", sa.sun_path);
    }
    /* Connected: from now on the control protocol blocks (with timeouts). */
    int fl = mp__sys.fcntl(fd, F_GETFL, 0);
    if (fl < 0 || mp__sys.fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int err = errno;
        mp__sys.close(fd);
        return mp__errno_error(err, "shm manager: fcntl(F_SETFL) on the control socket");
    }
    *out = fd;
    return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = mp__sys.send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return mp__errno_error(errno, "shm manager: send");
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int mp__mgr_control(const char *cmd, char **reply, double timeout)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int rc = mp__mgr_path(path, sizeof path, MP__MGR_SOCKET, false);
    *reply = NULL;
    return rc < 0 ? rc : mp__mgr_control_at(path, cmd, reply, timeout);
}

int mp__mgr_control_at(const char *path, const char *cmd, char **reply, double timeout)
{
    size_t len = 0, cap = 4096;
    char *buf = NULL;
    double deadline = mp__deadline(timeout);
    int fd = -1, rc = mp__mgr_connect_at(path, &fd);

    *reply = NULL;
    if (rc < 0)
        return rc;
    if ((rc = write_all(fd, cmd, strlen(cmd))) < 0 || (rc = write_all(fd, "\n", 1)) < 0)
        goto out_close;
    if (!(buf = malloc(cap))) {
        rc = mp__error(MP_ENOMEM, "shm manager: out of memory");
        goto out_close;
    }
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        ssize_t r;
        int ms = mp__poll_ms(deadline);
        if (ms == 0) {
            rc = mp__error(MP_ETIMEDOUT, "shm manager: no answer to %s in %.1f s", cmd, timeout);
            goto out_free;
        }
        if (mp__sys.poll(&p, 1, ms) < 0 && errno != EINTR) {
            rc = mp__errno_error(errno, "shm manager: poll");
            goto out_free;
        }
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                rc = mp__error(MP_ENOMEM, "shm manager: out of memory");
                goto out_free;
            }
            buf = nb;
        }
        r = mp__sys.recv(fd, buf + len, cap - len - 1, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
        buf[len] = 0;
        if ((len >= 4 && strcmp(buf + len - 4, "END\n") == 0) || strncmp(buf, "ERR ", 4) == 0)
            break;
    }
    buf[len] = 0;
    if (strncmp(buf, "ERR ", 4) == 0) {
        rc = mp__error(MP_EPERM, "shm manager: refused: %s", buf + 4);
        goto out_free;
    }
    if (len < 4 || strcmp(buf + len - 4, "END\n") != 0) {
        rc = mp__error(MP_EPROTO, "shm manager: truncated answer to %s", cmd);
        goto out_free;
    }
    *reply = buf;
    buf = NULL;
out_free:
    free(buf);
out_close:
    mp__close(fd);
    return rc;
}

/* Anything of ours: its address tells dladdr which object holds this code. */
static const char self_anchor;

/* The folder of the object this code was linked into: libmproc.so's, or the
 * program's when it linked libmproc.a (then *program is true). */
static int self_dir(char *dir, size_t cap, bool *program)
{
    Dl_info info;
    struct link_map *map = NULL;
    char real[PATH_MAX];
    const char *file;
    ssize_t n;

    if (!dladdr1(&self_anchor, &info, (void **)&map, RTLD_DL_LINKMAP) || !map)
        return mp__error(MP_ESYS, "shm manager: dladdr cannot name the object holding libmproc");
    /* The main program's link map has an empty name (dladdr then reports
     * argv[0], which may be relative or a lie); the kernel knows better. */
    *program = map->l_name[0] == '\0';
    if (*program) {
        if ((n = readlink("/proc/self/exe", real, sizeof real - 1)) <= 0)
            return mp__errno_error(errno, "shm manager: readlink(/proc/self/exe)");
        real[n] = '\0';
        file = real;
    } else {
        /* Through symlinks, to the folder the library really lives in. */
        file = realpath(info.dli_fname, real) ? real : info.dli_fname;
    }
    if ((size_t)snprintf(dir, cap, "%s", file) >= cap)
        return mp__error(MP_EOVERFLOW, "shm manager: path too long: %s", file);
    if (!strrchr(dir, '/'))
        return mp__error(MP_ESYS, "shm manager: libmproc's path \"%s\" has no folder", dir);
    *strrchr(dir, '/') = '\0';
    return 0;
}

int mp__mgr_binary(char *buf, size_t cap)
{
    const char *env = getenv("MPROC_SHM_MANAGER");
    char dir[PATH_MAX], next[PATH_MAX + sizeof DAEMON_NAME];
    bool program = false;
    int rc;

    if (env && strcmp(env, "none") == 0)
        return mp__error(MP_ENOENT, "shm manager: turned off (MPROC_SHM_MANAGER=none); unset "
                         "MPROC_SHM_MANAGER to protect file_system segments against leaks");
    if (env && *env) {
        if ((size_t)snprintf(buf, cap, "%s", env) >= cap)
            return mp__error(MP_EOVERFLOW, "shm manager: MPROC_SHM_MANAGER is too long");
        if (access(buf, X_OK) != 0)
            return mp__errno_error(errno, "shm manager: MPROC_SHM_MANAGER=%s is not an "
                                   "executable file; set it to the path of %s, or unset it",
                                   env, DAEMON_NAME);
        return 0;
    }
    if ((rc = self_dir(dir, sizeof dir, &program)) < 0)
        return rc;
    /* The installed layout first; then a daemon beside the library or
     * program, which is how the build tree (and a bundle that ships both
     * in one folder) holds it. No absolute path is compiled in. */
    snprintf(buf, cap, "%s/%s/%s", dir,
             program ? MPROC_LIBEXEC_FROM_BINDIR : MPROC_LIBEXEC_FROM_LIBDIR, DAEMON_NAME);
    if (access(buf, X_OK) == 0) {
        /* <prefix>/libexec/..., not <prefix>/lib/../libexec/..., in messages */
        if (realpath(buf, next) && strlen(next) < cap)
            memcpy(buf, next, strlen(next) + 1);
        return 0;
    }
    snprintf(next, sizeof next, "%s/%s", dir, DAEMON_NAME);
    if (access(next, X_OK) == 0) {
        if ((size_t)snprintf(buf, cap, "%s", next) >= cap)
            return mp__error(MP_EOVERFLOW, "shm manager: path too long: %s", next);
        return 0;
    }
    return mp__error(MP_ENOENT,
                     "shm manager: %s not found: neither %s nor %s is an executable file "
                     "(%s is in %s); install mproc's %s there, or set MPROC_SHM_MANAGER to "
                     "its path",
                     DAEMON_NAME, buf, next, program ? "this program" : "libmproc", dir,
                     DAEMON_NAME);
}

/* The launcher we give up on: killed and reaped, never left a zombie. */
static void reap_killed(pid_t pid)
{
    mp__sys.kill(pid, SIGKILL);
    while (mp__sys.waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

int mp__mgr_spawn(const char *arg, double timeout)
{
    char bin[4096];
    char *argv[3];
    int status = 0;
    pid_t pid, w;
    struct timespec ts = {0, 5 * 1000 * 1000};

    char why[512];
    double grace;
    int rc = mp__mgr_grace_env(&grace);
    if (rc < 0) { /* the daemon would refuse it: say why here, not in its log */
        snprintf(why, sizeof why, "%s", mp_last_error());
        return mp__error(rc, "shm manager: cannot start the daemon: %s", why);
    }
    rc = mp__mgr_binary(bin, sizeof bin);
    if (rc < 0)
        return rc;
    argv[0] = bin;
    argv[1] = (char *)arg;
    argv[2] = NULL;
    /* The launcher detaches the daemon (setsid, double fork) and exits as
     * soon as it listens, so the only child we reap is short-lived. */
    /* posix_spawn, not fork: it runs no atfork handlers, and the client
     * calls us while holding the lock its own atfork handler takes. */
    posix_spawnattr_t attr;
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    int err = mp__sys.posix_spawn(&pid, bin, NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (err == ENOENT || err == EACCES)
        return mp__error(MP_ENOENT,
                         "shm manager: cannot execute %s; set MPROC_SHM_MANAGER to the path "
                         "of mproc-shm-manager", bin);
    if (err != 0)
        return mp__errno_error(err, "shm manager: posix_spawn(%s)", bin);
    /* a real deadline: counting 5 ms naps would stretch the wait on a busy machine */
    for (double deadline = mp__deadline(timeout);;) {
        w = mp__sys.waitpid(pid, &status, WNOHANG);
        if (w == pid || (w < 0 && errno == ECHILD))
            break;
        if (w < 0 && errno != EINTR) {
            int err = errno;
            reap_killed(pid);
            return mp__errno_error(err, "shm manager: waitpid");
        }
        if (mp__poll_ms(deadline) == 0) {
            reap_killed(pid);
            return mp__error(MP_ETIMEDOUT, "shm manager: %s did not start in %.1f s", bin,
                             timeout);
        }
        nanosleep(&ts, NULL);
    }
    if (w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return mp__error(MP_ENOENT,
                         "shm manager: cannot execute %s; set MPROC_SHM_MANAGER to the path "
                         "of mproc-shm-manager", bin);
    if (w == pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        return mp__error(MP_ESYS, "shm manager: %s failed to start (status 0x%x); see %s in "
                         "the runtime directory", bin, (unsigned)status, MP__MGR_LOG);
    return 0;
}

bool mp__mgr_name_ok(const char *name)
{
    size_t n;
    if (!name)
        return false;
    if (name[0] == '/')
        name++;
    n = strlen(name);
    if (n + 2 > MP__SHM_NAME_MAX || strncmp(name, MP__SHM_PREFIX, strlen(MP__SHM_PREFIX)) != 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return false;
    }
    return n > strlen(MP__SHM_PREFIX);
}

bool mp__pid_alive(pid_t pid)
{
    char path[64];
    FILE *f;
    char buf[512], *p, state = 0;
    if (pid <= 0)
        return false;
    if (kill(pid, 0) != 0 && errno != EPERM)
        return false;
    /* A zombie is dead for our purposes: it maps nothing and sends nothing. */
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "re")))
        return true;
    if (fgets(buf, sizeof buf, f) && (p = strrchr(buf, ')')) && p[1] == ' ')
        state = p[2];
    fclose(f);
    return state != 'Z' && state != 'X';
}
