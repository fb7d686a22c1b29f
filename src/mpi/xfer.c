/* A message over MPI (the cross-host path): one header message with the
 * payload and every tensor's dtype, shape and name, then each tensor's
 * bytes as its own message, sent straight from the tensor's memory and
 * received straight into a shared-memory tensor. MPI keeps messages of
 * one (source, tag, communicator) in order, so the bodies follow their
 * header. Nothing here trusts the header: sizes are checked.
 *
 * The receiving tensors come from the pool of reusable segments: a new
 * 64 MiB segment costs several times the transfer itself (zeroing, page
 * faults, freeing), and a receiver that drops each message before the next
 * one of the same size gets the same, already mapped memory again. A
 * tensor passed on to another process leaves the pool for good. */
#include "mpi/mpi_internal.h"
#include "tensor/recycle.h"

#include <stdlib.h>
#include <string.h>

#define XFER_MAGIC 0x6d70786du /* "mpxm" */
#define XFER_VERSION 2u
/* MPI counts are int: larger storages go in pieces of this many bytes. */
#define XFER_CHUNK ((size_t)1 << 30)

typedef struct xfer_head {
    uint32_t magic;
    uint32_t version;
    uint32_t count;   /* tensors */
    uint32_t flags;   /* XFER_FOLLOWS */
    uint64_t payload; /* bytes after the tensor records */
} xfer_head;

/* A notice only: the message follows on the conn's stream of large ones. */
#define XFER_FOLLOWS 2u

typedef struct xfer_tensor {
    uint8_t dtype;
    uint8_t ndim;
    uint16_t namelen; /* 0: unnamed */
    uint32_t pad;
    /* then int64 shape[ndim], then the name's bytes, padded to 8 */
} xfer_tensor;

/* Buffers are kept between messages (a conn reuses one inflight), so a
 * small message costs no allocation. */
struct mp__mpi_inflight {
    int nreq, capreq;
    MPI_Request *reqs;
    char *header;
    size_t capheader;
    size_t ntensors, captensors;
    mp_tensor **tensors;
    xfer_head notice; /* XFER_FOLLOWS, on the small stream */
};

static size_t pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

static void inflight_clear(mp__mpi_inflight *f)
{
    for (size_t i = 0; i < f->ntensors; i++)
        mp_tensor_release(f->tensors[i]);
    f->ntensors = 0;
    f->nreq = 0;
}

void mp__mpi_inflight_free(mp__mpi_inflight *f)
{
    if (!f)
        return;
    inflight_clear(f);
    free(f->tensors);
    free(f->reqs);
    free(f->header);
    free(f);
}

int mp__mpi_inflight_new(mp__mpi_inflight **out)
{
    if (!(*out = calloc(1, sizeof **out)))
        return mp__error(MP_ENOMEM, "mp_mpi_conn_send: out of memory");
    return 0;
}

bool mp__mpi_inflight_busy(const mp__mpi_inflight *f)
{
    return f && f->nreq > 0;
}

/* Grows *p (of *cap elements of size each) to at least n. */
static int grow(void *p, size_t *cap, size_t n, size_t each)
{
    if (n <= *cap)
        return 0;
    size_t want = n < 2 * *cap ? 2 * *cap : n;
    void *q = realloc(*(void **)p, want * each);
    if (!q)
        return mp__error(MP_ENOMEM, "mp_mpi_conn_send: out of memory for %zu bytes",
                         want * each);
    *(void **)p = q;
    *cap = want;
    return 0;
}

/* Contiguous CPU tensors of attachment i, or MP_ENOTSUP for what stays on
 * its host (queues, connections, sync objects, CUDA tensors). */
static int xfer_tensor_at(const mp_msg *m, size_t i, mp_tensor **out)
{
    int kind = mp_msg_kind(m, i);
    mp_tensor *t = NULL;
    int rc;
    if (kind != MP_ATTACH_TENSOR)
        return mp__error(MP_ENOTSUP, "mp_mpi_conn_send: attachment %zu is a %s, which stays "
                                     "on its host (queues, connections, locks, events, "
                                     "barriers and CUDA tensors do not cross hosts); send "
                                     "tensors and bytes, or keep both ranks on one host", i,
                         kind == MP_ATTACH_CUDA_TENSOR ? "CUDA tensor" : "mproc object");
    if ((rc = mp_msg_get_tensor(m, i, &t)) != 0)
        return rc;
    if (mp_tensor_is_contiguous(t)) {
        *out = t;
        return 0;
    }
    rc = mp_tensor_clone(t, out);
    mp_tensor_release(t);
    return rc;
}

