"""The `Tier` protocol every level of checkpoint storage implements, and the RAM tier.

A `RecordStore` holds an ordered list of tiers, fastest first: the RAM tier, then tiers that
keep records as bytes (the encrypted disk tier `forkv.security.BlobStore`, the benchmark's
plaintext tier, the tests' double). A tier that `holds_arrays` takes and gives back `Record`s
with live arrays (no copy, no decode); any other tier takes a record serialised by
`codec.encode` and gives back a `Blob`, read into a buffer the caller allocates. Tiers keep
their own budgets and evict in the order the store sets. Knows nothing about models.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .records import Record

EvictionOrder = Callable[[bytes, str], Any]  # smallest first; ties: least recently used


@runtime_checkable
class Tier(Protocol):
    """One level of record storage, addressed by (block key, record kind name)."""

    holds_arrays: bool  # True: put/get_into exchange Records; False: codec bytes and Blobs

    def put(self, key: bytes, kind: str, data, meta: dict[str, str] | None = None) -> bool:
        """Store a record; False if this tier refused it (full queue, too big, off)."""

    def get_into(self, key: bytes, kind: str, alloc: Callable[[int], Any]) -> Any | None:
        """The record (a Record, or a Blob whose data lies in `alloc(n)`); None on a miss."""

    def contains(self, key: bytes, kind: str) -> bool:
        """Whether the record is here (not verified: get_into may still miss)."""

    def discard(self, key: bytes, kind: str) -> None:
        """Forget the record, if held."""

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what was put is stored; False on timeout."""

    def stats(self) -> Any:
        """The tier's counters; `mode` names it ("memory", "ephemeral", "persistent", ...)."""

    def set_eviction_order(self, order: EvictionOrder | None) -> None:
        """Evict the smallest `order(key, kind)` first when over budget."""

    def close(self) -> None:
        """Release what the tier holds (a persistent tier keeps its records)."""


@dataclass(slots=True, frozen=True)
class RamStats:
    mode: str
    num_records: int
    bytes: int
    num_evictions: int
    by_kind: dict = field(default_factory=dict)  # kind -> bytes


class RamTier:
    """Records with their live arrays, within a byte budget. Records evicted to stay within
    it go to `spill` (the store hands them to the next tier)."""

    holds_arrays = True

    def __init__(self, budget: int, spill: Callable[[bytes, Record], None] | None = None,
                 namespace_budget: int = 0):
        self.budget = budget
        self.namespace_budget = namespace_budget  # 0: none (namespaces share `budget`)
        self._by_namespace: dict[bytes, int] = {}
        self.spill = spill
        self._records: OrderedDict[tuple[bytes, str], Record] = OrderedDict()
        self._order: EvictionOrder | None = None
        self._lock = threading.RLock()
        self._bytes = 0
        self._evictions = 0
        self._by_kind: dict[str, int] = {}
        self.on_grow: Callable[[], None] | None = None  # the RAM budget's settle (budget.py)

    def put(self, key: bytes, kind: str, data: Record, meta: dict[str, str] | None = None) -> bool:
        with self._lock:
            if (key, kind) in self._records:
                self._drop((key, kind))
            self._records[(key, kind)] = data
            self._account(data, kind, +1)
            if self.namespace_budget:
                self._enforce(self.namespace_budget, data.namespace)
            self._enforce_budget()
        if self.on_grow is not None:
            self.on_grow()
        return True

    def get_into(self, key: bytes, kind: str, alloc=None) -> Record | None:
        with self._lock:
            record = self._records.get((key, kind))
            if record is not None:
                self._records.move_to_end((key, kind))
            return record

    def contains(self, key: bytes, kind: str) -> bool:
        with self._lock:
            return (key, kind) in self._records

    def discard(self, key: bytes, kind: str) -> None:
        with self._lock:
            if (key, kind) in self._records:
                self._drop((key, kind))

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def stats(self) -> RamStats:
        with self._lock:
            return RamStats("memory", len(self._records), self._bytes, self._evictions,
                            dict(self._by_kind))

    def set_eviction_order(self, order: EvictionOrder | None) -> None:
        self._order = order

    def close(self) -> None:
        with self._lock:
            for slot in list(self._records):
                self._drop(slot)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def shrink_to(self, limit: int) -> None:
        """Spill records (in eviction order) until at most `limit` bytes stay (the RAM
        budget's pressure)."""
        with self._lock:
            self._enforce(min(limit, self.budget))

    def items(self) -> list[tuple[tuple[bytes, str], Record]]:
        """((key, kind), record) of every record held, least recently used first."""
        with self._lock:
            return list(self._records.items())

    def take_all(self) -> list[tuple[bytes, Record]]:
        """Remove and return every record (a persistent store keeps them on close)."""
        with self._lock:
            return [(slot[0], self._drop(slot)) for slot in list(self._records)]

    # -- internals ---------------------------------------------------------------------------
    def _account(self, record: Record, kind: str, sign: int) -> None:
        n = record.nbytes * sign
        self._bytes += n
        self._by_kind[kind] = self._by_kind.get(kind, 0) + n
        ns = self._by_namespace[record.namespace] = self._by_namespace.get(record.namespace,
                                                                           0) + n
        if not ns:
            del self._by_namespace[record.namespace]

    def _drop(self, slot) -> Record:
        record = self._records.pop(slot)
        self._account(record, slot[1], -1)
        return record

    def _enforce_budget(self) -> None:
        self._enforce(self.budget)

    def _enforce(self, budget: int, namespace: bytes | None = None) -> None:
        """Evict (spill) until the tier, or one namespace's records, fit in `budget`."""
        held = (lambda: self._bytes) if namespace is None else (
            lambda: self._by_namespace.get(namespace, 0))
        if held() <= budget:
            return
        # Least valuable first; among equals, least recently used (the dict's order).
        victims = [slot for slot, r in self._records.items()
                   if namespace is None or r.namespace == namespace]
        if self._order is not None:
            victims.sort(key=lambda slot: self._order(*slot))
        for slot in victims:
            if held() <= budget:
                break
            record = self._drop(slot)
            self._evictions += 1
            if self.spill is not None:
                self.spill(slot[0], record)
