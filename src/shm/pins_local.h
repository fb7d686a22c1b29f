/* What pins.c (pins of file_descriptor storages, and the tables) shares
 * with pins_keep.c (file_system storages kept mapped): this process's side
 * of each table, and the calls on it, all under pins.c's lock. Private to
 * them. */
#ifndef MPROC_SHM_PINS_LOCAL_H
#define MPROC_SHM_PINS_LOCAL_H

#include "shm/pins.h"
#include "shm/shm_internal.h"

#define MP__PINS_PROBE 8u /* slots looked at per key */
#define MP__PINS_SEEN 64u /* segments remembered as received once */

/* This process's side of one table: what it pins there, and what it saw. */
typedef struct mp__pins_local {
    mp__pins *table;
    pid_t pid; /* a fork child's inherited copy holds references, pins nothing */
    int users; /* handles receiving on the end */
    uint64_t clock; /* storages received on the end */
    _Atomic uint64_t received; /* of them, by this process's pins */
    _Atomic uint64_t reused;   /* of those, keepsakes handed out again */
    mp__segment *seg[MP__PIN_SLOTS];
    void *kept[MP__PIN_SLOTS]; /* keepsakes (mp__pins_keep) and their release */
    void (*kept_release[MP__PIN_SLOTS])(void *);
    uint32_t gen[MP__PIN_SLOTS];
    uint64_t used[MP__PIN_SLOTS];
    uint64_t seen_dev[MP__PINS_SEEN], seen_ino[MP__PINS_SEEN];
    unsigned seen_next;
    struct mp__pins_local *next;
} mp__pins_local;

/* pins.c's lock, around every call below. */
void mp__pins_lock(void);
void mp__pins_unlock(void);
/* The first slot of the probe run of a key. */
unsigned mp__pins_home(uint64_t dev, uint64_t ino);
/* This process's entry for p (a fork child's inherited one is disowned
 * first), or NULL when no handle of this process receives there. */
mp__pins_local *mp__pins_find_own(mp__pins *p);
/* Whether this process owns p's table, claiming it when nobody does; a
 * second receiving process turns it off. */
bool mp__pins_own(mp__pins *p, bool claim);
/* One more storage received on l's end; lets go of idle pins now and then. */
void mp__pins_tick(mp__pins_local *l);
/* Whether (dev, ino) arrived at l's end lately; remembers it when not. */
bool mp__pins_seen_before(mp__pins_local *l, uint64_t dev, uint64_t ino);
/* Pins s (retained) in a free slot of the probe run from h, else in the
 * least recently named one no message in flight names. */
void mp__pins_pin(mp__pins_local *l, mp__segment *s, unsigned h);
/* false when MPROC_PINS=0 turns pins off in this process. */
bool mp__pins_wanted(void);

#endif
