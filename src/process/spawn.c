/* mp_spawn and its context: nprocs children of one entry, joined all at once
 * (pidfds and status channels in one poll), first failure wins. */
#include "process/process_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mp_spawn_context {
    int nprocs;
    mp_process **procs;
    double grace;        /* to finish on their own after a failure, before SIGTERM */
    double kill_timeout; /* between SIGTERM and SIGKILL */
    int failed; /* rank of the first failure, or -1 */
    mp_child_error err;
};

void mp_spawn_options_init(mp_spawn_options *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->size = sizeof *opts;
    opts->nprocs = 1;
    opts->join = true;
    opts->grace_period = 0;
    opts->kill_timeout = 1.0;
}

static int fail_result(const mp_spawn_context *c)
{
    const mp_child_error *e = &c->err;
    char cause[64];
    if (e->signal)
        snprintf(cause, sizeof cause, "was killed by signal %s", e->signal_name);
    else
        snprintf(cause, sizeof cause, "exited with code %d", e->exitcode);
    return mp__error(MP_ECHILD, "mp_spawn: process %d (pid %d) %s%s%s", e->rank, (int)e->pid, cause,
                     e->message[0] ? ": " : "", e->message);
}

/* Terminates the others, reaps everyone, and records rank's failure. */
static int fail(mp_spawn_context *c, int rank)
{
    c->failed = rank;
    mp__process_stop_all(c->procs, c->nprocs, rank, c->grace, c->kill_timeout);
    c->err.size = sizeof c->err;
    mp_process_error(c->procs[rank], &c->err);
    return fail_result(c);
}

/* One pass over a poll result; returns the failing rank or -1. */
static int handle_events(mp_spawn_context *c, const struct pollfd *pf, const int *who, int n)
{
    int failed = -1;
    for (int k = 0; k < n; k++) {
        mp_process *p = c->procs[who[k]];
        int code = 0;
        if (!pf[k].revents)
            continue;
        if (pf[k].fd == mp__process_chan(p)) {
            if (mp__process_poll_status(p) && failed < 0)
                failed = who[k];
        } else if (mp__process_reap(p, true) == 1) {
            mp_process_exitcode(p, &code);
            if (code != 0 && failed < 0)
                failed = who[k];
        }
    }
    return failed;
}

int mp_spawn_context_join(mp_spawn_context *c, double timeout)
{
    double deadline = mp__deadline(timeout);
    int rc = mp__check_timeout(timeout, "mp_spawn_context_join");
    if (rc < 0)
        return rc;
    if (!c)
        return mp__error(MP_EINVAL, "mp_spawn_context_join: context is NULL");
    if (c->failed >= 0)
        return fail_result(c);
    for (;;) {
        struct pollfd pf[2 * c->nprocs];
        int who[2 * c->nprocs];
        int n = 0, ready, failed;
        for (int i = 0; i < c->nprocs; i++) {
            mp_process *p = c->procs[i];
            if (mp__process_reaped(p))
                continue;
            pf[n] = (struct pollfd){.fd = mp__process_pidfd(p), .events = POLLIN};
            who[n++] = i;
            if (mp__process_chan(p) >= 0) {
                pf[n] = (struct pollfd){.fd = mp__process_chan(p), .events = POLLIN};
                who[n++] = i;
            }
        }
        if (n == 0)
            return 0;
        ready = poll(pf, (nfds_t)n, mp__poll_ms(deadline));
        if (ready < 0 && errno != EINTR)
            return mp__errno_error(errno, "mp_spawn_context_join: poll");
        if (ready == 0)
            return mp__error(MP_ETIMEDOUT,
                             "mp_spawn_context_join: children still running "
                             "after %g s",
                             timeout);
        if (ready > 0 && (failed = handle_events(c, pf, who, n)) >= 0)
            return fail(c, failed);
    }
}

int mp_spawn_context_error(const mp_spawn_context *c, mp_child_error *out)
{
    if (!c || !out)
        return mp__error(MP_EINVAL, "mp_spawn_context_error: %s is NULL", c ? "out" : "context");
    if (c->failed < 0)
        return mp__error(MP_ESTATE, "mp_spawn_context_error: no child has failed");
    return mp__struct_out(out, &c->err, sizeof c->err, "mp_spawn_context_error",
                          "mp_child_error");
}

int mp_spawn_context_nprocs(const mp_spawn_context *c)
{
    return c ? c->nprocs : 0;
}

pid_t mp_spawn_context_pid(const mp_spawn_context *c, int rank)
{
    if (!c || rank < 0 || rank >= c->nprocs)
        return 0;
    return mp_process_pid(c->procs[rank]);
}

/* grace_period and kill_timeout: seconds >= 0, +inf meaning forever. */
static int check_seconds(double seconds, const char *call, const char *what)
{
    if (!(seconds >= 0))
        return mp__error(MP_EINVAL, "%s: %s is %g; want seconds >= 0", call, what, seconds);
    return 0;
}

/* The two setters: the field kill picks = seconds, checked; sentences name call. */
static int set_seconds(mp_spawn_context *c, double seconds, bool kill, const char *call)
{
    int rc = check_seconds(seconds, call, kill ? "kill_timeout" : "grace_period");
    if (rc < 0)
        return rc;
    if (!c)
        return mp__error(MP_EINVAL, "%s: context is NULL", call);
    *(kill ? &c->kill_timeout : &c->grace) = seconds;
    return 0;
}

