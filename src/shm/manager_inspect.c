/* Looking at /dev/shm/mproc-* segments from outside: header, creator, and
 * which live processes still map them or hold an fd (for the daemon's scans
 * and `mproc shm ls/gc`). Never maps a segment. */
#include "shm/manager.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm/"

static int users_add(mp__seg_users *u, const char *name)
{
    for (int i = 0; i < u->n; i++)
        if (strcmp(u->names[i], name) == 0) {
            u->counts[i]++;
            return 0;
        }
    if (u->n == u->cap) {
        int cap = u->cap ? u->cap * 2 : 16;
        char(*names)[MP__SHM_NAME_MAX] = realloc(u->names, (size_t)cap * sizeof *names);
        if (!names)
            return mp__error(MP_ENOMEM, "shm inspect: out of memory");
        u->names = names;
        int *counts = realloc(u->counts, (size_t)cap * sizeof *counts);
        if (!counts)
            return mp__error(MP_ENOMEM, "shm inspect: out of memory");
        u->counts = counts;
        u->cap = cap;
    }
    snprintf(u->names[u->n], MP__SHM_NAME_MAX, "%s", name);
    u->counts[u->n++] = 1;
    return 0;
}

/* "/dev/shm/x" -> "/x" when match accepts "x"; else "" (also for
 * "/dev/shm/x (deleted)"). */
static void shm_name_of(const char *path, bool (*match)(const char *name), char *out)
{
    size_t n;
    out[0] = 0;
    if (strncmp(path, SHM_DIR, strlen(SHM_DIR)) != 0)
        return;
    path += strlen(SHM_DIR) - 1;
    n = strcspn(path, " \n");
    if (n < MP__SHM_NAME_MAX && strncmp(path + n, " (deleted)", 10) != 0) {
        memcpy(out, path, n);
        out[n] = 0;
        if (!match(out + 1))
            out[0] = 0;
    }
}

/* Names one process maps or holds open, each counted once for it. */
static int scan_process(mp__seg_users *u, bool (*match)(const char *name), const char *pid)
{
    char path[64], line[512], name[MP__SHM_NAME_MAX];
    mp__seg_users mine = {0};
    FILE *f;
    DIR *d;
    struct dirent *e;
    int rc = 0;

    snprintf(path, sizeof path, "/proc/%s/maps", pid);
    if ((f = fopen(path, "re"))) {
        while (rc == 0 && fgets(line, sizeof line, f)) {
            char *p = strchr(line, '/');
            if (p && (shm_name_of(p, match, name), name[0]))
                rc = users_add(&mine, name);
        }
        fclose(f);
    }
    snprintf(path, sizeof path, "/proc/%s/fd", pid);
    if (rc == 0 && (d = opendir(path))) {
        while (rc == 0 && (e = readdir(d))) {
            char link[300];
            ssize_t n;
            if (e->d_name[0] == '.')
                continue;
            snprintf(link, sizeof link, "/proc/%s/fd/%s", pid, e->d_name);
            n = readlink(link, line, sizeof line - 1);
            if (n <= 0)
                continue;
            line[n] = 0;
            if ((shm_name_of(line, match, name), name[0]))
                rc = users_add(&mine, name);
        }
        closedir(d);
    }
    for (int i = 0; rc == 0 && i < mine.n; i++)
        rc = users_add(u, mine.names[i]);
    mp__seg_users_free(&mine);
    return rc;
}

int mp__seg_users_collect(mp__seg_users *u, bool (*match)(const char *name))
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int rc = 0;
    memset(u, 0, sizeof *u);
    if (!d)
        return mp__errno_error(errno, "shm inspect: opendir(/proc)");
    while (rc == 0 && (e = readdir(d)))
        if (e->d_name[0] >= '1' && e->d_name[0] <= '9' && atoi(e->d_name) != getpid())
            rc = scan_process(u, match, e->d_name);
    closedir(d);
    if (rc < 0)
        mp__seg_users_free(u);
    return rc;
}

int mp__seg_users_count(const mp__seg_users *u, const char *name)
{
    int skip = name[0] != '/'; /* stored names start with '/' */
    for (int i = 0; i < u->n; i++)
        if (strcmp(u->names[i] + skip, name) == 0)
            return u->counts[i];
    return 0;
}

void mp__seg_users_free(mp__seg_users *u)
{
    free(u->names);
    free(u->counts);
    memset(u, 0, sizeof *u);
}

int mp__seg_inspect(const char *name, const mp__seg_users *u, mp__seg_info *info)
{
    char path[sizeof SHM_DIR + MP__SHM_NAME_MAX];
    mp__fs_header h;
    struct stat st;
    struct timespec now;
    int fd;

    memset(info, 0, sizeof *info);
    if (name[0] == '/')
        name++;
    if (!mp__mgr_name_ok(name))
        return mp__error(MP_EINVAL, "shm inspect: %s is not an mproc segment name", name);
    snprintf(info->name, sizeof info->name, "/%s", name);
    snprintf(path, sizeof path, SHM_DIR "%s", name);
    fd = mp__sys.open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    if (fd < 0)
        return mp__errno_error(errno, "shm inspect: open(%s)", path);
    if (mp__sys.fstat(fd, &st) != 0) {
        int err = errno;
        mp__sys.close(fd);
        return mp__errno_error(err, "shm inspect: fstat(%s)", path);
    }
    info->file_size = (uint64_t)st.st_size;
    clock_gettime(CLOCK_REALTIME, &now);
    info->age = (double)(now.tv_sec - st.st_ctim.tv_sec) +
                (now.tv_nsec - st.st_ctim.tv_nsec) / 1e9;
    if (pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == MP__FS_MAGIC &&
        h.version == MP__FS_VERSION) {
        info->has_header = true;
        info->size = h.size;
        info->creator = (pid_t)h.creator_pid;
        info->refcount = __atomic_load_n(&h.refcount, __ATOMIC_RELAXED);
    }
    mp__sys.close(fd);
    if (info->creator <= 0) /* no header yet: the name says "mproc-<pid>-..." */
        info->creator = (pid_t)atoi(name + strlen(MP__SHM_PREFIX));
    info->creator_alive = mp__pid_alive(info->creator);
    info->users = u ? mp__seg_users_count(u, info->name) : -1;
    return 0;
}

int mp__shm_each(bool (*match)(const char *name), int (*fn)(const char *name, void *ctx),
                 void *ctx)
{
    DIR *d = opendir(SHM_DIR);
    struct dirent *e;
    int n = 0;
    if (!d)
        return mp__errno_error(errno, "shm inspect: opendir(%s)", SHM_DIR);
    while ((e = readdir(d))) {
        struct stat st;
        if (!match(e->d_name))
            continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode) || st.st_uid != geteuid())
            continue;
        n++;
        if (fn(e->d_name, ctx) != 0)
            break;
    }
    closedir(d);
    return n;
}

int mp__seg_each(int (*fn)(const char *name, void *ctx), void *ctx)
{
    return mp__shm_each(mp__mgr_name_ok, fn, ctx);
}
