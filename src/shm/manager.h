/* The shm manager: what the library client (manager_client.c), the daemon
 * (tools/shm-manager/) and the CLI (tools/mproc/) share — where the daemon
 * lives, its protocol, and how a /dev/shm/mproc-* segment is inspected.
 *
 * Protocol. A library client registers with a datagram on the daemon's
 * SOCK_DGRAM socket (kept connected; the kernel attaches the sender's
 * verified pid/uid, SCM_CREDENTIALS) that carries its report ring, a sealed
 * memfd (mp__mgr_ring), as SCM_RIGHTS. Reports are then text lines written
 * into the ring, which costs the client no system call and the daemon no
 * wake-up per report; the daemon reads every ring at each round (and the
 * ring of a client that died, before forgetting it). A client that cannot
 * make a ring sends its reports as datagrams instead. Text lines
 * "<verb> [args]\n":
 *
 *   HELLO <protocol> <pid>   first datagram of a client (and after a daemon restart)
 *   WAKE                     my ring is full: read it now
 *   PING                     nothing (a send that fails tells the client the daemon is gone)
 *   C <name> <size>          created        O <name>   opened
 *   X <name>                 closed (this process unmapped it)
 *   U <name>                 unlinked       S <name>   a message carrying it was sent
 *   R <name>                 a message carrying it was received
 *
 * A receive into a mapping the client keeps is not written as a line at
 * once: it is pending, a record in the ring's header (mp__mgr_pending) that
 * the client's next send of the same name cancels (the name went on: S and
 * R would cancel out in the daemon's counts) and that any other report of
 * the name writes out first as "R <name>". The daemon applies the pending
 * records of a ring it will never read again (its client is gone, or sent
 * a new ring), after the ring's lines. A receive reported late only keeps
 * the name longer (the receiver holds it until its "X" anyway); a send is
 * never held back.
 *
 * A client is alive while its pidfd is not readable. Control connections
 * (the CLI) use the SOCK_STREAM socket: one of STATUS, LIST or STOP; the
 * daemon answers lines ending in "END\n" and closes. A peer of another uid
 * gets "ERR ...\n" (stream) or is ignored and logged (datagram). Names are
 * "/mproc-..." as in shm.h; anything else is rejected, so the daemon never
 * unlinks a file outside the mproc namespace. */
#ifndef MPROC_SHM_MANAGER_H
#define MPROC_SHM_MANAGER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "shm/shm.h"

#define MP__MGR_PROTOCOL 2  /* 2: report rings */
#define MP__MGR_SOCKET "shm-manager.sock"   /* control: SOCK_STREAM */
#define MP__MGR_DGRAM "shm-manager.dgram"   /* reports: SOCK_DGRAM */
#define MP__MGR_LOCK "shm-manager.lock"
#define MP__MGR_LOG "shm-manager.log"
#define MP__MGR_LINE_MAX 256

/* A client's report ring: a byte ring of whole "\n"-terminated lines.
 * The client writes at head and publishes it (release); the daemon reads up
 * to head (acquire) and publishes tail. head - tail <= size. The daemon
 * holds `daemon` (robust, process-shared) for as long as it reads the ring:
 * when it dies, the kernel marks the mutex word FUTEX_OWNER_DIED, which the
 * client sees with one load at its next report, as a failed send told it
 * when every report was a datagram. */
#define MP__MGR_RING_MAGIC 0x676e697272676d6dull /* "mmgrring" */
#define MP__MGR_RING_VERSION 2u                  /* 2: pending receives */
#define MP__MGR_RING_BYTES (256u * 1024u)   /* data bytes, a power of two */
#define MP__MGR_RING_NAME "mproc-shm-reports" /* the memfd's name */
#define MP__MGR_PING_EVERY 1.0  /* seconds: a reporting client's liveness backstop */
/* A pending receive (see the protocol above): written by the client alone,
 * read by the daemon only once the client stopped using the ring. The
 * client frees a record before it writes its line, and fills one before it
 * sets it: killed in between, a receive is lost (the name is kept until
 * the last client exits), never counted twice (the name reclaimed while a
 * message carrying it is in flight). */
#define MP__MGR_PENDING 8
enum { MP__MGR_PENDING_FREE = 0, MP__MGR_PENDING_SET = 1 };
typedef struct mp__mgr_pending {
    _Atomic uint32_t state;
    char name[MP__SHM_NAME_MAX];
} mp__mgr_pending;

typedef struct mp__mgr_ring {
    uint64_t magic;
    uint32_t version;
    uint32_t size;                      /* bytes of data[] */
    pthread_mutex_t daemon;             /* held by the daemon reading the ring */
    mp__mgr_pending pending[MP__MGR_PENDING];
    _Alignas(64) _Atomic uint64_t head; /* bytes ever written (client) */
    _Alignas(64) _Atomic uint64_t tail; /* bytes ever read (daemon) */
    _Alignas(64) char data[];
} mp__mgr_ring;
/* Default grace period (seconds) after the last client is gone; override with
 * $MPROC_SHM_MANAGER_GRACE or the daemon's --grace. */
#define MP__MGR_GRACE_DEFAULT 2.0
#define MP__MGR_GRACE_MAX 31536000.0 /* a year: anything longer is a typo */
/* The grace period from $MPROC_SHM_MANAGER_GRACE into *out (left alone when
 * unset or empty); MP_EINVAL naming the variable when it is not a number in
 * [0, MP__MGR_GRACE_MAX]. The daemon refuses to start on it, and the library
 * checks it before starting one, so the failing call reports it. */
