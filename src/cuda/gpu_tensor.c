/* Device tensors: allocation, host<->device copies. */
#include "cuda/gpu.h"

#include <stdlib.h>
#include <string.h>

static int contiguous(mp_dtype dtype, int ndim, const int64_t *shape, int64_t *strides,
                      size_t *nbytes, const char *who)
{
    size_t es = mp_dtype_size(dtype);
    uint64_t n = 1;
    if (es == 0)
        return mp__error(MP_EINVAL, "%s: unknown dtype %d", who, (int)dtype);
    if (ndim < 0 || ndim > MP_MAX_NDIM || (ndim > 0 && !shape))
        return mp__error(MP_EINVAL, "%s: ndim %d out of range 0..%d", who, ndim, MP_MAX_NDIM);
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0)
            return mp__error(MP_EINVAL, "%s: size %lld of dim %d is negative", who,
                             (long long)shape[i], i);
        strides[i] = (int64_t)n;
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n) || n > (uint64_t)INT64_MAX)
            return mp__error(MP_EOVERFLOW, "%s: element count overflows", who);
    }
    if (__builtin_mul_overflow(n, (uint64_t)es, &n) || n > SIZE_MAX / 2)
        return mp__error(MP_EOVERFLOW, "%s: byte size overflows", who);
    *nbytes = (size_t)n;
    return 0;
}

/* mp_tensor_empty_cuda, its sentences naming who (the public call made). */
static int empty_cuda(int device, mp_dtype dtype, int ndim, const int64_t *shape,
                      mp_tensor **out, const char *who)
{
    int64_t strides[MP_MAX_NDIM];
    mp__storage *s = NULL;
    size_t nbytes = 0;
    void *base = NULL;
    int prev, rc;
    cudaError_t e;
    if (!out)
        return mp__error(MP_EINVAL, "%s: out is NULL", who);
    *out = NULL;
    if ((rc = mp__cuda_load(who)) < 0)
        return rc;
    if ((rc = contiguous(dtype, ndim, shape, strides, &nbytes, who)) < 0)
        return rc;
    mp__cuda_alloc *a = calloc(1, sizeof *a);
    if (!a)
        return mp__error(MP_ENOMEM, "%s: out of memory", who);
    if ((rc = mp__cuda_device_enter(device, &prev, who)) < 0)
        goto out_free_record;
    /* cudaMalloc(0) gives NULL, which has no IPC handle: keep one byte. */
    if ((e = mp__cuda.Malloc(&base, nbytes ? nbytes : 1)) != cudaSuccess) {
        rc = mp__cuda_fail(e, "%s: cudaMalloc of %zu bytes on device %d", who, nbytes, device);
        goto out_leave;
    }
    if ((e = mp__cuda.Memset(base, 0, nbytes ? nbytes : 1)) != cudaSuccess) {
        rc = mp__cuda_fail(e, "%s: cudaMemset of %zu bytes", who, nbytes);
        goto out_cuda_free;
    }
    mp__cuda_device_leave(prev);
    prev = -1;
    /* An empty tensor keeps its one byte, so it can be sent like any other. */
    *a = (mp__cuda_alloc){.magic = MP__CUDA_ALLOC_MAGIC, .device = device, .base = base,
                          .nbytes = nbytes ? nbytes : 1};
    if ((rc = mp__cuda_storage(a, mp__cuda_owned_release, &s)) < 0)
        goto out_cuda_free;
    /* From here the storage owns a: its release frees the memory. */
    rc = mp__tensor_make(who, s, dtype, ndim, shape, strides, 0, out);
    mp__storage_release(s);
    return rc;
out_cuda_free:
    mp__cuda.Free(base);
out_leave:
    mp__cuda_device_leave(prev);
out_free_record:
    free(a);
    return rc;
}

int mp_tensor_empty_cuda(int device, mp_dtype dtype, int ndim, const int64_t *shape,
                         mp_tensor **out)
{
    return empty_cuda(device, dtype, ndim, shape, out, "mp_tensor_empty_cuda");
}

static bool on_cuda(const mp_tensor *t) { return mp_tensor_device(t).device_type == kDLCUDA; }

/* Copies nbytes between any mix of host and device memory; UVA lets
 * cudaMemcpyDefault tell which is which. device: the one to make current. */
static int copy_bytes(void *dst, const void *src, size_t nbytes, int device, const char *who)
{
    int prev, rc;
    if (nbytes == 0)
        return 0;
    if ((rc = mp__cuda_device_enter(device, &prev, who)) < 0)
        return rc;
    cudaError_t e = mp__cuda.Memcpy(dst, src, nbytes, cudaMemcpyDefault);
    mp__cuda_device_leave(prev);
    if (e != cudaSuccess)
        return mp__cuda_fail(e, "%s: cudaMemcpy of %zu bytes", who, nbytes);
    return 0;
}

