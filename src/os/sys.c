/* The swappable system-call table and its fault injection (tests only). */
#include "os/os.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

/* fcntl is variadic and fstat/posix_fallocate may be inline or redirected
 * in some libcs, so the table points at plain functions of our own. */
static int real_fcntl(int fd, int cmd, int arg)
{
    return fcntl(fd, cmd, arg);
}
static int real_fstat(int fd, struct stat *st)
{
    return fstat(fd, st);
}
static int real_posix_fallocate(int fd, off_t off, off_t len)
{
    return posix_fallocate(fd, off, len);
}
static int real_open(const char *path, int flags, mode_t mode)
{
    return open(path, flags, mode);
}
static int real_lstat(const char *path, struct stat *st)
{
    return lstat(path, st);
}

#define REAL_CALLS                                                                                 \
    {                                                                                              \
        .memfd_create = memfd_create, .shm_open = shm_open, .shm_unlink = shm_unlink,              \
        .ftruncate = ftruncate, .posix_fallocate = real_posix_fallocate, .mmap = mmap,             \
        .munmap = munmap, .madvise = madvise, .pwritev = pwritev, .sendmsg = sendmsg,              \
        .recvmsg = recvmsg, .socketpair = socketpair, .fcntl = real_fcntl, .fstat = real_fstat,    \
        .close = close, .dup = dup, .read = read, .socket = socket, .connect = connect,            \
        .send = send, .recv = recv, .poll = poll, .mkdir = mkdir, .open = real_open,               \
        .lstat = real_lstat, .readlink = readlink, .setsockopt = setsockopt,                       \
        .posix_spawn = posix_spawn, .waitpid = waitpid, .kill = kill,                              \
    }

const mp__sys_table mp__sys_real = REAL_CALLS;
mp__sys_table mp__sys = REAL_CALLS;

/* ---- fault injection ---------------------------------------------------- */

enum {
    F_MEMFD_CREATE,
    F_SHM_OPEN,
    F_SHM_UNLINK,
    F_FTRUNCATE,
    F_POSIX_FALLOCATE,
    F_MMAP,
    F_MUNMAP,
    F_MADVISE,
    F_PWRITEV,
    F_SENDMSG,
    F_RECVMSG,
    F_SOCKETPAIR,
    F_FCNTL,
    F_FSTAT,
    F_CLOSE,
    F_DUP,
    F_READ,
    F_SOCKET,
    F_CONNECT,
    F_SEND,
    F_RECV,
    F_POLL,
    F_MKDIR,
    F_OPEN,
    F_LSTAT,
    F_READLINK,
    F_SETSOCKOPT,
    F_POSIX_SPAWN,
    F_WAITPID,
    F_KILL,
    F_COUNT
};

static const char *const names[F_COUNT] = {
    [F_MEMFD_CREATE] = "memfd_create",
    [F_SHM_OPEN] = "shm_open",
    [F_SHM_UNLINK] = "shm_unlink",
    [F_FTRUNCATE] = "ftruncate",
    [F_POSIX_FALLOCATE] = "posix_fallocate",
    [F_MMAP] = "mmap",
    [F_MUNMAP] = "munmap",
    [F_MADVISE] = "madvise",
    [F_PWRITEV] = "pwritev",
    [F_SENDMSG] = "sendmsg",
    [F_RECVMSG] = "recvmsg",
    [F_SOCKETPAIR] = "socketpair",
    [F_FCNTL] = "fcntl",
    [F_FSTAT] = "fstat",
    [F_CLOSE] = "close",
    [F_DUP] = "dup",
    [F_READ] = "read",
    [F_SOCKET] = "socket",
    [F_CONNECT] = "connect",
    [F_SEND] = "send",
    [F_RECV] = "recv",
    [F_POLL] = "poll",
    [F_MKDIR] = "mkdir",
    [F_OPEN] = "open",
    [F_LSTAT] = "lstat",
    [F_READLINK] = "readlink",
    [F_SETSOCKOPT] = "setsockopt",
    [F_POSIX_SPAWN] = "posix_spawn",
    [F_WAITPID] = "waitpid",
    [F_KILL] = "kill",
};

static struct fault {
    int err, skip, count;
} faults[F_COUNT];

/* True when this call must fail: skip the first `skip` calls, then fail
 * `count` of them; afterwards the wrapper passes everything through. */
static bool hit(int i)
{
    struct fault *f = &faults[i];
    if (f->skip > 0) {
        f->skip--;
        return false;
    }
    if (f->count > 0) {
        f->count--;
        errno = f->err;
        return true;
    }
    return false;
}

