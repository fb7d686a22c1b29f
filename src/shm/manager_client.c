/* The library's side of mproc-shm-manager: the shm layer's hooks report
 * every file_system segment this process creates, opens, closes, unlinks,
 * sends and receives.
 *
 * Each report is one datagram on a SOCK_DGRAM socket connected to the
 * daemon's, opened at the first report and kept (O_CLOEXEC; a forked child
 * shares it and registers itself through it). Keeping it makes a report one
 * send(2): opening a socket per report (socket, mkdir, stat, sendto, close)
 * made the file_system strategy about 5x slower per message. The kernel
 * stamps each datagram with the sending process's verified pid. No reply is
 * awaited; send only enqueues, so a report made before a name leaves the
 * process ("sent" runs before the message goes out) is in the daemon's queue
 * before any other process can name the segment, even if we are SIGKILLed
 * next.
 *
 * The daemon is started on demand at the first report, and again when it is
 * gone: a connected datagram socket whose peer died fails with ECONNREFUSED,
 * and reconnecting reaches the new daemon. A process registers ("HELLO" plus
 * every segment it holds) on every new connection and in a forked child (it
 * inherited the mappings). Reports the shm layer brackets as one batch
 * (opened + received, closed + unlinked: one library call each) go as one
 * datagram: every datagram wakes the daemon, which on 2 cores costs the
 * sender more than the send. Failures never reach the caller (the hooks return
 * void): segments keep working, only the leak protection is lost, and a line
 * goes to the log hook.
 * $MPROC_SHM_MANAGER=none turns the client off. */
#include "shm/manager.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SEND_TIMEOUT_S 2        /* a daemon this slow is treated as gone */
#define START_TIMEOUT 5.0
#define RETRY_AFTER 1.0         /* after a failed start, drop reports this long */
#define CHUNK 3072              /* registration datagrams stay small */

typedef struct held_seg {
    char name[MP__SHM_NAME_MAX];
    uint64_t size;
} held_seg;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int conn_fd = -1;        /* connected to the daemon's datagram socket */
static pid_t reg_pid;           /* registered on conn_fd as this pid */
static held_seg *held;          /* segments this process maps now */
static int nheld, held_cap;
static double retry_after;
static int disabled = -1;       /* from $MPROC_SHM_MANAGER, read once */

/* The calling thread's open batch: lines waiting for its end. */
static _Thread_local int batch_depth;
static _Thread_local size_t batch_len;
static _Thread_local char batch_buf[4 * MP__MGR_LINE_MAX];

