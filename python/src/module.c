/* _mproc: errors, timeouts, messages, sharing strategies, module init. */
#include "mpy.h"

#include <errno.h>

static PyObject *closed_error; /* _mproc.ClosedError(OSError, EOFError) */

static PyObject *oserror(PyObject *type, int err, const char *text)
{
    PyObject *args = Py_BuildValue("(is)", err, text);
    if (args) {
        PyErr_SetObject(type, args); /* OSError(errno, ..) picks the subclass */
        Py_DECREF(args);
    }
    return NULL;
}

PyObject *mpy_raise(int rc)
{
    const char *text = mp_last_error();
    char buf[96];
    if (!text || !*text) {
        snprintf(buf, sizeof buf, "mproc: %s (%s)", mp_strerror(rc), mp_err_name(rc));
        text = buf;
    }
    switch (rc) {
    case MP_EINVAL: PyErr_SetString(PyExc_ValueError, text); return NULL;
    case MP_ENOMEM: PyErr_SetString(PyExc_MemoryError, text); return NULL;
    case MP_EOVERFLOW: PyErr_SetString(PyExc_OverflowError, text); return NULL;
    case MP_ESTATE: PyErr_SetString(PyExc_RuntimeError, text); return NULL;
    case MP_ECLOSED: return oserror(closed_error, EPIPE, text);
    case MP_ETIMEDOUT: return oserror(PyExc_OSError, ETIMEDOUT, text);
    case MP_EAGAIN: return oserror(PyExc_OSError, EAGAIN, text);
    case MP_EPROTO: return oserror(PyExc_OSError, EPROTO, text);
    case MP_EMFILE: return oserror(PyExc_OSError, EMFILE, text);
    case MP_ENOSPC: return oserror(PyExc_OSError, ENOSPC, text);
    case MP_ENOTSUP: return oserror(PyExc_OSError, ENOTSUP, text);
    case MP_ECHILD: return oserror(PyExc_OSError, ECHILD, text);
    case MP_EOWNERDEAD: return oserror(PyExc_OSError, EOWNERDEAD, text);
    case MP_ENOENT: return oserror(PyExc_OSError, ENOENT, text);
    case MP_EPERM: return oserror(PyExc_OSError, EPERM, text);
    default: PyErr_SetString(PyExc_OSError, text); return NULL;
    }
}

int mpy_timeout(PyObject *o, double *out)
{
    if (o == NULL || o == Py_None) {
        *out = -1;
        return 0;
    }
    double t = PyFloat_AsDouble(o);
    if (t == -1 && PyErr_Occurred())
        return -1;
    if (t != t) {
        PyErr_SetString(PyExc_ValueError, "timeout is NaN: pass seconds >= 0 or None");
        return -1;
    }
    *out = t < 0 ? 0 : t; /* Python's queues treat a negative timeout as 0 */
    return 0;
}

/* A wait of at most this long runs with the GIL released before Python gets
 * to run signal handlers; it costs nothing when the call does not block. */
#define MPY_SLICE 0.1

int mpy_wait(mpy_blocking_fn call, void *ctx, double timeout)
{
    double left = timeout;
    for (;;) {
        double slice = (left < 0 || left > MPY_SLICE) ? MPY_SLICE : left;
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = call(ctx, slice);
        Py_END_ALLOW_THREADS
        if ((rc != MP_ETIMEDOUT && rc != MP_EAGAIN) || left == 0)
            return rc;
        if (left > 0 && (left -= slice) <= 0)
            return rc;
        if (PyErr_CheckSignals() < 0)
            return MP_EINVAL;
    }
}

/* ---- messages ------------------------------------------------------------ */

