"""The one RAM budget: what an engine holds beyond the weights, and who gives way under pressure.

Four parts share it: the caches of running requests, fast reuse's live pool (live.py), the RAM
tier's records (tiers.py) and a vision model's feature cache (vision/features.py). A running
request is counted at admission as the most its caches can come to hold — its prompt plus
`max_tokens` on the model's `Footprint`, and a batch pads every row to its longest, so a set of
running requests counts as that many of the longest — which bounds what it holds through the
last decode step. The other parts are counted as they are. Each keeps its own cap inside the
budget (`live_cache_mib`, `ram_budget`, the feature cache's).

When the sum would pass the budget, `settle` shrinks the parts in a fixed order: the pool
evicts (least recently used first), then the RAM tier spills records to the next tier (the
encrypted disk tier; without one they are dropped: a miss later, recomputed), then the feature
cache evicts. A request the rest would not fit beside waits in the queue (`admits`) until
running ones finish: never rejected. One that needs more than the whole budget by itself runs
once nothing else does (and is counted and logged). Runs on the engine thread; knows nothing
about batches or models beyond the footprint it is given (measured once as the engine starts,
else read off the first request's caches, for which a second request waits).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

__all__ = ["BudgetStats", "Footprint", "RamBudget", "measure_footprint"]

_log = logging.getLogger(__name__)
# Shrunk in this order under pressure: the cheapest to lose first. A pool entry costs at most
# a fresh prefill of what records do not hold; a spilled record one disk read; a feature one
# run of the vision tower.
PARTS = ("pool", "records", "features")
_STEP = 256  # mlx-lm's K/V caches grow this many tokens at a time


@dataclass(slots=True, frozen=True)
class Footprint:
    """The bytes one request's caches hold at n tokens: each K/V leaf's bytes per token (up to
    the most tokens it keeps: a sliding window plus a prefill chunk), plus fixed state."""

    leaves: tuple[tuple[int, int | None], ...] = ()  # (bytes per token, most tokens held)
    fixed: int = 0  # recurrent state and other caches whose size does not grow

    def bytes_at(self, n: int) -> int:
        # + a growth step: a cache grows by whole steps, a merged batch by one past its longest
        return self.fixed + sum(per * (min(n, cap) if cap else n) + per * _STEP
                                for per, cap in self.leaves)

    @classmethod
    def of(cls, caches: list, rows: int, block_size: int) -> Footprint | None:
        """Read off a model's caches holding `rows` rows of at least one token each (a
        request's, or a batch's); None while some K/V leaf holds nothing yet. Reads shapes
        only: nothing is evaluated."""
        leaves, fixed = [], 0
        for cache in caches:
            for leaf in getattr(cache, "caches", None) or (cache,):
                if not hasattr(leaf, "keys"):  # recurrent state: a fixed size
                    fixed += int(getattr(leaf, "nbytes", 0) or 0) // rows
                    continue
                if leaf.keys is None:
                    return None
                per = sum(a[..., :1, :].nbytes for part in (leaf.keys, leaf.values)
                          for a in (part if isinstance(part, (tuple, list)) else (part,)))
                window = getattr(leaf, "max_size", None)  # a ring (or a chunk) keeps this many
                leaves.append((per // rows, window + block_size if window else None))
        return cls(tuple(leaves), fixed)


def measure_footprint(lm, block_size: int, model=None) -> Footprint:
    """`lm`'s footprint from fresh caches after `model` (a callable `(inputs, cache=)`; default
    the language model itself) ran two tokens into them (engine thread)."""
    import mlx.core as mx

    if model is None:
        model = lm.model.language_model if lm.is_vision else lm.model
    caches = lm.make_cache()
    mx.eval(model(mx.array([[0, 1]]), cache=caches))
    return Footprint.of(caches, 1, block_size)


@dataclass(slots=True)
class BudgetStats:
    waits: int = 0  # requests that waited in the queue for room
    over_budget: int = 0  # requests that needed more than the budget alone (ran alone)
    freed: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0))  # bytes, by part


class RamBudget:
    """One byte budget (None: none, only the parts' own caps) over the four parts; the engine
    attaches the parts it has (`pool`, `records`: the RAM tier, `features`), each with an
    `nbytes` and a `shrink_to(limit)`."""

    def __init__(self, total: int | None, block_size: int = 256,
                 footprint: Footprint | None = None):
        self.total = total
        self.block_size = block_size
        self.footprint = footprint  # None until read off the first request's caches
        self.pool = self.records = self.features = None
        self.running = 0  # bytes counted for the running requests' caches
        self.stats = BudgetStats()
        self._blocked = None  # the request at the head of the queue that waits, if any

    def attach(self, name: str, part) -> None:
        """Count `part` (None: none) as the part `name` and settle whenever it grows."""
        setattr(self, name, part)
        if part is not None and self.total is not None:
            part.on_grow = self.settle

    def used(self) -> dict[str, int]:
        """Bytes by part: running (as counted), pool, records, features."""
        out = {"running": self.running}
        for name in PARTS:
            part = getattr(self, name)
            out[name] = int(part.nbytes) if part is not None else 0
        return out

    def as_dict(self) -> dict:
        used = self.used()
        return {"budget": self.total, "used": sum(used.values()), **used,
                "waits": self.stats.waits, "over_budget": self.stats.over_budget,
                "freed": dict(self.stats.freed)}

    def learn(self, caches: list, rows: int = 1) -> None:
        """Read the footprint off caches holding `rows` rows, if it is not known yet."""
        if self.footprint is None and caches and rows:
            self.footprint = Footprint.of(caches, rows, self.block_size)

    def need(self, seqs) -> int | None:
        """Bytes `seqs` (prefilling, decoding or record-job sequences) may come to hold; None
        while the footprint is not known."""
        if not seqs:
            return 0
        if self.footprint is None:
            return None
        longest = max(s.prompt_len + s.params.max_tokens for s in seqs)
        return len(seqs) * self.footprint.bytes_at(longest)

    def admits(self, seq, running, alone: bool) -> bool:
        """Whether `seq` may start beside `running` (`alone`: no request runs, at most a record
        job); if not, it waits for them to finish."""
        if self.total is None:
            return True
        need = self.need([*running, seq])
        if need is None:  # (not known before a first request's first chunk)
            return alone
        if need <= self.total:
            return True
        if alone:
            alone_need = self.need([seq])
            if alone_need > self.total:
                self.stats.over_budget += 1
                _log.warning(
                    "a request of %d tokens (prompt and max_tokens) needs about %d MiB of cache, "
                    "more than the RAM budget of %d MiB (--ram, FORKV_RAM, EngineConfig.ram): "
                    "it runs alone; raise --ram to run such requests side by side",
                    seq.prompt_len + seq.params.max_tokens, alone_need >> 20, self.total >> 20)
            return True
        if self._blocked is not seq:
            self._blocked = seq
            self.stats.waits += 1
        return False

    def reserve(self, running) -> None:
        """Count `running`'s caches and make room for them."""
        self.running = self.need(running) or 0
        self.settle()

    def settle(self) -> None:
        """Shrink the pool, then the RAM tier, then the feature cache, until all fit."""
        if self.total is None:
            return
        for name in PARTS:
            part = getattr(self, name)
            over = sum(self.used().values()) - self.total
            if over <= 0:
                return
            if part is None or not part.nbytes:
                continue
            before = int(part.nbytes)
            part.shrink_to(max(0, before - over))
            self.stats.freed[name] += before - int(part.nbytes)
