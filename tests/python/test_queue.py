"""Python multiprocessing's queue and pipe semantics on mproc's."""
import errno
import gc
import queue
import time

import pytest

import mproc.multiprocessing as mp
import workers


def test_put_get_objects():
    q = mp.Queue()
    objs = [1, "two", b"three", None, {"a": [1, 2, (3,)]}, 2.5, True]
    for o in objs:
        q.put(o)
    assert q.qsize() == len(objs)
    assert [q.get() for _ in objs] == objs
    assert q.empty()


def test_empty_and_timeout():
    q = mp.Queue()
    with pytest.raises(queue.Empty):
        q.get(block=False)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)
    assert time.monotonic() - t0 >= 0.15


def test_full_and_maxsize():
    q = mp.Queue(2)
    q.put(1)
    q.put(2)
    assert q.full()
    with pytest.raises(queue.Full):
        q.put(3, block=False)
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.1)
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    assert q.get() == 1
    q.put(3)
    assert [q.get(), q.get()] == [2, 3]
    # as Python's Queue: an int, <= 0 unbounded
    for bad in (1.5, "2"):
        with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
            mp.Queue(bad)
    unbounded = mp.Queue(-1)
    for i in range(3):
        unbounded.put(i, block=False)
    assert not unbounded.full()


def test_close_is_per_handle():
    q = mp.Queue()
    q.put(1)
    with pytest.raises(AssertionError):
        q.join_thread()
    q.close()
    q.join_thread()
    q.cancel_join_thread()
    with pytest.raises(ValueError):
        q.put(2)
    with pytest.raises(ValueError):
        q.get()


def test_joinable_queue():
    q = mp.JoinableQueue()
    for i in range(5):
        q.put(i)
    q.put(None)
    p = mp.Process(target=workers.task_consumer, args=(q,))
    p.start()
    q.join()
    p.join(30)
    assert p.exitcode == 0
    with pytest.raises(ValueError):
        q.task_done()


def test_joinable_join_timeout():
    q = mp.JoinableQueue()
    q.put(1)
    with pytest.raises(TimeoutError):
        q.join(timeout=0.1)
    q.get()
    q.task_done()
    q.join(timeout=1)


def test_simple_queue():
    q = mp.SimpleQueue()
    assert q.empty()
    q.put([1, 2])
    assert not q.empty()
    assert q.get() == [1, 2]
    q.close()
    with pytest.raises(ValueError):
        q.put(1)


def test_consumer_after_producer_exited():
    q = mp.Queue()
    p = mp.Process(target=workers.put_and_exit, args=(q, {"x": 1}))
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert q.get(timeout=10) == {"x": 1}


def test_queue_through_queue():
    q, inner = mp.Queue(), mp.Queue()
    q.put(inner)
    got = q.get()
    got.put("hello")
    assert inner.get(timeout=5) == "hello"


def test_pipe_duplex():
    a, b = mp.Pipe()
    a.send({"k": 1})
    assert b.poll(1)
    assert b.recv() == {"k": 1}
    b.send_bytes(b"abcdef", 1, 3)
    assert a.recv_bytes() == b"bcd"
    b.send_bytes(b"xyz")
    buf = bytearray(5)
    assert a.recv_bytes_into(buf, 1) == 3
    assert bytes(buf) == b"\0xyz\0"
    assert not a.poll()
    assert not a.poll(0.05)


def test_pipe_recv_bytes_into_bad_buffer_loses_nothing():
    # the buffer is checked before the message is taken (so, too, with
    # nothing to receive, a bad buffer fails at once instead of waiting)
    a, b = mp.Pipe()
    b.send_bytes(b"xyz")
    with pytest.raises(ValueError, match="negative offset"):
        a.recv_bytes_into(bytearray(4), -1)
    assert a.poll()
    with pytest.raises(ValueError, match="offset too large"):
        a.recv_bytes_into(bytearray(4), 5)
    assert a.poll()
    with pytest.raises(TypeError, match="read-only"):
        a.recv_bytes_into(b"1234")
    assert a.poll()
    buf = bytearray(4)
    assert a.recv_bytes_into(buf) == 3
    assert bytes(buf) == b"xyz\0"


