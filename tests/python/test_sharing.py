"""torch tensors, storages and NumPy arrays through mproc.torch: what
PyTorch's test_multiprocessing.py checks on CPU, written against mproc."""
import gc
import os

import numpy as np
import pytest
import torch

import mproc.torch as mp
import workers
from conftest import children, killed_holder_leaves, own_fds, own_segments

STRATEGIES = ["file_descriptor", "file_system"]


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_inplace_sharing_seen_by_other_side(strategy):
    q, r = mp.Queue(), mp.Queue()
    t = torch.zeros(5)
    p = mp.Process(target=workers.add_one, args=(q, r))
    p.start()
    q.put(t)
    assert r.get(timeout=30) == ("done", True)
    p.join(30)
    assert torch.equal(t, torch.ones(5))
    assert t.is_shared()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_start_methods(method):
    ctx = mp.get_context(method)
    q, r = ctx.Queue(), ctx.Queue()
    t = torch.zeros(3)
    p = ctx.Process(target=workers.add_one, args=(q, r))
    p.start()
    q.put(t)
    assert r.get(timeout=60) == ("done", True)
    p.join(60)
    assert torch.equal(t, torch.ones(3))


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_views_share_storage(strategy):
    q = mp.Queue()
    base = torch.arange(10.0)
    view = base[2:7]
    q.put([base, view, base.view(2, 5).t()])
    b, v, tt = q.get()
    assert b.storage().data_ptr() == v.storage().data_ptr() == tt.storage().data_ptr()
    assert torch.equal(v, torch.arange(2.0, 7.0))
    assert tt.shape == (5, 2) and tt.stride() == (1, 5)
    b[3] = 100
    assert v[1] == 100 and base[3] == 100


def test_storage_travels():
    q = mp.Queue()
    t = torch.arange(4, dtype=torch.int32)
    q.put(t.storage())
    s = q.get()
    assert isinstance(s, torch.TypedStorage) and s.dtype == torch.int32
    assert list(s) == [0, 1, 2, 3]


def test_grad_shared():
    q, r = mp.Queue(), mp.Queue()
    t = torch.zeros(4, requires_grad=True)
    t.grad = torch.zeros(4)
    with torch.no_grad():
        p = mp.Process(target=workers.inc_grad, args=(q, r))
        p.start()
        q.put(t)
        assert r.get(timeout=30)
        p.join(30)
    assert torch.equal(t.grad, torch.ones(4))
    assert t.grad.is_shared()


def test_parameter_and_requires_grad():
    q = mp.Queue()
    p = torch.nn.Parameter(torch.ones(2))
    q.put(p)
    got = q.get()
    assert isinstance(got, torch.nn.Parameter) and got.requires_grad


def _conj_neg():
    x = torch.arange(4.0).to(torch.complex64) * (1 + 1j)
    return x.conj(), x.conj().imag  # lazy conjugate and negative views


def _same_view(a, b):
    return (a.is_conj(), a.is_neg(), a.resolve_conj().resolve_neg().tolist()) == \
        (b.is_conj(), b.is_neg(), b.resolve_conj().resolve_neg().tolist())


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_conj_and_neg_views_keep_their_bits(strategy):
    # set_ over the received storage drops a view's lazy bits: without them
    # the receiver reads x where the sender reads conj(x) (torch 1.13 does)
    q = mp.Queue()
    c, n = _conj_neg()
    for shared in (False, True):  # the arena's path, then the shared one
        q.put(c)
        assert _same_view(q.get(), c)
        q.put(n)
        assert _same_view(q.get(), n)
        q.put({"c": c, "n": n})  # inside an object: the C reducer's path
        got = q.get()
        assert _same_view(got["c"], c) and _same_view(got["n"], n)
        c.share_memory_()
        n.share_memory_()
    # across a spawn child's arguments (ForkingPickler) and back
    r = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=workers.echo_objects, args=(r, c, n))
    p.start()
    got_c, got_n = r.get(timeout=30)
    p.join(30)
    assert _same_view(got_c, c) and _same_view(got_n, n)


