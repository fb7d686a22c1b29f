/* Fork hazards and child-exit work that layers above register here, so the
 * process layer, which forks and exits children, calls no such layer by
 * name (the CUDA layer is one: its runtime does not survive fork, and its
 * producer has exit work an mproc child's _exit would skip). Slots are
 * claimed with a compare-exchange: registering takes no lock, and a child
 * forked meanwhile inherits nothing half-done. */
#include "os/os.h"

#include <stdatomic.h>

#define SLOTS 8

static _Atomic(mp__fork_hazard_fn) hazards[SLOTS];
static void (*_Atomic exit_work[SLOTS])(void);

/* Puts fn in the first free slot unless it is there already. */
#define REGISTER(table, fn)                                                                        \
    do {                                                                                           \
        for (int i = 0; i < SLOTS; i++) {                                                          \
            __typeof__(fn) cur = NULL;                                                             \
            if (atomic_compare_exchange_strong(&table[i], &cur, fn) || cur == fn)                  \
                return 0;                                                                          \
        }                                                                                          \
        return mp__error(MP_EOVERFLOW, "%s: more than %d registered", __func__, SLOTS);            \
    } while (0)

int mp__fork_hazard_register(mp__fork_hazard_fn fn) { REGISTER(hazards, fn); }

int mp__child_exit_register(void (*fn)(void)) { REGISTER(exit_work, fn); }

int mp__fork_hazards_check(const char *call)
{
    for (int i = 0; i < SLOTS; i++) {
        mp__fork_hazard_fn fn = atomic_load(&hazards[i]);
        int rc = fn ? fn(call) : 0;
        if (rc < 0)
            return rc;
    }
    return 0;
}

void mp__child_exit_run(void)
{
    for (int i = 0; i < SLOTS; i++) {
        void (*fn)(void) = atomic_load(&exit_work[i]);
        if (fn)
            fn();
    }
}
