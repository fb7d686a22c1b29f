/* The hot paths of mproc's pickling, in C: the messages queues and pipes
 * carry most often skip Python-level code.
 *
 * - Plain data (ints, floats, strings, bytes, None and tuples, lists and
 *   dicts of them, shallow): pickle's C dumps/loads directly, since
 *   mproc's pickler would change nothing in them.
 * - One torch tensor whose storage is already mproc's: a tensor frame
 *   (dtype, shape, strides, offset; the storage is the message's one
 *   attachment) instead of a pickle, rebuilt on receipt with two torch
 *   calls. A receiver that already holds a tensor over the same segment
 *   (libmproc maps a segment once, so the address names it) reuses that
 *   tensor's torch storage: no DLPack import, no new registry entry. The
 *   cache holds weak references only, so it keeps nothing alive.
 * - Everything else goes to mproc._sharing's Python pickler (_dumps_py,
 *   _loads_py), which the frame must agree with: the frame is only built
 *   when that pickler would send the tensor as it is (shared, CPU, strided,
 *   no grad, a leaf or not requiring grad, no lazy conjugate or negative
 *   bit). */
#include "fast_impl.h"

#include <string.h>

const mpy_dtype mpy_dtypes[] = {
    {"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2}, {"uint8", 1},
    {"int8", 1},    {"int16", 2},   {"int32", 4},   {"int64", 8},    {"bool", 1},
    {"complex64", 8}, {"complex128", 16}};
_Static_assert(sizeof mpy_dtypes / sizeof mpy_dtypes[0] == MPY_NDTYPES,
               "MPY_NDTYPES counts the dtypes a frame can name");

mpy_fast_state mpy_fast;
mpy_names mpy_name;

/* ---- torch, looked up once it is imported (never imported here) ------- */

/* t's UntypedStorage: torch 2 calls the method untyped_storage, 1.x
 * _storage; the first tensor seen tells which (under the GIL). */
PyObject *mpy_untyped_storage(PyObject *t)
{
    static PyObject *name;
    if (!name)
        name = PyObject_HasAttr((PyObject *)Py_TYPE(t), mpy_name.untyped_storage)
                   ? mpy_name.untyped_storage
                   : mpy_name.storage;
    return PyObject_CallMethodNoArgs(t, name);
}

int mpy_torch_ready(void)
{
    if (mpy_fast.tensor_type)
        return 1;
    PyObject *torch = PyDict_GetItemWithError(PyImport_GetModuleDict(), mpy_name.torch);
    if (!torch)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *tt = PyObject_GetAttrString(torch, "Tensor");
    PyObject *strided = PyObject_GetAttrString(torch, "strided");
    PyObject *fd = PyObject_GetAttrString(torch, "from_dlpack");
    PyObject *empty = PyObject_GetAttrString(torch, "empty");
    PyObject *codes = PyDict_New();
    int ok = tt && strided && fd && empty && codes;
    for (int i = 0; ok && i < MPY_NDTYPES; i++) {
        PyObject *code = PyLong_FromLong(i);
        mpy_fast.dtypes[i] = PyObject_GetAttrString(torch, mpy_dtypes[i].name);
        ok = code && mpy_fast.dtypes[i] && PyDict_SetItem(codes, mpy_fast.dtypes[i], code) == 0;
        Py_XDECREF(code);
    }
    if (!ok) { /* torch half imported (a pickle made during its import) */
        PyErr_Clear();
        Py_XDECREF(tt);
        Py_XDECREF(strided);
        Py_XDECREF(fd);
        Py_XDECREF(empty);
        Py_XDECREF(codes);
        for (int i = 0; i < MPY_NDTYPES; i++)
            Py_CLEAR(mpy_fast.dtypes[i]);
        return 0;
    }
    mpy_fast.strided = strided;
    mpy_fast.from_dlpack = fd;
    mpy_fast.empty = empty;
    mpy_fast.codes = codes;
    mpy_fast.tensor_type = tt;
    return 1;
}

PyObject *mpy_torch_tensor_type(void)
{
    if (mpy_torch_ready() <= 0) {
        PyErr_Clear();
        return NULL;
    }
    return mpy_fast.tensor_type;
}

/* ---- weak caches: address -> weakref, entries leave with their object -- */

/* The weakref callback: removes the entry key (this function's self) when
 * it is still this dead reference. */
static PyObject *entry_gone(PyObject *key, PyObject *ref)
{
    PyObject *cur = PyDict_GetItemWithError(mpy_fast.rx_cache, key);
    if (cur == ref && PyDict_DelItem(mpy_fast.rx_cache, key) < 0)
        return NULL;
    if (!cur && PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef entry_gone_def = {"_rx_gone", entry_gone, METH_O, NULL};

int mpy_rx_remember(PyObject *key, PyObject *tensor)
{
    PyObject *cb = PyCFunction_New(&entry_gone_def, key);
    PyObject *ref = cb ? PyWeakref_NewRef(tensor, cb) : NULL;
    int rc = ref ? PyDict_SetItem(mpy_fast.rx_cache, key, ref) : -1;
    Py_XDECREF(cb);
    Py_XDECREF(ref);
    return rc;
}

/* The live object a weakref dict holds for key, or NULL (no exception). */
PyObject *mpy_weak_get(PyObject *dict, PyObject *key)
{
    PyObject *ref = PyDict_GetItemWithError(dict, key);
    if (!ref || !PyWeakref_Check(ref)) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *o = PyWeakref_GetObject(ref);
    return o == Py_None ? NULL : Py_NewRef(o);
}

/* ---- send: a tensor frame ------------------------------------------------ */

static int attr_is(PyObject *o, PyObject *name, PyObject *want)
{
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v)
        return -1;
    int r = v == want;
    Py_DECREF(v);
    return r;
}

static int call_is_true(PyObject *o, PyObject *name)
{
    PyObject *v = PyObject_CallMethodNoArgs(o, name);
    if (!v)
        return -1;
    int r = v == Py_True;
    Py_DECREF(v);
    return r;
}

int mpy_call_ssize(PyObject *o, PyObject *name, long long *out)
{
    PyObject *v = PyObject_CallMethodNoArgs(o, name);
    if (!v)
        return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* Tensor t's dtype code when a frame can carry it (exact torch.Tensor on
 * the CPU, strided, no grad, not a non-leaf requiring grad, no lazy
 * conjugate or negative bit: the Python path carries those); -2 when not,
 * -1 on error. *flags gets FAST_REQUIRES_GRAD. */
static int frame_dtype(PyObject *t, uint8_t *flags)
{
    int r;
    if (Py_TYPE(t) != (PyTypeObject *)mpy_fast.tensor_type)
        return -2;
    PyObject *dtype = PyObject_GetAttr(t, mpy_name.dtype);
    if (!dtype)
        return -1;
    PyObject *code = PyDict_GetItemWithError(mpy_fast.codes, dtype);
    Py_DECREF(dtype);
    if (!code)
        return PyErr_Occurred() ? -1 : -2;
    if ((r = attr_is(t, mpy_name.layout, mpy_fast.strided)) <= 0 ||
        (r = attr_is(t, mpy_name.is_cpu, Py_True)) <= 0)
        return r < 0 ? -1 : -2;
    if ((r = call_is_true(t, mpy_name.is_conj)) != 0 || (r = call_is_true(t, mpy_name.is_neg)) != 0)
        return r < 0 ? -1 : -2;
    if ((r = attr_is(t, mpy_name.requires_grad, Py_True)) < 0)
        return -1;
    *flags = r ? FAST_REQUIRES_GRAD : 0;
    /* a non-leaf requiring grad: the Python path raises torch's error (and
     * reading .grad of a non-leaf would warn) */
    if (r && (r = attr_is(t, mpy_name.is_leaf, Py_True)) <= 0)
        return r < 0 ? -1 : -2;
    if ((r = attr_is(t, mpy_name.grad, Py_None)) <= 0)
        return r < 0 ? -1 : -2;
    return (int)PyLong_AsLong(code);
}

/* The registered mproc Storage for the memory at address key, or NULL. */
PyObject *mpy_registered(PyObject *key)
{
    PyObject *st = mpy_weak_get(mpy_fast.registry, key);
    if (st && !PyObject_TypeCheck(st, &mpy_storage_type))
        Py_CLEAR(st);
    return st;
}

void mpy_parts_clear(mpy_parts *p)
{
    Py_CLEAR(p->st);
}

/* 1: p holds t's frame (p->st, a new reference); 0: t does not qualify
 * (nothing held); -1: error. */
int mpy_tensor_parts(PyObject *t, mpy_parts *p)
{
    uint8_t flags = 0;
    long long off;
    int code, rc = -1;
    memset(p, 0, sizeof *p);
    if ((code = mpy_torch_ready()) <= 0)
        return code;
    if ((code = frame_dtype(t, &flags)) < 0)
        return code == -2 ? 0 : -1;
    PyObject *us = mpy_untyped_storage(t), *key = NULL;
    PyObject *size = NULL, *stride = NULL;
    if (!us || !(key = PyObject_CallMethodNoArgs(us, mpy_name.data_ptr)))
        goto out;
    if (!(p->st = mpy_registered(key))) {
        rc = 0; /* private memory: the Python path moves it */
        goto out;
    }
    if (!(size = PyObject_CallMethodNoArgs(t, mpy_name.size)) ||
        !(stride = PyObject_CallMethodNoArgs(t, mpy_name.stride)) ||
        mpy_call_ssize(t, mpy_name.offset, &off) < 0)
        goto out;
    if (!PyTuple_Check(size) || !PyTuple_Check(stride) ||
        PyTuple_GET_SIZE(size) != PyTuple_GET_SIZE(stride) ||
        PyTuple_GET_SIZE(size) > FAST_MAXDIM) {
        rc = 0;
        goto out;
    }
    int nd = (int)PyTuple_GET_SIZE(size);
    p->head = (fast_head){{0}, FAST_TENSOR, (uint8_t)code, (uint8_t)nd, flags, off};
    memcpy(p->head.magic, FAST_MAGIC, 4);
    for (int i = 0; i < nd; i++) {
        p->dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(size, i));
        p->dims[nd + i] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i));
    }
    if (PyErr_Occurred())
        goto out;
    /* The sender's tensor serves as the receiving side's cache entry too:
     * the same storage coming back (a ping-pong) is rebuilt from it. */
    PyObject *seen = mpy_weak_get(mpy_fast.rx_cache, key);
    if (!seen && mpy_rx_remember(key, t) < 0)
        PyErr_Clear(); /* only a cache */
    Py_XDECREF(seen);
    rc = 1;
