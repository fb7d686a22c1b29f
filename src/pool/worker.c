/* The task registry, and the worker's side: receive a chunk, run each item,
 * send one result pack back. */
#include "pool/pool_internal.h"

#include <stdio.h>
#include <string.h>

#include "process/process_internal.h"
#include "wire/objects.h"

/* Tasks and array tasks live in the process layer's registry, beside the
 * entries; the two task kinds share one name space there. */
int mp_register_task(const char *name, mp_task_fn fn)
{
    return mp__registry_add(MP__REG_TASK, name, (void (*)(void))fn, "mp_register_task");
}

void mp_register_task_at_load(const char *name, mp_task_fn fn)
{
    mp__registry_add_at_load(MP__REG_TASK, name, (void (*)(void))fn);
}

int mp_register_array_task(const char *name, mp_array_task_fn fn)
{
    return mp__registry_add(MP__REG_ARRAY_TASK, name, (void (*)(void))fn,
                            "mp_register_array_task");
}

void mp_register_array_task_at_load(const char *name, mp_array_task_fn fn)
{
    mp__registry_add_at_load(MP__REG_ARRAY_TASK, name, (void (*)(void))fn);
}

mp_task_fn mp__task_lookup(const char *name)
{
    return (mp_task_fn)mp__registry_find(MP__REG_TASK, name);
}

mp_array_task_fn mp__array_task_lookup(const char *name)
{
    return (mp_array_task_fn)mp__registry_find(MP__REG_ARRAY_TASK, name);
}

/* mp_raise inside a task fails that item with its text, and the worker
 * serves on. */
int mp__task_call_run(void *ctx)
{
    mp__task_call *t = ctx;
    mp__error_clear();
    return t->fn(t->in, t->out);
}

/* Records a task's failure (its return rc, or mp_raise with its text) in the
 * result pack. */
static int add_failure(mp__packer *res, const char *name, int rc, bool raised,
                       const char *raised_text)
{
    char err[MP__MESSAGE_MAX + 128];
    if (raised) {
        snprintf(err, sizeof err, "task '%s' raised: %s", name, raised_text);
        return mp__packer_add(res, NULL, 0, NULL, MP_ECHILD, err);
    }
    int code = rc < 0 && rc >= MP_ERROR_LAST ? rc : MP_ECHILD;
    snprintf(err, sizeof err, "task '%s' returned %d%s%s", name, rc,
             mp_last_error()[0] ? ": " : "", mp_last_error());
    return mp__packer_add(res, NULL, 0, NULL, code, err);
}

/* Runs one item through the chunk's two messages in and out (emptied and
 * reused per item: the task may not keep either past its call); records
 * its outcome in the result pack. */
static int run_item(const mp__pack_view *v, uint32_t i, mp_task_fn fn, mp__packer *res,
                    mp_msg *in, mp_msg *out)
{
    char err[MP__MESSAGE_MAX + 128], raised_text[MP__MESSAGE_MAX];
    const void *pl;
    size_t len;
    bool raised;
    int rc = mp__pack_item_into(v, i, in);
    mp__msg_reset(out);
    if (rc) {
        snprintf(err, sizeof err, "task '%s': worker could not build item %u: %s", v->name,
                 i, mp_last_error());
        return mp__packer_add(res, NULL, 0, NULL, rc, err);
    }
    rc = mp__catch_raise(mp__task_call_run, &(mp__task_call){fn, in, out}, raised_text,
                         sizeof raised_text, &raised);
    if (raised || rc)
        return add_failure(res, v->name, rc, raised, raised_text);
    /* A result that cannot travel (a tensor that cannot be shared) would
     * fail the send of the whole chunk: fail this item, with the cause. */
    if ((rc = mp__wire_check_sendable(out)) < 0) {
        snprintf(err, sizeof err, "task '%s': its result cannot be sent to the parent: %s",
                 v->name, mp_last_error());
        return mp__packer_add(res, NULL, 0, NULL, rc, err);
    }
    pl = mp_msg_payload(out, &len);
    return mp__packer_add(res, pl, len, out, 0, NULL);
}

/* An array task's call, made through mp__catch_raise as a task's is. */
struct array_call {
    mp_array_task_fn fn;
    const void *in;
    void *out;
    size_t n;
};

static int call_array(void *ctx)
{
    struct array_call *a = ctx;
    return a->fn(a->in, a->out, a->n);
}

/* Checks a slice against the two shared arrays it names. */
static int vec_check(const mp__vec_slice *s, const mp_tensor *ti, const mp_tensor *to)
{
    uint64_t end = s->start + s->count;
    if (end < s->start || !s->in_size || !s->out_size || end > SIZE_MAX / s->in_size ||
        end > SIZE_MAX / s->out_size || end * s->in_size > mp_tensor_nbytes(ti) ||
        end * s->out_size > mp_tensor_nbytes(to))
        return mp__error(MP_EPROTO, "pool worker: a slice [%llu, +%llu) outside its arrays",
                         (unsigned long long)s->start, (unsigned long long)s->count);
    return 0;
}