/* One datagram; blocks (bounded) only when the daemon's queue is full. */
static int send_dgram(const char *buf, size_t len)
{
    for (;;) {
        if (send(conn_fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

static int send_register(void)
{
    char buf[CHUNK + MP__MGR_LINE_MAX];
    size_t len = (size_t)snprintf(buf, sizeof buf, "HELLO %d %d\n", MP__MGR_PROTOCOL,
                                  (int)getpid());
    int rc;
    for (int i = 0; i < nheld; i++) {
        len += (size_t)snprintf(buf + len, sizeof buf - len, "O %s\n", held[i].name);
        if (len >= CHUNK) {
            if ((rc = send_dgram(buf, len)) < 0)
                return rc;
            len = 0;
        }
    }
    return len ? send_dgram(buf, len) : 0;
}

/* Sends line on conn_fd, registering first when needed. 0 or -errno. */
static int deliver(const char *line)
{
    int rc;
    if (reg_pid != getpid()) {
        if ((rc = send_register()) < 0)
            return rc;
        reg_pid = getpid();
    }
    return send_dgram(line, strlen(line));
}

/* A fresh connection to the daemon's socket: 0, or -errno (ENOENT or
 * ECONNREFUSED: no daemon listens there). */
static int reconnect(const struct sockaddr_un *sa)
{
    struct timeval tv = {SEND_TIMEOUT_S, 0};
    int fd, err;
    if (conn_fd >= 0)
        close(conn_fd);
    conn_fd = -1;
    reg_pid = 0;
    if ((fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        err = errno;
        close(fd);
        return -err;
    }
    conn_fd = fd;
    return 0;
}

static void report_locked(const char *line)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int rc, spawn_rc = 0;
    bool spawned = false;

    if (conn_fd >= 0 && deliver(line) == 0)
        return;
    if (mp__now() < retry_after)
        return;
    if (mp__mgr_path(sa.sun_path, sizeof sa.sun_path, MP__MGR_DGRAM, true) < 0)
        goto out_fail;
    rc = reconnect(&sa);
    if (rc == -ENOENT || rc == -ECONNREFUSED) {
        spawned = true;
        /* No daemon (never started, exited, or killed): start one. Another
         * starter may win the lock; its daemon binds shortly. */
        if ((spawn_rc = mp__mgr_spawn(NULL, START_TIMEOUT)) == 0) {
            double end = mp__now() + START_TIMEOUT;
            while ((rc = reconnect(&sa)) == -ENOENT || rc == -ECONNREFUSED) {
                if (mp__now() > end)
                    break;
                usleep(2000);
            }
        }
    }
    if (rc == 0 && (rc = deliver(line)) == 0)
        return;
    if (spawn_rc == 0)
        mp__errno_error(-rc, "shm manager client: send to %s%s", sa.sun_path,
                        spawned ? " after starting the daemon" : "");
out_fail:
    mp__log(MP_LOG_WARN, "file_system segments are not protected against leaks: %s",
            mp_last_error());
    retry_after = mp__now() + RETRY_AFTER;
}

static void held_update(const char *name, uint64_t size, bool add)
{
    for (int i = 0; i < nheld; i++)
        if (strcmp(held[i].name, name) == 0) {
            if (!add)
                held[i] = held[--nheld];
            return;
        }
    if (!add)
        return;
    if (nheld == held_cap) {
        int cap = held_cap ? held_cap * 2 : 16;
        held_seg *nh = realloc(held, (size_t)cap * sizeof *nh);
        if (!nh)
            return; /* only re-registration after a daemon restart misses it */
        held = nh;
        held_cap = cap;
    }
    snprintf(held[nheld].name, sizeof held[nheld].name, "%s", name);
    held[nheld++].size = size;
}

static bool is_disabled(void)
{
    if (disabled < 0) {
        const char *e = getenv("MPROC_SHM_MANAGER");
        disabled = e && strcmp(e, "none") == 0;
    }
    return disabled;
}

static void report(char verb, const char *name, uint64_t size, int held_change)
{
    char line[MP__MGR_LINE_MAX];
    int err = errno; /* hooks run inside library calls: leave errno alone */
    if (!mp__mgr_name_ok(name) || is_disabled())
        return;
    if (verb == 'C')
        snprintf(line, sizeof line, "C %s %llu\n", name, (unsigned long long)size);
    else
        snprintf(line, sizeof line, "%c %s\n", verb, name);
    pthread_mutex_lock(&lock);
    if (batch_depth > 0 && batch_len + strlen(line) < sizeof batch_buf) {
        memcpy(batch_buf + batch_len, line, strlen(line) + 1);
        batch_len += strlen(line);
    } else {
        report_locked(line);
    }
    if (held_change)
        held_update(name, size, held_change > 0);
    pthread_mutex_unlock(&lock);
    errno = err;
}

static void on_created(const char *name, uint64_t size) { report('C', name, size, 1); }
static void on_opened(const char *name) { report('O', name, 0, 1); }
static void on_closed(const char *name) { report('X', name, 0, -1); }
static void on_unlinked(const char *name) { report('U', name, 0, -1); }
static void on_sent(const char *name) { report('S', name, 0, 0); }
static void on_received(const char *name) { report('R', name, 0, 0); }

static void on_batch(bool begin)
{
    int err = errno;
    if (begin) {
        batch_depth++;
        return;
    }
    if (--batch_depth > 0 || batch_len == 0)
        return;
    pthread_mutex_lock(&lock);
    report_locked(batch_buf);
    pthread_mutex_unlock(&lock);
    batch_len = 0;
    errno = err;
}

static const mp__shm_hooks client_hooks = {
    .created = on_created,
    .opened = on_opened,
    .closed = on_closed,
    .unlinked = on_unlinked,
    .sent = on_sent,
    .received = on_received,
    .batch = on_batch,
};

const mp__shm_hooks *mp__mgr_client_hooks(void) { return &client_hooks; }

void mp__mgr_client_reset(void)
{
    pthread_mutex_lock(&lock);
    if (conn_fd >= 0)
        close(conn_fd);
    conn_fd = -1;
    reg_pid = 0;
    retry_after = 0;
    pthread_mutex_unlock(&lock);
}

int mp__mgr_client_fd(void) { return conn_fd; }

int mp__mgr_client_held(void)
{
    pthread_mutex_lock(&lock);
    int n = nheld;
    pthread_mutex_unlock(&lock);
    return n;
}

/* A child forked while another thread reported must not inherit a locked
 * mutex. (It re-registers at its first report: reg_pid differs.) */
static void atfork_prepare(void) { pthread_mutex_lock(&lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&lock); }
static void atfork_child(void) { pthread_mutex_unlock(&lock); }

/* The shm layer may be absent from a static link that never creates
 * segments: then there is nothing to report, and the weak reference keeps
 * this file from pulling it in. */
extern void mp__shm_set_hooks(const mp__shm_hooks *hooks) __attribute__((weak));

/* Referenced by -Wl,--undefined (cmake/install.cmake) so that a static link
 * keeps this file, whose constructor installs the hooks. */
const int mp__mgr_client_anchor = 1;

__attribute__((constructor)) static void client_install(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
    if (mp__shm_set_hooks)
        mp__shm_set_hooks(&client_hooks);
}