static int msg_add(mp_msg *m, PyObject *o)
{
    if (PyObject_TypeCheck(o, &mpy_storage_type))
        return mp_msg_add_tensor(m, NULL, ((mpy_storage *)o)->t);
    if (PyObject_TypeCheck(o, &mpy_conn_type))
        return mp_msg_add_conn(m, NULL, ((mpy_conn *)o)->c);
    if (PyObject_TypeCheck(o, &mpy_queue_type)) {
        mpy_queue *q = (mpy_queue *)o;
        return q->q ? mp_msg_add_queue(m, NULL, q->q) : mp_msg_add_simple_queue(m, NULL, q->sq);
    }
    PyErr_Format(PyExc_TypeError, "mproc cannot attach a %.80s to a message: pass "
                 "Storage, Queue or Conn objects", Py_TYPE(o)->tp_name);
    return MP_EINVAL;
}

/* A bytes payload from this size on is sent from where it lies: copying
 * 100 MB into the message, page faults included, cost as much as the send. */
#define SEND_IN_PLACE (64 * 1024)

static mp_msg *msg_build(PyObject *payload, PyObject *atts, bool borrow)
{
    Py_buffer view;
    mp_msg *m = NULL;
    int rc;
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if ((rc = mp_msg_create(&m)) < 0)
        goto fail;
    /* bytes only: immutable, so the borrowed memory stays as it is while
     * the send runs without the GIL */
    if (borrow && PyBytes_CheckExact(payload) && view.len >= SEND_IN_PLACE)
        mpy_msg_borrow_payload(m, view.buf, (size_t)view.len);
    else if ((rc = mp_msg_set_payload(m, view.buf, (size_t)view.len)) < 0)
        goto fail;
    PyBuffer_Release(&view);
    if (atts && atts != Py_None) {
        PyObject *seq = PySequence_Fast(atts, "attachments must be a sequence");
        if (!seq)
            goto fail_py;
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
            if ((rc = msg_add(m, PySequence_Fast_GET_ITEM(seq, i))) < 0) {
                Py_DECREF(seq);
                if (PyErr_Occurred())
                    goto fail_py;
                mp_msg_destroy(m);
                return mpy_raise(rc), NULL;
            }
        }
        Py_DECREF(seq);
    }
    return m;
fail:
    PyBuffer_Release(&view);
    mp_msg_destroy(m);
    mpy_raise(rc);
    return NULL;
fail_py:
    mp_msg_destroy(m);
    return NULL;
}

mp_msg *mpy_msg_build(PyObject *payload, PyObject *atts)
{
    return msg_build(payload, atts, false);
}

mp_msg *mpy_msg_build_to_send(PyObject *payload, PyObject *atts)
{
    return msg_build(payload, atts, true);
}

static PyObject *attachment(const mp_msg *m, size_t i)
{
    int kind = mp_msg_kind(m, i), rc;
    if (kind == MP_ATTACH_TENSOR) {
        mp_tensor *t;
        if ((rc = mp_msg_get_tensor(m, i, &t)) < 0)
            return mpy_raise(rc);
        return mpy_storage_wrap(t);
    }
    if (kind == MP_ATTACH_QUEUE || kind == MP_ATTACH_JOINABLE_QUEUE) {
        mp_queue *q;
        if ((rc = mp_msg_get_queue(m, i, &q)) < 0)
            return mpy_raise(rc);
        return mpy_queue_wrap_queue(q);
    }
    if (kind == MP_ATTACH_SIMPLE_QUEUE) {
        mp_simple_queue *q;
        if ((rc = mp_msg_get_simple_queue(m, i, &q)) < 0)
            return mpy_raise(rc);
        return mpy_queue_wrap_simple(q);
    }
    if (kind == MP_ATTACH_CONN) {
        mp_conn *c;
        if ((rc = mp_msg_get_conn(m, i, &c)) < 0)
            return mpy_raise(rc);
        return mpy_conn_wrap(c);
    }
    return PyErr_Format(PyExc_TypeError, "mproc message attachment %zu has kind %d, which the "
                        "Python binding does not read (a C program's lock or CUDA tensor?)",
                        i, kind);
}

