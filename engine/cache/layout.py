"""Which record kind each of a model's caches needs, read off the model's own caches.

A layout lists the leaves of `model.make_cache()`: each cache, or each child of a composite
cache (`CacheList`), at its path ((layer,) or (layer, child)), with the name of its record
kind (`global`, `window`, `state`, ... see engine/cache/kinds) and its size parameter (window,
chunk). A cache no kind accepts is `unknown`: the model still runs, but without checkpoints.
Knows nothing about blocks, keys or stores.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from enum import Enum

from ..errors import ForkvWarning
from . import kinds as _kinds


class CacheKind(str, Enum):
    """The record kinds every build knows by name. A kind added later is named by its own
    class (engine/cache/kinds); members compare and hash as their names, so either works as a
    key."""

    GLOBAL = "global"
    WINDOW = "window"
    STATE = "state"
    UNKNOWN = "unknown"
    # Not a layer's cache: a record of model state kept outside the caches at a boundary
    # (vision models' M-RoPE position offset). Never a layer's kind.
    EXTRA = _kinds.EXTRA

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value


Path = tuple[int, ...]


@dataclass(slots=True, frozen=True)
class LayerCache:
    path: Path  # (layer,) or (layer, child) inside a CacheList
    kind: str  # record kind name, or "unknown"
    cache_class: str
    window: int = 0  # the kind's size parameter (sliding window, chunk), 0 if none

    @property
    def index(self) -> int:
        return self.path[0]

    @property
    def label(self) -> str:
        """The prefix of this leaf's array names in a record."""
        return ".".join(map(str, self.path))


@dataclass(slots=True, frozen=True)
class CacheLayout:
    layers: tuple[LayerCache, ...]  # leaves, in cache order

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(l.kind for l in self.layers)

    @property
    def can_checkpoint(self) -> bool:
        return CacheKind.UNKNOWN not in self.kinds and bool(self.layers)

    @property
    def max_window(self) -> int:
        return max((l.window for l in self.layers if l.kind == CacheKind.WINDOW), default=0)

    def leaves(self, kind: str) -> list[LayerCache]:
        return [l for l in self.layers if l.kind == kind]

    def indices(self, kind: str) -> list[int]:
        """Layer indices of the top-level caches of this kind (not children of a CacheList)."""
        return [l.index for l in self.leaves(kind) if len(l.path) == 1]

    def blocks(self, kind: str, n: int, block_size: int) -> range:
        """Blocks whose records of `kind` a restore at boundary n reads (all its leaves)."""
        if n <= 0:
            return range(0)
        k = _kinds.named(kind)
        starts = [k.blocks(l.window, n, block_size).start for l in self.leaves(kind)]
        return range(min(starts), n // block_size) if starts else range(0)

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for l in self.layers:
            counts[l.kind] = counts.get(l.kind, 0) + 1
        text = ", ".join(f"{n} {k}" for k, n in counts.items())
        sizes = sorted({(l.kind, l.window) for l in self.layers if l.window})
        if sizes:
            text += " (" + ", ".join(f"{k} {w}" for k, w in sizes) + ")"
        return text


def get_leaf(caches: list, path: Path):
    cache = caches[path[0]]
    for j in path[1:]:
        cache = cache.caches[j]
    return cache


def set_leaf(caches: list, path: Path, leaf) -> None:
    if len(path) == 1:
        caches[path[0]] = leaf
        return
    parent = get_leaf(caches, path[:-1])
    children = list(parent.caches)
    children[path[-1]] = leaf
    parent.caches = type(parent.caches)(children)  # a tuple from __init__, a list from state


def classify_cache(cache) -> str:
    """The record kind name of a leaf cache, or "unknown"."""
    kind = _kinds.kind_of(cache)
    return kind.name if kind is not None and kind.name else CacheKind.UNKNOWN


def _class_label(cache) -> str:
    children = getattr(cache, "caches", None)  # a CacheList: name what it holds
    if isinstance(children, (list, tuple)):
        return f"{type(cache).__name__}({', '.join(type(c).__name__ for c in children)})"
    return type(cache).__name__


def cache_layout(caches: list) -> CacheLayout:
    """The leaves of `model.make_cache()`; warn once about caches we cannot restore."""
    layers = []
    for i, cache in enumerate(caches):
        kind = _kinds.kind_of(cache)
        if kind is None:
            layers.append(LayerCache((i,), CacheKind.UNKNOWN, _class_label(cache)))
            continue
        for path, leaf in kind.leaves(cache, (i,)):
            k = _kinds.kind_of(leaf)
            layers.append(LayerCache(path, k.name, type(leaf).__name__, k.size(leaf)))
    layout = CacheLayout(tuple(layers))
    unknown = sorted({l.cache_class for l in layers if l.kind == CacheKind.UNKNOWN})
    if unknown:
        warnings.warn(
            f"forkv cannot checkpoint cache class {', '.join(unknown)}; this model will run "
            "without checkpoints (every prefix is recomputed).",
            ForkvWarning, stacklevel=2,
        )
    return layout
