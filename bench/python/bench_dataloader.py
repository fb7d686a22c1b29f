#!/usr/bin/python3
"""DataLoader with its default context against mproc.torch.get_context(),
2 workers, spawn, one run; each case runs --repeat times (torch and mproc
alternating, so both see the same load) and the medians are reported. Each
measurement runs in a fresh interpreter, and the torch one never imports
mproc (importing mproc.torch replaces torch's reducers, which would make
the baseline partly mproc's). A rate runs from the first item to the last;
the end of the epoch after it (the workers' shutdown: mostly each worker
interpreter's exit with torch loaded, the same fixed cost in both contexts)
is reported beside it, so that the rate does not depend on the epoch's
length:

    /usr/bin/python3 bench/python/bench_dataloader.py [--repeat N]
    # writes bench/results/python_dataloader.jsonl

  small   samples of 64 tensors of 1 KiB, batch_size=None (samples/s)
  images  batches of 32 x 3x224x224 float32, 18.4 MiB each (batches/s)
  images_torch_shm  the same batches collated into torch's own shared memory
          (a collate_fn on torch's UntypedStorage._new_shared, which mproc does
          not replace): mproc adopts their fd; the third column is mproc with
          adoption off (mproc._sharing.ADOPT_MAX = 0: one copy per batch)
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
         "images": ("images 32x3x224x224 batches (batches/s)", 32),
         "images_torch_shm": ("images collated in torch shm (batches/s)", 32)}


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


def torch_shm_collate(samples):
    """default_collate's stacking, into torch's own shared memory."""
    elem = samples[0]
    us = torch.UntypedStorage._new_shared(len(samples) * elem.numel() * elem.element_size())
    out = elem.new(torch.TypedStorage(wrap_storage=us, dtype=elem.dtype))
    return torch.stack(samples, 0, out=out.resize_(len(samples), *elem.shape))


def no_adoption(_worker_id):
    """worker_init_fn: the worker (the sender) copies torch-shared batches."""
    import mproc._sharing
    mproc._sharing.ADOPT_MAX = 0


def rate(dataset, ctx, batch_size, collate_fn=None, worker_init_fn=None):
    """(items per second from the first item to the last, seconds from the
    last item to the end of the epoch): the end is the workers' shutdown,
    the same fixed cost in both contexts (mostly each worker interpreter's
    exit with torch loaded, about 0.2 s here), so it is kept out of the rate
    and reported beside it."""
    dl = DataLoader(dataset, batch_size=batch_size, num_workers=2,
                    multiprocessing_context=ctx, collate_fn=collate_fn,
                    worker_init_fn=worker_init_fn)
    it = iter(dl)
    next(it)  # workers started
    t0 = time.perf_counter()
    n, t_last = 0, t0
    for _ in it:
        n += 1
        t_last = time.perf_counter()
    if n == 0:
        raise SystemExit("bench_dataloader: the epoch had one item; a rate needs two or more")
    return n / (t_last - t0), time.perf_counter() - t_last


def one(case, module):
    """Prints one rate, measured in this (fresh) interpreter."""
    ds = Small() if case == "small" else Images()
    collate = torch_shm_collate if case == "images_torch_shm" else None
    init = no_adoption if module == "mproc_copy" else None
    if module.startswith("mproc"):
        import mproc.torch as mp
        ctx = mp.get_context("spawn")
    else:
        ctx = "spawn"
    print("%r %r" % rate(ds, ctx, CASES[case][1], collate, init))


def fresh(case, module):
    """(rate, shutdown seconds) of one run in a fresh interpreter."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", case, module],
                         check=True, capture_output=True, text=True).stdout
    r, shutdown = out.split()[-2:]
    return float(r), float(shutdown)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (median reported)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated subset of %s" % ", ".join(CASES))
    ap.add_argument("--one", nargs=2, metavar=("CASE", "MODULE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return one(*args.one)
    rows = []
    for case, (name, _) in CASES.items():
        if case not in args.cases.split(","):
            continue
        tr, mr, cr, ts, ms = [], [], [], [], []
        copy = case == "images_torch_shm"
        for _ in range(max(1, args.repeat)):
            for rates, ends, module in ((tr, ts, "torch"), (mr, ms, "mproc")):
                r, end = fresh(case, module)
                rates.append(r)
                ends.append(end * 1e3)
            if copy:
                cr.append(fresh(case, "mproc_copy")[0])
        torch_rate, mproc_rate = statistics.median(tr), statistics.median(mr)
        ratios = [m / t for m, t in zip(mr, tr)]
        row = {"case": name, "torch": torch_rate, "mproc.torch": mproc_rate,
               "ratio": mproc_rate / torch_rate, "runs": len(tr), "per_run_ratios": ratios,
               "torch shutdown (ms)": statistics.median(ts),
               "mproc.torch shutdown (ms)": statistics.median(ms)}
        extra = ""
        if copy:
            row["mproc.torch without adoption"] = statistics.median(cr)
            extra = "  (without adoption %.1f)" % row["mproc.torch without adoption"]
        rows.append(row)
        print("%-42s torch %9.1f  mproc %9.1f  %6.1fx  (median of %d; per run %s)%s"
              % (name, torch_rate, mproc_rate, mproc_rate / torch_rate, len(tr),
                 " ".join("%.1f" % r for r in ratios), extra))
        print("%-42s shutdown: torch %.0f ms, mproc %.0f ms (medians)"
              % ("", row["torch shutdown (ms)"], row["mproc.torch shutdown (ms)"]))
    out = os.path.join(ROOT, "bench", "results", "python_dataloader.jsonl")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
