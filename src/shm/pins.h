/* Handoff without an fd: the storages a receiving end keeps mapped, which
 * senders may name instead of sending an fd (src/shm/pins.c tells the
 * protocol and its lifetime rules). */
#ifndef MPROC_SHM_PINS_H
#define MPROC_SHM_PINS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "shm/shm.h"

#define MP__PIN_SLOTS 128u /* a power of two */

/* state: gen << 32 | MP__PIN_LIVE | messages sent naming the pin; only
 * senders and the owner write it. Those received (or given back) count in
 * the table's done[], which only receivers write: a handoff moves no cache
 * line from one side to the other but the ring's. */
#define MP__PIN_LIVE (UINT64_C(1) << 31)
#define MP__PIN_SENT (MP__PIN_LIVE - 1)

typedef struct mp__pin {
    _Atomic uint64_t state;
    _Atomic uint64_t dev;
    _Atomic uint64_t ino;
    _Atomic int32_t fd; /* the owner's fd of the segment */
    uint32_t reserved[9];
} mp__pin;

/* Lives beside an endpoint's reader lock (mp__rx), in its control segment. */
typedef struct mp__pins {
    /* 0: nobody pins yet; > 0: the pid of the one process that pins;
     * MP__PINS_OFF: a second process received here, so pins are off for
     * good (a sender cannot tell which process will take its message). */
    _Alignas(64) _Atomic int32_t owner;
    _Alignas(64) _Atomic uint32_t done[MP__PIN_SLOTS];
    _Alignas(64) mp__pin slot[MP__PIN_SLOTS];
} mp__pins;
#define MP__PINS_OFF (-1)

/* What a message carries instead of an fd. */
typedef struct mp__pin_ref {
    uint32_t slot;
    uint32_t gen;
    int32_t sender_pid; /* a last resort: the sender's own fd of the segment */
    int32_t sender_fd;
    uint64_t dev;       /* both 0: not carried (a compact record); the */
    uint64_t ino;       /* receiver reads them from its table if it must */
} mp__pin_ref;

void mp__pins_init(mp__pins *p);

/* Sender: when the receiving side pins s (a file_descriptor segment), takes
 * one in-flight count on that pin and fills ref: true. The message naming
 * ref must then be delivered (the receiver gives the count back) or
 * mp__pins_unreserve'd. */
bool mp__pins_reserve(mp__pins *p, const mp__segment *s, mp__pin_ref *ref);
void mp__pins_unreserve(mp__pins *p, const mp__pin_ref *ref);

/* Receiver: whether ref's slot is in range (the decoder's check). */
bool mp__pins_ref_ok(const mp__pin_ref *ref);
/* Receiver: reusing a pin's keepsake (see mp__pins_keep). take runs under
 * this layer's lock, so it must take no lock: it retains and returns the
 * keepsake when it fits the message, else returns NULL. A caller that
 * passes one holds the end's reader lock (the ring's receive): the owner
 * then takes its pin without this layer's lock. */
typedef struct mp__pins_reuse {
    void *(*take)(void *keepsake, void *ctx);
    void *ctx;
    void *got; /* out: what take returned, or NULL */
} mp__pins_reuse;

/* Receiver: the segment ref names, retained, of at least size bytes, and
 * ref's in-flight count given back. MP_EBROKEN when no live process holds
 * it any more (only when more than one process receives on the end and
 * the one that pinned it died), MP_EPROTO for a ref that names no pin.
 * With reuse (or NULL), the pin's keepsake may be taken instead: then
 * reuse->got is set and *out is NULL. */
int mp__pins_open(mp__pins *p, const mp__pin_ref *ref, uint64_t size, mp__segment **out,
                  mp__pins_reuse *reuse);
/* Receiver: obj, an object of a layer above built over ref's segment,
 * becomes the keepsake of ref's pin in this process (in place of the one
 * before), and release(obj) runs when the pin is let go or replaced (not
 * under this layer's lock); when this process no longer holds that pin,
 * release(obj) runs now. The compact decoder keeps the tensor it built,
 * to hand it out again while nobody else holds it. */
void mp__pins_keep(mp__pins *p, const mp__pin_ref *ref, void *obj, void (*release)(void *));
/* Receiver: gives ref's in-flight count back without opening it (a message
 * that failed to decode). */
void mp__pins_drop(mp__pins *p, const mp__pin_ref *ref);
/* Receiver: s arrived here by fd. A segment that arrives a second time is
 * pinned (up to MP__PIN_SLOTS), so later sends of it need no fd. */
void mp__pins_received(mp__pins *p, mp__segment *s);
/* Receiver: mp__segment_open of a file_system handle h that arrived on the
 * end behind p. A storage that arrived there before stays mapped for the
 * end in this process (until idle, dead or the end's last handle), so a
 * receiver that lets go of it between arrivals does not map it again
 * (src/shm/pins_keep.c). */
int mp__pins_open_fs(mp__pins *p, mp__segment_handle *h, mp__segment **out);

/* A handle that receives on the end behind p is made (attach) or released
 * (detach) in this process. The last detach lets go of this process's
 * pins. Attach fails only for memory (MP_ENOMEM). */
int mp__pins_attach(mp__pins *p);
void mp__pins_detach(mp__pins *p);

/* Pins this process holds now, over all ends (tests). */
int mp__pins_held(void);
/* Storages this process received by a pin (mp_tensor_stats), and of them
 * those that came as a keepsake handed out again (which no storage of the
 * layer above counted as received). */
void mp__pins_counts(uint64_t *received, uint64_t *reused);

#endif
