/* Frame encoder: turns an mp_msg into one record plus its fds. Tensors'
 * storages are shared first (one copy for a private storage, none for a
 * shared one) and deduplicated, so views of one storage cross as one
 * segment. A body too large for one record is spilled into a sealed memfd. */
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor_internal.h"
#include "wire/frame.h"

#define OBJ_SCRATCH 4096

typedef struct obj_bytes {
    unsigned char *bytes;
    size_t len;
    int fd_first;
    int nfds;
} obj_bytes;

typedef struct enc {
    const mp_msg *m;
    mp__frame_out *o;
    mp__segment *segs[MP__WIRE_MAX_FDS]; /* NULL: an empty storage */
    const void *keys[MP__WIRE_MAX_FDS];  /* the segment, or an empty storage */
    uint32_t ref[MP__WIRE_MAX_FDS];   /* storage i's fd index (file_descriptor) */
    int nseg;
    obj_bytes *objs;      /* one per attachment (only objects use it) */
} enc;

/* Sets what is read before it is written: the storage tables (about 5 KiB)
 * are filled up to nseg and never read past it, so they are not cleared
 * (that clearing cost more than the rest of a small message's check). */
static void enc_init(enc *e, const mp_msg *m, mp__frame_out *o)
{
    e->m = m;
    e->o = o;
    e->nseg = 0;
    e->objs = NULL;
}

/* What names t's storage in the table: its segment, or for a storage of
 * no bytes (which needs no segment) the storage itself. */
static const void *storage_key(const mp_tensor *t)
{
    mp__storage *st = mp__tensor_storage(t);
    return mp__storage_nbytes(st) ? (const void *)mp__storage_segment(st) : (const void *)st;
}

static int seg_index(const enc *e, const void *key)
{
    for (int i = 0; i < e->nseg; i++)
        if (e->keys[i] == key)
            return i;
    return -1;
}

/* Shares t's storage and adds its segment to the table (once). */
static int add_storage(enc *e, mp_tensor *t, size_t index)
{
    mp__storage *st = mp__tensor_storage(t);
    mp__segment *seg = NULL;
    int rc;
    if (mp__storage_device(st).device_type != kDLCPU)
        return mp__error(MP_EINVAL, "sending a message: attachment %zu is not a CPU tensor", index);
    if (mp__storage_nbytes(st)) {
        if ((rc = mp__storage_share(st)) < 0)
            return rc;
        seg = mp__storage_segment(st);
        if (!seg)
            return mp__error(MP_ESTATE, "sending a message: attachment %zu has no shared segment "
                                        "after sharing", index);
    }
    if (seg_index(e, storage_key(t)) >= 0)
        return 0;
    if (e->nseg == MP__WIRE_MAX_FDS - 1)
        return mp__error(MP_EOVERFLOW, "sending a message: more than %d distinct storages in "
                                       "one message; send them in several messages",
                         MP__WIRE_MAX_FDS - 1);
    e->keys[e->nseg] = storage_key(t);
    e->ref[e->nseg] = 0;
    e->segs[e->nseg++] = seg;
    return 0;
}

int mp__wire_check_sendable(const mp_msg *m)
{
    enc e;
    int rc = 0;
    enc_init(&e, m, NULL);
    if (!m)
        return mp__error(MP_EINVAL, "sending a message: the message is NULL");
    for (size_t i = 0; i < m->count && rc == 0; i++) {
        mp_tensor *g;
        if (m->att[i].kind != MP_ATTACH_TENSOR)
            continue;
        rc = add_storage(&e, m->att[i].u.tensor, i);
        if (rc == 0 && (g = mp_tensor_grad(m->att[i].u.tensor)))
            rc = add_storage(&e, g, i);
    }
    return rc;
}

