"""Run by test_interrupt.py: blocks in the call argv[1] names until the test
sends SIGINT to this process alone (as `kill -INT PID` does; a terminal's
Ctrl-C would reach the children too). Prints "blocking" (after any child
pids) just before the call, and "KeyboardInterrupt" if the call raised it."""
import os
import sys
import time

import mproc.torch as mp


def idle(rank=0):
    print("child", os.getpid(), flush=True)
    time.sleep(60)


def block(what):
    if what == "queue.get":
        mp.Queue().get()
    elif what == "queue.put":
        q = mp.Queue(1)
        q.put(0)
        print("blocking", flush=True)
        q.put(1)
    elif what == "simple_queue.get":
        mp.SimpleQueue().get()
    elif what == "joinable_queue.join":
        q = mp.JoinableQueue()
        q.put(0)
        print("blocking", flush=True)
        q.join()
    elif what == "pipe.recv":
        a, b = mp.Pipe()
        b.recv()
    elif what == "pipe.poll":
        a, b = mp.Pipe()
        b.poll(None)
    elif what == "spawn":
        mp.spawn(idle, nprocs=2, start_method="fork")


if __name__ == "__main__":
    what = sys.argv[1]
    if what not in ("queue.put", "joinable_queue.join", "spawn"):
        print("blocking", flush=True)
    try:
        block(what)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(130)
    sys.exit(f"{what} returned without SIGINT")
