/* The bytes of an MP_ATTACH_CUDA_TENSOR attachment (CPU only, no CUDA
 * needed). One fd travels beside them: the producer's reference segment.
 *
 *   u32 magic "MPCU"  u16 version  u16 flags (bit 0: event handle present)
 *   i32 device  i32 dtype  i32 ndim  u32 producer pid
 *   u32 slot  u32 generation  u32 reference index  u32 reserved (0)
 *   u64 reference word
 *   u64 allocation bytes  u64 view byte offset into the allocation
 *   64 bytes cudaIpcMemHandle of the allocation base
 *   64 bytes cudaIpcEventHandle (zero when flag 0 is clear)
 *   i64 shape[ndim]  i64 strides[ndim] (elements)
 *
 * All integers little-endian. The decoder trusts nothing: sizes, dtype,
 * ndim, device, the word's fields and the view geometry against the
 * allocation are checked, MP_EPROTO otherwise. */
#ifndef MPROC_CUDA_FRAME_H
#define MPROC_CUDA_FRAME_H

#include "mproc/tensor.h"
#include "os/os.h"

#define MP__CUDA_FRAME_MAGIC 0x5543504du /* "MPCU" */
#define MP__CUDA_FRAME_VERSION 1u
#define MP__CUDA_HANDLE_BYTES 64
#define MP__CUDA_MAX_DEVICE 4096
#define MP__CUDA_FRAME_FIXED (4 + 2 + 2 + 4 * 8 + 8 * 3 + 2 * MP__CUDA_HANDLE_BYTES)
#define MP__CUDA_FRAME_MAX (MP__CUDA_FRAME_FIXED + 16 * MP_MAX_NDIM)

typedef struct mp__cuda_frame {
    int32_t device;
    int32_t dtype;
    int32_t ndim;
    uint32_t producer_pid;
    uint32_t slot;
    uint32_t gen;
    uint32_t ref;
    uint64_t ref_word;
    uint64_t alloc_nbytes;
    uint64_t byte_offset;
    bool has_event;
    uint8_t mem_handle[MP__CUDA_HANDLE_BYTES];
    uint8_t event_handle[MP__CUDA_HANDLE_BYTES];
    int64_t shape[MP_MAX_NDIM];
    int64_t strides[MP_MAX_NDIM];
} mp__cuda_frame;

/* Writes f into buf (cap bytes); MP_EOVERFLOW when it does not fit,
 * MP_EINVAL for an f the decoder would refuse. */
int mp__cuda_frame_encode(const mp__cuda_frame *f, void *buf, size_t cap, size_t *len);
/* Parses and validates len bytes into *f; MP_EPROTO with the reason. */
int mp__cuda_frame_decode(const void *buf, size_t len, mp__cuda_frame *f);

#endif
