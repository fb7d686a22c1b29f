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
 * descriptor per kind and lists it in src/wire/kinds.c. */
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

/* NULL for an unknown kind. */
const mp__objkind *mp__objkind_lookup(int kind);

/* Generic attach/get for layers above (typed wrappers live in their headers,
 * e.g. mp_msg_add_queue in mproc/queue.h). add retains obj; get returns a new
 * reference, MP_EINVAL when the attachment is not of that kind. */
int mp__msg_add_object(mp_msg *m, const char *name, int kind, void *obj);
int mp__msg_get_object(const mp_msg *m, size_t index, int kind, void **obj);

/* Does what sending m would do first to its tensors (share each storage;
 * refuse a device tensor) without sending: 0 when m can be sent, else the
 * error a send would give, with its sentence. A pool worker checks each
 * result with it, so one unsendable result fails its item, not the chunk. */
int mp__wire_check_sendable(const mp_msg *m);

/* Takes ownership of a malloc'd payload of len bytes. */
void mp__msg_adopt_payload(mp_msg *m, void *payload, size_t len);

#endif
