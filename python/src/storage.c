/* _mproc.Storage: an mproc tensor (usually a whole shared storage as 1-d
 * uint8) that Python reaches through the buffer protocol (NumPy) and DLPack
 * (torch, NumPy, any consumer): __dlpack__ / __dlpack_device__ export it
 * without a copy, Storage.from_dlpack imports another library's memory.
 *
 * Capsule lifetime: an exported DLManagedTensor holds one mproc reference
 * (libmproc's export) and one reference to this Python object (so the
 * binding's registry of shared storages sees the storage alive as long as a
 * consumer uses its memory). A consumer renames the capsule "used_..." and
 * calls the deleter when done; an unconsumed capsule's destructor calls it
 * instead, so the deleter runs exactly once either way. */
#include "mpy.h"

#include <dlpack/dlpack.h>

/* DLPack 1.0's versioned struct, for headers older than 1.0 (Debian ships
 * 0.6); the layout is the one the standard fixes. */
#ifndef DLPACK_MAJOR_VERSION
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

/* What both capsule kinds point into: mproc's own export plus the owner. */
typedef struct {
    DLManagedTensor legacy;
    DLManagedTensorVersioned versioned;
    DLManagedTensor *inner; /* libmproc's export: its deleter drops mproc's reference */
    PyObject *owner;
} mpy_export;

static void export_free(mpy_export *e)
{
    e->inner->deleter(e->inner);
    /* A consumer may free its tensor from any thread, or while the
     * interpreter shuts down; then the owner is left to the process's end. */
    if (!_Py_IsFinalizing()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_DECREF(e->owner);
        PyGILState_Release(g);
    }
    free(e);
}

static void legacy_deleter(DLManagedTensor *m) { export_free(m->manager_ctx); }
static void versioned_deleter(DLManagedTensorVersioned *m) { export_free(m->manager_ctx); }

static void legacy_capsule_free(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor")) { /* never consumed */
        DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
        m->deleter(m);
    }
}

static void versioned_capsule_free(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
        m->deleter(m);
    }
}

static int want_versioned(PyObject *max_version)
{
    if (!max_version || max_version == Py_None)
        return 0;
    PyObject *major = PySequence_GetItem(max_version, 0);
    if (!major)
        return -1;
    long v = PyLong_AsLong(major);
    Py_DECREF(major);
    return (v == -1 && PyErr_Occurred()) ? -1 : v >= 1;
}

/* dl_device asks for a device: the storage's own, or BufferError (the
 * array API's answer when the producer cannot export there without a copy). */
static int check_device(mpy_storage *self, PyObject *dl_device)
{
    DLDevice d = mp_tensor_device(self->t);
    int type, id;
    if (!PyTuple_Check(dl_device) || !PyArg_ParseTuple(dl_device, "ii", &type, &id)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "__dlpack__: dl_device is a (device_type, device_id) "
                     "tuple as __dlpack_device__ returns, not %.100R", dl_device);
        return -1;
    }
    if (type != (int)d.device_type || id != d.device_id) {
        PyErr_Format(PyExc_BufferError, "__dlpack__: this storage is on device (%d, %d) and "
                     "mproc exports without a copy, so it cannot export to dl_device "
                     "(%d, %d); pass dl_device=None and copy in the consumer",
                     (int)d.device_type, d.device_id, type, id);
        return -1;
    }
    return 0;
}

