/* One sealed memfd segment per sync object: creation, the per-process
 * handle, and how it crosses the wire (the fd plus kind and size). */
#include "sync/sync_internal.h"
#include "wire/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* The handle lives in a private page just below the shared mapping, at a
 * fixed distance from it (MP__SYNC_GAP): a lock's fast path finds the
 * shared words by adding to the handle's address, not by loading
 * s->base first (a dependent load that every acquire and release would
 * wait for). One reservation holds both, so one munmap drops both. */
static int map_handle(int kind, int fd, size_t size, const char *call, mp__sync **out)
{
    size_t pg = page_round(1);
    char *r = mp__sys.mmap(NULL, pg + size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
    if (r == MAP_FAILED)
        return mp__errno_error(errno, "%s: mmap(%zu bytes)", call, pg + size);
    void *base = mp__sys.mmap(r + pg, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (base == MAP_FAILED) {
        int err = errno;
        mp__sys.munmap(r, pg + size);
        return mp__errno_error(err, "%s: mmap(%zu bytes)", call, size);
    }
    mp__sync *s = (mp__sync *)(r + pg - MP__SYNC_GAP);
    atomic_init(&s->refs, 1);
    s->kind = kind;
    s->fd = fd;
    s->size = size;
    s->base = base;
    *out = s;
    return 0;
}

/* Unmaps the handle's page and, unless base was cleared (a hook keeps the
 * shared mapping), the shared mapping; s is gone after. */
static void unmap_handle(mp__sync *s)
{
    size_t pg = page_round(1), size = s->size;
    char *r = (char *)s + MP__SYNC_GAP - pg;
    mp__sys.munmap(r, s->base ? pg + size : pg);
}

int mp__sync_new(int kind, size_t size, const char *call, mp__sync **out)
{
    int fd = -1, rc, err;
    mp__sync_hdr *h;

    size = page_round(size);
    fd = mp__sys.memfd_create("mproc-sync", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        rc = mp__errno_error(errno, "%s: memfd_create", call);
        goto out;
    }
    /* fallocate, so a full /dev/shm is an error now and not a SIGBUS later */
    err = mp__sys.posix_fallocate(fd, 0, (off_t)size);
    if (err) {
        rc = mp__errno_error(err, "%s: posix_fallocate(%zu bytes)", call, size);
        goto out_close;
    }
    if (mp__sys.fcntl(fd, F_ADD_SEALS, SEALS) < 0) {
        rc = mp__errno_error(errno, "%s: fcntl(F_ADD_SEALS)", call);
        goto out_close;
    }
    rc = map_handle(kind, fd, size, call, out);
    if (rc)
        goto out_close;
    h = (*out)->base;
    h->magic = MP__SYNC_MAGIC;
    h->version = MP__SYNC_VERSION;
    h->kind = (uint32_t)kind;
    h->size = size;
    return 0;

out_close:
    mp__close(fd);
out:
    return rc;
}

void mp__sync_retain(mp__sync *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

void mp__sync_release(mp__sync *s, void (*unmap_hook)(mp__sync *s))
{
    if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (unmap_hook)
        unmap_hook(s);
    int fd = s->fd;
    unmap_handle(s);
    mp__close(fd);
}

/* ---- wire --------------------------------------------------------------- */

typedef struct wire_desc {
    uint32_t kind;
    uint32_t reserved;
    uint64_t size;
} wire_desc;

static int sync_encode(void *obj, void *buf, size_t cap, size_t *len, int *fds, int maxfds,
                       int *nfds)
{
    mp__sync *s = obj;
    wire_desc d = {(uint32_t)s->kind, 0, s->size};
    if (cap < sizeof d || maxfds < 1)
        return mp__error(MP_EOVERFLOW, "sync object encode: no room for its handle");
    memcpy(buf, &d, sizeof d);
    *len = sizeof d;
    fds[0] = s->fd;
    *nfds = 1;
    return 0;
}

/* Checks that fd is a sealed segment of the announced size, maps it and
 * checks the header. Takes ownership of fd. */
static int sync_decode_kind(int kind, const void *buf, size_t len, int *fds, int nfds,
                            void **obj)
{
    wire_desc d;
    struct stat st;
    int fd = nfds == 1 ? fds[0] : -1, seals, rc;
    mp__sync *s;
    const mp__sync_hdr *h;

    for (int i = 1; i < nfds; i++)
        mp__close(fds[i]);
    if (fd < 0 || len != sizeof d) {
        rc = mp__error(MP_EPROTO, "sync object decode: want 1 fd and %zu bytes, got %d "
                       "and %zu", sizeof d, nfds, len);
        goto out_close;
    }
    memcpy(&d, buf, sizeof d);
    if (d.kind != (uint32_t)kind || d.size == 0 || d.size > (1u << 20)) {
        rc = mp__error(MP_EPROTO, "sync object decode: bad kind %u or size %llu", d.kind,
                       (unsigned long long)d.size);
        goto out_close;
    }
    seals = mp__sys.fcntl(fd, F_GET_SEALS, 0);
    if (mp__sys.fstat(fd, &st) < 0 || seals < 0 || (seals & F_SEAL_SHRINK) == 0 ||
        (uint64_t)st.st_size != d.size) {
        rc = mp__error(MP_EPROTO, "sync object decode: the fd is not a sealed segment of "
                       "%llu bytes", (unsigned long long)d.size);
        goto out_close;
    }
    rc = map_handle(kind, fd, d.size, "sync object decode", &s);
    if (rc)
        goto out_close;
    h = s->base;
    if (h->magic != MP__SYNC_MAGIC || h->version != MP__SYNC_VERSION ||
        h->kind != (uint32_t)kind || h->size != d.size) {
        unmap_handle(s);
        rc = mp__error(MP_EPROTO, "sync object decode: segment header does not match");
        goto out_close;
    }
    *obj = s;
    return 0;

out_close:
    mp__close(fd);
    return rc;
}

/* Retaining is the same for every kind. */
static void *sync_obj_retain(void *obj)
{
    mp__sync_retain(obj);
    return obj;
}

/* One descriptor per kind; release comes from each kind's file so that its
 * last release runs the kind's own clean-up. */
#define SYNC_KIND(NAME, KIND, STR)                                                          \
    void mp__##NAME##_obj_release(void *obj);                                               \
    static int NAME##_decode(const void *buf, size_t len, int *fds, int nfds, void **obj)   \
    {                                                                                       \
        return sync_decode_kind(KIND, buf, len, fds, nfds, obj);                            \
    }                                                                                       \
    const mp__objkind mp__##NAME##_kind = {KIND, STR, sync_obj_retain,                      \
                                           mp__##NAME##_obj_release, sync_encode,           \
                                           NAME##_decode};

SYNC_KIND(lock, MP_ATTACH_LOCK, "lock")
SYNC_KIND(rlock, MP_ATTACH_RLOCK, "rlock")
SYNC_KIND(semaphore, MP_ATTACH_SEMAPHORE, "semaphore")
SYNC_KIND(event, MP_ATTACH_EVENT, "event")
SYNC_KIND(condition, MP_ATTACH_CONDITION, "condition")
SYNC_KIND(barrier, MP_ATTACH_BARRIER, "barrier")

int mp__sync_kinds_register(void)
{
    static const mp__objkind *const kinds[] = {&mp__lock_kind,  &mp__rlock_kind,
                                               &mp__semaphore_kind, &mp__event_kind,
                                               &mp__condition_kind, &mp__barrier_kind};
    return mp__objkind_register_all(kinds, sizeof kinds / sizeof kinds[0]);
}
