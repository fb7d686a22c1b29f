/* The receiving half of mproc's pickling fast paths: a torch tensor rebuilt
 * from a tensor frame, and loads (fast.c tells the paths and sends). */
#include "fast_impl.h"

#include <string.h>

/* An empty tensor of dtype code c: Tensor.new() of it is the cheapest way
 * to a fresh tensor that set_() then points at a storage. */
static PyObject *proto(int c)
{
    if (!mpy_fast.protos[c]) {
        PyObject *kw = Py_BuildValue("{sO}", "dtype", mpy_fast.dtypes[c]);
        PyObject *args = kw ? Py_BuildValue("(i)", 0) : NULL;
        mpy_fast.protos[c] = args ? PyObject_Call(mpy_fast.empty, args, kw) : NULL;
        Py_XDECREF(kw);
        Py_XDECREF(args);
    }
    return mpy_fast.protos[c];
}

/* ---- receive: a tensor from a frame ----------------------------------- */

static PyObject *bad_frame(const char *why)
{
    return PyErr_Format(PyExc_ValueError, "mproc: a corrupt tensor frame (%s): the sender is "
                        "not mproc's Python binding of this version", why);
}

/* Largest byte the view touches + 1, or -1 when it overflows. */
static long long view_extent(const fast_head *h, const int64_t *dims, int elsize)
{
    long long last = h->offset, n;
    for (int i = 0; i < h->ndim; i++) {
        if (dims[i] < 0 || dims[h->ndim + i] < 0)
            return -1;
        if (dims[i] == 0)
            return (long long)h->offset * elsize;
        if (__builtin_mul_overflow(dims[i] - 1, dims[h->ndim + i], &n) ||
            __builtin_add_overflow(last, n, &last))
            return -1;
    }
    if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, elsize, &n))
        return -1;
    return n;
}

/* A torch UntypedStorage over st's memory: the one of a live tensor this
 * process has over it (cache), else a DLPack import of the registered
 * Storage of that memory (registering st when none is). *fresh: imported. */
static PyObject *torch_storage(PyObject *st, PyObject *key, long long need, int *fresh)
{
    PyObject *t = mpy_weak_get(mpy_fast.rx_cache, key), *us = NULL, *p = NULL;
    *fresh = 0;
    if (t) {
        us = mpy_untyped_storage(t);
        Py_DECREF(t);
        long long n;
        if (us && (p = PyObject_CallMethodNoArgs(us, mpy_name.data_ptr)) &&
            PyObject_RichCompareBool(p, key, Py_EQ) == 1 &&
            mpy_call_ssize(us, mpy_name.nbytes, &n) == 0 && n >= need) {
            Py_DECREF(p);
            return us;
        }
        Py_XDECREF(p);
        Py_XDECREF(us);
        PyErr_Clear(); /* the tensor was pointed elsewhere meanwhile: import */
    }
    PyObject *owner = mpy_registered(key);
    if (!owner) {
        PyObject *r = PyObject_CallOneArg(mpy_fast.register_fn, st);
        if (!r)
            return NULL;
        Py_DECREF(r);
        owner = Py_NewRef(st);
    }
    PyObject *u8 = PyObject_CallOneArg(mpy_fast.from_dlpack, owner);
    Py_DECREF(owner);
    if (!u8)
        return NULL;
    us = mpy_untyped_storage(u8);
    Py_DECREF(u8);
    *fresh = 1;
    return us;
}

static PyObject *tuple_of(const int64_t *v, int n)
{
    PyObject *r = PyTuple_New(n);
    for (int i = 0; r && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x)
            Py_CLEAR(r);
        else
            PyTuple_SET_ITEM(r, i, x);
    }
    return r;
}

PyObject *mpy_tensor_from_frame(const char *buf, size_t len, PyObject *st)
{
    mpy_parts p;
    if (len < sizeof p.head)
        return bad_frame("short");
    memcpy(&p.head, buf, sizeof p.head);
    if (p.head.ndim > FAST_MAXDIM || len != sizeof p.head + sizeof(int64_t) * 2 * p.head.ndim)
        return bad_frame("header");
    memcpy(p.dims, buf + sizeof p.head, sizeof(int64_t) * 2 * p.head.ndim);
    p.st = st;
    return mpy_tensor_build(&p);
}

