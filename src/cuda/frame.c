/* Encoding and validation of the CUDA tensor attachment (see frame.h). */
#include "cuda/frame.h"

#include <stdio.h>
#include <string.h>

#include "cuda/refseg.h"
#include "tensor/tensor_internal.h"

typedef struct cursor {
    uint8_t *p;
    const uint8_t *r;
    size_t left;
} cursor;

static void put(cursor *c, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        *c->p++ = (uint8_t)(v >> (8 * i));
}

static uint64_t get(cursor *c, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)*c->r++ << (8 * i);
    c->left -= (size_t)bytes;
    return v;
}

static size_t frame_size(int ndim) { return MP__CUDA_FRAME_FIXED + 16 * (size_t)ndim; }

/* Everything but the view geometry, which needs the tensor layer. */
static int check_fields(const mp__cuda_frame *f, int code, const char *who)
{
    if (f->device < 0 || f->device >= MP__CUDA_MAX_DEVICE)
        return mp__error(code, "%s: CUDA device %d out of range", who, f->device);
    if (f->dtype < 0 || f->dtype >= MP_DTYPE_COUNT)
        return mp__error(code, "%s: unknown dtype %d", who, f->dtype);
    if (f->ndim < 0 || f->ndim > MP_MAX_NDIM)
        return mp__error(code, "%s: ndim %d out of range 0..%d", who, f->ndim, MP_MAX_NDIM);
    if (f->producer_pid == 0 || f->alloc_nbytes == 0)
        return mp__error(code, "%s: missing producer pid or allocation size", who);
    if (f->slot >= MP__REFSEG_MAX_SLOTS || f->gen > 0xffffu || f->ref >= MP__REFSEG_MAX_REFS)
        return mp__error(code, "%s: slot %u, generation %u or reference %u out of range", who,
                         f->slot, f->gen, f->ref);
    if (mp__refword_pid(f->ref_word) == 0 || mp__refword_slot(f->ref_word) != f->slot ||
        mp__refword_gen(f->ref_word) != f->gen)
        return mp__error(code, "%s: reference word does not match slot %u generation %u", who,
                         f->slot, f->gen);
    return 0;
}

int mp__cuda_frame_encode(const mp__cuda_frame *f, void *buf, size_t cap, size_t *len)
{
    int rc;
    if (!f || !buf || !len)
        return mp__error(MP_EINVAL, "mp__cuda_frame_encode: NULL argument");
    if ((rc = check_fields(f, MP_EINVAL, "sending a CUDA tensor")) < 0)
        return rc;
    size_t need = frame_size(f->ndim);
    if (cap < need)
        return mp__error(MP_EOVERFLOW, "sending a CUDA tensor: its %zu-byte attachment does not "
                                       "fit the %zu bytes left in the frame", need, cap);
    cursor c = {.p = buf};
    put(&c, MP__CUDA_FRAME_MAGIC, 4);
    put(&c, MP__CUDA_FRAME_VERSION, 2);
    put(&c, f->has_event ? 1u : 0u, 2);
    put(&c, (uint32_t)f->device, 4);
    put(&c, (uint32_t)f->dtype, 4);
    put(&c, (uint32_t)f->ndim, 4);
    put(&c, f->producer_pid, 4);
    put(&c, f->slot, 4);
    put(&c, f->gen, 4);
    put(&c, f->ref, 4);
    put(&c, 0, 4); /* keeps the 64-bit fields aligned; must be zero */
    put(&c, f->ref_word, 8);
    put(&c, f->alloc_nbytes, 8);
    put(&c, f->byte_offset, 8);
    memcpy(c.p, f->mem_handle, MP__CUDA_HANDLE_BYTES);
    c.p += MP__CUDA_HANDLE_BYTES;
    if (f->has_event)
        memcpy(c.p, f->event_handle, MP__CUDA_HANDLE_BYTES);
    else
        memset(c.p, 0, MP__CUDA_HANDLE_BYTES);
    c.p += MP__CUDA_HANDLE_BYTES;
    for (int i = 0; i < f->ndim; i++)
        put(&c, (uint64_t)f->shape[i], 8);
    for (int i = 0; i < f->ndim; i++)
        put(&c, (uint64_t)f->strides[i], 8);
    *len = need;
    return 0;
}

int mp__cuda_frame_decode(const void *buf, size_t len, mp__cuda_frame *f)
{
    const char *who = "CUDA tensor attachment";
    int rc;
    if (!buf || !f)
        return mp__error(MP_EINVAL, "mp__cuda_frame_decode: NULL argument");
    memset(f, 0, sizeof *f);
    if (len < MP__CUDA_FRAME_FIXED)
        return mp__error(MP_EPROTO, "%s: %zu bytes, need at least %d", who, len,
                         MP__CUDA_FRAME_FIXED);
    cursor c = {.r = buf, .left = len};
    uint32_t magic = (uint32_t)get(&c, 4), version = (uint32_t)get(&c, 2);
    uint32_t flags = (uint32_t)get(&c, 2);
    if (magic != MP__CUDA_FRAME_MAGIC || version != MP__CUDA_FRAME_VERSION || flags > 1)
        return mp__error(MP_EPROTO, "%s: bad magic, version %u or flags %#x", who, version,
                         flags);
    f->has_event = flags & 1;
    f->device = (int32_t)get(&c, 4);
    f->dtype = (int32_t)get(&c, 4);
    f->ndim = (int32_t)get(&c, 4);
    f->producer_pid = (uint32_t)get(&c, 4);
    f->slot = (uint32_t)get(&c, 4);
    f->gen = (uint32_t)get(&c, 4);
    f->ref = (uint32_t)get(&c, 4);
    if (get(&c, 4) != 0)
        return mp__error(MP_EPROTO, "%s: reserved field is not zero", who);
    f->ref_word = get(&c, 8);
    f->alloc_nbytes = get(&c, 8);
    f->byte_offset = get(&c, 8);
    if ((rc = check_fields(f, MP_EPROTO, who)) < 0)
        return rc;
    if (len != frame_size(f->ndim))
        return mp__error(MP_EPROTO, "%s: %zu bytes for ndim %d, expected %zu", who, len,
                         f->ndim, frame_size(f->ndim));
    memcpy(f->mem_handle, c.r, MP__CUDA_HANDLE_BYTES);
    c.r += MP__CUDA_HANDLE_BYTES;
    memcpy(f->event_handle, c.r, MP__CUDA_HANDLE_BYTES);
    c.r += MP__CUDA_HANDLE_BYTES;
    c.left -= 2 * MP__CUDA_HANDLE_BYTES;
    for (int i = 0; i < f->ndim; i++)
        f->shape[i] = (int64_t)get(&c, 8);
    for (int i = 0; i < f->ndim; i++)
        f->strides[i] = (int64_t)get(&c, 8);
    if (f->alloc_nbytes > SIZE_MAX)
        return mp__error(MP_EPROTO, "%s: allocation of %llu bytes", who,
                         (unsigned long long)f->alloc_nbytes);
    rc = mp__tensor_check_geometry(who, (mp_dtype)f->dtype, f->ndim, f->shape, f->strides,
                                   f->byte_offset, (size_t)f->alloc_nbytes);
    if (rc < 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", mp_last_error());
        return mp__error(MP_EPROTO, "%s: the view does not fit its %llu-byte allocation: %s",
                         who, (unsigned long long)f->alloc_nbytes, why);
    }
    return 0;
}
