"""mproc for Python: libmproc's shared memory, queues and pipes.

    import mproc.torch as mp            # drop-in for torch.multiprocessing
    import mproc.multiprocessing as mp  # the same without torch (NumPy arrays)

mproc.Storage is an mproc tensor's memory with DLPack and the buffer
protocol; see docs/python.md.
"""
from ._mproc import ClosedError, Storage, version  # noqa: F401

__version__ = "0.1.0"
