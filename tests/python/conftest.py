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


def _stacks(pid):
    """Where a stuck child is: its state, kernel stack and, when gdb is
    installed, every thread's C stack (the line a failing CI run needs)."""
    import shutil
    import subprocess
    out = []
    for f in ("wchan", "stack"):
        try:
            with open(f"/proc/{pid}/{f}") as fh:
                out.append(f"{f}: {fh.read().strip()}")
        except OSError:
            pass
    if shutil.which("gdb"):
        try:
            r = subprocess.run(["gdb", "-batch", "-nx", "-p", str(pid), "-ex",
                                "thread apply all bt 30"], capture_output=True, text=True,
                               timeout=60)
            out.append(r.stdout[-6000:])
        except (OSError, subprocess.SubprocessError) as e:
            out.append(f"gdb: {e}")
    return "\n".join(out)


@pytest.fixture(autouse=True)
def no_children_left(request):
    """Every test ends its own children. One a failing test left (a child
    blocked on a message that never came, say) is killed here: Python's
    exit joins every non-daemonic child, so it would hang the whole run.
    Its stacks are printed first, to tell where it was stuck."""
    import multiprocessing
    import sys
    yield
    left = multiprocessing.active_children()
    for p in left:
        print(f"child {p.pid} left running by {request.node.nodeid}:\n{_stacks(p.pid)}",
              file=sys.stderr)
        p.kill()
        p.join(10)
    if left:
        pytest.fail(f"the test left {len(left)} child process(es) running: {left}")
