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
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, CLI_COMMON_OPTIONS};
    const char *sub;
    bool json = false;
    char *reply = NULL;
    int c, rc = EXIT_OK;

    optind = 0;
    while ((c = cli_getopt(argc, argv, ":hV", opts, "shm-manager", &rc)) != -1) {
        if (c == CLI_DONE)
            return rc;
        json = true; /* 'j' */
    }
    if (optind >= argc)
        return cli_bad_usage("shm-manager", "shm-manager needs start, stop or status");
    sub = argv[optind];
    if (optind + 1 < argc)
        return cli_bad_usage("shm-manager", "unexpected argument \"%s\"", argv[optind + 1]);
    if (json && strcmp(sub, "status") != 0)
        return cli_bad_usage("shm-manager", "--json goes with status only");
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
