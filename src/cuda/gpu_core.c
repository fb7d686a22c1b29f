/* The CUDA runtime table, error conversion, devices. */
#include "cuda/gpu.h"

#include <stdio.h>

/* cudaEventRecord and cudaStreamWaitEvent may be macros or have default
 * arguments in C++; plain wrappers keep the table's types exact. */
static cudaError_t event_record(cudaEvent_t e, cudaStream_t s) { return cudaEventRecord(e, s); }
static cudaError_t stream_wait(cudaStream_t s, cudaEvent_t e, unsigned int f)
{
    return cudaStreamWaitEvent(s, e, f);
}

#define MP__CUDA_REAL_OPS                                                                  \
    {                                                                                      \
        .GetDeviceCount = cudaGetDeviceCount, .GetDevice = cudaGetDevice,                  \
        .SetDevice = cudaSetDevice, .Malloc = cudaMalloc, .Free = cudaFree,                \
        .Memcpy = cudaMemcpy, .Memset = cudaMemset,                                        \
        .DeviceSynchronize = cudaDeviceSynchronize,                                        \
        .IpcGetMemHandle = cudaIpcGetMemHandle, .IpcOpenMemHandle = cudaIpcOpenMemHandle,  \
        .IpcCloseMemHandle = cudaIpcCloseMemHandle,                                        \
        .EventCreateWithFlags = cudaEventCreateWithFlags, .EventRecord = event_record,     \
        .EventDestroy = cudaEventDestroy, .IpcGetEventHandle = cudaIpcGetEventHandle,      \
        .IpcOpenEventHandle = cudaIpcOpenEventHandle, .StreamWaitEvent = stream_wait,      \
        .GetErrorString = cudaGetErrorString,                                              \
    }

const mp__cuda_ops mp__cuda_real = MP__CUDA_REAL_OPS;
mp__cuda_ops mp__cuda = MP__CUDA_REAL_OPS;

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

int mp_cuda_device_count(int *count)
{
    int n = 0;
    if (!count)
        return mp__error(MP_EINVAL, "mp_cuda_device_count: count is NULL");
    *count = 0;
    cudaError_t e = mp__cuda.GetDeviceCount(&n);
    if (e == cudaErrorNoDevice)
        return 0;
    if (e != cudaSuccess)
        return mp__cuda_fail(e, "mp_cuda_device_count: no usable CUDA driver (is the NVIDIA "
                                "driver installed and a GPU visible?)");
    /* The driver is initialised now: fork is no longer safe. */
    if (n > 0)
        mp__cuda_mark_initialized();
    *count = n;
    return 0;
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
    if ((rc = mp_cuda_device_count(&n)) < 0)
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
