"""The in-memory index: (key, kind) -> where a sealed record lives and how to verify it.

Knows: entries (offset, extent, plaintext length, nonce, generation, session, metadata),
recency order for LRU, eviction candidates under a custom order, and a JSON form for the
persistent store's sealed index. Does not know: files, ciphers or locks (the store locks).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_KEY_BYTES", "MAX_KIND_BYTES", "MAX_META_BYTES", "Entry", "Index", "encode_meta"]

MAX_KEY_BYTES = 1024
MAX_KIND_BYTES = 64
MAX_META_BYTES = 64 << 10
Slot = tuple[bytes, str]


def encode_meta(meta: dict[str, str] | None) -> bytes:
    """Canonical bytes of a metadata dict (sorted JSON); they go into the record's AAD."""
    if not meta:
        return b"{}"
    if not isinstance(meta, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
    ):
        raise TypeError("meta must be a dict[str, str]; encode other values as strings.")
    raw = json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )
    if len(raw) > MAX_META_BYTES:
        raise ValueError(f"meta is {len(raw)} bytes encoded; the limit is {MAX_META_BYTES}.")
    return raw


@dataclass(slots=True)
class Entry:
    offset: int
    extent: int  # bytes reserved in the file (sealed size rounded to the grain)
    length: int  # plaintext bytes
    nonce: bytes
    generation: int  # store-wide write counter: an older version of a slot cannot replay
    session: int  # which session key sealed it
    meta_bytes: bytes = b"{}"
    meta: dict[str, str] = field(default_factory=dict)


class Index:
    """Entries in recency order (oldest first); the store holds the lock."""

    __slots__ = ("_entries", "bytes_used")

    def __init__(self) -> None:
        self._entries: OrderedDict[Slot, Entry] = OrderedDict()
        self.bytes_used = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, slot: Slot) -> bool:
        return slot in self._entries

    def get(self, slot: Slot) -> Entry | None:
        return self._entries.get(slot)

    def touch(self, slot: Slot) -> Entry | None:
        entry = self._entries.get(slot)
        if entry is not None:
            self._entries.move_to_end(slot)
        return entry

    def put(self, slot: Slot, entry: Entry) -> Entry | None:
        """Insert as most recent; return the entry it replaced, if any."""
        old = self.pop(slot)
        self._entries[slot] = entry
        self.bytes_used += entry.extent
        return old

    def pop(self, slot: Slot) -> Entry | None:
        entry = self._entries.pop(slot, None)
        if entry is not None:
            self.bytes_used -= entry.extent
        return entry

    def clear(self) -> None:
        self._entries.clear()
        self.bytes_used = 0

    def items(self) -> list[tuple[Slot, Entry]]:
        return list(self._entries.items())

    def values(self) -> list[Entry]:
        return list(self._entries.values())

    def evict(self, target: int, order: Callable[[bytes, str], Any] | None) -> list[Entry]:
        """Pop entries until ``bytes_used <= target``: least recently used first, or smallest
        ``order(key, kind)`` first (ties: LRU). Returns what it popped; the caller frees it."""
        if self.bytes_used <= target:
            return []
        slots = list(self._entries)
        if order is not None:
            slots.sort(key=lambda slot: order(*slot))  # stable sort: ties stay in LRU order
        evicted = []
        for slot in slots:
            if self.bytes_used <= target:
                break
            evicted.append(self.pop(slot))
        return evicted

    def to_json(self, sessions: dict[int, int] | None = None) -> list[list[Any]]:
        """Rows for the sealed index; ``sessions`` renumbers session ids (pruned table)."""
        remap = sessions or {}
        return [
            [
                key.hex(),
                kind,
                e.offset,
                e.extent,
                e.length,
                e.nonce.hex(),
                e.generation,
                remap.get(e.session, e.session),
                e.meta,
            ]
            for (key, kind), e in self._entries.items()
        ]

    @classmethod
    def from_json(cls, rows: list[list[Any]]) -> Index:
        """Rebuild from ``to_json`` rows; raises ValueError/TypeError on malformed rows."""
        index = cls()
        for key_hex, kind, offset, extent, length, nonce_hex, generation, session, meta in rows:
            for value in (offset, extent, length, generation, session):
                if type(value) is not int or value < 0:
                    raise ValueError("index row holds a negative or non-integer field")
            if not all(isinstance(v, str) for v in (key_hex, kind, nonce_hex)):
                raise TypeError("index row holds a non-string key, kind or nonce")
            slot = (bytes.fromhex(key_hex), kind)
            meta_bytes = encode_meta(meta)
            index.put(
                slot,
                Entry(
                    offset,
                    extent,
                    length,
                    bytes.fromhex(nonce_hex),
                    generation,
                    session,
                    meta_bytes,
                    dict(meta),
                ),
            )
        return index