static PyObject *st_dlpack(mpy_storage *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream,
                                     &max_version, &dl_device, &copy))
        return NULL;
    if (stream != Py_None) {
        PyErr_SetString(PyExc_ValueError, "mproc storage is CPU memory: __dlpack__ takes "
                        "stream=None only");
        return NULL;
    }
    if (copy == Py_True) {
        PyErr_SetString(PyExc_ValueError, "mproc storage exports without a copy: pass "
                        "copy=None or False, and copy in the consumer");
        return NULL;
    }
    if (dl_device != Py_None && check_device(self, dl_device) < 0)
        return NULL;
    int versioned = want_versioned(max_version);
    if (versioned < 0)
        return NULL;
    mpy_export *e = calloc(1, sizeof *e);
    if (!e)
        return PyErr_NoMemory();
    int rc = mp_tensor_to_dlpack(self->t, &e->inner);
    if (rc < 0) {
        free(e);
        return mpy_raise(rc);
    }
    e->owner = Py_NewRef((PyObject *)self);
    PyObject *cap;
    if (versioned) {
        e->versioned = (DLManagedTensorVersioned){{1, 0}, e, versioned_deleter, 0,
                                                  e->inner->dl_tensor};
        cap = PyCapsule_New(&e->versioned, "dltensor_versioned", versioned_capsule_free);
    } else {
        e->legacy = (DLManagedTensor){e->inner->dl_tensor, e, legacy_deleter};
        cap = PyCapsule_New(&e->legacy, "dltensor", legacy_capsule_free);
    }
    if (!cap)
        export_free(e);
    return cap;
}

static PyObject *st_dlpack_device(mpy_storage *self, PyObject *unused)
{
    (void)unused;
    DLDevice d = mp_tensor_device(self->t);
    return Py_BuildValue("(ii)", (int)d.device_type, d.device_id);
}

/* ---- import: another library's DLPack capsule becomes an mproc tensor ---- */

static PyObject *st_from_dlpack(PyObject *cls, PyObject *obj)
{
    (void)cls;
    PyObject *cap;
    if (PyCapsule_CheckExact(obj))
        cap = Py_NewRef(obj);
    else if (!PyObject_HasAttrString(obj, "__dlpack__"))
        return PyErr_Format(PyExc_TypeError, "Storage.from_dlpack takes a DLPack capsule or an "
                            "object with __dlpack__ (a torch tensor, a NumPy array), not %.80s",
                            Py_TYPE(obj)->tp_name);
    else if (!(cap = PyObject_CallMethod(obj, "__dlpack__", NULL)))
        return NULL;
    DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
    if (!m) {
        Py_DECREF(cap);
        return NULL; /* already consumed, or not a legacy capsule */
    }
    mp_tensor *t;
    int rc = mp_tensor_from_dlpack(m, &t);
    if (rc < 0) {
        Py_DECREF(cap); /* still unconsumed: its destructor frees m */
        return mpy_raise(rc);
    }
    /* mproc owns m now: the capsule must not free it again */
    if (PyCapsule_SetName(cap, "used_dltensor") < 0) {
        Py_DECREF(cap);
        mp_tensor_release(t);
        return NULL;
    }
    Py_DECREF(cap);
    return mpy_storage_wrap(t);
}

static PyObject *st_empty(PyObject *cls, PyObject *arg)
{
    (void)cls;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_OverflowError, "Storage.empty: nbytes %.100R is more than a "
                         "segment can hold", arg);
        }
        return NULL;
    }
    if (n < 0)
        return PyErr_Format(PyExc_ValueError, "Storage.empty: nbytes is %lld; give 0 or more", n);
    int64_t shape = n;
    mp_tensor *t;
    int rc = mp_tensor_empty_shared(MP_UINT8, 1, &shape, &t);
    return rc < 0 ? mpy_raise(rc) : mpy_storage_wrap(t);
}

/* One (offset, address, nbytes) tuple of Storage.filled's parts. */
static int parse_part(PyObject *item, mpy_part *p)
{
    Py_ssize_t off, n;
    PyObject *addr;
    if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "nOn:filled", &off, &addr, &n)) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError,
                            "Storage.filled: each part is an (offset, address, nbytes) tuple");
        }
        return -1;
    }
    if (off < 0 || n < 0) {
        PyErr_Format(PyExc_ValueError, "Storage.filled: part offset %zd or size %zd is negative",
                     off, n);
        return -1;
    }
    p->src = PyLong_AsVoidPtr(addr);
    if (!p->src && PyErr_Occurred())
        return -1;
    p->off = (size_t)off;
    p->nbytes = (size_t)n;
    return 0;
}

/* Storage.filled(nbytes, parts): new shared bytes written from raw memory,
 * each part (offset, address, nbytes) copied in (the caller keeps the
 * sources alive), in one pass without page faults; the rest is zero. */
