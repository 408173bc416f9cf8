"""`state`: caches that cannot be trimmed (SSM, conv, gated-delta and other recurrent state)
are copied whole at each boundary; a restore at block n reads the record at block n-1 only.

`ArraysCache` holds its state in a list of arrays. Any other non-trimmable cache whose
attributes are all arrays, numbers or lists of arrays (deepseek_v41's `LayerCache`) is
copied attribute by attribute, so it needs no kind of its own.
"""

from __future__ import annotations

from .base import RecordKind, copy_array, from_mlx_lm, register


class _WholeState(RecordKind):
    name = "state"
    evict_rank = 1
    whole_prefix = True

    @classmethod
    def blocks(cls, size: int, n: int, block_size: int) -> range:
        return range(n // block_size - 1, n // block_size)

    # A boundary's record is the whole state already.
    @classmethod
    def save_whole(cls, cache) -> dict:
        return cls.snapshot(cache, 0, 0)

    @classmethod
    def load_whole(cls, cache, arrays: dict):
        return cls.rebuild(cache, 0, 0, {0: arrays})


@register
class ArraysKind(_WholeState):
    cache_classes = ("mlx_lm.models.cache.ArraysCache", "mlx_vlm.models.cache.ArraysCache")

    @classmethod
    def snapshot(cls, cache, pos: int, block_size: int) -> dict:
        return {f"s{j}": copy_array(a) for j, a in enumerate(cache.cache) if a is not None}

    @classmethod
    def rebuild(cls, cache, n: int, block_size: int, records: dict[int, dict]):
        (arrays,) = records.values()
        extra = set(arrays) - {f"s{j}" for j in range(len(cache.cache))}
        if extra:
            raise KeyError(f"record holds arrays this cache has no slot for: {sorted(extra)}")
        for j in range(len(cache.cache)):
            a = arrays.get(f"s{j}")
            cache.cache[j] = None if a is None else copy_array(a)
        return cache

    @classmethod
    def can_merge(cls, cache) -> bool:
        # ArraysCache.merge batches the state (masked by left padding); mlx-vlm's copy of the
        # class (Qwen 3.5's vision model) has the same merge / extract / filter.
        return from_mlx_lm(cache) or type(cache).__module__.startswith("mlx_vlm.")


_SCALARS = (bool, int, float)


@register
class AttributesKind(_WholeState):
    """Any other non-trimmable cache, copied attribute by attribute."""


    @classmethod
    def accepts(cls, cache) -> bool:
        import mlx.core as mx

        if not hasattr(cache, "is_trimmable") or cache.is_trimmable():
            return False  # a trimmable cache keeps tokens: a state copy per block would not do
        plain = (type(None), mx.array, *_SCALARS)
        attrs = getattr(cache, "__dict__", None)
        return bool(attrs) and all(
            isinstance(v, plain) or (isinstance(v, (list, tuple))
                                     and all(isinstance(x, (type(None), mx.array)) for x in v))
            for v in attrs.values())

    @classmethod
    def snapshot(cls, cache, pos: int, block_size: int) -> dict:
        import mlx.core as mx

        out = {}
        for name, v in vars(cache).items():
            if isinstance(v, mx.array):
                out[name] = copy_array(v)
            elif isinstance(v, _SCALARS):
                out[f"{name}#"] = mx.array(v)  # numbers travel as 0-d arrays
            elif isinstance(v, (list, tuple)):
                out.update({f"{name}.{j}": copy_array(x) for j, x in enumerate(v)
                            if x is not None})
        return out

    @classmethod
    def rebuild(cls, cache, n: int, block_size: int, records: dict[int, dict]):
        (arrays,) = records.values()
        for name, v in list(vars(cache).items()):
            if isinstance(v, _SCALARS):
                setattr(cache, name, type(v)(arrays[f"{name}#"].item()))
            elif isinstance(v, (list, tuple)):
                items = [arrays.get(f"{name}.{j}") for j in range(len(v))]
                setattr(cache, name, type(v)(None if a is None else copy_array(a) for a in items))
            else:  # an array, or None until the first forward pass sets it
                a = arrays.get(name)
                setattr(cache, name, None if a is None else copy_array(a))
        return cache
