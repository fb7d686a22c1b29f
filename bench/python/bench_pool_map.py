#!/usr/bin/python3
"""Python's Pool.map beside build/bench_pool's default-chunksize map.

    /usr/bin/python3 bench/python/bench_pool_map.py [--reps 7] [--n 100000] [--procs 2]

multiprocessing.Pool(procs) (fork context) maps an identity over range(n)
with the default chunksize, as bench_pool's "pool map, trivial task,
default chunksize" row maps a trivial echo task over n int64 messages: one
untimed warm-up map, then --reps timed maps (each includes building and
dropping the result list); prints the median in tasks/s and the spread.
"""
import argparse
import multiprocessing
import statistics
import time


def identity(x):
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--procs", type=int, default=2)
    a = ap.parse_args()
    items = list(range(a.n))
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(a.procs) as pool:
        pool.map(identity, items)
        rates = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            out = pool.map(identity, items)
            del out
            rates.append(a.n / (time.perf_counter() - t0))
    med = statistics.median(rates)
    print(f"python Pool({a.procs}).map, identity, default chunksize, {a.n} items: "
          f"median {med / 1e6:.2f}M tasks/s over {a.reps} reps "
          f"(min {min(rates) / 1e6:.2f}M, max {max(rates) / 1e6:.2f}M)")


if __name__ == "__main__":
    main()
