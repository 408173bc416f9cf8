"""Record kinds: one class per mlx-lm cache class (see base.py for the interface).

Registered here: `KVCache` (global), `RotatingKVCache` (window), `ArraysCache` and any other
non-trimmable cache (state), `CacheList` (its children's kinds). A cache no kind accepts makes
its model run without checkpoints. Adding a cache class = adding one module that registers a
`RecordKind`, and importing it below.
"""

from . import cachelist, kv, state, window  # noqa: F401  (each registers its kind)
from .base import (EXTRA, RecordKind, evict_rank, kind_of, named, record_names, register,
                   stays_hot, whole_prefix)

__all__ = ["EXTRA", "RecordKind", "evict_rank", "kind_of", "named", "record_names", "register",
           "stays_hot", "whole_prefix"]
