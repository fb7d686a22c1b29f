/* mp_wait: Python's multiprocessing.connection.wait over connections,
 * queues, processes and plain fds. One poll over every fd, then a
 * non-blocking look at each object: poll alone would report a wake-up
 * record (a NUDGE, src/wire/rx.c) as a message, and miss a queue that was
 * closed after a reader took its end-of-stream record. */
#include "ipc/ipc.h"
#include "ipc/remote.h"
#include "process/process_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mproc/wait.h"

/* The fd to poll for item i (-1: nothing to poll; the look decides). */
static int item_fd(const mp_wait_item *it, int *fd)
{
    switch (it->kind) {
    case MP_WAIT_CONN:
        if (!it->u.conn)
            break;
        if (mp__conn_is_remote(it->u.conn))
            return mp__error(MP_ENOTSUP, "mp_wait: a connection between MPI ranks has no fd "
                                         "to poll; call mp_conn_poll on it with a timeout");
        *fd = mp_conn_fileno(it->u.conn);
        return 0;
    case MP_WAIT_QUEUE:
    case MP_WAIT_SIMPLE_QUEUE:
        if (!it->u.queue)
            break;
        if (it->kind == MP_WAIT_QUEUE && mp__queue_is_remote(it->u.queue))
            return mp__error(MP_ENOTSUP, "mp_wait: a queue shared by MPI ranks has no fd to "
                                         "poll; call mp_queue_get on it with a timeout");
        *fd = mp_queue_fileno(it->u.queue);
        return 0;
    case MP_WAIT_PROCESS:
        return mp__process_wait_fd(it->u.process, fd, "mp_wait");
    case MP_WAIT_FD:
        if (it->u.fd < 0) /* a closed one: look's poll says POLLNVAL */
            return mp__error(MP_EINVAL, "mp_wait: fd %d is not open", it->u.fd);
        *fd = it->u.fd;
        return 0;
    default:
        return mp__error(MP_EINVAL, "mp_wait: unknown kind %d (want an mp_wait_kind)",
                         it->kind);
    }
    return mp__error(MP_EINVAL, "mp_wait: its %s is NULL",
                     it->kind == MP_WAIT_CONN ? "conn"
                     : it->kind == MP_WAIT_QUEUE ? "queue" : "simple_queue");
}

/* The error rc that item i's object gave, said as mp_wait's: "mp_wait:
 * item 2: <the reason>" (the call that found it, named first in the
 * sentence, is dropped). errno and mp_last_errno stay as they were. */
static int item_error(int rc, size_t i)
{
    mp__error_saved s;
    char line[sizeof s.text];
    const char *why;
    mp__error_save(&s);
    why = strstr(s.text, ": ");
    snprintf(line, sizeof line, "mp_wait: item %zu: %.460s", i, why ? why + 2 : s.text);
    memcpy(s.text, line, sizeof line);
    mp__error_restore(&s);
    return rc;
}

/* 1 when item it is ready now, 0 when not, or an error. */
static int look(const mp_wait_item *it, int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n;
    switch (it->kind) {
    case MP_WAIT_CONN:
        return mp_conn_poll(it->u.conn, 0);
    case MP_WAIT_QUEUE:
    case MP_WAIT_SIMPLE_QUEUE:
        return mp__queue_poll((mp__queue *)it->u.queue);
    default:
        if (fd < 0)
            return 1; /* a process already reaped */
        do
            n = poll(&p, 1, 0);
        while (n < 0 && errno == EINTR);
        if (n < 0)
            return mp__errno_error(errno, "mp_wait: poll");
        /* not an event but a closed fd, which poll would call ready for ever
         * (closed before the call, or by another thread while it waits) */
        if (n > 0 && (p.revents & POLLNVAL))
            return mp__error(MP_EINVAL, "mp_wait: fd %d is not open", fd);
        return n > 0;
    }
}

/* Looks at every item; the number ready, or an error. */
static int look_all(mp_wait_item *items, size_t n, const struct pollfd *pf)
{
    int ready = 0;
    for (size_t i = 0; i < n; i++) {
        int r = look(&items[i], pf[i].fd);
        if (r < 0)
            return r == MP_ESYS ? r : item_error(r, i);
        items[i].ready = r > 0;
        ready += r > 0;
    }
    return ready;
}

int mp_wait(mp_wait_item *items, size_t n, double timeout)
{
    double deadline = timeout == 0 ? 0 : mp__deadline(timeout);
    struct pollfd *pf;
    int rc = mp__check_timeout(timeout, "mp_wait");
    if (rc < 0)
        return rc;
    if (!items || n == 0 || n > 65536)
        return mp__error(MP_EINVAL, "mp_wait: want 1..65536 items (got %zu%s)", n,
                         items ? "" : ", NULL");
    if (!(pf = calloc(n, sizeof *pf)))
        return mp__error(MP_ENOMEM, "mp_wait: out of memory");
    for (size_t i = 0; i < n && rc == 0; i++) {
        pf[i].events = POLLIN;
        if ((rc = item_fd(&items[i], &pf[i].fd)) < 0)
            rc = item_error(rc, i);
    }
    while (rc == 0) {
        int ms, got;
        if ((rc = look_all(items, n, pf)) != 0)
            break;
        ms = deadline == 0 ? 0 : mp__poll_ms(deadline);
        if (ms == 0) {
            rc = timeout == 0 ? mp__error(MP_ETIMEDOUT, "mp_wait: nothing is ready")
                              : mp__error(MP_ETIMEDOUT, "mp_wait: nothing was ready within "
                                                        "%g s", timeout);
            break;
        }
        got = poll(pf, (nfds_t)n, ms);
        if (got < 0 && errno != EINTR)
            rc = mp__errno_error(errno, "mp_wait: poll");
        /* got >= 0: look again (a wake-up only means "look") */
    }
    free(pf);
    return rc;
}
