/* Foreign shared memory that mproc maps and sends without copying: a
 * segment another library made (torch's file_descriptor storages, a memfd
 * of the program's own) adopted from its fd, and the rule a receiver applies
 * to every fd that is not one of mproc's sealed memfds.
 *
 * The rule: the file must be shared memory that no process can shrink by
 * name. A memfd sealed with F_SEAL_SHRINK qualifies (mproc's own segments);
 * so does a POSIX segment already unlinked from /dev/shm, which only the
 * holders of an fd to it can reach. A named segment (anyone of the user can
 * open and truncate it), an unsealed memfd, a disk file (mapping it would
 * write through to the disk) or a pipe does not. */
#include "shm/shm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* fd's path as /proc/self/fd shows it ("/dev/shm/x (deleted)"); when it
 * cannot be read, why (which matches no path the rules accept). */
static void fd_path(int fd, char *path, size_t cap)
{
    char link[64];
    ssize_t n;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = mp__sys.readlink(link, path, cap - 1);
    if (n > 0)
        path[n] = '\0';
    else
        snprintf(path, cap, "path unknown: readlink %s: %s", link,
                 n < 0 ? strerror(errno) : "empty");
}

bool mp__shm_unlinked_posix(int fd, const struct stat *st)
{
    static const char want[] = "/dev/shm/";
    char path[256];
    if (!S_ISREG(st->st_mode) || st->st_nlink != 0)
        return false;
    fd_path(fd, path, sizeof path);
    return strncmp(path, want, sizeof want - 1) == 0;
}

static const char *file_kind(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a pipe";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISCHR(mode) || S_ISBLK(mode))
        return "a device";
    return "not a regular file";
}

static const char call[] = "mp_tensor_adopt_fd";

/* 0 when fd is a regular file of at least end bytes, else MP_EINVAL. */
static int check_file(int fd, const struct stat *st, uint64_t end)
{
    if (!S_ISREG(st->st_mode))
        return mp__error(MP_EINVAL, "%s: fd %d is %s, not a shared-memory file", call, fd,
                         file_kind(st->st_mode));
    if (st->st_size <= 0 || (uint64_t)st->st_size < end)
        return mp__error(MP_EINVAL, "%s: fd %d holds %lld bytes, fewer than offset + nbytes = "
                         "%llu", call, fd, (long long)st->st_size, (unsigned long long)end);
    return 0;
}

/* Why the receiver's rule refused fd (mp__segment_open's MP_EPROTO): an
 * MP_EINVAL sentence naming the case and what to do instead; 0 if fd
 * passes after all. Only run on failure, so adopting costs the rule's
 * system calls once. */
static int explain_refusal(int fd, const struct stat *st)
{
    char path[256];
    int seals = mp__sys.fcntl(fd, F_GET_SEALS, 0);
    if ((seals >= 0 && (seals & F_SEAL_SHRINK)) || mp__shm_unlinked_posix(fd, st))
        return 0;
    fd_path(fd, path, sizeof path);
    if (strncmp(path, "/dev/shm/", 9) == 0)
        return mp__error(MP_EINVAL, "%s: fd %d (%s) still has its name, so any process can "
                         "open and truncate it; shm_unlink the name first, or copy the data "
                         "(mp_tensor_from_blob + mp_tensor_share_memory_)", call, fd, path);
    if (seals >= 0 && strncmp(path, "/memfd:", 7) == 0)
        return mp__error(MP_EINVAL, "%s: fd %d (%s) is a memfd not sealed against shrinking, "
                         "so a reader could lose its pages; seal it with "
                         "fcntl(F_ADD_SEALS, F_SEAL_SHRINK) first", call, fd, path);
    return mp__error(MP_EINVAL, "%s: fd %d (%s) is not shared memory (a memfd or a /dev/shm "
                     "segment); copy the data instead (mp_tensor_from_blob + "
                     "mp_tensor_share_memory_)", call, fd, path);
}

int mp__segment_adopt_fd(int fd, uint64_t end, mp__segment **out)
{
    mp__segment_handle h = {.strategy = MP__STRATEGY_FD, .fd = -1};
    struct stat st;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_tensor_adopt_fd: NULL out");
    *out = NULL;
    if (fd < 0 || mp__sys.fstat(fd, &st) != 0) {
        if (fd < 0 || errno == EBADF)
            return mp__error(MP_EINVAL, "mp_tensor_adopt_fd: fd %d is not an open file "
                             "descriptor", fd);
        return mp__errno_error(errno, "mp_tensor_adopt_fd: fstat(fd %d)", fd);
    }
    if ((rc = check_file(fd, &st, end)) < 0)
        return rc;
    /* Our own fd: the caller may close theirs at once, and the segment
     * (with every message carrying it) outlives the foreign owner. */
    h.fd = mp__sys.fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (h.fd < 0)
        return mp__errno_error(errno, "mp_tensor_adopt_fd: dup of fd %d", fd);
    h.size = (uint64_t)st.st_size;
    /* The receiver's own rule decides (what is adopted is what peers accept);
     * a refusal is explained in terms of this call */
    rc = mp__segment_open(&h, out);
    if (rc == MP_EPROTO) {
        int why = explain_refusal(fd, &st);
        return why < 0 ? why : rc;
    }
    return rc;
}
