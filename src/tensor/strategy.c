/* The sharing strategies as tensor.h presents them: their names and the
 * per-process choice, which the shm layer keeps (mp__shm_strategy). */
#include "tensor/tensor_priv.h"

#include <string.h>

#include "shm/shm.h"

/* NULL-terminated, as every "list all names" call returns; index =
 * MP__STRATEGY_*. */
static const char *const names[] = {"file_descriptor", "file_system", NULL};
_Static_assert(MP__STRATEGY_FD == 0 && MP__STRATEGY_FS == 1, "names follow the shm enum");

const char *const *mp_get_all_sharing_strategies(void) { return names; }

const char *mp_get_sharing_strategy(void) { return names[mp__shm_strategy()]; }

int mp_set_sharing_strategy(const char *name)
{
    if (!name)
        return mp__error(MP_EINVAL, "mp_set_sharing_strategy: name is NULL (valid: "
                                    "\"file_descriptor\", \"file_system\")");
    for (int i = 0; names[i]; i++) {
        if (strcmp(name, names[i]) == 0) {
            mp__shm_set_strategy(i);
            return 0;
        }
    }
    return mp__error(MP_ENOENT,
                     "mp_set_sharing_strategy: unknown strategy \"%.64s\" (valid: "
                     "\"file_descriptor\", \"file_system\")",
                     name);
}
