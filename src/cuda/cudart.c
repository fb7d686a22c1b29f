/* Loading the CUDA runtime at run time.
 *
 * libmproc is never linked with libcudart or libcuda: a CPU-only program
 * must start (and mproc must work) on machines that have no CUDA at all,
 * whatever machine the library was built on. The runtime is dlopen()ed on
 * the first CUDA call and its entry points go into mp__cuda. The library's
 * name comes from the headers the build used (libcudart.so.<CUDART_VERSION /
 * 1000>: the soname whose ABI those headers describe), or from the
 * MPROC_CUDART environment variable (a name for the loader's search, or a
 * path), read once. The handle is never closed: the table must stay valid
 * for the life of the process, and CUDA does not support being unloaded. */
#include "cuda/gpu.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MP__CUDART_MAJOR (CUDART_VERSION / 1000)

mp__cuda_ops mp__cuda;

/* The table's fields and the runtime's symbols, in one list, so a field
 * cannot be left unfilled. The asserts compare every field's type with the
 * prototype in the toolkit's header (unevaluated: no symbol is referenced). */
#define MP__CUDA_SYMBOLS(X)                                                                \
    X(GetDeviceCount, cudaGetDeviceCount)                                                  \
    X(GetDevice, cudaGetDevice)                                                            \
    X(SetDevice, cudaSetDevice)                                                            \
    X(Malloc, cudaMalloc)                                                                  \
    X(Free, cudaFree)                                                                      \
    X(Memcpy, cudaMemcpy)                                                                  \
    X(Memset, cudaMemset)                                                                  \
    X(DeviceSynchronize, cudaDeviceSynchronize)                                            \
    X(IpcGetMemHandle, cudaIpcGetMemHandle)                                                \
    X(IpcOpenMemHandle, cudaIpcOpenMemHandle)                                              \
    X(IpcCloseMemHandle, cudaIpcCloseMemHandle)                                            \
    X(EventCreateWithFlags, cudaEventCreateWithFlags)                                      \
    X(EventRecord, cudaEventRecord)                                                        \
    X(EventDestroy, cudaEventDestroy)                                                      \
    X(IpcGetEventHandle, cudaIpcGetEventHandle)                                            \
    X(IpcOpenEventHandle, cudaIpcOpenEventHandle)                                          \
    X(StreamWaitEvent, cudaStreamWaitEvent)                                                \
    X(StreamQuery, cudaStreamQuery)                                                        \
    X(GetErrorString, cudaGetErrorString)

#define MP__CUDA_CHECK_TYPE(field, sym)                                                    \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&sym),                          \
                                                __typeof__(((mp__cuda_ops *)0)->field)),   \
                   "mp__cuda_ops." #field " does not match " #sym " in cuda_runtime_api.h");
MP__CUDA_SYMBOLS(MP__CUDA_CHECK_TYPE)

/* Symbol names as strings: the per-thread-stream macros of the header (if
 * ever defined) would rename the functions; mproc wants the legacy ones. */
#define MP__CUDA_ENTRY(field, sym) {#sym, offsetof(mp__cuda_ops, field)},
static const struct {
    const char *name;
    size_t offset;
} symbols[] = {MP__CUDA_SYMBOLS(MP__CUDA_ENTRY)};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char library[PATH_MAX];
static char why[PATH_MAX + 512]; /* empty once loaded */

static void fail_load(const char *what)
{
    snprintf(why, sizeof why,
             "%s; CUDA needs the CUDA %d runtime (libcudart.so.%d, from the CUDA toolkit or "
             "its cuda-cudart package): install it where the dynamic loader finds it, or set "
             "MPROC_CUDART to its path",
             what, MP__CUDART_MAJOR, MP__CUDART_MAJOR);
}

static void load(void)
{
    char what[PATH_MAX + 256];
    const char *env = getenv("MPROC_CUDART");
    mp__cuda_ops ops;
    if (env && *env)
        snprintf(library, sizeof library, "%s", env);
    else
        snprintf(library, sizeof library, "libcudart.so.%d", MP__CUDART_MAJOR);
    void *h = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *err = dlerror();
        snprintf(what, sizeof what, "the CUDA runtime %s%s could not be loaded (%s)", library,
                 env && *env ? " (from MPROC_CUDART)" : "", err ? err : "dlopen failed");
        fail_load(what);
        return;
    }
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
        void *p = dlsym(h, symbols[i].name);
        if (!p) {
            snprintf(what, sizeof what, "%s has no %s, so it is not a CUDA %d runtime", library,
                     symbols[i].name, MP__CUDART_MAJOR);
            fail_load(what);
            dlclose(h);
            return;
        }
        memcpy((char *)&ops + symbols[i].offset, &p, sizeof p);
    }
    mp__cuda = ops;
    why[0] = '\0';
}

int mp__cuda_load(const char *caller)
{
    pthread_once(&once, load);
    if (why[0] == '\0')
        return 0;
    return mp__error(MP_ENOTSUP, "%s: %s", caller, why);
}

const char *mp__cuda_library(void)
{
    pthread_once(&once, load);
    return library;
}
