/* The library's side of mproc-shm-manager: the shm layer's hooks report
 * every file_system segment this process creates, opens, closes, unlinks,
 * sends and receives.
 *
 * A process registers with one datagram ("HELLO") on a SOCK_DGRAM socket
 * connected to the daemon's, opened at the first report and kept
 * (O_CLOEXEC); the kernel stamps it with our verified pid, and it carries
 * our report ring, a sealed memfd both sides map (mp__mgr_ring). A report is
 * then one line written into the ring: no system call, and above all no
 * wake-up of the daemon, which it cost when every report was a datagram
 * (about 6 us of the sender's system time each, on 2 cores; a file_system
 * message makes five). The daemon reads every ring at each of its rounds,
 * and a dead client's ring before it forgets the client, so a report
 * written before a name leaves the process is seen even if we are
 * SIGKILLed next. A full ring sends WAKE and waits. A daemon that died is
 * noticed at the next report, as when every report was a send: the kernel
 * marks the robust mutex the daemon holds in each ring. Then the client
 * reconnects (ECONNREFUSED) and starts a new daemon; until the daemon took
 * the ring (it may die before it read our HELLO) each report PINGs first.
 * (A PING at most every MP__MGR_PING_EVERY seconds backs that up: the
 * kernel marks at most 2048 robust mutexes of a dying process.) Without a
 * ring (memfd or mmap failed) reports go as datagrams. Reports the shm
 * layer brackets as one batch (opened + received, closed + unlinked) are
 * written as one. A receive into a mapping we keep goes pending instead
 * (manager.h; "Pending receives" below).
 *
 * A forked child inherits the socket but makes its own ring and registers
 * (it inherited the mappings); so does every client after a daemon restart,
 * each time with every segment it holds. Failures never reach the caller
 * (the hooks return void): segments keep working, only the leak protection
 * is lost, and a line goes to the log hook (without one, the first such
 * line goes to stderr). $MPROC_SHM_MANAGER=none turns the client off. */
#include "shm/manager.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SEND_TIMEOUT_S 2        /* a daemon this slow is treated as gone */
#define START_TIMEOUT 5.0
#define RETRY_AFTER 1.0         /* after a failed start, drop reports this long */
#define CHUNK 3072              /* registration datagrams stay small */
#define RING_LEN (sizeof(mp__mgr_ring) + MP__MGR_RING_BYTES)

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
static mp__mgr_ring *ring;      /* our report ring; NULL: reports are datagrams */
static bool ring_refused;       /* a daemon never took our ring: datagrams from now on */
static double next_ping;
static int npending;            /* records set in ring->pending (manager.h) */
static unsigned ring_gen;       /* rings dropped so far */

/* The calling thread's open batch: lines waiting for its end. */
static _Thread_local int batch_depth;
static _Thread_local size_t batch_len;
static _Thread_local char batch_buf[4 * MP__MGR_LINE_MAX];

