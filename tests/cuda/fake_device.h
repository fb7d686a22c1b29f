/* A fake CUDA device for tests on machines without a GPU: swapped into the
 * mp__cuda table, it keeps "device" memory in memfd mappings and makes IPC
 * handles out of (pid, fd), opened by another process through
 * /proc/<pid>/fd. It behaves as the real runtime does where mproc relies on
 * it: a process cannot open its own handles or events, a freed allocation
 * cannot be opened any more, events need the interprocess flags. Counters
 * let tests check that every allocation, mapping and event was given back.
 * Header-only so the test and the benchmark can both use it. */
#ifndef MP_FAKE_DEVICE_H
#define MP_FAKE_DEVICE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda/gpu.h"

#define FAKE_MAGIC 0x66616b65u
#define FAKE_MAX_BLOCKS 4096

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
    int fd;        /* own allocations: the memfd; imported: -1 */
    bool imported;
} fake_block;

static struct {
    fake_block blocks[FAKE_MAX_BLOCKS];
    int device;
    int mallocs, frees, opens, closes, events, event_frees, waits, records;
} fake;

static fake_block *fake_find(const void *ptr)
{
    for (int i = 0; i < FAKE_MAX_BLOCKS; i++)
        if (fake.blocks[i].ptr && fake.blocks[i].ptr == ptr)
            return &fake.blocks[i];
    return NULL;
}

static fake_block *fake_new(void)
{
    for (int i = 0; i < FAKE_MAX_BLOCKS; i++)
        if (!fake.blocks[i].ptr)
            return &fake.blocks[i];
    return NULL;
}

static cudaError_t fake_count(int *n)
{
    *n = 2;
    return cudaSuccess;
}
static cudaError_t fake_get_device(int *d)
{
    *d = fake.device;
    return cudaSuccess;
}
static cudaError_t fake_set_device(int d)
{
    if (d < 0 || d >= 2)
        return cudaErrorInvalidDevice;
    fake.device = d;
    return cudaSuccess;
}

static cudaError_t fake_malloc(void **p, size_t size)
{
    fake_block *b = fake_new();
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

static cudaError_t fake_free(void *p)
{
    fake_block *b = fake_find(p);
    if (!b || b->imported)
        return cudaErrorInvalidValue;
    munmap(b->ptr, b->size);
    close(b->fd);
    memset(b, 0, sizeof *b);
    fake.frees++;
    return cudaSuccess;
}

static cudaError_t fake_memcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    memcpy(d, s, n);
    return cudaSuccess;
}

static cudaError_t fake_memset(void *p, int v, size_t n)
{
    memset(p, v, n);
    return cudaSuccess;
}

static cudaError_t fake_sync(void) { return cudaSuccess; }

static cudaError_t fake_get_handle(cudaIpcMemHandle_t *h, void *p)
{
    fake_block *b = fake_find(p);
    fake_handle fh = {FAKE_MAGIC, (uint32_t)getpid(), 0, 0, 0};
    if (!b || b->imported)
        return cudaErrorInvalidValue;
    fh.fd = b->fd;
    fh.size = b->size;
    memset(h, 0, sizeof *h);
    memcpy(h, &fh, sizeof fh);
    return cudaSuccess;
}

static cudaError_t fake_open_handle(void **p, cudaIpcMemHandle_t h, unsigned int flags)
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
    fake_block *b = fake_new();
    if (m == MAP_FAILED || !b)
        return cudaErrorMemoryAllocation;
    *b = (fake_block){.ptr = m, .size = fh.size, .fd = -1, .imported = true};
    fake.opens++;
    *p = m;
    return cudaSuccess;
}

static cudaError_t fake_close_handle(void *p)
{
    fake_block *b = fake_find(p);
    if (!b || !b->imported)
        return cudaErrorInvalidValue;
    munmap(b->ptr, b->size);
    memset(b, 0, sizeof *b);
    fake.closes++;
    return cudaSuccess;
}

typedef struct fake_event {
    uint32_t magic;
    uint32_t pid;
} fake_event;

static cudaError_t fake_event_create(cudaEvent_t *e, unsigned int flags)
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

static cudaError_t fake_event_record(cudaEvent_t e, cudaStream_t s)
{
    fake.records++;
    return e ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

static cudaError_t fake_event_destroy(cudaEvent_t e)
{
    free(e);
    fake.event_frees++;
    return cudaSuccess;
}

static cudaError_t fake_get_event_handle(cudaIpcEventHandle_t *h, cudaEvent_t e)
{
    memset(h, 0, sizeof *h);
    memcpy(h, e, sizeof(fake_event));
    return cudaSuccess;
}

static cudaError_t fake_open_event(cudaEvent_t *e, cudaIpcEventHandle_t h)
{
    fake_event fe;
    memcpy(&fe, &h, sizeof fe);
    if (fe.magic != FAKE_MAGIC || fe.pid == (uint32_t)getpid())
        return cudaErrorInvalidResourceHandle;
    return fake_event_create(e, cudaEventInterprocess | cudaEventDisableTiming);
}

static cudaError_t fake_wait(cudaStream_t s, cudaEvent_t e, unsigned int f)
{
    fake.waits++;
    return cudaSuccess;
}

static const char *fake_error_string(cudaError_t e) { return "fake device error"; }

static void fake_device_install(void)
{
    memset(&fake, 0, sizeof fake);
    mp__cuda = (mp__cuda_ops){
        .GetDeviceCount = fake_count, .GetDevice = fake_get_device,
        .SetDevice = fake_set_device, .Malloc = fake_malloc, .Free = fake_free,
        .Memcpy = fake_memcpy, .Memset = fake_memset, .DeviceSynchronize = fake_sync,
        .IpcGetMemHandle = fake_get_handle, .IpcOpenMemHandle = fake_open_handle,
        .IpcCloseMemHandle = fake_close_handle, .EventCreateWithFlags = fake_event_create,
        .EventRecord = fake_event_record, .EventDestroy = fake_event_destroy,
        .IpcGetEventHandle = fake_get_event_handle, .IpcOpenEventHandle = fake_open_event,
        .StreamWaitEvent = fake_wait, .GetErrorString = fake_error_string,
    };
}

#endif
