/* The fork guard: the CUDA runtime's state (contexts, the driver's threads
 * and its file descriptors) does not survive fork, so a child forked after
 * CUDA was initialised crashes or hangs on its first CUDA call. mproc refuses
 * the fork start method instead. */
#include "cuda/cuda_internal.h"

#include <stdatomic.h>

#include "os/os.h"

static atomic_bool real_init;
static void (*_Atomic exit_hook)(void);
static atomic_bool simulated;

bool mp__cuda_initialized(void)
{
    return atomic_load(&real_init) || atomic_load(&simulated);
}

void mp__cuda_mark_initialized(void)
{
    mp__fork_hazard_register(mp__cuda_fork_check);
    atomic_store(&real_init, true);
}

void mp__cuda_simulate_initialized(bool on)
{
    if (on)
        mp__fork_hazard_register(mp__cuda_fork_check);
    atomic_store(&simulated, on);
}

int mp__cuda_fork_check(const char *caller)
{
    if (!mp__cuda_initialized())
        return 0;
    return mp__error(MP_ESTATE, "%s: CUDA was initialised in this process and the CUDA runtime "
                                "does not survive fork; start the child with the spawn or "
                                "forkserver start method instead of fork",
                     caller ? caller : "starting a process");
}

void mp__cuda_set_exit_hook(void (*fn)(void))
{
    mp__child_exit_register(mp__cuda_on_exit);
    atomic_store(&exit_hook, fn);
}

void mp__cuda_on_exit(void)
{
    void (*fn)(void) = atomic_load(&exit_hook);
    if (fn)
        fn();
}
