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
    assert e.value.errno == errno.ENOSPC
    assert "/dev/shm" in str(e.value)  # the sentence names the fix


def test_bad_arguments_are_valueerror():
    with pytest.raises(ValueError, match="kind"):
        _mproc.Queue("nope")
    with pytest.raises(ValueError):
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
