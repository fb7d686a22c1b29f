/* What the layers above tensor (wire, cuda) need of storages and tensors. */
#ifndef MPROC_TENSOR_INTERNAL_H
#define MPROC_TENSOR_INTERNAL_H

#include "mproc/tensor.h"
#include "os/os.h"
#include "shm/shm.h"

/* Refcounted storage: one block of bytes on one device. */
typedef struct mp__storage mp__storage;

mp__storage *mp__storage_retain(mp__storage *s);
void mp__storage_release(mp__storage *s);
/* Borrowed: the storage a tensor views. */
mp__storage *mp__tensor_storage(const mp_tensor *t);
void *mp__storage_data(const mp__storage *s);
size_t mp__storage_nbytes(const mp__storage *s);
DLDevice mp__storage_device(const mp__storage *s);
/* Borrowed: the shared segment behind a CPU storage, or NULL if private. */
mp__segment *mp__storage_segment(const mp__storage *s);
/* Moves a CPU storage into shared memory (no-op if shared). */
int mp__storage_share(mp__storage *s);
/* A 1-d uint8 tensor of nbytes over a new shared segment written from parts
 * (mp__segment_create_filled): one pass over the data for a tensor that
 * starts as a copy of others (the Python binding's per-message arena). */
int mp__tensor_shared_filled(size_t nbytes, const mp__segment_part *parts, int nparts,
                             mp_tensor **out);

/* The one storage wrapping seg, a segment received in a message, in this
 * process (created on first use, retained on later calls), so tensors
 * received over one segment are views of one storage. */
int mp__storage_from_segment(mp__segment *seg, mp__storage **out);

/* Wraps foreign memory on any device; release(data, ctx) runs when the last
 * reference goes (not on failure). Used by from_blob, DLPack and CUDA. */
int mp__storage_wrap(void *data, size_t nbytes, DLDevice dev, mp_release_fn release,
                     void *ctx, mp__storage **out);
/* A per-storage slot for layers above (CUDA keeps its IPC state there). */
void *mp__storage_user(const mp__storage *s);
void mp__storage_set_user(mp__storage *s, void *user);

/* A view over s, validated exactly as mp_tensor_as_strided does (dtype known,
 * ndim 0..16, sizes >= 0, no overflow, every reachable element inside s);
 * MP_EINVAL otherwise with the reason in a sentence that starts with call
 * (the public call made, or "receiving a message"). Retains s. */
int mp__tensor_make(const char *call, mp__storage *s, mp_dtype dtype, int ndim,
                    const int64_t *shape, const int64_t *strides, uint64_t byte_offset,
                    mp_tensor **out);

/* What a message encoder needs of a tensor, read in one call. */
typedef struct mp__tensor_view {
    mp__segment *seg; /* the shared segment of a CPU storage, else NULL */
    const int64_t *shape, *strides;
    uint64_t byte_offset;
    mp_dtype dtype;
    int ndim;
    bool has_grad;
    bool canonical;   /* strides are exactly mp__contiguous_strides of shape */
} mp__tensor_view;
void mp__tensor_view_of(const mp_tensor *t, mp__tensor_view *v);

/* Whether the caller's reference is t's only one, t has no grad, and t is
 * exactly this view of its storage: such a tensor can be handed out again
 * as a new one (the compact decoder's keepsake). */
bool mp__tensor_is_sole_view(const mp_tensor *t, mp_dtype dtype, int ndim, const int64_t *shape,
                             const int64_t *strides, uint64_t byte_offset);

/* Contiguous strides for shape (sizes below 1 count as 1); false when
 * they overflow int64, as an unchecked shape's may (a decoder's): a shape
 * checked already (mp__shape_nbytes) never does. */
bool mp__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);

/* Checks a view's geometry against a storage of nbytes without creating it:
 * 0, or MP_EINVAL / MP_EOVERFLOW with the reason, after "call: ". */
int mp__tensor_check_geometry(const char *call, mp_dtype dtype, int ndim, const int64_t *shape,
                              const int64_t *strides, uint64_t byte_offset, size_t nbytes);

/* "cpu", "cuda:0", "opencl:1", ...: a device as a sentence names it. */
const char *mp__device_label(DLDevice dev, char *buf, size_t cap);
/* MP_EINVAL unless dst and src have one dtype and one shape, as a copy
 * between them needs; the sentence shows both. */
int mp__tensor_check_same_layout(const char *call, const mp_tensor *dst, const mp_tensor *src);

#endif
