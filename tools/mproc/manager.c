/* mproc shm-manager start|stop|status. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "shm/manager.h"

static void print_status(const char *reply, bool json)
{
    char *copy = strdup(reply), *save = NULL, *line;
    if (!copy)
        return;
    if (json)
        printf("{\"running\":true");
    for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *sp = strchr(line, ' ');
        if (strcmp(line, "END") == 0 || !sp)
            continue;
        *sp = 0;
        if (!json) {
            printf("%-12s %s\n", line, sp + 1);
        } else {
            char *end;
            strtod(sp + 1, &end);
            printf(",\"%s\":", line);
            if (*end == 0 && sp[1])
                printf("%s", sp + 1);
            else
                json_string(stdout, sp + 1);
        }
    }
    if (json)
        printf("}\n");
    free(copy);
}

int cmd_shm_manager(int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : NULL;
    bool json = false;
    char *reply = NULL;
    int rc;

    if (cli_wants_help(argc, argv))
        return cli_usage(stdout, "shm-manager"), EXIT_OK;
    if (!sub)
        return cli_bad_usage("shm-manager", "shm-manager needs start, stop or status");
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && strcmp(sub, "status") == 0)
            json = true;
        else
            return cli_bad_usage("shm-manager", "unexpected argument \"%s\"", argv[i]);
    }
    if (strcmp(sub, "start") == 0) {
        char dir[256];
        if (mp__mgr_runtime_dir(dir, sizeof dir, true) < 0 ||
            mp__mgr_spawn("--persistent", 5.0) < 0) {
            fprintf(stderr, "mproc shm-manager start: %s\n", mp_last_error());
            return EXIT_FAIL;
        }
        if (mp__mgr_control("STATUS", &reply, 5.0) != 0) {
            fprintf(stderr, "mproc shm-manager start: started, but it does not answer: %s\n",
                    mp_last_error());
            return EXIT_FAIL;
        }
        print_status(reply, false);
        free(reply);
        return EXIT_OK;
    }
    if (strcmp(sub, "stop") == 0) {
        rc = mp__mgr_control("STOP", &reply, 5.0);
        free(reply);
        if (rc == MP_ENOENT) {
            printf("mproc-shm-manager is not running\n");
            return EXIT_OK;
        }
        if (rc < 0) {
            fprintf(stderr, "mproc shm-manager stop: %s\n", mp_last_error());
            return EXIT_FAIL;
        }
        /* It exits right after answering; wait until its socket is gone. */
        for (int i = 0; i < 500; i++) {
            int fd;
            if (mp__mgr_connect(&fd) != 0) {
                printf("mproc-shm-manager stopped\n");
                return EXIT_OK;
            }
            close(fd);
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        }
        fprintf(stderr, "mproc shm-manager stop: it still answers after 5 s; see %s in the "
                        "runtime directory (mproc doctor shows where)\n", MP__MGR_LOG);
        return EXIT_FAIL;
    }
    if (strcmp(sub, "status") == 0) {
        rc = mp__mgr_control("STATUS", &reply, 5.0);
        if (rc == MP_ENOENT) {
            if (json)
                printf("{\"running\":false}\n");
            else
                printf("mproc-shm-manager is not running\n");
            return EXIT_NOT_RUNNING;
        }
        if (rc < 0) {
            fprintf(stderr, "mproc shm-manager status: %s\n", mp_last_error());
            return EXIT_FAIL;
        }
        print_status(reply, json);
        free(reply);
        return EXIT_OK;
    }
    return cli_bad_usage("shm-manager", "unknown shm-manager command \"%s\"", sub);
}
