/* Inside src/shm: the segment object and the per-process mapping cache. */
#ifndef MPROC_SHM_INTERNAL_H
#define MPROC_SHM_INTERNAL_H

#include "shm/pins.h"
#include "shm/shm.h"

#include <stdatomic.h>
#include <sys/stat.h>

struct mp__segment {
    atomic_long refs; /* references in this process */
    int strategy;     /* MP__STRATEGY_* */
    int fd;           /* FD: kept open while mapped; FS: -1 */
    void *map;        /* FS: the header; FD: the data */
    size_t map_len;
    void *data;
    size_t size; /* data bytes */
    dev_t dev;   /* cache key */
    ino_t ino;
    pid_t ref_pid; /* FS: the process owning one header reference */
    bool reported; /* FS: its creation or opening was reported, so its closing is */
    void *user;
    bool had_user; /* a user was ever set: it backed a storage (the stats) */
    unsigned recycle_gen; /* recycle.c: 0, or the fork generation it was made in */
    bool exported;        /* recycle.c: it left this process (atomic access) */
    /* FS in a fork child (handle.c): an alias is this process's use of a
     * segment it inherited, over the same mapping, owning this process's
     * header reference; base is that inherited segment (retained), alias
     * its live alias, if any. */
    struct mp__segment *base;
    struct mp__segment *alias;
    struct mp__segment *next;      /* hash chain */
    struct mp__segment *name_next; /* FS: chain of the name index */
    char name[MP__SHM_NAME_MAX];
};

/* The cache: lookup retains (skipping segments being destroyed); insert
 * returns the segment already cached under the same key, retained, instead
 * of inserting when one exists (the caller then drops its own). */
mp__segment *mp__cache_lookup(dev_t dev, ino_t ino);
mp__segment *mp__cache_insert(mp__segment *s);
/* Removes s (by pointer) if present. */
void mp__cache_remove(mp__segment *s);
/* The cached file_system segment named name, retained, or NULL: a name this
 * process maps already needs no shm_open (it cannot name another segment
 * while this process holds a reference to it, which keeps it linked; a base
 * an end keeps holds none, but a name is never made twice: the creator's
 * pid and 64 random bits, and a dead base goes at its end's next sweep). */
mp__segment *mp__cache_lookup_name(const char *name);
/* The hash of a segment name that the cache's name index uses. */
uint64_t mp__shm_name_hash(const char *name);
int mp__cache_count(void);
/* base's alias, retained, when it is this process's and still lives; else
 * NULL. */
mp__segment *mp__cache_alias_find(mp__segment *base);
/* Makes a base's alias unless base has a live one of this process, which
 * it returns, retained (the caller then frees a). */
mp__segment *mp__cache_alias_set(mp__segment *base, mp__segment *a);
/* Forgets a as base's alias (a is being destroyed). */
void mp__cache_alias_clear(mp__segment *base, const mp__segment *a);

/* The hooks currently set (never NULL; members may be). */
const mp__shm_hooks *mp__shm_hooks_get(void);

/* "file_descriptor" / "file_system", NULL for anything else. */
const char *mp__strategy_name(int strategy);

/* Free bytes in /dev/shm (statvfs), or -1. */
long long mp__shm_free_bytes(void);

/* segment.c, for handle.c: a zeroed segment with one reference; destroy
 * unmaps and frees one no longer cached; live_add counts a new mapping;
 * random_name makes "/mproc-<pid>-<16 hex>". */
mp__segment *mp__segment_alloc(int strategy);
void mp__segment_destroy(mp__segment *s);
/* handle.c, for destroy: gives an alias's header reference back and drops
 * its base. */
void mp__segment_alias_destroy(mp__segment *a);
void mp__segment_live_add(void);
int mp__shm_random_name(char *name, size_t cap);
/* Drops one header reference of a named segment; the last unlinks it (and
 * tells the `unlinked` hook). */
void mp__fs_unref(mp__fs_header *hd, const char *name);

/* foreign.c: fd (st its fstat) is a regular file unlinked from /dev/shm, so
 * only holders of an fd to it can shrink it: the one kind of unsealed fd a
 * receiver maps (mproc's no-memfd fallback, adopted foreign segments). */
bool mp__shm_unlinked_posix(int fd, const struct stat *st);

/* pins_borrow.c, for pins.c: the segment a pin names, retained, for a
 * process that does not hold the pin (mp__pins_open's last resort). */
int mp__pins_borrow(mp__pins *p, const mp__pin_ref *given, uint64_t size, mp__segment **out);

#endif
