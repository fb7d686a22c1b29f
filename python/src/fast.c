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
#include "mpy.h"

#include <string.h>


/* torch dtypes a frame can name: the index is the code on the wire. */
static const struct {
    const char *name;
    int size;
} dtype_table[] = {{"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2},
                   {"uint8", 1},   {"int8", 1},    {"int16", 2},   {"int32", 4},
                   {"int64", 8},   {"bool", 1},    {"complex64", 8}, {"complex128", 16}};
#define NDTYPES ((int)(sizeof dtype_table / sizeof dtype_table[0]))

static struct {
    PyObject *registry; /* mproc._sharing._registry: address -> weakref(Storage) */
    PyObject *register_fn, *dumps_py, *loads_py;
    PyObject *pickle_dumps, *pickle_loads, *protocol;
    PyObject *rx_cache; /* address -> weakref(a torch tensor over that memory) */
    PyObject *tensor_type, *strided, *from_dlpack, *empty, *codes; /* torch's, once imported */
    PyObject *dtypes[NDTYPES], *protos[NDTYPES];
} F;

static PyObject *s_storage, *s_untyped_storage, *s_data_ptr, *s_nbytes, *s_size, *s_stride,
    *s_offset, *s_dtype, *s_layout, *s_is_cpu, *s_requires_grad, *s_is_leaf, *s_grad, *s_new,
    *s_set, *s_rg_, *s_torch, *s_is_conj, *s_is_neg;

/* ---- torch, looked up once it is imported (never imported here) ------- */

/* t's UntypedStorage: torch 2 calls the method untyped_storage, 1.x
 * _storage; the first tensor seen tells which (under the GIL). */
static PyObject *untyped_storage(PyObject *t)
{
    static PyObject *name;
    if (!name)
        name = PyObject_HasAttr((PyObject *)Py_TYPE(t), s_untyped_storage) ? s_untyped_storage
                                                                           : s_storage;
    return PyObject_CallMethodNoArgs(t, name);
}

static int torch_ready(void)
{
    if (F.tensor_type)
        return 1;
    PyObject *torch = PyDict_GetItemWithError(PyImport_GetModuleDict(), s_torch);
    if (!torch)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *tt = PyObject_GetAttrString(torch, "Tensor");
    PyObject *strided = PyObject_GetAttrString(torch, "strided");
    PyObject *fd = PyObject_GetAttrString(torch, "from_dlpack");
    PyObject *empty = PyObject_GetAttrString(torch, "empty");
    PyObject *codes = PyDict_New();
    int ok = tt && strided && fd && empty && codes;
    for (int i = 0; ok && i < NDTYPES; i++) {
        PyObject *code = PyLong_FromLong(i);
        F.dtypes[i] = PyObject_GetAttrString(torch, dtype_table[i].name);
        ok = code && F.dtypes[i] && PyDict_SetItem(codes, F.dtypes[i], code) == 0;
        Py_XDECREF(code);
    }
    if (!ok) { /* torch half imported (a pickle made during its import) */
        PyErr_Clear();
        Py_XDECREF(tt);
        Py_XDECREF(strided);
        Py_XDECREF(fd);
        Py_XDECREF(empty);
        Py_XDECREF(codes);
        for (int i = 0; i < NDTYPES; i++)
            Py_CLEAR(F.dtypes[i]);
        return 0;
    }
    F.strided = strided;
    F.from_dlpack = fd;
    F.empty = empty;
    F.codes = codes;
    F.tensor_type = tt;
    return 1;
}

PyObject *mpy_torch_tensor_type(void)
{
    if (torch_ready() <= 0) {
        PyErr_Clear();
        return NULL;
    }
    return F.tensor_type;
}

/* An empty tensor of dtype code c: Tensor.new() of it is the cheapest way
 * to a fresh tensor that set_() then points at a storage. */
static PyObject *proto(int c)
{
    if (!F.protos[c]) {
        PyObject *kw = Py_BuildValue("{sO}", "dtype", F.dtypes[c]);
        PyObject *args = kw ? Py_BuildValue("(i)", 0) : NULL;
        F.protos[c] = args ? PyObject_Call(F.empty, args, kw) : NULL;
        Py_XDECREF(kw);
        Py_XDECREF(args);
    }
    return F.protos[c];
}

/* ---- weak caches: address -> weakref, entries leave with their object -- */

/* The weakref callback: removes the entry key (this function's self) when
 * it is still this dead reference. */
static PyObject *entry_gone(PyObject *key, PyObject *ref)
{
    PyObject *cur = PyDict_GetItemWithError(F.rx_cache, key);
    if (cur == ref && PyDict_DelItem(F.rx_cache, key) < 0)
        return NULL;
    if (!cur && PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef entry_gone_def = {"_rx_gone", entry_gone, METH_O, NULL};

static int rx_remember(PyObject *key, PyObject *tensor)
{
    PyObject *cb = PyCFunction_New(&entry_gone_def, key);
    PyObject *ref = cb ? PyWeakref_NewRef(tensor, cb) : NULL;
    int rc = ref ? PyDict_SetItem(F.rx_cache, key, ref) : -1;
    Py_XDECREF(cb);
    Py_XDECREF(ref);
    return rc;
}

/* The live object a weakref dict holds for key, or NULL (no exception). */
static PyObject *weak_get(PyObject *dict, PyObject *key)
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

static int call_ssize(PyObject *o, PyObject *name, long long *out)
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
    if (Py_TYPE(t) != (PyTypeObject *)F.tensor_type)
        return -2;
    PyObject *dtype = PyObject_GetAttr(t, s_dtype);
    if (!dtype)
        return -1;
    PyObject *code = PyDict_GetItemWithError(F.codes, dtype);
    Py_DECREF(dtype);
    if (!code)
        return PyErr_Occurred() ? -1 : -2;
    if ((r = attr_is(t, s_layout, F.strided)) <= 0 || (r = attr_is(t, s_is_cpu, Py_True)) <= 0)
        return r < 0 ? -1 : -2;
    if ((r = call_is_true(t, s_is_conj)) != 0 || (r = call_is_true(t, s_is_neg)) != 0)
        return r < 0 ? -1 : -2;
    if ((r = attr_is(t, s_requires_grad, Py_True)) < 0)
        return -1;
    *flags = r ? FAST_REQUIRES_GRAD : 0;
    /* a non-leaf requiring grad: the Python path raises torch's error (and
     * reading .grad of a non-leaf would warn) */
    if (r && (r = attr_is(t, s_is_leaf, Py_True)) <= 0)
        return r < 0 ? -1 : -2;
    if ((r = attr_is(t, s_grad, Py_None)) <= 0)
        return r < 0 ? -1 : -2;
    return (int)PyLong_AsLong(code);
}

/* The registered mproc Storage for the memory at address key, or NULL. */
static PyObject *registered(PyObject *key)
{
    PyObject *st = weak_get(F.registry, key);
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
    if ((code = torch_ready()) <= 0)
        return code;
    if ((code = frame_dtype(t, &flags)) < 0)
        return code == -2 ? 0 : -1;
    PyObject *us = untyped_storage(t), *key = NULL;
    PyObject *size = NULL, *stride = NULL;
    if (!us || !(key = PyObject_CallMethodNoArgs(us, s_data_ptr)))
        goto out;
    if (!(p->st = registered(key))) {
        rc = 0; /* private memory: the Python path moves it */
        goto out;
    }
    if (!(size = PyObject_CallMethodNoArgs(t, s_size)) ||
        !(stride = PyObject_CallMethodNoArgs(t, s_stride)) || call_ssize(t, s_offset, &off) < 0)
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
    PyObject *seen = weak_get(F.rx_cache, key);
    if (!seen && rx_remember(key, t) < 0)
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
    if (!F.dumps_py) {
        PyErr_SetString(PyExc_RuntimeError, "mproc._sharing is not imported: import mproc first");
        return -1;
    }
    if (plain(obj, 3)) {
        PyObject *args[2] = {obj, F.protocol};
        *payload = PyObject_Vectorcall(F.pickle_dumps, args, 2, NULL);
        return *payload ? 0 : -1;
    }
    int r = tensor_frame(obj, payload, atts);
    if (r != 0)
        return r < 0 ? -1 : 0;
    PyObject *res = PyObject_CallOneArg(F.dumps_py, obj);
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
    PyObject *t = weak_get(F.rx_cache, key), *us = NULL, *p = NULL;
    *fresh = 0;
    if (t) {
        us = untyped_storage(t);
        Py_DECREF(t);
        long long n;
        if (us && (p = PyObject_CallMethodNoArgs(us, s_data_ptr)) &&
            PyObject_RichCompareBool(p, key, Py_EQ) == 1 && call_ssize(us, s_nbytes, &n) == 0 &&
            n >= need) {
            Py_DECREF(p);
            return us;
        }
        Py_XDECREF(p);
        Py_XDECREF(us);
        PyErr_Clear(); /* the tensor was pointed elsewhere meanwhile: import */
    }
    PyObject *owner = registered(key);
    if (!owner) {
        PyObject *r = PyObject_CallOneArg(F.register_fn, st);
        if (!r)
            return NULL;
        Py_DECREF(r);
        owner = Py_NewRef(st);
    }
    PyObject *u8 = PyObject_CallOneArg(F.from_dlpack, owner);
    Py_DECREF(owner);
    if (!u8)
        return NULL;
    us = untyped_storage(u8);
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
    if (h.kind != FAST_TENSOR || h.dtype >= NDTYPES || h.ndim > FAST_MAXDIM || h.offset < 0)
        return bad_frame("header");
    if (!st || !PyObject_TypeCheck(st, &mpy_storage_type))
        return bad_frame("its attachment is not a storage");
    long long need = view_extent(&h, dims, dtype_table[h.dtype].size);
    mp_tensor *mt = ((mpy_storage *)st)->t;
    if (need < 0 || (unsigned long long)need > mp_tensor_nbytes(mt))
        return bad_frame("view out of the storage's bounds");
    if (torch_ready() == 0) {
        /* a spawned child that unpickled only its arguments: a tensor
         * arriving is what makes it need torch, as the pickler's path does */
        PyObject *m = PyImport_ImportModule("mproc.torch");
        if (!m)
            return NULL;
        Py_DECREF(m);
    }
    if (torch_ready() <= 0)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_RuntimeError,
            "mproc: a torch tensor arrived but torch cannot be used (half imported?)");
    PyObject *key = PyLong_FromVoidPtr(mp_tensor_data(mt)), *r = NULL, *size = NULL, *stride = NULL;
    PyObject *off = NULL, *empty = NULL, *pt = proto(h.dtype);
    int fresh;
    PyObject *us = key && pt ? torch_storage(st, key, need, &fresh) : NULL;
    if (!us || !(size = tuple_of(dims, h.ndim)) || !(stride = tuple_of(dims + h.ndim, h.ndim)) ||
        !(off = PyLong_FromLongLong(h.offset)) || !(empty = PyObject_CallMethodNoArgs(pt, s_new)))
        goto out;
    r = PyObject_CallMethodObjArgs(empty, s_set, us, off, size, stride, NULL);
    if (r && (h.flags & FAST_REQUIRES_GRAD)) {
        PyObject *x = PyObject_CallMethodOneArg(r, s_rg_, Py_True);
        if (!x)
            Py_CLEAR(r);
        Py_XDECREF(x);
    }
    if (r && fresh && rx_remember(key, r) < 0)
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
    if (!F.loads_py)
        return PyErr_Format(PyExc_RuntimeError, "mproc._sharing is not imported: import mproc");
    if (PyBytes_Check(payload) && is_frame(PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload))) {
        if (!PyList_Check(atts) || PyList_GET_SIZE(atts) != 1)
            return bad_frame("not one attachment");
        return mpy_tensor_from_frame(PyBytes_AS_STRING(payload), (size_t)PyBytes_GET_SIZE(payload),
                                 PyList_GET_ITEM(atts, 0));
    }
    if (atts == Py_None || atts == NULL)
        return PyObject_CallOneArg(F.pickle_loads, payload);
    return PyObject_CallFunctionObjArgs(F.loads_py, payload, atts, NULL);
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
        PyObject *r = mv ? PyObject_CallOneArg(F.pickle_loads, mv) : NULL;
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
    Py_XSETREF(F.registry, Py_NewRef(reg));
    Py_XSETREF(F.register_fn, Py_NewRef(regfn));
    Py_XSETREF(F.dumps_py, Py_NewRef(dpy));
    Py_XSETREF(F.loads_py, Py_NewRef(lpy));
    Py_RETURN_NONE;
}

