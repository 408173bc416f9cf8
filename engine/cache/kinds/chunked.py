"""`chunked`: a `ChunkedKVCache` (llama4's local layers) attends within fixed chunks of C
tokens and keeps, before each forward pass, only the last C tokens it holds. After a
block-aligned prefill to boundary n it holds tokens [s, n) with s = max(0, n - B - C) (the
front was trimmed at the start of the last block's pass), so each block's record holds the
block's K/V, and a restore at n reads the blocks covering [s, n)."""

from __future__ import annotations

from .base import RecordKind, copy_array, load_kv, register, save_kv


def chunk_start(chunk: int, n: int, block_size: int) -> int:
    """The first token a fresh block-aligned prefill keeps at boundary n."""
    return max(0, n - block_size - chunk)


@register
class ChunkedKind(RecordKind):
    name = "chunked"
    cache_classes = ("mlx_lm.models.cache.ChunkedKVCache",)
    evict_rank = 0  # needed only around their own block, like window records

    @classmethod
    def size(cls, cache) -> int:
        return cache.chunk_size

    @classmethod
    def blocks(cls, size: int, n: int, block_size: int) -> range:
        return range(chunk_start(size, n, block_size) // block_size, n // block_size)

    @classmethod
    def snapshot(cls, cache, pos: int, block_size: int) -> dict:
        assert cache.offset == pos, f"cache holds {cache.offset} tokens, expected {pos}"
        assert cache.start_position == chunk_start(cache.chunk_size, pos, block_size)
        keys, values = cache.keys_and_values()  # tokens [start_position, pos)
        return {"k": copy_array(keys[..., -block_size:, :]),
                "v": copy_array(values[..., -block_size:, :])}

    @classmethod
    def rebuild(cls, cache, n: int, block_size: int, records: dict[int, dict]):
        import mlx.core as mx

        start = chunk_start(cache.chunk_size, n, block_size)
        blocks = cls.blocks(cache.chunk_size, n, block_size)
        keys = mx.concatenate([records[b]["k"] for b in blocks], axis=2)
        values = mx.concatenate([records[b]["v"] for b in blocks], axis=2)
        skip = start - blocks.start * block_size  # tokens of the first block before `start`
        cache.keys, cache.values = keys[..., skip:, :], values[..., skip:, :]
        assert cache.keys.shape[2] == n - start, "records do not cover the chunk"
        cache.offset, cache.start_position = n, start
        return cache

    @classmethod
    def save_whole(cls, cache) -> dict:
        return save_kv(cache, offset="offset", start="start_position")

    @classmethod
    def load_whole(cls, cache, arrays: dict):
        return load_kv(cache, arrays, offset="offset", start="start_position")
