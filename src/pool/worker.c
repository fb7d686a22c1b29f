/* The task registry, and the worker's side: receive a chunk, run each item,
 * send one result pack back. */
#include "pool/pool_internal.h"
#include "wire/wire.h"

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "process/process_internal.h"

#define TASKS_MAX 256

/* Readers take no lock: a worker forked while another thread registers or
 * looks up must not inherit a held mutex. An entry is complete before the
 * count that publishes it is stored (release/acquire). */
static struct {
    char name[MP__TASK_NAME_MAX + 1];
    mp_task_fn fn;
} tasks[TASKS_MAX];
static atomic_int ntasks;
static pthread_mutex_t tasks_mu = PTHREAD_MUTEX_INITIALIZER; /* writers */

int mp_register_task(const char *name, mp_task_fn fn)
{
    size_t len = name ? strlen(name) : 0;
    int rc = 0;
    if (!fn || len == 0 || len > MP__TASK_NAME_MAX)
        return mp__error(MP_EINVAL, "mp_register_task: want a function and a name of 1..%d "
                         "bytes", MP__TASK_NAME_MAX);
    pthread_mutex_lock(&tasks_mu);
    int n = atomic_load_explicit(&ntasks, memory_order_relaxed);
    if (mp__task_lookup(name))
        rc = mp__error(MP_EINVAL, "mp_register_task: '%s' is registered already", name);
    else if (n == TASKS_MAX)
        rc = mp__error(MP_EOVERFLOW, "mp_register_task: more than %d tasks", TASKS_MAX);
    if (!rc) {
        memcpy(tasks[n].name, name, len + 1);
        tasks[n].fn = fn;
        atomic_store_explicit(&ntasks, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&tasks_mu);
    return rc;
}

mp_task_fn mp__task_lookup(const char *name)
{
    int n = atomic_load_explicit(&ntasks, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (strcmp(tasks[i].name, name) == 0)
            return tasks[i].fn;
    return NULL;
}

/* mp_raise inside a task comes back here instead of ending the worker:
 * that item fails with the message and the worker serves on. (Like an
 * exception, it unwinds nothing: what the task allocated is lost.) */
static _Thread_local sigjmp_buf *raise_jmp;
static _Thread_local char raise_text[MP__MESSAGE_MAX];

static void catch_raise(const char *text)
{
    snprintf(raise_text, sizeof raise_text, "%s", text);
    mp__raise_hook = NULL;
    siglongjmp(*raise_jmp, 1);
}

/* Calls fn(in, out): its return, or 1 with raise_text set after mp_raise. */
static int call_task(mp_task_fn fn, const mp_msg *in, mp_msg *out, bool *raised)
{
    sigjmp_buf jb;
    int rc;
    *raised = false;
    if (sigsetjmp(jb, 0)) {
        *raised = true;
        return MP_ECHILD;
    }
    raise_jmp = &jb;
    mp__raise_hook = catch_raise;
    rc = fn(in, out);
    mp__raise_hook = NULL;
    return rc;
}

/* Runs one item; records its outcome in the result pack. */
static int run_item(const mp__pack_view *v, uint32_t i, mp_task_fn fn, mp__packer *res)
{
    mp_msg *in = NULL, *out = NULL;
    char err[MP__MESSAGE_MAX + 128];
    const void *pl;
    size_t len;
    int rc = mp__pack_item(v, i, &in);
    if (!rc)
        rc = mp_msg_create(&out);
    if (rc) {
        snprintf(err, sizeof err, "task '%s': worker could not build item %u: %s", v->name,
                 i, mp_last_error());
        rc = mp__packer_add(res, NULL, 0, NULL, rc, err);
        goto out;
    }
    mp__error_clear();
    bool raised;
    rc = call_task(fn, in, out, &raised);
    if (raised) {
        snprintf(err, sizeof err, "task '%s' raised: %s", v->name, raise_text);
        rc = mp__packer_add(res, NULL, 0, NULL, MP_ECHILD, err);
        goto out;
    }
    if (rc) {
        int code = rc < 0 && rc >= MP_EOVERFLOW ? rc : MP_ECHILD;
        snprintf(err, sizeof err, "task '%s' returned %d%s%s", v->name, rc,
                 mp_last_error()[0] ? ": " : "", mp_last_error());
        rc = mp__packer_add(res, NULL, 0, NULL, code, err);
        goto out;
    }
    /* A result that cannot travel (a tensor that cannot be shared) would
     * fail the send of the whole chunk: fail this item, with the cause. */
    if ((rc = mp__wire_check_sendable(out)) < 0) {
        snprintf(err, sizeof err, "task '%s': its result cannot be sent to the parent: %s",
                 v->name, mp_last_error());
        rc = mp__packer_add(res, NULL, 0, NULL, rc, err);
        goto out;
    }
    pl = mp_msg_payload(out, &len);
    rc = mp__packer_add(res, pl, len, out, 0, NULL);
out:
    mp_msg_destroy(in);
    mp_msg_destroy(out);
    return rc;
}

/* The reply could not be sent (its items passed the check, so the cause is
 * the reply as a whole: too many fds, no memory): every item of the chunk
 * fails with the reason, and the worker serves on. */
static int send_failure(mp_conn *conn, uint32_t count, int cause)
{
    char err[MP__MESSAGE_MAX + 128];
    mp__packer res;
    mp_msg *reply = NULL;
    int rc;
    snprintf(err, sizeof err, "pool worker: the chunk's results could not be sent to the "
             "parent: %s", mp_last_error());
    rc = mp__packer_init(&res, MP__PACK_RESULT, NULL, count);
    for (uint32_t i = 0; !rc && i < count; i++)
        rc = mp__packer_add(&res, NULL, 0, NULL, cause, err);
    if (rc) {
        mp__packer_drop(&res);
        return rc;
    }
    rc = mp__packer_finish(&res, &reply);
    if (!rc)
        rc = mp_conn_send(conn, reply, -1);
    mp_msg_destroy(reply);
    return rc;
}

/* Handles one frame; 1 when told to exit. */
static int serve(mp_conn *conn, mp_msg *frame)
{
    mp__pack_view v;
    mp__packer res;
    mp_msg *reply = NULL;
    mp_task_fn fn;
    uint32_t count;
    int rc = mp__pack_open(frame, &v);
    if (rc)
        return rc;
    if (v.magic == MP__PACK_EXIT) {
        mp__pack_close(&v);
        return 1;
    }
    fn = v.magic == MP__PACK_TASK ? mp__task_lookup(v.name) : NULL;
    count = v.count;
    rc = mp__packer_init(&res, MP__PACK_RESULT, NULL, v.count);
    for (uint32_t i = 0; !rc && i < v.count; i++) {
        if (fn) {
            rc = run_item(&v, i, fn, &res);
        } else {
            char err[128];
            snprintf(err, sizeof err, "task '%s' is not registered in the worker", v.name);
            rc = mp__packer_add(&res, NULL, 0, NULL, MP_ENOENT, err);
        }
    }
    mp__pack_close(&v);
    if (rc) {
        mp__packer_drop(&res);
        return rc;
    }
    rc = mp__packer_finish(&res, &reply);
    if (!rc)
        rc = mp_conn_send(conn, reply, -1);
    mp_msg_destroy(reply);
    if (rc < 0 && rc != MP_ECLOSED)
        rc = send_failure(conn, count, rc);
    return rc;
}

int mp__pool_worker_main(mp_conn *conn)
{
    for (;;) {
        mp_msg *frame;
        int rc = mp_conn_recv(conn, &frame, -1);
        if (rc == MP_ECLOSED)
            return 0; /* the parent went away */
        if (rc)
            return 3;
        rc = serve(conn, frame);
        mp_msg_destroy(frame);
        if (rc == 1)
            return 0;
        if (rc)
            return 3;
    }
}
