/* The counters of the fake CUDA runtime (tests/cuda/fake_cudart.c), shared by
 * the fake library and the tests that read them (tests/cuda/fake_device.h).
 * One copy per process: a forked child starts from its parent's values. */
#ifndef MP_FAKE_CUDART_H
#define MP_FAKE_CUDART_H

typedef struct fake_counters {
    int device;        /* the current device */
    int count_calls;   /* cudaGetDeviceCount: mproc should ask once per process */
    int mallocs, frees, opens, closes, events, event_frees, waits, records;
    int stream_busy;   /* cudaStreamQuery answers "not ready" while set (tests set it) */
} fake_counters;

/* Exported by the fake runtime: its counters (tests zero them with memset). */
fake_counters *fake_cudart_counters(void);

#endif
