/* mproc — tensors, refcounted storage, sharing strategies and DLPack.
 *
 * A tensor is a view (dtype, shape, strides in elements, byte offset, device)
 * over a refcounted storage, the model of DLPack's DLTensor. Views share the
 * storage and keep it alive. Tensors and storages are refcounted: every call
 * that hands out an mp_tensor* gives the caller one reference, dropped with
 * mp_tensor_release(). Release of NULL does nothing.
 *
 * Thread safety: refcounts are atomic; a tensor may be read from several
 * threads. Calls that change a tensor (share_memory_, set_grad) must not race
 * with other calls on the same tensor or its views.
 */
#ifndef MPROC_TENSOR_H
#define MPROC_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#include "mproc/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_tensor mp_tensor;

/* Element types. Values are stable; mp_dtype_to_dlpack() gives the DLPack
 * (code, bits, lanes). bool uses DLPack's kDLBool code (6) of DLPack >= 0.8. */
typedef enum mp_dtype {
    MP_BOOL = 0,
    MP_INT8,
    MP_INT16,
    MP_INT32,
    MP_INT64,
    MP_UINT8,
    MP_UINT16,
    MP_UINT32,
    MP_UINT64,
    MP_FLOAT16,
    MP_BFLOAT16,
    MP_FLOAT32,
    MP_FLOAT64,
    MP_DTYPE_COUNT
} mp_dtype;

#define MP_MAX_NDIM 16

/* Size in bytes of one element; 0 for an unknown dtype. */
MP_API size_t mp_dtype_size(mp_dtype dtype);
/* "float32", ...; "?" for an unknown dtype. */
MP_API const char *mp_dtype_name(mp_dtype dtype);
MP_API DLDataType mp_dtype_to_dlpack(mp_dtype dtype);
/* MP_EINVAL for a DLPack type with no mp_dtype (lanes != 1, complex, ...). */
MP_API int mp_dtype_from_dlpack(DLDataType dl, mp_dtype *out);

/* ---- creation ------------------------------------------------------------
 * shape: ndim (0..MP_MAX_NDIM) non-negative sizes; a 0-d tensor has one
 * element. Errors: MP_EINVAL (bad dtype, ndim, negative size; the sentence
 * names which), MP_EOVERFLOW (byte size overflows), MP_ENOMEM, and for
 * shared memory MP_ENOSPC ("needs N bytes, /dev/shm has M free"), MP_EMFILE. */

/* Contiguous tensor in private (malloc'd, 64-byte aligned) memory, zeroed. */
MP_API int mp_tensor_empty(mp_dtype dtype, int ndim, const int64_t *shape, mp_tensor **out);
/* Contiguous tensor created directly in shared memory under the current
 * sharing strategy (no later copy), zeroed. */
MP_API int mp_tensor_empty_shared(mp_dtype dtype, int ndim, const int64_t *shape, mp_tensor **out);

/* Borrows user memory: `data` holds nbytes; strides NULL means contiguous.
 * release(data, ctx) is called once when the last reference goes, or as soon
 * as mp_tensor_share_memory_ has copied the bytes out (may be NULL). On
 * failure release is NOT called and nothing is retained. */
typedef void (*mp_release_fn)(void *data, void *ctx);
MP_API int mp_tensor_from_blob(void *data, size_t nbytes, mp_dtype dtype, int ndim,
                               const int64_t *shape, const int64_t *strides,
                               mp_release_fn release, void *ctx, mp_tensor **out);

/* New contiguous private tensor with t's values (and no grad). */
MP_API int mp_tensor_clone(const mp_tensor *t, mp_tensor **out);
/* Copies src's values into dst (same shape, same dtype; any strides). */
MP_API int mp_tensor_copy_(mp_tensor *dst, const mp_tensor *src);

/* Adds a reference (returns t) / drops one; the last frees the tensor and,
 * with its last view, the storage. Release of NULL does nothing. */
MP_API mp_tensor *mp_tensor_retain(mp_tensor *t);
MP_API void mp_tensor_release(mp_tensor *t);