static PyObject *st_filled(PyObject *cls, PyObject *args)
{
    Py_ssize_t nbytes, n;
    PyObject *seq, *fast;
    mpy_part *parts;
    mp_tensor *t;
    int rc;
    (void)cls;
    if (!PyArg_ParseTuple(args, "nO:filled", &nbytes, &seq))
        return NULL;
    if (nbytes < 0)
        return PyErr_Format(PyExc_ValueError, "Storage.filled: nbytes %zd is negative", nbytes);
    if (!(fast = PySequence_Fast(seq, "Storage.filled: parts must be a sequence")))
        return NULL;
    n = PySequence_Fast_GET_SIZE(fast);
    if (n > INT_MAX || !(parts = PyMem_Malloc(sizeof *parts * (size_t)(n ? n : 1)))) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parse_part(PySequence_Fast_GET_ITEM(fast, i), &parts[i]) < 0) {
            PyMem_Free(parts);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    Py_BEGIN_ALLOW_THREADS
    rc = mpy_tensor_filled((size_t)nbytes, parts, (int)n, &t);
    Py_END_ALLOW_THREADS
    PyMem_Free(parts);
    return rc < 0 ? mpy_raise(rc) : mpy_storage_wrap(t);
}

/* Storage.adopt_fd(fd, nbytes, offset=0): a foreign shared-memory file
 * (torch's file_descriptor storages) seen by mproc without a copy; fd stays
 * the caller's (libmproc keeps a dup). */
static PyObject *st_adopt_fd(PyObject *cls, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"fd", "nbytes", "offset", NULL};
    int fd;
    Py_ssize_t nbytes;
    long long offset = 0;
    (void)cls;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "in|L:adopt_fd", kwlist, &fd, &nbytes, &offset))
        return NULL;
    if (nbytes < 0)
        return PyErr_Format(PyExc_ValueError, "adopt_fd: nbytes %zd is negative", nbytes);
    if (offset < 0)
        return PyErr_Format(PyExc_ValueError, "adopt_fd: offset %lld is negative", offset);
    mp_tensor *t;
    int rc = mp_tensor_adopt_fd(fd, (uint64_t)offset, (size_t)nbytes, &t);
    return rc < 0 ? mpy_raise(rc) : mpy_storage_wrap(t);
}

static PyObject *st_share_memory_(mpy_storage *self, PyObject *unused)
{
    (void)unused;
    int rc = mp_tensor_share_memory_(self->t);
    return rc < 0 ? mpy_raise(rc) : Py_NewRef(self);
}

/* ---- buffer protocol: the storage's bytes, writable ---------------------- */

static int st_getbuffer(mpy_storage *self, Py_buffer *view, int flags)
{
    if (!mp_tensor_is_contiguous(self->t) || mp_tensor_device(self->t).device_type != kDLCPU) {
        PyErr_SetString(PyExc_BufferError, "only a contiguous CPU mproc tensor exposes a buffer");
        return -1;
    }
    return PyBuffer_FillInfo(view, (PyObject *)self, mp_tensor_data(self->t),
                             (Py_ssize_t)mp_tensor_nbytes(self->t), 0, flags);
}

static PyBufferProcs st_as_buffer = {(getbufferproc)st_getbuffer, NULL};

static PyObject *st_nbytes(mpy_storage *self, void *c)
{
    (void)c;
    return PyLong_FromSize_t(mp_tensor_nbytes(self->t));
}

static PyObject *st_data_ptr(mpy_storage *self, void *c)
{
    (void)c;
    return PyLong_FromVoidPtr(mp_tensor_data(self->t));
}

static PyObject *st_is_shared(mpy_storage *self, void *c)
{
    (void)c;
    return PyBool_FromLong(mp_tensor_is_shared(self->t));
}

static PyObject *st_strategy(mpy_storage *self, void *c)
{
    (void)c;
    const char *s = mp_tensor_sharing_strategy(self->t);
    return s ? PyUnicode_FromString(s) : Py_NewRef(Py_None);
}

