/* Views (narrow, slice, select, reshape, transpose, permute, as_strided),
 * clone and copy. Every view goes through mp__tensor_make, which checks
 * that each reachable element lies inside the storage. */
#include "tensor/tensor_priv.h"

#include <string.h>

/* dim, counted from the end when negative, checked against t's ndim. */
static int norm_dim(const char *call, const mp_tensor *t, int *dim)
{
    int d = *dim < 0 ? *dim + t->ndim : *dim;
    if (d < 0 || d >= t->ndim)
        return mp__error(MP_EINVAL, "%s: dim %d out of range for a %d-d tensor", call, *dim,
                         t->ndim);
    *dim = d;
    return 0;
}

/* t's offset moved by `index` elements along a stride, checked. */
static int moved_offset(const char *call, const mp_tensor *t, int64_t index, int64_t stride,
                        uint64_t *out)
{
    int64_t delta, off;
    if (__builtin_mul_overflow(index, stride, &delta) ||
        __builtin_mul_overflow(delta, (int64_t)mp_dtype_size(t->dtype), &delta) ||
        __builtin_add_overflow((int64_t)t->offset, delta, &off) || off < 0)
        return mp__error(MP_EINVAL, "%s: index %lld moves the view outside its storage", call,
                         (long long)index);
    *out = (uint64_t)off;
    return 0;
}

static int view_args(const char *call, const mp_tensor *t, mp_tensor **out)
{
    if (!t || !out)
        return mp__error(MP_EINVAL, "%s: NULL tensor or out", call);
    *out = NULL;
    return 0;
}

int mp_tensor_narrow(const mp_tensor *t, int dim, int64_t start, int64_t length, mp_tensor **out)
{
    int64_t shape[MP_MAX_NDIM];
    uint64_t off = 0;
    int rc = view_args("mp_tensor_narrow", t, out);
    if (rc == 0)
        rc = norm_dim("mp_tensor_narrow", t, &dim);
    if (rc < 0)
        return rc;
    if (start < 0 || length < 0 || start > t->shape[dim] || length > t->shape[dim] - start)
        return mp__error(MP_EINVAL,
                         "mp_tensor_narrow: [%lld, %lld + %lld) is outside dim %d "
                         "of size %lld",
                         (long long)start, (long long)start, (long long)length, dim,
                         (long long)t->shape[dim]);
    rc = moved_offset("mp_tensor_narrow", t, length ? start : 0, t->strides[dim], &off);
    if (rc < 0)
        return rc;
    memcpy(shape, t->shape, sizeof shape);
    shape[dim] = length;
    return mp__tensor_make("mp_tensor_narrow", t->storage, t->dtype, t->ndim, shape, t->strides,
                           off, out);
}

int mp_tensor_slice(const mp_tensor *t, int dim, int64_t start, int64_t stop, int64_t step,
                    mp_tensor **out)
{
    int64_t shape[MP_MAX_NDIM], strides[MP_MAX_NDIM], n, len = 0;
    uint64_t off = 0;
    int rc = view_args("mp_tensor_slice", t, out);
    if (rc == 0)
        rc = norm_dim("mp_tensor_slice", t, &dim);
    if (rc < 0)
        return rc;
    if (step < 1)
        return mp__error(MP_EINVAL, "mp_tensor_slice: step %lld must be >= 1", (long long)step);
    n = t->shape[dim];
    /* Python rules: negative bounds count from the end, then clamp */
    if (start < 0)
        start = start < -n ? 0 : start + n;
    if (stop < 0)
        stop = stop < -n ? 0 : stop + n;
    start = start > n ? n : start;
    stop = stop > n ? n : stop;
    if (stop > start)
        len = (stop - start - 1) / step + 1;
    memcpy(shape, t->shape, sizeof shape);
    memcpy(strides, t->strides, sizeof strides);
    shape[dim] = len;
    if (__builtin_mul_overflow(t->strides[dim], step, &strides[dim]))
        return mp__error(MP_EOVERFLOW, "mp_tensor_slice: stride times step overflows");
    rc = moved_offset("mp_tensor_slice", t, len ? start : 0, t->strides[dim], &off);
    if (rc < 0)
        return rc;
    return mp__tensor_make("mp_tensor_slice", t->storage, t->dtype, t->ndim, shape, strides,
                           off, out);
}