int mp__mgr_grace_env(double *out);

/* The private runtime directory: $MPROC_RUNTIME_DIR, else
 * $XDG_RUNTIME_DIR/mproc, else /tmp/mproc-<uid>. With create it is made mode
 * 0700 when missing. It must be a real directory (not a symlink) owned by us
 * with no group/other access, else MP_EPERM naming the problem. */
int mp__mgr_runtime_dir(char *buf, size_t cap, bool create);
/* The same check for `mproc doctor`: on failure also fills problem (what is
 * wrong) and fix (the one action that matches it, e.g. `chmod 700 DIR`).
 * A fix never tells to remove a path that mproc did not choose itself: for
 * $MPROC_RUNTIME_DIR it says to point the variable elsewhere or unset it.
 * *exists is false (and 0 returned) when the directory is not there yet. */
int mp__mgr_runtime_dir_diagnose(char *buf, size_t cap, bool create, bool *exists,
                                 char *problem, size_t pcap, char *fix, size_t fcap);
/* <runtime dir>/<file>. */
int mp__mgr_path(char *buf, size_t cap, const char *file, bool create);

/* Connects to the daemon's socket (SOCK_CLOEXEC, blocking). MP_ENOENT when
 * no daemon listens there. */
int mp__mgr_connect(int *fd);
/* Sends "<cmd>\n" on a fresh control connection and reads the reply up to
 * the "END" line into a malloc'd string. MP_ENOENT when no daemon runs. */
int mp__mgr_control(const char *cmd, char **reply, double timeout);
/* The same with an explicit control socket path (another runtime directory). */
int mp__mgr_connect_at(const char *path, int *fd);
int mp__mgr_control_at(const char *path, const char *cmd, char **reply, double timeout);

/* The daemon binary into buf: $MPROC_SHM_MANAGER when set ("none":
 * MP_ENOENT, the client is off), else found relative to the object holding
 * libmproc (dladdr): libmproc.so's folder, or the program's for a static
 * link, then MPROC_LIBEXEC_FROM_LIBDIR (or _BINDIR)/mproc-shm-manager, then
 * mproc-shm-manager in that folder itself (the build tree). 0, or MP_ENOENT
 * with the paths tried and the fix. */
int mp__mgr_binary(char *buf, size_t cap);
/* Starts the daemon (it detaches itself) with one optional argument (e.g.
 * "--persistent", or NULL) and waits for it to be ready or to find another
 * one already running. Returns 0 or a negative mp_error. */
int mp__mgr_spawn(const char *arg, double timeout);

/* A valid segment name: "/mproc-" or "mproc-" then [A-Za-z0-9_-], shorter
 * than MP__SHM_NAME_MAX. */
bool mp__mgr_name_ok(const char *name);

/* What `mproc shm ls`, gc and the daemon learn about one segment without
 * mapping it. */
typedef struct mp__seg_info {
    char name[MP__SHM_NAME_MAX];   /* "/mproc-..." */
    uint64_t file_size;            /* st_size */
    uint64_t size;                 /* header's data bytes (0 if no header) */
    bool has_header;               /* magic and version match */
    pid_t creator;                 /* header's pid, else the pid in the name, else 0 */
    bool creator_alive;
    uint32_t refcount;             /* header's, 0 without a header */
    int users;                     /* live processes mapping it or holding an fd */
    double age;                    /* seconds since its last status change */
} mp__seg_info;

/* Which /dev/shm files live processes use: one walk over /proc/<pid>/maps
 * and /proc/<pid>/fd (processes we may not read are skipped), counting the
 * names match accepts (mp__mgr_name_ok: mproc's segments). */
typedef struct mp__seg_users {
    char (*names)[MP__SHM_NAME_MAX];
    int *counts;
    int n, cap;
} mp__seg_users;
int mp__seg_users_collect(mp__seg_users *u, bool (*match)(const char *name));
int mp__seg_users_count(const mp__seg_users *u, const char *name);
void mp__seg_users_free(mp__seg_users *u);

/* Fills *info for /dev/shm/<name> (name with or without the leading '/');
 * users from u (-1 when u is NULL). MP_ENOENT when it does not exist. */
int mp__seg_inspect(const char *name, const mp__seg_users *u, mp__seg_info *info);
/* Calls fn for each regular file of /dev/shm owned by this uid whose name
 * match accepts; stops when fn returns non-zero. Returns the number visited
 * or a negative mp_error. */
int mp__shm_each(bool (*match)(const char *name), int (*fn)(const char *name, void *ctx),
                 void *ctx);
/* mp__shm_each over the mproc-* names (mp__mgr_name_ok). */
int mp__seg_each(int (*fn)(const char *name, void *ctx), void *ctx);
/* Whether a process with this pid exists (kill 0; EPERM counts as alive). */
bool mp__pid_alive(pid_t pid);

/* The library client's hook table (installed at load time), exposed so
 * tests can drive it without the shm layer. */
const mp__shm_hooks *mp__mgr_client_hooks(void);
/* Forgets the daemon this process registered with and its report ring (the
 * held set is kept and re-registered at the next report) and the cached
 * runtime directory.
 * For tests that change $MPROC_RUNTIME_DIR. */
void mp__mgr_client_reset(void);
/* The client's socket to the daemon, kept open once a report was made (-1
 * before). Leak checks in tests discount it: it is the library's, like the
 * forkserver's socket. */
int mp__mgr_client_fd(void);

#endif
