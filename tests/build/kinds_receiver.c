/* Helper of static_link_test.sh, linked with the documented static line:
 * receives what kinds_sender (argv[1]) sends and checks that every object
 * kind decodes although this program names none of their layers. It calls
 * no queue, lock or CUDA function, so a static link pulls the code of those
 * kinds only because receiving a message needs it. Prints one line; exit
 * status 0 when all is as expected. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mproc.h"

static const struct {
    const char *name;
    int kind;
} want[] = {
    {"queue", MP_ATTACH_QUEUE},
    {"simple queue", MP_ATTACH_SIMPLE_QUEUE},
    {"joinable queue", MP_ATTACH_JOINABLE_QUEUE},
    {"connection", MP_ATTACH_CONN},
    {"lock", MP_ATTACH_LOCK},
    {"rlock", MP_ATTACH_RLOCK},
    {"semaphore", MP_ATTACH_SEMAPHORE},
    {"event", MP_ATTACH_EVENT},
    {"condition", MP_ATTACH_CONDITION},
    {"barrier", MP_ATTACH_BARRIER},
};
#define NWANT (sizeof want / sizeof want[0])

static int fail(const char *what)
{
    printf("FAIL: %s: %s\n", what, mp_last_error());
    return 1;
}

/* Starts the sender with the write end's fd, which exec must keep. */
static pid_t start_sender(const char *path, mp_conn *w)
{
    int fd = mp_conn_fileno(w);
    char arg[16];
    pid_t pid;
    snprintf(arg, sizeof arg, "%d", fd);
    pid = fork();
    if (pid == 0) {
        fcntl(fd, F_SETFD, 0);
        execl(path, path, arg, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int check_every_kind(mp_conn *r)
{
    mp_msg *m = NULL;
    if (mp_conn_recv(r, &m, 30) < 0)
        return fail("receiving the message of every kind");
    if (mp_msg_count(m) != NWANT) {
        printf("FAIL: %zu attachments, want %zu\n", mp_msg_count(m), NWANT);
        return 1;
    }
    for (size_t i = 0; i < NWANT; i++) {
        if (mp_msg_kind(m, i) != want[i].kind || strcmp(mp_msg_name(m, i), want[i].name)) {
            printf("FAIL: attachment %zu is kind %d '%s', want %d '%s'\n", i, mp_msg_kind(m, i),
                   mp_msg_name(m, i), want[i].kind, want[i].name);
            return 1;
        }
    }
    mp_msg_destroy(m); /* releases each object through its kind */
    return 0;
}

/* Known kind, refused by the CUDA layer itself (no GPU, or no CUDA in this
 * build), never "does not know". */
static int check_cuda_kind(mp_conn *r)
{
    mp_msg *m = NULL;
    int rc = mp_conn_recv(r, &m, 30);
    if (rc == 0 || strstr(mp_last_error(), "does not know") ||
        !strstr(mp_last_error(), "CUDA tensor")) {
        printf("FAIL: the CUDA-kind attachment gave %d: %s\n", rc, mp_last_error());
        mp_msg_destroy(m);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    mp_conn *r = NULL, *w = NULL;
    int status = 0, rc;
    pid_t pid;
    if (argc != 2) {
        printf("usage: kinds_receiver SENDER\n");
        return 2;
    }
    if (mp_pipe(false, &r, &w) < 0)
        return fail("mp_pipe");
    pid = start_sender(argv[1], w);
    mp_conn_release(w);
    rc = check_every_kind(r) || check_cuda_kind(r);
    mp_conn_release(r);
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        printf("FAIL: the sender failed (status %d)\n", status);
        return 1;
    }
    if (rc == 0)
        printf("ok: every object kind decoded; the CUDA kind reached the CUDA layer\n");
    return rc;
}