static int export_storages(enc *e)
{
    mp__frame_out *o = e->o;
    for (int i = 0; i < e->nseg; i++) {
        mp__segment_handle *h = &o->handles[i];
        int rc;
        if (!e->segs[i]) {
            *h = (mp__segment_handle){.strategy = MP__FRAME_STORAGE_EMPTY, .fd = -1};
            e->ref[i] = 0;
            o->nhandles++;
            continue;
        }
        if (o->pins && mp__pins_reserve(o->pins, e->segs[i], &o->pinned[i])) {
            *h = (mp__segment_handle){.strategy = MP__FRAME_STORAGE_PINNED, .fd = -1,
                                      .size = mp__segment_size(e->segs[i])};
            e->ref[i] = 0;
            o->nhandles++;
            continue;
        }
        if ((rc = mp__segment_export(e->segs[i], h)) < 0)
            return rc;
        o->nhandles++;
        if (h->strategy == MP__STRATEGY_FD) {
            e->ref[i] = (uint32_t)o->nfds;
            o->fds[o->nfds++] = h->fd;
        }
    }
    return 0;
}

static int encode_object(enc *e, size_t i)
{
    const mp__attach *a = &e->m->att[i];
    const mp__objkind *k = a->ops;
    mp__frame_out *o = e->o;
    unsigned char scratch[OBJ_SCRATCH];
    size_t len = 0;
    int nfds = 0, rc;
    rc = k->encode(a->u.obj, scratch, sizeof scratch, &len, o->fds + o->nfds,
                   MP__WIRE_MAX_FDS - 1 - o->nfds, &nfds);
    if (rc == MP_EOVERFLOW && o->nfds > 0)
        return mp__error(MP_EOVERFLOW, "sending a message: %s attachment %zu does not fit: the "
                         "message's tensors and earlier objects already use %d of the %d file "
                         "descriptors a message carries; send them in several messages",
                         k->name, i, o->nfds, MP__WIRE_MAX_FDS - 1);
    if (rc < 0)
        return rc;
    if (len > sizeof scratch || nfds < 0 || nfds > MP__WIRE_MAX_FDS - 1 - o->nfds)
        return mp__error(MP_EOVERFLOW, "sending a message: %s attachment %zu is too large",
                         k->name, i);
    e->objs[i].bytes = malloc(len ? len : 1);
    if (!e->objs[i].bytes)
        return mp__error(MP_ENOMEM, "sending a message: out of memory");
    memcpy(e->objs[i].bytes, scratch, len);
    e->objs[i].len = len;
    e->objs[i].fd_first = o->nfds;
    e->objs[i].nfds = nfds;
    o->nfds += nfds;
    return 0;
}

static uint64_t tensor_rec_len(const mp_tensor *t)
{
    return sizeof(mp__frame_tensor) + 16u * (uint64_t)mp_tensor_ndim(t);
}

static uint64_t attach_body_len(const enc *e, size_t i)
{
    const mp__attach *a = &e->m->att[i];
    if (a->kind == MP_ATTACH_TENSOR) {
        mp_tensor *g = mp_tensor_grad(a->u.tensor);
        return tensor_rec_len(a->u.tensor) + (g ? tensor_rec_len(g) : 0);
    }
    return sizeof(mp__frame_object) + e->objs[i].len;
}

static uint64_t body_len(const enc *e)
{
    uint64_t n = 0;
    for (int i = 0; i < e->nseg; i++) {
        n += sizeof(mp__frame_storage);
        if (e->o->handles[i].strategy == MP__STRATEGY_FS)
            n += mp__pad8(strlen(e->o->handles[i].name));
        else if (e->o->handles[i].strategy == MP__FRAME_STORAGE_PINNED)
            n += sizeof(mp__pin_ref);
    }
    n += mp__pad8(e->m->len);
    for (size_t i = 0; i < e->m->count; i++) {
        const mp__attach *a = &e->m->att[i];
        n += sizeof(mp__frame_attach) + mp__pad8(a->name_len);
        n += mp__pad8(attach_body_len(e, i));
    }
    return n;
}

static unsigned char *put(unsigned char *p, const void *src, size_t n)
{
    if (n)
        memcpy(p, src, n);
    memset(p + n, 0, mp__pad8(n) - n);
    return p + mp__pad8(n);
}

