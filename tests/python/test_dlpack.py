"""DLPack: mproc storages to torch and NumPy and back, without copies, and
the capsule's lifetime rules."""
import gc
import sys

import numpy as np
import pytest

from mproc import _mproc

torch = pytest.importorskip("torch")


def test_zero_copy_mproc_to_torch_and_numpy():
    st = _mproc.Storage.empty(64)
    t = torch.from_dlpack(st)
    a = np.from_dlpack(st)  # NumPy 1.24 makes DLPack imports read-only
    w = np.frombuffer(st, dtype=np.uint8)  # the buffer protocol gives a writable one
    assert t.data_ptr() == st.data_ptr == a.__array_interface__["data"][0]
    assert w.__array_interface__["data"][0] == st.data_ptr
    t[5] = 42
    assert a[5] == 42 and w[5] == 42
    w[6] = 7
    assert t[6] == 7 and a[6] == 7
    assert st.__dlpack_device__() == (1, 0)


def test_zero_copy_torch_to_mproc():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    st = _mproc.Storage.from_dlpack(x)
    assert st.dtype == "float32" and st.shape == (3, 4)
    assert st.data_ptr == x.data_ptr() and not st.is_shared
    y = torch.from_dlpack(st)
    y[0, 0] = -1
    assert x[0, 0] == -1


def test_zero_copy_numpy_to_mproc():
    a = np.arange(5, dtype=np.int64)
    st = _mproc.Storage.from_dlpack(a)
    assert st.dtype == "int64" and st.data_ptr == a.__array_interface__["data"][0]
    torch.from_dlpack(st)[1] = 100
    assert a[1] == 100


def test_import_then_share_copies_once():
    a = np.ones(4, dtype=np.float32)
    st = _mproc.Storage.from_dlpack(a)
    st.share_memory_()
    assert st.is_shared and st.data_ptr != a.__array_interface__["data"][0]


def test_versioned_capsule():
    st = _mproc.Storage.empty(8)
    cap = st.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(cap)
    legacy = st.__dlpack__(max_version=(0, 8))
    assert '"dltensor"' in repr(legacy)
    del cap, legacy  # unconsumed: the destructors free them


def test_capsule_consumed_once():
    st = _mproc.Storage.empty(16)
    cap = st.__dlpack__()
    t = torch.utils.dlpack.from_dlpack(cap)
    with pytest.raises(Exception):
        torch.utils.dlpack.from_dlpack(cap)  # "used_dltensor": not again
    del cap
    gc.collect()
    t[0] = 1  # the memory is still the tensor's
    assert torch.from_dlpack(st)[0] == 1


def test_capsule_keeps_storage_alive():
    st = _mproc.Storage.empty(32)
    ptr = st.data_ptr
    refs = sys.getrefcount(st)
    t = torch.from_dlpack(st)
    assert sys.getrefcount(st) == refs + 1
    del st
    gc.collect()
    t.fill_(3)  # still mapped: the consumer's reference holds it
    assert t.data_ptr() == ptr
    del t


def test_capsule_no_leak():
    st = _mproc.Storage.empty(32)
    refs = sys.getrefcount(st)
    for _ in range(200):
        torch.from_dlpack(st)
        st.__dlpack__()
        np.from_dlpack(st)
    gc.collect()
    assert sys.getrefcount(st) == refs


def test_bad_arguments():
    st = _mproc.Storage.empty(8)
    with pytest.raises(ValueError):
        st.__dlpack__(stream=1)
    with pytest.raises(ValueError):
        st.__dlpack__(copy=True)
    with pytest.raises(ValueError, match="nbytes is -1"):
        _mproc.Storage.empty(-1)
    with pytest.raises(TypeError):
        _mproc.Storage.from_dlpack(object())


def test_buffer_protocol():
    st = _mproc.Storage.empty(4)
    m = memoryview(st)
    assert m.nbytes == 4 and not m.readonly
    m[0] = 9
    assert bytes(st)[0] == 9


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"], indirect=True)
def test_storage_filled(strategy):
    """Storage.filled writes each (offset, address, nbytes) part at its
    offset (the arena of a message); everything else reads zero."""
    a = np.arange(1, 101, dtype=np.uint8)
    b = np.full(10000, 7, dtype=np.uint8)
    st = _mproc.Storage.filled(20000, [(3, a.ctypes.data, 100), (200, a.ctypes.data, 0),
                                       (9000, b.ctypes.data, 10000)])
    got = np.frombuffer(memoryview(st), dtype=np.uint8)
    want = np.zeros(20000, dtype=np.uint8)
    want[3:103] = a
    want[9000:19000] = b
    assert st.nbytes == 20000 and np.array_equal(got, want)
    assert st.is_shared
    with pytest.raises(ValueError, match="overlaps"):
        _mproc.Storage.filled(200, [(0, a.ctypes.data, 100), (50, a.ctypes.data, 10)])
    with pytest.raises(ValueError, match="ends past") as e:
        _mproc.Storage.filled(50, [(0, a.ctypes.data, 100)])
    assert "mp__" not in str(e.value)  # names the rule broken, not an internal call
    with pytest.raises(ValueError, match="negative"):
        _mproc.Storage.filled(50, [(-1, a.ctypes.data, 10)])
    with pytest.raises(TypeError, match="offset, address, nbytes"):
        _mproc.Storage.filled(50, [(0, a.ctypes.data)])
    with pytest.raises(TypeError):
        _mproc.Storage.filled(50, 3)
