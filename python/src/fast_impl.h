/* What the two halves of the pickling fast paths share (fast.c: torch's
 * objects, the weak caches, sending, the module functions; fast_recv.c:
 * receiving). Private to them. Everything here is used under the GIL. */
#ifndef MPROC_PY_FAST_IMPL_H
#define MPROC_PY_FAST_IMPL_H

#include "mpy.h"

/* torch dtypes a frame can name: the index is the code on the wire. */
typedef struct {
    const char *name;
    int size;
} mpy_dtype;

#define MPY_NDTYPES 12
extern const mpy_dtype mpy_dtypes[]; /* MPY_NDTYPES of them (fast.c checks) */

typedef struct {
    PyObject *registry; /* mproc._sharing._registry: address -> weakref(Storage) */
    PyObject *register_fn, *dumps_py, *loads_py;
    PyObject *pickle_dumps, *pickle_loads, *protocol;
    PyObject *rx_cache; /* address -> weakref(a torch tensor over that memory) */
    PyObject *tensor_type, *strided, *from_dlpack, *empty, *codes; /* torch's, once imported */
    PyObject *dtypes[MPY_NDTYPES], *protos[MPY_NDTYPES];
} mpy_fast_state;

extern mpy_fast_state mpy_fast;

/* Interned attribute and method names. */
typedef struct {
    PyObject *storage, *untyped_storage, *data_ptr, *nbytes, *size, *stride, *offset, *dtype,
        *layout, *is_cpu, *requires_grad, *is_leaf, *grad, *new, *set, *rg_, *torch, *is_conj,
        *is_neg;
} mpy_names;

extern mpy_names mpy_name;

/* 1 once torch is imported and its objects are looked up, 0 while it is
 * not (or half imported), -1 on error. */
int mpy_torch_ready(void);
/* t's UntypedStorage (a new reference), under either torch's spelling. */
PyObject *mpy_untyped_storage(PyObject *t);
/* o.name() as a long long: 0, or -1 with an exception. */
int mpy_call_ssize(PyObject *o, PyObject *name, long long *out);
/* The live object a weakref dict holds for key, or NULL (no exception). */
PyObject *mpy_weak_get(PyObject *dict, PyObject *key);
/* Remembers tensor as the receive cache's entry for address key. */
int mpy_rx_remember(PyObject *key, PyObject *tensor);
/* The registered mproc Storage for the memory at address key, or NULL. */
PyObject *mpy_registered(PyObject *key);

#endif