int mp__mpi_xfer_check(const mp_msg *m)
{
    for (size_t i = 0; i < mp_msg_count(m); i++) {
        mp_tensor *t = NULL;
        int rc = xfer_tensor_at(m, i, &t);
        mp_tensor_release(t);
        if (rc)
            return rc;
    }
    return 0;
}

/* The header into f->header: counts, each tensor's record, the payload. */
static int build_header(mp__mpi_inflight *f, const mp_msg *m, size_t *len)
{
    size_t plen = 0, size = sizeof(xfer_head), n = f->ntensors;
    const void *payload = mp_msg_payload(m, &plen);
    int rc;
    for (size_t i = 0; i < n; i++) {
        const char *name = mp_msg_name(m, i);
        size += sizeof(xfer_tensor) + 8 * (size_t)mp_tensor_ndim(f->tensors[i]) +
                pad8(name ? strlen(name) : 0);
    }
    size += plen;
    if ((rc = grow(&f->header, &f->capheader, size, 1)) != 0)
        return rc;
    char *p = f->header + sizeof(xfer_head);
    *(xfer_head *)f->header = (xfer_head){XFER_MAGIC, XFER_VERSION, (uint32_t)n, 0, plen};
    for (size_t i = 0; i < n; i++) {
        const char *name = mp_msg_name(m, i);
        xfer_tensor r = {(uint8_t)mp_tensor_dtype(f->tensors[i]),
                         (uint8_t)mp_tensor_ndim(f->tensors[i]),
                         (uint16_t)(name ? strlen(name) : 0), 0};
        memcpy(p, &r, sizeof r);
        p += sizeof r;
        memcpy(p, mp_tensor_shape(f->tensors[i]), 8 * (size_t)r.ndim);
        p += 8 * (size_t)r.ndim;
        memset(p, 0, pad8(r.namelen));
        if (r.namelen)
            memcpy(p, name, r.namelen);
        p += pad8(r.namelen);
    }
    if (plen)
        memcpy(p, payload, plen);
    *len = size;
    return 0;
}

/* small_tag >= 0 (conns): a message of at most MP__MPI_SMALL header bytes
 * and no tensor goes whole on small_tag, into the receive the peer keeps
 * posted (as fast as a plain MPI_Recv); a larger one sends a notice there
 * and itself on tag, so the small stream alone orders the conn. */
static int post_sends(mp__mpi_inflight *f, size_t hlen, int dest, int tag, int small_tag)
{
    int rc = MPI_SUCCESS;
    f->nreq = 0;
    if (small_tag >= 0 && f->ntensors == 0 && hlen <= MP__MPI_SMALL) {
        tag = small_tag;
    } else if (small_tag >= 0) {
        f->notice = (xfer_head){XFER_MAGIC, XFER_VERSION, 0, XFER_FOLLOWS, 0};
        rc = MPI_Isend(&f->notice, sizeof f->notice, MPI_BYTE, dest, small_tag, mp__mpi.comm,
                       &f->reqs[f->nreq++]);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Isend(f->header, (int)hlen, MPI_BYTE, dest, tag, mp__mpi.comm,
                       &f->reqs[f->nreq++]);
    for (size_t i = 0; i < f->ntensors && rc == MPI_SUCCESS; i++) {
        char *data = mp_tensor_data(f->tensors[i]);
        size_t left = mp_tensor_nbytes(f->tensors[i]);
        while (left > 0 && rc == MPI_SUCCESS) {
            size_t piece = left < XFER_CHUNK ? left : XFER_CHUNK;
            rc = MPI_Isend(data, (int)piece, MPI_BYTE, dest, tag, mp__mpi.comm,
                           &f->reqs[f->nreq++]);
            data += piece, left -= piece;
        }
    }
    return rc == MPI_SUCCESS ? 0 : mp__mpi_error(rc, "mp_mpi_conn_send", "MPI_Isend");
}

int mp__mpi_xfer_post(mp__mpi_inflight *f, const mp_msg *m, int dest, int tag, int small_tag)
{
    size_t n = mp_msg_count(m), hlen = 0, nreq = 2;
    int rc = grow(&f->tensors, &f->captensors, n ? n : 1, sizeof *f->tensors);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if ((rc = xfer_tensor_at(m, i, &f->tensors[i])) == 0) {
            f->ntensors++;
            nreq += (mp_tensor_nbytes(f->tensors[i]) + XFER_CHUNK - 1) / XFER_CHUNK;
        }
    }
    size_t capreq = (size_t)f->capreq;
    if (rc == 0)
        rc = build_header(f, m, &hlen);
    if (rc == 0 && (rc = grow(&f->reqs, &capreq, nreq, sizeof *f->reqs)) == 0)
        f->capreq = (int)capreq;
    if (rc == 0)
        rc = post_sends(f, hlen, dest, tag, small_tag);
    /* A failed post after the first leaves the posted ones to finish. */
    if (rc != 0 && f->nreq == 0)
        inflight_clear(f);
    return rc;
}

