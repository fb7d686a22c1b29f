"""spawn / start_processes / ProcessContext with torch.multiprocessing's
semantics, on Python processes and mproc queues.

Design: libmproc's mp_spawn starts C entry functions; a Python function
cannot be one (a spawned child re-executes the program and must run Python
code the interpreter has not yet imported), so ranks are Python processes of
the chosen start method. Each rank's error record is an mproc SimpleQueue:
the child puts its traceback text synchronously (no feeder thread, so it is
in the kernel before the child exits), then exits 1. join() waits on all
sentinels at once, so the first failure is seen as soon as the process
exits; the siblings get SIGTERM, then SIGKILL after a grace period.
"""
import multiprocessing.connection
import signal
import sys

_GRACE = 1.0  # seconds between SIGTERM and SIGKILL for the siblings of a failure

try:
    if "torch" not in sys.modules:
        raise ImportError
    from torch.multiprocessing.spawn import (ProcessException, ProcessExitedException,
                                             ProcessRaisedException)
except ImportError:
    class ProcessException(Exception):
        __slots__ = ["error_index", "error_pid"]

        def __init__(self, msg, error_index, pid):
            super().__init__(msg)
            self.msg = msg
            self.error_index = error_index
            self.error_pid = self.pid = pid  # torch 2's name, and 1.x's

        def __reduce__(self):
            return type(self), (self.msg, self.error_index, self.pid)

    class ProcessRaisedException(ProcessException):
        """A rank raised; msg carries its traceback text."""

    class ProcessExitedException(ProcessException):
        """A rank exited with a non-zero code or died of a signal."""

        __slots__ = ["exit_code"]

        def __init__(self, msg, error_index, error_pid, exit_code, signal_name=None):
            super().__init__(msg, error_index, error_pid)
            self.exit_code = exit_code
            self.signal_name = signal_name

        def __reduce__(self):
            return (type(self), (self.msg, self.error_index, self.pid, self.exit_code,
                                 self.signal_name))


def _wrap(fn, i, args, error_queue):
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, int(signal.SIGINT))  # PR_SET_PDEATHSIG: die with the parent
    except (OSError, AttributeError):
        pass
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # SIGINT from the parent: stop quietly
    except Exception:
        import traceback
        error_queue.put(traceback.format_exc())
        sys.exit(1)


class ProcessContext:
    def __init__(self, processes, error_queues):
        self.error_queues = error_queues
        self.processes = processes
        self.sentinels = {p.sentinel: i for i, p in enumerate(processes)}

    def pids(self):
        return [int(p.pid) for p in self.processes]

    def join(self, timeout=None):
        """True when every rank has exited 0, False when some still run after
        timeout; raises ProcessRaisedException / ProcessExitedException for
        the first rank that failed, after stopping the others."""
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(list(self.sentinels), timeout=timeout)
        error_index = None
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            p = self.processes[index]
            p.join()
            if p.exitcode != 0:
                error_index = index
                break
        if error_index is None:
            return not self.sentinels
        self._stop_all()
        self.sentinels.clear()
        self._raise(error_index)

    def _stop_all(self):
        alive = [p for p in self.processes if p.is_alive()]
        for p in alive:
            p.terminate()
        if alive:
            multiprocessing.connection.wait([p.sentinel for p in alive], timeout=_GRACE)
        for p in alive:
            if p.is_alive():
                p.kill()
        for p in self.processes:
            p.join()

    def _raise(self, index):
        failed = self.processes[index]
        q = self.error_queues[index]
        if q.empty():
            code = failed.exitcode
            if code < 0:
                name = signal.Signals(-code).name
                raise ProcessExitedException(
                    "process %d terminated with signal %s" % (index, name),
                    error_index=index, error_pid=failed.pid, exit_code=code, signal_name=name)
            raise ProcessExitedException(
                "process %d terminated with exit code %d" % (index, code),
                error_index=index, error_pid=failed.pid, exit_code=code)
        msg = "\n\n-- Process %d terminated with the following error:\n" % index
        raise ProcessRaisedException(msg + q.get(), index, failed.pid)


def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    from . import multiprocessing as mp
    ctx = mp.get_context(start_method)
    error_queues, processes = [], []
    try:
        for i in range(nprocs):
            q = ctx.SimpleQueue()
            p = ctx.Process(target=_wrap, args=(fn, i, args, q), daemon=daemon)
            p.start()
            error_queues.append(q)
            processes.append(p)
    except BaseException:
        ProcessContext(processes, error_queues)._stop_all()
        raise
    context = ProcessContext(processes, error_queues)
    if not join:
        return context
    try:
        while not context.join():
            pass
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C, or a signal handler raising SystemExit, in the parent only
        # (a kill -INT of its pid; a terminal's Ctrl-C reaches every rank):
        # stop the ranks, else the interpreter's exit would wait for them.
        context._stop_all()
        raise


def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """torch.multiprocessing.spawn: fn(i, *args) in nprocs processes."""
    return start_processes(fn, args, nprocs, join, daemon, start_method)
