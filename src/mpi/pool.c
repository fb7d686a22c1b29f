/* A pool over ranks, in the mpi4py.futures shape: rank 0 submits, every
 * other rank serves. Tasks are the MP_TASK functions of mproc's pool. Rank
 * 0 holds an mp_mpi_conn to each worker rank and hands a task to a worker
 * only when it is idle, so it always knows which task a worker runs. No
 * thread: work moves whenever rank 0 is inside a pool call. */
#include "mpi/pool_mpi.h"
#include "pool/pool_internal.h"
#include "process/process_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TASK_NAME_MAX 63

/* Task messages: payload = id, name length, name, then the caller's
 * payload; replies: id, rc, error length, error, then the task's payload.
 * Tensors ride as the message's attachments, in order, names kept. */
static int copy_tensors(const mp_msg *from, mp_msg *to, const char *fn)
{
    for (size_t i = 0; i < mp_msg_count(from); i++) {
        mp_tensor *t = NULL;
        int rc = mp_msg_get_tensor(from, i, &t);
        if (rc)
            return mp__error(MP_ENOTSUP, "%s: attachment %zu is not a tensor; pool tasks "
                                         "take bytes and tensors", fn, i);
        rc = mp_msg_add_tensor(to, mp_msg_name(from, i), t);
        mp_tensor_release(t);
        if (rc)
            return rc;
    }
    return 0;
}

