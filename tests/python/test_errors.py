"""libmproc failures as the Python exceptions a user catches, with
mp_last_error()'s sentence."""
import errno

import pytest

import mproc
from mproc import _mproc


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"], indirect=True)
def test_no_space_is_oserror_enospc(strategy):
    with pytest.raises(OSError) as e:
        _mproc.Storage.empty(1 << 50)
    assert "mp__" not in str(e.value)  # names what the user did, not an internal call
    assert e.value.errno == errno.ENOSPC
    assert "/dev/shm" in str(e.value)  # the sentence names the fix


def test_bad_arguments_are_valueerror():
    with pytest.raises(ValueError, match="kind"):
        _mproc.Queue("nope")
    with pytest.raises(ValueError, match=r"Storage.empty: nbytes is -5; give 0 or more"):
        _mproc.Storage.empty(-5)
    with pytest.raises(ValueError, match="NaN"):
        _mproc.Queue().get(float("nan"))


def test_closed_is_eof_and_oserror():
    a, b = _mproc.pipe()
    a.close()
    with pytest.raises(EOFError) as e:
        b.recv(1)
    assert isinstance(e.value, OSError) and isinstance(e.value, mproc.ClosedError)
    with pytest.raises(mproc.ClosedError):
        a.send(b"x")


def test_timeout_is_timeouterror():
    with pytest.raises(TimeoutError, match="mp_queue_get"):
        _mproc.Queue().get(0.05)
    # A poll (timeout 0) that finds nothing is a timeout too, as in C.
    with pytest.raises(TimeoutError, match="mp_queue_get"):
        _mproc.Queue().get(0)


def test_wrong_types_name_the_call():
    import mproc.multiprocessing as mp
    with pytest.raises(TypeError, match="set_sharing_strategy: the strategy is a str"):
        mp.set_sharing_strategy(1)
    with pytest.raises(TypeError, match="share_array: a must be a NumPy array, not list"):
        mp.share_array([1, 2])


def test_arrays_refuse_what_cannot_be_shared():
    np = pytest.importorskip("numpy")
    import mproc.multiprocessing as mp
    before = mproc.tensor_stats()["segments_created"]
    with pytest.raises(TypeError, match="object pointers"):
        mp.share_array(np.array([object()]))
    with pytest.raises(TypeError, match="object pointers"):
        mp.shared_array(3, object)
    with pytest.raises(ValueError, match="negative dimension"):
        mp.shared_array((2, -1))
    with pytest.raises(TypeError, match="dimensions are ints"):
        mp.shared_array((2.5,))
    with pytest.raises(ValueError, match="more than an array can hold"):
        mp.shared_array((1 << 62,), np.float64)
    assert mproc.tensor_stats()["segments_created"] == before  # refused before any segment
    assert mp.shared_array((0, 5)).shape == (0, 5)
    assert mp.shared_array(np.int64(4), np.int32).shape == (4,)


def test_storage_bad_numbers():
    with pytest.raises(OverflowError, match="Storage.empty: nbytes"):
        _mproc.Storage.empty(1 << 70)
    with pytest.raises(ValueError, match="adopt_fd: offset -1 is negative"):
        _mproc.Storage.adopt_fd(0, 1, offset=-1)


def test_dlpack_to_another_device_is_buffererror():
    st = _mproc.Storage.empty(16)
    assert st.__dlpack_device__() == (1, 0)
    st.__dlpack__(dl_device=(1, 0))  # its own device: fine
    with pytest.raises(BufferError, match=r"cannot export to dl_device \(2, 0\)"):
        st.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError, match="dl_device is a"):
        st.__dlpack__(dl_device="cpu")
