"""mp.spawn / start_processes with torch's error semantics."""
import time

import pytest

import mproc.torch as mp
import workers
from conftest import children


def test_spawn_ok():
    q = mp.SimpleQueue()
    mp.spawn(workers.rank_ok, args=(q,), nprocs=2, start_method="fork")
    assert sorted([q.get(), q.get()]) == [0, 1]


def test_spawn_raised_carries_traceback():
    t0 = time.monotonic()
    with pytest.raises(mp.ProcessRaisedException) as e:
        mp.spawn(workers.rank_raises, args=(1,), nprocs=2, start_method="fork")
    assert "rank 1 failed on purpose" in str(e.value)
    assert "Traceback" in str(e.value) and e.value.error_index == 1
    assert time.monotonic() - t0 < 20  # the sleeping sibling was stopped
    pid = getattr(e.value, "error_pid", None) or e.value.pid  # torch 2 spelling, or 1.x's
    assert pid not in children()


def test_spawn_exit_code():
    with pytest.raises(mp.ProcessExitedException) as e:
        mp.spawn(workers.rank_exits, args=(3,), nprocs=2, start_method="fork")
    assert e.value.exit_code == 3 and e.value.error_index == 0
    assert "exit code 3" in str(e.value)


def test_spawn_signal_name():
    with pytest.raises(mp.ProcessExitedException) as e:
        mp.spawn(workers.rank_signal, nprocs=2, start_method="fork")
    assert e.value.signal_name == "SIGKILL" and e.value.exit_code == -9


def test_join_timeout_and_context():
    ctx = mp.spawn(workers.rank_sleep, nprocs=2, join=False, start_method="fork")
    assert len(ctx.pids()) == 2
    assert ctx.join(timeout=0.01) is False
    while not ctx.join(timeout=5):
        pass
    assert ctx.join() is True


def test_spawn_start_method_spawn():
    with pytest.raises(mp.ProcessRaisedException, match="rank 0 failed"):
        mp.spawn(workers.rank_raises, args=(0,), nprocs=2)


def test_exceptions_are_torchs():
    import torch.multiprocessing as tmp
    assert mp.ProcessRaisedException is tmp.ProcessRaisedException
    assert mp.ProcessExitedException is tmp.ProcessExitedException


def test_sigchld_ignored_refused():
    """With SIGCHLD ignored the kernel reaps each child at once and its exit
    code is lost: Python's own Process then reports exitcode None and
    is_alive() True for ever, and spawn failed with a TypeError. Every start
    (Process, spawn, Pool) refuses at once, saying how to fix it."""
    import signal
    before = set(children())  # a forkserver or resource tracker of earlier tests
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        for start in (lambda: mp.get_context("fork").Process(target=abs, args=(1,)).start(),
                      lambda: mp.spawn(workers.rank_exits, args=(0,), nprocs=1, start_method="fork"),
                      lambda: mp.Pool(1)):
            with pytest.raises(RuntimeError, match=r"SIGCHLD is ignored.*SIG_DFL"):
                start()
        assert set(children()) <= before
    finally:
        signal.signal(signal.SIGCHLD, old)
    p = mp.get_context("fork").Process(target=abs, args=(1,))
    p.start()
    p.join(30)
    assert p.exitcode == 0