int mp_tensor_select(const mp_tensor *t, int dim, int64_t index, mp_tensor **out)
{
    int64_t shape[MP_MAX_NDIM], strides[MP_MAX_NDIM];
    uint64_t off = 0;
    int rc = view_args("mp_tensor_select", t, out);
    if (rc == 0)
        rc = norm_dim("mp_tensor_select", t, &dim);
    if (rc < 0)
        return rc;
    if (index < -t->shape[dim] || index >= t->shape[dim])
        return mp__error(MP_EINVAL,
                         "mp_tensor_select: index %lld out of range for dim %d of "
                         "size %lld",
                         (long long)index, dim, (long long)t->shape[dim]);
    if (index < 0)
        index += t->shape[dim];
    rc = moved_offset("mp_tensor_select", t, index, t->strides[dim], &off);
    if (rc < 0)
        return rc;
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == dim)
            continue;
        shape[j] = t->shape[i];
        strides[j++] = t->strides[i];
    }
    return mp__tensor_make("mp_tensor_select", t->storage, t->dtype, t->ndim - 1, shape, strides,
                           off, out);
}

int mp_tensor_reshape(const mp_tensor *t, int ndim, const int64_t *shape, mp_tensor **out)
{
    int64_t s[MP_MAX_NDIM], strides[MP_MAX_NDIM], known = 1, numel;
    int infer = -1, rc = view_args("mp_tensor_reshape", t, out);
    if (rc < 0)
        return rc;
    if (ndim < 0 || ndim > MP_MAX_NDIM || (ndim > 0 && !shape))
        return mp__error(MP_EINVAL, "mp_tensor_reshape: ndim %d outside 0..%d or NULL shape", ndim,
                         MP_MAX_NDIM);
    if (!mp_tensor_is_contiguous(t))
        return mp__error(MP_EINVAL, "mp_tensor_reshape: the tensor is not contiguous "
                                    "(clone it first)");
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (shape[i] == -1 && infer < 0) {
            infer = i;
            continue;
        }
        if (shape[i] < 0)
            return mp__error(MP_EINVAL,
                             "mp_tensor_reshape: bad size %lld at dim %d (one -1 "
                             "at most)",
                             (long long)shape[i], i);
        if (__builtin_mul_overflow(known, shape[i], &known))
            return mp__error(MP_EOVERFLOW, "mp_tensor_reshape: the element count overflows");
    }
    numel = mp_tensor_numel(t);
    if (infer >= 0) {
        if (known == 0 || numel % known != 0)
            return mp__error(MP_EINVAL,
                             "mp_tensor_reshape: cannot infer dim %d: %lld elements "
                             "do not divide by %lld",
                             infer, (long long)numel, (long long)known);
        s[infer] = numel / known;
        known = numel;
    }
    if (known != numel)
        return mp__error(MP_EINVAL,
                         "mp_tensor_reshape: shape holds %lld elements, the tensor "
                         "%lld",
                         (long long)known, (long long)numel);
    mp__contiguous_strides(ndim, s, strides);
    return mp__tensor_make("mp_tensor_reshape", t->storage, t->dtype, ndim, s, strides,
                           t->offset, out);
}

int mp_tensor_permute(const mp_tensor *t, const int *dims, mp_tensor **out)
{
    int64_t shape[MP_MAX_NDIM], strides[MP_MAX_NDIM];
    bool seen[MP_MAX_NDIM] = {false};
    int rc = view_args("mp_tensor_permute", t, out);
    if (rc < 0)
        return rc;
    if (t->ndim > 0 && !dims)
        return mp__error(MP_EINVAL, "mp_tensor_permute: dims is NULL");
    for (int i = 0; i < t->ndim; i++) {
        int d = dims[i];
        if (d < 0 || d >= t->ndim || seen[d])
            return mp__error(MP_EINVAL,
                             "mp_tensor_permute: dims is not a permutation of "
                             "0..%d (dims[%d] = %d)",
                             t->ndim - 1, i, d);
        seen[d] = true;
        shape[i] = t->shape[d];
        strides[i] = t->strides[d];
    }
    return mp__tensor_make("mp_tensor_permute", t->storage, t->dtype, t->ndim, shape, strides,
                           t->offset, out);
}

int mp_tensor_transpose(const mp_tensor *t, int dim0, int dim1, mp_tensor **out)
{
    int dims[MP_MAX_NDIM], rc = view_args("mp_tensor_transpose", t, out);
    if (rc == 0)
        rc = norm_dim("mp_tensor_transpose", t, &dim0);
    if (rc == 0)
        rc = norm_dim("mp_tensor_transpose", t, &dim1);
    if (rc < 0)
        return rc;
    for (int i = 0; i < t->ndim; i++)
        dims[i] = i;
    dims[dim0] = dim1;
    dims[dim1] = dim0;
    return mp_tensor_permute(t, dims, out);
}

