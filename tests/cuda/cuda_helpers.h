/* Helpers shared by the CUDA tests (fake device and real GPU): one CUDA
 * tensor per SOCK_SEQPACKET record through the attachment kind's own
 * encode/decode, value checks through host copies, and CHECK for code that
 * runs in helper processes (exits with the failing line, no cmocka). */
#ifndef MP_CUDA_HELPERS_H
#define MP_CUDA_HELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mproc.h"
#include "cuda/cuda_internal.h"
#include "os/os.h"
#include "wire/wire.h"

#define CHECK(x)                                                                  \
    do {                                                                          \
        if (!(x)) {                                                               \
            fprintf(stderr, "child %d: %s:%d: %s (%s)\n", (int)getpid(), __FILE__, \
                    __LINE__, #x, mp_last_error());                               \
            _exit(100);                                                           \
        }                                                                         \
    } while (0)

static inline int send_tensor(int sock, mp_tensor *t)
{
    const mp__objkind *k = &mp__cuda_tensor_kind;
    uint8_t buf[1024];
    size_t len;
    int fds[4], nfds = 0, rc;
    if ((rc = k->encode(t, buf, sizeof buf, &len, fds, 4, &nfds)) < 0)
        return rc;
    return mp__send_record(sock, buf, len, fds, nfds, mp__deadline(20));
}

static inline int recv_tensor(int sock, mp_tensor **out)
{
    const mp__objkind *k = &mp__cuda_tensor_kind;
    uint8_t buf[1024];
    size_t len;
    int fds[4], nfds = 0, rc;
    if ((rc = mp__recv_record(sock, buf, sizeof buf, &len, fds, 4, &nfds, mp__deadline(20))) < 0)
        return rc;
    return k->decode(buf, len, fds, nfds, (void **)out);
}

/* A float32 tensor 0, 1, 2, ... of rows x cols on CUDA device `device`. */
static inline mp_tensor *iota_cuda(int device, int64_t rows, int64_t cols)
{
    mp_tensor *h = NULL, *d = NULL;
    int64_t shape[2] = {rows, cols};
    if (mp_tensor_empty(MP_FLOAT32, 2, shape, &h) < 0)
        return NULL;
    float *p = mp_tensor_data(h);
    for (int64_t i = 0; i < rows * cols; i++)
        p[i] = (float)i;
    mp_tensor_to_cuda(h, device, &d);
    mp_tensor_release(h);
    return d;
}

/* True when d's n elements (in order) are first, first + step, ... */
static inline bool values_are(const mp_tensor *d, float first, float step, int64_t n)
{
    mp_tensor *h = NULL;
    bool ok = mp_tensor_to_cpu(d, &h) == 0 && mp_tensor_numel(h) == n;
    for (int64_t i = 0; ok && i < n; i++)
        ok = ((float *)mp_tensor_data(h))[i] == first + step * (float)i;
    mp_tensor_release(h);
    return ok;
}

/* Adds 1 to every element of a contiguous float32 CUDA tensor, in place. */
static inline void add_one(mp_tensor *d)
{
    mp_tensor *h = NULL;
    CHECK(mp_tensor_to_cpu(d, &h) == 0);
    for (int64_t i = 0; i < mp_tensor_numel(h); i++)
        ((float *)mp_tensor_data(h))[i] += 1;
    CHECK(mp_tensor_copy_cuda_(d, h) == 0);
    mp_tensor_release(h);
}

#endif
