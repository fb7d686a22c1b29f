/* mproc — CUDA tensors across processes (optional at build time).
 *
 * A CUDA tensor is an mp_tensor whose DLPack device is (kDLCUDA, index): a
 * view over one device allocation. It travels in a message as an
 * MP_ATTACH_CUDA_TENSOR attachment: the CUDA IPC handle of the allocation's
 * base, the view's byte offset and geometry, an IPC event that orders the
 * receiver after the sender's pending work, and one reference in the
 * producer's shared reference-count segment. The producer keeps the memory
 * alive while any reference is held: freeing a tensor that is still shared
 * moves its allocation to a pending list, really freed when the count drops
 * to zero (checked on later frees and by mp_cuda_ipc_collect()). A received
 * tensor can be sent on to a third process (same allocation, same counter).
 *
 * The CUDA runtime does not survive fork: after any CUDA call in this process
 * start children with the spawn or forkserver method.
 *
 * libmproc is never linked with the CUDA runtime: the first call below loads
 * it with dlopen (libcudart.so.<major of the toolkit mproc was built with>,
 * or the library named by the MPROC_CUDART environment variable, read
 * once). Where it cannot be loaded (no CUDA installed, or a library that is
 * not a CUDA runtime), every function below except mp_tensor_is_cuda returns
 * MP_ENOTSUP with a sentence naming the library and the fix; so does a build
 * without the CUDA headers (-DMPROC_CUDA=OFF, or no toolkit found), saying
 * how to enable CUDA. Programs that never call these need no CUDA at all.
 *
 * Streams: mproc uses the legacy default stream of each device. Copies are
 * synchronous with respect to the host.
 */
#ifndef MPROC_CUDA_H
#define MPROC_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mproc/error.h"
#include "mproc/msg.h"
#include "mproc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when this build has CUDA support and at least one device is usable.
 * Never fails; initialises the CUDA runtime when a device is found (after
 * which fork is refused). Thread-safe. */
MP_API bool mp_cuda_is_available(void);

/* Number of visible CUDA devices in *count (0 is a success: no GPU). Asked
 * of the CUDA runtime once per process (a forked child asks again), then
 * cached, as is a failure. Errors: MP_EINVAL (count NULL), MP_ENOTSUP (built
 * without CUDA, or no CUDA runtime could be loaded), MP_ESYS when the driver
 * cannot be used (the sentence has the CUDA error text). */
MP_API int mp_cuda_device_count(int *count);

/* Waits until all work queued on device's default stream has finished.
 * Blocks. Errors: MP_EINVAL (bad device), MP_ENOTSUP, MP_ESYS. */
MP_API int mp_cuda_synchronize(int device);

/* True when t lives on a CUDA device (kDLCUDA). t must be valid. */
MP_API bool mp_tensor_is_cuda(const mp_tensor *t);

/* New contiguous, zeroed tensor on CUDA device `device`; the caller owns the
 * reference. Blocks until the memory is zeroed. Errors: MP_EINVAL (bad
 * device, dtype, ndim or size), MP_EOVERFLOW, MP_ENOMEM (device out of
 * memory), MP_ENOTSUP, MP_ESYS. */
MP_API int mp_tensor_empty_cuda(int device, mp_dtype dtype, int ndim, const int64_t *shape,
                                mp_tensor **out);

/* New contiguous tensor on device with src's values; src may be on the CPU
 * (any strides) or on a CUDA device. Blocks until copied. Errors as
 * mp_tensor_empty_cuda. */
MP_API int mp_tensor_to_cuda(const mp_tensor *src, int device, mp_tensor **out);

/* New contiguous private CPU tensor with src's values (src on a CUDA device,
 * any strides, or on the CPU). Blocks until copied. */
MP_API int mp_tensor_to_cpu(const mp_tensor *src, mp_tensor **out);

/* Copies src's values into dst in place: same dtype and shape, both
 * contiguous, each on the CPU or a CUDA device. Blocks until copied.
 * Errors: MP_EINVAL (mismatch, non-contiguous), MP_ENOTSUP, MP_ESYS. */
MP_API int mp_tensor_copy_cuda_(mp_tensor *dst, const mp_tensor *src);

/* ---- sending ---------------------------------------------------------------
 * add: attaches t (retained) as MP_ATTACH_CUDA_TENSOR. t must view memory
 * allocated by mproc (mp_tensor_empty_cuda / mp_tensor_to_cuda) or received
 * in a message; MP_EINVAL otherwise (a DLPack-imported CUDA tensor: copy it
 * with mp_tensor_to_cuda first). The IPC handle and the reference are taken
 * when the message is sent, so a message sent twice holds two references.
 * get: a new reference to attachment index, a CUDA tensor on the device it
 * was sent from; MP_EINVAL when the attachment is not a CUDA tensor.
 * Received tensors over one allocation share one device mapping (opened
 * once per process and device); the last one released closes it and drops
 * the shared reference. A message that is never received (a send that
 * failed, a queue destroyed full) keeps its reference until the process
 * that sent it exits. */
MP_API int mp_msg_add_cuda_tensor(mp_msg *m, const char *name, mp_tensor *t);
MP_API int mp_msg_get_cuda_tensor(const mp_msg *m, size_t index, mp_tensor **out);

/* ---- producer-side reference counting ------------------------------------ */

/* Frees every pending allocation whose shared count reached zero (references
 * held by processes that died are reclaimed first). *freed (may be NULL)
 * gets how many were freed. Does not block on other processes. Thread-safe.
 * Errors: MP_ENOTSUP, MP_ESYS (cudaFree failed; the allocation stays). */
MP_API int mp_cuda_ipc_collect(size_t *freed);

/* Number of allocations this process freed while still shared, waiting for
 * their consumers (the pending list). Errors: MP_EINVAL, MP_ENOTSUP. */
MP_API int mp_cuda_ipc_pending(size_t *count);

/* Number of live references other processes (and messages in flight) hold
 * on t's allocation, in *count. Works in the producer and in any receiver.
 * Errors: MP_EINVAL (not a CUDA tensor from mproc), MP_ENOTSUP, MP_ECLOSED
 * (the producer of the allocation has exited: its memory may be gone). */
MP_API int mp_tensor_cuda_share_count(const mp_tensor *t, int *count);

#ifdef __cplusplus
}
#endif
#endif
