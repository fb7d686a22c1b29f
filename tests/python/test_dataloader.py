"""torch's DataLoader with multiprocessing_context=mproc.torch.get_context(...)
(issue 17, first part: the loader runs on mproc's queues)."""
import os
import signal

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import mproc.torch as mp
import workers  # noqa: F401  (spawned workers import the datasets from here)
from conftest import own_fds


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