int mp__mpi_xfer_pack(const mp_msg *m, char *buf, size_t cap, size_t *len)
{
    size_t plen = 0;
    const void *payload = mp_msg_payload(m, &plen);
    xfer_head h = {XFER_MAGIC, XFER_VERSION, 0, 0, plen};
    if (mp_msg_count(m) != 0 || plen > cap || cap - plen < sizeof h)
        return 1;
    memcpy(buf, &h, sizeof h);
    if (plen)
        memcpy(buf + sizeof h, payload, plen);
    *len = sizeof h + plen;
    return 0;
}

int mp__mpi_xfer_send(const mp_msg *m, int dest, int tag, mp__mpi_inflight **out)
{
    mp__mpi_inflight *f = NULL;
    int rc = mp__mpi_inflight_new(&f);
    if (rc == 0)
        rc = mp__mpi_xfer_post(f, m, dest, tag, -1);
    if (f && f->nreq == 0) {
        mp__mpi_inflight_free(f);
        return rc;
    }
    *out = f;
    return rc;
}

int mp__mpi_inflight_wait(mp__mpi_inflight *f, double deadline, const char *fn)
{
    for (;;) {
        int done = 0, rc = MPI_Testall(f->nreq, f->reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            return mp__mpi_error(rc, fn, "MPI_Testall");
        if (done) {
            inflight_clear(f);
            return 1;
        }
        /* One wait on the request still open does the failure check,
         * deadline and backoff. */
        int i = 0;
        while (i < f->nreq - 1 && f->reqs[i] == MPI_REQUEST_NULL)
            i++;
        rc = mp__mpi_wait_data(&f->reqs[i], deadline, NULL, fn);
        if (rc == MP_ETIMEDOUT)
            return 0;
        if (rc != 0)
            return rc;
    }
}

/* ---- receiving ------------------------------------------------------------ */

/* Receives (whatever the deadline: the header is taken) the bytes of one
 * tensor into t (or, when t is NULL because it could not be made, into a
 * scratch buffer, to keep the stream whole). */
static int recv_body(mp_tensor *t, size_t nbytes, int src, int tag)
{
    char *data = t ? mp_tensor_data(t) : NULL;
    int rc = 0;
    while (nbytes > 0 && rc == 0) {
        size_t piece = nbytes < XFER_CHUNK ? nbytes : XFER_CHUNK;
        char *scratch = data ? NULL : malloc(piece);
        MPI_Request req;
        int mrc = MPI_Irecv(data ? data : scratch, scratch || data ? (int)piece : 0, MPI_BYTE,
                            src, tag, mp__mpi.comm, &req);
        if (mrc != MPI_SUCCESS)
            rc = mp__mpi_error(mrc, "mp_mpi_conn_recv", "MPI_Irecv");
        else
            rc = mp__mpi_wait_data(&req, -1, NULL, "mp_mpi_conn_recv");
        free(scratch);
        if (data)
            data += piece;
        nbytes -= piece;
    }
    return rc;
}

typedef struct parsed_tensor {
    int dtype, ndim;
    int64_t shape[MP_MAX_NDIM];
    char name[MP_MSG_NAME_MAX + 1];
    size_t nbytes;
} parsed_tensor;

static int parse_tensor(const char **pp, const char *end, parsed_tensor *t)
{
    xfer_tensor r;
    const char *p = *pp;
    size_t numel = 1;
    if ((size_t)(end - p) < sizeof r)
        return -1;
    memcpy(&r, p, sizeof r);
    p += sizeof r;
    if (r.dtype >= MP_DTYPE_COUNT || r.ndim > MP_MAX_NDIM || r.namelen > MP_MSG_NAME_MAX ||
        (size_t)(end - p) < 8 * (size_t)r.ndim + pad8(r.namelen))
        return -1;
    t->dtype = r.dtype, t->ndim = r.ndim;
    memcpy(t->shape, p, 8 * (size_t)r.ndim);
    p += 8 * (size_t)r.ndim;
    memcpy(t->name, p, r.namelen);
    t->name[r.namelen] = 0;
    p += pad8(r.namelen);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || __builtin_mul_overflow(numel, (size_t)t->shape[d], &numel))
            return -1;
    }
    if (__builtin_mul_overflow(numel, mp_dtype_size((mp_dtype)t->dtype), &t->nbytes))
        return -1;
    *pp = p;
    return 0;
}

