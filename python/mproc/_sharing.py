"""Moving torch tensors, torch storages and NumPy arrays into mproc shared
memory, and pickling objects so that only handles to that memory travel.

Two pickling paths:

* mproc's own queues and pipes (`dumps`/`loads`): each shared storage rides
  as an attachment of the mproc message (its fd in the same record, or its
  file_system name); the pickle holds only an index into the attachments.
* Python's channels (spawn's pickled Process arguments, Pool's pipes,
  Python queues), through multiprocessing's ForkingPickler: mproc._forking,
  on this module's sharing and rebuilding.

A registry maps the address of every mproc storage this process uses to its
`_mproc.Storage`, so a tensor already in mproc memory is sent as it is (no
copy); an entry lives as long as some torch storage or array uses the memory.
"""
import functools
import io
import mmap
import numbers
import pickle
import sys
import threading
import weakref

from . import _mproc

Storage = _mproc.Storage

_registry = {}  # storage address -> weakref to its _mproc.Storage
_lock = threading.Lock()
_tls = threading.local()


def _register(st):
    ptr = st.data_ptr

    def gone(ref, ptr=ptr):
        with _lock:
            if _registry.get(ptr) is ref:
                del _registry[ptr]

    with _lock:
        _registry[ptr] = weakref.ref(st, gone)
    return st


def lookup(ptr):
    """The mproc Storage whose memory starts at ptr, or None."""
    ref = _registry.get(ptr)
    return ref() if ref is not None else None


def _torch():
    return sys.modules.get("torch")


def _numpy():
    return sys.modules.get("numpy")


# ---- torch ---------------------------------------------------------------

def _shareable(t):
    return t.device.type == "cpu" and t.layout is _torch().strided and not t.is_quantized


def _plain_storage(s):
    """A CPU TypedStorage mproc can share: a quantized one (a quantized
    tensor's, which torch pickles through its storage) has no tensor to
    move it with, so it goes as torch pickles it, by value."""
    return s.device.type == "cpu" and s.nbytes() > 0 and s.dtype not in _quantized_dtypes()


@functools.lru_cache(maxsize=None)
def _quantized_dtypes():
    torch = _torch()
    return {getattr(torch, n) for n in ("quint8", "qint8", "qint32", "quint4x2", "quint2x4")
            if hasattr(torch, n)}


# torch 2 renamed the storage accessors and warns when a TypedStorage is
# made or asked for the public way (TypedStorage is deprecated there); these
# pick the spelling of the torch that runs (1.13 has only the old ones).

def untyped(t):
    """t's UntypedStorage: untyped_storage() from torch 2, _storage() before."""
    f = getattr(t, "untyped_storage", None)
    return f() if f is not None else t._storage()


def typed(t):
    """t's TypedStorage, without torch 2's deprecation warning."""
    f = getattr(t, "_typed_storage", None)
    return f() if f is not None else t.storage()


def untyped_of(s):
    """The UntypedStorage inside TypedStorage s."""
    us = getattr(s, "_untyped_storage", None)
    return us if us is not None else s._storage


