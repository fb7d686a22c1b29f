/* Sync objects as message attachments: typed wrappers over the wire's
 * generic object attachments (the descriptors live in object.c). */
#include "sync/sync_internal.h"
#include "wire/wire.h"

#define ATTACH(NAME, TYPE, KIND)                                                            \
    int mp_msg_add_##NAME(mp_msg *m, const char *name, TYPE *obj)                           \
    {                                                                                       \
        return mp__msg_add_object(m, name, &KIND, obj, "mp_msg_add_" #NAME);                 \
    }                                                                                       \
    int mp_msg_get_##NAME(const mp_msg *m, size_t index, TYPE **out)                        \
    {                                                                                       \
        return mp__msg_get_object(m, index, &KIND, (void **)out, "mp_msg_get_" #NAME);       \
    }

ATTACH(lock, mp_lock, mp__lock_kind)
ATTACH(rlock, mp_rlock, mp__rlock_kind)
ATTACH(semaphore, mp_semaphore, mp__semaphore_kind)
ATTACH(event, mp_event, mp__event_kind)
ATTACH(condition, mp_condition, mp__condition_kind)
ATTACH(barrier, mp_barrier, mp__barrier_kind)
