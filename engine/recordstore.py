"""Where checkpoint records live: a RAM tier (byte budget, LRU) over an optional disk tier.

The disk tier is anything with the blob-store interface (`forkv.security.BlobStore`: put / get
/ contains / delete / set_eviction_order / flush / stats), which seals records before they touch
the disk. Window and state records go to disk as soon as they are made and leave RAM, so RAM
grows with live sequences, not with history; global records stay hot and spill under the RAM
budget. Eviction takes later blocks before earlier ones, and within a block window records
before state before global, so what survives is a restorable prefix as long as the budget
allows (a restore at block k needs every global record before it). Knows nothing about models.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from forkv.security.blob import ThreadScratch

from . import codec
from .layout import CacheKind
from .records import Record

_SCRATCH_KEEP = 64 << 20  # keep a read buffer up to this size per thread
_KIND_ORDER = {CacheKind.WINDOW: 0, CacheKind.STATE: 1, CacheKind.EXTRA: 1, CacheKind.GLOBAL: 2}


@dataclass(slots=True)
class TierStats:
    ram_bytes: int = 0
    ram_records: int = 0
    ram_evictions: int = 0
    spilled: int = 0  # records moved from RAM to disk
    bytes_put: int = 0  # array bytes of every record put, wherever it went
    disk_puts: int = 0
    disk_reads: int = 0
    disk_misses: int = 0
    decode_errors: int = 0
    by_kind: dict = field(default_factory=dict)  # kind -> RAM bytes


class RecordStore:
    def __init__(self, ram_budget: int = 2 << 30, disk=None, block_size: int = 256,
                 write_through: bool = True):
        self.ram_budget = ram_budget
        self.disk = disk
        self.block_size = block_size
        # With a disk tier, window/state records go straight to it (see module docstring).
        self.write_through = write_through and disk is not None
        self._ram: OrderedDict[tuple[bytes, CacheKind], Record] = OrderedDict()
        self._blocks: dict[bytes, int] = {}  # key -> block index, to steer disk eviction
        self._lock = threading.RLock()
        self._scratch = ThreadScratch(_SCRATCH_KEEP)  # decode copies out of it at once
        self.stats = TierStats()
        if disk is not None:
            disk.set_eviction_order(self._disk_order)

    # -- the interface the checkpointer uses -----------------------------------------------
    def put(self, key: bytes, record: Record) -> None:
        with self._lock:
            self.stats.bytes_put += record.nbytes
            self._blocks[key] = record.block
            if self.write_through and record.kind is not CacheKind.GLOBAL:
                if self._to_disk(key, record):
                    return
            slot = (key, record.kind)
            if slot in self._ram:
                self._drop(slot)
            self._ram[slot] = record
            self._account(record, +1)
            self._enforce_budget()

    def get(self, key: bytes, kind: CacheKind) -> Record | None:
        with self._lock:
            record = self._ram.get((key, kind))
            if record is not None:
                self._ram.move_to_end((key, kind))
                return record
        if self.disk is None:
            return None
        if hasattr(self.disk, "get_into"):  # decrypt into our scratch: no plaintext bytes
            blob = self.disk.get_into(key, kind.value, self._scratch)
        else:
            blob = self.disk.get(key, kind.value)
        if blob is None:
            self.stats.disk_misses += 1
            return None
        self.stats.disk_reads += 1
        try:
            record = codec.decode(blob.data, self.block_size)
        except codec.CodecError:
            self.stats.decode_errors += 1
            self.disk.delete(key, kind.value)
            return None
        return record if record.kind is kind else None

    def contains(self, key: bytes, kind: CacheKind) -> bool:
        with self._lock:
            if (key, kind) in self._ram:
                return True
        return self.disk is not None and self.disk.contains(key, kind.value)

    def discard(self, key: bytes, kind: CacheKind) -> None:
        """Forget a record everywhere (it failed verification or its owner is gone)."""
        with self._lock:
            if (key, kind) in self._ram:
                self._drop((key, kind))
        if self.disk is not None:
            self.disk.delete(key, kind.value)

    def flush(self) -> None:
        if self.disk is not None:
            self.disk.flush()

    def close(self) -> None:
        """Flush and close the disk tier. A persistent store first receives the RAM tier's
        records too, so a restart can restore everything this process checkpointed."""
        if self.disk is None:
            return
        if self.disk.stats().mode == "persistent":
            with self._lock:
                for slot in list(self._ram):
                    self._to_disk(slot[0], self._drop(slot))
        self.disk.flush()
        self.disk.close()

    @property
    def ram_bytes(self) -> int:
        return self.stats.ram_bytes

    # -- internals ---------------------------------------------------------------------------
    def _to_disk(self, key: bytes, record: Record) -> bool:
        ok = self.disk.put(key, record.kind.value, codec.encode(record, self.block_size),
                           {"block": str(record.block)})
        if ok:
            self.stats.disk_puts += 1
        return ok

    def _account(self, record: Record, sign: int) -> None:
        n = record.nbytes * sign
        self.stats.ram_bytes += n
        self.stats.ram_records += sign
        k = record.kind.value
        self.stats.by_kind[k] = self.stats.by_kind.get(k, 0) + n

    def _drop(self, slot) -> Record:
        record = self._ram.pop(slot)
        self._account(record, -1)
        return record

    def _victim_order(self, slot) -> tuple:
        key, kind = slot
        return (-self._blocks.get(key, 0), _KIND_ORDER[kind])

    def _enforce_budget(self) -> None:
        if self.stats.ram_bytes <= self.ram_budget:
            return
        # Least valuable first; among equals, least recently used (OrderedDict order).
        order = sorted(self._ram, key=self._victim_order)
        for slot in order:
            if self.stats.ram_bytes <= self.ram_budget:
                break
            record = self._drop(slot)
            self.stats.ram_evictions += 1
            if self.disk is not None and self._to_disk(slot[0], record):
                self.stats.spilled += 1

    def _disk_order(self, key: bytes, kind: str) -> tuple:
        return (-self._blocks.get(key, 0), _KIND_ORDER.get(CacheKind(kind), 3))