def typed_storage(*args, **kwargs):
    """torch.TypedStorage(*args, **kwargs), without torch 2's warning."""
    torch = _torch()
    if _typed_internal():
        kwargs["_internal"] = True
    return torch.TypedStorage(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _typed_internal():
    """Whether TypedStorage takes _internal=True (torch 2: no warning)."""
    try:
        _torch().TypedStorage(0, dtype=_torch().uint8, _internal=True)
        return True
    except TypeError:
        return False


def tensor_storage(t):
    """The mproc Storage under a CPU tensor, or None when it is private."""
    return lookup(untyped(t).data_ptr())


def _torch_base(st, dtype):
    """A 1-d torch tensor of dtype over the whole storage, no copy."""
    torch = _torch()
    if torch.Tensor not in _REDUCERS:
        # a child that unpickles tensors without having imported mproc.torch
        # (spawn imports only what the pickle names): install it now
        import mproc.torch  # noqa: F401
    u8 = torch.from_dlpack(st)
    return u8 if dtype is torch.uint8 else u8.view(dtype)


def share_tensor_(t, moved=None):
    """Moves t's storage (and its grad's) into mproc shared memory: one copy,
    then t uses the shared memory. A no-op when it is there already.

    torch gives Python no way to swap the memory under a storage in place,
    so t (not other tensors viewing its old storage) is rebound to the new
    storage. moved (old address -> (Storage, old storage)) lets one message
    move several views of one storage to one shared copy."""
    torch = _torch()
    if not _shareable(t):
        return t
    us = untyped(t)  # cheaper than a TypedStorage wrapper
    nbytes = us.nbytes()
    ptr = us.data_ptr()
    if nbytes and lookup(ptr) is None:
        ts = typed(t)
        hit = moved.get(ptr) if moved is not None else None
        if hit is None:
            # the whole storage's bytes, written into the new pages in one pass
            # (ts stays alive across the call)
            st = _register(Storage.filled(nbytes, [(0, ptr, nbytes)]))
            if moved is not None:
                moved[ptr] = (st, ts)  # ts pins the old address for the message's life
        else:
            st = hit[0]
        with torch.no_grad():
            t.set_(typed(_torch_base(st, t.dtype)), t.storage_offset(), t.size(), t.stride())
    if t.grad is not None:
        share_tensor_(t.grad, moved)
    return t


def is_shared(t):
    return _shareable(t) and lookup(untyped(t).data_ptr()) is not None


def _check_leaf(t):
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since "
            "autograd does not support crossing process boundaries. If you just want "
            "to transfer the data, call detach() on the tensor before serializing "
            "(e.g., putting it on the queue).")


def _view_bits(t):
    """The lazy conjugate (1) and negative (2) bits of a view (x.conj(),
    x.conj().imag): set_ over the storage drops them, so they travel."""
    return (1 if t.is_conj() else 0) | (2 if t.is_neg() else 0)


def _plain(t):
    """Whether the receiver needs only dtype, sizes, strides and offset to
    rebuild t (_rebuild_plain): no grad, not a Parameter, no lazy bit."""
    return (not t.requires_grad and t.grad is None and type(t) is _torch().Tensor
            and not _view_bits(t))


def _meta(t, offset):
    return (t.dtype, tuple(t.size()), t.stride(), offset, t.requires_grad, t.grad,
            type(t) is _torch().nn.Parameter, _view_bits(t))


def _tensor_meta(t, moved=None):
    _check_leaf(t)
    share_tensor_(t, moved)
    return _meta(t, t.storage_offset())


def _make_tensor(storage, meta):
    """A tensor over storage (a TypedStorage of meta's dtype). No no_grad()
    needed: the fresh tensor does not require grad when set_ runs (and
    entering no_grad per tensor costs as much as making it)."""
    torch = _torch()
    dtype, size, stride, offset, requires_grad, grad, is_param, bits = meta
    t = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    if bits & 1:
        t = t.conj()
    if bits & 2:
        t = t._neg_view()
    if is_param:
        t = torch.nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if grad is not None:
        t.grad = grad
    return t


def _storage_tensor(s):
    """A 1-d tensor over a torch TypedStorage (for sharing storages)."""
    torch = _torch()
    return torch.empty(0, dtype=s.dtype).set_(s)


# ---- torch's own shared memory, adopted ----------------------------------

# Adopted storages per message: each is one fd of the message's record (the
# kernel passes 253 at most); those beyond ride in the arena (one copy).
ADOPT_MAX = 128
_PAGE = mmap.PAGESIZE


def adopt_storage(us):
    """An mproc Storage over the memory of us (an UntypedStorage in torch's
    file_descriptor shared memory) without a copy, or None when us is not
    there. _get_shared_fd never copies (_share_fd_cpu_ would move a storage
    shared any other way into a new segment). Storages of torch's
    file_system strategy are named /dev/shm files that any process may open
    and truncate: mproc's receivers refuse such fds, so those are copied."""
    # torch maps a file_descriptor segment whole, from offset 0: its data
    # starts a page
    if not us.is_shared() or us.data_ptr() % _PAGE:
        return None
    try:
        fd = us._get_shared_fd()
    except RuntimeError:
        return None  # file_system strategy, or shared by torch without an fd kept
    try:
        return Storage.adopt_fd(fd, us.nbytes())
    except (ValueError, OSError):
        return None  # out of fds, say: the arena copy needs none per tensor


