#!/usr/bin/python3
"""DataLoader with its default context against mproc.torch.get_context(),
2 workers, spawn, one run; each case runs --repeat times (torch and mproc
alternating, so both see the same load) and the medians are reported. Each
measurement runs in a fresh interpreter, and the torch one never imports
mproc (importing mproc.torch replaces torch's reducers, which would make
the baseline partly mproc's):

    /usr/bin/python3 bench/python/bench_dataloader.py [--repeat N]
    # writes bench/results/python_dataloader.jsonl

  small   samples of 64 tensors of 1 KiB, batch_size=None (samples/s)
  images  batches of 32 x 3x224x224 float32, 18.4 MiB each (batches/s)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

CASES = {"small": ("small 64x1KiB samples (samples/s)", None),
         "images": ("images 32x3x224x224 batches (batches/s)", 32)}


class Small(Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        return [torch.full((256,), float(i)) for _ in range(64)]


class Images(Dataset):
    def __len__(self):
        return 32 * 40

    def __getitem__(self, i):
        return torch.empty(3, 224, 224).fill_(float(i % 7))


def rate(dataset, ctx, batch_size):
    dl = DataLoader(dataset, batch_size=batch_size, num_workers=2,
                    multiprocessing_context=ctx)
    it = iter(dl)
    next(it)  # workers started
    t0 = time.perf_counter()
    n = sum(1 for _ in it)
    return n / (time.perf_counter() - t0)


def one(case, module):
    """Prints one rate, measured in this (fresh) interpreter."""
    ds = Small() if case == "small" else Images()
    if module == "mproc":
        import mproc.torch as mp
        ctx = mp.get_context("spawn")
    else:
        ctx = "spawn"
    print(rate(ds, ctx, CASES[case][1]))


def fresh(case, module):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", case, module],
                         check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (median reported)")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "MODULE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(*args.one)
    rows = []
    for case, (name, _) in CASES.items():
        tr, mr = [], []
        for _ in range(max(1, args.repeat)):
            tr.append(fresh(case, "torch"))
            mr.append(fresh(case, "mproc"))
        torch_rate, mproc_rate = statistics.median(tr), statistics.median(mr)
        ratios = [m / t for m, t in zip(mr, tr)]
        rows.append({"case": name, "torch": torch_rate, "mproc.torch": mproc_rate,
                     "ratio": mproc_rate / torch_rate, "runs": len(tr),
                     "per_run_ratios": ratios})
        print("%-42s torch %9.1f  mproc %9.1f  %6.1fx  (median of %d; per run %s)"
              % (name, torch_rate, mproc_rate, mproc_rate / torch_rate, len(tr),
                 " ".join("%.1f" % r for r in ratios)))
    out = os.path.join(ROOT, "bench", "results", "python_dataloader.jsonl")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
