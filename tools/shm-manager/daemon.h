/* mproc-shm-manager internals: the segment table and its reclaiming rule
 * (table.c), the event loop (main.c). See docs/cli.md for the rule. */
#ifndef MPROC_SHM_DAEMON_H
#define MPROC_SHM_DAEMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "shm/manager.h"

/* One tracked segment. holders are ids of live client connections that
 * created or opened it and have not closed it. sent/received count the
 * messages carrying its name, as reported by any client. */
typedef struct dseg {
    char name[MP__SHM_NAME_MAX];
    uint32_t hash;     /* of name, for the table's index */
    uint64_t size;
    pid_t creator;
    uint64_t *holders;
    int nholders, holders_cap;
    int64_t sent, received;
    bool adopted;      /* found in /dev/shm at start, not reported to us */
    bool candidate;    /* looked reclaimable at the previous check ... */
    double since;      /* ... and since then (monotonic seconds) */
    double peer_wait;  /* adopted: since when a peer daemon does not answer (0: none) */
} dseg;

/* The daemon's log (stderr, which is the log file once detached). */
void dlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Tells the starter waiting on ready_fd (if >= 0) how the start went, and
 * closes it: 'R' ready, 'A' another daemon serves, 'F' failed. */
void starter_tell(int ready_fd, char verdict);

/* Applies one report line of client `id` (pid for messages). Returns 0, or
 * -1 for a malformed line (logged and ignored). */
int table_report(uint64_t id, pid_t pid, const char *line);
/* A client is gone: forget what it held. */
void table_client_gone(uint64_t id, pid_t pid);
/* The adopted segments' quarantine (the grace period) and our own control
 * socket (to tell other daemons' sockets from ours). */
void table_init(double quarantine, const char *own_socket);
/* Two-phase reclaim of tracked segments (see table.c): unlinks those that
 * were candidates at the previous call and still qualify, marks new ones.
 * Returns how many are candidates now (the caller checks again soon). */
int table_reclaim(double now);
/* The same for adopted segments (walks /proc: call it a few times a second
 * at most). Returns how many wait for their quarantine to end. */
int table_reclaim_adopted(double now);
/* Grace expired: unlinks every tracked segment, and adopted ones whose
 * quarantine is over. */
void table_reclaim_all(double now);
/* Adopts the /dev/shm/mproc-* segments of this uid that we do not track
 * (n > 0: only those named after one of the n pids in only). One pass over
 * /dev/shm whatever n is. */
void table_scan(const pid_t *only, int n);
/* Number of tracked segments; LIST output. */
int table_count(void);
void table_list(FILE *f);
/* Whether an adopted segment needs a periodic re-check. */
bool table_has_adopted(void);

/* Report rings (ring.c). attach maps the ring a client sent with its HELLO
 * and closes fd: NULL when it is not a valid ring (logged). read hands fn
 * every whole line written since the last read, in NUL-terminated chunks;
 * false when the ring is corrupt (detach it and ignore it from then on). */
mp__mgr_ring *ring_attach(int fd, pid_t pid);
void ring_detach(mp__mgr_ring *r);
bool ring_read(mp__mgr_ring *r, pid_t pid, void (*fn)(void *ctx, char *lines), void *ctx);
/* Hands fn a "R <name>" line for each receive pending in r (manager.h):
 * call it after the last ring_read of a ring its client no longer uses. */
void ring_read_pending(mp__mgr_ring *r, void (*fn)(void *ctx, char *lines), void *ctx);

/* Other daemons of this uid (peers.c): the concatenated LIST answers of
 * every other listening shm manager ("" if none), or NULL when one did not
 * answer in time. peers_track: whether one of them tracks name. */
char *peers_list(const char *own_socket);
bool peers_track(const char *lists, const char *name);

#endif
