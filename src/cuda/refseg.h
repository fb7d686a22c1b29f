/* The shared reference-count segment of CUDA IPC (CPU only, no CUDA needed).
 *
 * Each producer process owns one segment: a sealed memfd that travels with
 * every CUDA tensor it shares. Each shared allocation gets a slot (index +
 * generation, owned by the producer); each reference on it, held by a
 * consumer or by a message in flight, is one 64-bit word in the segment:
 *
 *     word = pid << 32 | slot << 16 | generation        (0 = free entry)
 *
 * so taking, handing over (adopting) and dropping a reference are single
 * compare-and-swaps that a process killed at any instant cannot leave half
 * done. The count of an allocation is the number of words naming its slot
 * and generation whose pid is alive; words of dead processes are reclaimed by
 * whoever scans. Reuse: a freed slot's generation moves on, a dropped word
 * is free for the next reference. */
#ifndef MPROC_CUDA_REFSEG_H
#define MPROC_CUDA_REFSEG_H

#include "os/os.h"

typedef struct mp__refseg mp__refseg;

#define MP__REFSEG_MAGIC 0x6d70637564617266ull /* "mpcudarf" */
#define MP__REFSEG_VERSION 1u
#define MP__REFSEG_MAX_SLOTS 65536u
#define MP__REFSEG_MAX_REFS (1u << 22)

static inline uint64_t mp__refword(uint32_t pid, uint32_t slot, uint32_t gen)
{
    return (uint64_t)pid << 32 | (uint64_t)(slot & 0xffffu) << 16 | (gen & 0xffffu);
}
static inline uint32_t mp__refword_pid(uint64_t w) { return (uint32_t)(w >> 32); }
static inline uint32_t mp__refword_slot(uint64_t w) { return (uint32_t)(w >> 16) & 0xffffu; }
static inline uint32_t mp__refword_gen(uint64_t w) { return (uint32_t)w & 0xffffu; }

/* Creates this process's segment with nslots allocation slots and nrefs
 * reference words. The caller owns one reference. */
int mp__refseg_create(uint32_t nslots, uint32_t nrefs, mp__refseg **out);
/* Maps a received segment fd. Takes ownership of fd (closed on a cache hit
 * and on error). One mp__refseg per segment per process (keyed by inode):
 * a hit returns the same object, retained. MP_EPROTO when fd is not a sealed
 * segment of the right layout. */
int mp__refseg_open(int fd, mp__refseg **out);
mp__refseg *mp__refseg_retain(mp__refseg *seg);
void mp__refseg_release(mp__refseg *seg);

int mp__refseg_fd(const mp__refseg *seg);              /* borrowed */
bool mp__refseg_is_owner(const mp__refseg *seg);       /* created by this process */
uint32_t mp__refseg_producer_pid(const mp__refseg *seg);
uint32_t mp__refseg_nslots(const mp__refseg *seg);
/* False once the producer exited (cleanly or not, pid reuse included). */
bool mp__refseg_producer_alive(const mp__refseg *seg);
/* Producer at exit: marks the segment so consumers fail fast. */
void mp__refseg_mark_exited(mp__refseg *seg);
/* MP_ECLOSED with a sentence naming caller and the producer when it died. */
int mp__refseg_check_producer(const mp__refseg *seg, const char *caller);

/* Owner only (MP_ESTATE otherwise). alloc: a free slot and its generation;
 * MP_ENOSPC when all are in use. free: the slot's generation moves on, so
 * any stale word naming the old one no longer counts. */
int mp__refseg_slot_alloc(mp__refseg *seg, uint32_t *slot, uint32_t *gen);
void mp__refseg_slot_free(mp__refseg *seg, uint32_t slot);
uint32_t mp__refseg_slots_in_use(const mp__refseg *seg);

/* Takes a new reference on (slot, gen) owned by pid: *ref is its index and
 * *word its value. MP_ENOSPC when every word is taken. The caller must hold
 * a reference (or own the slot) so the slot cannot be freed meanwhile. */
int mp__refseg_ref_add(mp__refseg *seg, uint32_t slot, uint32_t gen, uint32_t pid,
                       uint32_t *ref, uint64_t *word);
/* Hands reference ref, whose value must still be `expected`, over to pid
 * (a receiver adopting the reference its message carried). MP_ECLOSED when
 * it was reclaimed meanwhile (its holder died before delivery); MP_EPROTO
 * for an index out of range. */
int mp__refseg_ref_adopt(mp__refseg *seg, uint32_t ref, uint64_t expected, uint32_t pid,
                         uint64_t *word);
/* Drops reference ref of value word. MP_ESTATE when it no longer had that
 * value (reclaimed as if its holder were dead). */
int mp__refseg_ref_drop(mp__refseg *seg, uint32_t ref, uint64_t word);

/* Live references on (slot, gen): words naming it whose pid is alive. */
int mp__refseg_count(mp__refseg *seg, uint32_t slot, uint32_t gen);

/* Owner only: reclaims the words of dead processes (*reclaimed, may be NULL)
 * and tallies live references per slot of its current generation, read
 * back with mp__refseg_tally until the next scan. */
int mp__refseg_scan(mp__refseg *seg, size_t *reclaimed);
uint32_t mp__refseg_tally(const mp__refseg *seg, uint32_t slot);
/* After a scan: slots in use that live references still name (exit warning). */
uint32_t mp__refseg_referenced_slots(const mp__refseg *seg);

/* Number of segments this process has mapped (leak checks in tests). */
int mp__refseg_open_count(void);

#endif
