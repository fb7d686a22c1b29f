/* Inside src/tensor: the tensor and storage structs. */
#ifndef MPROC_TENSOR_PRIV_H
#define MPROC_TENSOR_PRIV_H

#include <stdatomic.h>
#include <stdbool.h>

#include "tensor/tensor_internal.h"

enum { MP__ST_PRIVATE, MP__ST_WRAPPED, MP__ST_SEGMENT };

struct mp__storage {
    atomic_long refs;
    atomic_int exports; /* live DLPack exports: they hold raw pointers */
    int kind;           /* MP__ST_* */
    void *data;
    size_t nbytes;
    DLDevice dev;
    mp__segment *seg;      /* MP__ST_SEGMENT */
    mp_release_fn release; /* MP__ST_WRAPPED */
    void *ctx;             /* WRAPPED: release's ctx; PRIVATE: the calloc'd block */
    void *user;
};

struct mp_tensor {
    atomic_long refs;
    mp__storage *storage;
    mp_dtype dtype;
    int ndim;
    int64_t shape[MP_MAX_NDIM];
    int64_t strides[MP_MAX_NDIM];
    uint64_t offset; /* bytes into the storage */
    mp_tensor *grad;
    bool canonical; /* strides are exactly mp__contiguous_strides(shape) (set once) */
};

/* Zeroed private (64-byte aligned) storage of nbytes. */
int mp__storage_alloc(size_t nbytes, mp__storage **out);
/* The bytes a view reaches, relative to element 0: [*lo, *end) with *lo <= 0
 * (negative strides) and *end > 0; both 0 for a view with no elements.
 * Sizes must be valid (>= 0); MP_EOVERFLOW names call. */
int mp__view_span(const char *call, mp_dtype dtype, int ndim, const int64_t *shape,
                  const int64_t *strides, int64_t *lo, int64_t *end);
/* numel * element size with overflow checks: MP_EINVAL / MP_EOVERFLOW. */
int mp__shape_nbytes(const char *call, mp_dtype dtype, int ndim, const int64_t *shape,
                     size_t *nbytes);
/* Strided copy of equal shapes and dtypes (no overlap checks). */
void mp__copy_strided(const mp_tensor *dst, const mp_tensor *src);

/* A zeroed storage of nbytes in a new shared segment (current strategy). */
int mp__storage_shared_new(size_t nbytes, mp__storage **out);
/* The same, written from parts (see mp__segment_create_filled); parts NULL
 * is mp__storage_shared_new. */
int mp__storage_shared_filled(size_t nbytes, const mp__segment_part *parts, int nparts,
                              mp__storage **out);

/* The counters of mp_tensor_stats_get (stats.c): a storage of nbytes was
 * copied into shared memory; a storage was linked to a segment, one this
 * process created or one that came in a message (from_message), over a
 * mapping no storage used before (new_mapping). */
void mp__tensor_stats_copied(size_t nbytes);
void mp__tensor_stats_linked(bool from_message, bool new_mapping);

#endif
