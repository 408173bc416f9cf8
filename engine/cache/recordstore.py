"""Where checkpoint records live: an ordered list of tiers (engine/cache/tiers.py), fastest first.

By default a RAM tier (byte budget, LRU) over an optional disk tier (the encrypted
`forkv.security.BlobStore`, which seals records before they touch the disk). Records whose
kind does not stay hot (window, state, ...: each is read only around its own block) go
straight to the first byte tier and leave RAM, so RAM grows with live sequences, not with
history; global records stay in RAM and spill to the next tier under the RAM budget. Every
tier evicts later blocks before earlier ones, and within a block by the kind's rank (window
before state before global), so what survives is a restorable prefix as long as the budget
allows (a restore at block k needs every global record before it). Knows nothing about models.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from forkv.security.blob import ThreadScratch

from . import codec
from . import kinds as _kinds
from .records import Record
from .tiers import RamTier, Tier

_SCRATCH_KEEP = 64 << 20  # keep a read buffer up to this size per thread


@dataclass(slots=True)
class TierStats:
    ram_bytes: int = 0
    ram_records: int = 0
    ram_evictions: int = 0
    spilled: int = 0  # records moved from RAM to the next tier
    bytes_put: int = 0  # array bytes of every record put, wherever it went
    disk_puts: int = 0  # records a byte tier accepted
    disk_reads: int = 0
    disk_misses: int = 0
    decode_errors: int = 0
    by_kind: dict = field(default_factory=dict)  # kind -> RAM bytes


class RecordStore:
    def __init__(self, ram_budget: int = 2 << 30, disk: Tier | None = None,
                 block_size: int = 256, write_through: bool = True,
                 tiers: list[Tier] | None = None, tenant_ram_budget: int = 0):
        """A RAM tier of `ram_budget` bytes (at most `tenant_ram_budget` of them per namespace,
        if set), then `disk` (if any), then `tiers` (if any)."""
        self.block_size = block_size
        self.write_through = write_through
        self.ram = RamTier(ram_budget, spill=self._spill, namespace_budget=tenant_ram_budget)
        self.tiers: list[Tier] = ([self.ram] + ([disk] if disk is not None else [])
                                  + list(tiers or ()))
        for tier in self.tiers:
            assert isinstance(tier, Tier), f"{type(tier).__name__} does not implement Tier"
            tier.set_eviction_order(self._disk_order)
        self._blocks: dict[bytes, int] = {}  # key -> block index, to steer eviction
        self._lock = threading.Lock()  # guards the counters
        self._scratch = ThreadScratch(_SCRATCH_KEEP)  # decode copies out of it at once
        self._counts = TierStats()

    # -- the interface the checkpointer uses -----------------------------------------------
    def put(self, key: bytes, record: Record) -> None:
        with self._lock:
            self._counts.bytes_put += record.nbytes
        self._blocks[key] = record.block
        if self.write_through and not _kinds.stays_hot(record.kind):
            for tier in self._byte_tiers():
                if self._put_bytes(tier, key, record):
                    self._discard_in(self.tiers[:self.tiers.index(tier)], key, record.kind)
                    return
        self.ram.put(key, record.kind, record)

    def get(self, key: bytes, kind: str) -> Record | None:
        record = self.ram.get_into(key, kind)
        if record is not None:
            return record
        byte_tiers = self._byte_tiers()
        for tier in byte_tiers:
            blob = tier.get_into(key, kind, self._scratch)  # decrypted into our scratch
            if blob is None:
                continue
            self._count("disk_reads")
            try:
                record = codec.decode(blob.data, self.block_size)
            except codec.CodecError:
                self._count("decode_errors")
                tier.discard(key, kind)
                continue
            # The payload's namespace is the record's (sealed with it); a tier that keeps the
            # metadata (the encrypted one binds it into the associated data) must agree.
            if record.kind == kind and blob.meta.get("ns", record.namespace.hex()) \
                    == record.namespace.hex():
                return record
        if byte_tiers:
            self._count("disk_misses")
        return None

    def contains(self, key: bytes, kind: str) -> bool:
        return any(tier.contains(key, kind) for tier in self.tiers)

    def discard(self, key: bytes, kind: str) -> None:
        """Forget a record everywhere (it failed verification or its owner is gone)."""
        self._discard_in(self.tiers, key, kind)

    def flush(self) -> None:
        for tier in self.tiers:
            tier.flush()

    def close(self) -> None:
        """Flush and close every tier. A persistent tier first receives the RAM tier's records
        too, so a restart can restore everything this process checkpointed."""
        keeper = next((t for t in self._byte_tiers()
                       if getattr(t.stats(), "mode", "") == "persistent"), None)
        if keeper is not None:
            for key, record in self.ram.take_all():
                self._put_bytes(keeper, key, record)
        for tier in self.tiers:
            tier.flush()
            tier.close()

    @property
    def stats(self) -> TierStats:
        ram = self.ram.stats()
        with self._lock:
            c = self._counts
            return TierStats(ram.bytes, ram.num_records, ram.num_evictions, c.spilled,
                             c.bytes_put, c.disk_puts, c.disk_reads, c.disk_misses,
                             c.decode_errors, ram.by_kind)

    @property
    def ram_bytes(self) -> int:
        return self.ram.stats().bytes

    @property
    def ram_budget(self) -> int:
        return self.ram.budget

    @property
    def disk(self) -> Tier | None:
        """The first tier after RAM (the encrypted disk tier by default), or None."""
        return self.tiers[1] if len(self.tiers) > 1 else None

    @disk.setter
    def disk(self, tier: Tier | None) -> None:
        rest = self.tiers[2:] if len(self.tiers) > 1 else []
        self.tiers = [self.ram] + ([tier] if tier is not None else []) + rest

    # -- internals ---------------------------------------------------------------------------
    def _byte_tiers(self) -> list[Tier]:
        return [t for t in self.tiers if not t.holds_arrays]

    def _put_bytes(self, tier: Tier, key: bytes, record: Record) -> bool:
        # The namespace goes into the record's associated data too (the meta is bound there).
        ok = tier.put(key, record.kind, codec.encode(record, self.block_size),
                      {"block": str(record.block), "ns": record.namespace.hex()})
        if ok:
            self._count("disk_puts")
        return ok

    def _spill(self, key: bytes, record: Record) -> None:
        """The RAM tier evicted a record: the next tier that takes it keeps it."""
        for tier in self.tiers[1:]:
            if tier.holds_arrays:
                if tier.put(key, record.kind, record):
                    self._count("spilled")
                    return
            elif self._put_bytes(tier, key, record):
                self._count("spilled")
                return

    def _discard_in(self, tiers, key: bytes, kind: str) -> None:
        for tier in tiers:
            tier.discard(key, kind)

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self._counts, name, getattr(self._counts, name) + 1)

    def _disk_order(self, key: bytes, kind: str) -> tuple:
        return (-self._blocks.get(key, 0), _kinds.evict_rank(kind))
