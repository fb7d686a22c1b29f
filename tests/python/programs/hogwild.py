# Hogwild training as torch.multiprocessing's docs write it.
import torch
import torch.multiprocessing as mp
import torch.nn as nn


def train(model, steps):
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        x = torch.randn(16, 4)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    model = nn.Linear(4, 1)
    model.share_memory()
    before = model.weight.detach().clone()
    procs = [mp.Process(target=train, args=(model, 50)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    assert not torch.equal(before, model.weight), "workers' updates not seen"
    print("hogwild ok", model.weight.detach().numpy().round(2).tolist())
