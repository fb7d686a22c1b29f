/* A fake CUDA runtime for machines without a GPU: a shared library that
 * exports the cuda* functions mproc uses, with the prototypes of the
 * toolkit's cuda_runtime_api.h. Tests load it through mproc's own loader
 * (MPROC_CUDART=<this library>), so dlopen, dlsym and the function table
 * are the ones used with the real runtime.
 *
 * "Device" memory is kept in memfd mappings, and IPC handles are made of
 * (pid, fd), opened by another process through /proc/<pid>/fd. It behaves as
 * the real runtime does where mproc relies on it: a process cannot open its
 * own handles or events, a freed allocation cannot be opened any more,
 * events need the interprocess flags. Two devices. Counters (fake_cudart.h)
 * let tests check that every allocation, mapping and event was given back,
 * and how often the device count was asked. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_cudart.h"

#define FAKE_MAGIC 0x66616b65u
#define FAKE_MAX_BLOCKS 4096
#define FAKE_DEVICES 2

typedef struct fake_handle {
    uint32_t magic;
    uint32_t pid;
    int32_t fd;
    uint32_t pad;
    uint64_t size;
} fake_handle;

typedef struct fake_block {
    void *ptr;
    size_t size;
    int fd; /* own allocations: the memfd; imported: -1 */
    bool imported;
} fake_block;

typedef struct fake_event {
    uint32_t magic;
    uint32_t pid;
} fake_event;

static fake_block blocks[FAKE_MAX_BLOCKS];
static fake_counters fake;

fake_counters *fake_cudart_counters(void) { return &fake; }

static fake_block *find_block(const void *ptr)
{
    for (int i = 0; i < FAKE_MAX_BLOCKS; i++)
        if (blocks[i].ptr && blocks[i].ptr == ptr)
            return &blocks[i];
    return NULL;
}

static fake_block *free_block(void)
{
    for (int i = 0; i < FAKE_MAX_BLOCKS; i++)
        if (!blocks[i].ptr)
            return &blocks[i];
    return NULL;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    fake.count_calls++;
    *n = FAKE_DEVICES;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d)
{
    *d = fake.device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= FAKE_DEVICES)
        return cudaErrorInvalidDevice;
    fake.device = d;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size)
{
    fake_block *b = free_block();
    int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    if (!b || fd < 0 || ftruncate(fd, (off_t)size) < 0) {
        if (fd >= 0)
            close(fd);
        return cudaErrorMemoryAllocation;
    }
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    *b = (fake_block){.ptr = m, .size = size, .fd = fd};
    fake.mallocs++;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    fake_block *b = find_block(p);
    if (!b || b->imported)
        return cudaErrorInvalidValue;
    munmap(b->ptr, b->size);
    close(b->fd);
    memset(b, 0, sizeof *b);
    fake.frees++;
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    memcpy(d, s, n);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
    fake_block *b = find_block(p);
    fake_handle fh = {FAKE_MAGIC, (uint32_t)getpid(), 0, 0, 0};
    if (!b || b->imported)
        return cudaErrorInvalidValue;
    fh.fd = b->fd;
    fh.size = b->size;
    memset(h, 0, sizeof *h);
    memcpy(h, &fh, sizeof fh);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned int flags)
{
    fake_handle fh;
    char path[64];
    struct stat st;
    memcpy(&fh, &h, sizeof fh);
    if (fh.magic != FAKE_MAGIC || fh.pid == (uint32_t)getpid())
        return cudaErrorInvalidResourceHandle;
    snprintf(path, sizeof path, "/proc/%u/fd/%d", fh.pid, fh.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return cudaErrorInvalidResourceHandle;
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_size != fh.size) {
        close(fd);
        return cudaErrorInvalidResourceHandle;
    }
    void *m = mmap(NULL, fh.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    fake_block *b = free_block();
    if (m == MAP_FAILED || !b) {
        if (m != MAP_FAILED)
            munmap(m, fh.size);
        return cudaErrorMemoryAllocation;
    }
    *b = (fake_block){.ptr = m, .size = fh.size, .fd = -1, .imported = true};
    fake.opens++;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *p)
{
    fake_block *b = find_block(p);
    if (!b || !b->imported)
        return cudaErrorInvalidValue;
    munmap(b->ptr, b->size);
    memset(b, 0, sizeof *b);
    fake.closes++;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    if ((flags & (cudaEventInterprocess | cudaEventDisableTiming)) !=
        (cudaEventInterprocess | cudaEventDisableTiming))
        return cudaErrorInvalidValue;
    fake_event *ev = malloc(sizeof *ev);
    if (!ev)
        return cudaErrorMemoryAllocation;
    *ev = (fake_event){FAKE_MAGIC, (uint32_t)getpid()};
    fake.events++;
    *e = (cudaEvent_t)ev;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    fake.records++;
    return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    free(e);
    fake.event_frees++;
    return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *h, cudaEvent_t e)
{
    memset(h, 0, sizeof *h);
    memcpy(h, e, sizeof(fake_event));
    return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *e, cudaIpcEventHandle_t h)
{
    fake_event fe;
    memcpy(&fe, &h, sizeof fe);
    if (fe.magic != FAKE_MAGIC || fe.pid == (uint32_t)getpid())
        return cudaErrorInvalidResourceHandle;
    return cudaEventCreateWithFlags(e, cudaEventInterprocess | cudaEventDisableTiming);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f)
{
    fake.waits++;
    return cudaSuccess;
}

/* The fake's work is synchronous, so the stream is idle unless a test says
 * otherwise (stream_busy), as a real one is while a kernel runs. */
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    return fake.stream_busy ? cudaErrorNotReady : cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e) { return "fake device error"; }