/* Builds the message from a checked header, receiving every body. */
static int recv_message(const char *buf, size_t len, int src, int tag, mp_msg **out)
{
    xfer_head h;
    const char *p = buf + sizeof h, *end = buf + len;
    mp_msg *m = NULL;
    int rc = 0, bad = 0;
    memcpy(&h, buf, sizeof h);
    if ((rc = mp_msg_create(&m)) != 0)
        return rc;
    for (uint32_t i = 0; i < h.count; i++) {
        parsed_tensor pt;
        mp_tensor *t = NULL;
        if (parse_tensor(&p, end, &pt) != 0) {
            /* The bodies cannot be told apart any more: the stream is lost. */
            mp_msg_destroy(m);
            return mp__error(MP_EPROTO, "mp_mpi_conn_recv: malformed tensor record %u from "
                                        "rank %d", i, src);
        }
        if (!bad && (rc = mp__tensor_empty_reusable((mp_dtype)pt.dtype, pt.ndim, pt.shape, &t)))
            bad = rc;
        int brc = recv_body(t, pt.nbytes, src, tag);
        if (!bad && brc == 0)
            bad = mp_msg_add_tensor(m, pt.name[0] ? pt.name : NULL, t);
        mp_tensor_release(t);
        if (brc) {
            mp_msg_destroy(m);
            return brc;
        }
    }
    if (!bad && (size_t)(end - p) != h.payload)
        bad = mp__error(MP_EPROTO, "mp_mpi_conn_recv: payload of %zu bytes, header says %llu",
                        (size_t)(end - p), (unsigned long long)h.payload);
    if (!bad)
        bad = mp_msg_set_payload(m, p, h.payload);
    if (bad) {
        mp_msg_destroy(m);
        return bad;
    }
    *out = m;
    return 0;
}

int mp__mpi_xfer_parse(const char *buf, int count, int src, int tag, mp_msg **out)
{
    const xfer_head *h = (const xfer_head *)buf;
    if ((size_t)count < sizeof(xfer_head) || h->magic != XFER_MAGIC ||
        h->version != XFER_VERSION)
        return mp__error(MP_EPROTO, "mp_mpi_conn_recv: a %d-byte message from rank %d is not "
                                    "an mproc message of version %u", count, src, XFER_VERSION);
    if (h->flags & XFER_FOLLOWS)
        return MP__MPI_FOLLOWS;
    return recv_message(buf, (size_t)count, src, tag, out);
}

int mp__mpi_xfer_recv(MPI_Message *msg, MPI_Status *st, int tag, mp__mpi_buf *scratch,
                      mp_msg **out)
{
    int count = 0, rc, src = st->MPI_SOURCE;
    size_t need;
    MPI_Request req;
    mp__mpi_buf own = {NULL, 0}, *b = scratch ? scratch : &own;
    MPI_Get_count(st, MPI_BYTE, &count);
    need = count > 0 ? (size_t)count : 1;
    if (need > b->cap) {
        char *p = realloc(b->p, need);
        if (!p)
            return mp__error(MP_ENOMEM, "mp_mpi_conn_recv: out of memory for %d bytes", count);
        b->p = p, b->cap = need;
    }
    /* Once matched, the message is ours: receive it whatever the deadline. */
    rc = MPI_Imrecv(b->p, count, MPI_BYTE, msg, &req);
    rc = rc == MPI_SUCCESS ? mp__mpi_wait_data(&req, -1, NULL, "mp_mpi_conn_recv")
                           : mp__mpi_error(rc, "mp_mpi_conn_recv", "MPI_Imrecv");
    if (rc == 0)
        rc = mp__mpi_xfer_parse(b->p, count, src, tag, out);
    free(own.p);
    return rc;
}

int mp__mpi_xfer_recv_msg(MPI_Message *msg, MPI_Status *st, int tag, mp_msg **out)
{
    int rc = mp__mpi_xfer_recv(msg, st, tag, NULL, out);
    if (rc > 0)
        rc = mp__error(MP_EPROTO, "mp_mpi_queue: rank %d sent a notice on a queue's tag",
                       st->MPI_SOURCE);
    return rc;
}

int mp__mpi_inflight_test(mp__mpi_inflight *f)
{
    int done = 0;
    MPI_Testall(f->nreq, f->reqs, &done, MPI_STATUSES_IGNORE);
    if (done)
        inflight_clear(f);
    return done;
}