PyObject *mpy_msg_unpack(const mp_msg *m)
{
    size_t len, n = mp_msg_count(m);
    const void *p = mp_msg_payload(m, &len);
    PyObject *payload = PyBytes_FromStringAndSize(p ? p : "", (Py_ssize_t)len), *atts = Py_None;
    if (!payload)
        return NULL;
    if (n) {
        if (!(atts = PyList_New((Py_ssize_t)n)))
            goto fail;
        for (size_t i = 0; i < n; i++) {
            PyObject *a = attachment(m, i);
            if (!a)
                goto fail;
            PyList_SET_ITEM(atts, (Py_ssize_t)i, a);
        }
    } else {
        Py_INCREF(atts);
    }
    PyObject *r = PyTuple_Pack(2, payload, atts);
    Py_DECREF(payload);
    Py_DECREF(atts);
    return r;
fail:
    Py_DECREF(payload);
    Py_XDECREF(atts == Py_None ? NULL : atts);
    return NULL;
}

/* ---- encode/decode: a message as bytes plus fds, for pickles that cross
 * through Python's own channels (spawn's arguments, Pool's pipes) --------- */

#define MPY_MAX_FDS 253

static void msg_capsule_free(PyObject *cap)
{
    mp_msg_destroy(PyCapsule_GetPointer(cap, "mproc.msg"));
}

static PyObject *py_encode(PyObject *self, PyObject *args)
{
    PyObject *payload, *atts, *fds = NULL, *frame = NULL, *holder = NULL;
    int fdv[MPY_MAX_FDS], nfds = 0, rc;
    void *buf = NULL;
    size_t len = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO:encode", &payload, &atts))
        return NULL;
    mp_msg *m = mpy_msg_build(payload, atts);
    if (!m)
        return NULL;
    if ((rc = mpy_wire_encode(m, &buf, &len, fdv, &nfds, MPY_MAX_FDS)) < 0) {
        mp_msg_destroy(m);
        return mpy_raise(rc);
    }
    /* The fds belong to the message's objects: the holder keeps them open
     * until Python has passed them on (dup'd them or started the child). */
    holder = PyCapsule_New(m, "mproc.msg", msg_capsule_free);
    if (!holder) {
        mp_msg_destroy(m);
        free(buf);
        return NULL;
    }
    frame = PyBytes_FromStringAndSize(buf, (Py_ssize_t)len);
    free(buf);
    if (!frame || !(fds = PyTuple_New(nfds)))
        goto fail;
    for (int i = 0; i < nfds; i++) {
        PyObject *v = PyLong_FromLong(fdv[i]);
        if (!v)
            goto fail;
        PyTuple_SET_ITEM(fds, i, v);
    }
    PyObject *r = PyTuple_Pack(3, frame, fds, holder);
    Py_DECREF(frame);
    Py_DECREF(fds);
    Py_DECREF(holder);
    return r;
fail:
    Py_XDECREF(frame);
    Py_XDECREF(fds);
    Py_DECREF(holder);
    return NULL;
}

static PyObject *py_decode(PyObject *self, PyObject *args)
{
    Py_buffer frame;
    PyObject *fdseq;
    int fdv[MPY_MAX_FDS], rc;
    mp_msg *m = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*O:decode", &frame, &fdseq))
        return NULL;
    PyObject *seq = PySequence_Fast(fdseq, "fds must be a sequence of ints");
    if (!seq || PySequence_Fast_GET_SIZE(seq) > MPY_MAX_FDS) {
        if (seq)
            PyErr_SetString(PyExc_ValueError, "decode: more fds than one mproc message carries");
        Py_XDECREF(seq);
        PyBuffer_Release(&frame);
        return NULL;
    }
    int nfds = (int)PySequence_Fast_GET_SIZE(seq);
    for (int i = 0; i < nfds; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            PyBuffer_Release(&frame);
            return NULL;
        }
        fdv[i] = (int)v;
    }
    Py_DECREF(seq);
    /* decode owns the fds from here on, on success and on failure */
    rc = mpy_wire_decode(frame.buf, (size_t)frame.len, fdv, nfds, &m);
    PyBuffer_Release(&frame);
    if (rc < 0)
        return mpy_raise(rc);
    PyObject *r = mpy_msg_unpack(m);
    mp_msg_destroy(m);
    return r;
}

