/* A file_system producer for the install tests (relocate_test.sh,
 * deb_test.sh), built against an installed mproc: it creates shared tensors
 * under the file_system strategy (which starts the installed shm-manager
 * daemon), prints "ready <pid>" and waits to be SIGKILLed, leaving its
 * segments for the daemon to reclaim. Two tensors, so a daemon that cannot
 * start is reported twice to the library but said once on stderr. With
 * --hook it sets a log hook that prints each line on stdout as "hook: ...",
 * and then the library must say nothing on stderr. */
#include <mproc.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void hook(int level, const char *line, void *user)
{
    (void)level;
    (void)user;
    printf("hook: %s\n", line);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int64_t shape[1] = {1024};
    mp_tensor *t[2] = {NULL, NULL};
    if (argc > 1 && strcmp(argv[1], "--hook") == 0)
        mp_set_log_hook(hook, NULL);
    if (mp_set_sharing_strategy("file_system") != 0) {
        fprintf(stderr, "fs_leak: %s\n", mp_last_error());
        return 1;
    }
    for (int i = 0; i < 2; i++)
        if (mp_tensor_empty_shared(MP_FLOAT32, 1, shape, &t[i]) != 0) {
            fprintf(stderr, "fs_leak: %s\n", mp_last_error());
            return 1;
        }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    pause();
    return 0;
}
