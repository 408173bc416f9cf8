"""The caches of the rows that decode together: join a row, drop rows, take one out, swap one.

Rows are merged with mlx-lm's batch caches — `BatchKVCache` for global layers,
`BatchRotatingKVCache` for sliding-window layers, a batched `ArraysCache` for recurrent state,
a `CacheList` of those — which left-pad shorter rows and mask the padding, so one forward pass
serves every row. A row joins at the end (`add`), leaves by `filter`, and is copied out as
plain single-row caches (`extract`). `replace` (used after a decode-boundary recompute) drops a
row and appends its new state, so row indices are not stable: the scheduler keeps its row list
in the same order.

Caches whose record kind says mlx-lm cannot merge them exactly (chunked, other non-trimmable
state, rotating with `keep`, anything no kind knows) make the batch hold one row, as its plain
caches, and nothing is merged. Given a `copy` (text models), a row decoding alone is held as
its plain caches too, merged only when a second row joins and taken out again when it is left
alone: a batch cache costs a lone row its mask, per-layer offset arrays and padded attention
(~0.8 ms of a ~12 ms SmolLM2 step), and the kernels give a row the same bits either way.
Knows nothing about tokens, sampling or stores.
"""

from __future__ import annotations

from ..native.kvcache import own_tails


def merge_blocker(caches: list) -> str | None:
    """Why these caches (from `make_cache()`) cannot be merged into a batch, or None if they can."""
    from ..cache.kinds import kind_of

    for cache in caches:
        kind = kind_of(cache)  # by exact class, as for checkpoints: a subclass may differ
        if kind is None or not kind.can_merge(cache):
            return type(cache).__name__
    return None


class BatchCache:
    def __init__(self, mergeable: bool = True, copy=None):
        """`copy(row)`: new caches equal to `row` (live.share); given, a lone
        row decodes on its plain caches (the row handed to `add` may be kept elsewhere, as
        the prefix cache keeps a prompt's cache, so the batch decodes on its copy)."""
        self.mergeable = mergeable
        self.copy = copy
        self.solo = copy is not None and mergeable
        self.caches: list | None = None  # per layer; None while no row decodes
        self.num_rows = 0

    @property
    def is_plain(self) -> bool:
        """Whether `caches` is one row's own list (not mlx-lm batch caches)."""
        return not self.mergeable or (self.solo and self.num_rows == 1)

    def add(self, row: list) -> None:
        """Append a row given as single-row caches (which must not be used afterwards)."""
        if not self.mergeable:
            assert self.num_rows == 0, "a batch of unmergeable caches holds one row"
            self.caches = row
            own_tails(row)  # (the live pool's entry of the prompt holds other objects)
        elif self.solo and self.num_rows == 0:
            self.caches = self.copy(row)
            own_tails(self.caches)  # (new objects: the pool may keep the row's own)
        else:
            if self.solo and self.num_rows == 1:  # the lone row joins a batch
                self.caches = [type(c).merge([c]) for c in self.caches]
            merged = [type(c).merge([c]) for c in row]
            if self.caches is None:
                self.caches = merged
            else:
                for ours, theirs in zip(self.caches, merged):
                    ours.extend(theirs)
        self.num_rows += 1

    def remove(self, indices: list[int]) -> None:
        drop = set(indices)
        keep = [i for i in range(self.num_rows) if i not in drop]
        if not keep:
            self.caches, self.num_rows = None, 0
            return
        if len(keep) < self.num_rows:
            if self.solo and len(keep) == 1:  # left alone: back to its plain caches
                self.caches = [c.extract(keep[0]) for c in self.caches]
            else:
                for c in self.caches:
                    c.filter(keep)
            self.num_rows = len(keep)

    def extract(self, index: int) -> list:
        """Single-row caches holding row `index` (copies; the live list when plain)."""
        if self.is_plain:
            return self.caches
        return [c.extract(index) for c in self.caches]

    def replace(self, index: int, row: list) -> None:
        """Give row `index` a new state; the row moves to the end."""
        if self.is_plain:
            self.caches = row
            return
        self.remove([index])
        self.add(row)

    def state(self) -> list:
        return [c.state for c in self.caches] if self.caches is not None else []
