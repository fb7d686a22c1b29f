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
#include <sys/uio.h>
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

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older headers lack it */
#endif

/* The pages a new segment's file gets: written from parts, or zeroed. */
typedef struct fill {
    const mp__segment_part *parts;
    int nparts;
} fill;

static int size_file(int fd, size_t len)
{
    if (mp__sys.ftruncate(fd, (off_t)len) == 0)
        return 0;
    if (errno == ENOSPC)
        return no_space("ftruncate", len);
    return mp__errno_error(errno, "ftruncate(%zu bytes) of a shared segment", len);
}

/* Reserves file bytes [from, to) now, so a full /dev/shm is an error here
 * and not a SIGBUS at first touch. */
static int fallocate_range(int fd, size_t from, size_t to)
{
    int err;
    if (to <= from)
        return 0;
    /* posix_fallocate returns the error number; errno is untouched. */
    err = mp__sys.posix_fallocate(fd, (off_t)from, (off_t)(to - from));
    if (err == ENOSPC)
        return no_space("posix_fallocate", to - from);
    if (err != 0)
        return mp__errno_error(err, "posix_fallocate(%zu bytes) of a shared segment", to - from);
    return 0;
}

/* Reserves every page of a new file mapped at map. MADV_POPULATE_WRITE
 * allocates, zeroes and maps each page in one pass, so the first writes take
 * no page faults (posix_fallocate leaves one fault per page to the first
 * touch), and a page tmpfs refuses is EFAULT here instead of a SIGBUS later.
 * A kernel before 5.14 answers EINVAL and gets posix_fallocate. */
static int populate(int fd, void *map, size_t len)
{
    int rc;
    do
        rc = mp__sys.madvise(map, len, MADV_POPULATE_WRITE);
    while (rc != 0 && errno == EINTR);
    if (rc == 0)
        return 0;
    if (errno == EINVAL)
        return fallocate_range(fd, 0, len);
    if (errno == EFAULT) /* the fault's SIGBUS: tmpfs had no page to give */
        return no_space("madvise(MADV_POPULATE_WRITE)", len);
    if (errno == ENOMEM)
        return mp__errno_error(ENOMEM, "madvise(MADV_POPULATE_WRITE) of a %zu-byte shared "
                               "segment: out of memory (/dev/shm has %lld free; free memory "
                               "or raise this process's memory limit)",
                               len, mp__shm_free_bytes());
    return mp__errno_error(errno, "madvise(MADV_POPULATE_WRITE) of a %zu-byte shared segment",
                           len);
}

/* pwritev's iov from a partly written iov[0..n): drops what w covered. */
static int advance(struct iovec *iov, int n, size_t w)
{
    int i = 0;
    while (i < n && w >= iov[i].iov_len)
        w -= iov[i++].iov_len;
    if (i < n) {
        iov[i].iov_base = (char *)iov[i].iov_base + w;
        iov[i].iov_len -= w;
    }
    memmove(iov, iov + i, (size_t)(n - i) * sizeof *iov);
    return n - i;
}

/* Writes total bytes of iov[0..n) at off (a write may stop short). */
static int write_iov(int fd, struct iovec *iov, int n, size_t off, size_t total, size_t len)
{
    while (total > 0) {
        ssize_t w = mp__sys.pwritev(fd, iov, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == ENOSPC)
            return no_space("pwritev", len);
        if (w <= 0)
            return mp__errno_error(w < 0 ? errno : EIO,
                                   "pwritev(%zu bytes) into a shared segment", total);
        off += (size_t)w;
        total -= (size_t)w;
        n = advance(iov, n, (size_t)w);
    }
    return 0;
}

#define GAP_MAX 4096 /* gaps up to this are written as zeros in the same call */
#define IOV_BATCH 64
static const char zeros[GAP_MAX];

/* Writes f's parts at file offset base + part offset, a batch of parts and
 * their small gaps per pwritev, then reserves the whole pages no write
 * touched (an FS header, large gaps, the tail). pwrite fills a new tmpfs
 * page without zeroing it first and without page faults: half the memory
 * traffic of zeroing pages and copying into a mapping. */
