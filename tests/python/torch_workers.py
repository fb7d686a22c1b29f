"""DataLoader pieces for spawned workers that import torch but not mproc
(as a user's dataset module does): the child gets mproc.torch only from
mproc's Process."""
import sys

import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_collate


class Big(Dataset):
    """2 MiB samples: a batch of them is over mproc.torch.OWN_SEGMENT_MIN."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((1 << 19,), float(i))


def collate_where(samples):
    """(batch, mproc.torch installed here, batch collated into mproc memory)"""
    batch = default_collate(samples)
    sharing = sys.modules.get("mproc._sharing")
    in_mproc = sharing is not None and sharing.tensor_storage(batch) is not None
    return batch, "mproc.torch" in sys.modules, in_mproc


def torch_shared(n, value):
    """A tensor in torch's own file_descriptor shared memory (torch's
    share_memory_, whether or not mproc.torch replaced the method)."""
    import torch.multiprocessing  # noqa: F401
    t = torch.full((n,), float(value))
    sharing = sys.modules.get("mproc.torch")
    (sharing._torch_share_memory_ if sharing else torch.Tensor.share_memory_)(t)
    return t


def inode_of(t):
    """(st_dev, st_ino) of the file whose mapping holds t's first byte."""
    ptr = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi:
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                return (major, minor), int(parts[4])
    return None


def put_torch_shared_and_exit(q, n, value):
    """Producer that exits right after its put: the consumer gets it later."""
    q.put(torch_shared(n, value))


def write_into(t, value):
    t.fill_(float(value))


def collate_torch_shared(samples):
    """(batch in torch's shared memory, inode of its file): a collate_fn that
    puts its batch where torch's own does, whatever mproc installed."""
    import os
    batch = default_collate(samples)
    sharing = sys.modules.get("mproc.torch")
    (sharing._torch_share_memory_ if sharing else torch.Tensor.share_memory_)(batch)
    us = batch.untyped_storage() if hasattr(batch, "untyped_storage") else batch._storage()
    st = os.fstat(us._get_shared_fd())  # torch 2 spelling, or 1.x's
    return batch, ((os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)
