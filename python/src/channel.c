/* _mproc.Queue (Queue, JoinableQueue, SimpleQueue) and _mproc.Conn: mproc's
 * queues and pipe ends moving (payload bytes, attachments) messages. The
 * pickling, and Python's queue/pipe semantics, are mproc/_channels.py's. */
#include "mpy.h"

typedef struct {
    mpy_queue *q;
    mp_conn *c;
    const mp_msg *in;
    mp_msg *out;
} op;

static int q_put(void *x, double t) { op *o = x; return mp_queue_put(o->q->q, o->in, t); }
static int q_get(void *x, double t) { op *o = x; return mp_queue_get(o->q->q, &o->out, t); }
static int q_join(void *x, double t) { op *o = x; return mp_queue_join(o->q->q, t); }
static int sq_put(void *x, double t) { op *o = x; return mpy_simple_queue_put(o->q->sq, o->in, t); }
static int sq_get(void *x, double t) { op *o = x; return mpy_simple_queue_get(o->q->sq, &o->out, t); }
static int c_send(void *x, double t) { op *o = x; return mp_conn_send(o->c, o->in, t); }
static int c_recv(void *x, double t) { op *o = x; return mp_conn_recv(o->c, &o->out, t); }
static int c_poll(void *x, double t)
{
    op *o = x;
    int rc = mp_conn_poll(o->c, t);
    return rc == 0 && t > 0 ? MP_ETIMEDOUT : rc; /* 0 "not ready": let mpy_wait slice on */
}

static PyObject *q_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind", "maxsize", NULL};
    const char *kind = "queue";
    long long maxsize = 0;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|sL:Queue", kwlist, &kind, &maxsize))
        return NULL;
    mpy_queue *self = (mpy_queue *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    if (!strcmp(kind, "queue"))
        rc = mp_queue_create(maxsize, &self->q);
    else if (!strcmp(kind, "joinable"))
        rc = mp_joinable_queue_create(maxsize, &self->q);
    else if (!strcmp(kind, "simple"))
        rc = mp_simple_queue_create(&self->sq);
    else {
        Py_DECREF(self);
        return PyErr_Format(PyExc_ValueError, "Queue kind %.40s: pass 'queue', 'joinable' or "
                            "'simple'", kind);
    }
    if (rc < 0) {
        Py_DECREF(self);
        return mpy_raise(rc);
    }
    return (PyObject *)self;
}

