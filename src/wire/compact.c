/* The compact record: a message of one tensor whose storage the receiving
 * end pinned (shm/pins.h), as the bytes of one ring slot.
 *
 * A buffer sent again and again to the same end (a batch tensor reused
 * every step) is the case pins exist for, and there the general frame was
 * most of the cost: a storage table, an attachment table, two decoding
 * passes, a dozen checks that a one-tensor message cannot fail, and eight
 * allocations. The compact record is the pin reference, the view and the
 * payload, written straight into a stack buffer; its decoder checks the
 * same things the frame decoder checks of one tensor (dtype, ndim, the
 * view inside the storage, every length) and builds the message directly.
 * Anything else (two attachments, a grad, an object, a storage not pinned,
 * a record larger than a slot) goes as a frame, as before. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor_internal.h"
#include "wire/frame.h"

#define BAD(...) mp__error(MP_EPROTO, "receiving a message: malformed compact record: " __VA_ARGS__)

/* The sizes of everything after the fixed part. */
static size_t tail_len(const mp__compact *c)
{
    size_t views = (c->flags & MP__COMPACT_STRIDES) ? 2u : 1u;
    return ((c->flags & MP__COMPACT_OFFSET) ? 8u : 0u) + 8u * views * c->ndim +
           (c->name_len == MP__FRAME_NO_NAME ? 0 : c->name_len) + c->payload_len;
}

static unsigned char *put(unsigned char *p, const void *src, size_t n)
{
    memcpy(p, src, n);
    return p + n;
}

/* n int64s, one at a time: for the few of a shape, a memcpy of unknown
 * length costs more than the copy (a rep movs' start-up). The empty asm
 * keeps compilers from making the loop that memcpy again. */
static void copy64(void *dst, const void *src, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        memcpy((char *)dst + 8u * i, (const char *)src + 8u * i, 8);
        __asm__ volatile("" ::: "memory");
    }
}

int mp__compact_encode(const mp_msg *m, mp__pins *pins, void *buf, size_t cap, size_t *len,
                       mp__pin_ref *ref)
{
    const mp__attach *a = m->count == 1 ? &m->att[0] : NULL;
    mp__tensor_view t;
    mp__compact c = {0};
    unsigned char *p = buf;
    size_t name_len = 0, need;
    if (!pins || !a || a->ops)
        return 0;
    mp__tensor_view_of(a->u.tensor, &t);
    if (t.has_grad || !t.seg || (name_len = a->name_len) > MP_MSG_NAME_MAX)
        return 0;
    c.dtype = (uint8_t)t.dtype;
    c.ndim = (uint8_t)t.ndim;
    c.flags = (t.canonical ? 0 : MP__COMPACT_STRIDES) | (t.byte_offset ? MP__COMPACT_OFFSET : 0);
    c.name_len = a->name ? (uint16_t)name_len : MP__FRAME_NO_NAME;
    c.size = mp__segment_size(t.seg);
    if (m->len > cap || (c.payload_len = (uint32_t)m->len,
                         need = sizeof c + tail_len(&c)) > cap ||
        !mp__pins_reserve(pins, t.seg, ref))
        return 0;
    /* c goes out first and the pin's fields after, each as it was stored:
     * copying c once they are in would wait on stores of mixed sizes */
    memcpy(p, &c, sizeof c);
    memcpy(p + offsetof(mp__compact, pin_gen), &ref->gen, sizeof c.pin_gen);
    c.pin_slot = (uint16_t)ref->slot;
    memcpy(p + offsetof(mp__compact, pin_slot), &c.pin_slot, sizeof c.pin_slot);
    memcpy(p + offsetof(mp__compact, sender_pid), &ref->sender_pid, sizeof c.sender_pid);
    memcpy(p + offsetof(mp__compact, sender_fd), &ref->sender_fd, sizeof c.sender_fd);
    p += sizeof c;
    if (t.byte_offset)
        p = put(p, &t.byte_offset, sizeof t.byte_offset);
    copy64(p, t.shape, c.ndim);
    p += 8u * c.ndim;
    if (c.flags & MP__COMPACT_STRIDES) {
        copy64(p, t.strides, c.ndim);
        p += 8u * c.ndim;
    }
    p = put(p, a->name ? a->name : "", name_len);
    if (m->len)
        memcpy(p, m->payload, m->len);
    *len = need;
    return 1;
}

/* The checks of the frame decoder, for one tensor; c's fixed part is read. */
static int check(const mp__compact *c, size_t len)
{
    if (c->dtype >= MP_DTYPE_COUNT)
        return BAD("unknown dtype %u", c->dtype);
    if (c->ndim > MP_MAX_NDIM)
        return BAD("ndim %u exceeds %d", c->ndim, MP_MAX_NDIM);
    if (c->flags & ~(uint8_t)(MP__COMPACT_STRIDES | MP__COMPACT_OFFSET))
        return BAD("unknown flags 0x%x", c->flags);
    if (c->name_len != MP__FRAME_NO_NAME && c->name_len > MP_MSG_NAME_MAX)
        return BAD("name of %u bytes (at most %d)", c->name_len, MP_MSG_NAME_MAX);
    if (c->size == 0 || c->size > MP__WIRE_BODY_MAX)
        return BAD("storage size %llu is outside [1, 2^40]", (unsigned long long)c->size);
    if (len != sizeof *c + tail_len(c))
        return BAD("%zu bytes, but its fields add up to %zu", len, sizeof *c + tail_len(c));
    return 0; /* the view: mp__tensor_make checks it against the storage */
}