static int wrap(const mp_msg *m, const void *head, size_t hlen, mp_msg **out, const char *fn)
{
    size_t plen = 0;
    const void *pl = m ? mp_msg_payload(m, &plen) : NULL;
    char *buf = malloc(hlen + plen + 1);
    mp_msg *w = NULL;
    int rc = buf ? mp_msg_create(&w) : mp__error(MP_ENOMEM, "%s: out of memory", fn);
    if (rc == 0) {
        memcpy(buf, head, hlen);
        if (plen)
            memcpy(buf + hlen, pl, plen);
        rc = mp_msg_set_payload(w, buf, hlen + plen);
    }
    if (rc == 0 && m)
        rc = copy_tensors(m, w, fn);
    free(buf);
    if (rc) {
        mp_msg_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* Splits a wrapped message: its head bytes, and a new message with the
 * rest of the payload and the same tensors. */
static int unwrap(const mp_msg *w, size_t hlen, mp_msg **out)
{
    size_t len = 0;
    const char *p = mp_msg_payload(w, &len);
    mp_msg *m = NULL;
    int rc = mp_msg_create(&m);
    if (rc == 0)
        rc = mp_msg_set_payload(m, p + hlen, len - hlen);
    if (rc == 0)
        rc = copy_tensors(w, m, "mp_mpi_pool");
    if (rc) {
        mp_msg_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ---- the worker side -------------------------------------------------------- */

int mp__mpi_run_caught(int (*call)(void *), void *ctx, char *err, size_t cap)
{
    bool raised;
    int rc = mp__catch_raise(call, ctx, err, cap, &raised);
    if (raised)
        return rc;
    if (rc > 0 || rc < -17)
        rc = MP_ECHILD;
    if (rc && !err[0])
        snprintf(err, cap, "task returned %d (%s)%s%s", rc, mp_err_name(rc),
                 mp_last_error()[0] ? ": " : "", mp_last_error());
    return rc;
}

/* Runs the task called name (a map_array chunk when it starts with
 * MP__MPI_ARRAY_KIND or MP__MPI_ITEMS_KIND). */
static int run_named(const char *name, const mp_msg *in, mp_msg *out, char *err, size_t cap)
{
    if (name[0] == MP__MPI_ARRAY_KIND || name[0] == MP__MPI_ITEMS_KIND)
        return mp__mpi_array_run(name, in, out, err, cap);
    mp__task_call t = {mp__task_lookup(name), in, out};
    if (!t.fn) {
        snprintf(err, cap, "no task '%s' is registered (MP_TASK)", name);
        return MP_ENOENT;
    }
    return mp__mpi_run_caught(mp__task_call_run, &t, err, cap);
}

/* One task: 0 after replying, 1 on the shutdown message, or an error. */
static int serve_one(mp_mpi_conn *c)
{
    mp_msg *w = NULL, *in = NULL, *out = NULL, *reply = NULL;
    char head[8 + 1 + TASK_NAME_MAX + 1] = {0}, name[TASK_NAME_MAX + 1] = {0};
    char rhead[8 + 4 + 2 + MP__MPI_TEXT_MAX], err[MP__MPI_TEXT_MAX] = "";
    size_t len = 0;
    int rc = mp__mpi_conn_recv(c, &w, -1, "mp_mpi_pool_create"), trc;
    if (rc)
        return rc;
    const char *p = mp_msg_payload(w, &len);
    if (len < 9 || (unsigned char)p[8] > TASK_NAME_MAX || len < 9u + (unsigned char)p[8]) {
        mp_msg_destroy(w);
        return mp__error(MP_EPROTO, "mp_mpi_pool_create: malformed task message");
    }
    memcpy(head, p, 9 + (unsigned char)p[8]);
    memcpy(name, p + 9, (unsigned char)p[8]);
    if (name[0] == 0) { /* shutdown */
        mp_msg_destroy(w);
        return 1;
    }
    rc = unwrap(w, 9 + (unsigned char)p[8], &in);
    if (rc == 0)
        rc = mp_msg_create(&out);
    trc = rc ? rc : run_named(name, in, out, err, sizeof err);
    uint16_t elen = (uint16_t)strlen(err);
    int32_t trc32 = trc;
    memcpy(rhead, head, 8);
    memcpy(rhead + 8, &trc32, 4);
    memcpy(rhead + 12, &elen, 2);
    memcpy(rhead + 14, err, elen);
    rc = wrap(trc ? NULL : out, rhead, 14u + elen, &reply, "mp_mpi_pool");
    if (rc == 0)
        rc = mp__mpi_conn_send(c, reply, -1, "mp_mpi_pool_create");
    mp_msg_destroy(w), mp_msg_destroy(in), mp_msg_destroy(out), mp_msg_destroy(reply);
    return rc;
}

static int serve(void)
{
    mp_mpi_conn *c = NULL;
    int rc = mp__mpi_pipe(0, &c, "mp_mpi_pool_create");
    while (rc == 0)
        rc = serve_one(c);
    mp__mpi_conn_destroy(c);
    return rc == 1 ? 0 : rc;
}

int mp__mpi_pool_create(mp_mpi_pool **out)
{
    int rc = mp__mpi_need("mp_mpi_pool_create");
    if (rc || (rc = mp__mpi_own("mp_mpi_pool_create")) != 0)
        return rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_mpi_pool_create: out is NULL");
    *out = NULL;
    if (mp__mpi.rank != 0)
        return serve();
    if (mp__mpi.size < 2)
        return mp__error(MP_EINVAL, "mp_mpi_pool_create: a pool over ranks needs at least 2 "
                                    "ranks (rank 0 submits, the others serve)");
    mp_mpi_pool *p = calloc(1, sizeof *p);
    if (!p || !(p->conn = calloc((size_t)mp__mpi.size, sizeof *p->conn)) ||
        !(p->busy = calloc((size_t)mp__mpi.size, sizeof *p->busy))) {
        if (p)
            free(p->conn);
        free(p);
        return mp__error(MP_ENOMEM, "mp_mpi_pool_create: out of memory");
    }
    p->nworkers = mp__mpi.size - 1;
    p->next_id = 1;
    for (int r = 1; r <= p->nworkers && rc == 0; r++)
        rc = mp__mpi_pipe(r, &p->conn[r - 1], "mp_mpi_pool_create");
    if (rc) {
        for (int r = 0; r < p->nworkers; r++)
            mp__mpi_conn_destroy(p->conn[r]);
        free(p->conn), free(p->busy), free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* ---- rank 0: moving work -------------------------------------------------- */

void mp__mpi_result_release(mp_mpi_result *r)
{
    if (r && --r->refs == 0) {
        mp__mpi_group_free(r);
        mp_msg_destroy(r->in);
        mp_msg_destroy(r->out);
        free(r);
    }
}

static void finish(mp_mpi_result *r, int rc, const char *err)
{
    r->ready = true;
    r->rc = rc;
    snprintf(r->error, sizeof r->error, "%s", err ? err : "");
    mp_msg_destroy(r->in);
    r->in = NULL;
    if (r->it)
        mp__mpi_imap_done(r->it, r->index);
    mp__mpi_result_release(r); /* the pool's reference */
}

static int take_reply(mp_mpi_pool *p, int w)
{
    mp_msg *m = NULL;
    size_t len = 0;
    int32_t trc;
    uint16_t elen;
    int rc = mp__mpi_conn_recv(p->conn[w], &m, 0, "mp_mpi_pool");
    if (rc == MP_ETIMEDOUT)
        return 0;
    if (rc)
        return rc;
    const char *pl = mp_msg_payload(m, &len);
    mp_mpi_result *r = p->busy[w];
    if (len < 14 || (memcpy(&elen, pl + 12, 2), len < 14u + elen)) {
        mp_msg_destroy(m);
        return mp__error(MP_EPROTO, "mp_mpi_pool: malformed reply from rank %d", w + 1);
    }
    memcpy(&trc, pl + 8, 4);
    char err[MP__MPI_TEXT_MAX + 64];
    snprintf(err, sizeof err, "task on rank %d: %.*s", w + 1, (int)elen, pl + 14);
    p->busy[w] = NULL;
    if (trc == 0 && (rc = unwrap(m, 14u + elen, &r->out)) != 0)
        trc = rc, snprintf(err, sizeof err, "%s", mp_last_error());
    finish(r, trc, trc ? err : NULL);
    mp_msg_destroy(m);
    return 0;
}

/* One pass: replies taken, idle workers fed. */
static int progress(mp_mpi_pool *p)
{
    int rc = 0;
    for (int w = 0; w < p->nworkers && rc == 0; w++) {
        if (p->busy[w])
            rc = take_reply(p, w);
        if (rc == 0 && !p->busy[w] && p->queue) {
            mp_mpi_result *r = p->queue;
            p->queue = r->next;
            if (!p->queue)
                p->tail = NULL;
            p->busy[w] = r;
            rc = mp__mpi_conn_send(p->conn[w], r->in, -1, "mp_mpi_pool");
        }
    }
    if (rc == 0)
        rc = mp__mpi_check("mp_mpi_pool");
    return rc;
}

int mp__mpi_pool_submit(mp_mpi_pool *p, const char *name, const mp_msg *in,
                        mp_mpi_result **res, const char *fn)
{
    char head[8 + 1 + TASK_NAME_MAX];
    size_t nlen = strlen(name);
    mp_mpi_result *r;
    int rc;
    if (nlen == 0 || nlen > TASK_NAME_MAX)
        return mp__error(MP_EINVAL, "%s: a task name of 1..%d bytes is required", fn,
                         TASK_NAME_MAX);
    if (p->closed)
        return mp__error(MP_ESTATE, "%s: the pool is closed or terminated", fn);
    if (!(r = calloc(1, sizeof *r)))
        return mp__error(MP_ENOMEM, "%s: out of memory", fn);
    r->id = p->next_id++;
    r->pool = p;
    memcpy(head, &r->id, 8);
    head[8] = (char)nlen;
    memcpy(head + 9, name, nlen);
    if ((rc = wrap(in, head, 9 + nlen, &r->in, fn)) != 0) {
        free(r);
        return rc;
    }
    r->refs = 2;
    if (p->tail)
        p->tail->next = r;
    else
        p->queue = r;
    p->tail = r;
    *res = r;
    return progress(p) == MP_ECHILD ? MP_ECHILD : 0;
}

int mp__mpi_pool_apply_async(mp_mpi_pool *p, const char *task, const mp_msg *in,
                             mp_mpi_result **res, const char *fn)
{
    if (!p || !task || !res)
        return mp__error(MP_EINVAL, "%s: p, task and res are required", fn);
    if (!mp__task_lookup(task))
        return mp__error(MP_ENOENT, "%s: no task '%s' is registered (MP_TASK)%s", fn, task,
                         mp__array_task_lookup(task) ? "; it is an array task: use "
                                                       "mp_pool_map_array" : "");
    return mp__mpi_pool_submit(p, task, in, res, fn);
}

int mp__mpi_pool_wait(mp_mpi_pool *p, bool (*ready)(void *), void *arg, double timeout,
                      const char *fn, const char *what)
{
    double deadline = mp__deadline(timeout);
    unsigned spins = 0;
    while (!ready(arg)) {
        int rc = progress(p);
        if (rc)
            return rc;
        if (ready(arg))
            break;
        if (timeout == 0)
            return mp__error(MP_ETIMEDOUT, "%s: %s", fn, what);
        if (deadline >= 0 && mp__now() >= deadline)
            return mp__error(MP_ETIMEDOUT, "%s: timed out", fn);
        mp__mpi_backoff(&spins);
    }
    return 0;
}

static bool result_is_ready(void *r)
{
    return mp__mpi_result_ready(r);
}

int mp__mpi_result_wait(mp_mpi_result *r, double timeout, const char *fn)
{
    if (!r)
        return mp__error(MP_EINVAL, "%s: r is NULL", fn);
    /* Asked first: a result that outlived its pool is ready (the pool's
     * destroy finished every task) and never touches it. */
    if (mp__mpi_result_ready(r))
        return 0;
    return mp__mpi_pool_wait(r->pool, result_is_ready, r, timeout, fn, "not ready");
}

static bool idle(mp_mpi_pool *p)
{
    bool idle = !p->queue;
    for (int w = 0; w < p->nworkers; w++)
        idle = idle && !p->busy[w];
    return idle;
}

int mp__mpi_pool_drain(mp_mpi_pool *p)
{
    unsigned spins = 0;
    while (!idle(p)) {
        int rc = progress(p);
        if (rc)
            return rc;
        mp__mpi_backoff(&spins);
    }
    return 0;
}

void mp__mpi_pool_drop_queued(mp_mpi_pool *p, const char *why)
{
    while (p->queue) {
        mp_mpi_result *r = p->queue;
        p->queue = r->next;
        finish(r, MP_ECLOSED, why);
    }
    p->tail = NULL;
}

void mp__mpi_pool_destroy(mp_mpi_pool *p)
{
    mp_msg *bye = NULL;
    char head[9] = {0};
    if (!p)
        return;
    /* Queued and running work finishes first (a failed job: it is over). */
    while (!mp__mpi.failed && !idle(p) && progress(p) == 0)
        ;
    if (!mp__mpi.failed && mp_msg_create(&bye) == 0 && mp_msg_set_payload(bye, head, 9) == 0)
        for (int w = 0; w < p->nworkers; w++)
            mp__mpi_conn_send(p->conn[w], bye, -1, "mp_pool_destroy");
    mp_msg_destroy(bye);
    for (int w = 0; w < p->nworkers; w++) {
        if (p->busy[w])
            finish(p->busy[w], MP_ECLOSED, "the pool was destroyed");
        mp__mpi_conn_destroy(p->conn[w]);
    }
    mp__mpi_pool_drop_queued(p, "the pool was destroyed");
    mp_tensor_release(p->cache_in), mp_tensor_release(p->cache_out);
    free(p->conn), free(p->busy), free(p);
}
