/* What crosses the wire for a segment: export on the sending side, open
 * (through the mapping cache) on the receiving side, drop when undelivered. */
#include "shm/manager.h"
#include "shm/recycle.h"
#include "shm/shm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* What a user reads in mp_last_error() on the receiving side. */
#define OPENING "opening a received shared segment: "

int mp__segment_export(mp__segment *s, mp__segment_handle *h)
{
    if (!s || !h)
        return mp__error(MP_EINVAL, "mp__segment_export: NULL segment or handle");
    memset(h, 0, sizeof *h);
    mp__segment_mark_exported(s);
    h->strategy = s->strategy;
    h->size = s->size;
    h->fd = -1;
    if (s->strategy == MP__STRATEGY_FD) {
        h->fd = s->fd;
        return 0;
    }
    /* the message's own reference, adopted by the receiver */
    __atomic_add_fetch(&((mp__fs_header *)s->map)->refcount, 1, __ATOMIC_ACQ_REL);
    memcpy(h->name, s->name, sizeof h->name);
    if (mp__shm_hooks_get()->sent)
        mp__shm_hooks_get()->sent(s->name);
    return 0;
}

/* A segment mapped at fork time holds the parent's header reference, and
 * the child's copies of the parent's handles keep it mapped for good (a
 * worker never releases them): a reference received into it would never
 * be given back, and the name would outlive every user. So the child's own
 * uses go through an alias: a segment object over the same mapping that
 * owns the child's header reference and gives it back at its last release.
 * Takes over base's lookup reference; returns the alias, retained, with
 * *adopt set when it is new (it adopts the handle's reference), or NULL
 * (out of memory). */
static mp__segment *child_alias(mp__segment *base, bool *adopt)
{
    mp__segment *a = mp__cache_alias_find(base), *won;
    *adopt = false;
    if (a) {
        mp__segment_release(base);
        return a;
    }
    if (!(a = mp__segment_alloc(MP__STRATEGY_FS))) {
        mp__segment_release(base);
        mp__error(MP_ENOMEM, OPENING "out of memory");
        return NULL;
    }
    a->map = base->map;
    a->map_len = base->map_len;
    a->data = base->data;
    a->size = base->size;
    a->dev = base->dev;
    a->ino = base->ino;
    a->ref_pid = mp__pid();
    a->base = base;
    memcpy(a->name, base->name, sizeof a->name);
    won = mp__cache_alias_set(base, a);
    if (won != a) { /* another thread made one meanwhile */
        free(a);
        mp__segment_release(base);
        return won;
    }
    *adopt = true;
    return a;
}

void mp__segment_alias_destroy(mp__segment *a)
{
    mp__cache_alias_clear(a->base, a);
    if (a->ref_pid == mp__pid()) /* else a fork child's copy, never destroyed */
        mp__fs_unref(a->map, a->name);
    mp__segment_release(a->base);
    free(a);
}

static int open_fd(mp__segment_handle *h, mp__segment **out)
{
    struct stat st;
    mp__segment *s, *cached;
    int fd = h->fd, seals, rc;
    h->fd = -1; /* ours from here on */
    if (mp__sys.fstat(fd, &st) != 0) {
        rc = mp__errno_error(errno, OPENING "fstat of its fd");
        goto out_close;
    }
    s = mp__cache_lookup(st.st_dev, st.st_ino);
    if (s) { /* the hot path: one fstat, one lookup, one close */
        if (fd == s->fd)
            fd = -1; /* the segment's own fd handed back: never close it */
        if (h->size > s->map_len) {
            /* the sentence first: the release may free s */
            rc = mp__error(MP_EPROTO,
                           OPENING "handle claims %llu bytes of a "
                           "%zu-byte segment",
                           (unsigned long long)h->size, s->map_len);
            mp__segment_release(s);
            goto out_close;
        }
        mp__close(fd);
        *out = s;
        return 0;
    }
    rc = MP_EPROTO;
    if (!S_ISREG(st.st_mode) || st.st_size <= 0 || (uint64_t)st.st_size < h->size) {
        mp__error(rc, OPENING "fd is not a segment of %llu bytes (a %lld-byte file)",
                  (unsigned long long)h->size, (long long)st.st_size);
        goto out_close;
    }
    seals = mp__sys.fcntl(fd, F_GET_SEALS, 0);
    /* mproc's no-memfd fallback and adopted foreign segments (foreign.c)
     * cannot be sealed; they come unlinked from /dev/shm instead */
    if ((seals < 0 || !(seals & F_SEAL_SHRINK)) && !mp__shm_unlinked_posix(fd, &st)) {
        mp__error(rc, OPENING "fd is neither a memfd sealed against shrinking nor "
                  "an unlinked /dev/shm segment");
        goto out_close;
    }
    s = mp__segment_alloc(MP__STRATEGY_FD);
    if (!s) {
        rc = mp__error(MP_ENOMEM, OPENING "out of memory");
        goto out_close;
    }
    s->map = mp__sys.mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->map == MAP_FAILED) {
        rc = mp__errno_error(errno, OPENING "mmap(%lld bytes)", (long long)st.st_size);
        free(s);
        goto out_close;
    }
    s->map_len = (size_t)st.st_size;
    s->data = s->map;
    s->size = h->size;
    s->fd = fd;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    mp__segment_live_add();
    cached = mp__cache_insert(s);
    if (cached != s) /* another thread mapped it meanwhile: use that one */
        mp__segment_destroy(s);
    *out = cached;
    return 0;
