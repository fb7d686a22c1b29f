"""Tensors already in torch's own shared memory travel without a copy: mproc
adopts their storage's fd (mp_tensor_adopt_fd), so the receiver maps the very
file the sender's torch storage uses and every holder of it shares writes."""
import gc
import os

import pytest
import torch
from torch.utils.data import DataLoader

import mproc.torch as mp
import torch_workers
from conftest import own_fds, own_segments
from torch_workers import inode_of, torch_shared
from mproc._sharing import untyped

STRATEGIES = ["file_descriptor", "file_system"]


def _torch_inode(t):
    st = os.fstat(untyped(t)._get_shared_fd())
    return (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_adopted_not_copied(strategy):
    t = torch_shared(1024, 0)
    early = t[512:]  # a view made before sending: it must see the writes too
    q = mp.Queue()
    q.put([t, t[2:4], t.storage()])
    a, b, s = q.get()
    assert inode_of(a) == _torch_inode(t)  # the same file: no copy
    a[3] = 5
    a[600] = 6
    s[7] = 7
    assert t[3] == 5 and b[1] == 5 and early[88] == 6 and t[7] == 7
    # the sender's tensor was left in torch's memory (not rebound)
    assert mp._sharing.lookup(untyped(t).data_ptr()) is None
    assert untyped(t)._get_shared_fd() >= 0
    assert untyped(a).data_ptr() == untyped(b).data_ptr()  # one storage per message


def test_adopt_fd_binding():
    t = torch_shared(256, 3)
    fd = untyped(t)._get_shared_fd()
    st = mp._sharing.Storage.adopt_fd(fd, 1024)
    assert st.nbytes == 1024 and st.is_shared and st.sharing_strategy == "file_descriptor"
    u = torch.from_dlpack(st).view(torch.float32)
    u[0] = 9
    assert t[0] == 9
    with pytest.raises(ValueError, match="fewer than"):
        mp._sharing.Storage.adopt_fd(fd, 4096)
    r, w = os.pipe()
    with pytest.raises(ValueError, match="a pipe"):
        mp._sharing.Storage.adopt_fd(r, 1)
    os.close(r)
    os.close(w)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_receiver_outlives_producer(method):
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=torch_workers.put_torch_shared_and_exit, args=(q, 4096, 2.5))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    t = q.get(timeout=30)  # its producer is gone; the fd in flight kept the memory
    assert t.shape == (4096,) and bool((t == 2.5).all())


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_child_writes_through(method):
    # a Process argument (Python's channel) and a queue message, both adopted
    ctx = mp.get_context(method)
    t = torch_shared(64, 0)
    p = ctx.Process(target=torch_workers.write_into, args=(t[:32], 4))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert bool((t[:32] == 4).all()) and bool((t[32:] == 0).all())


def test_torch_file_system_storage_is_copied():
    # torch's file_system segments are named files anyone may truncate:
    # mproc copies them into its own memory (the message's arena)
    old = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        t = torch_shared(16, 1)
        q = mp.Queue()
        q.put(t)
        a = q.get()
        assert bool((a == 1).all())
        a[0] = 3
        assert t[0] == 3  # the sender's tensor was rebound to the copy
    finally:
        torch.multiprocessing.set_sharing_strategy(old)


def test_many_storages_in_one_message():
    # beyond ADOPT_MAX adopted storages (fds of one record) the rest ride
    # in the arena, so the message still goes
    ts = [torch_shared(4, i) for i in range(mp._sharing.ADOPT_MAX + 40)]
    q = mp.Queue()
    q.put(ts)
    got = q.get()
    assert [int(g[0]) for g in got] == list(range(len(ts)))
    got[0][1] = 42
    assert ts[0][1] == 42


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_no_fd_leak(strategy):
    t = torch_shared(1 << 16, 1)
    q = mp.Queue()
    for _ in range(3):
        q.put(t)
        q.get()
    gc.collect()
    fds = own_fds()
    for _ in range(200):
        q.put([t, t[1:]])
        a, b = q.get()
        del a, b
    gc.collect()
    assert own_fds() <= fds
    assert own_segments() == []


def test_dataloader_batches_in_torch_memory_not_copied():
    # a collate_fn that leaves its batch in torch's own shared memory: the
    # main process gets a tensor over that very file
    dl = DataLoader(torch_workers.Big(), batch_size=2, num_workers=2,
                    collate_fn=torch_workers.collate_torch_shared,
                    multiprocessing_context=mp.get_context("spawn"))
    n = 0
    for batch, where in dl:
        assert batch.shape == (2, 1 << 19)
        assert inode_of(batch) == where
        n += 1
    assert n == 2


def test_pool_map_adopts():
    t = torch_shared(8, 0)
    with mp.get_context("fork").Pool(2) as pool:
        pool.starmap(torch_workers.write_into, [(t[:4], 1), (t[4:], 2)])
    assert t.tolist() == [1.0] * 4 + [2.0] * 4
