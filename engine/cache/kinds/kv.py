"""`global`: a `KVCache` keeps every token, so each block's record holds that block's K/V
and a restore at block n concatenates the records of blocks 0..n-1."""

from __future__ import annotations

from .base import RecordKind, copy_array, from_mlx_lm, load_kv, register, save_kv


@register
class GlobalKind(RecordKind):
    name = "global"
    cache_classes = ("mlx_lm.models.cache.KVCache", "mlx_vlm.models.cache.KVCache")
    evict_rank = 2  # every later restore reads them: the last to go
    stays_hot = True
    trims_exactly = True

    @classmethod
    def blocks(cls, size: int, n: int, block_size: int) -> range:
        return range(n // block_size)

    @classmethod
    def snapshot(cls, cache, pos: int, block_size: int) -> dict:
        assert cache.offset == pos, f"cache holds {cache.offset} tokens, expected {pos}"
        lo = pos - block_size
        return {"k": copy_array(cache.keys[..., lo:pos, :]),
                "v": copy_array(cache.values[..., lo:pos, :])}

    @classmethod
    def rebuild(cls, cache, n: int, block_size: int, records: dict[int, dict]):
        import mlx.core as mx

        # Every record given, in block order (a vision restore adds a partial last block).
        parts = [records[b] for b in sorted(records)]
        cache.keys = mx.concatenate([p["k"] for p in parts], axis=2)
        cache.values = mx.concatenate([p["v"] for p in parts], axis=2)
        assert cache.keys.shape[2] == n == cache.values.shape[2], "records do not cover n"
        cache.offset = n
        return cache

    @classmethod
    def can_merge(cls, cache) -> bool:
        return from_mlx_lm(cache)  # BatchKVCache

    @classmethod
    def save_whole(cls, cache) -> dict:
        return save_kv(cache, cache.offset, offset="offset")  # its buffer runs past offset

    @classmethod
    def load_whole(cls, cache, arrays: dict):
        return load_kv(cache, arrays, offset="offset")

    @classmethod
    def can_cut(cls, cache, n_tokens: int, u: int) -> bool:
        return True

    @classmethod
    def cut(cls, cache, fresh, n_tokens: int, u: int):
        fresh.keys, fresh.values = cache.keys[..., :u, :], cache.values[..., :u, :]
        fresh.offset = u
        return fresh