static unsigned char *put_tensor(const enc *e, unsigned char *p, const mp_tensor *t, bool grad)
{
    mp__frame_tensor ft;
    int nd = mp_tensor_ndim(t);
    ft.storage = (uint32_t)seg_index(e, storage_key(t));
    ft.dtype = (uint32_t)mp_tensor_dtype(t);
    ft.ndim = (uint32_t)nd;
    ft.flags = grad ? MP__FRAME_TENSOR_GRAD : 0;
    ft.byte_offset = mp_tensor_byte_offset(t);
    memcpy(p, &ft, sizeof ft);
    p += sizeof ft;
    memcpy(p, mp_tensor_shape(t), 8u * (size_t)nd);
    p += 8u * (size_t)nd;
    memcpy(p, mp_tensor_strides(t), 8u * (size_t)nd);
    return p + 8u * (size_t)nd;
}

static void write_body(const enc *e, unsigned char *p)
{
    for (int i = 0; i < e->nseg; i++) {
        const mp__segment_handle *h = &e->o->handles[i];
        size_t nl = h->strategy == MP__STRATEGY_FS ? strlen(h->name) : 0;
        mp__frame_storage fs = {(uint32_t)h->strategy, nl ? (uint32_t)nl : e->ref[i], h->size};
        p = put(p, &fs, sizeof fs);
        if (nl)
            p = put(p, h->name, nl);
        else if (h->strategy == MP__FRAME_STORAGE_PINNED)
            p = put(p, &e->o->pinned[i], sizeof e->o->pinned[i]);
    }
    p = put(p, e->m->payload, e->m->len);
    for (size_t i = 0; i < e->m->count; i++) {
        const mp__attach *a = &e->m->att[i];
        size_t nl = a->name_len;
        uint64_t bl = attach_body_len(e, i);
        mp__frame_attach fa = {(uint16_t)a->kind, a->name ? (uint16_t)nl : MP__FRAME_NO_NAME,
                               (uint32_t)bl};
        unsigned char *start;
        p = put(p, &fa, sizeof fa);
        if (a->name)
            p = put(p, a->name, nl);
        start = p;
        if (a->kind == MP_ATTACH_TENSOR) {
            mp_tensor *g = mp_tensor_grad(a->u.tensor);
            p = put_tensor(e, p, a->u.tensor, g != NULL);
            if (g)
                p = put_tensor(e, p, g, false);
        } else {
            mp__frame_object fo = {(uint32_t)e->objs[i].fd_first, (uint32_t)e->objs[i].nfds};
            memcpy(p, &fo, sizeof fo);
            p += sizeof fo;
            if (e->objs[i].len)
                memcpy(p, e->objs[i].bytes, e->objs[i].len);
            p += e->objs[i].len;
        }
        memset(p, 0, mp__pad8(bl) - bl);
        p = start + mp__pad8(bl);
    }
}

/* The frame's body goes inline, or into a sealed memfd sent as the last fd. */
static int place_body(enc *e, uint64_t blen, mp__frame_header *h, unsigned char **body)
{
    mp__frame_out *o = e->o;
    mp__segment_handle sh;
    int rc;
    if (blen <= MP__WIRE_INLINE_MAX) {
        o->len = sizeof *h + (size_t)blen;
        if (!(o->buf = malloc(o->len)))
            return mp__error(MP_ENOMEM, "sending a message: cannot allocate a %zu-byte frame",
                             o->len);
        *body = (unsigned char *)o->buf + sizeof *h;
        return 0;
    }
    if ((rc = mp__segment_create((size_t)blen, MP__STRATEGY_FD, &o->spill)) < 0)
        return rc;
    if ((rc = mp__segment_export(o->spill, &sh)) < 0)
        return rc;
    o->fds[o->nfds++] = sh.fd;
    h->flags |= MP__FRAME_SPILLED;
    o->len = sizeof *h;
    if (!(o->buf = malloc(o->len)))
        return mp__error(MP_ENOMEM, "sending a message: out of memory");
    *body = mp__segment_data(o->spill);
    return 0;
}