/* The view a record describes. */
typedef struct view {
    mp_dtype dtype;
    int ndim;
    int64_t shape[MP_MAX_NDIM];
    int64_t strides[MP_MAX_NDIM];
    uint64_t offset;
} view;

static void release_tensor(void *t) { mp_tensor_release(t); }

/* The pin's keepsake, retained, when nobody else holds it and it is the
 * record's view (under the pins lock: it takes none). */
static void *take_kept(void *kept, void *ctx)
{
    const view *v = ctx;
    return mp__tensor_is_sole_view(kept, v->dtype, v->ndim, v->shape, v->strides, v->offset)
               ? mp_tensor_retain(kept)
               : NULL;
}

/* A new tensor of v over seg, which becomes the pin's keepsake: a buffer
 * sent again and again then costs no tensor, storage or lock of theirs. */
static int tensor_of(mp__pins *pins, const mp__pin_ref *ref, mp__segment *seg, const view *v,
                     mp_tensor **out)
{
    mp__storage *st = NULL;
    int rc;
    if ((rc = mp__storage_from_segment(seg, &st)) < 0)
        return rc;
    rc = mp__tensor_make("receiving a message", st, v->dtype, v->ndim, v->shape, v->strides,
                         v->offset, out);
    mp__storage_release(st);
    if (rc == MP_EINVAL || rc == MP_EOVERFLOW) {
        char why[256];
        snprintf(why, sizeof why, "%s", mp_last_error());
        return BAD("%s", why);
    }
    if (rc == 0)
        mp__pins_keep(pins, ref, mp_tensor_retain(*out), release_tensor);
    return rc;
}

/* The message of c around t (whose reference it takes). */
static int build(const mp__compact *c, mp_tensor *t, const unsigned char *name,
                 const unsigned char *payload, mp_msg **out)
{
    mp_msg *m = NULL;
    int rc;
    if ((rc = mp_msg_create(&m)) < 0 || (rc = mp_msg_set_payload(m, payload, c->payload_len)) < 0 ||
        (rc = mp__msg_push(m, NULL, c->name_len == MP__FRAME_NO_NAME ? NULL : (const char *)name,
                           c->name_len, t)) < 0) {
        mp_tensor_release(t);
        mp_msg_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

int mp__compact_decode(mp__pins *pins, const void *buf, size_t len, mp_msg **out)
{
    const unsigned char *p = buf;
    view v; /* not zeroed: 280 bytes, of which a record fills a few */
    mp__compact c;
    mp__pin_ref ref;
    mp__segment *seg = NULL;
    mp_tensor *t = NULL;
    mp__pins_reuse reuse = {take_kept, &v, NULL};
    int rc;
    *out = NULL;
    if (len < sizeof c) /* too short to name a pin: no count to give back */
        return BAD("%zu bytes, shorter than its fixed part (%zu)", len, sizeof c);
    memcpy(&c, p, sizeof c);
    p += sizeof c;
    ref = (mp__pin_ref){.slot = c.pin_slot, .gen = c.pin_gen, .sender_pid = c.sender_pid,
                        .sender_fd = c.sender_fd};
    if (!mp__pins_ref_ok(&ref))
        return BAD("pin slot %u is out of range", ref.slot);
    if ((rc = check(&c, len)) < 0) {
        mp__pins_drop(pins, &ref);
        return rc;
    }
    v.dtype = (mp_dtype)c.dtype;
    v.ndim = c.ndim;
    v.offset = 0;
    if (c.flags & MP__COMPACT_OFFSET) {
        memcpy(&v.offset, p, sizeof v.offset);
        p += sizeof v.offset;
    }
    copy64(v.shape, p, c.ndim);
    p += 8u * c.ndim;
    if (c.flags & MP__COMPACT_STRIDES) {
        copy64(v.strides, p, c.ndim);
        p += 8u * c.ndim;
    } else if (!mp__contiguous_strides(v.ndim, v.shape, v.strides)) {
        /* the shape is unchecked yet (mp__tensor_make rejects negative sizes) */
        mp__pins_drop(pins, &ref);
        return BAD("shape of %u dimensions overflows", c.ndim);
    }
    if (c.name_len != MP__FRAME_NO_NAME && memchr(p, '\0', c.name_len)) {
        mp__pins_drop(pins, &ref);
        return BAD("the name holds a NUL byte");
    }
    if ((rc = mp__pins_open(pins, &ref, c.size, &seg, &reuse)) < 0)
        return rc; /* it gave the count back */
    if (!(t = reuse.got)) {
        rc = tensor_of(pins, &ref, seg, &v, &t);
        mp__segment_release(seg);
        if (rc < 0)
            return rc;
    }
    return build(&c, t, p, p + (c.name_len == MP__FRAME_NO_NAME ? 0 : c.name_len), out);
}
