/* What the shm manager's client, daemon and CLI share: the runtime
 * directory, connecting, starting the daemon, and inspecting segments. */
#include "shm/manager.h"

#include <errno.h>
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

#ifndef MPROC_BUILD_BINDIR
#define MPROC_BUILD_BINDIR ""
#endif
#ifndef MPROC_INSTALL_BINDIR
#define MPROC_INSTALL_BINDIR "/usr/local/bin"
#endif

int mp__mgr_runtime_dir(char *buf, size_t cap, bool create)
{
    const char *env = getenv("MPROC_RUNTIME_DIR");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    int n;

    if (env && *env)
        n = snprintf(buf, cap, "%s", env);
    else if (xdg && xdg[0] == '/')
        n = snprintf(buf, cap, "%s/mproc", xdg);
    else
        n = snprintf(buf, cap, "/tmp/mproc-%u", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= cap - sizeof(MP__MGR_SOCKET) - 1)
        return mp__error(MP_EOVERFLOW, "shm manager: runtime directory path too long: %s", buf);
    if (create && mkdir(buf, 0700) != 0 && errno != EEXIST)
        return mp__errno_error(errno, "shm manager: mkdir(%s)", buf);
    if (lstat(buf, &st) != 0)
        return mp__errno_error(errno, "shm manager: runtime directory %s", buf);
    if (!S_ISDIR(st.st_mode))
        return mp__error(MP_EPERM, "shm manager: %s is not a directory; remove it", buf);
    if (st.st_uid != geteuid())
        return mp__error(MP_EPERM,
                         "shm manager: %s belongs to uid %u, not to us (uid %u); "
                         "set MPROC_RUNTIME_DIR to a private directory",
                         buf, (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & 077)
        return mp__error(MP_EPERM, "shm manager: %s is mode %03o; it must be 0700 (chmod 700 %s)",
                         buf, (unsigned)(st.st_mode & 0777), buf);
    return 0;
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
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return mp__errno_error(errno, "shm manager: socket");
    while (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int err = errno;
        if (err == EINTR)
            continue;
        close(fd);
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
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
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
        if (poll(&p, 1, ms) < 0 && errno != EINTR) {
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
        r = recv(fd, buf + len, cap - len - 1, MSG_DONTWAIT);
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
    close(fd);
    return rc;
}

const char *mp__mgr_binary(char *buf, size_t cap)
{
    const char *env = getenv("MPROC_SHM_MANAGER");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
        return buf;
    }
    if (MPROC_BUILD_BINDIR[0]) {
        snprintf(buf, cap, "%s/mproc-shm-manager", MPROC_BUILD_BINDIR);
        if (access(buf, X_OK) == 0)
            return buf;
    }
    snprintf(buf, cap, "%s/mproc-shm-manager", MPROC_INSTALL_BINDIR);
    if (access(buf, X_OK) == 0)
        return buf;
    snprintf(buf, cap, "mproc-shm-manager");
    return buf;
}

int mp__mgr_spawn(const char *arg, double timeout)
{
    char bin[4096];
    char *argv[3];
    int status = 0;
    pid_t pid, w;
    struct timespec ts = {0, 5 * 1000 * 1000};

    mp__mgr_binary(bin, sizeof bin);
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
    int err = strchr(bin, '/') ? posix_spawn(&pid, bin, NULL, &attr, argv, environ)
                               : posix_spawnp(&pid, bin, NULL, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (err == ENOENT || err == EACCES)
        return mp__error(MP_ENOENT,
                         "shm manager: cannot execute %s; set MPROC_SHM_MANAGER to the path "
                         "of mproc-shm-manager or add its directory to PATH", bin);
    if (err != 0)
        return mp__errno_error(err, "shm manager: posix_spawn(%s)", bin);
    /* a real deadline: counting 5 ms naps would stretch the wait on a busy machine */
    for (double deadline = mp__deadline(timeout);;) {
        w = waitpid(pid, &status, WNOHANG);
        if (w == pid || (w < 0 && errno == ECHILD))
            break;
        if (w < 0 && errno != EINTR)
            return mp__errno_error(errno, "shm manager: waitpid");
        if (mp__poll_ms(deadline) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return mp__error(MP_ETIMEDOUT, "shm manager: %s did not start in %.1f s", bin,
                             timeout);
        }
        nanosleep(&ts, NULL);
    }
    if (w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return mp__error(MP_ENOENT,
                         "shm manager: cannot execute %s; set MPROC_SHM_MANAGER to the path "
                         "of mproc-shm-manager or add its directory to PATH", bin);
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
