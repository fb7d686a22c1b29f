/* The task registry, and the worker's side: receive a chunk, run each item,
 * send one result pack back. */
#include "pool/pool_internal.h"

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "process/process_internal.h"
#include "wire/objects.h"

/* Tasks live in the process layer's registry, beside the entries. */
int mp_register_task(const char *name, mp_task_fn fn)
{
    return mp__registry_add(MP__REG_TASK, name, (void (*)(void))fn, "mp_register_task");
}

void mp_register_task_at_load(const char *name, mp_task_fn fn)
{
    mp__registry_add_at_load(MP__REG_TASK, name, (void (*)(void))fn);
}

mp_task_fn mp__task_lookup(const char *name)
{
    return (mp_task_fn)mp__registry_find(MP__REG_TASK, name);
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
        int code = rc < 0 && rc >= MP_ERROR_LAST ? rc : MP_ECHILD;
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