static PyObject *py_rx_cache_size(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return PyLong_FromSsize_t(PyDict_GET_SIZE(F.rx_cache));
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
     "Storages this process keeps pinned (mapped, one fd each) for the ends it receives "
     "on, for tests: docs/tensor.md, \"Handoff without an fd\"."},
    {NULL, NULL, 0, NULL}};

int mpy_fast_init(PyObject *module)
{
#define INTERN(var, s) if (!(var = PyUnicode_InternFromString(s))) return -1
    INTERN(s_storage, "_storage");
    INTERN(s_untyped_storage, "untyped_storage");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_nbytes, "nbytes");
    INTERN(s_size, "size");
    INTERN(s_stride, "stride");
    INTERN(s_offset, "storage_offset");
    INTERN(s_dtype, "dtype");
    INTERN(s_layout, "layout");
    INTERN(s_is_cpu, "is_cpu");
    INTERN(s_requires_grad, "requires_grad");
    INTERN(s_is_leaf, "is_leaf");
    INTERN(s_grad, "grad");
    INTERN(s_new, "new");
    INTERN(s_set, "set_");
    INTERN(s_rg_, "requires_grad_");
    INTERN(s_torch, "torch");
    INTERN(s_is_conj, "is_conj");
    INTERN(s_is_neg, "is_neg");
#undef INTERN
    PyObject *pk = PyImport_ImportModule("_pickle");
    if (!pk)
        return -1;
    F.pickle_dumps = PyObject_GetAttrString(pk, "dumps");
    F.pickle_loads = PyObject_GetAttrString(pk, "loads");
    Py_DECREF(pk);
    F.protocol = PyLong_FromLong(5); /* pickle.HIGHEST_PROTOCOL of 3.8+ */
    F.rx_cache = PyDict_New();
    if (!F.pickle_dumps || !F.pickle_loads || !F.protocol || !F.rx_cache)
        return -1;
    return PyModule_AddFunctions(module, fast_functions);
}
