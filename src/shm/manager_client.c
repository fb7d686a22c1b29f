/* The library's side of mproc-shm-manager: the shm layer's hooks report
 * every file_system segment this process creates, opens, closes, unlinks,
 * sends and receives, on one Unix-socket connection per process.
 *
 * Reports are asynchronous (a non-blocking send, buffered when the socket is
 * full) except "sent": a name is about to leave the process, so everything
 * up to that report is flushed into the kernel first. The daemon therefore
 * hears of a segment before any other process can name it, even if we are
 * SIGKILLed right after the send.
 *
 * The daemon is started on demand at the first report (and again if it was
 * killed: a broken connection reconnects and re-registers every segment this
 * process still holds). Failures never reach the caller (the hooks return
 * void): segments keep working without the daemon, only the leak protection
 * is lost, and a line goes to the log hook. $MPROC_SHM_MANAGER=none turns
 * the client off.
 *
 * Fork: the child must not write on its parent's connection. An atfork
 * handler drops it in the child; the inherited held set (the child inherits
 * the mappings) is registered on the child's own connection at its first
 * report. */
#include "shm/manager.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define OUT_MAX (1u << 20)      /* buffered bytes before a blocking flush */
#define FLUSH_TIMEOUT_MS 2000   /* a daemon this slow is treated as gone */
#define START_TIMEOUT 5.0
#define RETRY_AFTER 1.0         /* after a failed start, drop reports this long */

typedef struct held_seg {
    char name[MP__SHM_NAME_MAX];
    uint64_t size;
} held_seg;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int conn = -1;
static pid_t conn_pid;          /* process that opened conn */
static char *out;               /* reports not yet in the kernel */
static size_t out_len, out_cap;
static held_seg *held;          /* segments this process maps now */
static int nheld, held_cap;
static double retry_after;
static int disabled = -1;       /* from $MPROC_SHM_MANAGER, read once */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void drop_conn(void)
{
    if (conn >= 0)
        close(conn);
    conn = -1;
    out_len = 0;
}

static int append(const char *line)
{
    size_t n = strlen(line);
    if (out_len + n > out_cap) {
        size_t cap = out_cap ? out_cap : 4096;
        while (cap < out_len + n)
            cap *= 2;
        char *nb = realloc(out, cap);
        if (!nb)
            return -1;
        out = nb;
        out_cap = cap;
    }
    memcpy(out + out_len, line, n);
    out_len += n;
    return 0;
}

/* Pushes the buffer into the kernel; waits for room only when `wait`.
 * -1 when the connection is broken (or the daemon stopped reading). */
static int flush(bool wait)
{
    size_t done = 0;
    int rc = 0;
    while (done < out_len) {
        ssize_t w = send(conn, out + done, out_len - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN && wait) {
            struct pollfd p = {.fd = conn, .events = POLLOUT};
            int r = poll(&p, 1, FLUSH_TIMEOUT_MS);
            if (r > 0 || (r < 0 && errno == EINTR))
                continue;
            rc = -1;
        } else if (!(w < 0 && errno == EAGAIN)) {
            rc = -1;
        }
        break;
    }
    memmove(out, out + done, out_len - done);
    out_len -= done;
    return rc;
}

/* Connects (starting the daemon when none listens) and registers this
 * process and what it holds. */
static int connect_locked(void)
{
    char line[MP__MGR_LINE_MAX];
    int rc;
    if (now() < retry_after)
        return -1;
    rc = mp__mgr_connect(&conn);
    if (rc == MP_ENOENT && mp__mgr_runtime_dir(line, sizeof line, true) == 0) {
        rc = mp__mgr_spawn(START_TIMEOUT);
        /* Another starter may have won the lock: its daemon binds shortly. */
        for (double end = now() + START_TIMEOUT; rc == 0;) {
            if ((rc = mp__mgr_connect(&conn)) != MP_ENOENT || now() > end)
                break;
            rc = 0;
            usleep(5000);
        }
    }
    if (rc < 0) {
        mp__log(MP_LOG_WARN, "file_system segments are not protected against leaks: %s",
                mp_last_error());
        retry_after = now() + RETRY_AFTER;
        conn = -1;
        return -1;
    }
    conn_pid = getpid();
    out_len = 0;
    snprintf(line, sizeof line, "HELLO %d %d\n", MP__MGR_PROTOCOL, (int)conn_pid);
    if (append(line) != 0)
        return -1;
    for (int i = 0; i < nheld; i++) {
        snprintf(line, sizeof line, "O %s\n", held[i].name);
        if (append(line) != 0)
            return -1;
    }
    return 0;
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

static void report(char verb, const char *name, uint64_t size, int held_change, bool sync)
{
    char line[MP__MGR_LINE_MAX];
    if (!mp__mgr_name_ok(name) || is_disabled())
        return;
    if (verb == 'C')
        snprintf(line, sizeof line, "C %s %llu\n", name, (unsigned long long)size);
    else
        snprintf(line, sizeof line, "%c %s\n", verb, name);
    pthread_mutex_lock(&lock);
    if (conn >= 0 && conn_pid != getpid()) /* forked without our atfork handler */
        drop_conn();
    /* Two tries: a daemon killed since the last report shows up as a broken
     * connection; the second try restarts it and re-registers. */
    for (int attempt = 0; attempt < 2; attempt++) {
        if (conn < 0 && connect_locked() != 0)
            break;
        if (append(line) == 0 && flush(sync || out_len > OUT_MAX) == 0)
            break;
        drop_conn();
    }
    if (held_change)
        held_update(name, size, held_change > 0);
    pthread_mutex_unlock(&lock);
}

static void on_created(const char *name, uint64_t size) { report('C', name, size, 1, false); }
static void on_opened(const char *name) { report('O', name, 0, 1, false); }
static void on_closed(const char *name) { report('X', name, 0, -1, false); }
static void on_unlinked(const char *name) { report('U', name, 0, -1, false); }
static void on_sent(const char *name) { report('S', name, 0, 0, true); }
static void on_received(const char *name) { report('R', name, 0, 0, false); }

static const mp__shm_hooks client_hooks = {
    .created = on_created,
    .opened = on_opened,
    .closed = on_closed,
    .unlinked = on_unlinked,
    .sent = on_sent,
    .received = on_received,
};

const mp__shm_hooks *mp__mgr_client_hooks(void) { return &client_hooks; }

void mp__mgr_client_reset(void)
{
    pthread_mutex_lock(&lock);
    drop_conn();
    retry_after = 0;
    pthread_mutex_unlock(&lock);
}

bool mp__mgr_client_connected(void)
{
    pthread_mutex_lock(&lock);
    bool c = conn >= 0 && conn_pid == getpid();
    pthread_mutex_unlock(&lock);
    return c;
}

static void atfork_prepare(void) { pthread_mutex_lock(&lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&lock); }
static void atfork_child(void)
{
    /* Close our copy only: the parent's connection stays open in the parent.
     * Its unflushed reports are the parent's to send. */
    if (conn >= 0)
        close(conn);
    conn = -1;
    out_len = 0;
    retry_after = 0;
    pthread_mutex_unlock(&lock);
}

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
