"""Queue, JoinableQueue, SimpleQueue and Pipe with Python's multiprocessing
semantics, on mproc's queues and pipes.

No feeder thread: put() pickles and sends in the calling thread (blocking
only while the queue is full), so join_thread() and cancel_join_thread()
have nothing to wait for, and a message put is in the kernel before put()
returns: a consumer receives it even after the producer has exited.

close() is per process, as Python's: this process's handle goes; other
processes keep using the queue.
"""
import errno
import operator
import queue as _queue

from . import _forking, _mproc, _sharing

_ClosedError = _mproc.ClosedError


class _Base:
    _kind = "queue"

    def __init__(self, maxsize=0, *, ctx=None):
        # as Python's Queue: an int (1.5 and "2" are TypeError), <= 0 unbounded
        maxsize = operator.index(maxsize)
        self._q = _mproc.Queue(self._kind, maxsize if maxsize > 0 else 0)
        self._maxsize = maxsize

    @classmethod
    def _from_handle(cls, q):
        self = cls.__new__(cls)
        self._q = q
        self._maxsize = q.maxsize()
        return self

    def _handle(self):
        if self._q is None:
            raise ValueError(f"Queue {self!r} is closed")
        return self._q

    def __reduce__(self):
        return _forking.fp_reduce_handle(self)

    def _closed_error(self):
        return ValueError(f"Queue {self!r} is closed")

    def close(self):
        self._q = None

    def join_thread(self):
        if self._q is not None:
            raise AssertionError(f"Queue {self!r} not closed")

    def cancel_join_thread(self):
        pass

    def empty(self):
        return self._handle().empty()


class Queue(_Base):
    """multiprocessing.Queue on an mproc queue; tensors and arrays travel as
    shared-memory handles."""

    def put(self, obj, block=True, timeout=None):
        q = self._q
        if q is None:
            raise self._closed_error()
        try:
            q.put_obj(obj, timeout if block else 0)
        except (TimeoutError, BlockingIOError):
            raise _queue.Full from None

    def get(self, block=True, timeout=None):
        q = self._q
        if q is None:
            raise self._closed_error()
        try:
            return q.get_obj(timeout if block else 0)
        except (TimeoutError, BlockingIOError):
            raise _queue.Empty from None

    def put_nowait(self, obj):
        return self.put(obj, False)

    def get_nowait(self):
        return self.get(False)

    def qsize(self):
        return self._handle().qsize()

    def full(self):
        return self._handle().full()


class JoinableQueue(Queue):
    _kind = "joinable"

    def task_done(self):
        self._handle().task_done()

    def join(self, timeout=None):
        """Waits until every item put has been task_done()'d (timeout: an
        mproc extension; TimeoutError when it passes)."""
        self._handle().join(timeout)


class SimpleQueue(_Base):
    _kind = "simple"

    def __init__(self, *, ctx=None):
        super().__init__(0)

    def put(self, obj):
        self._handle().put_obj(obj)

    def get(self):
        return self._handle().get_obj()


for _cls in (Queue, JoinableQueue, SimpleQueue):
    _sharing.register_handle_type(_cls)


class Connection:
    """multiprocessing.connection.Connection on an mproc pipe end."""

    def __init__(self, conn, readable=True, writable=True):
        self._c = conn
        self._readable = readable
        self._writable = writable

    @classmethod
    def _from_handle(cls, c):
        return cls(c)

    def _handle(self):
        if self._c is None:
            raise OSError("handle is closed")
        return self._c

    def __reduce__(self):
        return _forking.fp_reduce_handle(self)

    closed = property(lambda self: self._c is None)
    readable = property(lambda self: self._readable)
    writable = property(lambda self: self._writable)

    def _check_writable(self):
        if not self._writable:
            raise OSError("connection is read-only")

    def _check_readable(self):
        if not self._readable:
            raise OSError("connection is write-only")

    def _send(self, payload, atts):
        self._check_writable()
        try:
            self._handle().send(payload, atts)
        except _ClosedError as e:
            raise BrokenPipeError(errno.EPIPE, e.strerror) from None

    def _recv(self):
        self._check_readable()
        try:
            return self._handle().recv()
        except _ClosedError as e:
            raise EOFError(e.strerror) from None

    def send(self, obj):
        self._check_writable()
        try:
            self._handle().send_obj(obj)
        except _ClosedError as e:
            raise BrokenPipeError(errno.EPIPE, e.strerror) from None

    def recv(self):
        self._check_readable()
        try:
            return self._handle().recv_obj()
        except _ClosedError as e:
            raise EOFError(e.strerror) from None

    def send_bytes(self, buf, offset=0, size=None):
        m = memoryview(buf).cast("B")
        if offset < 0 or offset > len(m):
            raise ValueError("offset is out of range")
        if size is None:
            size = len(m) - offset
        if size < 0 or offset + size > len(m):
            raise ValueError("size is out of range")
        self._send(m[offset:offset + size], None)

    def recv_bytes(self, maxlength=None):
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        payload = self._recv()[0]
        if maxlength is not None and len(payload) > maxlength:
            self.close()
            raise OSError("bad message length")
        return payload

    def recv_bytes_into(self, buf, offset=0):
        # The buffer is checked before the message is taken, so a bad one
        # loses no message (CPython takes it before a read-only buffer fails).
        m = memoryview(buf).cast("B")
        if m.readonly:
            raise TypeError("recv_bytes_into: the buffer is read-only; pass a writable one "
                            "(a bytearray)")
        if offset < 0 or offset > len(m):
            raise ValueError("negative offset" if offset < 0 else "offset too large")
        payload = self._recv()[0]
        if offset + len(payload) > len(m):
            from multiprocessing import BufferTooShort
            raise BufferTooShort(payload)
        m[offset:offset + len(payload)] = payload
        return len(payload)

    def poll(self, timeout=0.0):
        self._check_readable()
        return self._handle().poll(timeout)

    def fileno(self):
        return self._handle().fileno()

    def close(self):
        if self._c is not None:
            self._c.close()
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_sharing.register_handle_type(Connection)


def Pipe(duplex=True):
    """(conn1, conn2); with duplex=False conn1 only receives, conn2 only sends."""
    a, b = _mproc.pipe(duplex)
    if duplex:
        return Connection(a), Connection(b)
    return Connection(a, True, False), Connection(b, False, True)
