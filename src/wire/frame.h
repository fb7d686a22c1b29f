/* The frame layout (docs/wire-format.md is the prose version). Host byte
 * order: both ends of an AF_UNIX socket are on one machine. Every section
 * starts on an 8-byte boundary. */
#ifndef MPROC_WIRE_FRAME_H
#define MPROC_WIRE_FRAME_H

#include "shm/pins.h"
#include "shm/shm.h"
#include "wire/msg_impl.h"

#define MP__FRAME_MAGIC 0x4657504du   /* "MPWF" read as bytes */
#define MP__FRAME_VERSION 1u

enum {
    MP__FRAME_SPILLED = 1u << 0,  /* the body lives in the last fd, a sealed memfd */
    MP__FRAME_CLOSED = 1u << 1,   /* queue end-of-stream marker: no body, no fds */
    MP__FRAME_NUDGE = 1u << 2,    /* wakes a reader (src/wire/rx.c); readers drop it */
    MP__FRAME_KNOWN_FLAGS = MP__FRAME_SPILLED | MP__FRAME_CLOSED | MP__FRAME_NUDGE
};

/* Bodies up to this many bytes travel inline in the record; larger ones are
 * spilled, so a record never exceeds the socket buffer. */
#define MP__WIRE_INLINE_MAX (60u * 1024u)
/* A sane upper bound on what a peer may ask us to map for one body. */
#define MP__WIRE_BODY_MAX ((uint64_t)1 << 40)

typedef struct mp__frame_header {
    uint32_t magic;
    uint16_t version;
    uint16_t flags;
    uint32_t nfds;        /* fds that must arrive with the record */
    uint32_t nstorages;
    uint32_t nattach;
    uint32_t tag;         /* order tag of a pipe's or queue's ring (src/ipc/ring.c);
                           * 0 elsewhere; the decoder ignores it */
    uint64_t body_len;    /* bytes after the header (inline) or in the spill fd */
    uint64_t payload_len;
} mp__frame_header;

/* One storage: strategy, then the fd index (file_descriptor) or the name
 * length (file_system; the name follows, padded), then the data bytes.
 * A storage of no bytes (the storage of a tensor with no elements) travels
 * as MP__FRAME_STORAGE_EMPTY with ref and size 0: no segment, no fd, no
 * name; the receiver builds an empty storage. Every other storage has
 * 1..2^40 bytes. */
#define MP__FRAME_STORAGE_EMPTY 2u
/* A storage the receiving end pinned (shm/pins.h): ref and size as for a
 * file_descriptor storage but no fd; an mp__pin_ref follows. Only a
 * decoder given the end's receive side accepts one. */
#define MP__FRAME_STORAGE_PINNED 3u
typedef struct mp__frame_storage {
    uint32_t strategy;
    uint32_t ref;         /* fd index, or name length */
    uint64_t size;
} mp__frame_storage;

#define MP__FRAME_NO_NAME 0xffffu
typedef struct mp__frame_attach {
    uint16_t kind;
    uint16_t name_len;    /* MP__FRAME_NO_NAME for an unnamed attachment */
    uint32_t body_len;
} mp__frame_attach;

enum { MP__FRAME_TENSOR_GRAD = 1u };
typedef struct mp__frame_tensor {
    uint32_t storage;     /* index into the storage table */
    uint32_t dtype;
    uint32_t ndim;
    uint32_t flags;       /* MP__FRAME_TENSOR_GRAD: the grad's record follows */
    uint64_t byte_offset;
    /* int64 shape[ndim], int64 strides[ndim] */
} mp__frame_tensor;

typedef struct mp__frame_object {
    uint32_t fd_first;    /* this object's fds are fds[fd_first .. fd_first+nfds) */
    uint32_t nfds;
    /* object bytes: the rest of the attachment body */
} mp__frame_object;

static inline uint64_t mp__pad8(uint64_t n) { return (n + 7u) & ~(uint64_t)7u; }

/* An encoded message waiting to be sent: the record bytes, the fds that go
 * with it, and what must be undone if it is never sent. */
typedef struct mp__frame_out {
    void *buf;            /* the record: header + inline body */
    size_t len;
    int fds[MP__WIRE_MAX_FDS];
    int nfds;
    mp__segment *spill;   /* body segment when spilled (its fd is the last fd) */
    mp__segment_handle handles[MP__WIRE_MAX_FDS];
    int nhandles;         /* exported storages (FS: in-flight references) */
    mp__pins *pins;       /* the receiving end's pins, or NULL */
    mp__pin_ref pinned[MP__WIRE_MAX_FDS]; /* handles[i] PINNED: its in-flight count */
} mp__frame_out;

/* The compact record (src/wire/compact.c): a message of one tensor, no
 * grad, whose storage the receiving end pinned, in one ring slot. Then
 * uint64 byte_offset (only with MP__COMPACT_OFFSET: else 0), int64
 * shape[ndim], int64 strides[ndim] (only with MP__COMPACT_STRIDES: else
 * contiguous), the name (name_len bytes, no NUL; MP__FRAME_NO_NAME: none)
 * and the payload, unpadded. The pin's (dev, ino) are not sent: the
 * receiver reads them from its table, where they stay while the record is
 * in flight. A one-dimensional tensor with a short name and payload fits
 * one cache line with the slot's header. */
enum { MP__COMPACT_STRIDES = 1u, MP__COMPACT_OFFSET = 2u };
typedef struct mp__compact {
    uint32_t pin_gen;
    uint16_t pin_slot;
    uint8_t dtype;
    uint8_t ndim;
    int32_t sender_pid;   /* as mp__pin_ref */
    int32_t sender_fd;
    uint64_t size;        /* the storage's bytes, as a frame's storage entry */
    uint32_t payload_len;
    uint16_t name_len;
    uint8_t flags;
    uint8_t reserved;
} mp__compact;

/* Writes m as a compact record into buf (cap bytes) when it qualifies and
 * its storage is pinned at pins: 1, *len set and ref holding the pin's
 * in-flight count (give it back with mp__pins_unreserve if the record is
 * never sent); 0 when m must go as a frame. */
int mp__compact_encode(const mp_msg *m, mp__pins *pins, void *buf, size_t cap, size_t *len,
                       mp__pin_ref *ref);
/* Builds the message of a compact record received on the end of pins.
 * MP_EPROTO for a malformed record, as the frame decoder; the pin's
 * in-flight count is given back whatever happens. */
int mp__compact_decode(mp__pins *pins, const void *buf, size_t len, mp_msg **out);

/* Encodes m for the end whose pins are pins (NULL: no end, every storage
 * travels by fd or name); on success the caller must call
 * mp__frame_out_done(), passing sent = whether the record reached the
 * socket. */
int mp__frame_encode(const mp_msg *m, mp__pins *pins, mp__frame_out *out);
void mp__frame_out_done(mp__frame_out *out, bool sent);

/* Sends a queue's end-of-stream marker. A reader that finds it at the head
 * answers MP_ECLOSED; a peeking reader leaves it there for the others, a
 * one-call receive takes it (the queue's closed flag then tells the rest). */
int mp__wire_send_closed(int sock, double deadline);

/* The one-call receive's handshake (src/wire/rx.c). A reader holding the
 * lock may take a record in one recvmsg between a true fast_begin and
 * fast_end; a sender calls announce_fds before each record with fds. */
bool mp__rx_fast_begin(mp__rx *rx);
void mp__rx_fast_end(mp__rx *rx);
void mp__rx_announce_fds(mp__rx *rx, int sock);

#endif