static PyObject *st_dtype(mpy_storage *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(mp_dtype_name(mp_tensor_dtype(self->t)));
}

static PyObject *st_shape(mpy_storage *self, void *c)
{
    (void)c;
    int nd = mp_tensor_ndim(self->t);
    const int64_t *s = mp_tensor_shape(self->t);
    PyObject *r = PyTuple_New(nd);
    for (int i = 0; r && i < nd; i++) {
        PyObject *v = PyLong_FromLongLong(s[i]);
        if (!v) {
            Py_CLEAR(r);
            break;
        }
        PyTuple_SET_ITEM(r, i, v);
    }
    return r;
}

static PyGetSetDef st_getset[] = {
    {"nbytes", (getter)st_nbytes, NULL, "bytes of the tensor", NULL},
    {"data_ptr", (getter)st_data_ptr, NULL, "address of the first byte", NULL},
    {"is_shared", (getter)st_is_shared, NULL, "in mproc shared memory", NULL},
    {"sharing_strategy", (getter)st_strategy, NULL, "strategy of its segment, or None", NULL},
    {"dtype", (getter)st_dtype, NULL, "mproc dtype name", NULL},
    {"shape", (getter)st_shape, NULL, "shape tuple", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMethodDef st_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))st_dlpack, METH_VARARGS | METH_KEYWORDS,
     "DLPack capsule over this memory (versioned when max_version >= (1, 0))."},
    {"__dlpack_device__", (PyCFunction)st_dlpack_device, METH_NOARGS, NULL},
    {"from_dlpack", st_from_dlpack, METH_O | METH_CLASS,
     "Storage over another library's memory (object with __dlpack__, or a capsule); no copy."},
    {"empty", st_empty, METH_O | METH_CLASS,
     "Storage.empty(nbytes): zeroed bytes in mproc shared memory."},
    {"filled", st_filled, METH_VARARGS | METH_CLASS,
     "Storage.filled(nbytes, parts): new shared bytes, each (offset, address, nbytes) part "
     "copied in from raw memory the caller keeps alive; the rest zero."},
    {"adopt_fd", (PyCFunction)(void (*)(void))st_adopt_fd,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Storage.adopt_fd(fd, nbytes, offset=0): a sealed memfd or unlinked /dev/shm segment "
     "seen without a copy (fd is duplicated)."},
    {"share_memory_", (PyCFunction)st_share_memory_, METH_NOARGS,
     "Moves the tensor into shared memory (one copy); no-op when shared."},
    {NULL, NULL, 0, NULL}};

static void st_dealloc(mpy_storage *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    mp_tensor_release(self->t);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *st_repr(mpy_storage *self)
{
    const char *s = mp_tensor_sharing_strategy(self->t);
    return PyUnicode_FromFormat("<mproc Storage %s %zu bytes at %p, %s>",
                                mp_dtype_name(mp_tensor_dtype(self->t)),
                                mp_tensor_nbytes(self->t), mp_tensor_data(self->t),
                                s ? s : "private");
}

PyTypeObject mpy_storage_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_mproc.Storage",
    .tp_basicsize = sizeof(mpy_storage),
    .tp_dealloc = (destructor)st_dealloc,
    .tp_repr = (reprfunc)st_repr,
    .tp_as_buffer = &st_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An mproc tensor's memory, for DLPack and the buffer protocol.",
    .tp_weaklistoffset = offsetof(mpy_storage, weakrefs),
    .tp_methods = st_methods,
    .tp_getset = st_getset,
};

PyObject *mpy_storage_wrap(mp_tensor *t)
{
    mpy_storage *s = PyObject_New(mpy_storage, &mpy_storage_type);
    if (!s) {
        mp_tensor_release(t);
        return NULL;
    }
    s->t = t;
    s->weakrefs = NULL;
    return (PyObject *)s;
}

int mpy_storage_init(PyObject *module)
{
    if (PyType_Ready(&mpy_storage_type) < 0)
        return -1;
    return PyModule_AddObjectRef(module, "Storage", (PyObject *)&mpy_storage_type);
}
