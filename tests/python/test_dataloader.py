"""torch's DataLoader with multiprocessing_context=mproc.torch.get_context(...)
(issue 17, first part: the loader runs on mproc's queues)."""
import contextlib
import gc
import os
import resource
import signal
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import mproc.torch as mp
import torch_workers
import workers  # noqa: F401  (spawned workers import the datasets from here)
from conftest import children, own_fds, own_segments
from mproc._sharing import untyped

STRATEGIES = ["file_descriptor", "file_system"]


class Small(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return {"x": [torch.full((256,), float(i)) for _ in range(4)], "i": i}


class Stream(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, 16, info.num_workers):
            yield torch.tensor([i])


class Dies(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.zeros(2)


def test_context_is_a_basecontext():
    import multiprocessing.context
    assert isinstance(mp.get_context("spawn"), multiprocessing.context.BaseContext)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_map_style_batch_none(method):
    dl = DataLoader(Small(), batch_size=None, num_workers=2,
                    multiprocessing_context=mp.get_context(method))
    seen = sorted(s["i"] for s in dl)
    assert seen == list(range(32))


def test_batches_pin_memory_persistent_workers():
    dl = DataLoader(Small(), batch_size=4, num_workers=2, pin_memory=True,
                    persistent_workers=True, prefetch_factor=4,
                    multiprocessing_context=mp.get_context("fork"))
    for _ in range(2):
        batches = list(dl)
        assert len(batches) == 8 and batches[0]["x"][0].shape == (4, 256)
    del dl


def test_iterable_dataset():
    dl = DataLoader(Stream(), batch_size=None, num_workers=2,
                    multiprocessing_context=mp.get_context("fork"))
    assert sorted(int(t) for t in dl) == list(range(16))


def test_no_fd_growth_over_epochs():
    dl = DataLoader(Small(), batch_size=8, num_workers=2,
                    multiprocessing_context=mp.get_context("fork"))
    list(dl)
    fds = own_fds()
    for _ in range(10):
        list(dl)
    assert own_fds() <= fds + 2


def test_worker_death_raises():
    dl = DataLoader(Dies(), batch_size=None, num_workers=2, timeout=20,
                    multiprocessing_context=mp.get_context("fork"))
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        list(dl)


class Many(Dataset):
    """Samples of 256 small tensors (issue 17's fd-exhaustion case)."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        return [torch.full((16,), float(i)) for _ in range(256)]


@contextlib.contextmanager
def nofile(limit):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("batch_size", [None, 4])
@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_256_tensors_under_nofile_1024(strategy, batch_size):
    # torch's own context dies here with EMFILE: one fd per tensor in flight
    dl = DataLoader(Many(), batch_size=batch_size, num_workers=2, prefetch_factor=8,
                    multiprocessing_context=mp.get_context("fork"))
    with nofile(1024):
        got = [s for s in dl]
    n = 0
    for s in got:
        x = s[0] if batch_size is None else s[0][:, 0]
        n += 1 if batch_size is None else len(x)
        assert len(s) == 256 and torch.equal(s[255], s[0])
    assert n == 48
    del got, dl
    gc.collect()
    assert own_segments() == []


def test_256_tensors_under_nofile_spawn():
    dl = DataLoader(Many(), batch_size=None, num_workers=2, prefetch_factor=8,
                    multiprocessing_context=mp.get_context("spawn"))
    with nofile(1024):
        assert sorted(int(s[7][0]) for s in dl) == list(range(48))


def test_sample_is_one_segment():
    # every private tensor of one message shares one segment (one fd)
    q = mp.Queue()
    q.put([torch.full((4,), float(i)) for i in range(64)])
    got = q.get()
    assert len({untyped(t).data_ptr() for t in got}) == 1
    assert [int(t[0]) for t in got] == list(range(64))


class Nested(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return [[torch.tensor([i]), (torch.full((2, 2), i), [torch.tensor([-i])])], i]


def test_nested_list_samples():
    for bs in (None, 3):
        dl = DataLoader(Nested(), batch_size=bs, num_workers=2,
                        multiprocessing_context=mp.get_context("fork"))
        got = list(dl)
        if bs is None:
            assert [int(s[0][0]) for s in got] == list(range(12))
            assert all(torch.equal(s[0][1][0], torch.full((2, 2), s[1])) for s in got)
            assert [int(s[0][1][1][0]) for s in got] == [-i for i in range(12)]
        else:
            assert torch.equal(torch.cat([b[0][0] for b in got]).flatten(), torch.arange(12))
            assert torch.equal(torch.cat([b[0][1][1][0] for b in got]).flatten(),
                               -torch.arange(12))


class Tiny(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return [torch.full((3,), float(i)), torch.tensor([i])]


@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_no_leaks_after_100_epochs(strategy):
    fds = own_fds()
    dl = DataLoader(Tiny(), batch_size=2, num_workers=2, persistent_workers=True,
                    multiprocessing_context=mp.get_context("fork"))
    list(dl)
    pids = [w.pid for w in dl._iterator._workers]
    for _ in range(100):
        assert sum(int(b[1].sum()) for b in dl) == 6
    del dl
    gc.collect()
    assert all(_reaped(p) for p in pids)
    assert own_fds() <= fds + 2
    assert own_segments(pids) == []


def _wait_reclaimed(pids, fds):
    """Waits (30 s at most, for a loaded machine) until the segments of this
    process and of pids are gone and no fd above fds is open, then asserts
    it. file_system segments of a killed worker go when the manager daemon
    sees no process uses them."""
    end = time.monotonic() + 30
    while (own_segments(pids) or own_fds() > fds) and time.monotonic() < end:
        gc.collect()
        time.sleep(0.1)
    assert own_segments(pids) == []
    assert own_fds() <= fds


def _reaped(pid, timeout=30):
    # DataLoader's shutdown joins its workers; give a loaded machine time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pid not in children():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_worker_death_leaves_no_segments(strategy, method):
    # a worker SIGKILLed mid-epoch: DataLoader's own error within its
    # timeout, then nothing left (segments, fds, children). A first loader
    # opens what stays open for the process's life (spawn's resource
    # tracker, the shm manager's connection) before fds are counted.
    list(DataLoader(Tiny(), batch_size=2, num_workers=1,
                    multiprocessing_context=mp.get_context(method)))
    gc.collect()
    fds = own_fds()
    dl = DataLoader(Dies(), batch_size=None, num_workers=2, timeout=20,
                    multiprocessing_context=mp.get_context(method))
    it = iter(dl)
    pids = [w.pid for w in it._workers]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        list(it)
    assert time.monotonic() - start < 20
    del it, dl
    gc.collect()
    assert all(_reaped(p) for p in pids)
    # the killed worker's segments are reclaimed (file_system: by the
    # manager daemon once no process uses them); give it time under load
    _wait_reclaimed(pids, fds)


def test_spawned_worker_collates_into_mproc_memory():
    # A spawned worker's pickle names torch's modules and these (which do
    # not import mproc.torch); mproc's Process installs mproc.torch there,
    # so a batch is collated into mproc memory (it crosses without a copy)
    # instead of torch's own shared memory.
    dl = DataLoader(torch_workers.Big(), batch_size=2, num_workers=1,
                    collate_fn=torch_workers.collate_where,
                    multiprocessing_context=mp.get_context("spawn"))
    for batch, installed, in_mproc in dl:
        assert batch.shape == (2, 1 << 19)
        assert installed and in_mproc


def test_tensor_in_torchs_shared_memory_travels():
    # put into torch's own shared memory before mproc was in charge: its fd
    # is adopted (no copy) and both sides see one memory, the sender's
    # tensor left as it was (test_adopt.py has the rest)
    t = torch.zeros(8)
    mp._torch_share_memory_(t)
    q = mp.Queue()
    q.put([t, t[2:4]])
    a, b = q.get()
    assert not mp._sharing.is_shared(t) and t.is_shared()
    a[3] = 5
    assert t[3] == 5 and b[1] == 5


class Mixed(Dataset):
    """Samples with a large tensor (batches of them get their own segment)
    and small ones (they ride in the message's arena)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((1 << 17,), float(i)), [torch.tensor([i]) for _ in range(8)]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("strategy", STRATEGIES, indirect=True)
def test_break_mid_epoch_leaves_nothing(strategy, persistent):
    # dropping the iterator with batches still queued (prefetched, in
    # flight): no segment stays in /dev/shm and no fd leaks
    list(DataLoader(Tiny(), batch_size=2, num_workers=1,
                    multiprocessing_context=mp.get_context("fork")))
    gc.collect()
    fds = own_fds()
    dl = DataLoader(Mixed(), batch_size=4, num_workers=2, prefetch_factor=4,
                    persistent_workers=persistent,
                    multiprocessing_context=mp.get_context("fork"))
    pids = []
    for _ in range(2):  # twice: a persistent loader's iterator is reused
        it = iter(dl)
        pids += [w.pid for w in it._workers]
        batch = next(it)
        assert batch[0].shape == (4, 1 << 17)
        time.sleep(0.5)  # let the workers fill the queue
        del it, batch
    del dl
    gc.collect()
    assert all(_reaped(p) for p in set(pids))
    _wait_reclaimed(pids, fds)