out_close:
    mp__close(fd);
    return rc;
}

bool mp__shm_name_ok(const char *name)
{
    return name && name[0] == '/' && mp__mgr_name_ok(name);
}

/* Maps a named segment and checks its header. */
static int map_named(const mp__segment_handle *h, int fd, const struct stat *st, mp__segment **out)
{
    bool valid;
    mp__segment *s;
    mp__fs_header *hd;
    size_t len = (size_t)st->st_size;
    if (len < MP__FS_HEADER_SIZE || len - MP__FS_HEADER_SIZE < h->size)
        return mp__error(MP_EPROTO, OPENING "%s has %zu bytes, too few for %llu", h->name,
                         len, (unsigned long long)h->size);
    s = mp__segment_alloc(MP__STRATEGY_FS);
    if (!s)
        return mp__error(MP_ENOMEM, OPENING "out of memory");
    s->map = mp__sys.mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s->map == MAP_FAILED) {
        free(s);
        return mp__errno_error(errno, OPENING "mmap(%s, %zu bytes)", h->name, len);
    }
    hd = s->map;
    valid = __atomic_load_n(&hd->magic, __ATOMIC_ACQUIRE) == MP__FS_MAGIC &&
            hd->version == MP__FS_VERSION;
    if (!valid || hd->size < h->size || hd->size > len - MP__FS_HEADER_SIZE) {
        unsigned long long size = hd->size;
        mp__sys.munmap(s->map, len);
        free(s);
        return mp__error(MP_EPROTO,
                         OPENING "%s has a bad header (magic, version "
                         "or size %llu)",
                         h->name, size);
    }
    s->map_len = len;
    s->data = (char *)s->map + MP__FS_HEADER_SIZE;
    s->size = hd->size;
    s->dev = st->st_dev;
    s->ino = st->st_ino;
    s->ref_pid = mp__pid(); /* adopts the in-flight reference */
    memcpy(s->name, h->name, sizeof s->name);
    *out = s;
    return 0;
}

/* A name already mapped here (found by name, or by inode after shm_open):
 * its size was checked when it was mapped; the handle must fit in it. */
static int check_fs_cached(const mp__segment_handle *h, mp__segment *cached)
{
    if (h->size <= cached->size)
        return 0;
    int rc = mp__error(MP_EPROTO, OPENING "handle claims %llu bytes of %s, a "
                       "%zu-byte segment", (unsigned long long)h->size, h->name, cached->size);
    mp__segment_release(cached);
    return rc;
}

/* How a received handle's reference joins s. */
enum { FS_FOLD, FS_ADOPT, FS_FRESH, FS_KEPT_ADOPT, FS_KEPT_FOLD };

/* The handle's reference now belongs to s, a segment this process either
 * just mapped (FS_FRESH: report it opened), or a new alias (FS_ADOPT), or
 * already held a reference for (FS_FOLD: the handle's is dropped), or an
 * alias over a base this process just mapped for an end to keep (FS_KEPT_*:
 * report the base opened; the alias is new, or another thread's): tell the
 * manager in one batch, consume the handle. */
static void fs_received(mp__segment_handle *h, mp__segment *s, int how, mp__segment **out)
{
    const mp__shm_hooks *hk = mp__shm_hooks_get();
    if (hk->batch)
        hk->batch(true);
    if (how == FS_FOLD || how == FS_KEPT_FOLD)
        mp__fs_unref(s->map, s->name);
    if (how == FS_FRESH || how == FS_KEPT_ADOPT || how == FS_KEPT_FOLD) {
        if (hk->opened)
            hk->opened(s->name);
        (s->base ? s->base : s)->reported = true;
    }
    if (hk->received)
        hk->received(h->name);
    if (hk->batch)
        hk->batch(false);
    h->name[0] = '\0';
    *out = s;
}

/* The handle names cached, a segment this process maps already (retained
 * by its lookup). */
static int fs_cached(mp__segment_handle *h, mp__segment *cached, mp__segment **out)
{
    bool adopt = false;
    int rc = check_fs_cached(h, cached);
    if (rc < 0)
        return rc;
    if (cached->ref_pid != mp__pid() && !(cached = child_alias(cached, &adopt)))
        return MP_ENOMEM;
    fs_received(h, cached, adopt ? FS_ADOPT : FS_FOLD, out);
    return 0;
}

