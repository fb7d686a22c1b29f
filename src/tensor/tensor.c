/* Tensors: geometry checks, creation, properties, grad and sharing. */
#include "tensor/tensor_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MUL(a, b, r) __builtin_mul_overflow(a, b, r)
#define ADD(a, b, r) __builtin_add_overflow(a, b, r)
#define SUB(a, b, r) __builtin_sub_overflow(a, b, r)

static int check_header(const char *call, mp_dtype dtype, int ndim, const int64_t *shape)
{
    if ((unsigned)dtype >= MP_DTYPE_COUNT)
        return mp__error(MP_EINVAL, "%s: unknown dtype %d", call, (int)dtype);
    if (ndim < 0 || ndim > MP_MAX_NDIM)
        return mp__error(MP_EINVAL, "%s: ndim %d outside 0..%d", call, ndim, MP_MAX_NDIM);
    if (ndim > 0 && !shape)
        return mp__error(MP_EINVAL, "%s: shape is NULL for ndim %d", call, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return mp__error(MP_EINVAL, "%s: dim %d has negative size %lld", call, i,
                             (long long)shape[i]);
    return 0;
}

int mp__shape_nbytes(const char *call, mp_dtype dtype, int ndim, const int64_t *shape,
                     size_t *nbytes)
{
    int64_t n = 1;
    int rc = check_header(call, dtype, ndim, shape);
    if (rc < 0)
        return rc;
    for (int i = 0; i < ndim; i++)
        if (MUL(n, shape[i], &n))
            return mp__error(MP_EOVERFLOW, "%s: the element count overflows at dim %d", call, i);
    if (MUL(n, (int64_t)mp_dtype_size(dtype), &n))
        return mp__error(MP_EOVERFLOW, "%s: %lld %s elements overflow a byte size", call,
                         (long long)n, mp_dtype_name(dtype));
    *nbytes = (size_t)n;
    return 0;
}

int mp__view_span(const char *call, mp_dtype dtype, int ndim, const int64_t *shape,
                  const int64_t *strides, int64_t *lo, int64_t *end)
{
    int64_t es = (int64_t)mp_dtype_size(dtype), span;
    *lo = *end = 0;
    for (int i = 0; i < ndim; i++) {
        int64_t e;
        if (shape[i] == 0) { /* reaches nothing at all */
            *lo = *end = 0;
            return 0;
        }
        if (MUL(shape[i] - 1, strides[i], &e))
            return mp__error(MP_EOVERFLOW, "%s: dim %d's stride %lld times its size %lld "
                             "overflows int64", call, i, (long long)strides[i],
                             (long long)shape[i]);
        if (ADD(e > 0 ? *end : *lo, e, e > 0 ? end : lo))
            return mp__error(MP_EOVERFLOW, "%s: the strides of dims 0..%d together reach past "
                             "2^63 elements", call, i);
    }
    if (MUL(*lo, es, lo) || ADD(*end, 1, end) || MUL(*end, es, end) || SUB(*end, *lo, &span))
        return mp__error(MP_EOVERFLOW, "%s: the view's byte range overflows", call);
    return 0;
}

int mp__tensor_check_geometry(const char *call, mp_dtype dtype, int ndim, const int64_t *shape,
                              const int64_t *strides, uint64_t byte_offset, size_t nbytes)
{
    int64_t lo, hi, first, end;
    size_t total;
    int rc = mp__shape_nbytes(call, dtype, ndim, shape, &total);
    if (rc < 0)
        return rc;
    if (ndim > 0 && !strides)
        return mp__error(MP_EINVAL, "%s: strides is NULL for ndim %d", call, ndim);
    if (byte_offset > (uint64_t)INT64_MAX)
        return mp__error(MP_EOVERFLOW, "%s: byte offset %llu out of range", call,
                         (unsigned long long)byte_offset);
    if (total == 0) { /* reaches no element */
        if (byte_offset > nbytes)
            return mp__error(MP_EINVAL, "%s: byte offset %llu beyond the %zu-byte storage", call,
                             (unsigned long long)byte_offset, nbytes);
        return 0;
    }
    rc = mp__view_span(call, dtype, ndim, shape, strides, &lo, &hi);
    if (rc < 0)
        return rc;
    if (ADD((int64_t)byte_offset, lo, &first) || ADD((int64_t)byte_offset, hi, &end))
        return mp__error(MP_EOVERFLOW, "%s: byte range overflows", call);
    if (first < 0)
        return mp__error(MP_EINVAL,
                         "%s: strides reach %lld bytes before the start of the storage", call,
                         (long long)-first);
    if ((uint64_t)end > nbytes)
        return mp__error(MP_EINVAL, "%s: strides reach byte %lld of a %zu-byte storage", call,
                         (long long)end, nbytes);
    return 0;
}

const char *mp__device_label(DLDevice dev, char *buf, size_t cap)
{
    static const char *const names[] = {
        [kDLCUDA] = "cuda",         [kDLCUDAHost] = "cuda_host",
        [kDLOpenCL] = "opencl",     [kDLVulkan] = "vulkan",     [kDLMetal] = "metal",
        [kDLVPI] = "vpi",           [kDLROCM] = "rocm",         [kDLROCMHost] = "rocm_host",
        [kDLExtDev] = "ext_dev",    [kDLCUDAManaged] = "cuda_managed"};
    int type = (int)dev.device_type;
    if (type == kDLCPU) /* one CPU device: no index */
        snprintf(buf, cap, "cpu");
    else if (type > 0 && type < (int)(sizeof names / sizeof names[0]) && names[type])
        snprintf(buf, cap, "%s:%d", names[type], dev.device_id);
    else
        snprintf(buf, cap, "DLPack device type %d", type);
    return buf;
}

/* "[4, 6]": t's shape as a sentence shows it, in buf. */
#define SHAPE_TEXT (MP_MAX_NDIM * 22 + 3)
static const char *shape_text(const mp_tensor *t, char *buf)
{
    size_t n = (size_t)snprintf(buf, SHAPE_TEXT, "[");
    for (int i = 0; i < t->ndim; i++)
        n += (size_t)snprintf(buf + n, SHAPE_TEXT - n, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    snprintf(buf + n, SHAPE_TEXT - n, "]");
    return buf;
}

int mp__tensor_check_same_layout(const char *call, const mp_tensor *dst, const mp_tensor *src)
{
    char a[SHAPE_TEXT], b[SHAPE_TEXT];
    if (dst->dtype != src->dtype)
        return mp__error(MP_EINVAL, "%s: dst is %s, src %s; copy between tensors of one dtype",
                         call, mp_dtype_name(dst->dtype), mp_dtype_name(src->dtype));
    if (dst->ndim != src->ndim ||
        memcmp(dst->shape, src->shape, sizeof(int64_t) * (size_t)src->ndim) != 0)
        return mp__error(MP_EINVAL, "%s: dst has shape %s, src %s; copy between tensors of one "
                                    "shape", call, shape_text(dst, a), shape_text(src, b));
    return 0;
}

bool mp__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        if (__builtin_mul_overflow(s, shape[i] > 0 ? shape[i] : 1, &s))
            return false;
    }
    return true;
}

