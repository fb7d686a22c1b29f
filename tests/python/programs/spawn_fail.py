# mp.spawn with a failing rank.
import sys
import time

import torch.multiprocessing as mp


def run(rank):
    if rank == 1:
        raise RuntimeError("rank 1 broke")
    time.sleep(60)


if __name__ == "__main__":
    t0 = time.time()
    try:
        mp.spawn(run, nprocs=2)
    except mp.ProcessRaisedException as e:
        assert "rank 1 broke" in str(e)
        print("spawn failure ok in %.1f s" % (time.time() - t0))
        sys.exit(0)
    sys.exit("no exception")