static int write_parts(int fd, size_t base, const fill *f, size_t len)
{
    struct iovec iov[IOV_BATCH];
    size_t page = page_size(), done = 0, start = 0, end = 0; /* pages below done exist */
    int n = 0, rc;
    for (int i = 0; i <= f->nparts; i++) {
        const mp__segment_part *p = i < f->nparts ? &f->parts[i] : NULL;
        size_t off = p ? base + p->off : 0;
        if (p && !p->nbytes)
            continue;
        if (n && (!p || off - end > GAP_MAX || n > IOV_BATCH - 2)) {
            if ((rc = fallocate_range(fd, done, start / page * page)) < 0 ||
                (rc = write_iov(fd, iov, n, start, end - start, len)) < 0)
                return rc;
            done = (end + page - 1) / page * page;
            n = 0;
        }
        if (!p)
            break;
        if (n == 0)
            start = end = off;
        if (off > end)
            iov[n++] = (struct iovec){(void *)zeros, off - end};
        iov[n++] = (struct iovec){(void *)p->src, p->nbytes};
        end = off + p->nbytes;
    }
    return fallocate_range(fd, done, len);
}

/* Every page of the new file fd exists once this returns 0, and s maps it. */
static int fill_map(mp__segment *s, int fd, size_t len, size_t base, const fill *f)
{
    int rc = f ? write_parts(fd, base, f, len) : 0;
    if (rc < 0 || (rc = map_fd(s, fd, len)) < 0 || f)
        return rc;
    rc = populate(fd, s->map, len);
    if (rc < 0) {
        mp__sys.munmap(s->map, len);
        s->map = NULL;
    }
    return rc;
}

static int create_fd(mp__segment *s, size_t nbytes, size_t len, const fill *f)
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
    rc = fill_map(s, fd, len, 0, f);
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

static int create_fs(mp__segment *s, size_t nbytes, size_t len, const fill *f)
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
    rc = fill_map(s, fd, len, MP__FS_HEADER_SIZE, f);
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

static int create(size_t nbytes, int strategy, const fill *f, mp__segment **out)
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
        return no_space("creating a shared segment", len);
    s = mp__segment_alloc(strategy);
    if (!s)
        return mp__error(MP_ENOMEM, "creating a shared segment: out of memory");
    s->size = nbytes;
    rc = strategy == MP__STRATEGY_FD ? create_fd(s, nbytes, len, f) : create_fs(s, nbytes, len, f);
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

int mp__segment_create(size_t nbytes, int strategy, mp__segment **out)
{
    return create(nbytes, strategy, NULL, out);
}

/* What is wrong with part p of a segment of nbytes whose parts so far end at
 * end, or NULL. Python's Storage.filled hands its caller's parts here, so
 * the sentence says which rule a part broke. */
static const char *part_fault(const mp__segment_part *p, size_t end, size_t nbytes)
{
    if (p->nbytes && !p->src)
        return "has a NULL source";
    if (p->off < end)
        return "overlaps the part before (parts go in offset order)";
    if (p->nbytes > nbytes || p->off > nbytes - p->nbytes)
        return "ends past the segment";
    return NULL;
}

int mp__segment_create_filled(size_t nbytes, int strategy, const mp__segment_part *parts,
                              int nparts, mp__segment **out)
{
    const fill f = {parts, nparts};
    size_t end = 0;
    if (out)
        *out = NULL;
    if (nparts < 0 || (nparts && !parts))
        return mp__error(MP_EINVAL, "creating a shared segment: %d parts at %p", nparts,
                         (const void *)parts);
    for (int i = 0; i < nparts; i++) {
        const mp__segment_part *p = &parts[i];
        const char *why = part_fault(p, end, nbytes);
        if (why)
            return mp__error(MP_EINVAL, "creating a shared segment of %zu bytes: part %d "
                             "(%zu bytes at offset %zu) %s", nbytes, i, p->nbytes, p->off, why);
        end = p->off + p->nbytes;
    }
    return create(nbytes, strategy, &f, out);
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
    if (s->base) { /* an alias maps nothing of its own */
        mp__segment_alias_destroy(s);
        return;
    }
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
/* An alias maps nothing of its own: whether its mapping ever backed a
 * storage is its base's to say (the stats count mappings, not aliases). */
void mp__segment_set_user(mp__segment *s, void *user)
{
    s->user = user;
    s->had_user |= user != NULL;
    if (s->base)
        s->base->had_user |= user != NULL;
}
bool mp__segment_had_user(const mp__segment *s)
{
    return s->base ? s->base->had_user : s->had_user;
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
