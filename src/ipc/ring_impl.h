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
    __atomic_store_n(&s->type, type, __ATOMIC_RELAXED);
    __atomic_store_n(&s->len, len, __ATOMIC_RELAXED);
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

#define STEP(s)                                                                            \
    do {                                                                                   \
        if (mp__ring_fault)                                                                \
            mp__ring_fault(MP__RING_STEP_##s);                                             \
    } while (0)

#endif
