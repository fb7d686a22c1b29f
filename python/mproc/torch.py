"""mproc.torch: a drop-in for torch.multiprocessing on libmproc.

    import mproc.torch as mp      # instead of: import torch.multiprocessing as mp

Everything of Python's multiprocessing is here, with mproc's Queue,
JoinableQueue, SimpleQueue and Pipe; every torch tensor (and its .grad),
torch storage and NumPy array inside what they carry moves into mproc shared
memory once and travels as a handle. Importing this module also makes
Tensor.share_memory_() (so Module.share_memory()) put storages in mproc
shared memory, Tensor.is_shared() see them, and every tensor that crosses a
Python channel (spawn's arguments, Pool's pipes) go by mproc handle.
"""
import errno as _errno

import torch as _torch
import torch.multiprocessing as _tmp
from torch.utils.data import dataloader as _dataloader

from . import _channels, _forking, _sharing
from .multiprocessing import *  # noqa: F401,F403
from .multiprocessing import __all__ as _mp_all
from .multiprocessing import (Connection, Pool, Process, get_all_sharing_strategies,  # noqa: F401
                              get_context, get_sharing_strategy, set_sharing_strategy, share_array,
                              shared_array)
from ._spawn import (ProcessContext, ProcessException, ProcessExitedException,  # noqa: F401
                     ProcessRaisedException, spawn, start_processes)

SpawnContext = ProcessContext
__all__ = list(_mp_all) + ["SpawnContext", "init_reductions"]

_torch_share_memory_ = _torch.Tensor.share_memory_
_torch_is_shared = _torch.Tensor.is_shared


def _share_memory_(self):
    """Moves the tensor's storage (and its grad's) into mproc shared memory;
    a no-op when it is there already. CUDA tensors: torch's own."""
    if self.device.type != "cpu":
        return _torch_share_memory_(self)
    return _sharing.share_tensor_(self)


def _is_shared(self):
    return _sharing.is_shared(self) or _torch_is_shared(self)


_torch_new_shared = _torch.TypedStorage._new_shared


# Below this size a collated tensor stays private: the message's arena packs
# it with the others (one segment and one fd per batch, however many tensors
# a sample has); from it up, a tensor gets its own segment and crosses
# without a copy (the fds in flight are then bounded by bytes, 1 MiB each).
OWN_SEGMENT_MIN = 1 << 20


def _new_shared(self, size, *, device=None):
    """TypedStorage._new_shared for DataLoader's workers, which collate each
    batch into it: a large one in mproc shared memory (it crosses without a
    copy), a small one private (it rides in its message's arena)."""
    if device is not None and _torch.device(device).type != "cpu":
        return _torch_new_shared(self, size, device=device)
    nbytes = size * self.element_size()
    if nbytes == 0:
        return _torch_new_shared(self, size, device=device)
    if nbytes < OWN_SEGMENT_MIN:
        return _sharing.typed_storage(size, dtype=self.dtype)
    st = _sharing._register(_sharing.Storage.empty(nbytes))
    return _sharing.typed(_sharing._torch_base(st, self.dtype))


def _drain(q):
    """Takes and drops every message left in q (an _mproc.Queue), so the
    segments they name are released now: under file_system a message never
    received holds its segment's name in /dev/shm until mproc-shm-manager
    reclaims it after the program's end. Bounded, in case a worker that
    outlived its termination keeps putting."""
    for _ in range(1 << 16):
        try:
            q.get(0)
        except (TimeoutError, BlockingIOError):
            return
        except OSError as e:
            if e.errno != _errno.EPROTO:  # a malformed message is dropped: go on
                return


_torch_shutdown_workers = _dataloader._MultiProcessingDataLoaderIter._shutdown_workers


def _shutdown_workers(self):
    """DataLoader's shutdown (an iterator dropped mid-epoch, a finished
    epoch, a worker's death), then, on mproc's queues, the batches still
    queued are dropped once the workers are gone, so nothing stays behind."""
    q = getattr(self, "_worker_result_queue", None)
    raw = None
    # _channels is None when __del__ runs late in the interpreter's exit
    if _channels is not None and isinstance(q, _channels._Base) and \
            not getattr(self, "_shutdown", True):
        raw = q._q
    try:
        _torch_shutdown_workers(self)
    finally:
        if raw is not None:
            for w in getattr(self, "_workers", ()):
                w.join(timeout=5)  # terminated stragglers: none puts after the drain
            _drain(raw)


def init_reductions():
    """Installs mproc's sharing into torch (done on import; idempotent)."""
    _torch.Tensor.share_memory_ = _share_memory_
    _torch.Tensor.is_shared = _is_shared
    _torch.TypedStorage._new_shared = _new_shared
    _dataloader._MultiProcessingDataLoaderIter._shutdown_workers = _shutdown_workers
    _forking.install_torch()
    _forking.install_numpy()


init_reductions()
_ = _tmp  # torch.multiprocessing stays importable next to this module
