"""The one I/O seam of the blob store: every syscall on our folder and files goes through here.

Knows: positional reads and writes that loop over short transfers, and the handful of other
calls the store needs. Does not know: record formats or keys. ``FaultyIO`` subclasses it so
tests (and the engine's tests) can inject ENOSPC at the k-th write, EIO, ENOENT and short
reads without touching a real disk.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass

__all__ = ["DiskIO", "FaultyIO"]


class DiskIO:
    """Real I/O. Methods mirror ``os`` calls; ``pwrite``/``pread_into`` move whole buffers."""

    def mkdtemp(self, prefix: str, parent: str) -> str:
        return tempfile.mkdtemp(prefix=prefix, dir=parent)  # mode 0700, atomic, unguessable

    def open(self, path: str, flags: int, mode: int = 0o600, dir_fd: int | None = None) -> int:
        return os.open(path, flags, mode, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def lstat(self, path: str) -> os.stat_result:
        return os.lstat(path)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def unlink(self, name: str, dir_fd: int | None = None) -> None:
        os.unlink(name, dir_fd=dir_fd)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path)

    def lock(self, fd: int, *, blocking: bool = False) -> None:
        """Exclusive advisory lock; raises BlockingIOError if held and not ``blocking``."""
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))

    def pwrite(self, fd: int, data: memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (loops: the kernel may write less per call)."""
        view = memoryview(data).cast("B")
        while view:
            written = os.pwrite(fd, view, offset)
            if written <= 0:
                raise OSError(errno.EIO, "pwrite wrote nothing")
            view, offset = view[written:], offset + written

    def pread_into(self, fd: int, buf: memoryview, offset: int) -> int:
        """Fill ``buf`` from ``offset`` without an extra copy; return bytes read (< len at EOF)."""
        view = memoryview(buf).cast("B")
        total = 0
        while total < len(view):
            if hasattr(os, "preadv"):
                got = os.preadv(fd, [view[total:]], offset + total)
            else:  # no preadv (older macOS): one extra copy
                chunk = os.pread(fd, len(view) - total, offset + total)
                got = len(chunk)
                view[total : total + got] = chunk
            if got == 0:
                break
            total += got
        return total

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


@dataclass(slots=True)
class _Fault:
    op: str
    err: int
    at: int  # first failing call number, 1-based
    times: int | None  # how many calls fail from `at` on; None = all later calls


class FaultyIO(DiskIO):
    """``DiskIO`` that fails chosen calls: ``io.fail('pwrite', errno.ENOSPC, at=3)``.

    ``err=0`` on ``pread_into`` simulates a truncated file (a short read) instead of raising.
    ``calls[op]`` counts calls per method, so tests can aim at the k-th write.
    """

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self._faults: list[_Fault] = []

    def fail(self, op: str, err: int = errno.EIO, *, at: int = 1, times: int | None = None) -> None:
        assert hasattr(DiskIO, op), f"no I/O method named {op!r}"
        self._faults.append(_Fault(op, err, self.calls.get(op, 0) + at, times))

    def clear(self) -> None:
        self._faults.clear()

    def _should_fail(self, op: str) -> _Fault | None:
        n = self.calls[op] = self.calls.get(op, 0) + 1
        for fault in self._faults:
            if (
                fault.op == op
                and n >= fault.at
                and (fault.times is None or n < fault.at + fault.times)
            ):
                return fault
        return None

    def _check(self, op: str) -> None:
        fault = self._should_fail(op)
        if fault is not None and fault.err:
            raise OSError(fault.err, f"injected {os.strerror(fault.err)} in {op}")


def _wrap(name: str):
    real = getattr(DiskIO, name)

    def method(self: FaultyIO, *args, **kwargs):
        if name == "pread_into":
            fault = self._should_fail(name)
            if fault is not None and not fault.err:
                buf = memoryview(args[1]).cast("B")
                return real(self, args[0], buf[: len(buf) // 2], args[2])  # short read
            if fault is not None:
                raise OSError(fault.err, f"injected {os.strerror(fault.err)} in {name}")
        else:
            self._check(name)
        return real(self, *args, **kwargs)

    method.__name__ = name
    return method


for _name in [n for n in vars(DiskIO) if not n.startswith("_")]:
    setattr(FaultyIO, _name, _wrap(_name))
