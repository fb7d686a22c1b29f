/* Creating, mapping and releasing shared segments under both strategies. */
#include "shm/recycle.h"
#include "shm/shm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

static atomic_int live; /* segments mapped by this process */
static atomic_ullong user_unmapped; /* of those unmapped, the ones that had a user */

static size_t page_size(void)
{
    static size_t page;
    if (!page)
        page = (size_t)sysconf(_SC_PAGESIZE);
    return page;
}

/* Bytes of the file behind nbytes data bytes (whole pages, at least one). */
static int file_bytes(size_t nbytes, int strategy, size_t *out)
{
    size_t page = page_size(), n = nbytes ? nbytes : 1;
    size_t header = strategy == MP__STRATEGY_FS ? MP__FS_HEADER_SIZE : 0;
    if (n > (size_t)INT64_MAX - page - header)
        return mp__error(MP_EOVERFLOW, "shared segment of %zu bytes is too large", nbytes);
    *out = (n + page - 1) / page * page + header;
    return 0;
}

/* mp__errno_error appends ENOSPC's text and its fix (enlarge /dev/shm). */
static int no_space(const char *call, size_t need)
{
    return mp__errno_error(ENOSPC, "%s: needs %zu bytes, /dev/shm has %lld free", call, need,
                           mp__shm_free_bytes());
}

/* "/mproc-<pid>-<16 hex>" from getrandom, so names cannot be guessed. */
int mp__shm_random_name(char *name, size_t cap)
{
    uint64_t r;
    ssize_t n;
    do
        n = getrandom(&r, sizeof r, 0);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof r)
        return mp__errno_error(n < 0 ? errno : EIO, "getrandom for a segment name");
    snprintf(name, cap, "/" MP__SHM_PREFIX "%d-%016llx", (int)mp__pid(), (unsigned long long)r);
    return 0;
}

/* Opens a new named segment: O_CREAT|O_EXCL, 0600, retried on a name clash. */
static int open_new_named(char *name, int *fd)
{
    for (int tries = 0; tries < 16; tries++) {
        int rc = mp__shm_random_name(name, MP__SHM_NAME_MAX);
        if (rc < 0)
            return rc;
        *fd = mp__sys.shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (*fd >= 0)
            return 0;
        if (errno != EEXIST)
            return mp__errno_error(errno, "shm_open(%s, O_CREAT|O_EXCL)", name);
    }
    return mp__error(MP_ESYS, "shm_open: 16 random names in a row already existed");
}

/* Sizes fd to len bytes and reserves every page now, so a full /dev/shm is
 * an error here and not a SIGBUS at first touch. */
static int size_file(int fd, size_t len)
{
    int err;
    if (mp__sys.ftruncate(fd, (off_t)len) != 0) {
        if (errno == ENOSPC)
            return no_space("ftruncate", len);
        return mp__errno_error(errno, "ftruncate(%zu bytes) of a shared segment", len);
    }
    /* posix_fallocate returns the error number; errno is untouched. */
    err = mp__sys.posix_fallocate(fd, 0, (off_t)len);
    if (err == ENOSPC)
        return no_space("posix_fallocate", len);
    if (err != 0)
        return mp__errno_error(err, "posix_fallocate(%zu bytes) of a shared segment", len);
    return 0;
}

static int map_fd(mp__segment *s, int fd, size_t len)
{
    struct stat st;
    void *p;
    if (mp__sys.fstat(fd, &st) != 0)
        return mp__errno_error(errno, "fstat of a shared segment");
    p = mp__sys.mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return mp__errno_error(errno, "mmap(%zu bytes) of a shared segment", len);
    s->map = p;
    s->map_len = len;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    return 0;
}

static int create_fd(mp__segment *s, size_t nbytes, size_t len)
{
    char name[MP__SHM_NAME_MAX];
    bool sealable = true;
    int fd = mp__sys.memfd_create("mproc", MFD_CLOEXEC | MFD_ALLOW_SEALING), rc;
    if (fd < 0 && (errno == ENOSYS || errno == EINVAL)) {
        /* No memfd (old kernel, seccomp): a POSIX segment unlinked at once is
         * as anonymous, though it cannot be sealed. */
        sealable = false;
        rc = open_new_named(name, &fd);
        if (rc < 0)
            return rc;
        mp__sys.shm_unlink(name);
    } else if (fd < 0) {
        return mp__errno_error(errno, "memfd_create for a %zu-byte shared segment", nbytes);
    }
    rc = size_file(fd, len);
    if (rc < 0)
        goto out_close;
    if (sealable && mp__sys.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
        rc = mp__errno_error(errno, "fcntl(F_ADD_SEALS) of a shared segment");
        goto out_close;
    }
    rc = map_fd(s, fd, len);
    if (rc < 0)
        goto out_close;
    s->fd = fd;
    s->data = s->map;
    return 0;
out_close:
    mp__close(fd);
    return rc;
}

static void unlink_name(const char *name)
{
    const mp__shm_hooks *h = mp__shm_hooks_get();
    mp__sys.shm_unlink(name);
    if (h->unlinked)
        h->unlinked(name);
}

void mp__fs_unref(mp__fs_header *hd, const char *name)
{
    if (__atomic_sub_fetch(&hd->refcount, 1, __ATOMIC_ACQ_REL) == 0)
        unlink_name(name);
}