int mp_tensor_copy_cuda_(mp_tensor *dst, const mp_tensor *src)
{
    const char *who = "mp_tensor_copy_cuda_";
    int rc;
    if ((rc = mp__cuda_load(who)) < 0)
        return rc;
    if (!dst || !src)
        return mp__error(MP_EINVAL, "%s: NULL tensor", who);
    if ((rc = mp__tensor_check_same_layout(who, dst, src)) < 0)
        return rc;
    if (!mp_tensor_is_contiguous(dst) || !mp_tensor_is_contiguous(src))
        return mp__error(MP_EINVAL, "%s: both tensors must be contiguous (make a contiguous "
                                    "copy with mp_tensor_to_cuda / mp_tensor_to_cpu)", who);
    if (!on_cuda(dst) && !on_cuda(src))
        return mp_tensor_copy_(dst, src);
    int device = on_cuda(dst) ? mp_tensor_device(dst).device_id : mp_tensor_device(src).device_id;
    return copy_bytes(mp_tensor_data(dst), mp_tensor_data(src), mp_tensor_nbytes(src), device,
                      who);
}

int mp_tensor_to_cuda(const mp_tensor *src, int device, mp_tensor **out)
{
    const char *who = "mp_tensor_to_cuda";
    mp_tensor *host = NULL, *t = NULL;
    int rc;
    if (!src || !out)
        return mp__error(MP_EINVAL, "%s: NULL argument", who);
    *out = NULL;
    if ((rc = mp__cuda_load(who)) < 0)
        return rc;
    if (!mp_tensor_is_contiguous(src)) {
        /* Gather on the host first; the device copy is then one memcpy. */
        rc = on_cuda(src) ? mp_tensor_to_cpu(src, &host) : mp_tensor_clone(src, &host);
        if (rc < 0)
            return rc;
        src = host;
    }
    rc = empty_cuda(device, mp_tensor_dtype(src), mp_tensor_ndim(src), mp_tensor_shape(src), &t,
                    who);
    if (rc == 0)
        rc = copy_bytes(mp_tensor_data(t), mp_tensor_data(src), mp_tensor_nbytes(src), device,
                        who);
    mp_tensor_release(host);
    if (rc < 0) {
        mp_tensor_release(t);
        return rc;
    }
    *out = t;
    return 0;
}

static void free_host(void *data, void *ctx) { free(data); }

/* A strided device view: bring its whole storage over, view it the same way
 * on the host, gather that view into a contiguous tensor. */
static int strided_to_cpu(const mp_tensor *src, mp_tensor **out)
{
    const char *who = "mp_tensor_to_cpu";
    size_t nbytes = mp_tensor_storage_nbytes(src), es = mp_tensor_element_size(src);
    uint64_t base_off = mp_tensor_byte_offset(src);
    mp_tensor *blob = NULL, *view = NULL;
    int rc;
    void *host = malloc(nbytes ? nbytes : 1);
    if (!host)
        return mp__error(MP_ENOMEM, "%s: out of memory for %zu bytes", who, nbytes);
    rc = copy_bytes(host, mp__storage_data(mp__tensor_storage(src)), nbytes,
                    mp_tensor_device(src).device_id, who);
    if (rc < 0) {
        free(host);
        return rc;
    }
    int64_t n = (int64_t)(nbytes / es);
    rc = mp_tensor_from_blob(host, nbytes, mp_tensor_dtype(src), 1, &n, NULL, free_host, NULL,
                             &blob);
    if (rc < 0) {
        free(host);
        return rc;
    }
    rc = mp_tensor_as_strided(blob, mp_tensor_ndim(src), mp_tensor_shape(src),
                              mp_tensor_strides(src), base_off, &view);
    if (rc == 0)
        rc = mp_tensor_clone(view, out);
    mp_tensor_release(view);
    mp_tensor_release(blob);
    return rc;
}

int mp_tensor_to_cpu(const mp_tensor *src, mp_tensor **out)
{
    const char *who = "mp_tensor_to_cpu";
    mp_tensor *t = NULL;
    int rc;
    if (!src || !out)
        return mp__error(MP_EINVAL, "%s: NULL argument", who);
    *out = NULL;
    if ((rc = mp__cuda_load(who)) < 0)
        return rc;
    if (!on_cuda(src))
        return mp_tensor_clone(src, out);
    if (!mp_tensor_is_contiguous(src))
        return strided_to_cpu(src, out);
    rc = mp_tensor_empty(mp_tensor_dtype(src), mp_tensor_ndim(src), mp_tensor_shape(src), &t);
    if (rc == 0)
        rc = copy_bytes(mp_tensor_data(t), mp_tensor_data(src), mp_tensor_nbytes(src),
                        mp_tensor_device(src).device_id, who);
    if (rc < 0) {
        mp_tensor_release(t);
        return rc;
    }
    *out = t;
    return 0;
}