out:
    if (rc != 1)
        mpy_parts_clear(p);
    Py_XDECREF(us);
    Py_XDECREF(key);
    Py_XDECREF(size);
    Py_XDECREF(stride);
    return rc;
}

/* 1: *payload and *atts hold t's frame; 0: t does not qualify; -1: error. */
static int tensor_frame(PyObject *t, PyObject **payload, PyObject **atts)
{
    mpy_parts p;
    int rc = mpy_tensor_parts(t, &p);
    if (rc <= 0)
        return rc;
    size_t dl = sizeof(int64_t) * 2 * p.head.ndim;
    *payload = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(sizeof p.head + dl));
    if (*payload && (*atts = PyList_New(1))) {
        memcpy(PyBytes_AS_STRING(*payload), &p.head, sizeof p.head);
        memcpy(PyBytes_AS_STRING(*payload) + sizeof p.head, p.dims, dl);
        PyList_SET_ITEM(*atts, 0, p.st); /* the list takes the reference */
        return 1;
    }
    Py_CLEAR(*payload);
    mpy_parts_clear(&p);
    return -1;
}

/* ---- plain data: nothing for mproc's pickler to do --------------------- */

static int plain(PyObject *o, int depth)
{
    PyTypeObject *t = Py_TYPE(o);
    if (o == Py_None || t == &PyLong_Type || t == &PyFloat_Type || t == &PyUnicode_Type ||
        t == &PyBytes_Type || t == &PyBool_Type)
        return 1;
    if (depth == 0)
        return 0;
    if (t == &PyTuple_Type || t == &PyList_Type) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
        if (n > 64)
            return 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!plain(PySequence_Fast_GET_ITEM(o, i), depth - 1))
                return 0;
        return 1;
    }
    if (t == &PyDict_Type) {
        PyObject *k, *v;
        Py_ssize_t pos = 0;
        if (PyDict_GET_SIZE(o) > 64)
            return 0;
        while (PyDict_Next(o, &pos, &k, &v))
            if (!plain(k, 0) || !plain(v, depth - 1))
                return 0;
        return 1;
    }
    return 0;
}

