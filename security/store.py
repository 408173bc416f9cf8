"""BlobStore: the encrypted disk tier of checkpoints — put/get/delete by (key, kind).

Knows: the public API, the lock that guards index/allocator/pending writes, the byte
budget and eviction order, counters, and how faults degrade the tier (a ``ForkvWarning``,
then misses; never an exception, never wrong data). Does not know: arrays, mlx or the RAM
tier; records arrive as bytes (serialised by the caller) and leave as bytes, or decrypted
straight into a buffer the caller provides (``get_into``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from . import lifecycle
from .aead import make_aad, sealed_size
from .alloc import Allocator
from .blob import Blob, StoreStats, check_slot, hold_bytes
from .datafile import DataFile, open_ephemeral
from .errors import ModelMismatchError
from .faults import FaultPolicy
from .fileio import DiskIO
from .index import Entry, Index, encode_meta
from .persist import bind_model, open_persistent, reset_space, save_index
from .settings import StoreSettings
from .writer import WriteItem, WriteQueue

__all__ = ["Blob", "BlobStore", "StoreStats"]

_COUNTERS = ("num_hits", "num_misses", "num_evictions", "bytes_written", "num_dropped")
_COUNTERS += ("num_tampered", "num_failed")


class BlobStore(FaultPolicy, lifecycle.ProcessHooks):
    """Encrypted, budgeted store of byte records keyed by ``(key: bytes, kind: str)``.

    Ephemeral by default (random key in memory, nameless file in a private 0700 folder);
    persistent when ``settings.persist_path`` is set; every call is a cheap no-op miss when
    the disk tier is off. Thread-safe. Use as a context manager or call ``close()``.
    Implements the engine's ``Tier`` protocol (forkv.engine.cache.tiers) as a tier of bytes.
    """

    holds_arrays = False  # Tier protocol: records arrive serialised, leave as a Blob

    def __init__(self, settings: StoreSettings | None = None, *, io: DiskIO | None = None) -> None:
        self.settings = settings if settings is not None else StoreSettings.from_env()
        self._io = io or DiskIO()
        self._lock = threading.RLock()
        self._readers = threading.Condition(self._lock)
        self._num_reading = 0
        self._pid = os.getpid()
        self._file: DataFile | None = None
        self._index = Index()
        self._pending: dict[tuple[bytes, str], WriteItem] = {}
        self._order: Callable[[bytes, str], Any] | None = None
        self._budget = self.settings.disk_budget
        self._next_generation = 1
        self._dirty = False  # persistent: the index changed since it was last saved
        self._epoch = 0  # bumps on wipe/disable: in-flight writes from before are void
        self._enabled = self._degraded = self._closed = False
        self._read_only = False  # disk full: serve what is written, write nothing new
        self._warned: set[str] = set()
        self._read_faults = 0
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._queue = WriteQueue(
            self._write_one, self.settings.queue_max, self.settings.queue_bytes
        )
        if self.settings.mode == "off":
            return
        if self.settings.mode == "persistent":
            # The user asked for this file: a wrong key or unsafe path is their error to see.
            self._file, self._index, self._next_generation = open_persistent(
                self.settings, self._io
            )
        else:
            try:
                self._file = open_ephemeral(self._io, self.settings.disk_dir)
            except OSError as exc:  # includes UnsafePathError
                self._warn("open", f"disk tier off: cannot create its private folder ({exc})")
                self._degraded = True
                return
        self._enabled = True
        lifecycle.register(self, handle_signals=self.settings.handle_signals)

    # -- public API ---------------------------------------------------------------------

    def put(
        self, key: bytes, kind: str, data: bytes | memoryview, meta: dict[str, str] | None = None
    ) -> bool:
        """Queue a record for the writer; False if dropped (off, degraded, too big, queue full).

        ``bytes`` are kept without a copy until written; other buffers are copied once, so the
        caller may reuse them at once.
        """
        slot = check_slot(key, kind)
        meta_bytes = encode_meta(meta)
        item = WriteItem(slot[0], kind, hold_bytes(data), meta_bytes, dict(meta or {}))
        with self._lock:
            if not self._enabled or self._read_only:
                self._counts["num_dropped"] += self._degraded
                return False
            if Allocator.round(sealed_size(item.nbytes)) > self._budget or not self._queue.offer(
                item
            ):
                self._counts["num_dropped"] += 1
                return False
            self._pending[slot] = item  # a newer put of the slot supersedes a queued one
            return True

    def get(self, key: bytes, kind: str) -> Blob | None:
        """The record, verified; ``None`` if absent, evicted, tampered or unreadable."""
        slot = check_slot(key, kind)
        found = self._find(slot)
        if found is None:
            return None
        if isinstance(found, WriteItem):
            return Blob(found.as_bytes(), dict(found.meta))
        entry, datafile = found
        data = None
        try:
            data = datafile.read_record(entry, self._aad(slot, entry))
        except Exception as exc:  # noqa: BLE001 - auth failure, I/O error, anything: a miss
            self._on_read_fault(slot, entry, exc)
        finally:
            self._end_read(is_hit=data is not None)
        return None if data is None else Blob(data, dict(entry.meta))

    def get_into(self, key: bytes, kind: str, alloc: Callable[[int], Any]) -> Blob | None:
        """Like ``get``, but the record is decrypted straight into ``alloc(length)`` (a writable
        buffer of at least ``length`` bytes, e.g. the caller's scratch): no plaintext ``bytes``
        is made. The Blob's ``data`` is a view of that buffer's first ``length`` bytes. After a
        failed verification the buffer holds zeros, never unverified plaintext.
        """
        slot = check_slot(key, kind)
        found = self._find(slot)
        if found is None:
            return None
        if isinstance(found, WriteItem):
            out = memoryview(alloc(found.nbytes)).cast("B")[: found.nbytes]
            out[:] = memoryview(found.data).cast("B")  # queued data is immutable: no lock needed
            return Blob(out, dict(found.meta))
        entry, datafile = found
        is_hit = False
        try:
            out = memoryview(alloc(entry.length)).cast("B")[: entry.length]
            try:
                datafile.read_record_into(entry, self._aad(slot, entry), out)
                is_hit = True
            except Exception as exc:  # noqa: BLE001 - auth failure, I/O error, anything: a miss
                self._on_read_fault(slot, entry, exc)
        finally:
            self._end_read(is_hit=is_hit)
        return Blob(out, dict(entry.meta)) if is_hit else None

    def contains(self, key: bytes, kind: str) -> bool:
        """Whether a record is queued or indexed (not verified; ``get`` may still miss)."""
        slot = check_slot(key, kind)
        with self._lock:
            return self._enabled and (slot in self._pending or slot in self._index)

    def delete(self, key: bytes, kind: str) -> None:
        """Forget a record (queued or written); its space is reused."""
        slot = check_slot(key, kind)
        with self._lock:
            self._pending.pop(slot, None)
            entry = self._index.pop(slot)
            if entry is not None and self._enabled:
                self._release(entry.offset, entry.extent)
                self._dirty = True

    def bind_model(self, fingerprint: bytes) -> None:
        """Tie a persistent store to one model (a 32-byte fingerprint, as block keys use).

        The first model is recorded in the authenticated header; another model raises
        ``ModelMismatchError`` and closes this store. Ephemeral stores live as long as one
        process and one engine: nothing to record.
        """
        with self._lock:
            if not self._enabled or self.settings.mode != "persistent":
                return
            try:
                bind_model(self._file, fingerprint)
                return
            except OSError as exc:
                self._on_write_fault(exc, "header")
                return
            except ModelMismatchError as exc:
                error = exc
        self.close()  # outside the lock: close() joins the writer thread
        raise error

    def discard(self, key: bytes, kind: str) -> None:
        """``delete`` under the name of the engine's ``Tier`` protocol."""
        self.delete(key, kind)

    def set_eviction_order(self, order: Callable[[bytes, str], Any] | None) -> None:
        """Evict smallest ``order(key, kind)`` first (ties: least recently used); None = LRU."""
        with self._lock:
            self._order = order

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued records are on disk (persistent: and the index); False on timeout."""
        done = self._queue.drain(timeout)
        with self._lock:
            if done and self._enabled and self.settings.mode == "persistent":
                self._save_index()
        return done

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                self.settings.mode, self._enabled, self._degraded, self._budget,
                self._index.bytes_used, len(self._index), len(self._pending), **self._counts,
            )  # fmt: skip

    def wipe(self) -> None:
        """Drop every record, shrink the file, and start a new session key."""
        self._queue.discard()
        self._queue.drain()
        with self._lock:
            self._pending.clear()
            self._index.clear()
            self._epoch += 1
            if not self._enabled:
                return
            if self.settings.mode == "persistent":
                reset_space(self._file)  # keeps the live index until the new one is saved
            else:
                self._file.alloc.reset()
            self._file.reset_sessions()  # old ciphertext, wherever copied, has no key here now
            self._dirty = True
            self._read_only = False  # the space is back
            if self.settings.mode == "persistent":
                self._save_index()  # before truncating: a failed save leaves the old store whole
            self._guard("wipe", lambda: self._file.truncate(self._file.alloc.end))

    def close(self) -> None:
        """Persistent: flush and write the index. Ephemeral: discard the queue. Then remove our
        files, close descriptors and forget keys. Idempotent; later calls are no-op misses."""
        if os.getpid() != self._pid:
            return
        if self.settings.mode != "persistent" or not self._enabled:
            self._queue.discard()  # ephemeral records die with the key anyway
        self._queue.stop()  # writes what is left, then joins: no write may outlive the fd
        with self._lock:
            if self._closed:
                return
            if self._enabled and self.settings.mode == "persistent":
                self._save_index()
            self._closed = True
            self._enabled = False
            self._pending.clear()
            self._readers.wait_for(lambda: self._num_reading == 0)
            if self._file is not None:
                self._file.close(remove_folder=True)
            self._index.clear()
        lifecycle.unregister(self)

    def __enter__(self) -> BlobStore:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats()
        return f"BlobStore(mode={s.mode!r}, enabled={s.is_enabled}, records={s.num_records})"

    def __reduce__(self):
        raise TypeError("BlobStore cannot be pickled: its key lives only in this process.")

    @property
    def folder(self) -> str | None:
        """The private folder of an ephemeral store (for audits); None otherwise."""
        return self._file.folder.path if self._file and self._file.folder else None

    # -- writer side ---------------------------------------------------------------------

    def _write_one(self, item: WriteItem) -> None:
        slot = (item.key, item.kind)
        with self._lock:
            if self._pending.get(slot) is not item or not self._enabled:
                return  # superseded, deleted, wiped, disabled or full while queued
            extent = Allocator.round(sealed_size(item.nbytes))
            if not self._make_room(extent):
                del self._pending[slot]
                self._counts["num_dropped"] += 1
                return
            datafile, epoch = self._file, self._epoch
            offset = datafile.alloc.allocate(extent)
            generation = self._next_generation
            self._next_generation += 1
            session = datafile.current
            self._index.bytes_used += extent  # count in-flight bytes against the budget
        entry = Entry(
            offset, extent, item.nbytes, b"", generation, session, item.meta_bytes, item.meta
        )
        try:
            aad = self._aad(slot, entry)
            entry.nonce, written = datafile.write_record(offset, item.data, aad, session)
        except Exception as exc:  # noqa: BLE001 - the writer thread must survive anything
            with self._lock:
                if epoch != self._epoch:
                    return  # wiped or disabled meanwhile (its key may be gone): not a fault
                if self._pending.get(slot) is item:
                    del self._pending[slot]
                self._counts["num_dropped"] += 1
                self._index.bytes_used -= extent
                self._release(offset, extent)
                self._on_write_fault(exc)
            return
        with self._lock:
            self._counts["bytes_written"] += written
            if epoch != self._epoch:
                return  # wiped or disabled meanwhile: the allocator no longer knows this extent
            self._index.bytes_used -= extent
            if self._pending.get(slot) is item and self._enabled:
                del self._pending[slot]
                old = self._index.put(slot, entry)
                self._dirty = True
                if old is not None:
                    self._release(old.offset, old.extent)
            else:
                self._release(offset, extent)

    def _make_room(self, extent: int) -> bool:
        if extent > self._budget:
            return False
        try:
            evicted = self._index.evict(self._budget - extent, self._order)
        except Exception as exc:  # noqa: BLE001 - a broken hook must not stop the tier
            self._warn("order", f"eviction order hook failed ({exc!r}); using LRU")
            evicted = self._index.evict(self._budget - extent, None)
        for entry in evicted:
            self._release(entry.offset, entry.extent)
        self._counts["num_evictions"] += len(evicted)
        self._dirty |= bool(evicted)
        return self._index.bytes_used + extent <= self._budget

    def _release(self, offset: int, extent: int) -> None:
        if self._file.alloc.release(offset, extent):
            self._guard("truncate", lambda: self._file.truncate(self._file.alloc.end))

    def _save_index(self) -> None:
        if not self._dirty:
            return
        try:
            self._counts["bytes_written"] += save_index(
                self._file, self._index, self._next_generation
            )
            self._dirty = False
        except Exception as exc:  # noqa: BLE001
            self._on_write_fault(exc, "index")

    def _find(self, slot: tuple[bytes, str]) -> WriteItem | tuple[Entry, DataFile] | None:
        """Look a slot up for a read: the queued item (a hit), or the indexed entry and file
        (registered as a reader: call ``_end_read``), or None (a miss). Counts both."""
        with self._lock:
            if not self._enabled:
                self._counts["num_misses"] += self.settings.mode != "off"
                return None
            item = self._pending.get(slot)
            if item is not None:
                self._counts["num_hits"] += 1
                return item
            entry = self._index.touch(slot)
            if entry is None:
                self._counts["num_misses"] += 1
                return None
            self._num_reading += 1  # close() waits for us before closing the descriptor
            return entry, self._file

    def _end_read(self, *, is_hit: bool) -> None:
        """A read registered by ``_find`` is over (a fault was already counted as a miss)."""
        with self._lock:
            self._num_reading -= 1
            self._readers.notify_all()
            if is_hit:
                self._counts["num_hits"] += 1
                self._read_faults = 0

    def _aad(self, slot: tuple[bytes, str], entry: Entry) -> bytes:
        return make_aad(
            self._file.store_id, slot[0], slot[1], entry.generation, entry.length, entry.meta_bytes
        )
