/* What the two halves of the ring share (ring.c: producers and the
 * protocol; ring_recv.c: consumers). Private to them. */
#ifndef MPROC_IPC_RING_IMPL_H
#define MPROC_IPC_RING_IMPL_H

#include "ipc/ring.h"

enum { RING_PAYLOAD = 1, RING_FRAME = 2, RING_MARK = 3, RING_COMPACT = 4 };

#define MASK (MP__RING_SLOTS - 1u)
#define SLICE_MS 50           /* longest sleep between two looks at the socket */
/* How long an empty ring is watched before sleeping. A futex wake-up across
 * CPUs costs 20-25 us on a VM and is paid by the sender too; a Python
 * peer's turn-around with an fd (receive, rebuild, send: ~12 us) must fit
 * with room to spare, or a ping-pong falls into the sleeping path for good. */
#define SPIN_S 50e-6

#define STEP(s)                                                                            \
    do {                                                                                   \
        if (mp__ring_fault)                                                                \
            mp__ring_fault(MP__RING_STEP_##s);                                             \
    } while (0)

#endif
