/* Other shm managers of this uid. One daemon per user is the rule, but a
 * process with another $MPROC_RUNTIME_DIR (a test, a container sharing
 * /dev/shm) gets its own daemon, and every daemon sees every segment of the
 * uid. A segment that another live daemon tracks from its clients' reports
 * (it may be in flight in a queue, unmapped, its creator dead) is that
 * daemon's to judge: an adopter must not reclaim it. Daemons are found by
 * their listening control sockets in /proc/net/unix. */
#include "daemon.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define PEER_TIMEOUT 0.3 /* a peer busy longer than this: ask again later */

/* Appends peer's LIST answer to *all; false if it did not answer. */
static bool ask(const char *path, char **all, size_t *len)
{
    char *reply = NULL;
    int rc = mp__mgr_control_at(path, "LIST", &reply, PEER_TIMEOUT);
    if (rc == MP_ENOENT) /* it exited meanwhile: it tracks nothing now */
        return true;
    if (rc < 0) {
        dlog("shm manager at %s did not answer (%s): adopted segments wait", path,
             mp_last_error());
        return false;
    }
    size_t n = strlen(reply);
    char *grown = realloc(*all, *len + n + 1);
    if (!grown) {
        free(reply);
        return false;
    }
    memcpy(grown + *len, reply, n + 1);
    *all = grown;
    *len += n;
    free(reply);
    return true;
}

/* Whether the daemon serving the socket at path sees our /dev/shm (a
 * daemon in another mount namespace, e.g. a test's private tmpfs, cannot
 * track our segments). Its pid is in the lock file next to the socket;
 * when we cannot tell, assume it does. */
static bool same_dev_shm(const char *path)
{
    char lock[sizeof(((struct sockaddr_un *)0)->sun_path) + 16], root[64];
    struct stat ours, theirs;
    int pid = 0;
    FILE *f;
    size_t n = strlen(path) - strlen(MP__MGR_SOCKET);
    snprintf(lock, sizeof lock, "%.*s%s", (int)n, path, MP__MGR_LOCK);
    if (!(f = fopen(lock, "re")))
        return true;
    if (fscanf(f, "%d", &pid) != 1)
        pid = 0;
    fclose(f);
    snprintf(root, sizeof root, "/proc/%d/root/dev/shm", pid);
    if (pid <= 0 || stat("/dev/shm", &ours) != 0 || stat(root, &theirs) != 0)
        return true;
    return ours.st_dev == theirs.st_dev && ours.st_ino == theirs.st_ino;
}

char *peers_list(const char *own_socket)
{
    FILE *f = fopen("/proc/net/unix", "re");
    char line[512], *all = calloc(1, 1);
    size_t len = 0;
    bool ok = all != NULL;
    static const char sock[] = "/" MP__MGR_SOCKET;

    while (ok && f && fgets(line, sizeof line, f)) {
        unsigned long flags = 0;
        unsigned type = 0;
        char path[sizeof(((struct sockaddr_un *)0)->sun_path)] = "";
        struct stat st;
        size_t n;
        /* "Num: RefCount Protocol Flags Type St Inode Path"; listening
         * sockets carry __SO_ACCEPTCON (0x10000). */
        if (sscanf(line, "%*s %*s %*s %lx %x %*s %*s %107s", &flags, &type, path) != 3 ||
            !(flags & 0x10000) || type != 1)
            continue;
        n = strlen(path);
        if (n <= sizeof sock - 1 || strcmp(path + n - (sizeof sock - 1), sock) != 0 ||
            strcmp(path, own_socket) == 0)
            continue;
        if (stat(path, &st) != 0 || st.st_uid != geteuid() || !S_ISSOCK(st.st_mode) ||
            !same_dev_shm(path))
            continue;
        ok = ask(path, &all, &len);
    }
    if (f)
        fclose(f);
    if (!ok) {
        free(all);
        return NULL;
    }
    return all;
}

bool peers_track(const char *lists, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = lists; (p = strstr(p, "SEG ")); p += 4) {
        const char *eol = strchr(p, '\n');
        if (p != lists && p[-1] != '\n')
            continue;
        if (strncmp(p + 4, name, n) == 0 && p[4 + n] == ' ' && eol && eol - p > 8 &&
            strncmp(eol - 7, "tracked", 7) == 0)
            return true;
    }
    return false;
}
