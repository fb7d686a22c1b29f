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