def test_quantized_tensor_travels_by_value():
    # its storage has a quantized dtype, which torch cannot view as a plain
    # tensor: it goes as torch pickles it (a copy), not by mproc handle
    q = mp.Queue()
    t = torch.quantize_per_tensor(torch.tensor([0.5, 1.0, 2.0]), 0.1, 10, torch.quint8)
    q.put(t)
    got = q.get()
    assert got.is_quantized and torch.equal(got.dequantize(), t.dequantize())
    assert got.q_scale() == t.q_scale() and got.q_zero_point() == t.q_zero_point()
    p = mp.get_context("spawn").Process(target=workers.echo_objects, args=(q, t))
    p.start()
    got = q.get(timeout=30)[0]
    p.join(30)
    assert torch.equal(got.dequantize(), t.dequantize())


def test_non_leaf_refused():
    q = mp.Queue()
    x = torch.ones(2, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="non-leaf"):
        q.put(x)


def test_same_tensor_sent_twice_is_one_copy():
    q = mp.Queue()
    t = torch.zeros(1000)
    copies = mp._sharing  # noqa: F841
    before = t.storage().data_ptr()
    q.put(t)
    after = t.storage().data_ptr()
    q.put(t)
    assert t.storage().data_ptr() == after != before
    a, b = q.get(), q.get()
    a[0] = 9
    assert b[0] == 9 and t[0] == 9


def test_share_memory_and_is_shared():
    t = torch.zeros(3)
    assert not t.is_shared()
    assert t.share_memory_() is t
    assert t.is_shared()
    ptr = t.storage().data_ptr()
    t.share_memory_()
    assert t.storage().data_ptr() == ptr
    m = torch.nn.Linear(3, 2)
    m.share_memory()
    assert all(p.is_shared() for p in m.parameters())


def test_strategy_switch():
    old = mp.get_sharing_strategy()
    try:
        mp.set_sharing_strategy("file_system")
        t = torch.zeros(2).share_memory_()
        assert mp._sharing.tensor_storage(t).sharing_strategy == "file_system"
    finally:
        mp.set_sharing_strategy(old)


def test_fresh_tensor_from_child():
    q = mp.Queue()
    p = mp.Process(target=workers.fresh_tensor, args=(q, 1000))
    p.start()
    p.join(30)  # the producer is gone before we receive
    t = q.get(timeout=10)
    assert torch.equal(t, torch.full((1000,), 7.0))


def test_numpy_arrays():
    q, r = mp.Queue(), mp.Queue()
    a = mp.shared_array((4,), np.float64)
    p = mp.Process(target=workers.array_child, args=(q, r))
    p.start()
    q.put(a)
    assert r.get(timeout=30) == 20.0
    p.join(30)
    assert (a == 5).all()
    b = np.arange(6).reshape(2, 3)[:, ::2]
    q.put(b)
    got = q.get()
    assert (got == b).all() and got.shape == (2, 2)


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_no_leaks_after_many_rounds(strategy):
    q, r = mp.Queue(), mp.Queue()
    p = mp.Process(target=workers.echo, args=(q, r, 60))
    p.start()
    gc.collect()
    fds, segs = own_fds(), own_segments([p.pid])
    for i in range(60):
        q.put(torch.full((256,), float(i)))
        assert r.get(timeout=30)[0] == i
    p.join(30)
    gc.collect()
    assert own_fds() <= fds
    assert own_segments([p.pid]) == segs
    assert p.pid not in children()


