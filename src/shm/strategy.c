/* The sharing strategies, the per-process choice between them, and the hook
 * through which the shm-manager client hears about named segments. */
#include "shm/shm_internal.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/statvfs.h>

#include "mproc/tensor.h"
#include "shm/manager.h"

static const char *const names[] = {"file_descriptor", "file_system"};
static atomic_int strategy = MP__STRATEGY_FD;
static mp__shm_hooks hooks;
static bool hooks_set; /* by mp__shm_set_hooks (tests); else the manager client's */

void mp_get_all_sharing_strategies(const char *const **out, int *count)
{
    if (out)
        *out = names;
    if (count)
        *count = (int)(sizeof names / sizeof names[0]);
}

const char *mp_get_sharing_strategy(void)
{
    return names[atomic_load(&strategy)];
}

int mp_set_sharing_strategy(const char *name)
{
    if (!name)
        return mp__error(MP_EINVAL, "mp_set_sharing_strategy: name is NULL (valid: "
                                    "\"file_descriptor\", \"file_system\")");
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
        if (strcmp(name, names[i]) == 0) {
            atomic_store(&strategy, i);
            return 0;
        }
    }
    return mp__error(MP_ENOENT,
                     "mp_set_sharing_strategy: unknown strategy \"%.64s\" (valid: "
                     "\"file_descriptor\", \"file_system\")",
                     name);
}

int mp__shm_strategy(void)
{
    return atomic_load(&strategy);
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
