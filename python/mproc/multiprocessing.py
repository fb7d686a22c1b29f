"""mproc.multiprocessing: Python's multiprocessing with mproc's Queue,
JoinableQueue, SimpleQueue and Pipe; NumPy arrays (and torch tensors, when
torch is loaded) inside what they carry travel as mproc shared-memory
handles. Everything else is Python's own (Process, Lock, Event, Barrier,
Manager, get_context, set_start_method, ...).

    import mproc.multiprocessing as mp
"""
import multiprocessing as _std
import multiprocessing.pool as _std_pool
import operator
import signal
import sys
import threading
from multiprocessing import *  # noqa: F401,F403  the drop-in: every public name

from . import _channels, _forking, _sharing
from ._channels import Connection, JoinableQueue, Pipe, Queue, SimpleQueue  # noqa: F401
from ._sharing import shared_array  # noqa: F401
from ._spawn import (ProcessContext, ProcessException, ProcessExitedException,  # noqa: F401
                     ProcessRaisedException, spawn, start_processes)

__all__ = [n for n in _std.__all__] + [
    "Connection", "shared_array", "share_array", "spawn", "start_processes", "ProcessContext",
    "ProcessException", "ProcessExitedException", "ProcessRaisedException",
    "get_sharing_strategy", "set_sharing_strategy", "get_all_sharing_strategies"]

from ._mproc import get_all_sharing_strategies as _all_strategies  # noqa: E402
from ._mproc import get_sharing_strategy, set_sharing_strategy  # noqa: E402,F401


def get_all_sharing_strategies():
    """{'file_descriptor', 'file_system'}"""
    return _all_strategies()


def share_array(a):
    """A copy of NumPy array a in mproc shared memory (a itself when it is
    there already)."""
    st, offset, strides = _sharing.share_array(a)
    return _sharing._make_array(st, a.dtype, a.shape, offset, strides)


def _check_sigchld():
    """Refuses to start a child whose exit nobody could see (libmproc's
    mp_process_start refuses the same)."""
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        raise RuntimeError(
            "Process.start: SIGCHLD is ignored in this process (signal.SIG_IGN), so the "
            "kernel reaps each child the moment it exits and its exit code is lost "
            "(exitcode would stay None and is_alive() True); set it back with "
            "signal.signal(signal.SIGCHLD, signal.SIG_DFL) before starting processes")


def _started(start):
    def wrapped(self):
        _check_sigchld()
        try:
            start(self)
        finally:
            _forking.release_pending()
    return wrapped


def _with_torch(run):
    def wrapped(self):
        # A spawned child imports only what its pickle names: torch (a
        # DataLoader worker's target is torch's) but not mproc.torch, whose
        # import makes collated batches go to mproc memory (else into torch's
        # own shared memory, then copied into the message).
        if "torch" in sys.modules and "mproc.torch" not in sys.modules:
            import mproc.torch  # noqa: F401
        return run(self)
    return wrapped


def _process_class(base):
    """base with a start() that drops the fds kept for the child once the
    child has them, and a run() that installs mproc.torch where torch is
    loaded."""
    name = base.__name__
    cls = globals().get(name)
    if cls is None or cls.__bases__ != (base,):
        # a module attribute, so a spawned child's unpickler finds it
        cls = globals()[name] = type(name, (base,), {"start": _started(base.start),
                                                      "run": _with_torch(base.run),
                                                      "__module__": __name__})
    return cls


Process = _process_class(_std.Process)
for _m in _std.get_all_start_methods():
    _process_class(_std.get_context(_m).Process)


class _PoolQueue:
    """What Pool needs of its task and result queues, on one one-way mproc
    pipe. Readers in several processes take turns through the pipe end's
    robust reader lock, so a worker killed while waiting for a task does
    not leave the others locked out (Python's SimpleQueue would: its lock
    dies with the worker)."""

    def __init__(self):
        self._reader, self._writer = Pipe(duplex=False)
        self._rlock = threading.Lock()  # for Pool._help_stuff_finish, parent only

    def __getstate__(self):
        return self._reader, self._writer

    def __setstate__(self, state):
        self._reader, self._writer = state
        self._reader._readable, self._reader._writable = True, False
        self._writer._readable, self._writer._writable = False, True
        self._rlock = threading.Lock()

    def put(self, obj):
        self._writer.send(obj)

    def get(self):
        return self._reader.recv()

    def empty(self):
        return not self._reader.poll()

    def close(self):
        self._reader.close()
        self._writer.close()


