"""Process targets for the tests (module level, so spawn and forkserver
children can import them)."""
import os
import signal
import sys
import time


def add_one(q, r):
    t = q.get()
    t += 1
    r.put(("done", t.is_shared()))


def echo(q, r, n=1):
    for _ in range(n):
        r.put(q.get())


def echo_objects(q, *objs):
    q.put(objs)


def put_and_exit(q, obj):
    q.put(obj)


def fresh_tensor(q, n):
    import torch
    q.put(torch.full((n,), 7.0))


def inc_grad(q, r):
    t = q.get()
    t.grad += 1
    t += 1
    r.put(True)


def task_consumer(q):
    while True:
        item = q.get()
        q.task_done()
        if item is None:
            return


def pipe_child(conn):
    conn.send(conn.recv() * 2)
    conn.close()


def array_child(q, r):
    a = q.get()
    a[:] = 5
    r.put(a.sum())


def rank_ok(rank, q):
    q.put(rank)


def rank_raises(rank, bad):
    if rank == bad:
        raise ValueError(f"rank {rank} failed on purpose")
    time.sleep(30)


def rank_exits(rank, code):
    if rank == 0:
        sys.exit(code)
    time.sleep(30)


def rank_signal(rank):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def rank_sleep(rank):
    time.sleep(0.5)


def double(t):
    return t * 2


def fill_add(args):
    t, v = args
    t += v
    return t


def pid_of(_):
    return os.getpid()


def make_tensor(n):
    import torch
    return torch.arange(float(n))


def echo_until_none(q, r):
    """Sends back what arrives until None (the handoff tests' peer)."""
    while True:
        obj = q.get()
        if obj is None:
            return
        r.put(obj)


def share_and_send_twice(q, done):
    import torch
    import mproc.torch  # noqa: F401  (a fork child has it; spawn imports it here)
    t = torch.arange(6.0).share_memory_()
    q.put(t)
    q.put(t[2:])
    done.get()  # keeps t until the parent has both


def count_arrivals(q, r, n):
    """Receives n tensors, answering each one's first element and dropping
    it; then what that cost: the arrivals by a pin (no fd), the segments
    mapped, the storages kept pinned or mapped, and the open fds after the
    3rd arrival and after the last."""
    import mproc
    from mproc import _mproc
    s0 = mproc.tensor_stats()
    fds3 = None
    for i in range(n):
        t = q.get(timeout=30)
        r.put(int(t[0]))
        del t
        if i == 2:
            fds3 = len(os.listdir("/proc/self/fd"))
    s = mproc.tensor_stats()
    r.put({"pinned": s["segments_received_by_pin"] - s0["segments_received_by_pin"],
           "mapped": s["segments_mapped"] - s0["segments_mapped"],
           "kept": _mproc._pins_held(), "fds3": fds3,
           "fds": len(os.listdir("/proc/self/fd"))})
