"""The package as a user who is not root uses it: run by root, the programs
here run as nobody (uid 65534), with a runtime directory of nobody's."""
import os
import shutil
import subprocess
import sys

from conftest import (killed_holder_leaves, own_dir, package_root, unprivileged_prefix,
                      wait_daemon_gone)

ROUNDTRIP = """
import torch
import mproc.torch as mp

def echo(q, r):
    r.put(q.get() + 1)

if __name__ == "__main__":
    for strategy in ("file_descriptor", "file_system"):
        mp.set_sharing_strategy(strategy)
        for method in ("fork", "spawn"):
            ctx = mp.get_context(method)
            q, r = ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=echo, args=(q, r))
            p.start()
            q.put(torch.ones(1 << 16))
            assert float(r.get(timeout=30).sum()) == 2 * (1 << 16)
            p.join(30)
            assert p.exitcode == 0, p.exitcode
            print(strategy, method, "ok", flush=True)
"""


def test_queue_roundtrip_as_nobody(tmp_path):
    prefix = unprivileged_prefix()
    home = own_dir(tmp_path / "home", prefix)
    script = os.path.join(home, "roundtrip.py")
    try:
        with open(script, "w") as f:  # spawn children import the main module by path
            f.write(ROUNDTRIP)
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "MPROC_RUNTIME_DIR": home,
               "PYTHONPATH": package_root()}
        r = subprocess.run([*prefix, sys.executable, script], env=env, capture_output=True,
                           text=True, timeout=120, cwd="/")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.count(" ok") == 4, r.stdout
        assert "not protected against leaks" not in r.stderr, r.stderr
    finally:
        wait_daemon_gone(home)
        shutil.rmtree(home, ignore_errors=True)


def test_killed_holder_reclaimed_as_nobody(tmp_path):
    assert killed_holder_leaves(tmp_path, runas=unprivileged_prefix()) == []
