"""Checkpoint records: copy one block's state out of live caches, and rebuild caches from them.

Per block and cache kind, one record covers all layers of that kind:
- global: K/V of the block's tokens for every `KVCache` layer;
- window: K/V of the last min(B, W-1) tokens of the block for every `RotatingKVCache` layer —
  all a later restore can need, since attention at boundary n only sees tokens after n-W;
- state: the whole `ArraysCache` state of every state layer at the boundary.
Rebuilt caches have exactly the layout a fresh block-aligned prefill leaves behind, so the
logits that follow are bit-identical. Arrays are always copied: caches may update in place.
Knows nothing about keys, tiers or disks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .blocks import tokens_bytes
from .layout import CacheKind, CacheLayout

RECORD_VERSION = 1


@dataclass(slots=True)
class Record:
    kind: CacheKind
    block: int  # block index; the record describes the state at boundary (block+1)*B
    tokens: bytes  # int32 LE: the block's tokens (global/window) or the whole prefix (state)
    arrays: dict = field(default_factory=dict)  # name -> mx.array

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) + len(self.tokens)


def _copy(x):
    import mlx.core as mx

    return mx.array(x)  # a real copy: a slice or the array itself would share the buffer


def window_tail(window: int, block_size: int) -> int:
    return min(block_size, window - 1)


def snapshot(caches: list, layout: CacheLayout, pos: int, block_size: int,
             tokens, kinds: set[CacheKind]) -> list[Record]:
    """Records of the given kinds for the block ending at `pos` (caches hold tokens[:pos])."""
    import mlx.core as mx

    B, block = block_size, pos // block_size - 1
    assert pos % B == 0 and pos > 0
    out = []
    if CacheKind.GLOBAL in kinds:
        arrays = {}
        for i in layout.indices(CacheKind.GLOBAL):
            c = caches[i]
            assert c.offset == pos, f"layer {i} holds {c.offset} tokens, expected {pos}"
            arrays[f"{i}.k"] = _copy(c.keys[..., pos - B:pos, :])
            arrays[f"{i}.v"] = _copy(c.values[..., pos - B:pos, :])
        out.append(Record(CacheKind.GLOBAL, block, tokens_bytes(tokens[pos - B:pos]), arrays))
    if CacheKind.WINDOW in kinds:
        arrays = {}
        for i in layout.indices(CacheKind.WINDOW):
            c = caches[i]
            assert c.offset == pos, f"layer {i} holds {c.offset} tokens, expected {pos}"
            tail = window_tail(c.max_size, B)
            arrays[f"{i}.k"] = _copy(c._temporal_order(c.keys)[..., -tail:, :])
            arrays[f"{i}.v"] = _copy(c._temporal_order(c.values)[..., -tail:, :])
        out.append(Record(CacheKind.WINDOW, block, tokens_bytes(tokens[pos - B:pos]), arrays))
    if CacheKind.STATE in kinds:
        arrays = {}
        for i in layout.indices(CacheKind.STATE):
            for j, a in enumerate(caches[i].cache):
                if a is not None:
                    arrays[f"{i}.s{j}"] = _copy(a)
        out.append(Record(CacheKind.STATE, block, tokens_bytes(tokens[:pos]), arrays))
    mx.eval([r.arrays for r in out])
    return out


def window_blocks(layout: CacheLayout, n: int, block_size: int) -> range:
    """Blocks whose window records a restore at boundary n needs."""
    if not layout.max_window:
        return range(0)
    need = min(n, layout.max_window - 1)
    return range((n - need) // block_size, n // block_size)


def rebuild(fresh: list, layout: CacheLayout, n: int, block_size: int,
            globals_: list[Record], windows: dict[int, Record], state: Record | None,
            kinds: frozenset[CacheKind] = frozenset(CacheKind)) -> list:
    """Fill `fresh` (from model.make_cache()) so its layers of `kinds` hold boundary n."""
    import mlx.core as mx

    B = block_size
    if n == 0:
        return fresh
    for i in layout.indices(CacheKind.GLOBAL) if CacheKind.GLOBAL in kinds else ():
        c = fresh[i]
        c.keys = mx.concatenate([r.arrays[f"{i}.k"] for r in globals_], axis=2)
        c.values = mx.concatenate([r.arrays[f"{i}.v"] for r in globals_], axis=2)
        c.offset = n
    for i in layout.indices(CacheKind.WINDOW) if CacheKind.WINDOW in kinds else ():
        c = fresh[i]
        W, tail = c.max_size, window_tail(c.max_size, B)
        need = min(n, W - 1)
        # The blocks' tails, in time order, end at n; keep the last `need` tokens.
        blocks = range((n - need) // B, n // B)
        keys = mx.concatenate([windows[b].arrays[f"{i}.k"] for b in blocks], axis=2)
        values = mx.concatenate([windows[b].arrays[f"{i}.v"] for b in blocks], axis=2)
        assert keys.shape[2] >= need and tail * len(blocks) >= need
        keys, values = keys[..., -need:, :], values[..., -need:, :]
        # A fresh prefill keeps min(n, W-1+B) tokens; those before n-W+1 are trimmed before any
        # attention reads them, so zeros stand in for them and the layout (shape, ring index)
        # stays identical.
        length = min(n, W - 1 + B)
        if length > need:
            pad = (keys.shape[0], keys.shape[1], length - need)
            keys = mx.concatenate([mx.zeros(pad + keys.shape[3:], keys.dtype), keys], axis=2)
            values = mx.concatenate(
                [mx.zeros(pad + values.shape[3:], values.dtype), values], axis=2)
        c.keys, c.values, c.offset, c._idx = keys, values, n, length
    for i in layout.indices(CacheKind.STATE) if CacheKind.STATE in kinds else ():
        c = fresh[i]
        for j in range(len(c.cache)):
            a = state.arrays.get(f"{i}.s{j}")
            c.cache[j] = None if a is None else _copy(a)
    mx.eval([c.state for c in fresh if not c.empty()])
    return fresh