static int create_fs(mp__segment *s, size_t nbytes, size_t len)
{
    const mp__shm_hooks *h = mp__shm_hooks_get();
    mp__fs_header *hd;
    int fd = -1, rc = open_new_named(s->name, &fd);
    if (rc < 0)
        return rc;
    /* report before anything else, so a crash from here on is reclaimable */
    if (h->created)
        h->created(s->name, nbytes);
    s->reported = true;
    rc = size_file(fd, len);
    if (rc < 0)
        goto out_unlink;
    rc = map_fd(s, fd, len);
    if (rc < 0)
        goto out_unlink;
    mp__close(fd);
    hd = s->map;
    hd->version = MP__FS_VERSION;
    hd->creator_pid = (uint32_t)mp__pid();
    hd->size = nbytes;
    hd->flags = 0;
    __atomic_store_n(&hd->refcount, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&hd->magic, MP__FS_MAGIC, __ATOMIC_RELEASE);
    s->data = (char *)s->map + MP__FS_HEADER_SIZE;
    s->ref_pid = mp__pid();
    return 0;
out_unlink:
    mp__close(fd);
    unlink_name(s->name);
    s->name[0] = '\0';
    return rc;
}

mp__segment *mp__segment_alloc(int strategy)
{
    mp__segment *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    atomic_init(&s->refs, 1);
    s->strategy = strategy;
    s->fd = -1;
    return s;
}

int mp__segment_create(size_t nbytes, int strategy, mp__segment **out)
{
    mp__segment *s, *cached;
    long long avail;
    size_t len = 0;
    int rc;
    if (!out || (strategy != MP__STRATEGY_FD && strategy != MP__STRATEGY_FS))
        return mp__error(MP_EINVAL, "mp__segment_create: bad strategy %d or NULL out", strategy);
    *out = NULL;
    rc = file_bytes(nbytes, strategy, &len);
    if (rc < 0)
        return rc;
    /* Both strategies answer to the /dev/shm budget, so a request that
     * cannot fit fails the same way under each and never starts eating
     * memory (a memfd is otherwise bounded only by RAM). */
    avail = mp__shm_free_bytes();
    if (avail >= 0 && (unsigned long long)len > (unsigned long long)avail)
        return no_space("mp__segment_create", len);
    s = mp__segment_alloc(strategy);
    if (!s)
        return mp__error(MP_ENOMEM, "mp__segment_create: out of memory");
    s->size = nbytes;
    rc = strategy == MP__STRATEGY_FD ? create_fd(s, nbytes, len) : create_fs(s, nbytes, len);
    if (rc < 0) {
        free(s);
        return rc;
    }
    atomic_fetch_add(&live, 1);
    cached = mp__cache_insert(s);
    if (cached != s) { /* cannot happen for a new inode; stay safe anyway */
        mp__segment_release(cached);
    }
    *out = s;
    return 0;
}

mp__segment *mp__segment_retain(mp__segment *s)
{
    if (s)
        atomic_fetch_add(&s->refs, 1);
    return s;
}

/* Unmaps and frees s (its refs are gone and it is out of the cache). Under
 * FS it drops this process's header reference first; the last one unlinks
 * the name, after the `closed` hook has run. */
void mp__segment_destroy(mp__segment *s)
{
    const mp__shm_hooks *h = mp__shm_hooks_get();
    bool fs = s->strategy == MP__STRATEGY_FS, last = false;
    /* A forked child inherits the mapping but not the header reference,
     * which stays with the process that took it. */
    if (fs && s->ref_pid == mp__pid())
        last = __atomic_sub_fetch(&((mp__fs_header *)s->map)->refcount, 1,
                                  __ATOMIC_ACQ_REL) == 0;
    mp__sys.munmap(s->map, s->map_len);
    mp__close(s->fd);
    if (fs && h->batch)
        h->batch(true);
    /* A mapping that lost the cache race was never reported open. */
    if (fs && s->reported && h->closed)
        h->closed(s->name);
    if (last)
        unlink_name(s->name);
    if (fs && h->batch)
        h->batch(false);
    atomic_fetch_sub(&live, 1);
    if (s->had_user)
        atomic_fetch_add_explicit(&user_unmapped, 1, memory_order_relaxed);
    free(s);
}

void mp__segment_release(mp__segment *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    mp__cache_remove(s);
    if (!mp__segment_recycle(s))
        mp__segment_destroy(s);
}

void *mp__segment_data(const mp__segment *s)
{
    return s->data;
}
size_t mp__segment_size(const mp__segment *s)
{
    return s->size;
}
int mp__segment_strategy(const mp__segment *s)
{
    return s->strategy;
}
int mp__segment_fd(const mp__segment *s)
{
    return s->strategy == MP__STRATEGY_FD ? s->fd : -1;
}
const char *mp__segment_name(const mp__segment *s)
{
    return s->strategy == MP__STRATEGY_FS ? s->name : NULL;
}
void *mp__segment_user(const mp__segment *s)
{
    return s->user;
}
void mp__segment_set_user(mp__segment *s, void *user)
{
    s->user = user;
    s->had_user |= user != NULL;
}
bool mp__segment_had_user(const mp__segment *s)
{
    return s->had_user;
}
uint64_t mp__segment_user_unmapped(void)
{
    return atomic_load_explicit(&user_unmapped, memory_order_relaxed);
}
int mp__segment_count(void)
{
    return atomic_load(&live);
}

/* For handle.c. */
void mp__segment_live_add(void)
{
    atomic_fetch_add(&live, 1);
}