/* s, just mapped and cached, becomes a base that an end keeps (*kept,
 * retained): it holds no header reference, so the name goes when its users
 * are done, as if this process had unmapped it; the user's use is an alias
 * that owns the handle's reference (child_alias, as in a fork child). */
static int fs_keep(mp__segment_handle *h, mp__segment *s, mp__segment **kept, mp__segment **out)
{
    bool adopt;
    mp__segment *a;
    *kept = mp__segment_retain(s);
    if (!(a = child_alias(s, &adopt))) {
        mp__segment_release(*kept);
        *kept = NULL;
        return MP_ENOMEM; /* the caller gives the handle's reference back */
    }
    fs_received(h, a, adopt ? FS_KEPT_ADOPT : FS_KEPT_FOLD, out);
    return 0;
}

static int open_fs(mp__segment_handle *h, mp__segment **out, mp__segment **kept)
{
    struct stat st;
    mp__segment *s = NULL, *cached;
    int fd, rc;
    if (!mp__shm_name_ok(h->name))
        return mp__error(MP_EPROTO, OPENING "\"%.64s\" is not an mproc segment name",
                         h->name);
    if ((cached = mp__cache_lookup_name(h->name))) /* the hot path: no system call */
        return fs_cached(h, cached, out);
    fd = mp__sys.shm_open(h->name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return mp__errno_error(errno, OPENING "shm_open(%s)", h->name);
    if (mp__sys.fstat(fd, &st) != 0) {
        rc = mp__errno_error(errno, OPENING "fstat(%s)", h->name);
        goto out_close;
    }
    cached = mp__cache_lookup(st.st_dev, st.st_ino);
    if (cached) {
        mp__close(fd);
        return fs_cached(h, cached, out);
    }
    if ((rc = map_named(h, fd, &st, &s)) < 0)
        goto out_close;
    mp__close(fd);
    mp__segment_live_add();
    if (kept)
        s->ref_pid = 0; /* a base: the handle's reference goes to its alias */
    cached = mp__cache_insert(s);
    if (cached != s) { /* lost a race: the handle's reference goes to the winner */
        s->ref_pid = 0;
        mp__segment_destroy(s);
        return fs_cached(h, cached, out);
    }
    if (kept)
        return fs_keep(h, s, kept, out);
    fs_received(h, s, FS_FRESH, out);
    return 0;
out_close:
    mp__close(fd);
    return rc;
}

int mp__segment_open(mp__segment_handle *h, mp__segment **out)
{
    return mp__segment_open_keeping(h, out, NULL);
}

int mp__segment_open_keeping(mp__segment_handle *h, mp__segment **out, mp__segment **kept)
{
    int rc;
    if (kept)
        *kept = NULL;
    if (!h || !out)
        return mp__error(MP_EINVAL, OPENING "NULL handle or out");
    *out = NULL;
    if (h->size > (uint64_t)INT64_MAX) {
        rc = mp__error(MP_EPROTO, OPENING "size %llu out of range",
                       (unsigned long long)h->size);
        mp__segment_handle_drop(h, true);
        return rc;
    }
    if (h->strategy == MP__STRATEGY_FD) {
        if (h->fd < 0)
            return mp__error(MP_EPROTO, OPENING "file_descriptor handle without fd");
        return open_fd(h, out);
    }
    if (h->strategy == MP__STRATEGY_FS) {
        if ((rc = open_fs(h, out, kept)) < 0)
            mp__segment_handle_drop(h, true);
        return rc;
    }
    rc = mp__error(MP_EPROTO, OPENING "unknown strategy %d", h->strategy);
    mp__segment_handle_drop(h, true);
    return rc;
}

/* Gives back the in-flight header reference of a named segment. */
static void fs_drop(const char *name)
{
    mp__fs_header *hd;
    int fd = mp__sys.shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return; /* already gone: nothing held */
    hd = mp__sys.mmap(NULL, MP__FS_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    mp__close(fd);
    if (hd == MAP_FAILED)
        return;
    if (__atomic_load_n(&hd->magic, __ATOMIC_ACQUIRE) == MP__FS_MAGIC &&
        hd->version == MP__FS_VERSION)
        mp__fs_unref(hd, name);
    mp__sys.munmap(hd, MP__FS_HEADER_SIZE);
}

void mp__segment_handle_drop(mp__segment_handle *h, bool received)
{
    if (!h)
        return;
    if (h->strategy == MP__STRATEGY_FS) {
        if (mp__shm_name_ok(h->name)) {
            const mp__shm_hooks *hk = mp__shm_hooks_get();
            /* Either way its flight is over: the manager counted the send. */
            if (hk->dropped)
                hk->dropped(h->name);
            fs_drop(h->name);
        }
        h->name[0] = '\0';
    } else if (received && h->fd >= 0) {
        mp__close(h->fd); /* FD (or unknown): the received fd is ours */
    }
    h->fd = -1;
}
