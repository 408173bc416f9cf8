"""The vision-feature cache: an image's vision-tower output, by image digest, LRU under a byte
budget, so a repeated image skips the tower (and its decoding and preprocessing).

Each image also leaves its patch grid in a small count-bounded table, which is all a prompt
needs to lay out the image's tokens; the features themselves are only needed when a chunk that
overlaps the image is computed (a restore past the image needs none). One cache belongs to one
loaded model (features depend on the weights). Knows nothing about prompts or checkpoints.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_FEATURE_BYTES = 512 << 20
_MAX_GRIDS = 4096


@dataclass(slots=True)
class FeatureStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes: int = 0
    entries: int = 0
    tower_runs: int = 0
    tower_s: float = 0.0  # seconds spent in the vision tower

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


class FeatureCache:
    def __init__(self, budget: int = DEFAULT_FEATURE_BYTES):
        self.budget = budget
        self._features: OrderedDict[bytes, object] = OrderedDict()  # digest -> mx.array
        self._grids: OrderedDict[bytes, tuple[int, int, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = FeatureStats()
        self.on_grow = None  # the RAM budget's settle (engine/cache/budget.py)

    def get(self, digest: bytes):
        """The features of an image, or None (counted as a hit or a miss)."""
        with self._lock:
            features = self._features.get(digest)
            if features is None:
                self.stats.misses += 1
                return None
            self._features.move_to_end(digest)
            self.stats.hits += 1
            return features

    def put(self, digest: bytes, features) -> None:
        with self._lock:
            if digest in self._features or features.nbytes > self.budget:
                return
            self._features[digest] = features
            self.stats.bytes += features.nbytes
            self._shrink(self.budget)
            self.stats.entries = len(self._features)
        if self.on_grow is not None:
            self.on_grow()

    @property
    def nbytes(self) -> int:
        return self.stats.bytes

    def shrink_to(self, limit: int) -> None:
        """Evict least recently used features until at most `limit` bytes stay (the RAM
        budget's pressure)."""
        with self._lock:
            self._shrink(min(limit, self.budget))
            self.stats.entries = len(self._features)

    def _shrink(self, limit: int) -> None:
        while self._features and self.stats.bytes > limit:
            _, old = self._features.popitem(last=False)
            self.stats.bytes -= old.nbytes
            self.stats.evictions += 1

    def grid(self, digest: bytes) -> tuple[int, int, int] | None:
        with self._lock:
            return self._grids.get(digest)

    def put_grid(self, digest: bytes, grid: tuple[int, int, int]) -> None:
        with self._lock:
            self._grids[digest] = grid
            self._grids.move_to_end(digest)
            if len(self._grids) > _MAX_GRIDS:
                self._grids.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._features.clear()
            self._grids.clear()
            self.stats.bytes = self.stats.entries = 0
