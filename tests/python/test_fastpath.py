"""The C fast paths of mproc's messages (python/src/fast.c, fast_recv.c): plain data
straight through pickle, one shared tensor as a tensor frame, the receive
cache that reuses a torch storage the receiver already holds, and the
lifetime of all of it (no fd, mapping, segment or cache growth)."""
import gc
import pickle
import struct

import numpy as np
import pytest
import torch

import mproc.torch as mp
import workers
from conftest import own_fds, own_segments
from mproc import _mproc, _sharing
from mproc._sharing import untyped

STRATEGIES = ["file_descriptor", "file_system"]
FRAME = b"\xffMP1"


def own_maps():
    """Mappings of mproc segments (all of this process's lines would move
    with the allocator, ASan's in particular)."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "memfd:mproc" in line or "/dev/shm/mproc-" in line)


def test_plain_data_is_a_plain_pickle():
    obj = (1, "x", [1.5, None, True], {"a": b"b", 2: (3, 4)})
    payload, atts = _mproc.dumps(obj)
    assert atts is None
    assert pickle.loads(payload) == obj
    assert _mproc.loads(payload, None) == obj


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_frame_round_trip(strategy, dtype):
    base = torch.zeros(4, 6, dtype=dtype).share_memory_()
    views = [base, base.t(), base[1:3, 2:], base[2, 3], base[:, :0], base[0].expand(3, 6)]
    for v in views:
        payload, atts = _mproc.dumps(v)
        assert payload[:4] == FRAME and len(atts) == 1
        r = _mproc.loads(payload, atts)
        assert type(r) is torch.Tensor and r.dtype == dtype
        assert r.shape == v.shape and r.stride() == v.stride()
        assert r.storage_offset() == v.storage_offset()
        assert r.data_ptr() == v.data_ptr() and r.is_shared()
        assert torch.equal(r, v)
    r = _mproc.loads(*_mproc.dumps(base[1:3, 2:]))
    r.fill_(1)
    assert base[1:3, 2:].eq(1).all() and base.sum() == 8 or dtype == torch.bool


def test_frame_only_where_the_pickler_would_send_as_is():
    private = torch.zeros(3)
    assert _mproc.dumps(private)[0][:4] != FRAME  # moved to shared memory by the pickler
    assert private.is_shared()
    assert _mproc.dumps(private)[0][:4] == FRAME  # ... and sent as it is from then on
    p = torch.nn.Parameter(torch.zeros(3).share_memory_())
    assert _mproc.dumps(p)[0][:4] != FRAME
    assert type(_mproc.loads(*_mproc.dumps(p))) is torch.nn.Parameter
    g = torch.zeros(3, requires_grad=True).share_memory_()
    g.grad = torch.ones(3)
    assert _mproc.dumps(g)[0][:4] != FRAME
    assert torch.equal(_mproc.loads(*_mproc.dumps(g)).grad, torch.ones(3))
    leaf = torch.zeros(3).share_memory_().requires_grad_()
    payload, atts = _mproc.dumps(leaf)
    assert payload[:4] == FRAME
    r = _mproc.loads(payload, atts)
    assert r.requires_grad and r.is_leaf
    with pytest.raises(RuntimeError, match="non-leaf"):
        _mproc.dumps(leaf * 2)


def test_frame_from_a_rebound_cache_entry():
    """The sender's tensor is the receive cache's entry for its memory; when
    it is pointed elsewhere, a receive must not follow it."""
    u = torch.arange(8.0).share_memory_()
    payload, atts = _mproc.dumps(u)
    u.set_(torch.zeros(2))
    r = _mproc.loads(payload, atts)
    assert r.data_ptr() == atts[0].data_ptr and torch.equal(r, torch.arange(8.0))
    assert r.is_shared()


def bad_frame(code, ndim, offset, dims):
    return FRAME + struct.pack("=BBBBq", 1, code, ndim, 0, offset) + struct.pack(
        f"={len(dims)}q", *dims)


def test_corrupt_frames_rejected():
    st = _mproc.Storage.empty(64)
    with pytest.raises(ValueError, match="bounds"):
        _mproc.loads(bad_frame(0, 1, 0, [17, 1]), [st])  # 68 bytes of 64
    with pytest.raises(ValueError, match="bounds"):
        _mproc.loads(bad_frame(0, 1, 0, [2, -1]), [st])
    with pytest.raises(ValueError, match="bounds"):
        _mproc.loads(bad_frame(0, 2, 0, [2, 2, 1 << 62, 1]), [st])
    with pytest.raises(ValueError, match="header"):
        _mproc.loads(bad_frame(99, 1, 0, [1, 1]), [st])
    with pytest.raises(ValueError, match="header"):
        _mproc.loads(bad_frame(0, 1, 0, [1, 1])[:-1], [st])
    with pytest.raises(ValueError, match="one attachment"):
        _mproc.loads(bad_frame(0, 1, 0, [1, 1]), [st, st])
    with pytest.raises(ValueError, match="not a storage"):
        _mproc.loads(bad_frame(0, 1, 0, [1, 1]), [b"x"])
    assert torch.equal(_mproc.loads(bad_frame(0, 1, 0, [16, 1]), [st]), torch.zeros(16))


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_receive_cache_reuses_a_held_storage(strategy):
    q, done = mp.Queue(), mp.Queue()
    p = mp.get_context("fork").Process(target=workers.share_and_send_twice, args=(q, done))
    p.start()
    a = q.get(timeout=30)
    b = q.get(timeout=30)
    done.put(None)
    p.join(30)
    # one torch storage for both: the second arrival reused the first's
    assert untyped(b)._cdata == untyped(a)._cdata
    assert torch.equal(b, torch.arange(2.0, 6.0)) and b.is_shared()
    b[0] = 100
    assert a[2] == 100
    # in one process: the receiver gets the sender's own storage back
    t = torch.ones(3).share_memory_()
    q.put(t)
    assert untyped(q.get(timeout=5))._cdata == untyped(t)._cdata


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_cache_keeps_nothing_alive(strategy):
    q = mp.Queue()
    gc.collect()
    entries, fds, maps = _mproc._rx_cache_size(), own_fds(), own_maps()
    segs = own_segments()
    t = torch.zeros(1000).share_memory_()
    ptr = untyped(t).data_ptr()
    q.put(t)
    r = q.get(timeout=5)
    assert _mproc._rx_cache_size() == entries + 1
    del t, r
    gc.collect()
    assert _mproc._rx_cache_size() == entries
    assert _sharing.lookup(ptr) is None
    assert (own_fds(), own_maps(), own_segments()) == (fds, maps, segs)


def _round_trips(a, b, rounds, fresh):
    keep = torch.zeros(256).share_memory_()
    for i in range(rounds):
        t = torch.zeros(256).share_memory_() if fresh else keep
        t[0] = i
        a.put(t)
        r = b.get(timeout=60)
        assert r[0] == i and r.data_ptr() == t.data_ptr()


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_thousand_handoffs_leave_nothing(strategy, method):
    ctx = mp.get_context(method)
    a, b = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=workers.echo_until_none, args=(a, b))
    p.start()
    _round_trips(a, b, 20, True)
    _round_trips(a, b, 20, False)
    gc.collect()
    # A storage pinned for handoffs without an fd holds one fd and one
    # mapping until it idles out or the queue goes: not a leak, so the
    # counts are taken without the pins.
    def fds_maps():
        return own_fds() - _mproc._pins_held(), own_maps() - _mproc._pins_held()
    entries, (fds, maps) = _mproc._rx_cache_size(), fds_maps()
    # the echo child holds the last tensor it sent until the next arrives
    segs = len(own_segments([p.pid]))
    for fresh in (False, True):  # the same storage, then a new one per round
        _round_trips(a, b, 1000, fresh)
        gc.collect()
        assert fds_maps() == (fds, maps)
        assert _mproc._pins_held() <= 2
        assert len(own_segments([p.pid])) == segs
        assert _mproc._rx_cache_size() == entries
    arr = mp.shared_array((64,), np.float32)  # NumPy arrays: the pickler's path
    for i in range(1000):
        arr[0] = i
        a.put(arr)
        assert b.get(timeout=60)[0] == i
    del arr
    gc.collect()
    assert fds_maps() == (fds, maps)
    a.put(None)
    p.join(60)
    assert p.exitcode == 0
    assert own_segments([p.pid]) == []


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_pipe_carries_frames(strategy):
    x, y = mp.Pipe()
    t = torch.arange(5.0).share_memory_()
    x.send(t[1:])
    r = y.recv()
    assert torch.equal(r, torch.arange(1.0, 5.0)) and r.data_ptr() == t[1:].data_ptr()
    x.send((1, "plain"))
    assert y.recv() == (1, "plain")


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_containers_of_tensors(strategy):
    """Shared tensors inside other objects are reduced in C (frames in the
    pickle); private ones, Parameters, tensors with grads and arrays in the
    same message still take the pickler's Python reducers."""
    shared = torch.arange(12.0).share_memory_()
    private = torch.ones(3)
    param = torch.nn.Parameter(torch.zeros(2).share_memory_())
    arr = np.arange(4, dtype=np.int16)
    obj = {"a": shared, "views": [shared[2:5], shared.view(3, 4).t()], "p": private,
           "param": param, "arr": arr, "plain": (1, "x")}
    payload, atts = _mproc.dumps(obj)
    assert b"_rebuild_frame" in payload
    r = _mproc.loads(payload, atts)
    assert r["a"].data_ptr() == shared.data_ptr() and r["a"].is_shared()
    assert r["views"][0].storage_offset() == 2 and torch.equal(r["views"][0], shared[2:5])
    assert r["views"][1].stride() == (1, 4)
    assert untyped(r["views"][1])._cdata == untyped(r["a"])._cdata  # one storage, reused
    assert torch.equal(r["p"], private) and private.is_shared()
    assert type(r["param"]) is torch.nn.Parameter
    assert np.array_equal(r["arr"], arr) and r["plain"] == (1, "x")
    r["views"][0][0] = -1
    assert shared[2] == -1
    with pytest.raises(ValueError, match="attachment 5"):
        _mproc.loads(pickle.dumps(_BadIndex()), [])


class _BadIndex:
    def __reduce__(self):
        return _mproc._rebuild_frame, (5, b"")
