/* Shared tensors for receivers that fill every byte themselves (the MPI
 * layer receives into them): their storage comes from the pool of
 * reusable segments (shm/recycle.h) and goes back to it once its last
 * reference is gone, unless it left this process meanwhile. */
#ifndef MPROC_TENSOR_RECYCLE_H
#define MPROC_TENSOR_RECYCLE_H

#include "tensor/tensor_internal.h"

/* A contiguous tensor in shared memory, as mp_tensor_empty_shared makes,
 * but with unspecified contents under the file_descriptor strategy (a
 * reused segment keeps older bytes: write them all). Under file_system it
 * is an ordinary zeroed mp_tensor_empty_shared tensor (named segments are
 * never reused). Errors as mp_tensor_empty_shared. */
int mp__tensor_empty_reusable(mp_dtype dtype, int ndim, const int64_t *shape, mp_tensor **out);

#endif
