"""The background writer: a bounded queue drained by one daemon thread.

Knows: how to accept work without ever blocking the producer (full queue = refuse), how to
hand items one by one to a write function, and how to wait for, discard or stop the work.
Does not know: what an item is or how it is written — the store passes ``write``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["WriteItem", "WriteQueue"]

log = logging.getLogger("forkv.security")


@dataclass(slots=True, eq=False, repr=False)
class WriteItem:
    key: bytes
    kind: str
    data: bytes | memoryview  # immutable bytes, or a copy we own: never mutated after put
    meta_bytes: bytes
    meta: dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        # The record is plaintext (a prompt in another form): never in a repr, log or traceback.
        return f"WriteItem(kind={self.kind!r}, <{self.nbytes} bytes>)"

    @property
    def nbytes(self) -> int:
        return memoryview(self.data).nbytes

    def as_bytes(self) -> bytes:
        return self.data if isinstance(self.data, bytes) else bytes(self.data)


class WriteQueue:
    """FIFO of ``WriteItem`` bounded by count and bytes; one thread calls ``write(item)``."""

    def __init__(self, write: Callable[[WriteItem], None], max_items: int, max_bytes: int) -> None:
        self._write = write
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._items: deque[WriteItem] = deque()
        self._bytes = 0
        self._busy = False  # an item is being written right now
        self._stopping = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def num_items(self) -> int:
        return len(self._items) + self._busy

    def offer(self, item: WriteItem) -> bool:
        """Queue ``item``; False (never a wait) when the queue is full or stopped."""
        size = item.nbytes
        with self._cond:
            if self._stopping or len(self._items) >= self._max_items:
                return False
            if self._items and self._bytes + size > self._max_bytes:
                return False  # an oversize item alone is allowed, or it could never be written
            self._items.append(item)
            self._bytes += size
            if self._thread is None:  # started lazily: unused stores cost no thread
                self._thread = threading.Thread(
                    target=self._run, name="forkv-blob-writer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
            return True

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every queued item was written; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._items and not self._busy, timeout)

    def discard(self) -> int:
        """Drop every queued item (the one being written finishes); return how many."""
        with self._cond:
            dropped = len(self._items)
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
            return dropped

    def stop(self, timeout: float | None = None) -> None:
        """Finish the current item, refuse new ones, and join the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._items or self._stopping)
                if not self._items:
                    return  # stopping and empty
                item = self._items.popleft()
                self._bytes -= item.nbytes
                self._busy = True
            try:
                self._write(item)
            except Exception:  # the thread must outlive any bug, or flush() would hang
                log.exception("forkv blob writer: unexpected error")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
