"""How the blob store reacts to faults: warn once, degrade or disable, never raise.

Knows: the policy — disk full makes the tier read-only (until ``wipe``); other write faults
turn the tier off; a record failing authentication is dropped and counted as tampered;
repeated read faults turn the tier off. Does not know: I/O itself. ``FaultPolicy`` is mixed into
``BlobStore``; its methods run with the store lock held and touch the store's state.
"""

from __future__ import annotations

import errno
import logging
import warnings
from collections.abc import Callable

from .aead import RecordAuthError
from .datafile import TruncatedRecordError
from .errors import ForkvWarning, NonceError
from .index import Entry

__all__ = ["FaultPolicy"]

log = logging.getLogger("forkv.security")
_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_MAX_READ_FAULTS = 3  # repeated read errors mean the disk, not one record, is bad


class FaultPolicy:
    """Mixin for ``BlobStore``: fault reactions over its lock-protected state."""

    def _guard(self, what: str, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # noqa: BLE001
            self._on_write_fault(exc, what)

    def _on_write_fault(self, exc: BaseException, what: str = "write") -> None:
        # Caller holds the lock. Disk full: keep serving what is written, write nothing more
        # (evicting good records for writes that fail again would lose them). Else: off.
        if isinstance(exc, OSError) and exc.errno in _FULL and len(self._index) > 0:
            self._read_only = self._degraded = True
            self._counts["num_dropped"] += len(self._pending)
            self._pending.clear()
            self._queue.discard()
            self._warn("full", f"disk tier full ({exc.strerror}); serving reads, no new writes")
            return
        self._counts["num_failed"] += isinstance(exc, OSError)
        reason = "nonce space exhausted" if isinstance(exc, NonceError) else repr(exc)
        self._disable(f"disk tier off after a {what} fault: {reason}")

    def _on_read_fault(self, slot: tuple[bytes, str], entry: Entry, exc: BaseException) -> None:
        with self._lock:
            self._counts["num_misses"] += 1
            if self._index.get(slot) is not entry:
                return  # evicted or replaced while we read: a plain miss, not tampering
            self._index.pop(slot)
            self._release(entry.offset, entry.extent)
            self._dirty = True
            if isinstance(exc, RecordAuthError):
                self._counts["num_tampered"] += 1
                self._warn(
                    "tamper",
                    "a record failed authentication (file tampered with?); treated as a miss",
                )
                return
            self._counts["num_failed"] += 1
            self._read_faults += 1
            self._warn("read", f"read fault on the disk tier ({exc}); treated as a miss")
            if self._read_faults >= _MAX_READ_FAULTS and not isinstance(exc, TruncatedRecordError):
                self._disable("disk tier off after repeated read faults")

    def _disable(self, message: str) -> None:
        self._enabled = False
        self._degraded = True
        self._epoch += 1
        self._pending.clear()
        self._index.clear()
        self._queue.discard()
        self._warn("disabled", message)

    def _warn(self, topic: str, message: str) -> None:
        if topic in self._warned:  # once per topic: a failing disk must not flood logs
            return
        self._warned.add(topic)
        text = f"forkv: {message}. Generation continues; missing checkpoints are recomputed."
        try:
            warnings.warn(text, ForkvWarning, stacklevel=3)
        except Warning:  # `-W error` must not turn a handled fault into a crash
            log.warning("%s", text)
