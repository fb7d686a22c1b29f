/* The producer's pending-free list (see pending.h). */
#include "cuda/pending.h"

#include <stdlib.h>

size_t mp__pending_count(const mp__pending *p) { return p ? p->n : 0; }

void mp__pending_clear(mp__pending *p)
{
    free(p->v);
    p->v = NULL;
    p->n = p->cap = 0;
}

static int push(mp__pending *p, uint32_t slot, void *alloc)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        mp__pending_entry *v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return mp__error(MP_ENOMEM, "freeing a shared CUDA tensor: out of memory for the "
                                        "pending-free list");
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (mp__pending_entry){.slot = slot, .alloc = alloc};
    return 0;
}

/* Frees what the last scan found unreferenced; keeps the order of the rest
 * (oldest first), which keeps the list stable for callers that inspect it. */
static int sweep(mp__pending *p, mp__refseg *seg, mp__pending_free_fn free_fn, size_t *freed)
{
    size_t kept = 0, done = 0;
    int first = 0;
    for (size_t i = 0; i < p->n; i++) {
        mp__pending_entry e = p->v[i];
        if (mp__refseg_tally(seg, e.slot) == 0) {
            int rc = free_fn(e.alloc);
            if (rc == 0) {
                mp__refseg_slot_free(seg, e.slot);
                done++;
                continue;
            }
            if (first == 0)
                first = rc;
        }
        p->v[kept++] = e;
    }
    p->n = kept;
    if (freed)
        *freed = done;
    return first;
}

int mp__pending_collect(mp__pending *p, mp__refseg *seg, mp__pending_free_fn free_fn,
                        size_t *freed)
{
    int rc;
    if (freed)
        *freed = 0;
    if (!p || !free_fn)
        return mp__error(MP_EINVAL, "mp__pending_collect: NULL list or free function");
    if (p->n == 0)
        return 0;
    if (!seg)
        return mp__error(MP_ESTATE, "mp__pending_collect: allocations pending without a "
                                    "reference segment");
    if ((rc = mp__refseg_scan(seg, NULL)) < 0)
        return rc;
    return sweep(p, seg, free_fn, freed);
}

int mp__pending_free(mp__pending *p, mp__refseg *seg, uint32_t slot, void *alloc,
                     mp__pending_free_fn free_fn, bool *freed_now)
{
    int rc;
    if (freed_now)
        *freed_now = false;
    if (!p || !seg || !free_fn || slot >= mp__refseg_nslots(seg))
        return mp__error(MP_EINVAL, "mp__pending_free: bad list, segment, slot or function");
    /* Park first, then one scan decides for it and for every older entry. */
    if ((rc = push(p, slot, alloc)) < 0)
        return rc;
    if ((rc = mp__refseg_scan(seg, NULL)) < 0)
        return rc;
    rc = sweep(p, seg, free_fn, NULL);
    if (freed_now) {
        bool still = false;
        for (size_t i = 0; i < p->n && !still; i++)
            still = p->v[i].alloc == alloc;
        *freed_now = !still;
    }
    return rc;
}