int mp_tensor_as_strided(const mp_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                         uint64_t byte_offset, mp_tensor **out)
{
    int rc = view_args("mp_tensor_as_strided", t, out);
    if (rc < 0)
        return rc;
    return mp__tensor_make("mp_tensor_as_strided", t->storage, t->dtype, ndim, shape, strides,
                           byte_offset, out);
}

/* ---- copies -------------------------------------------------------------- */

static void copy_elem(char *d, const char *s, size_t es)
{
    switch (es) {
    case 1:
        *d = *s;
        break;
    case 2:
        memcpy(d, s, 2);
        break;
    case 4:
        memcpy(d, s, 4);
        break;
    default:
        memcpy(d, s, 8);
        break;
    }
}

void mp__copy_strided(const mp_tensor *dst, const mp_tensor *src)
{
    size_t es = mp_dtype_size(src->dtype);
    int64_t idx[MP_MAX_NDIM] = {0}, n = mp_tensor_numel(src), last;
    char *d = mp_tensor_data(dst);
    const char *s = mp_tensor_data(src);
    int nd = src->ndim;
    if (n == 0)
        return;
    if (mp_tensor_is_contiguous(dst) && mp_tensor_is_contiguous(src)) {
        memmove(d, s, (size_t)n * es);
        return;
    }
    last = src->shape[nd - 1]; /* nd >= 1 here: a 0-d tensor is contiguous */
    for (;;) {
        int64_t ds = dst->strides[nd - 1] * (int64_t)es, ss = src->strides[nd - 1] * (int64_t)es;
        for (int64_t k = 0; k < last; k++)
            copy_elem(d + k * ds, s + k * ss, es);
        /* odometer over the outer dims */
        int i = nd - 2;
        for (; i >= 0; i--) {
            d += dst->strides[i] * (int64_t)es;
            s += src->strides[i] * (int64_t)es;
            if (++idx[i] < src->shape[i])
                break;
            d -= dst->strides[i] * (int64_t)es * src->shape[i];
            s -= src->strides[i] * (int64_t)es * src->shape[i];
            idx[i] = 0;
        }
        if (i < 0)
            return;
    }
}

/* MP_ENOTSUP unless t is on the CPU (a CUDA tensor's copies are mproc/cuda.h's
 * calls, named in fix). */
static int on_cpu(const char *call, const char *which, const mp_tensor *t, const char *fix)
{
    char dev[48];
    if (t->storage->dev.device_type == kDLCPU)
        return 0;
    return mp__error(MP_ENOTSUP, "%s: %s is on %s; %s", call, which,
                     mp__device_label(t->storage->dev, dev, sizeof dev), fix);
}

int mp_tensor_clone(const mp_tensor *t, mp_tensor **out)
{
    int rc;
    if (!t || !out)
        return mp__error(MP_EINVAL, "mp_tensor_clone: NULL tensor or out");
    *out = NULL;
    if ((rc = on_cpu("mp_tensor_clone", "the tensor", t,
                     "copy it with mp_tensor_to_cuda or mp_tensor_to_cpu")) < 0)
        return rc;
    rc = mp_tensor_empty(t->dtype, t->ndim, t->shape, out);
    if (rc == 0)
        mp__copy_strided(*out, t);
    return rc;
}

int mp_tensor_copy_(mp_tensor *dst, const mp_tensor *src)
{
    mp_tensor *tmp = NULL;
    int rc;
    if (!dst || !src)
        return mp__error(MP_EINVAL, "mp_tensor_copy_: NULL tensor");
    if ((rc = mp__tensor_check_same_layout("mp_tensor_copy_", dst, src)) < 0 ||
        (rc = on_cpu("mp_tensor_copy_", "dst", dst, "use mp_tensor_copy_cuda_")) < 0 ||
        (rc = on_cpu("mp_tensor_copy_", "src", src, "use mp_tensor_copy_cuda_")) < 0)
        return rc;
    if (dst->storage == src->storage && dst != src) {
        /* views of one storage may overlap: go through a private copy */
        rc = mp_tensor_clone(src, &tmp);
        if (rc < 0)
            return rc;
        src = tmp;
    }
    mp__copy_strided(dst, src);
    mp_tensor_release(tmp);
    return 0;
}