def _adopted_index(p, us, ptr):
    """The attachment index of the adopted memory of us in p's message (one
    per storage however many views travel), or None to copy it instead.
    The bookkeeping rides in p.index, which dumps resets per message."""
    key = ("adopted", ptr)
    i = p.index.get(key)
    if i is None:
        n = p.index.get("adopted", 0)
        st = adopt_storage(us) if n < ADOPT_MAX else None
        if st is None:
            return None
        i = p.index[key] = p.attach(st)  # the message holds it until sent
        p.index["adopted"] = n + 1
    return i


def _reduce_adopted(t, us, ptr, p):
    """_reduce_tensor for a tensor in torch's shared memory: its storage's
    fd travels with the message, the sender's tensor stays as it is."""
    i = _adopted_index(p, us, ptr)
    if i is None:
        return None
    dtype, size, stride, offset = t.dtype, tuple(t.size()), t.stride(), t.storage_offset()
    if _plain(t):
        return _rebuild_plain, (i, dtype, size, stride, offset)
    _check_leaf(t)
    return _rebuild_tensor, (i, _meta(t, offset))


# ---- NumPy ---------------------------------------------------------------

def array_storage(a):
    """The mproc Storage an array's memory belongs to, or None."""
    b = a
    while b is not None:
        if isinstance(b, Storage):
            return b
        if isinstance(b, memoryview):
            b = b.obj
            continue
        b = getattr(b, "base", None)
    return None


def share_array(a):
    """(Storage, byte offset) holding a's elements: a's own when a already
    lives in mproc memory, else a shared copy (NumPy cannot move an array's
    memory, so the sender's array stays private)."""
    np = _numpy()
    if np is None or not isinstance(a, np.ndarray):
        raise TypeError(f"share_array: a must be a NumPy array, not {type(a).__name__}; "
                        "convert it with numpy.asarray first")
    _check_plain_dtype("share_array", a.dtype)
    st = array_storage(a)
    if st is not None:
        return st, a.__array_interface__["data"][0] - st.data_ptr, a.strides
    st = _register(Storage.empty(max(a.nbytes, 1)))
    dst = np.ndarray(a.shape, a.dtype, buffer=st)
    dst[...] = a
    return st, 0, dst.strides


def _shareable_array(a):
    return a.nbytes > 0 and not a.dtype.hasobject


def _make_array(st, dtype, shape, offset, strides):
    np = _numpy()
    return np.ndarray(shape, dtype, buffer=st, offset=offset, strides=strides)


def _check_plain_dtype(fn, dtype):
    if dtype.hasobject:
        raise TypeError(f"{fn}: dtype {dtype} holds Python object pointers, which mean "
                        "nothing in another process; use a numeric, bytes or str dtype")


def shared_array(shape, dtype=float):
    """A zeroed NumPy array in mproc shared memory."""
    import numpy as np
    dtype = np.dtype(dtype)
    _check_plain_dtype("shared_array", dtype)
    shape = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
    n = dtype.itemsize
    for d in shape:
        if not isinstance(d, numbers.Integral):
            raise TypeError(f"shared_array: shape {shape} holds {d!r}; dimensions are ints")
        if d < 0:
            raise ValueError(f"shared_array: shape {shape} has a negative dimension")
        n *= int(d)
    if n > sys.maxsize:
        raise ValueError(f"shared_array: shape {shape} of {dtype} needs {n} bytes, more "
                         "than an array can hold")
    st = _register(Storage.empty(max(n, 1)))
    return np.ndarray(shape, dtype, buffer=st)


# ---- pickling for mproc's queues and pipes -------------------------------

def _att(i):
    return _tls.atts[i]