int mpy_dumps(PyObject *obj, PyObject **payload, PyObject **atts)
{
    *payload = *atts = NULL;
    if (!mpy_fast.dumps_py) {
        PyErr_SetString(PyExc_RuntimeError, "mproc._sharing is not imported: import mproc first");
        return -1;
    }
    if (plain(obj, 3)) {
        PyObject *args[2] = {obj, mpy_fast.protocol};
        *payload = PyObject_Vectorcall(mpy_fast.pickle_dumps, args, 2, NULL);
        return *payload ? 0 : -1;
    }
    int r = tensor_frame(obj, payload, atts);
    if (r != 0)
        return r < 0 ? -1 : 0;
    PyObject *res = PyObject_CallOneArg(mpy_fast.dumps_py, obj);
    if (!res)
        return -1;
    if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != 2) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_TypeError, "mproc._sharing._dumps_py returned no (payload, atts)");
        return -1;
    }
    *payload = Py_NewRef(PyTuple_GET_ITEM(res, 0));
    PyObject *a = PyTuple_GET_ITEM(res, 1);
    *atts = a == Py_None ? NULL : Py_NewRef(a);
    Py_DECREF(res);
    return 0;
}

/* ---- module functions ---------------------------------------------------- */

static PyObject *py_dumps(PyObject *self, PyObject *obj)
{
    PyObject *payload, *atts;
    (void)self;
    if (mpy_dumps(obj, &payload, &atts) < 0)
        return NULL;
    PyObject *r = PyTuple_Pack(2, payload, atts ? atts : Py_None);
    Py_DECREF(payload);
    Py_XDECREF(atts);
    return r;
}

