"""Checkpoints inside a block: the caches of a run at a position that is not a block boundary.

Image ends (vision_ckpt.py) and turn ends (turns.py) are checkpointed where they fall, usually
mid-block, through the checkpointer's cuts (cuts.py), which key, store and verify them; this
module copies the caches in and out. Such a checkpoint holds the K/V of the partial block
[lo, end) for global layers (the rest comes from the block records of boundary lo) and the
whole cache object of every other layer — sliding-window rings, recurrent state — copied
attribute by attribute. Both
kinds of edge are also chunk edges of every run (a pure function of the tokens), so the caches
there are exactly what a fresh run of the same tokens holds, and restoring them is exact.
"""

from __future__ import annotations

from .layout import CacheKind

_PARTIAL_KINDS = {CacheKind.GLOBAL, CacheKind.WINDOW, CacheKind.STATE, CacheKind.EXTRA}
_SCALARS = (bool, int, float)


def supports_partial(ck) -> bool:
    """Partial checkpoints work when every layer is one cache of a kind copied here."""
    return (ck.enabled and set(ck.kinds) <= _PARTIAL_KINDS
            and all(len(leaf.path) == 1 for leaf in ck.layout.layers))


def split_layers(ck) -> tuple[list[int], list[int]]:
    """(global layers, every other layer)."""
    is_global = {leaf.index: leaf.kind == CacheKind.GLOBAL for leaf in ck.layout.layers}
    return ([i for i, g in is_global.items() if g], [i for i, g in is_global.items() if not g])


def _copy_attrs(cache, prefix: str) -> dict:
    """A cache object's attributes as arrays (numbers as 0-d arrays, lists item by item)."""
    import mlx.core as mx

    out = {}
    for name, v in vars(cache).items():
        if isinstance(v, mx.array):
            out[f"{prefix}{name}"] = mx.array(v)  # a copy: caches update in place
        elif isinstance(v, _SCALARS):
            out[f"{prefix}{name}#"] = mx.array(v)
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (mx.array, type(None))) for x in v):
            out[f"{prefix}{name}#len"] = mx.array(len(v))
            out.update({f"{prefix}{name}.{j}": mx.array(x) for j, x in enumerate(v)
                        if x is not None})
        elif v is not None:
            raise ValueError(f"cannot copy {type(cache).__name__}.{name}")
    return out


def _set_attrs(cache, arrays: dict, prefix: str) -> None:
    """The inverse of `_copy_attrs` on a cache of the same class."""
    for name, v in list(vars(cache).items()):
        if f"{prefix}{name}#" in arrays:
            setattr(cache, name, type(v)(arrays[f"{prefix}{name}#"].item()))
        elif f"{prefix}{name}#len" in arrays:
            n = int(arrays[f"{prefix}{name}#len"].item())
            items = [arrays.get(f"{prefix}{name}.{j}") for j in range(n)]
            setattr(cache, name, type(v)(items) if isinstance(v, tuple) else items)
        else:
            setattr(cache, name, arrays.get(f"{prefix}{name}"))


def snapshot(ck, cache: list, end: int) -> dict:
    """Copies of `cache` (holding `end` tokens) for a partial checkpoint at `end`; evaluated.
    A ValueError if a cache holds something that cannot be copied."""
    import mlx.core as mx

    lo = end // ck.block_size * ck.block_size
    arrays = {}
    global_layers, others = split_layers(ck)
    for i in global_layers:
        c = cache[i]
        if c.offset != end:
            raise ValueError(f"layer {i} holds {c.offset} tokens, expected {end}")
        arrays[f"{i}.k"] = mx.array(c.keys[..., lo:end, :])  # copies: caches update
        arrays[f"{i}.v"] = mx.array(c.values[..., lo:end, :])  # in place
    for i in others:
        arrays.update(_copy_attrs(cache[i], f"{i}:"))
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
    try:
        parts = {}
        for i in global_layers:
            c, k, v = cache[i], arrays[f"{i}.k"], arrays[f"{i}.v"]
            if lo:
                k = mx.concatenate([c.keys[..., :lo, :], k], axis=2)
                v = mx.concatenate([c.values[..., :lo, :], v], axis=2)
            if k.shape[2] != end or v.shape[2] != end:
                raise ValueError(f"layer {i}: the record does not continue this cache")
            parts[i] = (k, v)
        fresh = ck.lm.make_cache()  # the other layers take the checkpoint's copies whole
        for i in others:
            _set_attrs(fresh[i], arrays, f"{i}:")
    except (KeyError, TypeError, ValueError):  # arrays that do not fit this model: a miss
        return False
    for i, (k, v) in parts.items():
        c = cache[i]
        c.keys, c.values, c.offset = k, v, end
    for i in others:
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
            c = fresh[i]
            ks = [b[f"{i}.k"] for b in blocks] + [arrays[f"{i}.k"]]
            vs = [b[f"{i}.v"] for b in blocks] + [arrays[f"{i}.v"]]
            if sum(x.shape[2] for x in ks) != end or sum(x.shape[2] for x in vs) != end:
                raise ValueError(f"layer {i}: the records do not cover {end} tokens")
            c.keys, c.values = mx.concatenate(ks, axis=2), mx.concatenate(vs, axis=2)
            c.offset = end
        for i in others:
            _set_attrs(fresh[i], arrays, f"{i}:")
    except (KeyError, TypeError, ValueError):
        return None
    mx.eval([c.state for c in fresh])
    return fresh