/* ---- properties (never fail; t must be valid) --------------------------- */
MP_API mp_dtype mp_tensor_dtype(const mp_tensor *t);
MP_API int mp_tensor_ndim(const mp_tensor *t);
MP_API const int64_t *mp_tensor_shape(const mp_tensor *t);
MP_API const int64_t *mp_tensor_strides(const mp_tensor *t);   /* in elements */
/* Size of dim (negative counts from the end); -1 for a dim out of range. */
MP_API int64_t mp_tensor_size(const mp_tensor *t, int dim);
MP_API uint64_t mp_tensor_byte_offset(const mp_tensor *t);     /* into the storage */
MP_API int64_t mp_tensor_numel(const mp_tensor *t);
MP_API size_t mp_tensor_element_size(const mp_tensor *t);
MP_API size_t mp_tensor_nbytes(const mp_tensor *t);            /* numel * element size */
MP_API bool mp_tensor_is_contiguous(const mp_tensor *t);
MP_API DLDevice mp_tensor_device(const mp_tensor *t);
/* Address of element [0,...,0] (storage base + byte offset). For CUDA
 * tensors a device pointer. */
MP_API void *mp_tensor_data(const mp_tensor *t);
/* Bytes in the underlying storage. */
MP_API size_t mp_tensor_storage_nbytes(const mp_tensor *t);
/* True when t and u are views of one storage. */
MP_API bool mp_tensor_same_storage(const mp_tensor *t, const mp_tensor *u);

/* ---- views: share storage, keep it alive; MP_EINVAL when out of bounds --- */
/* Elements [start, start+length) of dim. */
MP_API int mp_tensor_narrow(const mp_tensor *t, int dim, int64_t start, int64_t length,
                            mp_tensor **out);
/* Python-style t[start:stop:step] along dim (step >= 1, stop clamped). */
MP_API int mp_tensor_slice(const mp_tensor *t, int dim, int64_t start, int64_t stop, int64_t step,
                           mp_tensor **out);
/* Removes dim by fixing its index. */
MP_API int mp_tensor_select(const mp_tensor *t, int dim, int64_t index, mp_tensor **out);
/* Reshape of a contiguous tensor; one size may be -1 (inferred). */
MP_API int mp_tensor_reshape(const mp_tensor *t, int ndim, const int64_t *shape, mp_tensor **out);
MP_API int mp_tensor_transpose(const mp_tensor *t, int dim0, int dim1, mp_tensor **out);
/* dims: a permutation of 0..ndim-1. */
MP_API int mp_tensor_permute(const mp_tensor *t, const int *dims, mp_tensor **out);
/* Any view whose every reachable element lies inside the storage; strides may
 * be zero or negative. byte_offset is absolute in the storage. */
MP_API int mp_tensor_as_strided(const mp_tensor *t, int ndim, const int64_t *shape,
                                const int64_t *strides, uint64_t byte_offset, mp_tensor **out);

/* ---- grad ---------------------------------------------------------------- */
/* Attaches grad (retained; NULL detaches). grad must have t's shape and dtype
 * and must not be t itself. Sharing t shares its grad too. */
MP_API int mp_tensor_set_grad(mp_tensor *t, mp_tensor *grad);
/* Borrowed pointer to t's grad, or NULL. Valid while t holds it. */
MP_API mp_tensor *mp_tensor_grad(const mp_tensor *t);

/* ---- shared memory --------------------------------------------------------
 * share_memory_ moves t's storage (and its grad's) into shared memory under
 * the current sharing strategy: one copy, then every view of that storage,
 * in this process, sees the shared memory. A no-op when already shared.
 * Borrowed (from_blob) and DLPack-imported storages are copied too, and their
 * memory is handed back (release / deleter) right away. MP_ESTATE while the
 * storage is exported through DLPack (a consumer holds its address). */
MP_API int mp_tensor_share_memory_(mp_tensor *t);
MP_API bool mp_tensor_is_shared(const mp_tensor *t);

/* ---- statistics -----------------------------------------------------------
 * What this process moved into and out of shared memory for tensor
 * storages, to check that a program does no more than it means to: that a
 * reused buffer is not copied again, that a receiver maps each segment once
 * and unmaps what it released. Only storage segments count (not the control
 * blocks of queues, pipes and sync objects, nor spilled payloads). Counted
 * since the process started; a child started with fork begins with its
 * parent's values (it inherits its memory and mappings), so measure
 * differences. */