static int f_memfd_create(const char *name, unsigned int flags)
{
    return hit(F_MEMFD_CREATE) ? -1 : mp__sys_real.memfd_create(name, flags);
}
static int f_shm_open(const char *name, int oflag, mode_t mode)
{
    return hit(F_SHM_OPEN) ? -1 : mp__sys_real.shm_open(name, oflag, mode);
}
static int f_shm_unlink(const char *name)
{
    return hit(F_SHM_UNLINK) ? -1 : mp__sys_real.shm_unlink(name);
}
static int f_ftruncate(int fd, off_t length)
{
    return hit(F_FTRUNCATE) ? -1 : mp__sys_real.ftruncate(fd, length);
}
static int f_posix_fallocate(int fd, off_t off, off_t len)
{
    /* returns the error number and leaves errno alone, like the real call */
    int err = errno;
    if (hit(F_POSIX_FALLOCATE)) {
        errno = err;
        return faults[F_POSIX_FALLOCATE].err;
    }
    return mp__sys_real.posix_fallocate(fd, off, len);
}
static void *f_mmap(void *addr, size_t length, int prot, int flags, int fd, off_t off)
{
    return hit(F_MMAP) ? MAP_FAILED : mp__sys_real.mmap(addr, length, prot, flags, fd, off);
}
static int f_munmap(void *addr, size_t length)
{
    return hit(F_MUNMAP) ? -1 : mp__sys_real.munmap(addr, length);
}
static int f_madvise(void *addr, size_t length, int advice)
{
    return hit(F_MADVISE) ? -1 : mp__sys_real.madvise(addr, length, advice);
}
static ssize_t f_pwritev(int fd, const struct iovec *iov, int n, off_t off)
{
    return hit(F_PWRITEV) ? -1 : mp__sys_real.pwritev(fd, iov, n, off);
}
static ssize_t f_sendmsg(int fd, const struct msghdr *msg, int flags)
{
    return hit(F_SENDMSG) ? -1 : mp__sys_real.sendmsg(fd, msg, flags);
}
static ssize_t f_recvmsg(int fd, struct msghdr *msg, int flags)
{
    return hit(F_RECVMSG) ? -1 : mp__sys_real.recvmsg(fd, msg, flags);
}
static int f_socketpair(int domain, int type, int protocol, int sv[2])
{
    return hit(F_SOCKETPAIR) ? -1 : mp__sys_real.socketpair(domain, type, protocol, sv);
}
static int f_fcntl(int fd, int cmd, int arg)
{
    return hit(F_FCNTL) ? -1 : mp__sys_real.fcntl(fd, cmd, arg);
}
static int f_fstat(int fd, struct stat *st)
{
    return hit(F_FSTAT) ? -1 : mp__sys_real.fstat(fd, st);
}
static int f_close(int fd)
{
    /* A failing close still releases the fd on Linux: do the same, so an
     * injected close failure never leaks. */
    if (hit(F_CLOSE)) {
        int err = errno;
        mp__sys_real.close(fd);
        errno = err;
        return -1;
    }
    return mp__sys_real.close(fd);
}
static int f_dup(int fd)
{
    return hit(F_DUP) ? -1 : mp__sys_real.dup(fd);
}
static ssize_t f_read(int fd, void *buf, size_t n)
{
    return hit(F_READ) ? -1 : mp__sys_real.read(fd, buf, n);
}

static int f_socket(int domain, int type, int protocol)
{
    return hit(F_SOCKET) ? -1 : mp__sys_real.socket(domain, type, protocol);
}
static int f_connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    return hit(F_CONNECT) ? -1 : mp__sys_real.connect(fd, addr, len);
}
static ssize_t f_send(int fd, const void *buf, size_t n, int flags)
{
    return hit(F_SEND) ? -1 : mp__sys_real.send(fd, buf, n, flags);
}
static ssize_t f_recv(int fd, void *buf, size_t n, int flags)
{
    return hit(F_RECV) ? -1 : mp__sys_real.recv(fd, buf, n, flags);
}
static int f_poll(struct pollfd *fds, nfds_t n, int timeout)
{
    return hit(F_POLL) ? -1 : mp__sys_real.poll(fds, n, timeout);
}
static int f_mkdir(const char *path, mode_t mode)
{
    return hit(F_MKDIR) ? -1 : mp__sys_real.mkdir(path, mode);
}

