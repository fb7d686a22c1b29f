/* Internals of the CUDA build (src/cuda/gpu_*.c; needs the CUDA toolkit's
 * headers, never its libraries).
 *
 * Every CUDA runtime call goes through mp__cuda, one table of function
 * pointers filled by mp__cuda_load() from a dlopen()ed libcudart (see
 * cudart.c): libmproc has no link-time dependency on CUDA. The tests point
 * MPROC_CUDART at a fake runtime (tests/cuda/fake_cudart.c, host memory
 * standing in for device memory), so the IPC, reference-count and
 * pending-free paths run, through this same table, on machines without a
 * GPU. */
#ifndef MPROC_CUDA_GPU_H
#define MPROC_CUDA_GPU_H

#include <cuda_runtime_api.h>

#include "cuda/cuda_internal.h"
#include "cuda/pending.h"
#include "cuda/refseg.h"
#include "mproc/cuda.h"
#include "tensor/tensor_internal.h"

typedef struct mp__cuda_ops {
    cudaError_t (*GetDeviceCount)(int *count);
    cudaError_t (*GetDevice)(int *device);
    cudaError_t (*SetDevice)(int device);
    cudaError_t (*Malloc)(void **ptr, size_t size);
    cudaError_t (*Free)(void *ptr);
    cudaError_t (*Memcpy)(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
    cudaError_t (*Memset)(void *ptr, int value, size_t n);
    cudaError_t (*DeviceSynchronize)(void);
    cudaError_t (*IpcGetMemHandle)(cudaIpcMemHandle_t *handle, void *ptr);
    cudaError_t (*IpcOpenMemHandle)(void **ptr, cudaIpcMemHandle_t handle, unsigned int flags);
    cudaError_t (*IpcCloseMemHandle)(void *ptr);
    cudaError_t (*EventCreateWithFlags)(cudaEvent_t *event, unsigned int flags);
    cudaError_t (*EventRecord)(cudaEvent_t event, cudaStream_t stream);
    cudaError_t (*EventDestroy)(cudaEvent_t event);
    cudaError_t (*IpcGetEventHandle)(cudaIpcEventHandle_t *handle, cudaEvent_t event);
    cudaError_t (*IpcOpenEventHandle)(cudaEvent_t *event, cudaIpcEventHandle_t handle);
    cudaError_t (*StreamWaitEvent)(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
    cudaError_t (*StreamQuery)(cudaStream_t stream);
    const char *(*GetErrorString)(cudaError_t err);
} mp__cuda_ops;

/* The runtime's entry points: filled once by mp__cuda_load, read-only after.
 * Only valid after mp__cuda_load() returned 0 in this process. */
extern mp__cuda_ops mp__cuda;

/* Loads the CUDA runtime on first use: dlopen of $MPROC_CUDART, else of
 * libcudart.so.<major> (the major of the headers this was built with), and
 * dlsym of every entry of mp__cuda. Once per process (pthread_once; a forked
 * child shares its parent's outcome). Returns 0, or MP_ENOTSUP with
 * "<caller>: <which library, why, how to fix>" for a library that is
 * missing or lacks a symbol. Thread-safe. */
int mp__cuda_load(const char *caller);
/* The library mp__cuda_load loads (or tried): a name or a path. */
const char *mp__cuda_library(void);

/* Records "<what>: <CUDA error text>" and returns the mp_error for e:
 * out of memory -> MP_ENOMEM, invalid device -> MP_EINVAL, else MP_ESYS. */
int mp__cuda_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Makes device current (remembering the previous one in *prev); restore
 * with mp__cuda_device_leave. MP_EINVAL for a device that does not exist. */
int mp__cuda_device_enter(int device, int *prev, const char *caller);
void mp__cuda_device_leave(int prev);

/* One device allocation, owned (cudaMalloc'd here) or imported (a received
 * IPC handle opened here). It is the ctx of every storage over it and the
 * storage's user pointer, which is how encode finds it. */
#define MP__CUDA_ALLOC_MAGIC 0x6375616cu
typedef struct mp__cuda_alloc {
    uint32_t magic;
    bool imported;
    bool self;               /* imported from our own segment: no IPC open/close */
    int device;
    void *base;
    size_t nbytes;
    mp__refseg *seg;         /* owned: ours once shared; imported: the producer's */
    bool shared;             /* owned: holds a slot */
    uint32_t slot, gen;
    bool has_handle;
    cudaIpcMemHandle_t handle;
    bool has_event;
    cudaEvent_t event;       /* recorded on each send; created on first send */
    cudaIpcEventHandle_t event_handle;
    uint32_t users;          /* imported: storages over this mapping */
    uint32_t ref;            /* imported: the reference this process holds */
    uint64_t ref_word;
    struct mp__cuda_alloc *next; /* imported: cache list */
} mp__cuda_alloc;

/* The lock over the state below and the import cache. */
void mp__cuda_lock(void);
void mp__cuda_unlock(void);
/* Under the lock: this process's own segment (created on first use). */
int mp__cuda_own_segment(mp__refseg **out);
/* Under the lock: gives an owned allocation a slot in the own segment. */
int mp__cuda_alloc_share(mp__cuda_alloc *a);
/* Under the lock: the owned allocation in slot/gen, or NULL. */
mp__cuda_alloc *mp__cuda_owned_lookup(uint32_t slot, uint32_t gen);
/* Under the lock: collects the pending list (after a reference was dropped). */
int mp__cuda_collect_locked(size_t *freed);
/* The alloc a CUDA tensor from mproc views, or NULL (with MP_EINVAL set). */
mp__cuda_alloc *mp__cuda_tensor_alloc(const mp_tensor *t, const char *caller);
/* Release function of an owned allocation's storage: frees it now, or parks
 * it on the pending list while other processes hold references. */
void mp__cuda_owned_release(void *data, void *ctx);
/* Received allocations mapped in this process now (tests: opened once). */
int mp__cuda_import_count(void);
/* Wraps alloc (base..nbytes) in a new storage whose release is release. */
int mp__cuda_storage(mp__cuda_alloc *a, mp_release_fn release, mp__storage **out);

#endif