def _cached_storage(i, dtype):
    """A TypedStorage of dtype over attachment i, one per message and dtype
    (a message's arena holds many tensors)."""
    key = (i, dtype)
    ts = _tls.bases.get(key)
    if ts is None:
        st = _att(i)
        if lookup(st.data_ptr) is None:
            _register(st)
        ts = _tls.bases[key] = typed(_torch_base(st, dtype))
    return ts


def _rebuild_tensor(i, meta):
    return _make_tensor(_cached_storage(i, meta[0]), meta)


def _rebuild_plain(i, dtype, size, stride, offset):
    """_rebuild_tensor for the common case (no grad, not a Parameter): the
    receiver's cost per small tensor is mostly Python calls."""
    ts = _tls.bases.get((i, dtype))
    if ts is None:
        ts = _cached_storage(i, dtype)
    return _torch().empty(0, dtype=dtype).set_(ts, offset, size, stride)


def _rebuild_storage(i, dtype):
    return _cached_storage(i, dtype)


def _rebuild_array(i, dtype, shape, offset, strides):
    st = _att(i)
    if lookup(st.data_ptr) is None:
        _register(st)
    return _make_array(st, dtype, shape, offset, strides)


def _rebuild_handle(i, cls):
    return cls._from_handle(_att(i))


class _Pickler(pickle.Pickler):
    """Puts each mproc storage or handle among the message's attachments."""

    def __init__(self, file, atts):
        # In C (python/src/fastpickle.c): a shared tensor becomes a frame
        # without a Python call; anything else goes to _REDUCERS, or to
        # _reduce_tensor for other tensors.
        self.reducer_override = _mproc._reducer(self)
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.buf = file
        self.busy = False
        self.atts = atts
        self.index = {}
        self.moved = {}
        self.arena = _Arena()

    def attach(self, obj):
        i = self.index.get(id(obj))
        if i is None:
            i = self.index[id(obj)] = len(self.atts)
            self.atts.append(obj)
        return i


_ALIGN = 64  # arena slots start on a cache line (any dtype's alignment)