/* Whether strides are exactly mp__contiguous_strides(shape) (which
 * mp_tensor_is_contiguous, ignoring sizes of 1, need not say). */
static bool canonical(int ndim, const int64_t *shape, const int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (strides[i] != s)
            return false;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
    return true;
}

int mp__tensor_make(const char *call, mp__storage *s, mp_dtype dtype, int ndim,
                    const int64_t *shape, const int64_t *strides, uint64_t byte_offset,
                    mp_tensor **out)
{
    mp_tensor *t;
    int rc;
    if (!s || !out)
        return mp__error(MP_EINVAL, "%s: NULL storage or out", call);
    rc = mp__tensor_check_geometry(call, dtype, ndim, shape, strides, byte_offset, s->nbytes);
    if (rc < 0)
        return rc;
    t = mp__zalloc(sizeof *t);
    if (!t)
        return mp__error(MP_ENOMEM, "%s: out of memory for a tensor", call);
    atomic_init(&t->refs, 1);
    t->storage = mp__storage_retain(s);
    t->dtype = dtype;
    t->ndim = ndim;
    if (ndim) {
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
        memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
    }
    t->offset = byte_offset;
    t->canonical = canonical(ndim, shape, strides);
    *out = t;
    return 0;
}

void mp__tensor_view_of(const mp_tensor *t, mp__tensor_view *v)
{
    v->seg = t->storage->dev.device_type == kDLCPU ? t->storage->seg : NULL;
    v->shape = t->shape;
    v->strides = t->strides;
    v->byte_offset = t->offset;
    v->dtype = t->dtype;
    v->ndim = t->ndim;
    v->has_grad = t->grad != NULL;
    v->canonical = t->canonical;
}

