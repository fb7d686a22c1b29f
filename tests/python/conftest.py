"""Shared helpers for mproc's Python tests. The package is found through
PYTHONPATH (scripts/pytest puts python/ there; `make python` builds it)."""
import os

import pytest


def own_fds():
    return len(os.listdir("/proc/self/fd"))


def own_segments(pids=()):
    """/dev/shm segments mproc made for this process (and the given pids):
    other helpers' test runs share /dev/shm, so only names we own count."""
    prefixes = tuple(f"mproc-{p}-" for p in (os.getpid(), *pids))
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefixes))


def children():
    """Live children of this process (zombies included)."""
    me = os.getpid()
    out = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return [p for p in out if p != me]


@pytest.fixture
def strategy(request):
    import mproc.multiprocessing as mp
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy(request.param)
    yield request.param
    mp.set_sharing_strategy(old)