int mp_spawn_context_set_grace_period(mp_spawn_context *c, double seconds)
{
    return set_seconds(c, seconds, false, "mp_spawn_context_set_grace_period");
}

int mp_spawn_context_set_kill_timeout(mp_spawn_context *c, double seconds)
{
    return set_seconds(c, seconds, true, "mp_spawn_context_set_kill_timeout");
}

void mp_spawn_context_destroy(mp_spawn_context *c)
{
    if (!c)
        return;
    /* Nobody failed: no grace to finish, SIGTERM at once. */
    mp__process_stop_all(c->procs, c->nprocs, -1, 0, c->kill_timeout);
    for (int i = 0; i < c->nprocs; i++)
        mp_process_destroy(c->procs[i]);
    free(c->procs);
    free(c);
}

static int check_options(const char *entry, const mp_spawn_options *o, mp_spawn_context **out)
{
    mp__method m = MP__FORK; /* set by mp__method_parse or the default */
    int rc = mp__entry_check(entry, "entry", "mp_spawn");
    if (rc < 0)
        return rc;
    if (o->nprocs < 1 || o->nprocs > 4096)
        return mp__error(MP_EINVAL, "mp_spawn: nprocs must be 1..4096 (got %d)", o->nprocs);
    if ((rc = check_seconds(o->grace_period, "mp_spawn", "grace_period")) < 0 ||
        (rc = check_seconds(o->kill_timeout, "mp_spawn", "kill_timeout")) < 0)
        return rc;
    if (!o->join && !out)
        return mp__error(MP_EINVAL, "mp_spawn: without join, ctx must not be NULL");
    if ((rc = mp__sigchld_check("mp_spawn")) < 0)
        return rc;
    if (!o->start_method)
        m = mp__method_default();
    else if (mp__method_parse(o->start_method, &m, "mp_spawn") < 0)
        return MP_EINVAL;
    return m == MP__FORK ? 0 : mp__setup_check("mp_spawn");
}

/* Creates and starts every child; on failure none is left. */
static int start_all(mp_spawn_context *c, const char *entry, mp_msg *args,
                     const mp_spawn_options *o)
{
    mp_process_options po;
    int rc = 0, i;
    mp_process_options_init(&po);
    po.daemon = o->daemon;
    po.start_method = o->start_method;
    for (i = 0; i < c->nprocs && rc == 0; i++) {
        char name[64];
        snprintf(name, sizeof name, "%.40s-%d", entry, i);
        po.name = name;
        rc = mp__process_create(entry, args, &po, i, &c->procs[i]);
        if (rc == 0)
            rc = mp_process_start(c->procs[i]);
    }
    return rc;
}

/* Destroys c (stopping and reaping its children) and returns rc; a failure
 * keeps its sentence, which the stop path could otherwise overwrite. */
static int destroy_keeping_error(mp_spawn_context *c, int rc)
{
    char why[512];
    if (rc < 0)
        snprintf(why, sizeof why, "%s", mp_last_error());
    mp_spawn_context_destroy(c);
    return rc < 0 ? mp__error(rc, "%s", why) : rc;
}

int mp_spawn_ex(const char *entry, mp_msg *args, const mp_spawn_options *opts,
                mp_spawn_context **out)
{
    mp_spawn_context *c;
    mp_spawn_options copy, *o = &copy;
    int rc;
    if (!opts)
        return mp__error(MP_EINVAL, "mp_spawn: options must not be NULL");
    rc = mp__struct_in(&copy, sizeof copy, opts, "mp_spawn", "mp_spawn_options");
    if (!rc)
        rc = check_options(entry, o, out);
    if (rc < 0)
        return rc;
    if (out)
        *out = NULL;
    c = calloc(1, sizeof *c);
    if (!c || !(c->procs = calloc((size_t)o->nprocs, sizeof *c->procs))) {
        free(c);
        return mp__error(MP_ENOMEM, "mp_spawn: out of memory");
    }
    c->nprocs = o->nprocs;
    c->grace = o->grace_period;
    c->kill_timeout = o->kill_timeout;
    c->failed = -1;
    rc = start_all(c, entry, args, o);
    if (rc < 0) {
        /* Stop the started ones; keep the start error as the sentence. */
        for (int i = 0; i < c->nprocs; i++)
            if (c->procs[i] && mp_process_pid(c->procs[i]) == 0) {
                mp_process_destroy(c->procs[i]);
                c->procs[i] = NULL;
            }
        for (c->nprocs = 0; c->nprocs < o->nprocs && c->procs[c->nprocs]; c->nprocs++)
            ;
        return destroy_keeping_error(c, rc);
    }
    if (!o->join) {
        *out = c;
        return 0;
    }
    rc = mp_spawn_context_join(c, -1);
    if (rc == MP_ECHILD && out) {
        *out = c;
        return rc;
    }
    return destroy_keeping_error(c, rc);
}

int mp_spawn(const char *entry, mp_msg *args, int nprocs, bool join, bool daemon,
             const char *start_method, mp_spawn_context **ctx)
{
    mp_spawn_options o;
    mp_spawn_options_init(&o);
    o.nprocs = nprocs;
    o.join = join;
    o.daemon = daemon;
    o.start_method = start_method;
    return mp_spawn_ex(entry, args, &o, ctx);
}
