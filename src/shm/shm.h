/* Shared-memory segments under the two sharing strategies, the per-process
 * mapping cache, and the hook the shm-manager client plugs into. */
#ifndef MPROC_SHM_H
#define MPROC_SHM_H

#include "os/os.h"

enum { MP__STRATEGY_FD = 0, MP__STRATEGY_FS = 1 };

/* A mapped segment, refcounted within this process. The mapping cache holds
 * one mp__segment per (device, inode): opening a segment that is already
 * mapped returns the same object, retained. */
typedef struct mp__segment mp__segment;

/* Segment names under file_system: "/mproc-<pid>-<16 random hex>". The
 * prefix is what the daemon and `mproc shm` recognise. */
#define MP__SHM_PREFIX "mproc-"
#define MP__SHM_NAME_MAX 64
/* Whether name is "/" MP__SHM_PREFIX followed by letters, digits, '-' or
 * '_' and fits MP__SHM_NAME_MAX: the one rule for a file_system name. */
bool mp__shm_name_ok(const char *name);

/* file_system segments start with this header (page-sized; data follows at
 * MP__FS_HEADER_SIZE, so data stays page aligned). */
#define MP__FS_MAGIC 0x6d70726f63736567ull /* "mprocseg" */
#define MP__FS_VERSION 1u
#define MP__FS_HEADER_SIZE 4096u
typedef struct mp__fs_header {
    uint64_t magic;
    uint32_t version;
    uint32_t creator_pid;
    uint64_t size;        /* data bytes after the header */
    uint32_t refcount;    /* atomic: processes mapping it + messages in flight */
    uint32_t flags;
} mp__fs_header;

/* Current strategy of this process (MP__STRATEGY_*). */
int mp__shm_strategy(void);
/* Sets it (a valid MP__STRATEGY_*; mp_set_sharing_strategy checks names). */
void mp__shm_set_strategy(int strategy);

/* Creates, sizes, seals (FD) and maps a zeroed segment of nbytes data bytes
 * with every page allocated and mapped (MADV_POPULATE_WRITE, or
 * posix_fallocate on kernels before 5.14): a full /dev/shm is MP_ENOSPC
 * with free and needed bytes, never a SIGBUS later. Under both strategies a
 * request larger than statvfs("/dev/shm") reports free fails with
 * MP_ENOSPC before any memory is touched. */
int mp__segment_create(size_t nbytes, int strategy, mp__segment **out);

/* nbytes copied from src to data offset off of a new segment. */
typedef struct mp__segment_part {
    size_t off;
    const void *src;
    size_t nbytes;
} mp__segment_part;

/* mp__segment_create with the data written from parts (sorted by off, not
 * overlapping, within nbytes; bytes no part covers are zero) before it is
 * mapped: pwrite fills the new pages without zeroing them and without page
 * faults, about half the cost of creating a segment and copying into it.
 * Every page is allocated on success, as with mp__segment_create. */
int mp__segment_create_filled(size_t nbytes, int strategy, const mp__segment_part *parts,
                              int nparts, mp__segment **out);
mp__segment *mp__segment_retain(mp__segment *s);
/* Last release unmaps; under FS it also drops this process's header
 * reference and unlinks when that reaches zero. */
void mp__segment_release(mp__segment *s);
void *mp__segment_data(const mp__segment *s);
size_t mp__segment_size(const mp__segment *s);
int mp__segment_strategy(const mp__segment *s);
/* FD: the segment's fd (kept open while mapped); FS: -1. */
int mp__segment_fd(const mp__segment *s);
/* FS: the name; FD: NULL. */
const char *mp__segment_name(const mp__segment *s);

/* One slot of user data per segment, used by the tensor layer to find the
 * single storage that wraps a segment in this process. Not refcounted. */
void *mp__segment_user(const mp__segment *s);
void mp__segment_set_user(mp__segment *s, void *user);
/* Whether s ever had a user in this process: false for a segment just
 * mapped, true for a mapping a storage used before (the tensor layer's
 * counters tell new mappings from reused ones by it). */