def test_pipe_one_way_and_eof():
    r, w = mp.Pipe(duplex=False)
    assert r.readable and not r.writable and w.writable and not w.readable
    with pytest.raises(OSError):
        r.send(1)
    with pytest.raises(OSError):
        w.recv()
    w.send(1)
    w.close()
    assert w.closed
    assert r.recv() == 1
    with pytest.raises(EOFError):
        r.recv()


def test_pipe_send_to_closed_peer():
    a, b = mp.Pipe()
    for i in range(3):  # the first sends, then at once as Python's pipe does
        a.send(i)
        assert b.recv() == i
    b.close()
    with pytest.raises(BrokenPipeError) as e:
        a.send(1)
    assert e.value.errno == errno.EPIPE
    assert str(e.value) == "[Errno 32] mp_conn_send: the receiving end was closed"
    with pytest.raises(BrokenPipeError):
        a.send_bytes(b"again")
    a.close()


def test_pipe_eof_text():
    a, b = mp.Pipe()
    a.close()
    with pytest.raises(EOFError) as e:
        b.recv()
    assert "Errno" not in str(e.value) and "closed" in str(e.value)


def test_pipe_wait_and_child():
    from multiprocessing.connection import wait
    a, b = mp.Pipe()
    p = mp.Process(target=workers.pipe_child, args=(b,))
    p.start()
    a.send(21)
    assert wait([a], timeout=30) == [a]
    assert a.recv() == 42
    p.join(30)
    assert p.exitcode == 0


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_queue_and_pipe_as_spawn_args(method):
    ctx = mp.get_context(method)
    q, r = ctx.Queue(), ctx.SimpleQueue()
    a, b = ctx.Pipe()
    p = ctx.Process(target=workers.echo, args=(q, r))
    p2 = ctx.Process(target=workers.pipe_child, args=(b,))
    p.start()
    p2.start()
    q.put("ping")
    a.send(5)
    assert r.get() == "ping"
    assert a.recv() == 10
    p.join(60)
    p2.join(60)
    assert p.exitcode == 0 and p2.exitcode == 0


def test_errors_carry_mproc_sentence():
    with pytest.raises(ValueError, match="file_descriptor"):
        mp.set_sharing_strategy("nope")
    assert mp.get_all_sharing_strategies() == {"file_descriptor", "file_system"}


def test_large_payloads_every_channel():
    # from 64 KiB on a bytes pickle is sent from where it lies (borrowed, not
    # copied) and unpickled in the received message (no bytes copy): the
    # sizes around that edge, and a spilled body (over 60 KiB), both ways
    from conftest import own_fds, own_segments
    gc.collect()  # earlier tests' garbage may hold fds: not ours to count
    fds, segs = own_fds(), own_segments()
    objs = [b"a" * (64 * 1024 - 40), b"b" * (64 * 1024), b"c" * (3 << 20),
            list(range(100_000)), {"k": "v" * 200_000}]
    for kind in ("Queue", "SimpleQueue", "JoinableQueue"):
        q, r = getattr(mp, kind)(), getattr(mp, kind)()
        p = mp.Process(target=workers.echo, args=(q, r, len(objs)))
        p.start()
        for o in objs:
            q.put(o)
        assert [r.get() for _ in objs] == objs, kind
        p.join(30)
        p.close()
    a, b = mp.Pipe()
    for o in objs:
        a.send(o)
        assert b.recv() == o
        if isinstance(o, bytes):
            a.send_bytes(o)
            assert b.recv_bytes() == o
            a.send_bytes(memoryview(bytearray(o))[1:])  # not bytes: copied
            assert b.recv_bytes() == o[1:]
    # a full queue refuses a large put and loses nothing
    q = mp.Queue(1)
    q.put(objs[2])
    with pytest.raises(queue.Full):
        q.put(objs[2], timeout=0.2)
    assert q.get() == objs[2]
    q.put(objs[3])
    assert q.get() == objs[3]
    del a, b, q, r, p
    gc.collect()
    assert own_fds() == fds and own_segments() == segs
