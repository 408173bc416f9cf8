"""Free-space bookkeeping of the data file: extents, best-fit reuse, tail shrinking.

Knows: which byte ranges of the file are in use and which are free; rounds sizes to a
64-byte grain; coalesces neighbours; reports when the tail became free so the file can be
truncated. Does not know: what lives in an extent, or the disk budget (the store decides).
"""

from __future__ import annotations

import bisect

__all__ = ["GRAIN", "Allocator"]

GRAIN = 64  # small enough for tiny records, large enough to keep the free list short


class Allocator:
    """Extents of ``[start, end)``; ``end`` is where the file should end."""

    __slots__ = ("_free", "_sizes", "end", "start")

    def __init__(self, start: int = 0) -> None:
        self.start = start
        self.end = start
        self._free: list[int] = []  # sorted offsets of free extents
        self._sizes: dict[int, int] = {}  # offset -> size of each free extent

    @staticmethod
    def round(size: int) -> int:
        return -(-size // GRAIN) * GRAIN

    @property
    def free_bytes(self) -> int:
        return sum(self._sizes.values())

    @property
    def used_bytes(self) -> int:
        return self.end - self.start - self.free_bytes

    def allocate(self, size: int) -> int:
        """Offset of a free extent of ``round(size)`` bytes; best fit, else grow the tail."""
        size = self.round(size)
        assert size > 0
        best = None
        for offset in self._free:  # O(free extents); the list stays short in practice
            have = self._sizes[offset]
            if have >= size and (best is None or have < self._sizes[best]):
                best = offset
                if have == size:
                    break
        if best is None:
            offset, self.end = self.end, self.end + size
            return offset
        have = self._sizes.pop(best)
        self._free.remove(best)
        if have > size:
            self._insert(best + size, have - size)
        return best

    def release(self, offset: int, size: int) -> bool:
        """Free an extent; return True if the tail shrank (the file can be truncated)."""
        size = self.round(size)
        assert self.start <= offset and offset + size <= self.end, "extent outside the file"
        i = bisect.bisect_left(self._free, offset)
        assert i == len(self._free) or self._free[i] >= offset + size, "double free"
        assert i == 0 or self._free[i - 1] + self._sizes[self._free[i - 1]] <= offset, "double free"
        if i < len(self._free) and self._free[i] == offset + size:  # merge the right neighbour
            size += self._sizes.pop(self._free.pop(i))
        if i > 0 and self._free[i - 1] + self._sizes[self._free[i - 1]] == offset:  # and the left
            offset = self._free[i - 1]
            size += self._sizes[offset]
            self._sizes[offset] = size
        else:
            self._insert(offset, size)
        if offset + size == self.end:
            self._free.remove(offset)
            del self._sizes[offset]
            self.end = offset
            return True
        return False

    def mark_used(self, extents: list[tuple[int, int]]) -> None:
        """Rebuild from the extents a loaded index says are in use (must not overlap)."""
        assert self.end == self.start and not self._free, "mark_used needs a fresh allocator"
        cursor = self.start
        for offset, size in sorted(extents):
            size = self.round(size)
            if offset < cursor:
                raise ValueError(f"extent at {offset} overlaps the previous one")
            if offset > cursor:
                self._insert(cursor, offset - cursor)
            cursor = offset + size
        self.end = cursor

    def reset(self) -> None:
        self.end = self.start
        self._free.clear()
        self._sizes.clear()

    def _insert(self, offset: int, size: int) -> None:
        bisect.insort(self._free, offset)
        self._sizes[offset] = size
