/* What the wire layer offers the layers above it that put mproc objects in
 * messages or build messages themselves (ipc, sync, pool, cuda): the object
 * kinds, generic attach/get, and handing over a payload. The rest of the
 * wire (frames, records, the receive lock) stays in wire/wire.h, which only
 * the layers that move messages over sockets include. */
#ifndef MPROC_WIRE_OBJECTS_H
#define MPROC_WIRE_OBJECTS_H

#include <stddef.h>

#include "mproc/msg.h"

/* How an mproc object (queue, connection, lock, ...) crosses the wire: a few
 * bytes of its own plus some fds. Each layer above wire defines one
 * descriptor per kind and registers it (mp__objkind_register). */
typedef struct mp__objkind {
    int kind;          /* mp_attach_kind */
    const char *name;  /* "queue", ... for error sentences */
    void *(*retain)(void *obj);
    void (*release)(void *obj);
    /* Writes at most cap bytes to buf and at most maxfds fds (borrowed: the
     * kernel dups them on send) to fds; sets *len and *nfds. */
    int (*encode)(void *obj, void *buf, size_t cap, size_t *len, int *fds, int maxfds,
                  int *nfds);
    /* Builds the object from bytes and fds. Takes ownership of all nfds fds on
     * success AND on failure (closes them). Validates everything: MP_EPROTO. */
    int (*decode)(const void *buf, size_t len, int *fds, int nfds, void **obj);
} mp__objkind;

/* ---- the kind registry (src/wire/kinds.c) ----------------------------------
 * The decoder meets a kind as an id on the wire and finds its descriptor
 * here; nothing else needs the registry (a message built in this process
 * carries its attachments' descriptors). Every layer registers its own
 * kinds; src/ipc/kinds.c (mp__objkinds_ensure) registers all of them and is
 * called before any message is decoded, so a static link that never names a
 * kind still knows it when one arrives. */

/* Kind ids are 2 .. MP__OBJKIND_MAX - 1 (1 is the tensor, which is no
 * object); the table is indexed by id. */
#define MP__OBJKIND_MAX 64
/* Registers k under k->kind. Idempotent (the same descriptor again is 0);
 * thread-safe and lock-free. MP_EINVAL for an incomplete descriptor, an id
 * out of range, or an id another descriptor holds; the first such failure
 * is also kept for mp__objkind_check. */
int mp__objkind_register(const mp__objkind *k);
/* mp__objkind_register for each of n descriptors; stops at the first error. */
int mp__objkind_register_all(const mp__objkind *const *kinds, size_t n);
/* The descriptor registered under kind, or NULL. */
const mp__objkind *mp__objkind_lookup(int kind);
/* 0, or the first registration failure (its code, with call and its
 * sentence). */
int mp__objkind_check(const char *call);
/* Writes "2 (queue), 3 (connection), ..." for the kinds registered now into
 * buf (truncated to cap - 1 bytes; "" when none); returns its length. */
size_t mp__objkind_list(char *buf, size_t cap);

/* Generic attach/get for layers above (typed wrappers live in their headers,
 * e.g. mp_msg_add_queue in mproc/queue.h). add retains obj; get returns a new
 * reference, MP_EINVAL when the attachment is not of kind k. fn: the public
 * call, for the error sentences. */
int mp__msg_add_object(mp_msg *m, const char *name, const mp__objkind *k, void *obj,
                       const char *fn);
int mp__msg_get_object(const mp_msg *m, size_t index, const mp__objkind *k, void **obj,
                       const char *fn);
/* Appends src's object attachment at index to dst under the same name,
 * retained. MP_EINVAL when that attachment is a tensor or out of range. */
int mp__msg_copy_object(mp_msg *dst, const mp_msg *src, size_t index);
/* mp_msg_from_state_dict, its sentences naming fn (the public call made). */
int mp__msg_from_state_dict(size_t n, const char *const *names, mp_tensor *const *tensors,
                            mp_msg **out, const char *fn);

/* Does what sending m would do first to its tensors (share each storage;
 * refuse a device tensor) without sending: 0 when m can be sent, else the
 * error a send would give, with its sentence. A pool worker checks each
 * result with it, so one unsendable result fails its item, not the chunk. */
int mp__wire_check_sendable(const mp_msg *m);

/* Empties m (drops its attachments and payload) for reuse: a worker runs
 * every item of a chunk through the same two messages. */
void mp__msg_reset(mp_msg *m);
/* A payload buffer of len bytes (malloc'd, or kept from a freed payload),
 * and the way back for one (kept for the next, or freed; NULL is
 * harmless): every payload goes back through mp__msg_buf_put. */
void *mp__msg_buf_get(size_t len);
void mp__msg_buf_put(void *buf);
/* Takes ownership of a malloc'd payload of len bytes. */
void mp__msg_adopt_payload(mp_msg *m, void *payload, size_t len);
/* Makes data itself m's payload, not a copy of it, for a message built to
 * be sent at once and destroyed (a binding sending a large pickle): the
 * caller keeps data alive and unchanged until then. */
void mp__msg_borrow_payload(mp_msg *m, const void *data, size_t len);
/* n (at most MP__MSG_BLOCK) empty messages in one allocation (out[0..n)):
 * a pool map builds a message per result item, and one malloc and free per
 * item, with glibc consolidating and trimming between maps, cost more than
 * the items. Each
 * is still destroyed on its own (from any thread); the block's memory goes
 * with the last of them. */
#define MP__MSG_BLOCK 256
int mp__msg_create_block(size_t n, mp_msg **out);

#endif