class _Arena:
    """The private tensors of one message, packed into ONE mproc segment
    made after pickling (the pickle holds only the arena's attachment index
    and each tensor's element offset in it): one memfd and one fd per
    message instead of one per tensor, so a loader's fds do not grow with
    tensors per sample times messages in flight, and a small tensor costs
    a slot and a copy rather than a segment."""

    __slots__ = ("index", "size", "slots", "tensors")

    def __init__(self):
        self.index = None  # attachment index, reserved at the first tensor
        self.size = 0
        self.slots = {}    # old storage address -> (byte offset, old untyped storage, bytes)
        self.tensors = []  # (tensor, dtype, its element offset in the arena, size, stride)

    def place(self, t, us, ptr, nbytes, dtype, size, stride, p):
        """t's element offset in the arena (its storage us, nbytes at ptr,
        gets a slot once)."""
        slot = self.slots.get(ptr)
        if slot is None:
            off = -(-self.size // _ALIGN) * _ALIGN
            self.size = off + nbytes
            slot = self.slots[ptr] = (off, us, nbytes)  # us pins the old memory until the copy
            if self.index is None:
                self.index = len(p.atts)
                p.atts.append(None)
        offset = slot[0] // t.element_size() + t.storage_offset()
        self.tensors.append((t, dtype, offset, size, stride))
        return offset

    def fill(self, atts):
        """Makes the segment, copies every slot in and rebinds the sender's
        tensors to it (as sharing a tensor does: later sends copy nothing)."""
        torch = _torch()
        # each slot is a whole CPU storage's bytes, written straight into the
        # new segment's pages (no zeroing pass, no page faults; a torch copy_
        # per small tensor costs several times more); slots is in offset order
        st = _register(Storage.filled(-(-self.size // _ALIGN) * _ALIGN,
                                      [(off, ptr, nbytes)
                                       for ptr, (off, _, nbytes) in self.slots.items()]))
        bases = {}
        with torch.no_grad():
            for t, dtype, offset, size, stride in self.tensors:
                base = bases.get(dtype)
                if base is None:
                    base = bases[dtype] = typed(_torch_base(st, dtype))
                t.set_(base, offset, size, stride)
        atts[self.index] = st


def _reduce_tensor(t, p):
    torch = _torch()
    if t.device.type != "cpu" or t.layout is not torch.strided or t.is_quantized:
        return NotImplemented
    us = untyped(t)
    ptr, nbytes = us.data_ptr(), us.nbytes()
    if nbytes == 0:
        return NotImplemented
    st = lookup(ptr)
    if st is not None:
        meta = _tensor_meta(t, p.moved)
        return _rebuild_tensor, (p.attach(st), meta)
    if us.is_shared():
        r = _reduce_adopted(t, us, ptr, p)
        if r is not None:
            return r
    if t.requires_grad:
        _check_leaf(t)
    dtype, size, stride = t.dtype, tuple(t.size()), t.stride()
    offset = p.arena.place(t, us, ptr, nbytes, dtype, size, stride, p)
    if _plain(t):
        return _rebuild_plain, (p.arena.index, dtype, size, stride, offset)
    return _rebuild_tensor, (p.arena.index, _meta(t, offset))


def _reduce_storage(s, p):
    torch = _torch()
    if isinstance(s, torch.UntypedStorage):
        s = typed_storage(wrap_storage=s, dtype=torch.uint8)
    if not _plain_storage(s):
        return NotImplemented
    us = untyped_of(s)
    if lookup(us.data_ptr()) is None and us.is_shared():
        i = _adopted_index(p, us, us.data_ptr())
        if i is not None:
            return _rebuild_storage, (i, s.dtype)
    t = share_tensor_(_storage_tensor(s), p.moved)
    return _rebuild_storage, (p.attach(tensor_storage(t)), s.dtype)


def _reduce_array(a, p):
    if not _shareable_array(a):
        return NotImplemented
    st, offset, strides = share_array(a)
    return _rebuild_array, (p.attach(st), a.dtype, a.shape, offset, strides)


def _reduce_handle(obj, p):
    return _rebuild_handle, (p.attach(obj._handle()), type(obj))


_REDUCERS = {}
_SCALARS = (int, float, str, bytes, bool, type(None))


def register_handle_type(cls):
    """cls has _handle() and _from_handle(): it travels as an mproc handle."""
    _REDUCERS[cls] = _reduce_handle


def _dumps_py(obj):
    """dumps for what _mproc.dumps does not handle itself: (payload,
    attachments or None) for an mproc message."""
    if type(obj) in _SCALARS:
        return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), None
    # One pickler per thread, reset per call: building a Pickler and a
    # BytesIO costs more than pickling a small object.
    p = getattr(_tls, "pickler", None)
    if p is None or p.busy:
        p = _Pickler(io.BytesIO(), [])
        if getattr(_tls, "pickler", None) is None:
            _tls.pickler = p
    buf = p.buf
    p.busy = True
    try:
        p.dump(obj)
        payload, atts = buf.getvalue(), p.atts
        if p.arena.index is not None:
            p.arena.fill(atts)
    finally:
        buf.seek(0)
        buf.truncate()
        p.clear_memo()
        p.atts, p.index, p.moved, p.busy = [], {}, {}, False
        p.arena = _Arena()
    return payload, (atts or None)


def _loads_py(payload, atts):
    """loads for what _mproc.loads does not handle itself."""
    if atts is None:
        return pickle.loads(payload)
    saved = getattr(_tls, "atts", None), getattr(_tls, "bases", None)
    _tls.atts, _tls.bases = atts, {}
    try:
        return pickle.loads(payload)
    finally:
        _tls.atts, _tls.bases = saved


# The C fast paths (plain data, one shared tensor) in front of the two above.
_mproc._fast_setup(_registry, _register, _dumps_py, _loads_py)
_mproc._pickle_setup(_REDUCERS, _reduce_tensor, _tls)
dumps = _mproc.dumps
loads = _mproc.loads
