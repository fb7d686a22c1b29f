/* mproc's CPython binding: what the extension's files share.
 *
 * Every libmproc call the binding makes goes through these files; the calls
 * into libmproc's internals (the wire encoder, a connection's socket) are all
 * in internal.c, so an API change touches few places. Naming: mpy_ for the
 * binding's own C functions, Python types are _mproc.Storage, _mproc.Queue,
 * _mproc.Conn. */
#ifndef MPROC_PY_MPY_H
#define MPROC_PY_MPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "mproc/error.h"
#include "mproc/msg.h"
#include "mproc/queue.h"
#include "mproc/tensor.h"

/* A refcounted mproc tensor: in this binding nearly always a 1-d uint8 view
 * of a whole shared storage, which Python code reinterprets as any torch
 * tensor or NumPy array (dtype, shape, strides, offset) over it. */
typedef struct {
    PyObject_HEAD
    mp_tensor *t;
    PyObject *weakrefs;
} mpy_storage;

typedef struct {
    PyObject_HEAD
    mp_queue *q;          /* Queue and JoinableQueue */
    mp_simple_queue *sq;  /* SimpleQueue */
    PyObject *weakrefs;
} mpy_queue;

typedef struct {
    PyObject_HEAD
    mp_conn *c;
    PyObject *weakrefs;
} mpy_conn;

extern PyTypeObject mpy_storage_type;
extern PyTypeObject mpy_queue_type;
extern PyTypeObject mpy_conn_type;

/* Raises the Python exception for an mproc failure code, carrying
 * mp_last_error()'s sentence; returns NULL for `return mpy_raise(rc);`. */
PyObject *mpy_raise(int rc);
/* New Storage owning the reference *t (taken over; released on failure). */
PyObject *mpy_storage_wrap(mp_tensor *t);
PyObject *mpy_queue_wrap_queue(mp_queue *q);
PyObject *mpy_queue_wrap_simple(mp_simple_queue *q);
PyObject *mpy_conn_wrap(mp_conn *c);

/* A message from (payload, attachments); attachments may be None. NULL with
 * a Python exception set on failure. */
mp_msg *mpy_msg_build(PyObject *payload, PyObject *atts);
/* The same for a message sent at once and destroyed while the caller still
 * holds payload: a large bytes payload is borrowed, not copied. */
mp_msg *mpy_msg_build_to_send(PyObject *payload, PyObject *atts);
/* (payload bytes, attachment list or None) from m; m stays the caller's. */
PyObject *mpy_msg_unpack(const mp_msg *m);

/* A timeout argument: None waits forever (-1), else seconds >= 0. */
int mpy_timeout(PyObject *o, double *out);
/* Runs a blocking call in slices so Ctrl-C reaches Python: call(obj, slice)
 * returns an mproc code; MP_ETIMEDOUT/MP_EAGAIN of a slice retry until the
 * caller's timeout has passed. Returns the last code, or MP_EINVAL with a
 * Python exception set when a signal handler raised. */
typedef int (*mpy_blocking_fn)(void *ctx, double timeout);
int mpy_wait(mpy_blocking_fn call, void *ctx, double timeout);

/* internal.c: libmproc's internals the binding needs. */
int mpy_wire_encode(const mp_msg *m, void **buf, size_t *len, int *fds, int *nfds, int maxfds);
int mpy_wire_decode(const void *buf, size_t len, int *fds, int nfds, mp_msg **out);
int mpy_conn_fileno(const mp_conn *c);
/* Storages this process keeps pinned for the ends it receives on (tests). */
int mpy_pins_held(void);
/* mp__msg_borrow_payload: data is m's payload until m is destroyed. */
void mpy_msg_borrow_payload(mp_msg *m, const void *data, size_t len);
/* SimpleQueue's put and get with a timeout (< 0 forever), which the public
 * calls do not take, so that mpy_wait can run signal handlers between
 * slices: Ctrl-C interrupts a blocked SimpleQueue.get as it does a Queue's. */
int mpy_simple_queue_put(mp_simple_queue *q, const mp_msg *m, double timeout);
int mpy_simple_queue_get(mp_simple_queue *q, mp_msg **out, double timeout);
/* nbytes of a new shared uint8 tensor written from parts (sorted by off, not
 * overlapping), in one pass and without page faults. */
typedef struct mpy_part {
    size_t off;
    const void *src;
    size_t nbytes;
} mpy_part;
int mpy_tensor_filled(size_t nbytes, const mpy_part *parts, int nparts, mp_tensor **out);

/* fast.c, fast_recv.c: obj as an mproc message (payload bytes, attachment
 * list or NULL for none), and back; -1/NULL with a Python exception on failure. */
int mpy_dumps(PyObject *obj, PyObject **payload, PyObject **atts);
PyObject *mpy_loads(PyObject *payload, PyObject *atts);
PyObject *mpy_msg_loads(const mp_msg *m);

/* A tensor frame: what a torch tensor over an mproc Storage needs. */
#define FAST_MAGIC "\xffMP1" /* no pickle starts with 0xff */
#define FAST_MAXDIM 16
enum { FAST_TENSOR = 1 };
enum { FAST_REQUIRES_GRAD = 1 };

typedef struct {
    char magic[4];
    uint8_t kind, dtype, ndim, flags;
    int64_t offset; /* elements; then int64 shape[ndim], strides[ndim] */
} fast_head;

typedef struct {
    fast_head head;
    int64_t dims[2 * FAST_MAXDIM]; /* shape, then strides */
    PyObject *st;                  /* the Storage */
} mpy_parts;

/* fast.c, fast_recv.c: the frame of tensor t when one can carry it (1; p->st is a new
 * reference, mpy_parts_clear drops it), 0 when not, -1 on error; and the
 * tensor back from parts (p->st borrowed), every field checked. */
int mpy_tensor_parts(PyObject *t, mpy_parts *p);
void mpy_parts_clear(mpy_parts *p);
PyObject *mpy_tensor_build(const mpy_parts *p);
/* The tensor of a frame's bytes over Storage st (borrowed). */
PyObject *mpy_tensor_from_frame(const char *buf, size_t len, PyObject *st);
/* torch.Tensor once torch is imported (borrowed), else NULL. */
PyObject *mpy_torch_tensor_type(void);

int mpy_fast_init(PyObject *module);
int mpy_fastpickle_init(PyObject *module);
int mpy_storage_init(PyObject *module);
int mpy_channel_init(PyObject *module);

#endif
