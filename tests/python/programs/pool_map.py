# Pool.map over tensors.
import torch
import torch.multiprocessing as mp


def square(t):
    return t * t


if __name__ == "__main__":
    with mp.Pool(2) as pool:
        out = pool.map(square, [torch.full((4,), float(i)) for i in range(6)])
    assert [float(t[0]) for t in out] == [float(i * i) for i in range(6)]
    print("pool ok")