static void q_dealloc(mpy_queue *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    mp_queue_release(self->q);
    mp_simple_queue_release(self->sq);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Sends m (destroyed here; NULL: a Python error is set already). */
static PyObject *q_send(mpy_queue *self, mp_msg *m, double t)
{
    int rc;
    if (!m)
        return NULL;
    op o = {self, NULL, m, NULL};
    rc = mpy_wait(self->sq ? sq_put : q_put, &o, t);
    mp_msg_destroy(m);
    if (rc < 0)
        return PyErr_Occurred() ? NULL : mpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *q_put_py(mpy_queue *self, PyObject *args)
{
    PyObject *payload, *atts = Py_None, *timeout = Py_None;
    double t;
    if (!PyArg_ParseTuple(args, "O|OO:put", &payload, &atts, &timeout) ||
        mpy_timeout(timeout, &t) < 0)
        return NULL;
    return q_send(self, mpy_msg_build_to_send(payload, atts), t);
}

/* put_obj(obj, timeout=None): dumps and put in one call, no Python frames. */
static PyObject *q_put_obj(mpy_queue *self, PyObject *const *args, Py_ssize_t n)
{
    PyObject *payload, *atts;
    double t;
    if (n < 1 || n > 2)
        return PyErr_Format(PyExc_TypeError, "put_obj(obj, timeout=None) takes 1 or 2 arguments");
    if (mpy_timeout(n > 1 ? args[1] : Py_None, &t) < 0 || mpy_dumps(args[0], &payload, &atts) < 0)
        return NULL;
    mp_msg *m = mpy_msg_build_to_send(payload, atts);
    Py_XDECREF(atts);
    PyObject *r = q_send(self, m, t); /* destroys m, which borrows payload */
    Py_DECREF(payload);
    return r;
}

/* Receives a message into *out; NULL with a Python error on failure. */
static mp_msg *q_recv(mpy_queue *self, PyObject *timeout)
{
    double t;
    int rc;
    if (mpy_timeout(timeout, &t) < 0)
        return NULL;
    op o = {self, NULL, NULL, NULL};
    rc = mpy_wait(self->sq ? sq_get : q_get, &o, t);
    if (rc < 0) {
        if (!PyErr_Occurred())
            mpy_raise(rc);
        return NULL;
    }
    return o.out;
}

static PyObject *q_get_py(mpy_queue *self, PyObject *args)
{
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTuple(args, "|O:get", &timeout))
        return NULL;
    mp_msg *m = q_recv(self, timeout);
    PyObject *r = m ? mpy_msg_unpack(m) : NULL;
    mp_msg_destroy(m);
    return r;
}

/* get_obj(timeout=None): get and loads in one call. */
static PyObject *q_get_obj(mpy_queue *self, PyObject *const *args, Py_ssize_t n)
{
    if (n > 1)
        return PyErr_Format(PyExc_TypeError, "get_obj(timeout=None) takes at most 1 argument");
    mp_msg *m = q_recv(self, n ? args[0] : Py_None);
    PyObject *r = m ? mpy_msg_loads(m) : NULL;
    mp_msg_destroy(m);
    return r;
}

static PyObject *q_qsize(mpy_queue *self, PyObject *u)
{
    (void)u;
    if (self->sq)
        return PyErr_Format(PyExc_NotImplementedError, "SimpleQueue has no qsize");
    return PyLong_FromLongLong(mp_queue_qsize(self->q));
}

static PyObject *q_empty(mpy_queue *self, PyObject *u)
{
    (void)u;
    return PyBool_FromLong(self->sq ? mp_simple_queue_empty(self->sq) : mp_queue_empty(self->q));
}

static PyObject *q_full(mpy_queue *self, PyObject *u)
{
    (void)u;
    return PyBool_FromLong(self->sq ? 0 : mp_queue_full(self->q));
}

static PyObject *q_maxsize(mpy_queue *self, PyObject *u)
{
    (void)u;
    return PyLong_FromLongLong(self->sq ? 0 : mp_queue_maxsize(self->q));
}

static PyObject *q_close(mpy_queue *self, PyObject *u)
{
    (void)u;
    int rc = self->sq ? mp_simple_queue_close(self->sq) : mp_queue_close(self->q);
    return rc < 0 ? mpy_raise(rc) : Py_NewRef(Py_None);
}

static PyObject *q_task_done(mpy_queue *self, PyObject *u)
{
    (void)u;
    if (self->sq)
        return PyErr_Format(PyExc_ValueError, "task_done() on a SimpleQueue: use JoinableQueue");
    int rc = mp_queue_task_done(self->q);
    if (rc == MP_ESTATE)
        return PyErr_Format(PyExc_ValueError, "task_done() called too many times (%s)",
                            mp_last_error());
    return rc < 0 ? mpy_raise(rc) : Py_NewRef(Py_None);
}

static PyObject *q_join_py(mpy_queue *self, PyObject *args)
{
    PyObject *timeout = Py_None;
    double t;
    if (!PyArg_ParseTuple(args, "|O:join", &timeout) || mpy_timeout(timeout, &t) < 0)
        return NULL;
    if (self->sq)
        return PyErr_Format(PyExc_ValueError, "join() on a SimpleQueue: use JoinableQueue");
    op o = {self, NULL, NULL, NULL};
    int rc = mpy_wait(q_join, &o, t);
    if (rc < 0)
        return PyErr_Occurred() ? NULL : mpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *q_kind(mpy_queue *self, void *c)
{
    (void)c;
    return PyUnicode_FromString(self->sq ? "simple" : mp_queue_is_joinable(self->q) ? "joinable"
                                                                                       : "queue");
}

static PyMethodDef q_methods[] = {
    {"put", (PyCFunction)q_put_py, METH_VARARGS, "put(payload, attachments=None, timeout=None)"},
    {"get", (PyCFunction)q_get_py, METH_VARARGS, "get(timeout=None) -> (payload, attachments)"},
    {"put_obj", (PyCFunction)(void (*)(void))q_put_obj, METH_FASTCALL,
     "put_obj(obj, timeout=None): put(*mproc.dumps(obj), timeout) in one call"},
    {"get_obj", (PyCFunction)(void (*)(void))q_get_obj, METH_FASTCALL,
     "get_obj(timeout=None) -> obj: mproc.loads(*get(timeout)) in one call"},
    {"qsize", (PyCFunction)q_qsize, METH_NOARGS, NULL},
    {"empty", (PyCFunction)q_empty, METH_NOARGS, NULL},
    {"full", (PyCFunction)q_full, METH_NOARGS, NULL},
    {"maxsize", (PyCFunction)q_maxsize, METH_NOARGS, NULL},
    {"close", (PyCFunction)q_close, METH_NOARGS, NULL},
    {"task_done", (PyCFunction)q_task_done, METH_NOARGS, NULL},
    {"join", (PyCFunction)q_join_py, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef q_getset[] = {{"kind", (getter)q_kind, NULL, NULL, NULL},
                                 {NULL, NULL, NULL, NULL, NULL}};

PyTypeObject mpy_queue_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_mproc.Queue",
    .tp_basicsize = sizeof(mpy_queue),
    .tp_dealloc = (destructor)q_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An mproc queue: Queue(kind='queue'|'joinable'|'simple', maxsize=0).",
    .tp_weaklistoffset = offsetof(mpy_queue, weakrefs),
    .tp_methods = q_methods,
    .tp_getset = q_getset,
    .tp_new = q_new,
};

static PyObject *q_wrap(mp_queue *q, mp_simple_queue *sq)
{
    mpy_queue *self = (mpy_queue *)mpy_queue_type.tp_alloc(&mpy_queue_type, 0);
    if (!self) {
        mp_queue_release(q);
        mp_simple_queue_release(sq);
        return NULL;
    }
    self->q = q;
    self->sq = sq;
    return (PyObject *)self;
}

PyObject *mpy_queue_wrap_queue(mp_queue *q) { return q_wrap(q, NULL); }
PyObject *mpy_queue_wrap_simple(mp_simple_queue *q) { return q_wrap(NULL, q); }

/* ---- Conn ------------------------------------------------------------------ */

static void c_dealloc(mpy_conn *self)
{
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    mp_conn_release(self->c);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *c_send_msg(mpy_conn *self, mp_msg *m, double t)
{
    if (!m)
        return NULL;
    op o = {NULL, self->c, m, NULL};
    int rc = mpy_wait(c_send, &o, t);
    mp_msg_destroy(m);
    if (rc < 0)
        return PyErr_Occurred() ? NULL : mpy_raise(rc);
    Py_RETURN_NONE;
}

static PyObject *c_send_py(mpy_conn *self, PyObject *args)
{
    PyObject *payload, *atts = Py_None, *timeout = Py_None;
    double t;
    if (!PyArg_ParseTuple(args, "O|OO:send", &payload, &atts, &timeout) ||
        mpy_timeout(timeout, &t) < 0)
        return NULL;
    return c_send_msg(self, mpy_msg_build_to_send(payload, atts), t);
}

static PyObject *c_send_obj(mpy_conn *self, PyObject *const *args, Py_ssize_t n)
{
    PyObject *payload, *atts;
    double t;
    if (n < 1 || n > 2)
        return PyErr_Format(PyExc_TypeError, "send_obj(obj, timeout=None) takes 1 or 2 arguments");
    if (mpy_timeout(n > 1 ? args[1] : Py_None, &t) < 0 || mpy_dumps(args[0], &payload, &atts) < 0)
        return NULL;
    mp_msg *m = mpy_msg_build_to_send(payload, atts);
    Py_XDECREF(atts);
    PyObject *r = c_send_msg(self, m, t); /* destroys m, which borrows payload */
    Py_DECREF(payload);
    return r;
}

static mp_msg *c_recv_msg(mpy_conn *self, PyObject *timeout)
{
    double t;
    if (mpy_timeout(timeout, &t) < 0)
        return NULL;
    op o = {NULL, self->c, NULL, NULL};
    int rc = mpy_wait(c_recv, &o, t);
    if (rc < 0) {
        if (!PyErr_Occurred())
            mpy_raise(rc);
        return NULL;
    }
    return o.out;
}

static PyObject *c_recv_py(mpy_conn *self, PyObject *args)
{
    PyObject *timeout = Py_None;
    if (!PyArg_ParseTuple(args, "|O:recv", &timeout))
        return NULL;
    mp_msg *m = c_recv_msg(self, timeout);
    PyObject *r = m ? mpy_msg_unpack(m) : NULL;
    mp_msg_destroy(m);
    return r;
}

static PyObject *c_recv_obj(mpy_conn *self, PyObject *const *args, Py_ssize_t n)
{
    if (n > 1)
        return PyErr_Format(PyExc_TypeError, "recv_obj(timeout=None) takes at most 1 argument");
    mp_msg *m = c_recv_msg(self, n ? args[0] : Py_None);
    PyObject *r = m ? mpy_msg_loads(m) : NULL;
    mp_msg_destroy(m);
    return r;
}

static PyObject *c_poll_py(mpy_conn *self, PyObject *args)
{
    PyObject *timeout = NULL;
    double t = 0;
    if (!PyArg_ParseTuple(args, "|O:poll", &timeout) ||
        (timeout && mpy_timeout(timeout, &t) < 0))
        return NULL;
    op o = {NULL, self->c, NULL, NULL};
    int rc = mpy_wait(c_poll, &o, t);
    if (rc == MP_ETIMEDOUT)
        Py_RETURN_FALSE;
    if (rc < 0)
        return PyErr_Occurred() ? NULL : mpy_raise(rc);
    return PyBool_FromLong(rc > 0);
}

static PyObject *c_close(mpy_conn *self, PyObject *u)
{
    (void)u;
    int rc = mp_conn_close(self->c);
    return rc < 0 ? mpy_raise(rc) : Py_NewRef(Py_None);
}

static PyObject *c_fileno(mpy_conn *self, PyObject *u)
{
    (void)u;
    int fd = mpy_conn_fileno(self->c);
    if (fd < 0)
        return PyErr_Format(PyExc_OSError, "handle is closed");
    return PyLong_FromLong(fd);
}

static PyMethodDef c_methods[] = {
    {"send", (PyCFunction)c_send_py, METH_VARARGS, "send(payload, attachments=None, timeout=None)"},
    {"recv", (PyCFunction)c_recv_py, METH_VARARGS, "recv(timeout=None) -> (payload, attachments)"},
    {"send_obj", (PyCFunction)(void (*)(void))c_send_obj, METH_FASTCALL,
     "send_obj(obj, timeout=None): send(*mproc.dumps(obj), timeout) in one call"},
    {"recv_obj", (PyCFunction)(void (*)(void))c_recv_obj, METH_FASTCALL,
     "recv_obj(timeout=None) -> obj: mproc.loads(*recv(timeout)) in one call"},
    {"poll", (PyCFunction)c_poll_py, METH_VARARGS, "poll(timeout=0) -> bool"},
    {"close", (PyCFunction)c_close, METH_NOARGS, NULL},
    {"fileno", (PyCFunction)c_fileno, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

PyTypeObject mpy_conn_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_mproc.Conn",
    .tp_basicsize = sizeof(mpy_conn),
    .tp_dealloc = (destructor)c_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One end of an mproc pipe (from _mproc.pipe).",
    .tp_weaklistoffset = offsetof(mpy_conn, weakrefs),
    .tp_methods = c_methods,
};

PyObject *mpy_conn_wrap(mp_conn *c)
{
    mpy_conn *self = PyObject_New(mpy_conn, &mpy_conn_type);
    if (!self) {
        mp_conn_release(c);
        return NULL;
    }
    self->c = c;
    self->weakrefs = NULL;
    return (PyObject *)self;
}

static PyObject *py_pipe(PyObject *mod, PyObject *args)
{
    int duplex = 1;
    mp_conn *a, *b;
    (void)mod;
    if (!PyArg_ParseTuple(args, "|p:pipe", &duplex))
        return NULL;
    int rc = mp_pipe(duplex, &a, &b);
    if (rc < 0)
        return mpy_raise(rc);
    PyObject *pa = mpy_conn_wrap(a), *pb = mpy_conn_wrap(b);
    if (!pa || !pb) {
        Py_XDECREF(pa);
        Py_XDECREF(pb);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(2, pa, pb);
    Py_DECREF(pa);
    Py_DECREF(pb);
    return r;
}

static PyMethodDef chan_functions[] = {
    {"pipe", py_pipe, METH_VARARGS, "pipe(duplex=True) -> (Conn, Conn); one-way: (reader, writer)"},
    {NULL, NULL, 0, NULL}};

int mpy_channel_init(PyObject *module)
{
    if (PyType_Ready(&mpy_queue_type) < 0 || PyType_Ready(&mpy_conn_type) < 0 ||
        PyModule_AddObjectRef(module, "Queue", (PyObject *)&mpy_queue_type) < 0 ||
        PyModule_AddObjectRef(module, "Conn", (PyObject *)&mpy_conn_type) < 0)
        return -1;
    return PyModule_AddFunctions(module, chan_functions);
}
