"""DiskIO and FaultyIO: whole-buffer positional I/O and the fault-injection seam."""

import errno
import os

import pytest
from forkv.security import DiskIO, FaultyIO


def test_pwrite_pread_whole_buffers(tmp_path):
    io = DiskIO()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    data = os.urandom(1 << 20)
    io.pwrite(fd, memoryview(data), 4096)
    buf = bytearray(len(data))
    assert io.pread_into(fd, memoryview(buf), 4096) == len(data) and buf == data
    assert io.pread_into(fd, memoryview(bytearray(100)), 4096 + len(data) - 10) == 10  # EOF
    os.close(fd)


def test_faulty_io_fails_the_kth_call_and_on(tmp_path):
    io = FaultyIO()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    io.fail("pwrite", errno.ENOSPC, at=3)
    io.pwrite(fd, memoryview(b"a"), 0)
    io.pwrite(fd, memoryview(b"b"), 1)
    for _ in range(2):
        with pytest.raises(OSError) as exc:
            io.pwrite(fd, memoryview(b"c"), 2)
        assert exc.value.errno == errno.ENOSPC
    assert io.calls["pwrite"] == 4
    io.clear()
    io.pwrite(fd, memoryview(b"c"), 2)
    os.close(fd)


def test_faulty_io_times_and_short_reads(tmp_path):
    io = FaultyIO()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    io.pwrite(fd, memoryview(b"x" * 100), 0)
    io.fail("pread_into", errno.EIO, at=1, times=1)
    with pytest.raises(OSError):
        io.pread_into(fd, memoryview(bytearray(100)), 0)
    assert io.pread_into(fd, memoryview(bytearray(100)), 0) == 100
    io.fail("pread_into", 0, at=1, times=1)  # err=0: a truncated file
    assert io.pread_into(fd, memoryview(bytearray(100)), 0) == 50
    with pytest.raises(AssertionError):
        io.fail("no_such_call")
    os.close(fd)
