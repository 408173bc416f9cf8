"""What the store hands out and takes in: ``Blob``, ``StoreStats``, and argument checks.

Knows: the shape of a record read back, of the counters, and which keys, kinds and buffers
are acceptable (and which buffers can be kept without a copy). Does not know: storage.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .index import MAX_KEY_BYTES, MAX_KIND_BYTES

__all__ = ["Blob", "StoreStats", "ThreadScratch", "check_slot", "hold_bytes"]


@dataclass(slots=True, frozen=True)
class Blob:
    """A record read back: the bytes given to ``put`` (from ``get_into``: a view of the caller's
    buffer) and their metadata."""

    data: bytes | memoryview = field(repr=False)  # tens of MB: keep them out of reprs
    meta: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Blob(<{len(self.data)} bytes>, meta={self.meta!r})"


@dataclass(slots=True, frozen=True)
class StoreStats:
    """A snapshot of the store's counters (cumulative since it opened, except sizes)."""

    mode: str  # 'off', 'ephemeral' or 'persistent'
    is_enabled: bool  # False when off, closed or disabled by a fault
    is_degraded: bool  # a fault shrank or disabled the tier
    disk_budget: int
    bytes_on_disk: int  # sealed bytes of live records (grain-rounded)
    num_records: int
    num_pending: int  # queued for the writer
    num_hits: int
    num_misses: int
    num_evictions: int
    bytes_written: int  # what the SSD absorbed, records and index
    num_dropped: int  # puts refused: queue full, too big, faults
    num_tampered: int  # records that failed authentication
    num_failed: int  # I/O errors and truncated reads


def check_slot(key: bytes, kind: str) -> tuple[bytes, str]:
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"key must be bytes, not {type(key).__name__}.")
    key = bytes(key)
    if not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"key must be 1..{MAX_KEY_BYTES} bytes, got {len(key)}.")
    if not isinstance(kind, str) or not 0 < len(kind.encode("utf-8")) <= MAX_KIND_BYTES:
        raise ValueError(f"kind must be a short non-empty string like 'global', got {kind!r}.")
    return key, kind


def hold_bytes(data: bytes | bytearray | memoryview) -> bytes | memoryview:
    """Something immutable with ``data``'s bytes: ``bytes`` as is (no copy), else one copy.

    A mutable buffer could change after ``put`` returns, before the writer seals it.
    """
    if isinstance(data, bytes):
        return data
    view = memoryview(data)
    if isinstance(view.obj, bytes) and view.contiguous and view.nbytes == len(view.obj):
        return view.obj
    return view.tobytes()


class ThreadScratch:
    """A reusable read buffer per thread (readers run concurrently): ``scratch(n)`` is a
    writable view of n bytes. Buffers up to ``keep`` bytes are kept between calls, because
    a fresh one per record would page-fault every byte in again; larger ones are not."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._local = threading.local()

    def __call__(self, n: int) -> memoryview:
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            buf = bytearray(n)
            if n <= self._keep:
                self._local.buf = buf
        return memoryview(buf)[:n]

    def release(self) -> None:
        """Drop every thread's buffer (the next call allocates afresh)."""
        self._local = threading.local()
