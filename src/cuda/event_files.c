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

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

pid_t mp__cuda_event_file_pid(const char *name)
{
    unsigned uid, pid, n;
    int end = 0;
    if (sscanf(name, "cuda.shm.%x.%x.%u%n", &uid, &pid, &n, &end) != 3 || name[end] != '\0')
        return 0;
    return (pid_t)pid;
}

static void remove_own_event_files(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    struct stat st;
    if (!d)
        return;
    while ((e = readdir(d))) {
        if (mp__cuda_event_file_pid(e->d_name) == getpid() &&
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            st.st_uid == geteuid())
            unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

static void register_removal(void)
{
    if (atexit(remove_own_event_files) == 0)
        mp__child_exit_register(remove_own_event_files); /* children that leave by _exit */
}

void mp__cuda_event_files_remove_at_exit(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_removal);
}
