"""Cached K/V at half width for the models whose attention runs on forkv's kernels.

`half_caches(caches, dtype)` gives each of mlx-lm's K/V caches (a `CacheList`'s children too)
a subclass, in place, whose `update_and_fetch` casts the new keys and values to `dtype`
(float16 or bfloat16) before mlx-lm's own code stores them: the cache, every record snapshot
of it and every batch it joins hold half the bytes, and attention gets the stored half K/V,
which the kernel widens exactly as it reads them (so a prefill row and a decode step still read
the same values). Batch caches from `merge` and the single-row caches from `extract` keep the
format. The subclasses keep their class's name and module, so record kinds, layouts and the
batch logic see the class they know. mlx-lm's model code is left unchanged. Knows mlx-lm's
cache classes; nothing about records, files or fingerprints.
"""

from __future__ import annotations

__all__ = ["KV_DTYPES", "bytes_per_token", "half_caches", "kv_dtype_of"]

KV_DTYPES = ("float16", "bfloat16", "float32")
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
    import mlx.core as mx

    mx.eval(model(mx.array([[0, 1]]), cache=caches))
    leaves = [x for c in caches for x in getattr(c, "caches", (c,))]
    return sum(c.keys[..., :1, :].nbytes + c.values[..., :1, :].nbytes
               for c in leaves if getattr(c, "keys", None) is not None)


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

    target = getattr(mx, dtype)

    def update_and_fetch(self, keys, values):
        return cls.update_and_fetch(self, keys.astype(target), values.astype(target))

    def merge(_, caches):
        return _swap(cls.merge(caches), dtype)

    def extract(self, idx):
        return _swap(cls.extract(self, idx), dtype)

    body = {"update_and_fetch": update_and_fetch, "merge": classmethod(merge),
            "_forkv_kv_dtype": dtype, "_forkv_base": cls,
            # Same name and module: kinds, layouts and batch checks see mlx-lm's class.
            "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    if hasattr(cls, "extract"):
        body["extract"] = extract
    sub = _subclasses[(cls, dtype)] = type(cls.__name__, (cls,), body)
    return sub
