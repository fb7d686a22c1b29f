"""mproc for Python: libmproc's shared memory, queues and pipes.

    import mproc.torch as mp            # drop-in for torch.multiprocessing
    import mproc.multiprocessing as mp  # the same without torch (NumPy arrays)

mproc.Storage is an mproc tensor's memory with DLPack and the buffer
protocol; mproc.tensor_stats() gives libmproc's shared-memory counters of
this process (mp_tensor_stats_get); see docs/python.md.
"""
from ._mproc import ClosedError, Storage, tensor_stats, version  # noqa: F401

__version__ = "0.1.0"
