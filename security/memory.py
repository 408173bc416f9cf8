"""Buffers for key material that stay out of core dumps.

Knows: how to put a few secret bytes on their own anonymous page marked ``MADV_DONTDUMP``
(Linux), so a core dump, even one the user enabled, does not contain them. Does not know
where keys come from. Copies made elsewhere (``bytes()``, OpenSSL's key schedule) are not
covered: ``harden_process()`` turns core dumps off for the whole process.
"""

from __future__ import annotations

import mmap

__all__ = ["is_dontdump_available", "secure_buffer"]


def is_dontdump_available() -> bool:
    return hasattr(mmap, "MADV_DONTDUMP")


def secure_buffer(data: bytes | bytearray | memoryview) -> memoryview | bytearray:
    """A writable copy of ``data`` on a private page excluded from core dumps where possible.

    The result is a ``memoryview`` of an anonymous mapping (a ``bytearray`` where the
    platform has no ``MADV_DONTDUMP``); zero it, then drop it, to free the page.
    """
    n = memoryview(data).nbytes
    if n == 0 or not is_dontdump_available():
        return bytearray(data)
    size = -(-n // mmap.PAGESIZE) * mmap.PAGESIZE
    page = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        page.madvise(mmap.MADV_DONTDUMP)
    except OSError:
        pass  # old kernel: the page is still private, only not excluded from dumps
    view = memoryview(page)[:n]
    view[:] = memoryview(data).cast("B")
    return view
