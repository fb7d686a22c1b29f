/* The per-process choice of sharing strategy (its public face, with the
 * names, is src/tensor/strategy.c), and the hook through which the
 * shm-manager client hears about named segments. */
#include "shm/shm_internal.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/statvfs.h>

#include "shm/manager.h"

static atomic_int strategy = MP__STRATEGY_FD;
static mp__shm_hooks hooks;
static bool hooks_set; /* by mp__shm_set_hooks (tests); else the manager client's */

int mp__shm_strategy(void)
{
    return atomic_load(&strategy);
}

void mp__shm_set_strategy(int s)
{
    atomic_store(&strategy, s);
}

void mp__shm_set_hooks(const mp__shm_hooks *h)
{
    if (h)
        hooks = *h;
    else
        memset(&hooks, 0, sizeof hooks);
    hooks_set = true;
}

/* A direct reference to the client: a static link that uses segments then
 * always carries it (it used to be installed by a constructor, which a
 * static link dropped unless told -Wl,--undefined). */
const mp__shm_hooks *mp__shm_hooks_get(void)
{
    return hooks_set ? &hooks : mp__mgr_client_hooks();
}

long long mp__shm_free_bytes(void)
{
    struct statvfs v;
    if (statvfs("/dev/shm", &v) != 0)
        return -1;
    return (long long)v.f_bavail * (long long)v.f_frsize;
}
