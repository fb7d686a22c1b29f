"""Pickling for Python's own channels (spawn's pickled Process arguments,
Pool's pipes, Python queues) through multiprocessing's ForkingPickler, and
installing the reducers into it: a storage is encoded as an mproc frame plus
fds, and the fds cross the way Python moves fds
(`multiprocessing.reduction.DupFd`: passed at exec/forkserver start, else
through the resource sharer). Sharing and rebuilding are mproc._sharing's.
"""
import os
import pickle
import sys
from multiprocessing import reduction as _reduction

from . import _mproc
from ._sharing import (_REDUCERS, _check_leaf, _make_array, _make_tensor, _meta,
                       _plain_storage, _reduce_array, _reduce_storage, _reduce_tensor,
                       _register, _shareable, _shareable_array, _storage_tensor,
                       _tensor_meta, _torch, _torch_base, adopt_storage, lookup,
                       share_array, share_tensor_, tensor_storage, typed, typed_storage,
                       untyped)

_pending = []  # fds (our own dups) that wait for a child's start


def _encode(obj):
    """(frame, DupFd list) for one mproc object crossing a Python channel."""
    frame, fds, holder = _mproc.encode(b"", [obj])
    from multiprocessing import context
    if context.get_spawning_popen() is not None:
        # The fds are passed when the child starts: own copies (two handles
        # may share one fd, e.g. a pipe's two ends their control segment),
        # kept open until then.
        fds = [os.dup(fd) for fd in fds]
        _pending.extend(fds)
    dups = [_reduction.DupFd(fd) for fd in fds]
    del holder  # the resource sharer and the spawn path hold their own fds now
    return frame, dups


def _decode(frame, dups):
    fds = [d.detach() for d in dups]
    return _mproc.decode(frame, fds)[1][0]


def release_pending():
    """Closes the fds _encode kept for a child now started."""
    while _pending:
        os.close(_pending.pop())


def _fp_rebuild_tensor(frame, dups, meta):
    st = _decode(frame, dups)
    if lookup(st.data_ptr) is None:
        _register(st)
    return _make_tensor(typed(_torch_base(st, meta[0])), meta)


def _fp_rebuild_storage(frame, dups, dtype):
    st = _decode(frame, dups)
    if lookup(st.data_ptr) is None:
        _register(st)
    return typed(_torch_base(st, dtype))


def _fp_rebuild_array(frame, dups, dtype, shape, offset, strides):
    st = _decode(frame, dups)
    if lookup(st.data_ptr) is None:
        _register(st)
    return _make_array(st, dtype, shape, offset, strides)


def _fp_rebuild_handle(frame, dups, cls):
    return cls._from_handle(_decode(frame, dups))


def _fp_reduce_adopted(t):
    """fp_reduce_tensor for a tensor in torch's shared memory, or None."""
    us = untyped(t)
    if lookup(us.data_ptr()) is not None:
        return None
    st = adopt_storage(us)
    if st is None:
        return None
    _check_leaf(t)
    return (_fp_rebuild_tensor, (*_encode(st), _meta(t, t.storage_offset())))


def fp_reduce_tensor(t):
    if not _shareable(t) or untyped(t).nbytes() == 0:
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    r = _fp_reduce_adopted(t)
    if r is not None:
        return r
    meta = _tensor_meta(t)
    return (_fp_rebuild_tensor, (*_encode(tensor_storage(t)), meta))


def fp_reduce_storage(s):
    torch = _torch()
    if isinstance(s, torch.UntypedStorage):
        s = typed_storage(wrap_storage=s, dtype=torch.uint8)
    if not _plain_storage(s):
        return s.__reduce__()
    t = share_tensor_(_storage_tensor(s))
    return (_fp_rebuild_storage, (*_encode(tensor_storage(t)), s.dtype))


def fp_reduce_array(a):
    if not _shareable_array(a):
        return a.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    st, offset, strides = share_array(a)
    return (_fp_rebuild_array, (*_encode(st), a.dtype, a.shape, offset, strides))


def fp_reduce_handle(obj):
    return (_fp_rebuild_handle, (*_encode(obj._handle()), type(obj)))


def install_numpy():
    try:
        import numpy as np
    except ImportError:
        return
    if np is not None and np.ndarray not in _REDUCERS:
        _REDUCERS[np.ndarray] = _reduce_array
        _reduction.ForkingPickler.register(np.ndarray, fp_reduce_array)


class _NumpyWatch:
    """A meta path finder that installs the ndarray reducers right after
    numpy's first import: no ndarray exists before it, and importing numpy
    ourselves would cost every process that never uses it (a rank, a pool
    worker) its start-up and ~10 ms at exit (OpenBLAS's threads)."""

    def find_spec(self, name, path=None, target=None):
        if name != "numpy":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)

        def exec_then_install(module):
            del loader.exec_module  # the loader's own again, before numpy's submodules
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            install_numpy()
        if exec_module is not None:
            try:
                loader.exec_module = exec_then_install
            except AttributeError:
                pass  # a loader without instance attributes: numpy loads, unwatched
        return spec


def install_numpy_when_imported():
    """install_numpy() now if numpy is loaded, else as soon as it is."""
    if "numpy" in sys.modules:
        install_numpy()
    elif not any(isinstance(f, _NumpyWatch) for f in sys.meta_path):
        sys.meta_path.insert(0, _NumpyWatch())


def install_torch():
    """Tensors and storages through every Python channel go by mproc handle
    (replaces torch.multiprocessing's reducers, registered when torch loads)."""
    torch = _torch()
    if torch is None or torch.Tensor in _REDUCERS:
        return
    import torch.multiprocessing  # noqa: F401  its reducers first, then ours over them
    for cls in (torch.Tensor, torch.nn.Parameter):
        _REDUCERS[cls] = _reduce_tensor
        _reduction.ForkingPickler.register(cls, fp_reduce_tensor)
    for cls in (torch.TypedStorage, torch.UntypedStorage):
        _REDUCERS[cls] = _reduce_storage
        _reduction.ForkingPickler.register(cls, fp_reduce_storage)