static PyObject *py_loads(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    if (n != 2)
        return PyErr_Format(PyExc_TypeError, "loads(payload, attachments) takes 2 arguments");
    return mpy_loads(args[0], args[1]);
}

static PyObject *py_fast_setup(PyObject *self, PyObject *args)
{
    PyObject *reg, *regfn, *dpy, *lpy;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!OOO:_fast_setup", &PyDict_Type, &reg, &regfn, &dpy, &lpy))
        return NULL;
    Py_XSETREF(mpy_fast.registry, Py_NewRef(reg));
    Py_XSETREF(mpy_fast.register_fn, Py_NewRef(regfn));
    Py_XSETREF(mpy_fast.dumps_py, Py_NewRef(dpy));
    Py_XSETREF(mpy_fast.loads_py, Py_NewRef(lpy));
    Py_RETURN_NONE;
}

static PyObject *py_rx_cache_size(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return PyLong_FromSsize_t(PyDict_GET_SIZE(mpy_fast.rx_cache));
}

static PyObject *py_pins_held(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return PyLong_FromLong(mpy_pins_held());
}

static PyMethodDef fast_functions[] = {
    {"dumps", py_dumps, METH_O,
     "dumps(obj) -> (payload, attachments or None): obj as an mproc message."},
    {"loads", (PyCFunction)(void (*)(void))py_loads, METH_FASTCALL,
     "loads(payload, attachments) -> obj: the inverse of dumps."},
    {"_fast_setup", py_fast_setup, METH_VARARGS,
     "_fast_setup(registry, register, dumps_py, loads_py): mproc._sharing's hooks."},
    {"_rx_cache_size", py_rx_cache_size, METH_NOARGS,
     "Entries in the receive cache (live tensors over received storages), for tests."},
    {"_pins_held", py_pins_held, METH_NOARGS,
     "Storages this process keeps pinned or kept mapped (file_descriptor ones hold an fd "
     "each) for the ends it receives on, for tests: docs/tensor.md, \"Handoff without an "
     "fd\" and \"Kept mappings\"."},
    {NULL, NULL, 0, NULL}};

int mpy_fast_init(PyObject *module)
{
#define INTERN(var, s) if (!(var = PyUnicode_InternFromString(s))) return -1
    INTERN(mpy_name.storage, "_storage");
    INTERN(mpy_name.untyped_storage, "untyped_storage");
    INTERN(mpy_name.data_ptr, "data_ptr");
    INTERN(mpy_name.nbytes, "nbytes");
    INTERN(mpy_name.size, "size");
    INTERN(mpy_name.stride, "stride");
    INTERN(mpy_name.offset, "storage_offset");
    INTERN(mpy_name.dtype, "dtype");
    INTERN(mpy_name.layout, "layout");
    INTERN(mpy_name.is_cpu, "is_cpu");
    INTERN(mpy_name.requires_grad, "requires_grad");
    INTERN(mpy_name.is_leaf, "is_leaf");
    INTERN(mpy_name.grad, "grad");
    INTERN(mpy_name.new, "new");
    INTERN(mpy_name.set, "set_");
    INTERN(mpy_name.rg_, "requires_grad_");
    INTERN(mpy_name.torch, "torch");
    INTERN(mpy_name.is_conj, "is_conj");
    INTERN(mpy_name.is_neg, "is_neg");
#undef INTERN
    PyObject *pk = PyImport_ImportModule("_pickle");
    if (!pk)
        return -1;
    mpy_fast.pickle_dumps = PyObject_GetAttrString(pk, "dumps");
    mpy_fast.pickle_loads = PyObject_GetAttrString(pk, "loads");
    Py_DECREF(pk);
    mpy_fast.protocol = PyLong_FromLong(5); /* pickle.HIGHEST_PROTOCOL of 3.8+ */
    mpy_fast.rx_cache = PyDict_New();
    if (!mpy_fast.pickle_dumps || !mpy_fast.pickle_loads || !mpy_fast.protocol ||
        !mpy_fast.rx_cache)
        return -1;
    return PyModule_AddFunctions(module, fast_functions);
}
