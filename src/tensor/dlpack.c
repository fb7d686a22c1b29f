/* The DLPack bridge: export a view as a DLManagedTensor, import one without
 * copying. */
#include "shm/recycle.h"
#include "tensor/tensor_priv.h"

#include <stdlib.h>

/* The exported tensor's shape and strides point into the mp_tensor, whose
 * geometry never changes; the export holds a reference to it. */
static void export_deleter(DLManagedTensor *m)
{
    mp_tensor *t = m->manager_ctx;
    atomic_fetch_sub(&t->storage->exports, 1);
    mp_tensor_release(t);
    free(m);
}

int mp_tensor_to_dlpack(mp_tensor *t, DLManagedTensor **out)
{
    DLManagedTensor *m;
    if (!t || !out)
        return mp__error(MP_EINVAL, "mp_tensor_to_dlpack: NULL tensor or out");
    m = calloc(1, sizeof *m);
    if (!m)
        return mp__error(MP_ENOMEM, "mp_tensor_to_dlpack: out of memory");
    /* counted first: share_memory_ refuses to move a storage while exported */
    atomic_fetch_add(&t->storage->exports, 1);
    /* The consumer may hand the pointer on: the segment is never reused. */
    mp__segment_mark_exported(t->storage->seg);
    m->dl_tensor.data = t->storage->data;
    m->dl_tensor.byte_offset = t->offset;
    m->dl_tensor.device = t->storage->dev;
    m->dl_tensor.ndim = t->ndim;
    m->dl_tensor.dtype = mp_dtype_to_dlpack(t->dtype);
    m->dl_tensor.shape = t->shape;
    m->dl_tensor.strides = t->strides;
    m->manager_ctx = mp_tensor_retain(t);
    m->deleter = export_deleter;
    *out = m;
    return 0;
}

static void import_release(void *data, void *ctx)
{
    DLManagedTensor *m = ctx;
    if (m->deleter)
        m->deleter(m);
}

/* CPU and CUDA memory only: nothing in mproc can read, copy or send any
 * other device's (a tensor of it would fail at every later call). */
static int check_device(DLDevice dev)
{
    char name[48];
    if (dev.device_type != kDLCPU && dev.device_type != kDLCUDA)
        return mp__error(MP_ENOTSUP, "mp_tensor_from_dlpack: the tensor is on %s; mproc holds "
                                     "CPU and CUDA tensors: move it to one first",
                         mp__device_label(dev, name, sizeof name));
    if (dev.device_id < 0)
        return mp__error(MP_EINVAL, "mp_tensor_from_dlpack: negative device id %d",
                         dev.device_id);
    return 0;
}

int mp_tensor_from_dlpack(DLManagedTensor *m, mp_tensor **out)
{
    int64_t contig[MP_MAX_NDIM], lo, end;
    char *first;
    const DLTensor *dl;
    const int64_t *strides;
    mp__storage *s;
    mp_dtype dtype;
    size_t nbytes;
    int rc;
    if (!m || !out)
        return mp__error(MP_EINVAL, "mp_tensor_from_dlpack: NULL managed tensor or out");
    *out = NULL;
    dl = &m->dl_tensor;
    if ((rc = check_device(dl->device)) < 0)
        return rc;
    rc = mp_dtype_from_dlpack(dl->dtype, &dtype);
    if (rc == 0)
        rc = mp__shape_nbytes("mp_tensor_from_dlpack", dtype, dl->ndim, dl->shape, &nbytes);
    if (rc < 0)
        return rc;
    if (!dl->data && nbytes)
        return mp__error(MP_EINVAL, "mp_tensor_from_dlpack: data is NULL");
    strides = dl->strides;
    if (!strides) { /* DLPack: NULL strides mean compact row-major */
        mp__contiguous_strides(dl->ndim, dl->shape, contig);
        strides = contig;
    }
    /* The foreign allocation's size is unknown: the storage is exactly the
     * bytes the view reaches, which may start before data + byte_offset
     * when strides are negative. */
    rc = mp__view_span("mp_tensor_from_dlpack", dtype, dl->ndim, dl->shape, strides, &lo, &end);
    if (rc < 0)
        return rc;
    if (dl->byte_offset > (uint64_t)INT64_MAX)
        return mp__error(MP_EOVERFLOW, "mp_tensor_from_dlpack: byte offset out of range");
    first = (char *)dl->data + dl->byte_offset + lo;
    rc = mp__storage_wrap(first, (size_t)(end - lo), dl->device, import_release, m, &s);
    if (rc < 0)
        return rc;
    rc = mp__tensor_make("mp_tensor_from_dlpack", s, dtype, dl->ndim, dl->shape, strides,
                         (uint64_t)-lo, out);
    if (rc < 0)
        s->release = NULL; /* on failure the caller still owns m */
    mp__storage_release(s);
    return rc;
}
