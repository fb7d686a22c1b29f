/* The daemon's event loop (loop.c). */
#ifndef MPROC_SHM_DAEMON_LOOP_H
#define MPROC_SHM_DAEMON_LOOP_H

#include <stdbool.h>

typedef struct loop_config {
    double grace;      /* seconds without clients before reclaiming and exiting */
    bool persistent;   /* reclaim after the grace period, but keep running */
} loop_config;

/* Listens, re-adopts /dev/shm, writes 'R' on ready_fd (if >= 0) once clients
 * can connect, and serves until the grace period ends or STOP / SIGTERM.
 * Returns the process exit status. */
int loop_run(const loop_config *cfg, int ready_fd);

#endif