bool mp__tensor_is_sole_view(const mp_tensor *t, mp_dtype dtype, int ndim, const int64_t *shape,
                             const int64_t *strides, uint64_t byte_offset)
{
    if (atomic_load(&t->refs) != 1 || t->grad || t->dtype != dtype || t->ndim != ndim ||
        t->offset != byte_offset)
        return false;
    for (int i = 0; i < ndim; i++) /* a loop: a memcmp call costs more for a few */
        if (t->shape[i] != shape[i] || t->strides[i] != strides[i])
            return false;
    return true;
}

/* A contiguous tensor over s; drops the caller's reference to s. */
static int make_contiguous(const char *call, mp__storage *s, mp_dtype dtype, int ndim,
                           const int64_t *shape, mp_tensor **out)
{
    int64_t strides[MP_MAX_NDIM];
    int rc;
    mp__contiguous_strides(ndim, shape, strides);
    rc = mp__tensor_make(call, s, dtype, ndim, shape, strides, 0, out);
    mp__storage_release(s);
    return rc;
}

int mp_tensor_empty(mp_dtype dtype, int ndim, const int64_t *shape, mp_tensor **out)
{
    mp__storage *s;
    size_t nbytes;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_tensor_empty: out is NULL");
    *out = NULL;
    rc = mp__shape_nbytes("mp_tensor_empty", dtype, ndim, shape, &nbytes);
    if (rc == 0)
        rc = mp__storage_alloc(nbytes, &s);
    return rc < 0 ? rc : make_contiguous("mp_tensor_empty", s, dtype, ndim, shape, out);
}

int mp_tensor_empty_shared(mp_dtype dtype, int ndim, const int64_t *shape, mp_tensor **out)
{
    mp__storage *s;
    size_t nbytes;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_tensor_empty_shared: out is NULL");
    *out = NULL;
    rc = mp__shape_nbytes("mp_tensor_empty_shared", dtype, ndim, shape, &nbytes);
    if (rc < 0)
        return rc;
    rc = mp__storage_shared_new(nbytes, &s);
    return rc < 0 ? rc : make_contiguous("mp_tensor_empty_shared", s, dtype, ndim, shape, out);
}

int mp__tensor_shared_filled(size_t nbytes, const mp__segment_part *parts, int nparts,
                             mp_tensor **out)
{
    int64_t shape = (int64_t)nbytes;
    mp__storage *s;
    int rc;
    if (!out || !parts)
        return mp__error(MP_EINVAL, "mp__tensor_shared_filled: NULL %s", out ? "parts" : "out");
    *out = NULL;
    if (nbytes > (size_t)INT64_MAX)
        return mp__error(MP_EOVERFLOW, "creating a shared segment: %zu bytes is too large",
                         nbytes);
    rc = mp__storage_shared_filled(nbytes, parts, nparts, &s);
    return rc < 0 ? rc
                  : make_contiguous("creating a shared segment", s, MP_UINT8, 1, &shape, out);
}

int mp_tensor_from_blob(void *data, size_t nbytes, mp_dtype dtype, int ndim, const int64_t *shape,
                        const int64_t *strides, mp_release_fn release, void *ctx, mp_tensor **out)
{
    int64_t contig[MP_MAX_NDIM];
    mp__storage *s;
    int rc;
    if (!out || (!data && nbytes))
        return mp__error(MP_EINVAL, "mp_tensor_from_blob: NULL %s", out ? "data" : "out");
    *out = NULL;
    rc = check_header("mp_tensor_from_blob", dtype, ndim, shape);
    if (rc < 0)
        return rc;
    if (!strides) {
        mp__contiguous_strides(ndim, shape, contig);
        strides = contig;
    }
    rc = mp__storage_wrap(data, nbytes, (DLDevice){kDLCPU, 0}, release, ctx, &s);
    if (rc < 0)
        return rc;
    /* mp__tensor_make checks the geometry against the nbytes-byte storage */
    rc = mp__tensor_make("mp_tensor_from_blob", s, dtype, ndim, shape, strides, 0, out);
    if (rc < 0)
        s->release = NULL; /* on failure the caller keeps its memory */
    mp__storage_release(s);
    return rc;
}