PyObject *mpy_tensor_build(const mpy_parts *p)
{
    const fast_head h = p->head;
    const int64_t *dims = p->dims;
    PyObject *st = p->st;
    if (h.kind != FAST_TENSOR || h.dtype >= MPY_NDTYPES || h.ndim > FAST_MAXDIM || h.offset < 0)
        return bad_frame("header");
    if (!st || !PyObject_TypeCheck(st, &mpy_storage_type))
        return bad_frame("its attachment is not a storage");
    long long need = view_extent(&h, dims, mpy_dtypes[h.dtype].size);
    mp_tensor *mt = ((mpy_storage *)st)->t;
    if (need < 0 || (unsigned long long)need > mp_tensor_nbytes(mt))
        return bad_frame("view out of the storage's bounds");
    if (mpy_torch_ready() == 0) {
        /* a spawned child that unpickled only its arguments: a tensor
         * arriving is what makes it need torch, as the pickler's path does */
        PyObject *m = PyImport_ImportModule("mproc.torch");
        if (!m)
            return NULL;
        Py_DECREF(m);
    }
    if (mpy_torch_ready() <= 0)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_RuntimeError,
            "mproc: a torch tensor arrived but torch cannot be used (half imported?)");
    PyObject *key = PyLong_FromVoidPtr(mp_tensor_data(mt)), *r = NULL, *size = NULL, *stride = NULL;
    PyObject *off = NULL, *empty = NULL, *pt = proto(h.dtype);
    int fresh;
    PyObject *us = key && pt ? torch_storage(st, key, need, &fresh) : NULL;
    if (!us || !(size = tuple_of(dims, h.ndim)) || !(stride = tuple_of(dims + h.ndim, h.ndim)) ||
        !(off = PyLong_FromLongLong(h.offset)) ||
        !(empty = PyObject_CallMethodNoArgs(pt, mpy_name.new)))
        goto out;
    r = PyObject_CallMethodObjArgs(empty, mpy_name.set, us, off, size, stride, NULL);
    if (r && (h.flags & FAST_REQUIRES_GRAD)) {
        PyObject *x = PyObject_CallMethodOneArg(r, mpy_name.rg_, Py_True);
        if (!x)
            Py_CLEAR(r);
        Py_XDECREF(x);
    }
    if (r && fresh && mpy_rx_remember(key, r) < 0)
        PyErr_Clear();
out:
    Py_XDECREF(key);
    Py_XDECREF(us);
    Py_XDECREF(size);
    Py_XDECREF(stride);
    Py_XDECREF(off);
    Py_XDECREF(empty);
    return r;
}

/* Payloads from this size on are unpickled where they lie; below, a bytes
 * object costs less than a memoryview and its release. */
#define LOADS_IN_PLACE (64 * 1024)

static int is_frame(const void *p, size_t len)
{
    return len >= 4 && memcmp(p, FAST_MAGIC, 4) == 0;
}

PyObject *mpy_loads(PyObject *payload, PyObject *atts)
{
    if (!mpy_fast.loads_py)
        return PyErr_Format(PyExc_RuntimeError, "mproc._sharing is not imported: import mproc");
    if (PyBytes_Check(payload) && is_frame(PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload))) {
        if (!PyList_Check(atts) || PyList_GET_SIZE(atts) != 1)
            return bad_frame("not one attachment");
        return mpy_tensor_from_frame(PyBytes_AS_STRING(payload), (size_t)PyBytes_GET_SIZE(payload),
                                 PyList_GET_ITEM(atts, 0));
    }
    if (atts == Py_None || atts == NULL)
        return PyObject_CallOneArg(mpy_fast.pickle_loads, payload);
    return PyObject_CallFunctionObjArgs(mpy_fast.loads_py, payload, atts, NULL);
}

PyObject *mpy_msg_loads(const mp_msg *m)
{
    size_t len, n = mp_msg_count(m);
    const char *p = mp_msg_payload(m, &len);
    if (n == 1 && p && is_frame(p, len) && mp_msg_kind(m, 0) == MP_ATTACH_TENSOR) {
        mp_tensor *t;
        int rc = mp_msg_get_tensor(m, 0, &t);
        if (rc < 0)
            return mpy_raise(rc);
        PyObject *st = mpy_storage_wrap(t);
        if (!st)
            return NULL;
        PyObject *r = mpy_tensor_from_frame(p, len, st);
        Py_DECREF(st);
        return r;
    }
    if (n == 0 && len >= LOADS_IN_PLACE) {
        /* pickle reads the message's own payload: no bytes copy of it (a
         * copy of 100 MB, page faults included, is as long as the loads) */
        PyObject *mv = PyMemoryView_FromMemory((char *)p, (Py_ssize_t)len, PyBUF_READ);
        PyObject *r = mv ? PyObject_CallOneArg(mpy_fast.pickle_loads, mv) : NULL;
        if (mv) { /* anything still holding it reads a released view, not freed memory */
            PyObject *ok = PyObject_CallMethod(mv, "release", NULL);
            if (!ok)
                Py_CLEAR(r);
            Py_XDECREF(ok);
            Py_DECREF(mv);
        }
        return r;
    }
    if (n == 0) {
        PyObject *b = PyBytes_FromStringAndSize(p ? p : "", (Py_ssize_t)len);
        PyObject *r = b ? mpy_loads(b, Py_None) : NULL;
        Py_XDECREF(b);
        return r;
    }
    PyObject *pa = mpy_msg_unpack(m);
    if (!pa)
        return NULL;
    PyObject *r = mpy_loads(PyTuple_GET_ITEM(pa, 0), PyTuple_GET_ITEM(pa, 1));
    Py_DECREF(pa);
    return r;
}
