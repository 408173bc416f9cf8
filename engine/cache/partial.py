"""Checkpoints inside a block: the caches of a run at a position that is not a block boundary.

Image ends (vision/ckpt.py) and turn ends (turns.py) are checkpointed where they fall, usually
mid-block, through the checkpointer's cuts (cuts.py), which key, store and verify them; this
module copies the caches in and out. Such a checkpoint holds the K/V of the partial block
[lo, end) for global layers (the rest comes from the block records of boundary lo) and the
whole cache of every other layer — sliding-window rings, recurrent state — as its record kind
copies it (`save_whole` / `load_whole`). Both kinds of edge are also chunk edges of every run
(a pure function of the tokens), so the caches there are exactly what a fresh run of the same
tokens holds, and restoring them is exact.
"""

from __future__ import annotations

from . import kinds as _kinds
from .kinds.kv import GlobalKind
from .layout import CacheKind

_PARTIAL_KINDS = {CacheKind.GLOBAL, CacheKind.WINDOW, CacheKind.STATE, CacheKind.EXTRA}


def supports_partial(ck) -> bool:
    """Partial checkpoints work when every layer is one cache of a kind copied here."""
    return (ck.enabled and set(ck.kinds) <= _PARTIAL_KINDS
            and all(len(leaf.path) == 1 for leaf in ck.layout.layers))


def split_layers(ck) -> tuple[list[int], list[int]]:
    """(global layers, every other layer)."""
    is_global = {leaf.index: leaf.kind == CacheKind.GLOBAL for leaf in ck.layout.layers}
    return ([i for i, g in is_global.items() if g], [i for i, g in is_global.items() if not g])


def _save_whole(cache, i: int) -> dict:
    c = cache[i]
    return {f"{i}:{name}": a for name, a in _kinds.kind_of(c).save_whole(c).items()}


def _load_whole(fresh: list, arrays: dict, i: int) -> None:
    fresh[i] = _kinds.kind_of(fresh[i]).load_whole(fresh[i], _kinds.sub_arrays(arrays, f"{i}:"))


def _global_part(arrays: dict, i: int) -> dict:
    return {"k": arrays[f"{i}.k"], "v": arrays[f"{i}.v"]}


def snapshot(ck, cache: list, end: int) -> dict:
    """Copies of `cache` (holding `end` tokens) for a partial checkpoint at `end`; evaluated."""
    import mlx.core as mx

    lo = end // ck.block_size * ck.block_size
    arrays = {}
    global_layers, others = split_layers(ck)
    for i in global_layers:
        part = GlobalKind.tail(cache[i], lo, end)
        arrays[f"{i}.k"], arrays[f"{i}.v"] = part["k"], part["v"]
    for i in others:
        arrays.update(_save_whole(cache, i))
    mx.eval(arrays)
    return arrays


def required_names(ck) -> set[str]:
    return {f"{i}.{s}" for i in split_layers(ck)[0] for s in "kv"}


def apply(ck, cache: list, arrays: dict, end: int) -> bool:
    """Move `cache` (restored to the block boundary before `end`) to `end` from a partial
    checkpoint's arrays; False (cache untouched) when they do not fit this model."""
    import mlx.core as mx

    lo = end // ck.block_size * ck.block_size
    global_layers, others = split_layers(ck)
    fresh = ck.lm.make_cache()
    try:  # into fresh caches first: `cache` stays as it was on a miss
        for i in global_layers:
            fresh[i].keys, fresh[i].values, fresh[i].offset = (cache[i].keys, cache[i].values,
                                                               cache[i].offset)
            GlobalKind.extend(fresh[i], lo, _global_part(arrays, i), end)
        for i in others:  # the other layers take the checkpoint's copies whole
            _load_whole(fresh, arrays, i)
    except (KeyError, TypeError, ValueError):  # arrays that do not fit this model: a miss
        return False
    for i in global_layers + others:
        cache[i] = fresh[i]
    mx.eval([c.state for c in cache])
    return True


def build(ck, blocks: list[dict], arrays: dict, end: int) -> list | None:
    """Fresh caches at `end` straight from the global records of the blocks before it
    (`blocks`: each block's arrays, in order) and a partial checkpoint's arrays: each global
    layer's K/V concatenated once, every other layer the checkpoint's copy (no block records
    of theirs needed). None when they do not fit this model."""
    import mlx.core as mx

    global_layers, others = split_layers(ck)
    fresh = ck.lm.make_cache()
    try:
        for i in global_layers:
            parts = [_global_part(b, i) for b in blocks] + [_global_part(arrays, i)]
            GlobalKind.rebuild(fresh[i], end, ck.block_size, dict(enumerate(parts)))
        for i in others:
            _load_whole(fresh, arrays, i)
    except (KeyError, TypeError, ValueError):
        return None
    mx.eval([c.state for c in fresh])
    return fresh