mp_tensor *mp_tensor_retain(mp_tensor *t)
{
    if (t)
        atomic_fetch_add(&t->refs, 1);
    return t;
}

void mp_tensor_release(mp_tensor *t)
{
    if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    mp_tensor_release(t->grad);
    mp__storage_release(t->storage);
    free(t);
}

/* ---- properties ---------------------------------------------------------- */

mp_dtype mp_tensor_dtype(const mp_tensor *t)
{
    return t->dtype;
}
int mp_tensor_ndim(const mp_tensor *t)
{
    return t->ndim;
}
const int64_t *mp_tensor_shape(const mp_tensor *t)
{
    return t->shape;
}
const int64_t *mp_tensor_strides(const mp_tensor *t)
{
    return t->strides;
}
uint64_t mp_tensor_byte_offset(const mp_tensor *t)
{
    return t->offset;
}
size_t mp_tensor_element_size(const mp_tensor *t)
{
    return mp_dtype_size(t->dtype);
}
DLDevice mp_tensor_device(const mp_tensor *t)
{
    return t->storage->dev;
}
void *mp_tensor_data(const mp_tensor *t)
{
    return (char *)t->storage->data + t->offset;
}
size_t mp_tensor_storage_nbytes(const mp_tensor *t)
{
    return t->storage->nbytes;
}

int64_t mp_tensor_size(const mp_tensor *t, int dim)
{
    if (dim < 0)
        dim += t->ndim;
    return dim >= 0 && dim < t->ndim ? t->shape[dim] : -1;
}

int64_t mp_tensor_numel(const mp_tensor *t)
{
    int64_t n = 1; /* cannot overflow: checked when the view was made */
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t mp_tensor_nbytes(const mp_tensor *t)
{
    return (size_t)mp_tensor_numel(t) * mp_dtype_size(t->dtype);
}

bool mp_tensor_is_contiguous(const mp_tensor *t)
{
    int64_t expected = 1;
    if (mp_tensor_numel(t) == 0)
        return true;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expected)
            return false;
        expected *= t->shape[i];
    }
    return true;
}

bool mp_tensor_same_storage(const mp_tensor *t, const mp_tensor *u)
{
    return t && u && t->storage == u->storage;
}

/* ---- grad and sharing -------------------------------------------------- */

int mp_tensor_set_grad(mp_tensor *t, mp_tensor *grad)
{
    mp_tensor *old;
    if (!t)
        return mp__error(MP_EINVAL, "mp_tensor_set_grad: t is NULL");
    if (grad) {
        if (grad->dtype != t->dtype || grad->ndim != t->ndim ||
            memcmp(grad->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) != 0)
            return mp__error(MP_EINVAL, "mp_tensor_set_grad: grad's dtype or shape differs "
                                        "from the tensor's");
        /* a cycle (t is grad's grad, ...) would keep both alive forever */
        for (mp_tensor *g = grad; g; g = g->grad)
            if (g == t)
                return mp__error(MP_EINVAL, "mp_tensor_set_grad: grad is the tensor itself "
                                            "or has it as a grad");
    }
    old = t->grad;
    t->grad = mp_tensor_retain(grad);
    mp_tensor_release(old);
    return 0;
}

mp_tensor *mp_tensor_grad(const mp_tensor *t)
{
    return t ? t->grad : NULL;
}

int mp_tensor_share_memory_(mp_tensor *t)
{
    int rc;
    if (!t)
        return mp__error(MP_EINVAL, "mp_tensor_share_memory_: t is NULL");
    rc = mp__storage_share(t->storage);
    if (rc == 0 && t->grad)
        rc = mp_tensor_share_memory_(t->grad);
    return rc;
}

bool mp_tensor_is_shared(const mp_tensor *t)
{
    return t && t->storage->seg;
}

const char *mp_tensor_sharing_strategy(const mp_tensor *t)
{
    if (!t || !t->storage->seg)
        return NULL;
    return mp_get_all_sharing_strategies()[mp__segment_strategy(t->storage->seg)];
}
