#!/usr/bin/python3
"""torch.multiprocessing against mproc.torch, one script, one run.

    /usr/bin/python3 bench/python/bench_mp.py            # both, ratios, bench/results/python.jsonl
    /usr/bin/python3 bench/python/bench_mp.py --module mproc.torch --quick
    /usr/bin/python3 bench/python/bench_mp.py --case 'handoff file_system' --repeat 5

Each module runs in a fresh interpreter (the modules patch torch). Cases:
  handoff   one-way latency of an already-shared float32 tensor, ping-pong
            over two queues (per strategy, 4 KiB / 1 MiB / 64 MiB)
  fresh     a new private tensor per put, producer child -> parent (MB/s)
  objects   200,000 small objects through Queue and SimpleQueue (objects/s)
  spawn     mp.spawn of 2 ranks, one raising: call-to-exception time and the
            failure detection latency (rank's raise -> parent's exception)
"""
import argparse
import importlib
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODULES = ["torch.multiprocessing", "mproc.torch"]
mp = None


def _echo(q_in, q_out, n):
    # stays alive until told: torch's file_descriptor handles die with their
    # sender (pytorch issue 65418), which would fail the last rounds
    while True:
        t = q_in.get()
        if t is None:
            return
        q_out.put(t)


def bench_handoff(strategy, nbytes, n):
    import torch
    mp.set_sharing_strategy(strategy)
    t = torch.zeros(nbytes // 4).share_memory_()
    a, b = mp.Queue(), mp.Queue()
    p = mp.get_context("fork").Process(target=_echo, args=(a, b, n + 5))
    p.start()
    for _ in range(5):
        a.put(t)
        b.get()
    # the median of 10 chunks: a shared machine's load spikes hit a few
    # chunks, not the figure
    chunk, times = max(1, n // 10), []
    for _ in range(10):
        t0 = time.perf_counter()
        for _ in range(chunk):
            a.put(t)
            b.get()
        times.append((time.perf_counter() - t0) / (2 * chunk) * 1e6)
    a.put(None)
    p.join()
    return statistics.median(times)  # microseconds one way


def _produce_fresh(q, numel, n, done):
    import torch
    for _ in range(n):
        q.put(torch.empty(numel).fill_(1.0))
    done.get()  # torch: the handles live as long as their sender


def bench_fresh(nbytes, n):
    mp.set_sharing_strategy("file_descriptor")
    q, done = mp.Queue(), mp.Queue()
    p = mp.get_context("fork").Process(target=_produce_fresh, args=(q, nbytes // 4, n, done))
    t0 = time.perf_counter()
    p.start()
    for _ in range(n):
        t = q.get()
        del t
    dt = time.perf_counter() - t0
    done.put(None)
    p.join()
    return nbytes * n / dt / 1e6  # MB/s


def _produce_objects(q, n):
    for i in range(n):
        q.put((i, "x"))


def _timed_gets(q, produce, args, n):
    """Seconds for n gets from q while a forked produce(q, *args) puts."""
    p = mp.get_context("fork").Process(target=produce, args=(q, *args))
    t0 = time.perf_counter()
    p.start()
    for _ in range(n):
        q.get()
    dt = time.perf_counter() - t0
    p.join()
    return dt


def bench_objects(kind, n):
    q = mp.Queue() if kind == "Queue" else mp.SimpleQueue()
    return n / _timed_gets(q, _produce_objects, (n,), n)  # objects/s


def _produce_large(q, nbytes, n):
    obj = b"x" * nbytes
    for _ in range(n):
        q.put(obj)


def bench_large(nbytes, n):
    """A large plain object (bytes, no tensor) from a producer process:
    the pickle itself travels, not a handle."""
    return nbytes * n / _timed_gets(mp.Queue(), _produce_large, (nbytes, n), n) / 1e6  # MB/s


def _rank(rank):
    if rank == 1:
        raise RuntimeError("raised_at=" + repr(time.time()))
    time.sleep(30)


def bench_spawn():
    t0 = time.time()
    try:
        mp.spawn(_rank, nprocs=2, start_method="spawn")
    except mp.ProcessRaisedException as e:
        t1 = time.time()
        raised = float(re.findall(r"raised_at=([0-9.]+)", str(e))[-1])
        return (t1 - t0) * 1e3, (t1 - raised) * 1e3
    raise SystemExit("spawn did not raise")


def cases(quick):
    """(name, function) of every case, in the table's order."""
    k = 0.2 if quick else 1.0
    out = []
    for strategy in ("file_descriptor", "file_system"):
        for label, nbytes in (("4KiB", 4 << 10), ("1MiB", 1 << 20), ("64MiB", 64 << 20)):
            out.append((f"handoff {strategy} {label} (us)",
                        lambda s=strategy, b=nbytes: bench_handoff(s, b, max(20, int(300 * k)))))
    out.append(("fresh 1MiB (MB/s)", lambda: bench_fresh(1 << 20, max(20, int(200 * k)))))
    out.append(("fresh 64MiB (MB/s)", lambda: bench_fresh(64 << 20, max(3, int(12 * k)))))
    n = 200000 if not quick else 40000
    out.append(("objects Queue (obj/s)", lambda: bench_objects("Queue", n)))
    out.append(("objects SimpleQueue (obj/s)", lambda: bench_objects("SimpleQueue", n)))
    out.append(("large object 32MiB Queue (MB/s)",
                lambda: bench_large(32 << 20, max(5, int(30 * k)))))
    out.append(("spawn", bench_spawn))
    return out


def run_one(module, quick, only):
    global mp
    mp = importlib.import_module(module)
    res = {}
    for name, fn in cases(quick):
        if only and not re.search(only, name):
            continue
        if name == "spawn":
            total, detect = fn()
            res["spawn 2 ranks, failure raised (ms)"] = total
            res["failure detection latency (ms)"] = detect
        else:
            res[name] = fn()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--module", action="append", choices=MODULES,
                    help="benchmark only this module (repeatable; default: both)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    ap.add_argument("--case", help="run only the cases whose name matches this regular "
                    "expression (e.g. 'handoff file_system', 'objects'); results go to stdout "
                    "and --out is not written unless given")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each module this many times (alternating) and report medians")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None,
                    help="JSON lines file (default bench/results/python.jsonl for a full run)")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.quick, args.case)))
        return
    if args.out is None and not args.case:
        args.out = os.path.join(ROOT, "bench", "results", "python.jsonl")
    runs = {}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python")] + sys.path))
    # the in-place extension finds no daemon beside it: use the build's, as an
    # installed mproc would use its own (file_system reports to it)
    manager = os.path.join(ROOT, "build", "mproc-shm-manager")
    if "MPROC_SHM_MANAGER" not in env and os.access(manager, os.X_OK):
        env["MPROC_SHM_MANAGER"] = manager
    for _ in range(max(1, args.repeat)):
        for m in args.module or MODULES:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", m]
            cmd += (["--quick"] if args.quick else []) + (["--case", args.case] if args.case else [])
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            runs.setdefault(m, []).append(json.loads(out.strip().splitlines()[-1]))
    results = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    keys = list(next(iter(results.values())))
    mods = list(results)
    print("%-40s" % "case" + "".join("%22s" % m for m in mods) + ("%10s" % "ratio" if len(mods) == 2 else ""))
    for key in keys:
        vals = [results[m][key] for m in mods]
        line = "%-40s" % key + "".join("%22.1f" % v for v in vals)
        if len(mods) == 2:
            # ratio = how many times better mproc is (lower is better for times)
            better_low = "(us)" in key or "(ms)" in key
            r = vals[0] / vals[1] if better_low else vals[1] / vals[0]
            line += "%9.1fx" % r
        print(line)
    if not args.out:
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        for key in keys:
            f.write(json.dumps({"case": key, **{m: results[m][key] for m in mods}}) + "\n")
    print("written to", os.path.relpath(args.out, ROOT))


if __name__ == "__main__":
    main()
