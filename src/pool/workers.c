/* Worker processes: started with mp_process under the pool's start method,
 * each with one duplex connection to the parent; the entry they run; and
 * how their end is described. */
#include "ipc/ipc.h"
#include "pool/pool_internal.h"
#include "process/process_internal.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mproc/process.h"
#include "mproc/queue.h"


/* The worker's argument: a pack named after the initializer whose one item
 * is the initializer's argument message, then the connection as the last
 * attachment. */
static int worker_args(mp_pool *p, mp_conn *conn, mp_msg **out)
{
    mp__packer pk;
    mp_msg *m = NULL;
    const void *pl = NULL;
    size_t len = 0;
    int rc = mp__packer_init(&pk, MP__PACK_TASK, p->initializer, 1);
    if (!rc) {
        if (p->initargs)
            pl = mp_msg_payload(p->initargs, &len);
        rc = mp__packer_add(&pk, pl, len, p->initargs, 0, NULL);
    }
    if (!rc)
        rc = mp__packer_finish(&pk, &m);
    else
        mp__packer_drop(&pk);
    if (!rc)
        rc = mp_msg_add_conn(m, "pool", conn);
    if (rc) {
        mp_msg_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

int mp__worker_start(mp_pool *p, int slot)
{
    worker *w = &p->w[slot];
    mp_process_options o;
    mp_conn *mine = NULL, *theirs = NULL;
    mp_msg *args = NULL;
    mp_process *proc = NULL;
    int rc = mp_pipe(true, &mine, &theirs);
    if (!rc)
        rc = worker_args(p, theirs, &args);
    mp_conn_release(theirs); /* the message holds it until the start sent it */
    if (rc)
        goto out;
    mp_process_options_init(&o);
    o.start_method = p->start_method;
    o.name = "mp-pool-worker";
    /* The rank is the slot: the initializer learns its worker's index, and a
     * replacement gets the index of the worker it replaces. */
    rc = mp__process_create("mp__pool_worker", args, &o, slot, &proc);
    if (!rc)
        rc = mp_process_start(proc);
    mp_msg_destroy(args);
    if (rc)
        goto out;
    w->proc = proc;
    w->conn = mine;
    w->sock = mp__conn_fd(mine);
    w->pidfd = mp_process_sentinel(proc); /* owned by proc */
    w->cur = w->last = NULL;
    w->inflight = 0;
    w->depth = 1; /* until its chunks prove short */
    w->t_done = 0;
    w->svc = 0;
    w->blocked = false;
    w->chunks = 0;
    w->ready = false;
    w->exiting = false;
    return 0;
out:
    mp_process_destroy(proc);
    mp_conn_release(mine);
    return rc;
}

void mp__worker_reap(mp_pool *p, int slot, char *how, size_t cap)
{
    worker *w = &p->w[slot];
    mp_child_error e = {.size = sizeof e};
    pid_t pid = mp_process_pid(w->proc);
    mp_process_join(w->proc, -1);
    if (mp_process_error(w->proc, &e) != 0)
        snprintf(how, cap, "(pid %d) ended", (int)pid);
    else if (e.signal)
        snprintf(how, cap, "(pid %d) was killed by signal %d (%s)", (int)pid, e.signal,
                 e.signal_name);
    else if (e.message[0])
        snprintf(how, cap, "(pid %d) exited with status %d: %s", (int)pid, e.exitcode,
                 e.message);
    else
        snprintf(how, cap, "(pid %d) exited with status %d", (int)pid, e.exitcode);
    mp_process_destroy(w->proc); /* closes the sentinel */
    mp_conn_release(w->conn);
    w->proc = NULL;
    w->conn = NULL;
    w->sock = w->pidfd = -1;
}

int mp__worker_send_exit(worker *w)
{
    mp__packer pk;
    mp_msg *m = NULL;
    int rc = mp__packer_init(&pk, MP__PACK_EXIT, NULL, 0);
    if (!rc)
        rc = mp__packer_finish(&pk, &m);
    if (!rc)
        rc = mp_conn_send(w->conn, m, -1);
    mp_msg_destroy(m);
    w->exiting = true;
    return rc;
}

/* ---- the worker's side ------------------------------------------------------- */

/* Runs the initializer named in the argument pack, if any. */
static int run_initializer(int rank, mp_msg *args)
{
    mp__pack_view v;
    mp_msg *init = NULL;
    mp_entry_fn fn;
    int rc = mp__pack_open(args, &v);
    if (rc || v.count != 1)
        mp_raise("pool worker: malformed start arguments");
    if (!v.name[0]) {
        mp__pack_close(&v);
        return 0;
    }
    fn = mp__entry_lookup(v.name);
    if (!fn)
        mp_raise("pool worker: no entry called '%s' for the initializer", v.name);
    rc = mp__pack_item(&v, 0, &init);
    mp__pack_close(&v);
    if (rc)
        mp_raise("pool worker: initializer arguments: %s", mp_last_error());
    rc = fn(rank, init);
    mp_msg_destroy(init);
    return rc;
}

MP_ENTRY(mp__pool_worker)
{
    size_t n = mp_msg_count(args);
    mp_conn *conn = NULL;
    mp__packer pk;
    mp_msg *ready = NULL;
    int rc;
    if (n == 0 || mp_msg_get_conn(args, n - 1, &conn) != 0)
        mp_raise("pool worker: no connection in the start arguments");
    rc = run_initializer(rank, args);
    if (rc)
        mp_raise("pool worker: the initializer returned %d", rc);
    /* "ready": an empty result pack */
    rc = mp__packer_init(&pk, MP__PACK_RESULT, NULL, 0);
    if (!rc)
        rc = mp__packer_finish(&pk, &ready);
    if (!rc)
        rc = mp_conn_send(conn, ready, -1);
    mp_msg_destroy(ready);
    if (!rc)
        rc = mp__pool_worker_main(conn);
    mp_conn_release(conn);
    return rc;
}
