/* Every object kind a message can carry, registered with the wire layer in
 * one place. ipc is the lowest layer that receives messages, so it is the
 * lowest one allowed to name all the kinds' layers (sync and cuda sit below
 * it, docs/architecture.md). */
#ifndef MPROC_IPC_KINDS_H
#define MPROC_IPC_KINDS_H

#include "wire/objects.h"

/* The descriptors of this layer (queue.c, conn.c). */
extern const mp__objkind mp__queue_kind, mp__simple_queue_kind, mp__joinable_queue_kind,
    mp__conn_kind;

/* Registers the kinds of ipc, sync and cuda, once per process (a forked
 * child inherits them). Every path that decodes a message calls it first:
 * the receive calls of this layer, the process layer's argument message and
 * mp_setup, the MPI layer's receives and the Python extension's decoder. So
 * a program linked statically knows every kind when one arrives, even if it
 * never names that kind's layer (a constructor would not: the linker drops
 * an object file nothing references, and its constructor with it).
 * Lock-free, thread-safe and fork-safe. 0, or the first registration
 * failure (an mproc bug: two descriptors claim one id) with call in its
 * sentence, on every call. */
int mp__objkinds_ensure(const char *call);

#endif
