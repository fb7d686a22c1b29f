/* Public Queue, JoinableQueue and SimpleQueue calls, their convenience
 * calls, and how each kind travels as a message attachment. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "ipc/ipc.h"
#include "ipc/remote.h"
#include "mproc/wait.h"

#define Q(x) (&(x)->q)

static int create(int kind, int64_t maxsize, mp__queue **out, const char *fn)
{
    if (!out)
        return mp__error(MP_EINVAL, "%s: out is NULL", fn);
    return mp__queue_create(kind, maxsize, out);
}

int mp_queue_create(int64_t maxsize, mp_queue **out)
{
    return create(MP_ATTACH_QUEUE, maxsize, (mp__queue **)out, "mp_queue_create");
}

int mp_joinable_queue_create(int64_t maxsize, mp_queue **out)
{
    return create(MP_ATTACH_JOINABLE_QUEUE, maxsize, (mp__queue **)out,
                  "mp_joinable_queue_create");
}

int mp_simple_queue_create(mp_simple_queue **out)
{
    return create(MP_ATTACH_SIMPLE_QUEUE, 0, (mp__queue **)out, "mp_simple_queue_create");
}

mp_queue *mp_queue_retain(mp_queue *q) { return (mp_queue *)mp__queue_retain((mp__queue *)q); }
void mp_queue_release(mp_queue *q) { mp__queue_release((mp__queue *)q); }
mp_simple_queue *mp_simple_queue_retain(mp_simple_queue *q)
{
    return (mp_simple_queue *)mp__queue_retain((mp__queue *)q);
}
void mp_simple_queue_release(mp_simple_queue *q) { mp__queue_release((mp__queue *)q); }

int mp_queue_put(mp_queue *q, const mp_msg *m, double timeout)
{
    int rc = mp__check_timeout(timeout, "mp_queue_put");
    if (rc < 0)
        return rc;
    return mp__queue_put((mp__queue *)q, m, mp__ipc_deadline(timeout), "mp_queue_put");
}
int mp_queue_put_nowait(mp_queue *q, const mp_msg *m)
{
    return mp__queue_put((mp__queue *)q, m, 0, "mp_queue_put_nowait");
}
int mp_queue_get(mp_queue *q, mp_msg **out, double timeout)
{
    if (out)
        *out = NULL;
    int rc = mp__check_timeout(timeout, "mp_queue_get");
    if (rc < 0)
        return rc;
    return mp__queue_get((mp__queue *)q, out, mp__ipc_deadline(timeout), "mp_queue_get");
}
int mp_queue_get_nowait(mp_queue *q, mp_msg **out)
{
    return mp__queue_get((mp__queue *)q, out, 0, "mp_queue_get_nowait");
}
int mp_simple_queue_put(mp_simple_queue *q, const mp_msg *m)
{
    return mp__queue_put((mp__queue *)q, m, -1, "mp_simple_queue_put");
}
int mp_simple_queue_get(mp_simple_queue *q, mp_msg **out)
{
    return mp__queue_get((mp__queue *)q, out, -1, "mp_simple_queue_get");
}

int64_t mp_queue_qsize(mp_queue *q)
{
    if (q && Q(q)->ops)
        return Q(q)->ops->qsize(Q(q)->impl, "mp_queue_qsize");
    return q ? mp__queue_size(Q(q)) : 0;
}
bool mp_queue_empty(mp_queue *q)
{
    if (q && Q(q)->ops)
        return Q(q)->ops->qsize(Q(q)->impl, "mp_queue_empty") <= 0;
    return mp__queue_empty((mp__queue *)q);
}
bool mp_simple_queue_empty(mp_simple_queue *q) { return mp__queue_empty((mp__queue *)q); }
/* A remote queue is unbounded: maxsize 0, never full. */
int64_t mp_queue_maxsize(mp_queue *q) { return q && !Q(q)->ops ? Q(q)->ctl->maxsize : 0; }
bool mp_queue_full(mp_queue *q)
{
    return q && !Q(q)->ops && Q(q)->ctl->maxsize > 0 &&
           mp_queue_qsize(q) >= Q(q)->ctl->maxsize;
}
int mp_queue_close(mp_queue *q) { return mp__queue_close((mp__queue *)q); }
/* The fd a user polls: from now on its ring rings doorbells. */
static int queue_fd(const mp__queue *q)
{
    mp__ring_polled(&q->ctl->ring, q->wsock);
    return q->rsock;
}

