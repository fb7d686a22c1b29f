/* The one place that registers every object kind (see kinds.h). */
#include "ipc/kinds.h"

#include <stdatomic.h>

#include "cuda/cuda_internal.h"
#include "sync/sync_internal.h"

/* Set once every kind is in. Registering is idempotent, so two threads that
 * both find it unset just register twice; no lock a fork could catch held. */
static atomic_bool done;

static int register_all(void)
{
    static const mp__objkind *const own[] = {&mp__queue_kind, &mp__simple_queue_kind,
                                             &mp__joinable_queue_kind, &mp__conn_kind};
    int rc = mp__objkind_register_all(own, sizeof own / sizeof own[0]);
    if (rc == 0)
        rc = mp__sync_kinds_register();
    if (rc == 0)
        rc = mp__cuda_kinds_register();
    return rc;
}

int mp__objkinds_ensure(const char *call)
{
    if (!atomic_load_explicit(&done, memory_order_acquire)) {
        mp__error_saved saved;
        mp__error_save(&saved); /* success must leave the caller's sentence alone */
        if (register_all() == 0) {
            mp__error_restore(&saved);
            atomic_store_explicit(&done, true, memory_order_release);
        }
    }
    return mp__objkind_check(call);
}
