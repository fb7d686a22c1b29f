/* The fake CUDA device for tests on machines without a GPU, seen from a test:
 * fake_device_install() points MPROC_CUDART at the fake runtime library
 * (tests/cuda/fake_cudart.c, built by tests/cuda/cuda_runtime.cmake, path in
 * MP_FAKE_CUDART), so mproc's own loader dlopen()s it into its one function
 * table, exactly as it loads the real libcudart. `fake` then points at the
 * library's counters (the same instance mproc calls: dlopen of one path
 * gives one copy). Call it before any CUDA call of the process; children
 * inherit MPROC_CUDART. Header-only so tests and the benchmark share it. */
#ifndef MP_FAKE_DEVICE_H
#define MP_FAKE_DEVICE_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu.h"
#include "fake_cudart.h"

static fake_counters *fake;

/* 0, or -1 with the reason on stderr (fake runtime not built, or the real
 * runtime already loaded in this process). Zeroes the counters. */
static int fake_device_install(void)
{
#ifdef MP_FAKE_CUDART
    const char *path = MP_FAKE_CUDART;
    if (!fake) {
        setenv("MPROC_CUDART", path, 1);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        fake_counters *(*get)(void) = NULL;
        if (h)
            *(void **)&get = dlsym(h, "fake_cudart_counters");
        if (!get) {
            fprintf(stderr, "fake device: cannot load %s: %s\n", path, dlerror());
            return -1;
        }
        fake = get();
    }
    if (mp__cuda_load("fake_device_install") < 0 || strcmp(mp__cuda_library(), path) != 0) {
        fprintf(stderr, "fake device: mproc loaded %s, not the fake runtime %s (%s)\n",
                mp__cuda_library(), path, mp_last_error());
        return -1;
    }
    memset(fake, 0, sizeof *fake);
    return 0;
#else
    fprintf(stderr, "fake device: the fake CUDA runtime was not built (configure with "
                    "MPROC_BUILD_TESTS=ON)\n");
    return -1;
#endif
}

#endif