int mp_queue_fileno(const mp_queue *q)
{
    if (q && Q(q)->ops)
        return mp__error(MP_ENOTSUP, "mp_queue_fileno: %s has no fd to poll (its messages "
                                     "arrive by MPI); call mp_queue_get with a timeout "
                                     "instead", Q(q)->ops->what);
    return q ? queue_fd(Q(q)) : -1;
}
int mp_simple_queue_fileno(const mp_simple_queue *q) { return q ? queue_fd(Q(q)) : -1; }
int mp_simple_queue_close(mp_simple_queue *q) { return mp__queue_close((mp__queue *)q); }
bool mp_queue_is_joinable(mp_queue *q) { return q && Q(q)->kind == MP_ATTACH_JOINABLE_QUEUE; }

int mp_queue_task_done(mp_queue *q)
{
    mp__qctl *c;
    int64_t left;
    if (!q)
        return mp__error(MP_EINVAL, "mp_queue_task_done: queue is NULL");
    if (!mp_queue_is_joinable(q))
        return mp__error(MP_ESTATE, "mp_queue_task_done: not a JoinableQueue");
    if (Q(q)->ops)
        return Q(q)->ops->task_done(Q(q)->impl, "mp_queue_task_done");
    c = Q(q)->ctl;
    left = atomic_fetch_sub(&c->unfinished, 1) - 1;
    if (left < 0) {
        atomic_fetch_add(&c->unfinished, 1);
        return mp__error(MP_ESTATE, "mp_queue_task_done: called more times than messages "
                                    "were put");
    }
    if (left == 0)
        mp__qctl_wake_join(c);
    return 0;
}

int mp_queue_join(mp_queue *q, double timeout)
{
    double deadline = mp__ipc_deadline(timeout);
    mp__qctl *c;
    int rc = mp__check_timeout(timeout, "mp_queue_join");
    if (rc < 0)
        return rc;
    if (!q)
        return mp__error(MP_EINVAL, "mp_queue_join: queue is NULL");
    if (!mp_queue_is_joinable(q))
        return mp__error(MP_ESTATE, "mp_queue_join: not a JoinableQueue");
    if (Q(q)->ops)
        return Q(q)->ops->join(Q(q)->impl, deadline, "mp_queue_join");
    c = Q(q)->ctl;
    for (;;) {
        uint32_t seq = atomic_load(&c->join_seq);
        int64_t left = atomic_load(&c->unfinished);
        if (left <= 0)
            return 0;
        if (deadline == 0 ||
            mp__futex_wait((uint32_t *)&c->join_seq, seq, deadline, true) == MP_ETIMEDOUT)
            return mp__error(MP_ETIMEDOUT, "mp_queue_join: %lld messages not yet task_done",
                             (long long)left);
    }
}

/* ---- convenience ------------------------------------------------------------ */

int mp_queue_put_tensor(mp_queue *q, mp_tensor *t, double timeout)
{
    mp_msg *m = NULL;
    int rc = mp__check_timeout(timeout, "mp_queue_put_tensor");
    if (rc < 0)
        return rc;
    if (!t)
        return mp__error(MP_EINVAL, "mp_queue_put_tensor: tensor is NULL");
    if ((rc = mp_msg_create(&m)) < 0)
        return rc;
    if ((rc = mp_msg_add_tensor(m, NULL, t)) == 0)
        rc = mp__queue_put((mp__queue *)q, m, mp__ipc_deadline(timeout),
                           "mp_queue_put_tensor");
    mp_msg_destroy(m);
    return rc;
}

int mp_queue_get_tensor(mp_queue *q, mp_tensor **out, double timeout)
{
    mp_msg *m = NULL;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_queue_get_tensor: out is NULL");
    *out = NULL;
    if ((rc = mp__check_timeout(timeout, "mp_queue_get_tensor")) < 0)
        return rc;
    rc = mp__queue_get((mp__queue *)q, &m, mp__ipc_deadline(timeout), "mp_queue_get_tensor");
    if (rc < 0)
        return rc;
    if (mp_msg_count(m) != 1 || mp_msg_kind(m, 0) != MP_ATTACH_TENSOR)
        rc = mp__error(MP_EPROTO, "mp_queue_get_tensor: the message holds %zu attachments, "
                                  "not one tensor (it was dropped)", mp_msg_count(m));
    else
        rc = mp_msg_get_tensor(m, 0, out);
    mp_msg_destroy(m);
    return rc;
}

