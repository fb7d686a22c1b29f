/* Sync objects as message attachments: typed wrappers over the wire's
 * generic object attachments (the descriptors live in object.c). */
#include "sync/sync_internal.h"
#include "wire/wire.h"

#define ATTACH(NAME, TYPE, KIND)                                                            \
    int mp_msg_add_##NAME(mp_msg *m, const char *name, TYPE *obj)                           \
    {                                                                                       \
        if (!m || !obj)                                                                     \
            return mp__error(MP_EINVAL, "mp_msg_add_" #NAME ": %s is NULL",                 \
                             m ? "the object" : "the message");                             \
        return mp__msg_add_object(m, name, KIND, obj);                                      \
    }                                                                                       \
    int mp_msg_get_##NAME(const mp_msg *m, size_t index, TYPE **out)                        \
    {                                                                                       \
        if (!m || !out)                                                                     \
            return mp__error(MP_EINVAL, "mp_msg_get_" #NAME ": %s is NULL",                 \
                             m ? "out" : "the message");                                    \
        return mp__msg_get_object(m, index, KIND, (void **)out);                            \
    }

ATTACH(lock, mp_lock, MP_ATTACH_LOCK)
ATTACH(rlock, mp_rlock, MP_ATTACH_RLOCK)
ATTACH(semaphore, mp_semaphore, MP_ATTACH_SEMAPHORE)
ATTACH(event, mp_event, MP_ATTACH_EVENT)
ATTACH(condition, mp_condition, MP_ATTACH_CONDITION)
ATTACH(barrier, mp_barrier, MP_ATTACH_BARRIER)