@pytest.mark.parametrize("strategy", ["file_system"], indirect=True)
def test_fork_worker_gives_back_inherited_buffer(strategy):
    """A fork worker that receives a buffer made before the fork (so it
    inherited the mapping) gives the message's reference back once done
    with it, although it never drops its copy of the parent's tensor: when
    the parent drops the buffer, the name leaves /dev/shm at once. It used
    to stay until the shm manager noticed, or for good without one."""
    before = own_segments()
    buf = torch.full((1024,), 3.0).share_memory_()
    q, r = mp.get_context("fork").Queue(), mp.Queue()
    p = mp.get_context("fork").Process(target=workers.echo, args=(q, r, 2))
    p.start()
    for _ in range(2):
        q.put(buf)
        got = r.get(timeout=30)
        assert got.data_ptr() == buf.data_ptr() and got[0] == 3.0
    p.join(30)
    assert p.exitcode == 0
    del got, buf
    gc.collect()
    assert own_segments([p.pid]) == before


def test_killed_process_segments_reclaimed(tmp_path):
    """A process killed while it holds a file_system segment leaves its name
    in /dev/shm; the package's own mproc-shm-manager (built beside the
    extension, where libmproc looks for it) removes it."""
    assert killed_holder_leaves(tmp_path) == []


def test_pool_map_tensors():
    with mp.Pool(2) as pool:
        out = pool.map(workers.double, [torch.full((100,), float(i)) for i in range(4)])
        assert [float(t[0]) for t in out] == [0.0, 2.0, 4.0, 6.0]
        assert all(t.is_shared() for t in out)
        shared = torch.zeros(8).share_memory_()
        pool.map(workers.fill_add, [(shared, 1.0)])
        assert torch.equal(shared, torch.ones(8))


def test_pool_map_refuses_chunksize_below_one():
    # Python 3.11's own map returns [None, None] here
    with mp.Pool(1) as pool:
        for bad in (0, -1):
            with pytest.raises(ValueError, match="Chunksize must be 1"):
                pool.map(abs, [1, -2], chunksize=bad)
            with pytest.raises(ValueError, match="Chunksize must be 1"):
                pool.starmap(pow, [(2, 3)], chunksize=bad)
        assert pool.map(abs, [1, -2], chunksize=1) == [1, 2]
        # Python's own Pool waits forever on a chunksize that is not an int
        # (map last: the others return at once when they do not refuse)
        for call in (pool.map_async, pool.imap, pool.imap_unordered, pool.map):
            with pytest.raises(TypeError, match="chunksize must be an int, not float"):
                call(abs, [1, -2], 1.5)
        assert list(pool.imap(abs, [1, -2], 2)) == [1, 2]
        # an integer that is not an int, as Python's Pool takes it
        assert pool.map(abs, [1, -2, 3], np.int64(2)) == [1, 2, 3]
        assert list(pool.imap(abs, [1, -2], np.int64(2))) == [1, 2]


@pytest.mark.parametrize("strategy", ["file_system"], indirect=True)
def test_pool_file_system(strategy):
    with mp.Pool(2) as pool:
        out = pool.map(workers.make_tensor, [3, 5])
    assert [t.numel() for t in out] == [3, 5]


def test_pool_worker_death_replaced():
    with mp.Pool(2) as pool:
        pids = set(pool.map(workers.pid_of, range(8)))
        victim = next(iter(pids))
        os.kill(victim, 9)
        for _ in range(100):
            now = {p.pid for p in pool._pool}
            if victim not in now and len(now) == 2:
                break
            import time
            time.sleep(0.05)
        assert victim not in {p.pid for p in pool._pool}
        out = pool.map(workers.double, [torch.ones(2)] * 4)
        assert all(torch.equal(t, torch.full((2,), 2.0)) for t in out)


def test_pool_spawn_context():
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        out = pool.map(workers.double, [torch.ones(3), torch.arange(3.0)])
    assert torch.equal(out[1], torch.tensor([0.0, 2.0, 4.0]))