int mp_queue_put_state_dict(mp_queue *q, size_t n, const char *const *names,
                            mp_tensor *const *tensors, double timeout)
{
    mp_msg *m = NULL;
    int rc = mp__check_timeout(timeout, "mp_queue_put_state_dict");
    if (rc < 0 || (rc = mp__msg_from_state_dict(n, names, tensors, &m,
                                                "mp_queue_put_state_dict")) < 0)
        return rc;
    rc = mp__queue_put((mp__queue *)q, m, mp__ipc_deadline(timeout),
                       "mp_queue_put_state_dict");
    mp_msg_destroy(m);
    return rc;
}

int mp_queue_get_state_dict(mp_queue *q, mp_msg **out, double timeout)
{
    int rc;
    if (out)
        *out = NULL;
    if ((rc = mp__check_timeout(timeout, "mp_queue_get_state_dict")) < 0)
        return rc;
    rc = mp__queue_get((mp__queue *)q, out, mp__ipc_deadline(timeout), "mp_queue_get_state_dict");
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < mp_msg_count(*out); i++)
        if (mp_msg_kind(*out, i) != MP_ATTACH_TENSOR || !mp_msg_name(*out, i)) {
            mp_msg_destroy(*out);
            *out = NULL;
            return mp__error(MP_EPROTO, "mp_queue_get_state_dict: attachment %zu is not a "
                                        "named tensor (the message was dropped)", i);
        }
    return 0;
}

/* ---- as attachments: 3 fds (read end, write end, control segment) ---------- */

#define QWIRE_MAGIC 0x51575051u /* "QPWQ" */

int mp__check_seqpacket(int fd, const char *what)
{
    int type = 0, domain = 0;
    socklen_t len = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_SEQPACKET)
        return mp__error(MP_EPROTO, "%s: fd is not a SOCK_SEQPACKET socket", what);
    len = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0 || domain != AF_UNIX)
        return mp__error(MP_EPROTO, "%s: fd is not an AF_UNIX socket", what);
    return 0;
}

static void *q_retain(void *o) { return mp__queue_retain(o); }
static void q_release(void *o) { mp__queue_release(o); }

static int q_encode(void *obj, void *buf, size_t cap, size_t *len, int *fds, int maxfds,
                    int *nfds)
{
    mp__queue *q = obj;
    mp__segment_handle h;
    uint32_t magic = QWIRE_MAGIC;
    int rc;
    if (cap < sizeof magic || maxfds < 3)
        return mp__error(MP_EOVERFLOW, "mp_msg: no room for a queue attachment (too many fds)");
    if ((rc = mp__segment_export(q->seg, &h)) < 0)
        return rc;
    memcpy(buf, &magic, sizeof magic);
    *len = sizeof magic;
    fds[0] = q->rsock;
    fds[1] = q->wsock;
    fds[2] = h.fd;
    *nfds = 3;
    return 0;
}

