#!/usr/bin/python3
"""Handing over a tensor that already lives in torch's own shared memory (as
DataLoader batches collated by torch do): a put and a get on one queue in one
process, median of --reps, for

  torch   torch.multiprocessing.Queue (fd handshake with the resource sharer)
  adopt   mproc.torch.Queue: the storage's fd is adopted and travels in-band
  copy    mproc.torch.Queue with adoption off (mproc._sharing.ADOPT_MAX = 0):
          one copy into the message's arena, as before adoption existed

Each runs in a fresh interpreter (importing mproc.torch replaces torch's
reducers), the three alternating in each of --rounds rounds so all see the
same load; the median over rounds is reported. A fresh torch-shared tensor
per put, written once, so every put maps new memory as a loader's batches do.

    /usr/bin/python3 bench/python/bench_adopt.py [--reps N] [--mib M]
    # writes bench/results/python_adopt.jsonl
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))


def one(mode, reps, nbytes):
    import torch
    if mode == "torch":
        import torch.multiprocessing as mp
        share = torch.Tensor.share_memory_
    else:
        import mproc.torch as mp
        share = mp._torch_share_memory_
        if mode == "copy":
            mp._sharing.ADOPT_MAX = 0
    q = mp.Queue()
    times = []
    for _ in range(reps + 2):
        t = torch.empty(nbytes // 4)
        share(t)  # torch's own shared memory (file_descriptor strategy)
        t.fill_(1.0)
        t0 = time.perf_counter()
        q.put(t)
        r = q.get()
        times.append(time.perf_counter() - t0)
        del t, r
    print(statistics.median(times[2:]) * 1e6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=float, default=18.375, help="tensor size (an image batch)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    nbytes = int(a.mib * (1 << 20)) // 4 * 4
    if a.one:
        return one(a.one, a.reps, nbytes)
    runs = {"torch": [], "adopt": [], "copy": []}
    for _ in range(max(1, a.rounds)):
        for mode in runs:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", mode,
                                  "--reps", str(a.reps), "--mib", str(a.mib)],
                                 check=True, capture_output=True, text=True).stdout
            runs[mode].append(float(out.split()[-1]))
    us = {m: statistics.median(v) for m, v in runs.items()}
    print("%.1f MiB torch-shared tensor, put + get, median of %d rounds of %d (us): torch %.0f  "
          "mproc adopt %.0f  mproc copy %.0f  (adopt: %.1fx faster than torch, %.1fx than copy)"
          % (nbytes / (1 << 20), len(runs["torch"]), a.reps, us["torch"], us["adopt"], us["copy"],
             us["torch"] / us["adopt"], us["copy"] / us["adopt"]))
    out = os.path.join(os.path.dirname(os.path.dirname(HERE)), "bench", "results",
                       "python_adopt.jsonl")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        row = {"case": "torch-shared tensor put + get (us)", "bytes": nbytes, "reps": a.reps,
               "rounds": runs, "torch": us["torch"], "mproc adopt": us["adopt"],
               "mproc copy": us["copy"], "ratio torch/adopt": us["torch"] / us["adopt"],
               "ratio copy/adopt": us["copy"] / us["adopt"]}
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