static int f_open(const char *path, int flags, mode_t mode)
{
    return hit(F_OPEN) ? -1 : mp__sys_real.open(path, flags, mode);
}
static int f_lstat(const char *path, struct stat *st)
{
    return hit(F_LSTAT) ? -1 : mp__sys_real.lstat(path, st);
}
static ssize_t f_readlink(const char *path, char *buf, size_t n)
{
    return hit(F_READLINK) ? -1 : mp__sys_real.readlink(path, buf, n);
}
static int f_setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    return hit(F_SETSOCKOPT) ? -1 : mp__sys_real.setsockopt(fd, level, name, val, len);
}
static int f_posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *acts,
                         const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
    /* returns the error number and leaves errno alone, like the real call */
    int err = errno;
    if (hit(F_POSIX_SPAWN)) {
        errno = err;
        return faults[F_POSIX_SPAWN].err;
    }
    return mp__sys_real.posix_spawn(pid, path, acts, attr, argv, envp);
}
static pid_t f_waitpid(pid_t pid, int *status, int options)
{
    return hit(F_WAITPID) ? -1 : mp__sys_real.waitpid(pid, status, options);
}
static int f_kill(pid_t pid, int sig)
{
    return hit(F_KILL) ? -1 : mp__sys_real.kill(pid, sig);
}

static void install(int i)
{
    switch (i) {
    case F_MEMFD_CREATE:
        mp__sys.memfd_create = f_memfd_create;
        break;
    case F_SHM_OPEN:
        mp__sys.shm_open = f_shm_open;
        break;
    case F_SHM_UNLINK:
        mp__sys.shm_unlink = f_shm_unlink;
        break;
    case F_FTRUNCATE:
        mp__sys.ftruncate = f_ftruncate;
        break;
    case F_POSIX_FALLOCATE:
        mp__sys.posix_fallocate = f_posix_fallocate;
        break;
    case F_MMAP:
        mp__sys.mmap = f_mmap;
        break;
    case F_MUNMAP:
        mp__sys.munmap = f_munmap;
        break;
    case F_MADVISE:
        mp__sys.madvise = f_madvise;
        break;
    case F_PWRITEV:
        mp__sys.pwritev = f_pwritev;
        break;
    case F_SENDMSG:
        mp__sys.sendmsg = f_sendmsg;
        break;
    case F_RECVMSG:
        mp__sys.recvmsg = f_recvmsg;
        break;
    case F_SOCKETPAIR:
        mp__sys.socketpair = f_socketpair;
        break;
    case F_FCNTL:
        mp__sys.fcntl = f_fcntl;
        break;
    case F_FSTAT:
        mp__sys.fstat = f_fstat;
        break;
    case F_CLOSE:
        mp__sys.close = f_close;
        break;
    case F_DUP:
        mp__sys.dup = f_dup;
        break;
    case F_READ:
        mp__sys.read = f_read;
        break;
    case F_SOCKET:
        mp__sys.socket = f_socket;
        break;
    case F_CONNECT:
        mp__sys.connect = f_connect;
        break;
    case F_SEND:
        mp__sys.send = f_send;
        break;
    case F_RECV:
        mp__sys.recv = f_recv;
        break;
    case F_POLL:
        mp__sys.poll = f_poll;
        break;
    case F_MKDIR:
        mp__sys.mkdir = f_mkdir;
        break;
    case F_OPEN:
        mp__sys.open = f_open;
        break;
    case F_LSTAT:
        mp__sys.lstat = f_lstat;
        break;
    case F_READLINK:
        mp__sys.readlink = f_readlink;
        break;
    case F_SETSOCKOPT:
        mp__sys.setsockopt = f_setsockopt;
        break;
    case F_POSIX_SPAWN:
        mp__sys.posix_spawn = f_posix_spawn;
        break;
    case F_WAITPID:
        mp__sys.waitpid = f_waitpid;
        break;
    case F_KILL:
        mp__sys.kill = f_kill;
        break;
    }
}

int mp__sys_fault(const char *call, int err, int skip, int count)
{
    if (!call || err <= 0 || skip < 0 || count < 0)
        return mp__error(MP_EINVAL, "mp__sys_fault: need a call name, an errno > 0, "
                                    "skip >= 0 and count >= 0");
    for (int i = 0; i < F_COUNT; i++) {
        if (strcmp(names[i], call) == 0) {
            faults[i].err = err;
            faults[i].skip = skip;
            faults[i].count = count;
            install(i);
            return 0;
        }
    }
    return mp__error(MP_ENOENT, "mp__sys_fault: no system call \"%s\" in mp__sys", call);
}

void mp__sys_fault_reset(void)
{
    for (int i = 0; i < F_COUNT; i++)
        faults[i].err = faults[i].skip = faults[i].count = 0;
    mp__sys = mp__sys_real;
}
