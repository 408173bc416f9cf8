"""`NgramLog`: the compact n-gram index of what drafts are kept from.

Whole token sequences hashed at once (ngrams.py's `ngrams`, the same keys as its dict
`NgramIndex`) into a few sorted numpy arrays merged geometrically: 60-70 bytes a token against
the dict's ~320 (tracemalloc at 131,072 tokens). It holds a namespace's recent outputs, dropped
oldest first, and a finished request's own tokens, frozen until the next request that starts
with them takes them over (`rebase`). Lookups answer as the dict's do (`best_match`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .ngrams import _END, Keys, best_match, ngrams

__all__ = ["NgramLog"]


@dataclass(slots=True)
class _Segment:
    """Occurrences sorted by key, the most recent first within a key, and a bitmap of which
    keys may occur (most lookups miss: they pay a bit test, not a search)."""

    keys: np.ndarray  # int64, ascending
    at: np.ndarray  # int64, sequence id << 32 | end, descending within a key
    bits: bytes
    mask: int
    low: int  # the least and the greatest occurrence
    high: int
    key_at: tuple[memoryview, memoryview]  # keys and at, read as Python ints (no numpy call)

    @classmethod
    def make(cls, keys: np.ndarray, at: np.ndarray) -> _Segment:
        mask = (1 << min(30, max(6, (8 * len(keys) - 1).bit_length()))) - 1  # 8-16 bits a key
        present = np.zeros(mask + 1, bool)
        present[keys & mask] = True
        bits = np.packbits(present, bitorder="little").tobytes()
        low, high = (int(at.min()), int(at.max())) if len(at) else (0, -1)
        return cls(keys, at, bits, mask, low, high, (memoryview(keys), memoryview(at)))


class NgramLog:
    """Whole token sequences (int32 arrays) indexed by n-gram in a few sorted segments, a new
    one for each sequence added, merged while the older is no bigger (log2 segments). A
    dropped sequence's occurrences are skipped by lookups until `prune` or a merge."""

    def __init__(self):
        self.seqs: dict[int, Sequence[int]] = {}
        self._segs: list[_Segment] = []  # oldest first
        self._next_id = 0
        self._bits = bytearray(8)  # which keys & _mask any segment may hold: one bit test
        self._mask = 63  # for a key no segment holds (most lookups' every key)

    @property
    def num_entries(self) -> int:
        """Occurrences held, those of dropped sequences included."""
        return sum(len(s.keys) for s in self._segs)

    def add(self, tokens: Sequence[int]) -> int:
        """Index a sequence; returns its id."""
        self.extend(self._next_id, tokens, 0)
        return self._next_id - 1

    def extend(self, sid: int, tokens: Sequence[int], start: int,
               hashed: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Make `tokens` sequence `sid` (newer than every other) and index its n-grams ending
        past `start`; those up to `start` are indexed already, or in `hashed` (`ngrams` of
        them, to index with these)."""
        tokens = tokens if isinstance(tokens, array) else array("i", tokens)
        self.seqs[sid] = tokens
        self._next_id = max(self._next_id, sid + 1)
        keys, at = ngrams(tokens, start)
        if hashed is not None:
            keys, at = np.concatenate([keys, hashed[0]]), np.concatenate([at, hashed[1]])
        if not len(keys):
            return
        at |= sid << 32
        order = np.argsort(keys, kind="stable")  # the most recent first within a key
        self._segs.append(_Segment.make(keys[order], at[order]))
        while len(self._segs) > 1 and len(self._segs[-2].keys) <= len(self._segs[-1].keys):
            newer = self._segs.pop()
            self._segs[-1] = self._merge([newer, self._segs[-1]])
        self._note(keys)

    def _note(self, keys: np.ndarray | None = None) -> None:
        """Set `keys`' bits in the log's filter, or size it anew for every segment's keys
        (8-16 bits a key)."""
        if keys is None or self.num_entries > len(self._bits):
            self._mask = (1 << min(30, max(6, (8 * self.num_entries - 1).bit_length()))) - 1
            present = np.zeros(self._mask + 1, bool)
            for seg in self._segs:
                present[seg.keys & self._mask] = True
            self._bits = bytearray(np.packbits(present, bitorder="little"))
        else:  # bits of one byte or'ed together first (sorted: runs), then set
            b = np.sort(keys & self._mask)
            run = np.flatnonzero(np.diff(b >> 3, prepend=-1))
            bits = np.bitwise_or.reduceat(np.left_shift(1, b & 7).astype(np.uint8), run)
            np.frombuffer(self._bits, np.uint8)[b[run] >> 3] |= bits

    def drop(self, sid: int) -> None:
        """Forget a sequence; its occurrences stay until a merge or `prune` takes them out."""
        self.seqs.pop(sid, None)
        first = next(iter(self.seqs), self._next_id)  # (ids are added in order)
        while self._segs and self._segs[0].high >> 32 < first:
            del self._segs[0]  # every sequence in it dropped

    def rebase(self, sid: int, tokens: Sequence[int], shared: int) -> Sequence[int]:
        """Make `tokens` sequence `sid`, whose first `shared` tokens it holds already; every
        other sequence is forgotten, and the occurrences past `shared` taken out. Returns the
        first `shared` tokens as held (work in the occurrences past `shared`)."""
        held = self.seqs[sid][:shared]
        for other in [s for s in self.seqs if s != sid]:
            self.seqs.pop(other)
        cut = sid << 32 | shared
        for i, seg in enumerate(self._segs):
            if seg.high > cut or seg.low < sid << 32:
                self._segs[i] = self._merge([seg], cut)
        self._segs = [s for s in self._segs if len(s.keys)]  # (the filter: a superset still)
        self.seqs[sid] = tokens
        return held

    def prune(self) -> None:
        """Take dropped sequences' occurrences out (one segment, of live ones only)."""
        if self._segs:
            merged = self._merge(self._segs[::-1])
            self._segs = [merged] if len(merged.keys) else []
            self._note()

    def _merge(self, segs: list[_Segment], cut: int | None = None) -> _Segment:
        """The live occurrences of `segs` (newest first) as one segment; with `cut`, those of
        sequence cut >> 32 only, ending up to cut's end."""
        keys = np.concatenate([s.keys for s in segs])
        at = np.concatenate([s.at for s in segs])
        if cut is not None:
            live = (at <= cut) & (at >> 32 == cut >> 32)
        elif len(self.seqs) == self._next_id - (first := next(iter(self.seqs), 0)):
            live = at >= first << 32 if first else None  # only the oldest were dropped
        elif len(self.seqs) < self._next_id:
            live = np.isin(at >> 32, np.fromiter(self.seqs, np.int64, len(self.seqs)))
        else:
            live = None
        if live is not None and not live.all():
            keys, at = keys[live], at[live]
        order = np.argsort(keys, kind="stable")  # newer first within a key, as concatenated
        return _Segment.make(keys[order], at[order])

    def hits(self, key: int, limit: int) -> list[tuple[Sequence[int], int]]:
        """(sequence, end) of the `limit` most recent occurrences of `key` in live
        sequences."""
        out: list[tuple[Sequence[int], int]] = []
        low = key & 0x3FFFFFFF  # (a small int: cheaper bit tests; masks are narrower)
        b = low & self._mask
        if not self._bits[b >> 3] >> (b & 7) & 1:
            return out
        seqs = self.seqs
        for seg in reversed(self._segs):
            b = low & seg.mask
            if not seg.bits[b >> 3] >> (b & 7) & 1:
                continue
            keys, ats = seg.key_at
            i, size = bisect_left(keys, key), len(keys)
            while i < size and keys[i] == key:
                at = ats[i]
                i += 1
                seq = seqs.get(at >> 32)
                if seq is not None:
                    out.append((seq, at & _END))
                    if len(out) >= limit:
                        return out
        return out

    def best(self, tail: Sequence[int], keys: Keys | None = None
             ) -> tuple[int, Sequence[int], int] | None:
        return best_match(tail, (self,), keys)
