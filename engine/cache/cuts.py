"""Cuts: checkpoints where a run's chunk ends off a block boundary, owned by the Checkpointer.

Two kinds of edge end a prefill chunk mid-block in every run — turn ends (turns.py) and image
ends (vision/ckpt.py) — and both are a pure function of the tokens (and images), so the caches
there are what a fresh run of the same input holds, and a checkpoint there restores exactly.
This is the one place that keys, records and restores them: a cut's key is chained from the
key of the block before it (or its namespace's seed), the tokens since and whatever else the
kind folds in (the images in the partial block); its record is a partial checkpoint
(partial.py: the global layers' K/V since the block boundary, every other layer's cache whole)
in the EXTRA kind, tagged with the namespace; a restore takes it only when its tokens, tag and
arrays fit, else it is a miss (dropped when it does not verify). Each kind counts its hits and
misses under its own name in the checkpointer's stats.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence

from . import partial
from .blocks import tokens_bytes
from .layout import CacheKind
from .records import Record

TURN_END = "turn_end"  # the kinds' names in the checkpointer's hits and misses
IMAGE_END = "image_end"
CUT_NAMES = (TURN_END, IMAGE_END)


def cut_key(tag: bytes, keyer, keys: Sequence[bytes], tokens: Sequence[int], end: int,
            extras: Iterable[bytes] = ()) -> bytes:
    """The key of a cut at `end` of kind `tag`, in `keyer`'s namespace (`keys`: the run's
    block keys)."""
    B = keyer.block_size
    h = hashlib.sha256(tag)
    h.update(keys[end // B - 1] if end >= B else keyer.seed)
    h.update(tokens_bytes(tokens[end // B * B:end]))
    for extra in extras:
        h.update(b"\x01" + extra)
    return h.digest()


class Cuts:
    """A checkpointer's cuts: record one, move a block restore on to one, or build the caches
    at one straight from the global block records."""

    def __init__(self, ck):
        self.ck = ck

    def record(self, name: str, key: bytes, cache: list, end: int, tokens: Sequence[int],
               tag: bytes, extra: dict | None = None) -> bool:
        """Checkpoint `cache` (holding `tokens[:end]`) at the cut `end` of kind `name` under
        `key` (with `extra` arrays), unless it is there; whether one was written."""
        import mlx.core as mx

        ck = self.ck
        if ck.store.contains(key, CacheKind.EXTRA):
            return False
        try:
            arrays = partial.snapshot(ck, cache, end)
        except ValueError:  # a cache off the cut (it does not hold `end` tokens): not checkpointed
            return False
        if extra:
            arrays.update(extra)
            mx.eval(arrays)
        lo = end // ck.block_size * ck.block_size
        ck.store.put(key, Record(CacheKind.EXTRA, end // ck.block_size,
                                 tokens_bytes(tokens[lo:end]), arrays, tag))
        if name == TURN_END:
            ck.stats.turn_ends_recorded += 1
        else:
            ck.stats.image_ends_recorded += 1
        return True

    def _load(self, key: bytes, tokens: Sequence[int], end: int, tag: bytes,
              names: set[str], needs: set[str] = frozenset()) -> Record | None:
        """The cut record under `key`, verified against `tokens[:end]`, `tag` and the arrays
        it must hold (the global layers' K/V and `names`); one that is not is dropped. One
        without `needs` (what this restore needs beyond those) is a miss, and kept."""
        ck = self.ck
        record = ck.read_record(key, CacheKind.EXTRA)
        if record is None:
            return None
        lo = end // ck.block_size * ck.block_size
        if (record.tokens != tokens_bytes(tokens[lo:end]) or record.namespace != tag
                or not partial.required_names(ck) | set(names) <= set(record.arrays)):
            ck.stats.rejected += 1  # same key, other content: never reuse
            ck.store.discard(key, CacheKind.EXTRA)
            return None
        return record if needs <= set(record.arrays) else None

    def move(self, name: str, restored, key: bytes, tokens: Sequence[int], end: int,
             names: set[str] = frozenset(), count: bool = True,
             needs: set[str] = frozenset()) -> dict | None:
        """Move `restored` (a block restore at the boundary before `end`) on to the cut `end`;
        the cut's arrays, or None (a miss: `restored` untouched)."""
        ck = self.ck
        tag = (restored.keyer or ck.keyer).tag
        record = self._load(key, tokens, end, tag, names, needs)
        if record is not None and partial.apply(ck, restored.cache, record.arrays, end):
            if count:
                ck.stats.tokens_reused += end - restored.position
                ck.stats.tokens_computed -= end - restored.position
            ck.stats.hits[name] += 1
            restored.position = end
            return record.arrays
        if record is not None:
            ck.stats.rejected += 1
        ck.stats.misses[name] += 1
        return None

    def advance(self, name: str, restored, tokens: Sequence[int], candidates: Iterable,
                names: set[str] = frozenset(), count: bool = True) -> dict | None:
        """Move `restored` (a block restore) on to the furthest cut of kind `name` after it in
        the same block, from `candidates` ((end, key, arrays it must hold), furthest first);
        that cut's arrays, or None (`restored` untouched)."""
        n, B = restored.position, self.ck.block_size
        for end, key, needs in candidates:
            if end <= n:
                break
            if end // B * B != n:
                continue  # its block's start is not restored
            arrays = self.move(name, restored, key, tokens, end, names, count, needs)
            if arrays is not None:
                return arrays
        return None

    def build(self, name: str, key: bytes, tokens: Sequence[int], end: int, keys, keyer,
              names: set[str] = frozenset(), needs: set[str] = frozenset()
              ) -> tuple[list | None, dict | None]:
        """(caches at the cut `end` built from the global records of every block before it
        and the cut's record — one concatenation per global layer, no other block record
        read — and the cut's arrays); (None, None) when the cut is missing, (None, arrays)
        when the block records are."""
        ck, B = self.ck, self.ck.block_size
        record = self._load(key, tokens, end, keyer.tag, names, needs)
        if record is None:
            ck.stats.misses[name] += 1
            return None, None
        blocks = ck.load_global_run(keys, tokens, end // B, keyer.tag)
        t = time.perf_counter()
        cache = partial.build(ck, blocks, record.arrays, end) if blocks is not None else None
        ck.add_time("build", t)
        if cache is None:
            ck.stats.rejected += 1
            return None, record.arrays
        ck.stats.hits[name] += 1
        return cache, record.arrays