typedef struct mp_tensor_stats {
    size_t size;                /* sizeof(mp_tensor_stats), set by the caller */
    /* Storages copied into shared memory by mp_tensor_share_memory_ (or by
     * sending a private tensor, which shares it), and the bytes copied. */
    uint64_t shared_copies;
    uint64_t shared_copy_bytes;
    /* Segments this process created for storages: those copies, and
     * mp_tensor_empty_shared, which copies nothing. */
    uint64_t segments_created;
    /* Storage segments that arrived in messages (an fd under
     * file_descriptor, a name under file_system), and of those the ones
     * mapped anew; the others reused a mapping this process had already. */
    uint64_t segments_received;
    uint64_t segments_mapped;
    /* Storage segments unmapped (the last tensor over one was released),
     * and those mapped now: created + mapped - unmapped. */
    uint64_t segments_unmapped;
    uint64_t segments_live;
    /* Of segments_received, those that arrived with no fd because the
     * receiving end had pinned them: a file_descriptor storage sent to the
     * same pipe or queue end again (docs/tensor.md, "Handoff without an
     * fd"). */
    uint64_t segments_received_by_pin;
} mp_tensor_stats;
/* Fills *out with this process's counters (see above). Set size first:
 * mp_tensor_stats st = {.size = sizeof st}; mp_tensor_stats_get(&st);
 * a smaller (older) struct gets the fields it has, a larger one zeros in
 * the fields this library does not know. Never blocks; thread-safe and
 * safe after fork; each field is exact, but fields are read one by one
 * while other threads may be sharing. MP_EINVAL when out is NULL or its
 * size is not set. */
MP_API int mp_tensor_stats_get(mp_tensor_stats *out);

/* ---- adopting foreign shared memory ---------------------------------------
 * A 1-d MP_UINT8 tensor of nbytes over bytes [offset, offset + nbytes) of a
 * shared-memory file another library made (torch's file_descriptor
 * storages, your own memfd), without copying: the tensor IS that memory,
 * and it travels in messages as its fd, like mproc's own segments (under
 * both strategies: it has no mproc name). fd is duplicated; the caller keeps
 * and closes its own whenever it likes. The memory lives while the tensor,
 * or any tensor a receiver made of it, lives, whatever the foreign owner
 * does (exits, unlinks, closes). Adopting one file twice, or a file this
 * process already received, gives views of one storage.
 * Accepted: a regular file sealed against shrinking (a memfd with
 * F_SEAL_SHRINK) or unlinked from /dev/shm (shm_open + shm_unlink: only fd
 * holders reach it). Differs from mproc's own segments: an unsealed file can
 * still be shrunk by a holder of its fd (a reader then gets SIGBUS), and its
 * pages are reserved only as far as the owner did (mproc allocates all of
 * its own at creation), so adopt only memory whose owner never resizes it
 * (torch never does).
 * The shared_copies counter (mp_tensor_stats_get) does not change.
 * Blocks: no. Thread-safe.
 * Errors: MP_EINVAL (fd not open; a pipe, socket or disk file; a named
 * /dev/shm segment; an unsealed memfd; a file of fewer than offset + nbytes
 * bytes: the sentence says which and what to do), MP_EOVERFLOW, MP_EMFILE,
 * MP_ENOMEM. */
MP_API int mp_tensor_adopt_fd(int fd, uint64_t offset, size_t nbytes, mp_tensor **out);

/* ---- sharing strategies --------------------------------------------------
 * "file_descriptor" (default): sealed memfd segments; the fd travels in the
 * message. "file_system": named /dev/shm segments ("/mproc-..."), unlinked by
 * their last user or, after a crash, by mproc-shm-manager. The strategy is
 * per process and applies to storages shared after the call. */
/* NULL-terminated static list of the strategies, the default first (the
 * shape of every "list all names" call, as mp_get_all_start_methods). */
MP_API const char *const *mp_get_all_sharing_strategies(void);
MP_API const char *mp_get_sharing_strategy(void);
/* MP_ENOENT for an unknown name; the sentence lists the valid ones. */
MP_API int mp_set_sharing_strategy(const char *name);
/* The strategy a shared tensor's storage uses, or NULL if not shared. */
MP_API const char *mp_tensor_sharing_strategy(const mp_tensor *t);

/* ---- DLPack ---------------------------------------------------------------
 * Export: *out views t's memory (no copy); its deleter drops the reference
 * the export took. Import: m's memory is shared, not copied; m->deleter is
 * called when the tensor's last reference goes. On import failure the caller
 * still owns m. Import takes CPU (kDLCPU) and CUDA (kDLCUDA) memory; any
 * other device is MP_ENOTSUP (the sentence names it), since no mproc call
 * could read, copy or send it. MP_EINVAL for a bad dtype, ndim, shape or
 * NULL data; MP_EOVERFLOW when the sizes or offset overflow. */
MP_API int mp_tensor_to_dlpack(mp_tensor *t, DLManagedTensor **out);
MP_API int mp_tensor_from_dlpack(DLManagedTensor *m, mp_tensor **out);

#ifdef __cplusplus
}
#endif
#endif
