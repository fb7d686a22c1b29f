/* CUDA error conversion, the device count (cached), devices. */
#include "cuda/gpu.h"

#include <stdatomic.h>
#include <stdio.h>

int mp__cuda_fail(cudaError_t e, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int code = e == cudaErrorMemoryAllocation ? MP_ENOMEM
               : e == cudaErrorInvalidDevice  ? MP_EINVAL
                                              : MP_ESYS;
    const char *text = mp__cuda.GetErrorString ? mp__cuda.GetErrorString(e) : NULL;
    return mp__error(code, "%s: %s (CUDA error %d)", what, text ? text : "unknown error",
                     (int)e);
}

/* The device count, asked of the runtime once per process: it was asked on
 * every send and receive, and it cannot change (CUDA_VISIBLE_DEVICES is read
 * when the runtime starts). One word, pid << 32 | value, where value is the
 * count or minus the CUDA error: the pid makes a forked child ask again
 * rather than trust its parent's answer (0 = not asked yet). Two threads
 * racing on the very first call may both ask; both store the same answer. */
static _Atomic uint64_t count_cache;

static int32_t cached_count(void)
{
    uint32_t pid = (uint32_t)mp__pid();
    uint64_t c = atomic_load_explicit(&count_cache, memory_order_acquire);
    if ((uint32_t)(c >> 32) == pid)
        return (int32_t)(uint32_t)c;
    int n = 0;
    cudaError_t e = mp__cuda.GetDeviceCount(&n);
    if (e == cudaErrorNoDevice)
        e = cudaSuccess, n = 0;
    int32_t v = e == cudaSuccess ? n : -(int32_t)e;
    /* The driver is initialised now: fork is no longer safe. */
    if (v > 0)
        mp__cuda_mark_initialized();
    atomic_store_explicit(&count_cache, (uint64_t)pid << 32 | (uint32_t)v,
                          memory_order_release);
    return v;
}

/* The (cached) count in *n, or the (cached) failure, told for caller. */
static int device_count(const char *caller, int *n)
{
    int32_t v = cached_count();
    if (v < 0)
        return mp__cuda_fail((cudaError_t)-v, "%s: no usable CUDA driver (is the NVIDIA driver "
                                              "installed and a GPU visible?)", caller);
    *n = v;
    return 0;
}

int mp_cuda_device_count(int *count)
{
    int rc;
    if (count)
        *count = 0;
    if ((rc = mp__cuda_load("mp_cuda_device_count")) < 0)
        return rc;
    if (!count)
        return mp__error(MP_EINVAL, "mp_cuda_device_count: count is NULL");
    return device_count("mp_cuda_device_count", count);
}

bool mp_cuda_is_available(void)
{
    int n = 0;
    return mp_cuda_device_count(&n) == 0 && n > 0;
}

int mp__cuda_device_enter(int device, int *prev, const char *caller)
{
    int n = 0, rc;
    cudaError_t e;
    *prev = -1;
    if ((rc = mp__cuda_load(caller)) < 0 || (rc = device_count(caller, &n)) < 0)
        return rc;
    if (device < 0 || device >= n)
        return mp__error(MP_EINVAL, "%s: CUDA device %d does not exist (%d visible)", caller,
                         device, n);
    if ((e = mp__cuda.GetDevice(prev)) != cudaSuccess)
        return mp__cuda_fail(e, "%s: cudaGetDevice", caller);
    if (*prev != device && (e = mp__cuda.SetDevice(device)) != cudaSuccess) {
        *prev = -1;
        return mp__cuda_fail(e, "%s: cudaSetDevice(%d)", caller, device);
    }
    return 0;
}

void mp__cuda_device_leave(int prev)
{
    int cur = -1;
    if (prev >= 0 && mp__cuda.GetDevice(&cur) == cudaSuccess && cur != prev)
        mp__cuda.SetDevice(prev);
}

int mp_cuda_synchronize(int device)
{
    int prev, rc;
    if ((rc = mp__cuda_device_enter(device, &prev, "mp_cuda_synchronize")) < 0)
        return rc;
    cudaError_t e = mp__cuda.DeviceSynchronize();
    mp__cuda_device_leave(prev);
    if (e != cudaSuccess)
        return mp__cuda_fail(e, "mp_cuda_synchronize(%d)", device);
    return 0;
}
