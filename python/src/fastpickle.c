/* mproc._sharing's pickler, hooked in C: reducer_override for a message
 * holding tensors among other objects (a tuple, list or dict of them, a
 * model's state), and the matching rebuild function.
 *
 * A tensor a frame can carry (fast.c: shared, CPU, strided, no grad) is
 * reduced to (_mproc._rebuild_frame, (attachment index, frame bytes))
 * without a Python frame; any other object goes to _sharing's reducers
 * (_REDUCERS by exact type, _reduce_tensor for other tensors), as the
 * Python reducer_override did. */
#include "mpy.h"

static struct {
    PyObject *reducers;      /* _sharing._REDUCERS: type -> f(obj, pickler) */
    PyObject *reduce_tensor; /* _sharing._reduce_tensor(t, pickler) */
    PyObject *tls;           /* _sharing._tls: .atts of the message being loaded */
    PyObject *rebuild;       /* _mproc._rebuild_frame */
} P;

static PyObject *s_index, *s_atts;

/* The attachment index of st in pickler's message (one per object, as
 * _Pickler.attach keys them: by id). */
static PyObject *attach(PyObject *pickler, PyObject *st)
{
    PyObject *index = PyObject_GetAttr(pickler, s_index), *atts = NULL, *i = NULL;
    PyObject *key = PyLong_FromVoidPtr(st);
    if (!index || !key || !(atts = PyObject_GetAttr(pickler, s_atts)))
        goto out;
    if ((i = PyObject_GetItem(index, key)))
        goto out;
    if (!PyErr_ExceptionMatches(PyExc_KeyError))
        goto out;
    PyErr_Clear();
    Py_ssize_t n = PyObject_Length(atts);
    if (n < 0 || !(i = PyLong_FromSsize_t(n)) || PyObject_SetItem(index, key, i) < 0 ||
        PyList_Append(atts, st) < 0)
        Py_CLEAR(i);
out:
    Py_XDECREF(index);
    Py_XDECREF(atts);
    Py_XDECREF(key);
    return i;
}

static PyObject *reduce_frame(PyObject *pickler, mpy_parts *p)
{
    size_t dl = sizeof(int64_t) * 2 * p->head.ndim;
    PyObject *i = attach(pickler, p->st), *frame = NULL, *r = NULL;
    if (i && (frame = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(sizeof p->head + dl)))) {
        memcpy(PyBytes_AS_STRING(frame), &p->head, sizeof p->head);
        memcpy(PyBytes_AS_STRING(frame) + sizeof p->head, p->dims, dl);
        r = Py_BuildValue("(O(OO))", P.rebuild, i, frame);
    }
    Py_XDECREF(i);
    Py_XDECREF(frame);
    return r;
}

/* reducer_override(obj), bound to its pickler (self). */
static PyObject *reduce(PyObject *pickler, PyObject *obj)
{
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp == &PyTuple_Type || tp == &PyList_Type || tp == &PyDict_Type || tp == &PySet_Type)
        Py_RETURN_NOTIMPLEMENTED; /* the common containers: nothing of ours */
    mpy_parts p;
    int r = mpy_tensor_parts(obj, &p);
    if (r < 0)
        return NULL;
    if (r == 1) {
        PyObject *res = reduce_frame(pickler, &p);
        mpy_parts_clear(&p);
        return res;
    }
    PyObject *f = PyDict_GetItemWithError(P.reducers, (PyObject *)tp);
    if (!f && PyErr_Occurred())
        return NULL;
    if (!f) {
        PyObject *tt = mpy_torch_tensor_type();
        int is = tt ? PyObject_IsInstance(obj, tt) : 0;
        if (is < 0)
            return NULL;
        if (!is)
            Py_RETURN_NOTIMPLEMENTED;
        f = P.reduce_tensor;
    }
    return PyObject_CallFunctionObjArgs(f, obj, pickler, NULL);
}

static PyMethodDef reduce_def = {"reducer_override", reduce, METH_O,
                                 "mproc's reducer_override for this pickler."};

static PyObject *py_reducer(PyObject *self, PyObject *pickler)
{
    (void)self;
    if (!P.rebuild)
        return PyErr_Format(PyExc_RuntimeError, "mproc._sharing is not set up: import mproc");
    return PyCFunction_New(&reduce_def, pickler);
}

/* _rebuild_frame(i, frame): the tensor of frame over attachment i of the
 * message being loaded. */
static PyObject *py_rebuild_frame(PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    (void)self;
    if (n != 2 || !PyBytes_Check(args[1]))
        return PyErr_Format(PyExc_TypeError, "_rebuild_frame(index, frame bytes)");
    Py_ssize_t i = PyLong_AsSsize_t(args[0]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    PyObject *atts = PyObject_GetAttr(P.tls, s_atts), *r = NULL;
    if (!atts)
        return NULL;
    if (!PyList_Check(atts) || i < 0 || i >= PyList_GET_SIZE(atts))
        PyErr_Format(PyExc_ValueError, "mproc: a tensor names attachment %zd of a message "
                     "that has fewer", i);
    else
        r = mpy_tensor_from_frame(PyBytes_AS_STRING(args[1]), (size_t)PyBytes_GET_SIZE(args[1]),
                                  PyList_GET_ITEM(atts, i));
    Py_DECREF(atts);
    return r;
}

static PyObject *py_pickle_setup(PyObject *self, PyObject *args)
{
    PyObject *reducers, *reduce_tensor, *tls;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!OO:_pickle_setup", &PyDict_Type, &reducers, &reduce_tensor,
                          &tls))
        return NULL;
    Py_XSETREF(P.reducers, Py_NewRef(reducers));
    Py_XSETREF(P.reduce_tensor, Py_NewRef(reduce_tensor));
    Py_XSETREF(P.tls, Py_NewRef(tls));
    Py_RETURN_NONE;
}

static PyMethodDef pickle_functions[] = {
    {"_reducer", py_reducer, METH_O,
     "_reducer(pickler) -> its reducer_override (C): shared tensors as frames, the rest to "
     "mproc._sharing's reducers."},
    {"_rebuild_frame", (PyCFunction)(void (*)(void))py_rebuild_frame, METH_FASTCALL,
     "_rebuild_frame(index, frame): a tensor of the message being loaded."},
    {"_pickle_setup", py_pickle_setup, METH_VARARGS,
     "_pickle_setup(reducers, reduce_tensor, tls): mproc._sharing's hooks."},
    {NULL, NULL, 0, NULL}};

int mpy_fastpickle_init(PyObject *module)
{
    if (!(s_index = PyUnicode_InternFromString("index")) ||
        !(s_atts = PyUnicode_InternFromString("atts")) ||
        PyModule_AddFunctions(module, pickle_functions) < 0)
        return -1;
    P.rebuild = PyObject_GetAttrString(module, "_rebuild_frame");
    return P.rebuild ? 0 : -1;
}
