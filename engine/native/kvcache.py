"""Cached K/V narrower than float32 for the models whose attention runs on forkv's kernels.

`half_caches(caches, dtype)` gives each of mlx-lm's K/V caches (a `CacheList`'s children too) a
subclass, in place, whose `update_and_fetch` casts the new keys and values to `dtype` (float16
or bfloat16) or quantizes them to q8_0 (the kernels' `quantize_kv`: per 32 values a float16
scale and 32 int8, llama.cpp's Q8_0, stored as uint8 rows of head_dim / 32 * 34 bytes) before
mlx-lm's own code stores them: the cache, every record snapshot of it and every batch it joins
hold the narrow bytes, and attention gets the stored K/V, which the kernel widens exactly as it
reads them (so a prefill row and a decode step still read the same values). Batch caches from
`merge` and the single-row caches from `extract` keep the format. The subclasses keep their
class's name and module, so record kinds, layouts and the batch logic see the class they know.
mlx-lm's model code is left unchanged. Knows mlx-lm's cache classes; nothing about records,
files or fingerprints.
"""

from __future__ import annotations

__all__ = ["KV_CHOICES", "KV_DTYPES", "Q8_GROUP", "Q8_GROUP_BYTES", "bytes_per_token",
           "dequantize_q8", "half_caches", "kv_dtype_of", "kv_row_widths", "own_tails"]

KV_DTYPES = ("float16", "bfloat16", "q8_0", "float32")
KV_CHOICES = ("auto", *KV_DTYPES)  # the setting's values (auto: native.DEFAULT_KV_DTYPE)
Q8_GROUP, Q8_GROUP_BYTES = 32, 34  # q8_0: values per group, bytes per group (scale + int8s)
# mlx-lm's K/V caches whose storage dtype follows the keys they are given.
_CLASSES = ("KVCache", "RotatingKVCache", "ChunkedKVCache", "BatchKVCache",
            "BatchRotatingKVCache")
_subclasses: dict[tuple[type, str], type] = {}


def half_caches(caches: list, dtype: str) -> list:
    """`caches` (from `make_prompt_cache`), each K/V cache storing `dtype` from now on."""
    if dtype != "float32":
        for c in caches:
            _swap(c, dtype)
    return caches


def kv_dtype_of(cache) -> str:
    """The dtype a cache stores K/V in ("float32" for one left as mlx-lm made it)."""
    return getattr(type(cache), "_forkv_kv_dtype", "float32")


def bytes_per_token(model, caches: list) -> int:
    """K/V bytes one cached token takes over every layer of `model`, whose fresh `caches`
    (from make_cache) this fills with two tokens."""
    return sum(c.keys[..., :1, :].nbytes + c.values[..., :1, :].nbytes
               for c in _filled_kv(model, caches, 2))


def kv_row_widths(model, caches: list) -> set[int]:
    """The widths of the K/V rows `model`'s fresh `caches` store (one token through them)."""
    return {int(c.keys.shape[-1]) for c in _filled_kv(model, caches, 1)}


def _filled_kv(model, caches: list, n: int) -> list:
    """The K/V caches among `caches` (a CacheList's children too), after `n` tokens."""
    import mlx.core as mx

    mx.eval(model(mx.array([list(range(n))]), cache=caches))
    leaves = [x for c in caches for x in getattr(c, "caches", (c,))]
    return [c for c in leaves if getattr(c, "keys", None) is not None]


def _swap(cache, dtype: str):
    inner = getattr(cache, "caches", None)
    if inner is not None and type(cache).__name__ == "CacheList":
        for c in inner:
            _swap(c, dtype)
        return cache
    cls = type(cache)
    if getattr(cls, "_forkv_kv_dtype", None) == dtype:
        return cache
    cls = getattr(cls, "_forkv_base", cls)
    if cls.__module__ == "mlx_lm.models.cache" and cls.__name__ in _CLASSES:
        cache.__class__ = _half_class(cls, dtype)
    return cache


