#!/usr/bin/python3
"""PyTorch's "send the buffers back" pattern under the file_system strategy:
a spawned worker gets a shared buffer, adds 1 to it (touching every page) and
sends it back; the main process does the same and sends it on. Four buffers
circulate, and each side drops its tensor after sending it, so a receiver
holds nothing over a buffer when it arrives again. Microseconds per message
the main process handles (after 8 of warm-up), median of --repeat runs.

    /usr/bin/python3 bench/python/bench_buffer_reuse.py [--bytes B] [--repeat N]
    MPROC_PINS=0 /usr/bin/python3 bench/python/bench_buffer_reuse.py   # no keeping

With mproc, a queue's receiving end keeps the mapping of a buffer that
arrived before (docs/tensor.md, "Kept mappings"); MPROC_PINS=0 turns that off,
as every build before it behaved. torch.multiprocessing's own file_system
queue fails this script (FileNotFoundError in the worker), so it has no
column here.
"""
import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))  # the build tree's package, in spawned workers too
import mproc.torch as mp  # noqa: E402

BUFFERS = 4
WARMUP = 8


def worker(q, r, n):
    for _ in range(n):
        t = q.get()
        t.add_(1)
        r.put(t)
        del t


def one_run(nbytes, n):
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=worker, args=(q, r, n))
    p.start()
    bufs = [torch.zeros(nbytes // 4).share_memory_() for _ in range(BUFFERS)]
    for b in bufs:
        q.put(b)
    del bufs
    start = None
    for i in range(n - BUFFERS):
        if i == WARMUP:
            start = time.perf_counter()
        t = r.get(timeout=60)
        t.add_(1)
        q.put(t)
        del t
    elapsed = time.perf_counter() - start
    for _ in range(BUFFERS):
        r.get(timeout=60)
    p.join(60)
    if p.exitcode != 0:
        raise SystemExit(f"worker failed: exit code {p.exitcode}")
    return elapsed / (n - BUFFERS - WARMUP) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=1 << 20, help="bytes per buffer (1 MiB)")
    ap.add_argument("--messages", type=int, default=400, help="round trips per run (400)")
    ap.add_argument("--repeat", type=int, default=3, help="runs; the median is printed (3)")
    a = ap.parse_args()
    if a.bytes < 4 or a.messages <= BUFFERS + WARMUP or a.repeat < 1:
        ap.error("--bytes must be >= 4, --messages > 12, --repeat >= 1")
    mp.set_sharing_strategy("file_system")
    runs = [one_run(a.bytes, a.messages) for _ in range(a.repeat)]
    print(f"{a.bytes} bytes: {statistics.median(runs):.1f} us per message (median of "
          f"{a.repeat}: {', '.join(f'{x:.1f}' for x in runs)})")


if __name__ == "__main__":
    main()
