"""Which kind of checkpoint record each layer's cache needs, read off the model's own caches.

Kinds: `global` (a `KVCache`: keep every block's K/V), `window` (a `RotatingKVCache`: keep the
blocks covering the window), `state` (an `ArraysCache` such as a gated-delta or SSM state: keep
the whole state at the boundary). Anything else is `unknown`: the model still runs, but without
checkpoints. Knows nothing about blocks, keys or stores.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from enum import Enum

from .errors import ForkvWarning


class CacheKind(str, Enum):
    GLOBAL = "global"
    WINDOW = "window"
    STATE = "state"
    UNKNOWN = "unknown"
    # Not a layer's cache: a record of model state kept outside the caches at a boundary
    # (vision models' M-RoPE position offset). Never a layer's kind.
    EXTRA = "extra"


@dataclass(slots=True, frozen=True)
class LayerCache:
    index: int
    kind: CacheKind
    cache_class: str
    window: int = 0  # max_size of a rotating cache, 0 otherwise


@dataclass(slots=True, frozen=True)
class CacheLayout:
    layers: tuple[LayerCache, ...]

    @property
    def kinds(self) -> frozenset[CacheKind]:
        return frozenset(layer.kind for layer in self.layers)

    @property
    def can_checkpoint(self) -> bool:
        return CacheKind.UNKNOWN not in self.kinds and bool(self.layers)

    @property
    def max_window(self) -> int:
        return max((layer.window for layer in self.layers), default=0)

    def indices(self, kind: CacheKind) -> list[int]:
        return [layer.index for layer in self.layers if layer.kind is kind]

    def describe(self) -> str:
        counts = {k.value: len(self.indices(k)) for k in CacheKind if self.indices(k)}
        text = ", ".join(f"{n} {k}" for k, n in counts.items())
        if self.max_window:
            text += f" (window {self.max_window})"
        return text


def classify_cache(cache) -> CacheKind:
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    # Exact classes for the K/V kinds: a subclass may change how it stores or trims tokens
    # (quantized, chunked, concatenating), and a wrong guess would give wrong logits.
    if type(cache) is KVCache:
        return CacheKind.GLOBAL
    if type(cache) is RotatingKVCache:
        return CacheKind.WINDOW if cache.keep == 0 else CacheKind.UNKNOWN
    if isinstance(cache, ArraysCache):  # MambaCache and friends hold plain state arrays
        return CacheKind.STATE
    return CacheKind.UNKNOWN


def cache_layout(caches: list) -> CacheLayout:
    """Classify each cache of `model.make_cache()`; warn once about kinds we cannot restore."""
    layers = []
    for i, cache in enumerate(caches):
        kind = classify_cache(cache)
        window = cache.max_size if kind is CacheKind.WINDOW else 0
        layers.append(LayerCache(i, kind, type(cache).__name__, window))
    layout = CacheLayout(tuple(layers))
    unknown = sorted({l.cache_class for l in layers if l.kind is CacheKind.UNKNOWN})
    if unknown:
        warnings.warn(
            f"forkv cannot checkpoint cache class {', '.join(unknown)}; this model will run "
            "without checkpoints (every prefix is recomputed).",
            ForkvWarning, stacklevel=2,
        )
    return layout