int mp__frame_encode(const mp_msg *m, mp__pins *pins, mp__frame_out *o)
{
    enc e;
    mp__frame_header h = {.magic = MP__FRAME_MAGIC, .version = MP__FRAME_VERSION};
    unsigned char *body = NULL;
    uint64_t blen;
    int rc = 0;
    enc_init(&e, m, o);
    o->buf = NULL;
    o->len = 0;
    o->nfds = 0;
    o->nhandles = 0;
    o->spill = NULL;
    o->pins = pins;
    if (!m)
        return mp__error(MP_EINVAL, "sending a message: message is NULL");
    if (m->count && !(e.objs = calloc(m->count, sizeof *e.objs)))
        return mp__error(MP_ENOMEM, "sending a message: out of memory");
    for (size_t i = 0; i < m->count && rc == 0; i++) {
        const mp__attach *a = &m->att[i];
        mp_tensor *g;
        if (a->kind != MP_ATTACH_TENSOR)
            continue;
        rc = add_storage(&e, a->u.tensor, i);
        if (rc == 0 && (g = mp_tensor_grad(a->u.tensor)))
            rc = add_storage(&e, g, i);
    }
    if (rc == 0)
        rc = export_storages(&e);
    for (size_t i = 0; i < m->count && rc == 0; i++)
        if (m->att[i].kind != MP_ATTACH_TENSOR)
            rc = encode_object(&e, i);
    if (rc < 0)
        goto out_objs;
    blen = body_len(&e);
    if ((rc = place_body(&e, blen, &h, &body)) < 0)
        goto out_objs;
    write_body(&e, body);
    h.nfds = (uint32_t)o->nfds;
    h.nstorages = (uint32_t)e.nseg;
    h.nattach = (uint32_t)m->count;
    h.body_len = blen;
    h.payload_len = m->len;
    memcpy(o->buf, &h, sizeof h);
out_objs:
    for (size_t i = 0; e.objs && i < m->count; i++)
        free(e.objs[i].bytes);
    free(e.objs);
    if (rc < 0)
        mp__frame_out_done(o, false);
    return rc;
}

void mp__frame_out_done(mp__frame_out *o, bool sent)
{
    /* FS exports took an in-flight reference each; the receiver adopts them
     * when the record arrives, so they are given back only if it never left. */
    for (int i = 0; i < o->nhandles && !sent; i++) {
        if (o->handles[i].strategy == MP__STRATEGY_FS)
            mp__segment_handle_drop(&o->handles[i], false);
        else if (o->handles[i].strategy == MP__FRAME_STORAGE_PINNED)
            mp__pins_unreserve(o->pins, &o->pinned[i]); /* the same for a pin's count */
    }
    o->nhandles = 0;
    mp__segment_release(o->spill);
    o->spill = NULL;
    free(o->buf);
    o->buf = NULL;
    o->nfds = 0;
}

int mp__wire_encode(const mp_msg *m, void **buf, size_t *len, int *fds, int *nfds)
{
    mp__frame_out *o;
    int rc;
    if (!buf || !len || !fds || !nfds)
        return mp__error(MP_EINVAL, "mp__wire_encode: an out-parameter is NULL");
    *buf = NULL;
    *len = 0;
    *nfds = 0;
    if (!(o = malloc(sizeof *o)))
        return mp__error(MP_ENOMEM, "mp__wire_encode: out of memory");
    if ((rc = mp__frame_encode(m, NULL, o)) == 0) {
        /* The fds stay valid while the message holds its storages; a spill
         * segment would be unmapped and closed here, so it is refused. */
        if (o->spill) {
            rc = mp__error(MP_EOVERFLOW, "mp__wire_encode: body of %zu+ bytes needs a spill "
                                         "segment; use mp__wire_send", (size_t)MP__WIRE_INLINE_MAX);
            mp__frame_out_done(o, false);
        } else {
            *buf = o->buf;
            *len = o->len;
            memcpy(fds, o->fds, sizeof(int) * (size_t)o->nfds);
            *nfds = o->nfds;
            o->buf = NULL;
            mp__frame_out_done(o, true);
        }
    }
    free(o);
    return rc;
}
