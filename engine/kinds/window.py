"""`window`: a `RotatingKVCache` (keep=0) attends to the last W tokens only. Each block's
record holds the K/V of its last min(B, W-1) tokens, in time order — all a later restore can
need, since attention at boundary n sees only tokens after n-W — and a restore reads the
blocks covering the last W-1 tokens."""

from __future__ import annotations

from .base import RecordKind, copy_array, from_mlx_lm, register


def window_tail(window: int, block_size: int) -> int:
    return min(block_size, window - 1)


@register
class WindowKind(RecordKind):
    name = "window"
    cache_classes = ("mlx_lm.models.cache.RotatingKVCache", "mlx_vlm.models.cache.RotatingKVCache")
    evict_rank = 0  # needed only around their own block: the first to go

    @classmethod
    def accepts(cls, cache) -> bool:
        return cache.keep == 0  # kept tokens at the front would need every block's record

    @classmethod
    def size(cls, cache) -> int:
        return cache.max_size

    @classmethod
    def blocks(cls, size: int, n: int, block_size: int) -> range:
        need = min(n, size - 1)
        return range((n - need) // block_size, n // block_size)

    @classmethod
    def snapshot(cls, cache, pos: int, block_size: int) -> dict:
        assert cache.offset == pos, f"cache holds {cache.offset} tokens, expected {pos}"
        tail = window_tail(cache.max_size, block_size)
        return {"k": copy_array(cache._temporal_order(cache.keys)[..., -tail:, :]),
                "v": copy_array(cache._temporal_order(cache.values)[..., -tail:, :])}

    @classmethod
    def rebuild(cls, cache, n: int, block_size: int, records: dict[int, dict]):
        import mlx.core as mx

        W, B = cache.max_size, block_size
        need = min(n, W - 1)
        # The blocks' tails, in time order, end at n; keep the last `need` tokens.
        parts = [records[b] for b in cls.blocks(W, n, B)]
        keys = mx.concatenate([p["k"] for p in parts], axis=2)
        values = mx.concatenate([p["v"] for p in parts], axis=2)
        assert keys.shape[2] >= need, "records do not cover the window"
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
        cache.keys, cache.values, cache.offset, cache._idx = keys, values, n, length
        return cache

    @classmethod
    def can_merge(cls, cache) -> bool:
        return from_mlx_lm(cache)  # BatchRotatingKVCache
