"""SIGINT to a process blocked in an mproc call raises KeyboardInterrupt
there within a fraction of a second, as in Python's own queues and pipes,
and mp.spawn stops its ranks before letting it through (else the
interpreter's exit would wait for them)."""
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = ["queue.get", "queue.put", "simple_queue.get", "joinable_queue.join",
         "pipe.recv", "pipe.poll", "spawn"]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("what", CALLS)
def test_sigint_interrupts_blocked_call(what):
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "interrupted.py"), what],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kids = []
    try:
        for line in p.stdout:
            if line.startswith("child "):
                kids.append(int(line.split()[1]))
            if line.strip() == "blocking" or len(kids) == 2:
                break
        time.sleep(0.3)  # into the blocking call
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        p.kill()
        p.wait()
    assert "KeyboardInterrupt" in out, err
    assert p.returncode == 130 and took < 5, (p.returncode, took, err)
    assert not [k for k in kids if alive(k)]