def _half_class(cls: type, dtype: str) -> type:
    sub = _subclasses.get((cls, dtype))
    if sub is not None:
        return sub
    import mlx.core as mx

    from . import load

    lib = load()
    store = _in_place(cls, lib) if cls.__name__ == "KVCache" else cls.update_and_fetch
    if dtype == "q8_0":
        quantize = lib.quantize_kv

        def update_and_fetch(self, keys, values):
            # (fused decoder layers hand over q8_0 rows already: native/blocks.py)
            return store(self, keys if keys.dtype == mx.uint8 else quantize(keys),
                         values if values.dtype == mx.uint8 else quantize(values))
    else:
        target = getattr(mx, dtype)

        def update_and_fetch(self, keys, values):
            return store(self, keys.astype(target), values.astype(target))

    def merge(_, caches):
        return _swap(cls.merge(caches), dtype)

    def extract(self, idx):
        return _swap(cls.extract(self, idx), dtype)

    body = {"update_and_fetch": update_and_fetch, "merge": classmethod(merge),
            "_forkv_kv_dtype": dtype, "_forkv_base": cls,
            "_forkv_in_place": cls.__name__ == "KVCache",
            # Same name and module: kinds, layouts and batch checks see mlx-lm's class.
            "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    if hasattr(cls, "extract"):
        body["extract"] = extract
    sub = _subclasses[(cls, dtype)] = type(cls.__name__, (cls,), body)
    return sub


def own_tails(caches: list) -> None:
    """Mark the K/V caches among `caches` (one decoding row's, a CacheList's children too) as
    the only writers of their buffers from their current length on: other caches may share
    the buffer (the live pool's entry of the prompt), reading only tokens before it. Their
    updates there write into the buffer (`kv_write`) instead of copying it whole."""
    for c in caches:
        for leaf in getattr(c, "caches", None) or (c,):
            if getattr(type(leaf), "_forkv_in_place", False) and leaf.keys is not None:
                leaf._forkv_floor = leaf.offset


def _in_place(cls: type, lib):
    """mlx-lm's `KVCache.update_and_fetch`, whose update writes into the buffer in place
    (`lib.kv_write`) where the cache owns it from its `_forkv_floor` on (`own_tails`) and the
    buffer has room; otherwise mlx-lm's own (a copy where the buffer is shared). The same
    values in the same places either way."""
    import mlx.core as mx

    def update_and_fetch(self, keys, values):
        prev, floor = self.offset, getattr(self, "_forkv_floor", None)
        if (floor is None or self.keys is None or prev + keys.shape[2] > self.keys.shape[2]
                or (prev < floor and not _holds(self, keys, values, prev, floor, mx))):
            return cls.update_and_fetch(self, keys, values)
        self.keys = lib.kv_write(self.keys, keys, prev)
        self.values = lib.kv_write(self.values, values, prev)
        self.offset = prev + keys.shape[2]
        return self.keys_and_values()

    return update_and_fetch


def _holds(cache, keys, values, prev: int, floor: int, mx) -> bool:
    """Whether `cache`'s buffer already holds, bit for bit, what an update at `prev` writes
    before `floor` (the tokens others may read): a decode boundary's recompute of a block
    that began inside the shared prompt gives its tokens' very bits (the kernels' rows do not
    depend on the chunking), so it may write them over in place. Evaluates those few rows."""
    n = min(floor, prev + keys.shape[2]) - prev
    uint = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32}.get(keys.dtype.size)
    if uint is None or keys.dtype != cache.keys.dtype:
        return False
    pairs = [(mx.view(cache.keys[..., prev:prev + n, :], uint), mx.view(keys[..., :n, :], uint)),
             (mx.view(cache.values[..., prev:prev + n, :], uint),
              mx.view(values[..., :n, :], uint))]
    return all(bool(mx.array_equal(a, b).item()) for a, b in pairs)


def dequantize_q8(x):
    """q8_0 rows (uint8 [..., G * 34]) as float32 [..., G * 32]: for calls the kernel does not
    take (they go to mlx-lm's attention, which reads float K/V)."""
    import mlx.core as mx

    g = x.reshape(*x.shape[:-1], x.shape[-1] // Q8_GROUP_BYTES, Q8_GROUP_BYTES)
    d = mx.contiguous(g[..., :2]).view(mx.float16).astype(mx.float32)
    q = mx.contiguous(g[..., 2:]).view(mx.int8).astype(mx.float32)
    return (d * q).reshape(*x.shape[:-1], -1)
