/* What the two halves of the ring share (ring.c: producers and the
 * protocol; ring_recv.c: consumers). Private to them. */
#ifndef MPROC_IPC_RING_IMPL_H
#define MPROC_IPC_RING_IMPL_H

#include <string.h>

#include "ipc/ring.h"

enum { RING_PAYLOAD = 1, RING_FRAME = 2, RING_MARK = 3, RING_COMPACT = 4 };

#define MASK (MP__RING_SLOTS - 1u)
#define SLICE_MS 50           /* longest sleep between two looks at the socket */
/* How long an empty ring is watched before sleeping. A futex wake-up across
 * CPUs costs 20-25 us on a VM and is paid by the sender too; a Python
 * peer's turn-around with an fd (receive, rebuild, send: ~12 us) must fit
 * with room to spare, or a ping-pong falls into the sleeping path for good. */
#define SPIN_S 50e-6

/* A slot's words are read and written with relaxed atomics. A consumer
 * copies a slot before it claims it (moves head past it), and a producer
 * may already be refilling that slot when another consumer claimed it
 * first: the loser's copy is thrown away, but taking it must not be a data
 * race. Relaxed word moves cost what plain ones do. */
static inline void slot_header(mp__ring_slot *s, uint32_t type, uint32_t len)
{
    __atomic_store_n(&s->type, (uint16_t)type, __ATOMIC_RELAXED);
    __atomic_store_n(&s->len, (uint16_t)len, __ATOMIC_RELAXED);
}

static inline void slot_write(mp__ring_slot *s, uint32_t type, const void *data, uint32_t len)
{
    const unsigned char *from = data;
    uint64_t *to = (uint64_t *)(void *)s->data, w;
    uint32_t i = 0;
    slot_header(s, type, len);
    for (; i + 8 <= len; i += 8) {
        memcpy(&w, from + i, 8);
        __atomic_store_n(&to[i / 8], w, __ATOMIC_RELAXED);
    }
    if (i < len) { /* the last part word: never read past the caller's bytes */
        w = 0;
        memcpy(&w, from + i, len - i);
        __atomic_store_n(&to[i / 8], w, __ATOMIC_RELAXED);
    }
}

static inline uint32_t slot_type(const mp__ring_slot *s)
{
    return __atomic_load_n(&s->type, __ATOMIC_RELAXED);
}

static inline uint32_t slot_len(const mp__ring_slot *s)
{
    return __atomic_load_n(&s->len, __ATOMIC_RELAXED);
}

/* The message at position p is in s: its last store, which a consumer
 * looks for at head (the slot's own line, not tail's: a consumer that
 * waits for the producer or runs behind it does not pull tail's line
 * away from it message by message). */
static inline void slot_publish(mp__ring_slot *s, uint32_t p)
{
    __atomic_store_n(&s->seq, p + 1, __ATOMIC_RELEASE);
}

/* How far s is past position p: 0 when it holds the message at p, below 0
 * when that message is not yet published (the ring is empty at p), above 0
 * when s already holds a later lap's (p is a stale head: look again). A slot
 * holds p, p + SLOTS, ... in turn; a fresh ring's zeros are below its first
 * lap. */
static inline int32_t slot_lag(const mp__ring_slot *s, uint32_t p)
{
    return (int32_t)(__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) - (p + 1));
}

static inline bool slot_ready(const mp__ring_slot *s, uint32_t p)
{
    return slot_lag(s, p) == 0;
}

static inline bool slot_empty(const mp__ring_slot *s, uint32_t p)
{
    return slot_lag(s, p) < 0;
}

/* Copies len bytes (at most MP__RING_DATA, rounded up to a word) into buf,
 * which holds MP__RING_DATA bytes. */
static inline void slot_read(const mp__ring_slot *s, uint32_t len, unsigned char *buf)
{
    const uint64_t *from = (const uint64_t *)(const void *)s->data;
    for (uint32_t i = 0; i < len && i < MP__RING_DATA; i += 8) {
        uint64_t w = __atomic_load_n(&from[i / 8], __ATOMIC_RELAXED);
        memcpy(buf + i, &w, 8);
    }
}

/* plock was found EOWNERDEAD (its holder died under it): publishing is the
 * commit, so at most tail is left to move (the holder died between
 * publishing slot tail and moving it); then the lock is consistent. */
static inline void plock_recover(mp__ring *r)
{
    uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
    if (slot_ready(&r->slot[t & MASK], t))
        atomic_store(&r->tail, t + 1);
    pthread_mutex_consistent(&r->plock);
}

/* The flag a waiter sets before it sleeps (`space_wait`, `sleeping`): the
 * position it waits past, so that only a process that moved past it takes
 * it down. Each flag has one waiter at a time (the holder of plock, of the
 * reader lock). A bare 0/1 flag lost wake-ups: a consumer preempted
 * between moving head and looking at the flag (or a producer between
 * publishing and looking) found the flag of a later wait, took it down
 * and woke nobody, since the waiter was not asleep yet; the waiter then
 * slept on an unchanged word with its flag gone, and every process that
 * did move past it saw no flag. It slept a whole slice (50 ms). */
#define WAITING ((uint64_t)1 << 32)
static inline uint64_t wait_flag(uint32_t pos)
{
    return WAITING | pos;
}

/* Whether the process that just moved past pos (took slot pos, or
 * published it) must wake the waiter of f: then the flag is down. A flag
 * set again meanwhile is a new wait, whose waiter looks at the word after
 * setting it, and so sees this move. */
static inline bool wake_due(_Atomic uint64_t *f, uint32_t pos)
{
    uint64_t w = atomic_load(f);
    return w && (int32_t)(pos - (uint32_t)w) >= 0 && atomic_compare_exchange_strong(f, &w, 0);
}

/* A mark's tag, the first 4 bytes of its data (slot_write's layout). */
static inline uint32_t slot_tag(const mp__ring_slot *s)
{
    uint64_t w = __atomic_load_n((const uint64_t *)(const void *)s->data, __ATOMIC_RELAXED);
    uint32_t tag;
    memcpy(&tag, &w, sizeof tag);
    return tag;
}

#define STEP(s)                                                                            \
    do {                                                                                   \
        if (mp__ring_fault)                                                                \
            mp__ring_fault(MP__RING_STEP_##s);                                             \
    } while (0)

#endif
