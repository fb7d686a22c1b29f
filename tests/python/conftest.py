"""Shared helpers for mproc's Python tests. The package is found through
PYTHONPATH (scripts/pytest puts python/ there; `make python` builds it)."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

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


KILLED_HOLDER = """
import os
import torch
import mproc.torch as mp
mp.set_sharing_strategy("file_system")
t = torch.ones(1 << 16)
t.share_memory_()
print(mp.__file__, flush=True)
print(" ".join(n for n in os.listdir("/dev/shm") if n.startswith(f"mproc-{os.getpid()}-")),
      flush=True)
os.kill(os.getpid(), 9)
"""


def killed_holder_leaves(tmp_path, pythonpath=None, package=None, runas=()):
    """Runs a program that makes a file_system segment and kills itself;
    returns the segment names still in /dev/shm 20 s later (none when the
    shm manager reclaimed them). It runs with a runtime directory of its
    own, so no daemon serves it yet and the one it starts is the one
    libmproc finds beside the extension (MPROC_SHM_MANAGER, which would
    name another, is unset). pythonpath replaces PYTHONPATH (default: where
    this run's mproc is); package is the folder mproc must come from; runas
    prefixes the command (unprivileged_prefix())."""
    rt = own_dir(tmp_path / "rt", runas)
    env = {k: v for k, v in os.environ.items() if k != "MPROC_SHM_MANAGER"}
    env.update(MPROC_RUNTIME_DIR=rt, MPROC_SHM_MANAGER_GRACE="0.5",
               PYTHONPATH=pythonpath or package_root())
    if runas:
        env["HOME"] = rt  # torch may write under HOME; nobody's does not exist
    try:
        r = subprocess.run([*runas, sys.executable, "-c", KILLED_HOLDER], env=env,
                           capture_output=True, text=True, timeout=60, cwd="/")
        assert r.returncode == -9, r.stderr
        assert "not protected against leaks" not in r.stderr, r.stderr
        where, names = r.stdout.split("\n")[0], r.stdout.split("\n")[1].split()
        assert package is None or where.startswith(str(package)), where
        assert names, "the program made no file_system segment"
        deadline = time.monotonic() + 20
        while any(os.path.exists(f"/dev/shm/{n}") for n in names) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [n for n in names if os.path.exists(f"/dev/shm/{n}")]
    finally:
        wait_daemon_gone(rt)
        if runas:
            shutil.rmtree(rt, ignore_errors=True)


def wait_daemon_gone(rt, seconds=10):
    """Waits for the shm manager serving runtime directory rt to exit (with
    no client left it does after its grace)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(rt, "shm-manager.lock")) as f:
                pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return
        if not os.path.exists(f"/proc/{pid}"):
            return
        time.sleep(0.05)


def package_root():
    """The folder this run imports mproc from (PYTHONPATH may be relative)."""
    import mproc
    return os.path.dirname(os.path.dirname(os.path.abspath(mproc.__file__)))


NOBODY = 65534


def unprivileged_prefix():
    """The command prefix that runs a program as nobody, as users run mproc
    (tests/support/unprivileged.sh's rule); skips the test when this run is
    not root, has no setpriv, or nobody cannot read the package."""
    if os.geteuid() != 0:
        pytest.skip("not root: this run is already unprivileged")
    if not shutil.which("setpriv"):
        pytest.skip("no setpriv (util-linux) to drop to nobody with")
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    init = os.path.join(package_root(), "mproc", "__init__.py")
    if subprocess.run([*prefix, "test", "-r", init]).returncode != 0:
        pytest.skip(f"nobody cannot read {init} (a folder above it is private)")
    return prefix


def own_dir(path, runas=()):
    """path made, mode 0700, owned by whoever runas runs as. A tmp_path is
    private to root, so a folder for nobody goes under /tmp instead."""
    if not runas:
        path.mkdir(mode=0o700)
        return str(path)
    d = tempfile.mkdtemp(prefix=f"mproc-{path.name}-")
    os.chown(d, NOBODY, NOBODY)
    return d


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
    yield
    left = multiprocessing.active_children()
    for p in left:
        print(f"child {p.pid} left running by {request.node.nodeid}:\n{_stacks(p.pid)}",
              file=sys.stderr)
        p.kill()
        p.join(10)
    if left:
        pytest.fail(f"the test left {len(left)} child process(es) running: {left}")