class Pool(_std_pool.Pool):
    """multiprocessing.Pool on mproc pipes: tensors and arrays in arguments
    and results go through mproc shared memory (only handles cross), and
    a killed worker is replaced without stalling the others."""

    def _setup_queues(self):
        self._inqueue = _PoolQueue()
        self._outqueue = _PoolQueue()
        self._quick_put = self._inqueue._writer.send
        self._quick_get = self._outqueue._reader.recv

    def __init__(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None,
                 context=None):
        ctx = getattr(context, "_std", context)
        super().__init__(processes, initializer, initargs, maxtasksperchild, ctx)

    @staticmethod
    def _check_chunksize(chunksize):
        # Python 3.11's map and starmap take chunksize 0 or less and return a
        # list of Nones; imap refuses it with this sentence. A chunksize that
        # is not an int (1.5) fails in Python's task thread, where nobody
        # hears it, and the call waits forever: refuse it here.
        if chunksize is None:
            return
        try:  # what Python's Pool accepts: an int or anything with __index__
            chunksize = operator.index(chunksize)
        except TypeError:
            raise TypeError(f"chunksize must be an int, not {type(chunksize).__name__}") from None
        if chunksize < 1:
            raise ValueError("Chunksize must be 1+, not {0:n}".format(chunksize))

    def _map_async(self, func, iterable, mapper, chunksize=None, callback=None,
                   error_callback=None):
        self._check_chunksize(chunksize)
        return super()._map_async(func, iterable, mapper, chunksize, callback, error_callback)

    def imap(self, func, iterable, chunksize=1):
        self._check_chunksize(chunksize)
        return super().imap(func, iterable, chunksize)

    def imap_unordered(self, func, iterable, chunksize=1):
        self._check_chunksize(chunksize)
        return super().imap_unordered(func, iterable, chunksize)

    @staticmethod
    def _help_stuff_finish(inqueue, task_handler, size):
        # Python's version polls, then receives, and relies on inqueue._rlock
        # to keep workers from reading in between. mproc's workers take turns
        # through the pipe end's own lock, so a task that poll() saw may be
        # taken by a worker first and the receive would then block forever:
        # drain with receives that never block instead.
        inqueue._rlock.acquire()
        while task_handler.is_alive():
            try:
                inqueue._reader._handle().recv(0)
            except (TimeoutError, OSError):  # empty now, or closed
                break

    @staticmethod
    def Process(ctx, *args, **kwds):
        # workers (also those started to replace dead ones) release the fds
        # kept for their start
        return _process_class(ctx.Process)(*args, **kwds)


class _Channels:
    """mproc's channels in a start method's context (mixed into a subclass
    of Python's context class, so isinstance(ctx, BaseContext) holds, as
    DataLoader requires)."""

    def Queue(self, maxsize=0):
        return Queue(maxsize)

    def JoinableQueue(self, maxsize=0):
        return JoinableQueue(maxsize)

    def SimpleQueue(self):
        return SimpleQueue()

    def Pipe(self, duplex=True):
        return Pipe(duplex)

    def Pool(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None):
        return Pool(processes, initializer, initargs, maxtasksperchild, self._std)

    def get_context(self, method=None):
        return get_context(method) if method is not None else self


_contexts = {}


def get_context(method=None):
    """Python's context for method, with mproc's Queue, JoinableQueue,
    SimpleQueue, Pipe, Pool and Process."""
    std = _std.get_context(method)
    ctx = _contexts.get(id(std))
    if ctx is None:
        base = type(std)
        cls = type("Mproc" + base.__name__, (_Channels, base),
                   {"Process": _process_class(std.Process), "__module__": __name__})
        ctx = _contexts[id(std)] = cls()
        ctx._std = std
    return ctx


_forking.install_numpy_when_imported()
