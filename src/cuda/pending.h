/* The producer's pending-free list (CPU only, no CUDA needed).
 *
 * An allocation freed by its producer while other processes still hold
 * references (its count in the reference segment is not zero) is parked
 * here and really freed once the count reaches zero: checked on every later
 * free and by mp_cuda_ipc_collect(). The free function is a parameter so the
 * logic is tested without a GPU. Not thread-safe: the caller serialises. */
#ifndef MPROC_CUDA_PENDING_H
#define MPROC_CUDA_PENDING_H

#include "cuda/refseg.h"

/* Really frees one allocation; 0 or a negative mp_error (then it stays). */
typedef int (*mp__pending_free_fn)(void *alloc);

typedef struct mp__pending_entry {
    uint32_t slot;
    void *alloc;
} mp__pending_entry;

typedef struct mp__pending {
    mp__pending_entry *v;
    size_t n, cap;
} mp__pending;

/* The producer frees `alloc`, shared through slot of seg: frees it now when
 * no live reference remains (and frees the slot), else parks it. Then
 * collects the rest of the list. *freed_now (may be NULL) tells which. */
int mp__pending_free(mp__pending *p, mp__refseg *seg, uint32_t slot, void *alloc,
                     mp__pending_free_fn free_fn, bool *freed_now);
/* Frees every parked allocation whose count is zero; *freed may be NULL.
 * Returns the first error of free_fn (those entries stay parked). */
int mp__pending_collect(mp__pending *p, mp__refseg *seg, mp__pending_free_fn free_fn,
                        size_t *freed);
size_t mp__pending_count(const mp__pending *p);
/* Drops the list's memory (not the allocations). */
void mp__pending_clear(mp__pending *p);

#endif