bool mp__segment_had_user(const mp__segment *s);
/* How many segments that had a user this process has unmapped (for
 * mp_tensor_stats_get: storage segments unmapped). */
uint64_t mp__segment_user_unmapped(void);

/* What crosses the wire for a segment. */
typedef struct mp__segment_handle {
    int strategy;
    int fd;                        /* FD: the fd to send or that was received */
    uint64_t size;                 /* data bytes */
    char name[MP__SHM_NAME_MAX];   /* FS */
} mp__segment_handle;

/* Fills h for sending s. FD: h->fd is s's own fd (borrowed; sendmsg dups it).
 * FS: takes one header reference on behalf of the message in flight; the
 * receiver adopts it in mp__segment_open, or mp__segment_handle_drop returns
 * it if the message is never delivered. */
int mp__segment_export(mp__segment *s, mp__segment_handle *h);
/* Maps a received handle (cache hit: same segment, retained). FD: takes
 * ownership of h->fd (closed on hit or error); checks it is a memfd/shm file
 * sealed against shrinking (or unlinked from /dev/shm: mproc's no-memfd
 * fallback, adopted segments), and that fstat's size covers h->size, else
 * MP_EPROTO. FS: opens by name, checks magic/version/size, adopts the
 * in-flight reference. On success and on failure the handle holds nothing
 * afterwards (h->fd = -1, name cleared; a failed open gives the in-flight
 * reference back), so mp__segment_handle_drop on it is a no-op. */
int mp__segment_open(mp__segment_handle *h, mp__segment **out);
/* The same; with kept, a file_system segment that this process does not map
 * yet is mapped as a base for a receiving end to keep (*kept, retained):
 * the base holds no header reference, *out is an alias over it that owns
 * the handle's, so the name still goes when the last user releases it.
 * *kept is NULL when nothing was mapped anew (src/shm/pins.c). */
int mp__segment_open_keeping(mp__segment_handle *h, mp__segment **out, mp__segment **kept);
/* Maps a foreign shared-memory file from fd without copying (foreign.c): fd is
 * dup'ed (the caller keeps its own), checked (a regular file of at least end
 * bytes, sealed against shrinking or unlinked from /dev/shm: else MP_EINVAL
 * saying why) and opened as a received file_descriptor handle of the whole
 * file, so the mapping cache gives one segment per file. */
int mp__segment_adopt_fd(int fd, uint64_t end, mp__segment **out);
/* Gives back what an undelivered handle holds (FD: closes a received fd;
 * FS: drops the in-flight reference). */
void mp__segment_handle_drop(mp__segment_handle *h, bool received);

/* Hook for the shm-manager client (issue: daemon). Called synchronously in
 * the calling thread; each may be NULL. The client must make the report
 * ordered before the segment's name can leave the process. Every name is a
 * valid one (mp__shm_name_ok): made by this layer, or checked before the
 * call. */
typedef struct mp__shm_hooks {
    void (*created)(const char *name, uint64_t size);
    void (*opened)(const char *name);
    void (*closed)(const char *name);     /* this process unmapped it */
    void (*unlinked)(const char *name);
    void (*sent)(const char *name);       /* a message carrying it was sent */
    /* ... and received into a mapping of this process (which reports closing it) */
    void (*received)(const char *name);
    /* ... or its flight ended here without one: dropped unsent, or received
     * and dropped unopened */
    void (*dropped)(const char *name);
    /* Brackets reports made together in one library call (opened +
     * received, closed + unlinked), which the client may then deliver as
     * one; nothing that can block runs in between. Calls nest. */
    void (*batch)(bool begin);
} mp__shm_hooks;
void mp__shm_set_hooks(const mp__shm_hooks *hooks);

/* Number of segments this process has mapped now (for leak checks). */
int mp__segment_count(void);

#endif
