/* The CUDA driver keeps each process's interprocess events in a file of
 * /dev/shm named cuda.shm.<uid>.<pid>.<n> (hexadecimal uid and pid), made by
 * the first such event, and never removes it: not when the event is
 * destroyed, not when the process exits (driver 580 on an H100; an 80 KiB
 * file each). Receivers open the file by name when they open an event handle,
 * so it must exist while the process can still send; at exit it cannot, and
 * mproc removes the file of the exiting process. A process killed by a
 * signal leaves its file: `mproc shm gc` removes those of dead processes. */
#include "cuda/cuda_internal.h"
#include "os/os.h"
#include "shm/manager.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

pid_t mp__cuda_event_file_pid(const char *name)
{
    unsigned uid, pid, n;
    int end = 0;
    if (sscanf(name, "cuda.shm.%x.%x.%u%n", &uid, &pid, &n, &end) != 3 || name[end] != '\0')
        return 0;
    return (pid_t)pid;
}

static bool is_event_file(const char *name) { return mp__cuda_event_file_pid(name) > 0; }

int mp__cuda_event_files_each(int (*fn)(const char *name, void *ctx), void *ctx)
{
    return mp__shm_each(is_event_file, fn, ctx);
}

static int remove_if_own(const char *name, void *ctx)
{
    (void)ctx;
    if (mp__cuda_event_file_pid(name) == mp__pid())
        shm_unlink(name);
    return 0;
}

/* The process that last made an event. Children forked after it inherit
 * the exit hook but make no events (CUDA does not survive a fork), so they
 * skip the scan of /dev/shm: a DataLoader's workers exit often. */
static _Atomic pid_t maker;

static void remove_own_event_files(void)
{
    if (atomic_load(&maker) == mp__pid())
        mp__cuda_event_files_each(remove_if_own, NULL);
}

static void register_removal(void)
{
    if (atexit(remove_own_event_files) == 0)
        mp__child_exit_register(remove_own_event_files); /* children that leave by _exit */
}

void mp__cuda_event_files_remove_at_exit(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (atomic_load_explicit(&maker, memory_order_relaxed) != mp__pid())
        atomic_store(&maker, mp__pid());
    pthread_once(&once, register_removal);
}
