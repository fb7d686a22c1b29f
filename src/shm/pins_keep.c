/* Kept mappings of file_system storages.
 *
 * A file_system storage travels by name, so there is no fd to save; what a
 * receiver that lets go of it between arrivals pays is the mapping: an
 * shm_open, an mmap and a page fault per page touched, every time (a buffer
 * sent back and forth, each side releasing it after use). Its end keeps a
 * mapping of one that arrives a second time: a base that holds no header
 * reference (so the name still goes when its users are done), over which
 * the shm layer gives each use an alias owning the message's reference
 * (mp__segment_open_keeping). Kept bases live in pin slots, found by a hash
 * of the name (known before the storage is opened); senders never name
 * them. A base is let go idle, dead (its name gone: no message can name it
 * again) at a sweep, or with the end's last handle. */
#include "shm/pins_local.h"

#include <string.h>

#define FS_SEEN UINT64_MAX /* the ino of a name in the seen list */

/* The slot of l that keeps the base named name, or -1. */
static int kept_slot(const mp__pins_local *l, uint64_t key, const char *name)
{
    unsigned h = mp__pins_home(key, FS_SEEN);
    for (unsigned k = 0; k < MP__PINS_PROBE; k++) {
        unsigned i = (h + k) & (MP__PIN_SLOTS - 1);
        const mp__segment *s = l->seg[i];
        if (s && s->strategy == MP__STRATEGY_FS && strcmp(s->name, name) == 0)
            return (int)i;
    }
    return -1;
}

/* A file_system storage named name arrives at p's end: true when the end
 * should keep it (it arrived before and is not kept yet). */
static bool arrived(mp__pins *p, const char *name)
{
    uint64_t key = mp__shm_name_hash(name);
    bool keep = false;
    mp__pins_local *l;
    int i;
    if (atomic_load(&p->owner) == MP__PINS_OFF || !mp__pins_wanted())
        return false;
    mp__pins_lock();
    if ((l = mp__pins_find_own(p)) && mp__pins_own(p, true)) {
        mp__pins_tick(l);
        if ((i = kept_slot(l, key, name)) >= 0)
            l->used[i] = l->clock;
        else
            keep = mp__pins_seen_before(l, key, FS_SEEN);
    }
    mp__pins_unlock();
    return keep;
}

static void keep(mp__pins *p, mp__segment *base)
{
    uint64_t key = mp__shm_name_hash(base->name);
    mp__pins_local *l;
    mp__pins_lock();
    if ((l = mp__pins_find_own(p)) && mp__pins_own(p, false) && kept_slot(l, key, base->name) < 0)
        mp__pins_pin(l, base, mp__pins_home(key, FS_SEEN));
    mp__pins_unlock();
}

int mp__pins_open_fs(mp__pins *p, mp__segment_handle *h, mp__segment **out)
{
    mp__segment *base = NULL;
    int rc = mp__segment_open_keeping(h, out, arrived(p, h->name) ? &base : NULL);
    if (base) {
        keep(p, base);
        mp__segment_release(base);
    }
    return rc;
}
