/* Every object kind that can travel as a message attachment. Each layer
 * above wire defines its descriptor; this table is where they meet. */
#include "wire/wire.h"

/* Add one line per kind as the layers implement them, e.g.
 * extern const mp__objkind mp__queue_kind; ... &mp__queue_kind, */
extern const mp__objkind mp__queue_kind;
extern const mp__objkind mp__simple_queue_kind;
extern const mp__objkind mp__joinable_queue_kind;
extern const mp__objkind mp__conn_kind;
extern const mp__objkind mp__lock_kind, mp__rlock_kind, mp__semaphore_kind, mp__event_kind,
    mp__condition_kind, mp__barrier_kind; /* src/sync/object.c */
extern const mp__objkind mp__cuda_tensor_kind; /* src/cuda/gpu_ipc.c or cuda_stub.c */
static const mp__objkind *const kinds[] = {
    &mp__queue_kind,
    &mp__simple_queue_kind,
    &mp__joinable_queue_kind,
    &mp__conn_kind,
    &mp__lock_kind, &mp__rlock_kind, &mp__semaphore_kind, &mp__event_kind,
    &mp__condition_kind, &mp__barrier_kind,
    &mp__cuda_tensor_kind,
    NULL,
};

const mp__objkind *mp__objkind_lookup(int kind)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (kinds[i] && kinds[i]->kind == kind)
            return kinds[i];
    return NULL;
}
