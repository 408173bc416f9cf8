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
        return cls.tail(cache, pos - block_size, pos)

    @classmethod
    def tail(cls, cache, lo: int, pos: int) -> dict:
        """Copies of the K/V of tokens [lo, pos) of a cache that holds `pos` (caches update
        in place): a block's record, or a partial block's at a cut."""
        if cache.offset != pos:
            raise ValueError(f"the cache holds {cache.offset} tokens, expected {pos}")
        return {"k": copy_array(cache.keys[..., lo:pos, :]),
                "v": copy_array(cache.values[..., lo:pos, :])}

    @classmethod
    def extend(cls, cache, lo: int, part: dict, n: int):
        """`cache` (holding at least `lo` tokens) continued to `n` by a `tail` of [lo, n);
        ValueError when the part does not continue it there."""
        import mlx.core as mx

        k, v = part["k"], part["v"]
        if lo:
            k = mx.concatenate([cache.keys[..., :lo, :], k], axis=2)
            v = mx.concatenate([cache.values[..., :lo, :], v], axis=2)
        if k.shape[2] != n or v.shape[2] != n:
            raise ValueError(f"the record does not continue this cache to {n} tokens")
        cache.keys, cache.values, cache.offset = k, v, n
        return cache

    @classmethod
    def rebuild(cls, cache, n: int, block_size: int, records: dict[int, dict]):
        import mlx.core as mx

        # Every record given, in block order (a cut adds a partial last block).
        parts = [records[b] for b in sorted(records)]
        keys = mx.concatenate([p["k"] for p in parts], axis=2)
        values = mx.concatenate([p["v"] for p in parts], axis=2)
        if keys.shape[2] != n or values.shape[2] != n:
            raise ValueError(f"the records do not cover {n} tokens")
        cache.keys, cache.values, cache.offset = keys, values, n
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