/* One datagram; blocks (bounded) only when the daemon's queue is full. */
static int send_dgram(const char *buf, size_t len)
{
    for (;;) {
        if (mp__sys.send(conn_fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

/* A fresh ring, mapped as `ring`; its fd (for the HELLO) in *fd. */
static int ring_make(int *fd)
{
    mp__mgr_ring *r;
    int f = mp__sys.memfd_create(MP__MGR_RING_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING), err;
    if (f < 0)
        return -errno;
    /* Sealed so the daemon can trust that the size stays. */
    if (mp__sys.ftruncate(f, (off_t)RING_LEN) != 0 ||
        mp__sys.fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        goto fail;
    r = mp__sys.mmap(NULL, RING_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (r == MAP_FAILED)
        goto fail;
    r->magic = MP__MGR_RING_MAGIC;
    r->version = MP__MGR_RING_VERSION;
    r->size = MP__MGR_RING_BYTES;
    {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        err = pthread_mutex_init(&r->daemon, &a);
        pthread_mutexattr_destroy(&a);
        if (err) {
            mp__sys.munmap(r, RING_LEN);
            mp__sys.close(f);
            return -err;
        }
    }
    ring = r;
    *fd = f;
    return 0;
fail:
    err = errno;
    mp__sys.close(f);
    return -err;
}

/* The daemon applies what is pending in a ring we drop (manager.h). */
static void ring_drop(void)
{
    if (ring)
        mp__sys.munmap(ring, RING_LEN);
    ring = NULL;
    npending = 0;
    ring_gen++;
}

/* Whether a daemon holds our ring's mutex, i.e. took the ring. */
static bool ring_taken(void)
{
    uint32_t w = atomic_load((_Atomic uint32_t *)(void *)&ring->daemon);
    return (w & FUTEX_TID_MASK) != 0;
}

/* Appends len bytes of whole lines to the ring. A full ring asks the daemon
 * to read it (WAKE) and waits, as a full socket made a send wait. -EPROTO:
 * no daemon took the ring (one that predates rings drops the fd). */
static int ring_put(const char *buf, size_t len)
{
    uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    double give_up = 0, wake_at = 0;
    size_t off, first;
    while (head + len - atomic_load_explicit(&ring->tail, memory_order_acquire) >
           MP__MGR_RING_BYTES) {
        double now = mp__now();
        int rc;
        if (give_up == 0)
            give_up = now + SEND_TIMEOUT_S;
        else if (now > give_up)
            return ring_taken() ? -ETIMEDOUT : -EPROTO;
        if (now >= wake_at) {
            if ((rc = send_dgram("WAKE\n", 5)) < 0)
                return rc;
            wake_at = now + 0.01;
        }
        nanosleep(&(struct timespec){0, 50000}, NULL);
    }
    off = (size_t)(head & (MP__MGR_RING_BYTES - 1));
    first = MP__MGR_RING_BYTES - off < len ? MP__MGR_RING_BYTES - off : len;
    memcpy(ring->data + off, buf, first);
    memcpy(ring->data, buf + first, len - first);
    atomic_store_explicit(&ring->head, head + len, memory_order_release);
    return 0;
}

/* Whether the daemon that reads our ring died (see mp__mgr_ring). */
static bool ring_daemon_died(void)
{
    uint32_t w = atomic_load((_Atomic uint32_t *)(void *)&ring->daemon);
    return (w & FUTEX_OWNER_DIED) != 0;
}

/* Reports whole lines: into the ring, or as one datagram without one. */
static int put_lines(const char *buf, size_t len)
{
    if (ring) {
        int rc = ring_put(buf, len);
        if (rc != -EPROTO)
            return rc;
        mp__log(MP_LOG_WARN, "shm manager client: the daemon never read our report ring "
                "(an mproc-shm-manager older than the library?): reporting in datagrams; "
                "the reports left in the ring are lost");
        ring_drop();
        ring_refused = true;
    }
    return send_dgram(buf, len);
}

/* HELLO with a new ring (or none, then reports go as datagrams), then
 * every segment we hold. */
static int send_register(void)
{
    char buf[CHUNK + MP__MGR_LINE_MAX];
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = buf};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    size_t len = 0;
    int rfd = -1, rc = 0;
    ring_drop(); /* a forked child's copy of its parent's, or one a dead daemon had */
    if (!ring_refused && ring_make(&rfd) == 0) {
        struct cmsghdr *c;
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof ctl.buf;
        c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &rfd, sizeof rfd);
    }
    iov.iov_len = (size_t)snprintf(buf, sizeof buf, "HELLO %d %d\n", MP__MGR_PROTOCOL,
                                   (int)mp__pid());
    while (mp__sys.sendmsg(conn_fd, &mh, MSG_NOSIGNAL) < 0)
        if (errno != EINTR) {
            rc = -errno;
            break;
        }
    mp__close(rfd); /* the daemon has its own reference now */
    if (rc < 0) {
        ring_drop();
        return rc;
    }
    next_ping = mp__now() + MP__MGR_PING_EVERY;
    for (int i = 0; i < nheld; i++) {
        len += (size_t)snprintf(buf + len, sizeof buf - len, "O %s\n", held[i].name);
        if (len >= CHUNK) {
            if ((rc = put_lines(buf, len)) < 0)
                return rc;
            len = 0;
        }
    }
    return len ? put_lines(buf, len) : 0;
}

/* Reports line, registering first when needed. 0 or -errno. */
static int deliver(const char *line)
{
    int rc;
    if (reg_pid != mp__pid()) {
        if ((rc = send_register()) < 0)
            return rc;
        reg_pid = mp__pid();
    }
    /* A dead daemon never reads the ring: say so before writing into it,
     * so the caller reconnects and the line goes into the new one. */
    if (ring && ring_daemon_died())
        return -ECONNREFUSED;
    /* The kernel marks only a mutex the daemon held: one killed before it
     * read our HELLO never took the ring and leaves no mark. Until it has,
     * each report first PINGs, which fails (ECONNREFUSED) once the daemon's
     * socket is gone; only the reports right after a HELLO pay for it. */
    if (ring && !ring_taken() && (rc = send_dgram("PING\n", 5)) < 0)
        return rc;
    if ((rc = put_lines(line, strlen(line))) < 0 || !ring)
        return rc;
    if (mp__now() >= next_ping) {
        next_ping = mp__now() + MP__MGR_PING_EVERY;
        return send_dgram("PING\n", 5);
    }
    return 0;
}

/* A fresh connection to the daemon's socket: 0, or -errno (ENOENT or
 * ECONNREFUSED: no daemon listens there). */
static int reconnect(const struct sockaddr_un *sa)
{
    struct timeval tv = {SEND_TIMEOUT_S, 0};
    int fd, err;
    conn_fd = mp__close(conn_fd);
    reg_pid = 0;
    if ((fd = mp__sys.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
        return -errno;
    /* Without the timeout a hung daemon with a full queue would hang us. */
    if (mp__sys.setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0 ||
        mp__sys.connect(fd, (const struct sockaddr *)sa, sizeof *sa) != 0) {
        err = errno;
        mp__close(fd);
        return -err;
    }
    conn_fd = fd;
    return 0;
}

/* Leak protection is off: the log hook hears every time; without one the
 * first time goes to stderr, the one exception to "the library never
 * prints", because silently unprotected segments leak at the next crash. */
static void say_unprotected(void)
{
    static bool said;
    if (mp__log(MP_LOG_WARN, "file_system segments are not protected against leaks: %s",
                mp_last_error()) || said)
        return;
    said = true;
    fprintf(stderr, "mproc: warning: file_system segments are not protected against leaks "
            "(said once; set a log hook with mp_set_log_hook for every occurrence): %s\n",
            mp_last_error());
}

/* Delivers line, starting or restarting the daemon if need be. */
static void deliver_or_restart(const char *line)
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
    say_unprotected();
    retry_after = mp__now() + RETRY_AFTER;
}

/* Hooks run inside library calls, often on their error paths: the caller's
 * errno and mp_last_error() sentence come out as they went in. */
static void report_locked(const char *line)
{
    mp__error_saved saved;
    mp__error_save(&saved);
    deliver_or_restart(line);
    mp__error_restore(&saved);
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

/* Writes one report line into the calling thread's open batch, or
 * delivers it. */
static void emit_locked(char verb, const char *name, uint64_t size)
{
    char line[MP__MGR_LINE_MAX];
    size_t len;
    if (verb == 'C')
        len = (size_t)snprintf(line, sizeof line, "C %s %llu\n", name, (unsigned long long)size);
    else
        len = (size_t)snprintf(line, sizeof line, "%c %s\n", verb, name);
    if (batch_depth > 0 && batch_len + len < sizeof batch_buf) {
        memcpy(batch_buf + batch_len, line, len + 1);
        batch_len += len;
    } else {
        report_locked(line);
    }
}

/* Pending receives (the protocol in manager.h): what makes a file_system
 * ping-pong or a buffer sent back and forth cost the daemon nothing. Each
 * side's receive is cancelled by its send of the same name, where every
 * handoff used to write two lines, format them and have the daemon parse
 * them (0.5 us of a 1.2 us C handoff on 2 CPUs). Only in our own
 * registered ring: a forked child's first report makes its own, and the
 * records it inherited are its parent's. */

/* Whether ring is the one this process registered (not its parent's). */
static bool ring_ours(void)
{
    return ring && reg_pid == mp__pid();
}

static bool pending_ours(void)
{
    return npending > 0 && ring_ours();
}

/* Frees a record: before its line is written, if it gets one (manager.h). */
static void pending_free(mp__mgr_pending *p)
{
    atomic_store(&p->state, MP__MGR_PENDING_FREE);
    npending--;
}

/* A receive of name goes pending: false when it cannot (no ring, a dead
 * daemon's, or one a forked child inherited and has not replaced yet). A
 * full set reports the record it reuses, so the daemon never sees fewer
 * receives than there were. (A daemon that never takes the ring loses its
 * records with its lines: put_lines.) */
static bool pending_add(const char *name)
{
    static int next;
    mp__mgr_pending *p = NULL;
    unsigned gen = ring_gen;
    size_t len = strnlen(name, sizeof p->name);
    if (!ring_ours() || ring_daemon_died() || len == sizeof p->name)
        return false;
    for (int i = 0; i < MP__MGR_PENDING && !p; i++)
        if (atomic_load_explicit(&ring->pending[i].state, memory_order_relaxed) ==
            MP__MGR_PENDING_FREE)
            p = &ring->pending[i];
    if (!p) {
        p = &ring->pending[next];
        next = (next + 1) % MP__MGR_PENDING;
        pending_free(p);
        emit_locked('R', p->name, 0);
        if (gen != ring_gen)
            return false; /* delivering it replaced the ring (a new daemon): p is gone */
    }
    memcpy(p->name, name, len + 1);
    atomic_store_explicit(&p->state, MP__MGR_PENDING_SET, memory_order_release);
    npending++;
    return true;
}

/* The record of a pending receive of name, or NULL. */
static mp__mgr_pending *pending_find(const char *name)
{
    if (!pending_ours())
        return NULL;
    for (int i = 0; i < MP__MGR_PENDING; i++)
        if (atomic_load_explicit(&ring->pending[i].state, memory_order_relaxed) ==
                MP__MGR_PENDING_SET &&
            strcmp(ring->pending[i].name, name) == 0)
            return &ring->pending[i];
    return NULL;
}

/* A send of name: true when it cancelled a pending receive of it (then
 * neither is reported). */
static bool pending_cancel(const char *name)
{
    mp__mgr_pending *p = pending_find(name);
    if (!p)
        return false;
    pending_free(p);
    return true;
}

/* Another report of name follows: its pending receives go first. (A
 * delivery that replaces the ring ends the loop: npending is 0 then.) */
static void pending_flush(const char *name)
{
    mp__mgr_pending *p;
    while ((p = pending_find(name))) {
        pending_free(p);
        emit_locked('R', name, 0);
    }
}

/* verb: C, O, X, U or S; 'P' is a receive that may go pending (the name is
 * mapped here, and its "X" will come), 'R' one reported at once. name is
 * valid (the shm layer checked it, mp__shm_name_ok, or made it): it is not
 * checked again on this path, which every file_system message takes twice. */
static void report(char verb, const char *name, uint64_t size, int held_change)
{
    int err = errno; /* held_update's realloc may set it */
    bool quiet;
    if (is_disabled())
        return;
    pthread_mutex_lock(&lock);
    quiet = verb == 'S' ? pending_cancel(name) : verb == 'P' && pending_add(name);
    if (!quiet) {
        if (verb != 'S')
            pending_flush(name);
        emit_locked(verb == 'P' ? 'R' : verb, name, size);
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
static void on_received(const char *name) { report('P', name, 0, 0); }
/* A message that never left, or left no mapping here, ends its flight as a
 * received one does. */
static void on_dropped(const char *name) { report('R', name, 0, 0); }

static void on_batch(bool begin)
{
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
}

static const mp__shm_hooks client_hooks = {
    .created = on_created,
    .opened = on_opened,
    .closed = on_closed,
    .unlinked = on_unlinked,
    .sent = on_sent,
    .received = on_received,
    .dropped = on_dropped,
    .batch = on_batch,
};

const mp__shm_hooks *mp__mgr_client_hooks(void) { return &client_hooks; }

void mp__mgr_client_reset(void)
{
    pthread_mutex_lock(&lock);
    conn_fd = mp__close(conn_fd);
    reg_pid = 0;
    retry_after = 0;
    ring_drop();
    ring_refused = false;
    pthread_mutex_unlock(&lock);
}

int mp__mgr_client_fd(void) { return conn_fd; }

/* A child forked while another thread reported must not inherit a locked
 * mutex. (It re-registers at its first report: reg_pid differs.) */
static void atfork_prepare(void) { pthread_mutex_lock(&lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&lock); }
static void atfork_child(void) { pthread_mutex_unlock(&lock); }

/* The shm layer reports through mp__mgr_client_hooks() unless a test set
 * other hooks, so a static link that uses segments pulls this file in by
 * that reference (no linker flag needed) and with it this constructor. */
__attribute__((constructor)) static void client_install(void)
{
    static const mp__fork_handlers h = {atfork_prepare, atfork_parent, atfork_child};
    mp__atfork_register(MP__FORK_SHM_MANAGER, &h);
}
