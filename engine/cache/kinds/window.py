"""`window`: a `RotatingKVCache` (keep=0) attends to the last W tokens only. Each block's
record holds the K/V of its last min(B, W-1) tokens, in time order — all a later restore can
need, since attention at boundary n sees only tokens after n-W — and a restore reads the
blocks covering the last W-1 tokens.

A live cache's ring (live.py) can be cut back as far as it still holds the window: right
after a prefill chunk it holds W-1 tokens plus that chunk, after decoding W; a ring `widen`ed
with the one from before its last chunk holds both."""

from __future__ import annotations

from .base import RecordKind, copy_array, from_mlx_lm, load_kv, register, save_kv


def window_tail(window: int, block_size: int) -> int:
    return min(block_size, window - 1)


def _set_ring(cache, keys, values, offset: int, length: int):
    """Make `cache` a ring at `offset` holding `keys`/`values` (time order) as its last
    tokens, `length` slots in all: zeros stand in for the oldest, which a fresh run holds
    but trims before any attention reads them, so the layout (shape, ring index) is a fresh
    run's."""
    import mlx.core as mx

    if length > keys.shape[2]:
        pad = keys.shape[:2] + (length - keys.shape[2],)
        keys = mx.concatenate([mx.zeros(pad + keys.shape[3:], keys.dtype), keys], axis=2)
        values = mx.concatenate([mx.zeros(pad + values.shape[3:], values.dtype), values], axis=2)
    cache.keys, cache.values, cache.offset, cache._idx = keys, values, offset, keys.shape[2]
    return cache


def _held(cache) -> int:
    """Tokens the ring still holds."""
    return 0 if cache.keys is None else min(cache.offset,
                                              cache._temporal_order(cache.keys).shape[2])


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
        # A fresh prefill keeps min(n, W-1+B) tokens.
        return _set_ring(cache, keys[..., -need:, :], values[..., -need:, :], n,
                         min(n, W - 1 + B))

    @classmethod
    def can_merge(cls, cache) -> bool:
        return from_mlx_lm(cache)  # BatchRotatingKVCache

    @classmethod
    def save_whole(cls, cache) -> dict:
        return save_kv(cache, offset="offset", idx="_idx")

    @classmethod
    def load_whole(cls, cache, arrays: dict):
        return load_kv(cache, arrays, offset="offset", idx="_idx")

    @classmethod
    def can_cut(cls, cache, n_tokens: int, u: int) -> bool:
        # Held tokens are [n - held, n); cut to u, the next query needs the last min(u, W - 1)
        # before u: all of them from 0, or u >= W - 1 + (n - held).
        held = _held(cache)
        return held >= n_tokens or u >= cache.max_size - 1 + n_tokens - held

    @classmethod
    def cut(cls, cache, fresh, n_tokens: int, u: int):
        keys, values = cls.ring(cache)
        end = keys.shape[2] - (n_tokens - u)
        # (at most W: a widened ring holds more than the next query can see)
        W = cache.max_size
        start = max(0, end - W) if u >= W else 0
        # a ring past its window holds at least W slots (mlx-lm grows it only from 0)
        return _set_ring(fresh, keys[..., start:end, :], values[..., start:end, :], u,
                         W if u >= W else end - start)

    @classmethod
    def ring(cls, cache):
        if cache.keys is None:
            return None
        return cache._temporal_order(cache.keys), cache._temporal_order(cache.values)

    @classmethod
    def widen(cls, cache, fresh, ring, n_new: int):
        import mlx.core as mx

        if ring is None or cache.keys is None:
            return None
        keys, values = cls.ring(cache)
        if ring[0].shape[2] + n_new <= keys.shape[2] or n_new > keys.shape[2]:
            return None  # nothing was trimmed, or the ring no longer holds all the new tokens
        fresh.keys = mx.concatenate([ring[0], keys[..., -n_new:, :]], 2)
        fresh.values = mx.concatenate([ring[1], values[..., -n_new:, :]], 2)
        fresh.offset, fresh._idx = cache.offset, fresh.keys.shape[2]
        return fresh
