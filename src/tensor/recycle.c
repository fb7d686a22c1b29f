/* Shared tensors over reusable segments (tensor/recycle.h). */
#include "tensor/recycle.h"
#include "shm/recycle.h"
#include "tensor/tensor_priv.h"

int mp__tensor_empty_reusable(mp_dtype dtype, int ndim, const int64_t *shape, mp_tensor **out)
{
    int64_t strides[MP_MAX_NDIM];
    mp__segment *seg = NULL;
    mp__storage *s = NULL;
    size_t nbytes;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_tensor_empty_shared: out is NULL");
    *out = NULL;
    if (mp__shm_strategy() != MP__STRATEGY_FD)
        return mp_tensor_empty_shared(dtype, ndim, shape, out);
    if ((rc = mp__shape_nbytes("mp_tensor_empty_shared", dtype, ndim, shape, &nbytes)) < 0)
        return rc;
    if ((rc = mp__segment_create_reusable(nbytes, &seg)) < 0)
        return rc;
    rc = mp__storage_from_segment(seg, &s);
    mp__segment_release(seg); /* the storage holds its own */
    if (rc < 0)
        return rc;
    mp__contiguous_strides(ndim, shape, strides);
    rc = mp__tensor_make("mp_tensor_empty_shared", s, dtype, ndim, shape, strides, 0, out);
    mp__storage_release(s);
    return rc;
}