static int q_decode_kind(int kind, const void *buf, size_t len, int *fds, int nfds,
                         void **obj)
{
    mp__queue *q = NULL;
    mp__segment_handle h = {.strategy = MP__STRATEGY_FD, .fd = -1, .size = sizeof(mp__qctl)};
    uint32_t magic = 0;
    int rc;
    *obj = NULL;
    if (len != sizeof magic || nfds != 3 || (memcpy(&magic, buf, sizeof magic), 0) ||
        magic != QWIRE_MAGIC) {
        rc = mp__error(MP_EPROTO, "queue attachment: %zu bytes and %d fds (want 4 and 3) or "
                                  "bad magic", len, nfds);
        goto out_fds;
    }
    if ((rc = mp__check_seqpacket(fds[0], "queue attachment")) < 0 ||
        (rc = mp__check_seqpacket(fds[1], "queue attachment")) < 0)
        goto out_fds;
    if (!(q = calloc(1, sizeof *q))) {
        rc = mp__error(MP_ENOMEM, "queue attachment: out of memory");
        goto out_fds;
    }
    h.fd = fds[2];
    fds[2] = -1;
    if ((rc = mp__segment_open(&h, &q->seg)) < 0)
        goto out_q;
    q->ctl = mp__segment_data(q->seg);
    rc = mp__ipc_ctl_check("queue", q->ctl->magic, MP__QCTL_MAGIC, q->ctl->version,
                           MP__QCTL_VERSION);
    if (rc < 0)
        goto out_seg;
    if (q->ctl->kind != (uint32_t)kind) {
        rc = mp__error(MP_EPROTO, "queue attachment: the control block is of a queue of another "
                                  "kind (%u, the message says %d): every process sharing a "
                                  "queue must run the same mproc build", q->ctl->kind, kind);
        goto out_seg;
    }
    if ((rc = mp__pins_attach(&q->ctl->rx.pins)) < 0)
        goto out_seg;
    q->kind = kind;
    q->rsock = fds[0];
    q->wsock = fds[1];
    atomic_init(&q->refs, 1);
    *obj = q;
    return 0;
out_seg:
    mp__segment_release(q->seg);
out_q:
    free(q);
out_fds:
    for (int i = 0; i < nfds; i++)
        fds[i] = mp__close(fds[i]);
    return rc;
}

#define DECODER(NAME, KIND)                                                                \
    static int NAME(const void *buf, size_t len, int *fds, int nfds, void **obj)           \
    {                                                                                      \
        return q_decode_kind(KIND, buf, len, fds, nfds, obj);                              \
    }
DECODER(queue_decode, MP_ATTACH_QUEUE)
DECODER(simple_decode, MP_ATTACH_SIMPLE_QUEUE)
DECODER(joinable_decode, MP_ATTACH_JOINABLE_QUEUE)

const mp__objkind mp__queue_kind = {MP_ATTACH_QUEUE, "queue", q_retain, q_release,
                                    q_encode, queue_decode};
const mp__objkind mp__simple_queue_kind = {MP_ATTACH_SIMPLE_QUEUE, "simple queue", q_retain,
                                           q_release, q_encode, simple_decode};
const mp__objkind mp__joinable_queue_kind = {MP_ATTACH_JOINABLE_QUEUE, "joinable queue",
                                             q_retain, q_release, q_encode, joinable_decode};

static const mp__objkind *q_ops(int kind)
{
    return kind == MP_ATTACH_JOINABLE_QUEUE ? &mp__joinable_queue_kind
           : kind == MP_ATTACH_SIMPLE_QUEUE ? &mp__simple_queue_kind
                                            : &mp__queue_kind;
}

int mp_msg_add_queue(mp_msg *m, const char *name, mp_queue *q)
{
    if (!q)
        return mp__error(MP_EINVAL, "mp_msg_add_queue: queue is NULL");
    if (Q(q)->ops)
        return mp__error(MP_ENOTSUP, "mp_msg_add_queue: %s cannot travel in a message (it "
                                     "is not an object of this host); every rank already "
                                     "holds it: create it collectively and use it on each "
                                     "rank", Q(q)->ops->what);
    return mp__msg_add_object(m, name, q_ops(Q(q)->kind), q, "mp_msg_add_queue");
}

int mp_msg_get_queue(const mp_msg *m, size_t index, mp_queue **out)
{
    int kind = mp_msg_kind(m, index);
    return mp__msg_get_object(m, index, q_ops(kind == MP_ATTACH_JOINABLE_QUEUE ? kind
                                                                              : MP_ATTACH_QUEUE),
                              (void **)out, "mp_msg_get_queue");
}

int mp_msg_add_simple_queue(mp_msg *m, const char *name, mp_simple_queue *q)
{
    return mp__msg_add_object(m, name, &mp__simple_queue_kind, q, "mp_msg_add_simple_queue");
}

int mp_msg_get_simple_queue(const mp_msg *m, size_t index, mp_simple_queue **out)
{
    return mp__msg_get_object(m, index, &mp__simple_queue_kind, (void **)out,
                              "mp_msg_get_simple_queue");
}
