"""`CacheList` (falcon_h1, baichuan_m1, deepseek_v32, longcat_flash, ...): one layer holding
several caches. It has no records of its own: each child is a leaf of the layout, at path
(layer, child), and is checkpointed by its own kind."""

from __future__ import annotations

from collections.abc import Iterator

from .base import RecordKind, kind_of, register, sub_arrays


@register
class CacheListKind(RecordKind):
    name = ""  # composite: never names a record
    cache_classes = ("mlx_lm.models.cache.CacheList", "mlx_vlm.models.cache.CacheList")

    @classmethod
    def accepts(cls, cache) -> bool:
        return all(kind_of(c) is not None for c in cache.caches)

    @classmethod
    def leaves(cls, cache, path: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], object]]:
        for j, child in enumerate(cache.caches):
            yield from kind_of(child).leaves(child, path + (j,))

    @classmethod
    def can_merge(cls, cache) -> bool:
        return all(kind_of(c).can_merge(c) for c in cache.caches)  # CacheList.merge composes

    # A copy of each child, by its index.
    @classmethod
    def save_whole(cls, cache) -> dict:
        return {f"{j}.{name}": a for j, c in enumerate(cache.caches)
                for name, a in kind_of(c).save_whole(c).items()}

    @classmethod
    def load_whole(cls, cache, arrays: dict):
        for j, c in enumerate(cache.caches):
            kind_of(c).load_whole(c, sub_arrays(arrays, f"{j}."))
        return cache
