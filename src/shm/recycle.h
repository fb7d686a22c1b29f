/* Reusable shared segments: a small per-process pool of segments that were
 * made to receive bytes from outside (MPI), whose last reference is gone and
 * that never left this process, so reusing one cannot change memory another
 * process still maps. Such a segment leaves the process by being exported
 * (its fd or name put into a message), by a DLPack export of a storage over
 * it (the consumer may hand the pointer on), or by a fork while it is
 * mapped (the child inherits the mapping); each of these bars it from the
 * pool for good. Only the file_descriptor strategy is pooled: a named
 * segment can be opened by name. */
#ifndef MPROC_SHM_RECYCLE_H
#define MPROC_SHM_RECYCLE_H

#include "shm/shm.h"

/* The pool's bounds: segments and bytes kept. Past them the oldest go. */
#define MP__RECYCLE_MAX 16
#define MP__RECYCLE_BYTES ((size_t)256 << 20)

/* A file_descriptor segment of nbytes whose bytes are unspecified (a
 * recycled one keeps its previous contents, except that the bytes after
 * nbytes up to the page end are zeroed): for callers that overwrite every
 * byte. Taken from the pool when one of the same page-rounded size is
 * there, else created as mp__segment_create does. Either way it may return
 * to the pool once released. */
int mp__segment_create_reusable(size_t nbytes, mp__segment **out);
/* s left this process (or may have): it never returns to the pool. */
void mp__segment_mark_exported(mp__segment *s);
/* segment.c, at s's last release (out of the mapping cache already):
 * true when the pool took s, false when the caller destroys it. */
bool mp__segment_recycle(mp__segment *s);
/* Unmaps every pooled segment (their memory goes back to the system). */
void mp__segment_recycle_drain(void);
/* Pooled segments now (tests). */
int mp__segment_pooled(void);

#endif