/* Runs an array task once over its slice of the shared in and out arrays
 * (the chunk's one item: a mp__vec_slice and the two tensors). */
static int run_slice(const mp__pack_view *v, mp_array_task_fn fn, mp__packer *res)
{
    mp_msg *in = NULL;
    mp_tensor *ti = NULL, *to = NULL;
    mp__vec_slice s;
    struct array_call call;
    char raised_text[MP__MESSAGE_MAX];
    size_t len = 0;
    const void *pl = NULL;
    bool raised;
    int rc = v->count == 1 ? mp__pack_item(v, 0, &in)
                           : mp__error(MP_EPROTO, "pool worker: a slice chunk of %u items",
                                       v->count);
    if (!rc && ((pl = mp_msg_payload(in, &len)), len != sizeof s || mp_msg_count(in) != 2))
        rc = mp__error(MP_EPROTO, "pool worker: a malformed slice");
    if (!rc) {
        memcpy(&s, pl, sizeof s);
        rc = mp_msg_get_tensor(in, 0, &ti);
    }
    if (!rc)
        rc = mp_msg_get_tensor(in, 1, &to);
    if (!rc)
        rc = vec_check(&s, ti, to);
    if (rc) {
        char err[MP__MESSAGE_MAX + 128];
        snprintf(err, sizeof err, "task '%s': %s", v->name, mp_last_error());
        rc = mp__packer_add(res, NULL, 0, NULL, rc, err);
        goto out;
    }
    call = (struct array_call){fn, (const char *)mp_tensor_data(ti) + s.start * s.in_size,
                               (char *)mp_tensor_data(to) + s.start * s.out_size, s.count};
    mp__error_clear();
    rc = mp__catch_raise(call_array, &call, raised_text, sizeof raised_text, &raised);
    rc = raised || rc ? add_failure(res, v->name, rc, raised, raised_text)
                      : mp__packer_add(res, NULL, 0, NULL, 0, NULL);
out:
    mp_tensor_release(ti);
    mp_tensor_release(to);
    mp_msg_destroy(in);
    return rc;
}

/* Sends the chunk's packed results to the parent. */
static int send_results(mp_conn *conn, mp__packer *res)
{
    mp_msg *reply = NULL;
    int rc = mp__packer_finish(res, &reply);
    if (!rc)
        rc = mp_conn_send(conn, reply, -1);
    mp_msg_destroy(reply); /* its buffer is kept for the next answers */
    return rc;
}

/* The reply could not be sent (its items passed the check, so the cause is
 * the reply as a whole: too many fds, no memory): every item of the chunk
 * fails with the reason, and the worker serves on. */
static int send_failure(mp_conn *conn, uint32_t count, int cause)
{
    char err[MP__MESSAGE_MAX + 128];
    mp__packer res;
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
    return send_results(conn, &res);
}

/* Handles one frame; 1 when told to exit. */
static int serve(mp_conn *conn, mp_msg *frame)
{
    mp__pack_view v;
    mp__packer res;
    mp_msg *in = NULL, *out = NULL;
    mp_task_fn fn;
    mp_array_task_fn afn;
    uint32_t count;
    int rc = mp__pack_open(frame, &v);
    if (rc)
        return rc;
    if (v.magic == MP__PACK_EXIT) {
        mp__pack_close(&v);
        return 1;
    }
    fn = v.magic == MP__PACK_TASK ? mp__task_lookup(v.name) : NULL;
    afn = v.magic == MP__PACK_TASK ? mp__array_task_lookup(v.name) : NULL;
    count = v.count;
    rc = mp__packer_init(&res, MP__PACK_RESULT, NULL, v.count);
    if (!rc && afn)
        rc = run_slice(&v, afn, &res);
    if (!rc && fn && !afn && v.count) {
        rc = mp_msg_create(&in);
        if (!rc)
            rc = mp_msg_create(&out);
    }
    for (uint32_t i = 0; !rc && !afn && i < v.count; i++) {
        if (fn) {
            rc = run_item(&v, i, fn, &res, in, out);
        } else {
            char err[128];
            snprintf(err, sizeof err, "task '%s' is not registered in the worker", v.name);
            rc = mp__packer_add(&res, NULL, 0, NULL, MP_ENOENT, err);
        }
    }
    mp_msg_destroy(in);
    mp_msg_destroy(out);
    mp__pack_close(&v);
    if (rc) {
        mp__packer_drop(&res);
        return rc; /* it cannot answer: it exits, and the pool fails the chunk */
    }
    if ((rc = send_results(conn, &res)) < 0 && rc != MP_ECLOSED)
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