/* ---- sharing strategies ------------------------------------------------- */

static PyObject *py_get_sharing_strategy(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    return PyUnicode_FromString(mp_get_sharing_strategy());
}

static PyObject *py_set_sharing_strategy(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyUnicode_Check(arg))
        return PyErr_Format(PyExc_TypeError, "set_sharing_strategy: the strategy is a str "
                            "('file_descriptor' or 'file_system'), not %.100s",
                            Py_TYPE(arg)->tp_name);
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name)
        return NULL;
    int rc = mp_set_sharing_strategy(name);
    if (rc == MP_ENOENT || rc == MP_EINVAL) {
        PyErr_SetString(PyExc_ValueError, mp_last_error());
        return NULL;
    }
    return rc < 0 ? mpy_raise(rc) : Py_NewRef(Py_None);
}

static PyObject *py_get_all_sharing_strategies(PyObject *self, PyObject *unused)
{
    const char *const *names = mp_get_all_sharing_strategies();
    (void)self, (void)unused;
    PyObject *s = PySet_New(NULL);
    for (int i = 0; s && names[i]; i++) {
        PyObject *v = PyUnicode_FromString(names[i]);
        if (!v || PySet_Add(s, v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(s);
            break;
        }
        Py_DECREF(v);
    }
    return s;
}

/* mp_tensor_stats_get as a dict of its counters, named as in the C struct. */
static PyObject *py_tensor_stats(PyObject *self, PyObject *unused)
{
    mp_tensor_stats st = {.size = sizeof st};
    int rc = mp_tensor_stats_get(&st);
    (void)self, (void)unused;
    if (rc != 0)
        return mpy_raise(rc);
#define F(name) #name, (unsigned long long)st.name
    return Py_BuildValue("{sKsKsKsKsKsKsKsK}", F(shared_copies), F(shared_copy_bytes),
                         F(segments_created), F(segments_received), F(segments_mapped),
                         F(segments_unmapped), F(segments_live), F(segments_received_by_pin));
#undef F
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS,
     "encode(payload, attachments) -> (frame, fds, holder): a message as bytes plus the fds "
     "to pass; holder keeps the fds open."},
    {"decode", py_decode, METH_VARARGS,
     "decode(frame, fds) -> (payload, attachments); takes ownership of the fds."},
    {"get_sharing_strategy", py_get_sharing_strategy, METH_NOARGS, NULL},
    {"set_sharing_strategy", py_set_sharing_strategy, METH_O, NULL},
    {"get_all_sharing_strategies", py_get_all_sharing_strategies, METH_NOARGS, NULL},
    {"tensor_stats", py_tensor_stats, METH_NOARGS,
     "tensor_stats() -> dict: libmproc's shared-memory counters for tensor storages in this "
     "process (mp_tensor_stats_get): shared_copies, shared_copy_bytes, segments_created, "
     "segments_received, segments_mapped, segments_unmapped, segments_live, "
     "segments_received_by_pin."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_mproc",
                                    "libmproc's shared memory, queues and pipes.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__mproc(void)
{
    PyObject *m = PyModule_Create(&moddef);
    if (!m)
        return NULL;
    PyObject *bases = PyTuple_Pack(2, PyExc_OSError, PyExc_EOFError);
    closed_error = bases ? PyErr_NewExceptionWithDoc(
        "_mproc.ClosedError", "The mproc queue or connection, or its peer, is closed.", bases,
        NULL) : NULL;
    Py_XDECREF(bases);
    if (!closed_error || PyModule_AddObjectRef(m, "ClosedError", closed_error) < 0 ||
        PyModule_AddStringConstant(m, "version", mp_version()) < 0 ||
        mpy_storage_init(m) < 0 || mpy_channel_init(m) < 0 || mpy_fast_init(m) < 0 ||
        mpy_fastpickle_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