def test_pool_survives_killed_workers():
    with mp.Pool(2) as pool:
        for _ in range(2):
            victim = pool._pool[0].pid
            os.kill(victim, 9)
            import time
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                now = [p.pid for p in pool._pool if p.is_alive()]
                if victim not in now and len(now) == 2:
                    break
                time.sleep(0.05)
        assert pool.map(workers.double, range(6)) == [0, 2, 4, 6, 8, 10]


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_tensor_stats(strategy):
    """libmproc's counters (mp_tensor_stats_get) through the extension: a
    shared storage is a segment created here, a tensor that comes back is a
    segment received over the mapping this process has, and releasing
    everything unmaps both."""
    import mproc
    from mproc import _mproc

    def delta(before):
        now = mproc.tensor_stats()
        return {k: now[k] - before[k] for k in now}

    s0 = mproc.tensor_stats()
    assert set(s0) == {"shared_copies", "shared_copy_bytes", "segments_created",
                       "segments_received", "segments_mapped", "segments_unmapped",
                       "segments_live", "segments_received_by_pin"}
    a = _mproc.Storage.empty(4096)
    a.share_memory_()  # shared already: no copy
    d = delta(s0)
    assert d["segments_created"] == 1 and d["shared_copies"] == 0 and d["segments_live"] == 1
    q = mp.Queue()
    t = torch.zeros(256)
    q.put(t)
    u = q.get(timeout=30)
    d = delta(s0)
    assert d["segments_created"] == 2 and d["segments_received"] == 1
    assert d["segments_mapped"] == 0  # our own segment: the mapping is reused
    q.put(t)  # shared already: nothing new is created
    u = q.get(timeout=30)
    d = delta(s0)
    assert d["segments_created"] == 2 and d["segments_received"] == 2
    del a, u, t, q
    gc.collect()
    d = delta(s0)
    assert d["segments_unmapped"] == 2 and d["segments_live"] == 0


def resend(ctx, t, n):
    """Sends t n times to a ctx process (workers.count_arrivals), waiting
    for each answer; returns what the arrivals cost it."""
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=workers.count_arrivals, args=(q, r, n))
    p.start()
    for i in range(n):
        t[0] = i
        q.put(t)
        assert r.get(timeout=30) == i
    cost = r.get(timeout=30)
    p.join(30)
    assert p.exitcode == 0
    return cost


@pytest.mark.parametrize("shared", [True, False])
def test_repeated_handoff_needs_no_fd(shared):
    """The same storage sent again to one receiving process crosses with no
    fd: its end pins it at the second arrival, and the child's fds stay
    flat (mproc's file_descriptor segments, and torch's own, adopted)."""
    t = torch.zeros(1024)
    if shared:
        t.share_memory_()
    cost = resend(mp, t, 12)
    assert cost["pinned"] == 10, "the 3rd to 12th arrivals name the pin"
    assert cost["fds"] == cost["fds3"]


@pytest.mark.parametrize("strategy", ["file_system"], indirect=True)
def test_released_buffer_kept_mapped(strategy):
    """A file_system storage sent again and again to a spawned receiver that
    drops it each time is mapped there twice in all, not once per message:
    its end keeps the mapping from the second arrival (docs/tensor.md,
    "Kept mappings")."""
    cost = resend(mp.get_context("spawn"), torch.zeros(1024).share_memory_(), 12)
    assert (cost["mapped"], cost["kept"]) == (2, 1)


_NUMPY_LATE = """
import sys
import mproc.multiprocessing as mp
assert "numpy" not in sys.modules, "importing mproc imported numpy"
import numpy as np
q = mp.Queue()
a = mp.shared_array(4, np.float32)
q.put(a)
b = q.get(timeout=30)
b[0] = 7
assert a[0] == 7, "an array imported after mproc did not travel as shared memory"
print("ok")
"""


def test_numpy_imported_after_mproc():
    """mproc does not import numpy (a rank that never uses it would pay its
    start-up and exit), yet arrays made after numpy's import still share."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _NUMPY_LATE], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
