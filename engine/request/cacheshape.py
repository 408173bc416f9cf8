"""What kind of cache a layer holds, read off its type name without importing mlx.

speculate.py (verify and roll back) and ahead.py (take a step ahead back) both ask it;
`import forkv` must not import mlx before the BLAS shim binds, and the scheduler imports
ahead.py at import time, so these live apart from speculate.py's mlx code.
"""

from __future__ import annotations

__all__ = ["leaves", "rotates", "trims"]


def leaves(caches):
    """Every layer's cache, a CacheList's children in its place."""
    for c in caches:
        inner = getattr(c, "caches", None)
        if inner is not None and type(c).__name__ == "CacheList":
            yield from leaves(inner)
        else:
            yield c


def trims(c) -> bool:
    """Whether `c` takes back its last tokens by `trim` alone (global K/V)."""
    return type(c).__name__ in ("KVCache", "BatchKVCache", "QuantizedKVCache")


def rotates(c) -> bool:
    """Whether `c` is a sliding-window ring without `keep` (trims until it wraps)."""
    return type(c).__name__ in ("RotatingKVCache", "BatchRotatingKVCache") and not getattr(
        c, "keep", 0)
