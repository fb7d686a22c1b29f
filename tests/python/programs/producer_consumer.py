# A producer of tensors and a consumer, through mp.Queue.
import torch
import torch.multiprocessing as mp


def producer(q, n):
    for i in range(n):
        q.put(torch.full((1000,), float(i)))
    q.put(None)


def consumer(q, out):
    total = 0.0
    while True:
        t = q.get()
        if t is None:
            break
        total += float(t.sum())
    out.put(total)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    q, out = mp.Queue(), mp.Queue()
    ps = [mp.Process(target=producer, args=(q, 20)), mp.Process(target=consumer, args=(q, out))]
    for p in ps:
        p.start()
    total = out.get()
    for p in ps:
        p.join()
    assert total == 1000.0 * sum(range(20)), total
    print("producer/consumer ok", total)
