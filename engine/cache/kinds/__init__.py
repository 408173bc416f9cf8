"""Record kinds: one class per mlx-lm cache class (see base.py for the interface).

Every module of this package is imported here and registers its kinds: `KVCache` (global),
`RotatingKVCache` (window), `ArraysCache` and any other non-trimmable cache (state),
`CacheList` (its children's kinds). A cache no kind accepts makes its model run without
checkpoints. Adding a cache class = adding one module here with one `@register`ed class.
"""

import importlib
import pkgutil

from .base import (
    EXTRA,
    RecordKind,
    evict_rank,
    kind_of,
    named,
    record_names,
    register,
    stays_hot,
    sub_arrays,
    whole_prefix,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")  # each registers its kinds

__all__ = ["EXTRA", "RecordKind", "evict_rank", "kind_of", "named", "record_names", "register",
           "stays_hot", "sub_arrays", "whole_prefix"]
