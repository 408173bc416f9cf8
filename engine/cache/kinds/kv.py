"""`global`: a `KVCache` keeps every token, so each block's record holds that block's K/V
and a restore at block n concatenates the records of blocks 0..n-1.

A restored cache gets the room of one more step (mlx-lm's `KVCache.step`, 256 tokens) in the
same concatenation: the next prefill chunk (at most a block) then writes into it, where
mlx-lm would otherwise copy the whole cache once more to grow it. The attention reads only
the first `offset` tokens, as in a cache grown by mlx-lm itself, so the room changes no bit."""

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
        ks, vs = [part["k"]], [part["v"]]
        if lo:
            ks.insert(0, cache.keys[..., :lo, :])
            vs.insert(0, cache.values[..., :lo, :])
        return _filled(cache, ks, vs, n, f"the record does not continue this cache to {n} tokens")

    @classmethod
    def rebuild(cls, cache, n: int, block_size: int, records: dict[int, dict]):
        # Every record given, in block order (a cut adds a partial last block).
        parts = [records[b] for b in sorted(records)]
        return _filled(cache, [p["k"] for p in parts], [p["v"] for p in parts], n,
                       f"the records do not cover {n} tokens")

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
    def hand_over(cls, cache, fresh, u: int):
        # The K/V of tokens [0, u) are those of any run that computed them on the same cuts;
        # the buffer moves over whole (its room and the stale tokens after u, which the next
        # update writes over), so that update writes in place rather than copy the cache.
        fresh.keys, fresh.values, fresh.offset = cache.keys, cache.values, u
        return fresh

    @classmethod
    def cut(cls, cache, fresh, n_tokens: int, u: int):
        fresh.keys, fresh.values = cache.keys[..., :u, :], cache.values[..., :u, :]
        fresh.offset = u
        return fresh


def _filled(cache, ks: list, vs: list, n: int, why: str):
    """`cache` holding the K/V parts `ks`, `vs` (n tokens in all, else ValueError(why)),
    concatenated once with a step of room after them where the cache class grows by steps."""
    import mlx.core as mx

    if sum(k.shape[2] for k in ks) != n or sum(v.shape[2] for v in vs) != n:
        raise ValueError(why)
    step = getattr(cache, "step", 0)
    if isinstance(step, int) and step > 0:
        ks = ks + [mx.zeros((*ks[0].shape[:2], step, ks[0].shape[3]), ks[0].dtype)]
        vs = vs + [mx.zeros((*vs[0].shape[:2], step, vs[0].shape[3]), vs[0].dtype)]
    cache.keys = ks[0] if len(ks) == 1 else mx.concatenate(ks, axis=2)
    cache.values = vs[0] if len(vs) == 1 else mx.concatenate(vs, axis=2)
    cache.offset = n
    return cache


class SplitKV:
    """A live pool entry's global-layer K/V held in two parts: the first `p` tokens as views of
    another entry's buffer (a sibling branch: both continue one prefix, neither holds the
    other), and its own tokens after them as a copy of those alone. A fork of a 32K-token
    prompt then keeps its few hundred tokens, not a second copy of the 32K (Gemma 3 270M:
    ~104 MiB at float16). Only the pool holds one; `cut` gives a request an mlx-lm cache."""

    __slots__ = ("base_keys", "base_values", "tail_keys", "tail_values", "offset", "cache_type")

    def __init__(self, cache, base_keys, base_values, p: int):
        import mlx.core as mx

        n = cache.offset
        self.base_keys, self.base_values = base_keys, base_values  # [..., :p, :] views
        self.tail_keys = mx.array(cache.keys[..., p:n, :])  # (copies: not the whole buffer)
        self.tail_values = mx.array(cache.values[..., p:n, :])
        self.offset, self.cache_type = n, type(cache)
        mx.eval(self.tail_keys, self.tail_values)

    @property
    def p(self) -> int:
        return int(self.base_keys.shape[2])

    @property
    def state(self) -> tuple:
        return self.base_keys, self.base_values, self.tail_keys, self.tail_values

    @property
    def nbytes(self) -> int:  # (as a whole cache counts its slices: the budget errs safe)
        return sum(a.nbytes for a in self.state)

    def prefix(self, u: int) -> tuple:
        """(keys, values) of its first `u` <= p tokens: views of the base's buffer."""
        return self.base_keys[..., :u, :], self.base_values[..., :u, :]


@register
class SplitKind(RecordKind):
    """A `SplitKV` in the live pool: cut anywhere, as a whole K/V cache."""

    cache_classes = (f"{SplitKV.__module__}.{SplitKV.__qualname__}",)

    @classmethod
    def can_cut(cls, cache, n_tokens: int, u: int) -> bool:
        return True

    @classmethod
    def cut(cls, cache, fresh, n_tokens: int, u: int):
        p = cache.p
        if type(fresh) is not cache.cache_type:
            raise TypeError(f"a split K/V of {cache.cache_type.__name__} cut into "
                            f"{type(fresh).__name__}")
        if u <= p:  # the base's views, as GlobalKind.cut gives
            fresh.keys, fresh.values = cache.prefix(u)
            fresh.offset = u
            return fresh
        # one copy with a step of room: the request's first update writes into it in place
        return _filled(fresh, [cache.base_keys, cache.tail_keys[..., :u - p, :]],
                       [cache.base_values, cache.tail_values[..., :u - p, :]], u,
                       f"the split K/V does not hold {u} tokens")

    @classmethod
    def hand_over(cls, cache, fresh, u: int):
        return cls.cut(cache, fresh, cache.offset, u)
